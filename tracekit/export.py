"""Export a run as one Chrome-trace / Perfetto JSON file on the aligned clock.

Every rank is a process (pid = rank) and every lane a thread in it: compute streams first, then
communication streams, then CPU threads, then the rank's stalls. Each collective instance is
drawn as flow arrows from the participant the others waited for (the last to arrive, or the
sender of a send/recv) to every other participant. Replayed timelines, when given or stored by
`tracekit replay`, are extra processes, one per (topology, rank).

Times come from the library's clock alignment (`ranks.clock_offset_ns` of the prepared tables the
front door gives, `tracekit.workflows.export`); they are written in microseconds with three decimals (exact
nanoseconds) relative to the earliest event, which is recorded as `baseTimeNanoseconds` so a
Kineto reader gets the absolute aligned times back. Events are written one rank at a time, so
memory is bounded by the largest rank, not by the run.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from tracekit import __version__
from tracekit.analysis import frame
from tracekit.atomic import atomic_open
from tracekit.errors import TracekitError
from tracekit.store import Run

#: Replayed ranks are processes REPLAY_PID_BASE * (k + 1) + rank for the k-th topology.
REPLAY_PID_BASE = 1_000_000
#: Stored by `tracekit replay`: every topology's replayed timeline (see `replay_timelines`).
REPLAY_TIMELINES = "replay_timeline.parquet"
#: The Chrome-trace category of an event kind, when the source gave none (the Kineto reader maps
#: these back to the same kinds).
KIND_CAT = {"compute": "kernel", "comm": "kernel", "memcpy": "gpu_memcpy", "memset": "gpu_memset",
            "cpu_op": "cpu_op", "runtime": "cuda_runtime", "annotation": "user_annotation",
            "sync": "cuda_sync"}
STALL_CAT = "tracekit_stall"
REPLAY_CAT = "tracekit_replay"
FLOW_CAT = "tracekit_collective"
#: Flow ends sit this far inside their slices (or a quarter of a short slice): viewers convert
#: microseconds to nanoseconds in floating point, and an end exactly on a slice edge may bind to
#: the neighbour.
FLOW_INSET_NS = 1000


class ExportError(TracekitError):
    """The run cannot be exported (nothing to write, or the output cannot be written)."""


class ExportSummary(msgspec.Struct, kw_only=True):
    """What went into the file (counted while it is written)."""

    path: Path
    ranks: int = 0
    slices: int = 0
    flows: int = 0
    overlapping: int = 0  # slices moved to "<lane> (overlap)" threads (they overlap without nesting)
    flows_dropped: int = 0  # participants whose slice ended before the source's started
    stalls: int = 0
    replay: dict[str, int] = msgspec.field(default_factory=dict)  # topology -> replayed slices
    skipped: Counter[str] = msgspec.field(default_factory=Counter)  # reason -> events left out
    base_ns: int = 0
    notes: list[str] = msgspec.field(default_factory=list)  # stored results left out (another generation)


def export_chrome(run: Run | str | os.PathLike[str], out: str | os.PathLike[str], *, ranks: pa.Table,
                  collectives: pa.Table, replay: Any | None = None, flows: bool = True, stalls: bool = True,
                  include_replay: bool = True) -> ExportSummary:
    """Write the run as one Chrome-trace JSON (gzip when `out` ends in .gz) for Perfetto.

    `ranks` (with clock offsets) and `collectives` (with instances) are the prepared tables
    (`tracekit.workflows.export` gives them). `replay` is a `ReplayResult` whose timelines become
    extra processes; without it, the timelines `tracekit replay` stored in the run are used (unless
    `include_replay` is False). The file is written under a temporary name and renamed, so a
    failure leaves no half file.
    """
    run = run if isinstance(run, Run) else Run(run)
    out = Path(out)
    ranks, coll = _aligned(ranks, collectives)
    offsets = {int(r): int(o or 0) for r, o in ranks.select("rank", "clock_offset_ns").iter_rows()}
    hosts = {int(r): h for r, h in ranks.select("rank", "host").iter_rows() if h}
    event_ranks = sorted({Run.rank_of(p) for p in run.event_files()})
    all_ranks = sorted(set(event_ranks) | set(offsets))
    timelines = _timelines(run, replay) if include_replay else {}
    if not run.has("events") and not timelines:
        raise ExportError(f"{run.path}: nothing to export: {_why_untimed(run)}")
    if not all_ranks:
        raise ExportError(f"{run.path}: the run has no ranks to export")
    parts = _participants(coll, ranks) if (flows or stalls) else _empty_parts()
    base = _base_ns(run, offsets, timelines, parts)
    summary = ExportSummary(path=out, ranks=len(all_ranks), base_ns=base, notes=list(run.stale))

    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        with atomic_open(out, "wb") as raw:
            stream: io.TextIOBase
            if out.suffix == ".gz":
                stream = io.TextIOWrapper(gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6, mtime=0),
                                          encoding="utf-8")
            else:
                stream = io.TextIOWrapper(raw, encoding="utf-8")
            with stream:
                _write(stream, run, all_ranks, offsets, hosts, coll, parts, timelines, base, summary,
                       flows=flows, stalls=stalls)
    except OSError as exc:
        raise ExportError(f"{out}: cannot write ({exc.strerror or exc})") from exc
    return summary


#: Why a source format gives no timeline, for the message of a run with nothing to export.
UNTIMED_FORMATS = {
    "nccl_log": "NCCL logs give the collective calls and their order, not their start times or durations",
    "flight_recorder": "Flight Recorder dumps give each rank's last collectives, not a timeline",
    "nccl_tests": "nccl-tests output is a table of sizes and bandwidths, not a timeline",
}


def _why_untimed(run: Run) -> str:
    """ "the run holds no timed events (NCCL logs give ...); `tracekit info` ... reads them"."""
    formats = sorted({s.format for s in run.manifest.sources if not s.error and s.format})
    reasons = [UNTIMED_FORMATS[f] for f in formats if f in UNTIMED_FORMATS]
    others = [f for f in formats if f not in UNTIMED_FORMATS]
    if others:
        reasons.append(f"{', '.join(others)} sources hold counters or topology, not timed events")
    commands = "`tracekit info`, `tracekit analyze` and `tracekit hang`" if "nccl_tests" not in formats else (
        "`tracekit info`, `tracekit analyze` and `tracekit replay --nccl-tests`")
    return (f"the run holds no timed events and no replayed timeline ({'; '.join(reasons) or 'no source'}); "
            f"{commands} read what it holds, and a Kineto trace of the same job gives the timeline")


# ------------------------------------------------------------------------------------------
# Inputs


def _aligned(ranks: pa.Table, collectives: pa.Table) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The prepared ranks (one row per rank) and collectives as frames."""
    coll = frame(collectives, "collectives")
    ranks_df = frame(ranks, "ranks").unique("rank", keep="first", maintain_order=True).with_columns(
        pl.col("rank").cast(pl.Int32))
    return ranks_df, coll


