"""Clock alignment as it was before the sparse solver (tracekit/analysis/clocks.py at commit
2a48166, with its dense `normal_equations` kernel from analysis/_kernels.py), kept here, outside
the package, as the baseline of `bench_analyze.py --align`: every IRLS step forms the ranks x ranks
Laplacian and solves it with np.linalg.solve. Above DENSE_LIMIT ranks it switched to alternating
medians, which gave wrong offsets; the benchmark raises the limit to time the dense solve."""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
import polars as pl
import pyarrow as pa

from tracekit.analysis import _kernels
from tracekit.analysis._frames import P2P_OPS, Frame, frame, table
from tracekit.analysis.matching import keyed

DENSE_LIMIT = 4096


def align_clocks(
    collectives: Frame, ranks: Frame, *, max_iter: int = 100, tol_ns: float = 0.5,
) -> tuple[pa.Table, dict[str, Any]]:
    """Estimate each rank's clock offset from the end times of the collectives it joined.

    Participants of a collective finish nearly together, so for rank r and instance i,
    `end[r, i] + offset[r] ~ common_end[i]`. The offsets minimise the sum of absolute deviations
    over the bipartite rank-instance graph, jointly for all ranks: iteratively reweighted least
    squares, each step solving the rank Laplacian with the instances' common ends eliminated,
    until no offset moves by more than `tol_ns` (above 4,096 ranks, rank-by-rank alternating
    medians instead). Send/recv pairs are used only when the
    collectives leave ranks unconnected (a send often returns before the recv completes). In each
    connected component the lowest rank is the anchor (offset 0).

    Returns the ranks table with `clock_offset_ns` (common = own + offset) and a report:
    method, instances_used, iterations, anchor, components, unconnected_ranks, used_p2p,
    raw_spread_ns and residual_ns (median/p90/max over instances of the end-time spread before
    and after alignment), per_rank_residual_ns, notes.
    """
    coll = frame(collectives, "collectives")
    rk = frame(ranks, "ranks")
    if "instance" not in coll.columns or coll.get_column("instance").null_count() == coll.height:
        coll = keyed(coll)
    all_ranks = sorted(set(rk.get_column("rank").to_list()) | set(coll.get_column("rank").to_list()))
    report: dict[str, Any] = {
        "method": "end-time least absolute deviation (IRLS, joint over all ranks)",
        "instances_used": 0, "iterations": 0, "anchor": None, "components": [],
        "unconnected_ranks": [], "used_p2p": False,
        "raw_spread_ns": _stats(np.zeros(0)), "residual_ns": _stats(np.zeros(0)),
        "per_rank_residual_ns": {}, "notes": [],
    }
    offsets = {r: 0 for r in all_ranks}
    timed = coll.filter(
        pl.col("ts_ns").is_not_null() & pl.col("dur_ns").is_not_null() & pl.col("instance").is_not_null()
    ).select(
        "rank", "instance", (pl.col("ts_ns") + pl.col("dur_ns")).alias("end"),
        pl.col("op").is_in(P2P_OPS).alias("p2p"),
    ).unique(["rank", "instance"], keep="first")
    multi = timed.join(
        timed.group_by("instance").agg(pl.len().alias("n")).filter(pl.col("n") > 1).select("instance"),
        on="instance",
    )
    if multi.height == 0 or not all_ranks:
        report["notes"].append("no collectives with timestamps on two or more ranks: offsets left at 0")
        return _with_offsets(rk, all_ranks, offsets), report

    edges = multi.filter(~pl.col("p2p"))
    idx = {r: i for i, r in enumerate(all_ranks)}
    labels = _components(edges, idx)
    if len(set(labels.tolist())) > 1 and multi.filter(pl.col("p2p")).height:
        with_p2p = _components(multi, idx)
        if len(set(with_p2p.tolist())) < len(set(labels.tolist())):
            edges, labels = multi, with_p2p
            report["used_p2p"] = True
            report["notes"].append("send/recv pairs were needed to connect some ranks")
    if edges.height == 0:
        report["notes"].append("only send/recv with timestamps: offsets left at 0")
        return _with_offsets(rk, all_ranks, offsets), report

    r_idx = np.array([idx[r] for r in edges.get_column("rank").to_list()], np.int64)
    inst_codes, i_idx = np.unique(edges.get_column("instance").to_numpy(), return_inverse=True)
    end = edges.get_column("end").to_numpy().astype(np.int64)
    base = int(np.median(end))
    e = (end - base).astype(np.float64)
    comps: dict[int, list[int]] = {}
    for i, lab in enumerate(labels.tolist()):
        comps.setdefault(lab, []).append(i)
    args = (r_idx, i_idx.astype(np.int64), e, len(all_ranks), len(inst_codes), max_iter, tol_ns)
    if len(all_ranks) <= DENSE_LIMIT:
        off, iterations = _solve(*args, anchors=[min(m) for m in comps.values()])
    else:
        off, iterations = _solve_medians(*args)
        report["method"] = "end-time alternating medians (rank by rank; more than "\
            f"{DENSE_LIMIT} ranks)"
    present = set(r_idx.tolist())
    for members in comps.values():
        anchor = min(members)
        shift = off[anchor]
        for m in members:
            off[m] -= shift
    offsets = {r: round(off[idx[r]]) if idx[r] in present else 0 for r in all_ranks}
    main = comps[labels[0]]
    report["anchor"] = all_ranks[min(main)]
    report["components"] = [sorted(all_ranks[m] for m in members) for members in comps.values()
                            if any(m in present for m in members)]
    report["unconnected_ranks"] = sorted(all_ranks[i] for i in range(len(all_ranks))
                                         if labels[i] != labels[0] or i not in present)
    if report["unconnected_ranks"]:
        report["notes"].append(
            f"{len(report['unconnected_ranks'])} rank(s) share no timed collective with rank "
            f"{report['anchor']}: their offsets are relative to their own component (or 0)"
        )
    shifted = e + off[r_idx]
    report["instances_used"] = len(inst_codes)
    report["iterations"] = iterations
    report["raw_spread_ns"] = _stats(_spread(i_idx, e, len(inst_codes)))
    report["residual_ns"] = _stats(_spread(i_idx, shifted, len(inst_codes)))
    common = _group_median(i_idx, shifted, len(inst_codes))
    dev = np.abs(shifted - common[i_idx])
    per_rank = _group_median(r_idx, dev, len(all_ranks))
    report["per_rank_residual_ns"] = {all_ranks[i]: round(float(per_rank[i]), 1)
                                      for i in sorted(present)}
    return _with_offsets(rk, all_ranks, offsets), report


