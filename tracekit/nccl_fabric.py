"""The fabric NCCL built, from NCCL logs: cross-log rank resolution at ingest, and a summary per
communicator (ranks, hosts, channels by transport, NICs, PXN/GDR/NVLS/CollNet) for `info`.

NCCL prints communicator-local ranks. Each log maps the ranks it can (its own processes, through
the world communicator); `groups.rank_map` (index = communicator rank, value = global rank)
carries that mapping, and ingest merges the maps of every log so that peers a log could not name
(a process whose log is another file) get their global rank here.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from tracekit import schema
from tracekit._text import one_line
from tracekit.finding import Finding
from tracekit.results import Result

NCCL_LOG = "nccl_log"


# -- ingest: merging what several logs (and other sources) know ----------------------------------


def merge_rank_maps(maps: Iterable[Sequence[int | None] | None]) -> list[int | None] | None:
    """Element-wise first known global rank over several logs' maps of one communicator."""
    out: list[int | None] | None = None
    for m in maps:
        if not m:
            continue
        if out is None:
            out = list(m)
            continue
        if len(m) > len(out):
            out.extend([None] * (len(m) - len(out)))
        for i, v in enumerate(m):
            if out[i] is None and v is not None:
                out[i] = v
    return out


def rank_maps(groups: pa.Table) -> dict[str, list[int | None]]:
    """group -> rank_map, for the groups that have one."""
    if "rank_map" not in groups.column_names:
        return {}
    out = {}
    for g, rm in zip(groups.column("group").to_pylist(), groups.column("rank_map").to_pylist(), strict=True):
        if g is not None and rm:
            out[str(g)] = rm
    return out


def resolve_peers(table: pa.Table, maps: Mapping[str, Sequence[int | None]], pairs: Sequence[tuple[str, str]]
                  ) -> tuple[pa.Table, int]:
    """Fill null global-rank columns from their communicator-local twins through `maps`
    (`pairs` = (global column, local column)); returns the table and how many stayed unknown.
    Column-wise (numpy per communicator), so a run's million-row collectives table is never
    turned into Python objects."""
    if table.num_rows == 0 or not maps or "group" not in table.column_names:
        return table, 0
    group = table.column("group").cast(pa.string()).combine_chunks().dictionary_encode()
    names = group.dictionary.to_pylist()
    codes = group.indices.fill_null(len(names)).to_numpy(zero_copy_only=False)
    names.append(None)  # a null group looks its map up as ""
    unknown = 0
    for glob_col, local_col in pairs:
        if glob_col not in table.column_names or local_col not in table.column_names:
            continue
        glob = table.column(glob_col).combine_chunks()
        local = table.column(local_col).combine_chunks()
        need = (glob.is_null().to_numpy(zero_copy_only=False)
                & local.is_valid().to_numpy(zero_copy_only=False))
        if not need.any():
            continue
        loc = local.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
        values = glob.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        valid = ~glob.is_null().to_numpy(zero_copy_only=False)
        filled = np.zeros(len(need), bool)
        for code in np.unique(codes[need]):
            rm = maps.get(names[code] or "")
            if rm is None:
                continue
            lut = np.array([-1 if r is None else r for r in rm], np.int64)
            known = np.array([r is not None for r in rm], bool)
            rows = np.flatnonzero(need & (codes == code) & (loc >= 0) & (loc < len(lut)))
            rows = rows[known[loc[rows]]]
            values[rows] = lut[loc[rows]]
            filled[rows] = True
        unknown += int(need.sum() - filled.sum())
        if filled.any():
            idx = table.schema.get_field_index(glob_col)
            typ = table.schema.field(glob_col).type
            table = table.set_column(idx, table.schema.field(glob_col),
                                     pa.array(values, typ, mask=~(valid | filled)))
    return table, unknown


