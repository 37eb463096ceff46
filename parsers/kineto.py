"""Streaming parser for PyTorch-profiler (Kineto) Chrome traces, every era from 2021 to 2026.

Pass 1 streams `traceEvents` in batches (see `_stream.ChromeTraceReader`; gunzip runs on a
background thread), decodes each batch by phase (only X events are materialised) and turns it into
columns, held in memory up to SPOOL_MEMORY bytes and spooled to an Arrow IPC file next to the
source's parts beyond that; only small things are kept besides (launch correlations, step
windows, communication markers). Pass 2 resolves
what needs the whole file (rank, base time, steps, collective ids) and writes the events.
"""

from __future__ import annotations

import gc
import os
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, ClassVar, Union

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from tracekit._limits import RANGES, checked_int, out_of_range, world_size
from tracekit.errors import InputError
from tracekit.parsers import _stream
from tracekit.parsers._kineto_calls import (
    MARK_COMM,
    MARK_CORR,
    MARK_EXT,
    MARK_GPU,
    MarkerStore,
    as_int,
    build_collectives,
    groups_from_config,
    kernel_algo,
    kernel_op,
    op_from_name,
    torch_dtype,
)
from tracekit.parsers._stream import ByteStream, ChromeFormatError, ChromeTraceReader
from tracekit.parsers.registry import Format, Head
from tracekit.parsers.vocabulary import COLLECTIVE_OPS, DTYPE_BYTES, KERNEL_OPS, dtype_bytes, parse_rank_list
from tracekit.store import ParseResult, SourceSink, SourceStats

__all__ = [
    "COLLECTIVE_OPS", "DEFAULT_COMM_PATTERNS", "DTYPE_BYTES", "FORMAT", "KERNEL_OPS", "NAME", "PARSER_VERSION",
    "Args", "Event", "KinetoResult", "compile_patterns", "dtype_bytes", "kernel_algo", "kernel_op", "op_from_name",
    "parse", "parse_rank_list", "rank_from_name", "torch_dtype",
]

NAME = "kineto"
PARSER_VERSION = "5"  # 5: a key given twice in an event, first with a refused type, is read (was invalid)

#: Kernel-name regexes (searched anywhere in the name) that mark a GPU kernel as communication.
DEFAULT_COMM_PATTERNS: tuple[str, ...] = (
    r"\bnccl(?:Dev)?Kernel_",
    r"\bnccl(?:AllReduce|AllGather|ReduceScatter|Broadcast|Reduce|SendRecv)\w*Kernel_",
    r"\brccl",
    r"(?:dpsk::ep|deep_ep)::(?!(?:\w+::)*get_dispatch_layout\b)",  # DeepEP; its layout kernel is local compute
    r"multimem_all_reduce",
    r"cross_device_reduce",
)

_RAW0 = msgspec.Raw(b"")


class Args(msgspec.Struct, gc=False):
    """The event args tracekit reads; every other key is skipped by the decoder."""

    external_id: int | float | str | None = msgspec.field(name="External id", default=None)
    correlation: int | float | str | None = None
    device: int | float | str | None = None
    wait_on_stream: int | float | str | None = None
    wait_corr: int | float | str | None = msgspec.field(
        name="wait_on_cuda_event_record_corr_id", default=None)
    coll: msgspec.Raw = msgspec.field(name="Collective name", default=_RAW0)
    in_nelems: msgspec.Raw = msgspec.field(name="In msg nelems", default=_RAW0)
    out_nelems: msgspec.Raw = msgspec.field(name="Out msg nelems", default=_RAW0)
    in_size: msgspec.Raw = msgspec.field(name="In msg size", default=_RAW0)
    out_size: msgspec.Raw = msgspec.field(name="Out msg size", default=_RAW0)
    group_size: msgspec.Raw = msgspec.field(name="Group size", default=_RAW0)
    dtype: msgspec.Raw = msgspec.field(name="dtype", default=_RAW0)
    in_split: msgspec.Raw = msgspec.field(name="In split size", default=_RAW0)
    out_split: msgspec.Raw = msgspec.field(name="Out split size", default=_RAW0)
    pg_name: msgspec.Raw = msgspec.field(name="Process Group Name", default=_RAW0)
    pg_desc: msgspec.Raw = msgspec.field(name="Process Group Description", default=_RAW0)
    pg_ranks: msgspec.Raw = msgspec.field(name="Process Group Ranks", default=_RAW0)
    pg_id: msgspec.Raw = msgspec.field(name="Process Group ID", default=_RAW0)
    src_rank: msgspec.Raw = msgspec.field(name="Src Rank", default=_RAW0)
    dst_rank: msgspec.Raw = msgspec.field(name="Dst Rank", default=_RAW0)
    seq: msgspec.Raw = msgspec.field(name="Seq", default=_RAW0)
    comms_id: msgspec.Raw = msgspec.field(name="Comms Id", default=_RAW0)
    input_dims: msgspec.Raw = msgspec.field(name="Input Dims", default=_RAW0)
    input_type: msgspec.Raw = msgspec.field(name="Input type", default=_RAW0)
    concrete: msgspec.Raw = msgspec.field(name="Concrete Inputs", default=_RAW0)


class Event(msgspec.Struct, gc=False):
    """One Chrome-trace event as the decoder sees it (unknown keys are skipped)."""

    ph: str = ""
    cat: str | None = None
    name: str = ""
    pid: int | float | str | None = None
    tid: int | float | str | None = None
    ts: msgspec.Raw = _RAW0
    dur: msgspec.Raw = _RAW0
    args: Args | None = None


EVENT_DECODER = msgspec.json.Decoder(list[Event])

