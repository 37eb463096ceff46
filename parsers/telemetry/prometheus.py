"""Prometheus text exposition (0.0.4) and OpenMetrics: one sample per line, `name{labels} value [ts]`.

The file is streamed in blocks of whole lines; a numba kernel (`_kernels.tokenize_exposition`)
splits each line into series (name plus labels), value and time stamp, parsing numbers exactly
(or leaving odd spellings to Python). Series are keyed by a hash of their bytes, checked byte
for byte against the first line of that series, so labels are decoded once per distinct series,
not once per line. Time stamps: a 0.0.4 stamp is integer milliseconds, an OpenMetrics one
(float) seconds; the unit is taken from the magnitude (the ranges for 1990-2200 do not overlap),
and a stamp outside both ranges is read as the format says (ms unless `# EOF`/`# UNIT` lines
mark OpenMetrics), with a warning. A scrape with no time stamps is stored untimed.
"""

from __future__ import annotations

import os
import re
from decimal import Decimal, InvalidOperation

import numpy as np
import pyarrow as pa

from tracekit._limits import MAX_LINE_BYTES
from tracekit.errors import InputError
from tracekit.parsers._stream import ByteStream
from tracekit.parsers.registry import Format
from tracekit.parsers.telemetry import _kernels, families
from tracekit.parsers.telemetry._common import SATURATION_CEILINGS, TS_MAX, TS_MIN, CounterBuffer
from tracekit.store import ParseResult, SourceSink, SourceStats

NAME = "prometheus"
PARSER_VERSION = "1"
#: Bytes tokenized at once: a block and the tokenizer's columns of it stay in the CPU's cache
#: between the passes over them (64 MiB blocks were 13% slower, read from memory each pass).
BLOCK_BYTES = 4 << 20

_NAME = rb"[a-zA-Z_:][a-zA-Z0-9_:]*"
_SAMPLE_HEAD = re.compile(rb"^" + _NAME + rb"(\{[^\n]*\})?[ \t]+[-+0-9.eEnaNIf]+([ \t]+[-+0-9.eE]+)?[ \t]*\r?$")
_META = re.compile(rb"^#[ \t]+(HELP|TYPE|UNIT|EOF)\b")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?\s*')
_UNESCAPE = re.compile(r"\\(.)")
#: Time stamps of years 1990..2200 in milliseconds; seconds are 1,000 times smaller.
_MS_RANGE = (631_152_000_000, 7_258_118_400_000)
_S_RANGE = (631_152_000, 7_258_118_400)
_NONE = np.iinfo(np.int64).min
#: Beyond any stamp `counters` keeps (2^62 ns): where stamps too large for int64 go.
_FAR_NS = 2**62 + 1


def sniff(head: bytes) -> bool:
    """Prometheus text: sample lines only (comments aside), and a `# HELP`/`# TYPE` line, or
    labels on every sample, or at least three samples."""
    lines = [ln for ln in head.split(b"\n")[:64] if ln.strip()]
    if len(head) >= 65536 and lines:
        lines = lines[:-1]
    meta = samples = labelled = 0
    for ln in lines:
        if ln.startswith(b"#"):
            if _META.match(ln):
                meta += 1
            continue
        m = _SAMPLE_HEAD.match(ln)
        if not m:
            return False
        samples += 1
        labelled += m.group(1) is not None
    return samples >= 1 and (meta >= 1 or samples >= 3 or labelled == samples)


def _blocks(where: str, stats: SourceStats):
    """Blocks of whole lines (the last may lack its newline)."""
    try:
        with open(where, "rb") as fh:
            gzipped = fh.read(2) == b"\x1f\x8b"
    except OSError as exc:
        raise InputError(where, f"cannot read ({exc.strerror or exc})") from exc
    if not gzipped:
        yield from _plain_blocks(where)
        return
    rest = b""
    try:
        with ByteStream(where) as stream:
            pending: list[bytes] = [rest]
            size = 0
            for chunk in stream.chunks():
                pending.append(chunk)
                size += len(chunk)
                if size >= BLOCK_BYTES:
                    data = b"".join(pending)
                    cut = data.rfind(b"\n") + 1
                    if cut:
                        yield np.frombuffer(data, np.uint8, count=cut)
                        pending, size = [data[cut:]], len(data) - cut
                    else:
                        pending, size = [data], len(data)
                    if size > MAX_LINE_BYTES:
                        raise InputError(where, _too_long(size))
            if stream.corrupt:
                raise InputError(where, stream.corrupt)
            if stream.truncated_gzip:
                stats.warnings.append("truncated gzip stream: read up to the cut")
            tail = b"".join(pending)
            if tail:
                yield np.frombuffer(tail, np.uint8)
    except OSError as exc:
        raise InputError(where, f"cannot read ({exc.strerror or exc})") from exc


