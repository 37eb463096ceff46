"""Shape run tables and analysis/replay results into plain column dicts for the figures.

Nothing here imports Bokeh: every function takes Arrow tables or JSON-like results and returns
numpy arrays, lists and dicts, so it is unit-tested without a browser. Times on the timeline are
milliseconds since the start of the run on the aligned clock (own ``ts_ns`` + the rank's
``clock_offset_ns``).

Intervals shorter than one pixel are merged per lane into "busy" bars that keep their count and
busy time; a cap on glyphs per figure coarsens the merge further when needed, and the number of
intervals merged is reported (as pyinstrument reports resampling above 100k samples).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from tracekit import schema

# Okabe-Ito: distinguishable with every common form of colour-blindness.
DIM_ORDER: tuple[str, ...] = ("DP", "PP", "EP", "TP", "CP", "OTHER")
DIM_COLORS: dict[str, str] = {
    "DP": "#0072B2",  # blue
    "PP": "#E69F00",  # orange
    "EP": "#009E73",  # bluish green
    "TP": "#D55E00",  # vermillion
    "CP": "#56B4E9",  # sky blue
    "OTHER": "#CC79A7",  # reddish purple
}
DIM_LABELS: dict[str, str] = {"DP": "DP", "PP": "PP", "EP": "EP", "TP": "TP", "CP": "CP", "OTHER": "other"}
COMPUTE_COLOR = "#9A9A9A"
COMPUTE_KINDS = ("compute", "memcpy", "memset")
MERGED_NAME = "(merged: intervals shorter than a pixel)"
MAX_NAME_CHARS = 160

# nccl-tests bus-bandwidth factors, as functions of the number of ranks.
_BUSBW_FACTOR = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
}

Tables = Mapping[str, pa.Table]


def norm_dim(dim: str | None) -> str:
    """Map a collective's dim onto the drawn categories (WORLD, unknown and null become OTHER)."""
    d = (dim or "").upper()
    return d if d in DIM_COLORS else "OTHER"


def busbw_factor(op: str | None, nranks: int | None) -> float:
    """The nccl-tests factor turning algbw into busbw (1 for p2p, broadcast, reduce)."""
    n = int(nranks or 0)
    fn = _BUSBW_FACTOR.get(op or "")
    if fn is None or n < 2:
        return 1.0
    return float(fn(n))


def fmt_ns(ns: float | None) -> str:
    """A duration in the unit a person reads best: ns, µs, ms or s."""
    if ns is None or not np.isfinite(ns):
        return "n/a"
    a = abs(ns)
    if a >= 1e9:
        return f"{ns / 1e9:.2f} s"
    if a >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    if a >= 1e3:
        return f"{ns / 1e3:.1f} µs"
    return f"{ns:.0f} ns"


def fmt_bytes(n: float | None) -> str:
    """Bytes in B, KB, MB or GB (decimal units, as bandwidths are quoted)."""
    if n is None or not np.isfinite(n):
        return "n/a"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


# ---------------------------------------------------------------------------------------------
# Merging intervals below pixel size


@dataclass
class Merge:
    """Result of `merge_short`: rows kept as they are, plus the busy bars that replaced the rest."""

    keep: np.ndarray  # indices into the input of intervals drawn individually
    lane: np.ndarray  # busy bars: lane id
    start: np.ndarray
    end: np.ndarray
    count: np.ndarray  # intervals merged into each bar
    busy_ns: np.ndarray  # summed duration of the merged intervals
    first: np.ndarray  # index (into the input) of the first interval of each bar

    @property
    def merged(self) -> int:
        """How many input intervals are hidden inside busy bars."""
        return int(self.count.sum())

    @property
    def glyphs(self) -> int:
        return int(self.keep.size + self.count.size)


def merge_short(lane: np.ndarray, start: np.ndarray, end: np.ndarray, *, min_ns: float,
                max_bar_px: int = 8) -> Merge:
    """Merge, per lane, runs of intervals shorter than `min_ns` (one pixel) into busy bars.

    Consecutive short intervals in a lane join one bar while the gap between them is under a
    pixel; a bar never spans more than `max_bar_px` pixels, so a long busy stretch still shows
    how its density varies. An interval at least a pixel long is always kept as it is, as is a
    short one with no short neighbour.
    """
    lane = np.asarray(lane, dtype=np.int64)
    start = np.asarray(start, dtype=np.int64)
    end = np.asarray(end, dtype=np.int64)
    n = lane.size
    empty_i = np.zeros(0, dtype=np.int64)
    if n == 0 or min_ns <= 0:
        return Merge(np.arange(n), empty_i, empty_i, empty_i, empty_i, empty_i, empty_i)
    order = np.lexsort((end, start, lane))
    ln, s, e = lane[order], start[order], end[order]
    short = (e - s) < min_ns
    # running max of ends within a lane: offset every lane far apart so one accumulate works
    span = int(max(e.max() - s.min(), 1)) + 1
    shift = (ln - ln.min()) * (2 * span)
    runmax = np.maximum.accumulate(e - s.min() + shift) - shift + s.min()
    bin_id = np.floor((s - s.min()) / (max_bar_px * min_ns)).astype(np.int64)
    new = np.ones(n, dtype=bool)
    if n > 1:
        gap = s[1:] - runmax[:-1]
        new[1:] = ~(short[1:] & short[:-1] & (ln[1:] == ln[:-1]) & (gap < min_ns)
                    & (bin_id[1:] == bin_id[:-1]))
    cid = np.cumsum(new) - 1
    bounds = np.flatnonzero(new)
    sizes = np.diff(np.append(bounds, n))
    multi = sizes >= 2
    in_multi = multi[cid]
    keep = np.sort(order[~in_multi])
    b = bounds[multi]
    if b.size == 0:
        return Merge(keep, empty_i, empty_i, empty_i, empty_i, empty_i, empty_i)
    m_start = np.minimum.reduceat(s, bounds)[multi]
    m_end = np.maximum.reduceat(e, bounds)[multi]
    busy = np.add.reduceat(e - s, bounds)[multi]
    return Merge(keep, ln[b], m_start, m_end, sizes[multi].astype(np.int64), busy, order[b])


