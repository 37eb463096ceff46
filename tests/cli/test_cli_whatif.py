import json

import pytest
from click.testing import CliRunner

from tracekit.cli import main
from tracekit.synth import SynthSpec, make_run_tables, write_run

SPEC = SynthSpec(hosts=2, gpus_per_host=4, pp=2, ep=4, steps=1, straggler_rank=None)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    tables, truth = make_run_tables(SPEC)
    return write_run(tables, tmp_path_factory.mktemp("whatif") / "run", truth=truth).path


def test_table_and_mapping(run_dir):
    result = CliRunner().invoke(main, ["whatif", str(run_dir), "eplb:redundant=4", "placement:pp-adjacent",
                                       "--topology", "rail-optimized:gpus=4"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == ("what-if on rail-optimized:gpus=4: each scenario vs the baseline replay of the unchanged run "
                        "(model vs model, not vs the trace)")
    assert lines[2].split()[:3] == ["scenario", "step", "(mean)"]
    assert lines[3].startswith("baseline ")
    assert lines[4].startswith("eplb:redundant=4 ") and " -> " in lines[4]
    assert "  node000: ranks 0 4 1 5 (by GPU)" in lines
    assert any("taken as one expert" in line for line in lines)


def test_json_layout(run_dir):
    result = CliRunner().invoke(main, ["whatif", str(run_dir), "eplb:redundant=4", "placement:pp-adjacent",
                                       "--topology", "rail-optimized:gpus=4", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    eplb, place = doc["scenarios"]
    for s in doc["scenarios"]:
        assert list(s)[:8] == ["scenario", "step_ns", "baseline_step_ns", "exposed_ns", "baseline_exposed_ns",
                               "ep_imbalance", "inter_host_bytes", "checkpoint_ns"]
        assert set(s["inter_host_bytes"]) == {"before", "after"}
    assert set(eplb["ep_imbalance"]) == {"before", "after"}
    assert place["ep_imbalance"] is None and place["checkpoint_ns"] is None
    assert "model vs model" in doc["comparison"]


@pytest.mark.parametrize(("scenario", "message"), [
    ("eplb:redundnat=4", "unknown field 'redundnat'"),
    ("eplb:groups=2", "'redundant' is required"),
    ("eplb:redundant=x", "expects an integer"),
    ("teleport:x=1", "unknown scenario"),
    ("placement:", "give a file or one of"),
])
def test_bad_scenarios_exit_1(run_dir, scenario, message):
    result = CliRunner().invoke(main, ["whatif", str(run_dir), scenario])
    assert result.exit_code == 1, result.output
    assert message in result.output and "Traceback" not in result.output


def test_expert_files_go_together(run_dir, tmp_path):
    (tmp_path / "loads.csv").write_text("step,layer,expert,tokens\n0,0,0,5\n")
    result = CliRunner().invoke(main, ["whatif", str(run_dir), "eplb:redundant=4", "--expert-loads",
                                       str(tmp_path / "loads.csv")])
    assert result.exit_code == 2 and "--expert-map" in result.output


def test_readme_command_names_the_sample_and_valid_scenarios():
    import re
    from pathlib import Path

    from tracekit.whatif import parse_scenario

    root = Path(__file__).parents[2]
    for doc in ("README.md", "docs/whatif.md"):
        text = (root / doc).read_text()
        command = re.search(r"```sh\n(tracekit whatif .*?)```", text, re.S).group(1).replace("\\\n", " ").split()
        run, rest = command[2], command[3:]
        assert (root / run).is_dir()
        scenarios = rest[:rest.index("--topology")]
        assert len(scenarios) == 6
        assert [parse_scenario(s).kind for s in scenarios] == ["eplb", "eplb", "placement", "placement",
                                                               "checkpoint", "checkpoint"]


def test_progress_says_the_baseline_once_then_each_scenario(run_dir):
    """Before: 'replaying ... (baseline)' once per replay, 22 times for the README's what-if; after:
    once for the baseline, then 'scenario k/n: ...'."""
    import io

    from tracekit import _progress
    from tracekit.workflows import whatif

    out = io.StringIO()
    _progress.enable(out)
    try:
        whatif(run_dir, ["eplb:redundant=4", "placement:pp-adjacent"], topology="rail-optimized:gpus=4")
    finally:
        _progress._stream = None
    lines = out.getvalue().splitlines()
    assert sum("(baseline)" in line for line in lines) == 1, lines
    assert [line for line in lines if "scenario" in line] == [
        "tracekit: scenario 1/2: eplb:redundant=4", "tracekit: scenario 2/2: placement:pp-adjacent"]


def test_scale_ep_takes_the_expert_files(run_dir, tmp_path):
    """`scale:...,ep=E` with --expert-loads/--expert-map re-splits by expert and says so; expert
    counts the new EP size cannot cut into whole blocks are a one-line error."""
    (tmp_path / "map.csv").write_text("expert,rank\n" + "".join(f"{e},{e // 2}\n" for e in range(16)))
    (tmp_path / "loads.csv").write_text("step,layer,expert,tokens\n" + "".join(
        f"0,0,{e},{90 if e % 8 == 0 else 10}\n" for e in range(16)))
    (tmp_path / "one.csv").write_text("expert,rank\n" + "".join(f"{r},{r}\n" for r in range(8)))
    (tmp_path / "one_loads.csv").write_text("step,layer,expert,tokens\n0,0,0,5\n")
    args = ["whatif", str(run_dir), "scale:dp=2,ep=8", "--topology", "rail-optimized:gpus=4"]
    result = CliRunner().invoke(main, [*args, "--expert-loads", str(tmp_path / "loads.csv"), "--expert-map",
                                       str(tmp_path / "map.csv")])
    assert result.exit_code == 0, result.output
    assert "expert loads of loads.csv" in result.output
    bad = CliRunner().invoke(main, [*args, "--expert-loads", str(tmp_path / "one_loads.csv"), "--expert-map",
                                    str(tmp_path / "one.csv")])
    assert bad.exit_code == 1 and "cannot be split over 2 ranks" in bad.output and "Traceback" not in bad.output
