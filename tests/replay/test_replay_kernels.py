import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from naive import progressive_filling, simulate_naive

from tracekit.replay import _kernels
from tracekit.replay.decompose import Instance, decompose
from tracekit.replay.simulate import Flows, resource_bytes, route, simulate
from tracekit.replay.topology import build, parse_spec


def _csr(paths):
    """Flow paths (lists of resource ids) as the kernel's (indptr, ids) arrays."""
    indptr = np.concatenate([[0], np.cumsum([len(p) for p in paths])])
    return indptr, np.array([r for p in paths for r in p], np.int64)


def _run(indptr, ids, nbytes, release, cap, lat, lat_mult=None, n_windows=0, window_ns=1.0, lazy_min=16,
         weight=None):
    """The kernel; lazy_min=1 keeps every one-class event's class lazily (0: never); `weight`
    per flow for weighted max-min (None: all 1)."""
    lat_mult = np.ones(len(nbytes)) if lat_mult is None else lat_mult
    args = (np.asarray(indptr, np.int64), np.asarray(ids, np.int64), np.asarray(nbytes, np.float64),
            np.asarray(release, np.float64), np.asarray(lat_mult, np.float64), np.asarray(cap, np.float64),
            np.asarray(lat, np.float64), n_windows, window_ns, 0.0, 1e-9, 0.0, lazy_min)
    if weight is None:
        return _kernels.simulate_flows(*args)
    return _kernels.simulate_flows(*args, np.asarray(weight, np.float64))


@st.composite
def cases(draw):
    n_res = draw(st.integers(1, 5))
    n_flows = draw(st.integers(1, 10))
    cap = draw(st.lists(st.floats(0.5, 20), min_size=n_res, max_size=n_res))
    lat = draw(st.lists(st.sampled_from([0.0, 1.0, 7.5]), min_size=n_res, max_size=n_res))
    paths = draw(st.lists(st.sets(st.integers(0, n_res - 1), min_size=1), min_size=n_flows,
                          max_size=n_flows))
    nbytes = draw(st.lists(st.one_of(st.sampled_from([0.0, 10.0, 64.0]), st.floats(1, 1e4)),
                           min_size=n_flows, max_size=n_flows))
    release = draw(st.lists(st.one_of(st.sampled_from([0.0, 5.0]), st.floats(0, 500)),
                            min_size=n_flows, max_size=n_flows))
    paths = [sorted(p) for p in paths]
    indptr, ids = _csr(paths)
    return indptr, ids, np.array(nbytes), np.array(release), np.array(cap), np.array(lat)


@settings(max_examples=150, deadline=None)
@given(cases(), st.sampled_from([0, 1]))
def test_kernel_matches_naive_twin(case, lazy_min):
    indptr, ids, nbytes, release, cap, lat = case
    fast, _ = _run(indptr, ids, nbytes, release, cap, lat, lazy_min=lazy_min)
    slow = simulate_naive(indptr, ids, nbytes, release, np.ones(len(nbytes)), cap, lat)
    np.testing.assert_allclose(fast, slow, rtol=1e-6, atol=1e-6)


@settings(max_examples=60, deadline=None)
@given(cases(), st.floats(1.0, 8.0))
def test_more_bandwidth_is_never_slower(case, factor):
    indptr, ids, nbytes, release, cap, lat = case
    base, _ = _run(indptr, ids, nbytes, release, cap, lat)
    fast, _ = _run(indptr, ids, nbytes, release, cap * factor, lat)
    assert np.all(fast <= base * (1 + 1e-9) + 1e-6)


def test_progressive_filling_textbook_case():
    rates = progressive_filling({0: [0], 1: [0, 1], 2: [1], 3: [1]}, np.array([1.0, 3.0]))
    assert rates == pytest.approx({0: 0.5, 1: 0.5, 2: 1.25, 3: 1.25})


def _random_flows(seed: int, n_flows: int, n_res: int = 6):
    """Flows over up to 3 of `n_res` resources, random sizes, releases and capacities."""
    rng = np.random.default_rng(seed)
    paths = [sorted(set(rng.integers(0, n_res, 3).tolist())) for _ in range(n_flows)]
    indptr, ids = _csr(paths)
    return indptr, ids, rng.uniform(1, 1e4, n_flows), rng.uniform(0, 1e4, n_flows), rng.uniform(1, 10, n_res)


