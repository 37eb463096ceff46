"""Parser for PyTorch Flight Recorder (FR) dumps: pickle (restricted unpickler) and JSON, every version.

A dump is one rank's ring buffer of recent collectives (see `shared/formats/nccl.md` §3). Each
entry becomes one `collectives` row (group = the global PG name, seq = `collective_seq_id`, or
`p2p_seq_id` for send/recv) and, when it has a duration, one `comm` event. Fields are read by
presence, not by version: the earliest dumps are a bare list of entries, later ones a dict with
`version`, `pg_config`, `pg_status` and `entries` (omitted from JSON when empty).

Rules worth knowing (docs/hang.md has the rest):

* rank: the dump's `rank` key, else the trailing integer of the file name (`rank_3`,
  `nccl_trace_rank_7`, the analyzer's rule), else the `rank` argument.
* state: the dump's `state` (completed|started|scheduled). Backends that record no events (gloo)
  leave every entry "scheduled" and signal completion only through `retired`; for them a
  retired entry is stored as "completed" (`fr_state` keeps the raw value). For NCCL a retired
  entry that never completed timed out and keeps its state.
* groups: from `pg_config` when it names ranks; gloo's is empty (`{"": ...}`), so groups are
  rebuilt from the entries' `process_group` names with only this rank listed
  (`ranks_complete` false); ingest unions the ranks over all dumps.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from tracekit._limits import MAX_DEPTH, MAX_WORLD_SIZE, DecompressionGuard, checked_int, json_depth
from tracekit.errors import InputError
from tracekit.parsers import _unpickle
from tracekit.parsers._stream import ByteStream
from tracekit.parsers.registry import Format
from tracekit.parsers.vocabulary import COLLECTIVE_OPS, dtype_bytes, parse_rank_list
from tracekit.store import ParseResult, SourceSink, SourceStats

NAME = "flight_recorder"
PARSER_VERSION = "1"
#: Largest (decompressed) dump we read; real dumps of a 2000-entry buffer with stacks are a few MB.
MAX_BYTES = _unpickle.MAX_BYTES
#: Longest string kept from a dump (names, descriptions, frames); longer ones are cut.
MAX_STRING = 4096
#: Most group member ranks kept over all groups of one dump (structures never follow a declared size).
MAX_LISTED_RANKS = 4 * MAX_WORLD_SIZE
#: coll_id = rank * 2**32 + COLL_ID_OFFSET + entry index: apart from Kineto's ids for the same rank.
COLL_ID_OFFSET = 1 << 31

#: Backends whose FR entries carry no start/end events: completion shows only as `retired`.
EVENTLESS_BACKENDS = frozenset({"gloo"})
_EVENTFUL_BACKENDS = frozenset({"nccl", "ncclx", "xccl", "rccl"})

_SNIFF_KEYS = (b"pg_config", b"pg_status", b"collective_seq_id", b"p2p_seq_id", b"profiling_name",
               b"time_created_ns", b"comm_lib_version", b"nccl_version", b"nccl_comm_state")
_JSON_KEY = re.compile(rb'"(' + b"|".join(_SNIFF_KEYS) + rb')"\s*:')
_TRAILING_INT = re.compile(r"(\d+)$")
_NAME_SUFFIXES = (".gz", ".json", ".pkl", ".pickle", ".pk", ".bin", ".txt")
_SEND = re.compile(r"(\d+)\s*->\s*(\d+)")
_RECV = re.compile(r"(\d+)\s*<-\s*(\d+)")
_SIZE_MAX = 2**62
_STATES = ("completed", "started", "scheduled")


@dataclass
class FlightRecorderResult(ParseResult):
    """What one Flight Recorder dump produced: the common result plus the dump's version."""

    version: str | None = None
    encoding: str | None = None
    backend: str | None = None


