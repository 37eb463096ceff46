"""numba kernels for telemetry rates: ordering, scrape snapping, per-series windows, and the
per-port window grid. Kernels see numpy arrays and scalars only and read no module globals.

Flag codes (per series window): 0 none, 1 wrapped, 2 saturated, 3 reset, 4 wrap_ambiguous,
5 gap (the series has no sample at the window's start).
"""

from __future__ import annotations

import numpy as np

from tracekit._jit import njit


@njit
def counting_order(keys, n_keys, base):
    """A stable reordering of `base` (an index array) by `keys[base]` (ints in [0, n_keys))."""
    counts = np.zeros(n_keys + 1, np.int64)
    for i in base:
        counts[keys[i] + 1] += 1
    for k in range(n_keys):
        counts[k + 1] += counts[k]
    out = np.empty(len(base), np.int64)
    for i in base:
        k = keys[i]
        out[counts[k]] = i
        counts[k] += 1
    return out


@njit
def min_step(order, sid, ts, n_series):
    """Per series, its smallest positive step between consecutive samples (NaN if none);
    `order` sorts the samples by (series, time). It sets the snapping tolerance, where too small
    is the safe side (fewer samples merged into one scrape)."""
    out = np.full(n_series, np.nan)
    for k in range(1, len(order)):
        i, j = order[k - 1], order[k]
        s = sid[j]
        if sid[i] == s:
            d = ts[j] - ts[i]
            if d > 0 and not (out[s] <= d):
                out[s] = d
    return out


@njit
def snap(order, pid, ts, tol):
    """Scrapes per port: `order` sorts samples by (port, time); a sample within `tol[port]` of the
    previous distinct time joins its scrape. Returns, per sample, its scrape time and grid row,
    and the grid (port, scrape time, previous scrape time or -1 for a port's first)."""
    n = len(order)
    scrape = np.zeros(len(pid), np.int64)
    row = np.full(len(pid), -1, np.int64)
    g_pid = np.empty(n, np.int64)
    g_t = np.empty(n, np.int64)
    g_prev = np.empty(n, np.int64)
    g = -1
    last_pid = -1
    last_t = 0
    for k in range(n):
        i = order[k]
        p = pid[i]
        t = ts[i]
        if p != last_pid:
            g += 1
            g_pid[g] = p
            g_t[g] = t
            g_prev[g] = -1
            last_pid = p
        elif t != last_t and t - last_t > tol[p]:
            g += 1
            g_pid[g] = p
            g_t[g] = t
            g_prev[g] = g_t[g - 1]
        last_t = t
        scrape[i] = g_t[g]
        row[i] = g
    return scrape, row, g_pid[:g + 1], g_t[:g + 1], g_prev[:g + 1]


@njit
def series_windows(order, sid, scrape, value, bits, saturable, saturated, is_rate, wrap_s):
    """Per sample (in the order given: by series, then scrape), the window ending at it.

    Returns count (NaN when none or voided), flag code, the series' previous scrape time (-1 for
    a series' first sample), and a duplicate mark (same series and scrape as the sample before;
    the first one is kept). `wrap_s[i]` is the time a 32-bit counter of sample i needs to wrap at
    its port's line rate (NaN when the speed is unknown)."""
    n = len(order)
    size = len(sid)
    count = np.full(size, np.nan)
    flag = np.zeros(size, np.int8)
    prev_scrape = np.full(size, -1, np.int64)
    dup = np.zeros(size, np.bool_)
    last = -1
    for k in range(n):
        i = order[k]
        if last >= 0 and sid[last] == sid[i]:
            if scrape[last] == scrape[i]:
                dup[i] = True
                continue
            prev_scrape[i] = scrape[last]
            dt = (scrape[i] - scrape[last]) / 1e9
            if is_rate[i]:
                count[i] = value[i] * dt
            else:
                delta = value[i] - value[last]
                wraps = bits[i] == 32 and not saturable[i]
                if saturated[i]:
                    flag[i] = 2
                elif wraps and (np.isnan(wrap_s[i]) or dt >= wrap_s[i]):
                    flag[i] = 4
                elif delta < 0 and wraps:
                    flag[i] = 1
                    count[i] = delta + 4294967296.0
                elif delta < 0:
                    flag[i] = 3
                else:
                    count[i] = delta
        last = i
    return count, flag, prev_scrape, dup


@njit
def grid_values(base, row, column, count, flag, prev_scrape, g_prev, n_rows, n_columns):
    """Sum the series windows into the port grid: per (row, column) the total count, whether any
    series gave one, and a bit mask of flag codes (bit f-1 for flag f), over the samples `base`
    (`column` -1 = no output column). A series window whose
    previous scrape is not the grid row's previous scrape is a `gap` (flag 5) and gives no count."""
    total = np.zeros((n_rows, n_columns))
    present = np.zeros((n_rows, n_columns), np.bool_)
    mask = np.zeros((n_rows, n_columns), np.uint8)
    for i in base:
        c = column[i]
        if c < 0 or prev_scrape[i] < 0:
            continue
        r = row[i]
        f = flag[i]
        if prev_scrape[i] != g_prev[r]:
            f = 5
        if f:
            mask[r, c] |= np.uint8(1 << (f - 1))
        if (f == 0 or f == 1) and count[i] == count[i]:
            total[r, c] += count[i]
            present[r, c] = True
    return total, present, mask


@njit
def speed_asof(g_pid, g_t, s_order, s_pid, s_ts, s_value):
    """Per grid row, the port's latest reported speed at or before the row's time (else the
    port's first report; NaN for a port with none). `s_order` sorts the speed samples by
    (port, time); the grid is sorted by (port, time)."""
    out = np.full(len(g_pid), np.nan)
    n = len(s_order)
    k = 0
    j = 0
    best = np.nan
    first = np.nan
    for r in range(len(g_pid)):
        p = g_pid[r]
        if r == 0 or p != g_pid[r - 1]:
            while k < n and s_pid[s_order[k]] < p:
                k += 1
            j = k
            best = np.nan
            first = s_value[s_order[k]] if k < n and s_pid[s_order[k]] == p else np.nan
        while j < n and s_pid[s_order[j]] == p and s_ts[s_order[j]] <= g_t[r]:
            best = s_value[s_order[j]]
            j += 1
        out[r] = best if best == best else first
    return out


@njit
def dense_ids(k0, k1, k2, k3, w1, w2, w3, rows, span):
    """Dense ids of the key tuples (k0, k1, k2, k3)[rows] (each ki in [-1, width-1)), numbered by
    first appearance; -1 for rows not listed. The tuple's mixed-radix number must be < span.
    Returns the ids, their count, and each id's first row."""
    lut = np.full(span, -1, np.int64)
    ids = np.full(len(k0), -1, np.int64)
    first = np.empty(len(rows), np.int64)
    n = 0
    for r in rows:
        key = ((np.int64(k0[r] + 1) * w1 + (k1[r] + 1)) * w2 + (k2[r] + 1)) * w3 + (k3[r] + 1)
        v = lut[key]
        if v < 0:
            v = n
            lut[key] = n
            first[n] = r
            n += 1
        ids[r] = v
    return ids, n, first[:n]
