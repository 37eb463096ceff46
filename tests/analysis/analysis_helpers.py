"""Small hand-built tables for the analysis tests."""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from tracekit import schema
from tracekit.analysis import _kernels


def coll_table(rows: list[dict[str, Any]]) -> pa.Table:
    """Collectives from dicts; coll_id defaults to the row index."""
    if not rows:
        return schema.empty("collectives")
    cols: dict[str, list[Any]] = {}
    for i, r in enumerate(rows):
        r = {"coll_id": i, **r}
        for k in r:
            cols.setdefault(k, [None] * i)
        for k in cols:
            cols[k].append(r.get(k))
    return schema.conform("collectives", {k: pa.array(v, type=schema.COLLECTIVES.field(k).type
                                                        if k in schema.COLLECTIVES.names else None)
                                          for k, v in cols.items()})


def ranks_table(n: int, hosts: list[str] | None = None) -> pa.Table:
    return schema.conform("ranks", {"rank": list(range(n)), "world_size": [n] * n,
                                    "host": hosts or ["h0"] * n})


def groups_table(groups: list[tuple[str, str | None, list[int]]]) -> pa.Table:
    return schema.conform("groups", {"group": [g for g, _, _ in groups], "desc": [d for _, d, _ in groups],
                                     "ranks": [r for _, _, r in groups], "size": [len(r) for _, _, r in groups]})


def events_table(rows: list[dict[str, Any]]) -> pa.Table:
    keys = ["rank", "lane", "kind", "name", "ts_ns", "dur_ns", "step", "coll_id"]
    return schema.conform("events", {k: pa.array([r.get(k) for r in rows], type=schema.EVENTS.field(k).type)
                                     for k in keys})


def strip_derived(tables: dict[str, pa.Table]) -> dict[str, pa.Table]:
    """Remove what the analysis must find itself: instance, dim, clock offsets, group dims."""
    out = dict(tables)
    c = out["collectives"]
    for col in ("instance", "dim"):
        i = c.schema.get_field_index(col)
        c = c.set_column(i, c.schema.field(col), pa.nulls(c.num_rows, c.schema.field(col).type))
    out["collectives"] = c
    r = out["ranks"]
    i = r.schema.get_field_index("clock_offset_ns")
    out["ranks"] = r.set_column(i, r.schema.field(i), pa.nulls(r.num_rows, pa.int64()))
    g = out["groups"]
    i = g.schema.get_field_index("dims")
    out["groups"] = g.set_column(i, g.schema.field(i), pa.nulls(g.num_rows, g.schema.field(i).type))
    return out


def dense_weighted_offsets(r: np.ndarray, i: np.ndarray, e: np.ndarray, w: np.ndarray, n_r: int, n_i: int,
                           fixed: np.ndarray) -> np.ndarray:
    """One weighted least-squares step as the alignment solved it before the sparse solver: the
    dense rank Laplacian, fixed ranks removed, solved directly."""
    lap = np.zeros((n_r, n_r))
    b = np.zeros(n_r)
    for k in range(n_i):
        m = i == k
        rr, ww, ee = r[m], w[m], e[m]
        tot = ww.sum()
        lap[rr, rr] += ww
        lap[np.ix_(rr, rr)] -= np.outer(ww, ww) / tot
        b[rr] -= ww * (ee - ww @ ee / tot)
    keep = ~fixed & (np.diag(lap) > 0)
    out = np.zeros(n_r)
    out[keep] = np.linalg.solve(lap[np.ix_(keep, keep)], b[keep])
    return out


def dense_irls(r: np.ndarray, i: np.ndarray, e: np.ndarray, n_r: int, n_i: int, fixed: np.ndarray,
               max_iter: int = 100_000, tol: float = 1e-3, floor: float = 100.0) -> np.ndarray:
    """Plain IRLS on the alignment's objective with every step solved densely
    (`dense_weighted_offsets`), run to convergence: the optimum the solver must reach."""
    w = np.ones(len(e))
    off = np.zeros(n_r)
    for it in range(1, max_iter + 1):
        new = dense_weighted_offsets(r, i, e, w, n_r, n_i, fixed)
        shifted = e + new[r]
        common = np.bincount(i, w * shifted, n_i) / np.bincount(i, w, n_i)
        res = shifted - common[i]
        w = 1.0 / np.sqrt(res * res + floor * floor)
        moved = np.max(np.abs(new - off))
        off = new
        if moved <= tol and it > 1:
            break
    return off


def smoothed_lad(r: np.ndarray, i: np.ndarray, e: np.ndarray, off: np.ndarray, n_i: int,
                 floor: float = 100.0) -> float:
    """The alignment's objective at offsets `off`: sum sqrt(res^2 + floor^2) over the pairs, each
    instance's common end set to its own minimiser (bisection on the slope, 200 halvings)."""
    s = e + off[r]
    lo = np.full(n_i, np.inf)
    hi = np.full(n_i, -np.inf)
    np.minimum.at(lo, i, s)
    np.maximum.at(hi, i, s)
    for _ in range(200):
        mid = (lo + hi) / 2
        d = mid[i] - s
        up = np.bincount(i, d / np.sqrt(d * d + floor * floor), n_i) > 0
        hi = np.where(up, mid, hi)
        lo = np.where(up, lo, mid)
    d = s - (lo + hi)[i] / 2
    return float(np.sum(np.sqrt(d * d + floor * floor)))


def alignment_edges(matched: pa.Table, n_ranks: int, *, p2p: bool
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, np.ndarray]:
    """The (rank, instance, end) pairs `align_clocks` fits, ranks numbered 0..n-1: timed calls of
    instances seen on two or more ranks (send/recv only with `p2p`); and the fixed ranks (the
    lowest of each component, and ranks without a pair)."""
    timed = pl.from_arrow(matched).filter(pl.col("ts_ns").is_not_null() & pl.col("dur_ns").is_not_null())
    timed = timed.unique(["rank", "instance"], keep="first").filter(pl.len().over("instance") > 1)
    if not p2p:
        timed = timed.filter(~pl.col("op").is_in(["send", "recv"]))
    r = timed["rank"].to_numpy().astype(np.int64)
    _, i = np.unique(timed["instance"].to_numpy(), return_inverse=True)
    i = i.astype(np.int64)
    end = (timed["ts_ns"] + timed["dur_ns"]).to_numpy()
    e = (end - int(np.median(end))).astype(np.float64)
    n_i = int(i.max()) + 1
    fixed = np.bincount(r, minlength=n_ranks) == 0
    fixed[np.unique(_kernels.components(r, i, n_ranks, n_i))] = True
    return r, i, e, n_i, fixed
