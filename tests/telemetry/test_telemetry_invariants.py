"""The numba kernels against their naive twins, and invariants under random counter histories:
rates are never negative, a metric flagged saturated/reset/wrap_ambiguous/gap has no number, and
every sample read is used or skipped with a reason."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from telemetry_naive import VOID, rate, tokenize

from tracekit import schema, telemetry
from tracekit.parsers.telemetry import _kernels as pk
from tracekit.telemetry import VALUE_COLUMNS, rate_counters
from tracekit.telemetry import _kernels as tk

S = 1_000_000_000
T0 = 1_760_000_000 * S


def _tokenize(text: bytes):
    cap = 1 << 12
    th, tc = np.zeros(cap, np.uint64), np.full(cap, -1, np.int64)
    empty_i = np.zeros(0, np.int64)
    return pk.tokenize_exposition(np.frombuffer(text, np.uint8), np.uint64(99), th, tc, np.zeros(0, np.uint8),
                                  empty_i, empty_i, 0)


LINES = st.one_of(
    st.sampled_from([b"", b"   ", b"# TYPE x counter", b"  # comment", b"\r", b"x{", b"9abc 1", b"x 1 2 3",
                     b'x{a="b c"} 1', b'x{a="}"} 2 1700000000000', b'x{a="q\\"z"} 3', b"x NaN", b"x +Inf 5",
                     b"x 1.5e3", b"x 1e400", b"x 0.000001", b"y{a=\"1\",b=\"2\"} -7 1700000000.25", b"x 12abc",
                     b"x\t4\t1700000000000", b"x 5 1.7e9", b"x 5 abc", b"x{} 1"]),
    st.builds(lambda n, v, t: f"m{n} {v}{'' if t is None else f' {t}'}".encode(),
              st.integers(0, 3), st.integers(-10**15, 10**15), st.one_of(st.none(), st.integers(0, 10**13))),
    st.builds(lambda v: f"m {v!r}".encode(), st.floats(allow_nan=False, allow_infinity=False)),
)


@given(st.lists(LINES, max_size=12), st.booleans())
@settings(max_examples=300, deadline=None)
def test_tokenizer_matches_its_twin(lines, trailing_newline):
    text = b"\n".join(lines) + (b"\n" if trailing_newline and lines else b"")
    kind, s0, slen, code, value, vstate, ts, tfrac, tstate, *_ = _tokenize(text)
    twin = tokenize(text)
    assert len(kind) == len(twin)
    names = {0: "blank", 1: "comment", 2: "sample", 3: "malformed"}
    for i, expect in enumerate(twin):
        assert names[int(kind[i])] == expect[0], (text, i)
        if expect[0] != "sample":
            continue
        assert bytes(text[s0[i]:s0[i] + slen[i]]) == expect[1]
        if vstate[i] == 1:
            got = float(value[i])
            assert (np.isnan(got) and np.isnan(expect[2])) or got == expect[2]
        elif vstate[i] == 0:
            assert expect[2] == "bad"
        if expect[3] is None:
            assert tstate[i] == 0
        elif tstate[i] == 1:
            assert int(ts[i]) * 10**9 + int(tfrac[i]) == int(expect[3] * 10**9)
    samples = [t[1] for t in twin if t[0] == "sample"]
    codes = [int(code[i]) for i in range(len(kind)) if kind[i] == 2]
    assert len(set(codes)) == len(set(samples))
    assert all((a == b) == (ca == cb) for a, ca in zip(samples, codes, strict=True)
               for b, cb in zip(samples, codes, strict=True))


def test_series_codes_survive_table_growth():
    text = b"".join(f'm{{i="{i}"}} {i}\n'.encode() for i in range(5000))
    th, tc = np.zeros(16, np.uint64), np.full(16, -1, np.int64)
    out = pk.tokenize_exposition(np.frombuffer(text, np.uint8), np.uint64(1), th, tc, np.zeros(0, np.uint8),
                                 np.zeros(0, np.int64), np.zeros(0, np.int64), 0)
    assert out[-1] == 1  # the table filled up: the caller grows it and tokenizes again

    from tracekit.parsers.telemetry.prometheus import _SeriesTable
    table = _SeriesTable()
    got = table.tokenize(np.frombuffer(text, np.uint8))
    assert sorted(set(got[3].tolist())) == list(range(5000)) and len(table.specs) == 5000
    again = table.tokenize(np.frombuffer(text, np.uint8))  # a second block: all known
    assert (again[3] == got[3]).all() and len(table.specs) == 5000


def test_series_predicted_from_the_previous_line_are_checked_byte_for_byte():
    """The tokenizer tries the series after the previous line's first; a series whose bytes
    start with the predicted one's (`m` then `m0`, `x{a="1"}` then `x{a="1"}`...) is not it."""
    from tracekit.parsers.telemetry.prometheus import _SeriesTable

    first = b'm 1\nx{a="1"} 2\nm0 3\nx{a="1",b="2"} 4\nm 5\nx{a="1"} 6\nm 7\nm0 8\n'
    second = b'm 1\nx{a="1"}\t2\nm 3\nmm 4\nx{a="1"} 5\nm0 6\nx{a="1",b="2"} 7\nx{a="2"} 8\nm 9\nx{a="2"} 1\n'
    second += b'x{a="1"} 5\nm00 6\nm 0\nx{a="1"} 1\n'
    table = _SeriesTable()
    codes = []
    series = []
    for text in (first, second):
        got = table.tokenize(np.frombuffer(text, np.uint8))
        twin = tokenize(text)
        assert [int(k) for k in got[0]] == [2] * len(twin)
        codes += got[3].tolist()
        series += [t[1] for t in twin]
    for a, ca in zip(series, codes, strict=True):
        for b, cb in zip(series, codes, strict=True):
            assert (a == b) == (ca == cb), (a, b)
    assert len(table.specs) == len(set(series)) == 7


