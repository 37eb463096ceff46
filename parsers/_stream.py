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

from tracekit._limits import MAX_DEPTH, MAX_VALUE_BYTES, DecompressionGuard
from tracekit.parsers._json_keys import RepeatedKeys

GZIP_MAGIC = b"\x1f\x8b"
CHUNK = 1 << 21

_WS = b" \t\r\n"
_TOKEN = re.compile(rb'["{}\[\]]')
_STRING_TAIL = re.compile(rb'[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_SCALAR = re.compile(rb'[^,}\]\s]*')
_NON_WS = re.compile(rb"[^ \t\r\n]")


class ByteStream:
    """Decompressed bytes of a file in chunks; gzip is detected by magic and may be truncated.

    Decompression is bounded by `guard` (default: `DecompressionGuard()`, the ratio cap): past
    it the stream stops and `limit` says why."""

    def __init__(self, path: str | os.PathLike[str], *, chunk_size: int = CHUNK,
                 guard: DecompressionGuard | None = None) -> None:
        self.path = os.fspath(path)
        self.chunk_size = chunk_size
        self.truncated_gzip = False
        self.corrupt: str | None = None
        self.limit: str | None = None
        self.guard = guard if guard is not None else DecompressionGuard()
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
        """The chunks; `out` receives bytes_in, truncated_gzip, corrupt and limit."""
        if self._z is None:
            while True:
                data = self._fh.read(self.chunk_size)
                if not data:
                    return
                out.bytes_in += len(data)
                yield data
        z = self._z
        guard = self.guard
        while True:
            fresh = 0
            if z.unconsumed_tail:
                data = z.unconsumed_tail
            else:
                data = self._fh.read(self.chunk_size // 4 or 1)
                if not data:
                    if not z.eof:
                        out.truncated_gzip = True
                    return
                out.bytes_in += len(data)
                fresh = len(data)
            try:
                chunk = z.decompress(data, self.chunk_size)
            except zlib.error as exc:
                out.corrupt = f"corrupt gzip data ({exc})"
                return
            why = guard.check(fresh, len(chunk))
            if why is not None:
                out.limit = why
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
        state = SimpleNamespace(bytes_in=self.bytes_in, truncated_gzip=False, corrupt=None, limit=None)
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
                self.limit = state.limit
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


def scan_value(buf: bytes, i: int, eof: bool, resume: int = 0, depth: int = 0,
               deepest: int = 0) -> tuple[int, int, int, int]:
    """Where the JSON value starting at buf[i] ends, resumably.

    Returns (end, resume, depth, deepest): `end` is the index just after the value, or -1 when
    the buffer ends first; then call again (same `i`, a longer buffer) with the returned
    `resume`, `depth` and `deepest`, and scanning continues where it stopped, so a value that
    arrives in many chunks is scanned once. `deepest` is the deepest nesting seen.
    """
    c = buf[i]
    if c == 0x22:
        m = _STRING_TAIL.match(buf, i + 1)
        return (m.end(), 0, 0, 0) if m else (-1, i, 0, 0)
    if c in (0x7B, 0x5B):
        j = max(i, resume)
        search = _TOKEN.search
        match_tail = _STRING_TAIL.match
        while True:
            m = search(buf, j)
            if m is None:
                return -1, len(buf), depth, deepest
            k = m.start()
            ch = buf[k]
            if ch == 0x22:
                s = match_tail(buf, k + 1)
                if s is None:
                    return -1, k, depth, deepest
                j = s.end()
                continue
            j = k + 1
            if ch in (0x7B, 0x5B):
                depth += 1
                if depth > deepest:
                    deepest = depth
            else:
                depth -= 1
                if depth == 0:
                    return j, 0, 0, deepest
    m = _SCALAR.match(buf, i)
    end = m.end()
    if end == len(buf) and not eof:
        return -1, i, 0, 0
    return end, 0, 0, 0


def value_end(buf: bytes, i: int, eof: bool) -> int:
    """Index just after the JSON value starting at buf[i], or -1 when it is incomplete."""
    return scan_value(buf, i, eof)[0]


def _skip_ws(buf: bytes, i: int) -> int:
    m = _NON_WS.search(buf, i)
    return m.start() if m else len(buf)


class ChromeTraceReader:
    """Stream one Chrome-trace JSON object.

    Iterating yields ("batch", decoded) for each verified batch of events and ("bad", raw) for
    a value in the events array that does not decode (or nests deeper than `MAX_DEPTH`), for
    every `traceEvents` array: a duplicated key is read too (`events_arrays` counts them), and
    other keys given twice are named in `duplicate_keys` (the last value is kept). Keys repeated
    inside a top-level value are tallied in `repeated_keys` (`_json_keys`: the last value is
    kept); inside an event they are not looked for (the scan doubled the ingest time): the last
    value is read, as chrome://tracing and Perfetto read it.
    `decode_batch(b"[...]")` must raise on invalid input. After iteration, `metadata` holds the
    other top-level keys, `truncated_tail` the bytes of an incomplete ending, `finished` says
    whether the closing brace was seen and `oversized` whether a single value was larger than
    `MAX_VALUE_BYTES` (the rest of the file is then not read).

    Time is linear in the input: a batch that fails to decode is recovered by decoding runs of
    events that grow after each success and shrink after each failure, so only the bytes around
    a bad event are scanned one event at a time, and a value split over many chunks is scanned
    once (`scan_value` resumes).
    """

    def __init__(self, chunks: Iterator[bytes], decode_batch: Callable[[bytes], Any], *,
                 max_value_bytes: int = MAX_VALUE_BYTES, max_depth: int = MAX_DEPTH) -> None:
        self._it = iter(chunks)
        self.repeated_keys = RepeatedKeys()
        self._decode = decode_batch
        self.max_value_bytes = max_value_bytes
        self.max_depth = max_depth
        self.buf = b""
        self.pos = 0
        self.eof = False
        self.metadata: dict[str, Any] = {}
        self.bad_metadata: list[str] = []
        self.saw_events = False
        #: `traceEvents` arrays met (a duplicated key is read too, not dropped)
        self.events_arrays = 0
        #: other top-level keys given more than once (the last value is kept)
        self.duplicate_keys: list[str] = []
        self.events_closed = False
        self.finished = False
        self.oversized = False
        self.truncated_tail = b""
        self._need_more = False
        #: offset in the stream of buf[0]
        self._base = 0
        #: scan state of a value still incomplete at the end of the buffer: (stream offset of
        #: the value, stream offset to resume at, depth, deepest)
        self._partial: tuple[int, int, int, int] | None = None

    def _more(self) -> bool:
        """Append data to the buffer (dropping what is consumed): at least one chunk, and at
        least as much as is pending, so a value that spans many chunks is copied O(1) times."""
        if self.eof:
            return False
        pending = len(self.buf) - self.pos
        parts = []
        got = 0
        while True:
            try:
                part = next(self._it)
            except StopIteration:
                self.eof = True
                break
            parts.append(part)
            got += len(part)
            if got >= pending:
                break
        if not parts:
            return False
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        if self.pos >= len(self.buf):
            self._base += len(self.buf)
            self.buf = data
        else:
            self._base += self.pos
            self.buf = b"".join((memoryview(self.buf)[self.pos:], data))
        self.pos = 0
        return True

    def _truncate(self) -> None:
        self.truncated_tail = self.buf[self.pos:self.pos + 4096]
        self.pos = len(self.buf)

    def _scan(self, buf: bytes, start: int) -> tuple[int, int]:
        """(end, deepest) of the value at buf[start]; end -1 when more data is needed (the scan
        state is kept, so the next call for the same value resumes)."""
        base = self._base
        resume = depth = deepest = 0
        if self._partial is not None and self._partial[0] == base + start:
            _, r, depth, deepest = self._partial
            resume = r - base
        self._partial = None
        end, resume, depth, deepest = scan_value(buf, start, self.eof, resume, depth, deepest)
        if end < 0:
            self._partial = (base + start, base + resume, depth, deepest)
            if len(buf) - start > self.max_value_bytes:
                self.oversized = True
        return end, deepest

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
            if key_end < 0 and len(buf) - start > self.max_value_bytes:
                raise ChromeFormatError("a top-level key longer than the value size limit")
            colon = _skip_ws(buf, key_end) if key_end > 0 else len(buf)
            value_start = _skip_ws(buf, colon + 1) if colon < len(buf) else len(buf)
            if value_start >= len(buf):
                if not self._more():
                    self._truncate()
                    return "done"
                continue
            if buf[colon] != 0x3A:
                raise ChromeFormatError("malformed key at the top level of the JSON object")
            if buf[value_start] == 0x5B and buf[start:key_end] == b'"traceEvents"':
                self.saw_events = True
                self.events_arrays += 1
                self.events_closed = False
                self.pos = value_start + 1
                return "events"
            end, deepest = self._scan(buf, value_start)
            if end < 0:
                if self.oversized:
                    self._truncate()
                    return "done"
                if not self._more():
                    self._truncate()
                    return "done"
                continue
            try:
                key = msgspec.json.decode(buf[start:key_end])
            except (msgspec.DecodeError, RecursionError) as exc:
                raise ChromeFormatError(f"malformed top-level key ({exc})") from exc
            if key in self.metadata or key in self.bad_metadata:
                self.duplicate_keys.append(str(key))
            if deepest > self.max_depth:
                self.bad_metadata.append(str(key))
            else:
                try:
                    self.metadata[key] = msgspec.json.decode(buf[value_start:end])
                    self.repeated_keys.scan_exact(memoryview(buf)[value_start:end])
                except (msgspec.DecodeError, RecursionError):
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
            if self._partial is not None and self._partial[0] == self._base + pos:
                # the rest of a value that did not fit the last buffer: finish it alone
                end, deepest = self._scan(buf, pos)
                if end < 0:
                    if self.oversized:
                        self._truncate()
                        return
                    if not self._more():
                        self._truncate()
                        return
                    continue
                item = (_decode_one(decode, buf[pos:end], self.repeated_keys)
                        if deepest <= self.max_depth and c == 0x7B else None)
                yield ("bad", buf[pos:end]) if item is None else ("batch", item)
                self.pos = end
                continue
            cut = self._fast_cut(buf, pos)
            hi = n
            if cut is not None:
                end, nxt, closes = cut
                try:
                    decoded = decode(b"".join((b"[", memoryview(buf)[pos:end], b"]")))
                except _DECODE_ERRORS:
                    decoded = None
                if decoded is not None:
                    yield "batch", decoded
                    decoded = None
                    self.pos = nxt
                    if closes:
                        self.events_closed = True
                        return
                    continue
                hi = end
            self._need_more = False
            yield from self._salvage(buf, pos, hi, hi < n)
            if self.events_closed:
                return
            if self.oversized:
                self._truncate()
                return
            if (self._need_more or self.pos >= len(self.buf)) and not self._more():
                self._truncate()
                return

    def _fast_cut(self, buf: bytes, pos: int, hi: int | None = None) -> tuple[int, int, bool] | None:
        """A candidate (end, next_start, closes_array) near the end of the buffer (or of buf[:hi])."""
        j = n = len(buf) if hi is None else hi
        for _ in range(16):
            j = buf.rfind(b"}", pos, j)
            if j < 0:
                return None
            k = _skip_ws(buf, j + 1)
            if k < n:
                c = buf[k]
                if c == 0x2C:
                    k2 = _skip_ws(buf, k + 1)
                    if k2 < len(buf) and buf[k2] == 0x7B:
                        return j + 1, k2, False
                elif c == 0x5D:
                    return j + 1, k + 1, True
        return None

    def _salvage(self, buf: bytes, pos: int, hi: int, hi_is_cut: bool = False) -> Iterator[tuple[str, Any]]:
        """The events from pos (an event boundary) up to at least hi, when the fast batch failed.

        Runs of events are decoded whole ("galloping": the run doubles after a success and
        halves after a failure, cut only at `}, {`); a run shorter than SALVAGE_RUN is split
        event by event with the exact scanner. A decoded run is always cut at a true boundary
        (a false cut never decodes), so the good events are kept and each bad one is yielded
        alone. Stops at the end of the array, when the data runs out, or past hi."""
        decode = self._decode
        good: list[Any] = []
        n = len(buf)
        pending = self._partial is not None and self._partial[0] == self._base + pos
        size = 0 if pending else SALVAGE_RUN * 2
        failed_at = n + 1  # end of the last run that failed: later runs must be shorter
        while pos < hi:
            if size > SALVAGE_RUN:
                target = pos + size
                m = _CUT.search(buf, target, hi) if target < hi else None
                if m is not None:
                    cut_end, cut_next = m.start() + 1, m.end() - 1
                elif hi_is_cut:
                    cut_end = cut_next = hi
                else:  # the buffer may end inside an event: cut at the last boundary before it
                    last = self._fast_cut(buf, pos, min(hi, failed_at))
                    if last is None:
                        size = 0
                        continue
                    cut_end = last[0]
                    cut_next = cut_end if last[2] else last[1]
                if cut_end >= failed_at:
                    size //= 2
                    continue
                try:
                    decoded = decode(b"".join((b"[", memoryview(buf)[pos:cut_end], b"]")))
                except _DECODE_ERRORS:
                    failed_at = cut_end
                    size = min(size, cut_end - pos) // 2
                    continue
                failed_at = n + 1
                good.extend(decoded)
                pos = cut_next
                if pos < n and buf[pos] == 0x2C:
                    pos = _skip_ws(buf, pos + 1)
                size *= 2
                continue
            stop = min(hi, pos + SALVAGE_RUN)
            while pos < stop:
                pos = _skip_ws(buf, pos)
                if pos >= n:
                    break
                c = buf[pos]
                if c == 0x5D:
                    self.pos = pos + 1
                    self.events_closed = True
                    if good:
                        yield "batch", good
                    return
                if c == 0x2C:
                    pos += 1
                    continue
                end, deepest = self._scan(buf, pos)
                if end < 0:
                    self.pos = pos
                    self._need_more = True
                    if good:
                        yield "batch", good
                    return
                if end <= pos:  # a stray '}' where an event should start
                    end = pos + 1
                raw = buf[pos:end]
                item = None
                if deepest <= self.max_depth and c == 0x7B:
                    item = _decode_one(decode, raw, self.repeated_keys)
                if item is None:
                    yield "bad", raw
                else:
                    good.extend(item)
                pos = end
            size = SALVAGE_RUN * 2
        self.pos = pos
        if good:
            yield "batch", good


#: Below this many bytes a failed run is split event by event.
SALVAGE_RUN = 16384
_CUT = re.compile(rb"\}[ \t\r\n]*,[ \t\r\n]*\{")
_DECODE_ERRORS = (msgspec.DecodeError, msgspec.ValidationError, RecursionError)


def _decode_one(decode: Callable[[bytes], Any], raw: bytes, repeated: RepeatedKeys) -> Any | None:
    """One event the batch decoder refused, decoded alone: as given, with invalid UTF-8 replaced,
    then (when it gives a key twice) with the last values only, the repeats tallied in `repeated`."""
    try:
        return decode(b"[" + raw + b"]")
    except _DECODE_ERRORS:
        pass
    fixed = raw.decode("utf-8", "replace").encode()
    try:
        return decode(b"[" + fixed + b"]")
    except _DECODE_ERRORS:
        pass
    keys = RepeatedKeys()
    if not keys.scan_exact(fixed):
        return None
    try:
        item = decode(b"[" + _last_values(fixed) + b"]")
    except (*_DECODE_ERRORS, msgspec.EncodeError):
        return None
    repeated.objects += keys.objects
    repeated.names.update(keys.names)
    return item


_RAW_OBJECT = msgspec.json.Decoder(dict[str, msgspec.Raw])
#: objects nested deeper than this keep their repeats (no event field is an object inside an object)
_LAST_VALUES_DEPTH = 4


def _last_values(raw: bytes, depth: int = 0) -> bytes:
    """The JSON object `raw` with each key once, with its last value, as json and JSON.parse read
    it (so does msgspec, but it checks every value given against the field's type); the values'
    bytes are kept as they are, numbers unrounded."""
    obj = _RAW_OBJECT.decode(raw)
    if depth < _LAST_VALUES_DEPTH:
        for k, v in obj.items():
            b = bytes(v)
            if b.startswith(b"{"):
                obj[k] = msgspec.Raw(_last_values(b, depth + 1))
    return msgspec.json.encode(obj)
