"""The traced pipeline schedule: each PP stage's chunks, read from its PP sends and receives and
the compute between them, and the schedule's name when the order is a known one.

A stage's trace is read as tokens: a receive (at its end: the chunk that needs it cannot start
before), a send (at the end of the compute before it: it is issued when its chunk is done), and
a compute block (compute between two transfers). Each known schedule (`tracekit.pipeline`), for
the stages seen and every micro-batch and chunk count the transfer counts allow, gives the
tokens it would leave; the first schedule whose tokens equal the traced ones on every stage
names the run. Transfers posted together (no compute between them) are compared as a set, and
the compute before the first transfer and after the last (the step's set-up, gradient
all-reduce and optimizer) is left out of the comparison.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from tracekit.analysis import breakdown
from tracekit.analysis._frames import frame
from tracekit.analysis.pp import pp_chains
from tracekit.pipeline import (
    BACKWARD,
    FORWARD,
    INPUT_GRAD,
    SCHEDULES,
    WEIGHT_GRAD,
    Plan,
    ScheduleError,
    plan,
)
from tracekit.results import Result

UNRECOGNISED = "unrecognised"
COMPUTE = "C"
#: A chunk kind's compute as a share of the forward's when the trace cannot tell them apart
#: (the convention of DualPipe's figure and of Megatron-LM's cost model: B = 2F, W = B/2).
DEFAULT_RATIO = {FORWARD: 1.0, BACKWARD: 2.0, INPUT_GRAD: 1.0, WEIGHT_GRAD: 1.0}
MAX_CHUNKS = 4
#: Plans of more chunks than this (micro-batches x stages x chunks) are not compared with the trace.
MAX_PLAN_CHUNKS = 200_000
#: A compute block below this share of the pipeline's largest is no chunk (a buffer allocation).
NEGLIGIBLE_BLOCK = 0.01


class StageCosts(Result, frozen=True, kw_only=True):
    """One stage's mean traced time per chunk kind: compute, and communication inside (per dim)."""

    stage: int
    rank: int
    compute_ns: dict[str, float]
    comm_ns: dict[str, dict[str, float]]
    measured: tuple[str, ...]  # kinds measured apart; the others split by DEFAULT_RATIO


class TracedBlock(Result, frozen=True, kw_only=True):
    """One compute block between two transfers of a stage, on the run's common clock, and the
    chunks the named schedule runs in it ("F0+B0"; "compute" when unrecognised)."""

    stage: int
    rank: int
    start_ns: int
    end_ns: int
    chunks: str


class ScheduleShape(Result, frozen=True, kw_only=True):
    """A traced schedule's name and shape: stages, micro-batches and chunks per stage (None: not seen)."""

    name: str
    stages: int
    microbatches: int | None
    chunks: int | None


class TracedSchedule(Result, frozen=True, kw_only=True):
    """The pipeline schedule read from the trace (see the module doc).

    `name` is one of `tracekit.pipeline.SCHEDULES` or "unrecognised"; `also` the other names
    whose chunk orders leave the same trace (e.g. GPipe and 1F1B with one micro-batch); `seen`
    says, in words, what the trace showed; `stage_ranks` each stage's ranks (stage 0 first)."""

    name: str
    stages: int
    microbatches: int | None
    chunks: int | None
    step: int | None
    stage_ranks: tuple[tuple[int, ...], ...]
    seen: str
    also: tuple[str, ...] = ()
    tokens: tuple[tuple[str, ...], ...] = ()
    costs: tuple[StageCosts, ...] = ()
    blocks: tuple[TracedBlock, ...] = ()  # the traced compute blocks of the first pipeline, for the Gantt

    def shape(self) -> ScheduleShape:
        """What `analyze --json` (`pp_schedule`) and the schedule what-if report of it."""
        return ScheduleShape(name=self.name, stages=self.stages, microbatches=self.microbatches, chunks=self.chunks)

    @property
    def recognised(self) -> bool:
        return self.name != UNRECOGNISED


