"""Clock alignment: one common clock for all ranks, estimated from collective end times."""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import polars as pl
import pyarrow as pa

from tracekit.analysis import _kernels
from tracekit.analysis._frames import P2P_OPS, Frame, frame, table
from tracekit.analysis.matching import keyed
from tracekit.results import Result


class Alignment(Result, frozen=True, kw_only=True):
    """How `align_clocks` set the offsets: the method, the instances used, the iterations and
    solver steps (converged False: stopped at max_iter), the anchor rank, the connected components,
    the ranks not connected to the anchor, whether send/recv pairs were needed, the end-time spread
    over instances before (`raw_spread_ns`) and after (`residual_ns`) alignment (median, p90, max),
    the per-rank median residual, and notes."""

    method: str
    instances_used: int = 0
    iterations: int = 0
    solver_steps: int = 0
    converged: bool = True
    anchor: int | None = None
    components: list[list[int]] = msgspec.field(default_factory=list)
    unconnected_ranks: list[int] = msgspec.field(default_factory=list)
    used_p2p: bool = False
    raw_spread_ns: dict[str, float | None] = msgspec.field(default_factory=dict)
    residual_ns: dict[str, float | None] = msgspec.field(default_factory=dict)
    per_rank_residual_ns: dict[int, float] = msgspec.field(default_factory=dict)
    notes: list[str] = msgspec.field(default_factory=list)


