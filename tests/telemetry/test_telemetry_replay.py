"""End to end: Kineto traces, the fabric and switch counters in one directory -> one run; replay on the
observed fabric checked against the counters. The counters come from closed forms of the job's
traffic (tracekit.telemetry.synth), not from replay."""

import numpy as np
import polars as pl
import pytest

from tracekit.ingest import ingest
from tracekit.store import Run
from tracekit.synth import make_run_tables, write_kineto
from tracekit.telemetry.synth import write_switch_telemetry
from tracekit.workflows import replay as replay_run

BACKGROUND = {"node003": 2e9}  # bytes/s each way on node003's HCA cable: north-south load


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    src = tmp_path_factory.mktemp("job")
    tables, _ = make_run_tables(hosts=4, gpus_per_host=2, steps=24)
    write_kineto(tables, src)
    # Scrapes several steps long (real ones span thousands): where a collective's bytes fall
    # inside its interval moves them across a window edge by a small share of the window.
    made = write_switch_telemetry(tables, src, background=BACKGROUND, interval_ns=100_000_000)
    out = tmp_path_factory.mktemp("run") / "run"
    ingest([src], out)
    result = replay_run(out, ["observed"], algo="ring")
    return Run(out), made, result


def test_one_run_has_every_table(replayed):
    run, _, _ = replayed
    for name in ("events", "collectives", "ranks", "counters", "link_samples", "topology_nodes", "topology_links"):
        assert run.has(name) and run.table(name).num_rows, name
    origins = set(run.table("link_samples").column("origin").cast("string").to_pylist())
    assert {"telemetry", "replay:observed"} <= origins


def test_measured_bytes_are_the_job_s_plus_the_background(replayed):
    run, made, _ = replayed
    tel = pl.from_arrow(run.table("link_samples")).filter(pl.col("origin").cast(pl.String) == "telemetry")
    step = (made.scrape_ns[1] - made.scrape_ns[0]) / 1e9
    for (host, nic), truth in made.tx_bytes.items():
        rows = tel.filter(pl.col("link").cast(pl.String).str.starts_with(f"{host}/mlx5_{nic}:")).sort("ts_ns")
        assert rows.height == len(truth)
        # The leaf port faces the HCA: its received bytes are what the HCA sent.
        want = truth + BACKGROUND.get(host, 0.0) * step
        assert np.allclose(rows["rx_bytes"].to_numpy(), want, atol=len(truth))
        assert rows["flags"].list.len().sum() == 0


def test_replay_matches_the_counters_where_there_is_no_background(replayed):
    _, _, result = replayed
    cmp = result.telemetry
    assert cmp is not None and cmp.topology == "observed" and len(cmp.links) == 4
    win = pl.from_arrow(cmp.windows)
    checked = 0
    for link in ("node000/mlx5_0:1--leaf0:1", "node001/mlx5_0:1--leaf0:2", "node002/mlx5_0:1--leaf1:1"):
        rows = win.filter(pl.col("link") == link)
        busy = rows.filter(pl.col("measured_bytes") >= 0.25 * rows["measured_bytes"].max())
        err = ((busy["replayed_bytes"] - busy["measured_bytes"]).abs() / busy["measured_bytes"]).to_numpy()
        assert (err <= 0.10).all(), (link, err)
        checked += busy.height
        total = next(a for a in cmp.links if a.link == link)
        assert total.explained_share == pytest.approx(1.0, abs=0.05)
    assert checked >= 9


def test_the_background_shows_up_as_unexplained_bytes(replayed):
    _, made, result = replayed
    cmp = result.telemetry
    link = next(a for a in cmp.links if a.link == "node003/mlx5_0:1--leaf1:2")
    quiet = next(a for a in cmp.links if a.link == "node002/mlx5_0:1--leaf1:1")  # same work, no background
    step = (made.scrape_ns[1] - made.scrape_ns[0]) / 1e9
    background = 2 * BACKGROUND["node003"] * step * link.windows
    assert link.unexplained_bytes == pytest.approx(background, abs=0.1 * link.measured_bytes)
    assert link.explained_share < quiet.explained_share - 0.05
    assert cmp.links[0].link == "node003/mlx5_0:1--leaf1:2"  # disagrees most
