"""Long fuzzing campaign over every parser: structural mutations of real and sample files.

Usage::

    nice -n 10 python benchmarks/fuzz.py [--cases 10000] [--formats kineto,flight_recorder]
                                         [--cli-every 50] [--seed 1] [--out fuzz_out]
                                         [--class-share 0.3] [--classes inner_keys,...] [--run-cases 0]

Each parser runs in its own spawned process on `--cases` mutated cases
(mutators: tests/fuzz/fuzzing.py); every `--cli-every`-th case also goes through `tracekit
ingest` and `tracekit info`. Prints, per parser: cases, ok, salvages (parsed with warnings or
skips), clean errors (one-line InputError), crashes (any other exception or a broken
invariant), hangs (no result within --timeout s) and peak RSS. Peak RSS is the campaign
process's own VmHWM (ru_maxrss would carry the parent's over fork+exec), reset before every case
so the case that drives it is known: the worst case is reported, and when it crosses
--mem-limit it is minimised and written as OUT/<format>/memory.bin. For each distinct failure a
minimised reproducer is written to OUT/<format>/<signature>.bin with the traceback next to it.
Target (issue 14): 0 crashes, 0 hangs, peak RSS under 1 GiB for every parser.

`--class-share` of the cases come from the hostile-class mutators of issue 22
(`fuzzing.CLASSES`: duplicate keys, keys repeated inside records, alias graphs, long single
lines, pickle opcode storms, huge decimal numbers, control characters, hostile NVTX payloads in
Nsight exports), each with its own oracle (both arrays of a duplicated key read, a repeated key
warned, an over-long line counted); `--classes` draws from some of them only; the row of each
parser then tallies every class. `--run-cases` adds a `received_run` campaign: links planted at
random entries of a small ingested run (and, in a quarter of the cases, a staged commit whose
COMMIT marker is hand-edited), then a random command (ingest merge, analyze, info, hang, export,
report), which must change nothing outside the run and end with at most a one-line error.
"""

from __future__ import annotations

import argparse
import gzip
import json
import multiprocessing as mp
import queue
import random
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "fuzz"))

import fuzzing
from _rss import peak_rss_mb, reset_peak_rss


class _Peak:
    """Peak RSS of this campaign process, case by case: VmHWM is reset before each case, so the
    case that drives the peak is known (and becomes a reproducer when it crosses the limit)."""

    def __init__(self, limit_mib: float) -> None:
        self.limit = limit_mib
        self.per_case = reset_peak_rss()
        self.peak = peak_rss_mb()
        self.worst: tuple[float, bytes, bool, str] | None = None
        self.over = 0

    def start(self) -> None:
        if self.per_case:
            reset_peak_rss()

    def stop(self, case: bytes, gz: bool, seed_name: str) -> float:
        p = peak_rss_mb()
        self.peak = max(self.peak, p)
        if self.per_case:
            self.over += p >= self.limit
            if self.worst is None or p > self.worst[0]:
                self.worst = (p, case, gz, seed_name)
        return p


