"""The run directory: a manifest plus Parquet tables, with `events` partitioned by rank.

Layout::

    RUN/manifest.json
    RUN/<table>.parquet                 merged small tables (ranks, groups, collectives, ...)
    RUN/events/rank=<R>/<source>.parquet events, one file per (rank, source)
    RUN/sources/<source>/<table>.parquet per-source parts of the small tables (the ingest cache)

A source is one input file; its key is derived from its content hash, so re-ingesting an
unchanged file reuses its parts (a cache hit).
"""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.compute
import pyarrow.parquet as pq

from tracekit import schema
from tracekit.errors import TracekitError

MANIFEST = "manifest.json"
SMALL_TABLES = ("ranks", "groups", "collectives", "channels", "counters", "link_samples",
                "topology_nodes", "topology_links", "microbench", "log_messages")


#: Events columns worth Parquet dictionary encoding (repeated values); the others (times, ids)
#: are nearly unique, where trying a dictionary first only costs time and space.
EVENTS_DICT_COLUMNS = ("rank", "lane", "kind", "name", "step", "coll_id", "cat", "sync_lane")


class RunError(TracekitError):
    """A run directory is missing, unreadable or inconsistent."""


@dataclass
class SourceStats:
    """What one parser did with one source file: every event read is stored or skipped with a reason."""

    read: int = 0
    stored: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    warnings: list[str] = field(default_factory=list)

    def skip(self, reason: str, n: int = 1) -> None:
        self.read += n
        self.skipped[reason] += n

    def store(self, n: int = 1) -> None:
        self.read += n
        self.stored += n

    @property
    def balanced(self) -> bool:
        return self.read == self.stored + sum(self.skipped.values())

    def to_dict(self) -> dict[str, Any]:
        return {"read": self.read, "stored": self.stored, "skipped": dict(sorted(self.skipped.items())),
                "warnings": list(self.warnings)}


@dataclass
class ParseResult:
    """What a parser returns for one source: its accounting and a summary for the manifest.

    `rank` is the one rank a per-rank trace describes; a source covering several ranks (an NCCL
    log of a whole node) lists them in `ranks`; a source with no rank (telemetry, nccl-tests)
    leaves both empty.
    """

    stats: SourceStats
    rank: int | None = None
    events: int = 0
    collectives: int = 0
    groups: int = 0
    steps: list[int] = field(default_factory=list)
    ts_min_ns: int | None = None
    ts_max_ns: int | None = None
    ranks: list[int] | None = None

    @property
    def all_ranks(self) -> list[int]:
        """Every rank this source describes."""
        if self.ranks is not None:
            return sorted(set(self.ranks))
        return [] if self.rank is None else [self.rank]


#: Rows of one small table a sink buffers before it streams them to the part's Parquet file (an
#: NCCL log can hold millions of collective calls).
SPILL_ROWS = 1 << 18


class SourceSink:
    """Where a parser writes one source's rows: events stream to per-rank Parquet files, small
    tables are buffered and written on close, or streamed once they grow past SPILL_ROWS (every
    batch of a table must then have the same columns)."""

    def __init__(self, run_dir: Path, key: str, *, row_group_size: int = 65_536) -> None:
        self.run_dir = Path(run_dir)
        self.key = key
        self.part_dir = self.run_dir / "sources" / key
        self.part_dir.mkdir(parents=True, exist_ok=True)
        self.row_group_size = row_group_size
        self._event_writers: dict[int, pq.ParquetWriter] = {}
        self._event_counts: Counter[int] = Counter()
        self._small: dict[str, list[pa.Table]] = {}
        self._small_rows: Counter[str] = Counter()
        self._small_writers: dict[str, pq.ParquetWriter] = {}
        self._small_written: Counter[str] = Counter()

    def event_path(self, rank: int) -> Path:
        return self.run_dir / "events" / f"rank={rank}" / f"{self.key}.parquet"

    def add_events(self, data: pa.Table | Mapping[str, Iterable]) -> None:
        """Append a batch of events (any ranks); it is conformed to the events schema."""
        table = schema.conform("events", data)
        if table.num_rows == 0:
            return
        table = table.select(schema.EVENTS.names).cast(schema.EVENTS)
        ranks = table.column("rank")
        distinct = pa.compute.unique(ranks).to_pylist()
        for rank in sorted(distinct):
            part = table if len(distinct) == 1 else table.filter(pa.compute.equal(ranks, rank))
            writer = self._event_writers.get(rank)
            if writer is None:
                path = self.event_path(rank)
                path.parent.mkdir(parents=True, exist_ok=True)
                writer = pq.ParquetWriter(path, schema.EVENTS, compression="zstd",
                                          use_dictionary=EVENTS_DICT_COLUMNS)
                self._event_writers[rank] = writer
            writer.write_table(part, row_group_size=self.row_group_size)
            self._event_counts[rank] += part.num_rows

    def add(self, name: str, data: pa.Table | Mapping[str, Iterable]) -> None:
        """Append rows to one of the small tables."""
        if name == "events":
            self.add_events(data)
            return
        table = schema.conform(name, data)
        if table.num_rows:
            self._small.setdefault(name, []).append(table)
            self._small_rows[name] += table.num_rows
            if self._small_rows[name] >= SPILL_ROWS:
                self._spill(name)

    def _spill(self, name: str) -> None:
        tables = self._small.pop(name, [])
        self._small_rows[name] = 0
        if not tables:
            return
        table = pa.concat_tables(tables, promote_options="permissive")
        writer = self._small_writers.get(name)
        if writer is None:
            writer = pq.ParquetWriter(self.part_dir / f"{name}.parquet", table.schema, compression="zstd")
            self._small_writers[name] = writer
        elif table.schema.names != writer.schema.names:
            raise RuntimeError(f"{name}: a batch with columns {table.schema.names} after streaming "
                               f"{writer.schema.names}")
        else:
            table = table.cast(writer.schema)
        writer.write_table(table)
        self._small_written[name] += table.num_rows

    def close(self) -> dict[str, Any]:
        """Flush everything; return the part listing for the manifest."""
        for writer in self._event_writers.values():
            writer.close()
        parts: dict[str, Any] = {"events": {str(r): str(self.event_path(r).relative_to(self.run_dir))
                                            for r in sorted(self._event_writers)}}
        counts = {"events": sum(self._event_counts.values())}
        for name in list(self._small_writers):
            self._spill(name)
            self._small_writers.pop(name).close()
            parts[name] = str((self.part_dir / f"{name}.parquet").relative_to(self.run_dir))
            counts[name] = self._small_written[name]
        for name, tables in self._small.items():
            table = pa.concat_tables(tables, promote_options="permissive")
            path = self.part_dir / f"{name}.parquet"
            pq.write_table(table, path, compression="zstd")
            parts[name] = str(path.relative_to(self.run_dir))
            counts[name] = table.num_rows
        parts["rows"] = counts
        return parts