def dedup_channels(table: pa.Table) -> pa.Table:
    """One row per edge when several logs describe the same rank (a node log and per-process logs)."""
    if table.num_rows == 0:
        return table
    key = [c for c in ("group", "rank", "channel", "pattern", "direction", "peer_comm_rank", "peer_rank")
           if c in table.column_names]
    df = pl.from_arrow(table.select(key))
    assert isinstance(df, pl.DataFrame)
    df = df.with_columns([pl.col(c).cast(pl.String) for c in ("group", "pattern", "direction") if c in key])
    keep = df.with_row_index("_i").unique(subset=key, keep="first", maintain_order=True)["_i"].to_numpy()
    if len(keep) == table.num_rows:
        return table
    return table.take(pa.array(keep))


#: Rows of the collectives table `fill_algo_proto` joins at a time (bounds its memory).
FILL_CHUNK_ROWS = 1 << 16

_FILL_KEYS = ["group", "seq", "op", "in_bytes", "nranks", "rank", "algo", "proto"]


def fill_algo_proto(coll: pa.Table, donors: pa.Table | None = None, *,
                    chunk_rows: int | None = None) -> tuple[pa.Table, int]:
    """Give collectives without algo/proto the choice NCCL logged for the same call elsewhere.

    NCCL before 2.24 prints its choice on rank 0 only, and a profiler trace prints none: a call is
    the same on every rank of a communicator, so rows of one (group, seq, op, bytes) share it;
    and NCCL's choice depends only on (op, bytes, communicator size), so a row that still has none
    takes the one the logs show for that (rank, op, in_bytes, nranks) when they agree on it.
    The lookups are built from the rows that have a choice; the table itself is joined to them
    `chunk_rows` (default FILL_CHUNK_ROWS) rows at a time, so a million-row run is never held as
    several joined copies.
    """
    if coll.num_rows == 0 or "algo" not in coll.column_names:
        return coll, 0
    chunk_rows = chunk_rows or FILL_CHUNK_ROWS
    missing = int(coll.column("algo").null_count)
    if not missing:
        return coll, 0
    lookups = fill_lookups([fill_have(coll.slice(lo, chunk_rows)) for lo in range(0, coll.num_rows, chunk_rows)],
                           donors)
    algos: list[pa.Array] = []
    protos: list[pa.Array] = []
    filled = 0
    for lo in range(0, coll.num_rows, chunk_rows):
        algo, proto, n = lookups.apply(coll.slice(lo, chunk_rows))
        filled += n
        algos.append(algo)
        protos.append(proto)
    if not filled:
        return coll, 0
    for name, values in (("algo", algos), ("proto", protos)):
        idx = coll.schema.get_field_index(name)
        coll = coll.set_column(idx, coll.schema.field(name),
                               pa.chunked_array(values, pa.string()).combine_chunks().dictionary_encode()
                               .cast(coll.schema.field(name).type))
    return coll, filled


def fill_have(part: pa.Table) -> pl.DataFrame:
    """The rows of `part` (collectives) that have NCCL's choice: what `fill_lookups` is built from,
    in the table's row order (the first row of a call wins)."""
    if part.num_rows:
        part = part.filter(pc.and_(pc.is_valid(part.column("algo")), pc.is_valid(part.column("seq"))))
    return _fill_frame(part)


@dataclass
class FillLookups:
    """NCCL's algo/proto per call (group, seq, op, bytes) and per (rank, op, bytes, size)."""

    same_call: pl.DataFrame
    agree: pl.DataFrame | None

    def apply(self, part: pa.Table) -> tuple[pa.Array, pa.Array, int]:
        """algo and proto of each row of `part` (a slice of collectives) after the fill, and how
        many rows were filled; row by row, so any slicing of a table gives the same values."""
        df = _fill_frame(part)
        out = df.join(self.same_call, on=["group", "seq", "op", "in_bytes"], how="left", nulls_equal=False,
                      maintain_order="left")
        if self.agree is not None:
            out = out.join(self.agree, on=["rank", "op", "in_bytes", "nranks"], how="left", nulls_equal=False,
                           maintain_order="left")
        else:
            out = out.with_columns(pl.lit(None, pl.String).alias("_a2"), pl.lit(None, pl.String).alias("_p2"))
        algo = out.select(pl.coalesce("algo", "_a1", "_a2")).to_series()
        proto = out.select(pl.when(pl.col("algo").is_not_null()).then(pl.col("proto"))
                           .when(pl.col("_a1").is_not_null()).then(pl.col("_p1"))
                           .otherwise(pl.col("_p2"))).to_series()
        filled = int((df["algo"].is_null() & algo.is_not_null()).sum())
        return algo.to_arrow().cast(pa.string()), proto.to_arrow().cast(pa.string()), filled