def _too_long(seen: int) -> str:
    return (f"no newline in {seen:,} bytes, a line longer than the {MAX_LINE_BYTES:,}-byte limit: "
            "not Prometheus text")


def _plain_blocks(where: str):
    """Blocks of an uncompressed file, read into one reused buffer (a block is valid until the
    next one is read)."""
    buf = bytearray(BLOCK_BYTES)
    view = memoryview(buf)
    try:
        with open(where, "rb", buffering=0) as fh:
            filled = 0
            while True:
                got = fh.readinto(view[filled:])
                if got:
                    filled += got
                if filled < len(buf) and got:
                    continue
                if filled == 0:
                    return
                cut = buf.rfind(b"\n", 0, filled) + 1 if got else filled
                if cut == 0:
                    if filled > MAX_LINE_BYTES:
                        raise InputError(where, _too_long(filled))
                    bigger = bytearray(2 * len(buf))
                    bigger[:filled] = buf[:filled]
                    buf, view = bigger, memoryview(bigger)
                    continue
                yield np.frombuffer(buf, np.uint8, count=cut)
                rest = filled - cut
                view[:rest] = view[cut:filled]
                filled = rest
                if not got:
                    if filled:
                        yield np.frombuffer(buf, np.uint8, count=filled)
                    return
    except OSError as exc:
        raise InputError(where, f"cannot read ({exc.strerror or exc})") from exc


def parse(path: str | os.PathLike[str], sink: SourceSink, *, rank: int | None = None) -> ParseResult:
    """Parse one exposition file into `counters`."""
    where = os.fspath(path)
    stats = SourceStats()
    buf = CounterBuffer(sink, NAME, stats)
    series = _SeriesTable()
    state = {"openmetrics": False, "as_s": 0, "as_ms": 0, "out_of_range": 0, "untimed": 0, "lines": 0}
    types: dict[str, str] = {}
    kept: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    for block in _blocks(where, stats):
        got = _parse_block(block, series, stats, types, state)
        if got is not None:
            kept.append(got)
    if state["lines"] == 0:
        raise InputError(where, "empty file")
    if kept:
        codes, values, ts = (np.concatenate(parts) for parts in zip(*kept, strict=True))
        kept.clear()
        _store(codes, values, ts, series, stats, buf)
    res = buf.result()
    if state["untimed"]:
        stats.warnings.append(f"{state['untimed']:,} sample(s) carry no time stamp (a single scrape): "
                              "stored untimed; rates need time stamps")
    if state["as_s"] and not state["openmetrics"]:
        stats.warnings.append(f"{state['as_s']:,} time stamp(s) read as seconds by their magnitude "
                              "(the 0.0.4 format says milliseconds)")
    if state["as_ms"] and state["openmetrics"]:
        stats.warnings.append(f"{state['as_ms']:,} time stamp(s) read as milliseconds by their magnitude "
                              "(OpenMetrics says seconds)")
    if state["out_of_range"]:
        unit = "seconds (OpenMetrics)" if state["openmetrics"] else "milliseconds (0.0.4)"
        stats.warnings.append(f"{state['out_of_range']:,} time stamp(s) outside 1990-2200 in both units; "
                              f"read as {unit}")
    for name, declared in sorted(types.items()):
        fam = families.prometheus_family(name)
        if fam.spec is not None and declared in ("counter", "gauge") and fam.spec.kind != declared \
                and not (fam.spec.kind == "rate" and declared == "gauge"):
            stats.warnings.append(f"{name}: declared {declared}, read as {fam.spec.kind} (tracekit knows this family)")
    return res


