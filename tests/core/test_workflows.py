"""The front door (`tracekit.workflows`): it stores what the stages return, and they store nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tracekit import workflows
from tracekit.analysis import analyze
from tracekit.hang import hang_from_run
from tracekit.ingest import cache_dir
from tracekit.results import dumps
from tracekit.synth import make_run_tables, write_run


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    tables, truth = make_run_tables(hosts=1, gpus_per_host=4, pp=2, ep=2, steps=1)
    return write_run(tables, tmp_path_factory.mktemp("wf") / "run", truth=truth).path


def _results(run: Path) -> set[str]:
    return {p.name for p in (run / "results").iterdir()} - {"GENERATION"} if (run / "results").is_dir() else set()


def test_the_stages_store_no_results_and_the_front_door_does(small_run):
    analyze(small_run)
    hang_from_run(small_run)
    assert _results(small_run) == set()
    result = workflows.analyze(small_run)
    hang = workflows.hang(small_run)
    assert _results(small_run) == {"analysis.json", "hang.json"}
    stored = json.loads((small_run / "results" / "analysis.json").read_text())
    assert stored == json.loads(result.dumps())
    assert json.loads((small_run / "results" / "hang.json").read_text()) == json.loads(dumps(hang, sort_keys=True))


def test_no_write_stores_nothing(small_run, tmp_path):
    import shutil

    run = tmp_path / "copy"
    shutil.copytree(small_run, run)
    shutil.rmtree(run / "results", ignore_errors=True)
    workflows.analyze(run, write=False)
    workflows.hang(run, write=False)
    assert _results(run) == set()


def test_raw_dumps_given_a_rank_get_their_own_cache_run(tmp_path):
    paths = [str(tmp_path / "dump.pickle")]
    assert cache_dir(paths) != cache_dir(paths, rank=3)
    assert cache_dir(paths, rank=3).name == cache_dir(paths).name + "-rank3"


def test_open_gives_a_run_directory_as_is(small_run):
    got = workflows.opened([small_run])
    assert got.run.path == Path(small_run) and not got.ingested
    assert workflows.open(got.run) is got.run


def test_another_runs_calibration_says_when_it_was_fitted_on_another_network(tmp_path):
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps({"run": "job41", "topology": "fat-tree", "efficiency": {"all_reduce": 0.8}}))
    other = workflows.calibration(path, ["rail-optimized", "fat-tree"])
    assert other.note == "the calibration was fitted on fat-tree, applied to baseline rail-optimized"
    assert other.saved.options() == {"efficiency": {"all_reduce": 0.8}, "terms": {}, "calibrated_on": "job41"}
    assert workflows.calibration(path, ["rail-optimized"], baseline="fat-tree").note is None


def test_a_report_given_the_analysis_and_replay_computes_neither_again(small_run, tmp_path, monkeypatch):
    """`report(run, out, analysis=, replay=)` draws what it was given: no second `analyze` (it
    prepared and analysed the run again, a fifth of the README's main job report) and no stored
    replay read back."""
    import tracekit.analysis
    from tracekit.replay.engine import ReplayResult

    prep = workflows.prepared(small_run)
    analysis = workflows.analyze(small_run, write=False, prepared_run=prep)
    replay = workflows.replay(small_run, ["rail-optimized:gpus=4"], write=False, prepared_run=prep)

    def refused(*args, **kwargs):
        raise AssertionError("the report computed what it was given")

    monkeypatch.setattr(tracekit.analysis, "analyze", refused)
    monkeypatch.setattr(ReplayResult, "load", refused)
    info = workflows.report(small_run, tmp_path / "r.html", analysis=analysis, replay=replay)
    assert "Replay" in info.tabs and info.path.stat().st_size > 0
