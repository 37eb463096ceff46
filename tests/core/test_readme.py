"""The README's Python example runs as written (in a temporary directory)."""

import os
import re
import shutil
from pathlib import Path

ROOT = Path(__file__).parents[2]


def test_python_api_example_runs(tmp_path):
    text = (ROOT / "README.md").read_text()
    code = re.search(r"## Python API.*?```python\n(.*?)```", text, re.S).group(1)
    shutil.copytree(ROOT / "sample_traces" / "synth_moe_16rank", tmp_path / "sample_traces" / "synth_moe_16rank")
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        exec(compile(code, "README.md", "exec"), {})
    finally:
        os.chdir(cwd)
    assert (tmp_path / "report.html").stat().st_size > 100_000
    assert (tmp_path / "runs" / "job42" / "results" / "replay.json").is_file()


def test_main_job_command_names_a_bundled_sample():
    text = (ROOT / "README.md").read_text()
    command = next(line for line in text.splitlines() if line.startswith("pip install -e . && tracekit replay"))
    sample = command.split("tracekit replay ", 1)[1].split()[0]
    assert (ROOT / sample).is_dir()


def test_ci_runs_the_readme_test_command():
    text = (ROOT / "README.md").read_text()
    readme = next(line for line in text.splitlines() if line.startswith("pip install -e '.[dev]' && "))
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    ci_first_run = next(line for line in ci_lines if line.startswith("python ") and "-m pytest" in line)
    assert ci_first_run == "python -m " + readme


def _block_after(text: str, marker: str) -> list[str]:
    start = text.index(marker)
    body = text[text.index("```\n", start) + 4:]
    return body[:body.index("```")].rstrip("\n").splitlines()


def test_main_job_output_block_is_the_real_output(tmp_path):
    """The comparison the README shows is what the main-job command prints, line for line."""
    from click.testing import CliRunner

    from tracekit.cli import main

    text = (ROOT / "README.md").read_text()
    command = next(line for line in text.splitlines() if line.startswith("pip install -e . && tracekit replay"))
    args = command.split("tracekit ", 1)[1].split()
    args = [str(ROOT / a) if a.startswith("sample_traces/") else a for a in args]
    args[args.index("--report") + 1] = str(tmp_path / "report.html")
    res = CliRunner().invoke(main, [*args, "--cache", str(tmp_path / "run")])
    assert res.exit_code == 0, res.output
    got = [line.rstrip() for line in res.stdout.splitlines() if not line.startswith("report: ")]
    assert _block_after(text, "It prints the comparison") == got


def test_analyze_block_is_the_real_output(tmp_path):
    """Each finding the README quotes for the gloo sample is printed by `tracekit analyze`."""
    from click.testing import CliRunner

    from tracekit.cli import main

    text = (ROOT / "README.md").read_text()
    block = _block_after(text, "`tracekit analyze` names the injected facts")
    quoted = " ".join(line.strip() for line in block).split("- ")[1:]
    runner = CliRunner()
    assert runner.invoke(main, ["ingest", str(ROOT / "sample_traces" / "gloo_moe_8rank"), "-o",
                                str(tmp_path / "run")]).exit_code == 0
    res = runner.invoke(main, ["analyze", str(tmp_path / "run"), "--no-write"])
    assert res.exit_code == 0, res.output
    printed = [line.strip()[2:] for line in res.stdout.splitlines() if line.startswith("  - ")]
    assert len(quoted) == 3 and res.stdout.splitlines()[1].strip()[2:] == quoted[0].strip()
    for finding in quoted:
        assert finding.strip() in printed


def test_nccl_tests_health_block_is_the_real_output(tmp_path):
    """The health verdict the README shows for the bundled degraded nccl-tests sample is what the
    command prints, line for line (the last lines of its output)."""
    from click.testing import CliRunner

    from tracekit.cli import main

    text = (ROOT / "README.md").read_text()
    command = next(line for line in text.splitlines() if line.startswith("tracekit replay --nccl-tests "))
    args = [str(ROOT / a) if a.startswith("sample_traces/") else a for a in command.split()[1:]]
    res = CliRunner().invoke(main, [*args, "--cache", str(tmp_path / "run")])
    assert res.exit_code == 0, res.output
    block = _block_after(text, "it ends with the verdict")
    got = [line.rstrip() for line in res.stdout.splitlines()]
    assert got[-len(block):] == block
    assert "degraded" in block[-1]
    assert _block_after(text, "here the file names no GPU, so:") == [got[1]]


def _run(args):
    from click.testing import CliRunner

    from tracekit.cli import main

    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    return res.stdout


def test_whatif_block_is_the_real_output(tmp_path):
    """The what-if table the README shows is what its command prints, line for line."""
    text = (ROOT / "README.md").read_text()
    start = text.index("```sh\ntracekit whatif sample_traces/synth_moe_16rank")
    command = text[start + 6:text.index("```", start + 6)].replace("\\\n", " ").split()
    args = [str(ROOT / a) if a.startswith("sample_traces/") else a for a in command[1:]]
    got = [line.rstrip() for line in _run(args).splitlines()]
    first = text.index("```\nwhat-if on ", start) + 4
    block = text[first:text.index("```", first)].rstrip("\n").splitlines()
    scenarios = command[3:command.index("--topology")]
    assert all(any(line.startswith(f"{name} ") for line in block) for name in ["baseline", *scenarios])
    assert got[:len(block)] == block


