"""Why did the job hang? Cross-rank checks of per-group sequence numbers (Flight Recorder, NCCL logs).

Pure functions over the `collectives` and `groups` tables. For every process group:

* the last seq each rank reached (any state) and the last one it completed;
* the first seq at which the ranks diverge: a rank stopped short of it (it never issued it), or
  the ranks that issued it disagree on op, dtype or size;
* who to look at: the ranks that never issued the first divergent seq, or the minority of a
  mismatch (never "whoever differs from the first rank read": the stock analyzer's habit).

Read order never matters: everything is keyed by (group, seq, rank) and ties are broken by value.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np
import polars as pl
import pyarrow as pa
from msgspec import UNSET, UnsetType

from tracekit._text import fmt_ranks, one_line
from tracekit.finding import Finding
from tracekit.results import Result

__all__ = ["GroupHang", "HangResult", "Location", "LogMessage", "find_hangs", "fmt_ranks", "hang_from_run"]

_STATE_ORDER = {"completed": 3, "started": 2, "scheduled": 1, "unknown": 0}
#: ops whose input and output sizes must agree on every rank (all_to_all, gather, scatter may differ).
_SIZE_CHECKED = frozenset({"all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "barrier"})
#: rooted ops can complete on some ranks (the root) before every rank joined.
_ROOTED = frozenset({"broadcast", "reduce", "gather", "scatter", "send", "recv", "other"})
MAX_MISMATCHES = 10
_COLS = ("coll_id", "rank", "group", "seq", "op", "dtype", "in_bytes", "out_bytes", "state", "ts_ns",
         "source", "seq_explicit", "frame", "is_p2p", "peer", "time_created_ns", "op_id")


@dataclass(frozen=True)
class _Row:
    rank: int
    seq: int
    op: str
    dtype: str | None
    in_bytes: int | None
    out_bytes: int | None
    state: str
    ts: int | None
    frame: str | None

    @property
    def size(self) -> str:
        return f"in={_b(self.in_bytes)} out={_b(self.out_bytes)}"


class MismatchValue(Result, frozen=True, kw_only=True):
    """One value a mismatched field took, and the ranks that used it."""

    value: Any
    ranks: list[int]


class Mismatch(Result, frozen=True, kw_only=True):
    """At `seq`, the ranks of a group disagree on `field` (op, dtype or size): the majority value,
    the ranks that differ from it, and every value with its ranks."""

    seq: int
    field: str
    majority: Any
    minority_ranks: list[int]
    values: list[MismatchValue]


class GroupHang(Result, frozen=True, kw_only=True):
    """The verdict on one process group. `first_ts_ns` is when the first divergent seq was issued
    (the earliest rank's clock): what orders the groups' divergences in time."""

    group: str
    desc: str | None
    ranks: list[int]
    ranks_complete: bool
    last_seq: dict[int, int]
    last_completed_seq: dict[int, int | None]
    last_p2p_seq: dict[int, int] = msgspec.field(default_factory=dict)
    first_divergent_seq: int | None
    missing_ranks: list[int]
    no_dump_ranks: list[int]
    mismatches: list[Mismatch]
    status: str
    suspects: list[int] = msgspec.field(default_factory=list)
    verdict: str
    first_ts_ns: int | None = None


class Location(Result, frozen=True, kw_only=True):
    """Where a rank ran, as far as its traces say (a field left out when none names it)."""

    host: str | UnsetType = UNSET
    local_device: int | UnsetType = UNSET
    pid: int | UnsetType = UNSET
    bus_id: str | UnsetType = UNSET


class LogMessage(Result, frozen=True, kw_only=True):
    """A warning, error or watchdog timeout a rank involved in a hang logged (a `log_messages` row;
    a column the table lacks is left out)."""

    rank: int
    host: str | UnsetType | None = UNSET
    pid: int | UnsetType | None = UNSET
    ts_ns: int | UnsetType | None = UNSET
    level: str | UnsetType | None = UNSET
    subsystem: str | UnsetType | None = UNSET
    message: str | UnsetType | None = UNSET
    line: int | UnsetType | None = UNSET
    location: str | UnsetType | None = UNSET


class HangResult(Result, frozen=True, kw_only=True):
    """Per-group verdicts plus the findings (kind "hang"), most likely root cause first.

    `last_seq` ({group: {rank: last seq}}, what the report's hang table colours) and `suspects`
    (the blamed ranks, from the earliest divergence on) follow from the groups: `__post_init__`
    sets them, whatever was given."""

    groups: list[GroupHang]
    findings: list[Finding]
    last_seq: dict[str, dict[int, int]] = msgspec.field(default_factory=dict)
    suspects: list[int] = msgspec.field(default_factory=list)
    source: str
    notes: list[str] = msgspec.field(default_factory=list)
    locations: dict[int, Location] = msgspec.field(default_factory=dict)
    messages: list[LogMessage] = msgspec.field(default_factory=list)

    def __post_init__(self) -> None:
        msgspec.structs.force_setattr(self, "last_seq", {g.group: dict(sorted(g.last_seq.items()))
                                                         for g in self.groups})
        suspects: list[int] = []
        for g in _by_time(self.groups):
            suspects.extend(r for r in g.suspects if r not in suspects)
        msgspec.structs.force_setattr(self, "suspects", suspects)
        msgspec.structs.force_setattr(self, "locations", dict(sorted(self.locations.items())))

    def where(self, rank: int) -> str:
        """ "host node-3, GPU 2 (pid 1234)" for a rank whose host or GPU is known, else ""."""
        loc = self.locations.get(rank, Location())
        parts = []
        if loc.host:
            parts.append(f"host {loc.host}")
        if loc.local_device is not UNSET:
            parts.append(f"GPU {loc.local_device}")
        text = ", ".join(parts)
        if text and loc.pid is not UNSET:
            text += f" (pid {loc.pid})"
        return text

    @property
    def hung(self) -> bool:
        return any(g.status in ("hang", "mismatch") for g in self.groups)


def _b(n: int | None) -> str:
    return "?" if n is None else f"{n}B"


def _rk(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + fmt_ranks(ranks)


def _gname(group: str, desc: str | None) -> str:
    return f"group {group} ({desc})" if desc and desc != group else f"group {group}"


_STR_COLS = ("group", "op", "dtype", "state", "source", "frame")
_DEFAULTS: dict[str, pl.DataType] = {
    "op": pl.String(), "dtype": pl.String(), "in_bytes": pl.Int64(), "out_bytes": pl.Int64(), "state": pl.String(),
    "ts_ns": pl.Int64(), "source": pl.String(), "seq_explicit": pl.Boolean(), "frame": pl.String(),
    "is_p2p": pl.Boolean(), "time_created_ns": pl.Int64(), "op_id": pl.Int64(),
}


def _frame(collectives: pa.Table | Any) -> tuple[pl.DataFrame, str]:
    """The rows to check (one per group, p2p?, seq, rank) and which source they came from."""
    if isinstance(collectives, pa.Table):
        t = collectives.select([c for c in _COLS if c in collectives.column_names])
        for name in _STR_COLS:
            if name in t.column_names and pa.types.is_dictionary(t.schema.field(name).type):
                t = t.set_column(t.schema.get_field_index(name), name, t.column(name).cast(pa.string()))
        df = pl.from_arrow(t)
    else:
        df = collectives.select([c for c in _COLS if c in collectives.columns])
    assert isinstance(df, pl.DataFrame)
    for name, dtype in _DEFAULTS.items():
        if name not in df.columns:
            df = df.with_columns(pl.lit(None, dtype).alias(name))
    df = df.with_columns([pl.col(c).cast(pl.String) for c in _STR_COLS if c in df.columns]).filter(
        pl.col("seq").is_not_null() & pl.col("group").is_not_null() & pl.col("rank").is_not_null())
    source = "call order within the traced window"
    if df.height and (df["source"] == "flight_recorder").any():
        df, source = df.filter(pl.col("source") == "flight_recorder"), "flight_recorder"
    elif df.height and (df["source"] == "nccl_log").any():
        df, source = df.filter(pl.col("source") == "nccl_log"), "nccl_log"
    elif df.height and df["seq_explicit"].fill_null(False).any():
        df, source = df.filter(pl.col("seq_explicit").fill_null(False)), "explicit sequence numbers"
    df = df.select(
        pl.col("group"), pl.col("rank").cast(pl.Int64), pl.col("seq").cast(pl.Int64),
        (pl.col("is_p2p").fill_null(False) | pl.col("op").is_in(["send", "recv"]).fill_null(False)).alias("p2p"),
        pl.col("op").fill_null("other"), pl.col("dtype"), pl.col("in_bytes").cast(pl.Int64),
        pl.col("out_bytes").cast(pl.Int64), pl.col("state").fill_null("unknown"),
        pl.coalesce(pl.col("time_created_ns").cast(pl.Int64), pl.col("ts_ns").cast(pl.Int64)).alias("ts"),
        pl.col("frame"), pl.col("op_id").cast(pl.Int64))
    # one row per (group, seq, rank): a coalesced group (several ops, one seq) is represented by its
    # first op; a rank read twice (pickle + JSON, or two dumps) keeps its most advanced state
    df = df.with_columns(pl.col("state").replace_strict(_STATE_ORDER, default=0, return_dtype=pl.Int64)
                         .alias("_st")).sort(
        ["group", "p2p", "seq", "rank", "op_id", "_st", "ts", "op", "dtype", "in_bytes", "out_bytes", "frame"],
        descending=[False, False, False, False, False, True, True, False, False, False, False, False],
        nulls_last=True,
    ).unique(subset=["group", "p2p", "seq", "rank"], keep="first", maintain_order=True)
    # gloo retires work lazily, so a dump can race the bookkeeping: an op followed by a completed
    # op on the same rank was done
    done_ts = df.filter(pl.col("state") == "completed").group_by("rank").agg(pl.col("ts").max().alias("_done"))
    df = df.join(done_ts, on="rank", how="left").with_columns(
        pl.when((pl.col("state") != "completed") & (pl.col("_done") > pl.col("ts")))
        .then(pl.lit("completed")).otherwise(pl.col("state")).alias("state")).drop("_done", "_st")
    return df, source


class _Track:
    """One group's collective (or p2p) sequence: per-rank last/completed seqs, plus the rows fetched
    for the seqs a verdict needs."""

    def __init__(self) -> None:
        self.last: dict[int, int] = {}
        self.done: dict[int, int | None] = {}
        self.lowest: int | None = None
        self.t_low: int | None = None
        self.candidates: list[int] = []
        self.rows: dict[int, dict[int, _Row]] = {}
        self.seqs: np.ndarray = np.zeros(0, np.int64)

    def next_after(self, seq: int) -> int:
        """The first seq after `seq` that some rank reached (seqs may have gaps: NCCL's opCount
        also counts the point-to-point calls of a communicator)."""
        i = int(np.searchsorted(self.seqs, seq, side="right"))
        return int(self.seqs[i]) if i < len(self.seqs) else seq + 1

    def __bool__(self) -> bool:
        return bool(self.last)

    def at(self, seq: int) -> dict[int, _Row]:
        return self.rows.get(seq, {})

    def row(self, rank: int, seq: int) -> _Row | None:
        return self.rows.get(seq, {}).get(rank)


def _tracks(df: pl.DataFrame) -> dict[str, dict[bool, _Track]]:
    """Per group and track: the aggregates in polars; rows only where a verdict will look."""
    tracks: dict[str, dict[bool, _Track]] = defaultdict(lambda: {False: _Track(), True: _Track()})
    keys = ["group", "p2p"]
    lasts = df.group_by([*keys, "rank"]).agg(
        pl.col("seq").max().alias("last"), pl.col("seq").filter(pl.col("state") == "completed").max().alias("done"))
    for g, p2p, rank, last, done in lasts.iter_rows():
        t = tracks[g][p2p]
        t.last[rank], t.done[rank] = last, done
    lows = df.group_by(keys).agg(pl.col("seq").min().alias("lowest"))
    t_low = df.join(lows, on=keys).filter((pl.col("seq") == pl.col("lowest")) & (pl.col("ts") > 0)).group_by(
        keys).agg(pl.col("ts").min())
    for g, p2p, lowest in lows.iter_rows():
        tracks[g][p2p].lowest = lowest
    for g, p2p, seqs in df.group_by(keys).agg(pl.col("seq").unique().sort()).iter_rows():
        tracks[g][p2p].seqs = np.asarray(seqs, np.int64)
    for g, p2p, ts in t_low.iter_rows():
        tracks[g][p2p].t_low = ts
    size = pl.when(pl.col("op").is_in(list(_SIZE_CHECKED)) & (pl.col("in_bytes").is_not_null()
                                                              | pl.col("out_bytes").is_not_null())).then(
        pl.format("in={}B out={}B", pl.col("in_bytes").fill_null(-1), pl.col("out_bytes").fill_null(-1)))
    cands = df.filter(~pl.col("p2p")).group_by(["group", "seq"]).agg(
        pl.len().alias("n"), pl.col("op").n_unique().alias("n_op"),
        pl.col("dtype").drop_nulls().n_unique().alias("n_dt"), size.drop_nulls().n_unique().alias("n_size"),
    ).filter((pl.col("n") >= 2) & ((pl.col("n_op") > 1) | (pl.col("n_dt") > 1) | (pl.col("n_size") > 1))).sort(
        ["group", "seq"])
    for g, seq in cands.select("group", "seq").iter_rows():
        t = tracks[g][False]
        if len(t.candidates) < 3 * MAX_MISMATCHES:
            t.candidates.append(seq)
    wanted: set[tuple[str, bool, int]] = set()
    for g, pair in tracks.items():
        for p2p, t in pair.items():
            if not t:
                continue
            hi = max(t.last.values())
            lows = {*t.last.values(), (t.lowest if t.lowest is not None else min(t.last.values())) - 1}
            for s in {*t.candidates, *(t.next_after(v) for v in lows), hi, t.lowest or min(lows)}:
                wanted.add((g, p2p, s))
    full = pl.DataFrame(sorted(wanted), schema={"group": pl.String, "p2p": pl.Boolean, "seq": pl.Int64},
                        orient="row")
    own = lasts.select("group", "p2p", "rank", pl.col("last").alias("seq"))
    picked = pl.concat([df.join(full, on=[*keys, "seq"]), df.join(own, on=[*keys, "rank", "seq"])]).unique(
        subset=[*keys, "seq", "rank"], keep="first", maintain_order=True)
    for r in picked.iter_rows(named=True):
        row = _Row(r["rank"], r["seq"], r["op"], r["dtype"], r["in_bytes"], r["out_bytes"], r["state"], r["ts"],
                   r["frame"])
        tracks[r["group"]][r["p2p"]].rows.setdefault(r["seq"], {})[r["rank"]] = row
    return tracks


def _group_info(groups: pa.Table | Any | None) -> dict[str, dict[str, Any]]:
    if groups is None:
        return {}
    if not isinstance(groups, pa.Table):
        groups = groups.to_arrow()
    info: dict[str, dict[str, Any]] = {}
    for g in groups.select([c for c in ("group", "desc", "ranks", "ranks_complete")
                            if c in groups.column_names]).to_pylist():
        name = g.get("group")
        if name is None:
            continue
        cur = info.setdefault(str(name), {"desc": None, "ranks": set(), "complete": False})
        cur["desc"] = cur["desc"] or g.get("desc")
        ranks = set(g.get("ranks") or [])
        if g.get("ranks_complete"):
            if not cur["complete"]:
                cur["ranks"], cur["complete"] = ranks, True
        elif not cur["complete"]:
            cur["ranks"] |= ranks
    return info


def find_hangs(collectives: pa.Table | Any, groups: pa.Table | Any | None = None, *,
               ranks: pa.Table | Any | None = None, messages: pa.Table | Any | None = None) -> HangResult:
    """Per group: last seq per rank, the first divergent seq, missing ranks and op/dtype/size mismatches.

    `collectives` and `groups` are tracekit tables (Arrow or polars); `ranks`, when given, tells
    which ranks left a dump at all (a member without one cannot be judged) and where each rank ran
    (host, GPU). Flight Recorder rows are used when present, else NCCL-log rows (opCount per
    commId), else rows with explicit sequence numbers, else all rows. `messages` (the
    `log_messages` table) adds the NCCL warnings and watchdog timeouts of the ranks involved.
    """
    df, source = _frame(collectives)
    ginfo = _group_info(groups)
    dumped: set[int] = set(df["rank"].unique().to_list())
    if ranks is not None:
        rt = ranks if isinstance(ranks, pa.Table) else ranks.to_arrow()
        fmt = rt.column("source_format").cast(pa.string()).to_pylist() if "source_format" in rt.column_names \
            else [None] * rt.num_rows
        dumped |= {int(r) for r, f in zip(rt.column("rank").to_pylist(), fmt, strict=True)
                   if r is not None and (f is None or f == "flight_recorder" or source != "flight_recorder")}
    window = dict(df.filter(pl.col("ts") > 0).group_by("rank").agg(pl.col("ts").min()).iter_rows())
    tracks = _tracks(df)
    results = [_check_group(g, tracks[g], ginfo.get(g, {}), dumped, window) for g in sorted(tracks, key=_gorder)]
    result = HangResult(groups=results, findings=_findings(results, source), source=source,
                        locations=_locations(ranks) if ranks is not None else {})
    return _with_places_and_messages(result, messages)


def _locations(ranks: pa.Table | Any) -> dict[int, Location]:
    rt = ranks if isinstance(ranks, pa.Table) else ranks.to_arrow()
    cols = [c for c in ("rank", "host", "local_device", "pid", "bus_id") if c in rt.column_names]
    out: dict[int, dict[str, Any]] = {}
    for row in rt.select(cols).to_pylist():
        if row.get("rank") is None:
            continue
        cur = out.setdefault(int(row["rank"]), {})
        for k, v in row.items():
            if k != "rank" and v is not None and cur.get(k) is None:
                cur[k] = v
    return {r: Location(**v) for r, v in out.items() if v}


_MESSAGE_LEVELS = ("WARN", "ERROR", "ABORT")
MAX_MESSAGES_PER_RANK = 3


def _with_places_and_messages(result: HangResult, messages: pa.Table | Any | None) -> HangResult:
    """Name where the suspects ran, and add the warnings and watchdog timeouts logged by the ranks
    of the groups that did not end well (suspects first)."""
    bad = [g for g in result.groups if g.status in ("hang", "mismatch", "stuck")]
    if not bad:
        return result
    found = list(result.findings)
    lead = result.suspects
    for r in lead[:8]:
        where = result.where(r)
        if where:
            found.insert(min(1, len(found)) + lead.index(r),
                         Finding(kind="hang", text=f"Rank {r} ran on {where}.", ranks=(r,)))
    logged: list[LogMessage] = []
    mt = None if messages is None else messages if isinstance(messages, pa.Table) else messages.to_arrow()
    if mt is None or mt.num_rows == 0 or "rank" not in mt.column_names:
        return msgspec.structs.replace(result, findings=found)
    involved = [*lead, *sorted({r for g in bad for r in g.ranks} - set(lead))]
    wanted = set(involved)
    cols = [c for c in ("rank", "host", "pid", "ts_ns", "level", "subsystem", "message", "line", "location")
            if c in mt.column_names]
    per_rank: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in mt.select(cols).to_pylist():
        r = row.get("rank")
        level = str(row.get("level") or "")
        sub = str(row.get("subsystem") or "")
        notable = level in _MESSAGE_LEVELS or sub == "watchdog" or (
            sub == "lifecycle" and "Abort" in str(row.get("message") or ""))
        if r is None or int(r) not in wanted or not notable:
            continue
        per_rank[int(r)].append(row)
    for r in involved:
        rows = sorted(per_rank.get(r, []), key=lambda m: (m.get("ts_ns") is None, m.get("ts_ns") or 0,
                                                          m.get("line") or 0))
        if not rows:
            continue
        logged.extend(LogMessage(**{**m, "rank": r}) for m in rows[:MAX_MESSAGES_PER_RANK * 10])
        where = result.where(r)
        who = f"rank {r}" + (f" ({where})" if where else "")
        watchdog = [m for m in rows if m.get("subsystem") == "watchdog"]
        warns = [m for m in rows if m.get("subsystem") != "watchdog"]
        if watchdog:
            found.append(Finding(kind="hang", severity="warning", ranks=(r,),
                                 text=f"{who}: PyTorch watchdog timeout: {_clip(watchdog[0]['message'])}"))
        if warns:
            first = warns[0]
            more = f" ({len(warns)} in all)" if len(warns) > 1 else ""
            line = f", line {first['line']}" if first.get("line") else ""
            found.append(Finding(kind="hang", severity="warning", ranks=(r,),
                                 text=f"{who} logged NCCL {first.get('level') or 'WARN'}{more}: "
                                 f"{_clip(first['message'])}{line}"))
    return msgspec.structs.replace(result, findings=found, messages=logged)


def _clip(text: Any, limit: int = 200) -> str:
    """One line of untrusted text, control characters escaped, cut to `limit` characters."""
    s = one_line(text)
    return s if len(s) <= limit else s[: limit - 1] + "…"


def _gorder(name: str) -> tuple[int, int, str]:
    return (0, int(name), "") if name.isdigit() else (1, 0, name)


def _majority(values: Mapping[int, Any]) -> tuple[Any, list[int], dict[Any, list[int]]]:
    """(majority value, minority ranks, value -> ranks). Ties go to the value held by the lowest rank,
    so the answer depends on the values only, never on the order they were read in."""
    by_value: dict[Any, list[int]] = defaultdict(list)
    for r in sorted(values):
        by_value[values[r]].append(r)
    top = sorted(by_value.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))
    major = top[0][0]
    minority = sorted(r for v, rs in by_value.items() if v != major for r in rs)
    return major, minority, dict(sorted(by_value.items(), key=lambda kv: kv[1][0]))


def _mismatches(track: _Track) -> list[Mismatch]:
    out: list[Mismatch] = []
    for seq in track.candidates:
        at = track.at(seq)
        if len(at) < 2:
            continue
        ops = {r: row.op for r, row in at.items()}
        major_op, minority, values = _majority(ops)
        if minority:
            out.append(_mm(seq, "op", major_op, minority, values))
        same = {r: row for r, row in at.items() if row.op == major_op}
        dts = {r: row.dtype for r, row in same.items() if row.dtype is not None}
        if len(set(dts.values())) > 1:
            out.append(_mm(seq, "dtype", *_majority(dts)))
        if major_op in _SIZE_CHECKED:
            sizes = {r: row.size for r, row in same.items() if row.in_bytes is not None or row.out_bytes is not None}
            if len(set(sizes.values())) > 1:
                out.append(_mm(seq, "size", *_majority(sizes)))
        if len({m.seq for m in out}) >= MAX_MISMATCHES:
            break
    return out


def _mm(seq: int, fieldname: str, major: Any, minority: list[int], values: dict[Any, list[int]]) -> Mismatch:
    return Mismatch(seq=seq, field=fieldname, majority=major, minority_ranks=minority,
                    values=[MismatchValue(value=v, ranks=rs) for v, rs in values.items()])


#: How ingest marks the default group it assumed for calls that name none (parsers/_kineto_calls.py).
ASSUMED_GROUP = "(assumed)"


def _check_group(group: str, tracks: dict[bool, _Track], info: Mapping[str, Any],
                 dumped: set[int], window: Mapping[int, int]) -> GroupHang:
    coll, p2p = tracks[False], tracks[True]
    desc = info.get("desc")
    members = set(info.get("ranks") or ()) | set(coll.last) | set(p2p.last)
    complete = bool(info.get("complete"))
    no_dump = sorted(members - dumped)
    judged = sorted(members & dumped)
    last: dict[int, int] = {}
    last_done: dict[int, int | None] = {}
    wrapped: list[int] = []
    if coll:
        lowest = coll.lowest if coll.lowest is not None else min(coll.last.values())
        for r in judged:
            if r in coll.last:
                last[r], last_done[r] = coll.last[r], coll.done.get(r)
            elif coll.t_low is not None and window.get(r) is not None and window[r] > coll.t_low:
                wrapped.append(r)  # its buffer starts after the group's earliest visible op: cannot tell
            else:
                last[r], last_done[r] = lowest - 1, None
    last_p2p = dict(sorted(p2p.last.items()))
    gname = _gname(group, desc)
    mismatches = _mismatches(coll)
    first_mm = min((m.seq for m in mismatches), default=None)
    first_missing = coll.next_after(min(last.values())) if last and min(last.values()) < max(last.values()) \
        else None
    candidates = [s for s in (first_mm, first_missing) if s is not None]
    first = min(candidates) if candidates else None
    missing = sorted(r for r, s in last.items() if first is not None and s < first)
    at_first = coll.at(first) if first is not None else {}
    first_ts = min((row.ts for row in at_first.values() if row.ts is not None), default=None)
    suspects: list[int] = []
    if not coll:
        status, verdict, suspects = _p2p_verdict(gname, p2p, members)
    elif first is None:
        status, verdict = _agreed_verdict(gname, coll, last)
    else:
        status, verdict, suspects = _divergent_verdict(gname, first, at_first, missing, coll, mismatches)
    if wrapped:
        verdict += (f" {_rk(wrapped)} recorded nothing on this group and their buffers start later: "
                    "not checked.")
    if no_dump and complete:
        verdict += f" No dump from {_rk(no_dump)}: not checked."
    if status in ("hang", "mismatch") and str(desc or "").endswith(ASSUMED_GROUP):
        verdict += (" The trace names no process group: calls were matched by their order on each rank, which "
                    "can pair unrelated calls, so this divergence may not be real.")
    return GroupHang(group=group, desc=desc, ranks=sorted(members), ranks_complete=complete,
                     last_seq={r: max(s, 0) for r, s in last.items()}, last_completed_seq=last_done,
                     first_divergent_seq=first, missing_ranks=missing, no_dump_ranks=no_dump,
                     mismatches=mismatches, status=status, verdict=verdict.strip(), suspects=suspects,
                     first_ts_ns=first_ts, last_p2p_seq=last_p2p)


def _agreed_verdict(gname: str, coll: _Track, last: dict[int, int]) -> tuple[str, str]:
    if not last:
        return "ok", f"{gname}: no rank with a dump to compare."
    s = max(last.values())
    judged = sorted(last)
    rows = {r: row for r, row in coll.at(s).items() if r in last}
    op = Counter(row.op for row in rows.values()).most_common(1)[0][0] if rows else "?"
    pending = sorted(r for r, row in rows.items() if row.state != "completed")
    if rows and all(row.state == "unknown" for row in rows.values()):
        return "ok", (f"{gname}: all {len(judged)} ranks reached {op} seq {s}; no divergence (the source records "
                      "when a call was issued, not when it finished).")
    if not pending:
        return "ok", f"{gname}: all {len(judged)} ranks reached {op} seq {s} and completed it; no divergence."
    if len(pending) < len(rows) and op not in _ROOTED:
        return "ok", (f"{gname}: all {len(judged)} ranks reached {op} seq {s}; it completed on "
                      f"{_rk(sorted(set(rows) - set(pending)))} and was still finishing on {_rk(pending)} at the dump "
                      "(it cannot complete anywhere before every rank joined); no divergence.")
    return "stuck", (f"{gname}: all {len(judged)} ranks issued {op} seq {s}, but it had not completed on "
                     f"{_rk(pending)} when they dumped. Every rank arrived, so this is no desync: it was in "
                     "flight, or stuck inside the collective (network, transport, a peer that died).")


def _divergent_verdict(gname: str, first: int, at_first: dict[int, _Row], missing: list[int],
                       coll: _Track, mismatches: list[Mismatch]
                       ) -> tuple[str, str, list[int]]:
    parts: list[str] = []
    suspects: list[int] = []
    status = "ok"
    arrived = sorted(at_first)
    op = Counter(row.op for row in at_first.values()).most_common(1)[0][0] if at_first else "?"
    here = [m for m in mismatches if m.seq == first]
    if missing:
        states = [at_first[r].state == "completed" for r in arrived]
        done = all(states) if op in _ROOTED else any(states)
        lasts = sorted({coll.last[r] for r in missing if r in coll.last})
        quiet = [r for r in missing if r not in coll.last]
        behind = ("nothing recorded on this group" if not lasts else
                  f"last: {_last_op(coll, missing)}" if len(lasts) == 1 else f"last seqs {lasts[0]}..{lasts[-1]}")
        if lasts and quiet:
            behind += f"; {_rk(quiet)} recorded nothing on it"
        if done:
            status = "dump_skew"
            parts.append(f"{gname}: {_rk(missing)} dumped before reaching {op} seq {first} ({behind}), which "
                         f"completed on {_rk(arrived)} — dump timing, not a hang.")
        elif len(missing) <= len(arrived):
            status = "hang"
            suspects = list(missing)
            where = _where(at_first, arrived)
            waiting = " and are waiting in it" if len(arrived) > 1 else " and is waiting in it"
            parts.append(f"{gname}: {_rk(arrived)} reached {op} seq {first}{where}{waiting}; {_rk(missing)} never "
                         "issued it "
                         f"({behind}) — {_rk(missing)} {'is' if len(missing) == 1 else 'are'} the one"
                         f"{'' if len(missing) == 1 else 's'} to look at.")
        else:
            status = "hang"
            suspects = list(arrived)
            parts.append(f"{gname}: only {_rk(arrived)} reached {op} seq {first}; {_rk(missing)} (the majority) "
                         f"never issued it ({behind}) — {_rk(arrived)} ran ahead, or the others are blocked "
                         "elsewhere: check the other groups.")
    for m in here:
        status = "mismatch"
        minority = m.minority_ranks
        suspects.extend(r for r in minority if r not in suspects)
        vals = {v.value: v.ranks for v in m.values}
        major_ranks = vals.get(m.majority, [])
        what = {"op": "issued", "dtype": "used dtype", "size": "used sizes"}[m.field]
        others = "; ".join(f"{_rk(rs)} {what} {v}" for v, rs in vals.items() if v != m.majority)
        tie = len(major_ranks) == max(len(rs) for v, rs in vals.items() if v != m.majority)
        blame = (f"no majority: look at both sides, starting with {_rk(minority)}" if tie else
                 f"{_rk(minority)} {'is' if len(minority) == 1 else 'are'} the one"
                 f"{'' if len(minority) == 1 else 's'} to look at")
        where = _where(at_first, minority)
        parts.append(f"{gname}: at seq {first} {_rk(major_ranks)} {what} {m.majority}, {others}{where} — "
                     f"{blame}.")
    later = sorted({m.seq for m in mismatches if m.seq != first})
    if later:
        parts.append(f"Also mismatched at seq {', '.join(map(str, later[:5]))}{' ...' if len(later) > 5 else ''}.")
    return status, " ".join(parts), suspects


def _last_op(coll: _Track, ranks: Sequence[int]) -> str:
    """ "barrier seq 10, completed" for the last op of ranks that stopped at the same seq."""
    rows = [row for r in ranks if r in coll.last and (row := coll.row(r, coll.last[r])) is not None]
    if not rows:
        return "?"
    ops = sorted({row.op for row in rows})
    states = sorted({row.state for row in rows})
    text = f"{ops[0]} seq {rows[0].seq}" if len(ops) == 1 else f"seq {rows[0].seq}"
    return text + (f", {states[0]}" if len(states) == 1 and states[0] != "unknown" else "")


def _where(at: dict[int, _Row], ranks: Sequence[int]) -> str:
    frames = sorted({at[r].frame for r in ranks if r in at and at[r].frame})
    return f" (called from {frames[0]})" if len(frames) == 1 else ""


def _p2p_verdict(gname: str, p2p: _Track, members: set[int]) -> tuple[str, str, list[int]]:
    """Point-to-point only: per-rank p2p counters are comparable only in a 2-rank group."""
    if not p2p:
        return "ok", f"{gname}: no entries.", []
    last = dict(p2p.last)
    if len(members) != 2 or len(last) < 2 or len(set(last.values())) == 1:
        n = max(last.values())
        return "ok", f"{gname}: point-to-point only (last p2p seq {n}); not matched across ranks.", []
    (ra, sa), (rb, _) = sorted(last.items(), key=lambda kv: (kv[1], kv[0]))
    row = p2p.row(rb, sa + 1)
    if row is not None and row.state == "completed":
        return "dump_skew", (f"{gname}: rank {ra} dumped before p2p seq {sa + 1}, which completed on rank {rb} — "
                             "dump timing, not a hang."), []
    what = f"{row.op} " if row is not None else ""
    return "hang", (f"{gname}: rank {rb} posted {what}p2p seq {sa + 1}; its peer rank {ra} never posted the "
                    f"matching operation (last p2p seq {sa}) — rank {ra} is the one to look at."), [ra]


def _by_time(groups: Iterable[GroupHang]) -> list[GroupHang]:
    order = {"mismatch": 0, "hang": 0, "stuck": 1, "dump_skew": 2, "ok": 3}
    return sorted(groups, key=lambda g: (order.get(g.status, 3), g.first_ts_ns if g.first_ts_ns is not None
                                         else 2**63, _gorder(g.group)))


def _findings(groups: list[GroupHang], source: str) -> list[Finding]:
    if not groups:
        return [Finding(kind="hang", text="No collectives with sequence numbers: nothing to check.")]
    bad = [g for g in _by_time(groups) if g.status != "ok"]
    broken = "error" if source == "flight_recorder" else "warning"
    out: list[Finding] = []
    culprits = [g for g in bad if g.status in ("hang", "mismatch") and g.suspects]
    if culprits:
        g = culprits[0]
        lead = (f"Start with {_rk(g.suspects)}: the earliest divergence is in {_gname(g.group, g.desc)} "
                f"at seq {g.first_divergent_seq}.")
        if len(culprits) > 1:
            lead += (f" {len(culprits) - 1} other group{'s' if len(culprits) > 2 else ''} diverged later "
                     "(often a consequence).")
        out.append(Finding(kind="hang", severity=broken, text=lead, ranks=tuple(g.suspects), group=g.group))
    out.extend(Finding(kind="hang", severity=broken if g.status in ("hang", "mismatch") else "warning",
                       text=g.verdict, ranks=tuple(g.suspects), group=g.group) for g in bad)
    if source == "nccl_log" and out:
        out.append(Finding(kind="hang", text="Sequence numbers are NCCL's opCount per communicator (commId), "
                           "from NCCL logs."))
    elif source != "flight_recorder" and out:
        out.append(Finding(kind="hang", text=f"Sequence numbers come from {source}, not from Flight Recorder dumps."))
    return out


def _fr_parts(run: Any, fmt: str = "flight_recorder") -> tuple[pa.Table | None, pa.Table | None]:
    """Every Flight Recorder (or NCCL log) source's own collectives and ranks. Ingest keeps one
    source per rank in the merged tables (Kineto before NCCL logs before Flight Recorder, one of a
    pickle/JSON pair), so a run with several trace kinds has these only under RUN/sources/<key>/."""
    keys = [s.key for s in run.manifest.sources if s.format == fmt and not s.error and s.key]
    parts: dict[str, list[pa.Table]] = {"collectives": [], "ranks": []}
    for key in sorted(keys):
        for name, tables in parts.items():
            part = run.source_table(key, name)
            if part is not None:
                tables.append(part)
    if not parts["collectives"]:
        return None, None
    coll, ranks = (pa.concat_tables(parts[n], promote_options="permissive").unify_dictionaries()
                   for n in ("collectives", "ranks"))
    return coll, ranks


def _global_peers(coll: pa.Table, groups: pa.Table) -> pa.Table:
    from tracekit.nccl_fabric import rank_maps, resolve_peers

    table, _ = resolve_peers(coll, rank_maps(groups), [("peer", "peer_local")])
    return table


def hang_from_run(run: Any) -> HangResult:
    """Run `find_hangs` on a run directory (path or `Run`); `tracekit.workflows.hang` saves it."""
    from tracekit.store import Run

    r = run if isinstance(run, Run) else Run(run)
    coll, ranks = _fr_parts(r)
    if coll is None:
        coll, ranks = _fr_parts(r, "nccl_log")
        if coll is not None:
            coll = _global_peers(coll, r.table("groups"))
    if coll is None:
        coll, ranks = r.table("collectives"), r.table("ranks")
    merged = r.table("ranks")
    if ranks is not None and merged.num_rows:
        ranks = pa.concat_tables([ranks, merged], promote_options="permissive").unify_dictionaries()
    return find_hangs(coll, r.table("groups"), ranks=ranks, messages=r.table("log_messages"))
