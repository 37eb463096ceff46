"""Collectives from Kineto traces: communication markers -> calls -> one row per rank per call.

A call is the set of host markers nested on one thread (`c10d::<op>`, `record_param_comms`,
`nccl:<op>`/`gloo:<op>`) plus the communication kernels launched inside them; gloo's split
`c10d::`/`gloo:` pairs are joined by order. Sizes come from collective args, else from
`record_shapes`; groups from the args, `pg_config`, or (gloo) inference.
"""

from __future__ import annotations

import bisect
import functools
import re
from array import array
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracekit._limits import MAX_WORLD_SIZE, RANGES, checked_int
from tracekit.parsers.vocabulary import COLLECTIVE_OPS, KERNEL_OPS, dtype_bytes, parse_rank_list

if TYPE_CHECKING:
    from tracekit.parsers.kineto import Args, Identity, Pass1, Steps
    from tracekit.store import SourceStats

SOURCE = "kineto"
SIZE_MAX = RANGES["size"][1]

NOT_A_CALL = frozenset({"wait", "work_wait", "abort", "shutdown"})

_KERNEL_OP = re.compile(r"nccl(?:Dev)?Kernel_([A-Za-z]+)")
#: NCCL 2.4-2.7 kernel names: `ncclAllReduceRingLLKernel_sum_f32`, `ncclSendRecvKernel_copy_i8`.
_KERNEL_OP_LEGACY = re.compile(r"\bnccl(AllReduce|AllGather|ReduceScatter|Broadcast|Reduce|SendRecv)"
                               r"(?:Tree|Ring|CollNet)?(?:LL128|LL)?Kernel_")
_INTS = re.compile(r"-?\d+")
_LANE_TID = re.compile(r"(-?\d{1,18})$")

# What a launched NCCL kernel's name says about the algorithm (docs/formats.md "NCCL kernel
# names"). NCCL instantiates one kernel per algorithm with the LL protocol and dispatches the
# protocol inside it, so the protocol in a name is never the one used (NCCL 2.4-2.18
# enqueue.cc NCCL_FUNC5; 2.19+ src/device/generate.py `best_kernel`). NCCL 2.4-2.18 kernels are
# per algorithm; since 2.19 a kernel is TREE for tree and RING for every other algorithm
# (AllGather and Broadcast always RING).
_ALGO_NAMES = "TREE|RING|COLLNET_DIRECT|COLLNET_CHAIN|COLLNET|NVLS_TREE|NVLS|PAT"
_KERNEL_PER_ALGO = re.compile(r"\bncclKernel_([A-Za-z]+)_(" + _ALGO_NAMES + r")_(?:LL128|LL|SIMPLE)_")
_KERNEL_LEGACY = re.compile(r"\bnccl(AllReduce|AllGather|ReduceScatter|Broadcast|Reduce)(Tree|Ring|CollNet)"
                            r"(?:LL128|LL)?Kernel_")
_KERNEL_DEV = re.compile(r"\bncclDevKernel_([A-Za-z]+)_(?:[A-Za-z0-9]+_)*?(TREE|RING)_(?:LL128|LL|SIMPLE)\b")
#: NCCL >= 2.19: the algorithms a RING-named kernel may be running (generate.py algos_of_coll).
_NOT_TREE = {
    "AllReduce": "RING|COLLNET_DIRECT|COLLNET_CHAIN|NVLS|NVLS_TREE",
    "AllGather": "RING|COLLNET_DIRECT|NVLS|PAT",
    "ReduceScatter": "RING|COLLNET_DIRECT|NVLS|PAT",
    "Broadcast": "RING", "Reduce": "RING",
}


@functools.lru_cache(maxsize=4096)
def kernel_algo(name: str) -> str | None:
    """The NCCL algorithm a collective kernel's name shows: one NCCL name (`RING`, `TREE`, ...),
    or `A|B|...` when the name narrows it to several, or None (SendRecv, Generic, RCCL, or a
    name without an algorithm). The protocol is never read from a name (see above)."""
    m = _KERNEL_PER_ALGO.search(name)
    if m:
        return None if m.group(1) == "SendRecv" else m.group(2)
    m = _KERNEL_LEGACY.search(name)
    if m:
        return {"Tree": "TREE", "Ring": "RING", "CollNet": "COLLNET"}[m.group(2)]
    m = _KERNEL_DEV.search(name)
    if m:
        coll = m.group(1)
        if m.group(2) == "TREE":
            return "TREE" if coll == "AllReduce" else None
        return _NOT_TREE.get(coll)
    return None


@dataclass(slots=True)
class Marker:
    """One communication marker of a call, made from `MarkerStore` columns while its call is
    turned into a row (never kept for the whole file)."""

    ordinal: int
    lane: str
    name: str
    ts: int
    dur: int
    corr: int | None
    ext: int | None
    args: Args | None


#: The `Args` fields a call is read from (all raw JSON, decoded when a call needs them).
RAW_ARGS = ("coll", "in_nelems", "out_nelems", "in_size", "out_size", "group_size", "dtype", "in_split",
            "out_split", "pg_name", "pg_desc", "pg_ranks", "pg_id", "src_rank", "dst_rank", "seq", "comms_id",
            "input_dims", "input_type", "concrete")
_RAW_BIT = {f: i for i, f in enumerate(RAW_ARGS)}
_NUMERIC = {"ordinal": "q", "ts": "q", "dur": "q", "corr": "q", "ext": "q", "flags": "b", "lane": "i",
            "name": "i", "args": "i"}
#: Bits of a marker's `flags`: on a GPU lane, a communication kernel, has a correlation, an External id.
MARK_GPU, MARK_COMM, MARK_CORR, MARK_EXT = 1, 2, 4, 8
#: Distinct call args a MarkerStore looks up to share (beyond it new ones are stored, unshared).
_SHARED_ARGS = 4096


