"""Parser for NCCL Inspector output (`plugins/profiler/inspector`, NCCL 2.28.3+): JSONL, one object
per completed operation, one file per process (`<dump dir>/<hostname>-pid<pid>.log`).

A record (NVIDIA/nccl `plugins/profiler/inspector/inspector_json.cc`):
`{"header": {"id": "0x<commHash>", "comm_name", "rank", "n_ranks", "nnodes"}, "metadata":
{"inspector_output_format_version", "git_rev", "rec_mechanism", "dump_timestamp_us", "hostname",
"pid"}, "coll_perf": {"coll", "coll_sn", "coll_msg_size_bytes", "coll_exec_time_us",
"coll_timing_source", "coll_algobw_gbs", "coll_busbw_gbs"[, "event_trace_sn", "event_trace_ts":
{"coll_start_ts", "coll_stop_ts", "kernel_events": [{"channel_id", "kernel_start_ts",
"kernel_stop_ts", "kernel_record_ts"}]}]}}` or the same with `p2p_perf` (`p2p`, `p2p_sn`,
`p2p_peer`, ...; 2.30.4+). Times are epoch µs (gettimeofday); the execution time is the longest
channel's kernel time (GPU clocks when `timing_source` is `kernel_gpu`).

Each record becomes one `collectives` row (state completed, `dur_ns` from the execution time,
`ts_ns` from the start timestamp when verbose) and one `comm` event when it has a start time.
The header's `id` is the commHash NCCL logs print as `commId`, so groups join with the logs'.
`rank` is the communicator rank: global ranks come from the largest communicator in the file (the
world, when the process used it), as for NCCL logs. Inspector drops operations below
NCCL_INSPECTOR_DUMP_MIN_SIZE_BYTES (8 KiB by default), so `seq` is the order of the records on
that communicator in this file (`seq_explicit` false) and `coll_sn` (NCCL's per-type sequence
number) is kept.
"""

from __future__ import annotations

import os
from collections import Counter, defaultdict
from typing import Any

import msgspec

from tracekit._limits import checked_int, in_range, out_of_range
from tracekit.errors import InputError
from tracekit.parsers import _nccl
from tracekit.parsers._json_keys import RepeatedKeys
from tracekit.parsers._lines import LineSource, account, line_batches
from tracekit.parsers.registry import Format
from tracekit.parsers.vocabulary import NCCL_OPS
from tracekit.store import ParseResult, SourceSink, SourceStats

NAME = "nccl_inspector"
PARSER_VERSION = "1"
#: coll_id = rank * 2**32 + COLL_ID_OFFSET + ordinal (apart from the other formats' ids).
COLL_ID_OFFSET = 5 << 29
_OPS = {**NCCL_OPS, "All2All": "all_to_all", "AllGatherV": "all_gather"}


def sniff(head: bytes) -> bool:
    """True when a file starts like Inspector JSONL (a record with header and coll_perf/p2p_perf)."""
    for line in head.splitlines()[:20]:
        line = line.strip()
        if line.startswith(b"{") and b'"header"' in line and (b'"coll_perf"' in line or b'"p2p_perf"' in line):
            return True
    return False


def _norm_id(v: Any) -> str | None:
    if v is None:
        return None
    text = str(v).strip().lower()
    try:
        n = int(text, 16) if text.startswith("0x") else int(text)
    except ValueError:
        return text or None
    return f"0x{n & (2**64 - 1):016x}"


def _int(v: Any, kind: str = "id") -> int | None:
    return checked_int(v, kind)


def _world(v: Any) -> int | None:
    """A communicator size in 1..MAX_WORLD_SIZE (structures are sized by it), else None."""
    return checked_int(v, "world_size")


def _us_as_ns(v: Any, kind: str = "time_ns") -> int | None:
    """A time (or duration) in µs as ns, None when it or its ns value is out of range."""
    us = checked_int(v, kind)
    return us * 1000 if us is not None and in_range(us * 1000, kind) else None