# ---------------------------------------------------------------------------------------------
# Tables -> frames


def tables_of(run_or_tables: Any, names: Sequence[str]) -> dict[str, pa.Table]:
    """Read the named tables from a Run or a mapping (missing ones come back empty)."""
    out: dict[str, pa.Table] = {}
    for name in names:
        if isinstance(run_or_tables, Mapping):
            t = run_or_tables.get(name)
            out[name] = schema.empty(name) if t is None else schema.conform(name, t)
        else:
            out[name] = run_or_tables.table(name)
    return out


def _frame(table: pa.Table, columns: Sequence[str]) -> pl.DataFrame:
    """A polars frame of the given columns, dictionary columns decoded to plain strings."""
    cols = {}
    for c in columns:
        col = table.column(c)
        if pa.types.is_dictionary(col.type):
            col = col.cast(col.type.value_type)
        cols[c] = col
    return pl.from_arrow(pa.table(cols)) if cols else pl.DataFrame()


def rank_layout(ranks: pa.Table, groups: pa.Table, collectives: pa.Table,
                extra_ranks: Sequence[int] = ()) -> dict[str, Any]:
    """Row order for per-rank figures: grouped by PP stage (when known), then host, then rank.

    The PP stage of a rank is its position, in rank order, within the pipeline it belongs to
    (ranks joined by PP groups or by PP send/recv pairs).
    """
    r = _frame(ranks, ["rank", "host", "clock_offset_ns"])
    host = {int(k): (h or "") for k, h in zip(r["rank"].to_list(), r["host"].to_list(), strict=False)}
    offset = {int(k): int(o or 0) for k, o in zip(r["rank"].to_list(), r["clock_offset_ns"].to_list(), strict=False)}
    all_ranks = sorted(set(host) | {int(x) for x in extra_ranks})
    parent: dict[int, int] = {}

    def find(x: int) -> int:
        while parent.get(x, x) != x:
            x = parent[x]
        return x

    def union(a: int, b: int) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)

    pp_ranks: set[int] = set()
    g = _frame(groups, ["group", "ranks", "dims"])
    for members, dims in zip(g["ranks"].to_list(), g["dims"].to_list(), strict=False):
        if members and dims and "PP" in dims:
            for m in members[1:]:
                union(int(members[0]), int(m))
            pp_ranks.update(int(m) for m in members)
    c = _frame(collectives, ["rank", "peer", "dim"]).filter(
        (pl.col("dim") == "PP") & pl.col("peer").is_not_null())
    for a, b in zip(c["rank"].to_list(), c["peer"].to_list(), strict=False):
        union(int(a), int(b))
        pp_ranks.update((int(a), int(b)))
    stage: dict[int, int | None] = {}
    comps: dict[int, list[int]] = {}
    for x in sorted(pp_ranks):
        comps.setdefault(find(x), []).append(x)
    for members in comps.values():
        for i, x in enumerate(sorted(members)):
            stage[x] = i
    has_stage = bool(stage)
    order = sorted(all_ranks, key=lambda x: (stage.get(x, 1 << 30) if has_stage else 0, host.get(x, ""), x))
    rows = {x: i for i, x in enumerate(order)}
    bands: list[dict[str, Any]] = []
    for i, x in enumerate(order):
        parts = []
        if has_stage:
            parts.append(f"stage {stage[x]}" if x in stage else "no stage")
        parts.append(host.get(x) or "unknown host")
        label = " · ".join(parts)
        if bands and bands[-1]["label"] == label:
            bands[-1]["y1"] = i
        else:
            bands.append({"label": label, "y0": i, "y1": i})
    return {"order": order, "row": rows, "host": host, "stage": stage, "offset": offset, "bands": bands,
            "labels": {i: f"r{x}" for i, x in enumerate(order)}}


def comm_intervals(events: pl.DataFrame, collectives: pl.DataFrame) -> pl.DataFrame:
    """One row per drawn communication interval, on the rank's own clock.

    Comm kernels in `events` are joined to their collective row by ``coll_id``; collectives that
    carry their own times but no kernel event (Flight Recorder, NCCL logs) are added from
    ``collectives``. Columns: rank, ts_ns, dur_ns, name, op, group, seq, instance, dim, bytes,
    nranks.
    """
    coll = collectives.select(
        "coll_id", "rank", "group", "seq", "op", "instance", "dim", "nranks",
        pl.max_horizontal(pl.col("in_bytes").fill_null(0), pl.col("out_bytes").fill_null(0)).alias("bytes"),
        pl.col("ts_ns").alias("c_ts"), pl.col("dur_ns").alias("c_dur"), pl.col("name").alias("c_name"),
    )
    ev = events.filter(pl.col("kind") == "comm").select("rank", "ts_ns", "dur_ns", "name", "coll_id")
    joined = ev.join(coll.drop("rank"), on="coll_id", how="left").select(
        "rank", "ts_ns", "dur_ns", "name", "op", "group", "seq", "instance", "dim", "bytes", "nranks")
    used = ev["coll_id"].drop_nulls().unique()
    extra = coll.filter(pl.col("c_ts").is_not_null() & pl.col("c_dur").is_not_null()
                        & ~pl.col("coll_id").is_in(used.implode())).select(
        "rank", pl.col("c_ts").alias("ts_ns"), pl.col("c_dur").alias("dur_ns"),
        pl.coalesce(pl.col("c_name"), pl.col("op")).alias("name"),
        "op", "group", "seq", "instance", "dim", "bytes", "nranks")
    out = pl.concat([joined, extra], how="vertical_relaxed")
    return out.with_columns(pl.col("op").fill_null("other"), pl.col("dim").fill_null("OTHER"))


COMM_NAME_RE = r"^(c10d::|gloo:|nccl:|record_param_comms)"


