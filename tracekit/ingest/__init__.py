"""Ingest trace files into a run directory: plan (expand paths, detect formats, cache keys,
`plan`), parse the sources not cached on one executor (`parse`), merge the small tables
(`merge`), describe the outcome and commit it with the manifest (`describe`). Raw traces given
to a command instead of a run are ingested into this user's cache (`cache`)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from tracekit.atomic import atomic_write_text
from tracekit.errors import TracekitError
from tracekit.executors import Executor, parse_executor
from tracekit.ingest import merge as merging
from tracekit.ingest import parse as parsing
from tracekit.ingest.cache import CACHE_LOCK_WAIT_S, cache_dir, cache_root, is_run_dir, open_run
from tracekit.ingest.describe import (
    IngestReport,
    ProgressFn,
    SourceReport,
    build_manifest,
    unchanged,
)
from tracekit.ingest.merge import (
    COPIED_WHEN_ONE_PART,
    FIRST_WINS,
    MERGE_FILE,
    MERGE_ROWS,
    MERGE_TMP,
    PER_RANK_TABLES,
    PER_TABLE_CHOICE,
    SPLIT_ROWS,
    primary_sources,
)
from tracekit.ingest.parse import FATAL_ERRNOS, KEPT_IN_MEMORY, PARALLEL_MIN_BYTES
from tracekit.ingest.plan import SOURCE_RECORD, expand_paths, plan_sources, read_rank_map, sha256_file
from tracekit.manifest import IgnoredFile, SourceRecord
from tracekit.results import dumps
from tracekit.store import (
    LOCK,
    MANIFEST,
    MARKER,
    STAGING,
    RunLock,
    atomic_write,
    claim_results,
    commit,
    contained,
    forget_written,
    os_error,
    recover,
    refuse_links,
    remove_stale_sources,
)

__all__ = [
    "CACHE_LOCK_WAIT_S", "COPIED_WHEN_ONE_PART", "FATAL_ERRNOS", "FIRST_WINS", "KEPT_IN_MEMORY", "MERGE_FILE",
    "MERGE_ROWS", "MERGE_TMP", "PARALLEL_MIN_BYTES", "PER_RANK_TABLES", "PER_TABLE_CHOICE", "RUN_ENTRIES",
    "SOURCE_RECORD", "SPLIT_ROWS", "IgnoredFile", "IngestReport", "ProgressFn", "SourceRecord", "SourceReport",
    "cache_dir", "cache_root", "expand_paths", "ingest", "is_run_dir", "open_run", "primary_sources",
    "read_rank_map", "sha256_file",
]

#: the entries of a run an ingest writes or removes; a link at any of them is refused up front
RUN_ENTRIES = ("sources", "events", "results", STAGING, MERGE_TMP, MARKER, LOCK, MANIFEST)


def _prepare_out(out: Path) -> None:
    """Create (or check) the run directory and mark it as one (before anything is written)."""
    if out.exists() and not out.is_dir():
        raise TracekitError(f"{out}: exists and is not a directory")
    if out.is_dir() and not (out / MANIFEST).is_file() and not (out / MARKER).exists() and any(out.iterdir()):
        raise TracekitError(f"{out}: exists, is not empty and is not a tracekit run directory; "
                            "choose another -o, or empty it first")
    refuse_links(out, RUN_ENTRIES)
    try:
        out.mkdir(parents=True, exist_ok=True)
        marker = contained(out, out / MARKER)
        if not marker.exists():
            atomic_write_text(marker, "tracekit run directory\n")
    except OSError as exc:
        raise os_error(exc, str(out)) from exc


def _discard_new_run(run_dir: Path) -> None:
    """Remove what a failed first ingest made, so the directory never looks like a run."""
    for name in ("sources", "events"):
        p = run_dir / name
        if p.is_symlink():
            p.unlink()
        elif p.is_dir():
            contained(run_dir, p)
            shutil.rmtree(p, ignore_errors=True)


def ingest(paths: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str], *,
           jobs: int | None = None, rank: int | None = None,
           comm_patterns: Sequence[str] | None = None,
           rank_map: Mapping[tuple[str | None, int, int], int] | None = None,
           progress: ProgressFn | None = None, allow_mixed: bool = False,
           executor: str | Executor | None = None, lock_wait_s: float = 0.0) -> IngestReport:
    """Ingest trace files, directories and globs into the run directory `out` (waiting up to
    `lock_wait_s` for another writer of it to finish).

    Per-source failures are recorded in the report and the manifest; the other files still
    ingest. Unchanged sources (same sha256, parser version and options) are cache hits. Sources
    from different jobs raise `tracekit.validity.MixedRunError` unless `allow_mixed` (a rank
    with sources from two jobs always does). `executor` "ray" or "ray://HOST:PORT" parses each
    file as a Ray task writing its parts into `out` (which must then be on storage every node
    shares); the default parses here (`jobs`).

    The run directory is locked while it is written (a second writer gets a RunError) and the
    new merged tables and manifest replace the old ones in one commit (`store.commit`). When no
    source could be ingested, or the sources are refused, nothing is committed
    (`report.committed` is False): a previous run stays as it was, a new directory gets no
    manifest.
    """
    exe = parse_executor(executor)
    run_dir = Path(out)
    _prepare_out(run_dir)
    with RunLock(run_dir, wait_s=lock_wait_s):
        recover(run_dir)
        try:
            return _ingest_locked(paths, run_dir, jobs=jobs, rank=rank, comm_patterns=comm_patterns,
                                  progress=progress, allow_mixed=allow_mixed, exe=exe, rank_map=rank_map)
        except OSError as exc:
            raise os_error(exc) from exc
        finally:
            forget_written()


def _ingest_locked(paths: Sequence[str | os.PathLike[str]], run_dir: Path, *, jobs: int | None, rank: int | None,
                   comm_patterns: Sequence[str] | None, progress: ProgressFn | None,
                   allow_mixed: bool, exe: Executor,
                   rank_map: Mapping[tuple[str | None, int, int], int] | None = None) -> IngestReport:
    new_run = not (run_dir / MANIFEST).is_file()
    if comm_patterns is not None:
        from tracekit.parsers.kineto import compile_patterns
        try:
            compile_patterns(comm_patterns)
        except ValueError as exc:
            raise TracekitError(str(exc)) from exc
    plan = plan_sources(paths, run_dir, rank=rank, comm_patterns=comm_patterns)
    reports, todo = plan.sources, plan.todo
    total = len(reports)
    done = 0

    def parsed(rep: SourceReport) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(rep, done, total)

    for rep in reports:
        if rep.cached or rep.error:
            parsed(rep)
    stale = parsing.event_parts_by_source(run_dir) if todo else {}
    parsing.parse_all(todo, run_dir, parsing.parse_executor_for(exe, jobs, todo), rank=rank,
                      comm_patterns=comm_patterns, stale=stale, parsed=parsed)
    parsing.lone_trace_as_rank0(reports, todo, run_dir, rank, comm_patterns, stale)
    parsing.nsys_ranks_from_logs(reports, todo, run_dir, rank, rank_map, stale)
    keep = {r.key for r in reports if r.ok and r.key}
    reports.sort(key=lambda r: r.path or "")
    report = IngestReport(run_dir=run_dir, sources=reports, ignored=plan.ignored)
    if not report.ingested:
        if new_run:
            _discard_new_run(run_dir)
        return report
    if not todo and not new_run and unchanged(run_dir, report, rank=rank, comm_patterns=comm_patterns):
        return report
    from tracekit.validity import check_run_dir
    report.validity = check_run_dir(run_dir, [r for r in reports if r.ok and r.key], allow_mixed=allow_mixed)
    copies: dict[str, Path] = {}
    merge_file = run_dir / merging.MERGE_FILE
    try:
        merged, report.tables = merging.merge_tables(run_dir, [r for r in reports if r.ok and r.key],
                                                     report.warnings, copies, merge_file)
        telemetry = merging.rate_telemetry(merged, report, copies)
        manifest = build_manifest(report, rank=rank, comm_patterns=comm_patterns)
        commit(run_dir, merged, manifest, copies=copies)
    finally:
        merge_file.unlink(missing_ok=True)
    report.committed = True
    remove_stale_sources(run_dir, keep)
    if telemetry is not None or (run_dir / "results").is_dir():
        results = claim_results(run_dir, str(manifest.generation))  # results of the old data go
    if telemetry is not None:
        text = dumps(telemetry, indent=1, sort_keys=True)
        atomic_write(results / "telemetry.json", lambda t: Path(t).write_text(text), run_dir)
    return report
