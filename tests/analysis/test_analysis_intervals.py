"""The numba kernels against slow, obviously correct twins, and interval-algebra properties."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tracekit.analysis import _kernels


def union(iv):
    out = []
    for s, e in sorted(iv):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def length(iv):
    return sum(e - s for s, e in union(iv))


def intersect(a, b):
    out = []
    for s1, e1 in union(a):
        for s2, e2 in union(b):
            s, e = max(s1, s2), min(e1, e2)
            if e > s:
                out.append((s, e))
    return out


def naive_sweep(intervals, n_seg, n_cat, compute_cat, comm_mask):
    """intervals: list of (seg, cat, s, e)."""
    length_ = np.zeros((n_seg, n_cat), np.int64)
    overlap = np.zeros((n_seg, n_cat), np.int64)
    busy = np.zeros(n_seg, np.int64)
    comm_any = np.zeros(n_seg, np.int64)
    comm_ov = np.zeros(n_seg, np.int64)
    for g in range(n_seg):
        by_cat = {c: [(s, e) for sg, cc, s, e in intervals if sg == g and cc == c] for c in range(n_cat)}
        comp = by_cat[compute_cat]
        for c in range(n_cat):
            length_[g, c] = length(by_cat[c])
            overlap[g, c] = length(intersect(by_cat[c], comp))
        busy[g] = length([iv for c in range(n_cat) for iv in by_cat[c]])
        comm = [iv for c in range(n_cat) if comm_mask[c] for iv in by_cat[c]]
        comm_any[g] = length(comm)
        comm_ov[g] = length(intersect(comm, comp))
    return length_, overlap, busy, comm_any, comm_ov


def run_sweep(intervals, n_seg, n_cat, compute_cat, comm_mask):
    if not intervals:
        seg = cat = s = e = np.zeros(0, np.int64)
    else:
        seg, cat, s, e = (np.array(x, np.int64) for x in zip(*intervals, strict=True))
    t = np.concatenate([s, e])
    seg2 = np.concatenate([seg, seg])
    delta = np.concatenate([np.ones(len(s), np.int64), -np.ones(len(s), np.int64)])
    order = np.lexsort((t, seg2))
    return _kernels.sweep(seg2[order], t[order], delta[order], np.concatenate([cat, cat])[order],
                          n_seg, n_cat, compute_cat, np.array(comm_mask))


interval = st.tuples(st.integers(0, 2), st.integers(0, 3), st.integers(0, 100), st.integers(1, 40)).map(
    lambda x: (x[0], x[1], x[2], x[2] + x[3]))


@settings(max_examples=200, deadline=None)
@given(st.lists(interval, max_size=25))
def test_sweep_matches_naive_twin(intervals):
    mask = [False, False, True, True]
    got = run_sweep(intervals, 3, 4, 0, mask)
    want = naive_sweep(intervals, 3, 4, 0, mask)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


@settings(max_examples=200, deadline=None)
@given(st.lists(interval, max_size=25))
def test_interval_algebra_properties(intervals):
    mask = [False, False, True, True]
    length_, overlap, busy, comm_any, comm_ov = run_sweep(intervals, 3, 4, 0, mask)
    for g in range(3):
        for c in range(4):
            raw = sum(e - s for sg, cc, s, e in intervals if sg == g and cc == c)
            assert length_[g, c] <= raw  # a union is never larger than the sum
            assert overlap[g, c] <= min(length_[g, c], length_[g, 0])  # overlap never exceeds either side
            exposed = length_[g, c] - overlap[g, c]
            assert exposed >= 0 and exposed + overlap[g, c] == length_[g, c]
        assert busy[g] <= length_[g].sum()
        assert comm_any[g] <= length_[g, 2] + length_[g, 3]
        assert comm_ov[g] <= min(comm_any[g], length_[g, 0])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 50), st.integers(0, 30)), max_size=15),
       st.lists(st.tuples(st.integers(0, 2), st.integers(0, 50), st.integers(1, 30)), max_size=15))
def test_encloses_matches_naive(ops, comms):
    ops = sorted((k, s, s + d) for k, s, d in ops)
    comms = sorted((k, s, s + d) for k, s, d in comms)
    arr = lambda xs, i: np.array([x[i] for x in xs], np.int64)  # noqa: E731
    got = _kernels.encloses(arr(ops, 0), arr(ops, 1), arr(ops, 2), arr(comms, 0), arr(comms, 1), arr(comms, 2))
    want = [any(ck == k and cs >= s and ce <= e for ck, cs, ce in comms) for k, s, e in ops]
    assert got.tolist() == want


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 4)), max_size=20))
def test_components_match_naive(edges):
    a = np.array([x for x, _ in edges], np.int64)
    b = np.array([y for _, y in edges], np.int64)
    got = _kernels.components(a, b, 7, 5)
    label = list(range(7))
    changed = True
    while changed:
        changed = False
        for x, y in edges:
            for x2, y2 in edges:
                if y2 == y and label[x2] != min(label[x], label[x2]):
                    label[x2] = label[x] = min(label[x], label[x2])
                    changed = True
    assert got.tolist() == label


def test_segment_median():
    values = np.array([3.0, 1.0, 2.0, 10.0, 20.0])
    starts = np.array([0, 3, 5])
    assert _kernels.segment_median(values, starts).tolist() == [2.0, 15.0]


def test_python_twins_of_the_kernels_agree():
    """The kernels' own Python bodies (numba's py_func) give the same answers: coverage sees them."""

    def py(f):
        return getattr(f, "py_func", f)

    intervals = [(0, 0, 0, 10), (0, 2, 5, 15), (1, 3, 2, 4), (1, 0, 0, 3), (0, 1, 12, 20)]
    mask = [False, False, True, True]
    seg, cat, s, e = (np.array(x, np.int64) for x in zip(*intervals, strict=True))
    t = np.concatenate([s, e])
    seg2 = np.concatenate([seg, seg])
    delta = np.concatenate([np.ones(5, np.int64), -np.ones(5, np.int64)])
    order = np.lexsort((t, seg2))
    args = (seg2[order], t[order], delta[order], np.concatenate([cat, cat])[order], 2, 4, 0, np.array(mask))
    for got, want in zip(py(_kernels.sweep)(*args), _kernels.sweep(*args), strict=True):
        np.testing.assert_array_equal(got, want)
    a, b = np.array([0, 1, 2], np.int64), np.array([0, 0, 1], np.int64)
    assert py(_kernels.components)(a, b, 3, 2).tolist() == _kernels.components(a, b, 3, 2).tolist()
    k, s0, e0 = np.array([0, 0]), np.array([0, 5]), np.array([10, 6])
    assert py(_kernels.encloses)(k, s0, e0, k[:1], s0[:1] + 1, e0[:1] - 1).tolist() == [True, False]
    vals = np.array([1.0, 3.0, 2.0])
    assert py(_kernels.segment_median)(vals, np.array([0, 3])).tolist() == [2.0]
    w = np.array([1.0, 2.0, 0.5])
    np.testing.assert_allclose(py(_kernels.centred_sums)(a, np.array([0, 2, 3]), w, vals, 3),
                               _kernels.centred_sums(a, np.array([0, 2, 3]), w, vals, 3))
    u, v, order = np.array([0, 1, 3], np.int64), np.array([1, 2, 1], np.int64), np.array([2, 0, 1])
    forest = [f(u, v, order, 5) for f in (py(_kernels.spanning_forest), _kernels.spanning_forest)]
    for got, want in zip(*forest, strict=True):
        assert got.tolist() == want.tolist()
    bfs, parent, _ = forest[1]
    c, diag = np.array([0.0, 2.0, 1.0, 3.0, 0.0]), np.array([2.0, 6.0, 1.0, 3.0, 0.5])
    rhs = np.array([0.0, 1.0, -2.0, 4.0, 1.0])
    np.testing.assert_allclose(py(_kernels.tree_solve)(bfs, parent, c, diag, rhs),
                               _kernels.tree_solve(bfs, parent, c, diag, rhs))


def test_centred_sums_by_hand():
    """Instance 0 = ranks {0, 1} with w 1, 3 and v 10, 2 (weighted mean 4); instance 1 = ranks
    {1, 2} with w 1, 1 and v 5, 7 (mean 6): rank 0 gets 1*(10-4), rank 1 3*(2-4) + 1*(5-6)."""
    r = np.array([0, 1, 1, 2])
    got = _kernels.centred_sums(r, np.array([0, 2, 4]), np.array([1.0, 3.0, 1.0, 1.0]),
                                np.array([10.0, 2.0, 5.0, 7.0]), 4)
    assert got.tolist() == [6.0, -7.0, 1.0, 0.0]


@st.composite
def _weighted_graphs(draw):
    n = draw(st.integers(1, 9))
    edges = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=20))
    edges = [(a, b) for a, b in edges if a != b]
    weights = draw(st.permutations(range(1, len(edges) + 1)))  # distinct: one maximum forest
    return n, edges, [float(x) for x in weights]


def _naive_max_forest(n, edges, weights):
    """Prim from each unreached node (lowest first), always taking the heaviest edge out of the tree."""
    reached, kept = set(), set()
    for root in range(n):
        if root in reached:
            continue
        reached.add(root)
        while True:
            out = [k for k, (a, b) in enumerate(edges) if (a in reached) != (b in reached)]
            if not out:
                break
            k = max(out, key=lambda k: weights[k])
            kept.add(k)
            reached.update(edges[k])
    return kept


@settings(max_examples=150, deadline=None)
@given(_weighted_graphs())
def test_spanning_forest_is_the_maximum_one_in_breadth_first_order(g):
    n, edges, weights = g
    u = np.array([a for a, _ in edges], np.int64)
    v = np.array([b for _, b in edges], np.int64)
    bfs, parent, via = _kernels.spanning_forest(u, v, np.argsort(-np.array(weights), kind="stable"), n)
    assert sorted(bfs.tolist()) == list(range(n))
    assert {int(k) for k in via if k >= 0} == _naive_max_forest(n, edges, weights)
    pos = {int(x): j for j, x in enumerate(bfs)}
    for x in range(n):
        if parent[x] >= 0:
            assert pos[int(parent[x])] < pos[x] and {int(x), int(parent[x])} == set(edges[via[x]])
        else:  # a root: node 0, or the lowest node of a tree without it
            assert x == 0 or x == min(y for y in range(n) if _root(y, parent) == x)


def _root(x, parent):
    while parent[x] >= 0:
        x = parent[x]
    return x


@settings(max_examples=150, deadline=None)
@given(_weighted_graphs(), st.lists(st.one_of(st.just(0.0), st.floats(0.1, 3)), min_size=9, max_size=9),
       st.lists(st.floats(-5, 5), min_size=9, max_size=9))
def test_tree_solve_equals_the_dense_solve(g, extra, rhs):
    """The forest's Laplacian plus a diagonal, node 0 grounded (and a tree without node 0 grounded
    at its root when nothing else pins it), solved densely."""
    n, edges, weights = g
    u = np.array([a for a, _ in edges], np.int64)
    v = np.array([b for _, b in edges], np.int64)
    bfs, parent, via = _kernels.spanning_forest(u, v, np.argsort(-np.array(weights), kind="stable"), n)
    c = np.array([weights[k] if k >= 0 else 0.0 for k in via])
    m = np.diag(np.array(extra[:n]))
    for x in range(n):
        if parent[x] >= 0:
            p = parent[x]
            m[x, x] += c[x]
            m[p, p] += c[x]
            m[x, p] -= c[x]
            m[p, x] -= c[x]
    b = np.array(rhs[:n])
    got = _kernels.tree_solve(bfs, parent, c, np.diag(m).copy(), b)
    keep = [x for x in range(n) if x != 0 and not (parent[x] < 0 and _floating(x, parent, extra))]
    want = np.zeros(n)
    if keep:
        want[keep] = np.linalg.solve(m[np.ix_(keep, keep)], b[keep])
    np.testing.assert_allclose(got, want, atol=1e-6 * (1 + np.abs(want).max()))


def _floating(root, parent, extra):
    """A tree with no positive extra diagonal anywhere: its Laplacian is singular."""
    return all(extra[y] == 0 for y in range(len(parent)) if _root(y, parent) == root)
