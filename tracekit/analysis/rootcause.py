"""Root causes: the wait-for graph across ranks, the root of each chain of waits, and the
critical path of each step.

A wait at a collective instance names a symptom: the ranks that arrived early waited for the
last one (`waited_on`). Why was that rank late? Either its own work since its previous instance
took longer than the others' (it is the root), or its previous instance ended late for it,
because there it waited for someone else (the wait is inherited: follow the edge to that
instance and ask again). Following the edges backwards in time always ends, at the rank whose
own work made the chain start: `root_rank`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

#: The rank waited on is the root when its own work fills at least this share of the wait.
OWN_SHARE = 0.5
#: Chains are stored up to this many hops (the root is always found).
MAX_CHAIN = 32

CHAIN_SCHEMA = {"instance": pl.Int64, "waited_on": pl.Int32, "root_rank": pl.Int32, "root_instance": pl.Int64,
                "root_step": pl.Int32, "root_stall_ns": pl.Int64, "root_reason": pl.String,
                "chain": pl.List(pl.Int64), "chain_ranks": pl.List(pl.Int32)}



@dataclass(frozen=True)
class _Root:
    rank: int
    instance: int
    stall_ns: int
    reason: str


def wait_chains(parts: pl.DataFrame, inst: pl.DataFrame) -> pl.DataFrame:
    """Per instance where someone waited: who was waited on and the root of the chain of waits.

    The wait at instance I lasts from its first arrival to its last; L, the last rank, is who the
    others waited on (`waited_on`). What was L doing meanwhile? Where L was itself waiting in
    other instances during that window, its lateness is inherited: when those waits (clipped to
    the window) fill more than 1 - OWN_SHARE of it, the chain follows the instance where L waited
    longest, and asks the same question there. Otherwise L is the root: its own work (compute,
    host time, its own transfers) made it late, by `root_stall_ns` = the window minus the waits.

    Columns: instance, waited_on, root_rank, root_instance (where the root was late), root_step,
    root_stall_ns (the window minus the root's own waits in it: how long it was busy with its own
    work while the others waited), root_reason ("own_work", or "first_call" when the root had no
    earlier instance), chain (instances from this one back to the root's, at most MAX_CHAIN) and
    chain_ranks (the rank waited on at each of them).
    """
    waits = inst.filter(pl.col("max_wait_ns") > 0)
    if waits.height == 0:
        return pl.DataFrame(schema=CHAIN_SCHEMA)
    cols = inst.select("instance", "last_rank", "max_wait_ns", "first_arrival_ns", "last_arrival_ns", "step")
    last = dict(zip(cols["instance"].to_list(), cols["last_rank"].to_list(), strict=True))
    wait = dict(zip(cols["instance"].to_list(), cols["max_wait_ns"].to_list(), strict=True))
    first_at = dict(zip(cols["instance"].to_list(), cols["first_arrival_ns"].to_list(), strict=True))
    last_at = dict(zip(cols["instance"].to_list(), cols["last_arrival_ns"].to_list(), strict=True))
    step = dict(zip(cols["instance"].to_list(), cols["step"].to_list(), strict=True))
    per_rank: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
    for (r,), part in parts.sort("rank", "arrive_ns", "instance").group_by("rank", maintain_order=True):
        per_rank[int(r)] = (part["arrive_ns"].to_numpy(), part["end_ns"].to_numpy(),
                            part["wait_ns"].to_numpy(), part["instance"].to_numpy())
    root_of: dict[int, _Root] = {}
    next_of: dict[int, int | None] = {}

    def decide(i: int) -> int | None:
        """The instance the lateness at `i` came from, or None when `i`'s last rank is the root."""
        rank, w, lo, hi = last[i], wait[i], first_at[i], last_at[i]
        arrive, end, own_wait, ids = per_rank[rank]
        k = int(np.searchsorted(arrive, hi, side="left")) - 1
        earlier = False
        best, best_ns, waited = None, 0, 0
        while k >= 0 and end[k] > lo:
            j = int(ids[k])
            if j != i:
                earlier = True
                clipped = min(arrive[k] + own_wait[k], hi) - max(arrive[k], lo)
                if clipped > 0:
                    waited += clipped
                    if clipped > best_ns:
                        best, best_ns = j, clipped
            k -= 1
        earlier = earlier or k >= 0
        if best is not None and waited > (1 - OWN_SHARE) * w:
            return best
        root_of[i] = _Root(rank, i, max(w - waited, 0), "own_work" if earlier else "first_call")
        return None

    for start in waits.get_column("instance").to_list():
        path = []
        cur: int | None = start
        while cur is not None and cur not in next_of:
            nxt = decide(cur)
            next_of[cur] = nxt
            path.append(cur)
            cur = nxt
        if cur is not None and cur not in root_of:  # a cycle (clock residue): stop where it closes
            tail = path[-1]
            root_of[tail] = _Root(last[tail], tail, wait[tail], "own_work")
            next_of[tail] = None
            cur = None
        end_root = root_of[cur] if cur is not None else None
        for i in reversed(path):
            if i in root_of:
                end_root = root_of[i]
            else:
                root_of[i] = end_root  # type: ignore[assignment]
    rows = []
    for i in waits.get_column("instance").to_list():
        root = root_of[i]
        chain = [i]
        while len(chain) < MAX_CHAIN and next_of.get(chain[-1]) is not None:
            chain.append(next_of[chain[-1]])  # type: ignore[arg-type]
        rows.append((i, last[i], root.rank, root.instance, step.get(root.instance), int(root.stall_ns), root.reason,
                     chain, [last[c] for c in chain]))
    return pl.DataFrame(rows, schema=CHAIN_SCHEMA, orient="row")


CASCADE_SCHEMA = {"root_rank": pl.Int32, "root_instance": pl.Int64, "root_step": pl.Int32,
                  "root_stall_ns": pl.Int64, "root_reason": pl.String, "instances": pl.UInt32,
                  "waiting_ranks": pl.List(pl.Int32), "total_wait_ns": pl.Int64, "worst_wait_ns": pl.Int64,
                  "worst_instance": pl.Int64, "worst_waiter": pl.Int32, "worst_waited_on": pl.Int32}


def cascades(inst: pl.DataFrame, parts: pl.DataFrame) -> pl.DataFrame:
    """One row per root cause: the instances whose chains of waits end at the same rank in the
    same step are one cascade. root_instance / root_stall_ns / root_reason are those of the chain
    of its longest wait; instances = how many waits it caused; waiting_ranks = the ranks that
    waited in them; total_wait_ns = the rank-time they lost (the sum of every participant's
    wait); worst_* = the longest wait in the cascade, who waited there and for whom. Largest
    total wait first."""
    hit = inst.filter((pl.col("max_wait_ns") > 0) & pl.col("root_rank").is_not_null())
    if hit.height == 0:
        return pl.DataFrame(schema=CASCADE_SCHEMA)
    key = ["root_rank", "root_step"]
    lost = (parts.filter(pl.col("wait_ns") > 0).join(hit.select("instance", *key), on="instance")
            .group_by(key).agg(pl.col("wait_ns").sum().alias("total_wait_ns"),
                               pl.col("rank").unique().sort().cast(pl.Int32).alias("waiting_ranks")))
    worst = (hit.sort(["max_wait_ns", "instance"], descending=[True, False])
             .group_by(key, maintain_order=True)
             .agg(pl.col("instance").first().alias("worst_instance"),
                  pl.col("max_wait_ns").first().alias("worst_wait_ns"),
                  pl.col("first_rank").first().alias("worst_waiter"),
                  pl.col("last_rank").first().alias("worst_waited_on"),
                  pl.col("root_instance").first(), pl.col("root_stall_ns").first(), pl.col("root_reason").first(),
                  pl.len().alias("instances")))
    out = worst.join(lost, on=key, how="left", nulls_equal=True)
    return (out.with_columns(pl.col("total_wait_ns").fill_null(0))
            .select(list(CASCADE_SCHEMA)).cast(CASCADE_SCHEMA)
            .sort(["total_wait_ns", "root_rank"], descending=[True, False]))


CRITICAL_SCHEMA = {"step": pl.Int32, "step_ns": pl.Int64, "compute_ns": pl.Int64, "idle_ns": pl.Int64,
                   "comm_ns": pl.Int64, "comm_by_dim": pl.List(pl.Struct({"dim": pl.String, "ns": pl.Int64})),
                   "ranks": pl.List(pl.Int32), "end_rank": pl.Int32, "hops": pl.Int32}


def critical_path(parts: pl.DataFrame, inst: pl.DataFrame, windows: pl.DataFrame, offsets: pl.DataFrame,
                  compute: pl.DataFrame) -> pl.DataFrame:
    """The critical path of each step, walked backwards from the rank that ended it last.

    On the current rank, going back from time t: the stretch since its latest instance ended is
    its own work (compute where its compute intervals cover it, idle elsewhere); the instance
    itself is communication of its dim from the moment its last participant arrived; when the
    current rank arrived before that, it was waiting, so the path jumps to the rank it waited
    for at the moment that rank arrived. The walk stops at the start of the step's window on the
    current rank; when that rank started the step later than the first rank did, the gap (start
    skew) counts as idle. So compute_ns + comm_ns + idle_ns = step_ns, the step time of
    `steps.step_times` (first rank in to last rank out, on the aligned clock).
    `compute` holds compute intervals (rank, s, e) on each rank's own clock.
    """
    if parts.height == 0 or windows.height == 0:
        return pl.DataFrame(schema=CRITICAL_SCHEMA)
    off = dict(offsets.select(pl.col("rank").cast(pl.Int64), pl.col("clock_offset_ns").fill_null(0)).iter_rows())
    win = windows.with_columns(pl.col("rank").cast(pl.Int64))
    start_of = {(r, s): a + off.get(r, 0) for r, s, a in win.select("rank", "step", "start_ns").iter_rows()}
    info = {i: (lr, la, d) for i, lr, la, d in inst.select("instance", "last_rank", "last_arrival_ns",
                                                            pl.col("dim").fill_null("OTHER")).iter_rows()}
    by_rank: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
    for (r,), part in parts.sort("rank", "end_ns").group_by("rank", maintain_order=True):
        by_rank[int(r)] = (part["end_ns"].to_numpy(), part["arrive_ns"].to_numpy(), part["wait_ns"].to_numpy(),
                           part["instance"].to_numpy())
    comp: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for (r,), part in compute.sort("rank", "s").group_by("rank", maintain_order=True):
        s, e = _union(part["s"].to_numpy() + off.get(int(r), 0), part["e"].to_numpy() + off.get(int(r), 0))
        comp[int(r)] = (s, e)
    rows = []
    aligned = win.with_columns((pl.col("end_ns") + pl.col("rank").replace_strict(off, default=0)).alias("_e"))
    starts = aligned.with_columns((pl.col("start_ns") + pl.col("rank").replace_strict(off, default=0)).alias("_s"))
    first_start = dict(starts.group_by("step").agg(pl.col("_s").min()).iter_rows())
    for (step,), part in aligned.sort("step").group_by("step", maintain_order=True):
        top = part.sort(["_e", "rank"], descending=[True, False]).row(0, named=True)
        rank, t = int(top["rank"]), int(top["_e"])
        end_t = t
        compute_ns = idle_ns = 0
        comm: dict[str, int] = {}
        visited = [rank]
        hops = 0
        for _ in range(100_000):
            begin = start_of.get((rank, step))
            if begin is None or t <= begin:
                break
            ends, arrives, waits, ids = by_rank.get(rank, (np.zeros(0),) * 4)
            k = int(np.searchsorted(ends, t, side="right")) - 1
            while k >= 0 and arrives[k] >= t:
                k -= 1  # an instance that ends before t but starts after it: clock residue
            if k < 0 or ends[k] <= begin:
                c = _covered(comp.get(rank), begin, t)
                compute_ns += c
                idle_ns += t - begin - c
                t = begin
                break
            c = _covered(comp.get(rank), int(ends[k]), t)
            compute_ns += c
            idle_ns += t - int(ends[k]) - c
            last_rank, last_arrival, dim = info[int(ids[k])]
            xfer_from = max(min(int(last_arrival), int(ends[k])), begin)
            comm[dim] = comm.get(dim, 0) + int(ends[k]) - xfer_from
            t = xfer_from
            if waits[k] > 0 and last_rank != rank and last_arrival > begin:
                rank = int(last_rank)
                hops += 1
                if rank not in visited:
                    visited.append(rank)
        skew = max(t - int(first_start[step]), 0)
        idle_ns += skew
        span = end_t - t + skew
        rows.append({"step": step, "step_ns": span, "compute_ns": compute_ns, "idle_ns": idle_ns,
                     "comm_ns": sum(comm.values()),
                     "comm_by_dim": [{"dim": d, "ns": v} for d, v in sorted(comm.items(), key=lambda kv: -kv[1])],
                     "ranks": visited, "end_rank": int(top["rank"]), "hops": hops})
    return pl.DataFrame(rows, schema=CRITICAL_SCHEMA)


def _union(s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if s.size == 0:
        return s, e
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    run_end = np.maximum.accumulate(e)
    new = np.ones(s.size, bool)
    new[1:] = s[1:] > run_end[:-1]
    idx = np.flatnonzero(new)
    return s[idx], np.maximum.reduceat(e, idx)


def _covered(iv: tuple[np.ndarray, np.ndarray] | None, a: int, b: int) -> int:
    """Length of [a, b) covered by disjoint sorted intervals."""
    if iv is None or b <= a:
        return 0
    s, e = iv
    lo = int(np.searchsorted(e, a, side="right"))
    hi = int(np.searchsorted(s, b, side="left"))
    if hi <= lo:
        return 0
    return int(np.clip(np.minimum(e[lo:hi], b) - np.maximum(s[lo:hi], a), 0, None).sum())
