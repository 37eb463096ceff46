"""Findings in order of how much they change the answer, each said once, and caveats only where
they apply: on the real traces (issue 21, item 10)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracekit.workflows import analyze
from tracekit.workflows import open as open_run

REAL = Path(__file__).parents[2].parent / "shared" / "real_traces"
FR_HANG = REAL / "flight_recorder" / "gloo_torch2.13_cpu" / "missing_rank" / "json"
NO_COMM = REAL / "kineto" / "hta_edge_cases" / "event_sync_trace.json.gz"
ONE_RANK = REAL / "kineto" / "tracelens_b200_eager_rank0of8"


def _kinds(path: Path, tmp: Path) -> list:
    if not path.exists():
        pytest.skip(f"real traces not present at {path}")
    return analyze(open_run([path], cache=tmp / "run"), write=False).findings


def test_hang_verdict_comes_before_the_hosts_caveat(tmp_path: Path) -> None:
    """Before: 'The traces name no rank's host' second, ahead of 'Start with rank 1'."""
    found = _kinds(FR_HANG, tmp_path)
    kinds = [f.kind for f in found]
    assert kinds[0] == "hang" and found[0].text.startswith("Start with rank 1")
    assert kinds.index("unknown_hosts") > max(i for i, k in enumerate(kinds) if k == "hang")


def test_single_gpu_trace_without_communication_has_no_hosts_caveat(tmp_path: Path) -> None:
    found = _kinds(NO_COMM, tmp_path)
    assert "unknown_hosts" not in [f.kind for f in found]
    assert found and found[0].kind == "exposed_comm"


def test_one_rank_run_is_not_told_its_calls_are_paired_by_order(tmp_path: Path) -> None:
    """Before: '73 of 74 collective calls carry no process group; they are matched by call order'."""
    found = _kinds(ONE_RANK, tmp_path)
    assert "no_group" not in [f.kind for f in found]
    assert len({(f.kind, f.text) for f in found}) == len(found)
