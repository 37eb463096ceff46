"""Write a project-made nccl-tests output of a degraded 2-host run (not a measurement).

Two hosts with one GPU each (a DGX Spark-like pair, one 200 Gb/s NIC per GPU) run all_reduce_perf;
the times follow `25 us + S / 2.8 GB/s`, the plateau a mis-cabled pair shows, where the fabric
should give about 22 GB/s. `tracekit replay --nccl-tests` must call this run degraded.

    python sample_traces/make_nccl_tests_degraded.py --out sample_traces/nccl_tests
"""

from __future__ import annotations

import argparse
from pathlib import Path

LATENCY_US = 25.0
BUSBW_GBS = 2.8  # all-reduce on 2 ranks: busbw = algbw
NAME = "all_reduce_perf_2x1_degraded.txt"


def lines() -> list[str]:
    head = ["# nThread 1 nGpus 1 minBytes 1024 maxBytes 1073741824 step: 4(factor) warmup iters: 5 iters: 20 "
            "agg iters: 1 validation: 1 graph: 0",
            "#",
            "# Using devices",
            "#  Rank  0 Group  0 Pid  41001 on spark-a device  0 [000f:01:00] NVIDIA GB10",
            "#  Rank  1 Group  0 Pid  52002 on spark-b device  0 [000f:01:00] NVIDIA GB10",
            "#",
            "#                                                              out-of-place                       "
            "in-place          ",
            "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   "
            "busbw #wrong",
            "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  "
            "(GB/s)       "]
    rows = []
    size = 1024
    while size <= 2**30:
        oop = LATENCY_US + size / (BUSBW_GBS * 1e3)
        inp = oop * 1.01
        cells = [f"{size:>12}", f"{size // 4:>13}", f"{'float':>9}", f"{'sum':>7}", f"{-1:>7}"]
        for t in (oop, inp):
            bw = size / t / 1e3
            cells += [f"{t:>8.1f}", f"{bw:>7.2f}", f"{bw:>7.2f}", f"{0:>6}"]
        rows.append(" ".join(cells))
        size *= 4
    tail = ["# Out of bounds values : 0 OK", f"# Avg bus bandwidth    : {BUSBW_GBS:.3f} ", "#"]
    return head + rows + tail


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "nccl_tests")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / NAME).write_text("\n".join(lines()) + "\n")


if __name__ == "__main__":
    main()