def _campaign(fmt: str, cases: int, seed: int, cli_every: int, timeout: float, out: str, mem_limit: float,
              q: Any, class_share: float = 0.0, classes: list[str] | None = None) -> None:
    mods = fuzzing.parsers()
    module = mods[fmt]
    seeds = fuzzing.load_seeds({fmt})[fmt]
    if not seeds:
        q.put({"format": fmt, "seeds": 0, "cases": 0, "ok": 0, "salvage": 0, "error": 0, "crash": 0, "hang": 0,
               "cli": {"cases": 0}, "seconds": 0.0, "peak_rss_mib": 0.0, "over_limit": 0, "reproducers": []})
        return
    tally = fuzzing.Tally()
    by_class: dict[str, dict[str, int]] = {}
    rnd = random.Random(f"{seed}:{fmt}")
    cli = {"cases": 0, "crash": 0, "hang": 0}
    peak = _Peak(mem_limit)
    t0 = time.perf_counter()
    shm = "/dev/shm" if Path("/dev/shm").is_dir() else None
    with tempfile.TemporaryDirectory(prefix=f"fuzz-{fmt}-", dir=shm) as tmp:
        work = Path(tmp) / "w"
        seed_reads: dict[str, int] = {}
        for s in seeds:  # warm-up without a deadline: numba kernels compile on first use
            raw = gzip.compress(s.data, mtime=0) if s.gz else s.data
            fuzzing.run_case(fmt, module, raw, s.gz, work, timeout=3600, name=s.name,
                             on_stats=lambda d, n=s.name: seed_reads.__setitem__(n, d["stats"].read))
        fuzzing.run_cli(seeds[0].data if not seeds[0].gz else gzip.compress(seeds[0].data, mtime=0), seeds[0].gz,
                        Path(tmp) / "cli", name=seeds[0].name)
        t0 = time.perf_counter()
        for i in range(cases):
            picked = (fuzzing.make_class_case(seeds, rnd, classes) if class_share and rnd.random() < class_share
                      else None)
            peak.start()
            if picked is not None:
                cls, s, cc = picked
                case, gz = fuzzing.case_bytes(cc), cc.gz
                outcome = fuzzing.run_class_case(fmt, module, cc, work, timeout=timeout, name=s.name,
                                                 seed_read=seed_reads.get(s.name))
                row = by_class.setdefault(cls, dict.fromkeys(("cases", "ok", "salvage", "error", "crash", "hang"), 0))
                row["cases"] += 1
                row[outcome.kind] += 1
            else:
                s = rnd.choice(seeds)
                case, gz = fuzzing.make_case(s, rnd)
                outcome = fuzzing.run_case(fmt, module, case, gz, work, timeout=timeout, name=s.name)
            peak.stop(case, gz, s.name)
            tally.add(case if not gz else b"GZ" + case, outcome, s.name)
            if (i + 1) % 1000 == 0:
                print(f"  {fmt}: {i + 1:,} cases, {time.perf_counter() - t0:.0f} s, {tally.counts}, "
                      f"peak {peak.peak:.0f} MiB", flush=True)
            if cli_every and i % cli_every == 0:
                cli["cases"] += 1
                peak.start()
                c = fuzzing.run_cli(case, gz, Path(tmp) / "cli", name=s.name)
                peak.stop(case, gz, s.name)
                if c.kind in ("crash", "hang"):
                    cli[c.kind] += 1
                    tally.counts[c.kind] += 1
                    tally.failures.setdefault(c.signature, (case if not gz else b"GZ" + case, c.detail, s.name))
        seconds = time.perf_counter() - t0
        repro = _write_reproducers(fmt, module, tally, Path(out), work, timeout)
        if peak.worst and peak.worst[0] >= mem_limit:
            repro.append(_write_memory_reproducer(fmt, module, peak, Path(out), work, timeout))
    q.put({"format": fmt, "seed": seed, "seeds": len(seeds), "cases": tally.cases, **tally.counts, "cli": cli,
           "seconds": round(seconds, 1), "peak_rss_mib": round(peak.peak, 1), "over_limit": peak.over,
           "worst_case": {"peak_rss_mib": round(peak.worst[0], 1), "seed": peak.worst[3]} if peak.worst else None,
           "classes": by_class, "reproducers": repro})


