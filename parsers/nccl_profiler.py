"""Parser for the NCCL profiler example plugin's trace (`plugins/profiler/example`, ex
`ext-profiler/example`; NCCL 2.23+): a Chrome-trace array of async `b`/`e` events, one file per
communicator and rank (`<NCCL_PROFILE_DUMP_FILE>_<commHash>_<rank>.json`, 2.27+), written at
communicator teardown.

Layout (NVIDIA/nccl `print_event.cc`): `[` then one event per line, each ending `},`, then `{}]`.
A COLL event (`"cat": "COLL"`, args SeqNum, CommHash, Rank, Count, Datatype, Algorithm, Protocol,
nChannels) opens, its children follow (ProxyOp `PROXY`, network `NET`, per-channel kernel `GPU`
`KernelCh` events with StartGpuClk/StopGpuClk), and its `e` event closes it; P2P events likewise
(Peer instead of SeqNum). `ts` is µs since the plugin started in that process (not an epoch).

The 2.28-2.29 plugin prints `"datatype": ncclFloat32` and `"Stream": 0x5020000567d0` unquoted,
`%p` may print `(nil)`, and a killed job leaves no closing `{}]`: the file is read line by line,
bare tokens are quoted, and what cannot be decoded is skipped with a reason (salvage).

Each COLL/P2P becomes a `collectives` row: seq = SeqNum (per communicator and collective type;
p2p rows get their order in the file), algo/proto as printed, dur_ns = the longest channel's
kernel time from the GPU clocks (else null: the COLL `e` only marks the end of the enqueue).
The trace names communicator ranks only: `rank` is the communicator rank (a warning says so;
global ranks are right for the world communicator).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import msgspec

from tracekit._limits import checked_int, out_of_range
from tracekit.errors import InputError
from tracekit.parsers import _nccl
from tracekit.parsers._json_keys import RepeatedKeys
from tracekit.parsers._lines import LineSource, account, line_batches
from tracekit.parsers.registry import Format
from tracekit.store import ParseResult, SourceSink, SourceStats

NAME = "nccl_profiler"
PARSER_VERSION = "1"
COLL_ID_OFFSET = 7 << 29
_CATS = (b'"cat": "COLL"', b'"cat": "GROUP"', b'"cat": "GROUP_API"', b'"cat": "COLL_API"', b'"cat": "P2P"',
         b'"cat": "PROXY"', b'"cat": "KERNEL_LAUNCH"')
_BARE = re.compile(rb'(:\s*)(ncclU?[A-Za-z0-9_]+|0x[0-9a-fA-F]+|\(nil\)|\(null\))(\s*[,}])')
_NAME_RANK = re.compile(r"_(\d+)_(\d+)(?:\.json)?$")


def sniff(head: bytes) -> bool:
    """True when a file starts like the example plugin's trace: `[` and NCCL event categories."""
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    return text.startswith(b"[") and sum(1 for c in _CATS if c in head) >= 1 and b'"ph": "b"' in head


def _event(line: bytes, decode: Any, repeated: RepeatedKeys) -> dict[str, Any] | None:
    body = line.strip().rstrip(b",")
    if not body.startswith(b"{") or body == b"{}":
        return None
    try:
        obj = decode(body)
    except (msgspec.DecodeError, RecursionError):
        try:
            body = _BARE.sub(rb'\1"\2"\3', body)
            obj = decode(body)
        except (msgspec.DecodeError, RecursionError):
            return None
    if isinstance(obj, dict):
        repeated.scan_exact(body)
        return obj
    return None


def parse(path: str | os.PathLike[str], sink: SourceSink, *, rank: int | None = None) -> ParseResult:
    """Parse one profiler-plugin trace into `sink`."""
    where = os.fspath(path)
    stats = SourceStats()
    decode = msgspec.json.Decoder().decode
    repeated = RepeatedKeys()
    info = LineSource()
    rows: list[dict[str, Any]] = []
    open_ops: dict[tuple[str, Any], dict[str, Any]] = {}
    current: list[dict[str, Any]] = []
    p2p_order = 0
    saw_end = False
    pid = None
    try:
        for batch in line_batches(where, info):
            for raw in batch:
                line = raw.strip()
                if not line or line in (b"[", b"]"):
                    continue
                if line in (b"{}]", b"{}"):
                    saw_end = True
                    continue
                ev = _event(line, decode, repeated)
                if ev is None:
                    stats.skip("malformed event")
                    continue
                cat, ph = ev.get("cat"), ev.get("ph")
                pid = pid if pid is not None else ev.get("pid")
                if cat in ("COLL", "P2P") and ph == "b":
                    args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
                    op = {"cat": cat, "name": ev.get("name"), "args": args, "ts": ev.get("ts"), "gpu": [],
                          "id": ev.get("id")}
                    if cat == "P2P":
                        op["order"] = p2p_order
                        p2p_order += 1
                    open_ops[(cat, ev.get("id"))] = op
                    current.append(op)
                    op["lines"] = 1
                    stats.store()
                elif cat in ("COLL", "P2P") and ph == "e":
                    op = open_ops.pop((cat, ev.get("id")), None)
                    if op is None:
                        stats.skip("end without its begin")
                        continue
                    op["end_ts"] = ev.get("ts")
                    op["lines"] += 1
                    if op in current:
                        current.remove(op)
                    rows.append(op)
                    stats.store()
                elif cat == "GPU" and ph == "b":
                    args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
                    a, b = args.get("StartGpuClk"), args.get("StopGpuClk")
                    if current and isinstance(a, int) and isinstance(b, int) and b >= a > 0:
                        current[-1]["gpu"].append(b - a)
                        stats.store()
                    else:
                        stats.skip("kernel event without GPU clocks")
                else:
                    stats.skip(f"{str(cat or 'other').lower()} event")
    except OSError as exc:
        raise InputError(where, f"cannot read ({exc.strerror or exc})") from exc
    if (w := repeated.warning("event")) is not None:
        stats.warnings.append(w)
    account(info, stats)
    if open_ops:
        stats.warnings.append(f"{len(open_ops)} operations begun but not ended (file cut short): kept without "
                              "an end")
        rows.extend(open_ops.values())
    if not saw_end:
        stats.warnings.append("no closing `{}]`: the trace was cut short (job killed before teardown?); salvaged")
    if not rows:
        raise InputError(where, "no COLL or P2P events of the NCCL profiler plugin")
    return _write(where, sink, stats, rows, pid)


