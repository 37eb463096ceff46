"""Ingest speed and memory against a decode floor and HolisticTraceAnalysis.

Run:  python benchmarks/bench_ingest.py [--repeat 3] [--scale 10 [--scale 4 ...]] [--trace PATH]

Inputs: the largest real Kineto sample (df_index_resolver.json.gz, 53.7 MB of JSON) and files
`--scale` times larger made from it (its traceEvents replicated with shifted timestamps). The
last lines compare tracekit's peak RSS across sizes: MB above its imports per 100 MB of JSON,
next to the floor's (which holds the whole document).
Contenders, each timed in its own subprocess (time of the load only; peak RSS of the process):

  floor     gunzip + a typed msgspec decode of the whole document (tracekit's Event struct)
  tracekit  tracekit.ingest.ingest([path], tmpdir, jobs=1) (parse, spool, Parquet, merge)
  baseline  the tracekit run by `--baseline-python` (another install of tracekit, e.g. the main
            checkout's), so a change is measured against the code before it in one run
  hta       hta.trace_analysis.TraceAnalysis(trace_dir=...) when `hta` is importable
            (pip install holistictraceanalysis; not a tracekit dependency)

Targets: tracekit <= 1.5x floor time; >= 5x faster than HTA; <= half of HTA's peak RSS.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _rss import peak_rss_mb

HERE = Path(__file__).resolve()
DEFAULT_TRACE = HERE.parents[2] / "shared" / "real_traces" / "kineto" / "hta_df_index_resolver" / \
    "df_index_resolver.json.gz"



def run_one(contender: str, path: Path) -> dict:
    """Runs inside the child: load `path` once with one contender, report time and memory."""
    if contender == "floor":
        import msgspec

        from tracekit.parsers.kineto import Event

        trace = msgspec.defstruct("Trace", [("traceEvents", list[Event])])
        base = peak_rss_mb()
        t0, c0 = time.perf_counter(), time.process_time()
        with gzip.open(path, "rb") as fh:
            raw = fh.read()
        doc = msgspec.json.decode(raw, type=trace)
        n = len(doc.traceEvents)
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    elif contender == "tracekit":
        import pyarrow as pa

        import tracekit.parsers.kineto  # noqa: F401 - imported before timing, like the others
        from tracekit.ingest import ingest

        pa.array([0])  # pyarrow imports pandas lazily on first use when it is installed

        base = peak_rss_mb()
        out = Path(tempfile.mkdtemp(prefix="tk-bench-"))
        try:
            t0, c0 = time.perf_counter(), time.process_time()
            report = ingest([path], out / "run", jobs=1)
            elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
            n = report.sources[0].read
            assert report.sources[0].error is None, report.sources[0].error
        finally:
            shutil.rmtree(out, ignore_errors=True)
    elif contender == "hta":
        import logging

        logging.disable(logging.CRITICAL)
        from hta.trace_analysis import TraceAnalysis

        base = peak_rss_mb()
        d = Path(tempfile.mkdtemp(prefix="hta-bench-"))
        try:
            os.symlink(path, d / path.name)
            t0, c0 = time.perf_counter(), time.process_time()
            analysis = TraceAnalysis(trace_dir=str(d))
            elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
            n = sum(len(df) for df in analysis.t.traces.values())
        finally:
            shutil.rmtree(d, ignore_errors=True)
    else:
        raise SystemExit(f"unknown contender {contender}")
    return {"contender": contender, "seconds": elapsed, "cpu": cpu, "events": n, "rss_mb": peak_rss_mb(),
            "base_rss_mb": base}


def measure(contender: str, path: Path, repeat: int, python: str = sys.executable) -> dict | None:
    best: dict | None = None
    for _ in range(repeat):
        proc = subprocess.run([python, str(HERE), "--child", contender, str(path)],
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            print(f"  {contender}: failed ({proc.stderr.strip().splitlines()[-1:]})", file=sys.stderr)
            return None
        res = json.loads(proc.stdout.strip().splitlines()[-1])
        if best is None:
            best = res
        else:
            best = {**best, "seconds": min(best["seconds"], res["seconds"]),
                    "cpu": min(best["cpu"], res["cpu"]), "rss_mb": max(best["rss_mb"], res["rss_mb"])}
    return best


def make_scaled(src: Path, factor: int, dest: Path) -> Path:
    """`factor` copies of src's traceEvents, each shifted past the previous, in one gzip file."""
    import msgspec

    with gzip.open(src, "rb") as fh:
        doc = json.load(fh)
    events = doc.pop("traceEvents")
    times = [e["ts"] for e in events if isinstance(e.get("ts"), (int, float))]
    span = int(max(times) - min(times)) + 1_000
    enc = msgspec.json.Encoder()
    with gzip.open(dest, "wb", compresslevel=6) as out:
        head = enc.encode(doc)
        out.write(head[:-1] + b', "traceEvents": [')
        for k in range(factor):
            shifted = []
            for e in events:
                if isinstance(e.get("ts"), (int, float)):
                    e = {**e, "ts": e["ts"] + k * span}
                shifted.append(e)
            body = enc.encode(shifted)[1:-1]
            if k:
                out.write(b",\n")
            out.write(body)
        out.write(b"]}")
    return dest


