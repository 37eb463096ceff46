"""Structural mutation fuzzing of every parser, shared by `tests/fuzz` (short CI profile) and
`benchmarks/fuzz.py` (long runs).

Seeds are real files (../shared/real_traces, when present) and the repository's own inputs
(sample_traces/, tests/parsers/nccl_data), each assigned to the parser that `detect` picks for
it; parsers without a seed file get small built-in ones made here, so a clone without ../shared
fuzzes every parser. A case is one seed with one to three mutations, chosen by the
seed's encoding:

* JSON (Kineto, Flight Recorder JSON, nccl-tests `-J`, JSON telemetry): decoded and mutated as a
  tree (delete, duplicate and swap keys, wrong types, huge and negative numbers, NaN/Infinity,
  deep nesting, non-object top level), re-encoded, then possibly mutated as bytes;
* pickles (Flight Recorder): loaded with the restricted unpickler, mutated as a tree, re-pickled
  (or the pickle bytes flipped, truncated, memo-bombed);
* text (nccl-tests, NCCL logs, telemetry text): lines deleted, duplicated, swapped, numbers
  replaced by huge, negative or NaN ones, very long lines;
* bytes, for every encoding: invalid UTF-8, a BOM, a stray brace, truncation at a random
  offset, byte flips; gzip seeds are recompressed and the gzip stream may be corrupted.

`run_case` parses one case into a scratch run directory and classifies the outcome: `ok`,
`salvage` (parsed, with warnings or skips other than the format's routine ones), `error` (a
clean one-line `TracekitError`), `crash` (any other exception, or an invariant broken: read =
stored + skipped, one-line messages, times within range) or `hang`.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import importlib
import io
import json
import math
import os
import pickle
import random
import re
import shutil
import signal
import sys
import traceback
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
REAL = REPO / ".." / "shared" / "real_traces"
SAMPLES = REPO / "sample_traces"
#: small inputs the parser tests made (NCCL Inspector, profiler plugin, nccl-tests)
TEST_DATA = REPO / "tests" / "parsers" / "nccl_data"
#: Seeds larger than this (decompressed) are cut to an excerpt; cases stay small and fast.
SEED_MAX = 64 << 10
#: Largest case (before gzip): size is not what a case tests; a bomb is built by a mutator.
MAX_CASE = 4 << 20

HUGE = [2**63, 2**63 - 1, -(2**63) - 1, 2**64, 10**30, -(10**30), 2**31, -1, -(2**31) - 1, 10**400]
ODD = [None, True, "", "x" * 5000, [], {}, [1, 2], {"a": 1}, 1.5, -0.0, "NaN", "\u202e\x1b]0;x\x07"]
ROUTINE_SKIPS = {"metadata", "flow", "instant", "counter", "async", "begin_end", "object", "sample", "mark",
                 "clock_sync", "no_category", "unknown_category", "cpu_op", "python_function", "nvtx_domain",
                 "nvtx_mark"}


@dataclass
class Seed:
    fmt: str
    name: str
    data: bytes  # decompressed content
    gz: bool
    encoding: str  # json | pickle | text | sqlite


@dataclass
class Outcome:
    kind: str  # ok | salvage | error | crash | hang
    detail: str = ""
    signature: str = ""


@dataclass
class Tally:
    cases: int = 0
    counts: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(("ok", "salvage", "error", "crash", "hang"), 0))
    failures: dict[str, tuple[bytes, str, str]] = field(default_factory=dict)

    def add(self, case: bytes, out: Outcome, seed_name: str = "rank_3") -> None:
        self.cases += 1
        self.counts[out.kind] += 1
        if out.kind in ("crash", "hang") and out.signature not in self.failures:
            self.failures[out.signature] = (case, out.detail, seed_name)


# -- seeds ----------------------------------------------------------------------------------


def parsers() -> dict[str, Any]:
    """format -> parser module, for every parser on this checkout."""
    from tracekit.parsers import registry

    return {fmt: importlib.import_module(mod) for fmt, mod in sorted(registry.MODULES.items())}


def _encoding(data: bytes) -> str:
    if data.startswith(b"SQLite format 3\x00"):
        return "sqlite"
    head = data.lstrip(b"\xef\xbb\xbf \t\r\n")[:1]
    if data[:1] == b"\x80" or data[:2] in (b"(l", b"(d", b"}q", b"]q"):
        return "pickle"
    if head in (b"{", b"["):
        try:
            json.loads(data)
            return "json"
        except ValueError:
            return "text"
    return "text"


def _excerpt(data: bytes, encoding: str) -> bytes:
    """A small seed from a big file: the top-level keys and the first events/entries/lines."""
    if len(data) <= SEED_MAX:
        return data
    if encoding == "json":
        doc = json.loads(data)
        if isinstance(doc, dict):
            for key in ("traceEvents", "entries", "results"):
                if isinstance(doc.get(key), list):
                    doc[key] = doc[key][:150]
            out = json.dumps(doc).encode()
            if len(out) <= 4 * SEED_MAX:
                return out
        return data[:SEED_MAX]
    if encoding in ("pickle", "sqlite"):
        return data
    return b"\n".join(data[:SEED_MAX].split(b"\n")[:-1]) + b"\n"


@functools.lru_cache(maxsize=1)
def cached_seeds() -> dict[str, list[Seed]]:
    """`load_seeds()` once per process."""
    return load_seeds()


def load_seeds(formats: set[str] | None = None, *, real: bool = True) -> dict[str, list[Seed]]:
    """Seed files per format (detected by content, as ingest does)."""
    from tracekit.parsers import detect, registry

    roots = [SAMPLES, TEST_DATA] + ([REAL] if real and REAL.is_dir() else [])
    wanted = formats or set(registry.MODULES)
    out: dict[str, list[Seed]] = {f: [] for f in wanted}
    for root in roots:
        for path in sorted(root.rglob("*")):
            if not path.is_file() or path.suffix in (".md", ".py") or path.stat().st_size > 8 << 20:
                continue
            try:
                fmt = detect.detect_format(path)
            except Exception:
                continue
            if fmt not in wanted or len(out[fmt]) >= 12:
                continue
            raw = path.read_bytes()
            gz = raw[:2] == b"\x1f\x8b"
            try:
                data = gzip.decompress(raw) if gz else raw
            except (OSError, EOFError, zlib.error):
                continue
            enc = _encoding(data)
            out[fmt].append(Seed(fmt, str(path.relative_to(root.parent)), _excerpt(data, enc), gz, enc))
    for fmt, seeds in out.items():
        if not seeds:
            seeds.extend(_builtin_seeds(fmt))
    return out


def _builtin_seeds(fmt: str) -> list[Seed]:
    """Tiny seeds made here, for formats with no seed file."""
    if fmt == "sysfs_ib":
        base = "/sys/class/infiniband/mlx5_0/ports/1"
        text = "1700000000\n" + "".join(f"{base}/{f}:{v}\n" for f, v in (
            ("counters/port_xmit_data", 4294967295), ("counters_ext/port_xmit_data_64", 123456789012),
            ("counters_ext/port_rcv_data_64", 98765432101), ("counters/port_xmit_wait", 77),
            ("rate", "100 Gb/sec (4X EDR)"))) + "1700000010\n" + f"{base}/counters_ext/port_xmit_data_64:123956789012\n"
        return [Seed(fmt, "sysfs.txt", text.encode(), False, "text")]
    if fmt == "link_map":
        csv = "host,device,port,link\nnode7,mlx5_0,1,node7-rail0\n,leaf3,17,node7-rail0\nnode8,mlx5_1,1,node8-rail1\n"
        yml = "links:\n  - {host: node7, device: mlx5_0, port: 1, peer_device: leaf3, peer_port: 17, gbps: 400}\n"
        return [Seed(fmt, "map.csv", csv.encode(), False, "text"), Seed(fmt, "map.yaml", yml.encode(), False, "text")]
    if fmt == "gnmic":
        tags = {"source": "spine2:6030", "subscription-name": "ports", "interface_name": "Ethernet5"}
        events = [{"name": "ports", "timestamp": 1_700_000_000_000_000_000 + k * 10**10, "tags": tags,
                   "values": {"/interfaces/interface/state/counters/in-octets": 1000 + k * 5_000_000,
                              "/interfaces/interface/state/counters/out-octets": 700 + k * 4_000_000}}
                  for k in range(3)]
        return [Seed(fmt, "gnmic_events.json", json.dumps(events).encode(), False, "json")]
    if fmt == "prometheus_json":
        doc = {"status": "success", "data": {"resultType": "matrix", "result": [
            {"metric": {"__name__": "ifHCOutOctets", "instance": "leaf4:9116", "ifName": f"Ethernet{p}"},
             "values": [[1_700_000_000 + 15 * k, str(p * 10**9 + k * 123_456_789)] for k in range(4)]}
            for p in (1, 2)]}}
        return [Seed(fmt, "query_range.json", json.dumps(doc).encode(), False, "json")]
    if fmt == "ufm_telemetry":
        guid = "0x98039b0300a1b2c3"
        doc = {"timestamp": "2024-01-02 03:04:05", "type": "full", "values": [
            {"timestamp": 1_704_164_645_000_000 + k * 10_000_000, "source_id": guid, "node_guid": guid,
             "port_guid": guid, "port_num": port, "Infiniband_MBOut_u_Gb": 40 * k,
             "Infiniband_MBIn_u_Gb": 30 * k, "Infiniband_PckOut_u_Packets": 10**9 * k,
             "Infiniband_XmtDiscards_u_Errors": 0} for k in range(3) for port in (1, 2)]}
        return [Seed(fmt, "ufm_telemetry.json", json.dumps(doc, indent=2).encode(), False, "json")]
    if fmt == "perfquery":
        blocks = []
        for k in range(3):
            fields = {"PortSelect": 1, "CounterSelect": "0x0000", "PortXmitData": 4_000_000 + k * 2_500_000,
                      "PortRcvData": 3_000_000 + k * 2_000_000, "PortXmitPkts": 9000 + k * 700,
                      "PortRcvPkts": 8000 + k * 600, "PortXmitWait": 3 * k}
            blocks.append(f"{1_700_000_000 + 10 * k}\n# Port extended counters: Lid 42 port 1 (CapMask: 0x5A00)\n"
                          + "".join(f"{name}:".ljust(33, ".") + f"{value}\n" for name, value in fields.items()))
        return [Seed(fmt, "perfquery_x.txt", "".join(blocks).encode(), False, "text")]
    if fmt == "ibnetdiscover":
        rows = ["CA    42  1 0x98039b0300a1b2c3 4x HDR - SW     7  3 0x98039b0300d4e5f6 ( 'node1 HCA-1' - 'leaf-a' )",
                "CA    43  1 0x98039b0300a1b2c4 4x HDR - SW     7  4 0x98039b0300d4e5f6 ( 'node2 HCA-1' - 'leaf-a' )",
                "SW     7  3 0x98039b0300d4e5f6 4x HDR - CA    42  1 0x98039b0300a1b2c3 ( 'leaf-a' - 'node1 HCA-1' )",
                "SW     7 40 0x98039b0300d4e5f6 4x HDR - SW     9 12 0x98039b0300f0f0f0 ( 'leaf-a' - 'spine-a' )",
                "SW     7 41 0x98039b0300d4e5f6 4x ???                                    'leaf-a'"]
        return [Seed(fmt, "ibnetdiscover_p.txt", ("\n".join(rows) + "\n").encode(), False, "text")]
    if fmt == "prometheus":
        lines = ["# TYPE ifHCOutOctets counter"] + [
            f'ifHCOutOctets{{instance="leaf4:9116",ifName="Ethernet{p}"}} {p * 10**9 + k * 987_654_321} '
            f"{1_700_000_000_000 + 15_000 * k}" for k in range(4) for p in (1, 2)]
        return [Seed(fmt, "switch.prom", ("\n".join(lines) + "\n").encode(), False, "text")]
    if fmt == "nccl_log":
        return [Seed(fmt, "nccl_2.29.log", _made_nccl_log(), False, "text")]
    if fmt == "nsys":
        return [Seed(fmt, f"nsys_{release}_{nccl}.sqlite", _made_nsys(release, nccl), False, "sqlite")
                for release, nccl in (("2024.5", "2.27"), ("2024.5", "2.21"), ("2020.3", "2.18"))]
    if fmt == "kineto":
        doc = {"distributedInfo": {"rank": 0, "world_size": 2}, "traceEvents": [
            {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "pid": 0, "tid": 7,
             "ts": 10.5, "dur": 3, "args": {"correlation": 5, "stream": 7}}]}
        return [Seed(fmt, "builtin", json.dumps(doc).encode(), False, "json")]
    return []


def _made_nsys(release: str, nccl: str) -> bytes:
    """A one-host, two-GPU Nsight Systems SQLite export (tracekit.synth_nsys)."""
    import tempfile

    from tracekit.synth import make_run_tables
    from tracekit.synth_nsys import write_nsys

    tables, _ = make_run_tables(hosts=1, gpus_per_host=2, pp=2, ep=1, steps=1, micro_batches=1,
                                layers_per_stage=1, kernels_per_block=1, seed=5)
    with tempfile.TemporaryDirectory() as tmp:
        return write_nsys(tables, tmp, release=release, nccl=nccl)[0].read_bytes()


def mutate_sqlite(data: bytes, rnd: random.Random) -> bytes:
    """Row and schema mutations of an SQLite file (in memory): odd values in a column (huge,
    negative, NULL, text, floats, garbage JSON), rows deleted or duplicated, a table or column
    dropped, an end before its start."""
    import sqlite3

    db = sqlite3.connect(":memory:")
    try:
        db.deserialize(data)
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        if not tables:
            return data
        t = rnd.choice(tables)
        cols = [r[1] for r in db.execute(f'PRAGMA table_info("{t}")')]
        r = rnd.random()
        if r < 0.45 and cols:
            c = rnd.choice(cols)
            v = rnd.choice(HUGE + ODD + [0, -5, 2**40, "{\"NCCL communicator ID\": -1, \"Rank\": 999999}",
                                          '{"Rank": "x", "No. of ranks": 1e400}', "[" * 80])
            v = json.dumps(v) if isinstance(v, (list, dict)) else v
            v = str(v) if isinstance(v, int) and not -(2**63) <= v < 2**63 else v
            where = "" if rnd.random() < 0.3 else f" WHERE rowid % {rnd.randint(2, 7)} = 0"
            db.execute(f'UPDATE "{t}" SET "{c}" = ?{where}', (v,))
        elif r < 0.55 and "start" in cols and "end" in cols:
            db.execute(f'UPDATE "{t}" SET "end" = "start" - {rnd.choice([1, 10**9, 2**62])} WHERE rowid % 3 = 0')
        elif r < 0.7:
            db.execute(f'DELETE FROM "{t}" WHERE rowid % {rnd.randint(1, 4)} = 0')
        elif r < 0.8:
            db.execute(f'INSERT INTO "{t}" SELECT * FROM "{t}"')
        elif r < 0.9:
            db.execute(f'DROP TABLE "{t}"')
        elif len(cols) > 1:
            db.execute(f'ALTER TABLE "{t}" DROP COLUMN "{rnd.choice(cols)}"')
        db.commit()
        return db.serialize()
    except (sqlite3.Error, UnicodeDecodeError):  # a mutated name that is not UTF-8
        return data
    finally:
        db.close()


def _made_nccl_log() -> bytes:
    """A two-node NCCL 2.29 debug log, as the parser tests write it (tests/parsers/nccl_eras.py)."""
    parser_tests = str(REPO / "tests" / "parsers")
    if parser_tests not in sys.path:
        sys.path.append(parser_tests)
    import nccl_eras

    return ("\n".join(nccl_eras.job_log(nccl_eras.Job("2.29"))) + "\n").encode()


# -- mutators -------------------------------------------------------------------------------


def _paths(obj: Any, prefix: tuple = (), depth: int = 0) -> Iterator[tuple]:
    yield prefix
    if depth > 6:
        return
    if isinstance(obj, dict):
        for k in list(obj)[:40]:
            yield from _paths(obj[k], (*prefix, k), depth + 1)
    elif isinstance(obj, (list, tuple)):
        n = len(obj)
        idx = range(n) if n <= 20 else sorted({0, 1, n - 1, *(random.Random(n).sample(range(n), 10))})
        for i in idx:
            yield from _paths(obj[i], (*prefix, i), depth + 1)


def _get(obj: Any, path: tuple) -> Any:
    for p in path:
        obj = obj[p]
    return obj


def _set(obj: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    parent = _get(obj, path[:-1])
    if isinstance(parent, tuple):
        parent = list(parent)
        parent[path[-1]] = value
        return _set(obj, path[:-1], tuple(parent))
    parent[path[-1]] = value
    return obj


def _nest(value: Any, n: int) -> Any:
    for _ in range(n):
        value = [value]
    return value


def mutate_tree(obj: Any, rnd: random.Random, max_copies: int = 200) -> Any:
    """One structural mutation of a decoded JSON/pickle tree (elements duplicated at most
    `max_copies` times, so the re-encoded case stays near `MAX_CASE`)."""
    paths = list(_paths(obj))
    path = rnd.choice(paths)
    target = _get(obj, path)
    op = rnd.randrange(10)
    if op == 0 and path:  # delete
        parent = _get(obj, path[:-1])
        if isinstance(parent, (dict, list)):
            del parent[path[-1]]
        return obj
    if op == 1 and isinstance(target, dict) and target:  # duplicate a key under another name
        k = rnd.choice(list(target))
        target[f"{k}"[:20] + rnd.choice(["", "_", " "])] = target[k]
        return obj
    if op == 2 and isinstance(target, (dict, list)) and len(target) >= 2:  # swap two values
        keys = list(target) if isinstance(target, dict) else list(range(len(target)))
        a, b = rnd.sample(keys, 2)
        target[a], target[b] = target[b], target[a]
        return obj
    if op == 3:
        return _set(obj, path, rnd.choice(HUGE))
    if op == 4:
        return _set(obj, path, rnd.choice([math.nan, math.inf, -math.inf]))
    if op == 5:
        return _set(obj, path, _nest(target, rnd.choice([70, 300, 800])))
    if op == 6:
        return _set(obj, path, rnd.choice(ODD))
    if op == 7 and isinstance(target, list) and target:  # duplicate elements (many times)
        target.extend(target[: rnd.randrange(1, 4)] * min(rnd.choice([1, 10, 200]), max_copies))
        return obj
    if op == 8 and isinstance(target, (int, float)) and not isinstance(target, bool):
        return _set(obj, path, -target if rnd.random() < 0.5 else target * rnd.choice([1000, 10**9, 10**18]))
    if op == 9 and not path:
        return rnd.choice([[obj], "text", 42, None, []])
    if isinstance(target, str):
        return _set(obj, path, target + rnd.choice(["\x00", "\x1b[2J", "\ud800", "é" * 50, "}, {"]))
    return _set(obj, path, rnd.choice(HUGE + ODD))


def _json_encode(obj: Any) -> bytes:
    def default(o: Any) -> Any:
        return list(o) if isinstance(o, (set, frozenset, tuple)) else str(o)

    try:
        return json.dumps(obj, default=default).encode("utf-8", "surrogatepass")
    except (ValueError, RecursionError):
        return b"[]"


def _pickle_encode(obj: Any) -> bytes:
    try:
        return pickle.dumps(obj, protocol=random.choice([2, 4, 5]))
    except (RecursionError, pickle.PicklingError, TypeError, ValueError):
        return pickle.dumps(None)


def _copies(k: int, size: int) -> int:
    """`k` copies of `size` bytes, fewer when they would pass `MAX_CASE`: a case is cut to
    `MAX_CASE` anyway, and a mutator building gigabytes first would be the campaign's peak RSS."""
    return max(1, min(k, MAX_CASE // max(1, size)))


def mutate_lines(data: bytes, rnd: random.Random) -> bytes:
    lines = data.split(b"\n")
    if not lines:
        return data
    i = rnd.randrange(len(lines))
    op = rnd.randrange(6)
    if op == 0:
        del lines[i]
    elif op == 1:
        lines[i:i] = [lines[i]] * _copies(rnd.choice([1, 5, 100]), len(lines[i]))
    elif op == 2:
        j = rnd.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
    elif op == 3:
        import re

        nums = list(re.finditer(rb"-?\d+(\.\d+)?", lines[i]))
        if nums:
            m = rnd.choice(nums)
            rep = rnd.choice([b"99999999999999999999999999", b"-1", b"nan", b"inf", b"1e400", b"-0", b"", b"0x7f",
                              b"9" * 5000])  # beyond Python's 4,300-digit int() limit
            lines[i] = lines[i][: m.start()] + rep + lines[i][m.end():]
    elif op == 4:
        lines[i] = lines[i] * _copies(rnd.choice([2, 50, 2000]), len(lines[i]))
    else:
        lines[i] = bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 40)))
    return b"\n".join(lines)


