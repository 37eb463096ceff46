"""`scale:` what-ifs: one copy is the baseline; DP x2 from a synth run predicts the synth run made at
twice its DP size; the topology grows with the job; the JSON says how many GPUs were simulated."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from tracekit import workflows
from tracekit.cli import main
from tracekit.replay import parse_spec
from tracekit.replay.topology import leaves_per_plane
from tracekit.synth import SynthSpec, make_run_tables, write_run
from tracekit.whatif import ExpertLoads, WhatIfError, make_baseline, parse_scenario, run_scenario
from tracekit.whatif.scale import grow

#: DP x PP=2 x EP=2 on hosts of 4 GPUs, no straggler: at 2 hosts DP is 4, at 4 hosts DP is 8.
SMALL = SynthSpec(hosts=2, gpus_per_host=4, pp=2, ep=2, steps=3, straggler_rank=None)
TOPOLOGY = "rail-optimized"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = {}
    for hosts in (2, 4):
        tables, truth = make_run_tables(SMALL, hosts=hosts)
        run = write_run(tables, tmp_path_factory.mktemp("scale") / f"h{hosts}", truth=truth)
        out[hosts] = make_baseline(workflows.replay_tables(run), TOPOLOGY)
    return out


def _mean(steps: dict[str, int]) -> float:
    return float(np.mean(list(steps.values())))


def test_one_copy_is_the_baseline(runs):
    result = run_scenario(runs[2], "scale:dp=1")
    assert result.step_ns == result.baseline_step_ns
    assert result.exposed_ns == result.baseline_exposed_ns
    assert result.simulated_gpus == 8


def test_dp_x2_predicts_the_run_made_at_twice_the_dp_size(runs):
    """The 2-host run replayed at DP x2 against the 4-host run's traced step: within the small
    run's cross-validated replay error (median, per collective), while the two runs' traced steps
    differ by more than that error (so keeping the small run's step would fail)."""
    small, large = runs[2], runs[4]
    result = run_scenario(small, "scale:dp=2")
    assert result.simulated_gpus == 16 and result.details["hosts"] == 4
    predicted = _mean(result.step_ns)
    traced_large = _mean(large.result.traced_step_ns)
    traced_small = _mean(small.result.traced_step_ns)
    error = small.replay.errors.cross_validated.median
    assert abs(predicted - traced_large) / traced_large <= error
    assert abs(traced_small - traced_large) / traced_large > error
    assert any("weak scaling" in n for n in result.notes)


def test_hosts_is_dp_in_hosts(runs):
    a, b = run_scenario(runs[2], "scale:hosts=4"), run_scenario(runs[2], "scale:dp=2")
    assert a.step_ns == b.step_ns and a.simulated_gpus == b.simulated_gpus == 16


def test_ep_resplit_joins_two_copies_groups(runs):
    """EP 2 -> 4 on two copies: every EP all-to-all now spans the two copies' hosts."""
    result = run_scenario(runs[2], "scale:dp=2,ep=4")
    joined = run_scenario(runs[2], "scale:dp=2")
    assert result.details["ep_size"] == {"before": 2, "after": 4}
    assert result.inter_host_after["EP"] > joined.inter_host_after.get("EP", 0)
    with pytest.raises(WhatIfError, match="must be a multiple of 2"):
        run_scenario(runs[2], "scale:ep=4")


def _loads(hot: int | None) -> ExpertLoads:
    """Two experts per rank (rank r holds 2r and 2r + 1); with `hot`, expert `hot` of every EP
    group's first member (2r + hot for even r) has 9 times the tokens of the others."""
    tokens = {e: 9.0 if hot is not None and e % 4 == hot else 1.0 for e in range(16)}
    return ExpertLoads(tokens=tokens, rank_of={e: e // 2 for e in range(16)}, source="loads.csv")


def test_ep_resplit_from_expert_loads(runs):
    """EP 2 -> 4 from per-expert loads: uniform loads re-split exactly as the even rule does; a
    hot expert goes whole to one of the two ranks that share its rank's experts, so that rank's
    all-to-alls take longer (the even rule would halve its tokens); the copies being alike, the
    hot expert in either block gives the same step."""
    even = run_scenario(runs[2], "scale:dp=2,ep=4")
    uniform = run_scenario(runs[2], "scale:dp=2,ep=4", expert_loads=_loads(None))
    hot = run_scenario(runs[2], "scale:dp=2,ep=4", expert_loads=_loads(0))
    hot_second = run_scenario(runs[2], "scale:dp=2,ep=4", expert_loads=_loads(1))
    assert uniform.step_ns == even.step_ns and uniform.exposed_ns == even.exposed_ns
    assert hot.exposed_ns["EP"] > even.exposed_ns["EP"]
    assert all(hot.step_ns[k] > even.step_ns[k] for k in even.step_ns)
    assert hot_second.step_ns == hot.step_ns
    assert hot.inter_host_after["EP"] == even.inter_host_after["EP"]  # the bytes cross as many hosts
    assert hot.details["expert_loads"] == {"source": "loads.csv", "ranks": 8, "experts_per_rank": [2]}
    assert any("expert loads of loads.csv" in n and "2 contiguous blocks" in n for n in hot.notes)
    assert "expert_loads" not in even.details


def test_expert_loads_that_cannot_follow_the_new_ep_size_are_refused(runs):
    one_each = ExpertLoads(tokens={r: 1.0 for r in range(8)}, rank_of={r: r for r in range(8)}, source="one.csv")
    with pytest.raises(WhatIfError, match="holds 1 expert in the expert map, which cannot be split over 2 ranks"):
        run_scenario(runs[2], "scale:dp=2,ep=4", expert_loads=one_each)
    shrunk = run_scenario(runs[2], "scale:dp=2,ep=1", expert_loads=_loads(0))
    assert shrunk.step_ns == run_scenario(runs[2], "scale:dp=2,ep=1").step_ns  # whole ranks move together
    assert any("loads do not change the split" in n for n in shrunk.notes)


@pytest.mark.parametrize(("text", "message"), [
    ("scale:", "give dp=N or ep=N or hosts=N"),
    ("scale:dp=0", "must be >= 1"),
    ("scale:gpus=4", "unknown field 'gpus'"),
])
def test_bad_scale_scenarios(text, message):
    with pytest.raises(WhatIfError, match=message):
        parse_scenario(text)


def test_hosts_must_be_a_multiple_of_the_traced_hosts(runs):
    with pytest.raises(WhatIfError, match="not a multiple of the run's 2 hosts"):
        run_scenario(runs[2], "scale:hosts=3")


def test_topology_grows_a_core_tier_when_one_spine_tier_cannot_join_the_leaves():
    spec = parse_spec("rail-optimized:gpus=4")
    small, notes = grow(spec, 64)
    assert small.tiers == 2 and not notes  # 2 leaf groups x 4 rails
    big, notes = grow(spec, 4096)
    assert leaves_per_plane(big) == 512 and big.tiers == 3 and "core tier is added" in notes[0]
    stated = parse_spec("rail-optimized:gpus=4,hosts=8")
    with pytest.raises(WhatIfError, match="states 8 hosts"):
        grow(stated, 16)
    assert grow(stated, 8)[0] == stated


def test_json_reports_simulated_gpus(runs, tmp_path):
    tables, truth = make_run_tables(SMALL)
    run = write_run(tables, tmp_path / "run", truth=truth).path
    result = CliRunner().invoke(main, ["whatif", str(run), "scale:dp=2", "eplb:redundant=2", "--json"])
    assert result.exit_code == 0, result.output
    scale, eplb = json.loads(result.output)["scenarios"]
    assert list(scale)[:9] == ["scenario", "step_ns", "baseline_step_ns", "exposed_ns", "baseline_exposed_ns",
                               "ep_imbalance", "inter_host_bytes", "checkpoint_ns", "simulated_gpus"]
    assert scale["simulated_gpus"] == 16 and scale["kind"] == "scale"
    assert "simulated_gpus" not in eplb


def test_report_plots_step_time_against_gpus(runs, tmp_path):
    """The What-if tab's scale points are the results' own figures (the baseline at the traced
    size first, then by GPUs), and the written tab has the plot."""
    from tracekit.viz import data as D
    from tracekit.whatif import whatif

    small = runs[2]
    result = whatif(small.tables, ["scale:dp=4", "scale:dp=2", "eplb:redundant=2"], topology=TOPOLOGY)
    points = D.whatif_data(result).scale
    assert [(p.scenario, p.gpus) for p in points] == [("baseline", 8), ("scale:dp=2", 16), ("scale:dp=4", 32)]
    by_name = {s.scenario: s for s in result.scenarios}
    assert points[2].step_ms == pytest.approx(_mean(by_name["scale:dp=4"].step_ns) / 1e6)
    assert points[0].step_ms == pytest.approx(_mean(result.baseline_step_ns) / 1e6)
    tables, truth = make_run_tables(SMALL)
    run = write_run(tables, tmp_path / "run", truth=truth)
    html = workflows.report(run, tmp_path / "report.html", whatif=result).path.read_text()
    assert "Step time against GPUs (scale scenarios)" in html
    assert D.whatif_data(whatif(small.tables, ["eplb:redundant=2"], topology=TOPOLOGY)).scale == []


def test_readme_scale_block_is_the_real_output():
    """The README's scale and routing table is what its command prints, line for line."""
    from pathlib import Path

    root = Path(__file__).parents[2]
    text = (root / "README.md").read_text()
    start = text.index("```sh\ntracekit whatif sample_traces/synth_moe_16rank scale:")
    command = text[start + 6:text.index("```", start + 6)].replace("\\\n", " ").split()
    args = [str(root / a) if a.startswith("sample_traces/") else a for a in command[1:]]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    got = [line.rstrip() for line in result.stdout.splitlines()]
    first = text.index("```\nwhat-if on ", start) + 4
    block = text[first:text.index("```", first)].rstrip("\n").splitlines()
    scenarios = command[3:command.index("--topology")]
    assert all(any(line.startswith(f"{name} ") for line in block) for name in ["baseline", *scenarios])
    assert got[:len(block)] == block
    line = next(g for g in got if g.startswith("  simulated GPUs: 256 (16 copies of the traced 16) on 64 hosts of 4"))
    flows = int(line.rsplit(", ", 1)[1].split()[0].replace(",", ""))
    assert f"(256 simulated GPUs, {flows / 1000:.0f}k flows)" in " ".join(text.split())
    assert "  EP bytes across nodes: 0.80 -> 0.81 GB (each token's experts on at most 1 node)" in got
    assert "  EP all-to-all per instance (mean): 0.135 ms -> 0.160 ms" in got
