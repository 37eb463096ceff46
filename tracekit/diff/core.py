"""`diff_runs`: why is run B slower (or faster) than run A, and is the network the reason?

Both runs go through the same analysis (`tracekit.analysis.analyze`); the diff lines them up
(`tracekit.diff.matching`), splits the step-time change into parts that add up (the critical
path's compute, communication per dim and idle time, per step), compares every collective
bucket against each run's own step-to-step variation, and says which ranks and hosts changed
and what differs in the setup. See docs/analysis.md, "Diff".
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
from msgspec.structs import replace

from tracekit._text import fmt_bytes, fmt_ns
from tracekit.analysis import AnalysisResult, analyze
from tracekit.diff.matching import InstancePairs, _span, frame, match_groups, match_instances, match_ranks
from tracekit.diff.results import (
    BucketChange,
    Culprit,
    Decomposition,
    GroupPair,
    Matching,
    Part,
    RankChange,
    RunDiff,
    StepOutlier,
    WaitShift,
)
from tracekit.diff.setup import setup_changes
from tracekit.errors import TracekitError
from tracekit.store import Run

#: A change smaller than this share of A's step time is never significant, whatever the noise.
MIN_STEP_SHARE = 0.01
#: A bucket's median duration must move by at least this share to be flagged...
MIN_RELATIVE = 0.05
#: ... and by more than this many robust spreads (1.4826 MAD) of A's and B's, added.
SPREADS = 3.0
#: ... and change the bucket's time per step by at least this share of A's step time.
MIN_BUCKET_STEP_SHARE = 0.002
#: A culprit took part in collectives that carry at least this share of the time the slowed ones added.
CULPRIT_SHARE = 0.8
#: An instance slowed when it takes at least this much longer in B than in A.
SLOWED = 1.25

RunSource = Run | str | os.PathLike[str] | Mapping[str, pa.Table] | AnalysisResult


def _analysis(source: RunSource) -> tuple[AnalysisResult, Run | None, Mapping[str, pa.Table] | None]:
    if isinstance(source, AnalysisResult):
        return source, None, None
    if isinstance(source, Mapping):
        return analyze(source, write=False), None, source
    run = source if isinstance(source, Run) else Run(source)
    run.require_data()
    return analyze(run, write=False), run, None


def diff_runs(a: RunSource, b: RunSource, *, topology: str | None = None,
              names: tuple[str, str] | None = None) -> RunDiff:
    """Compare run B against run A (each a run directory, dict of tables, or an `AnalysisResult`;
    `tracekit.workflows.diff` opens raw traces first): the verdict, the decomposed step-time
    change, buckets, ranks, setup. `names` name the two runs (default: their paths).

    With `topology` (the network A ran on), both runs are also replayed on it with A's
    calibration, to split the change into network and job (`tracekit.diff.network`)."""
    name_a, name_b = names if names is not None else (source_name(a), source_name(b))
    ra, run_a, tabs_a = _analysis(a)
    rb, run_b, tabs_b = _analysis(b)
    matching, pairs, rb, b_steps = match_runs(ra, rb)
    steps, rank_map = matching.steps, matching.ranks
    inst_a, inst_b = frame(ra.instances), frame(rb.instances)
    deco = decompose(ra, rb, steps, rank_map)
    host_b = dict(frame(rb.ranks).select("rank", "host").iter_rows())
    outlier = step_outlier(ra, rb, steps, rank_map, host_b, deco.step_a_ns)
    if outlier is not None:
        deco = replace(deco, outlier=outlier)
    network = None
    if topology is not None:
        src_a, src_b = run_a if run_a is not None else tabs_a, run_b if run_b is not None else tabs_b
        if src_a is None or src_b is None:
            raise TracekitError("diff --topology replays the runs: give run directories, traces or tables, "
                                "not analysis results")
        from tracekit.diff.network import network_or_job

        network = network_or_job(src_a, src_b, topology, steps, b_steps, name_a=name_a)
    out = RunDiff(a=name_a, b=name_b, verdict="", matching=matching, decomposition=deco,
                  waits=wait_shifts(ra, rb, steps, rank_map, host_b),
                  buckets=bucket_changes(inst_a, inst_b, matching.groups, steps, deco.step_a_ns),
                  ranks=rank_shifts(ra, rb, steps, rank_map, host_b, deco.step_a_ns),
                  culprits=find_culprits(inst_a, inst_b, frame(rb.participants), pairs.pairs, host_b,
                                         nics_of(run_b, tabs_b)),
                  setup=setup_changes(ra, rb, run_a, run_b, tabs_a, tabs_b), network=network)
    return replace(out, verdict=verdict(out) + _caution(matching))


def match_runs(ra: AnalysisResult, rb: AnalysisResult) -> tuple[Matching, InstancePairs, AnalysisResult, list[int]]:
    """Line the two analyses up (ranks, groups, steps, instances) and say every mismatch. Returns
    the matching, the instance pairs, B's analysis (its steps renumbered to A's when no step number
    is shared) and B's own numbers of the compared steps."""
    ranks_a, ranks_b = frame(ra.ranks), frame(rb.ranks)
    groups_a, groups_b = frame(ra.groups), frame(rb.groups)
    ranks_by, rank_map, notes = match_ranks(ranks_a, ranks_b)
    groups, group_notes = match_groups(groups_a, groups_b, rank_map)
    notes += group_notes
    steps_a = sorted(frame(ra.step_times).get_column("step").to_list())
    steps_b = sorted(frame(rb.step_times).get_column("step").to_list())
    steps = sorted(set(steps_a) & set(steps_b))
    b_steps = list(steps)
    if not steps and steps_a and steps_b:
        order = dict(zip(steps_b, steps_a, strict=False))
        rb = renumber_steps(rb, order)
        notes.append(f"no step number in common (A {_span(steps_a)}, B {_span(steps_b)}): steps matched in order, "
                     + ", ".join(f"B {b} -> A {a}" for b, a in list(order.items())[:4]))
        steps, b_steps = list(order.values()), list(order)
    elif steps_a != steps_b:
        notes.append(f"steps differ: A has {_span(steps_a)}, B {_span(steps_b)}; "
                     f"{'compared ' + _span(steps) if steps else 'no step in common'}")
    pairs = match_instances(frame(ra.instances), frame(rb.instances), groups, steps)
    if pairs.only_a or pairs.only_b:
        notes.append(f"collectives without a match: {pairs.only_a} in A, {pairs.only_b} in B "
                     "(in the compared steps and matched groups)")
    matching = Matching(
        ranks_by=ranks_by, ranks=rank_map,
        ranks_only_a=sorted(set(ranks_a.get_column("rank").to_list()) - set(rank_map)),
        ranks_only_b=sorted(set(ranks_b.get_column("rank").to_list()) - set(rank_map.values())),
        groups=groups, groups_only_a=sorted(set(groups_a.get_column("group").to_list()) - {p.group_a for p in groups}),
        groups_only_b=sorted(set(groups_b.get_column("group").to_list()) - {p.group_b for p in groups}),
        steps_a=steps_a, steps_b=steps_b, steps=steps, instances_by_seq=pairs.by_seq,
        instances_by_position=pairs.by_position, instances_only_a=pairs.only_a, instances_only_b=pairs.only_b,
        notes=notes)
    return matching, pairs, rb, b_steps