_CAT_KIND = {
    "kernel": "compute", "Kernel": "compute",
    "gpu_memcpy": "memcpy", "Memcpy": "memcpy",
    "gpu_memset": "memset", "Memset": "memset",
    "cpu_op": "cpu_op", "Operator": "cpu_op", "python_function": "cpu_op",
    "cuda_runtime": "runtime", "cuda_driver": "runtime", "Runtime": "runtime", "Driver": "runtime",
    "overhead": "runtime", "mtia_runtime": "runtime", "xpu_runtime": "runtime",
    "xpu_driver": "runtime", "privateuse1_runtime": "runtime", "privateuse1_driver": "runtime",
    "user_annotation": "annotation", "gpu_user_annotation": "annotation", "Trace": "annotation",
    "cuda_profiler_range": "annotation", "mtia_ccp_events": "compute",
    "cuda_sync": "sync", "cuda_event": "sync",
    "collective_comm": "comm",
}
_GPU_CATS = frozenset({
    "kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset", "gpu_user_annotation",
    "cuda_sync", "cuda_event", "mtia_ccp_events", "collective_comm",
})
_RUNTIME_CATS = frozenset({"cuda_runtime", "Runtime", "cuda_driver", "Driver", "xpu_runtime",
                           "privateuse1_runtime", "mtia_runtime"})
_PHASE_REASON = {
    "M": "metadata", "s": "flow", "t": "flow", "f": "flow", "i": "instant", "I": "instant",
    "C": "counter", "b": "async", "e": "async", "n": "async", "B": "begin_end", "E": "begin_end",
    "O": "object", "N": "object", "D": "object", "P": "sample", "R": "mark", "c": "clock_sync",
}


class XEvent(msgspec.Struct, tag_field="ph", tag="X", gc=False):
    """A complete ("X") event: the fields of `Event`, selected by its `ph` tag."""

    ph: ClassVar[str] = "X"
    cat: str | None = None
    name: str = ""
    pid: int | float | str | None = None
    tid: int | float | str | None = None
    ts: msgspec.Raw = _RAW0
    dur: msgspec.Raw = _RAW0
    args: Args | None = None


def _skipped_event(ph: str) -> type:
    """An event of a phase tracekit only counts: decoded without materialising any field."""
    return msgspec.defstruct(f"Skipped_{ph}", [], tag_field="ph", tag=ph, gc=False,
                             namespace={"ph": ph}, module=__name__)


_SKIPPED_EVENTS = tuple(_skipped_event(ph) for ph in _PHASE_REASON)
#: Decodes a batch by phase: X events in full, the other known phases as empty structs (they
#: are only counted). A batch it rejects (an unknown or missing `ph`, a wrong type in an X
#: event) is decoded again with EVENT_DECODER, so such batches are handled as before.
TAGGED_DECODER = msgspec.json.Decoder(list[Union[(XEvent, *_SKIPPED_EVENTS)]])


def decode_events(buf: bytes) -> list[Any]:
    """One batch (a JSON array of events) as XEvent / Skipped_* / Event structs."""
    try:
        return TAGGED_DECODER.decode(buf)
    except msgspec.ValidationError:
        return EVENT_DECODER.decode(buf)

_STEP = re.compile(r"^ProfilerStep#(\d{1,12})$")
_STEP_MAX = RANGES["count"][1]
_RANK_IN_NAME = re.compile(r"(?:^|[^a-z0-9])(?:rank|worker)[-_]?(\d+)(?![0-9])", re.I)
_TB_NAME = re.compile(r"^(?P<host>.+)_(?P<pid>\d+)\.\d+\.pt\.trace\.json(?:\.gz)?$")


_KINDS = ("compute", "comm", "memcpy", "memset", "cpu_op", "runtime", "annotation", "sync")
_KIND_CODE = {k: i for i, k in enumerate(_KINDS)}
_COMPUTE, _COMM, _SYNC = _KIND_CODE["compute"], _KIND_CODE["comm"], _KIND_CODE["sync"]
_D = pa.dictionary(pa.int32(), pa.string())
STAGE_SCHEMA = pa.schema([
    ("lane", _D), ("kind", _D), ("name", _D), ("cat", _D),
    ("ts", pa.int64()), ("dur", pa.int64()), ("correlation", pa.int64()),
    ("external_id", pa.int64()), ("sync_lane", pa.string()), ("sync_correlation", pa.int64()),
    ("gpu", pa.bool_()),
])
#: The staged columns of a pass whose reader gives each GPU row its launch's time (Nsight: a join
#: in SQL), so that the pass keeps only the runtime rows the collectives' launch links need.
LAUNCH_STAGE_SCHEMA = STAGE_SCHEMA.append(pa.field("launch_ts", pa.int64()))
#: Staged event columns are held in memory up to this many bytes, then spooled to disk (Arrow IPC).
SPOOL_MEMORY = 128 << 20


KinetoResult = ParseResult


def compile_patterns(patterns: Iterable[str] | None) -> re.Pattern[str]:
    """One regex from comm-kernel patterns (the defaults when None)."""
    pats = list(DEFAULT_COMM_PATTERNS if patterns is None else patterns)
    if not pats:
        return re.compile(r"(?!)")
    try:
        return re.compile("|".join(f"(?:{p})" for p in pats))
    except re.error as exc:
        raise ValueError(f"invalid comm pattern: {exc}") from exc


