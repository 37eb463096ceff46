"""Setup differences: NCCL's channels and NICs, and per-link telemetry where both runs have it."""

from __future__ import annotations

import polars as pl
import pyarrow as pa
from diff_helpers import synth

from tracekit import schema
from tracekit.diff import diff_runs
from tracekit.diff.setup import telemetry_items


def _samples(util: dict[str, list[float]]) -> pl.DataFrame:
    rows = [{"link": link, "ts_ns": i * 1_000_000, "tx_util": u, "rx_util": u / 2, "origin": "telemetry"}
            for link, us in util.items() for i, u in enumerate(us)]
    rows.append({"link": "leaf0:p1", "ts_ns": 0, "tx_util": 1.0, "rx_util": 1.0, "origin": "replay:x"})  # not telemetry
    return pl.DataFrame(rows)


def _counters(pauses: float) -> pl.DataFrame:
    return pl.DataFrame({"ts_ns": [0, 2_000_000_000], "device": ["leaf0"] * 2, "port": ["1"] * 2,
                         "metric": ["pfc_pause"] * 2, "value": [100.0, 100.0 + pauses]})


def test_telemetry_link_utilization_and_congestion_counters():
    items = telemetry_items(_samples({"leaf0:p1": [0.2, 0.4], "leaf0:p2": [0.1, 0.1]}),
                            _samples({"leaf0:p1": [0.9, 0.7], "leaf0:p2": [0.1, 0.1]}),
                            _counters(10), _counters(5000))
    assert items == [("link utilization (mean)", "20%", "45%"), ("busiest link", "leaf0:p1 30%", "leaf0:p1 80%"),
                     ("pfc_pause per second", "5", "2.5e+03")]


def test_no_telemetry_comparison_unless_both_runs_have_it():
    assert telemetry_items(_samples({"l": [0.5]}), None, _counters(1), None) == []


def _channels(n: int) -> pa.Table:
    rows = {"group": [], "rank": [], "channel": [], "pattern": [], "nic": [], "detail": [], "proxy_rank": []}
    for r in range(16):
        for c in range(n):
            for k, v in (("group", "1"), ("rank", r), ("channel", c), ("pattern", "ring"), ("nic", f"mlx5_{r % 8}"),
                         ("detail", "IB/0/GDRDMA"), ("proxy_rank", r)):
                rows[k].append(v)
    return schema.conform("channels", rows)


def test_fewer_channels_lead_the_setup_changes(base_tables):
    a = {**base_tables, "channels": _channels(16)}
    b = {**synth(), "channels": _channels(4)}
    d = diff_runs(a, b)
    assert [(s.item, s.a, s.b) for s in d.setup] == [("channels", "16", "4")]
    assert d.verdict.endswith("; but channels: 16 in A, 4 in B"), d.verdict


def test_telemetry_from_the_traces_names_the_loaded_host(tmp_path):
    """Kineto traces plus switch telemetry (ibnetdiscover and Prometheus), B with background load
    on node001's cable: the job's step does not move, the busiest link does."""
    from click.testing import CliRunner

    from tracekit.cli import main

    runner = CliRunner()
    common = ["--hosts", "2", "--gpus", "4", "--steps", "3", "--straggler", "-1", "--format", "kineto", "--telemetry"]
    assert runner.invoke(main, ["synth", "-o", str(tmp_path / "a"), *common]).exit_code == 0
    assert runner.invoke(main, ["synth", "-o", str(tmp_path / "b"), *common,
                                "--background", "node001=20000000000"]).exit_code == 0
    from tracekit import workflows

    d = workflows.diff(tmp_path / "a", tmp_path / "b")  # raw traces: the front door ingests them
    items = {s.item: (s.a, s.b) for s in d.setup}
    assert items["busiest link"][1].startswith("node001/") and items["busiest link"][1].endswith("%")
    assert float(items["link utilization (mean)"][1][:-1]) > float(items["link utilization (mean)"][0][:-1])
    assert d.verdict.startswith("no significant change: step +0 ns") and "; but busiest link: " in d.verdict
