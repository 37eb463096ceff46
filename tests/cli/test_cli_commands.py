import importlib

import pytest
from click.testing import CliRunner

from tracekit.cli import COMMANDS, main


def test_version():
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0 and "tracekit" in result.output


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_exists_and_has_help(name):
    module, attr = COMMANDS[name].split(":")
    command = getattr(importlib.import_module(module), attr)
    assert command.help and len(command.help.strip()) > 10
    for param in command.params:
        if param.param_type_name == "option":
            assert param.help, f"{name} {param.opts} has no help text"
    result = CliRunner().invoke(main, [name, "--help"])
    assert result.exit_code == 0, result.output


def test_synth_run_and_kineto(tmp_path):
    runner = CliRunner()
    result = runner.invoke(main, ["synth", "-o", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert "8 ranks" in result.output
    result = runner.invoke(main, ["synth", "-o", str(tmp_path / "k"), "--format", "kineto", "--hosts", "1",
                                  "--gpus", "4", "--ep", "2", "--pp", "2"])
    assert result.exit_code == 0, result.output
    assert len(list((tmp_path / "k").glob("rank*.pt.trace.json.gz"))) == 4


def test_synth_bad_shape_is_a_clean_error(tmp_path):
    result = CliRunner().invoke(main, ["synth", "-o", str(tmp_path / "x"), "--hosts", "1", "--gpus", "6", "--pp", "4"])
    assert result.exit_code == 1
    assert "divisible" in result.output and "Traceback" not in result.output


def test_cli_reference_is_current():
    from pathlib import Path

    from tracekit.cli._docs import cli_reference

    doc = Path(__file__).parents[2] / "docs" / "cli.md"
    assert doc.read_text() == cli_reference(), "regenerate: python -m tracekit.cli._docs > docs/cli.md"


def test_trace_strings_are_not_terminal_markup(tmp_path):
    """A group description like "[red]...[/red]" or "[link=...]" prints verbatim, never as rich markup."""
    import pyarrow as pa

    from tracekit.synth import make_run_tables, write_run

    tables, _ = make_run_tables()
    groups = tables["groups"]
    desc = ["[link=http://x]click[/link][red]dp[/red]"] * groups.num_rows
    tables["groups"] = groups.set_column(groups.schema.get_field_index("desc"), "desc", pa.array(desc))
    write_run(tables, tmp_path / "run")
    for args in (["info", str(tmp_path / "run")], ["analyze", str(tmp_path / "run")]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output
        assert "[red]dp[/red]" in result.output or "[link=" in result.output
