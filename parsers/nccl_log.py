"""Parser for NCCL debug logs (`NCCL_DEBUG=INFO|TRACE`, NCCL 2.4 to 2.30), in any wrapper.

A record is `[TS]host:pid:tid [dev] NCCL INFO <message>` (WARN adds `file.cc:line` and, 2.30.7+,
`(func)` before `NCCL WARN`; TRACE adds elapsed time and `func:line`; CALL has no `[dev]`),
found anywhere in a line: launchers and loggers put their own prefixes first (mpirun `[0] `,
srun `1: `, Ray `(RayTrainWorker pid=..)`, Kubernetes or syslog timestamps, ANSI colours), and
logs sit inside other output (trainer logs, shell sessions, markdown). Two processes writing to
one file can glue records together; every record of a line is read, and a cut one is skipped as
`truncated record`. `shared/formats/nccl.md` §1 lists the printf formats by NCCL release.

What becomes what:

* COLL lines (`AllReduce: opCount 1f sendbuff ... count 10 datatype 7 op 0 root 0 comm 0x.. [nranks=2]`)
  -> `collectives`: one row per call, `seq` = opCount (hex; shared by the calls of one group
  call), bytes from `count` through the datatype enum, `peer` from `root` for Send/Recv.
* Init START/COMPLETE (every form: 2.4's `nvmlDev`, 2.5-2.17 without commId before 2.16, the
  2.21+ `ncclCommInitRank`/`ncclCommSplit`/`ncclCommInitRankConfig` prefixes, 2.29's `[Rank N]`)
  and `comm .. nRanks .. nNodes .. localRanks ..` -> `groups` (group = commId) and `ranks`.
* Ring/Trees/Tree/ring-order lines and transport lines (`via P2P/IPC`, `NET/IB/0(8)/GDRDMA`,
  `SHM/direct/direct`, `COLLNET/...`), `NVLS Trees` -> `channels`.
* TUNING lines (`Bytes -> Algo 1 proto 0` before 2.24, names since) -> `algo`/`proto` of the
  collective they follow on the same thread.
* WARN (and ABORT) lines, `file.cc:123 -> 3` error propagation, Destroy/Abort lines and PyTorch
  watchdog timeouts -> `log_messages`.

Communicators are keyed by (host, pid, comm pointer) and joined across ranks by commId.
NCCL prints communicator-local ranks; `rank` columns are global ranks, taken from the world
communicator (the largest one in the log) through each process's GPU; `comm_rank` columns keep
the local ones, and peers outside this log are resolved by ingest across logs. Every non-blank
line is counted: read = stored + skipped by reason.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import tempfile
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from tracekit._limits import MAX_WORLD_SIZE, RANGES, in_range, out_of_range
from tracekit.errors import InputError
from tracekit.parsers import _nccl
from tracekit.parsers._lines import LineSource, account, line_batches, strip_ansi
from tracekit.parsers.nccl_tests import TableReader
from tracekit.parsers.registry import Format
from tracekit.store import ParseResult, SourceSink, SourceStats

NAME = "nccl_log"
PARSER_VERSION = "3"  # 3: the tuning patterns see 256 bytes either side of " Bytes -> " only
#: coll_id = rank * 2**32 + COLL_ID_OFFSET + ordinal: apart from Kineto's and Flight Recorder's ids.
COLL_ID_OFFSET = 3 << 30
#: Collective rows kept in memory before they are spooled; tuning lines may still update the last
#: TUNING_WINDOW of them (they follow their COLL line within a group call).
BATCH_ROWS = 1 << 16
TUNING_WINDOW = 4096
#: log_messages rows kept; more are skipped with a reason.
MAX_MESSAGES = 200_000

_MARK = re.compile(rb" NCCL (INFO|WARN|TRACE|CALL|ABORT) ")
#: the host is tried only where a run of host characters begins (the only start in a run that can
#: match), so a search is linear in a long run instead of quadratic
_HEAD = re.compile(
    rb"(?<![^\s:\[\]()<>])(?P<host>[^\s:\[\]()<>]+):(?P<pid>\d+):(?P<tid>\d+)(?: \[(?P<dev>-?\d+)\])?"
    rb"(?: (?P<elapsed>-?\d+\.\d+))?(?: (?P<loc>[^\s:]+:\d+))?(?: \((?P<func>[^()]*)\))?\s*$")
_TS_ISO = re.compile(
    rb"(\d{4})-(\d{2})-(\d{2})[T _](\d{2}):(\d{2}):(\d{2})(?:[.,](\d{1,9}))?(Z|[+-]\d{2}:?\d{2})?")
_TS_EPOCH = re.compile(rb"\[(\d{10})(?:\.(\d{1,9}))?\]")
_COLL = re.compile(
    rb"(\w+): opCount ([0-9a-fA-F]+) sendbuff \S+ recvbuff \S+ (?:acc \S+ )?count (\d+) datatype (\d+) "
    rb"op (\d+) root (-?\d+) comm (\S+) \[nranks=(\d+)\]")
#: the groups of _COLL
_C_NAME, _C_OPCOUNT, _C_COUNT, _C_DTYPE, _C_REDOP, _C_ROOT, _C_COMM, _C_NRANKS = range(8)
_INIT = re.compile(
    rb"(?:\[Rank -?\d+\] )?(?:(\w+) )?comm (\S+) rank (\d+) nranks (\d+) cudaDev (-?\d+)(?: nvmlDev (-?\d+))?"
    rb"(?: busId ([0-9a-fA-Fx]+))?(?: parent (\S+)(?: (?:splitCount|childCount) \d+)? color (-?\d+) key (-?\d+))?"
    rb"(?: commId 0x([0-9a-fA-F]+))? ?- Init (START|COMPLETE)")
_SUMMARY = re.compile(
    rb"comm (\S+) rank (\d+) nRanks (\d+) nNodes (\d+) localRanks (\d+) localRank (\d+)(?: MNNVL (\d+))?")
_END = re.compile(rb"comm (\S+) rank (\d+) n[Rr]anks (\d+) cudaDev (-?\d+) busId ([0-9a-fA-Fx]+) - "
                  rb"(Destroy|Abort|Revoke) (START|COMPLETE)")
_TUNE_OLD = re.compile(rb"(?:(\w+): )?(\d+) Bytes -> Algo (\d+) proto (\d+) time")
_TUNE_NEW = re.compile(rb"(\w+): (\d+) Bytes -> Algo (\w+) proto (\w+)")
#: bytes either side of " Bytes -> " that the tuning patterns see (real lines: a name and a size)
_TUNE_AROUND = 256
_TRANSPORT = re.compile(
    rb"(?:Channel|Ring) (\d+)(?:/(\d+))? : (\d+)(?:\[([0-9a-fA-F]+)\])? -> (\d+)(?:\[([0-9a-fA-F]+)\])? "
    rb"(?:\[(send|receive)\] )?via (.+?)\s*$")
_COLLNET = re.compile(rb"(?:CollNet|Coll) (\d+)(?:/(\d+))? : (\d+) \[(send|receive)\] via (COLLNET/.+?)\s*$")
_RING_ORDER = re.compile(rb"Channel (\d+)/(\d+) :((?:\s+\d+)+)\s*(\.\.\.)?\s*$")
_RING_GRAPH = re.compile(rb"Ring (\d+) : (-?\d+) -> (-?\d+) -> (-?\d+)")
_TREE_GRAPH = re.compile(rb"Tree (\d+) : (-?\d+) -> (-?\d+) -> (-?\d+)/(-?\d+)/(-?\d+)")
_TREES_NEW = re.compile(rb"\[(\d+)\] (-?\d+)/(-?\d+)/(-?\d+)->(-?\d+)->(-?\d+)"
                        rb"(?:\|(-?\d+)->(-?\d+)->(-?\d+)/(-?\d+)/(-?\d+))?")
_TREES_OLD = re.compile(rb"\[(\d+)\] (-?\d+)->(-?\d+)->(-?\d+)/(-?\d+)/(-?\d+)")
_NVLS_TREES = re.compile(rb"(-?\d+)/(-?\d+)(?:/(-?\d+))?->(-?\d+)->(-?\d+)")
_NET_VIA = re.compile(rb"NET/(.+?)/(\d+)(?:\((\d+)\))?((?:/GDRDMA|\(PCI\)|/Shared)*)$")
_CHANNELS = re.compile(rb"(\d+) coll channels, (?:(\d+) collnet channels, )?(?:(\d+) nvls channels, )?"
                       rb"(\d+) p2p channels")
_PXN = re.compile(rb"Connected all rings(?:, use ring PXN (\d+) GDR (\d+))?")
_NET_USING = re.compile(rb"NET/([^:]+?) ?: Using(.*)$")
_NET_DEV = re.compile(rb"\[(\d+)\]([^\s;\[]+)")
_ERRPROP = re.compile(rb"^(\S+\.(?:cc|cu|h|cpp)):(\d+) -> (\d+)")
_VERSION = re.compile(rb"NCCL version (\d+\.\d+\.\d+)")
_WATCHDOG = re.compile(rb"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(\d+), OpType=(\w+)")
_RANK_TAG = re.compile(rb"\[Rank (\d+)\]")
_TORCHRUN_RANK = re.compile(rb"\[rank(\d+)\]:")
_PTR_NIL = (b"(nil)", b"0x0", b"0", b"(null)")


@dataclass
class NcclLogResult(ParseResult):
    """The common result plus what the log held."""

    communicators: int = 0
    processes: int = 0
    nccl_versions: list[str] = field(default_factory=list)
    microbench_rows: int = 0
    #: COLL lines kept without a global rank (`unranked_collectives`)
    unranked_collectives: int = 0


@dataclass
class _Comm:
    """One communicator as one process saw it (one rank of it)."""

    idx: int
    host: str
    pid: int
    ptr: str
    rank: int | None = None
    nranks: int | None = None
    cuda_dev: int | None = None
    nvml_dev: int | None = None
    bus_id: str | None = None
    comm_id: str | None = None
    api: str | None = None
    color: int | None = None
    key: int | None = None
    n_nodes: int | None = None
    local_ranks: int | None = None
    local_rank: int | None = None
    started: bool = False
    complete: bool = False
    ended: str | None = None
    phase: str = "ring"
    pxn: bool | None = None
    gdr: bool | None = None
    n_channels: int | None = None
    nvls_channels: int | None = None
    p2p_channels: int | None = None
    collnet: bool = False
    nvls: bool = False
    init_line: int | None = None
    ring_next: dict[int, int] = field(default_factory=dict)
    ring_prev: dict[int, int] = field(default_factory=dict)
    ring_orders: dict[int, list[int]] = field(default_factory=dict)
    tree_up: dict[int, int] = field(default_factory=dict)
    tree_down: dict[int, list[int]] = field(default_factory=dict)
    nvls_up: dict[int, int] = field(default_factory=dict)
    nvls_down: dict[int, list[int]] = field(default_factory=dict)
    edges: dict[tuple[int | None, str, str, int | None], dict[str, Any]] = field(default_factory=dict)
    group: str | None = None

    @property
    def proc_dev(self) -> tuple[str, int, int | None]:
        return (self.host, self.pid, self.cuda_dev)


@dataclass
class _Proc:
    host: str
    pid: int
    version: str | None = None
    network: str | None = None
    net_devices: dict[str, dict[int, str]] = field(default_factory=dict)
    starts: bool = False
    torchrun_rank: int | None = None


#: NCCL connects a communicator's channels at its first collective (after Init COMPLETE) from 2.22 on.
LAZY_CONNECT = (2, 22)
#: Why a COLL line has no global rank (`unranked_collectives.rank_reason`).
NO_INIT = "collective on a communicator with no Init line (rank unknown)"
OUTSIDE_WORLD = "collective of a process GPU outside the world communicator"
#: Skip reason of setup lines (channels, `Connected ...`) that no communicator adopted.
NO_INIT_TOPOLOGY = "topology line with no communicator Init line"

#: Largest sum of communicator sizes given rank maps (a mutated log may declare thousands of
#: communicators of MAX_WORLD_SIZE ranks each; real logs come to a few million at most).
MAX_RANK_MAP_ENTRIES = 1 << 23
#: channel, rank and connection numbers are int32 in the `channels` table
_I32 = (-(2**31), 2**31 - 1)

def sniff(head: bytes) -> bool:
    """True when text holds NCCL debug records (`host:pid:tid [dev] NCCL INFO ...`)."""
    for m in _MARK.finditer(head):
        line_start = head.rfind(b"\n", 0, m.start()) + 1
        if _HEAD.search(head, line_start, m.start()) is not None:
            return True
    return False


def parse(path: str | os.PathLike[str], sink: SourceSink, *, rank: int | None = None) -> NcclLogResult:
    """Parse one NCCL debug log (any number of processes and communicators) into `sink`."""
    where = os.fspath(path)
    builder = _Builder(where, sink)
    info = LineSource()
    try:
        for batch in line_batches(where, info):
            builder.lines(batch)
    except OSError as exc:
        raise InputError(where, f"cannot read ({exc.strerror or exc})") from exc
    account(info, builder.stats)
    return builder.finish()


# ---------------------------------------------------------------------------------------------


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split(".") if x.isdigit())


def _s(b: bytes | None) -> str | None:
    return None if b is None else b.decode("utf-8", "replace")


def _watchdog_rank(line: bytes) -> bytes | None:
    """The `[Rank N]` before a PyTorch watchdog timeout message, if the line is one (each byte
    searched once: a lazy `[Rank N].*?Watchdog` pattern was quadratic in `[Rank N]` repeats)."""
    lo = 0
    for w in _WATCHDOG.finditer(line):
        r = _RANK_TAG.search(line, lo, w.start())
        if r is not None:
            return r.group(1)
        lo = w.start()
    return None


def _rank_count(b: bytes) -> int | None:
    """A communicator size: 1..MAX_WORLD_SIZE, else None (never used to size anything larger)."""
    n = _i(b)
    return n if n is not None and 1 <= n <= MAX_WORLD_SIZE else None


def _rank_and_size(rank: bytes, nranks: bytes) -> tuple[int, int] | str:
    """(rank, nranks) of an Init or summary line, or the skip reason when out of range."""
    n = _rank_count(nranks)
    if n is None:
        return out_of_range("nranks")
    r = _i(rank)
    if r is None or not 0 <= r < n:
        return out_of_range("rank")
    return r, n


def _i(b: bytes | None) -> int | None:
    if b is None:
        return None
    try:
        v = int(b)
    except ValueError:
        return None
    return v if -(2**62) < v < 2**62 else None


def _ts_of(pre: bytes) -> int | None:
    """Epoch ns of the last timestamp in a line's prefix (NCCL 2.26+ `[%F %T]`, loggers', ISO
    8601); times without a zone are read as UTC."""
    if not pre:
        return None
    found = None
    for m in _TS_ISO.finditer(pre):
        found = m
    if found is not None:
        y, mo, d, h, mi, s, frac, zone = found.groups()
        try:
            t = dt.datetime(int(y), int(mo), int(d), int(h), int(mi), int(s), tzinfo=dt.timezone.utc)
        except ValueError:
            return None
        ns = int(t.timestamp()) * 1_000_000_000
        if frac:
            ns += int(frac.ljust(9, b"0")[:9])
        if zone and zone not in (b"Z",):
            sign = -1 if zone[:1] == b"-" else 1
            digits = zone[1:].replace(b":", b"")
            ns -= sign * (int(digits[:2]) * 3600 + int(digits[2:4] or b"0") * 60) * 1_000_000_000
        return ns
    m = _TS_EPOCH.search(pre)
    if m:
        return int(m.group(1)) * 1_000_000_000 + int((m.group(2) or b"0").ljust(9, b"0")[:9])
    return None


class _Builder:
    def __init__(self, where: str, sink: SourceSink) -> None:
        self.where = where
        self.sink = sink
        self.stats = SourceStats()
        self.lineno = 0
        self.head_cache: dict[bytes, tuple[Any, ...] | None] = {}
        self.times_out_of_range = 0
        #: head bytes -> (host, pid, tid, pointer map) for heads without a timestamp: the COLL fast path
        self.fast_heads: dict[bytes, tuple[str, int, int, dict[bytes, int]]] = {}
        self.comms: list[_Comm] = []
        self.ptrs: dict[tuple[str, int], dict[bytes, int]] = defaultdict(dict)
        self.ctx_thread: dict[tuple[str, int, int], int] = {}
        self.ctx_dev: dict[tuple[str, int, int], int] = {}
        self.pending: dict[tuple[str, int, int], list[tuple[str, Any]]] = defaultdict(list)
        self.procs: dict[tuple[str, int], _Proc] = {}
        self.hosts_by_pid: dict[int, set[str]] = defaultdict(set)
        self.tables = TableReader(where)
        self.bare_version: str | None = None
        # collectives buffer (columns) and spool
        self.c_comm: list[int] = []
        self.c_groups: list[tuple[bytes, ...]] = []
        self.c_ts: list[int | None] = []
        self.c_line: list[int] = []
        self.c_tuned: dict[int, tuple[str, str]] = {}
        self.flushed = 0
        self.tune_pending: dict[tuple[str, int, int], list[Any]] = {}
        self.spool_path: Path | None = None
        self.spool: ipc.RecordBatchFileWriter | None = None
        self.messages: list[dict[str, Any]] = []
        self.ts_min: int | None = None
        self.ts_max: int | None = None
        self.unranked = 0

    # -- lines ---------------------------------------------------------------------------------

    def lines(self, batch: list[bytes]) -> None:
        mark_search = _MARK.search
        coll_match = _COLL.match
        fast = self.fast_heads
        c_comm, c_groups, c_ts, c_line = self.c_comm.append, self.c_groups.append, self.c_ts.append, self.c_line.append
        pending = self.tune_pending
        lineno = self.lineno
        n_fast = 0
        for raw in batch:
            lineno += 1
            if not raw or raw.isspace():
                continue
            # fast path: a whole COLL line of a known process thread and communicator
            i = raw.find(b" NCCL INFO ")
            if i > 0:
                h = fast.get(raw[:i])
                if h is not None:
                    m = coll_match(raw, i + 11)
                    if m is not None and raw.find(b" NCCL ", m.end()) < 0:
                        g = m.groups()
                        idx = h[3].get(g[_C_COMM])
                        if idx is not None:
                            c_comm(idx)
                            c_groups(g)
                            c_ts(None)
                            c_line(lineno)
                            pos = self.flushed + len(self.c_comm) - 1
                            key = h[:3]
                            cur = pending.get(key)
                            if cur is None or cur[0] != g[1]:
                                pending[key] = [g[1], pos]
                            elif len(cur) <= TUNING_WINDOW:
                                cur.append(pos)
                            n_fast += 1
                            continue
            self.lineno = lineno
            line = strip_ansi(raw) if b"\x1b" in raw else raw
            i = line.find(b" NCCL ")
            m = mark_search(line, i) if i >= 0 else None
            if m is None:
                self._foreign(line)
            elif line.find(b" NCCL ", m.end()) < 0:
                self._record(line, 0, m, len(line), cut=False)
            else:
                self._records(line, m)
        self.lineno = lineno
        self.stats.read += n_fast
        self.stats.stored += n_fast
        if len(self.c_comm) >= BATCH_ROWS + TUNING_WINDOW:
            self._spool(len(self.c_comm) - TUNING_WINDOW)

    def _records(self, line: bytes, first: re.Match[bytes]) -> None:
        """A line holding several records (writes glued together): each is read; a record's
        message ends where the next one's prefix begins, so all but the last may be cut."""
        real = [first]
        heads = [0]
        pos = first.end()
        while True:
            m = _MARK.search(line, pos)
            if m is None:
                break
            lo, pos = pos, m.end()  # a head lies after the previous mark: each byte is searched once
            h = _HEAD.search(line, lo, m.start())
            if h is None:
                continue  # " NCCL INFO " inside a message ("NCCL version"), not a new record
            heads.append(h.start())
            real.append(m)
        n = len(real)
        for k in range(n):
            end = heads[k + 1] if k + 1 < n else len(line)
            self._record(line, heads[k], real[k], end, cut=k + 1 < n, glued=k > 0)

    def _head(self, head: bytes, glued: bool = False) -> tuple[Any, ...] | None:
        got = self.head_cache.get(head, False)
        if got is not False:
            return got  # type: ignore[return-value]
        m = _HEAD.search(head)
        if m is None:
            parsed = None
        else:
            host = m.group("host").decode("utf-8", "replace")
            pid = _i(m.group("pid"))
            tid = _i(m.group("tid"))
            dev = _i(m.group("dev"))
            pre = head[:m.start()]
            ts = _ts_of(pre)
            if ts is not None and not in_range(ts, "time_ns"):
                self.times_out_of_range += 1
                ts = None
            tr = _TORCHRUN_RANK.search(pre)
            parsed = None if pid is None or tid is None else (
                self._host(host, pid, glued), pid, tid, dev, ts, _s(m.group("loc")), tr and _i(tr.group(1)))
        if len(self.head_cache) > 50_000:
            self.head_cache.clear()
        if parsed is None or parsed[4] is None:
            self.head_cache[head] = parsed
        if parsed is not None and parsed[4] is None and not glued:
            if len(self.fast_heads) > 50_000:
                self.fast_heads.clear()
            self.fast_heads[head] = (parsed[0], parsed[1], parsed[2], self.ptrs[(parsed[0], parsed[1])])
        return parsed

    def _host(self, host: str, pid: int, glued: bool = False) -> str:
        """The host of (host, pid), matching a cut hostname to one seen whole for that pid (and
        a glued record's `<cut message>host` to the host it ends with)."""
        known = self.hosts_by_pid[pid]
        if host in known:
            return host
        for h in known:
            if glued and host.endswith(h):
                return h
            if h.endswith(host) or host.endswith(h):
                longer = h if len(h) >= len(host) else host
                if longer != h:
                    known.discard(h)
                    known.add(longer)
                    self._rename_host(h, longer, pid)
                return longer
        known.add(host)
        return host

    def _rename_host(self, old: str, new: str, pid: int) -> None:
        proc = self.procs.pop((old, pid), None)
        if proc is not None:
            proc.host = new
            self.procs[(new, pid)] = proc
        for c in self.comms:
            if c.host == old and c.pid == pid:
                c.host = new
        if (old, pid) in self.ptrs:
            self.ptrs[(new, pid)].update(self.ptrs.pop((old, pid)))
        for table in (self.ctx_thread, self.ctx_dev):
            for k in [k for k in table if k[0] == old and k[1] == pid]:
                table[(new, *k[1:])] = table.pop(k)  # type: ignore[index]
        for k in [k for k in self.pending if k[0] == old and k[1] == pid]:
            self.pending[(new, *k[1:])] = self.pending.pop(k)  # type: ignore[index]
        self.head_cache.clear()
        self.fast_heads.clear()

    def _record(self, line: bytes, start: int, m: re.Match[bytes], end: int, *, cut: bool,
                glued: bool = False) -> None:
        stats = self.stats
        head = self._head(line[start:m.start()], glued)
        if head is None:
            self._foreign(line)
            return
        level = m.group(1)
        msg = line[m.end():end]
        if cut and (level != b"INFO" or _COLL.match(msg) is None):
            stats.skip("truncated record")
            return
        host, pid, tid, dev, ts, loc, trank = head
        if ts is not None:
            if self.ts_min is None or ts < self.ts_min:
                self.ts_min = ts
            if self.ts_max is None or ts > self.ts_max:
                self.ts_max = ts
        proc = self.procs.get((host, pid))
        if proc is None:
            proc = self.procs[(host, pid)] = _Proc(host, pid)
        if trank is not None:
            proc.torchrun_rank = trank
        if level == b"INFO":
            self._info(msg, host, pid, tid, dev, ts, proc)
        elif level == b"WARN" or level == b"ABORT":
            self._message(level.decode(), msg, host, pid, tid, dev, ts, loc)
        elif level == b"TRACE":
            if b"Bytes -> Algo" in msg:
                self._tuning(msg, host, pid, tid)
            elif msg.startswith((b"Ring ", b"Tree ")):
                self._topology(msg, host, pid, tid, dev)
            else:
                stats.skip("trace line")
        else:
            stats.skip("API call trace")

    def _foreign(self, line: bytes) -> None:
        stats = self.stats
        text = line.decode("utf-8", "replace")
        outcome = self.tables.feed(text)
        if outcome == "row":
            stats.store()
            return
        if outcome is not None and outcome != "comment":
            stats.skip("nccl-tests " + outcome)
            return
        rank_tag = _watchdog_rank(line)
        if rank_tag is not None:
            tr = _TORCHRUN_RANK.search(line)
            self._keep_message({"rank": _i(tr.group(1)) if tr else _i(rank_tag), "host": None, "pid": None,
                                "tid": None, "ts_ns": None, "level": "ERROR", "subsystem": "watchdog",
                                "message": text.strip(), "location": None, "comm_rank": None,
                                "_proc": None, "_rank_given": True})
            return
        v = _VERSION.search(line)
        if v:
            self.bare_version = v.group(1).decode()
            stats.skip("version line")
            return
        stats.skip("not an NCCL line")

    # -- INFO dispatch -------------------------------------------------------------------------

    def _info(self, msg: bytes, host: str, pid: int, tid: int, dev: int | None, ts: int | None,
              proc: _Proc) -> None:
        stats = self.stats
        k = msg.find(b": opCount ", 0, 48)
        if k >= 0:
            self._coll(msg, host, pid, tid, ts)
            return
        head = msg[:8]
        if head.startswith((b"Channel ", b"Ring ", b"Trees", b"Tree ", b"CollNet ", b"Coll ", b"NVLS ")):
            self._topology(msg, host, pid, tid, dev)
            return
        if b"- Init " in msg:
            self._init(msg, host, pid, tid, dev, proc)
            return
        if b"Bytes -> " in msg:
            self._tuning(msg, host, pid, tid)
            return
        if msg.startswith(b"comm ") and b" nNodes " in msg:
            self._summary(msg, host, pid, tid, dev)
            return
        if (b" COMPLETE" in msg or b" START" in msg) and self._end(msg, host, pid, tid, dev, ts):
            return
        if msg.startswith(b"Connected "):
            self._connected(msg, host, pid, tid, dev)
            return
        if b" coll channels, " in msg:
            m = _CHANNELS.search(msg)
            c = self._context(host, pid, tid, dev)
            if m and c is not None:
                c.n_channels = _i(m.group(1))
                c.nvls_channels = _i(m.group(3))
                c.p2p_channels = _i(m.group(4))
                stats.store()
            else:
                stats.skip("other NCCL line")
            return
        if msg.startswith(b"NCCL version "):
            v = _VERSION.match(msg)
            if v:
                proc.version = v.group(1).decode()
                stats.store()
            else:
                stats.skip("other NCCL line")
            return
        if msg.startswith(b"NET/"):
            m = _NET_USING.match(msg)
            if m and b"[" in m.group(2):
                name = m.group(1).decode("utf-8", "replace").strip()
                proc.net_devices[name] = {k: n.decode("utf-8", "replace").split("/")[0]
                                          for d, n in _NET_DEV.findall(m.group(2)) if (k := _i(d)) is not None}
                stats.store()
                return
        if msg.startswith(b"Using network "):
            proc.network = msg[len(b"Using network "):].strip().decode("utf-8", "replace")
            stats.store()
            return
        m = _ERRPROP.match(msg)
        if m:
            self._message("INFO", msg, host, pid, tid, dev, ts, None, subsystem="error")
            return
        stats.skip("other NCCL line")

    # -- collectives ---------------------------------------------------------------------------

    def _coll(self, msg: bytes, host: str, pid: int, tid: int, ts: int | None) -> None:
        m = _COLL.match(msg)
        if m is None:
            self.stats.skip("malformed COLL line")
            return
        g = m.groups()
        ptrs = self.ptrs[(host, pid)]
        idx = ptrs.get(g[_C_COMM])
        if idx is None:
            c = self._new_comm(host, pid, g[_C_COMM])
            c.nranks = _rank_count(g[_C_NRANKS])
            idx = c.idx
        self.c_comm.append(idx)
        self.c_groups.append(g)
        self.c_ts.append(ts)
        self.c_line.append(self.lineno)
        pos = self.flushed + len(self.c_comm) - 1
        key = (host, pid, tid)
        cur = self.tune_pending.get(key)
        if cur is None or cur[0] != g[1]:
            self.tune_pending[key] = [g[1], pos]
        elif len(cur) <= TUNING_WINDOW:
            cur.append(pos)
        self.stats.store()

    def _tuning(self, msg: bytes, host: str, pid: int, tid: int) -> None:
        # the patterns are searched near the first " Bytes -> " only: `(\w+): ` searched over a
        # long run of word characters backtracks quadratically (a 4 MB line took hours)
        at = msg.find(b" Bytes -> ")
        msg = msg[max(0, at - _TUNE_AROUND):at + _TUNE_AROUND] if at >= 0 else msg[:_TUNE_AROUND]
        m = _TUNE_NEW.search(msg)
        if m is not None and not m.group(3).isdigit():
            name, algo, proto = m.group(1), m.group(3).decode(), m.group(4).decode().upper()
        else:
            m = _TUNE_OLD.search(msg)
            if m is None:
                self.stats.skip("other NCCL line")
                return
            name = m.group(1)
            algo = _nccl.ALGOS.get(_i(m.group(3)), m.group(3).decode())  # type: ignore[arg-type]
            proto = _nccl.PROTOS.get(_i(m.group(4)), m.group(4).decode())  # type: ignore[arg-type]
        cur = self.tune_pending.get((host, pid, tid))
        if cur is not None:
            for pos in cur[1:]:
                j = pos - self.flushed
                if j < 0 or pos in self.c_tuned:
                    continue
                op = self.c_groups[j][_C_NAME]
                if op in (b"Send", b"Recv") or (name is not None and op != name):
                    continue
                self.c_tuned[pos] = (algo, proto)
                self.stats.store()
                return
        self.stats.skip("tuning line without its collective")

    def _spool(self, n: int) -> None:
        if n <= 0:
            return
        batch = self._coll_batch(0, n)
        if self.spool is None:
            fd, name = tempfile.mkstemp(prefix="_nccl_coll_", suffix=".arrow", dir=self.sink.part_dir)
            os.close(fd)
            self.spool_path = Path(name)
            self.spool = ipc.new_file(str(self.spool_path), batch.schema)
        self.spool.write_batch(batch)
        for col in (self.c_comm, self.c_groups, self.c_ts, self.c_line):
            del col[:n]
        self.flushed += n

    def _coll_batch(self, lo: int, hi: int) -> pa.RecordBatch:
        groups = self.c_groups[lo:hi]
        base = self.flushed + lo
        algo: list[str | None] = [None] * (hi - lo)
        proto: list[str | None] = [None] * (hi - lo)
        for pos in [p for p in self.c_tuned if base <= p < base + hi - lo]:
            algo[pos - base], proto[pos - base] = self.c_tuned.pop(pos)
        cols = list(zip(*groups, strict=True)) if groups else [()] * 8
        return pa.record_batch({
            "comm": pa.array(self.c_comm[lo:hi], pa.int32()),
            "name": pa.array(cols[_C_NAME], pa.binary()).cast(pa.string()),
            "seq": pa.array([int(x, 16) if len(x) <= 15 else None for x in cols[_C_OPCOUNT]], pa.int64()),
            "count": _ints(cols[_C_COUNT], pa.int64()),
            "datatype": _ints(cols[_C_DTYPE], pa.int32()),
            "redop": _ints(cols[_C_REDOP], pa.int64()),
            "root": _ints(cols[_C_ROOT], pa.int32()),
            "nranks": _ints(cols[_C_NRANKS], pa.int32()),
            "ts_ns": pa.array(self.c_ts[lo:hi], pa.int64()),
            "line": pa.array(self.c_line[lo:hi], pa.int64()),
            "algo": pa.array(algo, pa.string()),
            "proto": pa.array(proto, pa.string()),
        })

    def _coll_batches(self) -> Iterator[pa.RecordBatch]:
        if self.spool is not None:
            self.spool.close()
            self.spool = None
            assert self.spool_path is not None
            with ipc.open_file(str(self.spool_path)) as reader:
                for i in range(reader.num_record_batches):
                    yield reader.get_batch(i)
        if self.c_comm:
            yield self._coll_batch(0, len(self.c_comm))

    # -- communicators -------------------------------------------------------------------------

    def _new_comm(self, host: str, pid: int, ptr: bytes) -> _Comm:
        c = _Comm(idx=len(self.comms), host=host, pid=pid, ptr=ptr.decode("ascii", "replace"))
        self.comms.append(c)
        self.ptrs[(host, pid)][ptr] = c.idx
        return c

    def _comm_for(self, host: str, pid: int, ptr: bytes, *, rank: int | None, comm_id: str | None,
                  fresh: bool) -> _Comm:
        """The communicator an Init/summary line names; a new one when the pointer was reused."""
        idx = self.ptrs[(host, pid)].get(ptr)
        if idx is not None:
            c = self.comms[idx]
            reused = (c.ended is not None or (comm_id is not None and c.comm_id not in (None, comm_id))
                      or (rank is not None and c.rank not in (None, rank)) or (fresh and c.started))
            if not reused:
                return c
        return self._new_comm(host, pid, ptr)

    def _init(self, msg: bytes, host: str, pid: int, tid: int, dev: int | None, proc: _Proc) -> None:
        m = _INIT.search(msg)
        if m is None:
            self.stats.skip("malformed Init line")
            return
        api, ptr, rank, nranks, cdev, ndev, bus, _parent, color, key, cid, what = m.groups()
        rn = _rank_and_size(rank, nranks)
        if isinstance(rn, str):
            self.stats.skip(rn)
            return
        start = what == b"START"
        comm_id = "0x" + cid.decode().lower().rjust(16, "0") if cid else None
        c = self._comm_for(host, pid, ptr, rank=rn[0], comm_id=comm_id, fresh=start)
        c.rank, c.nranks, c.cuda_dev = rn[0], rn[1], _i(cdev)
        c.nvml_dev = _i(ndev) if ndev is not None else c.nvml_dev
        c.bus_id = _nccl.bus_id(_s(bus)) or c.bus_id
        c.comm_id = comm_id or c.comm_id
        c.api = _s(api) or c.api
        if color is not None:
            c.color, c.key = _i(color), _i(key)
        if c.init_line is None:
            c.init_line = self.lineno
        key_t = (host, pid, tid)
        if start:
            c.started = True
            proc.starts = True
            self.ctx_thread[key_t] = c.idx
            self.ctx_dev[(host, pid, c.cuda_dev)] = c.idx
        else:
            c.complete = True
            self._adopt_pending(c, key_t)
            self.ctx_thread.setdefault(key_t, c.idx)
            self.ctx_thread[key_t] = c.idx
            self.ctx_dev[(host, pid, c.cuda_dev)] = c.idx
        self.stats.store()

    def _summary(self, msg: bytes, host: str, pid: int, tid: int, dev: int | None) -> None:
        m = _SUMMARY.match(msg)
        if m is None:
            self.stats.skip("other NCCL line")
            return
        ptr, rank, nranks, nnodes, local_ranks, local_rank, _mnnvl = m.groups()
        rn = _rank_and_size(rank, nranks)
        if isinstance(rn, str):
            self.stats.skip(rn)
            return
        c = self._comm_for(host, pid, ptr, rank=rn[0], comm_id=None, fresh=False)
        c.rank, c.nranks = rn
        c.n_nodes, c.local_ranks, c.local_rank = _i(nnodes), _i(local_ranks), _i(local_rank)
        if c.cuda_dev is None and dev is not None:
            c.cuda_dev = dev
        self.ctx_thread[(host, pid, tid)] = c.idx
        if c.cuda_dev is not None:
            self.ctx_dev[(host, pid, c.cuda_dev)] = c.idx
        self.stats.store()

    def _end(self, msg: bytes, host: str, pid: int, tid: int, dev: int | None, ts: int | None) -> bool:
        m = _END.search(msg)
        if m is None:
            return False
        ptr, _rank, _nranks, cdev, _bus, what, phase = m.groups()
        idx = self.ptrs[(host, pid)].get(ptr)
        if idx is not None and phase == b"COMPLETE":
            self.comms[idx].ended = what.decode()
        self._message("INFO", msg, host, pid, tid, _i(cdev), ts, None, subsystem="lifecycle",
                      comm=idx)
        return True

    def _context(self, host: str, pid: int, tid: int, dev: int | None) -> _Comm | None:
        """The communicator a line that names none belongs to: the one being set up on this
        thread, else on this GPU."""
        idx = self.ctx_thread.get((host, pid, tid))
        if idx is None and dev is not None:
            idx = self.ctx_dev.get((host, pid, dev))
        return self.comms[idx] if idx is not None else None

    def _connected(self, msg: bytes, host: str, pid: int, tid: int, dev: int | None) -> None:
        c = self._context(host, pid, tid, dev)
        proc = self.procs[(host, pid)]
        if c is None or (c.complete and not proc.starts):
            self.pending[(host, pid, tid)].append(("connected", msg))
            self.stats.store()
            return
        self._apply_connected(c, msg)
        self.stats.store()

    def _apply_connected(self, c: _Comm, msg: bytes) -> None:
        if msg.startswith(b"Connected all rings"):
            c.phase = "tree"
            m = _PXN.match(msg)
            if m and m.group(1) is not None:
                c.pxn, c.gdr = m.group(1) != b"0", m.group(2) != b"0"
        elif msg.startswith(b"Connected all trees"):
            c.phase = "done"
        elif b"NVLS" in msg:
            c.nvls = True
        elif b"ollNet" in msg or b"ollnet" in msg:
            c.collnet = True

    # -- topology ------------------------------------------------------------------------------

    def _topology(self, msg: bytes, host: str, pid: int, tid: int, dev: int | None) -> None:
        try:
            item = _topology_item(msg)
        except ValueError:  # a number of more than 4,300 digits
            self.stats.skip(out_of_range("number"))
            return
        if item is None:
            self.stats.skip("other NCCL line")
            return
        kind, data = item
        if kind == "nvls_comm":
            c = self._context(host, pid, tid, dev)
            if c is not None:
                c.nvls = True
            self.stats.store()
            return
        c = self._context(host, pid, tid, dev)
        proc = self.procs[(host, pid)]
        if c is None or (c.complete and not proc.starts):
            # before 2.18.3 there is no Init START: a communicator's setup lines come before its
            # Init COMPLETE, which adopts them (leftovers go to the last one at the end, or, printed
            # after it by lazy connection setup, to their process's communicator: `_join_lazy`)
            data["_dev"], data["_line"] = dev, self.lineno
            self.pending[(host, pid, tid)].append((kind, data))
            self.stats.store()
            return
        me = data.get("me")
        if me is not None and c.rank is not None and me != c.rank:
            other = self._comm_with_rank(host, pid, dev, me)
            if other is None:
                self.stats.skip("topology line of an unknown communicator")
                return
            c = other
        self._apply(c, kind, data)
        self.stats.store()

    def _comm_with_rank(self, host: str, pid: int, dev: int | None, rank: int) -> _Comm | None:
        for c in reversed(self.comms):
            if c.host == host and c.pid == pid and c.rank == rank and (dev is None or c.cuda_dev in (None, dev)):
                return c
        return None

    def _adopt_pending(self, c: _Comm, key: tuple[str, int, int]) -> None:
        items = self.pending.pop(key, None)
        if not items:
            if c.cuda_dev is not None:
                for k in [k for k in self.pending if k[0] == c.host and k[1] == c.pid]:
                    items = self.pending.pop(k)
                    break
            if not items:
                return
        for kind, data in items:
            if kind == "connected":
                self._apply_connected(c, data)
                continue
            me = data.get("me")
            target = c
            if me is not None and c.rank is not None and me != c.rank:
                target = self._comm_with_rank(c.host, c.pid, c.cuda_dev, me) or c
            self._apply(target, kind, data)

    def _join_lazy(self, key: tuple[str, int, int], items: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
        """Lines of a thread that set up no communicator, printed after an Init COMPLETE: with lazy
        connection setup (NCCL 2.22+) a communicator connects its channels at its first collective,
        on another thread. Each joins the communicator of its process (and GPU) whose rank it
        names, the last one initialised before the line; what names none joins the one the others
        joined, if they all joined one. Returns the lines that found none."""
        host, pid, _tid = key
        proc = self.procs.get((host, pid))
        if proc is not None and proc.version is not None and _version_tuple(proc.version) < LAZY_CONNECT:
            return items
        left: list[tuple[str, Any]] = []
        joined: list[_Comm] = []
        by_rank: dict[int, list[_Comm]] = defaultdict(list)
        for c in self.comms:
            if c.host == host and c.pid == pid and c.complete and c.rank is not None:
                by_rank[c.rank].append(c)
        for kind, data in items:
            me = data.get("me") if isinstance(data, dict) else None
            if me is None:
                left.append((kind, data))
                continue
            line, dev = data.get("_line") or 0, data.get("_dev")
            found = [c for c in by_rank.get(me, ())
                     if (dev is None or c.cuda_dev in (None, dev)) and (c.init_line or 0) < line]
            if not found:
                left.append((kind, data))
                continue
            c = max(found, key=lambda c: c.init_line or 0)
            self._apply(c, kind, data)
            joined.append(c)
        if left and joined and all(c is joined[0] for c in joined):
            rest = [(kind, data) for kind, data in left if kind == "connected"]
            for _kind, data in rest:
                self._apply_connected(joined[0], data)
            left = [(kind, data) for kind, data in left if kind != "connected"]
        return left

    def _apply(self, c: _Comm, kind: str, d: dict[str, Any]) -> None:
        if kind == "ring_graph":
            c.ring_prev[d["channel"]], c.ring_next[d["channel"]] = d["prev"], d["next"]
        elif kind == "ring_order":
            order = d["order"]
            if not d["cut"] and len(set(order)) == len(order):
                c.ring_orders[d["channel"]] = order
            if c.rank is not None and c.rank in order and not d["cut"]:
                i = order.index(c.rank)
                c.ring_next[d["channel"]] = order[(i + 1) % len(order)]
                c.ring_prev[d["channel"]] = order[i - 1]
        elif kind == "trees":
            for ch, up, down in d["trees"]:
                c.tree_up[ch] = up
                c.tree_down[ch] = [x for x in down if x >= 0]
        elif kind == "tree_graph":
            c.tree_up[d["channel"]] = d["up"]
            c.tree_down[d["channel"]] = [x for x in d["down"] if x >= 0]
        elif kind == "nvls_trees":
            for i, (up, down) in enumerate(d["trees"]):
                c.nvls_up[i] = up
                c.nvls_down[i] = [x for x in down if x >= 0]
            c.nvls = True
        elif kind == "edge":
            self._edge(c, d)
        elif kind == "collnet":
            c.collnet = True
            key = (d["channel"], "collnet", d["direction"], None)
            c.edges.setdefault(key, {"transport": "COLLNET", "detail": d["detail"], "nic": d["nic"],
                                     "proxy": None, "conn": d["conn"]})

    def _edge(self, c: _Comm, d: dict[str, Any]) -> None:
        ch, peer, direction, conn = d["channel"], d["peer"], d["direction"], d["conn"]
        pattern = self._pattern(c, ch, peer, direction, conn)
        if pattern == "ring":
            key_dir = direction
        elif pattern == "tree":
            key_dir = "up" if c.tree_up.get(ch) == peer else "down"
        elif pattern == "nvls":
            key_dir = "up" if peer in c.nvls_up.values() else "down"
        else:
            key_dir = direction
        info = {"transport": d["transport"], "detail": d["detail"], "nic": d["nic"], "proxy": d["proxy"],
                "conn": conn, "side": direction}
        key = (ch, pattern, key_dir, peer)
        old = c.edges.get(key)
        if old is None or (old.get("side") == "recv" and direction == "send"):
            c.edges[key] = info

    def _pattern(self, c: _Comm, ch: int, peer: int, direction: str, conn: int | None) -> str:
        if conn is not None and conn > 0:
            return "p2p"
        ring_peer = c.ring_next.get(ch) if direction == "send" else c.ring_prev.get(ch)
        tree_peers = [c.tree_up.get(ch), *c.tree_down.get(ch, [])]
        if c.phase == "ring":
            # before 2.8 no "Connected all rings" line ends the ring phase: a channel's first send
            # (or receive) is its ring hop, later ones to other peers are its tree's
            if ring_peer is None or ring_peer == peer:
                (c.ring_next if direction == "send" else c.ring_prev)[ch] = peer
                return "ring"
            return "tree" if peer in tree_peers else "p2p"
        if c.phase == "tree":
            if peer in tree_peers or ring_peer != peer:
                return "tree"
            return "ring"
        if ring_peer == peer:
            return "ring"
        if peer in tree_peers:
            return "tree"
        if peer in c.nvls_up.values() or any(peer in v for v in c.nvls_down.values()):
            return "nvls"
        return "p2p"

    # -- messages ------------------------------------------------------------------------------

    def _message(self, level: str, msg: bytes, host: str, pid: int, tid: int, dev: int | None,
                 ts: int | None, loc: str | None, *, subsystem: str | None = None, comm: int | None = None) -> None:
        text = msg.decode("utf-8", "replace").strip()
        if subsystem is None:
            m = re.match(r"(NET|Proxy|proxy|NVLS|RAS|TUNER|PROFILER|Bootstrap|bootstrap)\b", text)
            subsystem = m.group(1).upper() if m else None
        self._keep_message({"rank": None, "host": host, "pid": pid, "tid": tid, "ts_ns": ts, "level": level,
                            "subsystem": subsystem, "message": text, "location": loc, "comm_rank": None,
                            "_proc": (host, pid, dev), "_comm": comm, "_rank_given": False})

    def _keep_message(self, row: dict[str, Any]) -> None:
        if len(self.messages) >= MAX_MESSAGES:
            self.stats.skip("log message beyond the limit")
            return
        row["line"] = self.lineno
        self.messages.append(row)
        self.stats.store()

    # -- the end -------------------------------------------------------------------------------

    def finish(self) -> NcclLogResult:
        try:
            return self._finish()
        finally:
            if self.spool is not None:
                self.spool.close()
            if self.spool_path is not None:
                self.spool_path.unlink(missing_ok=True)

    def _finish(self) -> NcclLogResult:
        stats = self.stats
        for key, items in list(self.pending.items()):
            c = self._context(*key, None)
            if c is None:
                items = self._join_lazy(key, items)
                if items:  # counted as stored when read, on the chance an Init line would adopt them
                    stats.stored -= len(items)
                    stats.read -= len(items)
                    stats.skip(NO_INIT_TOPOLOGY, len(items))
                    stats.warnings.append(f"{len(items)} topology line(s) of {key[0]}:{key[1]} came with no "
                                          "communicator Init line: not used")
                continue
            self.pending[key] = items
            self._adopt_pending(c, key)
        if self.times_out_of_range:
            stats.warnings.append(f"{self.times_out_of_range} line prefix(es) give a time outside +-2^62 ns "
                                  "(year 2116 and later, or before 1824): those lines are read as untimed")
        nb_rows = self.tables.close()
        stats.warnings.extend(self.tables.warnings)
        self._name_groups()
        world, global_of = self._world()
        rank_maps = self._rank_maps(global_of, world)
        n_coll, coll_ranks = self._write_collectives(global_of, rank_maps)
        ranks_rows = self._ranks_rows(global_of, world)
        self._write_groups(rank_maps, world)
        self._write_channels(global_of, rank_maps)
        self._write_messages(global_of)
        if ranks_rows:
            self.sink.add("ranks", _columns(ranks_rows))
        if nb_rows:
            self.sink.add("microbench", _columns(nb_rows))
        if stats.stored == 0 and not nb_rows:
            raise InputError(self.where, "no NCCL debug records (host:pid:tid [dev] NCCL INFO ...) found")
        ranks = sorted({r["rank"] for r in ranks_rows} | coll_ranks)
        versions = sorted({p.version for p in self.procs.values() if p.version}
                          | ({self.bare_version} if self.bare_version else set()))
        return NcclLogResult(stats=stats, ranks=ranks, collectives=n_coll,
                             groups=len({c.group for c in self.comms if c.group and c.rank is not None}),
                             ts_min_ns=self.ts_min, ts_max_ns=self.ts_max,
                             communicators=sum(1 for c in self.comms if c.rank is not None),
                             processes=len(self.procs), nccl_versions=versions, microbench_rows=len(nb_rows),
                             unranked_collectives=self.unranked)

    def _name_groups(self) -> None:
        """group = commId; communicators from logs without one (before 2.16) are joined by their
        size and creation order in each process, split by host when ranks collide."""
        ordinal: Counter[tuple[Any, ...]] = Counter()
        synth: dict[str, list[_Comm]] = defaultdict(list)
        for c in self.comms:
            if c.rank is None:
                continue
            if c.comm_id is not None:
                c.group = c.comm_id
                continue
            k = (c.proc_dev, c.nranks)
            name = f"nranks{c.nranks}#{ordinal[k]}"
            ordinal[k] += 1
            synth[name].append(c)
        for name, comms in synth.items():
            ranks = Counter(c.rank for c in comms)
            if max(ranks.values()) == 1:
                for c in comms:
                    c.group = name
                continue
            for c in comms:
                c.group = f"{name}@{c.host}"
        if synth:
            self.stats.warnings.append(
                "communicators without a commId (NCCL before 2.16): joined across processes by size and "
                "creation order (" + ", ".join(sorted(synth)[:4]) + ("..." if len(synth) > 4 else "") + ")")

    def _world(self) -> tuple[str | None, dict[tuple[str, int, int | None], int]]:
        """The world communicator (the largest; ties: the most members here, then the first seen)
        and the global rank of every process-GPU in it."""
        members: dict[str, dict[int, tuple[str, int, int | None]]] = defaultdict(dict)
        size: dict[str, int] = {}
        first: dict[str, int] = {}
        for c in self.comms:
            if c.group is None or c.rank is None:
                continue
            members[c.group][c.rank] = c.proc_dev
            size[c.group] = max(size.get(c.group, 0), c.nranks or 0)
            first.setdefault(c.group, c.idx)
        if not members:
            return None, {}
        world = min(members, key=lambda g: (-size[g], -len(members[g]), first[g]))
        global_of = {pd: r for r, pd in members[world].items()}
        outside = {c.proc_dev for c in self.comms if c.rank is not None and c.proc_dev not in global_of}
        if outside:
            self.stats.warnings.append(
                f"{len(outside)} process GPU(s) are not in the world communicator {world} ({size[world]} ranks): "
                "they have no global rank (their collectives go to unranked_collectives; their channels are not kept)")
        return world, global_of

    def _rank_maps(self, global_of: dict[tuple[str, int, int | None], int], world: str | None
                   ) -> dict[str, list[int | None]]:
        maps: dict[str, list[int | None]] = {}
        budget = MAX_RANK_MAP_ENTRIES
        over: set[str] = set()
        world_len = -1
        for c in self.comms:
            if c.group is None or c.rank is None or not c.nranks or c.group in over:
                continue
            cur = maps.get(c.group, [])
            grow = c.nranks - len(cur)
            if grow > 0:
                if grow > budget:
                    over.add(c.group)
                    maps.pop(c.group, None)
                    continue
                budget -= grow
                cur.extend([None] * grow)
                maps[c.group] = cur
            if c.group == world:
                if world_len != len(cur):  # once per size, not once per communicator of the world
                    maps[c.group] = list(range(len(cur)))
                    world_len = len(cur)
                continue
            g = global_of.get(c.proc_dev)
            if g is not None and c.rank < len(cur):
                cur[c.rank] = g
        if over:
            self.stats.warnings.append(
                f"{len(over)} communicator(s) without a rank map: the communicators' sizes add up to more "
                f"than {MAX_RANK_MAP_ENTRIES:,} ranks")
        return maps

    def _write_collectives(self, global_of: dict[tuple[str, int, int | None], int],
                           rank_maps: dict[str, list[int | None]]) -> tuple[int, set[int]]:
        n_comm = len(self.comms)
        comm_rank = np.full(n_comm + 1, -1, np.int64)
        global_rank = np.full(n_comm + 1, -1, np.int64)
        group_names = sorted({c.group for c in self.comms if c.group is not None})
        group_index = {g: i for i, g in enumerate(group_names)}
        comm_group = np.full(n_comm + 1, -1, np.int32)
        reason: list[str] = [""] * (n_comm + 1)
        for c in self.comms:
            if c.rank is None or c.group is None:
                reason[c.idx] = NO_INIT
                continue
            comm_rank[c.idx] = c.rank
            comm_group[c.idx] = group_index[c.group]
            g = global_of.get(c.proc_dev)
            if g is None:
                reason[c.idx] = OUTSIDE_WORLD
                continue
            global_rank[c.idx] = g
        maps = {group_index[g]: np.array([-1 if r is None else r for r in rm], np.int64)
                for g, rm in rank_maps.items() if g in group_index}
        ordinal: Counter[int] = Counter()
        total = 0
        ranks: set[int] = set()
        unranked: Counter[str] = Counter()
        for batch in self._coll_batches():
            idx = batch.column("comm").to_numpy()
            keep = global_rank[idx] >= 0
            if not keep.all():
                lost = batch.filter(pa.array(~keep))
                lost_idx = idx[~keep]
                why = [reason[int(i)] for i in lost_idx]
                unranked.update(why)
                self.sink.add("unranked_collectives", self._unranked_columns(
                    lost, lost_idx, why, comm_rank, comm_group, group_names))
                batch = batch.filter(pa.array(keep))
                idx = idx[keep]
            if batch.num_rows == 0:
                continue
            grank = global_rank[idx]
            self.sink.add("collectives", _coll_columns(batch, idx, grank, comm_rank, comm_group, group_names,
                                                       maps, ordinal))
            total += batch.num_rows
            ranks.update(int(r) for r in np.unique(grank))
        self.unranked = sum(unranked.values())
        if unranked:
            why = ", ".join(f"{reason} {n}" for reason, n in sorted(unranked.items()))
            self.stats.warnings.append(
                f"{self.unranked} COLL line(s) have no global rank ({why}): kept in the unranked_collectives "
                "table (comm, nranks, op, bytes, opCount), not matched or replayed")
        return total, ranks

    def _unranked_columns(self, batch: pa.RecordBatch, idx: np.ndarray, why: list[str], comm_rank: np.ndarray,
                          comm_group: np.ndarray, group_names: list[str]) -> dict[str, Any]:
        """The `unranked_collectives` columns of COLL rows whose global rank is unknown: what the
        line gives (the bytes through the same rules as ranked rows), the global rank null."""
        n = batch.num_rows
        cols = _coll_columns(batch, idx, np.full(n, -1, np.int64), comm_rank, comm_group, group_names, {},
                             Counter())
        local = comm_rank[idx]
        comms = [self.comms[int(i)] for i in idx]
        out = {k: cols[k] for k in ("group", "seq", "op", "name", "dtype", "in_bytes", "out_bytes", "nranks", "root",
                                    "peer_local", "ts_ns", "algo", "proto", "source", "line")}
        return {"rank": pa.nulls(n, pa.int32()), "rank_reason": pa.array(why, pa.string()),
                "comm": pa.array([c.ptr for c in comms], pa.string()),
                "host": pa.array([c.host for c in comms], pa.string()),
                "pid": pa.array([c.pid for c in comms], pa.int64()),
                "comm_rank": pa.array(local.astype(np.int32), mask=local < 0), **out}

    def _ranks_rows(self, global_of: dict[tuple[str, int, int | None], int], world: str | None
                    ) -> list[dict[str, Any]]:
        world_size = next((c.nranks for c in self.comms if c.group == world), None)
        rows: dict[int, dict[str, Any]] = {}
        for c in self.comms:
            g = global_of.get(c.proc_dev)
            if g is None or c.rank is None:
                continue
            proc = self.procs.get((c.host, c.pid))
            device = c.cuda_dev if c.cuda_dev is not None and in_range(c.cuda_dev, "int32") else None
            row = rows.setdefault(g, {
                "rank": g, "world_size": world_size, "host": c.host, "pid": c.pid, "local_device": device,
                "source_file": self.where, "source_format": NAME, "backend": "nccl",
                "nccl_version": (proc.version if proc else None) or self.bare_version, "bus_id": None,
                "nvml_device": None, "local_rank": None, "n_nodes": None, "net": proc.network if proc else None,
                "net_devices": _net_devices(proc), "torchrun_rank": proc.torchrun_rank if proc else None,
            })
            if c.group == world or row["bus_id"] is None:
                row["bus_id"] = c.bus_id or row["bus_id"]
                row["nvml_device"] = c.nvml_dev if c.nvml_dev is not None else row["nvml_device"]
            if c.group == world:
                row["local_rank"], row["n_nodes"] = c.local_rank, c.n_nodes
        return [rows[r] for r in sorted(rows)]

    def _write_groups(self, rank_maps: dict[str, list[int | None]], world: str | None) -> None:
        rows: dict[str, dict[str, Any]] = {}
        for c in self.comms:
            if c.group is None or c.rank is None:
                continue
            rm = rank_maps.get(c.group, [])
            row = rows.setdefault(c.group, {
                "group": c.group, "desc": _desc(c), "backend": "nccl", "ranks": None, "size": c.nranks,
                "dims": [], "ranks_complete": False, "rank_map": rm, "world": c.group == world,
                "n_nodes": c.n_nodes, "local_ranks": c.local_ranks, "pxn": c.pxn, "gdr": c.gdr,
                "nvls": c.nvls or bool(c.nvls_channels), "collnet": c.collnet, "n_channels": c.n_channels,
                "p2p_channels": c.p2p_channels, "ring_orders": None,
            })
            if c.ring_orders and row["ring_orders"] is None:
                row["ring_orders"] = _ring_orders(c.ring_orders, c.nranks)
            for k in ("n_nodes", "local_ranks", "n_channels", "p2p_channels"):
                v = getattr(c, k)
                if v is not None and (row[k] is None or v > row[k]):
                    row[k] = v
            for k in ("pxn", "gdr"):
                v = getattr(c, k)
                if v is not None:
                    row[k] = bool(row[k]) or v
            row["nvls"] = row["nvls"] or c.nvls or bool(c.nvls_channels)
            row["collnet"] = row["collnet"] or c.collnet
        for row in rows.values():
            known = [r for r in row["rank_map"] if r is not None]
            row["ranks"] = sorted(known)
            row["ranks_complete"] = bool(row["rank_map"]) and len(known) == len(row["rank_map"])
        if rows:
            data = _columns(list(rows.values()))
            data["rank_map"] = pa.array(data["rank_map"], pa.list_(pa.int32()))
            data["ring_orders"] = pa.array(data["ring_orders"], pa.list_(pa.list_(pa.int32())))
            self.sink.add("groups", data)

    def _write_channels(self, global_of: dict[tuple[str, int, int | None], int],
                        rank_maps: dict[str, list[int | None]]) -> None:
        rows: list[dict[str, Any]] = []
        for c in self.comms:
            g = global_of.get(c.proc_dev)
            if c.rank is None or c.group is None:
                continue
            if g is None:
                if c.edges or c.ring_next or c.tree_up:
                    self.stats.warnings.append(f"channels of {c.host}:{c.pid} GPU {c.cuda_dev} on {c.group} "
                                               "not kept: the process GPU has no global rank")
                continue
            rm = rank_maps.get(c.group, [])

            def glob(local: int | None, rm: list[int | None] = rm) -> int | None:
                return rm[local] if local is not None and 0 <= local < len(rm) else None

            proc = self.procs.get((c.host, c.pid))
            edges = dict(c.edges)
            for ch, nxt in c.ring_next.items():
                edges.setdefault((ch, "ring", "send", nxt), {})
            for ch, up in c.tree_up.items():
                if up >= 0:
                    edges.setdefault((ch, "tree", "up", up), {})
                for d in c.tree_down.get(ch, []):
                    edges.setdefault((ch, "tree", "down", d), {})
            for i, up in c.nvls_up.items():
                if up >= 0:
                    edges.setdefault((i, "nvls", "up", up), {})
                for d in c.nvls_down.get(i, []):
                    edges.setdefault((i, "nvls", "down", d), {})
            # a connection NCCL already made (ring send to X, say) is reused, not printed again, when a
            # tree or another pattern needs the same peer on the same channel
            known: dict[tuple[int | None, int | None], dict[str, Any]] = {}
            for (ch, _p, _d, peer), info in c.edges.items():
                if info.get("transport") and (info.get("conn") or 0) == 0:
                    cur = known.get((ch, peer))
                    if cur is None or (cur.get("side") == "recv" and info.get("side") == "send"):
                        known[(ch, peer)] = info
            for key, info in list(edges.items()):
                if not info.get("transport") and (key[0], key[3]) in known:
                    edges[key] = {**known[(key[0], key[3])], "inherited": True}
            for (ch, pattern, direction, peer), info in sorted(
                    edges.items(), key=lambda kv: (kv[0][0] if kv[0][0] is not None else -1, kv[0][1], kv[0][2],
                                                   kv[0][3] if kv[0][3] is not None else -1)):
                nic = info.get("nic")
                if nic is not None and proc is not None:
                    nic = _nic_name(proc, nic)
                rows.append({
                    "group": c.group, "rank": g, "channel": ch, "pattern": pattern, "peer_rank": glob(peer),
                    "direction": direction, "transport": info.get("transport"), "detail": info.get("detail"),
                    "nic": nic, "proxy_rank": glob(info.get("proxy")), "comm_rank": c.rank,
                    "peer_comm_rank": peer, "proxy_comm_rank": info.get("proxy"), "conn_index": info.get("conn"),
                    "host": c.host,
                })
        ok = [r for r in rows if not any(type(v) is int and not _I32[0] <= v <= _I32[1] for v in r.values())]
        if len(ok) < len(rows):
            self.stats.warnings.append(f"{len(rows) - len(ok)} channel edge(s) with a channel, rank or connection "
                                       "number out of range dropped")
        if ok:
            self.sink.add("channels", _columns(ok))

    def _write_messages(self, global_of: dict[tuple[str, int, int | None], int]) -> None:
        if not self.messages:
            return
        by_proc: dict[tuple[str, int], list[int]] = defaultdict(list)
        for (host, pid, _dev), g in global_of.items():
            by_proc[(host, pid)].append(g)
        rows = []
        for m in self.messages:
            key = m.pop("_proc")
            cidx = m.pop("_comm", None)
            given = m.pop("_rank_given")
            if not given and key is not None:
                host, pid, dev = key
                g = global_of.get((host, pid, dev))
                if g is None and cidx is not None:
                    g = global_of.get(self.comms[cidx].proc_dev)
                    m["comm_rank"] = self.comms[cidx].rank
                if g is None and len(by_proc.get((host, pid), [])) == 1:
                    g = by_proc[(host, pid)][0]
                m["rank"] = g
            m["source"] = NAME
            rows.append(m)
        self.sink.add("log_messages", _columns(rows))


_OP_CODES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "send", "recv",
             "gather", "scatter", "other")
