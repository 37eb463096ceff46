"""The flow simulator as it was before the scale work (tracekit/replay/_kernels.py at commit
5c2e060), kept here, outside the package, as the speed baseline of bench_replay.py: the same
max-min fair model, measured in the same run as the current kernel."""

from __future__ import annotations

import numba
import numpy as np

njit = numba.njit(cache=True, nogil=True)
njit_inline = numba.njit(cache=True, nogil=True, inline="always")


# --------------------------------------------------------------------------------------------
# Binary min-heaps on parallel arrays; callers keep the size.


@njit_inline
def _heap_pop(hk, hi, ht, size):
    """Remove the top; the caller reads it before calling. Returns the new size."""
    size -= 1
    if size == 0:
        return 0
    _heap_sift_down(hk, hi, ht, size, 0, hk[size], hi[size], ht[size])
    return size


@njit_inline
def _heap_sift_down(hk, hi, ht, size, i, key, item, tag):
    """Put (key, item, tag) at slot i, whose subtrees are heaps, and sift it down (i = 0:
    replace the top)."""
    while True:
        c = 2 * i + 1
        if c >= size:
            break
        if c + 1 < size and hk[c + 1] < hk[c]:
            c += 1
        if hk[c] >= key:
            break
        hk[i] = hk[c]
        hi[i] = hi[c]
        ht[i] = ht[c]
        i = c
    hk[i] = key
    hi[i] = item
    ht[i] = tag


@njit_inline
def _iheap_sift(hk, hi, hpos, size, i):
    key = hk[i]
    item = hi[i]
    while i > 0:
        parent = (i - 1) >> 1
        if hk[parent] <= key:
            break
        hk[i] = hk[parent]
        hi[i] = hi[parent]
        hpos[hi[i]] = i
        i = parent
    while True:
        c = 2 * i + 1
        if c >= size:
            break
        if c + 1 < size and hk[c + 1] < hk[c]:
            c += 1
        if hk[c] >= key:
            break
        hk[i] = hk[c]
        hi[i] = hi[c]
        hpos[hi[i]] = i
        i = c
    hk[i] = key
    hi[i] = item
    hpos[item] = i


@njit_inline
def _iheap_set(hk, hi, hpos, size, item, key):
    """Insert `item` or change its key in an indexed min-heap; returns the new size."""
    i = hpos[item]
    if i < 0:
        i = size
        size += 1
        hi[i] = item
    hk[i] = key
    _iheap_sift(hk, hi, hpos, size, i)
    return size


@njit_inline
def _iheap_pop(hk, hi, hpos, size):
    """Remove the top of an indexed min-heap; returns the new size."""
    hpos[hi[0]] = -1
    size -= 1
    if size > 0:
        hk[0] = hk[size]
        hi[0] = hi[size]
        hpos[hi[0]] = 0
        _iheap_sift(hk, hi, hpos, size, 0)
    return size


# --------------------------------------------------------------------------------------------
# Max-min fair fluid simulation.