def _participants(coll: pl.DataFrame, ranks: pl.DataFrame) -> pl.DataFrame:
    """Per (instance, rank) arrival and wait on the common clock (the stall analysis), plus the
    rank every other participant waited for: the sender of a send/recv, else the last to arrive."""
    from tracekit.analysis import stalls as stall_analysis

    if coll.height == 0:
        return _empty_parts()
    parts = stall_analysis.participants(coll, ranks)
    if parts.height == 0:
        return _empty_parts()
    source = stall_analysis.waited_for(parts)
    ids = coll.select("coll_id", "instance", pl.col("rank").cast(pl.Int32)).filter(
        pl.col("instance").is_not_null())
    return (parts.join(source, on="instance", how="left")
            .join(ids.unique(["instance", "rank"], keep="first"), on=["instance", "rank"], how="left")
            .select("instance", "rank", "coll_id", "group", "seq", "op", "step", "arrive_ns", "wait_ns", "source_rank",
                    "last_rank"))


def _empty_parts() -> pl.DataFrame:
    return pl.DataFrame(schema={"instance": pl.Int64, "rank": pl.Int32, "coll_id": pl.Int64, "group": pl.String,
                                "seq": pl.Int64, "op": pl.String, "step": pl.Int32, "arrive_ns": pl.Int64,
                                "wait_ns": pl.Int64, "source_rank": pl.Int32, "last_rank": pl.Int32})