def renumber_steps(r: AnalysisResult, mapping: dict[int, int]) -> AnalysisResult:
    """The analysis with its step numbers renamed by `mapping` (steps left out become null)."""
    from dataclasses import replace as replace_fields

    changed = {}
    for name, t in r.tables().items():
        for col in ("step", "root_step"):
            if col in t.column_names:
                df = frame(t)
                dtype = df.schema[col]
                df = df.with_columns(pl.col(col).replace_strict(mapping, default=None, return_dtype=dtype))
                changed[name] = df.to_arrow()
                t = changed[name]
    return replace_fields(r, **changed)


def _caution(m: Matching) -> str:
    """The verdict's tail when the runs are not alike: said in the one sentence, never only in a note."""
    said = sorted((n for n in m.notes if n.startswith(("world sizes differ", "steps differ", "no step number"))
                   or "missing:" in n),
                  key=lambda n: (not n.startswith("world sizes"), not n.startswith("steps")))
    if not said:
        return ""
    return "; caution: " + "; ".join(n.split(";")[0] for n in said[:2])


def source_name(source: RunSource) -> str:
    if isinstance(source, Run):
        return str(source.path)
    if isinstance(source, str | os.PathLike):
        return os.fspath(source)
    return "<tables>"


def _per_step(values: dict[int, float], steps: list[int]) -> np.ndarray:
    return np.array([values.get(s, 0.0) for s in steps], float)