class _SeriesTable:
    """Distinct series (name + label bytes) -> code, with per-code identity and spec lists, and
    the open-addressing table the tokenizer looks codes up in."""

    def __init__(self) -> None:
        self.seed = np.uint64(int.from_bytes(os.urandom(8), "little"))
        self.tab_hash = np.zeros(1 << 12, np.uint64)
        self.tab_code = np.full(1 << 12, -1, np.int64)
        self.rep_buf = np.zeros(0, np.uint8)
        self.rep_s0 = np.zeros(0, np.int64)
        self.rep_len = np.zeros(0, np.int64)
        self.specs: list = []
        self.skip: list[str | None] = []
        self.names: list[str] = []
        self.hosts: list[str | None] = []
        self.devices: list[str] = []
        self.ports: list[str] = []
        self.qualifiers: list[str | None] = []

    def tokenize(self, arr: np.ndarray) -> tuple:
        """Run the tokenizer on one block, growing the table when it fills; learn new series."""
        while True:
            n_known = len(self.specs)
            out = _kernels.tokenize_exposition(arr, self.seed, self.tab_hash, self.tab_code, self.rep_buf,
                                               self.rep_s0, self.rep_len, n_known)
            if out[-1] == 0:
                break
            self._grow()
        new_s0, new_len = out[-3], out[-2]
        if len(new_s0):
            pieces = [arr[a:a + m] for a, m in zip(new_s0.tolist(), new_len.tolist(), strict=True)]
            offsets = np.cumsum([0] + [len(p) for p in pieces[:-1]]) + len(self.rep_buf)
            self.rep_buf = np.concatenate([self.rep_buf, *pieces])
            self.rep_s0 = np.concatenate([self.rep_s0, offsets.astype(np.int64)])
            self.rep_len = np.concatenate([self.rep_len, new_len.astype(np.int64)])
            for piece in pieces:
                text = piece.tobytes().decode("utf-8", "replace")
                brace = text.find("{")
                name, labels = (text, "") if brace < 0 else (text[:brace], text[brace:])
                self._add(name, labels)
        return out[:-3]

    def _grow(self) -> None:
        """Double the table and re-insert the known series (entries of a failed run are dropped)."""
        cap = len(self.tab_hash) * 2
        self.tab_hash = np.zeros(cap, np.uint64)
        self.tab_code = np.full(cap, -1, np.int64)
        n_known = len(self.specs)
        _kernels.rebuild_table(self.rep_buf, self.rep_s0[:n_known], self.rep_len[:n_known], self.seed,
                               self.tab_hash, self.tab_code)

    def _add(self, name: str, label_text: str) -> None:
        fam = families.prometheus_family(name)
        if fam.spec is None and fam.skip == families.UNUSED and name.endswith("_total"):
            fam = families.prometheus_family(name[: -len("_total")])
        labels = parse_labels(label_text)
        self.specs.append(fam.spec)
        self.names.append(name)
        if fam.spec is None or labels is None or fam.identity is None:
            self.skip.append(fam.skip or ("malformed_labels" if labels is None else families.UNUSED))
            self.hosts.append(None)
            self.devices.append("")
            self.ports.append("")
            self.qualifiers.append(None)
            return
        host, device, port, qualifier = fam.identity(labels, None)
        self.skip.append(None)
        self.hosts.append(host)
        self.devices.append(device)
        self.ports.append(port)
        self.qualifiers.append(qualifier)


def parse_labels(text: str) -> dict[str, str] | None:
    """`{a="x",b="y\\"z"}` -> {"a": "x", "b": 'y"z'}; None when malformed."""
    if not text:
        return {}
    body = text[1:-1].strip()
    out: dict[str, str] = {}
    pos = 0
    while pos < len(body):
        m = _LABEL.match(body, pos)
        if not m:
            return None
        out[m.group(1)] = _UNESCAPE.sub(lambda e: "\n" if e.group(1) == "n" else e.group(1), m.group(2))
        pos = m.end()
    return out