def sniff(head: bytes) -> bool:
    """True when the first (decompressed) bytes of a file look like a Flight Recorder dump."""
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return sum(1 for k in _SNIFF_KEYS if k in head) >= 2
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if text[:1] not in (b"{", b"["):
        return False
    return len({m.group(1) for m in _JSON_KEY.finditer(text)}) >= 2


def rank_from_name(path: str | os.PathLike[str]) -> int | None:
    """The rank a dump's file name ends with: `rank_3`, `rank_3.json`, `nccl_trace_rank_node1_12`."""
    name = Path(path).name
    changed = True
    while changed:
        changed = False
        for suffix in _NAME_SUFFIXES:
            if name.lower().endswith(suffix) and len(name) > len(suffix):
                name, changed = name[: -len(suffix)], True
    m = _TRAILING_INT.search(name)
    return int(m.group(1)) if m else None


def load_dump(path: str | os.PathLike[str], *, max_bytes: int = MAX_BYTES) -> tuple[Any, str]:
    """The decoded dump (gunzipped when needed) and its encoding, "pickle" or "json"."""
    dump, encoding, _ = _load_dump(path, max_bytes=max_bytes)
    return dump, encoding


def _load_dump(path: str | os.PathLike[str], *, max_bytes: int) -> tuple[Any, str, list[str]]:
    """`load_dump` and the warnings about keys a JSON dump gives more than once."""
    where = os.fspath(path)
    buf = bytearray()
    try:
        with ByteStream(where, guard=DecompressionGuard(max_out=max_bytes)) as stream:
            for chunk in stream.chunks():
                buf += chunk
                if len(buf) > max_bytes:
                    raise InputError(where, f"dump larger than the {max_bytes}-byte limit")
            if stream.limit:
                raise InputError(where, stream.limit)
            if stream.corrupt:
                raise InputError(where, stream.corrupt)
            if stream.truncated_gzip:
                raise InputError(where, "truncated gzip stream")
    except OSError as exc:
        raise InputError(where, f"cannot read ({exc.strerror or exc})") from exc
    data = bytes(buf)
    if not data.strip():
        raise InputError(where, "empty file")
    if data[0] == 0x80:
        return _unpickle.loads(data, path=where, max_bytes=max_bytes), "pickle", []
    text = data.lstrip(b"\xef\xbb\xbf \t\r\n")
    if text[:1] in (b"{", b"["):
        if json_depth(text) > MAX_DEPTH:
            raise InputError(where, f"JSON nested deeper than {MAX_DEPTH} levels")
        dups = _DuplicateKeys()
        try:
            doc = json.loads(text, object_pairs_hook=dups.hook)
            return dups.merged(doc), "json", dups.warnings()
        except RecursionError as exc:
            raise InputError(where, "JSON nested too deeply") from exc
        except ValueError as exc:
            what = "truncated" if _looks_truncated(exc, len(text)) else "corrupt"
            raise InputError(where, f"{what} JSON ({exc})") from exc
    return _unpickle.loads(data, path=where, max_bytes=max_bytes), "pickle", []


