"""Ingest trace files into a run directory: expand paths, detect formats, parse in parallel,
reuse unchanged sources from the cache, merge the small tables, write the manifest."""

from __future__ import annotations

import contextlib
import errno
import glob
import hashlib
import json
import multiprocessing
import os
import shutil
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute
import pyarrow.parquet as pq

from tracekit import schema
from tracekit.atomic import atomic_write_text
from tracekit.errors import InputError, TracekitError
from tracekit.executors import Executor, parse_executor, run_tasks
from tracekit.parsers import detect, registry
from tracekit.results import Result, dumps, from_builtins, to_builtins
from tracekit.store import (
    LOCK,
    MANIFEST,
    MARKER,
    SMALL_TABLES,
    STAGING,
    RunError,
    RunLock,
    SourceSink,
    atomic_write,
    claim_results,
    commit,
    contained,
    forget_written,
    os_error,
    parquet_options,
    recover,
    refuse_links,
    remove_stale_sources,
    take_written,
)
from tracekit.validity import RunValidity

if TYPE_CHECKING:
    from tracekit.telemetry import RatesFile

SOURCE_RECORD = "source.json"
#: With `jobs` unset, inputs smaller than this in total are parsed in-process (workers cost more).
PARALLEL_MIN_BYTES = 16 << 20
_GLOB_CHARS = set("*?[")


class SourceReport(Result, frozen=False, kw_only=True):
    """What happened to one input file."""

    path: str
    size: int | None = None
    sha256: str | None = None
    format: str | None = None
    key: str | None = None
    cached: bool = False
    error: str | None = None
    read: int = 0
    stored: int = 0
    skipped: dict[str, int] = msgspec.field(default_factory=dict)
    dropped: dict[str, int] = msgspec.field(default_factory=dict)
    warnings: list[str] = msgspec.field(default_factory=list)
    ranks: list[int] = msgspec.field(default_factory=list)
    events: int = 0
    collectives: int = 0
    groups: int = 0
    steps: list[int | None] = msgspec.field(default_factory=list)
    ts_min_ns: int | None = None
    ts_max_ns: int | None = None
    parser_version: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class IgnoredFile(Result, frozen=True, kw_only=True):
    """A file found in a directory or glob that no parser reads, and why it was left out."""

    path: str
    reason: str


class IngestReport(Result, frozen=False, kw_only=True, dict=True):
    """The outcome of one `ingest` call: one SourceReport per input file, plus run warnings; its
    JSON is what `tracekit ingest --json` prints (the run directory as `run`).

    `ranks` (the ranks of the ingested sources) follows from `sources`: `__post_init__` sets it
    when the report is made, whatever was given. `committed`, whether a new manifest was written
    (False when nothing could be ingested), is not part of the JSON."""

    run_dir: Path = msgspec.field(name="run")
    sources: list[SourceReport]
    ranks: list[int] = msgspec.field(default_factory=list)
    tables: dict[str, int] = msgspec.field(default_factory=dict)
    warnings: list[str] = msgspec.field(default_factory=list)
    ignored: list[IgnoredFile] = msgspec.field(default_factory=list)
    validity: RunValidity | None = None  # once the sources were checked
    committed: ClassVar[bool] = False

    def __post_init__(self) -> None:
        self.ranks = sorted({r for s in self.ingested for r in s.ranks})

    @property
    def exit_code(self) -> int:
        """0: every source ingested; 1: none; 2: some (the others failed)."""
        if not self.ingested:
            return 1
        return 2 if self.failed else 0

    @property
    def ingested(self) -> list[SourceReport]:
        return [s for s in self.sources if s.ok]

    @property
    def failed(self) -> list[SourceReport]:
        return [s for s in self.sources if not s.ok]


ProgressFn = Callable[[SourceReport, int, int], None]


