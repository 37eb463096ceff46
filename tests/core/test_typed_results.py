"""The converted results encode through `tracekit.results` alone and read back equal."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from tracekit.analysis.schedule import ScheduleShape
from tracekit.finding import SEVERITIES, Finding
from tracekit.hang import GroupHang, HangResult, Location, LogMessage, Mismatch, MismatchValue
from tracekit.ingest import IgnoredFile, IngestReport, SourceReport
from tracekit.nccl_fabric import Communicator
from tracekit.replay.calibration import KINDS, WHAT_IF_NOTE, ErrorStats, ReplayErrors, TwoTerms
from tracekit.replay.engine import (
    CalibrationFile,
    CalibrationSummary,
    Convergence,
    Fallback,
    HotLink,
    Identity,
    InstanceReplay,
    Oscillation,
    ReplaySummary,
    TopologySummary,
)
from tracekit.replay.microbench import (
    BenchTable,
    ErrorBand,
    Health,
    LatencyFloor,
    MicrobenchRowSummary,
    MicrobenchSummary,
)
from tracekit.results import dumps, from_builtins, to_builtins
from tracekit.store import SourceCounts
from tracekit.telemetry import FlaggedWindow, LinkSummary, RateCounts, RatesFile
from tracekit.telemetry.compare import LinkAgreement, TelemetryComparison
from tracekit.validity import Job, RunValidity
from tracekit.whatif.core import (
    Change,
    InterHostBytes,
    Placement,
    PlacementChange,
    RankLoad,
    ScenarioResult,
    SkippedScenario,
    Slowdown,
    WhatIfSummary,
)
from tracekit.whatif.experts import ExpertLayout

ROOT = Path(__file__).resolve().parents[2]
CONVERTED = ["tracekit/finding.py", "tracekit/validity.py", "tracekit/telemetry/compare.py", "tracekit/hang.py",
             "tracekit/whatif/experts.py", "tracekit/ingest/__init__.py", "tracekit/ingest/describe.py",
             "tracekit/ingest/merge.py", "tracekit/ingest/parse.py", "tracekit/ingest/plan.py",
             "tracekit/manifest.py", "tracekit/nccl_fabric.py",
             "tracekit/analysis/schedule.py", "tracekit/replay/calibration.py", "tracekit/replay/engine.py",
             "tracekit/replay/microbench.py", "tracekit/whatif/core.py", "tracekit/telemetry/__init__.py",
             "tracekit/store.py", "tracekit/analysis/core.py"]

ints = st.lists(st.integers(0, 64), max_size=5)
opt_int = st.none() | st.integers(0, 2**62)
findings = st.builds(Finding, st.sampled_from(["hang", "stall"]), st.text(max_size=20),
                     severity=st.sampled_from(SEVERITIES), ranks=st.tuples(st.integers(0, 9)),
                     group=st.none() | st.text(max_size=3), step=st.none() | st.integers(0, 9),
                     value=st.none() | st.floats(allow_nan=False),
                     data=st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
jobs = st.builds(Job, world_size=opt_int, ranks=ints, sources=st.lists(st.text(max_size=4), max_size=2),
                 start_ns=opt_int, end_ns=opt_int)
validities = st.builds(RunValidity, world_size=opt_int, ranks=ints, missing_ranks=ints, hosts_unknown=ints,
                       jobs=st.lists(jobs, max_size=2), allow_mixed=st.booleans())
fl = st.floats(0, 1e12)
links = st.builds(LinkAgreement, link=st.text(max_size=5), end=st.none() | st.just("src"), windows=st.integers(0, 9),
                  flagged_windows=st.integers(0, 9), measured_bytes=fl, replayed_bytes=fl,
                  speed_bps=st.none() | fl, worst_window_error=st.none() | fl)
comparisons = st.builds(TelemetryComparison, topology=st.none() | st.text(max_size=5),
                        links=st.lists(links, max_size=3), notes=st.lists(st.text(max_size=5), max_size=2))

rank_seqs = st.dictionaries(st.integers(0, 9), st.integers(0, 99), max_size=3)
word = st.text(max_size=4)
mismatches = st.builds(Mismatch, seq=st.integers(0, 99), field=st.sampled_from(["op", "dtype", "size"]),
                       majority=word, minority_ranks=ints,
                       values=st.lists(st.builds(MismatchValue, value=word, ranks=ints), max_size=2))
group_hangs = st.builds(
    GroupHang, group=word, desc=st.none() | word, ranks=ints, ranks_complete=st.booleans(), last_seq=rank_seqs,
    last_completed_seq=st.dictionaries(st.integers(0, 9), st.none() | st.integers(0, 99), max_size=3),
    last_p2p_seq=rank_seqs, first_divergent_seq=st.none() | st.integers(0, 99), missing_ranks=ints,
    no_dump_ranks=ints, mismatches=st.lists(mismatches, max_size=2),
    status=st.sampled_from(["ok", "hang", "mismatch", "stuck", "dump_skew"]), suspects=ints, verdict=word,
    first_ts_ns=opt_int)
maybe = st.just(msgspec.UNSET)
locations = st.builds(Location, host=maybe | word, local_device=maybe | st.integers(0, 7),
                      pid=maybe | st.integers(0, 9999), bus_id=maybe | word)
log_messages = st.builds(LogMessage, rank=st.integers(0, 9), host=maybe | st.none() | word,
                         ts_ns=maybe | st.none() | st.integers(0, 2**62), level=maybe | st.none() | word,
                         message=maybe | st.none() | word, line=maybe | st.none() | st.integers(0, 999))
hangs = st.builds(HangResult, groups=st.lists(group_hangs, max_size=3), findings=st.lists(findings, max_size=2),
                  source=word, notes=st.lists(word, max_size=2),
                  locations=st.dictionaries(st.integers(0, 9), locations, max_size=2),
                  messages=st.lists(log_messages, max_size=2))

per_dim = st.dictionaries(st.sampled_from(["DP", "EP", "PP"]), st.integers(0, 2**40), max_size=3)
host_names = st.lists(st.text(min_size=1, max_size=3), min_size=1, max_size=3, unique=True)


@st.composite
def placements(draw):
    hosts = draw(host_names)
    slots = draw(st.dictionaries(st.integers(0, 15), st.tuples(st.integers(0, len(hosts) - 1), st.integers(0, 7)),
                                 min_size=1, max_size=4))
    return Placement.of(slots, hosts)


changes = st.builds(Change, fl, fl)
scenarios = st.builds(
    ScenarioResult, scenario=word, kind=st.sampled_from(["eplb", "placement", "scale"]), step_ns=per_dim,
    baseline_step_ns=per_dim, exposed_ns=per_dim, baseline_exposed_ns=per_dim,
    ep_imbalance=st.none() | changes, inter_host_bytes=st.builds(InterHostBytes, before=per_dim, after=per_dim),
    checkpoint_ns=opt_int, simulated_gpus=maybe | st.integers(1, 64), a2a_ns=st.none() | changes,
    ep_load=st.none() | st.lists(st.builds(RankLoad, word, st.tuples(st.integers(0, 9)), st.tuples(st.integers(0)),
                                           st.tuples(st.integers(0))), max_size=2),
    slowed=st.none() | st.lists(st.builds(Slowdown, group=word, seq=st.integers(0, 9), op=word, dim=word,
                                          baseline_ns=st.integers(0), scenario_ns=st.integers(0)), max_size=2),
    placement=st.none() | st.builds(PlacementChange, before=placements(), after=placements()),
    details=st.none() | st.dictionaries(word, st.integers() | word, min_size=1, max_size=2),
    notes=st.lists(word, max_size=2))
layouts = st.builds(ExpertLayout, group=word, policy=st.sampled_from(["global", "hierarchical"]),
                    nodes=st.integers(1, 4), experts_per_rank=st.integers(1, 4),
                    replicas=st.dictionaries(st.integers(0, 31), st.integers(2, 4), max_size=3),
                    experts_on=st.dictionaries(st.integers(0, 15), ints, max_size=3))

counts = st.dictionaries(word, st.integers(0, 99), max_size=2)
source_reports = st.builds(
    SourceReport, path=word, size=opt_int, sha256=st.none() | word, format=st.none() | word, key=st.none() | word,
    cached=st.booleans(), error=st.none() | word, read=st.integers(0), stored=st.integers(0), skipped=counts,
    dropped=counts, warnings=st.lists(word, max_size=2), ranks=ints, events=st.integers(0),
    collectives=st.integers(0), groups=st.integers(0), steps=st.lists(st.none() | st.integers(0, 9), max_size=3),
    ts_min_ns=opt_int, ts_max_ns=opt_int, parser_version=st.none() | word)
ingest_reports = st.builds(
    IngestReport, run_dir=st.builds(Path, st.sampled_from(["run", "/tmp/a b"])),
    sources=st.lists(source_reports, max_size=3), tables=counts, warnings=st.lists(word, max_size=2),
    ignored=st.lists(st.builds(IgnoredFile, path=word, reason=word), max_size=2),
    validity=st.none() | validities)

opt_bool = st.none() | st.booleans()
by_host = st.dictionaries(word, st.lists(word, max_size=2), max_size=2)
communicators = st.builds(
    Communicator, group=word, desc=st.none() | word, size=st.none() | st.integers(1, 64), ranks=ints,
    hosts=st.lists(word, max_size=2), channels=st.none() | st.integers(0, 32),
    transports=st.dictionaries(word, counts, max_size=2), nics_used=by_host, nics_available=by_host,
    network=st.lists(word, max_size=2), pxn=opt_bool, gdr=opt_bool, nvls=st.booleans(), collnet=st.booleans(),
    notes=st.lists(word, max_size=2))
opt_fl = st.none() | fl
link_summaries = st.builds(
    LinkSummary, link=word, host=st.none() | word, device=word, port=word, link_end=st.none() | word,
    windows=st.integers(0, 99), speed_bps=opt_fl, peak_util=opt_fl, mean_util=opt_fl, tx_bytes=fl, rx_bytes=fl,
    flagged_windows=st.integers(0, 9),
    flagged=st.lists(st.builds(FlaggedWindow, st.integers(0), st.integers(0), st.tuples(word)), max_size=2))
shapes = st.builds(ScheduleShape, name=word, stages=st.integers(1, 8), microbatches=st.none() | st.integers(1, 8),
                   chunks=st.none() | st.integers(1, 4))


errors = st.builds(ErrorStats, fl, fl)
by_kind = st.fixed_dictionaries({k: errors for k in KINDS})


@st.composite
def replay_errors(draw):
    calibrated_on = draw(st.none() | word)
    err = ReplayErrors.measured(draw(errors), draw(errors), draw(errors),
                                draw(st.dictionaries(word, by_kind, max_size=2)), draw(word),
                                calibrated_on=calibrated_on)
    return err.inherited() if draw(st.booleans()) else err


oscillations = st.builds(Oscillation, group=word, seq=st.integers(0, 99), op=word, dim=word, start_swing_ns=fl,
                         duration_swing_ns=fl)
convergences = st.builds(Convergence, rounds=st.integers(1, 9), residual_ns=fl, tolerance_ns=fl,
                         converged=st.booleans(), moves_ns=st.lists(fl, max_size=3).map(tuple),
                         cycle=st.integers(0, 4), cycle_from=st.integers(0, 4), n_oscillating=st.integers(0, 9),
                         oscillating=st.lists(oscillations, max_size=2).map(tuple))
opt_word = st.none() | word
instance_replays = st.builds(InstanceReplay, group=word, seq=st.integers(0, 99), op=word, dim=word,
                             traced_ns=st.integers(0, 2**40), replayed_ns=st.integers(0, 2**40), calibration=opt_word,
                             cross_validation=opt_word, fallback=opt_word, algo=opt_word, proto=opt_word,
                             algo_source=opt_word)
hot_links = st.builds(HotLink, link=word, peak_util=fl, mean_util=fl, bytes=st.integers(0, 2**50))
topology_summaries = st.builds(
    TopologySummary, topology=word, step_ns=per_dim, traced_step_ns=per_dim, comm_ns=per_dim, exposed_ns=per_dim,
    instances=st.lists(instance_replays, max_size=2), hot_links=st.lists(hot_links, max_size=2),
    replay_error=st.none() | replay_errors(), convergence=maybe | convergences)
identities = st.builds(Identity, max_step_error=fl, instances_fallen_back=st.integers(0, 9), max_event_error_ns=fl,
                       fallbacks=st.lists(st.builds(Fallback, group=word, seq=st.integers(0, 9), op=word, reason=word,
                                                    ranks=st.tuples(st.integers(0, 9)), text=word),
                                          max_size=2).map(tuple),
                       comm_ns=per_dim, exposed_ns=per_dim)
terms = st.dictionaries(word, st.builds(TwoTerms, fl, fl, st.integers(0, 99), st.integers(0, 9)), max_size=2)
effs = st.dictionaries(word, fl, max_size=2)
calibration_summaries = st.builds(CalibrationSummary, efficiency=effs, terms=terms, split=opt_word,
                                  calibrated_on=opt_word, unseen_buckets=st.dictionaries(word, word, max_size=2))
replay_summaries = st.builds(
    ReplaySummary, topologies=st.lists(word, max_size=2), results=st.lists(topology_summaries, max_size=2),
    identity=st.none() | identities, dependencies=counts, calibration=calibration_summaries,
    findings=st.lists(findings, max_size=2), telemetry=maybe | comparisons)
calibration_files = st.builds(CalibrationFile, run=word, topology=word, efficiency=effs, terms=terms, split=word)
whatif_summaries = st.builds(
    WhatIfSummary, topology=word, comparison=word, replay_error=st.none() | replay_errors(),
    cautions=st.lists(findings, max_size=2), scenarios=st.lists(scenarios, max_size=2),
    skipped=st.lists(st.builds(SkippedScenario, scenario=word, reason=word), max_size=2))
bench_rows = st.builds(
    MicrobenchRowSummary, source=word, table=st.integers(0, 9), test=word, op=word, size_bytes=st.integers(0, 2**40),
    measured_busbw=fl, predicted_busbw=fl, measured_us=fl, predicted_us=fl, algo=word, proto=word,
    channels=st.integers(1, 32), latency_bound=st.booleans(), modelled=st.booleans(), gpu=word)
healths = st.builds(Health, verdict=st.sampled_from(["healthy", "degraded", "unknown"]), measured_over_predicted=opt_fl,
                    measured_busbw=opt_fl, predicted_busbw=opt_fl, sizes=word, rows=st.integers(0, 9))
floors = st.builds(LatencyFloor, measured_us=fl, predicted_us=fl, rows=st.integers(0, 9), high=st.booleans(),
                   net_latency_us=opt_fl)
microbench_summaries = st.builds(
    MicrobenchSummary, topology=word, path=word, rows=st.lists(bench_rows, max_size=2).map(tuple),
    tables=st.lists(st.builds(BenchTable, source=word, table=st.integers(0, 9), test=word, op=word,
                              nranks=st.integers(1, 64), health=healths, latency_floor=st.none() | floors),
                    max_size=2).map(tuple),
    bands=st.lists(st.builds(ErrorBand, source=word, op=word, band=word, rows=st.integers(0, 9), median_abs_error=fl,
                             median_error=fl, worst_error=fl), max_size=2).map(tuple),
    findings=st.lists(findings, max_size=2).map(tuple), profiles=st.lists(word, max_size=2).map(tuple))
source_counts = st.builds(SourceCounts, read=st.integers(0), stored=st.integers(0), skipped=counts,
                          warnings=st.lists(word, max_size=2), dropped=counts)
rate_counts = st.builds(RateCounts, read=st.integers(0), used=st.integers(0), skipped=counts,
                        windows=st.integers(0), flagged=counts, ports=st.integers(0), mapped_ports=st.integers(0))
rates_files = st.builds(RatesFile, stats=rate_counts, warnings=st.lists(word, max_size=2),
                        links=st.lists(link_summaries, max_size=2))


@given(st.one_of(errors, replay_errors(), convergences, instance_replays, hot_links, topology_summaries, identities,
                 calibration_summaries, replay_summaries, calibration_files, whatif_summaries, bench_rows,
                 microbench_summaries, source_counts, rate_counts, rates_files))
def test_replay_results_round_trip(x):
    assert from_builtins(to_builtins(x), type(x)) == x


@given(st.one_of(findings, validities, links, comparisons, mismatches, group_hangs, locations, log_messages, hangs,
                 placements(), scenarios, layouts, source_reports, ingest_reports,
                 st.builds(TwoTerms, fl, fl, st.integers(0, 99), st.integers(0, 9)), communicators, link_summaries,
                 shapes))
def test_round_trip(x):
    assert from_builtins(to_builtins(x), type(x)) == x


def test_finding_json_keys():
    keys = ["kind", "severity", "ranks", "group", "step", "value", "text"]
    assert list(to_builtins(Finding("hang", "t", data={}))) == keys
    assert to_builtins(Finding("hang", "t", data={"a": 1}))["data"] == {"a": 1}


def test_no_hand_written_serializer_returns():
    for rel in CONVERTED:
        text = (ROOT / rel).read_text()
        assert not re.search(r"def (to|from)_(json|dict)\b", text), rel


def test_hang_result_keys_follow_from_its_groups():
    """`last_seq` and `suspects` are the groups' (earliest divergence first), whatever was given."""
    late = GroupHang(group="1", desc=None, ranks=[0, 1], ranks_complete=True, last_seq={1: 4, 0: 3},
                     last_completed_seq={}, first_divergent_seq=4, missing_ranks=[0], no_dump_ranks=[],
                     mismatches=[], status="hang", suspects=[0], verdict="v", first_ts_ns=20)
    early = msgspec.structs.replace(late, group="2", suspects=[1], first_ts_ns=10)
    r = HangResult(groups=[late, early], findings=[], source="flight_recorder", suspects=[7], last_seq={"x": {}})
    assert r.suspects == [1, 0] and r.last_seq == {"1": {0: 3, 1: 4}, "2": {0: 3, 1: 4}}
    doc = to_builtins(r)
    assert list(doc) == ["groups", "findings", "last_seq", "suspects", "source", "notes", "locations", "messages"]
    assert doc["last_seq"]["1"] == {"0": 3, "1": 4}
    assert list(to_builtins(Location(pid=3))) == ["pid"]


