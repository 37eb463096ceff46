import numpy as np
import pytest

from tracekit.replay.decompose import Instance, decompose
from tracekit.replay.simulate import (
    MODE_LEAF_DOWN,
    MODE_LEAF_UP,
    MODE_NVLS_DOWN,
    MODE_NVLS_UP,
    MODE_SPINE_UP,
    resource_bytes,
    route,
    to_cables,
)
from tracekit.replay.topology import build, parse_spec

S = 1_000_000.0


def _topo(text="single-switch:hosts=4,gpus=1"):
    return build(parse_spec(text))


def _sent(flows, n):
    out = np.zeros(n)
    np.add.at(out, flows.src, flows.nbytes)
    return out


@pytest.mark.parametrize("op, factor", [("all_reduce", 2 * 3 / 4), ("all_gather", 3 / 4),
                                        ("reduce_scatter", 3 / 4)])
def test_ring_bytes_per_rank(op, factor):
    flows = decompose([Instance(0, op, [0, 1, 2, 3], S)], _topo(), np.arange(4))
    assert len(flows) == 4
    np.testing.assert_allclose(_sent(flows, 4), factor * S)
    assert set(zip(flows.src.tolist(), flows.dst.tolist(), strict=True)) == {(0, 1), (1, 2), (2, 3), (3, 0)}


def test_ring_splits_over_nics():
    topo = _topo("rail-optimized:hosts=2,gpus=2,nics_per_gpu=2")
    flows = decompose([Instance(0, "all_reduce", [0, 1, 2, 3], S)], topo, np.arange(4))
    assert sorted(set(flows.channel.tolist())) == [0, 1]
    np.testing.assert_allclose(_sent(flows, 4), 1.5 * S)


def test_hierarchical_ring_crosses_hosts_once_per_host():
    topo = _topo("rail-optimized:hosts=2,gpus=4")
    ranks = [0, 4, 1, 5, 2, 6, 3, 7]
    flows = decompose([Instance(0, "all_reduce", ranks, S)], topo, np.arange(8))
    crossing = (flows.src // 4) != (flows.dst // 4)
    assert crossing.sum() == 2


def test_observed_ring_is_used():
    flows = decompose([Instance(0, "all_reduce", [0, 1, 2, 3], S, group="g")], _topo(), np.arange(4),
                      rings={"g": [[0, 2, 1, 3]]})
    assert set(zip(flows.src.tolist(), flows.dst.tolist(), strict=True)) == {(0, 2), (2, 1), (1, 3), (3, 0)}


def test_all_to_all_uses_splits():
    splits = {0: [0, 10, 20, 30], 1: [5, 0, 0, 7], 2: [1, 1, 1, 1], 3: [0, 0, 9, 0]}
    flows = decompose([Instance(0, "all_to_all", [0, 1, 2, 3], 60, splits=splits)], _topo(), np.arange(4))
    pairs = {(int(s), int(d)): b for s, d, b in zip(flows.src, flows.dst, flows.nbytes, strict=True)}
    assert pairs == {(0, 1): 10, (0, 2): 20, (0, 3): 30, (1, 0): 5, (1, 3): 7, (2, 0): 1, (2, 1): 1,
                     (2, 3): 1, (3, 2): 9}


def test_all_to_all_uniform_without_splits():
    flows = decompose([Instance(0, "all_to_all", [0, 1, 2, 3], 400.0)], _topo(), np.arange(4))
    assert len(flows) == 12 and np.all(flows.nbytes == 100.0)


def test_send_recv_is_one_flow():
    flows = decompose([Instance(0, "send", [0, 3], S, src=3, dst=0)], _topo(), np.arange(4))
    assert (len(flows), flows.src[0], flows.dst[0], flows.nbytes[0]) == (1, 3, 0, S)


def test_broadcast_and_reduce_chains():
    b = decompose([Instance(0, "broadcast", [0, 1, 2, 3], S, root=2)], _topo(), np.arange(4))
    assert len(b) == 3 and np.all(b.nbytes == S) and 2 in b.src and 2 not in b.dst
    r = decompose([Instance(0, "reduce", [0, 1, 2, 3], S, root=2)], _topo(), np.arange(4))
    assert len(r) == 3 and 2 in r.dst and 2 not in r.src


def test_nvls_is_s_up_and_s_down_per_gpu():
    topo = _topo("rail-optimized:hosts=1,gpus=8,nvls=true")
    flows = decompose([Instance(0, "all_reduce", list(range(8)), S)], topo, np.arange(8))
    assert sorted(set(flows.mode.tolist())) == [MODE_NVLS_UP, MODE_NVLS_DOWN]
    per = to_cables(topo, resource_bytes(topo.cap.size, *route(topo, flows), flows.nbytes))
    tiers = np.repeat(np.array(topo.links.column("tier").to_pylist()), 2)
    np.testing.assert_allclose(per[tiers == "nvlink"], S)


def test_sharp_halves_nic_bytes():
    ring_topo = _topo("fat-tree:hosts=8,gpus=1,leaf_radix=8")
    sharp_topo = _topo("fat-tree:hosts=8,gpus=1,leaf_radix=8,sharp=true")
    inst = [Instance(0, "all_reduce", list(range(8)), S)]

    def nic_up(topo):
        flows = decompose(inst, topo, np.arange(8))
        per = to_cables(topo, resource_bytes(topo.cap.size, *route(topo, flows), flows.nbytes))
        tiers = np.repeat(np.array(topo.links.column("tier").to_pylist()), 2)
        return per[0::2][tiers[0::2] == "nic-leaf"], flows

    ring, _ = nic_up(ring_topo)
    sharp, flows = nic_up(sharp_topo)
    np.testing.assert_allclose(ring, 2 * 7 / 8 * S)
    np.testing.assert_allclose(sharp, S)
    assert {MODE_LEAF_UP, MODE_LEAF_DOWN, MODE_SPINE_UP} <= set(flows.mode.tolist())


def test_tree_moves_s_per_tree_edge():
    topo = _topo("fat-tree:hosts=4,gpus=1,leaf_radix=8")
    flows = decompose([Instance(0, "all_reduce", [0, 1, 2, 3], S, algo="tree")], topo, np.arange(4))
    # two trees of S/2, each edge both ways: every non-root sends S/2 up per tree it is a child in
    assert flows.nbytes.sum() == pytest.approx(2 * 3 * S)