def expand_paths(paths: Iterable[str | os.PathLike[str]], *, exclude: Path | None = None
                 ) -> tuple[list[Path], list[SourceReport]]:
    """Files named by paths, directories (recursive) and globs, sorted and de-duplicated;
    plus an error report for every path that matches nothing."""
    files: list[Path] = []
    missing: list[SourceReport] = []
    excl = exclude.resolve() if exclude is not None else None
    for raw in paths:
        text = os.fspath(raw)
        p = Path(text)
        if p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.is_file())
        elif p.is_file():
            found = [p]
        elif _GLOB_CHARS & set(text):
            found = []
            for m in sorted(glob.glob(text, recursive=True)):
                mp = Path(m)
                found.extend(sorted(f for f in mp.rglob("*") if f.is_file()) if mp.is_dir() else [mp])
            if not found:
                missing.append(SourceReport(path=text, error=f"{text}: no file matches"))
        else:
            missing.append(SourceReport(path=text, error=f"{text}: no such file or directory"))
            continue
        for f in found:
            r = f.resolve()
            if excl is not None and (r == excl or excl in r.parents):
                continue
            if r.name.startswith(".") or any(part.startswith(".") for part in f.parts[-2:-1]):
                continue
            files.append(r)
    seen: set[Path] = set()
    unique = []
    for f in files:
        if f not in seen:
            seen.add(f)
            unique.append(f)
    return unique, missing


def _is_compressed(path: Path) -> bool:
    """A gzip file we could not read is a broken trace, not a stray file to ignore."""
    try:
        with open(path, "rb") as fh:
            return fh.read(2) == b"\x1f\x8b"
    except OSError:
        return True


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while True:
            data = fh.read(chunk)
            if not data:
                break
            h.update(data)
    return h.hexdigest()


def _parser_version(fmt: str) -> str:
    spec = registry.get(fmt)
    return spec.version if spec is not None else "0"


def _source_key(sha: str, fmt: str, rank: int | None, patterns: Sequence[str] | None,
                rank_map: Mapping[tuple[str | None, int, int], int] | None = None) -> str:
    spec = registry.get(fmt)
    comm = list(patterns) if patterns is not None and spec is not None and "comm_patterns" in spec.options else None
    extra = {"rank_map": sorted(map(list, ((h or "", p, d, r) for (h, p, d), r in rank_map.items())))} \
        if rank_map else {}
    opts = json.dumps({"sha": sha, "fmt": fmt, "v": _parser_version(fmt), "rank": rank,
                       "comm": comm, **extra,
                       "schema": schema.SCHEMA_VERSION}, sort_keys=True)
    return hashlib.sha256(opts.encode()).hexdigest()[:20]


def _clear_parts(run_dir: Path, key: str, event_parts: Iterable[Path] | None = None) -> None:
    """Remove a source's parts; its event files are `event_parts` when known (else found by a glob
    over every rank, which costs a directory listing per rank). Never through a symlink that
    leads out of the run."""
    part = run_dir / "sources" / key
    if part.is_symlink():
        part.unlink()
    elif part.exists():
        contained(run_dir, part)
        shutil.rmtree(part, ignore_errors=True)
    if event_parts is None:
        event_parts = (run_dir / "events").glob(f"rank=*/{key}.parquet")
    for p in event_parts:
        p = Path(p)
        if not p.parent.is_symlink():
            p.unlink(missing_ok=True)


def _event_parts_by_source(run_dir: Path) -> dict[str, list[Path]]:
    """Every event file in the run, by source key (one listing of the events tree)."""
    parts: dict[str, list[Path]] = {}
    for p in (run_dir / "events").glob("rank=*/*.parquet"):
        parts.setdefault(p.stem, []).append(p)
    return parts


