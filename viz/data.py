"""Shape typed results into plain column dicts for the figures; nothing here decides anything.

Every number comes from the library: the analysis (`tracekit.analysis.AnalysisResult`: aligned
clocks, instances, waits and their root causes, the per rank and step breakdown, EP traffic, PP
stages, step times, findings), the hang verdict (`tracekit.hang.HangResult`) and the replay
(`tracekit.replay.engine.ReplayResult`). This module only selects, orders, scales and merges
for drawing. It imports no Bokeh, so it is unit-tested without a browser. Times on the timeline
are milliseconds since the start of the run on the aligned clock (own ``ts_ns`` + the rank's
``clock_offset_ns``).

Intervals shorter than one pixel are merged per lane into "busy" bars that keep their count and
busy time; a cap on glyphs per figure coarsens the merge further when needed, and the number of
intervals merged is reported (as pyinstrument reports resampling above 100k samples).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl
import pyarrow as pa
from msgspec import UNSET

from tracekit._text import bytes_unit, fmt_bytes, fmt_ns, fmt_ranks
from tracekit.analysis import breakdown
from tracekit.finding import texts

if TYPE_CHECKING:
    from tracekit.analysis import AnalysisResult
    from tracekit.finding import Finding
    from tracekit.hang import HangResult
    from tracekit.replay.engine import HotLink, ReplayResult
    from tracekit.replay.microbench import MicrobenchReport
    from tracekit.whatif.core import Placement, WhatIfResult
    from tracekit.whatif.schedule import PipelineRun

__all__ = ["DIM_COLORS", "DIM_LABELS", "DIM_ORDER", "Merge", "TimelineData", "bytes_unit", "coverage",
           "ep_data", "fmt_bytes", "fmt_ns", "hang_data", "level_for", "link_data", "merge_short",
           "microbench_data", "norm_dim",
           "overlap_data", "rank_layout", "replay_data", "timeline_data"]

# Okabe-Ito (and Tol's wine for WORLD): distinguishable with every common form of colour-blindness.
DIM_ORDER: tuple[str, ...] = ("DP", "PP", "EP", "TP", "CP", "WORLD", "OTHER")
DIM_COLORS: dict[str, str] = {
    "DP": "#0072B2",  # blue
    "PP": "#E69F00",  # orange
    "EP": "#009E73",  # bluish green
    "TP": "#D55E00",  # vermillion
    "CP": "#56B4E9",  # sky blue
    "WORLD": "#882255",  # wine
    "OTHER": "#CC79A7",  # reddish purple
}
#: The names the CLI prints (`tracekit analyze` says WORLD; "other" is what no rule classified).
DIM_LABELS: dict[str, str] = {"DP": "DP", "PP": "PP", "EP": "EP", "TP": "TP", "CP": "CP", "WORLD": "WORLD",
                              "OTHER": "other"}
COMPUTE_COLOR = "#9A9A9A"
MERGED_NAME = "(merged: intervals shorter than a pixel)"
MAX_NAME_CHARS = 160


def norm_dim(dim: str | None) -> str:
    """The drawn category of a dim (unknown and null become OTHER)."""
    d = (dim or "").upper()
    return d if d in DIM_COLORS else "OTHER"


def _plain(df: pl.DataFrame) -> pl.DataFrame:
    return df.with_columns(pl.col(pl.Categorical, pl.Enum).cast(pl.String))


def _df(table: pa.Table) -> pl.DataFrame:
    out = pl.from_arrow(table)
    assert isinstance(out, pl.DataFrame)
    return _plain(out)


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
# Rows


@dataclass(frozen=True)
class Band:
    """Consecutive rows that share a label (a PP stage and host): rows y0 to y1."""

    label: str
    y0: int
    y1: int


@dataclass(frozen=True)
class RankLayout:
    """The row order of per-rank figures (`order`: ranks top to bottom; `row`: rank -> row), each
    rank's host, PP stage and clock offset (ns), the bands of rows that share a stage and host, and
    each row's label."""

    order: list[int]
    row: dict[int, int]
    host: dict[int, str]
    stage: dict[int, int]
    offset: dict[int, int]
    bands: list[Band]
    labels: dict[int, str]


def rank_layout(analysis: AnalysisResult, extra_ranks: Sequence[int] = ()) -> RankLayout:
    """Row order for per-rank figures: by PP stage (the analysis' `pp_stages`), then host, then rank."""
    r = _df(analysis.ranks).select("rank", "host", "clock_offset_ns")
    host = {int(k): (h or "") for k, h in zip(r["rank"].to_list(), r["host"].to_list(), strict=True)}
    offset = {int(k): int(o or 0) for k, o in zip(r["rank"].to_list(), r["clock_offset_ns"].to_list(), strict=True)}
    stages = _df(analysis.pp_stages)
    stage = {int(k): int(v) for k, v in zip(stages["rank"].to_list(), stages["stage"].to_list(), strict=True)}
    all_ranks = sorted(set(host) | {int(x) for x in extra_ranks})
    has_stage = bool(stage)
    order = sorted(all_ranks, key=lambda x: (stage.get(x, 1 << 30) if has_stage else 0, host.get(x, ""), x))
    rows = {x: i for i, x in enumerate(order)}
    bands: list[Band] = []
    for i, x in enumerate(order):
        parts = []
        if has_stage:
            parts.append(f"stage {stage[x]}" if x in stage else "no stage")
        parts.append(host.get(x) or "host unknown")
        label = " · ".join(parts)
        if bands and bands[-1].label == label:
            bands[-1] = Band(label=label, y0=bands[-1].y0, y1=i)
        else:
            bands.append(Band(label=label, y0=i, y1=i))
    return RankLayout(order=order, row=rows, host=host, stage=stage, offset=offset, bands=bands,
                      labels={i: f"r{x}" for i, x in enumerate(order)})


# ---------------------------------------------------------------------------------------------
# Timeline


