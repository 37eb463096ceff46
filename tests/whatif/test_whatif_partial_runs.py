"""What-ifs on runs that hold less than a job: telemetry alone, or a sampled subset of an EP group."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from tracekit.cli import main

REAL = Path(__file__).resolve().parents[2] / ".." / "shared" / "real_traces"
NO_REAL = pytest.mark.skipif(not REAL.is_dir(), reason="needs ../shared/real_traces")


@NO_REAL
def test_whatif_on_telemetry_alone_says_there_is_nothing_to_replay():
    res = CliRunner().invoke(main, ["whatif", str(REAL / "telemetry" / "prometheus"), "eplb:redundant=8"])
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit)
    assert "nothing to replay" in res.stderr and "Traceback" not in res.stderr


@NO_REAL
def test_eplb_skips_an_ep_group_whose_members_are_outside_the_run():
    """HTA's sampled 2-rank trace holds ranks 0 and 1 of groups of 10; its all-to-alls are an
    embedding exchange (not EP), so EPLB refuses it in one line, and with the group forced to EP
    (`dims`) the plan skips the group rather than failing on the ranks it does not hold."""
    from tracekit.analysis import prepare
    from tracekit.ingest import open_run
    from tracekit.whatif.scenarios import whatif

    path = REAL / "kineto" / "hta_trace_filter_sampled_2rank"
    res = CliRunner().invoke(main, ["whatif", str(path), "eplb:redundant=8"])
    assert res.exit_code == 1 and "not expert parallelism" in res.stderr and "Traceback" not in res.stderr
    run, _ = open_run([path])
    tables = dict(prepare(run, dims="ep=0", write=False))
    (scenario,) = whatif(tables, ["eplb:redundant=8"]).scenarios
    assert any("are outside the run: no plan for it" in note for note in scenario.notes)
    assert "no EP group could be planned: nothing was rebalanced" in scenario.notes
    assert not any(note.startswith("EPLB policy: (") for note in scenario.notes)
