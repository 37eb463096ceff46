"""One rule for exposed communication per dim: the analysis (Overlap tab), the identity replay and
the baseline replay of a run with nothing to simulate give the same figure, on the real traces and
the bundled samples. Before: DeepSeek's train.json EP 98.6 ms comm / 2.20 ms exposed in the
analysis against 113.4 / 4.19 ms in the replay; MI300 ResNet DP exposed 7.93 against 11.74 ms."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from tracekit.analysis import analyze, prepare
from tracekit.analysis.breakdown import mean_exposure
from tracekit.replay.engine import identity, replay
from tracekit.viz import data as D
from tracekit.workflows import open as open_run

ROOT = Path(__file__).parents[2]
REAL = ROOT.parent / "shared" / "real_traces" / "kineto"
ONE_RANK = [REAL / "tracelens_b200_eager_rank0of8", REAL / "tracelens_mi300_resnet_rank0of8"]
MULTI_RANK = [REAL / "param_dlrm_kineto_8rank", REAL / "hta_trace_filter_sampled_2rank"]
SAMPLES = [ROOT / "sample_traces" / "gloo_moe_8rank", ROOT / "sample_traces" / "synth_moe_16rank"]


def _close(a: dict[str, int], b: dict[str, int], rel: float = 0.01) -> bool:
    return set(a) == set(b) and all(abs(a[d] - b[d]) <= rel * max(abs(a[d]), 1) for d in a)


def _analysis(path: Path, cache: Path):
    if not path.exists():
        pytest.skip(f"real traces not present at {path}")
    run = open_run([path], cache=cache)
    res = analyze(run, write=False)
    return run, res, mean_exposure(pl.from_arrow(res.per_rank_step), pl.from_arrow(res.per_rank_step_dim))


@pytest.mark.parametrize("path", SAMPLES + MULTI_RANK + ONE_RANK, ids=lambda p: p.name)
def test_identity_replay_gives_the_analysis_exposure(path: Path, tmp_path: Path) -> None:
    run, res, analysed = _analysis(path, tmp_path / "run")
    assert analysed.exposed_ns, "no communication measured"
    ident = identity(prepare(run, write=False))
    assert _close(ident.comm_ns, analysed.comm_ns) and _close(ident.exposed_ns, analysed.exposed_ns)
    overlap = D.overlap_data(res)
    assert overlap is not None
    n_ranks = len(overlap.ranks)
    for d, ns in analysed.exposed_ns.items():  # the Overlap tab's legend: exposed ms per rank and step
        assert overlap.totals_ms[D.norm_dim(d)][1] / n_ranks == pytest.approx(ns / 1e6, rel=0.01)


@pytest.mark.parametrize("path", ONE_RANK, ids=lambda p: p.name)
def test_baseline_replay_with_nothing_simulated_gives_the_analysis_exposure(path: Path, tmp_path: Path) -> None:
    """One profiled rank: nothing moves, so the baseline's exposure is the traced one (MI300 before:
    DP comm 15.71 ms, exposed 11.74 ms per step, against the analysis' 10.58 and 7.93)."""
    run, _, analysed = _analysis(path, tmp_path / "run")
    base = replay(prepare(run, write=False), ["rail-optimized"]).results[0]
    assert base.comm_ns == analysed.comm_ns and base.exposed_ns == analysed.exposed_ns
    rd = D.replay_data(replay(prepare(run, write=False), ["rail-optimized"]))
    assert rd is not None
    assert {d: v for d, v in rd.exposed_ms["rail-optimized"].items()} == pytest.approx(
        {D.norm_dim(d): ns / 1e6 for d, ns in analysed.exposed_ns.items()}, rel=0.01)


def test_dlrm_baseline_replay_is_within_one_percent_of_the_analysis(tmp_path: Path) -> None:
    """Eight ranks, simulated: the replayed timeline moves a little, its exposure by under 1%."""
    run, _, analysed = _analysis(REAL / "param_dlrm_kineto_8rank", tmp_path / "run")
    base = replay(prepare(run, write=False), ["rail-optimized"]).results[0]
    assert _close(base.comm_ns, analysed.comm_ns) and _close(base.exposed_ns, analysed.exposed_ns)


def test_exposure_on_a_slower_network_is_measured_on_the_replayed_timeline() -> None:
    """A 2-rank all-reduce after compute, replayed 8x slower: its step window stretches with it, so
    the exposed time is the replayed all-reduce, not the traced one cut at the traced window."""
    from hand_traces import BASE, NBYTES, PHYSICS_NS, SLOW8, Trace

    tr = Trace()
    for r in (0, 1):
        tr.kernel(r, "gpu0/stream7", "compute", 0, 1_000_000)
        tr.kernel(r, "gpu0/stream20", "comm", 1_000_000, PHYSICS_NS,
                  coll=tr.collective(0, "all_reduce", "dp", 0, r, nbytes=NBYTES))
    base, slow = replay(tr.tables(), [BASE, SLOW8]).results
    assert base.exposed_ns == base.comm_ns == {"DP": PHYSICS_NS}
    replayed = slow.instances[0].replayed_ns
    assert replayed > 4 * PHYSICS_NS
    assert slow.exposed_ns == slow.comm_ns and slow.exposed_ns["DP"] == pytest.approx(replayed, rel=0.01)
