"""The front door: one function per command, over a `Run`.

`open` gives the run (a run directory as is, raw traces ingested into the cache); `analyze`,
`replay`, `hang`, `whatif`, `report` and `export` run a stage on it. This is the only module that
crosses stages (ingest -> analysis -> replay -> telemetry -> report) and the only writer of
RUN/results/: the stages are functions from tables to typed results and write nothing there.
See docs/architecture.md.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import pyarrow as pa

from tracekit import schema
from tracekit._progress import status
from tracekit.results import to_builtins
from tracekit.store import Run

if TYPE_CHECKING:
    from tracekit.analysis import AnalysisResult, Prepared
    from tracekit.analysis.classify import Overrides
    from tracekit.diff import RunDiff
    from tracekit.executors import Executor
    from tracekit.export import ExportSummary
    from tracekit.hang import HangResult
    from tracekit.ingest import IngestReport
    from tracekit.replay.engine import ReplayResult, SavedCalibration
    from tracekit.replay.microbench import MicrobenchReport
    from tracekit.replay.topology import TopologySpec
    from tracekit.runinfo import RunInfo
    from tracekit.telemetry.compare import TelemetryComparison
    from tracekit.viz.report import ReportData, ReportInfo
    from tracekit.whatif import ExpertLoads, Scenario, WhatIfResult

RunSource = Run | str | os.PathLike[str]
Paths = Sequence[str | os.PathLike[str]]

__all__ = ["Calibrated", "Opened", "analyze", "calibration", "diff", "export", "hang", "info", "nccl_tests",
           "open", "opened", "prepared", "replay", "report", "whatif", "whatif_tables"]


@dataclass(frozen=True)
class Opened:
    """A run, and the ingest that made it when the paths were raw traces (None: a run directory)."""

    run: Run
    ingest: IngestReport | None

    @property
    def ingested(self) -> bool:
        return self.ingest is not None


def opened(paths: Paths, *, cache: str | os.PathLike[str] | None = None, rank: int | None = None) -> Opened:
    """A run directory as is, or raw trace paths ingested into `cache` (default: this user's cache
    directory for these paths, `tracekit.ingest.cache_dir`; unchanged sources are cache hits). The
    one temporary-directory policy of every command."""
    from tracekit.ingest import open_run

    run, report = open_run(list(paths), cache=cache, rank=rank)
    return Opened(run, report)


def open(paths: Paths | RunSource, *, cache: str | os.PathLike[str] | None = None) -> Run:
    """The `Run` for a run directory, a `Run`, or raw trace paths (see `opened`)."""
    if isinstance(paths, Run):
        return paths
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    return opened(paths, cache=cache).run


def _run(source: RunSource) -> Run:
    """A `Run` as is; a path opened (a run directory, or raw traces ingested into the cache)."""
    return open(source)


# ------------------------------------------------------------------------------------------
# analyze


def analyze(source: RunSource, *, dims: str | Overrides | None = None, top: int = 10,
            compute: str | Sequence[str] = "auto", write: bool = True,
            executor: str | Executor | None = None, partitioned: bool = True,
            prepared_run: Prepared | None = None) -> AnalysisResult:
    """`tracekit.analysis.analyze` on a run (a `Run`, a run directory or raw traces), with the hang
    verdict `tracekit hang` gives on the same run attached (its findings lead the analysis'); with
    `write`, the prepared tables and results/analysis.json are stored in it. `prepared_run` is the
    run's preparation when a replay already made it (`prepared`)."""
    from tracekit.analysis import analyze as analyse_run
    from tracekit.hang import hang_from_run

    run = _run(source)
    with run.results_together("analyze's tables and results/analysis.json"):
        result = analyse_run(run, dims=dims, top=top, compute=compute, write=write, executor=executor,
                             partitioned=partitioned, hang=hang_from_run(run), prepared_run=prepared_run)
        if write:
            run.write_json("analysis", to_builtins(result.document()))
    return result


# ------------------------------------------------------------------------------------------
# replay


def prepared(source: RunSource, *, write: bool = False) -> Prepared:
    """A run matched, aligned and classified (with `write`, the prepared tables stored back), for
    `replay` and `analyze` to share (`tracekit.analysis.prepared`)."""
    from tracekit.analysis import prepared as prepare_run

    status("matching collectives, aligning clocks")
    return prepare_run(_run(source), write=write)


def replay_tables(run: Run, *, write: bool = False, prepared_run: Prepared | None = None) -> dict[str, pa.Table]:
    """A run's tables prepared for the replay (matched, aligned, classified, unless `prepared_run`
    is given; with `write`, the prepared tables stored back), with the fabric tables it reads."""
    if prepared_run is None:
        prepared_run = prepared(run, write=write)
    elif write:
        prepared_run.store(run)
    tables = dict(prepared_run.tables)
    for name in ("channels", "topology_nodes", "topology_links"):
        if name not in tables and run.has(name):
            tables[name] = run.table(name)
    return tables


def replay(source: RunSource, topologies: Sequence[str | TopologySpec], *,
           baseline: str | TopologySpec | None = None, write: bool = True,
           calibration: Calibrated | None = None, prepared_run: Prepared | None = None,
           **options: Any) -> ReplayResult:
    """Prepare a run (match, align, classify; `prepared_run` when `prepared` already did), replay it
    (`tracekit.replay.replay`; `calibration` another run's, from `calibration`), and with `write`
    store results/replay.json, results/calibration.json, the replayed timelines and the replayed
    link samples next to any telemetry. The run's validity (missing ranks, unknown hosts, mixed
    jobs) comes first among the result's cautions; a run with telemetry gets the measured-vs-replayed
    comparison."""
    from tracekit.replay import engine
    from tracekit.validity import replay_cautions, run_validity

    run = _run(source)
    if calibration is not None:
        options = {**options, **calibration.saved.options()}
    with run.results_together("replay's tables and results"):
        result = engine.replay(replay_tables(run, write=write, prepared_run=prepared_run), topologies,
                               baseline=baseline, **options)
        result.findings[:0] = replay_cautions(run_validity(run))
        if write:
            from tracekit.export import REPLAY_TIMELINES, replay_timelines

            run.write_json("replay", to_builtins(result.summary))
            fitted = engine.calibration_document(result, str(run.path))
            if fitted is not None:
                run.write_json("calibration", to_builtins(fitted))
            run.write_result_table(REPLAY_TIMELINES, replay_timelines(result))
            run.write_table("link_samples", engine.with_replayed(run.table("link_samples"), result))
        if run.has("counters") and result.results:
            from tracekit.telemetry.compare import compare_links

            if write:
                result.telemetry = compare_links(run.table("link_samples"), topology=result.baseline)
                run.write_json("links", to_builtins(result.telemetry))
            else:
                merged = pa.concat_tables([schema.conform("link_samples", run.table("link_samples")),
                                           result.link_samples()], promote_options="permissive")
                result.telemetry = compare_links(merged, topology=result.baseline)
    return result


@dataclass(frozen=True)
class Calibrated:
    """Another run's calibration, and what to say when it was fitted on another network than the
    baseline it is applied to."""

    saved: SavedCalibration
    note: str | None


def calibration(source: str | os.PathLike[str], topologies: Sequence[str | TopologySpec], *,
                baseline: str | TopologySpec | None = None, algo: str = "auto") -> Calibrated:
    """The calibration of another run, for a replay on `topologies` (and `baseline`, default the
    first): a JSON file written by `tracekit replay` (`RUN/results/calibration.json`, or a
    `replay.json`), or a run directory / trace paths, replayed on the baseline to fit it (nothing
    is written to that run; trace paths are ingested into the cache like any others)."""
    from tracekit.replay.engine import baseline_of, fitted_calibration, read_calibration

    base = baseline_of(topologies, baseline)
    path = Path(source)
    if path.is_file() and path.suffix == ".json":
        saved = read_calibration(path)
    else:
        saved = fitted_calibration(replay(open(source), [base], write=False, algo=algo), str(source))
    return Calibrated(saved, saved.mismatch(base))


def nccl_tests(path: str | os.PathLike[str], topology: str, *, cache: str | os.PathLike[str] | None = None,
               algo: str = "auto") -> MicrobenchReport:
    """An nccl-tests output file, or a folder of them (or a run holding its `microbench` table),
    ingested like any trace and replayed on `topology` (`tracekit.replay.microbench`)."""
    from tracekit.errors import InputError
    from tracekit.replay.microbench import nccl_tests_report

    run = open(path, cache=cache)
    if not run.has("microbench"):
        raise InputError(path, "no nccl-tests rows were read (the run has no microbench table)")
    return nccl_tests_report(run.table("microbench"), topology, path=path, algo=algo)


# ------------------------------------------------------------------------------------------
# info


def info(source: RunSource) -> RunInfo:
    """What the run holds (`tracekit.runinfo.describe`), with its telemetry section when it has counters."""
    from tracekit.runinfo import describe
    from tracekit.telemetry import describe as describe_telemetry

    run = _run(source)
    found = describe(run)
    telemetry = describe_telemetry(run)
    return found if telemetry is None else msgspec.structs.replace(found, telemetry=telemetry)


# ------------------------------------------------------------------------------------------
# hang


def hang(paths: Paths | RunSource, *, out: str | os.PathLike[str] | None = None, rank: int | None = None,
         write: bool = True) -> HangResult:
    """`tracekit.hang.find_hangs` on a run directory, or on raw dumps/traces ingested first (into
    `out`, else the cache every command uses), saved as results/hang.json unless `write` is false.
    Sources that fail to ingest are listed in `notes`; nothing ingested at all is a TracekitError."""
    from collections import Counter

    from tracekit.hang import hang_from_run

    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    got = Opened(paths, None) if isinstance(paths, Run) else opened(paths, cache=out, rank=rank)
    result = hang_from_run(got.run)
    if write:
        got.run.write_json("hang", to_builtins(result))
    report = got.ingest
    if report is not None:
        notes = [s.error for s in report.failed if s.error]
        kinds = Counter(s.format for s in report.ingested)
        notes.insert(0, "ingested " + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
                     + (f" source{'s' if len(report.ingested) > 1 else ''}"))
        # hang reads every dump itself (`Run.source_table`), so ingest's "set aside" notice does not apply
        notes += [w for w in report.warnings if not w.startswith("ranks covered by several sources")]
        result = msgspec.structs.replace(result, notes=notes)
    return result


# ------------------------------------------------------------------------------------------
# what-if, report, export


def whatif_tables(run: Run) -> dict[str, pa.Table]:
    """A run's tables prepared for the what-ifs (matched, aligned, classified, not stored), with
    its channels and link samples."""
    from tracekit.analysis import prepare

    tables = dict(prepare(run, write=False))
    for name in ("channels", "link_samples"):
        if name not in tables and run.has(name):
            tables[name] = run.table(name)
    return tables


def whatif(source: RunSource, scenarios: Sequence[Scenario | str], *, topology: str | None = None,
           expert_loads: ExpertLoads | None = None, **replay_options: Any) -> WhatIfResult:
    """`tracekit.whatif.whatif` on a run's prepared tables (`whatif_tables`)."""
    from tracekit.whatif import whatif as run_whatif
    from tracekit.whatif.core import DEFAULT_TOPOLOGY

    return run_whatif(whatif_tables(_run(source)), scenarios, topology=topology or DEFAULT_TOPOLOGY,
                      expert_loads=expert_loads, **replay_options)


def report(source: RunSource, out: str | os.PathLike[str], *, analysis: AnalysisResult | None = None,
           replay: ReplayResult | None = None, hang: HangResult | None = None, whatif: WhatIfResult | None = None,
           cdn: bool = False, **options: Any) -> ReportInfo:
    """Write the standalone HTML report of a run (`tracekit.viz.report`): the analysis (computed,
    not stored, when not given), the replay and the telemetry comparison stored in the run when
    not given, and the hang verdict the analysis carries (`tracekit hang`'s on the run when it
    carries none)."""
    from tracekit.viz.report import write_report

    run = _run(source)
    analysis, replay, hang, links = _report_inputs(run, analysis, replay, hang)
    return write_report(run, out, analysis=analysis, replay=replay, hang=hang, whatif=whatif, links=links,
                        cdn=cdn, **options)


def report_data(source: RunSource, *, analysis: AnalysisResult | None = None, replay: ReplayResult | None = None,
                hang: HangResult | None = None, **options: Any) -> ReportData:
    """`tracekit.viz.report.build_report_data` with the inputs `report` gathers."""
    from tracekit.viz.report import build_report_data

    run = _run(source)
    analysis, replay, hang, links = _report_inputs(run, analysis, replay, hang)
    return build_report_data(run, analysis=analysis, replay=replay, hang=hang, links=links, **options)


def _report_inputs(run: Run, analysis: AnalysisResult | None, replay: ReplayResult | None, hang: HangResult | None
                   ) -> tuple[AnalysisResult, ReplayResult | None, HangResult | None, TelemetryComparison | None]:
    from tracekit.analysis import analyze as analyse_run
    from tracekit.hang import hang_from_run
    from tracekit.replay.engine import ReplayResult
    from tracekit.telemetry.compare import load_comparison

    if analysis is None:
        analysis = analyse_run(run, write=False, hang=hang_from_run(run))
    if hang is None:
        hang = analysis.hang if analysis.hang is not None else hang_from_run(run)
    if replay is None:
        replay = ReplayResult.load(run)
    links = replay.telemetry if replay is not None and replay.telemetry is not None else load_comparison(run)
    return analysis, replay, hang, links


def diff(a: Any, b: Any, *, topology: str | None = None) -> RunDiff:
    """`tracekit.diff.diff_runs` of run B against run A, each a run directory or raw traces (opened
    here, in the cache), a `Run`, tables or an `AnalysisResult`; the runs are named by the paths
    given."""
    from tracekit.diff import diff_runs
    from tracekit.diff.core import source_name
    from tracekit.errors import TracekitError

    def source(x: Any) -> Any:
        if not isinstance(x, (str, os.PathLike)):
            return x
        if not os.path.exists(x):
            raise TracekitError(f"{os.fspath(x)}: no such run directory or trace")
        return open(x)

    return diff_runs(source(a), source(b), topology=topology, names=(source_name(a), source_name(b)))


def export(source: RunSource, out: str | os.PathLike[str], *, replay: ReplayResult | None = None,
           flows: bool = True, stalls: bool = True, include_replay: bool = True) -> ExportSummary:
    """Write a run as one Chrome-trace JSON on the aligned clock (`tracekit.export`): the ranks'
    clock offsets and the collectives' instances as stored by `analyze`, else from `prepare`."""
    from tracekit.export import export_chrome

    run = _run(source)
    ranks, coll = _aligned(run)
    return export_chrome(run, out, ranks=ranks, collectives=coll, replay=replay, flows=flows, stalls=stalls,
                         include_replay=include_replay)


def _aligned(run: Run) -> tuple[pa.Table, pa.Table]:
    """Ranks with clock offsets and collectives with instances: the stored tables when `analyze`
    (or a written replay) prepared them, else `prepare`'s, not stored."""
    ranks, coll = schema.conform("ranks", run.table("ranks")), schema.conform("collectives", run.table("collectives"))
    instance = coll.column("instance") if "instance" in coll.column_names else None
    offset = ranks.column("clock_offset_ns") if "clock_offset_ns" in ranks.column_names else None
    prepared = (coll.num_rows == 0 or (instance is not None and instance.null_count < coll.num_rows)) and (
        ranks.num_rows <= 1 or (offset is not None and offset.null_count == 0))
    if prepared:
        return ranks, coll
    from tracekit.analysis import prepare

    t = prepare(run, write=False)
    return t["ranks"], t["collectives"]
