"""RUN/manifest.json as a typed, versioned `Manifest`, and `SourceRecord`, the one record of a source.

A `SourceRecord` is what the worker that parsed a source returns, what the source's cache entry
(RUN/sources/KEY/source.json) keeps and what the manifest lists for it. The manifest is built and
encoded here only (`Manifest.new`, `manifest_text`), for ingest and for synthetic runs alike; its
version is the table schema's (`schema_version`), with the tracekit version that wrote it.

A run directory is untrusted input (it is copied between machines and edited by hand): a manifest
whose fields have the wrong shape (a list where an object is expected, a number where a path is)
is refused with one error naming the file and the field (`check_manifest`), instead of failing
later with a traceback somewhere that trusted it. Fields not named here are kept and not checked
(newer tracekit versions add some).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from tracekit.results import Result, to_builtins

#: the fields of a `SourceRecord` that describe the input file, not its parse: a cache entry
#: leaves them out (the same content may come back under another name)
FILE_FIELDS = ("path", "size", "sha256", "cached")
#: the fields a parse (or a cache entry) gives a source's record
PARSE_FIELDS = ("read", "stored", "skipped", "dropped", "warnings", "ranks", "events", "collectives", "groups",
                "steps", "ts_min_ns", "ts_max_ns")


class SourceRecord(Result, frozen=False, kw_only=True):
    """One input file of a run: what it is, and what its parse read, stored, skipped and found.

    `parts` (the part files the parse wrote) is in the cache entry and in a synthetic run's
    manifest, not in an ingested run's."""

    path: str | None = None
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
    parts: dict[str, Any] | UnsetType = UNSET

    @property
    def ok(self) -> bool:
        return self.error is None

    def take_parse(self, parsed: SourceRecord) -> None:
        """Take the outcome of a parse (or a cache entry) of this file: its error, or its parser
        version and counts (the file's own fields, its key and its parts stay)."""
        self.error = parsed.error
        if self.error:
            return
        self.parser_version = parsed.parser_version
        for name in PARSE_FIELDS:
            setattr(self, name, getattr(parsed, name))

    def cache_text(self) -> str:
        """The text of this source's cache entry (RUN/sources/KEY/source.json)."""
        doc = {k: v for k, v in to_builtins(self).items() if k not in FILE_FIELDS}
        return json.dumps(doc, sort_keys=True)


class RunWriteFailure(Result, frozen=True, kw_only=True):
    """A parse that could not write the run directory (no space, read-only): the ingest stops and
    commits nothing."""

    key: str
    error: str


class IgnoredFile(Result, frozen=True, kw_only=True):
    """A file found in a directory or glob that no parser reads, and why it was left out."""

    path: str
    reason: str | None = None


class JobEntry(msgspec.Struct, kw_only=True):
    world_size: int | None = None
    ranks: list[int] = []
    sources: list[str] = []
    start_ns: int | None = None
    end_ns: int | None = None


class ValidityEntry(msgspec.Struct, kw_only=True):
    """`validity.RunValidity` as the manifest keeps it (read leniently: hosts of any kind)."""

    world_size: int | None = None
    ranks: list[int] = []
    missing_ranks: list[int] = []
    hosts_unknown: list[Any] = []
    jobs: list[JobEntry] = []
    allow_mixed: bool = False


class IngestOptions(msgspec.Struct, kw_only=True):
    """The ingest options a run's data depends on."""

    rank: int | None = None
    comm_patterns: list[str] | None = None


class Manifest(Result, frozen=False, kw_only=True):
    """RUN/manifest.json. An ingested run has every field; a synthetic run (`synth.write_run`)
    and runs of older versions leave the UNSET ones out."""

    generation: str | UnsetType | None = UNSET
    tracekit_version: str | None = None
    schema_version: str | None = None
    options: IngestOptions | UnsetType | None = UNSET
    sources: list[SourceRecord] = msgspec.field(default_factory=list)
    tables: dict[str, int] = msgspec.field(default_factory=dict)
    ranks: list[int] | UnsetType = UNSET
    warnings: list[str] | UnsetType = UNSET
    ignored: list[IgnoredFile] | UnsetType = UNSET
    validity: ValidityEntry | UnsetType | None = UNSET
    primary_sources: dict[str, list[str]] | UnsetType | None = UNSET

    @property
    def primary(self) -> dict[str, list[str]] | None:
        """Each rank's primary source keys, by rank as text; None for a run that does not record
        them (every ingested source then counts)."""
        return self.primary_sources if isinstance(self.primary_sources, dict) else None

    @classmethod
    def new(cls, sources: list[SourceRecord], tables: dict[str, int], **fields: Any) -> Manifest:
        """A manifest written now: this tracekit's version and the table schema's."""
        from tracekit import __version__, schema

        return cls(tracekit_version=__version__, schema_version=schema.SCHEMA_VERSION, sources=sources,
                   tables=tables, **fields)


# the old names of the reading schema's rows
SourceEntry = SourceRecord
IgnoredEntry = IgnoredFile
OptionsEntry = IngestOptions


def manifest_text(manifest: Manifest | Any) -> str:
    """The manifest's JSON text as a run keeps it (keys sorted, one-space indent); a plain mapping
    (a manifest read back and updated) is written as given."""
    doc = to_builtins(manifest) if isinstance(manifest, Manifest) else manifest
    return json.dumps(doc, indent=1, sort_keys=True, default=json_default)


def json_default(obj: Any) -> Any:
    """What `json.dumps` cannot write itself: numpy scalars, sets (sorted), paths."""
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def check_manifest(doc: Any, path: str | Path) -> Manifest:
    """`doc` (a parsed manifest) as a typed `Manifest`; ValueError naming `path` and the field
    when it does not have the manifest's shape."""
    try:
        return msgspec.convert(doc, Manifest, strict=True)
    except msgspec.ValidationError as exc:
        message = str(exc).replace("`$`", "the top level").replace("at `$.", "at `")
        raise ValueError(f"{path}: malformed manifest ({message}); run `tracekit ingest` again") from None


def read_source_record(doc: Any) -> SourceRecord | None:
    """A cache entry's document as a `SourceRecord`, or None when it does not have the shape."""
    try:
        return msgspec.convert(doc, SourceRecord, strict=True)
    except msgspec.ValidationError:
        return None