def compute_intervals(events: pl.DataFrame, comm: pl.DataFrame) -> pl.DataFrame:
    """Compute intervals (rank, ts_ns, dur_ns, name): a rank's GPU kernels (kinds compute, memcpy,
    memset) when it has any; otherwise its CPU ops (a CPU-only gloo run), leaving out
    communication ops and any op that encloses one of the rank's communication intervals (an
    autograd wrapper waiting in an all-to-all is not compute)."""
    cols = ["rank", "ts_ns", "dur_ns", "name"]
    gpu = events.filter(pl.col("kind").is_in(list(COMPUTE_KINDS))).select(cols)
    gpu_ranks = gpu["rank"].unique().implode()
    ops = events.filter((pl.col("kind") == "cpu_op") & ~pl.col("rank").is_in(gpu_ranks)
                        & pl.col("coll_id").is_null() & (pl.col("dur_ns") > 0)
                        & ~pl.col("name").fill_null("").str.contains(COMM_NAME_RE)).select(cols)
    if ops.height and comm.height:
        starts = comm.select(pl.col("rank").cast(pl.Int32), pl.col("ts_ns").alias("c_ts")).sort("c_ts")
        ops = ops.with_columns(pl.col("rank").cast(pl.Int32)).sort("ts_ns").join_asof(
            starts, left_on="ts_ns", right_on="c_ts", by="rank", strategy="forward", check_sortedness=False)
        ops = ops.filter(pl.col("c_ts").is_null() | (pl.col("c_ts") >= pl.col("ts_ns") + pl.col("dur_ns")))
        ops = ops.select(cols)
    return pl.concat([gpu.with_columns(pl.col("rank").cast(pl.Int32)), ops.with_columns(pl.col("rank").cast(pl.Int32))])


def add_waits(comm: pl.DataFrame) -> pl.DataFrame:
    """Add ``wait_ns``: per instance, the latest participant's start minus this rank's start
    (aligned clock, column ``t``), clipped to the interval. Instances are ``instance`` or, when
    null, (group, seq)."""
    key = pl.when(pl.col("instance").is_not_null()).then(pl.format("i{}", pl.col("instance"))) \
        .otherwise(pl.format("g{}/{}", pl.col("group"), pl.col("seq")))
    comm = comm.with_columns(key.alias("_key"))
    comm = comm.with_columns(
        pl.col("t").max().over("_key").alias("_last"),
        pl.len().over("_key").alias("_n"),
    )
    wait = pl.when((pl.col("_n") > 1) & pl.col("group").is_not_null()) \
        .then((pl.col("_last") - pl.col("t")).clip(0, None)).otherwise(0)
    return comm.with_columns(pl.min_horizontal(wait, pl.col("dur_ns")).alias("wait_ns")).drop("_last", "_n")


# ---------------------------------------------------------------------------------------------
# Timeline


@dataclass
class TimelineData:
    """Everything the timeline draws. ``levels[k][layer]`` is a column dict; level 0 is the full
    view, each next level is `zoom` times finer and is used once the view is that narrow."""

    t0_ns: int
    span_ms: float
    rows: dict[str, Any]
    names: list[str]
    layers: list[str]
    levels: list[dict[str, dict[str, Any]]]
    level_ms_per_px: list[float]
    steps: list[dict[str, Any]]
    overview: dict[str, Any]
    raw_intervals: int
    merged_full_view: int
    merged_finest: int
    glyph_cap: int
    width_px: int
    notes: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return self.raw_intervals == 0


def _str_ids(values: pl.Series, names: dict[str, int]) -> np.ndarray:
    """Ids of (truncated) strings in `names`, which grows with the strings not seen yet."""
    v = values.cast(pl.String).fill_null("").str.slice(0, MAX_NAME_CHARS)
    for x in v.unique(maintain_order=True).to_list():
        names.setdefault(x, len(names))
    return v.replace_strict(names, return_dtype=pl.Int32).to_numpy()


def busbw_factors(ops: pl.Series, nranks: pl.Series) -> np.ndarray:
    """`busbw_factor` for whole columns."""
    n = nranks.cast(pl.Float64).fill_null(0).to_numpy()
    op = ops.cast(pl.String).fill_null("").to_numpy()
    safe = np.maximum(n, 2.0)
    f = np.where(np.isin(op, ["all_gather", "reduce_scatter", "all_to_all"]), (safe - 1) / safe, 1.0)
    f = np.where(op == "all_reduce", 2 * (safe - 1) / safe, f)
    return np.where(n >= 2, f, 1.0)