def test_replay_prose_figures_are_the_real_ones(tmp_path):
    """The per-op errors, the SHARP cut of the DP all-reduces and its exposed-time changes that the
    README's prose quotes for the bundled sample."""
    import json
    import re

    import numpy as np

    text = " ".join((ROOT / "README.md").read_text().split())
    sample = str(ROOT / "sample_traces" / "synth_moe_16rank")
    base = "rail-optimized:nic_gbps=400"
    verbose = _run(["replay", sample, "--topology", base, "--no-write", "--verbose", "--cache", str(tmp_path / "r")])
    per_op = {m[0]: (m[1], m[2]) for m in re.findall(r"^  (\w+): .*\| ([\d.]+%) / ([\d.]+%)$", verbose, re.M)}
    assert (f"all-reduce {per_op['all_reduce'][0]} / {per_op['all_reduce'][1]}, all-to-all "
            f"{per_op['all_to_all'][0]} / {per_op['all_to_all'][1]}, the PP send/recv {per_op['send'][0]} / "
            f"{per_op['send'][1]}") in text
    doc = json.loads(_run(["replay", sample, "--topology", base, "--topology", base + ",sharp=true", "--no-write",
                           "--json", "--cache", str(tmp_path / "r")]))
    ring, sharp = (np.mean([i["replayed_ns"] for i in r["instances"] if i["op"] == "all_reduce"])
                   for r in doc["results"])
    assert f"cuts the DP all-reduces by {1 - sharp / ring:.0%}" in text
    step = [np.mean(list(r["step_ns"].values())) for r in doc["results"]]
    dp = [r["exposed_ns"]["DP"] for r in doc["results"]]
    assert f"exposed time ({dp[1] / dp[0] - 1:+.1%}) and the step ({step[1] / step[0] - 1:+.1%})" in text


def test_schedule_whatif_block_and_prose_are_the_real_output(tmp_path):
    """The schedule what-ifs the README shows: its table and pipeline lines are what its command
    prints, in order, and the prose's figures are theirs."""
    import re

    text = (ROOT / "README.md").read_text()
    start = text.index("```sh\ntracekit whatif sample_traces/synth_moe_16rank schedule:")
    command = text[start + 6:text.index("```", start + 6)].replace("\\\n", " ").split()
    args = [str(ROOT / a) if a.startswith("sample_traces/") else a for a in command[1:]]
    got = [line.rstrip() for line in _run([*args, "--cache", str(tmp_path / "c")]).splitlines()]
    first = text.index("```\nwhat-if on ", start) + 4
    block = [line for line in text[first:text.index("```", first)].rstrip("\n").splitlines() if line]
    table = next(i for i, line in enumerate(block) if line.endswith(":"))  # the table ends at the first scenario
    scenarios = command[3:command.index("--topology")]
    rows = block[table - len(scenarios):table]
    assert [row.split()[0] for row in rows] == scenarios and block[table - len(scenarios) - 1].startswith("baseline")
    # each scenario's name, pipeline and bubble lines, and the SM share of the 3 DualPipe ones
    assert len(block) - table == 3 * len(scenarios) + 3
    at = 0
    for line in block:
        at = got.index(line, at) + 1
    bubbles, name = {}, None
    for line in block[table:]:
        if line.endswith(":"):
            name = line
        elif line.startswith("  bubble per stage:"):
            bubbles[name] = [tuple(map(float, b)) for b in re.findall(r"\d: ([\d.]+) ms -> ([\d.]+) ms", line)]
    # 2 micro-batches: GPipe's bubble, but for the contention of stage 1's other order
    assert all(abs(a / b - 1) <= 0.004 for b, a in bubbles["schedule:1f1b:"])
    assert "(bubbles within 0.4%)" in " ".join(text.split())
    halved = [a / b for b, a in bubbles["schedule:1f1b,microbatches=4:"]]
    again = [i / h for (_, i), (_, h) in zip(bubbles["schedule:interleaved-1f1b,microbatches=4:"],
                                             bubbles["schedule:1f1b,microbatches=4:"], strict=True)]
    assert all(0.45 < x < 0.55 for x in halved + again)
    assert all(a < 0.2 for _, a in bubbles["schedule:dualpipe,microbatches=4:"])
    step = {row.split()[0]: float(row.split()[1]) for row in rows}
    change = 1 - step["schedule:dualpipe,microbatches=4,sm_share=0"] / step["schedule:dualpipe,microbatches=4"]
    assert f"(`sm_share=0`) moves the step by {change:.1%}" in " ".join(text.split())
    dp = {row.split()[0]: float(row.split()[4]) for row in rows}  # exposed DP per step (ms)
    base_dp = float(block[table - len(scenarios) - 1].split()[3])
    assert f"exposed DP grows by up to {max(dp.values()) / base_dp - 1:.1%}" in " ".join(text.split())
    assert dp["schedule:zb-h1,microbatches=4"] > dp["schedule:1f1b,microbatches=4"] > base_dp


def test_nsight_example_output_is_the_real_output(tmp_path, monkeypatch):
    """The README's Nsight Systems commands print the block it shows, line for line."""
    from click.testing import CliRunner

    from tracekit.cli import main

    text = (ROOT / "README.md").read_text()
    section = text[text.index("### Nsight Systems reports"):]
    commands = _block_after(section, "A synthetic job written as")
    monkeypatch.chdir(tmp_path)
    out: list[str] = []
    for command in commands:
        res = CliRunner().invoke(main, command.split()[1:])
        assert res.exit_code == 0, res.output
        out = res.output.rstrip("\n").splitlines()
    assert [line.rstrip() for line in out] == _block_after(section, "prints")