def fill_lookups(have: Sequence[pl.DataFrame], donors: pa.Table | None = None) -> FillLookups:
    """The lookups of `fill_algo_proto` from the rows that have a choice (`fill_have` of the
    table's slices, in row order) and the donors (other logs' rows of the same ranks)."""
    frame = pl.concat(list(have)) if have else fill_have(schema.empty("collectives"))
    same_call = frame.group_by(["group", "seq", "op", "in_bytes"]).agg(
        pl.col("algo").first().alias("_a1"), pl.col("proto").first().alias("_p1"))
    pool = frame.select("rank", "op", "in_bytes", "nranks", "algo", "proto")
    if donors is not None and donors.num_rows:
        d = pl.from_arrow(donors.select(["rank", "op", "in_bytes", "nranks", "algo", "proto"]))
        assert isinstance(d, pl.DataFrame)
        d = d.with_columns([pl.col(c).cast(pl.String) for c in ("op", "algo", "proto")]).filter(
            pl.col("algo").is_not_null())
        pool = pl.concat([pool, d.select(pool.columns).cast(pool.schema)])
    agree = None
    if pool.height:
        agree = pool.group_by(["rank", "op", "in_bytes", "nranks"]).agg(
            pl.col("algo").n_unique().alias("_na"), pl.col("proto").n_unique().alias("_np"),
            pl.col("algo").first().alias("_a2"), pl.col("proto").first().alias("_p2")).filter(
            (pl.col("_na") == 1) & (pl.col("_np") == 1)).drop("_na", "_np")
    return FillLookups(same_call, agree)


def _fill_frame(part: pa.Table) -> pl.DataFrame:
    df = pl.from_arrow(part.select(_FILL_KEYS))
    assert isinstance(df, pl.DataFrame)
    return df.with_columns([pl.col(c).cast(pl.String) for c in ("group", "op", "algo", "proto")])


def fill_rank_facts(ranks: pa.Table, others: pa.Table | None) -> pa.Table:
    """Fill a rank's null columns (bus_id, host, pid, GPU, NCCL version, ...) from other sources
    of the same rank, e.g. a profiler trace's row from the NCCL log's."""
    if others is None or others.num_rows == 0 or ranks.num_rows == 0:
        return ranks
    by_rank: dict[int, dict[str, Any]] = {}
    for row in others.to_pylist():
        cur = by_rank.setdefault(row["rank"], {})
        for k, v in row.items():
            if v is not None and cur.get(k) is None:
                cur[k] = v
    rows = ranks.to_pylist()
    keep = {"rank", "source_file", "source_format", "clock_offset_ns"}
    fill = [n for n in others.column_names if n not in keep]
    extra = [f for f in others.schema if f.name not in ranks.column_names]
    changed = False
    for row in rows:
        src = by_rank.get(row["rank"], {})
        for k in fill:
            if row.get(k) is None and src.get(k) is not None:
                row[k] = src[k]
                changed = True
    if not changed:
        return ranks
    fields = [f.with_type(pa.string()) if pa.types.is_dictionary(f.type) else f for f in [*ranks.schema, *extra]]
    return schema.conform("ranks", pa.Table.from_pylist(rows, schema=pa.schema(fields)))


# -- info: the fabric per communicator -----------------------------------------------------------