def mutate_bytes(data: bytes, rnd: random.Random) -> bytes:
    op = rnd.randrange(7)
    n = len(data)
    i = rnd.randrange(n + 1)
    if op == 0:
        return data[:i]
    if op == 1 and n:
        j = min(n - 1, i)
        return data[:j] + bytes([data[j] ^ (1 << rnd.randrange(8))]) + data[j + 1:]
    if op == 2:
        return data[:i] + rnd.choice([b"\xff\xfe", b"\xc3\x28", b"\xed\xa0\x80", b"\x80"]) + data[i:]
    if op == 3:
        return b"\xef\xbb\xbf" + data
    if op == 4:
        return data[:i] + rnd.choice([b"}", b"{", b"]", b"[", b",", b'"', b"\\", b":"]) + data[i:]
    if op == 5 and rnd.random() < 0.3:
        k = rnd.choice([100, 5000, 100_000])
        return data[:i] + b"[" * k + b"1" + b"]" * k + data[i:]
    if op == 5:
        j = min(n, i + rnd.randrange(1, 200))
        return data[:i] + data[i:j] * rnd.choice([2, 30]) + data[j:]
    return data[:i] + data[i + rnd.randrange(1, 64):]


def _restricted_load(data: bytes) -> Any:
    from tracekit.parsers import _unpickle

    return _unpickle.loads(data)


