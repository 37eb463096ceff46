"""Replay benchmark: one training step on 1,024 GPUs (128 hosts x 8) with >= 1M flows.

Workload: EP all-to-all over 64 ranks (16 groups, skewed splits, dispatch + combine per layer),
DP ring all-reduce buckets (64 groups of 16), and PP send/recv between stage pairs. Prints the
flow count, routing and simulation time, peak RSS, and the speed ratio to the naive Python twin
(tests/replay/naive.py) on a 10k-flow case. Target: the exact simulation (merge 0) under 30 s on
two cores, and at least 50x the naive twin.

    python benchmarks/bench_replay.py [--layers 8] [--naive-flows 10000] [--skip-naive]
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import numpy as np

from tracekit.replay.decompose import Instance, decompose
from tracekit.replay.simulate import Flows, route, simulate
from tracekit.replay.topology import build, parse_spec

HOSTS, GPUS, EP, DP_GROUP = 128, 8, 64, 16


def workload(layers: int, seed: int = 0, skew: float = 0.5) -> tuple[list[Instance], np.ndarray]:
    """Instances and their release times (ns) for one step. Expert popularity is Dirichlet(skew)
    (smaller is more skewed; 0 gives uniform splits)."""
    rng = np.random.default_rng(seed)
    world = HOSTS * GPUS
    instances: list[Instance] = []
    release: list[float] = []
    t = 0.0
    for layer in range(layers):
        for phase in ("dispatch", "combine"):
            for g in range(world // EP):
                ranks = list(range(g * EP, (g + 1) * EP))
                if skew > 0:
                    load = rng.dirichlet(np.full(EP, skew)) * EP
                    splits = {r: list(rng.poisson(load * 2**16).astype(float) * 16) for r in ranks}
                else:
                    splits = {r: [float(2**20)] * EP for r in ranks}
                instances.append(Instance(len(instances), "all_to_all", ranks, 0.0, splits=splits,
                                          group=f"ep{g}"))
                release.append(t + rng.uniform(0, 20_000))
            t += 1_500_000 if phase == "dispatch" else 2_500_000
        for pair in range(world // 2):
            src = pair
            dst = pair + world // 2
            instances.append(Instance(len(instances), "send", [src, dst], 8 << 20, src=src, dst=dst))
            release.append(t - 500_000 + (layer % 2) * 100_000)
    for bucket in range(4):
        for g in range(world // DP_GROUP):
            ranks = [g % EP + EP * i for i in range(DP_GROUP)] if g < EP else list(range(g, world, EP))[:DP_GROUP]
            instances.append(Instance(len(instances), "all_reduce", ranks, 64 << 20, group=f"dp{g}"))
            release.append(t + bucket * 3_000_000)
    return instances, np.asarray(release)


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8, help="MoE layers (2 all-to-alls each)")
    parser.add_argument("--topology", default=f"dgx-h100-superpod:hosts={HOSTS}")
    parser.add_argument("--skew", type=float, default=0.5,
                        help="Dirichlet concentration of expert popularity (0: uniform all-to-all)")
    parser.add_argument("--naive-flows", type=int, default=10_000)
    parser.add_argument("--merge", default="0,0.01",
                        help="comma-separated relative merge windows (0: exact; others are compared to it)")
    parser.add_argument("--skip-naive", action="store_true")
    args = parser.parse_args()

    topo = build(parse_spec(args.topology))
    t = time.perf_counter()
    instances, release = workload(args.layers, skew=args.skew)
    gpu = np.arange(HOSTS * GPUS)
    flows = decompose(instances, topo, gpu)
    flows.release = release[flows.key]
    t_dec = time.perf_counter() - t
    # warm the JIT (cached on disk after the first run)
    small = Flows.from_lists([0, 9], [9, 0], [1.0, 1.0])
    simulate(topo, *route(topo, small), small)
    t = time.perf_counter()
    indptr, ids = route(topo, flows)
    t_route = time.perf_counter() - t
    print(f"topology      {args.topology}: {topo.n_gpus} GPUs, {topo.n_cables} links, {topo.cap.size} resources")
    print(f"flows         {len(flows):,} ({len(instances):,} instances, {ids.size:,} flow-hops, "
          f"expert skew {args.skew:g})")
    print(f"decompose     {t_dec:.2f} s")
    print(f"route         {t_route:.2f} s")
    reference = None
    t_exact = None
    window = float(np.nanmax(release) / 150 + 1)
    for q in (float(x) for x in args.merge.split(",")):
        t = time.perf_counter()
        out = simulate(topo, indptr, ids, flows, n_windows=200, window_ns=window, merge=q)
        t_sim = time.perf_counter() - t
        fct = out.finish - flows.release
        line = (f"simulate      merge {q:<5g}: {t_sim:7.2f} s  ({len(flows) / t_sim:,.0f} flows/s), "
                f"makespan {np.nanmax(out.finish) / 1e6:.3f} ms")
        if reference is None:
            reference = fct
            t_exact = t_sim if q == 0 else None
        else:
            rel = np.abs(fct - reference) / reference
            line += (f", flow completion time vs exact: median {np.median(rel):.1e}, "
                     f"p99 {np.percentile(rel, 99):.1e}, max {rel.max():.1e}")
        print(line, flush=True)
    print(f"peak RSS      {rss_mib():,.0f} MiB")
    ratio = None if args.skip_naive else naive_ratio(args.naive_flows)
    checks = []
    if t_exact is not None:
        checks.append(f"exact {t_exact:.1f} s < 30 s: {'ok' if t_exact < 30 else 'MISSED'}")
    if ratio is not None:
        checks.append(f"naive ratio {ratio:,.0f}x >= 50x: {'ok' if ratio >= 50 else 'MISSED'}")
    if checks:
        print("target        " + "; ".join(checks))


def naive_ratio(n: int) -> float:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "replay"))
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
    print(f"naive twin    {n:,} flows: kernel {t_fast:.3f} s, naive {t_slow:.1f} s, "
          f"ratio {t_slow / t_fast:,.0f}x, max rel diff {err:.1e}")
    return t_slow / t_fast


if __name__ == "__main__":
    main()
