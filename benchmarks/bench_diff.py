"""Benchmark: `tracekit diff` of two 1,024-rank runs, against the analysis of one of them.

Usage::

    python benchmarks/bench_diff.py [--hosts 128] [--gpus 8] [--steps 2]

Two synthetic DP x PP x EP runs (tracekit.synth; the second with one NIC 4x slower) are written
as run directories; then, each in a fresh process so that peak RSS is its own, `analyze` runs on
the first, and `diff_runs` on the pair (it analyses both, then matches and compares). Prints wall
time, CPU time and peak RSS of each, their ratios, and the diff's verdict. Target: the diff under
2.5x the CPU of one analysis (two analyses and the comparison) and under 1.5x its peak RSS.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

CPU_RATIO = 2.5
RSS_RATIO = 1.5


def _peak_rss_mib() -> float:
    from _rss import peak_rss_mb

    return peak_rss_mb()


def _analysis(a: str, b: str, out: Any) -> None:
    from tracekit.analysis import analyze

    t0, c0 = time.perf_counter(), time.process_time()
    result = analyze(a, write=False)
    out.put({"seconds": time.perf_counter() - t0, "cpu": time.process_time() - c0, "rss_mib": _peak_rss_mib(),
             "text": f"{result.instances.num_rows:,} instances"})


def _diff(a: str, b: str, out: Any) -> None:
    from tracekit.diff import diff_runs

    t0, c0 = time.perf_counter(), time.process_time()
    result = diff_runs(a, b)
    out.put({"seconds": time.perf_counter() - t0, "cpu": time.process_time() - c0, "rss_mib": _peak_rss_mib(),
             "text": result.verdict})


def _child(target: Any, a: str, b: str) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=target, args=(a, b, q))
    p.start()
    res = q.get()
    p.join()
    return res


def _make(spec: Any, out: str) -> int:
    from tracekit.synth import make_run_tables, write_run

    tables, _ = make_run_tables(spec)
    for name, col in (("collectives", "instance"), ("ranks", "clock_offset_ns"), ("groups", "dims")):
        t = tables[name]
        i = t.schema.get_field_index(col)
        tables[name] = t.set_column(i, t.schema.field(i), pa.nulls(t.num_rows, t.schema.field(i).type))
    write_run(tables, out)
    return tables["events"].num_rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=128)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--steps", type=int, default=2)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).parent))
    from tracekit.synth import SynthSpec

    spec = SynthSpec(hosts=args.hosts, gpus_per_host=args.gpus, pp=4, ep=8, steps=args.steps, seed=1,
                     straggler_rank=None)
    with tempfile.TemporaryDirectory() as tmp:
        a, b = str(Path(tmp) / "a"), str(Path(tmp) / "b")
        t0 = time.perf_counter()
        events = _make(spec, a)
        _make(SynthSpec(**{**spec.__dict__, "slow_nic_rank": spec.world // 2 + 3}), b)
        print(f"two synthetic runs: {spec.world} ranks, {spec.steps} step(s), {events:,} events each "
              f"({time.perf_counter() - t0:.1f} s to make)")
        one = _child(_analysis, a, b)
        print(f"analyze A: {one['seconds']:6.2f} s  {one['cpu']:6.2f} s CPU  peak RSS {one['rss_mib']:7.0f} MiB  "
              f"({one['text']})")
        d = _child(_diff, a, b)
        print(f"diff A B:  {d['seconds']:6.2f} s  {d['cpu']:6.2f} s CPU  peak RSS {d['rss_mib']:7.0f} MiB")
        cpu, rss = d["cpu"] / one["cpu"], d["rss_mib"] / one["rss_mib"]
        print(f"ratio:     diff / one analysis: {cpu:.2f}x the CPU, {rss:.2f}x the peak RSS")
        print(f"verdict:   {d['text']}")
    ok = cpu < CPU_RATIO and rss < RSS_RATIO
    print(f"target (< {CPU_RATIO}x CPU, < {RSS_RATIO}x peak RSS): {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
