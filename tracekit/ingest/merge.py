"""Merging an ingest's sources into the run's tables: which source counts for each rank
(`primary_sources`), the small tables concatenated and de-duplicated, the process groups merged,
what NCCL logs add across sources (global peers, channels, algo/proto fills), the collectives
streamed in sorted slices, and the counters rated into telemetry link samples."""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute
import pyarrow.parquet as pq

from tracekit import schema
from tracekit.manifest import SourceRecord
from tracekit.parsers import registry
from tracekit.store import SMALL_TABLES, parquet_options, take_written

if TYPE_CHECKING:
    from tracekit.ingest.describe import IngestReport
    from tracekit.telemetry import RatesFile

def read_part(run_dir: Path, key: str, name: str) -> pa.Table | None:
    path = run_dir / "sources" / key / f"{name}.parquet"
    if not path.is_file():
        return None
    written = take_written(path)
    if written is not None:
        return schema.conform(name, written)
    return schema.conform(name, pq.ParquetFile(path).read())  # half the cost of read_table on small files


def format_declares(fmt: str | None, flag: str) -> bool:
    """Whether the registry's format `fmt` declares `flag` (a boolean field of `registry.Format`)."""
    spec = registry.get(fmt) if fmt else None
    return spec is not None and bool(getattr(spec, flag))


PER_RANK_TABLES = ("ranks", "collectives", "channels")


def primary_sources(sources: Sequence[SourceRecord], *, having: set[str] | None = None) -> dict[int, list[str]]:
    """For each rank, the source keys whose rows count: every file of the best format for that
    rank (several Kineto windows of one rank all count), but one snapshot (Flight Recorder dumps
    given as both pickle and JSON are the same history). With `having` (source keys), only those
    sources compete: the best source of a table is chosen among the sources that have it."""
    by_rank: dict[int, list[SourceRecord]] = {}
    for s in sources:
        if having is not None and (s.key or "") not in having:
            continue
        for r in s.ranks:
            by_rank.setdefault(r, []).append(s)
    chosen: dict[int, list[str]] = {}
    for r, cands in by_rank.items():
        best = min(registry.priority(c.format) for c in cands)
        keep = sorted((c for c in cands if registry.priority(c.format) == best),
                      key=lambda c: (-c.collectives, -c.events, c.path))
        if format_declares(keep[0].format, "snapshot"):
            keep = keep[:1]
        chosen[r] = sorted(c.key or "" for c in keep)
    return chosen


#: Per-rank tables whose source is chosen among the sources that have the table, not by the
#: rank's best format overall: only NCCL logs describe channels, so a rank traced by the profiler
#: still gets its channels from its NCCL log.
PER_TABLE_CHOICE = ("channels",)


#: Tables that a single source's part gives unchanged: the merged file is a copy of the part
#: (re-encoding millions of telemetry counters cost as much as parsing them).
COPIED_WHEN_ONE_PART = ("counters",)


