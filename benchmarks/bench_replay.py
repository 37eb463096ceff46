"""Replay benchmark: the flow simulator at scale, against a baseline revision in the same run.

Two cases:

1. A whole `replay()` of one synthetic training step (`make_run_tables`: DP x PP=2 x EP=64, skewed
   experts) on `dgx-h100-superpod`, counting every simulation it runs (the calibration run and the
   schedule/simulate rounds) and the time spent outside them. `--gpus 1024` (default; target
   < 30 s) or `--gpus 4096` (target < 60 s).
2. One skewed all-to-all (Dirichlet(0.5) expert popularity) over N GPUs with all N(N-1) flows
   released at once, at three sizes (default 256, 512, 1,024 GPUs: 65k, 262k and 1.05M flows).
   Prints the growth exponent of simulation time in flows (`_growth.growth_exponent`, a
   least-squares fit of log time on log flows; 1 is linear) of this kernel and, measured in the
   same run, of the baselines below, the speed ratio to each baseline revision's kernel on the
   same routed flows and to this kernel with its lazy rate classes switched off (`lazy_min=0`:
   every class event flow by flow), with the largest relative difference between the kernels'
   completion times. Target: 1M flows < 30 s.

A baseline is a git revision (`--baseline REV`, repeatable; default 22bb94d, the kernel before the
rounds' release-at-finish change 969ea55; 5c2e060 is the kernel before the scale work) checked out in a
worktree and imported by a worker subprocess (`_baseline.py`); this kernel and the baseline's
alternate, `--repeat` times each, and the least CPU time of each is compared.

A last line checks the kernel against the naive Python twin (tests/replay/naive.py) on a small
random case (correctness, not speed).

    python benchmarks/bench_replay.py [--gpus 1024] [--a2a 256,512,1024] [--baseline REV] [--no-baseline]
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "replay"))

from _baseline import Worker, serve  # noqa: E402
from _growth import growth_exponent  # noqa: E402

from tracekit.replay import _kernels, engine  # noqa: E402
from tracekit.replay.simulate import Flows, route, simulate  # noqa: E402
from tracekit.replay.topology import build, parse_spec  # noqa: E402
from tracekit.synth import make_run_tables  # noqa: E402

TOPOLOGY = "dgx-h100-superpod"


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def warm(lazy_off: bool = True) -> dict:
    """Compile (or load from the cache) the kernel outside the timed regions (`lazy_off`: also its
    variant with the lazy classes off, which a baseline before them lacks)."""
    topo = build(parse_spec("single-switch:hosts=2,gpus=1"))
    flows = Flows.from_lists([0, 1], [1, 0], [1.0, 2.0])
    ip, ids = route(topo, flows)
    for extra in ((), (0,)) if lazy_off else ((),):
        _kernels.simulate_flows(ip, ids, flows.nbytes, flows.release, flows.lat_mult, topo.cap, topo.res_latency,
                                0, 1.0, 0.0, 1e-9, 0.0, *extra)
    return {}


def replay_once(gpus: int, topologies: list[str]) -> dict:
    """One whole `replay()` of the synthetic step: CPU and wall seconds, and per simulation it ran
    (CPU seconds, flows); the fixed point per topology."""
    tables, _ = make_run_tables(hosts=gpus // 8, gpus_per_host=8, pp=2, ep=64, steps=1, straggler_rank=None)
    try:
        from tracekit.replay import rounds
    except ImportError:  # a baseline from before the rounds
        rounds = engine
    calls: list[tuple[float, int]] = []
    real_simulate = engine.simulate

    def timed(topology, indptr, ids, flows, **kwargs):
        c0 = time.process_time()
        out = real_simulate(topology, indptr, ids, flows, **kwargs)
        calls.append((time.process_time() - c0, len(flows)))
        return out

    engine.simulate = rounds.simulate = timed
    try:
        t0, c0 = time.perf_counter(), time.process_time()
        result = engine.replay(tables, topologies)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        engine.simulate = rounds.simulate = real_simulate
    return {"wall": wall, "cpu": cpu, "calls": calls, "events": tables["events"].num_rows,
            "collectives": tables["collectives"].num_rows,
            "results": [{"topology": r.topology, "n_flows": r.n_flows, "rounds": r.convergence.rounds,
                         "moves_ns": list(r.convergence.moves_ns), "tolerance_ns": r.convergence.tolerance_ns,
                         "converged": r.convergence.converged} for r in result.results]}


def whole_replay(gpus: int, topologies: list[str], baselines: list[Worker], repeat: int) -> float:
    """The whole replay with this code and each baseline, alternating; the least CPU time of each."""
    best: dict[str, dict] = {}
    for _ in range(repeat):
        for name, run in [("this", lambda: replay_once(gpus, topologies))] + [
                (w.revision, lambda w=w: w.call(op="replay", gpus=gpus, topologies=topologies)) for w in baselines]:
            out = run()
            if name not in best or out["cpu"] < best[name]["cpu"]:
                best[name] = out
    mine = best["this"]
    calls = mine["calls"]
    sim = sum(c for c, _ in calls)
    every = {r["n_flows"] for r in mine["results"]}
    full = [c for c, n in calls if n in every]
    part = [(c, n) for c, n in calls if n not in every]
    flows = ", ".join(f"{r['n_flows']:,}" for r in mine["results"])
    total = mine["cpu"]
    print(f"whole replay  {gpus:,} GPUs: {mine['events']:,} events, {mine['collectives']:,} collective calls")
    print(f"              replay() {total:.1f} s CPU ({mine['wall']:.1f} s wall) on {len(topologies)} "
          f"topolog{'y' if len(topologies) == 1 else 'ies'} ({flows} flows each): {len(calls)} simulations "
          f"{sim:.1f} s CPU: {len(full)} of every flow ({', '.join(f'{c:.1f}' for c in full)}), {len(part)} of "
          f"the parts a round moved ({sum(n for _, n in part):,} flows, {sum(c for c, _ in part):.1f} s); "
          f"everything else {total - sim:.1f} s CPU; peak RSS {rss_mib():,.0f} MiB", flush=True)
    for r in mine["results"]:
        print(f"              fixed point on {r['topology']}: {r['rounds']} rounds, start moves "
              f"{', '.join(f'{m / 1e3:.1f}' for m in r['moves_ns'])} us (tolerance {r['tolerance_ns'] / 1e3:.1f} us): "
              f"{'settled' if r['converged'] else 'NOT SETTLED'}", flush=True)
    for w in baselines:
        base = best[w.revision]
        same = [(r["n_flows"], r["rounds"]) for r in base["results"]] == [
            (r["n_flows"], r["rounds"]) for r in mine["results"]]
        print(f"              baseline {w.revision}: replay() {base['cpu']:.1f} s CPU ({base['wall']:.1f} s wall), "
              f"{len(base['calls'])} simulations {sum(c for c, _ in base['calls']):.1f} s CPU; ratio "
              f"{base['cpu'] / total:.3f}x (least of {repeat}); flows and rounds "
              f"{'the same' if same else 'DIFFER'}", flush=True)
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
    return kernel_once(ip, ids, flows.nbytes, flows.release, flows.lat_mult, topo.cap, topo.res_latency, *extra,
                       kernel=kernel)


def kernel_once(ip, ids, nbytes, release, lat_mult, cap, res_latency, *extra, kernel=None):
    kernel = kernel or _kernels.simulate_flows
    t, c = time.perf_counter(), time.process_time()
    finish, _ = kernel(ip, ids, nbytes, release, lat_mult, cap, res_latency, 200, 1e4, 0.0, 1e-9, 0.0, *extra)
    return finish, time.perf_counter() - t, time.process_time() - c


INPUTS = ("ip", "ids", "nbytes", "release", "lat_mult", "cap", "res_latency")


def kernel_request(inputs: str, output: str) -> dict:
    """The worker's side of one all-to-all: the parent's routed flows in, finish times out."""
    with np.load(inputs) as arrays:
        finish, wall, cpu = kernel_once(*(arrays[k] for k in INPUTS))
    np.save(output, finish)
    return {"wall": wall, "cpu": cpu}


def all_to_all_case(sizes: list[int], baselines: list[Worker], repeat: int,
                    lazy_off: bool = True) -> tuple[float, float]:
    counts, times, times_plain = [], [], []
    times_base: dict[str, list[float]] = {w.revision: [] for w in baselines}
    scratch = Path(tempfile.mkdtemp(prefix="bench-replay-"))
    for n in sizes:
        topo, flows, ip, ids = all_to_all(n)
        inputs = scratch / f"a2a{n}.npz"
        np.savez(inputs, ip=ip, ids=ids, nbytes=flows.nbytes, release=flows.release, lat_mult=flows.lat_mult,
                 cap=topo.cap, res_latency=topo.res_latency)
        c_fast, t_fast = np.inf, np.inf
        base: dict[str, tuple[float, float, np.ndarray]] = {}
        for _ in range(repeat):  # this kernel and each baseline in turn, the least CPU time of each
            fast, t, c = run_kernel(_kernels.simulate_flows, topo, flows, ip, ids)
            if c < c_fast:
                c_fast, t_fast = c, t
            for w in baselines:
                out = scratch / f"a2a{n}-{w.revision}.npy"
                reply = w.call(op="kernel", inputs=str(inputs), output=str(out))
                if w.revision not in base or reply["cpu"] < base[w.revision][0]:
                    base[w.revision] = (reply["cpu"], reply["wall"], np.load(out))
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
        for rev, (c_slow, t_slow, slow) in base.items():
            times_base[rev].append(c_slow)
            diff = float(np.max(np.abs(fast - slow) / slow))
            same = "bit for bit the same" if np.array_equal(fast, slow) else f"max rel diff {diff:.1e}"
            line += (f"; baseline {rev} {c_slow:.2f} s CPU ({t_slow:.2f} s wall), ratio {c_slow / c_fast:.3f}x, "
                     f"{same}")
        print(line + (f" (least of {repeat})" if repeat > 1 else ""), flush=True)
    for f in scratch.iterdir():
        f.unlink()
    scratch.rmdir()

    def fit(ts: list[float]) -> float:
        fitted = growth_exponent(counts, ts) if len(ts) == len(counts) else None
        return float("nan") if fitted is None else fitted

    exponent = fit(times)
    others = "".join(f"; {name} {fit(ts):.2f}" for name, ts in [("lazy classes off", times_plain)] + [
        (f"baseline {rev}", ts) for rev, ts in times_base.items()] if ts)
    ratios = "".join(f"; CPU ratio baseline {rev} / this over all sizes {sum(ts) / sum(times):.3f}x"
                     for rev, ts in times_base.items())
    print(f"              growth exponent of CPU time in flows {exponent:.2f}{others} (fit over {len(sizes)} sizes, "
          f"same run; 1 = linear){ratios}")
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
    parser.add_argument("--baseline", action="append",
                        help="git revision to measure against in the same run (repeatable; default 22bb94d)")
    parser.add_argument("--no-baseline", action="store_true", help="run no baseline")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each contender, alternating (least CPU kept)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        serve({"warm": warm, "kernel": kernel_request, "replay": replay_once})
        return

    warm()
    baselines = [] if args.no_baseline else [Worker(Path(__file__), rev) for rev in args.baseline or ["22bb94d"]]
    for w in baselines:
        w.call(op="warm", lazy_off=False)
    checks = []
    try:
        if args.a2a:
            t_a2a, exponent = all_to_all_case([int(x) for x in args.a2a.split(",")], baselines, args.repeat)
            checks.append(f"all-to-all {t_a2a:.1f} s < 30 s: {'ok' if t_a2a < 30 else 'MISSED'}")
            checks.append(f"exponent {exponent:.2f} <= 1.2: {'ok' if exponent <= 1.2 else 'MISSED'}")
        if args.gpus:
            limit = 30 if args.gpus <= 1024 else 60
            t_rep = whole_replay(args.gpus, args.topology or [TOPOLOGY], baselines, args.repeat)
            checks.append(f"whole replay {t_rep:.1f} s < {limit} s: {'ok' if t_rep < limit else 'MISSED'}")
    finally:
        for w in baselines:
            w.close()
    if args.naive_flows:
        naive_check(args.naive_flows)
    print(f"peak RSS      {rss_mib():,.0f} MiB")
    print("target        " + "; ".join(checks))


if __name__ == "__main__":
    main()
