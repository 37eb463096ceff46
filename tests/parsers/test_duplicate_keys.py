"""Duplicate keys in JSON inputs are read, or counted with a reason, never dropped unseen:
a Kineto trace with two `traceEvents` arrays, a Flight Recorder JSON dump with two `entries`
(issue 22). read = stored + skipped holds for both."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from kineto_helpers import parse_into

from tracekit.parsers import flight_recorder
from tracekit.store import SourceSink

SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "gloo_moe_8rank"


def _split_events(doc: dict, cut: int) -> str:
    """The trace's JSON text with `traceEvents` written as two arrays under the same key."""
    events = doc.pop("traceEvents")
    head = json.dumps(doc)[:-1]
    return (f'{head}, "traceEvents": {json.dumps(events[:cut])}, "distributedInfo": '
            f'{json.dumps(doc["distributedInfo"])}, "traceEvents": {json.dumps(events[cut:])}}}')


def _rows(table) -> list:
    cols = ["name", "ts_ns", "dur_ns", "lane", "kind"]
    return sorted(zip(*(table.column(c).to_pylist() for c in cols), strict=True), key=repr)


def test_kineto_two_trace_event_arrays_are_both_read(tmp_path: Path) -> None:
    raw = gzip.decompress((SAMPLE / "rank0.node0.pt.trace.json.gz").read_bytes())
    whole_path = tmp_path / "rank0.json"
    whole_path.write_bytes(raw)
    whole = parse_into(whole_path, tmp_path / "a")
    doc = json.loads(raw)
    cut = len(doc["traceEvents"]) // 3
    split_path = tmp_path / "split" / "rank0.json"
    split_path.parent.mkdir()
    split_path.write_text(_split_events(doc, cut))
    split = parse_into(split_path, tmp_path / "b")
    st = split.result.stats
    assert st.read == whole.result.stats.read and st.read == st.stored + sum(st.skipped.values())
    assert _rows(split.events) == _rows(whole.events)
    assert split.collectives.num_rows == whole.collectives.num_rows
    warned = " ".join(st.warnings)
    assert "2 traceEvents arrays" in warned and "'distributedInfo'" in warned


def _fr_doc() -> dict:
    doc = json.loads((SAMPLE / "fr" / "json" / "rank_0.json").read_text())
    assert len(doc["entries"]) >= 4
    return doc


def test_flight_recorder_two_entries_arrays_are_both_read(tmp_path: Path) -> None:
    doc = _fr_doc()
    entries = doc.pop("entries")
    doc["rank"] = doc.get("rank", 0)
    cut = len(entries) // 2
    whole = tmp_path / "rank_0.json"
    whole.write_text(json.dumps({**doc, "entries": entries}))
    split = tmp_path / "split" / "rank_0.json"
    split.parent.mkdir()
    split.write_text(f'{json.dumps(doc)[:-1]}, "entries": {json.dumps(entries[:cut])}, '
                     f'"version": {json.dumps(doc.get("version", "2.4"))}, "entries": {json.dumps(entries[cut:])}}}')
    a = flight_recorder.parse(whole, SourceSink(tmp_path / "ra", "k")).stats
    b = flight_recorder.parse(split, SourceSink(tmp_path / "rb", "k")).stats
    assert b.read == a.read == len(entries) and b.read == b.stored + sum(b.skipped.values())
    assert b.stored == a.stored
    warned = " ".join(b.warnings)
    assert "2 entries arrays" in warned and "'version'" in warned


def test_flight_recorder_duplicate_keys_inside_an_entry_are_warned(tmp_path: Path) -> None:
    entry = ('{"record_id": 0, "pg_id": 0, "process_group": ["0", "default_pg"], "collective_seq_id": 1, '
             '"p2p_seq_id": 0, "op_id": 1, "profiling_name": "nccl:all_reduce", "profiling_name": "nccl:broadcast", '
             '"time_created_ns": 1000, "input_sizes": [[4]], "input_dtypes": ["Float"], "output_sizes": [[4]], '
             '"output_dtypes": ["Float"], "state": "completed", "time_discovered_started_ns": 1100, '
             '"time_discovered_completed_ns": 1200, "retired": true, "timeout_ms": 600000, "is_p2p": false}')
    path = tmp_path / "rank_0.json"
    path.write_text('{"version": "2.4", "pg_config": {}, "entries": [' + entry + "]}")
    st = flight_recorder.parse(path, SourceSink(tmp_path / "run", "k")).stats
    assert st.read == 1 == st.stored + sum(st.skipped.values())
    assert any("1 object with keys given more than once" in w and "profiling_name" in w for w in st.warnings)