def _noise(x: np.ndarray, y: np.ndarray) -> float:
    """Twice the standard error of mean(y) - mean(x), from each series' own spread."""
    var = 0.0
    for v in (x, y):
        if v.size > 1:
            var += float(np.var(v, ddof=1)) / v.size
    return 2.0 * math.sqrt(var)


def decompose(ra: AnalysisResult, rb: AnalysisResult, steps: list[int], rank_map: dict[int, int]) -> Decomposition:
    """The mean step-time change over the compared steps, split into parts per step: from each
    step's critical path when both runs have one for every compared step (compute + comm per dim +
    idle = step time, exactly), else from the matched ranks' mean windows (compute, exposed comm per
    dim, and the rest of the window), with the difference to the step time left as the remainder."""
    st_a = dict(frame(ra.step_times).select("step", "step_ns").iter_rows())
    st_b = dict(frame(rb.step_times).select("step", "step_ns").iter_rows())
    cp_a, cp_b = frame(ra.critical_path), frame(rb.critical_path)
    have = (set(steps) <= set(cp_a.get_column("step").to_list())
            and set(steps) <= set(cp_b.get_column("step").to_list()))
    if steps and have:
        source = "critical_path"
        parts_a, parts_b = _cp_parts(cp_a), _cp_parts(cp_b)
    else:
        source = "rank_means"
        parts_a = _rank_parts(ra, set(rank_map))
        parts_b = _rank_parts(rb, set(rank_map.values()))
    step_a, step_b = _per_step(st_a, steps), _per_step(st_b, steps)
    n = max(len(steps), 1)
    mean_a, mean_b = float(step_a.sum() / n), float(step_b.sum() / n)
    floor = MIN_STEP_SHARE * mean_a
    names = sorted(set(parts_a) | set(parts_b), key=_part_order)
    parts = []
    for name in names:
        xa, xb = _per_step(parts_a.get(name, {}), steps), _per_step(parts_b.get(name, {}), steps)
        d = float(xb.sum() / n - xa.sum() / n)
        noise = _noise(xa, xb)
        parts.append(Part(name=name, a_ns=float(xa.sum() / n), b_ns=float(xb.sum() / n), delta_ns=d, noise_ns=noise,
                          significant=abs(d) > max(noise, floor)))
    delta = mean_b - mean_a
    total = sum(p.delta_ns for p in parts)
    noise = _noise(step_a, step_b)
    return Decomposition(source=source, steps=len(steps), step_a_ns=mean_a, step_b_ns=mean_b, delta_ns=delta,
                         noise_ns=noise, significant=bool(steps) and abs(delta) > max(noise, floor), parts=parts,
                         parts_sum_ns=total, remainder_ns=delta - total)


def _part_order(name: str) -> tuple[int, str]:
    return (0 if name == "compute" else 2 if name == "idle" else 1, name)


def _cp_parts(cp: pl.DataFrame) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {"compute": {}, "idle": {}}
    for row in cp.iter_rows(named=True):
        s = row["step"]
        out["compute"][s] = float(row["compute_ns"])
        out["idle"][s] = float(row["idle_ns"])
        for d in row["comm_by_dim"] or []:
            key = f"comm {d['dim']}"
            out.setdefault(key, {})[s] = out.get(key, {}).get(s, 0.0) + float(d["ns"])
    return out


def _rank_parts(r: AnalysisResult, ranks: set[int]) -> dict[str, dict[int, float]]:
    wide = frame(r.per_rank_step).filter(pl.col("rank").is_in(list(ranks)))
    long = frame(r.per_rank_step_dim).filter(pl.col("rank").is_in(list(ranks)))
    out: dict[str, dict[int, float]] = {"compute": {}, "idle": {}}
    by_step = wide.group_by("step").agg(pl.col("compute_ns").mean(), pl.col("exposed_ns").mean(),
                                        pl.col("span_ns").mean())
    nranks = dict(wide.group_by("step").len().iter_rows())
    for s, comp, exposed, span in by_step.iter_rows():
        out["compute"][s] = float(comp)
        out["idle"][s] = float(span - comp - exposed)
    for s, dim, ns in long.group_by("step", "dim").agg(pl.col("exposed_ns").sum()).iter_rows():
        out.setdefault(f"comm {dim}", {})[s] = float(ns) / max(nranks.get(s, 1), 1)
    return out


#: A step is an outlier when its change is this many times the median change of the other steps...
OUTLIER_TIMES = 3.0
#: ... and at least this share of A's mean step time.
OUTLIER_SHARE = 0.05