def make_case(seed: Seed, rnd: random.Random) -> tuple[bytes, bool]:
    """(file bytes, gzipped) for one mutated case of `seed`."""
    data = seed.data
    for _ in range(rnd.choice([1, 1, 2, 3])):
        r = rnd.random()
        if seed.encoding in ("json", "pickle") and r < 0.6:
            try:
                tree = json.loads(data) if seed.encoding == "json" else _restricted_load(data)
            except Exception:
                data = mutate_bytes(data, rnd)
                continue
            tree = mutate_tree(tree, rnd, max_copies=_copies(200, len(data)))
            data = _json_encode(tree) if seed.encoding == "json" else _pickle_encode(tree)
        elif seed.encoding == "text" and r < 0.6:
            data = mutate_lines(data, rnd)
        elif seed.encoding == "sqlite" and r < 0.75:
            data = mutate_sqlite(data, rnd)
        else:
            data = mutate_bytes(data, rnd)
        if len(data) > MAX_CASE:  # mutations compound (a line x 2000, then x 100): keep cases small
            data = data[:MAX_CASE]
    gz = seed.gz if rnd.random() < 0.8 else not seed.gz
    if not gz:
        return data, False
    comp = gzip.compress(data, compresslevel=1, mtime=0)
    r = rnd.random()
    if r < 0.1:
        comp = comp[: rnd.randrange(2, len(comp) + 1)]
    elif r < 0.2 and len(comp) > 20:
        k = rnd.randrange(10, len(comp))
        comp = comp[:k] + bytes([comp[k] ^ 0x55]) + comp[k + 1:]
    return comp, True


