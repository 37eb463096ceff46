"""`tracekit diff` on the command line: the verdict first, the waterfall, --json, bad input."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from diff_helpers import synth

from tracekit.cli import main
from tracekit.diff.results import RunDiff
from tracekit.results import from_builtins
from tracekit.synth import write_run


@pytest.fixture(scope="module")
def pair(tmp_path_factory, base_tables):
    out = tmp_path_factory.mktemp("pair")
    write_run(base_tables, out / "a")
    write_run(synth(slow_nic_rank=5), out / "b")
    return out / "a", out / "b"


def run(*args: str):
    return CliRunner().invoke(main, ["diff", *map(str, args)])


def test_text_leads_with_the_verdict_then_the_waterfall(pair):
    res = run(*pair)
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0].startswith("step +3.9 ms (+25%): +3.2 ms is DP communication on the critical path")
    assert lines[2].startswith("Step time, A -> B (mean of 5 steps; parts from the critical path)")
    waterfall = [line.split("│") for line in lines if "│" in line]
    names = [cells[0].strip() for cells in waterfall]
    assert names[:8] == ["step time in A", "compute", "comm DP", "comm EP", "comm PP", "idle", "remainder",
                         "step time in B"]
    assert "Collective buckets that changed" in res.stdout and "Setup differences" not in res.stdout
    assert "host node001: in " in res.stdout
    assert lines[-1].startswith("matched 16 ranks by rank, 18 process groups, 5 steps, 820 collectives")


def test_json_is_the_typed_result(pair):
    res = run(*pair, "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    d = from_builtins(doc, RunDiff)
    assert list(doc)[:4] == ["schema", "a", "b", "verdict"]
    assert d.verdict.startswith("step +3.9 ms") and d.matching.ranks_by == "rank"
    assert d.decomposition.parts_sum_ns + d.decomposition.remainder_ns == pytest.approx(d.decomposition.delta_ns)


def test_bad_input_is_one_line_naming_the_file(tmp_path, pair):
    junk = tmp_path / "notes.txt"
    junk.write_text("not a trace\n")
    res = run(pair[0], junk)
    assert res.exit_code == 1
    assert "notes.txt" in res.output and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) <= 2


def test_a_missing_path_is_refused(tmp_path, pair):
    res = run(pair[0], tmp_path / "nowhere")
    assert res.exit_code == 2 and "nowhere" in res.output


def test_readme_block_is_the_real_output(tmp_path):
    """The README's `tracekit diff` commands print the block it shows (verdict and waterfall)."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = text[text.index("## Why is this run slower? `tracekit diff`"):]
    commands = section[section.index("```sh\n") + 6:]
    commands = [line.split("tracekit ", 1)[1].split() for line in commands[:commands.index("```")].splitlines()]
    body = section[section.index("```\n", section.index("It leads with the verdict")) + 4:]
    block = body[:body.index("```")].rstrip("\n").splitlines()
    runner = CliRunner()
    for args in commands[:-1]:
        args[args.index("-o") + 1] = str(tmp_path / args[args.index("-o") + 1])
        assert runner.invoke(main, args).exit_code == 0
    args = [str(tmp_path / a) if a.startswith("runs/") else a for a in commands[-1]]
    res = runner.invoke(main, args)
    assert res.exit_code == 0, res.output
    got = [line.rstrip() for line in res.stdout.splitlines()]
    assert got[:len(block)] == block


def test_synth_makes_the_pairs_from_the_command_line(tmp_path):
    from tracekit.store import Run

    runner = CliRunner()
    common = ["--hosts", "2", "--gpus", "4", "--steps", "1", "--straggler", "-1"]
    res = runner.invoke(main, ["synth", "-o", str(tmp_path / "s"), *common, "--slow-stage", "1:2",
                               "--ring-channels", "1", "--dp-buckets", "3", "--hot-expert-share", "0.9"])
    assert res.exit_code == 0, res.output
    truth = json.loads((tmp_path / "s" / "truth.json").read_text())
    assert truth["slow_stage"] == {"stage": 1, "factor": 2.0} and truth["ring_channels"] == 1
    assert Run(tmp_path / "s").table("channels").num_rows == 8
    bad = runner.invoke(main, ["synth", "-o", str(tmp_path / "t"), *common, "--slow-stage", "x"])
    assert bad.exit_code == 1 and "--slow-stage 'x': expected STAGE or STAGE:FACTOR" in bad.output
