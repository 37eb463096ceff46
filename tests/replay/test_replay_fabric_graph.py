"""Replay on the observed fabric: the topology from `ibnetdiscover -p`, routed as a general graph."""

from collections import deque
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from naive import flow_hash_naive, route_graph_naive

from tracekit.ingest import ingest
from tracekit.replay import _kernels
from tracekit.replay.fabric_graph import ObservedFabricError, build_observed
from tracekit.replay.simulate import Flows, route
from tracekit.store import Run
from tracekit.telemetry.synth import SynthFabric, ibnetdiscover_text

REAL = Path(__file__).resolve().parents[2] / ".." / "shared" / "real_traces" / "telemetry" / "infiniband"


def _fabric(tmp_path, text: str, name: str = "fabric.txt"):
    src = tmp_path / "in"
    src.mkdir(exist_ok=True)
    (src / name).write_text(text)
    ingest([src / name], tmp_path / "run")
    run = Run(tmp_path / "run")
    return run.table("topology_nodes"), run.table("topology_links")


def _naive_distances(adj_ptr, adj_node, transit, targets):
    """BFS per target over the adjacency lists, expanding only through switches."""
    n = len(adj_ptr) - 1
    out = np.full((len(targets), n), -1)
    for t, root in enumerate(targets):
        out[t, root] = 0
        todo = deque([root])
        while todo:
            u = todo.popleft()
            if u != root and not transit[u]:
                continue
            for v in adj_node[adj_ptr[u]:adj_ptr[u + 1]]:
                if out[t, v] < 0:
                    out[t, v] = out[t, u] + 1
                    todo.append(v)
    return out


def _shortest_paths(topo, a: int, b: int) -> set[tuple[str, ...]]:
    """Every shortest node path from node a to node b through switches only (brute force)."""
    r = topo.route
    names, ptr, nbr, transit = r.node_names, r.tables.adj_ptr, r.tables.adj_node, r.tables.transit
    best: list[tuple[str, ...]] = []
    todo = deque([(a,)])
    while todo:
        path = todo.popleft()
        if best and len(path) > len(best[0]):
            break
        u = path[-1]
        if u == b:
            best.append(tuple(names[i] for i in path))
            continue
        if u != a and not transit[u]:
            continue
        for v in nbr[ptr[u]:ptr[u + 1]]:
            if v not in path:
                todo.append((*path, v))
    return set(best)


