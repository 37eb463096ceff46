"""numba kernels for telemetry parsing: the Prometheus text tokenizer. Kernels see numpy arrays
and scalars only and read no module globals."""

from __future__ import annotations

import numpy as np

from tracekit._jit import njit

# Line kinds (`kind` output of `tokenize_exposition`).
# 0 blank, 1 comment, 2 sample, 3 malformed.
# Value states: 1 parsed exactly, 2 needs the slow (Python) parse, 0 invalid.
# Time-stamp states: 0 none, 1 integer, 2 needs the slow parse, 3 invalid.


@njit(inline=True)
def _is_name_start(c):
    return (97 <= c <= 122) or (65 <= c <= 90) or c == 95 or c == 58


@njit(inline=True)
def _is_name_char(c):
    return _is_name_start(c) or (48 <= c <= 57)


@njit
def _pow10(e):
    r = 1.0
    for _ in range(e):
        r *= 10.0
    return r


@njit
def _parse_value(buf, a, b):
    """(value, state) of the token buf[a:b]: exact for integers and decimals whose mantissa fits
    in 2^53 and whose decimal exponent is within +-22 (one correctly rounded IEEE operation);
    NaN/Inf spelled as Prometheus does; anything else is left to the slow path."""
    n = b - a
    if n <= 0:
        return 0.0, 0
    i = a
    neg = False
    if buf[i] == 43 or buf[i] == 45:
        neg = buf[i] == 45
        i += 1
    if i >= b:
        return 0.0, 0
    c = buf[i]
    if c == 78 or c == 110 or c == 73 or c == 105:  # N n I i
        rest = b - i
        if rest == 3 and (buf[i] | 32) == 110 and (buf[i + 1] | 32) == 97 and (buf[i + 2] | 32) == 110:
            return np.nan, 1
        if rest == 3 and (buf[i] | 32) == 105 and (buf[i + 1] | 32) == 110 and (buf[i + 2] | 32) == 102:
            return (-np.inf if neg else np.inf), 1
        return 0.0, 2
    mant = np.uint64(0)
    digits = 0
    frac = 0
    seen_dot = False
    any_digit = False
    while i < b:
        c = buf[i]
        if 48 <= c <= 57:
            any_digit = True
            if digits < 19:
                mant = mant * np.uint64(10) + np.uint64(c - 48)
                if mant != 0:
                    digits += 1
                if seen_dot:
                    frac += 1
            else:
                return 0.0, 2
        elif c == 46 and not seen_dot:
            seen_dot = True
        elif c == 101 or c == 69:
            break
        else:
            return 0.0, 2
        i += 1
    if not any_digit:
        return 0.0, 2
    exp = 0
    if i < b:
        i += 1
        eneg = False
        if i < b and (buf[i] == 43 or buf[i] == 45):
            eneg = buf[i] == 45
            i += 1
        if i >= b:
            return 0.0, 2
        while i < b:
            c = buf[i]
            if not (48 <= c <= 57) or exp > 10000:
                return 0.0, 2
            exp = exp * 10 + (c - 48)
            i += 1
        if eneg:
            exp = -exp
    e10 = exp - frac
    if mant > np.uint64(9007199254740992) or e10 > 22 or e10 < -22:
        return 0.0, 2
    v = float(mant) * _pow10(e10) if e10 >= 0 else float(mant) / _pow10(-e10)
    return (-v if neg else v), 1


@njit
def _parse_ts(buf, a, b):
    """(whole, fraction in 1e-9 of the unit, state) of a time-stamp token: 1 a plain decimal
    (`1712345678901` or `1712345678.901`), 2 other numeric text (the slow path)."""
    i = a
    neg = False
    if i < b and (buf[i] == 43 or buf[i] == 45):
        neg = buf[i] == 45
        i += 1
    v = 0
    nd = 0
    while i < b and 48 <= buf[i] <= 57:
        v = v * 10 + (buf[i] - 48)
        nd += 1
        i += 1
        if nd > 18:
            return 0, 0, 2
    frac = 0
    if i < b and buf[i] == 46:
        i += 1
        nf = 0
        while i < b and 48 <= buf[i] <= 57:
            if nf < 9:
                frac = frac * 10 + (buf[i] - 48)
                nf += 1
            i += 1
        while nf < 9:
            frac *= 10
            nf += 1
    if i != b or nd == 0:
        return 0, 0, 2
    return (-v if neg else v), (-frac if neg else frac), 1