class MarkerStore:
    """A file's communication markers (the CPU ops and kernels of collectives) as columns: about
    50 bytes a marker plus the raw bytes of the call args it has, where a marker object with
    its args took about 1.2 KB. Lanes and names are codes into one string table; a marker's
    args are packed as the fields it has (a bit mask, then each field's length and raw JSON), so
    a marker with args costs 12 bytes besides the lengths and the bytes of its fields. Markers
    with the same args (a call repeated every step: the same group, op and sizes) share one row of
    them (up to `_SHARED_ARGS` distinct ones are looked up), so such a marker costs its columns only;
    `args_row(i)` names the row, equal for equal args."""

    def __init__(self, args_type: type[Args] | None = None) -> None:
        self._args_type = args_type
        self._cols = {k: array(t) for k, t in _NUMERIC.items()}
        self._packed = bytearray()
        self._arg_end = array("q", [0])
        self._arg_mask = array("I")
        self._arg_rows: dict[bytes, int] = {}
        self.strings: list[str] = []
        self._codes: dict[str, int] = {}
        self.n = 0
        self.n_args = 0
        self._np: dict[str, np.ndarray] = {}

    def code(self, text: str) -> int:
        c = self._codes.get(text)
        if c is None:
            c = self._codes[text] = len(self.strings)
            self.strings.append(text)
        return c

    def code_of(self, text: str) -> int | None:
        return self._codes.get(text)

    def append(self, cols: dict[str, np.ndarray], args: list[Args | None]) -> None:
        """Add markers: `cols` holds a numpy array per numeric column except `args`, which is
        given as the markers' call args (None for a marker without)."""
        n = len(args)
        if not n:
            return
        rows = np.full(n, -1, np.int32)
        known = self._arg_rows
        for i, a in enumerate(args):
            if a is None:
                continue
            mask = 0
            packed = bytearray()
            for bit, f in enumerate(RAW_ARGS):
                raw = getattr(a, f)
                if raw:
                    mask |= 1 << bit
                    packed += len(raw).to_bytes(4, "little")
                    packed += raw
            key = mask.to_bytes(4, "little") + packed
            row = known.get(key)
            if row is None:
                row = self.n_args
                self.n_args += 1
                self._packed += packed
                self._arg_mask.append(mask)
                self._arg_end.append(len(self._packed))
                if len(known) < _SHARED_ARGS:
                    known[key] = row
            rows[i] = row
        for k, t in _NUMERIC.items():
            self._cols[k].frombytes(np.ascontiguousarray(rows if k == "args" else cols[k], np.dtype(t)).tobytes())
        self.n += n
        self._np = {}

    def col(self, name: str) -> np.ndarray:
        """A numeric column as a numpy array (a view of the store, no copy)."""
        arr = self._np.get(name)
        if arr is None:
            arr = self._np[name] = np.frombuffer(self._cols[name], np.dtype(_NUMERIC[name])) if self.n else \
                np.empty(0, np.dtype(_NUMERIC[name]))
        return arr

    def name(self, i: int) -> str:
        return self.strings[self._cols["name"][i]]

    def raw(self, i: int, field: str) -> bytes:
        """Marker i's raw JSON for an args field (b"" when absent)."""
        row = self._cols["args"][i]
        if row < 0:
            return b""
        mask, want = self._arg_mask[row], _RAW_BIT[field]
        if not mask >> want & 1:
            return b""
        buf, pos = self._packed, self._arg_end[row]
        for bit in range(want):
            if mask >> bit & 1:
                pos += 4 + int.from_bytes(buf[pos:pos + 4], "little")
        n = int.from_bytes(buf[pos:pos + 4], "little")
        return bytes(buf[pos + 4:pos + 4 + n])

    def has_args(self, i: int) -> bool:
        return self._cols["args"][i] >= 0

    def args_row(self, i: int) -> int:
        """Marker i's row of args (-1: none); markers whose args were equal share a row."""
        return self._cols["args"][i]

    def fields_of(self, i: int) -> int:
        """The bit mask of the `RAW_ARGS` fields marker i's args have (0: none)."""
        row = self._cols["args"][i]
        return self._arg_mask[row] if row >= 0 else 0

    def args_of_row(self, row: int) -> Args:
        """The args of a row `args_row` named."""
        assert self._args_type is not None, "a store with args is made with their type"
        return self._args_type(**{f: msgspec.Raw(v) for f, v in self._fields(row).items()})

    def args(self, i: int) -> Args | None:
        row = self._cols["args"][i]
        if row < 0:
            return None
        fields = {f: msgspec.Raw(v) for f, v in self._fields(row).items()}
        assert self._args_type is not None, "a store with args is made with their type"
        return self._args_type(**fields)

    def _fields(self, row: int) -> dict[str, bytes]:
        """The raw fields an args row has."""
        buf, pos, mask = self._packed, self._arg_end[row], self._arg_mask[row]
        out = {}
        for bit, f in enumerate(RAW_ARGS):
            if mask >> bit & 1:
                n = int.from_bytes(buf[pos:pos + 4], "little")
                out[f] = bytes(buf[pos + 4:pos + 4 + n])
                pos += 4 + n
        return out

    def marker(self, i: int) -> Marker:
        c = self._cols
        flags = c["flags"][i]
        return Marker(c["ordinal"][i], self.strings[c["lane"][i]], self.strings[c["name"][i]], c["ts"][i],
                      c["dur"][i], c["corr"][i] if flags & MARK_CORR else None,
                      c["ext"][i] if flags & MARK_EXT else None, self.args(i))


def as_int(v: Any, kind: str = "id") -> int | None:
    """An integer field in the range of its kind (int64 ids by default), else None."""
    return checked_int(v, kind)


def _size(v: Any) -> int | None:
    """A byte or element count, or None when absent, not an integer or out of range."""
    return checked_int(v, "size")


def _jv(raw: msgspec.Raw) -> Any:
    if not raw:
        return None
    try:
        return msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        return None


def _comms_id(raw: msgspec.Raw) -> str | None:
    if not raw:
        return None
    v = _jv(raw)
    if v is None:
        return None
    return str(v) if not isinstance(v, float) else repr(v)


@functools.lru_cache(maxsize=4096)
def op_from_name(name: str | None) -> str | None:
    """The op vocabulary entry for a collective name (`allreduce`, `nccl:all_to_all`, ...)."""
    if not name:
        return None
    key = name.strip().lower()
    for prefix in ("nccl:", "gloo:", "c10d::", "ucc:", "mpi:"):
        if key.startswith(prefix):
            key = key[len(prefix):]
            break
    key = key.rstrip("_") if key not in ("_allgather_base", "_reduce_scatter_base") else key
    if key.startswith("_") and key not in COLLECTIVE_OPS:
        key = key.lstrip("_")
    return COLLECTIVE_OPS.get(key)


