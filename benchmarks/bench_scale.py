"""Scale what-if benchmark: time and peak RSS of `scale:dp=K` from the bundled 16-rank sample at
1,024, 4,096 and 16,384 simulated GPUs, with the growth exponents in simulated GPUs.

Each size runs in its own process (so each peak RSS is that size's own): it loads the sample
(ingest cached in --cache), replays the baseline on `rail-optimized:nic_gbps=400,gpus=4` (hosts of
four GPUs, as traced), then the scale
scenario, and reports the scenario's CPU time (and wall time), the part spent in the flow
simulator, its flows, and the process's peak RSS. The growth exponent is the least-squares slope
of log CPU time (and log RSS) on log simulated GPUs (`_growth.growth_exponent`; 1 is linear). The
machine is shared: compare exponents and ratios measured in one run, never absolute times across
runs.

    python benchmarks/bench_scale.py [--gpus 1024,4096,16384] [--cache DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _growth import growth_exponent  # noqa: E402
from _rss import peak_rss_mb  # noqa: E402

SAMPLE = HERE.parent / "sample_traces" / "synth_moe_16rank"
TOPOLOGY = "rail-optimized:nic_gbps=400,gpus=4"


def one(gpus: int, cache: str) -> dict[str, float]:
    """Replay the sample's baseline, then `scale:dp=gpus/16`; the figures of the scenario."""
    from tracekit import workflows
    from tracekit.replay import _kernels
    from tracekit.whatif import make_baseline, run_scenario

    tables = workflows.whatif_tables(workflows.open([SAMPLE], cache=cache))
    base = make_baseline(tables, TOPOLOGY)
    traced = len(base.placement.slots)
    if gpus % traced:
        raise SystemExit(f"--gpus {gpus}: not a multiple of the sample's {traced} ranks")
    sim = [0.0]
    kernel = _kernels.simulate_flows

    def timed(*args, **kwargs):
        t = time.process_time()
        out = kernel(*args, **kwargs)
        sim[0] += time.process_time() - t
        return out

    from tracekit.replay import simulate

    simulate._kernels.simulate_flows = timed
    rss_before = peak_rss_mb()
    t, cpu = time.perf_counter(), time.process_time()
    result = run_scenario(base, f"scale:dp={gpus // traced}")
    wall, cpu = time.perf_counter() - t, time.process_time() - cpu
    step = sum(result.step_ns.values()) / len(result.step_ns)
    base_step = sum(result.baseline_step_ns.values()) / len(result.baseline_step_ns)
    return {"gpus": result.simulated_gpus, "wall_s": wall, "cpu_s": cpu, "sim_s": sim[0],
            "flows": result.details["flows"], "rss_mb": peak_rss_mb(), "rss_before_mb": rss_before,
            "step_ms": step / 1e6, "baseline_ms": base_step / 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", default="1024,4096,16384", help="Simulated GPU counts (multiples of 16).")
    ap.add_argument("--cache", default=None, help="Ingest cache of the sample (default: a temporary directory).")
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)  # a child process: one size
    args = ap.parse_args()
    cache = args.cache or tempfile.mkdtemp(prefix="bench-scale-")
    if args.one is not None:
        print(json.dumps(one(args.one, cache)))
        return
    rows = []
    for gpus in (int(x) for x in args.gpus.split(",")):
        out = subprocess.run([sys.executable, __file__, "--one", str(gpus), "--cache", cache], check=True,
                             capture_output=True, text=True).stdout
        row = json.loads(out.strip().splitlines()[-1])
        rows.append(row)
        print(f"{row['gpus']:>6} GPUs  {row['flows']:>10,} flows  scale {row['cpu_s']:7.1f} s CPU "
              f"({row['wall_s']:.1f} s wall; simulator {row['sim_s']:6.1f} s CPU)  peak RSS {row['rss_mb']:7.0f} MB "
              f"(baseline loaded: {row['rss_before_mb']:.0f} MB)  step {row['step_ms']:.3f} ms "
              f"(traced size {row['baseline_ms']:.3f} ms)", flush=True)
    gpus = [r["gpus"] for r in rows]
    for name, key in (("scale CPU time", "cpu_s"), ("simulator CPU time", "sim_s"), ("flows", "flows"),
                      ("peak RSS", "rss_mb")):
        exp = growth_exponent(gpus, [r[key] for r in rows])
        print(f"growth exponent of {name} in simulated GPUs: {exp:.2f}" if exp is not None else
              f"growth exponent of {name}: -")


if __name__ == "__main__":
    main()