# -- running ------------------------------------------------------------------------------


class Hang(BaseException):
    """Raised by the alarm; a BaseException so parsers' `except Exception` cannot swallow it."""


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    def boom(*_: object) -> None:
        raise Hang

    old = signal.signal(signal.SIGALRM, boom)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _signature(exc: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "tracekit" in f.filename or
              "/parsers/" in f.filename]
    where = f"{Path(frames[-1].filename).name}:{frames[-1].name}" if frames else "?"
    return f"{type(exc).__name__}@{where}"


def _check_tables(run_dir: Path) -> str | None:
    import pyarrow.parquet as pq

    from tracekit._limits import RANGES

    lo, hi = RANGES["time_ns"]
    import pyarrow.compute as pc

    for f in sorted(run_dir.rglob("*.parquet")):
        pf = pq.ParquetFile(f)
        cols = [c for c in ("ts_ns", "time_created_ns") if c in pf.schema_arrow.names]
        if not cols or not pf.metadata.num_rows:
            continue
        t = pf.read(columns=cols)
        for col in cols:
            mm = pc.min_max(t.column(col)).as_py()
            if mm["min"] is not None and (mm["min"] < lo or mm["max"] > hi):
                return f"{f.name}: {col} out of range"
    return None


def case_name(seed_name: str, gz: bool) -> str:
    """The file name a case is written under: the seed's (the rank may come from it)."""
    base = Path(seed_name).name.removesuffix(".gz") or "rank_3"
    return base + ".gz" if gz else base


class MemorySink:
    """A SourceSink that keeps the conformed tables in memory (no Parquet round trip): the
    parser and the schema checks are what a fuzz case exercises; storage has its own tests."""

    def __init__(self, run_dir: Path, key: str) -> None:
        from tracekit.store import SourceSink

        self._real = SourceSink(run_dir, key)
        self.run_dir, self.key, self.part_dir = self._real.run_dir, key, self._real.part_dir
        self.tables: dict[str, list[Any]] = {}

    def add_events(self, data: Any) -> None:
        from tracekit import schema

        table = schema.conform("events", data)
        if table.num_rows:
            self.tables.setdefault("events", []).append(table.select(schema.EVENTS.names).cast(schema.EVENTS))

    def add(self, name: str, data: Any) -> None:
        from tracekit import schema

        if name == "events":
            self.add_events(data)
            return
        table = schema.conform(name, data)
        if table.num_rows:
            self.tables.setdefault(name, []).append(table)

    def close(self) -> dict[str, Any]:
        import pyarrow as pa

        for parts in self.tables.values():
            pa.concat_tables(parts, promote_options="permissive")
        return {}

    def event_path(self, rank: int) -> Path:
        return self._real.event_path(rank)


def _check_memory(sink: MemorySink) -> str | None:
    import pyarrow.compute as pc

    from tracekit._limits import RANGES

    lo, hi = RANGES["time_ns"]
    for name, parts in sink.tables.items():
        for t in parts:
            for col in ("ts_ns", "time_created_ns"):
                if col in t.column_names and t.num_rows:
                    mm = pc.min_max(t.column(col)).as_py()
                    if mm["min"] is not None and (mm["min"] < lo or mm["max"] > hi):
                        return f"{name}: {col} out of range"
    return None


