"""Telemetry next to traces in one run, and `tracekit info` / `ingest` output for it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from click.testing import CliRunner
from telemetry_helpers import T0_MS, prom_line

from tracekit.cli import main
from tracekit.ingest import ingest
from tracekit.store import Run

SAMPLE = Path(__file__).parents[2] / "sample_traces" / "gloo_moe_8rank"
FABRIC = """\
CA   134  1 0x7cfe9003003b4bde 4x EDR - SW  1719 10 0x7cfe9003009ce5b0 ( 'o0001 HCA-1' - 'ib-i1l1s01' )
SW  1719  1 0x7cfe9003009ce5b0 4x EDR - SW  1516  1 0x7cfe900300b07320 ( 'ib-i1l1s01' - 'ib-i1l2s01' )
"""


def _telemetry(directory: Path) -> None:
    directory.mkdir(parents=True)
    (directory / "fabric.txt").write_text(FABRIC)
    (directory / "fabric-again.txt").write_text(FABRIC.splitlines()[1] + "\n")  # one link seen twice
    lines = ["# TYPE ifHCOutOctets counter"]
    for k, v in enumerate((0, 10**9, 3 * 10**9, 100, 2 * 10**9)):  # a reset before the 4th scrape
        lines.append(prom_line("ifHCOutOctets", {"instance": "leaf9", "ifName": "Ethernet1"}, v, T0_MS + 10_000 * k))
    lines.append(prom_line("ifHighSpeed", {"instance": "leaf9", "ifName": "Ethernet1"}, 100_000, T0_MS))
    (directory / "leaf9.prom").write_text("\n".join(lines) + "\n")


def test_traces_and_telemetry_make_one_run(tmp_path):
    _telemetry(tmp_path / "tel")
    shutil.copytree(SAMPLE, tmp_path / "in" / "traces")
    shutil.copytree(tmp_path / "tel", tmp_path / "in" / "tel")
    report = ingest([tmp_path / "in"], tmp_path / "run")
    assert not report.failed
    run = Run(tmp_path / "run")
    assert run.table("ranks").num_rows == 8 and run.table("collectives").num_rows > 0
    assert run.table("counters").num_rows == 6
    assert sorted(run.table("topology_links").column("link").to_pylist()) == [
        "ib-i1l1s01:1--ib-i1l2s01:1", "o0001/HCA-1:1--ib-i1l1s01:10"]  # the repeated link once
    samples = run.table("link_samples").to_pylist()
    assert [s["tx_bytes"] for s in samples] == [1e9, 2e9, None, 2e9 - 100]
    assert samples[2]["flags"] == ["reset"]
    assert run.manifest.tables["link_samples"] == 4
    assert run.manifest.ranks == list(range(8))
    # re-ingest: every source is a cache hit and the tables come out the same
    again = ingest([tmp_path / "in"], tmp_path / "run")
    assert all(s.cached for s in again.ingested)
    assert Run(tmp_path / "run").table("link_samples").to_pylist() == samples


def test_info_lists_links_and_flagged_windows(tmp_path):
    _telemetry(tmp_path / "tel")
    runner = CliRunner()
    result = runner.invoke(main, ["ingest", str(tmp_path / "tel"), "-o", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert "prometheus" in result.output and "ibnetdiscover" in result.output
    result = runner.invoke(main, ["info", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert "links (telemetry)" in result.output
    assert "leaf9:Ethernet1" in result.output
    assert "tx_bytes:reset" in result.output
    assert "1.6%" in result.output  # peak: 2e9 bytes in a 10 s window on 100 Gb/s
    doc = json.loads(runner.invoke(main, ["info", str(tmp_path / "run"), "--json"]).output)
    (link,) = doc["telemetry"]["links"]
    assert link["windows"] == 4 and link["flagged_windows"] == 1
    assert link["flagged"][0]["reasons"] == ["tx_bytes:reset"]
    assert link["peak_util"] == 2e9 * 8 / (100e9 * 10)
    assert doc["telemetry"]["stats"]["read"] == 6


def test_counters_of_one_and_of_several_sources_are_all_committed(tmp_path):
    """The rating takes the merged `counters` over; the commit still writes every row: copied
    from the part of a lone source, re-encoded from the merge of several."""
    from pitfall_inputs import write_pitfalls

    files = write_pitfalls(tmp_path / "in")
    for name, given in (("one", files[:1]), ("several", files)):
        report = ingest(given, tmp_path / name, jobs=1)
        stored = sum(s.stored for s in report.sources)
        run = Run(tmp_path / name)
        assert run.table("counters").num_rows == report.tables["counters"] == stored > 0
        assert run.table("link_samples").num_rows == report.tables["link_samples"] > 0