@dataclass
class _Stage:
    rank: int
    tokens: list[str] = field(default_factory=list)
    blocks: list[tuple[int, int]] = field(default_factory=list)  # compute block windows (ns), by token order
    busy: list[float] = field(default_factory=list)  # each block's compute (union of its intervals)
    first_mark: int | None = None  # the first transfer's mark: the end of the compute before it

    def without_blocks_below(self, threshold: float) -> _Stage:
        """The tokens with compute blocks shorter than `threshold` left out (buffer allocations
        between two transfers are not a chunk)."""
        out = _Stage(self.rank, first_mark=self.first_mark)
        k = 0
        for tok in self.tokens:
            if tok != COMPUTE:
                out.tokens.append(tok)
                continue
            window, busy = self.blocks[k], self.busy[k]
            k += 1
            if busy < threshold:
                continue
            if out.tokens and out.tokens[-1] == COMPUTE:
                out.blocks[-1] = (out.blocks[-1][0], window[1])
                out.busy[-1] += busy
                continue
            out.tokens.append(tok)
            out.blocks.append(window)
            out.busy.append(busy)
        return out


def pp_transfers(coll: pl.DataFrame, offsets: Mapping[int, int]) -> pl.DataFrame:
    """Every PP send/recv call as a transfer: src, dst, t (its start on the common clock)."""
    pp = coll.filter((pl.col("dim") == "PP") & pl.col("peer").is_not_null() & pl.col("op").is_in(["send", "recv"])
                     & pl.col("ts_ns").is_not_null())
    off = pl.col("rank").replace_strict(dict(offsets), default=0, return_dtype=pl.Int64) if offsets else pl.lit(0)
    send = pl.col("op") == "send"
    return pp.select(pl.when(send).then(pl.col("rank")).otherwise(pl.col("peer")).cast(pl.Int64).alias("src"),
                     pl.when(send).then(pl.col("peer")).otherwise(pl.col("rank")).cast(pl.Int64).alias("dst"),
                     (pl.col("ts_ns") + off).alias("t"))


def read_schedule(tables: Mapping[str, Any], *, step: int | None = None) -> TracedSchedule | None:
    """The traced schedule of one step (default: the first step with PP transfers on every stage),
    or None when the run has no pipeline (no PP transfers)."""
    coll = frame(tables.get("collectives"), "collectives")
    if coll.height == 0 or "dim" not in coll.columns:
        return None
    chains = pp_chains(pp_transfers(coll, _offsets(tables.get("ranks"))))
    if not chains:
        return None
    return _read(tables, coll, chains, step)


