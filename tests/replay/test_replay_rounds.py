"""Rounds: later rounds of the replay's fixed point re-simulate only the components whose release
times moved, and must give what one simulation of every flow gives."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracekit.replay import _kernels, engine, rounds
from tracekit.replay.rounds import Rounds
from tracekit.replay.simulate import Flows, simulate
from tracekit.replay.topology import build, parse_spec
from tracekit.synth import make_run_tables


def _csr(paths):
    indptr = np.concatenate([[0], np.cumsum([len(p) for p in paths])]).astype(np.int64)
    return indptr, np.array([r for p in paths for r in p], np.int64)


class _Topo:
    """The two arrays of a topology the simulator reads."""

    def __init__(self, cap, lat):
        self.cap = np.asarray(cap, np.float64)
        self.res_latency = np.asarray(lat, np.float64)


def _full(topo, indptr, ids, nbytes, release):
    flows = Flows.from_lists(np.zeros(len(nbytes)), np.zeros(len(nbytes)), nbytes, release=release)
    return simulate(topo, indptr, ids, flows, weight=np.ones(len(nbytes))).finish


def _rounds(topo, indptr, ids, nbytes, release):
    return Rounds(topo, indptr, ids, np.asarray(nbytes, np.float64), np.ones(len(nbytes)), release,
                  _full(topo, indptr, ids, nbytes, release))


# --- the components kernel against its twin -------------------------------------------------


def components_naive(paths, start, end):
    """Union of every pair of flows sharing a resource where the later one (by start, then index)
    starts before the earlier one ends; labels are each component's smallest flow index."""
    n = len(paths)
    parent = list(range(n))

    def find(x):
        while parent[x] != x:
            x = parent[x]
        return x

    order = sorted(range(n), key=lambda f: (start[f], f))
    for i, f in enumerate(order):
        for g in order[i + 1:]:
            if set(paths[f]) & set(paths[g]) and start[g] < end[f]:
                a, b = find(f), find(g)
                parent[max(a, b)] = min(a, b)
    return np.array([min(h for h in range(n) if find(h) == find(f)) for f in range(n)])


@st.composite
def interval_cases(draw):
    n_res = draw(st.integers(1, 5))
    n = draw(st.integers(1, 12))
    paths = draw(st.lists(st.lists(st.integers(0, n_res - 1), min_size=0, max_size=3, unique=True),
                          min_size=n, max_size=n))
    start = draw(st.lists(st.sampled_from([0.0, 1.0, 2.0, 3.0, 5.0, 8.0]), min_size=n, max_size=n))
    length = draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0, 4.0]), min_size=n, max_size=n))
    return n_res, paths, np.array(start), np.array(start) + np.array(length)


@settings(max_examples=200, deadline=None)
@given(interval_cases())
def test_components_match_the_twin(case):
    n_res, paths, start, end = case
    indptr, ids = _csr(paths)
    label = _kernels.flow_components(indptr, ids, start, end, n_res)
    assert label.tolist() == components_naive(paths, start, end).tolist()


def test_components_touching_end_to_start_are_apart_and_a_shared_link_joins():
    # flow 0 on link 0 ends at 10 when flow 1 starts; flow 2 bridges 1 and 3 through link 1
    indptr, ids = _csr([[0], [0, 1], [1, 2], [2]])
    label = _kernels.flow_components(indptr, ids, np.array([0.0, 10.0, 12.0, 14.0]),
                                     np.array([10.0, 20.0, 15.0, 16.0]), 3)
    assert label.tolist() == [0, 1, 1, 1]


def path_latency_naive(res_lat, paths, lat_mult):
    """Per flow, its multiplier times its resources' latencies summed along the path."""
    out = []
    for path, m in zip(paths, lat_mult, strict=True):
        total = 0.0
        for r in path:
            total += float(res_lat[r])
        out.append(total * float(m))
    return np.array(out)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.integers(0, 4), max_size=4), min_size=1, max_size=8),
       st.lists(st.sampled_from([0.0, 0.1, 3.0, 1e3 / 7]), min_size=5, max_size=5), st.data())
def test_path_latency_matches_the_twin_and_the_simulators_latency(paths, res_lat, data):
    lat_mult = data.draw(st.lists(st.sampled_from([1.0, 2.0, 14.0, 8190.0]), min_size=len(paths), max_size=len(paths)))
    indptr, ids = _csr(paths)
    got = rounds.path_latency(np.array(res_lat), indptr, ids, np.array(lat_mult))
    assert got.tolist() == path_latency_naive(res_lat, paths, lat_mult).tolist()
    topo = _Topo(np.ones(5), res_lat)  # a flow alone of no bytes finishes at its release plus its latency
    with_path = np.diff(indptr) > 0
    n = len(paths)
    flows = Flows.from_lists(np.zeros(n), np.zeros(n), np.zeros(n), lat_mult=lat_mult)
    finish = simulate(topo, indptr, ids, flows, weight=np.ones(n)).finish
    assert finish[with_path].tolist() == got[with_path].tolist()