def _timelines(run: Run, replay: Any | None) -> dict[str, pl.DataFrame]:
    """Topology -> replayed timeline (rank, lane, kind, ts_ns, dur_ns, traced_ts_ns, traced_dur_ns)."""
    out: dict[str, pl.DataFrame] = {}
    if replay is not None:
        for r in replay.results:
            if r.timeline is not None and r.timeline.num_rows:
                out[r.topology] = _plain(pl.from_arrow(r.timeline))
        return out
    path = run.result_path(REPLAY_TIMELINES)
    if path is None:
        return out
    try:
        df = _plain(pl.from_arrow(pq.read_table(path)))
    except (OSError, pa.ArrowException) as exc:
        raise ExportError(f"{path}: unreadable replay timeline ({exc})") from exc
    for name in df.get_column("topology").unique(maintain_order=True).to_list():
        out[str(name)] = df.filter(pl.col("topology") == name).drop("topology")
    return out


def replay_timelines(replay: Any) -> pa.Table | None:
    """Every topology's replayed timeline in one table (a `topology` column added), as
    `tracekit replay` stores it in RUN/results/ for `export`; None when there is none."""
    tables = [r.timeline.append_column("topology", pa.array([r.topology] * r.timeline.num_rows, pa.string()))
              for r in replay.results if r.timeline is not None]
    return pa.concat_tables(tables, promote_options="permissive") if tables else None


def _plain(df: Any) -> pl.DataFrame:
    assert isinstance(df, pl.DataFrame)
    return df.with_columns(pl.col(pl.Categorical, pl.Enum).cast(pl.String))


def _base_ns(run: Run, offsets: Mapping[int, int], timelines: Mapping[str, pl.DataFrame],
             parts: pl.DataFrame) -> int:
    """The earliest time in the file on the common clock: every time is written relative to it."""
    cands: list[int] = []
    if run.has("events"):
        off = pl.DataFrame({"rank": list(offsets), "_off": list(offsets.values())},
                           schema={"rank": pl.Int32, "_off": pl.Int64}).lazy()
        lo = (run.scan("events").select(pl.col("rank").cast(pl.Int32), "ts_ns")
              .join(off, on="rank", how="left")
              .select((pl.col("ts_ns") + pl.col("_off").fill_null(0)).min()).collect().item())
        if lo is not None:
            cands.append(int(lo))
    for df in timelines.values():
        if df.height:
            cands.append(int(df.get_column("ts_ns").min()))  # type: ignore[arg-type]
    if parts.height:
        cands.append(int(parts.get_column("arrive_ns").min()))  # type: ignore[arg-type]
    return min(cands) if cands else 0


# ------------------------------------------------------------------------------------------
# Writing


