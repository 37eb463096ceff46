"""The run directory: a manifest plus Parquet tables, with `events` partitioned by rank.

Layout::

    RUN/manifest.json
    RUN/<table>.parquet                 merged small tables (ranks, groups, collectives, ...)
    RUN/events/rank=<R>/<source>.parquet events, one file per (rank, source)
    RUN/sources/<source>/<table>.parquet per-source parts of the small tables (the ingest cache)

A source is one input file; its key is derived from its content hash, so re-ingesting an
unchanged file reuses its parts (a cache hit).

Safety (docs/data-model.md, "Run directory safety"):

* one writer at a time: writers hold `RUN/.lock` (`RunLock`); a second one fails at once with
  a message naming the holder;
* crash-safe: every file is written under a temporary name and renamed; the merged tables and
  the manifest of a new ingest are staged in `RUN/.staging/` and a `COMMIT` marker makes the
  new generation durable before anything in place changes (`commit`, `recover`), so a kill or
  a full disk at any point leaves the old run or the new one, never a mix;
* contained: nothing under a run is read, written or deleted through a symlink that leads out
  of it (`contained`);
* OS errors (read-only, permission, no space) become one-line `RunError`s; a run that cannot be
  written is still readable, and analyses of it just do not save their results (`Run.unsaved`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import polars as pl
import pyarrow as pa
import pyarrow.compute
import pyarrow.parquet as pq

from tracekit import schema
from tracekit.atomic import atomic_write_all, atomic_write_with
from tracekit.errors import TracekitError
from tracekit.manifest import Manifest, check_manifest, json_default, manifest_text
from tracekit.results import Result

MANIFEST = "manifest.json"
#: Marks a directory as a tracekit run from the moment ingest creates it (before any manifest).
MARKER = ".tracekit-run"
LOCK = ".lock"
STAGING = ".staging"
T = TypeVar("T")
COMMIT = "COMMIT"
#: in RUN/results/: the manifest generation every file there was computed from
RESULTS_STAMP = "GENERATION"
SMALL_TABLES = ("ranks", "groups", "collectives", "channels", "counters", "link_samples",
                "topology_nodes", "topology_links", "microbench", "log_messages",
                "unranked_collectives")


#: Events columns worth Parquet dictionary encoding (repeated values); the others (times, ids)
#: are nearly unique, where trying a dictionary first only costs time and space.
EVENTS_DICT_COLUMNS = ("rank", "lane", "kind", "name", "step", "coll_id", "cat", "sync_lane")


class RunError(TracekitError):
    """A run directory is missing, unreadable or inconsistent."""


class SourceCounts(Result, frozen=True, kw_only=True):
    """A parser's accounting of one source as its record and the manifest keep it: the reasons and
    fields in name order."""

    read: int = 0
    stored: int = 0
    skipped: dict[str, int] = msgspec.field(default_factory=dict)
    warnings: list[str] = msgspec.field(default_factory=list)
    dropped: dict[str, int] = msgspec.field(default_factory=dict)


@dataclass
class SourceStats:
    """What one parser did with one source file: every event read is stored or skipped with a reason
    (kept while it parses; `counts` is what it reports)."""

    read: int = 0
    stored: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    warnings: list[str] = field(default_factory=list)
    #: field -> how many values of a stored record were dropped (null) as out of range or malformed
    dropped: Counter[str] = field(default_factory=Counter)

    def skip(self, reason: str, n: int = 1) -> None:
        self.read += n
        self.skipped[reason] += n

    def store(self, n: int = 1) -> None:
        self.read += n
        self.stored += n

    def drop(self, field: str, n: int = 1) -> None:
        """Count values of a stored record that were out of range and stored as null."""
        self.dropped[field] += n

    @property
    def balanced(self) -> bool:
        return self.read == self.stored + sum(self.skipped.values())

    def counts(self) -> SourceCounts:
        return SourceCounts(read=self.read, stored=self.stored, skipped=dict(sorted(self.skipped.items())),
                            warnings=list(self.warnings), dropped=dict(sorted(self.dropped.items())))


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
SPILL_ROWS = 1 << 16


#: Small tables this process has just written, by part path, with the file's (size, mtime): the
#: merge that follows in the same process takes them (`take_written`) instead of reading them back.
_WRITTEN: dict[str, tuple[tuple[int, int], pa.Table]] = {}


def take_written(path: Path) -> pa.Table | None:
    """The table this process wrote to `path` (once), if the file is still the one it wrote."""
    table = peek_written(path)
    _WRITTEN.pop(str(path), None)
    return table


def peek_written(path: Path) -> pa.Table | None:
    """The table this process wrote to `path`, left for `take_written`, if the file is still the one it wrote."""
    entry = _WRITTEN.get(str(path))
    if entry is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return entry[1] if (st.st_size, st.st_mtime_ns) == entry[0] else None


def forget_written() -> None:
    _WRITTEN.clear()


class SourceSink:
    """Where a parser writes one source's rows: events stream to per-rank Parquet files, small
    tables are buffered and written on close, or streamed once they grow past SPILL_ROWS (every
    batch of a table must then have the same columns). The tables named in `keep` are also
    kept in memory for `take_written`."""

    def __init__(self, run_dir: Path, key: str, *, row_group_size: int = 65_536, keep: tuple[str, ...] = ()) -> None:
        self.keep = keep
        self._kept: dict[str, list[pa.Table]] = {}
        self.run_dir = Path(run_dir)
        self.key = key
        self.part_dir = make_dirs(self.run_dir, self.run_dir / "sources" / key)
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
                make_dirs(self.run_dir, path.parent)
                contained(self.run_dir, path)
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
            writer = pq.ParquetWriter(self.part_dir / f"{name}.parquet", table.schema, **parquet_options(table.schema))
            self._small_writers[name] = writer
        elif table.schema.names != writer.schema.names:
            raise RuntimeError(f"{name}: a batch with columns {table.schema.names} after streaming "
                               f"{writer.schema.names}")
        else:
            table = table.cast(writer.schema)
        writer.write_table(table, row_group_size=max(1, table.num_rows))
        self._small_written[name] += table.num_rows
        if name in self.keep:
            self._kept.setdefault(name, []).append(table)

    @staticmethod
    def _remember(path: Path, table: pa.Table) -> None:
        st = os.stat(path)
        _WRITTEN[str(path)] = ((st.st_size, st.st_mtime_ns), table)

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
            kept = self._kept.pop(name, [])
            if kept:
                self._remember(self.part_dir / f"{name}.parquet", pa.concat_tables(kept))
        for name, tables in self._small.items():
            table = pa.concat_tables(tables, promote_options="permissive")
            path = self.part_dir / f"{name}.parquet"
            write_parquet(table, path, self.run_dir)
            parts[name] = str(path.relative_to(self.run_dir))
            counts[name] = table.num_rows
            if name in self.keep:
                self._remember(path, table)
        parts["rows"] = counts
        return parts


# -- safety helpers ---------------------------------------------------------------------------


def os_error(exc: OSError, what: str = "") -> RunError:
    """A one-line RunError for an OS error, naming the file and saying what to do."""
    where = exc.filename or what or "?"
    reason = exc.strerror or str(exc)
    hint = {errno.ENOSPC: "free some space and run the command again",
            errno.EROFS: "the file system is read-only; write the run elsewhere with -o",
            errno.EACCES: "permission denied; check the owner and mode",
            errno.EPERM: "operation not permitted; check the owner and mode",
            errno.EDQUOT: "disk quota exceeded"}.get(exc.errno or 0)
    return RunError(f"{where}: {reason}" + (f" ({hint})" if hint else ""))


def contained(run_dir: str | os.PathLike[str], path: str | os.PathLike[str], *, root: str | None = None) -> Path:
    """`path`, after checking that it does not lead out of `run_dir` through a symlink (`root`:
    `run_dir` already resolved, when checking many paths)."""
    root = root or os.path.realpath(run_dir)
    real = os.path.realpath(path)
    if real != root and not real.startswith(root.rstrip(os.sep) + os.sep):
        raise RunError(f"{path}: leads out of the run directory {run_dir} (through a symbolic link); refused")
    return Path(path)


def make_dirs(run_dir: str | os.PathLike[str], path: str | os.PathLike[str]) -> Path:
    """Create `path` and its parents under `run_dir` one level at a time, refusing any level that
    is a symbolic link or not a directory, so a received run never makes tracekit create
    directories outside it (`mkdir(parents=True)` follows links)."""
    run_dir, path = Path(run_dir), Path(path)
    try:
        rel = path.relative_to(run_dir)
    except ValueError:
        raise RunError(f"{path}: not under the run directory {run_dir}; refused") from None
    try:
        run_dir.mkdir(parents=True, exist_ok=True)  # the run itself is where the user asked for it
    except OSError as exc:
        raise os_error(exc, str(run_dir)) from exc
    here = run_dir
    for part in rel.parts:
        here = here / part
        try:
            os.mkdir(here)
        except FileExistsError:
            pass
        except OSError as exc:
            raise os_error(exc, str(here)) from exc
        if here.is_symlink() or not here.is_dir():
            contained(run_dir, here)  # the usual message when the link leads out of the run
            kind = "a symbolic link" if here.is_symlink() else "not a directory"
            raise RunError(f"{here}: is {kind} in the run directory {run_dir}; refused (remove it, or "
                           "ingest into a new directory)")
    return contained(run_dir, path)


def refuse_links(run_dir: str | os.PathLike[str], names: Iterable[str]) -> None:
    """Refuse a run whose top-level entries `names` are symbolic links (a run received from someone
    else can point them anywhere), naming the first one."""
    for name in names:
        entry = Path(run_dir) / name
        if entry.is_symlink():
            raise RunError(f"{entry}: is a symbolic link in the run directory {run_dir}; refused (a run "
                           "directory must hold its own files: remove the link, or ingest into a new directory)")


def atomic_write(path: Path, write: Any, run_dir: Path | None = None) -> Path:
    """Write `path` through `write(tmp_path)` and an atomic rename; nothing is left half-written.
    OS errors become one-line RunErrors."""
    path = Path(path)
    if run_dir is not None:
        contained(run_dir, path.parent)
    try:
        atomic_write_with(path, lambda tmp: write(Path(tmp)))
    except OSError as exc:
        raise os_error(exc, str(path)) from exc
    return path


def parquet_options(table_schema: pa.Schema) -> dict[str, Any]:
    """How the small tables are written: zstd, but lz4 for float columns; dictionary pages only
    for text columns, and min/max statistics only for the others (numbers and times).
    Dictionary-encoding unique floats and computing string statistics were a third of the write
    time of a large table; zstd on measured floats (rates, counter values) saved 6-19% of their
    bytes for a quarter of the write time of a day of switch telemetry. Small tables are written
    as one row group per batch, so they read back as one chunk."""
    text = [f.name for f in table_schema
            if pa.types.is_dictionary(f.type) or pa.types.is_string(f.type) or pa.types.is_large_string(f.type)]
    stats = [f.name for f in table_schema if f.name not in text and not pa.types.is_nested(f.type)]
    compression = {path: "lz4" if pa.types.is_floating(leaf) else "zstd"
                   for f in table_schema for path, leaf in _parquet_leaves(f.name, f.type)}
    return {"compression": compression, "use_dictionary": text, "write_statistics": stats}


def _parquet_leaves(path: str, kind: pa.DataType) -> Iterator[tuple[str, pa.DataType]]:
    """The Parquet column paths under one Arrow field (per-column options are keyed by them:
    a list of strings `flags` is the column `flags.list.element`), with their leaf types."""
    if pa.types.is_map(kind):
        yield from _parquet_leaves(f"{path}.key_value.key", kind.key_type)
        yield from _parquet_leaves(f"{path}.key_value.value", kind.item_type)
    elif pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        yield from _parquet_leaves(f"{path}.list.element", kind.value_type)
    elif pa.types.is_struct(kind):
        for child in kind:
            yield from _parquet_leaves(f"{path}.{child.name}", child.type)
    else:
        yield path, kind


def _to_parquet(table: pa.Table, tmp: str | Path) -> None:
    """How a small table is written, to the temporary file of an atomic writer."""
    pq.write_table(table, tmp, row_group_size=max(1, table.num_rows), **parquet_options(table.schema))  # atomic tmp


def write_parquet(table: pa.Table, path: Path, run_dir: Path | None = None) -> Path:
    return atomic_write(path, lambda t: _to_parquet(table, t), run_dir)


def write_parquet_all(tables: Mapping[Path, pa.Table], run_dir: Path) -> list[Path]:
    """Several tables written together (`atomic_write_all`): all are replaced, or none."""
    for path in tables:
        contained(run_dir, path.parent)
    writes = {path: (lambda t, table=table: _to_parquet(table, t)) for path, table in tables.items()}
    try:
        return atomic_write_all(writes)
    except OSError as exc:
        raise os_error(exc, ", ".join(str(p) for p in tables)) from exc


class RunLock:
    """An exclusive lock on a run directory for one writer (`flock` on RUN/.lock, released
    by the kernel when the process dies, so a killed writer never leaves it held)."""

    def __init__(self, run_dir: str | os.PathLike[str], *, wait_s: float = 0.0) -> None:
        self.run_dir = Path(run_dir)
        self.wait_s = wait_s  # how long to wait for another writer before giving up
        self._fd: int | None = None

    def _flock(self, fd: int) -> None:
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN) or time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)

    def __enter__(self) -> RunLock:
        path = contained(self.run_dir, self.run_dir / LOCK)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as exc:
            raise os_error(exc, str(path)) from exc
        try:
            self._flock(fd)
        except OSError as exc:
            holder = ""
            with contextlib.suppress(OSError, ValueError):
                holder = f" (pid {int(os.pread(fd, 32, 0).decode().strip())})"
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise RunError(f"{self.run_dir}: another tracekit process is writing this run{holder}; "
                               "wait for it to finish, or write to another directory") from exc
            raise os_error(exc, str(path)) from exc
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


@dataclass(frozen=True)
class CommitRecord:
    """RUN/.staging/COMMIT: the tables a committed generation moves into place and removes."""

    tables: tuple[str, ...]
    remove: tuple[str, ...]


_TABLE_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")


def _commit_record(run_dir: Path) -> CommitRecord | None:
    """The commit marker of a staged generation, None when there is none (or it cannot be read:
    the staging is then unfinished); a marker that is not the record `commit` writes (a received
    or hand-edited run) is refused with a RunError naming it, never trusted."""
    path = run_dir / STAGING / COMMIT
    if path.is_symlink() or not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    names: dict[str, tuple[str, ...]] = {}
    for key in ("tables", "remove"):
        value = doc.get(key, []) if isinstance(doc, dict) else None
        if not isinstance(value, list) or not all(isinstance(n, str) and _TABLE_NAME.fullmatch(n) for n in value):
            raise RunError(f"{path}: not a commit record ({key!r} must be a list of table names); refused "
                           f"(remove {run_dir / STAGING} to keep the run's committed generation)")
        names[key] = tuple(value)
    return CommitRecord(names["tables"], names["remove"])


def commit(run_dir: Path, tables: Mapping[str, pa.Table | Path | None], manifest: Manifest, *,
           copies: Mapping[str, Path] | None = None) -> None:
    """Replace the merged tables and the manifest of a run as one step (call with the lock held).
    A table named in `copies` is written as a copy of that Parquet file (which holds the same rows);
    a table given as a path (a Parquet file inside the run, written by the merge) is moved in.

    Everything is first written to RUN/.staging/; a COMMIT marker (written by rename) then makes
    the new generation durable, and `recover` moves it into place, the manifest last. A failure
    before the marker leaves the old run untouched (the staging is discarded)."""
    run_dir = Path(run_dir)
    staging = contained(run_dir, run_dir / STAGING)
    shutil.rmtree(staging, ignore_errors=True)
    try:
        staging.mkdir()
        present = []
        for name, table in tables.items():
            if table is not None:
                if isinstance(table, Path):
                    os.replace(contained(run_dir, table), staging / f"{name}.parquet")
                elif copies and name in copies:
                    shutil.copyfile(contained(run_dir, copies[name]), staging / f"{name}.parquet")
                else:
                    write_parquet(table, staging / f"{name}.parquet")
                present.append(name)
        text = manifest_text(manifest)
        atomic_write(staging / MANIFEST, lambda t: Path(t).write_text(text))
        record = {"tables": present, "remove": sorted(n for n, t in tables.items() if t is None)}
        atomic_write(staging / COMMIT, lambda t: Path(t).write_text(json.dumps(record)))
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise os_error(exc) from exc
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    recover(run_dir)


def recover(run_dir: Path) -> str | None:
    """Finish or discard an interrupted commit (call with the lock held): a committed staging is
    moved into place (the manifest last); an uncommitted one is deleted. Returns what was done."""
    run_dir = Path(run_dir)
    staging = run_dir / STAGING
    if not staging.exists() and not staging.is_symlink():
        return None
    contained(run_dir, staging)
    record = _commit_record(run_dir)
    if record is None:
        shutil.rmtree(staging, ignore_errors=True)
        return "discarded an unfinished ingest"
    try:
        for name in record.tables:
            src = staging / f"{name}.parquet"
            if src.is_file():
                os.replace(src, contained(run_dir, run_dir / f"{name}.parquet"))
        for name in record.remove:
            target = contained(run_dir, run_dir / f"{name}.parquet")
            with contextlib.suppress(FileNotFoundError):
                target.unlink()
        if (staging / MANIFEST).is_file():
            os.replace(staging / MANIFEST, run_dir / MANIFEST)
        (staging / COMMIT).unlink()
        shutil.rmtree(staging, ignore_errors=True)
    except OSError as exc:
        raise os_error(exc) from exc
    return "completed an interrupted ingest"


# -- results belong to a generation -----------------------------------------------------------


def manifest_generation(manifest: Mapping[str, Any]) -> str:
    """The generation a manifest describes: the one ingest wrote in it, else (a run made before
    generations were recorded) a digest of the manifest itself."""
    given = manifest.get("generation")
    if isinstance(given, str) and given:
        return given
    text = json.dumps(manifest, sort_keys=True, default=json_default)
    return "legacy-" + hashlib.sha256(text.encode()).hexdigest()[:16]


def results_generation(run_dir: str | os.PathLike[str]) -> str | None:
    """The generation RUN/results/ was written for (None: no stamp, or one that cannot be read)."""
    stamp = Path(run_dir) / "results" / RESULTS_STAMP
    if stamp.is_symlink() or not stamp.is_file():
        return None
    try:
        return stamp.read_text().strip() or None
    except OSError:
        return None


def claim_results(run_dir: str | os.PathLike[str], generation: str) -> Path:
    """RUN/results/, ready to take results of `generation` (call with the lock held): results of
    any other generation are removed first, so results never outlive the data they came from."""
    out, stamp = _clear_stale_results(Path(run_dir), generation)
    if stamp is not None:
        atomic_write(stamp, lambda t: _write_stamp(t, generation), Path(run_dir))
    return out


def _clear_stale_results(run_dir: Path, generation: str) -> tuple[Path, Path | None]:
    """RUN/results/ with the results of any other generation removed, and the stamp to write
    for `generation` (None when it is already there)."""
    out = make_dirs(run_dir, run_dir / "results")
    stamp = results_generation(run_dir)
    if stamp == generation:
        return out, None
    adopt = stamp is None and generation.startswith("legacy-")  # a run made before generations: keep
    try:
        for entry in [] if adopt else out.iterdir():
            if entry.name != RESULTS_STAMP and (entry.is_symlink() or entry.is_file()):
                entry.unlink()
    except OSError as exc:
        raise os_error(exc, str(out)) from exc
    return out, out / RESULTS_STAMP


def _write_stamp(tmp: str | Path, generation: str) -> None:
    Path(tmp).write_text(generation + "\n")  # atomic tmp


# -- the run --------------------------------------------------------------------------------


class Run:
    """A run directory: read tables eagerly (`table`) or lazily (`scan`), and write derived ones.

    Reading needs no lock and works on read-only runs: a committed generation still in
    RUN/.staging/ (a writer was killed while moving it into place) is read from there. Derived
    results that cannot be written (read-only, no space, another writer) are listed in
    `unsaved` instead of failing the analysis."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.unsaved: list[str] = []
        self.lock_wait_s = 0.0  # how long a save waits for another writer (the shared cache of raw traces waits)
        self._staged = _commit_record(self.path) is not None
        manifest_path = self._file(MANIFEST)
        if not manifest_path.is_file():
            if (self.path / MARKER).exists():
                raise RunError(f"{self.path}: an ingest into this directory did not finish (interrupted or "
                               "failed); run `tracekit ingest ... -o` on it again")
            raise RunError(f"{self.path}: not a tracekit run directory (no {MANIFEST}); run `tracekit ingest` first")
        try:
            contained(self.path, manifest_path)
            doc = json.loads(self._moved_or(manifest_path, Path.read_text))
        except OSError as exc:
            raise os_error(exc, str(manifest_path)) from exc
        except ValueError as exc:
            raise RunError(f"{manifest_path}: unreadable manifest: {exc}") from exc
        if not isinstance(doc, dict):
            raise RunError(f"{manifest_path}: unreadable manifest (not a JSON object)")
        try:
            self.manifest: Manifest = check_manifest(doc, manifest_path)
            self.manifest_doc: dict[str, Any] = doc  # as stored (an absent field is not its default)
        except ValueError as exc:
            raise RunError(str(exc)) from None
        self.generation = manifest_generation(doc)
        self.stale: list[str] = []  # results left aside because an ingest has replaced their data
        #: derived files held by `results_together` (path in the run -> table, JSON text, or None
        #: to remove), committed together when its block ends
        self._pending: dict[str, pa.Table | str | None] | None = None
        self._check_parts()

    def _file(self, name: str) -> Path:
        """Where a top-level file of the current generation is (in .staging when committed there)."""
        if self._staged:
            staged = self.path / STAGING / name
            if staged.is_file():
                return staged
        return self.path / name

    def _moved_or(self, path: Path, read: Callable[[Path], T]) -> T:
        """`read(path)`; when `path` is in RUN/.staging/ and a writer finishing the commit moved it
        into place between finding and reading it (`recover`), read it where it went."""
        try:
            return read(path)
        except (OSError, TracekitError) as exc:
            gone = isinstance(exc, FileNotFoundError) or isinstance(exc.__cause__, FileNotFoundError)
            if not gone or path.parent != self.path / STAGING:
                raise
            self._staged = False
            return read(self.path / path.name)

    def _check_parts(self) -> None:
        """Every events part the manifest counts must exist (a run whose files were deleted
        under it must not analyse as if complete)."""
        primary = self.manifest.primary
        primary_keys = None if primary is None else {k for keys in primary.values() for k in keys}
        for s in self.manifest.sources:
            if s.error or not s.key:
                continue
            key = s.key
            if primary_keys is not None and key not in primary_keys:
                continue
            for r in s.ranks if len(s.ranks) == 1 and s.events else []:
                if not (self.path / "events" / f"rank={r}" / f"{key}.parquet").exists():
                    raise RunError(f"{self.path}: inconsistent run: the events of {s.path} (rank {r}) are "
                                   "missing; run `tracekit ingest` again")

    @property
    def ingested(self) -> int:
        """How many sources were ingested without error."""
        return sum(1 for s in self.manifest.sources if not s.error)

    def require_data(self) -> None:
        """Raise a clear RunError when the run holds no ingested source (nothing to analyse)."""
        if not self.ingested:
            raise RunError(f"{self.path}: no source was ingested into this run; nothing to analyse "
                           "(run `tracekit ingest` with traces first)")

    @classmethod
    def is_run(cls, path: str | os.PathLike[str]) -> bool:
        if (Path(path) / MANIFEST).is_file():
            return True
        try:
            staged = _commit_record(Path(path)) is not None
        except RunError:
            staged = True  # opening it says what is wrong
        return staged and (Path(path) / STAGING / MANIFEST).is_file()

    def has(self, name: str) -> bool:
        if name == "events":
            return any(self.event_files())
        return self._file(f"{name}.parquet").is_file()

    def table(self, name: str) -> pa.Table:
        """The named table (an empty one with the right schema when the run has none); inside
        `results_together`, as the block has written it."""
        if name == "events":
            return self.events()
        held = (self._pending or {}).get(f"{name}.parquet")
        if isinstance(held, pa.Table):
            return held
        path = self._file(f"{name}.parquet")
        if not path.is_file():
            return schema.empty(name)
        return schema.conform(name, self._moved_or(path, lambda p: _read(self.path, p)))

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
        primary = self.manifest.primary
        if primary is None:
            listed = {s.key for s in self.manifest.sources if not s.error and s.key}
        files = []
        real = os.path.realpath(self.path)
        for part in sorted(_rank_dirs(root), key=lambda p: int(p.name.split("=", 1)[1])):
            rank = int(part.name.split("=", 1)[1])
            if wanted is not None and rank not in wanted:
                continue
            keys = set(primary.get(str(rank), [])) if primary is not None else listed or None
            files.extend(contained(self.path, f, root=real) for f in sorted(part.glob("*.parquet"))
                         if keys is None or f.stem in keys)
        return files

    def events(self, ranks: Iterable[int] | None = None) -> pa.Table:
        return read_events(self.path, self.event_files(ranks))

    @staticmethod
    def rank_of(event_file: Path) -> int:
        """The rank whose partition an event file (from `event_files`) is in."""
        return int(event_file.parent.name.split("=", 1)[1])

    def source_table(self, key: str, name: str) -> pa.Table | None:
        """One source's own table as its parser wrote it (`part_path`), conformed; None when that
        source has none. The merged tables keep one source per rank; this is every source's."""
        path = part_path(self.path, key, name)
        if not path.is_file():
            return None
        return schema.conform(name, pq.read_table(path))

    def save(self, what: str, write: Any) -> Any:
        """Run `write()` (which writes a derived file) under the lock; on a read-only run, a full
        disk or a busy lock, note it in `unsaved` and go on (the caller's results are still
        printed)."""
        try:
            with RunLock(self.path, wait_s=self.lock_wait_s):
                return write()
        except RunError as exc:
            self.unsaved.append(f"{what} not saved: {exc}")
            return None

    @contextlib.contextmanager
    def results_together(self, what: str) -> Iterator[None]:
        """Hold every derived write of the block (merged tables, results/ files) and commit them
        when it ends, in one step under one lock: all are replaced or none is, so a full disk
        part-way never leaves some new results beside old ones (issue 22). Nothing is written
        when the block raises; a failed commit is noted in `unsaved`, like any save."""
        if self._pending is not None:  # nested: the outer block commits
            yield
            return
        self._pending = {}
        try:
            yield
            pending = self._pending
        finally:
            self._pending = None
        if pending:
            self.save(what, lambda: self._commit(pending))

    def _commit(self, pending: Mapping[str, pa.Table | str | None]) -> list[Path]:
        recover(self.path)
        self._staged = False
        self.check_generation()
        writes: dict[Path, Any] = {}
        removals: list[Path] = []
        if any(rel.startswith("results/") for rel in pending):
            _, stamp = _clear_stale_results(self.path, self.generation)
            if stamp is not None:
                writes[stamp] = lambda t: _write_stamp(t, self.generation)
        for rel, value in pending.items():
            path = self.path / rel
            contained(self.path, path.parent)
            if value is None:
                removals.append(path)
            elif isinstance(value, str):
                writes[path] = lambda t, text=value: Path(t).write_text(text)  # atomic tmp
            else:
                writes[path] = lambda t, table=value: _to_parquet(table, t)
        try:
            written = atomic_write_all(writes)
            for path in removals:
                path.unlink(missing_ok=True)
        except OSError as exc:
            raise os_error(exc, ", ".join(str(p) for p in [*writes, *removals])) from exc
        return written

    def write_table(self, name: str, table: pa.Table) -> Path | None:
        """Write (replace) one of the merged small tables, conformed to its schema."""
        written = self.write_tables({name: table})
        return written[0] if written else None

    def write_tables(self, tables: Mapping[str, pa.Table]) -> list[Path]:
        """Replace merged small tables together, under one lock, and only if the run still holds
        the generation they were computed from: an ingest that committed other data meanwhile
        wins, and these tables are listed in `unsaved` (never a run of two generations)."""
        if "events" in tables:
            raise RunError("events are written per source by ingest, not replaced")
        conformed = {name: schema.conform(name, t) for name, t in tables.items()}
        if self._pending is not None:
            self._pending.update({f"{name}.parquet": t for name, t in conformed.items()})
            return [self.path / f"{name}.parquet" for name in conformed]

        def write() -> list[Path]:
            recover(self.path)
            self._staged = False
            self.check_generation()
            return write_parquet_all({self.path / f"{name}.parquet": t for name, t in conformed.items()}, self.path)

        return self.save(", ".join(f"{name}.parquet" for name in conformed), write) or []

    def check_generation(self) -> None:
        """Refuse (RunError) when an ingest has committed another generation since this run was
        opened: what was computed from the old data must not land on the new."""
        on_disk = _current_generation(self.path)
        if on_disk is not None and on_disk != self.generation:
            raise RunError(f"{self.path}: an ingest replaced the run's data while this command read it "
                           f"(generation {self.generation}, now {on_disk}); run the command again")

    def write_json(self, name: str, payload: Any) -> Path | None:
        """Write a derived JSON document (analysis or replay results) under RUN/results/."""
        text = json.dumps(payload, indent=1, sort_keys=True, default=json_default)
        if self._pending is not None:
            self._pending[f"results/{name}.json"] = text
            return self.path / "results" / f"{name}.json"

        def write() -> Path:
            out = self.claim_results()
            return atomic_write(out / f"{name}.json", lambda t: Path(t).write_text(text), self.path)

        return self.save(f"results/{name}.json", write)

    def write_result_table(self, name: str, table: pa.Table | None) -> Path | None:
        """Store (or, for None, remove) a table under RUN/results/ (temporary name, renamed)."""
        if self._pending is not None:
            self._pending[f"results/{name}"] = table
            return None if table is None else self.path / "results" / name

        def write() -> Path | None:
            path = self.claim_results() / name
            if table is None:
                try:
                    path.unlink(missing_ok=True)
                except OSError as exc:
                    raise os_error(exc, str(path)) from exc
                return None
            return write_parquet(table, path, self.path)

        return self.save(f"results/{name}", write)

    def claim_results(self) -> Path:
        """RUN/results/ for results of this run's generation (call with the lock held); refuses
        when an ingest has committed another generation since this run was opened."""
        self.check_generation()
        return claim_results(self.path, self.generation)

    def result_path(self, name: str) -> Path | None:
        """RUN/results/NAME if it exists and was computed from this run's generation; a stale one
        is left aside with a note in `stale`."""
        path = self.path / "results" / name
        if not path.is_file() and not path.is_symlink():
            return None
        contained(self.path, path)
        stamp = results_generation(self.path)
        if stamp != self.generation and not (stamp is None and self.generation.startswith("legacy-")):
            note = (f"results/{name} was computed from an earlier ingest of this run (generation {stamp or 'unknown'},"
                    f" now {self.generation}); left out: run the command that writes it again")
            if note not in self.stale:
                self.stale.append(note)
            return None
        return path

    def read_json(self, name: str) -> Any | None:
        path = self.result_path(f"{name}.json")
        if path is None:
            return None
        return json.loads(path.read_text())