def _solve(r_idx: np.ndarray, i_idx: np.ndarray, e: np.ndarray, n_r: int, n_i: int,
           max_iter: int, tol: float, anchors: list[int], *, floor_ns: float = 100.0
           ) -> tuple[np.ndarray, int]:
    """Least absolute deviations by iteratively reweighted least squares; every step solves all
    offsets jointly (dense rank Laplacian), so blocks of tightly bound ranks move together."""
    by_i = np.argsort(i_idx, kind="stable")
    r_s, i_s, e_s = r_idx[by_i], i_idx[by_i], e[by_i]
    starts = np.searchsorted(i_s, np.arange(n_i + 1))
    w = np.ones(len(e_s))
    off = np.zeros(n_r)
    pin = np.zeros(n_r)
    pin[anchors] = 1.0
    it = 0
    for it in range(1, max_iter + 1):
        lap, b = normal_equations(r_s, starts, w, e_s, n_r)
        scale = max(float(np.max(np.abs(np.diag(lap)))), 1.0)
        lap[np.diag_indices(n_r)] += pin * scale * 1e6 + (np.diag(lap) == 0)
        new = np.linalg.solve(lap, b)
        shifted = e_s + new[r_s]
        common = np.bincount(i_s, w * shifted, n_i) / np.bincount(i_s, w, n_i)
        res = shifted - common[i_s]
        w = 1.0 / np.sqrt(res * res + floor_ns * floor_ns)
        moved = float(np.max(np.abs(new - off))) if n_r else 0.0
        off = new
        if moved <= tol and it > 1:
            break
    return off, it