def test_placement_is_its_ranks_by_host_name():
    p = Placement.of({5: (1, 0), 2: (0, 1)}, ("a", "b"))
    assert json.loads(dumps(p)) == {"hosts": ["a", "b"], "ranks": {"2": ["a", 1], "5": ["b", 0]}}
    assert p.slots == {2: (0, 1), 5: (1, 0)} and p.ranks_on(1) == [5] and p.gpus_per_host == 2
    bare = ScenarioResult(scenario="s", kind="eplb", step_ns={}, baseline_step_ns={}, exposed_ns={},
                          baseline_exposed_ns={})
    assert "simulated_gpus" not in to_builtins(bare) and to_builtins(bare)["details"] is None


def test_ingest_report_json_names_the_run_and_its_ranks():
    report = IngestReport(run_dir=Path("out"), sources=[SourceReport(path="b", ranks=[3, 1]),
                                                         SourceReport(path="c", ranks=[7], error="bad")])
    doc = to_builtins(report)
    assert list(doc) == ["run", "sources", "ranks", "tables", "warnings", "ignored", "validity"]
    assert doc["run"] == "out" and doc["ranks"] == [1, 3] and not report.committed


def test_replay_errors_keep_the_two_layouts():
    """Measured here: three figures; calibrated on another run: the out-of-sample one alone, and a
    what-if topology's carries the note."""
    e, by_op = ErrorStats(0.1, 0.2), {"a": {k: ErrorStats(0.3, 0.4) for k in KINDS}}
    measured = ReplayErrors.measured(e, e, ErrorStats(0.5, 0.6), by_op, "leave-one-step-out")
    assert list(to_builtins(measured)) == ["uncalibrated", "in_sample", "cross_validated", "by_op", "split", "basis"]
    assert list(to_builtins(measured)["by_op"]["a"]) == list(KINDS) and measured.median == 0.5
    assert measured.calibrated_on is None and measured.kinds == KINDS
    oos = ReplayErrors.measured(e, e, ErrorStats(0.5, 0.6), by_op, "out-of-sample", calibrated_on="r").inherited()
    doc = to_builtins(oos)
    assert list(doc) == ["uncalibrated", "out_of_sample", "by_op", "split", "calibrated_on", "basis", "note"]
    assert list(doc["by_op"]["a"]) == ["uncalibrated", "out_of_sample"] and doc["note"] == WHAT_IF_NOTE
    assert oos.in_sample == oos.cross_validated == oos.quoted == ErrorStats(0.5, 0.6) and oos.calibrated_on == "r"


