"""What a check for keys repeated inside Kineto events would cost, against the ingest it would slow.

Run:  python benchmarks/bench_key_checks.py [--trace PATH] [--rounds 2]

Input: the 53.7 MB `df_index_resolver` trace of bench_ingest.py. In one process, alternating
`--rounds` times (least CPU of each kept), times the whole ingest (`ingest([path], jobs=1)`,
every thread's CPU) and, on the trace's `traceEvents` array held in memory, the batch decode and
each candidate check, as a share of the ingest's CPU. numba's import is timed in a fresh
interpreter (the Kineto ingest never imports numba otherwise). Issue 22: a check should cost
<= ~3% of the ingest; the only candidates under it cannot tell a repeat (docs/formats.md 'Limits').
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve()
DEFAULT_TRACE = HERE.parents[2] / "shared" / "real_traces" / "kineto" / "hta_df_index_resolver" / \
    "df_index_resolver.json.gz"


def least_cpu(f: Callable[[], object], n: int = 3) -> float:
    best = float("inf")
    for _ in range(n):
        c = time.process_time()
        f()
        best = min(best, time.process_time() - c)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    if not args.trace.is_file():
        sys.exit(f"{args.trace}: not found (give --trace)")

    import msgspec
    import numpy as np
    import pyarrow as pa

    from tracekit.ingest import ingest
    from tracekit.parsers import kineto
    from tracekit.parsers._json_keys import RepeatedKeys
    from tracekit.parsers._stream import scan_value

    pa.array([0])
    with gzip.open(args.trace) as fh:
        raw = fh.read()
    start = raw.find(b"[", raw.find(b'"traceEvents"'))
    events = raw[start:scan_value(raw, start, True)[0]]
    del raw
    a = np.frombuffer(events, np.uint8)
    raw_list = msgspec.json.Decoder(list[msgspec.Raw])

    def do_ingest() -> None:
        out = Path(tempfile.mkdtemp(prefix="tk-keys-"))
        try:
            ingest([args.trace], out / "run", jobs=1)
        finally:
            shutil.rmtree(out, ignore_errors=True)

    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import numba"], check=True)
    numba_wall = time.perf_counter() - t
    RepeatedKeys().scan(events[:4096])  # numba compiled or loaded from its cache before timing
    contenders: dict[str, Callable[[], object]] = {
        "ingest (whole)": do_ingest,
        "batch decode (msgspec, typed)": lambda: kineto.decode_events(events),
        'bytes.count(b\'":\')': lambda: events.count(b'":'),
        "bytes.count(b':')": lambda: events.count(b":"),
        "numpy count of ':'": lambda: np.count_nonzero(a == 58),
        "bytes.find (one byte, memchr)": lambda: events.find(b"\x00"),
        "msgspec decode to list[Raw]": lambda: raw_list.decode(events),
        "numba scan (_kernels.repeated_keys)": lambda: RepeatedKeys().scan(events),
    }
    best = dict.fromkeys(contenders, float("inf"))
    for _ in range(args.rounds):
        for name, f in contenders.items():
            best[name] = min(best[name], least_cpu(f, 2 if name.startswith("ingest") else 3))
    whole = best["ingest (whole)"]
    print(f"{args.trace.name}: {len(events) / 1e6:.1f} MB of traceEvents")
    for name, cpu in best.items():
        print(f"  {name:38s} {cpu * 1000:8.1f} ms CPU  {100 * cpu / whole:6.1f}% of the ingest")
    print(f"  numba import, fresh interpreter (wall, with Python's start) {numba_wall * 1000:.0f} ms")


if __name__ == "__main__":
    main()