def _run_campaign(fmt: str, cases: int, seed: int, cli_every: int, timeout: float, out: str, mem_limit: float,
                  q: Any, class_share: float = 0.0) -> None:
    """Received runs: links planted at random entries of a small ingested run, then a command."""
    from tracekit.ingest import ingest

    rnd = random.Random(f"{seed}:{fmt}")
    tally = fuzzing.Tally()
    traces = sorted(str(p) for p in (fuzzing.SAMPLES / "gloo_moe_8rank").glob("rank[0-3]*.json.gz"))
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fuzz-run-") as tmp:
        base = Path(tmp) / "base"
        ingest(traces, base, jobs=1)
        for i in range(cases):
            outcome = fuzzing.run_run_case(base, traces, Path(tmp) / "w", rnd)
            tally.add(outcome.detail.encode(), outcome, "gloo_moe_8rank")
            if (i + 1) % 20 == 0:
                print(f"  {fmt}: {i + 1:,} cases, {time.perf_counter() - t0:.0f} s, {tally.counts}", flush=True)
    repro = []
    for sig, (_, detail, _) in sorted(tally.failures.items()):
        d = Path(out) / fmt
        d.mkdir(parents=True, exist_ok=True)
        name = re.sub(r"[^A-Za-z0-9_.@-]+", "_", sig)[:80]
        (d / f"{name}.txt").write_text(f"{sig}\n\n{detail}\n")
        repro.append(str(d / f"{name}.txt"))
    q.put({"format": fmt, "seed": seed, "seeds": 1, "cases": tally.cases, **tally.counts, "cli": {"cases": 0},
           "seconds": round(time.perf_counter() - t0, 1), "peak_rss_mib": round(peak_rss_mb(), 1), "over_limit": 0,
           "worst_case": None, "classes": {}, "reproducers": repro})


def _write_memory_reproducer(fmt: str, module: Any, peak: _Peak, out: Path, work: Path, timeout: float) -> str:
    """The case with the highest peak RSS, minimised while its peak stays over the limit."""
    p, case, gz, seed_name = peak.worst  # type: ignore[misc]

    def still(c: bytes) -> bool:
        reset_peak_rss()
        fuzzing.run_case(fmt, module, c, gz, work, timeout=timeout, name=seed_name)
        return peak_rss_mb() >= peak.limit

    small = fuzzing.minimize(case, still) if not gz else case
    d = out / fmt
    d.mkdir(parents=True, exist_ok=True)
    (d / "memory.bin").write_bytes(small)
    (d / "memory.txt").write_text(f"memory: peak RSS {p:.0f} MiB >= {peak.limit:.0f} MiB\ngzip: {gz}\n"
                                  f"file name: {fuzzing.case_name(seed_name, gz)}\nseed: {seed_name}\n")
    return str(d / "memory.bin")


