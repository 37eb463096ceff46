import json

from click.testing import CliRunner

from tracekit.cli import main
from tracekit.synth import make_run_tables, write_run


def test_topology_summary():
    result = CliRunner().invoke(main, ["topology", "dgx-h100-superpod"])
    assert result.exit_code == 0, result.output
    assert "GPUs          256 (32 hosts x 8, NVLink domain 8)" in result.output
    assert "leaf-spine" in result.output and "bisection     51.2 Tb/s" in result.output
    assert "oversubscription leaf 1:1" in result.output


def test_topology_json_and_hosts():
    result = CliRunner().invoke(main, ["topology", "fat-tree:gpus=1,leaf_radix=8", "--hosts", "16", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["gpus"] == 16


def test_topology_bad_field_exits_1():
    result = CliRunner().invoke(main, ["topology", "rail-optimized:oversub=0.5"])
    assert result.exit_code == 1
    assert "'oversub'" in result.output and "Traceback" not in result.output


def test_replay_run_dir(tmp_path):
    tables, truth = make_run_tables(steps=1)
    run = write_run(tables, tmp_path / "run", truth=truth)
    result = CliRunner().invoke(main, ["replay", str(run.path), "--topology", "rail-optimized:gpus=4",
                                       "--topology", "rail-optimized:gpus=4,nic_gbps=100"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("baseline rail-optimized:gpus=4: replay error per instance median")
    assert "(cross-validated, leave-one-instance-out); in sample median" in lines[0]
    assert "uncalibrated median" in lines[0]
    assert lines[1].startswith("identity (traced durations replayed): max step error 0.00e+00, 0 instance(s)")
    assert lines[2].split()[:2] == ["topology", "step"]
    assert "(+0.0%)" in lines[3]
    assert "note: a what-if topology has no error of its own" in result.output
    assert "dependency edges per rule" not in result.output
    assert (tmp_path / "run" / "results" / "replay.json").is_file()
    result = CliRunner().invoke(main, ["replay", str(run.path), "--topology", "rail-optimized:gpus=4", "--json",
                                       "--no-write"])
    doc = json.loads(result.output)
    assert doc["topologies"] == ["rail-optimized:gpus=4"]
    assert set(doc["results"][0]["replay_error"]) >= {"uncalibrated", "in_sample", "cross_validated", "by_op"}
    assert doc["identity"]["instances_fallen_back"] == 0
    result = CliRunner().invoke(main, ["replay", str(run.path), "--topology", "rail-optimized:gpus=4", "--verbose",
                                       "--no-write"])
    assert result.exit_code == 0, result.output
    edges = next(line for line in result.output.splitlines() if line.startswith("dependency edges per rule: "))
    assert edges.split(": ", 1)[1].split(", ")[0].startswith("stream ")
    assert "replay error per op (median / p90): uncalibrated | in sample | cross-validated" in result.output


def test_replay_needs_a_topology(tmp_path):
    result = CliRunner().invoke(main, ["replay", str(tmp_path)])
    assert result.exit_code == 2


def test_raw_path_that_ingests_nothing_names_the_problem(tmp_path):
    from click.testing import CliRunner

    from tracekit.cli import main

    bad = tmp_path / "notes.json"
    bad.write_text('{"x": 1}')
    result = CliRunner().invoke(main, ["replay", str(bad), "--topology", "single-switch",
                                       "--cache", str(tmp_path / "cache")])
    assert result.exit_code == 1
    assert "nothing ingested" in result.output and "unknown format" in result.output
    assert "Traceback" not in result.output