def test_windows_conserve_bytes_and_are_deterministic():
    n_res = 6
    indptr, ids, nbytes, release, cap = _random_flows(3, 200, n_res)
    a, win = _run(indptr, ids, nbytes, release, cap, np.zeros(n_res), n_windows=4000, window_ns=100.0)
    b, win2 = _run(indptr, ids, nbytes, release, cap, np.zeros(n_res), n_windows=4000, window_ns=100.0)
    assert np.array_equal(a, b) and np.array_equal(win, win2)
    np.testing.assert_allclose(win.sum(axis=1), resource_bytes(n_res, indptr, ids, nbytes), rtol=1e-9)
    assert np.all(win <= cap[:, None] * 100.0 * (1 + 1e-9))


@pytest.mark.parametrize("merge", [0.05, 0.5])
def test_merged_finishes_keep_their_bytes_in_the_windows(merge):
    """`merge` > 0 finishes a flow early, with the current event; the bytes it had left still go
    onto the windows (at that event), so every resource's windows sum to the bytes that crossed it."""
    n_res, n_flows = 6, 300
    indptr, ids, nbytes, release, cap = _random_flows(4, n_flows, n_res)
    args = [np.asarray(indptr, np.int64), ids, nbytes, release, np.ones(n_flows), cap, np.zeros(n_res)]
    exact, _ = _kernels.simulate_flows(*args, 0, 1.0, 0.0, 1e-9, 0.0)
    window_ns = float(np.ceil(exact.max() / 300))  # 400 windows cover the run
    fast, win = _kernels.simulate_flows(*args, 400, window_ns, 0.0, 1e-9, merge)
    assert np.any(fast < exact * (1 - 1e-9))  # some flows did finish early
    np.testing.assert_allclose(win.sum(axis=1), resource_bytes(n_res, indptr, ids, nbytes), rtol=1e-9)


def _single_switch(n, **extra):
    params = ",".join(f"{k}={v}" for k, v in extra.items())
    return build(parse_spec(f"single-switch:hosts={n},gpus=1,nic_efficiency=1" + ("," + params if params else "")))


def test_one_flow_alone():
    topo = _single_switch(2)
    flows = Flows.from_lists([0], [1], [1e8])
    ip, ids = route(topo, flows)
    out = simulate(topo, ip, ids, flows)
    expected = 1e8 / (400 / 8) + 2 * 600
    assert out.finish[0] == pytest.approx(expected, rel=1e-2)


def test_n_flows_on_one_link_take_n_times_as_long():
    topo = _single_switch(2, latency_ns=0)
    one = Flows.from_lists([0], [1], [1e8])
    five = Flows.from_lists([0] * 5, [1] * 5, [1e8] * 5)
    t1 = simulate(topo, *route(topo, one), one).finish.max()
    t5 = simulate(topo, *route(topo, five), five).finish
    np.testing.assert_allclose(t5, 5 * t1, rtol=1e-2)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_ring_all_reduce_closed_form(n):
    topo = _single_switch(n)
    size = 256e6
    flows = decompose([Instance(0, "all_reduce", list(range(n)), size)], topo, np.arange(n))
    out = simulate(topo, *route(topo, flows), flows)
    bw = 400 / 8
    expected = 2 * (n - 1) / n * size / bw + 2 * (n - 1) * (2 * 600)
    assert out.finish.max() == pytest.approx(expected, rel=1e-2)


@pytest.mark.parametrize("k", [2, 4])
def test_all_to_all_inter_leaf_scales_with_oversubscription(k):
    def inter_leaf_time(oversub):
        topo = build(parse_spec(f"fat-tree:hosts=16,gpus=1,leaf_radix=8,routing=spray,"
                                f"latency_ns=0,oversub={oversub}"))
        src, dst = np.divmod(np.arange(256), 16)
        keep = src // 4 != dst // 4
        flows = Flows.from_lists(src[keep], dst[keep], np.full(keep.sum(), 1e6))
        return simulate(topo, *route(topo, flows), flows).finish.max()

    assert inter_leaf_time(k) == pytest.approx(k * inter_leaf_time(1), rel=1e-2)