def _hops(topo, ids) -> tuple[str, ...]:
    """The node path a flow's resources walk (cable direction: even = src->dst)."""
    links = topo.links
    src, dst = links.column("src").to_pylist(), links.column("dst").to_pylist()
    nodes = []
    for r in ids.tolist():
        a, b = (src[r // 2], dst[r // 2]) if r % 2 == 0 else (dst[r // 2], src[r // 2])
        if not nodes:
            nodes.append(a)
        assert nodes[-1] == a, "consecutive resources must share a node"
        nodes.append(b)
    return tuple(nodes)


def test_distances_match_a_naive_bfs(tmp_path):
    fab = SynthFabric(tuple(f"n{i}" for i in range(6)), nics=2, hosts_per_leaf=2, spines=3)
    nodes, links = _fabric(tmp_path, ibnetdiscover_text(fab))
    topo = build_observed(nodes, links, list(fab.hosts), 4)
    t = topo.route.tables
    targets = np.unique(t.gpu_nic)
    got = _kernels.fabric_distances(t.adj_ptr, t.adj_node, t.transit, targets)
    assert (got == _naive_distances(t.adj_ptr, t.adj_node, t.transit, targets)).all()
    assert (got[:, targets] >= 0).all()


def test_every_flow_takes_a_shortest_path_and_ecmp_uses_every_spine(tmp_path):
    fab = SynthFabric(tuple(f"n{i}" for i in range(4)), nics=1, hosts_per_leaf=2, spines=3)
    nodes, links = _fabric(tmp_path, ibnetdiscover_text(fab))
    topo = build_observed(nodes, links, list(fab.hosts), 2)
    n = 64
    src = np.zeros(n, np.int64)          # n0/gpu0
    dst = np.full(n, 4, np.int64)        # n2/gpu0, on the other leaf
    ip, ids = route(topo, Flows.from_lists(src, dst, np.ones(n), channel=np.arange(n)))
    names = topo.route.node_names
    want = _shortest_paths(topo, names.index("n0/mlx5_0"), names.index("n2/mlx5_0"))
    assert len(want) == 3  # one per spine
    seen = set()
    for f in range(n):
        hops = _hops(topo, ids[ip[f]:ip[f + 1]])
        assert hops[0] == "n0/gpu0" and hops[-1] == "n2/gpu0"
        assert hops[1:-1] in want
        seen.add(hops[2:-2])
    assert {s[1] for s in seen} == {"spine0", "spine1", "spine2"}
    again = route(topo, Flows.from_lists(src, dst, np.ones(n), channel=np.arange(n)))
    assert (again[1] == ids).all()  # deterministic


FABRICS = {  # (hosts, HCAs per host, hosts per leaf, spines), GPUs per host
    "two leaves, three spines": ((4, 1, 2, 3), 2),
    "rails, one spine": ((6, 2, 3, 1), 4),
    "one host per leaf": ((5, 2, 1, 2), 3),
}


@pytest.fixture(scope="module")
def observed_fabrics(tmp_path_factory):
    out = {}
    for name, ((hosts, nics, per_leaf, spines), gpus) in FABRICS.items():
        fab = SynthFabric(tuple(f"n{i}" for i in range(hosts)), nics=nics, hosts_per_leaf=per_leaf, spines=spines)
        nodes, links = _fabric(tmp_path_factory.mktemp("fabric"), ibnetdiscover_text(fab))
        out[name] = build_observed(nodes, links, list(fab.hosts), gpus)
    return out


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(FABRICS)), st.data())
def test_graph_router_matches_its_naive_twin(observed_fabrics, fabric, data):
    topo = observed_fabrics[fabric]
    n = data.draw(st.integers(1, 12))
    gpu = st.integers(0, topo.n_gpus - 1)
    src, dst = data.draw(st.lists(gpu, min_size=n, max_size=n)), data.draw(st.lists(gpu, min_size=n, max_size=n))
    channel = data.draw(st.lists(st.integers(0, 63), min_size=n, max_size=n))
    key = data.draw(st.lists(st.integers(0, 10_000), min_size=n, max_size=n))
    flows = Flows.from_lists(src, dst, np.ones(n), channel=channel, key=key)
    ip, ids = route(topo, flows)
    t = topo.route.tables
    for f in range(n):
        fhash = flow_hash_naive(src[f], dst[f], channel[f], key[f])
        assert ids[ip[f]:ip[f + 1]].tolist() == route_graph_naive(t, src[f], dst[f], fhash)


def test_graph_router_and_its_twin_agree_on_a_fabric_in_two_parts(tmp_path):
    lines = _cable(_ca(10, 1, "a mlx5_0"), _sw(1, 1, "leaf0")) + _cable(_ca(11, 1, "b mlx5_0"), _sw(2, 1, "leaf1"))
    nodes, links = _fabric(tmp_path, "\n".join(lines) + "\n")
    topo = build_observed(nodes, links, ["a", "b"], 1)
    assert route_graph_naive(topo.route.tables, 0, 1, flow_hash_naive(0, 1, 0, 0)) is None
    with pytest.raises(ObservedFabricError, match="no path from a"):
        route(topo, Flows.from_lists([0], [1], [1.0]))


def test_same_leaf_and_same_host_paths(tmp_path):
    fab = SynthFabric(("a", "b", "c", "d"), nics=2, hosts_per_leaf=2, spines=2)
    nodes, links = _fabric(tmp_path, ibnetdiscover_text(fab))
    topo = build_observed(nodes, links, ["a", "b", "c", "d"], 2)
    ip, ids = route(topo, Flows.from_lists([0, 1, 0], [1, 3, 0], [1.0, 1.0, 1.0]))
    assert _hops(topo, ids[ip[0]:ip[1]]) == ("a/gpu0", "a/nvswitch", "a/gpu1")
    # GPU 1 uses the host's second HCA (rails); hosts a and b share leaf0.
    assert _hops(topo, ids[ip[1]:ip[2]]) == ("a/gpu1", "a/mlx5_1", "leaf0", "b/mlx5_1", "b/gpu1")
    assert ip[3] == ip[2]  # a flow to itself has no path
    caps = topo.cap[ids[ip[1]:ip[2]]]
    assert caps[1] == pytest.approx(400 / 8)  # 4x NDR cable in bytes/ns


