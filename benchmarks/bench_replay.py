"""Replay benchmark: the flow simulator at scale, against the previous kernel in the same run.

Two cases:

1. A whole `replay()` of one synthetic training step (`make_run_tables`: DP x PP=2 x EP=64, skewed
   experts) on `dgx-h100-superpod`, counting every simulation it runs (the calibration run and the
   schedule/simulate rounds) and the time spent outside them. `--gpus 1024` (default; target
   < 30 s) or `--gpus 4096` (target < 60 s).
2. One skewed all-to-all (Dirichlet(0.5) expert popularity) over N GPUs with all N(N-1) flows
   released at once, at three sizes (default 256, 512, 1,024 GPUs: 65k, 262k and 1.05M flows).
   Prints the growth exponent of simulation time in flows (`_growth.growth_exponent`, a
   least-squares fit of log time on log flows; 1 is linear) of this kernel and, measured in the
   same run, of the two baselines below, the speed ratio to the previous kernel
   (`benchmarks/previous_kernel.py`, a copy of the simulator before the scale work) and to this
   kernel with its lazy rate classes switched off (`lazy_min=0`: every class event flow by flow),
   with the largest relative difference between the kernels' completion times. Target: 1M flows
   < 30 s.

A last line checks the kernel against the naive Python twin (tests/replay/naive.py) on a small
random case (correctness, not speed).

    python benchmarks/bench_replay.py [--gpus 1024] [--a2a 256,512,1024] [--skip-previous]
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "replay"))

import previous_kernel  # noqa: E402
from _growth import growth_exponent  # noqa: E402

from tracekit.replay import _kernels, engine, rounds  # noqa: E402
from tracekit.replay.simulate import Flows, route, simulate  # noqa: E402
from tracekit.replay.topology import build, parse_spec  # noqa: E402
from tracekit.synth import make_run_tables  # noqa: E402

TOPOLOGY = "dgx-h100-superpod"


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def warm() -> None:
    """Compile (or load from the cache) both kernels outside the timed regions."""
    topo = build(parse_spec("single-switch:hosts=2,gpus=1"))
    flows = Flows.from_lists([0, 1], [1, 0], [1.0, 2.0])
    ip, ids = route(topo, flows)
    for kernel, extra in ((_kernels.simulate_flows, ()), (_kernels.simulate_flows, (0,)),
                          (previous_kernel.simulate_flows, ())):
        kernel(ip, ids, flows.nbytes, flows.release, flows.lat_mult, topo.cap, topo.res_latency, 0, 1.0,
               0.0, 1e-9, 0.0, *extra)


def whole_replay(gpus: int, topologies: list[str], previous: bool) -> float:
    t = time.perf_counter()
    tables, _ = make_run_tables(hosts=gpus // 8, gpus_per_host=8, pp=2, ep=64, steps=1, straggler_rank=None)
    print(f"whole replay  {gpus:,} GPUs: {tables['events'].num_rows:,} events, "
          f"{tables['collectives'].num_rows:,} collective calls (synthesized in {time.perf_counter() - t:.1f} s)")
    calls: list[tuple[float, float, int]] = []
    real_simulate = engine.simulate

    def timed(topology, indptr, ids, flows, **kwargs):
        t0, c0 = time.perf_counter(), time.process_time()
        out = real_simulate(topology, indptr, ids, flows, **kwargs)
        calls.append((time.perf_counter() - t0, time.process_time() - c0, len(flows)))
        return out

    def run() -> tuple[float, float, engine.ReplayResult]:
        calls.clear()
        engine.simulate = rounds.simulate = timed
        try:
            t0, c0 = time.perf_counter(), time.process_time()
            result = engine.replay(tables, topologies)
            return time.perf_counter() - t0, time.process_time() - c0, result
        finally:
            engine.simulate = rounds.simulate = real_simulate

    wall, total, result = run()
    sim = sum(c for _, c, _ in calls)
    every = {r.n_flows for r in result.results}
    full = [c for _, c, n in calls if n in every]
    part = [(c, n) for _, c, n in calls if n not in every]
    flows = ", ".join(f"{r.n_flows:,}" for r in result.results)
    print(f"              replay() {total:.1f} s CPU ({wall:.1f} s wall) on {len(topologies)} "
          f"topolog{'y' if len(topologies) == 1 else 'ies'} ({flows} flows each): {len(calls)} simulations "
          f"{sim:.1f} s CPU: {len(full)} of every flow ({', '.join(f'{c:.1f}' for c in full)}), {len(part)} of "
          f"the parts a round moved ({sum(n for _, n in part):,} flows, {sum(c for c, _ in part):.1f} s); "
          f"everything else {total - sim:.1f} s CPU; peak RSS {rss_mib():,.0f} MiB", flush=True)
    for r in result.results:
        cv = r.convergence
        print(f"              fixed point on {r.topology}: {cv.rounds} rounds, start moves "
              f"{', '.join(f'{m / 1e3:.1f}' for m in cv.moves_ns)} us (tolerance {cv.tolerance_ns / 1e3:.1f} us): "
              f"{'settled' if cv.converged else 'NOT SETTLED'}", flush=True)
    if previous:
        kernel = _kernels.simulate_flows
        _kernels.simulate_flows = previous_kernel.simulate_flows
        try:
            prev_wall, prev_total, _ = run()
        finally:
            _kernels.simulate_flows = kernel
        print(f"              previous kernel: replay() {prev_total:.1f} s CPU ({prev_wall:.1f} s wall), "
              f"{len(calls)} simulations {sum(c for _, c, _ in calls):.1f} s CPU; ratio {prev_total / total:.2f}x",
              flush=True)
    return total


def all_to_all(n: int, seed: int = 0, skew: float = 0.5) -> tuple:
    """One all-to-all over n GPUs, all flows released at once; bytes per flow proportional to the
    destination expert's popularity (Dirichlet(skew)), Poisson-distributed."""
    topo = build(parse_spec(f"{TOPOLOGY}:hosts={max(1, n // 8)}"))
    rng = np.random.default_rng(seed)
    src, dst = np.divmod(np.arange(n * n), n)
    keep = src != dst
    load = rng.dirichlet(np.full(n, skew)) * n
    nbytes = rng.poisson(load[dst[keep]] * 2**12).astype(np.float64) * 16 + 16
    flows = Flows.from_lists(src[keep], dst[keep], nbytes, channel=np.arange(int(keep.sum())))
    return topo, flows, *route(topo, flows)