def _write(fh: io.TextIOBase, run: Run, all_ranks: list[int], offsets: Mapping[int, int], hosts: Mapping[int, str],
           coll: pl.DataFrame, parts: pl.DataFrame, timelines: Mapping[str, pl.DataFrame], base: int,
           summary: ExportSummary, *, flows: bool, stalls: bool) -> None:
    other = {"exporter": f"tracekit {__version__}", "run": str(run.path), "clock": "aligned (ranks.clock_offset_ns)",
             "replay_pid_base": REPLAY_PID_BASE}
    fh.write('{"displayTimeUnit":"ns","baseTimeNanoseconds":' + str(base) + ',"otherData":'
             + json.dumps(other, sort_keys=True) + ',"traceEvents":[\n')
    first = True

    def emit(lines: list[str]) -> None:
        nonlocal first
        if not lines:
            return
        if not first:
            fh.write(",\n")
        fh.write(",\n".join(lines))
        first = False

    coll_info = _coll_info(coll, parts)
    by_rank_tl = {name: _split_by_rank(df) for name, df in timelines.items()}
    part_by_rank = _split_by_rank(parts)
    endpoints: list[pl.DataFrame] = []
    lanes_of: dict[int, list[str]] = {}
    next_tid = 1  # tids are unique in the whole file (one thread per (process, lane))
    for rank in all_ranks:
        ev = _rank_events(run, rank, offsets.get(rank, 0), summary)
        lanes = lanes_of[rank] = _lane_order(ev)
        ev = _with_levels(ev, "t", "dur_ns")
        threads = _threads_of(ev, lanes)
        tids = {name: next_tid + i for i, (_, _, name) in enumerate(threads)}
        next_tid += len(threads)
        host = hosts.get(rank)
        emit(_process_meta(rank, f"rank {rank}" + (f" ({host})" if host else ""), rank, tids))
        if ev.height:
            summary.overlapping += int((ev.get_column("_level") > 0).sum())
            key = pl.DataFrame({"lane": [ln for ln, _, _ in threads], "_level": [lv for _, lv, _ in threads],
                                "tid": [tids[name] for _, _, name in threads]},
                               schema={"lane": pl.String, "_level": pl.Int64, "tid": pl.Int64})
            ev = ev.with_columns(pl.col("lane").fill_null("")).join(key, on=["lane", "_level"], how="left",
                                                                    maintain_order="left")
            emit(_slices(ev, rank, base, coll_info))
            summary.slices += ev.height
            if flows:
                endpoints.append(_endpoints(ev, rank, coll))
        if stalls:
            mine = part_by_rank.get(rank)
            if mine is not None:
                lines, n, used = _stall_slices(mine, rank, next_tid, base)
                emit(lines)
                summary.stalls += n
                next_tid += used
    if flows and endpoints:
        lines, summary.flows, summary.flows_dropped = _flows(pl.concat(endpoints), parts, base)
        emit(lines)
    for k, (name, per_rank) in enumerate(by_rank_tl.items()):
        count = 0
        for rank in sorted(per_rank):
            pid = REPLAY_PID_BASE * (k + 1) + rank
            df, tids = _named_timeline(run, per_rank[rank], rank, offsets.get(rank, 0), lanes_of.get(rank, []),
                                       next_tid)
            next_tid += len(tids)
            emit(_process_meta(pid, f"replay {name}: rank {rank}", pid, tids))
            emit(_replay_slices(df, pid, base, name))
            count += df.height
        summary.replay[name] = count
    fh.write("\n]}\n")


def _split_by_rank(df: pl.DataFrame) -> dict[int, pl.DataFrame]:
    if df.height == 0:
        return {}
    return {int(k[0]): v for k, v in df.partition_by("rank", as_dict=True, maintain_order=True).items()}


def _rank_events(run: Run, rank: int, offset: int, summary: ExportSummary) -> pl.DataFrame:
    """One rank's events on the common clock (ts_ns + offset), those without a time counted."""
    table = run.events(ranks=[rank])
    df = _plain(pl.from_arrow(table))
    if df.height == 0:
        return df.with_columns(pl.lit(None, pl.Int64).alias("t"))
    missing = df.get_column("ts_ns").null_count()
    if missing:
        summary.skipped["no_timestamp"] += missing
        df = df.filter(pl.col("ts_ns").is_not_null())
    return df.with_columns((pl.col("ts_ns") + offset).alias("t"),
                           pl.col("dur_ns").fill_null(0).clip(lower_bound=0).alias("dur_ns"))


