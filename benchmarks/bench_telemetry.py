"""Telemetry ingest + rating speed and memory against a plain polars read of the same file.

Run:  python benchmarks/bench_telemetry.py [--ports 1000] [--hours 24] [--step 10] [--keep DIR]
                                          [--baseline PYTHON] [--repeat N]

Input, made here: Prometheus text exposition of `--ports` switch ports scraped every `--step`
seconds for `--hours` (1,000 ports x 1 day at 10 s = 8.64M samples, about 700 MB): per scrape a
`# TYPE` line and one `ifHCOutOctets{instance=...,ifName=...} <value> <ms>` line per port, whose
value grows by a random 0..100 % of 400 Gb/s per window; `ifHighSpeed` once per port.
Contenders, each in its own subprocess (wall and CPU time of the work only; peak RSS):

  floor     pl.read_csv(path, separator=" ", comment_prefix="#") into (series, value, ts) columns:
            the tokenising alone, no labels, no units, nothing stored
  tracekit  tracekit.ingest.ingest([path], tmpdir): parse, Parquet, merge and rate into
            link_samples (one window per port per scrape); its peak RSS is taken when the ingest
            returns. The parse and rate phases are then timed alone in the same child (the rate
            with the counters read back and held, so the peak after them is reported apart)

  baseline  with `--baseline PYTHON`: the tracekit contender again under another interpreter (a
            venv with another checkout installed, e.g. main's), in the same run: ratios against
            the same floor and tracekit/baseline; the runs alternate floor, baseline, tracekit

  first run the imports and a tiny ingest in a fresh process with an empty kernel cache (cold: numba
            compiles every kernel), then again with the cache it wrote (warm: numba loads them);
            `NUMBA_CACHE_DIR` unset and `XDG_CACHE_HOME` a new temporary directory, so the figures
            are those of a user's first and second run (`--warmup-only`, `--no-warmup`)

Target (issue 26): tracekit ingest + rate within 2.5x the floor in CPU and 1.5x in peak RSS at the
full size (iterate on `--ports 100`; the ratio grows with size, because the floor's fixed part
shrinks); the warm first run a small fraction of the cold one.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _rss import peak_rss_mb

LINE_RATE_BPS = 400e9



def generate(path: Path, *, ports: int, scrapes: int, step_s: int, seed: int = 7) -> int:
    """Write the exposition file; return the number of samples in it."""
    import numpy as np
    import polars as pl

    rng = np.random.default_rng(seed)
    t0_ms = 1_760_000_000_000
    prefixes = [f'ifHCOutOctets{{instance="leaf{p // 64:02d}",ifName="Ethernet{p % 64 + 1}"}} ' for p in range(ports)]
    per_window = (rng.random((scrapes, ports)) * LINE_RATE_BPS / 8 * step_s).astype(np.int64)
    values = np.cumsum(per_window, axis=0) + rng.integers(0, 1 << 40, ports)
    with open(path, "wb") as fh:
        head = [f'ifHighSpeed{{instance="leaf{p // 64:02d}",ifName="Ethernet{p % 64 + 1}"}} 400000 {t0_ms}'
                for p in range(ports)]
        fh.write(("# TYPE ifHighSpeed gauge\n" + "\n".join(head) + "\n").encode())
        block = 720
        for k0 in range(0, scrapes, block):
            k1 = min(scrapes, k0 + block)
            n = k1 - k0
            frame = pl.DataFrame({
                "k": np.repeat(np.arange(k0, k1), ports + 1),
                "p": np.tile(np.arange(-1, ports), n),
            })
            ts = (t0_ms + frame["k"].to_numpy() * step_s * 1000).astype(np.int64)
            p = frame["p"].to_numpy()
            v = np.where(p >= 0, values[frame["k"].to_numpy(), np.maximum(p, 0)], 0)
            lines = pl.DataFrame({"pre": pl.Series([prefixes[i] if i >= 0 else "" for i in p]),
                                  "v": v, "ts": ts, "p": p}).select(
                pl.when(pl.col("p") < 0).then(pl.lit("# TYPE ifHCOutOctets counter"))
                .otherwise(pl.concat_str([pl.col("pre"), pl.col("v").cast(pl.String), pl.lit(" "),
                                          pl.col("ts").cast(pl.String)])).alias("line"))
            lines.write_csv(fh, include_header=False, quote_style="never")
    return ports + ports * scrapes


TINY = ('# TYPE ifHCOutOctets counter\n'
        'ifHCOutOctets{instance="a",ifName="b"} 1 1760000000000\n'
        'ifHCOutOctets{instance="a",ifName="b"} 2 1760000010000\n')


def first_run(cache_home: Path) -> dict:
    """Runs inside the child: the imports and the first ingest of a tiny file (numba compiling
    or loading every telemetry kernel the ingest uses), with the kernel cache under `cache_home`."""
    t0, c0 = time.perf_counter(), time.process_time()
    from tracekit.ingest import ingest

    imports = time.process_time() - c0
    out = Path(tempfile.mkdtemp(prefix="tk-bench-tel-"))
    try:
        tiny = out / "tiny.prom"
        tiny.write_text(TINY)
        c1 = time.process_time()
        ingest([tiny], out / "run")
        first = time.process_time() - c1
    finally:
        shutil.rmtree(out, ignore_errors=True)
    from tracekit import _jit

    return {"imports_cpu": imports, "first_cpu": first, "wall": time.perf_counter() - t0,
            "cache": str(_jit.kernel_cache_dir()), "cache_problem": _jit._cache_problem()}


def warmup_figures() -> tuple[dict, dict]:
    """(cold, warm): the first run against an empty kernel cache, then against the one it made,
    each in a fresh process (`NUMBA_CACHE_DIR` unset, the cache in a private temporary home)."""
    home = Path(tempfile.mkdtemp(prefix="tk-bench-cache-"))
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"} | {"XDG_CACHE_HOME": str(home)}
    try:
        got = []
        for _ in range(2):
            proc = subprocess.run([sys.executable, __file__, "--child", "first-run", str(home)], capture_output=True,
                                  text=True, check=False, env=env)
            if proc.returncode != 0:
                raise SystemExit(f"first run failed:\n{proc.stderr[-3000:]}")
            got.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        return got[0], got[1]
    finally:
        shutil.rmtree(home, ignore_errors=True)


def run_one(contender: str, path: Path) -> dict:
    """Runs inside the child: process `path` once, report times and memory."""
    import polars as pl
    import pyarrow as pa

    if contender == "first-run":
        return first_run(path)
    pa.array([0])
    if contender == "floor":
        base = peak_rss_mb()
        t0, c0 = time.perf_counter(), time.process_time()
        df = pl.read_csv(path, separator=" ", has_header=False, comment_prefix="#", quote_char=None,
                         schema={"series": pl.String, "value": pl.Float64, "ts": pl.Int64})
        n = df.height
        phases: dict[str, float] = {}
    else:
        from tracekit.ingest import ingest
        from tracekit.parsers.telemetry import prometheus
        from tracekit.store import Run, SourceSink
        from tracekit.telemetry import rate_counters

        out = Path(tempfile.mkdtemp(prefix="tk-bench-tel-"))
        try:
            # numba loads its cached kernels once per process: warm up on a tiny file, untimed.
            w0 = time.perf_counter()
            tiny = out / "tiny.prom"
            tiny.write_text(TINY)
            ingest([tiny], out / "warm")
            warmup = time.perf_counter() - w0
            base = peak_rss_mb()
            t0, c0 = time.perf_counter(), time.process_time()
            report = ingest([path], out / "run", jobs=1)
            elapsed_all = time.perf_counter() - t0
            ingest_peak = peak_rss_mb()  # the phases below hold more at once than the ingest does
            assert not report.failed, report.failed[0].error
            n = report.sources[0].stored
            windows = report.tables.get("link_samples", 0)
            elapsed, cpu = elapsed_all, time.process_time() - c0
            run = Run(out / "run")
            counters = run.table("counters")
            p0 = time.perf_counter()
            prometheus.parse(path, SourceSink(out / "parse-only", "k"))
            parse_s = time.perf_counter() - p0
            r0 = time.perf_counter()
            rates = rate_counters(counters, run.table("topology_nodes"), run.table("topology_links"))
            rate_s = time.perf_counter() - r0
            phases = {"parse_s": parse_s, "rate_s": rate_s, "windows": windows, "warmup_s": warmup,
                      "flagged": dict(rates.stats.flagged)}
        finally:
            shutil.rmtree(out, ignore_errors=True)
        return {"contender": contender, "seconds": elapsed, "cpu": cpu, "n": n,
                "rss_mb": ingest_peak, "phases_rss_mb": peak_rss_mb(), "base_mb": base, **phases}
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"contender": contender, "seconds": elapsed, "cpu": cpu, "n": n, "rss_mb": peak_rss_mb(),
            "base_mb": base, **phases}


def _child(contender: str, path: Path, python: str | None = None) -> dict:
    mode = "tracekit" if contender == "baseline" else contender
    proc = subprocess.run([python or sys.executable, __file__, "--child", mode, str(path)], capture_output=True,
                          text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{contender} failed:\n{proc.stderr[-3000:]}")
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "contender": contender}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ports", type=int, default=1000)
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--step", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--keep", type=Path, default=None, help="Keep the generated file in this directory.")
    ap.add_argument("--no-warmup", action="store_true", help="Skip the cold/warm numba first-run figures.")
    ap.add_argument("--warmup-only", action="store_true", help="Only the cold/warm numba first-run figures.")
    ap.add_argument("--baseline", metavar="PYTHON", default=None,
                    help="Also run the tracekit contender under this interpreter (another checkout's venv).")
    ap.add_argument("--child", nargs=2, metavar=("CONTENDER", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(run_one(args.child[0], Path(args.child[1]))))
        return
    if args.warmup_only or not args.no_warmup:
        cold, warm = warmup_figures()
        print(f"numba first run (imports, then a tiny ingest), fresh processes, kernel cache in a new private dir: "
              f"cold {cold['first_cpu']:.2f} s CPU ({cold['wall']:.1f} s wall in all), "
              f"warm cache {warm['first_cpu']:.2f} s CPU ({warm['wall']:.1f} s wall); imports "
              f"{cold['imports_cpu']:.2f} / {warm['imports_cpu']:.2f} s; "
              f"cold/warm {cold['first_cpu'] / warm['first_cpu']:.0f}x"
              + (f"; cache unusable: {warm['cache_problem']}" if warm["cache_problem"] else ""))
        if args.warmup_only:
            return
    scrapes = int(args.hours * 3600 / args.step)
    tmp = Path(tempfile.mkdtemp(prefix="tk-bench-prom-", dir=args.keep))
    path = tmp / "switches.prom"
    try:
        t0 = time.perf_counter()
        samples = generate(path, ports=args.ports, scrapes=scrapes, step_s=args.step)
        size = path.stat().st_size
        print(f"input: {args.ports:,} ports x {scrapes:,} scrapes = {samples:,} samples, "
              f"{size / 1e6:,.0f} MB (generated in {time.perf_counter() - t0:.1f} s)")
        results: dict[str, list[dict]] = {"floor": [], **({"baseline": []} if args.baseline else {}),
                                          "tracekit": []}
        for _ in range(args.repeat):
            for c in results:
                results[c].append(_child(c, path, args.baseline if c == "baseline" else None))
        best = {c: min(rs, key=lambda r: r["seconds"]) for c, rs in results.items()}
        floor, tk = best["floor"], best["tracekit"]
        for c, r in best.items():
            extra = (f"  (parse alone {r['parse_s']:.2f} s, rate alone {r['rate_s']:.2f} s, "
                     f"{r['windows']:,} windows, peak RSS {r['phases_rss_mb']:.0f} MB with them; "
                     f"numba warm-up {r['warmup_s']:.2f} s, untimed)"
                     if c != "floor" else "")
            print(f"{c:9s} {r['seconds']:7.2f} s wall {r['cpu']:7.2f} s cpu  peak RSS {r['rss_mb']:7.0f} MB  "
                  f"{r['n']:,} samples  {r['n'] / r['seconds'] / 1e6:.2f} M samples/s{extra}")
        print(f"ratio tracekit/floor: {tk['seconds'] / floor['seconds']:.2f}x wall, "
              f"{tk['cpu'] / floor['cpu']:.2f}x cpu, {tk['rss_mb'] / floor['rss_mb']:.2f}x peak RSS; "
              f"parse alone {tk['parse_s'] / floor['seconds']:.2f}x floor")
        if args.baseline:
            base = best["baseline"]
            print(f"ratio baseline/floor: {base['seconds'] / floor['seconds']:.2f}x wall, "
                  f"{base['cpu'] / floor['cpu']:.2f}x cpu, {base['rss_mb'] / floor['rss_mb']:.2f}x peak RSS; "
                  f"tracekit/baseline: {tk['cpu'] / base['cpu']:.2f}x cpu, "
                  f"{tk['rss_mb'] / base['rss_mb']:.2f}x peak RSS")
        if args.repeat > 1:
            for c, rs in results.items():
                print(f"{c:9s} cpu per run: " + ", ".join(f"{r['cpu']:.2f}" for r in rs)
                      + (" (floor ratios: " + ", ".join(f"{r['cpu'] / f['cpu']:.2f}x" for r, f in
                                                       zip(rs, results["floor"], strict=True)) + ")"
                         if c != "floor" else ""))
    finally:
        if args.keep is None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("POLARS_MAX_THREADS", str(os.cpu_count() or 1))
    main()
