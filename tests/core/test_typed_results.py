"""The converted results encode through `tracekit.results` alone and read back equal."""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from tracekit.finding import SEVERITIES, Finding
from tracekit.results import from_builtins, to_builtins
from tracekit.telemetry.compare import LinkAgreement, TelemetryComparison
from tracekit.validity import Job, RunValidity

ROOT = Path(__file__).resolve().parents[2]
CONVERTED = ["tracekit/finding.py", "tracekit/validity.py", "tracekit/telemetry/compare.py"]

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


@given(st.one_of(findings, validities, links, comparisons))
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