def merge_tables(run_dir: Path, sources: list[SourceRecord], warnings: list[str],
                 copies: dict[str, Path] | None = None,
                 merge_file: Path | None = None) -> tuple[dict[str, Any], dict[str, int]]:
    """Merge the per-source small tables (deterministic order): each table (None when the run
    has none) and the row counts; `copies` gets the part file of each table in
    COPIED_WHEN_ONE_PART that one source gave alone. The collectives are streamed into
    `merge_file` (default RUN/.merge-collectives.parquet), which stands for the table in the
    result (see `_merge_collectives`). Nothing else in the run is changed (see `store.commit`)."""
    merge_file = merge_file or run_dir / MERGE_FILE
    primary = primary_sources(sources)
    choice = {name: primary_sources(sources, having={s.key or "" for s in sources if _has_part(run_dir, s, name)})
              for name in PER_TABLE_CHOICE}
    aside: dict[str, int] = {}
    for r, keys in primary.items():
        for s in sources:
            if r in s.ranks and (s.key or "") not in keys:
                aside[s.format or "?"] = aside.get(s.format or "?", 0) + 1
    if aside:
        kept = sorted({s.format or "?" for s in sources if any((s.key or "") in primary.get(r, []) for r in s.ranks)})
        also = (" (channels, log messages, NCCL's algo/proto and bus ids are still taken from the NCCL logs)"
                if any(format_declares(fmt, "nccl_facts") for fmt in aside) else "")
        warnings.append("ranks covered by several sources: collectives and events come from "
                        f"{', '.join(kept)}; set aside (still in the run's sources/): "
                        + ", ".join(f"{n} {fmt} rank-source(s)" for fmt, n in sorted(aside.items())) + also)
    tables: dict[str, pa.Table] = {}
    order = sorted(sources, key=lambda s: (min(s.ranks) if s.ranks else -1, s.path))
    for name in SMALL_TABLES:
        if name == "collectives":
            continue  # streamed below, after the groups it resolves peers through are merged
        chosen = choice.get(name, primary)
        parts = []
        part_file = None
        for s in order:
            t = read_part(run_dir, s.key or "", name)
            if t is None:
                continue
            part_file = run_dir / "sources" / (s.key or "") / f"{name}.parquet"
            if name in PER_RANK_TABLES and t.num_rows:
                ranks_here = [r for r in s.ranks if (s.key or "") in chosen.get(r, [])]
                keep = pa.compute.is_in(t.column("rank"), pa.array(ranks_here, t.column("rank").type))
                if not pa.compute.all(keep).as_py():  # filtering copies the table: only when it drops rows
                    t = t.filter(keep)
            if name == "ranks":
                t = t.set_column(t.schema.get_field_index("source_file"), "source_file",
                                 pa.array([s.path] * t.num_rows, pa.string()))
            parts.append(t)
        if not parts:
            continue
        if copies is not None and name in COPIED_WHEN_ONE_PART and len(parts) == 1 and part_file is not None:
            copies[name] = part_file
        table = pa.concat_tables(parts, promote_options="permissive")
        del parts, t  # the one merged copy is all that stays (a big collectives table is not held twice)
        table = table.unify_dictionaries()
        if name != "collectives":  # sorted below, which combines the chunks in the same copy
            table = table.combine_chunks()
        if name == "groups":
            table = _merge_groups(table, warnings)
        elif name in FIRST_WINS:
            table = _first_wins(table, FIRST_WINS[name])
        elif name == "ranks":
            table = table.sort_by([("rank", "ascending"), ("source_file", "ascending")])
        tables[name] = table
    fill = _merge_nccl(run_dir, sources, primary, tables, warnings)
    counts: dict[str, int] = {}
    merged: dict[str, pa.Table | None] = {}
    for name in SMALL_TABLES:
        if name == "collectives":
            written = _merge_collectives(run_dir, order, primary, fill, merge_file)
            merged[name] = written[0] if written else None
            if written:
                counts[name] = written[1]
            continue
        if name not in tables:
            merged[name] = None
            continue
        table = schema.conform(name, tables[name]).combine_chunks()
        merged[name] = table
        counts[name] = table.num_rows
    counts["events"] = sum(s.events for s in sources if any((s.key or "") in primary.get(r, []) for r in s.ranks))
    return merged, counts


#: Where `_merge` streams the run's collectives before `store.commit` moves them into place.
MERGE_FILE = ".merge-collectives.parquet"


#: Rows the collectives merge sorts at once (sources whose ranks interleave are always sorted
#: together) and writes per row group.
MERGE_ROWS = 1 << 16


#: A sort batch larger than this is first split into files of consecutive ranks, sorted one by
#: one (a node's NCCL log holds all its ranks' calls interleaved).
SPLIT_ROWS = 2 * MERGE_ROWS


MERGE_TMP = ".merge-buckets"


_COLL_ORDER = [("rank", "ascending"), ("ts_ns", "ascending"), ("coll_id", "ascending")]