@given(st.lists(st.integers(0, 5), min_size=0, max_size=50))
@settings(deadline=None)
def test_counting_order_is_a_stable_sort(keys):
    k = np.array(keys, np.int64)
    base = np.arange(len(k))
    assert tk.counting_order(k, 6, base).tolist() == sorted(base.tolist(), key=lambda i: keys[i])


@given(st.lists(st.tuples(st.integers(-1, 2), st.integers(-1, 3)), max_size=40))
@settings(deadline=None)
def test_dense_ids_number_by_first_appearance(pairs):
    a = np.array([p[0] for p in pairs], np.int64)
    b = np.array([p[1] for p in pairs], np.int64)
    minus = np.full(len(a), -1, np.int64)
    ids, n, first = tk.dense_ids(a, b, minus, minus, 5, 1, 1, np.arange(len(a)), 4 * 5 * 1 * 1 + 1)
    seen: dict = {}
    for p in pairs:
        seen.setdefault(p, len(seen))
    assert ids.tolist() == [seen[p] for p in pairs] and n == len(seen)
    assert [pairs[f] for f in first.tolist()] == list(seen)
    assert all(np.array_equal(x, y) for x, y in zip(tk.dense_ids_hashed(a, b, minus, minus, 5, 1, 1, np.arange(len(a))),
                                                    (ids, n, first), strict=True))


@given(st.lists(st.tuples(st.integers(-1, 3000), st.integers(-1, 40), st.integers(-1, 40), st.integers(-1, 70)),
                max_size=3000), st.integers(0, 3))
@settings(deadline=None, max_examples=40)
def test_dense_numbers_wide_keys_by_first_appearance(rows, runs):
    """Key spaces beyond the direct table go through the hash table (grown past its first 1,024
    slots here); runs of a repeated key take the shortcut. The ids are a naive first-appearance
    numbering either way, on the rows of `where` only."""
    rows = [r for r in rows for _ in range(runs + 1)]
    keys = [np.array([r[i] for r in rows] or [0], np.int32)[:len(rows)] for i in range(4)]
    where = np.array([(i * 7) % 5 != 0 for i in range(len(rows))], bool)
    ids, n, first = telemetry._dense(*keys, where=where)
    seen: dict = {}
    expect = []
    for r, w in zip(rows, where.tolist(), strict=True):
        expect.append(seen.setdefault(r, len(seen)) if w else -1)
    assert ids.tolist() == expect and n == len(seen)
    assert [rows[f] for f in first.tolist()] == list(seen)