def test_conservation_on_a_topology():
    topo = build(parse_spec("rail-optimized:hosts=4,gpus=4"))
    rng = np.random.default_rng(1)
    src = rng.integers(0, 16, 300)
    dst = rng.integers(0, 16, 300)
    flows = Flows.from_lists(src, dst, rng.uniform(1e3, 1e6, 300), release=rng.uniform(0, 1e5, 300))
    ip, ids = route(topo, flows)
    per_res = resource_bytes(topo.cap.size, ip, ids, flows.nbytes)
    tiers = np.repeat(np.array(topo.links.column("tier").to_pylist()), 2)
    first = ids[ip[:-1][np.diff(ip) > 0]]
    last = ids[ip[1:][np.diff(ip) > 0] - 1]
    assert np.all(np.isin(first % 2, [0])) and np.all(last % 2 == 1)
    leaving = per_res[:2 * topo.n_cables][0::2][tiers[0::2] == "nvlink"].sum() + \
        per_res[:2 * topo.n_cables][0::2][tiers[0::2] == "pcie"].sum()
    arriving = per_res[:2 * topo.n_cables][1::2][tiers[1::2] == "nvlink"].sum() + \
        per_res[:2 * topo.n_cables][1::2][tiers[1::2] == "pcie"].sum()
    assert leaving == pytest.approx(arriving)
    out = simulate(topo, ip, ids, flows, n_windows=100, window_ns=1e4)
    np.testing.assert_allclose(out.windows.sum(axis=1), per_res, rtol=1e-9, atol=1e-6)


def _skewed_all_to_all(seed=5, hosts=4, gpus=4):
    topo = build(parse_spec(f"rail-optimized:hosts={hosts},gpus={gpus}"))
    rng = np.random.default_rng(seed)
    n = hosts * gpus
    src, dst = np.divmod(np.arange(n * n), n)
    keep = src != dst
    load = rng.dirichlet(np.full(n, 0.5)) * n
    nbytes = rng.poisson(load[dst[keep]] * 2e4) * 16.0 + 1.0
    release = rng.uniform(0, 2e4, n)[src[keep]]
    return topo, Flows.from_lists(src[keep], dst[keep], nbytes, release=release)


def test_skewed_all_to_all_matches_naive_twin():
    topo, flows = _skewed_all_to_all()
    ip, ids = route(topo, flows)
    fast = simulate(topo, ip, ids, flows).finish
    slow = simulate_naive(ip, ids, flows.nbytes, flows.release, flows.lat_mult, topo.cap,
                          topo.res_latency)
    np.testing.assert_allclose(fast, slow, rtol=1e-9)


def test_flow_order_does_not_matter():
    topo, flows = _skewed_all_to_all(seed=7)
    ip, ids = route(topo, flows)
    out = simulate(topo, ip, ids, flows, n_windows=50, window_ns=1e3)
    perm = np.random.default_rng(0).permutation(len(flows))
    shuffled = Flows(*(getattr(flows, name)[perm] for name in (
        "src", "dst", "nbytes", "release", "lat_mult", "channel", "mode", "key")))
    ip2, ids2 = route(topo, shuffled)
    out2 = simulate(topo, ip2, ids2, shuffled, n_windows=50, window_ns=1e3)
    np.testing.assert_allclose(out2.finish, out.finish[perm], rtol=1e-12)
    np.testing.assert_allclose(out2.windows, out.windows, rtol=1e-9, atol=1e-6)


@st.composite
def shared_route_cases(draw):
    """Many flows on a few routes (and a few flows on routes of their own): the rate classes of
    the kernel (flows bottlenecked on one resource) hold many flows of different sizes and
    release times."""
    n_res = draw(st.integers(2, 6))
    cap = draw(st.lists(st.floats(0.5, 20), min_size=n_res, max_size=n_res))
    routes = draw(st.lists(st.sets(st.integers(0, n_res - 1), min_size=1), min_size=1, max_size=4))
    n_flows = draw(st.integers(2, 40))
    route_of = draw(st.lists(st.integers(0, len(routes) - 1), min_size=n_flows, max_size=n_flows))
    nbytes = draw(st.lists(st.one_of(st.sampled_from([16.0, 64.0]), st.floats(1, 1e4)),
                           min_size=n_flows, max_size=n_flows))
    release = draw(st.lists(st.one_of(st.just(0.0), st.floats(0, 2e3)), min_size=n_flows, max_size=n_flows))
    paths = [sorted(routes[r]) for r in route_of]
    indptr, ids = _csr(paths)
    return indptr, ids, np.array(nbytes), np.array(release), np.array(cap), np.zeros(n_res)


