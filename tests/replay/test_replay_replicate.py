"""Replication (the scale what-if's flows): translated copies equal copies decomposed one by one,
EP re-splits keep every sender's bytes, the ring layout's vectorised form equals its loop."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracekit.analysis.ep import expert_axis_is_receiver
from tracekit.replay import build, parse_spec
from tracekit.replay.decompose import Instance, channel_ring, decompose_plan
from tracekit.replay.replicate import Replication, ReplicationError, replicated_plan, resplit_matrix


def _instances() -> list[Instance]:
    """One copy of 8 ranks on 2 hosts of 4: a DP all-reduce (group d), an EP all-to-all with
    skewed splits (group e), a PP send (group p)."""
    splits = {r: [float(100 * (r + 1) + 10 * j) for j in range(4)] for r in range(4)}
    return [Instance(key=0, op="all_reduce", ranks=list(range(8)), nbytes=8e6, group="d"),
            Instance(key=1, op="all_to_all", ranks=[0, 1, 2, 3], nbytes=1e5, splits=splits, group="e"),
            Instance(key=2, op="send", ranks=[1, 5], nbytes=3e5, src=1, dst=5, group="p")]


def _flow_set(flows) -> list[tuple]:
    return sorted(zip(flows.src.tolist(), flows.dst.tolist(), np.round(flows.nbytes, 6).tolist(),
                      flows.lat_mult.tolist(), flows.channel.tolist(), flows.mode.tolist(), flows.key.tolist(),
                      flows.rate_limits().tolist(), strict=True))


def _shifted(inst: Instance, c: int, n: int) -> Instance:
    from dataclasses import replace

    return replace(inst, ranks=[c * n + r for r in inst.ranks], src=None if inst.src is None else c * n + inst.src,
                   dst=None if inst.dst is None else c * n + inst.dst,
                   splits={c * n + r: s for r, s in inst.splits.items()})


@pytest.mark.parametrize("copies", [1, 2, 3, 5])
def test_translated_copies_equal_copies_decomposed_one_by_one(copies):
    spec = parse_spec(f"rail-optimized:gpus=4,hosts={2 * copies}")
    topo = build(spec)
    insts = _instances()
    copy0 = {r: r for r in range(8)}
    rep = Replication(copies=copies, ranks_per_copy=8, widen=frozenset({"d"}))
    plan = replicated_plan(insts, rep, copy0, topo)
    widened = Instance(key=0, op="all_reduce", ranks=list(range(8 * copies)), nbytes=8e6, group="d")
    naive = [widened] + [_shifted(i, c, 8) for c in range(copies) for i in insts[1:]]
    gmap = {r: r for r in range(8 * copies)}
    expected = decompose_plan(naive, topo, gmap)
    assert _flow_set(plan.flows) == _flow_set(expected.flows)
    assert len(plan.plans) == 3 and plan.fill.size == 3


def test_a_copy_that_splits_an_nvlink_domain_is_decomposed_copy_by_copy():
    """Copies of 2 hosts of 4 in NVLink domains of 12: copy 1's send 9 -> 13 crosses a domain
    that copy 0's 1 -> 5 does not, so a translation would keep it on NVLink; those copies are
    decomposed one by one instead."""
    topo = build(parse_spec("rail-optimized:gpus=4,nvlink_domain=12,hosts=6"))
    insts = [Instance(key=0, op="send", ranks=[1, 5], nbytes=1e6, src=1, dst=5, group="p")]
    plan = replicated_plan(insts, Replication(copies=3, ranks_per_copy=8), {r: r for r in range(8)}, topo)
    naive = decompose_plan([_shifted(insts[0], c, 8) for c in range(3)], topo, {r: r for r in range(24)})
    assert _flow_set(plan.flows) == _flow_set(naive.flows)


def test_in_network_reduction_is_decomposed_copy_by_copy():
    """SHARP flows name leaves and pods, which a translation by GPUs does not move: a repeated
    all-reduce over 2 hosts on CollNet is decomposed in each copy."""
    topo = build(parse_spec("fat-tree:gpus=1,hosts=8,leaf_radix=4,tiers=3,sharp=true"))
    insts = [Instance(key=0, op="all_reduce", ranks=[0, 1, 2, 3], nbytes=4e6, group="t")]
    plan = replicated_plan(insts, Replication(copies=2, ranks_per_copy=4), {r: r for r in range(4)}, topo,
                           algo="collnet_chain")
    naive = decompose_plan([insts[0], _shifted(insts[0], 1, 4)], topo, {r: r for r in range(8)},
                           algo="collnet_chain")
    assert 3 in plan.flows.mode.tolist()  # SPINE_UP: the copies reduce at the spines
    assert _flow_set(plan.flows) == _flow_set(naive.flows)


def test_too_few_hosts_for_the_copies_is_an_error():
    topo = build(parse_spec("rail-optimized:gpus=4,hosts=2"))
    with pytest.raises(ReplicationError, match="need 4 hosts"):
        replicated_plan(_instances(), Replication(copies=2, ranks_per_copy=8), {r: r for r in range(8)}, topo)


def test_resplit_closed_forms():
    b = np.array([[0.0, 6.0], [2.0, 4.0]])
    (joined,) = resplit_matrix(b, 4)  # two copies' groups join: member j's experts over 2 ranks
    assert np.allclose(joined, [[0, 3, 0, 3], [1, 2, 1, 2], [0, 3, 0, 3], [1, 2, 1, 2]])
    folded = resplit_matrix(np.arange(16.0).reshape(4, 4), 2)  # experts of j go to j mod 2 of the sub-group
    assert np.allclose(folded[0], [[0 + 2, 1 + 3], [4 + 6, 5 + 7]])
    assert np.allclose(folded[1], [[8 + 10, 9 + 11], [12 + 14, 13 + 15]])
    with pytest.raises(ReplicationError, match="multiple or a divisor"):
        resplit_matrix(b, 3)


@settings(max_examples=60, deadline=None)
@given(n=st.sampled_from([2, 4, 8]), factor=st.sampled_from([1, 2, 4]), join=st.booleans(),
       seed=st.integers(0, 2**31))
def test_resplit_keeps_every_senders_bytes(n, factor, join, seed):
    """Tokens per sender are unchanged: a joined group's rows are the traced rows (once per
    copy), a split group's rows are the traced rows."""
    b = np.random.default_rng(seed).integers(0, 1000, (n, n)).astype(float)
    if not join and factor > n:
        return
    size = n * factor if join else n // factor
    mats = resplit_matrix(b, size)
    assert all(m.shape == (size, size) for m in mats)
    rows = np.concatenate([m.sum(axis=1) for m in mats])
    assert np.allclose(rows, np.tile(b.sum(axis=1), factor) if join else b.sum(axis=1))