class Pass1:
    """Columns of one batch of events at a time, held or spooled to an IPC stream; small state kept."""

    def __init__(self, spool: Path, comm: re.Pattern[str], stats: SourceStats, *,
                 launches_given: bool = False) -> None:
        self.spool_path = spool
        self.schema = LAUNCH_STAGE_SCHEMA if launches_given else STAGE_SCHEMA
        self.spool_memory = SPOOL_MEMORY
        self.spilled = False
        self._held: list[pa.Table] = []
        self._held_bytes = 0
        self._writer: ipc.RecordBatchStreamWriter | None = None
        self._sink: Any = None
        self.comm = comm
        self.stats = stats
        self.rows = 0
        self.lane_cache: dict[tuple[Any, ...], str] = {}
        self.comm_cache: dict[str, bool] = {}
        self.mark_cache: dict[str, int] = {}
        self.markers = MarkerStore(Args)
        self.cpu_steps: list[tuple[int, int, int]] = []
        self.gpu_steps: list[tuple[int, int, int]] = []
        self.runtime: list[pa.Table] = []
        self.cpu_pid: int | None = None
        self.gpu_device: int | None = None
        self.ts_min: int | None = None
        self.ts_max: int | None = None

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._sink.close()
            self._writer = None

    def add(self, events: list[Event]) -> None:
        types = Counter(map(type, events))
        n = types.pop(XEvent, 0)
        if Event in types:  # a batch the tagged decoder rejected: plain Event structs
            xs = [e for e in events if e.ph == "X"]
            phases = Counter([e.ph for e in events if e.ph != "X"])
            n = len(xs)
        else:
            xs = [e for e in events if type(e) is XEvent] if types else events
            phases = Counter({t.ph: c for t, c in types.items()})
        for ph, c in phases.items():
            self.stats.skip(_PHASE_REASON.get(ph, "unsupported_phase"), c)
        if not n:
            return
        argss = [e.args for e in xs]

        def sync_columns(kind: np.ndarray) -> tuple[list[str | None], list[int | None]]:
            sync_lane: list[str | None] = [None] * n
            sync_corr: list[int | None] = [None] * n
            for i in np.flatnonzero(kind == _SYNC).tolist():
                a = argss[i]
                if a is None:
                    continue
                ws = as_int(a.wait_on_stream)
                if ws is not None and ws >= 0:
                    dev = as_int(a.device)
                    sync_lane[i] = f"gpu{fmt(dev if dev is not None else xs[i].pid)}/stream{ws}"
                wc = as_int(a.wait_corr)
                if wc is not None and wc >= 0:
                    sync_corr[i] = wc
            return sync_lane, sync_corr

        ts, ts_oor, _ = _ns_column(b"\n".join([e.ts for e in xs]), n, "time_ns")
        dur, dur_oor, dur_empty = _ns_column(b"\n".join([e.dur for e in xs]), n, "duration_ns")
        self.add_columns(
            cat=pa.array([e.cat for e in xs], pa.string()).dictionary_encode(),
            name=pa.array([e.name for e in xs], pa.string()).dictionary_encode(),
            pids=[e.pid for e in xs], tids=[e.tid for e in xs], ts=ts, ts_oor=ts_oor, dur=dur, dur_oor=dur_oor,
            dur_empty=dur_empty,
            corr=int_column([a.correlation if a is not None else None for a in argss], "correlation", self.stats),
            ext=int_column([a.external_id if a is not None else None for a in argss], "external_id", self.stats),
            sync_columns=sync_columns, args_at=argss.__getitem__)

    def add_columns(self, *, cat: pa.DictionaryArray, name: pa.DictionaryArray, pids: Sequence[Any] | pa.Array,
                    tids: Sequence[Any] | pa.Array, ts: pa.Array, ts_oor: np.ndarray, dur: pa.Array,
                    dur_oor: np.ndarray, dur_empty: np.ndarray, corr: pa.Array, ext: pa.Array,
                    sync_columns: Callable[[np.ndarray], tuple[Sequence[Any], Sequence[Any]]],
                    args_at: Callable[[int], Args | None], launch_ts: pa.Array | None = None,
                    runtime_rows: np.ndarray | None = None) -> None:
        """One batch of X events given as columns (what `add` makes of decoded events; the Nsight
        reader builds them from its tables): `ts`/`dur` in ns, null where unusable (`*_oor` says
        which were out of range, `dur_empty` which were missing); `sync_columns(kind)` gives the
        sync lane and correlation of each row; `args_at(i)` row i's args, asked only of the rows
        that become communication markers. A pass made with `launches_given` takes `launch_ts`
        (each GPU row's launch time, null when it has none) and keeps of the runtime rows only
        `runtime_rows` (those launching a communication kernel)."""
        n = len(ts)
        cat_arr, name_arr = cat, name
        cat_vals = cat_arr.dictionary.to_pylist()
        cat_idx = pc.fill_null(cat_arr.indices, len(cat_vals)).to_numpy(zero_copy_only=False)
        cat_kind = np.array([_KIND_CODE.get(_CAT_KIND.get(c), -1) for c in cat_vals] + [-2], np.int8)
        cat_gpu = np.array([c in _GPU_CATS for c in cat_vals] + [False], bool)
        kind = cat_kind[cat_idx]
        gpu = cat_gpu[cat_idx]
        name_vals = name_arr.dictionary.to_pylist()
        name_idx = name_arr.indices.to_numpy(zero_copy_only=False)
        cc, mc, search = self.comm_cache, self.mark_cache, self.comm.search
        comm_flags = np.zeros(len(name_vals), bool)
        mark_flags = np.zeros(len(name_vals), np.int8)
        for i, nm in enumerate(name_vals):
            v = cc.get(nm)
            if v is None:
                v = cc[nm] = search(nm) is not None
            comm_flags[i] = v
            m = mc.get(nm)
            if m is None:
                m = mc[nm] = _marker_class(nm)
            mark_flags[i] = m
        kind = np.where((kind == _COMPUTE) & comm_flags[name_idx], _COMM, kind)
        lane_arr, lane_vals, lane_idx = self._lane_column(pids, tids, gpu)
        dur_bad = None
        if dur.null_count:
            dur_null = np.asarray(dur.is_null().to_numpy(zero_copy_only=False), bool)
            dur_bad = dur_null & ~dur_empty
            dur = pc.fill_null(dur, 0)
        sync_lane, sync_corr = sync_columns(kind)
        keep = kind >= 0
        ts_null = np.asarray(ts.is_null().to_numpy(zero_copy_only=False), bool) if ts.null_count else None
        if ts_null is not None:
            keep &= ~ts_null
        if dur_bad is not None:
            keep &= ~dur_bad
        n_keep = int(keep.sum())
        if n_keep != n:
            no_cat = kind == -2
            unknown = kind == -1
            rest = ~keep & ~no_cat & ~unknown
            ts_range = rest & ts_oor
            bad_ts = rest & ~ts_oor & (ts_null if ts_null is not None else False)
            rest = rest & ~ts_range & ~bad_ts
            dur_range = rest & dur_oor
            for reason, mask in (("no_category", no_cat), ("unknown_category", unknown),
                                 (out_of_range("ts"), ts_range), ("missing_or_bad_ts", bad_ts),
                                 (out_of_range("dur"), dur_range), ("bad_dur", rest & ~dur_oor)):
                c = int(mask.sum())
                if c:
                    self.stats.skip(reason, c)
        kind_arr = pa.DictionaryArray.from_arrays(pa.array(np.maximum(kind, 0).astype(np.int32)),
                                                    pa.array(_KINDS, pa.string()))
        table = pa.table({
            "lane": lane_arr, "kind": kind_arr,
            "name": name_arr, "cat": cat_arr, "ts": ts, "dur": dur, "correlation": corr,
            "external_id": ext, "sync_lane": pa.array(sync_lane, pa.string()),
            "sync_correlation": pa.array(sync_corr, pa.int64()), "gpu": pa.array(gpu, pa.bool_()),
            **({"launch_ts": launch_ts if launch_ts is not None else pa.nulls(n, pa.int64())}
               if self.schema is LAUNCH_STAGE_SCHEMA else {}),
        }, schema=self.schema)
        if n_keep != n:
            table = table.filter(pa.array(keep))
        marks = mark_flags[name_idx]
        hits = np.flatnonzero(keep & ((marks > 0) | (kind == _COMM)))
        if len(hits):
            # exact int64 (a null ts would turn the numpy view into float64)
            ts_np = pc.fill_null(ts, 0).to_numpy(zero_copy_only=False)
            dur_np = dur.to_numpy(zero_copy_only=False)
            ordinals = np.cumsum(keep)[hits] - 1 + self.rows
            marks_hit = marks[hits]
            for i, t, d, g in zip(hits[marks_hit == 2].tolist(), ts_np[hits][marks_hit == 2].tolist(),
                                  dur_np[hits][marks_hit == 2].tolist(), gpu[hits][marks_hit == 2].tolist(),
                                  strict=True):
                step = int(_STEP.match(name_vals[name_idx[i]]).group(1))  # type: ignore[union-attr]
                if step > _STEP_MAX:
                    self.stats.drop("step")
                    continue
                (self.gpu_steps if g else self.cpu_steps).append((t, t + d, step))
            sel = marks_hit != 2
            mi = hits[sel]
            if len(mi):
                self._add_markers(mi, ordinals[sel], ts_np, dur_np, kind, gpu, lane_vals, lane_idx, name_vals,
                                  name_idx, args_at)
        rt = keep & np.isin(cat_idx, [i for i, c in enumerate(cat_vals) if c in _RUNTIME_CATS])
        if runtime_rows is not None:
            rt &= runtime_rows
        if rt.any():
            self.runtime.append(pa.table({
                "correlation": corr.filter(pa.array(rt)), "ts": ts.filter(pa.array(rt)),
                "lane": lane_arr.filter(pa.array(rt)),
            }))
        if table.num_rows:
            lo = pc.min(table.column("ts")).as_py()
            hi = pc.max(pc.add(table.column("ts"), table.column("dur"))).as_py()
            self.ts_min = lo if self.ts_min is None else min(self.ts_min, lo)
            self.ts_max = hi if self.ts_max is None else max(self.ts_max, hi)
        if self.gpu_device is None:
            self.gpu_device = _first_int(pids, np.flatnonzero(keep & gpu), "count")
        if self.cpu_pid is None:
            self.cpu_pid = _first_int(pids, np.flatnonzero(keep & ~gpu), "id")
        self._write(table)

    def _add_markers(self, mi: np.ndarray, ordinals: np.ndarray, ts: np.ndarray, dur: np.ndarray,
                     kind: np.ndarray, gpu: np.ndarray, lane_vals: list[str], lane_idx: np.ndarray,
                     name_vals: list[str], name_idx: np.ndarray, args_at: Callable[[int], Args | None]) -> None:
        """Batch rows `mi` (communication markers) into the marker columns."""
        ms = self.markers
        lane_codes = np.array([ms.code(v) for v in lane_vals], np.int32)
        n = len(mi)
        corr = np.zeros(n, np.int64)
        ext = np.zeros(n, np.int64)
        flags = (gpu[mi].astype(np.int8) * MARK_GPU) | ((kind[mi] == _COMM).astype(np.int8) * MARK_COMM)
        name_codes = np.empty(n, np.int32)
        call_args: list[Args | None] = []
        for j, i in enumerate(mi.tolist()):
            name_codes[j] = ms.code(name_vals[name_idx[i]])
            a = args_at(i)
            if a is None:
                call_args.append(None)
                continue
            c, e = as_int(a.correlation), as_int(a.external_id)
            if c is not None:
                corr[j] = c
                flags[j] |= MARK_CORR
            if e is not None:
                ext[j] = e
                flags[j] |= MARK_EXT
            call_args.append(a if _has_call_args(a) else None)
        ms.append({"ordinal": ordinals, "ts": ts[mi], "dur": dur[mi], "corr": corr, "ext": ext, "flags": flags,
                   "lane": lane_codes[lane_idx[mi]], "name": name_codes}, call_args)

    @contextmanager
    def staged(self) -> Iterator[Iterable[pa.RecordBatch]]:
        """The staged events as record batches in file order (held ones are let go as read)."""
        if not self.spilled:
            yield self._drain_held()
            return
        self.close()
        with pa.OSFile(str(self.spool_path), "rb") as src:
            yield ipc.open_stream(src)

    def _drain_held(self) -> Iterator[pa.RecordBatch]:
        self._held.reverse()
        while self._held:
            table = self._held.pop()
            self._held_bytes -= table.nbytes
            yield from table.to_batches()

    def _lane_column(self, pids: Sequence[Any] | pa.Array, tids: Sequence[Any] | pa.Array, gpu: np.ndarray
                     ) -> tuple[pa.DictionaryArray, list[str], np.ndarray]:
        """The lane column (dictionary in first-occurrence order), its dictionary and indices.

        With integer pids and tids (the usual case) the distinct (gpu, pid, tid) keys are found by
        Arrow and only those are named in Python; otherwise every event goes through `_lanes`.
        """
        try:
            p = pids if isinstance(pids, pa.Array) else pa.array(pids)
            t = tids if isinstance(tids, pa.Array) else pa.array(tids)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
            p = t = None
        if (p is None or t is None or p.type != pa.int64() or t.type != pa.int64()
                or p.null_count or t.null_count):
            pl = pids.to_pylist() if isinstance(pids, pa.Array) else pids
            tl = tids.to_pylist() if isinstance(tids, pa.Array) else tids
            arr = pa.array(self._lanes(pl, tl, gpu), pa.string()).dictionary_encode()
            return arr, arr.dictionary.to_pylist(), arr.indices.to_numpy(zero_copy_only=False)
        pe, te = p.dictionary_encode(), t.dictionary_encode()
        n_p, n_t = len(pe.dictionary), len(te.dictionary)
        key = (gpu.astype(np.int64) * n_p + pe.indices.to_numpy()) * n_t + te.indices.to_numpy()
        ke = pa.array(key).dictionary_encode()
        p_vals, t_vals = pe.dictionary.to_pylist(), te.dictionary.to_pylist()
        lc = self.lane_cache
        vals: list[str] = []
        where: dict[str, int] = {}
        remap = []
        for k in ke.dictionary.to_pylist():
            g, rest = divmod(k, n_p * n_t)
            pi, ti = divmod(rest, n_t)
            lk = (bool(g), p_vals[pi], t_vals[ti])
            lane = lc.get(lk)
            if lane is None:
                pid, tid = lk[1], lk[2]
                lane = lc[lk] = f"gpu{fmt(pid)}/stream{fmt(tid)}" if g else f"cpu/thread{fmt(tid)}"
            j = where.get(lane)
            if j is None:
                j = where[lane] = len(vals)
                vals.append(lane)
            remap.append(j)
        idx = np.asarray(remap, np.int32)[ke.indices.to_numpy()]
        return pa.DictionaryArray.from_arrays(pa.array(idx), pa.array(vals, pa.string())), vals, idx

    def _lanes(self, pids: Sequence[Any], tids: Sequence[Any], gpu: np.ndarray) -> list[str]:
        """Lane names: "gpu{pid}/stream{tid}" for GPU events, "cpu/thread{tid}" otherwise."""
        lc = self.lane_cache
        lanes = []
        append = lanes.append
        get = lc.get
        for key in zip(gpu.tolist(), pids, tids, strict=True):
            lane = get(key)
            if lane is None:
                g, pid, tid = key
                lane = lc[key] = f"gpu{fmt(pid)}/stream{fmt(tid)}" if g else f"cpu/thread{fmt(tid)}"
            append(lane)
        return lanes

    def _write(self, table: pa.Table) -> None:
        if not table.num_rows:
            return
        if not self.spilled and self._held_bytes + table.nbytes <= self.spool_memory:
            self._held.append(table)
            self._held_bytes += table.nbytes
        else:
            if not self.spilled:
                self._sink = pa.OSFile(str(self.spool_path), "wb")
                self._writer = ipc.new_stream(self._sink, self.schema)
                self.spilled = True
                for held in self._held:
                    self._writer.write_table(held)
                self._held, self._held_bytes = [], 0
            assert self._writer is not None
            self._writer.write_table(table)
        self.rows += table.num_rows
        self.stats.store(table.num_rows)


