"""Replayed vs measured bytes per link and telemetry window (tracekit.telemetry.compare)."""

import pyarrow as pa
import pytest

from tracekit import schema
from tracekit.results import from_builtins, to_builtins
from tracekit.telemetry.compare import TelemetryComparison, compare_links, format_comparison

S = 1_000_000_000
T0 = 1_767_225_600 * S  # ns since the epoch: too large for a float64 to hold exactly
LINK = "h0/mlx5_0:1--leaf0:1"


def _samples(rows: list[dict]) -> pa.Table:
    cols = {k: [r.get(k) for r in rows] for k in ("link", "device", "port", "ts_ns", "interval_ns", "tx_bytes",
                                                   "rx_bytes", "flags", "origin", "link_end", "speed_bps")}
    cols["flags"] = [f or [] for f in cols["flags"]]
    return schema.conform("link_samples", pa.table(cols))


def _telemetry(ts, tx, rx, *, end="dst", flags=None, link=LINK, interval=10 * S):
    return {"link": link, "device": "leaf0", "port": "1", "ts_ns": ts, "interval_ns": interval, "tx_bytes": tx,
            "rx_bytes": rx, "flags": flags, "origin": "telemetry", "link_end": end, "speed_bps": 400e9}


def _replay(ts, tx, rx, *, link=LINK, interval=4 * S, name="observed"):
    return {"link": link, "device": "h0/mlx5_0", "port": "leaf0", "ts_ns": ts, "interval_ns": interval,
            "tx_bytes": tx, "rx_bytes": rx, "origin": f"replay:{name}"}


def test_replay_windows_are_rebinned_onto_telemetry_windows_and_oriented():
    # Replay: 1 GB/s up (src->dst), 0.5 GB/s down, in 4 s windows over [0, 28 s).
    rep = [_replay(T0 + k * 4 * S, 4e9, 2e9) for k in range(7)]
    # Measured at the switch (the dst end): the switch receives what the HCA sends.
    tel = [_telemetry(T0, 1e9, 10e9), _telemetry(T0 + 10 * S, None, None, flags=["reset"]),
           _telemetry(T0 + 20 * S, 1e9, 10e9)]
    out = compare_links(_samples(rep + tel))
    assert out.topology == "observed"
    rows = out.windows.to_pylist()
    assert [r["ts_ns"] for r in rows] == [T0, T0 + 10 * S]  # [20 s, 30 s) is 80% inside the replay: left out
    first, flagged = rows
    assert first["measured_tx"] == 10e9 and first["measured_rx"] == 1e9
    assert first["replayed_tx"] == pytest.approx(10e9) and first["replayed_rx"] == pytest.approx(5e9)
    assert first["unexplained_bytes"] == pytest.approx(11e9 - 15e9)
    assert flagged["measured_bytes"] is None and flagged["flags"] == ["reset"]
    (link,) = out.links
    assert link.windows == 1 and link.flagged_windows == 1
    assert link.measured_bytes == 11e9 and link.replayed_bytes == pytest.approx(15e9)
    assert link.explained_share == pytest.approx(15 / 11)
    assert any("outside the traced span" in n for n in out.notes)


def test_the_end_with_more_usable_windows_is_kept():
    rep = [_replay(T0 + k * 4 * S, 4e9, 0.0) for k in range(10)]
    tel = [_telemetry(T0, 0.0, 10e9, end="dst"), _telemetry(T0 + 10 * S, 0.0, 10e9, end="dst"),
           _telemetry(T0, 7e9, 0.0, end="src"), _telemetry(T0 + 10 * S, None, None, end="src", flags=["gap"])]
    (link,) = compare_links(_samples(rep + tel)).links
    assert link.end == "dst" and link.measured_bytes == 20e9 and link.worst_window_error == pytest.approx(0.0)


def test_links_are_sorted_by_disagreement_and_unmapped_ports_are_noted():
    rep = [_replay(T0 + k * 4 * S, 4e9, 0.0, link=name) for k in range(5) for name in ("a--b", "c--d")]
    tel = [_telemetry(T0, 0.0, 10e9, link="a--b"), _telemetry(T0, 0.0, 14e9, link="c--d"),
           _telemetry(T0, 0.0, 1e9, link="x/mlx5_0:1", end=None)]
    out = compare_links(_samples(rep + tel))
    assert [a.link for a in out.links] == ["c--d", "a--b"]
    assert out.links[0].unexplained_bytes == pytest.approx(4e9)
    assert any("no link in the fabric" in n for n in out.notes)
    text = format_comparison(out)
    assert "c--d" in text and "explains" in text


def test_what_cannot_be_compared_is_said():
    assert compare_links(_samples([_replay(T0, 1.0, 1.0)])).notes == ["no telemetry in the run"]
    assert "no replay" in compare_links(_samples([_telemetry(T0, 1.0, 1.0)])).notes[0]
    other = compare_links(_samples([_telemetry(T0, 1.0, 1.0), _replay(T0, 1.0, 1.0, link="h0/gpu0--h0/nic0")]))
    assert other.empty and any("not on the replayed topology" in n for n in other.notes)


def test_json_round_trip():
    rep = [_replay(T0 + k * 4 * S, 4e9, 2e9) for k in range(5)]
    out = compare_links(_samples([*rep, _telemetry(T0, 1000000000.0, 10000000000.0)]))
    back = from_builtins(to_builtins(out), TelemetryComparison)
    assert back.links == out.links and back.windows.to_pylist() == out.windows.to_pylist()
