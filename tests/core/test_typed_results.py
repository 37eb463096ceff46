"""The converted results encode through `tracekit.results` alone and read back equal."""

from __future__ import annotations

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
from tracekit.replay.calibration import TwoTerms
from tracekit.results import dumps, from_builtins, to_builtins
from tracekit.telemetry import FlaggedWindow, LinkSummary
from tracekit.telemetry.compare import LinkAgreement, TelemetryComparison
from tracekit.validity import Job, RunValidity
from tracekit.whatif.core import (
    Change,
    InterHostBytes,
    Placement,
    PlacementChange,
    RankLoad,
    ScenarioResult,
    Slowdown,
)
from tracekit.whatif.experts import ExpertLayout

ROOT = Path(__file__).resolve().parents[2]
CONVERTED = ["tracekit/finding.py", "tracekit/validity.py", "tracekit/telemetry/compare.py", "tracekit/hang.py",
             "tracekit/whatif/experts.py", "tracekit/ingest.py", "tracekit/nccl_fabric.py",
             "tracekit/analysis/schedule.py"]
#: modules with types left to convert (issue 19): no serializer but the named classes'
PARTLY = {"tracekit/whatif/core.py": {"WhatIfResult"}, "tracekit/replay/calibration.py": {"ErrorStats", "ReplayErrors"},
          "tracekit/telemetry/__init__.py": {"RateStats"}}

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
    for rel, left in PARTLY.items():
        classes = re.split(r"^class ", (ROOT / rel).read_text(), flags=re.M)[1:]
        found = [c.split("(")[0].split(":")[0] for c in classes if re.search(r"def (to|from)_(json|dict)\b", c)]
        assert set(found) <= left, (rel, found)


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
