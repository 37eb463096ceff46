"""Schedule what-if benchmark: CPU time of the README's seven `schedule:` scenarios on the bundled
16-rank sample after the baseline replay, against another checkout in the same run.

Each measurement runs in its own process, with the checkout first on its PYTHONPATH (so that
checkout's `tracekit` is imported): it loads the sample (ingest cached in --cache), replays the
baseline on `rail-optimized:nic_gbps=400` (not timed), runs the scenario once to compile the
kernels, replays the baseline again (not timed) and then times the seven scenarios on it. The
checkouts alternate, `--repeats` times each, and the medians are compared: the machine is shared,
so only the ratio of one run means anything. The scenarios' step times are printed too, so that
a speed-up that changed the output shows.

    python benchmarks/bench_schedule.py [--against DIR] [--repeats 3] [--cache DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SAMPLE = HERE.parent / "sample_traces" / "synth_moe_16rank"
TOPOLOGY = "rail-optimized:nic_gbps=400"
SCENARIOS = ("schedule:1f1b", "schedule:1f1b,microbatches=4", "schedule:interleaved-1f1b,microbatches=4",
             "schedule:zb-h1,microbatches=4", "schedule:dualpipe,microbatches=4", "schedule:dualpipev,microbatches=4",
             "schedule:dualpipe,microbatches=4,sm_share=0")


def one(cache: str) -> dict[str, object]:
    """The seven scenarios timed on a fresh baseline of the checkout in the working directory."""
    import tracekit
    from tracekit import workflows
    from tracekit.whatif import make_baseline, run_scenario

    print(tracekit.__file__, file=sys.stderr)
    tables = workflows.whatif_tables(workflows.open([SAMPLE], cache=cache))
    run_scenario(make_baseline(tables, TOPOLOGY), SCENARIOS[0])  # compile
    base = make_baseline(tables, TOPOLOGY)
    cpu = time.process_time()
    results = [run_scenario(base, s) for s in SCENARIOS]
    cpu = time.process_time() - cpu
    return {"cpu_s": cpu, "steps": [r.step_ns for r in results],
            "rounds": [r.details["replayed_rounds"] for r in results]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", default=None, help="Another checkout to measure in the same run.")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cache", default=None, help="Ingest cache of the sample (default: a temporary directory).")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child process
    args = ap.parse_args()
    cache = args.cache or tempfile.mkdtemp(prefix="bench-schedule-")
    if args.one:
        print(json.dumps(one(cache)))
        return
    checkouts = {"this": HERE.parent}
    if args.against:
        checkouts["against"] = Path(args.against).resolve()
    rows: dict[str, list[dict]] = {k: [] for k in checkouts}
    for _ in range(args.repeats):
        for name, root in checkouts.items():
            env = {**os.environ, "PYTHONPATH": str(root)}
            out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--one", "--cache", cache], cwd=root,
                                 env=env, check=True, capture_output=True, text=True).stdout
            rows[name].append(json.loads(out.strip().splitlines()[-1]))
            print(f"{name:>8}: {rows[name][-1]['cpu_s']:.2f} s CPU", flush=True)
    median = {k: statistics.median(r["cpu_s"] for r in v) for k, v in rows.items()}
    for name, root in checkouts.items():
        print(f"{name} ({root}): median {median[name]:.2f} s CPU over {args.repeats}; rounds "
              f"{rows[name][0]['rounds']}")
    if "against" in median:
        same = all(r["steps"] == rows["this"][0]["steps"] for v in rows.values() for r in v)
        print(f"ratio this/against: {median['this'] / median['against']:.2f}; step times identical: {same}")


if __name__ == "__main__":
    main()
