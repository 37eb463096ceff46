"""Line-oriented reading for text formats (NCCL logs, nccl-tests output): complete lines in
batches, gzip-transparent, with the clean-ups every text parser needs.

Lines come as bytes without their end-of-line (`\\n`, `\\r\\n`, a lone `\\r`); a last line
without a newline is still yielded. A line longer than `MAX_LINE_BYTES` (a 2 GB file with no
newline, say) is never held: it is skipped up to its newline and counted in
`LineSource.long_lines` (`account` makes it a counted skip with a warning), so memory stays
within the bound whatever the file. Nothing here anchors on line starts: launchers, loggers and
terminals put their own prefixes before a record, so parsers search within a line.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tracekit._limits import MAX_LINE_BYTES
from tracekit.parsers._stream import ByteStream

#: ANSI escape sequences (colours, cursor moves): Ray and terminals colour their prefixes.
ANSI = re.compile(rb"\x1b(?:\[[0-9;?]*[ -/]*[@-~]|[@-Z\\-_])")
BATCH_BYTES = 1 << 22

if TYPE_CHECKING:
    from tracekit.store import SourceStats


@dataclass
class LineSource:
    """What reading the file met besides lines: a truncated or corrupt gzip stream."""

    truncated_gzip: bool = False
    corrupt: str | None = None
    bytes_in: int = 0
    #: lines longer than the bound, skipped unread
    long_lines: int = 0
    max_line_bytes: int = MAX_LINE_BYTES


def line_batches(path: str | os.PathLike[str], info: LineSource | None = None, *,
                 batch_bytes: int | None = None, max_line_bytes: int | None = None) -> Iterator[list[bytes]]:
    """Lists of complete lines (about `batch_bytes`, default BATCH_BYTES, of text each), in file
    order; lines longer than `max_line_bytes` (default MAX_LINE_BYTES) are left out and counted
    in `info.long_lines`."""
    batch_bytes = batch_bytes or BATCH_BYTES
    max_line = max_line_bytes or MAX_LINE_BYTES
    info = info if info is not None else LineSource()
    info.max_line_bytes = max_line
    rest = b""
    skipping = False  # inside a line already too long: drop bytes up to its newline
    with ByteStream(path, chunk_size=batch_bytes) as stream:
        for chunk in stream.chunks():
            if skipping:
                nl = chunk.find(b"\n")
                if nl < 0:
                    continue
                chunk, skipping = chunk[nl + 1:], False
            data = rest + chunk if rest else chunk
            cut = data.rfind(b"\n")
            if cut < 0:
                rest = data
                if len(rest) > max_line:
                    info.long_lines += 1
                    rest, skipping = b"", True
                continue
            rest = data[cut + 1:]
            lines = _split(data[:cut])
            if cut > max_line and max(map(len, lines)) > max_line:
                info.long_lines += sum(len(ln) > max_line for ln in lines)
                lines = [ln for ln in lines if len(ln) <= max_line]
            if len(rest) > max_line:
                info.long_lines += 1
                rest, skipping = b"", True
            yield lines
        info.truncated_gzip = stream.truncated_gzip
        info.corrupt = stream.corrupt
        info.bytes_in = stream.bytes_in
    if rest:
        yield _split(rest)


def account(info: LineSource, stats: SourceStats) -> None:
    """What reading met, into a parser's stats: over-long lines as a counted skip with a warning,
    a truncated or corrupt gzip stream as a warning."""
    if info.long_lines:
        stats.skip("line_too_long", info.long_lines)
        stats.warnings.append(f"{info.long_lines:,} line(s) longer than {info.max_line_bytes:,} bytes "
                              "skipped unread")
    if info.truncated_gzip:
        stats.warnings.append("truncated gzip stream: read up to the cut")
    if info.corrupt:
        stats.warnings.append(f"{info.corrupt}: read up to the damage")


def _split(block: bytes) -> list[bytes]:
    if b"\r" in block:
        block = block.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    return block.split(b"\n")


def strip_ansi(line: bytes) -> bytes:
    """The line without terminal escape sequences (cheap when there are none)."""
    return ANSI.sub(b"", line) if b"\x1b" in line else line


def text(raw: bytes) -> str:
    """Bytes of a log line as text; undecodable bytes become U+FFFD."""
    return raw.decode("utf-8", "replace")