def _parse_one(path: str, run_dir: str, key: str, fmt: str, rank: int | None,
               patterns: Sequence[str] | None, stale: Sequence[Path] | None = None, *,
               keep: tuple[str, ...] = (),
               rank_map: Mapping[tuple[str | None, int, int], int] | None = None) -> dict[str, Any]:
    """Parse one source into its parts (runs in a worker process); never raises. `stale` lists
    event files a previous parse of this source left (None: look for them); the tables in
    `keep` stay in memory for a merge in this process (`store.take_written`)."""
    run = Path(run_dir)
    _clear_parts(run, key, stale)
    overflows_before = schema.overflows()
    try:
        spec = registry.get(fmt)
        if spec is None:
            raise InputError(path, f"format {fmt!r} is recognised but not supported yet")
        sink = SourceSink(run, key, keep=keep)
        given = {"comm_patterns": patterns, "rank_map": rank_map}
        try:
            res = spec.parse(path, sink, rank=rank, **{option: given[option] for option in spec.options})
        finally:
            parts = sink.close()
            pa.default_memory_pool().release_unused()  # the next parse or the merge starts from a low RSS
        if not res.stats.balanced:
            raise InputError(path, f"internal accounting error: {to_builtins(res.stats.counts())}")
        nulled = schema.overflows() - overflows_before
        if nulled:
            res.stats.warnings.append(f"{nulled} number(s) beyond the 64-bit range stored as null")
        record = {
            "key": key, "format": fmt, "parser_version": spec.version, "parts": parts,
            **to_builtins(res.stats.counts()), "ranks": res.all_ranks, "events": res.events,
            "collectives": res.collectives, "groups": res.groups, "steps": res.steps,
            "ts_min_ns": res.ts_min_ns, "ts_max_ns": res.ts_max_ns, "error": None,
        }
        atomic_write_text(run / "sources" / key / SOURCE_RECORD, json.dumps(record, sort_keys=True))
        return record
    except OSError as exc:
        with contextlib.suppress(OSError, TracekitError):
            _clear_parts(run, key)
        if exc.errno in FATAL_ERRNOS:  # the run directory cannot be written: stop, commit nothing
            return {"key": key, "error": str(os_error(exc)), "fatal": True}
        return {"key": key, "error": f"{path}: {exc.strerror or exc}"}
    except (TracekitError, ValueError, MemoryError) as exc:
        with contextlib.suppress(OSError, TracekitError):
            _clear_parts(run, key)
        msg = str(exc) if isinstance(exc, InputError) else f"{path}: {exc}"
        return {"key": key, "error": msg}
    except Exception as exc:
        _clear_parts(run, key)
        return {"key": key, "error": f"{path}: internal error ({type(exc).__name__}: {exc})"}


def _cached_record(run_dir: Path, key: str) -> dict[str, Any] | None:
    """The record of a source parsed before, or None (parse it again) when it is missing, malformed,
    or any of its parts is a link or lies outside the run: a received run's cache is not trusted."""
    part = run_dir / "sources" / key
    path = part / SOURCE_RECORD
    if part.is_symlink() or path.is_symlink() or not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
        if any(p.is_symlink() for p in part.iterdir()):
            return None
    except (OSError, ValueError):
        return None
    parts = record.get("parts") if isinstance(record, dict) else None
    events = parts.get("events") if isinstance(parts, dict) else None
    if record.get("key") != key or not isinstance(events, dict):
        return None
    root = os.path.realpath(run_dir)
    for rel in events.values():
        if not isinstance(rel, str):
            return None
        file = run_dir / rel
        if file.is_symlink() or file.parent.is_symlink() or not file.is_file():
            return None
        if not os.path.realpath(file).startswith(root + os.sep):
            return None
    return record


#: OS errors that concern the run directory, not one source: the ingest stops and commits nothing.
FATAL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS}


