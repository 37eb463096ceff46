import json

import polars as pl
import pytest
from analysis_helpers import strip_derived
from click.testing import CliRunner

from tracekit.analysis import AnalysisResult, analyze, prepare, prepared
from tracekit.cli import main
from tracekit.errors import TracekitError
from tracekit.store import Run
from tracekit.synth import SynthSpec, make_run_tables, write_run

JSON_KEYS = {"schema", "summary", "clock_offsets_ns", "alignment_residual_ns", "alignment", "dims",
             "per_rank_step", "stalls", "stragglers", "ep", "pp_bubbles", "bandwidth", "mismatches", "findings"}


@pytest.fixture(scope="module")
def result(synth_wide) -> AnalysisResult:
    tables, _ = synth_wide
    return analyze(tables)


def test_straggler_is_found_with_its_step(result, synth_wide):
    _, truth = synth_wide
    top = pl.from_arrow(result.stragglers).row(0, named=True)
    assert top["rank"] == truth["straggler"]["rank"]
    assert top["steps"][0] == truth["straggler"]["step"]
    # the others wait for the straggler's delay minus the slack they usually had at that point
    assert 0.75 * truth["straggler"]["delay_ns"] <= top["excess_ns"] <= 1.05 * truth["straggler"]["delay_ns"]
    straggler = next(f for f in result.findings if f.kind == "straggler")
    assert straggler.text.startswith(f"rank {truth['straggler']['rank']} was last in ")
    assert f"(mostly step {truth['straggler']['step']})" in straggler.text
    assert straggler.ranks == (truth["straggler"]["rank"],) and straggler.severity == "warning"


def test_root_cause_of_the_longest_wait_is_the_straggler(result, synth_wide):
    """The worst wait names a pipeline peer; its chain of waits ends at the injected straggler."""
    _, truth = synth_wide
    first = result.findings[0]
    assert first.kind == "root_cause" and first.data["root_rank"] == truth["straggler"]["rank"]
    assert first.step == truth["straggler"]["step"]
    assert 0.75 * truth["straggler"]["delay_ns"] <= first.value <= 1.25 * truth["straggler"]["delay_ns"]
    inst = pl.from_arrow(result.instances)
    worst = inst.sort("max_wait_ns", descending=True).row(0, named=True)
    assert worst["waited_on"] == worst["last_rank"] and worst["root_rank"] == truth["straggler"]["rank"]
    assert worst["chain_ranks"][0] == worst["last_rank"] and worst["chain_ranks"][-1] == worst["root_rank"]


def test_ep_hot_ranks_match_truth(result, synth_wide):
    _, truth = synth_wide
    got = {g["group"]: g for g in json.loads(result.dumps())["ep"]}
    assert set(got) == set(truth["ep_hot"])
    for group, want in truth["ep_hot"].items():
        assert got[group]["hot_rank"] == want["hot_rank"]
        assert got[group]["ranks"] == want["ranks"]


def test_json_layout(result):
    doc = json.loads(result.dumps())
    assert set(doc) >= JSON_KEYS
    json.dumps(doc)
    row = doc["per_rank_step"][0]
    assert {"rank", "step", "compute_ns", "comm_ns", "exposed_ns", "overlap_ns", "overlap", "idle_ns"} <= set(row)
    for dim, comm in row["comm_ns"].items():
        assert row["exposed_ns"][dim] + row["overlap_ns"][dim] == comm
    assert {"group", "seq", "op", "dim", "step", "last_rank", "max_wait_ns"} <= set(doc["stalls"][0])
    assert {"rank", "times_last", "delay_ns", "steps"} <= set(doc["stragglers"][0])
    assert {"group", "ranks", "hot_rank", "hot_share", "imbalance", "inter_host_share"} <= set(doc["ep"][0])
    assert {"rank", "stage", "step", "idle_ns", "recv_wait_ns", "bubble_ns"} <= set(doc["pp_bubbles"][0])
    assert len(doc["stalls"]) <= result.top
    stages = {b["rank"]: b["stage"] for b in doc["pp_bubbles"]}
    assert stages[0] == 0 and stages[15] == 3