def _merge_collectives(run_dir: Path, order: list[SourceRecord], primary: dict[int, list[str]],
                       fill: _Fill | None, out: Path) -> tuple[Path, int] | None:
    """The run's collectives, in (rank, ts_ns, coll_id) order, written to `out`: (out, rows),
    or None when no source has a collectives part.

    Sources whose ranks interleave (several windows of one rank) are read and sorted together;
    the others one batch of about MERGE_ROWS rows at a time, so memory is bounded by the
    largest source (plus its sort index), never by the run. Each sorted slice then gets the
    NCCL fills (global peers through the rank maps; algo/proto through lookups built in a
    first pass over the same sorted rows) and is appended to `out`. The rows are those of
    sorting the concatenated parts (a stable sort), bit for bit."""
    from tracekit import nccl_fabric

    parts: list[_Part] = []
    schemas = []
    conformed: dict[pa.Schema, pa.Schema] = {}
    for i, s in enumerate(order):
        path = run_dir / "sources" / (s.key or "") / "collectives.parquet"
        if not path.is_file():
            continue
        f = pq.ParquetFile(path)
        stored = f.schema_arrow
        if stored not in conformed:
            conformed[stored] = schema.conform("collectives", schema.empty_table(stored)).schema
        schemas.append(conformed[stored])
        ranks = [r for r in s.ranks if (s.key or "") in primary.get(r, [])]
        parts.append(_Part(min(ranks, default=-1), max(ranks, default=-1), i, path, ranks, f.metadata.num_rows))
    if not parts:
        return None
    unified = pa.unify_schemas(schemas, promote_options="permissive")
    final = schema.conform("collectives", schema.empty_table(unified)).schema
    batches = _merge_batches(parts)
    lookups = None
    odd = 0  # rows with a proto but no algo: they keep it unless some row is filled (as fill_algo_proto)
    if fill is not None:
        have = []
        for table, order in _sorted_batches(run_dir, batches, unified):
            algo, proto = table.column("algo"), table.column("proto")
            odd += int(pa.compute.sum(pa.compute.and_(pa.compute.is_null(algo), pa.compute.is_valid(proto)))
                       .as_py() or 0)
            mask = pa.compute.and_(pa.compute.is_valid(algo), pa.compute.is_valid(table.column("seq")))
            keep = order[mask.to_numpy(zero_copy_only=False)[order]] if order is not None else \
                np.flatnonzero(mask.to_numpy(zero_copy_only=False))
            have.append(nccl_fabric.fill_have(table.take(keep)))
            del table, order
        lookups = nccl_fabric.fill_lookups(have, fill.donors)
        del have
    rows, filled = _write_collectives(run_dir, batches, unified, final, fill, lookups, out)
    if lookups is not None and odd and not filled:
        rows, _ = _write_collectives(run_dir, batches, unified, final, fill, None, out)
    return out, rows


def _write_collectives(run_dir: Path, batches: list[list[_Part]], unified: pa.Schema,
                       final: pa.Schema, fill: _Fill | None, lookups: Any, out: Path) -> tuple[int, int]:
    """Stream the sorted rows into `out` with the NCCL fills: (rows, rows whose algo was filled)."""
    from tracekit import nccl_fabric

    rows = filled = 0
    pending: list[pa.Table] = []
    with pq.ParquetWriter(out, final, **parquet_options(final)) as writer:
        for chunk in _sorted_chunks(run_dir, batches, unified):
            if fill is not None:
                chunk, _ = nccl_fabric.resolve_peers(chunk, fill.maps, [("peer", "peer_local")])
            if lookups is not None:
                algo, proto, n = lookups.apply(chunk)
                filled += n
                for name, values in (("algo", algo), ("proto", proto)):
                    idx = chunk.schema.get_field_index(name)
                    chunk = chunk.set_column(idx, chunk.schema.field(name),
                                             values.dictionary_encode().cast(chunk.schema.field(name).type))
            pending.append(schema.conform("collectives", chunk).cast(final))
            rows += chunk.num_rows
            if sum(t.num_rows for t in pending) >= MERGE_ROWS:
                _write_group(writer, pending)
                pending = []
                pa.default_memory_pool().release_unused()
        if pending or not rows:
            _write_group(writer, pending or [schema.empty_table(final)])
    return rows, filled


@dataclass
class _Part:
    """A source's collectives part in the merge: its primary ranks' range, its place in source
    order, its file, those ranks and its row count."""

    lo: int
    hi: int
    index: int
    path: Path
    ranks: list[int]
    rows: int


def _merge_batches(parts: list[_Part]) -> list[list[_Part]]:
    """Parts grouped into sort batches: parts whose rank ranges overlap always together, the
    others gathered in rank order up to about MERGE_ROWS rows."""
    comps: list[list[_Part]] = []
    hi = None
    for p in sorted(parts, key=lambda p: (p.lo, p.index)):
        if comps and hi is not None and p.lo <= hi:
            comps[-1].append(p)
            hi = max(hi, p.hi)
        else:
            comps.append([p])
            hi = p.hi
    batches: list[list[_Part]] = []
    size = 0
    for comp in comps:
        n = sum(p.rows for p in comp)
        if not batches or (size + n > MERGE_ROWS and size):
            batches.append([])
            size = 0
        batches[-1].extend(comp)
        size += n
    return batches


