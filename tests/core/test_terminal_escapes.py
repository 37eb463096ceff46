"""Trace strings are untrusted: ESC/OSC/C1 and bidi controls from a trace never reach the
terminal raw from `ingest`, `info`, `analyze` or `hang` (issue 14)."""

from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from tracekit._text import one_line, term
from tracekit.cli import main

GLOO = Path(__file__).resolve().parents[2] / "sample_traces" / "gloo_moe_8rank"
OSC_LINK = "\x1b]8;;javascript:alert(1)\x07click\x1b]8;;\x07"
TITLE = "\x1b]0;pwned\x07"
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def test_term_escapes_controls_and_keeps_text() -> None:
    assert term("a\x1b[2Jb") == "a\\x1b[2Jb"
    assert term(OSC_LINK) == "\\x1b]8;;javascript:alert(1)\\x07click\\x1b]8;;\\x07"
    assert term("x\u202ey\x9bz") == "x\\u202ey\\x9bz"
    assert term("line1\n\tline2 é ✓") == "line1\n\tline2 é ✓"


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("esc")
    src = tmp / "in"
    src.mkdir()
    for f in sorted(GLOO.glob("rank*.pt.trace.json.gz")):
        doc = json.loads(gzip.decompress(f.read_bytes()))
        info = doc["distributedInfo"]
        for g in info["pg_config"]:
            g["pg_desc"] = g["pg_desc"] + OSC_LINK
        doc["hostname"] = doc["host_name"] = "node" + TITLE
        info["world_size"] = "\x1b[2J" + str(info["world_size"])
        for e in doc["traceEvents"][:50]:
            if e.get("name"):
                e["name"] = e["name"] + "\u202e\x1b[31m"
        (src / f.name.replace(".gz", "")).write_text(json.dumps(doc))
    shutil.copy(next(src.iterdir()), src / f"evil{TITLE}.json")
    return src


def _assert_clean(text: str, where: str) -> None:
    assert not RAW.search(text), f"{where}: raw control character in {text[:2000]!r}"


def test_no_raw_escapes_reach_the_terminal(hostile_run: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    run = tmp_path / "run"
    res = runner.invoke(main, ["ingest", str(hostile_run), "-o", str(run)])
    assert res.exit_code in (0, 2), res.output
    _assert_clean(res.stdout, "ingest stdout")
    _assert_clean(res.stderr, "ingest stderr")
    assert "\\x1b" in res.stdout + res.stderr  # shown escaped, not dropped
    for args in (["info", str(run)], ["analyze", str(run)], ["hang", str(run)]):
        res = runner.invoke(main, args)
        assert res.exit_code == 0, (args, res.output)
        _assert_clean(res.stdout, f"{args[0]} stdout")
        _assert_clean(res.stderr, f"{args[0]} stderr")
    res = runner.invoke(main, ["info", str(run), "--json"])
    _assert_clean(res.stdout, "info --json")
    assert any(OSC_LINK in g["desc"] for g in json.loads(res.stdout)["groups"])  # JSON keeps the data, escaped


def test_error_messages_are_escaped(tmp_path: Path) -> None:
    bad = tmp_path / f"bad{TITLE}.json"
    bad.write_text('{"traceEvents": [')
    res = CliRunner().invoke(main, ["ingest", str(bad), "-o", str(tmp_path / "run")])
    assert res.exit_code == 1
    _assert_clean(res.stderr, "error")
    assert "\\x1b]0;pwned\\x07" in res.stderr


def test_a_file_name_with_a_line_break_stays_on_the_error_line(tmp_path: Path) -> None:
    """The `nothing ingested` error quotes the file's name: a newline in it is shown escaped."""
    bad = tmp_path / "bad\nINJECTED.json"
    bad.write_text('{"traceEvents": [')
    res = CliRunner().invoke(main, ["ingest", str(bad), "-o", str(tmp_path / "run")])
    assert res.exit_code == 1
    errors = [ln for ln in res.stderr.splitlines() if "nothing ingested" in ln]
    assert len(errors) == 1 and "bad\\x0aINJECTED.json" in errors[0], res.stderr
    assert not re.search(r"(?m)^\W*INJECTED", res.stderr), res.stderr


LINE_BREAKS = "\nINJECTED line\tcell\r\u2028"


@pytest.fixture(scope="module")
def newline_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The gloo sample with line breaks and tabs in host, group and event names (issue 22)."""
    tmp = tmp_path_factory.mktemp("nl")
    src = tmp / "in"
    src.mkdir()
    for f in sorted(GLOO.glob("rank*.pt.trace.json.gz")):
        doc = json.loads(gzip.decompress(f.read_bytes()))
        for g in doc["distributedInfo"]["pg_config"]:
            g["pg_desc"] += LINE_BREAKS
            g["pg_name"] += LINE_BREAKS
        doc["hostname"] = doc["host_name"] = "node" + LINE_BREAKS
        for e in doc["traceEvents"]:
            if str(e.get("name", "")).startswith("nccl:"):
                e["name"] += LINE_BREAKS
        (src / f.name.replace(".gz", "")).write_text(json.dumps(doc))
    run = tmp / "run"
    res = CliRunner().invoke(main, ["ingest", str(src), "-o", str(run)])
    assert res.exit_code in (0, 2), res.output
    return run


def test_one_line_escapes_line_breaks_and_tabs() -> None:
    assert one_line("a\nb\tc\r\u2028d\x1b") == "a\\x0ab\\x09c\\x0d\\u2028d\\x1b"
    assert one_line("é ✓ plain") == "é ✓ plain"


@pytest.mark.parametrize("args", [["info"], ["analyze"], ["hang"]])
def test_names_with_line_breaks_stay_on_their_line(newline_run: Path, args: list[str]) -> None:
    """Tables, findings and `name: value` lines: a name can neither start a line nor split a cell."""
    res = CliRunner().invoke(main, [*args, str(newline_run)])
    assert res.exit_code == 0, res.output
    out = res.stdout + res.stderr
    assert not re.search(r"(?m)^\W*INJECTED", out), out[:3000]
    assert "\t" not in out and "\u2028" not in out
    _assert_clean(out, args[0])
