"""Dims that mean what they say on real jobs (issue 21, item 11): DLRM's embedding all-to-all is
not expert parallelism, MI300's arg-less RCCL kernels take their group's reduction dim instead of a
WORLD beside DP, and a Flight Recorder hang whose all-to-alls recorded no splits gets no EP tab."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from tracekit.analysis import analyze
from tracekit.analysis.classify import embedding_all_to_all
from tracekit.workflows import open as open_run

REAL = Path(__file__).parents[2].parent / "shared" / "real_traces"
DLRM = REAL / "kineto" / "param_dlrm_kineto_8rank"
MI300 = REAL / "kineto" / "tracelens_mi300_resnet_rank0of8"
FR_HANG = REAL / "flight_recorder" / "gloo_torch2.13_cpu" / "missing_rank" / "json"


def _run(path: Path, tmp: Path):
    if not path.exists():
        pytest.skip(f"real traces not present at {path}")
    return open_run([path], cache=tmp / "run")


def test_dlrm_embedding_all_to_all_is_not_ep(tmp_path: Path) -> None:
    """Before: 40 all-to-all calls 'EP', an EP tab and `whatif eplb` '1.00 -> 1.00' on even splits."""
    res = analyze(_run(DLRM, tmp_path), write=False)
    coll = pl.from_arrow(res.collectives)
    a2a = coll.filter(pl.col("op") == "all_to_all")
    assert a2a.height == 40 and set(a2a.get_column("dim").cast(pl.String).to_list()) == {"OTHER"}
    assert res.ep_groups.num_rows == 0
    assert not any("EP" in f.text.split() for f in res.findings)


def test_whatif_eplb_on_dlrm_says_its_all_to_all_is_not_ep(tmp_path: Path) -> None:
    from tracekit.errors import TracekitError
    from tracekit.workflows import whatif

    with pytest.raises(TracekitError, match="its 40 all-to-all calls are OTHER, not expert parallelism"):
        whatif(_run(DLRM, tmp_path), ["eplb:redundant=1"])


def test_embedding_rule_needs_embeddings_and_no_experts() -> None:
    assert embedding_all_to_all(["## KJTAllToAll ##", "nccl:all_to_all"])
    assert not embedding_all_to_all(["## KJTAllToAll ##", "moe_layer.experts.0"])
    assert not embedding_all_to_all(["nccl:all_to_all", None])


def test_mi300_argless_kernels_take_the_groups_reduction_dim(tmp_path: Path) -> None:
    """Before: 'exposed communication took 63% (DP 34%, WORLD 29%)' on one group of 8."""
    res = analyze(_run(MI300, tmp_path), write=False)
    coll = pl.from_arrow(res.collectives).with_columns(pl.col("op").cast(pl.String), pl.col("dim").cast(pl.String))
    assert set(coll.filter(pl.col("op") == "other").get_column("dim").to_list()) == {"DP"}
    (exposed,) = [f for f in res.findings if f.kind == "exposed_comm"]
    assert exposed.data["by_dim"]["DP"] > 0.6 and exposed.data["by_dim"].get("WORLD", 0) < 0.01


def test_flight_recorder_hang_with_no_splits_gets_no_ep_tab(tmp_path: Path) -> None:
    from tracekit.workflows import report_data as build_report_data

    run = _run(FR_HANG, tmp_path)
    res = analyze(run, write=True)
    assert res.ep_groups.num_rows == 1 and "assumed_splits" in [f.kind for f in res.findings]
    tabs = build_report_data(run.path if hasattr(run, "path") else tmp_path / "run").tabs
    assert "EP" not in tabs and "Hang" in tabs
