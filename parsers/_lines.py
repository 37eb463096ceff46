"""Line-oriented reading for text formats (NCCL logs, nccl-tests output): complete lines in
batches, gzip-transparent, with the clean-ups every text parser needs.

Lines come as bytes without their end-of-line (`\\n`, `\\r\\n`, a lone `\\r`); a last line
without a newline is still yielded. Nothing here anchors on line starts: launchers, loggers and
terminals put their own prefixes before a record, so parsers search within a line.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass

from tracekit.parsers._stream import ByteStream

#: ANSI escape sequences (colours, cursor moves): Ray and terminals colour their prefixes.
ANSI = re.compile(rb"\x1b(?:\[[0-9;?]*[ -/]*[@-~]|[@-Z\\-_])")
BATCH_BYTES = 1 << 22


@dataclass
class LineSource:
    """What reading the file met besides lines: a truncated or corrupt gzip stream."""

    truncated_gzip: bool = False
    corrupt: str | None = None
    bytes_in: int = 0


def line_batches(path: str | os.PathLike[str], info: LineSource | None = None, *,
                 batch_bytes: int | None = None) -> Iterator[list[bytes]]:
    """Lists of complete lines (about `batch_bytes`, default BATCH_BYTES, of text each), in file order."""
    batch_bytes = batch_bytes or BATCH_BYTES
    rest = b""
    with ByteStream(path, chunk_size=batch_bytes) as stream:
        for chunk in stream.chunks():
            data = rest + chunk if rest else chunk
            cut = data.rfind(b"\n")
            if cut < 0:
                rest = data
                if len(rest) > 4 * batch_bytes:  # no newline at all: hand it over as one line
                    yield [rest.replace(b"\r", b"")]
                    rest = b""
                continue
            rest = data[cut + 1:]
            yield _split(data[:cut])
        if info is not None:
            info.truncated_gzip = stream.truncated_gzip
            info.corrupt = stream.corrupt
            info.bytes_in = stream.bytes_in
    if rest:
        yield _split(rest)


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