def _naive_resplit_with_loads(b: np.ndarray, shares: list[list[float]], m: int) -> np.ndarray:
    """The loads re-split written out expert by expert: sender (copy c, i) sends each expert e of
    member j its tokens' share, to the rank (copy e // (per / m), j) that holds the expert's block."""
    n, per = len(shares), len(shares[0])
    out = np.zeros((m * n, m * n))
    for c in range(m):
        for i in range(n):
            for j in range(n):
                for e in range(per):
                    out[c * n + i, (e // (per // m)) * n + j] += b[i, j] * shares[j][e] / sum(shares[j])
    return out


def test_uniform_expert_loads_send_each_rank_the_even_share():
    """Uniform loads over E' = 8 ranks (from EP 4, 2 experts each): every sender's bytes go 1/E'
    to each rank, (E' - 1)/E' of them off the sender, as the even re-split gives."""
    t = 800.0
    b = np.full((4, 4), t / 4)
    (joined,) = resplit_matrix(b, 8, [[1.0, 1.0]] * 4)
    assert np.allclose(joined, t / 8)
    assert np.allclose(joined.sum(axis=1) - np.diag(joined), t * 7 / 8)
    assert np.array_equal(joined, resplit_matrix(b, 8)[0])


def test_a_hot_expert_takes_its_tokens_to_the_rank_that_holds_it():
    """EP 4 -> 8 with expert 0 (on member 0) hot: it alone goes to member 0 of copy 0, which gets
    its share of every sender's tokens; its neighbour expert 1 goes to member 0 of copy 1. The
    even re-split would give both ranks half of member 0's column."""
    p, t = 0.6, 1000.0
    tokens = [[60.0, 4.0], [9.0, 9.0], [9.0, 0.0], [4.0, 5.0]]  # expert 0: p of 100 tokens
    b = np.outer(np.full(4, t), [sum(x) / 100 for x in tokens])  # senders alike: member j gets its experts' share
    (joined,) = resplit_matrix(b, 8, tokens)
    assert np.allclose(joined[:, 0], p * t) and np.allclose(joined[:, 4], 0.04 * t)
    assert np.allclose(joined[:, 2], 0.09 * t) and np.allclose(joined[:, 6], 0.0)
    assert np.allclose(joined.sum(axis=1), t)
    assert np.allclose(joined, _naive_resplit_with_loads(b, tokens, 2))
    assert np.allclose(resplit_matrix(b, 8)[0][:, [0, 4]], 0.32 * t)


def test_a_combine_is_re_split_on_its_transpose():
    """A combine (the expert ranks send back): the hot expert's rank sends what it received."""
    tokens = [[3.0, 1.0], [1.0, 1.0]]
    dispatch = np.array([[200.0, 100.0], [200.0, 100.0]])
    (d,) = resplit_matrix(dispatch, 4, tokens)
    (c,) = resplit_matrix(dispatch.T, 4, tokens)
    assert np.allclose(c, d.T)
    assert np.allclose(d[:, 0], 150.0) and np.allclose(d[:, 2], 50.0)


@settings(max_examples=60, deadline=None)
@given(n=st.sampled_from([2, 4]), m=st.sampled_from([2, 4]), per_blocks=st.sampled_from([1, 2]),
       seed=st.integers(0, 2**31))
def test_loads_re_split_matches_its_naive_twin_and_keeps_senders_bytes(n, m, per_blocks, seed):
    rng = np.random.default_rng(seed)
    b = rng.integers(1, 1000, (n, n)).astype(float)
    shares = rng.integers(0, 50, (n, m * per_blocks)).astype(float).tolist()
    (joined,) = resplit_matrix(b, m * n, shares)
    even = [s if sum(s) else [1.0] * len(s) for s in shares]
    if expert_axis_is_receiver(b):  # a dispatch: tokens per sender kept
        assert np.allclose(joined, _naive_resplit_with_loads(b, even, m))
        assert np.allclose(joined.sum(axis=1), np.tile(b.sum(axis=1), m))
    else:  # a combine: the transpose, tokens per receiver kept
        assert np.allclose(joined, _naive_resplit_with_loads(b.T, even, m).T)
        assert np.allclose(joined.sum(axis=0), np.tile(b.sum(axis=0), m))


def test_experts_that_cannot_be_cut_into_whole_blocks_are_refused():
    with pytest.raises(ReplicationError, match="3 experts in the expert map, which cannot be split over 2 ranks"):
        resplit_matrix(np.ones((2, 2)), 4, [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])


def _channel_ring_loop(gpus, gpus_per_host, channel, ports_per_gpu):
    order = np.argsort(gpus, kind="stable")
    hosts = gpus[order] // gpus_per_host
    parts = []
    for h in np.unique(hosts):
        members = order[hosts == h]
        parts.append(np.roll(members, -((channel // ports_per_gpu) % members.size)))
    return np.concatenate(parts) if parts else order


@settings(max_examples=200, deadline=None)
@given(gpus=st.lists(st.integers(0, 127), min_size=0, max_size=40, unique=True), per_host=st.integers(1, 8),
       channel=st.integers(0, 40), ports=st.integers(1, 2))
def test_channel_ring_equals_its_loop(gpus, per_host, channel, ports):
    g = np.array(gpus, np.int64)
    assert channel_ring(g, per_host, channel, ports).tolist() == _channel_ring_loop(g, per_host, channel,
                                                                                     ports).tolist()