@njit
def count_lines(buf):
    n = 0
    for c in buf:
        if c == 10:
            n += 1
    if len(buf) and buf[len(buf) - 1] != 10:
        n += 1
    return n


@njit(inline=True)
def _hash_span(buf, a, b, seed):
    """A seeded 64-bit hash of buf[a:b], eight bytes per step (keys are compared byte for byte
    too, so the hash only spreads them)."""
    h = seed ^ np.uint64(b - a)
    m = np.uint64(0x9E3779B97F4A7C15)
    i = a
    while i + 8 <= b:
        w = np.uint64(0)
        for j in range(8):
            w |= np.uint64(buf[i + j]) << np.uint64(8 * j)
        h = (h ^ w) * m
        h ^= h >> np.uint64(29)
        i += 8
    w = np.uint64(0)
    j = 0
    while i < b:
        w |= np.uint64(buf[i]) << np.uint64(8 * j)
        i += 1
        j += 1
    h = (h ^ w) * m
    h ^= h >> np.uint64(32)
    return h


@njit(inline=True)
def _equal(buf, a, n, other, b, m):
    """buf[a:a+n] == other[b:b+m]; the bytes are OR-ed together without an early exit, a loop
    LLVM vectorises (the spans nearly always match: a fifth of the tokenizer's time went here)."""
    if n != m:
        return False
    acc = np.uint8(0)
    for k in range(n):
        acc |= buf[a + k] ^ other[b + k]
    return acc == 0