@dataclass
class TimelineData:
    """Everything the timeline draws. ``levels[k][layer]`` is a column dict; level 0 is the full
    view, each next level is `zoom` times finer and is used once the view is that narrow."""

    t0_ns: int
    span_ms: float
    rows: RankLayout
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


def timeline_data(analysis: AnalysisResult, events: pl.DataFrame | pa.Table, *, width_px: int = 1400,
                  max_glyphs: int = 60_000, max_total: int = 250_000, zoom: int = 8, max_levels: int = 4,
                  overview_bins: int = 800) -> TimelineData:
    """The timeline's layers (compute, comm per dim, stall) at several levels of detail.

    Compute and communication intervals are the analysis' own (`tracekit.analysis.breakdown`);
    each communication interval carries its instance's op, group, seq, bytes and bus bandwidth,
    and the rank's wait there, the rank it waited on and the root of that wait
    (`AnalysisResult.participants` and `instances`). `max_glyphs` caps the bars one view draws;
    `max_total` caps the bars shipped in the file over all levels. Either cap coarsens the merge
    threshold of a level (doubling it) until it holds.
    """
    ev = events if isinstance(events, pl.DataFrame) else _df(events)
    ev = _plain(ev).filter(pl.col("ts_ns").is_not_null() & pl.col("dur_ns").is_not_null())
    colls = _df(analysis.collectives)
    comm = breakdown.comm_intervals(ev, colls, detail=True)
    compute = breakdown.compute_intervals(ev, comm, detail=True)
    inst = _df(analysis.instances)
    parts = _df(analysis.participants) if analysis.participants.num_columns else pl.DataFrame(
        schema={"instance": pl.Int64, "rank": pl.Int32, "wait_ns": pl.Int64, "waited_on": pl.Int32})
    info = colls.select("coll_id", "instance", "op", "group", "seq", pl.col("rank").cast(pl.Int32).alias("_r"))
    per = (inst.select("instance", pl.col("op").alias("_iop"), "bytes", "busbw_gbps", "root_rank")
           .join(parts.select("instance", pl.col("rank").cast(pl.Int32).alias("_r"), "wait_ns", "waited_on"),
                 on="instance", how="left"))
    comm = (comm.join(info, on="coll_id", how="left")
            .join(per, on=["instance", "_r"], how="left")
            .with_columns(pl.coalesce("_iop", "op").fill_null("other").alias("op")))
    seen = set(comm["rank"].unique().to_list()) | set(compute["rank"].unique().to_list())
    layout = rank_layout(analysis, extra_ranks=sorted(seen))
    off = pl.DataFrame({"rank": list(layout.offset), "_off": list(layout.offset.values())},
                       schema={"rank": pl.Int32, "_off": pl.Int64})

    def aligned(df: pl.DataFrame) -> pl.DataFrame:
        return df.with_columns(pl.col("rank").cast(pl.Int32)).join(off, on="rank", how="left").with_columns(
            (pl.col("s") + pl.col("_off").fill_null(0)).alias("s"),
            (pl.col("e") + pl.col("_off").fill_null(0)).alias("e")).drop("_off")

    comm, compute = aligned(comm), aligned(compute)
    step_times = _df(analysis.step_times)
    starts = [df["s"].min() for df in (comm, compute) if df.height]
    ends = [df["e"].max() for df in (comm, compute) if df.height]
    if starts and step_times.height:  # the run starts where its first step does, when that is earlier
        starts.append(step_times["start_ns"].min())
        ends.append(step_times["end_ns"].max())
    t0 = int(min(starts)) if starts else 0
    span_ns = max(int(max(ends)) - t0, 1) if ends else 1
    names: dict[str, int] = {MERGED_NAME: 0}
    raw: dict[str, dict[str, np.ndarray]] = {}
    row_of = layout.row

    def rows_for(ranks: pl.Series) -> np.ndarray:
        return ranks.cast(pl.Int64).replace_strict(row_of, return_dtype=pl.Int64).to_numpy()

    if compute.height:
        s = (compute["s"] - t0).to_numpy().astype(np.int64)
        raw["compute"] = {"row": rows_for(compute["rank"]), "rank": compute["rank"].to_numpy().astype(np.int64),
                          "s": s, "e": (compute["e"] - t0).to_numpy().astype(np.int64),
                          "name_id": _str_ids(compute["name"], names)}
    comm = comm.with_columns(pl.col("dim").map_elements(norm_dim, return_dtype=pl.String))
    for dim in DIM_ORDER:
        part = comm.filter(pl.col("dim") == dim)
        if not part.height:
            continue
        s = (part["s"] - t0).to_numpy().astype(np.int64)
        e = (part["e"] - t0).to_numpy().astype(np.int64)
        wait = np.minimum(part["wait_ns"].fill_null(0).to_numpy().astype(np.int64), e - s)
        raw[f"comm:{dim}"] = {
            "row": rows_for(part["rank"]), "rank": part["rank"].to_numpy().astype(np.int64), "s": s, "e": e,
            "name_id": _str_ids(part["name"], names),
            "op": part["op"].cast(pl.String).fill_null("").to_numpy().astype(object),
            "group": part["group"].cast(pl.String).fill_null("").str.slice(0, MAX_NAME_CHARS).to_numpy()
            .astype(object),
            "seq": part["seq"].fill_null(-1).to_numpy().astype(np.int64),
            # -1 marks "not applicable" (Bokeh prints NaN before any formatter sees it)
            "bytes": part["bytes"].fill_null(-1).to_numpy().astype(np.float64),
            "busbw": part["busbw_gbps"].fill_null(-1.0).to_numpy().astype(np.float32),
            "wait_ns": wait.astype(np.float64),
            "waited_on": part["waited_on"].fill_null(-1).to_numpy().astype(np.int64),
            "root": part["root_rank"].fill_null(-1).to_numpy().astype(np.int64),
        }
        has_wait = wait > 0
        if has_wait.any():
            st = raw.setdefault("stall", {"row": np.zeros(0, np.int64), "rank": np.zeros(0, np.int64),
                                          "s": np.zeros(0, np.int64), "e": np.zeros(0, np.int64)})
            st["row"] = np.concatenate([st["row"], raw[f"comm:{dim}"]["row"][has_wait]])
            st["rank"] = np.concatenate([st["rank"], raw[f"comm:{dim}"]["rank"][has_wait]])
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
    steps = [{"step": int(s), "x0": (a - t0) / 1e6, "x1": (b - t0) / 1e6}
             for s, a, b in step_times.select("step", "start_ns", "end_ns").iter_rows()]
    overview = _overview(raw, layers, span_ns, len(layout.order), overview_bins)
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
            d["waited_on"] = np.concatenate([cols["waited_on"][keep], np.full(nm, -1, np.int64)])
            d["root"] = np.concatenate([cols["root"][keep], np.full(nm, -1, np.int64)])
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


