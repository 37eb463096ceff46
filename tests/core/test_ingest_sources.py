"""Several sources for one rank: the best format describes it, the others are set aside."""

from pathlib import Path

import pytest

from tracekit import Run
from tracekit.ingest import ingest

SAMPLE = Path(__file__).parents[2] / "sample_traces" / "gloo_moe_8rank"


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    out = tmp_path_factory.mktemp("mixed") / "run"
    return ingest([SAMPLE], out), Run(out)


def test_kineto_wins_over_flight_recorder(mixed):
    report, run = mixed
    formats = sorted({s.format for s in report.ingested})
    assert formats == ["flight_recorder", "kineto"]
    kineto = [s for s in report.ingested if s.format == "kineto"]
    coll = run.table("collectives")
    assert coll.num_rows == sum(s.collectives for s in kineto)
    assert set(coll.column("source").to_pylist()) == {"kineto"}
    assert run.table("ranks").num_rows == 8
    assert run.events().num_rows == sum(s.events for s in kineto)
    assert any("set aside" in w for w in report.warnings)


def test_flight_recorder_alone_keeps_one_snapshot_per_rank(tmp_path):
    report = ingest([SAMPLE / "fr"], tmp_path / "fr")
    run = Run(tmp_path / "fr")
    per_rank = run.table("collectives").group_by("rank").aggregate([("coll_id", "count")])
    one_dump = next(s for s in report.ingested if s.ranks == [0])
    assert set(per_rank.column("coll_id_count").to_pylist()) == {one_dump.collectives}
    assert run.table("ranks").num_rows == 8


def test_stray_files_in_directories_are_ignored_not_errors(mixed):
    report, run = mixed
    assert [Path(i.path).name for i in report.ignored] == ["truth.json"]
    assert not report.failed
    assert run.manifest.ignored[0].path.endswith("truth.json")


def test_directory_without_supported_files_says_so(tmp_path):
    from click.testing import CliRunner

    from tracekit.cli import main

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "notes.md").write_text("# not a trace")
    (tmp_path / "in" / "counters.csv").write_text("a,b\n1,2\n")
    result = CliRunner().invoke(main, ["ingest", str(tmp_path / "in"), "-o", str(tmp_path / "run")])
    assert result.exit_code == 1
    assert "2 file(s) found, none in a supported format" in result.output
    assert "Traceback" not in result.output
