"""Nsight Systems exports (SQLite, or the Parquet/Arrow directory of one) -> the Kineto tables.

An Nsight report holds every process and GPU of one node. Each (process, device) pair becomes a
rank; its rows are read table by table in batches (`BATCH_ROWS`, never the whole database) and fed,
as columns of the events Kineto would have written for them (`kineto.Pass1.add_columns`), to the
Kineto parser's two passes (`kineto.pass2`); a GPU row's launch is joined in SQL. So kernels,
launches, steps and collectives follow one set of rules whichever profiler wrote them. NCCL's NVTX
ranges (`ncclAllReduce`, ...) are the call markers; on NCCL 2.19+ their payloads give the
communicator, the message size and (through `ncclCommInitRank*`) each process's comm rank and
size. Release differences: docs/formats.md.
"""

from __future__ import annotations

import abc
import functools
import json
import os
import re
import shutil
import sqlite3
import subprocess
import tempfile
from array import array
from bisect import bisect_right
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracekit._limits import MAX_DEPTH, MAX_WORLD_SIZE, RANGES, checked_int, json_depth
from tracekit.errors import InputError
from tracekit.parsers import kineto
from tracekit.parsers._json_keys import RepeatedKeys
from tracekit.parsers._kineto_calls import as_int, kernel_op
from tracekit.parsers.nccl_log import MAX_RANK_MAP_ENTRIES
from tracekit.parsers.registry import Format
from tracekit.parsers.vocabulary import dtype_bytes
from tracekit.store import ParseResult, SourceSink, SourceStats

NAME = "nsys"
PARSER_VERSION = "2"

SQLITE_MAGIC = b"SQLite format 3\x00"
#: Rows fetched per query batch: memory per batch is bounded by this, never by the database.
BATCH_ROWS = 50_000
#: Most strings of a StringIds table held (a report's names; beyond this the export is refused).
MAX_STRINGS = 20_000_000
#: Largest NVTX payload (JSON text) decoded, in bytes.
MAX_PAYLOAD_BYTES = 1 << 16
#: Tables whose presence makes an SQLite database (or a directory of table files) an Nsight export.
MARKER_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS",
                 "TARGET_INFO_GPU", "TARGET_INFO_SESSION_START_TIME")
KERNEL, RUNTIME, MEMCPY, MEMSET, SYNC, CUDA_EVENT = (
    f"CUPTI_ACTIVITY_KIND_{k}" for k in ("KERNEL", "RUNTIME", "MEMCPY", "MEMSET", "SYNCHRONIZATION", "CUDA_EVENT"))
ACTIVITY_TABLES = (KERNEL, MEMCPY, MEMSET, SYNC)
#: NVTX event types of exports without ENUM_NSYS_EVENT_TYPE (releases before it was exported).
NVTX_TYPES = {"NvtxMark": 34, "NvtxPushPopRange": 59, "NvtxStartEndRange": 60, "NvtxDomainCreate": 75}
#: The Kineto category each Nsight table's rows get (so the kinds and lanes come out the same).
CATEGORY = {KERNEL: "kernel", MEMCPY: "gpu_memcpy", MEMSET: "gpu_memset", SYNC: "cuda_sync"}
SYNC_NAMES = {1: "Event Sync", 2: "Stream Wait Event", 3: "Stream Sync", 4: "Context Sync"}
#: NCCL API range -> the collective name Kineto's args would give.
NCCL_CALLS = {"ncclAllReduce": "allreduce", "ncclAllGather": "allgather", "ncclReduceScatter": "reduce_scatter",
              "ncclBroadcast": "broadcast", "ncclReduce": "reduce", "ncclSend": "send", "ncclRecv": "recv",
              "ncclAllToAll": "all_to_all", "ncclGather": "gather", "ncclScatter": "scatter"}
NCCL_INITS = ("ncclCommInitRank", "ncclCommInitRankConfig", "ncclCommInitRankScalable", "ncclCommSplit",
              "ncclCommShrink")
#: NCCL's payload entries (src/include/nvtx_payload_schemas.h), by schema entry name and by field.
PAYLOAD_KEYS = {
    "ncclcommunicatorid": "comm", "comm": "comm", "newcomm": "comm", "commhash": "comm",
    "messagesize[bytes]": "bytes", "bytes": "bytes",
    "rank": "rank", "myrank": "rank", "no.ofranks": "nranks", "nranks": "nranks",
    "cudadevice": "device", "cudadev": "device", "peerrank": "peer", "peer": "peer", "root": "root",
}
#: NCCL kernel dtype suffixes (2.19+ short names, 2.18 and older C types) -> the c10 names Kineto uses.
KERNEL_DTYPES = {
    "f32": "Float", "float": "Float", "f16": "Half", "half": "Half", "bf16": "BFloat16",
    "__nv_bfloat16": "BFloat16", "bfloat16": "BFloat16", "f64": "Double", "double": "Double",
    "i8": "Char", "int8_t": "Char", "u8": "Byte", "uint8_t": "Byte", "i32": "Int", "int32_t": "Int",
    "u32": "UInt32", "uint32_t": "UInt32", "i64": "Long", "int64_t": "Long", "u64": "UInt64",
    "uint64_t": "UInt64", "f8e4m3": "Float8_e4m3fn", "f8e5m2": "Float8_e5m2",
}
#: The dtype a call's args carry when no kernel names one: bytes counted as 1-byte elements, the
#: dtype stored as null (kernel_dtype only gives c10 names, never this one).
_BYTES_CARRIER = "uint8"
_KERNEL_DTYPE = re.compile(r"_(" + "|".join(sorted(map(re.escape, KERNEL_DTYPES), key=len, reverse=True))
                           + r")(?=[_(]|$)")
#: The error of a report whose processes carry no NCCL rank (no payloads, no rank map).
NO_RANK = "no rank: the report's NCCL NVTX ranges carry no comm rank (NCCL before 2.19, or nvtx not traced)"
_RAW = msgspec.Raw


def kernel_dtype(name: str) -> str | None:
    """The c10 dtype a collective NCCL kernel's name shows (`..._Sum_bf16_RING_LL` -> BFloat16)."""
    if kernel_op(name)[0] in ("send", "recv", "other"):
        return None
    m = _KERNEL_DTYPE.search(name.split("(", 1)[0])
    return KERNEL_DTYPES[m.group(1)] if m else None


# -- reading -------------------------------------------------------------------------------------


class _Source(abc.ABC):
    """The tables of one export, read in batches of columns (dict of column -> list)."""

    tables: dict[str, list[str]]

    @abc.abstractmethod
    def batches(self, table: str, columns: Sequence[str]) -> Iterator[dict[str, list[Any]]]:
        """The rows of `table`, `columns` only, in batches."""

    def where_in(self, table: str, columns: Sequence[str], key: str,
                 values: Sequence[int]) -> Iterator[dict[str, list[Any]]]:
        """The rows of `table` whose `key` is one of `values` (few: the comm kernels' ids)."""
        wanted = set(values)
        for b in self.batches(table, [*columns, key] if key not in columns else columns):
            keep = [i for i, v in enumerate(b[key]) if v in wanted]
            if keep:
                yield {c: [b[c][i] for i in keep] for c in columns}

    def distinct(self, table: str, column: str) -> set[Any]:
        """The distinct values of a (low-cardinality) column."""
        out: set[Any] = set()
        for b in self.batches(table, (column,)):
            out.update(b[column])
        return out

    def has(self, table: str, *columns: str) -> bool:
        return table in self.tables and all(c in self.tables[table] for c in columns)

    def index_launches(self) -> bool:
        """Make the runtime calls findable by (process, correlation id) for `launch_batches`;
        False when this source cannot (the pass then keeps every runtime call's time itself)."""
        return False

    def launch_batches(self, table: str, columns: Sequence[str]) -> Iterator[dict[str, list[Any]]]:
        """`batches` plus `launchStart`: the start of the runtime call (same process, same
        correlationId; the first such) that launched each row, None when there is none. Called only
        when `index_launches` said yes, which a source without SQL never does."""
        raise NotImplementedError(f"{type(self).__name__} has no launch index (index_launches() is False)")

    def close(self) -> None:  # a directory export holds nothing open
        return None


