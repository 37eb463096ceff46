"""A run replayed at a scale it was not traced at: its ranks replicated into copies on a larger
topology (weak scaling: every copy computes as the traced ranks did).

The schedule stays the traced one (one copy, the representative); the network carries every
copy's flows. Each collective instance of the trace becomes the instances of all copies, with
the representative's key: a call of a group in `widen` (a DP group) spans every copy at once (an
all-reduce over `copies` times the ranks, the bytes per rank as traced); an EP all-to-all is
re-split for `ep_size` members (below); every other call is repeated in each copy on its own
ranks. An instance's replayed network time is then the slowest of its copies (they run in
lockstep, as the DP all-reduce that joins them every step makes them), so the representative's
schedule is every copy's. docs/whatif.md ("Scale").

EP re-split, from the traced bytes matrix B (n members, group order): with `ep_size = m n`, the
EP groups of m consecutive copies join, and the experts of member j are spread evenly over the m
ranks that hold position j, so sender i sends B[i, j] / m to each of them; with `ep_size = n / d`,
each group splits into d groups of `ep_size` and the experts of member j move to member j mod
`ep_size` of the sender's own group, which receives the sum of what went to them. Per-rank token
counts (the row totals) are unchanged either way.

With per-expert loads (`expert_shares`: each rank's experts' shares of the tokens sent to it, in
expert order), a larger size splits member j's experts into m contiguous blocks of whole experts
and the rank at position j of copy b takes block b: sender i sends B[i, j] times block b's share
to it, so a hot expert's tokens move with it (a combine, whose senders are the experts, is the
transpose: each expert rank sends what it received).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from tracekit.analysis.ep import expert_axis_is_receiver
from tracekit.errors import TracekitError
from tracekit.replay._kernels import FlowMode
from tracekit.replay.decompose import Decomposition, Instance, decompose_plan
from tracekit.replay.simulate import Flows
from tracekit.replay.topology import Topology


class ReplicationError(TracekitError):
    """The run cannot be replicated as asked; the message says why."""


@dataclass(frozen=True)
class Replication:
    """`copies` replicas of the run's `ranks_per_copy` ranks (rank r of copy c is `c *
    ranks_per_copy + r`); `widen`: groups whose calls span every copy; `ep_groups` / `ep_size`:
    the EP groups whose all-to-alls are re-split for `ep_size` members (None: as traced);
    `expert_shares`: rank -> its experts' shares of the tokens sent to it (expert order; a rank
    not listed has its experts spread evenly)."""

    copies: int
    ranks_per_copy: int
    widen: frozenset[str] = field(default_factory=frozenset)
    ep_groups: frozenset[str] = field(default_factory=frozenset)
    ep_size: int | None = None
    expert_shares: Mapping[int, tuple[float, ...]] = field(default_factory=dict)

    def rank(self, copy: int, rank: int) -> int:
        return copy * self.ranks_per_copy + rank

    def gpu_map(self, copy0: Mapping[int, int], gpus_per_copy: int) -> np.ndarray:
        """GPU of every replicated rank (-1: none) from copy 0's map; copy c sits `c *
        gpus_per_copy` GPUs further."""
        out = np.full(self.copies * self.ranks_per_copy, -1, np.int64)
        base = np.full(self.ranks_per_copy, -1, np.int64)
        for r, g in copy0.items():
            base[r] = g
        for c in range(self.copies):
            out[c * self.ranks_per_copy:(c + 1) * self.ranks_per_copy] = np.where(base >= 0, base + c * gpus_per_copy,
                                                                                  -1)
        return out


def replicated_plan(instances: Sequence[Instance], rep: Replication, copy0: Mapping[int, int], topology: Topology,
                    **options: Any) -> Decomposition:
    """Flows of every copy of `instances` (copy 0's ranks on `copy0`'s GPUs, copy c `c *
    gpus_per_copy` GPUs further) with per-instance plans, fill and latency of the slowest copy
    (keys as given: position = key). `options` go to `decompose_plan`.

    Each instance is decomposed once per distinct shape (a widened call once; a repeated call on
    copy 0; a re-split all-to-all on the first block) and its flows translated to the other
    copies: a copy sits a whole number of NVLink domains and hosts further, so the translation
    changes nothing but the GPUs (an instance with flows named by switch, in-network reduction,
    or a topology whose copies break NVLink domains, is decomposed copy by copy instead)."""
    spec = topology.spec
    per_host = spec.gpus
    hosts_per_copy = max(copy0.values()) // per_host + 1 if copy0 else 1
    if hosts_per_copy * rep.copies > (spec.hosts or 0):
        raise ReplicationError(f"{rep.copies} copies of {hosts_per_copy} hosts need {hosts_per_copy * rep.copies} "
                               f"hosts; the topology has {spec.hosts}")
    gpus_per_copy = hosts_per_copy * per_host
    gmap = rep.gpu_map(copy0, gpus_per_copy)
    translatable = gpus_per_copy % spec.domain == 0
    first: list[Instance] = []
    extra: list[Instance] = []
    period: list[int] = []
    for inst in instances:
        made, p = _bases(inst, rep)
        if not translatable and p < rep.copies:
            made = [_shift(b, rep, j * p) for j in range(rep.copies // p) for b in made]
            p = rep.copies
        first.append(made[0])
        extra.extend(made[1:])
        period.append(p)
    plan = decompose_plan(first + extra, topology, gmap, **options)
    n = len(first)
    later = [i.key for i in extra]  # the keys of the plan's entries after the representatives
    period_of = np.asarray(period, np.int64)
    flows = plan.flows
    if len(flows):
        switch_named = np.isin(flows.mode, _SWITCH_MODES)
        redo = np.unique(flows.key[switch_named & (period_of[flows.key] < rep.copies)])
        if redo.size:  # flows named by switch do not translate: decompose those copies one by one
            again = [_shift(b, rep, j * period[k]) for k in redo.tolist()
                     for j in range(1, rep.copies // period[k]) for b in _bases(instances[k], rep)[0]]
            plan = _joined(plan, decompose_plan(again, topology, gmap, **options))
            later += [i.key for i in again]
            period_of[redo] = rep.copies
    fill = plan.fill[:n].copy()
    latency = np.asarray(plan.latency_ns[:n], np.float64).copy()
    if later:
        keys = np.asarray(later, np.int64)
        np.maximum.at(fill, keys, plan.fill[n:])
        np.maximum.at(latency, keys, np.asarray(plan.latency_ns[n:], np.float64))
    return Decomposition(_translated(plan.flows, period_of, rep.copies, gpus_per_copy), plan.plans[:n], fill,
                         latency)


_SWITCH_MODES = np.array([FlowMode.SPINE_UP, FlowMode.SPINE_DOWN, FlowMode.CORE_UP, FlowMode.CORE_DOWN], np.int64)


def _bases(inst: Instance, rep: Replication) -> tuple[list[Instance], int]:
    """The instances of one traced call that are not translations of each other, and the period
    (in copies) after which they repeat."""
    group = inst.group or ""
    if group in rep.widen and inst.op not in ("send", "recv", "sendrecv"):
        return [replace(inst, ranks=[rep.rank(c, r) for c in range(rep.copies) for r in inst.ranks], splits={})], \
            rep.copies
    if inst.op == "all_to_all" and group in rep.ep_groups and rep.ep_size and rep.ep_size != len(inst.ranks):
        return _resplit(inst, rep)
    return [inst], 1


def _joined(a: Decomposition, b: Decomposition) -> Decomposition:
    return Decomposition(Flows.concat([a.flows, b.flows]), a.plans + b.plans, np.concatenate([a.fill, b.fill]),
                         np.concatenate([np.asarray(a.latency_ns), np.asarray(b.latency_ns)]))


def _translated(flows: Flows, period: np.ndarray, copies: int, gpus_per_copy: int) -> Flows:
    """The flows with every instance of period p < copies repeated in copies p, 2p, ... (GPU
    ends moved by that many copies' GPUs), after the flows as given."""
    if not len(flows):
        return flows
    p = period[flows.key]
    repeats = copies // p - 1
    total = int(repeats.sum())
    if total == 0:
        return flows
    idx = np.repeat(np.arange(len(flows)), repeats)
    start = np.cumsum(repeats) - repeats
    j = np.arange(total) - np.repeat(start, repeats) + 1  # 1 .. repeats
    offset = j * p[idx] * gpus_per_copy
    moved = Flows(flows.src[idx] + offset, flows.dst[idx] + offset, flows.nbytes[idx], flows.release[idx],
                  flows.lat_mult[idx], flows.channel[idx], flows.mode[idx], flows.key[idx],
                  None if flows.max_gbs is None else flows.max_gbs[idx])
    return Flows.concat([flows, moved])


def _shift(inst: Instance, rep: Replication, c: int) -> Instance:
    if c == 0:
        return inst
    return replace(inst, ranks=[rep.rank(c, r) for r in inst.ranks],
                   src=None if inst.src is None else rep.rank(c, inst.src),
                   dst=None if inst.dst is None else rep.rank(c, inst.dst),
                   splits={rep.rank(c, r): s for r, s in inst.splits.items()})


def traffic_matrix(inst: Instance) -> np.ndarray:
    """B[i, j]: bytes member i sends member j (group order); a member without splits sends its
    bytes evenly."""
    n = len(inst.ranks)
    rows = []
    for r in inst.ranks:
        s = inst.splits.get(r)
        rows.append(np.asarray(s, np.float64) if s is not None and len(s) == n else np.full(n, inst.nbytes / n))
    return np.array(rows).reshape(n, n)


def resplit_matrix(b: np.ndarray, ep_size: int, shares: Sequence[Sequence[float] | None] | None = None
                   ) -> list[np.ndarray]:
    """The traced matrix re-split for `ep_size` members: for a larger size, the one matrix of the
    joined groups (m = ep_size / n copies, copy-major); for a smaller one, one matrix per
    sub-group. Row totals are kept (a combine's column totals, when `shares` are given).

    `shares[j]`: member j's experts' shares of the tokens sent to it (None: spread evenly); a
    larger size gives the rank at position j of copy c the c-th of m contiguous blocks of them."""
    n = b.shape[0]
    if ep_size % n == 0:
        m = ep_size // n
        if shares is None or all(s is None for s in shares):
            return [np.tile(b / m, (m, m))]
        block = expert_blocks(shares, m)  # (n, m): member j's share that copy c's rank j takes
        dispatch = expert_axis_is_receiver(b)
        d = b if dispatch else b.T
        joined = np.concatenate([np.tile(d * block[:, c], (m, 1)) for c in range(m)], axis=1)
        return [joined if dispatch else joined.T]
    if n % ep_size == 0:
        out = []
        for s in range(n // ep_size):
            rows = b[s * ep_size:(s + 1) * ep_size]
            folded = np.zeros((ep_size, ep_size))
            for j in range(n):
                folded[:, j % ep_size] += rows[:, j]
            out.append(folded)
        return out
    raise ReplicationError(f"ep={ep_size}: the traced EP groups have {n} members; the new size must be a "
                           "multiple or a divisor of that")


def expert_blocks(shares: Sequence[Sequence[float] | None], m: int) -> np.ndarray:
    """(members, m): the share of member j's tokens that block c of its experts takes (m contiguous
    blocks of whole experts; even for a member without shares)."""
    out = np.full((len(shares), m), 1.0 / m)
    for j, s in enumerate(shares):
        if s is None:
            continue
        per = len(s)
        if per % m:
            raise ReplicationError(f"EP member {j} (group order) holds {per} expert{'s' * (per != 1)} in the expert "
                                   f"map, which cannot be split over {m} ranks: the new EP size needs each "
                                   f"rank's expert count to be a multiple of {m}")
        total = float(sum(s))
        w = np.asarray(s, np.float64) / total if total > 0 else np.full(per, 1.0 / per)
        out[j] = w.reshape(m, per // m).sum(axis=1)
    return out


def _resplit(inst: Instance, rep: Replication) -> tuple[list[Instance], int]:
    """The re-split all-to-alls of copy 0 (or of the first block of joined copies) and their period."""
    assert rep.ep_size is not None
    n = len(inst.ranks)
    shares = [rep.expert_shares.get(r) for r in inst.ranks] if rep.expert_shares else None
    mats = resplit_matrix(traffic_matrix(inst), rep.ep_size, shares)
    if rep.ep_size > n:
        m = rep.ep_size // n
        if rep.copies % m:
            raise ReplicationError(f"ep={rep.ep_size} joins {m} copies' EP groups of {n}: the copies "
                                   f"({rep.copies}) must be a multiple of {m}")
        ranks = [rep.rank(c, r) for c in range(m) for r in inst.ranks]
        return [_with_matrix(inst, ranks, mats[0])], m
    return [_with_matrix(inst, list(inst.ranks[s * rep.ep_size:(s + 1) * rep.ep_size]), mat)
            for s, mat in enumerate(mats)], 1


def _with_matrix(inst: Instance, ranks: list[int], mat: np.ndarray) -> Instance:
    return replace(inst, ranks=ranks, splits={r: mat[i] for i, r in enumerate(ranks)},
                   nbytes=float(mat.sum(axis=1).max(initial=0.0)))
