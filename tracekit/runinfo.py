"""What a run directory holds, as `tracekit info` shows it: ranks, hosts, devices, groups, steps,
time span, formats, per-source counts, NCCL's fabric, validity and the telemetry section.

A stage over a `Run` (read through the store's public API) that returns a typed `RunInfo`; the
front door (`workflows.info`) calls it and the CLI prints it.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.compute as pc
from msgspec import UNSET, UnsetType

from tracekit._limits import checked_int
from tracekit.errors import TracekitError
from tracekit.finding import Finding
from tracekit.microbench import MicrobenchRun, microbench_runs
from tracekit.nccl_fabric import Communicator, communicators, nccl_warnings
from tracekit.results import Result, to_builtins
from tracekit.store import Run
from tracekit.telemetry import TelemetryInfo
from tracekit.validity import RunValidity, run_validity

#: How `analyze` found a run's steps (`steps.step_windows`), in words.
STEP_SOURCES = {"annotation": "ProfilerStep annotations", "events.step": "the events' step numbers",
                "cadence": "the cadence of a repeated collective", "whole": "the whole trace (no step marks)"}


class MicrobenchInfo(Result):
    """One nccl-tests table of the run: what `MicrobenchRun` says, with the number of sizes for the sizes."""

    source: str
    table: int
    test: str | None
    op: str | None
    dtype: str | None
    redop: str | None
    nranks: int | None
    hosts: int | None
    ranks_per_host: int | None
    host_names: list[str]
    devices: list[str]
    peak_busbw_gbps: float | None
    peak_size_bytes: int | None
    peak_side: str | None
    sizes: int

    @classmethod
    def of(cls, bench: MicrobenchRun) -> MicrobenchInfo:
        fields = {f: getattr(bench, f) for f in cls.__struct_fields__ if f != "sizes"}
        return cls(**fields, sizes=len(bench.sizes))


class AnalyzedSteps(Result):
    """The steps the stored analysis (results/analysis.json) found, and what it found them from (in words)."""

    steps: list[int]
    found_from: list[str] = msgspec.field(name="from")


class Span(Result):
    """The traced time span of the run's primary sources."""

    start_ns: int | None
    end_ns: int | None
    duration_s: float | None


class GroupInfo(Result):
    """One process group (a `groups` row) and how many collectives it holds; the facts NCCL's logs
    add to the row are UNSET (left out) when no source gave them."""

    group: str
    desc: str | None
    backend: str | None
    ranks: list[int]
    size: int | None
    dims: list[str]
    ranks_complete: bool | None
    rank_map: list[int | None] | UnsetType | None = UNSET
    world: bool | UnsetType | None = UNSET
    n_nodes: int | UnsetType | None = UNSET
    local_ranks: int | UnsetType | None = UNSET
    pxn: bool | UnsetType | None = UNSET
    gdr: bool | UnsetType | None = UNSET
    nvls: bool | UnsetType | None = UNSET
    collnet: bool | UnsetType | None = UNSET
    n_channels: int | UnsetType | None = UNSET
    p2p_channels: int | UnsetType | None = UNSET
    ring_orders: list[list[int]] | UnsetType | None = UNSET
    collectives: int = 0


class SourceInfo(Result):
    """One ingested source as the manifest records it (None: a field an older manifest lacks)."""

    path: str | None
    format: str | None
    ranks: list[int] | None
    read: int | None
    stored: int | None
    skipped: dict[str, int] | None
    warnings: list[str] | None
    error: str | None
    cached: bool | None


class ValidityInfo(RunValidity, frozen=False, kw_only=True):
    """The run's validity with the findings it gives."""

    found: list[Finding] = msgspec.field(default_factory=list, name="findings")

    @classmethod
    def of(cls, validity: RunValidity) -> ValidityInfo:
        fields = {f: getattr(validity, f) for f in RunValidity.__struct_fields__}
        return cls(**fields, found=validity.findings())


class RunInfo(Result):
    """Everything `tracekit info` shows of a run; `telemetry` is left out when the run has no counters."""

    run: str
    tracekit_version: str | None
    schema_version: str | None
    ranks: list[int]
    ranks_from: str | None
    world_sizes: list[int]
    hosts: list[str]
    devices: list[str]
    microbench: list[MicrobenchInfo]
    formats: dict[str, int]
    steps: list[int]
    analyzed_steps: AnalyzedSteps | None
    span: Span
    tables: dict[str, int]
    groups: list[GroupInfo]
    communicators: list[Communicator]
    nccl_warnings: list[Finding]
    sources: list[SourceInfo]
    warnings: list[str]
    validity: ValidityInfo
    telemetry: TelemetryInfo | UnsetType = UNSET


