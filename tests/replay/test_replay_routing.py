import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from naive import flow_hash_naive, route_fat_tree_naive

from tracekit.replay.simulate import Flows, route
from tracekit.replay.topology import build, parse_spec


def _names(topo, ids):
    links = topo.links.column("link").to_pylist()
    out = []
    for r in ids:
        if r < 2 * topo.n_cables:
            src, dst = links[r // 2].split("--")
            out.append(f"{src}>{dst}" if r % 2 == 0 else f"{dst}>{src}")
        else:
            out.append(f"agg{r}")
    return out


def test_nvlink_inside_a_domain():
    topo = build(parse_spec("rail-optimized:hosts=2"))
    ip, ids = route(topo, Flows.from_lists([0], [5], [1.0]))
    assert _names(topo, ids[ip[0]:ip[1]]) == ["h0/gpu0>nvl0/nvswitch", "nvl0/nvswitch>h0/gpu5"]


def test_rail_path_with_and_without_pxn():
    topo = build(parse_spec("rail-optimized:hosts=2,pxn=false"))
    ip, ids = route(topo, Flows.from_lists([0, 1], [8, 10], [1.0, 1.0]))
    same_rail = _names(topo, ids[ip[0]:ip[1]])
    assert same_rail == ["h0/gpu0>h0/nic0", "h0/nic0>p0/leaf0", "p0/leaf0>h1/nic0", "h1/nic0>h1/gpu0"]
    cross = _names(topo, ids[ip[1]:ip[2]])
    assert len(cross) == 6 and any("spine" in n for n in cross)
    pxn = build(parse_spec("rail-optimized:hosts=2"))
    ip, ids = route(pxn, Flows.from_lists([1], [10], [1.0]))
    assert _names(pxn, ids[ip[0]:ip[1]]) == [
        "h0/gpu1>nvl0/nvswitch", "nvl0/nvswitch>h0/gpu2", "h0/gpu2>h0/nic2", "h0/nic2>p0/leaf2",
        "p0/leaf2>h1/nic2", "h1/nic2>h1/gpu2"]


def test_ecmp_is_deterministic_and_spreads():
    topo = build(parse_spec("fat-tree:hosts=16,gpus=1,leaf_radix=8"))
    src = np.repeat(np.arange(4), 12)
    dst = np.tile(np.arange(4, 16), 4)
    flows = Flows.from_lists(src, dst, np.ones(src.size), key=np.arange(src.size))
    a = route(topo, flows)
    b = route(topo, flows)
    assert np.array_equal(a[1], b[1])
    spines = {n.split(">")[1] for n in _names(topo, a[1]) if "spine" in n.split(">")[1]}
    assert len(spines) == topo.route.n_spines > 1


def test_spray_uses_aggregates_and_splits_back():
    from tracekit.replay.simulate import resource_bytes, to_cables
    topo = build(parse_spec("fat-tree:hosts=16,gpus=1,leaf_radix=8,routing=spray"))
    ip, ids = route(topo, Flows.from_lists([0], [15], [100.0]))
    assert (ids >= 2 * topo.n_cables).sum() == 2
    per_dir = to_cables(topo, resource_bytes(topo.cap.size, ip, ids, np.array([100.0])))
    tiers = np.repeat(np.array(topo.links.column("tier").to_pylist()), 2)
    assert per_dir[tiers == "leaf-spine"].sum() == np.float64(200.0)
    spine_dirs = per_dir[tiers == "leaf-spine"]
    assert np.count_nonzero(spine_dirs) == 2 * topo.route.n_spines // 1


def test_three_tier_cross_pod_goes_through_core():
    topo = build(parse_spec("fat-tree:hosts=64,gpus=1,tiers=3,leaf_radix=8"))
    ip, ids = route(topo, Flows.from_lists([0], [63], [1.0]))
    names = _names(topo, ids[ip[0]:ip[1]])
    assert any("core" in n for n in names) and len(names) == 8


@st.composite
def fat_trees_and_flows(draw):
    kind = draw(st.sampled_from(["fat-tree", "rail-optimized"]))
    params = {"hosts": draw(st.integers(1, 6)), "gpus": draw(st.sampled_from([2, 4, 8])),
              "routing": draw(st.sampled_from(["ecmp", "spray"])), "tiers": draw(st.sampled_from([2, 3])),
              "leaf_radix": draw(st.sampled_from([16, 32]))}
    spec = f"{kind}:" + ",".join(f"{k}={v}" for k, v in params.items())
    topo = build(parse_spec(spec))
    t = topo.route.tables
    n = draw(st.integers(1, 12))
    modes = draw(st.lists(st.sampled_from([0, 1, 2, 5, 6, 9]), min_size=n, max_size=n))
    src = draw(st.lists(st.integers(0, topo.n_gpus - 1), min_size=n, max_size=n))
    dst = draw(st.lists(st.integers(0, topo.n_gpus - 1), min_size=n, max_size=n))
    n_leaves, n_pods = t.leaf_spine_up.shape[0], t.spine_core_up.shape[0]
    for i in range(n):
        if draw(st.booleans()):  # a switch tier flow instead
            modes[i] = draw(st.sampled_from([3, 4, 7, 8]))
            src[i] = dst[i] = draw(st.integers(0, (n_leaves if modes[i] < 5 else n_pods) - 1))
    channel = draw(st.lists(st.integers(0, 7), min_size=n, max_size=n))
    key = draw(st.lists(st.integers(0, 1000), min_size=n, max_size=n))
    return topo, Flows.from_lists(src, dst, np.ones(n), channel=channel, mode=modes, key=key)


@given(fat_trees_and_flows())
@settings(max_examples=40, deadline=None)
def test_fat_tree_router_matches_its_naive_twin(case):
    topo, flows = case
    ip, ids = route(topo, flows)
    fhash = [flow_hash_naive(*v) for v in zip(flows.src, flows.dst, flows.channel, flows.key, strict=True)]
    for f in range(len(flows)):
        want = route_fat_tree_naive(topo.route.tables, int(flows.mode[f]), int(flows.src[f]), int(flows.dst[f]),
                                    int(flows.channel[f]), fhash[f])
        assert ids[ip[f]:ip[f + 1]].tolist() == want
