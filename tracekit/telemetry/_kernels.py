"""numba kernels for telemetry rates: ordering, scrape snapping, per-series windows, and the
per-port window grid. Kernels see numpy arrays and scalars only and read no module globals.

Flag codes (per series window): 0 none, 1 wrapped, 2 saturated, 3 reset, 4 wrap_ambiguous,
5 gap (the series has no sample at the window's start).
"""

from __future__ import annotations

import math

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
def is_sorted(values, rows):
    """True when values[rows] never decreases."""
    for k in range(1, len(rows)):  # noqa: SIM110 - numba compiles the loop, not a generator
        if values[rows[k]] < values[rows[k - 1]]:
            return False
    return True


@njit
def snap(order, pid, ts, tol):
    """Scrapes per port: `order` sorts samples by (port, time); a sample within `tol[port]` of the
    previous distinct time joins its scrape. Returns, per sample, its grid row (-1 for samples
    not in `order`), and the grid (port, scrape time, previous scrape time or -1 for a port's
    first); a sample's scrape time is the time of its row."""
    n = len(order)
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
        row[i] = g
    if 2 * (g + 1) >= n:  # most of the grid is used: no copy (it would hold both at once)
        return row, g_pid[:g + 1], g_t[:g + 1], g_prev[:g + 1]
    return row, g_pid[:g + 1].copy(), g_t[:g + 1].copy(), g_prev[:g + 1].copy()


@njit
def window_grid(order, sid, row, g_t, g_prev, value, bits, saturable, saturated, is_rate, wrap_of_sid,
                column_of_sid, n_columns):
    """Per sample (in `order`: by series, then scrape), the series window ending at it, summed
    into the port grid.

    A series window is the difference of two consecutive samples of one series (a `kind` rate
    sample is integrated instead: value x window). Its flag (bit f-1 of `mask` for flag f):
    1 wrapped (a 32-bit counter that went down inside a window shorter than `wrap_of_sid`, the
    time it needs to wrap at line rate: +2^32), 2 saturated (the later sample sits at a
    ceiling), 3 reset (any other decrease), 4 wrap_ambiguous (a 32-bit counter over a window as
    long as its wrap time, or of unknown speed), 5 gap (the series' previous sample is not the
    grid row's previous scrape). Voided windows (2-5) give no count.

    Returns per (column, grid row): the total count, whether any series gave one, the flag bit
    mask; and the number of duplicates (a sample in the same scrape as the series' previous
    one; the first is kept). `column_of_sid` -1 = no output column."""
    n_rows = len(g_t)
    total = np.zeros((n_columns, n_rows))
    present = np.zeros((n_columns, n_rows), np.bool_)
    mask = np.zeros((n_columns, n_rows), np.uint8)
    n_dup = 0
    last = -1
    for k in range(len(order)):
        i = order[k]
        s = sid[i]
        if last >= 0 and sid[last] == s:
            r = row[i]
            r0 = row[last]
            if r0 == r:
                n_dup += 1
                continue
            c = column_of_sid[s]
            if c >= 0:
                t0 = g_t[r0]
                dt = (g_t[r] - t0) / 1e9
                f = 0
                cnt = np.nan
                if is_rate[i]:
                    cnt = value[i] * dt
                else:
                    delta = value[i] - value[last]
                    wraps = bits[i] == 32 and not saturable[i]
                    if saturated[i]:
                        f = 2
                    elif wraps and (np.isnan(wrap_of_sid[s]) or dt >= wrap_of_sid[s]):
                        f = 4
                    elif delta < 0 and wraps:
                        f = 1
                        cnt = delta + 4294967296.0
                    elif delta < 0:
                        f = 3
                    else:
                        cnt = delta
                if t0 != g_prev[r]:
                    f = 5
                if f:
                    mask[c, r] |= np.uint8(1 << (f - 1))
                if (f == 0 or f == 1) and cnt == cnt:
                    total[c, r] += cnt
                    present[c, r] = True
        last = i
    return total, present, mask, n_dup


@njit(inline=True)
def _ratio(a, b):
    """a / b with IEEE semantics for b == 0 (inf, or NaN for 0/0), as numpy divides."""
    if b != 0:
        return a / b
    if a != a or a == 0:
        return np.nan
    return np.inf if (a > 0) == (math.copysign(1.0, b) > 0) else -np.inf