def _has_call_args(a: Args) -> bool:
    return bool(a.coll or a.pg_name or a.pg_id or a.input_dims or a.input_type or a.concrete)


def _first_int(values: Sequence[Any] | pa.Array, candidates: np.ndarray, kind: str) -> int | None:
    for i in candidates[:64].tolist():
        v = values[i].as_py() if isinstance(values, pa.Array) else values[i]
        if type(v) is int:
            return checked_int(v, kind)
    return None


#: NCCL's own NVTX ranges around its API calls (Nsight Systems reports): call markers like `nccl:<op>`.
NCCL_API_RANGE = re.compile(r"^nccl(?:AllReduce|AllGather|ReduceScatter|Broadcast|Reduce|Send|Recv|AllToAll|"
                            r"Gather|Scatter)$")


def _marker_class(name: str) -> int:
    if name == "record_param_comms" or name.startswith(("nccl:", "gloo:", "c10d::")) or NCCL_API_RANGE.match(name):
        return 1
    if name.startswith("ProfilerStep#") and _STEP.match(name):
        return 2
    return 0


def fmt(v: Any) -> str:
    if type(v) is float and v.is_integer():
        return str(int(v))
    return str(v)


def int_column(values: list[Any], field: str, stats: SourceStats) -> pa.Array:
    """int64 ids; a value that is not an integer in range becomes null and is counted."""
    try:
        return pa.array(values, pa.int64())
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
        clean = []
        for v in values:
            iv = as_int(v)
            if iv is None and v is not None:
                stats.drop(field)
            clean.append(iv)
        return pa.array(clean, pa.int64())