class _SQLite(_Source):
    def __init__(self, path: str) -> None:
        self.path = path
        try:
            self.db = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True, timeout=0.2)
            names = [r[0] for r in self.db.execute("SELECT name FROM sqlite_master WHERE type IN ('table','view')")]
            self.tables = {n: [r[1] for r in self.db.execute(f'PRAGMA table_info("{_ident(n)}")')] for n in names}
        except _DB_ERRORS as exc:
            raise _db_error(path, exc) from exc

    def batches(self, table: str, columns: Sequence[str]) -> Iterator[dict[str, list[Any]]]:
        cols = ", ".join(f'"{_ident(c)}"' for c in columns)
        try:
            cur = self.db.execute(f'SELECT {cols} FROM "{_ident(table)}"')
            while True:
                rows = cur.fetchmany(BATCH_ROWS)
                if not rows:
                    return
                yield dict(zip(columns, map(list, zip(*rows, strict=True)), strict=True))
        except _DB_ERRORS as exc:
            raise _db_error(self.path, exc) from exc

    def where_in(self, table: str, columns: Sequence[str], key: str,
                 values: Sequence[int]) -> Iterator[dict[str, list[Any]]]:
        if not values:
            return
        cols = ", ".join(f'"{_ident(c)}"' for c in columns)
        sql = (f'SELECT {cols} FROM "{_ident(table)}" WHERE "{_ident(key)}" IN '
               "(SELECT value FROM json_each(?))")
        try:
            cur = self.db.execute(sql, (msgspec.json.encode(sorted(values)).decode(),))
            while rows := cur.fetchmany(BATCH_ROWS):
                yield dict(zip(columns, map(list, zip(*rows, strict=True)), strict=True))
        except _DB_ERRORS as exc:
            raise _db_error(self.path, exc) from exc

    def distinct(self, table: str, column: str) -> set[Any]:
        try:
            return {r[0] for r in self.db.execute(f'SELECT DISTINCT "{_ident(column)}" FROM "{_ident(table)}"')}
        except _DB_ERRORS as exc:
            raise _db_error(self.path, exc) from exc

    def index_launches(self) -> bool:
        """A temporary table (on disk, like SQLite's sorter: not in memory) of the runtime calls
        the Kineto pass would keep, keyed by (pid, correlationId), the first in row order."""
        lo, hi = RANGES["time_ns"]
        dlo, dhi = RANGES["duration_ns"]
        try:
            self.db.execute("PRAGMA temp_store = FILE")
            self.db.execute("CREATE TEMP TABLE IF NOT EXISTS tracekit_launch (pid INTEGER, corr INTEGER, "
                            "start INTEGER, PRIMARY KEY (pid, corr)) WITHOUT ROWID")
            self.db.execute(
                "INSERT OR IGNORE INTO temp.tracekit_launch SELECT (globalTid >> 24) & 16777215, correlationId, start "
                f'FROM "{_ident(RUNTIME)}" WHERE typeof(globalTid) = \'integer\' AND typeof(correlationId) = '
                "'integer' AND typeof(start) = 'integer' AND typeof(\"end\") = 'integer' "
                f'AND start BETWEEN {lo} AND {hi} AND "end" - start BETWEEN {dlo} AND {dhi}')
        except _DB_ERRORS as exc:
            raise _db_error(self.path, exc) from exc
        return True

    def launch_batches(self, table: str, columns: Sequence[str]) -> Iterator[dict[str, list[Any]]]:
        cols = ", ".join(f'k."{_ident(c)}"' for c in columns)
        sql = (f"SELECT {cols}, (SELECT l.start FROM temp.tracekit_launch l WHERE l.pid = (k.globalPid >> 24) & "
               f'16777215 AND l.corr = k.correlationId) FROM "{_ident(table)}" k')
        names = [*columns, "launchStart"]
        try:
            cur = self.db.execute(sql)
            while rows := cur.fetchmany(BATCH_ROWS):
                yield dict(zip(names, map(list, zip(*rows, strict=True)), strict=True))
        except _DB_ERRORS as exc:
            raise _db_error(self.path, exc) from exc

    def close(self) -> None:
        self.db.close()


class _ArrowDir(_Source):
    """`nsys export --type parquetdir|arrowdir`: one file per table, named after it."""

    SUFFIXES = (".parquet", ".arrow", ".feather")

    def __init__(self, path: str) -> None:
        self.path = path
        self.files: dict[str, Path] = {}
        self.tables = {}
        for f in sorted(Path(path).iterdir()):
            if f.suffix in self.SUFFIXES and f.is_file() and not f.is_symlink():
                try:
                    self.tables[f.stem] = list(self._schema(f).names)
                except (pa.ArrowException, OSError) as exc:
                    raise InputError(f, f"unreadable {f.suffix[1:]} table of an Nsight export: {exc}") from exc
                self.files[f.stem] = f

    @staticmethod
    def _schema(f: Path) -> pa.Schema:
        if f.suffix == ".parquet":
            import pyarrow.parquet as pq

            return pq.read_schema(f)
        import pyarrow.ipc as ipc

        with pa.memory_map(str(f)) as src:
            return ipc.open_file(src).schema

    def batches(self, table: str, columns: Sequence[str]) -> Iterator[dict[str, list[Any]]]:
        f = self.files[table]
        try:
            if f.suffix == ".parquet":
                import pyarrow.parquet as pq

                for b in pq.ParquetFile(f).iter_batches(batch_size=BATCH_ROWS, columns=list(columns)):
                    yield {c: b.column(c).to_pylist() for c in columns}
                return
            import pyarrow.ipc as ipc

            with pa.memory_map(str(f)) as src:
                reader = ipc.open_file(src)
                for i in range(reader.num_record_batches):
                    b = reader.get_batch(i).select(list(columns))
                    for off in range(0, b.num_rows, BATCH_ROWS):
                        part = b.slice(off, BATCH_ROWS)
                        yield {c: part.column(c).to_pylist() for c in columns}
        except (pa.ArrowException, OSError) as exc:
            raise InputError(f, f"unreadable table of an Nsight export: {exc}") from exc


#: What reading an SQLite file can raise: its errors, and text that is not UTF-8 (a damaged file).
_DB_ERRORS = (sqlite3.Error, UnicodeDecodeError)


def _ident(name: str) -> str:
    return name.replace('"', '""')


def _db_error(path: str, exc: Exception) -> InputError:
    text = str(exc)
    if "locked" in text or "busy" in text:
        return InputError(path, "the SQLite database is locked by another process (is nsys still exporting it?)")
    if "malformed" in text or "not a database" in text or "file is encrypted" in text or "disk I/O" in text:
        return InputError(path, f"truncated or corrupt SQLite database ({text})")
    return InputError(path, f"cannot read the SQLite database ({text})")


def is_nsight_tables(names: Sequence[str]) -> bool:
    """Whether a set of table names is an Nsight export's: StringIds plus one of its own tables."""
    s = set(names)
    return "StringIds" in s and any(t in s for t in MARKER_TABLES)


#: Report suffixes. Their container header is not publicly documented (no public source confirms
#: a magic number), so a report is recognised by its suffix, and only when its head is binary.
REPORT_SUFFIXES = (".nsys-rep", ".qdrep")


def looks_binary(head: bytes) -> bool:
    """Whether a file's first bytes are binary (a NUL, or not UTF-8 text): a report, not a text file
    that merely carries the suffix."""
    if not head:
        return False
    if b"\x00" in head:
        return True
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start < len(head) - 3  # a multi-byte character cut by the peek is still text
    return False


def sniff_path(path: str | os.PathLike[str], head: bytes) -> bool:
    """An Nsight export by content: an SQLite file with Nsight's tables (an unreadable one too, so
    that its parse says what is wrong), a `.nsys-rep`/`.qdrep` report (refused or converted by
    `parse`), or the StringIds table file of a Parquet/Arrow directory export."""
    p = Path(path)
    if head.startswith(SQLITE_MAGIC):
        try:
            with closing(sqlite3.connect(f"{p.resolve().as_uri()}?mode=ro", uri=True, timeout=0.2)) as db:
                names = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        except _DB_ERRORS:
            return True
        return is_nsight_tables(names)
    if p.suffix in REPORT_SUFFIXES:
        return looks_binary(head)
    if p.stem == "StringIds" and p.suffix in _ArrowDir.SUFFIXES and head.startswith((b"PAR1", b"ARROW1")):
        try:
            return is_nsight_tables([f.stem for f in p.parent.iterdir() if f.suffix in _ArrowDir.SUFFIXES])
        except OSError:
            return False
    return False


# -- identity ------------------------------------------------------------------------------------


@dataclass
class _Comm:
    comm: int
    nranks: int
    rank: int
    start: int = 0


@dataclass
class _Proc:
    """One (process, device) of the report: a rank once its global rank is known."""

    pid: int
    device: int
    comms: dict[int, _Comm] = field(default_factory=dict)
    rank: int | None = None


def _pid(gpid: Any) -> int | None:
    return (gpid >> 24) & 0xFFFFFF if type(gpid) is int else None


def _tid(gtid: Any) -> int | None:
    return gtid & 0xFFFFFF if type(gtid) is int else None


@dataclass(frozen=True, slots=True)
class Payload:
    """One NVTX payload as read: the values NCCL's schema gives, why the text was not read at all
    (`unread`: too_large, too_deep, not_json), the keys an object gave more than once (the last
    value kept) and the schema fields whose value was not an integer in its range (dropped)."""

    values: dict[str, int]
    unread: str | None = None
    repeated_keys: tuple[str, ...] = ()
    bad_numbers: tuple[str, ...] = ()


#: The range of each payload field (`PAYLOAD_KEYS` values); a value outside it is dropped and counted.
PAYLOAD_RANGES = {"comm": (0, 2**64 - 1), "bytes": RANGES["size"], "rank": RANGES["rank"],
                  "nranks": (1, MAX_WORLD_SIZE), "device": RANGES["count"], "peer": RANGES["rank"],
                  "root": RANGES["rank"]}
#: Most list items of one payload array looked at (NCCL's arrays are a few entries).
_PAYLOAD_LIST_ITEMS = 64


def read_payload(text: Any) -> Payload:
    """NCCL's NVTX payload (JSON as Nsight exports it): keys matched by NCCL's schema entry names
    or struct fields, nested objects flattened (an outer key before an inner one). The text is
    bounded (`MAX_PAYLOAD_BYTES`, `MAX_DEPTH`, checked before decoding), keys repeated inside an
    object keep the last value, and every number is range-checked (`PAYLOAD_RANGES`)."""
    if not isinstance(text, (str, bytes)) or not text:
        return Payload({})
    if len(text) > MAX_PAYLOAD_BYTES:
        return Payload({}, "too_large")
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    if json_depth(raw) > MAX_DEPTH:
        return Payload({}, "too_deep")
    keys = RepeatedKeys()
    try:
        doc = json.loads(raw, object_pairs_hook=keys.hook)
    except (ValueError, RecursionError):
        return Payload({}, "not_json")
    out: dict[str, int] = {}
    bad: set[str] = set()
    todo = [doc]
    while todo:
        d = todo.pop()
        if isinstance(d, list):
            todo.extend(d[:_PAYLOAD_LIST_ITEMS])
            continue
        if not isinstance(d, dict):
            continue
        for k, v in d.items():
            if isinstance(v, (dict, list)):
                todo.append(v)
                continue
            key = PAYLOAD_KEYS.get(str(k).replace(" ", "").replace("_", "").lower())
            if key is None or key in out:
                continue
            n = _as_int(v)
            lo, hi = PAYLOAD_RANGES[key]
            if n is not None and lo <= n <= hi:
                out[key] = n
            elif v is not None:
                bad.add(key)
    return Payload(out, None, tuple(sorted(keys.names)), tuple(sorted(bad - set(out))))