class Communicator(Result, frozen=False, kw_only=True):
    """What NCCL built for one communicator, as its logs tell."""

    group: str
    desc: str | None
    size: int | None
    ranks: list[int]
    hosts: list[str]
    channels: int | None
    transports: dict[str, dict[str, int]]
    nics_used: dict[str, list[str]]
    nics_available: dict[str, list[str]]
    network: list[str]
    pxn: bool | None
    gdr: bool | None
    nvls: bool
    collnet: bool
    notes: list[str] = msgspec.field(default_factory=list)


def communicators(groups: pa.Table, channels: pa.Table, ranks: pa.Table) -> list[Communicator]:
    """One summary per NCCL communicator that has channels or NCCL facts (groups from NCCL logs)."""
    out: list[Communicator] = []
    if groups.num_rows == 0:
        return out
    g_rows = [g for g in groups.to_pylist() if g.get("backend") == "nccl" and "rank_map" in g]
    if not g_rows:
        return out
    ch = channels.to_pylist() if channels.num_rows else []
    by_group: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in ch:
        by_group[str(row["group"])].append(row)
    rank_rows: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in ranks.to_pylist() if ranks.num_rows else []:
        rank_rows[r["rank"]].append(r)
    for g in g_rows:
        name = str(g["group"])
        rows = by_group.get(name, [])
        members = sorted(set(g.get("ranks") or []) | {r["rank"] for r in rows})
        # a run may hold several jobs whose rank numbers overlap: a rank's facts are the ones of the
        # host its channels name, when they name one
        placed = {r["rank"]: r["host"] for r in rows if r.get("host")}

        def facts(rank: int, placed: dict[int, str] = placed) -> dict[str, Any]:
            cands = rank_rows.get(rank, [])
            host = placed.get(rank)
            if host is not None:
                cands = [c for c in cands if c.get("host") == host] or [c for c in cands if c.get("net_devices")]
            return cands[0] if len(cands) >= 1 else {}

        hosts = sorted(set(placed.values()) if placed else {h for r in members if (h := facts(r).get("host"))})
        transports: dict[str, dict[str, int]] = {}
        for pattern in ("ring", "tree", "p2p", "nvls", "collnet"):
            counts = Counter(r.get("transport") or "?" for r in rows if r.get("pattern") == pattern
                             and r.get("direction") in ("send", "up", "down", "multicast"))
            if counts:
                transports[pattern] = dict(sorted(counts.items()))
        used: dict[str, set[str]] = defaultdict(set)
        for r in rows:
            if r.get("transport") == "NET" and r.get("nic"):
                used[r.get("host") or "?"].add(str(r["nic"]))
        available: dict[str, set[str]] = defaultdict(set)
        networks: set[str] = set()
        for r in (sorted(placed) if placed else members):
            rr = facts(r)
            if rr.get("net"):
                networks.add(str(rr["net"]))
            for dev in rr.get("net_devices") or []:
                available[placed.get(r) or rr.get("host") or "?"].add(dev.split(" ", 1)[1] if " " in dev else dev)
        net_rows = [r for r in rows if r.get("transport") == "NET"]
        channels_n = g.get("n_channels")
        if channels_n is None and rows:
            channels_n = len({r["channel"] for r in rows if r.get("pattern") == "ring"}) or None
        pxn = g.get("pxn")
        if any(r.get("proxy_rank") is not None or r.get("proxy_comm_rank") is not None for r in net_rows):
            pxn = True
        gdr = g.get("gdr")
        if net_rows and gdr is None:
            gdr = any("GDRDMA" in (r.get("detail") or "") for r in net_rows)
        comm = Communicator(
            group=name, desc=g.get("desc"), size=g.get("size"), ranks=members, hosts=hosts, channels=channels_n,
            transports=transports, nics_used={h: sorted(v) for h, v in sorted(used.items())},
            nics_available={h: sorted(v) for h, v in sorted(available.items())}, network=sorted(networks),
            pxn=pxn, gdr=gdr, nvls=bool(g.get("nvls")) or any(r.get("pattern") == "nvls" for r in rows),
            collnet=bool(g.get("collnet")) or any(r.get("pattern") == "collnet" for r in rows))
        untyped = sum(1 for r in rows if r.get("transport") is None and r.get("pattern") in ("ring", "tree"))
        comm.notes = _notes(comm, net_rows, len(hosts), untyped)
        if g.get("n_nodes") and g["n_nodes"] > len(hosts) and hosts:
            comm.notes.append(f"{g['n_nodes']} nodes in the communicator, logs from {len(hosts)}: the others' "
                              "channels are not in this run")
        out.append(comm)
    out.sort(key=lambda c: (-(c.size or 0), c.group))
    return out