def _current_generation(run_dir: Path) -> str | None:
    """The generation of the manifest on disk now (None when it cannot be read)."""
    try:
        manifest = json.loads((run_dir / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return manifest_generation(manifest) if isinstance(manifest, dict) else None


def part_path(run_dir: str | os.PathLike[str], key: str, name: str) -> Path:
    """Where one source's own table NAME is kept: RUN/sources/KEY/NAME.parquet."""
    return Path(run_dir) / "sources" / key / f"{name}.parquet"


def _rank_dirs(root: Path) -> list[Path]:
    out = []
    for p in root.glob("rank=*"):
        tail = p.name.split("=", 1)[1]
        if tail.isdigit() and len(tail) < 10:
            out.append(p)
    return out


def read_events(run_dir: str | os.PathLike[str], files: Sequence[str | os.PathLike[str]]) -> pa.Table:
    """The events in these files of a run (from `Run.event_files`), as one table: what a task
    reading one rank partition needs, without reopening the run and checking all its parts."""
    if not files:
        return schema.empty("events")
    tables = [_read(Path(run_dir), Path(f)) for f in files]
    return schema.conform("events", pa.concat_tables(tables, promote_options="permissive"))


def event_frame(run_dir: str | os.PathLike[str], files: Sequence[str | os.PathLike[str]],
                columns: Sequence[str] | None = None) -> pl.DataFrame:
    """`read_events` as a polars frame, optionally of some `columns` only, read in one multi-file
    scan (as `Run.scan` reads them all): per file, a ParquetFile read costs several times more.
    Files the scan cannot take together (an unreadable one, or schemas that differ) go through
    `read_events`, which names a bad file or promotes the schemas."""
    root = os.path.realpath(run_dir)
    paths = [str(contained(run_dir, f, root=root)) for f in files]
    if paths:
        scan = pl.scan_parquet(paths)
        try:
            return (scan.select(columns) if columns is not None else scan).collect()
        except (pl.exceptions.PolarsError, OSError):
            pass
    df = pl.from_arrow(read_events(run_dir, files))
    assert isinstance(df, pl.DataFrame)
    return df.select(columns) if columns is not None else df


def _read(run_dir: Path, path: Path) -> pa.Table:
    contained(run_dir, path)
    try:
        return pq.ParquetFile(path).read()  # read_table costs twice as much per file
    except OSError as exc:
        raise os_error(exc, str(path)) from exc
    except (pa.ArrowException, ValueError) as exc:
        raise RunError(f"{path}: unreadable table ({str(exc).splitlines()[0][:200]}); run `tracekit ingest` again") \
            from exc


def write_manifest(run_dir: Path, manifest: Manifest | Mapping[str, Any]) -> None:
    text = manifest_text(manifest)
    atomic_write(Path(run_dir) / MANIFEST, lambda t: Path(t).write_text(text), Path(run_dir))


def remove_stale_sources(run_dir: Path, keep: set[str]) -> None:
    """Delete the parts of sources that are no longer part of the run (after the manifest that
    no longer lists them is in place); never through a symlink leading out of the run."""
    run_dir = Path(run_dir)
    root = os.path.realpath(run_dir)

    def inside(p: Path) -> bool:
        real = os.path.realpath(p)
        return real.startswith(root + os.sep)

    sources = run_dir / "sources"
    if sources.is_dir() and not sources.is_symlink() and inside(sources):
        for part in sources.iterdir():
            if part.name not in keep:
                if part.is_symlink() or not part.is_dir():
                    part.unlink(missing_ok=True)
                elif inside(part):
                    shutil.rmtree(part, ignore_errors=True)
    events = run_dir / "events"
    if not events.is_dir() or events.is_symlink() or not inside(events):
        return
    for rank_dir in events.glob("rank=*"):
        if rank_dir.is_symlink() or not inside(rank_dir):
            rank_dir.unlink(missing_ok=True) if rank_dir.is_symlink() else None
            continue
        for path in rank_dir.glob("*.parquet"):
            if path.stem not in keep:
                path.unlink(missing_ok=True)  # unlinking a symlink removes the link, not its target
        with contextlib.suppress(OSError):
            if not any(rank_dir.iterdir()):
                rank_dir.rmdir()