def step_outlier(ra: AnalysisResult, rb: AnalysisResult, steps: list[int], rank_map: dict[int, int],
                 host_b: dict[int, str | None], step_ns: float) -> StepOutlier | None:
    """The compared step whose change (B - A) stands out of the others' (OUTLIER_TIMES their median
    |change|, and OUTLIER_SHARE of the step), with the root rank whose waits grew most in it."""
    if len(steps) < 3:
        return None
    st_a = dict(frame(ra.step_times).select("step", "step_ns").iter_rows())
    st_b = dict(frame(rb.step_times).select("step", "step_ns").iter_rows())
    deltas = {s: float(st_b.get(s, 0) - st_a.get(s, 0)) for s in steps}
    worst = max(steps, key=lambda s: (abs(deltas[s]), -s))
    others = float(np.median([abs(deltas[s]) for s in steps if s != worst]))
    if abs(deltas[worst]) < max(OUTLIER_TIMES * others, OUTLIER_SHARE * step_ns):
        return None
    shifts = wait_shifts(ra, rb, [worst], rank_map, host_b, top=1)
    root = shifts[0] if shifts and shifts[0].delta_ns * deltas[worst] > 0 else None
    return StepOutlier(step=worst, delta_ns=deltas[worst], others_ns=others,
                       root_rank=None if root is None else root.rank, host=None if root is None else root.host)


def wait_shifts(ra: AnalysisResult, rb: AnalysisResult, steps: list[int], rank_map: dict[int, int],
                host_b: dict[int, str | None], top: int = 10) -> list[WaitShift]:
    """Per root rank (the rank at the end of a chain of waits), the rank-time the others lost
    waiting for it, per compared step, in A and in B; largest change first."""
    n = max(len(steps), 1)

    def lost(r: AnalysisResult, mapping: dict[int, int] | None) -> dict[int, float]:
        rc = frame(r.root_causes)
        if rc.height == 0:
            return {}
        rc = rc.filter(pl.col("root_step").is_in(steps))
        out: dict[int, float] = {}
        for rank, ns in rc.group_by("root_rank").agg(pl.col("total_wait_ns").sum()).iter_rows():
            key = mapping.get(rank, rank) if mapping is not None else rank
            out[key] = out.get(key, 0.0) + float(ns) / n
        return out

    la, lb = lost(ra, rank_map), lost(rb, None)
    rows = [WaitShift(rank=k, host=host_b.get(k), a_ns=la.get(k, 0.0), b_ns=lb.get(k, 0.0),
                      delta_ns=lb.get(k, 0.0) - la.get(k, 0.0)) for k in set(la) | set(lb)]
    rows = [w for w in rows if w.delta_ns]
    return sorted(rows, key=lambda w: (-abs(w.delta_ns), w.rank))[:top]


def _robust(values: np.ndarray) -> tuple[float, float]:
    """Median and robust spread (1.4826 x the median absolute deviation)."""
    med = float(np.median(values))
    return med, 1.4826 * float(np.median(np.abs(values - med)))


