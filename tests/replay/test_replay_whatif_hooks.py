"""The replay hooks what-ifs use: a fixed calibration, an explicit placement, replayed durations."""

import numpy as np
import pyarrow as pa
import pytest

from tracekit.replay import replay
from tracekit.replay.calibration import FITTED, INTERPOLATED, NO_FLOWS, UNCALIBRATED, applied
from tracekit.replay.engine import ReplayError

T0 = 1_700_000_000_000_000_000


def _tables():
    """Two ranks on two hosts: an all-reduce, then 1 ms of compute that waits for it."""
    ev = {"rank": [0, 1, 0, 1], "lane": ["s20", "s20", "s7", "s7"], "kind": ["comm", "comm", "compute", "compute"],
          "name": ["ar", "ar", "k", "k"], "ts_ns": [T0, T0, T0 + 2_000_000, T0 + 2_000_000],
          "dur_ns": [2_000_000, 2_000_000, 1_000_000, 1_000_000], "step": [0] * 4, "coll_id": [0, 1, None, None]}
    coll = {"coll_id": [0, 1], "rank": [0, 1], "group": ["dp", "dp"], "seq": [0, 0], "op": ["all_reduce"] * 2,
            "in_bytes": [50_000_000] * 2, "out_bytes": [50_000_000] * 2, "nranks": [2, 2], "instance": [0, 0],
            "dim": ["DP", "DP"]}
    ranks = {"rank": [0, 1], "host": ["a", "b"], "local_device": [0, 0], "clock_offset_ns": [0, 0]}
    return {"events": pa.table(ev), "collectives": pa.table(coll), "ranks": pa.table(ranks),
            "groups": pa.table({"group": ["dp"], "ranks": [[0, 1]], "size": [2]})}


def test_applied_calibration_predicts_without_fitting():
    cal = applied(["all_reduce", "all_reduce", "all_reduce", "send"], np.array([2.0**20, 2.0**22, 2.0**26, 5.0]),
                  np.array([1.0, 1.0, 0.0, 1.0]), {"all_reduce:2^20": 2.0, "all_reduce:2^24": 4.0})
    assert cal.in_sample.tolist() == [2.0, 3.0, 1.0, 1.0]
    assert cal.in_sample_source == [FITTED, INTERPOLATED, NO_FLOWS, UNCALIBRATED]
    assert cal.split == "fixed" and cal.efficiency == {"all_reduce:2^20": 2.0, "all_reduce:2^24": 4.0}


def test_fixed_efficiency_is_not_refitted():
    topo = "single-switch:gpus=1,pcie_gbps=2000"
    base = replay(_tables(), [topo])
    doubled = {k: 2 * v for k, v in base.efficiency.items()}
    twice = replay(_tables(), [topo], efficiency=doubled)
    r0, r1 = base.results[0].instances[0].replayed_ns, twice.results[0].instances[0].replayed_ns
    assert r1 == pytest.approx(2 * r0, rel=1e-6)


def test_replayed_duration_moves_the_step_by_the_change():
    tables = _tables()
    base = replay(tables, ["single-switch:gpus=1"])
    ev = tables["events"]
    tables["events"] = ev.append_column("replay_dur_ns", pa.array([None, None, 400_000, 1_000_000], pa.int64()))
    shorter = replay(tables, ["single-switch:gpus=1"], efficiency=base.efficiency)
    assert base.results[0].step_ns["0"] - shorter.results[0].step_ns["0"] == pytest.approx(0, abs=1)
    tables["events"] = ev.append_column("replay_dur_ns", pa.array([None, None, 400_000, 400_000], pa.int64()))
    both = replay(tables, ["single-switch:gpus=1"], efficiency=base.efficiency)
    assert base.results[0].step_ns["0"] - both.results[0].step_ns["0"] == pytest.approx(600_000, abs=1)


def test_explicit_placement():
    on_one_host = replay(_tables(), ["single-switch:gpus=2"], placement={0: (0, 0), 1: (0, 1)})
    assert "nic-leaf" not in on_one_host.results[0].tier_bytes
    apart = replay(_tables(), ["single-switch:gpus=2"], placement={0: (0, 0), 1: (1, 0)})
    assert apart.results[0].tier_bytes["nic-leaf"] == {"DP": 2 * 50_000_000}
    with pytest.raises(ReplayError, match=r"no \(host, gpu\) for rank\(s\) \[1\]"):
        replay(_tables(), ["single-switch:gpus=2"], placement={0: (0, 0)})
    with pytest.raises(ReplayError, match="same"):
        replay(_tables(), ["single-switch:gpus=2"], placement={0: (0, 0), 1: (0, 0)})