def _solve_medians(r_idx: np.ndarray, i_idx: np.ndarray, e: np.ndarray, n_r: int, n_i: int,
                   max_iter: int, tol: float) -> tuple[np.ndarray, int]:
    """Alternating medians (rank-by-rank coordinate descent): for runs too large for `_solve`."""
    off = np.zeros(n_r)
    by_i = np.argsort(i_idx, kind="stable")
    by_r = np.argsort(r_idx, kind="stable")
    i_starts = np.searchsorted(i_idx[by_i], np.arange(n_i + 1))
    r_starts = np.searchsorted(r_idx[by_r], np.arange(n_r + 1))
    has = np.diff(r_starts) > 0
    it = 0
    for it in range(1, max_iter + 1):  # noqa: B007
        common = _kernels.segment_median((e + off[r_idx])[by_i], i_starts)
        new = np.zeros(n_r)
        new[has] = _kernels.segment_median((common[i_idx] - e)[by_r], r_starts)[has]
        new -= np.median(new[has])
        moved = np.max(np.abs(new - off)) if n_r else 0.0
        off = new
        if moved <= tol:
            break
    return off, it


def _components(edges: pl.DataFrame, idx: dict[int, int]) -> np.ndarray:
    r = np.array([idx[x] for x in edges.get_column("rank").to_list()], np.int64)
    _, inst = np.unique(edges.get_column("instance").to_numpy(), return_inverse=True)
    return _kernels.components(r, inst.astype(np.int64), len(idx), int(inst.max(initial=-1)) + 1)


def _group_median(seg: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    order = np.argsort(seg, kind="stable")
    starts = np.searchsorted(seg[order], np.arange(n + 1))
    out = np.zeros(n)
    has = np.diff(starts) > 0
    out[has] = _kernels.segment_median(values[order], starts)[has]
    return out


def _spread(seg: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    hi = np.full(n, -np.inf)
    lo = np.full(n, np.inf)
    np.maximum.at(hi, seg, values)
    np.minimum.at(lo, seg, values)
    return hi - lo


def _stats(x: np.ndarray) -> dict[str, float | None]:
    if x.size == 0:
        return {"median": None, "p90": None, "max": None}
    return {"median": round(float(np.median(x)), 1), "p90": round(float(np.quantile(x, 0.9)), 1),
            "max": round(float(np.max(x)), 1)}


def _with_offsets(rk: pl.DataFrame, all_ranks: list[int], offsets: dict[int, int]) -> pa.Table:
    known = set(rk.get_column("rank").to_list())
    extra = [r for r in all_ranks if r not in known]
    if extra:
        rk = pl.concat([rk, pl.DataFrame({"rank": extra}, schema={"rank": rk.schema["rank"]})],
                       how="diagonal_relaxed")
    off = pl.DataFrame({"rank": list(offsets), "_off": list(offsets.values())},
                       schema={"rank": rk.schema["rank"], "_off": pl.Int64})
    rk = rk.join(off, on="rank", how="left").with_columns(
        pl.col("_off").fill_null(0).alias("clock_offset_ns")).drop("_off").sort("rank")
    return table(rk, "ranks")


@numba.njit(cache=True, nogil=True)
def normal_equations(r, starts, w, e, n_r):  # pragma: no cover - jitted
    """Normal equations of min sum_k w_k (e_k + o[r_k] - c_i)^2 with each instance's common
    value c_i eliminated. Rows are grouped by instance (`starts`); returns the dense rank
    Laplacian L and right-hand side b (L o = b)."""
    lap = np.zeros((n_r, n_r))
    b = np.zeros(n_r)
    for k in range(starts.shape[0] - 1):
        s0 = starts[k]
        s1 = starts[k + 1]
        tot = 0.0
        acc = 0.0
        for a in range(s0, s1):
            tot += w[a]
            acc += w[a] * e[a]
        if tot <= 0.0:
            continue
        mean = acc / tot
        for a in range(s0, s1):
            ra = r[a]
            lap[ra, ra] += w[a]
            b[ra] -= w[a] * (e[a] - mean)
            f = w[a] / tot
            for c in range(s0, s1):
                lap[ra, r[c]] -= f * w[c]
    return lap, b
