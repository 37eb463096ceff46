"""The typed schema of RUN/manifest.json, checked on every read.

A run directory is untrusted input (it is copied between machines and edited by hand): a manifest
whose fields have the wrong shape (a list where an object is expected, a number where a path is)
is refused with one error naming the file and the field, instead of failing later with a
traceback somewhere that trusted it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec


class _Entry(msgspec.Struct, kw_only=True):
    """Fields not named here are kept and not checked (newer tracekit versions add some)."""


class SourceEntry(_Entry):
    path: str | None = None
    size: int | None = None
    sha256: str | None = None
    format: str | None = None
    key: str | None = None
    cached: bool = False
    error: str | None = None
    read: int = 0
    stored: int = 0
    skipped: dict[str, int] = {}
    dropped: dict[str, int] = {}
    warnings: list[str] = []
    ranks: list[int] = []
    events: int = 0
    collectives: int = 0
    groups: int = 0
    steps: list[int | None] = []
    ts_min_ns: int | None = None
    ts_max_ns: int | None = None
    parser_version: str | None = None


class IgnoredEntry(_Entry):
    path: str
    reason: str | None = None


class JobEntry(_Entry):
    world_size: int | None = None
    ranks: list[int] = []
    sources: list[str] = []
    start_ns: int | None = None
    end_ns: int | None = None


class ValidityEntry(_Entry):
    world_size: int | None = None
    ranks: list[int] = []
    missing_ranks: list[int] = []
    hosts_unknown: list[Any] = []
    jobs: list[JobEntry] = []
    allow_mixed: bool = False


class OptionsEntry(_Entry):
    rank: int | None = None
    comm_patterns: list[str] | None = None


class Manifest(_Entry):
    generation: str | None = None
    tracekit_version: str | None = None
    schema_version: str | None = None
    options: OptionsEntry | None = None
    sources: list[SourceEntry] = []
    tables: dict[str, int] = {}
    ranks: list[int] = []
    warnings: list[str] = []
    ignored: list[IgnoredEntry] = []
    validity: ValidityEntry | None = None
    primary_sources: dict[str, list[str]] | None = None


def check_manifest(doc: Any, path: str | Path) -> Manifest:
    """`doc` (a parsed manifest) as a typed `Manifest`; ValueError naming `path` and the field
    when it does not have the manifest's shape."""
    try:
        return msgspec.convert(doc, Manifest, strict=True)
    except msgspec.ValidationError as exc:
        message = str(exc).replace("`$`", "the top level").replace("at `$.", "at `")
        raise ValueError(f"{path}: malformed manifest ({message}); run `tracekit ingest` again") from None