@njit
def window_rows(keep, g_pid, g_t, g_prev, total, present, mask, void_mask, used, med, gap_factor, speed,
                tx_col, rx_col):
    """The output windows (grid rows `keep`, in output order): port (int32), start (the previous
    scrape), interval, speed, per column the value (NaN when no series gave one or a voiding flag
    is set), tx/rx utilisation (bytes x 8 / (speed x seconds); columns `tx_col`/`rx_col` of
    `total`, -1 when absent), and the flag key (the flag bits of column c, which is
    VALUE_COLUMNS[used[c]], at bit 5 x used[c]; a port gap at bit 60: the window is more than
    `gap_factor` x its port's median interval `med`)."""
    n = len(keep)
    n_columns = total.shape[0]
    port = np.empty(n, np.int32)
    start = np.empty(n, np.int64)
    interval = np.empty(n, np.int64)
    speed_out = np.empty(n)
    values = np.full((n_columns, n), np.nan)
    tx_util = np.full(n, np.nan)
    rx_util = np.full(n, np.nan)
    key = np.zeros(n, np.int64)
    for k in range(n):
        r = keep[k]
        port[k] = g_pid[r]
        start[k] = g_prev[r]
        iv = g_t[r] - g_prev[r]
        interval[k] = iv
        sp = speed[r]
        speed_out[k] = sp
        kk = np.int64(0)
        if iv > gap_factor * med[g_pid[r]]:
            kk |= np.int64(1) << np.int64(60)
        for c in range(n_columns):
            m = mask[c, r]
            if m:
                kk |= np.int64(m) << np.int64(5 * used[c])
            if present[c, r] and (m & void_mask) == 0:
                values[c, k] = total[c, r]
        key[k] = kk
        den = sp * (iv / 1e9)
        if tx_col >= 0:
            tx_util[k] = _ratio(values[tx_col, k] * 8.0, den)
        if rx_col >= 0:
            rx_util[k] = _ratio(values[rx_col, k] * 8.0, den)
    return port, start, interval, speed_out, values, tx_util, rx_util, key


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


@njit
def dense_ids_hashed(k0, k1, k2, k3, w1, w2, w3, rows):
    """`dense_ids` for key spaces too large for a direct table (its memset and page faults cost
    more than the pass): the same ids, from an open-addressing hash table that doubles as it fills.
    A row with the previous row's key takes its id without a lookup."""
    cap = 1024
    table_key = np.empty(cap, np.int64)
    table_id = np.full(cap, -1, np.int64)
    ids = np.full(len(k0), -1, np.int64)
    first = np.empty(len(rows), np.int64)
    n = 0
    prev = np.int64(-1)
    v = np.int64(-1)
    for r in rows:
        key = ((np.int64(k0[r] + 1) * w1 + (k1[r] + 1)) * w2 + (k2[r] + 1)) * w3 + (k3[r] + 1)
        if key != prev:
            mask = cap - 1
            h = ((key * np.int64(-7046029254386353131)) >> 20) & mask
            while table_id[h] >= 0 and table_key[h] != key:
                h = (h + 1) & mask
            v = table_id[h]
            if v < 0:
                v = n
                table_key[h] = key
                table_id[h] = n
                first[n] = r
                n += 1
                if 2 * n > cap:
                    cap *= 2
                    mask = cap - 1
                    table_key = np.empty(cap, np.int64)
                    table_id = np.full(cap, -1, np.int64)
                    for i in range(n):
                        f = first[i]
                        fk = ((np.int64(k0[f] + 1) * w1 + (k1[f] + 1)) * w2 + (k2[f] + 1)) * w3 + (k3[f] + 1)
                        g = ((fk * np.int64(-7046029254386353131)) >> 20) & mask
                        while table_id[g] >= 0:
                            g = (g + 1) & mask
                        table_key[g] = fk
                        table_id[g] = i
            prev = key
        ids[r] = v
    return ids, n, first[:n]


@njit
def link_totals(gid, tx_util, rx_util, tx_bytes, rx_bytes, speed, n):
    """Per group (link): windows, windows with a utilisation and their sum and peak (the larger
    of tx and rx, NaN ignored), tx and rx bytes (NaN as 0, +-inf as the largest finite float,
    as numpy's nan_to_num), and the top speed (NaN ignored). Sums run in row order."""
    big = np.finfo(np.float64).max
    windows = np.zeros(n, np.int64)
    n_util = np.zeros(n, np.int64)
    sum_util = np.zeros(n)
    peak = np.full(n, -np.inf)
    tx = np.zeros(n)
    rx = np.zeros(n)
    top = np.full(n, -np.inf)
    for i in range(len(gid)):
        g = gid[i]
        windows[g] += 1
        a = tx_util[i]
        b = rx_util[i]
        u = b if a != a else (a if b != b else max(a, b))
        if u == u:
            n_util[g] += 1
            sum_util[g] += u
            if u > peak[g]:
                peak[g] = u
        for k in range(2):
            v = tx_bytes[i] if k == 0 else rx_bytes[i]
            if v != v:
                v = 0.0
            elif v > big:
                v = big
            elif v < -big:
                v = -big
            if k == 0:
                tx[g] += v
            else:
                rx[g] += v
        s = speed[i]
        if s == s:
            s = big if s > big else (-big if s < -big else s)
            if s > top[g]:
                top[g] = s
    return windows, n_util, sum_util, peak, tx, rx, top
