"""numba kernels for the analyses: numpy arrays in, numpy arrays out, no module globals."""

from __future__ import annotations

import numpy as np

from tracekit._jit import njit as jit


@jit
def sweep(seg, t, delta, cat, n_seg, n_cat, compute_cat, comm_mask):  # pragma: no cover - jitted
    """Interval algebra by a sweep line over +1/-1 boundary events.

    Inputs are sorted by (seg, t). Returns, per segment: the union length of each category
    (`length[seg, cat]`), its intersection with the compute category (`overlap[seg, cat]`), the
    union of all categories (`busy`), the union of the comm categories (`comm_any`) and that
    union's intersection with compute (`comm_any_overlap`).
    """
    length = np.zeros((n_seg, n_cat), np.int64)
    overlap = np.zeros((n_seg, n_cat), np.int64)
    busy = np.zeros(n_seg, np.int64)
    comm_any = np.zeros(n_seg, np.int64)
    comm_any_overlap = np.zeros(n_seg, np.int64)
    active = np.zeros(n_cat, np.int64)
    n = t.shape[0]
    i = 0
    while i < n:
        s = seg[i]
        active[:] = 0
        j = i
        while j < n and seg[j] == s:
            if j > i:
                dt = t[j] - t[j - 1]
                if dt > 0:
                    any_on = False
                    comm_on = False
                    comp_on = active[compute_cat] > 0
                    for c in range(n_cat):
                        if active[c] > 0:
                            any_on = True
                            length[s, c] += dt
                            if comp_on:
                                overlap[s, c] += dt
                            if comm_mask[c]:
                                comm_on = True
                    if any_on:
                        busy[s] += dt
                    if comm_on:
                        comm_any[s] += dt
                        if comp_on:
                            comm_any_overlap[s] += dt
            active[cat[j]] += delta[j]
            j += 1
        i = j
    return length, overlap, busy, comm_any, comm_any_overlap


@jit
def components(a, b, n_a, n_b):  # pragma: no cover - jitted
    """Connected components of a bipartite graph given as edges (a[k], b[k]); labels for side a.

    The label of a node is the smallest side-a index in its component; isolated a-nodes keep
    their own index.
    """
    parent = np.arange(n_a + n_b)
    for k in range(a.shape[0]):
        x = a[k]
        y = n_a + b[k]
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        while parent[y] != y:
            parent[y] = parent[parent[y]]
            y = parent[y]
        if x != y:
            if x < y:
                parent[y] = x
            else:
                parent[x] = y
    out = np.empty(n_a, np.int64)
    for i in range(n_a):
        x = i
        while parent[x] != x:
            x = parent[x]
        out[i] = x
    return out


@jit
def segment_median(values, starts):  # pragma: no cover - jitted
    """Median of each segment values[starts[k]:starts[k + 1]] (values grouped by segment; NaN if empty)."""
    n = starts.shape[0] - 1
    out = np.empty(n, np.float64)
    for k in range(n):
        if starts[k + 1] > starts[k]:
            out[k] = np.median(values[starts[k]:starts[k + 1]])
        else:
            out[k] = np.nan
    return out


@jit
def encloses(op_key, op_start, op_end, c_key, c_start, c_end):  # pragma: no cover - jitted
    """For each op interval, whether some c interval with the same key lies inside it.

    Ops and c intervals are each sorted by (key, start).
    """
    n_c = c_start.shape[0]
    suffix_min_end = np.empty(n_c, np.int64)
    for k in range(n_c - 1, -1, -1):
        if k == n_c - 1 or c_key[k + 1] != c_key[k]:
            suffix_min_end[k] = c_end[k]
        else:
            suffix_min_end[k] = min(c_end[k], suffix_min_end[k + 1])
    out = np.zeros(op_start.shape[0], np.bool_)
    j = 0
    for i in range(op_start.shape[0]):
        while j < n_c and (c_key[j] < op_key[i] or (c_key[j] == op_key[i] and c_start[j] < op_start[i])):
            j += 1
        if j < n_c and c_key[j] == op_key[i] and suffix_min_end[j] <= op_end[i]:
            out[i] = True
    return out