def test_topology_summary_leaves_out_an_unknown_convergence():
    assert list(to_builtins(TopologySummary(topology="t")))[-1] == "replay_error"
    assert list(to_builtins(ReplaySummary()))[-1] == "findings"


def test_json_keys_are_those_written_before_the_split():
    """The keys, in order, that the hand-written serializers wrote (commit 3257cb9)."""
    row = MicrobenchRowSummary(op="all_reduce", size_bytes=1, measured_busbw=1.0, predicted_busbw=1.0,
                               measured_us=1.0, predicted_us=1.0, algo="ring", proto="Simple", channels=1,
                               latency_bound=True)
    assert list(to_builtins(row)) == ["source", "table", "test", "op", "size_bytes", "measured_busbw",
                                      "predicted_busbw", "measured_us", "predicted_us", "algo", "proto", "channels",
                                      "latency_bound", "modelled", "gpu"]
    assert list(to_builtins(MicrobenchSummary(topology="t", path="p"))) == [
        "topology", "path", "rows", "tables", "bands", "findings", "profiles"]
    assert list(to_builtins(WhatIfSummary(topology="t"))) == [
        "topology", "comparison", "replay_error", "cautions", "scenarios", "skipped"]
    assert list(to_builtins(CalibrationSummary())) == ["efficiency", "terms", "split", "calibrated_on",
                                                       "unseen_buckets"]
    assert list(to_builtins(CalibrationFile(run="r", topology="t", efficiency={}, terms={}, split="s"))) == [
        "run", "topology", "efficiency", "terms", "split", "tracekit_version"]
    assert list(to_builtins(SourceCounts())) == ["read", "stored", "skipped", "warnings", "dropped"]
    assert list(to_builtins(RateCounts())) == ["read", "used", "skipped", "windows", "flagged", "ports",
                                               "mapped_ports"]
    assert list(to_builtins(RatesFile())) == ["stats", "warnings", "links"]


