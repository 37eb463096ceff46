"""Which replayed event waits for which: edges read from the trace, counted per rule.

Rules, in the order they are tried (docs/replay.md, "Trace-driven timing"):

- `stream`: each event follows the previous one on its lane (a CUDA stream, or a CPU thread).
- `sync`: `cuda_sync` events. A Stream Wait Event (cudaStreamWaitEvent on a cudaEventRecord)
  makes the first event launched on the waiting stream after the wait depend on the last event
  launched on the recorded stream before the record; an Event Sync or Stream Sync (the CPU
  waits) makes the first event launched afterwards on every other lane of the rank depend on it.
  Launch order is the correlation id order (Kineto's ac2g flow events link the same ids).
- `launch`: a GPU event that started more than LAUNCH_WAIT_NS after its launch call (the runtime
  event with the same rank and correlation id) returned was blocked: it depends on whatever ended
  last before it on its rank, when that ended after the launch and is not on its own lane.
- `gap` (last resort, only for events with neither a launch time nor a sync edge): a comm end
  followed within DEP_GAP_NS by a compute start on another lane of the rank, and the reverse.

An edge is kept only when the trace agrees with it (the waited-on event ended before the waiter
started); a sync event whose edge cannot be placed is counted as `sync_unresolved`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

DEP_GAP_NS = 5_000
LAUNCH_WAIT_NS = 10_000
RULES = ("stream", "sync", "launch", "gap")


@dataclass
class Dependencies:
    """Cross-lane edges as CSR (`dep_ids[dep_ptr[i]:dep_ptr[i+1]]` wait on i), each event's
    traced slack after its predecessors, and the number of edges found by each rule."""

    dep_ptr: np.ndarray
    dep_ids: np.ndarray
    slack: np.ndarray
    counts: dict[str, int]
    rule: np.ndarray  # the rule of each edge, aligned with dep_ids


def build(ev: pl.DataFrame, sync: pl.DataFrame, rank: np.ndarray, kind: np.ndarray, start: np.ndarray,
          end: np.ndarray, prev: np.ndarray, launch: np.ndarray) -> Dependencies:
    """Edges for the events `ev` (sorted by rank, lane, start; `kind` 0 compute, 1 comm, 2 other;
    `launch` the end of each event's launch call, NaN when unknown) and the `sync` events
    (rank, lane, sync_lane, sync_correlation, correlation, t, d), all on one clock."""
    n = rank.size
    lane = ev.get_column("lane").fill_null("").to_numpy().astype(str)
    corr = ev.get_column("correlation").fill_null(-1).to_numpy().astype(np.int64)
    _, rank_idx = np.unique(rank, return_inverse=True)
    span = float(max(np.max(end, initial=0.0), np.max(start, initial=0.0))) + 1.0

    sync_src, sync_dst, unresolved = _sync_edges(rank, lane, corr, start, end, launch, sync)
    waited = np.zeros(n, bool)
    waited[sync_dst] = True

    launch_src, launch_dst = _launch_edges(rank_idx, lane, start, end, prev, launch, span)
    gap_src, gap_dst = _gap_edges(rank_idx, lane, kind, start, end, span,
                                  eligible=~np.isfinite(launch) & ~waited)

    parts = {"sync": (sync_src, sync_dst), "launch": (launch_src, launch_dst), "gap": (gap_src, gap_dst)}
    counts = {"stream": int((prev >= 0).sum())}
    seen: set[tuple[int, int]] = set()
    src_all: list[int] = []
    dst_all: list[int] = []
    rule_all: list[str] = []
    for rule, (src, dst) in parts.items():
        c = 0
        for s, d in zip(src.tolist(), dst.tolist(), strict=True):
            if s == d or prev[d] == s or (s, d) in seen:
                continue
            seen.add((s, d))
            src_all.append(s)
            dst_all.append(d)
            rule_all.append(rule)
            c += 1
        counts[rule] = c
    counts["sync_unresolved"] = unresolved
    src = np.asarray(src_all, np.int64)
    dst = np.asarray(dst_all, np.int64)
    order = np.lexsort((dst, src))
    src, dst = src[order], dst[order]
    rules = np.asarray(rule_all, dtype=object)[order] if order.size else np.zeros(0, dtype=object)
    dep_ptr = np.zeros(n + 1, np.int64)
    np.add.at(dep_ptr, src + 1, 1)
    dep_ptr = np.cumsum(dep_ptr)
    pred_end = np.full(n, -np.inf)
    has_prev = prev >= 0
    pred_end[has_prev] = end[prev[has_prev]]
    if dst.size:
        np.maximum.at(pred_end, dst, end[src])
    slack = np.where(np.isfinite(pred_end), start - pred_end, 0.0)
    return Dependencies(dep_ptr.astype(np.int64), dst.astype(np.int64), slack, counts, rules)


def _last_ended_before(rank_idx: np.ndarray, end: np.ndarray, candidates: np.ndarray, q_rank: np.ndarray,
                       q_t: np.ndarray, span: float) -> np.ndarray:
    """For each query (rank, time): the candidate event on that rank with the latest end <= time
    (-1 when none). Ranks are laid end to end on one axis (`span` apart), exactly in float64."""
    if candidates.size == 0 or q_t.size == 0:
        return np.full(q_t.size, -1, np.int64)
    key = rank_idx[candidates] * span + end[candidates]
    order = np.argsort(key, kind="stable")
    key, cand = key[order], candidates[order]
    pos = np.searchsorted(key, q_rank * span + q_t, side="right") - 1
    out = np.where(pos >= 0, cand[np.clip(pos, 0, None)], -1)
    out[(out >= 0) & (rank_idx[np.clip(out, 0, None)] != q_rank)] = -1
    return out.astype(np.int64)


def _launch_edges(rank_idx: np.ndarray, lane: np.ndarray, start: np.ndarray, end: np.ndarray,
                  prev: np.ndarray, launch: np.ndarray, span: float) -> tuple[np.ndarray, np.ndarray]:
    blocked = np.nonzero(np.isfinite(launch) & (start - np.nan_to_num(launch, nan=np.inf) > LAUNCH_WAIT_NS))[0]
    if blocked.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    everyone = np.nonzero(end > start)[0]  # zero-length events block nothing
    cand = _last_ended_before(rank_idx, end, everyone, rank_idx[blocked], start[blocked], span)
    ok = cand >= 0
    c = np.clip(cand, 0, None)
    ok &= lane[c] != lane[blocked]
    ok &= end[c] > launch[blocked]
    p = prev[blocked]
    ok &= ~((p >= 0) & (end[np.clip(p, 0, None)] >= end[c]))
    return cand[ok], blocked[ok]


def _gap_edges(rank_idx: np.ndarray, lane: np.ndarray, kind: np.ndarray, start: np.ndarray, end: np.ndarray,
               span: float, eligible: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    src_l, dst_l = [], []
    for a_kind, b_kind in ((1, 0), (0, 1)):
        a = np.nonzero(kind == a_kind)[0]
        b = np.nonzero((kind == b_kind) & eligible)[0]
        cand = _last_ended_before(rank_idx, end, a, rank_idx[b], start[b], span)
        c = np.clip(cand, 0, None)
        ok = (cand >= 0) & (start[b] - end[c] <= DEP_GAP_NS) & (lane[c] != lane[b])
        src_l.append(cand[ok])
        dst_l.append(b[ok])
    return np.concatenate(src_l).astype(np.int64), np.concatenate(dst_l).astype(np.int64)


def _sync_edges(rank: np.ndarray, lane: np.ndarray, corr: np.ndarray, start: np.ndarray, end: np.ndarray,
                launch: np.ndarray, sync: pl.DataFrame) -> tuple[np.ndarray, np.ndarray, int]:
    if sync.height == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), 0
    blocks: dict[tuple[int, str], np.ndarray] = {}
    keys = np.char.add(np.char.add(rank.astype(str), "|"), lane)
    _, first = np.unique(keys, return_index=True)
    bounds = np.sort(np.append(first, rank.size))
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        blocks[int(rank[lo]), str(lane[lo])] = np.arange(lo, hi)
    lanes_of: dict[int, list[str]] = {}
    for r, ln in blocks:
        lanes_of.setdefault(r, []).append(ln)
    by_corr: dict[tuple[int, str], tuple[np.ndarray, np.ndarray]] = {}

    def launched(r: int, ln: str) -> tuple[np.ndarray, np.ndarray]:
        if (r, ln) not in by_corr:
            idx = blocks[r, ln]
            idx = idx[corr[idx] >= 0]
            o = np.argsort(corr[idx], kind="stable")
            by_corr[r, ln] = (corr[idx][o], idx[o])
        return by_corr[r, ln]

    src: list[int] = []
    dst: list[int] = []
    unresolved = 0
    for row in sync.iter_rows(named=True):
        r, t = int(row["rank"]), float(row["t"])
        t_end = t + float(row["d"] or 0)
        target_lane = str(row["sync_lane"])
        block = blocks.get((r, target_lane))
        if block is None:
            unresolved += 1
            continue
        target = None
        rec = row["sync_correlation"]
        if rec is not None and rec >= 0:
            cs, ids = launched(r, target_lane)
            pos = int(np.searchsorted(cs, rec, side="left")) - 1
            target = int(ids[pos]) if pos >= 0 else None
        if target is None:
            ends = end[block]
            done = np.nonzero(ends <= t)[0]
            target = int(block[done[np.argmax(ends[done])]]) if done.size else None
        if target is None:
            unresolved += 1
            continue
        own = str(row["lane"])
        waiters = [own] if (r, own) in blocks else lanes_of.get(r, [])
        placed = False
        for ln in waiters:
            if ln == target_lane:
                continue
            waiter = _first_after(blocks[r, ln], launched(r, ln), row["correlation"], start, launch, t_end)
            if waiter is not None and end[target] <= start[waiter]:
                src.append(target)
                dst.append(waiter)
                placed = True
        unresolved += not placed
    return np.asarray(src, np.int64), np.asarray(dst, np.int64), unresolved


def _first_after(block: np.ndarray, by_corr: tuple[np.ndarray, np.ndarray], sync_corr: int | None,
                 start: np.ndarray, launch: np.ndarray, t_end: float) -> int | None:
    """The first event of a lane issued after a sync: by correlation id (launch order) when both
    carry one, else by launch time, else by start time."""
    cs, ids = by_corr
    if sync_corr is not None and sync_corr >= 0 and cs.size:
        pos = int(np.searchsorted(cs, sync_corr, side="right"))
        return int(ids[pos]) if pos < cs.size else None
    lt = launch[block]
    if np.isfinite(lt).any():
        after = np.nonzero(np.isfinite(lt) & (lt >= t_end))[0]
        return int(block[after[0]]) if after.size else None
    pos = int(np.searchsorted(start[block], t_end, side="left"))
    return int(block[pos]) if pos < block.size else None