def _read(tables: Mapping[str, Any], coll: pl.DataFrame, chains: list[list[int]], step: int | None
          ) -> TracedSchedule:
    stages = max(len(c) for c in chains)
    chain = next(c for c in chains if len(c) == stages)
    stage_of = {r: i for c in chains if len(c) == stages for i, r in enumerate(c)}
    stage_ranks = tuple(tuple(sorted(r for r, s in stage_of.items() if s == i)) for i in range(stages))
    pp = coll.filter((pl.col("dim") == "PP") & pl.col("rank").is_in(chain) & pl.col("peer").is_in(chain)
                     & pl.col("ts_ns").is_not_null() & pl.col("dur_ns").is_not_null())
    steps = sorted(x for x in pp.get_column("step").unique().to_list() if x is not None) if "step" in pp.columns else []
    if step is None:
        full = [s for s in steps if pp.filter(pl.col("step") == s).get_column("rank").n_unique() == stages]
        step = full[0] if full else (steps[0] if steps else None)
    if step is not None:
        pp = pp.filter(pl.col("step") == step)
    ev = _events_of(tables.get("events"), chain)
    compute, issued = _compute_and_launches(ev, coll)
    local = {r: i for i, r in enumerate(chain)}
    traced = [_tokens(r, local, pp, compute, issued) for r in chain]
    largest = max((b for t in traced for b in t.busy), default=0.0)
    traced = [t.without_blocks_below(NEGLIGIBLE_BLOCK * largest) for t in traced]
    tokens = tuple(tuple(_canonical(s.tokens)) for s in traced)
    counts = _counts(pp, chain)
    seen = _describe(tokens)
    matches: list[Plan] = []
    for candidate in _candidates(stages, counts):
        expected = tuple(tuple(t for t, _ in _canonical_blocks(_expected(candidate, d))) for d in range(stages))
        if expected == tokens:
            matches.append(candidate)
    offsets = _offsets(tables.get("ranks"))
    if not matches:
        return TracedSchedule(name=UNRECOGNISED, stages=stages, microbatches=None, chunks=None, step=step,
                              stage_ranks=stage_ranks, seen=seen, tokens=tokens,
                              blocks=_traced_blocks(traced, chain, offsets, None))
    best = matches[0]
    also = tuple(dict.fromkeys(m.name for m in matches[1:] if m.name != best.name))
    raw = tables.get("step_windows")
    windows = (raw if isinstance(raw, pl.DataFrame) else pl.from_arrow(raw)) if raw is not None else None
    costs = tuple(_stage_costs(best, d, traced[d], coll, compute, chain[d], _step_start(windows, chain[d], step))
                  for d in range(stages))
    return TracedSchedule(name=best.name, stages=stages, microbatches=best.microbatches,
                          chunks=1 if best.name.startswith("dualpipe") else best.chunks, step=step,
                          stage_ranks=stage_ranks, seen=seen, also=also, tokens=tokens, costs=costs,
                          blocks=_traced_blocks(traced, chain, offsets, best))


def _tokens(rank: int, local: Mapping[int, int], pp: pl.DataFrame, compute: pl.DataFrame,
            issued: Mapping[tuple[int, int], int]) -> _Stage:
    """A stage's tokens in program order: by the CPU launch of each kernel when the trace links
    kernels to their launches (`issued`: (rank, coll_id) -> launch time),
    else a receive at its end and a send at the end of the compute before it."""
    me = local[rank]
    mine = pp.filter(pl.col("rank") == rank).sort("ts_ns")
    blocks = compute.filter(pl.col("rank") == rank).sort("s")
    starts = blocks.get_column("s").to_numpy().astype(np.int64)  # epoch ns: integers (a float64 is 256 ns coarse)
    ends = blocks.get_column("e").to_numpy().astype(np.int64)
    linked = "issued" in blocks.columns and blocks.get_column("issued").null_count() == 0
    launch = blocks.get_column("issued").to_numpy().astype(np.int64) if linked else starts
    by_launch = bool(issued) and linked
    marks: list[tuple[int, int, str]] = []
    for op, peer, ts, dur, cid in mine.select("op", "peer", "ts_ns", "dur_ns", "coll_id").iter_rows():
        where = _direction(me, local[peer], len(local))
        if by_launch and (rank, cid) in issued:
            marks.append((int(issued[(rank, cid)]), 0, f"{op[0]}{where}"))
        elif op == "recv":
            marks.append((int(ts + dur), 0, f"r{where}"))
        else:
            before = ends[ends <= ts]
            marks.append((int(before.max()) if before.size else int(ts), 0, f"s{where}"))
    out = _Stage(rank)
    if not marks:
        return out
    lo, hi = min(m[0] for m in marks), max(m[0] for m in marks)
    first = mine.row(0, named=True)
    if first["op"] == "send":
        done = ends[ends <= first["ts_ns"]]
        out.first_mark = int(done.max()) if done.size else int(first["ts_ns"])
    order = launch if by_launch else starts
    inside = np.flatnonzero((order >= lo) & (order < hi))
    for i in inside:
        marks.append((int(order[i]), 1, f"{COMPUTE}{i}"))
    reach = int(np.iinfo(np.int64).min)
    for _, _, tok in sorted(marks):
        if tok.startswith(COMPUTE):
            i = int(tok[1:])
            gained = float(max(int(ends[i]) - max(int(starts[i]), reach), 0))
            reach = max(reach, int(ends[i]))
            if out.tokens and out.tokens[-1] == COMPUTE:
                out.blocks[-1] = (out.blocks[-1][0], max(out.blocks[-1][1], int(ends[i])))
                out.busy[-1] += gained
                continue
            out.blocks.append((int(starts[i]), int(ends[i])))
            out.busy.append(gained)
            tok = COMPUTE
        out.tokens.append(tok)
    return out