def run_kernel(kernel, topo, flows, ip, ids, *extra) -> tuple[np.ndarray, float, float]:
    """Finish times, wall and CPU seconds of one simulation (200 windows of 10 us)."""
    t, c = time.perf_counter(), time.process_time()
    finish, _ = kernel(ip, ids, flows.nbytes, flows.release, flows.lat_mult, topo.cap, topo.res_latency, 200,
                       1e4, 0.0, 1e-9, 0.0, *extra)
    return finish, time.perf_counter() - t, time.process_time() - c


def all_to_all_case(sizes: list[int], previous: bool, lazy_off: bool = True) -> tuple[float, float]:
    counts, times, times_plain, times_prev = [], [], [], []
    for n in sizes:
        topo, flows, ip, ids = all_to_all(n)
        fast, t_fast, c_fast = run_kernel(_kernels.simulate_flows, topo, flows, ip, ids)
        counts.append(len(flows))
        times.append(c_fast)
        line = (f"all-to-all    {n:>5,} GPUs, {len(flows):>9,} flows active at once: {c_fast:6.2f} s CPU "
                f"({t_fast:.2f} s wall), makespan {np.max(fast) / 1e6:.2f} ms")
        if lazy_off:
            plain, t_plain, c_plain = run_kernel(_kernels.simulate_flows, topo, flows, ip, ids, 0)
            times_plain.append(c_plain)
            diff = float(np.max(np.abs(fast - plain) / plain))
            line += (f"; lazy classes off {c_plain:.2f} s CPU ({t_plain:.2f} s wall), ratio "
                     f"{c_plain / c_fast:.2f}x, max rel diff {diff:.1e}")
        if previous:
            slow, t_slow, c_slow = run_kernel(previous_kernel.simulate_flows, topo, flows, ip, ids)
            times_prev.append(c_slow)
            diff = float(np.max(np.abs(fast - slow) / slow))
            line += (f"; previous kernel {c_slow:.2f} s CPU ({t_slow:.2f} s wall), ratio {c_slow / c_fast:.2f}x, "
                     f"max rel diff {diff:.1e}")
        print(line, flush=True)
    def fit(ts: list[float]) -> float:
        fitted = growth_exponent(counts, ts) if len(ts) == len(counts) else None
        return float("nan") if fitted is None else fitted

    exponent = fit(times)
    others = "".join(f"; {name} {fit(ts):.2f}" for name, ts in (("lazy classes off", times_plain),
                                                                 ("previous kernel", times_prev)) if ts)
    print(f"              growth exponent of CPU time in flows {exponent:.2f}{others} (fit over {len(sizes)} sizes, "
          "same run; 1 = linear)")
    return times[-1], exponent


