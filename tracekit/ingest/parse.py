"""Parsing an ingest's sources: each file into its parts in the run directory, as a task of one
executor (here, a pool of processes, or Ray), and the second passes that parse a source again
with what the first pass learnt (a lone trace as rank 0, Nsight ranks from the NCCL logs)."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import pyarrow as pa

from tracekit import schema
from tracekit.atomic import atomic_write_text
from tracekit.errors import InputError, TracekitError
from tracekit.executors import Executor, run_tasks
from tracekit.ingest.merge import format_declares, read_part
from tracekit.ingest.plan import SOURCE_RECORD, source_key
from tracekit.manifest import RunWriteFailure, SourceRecord
from tracekit.parsers import registry
from tracekit.results import to_builtins
from tracekit.store import RunError, SourceSink, contained, os_error

#: With `jobs` unset, inputs smaller than this in total are parsed in-process (workers cost more).
PARALLEL_MIN_BYTES = 16 << 20


#: Tables a parse in this process hands to the run's check and the merge in memory (no read back of
#: what it wrote).
KEPT_IN_MEMORY = ("counters", "ranks", "groups")


#: OS errors that concern the run directory, not one source: the ingest stops and commits nothing.
FATAL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS}


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


def event_parts_by_source(run_dir: Path) -> dict[str, list[Path]]:
    """Every event file in the run, by source key (one listing of the events tree)."""
    parts: dict[str, list[Path]] = {}
    for p in (run_dir / "events").glob("rank=*/*.parquet"):
        parts.setdefault(p.stem, []).append(p)
    return parts


def parse_source(path: str, run_dir: str, key: str, fmt: str, rank: int | None,
                 patterns: Sequence[str] | None, stale: Sequence[Path] | None = None,
                 keep: tuple[str, ...] = (),
                 rank_map: Mapping[tuple[str | None, int, int], int] | None = None
                 ) -> SourceRecord | RunWriteFailure:
    """Parse one source into its parts (runs in a worker process); never raises. `stale` lists
    event files a previous parse of this source left (None: look for them); the tables in
    `keep` stay in memory for a merge in this process (`store.take_written`). The record (with
    its parts) is also the source's cache entry; a parse that failed gives a record with its
    error, one that cannot write the run a `RunWriteFailure`."""
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
        counts = res.stats.counts()
        record = SourceRecord(
            path=path, key=key, format=fmt, parser_version=spec.version, parts=parts, read=counts.read,
            stored=counts.stored, skipped=counts.skipped, dropped=counts.dropped, warnings=counts.warnings,
            ranks=res.all_ranks, events=res.events, collectives=res.collectives, groups=res.groups,
            steps=res.steps, ts_min_ns=res.ts_min_ns, ts_max_ns=res.ts_max_ns)
        atomic_write_text(run / "sources" / key / SOURCE_RECORD, record.cache_text())
        return record
    except OSError as exc:
        with contextlib.suppress(OSError, TracekitError):
            _clear_parts(run, key)
        if exc.errno in FATAL_ERRNOS:  # the run directory cannot be written: stop, commit nothing
            return RunWriteFailure(key=key, error=str(os_error(exc)))
        return SourceRecord(path=path, key=key, error=f"{path}: {exc.strerror or exc}")
    except (TracekitError, ValueError, MemoryError) as exc:
        with contextlib.suppress(OSError, TracekitError):
            _clear_parts(run, key)
        msg = str(exc) if isinstance(exc, InputError) else f"{path}: {exc}"
        return SourceRecord(path=path, key=key, error=msg)
    except Exception as exc:
        _clear_parts(run, key)
        return SourceRecord(path=path, key=key, error=f"{path}: internal error ({type(exc).__name__}: {exc})")


def lone_trace_as_rank0(reports: list[SourceRecord], todo: list[tuple[SourceRecord, str]], run_dir: Path,
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
    rep.key = source_key(rep.sha256 or "", fmt, 0, comm_patterns)
    take_outcome(rep, parse_source(rep.path or "", str(run_dir), rep.key, fmt, 0, comm_patterns,
                                   stale.get(rep.key, []), keep=KEPT_IN_MEMORY))
    if not rep.ok or not rep.stored:  # nothing usable either way: the rank was not the problem
        rep.error, rep.key = refused, key
        return
    rep.warnings = [*(rep.warnings or []), "the trace has no distributedInfo and its file name names no rank; "
                                           "it is the only one given: taken as rank 0 (--rank sets it)"]


def nsys_ranks_from_logs(reports: list[SourceRecord], todo: list[tuple[SourceRecord, str]], run_dir: Path,
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
        if rep.ok and rep.key and format_declares(rep.format, "nccl_facts"):
            t = read_part(run_dir, rep.key, "ranks")
            for row in (t.select(["rank", "host", "pid", "local_device"]).to_pylist() if t is not None else []):
                if None not in (row["rank"], row["pid"], row["local_device"]):
                    known.setdefault((row["host"], row["pid"], row["local_device"]), row["rank"])
    known.update(rank_map or {})
    if not known:
        return
    for rep, fmt in waiting:
        refused, key = rep.error, rep.key
        rep.key = source_key(rep.sha256 or "", fmt, rank, None, known)
        take_outcome(rep, parse_source(rep.path or "", str(run_dir), rep.key, fmt, rank, None,
                                       stale.get(rep.key, []), rank_map=known))
        if not rep.ok:
            rep.key = key
            if refusal(fmt) in (rep.error or ""):
                rep.error = refused


def take_outcome(report: SourceRecord, outcome: SourceRecord | RunWriteFailure) -> None:
    """Give `report` the outcome of its parse; a `RunWriteFailure` stops the ingest."""
    if isinstance(outcome, RunWriteFailure):
        raise RunError(f"{outcome.error}; nothing was committed, the run directory is as it was")
    report.take_parse(outcome)


def parse_executor_for(executor: Executor, jobs: int | None, todo: Sequence[tuple[SourceRecord, str]]) -> Executor:
    """Where the sources to parse are parsed: on Ray when asked; else here, unless there are
    several to parse, more than one worker and (with `jobs` unset) enough bytes to pay for the
    workers, when a pool of processes does."""
    if not executor.is_local:
        return executor
    workers = max(1, min(jobs or (os.cpu_count() or 1), len(todo) or 1))
    small = sum(rep.size or 0 for rep, _ in todo) < PARALLEL_MIN_BYTES
    if workers == 1 or len(todo) <= 1 or (jobs is None and small):
        return executor
    return Executor("process", workers=workers)


def parse_all(todo: Sequence[tuple[SourceRecord, str]], run_dir: Path, executor: Executor, *, rank: int | None,
              comm_patterns: Sequence[str] | None, stale: Mapping[str, list[Path]],
              parsed: Callable[[SourceRecord], None]) -> None:
    """Parse every source of `todo` on `executor` (see `parse_executor_for`), each report taking
    its outcome; `parsed(report)` is called as each finishes. A Ray task finds its stale parts
    itself and reads the run through its resolved path (the one every node mounts); a parse in
    this process keeps the tables the merge reads in memory."""
    if executor.kind == "ray":
        shared = str(run_dir.resolve())
        patterns = list(comm_patterns) if comm_patterns is not None else None
        calls = [(str(Path(rep.path or "").resolve()), shared, rep.key or "", fmt, rank, patterns)
                 for rep, fmt in todo]
    else:
        keep = KEPT_IN_MEMORY if executor.is_local else ()
        calls = [(rep.path, str(run_dir), rep.key or "", fmt, rank, comm_patterns, stale.get(rep.key or "", []), keep)
                 for rep, fmt in todo]

    def finished(i: int, outcome: SourceRecord | RunWriteFailure) -> None:
        take_outcome(todo[i][0], outcome)
        parsed(todo[i][0])

    def worker_failed(i: int, exc: BaseException) -> SourceRecord:
        path = todo[i][0].path
        return SourceRecord(path=path, error=f"{path}: worker failed ({type(exc).__name__}: {exc})")

    run_tasks(executor, parse_source, calls, done=finished, failed=worker_failed)