def payload(text: Any) -> dict[str, int]:
    """The values of `read_payload(text)`: {comm, bytes, rank, nranks, device, peer, root}, each
    when the payload gives it in range; {} for a payload not read."""
    return read_payload(text).values


#: Payload texts up to this size are decoded once: NCCL's repeat (the same comm and sizes every step).
_PAYLOAD_CACHED_BYTES = 1024
_read_payload_cached = functools.lru_cache(maxsize=8192)(read_payload)


def _read_payload(text: Any) -> Payload:
    """`read_payload`, decoded once per distinct short text (the result is shared: read only)."""
    if isinstance(text, (str, bytes)) and len(text) <= _PAYLOAD_CACHED_BYTES:
        return _read_payload_cached(text)
    return read_payload(text)


class PayloadTally:
    """What the NVTX payloads of one export lost, for its warnings: the texts not read by reason,
    the payloads that repeated a key, and the fields dropped for a value out of range."""

    def __init__(self) -> None:
        self.unread: Counter[str] = Counter()
        self.repeated = 0
        self.repeated_names: Counter[str] = Counter()
        self.bad_numbers: Counter[str] = Counter()

    def add(self, p: Payload) -> None:
        if p.unread is not None:
            self.unread[p.unread] += 1
        if p.repeated_keys:
            self.repeated += 1
            self.repeated_names.update(p.repeated_keys)
        self.bad_numbers.update(p.bad_numbers)

    def warnings(self) -> list[str]:
        out = []
        if self.unread:
            n = sum(self.unread.values())
            why = ", ".join(f"{k} {v:,}" for k, v in sorted(self.unread.items()))
            out.append(f"{n:,} NCCL NVTX payload{'s' if n != 1 else ''} not read ({why}; limits "
                       f"{MAX_PAYLOAD_BYTES:,} bytes, depth {MAX_DEPTH}): their calls have no comm, size or peer")
        if self.repeated:
            out.append(f"{self.repeated:,} NCCL NVTX payload{'s' if self.repeated != 1 else ''} with keys given "
                       f"more than once, the last value kept ({sorted(self.repeated_names)[:5]})")
        if self.bad_numbers:
            n = sum(self.bad_numbers.values())
            what = ", ".join(f"{k} {v:,}" for k, v in sorted(self.bad_numbers.items()))
            out.append(f"{n:,} NCCL NVTX payload value{'s' if n != 1 else ''} not an integer in range, "
                       f"dropped ({what})")
        return out


def _as_int(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, str):
        s = v.strip()
        try:
            v = int(s, 16) if s.lower().startswith("0x") else int(s)
        except ValueError:
            return None
    return v if type(v) is int and 0 <= v < 2**64 else None


def group_name(comm: int) -> str:
    """The group of a communicator: its commHash as NCCL logs print it (`commId 0x...`)."""
    return f"0x{comm & (2**64 - 1):016x}"


# -- grouped point-to-point ----------------------------------------------------------------------

#: NCCL's group calls: the ranges that open and close a group of calls launched together.
GROUP_CALLS = ("ncclGroupStart", "ncclGroupEnd")


@dataclass(frozen=True, slots=True)
class _P2P:
    """One ncclSend/ncclRecv NVTX range: op, and its payload's communicator, bytes and comm-local peer."""

    start: int
    end: int
    op: str
    comm: int | None
    nbytes: int | None
    peer: int | None


class _P2PColumns(Sequence[_P2P]):
    """One thread's ncclSend/ncclRecv ranges as columns (about 40 bytes a range, where a `_P2P`
    took about 150): read back as `_P2P`s by `group_batches`, one thread at a time."""

    def __init__(self) -> None:
        self.start, self.end, self.nbytes, self.peer = array("q"), array("q"), array("q"), array("q")
        self.comm, self.flags = array("Q"), array("b")  # flags: 1 recv, 2 has a comm

    def append(self, start: int, end: int, op: str, comm: int | None, nbytes: int | None, peer: int | None) -> None:
        self.start.append(start)
        self.end.append(end)
        self.nbytes.append(-1 if nbytes is None else nbytes)
        self.peer.append(-1 if peer is None else peer)
        self.comm.append(0 if comm is None else comm)
        self.flags.append((op == "recv") | (2 if comm is not None else 0))

    def __len__(self) -> int:
        return len(self.start)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        f, nb, peer = self.flags[i], self.nbytes[i], self.peer[i]
        return _P2P(self.start[i], self.end[i], "recv" if f & 1 else "send", self.comm[i] if f & 2 else None,
                    None if nb < 0 else nb, None if peer < 0 else peer)


class _Marks(Sequence[tuple[int, int, bool]]):
    """One thread's ncclGroupStart/ncclGroupEnd ranges, (start, end, is GroupStart), as columns."""

    def __init__(self) -> None:
        self.start, self.end, self.opens = array("q"), array("q"), array("b")

    def append(self, mark: tuple[int, int, bool]) -> None:
        self.start.append(mark[0])
        self.end.append(mark[1])
        self.opens.append(mark[2])

    def __len__(self) -> int:
        return len(self.start)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return self.start[i], self.end[i], bool(self.opens[i])


def is_p2p_kernel(name: str) -> bool:
    """Whether a comm kernel is NCCL's point-to-point one (what a group of sends and recvs launches)."""
    return "SendRecv" in name or kernel_op(name)[0] in ("send", "recv")


def group_batches(ranges: Sequence[_P2P], marks: Sequence[tuple[int, int, bool]],
                  launches: Sequence[tuple[int, str, int]]) -> list[tuple[list[_P2P], list[tuple[int, str, int]]]]:
    """One thread's groups of p2p calls and the p2p kernel launches that run them, in time order.

    A group is the ranges inside an outermost ncclGroupStart ... ncclGroupEnd span (launched
    inside it: NCCL launches at ncclGroupEnd); ranges outside any span (no group ranges traced)
    form a group with the run of p2p launches that follows them. A range with a launch inside it
    is an ungrouped call and belongs to no group."""
    spans: list[tuple[int, int]] = []
    depth, open_at = 0, 0
    for start, end, is_start in sorted(marks):
        if is_start:
            if depth == 0:
                open_at = start
            depth += 1
        elif depth:
            depth -= 1
            if depth == 0:
                spans.append((open_at, end))
    out: list[tuple[list[_P2P], list[tuple[int, str, int]]]] = []
    starts = [s for s, _ in spans]
    in_span: dict[int, list[_P2P]] = defaultdict(list)
    rest: list[_P2P] = []
    for r in sorted(ranges, key=lambda r: r.start):
        j = bisect_right(starts, r.start) - 1
        if j >= 0 and r.end <= spans[j][1]:
            in_span[j].append(r)
        else:
            rest.append(r)
    used: set[int] = set()
    for j, members in sorted(in_span.items()):
        lo, hi = spans[j]
        k = [i for i, x in enumerate(launches) if lo <= x[0] <= hi and is_p2p_kernel(x[1])]
        used.update(k)
        if k:
            out.append((members, [launches[i] for i in k]))
    timeline = sorted([(r.start, 0, i) for i, r in enumerate(rest)]
                      + [(x[0], 1, i) for i, x in enumerate(launches) if i not in used])
    pending: list[_P2P] = []
    run: list[tuple[int, str, int]] = []
    for _t, kind, i in timeline:
        if kind == 1:
            x = launches[i]
            if pending and is_p2p_kernel(x[1]):
                run.append(x)
                continue
            if run:
                out.append((pending, run))
            pending, run = [], []
            continue
        if run:
            out.append((pending, run))
            pending, run = [], []
        r = rest[i]
        nxt = bisect_right(launches, (r.start, "", -1))
        if nxt < len(launches) and launches[nxt][0] <= r.end:
            pending = []  # launched inside its own range: an ungrouped call
            continue
        pending.append(r)
    if pending and run:
        out.append((pending, run))
    return out


def _all_to_all_splits(members: Sequence[_P2P], rank: int, nranks: int) -> tuple[list[int], list[int]] | None:
    """Bytes sent to and received from each comm rank, when the group sends to and receives from
    every other rank (to itself too, or not); None when it does not (a partial group)."""
    sent, got = [0] * nranks, [0] * nranks
    to: set[int] = set()
    frm: set[int] = set()
    for m in members:
        if m.peer is None or m.nbytes is None or not 0 <= m.peer < nranks:
            return None
        if m.op == "send":
            sent[m.peer] += m.nbytes
            to.add(m.peer)
        else:
            got[m.peer] += m.nbytes
            frm.add(m.peer)
    others = set(range(nranks)) - {rank}
    if not others <= to or not others <= frm or not others:
        return None
    return sent, got


# -- the parse -----------------------------------------------------------------------------------