def _read_batch(batch: list[_Part], unified: pa.Schema) -> Iterable[pa.Table]:
    """A batch's rows in source order, a row group at a time: the rows of the ranks each source
    is primary for, with the run's columns."""
    for part in sorted(batch, key=lambda p: p.index):
        ranks = part.ranks
        f = pq.ParquetFile(part.path)
        for g in range(f.metadata.num_row_groups):
            t = schema.conform("collectives", f.read_row_group(g))
            if t.num_rows:
                keep = pa.compute.is_in(t.column("rank"), pa.array(ranks, t.column("rank").type))
                if not pa.compute.all(keep).as_py():
                    t = t.filter(keep)
            yield _widen(t, unified)


def _rank_buckets(batch: list[_Part], unified: pa.Schema, tmp: Path
                  ) -> list[Path] | None:
    """Split a batch too large to sort in memory into files of consecutive ranks (about
    MERGE_ROWS rows each, a rank never split), each holding its rows in source order (Arrow
    IPC, uncompressed); None when a row has no rank (the batch is then sorted whole)."""
    counts: dict[int, int] = {}
    for part in batch:
        ranks = part.ranks
        col = pq.ParquetFile(part.path).read(columns=["rank"]).column("rank")
        if col.null_count:
            return None
        vals, n = np.unique(col.to_numpy(), return_counts=True)
        wanted = set(ranks)
        for v, c in zip(vals.tolist(), n.tolist(), strict=True):
            if v in wanted:
                counts[v] = counts.get(v, 0) + c
    bounds: list[int] = []  # first rank of each bucket but the first
    size = 0
    for r in sorted(counts):
        if size >= MERGE_ROWS:
            bounds.append(r)
            size = 0
        size += counts[r]
    edges = np.asarray(bounds, np.int64)
    tmp.mkdir(exist_ok=True)
    paths = [tmp / f"{b}.arrows" for b in range(len(bounds) + 1)]
    sinks = [pa.OSFile(str(p), "wb") for p in paths]
    writers = [pa.ipc.new_stream(f, unified) for f in sinks]
    try:
        for t in _read_batch(batch, unified):
            ids = np.searchsorted(edges, t.column("rank").to_numpy(), side="right")
            order = np.argsort(ids, kind="stable")
            t = t.take(order)
            n = np.bincount(ids, minlength=len(paths))
            lo = 0
            for b, c in enumerate(n.tolist()):
                if c:
                    writers[b].write_table(t.slice(lo, c))
                lo += c
            del t
            pa.default_memory_pool().release_unused()
    finally:
        for w, f in zip(writers, sinks, strict=True):
            w.close()
            f.close()
    return paths


def _sorted_batches(run_dir: Path, batches: list[list[_Part]], unified: pa.Schema
                    ) -> Iterable[tuple[pa.Table, np.ndarray | None]]:
    """Each batch's parts (rows of the ranks they are primary for) concatenated in source order,
    with the stable sort index that puts them in _COLL_ORDER (None: in order already); rows with
    no rank (never written) come last, sorted, as a sort of the whole run would put them."""
    tail = []
    for batch in batches:
        if sum(p.rows for p in batch) > SPLIT_ROWS:
            tmp = run_dir / MERGE_TMP
            try:
                buckets = _rank_buckets(batch, unified, tmp)
                for path in buckets or []:
                    with pa.OSFile(str(path), "rb") as src:
                        table = pa.ipc.open_stream(src).read_all().unify_dictionaries()
                    path.unlink()
                    yield table, _order(table)
                    del table
                    pa.default_memory_pool().release_unused()
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            if buckets is not None:
                continue
        tables = list(_read_batch(batch, unified))
        table = pa.concat_tables(tables, promote_options="permissive").unify_dictionaries()
        del tables
        if table.column("rank").null_count:
            tail.append(table.filter(pa.compute.is_null(table.column("rank"))))
            table = table.filter(pa.compute.is_valid(table.column("rank")))
        yield table, _order(table)
        del table
        pa.default_memory_pool().release_unused()
    if tail:
        table = pa.concat_tables(tail).unify_dictionaries()
        yield table, _order(table)


def _order(table: pa.Table) -> np.ndarray | None:
    order = pa.compute.sort_indices(table, sort_keys=_COLL_ORDER).to_numpy()
    return None if np.array_equal(order, np.arange(len(order))) else order


def _sorted_chunks(run_dir: Path, batches: list[list[_Part]], unified: pa.Schema
                   ) -> Iterable[pa.Table]:
    """The run's collectives in order, MERGE_ROWS at a time, taken from each batch through its
    sort index (no sorted copy of a batch is made)."""
    for table, order in _sorted_batches(run_dir, batches, unified):
        for lo in range(0, table.num_rows, MERGE_ROWS):
            yield table.slice(lo, MERGE_ROWS) if order is None else table.take(order[lo:lo + MERGE_ROWS])
        table = order = None  # let it go before the next batch is read