_DEC = pa.decimal128(24, 3)


def _ns_column(joined: bytes, n: int, kind: str) -> tuple[pa.Array, np.ndarray, np.ndarray]:
    """Chrome µs numbers (raw JSON text, newline-joined) to int64 ns, exactly.

    Returns (ns, out_of_range, empty): ns is null where the text is empty, not a number, or out
    of the range of `kind` (see `_limits.RANGES`); the masks say which nulls were out of range
    and which were empty (a missing key). Nothing ever wraps."""
    lo, hi = RANGES[kind]
    text = pa.array([joined], pa.large_binary()).cast(pa.large_string(), safe=False)
    parts = pc.split_pattern(text, "\n").flatten()
    if len(parts) != n:
        return _ns_slow(joined.split(b"\n"), n, lo, hi)
    values = None
    if b"." not in joined and b"e" not in joined and b"E" not in joined:
        try:
            ints = parts.cast(pa.int64())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            ints = None
        if ints is not None and not ints.null_count:
            try:
                values = pc.multiply_checked(ints, 1000)
            except pa.ArrowInvalid:
                return _ns_slow(joined.split(b"\n"), n, lo, hi)
    if values is None:
        try:
            dec = parts.cast(_DEC)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return _ns_slow(joined.split(b"\n"), n, lo, hi)
        if dec.null_count:
            return _ns_slow(joined.split(b"\n"), n, lo, hi)
        words = np.frombuffer(dec.buffers()[1], dtype=np.int64)[2 * dec.offset:2 * (dec.offset + n)]
        low, high = words[0::2], words[1::2]
        if not np.array_equal(high, low >> 63):  # a value beyond int64: never take the low word alone
            return _ns_slow(joined.split(b"\n"), n, lo, hi)
        values = pa.array(low.copy(), pa.int64())
    arr = values.to_numpy(zero_copy_only=False)
    oor = (arr < lo) | (arr > hi)
    if oor.any():
        values = pa.array(arr, pa.int64(), mask=oor)
    return values, oor, np.zeros(n, bool)


