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
    res = CliRunner().invoke(main, ["whatif", str(REAL / "kineto" / "hta_trace_filter_sampled_2rank"),
                                    "eplb:redundant=8"])
    assert res.exit_code == 0, res.output
    assert "are outside the run: no plan for it" in res.stdout
