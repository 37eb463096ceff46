"""The ECMP flow hash: bit for bit its naive twin, not linear over GF(2), spreading structured flows
like balls in bins, and through routing, an 8-host fat-tree whose 2:1 and 4:1 differ as by hand.

An xorshift hash (the one before splitmix64) is kept here as a control: every statistical test
below is shown to reject it, so the thresholds can fail."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from naive import MASK64, flow_hash_naive

from tracekit.replay import _kernels
from tracekit.replay.decompose import Instance, decompose_plan
from tracekit.replay.simulate import resource_bytes, route, simulate
from tracekit.replay.topology import build, parse_spec

INT64 = st.integers(-(2**63), 2**63 - 1)


def xorshift_hash(a: int, b: int, c: int, d: int) -> int:
    """The linear hash `flow_hash` was before: xorshift rounds, affine over GF(2)."""
    x = 0x9E3779B97F4A7C15
    for v in (a, b, c, d):
        x ^= int(v) & 0x7FFFFFFFFFFFFFFF
        for _ in range(3):
            x ^= (x << 13) & MASK64
            x ^= x >> 7
            x ^= (x << 17) & MASK64
    return (x ^ (x >> 31) ^ (x >> 47)) >> 1


@given(INT64, INT64, INT64, INT64)
@settings(max_examples=300, deadline=None)
def test_flow_hash_matches_its_naive_twin(a, b, c, d):
    assert _kernels.flow_hash(a, b, c, d) == flow_hash_naive(a, b, c, d)


def test_flow_hashes_of_arrays_match_the_naive_twin():
    rng = np.random.default_rng(1)
    cols = [rng.integers(0, 2**63 - 1, 2000, dtype=np.int64), rng.integers(0, 64, 2000),
            rng.integers(0, 32, 2000), rng.integers(-5, 10**6, 2000)]
    got = _kernels.flow_hashes(*cols)
    assert got.tolist() == [flow_hash_naive(*map(int, v)) for v in zip(*cols, strict=True)]
    assert (got >= 0).all()


def _xor_triples(rng, n):
    a, b, c = (rng.integers(0, 2**63 - 1, (n, 4), dtype=np.int64) for _ in range(3))
    return a.tolist(), b.tolist(), c.tolist(), (a ^ b ^ c).tolist()


def test_flow_hash_is_not_linear_over_gf2():
    """An affine hash has f(a)^f(b)^f(c) == f(a^b^c) for every triple (the control: all 2,000);
    a mixing one almost never (the chance is 2^-63 per triple)."""
    a, b, c, abc = _xor_triples(np.random.default_rng(2), 2000)

    def holds(h):
        return sum(h(*x) ^ h(*y) ^ h(*z) == h(*w) for x, y, z, w in zip(a, b, c, abc, strict=True))

    assert holds(xorshift_hash) == 2000
    assert holds(_kernels.flow_hash) <= 20


def _chi2_bounds(dof: int, z: float = 3.29) -> tuple[float, float]:
    """Two-sided 0.1% critical values of chi-square with `dof` degrees of freedom (Wilson-Hilferty)."""
    k = 2 / (9 * dof)
    return dof * (1 - k - z * math.sqrt(k)) ** 3, dof * (1 - k + z * math.sqrt(k)) ** 3


def _structured_flows(family: str) -> tuple[np.ndarray, np.ndarray]:
    """(src, dst, channel, key) rows of flows as the decompositions make them on 8 hosts x 8 GPUs
    with 16 channels and instance keys 0-9, and the group (key, destination host) of each row:
    tree heads (GPU c%8 of every other host, 7 x 16 = 112 flows into a host per key), rings
    (GPU g -> g+1 on every channel) and an all-to-all (every ordered pair, channel i mod 16)."""
    rows = []
    for key in range(10):
        if family == "tree-heads":
            rows += [(8 * s + c % 8, 8 * d + c % 8, c, key) for s in range(8) for d in range(8) if s != d
                     for c in range(16)]
        elif family == "ring":
            rows += [(g, (g + 1 + 8 * c) % 64, c, key) for g in range(64) for c in range(16)]
        else:
            pairs = [(s, d) for s in range(64) for d in range(64) if s // 8 != d // 8]
            rows += [(s, d, i % 16, key) for i, (s, d) in enumerate(pairs)]
    rows_a = np.array(rows, np.int64)
    return rows_a, rows_a[:, 3] * 8 + rows_a[:, 1] // 8


def _chi2_by_group(hashes: np.ndarray, group: np.ndarray, k: int) -> tuple[float, int]:
    counts = np.zeros((group.max() + 1, k))
    np.add.at(counts, (group, hashes % k), 1)
    counts = counts[counts.sum(1) > 0]
    expected = counts.sum(1, keepdims=True) / k
    return float(((counts - expected) ** 2 / expected).sum()), counts.shape[0] * (k - 1)


@pytest.mark.parametrize("family", ["tree-heads", "ring", "all-to-all"])
@pytest.mark.parametrize("k", [2, 3, 4, 8])
def test_ecmp_loads_of_structured_flows_look_like_balls_in_bins(family, k):
    """Per (instance, destination host), the flows' spines `hash mod k` are counted; under balls in
    bins the summed chi-square against uniform lies within its two-sided 0.1% bounds (fixed
    inputs, so the test is deterministic). The xorshift control fails it for k a power of two:
    its low bits are linear in the inputs, so a host's flows all land on one spine (tree heads:
    chi-square at its maximum) or on shares far more even than chance (rings: exactly equal)."""
    rows, group = _structured_flows(family)
    got = _kernels.flow_hashes(rows[:, 0], rows[:, 1], rows[:, 2], rows[:, 3])
    chi2, dof = _chi2_by_group(got, group, k)
    lo, hi = _chi2_bounds(dof)
    assert lo < chi2 < hi, (family, k, chi2, dof)
    if k in (2, 4, 8):
        control = np.array([xorshift_hash(*map(int, r)) for r in rows], np.int64)
        chi2_control, _ = _chi2_by_group(control, group, k)
        assert not lo < chi2_control < hi, (k, chi2_control)


FAT_TREE = "fat-tree:hosts=8,gpus=8,leaf_radix=16,oversub={k}"
GIB = 2**30


def _tree_all_reduce(spec: str, key: int = 0):
    topo = build(parse_spec(spec))
    dec = decompose_plan([Instance(key, "all_reduce", list(range(64)), GIB)], topo, np.arange(64), algo="tree")
    indptr, ids = route(topo, dec.flows)
    return topo, dec, indptr, ids, float(simulate(topo, indptr, ids, dec.flows).finish.max())


def test_tree_heads_cross_hosts_as_counted_by_hand():
    """The flow counts the closed forms below take: NCCL's double binary tree over 8 hosts
    (trees.cc, `decompose.dtree_parent`): tree 0 has parents 1->2, 2->4, 3->2, 4->0, 5->6, 6->4, 7->6
    (host degrees 1,1,3,1,3,1,3,1) on channels 0-7 and its mirror (host 7-p: degrees 1,3,1,3,1,3,1,1)
    on channels 8-15, one flow per edge, channel and direction: every host sends and receives
    8 x (degree in tree 0 + in tree 1) = 16, 32, 32, 32, 32, 32, 32, 16 flows across hosts. (A change
    of tree shape fails here first; update the counts.)"""
    _topo, dec, *_ = _tree_all_reduce(FAT_TREE.format(k=2))
    f = dec.flows
    cross = f.src // 8 != f.dst // 8
    want = [16, 32, 32, 32, 32, 32, 32, 16]
    assert np.bincount(f.src[cross] // 8, minlength=8).tolist() == want
    assert np.bincount(f.dst[cross] // 8, minlength=8).tolist() == want
    assert dec.plans[0].channels == 16


def _expected_max_share(counts: list[int]) -> float:
    """E[M], M = the largest of max(X, n - X) over independent X ~ Bin(n, 1/2), one per count n."""
    def cdf(m: int) -> float:
        return math.prod(sum(math.comb(n, x) for x in range(n + 1) if max(x, n - x) <= m) / 2**n for n in counts)

    top = max(counts)
    return sum(m * (cdf(m) - cdf(m - 1)) for m in range(1, top + 1))


def test_fat_tree_2to1_and_4to1_tree_all_reduce_match_closed_forms():
    """8 hosts x 8 GPUs, `leaf_radix=16`: a leaf's 8 down ports take one host's 8 NICs (50 GB/s
    each), so every byte between hosts crosses that host's leaf uplinks, 8/k ports of 50 GB/s:
    at 4:1 one 100 GB/s bundle to the one spine; at 2:1 200 GB/s, as two 100 GB/s bundles to
    ceil(8 leaves x 4 ports / 16) = 2 spines. Tree all-reduce of S = 1 GiB, 16 channels, each flow
    S_w / 16 with S_w = S / eff (the plan's protocol factor); a host sends and receives n_h such
    flows, counted from the decomposition (32 for hosts 1, 2, 5, 6 and 24 for the others, by hand
    in the test above). The bandwidth term is the busiest
    bundle's bytes over its capacity (the flows start together and the NICs, 4 flows on 50 GB/s,
    and NVLink are not binding):

    - 4:1: T = 32 (S_w/16) / 100 GB/s = 2 S_w / 100 GB/s, whatever the hash;
    - 2:1 spray: T = 32 (S_w/16) / 200 GB/s = S_w / 100 GB/s (half of 4:1);
    - 2:1 ECMP: each flow picks one of 2 spines, so a host's up (and down) flows split as
      X ~ Bin(n_h, 1/2) on its two bundles, and T = M (S_w/16) / 100 GB/s with M the largest
      max(X, n_h - X) over the 16 (host, direction) groups: E[M] = 21.01 for independent splits
      (of 32 at most), T = 0.66 of 4:1. Per instance key the hash draws another M, so the test
      takes the mean over 128 keys: the standard deviation of M is 1.55, so of the mean 0.14
      (0.65%); the tolerance of 3% is 3 of those plus the independence assumption (a flow's up
      and down bundles are the same spine; Monte Carlo of ideal random spines gives 20.93, 0.35%
      below) and the path latencies (0.3%).

    The old linear hash sent every flow into a host onto one spine: 2:1 ECMP gave 4:1's answer."""
    topo, dec, _ip, _ids, t_4to1 = _tree_all_reduce(FAT_TREE.format(k=4))
    f = dec.flows
    cross = f.src // 8 != f.dst // 8
    counts = [*np.bincount(f.src[cross] // 8, minlength=8).tolist(), *np.bincount(f.dst[cross] // 8, minlength=8)]
    top = max(counts)  # 32 (the test above)
    s_w = GIB / dec.plans[0].efficiency
    bundle = float(topo.cap[topo.route.tables.leaf_spine_up[0, 0]])  # bytes/ns: 100 GB/s at line rate
    two = build(parse_spec(FAT_TREE.format(k=2)))
    assert two.route.n_spines == 2 and topo.route.n_spines == 1
    assert float(two.cap[two.route.tables.leaf_spine_up[0, 1]]) == bundle
    assert t_4to1 == pytest.approx(top * (s_w / 16) / bundle, rel=0.01)
    *_, t_spray = _tree_all_reduce(FAT_TREE.format(k=2) + ",routing=spray")
    assert t_spray == pytest.approx(top * (s_w / 16) / (2 * bundle), rel=0.01)
    ecmp = []
    for key in range(128):
        topo, dec, indptr, ids, t = _tree_all_reduce(FAT_TREE.format(k=2), key)
        busiest = float((resource_bytes(topo.cap.size, indptr, ids, dec.flows.nbytes) / topo.cap).max())
        assert busiest <= t <= busiest * 1.01
        assert t_spray * 0.999 < t < t_4to1
        ecmp.append(t)
    expected = _expected_max_share(counts) * (s_w / 16) / bundle
    assert float(np.mean(ecmp)) == pytest.approx(expected, rel=0.03)
    assert float(np.mean(ecmp)) < 0.75 * t_4to1