def test_link_names_are_the_fabric_s(tmp_path):
    fab = SynthFabric(("a", "b"), nics=1, hosts_per_leaf=1, spines=1)
    nodes, links = _fabric(tmp_path, ibnetdiscover_text(fab))
    topo = build_observed(nodes, links, ["a", "b"], 1)
    fabric_links = set(links.column("link").to_pylist())
    assert fabric_links <= set(topo.links.column("link").to_pylist())
    assert "a/mlx5_0:1--leaf0:1" in fabric_links


def test_real_fabric_routes_within_its_leaf_and_names_what_it_cannot(tmp_path):
    if not REAL.is_dir():
        pytest.skip("real telemetry samples not present")
    nodes, links = _fabric(tmp_path, (REAL / "ibnetdiscover_p_links.txt").read_text())
    topo = build_observed(nodes, links, ["o0001", "o0002.cluster"], 1)
    _ip, ids = route(topo, Flows.from_lists([0], [1], [1.0]))
    assert _hops(topo, ids) == ("o0001/gpu0", "o0001/HCA-1", "ib-i1l1s01", "o0002/HCA-1",
                                  "o0002.cluster/gpu0")  # GPUs keep the run's host names
    far = build_observed(nodes, links, ["o0001", "p0001"], 1)
    with pytest.raises(ObservedFabricError, match=r"no path from o0001 .* to p0001"):
        route(far, Flows.from_lists([0], [1], [1.0]))
    with pytest.raises(ObservedFabricError, match=r"have no HCA in the observed fabric .*node9"):
        build_observed(nodes, links, ["o0001", "node9"], 1)


def test_no_fabric_is_a_clear_error():
    with pytest.raises(ObservedFabricError, match="ibnetdiscover"):
        build_observed(None, None, ["a"], 1)



def _cable(a, b):
    (ta, la, pa_, ga, na), (tb, lb, pb, gb, nb) = a, b
    return [f"{ta} {la} {pa_} {ga} 4x NDR - {tb} {lb} {pb} {gb} ( '{na}' - '{nb}' )",
            f"{tb} {lb} {pb} {gb} 4x NDR - {ta} {la} {pa_} {ga} ( '{nb}' - '{na}' )"]


def _sw(lid, port, name):
    return ("SW", lid, port, f"0x{lid:016x}", name)


def _ca(lid, port, name):
    return ("CA", lid, port, f"0x{lid + 0x100:016x}", name)


@pytest.mark.parametrize("spines", [1, 2])
def test_paths_never_cross_a_host_s_hca(tmp_path, spines):
    # leaf0 and leaf1 also meet at host z's dual-port HCA, in as many hops as over one spine (1)
    # or fewer than over a chain of two (2); a host does not forward, so flows take the spines.
    lines = (_cable(_ca(10, 1, "a mlx5_0"), _sw(1, 1, "leaf0")) + _cable(_ca(11, 1, "c mlx5_0"), _sw(2, 1, "leaf1"))
             + _cable(_ca(12, 1, "z mlx5_0"), _sw(1, 2, "leaf0")) + _cable(_ca(12, 2, "z mlx5_0"), _sw(2, 2, "leaf1"))
             + _cable(_sw(1, 9, "leaf0"), _sw(3, 1, "spine0")))
    if spines == 1:
        lines += _cable(_sw(2, 9, "leaf1"), _sw(3, 2, "spine0"))
    else:
        lines += _cable(_sw(3, 2, "spine0"), _sw(4, 1, "spine1")) + _cable(_sw(2, 9, "leaf1"), _sw(4, 2, "spine1"))
    nodes, links = _fabric(tmp_path, "\n".join(lines) + "\n")
    topo = build_observed(nodes, links, ["a", "c", "z"], 1)
    n = 32
    ip, ids = route(topo, Flows.from_lists(np.zeros(n), np.ones(n), np.ones(n), channel=np.arange(n)))
    over = ("spine0",) if spines == 1 else ("spine0", "spine1")
    for f in range(n):
        assert _hops(topo, ids[ip[f]:ip[f + 1]]) == ("a/gpu0", "a/mlx5_0", "leaf0", *over, "leaf1", "c/mlx5_0",
                                                      "c/gpu0")
