"""Run validity: which sources form one job, what a run lacks, and how each finding says so."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracekit.ingest import ingest
from tracekit.validity import MAX_GAP_NS, MixedRunError, SourceJob, check_sources, group_jobs, run_validity

HOUR = 3_600 * 10**9
REPO = Path(__file__).resolve().parents[2]
REAL = REPO.parent / "shared" / "real_traces"


def src(path: str, ranks: tuple[int, ...], world: int | None = 8, start: int | None = 0,
        groups: dict[str, tuple[int, ...]] | None = None) -> SourceJob:
    return SourceJob(path=path, ranks=ranks, world_size=world, groups=groups or {}, start_ns=start,
                     end_ns=None if start is None else start + 10**9)


def test_one_job_when_nothing_disagrees() -> None:
    jobs = group_jobs([src("a", (0,)), src("b", (1,), world=None), src("c", (2,), start=None),
                       src("d", (3,), start=MAX_GAP_NS // 2)])
    assert len(jobs) == 1 and jobs[0].ranks == [0, 1, 2, 3] and jobs[0].world_size == 8


@pytest.mark.parametrize("other", [
    src("b", (1,), world=16),
    src("b", (1,), start=2 * MAX_GAP_NS),
    src("b", (1,), groups={"0": (0, 1, 2)}),
])
def test_sources_that_disagree_are_two_jobs(other: SourceJob) -> None:
    first = src("a", (0,), groups={"0": (0, 1, 2, 3)})
    assert len(group_jobs([first, other])) == 2
    with pytest.raises(MixedRunError, match=r"2 different jobs.*--allow-mixed"):
        check_sources([first, other])
    v = check_sources([first, other], allow_mixed=True)
    assert v.mixed and any(f.kind == "mixed_jobs" and f.severity == "error" for f in v.findings())


def test_a_rank_with_sources_from_two_jobs_is_refused_even_when_mixing() -> None:
    a, b = src("a.json", (1,), world=8), src("b.json", (1,), world=2, start=3 * 365 * 24 * HOUR)
    with pytest.raises(MixedRunError, match=r"rank 1 has sources from two of them: a.json .* and b.json"):
        check_sources([a, b], allow_mixed=True)


def test_partial_run_and_unknown_hosts_say_so() -> None:
    v = check_sources([src("a", (0,))], hosts={0: None})
    assert v.presence() == "1 of 8 ranks present" and v.missing_ranks == list(range(1, 8))
    kinds = {f.kind: f for f in v.findings()}
    assert kinds["partial_run"].text.startswith("1 of 8 ranks present (missing: 1-7): cross-rank findings")
    assert kinds["unknown_hosts"].ranks == (0,)
    two = check_sources([src("a", (0,)), src("b", (1,))], hosts={0: "h", 1: "h"})
    assert two.cross_rank and "may be the one the others waited for" in two.findings()[0].text
    assert "unknown_hosts" not in {f.kind for f in two.findings()}


def test_whole_real_trace_folder_is_refused(tmp_path: Path) -> None:
    """Regression: ingesting the whole real-trace folder merged 21 traces from different jobs
    (worlds 1 to 300, 3.5 years apart) and analyze reported a delay of 203,975,728 s."""
    if not REAL.is_dir():
        pytest.skip(f"{REAL} not present")
    with pytest.raises(MixedRunError, match=r"different jobs, and rank \d+ has sources from two of them"):
        ingest([str(REAL)], tmp_path / "run")


def test_dlrm_with_another_job_is_refused(tmp_path: Path) -> None:
    """Regression: DLRM plus another job silently gave rank 1 two sources."""
    dlrm = REAL / "kineto" / "param_dlrm_kineto_8rank"
    other = REAL / "kineto" / "hta_trace_diff_test"
    if not (dlrm.is_dir() and other.is_dir()):
        pytest.skip("real traces not present")
    with pytest.raises(MixedRunError, match="rank 1 has sources from two of them"):
        ingest([str(dlrm), str(other)], tmp_path / "run", allow_mixed=True)
    report = ingest([str(dlrm)], tmp_path / "ok")
    v = run_validity(tmp_path / "ok")
    assert report.validity.world_size == 8 and v.ranks == list(range(8)) and not v.partial
    assert v.hosts_unknown == list(range(8))  # DLRM names no host