_ROOTED = {"broadcast", "reduce", "gather", "scatter"}
_REDUCING = {"all_reduce", "reduce", "reduce_scatter"}
_DT_NAMES = [_nccl.DATATYPES[k][0] for k in sorted(_nccl.DATATYPES)]
_DT_WIDTH = np.array([_nccl.DATATYPES[k][1] for k in sorted(_nccl.DATATYPES)], np.int64)
_REDOP_NAMES = [*(_nccl.REDOPS[k] for k in sorted(_nccl.REDOPS)), "premul_sum"]


def _ints(values: tuple[bytes, ...], typ: pa.DataType) -> pa.Array:
    """Decimal byte strings as integers; a value that does not fit becomes null."""
    arr = pa.array(values, pa.binary()).cast(pa.string())
    try:
        return arr.cast(typ)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        bits = typ.bit_width - 1
        out = []
        for v in values:
            n = _i(v)
            out.append(n if n is not None and -(2**bits) <= n < 2**bits else None)
        return pa.array(out, typ)


def _coll_columns(batch: pa.RecordBatch, idx: np.ndarray, grank: np.ndarray, comm_rank: np.ndarray,
                  comm_group: np.ndarray, group_names: list[str], maps: dict[int, np.ndarray],
                  ordinal: Counter[int]) -> dict[str, Any]:
    """The `collectives` columns of a spooled batch, computed column-wise."""
    n = batch.num_rows
    names = batch.column("name")
    if not pa.types.is_dictionary(names.type):
        names = names.dictionary_encode()
    name_ops = np.array([_OP_CODES.index(_nccl.op_of(x)) for x in names.dictionary.to_pylist()] or [0], np.int32)
    op = name_ops[names.indices.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)]
    dt = batch.column("datatype").fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    known_dt = (dt >= 0) & (dt < len(_DT_WIDTH))
    width = np.where(known_dt, _DT_WIDTH[np.clip(dt, 0, len(_DT_WIDTH) - 1)], 0)
    count_col = batch.column("count")
    count = count_col.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    nranks = batch.column("nranks").fill_null(1).to_numpy(zero_copy_only=False).astype(np.int64)
    in_k = np.ones(n, np.int64)
    out_k = np.ones(n, np.int64)
    for name, (i_n, o_n) in _nccl.TIMES_NRANKS.items():
        mask = op == _OP_CODES.index(name)
        if i_n:
            in_k[mask] = nranks[mask]
        if o_n:
            out_k[mask] = nranks[mask]
    valid = known_dt & count_col.is_valid().to_numpy(zero_copy_only=False) & (count >= 0)
    base = count * width
    # bytes beyond the size range are nulls, never int64 wraps (a count near 2**63 times 8 bytes)
    hi = RANGES["size"][1]
    in_bytes = pa.array(base * in_k, pa.int64(), mask=~(valid & (count <= hi // np.maximum(width * in_k, 1))))
    out_bytes = pa.array(base * out_k, pa.int64(), mask=~(valid & (count <= hi // np.maximum(width * out_k, 1))))
    dtype = pa.DictionaryArray.from_arrays(pa.array(np.clip(dt, 0, len(_DT_NAMES) - 1).astype(np.int32),
                                                    mask=~known_dt), pa.array(_DT_NAMES))
    gidx = comm_group[idx]
    group = pa.DictionaryArray.from_arrays(pa.array(gidx.astype(np.int32), mask=gidx < 0),
                                           pa.array(group_names or [""], pa.string()))
    root = batch.column("root").fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    p2p = (op == _OP_CODES.index("send")) | (op == _OP_CODES.index("recv"))
    peer = np.full(n, -1, np.int64)
    for g in np.unique(gidx[p2p]):
        rm = maps.get(int(g))
        if rm is None or not len(rm):
            continue
        sel = p2p & (gidx == g) & (root >= 0) & (root < len(rm))
        peer[sel] = rm[root[sel]]
    rooted = np.isin(op, [_OP_CODES.index(x) for x in _ROOTED])
    reducing = np.isin(op, [_OP_CODES.index(x) for x in _REDUCING])
    redop = batch.column("redop").fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    redop_idx = np.where(redop >= len(_REDOP_NAMES) - 1, len(_REDOP_NAMES) - 1, redop)
    redop_arr = pa.DictionaryArray.from_arrays(pa.array(np.clip(redop_idx, 0, None).astype(np.int32),
                                                        mask=~reducing | (redop < 0)), pa.array(_REDOP_NAMES))
    coll_id = np.empty(n, np.int64)
    for r in np.unique(grank):
        sel = grank == r
        k = int(sel.sum())
        start = ordinal[int(r)]
        coll_id[sel] = int(r) * 2**32 + COLL_ID_OFFSET + start + np.arange(k, dtype=np.int64)
        ordinal[int(r)] = start + k
    op_arr = pa.DictionaryArray.from_arrays(pa.array(op), pa.array(list(_OP_CODES)))
    return {
        "coll_id": pa.array(coll_id), "rank": pa.array(grank.astype(np.int32)), "group": group,
        "seq": batch.column("seq"), "op": op_arr, "dtype": dtype, "in_bytes": in_bytes, "out_bytes": out_bytes,
        "nranks": batch.column("nranks"), "peer": pa.array(peer.astype(np.int32), mask=peer < 0),
        "ts_ns": batch.column("ts_ns"), "state": pa.DictionaryArray.from_arrays(
            pa.array(np.zeros(n, np.int32)), pa.array(["unknown"])),
        "algo": batch.column("algo"), "proto": batch.column("proto"),
        "source": pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array([NAME])),
        "seq_explicit": pa.array(np.ones(n, bool)), "name": names,
        "comm_rank": pa.array(comm_rank[idx].astype(np.int32)),
        "peer_local": pa.array(root.astype(np.int32), mask=~p2p | (root < 0)),
        "root": pa.array(root.astype(np.int32), mask=~rooted | (root < 0)),
        "redop": redop_arr, "line": batch.column("line"),
    }



def _ring_orders(orders: dict[int, list[int]], nranks: int | None) -> list[list[int]] | None:
    """The rings rank 0 printed (`Channel 00/02 :  0 1 ...`), one per channel from 0 on, when they
    are whole: every channel up to the last printed, each a permutation of the communicator."""
    n = len(orders)
    if min(orders) != 0 or max(orders) != n - 1:  # channel numbers are distinct: 0..n-1 each once
        return None
    out = [orders[c] for c in range(n)]
    size = nranks or len(out[0])
    if any(len(o) != size or sorted(o) != list(range(size)) for o in out):
        return None
    return out


def _desc(c: _Comm) -> str:
    api = c.api or "ncclCommInitRank"
    if c.color is not None:
        return f"{api} color {c.color} key {c.key}"
    return api


def _net_devices(proc: _Proc | None) -> list[str] | None:
    if proc is None or not proc.net_devices:
        return None
    out = []
    for name, devs in sorted(proc.net_devices.items()):
        out.extend(f"{name}/{i} {devs[i]}" for i in sorted(devs))
    return out


def _nic_name(proc: _Proc, nic: str) -> str:
    """`IB/0` as the device NCCL listed for it (`mlx5_0:1`) when the log printed the list."""
    name, _, idx = nic.rpartition("/")
    devs = proc.net_devices.get(name)
    if devs and idx.isdigit() and _i(idx.encode()) in devs:
        return devs[_i(idx.encode())]  # type: ignore[index]
    return nic


def _columns(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    names: list[str] = []
    for r in rows:
        for k in r:
            if k not in names:
                names.append(k)
    return {k: [r.get(k) for r in rows] for k in names}


def _topology_item(msg: bytes) -> tuple[str, dict[str, Any]] | None:
    """A topology line as (kind, facts): comm-local ranks, as printed."""
    if msg.startswith(b"Trees"):
        trees = []
        for m in _TREES_NEW.finditer(msg):
            g = m.groups()
            trees.append((int(g[0]), int(g[5]), [int(g[1]), int(g[2]), int(g[3])], int(g[4])))
        if not trees:
            for m in _TREES_OLD.finditer(msg):
                g = m.groups()
                trees.append((int(g[0]), int(g[1]), [int(g[3]), int(g[4]), int(g[5])], int(g[2])))
        if not trees:
            return None
        mes = {t[3] for t in trees}
        return "trees", {"trees": [(ch, up, down) for ch, up, down, _ in trees],
                         "me": mes.pop() if len(mes) == 1 else None}
    if msg.startswith(b"NVLS Trees"):
        trees = []
        for m in _NVLS_TREES.finditer(msg):
            a, b, c, me, up = m.groups()
            down = [int(a), int(b)] + ([int(c)] if c is not None else [])
            trees.append((int(up), down, int(me)))
        if not trees:
            return None
        return "nvls_trees", {"trees": [(up, down) for up, down, _ in trees], "me": trees[0][2]}
    if msg.startswith(b"NVLS comm "):
        return "nvls_comm", {}
    m = _TRANSPORT.match(msg)
    if m is not None:
        ch, conn, a, _, b, _, side, via = m.groups()
        direction = "recv" if side == b"receive" else "send"
        me, peer = (int(b), int(a)) if direction == "recv" else (int(a), int(b))
        transport, detail, nic, proxy = _via(via)
        if transport is None:
            return None
        return "edge", {"channel": int(ch), "conn": _i(conn), "me": me, "peer": peer, "direction": direction,
                        "transport": transport, "detail": detail, "nic": nic, "proxy": proxy}
    m = _COLLNET.match(msg)
    if m is not None:
        ch, conn, me, side, via = m.groups()
        text = via.decode("utf-8", "replace")
        parts = text.split("/")
        return "collnet", {"channel": int(ch), "conn": _i(conn), "me": int(me),
                           "direction": "recv" if side == b"receive" else "send", "detail": text[len("COLLNET/"):],
                           "nic": "/".join(parts[1:3]) if len(parts) >= 3 else None}
    m = _RING_ORDER.match(msg)
    if m is not None:
        order = [int(x) for x in m.group(3).split()]
        return "ring_order", {"channel": int(m.group(1)), "order": order, "cut": m.group(4) is not None,
                              "me": 0}
    m = _RING_GRAPH.match(msg)
    if m is not None:
        ch, prev, me, nxt = (int(x) for x in m.groups())
        return "ring_graph", {"channel": ch, "prev": prev, "me": me, "next": nxt}
    m = _TREE_GRAPH.match(msg)
    if m is not None:
        ch, up, me, d0, d1, d2 = (int(x) for x in m.groups())
        return "tree_graph", {"channel": ch, "up": up, "me": me, "down": [d0, d1, d2]}
    return None


def _via(via: bytes) -> tuple[str | None, str | None, str | None, int | None]:
    """(transport, detail, nic, proxy rank) of a transport line's `via ...` text."""
    text = via.decode("utf-8", "replace").strip()
    if text.startswith("NET/"):
        m = _NET_VIA.match(via.strip())
        if m is None:
            return "NET", text[4:], None, None
        name, dev, proxy, _flags = m.groups()
        return "NET", text[4:], f"{name.decode('utf-8', 'replace')}/{int(dev)}", _i(proxy)
    if text.startswith("P2P/"):
        return "P2P", text, None, None
    if text.startswith("SHM/") or text.startswith("direct shared memory"):
        return "SHM", text, None, None
    if text.startswith("COLLNET/"):
        return "COLLNET", text[len("COLLNET/"):], None, None
    if text.startswith("NVLS"):
        return "NVLS", text, None, None
    return None, None, None, None


FORMAT = Format(name=NAME, description="NCCL logs", version=PARSER_VERSION, parse=parse,
                sniffs=(lambda head: not head.json_object and sniff(head.data),),
                priority=1, maps_peers=True, nccl_facts=True)