class _Launches(Sequence[tuple[int, str, int]]):
    """One thread's comm kernel launches, (launch start, kernel, correlation) in time order, as
    arrays (a tuple per launch took about 140 bytes; this about 20)."""

    def __init__(self, starts: np.ndarray, codes: np.ndarray, corrs: np.ndarray, names: list[str]) -> None:
        self.starts, self.codes, self.corrs, self.names = starts, codes, corrs, names

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return int(self.starts[i]), self.names[self.codes[i]], int(self.corrs[i])

    def first_from(self, start: int) -> int:
        """The first launch at or after `start` (kernel names are never empty, so this is
        `bisect_right(self, (start, ""))`)."""
        return int(np.searchsorted(self.starts, start, "left"))


_NO_LAUNCHES = _Launches(np.zeros(0, np.int64), np.zeros(0, np.int32), np.zeros(0, np.int64), [])


@dataclass
class _Nvtx:
    """The NVTX columns this export has, and its event-type numbers."""

    text: str | None
    text_id: str | None
    json: str | None
    json_id: str | None
    domain: str | None
    types: dict[str, int]


class _Parse:
    """One export's strings, metadata, NVTX columns and (process, device) ranks."""

    def __init__(self, path: str, src: _Source, sink: SourceSink, rank: int | None,
                 rank_map: Mapping[tuple[str | None, int, int], int] | None, stats: SourceStats) -> None:
        self.path, self.src, self.sink, self.stats = path, src, sink, stats
        self.rank_arg, self.rank_map = rank, rank_map or {}
        self.strings: dict[int, str] = {}
        self.procs: dict[tuple[int, int], _Proc] = {}
        #: gtid -> [(launch start, kernel, correlation)] of its comm kernels, in time order
        self.launches: dict[int, _Launches] = {}
        self.comm_corrs = np.zeros(0, np.int64)  # the comm kernels' correlation ids, sorted
        self.p2p: dict[int, Sequence[_P2P]] = defaultdict(_P2PColumns)  # gtid -> its ncclSend/ncclRecv ranges
        self.group_marks: dict[int, Sequence[tuple[int, int, bool]]] = defaultdict(_Marks)  # (start, end, opens)
        self.kernel_args: dict[tuple[int | None, int], kineto.Args] = {}  # a group's kernel -> its call's args
        self.absorbed: set[tuple[int, int, str]] = set()  # (gtid, start, op) of ranges a group's kernel carries
        self.comm_re = kineto.compile_patterns(None)
        self.payloads = PayloadTally()

    # strings, meta, processes ------------------------------------------------------------------
    def read_strings(self) -> None:
        if not self.src.has("StringIds", "id", "value"):
            raise InputError(self.path, "an Nsight export without its StringIds table (truncated export?)")
        for b in self.src.batches("StringIds", ("id", "value")):
            for i, v in zip(b["id"], b["value"], strict=True):
                if type(i) is int and isinstance(v, str):
                    self.strings[i] = v
            if len(self.strings) > MAX_STRINGS:
                raise InputError(self.path, f"more than {MAX_STRINGS:,} strings in StringIds; refused")

    def string(self, v: Any) -> str | None:
        return self.strings.get(v) if type(v) is int else (v if isinstance(v, str) else None)

    def meta(self) -> tuple[int, str | None, dict[int, tuple[str | None, str | None]]]:
        base = 0
        if self.src.has("TARGET_INFO_SESSION_START_TIME", "utcEpochNs"):
            for b in self.src.batches("TARGET_INFO_SESSION_START_TIME", ("utcEpochNs",)):
                v = checked_int(b["utcEpochNs"][0], "time_ns") if b["utcEpochNs"] else None
                base = v or 0
                break
        else:
            self.stats.warnings.append("no TARGET_INFO_SESSION_START_TIME (an old Nsight release): times are "
                                       "relative to the session start, not the epoch")
        host = None
        if self.src.has("TARGET_INFO_SYSTEM_ENV", "name", "value"):
            for b in self.src.batches("TARGET_INFO_SYSTEM_ENV", ("name", "value")):
                for n, v in zip(b["name"], b["value"], strict=True):
                    n, v = self.string(n), self.string(v)
                    if n is not None and n.lower() in ("hostname", "host name") and v:
                        host = v
        gpus: dict[int, tuple[str | None, str | None]] = {}
        if self.src.has("TARGET_INFO_GPU", "id", "name"):
            cols = ("id", "name") + (("busLocation",) if self.src.has("TARGET_INFO_GPU", "busLocation") else ())
            for b in self.src.batches("TARGET_INFO_GPU", cols):
                for i, row in enumerate(b["id"]):
                    if type(row) is int:
                        gpus[row] = (self.string(b["name"][i]), self.string(b["busLocation"][i])
                                     if "busLocation" in b else None)
        return base, host, gpus

    def nvtx_columns(self) -> _Nvtx | None:
        if not self.src.has("NVTX_EVENTS", "start", "end", "eventType", "globalTid"):
            return None
        cols = self.src.tables["NVTX_EVENTS"]
        types = dict(NVTX_TYPES)
        if self.src.has("ENUM_NSYS_EVENT_TYPE", "id", "name"):
            for b in self.src.batches("ENUM_NSYS_EVENT_TYPE", ("id", "name")):
                for i, n in zip(b["id"], b["name"], strict=True):
                    if n in NVTX_TYPES and type(i) is int:
                        types[n] = i
        return _Nvtx(text="text" if "text" in cols else None, text_id="textId" if "textId" in cols else None,
                     json="jsonText" if "jsonText" in cols else None,
                     json_id="jsonTextId" if "jsonTextId" in cols else None,
                     domain="domainId" if "domainId" in cols else None, types=types)

    def nvtx_batches(self, nv: _Nvtx) -> Iterator[dict[str, list[Any]]]:
        cols = ["start", "end", "eventType", "globalTid"] + [c for c in (nv.text, nv.text_id, nv.json, nv.json_id,
                                                                          nv.domain) if c]
        yield from self.src.batches("NVTX_EVENTS", cols)

    def nvtx_text(self, b: dict[str, list[Any]], i: int, nv: _Nvtx) -> str | None:
        t = b[nv.text][i] if nv.text else None
        if not t and nv.text_id:
            t = self.string(b[nv.text_id][i])
        return t if isinstance(t, str) else None

    def nvtx_payload(self, b: dict[str, list[Any]], i: int, nv: _Nvtx, *, tally: bool = True) -> dict[str, int]:
        """The row's payload values; `tally` counts what it lost (once per row: a range read
        twice passes False the second time)."""
        j = b[nv.json][i] if nv.json else None
        if not j and nv.json_id:
            j = self.string(b[nv.json_id][i])
        p = _read_payload(j)
        if tally:
            self.payloads.add(p)
        return p.values

    def devices(self) -> None:
        """Every (process, device) with GPU work: the report's would-be ranks."""
        for table in ACTIVITY_TABLES:
            if not self.src.has(table, "deviceId", "globalPid"):
                continue
            for b in self.src.batches(table, ("globalPid", "deviceId")):
                for key in set(zip(b["globalPid"], b["deviceId"], strict=True)):
                    pid = _pid(key[0])
                    if pid is not None and type(key[1]) is int and (pid, key[1]) not in self.procs:
                        self.procs[(pid, key[1])] = _Proc(pid, key[1])
        if not self.procs:
            if not any(self.src.has(t) for t in ACTIVITY_TABLES):
                raise InputError(self.path, "no CUDA trace in this report (profile with nsys --trace=cuda,nvtx)")
            raise InputError(self.path, "the report's CUDA tables have no GPU activity with a process and device")

    def comms(self, nv: _Nvtx | None) -> None:
        """Comm memberships from `ncclCommInit*` payloads, per (process, CUDA device)."""
        if nv is None:
            return
        by_pid: dict[int, list[_Proc]] = defaultdict(list)
        for p in self.procs.values():
            by_pid[p.pid].append(p)
        rng = {nv.types["NvtxPushPopRange"], nv.types["NvtxStartEndRange"]}
        for b in self.nvtx_batches(nv):
            for i, et in enumerate(b["eventType"]):
                if et not in rng:
                    continue
                name = self.nvtx_text(b, i, nv)
                if name in GROUP_CALLS:
                    start, end = b["start"][i], b["end"][i]
                    if type(start) is int and type(end) is int:
                        self.group_marks[b["globalTid"][i]].append(  # type: ignore[attr-defined]
                            (start, end, name == GROUP_CALLS[0]))
                    continue
                if name in ("ncclSend", "ncclRecv"):
                    self._note_p2p(b, i, nv, name)
                    continue
                if name not in NCCL_INITS:
                    continue
                pl = self.nvtx_payload(b, i, nv)
                pid = _pid(b["globalTid"][i])
                if "comm" not in pl or "rank" not in pl or "nranks" not in pl or pid not in by_pid:
                    continue
                cands = by_pid[pid]
                proc = next((p for p in cands if p.device == pl.get("device")), None)
                if proc is None and len(cands) == 1:
                    proc = cands[0]
                if proc is not None and pl["rank"] < pl["nranks"] <= MAX_WORLD_SIZE:
                    start = b["start"][i] if type(b["start"][i]) is int else 0
                    proc.comms[pl["comm"]] = _Comm(pl["comm"], pl["nranks"], pl["rank"], start)

    def _note_p2p(self, b: dict[str, list[Any]], i: int, nv: _Nvtx, name: str) -> None:
        start, end = b["start"][i], b["end"][i]
        if type(start) is not int or type(end) is not int:
            return
        pl = self.nvtx_payload(b, i, nv)
        self.p2p[b["globalTid"][i]].append(start, end, NCCL_CALLS[name], pl.get("comm"), pl.get("bytes"),  # type: ignore[attr-defined]
                                           pl.get("peer"))

    def kernel_name_column(self) -> str | None:
        cols = self.src.tables.get(KERNEL, [])
        return next((c for c in ("demangledName", "shortName", "mangledName", "name") if c in cols), None)

    def comm_launches(self) -> None:
        """The comm kernels and their launches, joined by correlation id with queries that return
        only those rows (a plain scan of the others): per thread, (launch start, kernel, id), held
        as arrays (`_Launches`). A (process, id) pair of several comm kernels keeps the last."""
        name_col = self.kernel_name_column()
        if name_col is None or not self.src.has(KERNEL, "correlationId", "globalPid"):
            return
        ids = [v for v in self.src.distinct(KERNEL, name_col)
               if (n := self.string(v)) is not None and self.comm_re.search(n)]
        names: list[str] = []
        code_of: dict[str, int] = {}
        chunks: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        for b in self.src.where_in(KERNEL, ("globalPid", "correlationId", name_col), name_col, ids):
            g, g_ok = _int_values(b["globalPid"])
            c, c_ok = _int_values(b["correlationId"])
            vals, idx = _codes(b[name_col])
            codes = np.asarray([code_of.setdefault(self.string(v) or "unknown kernel", len(code_of)) for v in vals],
                               np.int32)
            ok = g_ok & c_ok  # a kernel without a process has no launch on a traced thread
            chunks.append(((g[ok] >> 24) & 0xFFFFFF, c[ok], codes[idx[ok]] if len(codes) else codes))
        names = list(code_of)
        if not chunks or not self.src.has(RUNTIME, "globalTid", "start", "correlationId"):
            return
        kpid, kcorr, kcode = (np.concatenate(x) for x in zip(*chunks, strict=True))
        if not len(kcorr):
            return
        order = np.lexsort((np.arange(len(kcorr)), kcorr, kpid))
        kpid, kcorr, kcode = kpid[order], kcorr[order], kcode[order]
        last = np.ones(len(kcorr), bool)
        last[:-1] = (kpid[1:] != kpid[:-1]) | (kcorr[1:] != kcorr[:-1])
        kpid, kcorr, kcode = kpid[last], kcorr[last], kcode[last]
        found: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self.comm_corrs = np.unique(kcorr)
        corrs = self.comm_corrs.tolist()
        for b in self.src.where_in(RUNTIME, ("globalTid", "start", "correlationId"), "correlationId", corrs):
            t, t_ok = _int_values(b["globalTid"])
            st, st_ok = _int_values(b["start"])
            c, c_ok = _int_values(b["correlationId"])
            pid = (t >> 24) & 0xFFFFFF
            at = np.full(len(t), -1, np.int64)
            for one in np.unique(pid[t_ok]).tolist():
                lo, hi = np.searchsorted(kpid, one, "left"), np.searchsorted(kpid, one, "right")
                rows = np.flatnonzero(t_ok & (pid == one))
                j = lo + np.searchsorted(kcorr[lo:hi], c[rows])
                hit = j < hi
                hit[hit] = kcorr[j[hit]] == c[rows[hit]]
                at[rows[hit]] = j[hit]
            keep = (at >= 0) & st_ok & c_ok
            found.append((t[keep], st[keep], kcode[at[keep]], c[keep]))
        if not found:
            return
        gt, st, code, c = (np.concatenate(x) for x in zip(*found, strict=True))
        if not len(gt):
            return
        name_rank = np.argsort(np.argsort(np.asarray(names, dtype=object))) if names else np.zeros(0, np.int64)
        order = np.lexsort((c, name_rank[code], st, gt))
        gt, st, code, c = gt[order], st[order], code[order], c[order]
        bounds = np.flatnonzero(np.diff(gt)) + 1
        for lo, hi in zip([0, *bounds.tolist()], [*bounds.tolist(), len(gt)], strict=True):
            self.launches[int(gt[lo])] = _Launches(st[lo:hi], code[lo:hi], c[lo:hi], names)

    def resolve_groups(self) -> None:
        """Grouped ncclSend/ncclRecv (ncclGroupStart ... ncclGroupEnd, else the ranges before one
        shared p2p kernel launch): on each communicator, a group whose peers cover every other
        rank is one all_to_all carried by its kernel; any other group keeps its p2p rows and its
        kernel is the group's `coalesced` call, as PyTorch's batch_isend_irecv is in Kineto."""
        by_pid: dict[int, list[_Proc]] = defaultdict(list)
        for p in self.procs.values():
            by_pid[p.pid].append(p)
        enc = msgspec.json.encode
        for gtid, ranges in self.p2p.items():
            procs = by_pid.get(_pid(gtid), [])  # type: ignore[arg-type]
            for members, launched in group_batches(ranges, self.group_marks.get(gtid, []),
                                                   self.launches.get(gtid, [])):
                comms: list[int] = []
                for m in members:
                    if m.comm is None:
                        comms = []
                        break
                    if m.comm not in comms:
                        comms.append(m.comm)
                if not comms or len(launched) < len(comms):
                    continue
                for comm, (_, _, corr) in zip(comms, launched, strict=False):
                    info = next((p.comms[comm] for p in procs if comm in p.comms), None)
                    if info is None:
                        continue
                    mine = [m for m in members if m.comm == comm]
                    fields: dict[str, Any] = {"pg_name": _RAW(enc(group_name(comm))),
                                              "group_size": _RAW(enc(info.nranks))}
                    split = _all_to_all_splits(mine, info.rank, info.nranks)
                    if split is None:
                        fields["coll"] = _RAW(b'"coalesced"')
                    else:
                        sent, got = split
                        fields.update(coll=_RAW(b'"all_to_all"'), dtype=_RAW(enc(_BYTES_CARRIER)),
                                      in_nelems=_RAW(enc(sum(sent))), out_nelems=_RAW(enc(sum(got))),
                                      in_split=_RAW(enc(sent)), out_split=_RAW(enc(got)))
                        self.absorbed.update((gtid, m.start, m.op) for m in mine)
                    self.kernel_args[(_pid(gtid), corr)] = kineto.Args(**fields)

    def assign_ranks(self, host: str | None) -> str | None:
        """Global ranks: the world communicator's comm rank (the largest communicator), else the
        rank map (host, pid, device), else --rank for a report of one GPU. Returns the world's group."""
        world = None
        first: dict[int, tuple[int, int]] = {}  # comm -> (nranks, earliest init)
        for p in self.procs.values():
            for c in p.comms.values():
                n, t = first.get(c.comm, (c.nranks, c.start))
                first[c.comm] = (max(n, c.nranks), min(t, c.start))
        if first:  # the largest communicator; of equal ones the first made (subgroups are split from it)
            world = min(first, key=lambda k: (-first[k][0], first[k][1], k))
        for p in self.procs.values():
            if world is not None and world in p.comms:
                p.rank = p.comms[world].rank
            else:
                p.rank = self.rank_map.get((host, p.pid, p.device), self.rank_map.get((None, p.pid, p.device)))
        missing = [p for p in self.procs.values() if p.rank is None]
        if missing and self.rank_arg is not None and len(self.procs) == 1:
            missing[0].rank = self.rank_arg
            missing = []
        if missing:
            where = ", ".join(f"pid {p.pid} device {p.device}" for p in missing[:4])
            raise InputError(self.path, f"{NO_RANK}; {where}: ingest it with the run's NCCL logs (NCCL_DEBUG=INFO), "
                                        "or pass --rank-map (or --rank for a one-GPU report)")
        ranks = Counter(p.rank for p in self.procs.values())
        twice = [r for r, n in ranks.items() if n > 1]
        if twice:
            raise InputError(self.path, f"rank {twice[0]} given to two (process, device) pairs of the report")
        return group_name(world) if world is not None else None