def _lone_trace_as_rank0(reports: list[SourceReport], todo: list[tuple[SourceReport, str]], run_dir: Path,
                         rank: int | None, comm_patterns: Sequence[str] | None,
                         stale: Mapping[str, list[Path]]) -> None:
    """A single Kineto trace with no distributedInfo and no rank in its file name (a single-GPU run)
    is the only rank there is: parse it again as rank 0, with a warning, instead of refusing it.
    With several traces, or a distributedInfo that names a backend but no rank, the rank is needed
    and `--rank` still applies."""
    if rank is not None or len(reports) != 1 or len(todo) != 1:
        return
    rep, fmt = todo[0]
    refusal = spec.alone_is_rank0 if (spec := registry.get(fmt)) is not None else None
    if refusal is None or not rep.error or refusal not in rep.error:
        return
    refused, key = rep.error, rep.key
    rep.key = _source_key(rep.sha256 or "", fmt, 0, comm_patterns)
    _apply(rep, _parse_one(rep.path, str(run_dir), rep.key, fmt, 0, comm_patterns, stale.get(rep.key, []),
                           keep=KEPT_IN_MEMORY))
    if not rep.ok or not rep.stored:  # nothing usable either way: the rank was not the problem
        rep.error, rep.key = refused, key
        return
    rep.warnings = [*(rep.warnings or []), "the trace has no distributedInfo and its file name names no rank; "
                                           "it is the only one given: taken as rank 0 (--rank sets it)"]


def read_rank_map(path: str | os.PathLike[str]) -> dict[tuple[str | None, int, int], int]:
    """A `--rank-map` CSV (header `host,pid,device,rank`; an empty host matches any) as
    {(host, pid, device): rank}; a bad line is an InputError naming it."""
    import csv

    out: dict[tuple[str | None, int, int], int] = {}
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise InputError(path, f"cannot read the rank map ({exc})") from exc
    if not rows or [c.strip() for c in rows[0]] != ["host", "pid", "device", "rank"]:
        raise InputError(path, "a rank map starts with the header host,pid,device,rank")
    for n, row in enumerate(rows[1:], start=2):
        if not row:
            continue
        try:
            host, pid, device, rank = row
            key = (host.strip() or None, int(pid), int(device))
            out[key] = int(rank)
        except ValueError as exc:
            raise InputError(path, f"line {n}: expected host,pid,device,rank with integers ({exc})") from exc
        if not (0 <= out[key] < 1 << 18 and key[1] >= 0 and key[2] >= 0):
            raise InputError(path, f"line {n}: pid, device and rank must be non-negative (rank < 262144)")
    return out


def _nsys_ranks_from_logs(reports: list[SourceReport], todo: list[tuple[SourceReport, str]], run_dir: Path,
                          rank: int | None, rank_map: Mapping[tuple[str | None, int, int], int] | None,
                          stale: Mapping[str, list[Path]]) -> None:
    """Nsight reports whose NVTX ranges name no rank (NCCL before 2.19) get their ranks from the
    run's NCCL logs, joined by (host, pid, device), and from `--rank-map`: parsed again with them."""
    def refusal(fmt: str | None) -> str | None:
        return spec.ranks_from_logs if fmt and (spec := registry.get(fmt)) is not None else None

    waiting = [(rep, fmt) for rep, fmt in todo if (no_rank := refusal(fmt)) and rep.error and no_rank in rep.error]
    if not waiting:
        return
    known: dict[tuple[str | None, int, int], int] = {}
    for rep in reports:
        if rep.ok and rep.key and _is(rep.format, "nccl_facts"):
            t = _read_part(run_dir, rep.key, "ranks")
            for row in (t.select(["rank", "host", "pid", "local_device"]).to_pylist() if t is not None else []):
                if None not in (row["rank"], row["pid"], row["local_device"]):
                    known.setdefault((row["host"], row["pid"], row["local_device"]), row["rank"])
    known.update(rank_map or {})
    if not known:
        return
    for rep, fmt in waiting:
        refused, key = rep.error, rep.key
        rep.key = _source_key(rep.sha256 or "", fmt, rank, None, known)
        _apply(rep, _parse_one(rep.path, str(run_dir), rep.key, fmt, rank, None, stale.get(rep.key, []),
                               rank_map=known))
        if not rep.ok:
            rep.key = key
            if refusal(fmt) in (rep.error or ""):
                rep.error = refused