def _parse_block(arr: np.ndarray, series: _SeriesTable, stats: SourceStats, types: dict[str, str],
                 state: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Tokenize one block; count its skips; return (series code, value, ns time) of its samples."""
    kind, s0, slen, codes, value, vstate, ts, tfrac, tstate, l0, llen = series.tokenize(arr)
    state["lines"] += len(kind)
    for j in np.flatnonzero(kind == 1).tolist():
        line = arr[l0[j]:l0[j] + llen[j]].tobytes().decode("utf-8", "replace")
        parts = line.split(None, 3)
        if len(parts) >= 2 and parts[1] in ("EOF", "UNIT"):
            state["openmetrics"] = True
        if len(parts) >= 4 and parts[1] == "TYPE":
            types[parts[2]] = parts[3].strip()
    n_bad = int((kind == 3).sum())
    if n_bad:
        stats.skip("malformed_line", n_bad)
    sample = kind == 2
    if not sample.any():
        return None
    # One mask per reason over the whole block, then one gather of the kept samples.
    skip = np.array([r is not None for r in series.skip] + [False], bool)
    skipped = sample & skip[codes]  # codes are -1 on other lines: the extra False
    if skipped.any():
        per_code = np.bincount(codes[skipped], minlength=len(series.skip))
        for c in np.flatnonzero(per_code).tolist():
            stats.skip(series.skip[c], int(per_code[c]))
    live = sample & ~skipped
    for j in np.flatnonzero(live & (vstate == 2)).tolist():
        value[j], vstate[j] = _slow_value(arr[l0[j]:l0[j] + llen[j]].tobytes(), slen[j] + (s0[j] - l0[j]))
    for j in np.flatnonzero(live & (tstate == 2)).tolist():
        ts[j], tfrac[j], tstate[j] = _slow_ts(arr[l0[j]:l0[j] + llen[j]].tobytes(), slen[j] + (s0[j] - l0[j]))
    bad_value = live & (vstate == 0)
    bad_ts = live & ~bad_value & (tstate == 3)
    nan_value = live & ~bad_value & ~bad_ts & np.isnan(value)
    for reason, mask in (("bad_value", bad_value), ("bad_timestamp", bad_ts), ("nan_value", nan_value)):
        if mask.any():
            stats.skip(reason, int(mask.sum()))
    keep = np.flatnonzero(live & ~(bad_value | bad_ts | nan_value))
    if not len(keep):
        return None
    return codes[keep], value[keep], _timestamps(ts[keep], tfrac[keep], tstate[keep], state)


def _slow_value(line: bytes, series_end: int) -> tuple[float, int]:
    """Python's float() for spellings the kernel leaves alone; (0, 0) when not a number."""
    tokens = line[series_end:].split()
    try:
        return float(tokens[0]), 1
    except (IndexError, ValueError):
        return 0.0, 0


def _slow_ts(line: bytes, series_end: int) -> tuple[int, int, int]:
    """(whole, fraction x 1e9, state) for a stamp in exponent notation; state 3 when invalid."""
    tokens = line[series_end:].split()
    try:
        d = Decimal(tokens[1].decode("ascii"))
    except (IndexError, InvalidOperation, UnicodeDecodeError):
        return 0, 0, 3
    if not d.is_finite() or abs(d) >= 10**18:
        return 0, 0, 3
    whole = int(d)
    return whole, int((d - whole) * 1_000_000_000), 1


def _timestamps(whole: np.ndarray, frac9: np.ndarray, tstate: np.ndarray, state: dict) -> np.ndarray:
    """ns since the epoch (int64 min = no stamp); the unit from the magnitude (see module doc)."""
    has = tstate == 1
    if has.all() and len(whole) and _MS_RANGE[0] <= whole.min() and whole.max() <= _MS_RANGE[1]:
        state["as_ms"] += len(whole)
        return whole * 1_000_000 + frac9 // 1000
    out = np.full(len(whole), _NONE, np.int64)
    state["untimed"] += int((~has).sum())
    if not has.any():
        return out
    w = whole.astype(np.float64)
    is_ms = has & (w >= _MS_RANGE[0]) & (w <= _MS_RANGE[1])
    is_s = has & (w >= _S_RANGE[0]) & (w <= _S_RANGE[1])
    other = has & ~is_ms & ~is_s
    state["as_ms"] += int(is_ms.sum())
    state["as_s"] += int(is_s.sum())
    state["out_of_range"] += int(other.sum())
    as_s = is_s | (other & state["openmetrics"])
    as_ms = has & ~as_s
    out[as_s] = whole[as_s] * 1_000_000_000 + frac9[as_s]
    out[as_ms] = whole[as_ms] * 1_000_000 + frac9[as_ms] // 1000
    # A stamp whose ns would not fit in int64 is out of range (skipped when stored), not wrapped.
    too_big = (as_s & (np.abs(w) >= _FAR_NS / 1e9)) | (as_ms & (np.abs(w) >= _FAR_NS / 1e6))
    out[too_big] = np.sign(whole[too_big]) * _FAR_NS
    return out


def _store(codes: np.ndarray, values: np.ndarray, ts: np.ndarray, series: _SeriesTable, stats: SourceStats,
           buf: CounterBuffer) -> None:
    specs = series.specs
    scale = np.array([s.scale if s is not None else 1.0 for s in specs])
    if (scale != 1.0).any():
        values = values * scale[codes]
    saturated = np.zeros(len(values), bool)
    rows = np.flatnonzero(np.array([bool(s and s.saturable) for s in specs] + [False], bool)[codes])
    if len(rows):
        # `saturated_mask` per row, with each series' width and device factor looked up by code.
        sub = codes[rows]
        factor = np.array([s.device_factor if s else 1.0 for s in specs])[sub]
        bits = np.array([s.bits if s and s.bits is not None and s.bits <= 32 else 0 for s in specs])[sub]
        raw = values[rows] / factor
        at_ceiling = np.where(bits > 0, raw >= 2.0 ** bits - 1,
                              np.isin(raw, np.array(SATURATION_CEILINGS, np.float64)))
        saturated[rows] = at_ceiling
        per_code = np.bincount(sub[at_ceiling], minlength=len(specs))
        for c in np.flatnonzero(per_code).tolist():
            host, device = series.hosts[c], series.devices[c]
            where = f"{host + '/' if host and host != device else ''}{device}:{series.ports[c]}"
            key = (where, series.names[c])
            buf.saturated[key] = buf.saturated.get(key, 0) + int(per_code[c])

    seen = np.zeros(len(specs), bool)
    seen[codes] = True
    per_series = {"device": series.devices, "port": series.ports, "metric": [s.metric if s else None for s in specs],
                  "kind": [s.kind if s else None for s in specs], "host": series.hosts,
                  "direction": [s.direction if s else None for s in specs], "qualifier": series.qualifiers,
                  "name": series.names}
    dictionaries = {}
    luts = np.empty((len(per_series) + 1, len(specs)), np.int32)
    for k, (col, per_code_values) in enumerate(per_series.items()):
        uniq = sorted({v for v in per_code_values if v is not None})
        index = {v: i for i, v in enumerate(uniq)}
        luts[k] = [index.get(v, -1) if v is not None else -1 for v in per_code_values]
        dictionaries[col] = uniq
    luts[-1] = [s.bits if s is not None and s.bits else 0 for s in specs]
    gathered = _kernels.gather_columns(codes, luts)

    def dict_col(k: int, col: str) -> pa.DictionaryArray:
        null = luts[k][seen] < 0
        if null.all():
            indices = pa.nulls(len(codes), pa.int32())
        else:
            idx = gathered[k]
            indices = pa.array(idx, pa.int32(), mask=idx < 0 if null.any() else None)
        return pa.DictionaryArray.from_arrays(indices, pa.array(dictionaries[col], pa.string()))

    cols = {col: dict_col(k, col) for k, col in enumerate(per_series)}
    bits = gathered[-1]
    untimed = ts == _NONE
    table = pa.table({
        "ts_ns": pa.array(ts, pa.int64(), mask=untimed if untimed.any() else None),
        "device": cols["device"],
        "port": cols["port"],
        "metric": cols["metric"],
        "value": pa.array(values, pa.float64()),
        "kind": cols["kind"],
        "bits": pa.array(bits, pa.int32(), mask=bits == 0 if (luts[-1][seen] == 0).any() else None),
        "source_format": pa.DictionaryArray.from_arrays(pa.array(np.zeros(len(values), np.int32)), pa.array([NAME])),
        "host": cols["host"],
        "direction": cols["direction"],
        "qualifier": cols["qualifier"],
        "saturated": pa.array(saturated),
        "saturable": pa.array(np.array([bool(s and s.saturable) for s in specs], bool)[codes]),
        "name": cols["name"],
    })
    lo, hi = (int(ts.min()), int(ts.max())) if len(ts) else (0, -1)
    in_range = lo != _NONE and lo >= TS_MIN and hi <= TS_MAX
    stats.store(len(values))
    buf.add_table(table, in_range=in_range)
    if not in_range:
        valid = ts[(ts != _NONE) & (ts >= TS_MIN) & (ts <= TS_MAX)]
        lo, hi = (int(valid.min()), int(valid.max())) if len(valid) else (0, -1)
    if lo <= hi:
        buf.ts_min = lo if buf.ts_min is None else min(buf.ts_min, lo)
        buf.ts_max = hi if buf.ts_max is None else max(buf.ts_max, hi)


FORMAT = Format(name=NAME, description="Prometheus text", version=PARSER_VERSION, parse=parse,
                sniffs=(lambda head: sniff(head.data),))