@njit
def tokenize_exposition(buf, seed, tab_hash, tab_code, rep_buf, rep_s0, rep_len, n_known):
    """Split Prometheus text into lines and tokens, and give every sample its series code.

    Per line: kind (0 blank, 1 comment, 2 sample, 3 malformed), the series span (start, length:
    name plus labels), the series code, the value and its state (1 exact, 2 slow path, 0
    invalid), the time stamp (whole units, and the fraction in 1e-9 units) and its state (0 none,
    1 decimal, 2 slow path), and the line's start and length (for slow paths).

    Series codes come from an open-addressing table (`tab_hash`/`tab_code`, updated in place)
    keyed by the series bytes: known series (codes < n_known) have their bytes in `rep_buf` at
    `rep_s0`/`rep_len`; a series first seen here gets the next code and its first line is
    returned in `new_s0`/`new_len`. `status` is 1 when the table passed half full (the caller
    grows it and tokenizes the block again), else 0.
    """
    n_lines = count_lines(buf)
    kind = np.zeros(n_lines, np.int8)
    s0 = np.zeros(n_lines, np.int64)
    slen = np.zeros(n_lines, np.int32)
    code = np.full(n_lines, -1, np.int64)
    value = np.zeros(n_lines, np.float64)
    vstate = np.zeros(n_lines, np.int8)
    ts = np.zeros(n_lines, np.int64)
    tfrac = np.zeros(n_lines, np.int64)
    tstate = np.zeros(n_lines, np.int8)
    l0 = np.zeros(n_lines, np.int64)
    llen = np.zeros(n_lines, np.int32)
    new_s0 = np.zeros(64, np.int64)
    new_len = np.zeros(64, np.int64)
    n_new = 0
    cap = len(tab_hash)
    mask = np.uint64(cap - 1)
    used = n_known
    last = -1
    n = len(buf)
    pos = 0
    line = 0
    while pos < n and line < n_lines:
        l0[line] = pos
        i = pos
        while i < n and (buf[i] == 32 or buf[i] == 9):
            i += 1
        ok = False
        if i >= n or buf[i] == 10 or (buf[i] == 13 and (i + 1 >= n or buf[i + 1] == 10)):
            kind[line] = 0
        elif buf[i] == 35:
            kind[line] = 1
        elif _is_name_start(buf[i]):
            start = i
            # Scrapes repeat their series in one order: try the series after the previous line's
            # (its bytes were checked when first seen) before scanning labels and hashing.
            fast = -1
            e = start
            pred = last + 1
            if last >= 0 and pred < n_known + n_new:
                if pred < n_known:
                    m = rep_len[pred]
                    e = start + m
                    if e < n and (buf[e] == 32 or buf[e] == 9) and _equal(buf, start, m, rep_buf, rep_s0[pred], m):
                        fast = pred
                else:
                    m = new_len[pred - n_known]
                    e = start + m
                    if e < n and (buf[e] == 32 or buf[e] == 9) and _equal(buf, start, m, buf,
                                                                           new_s0[pred - n_known], m):
                        fast = pred
            if fast >= 0:
                i = e
            while fast < 0 and i < n and _is_name_char(buf[i]):
                i += 1
            ok = True
            if fast < 0 and i < n and buf[i] == 123:
                quoted = False
                closed = False
                i += 1
                while i < n and buf[i] != 10:
                    c = buf[i]
                    if quoted:
                        if c == 92:
                            i += 1
                            if i < n and buf[i] == 10:
                                break
                        elif c == 34:
                            quoted = False
                    elif c == 34:
                        quoted = True
                    elif c == 125:
                        closed = True
                        i += 1
                        break
                    i += 1
                ok = closed
            series_end = i
            if ok and (i >= n or not (buf[i] == 32 or buf[i] == 9)):
                ok = False
            if ok:
                while i < n and (buf[i] == 32 or buf[i] == 9):
                    i += 1
                va = i
                while i < n and buf[i] != 32 and buf[i] != 9 and buf[i] != 10 and buf[i] != 13:
                    i += 1
                v, vs = _parse_value(buf, va, i)
                if i == va:
                    ok = False
                while i < n and (buf[i] == 32 or buf[i] == 9):
                    i += 1
                t, tf, tsst = 0, 0, 0
                if i < n and buf[i] != 10 and buf[i] != 13:
                    ta = i
                    while i < n and buf[i] != 32 and buf[i] != 9 and buf[i] != 10 and buf[i] != 13:
                        i += 1
                    t, tf, tsst = _parse_ts(buf, ta, i)
                    while i < n and (buf[i] == 32 or buf[i] == 9):
                        i += 1
                if i < n and buf[i] == 13:
                    i += 1
                if i < n and buf[i] != 10:
                    ok = False
            if ok:
                kind[line] = 2
                s0[line] = start
                n_s = series_end - start
                slen[line] = n_s
                h = _hash_span(buf, start, series_end, seed) if fast < 0 else np.uint64(0)
                slot = h & mask
                while fast < 0:
                    c = tab_code[slot]
                    if c < 0:
                        if 2 * (used + 1) > cap:
                            return (kind, s0, slen, code, value, vstate, ts, tfrac, tstate, l0, llen,
                                    new_s0[:n_new], new_len[:n_new], 1)
                        c = n_known + n_new
                        tab_code[slot] = c
                        tab_hash[slot] = h
                        if n_new == len(new_s0):
                            new_s0 = np.concatenate((new_s0, np.zeros(len(new_s0), np.int64)))
                            new_len = np.concatenate((new_len, np.zeros(len(new_len), np.int64)))
                        new_s0[n_new] = start
                        new_len[n_new] = n_s
                        n_new += 1
                        used += 1
                        break
                    if tab_hash[slot] == h:
                        if c < n_known:
                            if _equal(buf, start, n_s, rep_buf, rep_s0[c], rep_len[c]):
                                break
                        elif _equal(buf, start, n_s, buf, new_s0[c - n_known], new_len[c - n_known]):
                            break
                    slot = (slot + np.uint64(1)) & mask
                if fast >= 0:
                    c = fast
                last = c
                code[line] = c
                value[line] = v
                vstate[line] = vs
                ts[line] = t
                tfrac[line] = tf
                tstate[line] = tsst
            else:
                kind[line] = 3
        else:
            kind[line] = 3
        while i < n and buf[i] != 10:
            i += 1
        llen[line] = min(i - pos, 2147483647)
        line += 1
        pos = i + 1
    return kind, s0, slen, code, value, vstate, ts, tfrac, tstate, l0, llen, new_s0[:n_new], new_len[:n_new], 0


@njit
def rebuild_table(rep_buf, rep_s0, rep_len, seed, tab_hash, tab_code):
    """Insert the known series (code = index) into an empty table."""
    mask = np.uint64(len(tab_hash) - 1)
    for c in range(len(rep_s0)):
        h = _hash_span(rep_buf, rep_s0[c], rep_s0[c] + rep_len[c], seed)
        slot = h & mask
        while tab_code[slot] >= 0:
            slot = (slot + np.uint64(1)) & mask
        tab_code[slot] = c
        tab_hash[slot] = h


@njit
def gather_columns(codes, luts):
    """out[k, i] = luts[k, codes[i]]: the per-series columns of every sample in one pass over the
    codes (a numpy gather per column reads them once per column)."""
    n_k = luts.shape[0]
    out = np.empty((n_k, len(codes)), np.int32)
    for i in range(len(codes)):
        c = codes[i]
        for k in range(n_k):
            out[k, i] = luts[k, c]
    return out