def describe(run: Run) -> RunInfo:
    """The run's `RunInfo`, without its telemetry section (the front door adds it)."""
    m = run.manifest_doc  # as stored: a field an older manifest lacks is None here, not its default
    ranks = run.table("ranks").to_pylist()
    groups = run.table("groups").to_pylist()
    sources = m.get("sources", [])
    ok = [s for s in sources if not s.get("error")]
    primary = {k for keys in (m.get("primary_sources") or {}).values() for k in keys}
    timed = [s for s in ok if not primary or s.get("key") in primary]
    starts = [s["ts_min_ns"] for s in timed if s.get("ts_min_ns") is not None]
    ends = [s["ts_max_ns"] for s in timed if s.get("ts_max_ns") is not None]
    formats: dict[str, int] = {}
    for s in ok:
        formats[s["format"]] = formats.get(s["format"], 0) + 1
    bench = microbench_runs(run.table("microbench")) if run.has("microbench") else []
    rank_ids = sorted({r["rank"] for r in ranks})
    hosts = sorted({r["host"] for r in ranks if r["host"]})
    devices = sorted({r["device_name"] for r in ranks if r["device_name"]})
    ranks_from = "traces" if rank_ids else None
    if not rank_ids and bench:
        # an nccl-tests run: its header names every rank, its host and its device
        # a rank count out of range (a received run's table) names no ranks: the list is sized by it
        rank_ids = list(range(max((checked_int(b.nranks, "world_size") or 0 for b in bench), default=0)))
        hosts = sorted({h for b in bench for h in b.host_names})
        devices = sorted({d for b in bench for d in b.devices})
        ranks_from = "nccl-tests header"
    per_group = _collectives_per_group(run.table("collectives"))
    return RunInfo(
        run=str(run.path),
        tracekit_version=m.get("tracekit_version"),
        schema_version=m.get("schema_version"),
        ranks=rank_ids,
        ranks_from=ranks_from,
        world_sizes=sorted({r["world_size"] for r in ranks if r["world_size"] is not None}),
        hosts=hosts,
        devices=devices,
        microbench=[MicrobenchInfo.of(b) for b in bench],
        formats=formats,
        steps=sorted({st for s in ok for st in s.get("steps", [])}),
        analyzed_steps=_analyzed_steps(run),
        span=Span(start_ns=min(starts) if starts else None, end_ns=max(ends) if ends else None,
                  duration_s=(max(ends) - min(starts)) / 1e9 if starts and ends else None),
        tables=m.get("tables", {}),
        groups=[_group(run, g, per_group.get(g["group"], 0)) for g in groups],
        communicators=communicators(run.table("groups"), run.table("channels"), run.table("ranks")),
        nccl_warnings=nccl_warnings(run.table("log_messages")),
        sources=[SourceInfo(**{f: s.get(f) for f in SourceInfo.__struct_fields__}) for s in sources],
        warnings=m.get("warnings", []),
        validity=ValidityInfo.of(run_validity(run)),
    )


def _group(run: Run, row: dict[str, Any], collectives: int) -> GroupInfo:
    unknown = set(row) - set(GroupInfo.__struct_fields__)
    if unknown:
        raise TracekitError(f"{run.path}: the groups table has columns this tracekit does not know "
                            f"({', '.join(sorted(unknown))}); run `tracekit ingest` again")
    return GroupInfo(**{**row, "dims": list(row["dims"] or []), "ranks": list(row["ranks"] or [])},
                     collectives=collectives)


def _collectives_per_group(coll: pa.Table) -> dict[str, int]:
    if not coll.num_rows:
        return {}
    counts = pc.value_counts(coll.column("group").cast(pa.string())).to_pylist()
    return {c["values"]: c["counts"] for c in counts if c["values"] is not None}


def _analyzed_steps(run: Run) -> AnalyzedSteps | None:
    """The steps the stored analysis found, and from what; None before `analyze`."""
    doc = run.read_json("analysis")
    if not isinstance(doc, dict) or not isinstance(doc.get("summary"), dict):
        return None
    summary = doc["summary"]
    return AnalyzedSteps(steps=list(summary.get("steps") or []),
                         found_from=[STEP_SOURCES.get(s, s) for s in summary.get("step_sources") or []])


def info_json(info: RunInfo) -> str:
    """The text of `tracekit info --json` (keys sorted, as it has always printed them)."""
    import json

    return json.dumps(to_builtins(info), indent=1, sort_keys=True)
