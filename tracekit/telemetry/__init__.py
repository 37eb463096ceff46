"""Telemetry counters -> per-window `link_samples`: the one place where rates are derived.

A port is (host, device, port). Its samples (one per counter series per scrape) are snapped onto
the port's scrape times (samples closer than a quarter of the shortest step of any of the port's
series are one scrape: gnmic stamps each leaf on its own), de-duplicated (`duplicate`: same
series, same scrape; the first is kept), and every pair of consecutive scrapes is a window:
`ts_ns` = the earlier scrape, `interval_ns` = the gap, both in ns since the epoch like replay's
windows, so the two overlay directly.

Per counter series and window:

* the difference of the two samples is the window's count (`tx_bytes`, `rx_pkts`, ...);
* a 32-bit counter that wraps (IF-MIB `ifInOctets`) is unwrapped (+2^32, flag `wrapped`) only when
  the window is shorter than the time the counter takes to wrap at the port's line rate; a longer
  window (or an unknown speed) may hide any number of wraps: `wrap_ambiguous`, no number;
* a counter whose later sample sits at a saturation ceiling (IB PortCounters clamp at 2^32-1 or
  2^16-1) gives no number: `saturated`;
* any other decrease is a reset (cleared counters, a reboot): `reset`, no number, never traffic;
* a series with no sample at the window's start (it missed that scrape) gives no number for the
  window: `gap`; a window longer than `gap_factor` x the port's usual interval (the whole port
  missed a scrape) keeps its numbers and is flagged `gap`.

`kind` "rate" samples (DCGM `PROF_*`: bytes/s averaged over DCGM's period) are integrated over the
window (value at the window's end x interval), never differenced. Gauges are never rated;
`speed_bps` is the capacity for utilisation (the port's own, else the topology link's).
Voiding flags (`saturated`, `reset`, `wrap_ambiguous`, and `gap` on a metric) are listed per
metric in `flag_detail` ("tx_bytes:reset") and leave that metric null; `flags` is the set of
flag names of the window. Counts per qualifier (per queue) are summed per metric.

Link identity (`link`, `link_end`): a user link map first, then ibnetdiscover (by node name,
`<host>/<device>`, GUID or LID), else the port's own name (`<host>/<device>:<port>`, no end).
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute

from tracekit import schema
from tracekit.finding import Finding
from tracekit.results import Result
from tracekit.store import Run
from tracekit.telemetry import _kernels as _k

ORIGIN = "telemetry"
VOIDING_FLAGS = ("saturated", "reset", "wrap_ambiguous", "gap")
#: Output column per (metric, direction); direction None matches any.
OUTPUT_COLUMNS = {
    ("tx_bytes", "tx"): "tx_bytes", ("rx_bytes", "rx"): "rx_bytes",
    ("tx_pkts", "tx"): "tx_pkts", ("rx_pkts", "rx"): "rx_pkts",
    ("pfc_pause", "tx"): "tx_pause", ("pfc_pause", "rx"): "rx_pause",
    ("ecn_marked", "tx"): "ecn_marked", ("ecn_marked", "rx"): "ecn_marked", ("ecn_marked", None): "ecn_marked",
    ("discards", "tx"): "tx_discards", ("discards", "rx"): "rx_discards",
    ("errors", "tx"): "tx_errors", ("errors", "rx"): "rx_errors",
    ("xmit_wait", "tx"): "xmit_wait", ("xmit_wait", None): "xmit_wait",
}
VALUE_COLUMNS = ("tx_bytes", "rx_bytes", "tx_pkts", "rx_pkts", "tx_pause", "rx_pause", "ecn_marked",
                 "tx_discards", "rx_discards", "tx_errors", "rx_errors", "xmit_wait")
#: Smallest frame counted when bounding a packet counter's rate (64 B Ethernet, ~IB header-only).
MIN_FRAME_BYTES = 64
PORT_KEY = ("host", "device", "port")
SERIES_KEY = (*PORT_KEY, "metric", "direction", "qualifier")


class RateCounts(Result, frozen=True, kw_only=True):
    """The accounting of one rating as results/telemetry.json keeps it: the reasons and flags in name order."""

    read: int = 0
    used: int = 0
    skipped: dict[str, int] = msgspec.field(default_factory=dict)
    windows: int = 0
    flagged: dict[str, int] = msgspec.field(default_factory=dict)
    ports: int = 0
    mapped_ports: int = 0


@dataclass
class RateStats:
    """Accounting of one rating: every counter sample is used or skipped with a reason (kept while it
    rates; `counts` is what it reports)."""

    read: int = 0
    used: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    windows: int = 0
    flagged: Counter[str] = field(default_factory=Counter)
    ports: int = 0
    mapped_ports: int = 0

    @property
    def balanced(self) -> bool:
        return self.read == self.used + sum(self.skipped.values())

    def counts(self) -> RateCounts:
        return RateCounts(read=self.read, used=self.used, skipped=dict(sorted(self.skipped.items())),
                          windows=self.windows, flagged=dict(sorted(self.flagged.items())), ports=self.ports,
                          mapped_ports=self.mapped_ports)


@dataclass
class TelemetryRates:
    """`link_samples` rows (origin "telemetry") and how they were made."""

    link_samples: pa.Table
    stats: RateStats
    warnings: list[str] = field(default_factory=list)


class FlaggedWindow(Result, frozen=True):
    """A rate window the rating flagged, and why (the flags' details, then the flags alone)."""

    ts_ns: int
    interval_ns: int
    reasons: tuple[str, ...]


class LinkSummary(Result, frozen=True, kw_only=True):
    """One link (or unmapped port) over the run: utilisation and its flagged windows (the first
    ones; `flagged_windows` counts them all)."""

    link: str
    host: str | None
    device: str
    port: str
    link_end: str | None
    windows: int
    speed_bps: float | None
    peak_util: float | None
    mean_util: float | None
    tx_bytes: float
    rx_bytes: float
    flagged_windows: int = 0
    flagged: list[FlaggedWindow]



# ------------------------------------------------------------------------------------------
# Rates


def rate_counters(counters: pa.Table, topology_nodes: pa.Table | None = None,
                  topology_links: pa.Table | None = None, *, gap_factor: float = 1.5) -> TelemetryRates:
    """Turn raw `counters` rows into per-window `link_samples` (see the module docstring)."""
    return rate_taken([counters], topology_nodes, topology_links, gap_factor=gap_factor)


def rate_taken(holder: list[pa.Table], topology_nodes: pa.Table | None = None,
               topology_links: pa.Table | None = None, *, gap_factor: float = 1.5) -> TelemetryRates:
    """`rate_counters` of the one table in `holder`, which it takes out: when the caller keeps no
    other reference, each of its columns is freed as soon as the rating has what it needs from it
    (the counters of a day of switch telemetry are as big as everything the rating builds)."""
    stats = RateStats()
    t = schema.conform("counters", holder.pop()).unify_dictionaries().combine_chunks()
    n = t.num_rows
    stats.read = n
    if n == 0:
        return TelemetryRates(schema.empty("link_samples"), stats)
    col = {c: _codes(t, c) for c in (*SERIES_KEY, "kind")}
    ts, timed = _numbers(t, "ts_ns", 0)
    value = _floats(t, "value")
    bits = _numbers(t, "bits", -1)[0].astype(np.int32)
    saturable = _bools(t, "saturable")
    saturated = _bools(t, "saturated")
    del t  # the columns above hold what is still needed of it
    kind = _is(col.pop("kind"), ("counter", "rate", "gauge"))
    metric_speed = _is(col["metric"], ("speed_bps",))[0]
    is_counter, is_rate, is_gauge = kind
    is_speed = timed & is_gauge & metric_speed
    rateable = timed & (is_counter | is_rate)
    _skip(stats, "untimed", int((~timed).sum()))
    _skip(stats, "gauge_not_rated", int((timed & is_gauge & ~metric_speed).sum()))
    _skip(stats, "unknown_kind", int((timed & ~(is_counter | is_rate | is_gauge)).sum()))
    stats.used += int(is_speed.sum())
    pid, n_pid, port_first = _dense(col["host"][0], col["device"][0], col["port"][0], where=rateable | is_speed)
    ports = [(_name(col["host"], i), _name(col["device"], i), _name(col["port"], i)) for i in port_first.tolist()]
    stats.ports = n_pid
    if not rateable.any():
        return TelemetryRates(schema.empty("link_samples"), stats)
    sid, n_sid, sid_first = _dense(pid, col["metric"][0], col["direction"][0], col["qualifier"][0], where=rateable)
    column_of_sid = _output_columns(col["metric"], col["direction"], sid_first)
    del col
    pid_of_sid = pid[sid_first]
    identity = _identify_ports(ports, topology_nodes, topology_links)
    stats.mapped_ports = sum(1 for ident in identity if ident[1] is not None)

    base = np.flatnonzero(rateable)
    del rateable
    if len(base) > 1 and not _k.is_sorted(ts, base):
        base = base[np.argsort(ts[base], kind="stable")]
    by_series = _k.counting_order(sid, n_sid, base)
    step = _k.min_step(by_series, sid, ts, n_sid)
    tol = np.full(n_pid, np.inf)
    np.fmin.at(tol, pid_of_sid, step)
    tol = np.where(np.isfinite(tol), tol * 0.25, 0.0)
    # One series per port, numbered as its port (a switch export of one counter): the same order.
    one_each = n_sid == n_pid and bool((pid_of_sid == np.arange(n_pid)).all())
    by_port = by_series if one_each else _k.counting_order(pid, n_pid, base)
    n_base = len(base)
    del base
    row, g_pid, g_t, g_prev = _k.snap(by_port, pid, ts, tol)
    del by_port

    speeds_idx = np.flatnonzero(is_speed)
    port_max_speed = np.full(n_pid, np.nan)
    if len(speeds_idx):
        np.fmax.at(port_max_speed, pid[speeds_idx], value[speeds_idx])
    link_bps = np.array([ident[2] * 1e9 if ident[2] else np.nan for ident in identity])
    port_max_speed = np.where(np.isnan(port_max_speed), link_bps, port_max_speed)
    is_bytes = np.isin(column_of_sid, [VALUE_COLUMNS.index("tx_bytes"), VALUE_COLUMNS.index("rx_bytes")])
    per_second = port_max_speed[pid_of_sid] / 8.0 / np.where(is_bytes, 1.0, MIN_FRAME_BYTES)
    with np.errstate(divide="ignore", invalid="ignore"):
        wrap_of_sid = np.where(per_second > 0, 2.0 ** 32 / per_second, np.nan)
    used = np.unique(column_of_sid[column_of_sid >= 0])
    compact = np.full(len(VALUE_COLUMNS) + 1, -1, np.int64)
    compact[used] = np.arange(len(used))
    total, present, mask, n_dup = _k.window_grid(by_series, sid, row, g_t, g_prev, value, bits, saturable,
                                                 saturated, is_rate, wrap_of_sid, compact[column_of_sid], len(used))
    del by_series, row, sid, bits, saturable, saturated, is_rate, kind, is_counter, is_gauge, timed, is_speed
    _skip(stats, "duplicate", n_dup)
    stats.used += n_base - n_dup
    speeds = (pid[speeds_idx], ts[speeds_idx], value[speeds_idx])
    del pid, ts, value
    out, flagged = _grid_table(g_pid, g_t, g_prev, total, present, mask, used, n_pid, ports, identity, speeds,
                               gap_factor)
    stats.windows = out.num_rows
    stats.flagged.update(flagged)
    return TelemetryRates(out, stats)


def _skip(stats: RateStats, reason: str, n: int) -> None:
    if n:
        stats.skipped[reason] += n


def _array(t: pa.Table, name: str) -> pa.Array:
    """One column as one array (`ChunkedArray.combine_chunks` copies even a single chunk)."""
    col = t.column(name)
    return col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()


def _codes(t: pa.Table, name: str) -> tuple[np.ndarray, list[str | None]]:
    """(dictionary index per row, -1 for null; the dictionary) of a dictionary column."""
    arr = _array(t, name)
    if not pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_encode()
    nulls = arr.indices.null_count
    if nulls == len(arr):
        return np.full(len(arr), -1, np.int32), arr.dictionary.to_pylist()
    idx = arr.indices.fill_null(-1) if nulls else arr.indices
    return idx.to_numpy(), arr.dictionary.to_pylist()


def _bools(t: pa.Table, name: str) -> np.ndarray:
    arr = _array(t, name)
    if arr.null_count:
        arr = arr.fill_null(False)
    return np.asarray(arr.to_numpy(zero_copy_only=False), bool)


def _floats(t: pa.Table, name: str) -> np.ndarray:
    """A float column with NaN for nulls (no copy when it has none)."""
    return _array(t, name).to_numpy(zero_copy_only=False)


def _numbers(t: pa.Table, name: str, fill: float) -> tuple[np.ndarray, np.ndarray]:
    """(values with nulls filled, mask of non-null rows)."""
    arr = _array(t, name)
    if arr.null_count == 0:
        return arr.to_numpy(), np.ones(len(arr), bool)
    valid = ~np.asarray(arr.is_null().to_numpy(zero_copy_only=False), bool)
    return arr.fill_null(fill).to_numpy(), valid


def _is(codes: tuple[np.ndarray, list], values: tuple[str, ...]) -> list[np.ndarray]:
    """One mask per value: rows whose dictionary value equals it."""
    idx, dictionary = codes
    out = []
    for v in values:
        lut = np.zeros(len(dictionary) + 1, bool)
        lut[[i for i, d in enumerate(dictionary) if d == v]] = True
        out.append(lut[idx])
    return out


def _name(codes: tuple[np.ndarray, list], i: int) -> str:
    idx, dictionary = codes
    return "" if idx[i] < 0 else str(dictionary[idx[i]])


#: Key spaces up to this size are numbered through a direct table (8 MiB); larger ones through a hash table.
DIRECT_SPAN = 1 << 20


def _dense(*keys: np.ndarray, where: np.ndarray) -> tuple[np.ndarray, int, np.ndarray]:
    """Dense ids [0, n) of the key tuples (up to four int arrays, -1 = null) of the rows in
    `where` (-1 elsewhere), numbered in order of first appearance, and the first row of each id."""
    keys = list(keys) + [np.full(len(keys[0]), -1, np.int32)] * (4 - len(keys))
    widths = [int(k.max(initial=-1)) + 2 for k in keys]
    span = widths[0] * widths[1] * widths[2] * widths[3]
    if span > 1 << 62:
        combined = np.zeros(len(keys[0]), np.int64)
        for k, w in zip(keys, widths, strict=True):
            combined = np.unique(combined * w + (k + 1), return_inverse=True)[1].astype(np.int64)
        keys = [combined - 1] + [np.full(len(combined), -1, np.int32)] * 3
        widths = [int(combined.max(initial=0)) + 2, 1, 1, 1]
        span = widths[0]
    rows = np.flatnonzero(where)
    if span > DIRECT_SPAN:
        ids, n, first = _k.dense_ids_hashed(keys[0], keys[1], keys[2], keys[3], widths[1], widths[2], widths[3], rows)
    else:
        ids, n, first = _k.dense_ids(keys[0], keys[1], keys[2], keys[3], widths[1], widths[2], widths[3], rows, span)
    return ids, int(n), first


def _output_columns(metric: tuple[np.ndarray, list], direction: tuple[np.ndarray, list],
                    rows: np.ndarray) -> np.ndarray:
    """Index into VALUE_COLUMNS per row of `rows` (-1 when the metric has no column)."""
    m_idx, m_dict = metric
    d_idx, d_dict = direction
    table = np.full((len(m_dict) + 1, len(d_dict) + 1), -1, np.int64)
    for mi, m in enumerate([*m_dict, None]):
        for di, d in enumerate([*d_dict, None]):
            name = OUTPUT_COLUMNS.get((m, d)) or OUTPUT_COLUMNS.get((m, None))
            if name is not None:
                table[mi, di] = VALUE_COLUMNS.index(name)
    m, d = m_idx[rows], d_idx[rows]
    return table[np.where(m < 0, len(m_dict), m), np.where(d < 0, len(d_dict), d)]


_FLAG_BITS = ("wrapped", "saturated", "reset", "wrap_ambiguous", "gap")


def _grid_table(g_pid: np.ndarray, g_t: np.ndarray, g_prev: np.ndarray, total: np.ndarray, present: np.ndarray,
                mask: np.ndarray, used: np.ndarray, n_pid: int, ports: list[tuple[str, str, str]],
                identity: list[tuple], speeds: tuple[np.ndarray, np.ndarray, np.ndarray],
                gap_factor: float) -> tuple[pa.Table, Counter[str]]:
    """The windows (grid rows after a port's first scrape) as a `link_samples` table, and the
    number of windows per flag; `total`, `present` and `mask` have one row per entry of `used`
    (indices into VALUE_COLUMNS); `speeds` are the speed samples' (port, time, bits/s)."""
    keep = np.flatnonzero(g_prev >= 0)
    med = np.full(n_pid, np.nan)
    if len(keep):
        interval = g_t[keep] - g_prev[keep]
        kept_pid = g_pid[keep]
        starts = np.flatnonzero(np.r_[True, kept_pid[1:] != kept_pid[:-1]])
        bounds = np.r_[starts, len(keep)]
        for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
            med[kept_pid[a]] = np.median(interval[a:b])
        del interval, kept_pid
    s_pid, s_ts, s_value = speeds
    s_order = np.lexsort((s_ts, s_pid))
    speed = _k.speed_asof(g_pid, g_t, s_order, s_pid, s_ts, s_value) if len(s_pid) else np.full(len(g_pid), np.nan)
    link_bps = np.array([ident[2] * 1e9 if ident[2] else np.nan for ident in identity] or [np.nan])
    speed = np.where(np.isnan(speed), link_bps[g_pid], speed)
    # Port order: by link name, then host, device, port; rows by time within a port.
    port_rank = np.empty(n_pid, np.int64)
    port_rank[sorted(range(n_pid), key=lambda p: (identity[p][0], ports[p]))] = np.arange(n_pid)
    keep = _k.counting_order(port_rank[g_pid], n_pid, keep)
    void = sum(1 << (_FLAG_BITS.index(f)) for f in VOIDING_FLAGS)
    column = {VALUE_COLUMNS[c]: j for j, c in enumerate(used.tolist())}
    p, ts_ns, interval, speed, values, tx_util, rx_util, key = _k.window_rows(
        keep, g_pid, g_t, g_prev, total, present, mask, void, used, med, gap_factor, speed,
        column.get("tx_bytes", -1), column.get("rx_bytes", -1))
    del keep
    flags, detail, flagged = _flag_lists(key)
    del key

    def per_port(strings: list[str | None]) -> pa.DictionaryArray:
        uniq = sorted({x for x in strings if x is not None})
        index = {x: i for i, x in enumerate(uniq)}
        per = np.array([index.get(x, -1) if x is not None else -1 for x in strings] or [-1], np.int32)
        idx = per[p]
        return pa.DictionaryArray.from_arrays(_with_nulls(idx, idx < 0 if (per < 0).any() else None),
                                              pa.array(uniq, pa.string()))

    n = len(p)
    none = pa.Array.from_buffers(pa.float64(), n, [pa.py_buffer(np.zeros((n + 7) // 8, np.uint8)),
                                                   pa.py_buffer(np.zeros(n))], null_count=n)

    def floats(name: str) -> pa.Array:
        return none if name not in column else _with_nulls(values[column[name]], np.isnan(values[column[name]]))

    data = {
        "link": per_port([ident[0] for ident in identity]),
        "device": per_port([d for _, d, _ in ports]),
        "port": per_port([q for _, _, q in ports]),
        "ts_ns": pa.array(ts_ns, pa.int64()),
        "interval_ns": pa.array(interval, pa.int64()),
        "tx_bytes": floats("tx_bytes"), "rx_bytes": floats("rx_bytes"),
        "tx_util": _with_nulls(tx_util, np.isnan(tx_util)) if "tx_bytes" in column else none,
        "rx_util": _with_nulls(rx_util, np.isnan(rx_util)) if "rx_bytes" in column else none,
        "flags": flags,
        "origin": pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array([ORIGIN])),
        "host": per_port([h or None for h, _, _ in ports]),
        "link_end": per_port([ident[1] for ident in identity]),
        "speed_bps": _with_nulls(speed, np.isnan(speed)),
    }
    for name in VALUE_COLUMNS[2:]:
        data[name] = floats(name)
    data["flag_detail"] = detail
    return schema.conform("link_samples", pa.table(data)), flagged


def _with_nulls(values: np.ndarray, null: np.ndarray | None) -> pa.Array:
    """An Arrow array over `values` (no copy) with `null` as its null mask."""
    arr = pa.array(values)
    if null is None or not null.any():
        return arr
    validity = pa.py_buffer(np.packbits(~null, bitorder="little"))
    return pa.Array.from_buffers(arr.type, len(values), [validity, arr.buffers()[1]], null_count=int(null.sum()))


def _flag_lists(key: np.ndarray) -> tuple[pa.Array, pa.Array, Counter[str]]:
    """`flags` and `flag_detail` list columns from the per-window flag keys (see
    `_kernels.window_rows`), and the number of windows per flag."""
    nz = np.flatnonzero(key)
    combos: list[tuple[list[str], list[str]]] = [([], [])]
    index = np.zeros(len(key), np.int64)
    flagged: Counter[str] = Counter()
    if len(nz):
        uniq, inverse = np.unique(key[nz], return_inverse=True)
        for u, n in zip(uniq.tolist(), np.bincount(inverse).tolist(), strict=True):
            detail = [f"{VALUE_COLUMNS[c]}:{_FLAG_BITS[b]}" for c in range(len(VALUE_COLUMNS)) for b in range(5)
                      if (u >> (5 * c + b)) & 1]
            names = {d.split(":", 1)[1] for d in detail}
            if (u >> 60) & 1:
                names.add("gap")
            combos.append((sorted(names), sorted(detail)))
            for name in names:
                flagged[name] += n
        index[nz] = inverse + 1
    take = pa.array(index)
    flags = pa.array([c[0] for c in combos], pa.list_(pa.string())).take(take)
    detail = pa.array([c[1] for c in combos], pa.list_(pa.string())).take(take)
    return flags, detail, flagged


# ------------------------------------------------------------------------------------------
# Link identity


def _identify_ports(ports: list[tuple[str, str, str]], nodes: pa.Table | None,
                    links: pa.Table | None) -> list[tuple[str, str | None, float | None]]:
    """Per port: (link name, link end or None, link Gb/s or None)."""
    index = _endpoint_index(nodes, links)
    out = []
    for host, device, port in ports:
        hit = _lookup(index, host or None, device, port)
        if hit is None:
            owner = f"{host}/{device}" if host and host != device else device
            out.append((f"{owner}:{port}", None, None))
        else:
            out.append(hit)
    return out


def _endpoint_index(nodes: pa.Table | None,
                    links: pa.Table | None) -> dict[tuple[str, str], tuple[str, str, float | None]]:
    """(node alias, port) -> (link, end, gbps); link-map rows win over ibnetdiscover rows."""
    from tracekit.parsers.telemetry._common import normal_port

    if links is None or links.num_rows == 0:
        return {}
    aliases: dict[str, set[str]] = {}
    if nodes is not None and nodes.num_rows:
        for n in schema.conform("topology_nodes", nodes).to_pylist():
            names = aliases.setdefault(n["node"], {n["node"]})
            if n.get("guid"):
                names.add(str(n["guid"]).lower())
            if n.get("lid") is not None:
                names.add(f"lid:{n['lid']}")
            if n.get("description"):
                names.add(n["description"].strip())
    rows = schema.conform("topology_links", links).to_pylist()
    rows.sort(key=lambda r: 0 if r.get("source_format") == "link_map" else 1)
    index: dict[tuple[str, str], tuple[str, str, float | None]] = {}
    for r in rows:
        for end in ("src", "dst"):
            node, port = r.get(end), r.get(f"{end}_port")
            if node is None or port is None:
                continue
            for alias in aliases.get(node, {node}):
                index.setdefault((alias, normal_port(port)), (r["link"], end, r.get("gbps")))
    return index


def _lookup(index: dict, host: str | None, device: str, port: str) -> tuple[str, str, float | None] | None:
    from tracekit.parsers.telemetry._common import normal_port

    port = normal_port(port)
    candidates = [device, device.lower()]
    if host:
        candidates = [f"{host}/{device}", f"{host} {device}", *candidates]
    for c in candidates:
        hit = index.get((c, port))
        if hit is not None:
            return hit
    return None


def oriented(link_samples: pa.Table) -> pa.Table:
    """Telemetry rows turned to their link's src->dst direction (tx and rx swapped where the
    measured port is the link's `dst` end), as replay reports its links."""
    df = pl.from_arrow(schema.conform("link_samples", link_samples))
    assert isinstance(df, pl.DataFrame)
    swap = pl.col("link_end").cast(pl.String) == "dst"
    pairs = (("tx_bytes", "rx_bytes"), ("tx_util", "rx_util"), ("tx_pkts", "rx_pkts"), ("tx_pause", "rx_pause"),
             ("tx_discards", "rx_discards"), ("tx_errors", "rx_errors"))
    exprs = []
    for a, b in pairs:
        exprs += [pl.when(swap).then(pl.col(b)).otherwise(pl.col(a)).alias(a),
                  pl.when(swap).then(pl.col(a)).otherwise(pl.col(b)).alias(b)]
    return schema.conform("link_samples", df.with_columns(exprs).to_arrow())


# ------------------------------------------------------------------------------------------
# Rated samples (ingest commits them)


def with_rates(link_samples: pa.Table, rates: TelemetryRates) -> pa.Table:
    """`link_samples` with its telemetry rows replaced by `rates` (replayed rows stay)."""
    old = schema.conform("link_samples", link_samples)
    if old.num_rows:
        origin = pa.compute.cast(old.column("origin"), pa.string())
        old = old.filter(pa.compute.fill_null(pa.compute.not_equal(origin, ORIGIN), True))
    return schema.conform("link_samples", pa.concat_tables([old, rates.link_samples], promote_options="permissive"))


class RatesFile(Result, frozen=True, kw_only=True):
    """results/telemetry.json: the rating's accounting, its warnings and the per-link summaries."""

    stats: RateCounts = msgspec.field(default_factory=RateCounts)
    warnings: list[str] = msgspec.field(default_factory=list)
    links: list[LinkSummary] = msgspec.field(default_factory=list)


def rates_doc(rates: TelemetryRates) -> RatesFile:
    """results/telemetry.json of a rating."""
    return RatesFile(stats=rates.stats.counts(), warnings=list(rates.warnings),
                     links=link_summaries(rates.link_samples))


def link_summaries(link_samples: pa.Table, *, origin: str = ORIGIN,
                   max_flagged: int | None = 100) -> list[LinkSummary]:
    """Per link (or unmapped port) of one origin: windows, peak and mean utilisation (the larger
    of tx and rx per window, over windows that have one), bytes, and the flagged windows with
    their reasons (the first `max_flagged` of each; `flagged_windows` counts them all). Sorted by
    peak utilisation, then bytes."""
    if link_samples.num_rows == 0:
        return []
    t = schema.conform("link_samples", link_samples).unify_dictionaries().combine_chunks()
    mine = _is(_codes(t, "origin"), (origin,))[0]
    if not mine.all():
        t = t.filter(pa.array(mine))
    if t.num_rows == 0:
        return []
    keys = {c: _codes(t, c) for c in ("link", "host", "device", "port", "link_end")}
    gid, n, first = _dense(keys["link"][0], keys["host"][0], keys["device"][0], keys["port"][0],
                           where=np.ones(t.num_rows, bool))
    windows, n_util, sum_util, peak, tx, rx, top_speed = _k.link_totals(
        gid, _floats(t, "tx_util"), _floats(t, "rx_util"), _floats(t, "tx_bytes"), _floats(t, "rx_bytes"),
        _floats(t, "speed_bps"), n)
    flag_lists = _array(t, "flags")
    flagged_rows = np.flatnonzero(np.diff(flag_lists.offsets.to_numpy()) > 0)
    flagged: list[list[FlaggedWindow]] = [[] for _ in range(n)]
    n_flagged = np.bincount(gid[flagged_rows], minlength=n)
    if len(flagged_rows):
        rows = flagged_rows[np.lexsort((flagged_rows, gid[flagged_rows]))]
        counts = np.zeros(n, np.int64)
        chosen = []
        for r in rows.tolist():
            g = gid[r]
            if max_flagged is None or counts[g] < max_flagged:
                counts[g] += 1
                chosen.append(r)
        sub = t.take(pa.array(chosen, pa.int64())).select(["ts_ns", "interval_ns", "flags", "flag_detail"]).to_pylist()
        for r, row in zip(chosen, sub, strict=True):
            detail = row["flag_detail"] or []
            notes = [f for f in row["flags"] if not any(d.endswith(":" + f) for d in detail)]
            flagged[gid[r]].append(FlaggedWindow(row["ts_ns"], row["interval_ns"], tuple(detail) + tuple(notes)))
    out = []
    for g, r in enumerate(first.tolist()):
        end = _name(keys["link_end"], r)
        out.append(LinkSummary(
            link=_name(keys["link"], r), host=_name(keys["host"], r) or None, device=_name(keys["device"], r),
            port=_name(keys["port"], r), link_end=end or None, windows=int(windows[g]),
            speed_bps=float(top_speed[g]) if np.isfinite(top_speed[g]) else None,
            peak_util=float(peak[g]) if n_util[g] else None,
            mean_util=float(sum_util[g] / n_util[g]) if n_util[g] else None,
            tx_bytes=float(tx[g]), rx_bytes=float(rx[g]), flagged=flagged[g], flagged_windows=int(n_flagged[g])))
    out.sort(key=lambda s: (-(s.peak_util if s.peak_util is not None else -1.0), -(s.tx_bytes + s.rx_bytes),
                            s.link, s.device, s.port))
    return out


def describe(run: Run | str | os.PathLike[str], *, max_flagged: int = 100) -> TelemetryInfo | None:
    """The telemetry section of `tracekit info`: per link peak/mean utilisation and flagged
    windows with their reasons, plus the rating's accounting; None when the run has no counters."""
    run = run if isinstance(run, Run) else Run(run)
    if not run.has("counters"):
        return None
    saved = run.read_json("telemetry") or {}
    summary = telemetry_summary(run)
    return TelemetryInfo(links=link_summaries(run.table("link_samples"), max_flagged=max_flagged),
                         stats=saved.get("stats"), warnings=saved.get("warnings", []),
                         counters=run.table("counters").num_rows,
                         summary=TelemetrySummaryInfo.of(summary) if summary else None)


# ------------------------------------------------------------------------------------------
# Summary


class TelemetrySummary(Result):
    """What a run's telemetry holds, every counter sample accounted for: rated (`used`) or not
    (`skipped` by reason, untimed ones also by source format), the ports and windows the rating
    gave, and the topology the sources described (ibnetdiscover, UFM)."""

    counters: int
    by_format: dict[str, int]
    used: int
    skipped: dict[str, int]
    untimed_by_format: dict[str, int]
    ports: int
    mapped_ports: int
    windows: int
    flagged: int
    topology_nodes: int
    topology_links: int

    def accounting(self) -> str:
        """ "51 counter samples: 30 used on 6 port(s) (0 on topology links), 21 left out: untimed 21 (no
        timestamp in perfquery 21)"; the parts add up to the total (any gap is named "unaccounted")."""
        text = (f"{self.counters:,} counter sample{'s' if self.counters != 1 else ''}: {self.used:,} used on "
                f"{self.ports:,} port(s) ({self.mapped_ports:,} on topology links)")
        missing = self.counters - self.used - sum(self.skipped.values())
        parts = []
        for reason, n in sorted(self.skipped.items()):
            why = f"{reason} {n:,}"
            if reason == "untimed" and self.untimed_by_format:
                why += " (no timestamp in " + ", ".join(f"{f} {k:,}" for f, k in sorted(
                    self.untimed_by_format.items())) + ")"
            parts.append(why)
        if missing:
            parts.append(f"unaccounted {missing:,}")
        if parts:
            text += f", {self.counters - self.used:,} left out: " + "; ".join(parts)
        return text

    def headline(self) -> str:
        """The Summary sentence of a run whose telemetry is what it holds."""
        fabric = (f"; the topology sources describe {self.topology_nodes:,} nodes and {self.topology_links:,} links"
                  if self.topology_links or self.topology_nodes else "")
        windows = (f"; {self.windows:,} rate window(s), {self.flagged:,} flagged" if self.windows else
                   "; no rate window (a rate needs two timed samples of one counter on a port)")
        return f"Telemetry: {self.accounting()}{windows}{fabric}."

    def finding(self) -> Finding:
        """The headline as a `telemetry` finding (the report's Summary lists it)."""
        return Finding(kind="telemetry", text=self.headline(), value=float(self.counters),
                       data={"counters": self.counters, "used": self.used, "windows": self.windows})


class TelemetrySummaryInfo(TelemetrySummary):
    """A `TelemetrySummary` with its accounting sentence, as `info` shows it."""

    accounting_text: str = msgspec.field(name="accounting")

    @classmethod
    def of(cls, summary: TelemetrySummary) -> TelemetrySummaryInfo:
        fields = {f: getattr(summary, f) for f in TelemetrySummary.__struct_fields__}
        return cls(**fields, accounting_text=summary.accounting())


class TelemetryInfo(Result):
    """The telemetry section of `tracekit info` (`describe`)."""

    links: list[LinkSummary]
    stats: dict[str, Any] | None
    warnings: list[str]
    counters: int
    summary: TelemetrySummaryInfo | None


def telemetry_summary(run: Run | str | os.PathLike[str]) -> TelemetrySummary | None:
    """The run's `TelemetrySummary` (the stored rating's accounting), or None without counters or topology."""
    run = run if isinstance(run, Run) else Run(run)
    if not run.has("counters") and not run.has("topology_links"):
        return None
    counters = run.table("counters")
    stats = (run.read_json("telemetry") or {}).get("stats") or {}
    fmt = counters.column("source_format").cast(pa.string()).to_pylist() if counters.num_rows else []
    ts_null = counters.column("ts_ns").is_null().to_pylist() if counters.num_rows else []
    untimed = Counter(f or "unknown" for f, null in zip(fmt, ts_null, strict=True) if null)
    return TelemetrySummary(
        counters=counters.num_rows, by_format=dict(sorted(Counter(f or "unknown" for f in fmt).items())),
        used=int(stats.get("used", 0)), skipped={k: int(v) for k, v in (stats.get("skipped") or {}).items()},
        untimed_by_format=dict(sorted(untimed.items())), ports=int(stats.get("ports", 0)),
        mapped_ports=int(stats.get("mapped_ports", 0)), windows=int(stats.get("windows", 0)),
        flagged=sum(int(v) for v in (stats.get("flagged") or {}).values()),
        topology_nodes=run.table("topology_nodes").num_rows, topology_links=run.table("topology_links").num_rows)