def _widen(table: pa.Table, unified: pa.Schema) -> pa.Table:
    """`table` with the columns of `unified` (the run's parts' columns), null where it has none."""
    if table.schema.equals(unified, check_metadata=True):
        return table
    for f in unified:
        if f.name not in table.column_names:
            table = table.append_column(f, pa.nulls(table.num_rows, f.type))
    return table.select(unified.names).cast(unified)


def _write_group(writer: pq.ParquetWriter, tables: list[pa.Table]) -> None:
    table = pa.concat_tables(tables).combine_chunks()
    writer.write_table(table, row_group_size=max(1, table.num_rows))


#: Tables whose rows several sources may repeat (two ibnetdiscover dumps of one fabric): the
#: first row of each key, in source order, is kept.
FIRST_WINS = {"topology_nodes": "node", "topology_links": "link"}


def _first_wins(table: pa.Table, key: str) -> pa.Table:
    seen: set[str] = set()
    keep = []
    for i, k in enumerate(table.column(key).to_pylist()):
        if k not in seen:
            seen.add(k)
            keep.append(i)
    return table if len(keep) == table.num_rows else table.take(keep)


def rate_telemetry(merged: dict[str, pa.Table | None], report: IngestReport,
                   copies: Mapping[str, Path] | None = None) -> RatesFile | None:
    """Counters from the sources become telemetry `link_samples` (after the merge: a port's
    samples may come from several files, and links from ibnetdiscover or a link map). Updates
    `merged`; returns results/telemetry.json's document (None without counters). When the
    commit copies the counters' part file (`copies`), the table is handed to the rating alone
    (an empty stand-in stays in `merged`), so its memory goes as soon as the rating is done with it."""
    if not report.tables.get("counters"):
        return None
    from tracekit.telemetry import rate_taken, rates_doc, with_rates

    def table(name: str) -> pa.Table:
        t = merged.get(name)
        return t if t is not None else schema.empty(name)

    holder = [table("counters")]
    if copies and "counters" in copies and merged.get("counters") is not None:
        merged["counters"] = schema.empty("counters")  # commit copies the part file in its place
    rates = rate_taken(holder, table("topology_nodes"), table("topology_links"))
    pa.default_memory_pool().release_unused()
    samples = with_rates(table("link_samples"), rates)
    merged["link_samples"] = samples if samples.num_rows else None
    report.tables["link_samples"] = samples.num_rows
    report.warnings.extend(rates.warnings)
    return rates_doc(rates)


def _has_part(run_dir: Path, source: SourceRecord, name: str) -> bool:
    return (run_dir / "sources" / (source.key or "") / f"{name}.parquet").is_file()


@dataclass
class _Fill:
    """What the collectives merge needs from NCCL logs: the communicators' rank maps and the
    algo/proto rows of logs set aside for a rank (donors)."""

    maps: dict[str, list[int | None]]
    donors: pa.Table | None


def _merge_nccl(run_dir: Path, sources: list[SourceRecord], primary: dict[int, list[str]],
                tables: dict[str, pa.Table], warnings: list[str]) -> _Fill | None:
    """What NCCL logs add across sources: global ranks of peers another log named (through the
    merged `groups.rank_map`), one row per channel edge, and bus ids / hosts for ranks another
    format describes; returns what the collectives merge needs to resolve peers and fill
    algo/proto (None without NCCL logs)."""
    from tracekit import nccl_fabric

    logs = [s for s in sources if format_declares(s.format, "nccl_facts")]
    if not any(format_declares(s.format, "maps_peers") for s in sources):
        return None
    maps = nccl_fabric.rank_maps(tables["groups"]) if "groups" in tables else {}
    if "groups" in tables and "world" in tables["groups"].column_names:
        worlds = [g for g, w in zip(tables["groups"].column("group").to_pylist(),
                                    tables["groups"].column("world").to_pylist(), strict=True) if w]
        if len(worlds) > 1:
            warnings.append(f"the NCCL logs disagree on the world communicator ({', '.join(map(str, worlds))}): "
                            "global ranks of the logs whose largest communicator is not the job's world are local "
                            "to it")
    if "channels" in tables:
        ch, unknown = nccl_fabric.resolve_peers(nccl_fabric.dedup_channels(tables["channels"]), maps,
                                           [("peer_rank", "peer_comm_rank"), ("proxy_rank", "proxy_comm_rank")])
        tables["channels"] = ch
        if unknown:
            warnings.append(f"channels: {unknown} peer rank(s) stay communicator-local only (peer_comm_rank): no "
                            "log of theirs maps them to a global rank")
    donors = []
    for s in logs:
        if any((s.key or "") not in primary.get(r, []) for r in s.ranks):
            part = read_part(run_dir, s.key or "", "collectives")
            if part is not None:
                donors.append(part.select(["rank", "op", "in_bytes", "nranks", "algo", "proto"])
                              .filter(pa.compute.is_valid(part.column("algo"))))
    donor = pa.concat_tables(donors, promote_options="permissive") if donors else None
    if "ranks" in tables:
        others = [t for s in logs if (t := read_part(run_dir, s.key or "", "ranks")) is not None]
        if others:
            tables["ranks"] = nccl_fabric.fill_rank_facts(tables["ranks"],
                                                     pa.concat_tables(others, promote_options="permissive"))
    return _Fill(maps, donor)