def _lane_order(ev: pl.DataFrame) -> list[str]:
    """Lanes in display order: GPU compute streams, GPU communication streams, other GPU lanes
    (copies, syncs), CPU threads, then anything else; numbers in names sort numerically."""
    if ev.height == 0:
        return []
    stats = (ev.group_by("lane").agg((pl.col("kind") == "comm").mean().alias("comm"),
                                     (pl.col("kind") == "compute").mean().alias("compute"))
             .with_columns(pl.col("lane").fill_null("")))

    def key(row: tuple[str, float, float]) -> tuple[int, list[Any]]:
        lane, comm, compute = row
        if lane.startswith("gpu"):
            cls = 0 if compute >= max(comm, 1e-12) else 1 if comm > 0 else 2
        else:
            cls = 3 if lane.startswith("cpu") else 4
        natural = [int(p) if p.isdigit() else p for p in re.split(r"(-?\d+)", lane) if p]
        return cls, [(0, p, "") if isinstance(p, int) else (1, 0, p) for p in natural]

    return [row[0] for row in sorted(stats.iter_rows(), key=key)]


def _with_levels(df: pl.DataFrame, start: str, dur: str) -> pl.DataFrame:
    """Adds `_level`: per lane, the overflow thread (0: the lane's own) that keeps every thread
    properly nested; viewers drop a slice that overlaps another without nesting in it."""
    if df.height == 0:
        return df.with_columns(pl.lit(0, pl.Int64).alias("_level"))
    level = np.zeros(df.height, np.int64)
    idx = df.select(pl.col("lane").fill_null(""), pl.int_range(pl.len(), dtype=pl.Int64).alias("_i"),
                    pl.col(start).alias("_s"), (pl.col(start) + pl.col(dur)).alias("_e"))
    for _, part in idx.group_by("lane"):
        level[part.get_column("_i").to_numpy()] = nesting_levels(part.get_column("_s").to_numpy(),
                                                                  part.get_column("_e").to_numpy())
    return df.with_columns(pl.Series("_level", level))


