"""Describing an ingest: its report (`IngestReport`, what `tracekit ingest --json` prints), the
run's generation, the manifest it commits, and whether the committed run already is that."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import msgspec

from tracekit import schema
from tracekit.ingest.merge import primary_sources
from tracekit.manifest import IgnoredFile, IngestOptions, Manifest, SourceRecord, ValidityEntry, check_manifest
from tracekit.results import Result, from_builtins, to_builtins
from tracekit.validity import RunValidity

#: the record of one input file (its old name: a source's report)
SourceReport = SourceRecord


class IngestReport(Result, frozen=False, kw_only=True, dict=True):
    """The outcome of one `ingest` call: one SourceReport per input file, plus run warnings; its
    JSON is what `tracekit ingest --json` prints (the run directory as `run`).

    `ranks` (the ranks of the ingested sources) follows from `sources`: `__post_init__` sets it
    when the report is made, whatever was given. `committed`, whether a new manifest was written
    (False when nothing could be ingested), is not part of the JSON."""

    run_dir: Path = msgspec.field(name="run")
    sources: list[SourceRecord]
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
    def ingested(self) -> list[SourceRecord]:
        return [s for s in self.sources if s.ok]

    @property
    def failed(self) -> list[SourceRecord]:
        return [s for s in self.sources if not s.ok]


ProgressFn = Callable[[SourceReport, int, int], None]


def generation(report: IngestReport, options: Mapping[str, Any]) -> str:
    """What the run's data is made of (its sources' keys, the options, the schema): results of
    one generation are valid for exactly the run that has it."""
    keys = sorted(s.key for s in report.sources if s.ok and s.key)
    text = json.dumps({"keys": keys, "options": options, "schema": schema.SCHEMA_VERSION}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def ingest_options(rank: int | None, comm_patterns: Sequence[str] | None) -> IngestOptions:
    return IngestOptions(rank=rank, comm_patterns=list(comm_patterns) if comm_patterns else None)


def build_manifest(report: IngestReport, *, rank: int | None, comm_patterns: Sequence[str] | None) -> Manifest:
    """The manifest an ingest commits: its sources, tables, ranks, warnings, the files it left
    out, the run's validity and each rank's primary sources."""
    options = ingest_options(rank, comm_patterns)
    validity = (msgspec.convert(to_builtins(report.validity), ValidityEntry)
                if report.validity is not None else None)
    primary = primary_sources([s for s in report.sources if s.ok and s.key])
    return Manifest.new(
        report.sources, report.tables, generation=generation(report, to_builtins(options)), options=options,
        ranks=report.ranks, warnings=report.warnings, ignored=report.ignored, validity=validity,
        primary_sources={str(r): keys for r, keys in sorted(primary.items())})


def unchanged(run_dir: Path, report: IngestReport, *, rank: int | None,
              comm_patterns: Sequence[str] | None) -> bool:
    """Whether the committed run is what this ingest would commit: the same sources (every one a
    cache hit, as they were when it was committed), files ignored, options, schema and tracekit
    version, of one job, with its tables in place. `report` then takes the committed tables,
    warnings and validity, and the run is neither merged, checked nor committed again (a warm
    `tracekit replay` re-opens its cache)."""
    from tracekit import __version__
    from tracekit.store import MANIFEST, Run

    path = run_dir / MANIFEST
    try:
        committed = check_manifest(json.loads(path.read_text()), path)
    except (OSError, ValueError):
        return False
    options = ingest_options(rank, comm_patterns)
    validity = committed.validity
    if (committed.sources != report.sources or committed.ignored != report.ignored or committed.options != options
            or committed.schema_version != schema.SCHEMA_VERSION or committed.tracekit_version != __version__
            or committed.generation != generation(report, to_builtins(options))
            or not isinstance(validity, ValidityEntry) or len(validity.jobs) > 1):
        return False
    run = Run(run_dir)
    if not all(run.has(name) for name, rows in committed.tables.items() if rows):
        return False
    report.tables = dict(committed.tables)
    report.warnings = list(committed.warnings or [])
    report.validity = from_builtins(to_builtins(validity), RunValidity)
    return True