class _DuplicateKeys:
    """Keys a JSON object gives more than once (json keeps the last silently): the top level's
    `entries` arrays are all read (concatenated), every other repeat is named in a warning."""

    def __init__(self) -> None:
        self.objects = 0
        self.names: Counter[str] = Counter()
        self.top: list[str] = []
        self.arrays = 0
        self._last: list[tuple[str, Any]] = []

    def hook(self, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(pairs)
        if len(obj) != len(pairs):
            self.objects += 1
            self.names.update(k for k, n in Counter(k for k, _ in pairs).items() if n > 1)
        self._last = pairs
        return obj

    def merged(self, doc: Any) -> Any:
        """`doc` with the top level's repeated `entries` arrays joined; the top level's repeats
        are then told apart from the entries' own."""
        if not isinstance(doc, dict) or len(doc) == len(self._last):
            return doc
        self.objects -= 1
        counts = Counter(k for k, _ in self._last)
        for k, n in counts.items():
            if n > 1:
                self.names[k] -= 1
        self.names = +self.names
        arrays = [v for k, v in self._last if k == "entries"]
        if len(arrays) > 1 and all(isinstance(a, list) for a in arrays):
            self.arrays = len(arrays)
            doc["entries"] = [e for a in arrays for e in a]
        self.top = sorted(k for k, n in counts.items() if n > 1 and not (k == "entries" and self.arrays))
        return doc

    def warnings(self) -> list[str]:
        out = []
        if self.arrays:
            out.append(f"{self.arrays} entries arrays (a duplicated key): the entries of all were read")
        if self.top:
            out.append(f"top-level keys given more than once, the last value kept: {self.top[:5]}")
        if self.objects > 0:
            what = "object" if self.objects == 1 else "objects"
            out.append(f"{self.objects} {what} with keys given more than once, the last value kept "
                       f"({sorted(self.names)[:5]})")
        return out


def _looks_truncated(exc: ValueError, n: int) -> bool:
    pos = getattr(exc, "pos", None)
    return isinstance(pos, int) and pos >= n - 2


def parse(path: str | os.PathLike[str], sink: SourceSink, *, rank: int | None = None,
          max_bytes: int = MAX_BYTES) -> FlightRecorderResult:
    """Parse one Flight Recorder dump into `sink`; raise InputError when it cannot be used."""
    where = os.fspath(path)
    dump, encoding, warnings = _load_dump(where, max_bytes=max_bytes)
    if isinstance(dump, list):
        meta: dict[str, Any] = {}
        entries: Any = dump
    elif isinstance(dump, dict):
        if not any(k in dump for k in ("entries", "version", "pg_config", "pg_status")):
            raise InputError(where, "not a Flight Recorder dump (no version, entries or pg_config)")
        meta, entries = dump, dump.get("entries", [])
        if entries is None:
            entries = []
    else:
        raise InputError(where, f"not a Flight Recorder dump (top level is {type(dump).__name__})")
    if not isinstance(entries, (list, tuple)):
        raise InputError(where, f"`entries` is a {type(entries).__name__}, not a list")
    r = _int(meta.get("rank"))
    if r is None:
        r = rank_from_name(where)
    if r is None:
        r = rank
    if r is None:
        raise InputError(where, "no rank: the dump has no `rank` key and the file name ends in no "
                                "number; pass --rank")
    if checked_int(r, "rank") is None:
        raise InputError(where, f"rank {r} out of range (0..{MAX_WORLD_SIZE - 1})")
    builder = _Builder(where, sink, r, meta, encoding)
    builder.stats.warnings.extend(warnings)
    return builder.run(entries)


# --------------------------------------------------------------------------------------------


def _int(v: Any, kind: str = "id") -> int | None:
    return checked_int(v, kind)


def _ns(v: Any) -> int | None:
    """A discovered/created timestamp: null (pickle) and 0 (JSON) both mean "never"."""
    n = _int(v, "time_ns")
    return n if n is not None and n > 0 else None


def _str(v: Any) -> str | None:
    """A scalar as text (cut at MAX_STRING); containers are not names."""
    if v is None or isinstance(v, (list, tuple, dict, set, frozenset, bytes, bytearray)):
        return None
    s = v if isinstance(v, str) else str(v) if isinstance(v, (int, float)) and abs(v) < 1e30 else None
    if not s:
        return None
    return s if len(s) <= MAX_STRING else s[:MAX_STRING] + "…"


def _numel(shape: Any) -> int | None:
    if not isinstance(shape, (list, tuple)):
        return None
    n = 1
    for d in shape:
        d = _int(d, "size")
        if d is None:
            return None
        n *= d
        if n > _SIZE_MAX:
            return None
    return n


def _bytes(sizes: Any, dtypes: Any) -> int | None:
    """Total bytes of a tensor list given shapes ([[3, 4], [8]]) and dtype names per tensor."""
    if not isinstance(sizes, (list, tuple)):
        return None
    dts = list(dtypes) if isinstance(dtypes, (list, tuple)) else []
    total = 0
    for i, shape in enumerate(sizes):
        n = _numel(shape)
        dt = dts[i] if i < len(dts) else (dts[0] if dts else None)
        width = dtype_bytes(dt) if isinstance(dt, str) else None
        if n is None or width is None:
            return None
        total += n * width
        if total > _SIZE_MAX:
            return None
    return total


def _total_numel(sizes: Any) -> int | None:
    if not isinstance(sizes, (list, tuple)) or not sizes:
        return None
    parts = [_numel(s) for s in sizes]
    if any(p is None for p in parts):
        return None
    total = sum(parts)  # type: ignore[arg-type]
    return total if total <= _SIZE_MAX else None


def split_name(profiling_name: str | None) -> tuple[str | None, str, str]:
    """("nccl", "all_reduce", "") from "nccl:all_reduce"; ("nccl", "send", "0->1") from "nccl:send 0->1"."""
    if not profiling_name:
        return None, "", ""
    text = profiling_name.strip()
    backend = None
    if ":" in text.split(" ", 1)[0]:
        backend, text = text.split(":", 1)
        backend = backend.strip().lower() or None
    name, _, extra = text.strip().partition(" ")
    return backend, name, extra.strip()


def op_of(name: str) -> str:
    """The op vocabulary entry for an FR op name ("_allgather_base" -> all_gather)."""
    key = name.strip().lower()
    if key in COLLECTIVE_OPS:
        return COLLECTIVE_OPS[key]
    stripped = key.strip("_")
    if stripped in COLLECTIVE_OPS:
        return COLLECTIVE_OPS[stripped]
    for suffix in ("_coalesced", "_into_tensor", "_base", "_tensor"):
        if stripped.endswith(suffix) and stripped[: -len(suffix)] in COLLECTIVE_OPS:
            return COLLECTIVE_OPS[stripped[: -len(suffix)]]
    return "other"


def _top_frame(frames: Any) -> str | None:
    """The first stack frame outside torch (the user's call site), as "name at file:line"."""
    if not isinstance(frames, (list, tuple)):
        return None
    first = None
    for f in frames:
        if not isinstance(f, dict):
            continue
        fn = _str(f.get("filename")) or "?"
        text = f"{_str(f.get('name')) or '?'} at {fn}:{_str(f.get('line')) or '?'}"
        first = first or text
        if "/torch/" not in fn.replace("\\", "/") and not fn.startswith("<"):
            return text
    return first


@dataclass
class _Group:
    name: str
    desc: str | None = None
    ranks: list[int] = field(default_factory=list)
    complete: bool = False
    backends: Counter[str] = field(default_factory=Counter)
    sizes: set[int] = field(default_factory=set)


class _Builder:
    """Turns the entries of one dump into table rows."""

    def __init__(self, path: str, sink: SourceSink, rank: int, meta: dict[str, Any], encoding: str) -> None:
        self.path, self.sink, self.rank, self.meta, self.encoding = path, sink, rank, meta, encoding
        self.stats = SourceStats()
        self.groups = self._config_groups(meta.get("pg_config"))
        self.rows: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []

    def _config_groups(self, cfg: Any) -> dict[str, _Group]:
        groups: dict[str, _Group] = {}
        if not isinstance(cfg, dict):
            return groups
        unusable = 0
        listed = 0
        for key, g in cfg.items():
            if not isinstance(g, dict):
                unusable += 1
                continue
            name = _str(g.get("name")) or _str(key)
            ranks, complete = parse_rank_list(g.get("ranks"))
            listed += len(ranks)
            if listed > MAX_LISTED_RANKS:
                self.stats.warnings.append(f"pg_config lists more than {MAX_LISTED_RANKS:,} member ranks; "
                                           "the remaining groups are rebuilt from the entries")
                break
            if not name or not ranks:
                unusable += 1
                continue
            groups[name] = _Group(name, _str(g.get("desc")), sorted(set(ranks)), complete)
        if unusable and not groups:
            self.stats.warnings.append("pg_config names no ranks (gloo records it before the groups "
                                       "exist): groups rebuilt from the entries' process_group")
        return groups

    def run(self, entries: list[Any] | tuple[Any, ...]) -> FlightRecorderResult:
        eventless = self._eventless(entries)
        for index, entry in enumerate(entries):
            try:
                reason = self._entry(index, entry, eventless)
            except (TypeError, ValueError, AttributeError, OverflowError, KeyError):
                reason = "invalid_entry"
            if reason is not None:
                self.stats.skip(reason)
        self._fill_sizes()
        try:
            self._write()
        except (pa.ArrowException, OverflowError, ValueError, TypeError) as exc:
            raise InputError(self.path, f"values out of range for the tables ({exc})") from exc
        ts = [r["ts_ns"] for r in self.rows if r["ts_ns"] is not None]
        ends = [r["ts_ns"] + (r["dur_ns"] or 0) for r in self.rows if r["ts_ns"] is not None]
        if self.stats.skipped.get("no_duration"):
            self.stats.warnings.append(
                f"{self.stats.skipped['no_duration']} entries have no duration (gloo records none; NCCL "
                "needs TORCH_NCCL_ENABLE_TIMING=1): they are collectives rows without a timeline event")
        backends = Counter(b for g in self.groups.values() for b in g.backends.elements())
        return FlightRecorderResult(
            stats=self.stats, rank=self.rank, events=len(self.events), collectives=len(self.rows),
            groups=len(self.groups), ts_min_ns=min(ts) if ts else None, ts_max_ns=max(ends) if ends else None,
            version=_str(self.meta.get("version")), encoding=self.encoding,
            backend=backends.most_common(1)[0][0] if backends else None)

    def _eventless(self, entries: list[Any] | tuple[Any, ...]) -> bool:
        """Whether this dump's backend records no start/end events (so `retired` means done)."""
        backends = set()
        for e in entries:
            if isinstance(e, dict):
                if _ns(e.get("time_discovered_started_ns")) or _ns(e.get("time_discovered_completed_ns")):
                    return False
                if e.get("state") in ("started", "completed"):
                    return False
                b, _, _ = split_name(_str(e.get("profiling_name")))
                if b:
                    backends.add(b)
        if backends & EVENTLESS_BACKENDS:
            return True
        return bool(backends) and not (backends & _EVENTFUL_BACKENDS)

    def _entry(self, index: int, e: Any, eventless: bool) -> str | None:
        if not isinstance(e, dict):
            return "invalid_entry"
        pg = e.get("process_group")
        if isinstance(pg, (list, tuple)) and pg and _str(pg[0]) is not None:
            group, desc = str(pg[0]), _str(pg[1]) if len(pg) > 1 else None
        elif _int(e.get("pg_id")) is not None:
            group, desc = f"pg_id:{_int(e.get('pg_id'))}", None
            msg = "entries without process_group: grouped by the per-process pg_id (not comparable across ranks)"
            if msg not in self.stats.warnings:
                self.stats.warnings.append(msg)
        else:
            return "no_process_group"
        pname = _str(e.get("profiling_name"))
        backend, opname, extra = split_name(pname)
        op = op_of(opname) if opname else "other"
        is_p2p = bool(e.get("is_p2p")) or op in ("send", "recv")
        seq = _int(e.get("p2p_seq_id")) if is_p2p else None
        if seq is None:
            seq = _int(e.get("collective_seq_id"))
        if seq is None:
            seq = _int(e.get("seq_id"))
        if seq is None:
            return "no_seq"
        g = self.groups.get(group)
        if g is None:
            g = self.groups[group] = _Group(group, desc, [self.rank], False)
        if g.desc is None and desc:
            g.desc = desc
        if backend:
            g.backends[backend] += 1
        in_dt, out_dt = e.get("input_dtypes"), e.get("output_dtypes")
        in_sizes, out_sizes = e.get("input_sizes"), e.get("output_sizes")
        dtype = None
        for dts in (in_dt, out_dt):
            if isinstance(dts, (list, tuple)) and dts and isinstance(dts[0], str):
                dtype = dts[0]
                break
        in_b, out_b = _bytes(in_sizes, in_dt), _bytes(out_sizes, out_dt)
        if op in ("all_gather", "reduce_scatter"):
            a, b = _total_numel(in_sizes), _total_numel(out_sizes)
            if op == "reduce_scatter":
                a, b = b, a
            if a and b and b % a == 0 and 1 <= b // a <= MAX_WORLD_SIZE and len(g.sizes) < 64:
                g.sizes.add(b // a)
        m = _SEND.search(extra) if op == "send" else _RECV.search(extra) if op == "recv" else None
        peer_local = int(m.group(2)) if m and len(m.group(2)) < 10 else None
        raw_state = _str(e.get("state"))
        state = raw_state if raw_state in _STATES else "unknown"
        retired = e.get("retired")
        retired = bool(retired) if isinstance(retired, bool) else None
        if eventless and retired and state != "completed":
            state = "completed"
        created = _ns(e.get("time_created_ns"))
        if created is None and _ns(e.get("time_created_us")) is not None:
            created = _ns(_ns(e.get("time_created_us")) * 1000)  # type: ignore[operator]
        started = _ns(e.get("time_discovered_started_ns"))
        completed = _ns(e.get("time_discovered_completed_ns"))
        dur = None
        d_ms = e.get("duration_ms")
        if isinstance(d_ms, (int, float)) and not isinstance(d_ms, bool) and math.isfinite(d_ms) and d_ms >= 0:
            dur = _int(round(d_ms * 1e6), "duration_ns") if d_ms < 1e12 else None
        elif started is not None and completed is not None and completed >= started:
            dur = _int(completed - started, "duration_ns")
        ts = started if started is not None else created
        coll_id = self.rank * 2**32 + COLL_ID_OFFSET + index
        lane = f"fr/{group}"
        self.rows.append({
            "coll_id": coll_id, "rank": self.rank, "group": group, "seq": seq, "op": op, "dtype": dtype,
            "in_bytes": in_b, "out_bytes": out_b, "peer_local": peer_local, "ts_ns": ts, "dur_ns": dur,
            "state": state, "seq_explicit": True, "name": pname, "lane": lane,
            "record_id": _int(e.get("record_id")), "op_id": _int(e.get("op_id")), "retired": retired,
            "fr_state": raw_state[:64] if raw_state else raw_state, "timeout_ms": _int(e.get("timeout_ms")),
            "time_created_ns": created, "is_p2p": is_p2p, "frame": _top_frame(e.get("frames")),
        })
        if dur is None or ts is None:
            return "no_duration"
        self.events.append({"rank": self.rank, "lane": lane, "kind": "comm", "name": pname or op,
                            "ts_ns": ts, "dur_ns": dur, "coll_id": coll_id, "cat": "flight_recorder"})
        self.stats.store()
        return None

    def _fill_sizes(self) -> None:
        """nranks and global peers from the group sizes/ranks known (pg_config or all_gather shapes)."""
        for row in self.rows:
            g = self.groups[row["group"]]
            size = len(g.ranks) if g.complete and g.ranks else (next(iter(g.sizes)) if len(g.sizes) == 1 else None)
            row["nranks"] = size
            pl_ = row["peer_local"]
            row["peer"] = g.ranks[pl_] if (pl_ is not None and g.complete and 0 <= pl_ < len(g.ranks)) else None

    def _write(self) -> None:
        rows = self.rows
        if rows:
            cols = {k: [r[k] for r in rows] for k in rows[0]}
            types = {"coll_id": pa.int64(), "rank": pa.int32(), "group": pa.string(), "seq": pa.int64(),
                     "op": pa.string(), "dtype": pa.string(), "in_bytes": pa.int64(), "out_bytes": pa.int64(),
                     "nranks": pa.int32(), "peer": pa.int32(), "peer_local": pa.int32(), "ts_ns": pa.int64(),
                     "dur_ns": pa.int64(), "state": pa.string(), "seq_explicit": pa.bool_(),
                     "name": pa.string(), "lane": pa.string(), "record_id": pa.int64(), "op_id": pa.int64(),
                     "retired": pa.bool_(), "fr_state": pa.string(), "timeout_ms": pa.int64(),
                     "time_created_ns": pa.int64(), "is_p2p": pa.bool_(), "frame": pa.string()}
            data = {k: pa.array(cols[k], types[k]) for k in types}
            data["source"] = pa.array([NAME] * len(rows), pa.string())
            self.sink.add("collectives", data)
        if self.events:
            ev = self.events
            self.sink.add("events", {
                "rank": pa.array([e["rank"] for e in ev], pa.int32()),
                "lane": pa.array([e["lane"] for e in ev], pa.string()),
                "kind": pa.array([e["kind"] for e in ev], pa.string()),
                "name": pa.array([e["name"] for e in ev], pa.string()),
                "ts_ns": pa.array([e["ts_ns"] for e in ev], pa.int64()),
                "dur_ns": pa.array([e["dur_ns"] for e in ev], pa.int64()),
                "coll_id": pa.array([e["coll_id"] for e in ev], pa.int64()),
                "cat": pa.array([e["cat"] for e in ev], pa.string()),
            })
        groups = [self.groups[k] for k in sorted(self.groups, key=_group_order)]
        if groups:
            self.sink.add("groups", {
                "group": pa.array([g.name for g in groups], pa.string()),
                "desc": pa.array([g.desc for g in groups], pa.string()),
                "backend": pa.array([g.backends.most_common(1)[0][0] if g.backends else None for g in groups],
                                    pa.string()),
                "ranks": pa.array([g.ranks for g in groups], pa.list_(pa.int32())),
                "size": pa.array([len(g.ranks) if g.complete else (next(iter(g.sizes)) if len(g.sizes) == 1
                                                                    else None) for g in groups], pa.int32()),
                "dims": pa.array([[] for _ in groups], pa.list_(pa.string())),
                "ranks_complete": pa.array([g.complete for g in groups], pa.bool_()),
            })
        world = None
        for g in self.groups.values():
            if g.name == "0" or g.desc == "default_pg":
                world = len(g.ranks) if g.complete else (next(iter(g.sizes)) if len(g.sizes) == 1 else None)
                break
        backends = Counter(b for g in self.groups.values() for b in g.backends.elements())
        version = _str(self.meta.get("comm_lib_version")) or _str(self.meta.get("nccl_version"))
        host = self.meta.get("hostname")
        self.sink.add("ranks", {
            "rank": pa.array([self.rank], pa.int32()),
            "world_size": pa.array([world], pa.int32()),
            "host": pa.array([_str(host) if isinstance(host, str) else None], pa.string()),
            "pid": pa.array([_int(self.meta.get("pid"))], pa.int64()),
            "source_file": pa.array([self.path], pa.string()),
            "source_format": pa.array([NAME], pa.string()),
            "clock_offset_ns": pa.nulls(1, pa.int64()),
            "backend": pa.array([backends.most_common(1)[0][0] if backends else None], pa.string()),
            "nccl_version": pa.array([version], pa.string()),
        })


def _group_order(name: str) -> tuple[int, int, str]:
    return (0, int(name), "") if name.isascii() and name.isdigit() and len(name) < 19 else (1, 0, name)


FORMAT = Format(name=NAME, description="Flight Recorder dumps", version=PARSER_VERSION, parse=parse,
                sniffs=(lambda head: sniff(head.data),),
                priority=2, snapshot=True)