def _ns_slow(parts: list[bytes], n: int, lo: int, hi: int) -> tuple[pa.Array, np.ndarray, np.ndarray]:
    out: list[int | None] = []
    oor = np.zeros(n, bool)
    empty = np.zeros(n, bool)
    for i, p in enumerate(parts[:n]):
        s = p.strip().strip(b'"')
        if not s:
            empty[i] = True
            out.append(None)
            continue
        v = None
        if len(s) <= 64:
            try:
                d = Decimal(s.decode("ascii"))
            except (InvalidOperation, UnicodeDecodeError, ValueError):
                d = None
            if d is not None and d.is_finite():
                if d.adjusted() > 24:  # never materialise 1e999999999 as an int
                    oor[i] = True
                else:
                    v = round(d * 1000)
        else:
            oor[i] = s.lstrip(b"-").isdigit()
        if v is not None and not lo <= v <= hi:
            oor[i] = True
            v = None
        out.append(v)
    empty[len(out):] = True
    out.extend([None] * (n - len(out)))
    return pa.array(out, pa.int64()), oor, empty


def rank_from_name(path: str | os.PathLike[str]) -> int | None:
    """A rank spelled in a file name: rank-3, rank3, rank_3, worker3, _rank3 ..."""
    m = _RANK_IN_NAME.search(Path(path).name)
    return int(m.group(1)) if m else None


# --------------------------------------------------------------------------------------------


def parse(path: str | os.PathLike[str], sink: SourceSink, *, rank: int | None = None,
          comm_patterns: Sequence[str] | None = None, chunk_size: int | None = None) -> KinetoResult:
    """Parse one Kineto trace into `sink`; raise InputError when the file cannot be used."""
    path = os.fspath(path)
    with gc_paused():
        return _parse(path, sink, rank, compile_patterns(comm_patterns), chunk_size or _stream.CHUNK)


@contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic GC while parsing: the parse makes millions of short-lived objects but hardly any
    cycles, and each full collection would walk every live object of the process."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _parse(path: str, sink: SourceSink, rank: int | None, comm: re.Pattern[str],
           chunk_size: int) -> KinetoResult:
    stats = SourceStats()
    spool = sink.part_dir / "_events.arrows"
    p1 = Pass1(spool, comm, stats)
    try:
        with ByteStream(path, chunk_size=chunk_size) as stream:
            reader = ChromeTraceReader(stream.prefetched(), decode_events)
            try:
                for kind, item in reader:
                    if kind == "batch":
                        p1.add(item)
                    else:
                        stats.skip("invalid_event")
                    item = None  # free this batch before the reader decodes the next one
            except ChromeFormatError as exc:
                if stream.limit:
                    raise InputError(path, stream.limit) from exc
                if stream.corrupt:
                    raise InputError(path, stream.corrupt) from exc
                if stream.truncated_gzip:
                    raise InputError(path, "truncated before any trace event") from exc
                raise InputError(path, f"not a Kineto trace: {exc}") from exc
            _finish_read(path, reader, stream, stats)
        p1.close()
        meta = reader.metadata
        identity = _identity(path, meta, rank, p1)
        result = pass2(path, sink, p1, meta, identity, stats)
    finally:
        p1.close()
        spool.unlink(missing_ok=True)
    return result


def _finish_read(path: str, reader: ChromeTraceReader, stream: ByteStream,
                 stats: SourceStats) -> None:
    if stream.limit:
        raise InputError(path, stream.limit)
    if not reader.saw_events:
        if stream.corrupt or stream.truncated_gzip or not reader.finished:
            raise InputError(path, "truncated or corrupt before any trace event")
        raise InputError(path, "not a Kineto trace: no traceEvents array")
    if reader.events_arrays > 1:
        stats.warnings.append(f"{reader.events_arrays} traceEvents arrays (a duplicated key): the events of all "
                              "were read")
    if reader.duplicate_keys:
        stats.warnings.append(f"top-level keys given more than once, the last value kept: "
                              f"{sorted(set(reader.duplicate_keys))[:5]}")
    repeated = reader.repeated_keys.warning()
    if repeated:
        stats.warnings.append(repeated)
    if reader.bad_metadata:
        stats.warnings.append(f"undecodable top-level keys skipped: {sorted(reader.bad_metadata)[:5]}")
    cut = not reader.finished
    if reader.oversized:
        stats.skip("too_large", 1)
        stats.warnings.append(
            f"a value larger than {reader.max_value_bytes:,} bytes: the rest of the file was not read "
            f"(salvaged {stats.stored} events before it)")
    elif cut:
        tail = reader.truncated_tail.strip()
        if not reader.events_closed and tail:
            stats.skip("truncated", 1)
        why = stream.corrupt or ("gzip stream cut short" if stream.truncated_gzip else "JSON cut short")
        where = "inside traceEvents" if not reader.events_closed else "after traceEvents"
        stats.warnings.append(
            f"truncated file ({why}, {where}): salvaged {stats.stored} events up to the last "
            "complete one; top-level keys after the cut are missing")


@dataclass
class Identity:
    rank: int
    world_size: int | None
    backend: str | None
    nccl_version: str | None
    host: str | None
    pid: int | None
    device: int | None
    device_name: str | None
    base_ns: int
    pg_config: list[dict[str, Any]]


#: The error of a trace with no distributedInfo and no rank in its file name (a single-GPU run, or a
#: rank that must be named); ingest takes a lone such trace as rank 0.
NO_DISTRIBUTED_INFO = "no rank: the trace has no distributedInfo and the file name names none"


