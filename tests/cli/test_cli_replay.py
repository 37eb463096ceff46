import json

import numpy as np
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
    cv = doc["results"][0]["convergence"]
    assert cv["converged"] and cv["rounds"] >= 1
    line = next(x for x in result.output.splitlines() if x.startswith("fixed point on rail-optimized:gpus=4: "))
    assert f"last start move {cv['residual_ns'] / 1e3:.1f} µs" in line and not line.endswith("not settled")


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


def test_calibration_from_another_run_is_out_of_sample(tmp_path):
    """Calibrate on the bundled sample (healthy network), score a run `tracekit synth` made with
    another seed and a slow NIC on rank 5: the error is reported out of sample, with the sample's
    efficiencies, and it points at the slow NIC (the collectives of rank 5's groups are far off,
    the others on target), where a fit on the run itself absorbs the slowdown into its efficiency."""
    from pathlib import Path

    from tracekit.ingest import ingest
    from tracekit.store import Run

    sample = tmp_path / "sample"
    ingest([Path(__file__).parents[2] / "sample_traces" / "synth_moe_16rank"], sample)
    topo = "rail-optimized:nic_gbps=400"
    assert CliRunner().invoke(main, ["replay", str(sample), "--topology", topo]).exit_code == 0
    saved = json.loads((sample / "results" / "calibration.json").read_text())
    assert saved["topology"] == topo and saved["run"] == str(sample)
    held = tmp_path / "heldout"
    result = CliRunner().invoke(main, ["synth", "-o", str(held), "--hosts", "4", "--gpus", "4", "--pp", "2", "--ep",
                                       "8", "--steps", "3", "--seed", "7", "--slow-nic", "5"])
    assert result.exit_code == 0, result.output

    def run(*extra):
        result = CliRunner().invoke(main, ["replay", str(held), "--topology", topo, "--no-write", *extra])
        assert result.exit_code == 0, result.output
        return result.output

    own = json.loads(run("--json"))
    doc = json.loads(run("--json", "--calibration-from", str(sample)))
    err = doc["results"][0]["replay_error"]
    assert list(err) == ["uncalibrated", "out_of_sample", "by_op", "split", "calibrated_on", "basis"]
    assert err["calibrated_on"] == str(sample) and err["split"] == "out-of-sample"
    assert doc["calibration"]["efficiency"] == saved["efficiency"] != own["calibration"]["efficiency"]
    assert err["uncalibrated"] == own["results"][0]["replay_error"]["uncalibrated"]  # same physics
    # the saved file gives the same figures as re-fitting the run
    again = json.loads(run("--json", "--calibration-from", str(sample / "results" / "calibration.json")))
    assert again["results"][0]["replay_error"]["out_of_sample"] == err["out_of_sample"]
    members = {g["group"]: g["ranks"] for g in Run(held).table("groups").to_pylist()}

    def off(d, slow):
        return np.median([abs(i["replayed_ns"] - i["traced_ns"]) / i["traced_ns"] for i in d["results"][0]["instances"]
                          if i["op"] == "all_reduce" and (5 in members[i["group"]]) == slow])

    assert off(doc, slow=True) > 0.5 and off(doc, slow=False) < 0.01
    assert off(own, slow=False) > 0.2  # the self-fit's efficiency is pulled up by the slow group
    text = run("--calibration-from", str(sample), "--verbose")
    first = text.splitlines()[0]
    assert f"(out of sample: calibrated on {sample}); uncalibrated median" in first and "in sample" not in first
    assert f"calibration (from {sample}, traced / modelled): all_reduce:2^26 x" in text
    assert "replay error per op (median / p90): uncalibrated | out of sample" in text


def test_out_of_sample_errors_round_trip():
    from tracekit.replay.calibration import ErrorStats, ReplayErrors
    from tracekit.results import from_builtins, to_builtins

    s = ErrorStats(0.1, 0.3)
    err = ReplayErrors.measured(ErrorStats(0.2, 0.4), s, s, {"all_reduce": {"uncalibrated": s, "in_sample": s,
                                                                            "cross_validated": s}},
                                "out-of-sample", calibrated_on="runs/healthy")
    doc = to_builtins(err)
    assert list(doc) == ["uncalibrated", "out_of_sample", "by_op", "split", "calibrated_on", "basis"]
    assert doc["out_of_sample"] == {"median": 0.1, "p90": 0.3} and list(doc["by_op"]["all_reduce"]) == [
        "uncalibrated", "out_of_sample"]
    back = from_builtins(json.loads(json.dumps(doc)), ReplayErrors)
    assert to_builtins(back) == doc and (back.median, back.p90, back.calibrated_on) == (0.1, 0.3, "runs/healthy")
    assert back.in_sample == back.cross_validated == s and back.kinds == ("uncalibrated", "out_of_sample")



def test_report_says_out_of_sample():
    from bokeh.models import Div

    from tracekit.replay import replay
    from tracekit.viz.data import replay_data
    from tracekit.viz.figures import replay_figures

    tables, _ = make_run_tables(steps=2)
    res = replay(tables, ["rail-optimized:gpus=4"], efficiency={"all_reduce:2^26": 0.8}, calibrated_on="runs/healthy")
    texts = [d.text for d in replay_figures(replay_data(res)).select({"type": Div})]
    assert any("out of sample: calibrated on runs/healthy" in t for t in texts)
    res = replay(tables, ["rail-optimized:gpus=4"])
    assert any("cross-validated" in t for t in (d.text for d in replay_figures(replay_data(res)).select({"type": Div})))


def test_replay_report_prepares_the_run_once(tmp_path, monkeypatch):
    """`replay --report` matches and aligns the run once: the report's analysis goes on from the
    replay's preparation (regression: the report ran `analyze` again, preparing the run a second
    time, 0.1-0.3 s of the README's main job)."""
    import tracekit.analysis.core as core
    import tracekit.analysis.partitioned as by_partition

    preparations = []
    eager, partitioned = core._prepared, by_partition.prepared
    monkeypatch.setattr(core, "_prepared", lambda *a, **k: preparations.append("eager") or eager(*a, **k))
    monkeypatch.setattr(by_partition, "prepared",
                        lambda *a, **k: preparations.append("partitioned") or partitioned(*a, **k))
    tables, truth = make_run_tables(steps=1)
    run = write_run(tables, tmp_path / "run", truth=truth)
    out = tmp_path / "report.html"
    result = CliRunner().invoke(main, ["replay", str(run.path), "--topology", "rail-optimized:gpus=4",
                                       "--report", str(out)])
    assert result.exit_code == 0, result.output
    assert preparations == ["eager"]
    assert f"report: {out}" in result.output and "Replayed on rail-optimized:gpus=4" in out.read_text()