def _offsets(ranks: Any) -> dict[int, int]:
    if ranks is None:
        return {}
    df = frame(ranks, "ranks")
    return {int(r): int(o or 0) for r, o in df.select("rank", "clock_offset_ns").iter_rows()}


def _traced_blocks(traced: Sequence[_Stage], chain: Sequence[int], offsets: Mapping[int, int],
                   named: Plan | None) -> tuple[TracedBlock, ...]:
    out = []
    for d, (stage, rank) in enumerate(zip(traced, chain, strict=True)):
        labels = (["+".join(f"{c.kind}{c.mb}" for c in chunks)
                   for tok, chunks in _canonical_blocks(_expected(named, d)) if tok == COMPUTE]
                  if named is not None else [])
        off = offsets.get(rank, 0)
        for k, (lo, hi) in enumerate(stage.blocks):
            out.append(TracedBlock(stage=d, rank=rank, start_ns=lo + off, end_ns=hi + off,
                                   chunks=labels[k] if k < len(labels) else "compute"))
    return tuple(out)


def _events_of(source: Any, ranks: list[int]) -> pl.DataFrame:
    """The events of `ranks` (a lazy scan of a run's events reads only theirs)."""
    if source is None:
        return frame(None, "events")
    if isinstance(source, pl.LazyFrame):
        return frame(source.filter(pl.col("rank").is_in(ranks)).collect().to_arrow(), "events")
    return frame(source, "events").filter(pl.col("rank").is_in(ranks))


def _compute_and_launches(ev: pl.DataFrame, coll: pl.DataFrame) -> tuple[pl.DataFrame, dict[tuple[int, int], int]]:
    """Compute intervals (rank, s, e, and `issued`: the CPU launch of a GPU kernel, when linked by
    correlation) and the launch time of each collective call's kernel by (rank, coll_id)."""
    empty = pl.DataFrame(schema={"rank": pl.Int32, "s": pl.Int64, "e": pl.Int64})
    if ev.height == 0:
        return empty, {}
    comm = breakdown.comm_intervals(ev, coll)
    runtime = (ev.filter((pl.col("kind") == "runtime") & pl.col("correlation").is_not_null())
               .group_by("rank", "correlation").agg(pl.col("ts_ns").min().alias("issued")))
    gpu = ev.filter((pl.col("kind") == "compute") & pl.col("ts_ns").is_not_null() & pl.col("dur_ns").is_not_null()
                    & (pl.col("dur_ns") > 0))
    if gpu.height and runtime.height:
        linked = (gpu.join(runtime, on=["rank", "correlation"], how="left")
                  .select(pl.col("rank").cast(pl.Int32), pl.col("ts_ns").alias("s"),
                          (pl.col("ts_ns") + pl.col("dur_ns")).alias("e"), pl.col("issued").cast(pl.Int64)))
        calls = (ev.filter(pl.col("coll_id").is_not_null() & pl.col("correlation").is_not_null())
                 .join(runtime, on=["rank", "correlation"]).select("rank", "coll_id", "issued"))
        if linked.get_column("issued").null_count() == 0:
            return linked, {(int(r), int(c)): int(t) for r, c, t in calls.iter_rows()}
    return breakdown.compute_intervals(ev, comm), {}