def parse(path: str | os.PathLike[str], sink: SourceSink, *, rank: int | None = None,
          rank_map: Mapping[tuple[str | None, int, int], int] | None = None) -> ParseResult:
    """Parse one Nsight Systems export into `sink` (one rank per process and GPU); raise
    InputError when it cannot be used. A `.nsys-rep` is exported first when `nsys` is on PATH."""
    path = os.fspath(path)
    p = Path(path)
    with open(p, "rb") as f:
        head = f.read(4096)
    if head.startswith(SQLITE_MAGIC):  # by content, whatever its name (an export renamed .nsys-rep too)
        return _parse_source(path, _SQLite(path), sink, rank, rank_map)
    if p.suffix in REPORT_SUFFIXES and not looks_binary(head):
        raise InputError(path, f"named {p.suffix} but it is text (or empty), not an Nsight Systems report")
    if p.suffix == ".qdrep":
        raise InputError(path, "an old Nsight Systems report (.qdrep, before 2021.4): export it with the "
                               f"release that wrote it: nsys export --type sqlite -o {p.with_suffix('.sqlite').name} "
                               f"{p.name}")
    if p.suffix == ".nsys-rep":
        return _from_report(path, sink, rank, rank_map)
    if not (p.stem == "StringIds" and p.suffix in _ArrowDir.SUFFIXES):
        if head[:2] == b"\x1f\x8b":
            raise InputError(path, "a gzip-compressed file: SQLite cannot read it compressed; gunzip it first")
        raise InputError(path, "not an Nsight Systems export: no SQLite header (and not a .nsys-rep, .qdrep "
                               "or the StringIds file of a directory export)")
    return _parse_source(path, _ArrowDir(str(p.parent)), sink, rank, rank_map)


def _parse_source(path: str, src: _Source, sink: SourceSink, rank: int | None,
                  rank_map: Mapping[tuple[str | None, int, int], int] | None) -> ParseResult:
    with kineto.gc_paused():
        try:
            return _parse(path, src, sink, rank, rank_map)
        finally:
            src.close()