def report(label: str, path: Path, repeat: int, with_hta: bool, baseline: str | None = None) -> dict:
    size = path.stat().st_size
    with gzip.open(path, "rb") as fh:
        raw_size = sum(len(c) for c in iter(lambda: fh.read(1 << 24), b""))
    print(f"\n{label}: {path.name} ({size / 1e6:.1f} MB gz, {raw_size / 1e6:.1f} MB JSON)")
    rows = {}
    for contender in ("floor", "tracekit", *(["baseline"] if baseline else []), *(["hta"] if with_hta else [])):
        if contender == "baseline":
            res = measure("tracekit", path, repeat, baseline)
            if res is not None:
                res["contender"] = "baseline"
        else:
            res = measure(contender, path, repeat)
        if res is None:
            continue
        rows[contender] = res
        print(f"  {contender:9s} {res['seconds']:7.2f} s wall {res['cpu']:6.2f} s CPU  "
              f"peak RSS {res['rss_mb']:6.0f} MB "
              f"(after imports {res['base_rss_mb']:.0f} MB)  events {res['events']:,}")
    tk, floor, hta, base = rows.get("tracekit"), rows.get("floor"), rows.get("hta"), rows.get("baseline")
    if tk and base:
        print(f"  tracekit / baseline:   {tk['seconds'] / base['seconds']:.2f}x wall, peak RSS above imports "
              f"{(tk['rss_mb'] - tk['base_rss_mb']) / (base['rss_mb'] - base['base_rss_mb']):.2f}x")
    if tk and floor:
        print(f"  tracekit / floor time: {tk['seconds'] / floor['seconds']:.2f}x wall, "
              f"{tk['cpu'] / floor['cpu']:.2f}x CPU (target <= 1.5x)")
    if tk and hta:
        print(f"  HTA / tracekit time:   {hta['seconds'] / tk['seconds']:.1f}x wall, "
              f"{hta['cpu'] / tk['cpu']:.1f}x CPU (target >= 5x)")
        print(f"  tracekit / HTA RSS:    {tk['rss_mb'] / hta['rss_mb']:.2f} (target <= 0.5)")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--scale", type=int, action="append", help="repeat for several sizes (default: 10)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-hta", action="store_true")
    ap.add_argument("--baseline-python", metavar="EXE",
                    help="also run the tracekit contender with this interpreter's tracekit (the code before a change)")
    ap.add_argument("--child", nargs=2, metavar=("CONTENDER", "PATH"), help=argparse.SUPPRESS)
    ap.add_argument("--make-scaled", nargs=3, metavar=("SRC", "FACTOR", "DEST"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.make_scaled:
        src, factor, dest = args.make_scaled
        make_scaled(Path(src), int(factor), Path(dest))
        return
    if args.child:
        print(json.dumps(run_one(args.child[0], Path(args.child[1]))))
        return
    if not args.trace.is_file():
        raise SystemExit(f"benchmark trace not found: {args.trace}")
    try:
        import hta  # noqa: F401
        with_hta = not args.no_hta
    except ImportError:
        with_hta = False
        print("HTA not importable: skipping it (pip install holistictraceanalysis)")
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, best of {args.repeat}")
    base = args.baseline_python
    sizes = {1: (report("1x", args.trace.resolve(), args.repeat, with_hta, base), _json_mb(args.trace))}
    for scale in sorted(set(args.scale or [10])):
        with tempfile.TemporaryDirectory(prefix="tk-bench-") as tmp:
            big = Path(tmp) / f"df_index_resolver_x{scale}.json.gz"
            subprocess.run([sys.executable, str(HERE), "--make-scaled", str(args.trace), str(scale), str(big)],
                           check=True)
            sizes[scale] = (report(f"{scale}x", big, max(1, args.repeat - 1), with_hta, base), _json_mb(big))
    print("\npeak RSS above the process's imports, per 100 MB of JSON:")
    for scale, (rows, mb) in sizes.items():
        print(f"  {scale:>3}x {mb:7.0f} MB JSON: " + ", ".join(
            f"{name} {r['rss_mb'] - r['base_rss_mb']:.0f} MB ({(r['rss_mb'] - r['base_rss_mb']) / mb * 100:.0f})"
            for name, r in rows.items()))


def _json_mb(path: Path) -> float:
    with gzip.open(path, "rb") as fh:
        return sum(len(c) for c in iter(lambda: fh.read(1 << 24), b"")) / 1e6


if __name__ == "__main__":
    main()
