"""What `ingest`, `info` and `analyze` print: one regression test per CLI defect of issue 12,
on the bundled gloo sample (always present) and the real Flight Recorder dumps (when present)."""

from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from tracekit._text import fmt_ns, fmt_rate, grouped_warnings, short_paths
from tracekit.cli import main
from tracekit.cli.ingest import sources_table
from tracekit.ingest import ingest
from tracekit.results import from_builtins
from tracekit.runinfo import SourceInfo

REPO = Path(__file__).resolve().parents[2]
GLOO = REPO / "sample_traces" / "gloo_moe_8rank"
FR = REPO.parent / "shared" / "real_traces" / "flight_recorder" / "gloo_torch2.13_cpu" / "type_mismatch"


def run_cli(*args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(main, list(args))
    return res.exit_code, res.stdout, res.stderr


@pytest.fixture(scope="module")
def gloo_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gloo") / "run"
    ingest([str(GLOO)], out)
    return out


def test_ingest_table_keeps_every_number_at_80_columns(gloo_run: Path) -> None:
    """Regression: at 80 columns the table cut numbers ("2,460" showed "2,4") and dropped columns."""
    doc = json.loads(run_cli("info", str(gloo_run), "--json")[1])
    console = Console(width=80, record=True, markup=False, highlight=False)
    console.print(sources_table(from_builtins(doc["sources"], list[SourceInfo])))
    text = console.export_text()
    assert all(len(line) <= 80 for line in text.splitlines())
    header = text.splitlines()[0]
    for col in ("source", "format", "ranks", "stored", "skipped"):
        assert col in header
    for s in doc["sources"]:
        assert f" {s['stored']:,} " in text and f" {sum(s['skipped'].values()):,}" in text


def test_same_named_files_are_told_apart(tmp_path: Path) -> None:
    """Regression: same-named files in different folders were indistinguishable in the table."""
    for i, folder in enumerate(("a", "b")):
        (tmp_path / folder).mkdir()
        shutil.copy(GLOO / f"rank{i}.node0.pt.trace.json.gz", tmp_path / folder / "trace.json.gz")
    code, out, _ = run_cli("ingest", str(tmp_path / "a"), str(tmp_path / "b"), "-o", str(tmp_path / "run"))
    assert code == 0 and "a/trace.json.gz" in out and "b/trace.json.gz" in out
    assert short_paths(["/x/fr/json/rank_0.json", "/x/fr/pickle/rank_0"]) == {
        "/x/fr/json/rank_0.json": "rank_0.json", "/x/fr/pickle/rank_0": "rank_0"}


def test_info_says_each_warning_once(gloo_run: Path) -> None:
    """Regression: info repeated each warning per source (33 lines where ingest printed 3)."""
    out = run_cli("info", str(gloo_run))[1]
    warnings = [ln for ln in out.splitlines() if ln.startswith("warning:")]
    assert len(warnings) == len(set(warnings)) and len(warnings) <= 4
    assert any(ln.startswith("warning: 16 sources: ") for ln in warnings)
    assert grouped_warnings([("a", ["w"]), ("b", ["w"]), ("c", ["v"])]) == ["2 sources: w", "c: v"]


def test_ingest_json(tmp_path: Path) -> None:
    """Regression: ingest had no --json."""
    code, out, _ = run_cli("ingest", str(GLOO), "-o", str(tmp_path / "run"), "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["ranks"] == list(range(8)) and doc["validity"]["world_size"] == 8
    assert sum(1 for s in doc["sources"] if s["format"] == "kineto") == 8
    assert all(s["read"] == s["stored"] + sum(s["skipped"].values()) for s in doc["sources"] if not s["error"])


def test_analyze_explains_its_columns_and_formats_bandwidth_one_way(gloo_run: Path) -> None:
    """Regression: busbw mixed formats (0.121, 3.12e-05, 44.7); delay/caused/excess were unexplained."""
    out = run_cli("analyze", str(gloo_run), "--no-write")[1]
    assert "delay: the waits of the collectives where the rank was last; caused:" in out
    assert "excess: the part beyond the step's usual pattern" in out
    bandwidth = out.split("Bandwidth (median per group and op)")[1].split("busbw: algbw")[0]
    rates = re.findall(r"│\s+([^│]+?)\s*$", bandwidth, re.M)
    assert rates and all(re.fullmatch(r"\d+(\.\d+)? (GB|MB|KB)/s", r) for r in rates), rates
    assert "e-0" not in out
    assert fmt_rate(3.12e-05) == "31.2 KB/s" and fmt_ns(45_481_000) == "45.5 ms"


def test_root_cause_is_printed_with_its_chain(gloo_run: Path) -> None:
    """Regression: "the longest wait was 89.7 ms, waiting for rank 7" named a pipeline peer that was
    itself blocked; the injected straggler (truth.json) is rank 5."""
    out = run_cli("analyze", str(gloo_run), "--no-write")[1]
    first = out.splitlines()[1]
    assert re.search(r"rank 3 waited [\d.]+ ms at PP send/recv #3 .* for rank 7; rank 7 was late because it "
                     r"waited for rank 5; rank 5 was busy [\d.]+ ms with its own work", first), first
    table = out.split("Stalls by root cause")[1].split("root: the rank at the end")[0]
    assert re.search(r"^\s+5 │\s+2 │", table, re.M)  # the cascade is one row, rooted at rank 5 in step 2


def test_no_step_none_on_flight_recorder_runs(tmp_path: Path) -> None:
    """Regression: `step None` was printed on Flight Recorder-only runs."""
    if not FR.is_dir():
        pytest.skip(f"{FR} not present")
    ingest([str(FR / "pickle")], tmp_path / "run")
    out = run_cli("analyze", str(tmp_path / "run"), "--no-write")[1]
    assert "None" not in out and "rank 3 is the one to look at" in out


def test_one_rank_of_eight_is_said(tmp_path: Path) -> None:
    """Regression: rank 0 of an 8-rank job was "idle 76% of its step time, the most of any rank",
    never "1 of 8 ranks present"."""
    src = tmp_path / "in"
    src.mkdir()
    text = gzip.decompress((GLOO / "rank0.node0.pt.trace.json.gz").read_bytes())
    (src / "rank0.json.gz").write_bytes(gzip.compress(text))
    code, _, err = run_cli("ingest", str(src), "-o", str(tmp_path / "run"))
    assert code == 0 and "1 of 8 ranks present (missing: 1-7)" in err
    out = run_cli("analyze", str(tmp_path / "run"), "--no-write")[1]
    assert "1 of 8 ranks present (missing: 1-7): cross-rank findings" in out
    assert "the most of any rank" not in out
    info = run_cli("info", str(tmp_path / "run"))[1]
    assert "(1 of 8 present; missing 1-7)" in info
