"""Phase calls without reference counting: what the flow kernel's split rests on (docs/replay.md 4).

A numba function that takes arrays increfs each on entry and decrefs it on every exit (NRT_incref /
NRT_decref, atomic); a phase function called once per event pays that per array. This times a tight
loop of calls of one small phase (6 arrays, an early exit) written four ways, against the same work
written inline in the loop, and counts the NRT calls in each phase's LLVM IR:

- arrays: the phase takes the arrays;
- views: the caller passes `numba.carray` views (no meminfo) as the arrays: the callee still calls
  NRT (on a null meminfo: no atomic, still a call);
- addresses: the phase takes each array's address and builds its views itself;
- table: the phase takes one address, of a table of (address, shape) rows, and builds its views
  from it (`_kernels._f1`/`_i1`, what `_simulate_sorted`'s phases do); `--per` items per call.

    python benchmarks/bench_phase_calls.py [--calls 5000000] [--per 1,4,32]
"""

from __future__ import annotations

import argparse
import time

import numba
import numpy as np

from tracekit.replay._kernels import _N_SLOTS, _f1, _i1, _pointer

njit = numba.njit(cache=False)
_A, _B, _C, _D, _E, _G = range(6)


@njit
def phase_arrays(a, b, c, d, e, g, i, n):
    if a[i] < 0.0:
        return 0
    s = 0
    for k in range(c[i], c[i] + 4):
        j = d[k % n]
        b[j] += a[i]
        e[j] += 1
        if g[j] > 2.0:
            return s
        s += j
    return s


@njit
def phase_addresses(pa, pb, pc, pd, pe, pg, i, n):
    a = numba.carray(_pointer(pa, np.float64), n)
    b = numba.carray(_pointer(pb, np.float64), n)
    c = numba.carray(_pointer(pc, np.int64), n)
    d = numba.carray(_pointer(pd, np.int64), n)
    e = numba.carray(_pointer(pe, np.int64), n)
    g = numba.carray(_pointer(pg, np.float64), n)
    if a[i] < 0.0:
        return 0
    s = 0
    for k in range(c[i], c[i] + 4):
        j = d[k % n]
        b[j] += a[i]
        e[j] += 1
        if g[j] > 2.0:
            return s
        s += j
    return s


@njit
def phase_table(st, i0, per, n):
    a = _f1(st, _A)
    b = _f1(st, _B)
    c = _i1(st, _C)
    d = _i1(st, _D)
    e = _i1(st, _E)
    g = _f1(st, _G)
    t = 0
    for r in range(i0, i0 + per):
        i = r % n
        if a[i] < 0.0:
            continue
        s = 0
        for k in range(c[i], c[i] + 4):
            j = d[k % n]
            b[j] += a[i]
            e[j] += 1
            if g[j] > 2.0:
                break
            s += j
        t += s
    return t


@njit
def loop_inline(a, b, c, d, e, g, calls, per):
    n = a.size
    t = 0
    for r in range(calls):
        i = r % n
        if a[i] < 0.0:
            continue
        s = 0
        for k in range(c[i], c[i] + 4):
            j = d[k % n]
            b[j] += a[i]
            e[j] += 1
            if g[j] > 2.0:
                break
            s += j
        t += s
    return t


@njit
def loop_arrays(a, b, c, d, e, g, calls, per):
    n = a.size
    t = 0
    for r in range(calls):
        t += phase_arrays(a, b, c, d, e, g, r % n, n)
    return t


@njit
def loop_views(a, b, c, d, e, g, calls, per):
    n = a.size
    va = numba.carray(_pointer(a.ctypes.data, np.float64), n)
    vb = numba.carray(_pointer(b.ctypes.data, np.float64), n)
    vc = numba.carray(_pointer(c.ctypes.data, np.int64), n)
    vd = numba.carray(_pointer(d.ctypes.data, np.int64), n)
    ve = numba.carray(_pointer(e.ctypes.data, np.int64), n)
    vg = numba.carray(_pointer(g.ctypes.data, np.float64), n)
    t = 0
    for r in range(calls):
        t += phase_arrays(va, vb, vc, vd, ve, vg, r % n, n)
    return t


@njit
def loop_addresses(a, b, c, d, e, g, calls, per):
    n = a.size
    t = 0
    for r in range(calls):
        t += phase_addresses(a.ctypes.data, b.ctypes.data, c.ctypes.data, d.ctypes.data, e.ctypes.data,
                             g.ctypes.data, r % n, n)
    return t


@njit
def loop_table(a, b, c, d, e, g, calls, per):
    n = a.size
    tab = np.zeros((_N_SLOTS, 4), np.int64)  # the kernel's table shape
    for s, address in enumerate((a.ctypes.data, b.ctypes.data, c.ctypes.data, d.ctypes.data, e.ctypes.data,
                                 g.ctypes.data)):
        tab[s, 0] = address
        tab[s, 1] = n
    t = 0
    for r in range(0, calls, per):
        t += phase_table(tab.ctypes.data, r, per, n)
    return t


def nrt_calls(fn) -> tuple[int, int]:
    ir = "\n".join(fn.inspect_llvm().values())
    return ir.count("call void @NRT_incref"), ir.count("call void @NRT_decref")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5_000_000)
    parser.add_argument("--per", default="1,4,32", help="items per call of the table variant")
    args = parser.parse_args()
    n = 4096
    rng = np.random.default_rng(0)
    arrays = [rng.random(n), np.zeros(n), rng.integers(0, n, n), rng.integers(0, n, n), np.zeros(n, np.int64),
              rng.random(n) * 2.1]
    loops = [loop_inline, loop_arrays, loop_views, loop_addresses, loop_table]
    for per in [int(p) for p in args.per.split(",")]:
        best: dict[str, float] = {}
        results = set()
        for loop in loops:
            loop(*[x.copy() for x in arrays], 64, per)
        for _ in range(3):  # alternating, least CPU kept
            for loop in loops:
                xs = [x.copy() for x in arrays]
                t0 = time.process_time()
                v = loop(*xs, args.calls, per)
                dt = time.process_time() - t0
                best[loop.__name__] = min(best.get(loop.__name__, np.inf), dt)
                results.add((v, float(xs[1].sum())))
        base = best["loop_inline"]
        print(f"{per} item(s) per table call: " + ", ".join(
            f"{k[5:]} {v:.3f} s ({v / base:.2f}x)" for k, v in best.items()) + f"; results equal: {len(results) == 1}")
    for fn in (phase_arrays, phase_addresses, phase_table):
        print(f"{fn.__name__}: NRT_incref / NRT_decref calls in its IR {nrt_calls(fn)}")


if __name__ == "__main__":
    main()