@functools.lru_cache(maxsize=4096)
def kernel_op(name: str) -> tuple[str, str | None]:
    """(op, dim_hint) for a communication kernel name."""
    m = _KERNEL_OP.search(name)
    if m:
        coll = m.group(1)
        for k in sorted(KERNEL_OPS, key=len, reverse=True):
            if coll.startswith(k):
                return KERNEL_OPS[k], None
        return "other", None
    m = _KERNEL_OP_LEGACY.search(name)
    if m:
        return KERNEL_OPS[m.group(1)], None
    if "dpsk::ep::" in name or "deep_ep::" in name:
        return ("all_to_all" if re.search(r"dispatch|combine", name) else "other"), "EP"
    if "all_reduce" in name or "cross_device_reduce" in name:
        return "all_reduce", None
    return "other", None


_UNSET: Any = object()


@dataclass(slots=True)
class _Call:
    """A call as marker indices into the file's `MarkerStore` (kernels, host markers); what its
    args and op were found to be is cached as an index and a string."""

    kernels: list[int] = field(default_factory=list)
    markers: list[int] = field(default_factory=list)
    args_at: Any = _UNSET
    op_cache: Any = _UNSET


@dataclass(slots=True)
class _CallView:
    """A call's markers as objects, made for the time one call is turned into a row."""

    kernels: list[Marker]
    markers: list[Marker]


def _collect_calls(p1: Pass1) -> Iterator[_Call]:
    """Group markers into calls: CPU markers nested on one lane form a cluster; kernels join the
    cluster of their CPU op (External id) or launch (correlation); one call per cluster. The
    clusters are held as arrays (about 60 bytes a call) and each call is made as it is yielded:
    the clusters in order (those of one op split across threads paired after them, see
    `_pair_split_calls`), then the kernels that joined none."""
    ms: MarkerStore = p1.markers
    flags = ms.col("flags")
    ts_col, dur_col, ord_col, lane_col = ms.col("ts"), ms.col("dur"), ms.col("ordinal"), ms.col("lane")
    ext_col, corr_col = ms.col("ext"), ms.col("corr")
    call_name = _call_names(ms)
    cand = np.flatnonzero((flags & MARK_GPU) == 0)
    cls = np.full(len(ms.strings) + 1, 2, np.int8)
    for code, c in call_name.items():
        cls[code] = c
    cand_cls = cls[ms.col("name")[cand]] if len(cand) else np.empty(0, np.int8)
    is_call = cand_cls == 1
    for j in np.flatnonzero(cand_cls == 0).tolist():
        is_call[j] = _is_call_marker(ms, int(cand[j]), call_name)
    cpu = cand[is_call]
    kernels = np.flatnonzero(flags & MARK_COMM)
    members = array("q")  # the CPU markers, lane by lane (in order of first appearance), in time order
    cl_start = array("q")  # cluster c's markers: members[cl_start[c]:cl_start[c + 1]]
    lane_index: dict[int, tuple[array, array, int]] = {}  # lane -> (cluster starts, ends, first cluster)
    ext_to_cluster: dict[int, int] = {}
    lanes = lane_col[cpu]
    for lane in dict.fromkeys(lanes.tolist()):
        ix = cpu[lanes == lane]
        ix = ix[np.lexsort((ord_col[ix], -dur_col[ix], ts_col[ix]))]
        starts, ends = array("q"), array("q")
        first = len(cl_start)
        last_end = None
        for i, t, d, fl, e in zip(ix.tolist(), ts_col[ix].tolist(), dur_col[ix].tolist(), flags[ix].tolist(),
                                  ext_col[ix].tolist(), strict=True):
            if last_end is None or not (t <= last_end and t + d <= last_end):
                cl_start.append(len(members))
                starts.append(t)
                ends.append(t + d)
                last_end = t + d
            members.append(i)
            if fl & MARK_EXT:
                ext_to_cluster.setdefault(e, len(cl_start) - 1)
        lane_index[lane] = (starts, ends, first)
    n_clusters = len(cl_start)
    cl_start.append(len(members))
    korder = kernels[np.lexsort((ord_col[kernels], ts_col[kernels]))]
    k_flags = flags[korder]
    k_corr = corr_col[korder]
    has_corr = (k_flags & MARK_CORR) != 0
    l_found, l_lane, l_ts = _launch_index(p1, ms, k_corr, has_corr)
    k_cluster = np.full(len(korder), -1, np.int64)
    for j, (fl, kc, ke, found, lane, t) in enumerate(zip(k_flags.tolist(), k_corr.tolist(),
                                                         ext_col[korder].tolist(), l_found.tolist(),
                                                         l_lane.tolist(), l_ts.tolist(), strict=True)):
        if found:
            li = lane_index.get(lane)
            if li is not None:
                i = bisect.bisect_right(li[0], t) - 1
                if i >= 0 and t <= li[1][i]:
                    k_cluster[j] = li[2] + i
        elif fl & MARK_EXT and not (fl & MARK_CORR and ke == kc):
            k_cluster[j] = ext_to_cluster.get(ke, -1)
    joined = np.flatnonzero(k_cluster >= 0)
    by_cluster = joined[np.argsort(k_cluster[joined], kind="stable")]
    kc_bounds = np.searchsorted(k_cluster[by_cluster], np.arange(n_clusters + 1))
    k_index = korder.tolist() if len(korder) else []

    def cluster(c: int) -> _Call:
        lo, hi = int(kc_bounds[c]), int(kc_bounds[c + 1])
        return _Call(kernels=[k_index[j] for j in by_cluster[lo:hi].tolist()],
                     markers=members[cl_start[c]:cl_start[c + 1]].tolist())

    held: dict[int, _Call] = {}  # the clusters `_pair_split_calls` pairs (gloo), with their order
    ops: dict[str, tuple[list[int], list[int]]] = defaultdict(lambda: ([], []))
    for c in range(n_clusters):
        if kc_bounds[c + 1] > kc_bounds[c]:
            continue
        call = cluster(c)
        side = _split_side(ms, call)
        if side is not None:
            held[c] = call
            ops[side[0]][side[1]].append(c)
    for c in range(n_clusters):
        if c in held:
            continue
        call = cluster(c)
        if call.kernels or _cluster_op(ms, call) is not None:
            yield call
    yield from _pair_split_calls(ms, held, ops)
    for j in np.flatnonzero(k_cluster < 0).tolist():
        yield _Call(kernels=[k_index[j]])