def test_dense_numbers_many_wide_keys_through_a_growing_hash_table():
    """20,000 rows of about 6,000 distinct wide keys (the hash table doubles from 1,024 slots
    several times), in random order with repeats: a naive first-appearance numbering."""
    rng = np.random.default_rng(26)
    keys = [rng.integers(-1, w, 20_000).astype(np.int32) for w in (3000, 30, 30, 60)]
    pool = rng.integers(0, 20_000, 6000)
    keys = [k[pool][rng.integers(0, 6000, 20_000)] for k in keys]
    where = rng.random(20_000) < 0.9
    ids, n, first = telemetry._dense(*keys, where=where)
    seen: dict = {}
    expect = []
    for i, w in enumerate(where.tolist()):
        t = tuple(int(k[i]) for k in keys)
        expect.append(seen.setdefault(t, len(seen)) if w else -1)
    assert len(seen) > 4096
    assert ids.tolist() == expect and n == len(seen)
    assert [tuple(int(k[f]) for k in keys) for f in first.tolist()] == list(seen)


METRICS = [("tx_bytes", "tx"), ("rx_bytes", "rx"), ("tx_pkts", "tx"), ("discards", "rx"), ("ecn_marked", "tx")]


@st.composite
def histories(draw):
    rows = []
    n_ports = draw(st.integers(1, 3))
    for p in range(n_ports):
        grid = [T0 + k * 10 * S for k in range(draw(st.integers(1, 8)))]
        grid = [t for t in grid if draw(st.booleans()) or t == grid[0]]
        if draw(st.booleans()):
            speed = draw(st.sampled_from([1e9, 10e9, 100e9, 400e9]))
            rows.append(dict(ts_ns=grid[0], host="h", device=f"d{p}", port="1", metric="speed_bps",
                             direction=None, value=speed, kind="gauge", bits=None, saturated=False,
                             saturable=False, qualifier=None))
        for metric, direction in draw(st.lists(st.sampled_from(METRICS), min_size=1, max_size=3, unique=True)):
            bits = draw(st.sampled_from([32, 64, None]))
            saturable = draw(st.booleans())
            kind = draw(st.sampled_from(["counter", "counter", "counter", "rate", "gauge"]))
            value = float(draw(st.integers(0, 2**32 - 1)))
            for t in grid:
                if draw(st.integers(0, 5)) == 0:
                    continue  # this series missed the scrape
                step = draw(st.sampled_from([0, 1, 1000, 10**9, 2**32, -(10**6)]))
                value = float(max(0, min(value + step, 2**32 - 1))) if bits == 32 else float(max(0, value + step))
                jitter = draw(st.sampled_from([0, 0, 0, 50_000]))
                row = dict(ts_ns=t + jitter, host="h", device=f"d{p}", port="1", metric=metric, direction=direction,
                           value=value, kind=kind, bits=bits, saturated=saturable and value >= 2**32 - 1,
                           saturable=saturable, qualifier=None)
                rows.append(row)
                if draw(st.integers(0, 6)) == 0:
                    rows.append(dict(row))  # a duplicate sample
    if draw(st.booleans()) and rows:
        rows.append({**rows[0], "ts_ns": None})
    return rows


def _table(rows):
    return schema.conform("counters", {k: [r[k] for r in rows] for k in rows[0]}) if rows else schema.empty("counters")


