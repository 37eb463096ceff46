"""Benchmark what a user waits for: `tracekit --help`, `--version`, and the main job warm (the
README's `tracekit replay` of the bundled sample on three topologies with `--report`, its ingest
cache and numba kernels already made), against `python -c pass`, all in the same run.

    python benchmarks/bench_startup.py                        # this interpreter's tracekit, 5 runs each
    python benchmarks/bench_startup.py --python /tmp/base/bin/python --python /tmp/new/bin/python

Each interpreter runs the commands in turn (interleaved, so load changes hit all alike) after one
untimed warm-up; the table gives the median wall and CPU (user + system of the child) seconds, and
each command's ratio to `python -c pass` and to `tracekit --version` of the same interpreter.
Every command runs in a private directory (so `-m tracekit` never imports a checkout from the
current directory) with its interpreter's own bytecode cache (`PYTHONPYCACHEPREFIX`, written by
the warm-up even where `PYTHONDONTWRITEBYTECODE` is set, as a user's install has its `.pyc`
files); `--no-bytecode-cache` keeps the environment's setting.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "sample_traces" / "synth_moe_16rank"
TOPOLOGIES = ["rail-optimized:nic_gbps=400", "rail-optimized:nic_gbps=400,sharp=true",
              "fat-tree:nic_gbps=100,oversub=4"]


def commands(python: str, work: Path) -> dict[str, list[str]]:
    """The timed commands for one interpreter; the main job writes into `work`."""
    main_job = [python, "-m", "tracekit", "replay", str(SAMPLE), *[a for t in TOPOLOGIES for a in ("--topology", t)],
                "--cache", str(work / "cache"), "--report", str(work / "report.html")]
    return {"python -c pass": [python, "-c", "pass"],
            "tracekit --version": [python, "-m", "tracekit", "--version"],
            "tracekit --help": [python, "-m", "tracekit", "--help"],
            "main job (warm)": main_job}


def environment(work: Path, bytecode_cache: bool) -> dict[str, str]:
    """The children's environment: no progress lines, and a bytecode cache of their own in `work`."""
    env = {**os.environ, "TRACEKIT_NO_PROGRESS": "1"}
    if bytecode_cache:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(work / "pycache")
    return env


def timed(argv: list[str], work: Path, env: dict[str, str]) -> tuple[float, float]:
    """(wall, CPU) seconds of one run of `argv` in `work`; a failing command stops the benchmark."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=work, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", action="append", default=None,
                    help="An interpreter whose tracekit to time (repeat to compare checkouts; default: this one).")
    ap.add_argument("--repeat", type=int, default=5, help="Timed runs of each command (median shown).")
    ap.add_argument("--no-bytecode-cache", action="store_true",
                    help="Run with the environment's bytecode setting (e.g. PYTHONDONTWRITEBYTECODE) instead of "
                         "a private cache per interpreter.")
    args = ap.parse_args()
    pythons = args.python or [sys.executable]
    with tempfile.TemporaryDirectory(prefix="tk-bench-startup-") as tmp:
        plans = {}
        places = {}
        for i, py in enumerate(pythons):
            work = Path(tmp) / str(i)
            work.mkdir()
            plans[py] = commands(py, work)
            places[py] = work, environment(work, not args.no_bytecode_cache)
            for argv in plans[py].values():
                timed(argv, *places[py])  # warm-up: the ingest cache, numba's and Python's caches, the page cache
        samples: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for _ in range(args.repeat):
            for py, plan in plans.items():
                for label, argv in plan.items():
                    samples.setdefault((py, label), []).append(timed(argv, *places[py]))
    print(f"{'interpreter':40s} {'command':20s} {'wall s':>8s} {'CPU s':>8s} {'CPU / pass':>10s} "
          f"{'CPU / --version':>15s}")
    for py, plan in plans.items():
        floor = statistics.median(c for _, c in samples[(py, "python -c pass")])
        version = statistics.median(c for _, c in samples[(py, "tracekit --version")])
        for label in plan:
            wall = statistics.median(w for w, _ in samples[(py, label)])
            cpu = statistics.median(c for _, c in samples[(py, label)])
            print(f"{py[-40:]:40s} {label:20s} {wall:8.3f} {cpu:8.3f} {cpu / floor:10.1f} {cpu / version:15.1f}")
    cache = "the environment's bytecode setting" if args.no_bytecode_cache else "a bytecode cache per interpreter"
    print(f"(median of {args.repeat}; {cache}; load average {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