def export_command(report: str) -> list[str]:
    """The `nsys export` call that turns a report into the SQLite tracekit reads."""
    out = Path(report).with_suffix(".sqlite").name
    return ["nsys", "export", "--type", "sqlite", "--output", out, report]


def _from_report(path: str, sink: SourceSink, rank: int | None,
                 rank_map: Mapping[tuple[str | None, int, int], int] | None) -> ParseResult:
    nsys = shutil.which("nsys")
    if nsys is None:
        raise InputError(path, "an Nsight Systems report: tracekit reads its SQLite export; nsys is not on PATH, "
                               f"run: {' '.join(export_command(Path(path).name))}")
    with tempfile.TemporaryDirectory(prefix="tracekit-nsys-") as tmp:
        out = Path(tmp) / "report.sqlite"
        cmd = [nsys, "export", "--type", "sqlite", "--output", str(out), "--force-overwrite", "true", path]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise InputError(path, f"nsys export failed ({exc})") from exc
        if done.returncode != 0 or not out.is_file():
            last = (done.stderr or done.stdout or "").strip().splitlines()[-1:] or ["no output"]
            raise InputError(path, f"nsys export failed (exit {done.returncode}: {last[0][:200]})")
        src = _SQLite(str(out))
        try:
            return _parse(path, src, sink, rank, rank_map)
        finally:
            src.close()


