"""What starting tracekit costs: `tracekit --help` imports no command module and no heavy library,
and no tracekit module imports pandas (pyarrow loads it, when installed, on its first `pa.array`)."""

import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from tracekit.cli import COMMANDS, SUMMARIES

HEAVY = ("polars", "pyarrow", "numba", "bokeh", "numpy")


def _run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout


def test_help_lists_every_command_without_importing_one():
    code = ("import sys; from click.testing import CliRunner; from tracekit.cli import main; "
            "r = CliRunner().invoke(main, ['--help']); print(r.exit_code); print(r.output); "
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('tracekit.') or m.split('.')[0] in "
            f"{HEAVY!r})))")
    exit_code, *output, loaded = _run(code).splitlines()
    assert exit_code == "0"
    listed = [line.split()[0] for line in output if line.startswith("  ") and not line.strip().startswith("-")]
    assert listed[-len(COMMANDS):] == sorted(COMMANDS)
    assert loaded.split() == ["tracekit.cli"]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_summary_is_the_commands_first_paragraph(name):
    module, attr = COMMANDS[name].split(":")
    help_text = getattr(importlib.import_module(module), attr).help
    first = help_text.split("\n\n")[0]
    assert SUMMARIES[name] == " ".join(first.split()), "copy the command's first help paragraph into SUMMARIES"


@pytest.mark.skipif(importlib.util.find_spec("pandas") is None,
                    reason="pandas is not installed, so nothing could import it")
def test_no_module_imports_pandas():
    code = ("import importlib, pkgutil, sys, tracekit, tracekit.cli, tracekit.parsers, tracekit.viz\n"
            "from tracekit.cli import COMMANDS\n"
            "names = [target.split(':')[0] for target in COMMANDS.values()]\n"
            "names += [m.name for p in (tracekit, tracekit.parsers, tracekit.viz) "
            "for m in pkgutil.walk_packages(p.__path__, p.__name__ + '.')]\n"
            "for name in names:\n"
            "    importlib.import_module(name)\n"
            "    if 'pandas' in sys.modules:\n"
            "        print('pandas after', name)\n"
            "        break\n"
            "print(len(names))\n")
    out = _run(code)
    assert "pandas after" not in out, out
    assert int(out.split()[-1]) > 100  # every module of the package was imported


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_commands_help_imports_no_heavy_library(name):
    """`tracekit NAME --help` answers at once: each command imports its libraries when it runs."""
    code = (f"import sys; import {COMMANDS[name].split(':')[0]}; "
            f"print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})))")
    assert _run(code).split() == []


def test_a_command_tunes_the_collector_and_freezes_the_heap_at_exit():
    """A command collects young objects less often and freezes the heap before Python's shutdown,
    which would otherwise walk it again (0.4-0.9 s of the README's main job, bench_startup.py);
    `--help` alone changes nothing. The check runs from an exit hook registered before the CLI's."""
    code = ("import atexit, gc, sys\n"
            "print(gc.get_threshold(), False)\n"
            "atexit.register(lambda: print(gc.get_threshold(), gc.get_freeze_count() > 0))\n"
            "from click.testing import CliRunner\n"
            "from tracekit.cli import main\n"
            "assert CliRunner().invoke(main, sys.argv[1:]).exit_code == 0\n")
    from tracekit.cli import GC_THRESHOLDS

    tuned = _run_args(code, "info", "--help").splitlines()
    assert tuned[-1] == f"{GC_THRESHOLDS} True" and tuned[0] != tuned[-1]
    untouched = _run_args(code, "--help").splitlines()
    assert untouched[-1] == untouched[0]


def _run_args(code: str, *args: str) -> str:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True).stdout


@pytest.mark.skipif(importlib.util.find_spec("pandas") is None,
                    reason="pandas is not installed, so nothing could import it")
def test_a_command_runs_without_pandas_and_to_pandas_still_works(tmp_path):
    """pyarrow imports pandas, when installed, on the first array it builds (0.2-0.3 s of CPU per
    command): a command lets that one look find none, and pandas is there when asked for."""
    sample = Path(__file__).resolve().parents[2] / "sample_traces" / "gloo_moe_8rank"
    code = ("import sys\n"
            "from click.testing import CliRunner\n"
            "from tracekit.cli import main\n"
            "r = CliRunner().invoke(main, sys.argv[1:])\n"
            "assert r.exit_code == 0, r.output\n"
            "print('pandas' in sys.modules)\n"
            "import pyarrow as pa\n"
            "print(type(pa.table({'a': [1]}).to_pandas()).__name__)\n")
    out = _run_args(code, "replay", str(sample), "--topology", "single-switch", "--cache", str(tmp_path / "run"),
                    "--report", str(tmp_path / "r.html")).splitlines()
    assert out[-2:] == ["False", "DataFrame"]