def align_clocks(
    collectives: Frame, ranks: Frame, *, max_iter: int = 100, tol_ns: float = 0.5,
) -> tuple[pa.Table, Alignment]:
    """Estimate each rank's clock offset from the end times of the collectives it joined.

    Participants of a collective finish nearly together, so for rank r and instance i,
    `end[r, i] + offset[r] ~ common_end[i]`. The offsets minimise the sum of absolute deviations
    over the bipartite rank-instance graph (smoothed by a 100 ns floor), jointly for all ranks: damped
    Newton steps (`_solve`), each solving the rank Laplacian with the instances' common ends
    eliminated (sparse conjugate gradients, `weighted_offsets`: the same method at every scale),
    until no offset moves by more than `tol_ns` or `max_iter` iterations. Send/recv pairs are used
    only when the collectives leave ranks unconnected (a send often returns before the recv completes). In each
    component the lowest rank is the anchor (offset 0): ranks outside the anchor's component are
    aligned only among themselves, and ranks with no timed collective keep offset 0.

    Returns the ranks table with `clock_offset_ns` (common = own + offset) and the `Alignment`.
    """
    coll = frame(collectives, "collectives")
    rk = frame(ranks, "ranks")
    if "instance" not in coll.columns or coll.get_column("instance").null_count() == coll.height:
        coll = keyed(coll)
    all_ranks = sorted(set(rk.get_column("rank").to_list()) | set(coll.get_column("rank").to_list()))
    report: dict[str, Any] = {
        "method": "end-time least absolute deviation (damped Newton, joint over all ranks)",
        "instances_used": 0, "iterations": 0, "solver_steps": 0, "converged": True, "anchor": None,
        "components": [],
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
        return _with_offsets(rk, all_ranks, offsets), Alignment(**report)

    edges = multi.filter(~pl.col("p2p"))
    rank_arr = np.array(all_ranks, np.int64)
    labels = _components(edges, rank_arr)
    if len(set(labels.tolist())) > 1 and multi.filter(pl.col("p2p")).height:
        with_p2p = _components(multi, rank_arr)
        if len(set(with_p2p.tolist())) < len(set(labels.tolist())):
            edges, labels = multi, with_p2p
            report["used_p2p"] = True
            report["notes"].append("send/recv pairs were needed to connect some ranks")
    if edges.height == 0:
        report["notes"].append("only send/recv with timestamps: offsets left at 0")
        return _with_offsets(rk, all_ranks, offsets), Alignment(**report)

    r_idx = np.searchsorted(rank_arr, edges.get_column("rank").to_numpy().astype(np.int64))
    inst_codes, i_idx = np.unique(edges.get_column("instance").to_numpy(), return_inverse=True)
    end = edges.get_column("end").to_numpy().astype(np.int64)
    base = int(np.median(end))
    e = (end - base).astype(np.float64)
    comps: dict[int, list[int]] = {}
    for i, lab in enumerate(labels.tolist()):
        comps.setdefault(lab, []).append(i)
    present_mask = np.bincount(r_idx, minlength=len(all_ranks)) > 0
    fixed = ~present_mask
    fixed[[min(m) for m in comps.values()]] = True
    off, iterations, cg_steps, converged = _solve(r_idx, i_idx.astype(np.int64), e, len(all_ranks),
                                                  len(inst_codes), max_iter, tol_ns, fixed)
    present = set(np.flatnonzero(present_mask).tolist())
    offsets = {r: round(off[i]) if present_mask[i] else 0 for i, r in enumerate(all_ranks)}
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
    report["solver_steps"] = cg_steps
    report["converged"] = converged
    if not converged:
        report["notes"].append(
            f"the offsets had not settled after {iterations} iterations (max_iter): they may be off "
            f"by more than {tol_ns:g} ns")
    report["raw_spread_ns"] = _stats(_spread(i_idx, e, len(inst_codes)))
    report["residual_ns"] = _stats(_spread(i_idx, shifted, len(inst_codes)))
    common = _group_median(i_idx, shifted, len(inst_codes))
    dev = np.abs(shifted - common[i_idx])
    per_rank = _group_median(r_idx, dev, len(all_ranks))
    report["per_rank_residual_ns"] = {all_ranks[i]: round(float(per_rank[i]), 1)
                                      for i in sorted(present)}
    return _with_offsets(rk, all_ranks, offsets), Alignment(**report)


def _solve(r_idx: np.ndarray, i_idx: np.ndarray, e: np.ndarray, n_r: int, n_i: int,
           max_iter: int, tol: float, fixed: np.ndarray, *, floor_ns: float = 100.0, min_curv: float = 0.1
           ) -> tuple[np.ndarray, int, int, bool]:
    """Least absolute deviations, smoothed to sum sqrt(res^2 + floor^2) over the pairs, minimised
    jointly over all offsets (`fixed` ranks held at 0) and the instances' common ends: from the
    least-squares start, each iteration is one `weighted_offsets` solve for a step, then a line
    search along it. Plain IRLS (weights 1/sqrt(res^2 + floor^2)) overstates the curvature of a
    residual much larger than the floor by (res/floor)^2, so where the optimum lies in a wide gap
    between residuals (jittered ends, the median of few transfers) it creeps there by a small
    fraction of its remaining error per step: its moves fall under `tol` long before its error does.
    These steps weigh each pair by its true curvature floor^2/(res^2 + floor^2)^1.5 (Newton), but at
    least `curv` times the IRLS weight: `curv` starts at `min_curv`, drops tenfold (to 1e-4) after
    every full step and rises tenfold (to 1, the IRLS weight, whose step always descends) after
    every shortened one, which keeps CG conditioned against ms outliers far from the optimum.
    Stops once a full step (one the line search did not shorten) moved no offset by more than
    `tol`: a shortened step is small because it was cut, not because the optimum is near. Returns
    the offsets, the iterations, the conjugate-gradient steps they took and whether it stopped by
    `tol` (not at `max_iter`)."""
    by_i = np.lexsort((r_idx, i_idx))  # one order whatever order the pairs came in: same sums, same tree
    r_s, i_s, e_s = r_idx[by_i], i_idx[by_i], e[by_i]
    starts = np.searchsorted(i_s, np.arange(n_i + 1))
    plan = _TreePlan(r_s, starts, n_r, fixed)
    ones = np.ones(len(e))
    off, steps = _cg(r_s, starts, e_s, ones, n_r, fixed, np.zeros(n_r), plan=plan)
    common = np.bincount(i_s, e_s + off[r_s], n_i) / np.bincount(i_s, ones, n_i)
    f2 = floor_ns * floor_ns
    it, converged, curv = 1, False, min_curv
    while it < max_iter:
        it += 1
        res = e_s + off[r_s] - common[i_s]
        q = res * res + f2
        root = np.sqrt(q)
        g = res / root
        h = np.maximum(f2 / (q * root), curv / root)
        step, k = _cg(r_s, starts, g / h, h, n_r, fixed, np.zeros(n_r), rtol=1e-6, plan=plan)
        steps += k
        d_common = np.bincount(i_s, h * (g / h + step[r_s]), n_i) / np.bincount(i_s, h, n_i)
        d_res = step[r_s] - d_common[i_s]
        t = _line_search(res, d_res, f2)
        curv = max(curv / 10, 1e-4) if t == 1.0 else min(curv * 10, 1.0)
        off += t * step
        common += t * d_common
        if t == 1.0 and float(np.max(np.abs(step), initial=0.0)) <= tol:
            converged = True
            break
    return off, it, steps, converged


def _line_search(res: np.ndarray, d: np.ndarray, f2: float) -> float:
    """A step length t along `d` that lowers sum sqrt((res + t d)^2 + f2): the Newton step (t = 1)
    unless it overshoots the minimum on the line and raises the sum, then halved until it does not.
    The overshoot test reads the slope at t, which keeps its precision where the sums do not."""
    f0 = float(np.sum(np.sqrt(res * res + f2)))
    t = 1.0
    while t > 1e-12:
        r = res + t * d
        q = np.sqrt(r * r + f2)
        if float(np.sum(r / q * d)) <= 0.0 or float(np.sum(q)) < f0:
            return t
        t *= 0.5
    return 0.0


def weighted_offsets(r_idx: np.ndarray, i_idx: np.ndarray, e: np.ndarray, w: np.ndarray, n_r: int,
                     n_i: int, fixed: np.ndarray) -> tuple[np.ndarray, int]:
    """Offsets o minimising sum_k w_k (e_k + o[r_k] - c[i_k])^2 over o and the instances' common
    ends c, with o = 0 on `fixed` ranks (one anchor per connected component, and ranks without
    pairs). Eliminating c leaves the rank Laplacian system L o = b, solved by conjugate gradients
    preconditioned with a spanning tree of the rank-group graph (`_TreePlan`), whose products with L
    are passes over the (rank, instance) pairs: memory and time per step are linear in the pairs,
    where forming L densely costs ranks^2 memory and solving it ranks^3 time. Returns o and the
    number of steps."""
    by_i = np.lexsort((r_idx, i_idx))  # one order whatever order the pairs came in: same sums, same tree
    starts = np.searchsorted(i_idx[by_i], np.arange(n_i + 1))
    return _cg(r_idx[by_i], starts, e[by_i], w[by_i], n_r, fixed, np.zeros(n_r))


def _cg(r: np.ndarray, starts: np.ndarray, e: np.ndarray, w: np.ndarray, n_r: int, fixed: np.ndarray,
        x0: np.ndarray, *, rtol: float = 1e-12, plan: _TreePlan | None = None) -> tuple[np.ndarray, int]:
    """`weighted_offsets` on pairs grouped by instance (`starts`), from the guess `x0`."""
    free = ~fixed
    seg = np.repeat(np.arange(len(starts) - 1), np.diff(starts))
    tot = np.bincount(seg, w, len(starts) - 1)[seg]

    def lap(x: np.ndarray) -> np.ndarray:
        return np.where(free, _kernels.centred_sums(r, starts, w, x[r], n_r), 0.0)

    b = np.where(free, -_kernels.centred_sums(r, starts, w, e, n_r), 0.0)
    diag = np.bincount(r, w * (1.0 - w / tot), n_r)
    precond = (plan or _TreePlan(r, starts, n_r, fixed)).preconditioner(w, np.where(free, diag, 0.0))
    x = np.where(free, x0, 0.0)
    res = b - lap(x)
    goal = rtol * float(np.linalg.norm(b))
    z = precond(res)
    p = z.copy()
    rz = float(res @ z)
    k = 0
    while k < 10 * n_r + 100 and float(np.linalg.norm(res)) > goal:
        lp = lap(p)
        alpha = rz / float(p @ lp)
        x += alpha * p
        res -= alpha * lp
        z = precond(res)
        rz, rz_old = float(res @ z), rz
        p = z + (rz / rz_old) * p
        k += 1
    return x, k


class _TreePlan:
    """Spanning-tree preconditioner of the rank Laplacian (the graph part of it, fixed per solve).

    Instances with the same member ranks (a group's calls, a send/recv pair's transfers) are merged
    into one node whose edge to each member weighs the sum of that member's pair weights; with equal
    weights, eliminating the merged node gives exactly the sum of the instances' Laplacians. A
    maximum-weight spanning forest of this rank-group graph, fixed ranks merged into one grounded
    node, is solved exactly in linear time (`_kernels.tree_solve`), with the rank diagonal topped up
    to the Laplacian's own where the forest left edges out. On a chain of ranks (a pipeline linked
    only by send/recv) the forest is the whole graph and CG converges in a few steps, where the
    Jacobi preconditioner needs about as many steps as the chain is long."""

    def __init__(self, r: np.ndarray, starts: np.ndarray, n_r: int, fixed: np.ndarray) -> None:
        n_i = len(starts) - 1
        seg = np.repeat(np.arange(n_i), np.diff(starts))
        h = np.random.default_rng(0).integers(0, 2**63, n_r, dtype=np.uint64)
        csum = np.concatenate([np.zeros(1, np.uint64), np.cumsum(h[r], dtype=np.uint64)])
        _, grp = np.unique(csum[starts[1:]] - csum[starts[:-1]], return_inverse=True)
        key, self.edge = np.unique(grp[seg].astype(np.int64) * n_r + r, return_inverse=True)
        self.n_edges = len(key)
        node = np.where(fixed, 0, np.arange(1, n_r + 1))
        self.rank_node = node
        self.u = node[key % n_r]
        self.v = 1 + n_r + key // n_r
        self.n_nodes = 1 + n_r + (int(grp.max()) + 1 if n_i else 0)
        self.free = ~fixed

    def preconditioner(self, w: np.ndarray, diag: np.ndarray) -> Any:
        """z = M^-1 res for the pair weights `w`, M's rank diagonal at least `diag`."""
        wt = np.bincount(self.edge, w, self.n_edges)
        bfs, parent, via = _kernels.spanning_forest(self.u, self.v, np.argsort(-wt, kind="stable"), self.n_nodes)
        c = np.where(via >= 0, wt[np.maximum(via, 0)], 0.0)
        node_diag = np.bincount(parent[parent >= 0], c[parent >= 0], self.n_nodes) + c
        kept = via[via >= 0]
        gsum = node_diag[self.v[kept]]
        schur = np.bincount(self.u[kept], wt[kept] * (1.0 - wt[kept] / gsum), self.n_nodes)
        node_diag[self.rank_node] += np.where(self.free, np.maximum(diag - schur[self.rank_node], 0.0), 0.0)
        node_of, free = self.rank_node, self.free

        def solve(res: np.ndarray) -> np.ndarray:
            rhs = np.zeros(self.n_nodes)
            rhs[node_of[free]] = res[free]
            return np.where(free, _kernels.tree_solve(bfs, parent, c, node_diag, rhs)[node_of], 0.0)

        return solve


def _components(edges: pl.DataFrame, rank_arr: np.ndarray) -> np.ndarray:
    r = np.searchsorted(rank_arr, edges.get_column("rank").to_numpy().astype(np.int64))
    _, inst = np.unique(edges.get_column("instance").to_numpy(), return_inverse=True)
    return _kernels.components(r, inst.astype(np.int64), len(rank_arr), int(inst.max(initial=-1)) + 1)


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