class Run:
    """A run directory: read tables eagerly (`table`) or lazily (`scan`), and write derived ones."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        manifest_path = self.path / MANIFEST
        if not manifest_path.is_file():
            raise RunError(f"{self.path}: not a tracekit run directory (no {MANIFEST}); run `tracekit ingest` first")
        try:
            self.manifest: dict[str, Any] = json.loads(manifest_path.read_text())
        except (OSError, ValueError) as exc:
            raise RunError(f"{manifest_path}: unreadable manifest: {exc}") from exc

    @classmethod
    def is_run(cls, path: str | os.PathLike[str]) -> bool:
        return (Path(path) / MANIFEST).is_file()

    def has(self, name: str) -> bool:
        if name == "events":
            return any(self.event_files())
        return (self.path / f"{name}.parquet").is_file()

    def table(self, name: str) -> pa.Table:
        """The named table (an empty one with the right schema when the run has none)."""
        if name == "events":
            return self.events()
        path = self.path / f"{name}.parquet"
        if not path.is_file():
            return schema.empty(name)
        return schema.conform(name, pq.read_table(path))

    def scan(self, name: str) -> pl.LazyFrame:
        """A polars lazy frame over the named table."""
        if name == "events":
            files = [str(p) for p in self.event_files()]
            if not files:
                return pl.from_arrow(schema.empty("events")).lazy()
            return pl.scan_parquet(files)
        return pl.from_arrow(self.table(name)).lazy()

    def event_files(self, ranks: Iterable[int] | None = None) -> list[Path]:
        root = self.path / "events"
        if not root.is_dir():
            return []
        wanted = None if ranks is None else {int(r) for r in ranks}
        primary = self.manifest.get("primary_sources")
        files = []
        for part in sorted(root.glob("rank=*"), key=lambda p: int(p.name.split("=", 1)[1])):
            rank = int(part.name.split("=", 1)[1])
            if wanted is not None and rank not in wanted:
                continue
            keys = None if primary is None else set(primary.get(str(rank), []))
            files.extend(f for f in sorted(part.glob("*.parquet")) if keys is None or f.stem in keys)
        return files

    def events(self, ranks: Iterable[int] | None = None) -> pa.Table:
        files = self.event_files(ranks)
        if not files:
            return schema.empty("events")
        tables = [pq.ParquetFile(f).read() for f in files]  # read_table costs twice as much per file
        return schema.conform("events", pa.concat_tables(tables, promote_options="permissive"))

    def write_table(self, name: str, table: pa.Table) -> Path:
        """Write (replace) one of the merged small tables, conformed to its schema."""
        if name == "events":
            raise RunError("events are written per source by ingest, not replaced")
        table = schema.conform(name, table)
        path = self.path / f"{name}.parquet"
        tmp = path.with_suffix(".parquet.tmp")
        pq.write_table(table, tmp, compression="zstd")
        tmp.replace(path)
        return path

    def write_json(self, name: str, payload: Any) -> Path:
        """Write a derived JSON document (analysis or replay results) under RUN/results/."""
        out = self.path / "results" / f"{name}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(payload, indent=1, sort_keys=True, default=_json_default))
        return out

    def read_json(self, name: str) -> Any | None:
        path = self.path / "results" / f"{name}.json"
        if not path.is_file():
            return None
        return json.loads(path.read_text())

    def update_manifest(self, **fields: Any) -> None:
        self.manifest.update(fields)
        write_manifest(self.path, self.manifest)


def write_manifest(run_dir: Path, manifest: Mapping[str, Any]) -> None:
    path = Path(run_dir) / MANIFEST
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True, default=_json_default))
    tmp.replace(path)


def remove_stale_sources(run_dir: Path, keep: set[str]) -> None:
    """Delete the parts of sources that are no longer part of the run."""
    run_dir = Path(run_dir)
    for part in (run_dir / "sources").glob("*"):
        if part.name not in keep:
            shutil.rmtree(part, ignore_errors=True)
    for path in (run_dir / "events").glob("rank=*/*.parquet"):
        if path.stem not in keep:
            path.unlink()
    for rank_dir in (run_dir / "events").glob("rank=*"):
        if not any(rank_dir.iterdir()):
            rank_dir.rmdir()


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