def _identity(path: str, meta: dict[str, Any], rank: int | None, p1: Pass1) -> Identity:
    dist = meta.get("distributedInfo")
    dist = dist if isinstance(dist, dict) else {}
    r = as_int(dist.get("rank"))
    if r is None:
        r = rank
    if r is None:
        r = rank_from_name(path)
    if r is None and not dist:
        raise InputError(path, f"{NO_DISTRIBUTED_INFO}; pass --rank")
    if r is None:
        raise InputError(path, "no rank: distributedInfo has no rank and the file name names none; "
                               "pass --rank")
    if checked_int(r, "rank") is None:
        raise InputError(path, f"rank {r} out of range (0..{RANGES['rank'][1]})")
    host = None
    for key in ("hostname", "host", "host_name"):
        v = meta.get(key)
        if isinstance(v, str) and v:
            host = v
            break
    if host is None:
        m = _TB_NAME.match(Path(path).name)
        if m and p1.cpu_pid is not None and int(m.group("pid")) == p1.cpu_pid:
            host = m.group("host")
    props = meta.get("deviceProperties")
    device_name = None
    if isinstance(props, list):
        named = [p for p in props if isinstance(p, dict) and isinstance(p.get("name"), str)]
        match = [p for p in named if as_int(p.get("id")) == p1.gpu_device]
        if match:
            device_name = match[0]["name"]
        elif named and len({p["name"] for p in named}) == 1:
            device_name = named[0]["name"]
    base = base_ns(path, meta.get("baseTimeNanoseconds"), p1)
    pg = _decode_text(dist.get("pg_config"))
    pg_config = [g for g in pg if isinstance(g, dict)] if isinstance(pg, list) else []
    seen = {r}
    for g in pg_config:
        seen.update(parse_rank_list(g.get("ranks"))[0])
    world, why = world_size(dist.get("world_size"), seen)
    if why:
        p1.stats.warnings.append(why)
    nv = dist.get("nccl_version")
    backend = dist.get("backend")
    return Identity(
        rank=r, world_size=world,
        backend=backend if isinstance(backend, str) else None,
        nccl_version=str(nv) if nv is not None else None, host=host, pid=p1.cpu_pid,
        device=p1.gpu_device, device_name=device_name, base_ns=base, pg_config=pg_config)


def base_ns(path: str, value: Any, p1: Pass1) -> int:
    """baseTimeNanoseconds (0 when absent); an error when it is not a time or when it would put
    the events' times out of range (they would wrap)."""
    if value is None:
        return 0
    base = checked_int(value, "time_ns")
    if base is None:
        raise InputError(path, f"baseTimeNanoseconds {str(value)[:40]!r} is not a time in range")
    lo, hi = RANGES["time_ns"]
    if base and p1.ts_min is not None and p1.ts_max is not None and not (
            lo <= p1.ts_min + base and p1.ts_max + base <= hi):
        raise InputError(path, f"baseTimeNanoseconds {base} puts event times out of range")
    return base


def _decode_text(value: Any) -> Any:
    """A JSON (or Python-repr, quotes swapped; never evaluated) document given as a string."""
    if not isinstance(value, str):
        return value
    for text in (value, value.replace("'", '"')):
        try:
            return msgspec.json.decode(text)
        except (msgspec.DecodeError, RecursionError):
            continue
    return None


# --------------------------------------------------------------------------------------------


