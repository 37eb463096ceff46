"""NCCL debug log ingest: speed against `grep -c` of the same file, and bounded memory.

Run:  python benchmarks/bench_nccl_log.py [--ranks 8] [--lines 1000000] [--keep]

Input: a log made here of `--ranks` processes (2 nodes) writing `--lines` COLL lines each, as one
NCCL_DEBUG_FILE-style node log would hold them interleaved: each process's setup (Init, Trees,
transport lines), then its AllReduce/AllGather calls with 2.24-style tuning lines every 64
calls. The defaults make 8 x 1M COLL lines (about 1 GB). A 1/8 sized log is made too, so that
peak RSS can be compared across sizes: bounded memory means the same peak for both.

Contenders, each in its own subprocess (wall and CPU time of the work; peak RSS of the process):

  grep      `grep -c opCount FILE` (the floor: one pass over the bytes, no parsing)
  imports   the interpreter with polars, pyarrow and tracekit.ingest imported (the memory floor)
  read      polars reading the log as one string column (a plain read that holds the file)
  parse     tracekit.parsers.nccl_log.parse into a SourceSink (parse + spool + Parquet part)
  ingest    tracekit.ingest.ingest([FILE], run, jobs=1) (parse, then the run-level merge)
  baseline  the same ingest run by `--baseline-python` (another install of tracekit, e.g. the
            main checkout's), so a change is measured against the code before it in one run

Printed: MB/s for each and the ratio to grep, peak RSS for each size, and the peak above the
imports floor per 100k COLL rows.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _rss import peak_rss_mb


def make_log(path: Path, ranks: int, lines: int) -> int:
    """Write the synthetic node log; return the number of COLL lines."""
    hosts = [f"gpu-node-{h:02d}" for h in range(2)]
    per_host = max(1, ranks // 2)
    comm_id = 0x5EED0F00DCAFE123
    heads = []
    with open(path, "w", buffering=1 << 22) as fh:
        for r in range(ranks):
            host, dev, pid = hosts[min(r // per_host, 1)], r % per_host, 20000 + r
            head = f"{host}:{pid}:{pid} [{dev}] NCCL INFO "
            heads.append(head)
            comm = f"0x55d0{r:04x}b0"
            fh.write(f"{head}NCCL version 2.24.3+cuda12.6\n")
            fh.write(f"{head}ncclCommInitRank comm {comm} rank {r} nranks {ranks} cudaDev {dev} nvmlDev {dev} "
                     f"busId {0x18 + 16 * dev:x}000 commId 0x{comm_id:x} - Init START\n")
            fh.write(f"{head}Trees [0] {r + 1 if r + 1 < ranks else -1}/-1/-1->{r}->{r - 1}\n")
            nxt = (r + 1) % ranks
            via = "NET/IB/0/GDRDMA" if nxt // per_host != r // per_host else "P2P/IPC/read"
            tag = "[send] " if via.startswith("NET") else ""
            fh.write(f"{head}Channel 00/0 : {r}[{dev}] -> {nxt}[{nxt % per_host}] {tag}via {via}\n")
            fh.write(f"{head}Connected all rings, use ring PXN 0 GDR 1\n")
            fh.write(f"{head}ncclCommInitRank comm {comm} rank {r} nranks {ranks} cudaDev {dev} nvmlDev {dev} "
                     f"busId {0x18 + 16 * dev:x}000 commId 0x{comm_id:x} - Init COMPLETE\n")
        n = 0
        chunk: list[str] = []
        for i in range(lines):
            name, count = ("AllReduce", 4096 + i % 7) if i % 5 else ("AllGather", 512)
            for r in range(ranks):
                chunk.append(f"{heads[r]}{name}: opCount {i:x} sendbuff 0x7f3a{r:02x}000200 recvbuff 0x7f3a{r:02x}0"
                             f"00400 count {count} datatype 7 op 0 root 0 comm 0x55d0{r:04x}b0 [nranks={ranks}] "
                             f"stream 0x5611aa{r:02x}\n")
                n += 1
                if i % 64 == 0:
                    chunk.append(f"{heads[r]}{name}: {count * 4} Bytes -> Algo RING proto SIMPLE "
                                 "channel{Lo..Hi}={0..1}\n")
            if len(chunk) > 50_000:
                fh.write("".join(chunk))
                chunk.clear()
        fh.write("".join(chunk))
    return n


def run_one(contender: str, path: Path) -> dict:
    """Runs inside the child."""
    t0, c0 = time.perf_counter(), time.process_time()
    if contender == "imports":
        import polars  # noqa: F401
        import pyarrow  # noqa: F401

        import tracekit.ingest  # noqa: F401

        rows = None
    elif contender == "read":
        import polars as pl

        df = pl.read_csv(path, has_header=False, separator="\x1f", quote_char=None, new_columns=["line"],
                         schema_overrides={"line": pl.String})
        rows = int(df["line"].str.contains("opCount", literal=True).sum())
    elif contender == "parse":
        from tracekit.parsers import nccl_log
        from tracekit.store import SourceSink

        with tempfile.TemporaryDirectory(prefix="bench-nccl-") as tmp:
            sink = SourceSink(Path(tmp), "k")
            res = nccl_log.parse(path, sink)
            sink.close()
            rows = res.collectives
    elif contender == "ingest":
        from tracekit.ingest import ingest

        with tempfile.TemporaryDirectory(prefix="bench-nccl-") as tmp:
            report = ingest([path], Path(tmp) / "run", jobs=1)
            rows = report.tables.get("collectives", 0)
    else:
        raise SystemExit(f"unknown contender {contender}")
    return {"wall": time.perf_counter() - t0, "cpu": time.process_time() - c0, "rss_mb": peak_rss_mb(), "rows": rows}


def measure(contender: str, path: Path, python: str = sys.executable) -> dict:
    if contender == "grep":
        t0 = time.perf_counter()
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        out = subprocess.run(["grep", "-c", "opCount", str(path)], capture_output=True, text=True, check=True)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        return {"wall": time.perf_counter() - t0, "cpu": (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime),
                "rss_mb": None, "rows": int(out.stdout)}
    out = subprocess.run([python, __file__, "--child", contender, str(path)], capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--lines", type=int, default=1_000_000, help="COLL lines per rank")
    ap.add_argument("--keep", action="store_true", help="keep the generated logs (printed paths)")
    ap.add_argument("--baseline-python", metavar="EXE",
                    help="also run the ingest with this interpreter's tracekit (the code before a change)")
    ap.add_argument("--child", nargs=2, metavar=("CONTENDER", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(run_one(args.child[0], Path(args.child[1]))))
        return
    tmp = Path(tempfile.mkdtemp(prefix="bench-nccl-log-"))
    try:
        t0 = time.perf_counter()
        sizes = []
        for label, lines in (("1/8", max(1, args.lines // 8)), ("1/2", max(1, args.lines // 2)), ("1", args.lines)):
            path = tmp / f"{lines}.log"
            n = make_log(path, args.ranks, lines)
            sizes.append((label, path, path.stat().st_size / 1e6, n))
        print("generated " + ", ".join(f"{n:,} COLL lines ({mb:,.0f} MB)" for _, _, mb, n in sizes)
              + f" in {time.perf_counter() - t0:.1f} s")
        big, mb_big, n_big = sizes[-1][1], sizes[-1][2], sizes[-1][3]
        grep = measure("grep", big)
        assert grep["rows"] == n_big, grep
        floor = measure("imports", big)["rss_mb"]
        print(f"imports floor: peak RSS {floor:.0f} MB")
        print(f"{'contender':<10} {'size':>6} {'wall s':>8} {'cpu s':>8} {'MB/s':>8} {'x grep':>7} {'peak RSS MB':>12} "
              f"{'MB/100k rows':>13}")
        print(f"{'grep -c':<10} {'1':>6} {grep['wall']:>8.2f} {grep['cpu']:>8.2f} {mb_big / grep['wall']:>8.0f} "
              f"{1.0:>7.1f} {'-':>12}")
        peaks: dict[tuple[str, str], float] = {}
        for contender in ("read", "parse", "ingest", *(["baseline"] if args.baseline_python else [])):
            for label, path, mb, n in sizes:
                if contender == "baseline":
                    r = measure("ingest", path, args.baseline_python)
                else:
                    r = measure(contender, path)
                peaks[contender, label] = r["rss_mb"]
                assert r["rows"] == n, (contender, r, n)
                ratio = r["wall"] / grep["wall"] * (mb_big / mb)
                print(f"{contender:<10} {label:>6} {r['wall']:>8.2f} {r['cpu']:>8.2f} {mb / r['wall']:>8.1f} "
                      f"{ratio:>7.1f} {r['rss_mb']:>12.0f} {(r['rss_mb'] - floor) / n * 1e5:>13.1f}")
        if args.baseline_python:
            print("ingest / baseline, peak RSS above the imports floor: " + ", ".join(
                f"{label} {(peaks['ingest', label] - floor) / (peaks['baseline', label] - floor):.2f}"
                for label, *_ in sizes))
        print("x grep: wall time per MB relative to grep -c on the largest file; bounded memory: the peak RSS of "
              "'parse' is about the same for every size; MB/100k rows: peak above the imports floor per 100k COLL "
              "rows ('read' holds the whole file, for scale).")
        if args.keep:
            print("kept: " + " ".join(str(p) for _, p, _, _ in sizes))
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("POLARS_MAX_THREADS", "2")
    main()