def _union_rows(row: np.ndarray, s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Intervals merged where they overlap within a row (so a rank counts once per moment)."""
    if s.size == 0:
        return row, s, e
    order = np.lexsort((s, row))
    row, s, e = row[order], s[order], e[order]
    span = int(max(e.max() - s.min(), 1)) + 1
    shift = (row - row.min()) * (2 * span)
    run_end = np.maximum.accumulate(e + shift) - shift
    new = np.ones(s.size, bool)
    new[1:] = (row[1:] != row[:-1]) | (s[1:] > run_end[:-1])
    idx = np.flatnonzero(new)
    return row[idx], s[idx], np.maximum.reduceat(e, idx)


def coverage_rows(row: np.ndarray, s: np.ndarray, e: np.ndarray, nrows: int, span_ns: float, bins: int
                  ) -> np.ndarray:
    """Per row and time bin, the fraction of the bin its (merged) intervals cover, in [0, 1]."""
    out = np.zeros((nrows, bins), dtype=np.float64)
    row, s, e = _union_rows(np.asarray(row, np.int64), np.asarray(s, np.float64), np.asarray(e, np.float64))
    for r in np.unique(row):
        sel = row == r
        out[r] = coverage(s[sel], e[sel], span_ns, bins)
    return np.clip(out, 0.0, 1.0)


def _overview(raw: dict[str, dict[str, np.ndarray]], layers: list[str], span_ns: float, nrows: int,
              bins: int) -> dict[str, Any]:
    """Ranks busy per time bin, for the range selector: how many ranks communicate, per dim
    (stacked; a rank that runs two dims at once counts once, split between them) and how many
    compute (a line). Neither can exceed the number of ranks."""
    x = (np.arange(bins) + 0.5) * span_ns / bins / 1e6
    comm_layers = [lay for lay in layers if lay.startswith("comm:")]
    cov = {lay: coverage_rows(raw[lay]["row"], raw[lay]["s"], raw[lay]["e"], nrows, span_ns, bins)
           for lay in comm_layers}
    if cov:
        total = np.sum(list(cov.values()), axis=0)
        scale = np.where(total > 1.0, 1.0 / np.maximum(total, 1e-12), 1.0)
        cov = {lay: c * scale for lay, c in cov.items()}
    series = {lay: c.sum(axis=0).astype(np.float32) for lay, c in cov.items()}
    if "compute" in raw:
        series["compute"] = coverage_rows(raw["compute"]["row"], raw["compute"]["s"], raw["compute"]["e"], nrows,
                                          span_ns, bins).sum(axis=0).astype(np.float32)
    return {"x": x, "series": series, "nrows": nrows}


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


@dataclass(frozen=True)
class OverlapData:
    """The Overlap tab: the ranks drawn (in row order), the dims present, the bars' columns (rank
    labels, per dim "DIM_hidden" and "DIM_exposed" and "compute", ms per step) and per dim the
    summed (hidden, exposed) ms."""

    ranks: list[int]
    dims: list[str]
    columns: dict[str, Any]
    totals_ms: dict[str, tuple[float, float]]


def overlap_data(analysis: AnalysisResult, rank_order: Sequence[int] | None = None) -> OverlapData | None:
    """Hidden vs exposed communication per rank and dim, in ms per step window (mean over the
    rank's steps), from the analysis' per rank and step breakdown."""
    wide = _df(analysis.per_rank_step)
    if wide.height == 0:
        return None
    long = _df(analysis.per_rank_step_dim).with_columns(
        pl.col("dim").map_elements(norm_dim, return_dtype=pl.String))
    n_steps = wide.group_by("rank").agg(pl.len().alias("n"))
    per = (long.group_by("rank", "dim").agg(pl.col("comm_ns").sum(), pl.col("exposed_ns").sum())
           .join(n_steps, on="rank"))
    compute = wide.group_by("rank").agg((pl.col("compute_ns").sum() / pl.len()).alias("c"))
    ranks = [r for r in (rank_order or sorted(wide["rank"].unique().to_list()))
             if r in set(wide["rank"].to_list())]
    dims = [d for d in DIM_ORDER if d in set(per["dim"].to_list())]
    cols: dict[str, Any] = {"rank": [f"r{r}" for r in ranks]}
    for d in dims:
        part = {r: (c, x, n) for r, c, x, n in per.filter(pl.col("dim") == d)
                .select("rank", "comm_ns", "exposed_ns", "n").iter_rows()}
        cols[f"{d}_hidden"] = np.array([(part[r][0] - part[r][1]) / part[r][2] / 1e6 if r in part else 0.0
                                        for r in ranks])
        cols[f"{d}_exposed"] = np.array([part[r][1] / part[r][2] / 1e6 if r in part else 0.0 for r in ranks])
    comp = dict(compute.iter_rows())
    cols["compute"] = np.array([comp.get(r, 0.0) / 1e6 for r in ranks])
    totals = {d: (float(np.sum(cols[f"{d}_hidden"])), float(np.sum(cols[f"{d}_exposed"]))) for d in dims}
    return OverlapData(ranks=ranks, dims=dims, columns=cols, totals_ms=totals)


@dataclass(frozen=True)
class EPData:
    """The EP tab: the traffic matrix among the ranks present (`labels`, in `unit`, `scale` bytes
    each; ranks grouped in blocks of `block`), the bytes each receives and sends (in `recv_unit`),
    the analysis' per-group rows (`ep_groups`), the hot ranks' labels, the notes, and whether any
    split was assumed even."""

    labels: list[str]
    matrix: np.ndarray
    assumed: bool
    unit: str
    scale: float
    recv: np.ndarray
    sent: np.ndarray
    groups: list[dict[str, Any]]
    hot: list[str]
    notes: list[str]
    block: int
    recv_unit: str = "B"


def ep_data(analysis: AnalysisResult, *, max_ranks: int = 256) -> EPData | None:
    """The EP traffic matrix among the ranks present (the analysis' `ep_traffic`), the bytes each
    receives, the per-group figures (`ep_groups`) and the notes that qualify them; None when
    there is no EP group, or when no all-to-all recorded its splits and every member is present
    (the findings say so; a partial group keeps its tab, which shows who is missing)."""
    traffic = _df(analysis.ep_traffic)
    groups = _df(analysis.ep_groups)
    if groups.height == 0:
        return None
    if traffic.height and traffic["assumed"].all() and groups["complete"].all():
        return None  # every split assumed even among members all present: a flat heatmap measures nothing
    notes = [f.text for f in analysis.findings
             if f.kind in ("assumed_splits", "partial_run") and f.group is not None]
    hot = sorted({int(r) for rs in groups["hot_ranks"].to_list() for r in (rs or [])})
    if traffic.height == 0:
        return EPData(labels=[], matrix=np.zeros((0, 0)), recv=np.zeros(0), sent=np.zeros(0), unit="B", scale=1.0,
                      groups=groups.to_dicts(), hot=[f"r{r}" for r in hot], notes=notes, block=1,
                      assumed=bool(groups["splits_assumed"].max() or 0))
    ranks = sorted(set(traffic["src"].to_list()) | set(traffic["dst"].to_list()))
    n = len(ranks)
    block = int(np.ceil(n / max_ranks))
    idx = {r: i // block for i, r in enumerate(ranks)}
    m = int(np.ceil(n / block))
    mat = np.zeros((m, m), dtype=np.float64)
    assumed = np.zeros((m, m), dtype=bool)
    for a, b, v, guess in traffic.select("src", "dst", "bytes", "assumed").iter_rows():
        mat[idx[a], idx[b]] += v
        assumed[idx[a], idx[b]] |= bool(guess)
    labels = [f"r{ranks[i * block]}" if block == 1 else f"r{ranks[i * block]}-{ranks[min((i + 1) * block, n) - 1]}"
              for i in range(m)]
    unit, scale = bytes_unit(float(mat.max()) if mat.size else 0.0)
    recv, sent = mat.sum(axis=0), mat.sum(axis=1)
    runit, rscale = bytes_unit(float(recv.max()) if recv.size else 0.0)
    return EPData(labels=labels, matrix=mat / scale, assumed=bool(assumed.any()), unit=unit, scale=scale,
                  recv=recv / rscale, sent=sent / rscale, recv_unit=runit, groups=groups.to_dicts(),
                  hot=[f"r{r}" for r in hot], notes=notes, block=block)


@dataclass(frozen=True)
class LinkLine:
    """The busiest link of one origin over time: ms from the panel's start, utilisation."""

    link: str
    x: np.ndarray
    util: np.ndarray


@dataclass(frozen=True)
class LinkPanel:
    """One origin's utilisation heatmap (telemetry, or a replayed topology): its busiest `links`
    (of `total_links`), the grid (link x time bin), where it starts and how wide it is (ms), whether
    it is on the timeline's clock, its peak, and its busiest link as a line."""

    origin: str
    name: str
    kind: str
    links: list[str]
    grid: np.ndarray
    x0_ms: float
    dw_ms: float
    aligned: bool
    total_links: int
    peak: float
    line: LinkLine


@dataclass(frozen=True)
class LinkData:
    """The Links tab's heatmaps, in the order drawn, and the notes on what they leave out."""

    panels: list[LinkPanel]
    notes: list[str]


def link_data(link_samples: pa.Table, topology_links: pa.Table | None, *, order: Sequence[str] = (),
              max_links: int = 32, max_bins: int = 400, t0_ns: int | None = None) -> LinkData | None:
    """Link utilisation grids per origin (telemetry first, then the replayed topologies in the
    order they were given, `order`), each over its own busiest links, and the busiest link of
    each origin as a line."""
    ls = _df(link_samples)
    if ls.height == 0:
        return None
    if topology_links is not None and topology_links.num_rows:
        tl = _df(topology_links).select("link", "gbps").unique("link", keep="first")
        ls = ls.join(tl, on="link", how="left")
    else:
        ls = ls.with_columns(pl.lit(None, dtype=pl.Float64).alias("gbps"))
    secs = pl.col("interval_ns").cast(pl.Float64) / 1e9
    from_bytes = pl.max_horizontal(pl.col("tx_bytes"), pl.col("rx_bytes")) * 8 / secs / (pl.col("gbps") * 1e9)
    ls = ls.with_columns(
        pl.coalesce(pl.max_horizontal(pl.col("tx_util"), pl.col("rx_util")), from_bytes).alias("util"),
        pl.col("origin").fill_null("telemetry"), pl.col("interval_ns").fill_null(0),
    ).filter(pl.col("util").is_not_null() & pl.col("ts_ns").is_not_null())
    if ls.height == 0:
        return None
    wanted = [f"replay:{name}" for name in order]
    present = ls["origin"].unique().to_list()
    origins = ([o for o in present if o == "telemetry"] + [o for o in wanted if o in present]
               + sorted(o for o in present if o != "telemetry" and o not in wanted))
    panels = []
    for origin in origins:
        part = ls.filter(pl.col("origin") == origin)
        if origin != "telemetry" and not (part["util"] > 0).any():
            continue  # a replay that moved nothing over any link (nothing simulated): no heatmap of zeros
        # a parallel mean differs in its last bits from run to run: rank on rounded figures, ties by name
        rank = (part.group_by("link").agg(pl.col("util").max().alias("peak"), pl.col("util").mean().alias("mean"))
                .with_columns(pl.col("link").cast(pl.String), pl.col("mean").round(9).alias("_mean"))
                .sort(["peak", "_mean", "link"], descending=[True, True, False]).drop("_mean"))
        links = rank["link"].to_list()[:max_links]
        part = part.filter(pl.col("link").is_in(links))
        ts0 = int(part["ts_ns"].min())
        base = t0_ns if t0_ns is not None and abs(ts0 - t0_ns) < 3_600 * 10**9 else ts0
        span = max(int((part["ts_ns"] + part["interval_ns"]).max()) - base, 1)
        nb = int(min(max_bins, max(part.group_by("link").len()["len"].max(), 1)))
        bi = np.clip(((part["ts_ns"].to_numpy() - base) / (span / nb)).astype(np.int64), 0, nb - 1)
        li = {name: i for i, name in enumerate(links)}
        grid = np.full((len(links), nb), np.nan, dtype=np.float32)
        util = part["util"].to_numpy().astype(np.float32)
        flat = np.array([li[x] for x in part["link"].to_list()], dtype=np.int64) * nb + bi
        order_up = np.argsort(util)  # assign ascending so the max wins
        grid.reshape(-1)[flat[order_up]] = util[order_up]
        top = links[0]
        line = part.filter(pl.col("link") == top).sort("ts_ns")
        kind = "telemetry" if origin == "telemetry" else "replay"
        panels.append(LinkPanel(
            origin=origin, name=origin.split(":", 1)[-1], kind=kind, links=links, grid=grid, x0_ms=0.0,
            dw_ms=span / 1e6, aligned=t0_ns is not None and base == t0_ns, total_links=rank.height,
            peak=float(rank["peak"].max()),
            line=LinkLine(link=top, x=(line["ts_ns"].to_numpy() - base) / 1e6,
                          util=line["util"].to_numpy().astype(np.float32))))
    if not panels:
        return None
    notes = [f"{p.name}: showing the {len(p.links)} busiest of {p.total_links} links."
             for p in panels if p.total_links > len(p.links)]
    return LinkData(panels=panels, notes=notes)


@dataclass(frozen=True)
class ReplayData:
    """What the Replay tab draws, per topology in the order given (see `replay_data`); `instances` is
    the scatter's columns (topology, traced_ms, replayed_ms, dim, op, group, seq)."""

    topologies: list[str]
    step_ms: list[float]
    delta: list[float]
    simulated: bool = True
    not_simulated: str | None = None
    traced_step_ms: float | None = None
    error_median: list[float | None] = field(default_factory=list)
    error_p90: list[float | None] = field(default_factory=list)
    error_calibrated_on: str | None = None
    instances: dict[str, list[Any]] = field(default_factory=dict)
    exposed_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    hot_links: list[tuple[str, HotLink]] = field(default_factory=list)  # (topology, link), hottest first
    findings: list[Finding] = field(default_factory=list)
    not_modelled: list[Finding] = field(default_factory=list)  # the network model does not apply (a CPU run)


def replay_data(replay: ReplayResult | None) -> ReplayData | None:
    """Per topology, in the order given: the mean step time and its change against the baseline
    (the first topology, as `tracekit replay` prints it), exposed communication per dim, the
    traced vs replayed duration of every simulated instance (those the model gave no traffic keep
    their traced duration and are left out), the hottest links, and the replay's findings.
    `simulated` is False when nothing was (`not_simulated` then says why, in the finding's words). A
    replay the network model did not apply to (a CPU/gloo run) gives only its findings, `not_modelled`
    first."""
    if replay is None:
        return None
    if not replay.results:
        findings = list(getattr(replay, "findings", []) or [])
        said = [f for f in findings if f.kind == "cpu_backend"]
        if not said:
            return None
        return ReplayData(topologies=[], step_ms=[], delta=[], not_modelled=said,
                          findings=[f for f in findings if f.kind != "cpu_backend"])
    from tracekit.replay.calibration import NO_FLOWS

    topo, step_ms, delta, err_med, err_p90 = [], [], [], [], []
    inst: dict[str, list] = {k: [] for k in ("topology", "traced_ms", "replayed_ms", "dim", "op", "group", "seq")}
    exposed: dict[str, dict[str, float]] = {}
    hot: list[tuple[str, HotLink]] = []
    base = None
    for res in replay.results:
        steps = list((res.step_ns or {}).values())
        mean = float(np.mean(steps)) if steps else float("nan")
        base = mean if base is None else base
        topo.append(res.topology)
        step_ms.append(mean / 1e6)
        delta.append((mean - base) / base if base else 0.0)
        err = res.replay_error  # ReplayErrors: .median and .p90 are the cross-validated figures
        err_med.append(None if err is None else err.median)
        err_p90.append(None if err is None else err.p90)
        exposed[res.topology] = {norm_dim(k): float(v) / 1e6 for k, v in (res.exposed_ns or {}).items()}
        for i in res.instances or []:
            if i.traced_ns is None or i.replayed_ns is None or i.calibration == NO_FLOWS:
                continue
            inst["topology"].append(res.topology)
            inst["traced_ms"].append(float(i.traced_ns) / 1e6)
            inst["replayed_ms"].append(float(i.replayed_ns) / 1e6)
            inst["dim"].append(norm_dim(i.dim))
            inst["op"].append(str(i.op or ""))
            inst["group"].append(str(i.group or "")[:MAX_NAME_CHARS])
            inst["seq"].append(int(i.seq) if i.seq is not None else -1)
        for h in (res.hot_links or [])[:5]:
            hot.append((res.topology, h))
    traced = list((replay.results[0].traced_step_ns or {}).values())
    unsimulated = next((f for f in getattr(replay, "findings", []) or [] if f.kind == "not_simulated"), None)
    simulated = replay.results[0].replay_error is not None
    return ReplayData(topologies=topo, step_ms=step_ms, delta=delta, simulated=simulated,
                      not_simulated=unsimulated.text if unsimulated is not None else None,
                      traced_step_ms=float(np.mean(traced)) / 1e6 if traced else None,
                      error_median=err_med, error_p90=err_p90,
                      error_calibrated_on=getattr(getattr(replay, "errors", None), "calibrated_on", None),
                      instances=inst, exposed_ms=exposed,
                      hot_links=hot, findings=list(getattr(replay, "findings", []) or []))


@dataclass(frozen=True)
class BenchTableData:
    """One nccl-tests table: its label, verdict and sentences, and per modelled size the measured and
    predicted busbw."""

    table: int
    label: str
    op: str
    verdict: str
    sentence: str
    floor: str | None
    size_bytes: list[int]
    size: list[str]
    measured: list[float]
    predicted: list[float]


@dataclass(frozen=True)
class BenchFileData:
    file: str
    tables: list[BenchTableData]


@dataclass(frozen=True)
class MicrobenchData:
    """The nccl-tests page: the topology, the path replayed, per file its tables, the findings' texts."""

    topology: str
    path: str
    files: list[BenchFileData]
    findings: list[str]


def microbench_data(report: MicrobenchReport) -> MicrobenchData:
    """Per nccl-tests file: per table, measured and predicted busbw by size (the rows the model
    predicts), and each table's health sentence and latency-floor sentence (None unless the floor is
    high; the same words as `tracekit replay --nccl-tests`)."""
    from pathlib import Path

    from tracekit.present import floor_sentence, health_sentence

    files = []
    for source in report.sources:
        tables = []
        for t in (t for t in report.tables if t.source == source):
            rows = [r for r in report.rows if r.source == source and r.table == t.table and r.modelled
                    and r.measured_us > 0]
            tables.append(BenchTableData(table=t.table, label=f"table {t.table}: {t.test or t.op}"[:MAX_NAME_CHARS],
                                         op=t.op, verdict=t.health.verdict, sentence=health_sentence(t),
                                         floor=floor_sentence(t), size_bytes=[r.size_bytes for r in rows],
                                         size=[fmt_bytes(r.size_bytes) for r in rows],
                                         measured=[r.timed_busbw for r in rows],
                                         predicted=[r.predicted_busbw for r in rows]))
        files.append(BenchFileData(file=Path(source).name or source, tables=tables))
    return MicrobenchData(topology=report.topology, path=report.path, files=files,
                          findings=[f.text for f in report.findings])


@dataclass(frozen=True)
class HangGroupData:
    """One group of the Hang tab: its verdict and status, each rank's last seq (`ranks` and
    `last_seq` in rank order), the ranks the verdict names and those that dumped nothing."""

    group: str
    desc: str | None
    status: str
    verdict: str
    ranks: list[int]
    last_seq: list[int]
    max_seq: int | None
    suspects: list[int]
    missing: list[int]
    no_dump: str


@dataclass(frozen=True)
class HangData:
    """The Hang tab: per group, then the verdict's sentences, whether the run hung, where the
    sequence numbers came from, the ranks to look at."""

    groups: list[HangGroupData]
    findings: list[str]
    hung: bool
    source: str
    suspects: list[int]


def hang_data(hang: HangResult | None) -> HangData | None:
    """Per group of a `tracekit.hang.HangResult`: its verdict and status, each rank's last seq, and
    which ranks the verdict names (the same code and words as `tracekit hang`)."""
    if hang is None or not hang.groups:
        return None
    groups = []
    for g in hang.groups:
        ranks = sorted(g.last_seq)
        top = max(g.last_seq.values()) if g.last_seq else None
        groups.append(HangGroupData(group=g.group, desc=g.desc, status=g.status, verdict=g.verdict, ranks=ranks,
                                    last_seq=[g.last_seq[r] for r in ranks], max_seq=top, suspects=list(g.suspects),
                                    missing=list(g.missing_ranks), no_dump=fmt_ranks(g.no_dump_ranks, limit=8)))
    return HangData(groups=groups, findings=texts(hang.findings), hung=hang.hung, source=hang.source,
                    suspects=list(hang.suspects))


# ---------------------------------------------------------------------------------------------
# What-if

STORAGE_COLOR = "#7F7F7F"
MAX_EP_RANKS = 256
AXIS_CHARS = 34  # scenario names on an axis; hover shows them whole


def scenario_labels(texts: Sequence[str], max_chars: int = AXIS_CHARS) -> list[str]:
    """Short, distinct axis labels for scenario strings: a text that fits stays whole; a longer one
    keeps its kind and only the fields that set it apart from the other scenarios of that kind
    ("checkpoint:via=frontend" and "checkpoint:via=backend"), cut to `max_chars` if still too long;
    labels that still coincide get "#2", "#3". Hover shows the full text."""
    parsed = [(t.partition(":")[0], [f for f in t.partition(":")[2].split(",") if f]) for t in texts]
    out = []
    for text, (kind, fields) in zip(texts, parsed, strict=True):
        if len(text) <= max_chars:
            out.append(text)
            continue
        same = [f for k, f in parsed if k == kind]
        shared = set.intersection(*(set(f) for f in same)) if len(same) > 1 else set()
        own = [f for f in fields if f not in shared] or fields
        label = f"{kind}:{','.join(own)}" if own else text
        out.append(label if len(label) <= max_chars else label[:max_chars - 1] + "…")
    seen: dict[str, int] = {}
    unique = []
    for label in out:
        seen[label] = seen.get(label, 0) + 1
        unique.append(label if seen[label] == 1 else f"{label} #{seen[label]}")
    return unique


@dataclass(frozen=True)
class EPLoad:
    """One EPLB scenario's load per rank (GB received, before and after; the first `MAX_EP_RANKS`),
    the worst group's max/mean and the EP all-to-all time (ms), each (before, after)."""

    scenario: str
    ranks: list[int]
    before_gb: list[float]
    after_gb: list[float]
    imbalance: tuple[float, float] | None
    a2a_ms: tuple[float, float] | None
    truncated: bool


@dataclass(frozen=True)
class PlacementGrid:
    """A placement as cells: the host names, GPUs per host, and per cell its host row, GPU and rank."""

    hosts: list[str]
    gpus: int
    host: list[int]
    gpu: list[int]
    rank: list[int]


@dataclass(frozen=True)
class PlacementGrids:
    """A placement scenario's grids, traced and after, and the ranks that moved."""

    scenario: str
    before: PlacementGrid
    after: PlacementGrid
    moved: list[int]


@dataclass(frozen=True)
class Slowest:
    """The collective a north-south transfer slowed most (ms, baseline and scenario)."""

    op: str
    dim: str
    group: str
    seq: int
    baseline_ms: float
    scenario_ms: float


@dataclass(frozen=True)
class StorageRow:
    """One north-south scenario: its checkpoint time and transfers (ms), the network it used, how many
    collectives it slowed and the worst, and the other traffic it names."""

    scenario: str
    checkpoint_ms: float | None
    transfer_ms: dict[str, float]
    network: str | None
    slowed: int
    worst: Slowest | None
    other_traffic: list[Any]


@dataclass(frozen=True)
class ScenarioGantt:
    """A pipeline scenario's Gantt charts (as traced, rebuilt; the scenario) and its SM share."""

    scenario: str
    runs: list[Gantt]
    sm_share: float


@dataclass(frozen=True)
class ScalePoint:
    scenario: str
    gpus: int
    step_ms: float


@dataclass(frozen=True)
class WhatIfData:
    """The What-if tab (see `whatif_data`): per scenario, the baseline first (`names`, with their axis
    `labels`), the step and exposed time, inter-host traffic, EP loads, placement grids, north-south
    transfers, scale points, pipeline charts and notes; or, for a run the network model does not
    apply to, only `not_modelled`."""

    topology: str
    comparison: str = ""
    gantt: list[ScenarioGantt] = field(default_factory=list)
    error_median: float | None = None  # the baseline's replay error, when it was measured
    error_p90: float | None = None
    cautions: list[str] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    step_ms: list[float] = field(default_factory=list)
    exposed_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    dims: list[str] = field(default_factory=list)
    traffic_gb: dict[str, dict[str, float]] = field(default_factory=dict)
    traffic_dims: list[str] = field(default_factory=list)
    ep: list[EPLoad] = field(default_factory=list)
    grids: list[PlacementGrids] = field(default_factory=list)
    storage: list[StorageRow] = field(default_factory=list)
    scale: list[ScalePoint] = field(default_factory=list)
    notes: dict[str, list[str]] = field(default_factory=dict)
    not_modelled: list[Finding] = field(default_factory=list)


def whatif_data(result: WhatIfResult | None) -> WhatIfData | None:
    """A `tracekit.whatif.WhatIfResult` as plain columns: step and exposed time per scenario (the
    baseline first), inter-host bytes per dim, EP load per rank before and after, the rank -> host
    grids of placement scenarios, and north-south transfers. Nothing is recomputed: every figure
    is a field of the result, only averaged over steps and converted to ms and GB. A run the network
    model does not apply to (a CPU/gloo run) gives only the finding that says so, as `not_modelled`."""
    if result is None:
        return None
    if not result.scenarios:
        said = [c for c in result.cautions if c.kind == "cpu_backend"]
        return WhatIfData(not_modelled=said, topology=result.topology) if said else None
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
            ep.append(EPLoad(scenario=name, ranks=ranks, before_gb=before, after_gb=after,
                             imbalance=(s.ep_imbalance.before, s.ep_imbalance.after) if s.ep_imbalance else None,
                             a2a_ms=(s.a2a_ns.before / 1e6, s.a2a_ns.after / 1e6) if s.a2a_ns else None,
                             truncated=cut))
        if s.placement_before is not None and s.placement_after is not None:
            grids.append(PlacementGrids(scenario=name, before=_grid(s.placement_before),
                                        after=_grid(s.placement_after),
                                        moved=sorted(r for r in s.placement_after.slots
                                                     if s.placement_after.slots[r] != s.placement_before.slots.get(r))))
        if s.slowed is not None:
            worst = max(s.slowed, key=lambda x: x.scenario_ns - x.baseline_ns, default=None)
            transfers = (s.details or {}).get("transfer_ns") or {}
            ckpt = None if s.checkpoint_ns is None else s.checkpoint_ns / 1e6
            storage.append(StorageRow(
                scenario=name, checkpoint_ms=ckpt, transfer_ms={str(k): v / 1e6 for k, v in transfers.items()},
                network=(s.details or {}).get("network"), slowed=len(s.slowed),
                worst=None if worst is None else Slowest(
                    op=worst.op, dim=worst.dim, group=str(worst.group)[:MAX_NAME_CHARS], seq=worst.seq,
                    baseline_ms=worst.baseline_ns / 1e6, scenario_ms=worst.scenario_ns / 1e6),
                other_traffic=list((s.details or {}).get("other_traffic") or [])))
    labels = ["baseline"] + [f"{i}. {lab}" for i, lab in enumerate(scenario_labels(names[1:]), 1)]
    gantt = [ScenarioGantt(scenario=name, runs=[pipeline_gantt(s.schedule.baseline, "as traced (rebuilt)"),
                                                pipeline_gantt(s.schedule.scenario, "scenario")],
                           sm_share=s.schedule.sm_share)
             for name, s in scen.items() if s.schedule is not None]
    err = result.replay_error
    return WhatIfData(topology=str(result.topology), comparison=str(result.comparison), gantt=gantt,
                      error_median=None if err is None else err.median, error_p90=None if err is None else err.p90,
                      cautions=[str(f.text) for f in result.cautions if f.severity == "warning"],
                      names=names, labels=labels, step_ms=step_ms,
                      exposed_ms=exposed, dims=dims, traffic_gb=traffic, traffic_dims=traffic_dims,
                      ep=ep, grids=grids, storage=storage, scale=_scale_points(result, scen),
                      notes={name: [str(n) for n in s.notes] for name, s in scen.items()})


def _scale_points(result: WhatIfResult, scen: Mapping[str, Any]) -> list[ScalePoint]:
    """Step time (ms, mean over steps) against simulated GPUs: the traced size (the baseline) and
    each scale scenario, by GPUs; empty without a scale scenario."""
    points = [ScalePoint(scenario=name, gpus=int(s.simulated_gpus),
                         step_ms=float(np.mean(list(s.step_ns.values()))) / 1e6) for name, s in scen.items()
              if s.simulated_gpus is not UNSET and s.step_ns]
    if not points:
        return []
    traced = int((next(s for s in scen.values() if s.simulated_gpus is not UNSET).details or {}).get("traced_gpus", 0))
    base = ScalePoint(scenario="baseline", gpus=traced,
                      step_ms=float(np.mean(list(result.baseline_step_ns.values()))) / 1e6)
    return sorted([base, *points], key=lambda p: (p.gpus, p.scenario != "baseline"))


def _grid(placement: Placement) -> PlacementGrid:
    """A placement as cells: host row, GPU column, rank."""
    cells = sorted((h, g, r) for r, (h, g) in placement.slots.items())
    return PlacementGrid(hosts=[str(h)[:MAX_NAME_CHARS] for h in placement.hosts], gpus=placement.gpus_per_host,
                         host=[c[0] for c in cells], gpu=[c[1] for c in cells], rank=[c[2] for c in cells])


#: Chunks drawn per pipeline Gantt chart at most (the rest are left out, and the chart says so).
MAX_GANTT_CHUNKS = 4000


@dataclass(frozen=True)
class Gantt:
    """One pipeline as Gantt bars: per chunk its stage label, start and end (ms), kind, chunk label and
    exposed communication (ms); the stage labels, the span (ms), each stage's bubble (ms), and whether
    chunks were left out (`MAX_GANTT_CHUNKS`)."""

    title: str
    stage: list[str]
    left_ms: list[float]
    right_ms: list[float]
    kind: list[str]
    chunk: list[str]
    exposed_ms: list[float]
    stages: list[str]
    span_ms: float
    bubble_ms: list[float]
    truncated: bool


def pipeline_gantt(run: PipelineRun, title: str) -> Gantt:
    """One placed pipeline (`tracekit.whatif.schedule.PipelineRun`) as bars: per chunk its stage,
    start and end (ms), kind and label; per stage the bubble the result states."""
    placed = run.placed[:MAX_GANTT_CHUNKS]
    chunks = f", {run.chunks} chunks" if run.chunks > 1 else ""
    return Gantt(title=f"{title}: {run.name} ({run.stages} stages, {run.microbatches} micro-batches{chunks})",
                 stage=[f"stage {p.stage}" for p in placed], left_ms=[p.start_ns / 1e6 for p in placed],
                 right_ms=[p.end_ns / 1e6 for p in placed], kind=[p.kind for p in placed],
                 chunk=[p.chunks for p in placed], exposed_ms=[p.exposed_ns / 1e6 for p in placed],
                 stages=[f"stage {i}" for i in range(run.stages)], span_ms=run.span_ns / 1e6,
                 bubble_ms=[b / 1e6 for b in run.bubble_ns], truncated=len(run.placed) > len(placed))


def traced_pipeline_gantt(analysis: AnalysisResult) -> Gantt | None:
    """The traced schedule's compute blocks (`AnalysisResult.pp_schedule.blocks`) as Gantt bars in
    the shape of `pipeline_gantt`, ms from the first block; each stage's bubble is the analysis'
    `pp_bubbles` figure for that stage's rank and step (idle plus receive waits in its window)."""
    sched = analysis.pp_schedule
    if sched is None or not sched.blocks:
        return None
    blocks = sched.blocks[:MAX_GANTT_CHUNKS]
    t0 = min(b.start_ns for b in blocks)
    rank_of = {b.stage: b.rank for b in blocks}
    bubbles = pl.from_arrow(analysis.pp_bubbles)
    assert isinstance(bubbles, pl.DataFrame)
    bubble = {}
    for stage, rank in rank_of.items():
        row = bubbles.filter((pl.col("rank") == rank) & (pl.col("step") == sched.step)) if bubbles.height else bubbles
        bubble[stage] = float(row.get_column("bubble_ns")[0]) / 1e6 if row.height else float("nan")
    name = sched.name if sched.recognised else "unrecognised schedule"
    shape = f"{sched.microbatches} micro-batches" if sched.microbatches else "chunks not named"
    return Gantt(title=f"as traced in step {sched.step}: {name} ({sched.stages} stages, {shape})",
                 stage=[f"stage {b.stage}" for b in blocks], left_ms=[(b.start_ns - t0) / 1e6 for b in blocks],
                 right_ms=[(b.end_ns - t0) / 1e6 for b in blocks],
                 kind=["C" if "+" in b.chunks else b.chunks.rstrip("0123456789") or "C" for b in blocks],
                 chunk=[b.chunks for b in blocks], exposed_ms=[float("nan")] * len(blocks),
                 stages=[f"stage {i}" for i in range(sched.stages)],
                 span_ms=max(b.end_ns for b in blocks) / 1e6 - t0 / 1e6,
                 bubble_ms=[bubble.get(i, float("nan")) for i in range(sched.stages)],
                 truncated=len(sched.blocks) > len(blocks))