def timeline_data(tables: Tables, *, width_px: int = 1400, max_glyphs: int = 60_000,
                  max_total: int = 250_000, zoom: int = 8, max_levels: int = 4,
                  overview_bins: int = 800) -> TimelineData:
    """Build the timeline's layers (compute, comm per dim, stall) at several levels of detail.

    `max_glyphs` caps the bars one view draws; `max_total` caps the bars shipped in the file over
    all levels. Either cap coarsens the merge threshold of a level (doubling it) until it holds.
    """
    t = tables_of(tables, ["ranks", "groups", "events", "collectives"])
    ev_cols = ["rank", "kind", "name", "ts_ns", "dur_ns", "step", "coll_id"]
    events = _frame(t["events"], ev_cols).filter(pl.col("ts_ns").is_not_null() & pl.col("dur_ns").is_not_null())
    colls = _frame(t["collectives"], ["coll_id", "rank", "group", "seq", "op", "instance", "dim", "nranks",
                                      "in_bytes", "out_bytes", "ts_ns", "dur_ns", "name"])
    comm = comm_intervals(events, colls)
    compute = compute_intervals(events, comm)
    seen_ranks = set(comm["rank"].unique().to_list()) | set(compute["rank"].unique().to_list())
    layout = rank_layout(t["ranks"], t["groups"], t["collectives"], extra_ranks=sorted(seen_ranks))
    off = pl.DataFrame({"rank": list(layout["offset"]), "_off": list(layout["offset"].values())},
                       schema={"rank": pl.Int32, "_off": pl.Int64})

    def aligned(df: pl.DataFrame) -> pl.DataFrame:
        return df.with_columns(pl.col("rank").cast(pl.Int32)).join(off, on="rank", how="left").with_columns(
            (pl.col("ts_ns") + pl.col("_off").fill_null(0)).alias("t")).drop("_off")

    comm = add_waits(aligned(comm))
    compute = aligned(compute)
    starts = [df["t"].min() for df in (comm, compute) if df.height]
    ends = [(df["t"] + df["dur_ns"]).max() for df in (comm, compute) if df.height]
    t0 = int(min(starts)) if starts else 0
    span_ns = max(int(max(ends)) - t0, 1) if ends else 1
    names: dict[str, int] = {MERGED_NAME: 0}

    # raw rows per layer: lane id, start, end (ns since t0), y, and attributes
    raw: dict[str, dict[str, np.ndarray]] = {}
    row_of = layout["row"]

    def rows_for(ranks: pl.Series) -> np.ndarray:
        return ranks.cast(pl.Int64).replace_strict(row_of, return_dtype=pl.Int64).to_numpy()

    if compute.height:
        s = (compute["t"] - t0).to_numpy().astype(np.int64)
        raw["compute"] = {"row": rows_for(compute["rank"]), "s": s,
                          "e": s + compute["dur_ns"].to_numpy().astype(np.int64),
                          "name_id": _str_ids(compute["name"], names)}
    upper = pl.col("dim").cast(pl.String).str.to_uppercase()
    comm = comm.with_columns(pl.when(upper.is_in(list(DIM_COLORS))).then(upper).otherwise(pl.lit("OTHER"))
                             .alias("dim"))
    for dim in DIM_ORDER:
        part = comm.filter(pl.col("dim") == dim)
        if not part.height:
            continue
        s = (part["t"] - t0).to_numpy().astype(np.int64)
        dur = part["dur_ns"].to_numpy().astype(np.int64)
        wait = part["wait_ns"].to_numpy().astype(np.int64)
        nbytes = part["bytes"].fill_null(0).to_numpy().astype(np.float64)
        factor = busbw_factors(part["op"], part["nranks"])
        xfer = np.maximum(dur - wait, 1)
        busbw = np.where(nbytes > 0, nbytes * factor / xfer, -1.0)  # bytes/ns == GB/s; -1: unknown
        raw[f"comm:{dim}"] = {
            "row": rows_for(part["rank"]), "s": s, "e": s + dur,
            "name_id": _str_ids(part["name"], names),
            "op": part["op"].cast(pl.String).fill_null("").to_numpy().astype(object),
            "group": part["group"].cast(pl.String).fill_null("").str.slice(0, MAX_NAME_CHARS).to_numpy()
            .astype(object),
            "seq": part["seq"].fill_null(-1).to_numpy().astype(np.int64),
            "bytes": nbytes, "busbw": busbw.astype(np.float32), "wait_ns": wait.astype(np.float64),
        }
        has_wait = wait > 0
        if has_wait.any():
            st = raw.setdefault("stall", {"row": np.zeros(0, np.int64), "s": np.zeros(0, np.int64),
                                          "e": np.zeros(0, np.int64)})
            st["row"] = np.concatenate([st["row"], raw[f"comm:{dim}"]["row"][has_wait]])
            st["s"] = np.concatenate([st["s"], s[has_wait]])
            st["e"] = np.concatenate([st["e"], s[has_wait] + wait[has_wait]])
    layers = [k for k in ["compute", *(f"comm:{d}" for d in DIM_ORDER), "stall"] if k in raw]
    raw_total = sum(int(v["s"].size) for v in raw.values())  # bars, stall overlays included
    intervals = sum(int(v["s"].size) for k, v in raw.items() if k != "stall")

    # levels of detail: level k is drawn once the view is narrower than span / zoom**k
    base_ns = span_ns / max(width_px, 1)
    levels: list[dict[str, dict[str, Any]]] = []
    level_px: list[float] = []
    merged_full = merged_finest = 0
    shipped = 0
    notes: list[str] = []
    for k in range(max_levels):
        want = min_ns = base_ns / zoom**k
        # once everything fits in one view, the next level is simply every interval
        exact = k > 0 and raw_total <= max_glyphs and shipped + raw_total <= max_total
        for _ in range(64):
            level, merged, glyphs = _level(raw, layers, min_ns, merge=not exact)
            per_view = _max_per_window(level, span_ns / zoom**k / 1e6)
            if per_view <= max_glyphs and (k == 0 or shipped + glyphs <= max_total):
                break
            min_ns *= 2
        if k and min_ns >= level_px[-1] * 1e6:
            break  # the file budget leaves nothing finer than the previous level
        levels.append(level)
        level_px.append(min_ns / 1e6)
        shipped += glyphs
        if k == 0:
            merged_full = merged
        merged_finest = merged
        if merged == 0 or min_ns > want:
            break
    if merged_finest:
        notes.append(f"{merged_finest:,} of {intervals:,} intervals are shorter than "
                     f"{fmt_ns(level_px[-1] * 1e6)} and stay merged into busy bars even at the finest "
                     f"zoom level (caps: {max_glyphs:,} bars per view, {max_total:,} in the file).")
    if merged_full:
        notes.append(f"At full view, {merged_full:,} intervals shorter than a pixel are merged into busy "
                     f"bars (their shading shows how busy); zoom in for detail.")

    steps = _step_marks(events, layout["offset"], t0)
    overview = _overview(raw, layers, span_ns, len(layout["order"]), overview_bins)
    name_list = [""] * len(names)
    for v, i in names.items():
        name_list[i] = v
    return TimelineData(t0_ns=t0, span_ms=span_ns / 1e6, rows=layout, names=name_list, layers=layers,
                        levels=levels, level_ms_per_px=level_px, steps=steps, overview=overview,
                        raw_intervals=intervals, merged_full_view=merged_full, merged_finest=merged_finest,
                        glyph_cap=max_glyphs, width_px=width_px, notes=notes)


LANE_OFFSET = {"compute": -0.2, "comm": 0.2}
LANE_HEIGHT = 0.36