def _apply(report: SourceReport, record: dict[str, Any]) -> None:
    if record.get("fatal"):
        raise RunError(f"{record.get('error')}; nothing was committed, the run directory is as it was")
    report.error = record.get("error")
    if report.error:
        return
    report.parser_version = record.get("parser_version")
    for name in ("read", "stored", "skipped", "dropped", "warnings", "ranks", "events", "collectives",
                 "groups", "steps", "ts_min_ns", "ts_max_ns"):
        if name in record:
            setattr(report, name, record[name])


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
                   allow_mixed: bool, exe: Any,
                   rank_map: Mapping[tuple[str | None, int, int], int] | None = None) -> IngestReport:
    new_run = not (run_dir / MANIFEST).is_file()
    if comm_patterns is not None:
        from tracekit.parsers.kineto import compile_patterns
        try:
            compile_patterns(comm_patterns)
        except ValueError as exc:
            raise TracekitError(str(exc)) from exc
    files, reports = expand_paths(paths, exclude=run_dir)
    named = {Path(p).resolve() for p in paths if Path(p).is_file()}
    ignored: list[IgnoredFile] = []
    todo: list[tuple[SourceReport, str]] = []
    keys_seen: dict[str, str] = {}
    for f in files:
        rep = SourceReport(path=str(f))
        reports.append(rep)
        try:
            rep.size = f.stat().st_size
            rep.sha256 = sha256_file(f)
        except OSError as exc:
            rep.error = f"{f}: cannot read ({exc.strerror or exc})"
            continue
        fmt = detect.detect_format(f)
        rep.format = fmt
        if fmt is None and f not in named and not _is_compressed(f):
            reports.remove(rep)
            ignored.append(IgnoredFile(path=str(f), reason="unknown format (found in a directory or glob)"))
            continue
        if fmt is None:
            rep.error = f"{f}: unknown format (not a Kineto/Chrome trace or another supported format)"
            continue
        key = _source_key(rep.sha256, fmt, rank, comm_patterns)
        rep.key = key
        if key in keys_seen:
            rep.error = f"{f}: same content as {keys_seen[key]}; ingested once"
            continue
        keys_seen[key] = str(f)
        cached = _cached_record(run_dir, key)
        if cached is not None:
            rep.cached = True
            _apply(rep, cached)
        else:
            todo.append((rep, fmt))
    total = len(reports)
    done = 0
    for rep in reports:
        if rep.cached or rep.error:
            done += 1
            if progress is not None:
                progress(rep, done, total)
    stale = _event_parts_by_source(run_dir) if todo else {}
    n_jobs = max(1, min(jobs or (os.cpu_count() or 1), len(todo) or 1))
    small = sum(rep.size or 0 for rep, _ in todo) < PARALLEL_MIN_BYTES
    if not exe.is_local and todo:
        def finished(i: int, record: dict[str, Any]) -> None:
            nonlocal done
            _apply(todo[i][0], record)
            done += 1
            if progress is not None:
                progress(todo[i][0], done, total)

        shared = str(run_dir.resolve())
        run_tasks(exe, _parse_one, [(str(Path(rep.path).resolve()), shared, rep.key or "", fmt, rank,
                                     list(comm_patterns) if comm_patterns is not None else None)
                                    for rep, fmt in todo], done=finished)
    elif n_jobs == 1 or len(todo) <= 1 or (jobs is None and small):
        for rep, fmt in todo:
            _apply(rep, _parse_one(rep.path, str(run_dir), rep.key or "", fmt, rank, comm_patterns,
                                   stale.get(rep.key or "", []), keep=KEPT_IN_MEMORY))
            done += 1
            if progress is not None:
                progress(rep, done, total)
    else:
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=n_jobs, mp_context=ctx) as pool:
            futures = {pool.submit(_parse_one, rep.path, str(run_dir), rep.key or "", fmt, rank,
                                   comm_patterns, stale.get(rep.key or "", [])): rep for rep, fmt in todo}
            for fut in as_completed(futures):
                rep = futures[fut]
                try:
                    record = fut.result()
                except Exception as exc:
                    record = {"error": f"{rep.path}: worker failed ({type(exc).__name__}: {exc})"}
                _apply(rep, record)
                done += 1
                if progress is not None:
                    progress(rep, done, total)
    _lone_trace_as_rank0(reports, todo, run_dir, rank, comm_patterns, stale)
    _nsys_ranks_from_logs(reports, todo, run_dir, rank, rank_map, stale)
    keep = {r.key for r in reports if r.ok and r.key}
    reports.sort(key=lambda r: r.path)
    report = IngestReport(run_dir=run_dir, sources=reports, ignored=ignored)
    if not report.ingested:
        if new_run:
            _discard_new_run(run_dir)
        return report
    if not todo and not new_run and _unchanged(run_dir, report, rank=rank, comm_patterns=comm_patterns):
        return report
    from tracekit.validity import check_run_dir
    report.validity = check_run_dir(run_dir, [r for r in reports if r.ok and r.key], allow_mixed=allow_mixed)
    copies: dict[str, Path] = {}
    merge_file = run_dir / MERGE_FILE
    try:
        merged, report.tables = _merge(run_dir, [r for r in reports if r.ok and r.key], report.warnings, copies,
                                       merge_file)
        telemetry = _rate_telemetry(merged, report, copies)
        manifest = _manifest(report, rank=rank, comm_patterns=comm_patterns)
        commit(run_dir, merged, manifest, copies=copies)
    finally:
        merge_file.unlink(missing_ok=True)
    report.committed = True
    remove_stale_sources(run_dir, keep)
    if telemetry is not None or (run_dir / "results").is_dir():
        results = claim_results(run_dir, manifest["generation"])  # results of the old data go
    if telemetry is not None:
        text = dumps(telemetry, indent=1, sort_keys=True)
        atomic_write(results / "telemetry.json", lambda t: Path(t).write_text(text), run_dir)
    return report