def _notes(c: Communicator, net_rows: list[dict[str, Any]], n_hosts: int, untyped: int = 0) -> list[str]:
    """The sentences a user should see at once about this communicator's fabric."""
    notes: list[str] = []
    if untyped:
        notes.append(f"{untyped} ring/tree edge(s) have no transport line: the logs stop before NCCL printed every "
                     "connection (cut, or hung during setup), so transports and NICs are partial")
    plugins = Counter((r.get("detail") or "").split("/", 1)[0] for r in net_rows)
    if plugins.get("Socket"):
        share = plugins["Socket"] / sum(plugins.values())
        part = "" if share == 1 else " on part of the channels"
        notes.append(f"inter-node traffic goes over NET/Socket (TCP){part}: this job fell back to sockets "
                     "(no IB/RoCE or plugin in use)")
    if net_rows and c.gdr is False:
        notes.append("GPUDirect RDMA is off: NET traffic is staged through host memory")
    for host, avail in c.nics_available.items():
        used = c.nics_used.get(host, [])
        if used and avail and len(used) < len(avail) and not untyped:
            idle = [nic for nic in avail if nic not in used]
            notes.append(f"only {len(used)} of {len(avail)} NICs on {host} carried traffic; idle: {', '.join(idle)} "
                         f"(used: {', '.join(used)})")
    if n_hosts > 1 and not net_rows and c.transports:
        notes.append("no NET channel in the logs although ranks sit on several hosts (only part of the ranks logged?)")
    return notes


def nccl_warnings(messages: pa.Table, *, per_rank: int = 1) -> list[Finding]:
    """One finding per rank that logged NCCL WARN/ABORT lines or a watchdog timeout: the first of
    them (with its time when the log has one) and how many there were."""
    if messages.num_rows == 0:
        return []
    by_rank: dict[int | None, list[dict[str, Any]]] = defaultdict(list)
    for m in messages.to_pylist():
        level, sub = str(m.get("level") or ""), str(m.get("subsystem") or "")
        if level in ("WARN", "ABORT", "ERROR") or sub == "watchdog":
            by_rank[m.get("rank")].append(m)
    out = []
    for rank in sorted(by_rank, key=lambda r: (r is None, r or 0)):
        rows = sorted(by_rank[rank], key=lambda m: (m.get("ts_ns") is None, m.get("ts_ns") or 0, m.get("line") or 0))
        for m in rows[:per_rank]:
            who = f"rank {rank}" if rank is not None else f"{m.get('host') or '?'}:{m.get('pid') or '?'}"
            more = f" ({len(rows)} in all)" if len(rows) > 1 else ""
            text = " ".join(str(m.get("message") or "").split())
            text = one_line(text)[:200]
            out.append(Finding(kind="nccl_warn", severity="warning", ranks=() if rank is None else (rank,),
                               text=f"{who} logged {m.get('level')}{more}: {text}",
                               data={"ts_ns": m.get("ts_ns"), "line": m.get("line"), "host": m.get("host")}))
    return out


# -- replay: the rings, channel counts and NICs NCCL built, for the decomposer --------------------


Hop = tuple[int, int]