def _level(raw: dict[str, dict[str, np.ndarray]], layers: list[str], min_ns: float, *, merge: bool = True
           ) -> tuple[dict[str, dict[str, Any]], int, int]:
    """Merge every layer at one resolution (bars are drawn at least `min_ns` wide); return
    (columns per layer, merged count, glyphs)."""
    out: dict[str, dict[str, Any]] = {}
    merged = glyphs = 0
    for layer in layers:
        cols = raw[layer]
        m = merge_short(cols["row"], cols["s"], cols["e"], min_ns=min_ns if merge else 0)
        if layer != "stall":  # stall bars overlay comm intervals already counted
            merged += m.merged
        glyphs += m.glyphs
        keep = m.keep
        row = np.concatenate([cols["row"][keep], m.lane])
        s = np.concatenate([cols["s"][keep], m.start]).astype(np.float64)
        e = np.concatenate([cols["e"][keep], m.end]).astype(np.float64)
        dur = e - s
        count = np.concatenate([np.ones(keep.size, np.int32), m.count.astype(np.int32)])
        busy_ns = np.concatenate([(cols["e"] - cols["s"])[keep], m.busy_ns]).astype(np.float64)
        busy = np.clip(busy_ns / np.maximum(dur, 1), 0, 1).astype(np.float32)
        lane = "compute" if layer == "compute" else "comm"
        d: dict[str, Any] = {
            "x0": s / 1e6, "x1": np.maximum(e, s + min_ns) / 1e6,
            "y": (row + LANE_OFFSET[lane]).astype(np.float32),
            "dur_ns": np.where(count > 1, busy_ns, dur).astype(np.float32),
            "count": count, "busy": busy,
            "alpha": np.where(count > 1, 0.3 + 0.6 * busy, 0.9).astype(np.float32),
        }
        if "name_id" in cols:
            d["name_id"] = np.concatenate([cols["name_id"][keep], np.zeros(m.count.size, np.int32)])
        if layer.startswith("comm:"):
            nm = m.count.size
            d["op"] = [*cols["op"][keep].tolist(), *(["(merged)"] * nm)]
            d["group"] = [*cols["group"][keep].tolist(), *([""] * nm)]
            d["seq"] = np.concatenate([cols["seq"][keep], np.full(nm, -1, np.int64)])
            # -1 marks "not applicable" (Bokeh prints NaN before any formatter sees it)
            d["bytes"] = np.concatenate([cols["bytes"][keep], np.full(nm, -1.0)])
            d["busbw"] = np.concatenate([cols["busbw"][keep], np.full(nm, -1.0, np.float32)])
            d["wait_ns"] = np.concatenate([cols["wait_ns"][keep], np.full(nm, -1.0)])
        out[layer] = d
    return out, merged, glyphs


def _max_per_window(level: Mapping[str, Mapping[str, Any]], window_ms: float) -> int:
    """The most bars any window `window_ms` wide can show (checked on a grid of half windows)."""
    x = np.concatenate([np.asarray(cols["x0"]) for cols in level.values()]) if level else np.zeros(0)
    if x.size == 0:
        return 0
    half = max(window_ms / 2, 1e-12)
    counts = np.bincount(((x - x.min()) / half).astype(np.int64))
    if counts.size < 3:
        return int(counts.sum())
    c = np.cumsum(np.concatenate([[0], counts]))
    return int((c[3:] - c[:-3]).max())


def _step_marks(events: pl.DataFrame, offset: Mapping[int, int], t0: int) -> list[dict[str, Any]]:
    """Step boundaries: the earliest aligned start of each step across ranks."""
    ev = events.filter(pl.col("step").is_not_null())
    if not ev.height:
        return []
    off = pl.DataFrame({"rank": list(offset), "_off": list(offset.values())},
                       schema={"rank": pl.Int32, "_off": pl.Int64})
    ev = ev.with_columns(pl.col("rank").cast(pl.Int32)).join(off, on="rank", how="left")
    g = ev.group_by("step").agg(
        (pl.col("ts_ns") + pl.col("_off").fill_null(0)).min().alias("start"),
        (pl.col("ts_ns") + pl.col("dur_ns") + pl.col("_off").fill_null(0)).max().alias("end"),
    ).sort("step")
    return [{"step": int(s), "x0": (a - t0) / 1e6, "x1": (b - t0) / 1e6}
            for s, a, b in zip(g["step"].to_list(), g["start"].to_list(), g["end"].to_list(), strict=False)]


def coverage(s: np.ndarray, e: np.ndarray, span_ns: float, bins: int) -> np.ndarray:
    """Sum, per time bin, of the fraction of the bin each interval covers."""
    out = np.zeros(bins + 1, dtype=np.float64)
    if s.size == 0:
        return out[:bins]
    w = span_ns / bins
    a = np.clip(s / w, 0, bins - 1e-9)
    b = np.clip(e / w, 0, bins - 1e-9)
    ia, ib = a.astype(np.int64), b.astype(np.int64)
    same = ia == ib
    np.add.at(out, ia[same], (b - a)[same])
    d = ~same
    np.add.at(out, ia[d], (ia[d] + 1) - a[d])
    np.add.at(out, ib[d], b[d] - ib[d])
    full = np.zeros(bins + 2, dtype=np.float64)
    np.add.at(full, ia[d] + 1, 1.0)
    np.add.at(full, ib[d], -1.0)
    out[:bins] += np.cumsum(full)[:bins]
    return out[:bins]


def _overview(raw: dict[str, dict[str, np.ndarray]], layers: list[str], span_ns: float, nrows: int,
              bins: int) -> dict[str, Any]:
    """Ranks busy per time bin: compute, and communication per dim (for the range selector)."""
    x = (np.arange(bins) + 0.5) * span_ns / bins / 1e6
    out: dict[str, Any] = {"x": x, "series": {}}
    for layer in layers:
        cols = raw[layer]
        out["series"][layer] = coverage(cols["s"], cols["e"], span_ns, bins).astype(np.float32)
    out["nrows"] = nrows
    return out


def level_for(level_ms_per_px: Sequence[float], visible_ms: float, width_px: int) -> int:
    """The level shown for a view `visible_ms` wide: the coarsest one whose merge threshold is at
    most two of the view's pixels (the report's JS callback mirrors this)."""
    want = 2.0 * visible_ms / max(width_px, 1)
    for i, px in enumerate(level_ms_per_px):
        if px <= want:
            return i
    return max(len(level_ms_per_px) - 1, 0)


# ---------------------------------------------------------------------------------------------
# Overlap, EP, links, replay, hang