@given(histories())
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_rates_match_the_naive_twin_and_keep_the_invariants(rows):
    res = rate_counters(_table(rows))
    assert res.stats.balanced, res.stats
    got = {(w["device"], w["port"], w["ts_ns"]): w for w in res.link_samples.to_pylist()}
    want = rate(rows)
    assert set(got) == set(want)
    for key, w in got.items():
        t = want[key]
        assert w["interval_ns"] == t["interval_ns"] and w["speed_bps"] == t["speed_bps"]
        assert set(w["flags"]) == t["flags"] and set(w["flag_detail"]) == t["flag_detail"]
        for col in VALUE_COLUMNS:
            assert (w[col] is None) == (t[col] is None), (key, col, w[col], t[col])
            if w[col] is not None:
                assert w[col] == pytest.approx(t[col], rel=1e-12)
                assert w[col] >= 0
        for item in w["flag_detail"]:
            col, flag = item.split(":")
            if flag in VOID:
                assert w[col] is None
        for util in ("tx_util", "rx_util"):
            assert w[util] is None or w[util] >= 0



def test_one_series_per_port_listed_in_another_order_than_the_ports():
    """One counter per port, its series first seen in another port order than the speeds name the
    ports: the rating orders by port (the shortcut for one series per port must not apply)."""
    def row(device, metric, kind, value, t):
        return dict(ts_ns=t, host="h", device=device, port="1", metric=metric, direction="tx" if kind != "gauge"
                    else None, value=value, kind=kind, bits=64, saturated=False, saturable=False, qualifier=None)

    rows = [row("dA", "speed_bps", "gauge", 1e9, T0), row("dB", "speed_bps", "gauge", 4e9, T0)]
    for k in range(4):
        t = T0 + k * 10 * S
        rows += [row("dB", "tx_bytes", "counter", 7e6 * k, t), row("dA", "tx_bytes", "counter", 3e6 * k * k, t)]
    res = rate_counters(_table(rows))
    got = {(w["device"], w["ts_ns"]): (w["tx_bytes"], w["speed_bps"]) for w in res.link_samples.to_pylist()}
    want = {(d, t): (w["tx_bytes"], w["speed_bps"]) for (d, _, t), w in rate(rows).items()}
    assert got == want and len(got) == 6

FLOATS = st.one_of(st.just(float("nan")), st.just(float("inf")), st.just(-float("inf")),
                   st.floats(-1e12, 1e12, allow_nan=False))


@given(st.lists(st.tuples(st.integers(0, 3), FLOATS, FLOATS, FLOATS, FLOATS, FLOATS), max_size=40))
@settings(deadline=None)
def test_link_totals_match_the_numpy_formulation(rows):
    """The kernel against the per-link sums as numpy writes them (fmax, bincount, nan_to_num)."""
    n = 4
    gid = np.array([r[0] for r in rows], np.int64)
    tx_u, rx_u, tx_b, rx_b, speed = (np.array([r[k] for r in rows], np.float64) for k in range(1, 6))
    got = tk.link_totals(gid, tx_u, rx_u, tx_b, rx_b, speed, n)
    util = np.fmax(tx_u, rx_u)
    has = ~np.isnan(util)
    peak = np.full(n, -np.inf)
    np.fmax.at(peak, gid[has], util[has])
    top = np.full(n, -np.inf)
    np.fmax.at(top, gid, np.nan_to_num(speed, nan=-np.inf))
    want = (np.bincount(gid, minlength=n), np.bincount(gid[has], minlength=n),
            np.bincount(gid[has], weights=util[has], minlength=n), peak,
            np.bincount(gid, weights=np.nan_to_num(tx_b), minlength=n),
            np.bincount(gid, weights=np.nan_to_num(rx_b), minlength=n), top)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


@given(st.lists(st.integers(0, 6), max_size=60), st.integers(1, 4))
@settings(deadline=None)
def test_gather_columns_is_a_gather_per_column(codes, n_tables):
    rng = np.random.default_rng(len(codes))
    luts = rng.integers(-1, 100, (n_tables, 7)).astype(np.int32)
    idx = np.array(codes, np.int64)
    got = pk.gather_columns(idx, luts)
    assert got.shape == (n_tables, len(codes))
    for k in range(n_tables):
        assert got[k].tolist() == [int(luts[k][c]) for c in codes]