def bucket_changes(inst_a: pl.DataFrame, inst_b: pl.DataFrame, groups: list[GroupPair],
                   steps: list[int], step_ns: float) -> list[BucketChange]:
    """Per bucket (op, size, matched group, dim): calls per step, the median over steps of the
    mean duration per step (the instances themselves with fewer than 3 steps) and its robust
    spread, and the median bus bandwidth, in A and B. Flagged when the count per step changed,
    or the duration moved by at least MIN_RELATIVE, by more than SPREADS x (spread A + B), and
    by MIN_BUCKET_STEP_SHARE of A's step time per step (calls per step x the change)."""
    gmap = {p.group_a: p.group_b for p in groups}
    back = {v: k for k, v in gmap.items()}
    n = max(len(steps), 1)

    key = ["op", "dim", "group", "bytes"]

    def mad(col: str) -> pl.Expr:
        return 1.4826 * (pl.col(col) - pl.col(col).median()).abs().median()

    def stats(inst: pl.DataFrame, to_b: bool) -> dict[tuple, dict[str, Any]]:
        df = inst.filter(pl.col("step").is_in(steps))
        if to_b:
            df = df.filter(pl.col("group").is_in(list(gmap))).with_columns(
                pl.col("group").replace_strict(gmap, return_dtype=pl.String))
        else:
            df = df.filter(pl.col("group").is_in(list(back)))  # a group without a match is a note, not a bucket
        whole = df.group_by(key).agg(pl.len().alias("n"), pl.col("duration_ns").median().alias("med_i"),
                                     mad("duration_ns").alias("mad_i"), pl.col("busbw_gbps").median().alias("busbw"),
                                     mad("busbw_gbps").alias("busbw_spread"))
        by_step = (df.filter(pl.col("duration_ns").is_not_null()).group_by([*key, "step"])
                   .agg(pl.col("duration_ns").mean().alias("d"))
                   .group_by(key).agg(pl.len().alias("steps"), pl.col("d").median().alias("med_s"),
                                      mad("d").alias("mad_s")))
        out = {}
        for row in whole.join(by_step, on=key, how="left", nulls_equal=True).iter_rows(named=True):
            per_step = (row["steps"] or 0) >= 3
            out[tuple(row[k] for k in key)] = {
                "count": row["n"] / n, "dur": row["med_s"] if per_step else row["med_i"],
                "spread": row["mad_s"] if per_step else row["mad_i"], "busbw": row["busbw"],
                "busbw_spread": row["busbw_spread"]}
        return out

    sa, sb = stats(inst_a, True), stats(inst_b, False)
    rows = []
    for key in set(sa) | set(sb):
        op, dim, group, nbytes = key
        a, b = sa.get(key), sb.get(key)
        flagged = a is None or b is None or abs(a["count"] - b["count"]) > 1e-9
        ratio = None
        if a is not None and b is not None and a["dur"] and b["dur"] is not None:
            a["spread"], b["spread"] = a["spread"] or 0.0, b["spread"] or 0.0
            change = b["dur"] - a["dur"]
            flagged = flagged or (abs(change) >= MIN_RELATIVE * a["dur"]
                                  and abs(change) > SPREADS * (a["spread"] + b["spread"])
                                  and abs(change) * b["count"] >= MIN_BUCKET_STEP_SHARE * step_ns)
            ratio = a["dur"] / b["dur"] if b["dur"] else None
        rows.append(BucketChange(
            op=op, dim=dim, group_a=back.get(group) if a is not None else None,
            group_b=group if b is not None else None, bytes=nbytes,
            per_step_a=a["count"] if a else 0.0, per_step_b=b["count"] if b else 0.0,
            duration_a_ns=a["dur"] if a else None, duration_b_ns=b["dur"] if b else None,
            spread_a_ns=a["spread"] if a else None, spread_b_ns=b["spread"] if b else None,
            busbw_a_gbps=a["busbw"] if a else None, busbw_b_gbps=b["busbw"] if b else None,
            busbw_spread_a_gbps=a["busbw_spread"] if a else None, busbw_spread_b_gbps=b["busbw_spread"] if b else None,
            ratio=ratio, flagged=bool(flagged)))
    return sorted(rows, key=_bucket_order)


def _bucket_order(b: BucketChange) -> tuple:
    da = (b.duration_a_ns or 0.0) * b.per_step_a
    db = (b.duration_b_ns or 0.0) * b.per_step_b
    same_count = abs(b.per_step_b - b.per_step_a) < 1e-9
    return (not b.flagged, same_count, -abs(db - da), b.op, b.dim or "", b.group_b or b.group_a or "", b.bytes or 0)


_RANK_FIGURES = {"compute": "compute_ns", "communication": "exposed_ns", "late": "late_ns"}


