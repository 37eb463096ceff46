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
    ci_last = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci_last == "python -m " + readme
