"""Write a synthetic run as Nsight Systems SQLite exports: one report per host, every rank a process.

The tables and columns are those the Nsight Systems exporter documents (StringIds, CUPTI_ACTIVITY_KIND_*,
NVTX_EVENTS, TARGET_INFO_*, ENUM_*); `release` picks the schema shape of an exporter generation and
`nccl` the NCCL era of kernel names and NVTX payloads (see docs/formats.md, "Nsight Systems").
The Kineto twin of the same tables is `tracekit.synth.write_kineto`.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Iterable
from contextlib import closing
from pathlib import Path
from typing import Any

import pyarrow as pa

from tracekit.atomic import atomic_write_with
from tracekit.synth import DEVICE_NAME

#: Exporter generations: which optional tables and columns a database has.
RELEASES = {
    # the oldest documented layout: inline NVTX text, no session start, no enum tables, no payloads
    "2020.3": {"session_start": False, "enum": False, "text_id": False, "json": False, "mangled": False,
               "system_env": False, "cuda_event": False},
    # StringIds-referenced NVTX text, ENUM_NSYS_EVENT_TYPE, the session start time; no payload column
    "2022.4": {"session_start": True, "enum": True, "text_id": True, "json": False, "mangled": True,
               "system_env": True, "cuda_event": False},
    # NVTX extended payloads exported as JSON text
    "2024.5": {"session_start": True, "enum": True, "text_id": True, "json": True, "mangled": True,
               "system_env": True, "cuda_event": True},
}
NCCL_ERAS = ("2.18", "2.21", "2.27")
EVENT_TYPES = {"NvtxMark": 34, "NvtxPushPopRange": 59, "NvtxStartEndRange": 60, "NvtxDomainCreate": 75}
_OP_CALL = {"all_reduce": "ncclAllReduce", "all_gather": "ncclAllGather", "reduce_scatter": "ncclReduceScatter",
            "broadcast": "ncclBroadcast", "reduce": "ncclReduce", "send": "ncclSend", "recv": "ncclRecv"}
_SYNC_TYPE = {"Event Sync": 1, "Stream Wait Event": 2, "Stream Sync": 3, "Context Sync": 4}
_LEGACY_TYPES = {"bf16": "__nv_bfloat16", "f32": "float", "f16": "half", "f64": "double", "i8": "int8_t",
                 "u8": "uint8_t", "i32": "int32_t", "u32": "uint32_t", "i64": "int64_t", "u64": "uint64_t"}
_DEV_KERNEL = re.compile(r"^ncclDevKernel_(\w+?)_(Sum|Prod|Max|Min|Avg)_(\w+?)_(RING|TREE)_(LL128|LL|SIMPLE)$")


def kernel_name(name: str, nccl: str) -> str:
    """A synth NCCL kernel name (2.19+ form) as the NCCL era `nccl` spells it."""
    if nccl != "2.18":
        return name
    if name == "ncclDevKernel_SendRecv":
        return "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)"
    m = _DEV_KERNEL.match(name)
    if not m:
        return name
    coll, op, dtype, algo, proto = m.groups()
    return (f"ncclKernel_{coll}_{algo}_{proto}_{op}_{_LEGACY_TYPES.get(dtype, dtype)}"
            "(ncclDevComm*, unsigned long, ncclWork*)")


def comm_hash(group: str) -> int:
    """A stable 64-bit commHash for a synth group name (a `0x...` name is its own hash)."""
    import hashlib

    if group.startswith("0x"):
        return int(group, 16)
    return int.from_bytes(hashlib.sha256(f"synth-comm:{group}".encode()).digest()[:8], "little")


WORLD = "world"


def nsys_twin(tables: dict[str, pa.Table], nccl: str = "2.27") -> dict[str, pa.Table]:
    """The run as both profilers can describe it, for a Kineto/Nsight round trip: groups named by
    their commHash (as NCCL's payloads and logs name them) with no description, the world
    communicator PyTorch creates first, no explicit sequence numbers, and NCCL's API ranges."""
    import pyarrow.compute as pc

    from tracekit import schema

    names = {g: f"0x{comm_hash(g):016x}" for g in tables["groups"].column("group").to_pylist()}
    groups = tables["groups"].to_pylist()
    world = sorted(tables["ranks"].column("rank").to_pylist())
    rows = [{**g, "group": names[g["group"]], "desc": None} for g in groups]
    rows.insert(0, {"group": f"0x{comm_hash(WORLD):016x}", "desc": None, "backend": "nccl", "ranks": world,
                    "size": len(world), "dims": [], "ranks_complete": True})
    coll = tables["collectives"]
    group = pa.array([names[g] for g in coll.column("group").to_pylist()], pa.string())
    coll = coll.set_column(coll.schema.get_field_index("group"), "group", group)
    coll = coll.set_column(coll.schema.get_field_index("seq_explicit"), "seq_explicit",
                           pc.cast(pa.array([False] * coll.num_rows), pa.bool_()))
    twin = {**tables, "groups": schema.conform("groups", pa.Table.from_pylist(rows)),
            "collectives": schema.conform("collectives", coll)}
    return with_nccl_ranges(twin, nccl)


def _schema(db: sqlite3.Connection, release: dict[str, bool]) -> None:
    nvtx_cols = ["start INT NOT NULL", "end INT", "eventType INT NOT NULL", "rangeId INT", "category INT",
                 "color INT", "text TEXT", "globalTid INT", "endGlobalTid INT", "domainId INT"]
    if release["text_id"]:
        nvtx_cols.append("textId INT")
    if release["json"]:
        nvtx_cols += ["jsonTextId INT", "jsonText TEXT", "binaryData BLOB"]
    kernel = ["start INT NOT NULL", "end INT NOT NULL", "deviceId INT NOT NULL", "contextId INT NOT NULL",
              "streamId INT NOT NULL", "correlationId INT", "globalPid INT", "demangledName INT NOT NULL",
              "shortName INT NOT NULL", "gridX INT", "gridY INT", "gridZ INT", "blockX INT", "blockY INT",
              "blockZ INT", "registersPerThread INT", "staticSharedMemory INT", "dynamicSharedMemory INT"]
    if release["mangled"]:
        kernel.append("mangledName INT")
    ddl = {
        "StringIds": ["id INTEGER NOT NULL PRIMARY KEY", "value TEXT NOT NULL"],
        "CUPTI_ACTIVITY_KIND_KERNEL": kernel,
        "CUPTI_ACTIVITY_KIND_RUNTIME": ["start INT NOT NULL", "end INT NOT NULL", "eventClass INT NOT NULL",
                                        "globalTid INT", "correlationId INT", "nameId INT NOT NULL",
                                        "returnValue INT NOT NULL", "callchainId INT"],
        "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": ["start INT NOT NULL", "end INT NOT NULL", "deviceId INT NOT NULL",
                                                "contextId INT NOT NULL", "streamId INT NOT NULL",
                                                "correlationId INT", "globalPid INT", "syncType INT NOT NULL",
                                                "eventId INT NOT NULL"],
        "CUPTI_ACTIVITY_KIND_MEMCPY": ["start INT NOT NULL", "end INT NOT NULL", "deviceId INT NOT NULL",
                                       "contextId INT NOT NULL", "streamId INT NOT NULL", "correlationId INT",
                                       "globalPid INT", "bytes INT NOT NULL", "copyKind INT NOT NULL",
                                       "srcKind INT", "dstKind INT"],
        "NVTX_EVENTS": nvtx_cols,
        "TARGET_INFO_GPU": ["id INT NOT NULL", "name TEXT", "busLocation TEXT", "isDiscrete INT",
                            "totalMemory INT", "smCount INT", "uuid TEXT"],
        "PROCESSES": ["globalPid INT", "pid INT", "name TEXT"],
        "ThreadNames": ["nameId INT NOT NULL", "priority INT", "globalTid INT"],
    }
    if release["cuda_event"]:
        ddl["CUPTI_ACTIVITY_KIND_CUDA_EVENT"] = ["deviceId INT NOT NULL", "contextId INT NOT NULL",
                                                 "streamId INT NOT NULL", "correlationId INT", "globalPid INT",
                                                 "eventId INT NOT NULL"]
    if release["session_start"]:
        ddl["TARGET_INFO_SESSION_START_TIME"] = ["utcEpochNs INT", "utcTime TEXT", "localTime TEXT"]
    if release["enum"]:
        ddl["ENUM_NSYS_EVENT_TYPE"] = ["id INTEGER NOT NULL PRIMARY KEY", "name TEXT NOT NULL", "label TEXT"]
    if release["system_env"]:
        ddl["TARGET_INFO_SYSTEM_ENV"] = ["globalVid INT", "devStateName TEXT", "name TEXT", "nameEnum INT",
                                         "value TEXT"]
    for table, cols in ddl.items():
        db.execute(f"CREATE TABLE {table} ({', '.join(cols)})")


class _Strings:
    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def __call__(self, text: str) -> int:
        i = self.ids.get(text)
        if i is None:
            i = self.ids[text] = len(self.ids) + 1
        return i


def _gpid(pid: int) -> int:
    return pid << 24


def _gtid(pid: int, tid: int) -> int:
    return (pid << 24) | tid


def with_nccl_ranges(tables: dict[str, pa.Table], nccl: str = "2.27") -> dict[str, pa.Table]:
    """The tables plus the NVTX ranges NCCL itself records, as annotation events on each rank's
    launching thread: a `ncclCommInitRankConfig` (2.27: `ncclCommSplit` for subgroups) per
    communicator (the world first) before the rank's first event, and an API range (`ncclAllReduce`,
    `ncclSend`, ...) around each collective kernel's launch, with the kernel's coll_id. Written
    by both `write_kineto` and `write_nsys`, they make the two twins' events the same."""
    import polars as pl

    from tracekit import schema

    ev = pl.from_arrow(tables["events"])
    colls = {c["coll_id"]: c for c in tables["collectives"].select(["coll_id", "op", "nranks"]).to_pylist()}
    groups = tables["groups"].to_pylist()
    rows: list[dict[str, Any]] = []
    for info in tables["ranks"].to_pylist():
        r = info["rank"]
        mine = ev.filter(pl.col("rank") == r)
        if mine.is_empty():
            continue
        first = int(mine["ts_ns"].min())  # type: ignore[arg-type]
        member = [None] + [g for g in groups if r in g["ranks"] and g["group"] != f"0x{comm_hash(WORLD):016x}"]
        for k in range(len(member)):
            call = "ncclCommInitRankConfig" if (k == 0 or nccl != "2.27") else "ncclCommSplit"
            t0 = first - 50_000 * (len(member) - k)
            rows.append({"rank": r, "lane": "cpu/thread1", "kind": "annotation", "name": call, "ts_ns": t0,
                         "dur_ns": 20_000, "coll_id": None, "cat": "user_annotation"})
        calls = mine.filter(pl.col("kind") == "runtime").sort("ts_ns").to_dicts()
        launches = {d["correlation"]: d for d in calls}
        before = {d["correlation"]: calls[i - 1]["ts_ns"] + calls[i - 1]["dur_ns"] if i else None
                  for i, d in enumerate(calls)}  # the end of the call before each, for a group's ranges
        for k in mine.filter(pl.col("coll_id").is_not_null() & (pl.col("kind") == "comm")).to_dicts():
            launch = launches.get(k["correlation"])
            op = colls[k["coll_id"]]["op"]
            if launch is not None and op == "all_to_all":
                rows += _grouped_ranges(r, launch, k["coll_id"], colls[k["coll_id"]]["nranks"],
                                        before[k["correlation"]])
                continue
            if launch is None or op not in _OP_CALL:
                continue
            rows.append({"rank": r, "lane": launch["lane"], "kind": "annotation", "name": _OP_CALL[op],
                         "ts_ns": launch["ts_ns"], "dur_ns": launch["dur_ns"], "coll_id": k["coll_id"],
                         "cat": "user_annotation"})
    extra = schema.conform("events", pa.Table.from_pylist(rows)).select(tables["events"].column_names)
    merged = pa.concat_tables([tables["events"], extra.cast(tables["events"].schema)], promote_options="permissive")
    return {**tables, "events": merged.unify_dictionaries().combine_chunks()}


#: Spacing of the ranges PyTorch's all_to_all makes before its kernel launch (ns).
_GROUP_GAP = 100


def _grouped_ranges(rank: int, launch: dict[str, Any], coll_id: int, nranks: int,
                    after: int | None) -> list[dict[str, Any]]:
    """PyTorch's all_to_all as NCCL records it: ncclGroupStart, a ncclSend and a ncclRecv per comm
    rank (itself too), and ncclGroupEnd around the one SendRecv kernel launch; all after the
    thread's call before the launch (`after`), as one thread's calls are."""
    names = ["ncclGroupStart"] + ["ncclSend", "ncclRecv"] * nranks
    gap = _GROUP_GAP if after is None else max(2, min(_GROUP_GAP, (launch["ts_ns"] - after) // (len(names) + 2)))
    t0 = launch["ts_ns"] - gap * (len(names) + 1)
    rows = [{"rank": rank, "lane": launch["lane"], "kind": "annotation", "name": n, "ts_ns": t0 + gap * i,
             "dur_ns": gap // 2, "coll_id": None if i == 0 else coll_id, "cat": "user_annotation"}
            for i, n in enumerate(names)]
    rows.append({"rank": rank, "lane": launch["lane"], "kind": "annotation", "name": "ncclGroupEnd",
                 "ts_ns": launch["ts_ns"] - gap // 2, "dur_ns": launch["dur_ns"] + gap,
                 "coll_id": None, "cat": "user_annotation"})
    return rows


def _has_nccl_ranges(tables: dict[str, pa.Table]) -> bool:
    import pyarrow.compute as pc

    names = tables["events"].column("name").cast(pa.string())
    return bool(pc.any(pc.is_in(names, pa.array(list(_OP_CALL.values()) + list(_INITS)))).as_py())


def write_nsys(tables: dict[str, pa.Table], out: str | Path, *, release: str = "2024.5",
               nccl: str = "2.27") -> list[Path]:
    """Write the run as one Nsight Systems SQLite export per host (`<host>.sqlite`); NCCL's own
    ranges are added first (`with_nccl_ranges`) unless the tables have them."""
    if release not in RELEASES:
        raise ValueError(f"release {release!r}: one of {', '.join(RELEASES)}")
    if nccl not in NCCL_ERAS:
        raise ValueError(f"nccl {nccl!r}: one of {', '.join(NCCL_ERAS)}")
    if not _has_nccl_ranges(tables):
        tables = with_nccl_ranges(tables, nccl)
    rel = RELEASES[release]
    payloads = rel["json"] and nccl != "2.18"
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ranks = tables["ranks"].to_pylist()
    groups = {g["group"]: g for g in tables["groups"].to_pylist()}
    colls = {c["coll_id"]: c for c in tables["collectives"].to_pylist()}
    world = next((g for g in groups.values() if g["group"] == f"0x{comm_hash(WORLD):016x}"),
                 {"group": WORLD, "ranks": sorted(r["rank"] for r in ranks), "size": len(ranks)})
    by_host: dict[str, list[dict[str, Any]]] = {}
    for info in ranks:
        by_host.setdefault(info["host"], []).append(info)
    by_rank: dict[int, list[dict[str, Any]]] = {}
    for e in tables["events"].to_pylist():
        by_rank.setdefault(e["rank"], []).append(e)
    paths = []
    for host, infos in sorted(by_host.items()):
        path = out / f"{host}.sqlite"

        def write(tmp: str, host: str = host, infos: list[dict[str, Any]] = infos) -> None:
            with closing(sqlite3.connect(tmp)) as db:  # atomic: the exclusive temporary, renamed over `path`
                _write_host(db, rel, payloads, nccl, host, infos, by_rank, groups, colls, world)
                db.commit()

        atomic_write_with(path, write)
        paths.append(path)
    return paths


_INITS = ("ncclCommInitRankConfig", "ncclCommSplit")


def _write_host(db: sqlite3.Connection, rel: dict[str, bool], payloads: bool, nccl: str, host: str,
                infos: list[dict[str, Any]], by_rank: dict[int, list[dict[str, Any]]],
                groups: dict[str, dict[str, Any]], colls: dict[int, dict[str, Any]], world: dict[str, Any]) -> None:
    _schema(db, rel)
    s = _Strings()
    host_events = [e for info in infos for e in by_rank.get(info["rank"], [])]
    base = min((e["ts_ns"] for e in host_events), default=0) - 1_000_000
    kernels, runtime, syncs, nvtx, records = [], [], [], [], []
    nccl_domain = 1

    def nvtx_row(start: int, end: int, text: str, gtid: int, domain: int, json_text: str | None) -> None:
        row: dict[str, Any] = {"start": start, "end": end, "eventType": EVENT_TYPES["NvtxPushPopRange"],
                               "text": None if rel["text_id"] else text, "globalTid": gtid, "endGlobalTid": None,
                               "domainId": domain}
        if rel["text_id"]:
            row["textId"] = s(text)
        if rel["json"]:
            row["jsonText"] = json_text
        nvtx.append(row)

    for info in infos:
        r, pid, dev = info["rank"], info["pid"], info["local_device"]
        gtid = _gtid(pid, 1)
        nvtx.append({"start": 0, "end": None, "eventType": EVENT_TYPES["NvtxDomainCreate"], "text": "NCCL",
                     "globalTid": gtid, "endGlobalTid": None, "domainId": nccl_domain,
                     **({"textId": None} if rel["text_id"] else {}), **({"jsonText": None} if rel["json"] else {})})
        member = [world] + [g for g in groups.values() if r in g["ranks"] and g is not world]
        inits = 0
        peer_of: dict[tuple[int, str], int] = {}  # (all_to_all, ncclSend/ncclRecv) -> the next comm rank
        for e in by_rank.get(r, []):
            start, end = e["ts_ns"] - base, e["ts_ns"] - base + e["dur_ns"]
            kind = e["kind"]
            if kind == "annotation":
                pl: dict[str, Any] | None = None
                if e["name"] in _INITS and inits < len(member):
                    g = member[inits]
                    inits += 1
                    pl = {"NCCL communicator ID": comm_hash(g["group"]), "No. of ranks": g["size"],
                          "Rank": g["ranks"].index(r), "CUDA device": dev}
                    if e["name"] == "ncclCommSplit":
                        pl["Parent NCCL communicator ID"] = comm_hash("world")
                elif e["coll_id"] is not None and e["coll_id"] in colls:
                    c = colls[e["coll_id"]]
                    nbytes = c["out_bytes"] if c["op"] in ("reduce_scatter", "recv") else c["in_bytes"]
                    pl = {"NCCL communicator ID": comm_hash(c["group"]), "Message size [bytes]": nbytes}
                    if c["op"] == "all_to_all":  # one call of its group: the bytes to or from one peer
                        peer = peer_of.get((c["coll_id"], e["name"]), 0)
                        peer_of[(c["coll_id"], e["name"])] = peer + 1
                        splits = c["in_splits"] if e["name"] == "ncclSend" else c["out_splits"]
                        pl.update({"Message size [bytes]": splits[peer], "Peer rank": peer})
                    elif c["op"] in ("send", "recv"):
                        pl["Peer rank"] = groups[c["group"]]["ranks"].index(c["peer"])
                    elif c["op"] in ("all_reduce", "reduce_scatter", "reduce"):
                        pl["Reduction operation"] = "Sum"
                domain = nccl_domain if e["name"].startswith("nccl") else 0
                nvtx_row(start, end, e["name"], gtid, domain, json.dumps(pl) if pl is not None and payloads else None)
            elif kind == "runtime":
                runtime.append((start, end, 1, gtid, e["correlation"], s(e["name"]), 0, None))
            elif kind == "sync":
                event_id = len(records) + 1
                if e["sync_lane"] is not None and e["sync_correlation"] is not None:
                    records.append((dev, 1, _stream(e["sync_lane"]), e["sync_correlation"], _gpid(pid), event_id))
                syncs.append((start, end, dev, 1, _stream(e["lane"]), e["correlation"], _gpid(pid),
                              _SYNC_TYPE.get(e["name"], 0), event_id))
            else:
                name = kernel_name(e["name"], nccl) if kind == "comm" else e["name"]
                short = name.split("(", 1)[0]
                kernels.append((start, end, dev, 1, _stream(e["lane"]), e["correlation"], _gpid(pid), s(name),
                                s(short), *(1,) * 9, *((s(name),) if rel["mangled"] else ())))
        db.execute("INSERT INTO PROCESSES VALUES (?, ?, ?)", (_gpid(pid), pid, "python"))
        db.execute("INSERT INTO ThreadNames VALUES (?, ?, ?)", (s("python"), 0, gtid))
    for dev in sorted({info["local_device"] for info in infos}):
        db.execute("INSERT INTO TARGET_INFO_GPU VALUES (?, ?, ?, ?, ?, ?, ?)",
                   (dev, DEVICE_NAME, f"0000:{0x18 + dev:02x}:00.0", 1, 80 << 30, 132, f"GPU-{host}-{dev}"))
    _insert(db, "CUPTI_ACTIVITY_KIND_KERNEL", kernels)
    _insert(db, "CUPTI_ACTIVITY_KIND_RUNTIME", runtime)
    _insert(db, "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", syncs)
    if rel["cuda_event"]:
        _insert(db, "CUPTI_ACTIVITY_KIND_CUDA_EVENT", records)
    cols = list(nvtx[0]) if nvtx else []
    _insert(db, "NVTX_EVENTS", [tuple(row.get(c) for c in cols) for row in nvtx], cols)
    if rel["session_start"]:
        db.execute("INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (?, ?, ?)", (base, "", ""))
    if rel["enum"]:
        db.executemany("INSERT INTO ENUM_NSYS_EVENT_TYPE VALUES (?, ?, ?)",
                       [(i, n, n) for n, i in EVENT_TYPES.items()])
    if rel["system_env"]:
        db.execute("INSERT INTO TARGET_INFO_SYSTEM_ENV VALUES (?, ?, ?, ?, ?)", (0, "", "Hostname", 0, host))
    db.executemany("INSERT INTO StringIds VALUES (?, ?)", [(i, t) for t, i in s.ids.items()])


def _insert(db: sqlite3.Connection, table: str, rows: Iterable[tuple[Any, ...]], cols: list[str] | None = None) -> None:
    rows = list(rows)
    if not rows:
        return
    names = f" ({', '.join(cols)})" if cols else ""
    db.executemany(f"INSERT INTO {table}{names} VALUES ({', '.join('?' * len(rows[0]))})", rows)


def _stream(lane: str) -> int:
    return int(str(lane).rsplit("stream", 1)[-1])
