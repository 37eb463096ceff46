"""Benchmark: the whole pipeline, synth -> ingest -> analyze -> replay -> report, at growing scale.

Usage::

    python benchmarks/bench_e2e.py [--sizes 64,256,1024] [--full] [--huge] [--steps 2] [--keep DIR]

For each size (ranks = hosts x 8 GPUs, PP=4, EP=8) every stage runs as its own `tracekit` command
in a fresh process: `synth --format kineto`, `ingest`, `analyze --json`, `replay --json` on a
rail-optimized network of the same shape, and `report`. Each stage's wall time, CPU time and
peak RSS (the largest of the process's own `ru_maxrss` and, with psutil installed, the sampled
sum over its process tree, which counts ingest's workers) are printed, and so is a check that
the stage recovered the injected truth: every event and collective call ingested, clock offsets,
the straggler and the hot EP ranks found by analyze, replay reproducing the traced timeline
(identity), the report naming the straggler. Then the growth exponent of each stage: the slope
of log(time) and log(RSS) against log(ranks), fitted over all sizes and between the two largest.
Targets: CPU-time exponent <= 1.2 for every stage (wall time on a shared machine mostly measures
the neighbours), and `--full` (4,096 ranks x 2 steps) under 24 GiB. `--huge` runs 4,096, 8,192
and 16,384 ranks of one step instead (issue 26: exponents <= 1.1, every stage under 24 GiB). On a
shared machine give `--nice 10` and do not run the script itself under `nice` as well: the stages
would then run at 19 (nice adds up) and get a fraction of their share. `--json FILE` keeps the
figures, so sizes run apart can be put into one table.
The numba kernels are compiled (or loaded from cache) by an untimed replay of a tiny run first.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _growth import growth_exponent

GPUS = 8
PP = 4
EP = 8
STAGES = ("synth", "ingest", "analyze", "replay", "report")
TARGET_EXPONENT = 1.2
HUGE_TARGET_EXPONENT = 1.1  # issue 26, for --huge
TARGET_RSS_GIB = 24.0
HUGE_SIZES = (4096, 8192, 16384)
#: Skip reasons the synthetic traces are expected to produce (flow arrows are not intervals).
EXPECTED_SKIPS = ("flow",)


@dataclass
class Measure:
    wall_s: float
    cpu_s: float
    rss_mib: float
    rc: int
    stdout: str
    stderr: str


@dataclass
class Row:
    ranks: int
    events: int = 0
    stages: dict[str, Measure] = field(default_factory=dict)
    checks: dict[str, str] = field(default_factory=dict)


def _tree_rss_sampler(pid: int, peak: list[float], stop: threading.Event, limit_mib: float | None = None,
                      over: list[bool] | None = None) -> None:
    try:
        import psutil
    except ImportError:
        return
    try:
        root = psutil.Process(pid)
    except psutil.Error:
        return
    while not stop.is_set():
        total = 0
        try:
            tree = [root, *root.children(recursive=True)]
            for p in tree:
                with contextlib.suppress(psutil.Error):
                    total += p.memory_info().rss
        except psutil.Error:
            break
        peak[0] = max(peak[0], total / 2**20)
        if limit_mib is not None and over is not None and total / 2**20 > limit_mib:
            over[0] = True
            for p in reversed(tree):  # the workers first, so the parent cannot start others
                with contextlib.suppress(psutil.Error):
                    p.kill()
            break
        stop.wait(0.1)


def run_stage(args: list[str], *, nice: int = 0, stdout_path: Path | None = None,
              limit_mib: float | None = None) -> Measure:
    """Run `python -m tracekit ARGS` in a fresh process; wall, CPU and peak RSS of it and its children.
    Over `limit_mib` of RSS (the sum over the process tree, needs psutil) the stage is killed and
    fails with that reason."""
    cmd = [sys.executable, "-m", "tracekit", *args]
    if nice:
        cmd = ["nice", "-n", str(nice), *cmd]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with tempfile.TemporaryFile("w+") as out_f, tempfile.TemporaryFile("w+") as err_f:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out_f, stderr=err_f, env=env)
        peak = [0.0]
        stop = threading.Event()
        over = [False]
        sampler = threading.Thread(target=_tree_rss_sampler, args=(proc.pid, peak, stop, limit_mib, over),
                                   daemon=True)
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        stop.set()
        sampler.join()
        proc.returncode = os.waitstatus_to_exitcode(status)
        out_f.seek(0)
        err_f.seek(0)
        stdout, stderr = out_f.read(), err_f.read()
    if stdout_path is not None:
        stdout_path.write_text(stdout)
    if over[0]:
        stderr += f"\nkilled: the stage's processes passed {limit_mib:.0f} MiB of RSS (--max-rss-gib)"
    return Measure(wall, usage.ru_utime + usage.ru_stime, max(usage.ru_maxrss / 1024, peak[0]), proc.returncode,
                   stdout, stderr)


def _fail(m: Measure) -> str | None:
    if m.rc != 0:
        tail = (m.stderr or m.stdout).strip().splitlines()[-1:] or ["?"]
        return f"FAILED (exit {m.rc}): {tail[0][:120]}"
    return None


def check_synth(m: Measure, traces: Path, ranks: int) -> tuple[str, dict[str, int]]:
    found = re.search(r"wrote (\d+) Kineto traces \((\d+) events, (\d+) collective calls\)", m.stdout)
    if not found:
        return f"no summary line in: {m.stdout[:120]!r}", {}
    files, events, colls = map(int, found.groups())
    ok = files == ranks == len(list(traces.glob("rank*.pt.trace.json*"))) and (traces / "truth.json").is_file()
    return ("ok" if ok else f"{files} files for {ranks} ranks"), {"events": events, "collectives": colls}


def check_ingest(run: Path, ranks: int, expect: dict[str, int]) -> str:
    manifest = json.loads((run / "manifest.json").read_text())
    sources = [s for s in manifest["sources"] if not s.get("error")]
    got_ranks = sorted(r for s in sources for r in s["ranks"])
    events = sum(s["events"] for s in sources)
    colls = sum(s["collectives"] for s in sources)
    skipped = sum(n for s in sources for why, n in s["skipped"].items() if why not in EXPECTED_SKIPS)
    problems = []
    if got_ranks != list(range(ranks)):
        problems.append(f"ranks {len(got_ranks)}/{ranks}")
    if events != expect.get("events"):
        problems.append(f"events {events} != {expect.get('events')}")
    if colls != expect.get("collectives"):
        problems.append(f"collectives {colls} != {expect.get('collectives')}")
    if skipped:
        problems.append(f"{skipped} skipped for reasons other than {', '.join(EXPECTED_SKIPS)}")
    return "; ".join(problems) or "ok"


def check_analyze(doc: dict[str, Any], truth: dict[str, Any]) -> str:
    problems = []
    bad = [r for r, off in truth["clock_offset_ns"].items()
           if abs(doc["clock_offsets_ns"][r] - off) > max(50_000, 0.05 * abs(off))]
    if bad:
        problems.append(f"{len(bad)} clock offsets off")
    top = doc["stragglers"][0] if doc["stragglers"] else {}
    want = truth["straggler"]
    if want and (top.get("rank") != want["rank"] or want["step"] not in (top.get("steps") or [])):
        problems.append(f"straggler {top.get('rank')} (want {want['rank']})")
    hot = {e["group"]: e["hot_rank"] for e in doc["ep"]}
    if hot != {g: v["hot_rank"] for g, v in truth["ep_hot"].items()}:
        problems.append("EP hot ranks differ")
    wrong_dims = [g["group"] for g in truth["groups"] if g["dim"] not in doc["dims"].get(g["group"], [])]
    if wrong_dims:
        problems.append(f"{len(wrong_dims)} group dims wrong")
    return "; ".join(problems) or "ok"


def check_replay(doc: dict[str, Any]) -> str:
    ident = doc.get("identity") or {}
    problems = []
    if ident.get("max_step_error") is None or ident["max_step_error"] > 1e-9:
        problems.append(f"identity step error {ident.get('max_step_error')}")
    if ident.get("instances_fallen_back"):
        problems.append(f"{ident['instances_fallen_back']} instances fell back")
    return "; ".join(problems) or "ok"


def check_report(html: Path, truth: dict[str, Any]) -> str:
    if not html.is_file():
        return "no report"
    want = truth["straggler"]
    if want and f"rank {want['rank']} was last" not in html.read_text(errors="replace"):
        return "report does not name the straggler"
    return "ok"


def run_size(ranks: int, steps: int, work: Path, nice: int, extra: list[str], limit_mib: float | None = None
             ) -> Row:
    row = Row(ranks)

    def run(stage: str, args: list[str], **kwargs: Any) -> Measure:
        m = row.stages[stage] = run_stage(args, nice=nice, limit_mib=limit_mib, **kwargs)
        print(f"  {ranks} ranks {stage}: {m.cpu_s:.1f} s CPU, {m.wall_s:.1f} s wall, {m.rss_mib:.0f} MiB, exit {m.rc}",
              flush=True)
        return m

    hosts = ranks // GPUS
    traces, run_dir, out = work / f"k{ranks}", work / f"run{ranks}", work / f"out{ranks}"
    out.mkdir(parents=True, exist_ok=True)
    m = run("synth", ["synth", "-o", str(traces), "--format", "kineto", "--hosts", str(hosts), "--gpus", str(GPUS),
                      "--pp", str(PP), "--ep", str(EP), "--steps", str(steps),
                      "--straggler-step", str(min(1, steps - 1)), *extra])
    if (err := _fail(m)) is not None:
        row.checks["synth"] = err
        return row
    row.checks["synth"], expect = check_synth(m, traces, ranks)
    row.events = expect.get("events", 0)
    truth = json.loads((traces / "truth.json").read_text())

    m = run("ingest", ["ingest", str(traces), "-o", str(run_dir), "-q"])
    row.checks["ingest"] = _fail(m) or check_ingest(run_dir, ranks, expect)
    if m.rc:
        return row
    m = run("analyze", ["analyze", str(run_dir), "--json"], stdout_path=out / "analysis.json")
    row.checks["analyze"] = _fail(m) or check_analyze(json.loads(m.stdout), truth)
    topo = f"rail-optimized:hosts={hosts},gpus={GPUS},nic_gbps=400"
    m = run("replay", ["replay", str(run_dir), "--topology", topo, "--json"], stdout_path=out / "replay.json")
    row.checks["replay"] = _fail(m) or check_replay(json.loads(m.stdout))
    html = out / "report.html"
    m = run("report", ["report", str(run_dir), "-o", str(html)])
    row.checks["report"] = _fail(m) or check_report(html, truth)
    return row


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def print_table(rows: list[Row], target: float = TARGET_EXPONENT) -> bool:
    print()
    head = f"{'ranks':>6} {'events':>10}  " + "  ".join(f"{s + ' s':>9} {'MiB':>7}" for s in STAGES)
    print(head)
    for r in rows:
        cells = []
        for s in STAGES:
            m = r.stages.get(s)
            cells.append(f"{m.wall_s:9.1f} {m.rss_mib:7.0f}" if m else f"{'-':>9} {'-':>7}")
        print(f"{r.ranks:>6} {r.events:>10,}  " + "  ".join(cells))
    print("\nCPU seconds (user + system, the process and its workers; less noisy than wall on a shared machine)")
    print(f"{'ranks':>6}  " + "  ".join(f"{s:>9}" for s in STAGES))
    for r in rows:
        print(f"{r.ranks:>6}  " + "  ".join(f"{r.stages[s].cpu_s:9.1f}" if s in r.stages else f"{'-':>9}"
                                            for s in STAGES))
    print("\ntruth recovered:")
    ok = True
    for r in rows:
        checks = ", ".join(f"{s} {r.checks.get(s, '-')}" for s in STAGES)
        ok &= all(r.checks.get(s) == "ok" for s in STAGES)
        print(f"  {r.ranks:>6} ranks: {checks}")
    full = [r for r in rows if all(s in r.stages for s in STAGES)]
    if len(full) >= 2:
        print("\ngrowth exponent (d log y / d log ranks): fitted over all sizes | between the two largest")
        xs = [r.ranks for r in full]
        for s in STAGES:
            wall = [r.stages[s].wall_s for r in full]
            cpu = [r.stages[s].cpu_s for r in full]
            rss = [r.stages[s].rss_mib for r in full]
            fw, lw = growth_exponent(xs, wall), growth_exponent(xs[-2:], wall[-2:])
            fc, lc = growth_exponent(xs, cpu), growth_exponent(xs[-2:], cpu[-2:])
            fr, lr = growth_exponent(xs, rss), growth_exponent(xs[-2:], rss[-2:])
            flag = "" if max(x for x in (fc, lc) if x is not None) <= target else "  (CPU above target)"
            print(f"  {s:8} wall {_fmt(fw)} | {_fmt(lw)}   cpu {_fmt(fc)} | {_fmt(lc)}   "
                  f"rss {_fmt(fr)} | {_fmt(lr)}{flag}")
    peak = max((m.rss_mib for r in rows for m in r.stages.values()), default=0.0)
    print(f"\npeak RSS of any stage: {peak / 1024:.2f} GiB (target < {TARGET_RSS_GIB:.0f} GiB)")
    return ok and peak / 1024 < TARGET_RSS_GIB


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="64,256,1024", help="Comma-separated rank counts (multiples of 32).")
    ap.add_argument("--full", action="store_true", help="Also run 4,096 ranks.")
    ap.add_argument("--huge", action="store_true", help="Run 4,096, 8,192 and 16,384 ranks of one step instead.")
    ap.add_argument("--steps", type=int, default=None, help="Steps per run (default 2; 1 with --huge).")
    ap.add_argument("--nice", type=int, default=0, help="Run every stage under `nice -n N`.")
    ap.add_argument("--keep", type=Path, default=None, help="Keep the traces and runs in this directory.")
    ap.add_argument("--max-rss-gib", type=float, default=None,
                    help="Kill a stage whose processes pass this RSS (GiB; a shared machine's budget).")
    ap.add_argument("--json", type=Path, default=None, help="Also write the figures to this JSON file.")
    ap.add_argument("--synth-args", default="", help="Extra `tracekit synth` options, e.g. '--kernels 16'.")
    args = ap.parse_args(argv)
    if args.huge:
        sizes = list(HUGE_SIZES)
        args.steps = args.steps or 1
    else:
        sizes = sorted({int(s) for s in args.sizes.split(",") if s.strip()} | ({4096} if args.full else set()))
        args.steps = args.steps or 2
    if any(s % (GPUS * PP) for s in sizes):
        ap.error(f"sizes must be multiples of {GPUS * PP}")
    extra = args.synth_args.split()
    work = args.keep or Path(tempfile.mkdtemp(prefix="bench_e2e_"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        warm = work / "warm"
        t0 = time.perf_counter()
        run_stage(["synth", "-o", str(warm / "run"), "--hosts", "2", "--gpus", "4", "--steps", "1"])
        m = run_stage(["replay", str(warm / "run"), "--topology", "rail-optimized:hosts=2,gpus=4", "--no-write"])
        print(f"warm-up (numba compile or cache load): {time.perf_counter() - t0:.1f} s, exit {m.rc}")
        rows = []
        for n in sizes:
            t0 = time.perf_counter()
            rows.append(run_size(n, args.steps, work, args.nice, extra,
                                 args.max_rss_gib * 1024 if args.max_rss_gib else None))
            r = rows[-1]
            print(f"{n} ranks x {args.steps} steps: {r.events:,} events, "
                  + ", ".join(f"{s} {m.wall_s:.1f} s/{m.rss_mib:.0f} MiB" for s, m in r.stages.items())
                  + f" ({time.perf_counter() - t0:.0f} s)", flush=True)
        ok = print_table(rows, HUGE_TARGET_EXPONENT if args.huge else TARGET_EXPONENT)
        if args.json is not None:
            args.json.write_text(json.dumps([{"ranks": r.ranks, "events": r.events, "checks": r.checks, "stages": {
                s: {"wall_s": m.wall_s, "cpu_s": m.cpu_s, "rss_mib": m.rss_mib, "rc": m.rc}
                for s, m in r.stages.items()}} for r in rows], indent=1))
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