def rank_shifts(ra: AnalysisResult, rb: AnalysisResult, steps: list[int], rank_map: dict[int, int],
                host_b: dict[int, str | None], step_ns: float) -> list[RankChange]:
    """Per matched rank, the mean compute, exposed communication and lateness (arrival after the
    first participant, summed over its collectives) per step window in A and B; `slower_in` names
    what rose by more than each run's own step-to-step noise and MIN_STEP_SHARE of A's step time."""
    floor = MIN_STEP_SHARE * step_ns
    cols = list(_RANK_FIGURES.values())

    def per_rank(r: AnalysisResult, mapping: dict[int, int] | None) -> pl.DataFrame:
        w = frame(r.per_rank_step).filter(pl.col("step").is_in(steps)).select(
            pl.col("rank").cast(pl.Int64), pl.col("step").cast(pl.Int64), "compute_ns", "exposed_ns")
        w = w.join(_lateness(r, steps), on=["rank", "step"], how="left").with_columns(pl.col("late_ns").fill_null(0))
        if mapping is not None:
            w = w.filter(pl.col("rank").is_in(list(mapping))).with_columns(
                pl.col("rank").replace_strict(mapping, return_dtype=pl.Int64))
        return w.group_by("rank").agg(
            pl.len().alias("n"), *(pl.col(c).cast(pl.Float64).mean().alias(c) for c in cols),
            *(pl.col(c).cast(pl.Float64).var(ddof=1).fill_null(0.0).fill_nan(0.0).alias(f"{c}_var") for c in cols))

    both = per_rank(ra, rank_map).join(per_rank(rb, None), on="rank", suffix="_b")
    back = {v: k for k, v in rank_map.items()}
    rows = []
    for row in both.sort("rank").iter_rows(named=True):
        slower = []
        for name, c in _RANK_FIGURES.items():
            noise = 2.0 * math.sqrt(row[f"{c}_var"] / row["n"] + row[f"{c}_var_b"] / row["n_b"])
            if row[f"{c}_b"] - row[c] > max(noise, floor):
                slower.append(name)
        r_b = int(row["rank"])
        rows.append(RankChange(rank_a=back[r_b], rank_b=r_b, host=host_b.get(r_b),
                               compute_a_ns=row["compute_ns"], compute_b_ns=row["compute_ns_b"],
                               exposed_a_ns=row["exposed_ns"], exposed_b_ns=row["exposed_ns_b"],
                               late_a_ns=row["late_ns"], late_b_ns=row["late_ns_b"], slower_in=slower))
    return sorted(rows, key=lambda c: (not c.slower_in, -_rank_rise(c), c.rank_b))


def _rank_rise(c: RankChange) -> float:
    return max(c.compute_b_ns - c.compute_a_ns, c.exposed_b_ns - c.exposed_a_ns, c.late_b_ns - c.late_a_ns)


def _lateness(r: AnalysisResult, steps: list[int]) -> pl.DataFrame:
    """Per rank and step: the summed time it reached its collectives after their first participant."""
    parts = frame(r.participants)
    if parts.height == 0:
        return pl.DataFrame(schema={"rank": pl.Int64, "step": pl.Int64, "late_ns": pl.Int64})
    inst = frame(r.instances).select("instance", "max_wait_ns")
    return (parts.filter(pl.col("step").is_in(steps)).join(inst, on="instance")
            .with_columns((pl.col("max_wait_ns") - pl.col("wait_ns")).alias("late_ns"))
            .group_by(pl.col("rank").cast(pl.Int64), pl.col("step").cast(pl.Int64)).agg(pl.col("late_ns").sum()))


def nics_of(run: Run | None, tabs: Mapping[str, pa.Table] | None) -> dict[int, list[str]]:
    """Per rank, the NICs its network channels use (from the channels table NCCL's logs give)."""
    from tracekit.diff.setup import _table

    ch = _table(run, tabs, "channels")
    if ch is None or "nic" not in ch.columns:
        return {}
    used = ch.filter(pl.col("nic").is_not_null() & (pl.col("transport") == "NET"))
    return {int(r): sorted(set(n)) for r, n in used.group_by("rank").agg(pl.col("nic")).iter_rows()}


