"""Benchmark: full cross-rank analysis of a synthetic 1,024-rank step, against a naive baseline.

Usage::

    python benchmarks/bench_analyze.py [--hosts 128] [--gpus 8] [--steps 1] [--no-naive]

A synthetic DP x PP x EP run (tracekit.synth) is written as a run directory; then, each in a fresh
process so that peak RSS is its own, `tracekit.analysis.analyze` runs on it, and so does a
naive per-rank Python loop doing the core of the same work (per-instance waits, clock offsets by
rank-by-rank medians, per-rank interval unions for compute/comm/overlap). Prints wall time and
peak RSS of each and their ratios. Target: the analysis under 10 s and 4 GiB on 2 cores.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _fast(run_dir: str, out: Any) -> None:
    from tracekit.analysis import analyze

    t0 = time.perf_counter()
    result = analyze(run_dir, write=False)
    out.put({"seconds": time.perf_counter() - t0, "rss_mib": _peak_rss_mib(),
             "instances": result.instances.num_rows, "findings": result.findings[:2]})


def _union(iv: list[tuple[int, int]]) -> list[list[int]]:
    merged: list[list[int]] = []
    for s, e in sorted(iv):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return merged


def _overlap(a: list[list[int]], b: list[list[int]]) -> int:
    i = j = total = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def _naive(run_dir: str, out: Any) -> None:
    from tracekit.store import Run

    t0 = time.perf_counter()
    run = Run(run_dir)
    coll = run.table("collectives").select(["rank", "group", "seq", "op", "ts_ns", "dur_ns", "dim"]).to_pylist()
    # instances by (group, seq); p2p by (group, seq) too (the synthetic run numbers them alike)
    inst: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for c in coll:
        inst.setdefault((c["group"], c["seq"]), []).append(c)
    ranks = sorted({c["rank"] for c in coll})
    offset = dict.fromkeys(ranks, 0.0)
    for _ in range(20):
        common = {k: statistics.median(c["ts_ns"] + c["dur_ns"] + offset[c["rank"]] for c in v)
                  for k, v in inst.items() if len(v) > 1}
        per_rank: dict[int, list[float]] = {r: [] for r in ranks}
        for k, v in inst.items():
            if k in common:
                for c in v:
                    per_rank[c["rank"]].append(common[k] - c["ts_ns"] - c["dur_ns"])
        offset = {r: statistics.median(x) if x else 0.0 for r, x in per_rank.items()}
    waits = {}
    for k, v in inst.items():
        arr = {c["rank"]: c["ts_ns"] + offset[c["rank"]] for c in v}
        last = max(arr.values())
        waits[k] = (max(arr, key=arr.get), last - min(arr.values()))
    breakdown = {}
    for r in ranks:
        ev = run.events([r]).select(["kind", "ts_ns", "dur_ns", "coll_id"]).to_pylist()
        dims = {}
        for c in (c for c in coll if c["rank"] == r):
            dims.setdefault(c["dim"] or "OTHER", []).append((c["ts_ns"], c["ts_ns"] + c["dur_ns"]))
        comp = _union([(e["ts_ns"], e["ts_ns"] + e["dur_ns"]) for e in ev if e["kind"] == "compute"])
        breakdown[r] = {d: (sum(e - s for s, e in _union(iv)), _overlap(_union(iv), comp)) for d, iv in dims.items()}
    out.put({"seconds": time.perf_counter() - t0, "rss_mib": _peak_rss_mib(), "instances": len(waits)})


def _child(target: Any, run_dir: str) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=target, args=(run_dir, q))
    p.start()
    res = q.get()
    p.join()
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=128)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--pp", type=int, default=4)
    ap.add_argument("--ep", type=int, default=8)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--layers", type=int, default=4, help="Layers per stage.")
    ap.add_argument("--micro-batches", type=int, default=4)
    ap.add_argument("--kernels", type=int, default=16, help="Compute kernels per block.")
    ap.add_argument("--no-naive", action="store_true", help="Skip the naive baseline.")
    args = ap.parse_args(argv)

    from tracekit.synth import SynthSpec, make_run_tables, write_run

    spec = SynthSpec(hosts=args.hosts, gpus_per_host=args.gpus, pp=args.pp, ep=args.ep, steps=args.steps,
                     layers_per_stage=args.layers, micro_batches=args.micro_batches,
                     kernels_per_block=args.kernels)
    t0 = time.perf_counter()
    tables, _ = make_run_tables(spec)
    for name in ("collectives", "ranks", "groups"):  # what the analysis must find itself
        t = tables[name]
        col = {"collectives": "instance", "ranks": "clock_offset_ns", "groups": "dims"}[name]
        i = t.schema.get_field_index(col)
        tables[name] = t.set_column(i, t.schema.field(i), pa.nulls(t.num_rows, t.schema.field(i).type))
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = str(Path(tmp) / "run")
        write_run(tables, run_dir)
        print(f"synthetic run: {spec.world} ranks, {spec.steps} step(s), {tables['events'].num_rows:,} events, "
              f"{tables['collectives'].num_rows:,} collective calls ({time.perf_counter() - t0:.1f} s to make)")
        del tables
        fast = _child(_fast, run_dir)
        print(f"analyze:  {fast['seconds']:6.2f} s  peak RSS {fast['rss_mib']:7.0f} MiB  "
              f"({fast['instances']:,} instances)")
        ok = fast["seconds"] < 10 and fast["rss_mib"] < 4096
        if not args.no_naive:
            naive = _child(_naive, run_dir)
            print(f"naive:    {naive['seconds']:6.2f} s  peak RSS {naive['rss_mib']:7.0f} MiB  "
                  f"(a subset of the work: waits, offsets, per-rank unions)")
            print(f"ratio:    analyze is {naive['seconds'] / fast['seconds']:.1f}x faster than naive, "
                  f"with {fast['rss_mib'] / naive['rss_mib']:.2f}x its peak RSS")
        print(f"target (< 10 s, < 4 GiB): {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