def run_case(fmt: str, module: Any, case: bytes, gz: bool, work: Path, *, timeout: float = 20.0,
             check_tables: bool = True, name: str = "rank_3", memory: bool = True,
             on_stats: Callable[[dict[str, Any]], Any] | None = None) -> Outcome:
    """Parse one case with the library; classify the outcome (`on_stats` gets {"stats": ...}
    when the parse returned)."""
    from tracekit.errors import TracekitError
    from tracekit.store import SourceSink

    if memory and work.is_dir():
        for f in work.iterdir():
            if f.is_file():
                f.unlink()
        shutil.rmtree(work / "run", ignore_errors=True)
    else:
        shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    path = work / case_name(name, gz)
    path.write_bytes(case)
    run_dir = work / "run"
    try:
        with deadline(timeout):
            sink = MemorySink(run_dir, "k") if memory else SourceSink(run_dir, "k")
            try:
                res = module.parse(path, sink, rank=None)
            finally:
                with contextlib.suppress(Exception):
                    sink.close()
    except Hang:
        return Outcome("hang", f"no result after {timeout} s", f"hang@{fmt}")
    except TracekitError as exc:
        msg = str(exc)
        if "\n" in msg.strip() or not msg:
            return Outcome("crash", f"multi-line error: {msg[:300]!r}", "multiline_error")
        if "internal error" in msg:
            return Outcome("crash", msg[:300], "internal_error")
        return Outcome("error", msg[:200])
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        return Outcome("crash", "".join(traceback.format_exception(exc))[-3000:], _signature(exc))
    st = res.stats
    if on_stats is not None:
        on_stats({"stats": st})
    if st.read != st.stored + sum(st.skipped.values()) or st.stored < 0:
        return Outcome("crash", f"accounting: {st.counts()}", "accounting")
    if check_tables:
        try:
            bad = _check_memory(sink) if memory else _check_tables(run_dir)
        except Exception as exc:
            return Outcome("crash", f"unreadable output: {exc}", "unreadable_output")
        if bad:
            return Outcome("crash", bad, "range:" + bad.split(":")[1])
    unusual = set(st.skipped) - ROUTINE_SKIPS
    if st.warnings or unusual or getattr(st, "dropped", None):
        return Outcome("salvage", "; ".join(st.warnings)[:200])
    return Outcome("ok")


def run_cli(case: bytes, gz: bool, work: Path, *, name: str = "rank_3") -> Outcome:
    """`tracekit ingest` then `tracekit info` on one case through the CLI: exit codes and
    one-line errors only, never a traceback."""
    from click.testing import CliRunner

    from tracekit.cli import main

    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    path = work / case_name(name, gz)
    path.write_bytes(case)
    runner = CliRunner()
    for args in (["ingest", str(path), "-o", str(work / "run"), "--jobs", "1"], ["info", str(work / "run")]):
        with deadline(60):
            try:
                res = runner.invoke(main, args, catch_exceptions=True)
            except Hang:
                return Outcome("hang", f"cli {args[0]}", f"hang@cli_{args[0]}")
        if res.exception is not None and not isinstance(res.exception, SystemExit):
            exc = res.exception
            tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            return Outcome("crash", f"cli {args[0]}: {tb[-3000:]}", f"cli_{args[0]}:" + _signature(exc))
        if "Traceback" in res.output:
            return Outcome("crash", f"cli {args[0]} printed a traceback", f"cli_{args[0]}:traceback")
        bad = check_text_output(res.output)
        if bad:
            return Outcome("crash", f"cli {args[0]}: {bad}: {res.output[:2000]!r}", f"cli_{args[0]}:text_output")
        if args[0] == "ingest" and res.exit_code not in (0, 1, 2):
            return Outcome("crash", f"cli ingest exit {res.exit_code}", "cli_exit")
        if res.exit_code != 0:
            break
    return Outcome("ok")


