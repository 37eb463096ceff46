"""Byte streams (plain or gzip, truncation-tolerant) and a streaming reader for Chrome-trace JSON.

The reader never builds the whole object tree: it splits the `traceEvents` array into batches of
raw events and hands each batch to a decoder. Fast cuts at `}, {` are verified by the decoder (a
wrong cut always yields invalid JSON); on failure an exact scanner splits the region event by
event. Top-level keys before and after `traceEvents` are decoded into `metadata`.
"""

from __future__ import annotations

import os
import queue
import re
import threading
import zlib
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any, BinaryIO

import msgspec

GZIP_MAGIC = b"\x1f\x8b"
CHUNK = 1 << 21

_WS = b" \t\r\n"
_TOKEN = re.compile(rb'["{}\[\]]')
_STRING_TAIL = re.compile(rb'[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_SCALAR = re.compile(rb'[^,}\]\s]*')
_NON_WS = re.compile(rb"[^ \t\r\n]")


class ByteStream:
    """Decompressed bytes of a file in chunks; gzip is detected by magic and may be truncated."""

    def __init__(self, path: str | os.PathLike[str], *, chunk_size: int = CHUNK) -> None:
        self.path = os.fspath(path)
        self.chunk_size = chunk_size
        self.truncated_gzip = False
        self.corrupt: str | None = None
        self.bytes_in = 0
        self._fh: BinaryIO = open(self.path, "rb")  # noqa: SIM115
        head = self._fh.read(2)
        self._fh.seek(0)
        self.gzipped = head == GZIP_MAGIC
        self._z = zlib.decompressobj(wbits=47) if self.gzipped else None
        self._stop: threading.Event | None = None
        self._thread: threading.Thread | None = None

    def close(self) -> None:
        self._stop_thread()
        self._fh.close()

    def __enter__(self) -> ByteStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def chunks(self) -> Iterator[bytes]:
        return self._chunks(self)

    def _chunks(self, out: Any) -> Iterator[bytes]:
        """The chunks; `out` receives bytes_in, truncated_gzip and corrupt."""
        if self._z is None:
            while True:
                data = self._fh.read(self.chunk_size)
                if not data:
                    return
                out.bytes_in += len(data)
                yield data
        z = self._z
        while True:
            if z.unconsumed_tail:
                data = z.unconsumed_tail
            else:
                data = self._fh.read(self.chunk_size // 4 or 1)
                if not data:
                    if not z.eof:
                        out.truncated_gzip = True
                    return
                out.bytes_in += len(data)
            try:
                chunk = z.decompress(data, self.chunk_size)
            except zlib.error as exc:
                out.corrupt = f"corrupt gzip data ({exc})"
                return
            if chunk:
                yield chunk
            if z.eof:
                rest = z.unused_data
                if rest.strip(b"\x00"):
                    if rest[:2] != GZIP_MAGIC:
                        return
                    self._z = z = zlib.decompressobj(wbits=47)
                    self._fh.seek(self._fh.tell() - len(rest))
                    out.bytes_in -= len(rest)
                    continue
                if not self._fh.read(1):
                    return
                self._fh.seek(-1, os.SEEK_CUR)
                self._z = z = zlib.decompressobj(wbits=47)

    def prefetched(self, depth: int = 4) -> Iterator[bytes]:
        """chunks() read and decompressed on a background thread (file reads and zlib release
        the GIL), at most `depth` chunks ahead. The flags (bytes_in, truncated_gzip, corrupt)
        are set when the consumer reaches the end, exactly as with chunks()."""
        if self._thread is not None:
            raise RuntimeError("prefetched() is already running")
        state = SimpleNamespace(bytes_in=self.bytes_in, truncated_gzip=False, corrupt=None)
        q: queue.Queue[tuple[int, Any]] = queue.Queue(maxsize=max(1, depth))
        stop = threading.Event()

        def put(item: tuple[int, Any]) -> bool:
            while not stop.is_set():
                try:
                    q.put(item, timeout=0.05)
                    return True
                except queue.Full:
                    continue
            return False

        def produce() -> None:
            try:
                for chunk in self._chunks(state):
                    if not put((0, chunk)):
                        return
            except BaseException as exc:  # handed to the consumer, raised there
                put((2, exc))
                return
            put((1, None))

        self._stop = stop
        self._thread = threading.Thread(target=produce, name="tracekit-gunzip", daemon=True)
        self._thread.start()
        return self._consume(q, state)

    def _consume(self, q: queue.Queue[tuple[int, Any]], state: Any) -> Iterator[bytes]:
        try:
            while True:
                tag, item = q.get()
                if tag == 0:
                    yield item
                    continue
                if tag == 2:
                    raise item
                self.bytes_in = state.bytes_in
                self.truncated_gzip = state.truncated_gzip
                self.corrupt = state.corrupt
                return
        finally:
            self._stop_thread()

    def _stop_thread(self) -> None:
        thread, stop = self._thread, self._stop
        if thread is None or stop is None:
            return
        stop.set()
        thread.join()
        self._thread = self._stop = None


def peek(path: str | os.PathLike[str], n: int = 65536) -> bytes:
    """The first `n` decompressed bytes of a file (gunzipping transparently)."""
    with ByteStream(path, chunk_size=max(n, 4096)) as stream:
        out = bytearray()
        for chunk in stream.chunks():
            out += chunk
            if len(out) >= n:
                break
    return bytes(out[:n])


class ChromeFormatError(ValueError):
    """The bytes are not a JSON object with a `traceEvents` array."""


def value_end(buf: bytes, i: int, eof: bool) -> int:
    """Index just after the JSON value starting at buf[i], or -1 when it is incomplete."""
    c = buf[i]
    if c == 0x22:
        m = _STRING_TAIL.match(buf, i + 1)
        return m.end() if m else -1
    if c in (0x7B, 0x5B):
        depth = 0
        j = i
        search = _TOKEN.search
        match_tail = _STRING_TAIL.match
        while True:
            m = search(buf, j)
            if m is None:
                return -1
            k = m.start()
            ch = buf[k]
            if ch == 0x22:
                s = match_tail(buf, k + 1)
                if s is None:
                    return -1
                j = s.end()
                continue
            depth += 1 if ch in (0x7B, 0x5B) else -1
            j = k + 1
            if depth == 0:
                return j
    m = _SCALAR.match(buf, i)
    end = m.end()
    if end == len(buf) and not eof:
        return -1
    return end


def _skip_ws(buf: bytes, i: int) -> int:
    m = _NON_WS.search(buf, i)
    return m.start() if m else len(buf)


class ChromeTraceReader:
    """Stream one Chrome-trace JSON object.

    Iterating yields ("batch", decoded) for each verified batch of events and ("bad", raw) for
    an event that does not decode. `decode_batch(b"[...]")` must raise on invalid input. After
    iteration, `metadata` holds the other top-level keys, `truncated_tail` the bytes of an
    incomplete ending, and `finished` says whether the closing brace was seen.
    """

    def __init__(self, chunks: Iterator[bytes], decode_batch: Callable[[bytes], Any]) -> None:
        self._it = iter(chunks)
        self._decode = decode_batch
        self.buf = b""
        self.pos = 0
        self.eof = False
        self.metadata: dict[str, Any] = {}
        self.bad_metadata: list[str] = []
        self.saw_events = False
        self.events_closed = False
        self.finished = False
        self.truncated_tail = b""
        self._need_more = False

    def _more(self) -> bool:
        if self.eof:
            return False
        try:
            data = next(self._it)
        except StopIteration:
            self.eof = True
            return False
        if self.pos >= len(self.buf):
            self.buf = data
        else:
            self.buf = b"".join((memoryview(self.buf)[self.pos:], data))
        self.pos = 0
        return True

    def _truncate(self) -> None:
        self.truncated_tail = self.buf[self.pos:]
        self.pos = len(self.buf)

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        while True:
            self.pos = _skip_ws(self.buf, self.pos)
            if self.pos < len(self.buf):
                break
            if not self._more():
                raise ChromeFormatError("empty file")
        if self.buf.startswith(b"\xef\xbb\xbf", self.pos):
            self.pos += 3
        if self.buf[self.pos:self.pos + 1] != b"{":
            raise ChromeFormatError("not a JSON object")
        self.pos += 1
        while True:
            status = self._next_key()
            if status == "events":
                yield from self._events()
                if not self.events_closed:
                    return
            elif status == "done":
                return

    def _next_key(self) -> str:
        while True:
            self.pos = _skip_ws(self.buf, self.pos)
            if self.pos >= len(self.buf):
                if not self._more():
                    self._truncate()
                    return "done"
                continue
            c = self.buf[self.pos]
            if c == 0x2C:
                self.pos += 1
                continue
            if c == 0x7D:
                self.pos += 1
                self.finished = True
                return "done"
            if c != 0x22:
                raise ChromeFormatError(f"unexpected {chr(c)!r} at the top level of the JSON object")
            buf, start = self.buf, self.pos
            key_end = value_end(buf, start, self.eof)
            colon = _skip_ws(buf, key_end) if key_end > 0 else len(buf)
            value_start = _skip_ws(buf, colon + 1) if colon < len(buf) else len(buf)
            if value_start >= len(buf):
                if not self._more():
                    self._truncate()
                    return "done"
                continue
            if buf[colon] != 0x3A:
                raise ChromeFormatError("malformed key at the top level of the JSON object")
            if (buf[value_start] == 0x5B and buf[start:key_end] == b'"traceEvents"'
                    and not self.saw_events):
                self.saw_events = True
                self.pos = value_start + 1
                return "events"
            end = value_end(buf, value_start, self.eof)
            if end < 0:
                if not self._more():
                    self._truncate()
                    return "done"
                continue
            try:
                key = msgspec.json.decode(buf[start:key_end])
            except msgspec.DecodeError as exc:
                raise ChromeFormatError(f"malformed top-level key ({exc})") from exc
            try:
                self.metadata[key] = msgspec.json.decode(buf[value_start:end])
            except msgspec.DecodeError:
                self.bad_metadata.append(str(key))
            self.pos = end

    def _events(self) -> Iterator[tuple[str, Any]]:
        decode = self._decode
        while True:
            buf = self.buf
            pos = self.pos = _skip_ws(buf, self.pos)
            n = len(buf)
            if pos >= n:
                if not self._more():
                    self._truncate()
                    return
                continue
            c = buf[pos]
            if c == 0x5D:
                self.pos = pos + 1
                self.events_closed = True
                return
            if c == 0x2C:
                self.pos = pos + 1
                continue
            cut = self._fast_cut(buf, pos)
            if cut is not None:
                end, nxt, closes = cut
                try:
                    decoded = decode(b"".join((b"[", memoryview(buf)[pos:end], b"]")))
                except (msgspec.DecodeError, msgspec.ValidationError):
                    decoded = None
                if decoded is not None:
                    yield "batch", decoded
                    decoded = None
                    self.pos = nxt
                    if closes:
                        self.events_closed = True
                        return
                    continue
            self._need_more = False
            yield from self._exact(buf, pos)
            if self.events_closed:
                return
            if (self._need_more or self.pos >= len(self.buf)) and not self._more():
                self._truncate()
                return

    def _fast_cut(self, buf: bytes, pos: int) -> tuple[int, int, bool] | None:
        """A candidate (end, next_start, closes_array) near the end of the buffer."""
        j = len(buf)
        for _ in range(16):
            j = buf.rfind(b"}", pos, j)
            if j < 0:
                return None
            k = _skip_ws(buf, j + 1)
            if k < len(buf):
                c = buf[k]
                if c == 0x2C:
                    k2 = _skip_ws(buf, k + 1)
                    if k2 < len(buf) and buf[k2] == 0x7B:
                        return j + 1, k2, False
                elif c == 0x5D:
                    return j + 1, k + 1, True
        return None

    def _exact(self, buf: bytes, pos: int) -> Iterator[tuple[str, Any]]:
        """Split events one by one with the exact scanner, from pos until the data runs out."""
        decode = self._decode
        n = len(buf)
        while pos < n:
            c = buf[pos]
            if c == 0x5D:
                self.pos = pos + 1
                self.events_closed = True
                return
            end = value_end(buf, pos, self.eof)
            if end < 0:
                self._need_more = True
                return
            raw = buf[pos:end]
            try:
                yield "batch", decode(b"[" + raw + b"]")
            except (msgspec.DecodeError, msgspec.ValidationError):
                fixed = raw.decode("utf-8", "replace").encode()
                try:
                    yield "batch", decode(b"[" + fixed + b"]")
                except (msgspec.DecodeError, msgspec.ValidationError):
                    yield "bad", raw
            pos = _skip_ws(buf, end)
            if pos < n and buf[pos] == 0x2C:
                pos = _skip_ws(buf, pos + 1)
            self.pos = pos