def find_culprits(inst_a: pl.DataFrame, inst_b: pl.DataFrame, parts_b: pl.DataFrame, pairs: pl.DataFrame,
                  host_b: dict[int, str | None], nics: Mapping[int, list[str]] | None = None) -> list[Culprit]:
    """The rank or host common to the collectives that slowed (B's duration at least SLOWED x A's).

    Scored by the share of the time the slowed instances added that it took part in, times the
    share of its instances that slowed (a rank in every collective explains nothing); the best of
    each kind (ties kept) when that share of added time is at least CULPRIT_SHARE."""
    if pairs.height == 0 or parts_b.height == 0:
        return []
    da = inst_a.select(pl.col("instance").alias("instance_a"), pl.col("duration_ns").alias("dur_a"))
    db = inst_b.select(pl.col("instance").alias("instance_b"), pl.col("duration_ns").alias("dur_b"))
    m = (pairs.join(da, on="instance_a").join(db, on="instance_b")
         .filter(pl.col("dur_a") > 0)
         .with_columns((pl.col("dur_b") / pl.col("dur_a")).alias("ratio"))
         .with_columns((pl.col("ratio") >= SLOWED).alias("slowed"),
                       pl.when(pl.col("ratio") >= SLOWED).then(pl.col("dur_b") - pl.col("dur_a")).otherwise(0)
                       .cast(pl.Float64).alias("added")))
    n_slowed = int(m.get_column("slowed").sum())
    added = float(m.get_column("added").sum())
    if n_slowed < 2 or added <= 0:
        return []
    who = (parts_b.select(pl.col("instance").alias("instance_b"), "rank")
           .join(m.select("instance_b", "ratio", "slowed", "added"), on="instance_b")
           .with_columns(pl.col("rank").replace_strict(host_b, default=None, return_dtype=pl.String).alias("host")))
    out: list[Culprit] = []
    for kind, col in (("rank", "rank"), ("host", "host")):
        per = (who.filter(pl.col(col).is_not_null()).unique(["instance_b", col])
               .group_by(col).agg(pl.col("slowed").sum().alias("n_slowed"), (~pl.col("slowed")).sum().alias("unslowed"),
                                  pl.col("added").sum().alias("added"),
                                  pl.col("ratio").filter(pl.col("slowed")).median()))
        if per.height < 2:
            continue  # one host (or rank) is in everything: it explains nothing
        per = per.with_columns((pl.col("added") / added).alias("cover")).with_columns(
            (pl.col("cover") * pl.col("n_slowed") / (pl.col("n_slowed") + pl.col("unslowed"))).alias("score"))
        best = per.get_column("score").max()
        if best is None or best <= 0:
            continue
        top = per.filter((pl.col("score") >= best * (1 - 1e-9)) & (pl.col("cover") >= CULPRIT_SHARE))
        if top.height == per.height:
            continue
        for row in top.sort(col).iter_rows(named=True):
            out.append(Culprit(kind=kind, name=str(row[col]), slowed=int(row["n_slowed"]), slowed_total=n_slowed,
                               unslowed=int(row["unslowed"]), added_share=float(row["cover"]),
                               ratio=float(row["ratio"]),
                               nics=list((nics or {}).get(int(row[col]), [])) if kind == "rank" else []))
    return out


def verdict(d: RunDiff) -> str:
    """One sentence: the step-time change, the part that dominates it and what is behind that part
    (and, with a replay, whether the network or the job explains it)."""
    return _verdict(d) + _network_words(d)


def _verdict(d: RunDiff) -> str:
    deco = d.decomposition
    if deco.steps == 0:
        m = d.matching
        which = ("neither run has" if not m.steps_a and not m.steps_b else "A has no" if not m.steps_a
                 else "B has no" if not m.steps_b else "the runs have no")
        text = f"step time not compared: {which} {'step in common' if which == 'the runs have no' else 'timed steps'}"
        setup = [s for s in d.setup if s.item in _HEADLINE_SETUP]
        if setup:
            text += f"; {setup[0].item}: {setup[0].a} in A, {setup[0].b} in B"
        return text
    pct = f" ({deco.delta_ns / deco.step_a_ns:+.0%})" if deco.step_a_ns else ""
    head = f"step {_signed(deco.delta_ns)}{pct}"
    if not deco.significant:
        text = (f"no significant change: step {_signed(deco.delta_ns)}{pct} is within the runs' step-to-step "
                f"variation (±{fmt_ns(max(deco.noise_ns, MIN_STEP_SHARE * deco.step_a_ns))})")
        flagged = [b for b in d.buckets if b.flagged]
        setup = [s for s in d.setup if s.item in _HEADLINE_SETUP]
        out = deco.outlier
        if out is not None:
            text += f"; but step {out.step} alone is {_signed(out.delta_ns)} (the others {fmt_ns(out.others_ns)})"
            if out.root_rank is not None:
                who = f"rank {out.root_rank}" + (f" ({out.host})" if out.host else "")
                text += f", waiting on {who}" if out.delta_ns > 0 else f", where A waited on {who}"
        elif flagged:
            text += f"; but {_bucket_words(flagged[0])}"
        elif setup:
            text += f"; but {setup[0].item}: {setup[0].a} in A, {setup[0].b} in B"
        return text
    sign = 1 if deco.delta_ns > 0 else -1
    leads = sorted((p for p in deco.parts if p.significant and p.delta_ns * sign > 0),
                   key=lambda p: -abs(p.delta_ns))
    if not leads:
        return f"{head}: no single part stands out of the noise; see the waterfall"
    lead = leads[0]
    text = f"{head}: {_signed(lead.delta_ns)} is {_part_words(lead.name, deco.source)}"
    detail = _detail(d, lead)
    if detail:
        text += f", {detail}"
    setup = [s for s in d.setup if s.item in _HEADLINE_SETUP]
    if setup:
        s = setup[0]
        text += f"; {s.item}: {s.a} in A, {s.b} in B"
    return text