@dataclass(frozen=True)
class NcclFabric:
    """What replay takes from the fabric NCCL built, keyed by the group names the collectives carry.

    `rings`: per group one rank cycle (global ranks) per channel, as many as NCCL's channels;
    `channels`: NCCL's channel count; `hops`: per group, (channel, rank, next rank) of a ring edge
    that crossed the network -> (the rank whose NIC sent it, the rank whose NIC received it): the
    sender itself, its PXN proxy, or the GPU whose NIC the log names; `via`: the NCCL
    communicator each group was taken from (itself, or the one with the same members)."""

    rings: dict[str, list[list[int]]] = field(default_factory=dict)
    channels: dict[str, int] = field(default_factory=dict)
    hops: dict[str, dict[tuple[int, int, int], Hop]] = field(default_factory=dict)
    via: dict[str, str] = field(default_factory=dict)


def replay_fabric(groups: pa.Table, channels: pa.Table, ranks: pa.Table | None = None) -> NcclFabric:
    """Rings, channel counts and network hops per group from the `channels` table and the ring
    orders rank 0 printed (`groups.ring_orders`); a group without NCCL rows (a profiler's process
    group) takes those of the NCCL communicator with exactly its members. `ranks` (host and
    local_device per rank) places NCCL's NET devices next to their GPUs."""
    g_rows = groups.to_pylist() if groups.num_rows else []
    by_group: dict[str, list[dict[str, Any]]] = defaultdict(list)
    ch_rows = channels.to_pylist() if channels.num_rows else []
    for row in ch_rows:
        if row.get("group") is not None and row.get("rank") is not None:
            by_group[str(row["group"])].append(row)
    host_of = {int(r["rank"]): r["host"] for r in ch_rows if r.get("host") and r.get("rank") is not None}
    local: dict[tuple[str, int], int] = {}
    if ranks is not None and ranks.num_rows and "local_device" in ranks.column_names:
        for r in ranks.select(["rank", "local_device"]).to_pylist():
            h = host_of.get(int(r["rank"]))
            if h is not None and r["local_device"] is not None:
                local.setdefault((h, int(r["local_device"])), int(r["rank"]))
    rings: dict[str, list[list[int]]] = {}
    counts: dict[str, int] = {}
    hops: dict[str, dict[tuple[int, int, int], Hop]] = {}
    members: dict[str, tuple[int, ...]] = {}
    for g in g_rows:
        name = str(g["group"])
        rm = g.get("rank_map") or []
        rows = by_group.get(name, [])
        if not rm and not rows:
            continue
        if rm and all(r is not None for r in rm):
            members[name] = tuple(sorted(rm))
        n_ch = g.get("n_channels")
        edge_rings = _edge_rings(rows, len(rm) if rm else None)
        order_rings = _order_rings(g.get("ring_orders"), rm)
        n = n_ch or max([len(order_rings), max(edge_rings, default=-1) + 1])
        if n:
            counts[name] = int(n)
            got = [edge_rings.get(c) or (order_rings[c % len(order_rings)] if order_rings else None)
                   for c in range(int(n))]
            if all(r is not None for r in got):
                rings[name] = [r for r in got if r is not None]
        h = _hops(rows, local)
        if h:
            hops[name] = h
    via = {name: name for name in set(rings) | set(counts) | set(hops)}
    nccl_by_members: dict[tuple[int, ...], list[str]] = defaultdict(list)
    for name in sorted(members):
        if name in via:
            nccl_by_members[members[name]].append(name)
    for g in g_rows:
        name = str(g["group"])
        if name in via or g.get("backend") == "gloo" or not g.get("ranks_complete"):
            continue
        found = nccl_by_members.get(tuple(sorted(g.get("ranks") or [])))
        if not found:
            continue
        src = next((c for c in found if c in rings), found[0])
        via[name] = src
        for table in (rings, counts, hops):
            if src in table:
                table[name] = table[src]  # type: ignore[index]
    return NcclFabric(rings=rings, channels=counts, hops=hops, via=via)