def test_components_join_flows_while_they_send_not_while_their_latency_runs():
    """Flow 0 sends 100 bytes over a link of 1 byte/ns from 0 to 100, then its 8 x 50 ns of path
    latency run (finish 500); flow 1 starts on that link at 120: they never share it."""
    topo = _Topo([1.0], [50.0])
    indptr, ids = _csr([[0], [0]])
    nbytes, release = np.array([100.0, 100.0]), np.array([0.0, 120.0])
    r = Rounds(topo, indptr, ids, nbytes, np.array([8.0, 8.0]), release,
               simulate(topo, indptr, ids, Flows.from_lists([0, 0], [0, 0], nbytes, release=release,
                                                            lat_mult=[8.0, 8.0]), weight=np.ones(2)).finish)
    assert r.finish.tolist() == [500.0, 620.0]
    assert r.components(r.release, r.finish).tolist() == [0, 1]
    got = r.step(release + np.array([0.0, 30.0]))  # flow 1 moves alone, still after flow 0 sent
    assert r.calls == 0 and got.tolist() == [500.0, 650.0]


def test_mixed_components():
    label = np.array([0, 0, 2, 2, 4])
    unit = np.array([7, 7, 7, -1, -1])
    assert _kernels.mixed_components(label, unit).tolist() == [False, False, True, True, False]


# --- rounds against one simulation of every flow ----------------------------------------------


@st.composite
def round_cases(draw):
    """Flows in instances (one release each) on a few links; a first round of releases and a
    second where each instance stays, moves with its neighbours or moves alone."""
    n_res = draw(st.integers(1, 4))
    n_inst = draw(st.integers(1, 6))
    per = draw(st.lists(st.integers(1, 3), min_size=n_inst, max_size=n_inst))
    key = np.repeat(np.arange(n_inst), per)
    n = key.size
    paths = draw(st.lists(st.lists(st.integers(0, n_res - 1), min_size=1, max_size=3, unique=True),
                          min_size=n, max_size=n))
    nbytes = np.array(draw(st.lists(st.sampled_from([0.0, 100.0, 400.0, 1000.0]), min_size=n, max_size=n)))
    cap = np.array(draw(st.lists(st.sampled_from([1.0, 2.0, 5.0]), min_size=n_res, max_size=n_res)))
    lat = np.array(draw(st.lists(st.sampled_from([0.0, 3.0]), min_size=n_res, max_size=n_res)))
    first = np.array(draw(st.lists(st.sampled_from([0.0, 100.0, 300.0, 1000.0, 2000.0]),
                                   min_size=n_inst, max_size=n_inst)))
    moves = draw(st.lists(st.sampled_from([0.0, 0.0, 50.0, -50.0, 250.0, 700.0, -900.0]),
                          min_size=n_inst, max_size=n_inst))
    together = draw(st.booleans())
    second = first + (np.full(n_inst, moves[0]) if together else np.array(moves))
    return _Topo(cap, lat), paths, nbytes, first[key], np.maximum(second, 0.0)[key]


@settings(max_examples=200, deadline=None)
@given(round_cases())
def test_a_round_gives_what_one_simulation_of_every_flow_gives(case):
    topo, paths, nbytes, first, second = case
    indptr, ids = _csr(paths)
    r = _rounds(topo, indptr, ids, nbytes, first)
    np.testing.assert_allclose(r.step(second), _full(topo, indptr, ids, nbytes, second), rtol=1e-9, atol=1e-6)
    np.testing.assert_allclose(r.step(first), _full(topo, indptr, ids, nbytes, first), rtol=1e-9, atol=1e-6)


def _two_groups():
    """Group A (flows 0, 1) on links 0 and 1 from t=0 (done at 400); group B (flows 2, 3) on links
    1 and 2 from t=1000 (done at 1600): apart in time, joined by link 1 when they overlap. Group C
    (six flows on link 3, much later) never moves."""
    topo = _Topo([1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0])
    indptr, ids = _csr([[0], [0, 1], [1], [1, 2]] + [[3]] * 6)
    nbytes = np.array([200.0, 200.0, 300.0, 300.0] + [100.0] * 6)
    return topo, indptr, ids, nbytes, np.array([0.0, 0.0, 1000.0, 1000.0] + [1e6] * 6)


