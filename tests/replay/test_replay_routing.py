import numpy as np

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