def test_accounting_snapshots_sort_their_reasons():
    from collections import Counter

    from tracekit.store import SourceStats
    from tracekit.telemetry import RateStats

    src = SourceStats(skipped=Counter({"b": 1, "a": 2}), dropped=Counter({"z": 1, "y": 1}))
    assert list(src.counts().skipped) == ["a", "b"] and list(src.counts().dropped) == ["y", "z"]
    rate = RateStats(skipped=Counter({"b": 1, "a": 2}), flagged=Counter({"z": 1, "y": 1}))
    assert list(rate.counts().skipped) == ["a", "b"] and list(rate.counts().flagged) == ["y", "z"]


def test_microbench_summary_is_its_rows_json_and_the_rest():
    from tracekit.replay.microbench import MicrobenchReport, MicrobenchRow

    row = MicrobenchRowSummary(op="all_reduce", size_bytes=1, measured_busbw=1.0, predicted_busbw=1.0,
                               measured_us=1.0, predicted_us=1.0, algo="ring", proto="Simple", channels=1,
                               latency_bound=True)
    report = MicrobenchReport(topology="t", path="p", rows=(MicrobenchRow(row, nranks=8),), tables=(), bands=(),
                              profiles=("h100: 8 GPUs",))
    doc = to_builtins(report.summary)
    assert list(doc["rows"]) == [to_builtins(row)] and list(doc["profiles"]) == ["h100: 8 GPUs"]
    assert "nranks" not in doc["rows"][0]