def test_a_late_group_moved_onto_an_early_one_is_simulated_again():
    topo, indptr, ids, nbytes, release = _two_groups()
    r = _rounds(topo, indptr, ids, nbytes, release)
    assert r.components(r.release, r.finish).tolist() == [0, 0, 2, 2] + [4] * 6
    moved = release + np.array([0.0, 0.0, -900.0, -900.0] + [0.0] * 6)  # B moves by one shift: alone, it is kept
    got = r.step(moved)
    want = _full(topo, indptr, ids, nbytes, moved)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert got[1] > 400.0  # A's second flow now shares link 1 with B: the early group changed
    assert r.calls == 1 and r.simulated == 4


def test_an_early_group_moved_onto_a_late_one_through_a_shared_link():
    topo, indptr, ids, nbytes, release = _two_groups()
    r = _rounds(topo, indptr, ids, nbytes, release)
    moved = release + np.array([850.0, 850.0, 0.0, 0.0] + [0.0] * 6)  # A moves, B stays: they meet on link 1
    got = r.step(moved)
    np.testing.assert_allclose(got, _full(topo, indptr, ids, nbytes, moved), rtol=1e-12)
    assert got[2] > 1600.0  # B's first flow shares link 1 with A


def test_groups_that_move_apart_keep_their_results_shifted():
    topo, indptr, ids, nbytes, release = _two_groups()
    r = _rounds(topo, indptr, ids, nbytes, release)
    before = r.finish.copy()
    moved = release + np.array([0.0, 0.0, 4000.0, 4000.0] + [0.0] * 6)
    got = r.step(moved)
    assert r.calls == 0  # nothing simulated: B kept its result, 4000 ns later
    np.testing.assert_allclose(got, before + np.array([0.0, 0.0, 4000.0, 4000.0] + [0.0] * 6), rtol=1e-12)
    np.testing.assert_allclose(got, _full(topo, indptr, ids, nbytes, moved), rtol=1e-12)


def test_a_group_whose_flows_move_apart_is_simulated_again():
    topo, indptr, ids, nbytes, release = _two_groups()
    r = _rounds(topo, indptr, ids, nbytes, release)
    moved = release + np.array([0.0, 150.0, 0.0, 0.0] + [0.0] * 6)  # A's flows no longer start together
    got = r.step(moved)
    np.testing.assert_allclose(got, _full(topo, indptr, ids, nbytes, moved), rtol=1e-12)
    assert r.calls == 1 and r.simulated == 2  # only A


def test_a_random_sequence_of_rounds_on_a_topology():
    topo = build(parse_spec("rail-optimized:hosts=4,gpus=4"))
    rng = np.random.default_rng(4)
    n_inst, per = 60, 12
    src = rng.integers(0, 16, n_inst * per)
    dst = (src + rng.integers(1, 16, src.size)) % 16
    key = np.repeat(np.arange(n_inst), per)
    flows = Flows.from_lists(src, dst, rng.uniform(1e5, 4e6, src.size), key=key)
    from tracekit.replay.simulate import route

    indptr, ids = route(topo, flows)
    start = np.sort(rng.uniform(0, 2e7, n_inst))
    r = Rounds(topo, indptr, ids, flows.nbytes, flows.lat_mult, start[key],
               _full(topo, indptr, ids, flows.nbytes, start[key]))
    for _ in range(4):
        start = start + np.where(rng.random(n_inst) < 0.8, 0.0, rng.uniform(-2e5, 8e5, n_inst))
        start = start + np.where(np.arange(n_inst) > rng.integers(0, n_inst), rng.uniform(0, 3e5), 0.0)
        np.testing.assert_allclose(r.step(start[key]), _full(topo, indptr, ids, flows.nbytes, start[key]),
                                   rtol=1e-9)
    assert 0 < r.simulated < 4 * key.size  # some rounds kept components, some simulated again


# --- the whole replay ----------------------------------------------------------------------------


def _every_flow_every_round(self, release):
    self.calls += 1
    self.simulated += release.size
    return self.simulate_some(np.asarray(release, np.float64), np.arange(release.size))


@pytest.fixture(scope="module")
def moe_tables():
    tables, _ = make_run_tables(steps=2)
    return tables


TOPOLOGIES = ["rail-optimized:gpus=4", "rail-optimized:gpus=4,nic_gbps=100", "fat-tree:gpus=4,oversub=4"]