def nesting_levels(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per slice of one thread, the level it is drawn on so that no level holds two slices that
    overlap without one containing the other: level 0 keeps every slice that nests in, or comes
    after, the slices kept before it (longest first at equal starts); the rest go through the same
    rule on level 1, and so on."""
    level = np.zeros(start.size, np.int64)
    order = np.lexsort((-end, start))
    s, e = start[order], end[order]
    if s.size < 2 or bool((s[1:] >= np.maximum.accumulate(e)[:-1]).all()):
        return level  # nothing overlaps at all (the usual GPU stream)
    pending = list(range(s.size))
    lv = 0
    while pending:
        stack: list[int] = []
        moved = []
        for i in pending:
            while stack and stack[-1] <= s[i]:
                stack.pop()
            if stack and e[i] > stack[-1]:
                moved.append(i)
                continue
            level[order[i]] = lv
            stack.append(int(e[i]))
        pending = moved
        lv += 1
    return level


def _threads_of(ev: pl.DataFrame, lanes: list[str]) -> list[tuple[str, int, str]]:
    """(lane, level, thread name) in display order: each lane, then its overflow threads."""
    if ev.height == 0:
        return [(lane, 0, lane) for lane in lanes]
    levels: dict[str, list[int]] = {}
    for lane, lv in ev.select(pl.col("lane").fill_null(""), "_level").unique().sort("_level").iter_rows():
        levels.setdefault(lane, []).append(lv)
    out = []
    for lane in lanes:
        for lv in levels.get(lane, [0]):
            out.append((lane, lv, lane if lv == 0 else f"{lane} (overlap)" if lv == 1 else f"{lane} (overlap {lv})"))
    return out


def _process_meta(pid: int, name: str, sort_index: int, tids: Mapping[str, int]) -> list[str]:
    lines = [_json({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}}),
             _json({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": sort_index}})]
    for lane, tid in tids.items():
        lines.append(_json({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": lane}}))
        lines.append(_json({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                            "args": {"sort_index": tid}}))
    return lines


def _json(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def _us(expr: pl.Expr) -> pl.Expr:
    """Nanoseconds as exact microsecond text with three decimals (no float rounding)."""
    sign = pl.when(expr < 0).then(pl.lit("-")).otherwise(pl.lit(""))
    a = expr.abs()
    return pl.concat_str([sign, (a // 1000).cast(pl.String), pl.lit("."),
                          (a % 1000).cast(pl.String).str.zfill(3)])


def _quoted(col: str) -> pl.Expr:
    """A string column as JSON string literals (escaped; null -> "")."""
    return pl.col(col).fill_null("").map_batches(
        lambda s: s.replace_strict({v: json.dumps(v, ensure_ascii=False) for v in s.unique().to_list()},
                                   return_dtype=pl.String), return_dtype=pl.String)


def _coll_info(coll: pl.DataFrame, parts: pl.DataFrame) -> pl.DataFrame:
    """Per coll_id, the args drawn on its events (JSON object text)."""
    if coll.height == 0:
        return pl.DataFrame(schema={"coll_id": pl.Int64, "_args": pl.String})
    c = coll.select("coll_id", "instance", "group", "seq", "op", "dim", "in_bytes", "out_bytes", "nranks")
    if parts.height:
        c = c.join(parts.select("coll_id", "wait_ns").drop_nulls("coll_id").unique("coll_id"), on="coll_id",
                   how="left")
    else:
        c = c.with_columns(pl.lit(None, pl.Int64).alias("wait_ns"))
    return c.select("coll_id", pl.struct("instance", "group", "seq", "op", "dim", "in_bytes", "out_bytes",
                                         "nranks", "wait_ns").struct.json_encode().alias("_args"))


def _slices(ev: pl.DataFrame, pid: int, base: int, coll_info: pl.DataFrame) -> list[str]:
    cat = pl.coalesce(pl.col("cat"), pl.col("kind").replace_strict(KIND_CAT, default="tracekit_event",
                                                                    return_dtype=pl.String))
    df = ev.with_columns(cat.alias("cat"))
    if coll_info.height and ev.get_column("coll_id").null_count() < ev.height:
        df = df.join(coll_info, on="coll_id", how="left")
    else:
        df = df.with_columns(pl.lit(None, pl.String).alias("_args"))
    args = pl.when(pl.col("_args").is_not_null()).then(pl.concat_str([pl.lit(',"args":'), pl.col("_args")])
                                                      ).otherwise(pl.lit(""))
    line = pl.concat_str([
        pl.lit('{"ph":"X","pid":' + str(pid) + ',"tid":'), pl.col("tid").cast(pl.String),
        pl.lit(',"ts":'), _us(pl.col("t") - base), pl.lit(',"dur":'), _us(pl.col("dur_ns")),
        pl.lit(',"name":'), _quoted("name"), pl.lit(',"cat":'), _quoted("cat"), args, pl.lit("}")])
    return df.select(line).to_series().to_list()


def _endpoints(ev: pl.DataFrame, rank: int, coll: pl.DataFrame) -> pl.DataFrame:
    """Per collective call of this rank, the slice its flow arrows attach to: the earliest
    communication event linked to the call (any linked event when none is comm)."""
    linked = ev.filter(pl.col("coll_id").is_not_null())
    if linked.height == 0:
        return pl.DataFrame(schema={"coll_id": pl.Int64, "rank": pl.Int32, "tid": pl.Int64, "lo": pl.Int64,
                                    "hi": pl.Int64})
    inset = pl.min_horizontal(pl.col("dur_ns") // 4, pl.lit(FLOW_INSET_NS))
    return (linked.sort([pl.col("kind") != "comm", pl.col("t")])
            .unique("coll_id", keep="first", maintain_order=True)
            .select("coll_id", pl.lit(rank, pl.Int32).alias("rank"), "tid",
                    (pl.col("t") + inset).alias("lo"), (pl.col("t") + pl.col("dur_ns") - inset).alias("hi")))


def _flows(endpoints: pl.DataFrame, parts: pl.DataFrame, base: int) -> tuple[list[str], int, int]:
    """Arrows from the participant the instance waited for to every other participant (flow v1:
    "s" then "f", both bound to the enclosing slice). The arrow leaves just after the source's
    slice starts and lands at the same time on the other's slice (later, when that one started
    later), so it never points back in time; a participant whose slice ended before the source
    started cannot be reached that way and gets no arrow. Returns lines, arrows, arrows dropped."""
    ep = parts.select("instance", "rank", "coll_id", "source_rank", "group", "op", "seq").join(
        endpoints.select("coll_id", "rank", "tid", "lo", "hi"), on=["coll_id", "rank"], how="inner")
    src = ep.filter(pl.col("rank") == pl.col("source_rank")).select(
        "instance", pl.col("rank").alias("s_rank"), pl.col("tid").alias("s_tid"), pl.col("lo").alias("s_ts"))
    pairs = (ep.filter(pl.col("rank") != pl.col("source_rank")).join(src, on="instance", how="inner")
             .with_columns(pl.max_horizontal("s_ts", "lo").alias("f_ts"))
             .sort("instance", "rank"))
    dropped = pairs.filter(pl.col("f_ts") > pl.col("hi")).height
    pairs = pairs.filter(pl.col("f_ts") <= pl.col("hi"))
    if pairs.height == 0:
        return [], 0, dropped
    pairs = pairs.with_row_index("fid", offset=1)
    name = _quoted("_fname")
    pairs = pairs.with_columns(pl.concat_str([pl.col("op"), pl.lit(" "), pl.col("group").fill_null("?"),
                                              pl.lit("#"), pl.col("seq").cast(pl.String).fill_null("?")])
                               .alias("_fname"))
    common = [pl.lit(',"cat":"' + FLOW_CAT + '","name":'), name, pl.lit(',"id":'), pl.col("fid").cast(pl.String)]
    start = pl.concat_str([pl.lit('{"ph":"s","bp":"e","pid":'), pl.col("s_rank").cast(pl.String),
                           pl.lit(',"tid":'), pl.col("s_tid").cast(pl.String),
                           pl.lit(',"ts":'), _us(pl.col("s_ts") - base), *common, pl.lit("}")])
    finish = pl.concat_str([pl.lit('{"ph":"f","bp":"e","pid":'), pl.col("rank").cast(pl.String),
                            pl.lit(',"tid":'), pl.col("tid").cast(pl.String),
                            pl.lit(',"ts":'), _us(pl.col("f_ts") - base), *common, pl.lit("}")])
    lines = pairs.select(pl.concat_list(start, finish).alias("l")).explode("l").to_series().to_list()
    return lines, pairs.height, dropped


def _stall_slices(parts: pl.DataFrame, pid: int, first_tid: int, base: int) -> tuple[list[str], int, int]:
    """One slice per wait (arrival to the last arrival), on stall threads after the rank's lanes;
    overlapping waits (concurrent collectives) go on further stall threads. Returns the lines,
    the slice count and the number of threads used."""
    w = parts.filter(pl.col("wait_ns") > 0).sort("arrive_ns", "instance")
    if w.height == 0:
        return [], 0, 0
    starts = w.get_column("arrive_ns").to_list()
    ends = (w.get_column("arrive_ns") + w.get_column("wait_ns")).to_list()
    levels = _levels(starts, ends)
    w = w.with_columns(pl.Series("tid", [first_tid + lv for lv in levels], pl.Int64))
    lines = []
    for lv in range(max(levels) + 1):
        tid = first_tid + lv
        label = "stalls" if lv == 0 else f"stalls ({lv + 1})"
        lines.append(_json({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": label}}))
        lines.append(_json({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                            "args": {"sort_index": tid}}))
    w = w.with_columns(pl.concat_str([pl.lit("wait "), pl.col("op").fill_null("?"), pl.lit(" for rank "),
                                      pl.col("last_rank").cast(pl.String).fill_null("?")]).alias("_name"),
                       pl.struct("instance", "group", "seq", "op", "step", "wait_ns",
                                 pl.col("last_rank").alias("waited_for")).struct.json_encode().alias("_args"))
    line = pl.concat_str([
        pl.lit('{"ph":"X","pid":' + str(pid) + ',"tid":'), pl.col("tid").cast(pl.String),
        pl.lit(',"ts":'), _us(pl.col("arrive_ns") - base), pl.lit(',"dur":'), _us(pl.col("wait_ns")),
        pl.lit(',"name":'), _quoted("_name"), pl.lit(',"cat":"' + STALL_CAT + '","args":'), pl.col("_args"),
        pl.lit("}")])
    lines.extend(w.select(line).to_series().to_list())
    return lines, w.height, max(levels) + 1


def _levels(starts: list[int], ends: list[int]) -> list[int]:
    """Greedy interval partitioning (inputs sorted by start): the first level free at each start."""
    free_at: list[int] = []
    out = []
    for s, e in zip(starts, ends, strict=True):
        for lv, busy_until in enumerate(free_at):
            if busy_until <= s:
                free_at[lv] = e
                out.append(lv)
                break
        else:
            free_at.append(e)
            out.append(len(free_at) - 1)
    return out


def _named_timeline(run: Run, tl: pl.DataFrame, rank: int, offset: int, lanes: list[str], first_tid: int
                    ) -> tuple[pl.DataFrame, dict[str, int]]:
    """A rank's replayed events named after the traced events they replay (matched on lane and
    traced start and duration; the kind when none matches)."""
    ev = _plain(pl.from_arrow(run.events(ranks=[rank]).select(["lane", "name", "ts_ns", "dur_ns"])))
    names = (ev.filter(pl.col("ts_ns").is_not_null())
             .select(pl.col("lane").fill_null(""), "name", (pl.col("ts_ns") + offset).alias("traced_ts_ns"),
                     pl.col("dur_ns").fill_null(0).clip(lower_bound=0).alias("traced_dur_ns"))
             .unique(["lane", "traced_ts_ns", "traced_dur_ns"], keep="first", maintain_order=True))
    df = (tl.with_columns(pl.col("lane").fill_null(""), pl.col("traced_ts_ns").cast(pl.Int64),
                          pl.col("traced_dur_ns").cast(pl.Int64))
          .join(names, on=["lane", "traced_ts_ns", "traced_dur_ns"], how="left", maintain_order="left")
          .with_columns(pl.coalesce("name", "kind").alias("name")))
    present = set(df.get_column("lane").to_list())
    ordered = [lane for lane in lanes if lane in present] + sorted(present - set(lanes))
    df = _with_levels(df.with_columns(pl.col("dur_ns").clip(lower_bound=0)), "ts_ns", "dur_ns")
    threads = _threads_of(df, ordered)
    out = {name: first_tid + i for i, (_, _, name) in enumerate(threads)}
    key = pl.DataFrame({"lane": [ln for ln, _, _ in threads], "_level": [lv for _, lv, _ in threads],
                        "tid": [out[name] for _, _, name in threads]},
                       schema={"lane": pl.String, "_level": pl.Int64, "tid": pl.Int64})
    df = df.join(key, on=["lane", "_level"], how="left", maintain_order="left")
    return df, out


def _replay_slices(df: pl.DataFrame, pid: int, base: int, topology: str) -> list[str]:
    if df.height == 0:
        return []
    line = pl.concat_str([
        pl.lit('{"ph":"X","pid":' + str(pid) + ',"tid":'), pl.col("tid").cast(pl.String),
        pl.lit(',"ts":'), _us(pl.col("ts_ns") - base), pl.lit(',"dur":'), _us(pl.col("dur_ns").clip(lower_bound=0)),
        pl.lit(',"name":'), _quoted("name"), pl.lit(',"cat":"' + REPLAY_CAT + '","args":{"kind":'), _quoted("kind"),
        pl.lit(',"traced_ts_us":'), _us(pl.col("traced_ts_ns") - base),
        pl.lit(',"traced_dur_us":'), _us(pl.col("traced_dur_ns")), pl.lit("}}")])
    return df.select(line).to_series().to_list()