_GROUP_ANY = ("world", "pxn", "gdr", "nvls", "collnet")


_GROUP_MAX = ("n_nodes", "local_ranks", "n_channels", "p2p_channels")


def _distinct_rows(table: pa.Table) -> list[dict[str, Any]]:
    """The table's rows as dicts, repeats dropped (first occurrence kept, in order): every source
    of a run usually lists the same process groups."""
    import polars as pl

    if table.num_rows < 2:
        return table.to_pylist()
    plain = table.cast(pa.schema([f.with_type(f.type.value_type) if pa.types.is_dictionary(f.type) else f
                                  for f in table.schema]))
    return pl.from_arrow(plain).unique(maintain_order=True).to_dicts()


def _merge_groups(table: pa.Table, warnings: list[str]) -> pa.Table:
    """One row per group. Applying a row twice changes nothing, so repeats are dropped first."""
    from tracekit.nccl_fabric import merge_rank_maps

    merged: dict[str, dict[str, Any]] = {}
    for row in _distinct_rows(table):
        g = merged.get(row["group"])
        if g is None:
            merged[row["group"]] = {**row, "ranks": list(row["ranks"] or []),
                                    "dims": sorted(set(row["dims"] or []))}
            continue
        if not g["desc"] and row["desc"]:
            g["desc"] = row["desc"]
        if not g["backend"] and row["backend"]:
            g["backend"] = row["backend"]
        if row["size"] is not None and (g["size"] is None or row["size"] > g["size"]):
            g["size"] = row["size"]
        g["dims"] = sorted(set(g["dims"]) | set(row["dims"] or []))
        if row.get("rank_map"):
            g["rank_map"] = merge_rank_maps([g.get("rank_map"), row["rank_map"]])
        if row.get("ring_orders") and not g.get("ring_orders"):
            g["ring_orders"] = row["ring_orders"]
        for k in _GROUP_ANY:
            if row.get(k) is not None:
                g[k] = bool(g.get(k)) or row[k]
        for k in _GROUP_MAX:
            if row.get(k) is not None and (g.get(k) is None or row[k] > g[k]):
                g[k] = row[k]
        ranks = list(row["ranks"] or [])
        if row["ranks_complete"]:
            if g["ranks_complete"] and g["ranks"] != ranks:
                msg = f"group {row['group']!r}: ranks differ between sources; kept the first"
                if msg not in warnings:
                    warnings.append(msg)
            elif not g["ranks_complete"]:
                g["ranks"], g["ranks_complete"] = ranks, True
        elif not g["ranks_complete"]:
            g["ranks"] = sorted(set(g["ranks"]) | set(ranks))
    for g in merged.values():
        rm = g.get("rank_map")
        if rm:
            known = [r for r in rm if r is not None]
            g["ranks"] = sorted(set(g["ranks"]) | set(known))
            g["ranks_complete"] = bool(g["ranks_complete"]) or len(known) == len(rm)
    rows = [merged[k] for k in sorted(merged, key=_group_sort_key)]
    fields = [f.with_type(pa.string()) if pa.types.is_dictionary(f.type) else f for f in schema.GROUPS]
    fields += [table.schema.field(n) for n in table.column_names if n not in schema.GROUPS.names]
    return pa.Table.from_pylist(rows, schema=pa.schema(fields, metadata=schema.GROUPS.metadata))


def _group_sort_key(name: str) -> tuple[int, int, str]:
    return (0, int(name), "") if name.isdigit() else (1, 0, name)