#: Public functions that return a dict, each a real mapping (a lookup keyed by data, parsed options,
#: keyword arguments, rows or a bundle of named tables), not a result: a result is a Struct or a frozen
#: dataclass (docs/architecture.md). A new dict-returning public function fails
#: `test_no_public_function_returns_a_bare_dict` until it returns a type or is listed here with its reason.
MAPPINGS = {
    "tracekit/_text.py:short_paths": "path -> its shortest distinct name",
    "tracekit/analysis/classify.py:parse_dims": "a --dims spec parsed: dim -> groups",
    "tracekit/analysis/core.py:AnalysisResult.tables": "the result's Arrow tables by name",
    "tracekit/analysis/pp.py:pp_stages": "rank -> PP stage",
    "tracekit/diff/core.py:nics_of": "rank -> the NICs its channels use",
    "tracekit/nccl_fabric.py:rank_maps": "group -> its rank map",
    "tracekit/present.py:instance_places": "instance -> where it ran, in words",
    "tracekit/replay/calibration.py:unseen_buckets": "size bucket -> how cross-validation filled it",
    "tracekit/replay/engine.py:TopologyResult.step_ns": "step -> replayed step time",
    "tracekit/replay/engine.py:TopologyResult.traced_step_ns": "step -> traced step time",
    "tracekit/replay/engine.py:TopologyResult.comm_ns": "dim -> communication time",
    "tracekit/replay/engine.py:TopologyResult.exposed_ns": "dim -> exposed communication time",
    "tracekit/replay/engine.py:SavedCalibration.options": "the replay keyword arguments that apply it",
    "tracekit/replay/hardware.py:profile_defaults": "spec field -> the GPU profile's default (keyword arguments)",
    "tracekit/replay/microbench.py:table_blocks": "nccl-tests table -> its rows",
    "tracekit/synth_nsys.py:nsys_twin": "synthetic tables by name (test data)",
    "tracekit/synth_nsys.py:with_nccl_ranges": "synthetic tables by name (test data)",
    "tracekit/whatif/chunk_flows.py:templates_from": "instance class -> its flow template",
    "tracekit/whatif/core.py:Placement.slots": "rank -> (host, GPU)",
    "tracekit/whatif/core.py:ScenarioResult.inter_host_before": "dim -> bytes",
    "tracekit/whatif/core.py:ScenarioResult.inter_host_after": "dim -> bytes",
    "tracekit/whatif/core.py:inter_host_bytes": "dim -> bytes",
    "tracekit/whatif/core.py:instance_times": "(group, seq) -> replayed instance",
    "tracekit/whatif/core.py:parse_params": "a scenario spec parsed: key -> value",
    "tracekit/whatif/experts.py:expert_tokens": "rank -> the tokens of its experts, in expert order",
    "tracekit/whatif/experts.py:rank_loads": "EP group -> rank -> bytes received",
    "tracekit/whatif/experts.py:read_expert_map": "expert -> rank",
    "tracekit/whatif/storage.py:parse_storage_params": "a storage spec parsed: key -> value",
    "tracekit/whatif/storage.py:step_windows": "step -> (first start, last end)",
    "parsers/_json_keys.py:RepeatedKeys.hook": "a JSON object (json's object_pairs_hook)",
    "parsers/_kineto_calls.py:groups_from_config": "group -> its row of the groups table",
    "parsers/nsys.py:payload": "an NVTX payload's fields by name (those it gives)",
    "parsers/telemetry/ibnetdiscover.py:infer_tiers": "node -> tier",
    "parsers/telemetry/prometheus.py:parse_labels": "a Prometheus label set: label -> value",
    # the prepared-tables bundle (issue 19 names it for a type of its own; every stage takes it as a Mapping)
    "tracekit/analysis/core.py:prepare": "the prepared tables by name",
    "tracekit/whatif/core.py:load_tables": "the prepared tables by name",
    "tracekit/workflows.py:replay_tables": "the prepared tables by name",
    "tracekit/workflows.py:whatif_tables": "the prepared tables by name",
    "tracekit/ingest/plan.py:read_rank_map": "(host, pid, device) -> rank",
    "tracekit/ingest/merge.py:primary_sources": "rank -> the source keys whose rows count",
    "tracekit/ingest/parse.py:event_parts_by_source": "source key -> its event files",
    "tracekit/manifest.py:Manifest.primary": "rank (as text) -> the source keys whose rows count",
    "tracekit/store.py:SourceSink.close": "the part listing for the manifest (a result: issue 19 item 4)",
    "tracekit/store.py:parquet_options": "pyarrow.parquet keyword arguments",
}
_MAPPING_TYPES = {"dict", "Dict", "Mapping", "MutableMapping", "OrderedDict", "defaultdict", "Counter"}