@settings(max_examples=200, deadline=None)
@given(shared_route_cases(), st.sampled_from([0, 1, 3]))
def test_kernel_matches_naive_twin_on_shared_routes(case, lazy_min):
    indptr, ids, nbytes, release, cap, lat = case
    fast, win = _run(indptr, ids, nbytes, release, cap, lat, n_windows=100, window_ns=1e5, lazy_min=lazy_min)
    slow = simulate_naive(indptr, ids, nbytes, release, np.ones(len(nbytes)), cap, lat)
    np.testing.assert_allclose(fast, slow, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(win.sum(axis=1), resource_bytes(cap.size, indptr, ids, nbytes), rtol=1e-9)
    assert np.all(win <= cap[:, None] * 1e5 * (1 + 1e-9))


@settings(max_examples=150, deadline=None)
@given(st.one_of(cases(), shared_route_cases()), st.sampled_from([0, 1]), st.sampled_from([7.0, 100.0, 1e3]))
def test_window_bytes_match_naive_twin(case, lazy_min, window_ns):
    """Bytes per resource per window (integrals of the link loads in the kernel) against the twin's
    rate x overlap per flow, hop and interval."""
    indptr, ids, nbytes, release, cap, lat = case
    _, win = _run(indptr, ids, nbytes, release, cap, lat, n_windows=40, window_ns=window_ns, lazy_min=lazy_min)
    _, slow = simulate_naive(indptr, ids, nbytes, release, np.ones(len(nbytes)), cap, lat, windows=(40, window_ns))
    np.testing.assert_allclose(win, slow, rtol=1e-6, atol=1e-6 * max(1.0, slow.max()))


@pytest.mark.parametrize("lazy_min", [0, 1])
def test_one_class_of_different_sizes_finishes_in_closed_form(lazy_min):
    """n flows share one link from t=0, sizes s_1 < ... < s_n: while k flows are left each gets
    c/k, so t_k = t_{k-1} + (n - k + 1)(s_k - s_{k-1}) / c (processor sharing, by hand)."""
    c, sizes = 4.0, np.array([100.0, 250.0, 260.0, 1000.0, 4000.0])
    n = sizes.size
    # the flows take two routes that meet at resource 0 (the bottleneck), so they are one class
    # of flows with different paths; resources 1 and 2 are fast
    indptr = np.arange(0, 2 * n + 1, 2)
    ids = np.array([[0, 1 + f % 2] for f in range(n)]).ravel()
    fast, win = _run(indptr, ids, sizes, np.zeros(n), [c, 100.0, 100.0], np.zeros(3), n_windows=10, window_ns=1e3,
                     lazy_min=lazy_min)
    expected, t, prev = [], 0.0, 0.0
    for k, s in enumerate(sizes, start=1):
        t += (n - k + 1) * (s - prev) / c
        prev = s
        expected.append(t)
    np.testing.assert_allclose(fast, expected, rtol=1e-12)
    np.testing.assert_allclose(win[0], [min(c * 1e3, sizes.sum() - c * 1e3 * w) for w in range(2)] + [0.0] * 8,
                               rtol=1e-12, atol=1e-9)


def test_one_class_with_staggered_releases_matches_the_twin():
    """An incast: 30 flows of different sizes released at different times into one downlink,
    from sources whose uplinks are fast, plus two flows that leave through a slow uplink."""
    n = 30
    rng = np.random.default_rng(11)
    src = np.r_[np.arange(n) % 6, [6, 6]]
    paths = [[1 + s, 0] for s in src]  # uplink of the source, then the shared downlink 0
    paths[-1] = [7, 8]  # the slow uplink's other flow goes elsewhere
    cap = np.r_[10.0, np.full(6, 50.0), [3.0, 50.0]]
    nbytes = rng.integers(1, 50, n + 2) * 64.0
    release = np.r_[np.sort(rng.choice([0.0, 20.0, 55.0, 300.0], n)), [0.0, 10.0]]
    indptr, ids = _csr(paths)
    slow = simulate_naive(indptr, ids, nbytes, release, np.ones(n + 2), cap, np.zeros(cap.size))
    for lazy_min in (0, 1, 16):
        fast, _ = _run(indptr, ids, nbytes, release, cap, np.zeros(cap.size), lazy_min=lazy_min)
        np.testing.assert_allclose(fast, slow, rtol=1e-9)


@pytest.mark.parametrize("seed", [5, 8])
def test_lazy_classes_change_nothing_on_a_skewed_all_to_all(seed):
    """Classes kept lazily (a class-level service counter, member heaps, window bytes attributed
    on leaving) give the flows' finish times and the links' window bytes of the flow-by-flow
    kernel (which the naive twin checks) on an incast-heavy all-to-all with staggered releases."""
    topo, flows = _skewed_all_to_all(seed=seed, hosts=8, gpus=4)
    ip, ids = route(topo, flows)
    args = (ip, ids, flows.nbytes, flows.release, topo.cap, topo.res_latency)
    window_ns = float(np.ceil(_run(*args, lazy_min=0)[0].max() / 50))
    exact, win0 = _run(*args, n_windows=60, window_ns=window_ns, lazy_min=0)
    for lazy_min in (1, 4, 16):
        lazy, win = _run(*args, n_windows=60, window_ns=window_ns, lazy_min=lazy_min)
        np.testing.assert_allclose(lazy, exact, rtol=1e-12)
        np.testing.assert_allclose(win, win0, rtol=1e-9, atol=1e-6 * win0.max())
    per_res = resource_bytes(topo.cap.size, ip, ids, flows.nbytes)
    np.testing.assert_allclose(win.sum(axis=1), per_res, rtol=1e-9)


WEIGHTS = st.one_of(st.sampled_from([1.0, 0.5, 0.25, 1 / 3, 0.125, 2.0]), st.floats(0.05, 4.0))


def test_weighted_progressive_filling_textbook_case():
    """Weights 1 and 3 on one link of capacity 4 share it 1:3; a third flow of weight 1 alone on a
    link of capacity 0.5 freezes first, and the other two split what it leaves 1:3."""
    rates = progressive_filling({0: [0], 1: [0]}, np.array([4.0]), {0: 1.0, 1: 3.0})
    assert rates == pytest.approx({0: 1.0, 1: 3.0})
    rates = progressive_filling({0: [0], 1: [0], 2: [0, 1]}, np.array([4.0, 0.5]), {0: 1.0, 1: 3.0, 2: 1.0})
    assert rates == pytest.approx({0: 0.875, 1: 2.625, 2: 0.5})


@settings(max_examples=150, deadline=None)
@given(st.one_of(cases(), shared_route_cases()), st.sampled_from([0, 1, 3]), st.data())
def test_weighted_kernel_matches_naive_twin(case, lazy_min, data):
    """Weighted max-min: the kernel (water-fill, rate classes, lazy classes, bottleneck check all
    per unit weight) against full weighted progressive filling at every event, finish times and
    window bytes."""
    indptr, ids, nbytes, release, cap, lat = case
    weight = np.array(data.draw(st.lists(WEIGHTS, min_size=len(nbytes), max_size=len(nbytes))))
    fast, win = _run(indptr, ids, nbytes, release, cap, lat, n_windows=40, window_ns=100.0, lazy_min=lazy_min,
                     weight=weight)
    slow, slow_win = simulate_naive(indptr, ids, nbytes, release, np.ones(len(nbytes)), cap, lat,
                                    windows=(40, 100.0), weight=weight)
    np.testing.assert_allclose(fast, slow, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(win, slow_win, rtol=1e-6, atol=1e-6 * max(1.0, slow_win.max()))


def test_unit_weights_are_the_unweighted_kernel_bit_for_bit():
    topo, flows = _skewed_all_to_all(seed=9, hosts=8, gpus=4)
    ip, ids = route(topo, flows)
    args = (ip, ids, flows.nbytes, flows.release, topo.cap, topo.res_latency)
    plain, win = _run(*args, n_windows=30, window_ns=1e3)
    unit, win1 = _run(*args, n_windows=30, window_ns=1e3, weight=np.ones(len(flows)))
    assert np.array_equal(plain, unit) and np.array_equal(win, win1)


@pytest.mark.parametrize("seed", [5, 8])
def test_weighted_lazy_classes_match_flow_by_flow_and_the_twin(seed):
    """An incast-heavy all-to-all with staggered releases and per-flow weights (1/k for the k flows
    of a source, as per-instance NIC sharing gives): lazy classes on and off agree, and both
    agree with the naive twin."""
    topo, flows = _skewed_all_to_all(seed=seed)
    rng = np.random.default_rng(seed)
    weight = 1.0 / rng.integers(1, 9, len(flows))
    ip, ids = route(topo, flows)
    args = (ip, ids, flows.nbytes, flows.release, topo.cap, topo.res_latency)
    exact, _ = _run(*args, lazy_min=0, weight=weight)
    slow = simulate_naive(ip, ids, flows.nbytes, flows.release, flows.lat_mult, topo.cap, topo.res_latency,
                          weight=weight)
    np.testing.assert_allclose(exact, slow, rtol=1e-9)
    for lazy_min in (1, 16):
        lazy, _ = _run(*args, lazy_min=lazy_min, weight=weight)
        np.testing.assert_allclose(lazy, exact, rtol=1e-12)


def test_weighted_class_with_a_late_arrival_matches_the_twin():
    """Nine flows on one link, one of weight 0.1875 (its rate x 1/weight rounds below the class's
    share) and one arriving while the class is lazy: the largest rate per unit weight of the link
    must be recomputed when a flow near it leaves (found by hypothesis)."""
    indptr, ids = np.arange(10), np.zeros(9, np.int64)
    nbytes = np.array([16.0, 16, 16, 16, 16, 16, 64, 16, 3])
    release = np.array([0.0, 0, 0, 0, 0, 9, 0, 0, 0])
    cap, lat = np.array([18.0, 1.0]), np.zeros(2)
    weight = np.array([1.0, 1, 1, 1, 0.5, 1, 1, 0.1875, 1])
    slow = simulate_naive(indptr, ids, nbytes, release, np.ones(9), cap, lat, weight=weight)
    for lazy_min in (0, 1):
        fast, _ = _run(indptr, ids, nbytes, release, cap, lat, lazy_min=lazy_min, weight=weight)
        np.testing.assert_allclose(fast, slow, rtol=1e-9)


@pytest.mark.parametrize("lazy_min", [0, 1, 16])
def test_windows_of_the_first_resources_only_are_those_of_all(lazy_min):
    """`n_window_res` keeps the windows of the first resources (a rate limit's private resources
    come after the topology's and need none): the same finishes, and those rows bit for bit."""
    n_res, n_flows = 7, 300
    indptr, ids, nbytes, release, cap = _random_flows(5, n_flows, n_res)
    args = [np.asarray(indptr, np.int64), ids, nbytes, release, np.ones(n_flows), cap, np.full(n_res, 3.0)]
    exact, _ = _kernels.simulate_flows(*args, 0, 1.0, 0.0, 1e-9, 0.0)
    window_ns = float(np.ceil(exact.max() / 50))
    full = _kernels.simulate_flows(*args, 60, window_ns, 0.0, 1e-9, 0.0, lazy_min)
    assert full[1].shape == (n_res, 60) and full[1].sum() > 0
    for keep in (0, 1, 4, n_res):
        part = _kernels.simulate_flows(*args, 60, window_ns, 0.0, 1e-9, 0.0, lazy_min, None, keep)
        assert np.array_equal(part[0], full[0])
        assert part[1].shape == (keep, 60) and np.array_equal(part[1], full[1][:keep])


def test_simulate_windows_the_topology_not_the_rate_limits():
    """A rate-limited flow crosses a private resource of its own; `simulate` returns windows for
    the topology's resources only, equal to the rows of a simulation that windows them all."""
    from tracekit.replay.simulate import with_rate_limits

    topo = _single_switch(4)
    n = 40
    rng = np.random.default_rng(3)
    src = rng.integers(0, 4, n)
    flows = Flows.from_lists(src, (src + 1 + rng.integers(0, 3, n)) % 4, rng.uniform(1e5, 1e7, n),
                             release=rng.uniform(0, 2e5, n), max_gbs=np.where(np.arange(n) % 3 == 0, 5.0, np.inf))
    ip, ids = route(topo, flows)
    weight = np.ones(n)
    out = simulate(topo, ip, ids, flows, n_windows=30, window_ns=2e4, weight=weight)
    ip2, ids2, cap2, lat2 = with_rate_limits(ip, ids, flows.max_gbs, topo.cap, topo.res_latency)
    finish, win = _kernels.simulate_flows(ip2, ids2, flows.nbytes, flows.release, flows.lat_mult, cap2, lat2, 30,
                                          2e4, 0.0, 1e-9, 0.0, 16, weight)
    assert win.shape[0] > topo.cap.size and out.windows.shape == (topo.cap.size, 30)
    assert np.array_equal(out.finish, finish) and np.array_equal(out.windows, win[:topo.cap.size])
    assert out.windows.sum() > 0