def _digits(v: Any) -> bool:
    """A decimal communicator id in text (ASCII digits, at most 20 of them: a uint64)."""
    return isinstance(v, str) and v.isascii() and v.isdigit() and len(v) <= 20


def _write(where: str, sink: SourceSink, stats: SourceStats, ops: list[dict[str, Any]], pid: Any) -> ParseResult:
    name_rank = _NAME_RANK.search(Path(where).name)
    out = []
    for op in ops:
        a = op["args"]
        rank = checked_int(a.get("Rank") if isinstance(a.get("Rank"), int) else (
            name_rank.group(2) if name_rank else None), "rank")
        if rank is None and (isinstance(a.get("Rank"), int) or name_rank):
            stats.read -= op["lines"]
            stats.stored -= op["lines"]
            stats.skip(out_of_range("rank"), op["lines"])
            continue
        comm = a.get("CommHash")
        if comm is None and name_rank:
            comm = int(name_rank.group(1))
        if rank is None:
            stats.read -= op["lines"]
            stats.stored -= op["lines"]
            stats.skip("operation without a rank", op["lines"])
            continue
        fname = str(op["name"] or "")
        kind = _nccl.op_of(fname)
        dname, width = _nccl.datatype(a.get("Datatype"))
        count = checked_int(a.get("Count"), "size") if isinstance(a.get("Count"), int) else None
        in_b, out_b = _nccl.bytes_of(kind, count, width, None)
        # nranks is not in the trace: a per-rank count says nothing of the whole buffer
        times_in, times_out = _nccl.TIMES_NRANKS.get(kind, (False, False))
        group = f"0x{int(comm) & (2**64 - 1):016x}" if isinstance(comm, int) or _digits(comm) else None
        seq = a.get("SeqNum") if op["cat"] == "COLL" and isinstance(a.get("SeqNum"), int) else op.get("order")
        out.append({
            "rank": rank, "group": group, "seq": seq, "op": kind, "dtype": dname,
            "in_bytes": None if times_in else in_b, "out_bytes": None if times_out else out_b,
            "peer_local": checked_int(a.get("Peer"), "rank") if op["cat"] == "P2P" else None,
            "dur_ns": max(op["gpu"]) if op["gpu"] else None, "state": "completed" if op.get("end_ts") is not None
            else "started", "algo": a.get("Algorithm"), "proto": a.get("Protocol"), "source": NAME,
            "seq_explicit": op["cat"] == "COLL", "name": fname or None, "comm_rank": rank,
            "n_channels": a.get("nChannels") if isinstance(a.get("nChannels"), int) else None,
            "ts_rel_us": float(op["ts"]) if isinstance(op["ts"], (int, float)) else None,
        })
    per_rank: dict[int, int] = {}
    for row in out:
        r = row["rank"]
        row["coll_id"] = r * 2**32 + COLL_ID_OFFSET + per_rank.get(r, 0)
        per_rank[r] = per_rank.get(r, 0) + 1
    ranks = sorted(per_rank)
    stats.warnings.append("profiler-plugin traces name communicator ranks: rank is the communicator rank "
                          "(the global rank for the world communicator)")
    if out:
        sink.add("collectives", {k: [r[k] for r in out] for k in out[0]})
        groups = sorted({r["group"] for r in out if r["group"]})
        sink.add("groups", {"group": groups, "backend": ["nccl"] * len(groups),
                            "ranks": [sorted({r["rank"] for r in out if r["group"] == g}) for g in groups],
                            "dims": [[] for _ in groups], "ranks_complete": [False] * len(groups)})
        sink.add("ranks", {"rank": ranks, "pid": [pid if isinstance(pid, int) else None] * len(ranks),
                           "source_file": [where] * len(ranks), "source_format": [NAME] * len(ranks),
                           "backend": ["nccl"] * len(ranks)})
    return ParseResult(stats=stats, ranks=ranks, collectives=len(out), groups=len({r["group"] for r in out}))


FORMAT = Format(name=NAME, description="profiler-plugin files", version=PARSER_VERSION, parse=parse,
                sniffs=(lambda head: sniff(head.data),),
                priority=4)