def _call_names(ms: MarkerStore) -> dict[int, int]:
    """Per name code: 0 `record_param_comms` (a call unless its args name a wait), 1 a call
    marker, 2 a `c10d::` op that is not a collective."""
    out: dict[int, int] = {}
    for code in np.unique(ms.col("name")).tolist():
        name = ms.strings[code]
        if name == "record_param_comms":
            out[code] = 0
        elif name.startswith("c10d::"):
            out[code] = 1 if op_from_name(name) is not None else 2
        else:
            out[code] = 1
    return out


def _start(ms: MarkerStore, call: _Call) -> int:
    return int(ms.col("ts")[call.markers].min())


def _split_side(ms: MarkerStore, call: _Call) -> tuple[str, int] | None:
    """(op, 0 for the `c10d::` side or 1 for the `gloo:`/`nccl:` one) of a kernel-less call that
    has only one side of a collective split across threads; None for any other call."""
    has_c10d = has_ann = False
    for i in call.markers:
        name = ms.name(i)
        if name.startswith("c10d::"):
            has_c10d = True
        elif name.startswith(("nccl:", "gloo:")):
            has_ann = True
    if has_c10d == has_ann:
        return None
    op = _cluster_op(ms, call)
    if op is None or _args_with_coll(ms, call) is not None:
        return None
    return op, 0 if has_c10d else 1


def _pair_split_calls(ms: MarkerStore, held: dict[int, _Call],
                      ops: dict[str, tuple[list[int], list[int]]]) -> Iterator[_Call]:
    """Join a `c10d::` op with its `gloo:`/`nccl:` event when they sit on different threads
    (gloo runs the work on worker threads): per op, the k-th of each, in time order."""
    for c10d_ids, ann_ids in ops.values():
        c10d = sorted((held[c] for c in c10d_ids), key=lambda c: _start(ms, c))
        anns = sorted((held[c] for c in ann_ids), key=lambda c: _start(ms, c))
        i = 0
        for a in anns:
            t = _start(ms, a)
            if i < len(c10d) and _start(ms, c10d[i]) <= t:
                yield _Call(kernels=[], markers=c10d[i].markers + a.markers)
                i += 1
            else:
                yield a
        yield from c10d[i:]


def _is_call_marker(ms: MarkerStore, i: int, classes: dict[int, int]) -> bool:
    cls = classes[int(ms.col("name")[i])]
    if cls == 0:
        coll = _jv(msgspec.Raw(ms.raw(i, "coll")))
        return not (isinstance(coll, str) and coll.lower() in NOT_A_CALL)
    return cls == 1


