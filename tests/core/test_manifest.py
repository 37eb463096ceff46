"""The manifest is one typed `Manifest` of `SourceRecord`s: built in one place for ingest and synth,
encoded to the bytes runs have always held, and read back with the same types."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

import tracekit
from tracekit.ingest import IgnoredFile, IngestReport, SourceReport, ingest
from tracekit.ingest.describe import build_manifest
from tracekit.ingest.plan import cached_record
from tracekit.manifest import (
    FILE_FIELDS,
    PARSE_FIELDS,
    JobEntry,
    Manifest,
    SourceRecord,
    ValidityEntry,
    check_manifest,
    manifest_text,
    read_source_record,
)
from tracekit.results import to_builtins
from tracekit.store import Run
from tracekit.synth import make_run_tables, write_run
from tracekit.validity import Job, RunValidity

HERE = Path(__file__).resolve().parent
SAMPLE = HERE.parents[1] / "sample_traces" / "synth_moe_16rank"


def _report() -> IngestReport:
    sources = [SourceReport(path="/t/b.json", size=10, sha256="ab", format="kineto", key="k2", read=5, stored=4,
                            skipped={"z": 1}, ranks=[1], events=4, collectives=2, groups=1, steps=[0, 1],
                            ts_min_ns=5, ts_max_ns=9, parser_version="3", warnings=["w"]),
               SourceReport(path="/t/a.log", format="nccl_log", key="k1", read=3, stored=3, ranks=[0, 1],
                            collectives=3, dropped={"b": 1, "a": 2}, parser_version="2"),
               SourceReport(path="/t/c.bin", error="/t/c.bin: unknown format")]
    report = IngestReport(run_dir=Path("/r"), sources=sources, tables={"ranks": 2, "collectives": 5, "events": 4},
                          warnings=["two"], ignored=[IgnoredFile(path="/t/x.txt", reason="unknown format")])
    report.validity = RunValidity(world_size=2, ranks=[0, 1],
                                  jobs=[Job(world_size=2, ranks=[0, 1], sources=["k1", "k2"], start_ns=5)])
    return report


def test_the_manifest_of_a_report_is_the_text_runs_always_held():
    """The golden text is what the dict-built manifest of a900117 gave for the same report."""
    text = manifest_text(build_manifest(_report(), rank=None, comm_patterns=["nccl:*"]))
    golden = (HERE / "golden" / "manifest_of_a_report.json").read_text().rstrip("\n")
    assert text.replace(tracekit.__version__, "<version>") == golden


def test_a_manifest_reads_back_as_the_manifest_written():
    written = build_manifest(_report(), rank=3, comm_patterns=None)
    read = check_manifest(json.loads(manifest_text(written)), "m.json")
    assert read == written and read.sources[0].parts is msgspec.UNSET
    assert read.primary == {"0": ["k1"], "1": ["k2"]}


def test_one_record_per_source_and_validity_kept_whole():
    assert SourceReport is SourceRecord
    kept = set(ValidityEntry.__struct_fields__)
    assert set(RunValidity.__struct_fields__) <= kept
    assert set(Job.__struct_fields__) <= set(JobEntry.__struct_fields__)
    msgspec.convert(to_builtins(SourceReport(path="a.json", size=3)), SourceRecord, strict=True)


def test_a_cache_entry_leaves_out_the_file_and_reads_back():
    record = SourceRecord(path="/t/a", size=3, sha256="x", cached=True, key="k", format="kineto", read=2,
                          stored=2, parts={"events": {"0": "events/rank=0/k.parquet"}})
    doc = json.loads(record.cache_text())
    assert not set(FILE_FIELDS) & set(doc) and doc["parts"] == record.parts and doc["error"] is None
    again = read_source_record(doc)
    assert again is not None and again.parts == record.parts and again.path is None
    older = {k: v for k, v in doc.items() if k not in ("dropped", "parser_version")}  # written by an older version
    assert read_source_record(older) == SourceRecord(**{**older, "parts": record.parts})
    assert read_source_record({**doc, "read": "many"}) is None


def test_a_malformed_cache_entry_is_parsed_again(tmp_path):
    out = tmp_path / "run"
    first = ingest([SAMPLE], out, jobs=1)
    key = first.ingested[0].key or ""
    entry = out / "sources" / key / "source.json"
    assert cached_record(out, key) is not None
    for text in ("[1, 2]", entry.read_text().replace('"read": ', '"read": "x", "_": ')):
        entry.write_text(text)
        assert cached_record(out, key) is None
    again = ingest([SAMPLE], out, jobs=1)
    assert [s.cached for s in again.sources if s.key == key] == [False]
    assert to_builtins(Run(out).manifest.sources) == to_builtins(again.sources)


def test_a_synthetic_run_has_the_short_manifest(tmp_path):
    tables, _ = make_run_tables()
    run = write_run(tables, tmp_path / "w")
    doc = json.loads((tmp_path / "w" / "manifest.json").read_text())
    assert sorted(doc) == ["schema_version", "sources", "tables", "tracekit_version"]
    assert sorted(doc["sources"][0]) == sorted([*SourceRecord.__struct_fields__])
    assert run.manifest.primary is None and run.manifest.generation is msgspec.UNSET
    assert run.generation.startswith("legacy-")


@pytest.mark.parametrize(("doc", "field"), [({"sources": [{"path": 3}]}, "`sources[0].path`"),
                                            ({"sources": [{"parts": []}]}, "`sources[0].parts`"),
                                            ({"validity": {"jobs": {}}}, "`validity.jobs`"),
                                            ({"ignored": [{"reason": "x"}]}, "`ignored[0]`")])
def test_a_malformed_manifest_is_refused_naming_the_field(doc, field):
    with pytest.raises(ValueError, match=r"m\.json: malformed manifest") as refused:
        check_manifest(doc, "m.json")
    assert field in str(refused.value)
    assert isinstance(check_manifest({}, "m.json"), Manifest)


def test_a_report_takes_every_counted_field_of_its_parse_and_of_its_cache_entry(tmp_path):
    out = tmp_path / "run"
    cold, warm = ingest([SAMPLE], out, jobs=1), ingest([SAMPLE], out, jobs=1)
    assert any(s.steps for s in cold.sources) and any(s.skipped for s in cold.sources)
    for before, after in zip(cold.sources, warm.sources, strict=True):
        entry = json.loads((out / "sources" / (before.key or "") / "source.json").read_text())
        for name in (*PARSE_FIELDS, "parser_version"):
            assert getattr(before, name) == getattr(after, name) == entry[name], name
        assert not before.cached and after.cached
