import numpy as np
import polars as pl
import pytest
from analysis_helpers import coll_table, ranks_table

from tracekit.analysis import align_clocks, match_collectives, prepare


def _offsets(ranks) -> dict[int, int]:
    df = pl.from_arrow(ranks)
    return dict(zip(df["rank"].to_list(), df["clock_offset_ns"].to_list(), strict=True))


def _close(est: int, true: int) -> bool:
    return abs(est - true) <= max(0.05 * abs(true), 50_000)


def _skewed_run(offset: dict[int, int], groups: dict[str, list[int]], n: int, seed: int = 0,
                jitter_ns: int = 3_000, start_spread_ns: int = 2_000_000) -> list[dict]:
    """Collectives whose true ends agree within `jitter_ns`, seen on clocks shifted by -offset."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        t = i * 10_000_000
        for g, members in groups.items():
            end = t + 5_000_000
            for r in members:
                start = t + int(rng.integers(0, start_spread_ns))
                e = end + int(rng.integers(0, jitter_ns))
                rows.append({"rank": r, "group": g, "seq": i, "op": "all_reduce", "in_bytes": 1 << 20,
                             "out_bytes": 1 << 20, "ts_ns": start - offset[r], "dur_ns": e - start})
    return rows


def test_recovers_ms_offsets_across_overlapping_groups():
    rng = np.random.default_rng(1)
    offset = {r: int(rng.integers(-4_000_000, 4_000_000)) for r in range(8)}
    offset[0] = 0
    groups = {"dp0": [0, 1, 2, 3], "dp1": [4, 5, 6, 7], "x": [0, 4], "y": [3, 7, 5]}
    coll, _ = match_collectives(coll_table(_skewed_run(offset, groups, 40)))
    ranks, report = align_clocks(coll, ranks_table(8))
    est = _offsets(ranks)
    assert all(_close(est[r], offset[r]) for r in range(8)), (est, offset)
    assert report["residual_ns"]["p90"] < 10_000
    assert report["raw_spread_ns"]["median"] > 1_000_000
    assert report["anchor"] == 0 and not report["unconnected_ranks"]


def test_tightly_bound_blocks_move_together():
    """Hosts of 4 ranks with many intra-host collectives and few inter-host ones: rank-by-rank
    medians would leave every host at 0; the joint solve moves each host as a block."""
    offset = {r: [0, 1_500_000, -2_500_000][r // 4] for r in range(12)}
    groups = {f"tp{h}": list(range(4 * h, 4 * h + 4)) for h in range(3)}
    rows = _skewed_run(offset, groups, 60)
    rows += _skewed_run(offset, {"dp": [0, 4, 8]}, 5, seed=2)
    for r in rows[-15:]:
        r["seq"] += 1000
    coll, _ = match_collectives(coll_table(rows))
    est = _offsets(align_clocks(coll, ranks_table(12))[0])
    assert all(_close(est[r], offset[r]) for r in range(12)), est


def test_robust_to_an_outlier_instance():
    offset = {0: 0, 1: 700_000, 2: -300_000, 3: 1_200_000}
    rows = _skewed_run(offset, {"w": [0, 1, 2, 3]}, 30)
    rows[5]["dur_ns"] += 40_000_000  # one rank's kernel ran long after the others finished
    coll, _ = match_collectives(coll_table(rows))
    est = _offsets(align_clocks(coll, ranks_table(4))[0])
    assert all(_close(est[r], offset[r]) for r in range(4))


def test_p2p_used_only_to_connect():
    offset = {0: 0, 1: 0, 2: 2_000_000, 3: 2_000_000}
    rows = _skewed_run(offset, {"a": [0, 1], "b": [2, 3]}, 10)
    for k in range(4):
        end = 500_000_000 + k * 1_000_000
        rows.append({"rank": 1, "group": "p", "seq": k, "op": "send", "peer": 2, "in_bytes": 8,
                     "ts_ns": end - 1000, "dur_ns": 1000})
        rows.append({"rank": 2, "group": "p", "seq": k, "op": "recv", "peer": 1, "out_bytes": 8,
                     "ts_ns": end - 5000 - offset[2], "dur_ns": 5000})
    coll, _ = match_collectives(coll_table(rows))
    ranks, report = align_clocks(coll, ranks_table(4))
    assert report["used_p2p"]
    est = _offsets(ranks)
    assert all(_close(est[r], offset[r]) for r in range(4))


def test_unconnected_ranks_are_reported():
    offset = dict.fromkeys(range(4), 0)
    coll, _ = match_collectives(coll_table(_skewed_run(offset, {"a": [0, 1], "b": [2, 3]}, 5)))
    ranks, report = align_clocks(coll, ranks_table(5))
    assert report["unconnected_ranks"] == [2, 3, 4]
    assert _offsets(ranks)[4] == 0
    assert any("share no timed collective" in n for n in report["notes"])


def test_no_timestamps_leaves_zero_offsets():
    rows = [{"rank": r, "group": "g", "seq": 0, "op": "all_reduce"} for r in range(3)]
    coll, _ = match_collectives(coll_table(rows))
    ranks, report = align_clocks(coll, ranks_table(3))
    assert set(_offsets(ranks).values()) == {0}
    assert "no collectives with timestamps" in report["notes"][0]


@pytest.mark.parametrize("fixture", ["synth_small", "synth_wide"])
def test_recovers_synth_host_offsets(request, fixture):
    tables, truth = request.getfixturevalue(fixture)
    est = _offsets(prepare(tables)["ranks"])
    true = {int(r): v for r, v in truth["clock_offset_ns"].items()}
    base = true[0]
    assert all(_close(est[r], true[r] - base) for r in true), (est, true)