@jit
def centred_sums(r, starts, w, v, n_r):  # pragma: no cover - jitted
    """Per rank, sum of w[a] * (v[a] - weighted mean of v over a's instance), pairs grouped by
    instance (`starts`). With v = x[r] this is the rank Laplacian of the rank-instance graph (the
    instances eliminated) times x; with v = end times, minus the alignment's right-hand side."""
    out = np.zeros(n_r)
    for k in range(starts.shape[0] - 1):
        s0 = starts[k]
        s1 = starts[k + 1]
        tot = 0.0
        acc = 0.0
        for a in range(s0, s1):
            tot += w[a]
            acc += w[a] * v[a]
        if tot <= 0.0:
            continue
        mean = acc / tot
        for a in range(s0, s1):
            out[r[a]] += w[a] * (v[a] - mean)
    return out


@jit
def spanning_forest(u, v, order, n):  # pragma: no cover - jitted
    """A spanning forest of the graph with edges (u[k], v[k]) over nodes 0..n-1, taking edges in
    `order` (Kruskal: heaviest first gives a maximum-weight forest), rooted at node 0 and then at
    the lowest node of each other tree. Returns the nodes in breadth-first order (parents before
    children), each node's parent (-1 for a root) and the edge to it (-1 for a root)."""
    uf = np.arange(n)
    kept = np.zeros(u.shape[0], np.bool_)
    deg = np.zeros(n + 1, np.int64)
    for k in order:
        x = u[k]
        while uf[x] != x:
            uf[x] = uf[uf[x]]
            x = uf[x]
        y = v[k]
        while uf[y] != y:
            uf[y] = uf[uf[y]]
            y = uf[y]
        if x != y:
            uf[max(x, y)] = min(x, y)
            kept[k] = True
            deg[u[k] + 1] += 1
            deg[v[k] + 1] += 1
    start = np.cumsum(deg)
    fill = start[:-1].copy()
    adj = np.empty(start[-1], np.int64)
    for k in range(u.shape[0]):
        if kept[k]:
            adj[fill[u[k]]] = k
            fill[u[k]] += 1
            adj[fill[v[k]]] = k
            fill[v[k]] += 1
    bfs = np.empty(n, np.int64)
    parent = np.full(n, -1, np.int64)
    via = np.full(n, -1, np.int64)
    seen = np.zeros(n, np.bool_)
    head = tail = 0
    for root in range(n):
        if seen[root]:
            continue
        seen[root] = True
        bfs[tail] = root
        tail += 1
        while head < tail:
            x = bfs[head]
            head += 1
            for a in range(start[x], start[x + 1]):
                k = adj[a]
                y = v[k] if u[k] == x else u[k]
                if not seen[y]:
                    seen[y] = True
                    parent[y] = x
                    via[y] = k
                    bfs[tail] = y
                    tail += 1
    return bfs, parent, via


@jit
def tree_solve(bfs, parent, c, diag, rhs):  # pragma: no cover - jitted
    """Solve M y = rhs, M = the Laplacian of a weighted forest plus diag(extra), in linear time by
    eliminating leaves towards the roots and substituting back (no fill on a tree). `c[x]` is the
    weight of the edge from x to `parent[x]`; `diag` is M's diagonal. Node 0 is grounded (y = 0),
    and so is any other root left without a positive pivot (a tree holding no grounded node)."""
    d = diag.copy()
    b = rhs.copy()
    for j in range(bfs.shape[0] - 1, -1, -1):
        x = bfs[j]
        p = parent[x]
        if p >= 0:
            f = c[x] / d[x]
            d[p] -= c[x] * f
            b[p] += f * b[x]
    y = np.zeros(bfs.shape[0])
    for j in range(bfs.shape[0]):
        x = bfs[j]
        p = parent[x]
        if p >= 0:
            y[x] = (b[x] + c[x] * y[p]) / d[x]
        elif x != 0 and d[x] > 1e-9 * diag[x]:
            y[x] = b[x] / d[x]
    return y