def minimize(case: bytes, still_fails: Callable[[bytes], bool], budget: int = 300,
             seconds: float = 120.0) -> bytes:
    """ddmin on bytes: a smaller case with the same failure signature (within `budget` tries
    and `seconds`)."""
    import time

    stop = time.monotonic() + seconds
    n = 2
    tries = 0
    while len(case) >= 2 and tries < budget and time.monotonic() < stop:
        chunk = max(1, len(case) // n)
        reduced = False
        for start in range(0, len(case), chunk):
            cand = case[:start] + case[start + chunk:]
            tries += 1
            if cand and still_fails(cand):
                case, n, reduced = cand, max(n - 1, 2), True
                break
            if tries >= budget or time.monotonic() >= stop:
                break
        if not reduced:
            if chunk == 1:
                break
            n = min(len(case), n * 2)
    return case


def as_bytes_io(data: bytes) -> io.BytesIO:
    return io.BytesIO(data)


def env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


# -- the hostile classes of issue 22 ---------------------------------------------------------
#
# Each class mutator makes one case of its class from a seed (None when the class does not apply
# to the seed's encoding) and says what must hold beyond the ordinary oracles: `expect(stats)`
# returns what went wrong, or None. `run_class_case` runs one; `run_run_case` attacks a run
# directory instead of a file.

INJECTED = "\nINJECTED line\t\x1b[2J\r\u2028"
#: Line-oriented formats: a line over the bound is a counted skip (or a clean error), never read.
LINE_FORMATS = {"nccl_log", "nccl_tests", "nccl_inspector", "nccl_profiler"}
TEXT_TELEMETRY = {"ibnetdiscover", "perfquery", "sysfs_ib", "link_map", "prometheus"}
#: The line bound while a long-line case runs: small, so a case of a few MB crosses it.
FUZZ_LINE_BOUND = 64 << 10
#: Each parser's own array of records, read whole when its key is given twice.
RECORD_KEYS = {"kineto": "traceEvents", "flight_recorder": "entries"}
HUGE_TEXT = [b"1e30", b"-1e30", b"9223372036854775807.5", b"123456789012345678901234567890.25",
             b"18446744073709551616", b"1.8e19", b"-9.3e18", b"4294967296", b"2147483648"]


@dataclass
class ClassCase:
    data: bytes
    gz: bool
    #: (stats, the seed's own read count) -> what is wrong (None when fine); None for no extra oracle
    expect: Callable[[Any, int | None], str | None] | None = None
    #: the line bound to run the case under (None: the default)
    line_bound: int | None = None


def _split_records(seed: Seed, rnd: random.Random) -> ClassCase | None:
    if seed.encoding != "json":
        return None
    try:
        doc = json.loads(seed.data)
    except ValueError:
        return None
    if not isinstance(doc, dict) or not doc:
        return None
    key = RECORD_KEYS.get(seed.fmt)
    lists = [k for k, v in doc.items() if isinstance(v, list) and len(v) >= 2]
    key = key if key in lists else (rnd.choice(lists) if lists else None)
    if key is None:  # a scalar key given twice, the two values different
        k = rnd.choice(list(doc))
        text = _json_encode(doc)[:-1] + b", " + json.dumps(k).encode() + b": " + _json_encode(rnd.choice(HUGE + ODD))
        return ClassCase(text + b"}", seed.gz)
    items = doc.pop(key)
    cut = rnd.randrange(1, len(items))
    parts = [items[:cut], items[cut:]] if rnd.random() < 0.7 else [items[:cut], items[cut:], []]
    body = _json_encode(doc)[:-1] if doc else b"{"
    sep = b", " if doc else b""
    text = body + sep + b", ".join(json.dumps(key).encode() + b": " + _json_encode(p) for p in parts) + b"}"
    if seed.fmt in RECORD_KEYS and key == RECORD_KEYS[seed.fmt]:
        def expect(stats: Any, seed_read: int | None, key: str = key, n: int = len(parts)) -> str | None:
            if seed_read is None or stats.read == seed_read:
                return None
            return f"{key} given {n} times: read {stats.read} records, the seed whole {seed_read}"

        return ClassCase(text, seed.gz, expect)
    return ClassCase(text, seed.gz)


_INNER_PAIR = re.compile(rb'"([A-Za-z_][\w -]{0,40})"(\s*:\s*)'
                         rb'("(?:[^"\\\n]){0,200}"|-?\d{1,18}(?:\.\d{1,9})?|true|false|null)')
_JSON_LINES = {"nccl_inspector", "nccl_profiler"}
#: a `key: value` pair of a YAML flow mapping (link maps)
_YAML_PAIR = re.compile(rb"(?<=[{,] )([a-z_]{2,20})(: )([^,{}\n]{1,80})(?=[,}])")


def _json_line_at(data: bytes, pos: int) -> bool:
    """Whether the line of `data` holding `pos` is one JSON value (the profiler's lines are the
    items of one array: an opening `[`, a trailing `,` or `]` are not part of it)."""
    start = data.rfind(b"\n", 0, pos) + 1
    end = data.find(b"\n", pos)
    line = data[start:end if end >= 0 else len(data)].strip()
    try:
        json.loads(line.removeprefix(b"[").rstrip(b",]") if line.startswith(b"[{") or line.endswith((b",", b"]"))
                   else line)
    except ValueError:
        return False
    return True


def _inner_keys(seed: Seed, rnd: random.Random) -> ClassCase | None:
    """Keys repeated inside records: before some `"key": value` pairs of the file, the same pair
    once more (the same value, so every reader still decodes it); the reader must read the
    record and say so in a warning (issue 22)."""
    yaml_map = seed.fmt == "link_map" and b"links:" in seed.data
    if seed.encoding != "json" and not (seed.encoding == "text" and seed.fmt in _JSON_LINES) and not yaml_map:
        return None
    pairs = list((_YAML_PAIR if yaml_map else _INNER_PAIR).finditer(seed.data))
    if seed.fmt in _JSON_LINES:  # a line that is not JSON is skipped as malformed: its keys are no test
        pairs = [m for m in pairs if _json_line_at(seed.data, m.start())]
    if not pairs:
        return None
    data = seed.data
    for m in sorted(rnd.sample(pairs, min(len(pairs), rnd.choice([1, 3, 30]))), key=lambda m: -m.start()):
        data = data[:m.start()] + m.group(0) + b", " + data[m.start():]

    def expect(stats: Any, seed_read: int | None) -> str | None:
        if seed.fmt == "kineto":  # read (last value) but not warned inside events: a known gap
            if seed_read is None or stats.read == seed_read:  # (test_duplicate_keys.py); the count holds
                return None
            return f"inner_keys: read {stats.read} events, the seed {seed_read}"
        if any("given more than once" in w for w in stats.warnings):
            return None
        return "inner_keys: a key repeated inside a record, and no warning says so"

    return ClassCase(data, seed.gz, expect)


def _laughs(levels: int, fanout: int) -> str:
    rows = [f"l0: &l0 [{', '.join(['lol'] * fanout)}]"]
    rows += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * fanout)}]" for i in range(1, levels)]
    return "\n".join(rows) + "\n"


def _alias_graph(seed: Seed, rnd: random.Random) -> ClassCase | None:
    text = seed.data.decode("utf-8", "replace")
    if "links:" not in text:
        return None
    kind = rnd.randrange(3)
    if kind == 0:  # billion laughs, the bomb used as a field
        levels = rnd.choice([6, 8, 9, 10])
        head = _laughs(levels, 9)
        body = re.sub(r"device: [^,}\n]+", f"device: *l{levels - 1}", text, count=1)
    elif kind == 1:  # a recursive alias
        head = "loop: &loop [1, *loop]\n"
        body = re.sub(r"port: [^,}\n]+", "port: *loop", text, count=1)
    else:  # depth through aliases
        n = rnd.choice([100, 1000, 5000])
        head = "a0: &a0 [1]\n" + "".join(f"a{i}: &a{i} [*a{i - 1}]\n" for i in range(1, n))
        body = re.sub(r"gbps: [^,}\n]+", f"gbps: *a{n - 1}", text, count=1)
    return ClassCase((head + body).encode(), seed.gz)


def _long_line(seed: Seed, rnd: random.Random) -> ClassCase | None:
    size = rnd.choice([FUZZ_LINE_BOUND + 1, 4 * FUZZ_LINE_BOUND, MAX_CASE - len(seed.data) - 1])
    filler = rnd.choice([b"x", b"NCCL INFO ", b'{"a": ', b"9", b"\t"]) * size
    filler = filler[:max(size, FUZZ_LINE_BOUND + 1)]
    lines = seed.data.split(b"\n")
    at = rnd.randrange(len(lines) + 1)
    data = b"\n".join([*lines[:at], filler, *lines[at:]]) if rnd.random() < 0.7 else seed.data.rstrip(b"\n") + filler
    expect = None
    if seed.fmt in LINE_FORMATS and not (seed.fmt == "nccl_tests" and seed.encoding == "json"):  # -J: one JSON
        def expect(stats: Any, seed_read: int | None) -> str | None:
            return None if stats.skipped.get("line_too_long") else "a line over the bound was not counted"
    return ClassCase(data, seed.gz, expect, line_bound=FUZZ_LINE_BOUND)


