"""Planning an ingest: the input files (paths, directories and globs expanded), their formats,
their cache keys, and which of them the run's cache already holds."""

from __future__ import annotations

import glob
import hashlib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tracekit import schema
from tracekit.errors import InputError
from tracekit.manifest import IgnoredFile, SourceRecord, read_source_record
from tracekit.parsers import detect, registry

SOURCE_RECORD = "source.json"


_GLOB_CHARS = set("*?[")


def expand_paths(paths: Iterable[str | os.PathLike[str]], *, exclude: Path | None = None
                 ) -> tuple[list[Path], list[SourceRecord]]:
    """Files named by paths, directories (recursive) and globs, sorted and de-duplicated;
    plus an error report for every path that matches nothing."""
    files: list[Path] = []
    missing: list[SourceRecord] = []
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
                missing.append(SourceRecord(path=text, error=f"{text}: no file matches"))
        else:
            missing.append(SourceRecord(path=text, error=f"{text}: no such file or directory"))
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


def parser_version(fmt: str) -> str:
    spec = registry.get(fmt)
    return spec.version if spec is not None else "0"


def source_key(sha: str, fmt: str, rank: int | None, patterns: Sequence[str] | None,
                rank_map: Mapping[tuple[str | None, int, int], int] | None = None) -> str:
    spec = registry.get(fmt)
    comm = list(patterns) if patterns is not None and spec is not None and "comm_patterns" in spec.options else None
    extra = {"rank_map": sorted(map(list, ((h or "", p, d, r) for (h, p, d), r in rank_map.items())))} \
        if rank_map else {}
    opts = json.dumps({"sha": sha, "fmt": fmt, "v": parser_version(fmt), "rank": rank,
                       "comm": comm, **extra,
                       "schema": schema.SCHEMA_VERSION}, sort_keys=True)
    return hashlib.sha256(opts.encode()).hexdigest()[:20]


def cached_record(run_dir: Path, key: str) -> SourceRecord | None:
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
    if not isinstance(record, dict):
        return None
    parts = record.get("parts")
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
    return read_source_record(record)


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


@dataclass
class Plan:
    """The inputs of one ingest: a record per file (in the order found; errors and cache hits
    filled in), the files to parse with their formats, and the files left out."""

    sources: list[SourceRecord]
    todo: list[tuple[SourceRecord, str]]
    ignored: list[IgnoredFile]


def plan_sources(paths: Sequence[str | os.PathLike[str]], run_dir: Path, *, rank: int | None,
                 comm_patterns: Sequence[str] | None) -> Plan:
    """Expand `paths`, hash and detect every file, give it its cache key, and take the record of
    each source the run's cache holds; the others are to parse. A file found in a directory or
    glob that no parser reads is ignored; one named outright is an error."""
    files, reports = expand_paths(paths, exclude=run_dir)
    named = {Path(p).resolve() for p in paths if Path(p).is_file()}
    ignored: list[IgnoredFile] = []
    todo: list[tuple[SourceRecord, str]] = []
    keys_seen: dict[str, str] = {}
    for f in files:
        rep = SourceRecord(path=str(f))
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
        key = source_key(rep.sha256, fmt, rank, comm_patterns)
        rep.key = key
        if key in keys_seen:
            rep.error = f"{f}: same content as {keys_seen[key]}; ingested once"
            continue
        keys_seen[key] = str(f)
        cached = cached_record(run_dir, key)
        if cached is not None:
            rep.cached = True
            rep.take_parse(cached)
        else:
            todo.append((rep, fmt))
    return Plan(reports, todo, ignored)