def _edge_rings(rows: list[dict[str, Any]], size: int | None) -> dict[int, list[int]]:
    """Channel -> the ring cycle the ring `send` edges (global ranks) close, when they close one
    over the whole communicator."""
    nxt: dict[int, dict[int, int]] = defaultdict(dict)
    for r in rows:
        if r.get("pattern") == "ring" and r.get("direction") == "send" and r.get("peer_rank") is not None \
                and r.get("channel") is not None:
            nxt[int(r["channel"])][int(r["rank"])] = int(r["peer_rank"])
    out: dict[int, list[int]] = {}
    for ch, step in nxt.items():
        cur = min(step)
        cycle = [cur]
        while step.get(cur) is not None and step[cur] != cycle[0] and len(cycle) <= len(step):
            cur = step[cur]
            cycle.append(cur)
        closed = step.get(cur) == cycle[0]
        if closed and len(cycle) == len(step) and (size is None or len(cycle) == size):
            out[ch] = cycle
    return out


def _order_rings(orders: Sequence[Sequence[int]] | None, rank_map: Sequence[int | None]) -> list[list[int]]:
    """The printed ring orders (communicator ranks) in global ranks, when every rank maps."""
    if not orders or not rank_map or any(r is None for r in rank_map):
        return []
    out = []
    for o in orders:
        if any(not 0 <= x < len(rank_map) for x in o):
            return []
        out.append([int(rank_map[x]) for x in o])  # type: ignore[arg-type]
    return out


_NET_DEV = re.compile(r"^[A-Za-z_]\w*/(\d+)")


def _nic_index(row: dict[str, Any]) -> str | None:
    nic = row.get("nic") or (row.get("detail") or "").split("/GDR", 1)[0] or None
    return f"{row.get('host')}|{nic}" if nic else None


def _hops(rows: list[dict[str, Any]], local: Mapping[tuple[str, int], int] | None = None
          ) -> dict[tuple[int, int, int], Hop]:
    """(channel, rank, next) -> (sending NIC's rank, receiving NIC's rank) for ring edges NCCL sent
    over the network. NCCL's NET device n of a host belongs to the rank on GPU n of that host
    (`local`: (host, GPU index) -> rank; NICs listed in PCI order next to their GPUs, the rail
    layout the replay's topologies assume), else to the rank that uses it most without a proxy."""
    net = [r for r in rows if r.get("pattern") == "ring" and r.get("transport") == "NET"
           and r.get("channel") is not None]
    if not net:
        return {}
    use: dict[str, Counter[int]] = defaultdict(Counter)
    home: dict[str, int] = {}
    for r in net:
        nic = _nic_index(r)
        if nic is None:
            continue
        if r.get("proxy_rank") is None:
            use[nic][int(r["rank"])] += 1
        m = _NET_DEV.match(r.get("detail") or "")
        if m and local and (r.get("host"), int(m.group(1))) in local:
            home[nic] = local[(r["host"], int(m.group(1)))]
    for nic, c in use.items():
        home.setdefault(nic, min(c.items(), key=lambda kv: (-kv[1], kv[0]))[0])
    out: dict[tuple[int, int, int], Hop] = {}
    recv_nic: dict[tuple[int, int, int], int] = {}
    for r in net:
        if r.get("direction") == "recv" and r.get("peer_rank") is not None:
            me = int(r["rank"])
            nic = _nic_index(r)
            recv_nic[(int(r["channel"]), int(r["peer_rank"]), me)] = home.get(nic, me) if nic else me
    for r in net:
        if r.get("direction") != "send" or r.get("peer_rank") is None:
            continue
        me, peer, ch = int(r["rank"]), int(r["peer_rank"]), int(r["channel"])
        nic = _nic_index(r)
        sender = r["proxy_rank"] if r.get("proxy_rank") is not None else (home.get(nic, me) if nic else me)
        out[(ch, me, peer)] = (int(sender), recv_nic.get((ch, me, peer), peer))
    for key, receiver in recv_nic.items():
        out.setdefault(key, (key[1], receiver))
    return out