def _pickle_storm(seed: Seed, rnd: random.Random) -> ClassCase | None:
    if seed.encoding != "pickle":
        return None
    kind = rnd.randrange(4)
    if kind == 0:  # MARK storm (well compressed when gzipped)
        data = pickle.PROTO + b"\x04" + pickle.MARK * rnd.choice([10_000, 1_000_000, 3_000_000]) + pickle.STOP
    elif kind in (1, 2):  # REDUCE of an allowed constructor over one memoized list, many times
        module, name = (b"builtins", b"frozenset") if kind == 1 else (b"torch.jit._pickle", b"build_strlist")
        strings = rnd.choice([1_000, 50_000])
        head = pickle.PROTO + b"\x04" + pickle.MARK
        head += pickle.SHORT_BINUNICODE + bytes([len(module)]) + module
        head += pickle.SHORT_BINUNICODE + bytes([len(name)]) + name + pickle.STACK_GLOBAL + pickle.MEMOIZE
        head += pickle.MARK + b"".join(pickle.SHORT_BINUNICODE + b"\x06" + f"{i:06d}".encode()
                                       for i in range(strings))
        head += pickle.TUPLE + pickle.TUPLE1 + pickle.MEMOIZE + pickle.POP + pickle.POP
        data = head + (pickle.BINGET + b"\x00" + pickle.BINGET + b"\x01" + pickle.REDUCE) * rnd.choice(
            [10, 200, 2_000]) + pickle.LIST + pickle.STOP
    else:  # the seed's own pickle with a storm spliced in before STOP
        body = seed.data[:-1] if seed.data.endswith(pickle.STOP) else seed.data
        data = body + pickle.MARK * rnd.choice([1000, 200_000]) + pickle.STOP
    return ClassCase(data[:MAX_CASE], rnd.random() < 0.5)


def _huge_numbers(seed: Seed, rnd: random.Random) -> ClassCase | None:
    nums = list(re.finditer(rb"(?<![A-Za-z_])-?\d+(\.\d+)?(?![A-Za-z_])", seed.data))
    if not nums:
        return None
    data = seed.data
    for m in sorted(rnd.sample(nums, min(len(nums), rnd.choice([1, 5, 50]))), key=lambda m: -m.start()):
        rep = rnd.choice(HUGE_TEXT)
        if seed.encoding == "json" and rnd.random() < 0.3:
            rep = b'"' + rep + b'"'
        data = data[:m.start()] + rep + data[m.end():]
    return ClassCase(data, seed.gz)


_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)


def _control_chars(seed: Seed, rnd: random.Random) -> ClassCase | None:
    if seed.encoding == "json":
        # every JSON string, matched from the start so a match never begins at a closing quote
        strings = [m for m in _JSON_STRING.finditer(seed.data) if 2 < m.end() - m.start() <= 82]
        if not strings:
            return None
        data = seed.data
        esc = json.dumps(INJECTED)[1:-1].encode()
        for m in sorted(rnd.sample(strings, min(len(strings), rnd.choice([3, 30, 300]))), key=lambda m: -m.start()):
            data = data[:m.end() - 1] + esc + data[m.end() - 1:]
        return ClassCase(data, seed.gz)
    if seed.encoding == "text":
        words = list(re.finditer(rb"[A-Za-z][\w.-]{2,}", seed.data))
        if not words:
            return None
        data = seed.data
        raw = INJECTED.replace("\n", " ").encode()  # a newline would only split the line
        for m in sorted(rnd.sample(words, min(len(words), rnd.choice([3, 30]))), key=lambda m: -m.start()):
            data = data[:m.end()] + raw + data[m.end():]
        return ClassCase(data, seed.gz)
    return None


def _nvtx_payloads(seed: Seed, rnd: random.Random) -> ClassCase | None:
    """Hostile NCCL NVTX payloads in an Nsight export: a key repeated (a decoy first), deep or
    over-long text, numbers out of range, not JSON; a repeated key must be warned (issue 22)."""
    import sqlite3

    if seed.encoding != "sqlite":
        return None
    db = sqlite3.connect(":memory:")
    try:
        db.deserialize(seed.data)
        rows = db.execute("SELECT rowid, jsonText FROM NVTX_EVENTS WHERE jsonText LIKE '{%'").fetchall()
        if not rows:
            return None
        kind = rnd.choice(["repeat", "deep", "long", "range", "garbage"])
        for rowid, text in rnd.sample(rows, min(len(rows), rnd.choice([1, 3, 30]))):
            if kind == "repeat":
                key = rnd.choice(list(json.loads(text)))
                new = "{" + json.dumps(key) + ": " + json.dumps(rnd.choice(HUGE + ODD)) + ", " + text[1:]
            elif kind == "deep":
                n = rnd.choice([65, 1000, 60_000])
                new = '{"a": ' * n + "1" + "}" * n
            elif kind == "long":
                new = text[:-1] + ', "pad": "' + "x" * rnd.choice([70_000, 1 << 20]) + '"}'
            elif kind == "range":
                doc = json.loads(text)
                doc[rnd.choice(list(doc))] = rnd.choice([*HUGE, 0, -1, 1.5, "0x" + "f" * 40, 1e300])
                new = json.dumps(doc)
            else:
                new = text[:rnd.randrange(1, len(text))] + rnd.choice([r"\ud800", r"\x", "]]", r"\u0000"])
            db.execute("UPDATE NVTX_EVENTS SET jsonText = ? WHERE rowid = ?", (new, rowid))
        db.commit()
        data = db.serialize()
    except (sqlite3.Error, ValueError):
        return None
    finally:
        db.close()
    expect = None
    if kind == "repeat":
        def expect(stats: Any, seed_read: int | None) -> str | None:
            if any("NVTX payload" in w and "given more than once" in w for w in stats.warnings):
                return None
            return "nvtx_payload: a key repeated inside a payload, and no warning says so"
    return ClassCase(data, False, expect)


CLASSES: dict[str, Callable[[Seed, random.Random], ClassCase | None]] = {
    "duplicate_keys": _split_records, "inner_keys": _inner_keys, "alias_graph": _alias_graph, "long_line": _long_line,
    "pickle_storm": _pickle_storm, "huge_number": _huge_numbers, "control_chars": _control_chars,
    "nvtx_payload": _nvtx_payloads,
}


@contextlib.contextmanager
def line_bound(bound: int | None) -> Iterator[None]:
    """Every line reader's bound set to `bound` for one case (the default when None)."""
    if bound is None:
        yield
        return
    from tracekit.parsers import _lines
    from tracekit.parsers.telemetry import ibnetdiscover, link_map, perfquery, prometheus, sysfs_ib

    readers = (_lines, ibnetdiscover, link_map, perfquery, prometheus, sysfs_ib)
    mods = [m for m in readers if hasattr(m, "MAX_LINE_BYTES")]  # (absent before issue 22)
    old = [(m, m.MAX_LINE_BYTES) for m in mods]
    old_block = prometheus.BLOCK_BYTES
    try:
        for m in mods:
            m.MAX_LINE_BYTES = bound
        prometheus.BLOCK_BYTES = bound
        yield
    finally:
        for m, v in old:
            m.MAX_LINE_BYTES = v
        prometheus.BLOCK_BYTES = old_block