def naive_check(n: int) -> None:
    from naive import simulate_naive

    topo = build(parse_spec("rail-optimized:hosts=8,gpus=8"))
    rng = np.random.default_rng(1)
    src = rng.integers(0, 64, n)
    dst = (src + rng.integers(1, 64, n)) % 64
    flows = Flows.from_lists(src, dst, rng.uniform(1e5, 2e6, n), release=np.sort(rng.uniform(0, n * 2_000, n)))
    indptr, ids = route(topo, flows)
    t = time.perf_counter()
    fast = simulate(topo, indptr, ids, flows).finish
    t_fast = time.perf_counter() - t
    t = time.perf_counter()
    slow = simulate_naive(indptr, ids, flows.nbytes, flows.release, flows.lat_mult, topo.cap, topo.res_latency)
    t_slow = time.perf_counter() - t
    err = float(np.nanmax(np.abs(fast - slow) / slow))
    print(f"naive twin    {n:,} flows: max rel diff {err:.1e} (kernel {t_fast:.3f} s, twin {t_slow:.1f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=1024, help="GPUs of the whole-replay case (0: skip)")
    parser.add_argument("--topology", action="append", help=f"topologies of the whole replay (default {TOPOLOGY})")
    parser.add_argument("--a2a", default="256,512,1024", help="GPU counts of the all-to-all case ('' skips it)")
    parser.add_argument("--naive-flows", type=int, default=2_000, help="0 skips the naive twin check")
    parser.add_argument("--skip-previous", action="store_true", help="do not run the previous kernel")
    parser.add_argument("--previous-replay", action="store_true",
                        help="also run the whole replay with the previous kernel (slow)")
    args = parser.parse_args()

    warm()
    checks = []
    if args.a2a:
        t_a2a, exponent = all_to_all_case([int(x) for x in args.a2a.split(",")], not args.skip_previous)
        checks.append(f"all-to-all {t_a2a:.1f} s < 30 s: {'ok' if t_a2a < 30 else 'MISSED'}")
        checks.append(f"exponent {exponent:.2f} <= 1.2: {'ok' if exponent <= 1.2 else 'MISSED'}")
    if args.gpus:
        limit = 30 if args.gpus <= 1024 else 60
        t_rep = whole_replay(args.gpus, args.topology or [TOPOLOGY], args.previous_replay)
        checks.append(f"whole replay {t_rep:.1f} s < {limit} s: {'ok' if t_rep < limit else 'MISSED'}")
    if args.naive_flows:
        naive_check(args.naive_flows)
    print(f"peak RSS      {rss_mib():,.0f} MiB")
    print("target        " + "; ".join(checks))


if __name__ == "__main__":
    main()