def overlap_data(analysis: Mapping[str, Any] | None, rank_order: Sequence[int] | None = None
                 ) -> dict[str, Any] | None:
    """Hidden vs exposed communication per rank and dim, in ms per step (mean over steps)."""
    rows = (analysis or {}).get("per_rank_step") or []
    if not rows:
        return None
    acc: dict[int, dict[str, list[float]]] = {}
    steps: dict[int, set] = {}
    compute: dict[int, float] = {}
    for r in rows:
        rank = int(r["rank"])
        steps.setdefault(rank, set()).add(r.get("step"))
        compute[rank] = compute.get(rank, 0.0) + float(r.get("compute_ns") or 0)
        comm = r.get("comm_ns") or {}
        exposed = r.get("exposed_ns") or {}
        for dim, c in comm.items():
            d = norm_dim(dim)
            ex = float(exposed.get(dim) or 0)
            slot = acc.setdefault(rank, {}).setdefault(d, [0.0, 0.0])
            slot[0] += max(float(c or 0) - ex, 0.0)
            slot[1] += ex
    ranks = [r for r in (rank_order or sorted(acc)) if r in acc or r in compute]
    if not ranks:
        return None
    dims = [d for d in DIM_ORDER if any(d in acc.get(r, {}) for r in ranks)]
    cols: dict[str, Any] = {"rank": [f"r{r}" for r in ranks]}
    for d in dims:
        for j, part in enumerate(("hidden", "exposed")):
            cols[f"{d}_{part}"] = np.array(
                [acc.get(r, {}).get(d, [0.0, 0.0])[j] / 1e6 / max(len(steps.get(r, ())), 1) for r in ranks])
    cols["compute"] = np.array([compute.get(r, 0.0) / 1e6 / max(len(steps.get(r, ())), 1) for r in ranks])
    totals = {d: (float(np.sum(cols[f"{d}_hidden"])), float(np.sum(cols[f"{d}_exposed"]))) for d in dims}
    return {"ranks": ranks, "dims": dims, "columns": cols, "totals_ms": totals}