def case_bytes(case: ClassCase) -> bytes:
    """The file bytes of a class case (gzipped when the case is)."""
    return gzip.compress(case.data, compresslevel=1, mtime=0) if case.gz else case.data


def run_class_case(fmt: str, module: Any, case: ClassCase, work: Path, *, timeout: float = 20.0,
                   name: str = "rank_3", seed_read: int | None = None) -> Outcome:
    """`run_case` for a class case, with the class's own oracle on the stats."""
    seen: dict[str, Any] = {}
    with line_bound(case.line_bound):
        out = run_case(fmt, module, case_bytes(case), case.gz, work, timeout=timeout, name=name, on_stats=seen.update)
    if out.kind in ("ok", "salvage") and case.expect is not None and "stats" in seen:
        wrong = case.expect(seen["stats"], seed_read)
        if wrong:
            return Outcome("crash", wrong, "class:" + wrong.split(":")[0][:40])
    return out


_RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def check_text_output(text: str) -> str | None:
    """What is wrong with a command's text output: a raw control character, or a line that a
    name from a trace started (the INJECTED marker at the start of a line)."""
    if _RAW_CONTROL.search(text):
        return "raw control character in the output"
    if re.search(r"(?m)^\W*INJECTED", text):
        return "a trace name started a line of the output"
    return None


RUN_COMMANDS = (("ingest",), ("analyze",), ("info",), ("hang",), ("export",), ("report",))


def _tree(root: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        out[rel] = ("link", os.readlink(p)) if p.is_symlink() else None if p.is_dir() else p.read_bytes()
    return out


def plant_links(run: Path, outside: Path, rnd: random.Random, n: int) -> list[str]:
    """Replace `n` random entries of a run (files or directories, any depth, results included) by
    links to copies outside it, or add links at names the commands write; returns them."""
    entries = [p for p in sorted(run.rglob("*")) if not p.is_symlink()]
    planned = [run / "results" / name for name in ("analysis.json", "replay.json", "GENERATION", "export.json")]
    planted = []
    for i in range(n):
        path = rnd.choice(entries + planned)
        if any(path == run / p or run / p in path.parents or path in (run / p).parents for p in planted):
            continue  # inside, or around, an entry already replaced
        target = outside / f"victim{i}"
        if path.is_dir():
            shutil.copytree(path, target, symlinks=True)
            shutil.rmtree(path)
        elif path.exists():
            shutil.copy(path, target)
            path.unlink()
        else:
            target.write_bytes(b"victim")
            path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(target if rnd.random() < 0.8 else outside / "missing")
        planted.append(str(path.relative_to(run)))
    return planted


#: COMMIT markers a received run may hold: other JSON than `store.commit` writes, or names that
#: reach outside the staging or the run.
COMMIT_MARKERS = ('[1, 2]', '{"tables": 5}', '{"tables": ["../../outside/victim"]}', '{"remove": ["../x"]}',
                  '{"tables": ["ranks"], "remove": {"a": 1}}', '{"tables": [null]}', "not json", "")


def plant_commit_marker(run: Path, outside: Path, rnd: random.Random) -> str:
    """A `.staging/` with a COMMIT marker from COMMIT_MARKERS (and a staged table or a link out
    of the run in it); returns what was planted."""
    staging = run / ".staging"
    if staging.is_symlink() or (staging.exists() and not staging.is_dir()):
        staging.unlink()
    staging.mkdir(exist_ok=True)
    marker = rnd.choice(COMMIT_MARKERS)
    (staging / "COMMIT").write_text(marker)
    if rnd.random() < 0.5:
        (outside / "victim.parquet").write_bytes(b"victim")
        (staging / "ranks.parquet").symlink_to(outside / "victim.parquet")
    else:
        (staging / "ranks.parquet").write_bytes(b"not parquet")
    return f".staging/COMMIT={marker!r}"


def run_run_case(base_run: Path, traces: list[str], work: Path, rnd: random.Random) -> Outcome:
    """One received-run attack: a copy of `base_run` with links planted in it, then one command
    (ingest merging `traces`, analyze, info, hang, export, report). Nothing outside the run may
    change, and the command exits with a one-line error at worst."""
    from click.testing import CliRunner

    from tracekit.cli import main

    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    run, outside = work / "run", work / "outside"
    shutil.copytree(base_run, run, symlinks=True)
    outside.mkdir()
    planted = plant_links(run, outside, rnd, rnd.choice([1, 1, 2, 4]))
    if rnd.random() < 0.25:  # a staged commit left in the received run, its marker hand-edited
        planted.append(plant_commit_marker(run, outside, rnd))
    (cmd,) = rnd.choice(RUN_COMMANDS)
    args = {"ingest": ["ingest", *traces, "-o", str(run), "--jobs", "1"],
            "export": ["export", str(run), "--chrome", str(work / "out.json")],
            "report": ["report", str(run), "-o", str(work / "report.html")]}.get(cmd, [cmd, str(run)])
    before = _tree(outside)
    with deadline(300):
        try:
            res = CliRunner().invoke(main, args, catch_exceptions=True)
        except Hang:
            return Outcome("hang", f"{cmd} with links at {planted}", f"hang@run_{cmd}")
    where = f"{cmd} with links at {planted}"
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        exc = res.exception
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        return Outcome("crash", f"{where}: {tb[-3000:]}", f"run_{cmd}:" + _signature(exc))
    if "Traceback" in res.output:
        return Outcome("crash", f"{where}: a traceback", f"run_{cmd}:traceback")
    if _tree(outside) != before:
        return Outcome("crash", f"{where}: wrote outside the run", f"run_{cmd}:outside")
    err = [ln for ln in res.stderr.splitlines() if ln.startswith("Error")]
    if res.exit_code not in (0, 1, 2) or len(err) > 1:
        return Outcome("crash", f"{where}: exit {res.exit_code}, {res.stderr[-500:]!r}", f"run_{cmd}:exit")
    return Outcome("error" if res.exit_code == 1 else "ok", where)


def make_class_case(seeds: list[Seed], rnd: random.Random, classes: list[str] | None = None,
                    tries: int = 20) -> tuple[str, Seed, ClassCase] | None:
    """(class, seed, case) for a class that applies to one of `seeds`, or None."""
    names = classes or sorted(CLASSES)
    for _ in range(tries):
        cls, seed = rnd.choice(names), rnd.choice(seeds)
        case = CLASSES[cls](seed, rnd)
        if case is not None:
            if len(case.data) > MAX_CASE:
                case.data = case.data[:MAX_CASE]
                case.expect = None if cls == "duplicate_keys" else case.expect
            return cls, seed, case
    return None