def _write_reproducers(fmt: str, module: Any, tally: fuzzing.Tally, out: Path, work: Path,
                       timeout: float) -> list[str]:
    written = []
    for sig, (case, detail, seed_name) in sorted(tally.failures.items()):
        gz = case.startswith(b"GZ")
        body = case[2:] if gz else case

        def still(c: bytes, sig: str = sig, gz: bool = gz, nm: str = seed_name) -> bool:
            if sig.startswith("cli_"):
                return fuzzing.run_cli(c, gz, work.parent / "cli", name=nm).signature == sig
            return fuzzing.run_case(fmt, module, c, gz, work, timeout=timeout, name=nm).signature == sig

        # a hang costs `timeout` per try: those are kept as found
        small = fuzzing.minimize(body, still) if not gz and "hang" not in sig else body
        name = re.sub(r"[^A-Za-z0-9_.@-]+", "_", sig)[:80]
        d = out / fmt
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{name}.bin").write_bytes(small)
        head = f"{sig}\ngzip: {gz}\nfile name: {fuzzing.case_name(seed_name, gz)}\n\n"
        (d / f"{name}.txt").write_text(head + detail + "\n")
        written.append(str(d / f"{name}.bin"))
    return written


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=10_000)
    ap.add_argument("--formats", default="", help="comma-separated formats (default: every parser)")
    ap.add_argument("--cli-every", type=int, default=50)
    ap.add_argument("--timeout", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default="fuzz_out")
    ap.add_argument("--workers", type=int, default=1, help="parsers fuzzed at once (one process each)")
    ap.add_argument("--mem-limit", type=float, default=1024.0, help="peak RSS (MiB) a case must stay under")
    ap.add_argument("--class-share", type=float, default=0.3,
                    help="share of cases made by the hostile-class mutators (issue 22; 0 for the older mix)")
    ap.add_argument("--classes", default="", help="comma-separated hostile classes to draw from (default: all)")
    ap.add_argument("--run-cases", type=int, default=0,
                    help="received-run attacks (links planted in a run, then a command) in a process of their own")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    formats = [f for f in args.formats.split(",") if f] or sorted(fuzzing.parsers())
    classes = [c for c in args.classes.split(",") if c] or None
    unknown = sorted(set(classes or ()) - set(fuzzing.CLASSES))
    if unknown:
        raise SystemExit(f"unknown classes {unknown}; known: {sorted(fuzzing.CLASSES)}")
    if args.run_cases and "received_run" not in formats:
        formats.append("received_run")
    ctx = mp.get_context("spawn")
    rows = []
    todo = list(formats)
    running: dict[str, tuple[Any, Any]] = {}
    try:
        while todo or running:
            while todo and len(running) < max(1, args.workers):
                fmt = todo.pop(0)
                q = ctx.Queue()
                target = _run_campaign if fmt == "received_run" else _campaign
                p = ctx.Process(target=target, args=(fmt, args.run_cases if fmt == "received_run" else args.cases,
                                                     args.seed, args.cli_every, args.timeout, args.out, args.mem_limit,
                                                     q, args.class_share,
                                                     *([] if fmt == "received_run" else [classes])))
                p.start()
                running[fmt] = (p, q)
            for fmt, (p, q) in list(running.items()):
                try:
                    row = q.get(timeout=1)
                except queue.Empty:
                    if not p.is_alive():
                        del running[fmt]
                        row = {"format": fmt, "seeds": -1, "cases": 0, "ok": 0, "salvage": 0, "error": 0,
                               "crash": 1, "hang": 0, "cli": {"cases": 0}, "seconds": 0.0, "peak_rss_mib": 0.0,
                               "over_limit": 0, "reproducers": [f"campaign process died (exit code {p.exitcode})"]}
                        rows.append(row)
                        print(_line(row), flush=True)
                    continue
                p.join()
                del running[fmt]
                rows.append(row)
                print(_line(row), flush=True)
    except KeyboardInterrupt:
        for p, _ in running.values():
            p.kill()
        raise
    rows.sort(key=lambda r: r["format"])
    if args.json:
        print(json.dumps(rows, indent=1))
    bad = sum(r["crash"] + r["hang"] for r in rows)
    over = [r["format"] for r in rows if r["peak_rss_mib"] >= args.mem_limit]
    print(f"total: {sum(r['cases'] for r in rows):,} cases, {bad} crashes+hangs; "
          f"peak RSS >= {args.mem_limit:.0f} MiB: {', '.join(over) or 'none'}")
    sys.exit(1 if bad or over else 0)


def _line(r: dict[str, Any]) -> str:
    return (f"{r['format']:<16} seeds {r['seeds']:>3}  cases {r['cases']:>6,}  ok {r['ok']:>6,}  "
            f"salvages {r['salvage']:>6,}  clean errors {r['error']:>6,}  crashes {r['crash']:>3}  "
            f"hangs {r['hang']:>3}  cli {r['cli']['cases']:>4}  peak RSS {r['peak_rss_mib']:>7.1f} MiB  "
            f"{r['seconds']:>7.1f} s  seed {r.get('seed', '?')}"
            + (f"\n  worst case: {r['worst_case']['peak_rss_mib']:.1f} MiB from {r['worst_case']['seed']}; "
               f"{r['over_limit']} cases over the limit" if r.get("worst_case") else "")
            + "".join(f"\n  class {c:<15} cases {v['cases']:>5,}  ok {v['ok']:>5,}  salvages {v['salvage']:>5,}  "
                      f"clean errors {v['error']:>5,}  crashes {v['crash']:>3}  hangs {v['hang']:>3}"
                      for c, v in sorted(r.get("classes", {}).items()))
            + (f"\n  reproducers: {', '.join(r['reproducers'])}" if r["reproducers"] else ""))


if __name__ == "__main__":
    main()