class Steps:
    """ProfilerStep windows: steps of CPU timestamps, and of GPU ones via their launch."""

    def __init__(self, p1: Pass1) -> None:
        self.cpu = _windows(p1.cpu_steps)
        self.gpu = _windows(p1.gpu_steps)
        if p1.runtime:
            rt = pa.concat_tables(p1.runtime)
            corr = rt.column("correlation").to_numpy(zero_copy_only=False)
            ts = rt.column("ts").to_numpy(zero_copy_only=False)
            ok = ~np.isnan(corr) if corr.dtype.kind == "f" else np.ones(len(corr), bool)
            corr = corr[ok].astype(np.int64)
            ts = ts[ok].astype(np.int64)
            order = np.argsort(corr, kind="stable")
            self.rt_corr, self.rt_ts = corr[order], ts[order]
        else:
            self.rt_corr = self.rt_ts = np.empty(0, np.int64)

    def launch_ts(self, corr: np.ndarray, has: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if not len(self.rt_corr):
            return np.zeros(len(corr), np.int64), np.zeros(len(corr), bool)
        idx = np.searchsorted(self.rt_corr, corr)
        idx = np.minimum(idx, len(self.rt_corr) - 1)
        found = has & (self.rt_corr[idx] == corr)
        return self.rt_ts[idx], found

    def assign(self, ts: np.ndarray, gpu: np.ndarray, corr: np.ndarray, has_corr: np.ndarray,
               launch: pa.Array | None = None) -> np.ndarray:
        """Each row's step (-1: none); GPU rows by their launch's time when they have one
        (`launch`: given by the reader, else found through the runtime rows)."""
        out = _lookup(self.cpu, ts)
        if gpu.any():
            if launch is None:
                lts, found = self.launch_ts(corr, has_corr & gpu)
            else:
                lts = pc.fill_null(launch, 0).to_numpy(zero_copy_only=False)
                found = has_corr & gpu & ~np.asarray(launch.is_null().to_numpy(zero_copy_only=False), bool)
            via_launch = _lookup(self.cpu, lts)
            by_time = _lookup(self.gpu, ts) if self.gpu is not None else out
            out = np.where(gpu, np.where(found, via_launch, by_time), out)
        return out


def _windows(items: list[tuple[int, int, int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    if not items:
        return None
    items = sorted(items)
    arr = np.array(items, dtype=np.int64)
    return arr[:, 0], arr[:, 1], arr[:, 2]


def _lookup(win: tuple[np.ndarray, np.ndarray, np.ndarray] | None, ts: np.ndarray) -> np.ndarray:
    if win is None:
        return np.full(len(ts), -1, np.int64)
    starts, ends, nums = win
    idx = np.searchsorted(starts, ts, side="right") - 1
    ok = idx >= 0
    idxc = np.maximum(idx, 0)
    ok &= ts <= ends[idxc]
    return np.where(ok, nums[idxc], -1)


WRITE_ROWS = 65_536


def _coalesce(batches: Iterable[pa.RecordBatch], rows: int) -> Iterable[pa.RecordBatch]:
    """Regroup record batches into batches of about `rows` rows (small ones are merged)."""
    pending: list[pa.RecordBatch] = []
    n = 0
    for b in batches:
        pending.append(b)
        n += b.num_rows
        if n >= rows:
            yield _merge_batches(pending)
            pending, n = [], 0
    if pending:
        yield _merge_batches(pending)


def _merge_batches(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    if len(batches) == 1:
        return batches[0]
    return pa.Table.from_batches(batches).unify_dictionaries().combine_chunks().to_batches()[0]


_WRITER: tuple[int, ThreadPoolExecutor] | None = None


def _event_writer() -> ThreadPoolExecutor:
    """The thread that writes parsed events while the next batch is shaped: one for the process
    (a forked child makes its own), shared by every file (a pool made per file cost about 4 ms a
    file, 4 s at 1,024 ranks)."""
    global _WRITER
    if _WRITER is None or _WRITER[0] != os.getpid():
        _WRITER = (os.getpid(), ThreadPoolExecutor(max_workers=1, thread_name_prefix="tracekit-write"))
    return _WRITER[1]


def pass2(path: str, sink: SourceSink, p1: Pass1, meta: dict[str, Any], ident: Identity,
           stats: SourceStats) -> KinetoResult:
    steps = Steps(p1)
    groups = groups_from_config(ident)
    coll_cols, (keys, vals) = build_collectives(p1, ident, steps, groups, stats)
    p1.markers = MarkerStore()  # let the marker columns go before the events are written
    offset = 0
    step_set: set[int] = set()
    pending: list[Future[None]] = []
    if p1.rows:
        # the writer thread is finished before the staged data (or its spool file) is released
        with p1.staged() as staged:
            writer = _event_writer()
            try:
                for batch in _coalesce(staged, WRITE_ROWS):
                    n = batch.num_rows
                    ts = batch.column("ts").to_numpy(zero_copy_only=False)
                    gpu = batch.column("gpu").to_numpy(zero_copy_only=False)
                    corr_arr = batch.column("correlation")
                    has_corr = ~np.asarray(corr_arr.is_null().to_numpy(zero_copy_only=False), bool)
                    corr = pc.fill_null(corr_arr, -1).to_numpy(zero_copy_only=False)
                    step = steps.assign(ts, gpu, corr, has_corr, batch.column("launch_ts")
                                        if "launch_ts" in batch.schema.names else None)
                    step_set.update(np.unique(step[step >= 0]).tolist())
                    coll = None
                    if len(keys):
                        ords = np.arange(offset, offset + n, dtype=np.int64)
                        idx = np.minimum(np.searchsorted(keys, ords), len(keys) - 1)
                        hit = keys[idx] == ords
                        if hit.any():
                            coll = pa.array(vals[idx], pa.int64(), mask=~hit)
                    offset += n
                    for f in [f for f in pending if f.done()]:
                        f.result()
                        pending.remove(f)
                    while len(pending) >= 2:
                        pending.pop(0).result()
                    pending.append(writer.submit(sink.add_events, {
                        "rank": pa.array(np.full(n, ident.rank, np.int32)),
                        "lane": batch.column("lane"), "kind": batch.column("kind"),
                        "name": batch.column("name"),
                        "ts_ns": pc.add(batch.column("ts"), ident.base_ns) if ident.base_ns else batch.column("ts"),
                        "dur_ns": batch.column("dur"),
                        "step": pa.array(step.astype(np.int32), pa.int32(), mask=step < 0),
                        "correlation": corr_arr,
                        "coll_id": coll if coll is not None else pa.nulls(n, pa.int64()),
                        "cat": batch.column("cat"), "external_id": batch.column("external_id"),
                        "sync_lane": batch.column("sync_lane"),
                        "sync_correlation": batch.column("sync_correlation"),
                    }))
                for f in pending:
                    f.result()
            finally:
                wait(pending)
    group_rows = sorted(groups.values(), key=lambda g: g["group"])
    sink.add("groups", {
        "group": [g["group"] for g in group_rows], "desc": [g["desc"] for g in group_rows],
        "backend": [g["backend"] for g in group_rows],
        "ranks": pa.array([g["ranks"] for g in group_rows], pa.list_(pa.int32())),
        "size": pa.array([g["size"] for g in group_rows], pa.int32()),
        "dims": pa.array([[] for _ in group_rows], pa.list_(pa.string())),
        "ranks_complete": [g["ranks_complete"] for g in group_rows],
    })
    if len(coll_cols["coll_id"]):
        sink.add("collectives", coll_cols)
    sink.add("ranks", {
        "rank": pa.array([ident.rank], pa.int32()),
        "world_size": pa.array([ident.world_size], pa.int32()),
        "host": pa.array([ident.host], pa.string()), "pid": pa.array([ident.pid], pa.int64()),
        "local_device": pa.array([ident.device], pa.int32()),
        "source_file": [path], "source_format": [NAME],
        "clock_offset_ns": pa.nulls(1, pa.int64()),
        "backend": pa.array([ident.backend], pa.string()),
        "device_name": pa.array([ident.device_name], pa.string()),
        "nccl_version": pa.array([ident.nccl_version], pa.string()),
    })
    lo = p1.ts_min + ident.base_ns if p1.ts_min is not None else None
    hi = p1.ts_max + ident.base_ns if p1.ts_max is not None else None
    return KinetoResult(stats=stats, rank=ident.rank, events=p1.rows,
                        collectives=len(coll_cols["coll_id"]), groups=len(group_rows),
                        steps=sorted(step_set), ts_min_ns=lo, ts_max_ns=hi)


_KEYS = re.compile(rb'"(traceEvents|schemaVersion|deviceProperties|distributedInfo)"\s*:')


def sniff(head: Head) -> bool:
    """A JSON object with one of a Chrome/Kineto trace's top-level keys."""
    return head.json_object and _KEYS.search(head.body) is not None


FORMAT = Format(name=NAME, description="Kineto traces", version=PARSER_VERSION, parse=parse,
                sniffs=(sniff,),
                options=("comm_patterns",), priority=0, alone_is_rank0=NO_DISTRIBUTED_INFO)