def _float(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def parse(path: str | os.PathLike[str], sink: SourceSink, *, rank: int | None = None) -> ParseResult:
    """Parse one Inspector JSONL file into `sink`."""
    where = os.fspath(path)
    stats = SourceStats()
    decoder = msgspec.json.Decoder()
    repeated = RepeatedKeys()
    records: list[tuple[int, dict[str, Any]]] = []
    info = LineSource()
    lineno = 0
    try:
        for batch in line_batches(where, info):
            for raw in batch:
                lineno += 1
                if not raw.strip():
                    continue
                try:
                    obj = decoder.decode(raw)
                except (msgspec.DecodeError, RecursionError):
                    stats.skip("malformed JSON line")
                    continue
                repeated.scan_exact(raw)
                if not isinstance(obj, dict) or not isinstance(obj.get("header"), dict) or not (
                        isinstance(obj.get("coll_perf"), dict) or isinstance(obj.get("p2p_perf"), dict)):
                    stats.skip("not an Inspector record")
                    continue
                records.append((lineno, obj))
    except OSError as exc:
        raise InputError(where, f"cannot read ({exc.strerror or exc})") from exc
    if (w := repeated.warning("line")) is not None:
        stats.warnings.append(w)
    account(info, stats)
    if not records:
        raise InputError(where, "no NCCL Inspector records (header + coll_perf/p2p_perf)")
    return _Builder(where, sink, stats).run(records)


class _Builder:
    def __init__(self, where: str, sink: SourceSink, stats: SourceStats) -> None:
        self.where, self.sink, self.stats = where, sink, stats

    def run(self, records: list[tuple[int, dict[str, Any]]]) -> ParseResult:
        stats = self.stats
        comms: dict[str, dict[str, Any]] = {}
        host = pid = None
        for _, obj in records:
            h, meta = obj["header"], obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
            gid = _norm_id(h.get("id"))
            if gid is None:
                continue
            c = comms.setdefault(gid, {"ranks": set(), "n_ranks": _world(h.get("n_ranks")), "name": h.get("comm_name"),
                                       "nnodes": _int(h.get("nnodes"), "count")})
            r = _int(h.get("rank"), "rank")
            if r is not None:
                c["ranks"].add(r)
            host = host or meta.get("hostname")
            pid = pid if pid is not None else _int(meta.get("pid"))
        world = max(comms, key=lambda g: (comms[g]["n_ranks"] or 0, len(comms[g]["ranks"]), g)) if comms else None
        one_gpu = world is not None and len(comms[world]["ranks"]) == 1
        my_rank = next(iter(comms[world]["ranks"])) if one_gpu and world else None
        if world is not None and not one_gpu:
            stats.warnings.append(f"the largest communicator {world} has {len(comms[world]['ranks'])} ranks in this "
                                  "process: only its own rows get global ranks")
        rows: list[dict[str, Any]] = []
        ordinal: Counter[tuple[str, bool]] = Counter()
        per_rank: Counter[int] = Counter()
        for lineno, obj in records:
            h = obj["header"]
            gid = _norm_id(h.get("id"))
            local = _int(h.get("rank"), "rank")
            if gid is not None and local is None and h.get("rank") is not None:
                stats.skip(out_of_range("rank"))
                continue
            if gid is None or local is None:
                stats.skip("record without communicator id or rank")
                continue
            if gid == world:
                g_rank = local
            elif my_rank is not None:
                g_rank = my_rank
            else:
                stats.skip("record of a communicator whose process GPU has no global rank")
                continue
            is_p2p = isinstance(obj.get("p2p_perf"), dict)
            perf = obj["p2p_perf"] if is_p2p else obj["coll_perf"]
            pre = "p2p" if is_p2p else "coll"
            name = str(perf.get(pre) or "")
            op = _OPS.get(name, "other")
            size = _int(perf.get(f"{pre}_msg_size_bytes"), "size")
            nranks = _world(h.get("n_ranks"))
            in_b, out_b = _nccl.bytes_of(op, size, 1, nranks)
            trace = perf.get("event_trace_ts") if isinstance(perf.get("event_trace_ts"), dict) else {}
            start = _us_as_ns(trace.get(f"{pre}_start_ts"))
            kernels = trace.get("kernel_events") if isinstance(trace.get("kernel_events"), list) else []
            k_starts = [t for k in kernels if isinstance(k, dict) and (t := _us_as_ns(k.get("kernel_start_ts")))]
            ts_ns = min(k_starts) if k_starts else start
            exec_ns = _us_as_ns(perf.get(f"{pre}_exec_time_us"), "duration_ns")
            key = (gid, is_p2p)
            peer_local = _int(perf.get("p2p_peer"), "rank") if is_p2p else None
            rows.append({
                "rank": g_rank, "group": gid, "seq": ordinal[key], "op": op, "in_bytes": in_b, "out_bytes": out_b,
                "nranks": nranks, "peer": peer_local if gid == world else None, "peer_local": peer_local,
                "ts_ns": ts_ns, "dur_ns": exec_ns, "state": "completed",
                "source": NAME, "seq_explicit": False, "name": name or None, "comm_rank": local,
                "coll_sn": _int(perf.get(f"{pre}_sn")), "timing_source": perf.get(f"{pre}_timing_source"),
                "algbw_gbs": _float(perf.get(f"{pre}_algobw_gbs")), "busbw_gbs": _float(perf.get(f"{pre}_busbw_gbs")),
                "n_kernel_channels": len(kernels) or None, "line": lineno, "is_p2p": is_p2p,
            })
            ordinal[key] += 1
            stats.store()
        for row in rows:
            r = row["rank"]
            row["coll_id"] = r * 2**32 + COLL_ID_OFFSET + per_rank[r]
            per_rank[r] += 1
        ranks = sorted(per_rank)
        if rows:
            cols = {k: [r.get(k) for r in rows] for k in rows[0]}
            self.sink.add("collectives", cols)
            timed = [r for r in rows if r["ts_ns"] is not None and r["dur_ns"] is not None]
            if timed:
                self.sink.add("events", {
                    "rank": [r["rank"] for r in timed], "lane": [f"nccl/{r['group']}" for r in timed],
                    "kind": ["comm"] * len(timed), "name": [f"nccl:{r['name']}" for r in timed],
                    "ts_ns": [r["ts_ns"] for r in timed], "dur_ns": [r["dur_ns"] for r in timed],
                    "coll_id": [r["coll_id"] for r in timed], "cat": [NAME] * len(timed)})
        group_rows = []
        for gid, c in sorted(comms.items()):
            rank_map: list[int | None] | None = None
            if c["n_ranks"] and my_rank is not None:
                rank_map = [None] * c["n_ranks"]
                for local in c["ranks"]:
                    if 0 <= local < c["n_ranks"]:
                        rank_map[local] = local if gid == world else my_rank
            group_rows.append({"group": gid, "desc": c["name"] if c["name"] not in (None, "unknown") else None,
                               "backend": "nccl", "ranks": sorted({x for x in rank_map or [] if x is not None}),
                               "size": c["n_ranks"], "dims": [], "ranks_complete": False, "rank_map": rank_map,
                               "n_nodes": c["nnodes"], "world": gid == world})
        if group_rows:
            data = {k: [g[k] for g in group_rows] for k in group_rows[0]}
            import pyarrow as pa

            data["rank_map"] = pa.array(data["rank_map"], pa.list_(pa.int32()))
            self.sink.add("groups", data)
        world_size = comms[world]["n_ranks"] if world else None
        if ranks:
            self.sink.add("ranks", {"rank": ranks, "world_size": [world_size] * len(ranks),
                                    "host": [host] * len(ranks), "pid": [pid] * len(ranks),
                                    "source_file": [self.where] * len(ranks), "source_format": [NAME] * len(ranks),
                                    "backend": ["nccl"] * len(ranks)})
        tss = [r["ts_ns"] for r in rows if r["ts_ns"] is not None]
        by_source = defaultdict(int)
        for r in rows:
            by_source[r["timing_source"]] += 1
        if by_source.get("collective_cpu") or by_source.get("kernel_cpu"):
            stats.warnings.append("some durations are CPU-timed (timing_source kernel_cpu/collective_cpu), not GPU")
        return ParseResult(stats=stats, ranks=ranks, collectives=len(rows), groups=len(group_rows),
                           events=sum(1 for r in rows if r["ts_ns"] is not None and r["dur_ns"] is not None),
                           ts_min_ns=min(tss) if tss else None, ts_max_ns=max(tss) if tss else None)


FORMAT = Format(name=NAME, description="NCCL Inspector", version=PARSER_VERSION, parse=parse,
                sniffs=(lambda head: sniff(head.data),),
                priority=3)