def _parse(path: str, src: _Source, sink: SourceSink, rank: int | None,
           rank_map: Mapping[tuple[str | None, int, int], int] | None) -> ParseResult:
    stats = SourceStats()
    if not is_nsight_tables(list(src.tables)):
        raise InputError(path, "an SQLite database, but not an Nsight Systems export (no StringIds and "
                               "CUPTI_ACTIVITY_KIND_* / NVTX_EVENTS tables)")
    ps = _Parse(path, src, sink, rank, rank_map, stats)
    ps.read_strings()
    base, host, gpus = ps.meta()
    nv = ps.nvtx_columns()
    ps.devices()
    ps.comms(nv)
    world = ps.assign_ranks(host)
    procs = sorted(ps.procs.values(), key=lambda p: p.rank)  # type: ignore[arg-type, return-value]
    by_pid: dict[int, list[_Proc]] = defaultdict(list)
    for pr in procs:
        by_pid[pr.pid].append(pr)
    passes: dict[int, kineto.Pass1] = {}
    spools: list[Path] = []
    launches_given = src.has(RUNTIME, "start", "end", "globalTid", "correlationId") and src.index_launches()
    for pr in procs:
        spool = sink.part_dir / f"_events_{pr.rank}.arrows"
        spools.append(spool)
        p1 = kineto.Pass1(spool, ps.comm_re, stats, launches_given=launches_given)
        p1.spool_memory = max(8 << 20, kineto.SPOOL_MEMORY // len(procs))
        passes[pr.rank] = p1  # type: ignore[index]
    feed = _Feed(ps, passes, by_pid, launches_given)
    try:
        ps.comm_launches()
        ps.resolve_groups()
        ps.p2p.clear()
        ps.group_marks.clear()
        feed.activities()
        feed.runtime()
        feed.nvtx(nv)
        ps.launches.clear()  # only the NVTX pass needs the launches; the Kineto pass 2 comes next
        ps.kernel_args.clear()
        ps.absorbed.clear()
        results = []
        for pr in procs:
            p1 = passes[pr.rank]  # type: ignore[index]
            p1.close()
            name, bus = gpus.get(pr.device, (None, None))
            ident = _identity(path, pr, p1, base, host, name, world, len(procs))
            psink = _Sink(sink, pr, bus)
            results.append(kineto.pass2(path, psink, p1, {}, ident, stats))  # type: ignore[arg-type]
    finally:
        for p1 in passes.values():
            p1.close()
        for s in spools:
            s.unlink(missing_ok=True)
    _write_rank_maps(sink, ps, world)
    stats.warnings.extend(ps.payloads.warnings())
    ranks = [r.rank for r in results if r.rank is not None]
    lo = [r.ts_min_ns for r in results if r.ts_min_ns is not None]
    hi = [r.ts_max_ns for r in results if r.ts_max_ns is not None]
    return ParseResult(stats=stats, rank=ranks[0] if len(ranks) == 1 else None, ranks=ranks,
                       events=sum(r.events for r in results), collectives=sum(r.collectives for r in results),
                       groups=len({g for pr in procs for g in pr.comms}) or max((r.groups for r in results), default=0),
                       steps=sorted({s for r in results for s in r.steps}), ts_min_ns=min(lo) if lo else None,
                       ts_max_ns=max(hi) if hi else None)


def _identity(path: str, pr: _Proc, p1: kineto.Pass1, base: int, host: str | None, device_name: str | None,
              world: str | None, n_procs: int) -> kineto.Identity:
    pg_config = []
    for c in pr.comms.values():
        pg_config.append({"pg_name": group_name(c.comm), "pg_size": c.nranks, "backend_config": "cuda:nccl",
                          "ranks": [pr.rank]})
    world_size = next((c.nranks for c in pr.comms.values() if group_name(c.comm) == world), None)
    base_ns = kineto.base_ns(path, base, p1)
    return kineto.Identity(rank=pr.rank, world_size=world_size, backend="nccl" if pr.comms else None,  # type: ignore[arg-type]
                            nccl_version=None, host=host, pid=pr.pid, device=pr.device, device_name=device_name,
                            base_ns=base_ns, pg_config=pg_config)


class _Sink:
    """The source's sink as one rank's `_pass2` writes into it: rows say `nsys`, p2p peers (NCCL's
    comm-local `Peer rank`) move to `peer_local` and get their global rank where this report's
    rank map of the group knows it."""

    def __init__(self, sink: SourceSink, proc: _Proc, bus: str | None) -> None:
        self.sink, self.proc, self.bus = sink, proc, bus
        self.part_dir = sink.part_dir

    def add_events(self, data: Any) -> None:
        self.sink.add_events(data)

    def add(self, name: str, data: dict[str, Any]) -> None:
        if name == "ranks":
            data = {**data, "source_format": [NAME], "bus_id": pa.array([self.bus], pa.string())}
        elif name == "collectives":
            data = {**data, "source": [NAME] * len(data["coll_id"]),
                    "dtype": [None if d == _BYTES_CARRIER else d for d in data["dtype"].to_pylist()]}
            local = data["peer"].to_pylist()
            data["peer_local"] = pa.array(local, pa.int32())
            data["peer"] = pa.nulls(len(local), pa.int32())
        self.sink.add(name, data)


def _write_rank_maps(sink: SourceSink, ps: _Parse, world: str | None) -> None:
    """A groups row per communicator with its rank map (comm rank -> global rank, as far as this
    report knows): the ingest merge joins them across reports and resolves p2p peers with them."""
    maps: dict[int, list[int | None]] = {}
    sizes: dict[int, int] = {}
    budget = MAX_RANK_MAP_ENTRIES
    for pr in ps.procs.values():
        for c in pr.comms.values():
            if c.comm not in maps:
                if c.nranks > budget:
                    ps.stats.warnings.append(f"communicator {group_name(c.comm)}: no rank map (the report's "
                                             f"communicators add up to more than {MAX_RANK_MAP_ENTRIES:,} ranks)")
                    continue
                budget -= c.nranks
            m = maps.setdefault(c.comm, [None] * c.nranks)
            sizes[c.comm] = c.nranks
            if c.rank < len(m):
                m[c.rank] = pr.rank
    if not maps:
        return
    names = sorted(maps)
    rows = []
    for c in names:
        rm = maps[c]
        if group_name(c) == world:
            rm = list(range(len(rm)))
        known = [r for r in rm if r is not None]
        rows.append((group_name(c), rm, sorted(known), len(known) == len(rm)))
    sink.add("groups", {
        "group": [r[0] for r in rows], "desc": [None] * len(rows), "backend": ["nccl"] * len(rows),
        "ranks": pa.array([r[2] for r in rows], pa.list_(pa.int32())),
        "size": pa.array([sizes[c] for c in names], pa.int32()),
        "dims": pa.array([[] for _ in rows], pa.list_(pa.string())),
        "ranks_complete": [r[3] for r in rows],
        "rank_map": pa.array([r[1] for r in rows], pa.list_(pa.int32())),
        "world": [r[0] == world for r in rows],
    })


def _us(ns: int) -> msgspec.Raw:
    """ns as the exact decimal microseconds a Chrome trace would hold."""
    if ns >= 0:
        return _RAW(b"%d.%03d" % divmod(ns, 1000))
    return _RAW(b"-%d.%03d" % divmod(-ns, 1000))


def _int_values(values: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
    """A column as int64 and the mask of its values that are ints (what `type(v) is int` accepts)."""
    try:
        arr = pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
        arr = None
    if arr is not None and arr.type == pa.int64():
        ok = ~np.asarray(arr.is_null().to_numpy(zero_copy_only=False), bool) if arr.null_count else \
            np.ones(len(arr), bool)
        return pc.fill_null(arr, 0).to_numpy(zero_copy_only=False), ok
    ok = np.array([type(v) is int and -(2**63) <= v < 2**63 for v in values], bool)
    return np.array([v if k else 0 for v, k in zip(values, ok.tolist(), strict=True)], np.int64), ok


def _id_column(values: Sequence[Any], rows: np.ndarray, field_name: str, stats: SourceStats) -> pa.Array:
    """`values[rows]` as Kineto's int64 id column (a value that is no int becomes null, counted)."""
    try:
        arr = pa.array(values, pa.int64())
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
        return kineto.int_column([values[i] for i in rows.tolist()], field_name, stats)
    return arr.take(pa.array(rows))


def _codes(values: Sequence[Any]) -> tuple[list[Any], np.ndarray]:
    """The distinct values of a column (first-occurrence order) and each row's index into them."""
    try:
        arr = pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
        arr = None
    if arr is not None and arr.type in (pa.int64(), pa.string(), pa.null()):
        enc = arr.dictionary_encode()
        vals = enc.dictionary.to_pylist()
        if enc.null_count:
            vals.append(None)
        return vals, pc.fill_null(enc.indices, len(vals) - 1).to_numpy(zero_copy_only=False)
    seen: dict[tuple[type, Any], int] = {}
    vals = []
    idx = np.empty(len(values), np.int64)
    for i, v in enumerate(values):
        k = (type(v), v)
        j = seen.get(k)
        if j is None:
            j = seen[k] = len(vals)
            vals.append(v)
        idx[i] = j
    return vals, idx


def _column(values: Sequence[Any], take: pa.Array, rows: list[int]) -> pa.Array | list[Any]:
    """`values[rows]`: an Arrow array when the column is plain int64, else the Python values."""
    try:
        arr = pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
        arr = None
    if arr is not None and arr.type == pa.int64() and not arr.null_count:
        return arr.take(take)
    return [values[i] for i in rows]


def _pair_codes(a: Sequence[Any], b: Sequence[Any]) -> tuple[list[tuple[Any, Any]], np.ndarray]:
    """`_codes` of the rows' (a, b) pairs."""
    av, ai = _codes(a)
    bv, bi = _codes(b)
    keys, idx = np.unique(ai * len(bv) + bi, return_inverse=True)
    return [(av[k // len(bv)], bv[k % len(bv)]) for k in keys.tolist()], idx.reshape(-1)


def _dict_column(names: list[str], idx: np.ndarray) -> pa.DictionaryArray:
    """Rows' strings given as distinct names (repeats allowed) and each row's index into them."""
    d = pa.array(names, pa.string()).dictionary_encode()
    remap = d.indices.to_numpy(zero_copy_only=False).astype(np.int32)
    return pa.DictionaryArray.from_arrays(pa.array(remap[idx] if len(remap) else np.zeros(0, np.int32)),
                                          d.dictionary)


def _constant(text: str, n: int) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array([text], pa.string()))


_TS_LO, _TS_HI = RANGES["time_ns"]
_DUR_LO, _DUR_HI = RANGES["duration_ns"]


def _times(start: np.ndarray, end: np.ndarray) -> tuple[pa.Array, np.ndarray, pa.Array, np.ndarray]:
    """ts = start and dur = end - start in ns, null (and flagged) where out of Kineto's ranges."""
    dur = end - start  # int64: a wrapped difference is flagged below
    wrapped = ((end ^ start) & (end ^ dur)) < 0
    ts_oor = (start < _TS_LO) | (start > _TS_HI)
    dur_oor = wrapped | (dur < _DUR_LO) | (dur > _DUR_HI)
    ts = pa.array(start, pa.int64(), mask=ts_oor) if ts_oor.any() else pa.array(start, pa.int64())
    d = pa.array(dur, pa.int64(), mask=dur_oor) if dur_oor.any() else pa.array(dur, pa.int64())
    return ts, ts_oor, d, dur_oor


def _no_sync(n: int) -> Any:
    return lambda _kind: ([None] * n, [None] * n)


class _Feed:
    """Rows of the export -> columns of Kineto X events for their rank's first pass, table by
    table, a batch at a time (never a Python object per row, only per communication marker)."""

    def __init__(self, ps: _Parse, passes: dict[int, kineto.Pass1], by_pid: dict[int, list[_Proc]],
                 launches_given: bool) -> None:
        self.ps, self.passes, self.by_pid = ps, passes, by_pid
        self.stats = ps.stats
        self.thread_rank: dict[int, int | None] = {}
        self.launches_given = launches_given
        #: ranks that get their process's runtime calls (its first GPU): only they have launches
        self.has_launches = {procs[0].rank for procs in by_pid.values() if procs}

    def _rank_of(self, pid: int | None, device: Any) -> int | None:
        for pr in self.by_pid.get(pid, ()):  # type: ignore[arg-type]
            if pr.device == device:
                return pr.rank
        return None

    def _thread_rank(self, gtid: Any) -> int | None:
        r = self.thread_rank.get(gtid, -1)
        if r != -1:
            return r
        procs = self.by_pid.get(_pid(gtid), [])  # type: ignore[arg-type]
        r = procs[0].rank if len(procs) >= 1 else None
        self.thread_rank[gtid] = r
        return r

    def _kept(self, ranks: np.ndarray, ok: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
        """Skip (and count) the rows without a rank or usable times; the rest by rank, in row order."""
        no_rank = ranks < 0
        bad = ~no_rank & ~ok
        if no_rank.any():
            self.stats.skip("no_rank", int(no_rank.sum()))
        if bad.any():
            self.stats.skip("missing_or_bad_ts", int(bad.sum()))
        keep = ~no_rank & ok
        if not keep.any():
            return
        rows = np.flatnonzero(keep)
        rk = ranks[rows]
        for r in dict.fromkeys(rk.tolist()):
            yield r, rows[rk == r] if len(rk) and (rk != r).any() else rows

    def event_records(self) -> dict[tuple[Any, Any], list[tuple[int, int]]]:
        """CUDA event records (CUPTI_ACTIVITY_KIND_CUDA_EVENT, recent releases) by (process,
        event id): (correlation, stream), for the stream a synchronization waits on."""
        out: dict[tuple[Any, Any], list[tuple[int, int]]] = defaultdict(list)
        cols = ("globalPid", "eventId", "correlationId", "streamId")
        if not self.ps.src.has(CUDA_EVENT, *cols):
            return out
        for b in self.ps.src.batches(CUDA_EVENT, cols):
            for g, e, c, st in zip(*(b[k] for k in cols), strict=True):
                if type(c) is int and type(st) is int:
                    out[(g, e)].append((c, st))
        for v in out.values():
            v.sort()
        return out

    def activities(self) -> None:
        ps = self.ps
        records = self.event_records()
        for table in ACTIVITY_TABLES:
            if not ps.src.has(table, "start", "end", "deviceId", "streamId", "globalPid"):
                if table in ps.src.tables:
                    n = sum(len(next(iter(b.values()))) for b in ps.src.batches(table, ps.src.tables[table][:1]))
                    if n:
                        self.stats.skip(f"{table.lower()}_without_device_columns", n)
                continue
            cols = ["start", "end", "deviceId", "streamId", "globalPid"]
            has_corr = "correlationId" in ps.src.tables[table]
            if has_corr:
                cols.append("correlationId")
            name_col = None
            if table == KERNEL:
                name_col = ps.kernel_name_column()
                if name_col:
                    cols.append(name_col)
            elif table == MEMCPY and "copyKind" in ps.src.tables[table]:
                cols.append("copyKind")
            elif table == SYNC:
                cols += [c for c in ("syncType", "eventId") if c in ps.src.tables[table]]
            rank_of: dict[tuple[Any, Any], int | None] = {}
            joined = self.launches_given and has_corr
            for b in ps.src.launch_batches(table, cols) if joined else ps.src.batches(table, cols):
                keys, key_idx = _pair_codes(b["globalPid"], b["deviceId"])
                key_rank = []
                for key in keys:
                    r = rank_of.get(key, -1)
                    if r == -1:
                        r = rank_of[key] = self._rank_of(_pid(key[0]), key[1])
                    key_rank.append(-1 if r is None else r)
                ranks = np.asarray(key_rank, np.int64)[key_idx]
                start, s_ok = _int_values(b["start"])
                end, e_ok = _int_values(b["end"])
                for r, rows in self._kept(ranks, s_ok & e_ok):
                    self._activity_rows(table, b, rows, start, end, has_corr, name_col, records, r)

    def _activity_rows(self, table: str, b: dict[str, list[Any]], rows: np.ndarray, start: np.ndarray,
                       end: np.ndarray, has_corr: bool, name_col: str | None,
                       records: dict[tuple[Any, Any], list[tuple[int, int]]], rank: int) -> None:
        ps = self.ps
        p1 = self.passes[rank]
        n = len(rows)
        rl = rows.tolist()
        devices = b["deviceId"]
        corr_raw = b["correlationId"] if has_corr else None
        if table == KERNEL:
            if name_col:
                vals, idx = _codes(b[name_col])
                name = _dict_column([ps.string(v) or "unknown kernel" for v in vals], idx[rows])
            else:
                name = _constant("unknown kernel", n)
        elif table == MEMCPY:
            kinds = b.get("copyKind")
            vals, idx = _codes([kinds[i] for i in rl] if kinds else [None] * n)
            name = _dict_column([_MEMCPY_NAMES.get(v, "Memcpy") for v in vals], idx)
        elif table == MEMSET:
            name = _constant("Memset (Device)", n)
        else:
            kinds = b.get("syncType")
            vals, idx = _codes([kinds[i] for i in rl] if kinds else [None] * n)
            name = _dict_column([SYNC_NAMES.get(v, "Synchronization") for v in vals], idx)
        grouped = ps.kernel_args if table == KERNEL else None
        gpids = b["globalPid"]

        def args_at(j: int) -> kineto.Args:
            i = rl[j]
            corr = corr_raw[i] if corr_raw is not None else None
            args = grouped.get((_pid(gpids[i]), corr)) if grouped and corr is not None else None
            if args is None:
                return kineto.Args(correlation=corr, device=devices[i])
            return msgspec.structs.replace(args, correlation=corr, device=devices[i])  # the group's call args

        sync_columns = _no_sync(n)
        if table == SYNC and "eventId" in b and corr_raw is not None:
            events = b["eventId"]

            def sync_columns(_kind: np.ndarray) -> tuple[list[str | None], list[int | None]]:
                lanes: list[str | None] = [None] * n
                waits: list[int | None] = [None] * n
                for j, i in enumerate(rl):
                    corr = corr_raw[i]
                    if type(corr) is not int:
                        continue
                    rec = records.get((gpids[i], events[i]))
                    k = bisect_right(rec, (corr, -1)) - 1 if rec else -1
                    if not rec or k < 0:
                        continue
                    wc, ws = rec[k]  # the event's last record before this wait
                    if ws >= 0:
                        dev = as_int(devices[i])
                        lanes[j] = f"gpu{kineto.fmt(dev if dev is not None else devices[i])}/stream{ws}"
                    if wc >= 0:
                        waits[j] = wc
                return lanes, waits

        ts, ts_oor, dur, dur_oor = _times(start[rows], end[rows])
        take = pa.array(rows)
        launch_ts = None
        if self.launches_given:
            launch_ts = pa.nulls(n, pa.int64())
            if "launchStart" in b and rank in self.has_launches:
                launch_ts = pa.array(b["launchStart"], pa.int64()).take(take)
        p1.add_columns(launch_ts=launch_ts, cat=_constant(CATEGORY[table], n), name=name,
                       pids=_column(devices, take, rl),
                       tids=_column(b["streamId"], take, rl), ts=ts, ts_oor=ts_oor, dur=dur, dur_oor=dur_oor,
                       dur_empty=np.zeros(n, bool),
                       corr=_id_column(corr_raw, rows, "correlation", self.stats) if corr_raw is not None
                       else pa.nulls(n, pa.int64()),
                       ext=pa.nulls(n, pa.int64()), sync_columns=sync_columns, args_at=args_at)

    def _thread_ranks(self, gtids: Sequence[Any]) -> tuple[np.ndarray, list[Any], np.ndarray]:
        """Each row's rank (-1: none) by its thread, and the distinct threads with each row's index."""
        vals, idx = _codes(gtids)
        ranks = np.asarray([-1 if (r := self._thread_rank(g)) is None else r for g in vals], np.int64)
        return ranks[idx], vals, idx

    def runtime(self) -> None:
        ps = self.ps
        if not ps.src.has(RUNTIME, "start", "end", "globalTid", "correlationId", "nameId"):
            return
        cats: dict[str, str] = {}
        for b in ps.src.batches(RUNTIME, ("start", "end", "globalTid", "correlationId", "nameId")):
            ranks, threads, thread_idx = self._thread_ranks(b["globalTid"])
            start, s_ok = _int_values(b["start"])
            end, e_ok = _int_values(b["end"])
            corr_raw = b["correlationId"]
            vals, name_idx = _codes(b["nameId"])
            names = [ps.string(v) or "unknown call" for v in vals]
            for nm in names:
                if nm not in cats:
                    cats[nm] = "cuda_driver" if nm.startswith("cu") and not nm.startswith("cuda") else "cuda_runtime"
            cat_names = [cats[nm] for nm in names]
            for r, rows in self._kept(ranks, s_ok & e_ok):
                n = len(rows)
                rl = rows.tolist()
                idx = name_idx[rows]
                pids, tids = self._thread_columns(threads, thread_idx[rows])
                ts, ts_oor, dur, dur_oor = _times(start[rows], end[rows])
                comm_launch = None
                if self.launches_given:
                    cv, c_ok = _int_values([corr_raw[i] for i in rows.tolist()])
                    comm_launch = c_ok & np.isin(cv, self.ps.comm_corrs)
                self.passes[r].add_columns(
                    runtime_rows=comm_launch, cat=_dict_column(cat_names, idx), name=_dict_column(names, idx),
                    pids=pids, tids=tids, ts=ts, ts_oor=ts_oor, dur=dur, dur_oor=dur_oor,
                    dur_empty=np.zeros(n, bool), corr=_id_column(corr_raw, rows, "correlation", self.stats),
                    ext=pa.nulls(n, pa.int64()), sync_columns=_no_sync(n),
                    args_at=lambda j, rl=rl, c=corr_raw: kineto.Args(correlation=c[rl[j]]))

    @staticmethod
    def _thread_columns(threads: list[Any], idx: np.ndarray) -> tuple[pa.Array, pa.Array]:
        """The pid and tid of each row (threads with a rank are ints)."""
        pid = np.asarray([_pid(g) if type(g) is int else -1 for g in threads], np.int64)
        tid = np.asarray([_tid(g) if type(g) is int else -1 for g in threads], np.int64)
        return pa.array(pid[idx]), pa.array(tid[idx])

    def nvtx(self, nv: _Nvtx | None) -> None:
        ps = self.ps
        if nv is None:
            return
        rng = {nv.types["NvtxPushPopRange"], nv.types["NvtxStartEndRange"]}
        comm_nranks = {c.comm: c.nranks for pr in ps.procs.values() for c in pr.comms.values()}
        absorbed = ps.absorbed
        for b in ps.nvtx_batches(nv):
            out: dict[int, list[tuple[str, int, int, int, kineto.Args | None]]] = defaultdict(list)
            for i, et in enumerate(b["eventType"]):
                if et not in rng:
                    self.stats.skip("nvtx_mark" if et == nv.types["NvtxMark"] else
                                    "nvtx_domain" if et == nv.types["NvtxDomainCreate"] else "nvtx_other")
                    continue
                start, end, gtid = b["start"][i], b["end"][i], b["globalTid"][i]
                r = self._thread_rank(gtid)
                if r is None or type(start) is not int or type(end) is not int:
                    self.stats.skip("no_rank" if r is None else "missing_or_bad_ts")
                    continue
                name = ps.nvtx_text(b, i, nv) or ""
                args = None
                coll = NCCL_CALLS.get(name)
                if coll is not None and absorbed and (gtid, start, coll) in absorbed:
                    coll = None  # one call of a group its kernel carries (resolve_groups)
                if coll is not None:
                    pl = ps.nvtx_payload(b, i, nv, tally=name not in ("ncclSend", "ncclRecv"))  # counted in comms()
                    args = self._call_args(coll, pl, gtid, start, end, comm_nranks)
                out[r].append((name, start, end, gtid, args))
            for r, rows in out.items():
                n = len(rows)
                names, starts, ends, gtids, argss = (list(c) for c in zip(*rows, strict=True))
                vals, idx = _codes(names)
                threads, thread_idx = _codes(gtids)
                pids, tids = self._thread_columns(threads, thread_idx)
                ts, ts_oor, dur, dur_oor = _times(np.asarray(starts, np.int64), np.asarray(ends, np.int64))
                self.passes[r].add_columns(
                    cat=_constant("user_annotation", n), name=_dict_column(vals, idx), pids=pids, tids=tids,
                    ts=ts, ts_oor=ts_oor, dur=dur, dur_oor=dur_oor, dur_empty=np.zeros(n, bool),
                    corr=pa.nulls(n, pa.int64()), ext=pa.nulls(n, pa.int64()), sync_columns=_no_sync(n),
                    args_at=argss.__getitem__)


    def _call_args(self, coll: str, pl: dict[str, int], gtid: int, start: int, end: int,
                   comm_nranks: dict[int, int]) -> kineto.Args:
        """Kineto's collective args for an NCCL call range: op, group, size, bytes (NCCL's message
        size, with the dtype of the kernel launched inside the range) and the comm-local peer."""
        enc = msgspec.json.encode
        fields: dict[str, Any] = {"coll": _RAW(enc(coll))}
        comm = pl.get("comm")
        nranks = comm_nranks.get(comm) if comm is not None else None
        if comm is not None:
            fields["pg_name"] = _RAW(enc(group_name(comm)))
        if nranks is not None:
            fields["group_size"] = _RAW(enc(nranks))
        launched = self.ps.launches.get(gtid)
        if launched is None:
            launched = _NO_LAUNCHES
        dtype = None
        j = launched.first_from(start)
        starts, codes, names = launched.starts, launched.codes, launched.names
        while j < len(starts) and starts[j] <= end:
            dtype = kernel_dtype(names[codes[j]])
            if dtype:
                break
            j += 1
        dtype = dtype or _BYTES_CARRIER  # 2.19+ AllGather/Broadcast and p2p kernels name no dtype
        nbytes = pl.get("bytes")
        width = dtype_bytes(dtype)
        if nbytes is not None and width and nbytes % width == 0:
            n = nbytes // width
            n_in = n_out = n
            if coll == "allgather" and nranks:
                n_out = n * nranks
            elif coll == "reduce_scatter" and nranks:
                n_in = n * nranks
            fields.update(dtype=_RAW(enc(dtype)), in_nelems=_RAW(enc(n_in)), out_nelems=_RAW(enc(n_out)))
        elif nbytes is not None:
            self.stats.drop("bytes")
        peer = pl.get("peer")
        if peer is not None and coll in ("send", "recv"):
            fields["dst_rank" if coll == "send" else "src_rank"] = _RAW(enc(peer))
        return kineto.Args(**fields)


#: CUPTI memcpy kinds (CUpti_ActivityMemcpyKind) -> the names Kineto gives memcpy records.
_MEMCPY_NAMES = {1: "Memcpy HtoD (Pageable -> Device)", 2: "Memcpy DtoH (Device -> Pageable)",
                 8: "Memcpy DtoD (Device -> Device)", 10: "Memcpy PtoP (Device -> Device)"}


FORMAT = Format(name=NAME, description="Nsight Systems exports", version=PARSER_VERSION, parse=parse,
                sniffs=(lambda head: head.path is not None and sniff_path(head.path, head.data),),
                options=("rank_map",), priority=0, maps_peers=True, ranks_from_logs=NO_RANK)