def _direction(me: int, peer: int, n: int) -> str:
    """`n` for the next stage, `p` for the previous (the ring's wrap-around counts as next/previous)."""
    if peer == me + 1 or (me == n - 1 and peer == 0 and n > 2):
        return "n"
    return "p"


def _canonical(tokens: Sequence[str]) -> list[str]:
    """Transfers between two compute blocks as a sorted run; no compute at either end."""
    return [t for t, _ in _canonical_blocks([(t, ()) for t in tokens])]


def _canonical_blocks(tokens: Sequence[tuple[str, tuple[Any, ...]]]) -> list[tuple[str, tuple[Any, ...]]]:
    """`_canonical`, each compute block carrying the chunks merged into it."""
    out: list[tuple[str, tuple[Any, ...]]] = []
    run: list[tuple[str, tuple[Any, ...]]] = []
    for tok, chunks in tokens:
        if tok != COMPUTE:
            run.append((tok, ()))
            continue
        if run:
            out += sorted(run)
            run = []
        if out and out[-1][0] == COMPUTE:
            out[-1] = (COMPUTE, out[-1][1] + tuple(chunks))
        elif out:
            out.append((COMPUTE, tuple(chunks)))
    out += sorted(run)
    while out and out[-1][0] == COMPUTE:
        out.pop()
    return out


def expected_tokens(p: Plan) -> list[list[str]]:
    """The tokens each device of `p` would leave: per slot, its receives, one compute block, its sends."""
    return [[t for t, _ in _expected(p, d)] for d in range(p.stages)]


def _expected(p: Plan, d: int) -> list[tuple[str, tuple[Any, ...]]]:
    n = p.stages
    toks: list[tuple[str, tuple[Any, ...]]] = []
    for slot in p.slots[d]:
        recvs, sends = [], []
        for c in slot.chunks:
            if c.kind == WEIGHT_GRAD:
                continue
            route = p.routes[c.mb]
            pos = p.position(d, c)
            src, dst = (pos - 1, pos + 1) if c.kind == FORWARD else (pos + 1, pos - 1)
            if 0 <= src < len(route) and route[src][0] != d:
                recvs.append((f"r{_direction(d, route[src][0], n)}", ()))
            if 0 <= dst < len(route) and route[dst][0] != d:
                sends.append((f"s{_direction(d, route[dst][0], n)}", ()))
        toks += [*recvs, (COMPUTE, slot.chunks), *sends]
    return toks


def _counts(pp: pl.DataFrame, chain: list[int]) -> int:
    """Sends from stage 0 to stage 1."""
    if len(chain) < 2:
        return 0
    return pp.filter((pl.col("rank") == chain[0]) & (pl.col("peer") == chain[1]) & (pl.col("op") == "send")).height