def _network_words(d: RunDiff) -> str:
    n = d.network
    if n is None:
        return ""
    if n.dominant == "neither":
        return (f"; replayed with A's calibration, neither the network ({_signed(n.network_ns)}) nor the job "
                f"({_signed(n.job_ns)}) moves the step beyond the replay's error ({n.step_error:.1%})")
    lead = ("the network delivered less for the same work" if n.network_ns > 0 else
            "the network delivered more for the same work") if n.dominant == "network" else (
        "the job asked for more" if n.job_ns > 0 else "the job asked for less")
    return (f"; {lead}: replayed with A's calibration, {_signed(n.network_ns)} is the network and "
            f"{_signed(n.job_ns)} the job (replay step error {n.step_error:.1%})")


_HEADLINE_SETUP = ("channels", "algorithm", "protocol", "NCCL version", "world size", "EP imbalance",
                   "busiest link")


def _signed(ns: float) -> str:
    return ("+" if ns >= 0 else "-") + fmt_ns(abs(ns))


def _part_words(name: str, source: str) -> str:
    if name == "compute":
        return "compute on the critical path" if source == "critical_path" else "compute"
    if name == "idle":
        return "idle time (host, data loading, start skew)" if source == "critical_path" else "other window time"
    dim = name.split(" ", 1)[1]
    return f"{dim} communication on the critical path" if source == "critical_path" else f"exposed {dim} communication"


def _detail(d: RunDiff, lead: Part) -> str:
    culprit = next((c for c in d.culprits if c.kind == "host"), None) or next(
        (c for c in d.culprits if c.kind == "rank"), None)
    if lead.name.startswith("comm "):
        dim = lead.name.split(" ", 1)[1]
        flagged = [b for b in d.buckets if b.flagged and (b.dim or "OTHER") == dim]
        if not flagged:
            return ""
        b = flagged[0]
        if abs(b.per_step_b - b.per_step_a) > 1e-9 or b.ratio is None:
            return _bucket_words(b)
        text = f"where {b.op}s of {fmt_bytes(b.bytes)} on group {b.group_b or b.group_a}"
        host_of = {r.rank_b: r.host for r in d.ranks}
        if culprit is not None:
            names = [c.name for c in d.culprits if c.kind == culprit.kind]
            text += f" through {culprit.kind} {' and '.join(names)}"
            ranks = [c for c in d.culprits if c.kind == "rank" and host_of.get(int(c.name)) in names]
            if culprit.kind == "host" and ranks:
                nics = sorted({n for c in ranks for n in c.nics})
                text += (f" (rank {' and '.join(c.name for c in ranks)}"
                         + (f", NIC {', '.join(nics)}" if nics else "") + ")")
        return text + f" run at {b.ratio:.2f}x their busbw in A"
    if lead.name == "compute":
        slower = [r for r in d.ranks if "compute" in r.slower_in]
        if not slower:
            return ""
        rise = float(np.median([r.compute_b_ns - r.compute_a_ns for r in slower]))
        who = f"rank {slower[0].rank_b}" if len(slower) == 1 else f"ranks {_span(r.rank_b for r in slower)}"
        return f"on {who} (+{fmt_ns(rise)} {'each ' if len(slower) > 1 else ''}per step)"
    if d.waits and d.waits[0].delta_ns > 0:
        w = d.waits[0]
        return f"waiting on rank {w.rank}" + (f" ({w.host})" if w.host else "")
    return ""


def _bucket_words(b: BucketChange) -> str:
    where = f"on group {b.group_b or b.group_a}"
    what = f"{b.op} of {fmt_bytes(b.bytes)}"
    if abs(b.per_step_b - b.per_step_a) > 1e-9:
        return f"{_fmt_count(b.per_step_a)} -> {_fmt_count(b.per_step_b)} {what} per step {where}"
    if b.ratio is None:
        return f"{what} {where} changed"
    return f"{what} {where} runs at {b.ratio:.2f}x its speed in A"


def _fmt_count(x: float) -> str:
    return str(int(x)) if abs(x - round(x)) < 1e-9 else f"{x:.2f}"