def test_replay_equals_simulating_every_flow_every_round(moe_tables, monkeypatch):
    steps = []
    real = Rounds.step

    def counted(self, release):
        out = real(self, release)
        steps.append((self.simulated, release.size))
        return out

    monkeypatch.setattr(Rounds, "step", counted)
    fast = engine.replay(moe_tables, TOPOLOGIES)
    assert steps and any(sim < n for sim, n in steps)  # rounds kept some components
    monkeypatch.setattr(Rounds, "step", _every_flow_every_round)
    slow = engine.replay(moe_tables, TOPOLOGIES)
    for a, b in zip(fast.results, slow.results, strict=True):
        assert a.step_ns.keys() == b.step_ns.keys()
        for s in a.step_ns:
            assert abs(a.step_ns[s] - b.step_ns[s]) <= 1
        assert np.abs(np.array([i.replayed_ns for i in a.instances])
                      - np.array([i.replayed_ns for i in b.instances])).max() <= 1
        assert a.hot_links == b.hot_links and a.comm_ns.keys() == b.comm_ns.keys()
        for col in ("tx_bytes", "rx_bytes"):
            np.testing.assert_allclose(a.link_samples.column(col).to_numpy(), b.link_samples.column(col).to_numpy(),
                                       rtol=1e-9, atol=1e-3)
        assert a.link_samples.column("ts_ns").to_pylist() == b.link_samples.column("ts_ns").to_pylist()
    assert fast.identity == slow.identity and fast.efficiency == slow.efficiency


def test_a_replay_runs_two_full_simulations_per_topology(moe_tables, monkeypatch):
    """The first round (for the baseline: the calibration run) and the link windows of the last;
    the rounds between simulate parts (before: every round simulated every flow)."""
    calls = []
    real = rounds.simulate

    def counted(topology, indptr, ids, flows, **kw):
        calls.append((id(topology), len(flows)))
        return real(topology, indptr, ids, flows, **kw)

    monkeypatch.setattr(rounds, "simulate", counted)
    monkeypatch.setattr(engine, "simulate", counted)
    res = engine.replay(moe_tables, TOPOLOGIES)
    for r in res.results:
        mine = [n for t, n in calls if t == id(r.topology_links) or n <= r.n_flows]
        assert r.n_flows in mine
    by_topology = {}
    for t, n in calls:
        by_topology.setdefault(t, []).append(n)
    assert len(by_topology) == len(TOPOLOGIES)
    for sizes in by_topology.values():
        assert sizes.count(max(sizes)) == 2 and len(sizes) > 2


def test_link_samples_follow_the_replayed_timeline_not_the_first_round():
    """Compute replayed 1.5 ms longer moves the all-reduce from 1 ms to 2.5 ms: the later rounds keep
    its flows (shifted), and the link samples are those of the last round's releases."""
    import pyarrow as pa
    from hand_traces import BASE, PHYSICS_NS, T0, Trace

    tr = Trace()
    for r in (0, 1):
        tr.kernel(r, "gpu0/stream7", "compute", 0, 1_000_000)
        tr.kernel(r, "gpu0/stream7", "comm", 1_000_000, PHYSICS_NS, coll=tr.collective(0, "all_reduce", "dp", 0, r))
    tables = tr.tables()
    ev = tables["events"]
    tables["events"] = ev.append_column("replay_dur_ns", pa.array([2_500_000, None, 2_500_000, None], pa.int64()))
    res = engine.replay(tables, [BASE])
    samples = res.results[0].link_samples
    ts = samples.column("ts_ns").to_numpy() - T0
    sent = samples.column("tx_bytes").to_numpy() + samples.column("rx_bytes").to_numpy()
    assert sent.sum() > 0
    assert sent[ts < 2_490_000].sum() == 0 and sent[ts >= 3_600_000].sum() == 0


def test_class_resource_bytes_matches_a_bincount_per_class():
    rng = np.random.default_rng(2)
    paths = [sorted(set(rng.integers(0, 7, 3).tolist())) for _ in range(50)]
    indptr, ids = _csr(paths)
    nbytes = rng.uniform(1, 1e6, 50)
    cls = rng.integers(0, 3, 50)
    got = _kernels.class_resource_bytes(indptr, ids, nbytes, cls, 3, 7)
    for c in range(3):
        w = np.where(cls == c, nbytes, 0.0)
        assert np.array_equal(got[c], np.bincount(ids, weights=np.repeat(w, np.diff(indptr)), minlength=7))


def test_network_time_per_instance_is_its_last_flow_to_finish(moe_tables):
    prep = engine._prepare(moe_tables)
    net = engine._Net(prep, parse_spec("rail-optimized:gpus=4"), "auto")
    rng = np.random.default_rng(6)
    release = net.release(rng.uniform(0, 1e6, len(prep.instances)))
    finish = release + rng.uniform(1e3, 1e5, release.size)
    want = np.zeros(len(prep.instances))
    for f, k in enumerate(net.flows.key.tolist()):
        want[k] = max(want[k], finish[f] - release[f])
    assert net._runs is not None  # flows come instance by instance: one reduceat
    np.testing.assert_array_equal(net.durations(release, finish), want * net.fill)
    net._runs = None
    np.testing.assert_array_equal(net.durations(release, finish), want * net.fill)