def test_prepare_fills_what_replay_needs(synth_small):
    tables, _ = synth_small
    out = prepare(tables)
    assert set(out) == {"ranks", "groups", "collectives", "events", "step_times", "step_windows"}
    c = pl.from_arrow(out["collectives"])
    assert c["instance"].null_count() == 0 and c["dim"].null_count() == 0 and c["step"].null_count() == 0
    assert pl.from_arrow(out["ranks"])["clock_offset_ns"].null_count() == 0


def test_instances_match_the_generators(synth_small):
    tables, _ = synth_small
    ours = pl.from_arrow(prepare(tables)["collectives"]).select("coll_id", "instance")
    theirs = pl.from_arrow(make_run_tables(SynthSpec(hosts=2, gpus_per_host=4, pp=2, ep=2, steps=3,
                                                     clock_skew_ns=2_000_000, seed=3))[0]["collectives"])
    joined = theirs.select("coll_id", pl.col("instance").alias("truth")).join(ours, on="coll_id")
    assert joined.group_by("truth").agg(pl.col("instance").n_unique())["instance"].max() == 1
    assert joined.group_by("instance").agg(pl.col("truth").n_unique())["truth"].max() == 1


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    tables, truth = make_run_tables(SynthSpec(steps=2, seed=5))
    out = tmp_path_factory.mktemp("run")
    write_run(strip_derived(tables), out, truth=truth)
    return out


def test_analyze_writes_back_into_the_run(run_dir):
    from tracekit import workflows

    workflows.analyze(run_dir)
    run = Run(run_dir)
    assert json.loads((run_dir / "results" / "analysis.json").read_text())["schema"] == "tracekit.analysis/1"
    dims = pl.from_arrow(run.table("groups"))["dims"].to_list()
    assert all(d for d in dims)
    assert pl.from_arrow(run.table("collectives"))["instance"].null_count() == 0


def test_cli_summary_and_json(run_dir):
    runner = CliRunner()
    res = runner.invoke(main, ["analyze", str(run_dir), "--no-write", "--top", "3"])
    assert res.exit_code == 0, res.output
    assert res.output.startswith("Findings\n  - ")
    assert "rank 1 was last in " in res.output and "Stalls by root cause" in res.output
    assert "Stragglers" in res.output and "clock alignment:" in res.output
    res = runner.invoke(main, ["analyze", str(run_dir), "--json", "--no-write"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert set(doc) >= JSON_KEYS and doc["stragglers"][0]["rank"] == 1
    for f in doc["findings"]:
        assert {"kind", "severity", "ranks", "group", "step", "value", "text"} <= set(f)
    for s in doc["stalls"]:
        assert s["waited_on"] == s["last_rank"] and s["root_rank"] is not None


def test_analysis_from_a_preparation_is_the_analysis(tmp_path):
    """`analyze(run, prepared_run=prepared(run))`, the analysis `replay --report` draws from the
    replay's preparation, is the run's analysis bit for bit (read per rank partition), its
    tables the preparation's; a preparation made with other dims is refused."""
    tables, truth = make_run_tables(SynthSpec(steps=2, seed=5))
    run = write_run(strip_derived(tables), tmp_path / "run", truth=truth)
    given = prepared(run, write=False)
    ours = analyze(run, prepared_run=given)
    assert ours.dumps() == analyze(run).dumps()
    assert ours.collectives is given.tables["collectives"] and ours.ranks is given.tables["ranks"]
    assert set(given.tables) == set(prepare(run, write=False))
    with pytest.raises(TracekitError, match="made with dims None, not 'cp=ep_group'"):
        analyze(run, dims="cp=ep_group", prepared_run=given)


def test_cli_dims_override_and_errors(run_dir, tmp_path):
    runner = CliRunner()
    res = runner.invoke(main, ["analyze", str(run_dir), "--json", "--no-write", "--dims", "cp=ep_group"])
    assert res.exit_code == 0, res.output
    dims = json.loads(res.output)["dims"]
    assert all(v == ["CP"] for g, v in dims.items() if v and "CP" in v) and any(v == ["CP"] for v in dims.values())
    res = runner.invoke(main, ["analyze", str(run_dir), "--dims", "zz=1"])
    assert res.exit_code == 1 and "unknown dimension" in res.output and "Traceback" not in res.output
    res = runner.invoke(main, ["analyze", str(tmp_path)])
    assert res.exit_code == 1 and "not a tracekit run directory" in res.output
