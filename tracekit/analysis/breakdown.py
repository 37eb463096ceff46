"""Per rank and step: compute, communication per dim, overlap, exposed communication, idle."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl

from tracekit.analysis import _kernels
from tracekit.analysis.steps import split_by_step

COMM_NAME_RE = r"^(c10d::|gloo:|nccl:|record_param_comms|ProfilerStep#)"
COMPUTE = "__compute__"
BUSY = "__busy__"


def compute_intervals(events: pl.DataFrame, comm: pl.DataFrame, *,
                      compute: str | Sequence[str] = "auto", detail: bool = False) -> pl.DataFrame:
    """Compute intervals (rank, s, e; with `detail`, also the event's name).

    `compute` is "auto" (per rank: events of kind "compute" when the rank has any, which is the
    GPU kernels; otherwise its CPU ops, as on a CPU-only gloo run), "gpu" (kind "compute"),
    "cpu" (CPU ops), or a list of event kinds taken as they are. CPU ops exclude communication
    ops (names starting c10d::, gloo:, nccl:, record_param_comms, or rows linked to a
    collective) and any op that encloses a communication interval of the same rank (an autograd
    wrapper that waits in an all-to-all is not compute).
    """
    ev = events.filter(pl.col("ts_ns").is_not_null() & pl.col("dur_ns").is_not_null()
                       & (pl.col("dur_ns") > 0))
    cols = [pl.col("rank").cast(pl.Int32), pl.col("ts_ns").alias("s"),
            (pl.col("ts_ns") + pl.col("dur_ns")).alias("e")]
    if detail:
        cols.append(pl.col("name").cast(pl.String))
    if not isinstance(compute, str):
        return ev.filter(pl.col("kind").is_in(list(compute))).select(cols)
    gpu = ev.filter(pl.col("kind") == "compute").select(cols)
    if compute == "gpu":
        return gpu
    gpu_ranks = gpu.get_column("rank").unique().to_list() if compute == "auto" else []
    ops = ev.filter((pl.col("kind") == "cpu_op") & ~pl.col("rank").is_in(gpu_ranks)
                    & pl.col("coll_id").is_null()
                    & ~pl.col("name").fill_null("").str.contains(COMM_NAME_RE)).select(cols)
    if ops.height and comm.height:
        ops = ops.sort("rank", "s")
        c = comm.select(pl.col("rank").cast(pl.Int32), "s", "e").sort("rank", "s")
        inside = _kernels.encloses(
            ops.get_column("rank").to_numpy().astype(np.int64), ops.get_column("s").to_numpy(),
            ops.get_column("e").to_numpy(), c.get_column("rank").to_numpy().astype(np.int64),
            c.get_column("s").to_numpy(), c.get_column("e").to_numpy())
        ops = ops.filter(pl.Series(~inside))
    if compute == "cpu":
        return ops
    return pl.concat([gpu, ops])


def comm_intervals(events: pl.DataFrame, collectives: pl.DataFrame, *, detail: bool = False) -> pl.DataFrame:
    """Communication intervals (rank, s, e, dim; with `detail`, also coll_id and name).

    Per rank: its events of kind "comm" when it has any (GPU kernels; dim through coll_id,
    "OTHER" when unlinked), else its timed collective calls.
    """
    cdim = collectives.select("coll_id", pl.col("dim").fill_null("OTHER"))
    ev = events.filter((pl.col("kind") == "comm") & pl.col("ts_ns").is_not_null()
                       & pl.col("dur_ns").is_not_null())
    extra = [pl.col("coll_id"), pl.col("name").cast(pl.String)] if detail else []
    ev = ev.join(cdim, on="coll_id", how="left").select(
        pl.col("rank").cast(pl.Int32), pl.col("ts_ns").alias("s"),
        (pl.col("ts_ns") + pl.col("dur_ns")).alias("e"), pl.col("dim").fill_null("OTHER"), *extra)
    have = ev.get_column("rank").unique().to_list()
    named = [pl.col("coll_id"), pl.coalesce(pl.col("name").cast(pl.String), pl.col("op").cast(pl.String))
             .alias("name")] if detail else []
    co = collectives.filter(pl.col("ts_ns").is_not_null() & pl.col("dur_ns").is_not_null()
                            & ~pl.col("rank").is_in(have)).select(
        pl.col("rank").cast(pl.Int32), pl.col("ts_ns").alias("s"),
        (pl.col("ts_ns") + pl.col("dur_ns")).alias("e"), pl.col("dim").fill_null("OTHER"), *named)
    return pl.concat([ev, co], how="vertical_relaxed").filter(pl.col("e") > pl.col("s"))


def per_rank_step(events: pl.DataFrame, collectives: pl.DataFrame, windows: pl.DataFrame, *,
                  compute: str | Sequence[str] = "auto") -> tuple[pl.DataFrame, pl.DataFrame]:
    """Time breakdown per (rank, step) and per (rank, step, dim), on each rank's own clock.

    Returns `per_rank_step` (rank, step, start_ns, end_ns, span_ns, compute_ns, comm_ns,
    overlap_ns, exposed_ns, busy_ns, idle_ns; comm_* over all dims together) and
    `per_rank_step_dim` (rank, step, dim, comm_ns, overlap_ns, exposed_ns). comm_ns is the
    union of that dim's intervals, overlap_ns its intersection with compute, exposed_ns =
    comm_ns - overlap_ns, busy_ns the union of compute, comm, memcpy and memset, and
    idle_ns = span_ns - busy_ns.
    """
    comm = comm_intervals(events, collectives)
    comp = compute_intervals(events, comm, compute=compute).with_columns(pl.lit(COMPUTE).alias("dim"))
    other = events.filter(pl.col("kind").is_in(["memcpy", "memset"]) & pl.col("ts_ns").is_not_null()
                          & pl.col("dur_ns").is_not_null()).select(
        pl.col("rank").cast(pl.Int32), pl.col("ts_ns").alias("s"),
        (pl.col("ts_ns") + pl.col("dur_ns")).alias("e"), pl.lit(BUSY).alias("dim"))
    return breakdown(pl.concat([comp.select("rank", "s", "e", "dim"), other, comm]), windows)


def breakdown(intervals: pl.DataFrame, windows: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """`per_rank_step`'s two frames from intervals already sorted into categories (rank, s, e,
    dim: COMPUTE, BUSY for memcpy/memset, else the comm dim) and step windows (rank, step,
    start_ns, end_ns). The one rule for exposed communication: the analysis calls it on the
    traced timeline, the replay on its replayed one (docs/replay.md, "Exposed communication")."""
    iv = split_by_step(intervals.select(pl.col("rank").cast(pl.Int32), "s", "e", pl.col("dim").cast(pl.String)),
                       windows)
    segs = windows.select(pl.col("rank").cast(pl.Int32), "step", "start_ns", "end_ns").sort("rank", "step")
    segs = segs.with_row_index("_seg").with_columns(pl.col("_seg").cast(pl.Int64))
    dims = sorted(set(iv.get_column("dim").unique().to_list()) - {COMPUTE, BUSY})
    cats = [COMPUTE, BUSY, *dims]
    cat_of = pl.DataFrame({"dim": cats, "_cat": list(range(len(cats)))},
                          schema={"dim": pl.String, "_cat": pl.Int64})
    iv = iv.join(segs.select("rank", "step", "_seg"), on=["rank", "step"]).join(cat_of, on="dim")
    seg = iv.get_column("_seg").to_numpy()
    cat = iv.get_column("_cat").to_numpy()
    t = np.concatenate([iv.get_column("s").to_numpy(), iv.get_column("e").to_numpy()])
    seg2 = np.concatenate([seg, seg])
    order = np.lexsort((t, seg2))
    delta = np.concatenate([np.ones(len(seg), np.int64), -np.ones(len(seg), np.int64)])
    comm_mask = np.array([c not in (COMPUTE, BUSY) for c in cats])
    length, overlap, busy, comm_any, comm_any_ov = _kernels.sweep(
        seg2[order], t[order], delta[order], np.concatenate([cat, cat])[order],
        segs.height, len(cats), 0, comm_mask)
    span = (segs.get_column("end_ns") - segs.get_column("start_ns")).to_numpy()
    wide = segs.drop("_seg").with_columns(
        pl.Series("span_ns", span), pl.Series("compute_ns", length[:, 0]),
        pl.Series("comm_ns", comm_any), pl.Series("overlap_ns", comm_any_ov),
        pl.Series("exposed_ns", comm_any - comm_any_ov), pl.Series("busy_ns", busy),
        pl.Series("idle_ns", np.maximum(span - busy, 0)),
    )
    longs = []
    for c, dim in enumerate(cats):
        if dim in (COMPUTE, BUSY):
            continue
        longs.append(segs.select("rank", "step").with_columns(
            pl.lit(dim).alias("dim"), pl.Series("comm_ns", length[:, c]),
            pl.Series("overlap_ns", overlap[:, c]), pl.Series("exposed_ns", length[:, c] - overlap[:, c])))
    long = (pl.concat(longs) if longs else
            pl.DataFrame(schema={"rank": pl.Int32, "step": pl.Int32, "dim": pl.String, "comm_ns": pl.Int64,
                                 "overlap_ns": pl.Int64, "exposed_ns": pl.Int64}))
    long = long.filter(pl.col("comm_ns") > 0).sort("rank", "step", "dim")
    return wide, long


@dataclass(frozen=True)
class DimExposure:
    """Per dim, communication time and its part not hidden under compute (ns), each the mean over
    ranks of the rank's mean per step window."""

    comm_ns: dict[str, int]
    exposed_ns: dict[str, int]


def mean_exposure(wide: pl.DataFrame, long: pl.DataFrame) -> DimExposure:
    """`DimExposure` from `breakdown`'s frames: each rank's sum over its step windows divided by
    its number of windows, then the mean over the ranks with windows."""
    n_windows = wide.group_by("rank").agg(pl.len().alias("_n"))
    n_ranks = max(1, n_windows.height)
    per = (long.join(n_windows, on="rank")
           .group_by("dim").agg((pl.col("comm_ns") / pl.col("_n")).sum().alias("c"),
                                (pl.col("exposed_ns") / pl.col("_n")).sum().alias("x"))
           .sort("dim"))
    return DimExposure(comm_ns={d: round(c / n_ranks) for d, c, _ in per.iter_rows()},
                       exposed_ns={d: round(x / n_ranks) for d, _, x in per.iter_rows()})