@njit_inline
def _account(f, t0, t1, rate, indptr, res, win, window_ns, t_origin):
    """Spread the bytes a flow sent at `rate` over [t0, t1] onto the windows of its resources
    (`win` is window-major: one row per window, so an event's writes stay in a few rows)."""
    n_win = win.shape[0]
    if n_win == 0 or t1 <= t0 or rate <= 0.0:
        return
    w0 = int((t0 - t_origin) // window_ns)
    w1 = int((t1 - t_origin) // window_ns)
    for w in range(max(w0, 0), min(w1, n_win - 1) + 1):
        a = max(t0, t_origin + w * window_ns)
        b = min(t1, t_origin + (w + 1) * window_ns)
        if b > a:
            amount = rate * (b - a)
            for k in range(indptr[f], indptr[f + 1]):
                win[w, res[k]] += amount


@njit
def _waterfill(s_list, s_n, indptr, res, cap, load, rate, lmap, lmark, stamp, new_rate, froze_at,
               links, cnt, fill, members, resid, nun, used, ver, hk, hi, ht, frozen, sptr, sloc):
    """Max-min rates of the flows in S given every other flow's current rate (progressive filling
    from the residual capacities). Writes new_rate[i] for S member i and froze_at[i], the resource
    that froze it. The remaining arguments are scratch arrays (sized for all resources, incidences
    and flows); sptr/sloc hold S's paths in local link ids."""
    n_loc = 0
    p = 0
    sptr[0] = 0
    for i in range(s_n):
        f = s_list[i]
        frozen[i] = False
        for k in range(indptr[f], indptr[f + 1]):
            r = res[k]
            if lmark[r] != stamp:
                lmark[r] = stamp
                lmap[r] = n_loc
                links[n_loc] = r
                cnt[n_loc + 1] = 0
                n_loc += 1
            loc = lmap[r]
            cnt[loc + 1] += 1
            sloc[p] = loc
            p += 1
        sptr[i + 1] = p
    cnt[0] = 0
    for j in range(n_loc):
        cnt[j + 1] += cnt[j]
        fill[j] = cnt[j]
        resid[j] = cap[links[j]] - load[links[j]]
        used[j] = 0.0
        ver[j] = 0
        nun[j] = cnt[j + 1] - cnt[j]
    for i in range(s_n):
        rf = rate[s_list[i]]
        for k in range(sptr[i], sptr[i + 1]):
            loc = sloc[k]
            members[fill[loc]] = i
            fill[loc] += 1
            resid[loc] += rf
    # A link's share only grows as flows freeze (each froze at a level <= its share), so a stale
    # heap key is a lower bound: on reaching the top it is refreshed and sifted down in place.
    for j in range(n_loc):
        hk[j] = max(resid[j], 0.0) / nun[j]
        hi[j] = j
        ht[j] = 0
    hn = n_loc
    for j in range(n_loc // 2 - 1, -1, -1):
        _heap_sift_down(hk, hi, ht, hn, j, hk[j], hi[j], ht[j])
    level = 0.0
    left = s_n
    while hn > 0 and left > 0:
        j = hi[0]
        if nun[j] == 0:
            hn = _heap_pop(hk, hi, ht, hn)
            continue
        if ht[0] != ver[j]:
            y = max(resid[j] - used[j], 0.0) / nun[j]
            _heap_sift_down(hk, hi, ht, hn, 0, y, j, ver[j])
            continue
        x = hk[0]
        hn = _heap_pop(hk, hi, ht, hn)
        if x > level:
            level = x
        for m in range(cnt[j], cnt[j + 1]):
            i = members[m]
            if frozen[i]:
                continue
            frozen[i] = True
            left -= 1
            new_rate[i] = level
            froze_at[i] = links[j]
            for k in range(sptr[i], sptr[i + 1]):
                loc = sloc[k]
                nun[loc] -= 1
                used[loc] += level
                ver[loc] += 1


@njit_inline
def _bottleneck(h, indptr, res, cap, load, rate, poolf, lstart, lcnt, maxr, maxr_ok, rel_eps,
                rchg, skip, hint):
    """A saturated resource of flow h on which no flow is faster, or -1. Resources with
    rchg == skip (this event's changed ones, when skip >= 0) are not considered. `hint` (a
    resource on h's path, or -1) is tried first."""
    tol = 1e3 * rel_eps
    n = indptr[h + 1] - indptr[h]
    first = 0 if hint < 0 else -1
    for a in range(first, n):
        r = hint if a < 0 else res[indptr[h] + a]
        if (a >= 0 and r == hint) or rchg[r] == skip or load[r] < cap[r] * (1.0 - tol):
            continue
        if not maxr_ok[r]:
            maxr_ok[r] = True
            m = 0.0
            for q in range(lstart[r], lstart[r] + lcnt[r]):
                m = max(m, rate[poolf[q]])
            maxr[r] = m
        if rate[h] >= maxr[r] * (1.0 - tol):
            return r
    return -1


@njit_inline
def _set_bott(f, r, bott, bpool, lstart, bcnt, bpos):
    """Move flow f to the bottleneck list of resource r (-1: none)."""
    old = bott[f]
    if old == r:
        return
    if old >= 0:
        i = bpos[f]
        last = bpool[lstart[old] + bcnt[old] - 1]
        bpool[lstart[old] + i] = last
        bpos[last] = i
        bcnt[old] -= 1
    if r >= 0:
        bpool[lstart[r] + bcnt[r]] = f
        bpos[f] = bcnt[r]
        bcnt[r] += 1
    bott[f] = r


@njit_inline
def _list_add(pool, poolf, lstart, lcnt, ipos, r, k, f):
    pool[lstart[r] + lcnt[r]] = k
    poolf[lstart[r] + lcnt[r]] = f
    ipos[k] = lcnt[r]
    lcnt[r] += 1


@njit_inline
def _list_remove(pool, poolf, lstart, lcnt, ipos, r, k):
    i = ipos[k]
    j = lstart[r] + lcnt[r] - 1
    last = pool[j]
    pool[lstart[r] + i] = last
    poolf[lstart[r] + i] = poolf[j]
    ipos[last] = i
    lcnt[r] -= 1


@njit
def simulate_flows(indptr, res, nbytes, release, lat_mult, cap, res_lat, n_windows, window_ns,
                   t_origin, rel_eps, merge):
    """Event-driven fluid simulation with max-min fair sharing, exact at every arrival and finish.

    Flows: CSR paths (indptr, res), bytes, release time (ns) and a latency multiplier (the flow's
    latency is lat_mult * sum of its resources' latencies, added at the end). Resources: capacity
    in bytes/ns and latency in ns. Returns (finish time per flow, bytes per resource per window).
    `merge` > 0 lets a flow finish early, together with the current event, when its finish is
    within `merge` x its age (0: exact).

    At each event (all arrivals and finishes at one time) only the affected flows are re-solved:
    S starts as the flows on the touched resources, is water-filled on the residual capacities,
    and grows until every flow next to a changed resource has a bottleneck (a saturated resource
    on which its rate is the largest), which is the max-min fairness condition.
    """
    # Flows are renumbered by release time so that the flows active together (and their path
    # incidences) sit next to each other in memory; the simulation itself is order-independent.
    n_flows = nbytes.size
    order = np.argsort(release, kind="mergesort")
    indptr2 = np.zeros(n_flows + 1, np.int64)
    for a in range(n_flows):
        f = order[a]
        indptr2[a + 1] = indptr2[a] + indptr[f + 1] - indptr[f]
    res2 = np.empty(indptr2[n_flows], np.int64)
    for a in range(n_flows):
        f = order[a]
        res2[indptr2[a]:indptr2[a + 1]] = res[indptr[f]:indptr[f + 1]]
    finish2, win = _simulate_sorted(indptr2, res2, nbytes[order], release[order], lat_mult[order],
                                    cap, res_lat, n_windows, window_ns, t_origin, rel_eps, merge)
    finish = np.empty(n_flows, np.float64)
    finish[order] = finish2
    return finish, win


@njit
def _simulate_sorted(indptr, res, nbytes, release, lat_mult, cap, res_lat, n_windows, window_ns,
                     t_origin, rel_eps, merge):
    """`simulate_flows` on flows numbered in release order."""
    n_flows = nbytes.size
    n_res = cap.size
    finish = np.full(n_flows, np.nan)
    win = np.zeros((n_windows, n_res), np.float64)
    if n_flows == 0:
        return finish, np.zeros((n_res, n_windows), np.float64)
    static = np.zeros(n_res, np.int64)
    latency = np.zeros(n_flows, np.float64)
    for f in range(n_flows):
        lat = 0.0
        for k in range(indptr[f], indptr[f + 1]):
            static[res[k]] += 1
            lat += res_lat[res[k]]
        latency[f] = lat * lat_mult[f]
    lstart = np.zeros(n_res, np.int64)
    for r in range(1, n_res):
        lstart[r] = lstart[r - 1] + static[r - 1]
    pool = np.empty(res.size, np.int64)
    poolf = np.empty(res.size, np.int64)
    lcnt = np.zeros(n_res, np.int64)
    ipos = np.empty(res.size, np.int64)
    load = np.zeros(n_res, np.float64)
    rate = np.zeros(n_flows, np.float64)
    rem = nbytes.astype(np.float64).copy()
    tlast = np.zeros(n_flows, np.float64)
    active = np.zeros(n_flows, np.bool_)
    bott = np.full(n_flows, -1, np.int64)
    bpool = np.empty(res.size, np.int64)
    bcnt = np.zeros(n_res, np.int64)
    bpos = np.zeros(n_flows, np.int64)
    cand = np.empty(n_flows, np.int64)
    thr = np.zeros(n_res, np.float64)
    marked = np.empty(n_res, np.int64)
    w_links = np.empty(n_res, np.int64)
    w_cnt = np.zeros(n_res + 1, np.int64)
    w_fill = np.empty(n_res, np.int64)
    w_members = np.empty(res.size, np.int64)
    w_resid = np.empty(n_res, np.float64)
    w_nun = np.empty(n_res, np.int64)
    w_used = np.empty(n_res, np.float64)
    w_ver = np.empty(n_res, np.int64)
    w_hk = np.empty(n_res + res.size + 1, np.float64)
    w_hi = np.empty(n_res + res.size + 1, np.int64)
    w_ht = np.empty(n_res + res.size + 1, np.int64)
    w_frozen = np.empty(n_flows, np.bool_)
    w_sptr = np.empty(n_flows + 1, np.int64)
    w_sloc = np.empty(res.size, np.int64)
    froze_at = np.empty(n_flows, np.int64)
    in_s = np.full(n_flows, -1, np.int64)
    orig = np.zeros(n_flows, np.float64)
    checked = np.full(n_flows, -1, np.int64)
    rchg = np.full(n_res, -1, np.int64)
    maxr_ok = np.zeros(n_res, np.bool_)
    maxr = np.zeros(n_res, np.float64)
    lmap = np.zeros(n_res, np.int64)
    lmark = np.full(n_res, -1, np.int64)
    s_list = np.empty(n_flows, np.int64)
    new_rate = np.empty(n_flows, np.float64)
    chg_links = np.empty(n_res, np.int64)
    bad = np.empty(n_flows, np.int64)
    order = np.argsort(release, kind="mergesort")
    hk = np.empty(n_flows, np.float64)
    hi = np.empty(n_flows, np.int64)
    hpos = np.full(n_flows, -1, np.int64)
    hn = 0
    nxt = 0
    event = 0
    wstamp = 0
    while True:
        t_rel = release[order[nxt]] if nxt < n_flows else np.inf
        t_fin = hk[0] if hn > 0 else np.inf
        if t_rel == np.inf and t_fin == np.inf:
            break
        now = min(t_rel, t_fin)
        tol = rel_eps * abs(now) + 1e-6
        event += 1
        s_n = 0
        n_chg = 0
        while hn > 0 and hk[0] <= now + tol + merge * (hk[0] - release[hi[0]]):
            f = hi[0]
            t_proj = hk[0]
            tf = t_proj if t_proj <= now + tol else now
            hn = _iheap_pop(hk, hi, hpos, hn)
            _account(f, tlast[f], t_proj, rate[f], indptr, res, win, window_ns, t_origin)
            rem[f] = 0.0
            finish[f] = tf + latency[f]
            active[f] = False
            _set_bott(f, -1, bott, bpool, lstart, bcnt, bpos)
            for k in range(indptr[f], indptr[f + 1]):
                r = res[k]
                _list_remove(pool, poolf, lstart, lcnt, ipos, r, k)
                load[r] -= rate[f]
                if rate[f] >= maxr[r]:
                    maxr_ok[r] = False
                if lcnt[r] == 0:
                    load[r] = 0.0
                if rchg[r] != event:
                    rchg[r] = event
                    chg_links[n_chg] = r
                    n_chg += 1
            rate[f] = 0.0
        arrivals = False
        while nxt < n_flows and release[order[nxt]] <= now + tol:
            f = order[nxt]
            nxt += 1
            if rem[f] <= 0.0 or indptr[f + 1] == indptr[f]:
                finish[f] = release[f] + latency[f] + (0.0 if rem[f] <= 0.0 else np.inf)
                continue
            active[f] = True
            arrivals = True
            tlast[f] = now
            rate[f] = 0.0
            for k in range(indptr[f], indptr[f + 1]):
                r = res[k]
                _list_add(pool, poolf, lstart, lcnt, ipos, r, k, f)
                if rchg[r] != event:
                    rchg[r] = event
                    chg_links[n_chg] = r
                    n_chg += 1
        # S0: the flows on a touched resource that arrived now or were bottlenecked there
        for c in range(n_chg):
            r = chg_links[c]
            if arrivals:
                for q in range(lstart[r], lstart[r] + lcnt[r]):
                    g = poolf[q]
                    if in_s[g] != event:
                        in_s[g] = event
                        orig[g] = rate[g]
                        s_list[s_n] = g
                        s_n += 1
            else:
                for q in range(lstart[r], lstart[r] + bcnt[r]):
                    g = bpool[q]
                    if in_s[g] != event:
                        in_s[g] = event
                        orig[g] = rate[g]
                        s_list[s_n] = g
                        s_n += 1
        if not arrivals:
            # a flow pinned by another valid bottleneck on an unchanged resource stays out of S
            kept = 0
            for i in range(s_n):
                g = s_list[i]
                b = _bottleneck(g, indptr, res, cap, load, rate, poolf, lstart, lcnt, maxr,
                                maxr_ok, rel_eps, rchg, event, -1)
                if b >= 0:
                    _set_bott(g, b, bott, bpool, lstart, bcnt, bpos)
                    in_s[g] = -1
                else:
                    s_list[kept] = g
                    kept += 1
            s_n = kept
        while s_n > 0:
            wstamp += 1
            _waterfill(s_list, s_n, indptr, res, cap, load, rate, lmap, lmark, wstamp, new_rate,
                       froze_at, w_links, w_cnt, w_fill, w_members, w_resid, w_nun, w_used, w_ver,
                       w_hk, w_hi, w_ht, w_frozen, w_sptr, w_sloc)
            for i in range(s_n):
                g = s_list[i]
                d = new_rate[i] - rate[g]
                if d != 0.0:
                    big = abs(d) > rel_eps * max(rate[g], new_rate[i])
                    for k in range(indptr[g], indptr[g + 1]):
                        r = res[k]
                        load[r] += d
                        if d > 0.0:
                            if new_rate[i] > maxr[r]:
                                maxr[r] = new_rate[i]
                        elif rate[g] >= maxr[r]:
                            maxr_ok[r] = False
                        if big and rchg[r] != event:
                            rchg[r] = event
                            chg_links[n_chg] = r
                            n_chg += 1
                    rate[g] = new_rate[i]
            # verify: every flow in S or on a changed resource needs a bottleneck
            wstamp += 1
            n_bad = 0
            for i in range(s_n):
                h = s_list[i]
                checked[h] = wstamp
                b = _bottleneck(h, indptr, res, cap, load, rate, poolf, lstart, lcnt, maxr,
                                maxr_ok, rel_eps, rchg, -2, froze_at[i])
                _set_bott(h, b, bott, bpool, lstart, bcnt, bpos)
                if b < 0:
                    bad[n_bad] = h
                    n_bad += 1
            n_cand = 0
            for c in range(n_chg):
                r = chg_links[c]
                for q in range(lstart[r], lstart[r] + bcnt[r]):
                    h = bpool[q]
                    if checked[h] != wstamp:
                        checked[h] = wstamp
                        cand[n_cand] = h
                        n_cand += 1
            for i in range(n_cand):
                h = cand[i]
                b = _bottleneck(h, indptr, res, cap, load, rate, poolf, lstart, lcnt, maxr,
                                maxr_ok, rel_eps, rchg, -2, bott[h])
                _set_bott(h, b, bott, bpool, lstart, bcnt, bpos)
                if b < 0:
                    bad[n_bad] = h
                    n_bad += 1
            if n_bad == 0:
                break
            grew = False
            wstamp += 1
            n_mark = 0
            for i in range(n_bad):
                h = bad[i]
                if in_s[h] != event:
                    in_s[h] = event
                    orig[h] = rate[h]
                    s_list[s_n] = h
                    s_n += 1
                    grew = True
                for kk in range(indptr[h], indptr[h + 1]):
                    rr = res[kk]
                    if load[rr] < cap[rr] * (1.0 - 1e3 * rel_eps):
                        continue
                    if lmark[rr] != wstamp:
                        lmark[rr] = wstamp
                        thr[rr] = rate[h]
                        marked[n_mark] = rr
                        n_mark += 1
                    elif rate[h] < thr[rr]:
                        thr[rr] = rate[h]
            for i in range(n_mark):
                rr = marked[i]
                limit = thr[rr] * (1.0 - 1e3 * rel_eps)
                for qq in range(lstart[rr], lstart[rr] + lcnt[rr]):
                    g = poolf[qq]
                    if in_s[g] != event and rate[g] >= limit:
                        in_s[g] = event
                        orig[g] = rate[g]
                        s_list[s_n] = g
                        s_n += 1
                        grew = True
            if not grew:
                break
        for i in range(s_n):
            g = s_list[i]
            if rate[g] == orig[g]:
                continue
            if orig[g] > 0.0:
                _account(g, tlast[g], now, orig[g], indptr, res, win, window_ns, t_origin)
                rem[g] -= orig[g] * (now - tlast[g])
                if rem[g] < 0.0:
                    rem[g] = 0.0
            tlast[g] = now
            r_g = rate[g] if rate[g] > 0.0 else 1e-300
            hn = _iheap_set(hk, hi, hpos, hn, g, now + rem[g] / r_g)
    out = np.empty((n_res, n_windows), np.float64)
    for w in range(n_windows):
        for r in range(n_res):
            out[r, w] = win[w, r]
    return finish, out
