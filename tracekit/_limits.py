"""Resource limits every parser applies to untrusted input (docs/formats.md, "Limits").

A hostile or corrupt file gets a clear `InputError` or a counted skip, never a hang, a silent
wrap or a memory bomb. Parsers use these helpers rather than their own constants so every format
has the same limits:

* `checked_int(value, kind)`: an integer in the range of its kind (a time in ns, an id, a size
  in bytes, a count, a rank), else None; the caller skips the record with `out_of_range(field)`
  as the reason. Never wraps, never raises.
* `json_depth(text)` / `MAX_DEPTH`: nesting depth of a JSON text, checked before decoding
  anything recursive.
* `DecompressionGuard`: the decompressed bytes of a gzip stream may exceed neither
  `GZIP_MAX_RATIO` times the compressed bytes read (beyond `GZIP_FREE_BYTES`) nor a parser's
  absolute cap.
* `world_size(declared, seen)`: a declared world size kept only when it is consistent with the
  ranks the file names and no larger than `MAX_WORLD_SIZE`; structures are never sized by it.
"""

from __future__ import annotations

import math
import re
from typing import Any

#: Deepest JSON (or pickle) nesting accepted in one value. Real traces nest 4 to 6 levels.
MAX_DEPTH = 64
#: Largest single JSON value (one event, one top-level key) the stream reader will buffer.
MAX_VALUE_BYTES = 64 << 20
#: Longest line a line-oriented reader holds: longer ones are skipped (NCCL logs, nccl-tests,
#: Inspector, profiler) or refused (telemetry text), never buffered whole.
MAX_LINE_BYTES = 16 << 20
#: Decompressed bytes allowed per compressed byte read (real Kineto traces: 7x to 22x).
GZIP_MAX_RATIO = 250
#: Decompressed bytes allowed whatever the ratio (small files may compress very well).
GZIP_FREE_BYTES = 64 << 20
#: Largest world size (and rank + 1) believed; larger ones are treated as corrupt.
MAX_WORLD_SIZE = 1 << 18
#: Largest bandwidth believed (GB/s): 100 TB/s is over 50x a B200's 1.8 TB/s of NVLink, so a
#: measurement above it is corrupt.
MAX_GBS = 1e5
#: Largest pickle output, in units of (objects + string bytes / 8), counting shared references
#: once per reference, i.e. the size of the tree a consumer would walk.
PICKLE_MAX_OUTPUT = 32 << 20
#: Most references a pickle may make the unpickler allocate in all (containers copied by REDUCE
#: or left unused count too; a set member counts 5, its hash table's share), checked before each
#: allocation: about 64 MB of pointers. A real Flight Recorder dump of 20,000 entries needs ~2.5 M.
PICKLE_MAX_BUILT = 8 << 20
#: Largest pickle integer, in bytes of its two's-complement encoding.
PICKLE_MAX_INT_BYTES = 16

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
#: Range per kind of number. Times (ns) stay far enough from the int64 edges that adding a base,
#: a duration or a clock offset cannot wrap.
RANGES: dict[str, tuple[int, int]] = {
    "time_ns": (-(2**62), 2**62),
    "duration_ns": (0, 2**61),
    "id": (INT64_MIN, INT64_MAX),
    "size": (0, 2**62),
    "count": (0, 2**31 - 1),
    "rank": (0, MAX_WORLD_SIZE - 1),
    "world_size": (1, MAX_WORLD_SIZE),  # a rank count: structures are sized by it
    "int32": (-(2**31), 2**31 - 1),
}

_DIGITS = re.compile(r"-?[0-9]{1,40}")


def out_of_range(field: str) -> str:
    """The skip reason for a record whose `field` is outside its range."""
    return f"{field}_out_of_range"


def checked_int(value: Any, kind: str = "id") -> int | None:
    """`value` as an int when it is an integer (int, integral float or decimal string) inside the
    range of `kind`; None otherwise. Booleans, NaN, infinities and huge strings are None."""
    lo, hi = RANGES[kind]
    t = type(value)
    if t is int:
        v = value
    elif t is float:
        if not math.isfinite(value) or not value.is_integer():
            return None
        v = int(value)
    elif t is str:
        s = value.strip()
        if len(s) > 41 or not _DIGITS.fullmatch(s):
            return None
        v = int(s)
    else:
        return None
    return v if lo <= v <= hi else None


def in_range(value: int, kind: str) -> bool:
    lo, hi = RANGES[kind]
    return lo <= value <= hi


def json_depth(text: bytes | str, limit: int = MAX_DEPTH) -> int:
    """Nesting depth of a JSON text (strings skipped), counting no further than `limit` + 1."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    depth = deepest = 0
    for m in _DEPTH_TOKENS.finditer(data):
        tok = m.group()
        c = tok[0]
        if c in (0x7B, 0x5B):
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    return deepest
        elif c in (0x7D, 0x5D):
            depth -= 1
    return deepest


_DEPTH_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"?|[{}\[\]]', re.S)


class DecompressionGuard:
    """Tracks compressed bytes in and decompressed bytes out of one stream; `check` returns a
    reason once the output exceeds the ratio cap (beyond the free allowance) or `max_out`."""

    def __init__(self, *, ratio: int = GZIP_MAX_RATIO, free: int = GZIP_FREE_BYTES,
                 max_out: int | None = None) -> None:
        self.ratio, self.free, self.max_out = ratio, free, max_out
        self.bytes_in = 0
        self.bytes_out = 0

    def allowance(self) -> int:
        cap = self.free + self.ratio * self.bytes_in
        return cap if self.max_out is None else min(cap, self.max_out)

    def check(self, n_in: int, n_out: int) -> str | None:
        self.bytes_in += n_in
        self.bytes_out += n_out
        if self.max_out is not None and self.bytes_out > self.max_out:
            return f"decompressed data larger than the {self.max_out:,}-byte limit"
        if self.bytes_out > self.free + self.ratio * self.bytes_in:
            return (f"decompression bomb: {self.bytes_out:,} bytes from {self.bytes_in:,} compressed "
                    f"(more than {self.ratio}x)")
        return None


def world_size(declared: Any, seen: list[int] | set[int]) -> tuple[int | None, str | None]:
    """(world size to keep, warning) for a declared world size and the ranks the file names.

    Kept when it is an integer in 1..MAX_WORLD_SIZE larger than every rank seen; otherwise
    dropped (None) with a warning. Nothing is ever allocated per declared rank."""
    if declared is None:
        return None, None
    w = checked_int(declared, "count")
    if w is None or not 1 <= w <= MAX_WORLD_SIZE:
        return None, f"world_size {_short(declared)} out of range (1..{MAX_WORLD_SIZE}); ignored"
    top = max(seen, default=-1)
    if top >= w:
        return None, f"world_size {w} is not larger than rank {top} named in the file; ignored"
    return w, None


def _short(value: Any, n: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= n else text[: n - 1] + "…"