def _returns_mapping(ann: ast.expr | None) -> bool:
    if isinstance(ann, ast.BinOp):  # X | Y
        return _returns_mapping(ann.left) or _returns_mapping(ann.right)
    if isinstance(ann, ast.Subscript):
        if isinstance(ann.value, ast.Name) and ann.value.id == "Optional":
            return _returns_mapping(ann.slice)
        ann = ann.value
    if isinstance(ann, ast.Attribute):
        return ann.attr in _MAPPING_TYPES
    return isinstance(ann, ast.Name) and ann.id in _MAPPING_TYPES


def _own_returns(fn: ast.AST) -> list[ast.Return]:
    out, todo = [], list(ast.iter_child_nodes(fn))
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        if isinstance(node, ast.Return):
            out.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return out


def _builds_dict(node: ast.Return) -> bool:
    v = node.value
    return isinstance(v, (ast.Dict, ast.DictComp)) or (
        isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "dict")


def dict_returning_functions() -> set[str]:
    """"path:name" (methods "path:Class.name") of every public function of a public class or module in
    tracekit/, parsers/ and viz/ whose return annotation is a dict or Mapping, or that, unannotated,
    returns a dict it builds."""
    found = set()
    for top in ("tracekit", "parsers", "viz"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            tree = ast.parse(path.read_text())
            scopes = [("", tree)] + [(f"{c.name}.", c) for c in tree.body
                                    if isinstance(c, ast.ClassDef) and not c.name.startswith("_")]
            for prefix, scope in scopes:
                for fn in scope.body:
                    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or fn.name.startswith("_"):
                        continue
                    if _returns_mapping(fn.returns) or (fn.returns is None and any(
                            _builds_dict(r) for r in _own_returns(fn))):
                        found.add(f"{rel}:{prefix}{fn.name}")
    return found


def test_no_public_function_returns_a_bare_dict():
    found = dict_returning_functions()
    new = sorted(found - set(MAPPINGS))
    assert not new, ("public functions return a dict: return a Struct or a frozen dataclass, or list a real "
                     "mapping in MAPPINGS with its reason", new)
    assert not set(MAPPINGS) - found, ("stale MAPPINGS entries", sorted(set(MAPPINGS) - found))


def test_the_dict_finder_sees_every_shape():
    """A test that cannot fail is a defect: the finder itself, on the shapes a result-dict takes."""
    src = ("def a() -> dict[str, int]: ...\ndef b() -> 'x' | None: ...\ndef c() -> Mapping[str, int] | None: ...\n"
           "def d():\n    return {1: 2}\ndef e():\n    def inner():\n        return {}\n    return 1\n"
           "def f() -> Optional[Dict[str, Any]]: ...\ndef g() -> list[dict]: ...\ndef h():\n    return dict(a=1)\n")
    tree = ast.parse(src)
    got = {fn.name for fn in tree.body if _returns_mapping(fn.returns)
           or (fn.returns is None and any(_builds_dict(r) for r in _own_returns(fn)))}
    assert got == {"a", "c", "d", "f", "h"}