def ep_data(tables: Tables, *, max_ranks: int = 256) -> dict[str, Any] | None:
    """The EP traffic matrix (bytes src -> dst, summed over all-to-all calls) and per-rank load."""
    t = tables_of(tables, ["collectives", "groups"])
    c = _frame(t["collectives"], ["rank", "group", "op", "dim", "in_bytes", "in_splits", "nranks"]).filter(
        (pl.col("op") == "all_to_all") & (pl.col("dim").is_null() | (pl.col("dim") == "EP")))
    if not c.height:
        return None
    g = _frame(t["groups"], ["group", "ranks"])
    members = {str(k): [int(x) for x in v]
               for k, v in zip(g["group"].to_list(), g["ranks"].to_list(), strict=True) if v}
    pairs: dict[tuple[int, int], float] = {}
    calls = 0
    for rank, group, in_bytes, splits in zip(c["rank"].to_list(), c["group"].to_list(), c["in_bytes"].to_list(),
                                             c["in_splits"].to_list(), strict=False):
        peers = members.get(str(group))
        if not peers:
            continue
        if splits is not None and len(splits) == len(peers):
            parts = [float(x or 0) for x in splits]
        elif in_bytes:
            parts = [float(in_bytes) / len(peers)] * len(peers)
        else:
            continue
        calls += 1
        for dst, b in zip(peers, parts, strict=False):
            pairs[(int(rank), dst)] = pairs.get((int(rank), dst), 0.0) + b
    if not pairs:
        return None
    ranks = sorted({a for a, _ in pairs} | {b for _, b in pairs})
    n = len(ranks)
    block = int(np.ceil(n / max_ranks))
    idx = {r: i // block for i, r in enumerate(ranks)}
    m = int(np.ceil(n / block))
    mat = np.zeros((m, m), dtype=np.float64)
    for (a, b), v in pairs.items():
        mat[idx[a], idx[b]] += v
    labels = [f"r{ranks[i * block]}" if block == 1 else f"r{ranks[i * block]}-{ranks[min((i + 1) * block, n) - 1]}"
              for i in range(m)]
    recv = mat.sum(axis=0)
    sent = mat.sum(axis=1)
    hot = int(np.argmax(recv))
    return {"labels": labels, "matrix_bytes": mat, "recv_bytes": recv, "sent_bytes": sent,
            "hot": labels[hot], "hot_share": float(recv[hot] / recv.sum()) if recv.sum() else 0.0,
            "imbalance": float(recv.max() / recv.mean()) if recv.mean() else 0.0,
            "calls": calls, "block": block}


def link_data(tables: Tables, *, max_links: int = 48, max_bins: int = 400, top_n: int = 6,
              t0_ns: int | None = None) -> dict[str, Any] | None:
    """Link utilisation grids (links x time bins, max utilisation per bin) per origin, all on one
    link order, plus the top links as lines."""
    t = tables_of(tables, ["link_samples", "topology_links"])
    ls = _frame(t["link_samples"], ["link", "ts_ns", "interval_ns", "tx_bytes", "rx_bytes", "tx_util", "rx_util",
                                    "origin"])
    if not ls.height:
        return None
    tl = _frame(t["topology_links"], ["link", "gbps"])
    if tl.height:
        ls = ls.join(tl, on="link", how="left")
    else:
        ls = ls.with_columns(pl.lit(None, dtype=pl.Float64).alias("gbps"))
    secs = pl.col("interval_ns").cast(pl.Float64) / 1e9
    from_bytes = pl.max_horizontal(pl.col("tx_bytes"), pl.col("rx_bytes")) * 8 / secs / (pl.col("gbps") * 1e9)
    ls = ls.with_columns(
        pl.coalesce(pl.max_horizontal(pl.col("tx_util"), pl.col("rx_util")), from_bytes).alias("util"),
        pl.col("origin").fill_null("telemetry"),
        pl.col("interval_ns").fill_null(0),
    ).filter(pl.col("util").is_not_null() & pl.col("ts_ns").is_not_null())
    if not ls.height:
        return None
    rank = ls.group_by("link").agg(pl.col("util").max().alias("peak"), pl.col("util").mean().alias("mean")) \
        .sort(["peak", "mean", "link"], descending=[True, True, False])
    n_links = rank.height
    links = rank["link"].to_list()[:max_links]
    notes = []
    if n_links > max_links:
        notes.append(f"Showing the {max_links} busiest of {n_links} links.")
    origins = sorted(ls["origin"].unique().to_list(), key=lambda o: (o != "telemetry", o))
    grids: dict[str, dict[str, Any]] = {}
    lines: dict[str, dict[str, Any]] = {}
    li = {name: i for i, name in enumerate(links)}
    for origin in origins:
        part = ls.filter((pl.col("origin") == origin) & pl.col("link").is_in(links))
        if not part.height:
            continue
        ts0 = int(part["ts_ns"].min())
        base = t0_ns if t0_ns is not None and abs(ts0 - t0_ns) < 3_600 * 10**9 else ts0
        ends = (part["ts_ns"] + part["interval_ns"]).max()
        span = max(int(ends) - base, 1)
        ts_rel = (part["ts_ns"].to_numpy() - base).astype(np.float64)
        nb = int(min(max_bins, max(part.group_by("link").len()["len"].max(), 1)))
        w = span / nb
        bi = np.clip((ts_rel / w).astype(np.int64), 0, nb - 1)
        grid = np.full((len(links), nb), np.nan, dtype=np.float32)
        lidx = np.array([li[x] for x in part["link"].to_list()], dtype=np.int64)
        util = part["util"].to_numpy().astype(np.float32)
        flat = lidx * nb + bi
        order = np.argsort(util)  # assign ascending so the max wins
        g = grid.reshape(-1)
        g[flat[order]] = util[order]
        grids[origin] = {"grid": grid, "x0_ms": 0.0, "dw_ms": span / 1e6, "base_ns": base,
                         "aligned": t0_ns is not None and base == t0_ns}
        top = links[:top_n]
        lines[origin] = {}
        for name in top:
            p = part.filter(pl.col("link") == name).sort("ts_ns")
            if p.height:
                lines[origin][name] = {"x": (p["ts_ns"].to_numpy() - base) / 1e6,
                                       "util": p["util"].to_numpy().astype(np.float32)}
    return {"links": links, "origins": list(grids), "grids": grids, "lines": lines,
            "peak": dict(zip(rank["link"].to_list(), rank["peak"].to_list(), strict=False)),
            "total_links": n_links, "notes": notes}


def replay_data(replay: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Step time per topology, and traced vs replayed per instance (ms)."""
    results = (replay or {}).get("results") or []
    if not results:
        return None
    topo, traced_ms, replayed_ms, err_med, err_p90 = [], [], [], [], []
    inst: dict[str, list] = {k: [] for k in ("topology", "traced_ms", "replayed_ms", "dim", "op", "group", "seq")}
    exposed: dict[str, dict[str, float]] = {}
    hot: list[dict[str, Any]] = []
    for res in results:
        name = str(res.get("topology", "?"))
        steps = {str(k): float(v) for k, v in (res.get("step_ns") or {}).items()}
        traced = res.get("traced_step_ns")
        if isinstance(traced, Mapping):
            tvals = [float(v) for v in traced.values()]
        elif traced is None:
            tvals = []
        else:
            tvals = [float(traced)]
        topo.append(name)
        replayed_ms.append(float(np.mean(list(steps.values()))) / 1e6 if steps else float("nan"))
        traced_ms.append(float(np.mean(tvals)) / 1e6 if tvals else float("nan"))
        err = res.get("replay_error") or {}
        err = err.get("cross_validated") or err  # the figure quoted as "replay error"
        err_med.append(err.get("median"))
        err_p90.append(err.get("p90"))
        exposed[name] = {norm_dim(k): float(v) / 1e6 for k, v in (res.get("exposed_ns") or {}).items()}
        for i in res.get("instances") or []:
            if i.get("traced_ns") is None or i.get("replayed_ns") is None:
                continue
            inst["topology"].append(name)
            inst["traced_ms"].append(float(i["traced_ns"]) / 1e6)
            inst["replayed_ms"].append(float(i["replayed_ns"]) / 1e6)
            inst["dim"].append(norm_dim(i.get("dim")))
            inst["op"].append(str(i.get("op") or ""))
            inst["group"].append(str(i.get("group") or "")[:MAX_NAME_CHARS])
            inst["seq"].append(int(i["seq"]) if i.get("seq") is not None else -1)
        for h in (res.get("hot_links") or [])[:5]:
            hot.append({"topology": name, **{k: h.get(k) for k in ("link", "peak_util", "mean_util", "bytes")}})
    return {"topologies": topo, "traced_step_ms": traced_ms, "replayed_step_ms": replayed_ms,
            "error_median": err_med, "error_p90": err_p90, "instances": inst, "exposed_ms": exposed,
            "hot_links": hot}


def hang_from_collectives(tables: Tables) -> dict[str, dict[int, int]] | None:
    """{group: {rank: last seq}} when the collectives look like a hang dump: some call was started
    and never completed, or the ranks of a group stopped at different seqs. ("scheduled" alone
    is not enough: gloo Flight Recorder dumps mark finished calls that way.)"""
    t = tables_of(tables, ["collectives"])
    c = _frame(t["collectives"], ["rank", "group", "seq", "state"]).filter(
        pl.col("seq").is_not_null() & pl.col("group").is_not_null())
    if not c.height:
        return None
    g = c.group_by(["group", "rank"]).agg(pl.col("seq").max())
    uneven = g.group_by("group").agg((pl.col("seq").max() != pl.col("seq").min()).alias("u"))["u"].any()
    if not uneven and not c.filter(pl.col("state") == "started").height:
        return None
    out: dict[str, dict[int, int]] = {}
    for group, rank, seq in zip(g["group"].to_list(), g["rank"].to_list(), g["seq"].to_list(), strict=True):
        out.setdefault(str(group), {})[int(rank)] = int(seq)
    return out


def hang_data(hang: Mapping[str, Mapping[Any, Any]] | None) -> dict[str, Any] | None:
    """Per group: ranks, last seq per rank, how far each lags the furthest, and the laggards."""
    if not hang:
        return None
    groups = []
    for group, per_rank in sorted(hang.items(), key=lambda kv: str(kv[0])):
        ranks = sorted(int(r) for r in per_rank)
        if not ranks:
            continue
        seqs = [int(per_rank[r] if r in per_rank else per_rank[str(r)]) for r in ranks]
        top = max(seqs)
        lag = [top - s for s in seqs]
        behind = [r for r, x in zip(ranks, lag, strict=False) if x > 0]
        groups.append({"group": str(group), "ranks": ranks, "last_seq": seqs, "lag": lag, "max_seq": top,
                       "behind": behind})
    if not groups:
        return None
    return {"groups": groups, "max_lag": max(max(g["lag"]) for g in groups)}


# ---------------------------------------------------------------------------------------------
# What-if

STORAGE_COLOR = "#7F7F7F"
MAX_EP_RANKS = 256
AXIS_CHARS = 34  # scenario names on an axis; hover shows them whole


def whatif_data(result: Any) -> dict[str, Any] | None:
    """A `tracekit.whatif.WhatIfResult` as plain columns: step and exposed time per scenario (the
    baseline first), inter-host bytes per dim, EP load per rank before and after, the rank -> host
    grids of placement scenarios, and north-south transfers. Nothing is recomputed: every figure
    is a field of the result, only averaged over steps and converted to ms and GB."""
    if result is None or not result.scenarios:
        return None
    names = ["baseline"]
    for s in result.scenarios:
        label, i = str(s.scenario)[:MAX_NAME_CHARS], 2
        while label in names:
            label, i = f"{str(s.scenario)[:MAX_NAME_CHARS]} #{i}", i + 1
        names.append(label)
    scen = dict(zip(names[1:], result.scenarios, strict=True))

    def mean_ms(values: Mapping[str, int]) -> float:
        return float(np.mean(list(values.values()))) / 1e6 if values else float("nan")

    step_ms = [mean_ms(result.baseline_step_ns)] + [mean_ms(s.step_ns) for s in result.scenarios]
    exposed = {"baseline": {norm_dim(k): v / 1e6 for k, v in result.baseline_exposed_ns.items()}}
    traffic = {"baseline": {k: v / 1e9 for k, v in result.scenarios[0].inter_host_before.items()}}
    for name, s in scen.items():
        exposed[name] = {norm_dim(k): v / 1e6 for k, v in s.exposed_ns.items()}
        traffic[name] = {k: v / 1e9 for k, v in s.inter_host_after.items()}
    dims = [d for d in DIM_ORDER if any(d in e for e in exposed.values())]
    traffic_dims = [d for d in (*DIM_ORDER, *sorted({k for t in traffic.values() for k in t}))
                    if any(t.get(d, 0) > 0 for t in traffic.values())]
    traffic_dims = list(dict.fromkeys(traffic_dims))
    ep, grids, storage = [], [], []
    for name, s in scen.items():
        if s.ep_load:
            ranks, before, after, cut = [], [], [], False
            for load in s.ep_load:
                for r, b, a in zip(load.ranks, load.before, load.after, strict=True):
                    if len(ranks) >= MAX_EP_RANKS:
                        cut = True
                        break
                    ranks.append(int(r))
                    before.append(b / 1e9)
                    after.append(a / 1e9)
            ep.append({"scenario": name, "ranks": ranks, "before_gb": before, "after_gb": after,
                       "imbalance": (s.ep_imbalance.before, s.ep_imbalance.after) if s.ep_imbalance else None,
                       "a2a_ms": (s.a2a_ns.before / 1e6, s.a2a_ns.after / 1e6) if s.a2a_ns else None,
                       "truncated": cut})
        if s.placement_before is not None and s.placement_after is not None:
            grids.append({"scenario": name, "before": _grid(s.placement_before), "after": _grid(s.placement_after),
                          "moved": sorted(r for r in s.placement_after.slots
                                          if s.placement_after.slots[r] != s.placement_before.slots.get(r))})
        if s.slowed is not None:
            worst = max(s.slowed, key=lambda x: x.scenario_ns - x.baseline_ns, default=None)
            transfers = (s.details or {}).get("transfer_ns") or {}
            ckpt = None if s.checkpoint_ns is None else s.checkpoint_ns / 1e6
            storage.append({"scenario": name, "checkpoint_ms": ckpt,
                            "transfer_ms": {str(k): v / 1e6 for k, v in transfers.items()},
                            "network": (s.details or {}).get("network"), "slowed": len(s.slowed),
                            "worst": None if worst is None else {
                                "op": worst.op, "dim": worst.dim, "group": str(worst.group)[:MAX_NAME_CHARS],
                                "seq": worst.seq, "baseline_ms": worst.baseline_ns / 1e6,
                                "scenario_ms": worst.scenario_ns / 1e6},
                            "other_traffic": list((s.details or {}).get("other_traffic") or [])})
    labels = ["baseline"] + [f"{i}. {n[:AXIS_CHARS]}{'…' if len(n) > AXIS_CHARS else ''}"
                             for i, n in enumerate(names[1:], 1)]
    return {"topology": str(result.topology), "comparison": str(result.comparison),
            "replay_error": ({"median": result.replay_error.median, "p90": result.replay_error.p90}
                             if result.replay_error is not None else {}),
            "cautions": [str(f.text) for f in result.cautions if f.severity == "warning"],
            "names": names, "labels": labels, "step_ms": step_ms,
            "exposed_ms": exposed, "dims": dims, "traffic_gb": traffic, "traffic_dims": traffic_dims,
            "ep": ep, "grids": grids, "storage": storage,
            "notes": {name: [str(n) for n in s.notes] for name, s in scen.items()}}


def _grid(placement: Any) -> dict[str, Any]:
    """A placement as cells: host row, GPU column, rank."""
    cells = sorted((h, g, r) for r, (h, g) in placement.slots.items())
    return {"hosts": [str(h)[:MAX_NAME_CHARS] for h in placement.hosts], "gpus": placement.gpus_per_host,
            "host": [c[0] for c in cells], "gpu": [c[1] for c in cells], "rank": [c[2] for c in cells]}