def _candidates(stages: int, sends_01: int) -> list[Plan]:
    """Every known schedule for `stages` whose micro-batch count divides the stage-0-to-1 sends
    by a small factor (chunks and directions multiply them)."""
    out = []
    counts = sorted({sends_01 // k for k in range(1, 2 * MAX_CHUNKS + 1) if sends_01 % k == 0}, reverse=True)
    for name in SCHEDULES:
        chunk_options = range(2, MAX_CHUNKS + 1) if name == "interleaved-1f1b" else (1,)
        for m in counts:
            for v in chunk_options:
                if m * stages * v > MAX_PLAN_CHUNKS:
                    continue
                try:
                    out.append(plan(name, stages, m, v))
                except ScheduleError:
                    continue
    return out


def _describe(tokens: Sequence[Sequence[str]]) -> str:
    words = {"rp": "recv<", "rn": "recv>", "sp": "send<", "sn": "send>", COMPUTE: "C"}
    parts = []
    for d, toks in enumerate(tokens):
        shown = " ".join(words.get(t, t) for t in toks[:24])
        parts.append(f"stage {d}: {shown}{' ...' if len(toks) > 24 else ''} ({len(toks)} tokens)")
    return "; ".join(parts)


def _step_start(windows: pl.DataFrame | None, rank: int, step: int | None) -> int | None:
    if windows is None or step is None or windows.height == 0:
        return None
    row = windows.filter((pl.col("rank") == rank) & (pl.col("step") == step))
    return int(row.get_column("start_ns")[0]) if row.height else None


def _stage_costs(p: Plan, device: int, traced: _Stage, coll: pl.DataFrame, compute: pl.DataFrame,
                 rank: int, step_start: int | None) -> StageCosts:
    """Per chunk kind, the mean compute and in-chunk communication (EP, TP) of one stage, by
    least squares over its compute blocks (a block holds the chunks run between two transfers)."""
    kinds = sorted({c.kind for slot in p.slots[device] for c in slot.chunks})
    blocks = [chunks for tok, chunks in _canonical_blocks(_expected(p, device)) if tok == COMPUTE]
    comm = coll.filter((pl.col("rank") == rank) & pl.col("dim").is_in(["EP", "TP"]) & pl.col("ts_ns").is_not_null()
                       & pl.col("dur_ns").is_not_null())
    mine = compute.filter(pl.col("rank") == rank).sort("s")
    dims = sorted(set(comm.get_column("dim").to_list()))
    a, y, ycomm = [], [], []
    windows = list(zip(blocks, traced.blocks, strict=False))
    leading = _leading_chunks(p, device)
    if leading and step_start is not None and traced.first_mark is not None and traced.first_mark > step_start:
        windows.insert(0, (leading, (step_start, traced.first_mark)))
    for chunks, (lo, hi) in windows:
        a.append([sum(1 for c in chunks if c.kind == k) for k in kinds])
        y.append(_union(mine.filter((pl.col("e") > lo) & (pl.col("s") < hi)), lo, hi))
        inside = comm.filter((pl.col("ts_ns") >= lo) & (pl.col("ts_ns") < hi))
        ycomm.append({dim: float(inside.filter(pl.col("dim") == dim).get_column("dur_ns").sum()) for dim in dims})
    computed, measured = _solve(kinds, a, y)
    comm_ns: dict[str, dict[str, float]] = {k: {} for k in kinds}
    for dim in dims:
        values, _ = _solve(kinds, a, [row[dim] for row in ycomm])
        for k in kinds:
            comm_ns[k][dim] = values[k]
    return StageCosts(stage=device, rank=rank, compute_ns=computed, comm_ns=comm_ns, measured=measured)


def _leading_chunks(p: Plan, device: int) -> tuple[Any, ...]:
    """The chunks a device runs before its first transfer (stage 0's first forwards)."""
    out: tuple[Any, ...] = ()
    for tok, chunks in _expected(p, device):
        if tok != COMPUTE:
            break
        out += tuple(chunks)
    return out


def _union(iv: pl.DataFrame, lo: int, hi: int) -> float:
    total, reach = 0, lo
    for s, e in iv.select("s", "e").iter_rows():
        s, e = max(int(s), reach), min(int(e), hi)
        if e > s:
            total += e - s
            reach = e
    return float(total)


def _solve(kinds: Sequence[str], a: list[list[int]], y: list[float]) -> tuple[dict[str, float], tuple[str, ...]]:
    """Non-negative per-kind means from block sums; kinds the blocks cannot separate share by DEFAULT_RATIO."""
    if not a:
        return dict.fromkeys(kinds, 0.0), ()
    m = np.asarray(a, float)
    v = np.asarray(y, float)
    if np.linalg.matrix_rank(m) == len(kinds):
        x, *_ = np.linalg.lstsq(m, v, rcond=None)
        if (x >= 0).all():
            return {k: float(x[i]) for i, k in enumerate(kinds)}, tuple(kinds)
    weights = np.array([DEFAULT_RATIO[k] for k in kinds])
    w = m @ weights
    unit = float(w @ v / max(w @ w, 1e-12))
    return {k: unit * DEFAULT_RATIO[k] for k in kinds}, ()