def _launch_index(p1: Pass1, ms: MarkerStore, corr: np.ndarray, has: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each kernel correlation (`has`: it has one), whether a runtime call of the pass has it
    and the first such call's lane (a code of `ms`, -1 when no marker has that lane) and time."""
    n = len(corr)
    none = (np.zeros(n, bool), np.full(n, -1, np.int64), np.zeros(n, np.int64))
    if not n or not has.any() or not p1.runtime:
        return none
    rt = pa.concat_tables(p1.runtime)
    wanted = pa.array(np.unique(corr[has]), pa.int64())
    sub = rt.filter(pc.is_in(rt.column("correlation"), value_set=wanted))
    if not sub.num_rows:
        return none
    rc = sub.column("correlation").to_numpy()
    rts = sub.column("ts").to_numpy()
    lanes = sub.column("lane").cast(pa.string()).combine_chunks().dictionary_encode()
    codes = np.asarray([-1 if v is None or (c := ms.code_of(v)) is None else c
                        for v in lanes.dictionary.to_pylist()] + [-1], np.int64)
    rlane = codes[pc.fill_null(lanes.indices, len(codes) - 1).to_numpy(zero_copy_only=False)]
    uc, first = np.unique(rc, return_index=True)
    j = np.minimum(np.searchsorted(uc, corr), len(uc) - 1)
    found = has & (uc[j] == corr)
    return found, np.where(found, rlane[first][j], -1), np.where(found, rts[first][j], 0)


def _args_with_coll(ms: MarkerStore, call: _Call) -> Args | None:
    """The args a call is read from: the first marker's whose args name the collective (kernels,
    then `record_param_comms`, then any), else the first naming a process group."""
    if call.args_at is _UNSET:
        call.args_at = _find_args(ms, call)
    return ms.args(call.args_at) if call.args_at is not None else None


def _find_args(ms: MarkerStore, call: _Call) -> int | None:
    for group in (call.kernels, [i for i in call.markers if ms.name(i) == "record_param_comms"],
                  call.markers):
        found = next((i for i in group if ms.raw(i, "coll")), None)
        if found is not None:
            return found
    return next((i for i in call.markers if ms.raw(i, "pg_name") or ms.raw(i, "pg_id")), None)


def _cluster_op(ms: MarkerStore, call: _Call) -> str | None:
    if call.op_cache is _UNSET:
        call.op_cache = _find_op(ms, call)
    return call.op_cache


def _find_op(ms: MarkerStore, call: _Call) -> str | None:
    if call.args_at is _UNSET:
        call.args_at = _find_args(ms, call)
    if call.args_at is not None:
        op = op_from_name(_str(_jv(msgspec.Raw(ms.raw(call.args_at, "coll")))))
        if op is not None:
            return op
    for prefix in ("nccl:", "gloo:", "c10d::"):
        for i in call.markers:
            name = ms.name(i)
            if name.startswith(prefix):
                op = op_from_name(name)
                if op is not None:
                    return op
    return None


def _str(v: Any) -> str | None:
    if v is None:
        return None
    return v if isinstance(v, str) else str(v)


def _splits(raw: msgspec.Raw) -> list[int]:
    return _splits_text(_jv(raw))


def _bytes_per_peer(rows: list[int], total: int | None) -> list[int] | None:
    if not rows:
        return None
    s = sum(rows)
    if total is None or s <= 0:
        return None
    per_row = total // s if total % s == 0 else total / s
    out = [round(r * per_row) for r in rows]
    return out if all(0 <= x <= SIZE_MAX for x in out) else None


_CPP_DTYPES = {
    "float": "Float", "double": "Double", "c10::half": "Half", "c10::bfloat16": "BFloat16",
    "long int": "Long", "long": "Long", "int64_t": "Long", "long long": "Long", "int": "Int",
    "unsigned char": "Byte", "signed char": "Char", "char": "Char", "bool": "Bool",
    "short int": "Short", "short": "Short", "c10::complex<float>": "ComplexFloat",
    "c10::complex<double>": "ComplexDouble", "c10::float8_e4m3fn": "Float8_e4m3fn",
    "c10::float8_e5m2": "Float8_e5m2",
}


def torch_dtype(cpp: Any) -> str | None:
    """c10 dtype name for a record_shapes "Input type" (C++ type name): "float" -> "Float"."""
    if not isinstance(cpp, str) or not cpp:
        return None
    return _CPP_DTYPES.get(cpp.strip().lower())


def _numel(dims: Any) -> int | None:
    """Elements in a shape ([24, 32]) or a tensor list ([[24, 32], [8]])."""
    if not isinstance(dims, list):
        return None
    if all(isinstance(d, int) for d in dims):
        n = 1
        for d in dims:
            n *= d
            if not 0 <= n <= SIZE_MAX:
                return None
        return n
    if all(isinstance(d, list) and all(isinstance(x, int) for x in d) for d in dims):
        parts = [_numel(d) for d in dims]
        if any(p is None for p in parts):
            return None
        total = sum(parts)  # type: ignore[arg-type]
        return total if total <= SIZE_MAX else None
    return None


def _row_elems(dims: Any) -> int | None:
    if isinstance(dims, list) and dims and all(isinstance(d, int) for d in dims):
        n = 1
        for d in dims[1:]:
            n *= d
            if not 0 <= n <= SIZE_MAX:
                return None
        return n
    return None


def _shape_sizes(call: _CallView, op: str) -> dict[str, Any]:
    """Sizes from record_shapes args of the `c10d::` op (and dtype from the gloo/nccl event)."""
    out: dict[str, Any] = {"dtype": None, "in_bytes": None, "out_bytes": None, "in_rows": None,
                           "out_rows": None, "peer_local": None}
    c10d = next((m for m in call.markers if m.name.startswith("c10d::") and m.args is not None), None)
    ann = next((m for m in call.markers if m.name.startswith(("nccl:", "gloo:")) and m.args is not None), None)
    ann_type = _jv(ann.args.input_type) if ann is not None else None
    dtype = torch_dtype(ann_type[0]) if isinstance(ann_type, list) and ann_type else None
    if c10d is None:
        if ann is not None and op in ("all_reduce", "broadcast", "reduce"):
            dims = _jv(ann.args.input_dims)
            n = _numel(dims[0]) if isinstance(dims, list) and dims else None
            width = dtype_bytes(dtype)
            if n is not None and width:
                out["in_bytes"] = out["out_bytes"] = _bytes(n, width)
        out["dtype"] = dtype
        return out
    dims = _jv(c10d.args.input_dims)
    types = _jv(c10d.args.input_type)
    concrete = _jv(c10d.args.concrete)
    dims = dims if isinstance(dims, list) else []
    types = types if isinstance(types, list) else []
    concrete = concrete if isinstance(concrete, list) else []
    if dtype is None:
        dtype = next((torch_dtype(t) for t in types if torch_dtype(t)), None)
    width = dtype_bytes(dtype)
    out["dtype"] = dtype
    if width is None or not dims:
        return out
    two_tensor = op in ("all_to_all", "all_gather", "reduce_scatter") and len(dims) >= 2 \
        and _numel(dims[0]) is not None and _numel(dims[1]) is not None \
        and all(isinstance(d, int) for d in dims[0])
    if two_tensor:
        out["out_bytes"] = _bytes(_numel(dims[0]), width)
        out["in_bytes"] = _bytes(_numel(dims[1]), width)
        if op == "all_to_all" and len(concrete) >= 5:
            out["out_rows"] = (_splits_text(concrete[3]), _row_elems(dims[0]), width)
            out["in_rows"] = (_splits_text(concrete[4]), _row_elems(dims[1]), width)
        return out
    n = _numel(dims[0]) if dims[0] != [] else None
    if n is None and ann is not None:
        ann_dims = _jv(ann.args.input_dims)
        if isinstance(ann_dims, list) and ann_dims and ann_dims[0] != []:
            n = _numel(ann_dims[0])
    if n is None:
        return out
    nbytes = _bytes(n, width)
    if op == "send":
        out["in_bytes"], out["out_bytes"] = nbytes, 0
    elif op == "recv":
        out["in_bytes"], out["out_bytes"] = 0, nbytes
    else:
        out["in_bytes"] = out["out_bytes"] = nbytes
    if op in ("send", "recv") and len(concrete) >= 3:
        out["peer_local"] = as_int(concrete[2], "rank")
    return out


def _bytes(n: int | None, width: int) -> int | None:
    if n is None:
        return None
    b = n * width
    return b if b <= SIZE_MAX else None


def _splits_text(v: Any) -> list[int]:
    """Split sizes (a list or its text); any value out of range drops the whole list."""
    if isinstance(v, str):
        vals = [_size(x) for x in _INTS.findall(v)[:MAX_WORLD_SIZE + 1]]
    elif isinstance(v, list):
        vals = [_size(i) for i in v[:MAX_WORLD_SIZE + 1]]
    else:
        return []
    return [] if None in vals or len(vals) > MAX_WORLD_SIZE else vals  # type: ignore[return-value]


def _finish_p2p_and_splits(row: _Row, group: dict[str, Any] | None) -> None:
    """Global peer from a group-local one; split rows to bytes per peer (equal when "[]")."""
    if row.peer is None and row.peer_local is not None and group is not None:
        local = row.peer_local
        if group["ranks_complete"] and 0 <= local < len(group["ranks"]):
            row.peer = group["ranks"][local]
    for spec, splits, total, side in ((row.in_rows, row.in_splits, row.in_bytes, "in"),
                                      (row.out_rows, row.out_splits, row.out_bytes, "out")):
        if spec is None or splits is not None:
            continue
        rows_, per_row, width = spec
        if rows_ and per_row is not None:
            sizes = [r * per_row * width for r in rows_]
            if all(x <= SIZE_MAX for x in sizes):
                setattr(row, f"{side}_splits", sizes)
        elif not rows_ and total is not None and row.nranks:
            n = row.nranks
            if total % n == 0:
                setattr(row, f"{side}_splits", [total // n] * n)


def _lane_tid(lane: str) -> int:
    m = _LANE_TID.search(lane)
    return int(m.group(1)) if m else 0


def _infer_groups(rows: list[_Row], ident: Identity,
                  groups: dict[str, dict[str, Any]]) -> None:
    """Groups for calls that do not name theirs (gloo): p2p -> this rank's only 2-rank group;
    collectives -> each PG runs on its own worker threads, created in PG order, so thread sets
    (grouped by op mix, ordered by thread id) map onto the rank's larger groups in name order."""
    member = [g for g in groups.values() if ident.rank in g["ranks"]]
    pairs = [g for g in member if g["size"] == 2]
    todo = [r for r in rows if r.group is None]
    for r in todo:
        if r.op in ("send", "recv") and len(pairs) == 1:
            r.group = pairs[0]["group"]
    coll = [r for r in todo if r.group is None and r.op not in ("send", "recv")]
    if not coll:
        return
    lanes: dict[str, set[str]] = defaultdict(set)
    for r in coll:
        lanes[r.lane].add(r.op)
    sigs: dict[frozenset[str], list[str]] = defaultdict(list)
    for lane, ops in lanes.items():
        sigs[frozenset(ops)].append(lane)
    lane_sets = sorted(sigs.values(), key=lambda ls: min(_lane_tid(x) for x in ls))
    cands = sorted((g for g in member if (g["size"] or 0) > 2), key=lambda g: _group_order(g["group"]))
    if len(cands) > len(lane_sets):
        cands = [g for g in cands if g["group"] != "0" and g["desc"] != "default_pg"]
    if len(cands) != len(lane_sets):
        return
    lane_group = {lane: g for ls, g in zip(lane_sets, cands, strict=True) for lane in ls}
    for r in coll:
        g = lane_group[r.lane]
        spec = r.in_rows
        if spec is not None and spec[0] and len(spec[0]) != g["size"]:
            continue
        r.group = g["group"]


def _group_order(name: str) -> tuple[int, int, str]:
    return (0, int(name), "") if name.isascii() and name.isdigit() and len(name) < 19 else (1, 0, name)


@dataclass(slots=True)
class _Row:
    """The fields of a collective row that calls repeat (all but its times, ids and sequence
    number), while the file's rows are completed (groups, peers, splits): the calls of a file
    share one per distinct set of values, each call keeping only its numbers (`_Rows`)."""

    group: str | None
    op: str
    dtype: str | None
    in_bytes: int | None
    out_bytes: int | None
    nranks: int | None
    peer: int | None
    in_splits: Any
    out_splits: Any
    name: str
    lane: str
    comms_id: str | None
    dim_hint: str | None
    algo: str | None
    gpu: bool
    desc: str | None
    ranks: tuple[int, ...]
    complete: bool
    in_rows: Any
    out_rows: Any
    peer_local: int | None


class _Rows:
    """A file's collective rows as columns: each row's shared fields (`_Row`, interned) and its
    own numbers, about 60 bytes a row (a row object with its lists took about 1 KB)."""

    def __init__(self) -> None:
        self.shared: list[_Row] = []
        self._index: dict[tuple[Any, ...], int] = {}
        self.cols = {k: array("q") for k in ("shared", "ts", "end", "issue", "kcorr", "first", "seq", "has_seq")}

    def __len__(self) -> int:
        return len(self.cols["ts"])

    def add(self, key: tuple[Any, ...], ts: int, end: int, issue: int, kcorr: int | None, first: int,
            seq: int | None) -> int:
        """Add a row (`key`: the `_Row` field values, in order); its position."""
        i = self._index.get(key)
        if i is None:
            i = self._index[key] = len(self.shared)
            self.shared.append(_Row(*key))
        c = self.cols
        c["shared"].append(i)
        c["ts"].append(ts)
        c["end"].append(end)
        c["issue"].append(issue)
        c["kcorr"].append(-1 if kcorr is None else kcorr)
        c["first"].append(first)
        c["seq"].append(0 if seq is None else seq)
        c["has_seq"].append(seq is not None)
        return len(c["ts"]) - 1

    def col(self, name: str) -> np.ndarray:
        c = self.cols[name]
        return np.frombuffer(c, np.int64) if len(c) else np.empty(0, np.int64)


@dataclass(frozen=True, slots=True)
class _ArgFields:
    """What a call's args give its row, decoded once per distinct args (`MarkerStore.args_row`)."""

    coll_name: str | None
    group: str | None
    desc: str | None
    ranks: tuple[int, ...]
    complete: bool
    size: int | None
    dtype: str | None
    in_bytes: int | None
    out_bytes: int | None
    in_splits: tuple[int, ...] | None
    out_splits: tuple[int, ...] | None
    dst: int | None
    src: int | None
    seq: int | None
    comms_id: str | None


def _arg_fields(args: Args) -> _ArgFields:
    ranks, complete = parse_rank_list(_jv(args.pg_ranks))
    dtype = _str(_jv(args.dtype))
    width = dtype_bytes(dtype)
    in_n = _size(_jv(args.in_nelems))
    if in_n is None:
        in_n = _size(_jv(args.in_size))
    out_n = _size(_jv(args.out_nelems))
    if out_n is None:
        out_n = _size(_jv(args.out_size))
    in_b = out_b = None
    if width is not None:
        in_b = _bytes(in_n, width)
        out_b = _bytes(out_n, width)
    in_splits = _bytes_per_peer(_splits(args.in_split), in_b)
    out_splits = _bytes_per_peer(_splits(args.out_split), out_b)
    return _ArgFields(
        coll_name=_str(_jv(args.coll)), group=_str(_jv(args.pg_name)) or _str(_jv(args.pg_id)),
        desc=_str(_jv(args.pg_desc)), ranks=tuple(ranks), complete=complete,
        size=as_int(_jv(args.group_size), "count"), dtype=dtype, in_bytes=in_b, out_bytes=out_b,
        in_splits=tuple(in_splits) if in_splits is not None else None,
        out_splits=tuple(out_splits) if out_splits is not None else None,
        dst=as_int(_jv(args.dst_rank), "rank"), src=as_int(_jv(args.src_rank), "rank"), seq=as_int(_jv(args.seq)),
        comms_id=_comms_id(args.comms_id))


#: Most decoded args kept for reuse by `build_collectives` (calls repeat a few distinct ones).
_ARG_CACHE = 4096


def _frozen_rows(spec: Any) -> Any:
    """A `_shape_sizes` split spec (rows, elements per row, width) as a hashable tuple."""
    return None if spec is None else (tuple(spec[0]), spec[1], spec[2])


def _call_rows(ms: MarkerStore, calls: Iterable[_Call]) -> tuple[_Rows, array, array]:
    """Each call's row, and every marker's (ordinal, row position)."""
    c = ms._cols
    tsc, durc, ordc, lanec, namec, corrc, flagc = (c[k] for k in ("ts", "dur", "ordinal", "lane", "name", "corr",
                                                                   "flags"))
    strings = ms.strings
    rows = _Rows()
    ord_keys = array("q")
    ord_rows = array("q")
    decoded: dict[int, _ArgFields] = {}
    for call in calls:
        kern, mk = call.kernels, call.markers
        if call.args_at is _UNSET:
            call.args_at = _find_args(ms, call)
        af = None
        if call.args_at is not None:
            arow = ms.args_row(call.args_at)
            af = decoded.get(arow)
            if af is None:
                af = _arg_fields(ms.args_of_row(arow))
                if len(decoded) >= _ARG_CACHE:
                    decoded.clear()
                decoded[arow] = af
        op = op_from_name(af.coll_name) if af is not None and af.coll_name else None
        if op is None:
            op = _cluster_op(ms, call)
        dim_hint = None
        if kern:
            kop, dim_hint = kernel_op(strings[namec[kern[0]]])
            if op is None:
                op = kop
        op = op or "other"
        anchor = None
        if mk:
            anchor = mk[0] if len(mk) == 1 else min(mk, key=lambda i: (tsc[i], ordc[i]))
        if kern:
            k0 = kern[0] if len(kern) == 1 else min(kern, key=lambda i: (tsc[i], ordc[i]))
            ts = tsc[k0]
            end = max(tsc[k] + durc[k] for k in kern)
            lane, name = strings[lanec[k0]], strings[namec[k0]]
            issue = tsc[anchor] if anchor is not None else ts
        else:
            a = next((i for i in mk if strings[namec[i]].startswith(("nccl:", "gloo:"))), anchor)
            assert a is not None
            ts, end, lane, name, issue = tsc[a], tsc[a] + durc[a], strings[lanec[a]], strings[namec[a]], tsc[a]
        group = desc = dtype = in_b = out_b = peer = seq = size = comms_id = None
        ranks: tuple[int, ...] = ()
        complete = False
        in_splits = out_splits = None
        if af is not None:
            group, desc, ranks, complete, size, dtype = af.group, af.desc, af.ranks, af.complete, af.size, af.dtype
            in_b, out_b, in_splits, out_splits = af.in_bytes, af.out_bytes, af.in_splits, af.out_splits
            if op == "send":
                peer = af.dst
            elif op == "recv":
                peer = af.src
            seq, comms_id = af.seq, af.comms_id
        peer_local = in_rows = out_rows = None
        if (af is None or in_b is None) and mk:  # (a call of kernels alone has no shapes)
            shape = _shape_sizes(_CallView([], [ms.marker(i) for i in mk]), op)
            dtype = dtype or shape["dtype"]
            in_b = in_b if in_b is not None else shape["in_bytes"]
            out_b = out_b if out_b is not None else shape["out_bytes"]
            in_rows, out_rows = _frozen_rows(shape["in_rows"]), _frozen_rows(shape["out_rows"])
            peer_local = shape["peer_local"]
        kcorr = corrc[kern[0]] if kern and flagc[kern[0]] & MARK_CORR else None
        pos = rows.add((group, op, dtype, in_b, out_b, size, peer, in_splits, out_splits, name, lane, comms_id,
                        dim_hint, kernel_algo(name) if kern else None, bool(kern), desc, ranks, complete, in_rows,
                        out_rows, peer_local),
                       ts, end, issue, kcorr, ordc[kern[0] if kern else mk[0]], seq)
        for m in kern:
            ord_keys.append(ordc[m])
        for m in mk:
            ord_keys.append(ordc[m])
        ord_rows.extend([pos] * (len(kern) + len(mk)))
    return rows, ord_keys, ord_rows


def _complete_groups(shared: list[_Row], ident: Identity, groups: dict[str, dict[str, Any]],
                     stats: SourceStats) -> None:
    """Groups, sizes, global peers and splits of the shared rows (in the order their first call
    came: what the calls would give one by one), and the groups they name."""
    default_group = None
    if not groups:
        default_group = "0"
    elif len(groups) == 1:
        default_group = next(iter(groups))
    assumed = False
    if len(groups) > 1:
        _infer_groups(shared, ident, groups)  # type: ignore[arg-type]
    for row in shared:
        group = row.group
        if group is None and default_group is not None:
            group = row.group = default_group
            assumed = assumed or not groups
        if group is None:
            continue
        g = groups.setdefault(group, {"group": group, "desc": None, "backend": ident.backend,
                                      "ranks": [], "size": None, "ranks_complete": False})
        if row.desc and not g["desc"]:
            g["desc"] = row.desc
        if row.ranks and not g["ranks_complete"]:
            if row.complete:
                g["ranks"], g["ranks_complete"] = list(row.ranks), True
            else:
                g["ranks"] = sorted(set(g["ranks"]) | set(row.ranks))
        if row.nranks is not None and g["size"] is None:
            g["size"] = row.nranks
    for row in shared:
        g = groups.get(row.group) if row.group is not None else None
        if row.nranks is None and g is not None:
            row.nranks = g["size"]
        _finish_p2p_and_splits(row, g)  # type: ignore[arg-type]
    if assumed:
        stats.warnings.append("no process-group info in the trace: collectives assigned to the "
                              "default group '0'")
        g = groups["0"]
        if g["desc"] is None:
            g["desc"] = "default_pg (assumed)"
        if not g["ranks"] and ident.world_size:
            g["ranks"], g["ranks_complete"] = list(range(ident.world_size)), True
        if g["size"] is None:
            g["size"] = ident.world_size
        for row in shared:
            if row.group == "0" and row.nranks is None:
                row.nranks = g["size"]


def _counts_within(codes: np.ndarray) -> np.ndarray:
    """For each item, how many items before it have its code."""
    n = len(codes)
    order = np.argsort(codes, kind="stable")
    sc = codes[order]
    starts = np.flatnonzero(np.r_[True, sc[1:] != sc[:-1]]) if n else np.empty(0, np.int64)
    lengths = np.diff(np.r_[starts, n])
    out = np.empty(n, np.int64)
    out[order] = np.arange(n) - np.repeat(starts, lengths)
    return out


def _shared_column(shared: list[_Row], name: str, typ: pa.DataType, take: np.ndarray) -> pa.Array:
    values = [getattr(r, name) for r in shared]
    if typ == pa.list_(pa.int64()):
        values = [list(v) if v is not None else None for v in values]
    return pa.array(values, typ).take(pa.array(take, pa.int64()))


def build_collectives(p1: Pass1, ident: Identity, steps: Steps,
                       groups: dict[str, dict[str, Any]], stats: SourceStats
                       ) -> tuple[dict[str, pa.Array], tuple[np.ndarray, np.ndarray]]:
    """The file's collectives as typed columns, and which collective each marker belongs to
    (marker ordinals, sorted, and their coll_ids). Rows are numbered in (issue, start, first
    marker) order; a row without a sequence number in its args gets its group's count so far."""
    ms: MarkerStore = p1.markers
    rows, ord_keys, ord_rows = _call_rows(ms, _collect_calls(p1))
    shared = rows.shared
    _complete_groups(shared, ident, groups, stats)
    n = len(rows)
    sh = rows.col("shared")
    order = np.lexsort((rows.col("first"), rows.col("ts"), rows.col("issue"))) if n else np.empty(0, np.int64)
    base = ident.rank * 2**32
    coll_id = base + np.arange(n, dtype=np.int64)
    coll_of_pos = np.empty(n, np.int64)
    coll_of_pos[order] = coll_id
    take = sh[order]
    group_code = {g: i for i, g in enumerate(dict.fromkeys(r.group for r in shared))}
    codes = np.asarray([group_code[r.group] for r in shared], np.int64)[take] if n else np.empty(0, np.int64)
    has_seq = rows.col("has_seq")[order].astype(bool)
    seq = np.where(has_seq, rows.col("seq")[order], _counts_within(codes))
    keys = np.frombuffer(ord_keys, np.int64) if len(ord_keys) else np.empty(0, np.int64)
    vals = coll_of_pos[np.frombuffer(ord_rows, np.int64)] if len(ord_rows) else np.empty(0, np.int64)
    korder = np.lexsort((vals, keys))
    keys, vals = keys[korder], vals[korder]
    first = np.ones(len(keys), bool)
    first[1:] = keys[1:] != keys[:-1]  # a marker of two calls (none should be) maps to the first
    keys, vals = keys[first], vals[first]
    ts = rows.col("ts")[order]
    gpu = np.asarray([r.gpu for r in shared], bool)[take] if n else np.empty(0, bool)
    corr = rows.col("kcorr")[order]
    step = steps.assign(ts, gpu, corr, corr >= 0) if n else np.empty(0, np.int64)
    string, int64 = pa.string(), pa.int64()
    cols: dict[str, pa.Array] = {
        "coll_id": pa.array(coll_id, int64),
        "rank": pa.array(np.full(n, ident.rank, np.int64), int64),
        "group": _shared_column(shared, "group", string, take),
        "seq": pa.array(seq, int64),
        "op": _shared_column(shared, "op", string, take),
        "dtype": _shared_column(shared, "dtype", string, take),
        "in_bytes": _shared_column(shared, "in_bytes", int64, take),
        "out_bytes": _shared_column(shared, "out_bytes", int64, take),
        "nranks": _shared_column(shared, "nranks", pa.int32(), take),
        "peer": _shared_column(shared, "peer", pa.int32(), take),
        "in_splits": _shared_column(shared, "in_splits", pa.list_(int64), take),
        "out_splits": _shared_column(shared, "out_splits", pa.list_(int64), take),
        "ts_ns": pa.array(ts + ident.base_ns, int64),
        "dur_ns": pa.array(rows.col("end")[order] - ts, int64),
        "state": pa.array(["completed"] * n, string),
        "source": pa.array([SOURCE] * n, string),
        "seq_explicit": pa.array(has_seq, pa.bool_()),
        "name": _shared_column(shared, "name", string, take),
        "lane": _shared_column(shared, "lane", string, take),
        "step": pa.array(step.astype(np.int32), pa.int32(), mask=step < 0),
        "comms_id": _shared_column(shared, "comms_id", string, take),
        "dim_hint": _shared_column(shared, "dim_hint", string, take),
        "algo": _shared_column(shared, "algo", string, take),
    }
    return cols, (keys, vals)


def _backend(cfg: Any) -> str | None:
    if not isinstance(cfg, str) or not cfg:
        return None
    names = {part.split(":", 1)[-1] for part in cfg.split(",") if part}
    return ",".join(sorted(names)) if names else None


def groups_from_config(ident: Identity) -> dict[str, dict[str, Any]]:
    groups: dict[str, dict[str, Any]] = {}
    for g in ident.pg_config:
        name = _str(g.get("pg_name"))
        if name is None:
            continue
        ranks, complete = parse_rank_list(g.get("ranks"))
        size = as_int(g.get("pg_size"), "count")
        if size is not None and len(ranks) != size:
            complete = False
        desc = g.get("pg_desc")
        if desc is None and "uid" in g:
            desc = f"uid {g['uid']}"
        groups[name] = {"group": name, "desc": _str(desc),
                        "backend": _backend(g.get("backend_config")) or ident.backend,
                        "ranks": ranks, "size": size if size is not None else len(ranks) or None,
                        "ranks_complete": complete and bool(ranks)}
    return groups
