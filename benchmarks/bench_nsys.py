"""Nsight Systems SQLite ingest: rows per second against a plain sqlite3 SELECT of the same rows.

Run:  nice python benchmarks/bench_nsys.py [--mb 1024] [--keep]

Input: a synthetic job (2 hosts x 4 GPUs, PP 2, EP 1) written as Nsight exports by
`tracekit.synth_nsys.write_nsys`; host 0's database is then grown inside SQLite to about `--mb`
MB by repeating its timeline (kernels, runtime calls, waits, CUDA event records and NVTX ranges,
each copy shifted by the timeline's span and its correlation ids by their maximum), so it stays
a consistent report of a longer run. A 1/8 sized copy is made too: bounded memory means about the
same peak RSS for both. Everything is made under a private temporary directory and deleted.

Contenders, each in its own subprocess (wall and CPU time; peak RSS):

  select    sqlite3: `SELECT` of the same columns of the same tables tracekit reads, fetched in
            batches of the parser's size (the floor: every row crosses into Python once)
  parse     tracekit.parsers.nsys.parse into a SourceSink (rows -> Kineto passes -> Parquet part)

Printed: rows, MB, rows/s of each (wall and CPU), the parse/select time ratios, peak RSS per size
and the ratio of the two sizes' parse peaks (bounded memory: about 1).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GROWN = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
         "CUPTI_ACTIVITY_KIND_CUDA_EVENT", "NVTX_EVENTS")


def make_db(folder: Path) -> Path:
    from tracekit.synth import make_run_tables
    from tracekit.synth_nsys import write_nsys

    tables, _ = make_run_tables(hosts=2, gpus_per_host=4, pp=2, ep=1, steps=4, seed=7)
    return write_nsys(tables, folder)[0]


def grow(path: Path, mb: int) -> float:
    """Repeat the report's timeline until the file is about `mb` MB; return the copies."""
    db = sqlite3.connect(path)
    span = db.execute("SELECT max(end) + 1000 FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    corr = max(db.execute(f"SELECT coalesce(max(correlationId), 0) + 1 FROM {t}").fetchone()[0]
               for t in GROWN if t != "NVTX_EVENTS")
    cols = {t: [r[1] for r in db.execute(f"PRAGMA table_info({t})")] for t in GROWN}
    copies = 1
    while path.stat().st_size < mb << 20:
        step = copies  # double each round (the last one copies only the share still missing)
        share = min(1.0, ((mb << 20) - path.stat().st_size) / path.stat().st_size)
        for t in GROWN:
            sel = []
            for c in cols[t]:
                if c in ("start", "end"):
                    sel.append(f"{c} + {span * step}")
                elif c == "correlationId":
                    sel.append(f"{c} + {corr * step}")
                else:
                    sel.append(c)
            where = ["eventType IN (59, 60) AND start > 1000000"] if t == "NVTX_EVENTS" else []
            if share < 1.0:  # the first `share` of the timeline made so far (in time, or in correlation ids)
                key, length = ("start", span * copies) if "start" in cols[t] else ("correlationId", corr * copies)
                where.append(f"{key} < (SELECT min({key}) + {share} * {length} FROM {t})")
            cond = f"WHERE {' AND '.join(where)}" if where else ""
            db.execute(f"INSERT INTO {t} ({', '.join(cols[t])}) SELECT {', '.join(sel)} FROM {t} {cond}")
        db.commit()
        if share < 1.0:
            return copies + share
        copies *= 2
    db.close()
    return copies


def _select(path: str) -> dict:
    from tracekit.parsers import nsys

    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    queries = {
        "StringIds": "id, value",
        "CUPTI_ACTIVITY_KIND_KERNEL": "start, end, deviceId, streamId, globalPid, correlationId, demangledName",
        "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": "start, end, deviceId, streamId, globalPid, correlationId, syncType, "
                                               "eventId",
        "CUPTI_ACTIVITY_KIND_CUDA_EVENT": "globalPid, eventId, correlationId, streamId",
        "CUPTI_ACTIVITY_KIND_RUNTIME": "start, end, globalTid, correlationId, nameId",
        "NVTX_EVENTS": "start, end, eventType, globalTid, text, textId, jsonText, domainId",
    }
    rows = 0
    for table, cols in queries.items():
        cur = db.execute(f"SELECT {cols} FROM {table}")
        while batch := cur.fetchmany(nsys.BATCH_ROWS):
            rows += len(batch)
    return {"rows": rows}


def _parse(path: str, out: str) -> dict:
    from tracekit.parsers import nsys
    from tracekit.store import SourceSink

    sink = SourceSink(Path(out), "bench")
    try:
        res = nsys.parse(path, sink)
    finally:
        sink.close()
    assert res.stats.balanced
    return {"rows": res.stats.read, "events": res.events, "collectives": res.collectives, "ranks": res.ranks}


def child(kind: str, path: str, out: str) -> None:
    from _rss import peak_rss_mb

    t0, c0 = time.perf_counter(), time.process_time()
    doc = _select(path) if kind == "select" else _parse(path, out)
    doc.update(wall_s=time.perf_counter() - t0, cpu_s=time.process_time() - c0, peak_mb=peak_rss_mb())
    print(json.dumps(doc))


def run(kind: str, path: Path, out: Path) -> dict:
    done = subprocess.run([sys.executable, __file__, "--child", kind, str(path), str(out)], capture_output=True,
                          text=True, check=True, cwd=Path(__file__).parent)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=int, default=1024)
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return
    with tempfile.TemporaryDirectory(prefix="tracekit-bench-nsys-") as tmp:
        tmp_path = Path(tmp)
        print(f"{'size':>8} {'rows':>11} {'contender':>9} {'wall s':>8} {'cpu s':>8} {'rows/s':>11} "
              f"{'cpu rows/s':>11} {'peak MB':>8} {'vs select':>9} {'cpu vs':>7}")
        peaks = []
        for mb in (max(1, args.mb // 8), args.mb):
            folder = tmp_path / f"db{mb}"
            path = make_db(folder)
            grow(path, mb)
            size = path.stat().st_size / 1e6
            floor = run("select", path, tmp_path / f"run{mb}")
            parsed = run("parse", path, tmp_path / f"run{mb}")
            for name, doc in (("select", floor), ("parse", parsed)):
                print(f"{size:>6.0f}MB {doc['rows']:>11,} {name:>9} {doc['wall_s']:>8.1f} {doc['cpu_s']:>8.1f} "
                      f"{doc['rows'] / doc['wall_s']:>11,.0f} {doc['rows'] / doc['cpu_s']:>11,.0f} "
                      f"{doc['peak_mb']:>8.0f} {doc['wall_s'] / floor['wall_s']:>8.1f}x "
                      f"{doc['cpu_s'] / floor['cpu_s']:>6.1f}x")
            print(f"         parse stored {parsed['events']:,} events, {parsed['collectives']:,} collective calls, "
                  f"ranks {parsed['ranks']}; load average {os.getloadavg()[0]:.1f}")
            peaks.append(parsed["peak_mb"])
        print(f"parse peak RSS at {args.mb} MB / at {max(1, args.mb // 8)} MB: {peaks[1] / peaks[0]:.2f}x")


if __name__ == "__main__":
    main()