def _unchanged(run_dir: Path, report: IngestReport, *, rank: int | None,
               comm_patterns: Sequence[str] | None) -> bool:
    """Whether the committed run is what this ingest would commit: the same sources (every one a
    cache hit, as they were when it was committed), files ignored, options, schema and tracekit
    version, of one job, with its tables in place. `report` then takes the committed tables,
    warnings and validity, and the run is neither merged, checked nor committed again (a warm
    `tracekit replay` re-opens its cache)."""
    from tracekit import __version__
    from tracekit.validity import RunValidity

    try:
        manifest = json.loads((run_dir / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(manifest, dict) or not isinstance(manifest.get("tables"), dict):
        return False
    validity = manifest.get("validity")
    options = {"rank": rank, "comm_patterns": list(comm_patterns) if comm_patterns else None}
    sources = to_builtins(report.sources)
    if (manifest.get("sources") != sources or manifest.get("ignored") != to_builtins(report.ignored)
            or manifest.get("options") != options or manifest.get("schema_version") != schema.SCHEMA_VERSION
            or manifest.get("tracekit_version") != __version__ or manifest.get("generation") != _generation(
                report, options) or not isinstance(validity, dict) or len(validity.get("jobs") or []) > 1):
        return False
    from tracekit.store import Run

    run = Run(run_dir)
    if not all(run.has(name) for name, rows in manifest["tables"].items() if rows):
        return False
    report.tables = dict(manifest["tables"])
    report.warnings = list(manifest.get("warnings") or [])
    report.validity = from_builtins(validity, RunValidity)
    return True


def _read_part(run_dir: Path, key: str, name: str) -> pa.Table | None:
    path = run_dir / "sources" / key / f"{name}.parquet"
    if not path.is_file():
        return None
    written = take_written(path)
    if written is not None:
        return schema.conform(name, written)
    return schema.conform(name, pq.ParquetFile(path).read())  # half the cost of read_table on small files


def _is(fmt: str | None, flag: str) -> bool:
    """Whether the registry's format `fmt` declares `flag` (a boolean field of `registry.Format`)."""
    spec = registry.get(fmt) if fmt else None
    return spec is not None and bool(getattr(spec, flag))


PER_RANK_TABLES = ("ranks", "collectives", "channels")


def primary_sources(sources: Sequence[SourceReport], *, having: set[str] | None = None) -> dict[int, list[str]]:
    """For each rank, the source keys whose rows count: every file of the best format for that
    rank (several Kineto windows of one rank all count), but one snapshot (Flight Recorder dumps
    given as both pickle and JSON are the same history). With `having` (source keys), only those
    sources compete: the best source of a table is chosen among the sources that have it."""
    by_rank: dict[int, list[SourceReport]] = {}
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
        if _is(keep[0].format, "snapshot"):
            keep = keep[:1]
        chosen[r] = sorted(c.key or "" for c in keep)
    return chosen


#: Per-rank tables whose source is chosen among the sources that have the table, not by the
#: rank's best format overall: only NCCL logs describe channels, so a rank traced by the profiler
#: still gets its channels from its NCCL log.
PER_TABLE_CHOICE = ("channels",)


#: Tables a parse in this process hands to the run's check and the merge in memory (no read back of
#: what it wrote).
KEPT_IN_MEMORY = ("counters", "ranks", "groups")
#: Tables that a single source's part gives unchanged: the merged file is a copy of the part
#: (re-encoding millions of telemetry counters cost as much as parsing them).
COPIED_WHEN_ONE_PART = ("counters",)


def _merge(run_dir: Path, sources: list[SourceReport], warnings: list[str], copies: dict[str, Path] | None = None,
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
                if any(_is(fmt, "nccl_facts") for fmt in aside) else "")
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
            t = _read_part(run_dir, s.key or "", name)
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
#: the entries of a run an ingest writes or removes; a link at any of them is refused up front
RUN_ENTRIES = ("sources", "events", "results", STAGING, MERGE_TMP, MARKER, LOCK, MANIFEST)
_COLL_ORDER = [("rank", "ascending"), ("ts_ns", "ascending"), ("coll_id", "ascending")]


def _merge_collectives(run_dir: Path, order: list[SourceReport], primary: dict[int, list[str]],
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


def _sorted(table: pa.Table, keys: list[tuple[str, str]]) -> pa.Table:
    """`table.sort_by(keys)`, without the copy when the rows are in that order already (one
    source's collectives usually are)."""
    order = pa.compute.sort_indices(table, sort_keys=keys).to_numpy()
    if np.array_equal(order, np.arange(len(order))):
        return table.combine_chunks()
    return table.take(order).combine_chunks()


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


def _rate_telemetry(merged: dict[str, pa.Table | None], report: IngestReport,
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



def _has_part(run_dir: Path, source: SourceReport, name: str) -> bool:
    return (run_dir / "sources" / (source.key or "") / f"{name}.parquet").is_file()


@dataclass
class _Fill:
    """What the collectives merge needs from NCCL logs: the communicators' rank maps and the
    algo/proto rows of logs set aside for a rank (donors)."""

    maps: dict[str, list[int | None]]
    donors: pa.Table | None


def _merge_nccl(run_dir: Path, sources: list[SourceReport], primary: dict[int, list[str]],
                tables: dict[str, pa.Table], warnings: list[str]) -> _Fill | None:
    """What NCCL logs add across sources: global ranks of peers another log named (through the
    merged `groups.rank_map`), one row per channel edge, and bus ids / hosts for ranks another
    format describes; returns what the collectives merge needs to resolve peers and fill
    algo/proto (None without NCCL logs)."""
    from tracekit import nccl_fabric

    logs = [s for s in sources if _is(s.format, "nccl_facts")]
    if not any(_is(s.format, "maps_peers") for s in sources):
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
            part = _read_part(run_dir, s.key or "", "collectives")
            if part is not None:
                donors.append(part.select(["rank", "op", "in_bytes", "nranks", "algo", "proto"])
                              .filter(pa.compute.is_valid(part.column("algo"))))
    donor = pa.concat_tables(donors, promote_options="permissive") if donors else None
    if "ranks" in tables:
        others = [t for s in logs if (t := _read_part(run_dir, s.key or "", "ranks")) is not None]
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


def _generation(report: IngestReport, options: Mapping[str, Any]) -> str:
    """What the run's data is made of (its sources' keys, the options, the schema): results of
    one generation are valid for exactly the run that has it."""
    keys = sorted(s.key for s in report.sources if s.ok and s.key)
    text = json.dumps({"keys": keys, "options": options, "schema": schema.SCHEMA_VERSION}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _manifest(report: IngestReport, *, rank: int | None, comm_patterns: Sequence[str] | None) -> dict[str, Any]:
    from tracekit import __version__
    options = {"rank": rank, "comm_patterns": list(comm_patterns) if comm_patterns else None}
    return {
        "generation": _generation(report, options),
        "tracekit_version": __version__,
        "schema_version": schema.SCHEMA_VERSION,
        "options": options,
        "sources": to_builtins(report.sources),
        "tables": report.tables,
        "ranks": report.ranks,
        "warnings": report.warnings,
        "ignored": to_builtins(report.ignored),
        "validity": to_builtins(report.validity) if report.validity is not None else None,
        "primary_sources": {str(r): keys for r, keys in
                            sorted(primary_sources([s for s in report.sources if s.ok and s.key]).items())},
    }


#: how long a command on raw traces waits for another one ingesting the same traces into the cache
CACHE_LOCK_WAIT_S = 600.0


def cache_root() -> Path:
    """This user's private cache of runs ingested from raw traces: $TMPDIR/tracekit-replay-UID,
    mode 0700. Refused when it is a link, not a directory, someone else's, or open to others (in
    a shared temp dir anyone could have made it first, to read or plant runs)."""
    import tempfile

    from tracekit._private_dir import private_dir

    root = Path(tempfile.gettempdir()) / f"tracekit-replay-{os.getuid()}"
    try:
        problem = private_dir(root)
    except OSError as exc:
        raise os_error(exc, str(root)) from exc
    if problem:
        raise TracekitError(f"{root}: the cache of ingested traces {problem}; refused (remove it, or set "
                            "TMPDIR to a directory of your own)")
    return root


def cache_dir(paths: Sequence[str | os.PathLike[str]], *, rank: int | None = None) -> Path:
    """Where raw trace paths given to a command instead of a run directory are ingested: one
    directory per set of paths (and `rank` option) in this user's private cache (`cache_root`),
    the one `tracekit replay` uses, so `analyze`, `report`, `export`, `hang` and `info` on the same
    paths find the run replay wrote (with its results)."""
    key = hashlib.sha1("\n".join(sorted(str(Path(p).resolve()) for p in paths)).encode()).hexdigest()
    return cache_root() / (key[:16] if rank is None else f"{key[:16]}-rank{rank}")


def is_run_dir(paths: Sequence[str | os.PathLike[str]]) -> bool:
    """Whether `paths` name one run directory (or an interrupted ingest into one, which then says
    so rather than being read as traces)."""
    from tracekit.store import Run

    return len(paths) == 1 and (Run.is_run(paths[0]) or (Path(paths[0]) / MARKER).exists())


def open_run(paths: Sequence[str | os.PathLike[str]], *, cache: str | os.PathLike[str] | None = None,
             rank: int | None = None) -> tuple[Any, IngestReport | None]:
    """A run directory as is, or raw trace paths ingested into `cache` (default `cache_dir(paths)`;
    unchanged sources are cache hits): (the `Run`, the ingest's report when `paths` were raw
    traces, else None)."""
    from tracekit.store import Run

    if is_run_dir(paths):
        return Run(paths[0]), None
    out = Path(cache) if cache is not None else cache_dir(paths, rank=rank)
    from tracekit._progress import status

    status(f"ingesting {len(paths)} path(s) into {out}")
    wait = CACHE_LOCK_WAIT_S if cache is None else 0.0
    report = ingest(list(paths), out, lock_wait_s=wait, rank=rank)
    if not report.ingested:
        reasons = "; ".join(s.error or "" for s in report.failed[:3]) or "no input file in a supported format"
        raise TracekitError(f"nothing ingested from {', '.join(map(str, paths))}: {reasons}")
    run = Run(out)
    run.lock_wait_s = wait  # other commands on the same traces share this run: their saves wait too
    return run, report
