import polars as pl
import pytest
from analysis_helpers import coll_table, groups_table, ranks_table

from tracekit.analysis import ep, pp, stalls
from tracekit.analysis._frames import frame
from tracekit.analysis.matching import match_collectives


def _prep(rows, n, offsets=None, hosts=None):
    coll = frame(match_collectives(coll_table(rows))[0], "collectives")
    rk = frame(ranks_table(n, hosts), "ranks").with_columns(
        pl.Series("clock_offset_ns", [(offsets or {}).get(r, 0) for r in range(n)], dtype=pl.Int64))
    return coll, rk


def test_waits_last_rank_and_bandwidth():
    # rank 2 arrives 5 ms late on its own clock, which runs 1 ms behind (offset +1 ms)
    rows = [{"rank": r, "group": "g", "seq": 0, "op": "all_reduce", "dim": "DP", "nranks": 4,
             "in_bytes": 4_000_000, "ts_ns": t, "dur_ns": 10_000_000 - t, "step": 0}
            for r, t in [(0, 0), (1, 1_000_000), (2, 4_000_000), (3, 2_000_000)]]
    coll, rk = _prep(rows, 4, offsets={2: 1_000_000})
    parts = stalls.participants(coll, rk)
    assert dict(parts.select("rank", "wait_ns").iter_rows()) == {0: 5_000_000, 1: 4_000_000, 2: 0, 3: 3_000_000}
    inst = stalls.instances(parts).row(0, named=True)
    assert inst["last_rank"] == 2 and inst["max_wait_ns"] == 5_000_000
    assert inst["duration_ns"] == 11_000_000 - 5_000_000
    assert inst["algbw_gbps"] == pytest.approx(4_000_000 / 6_000_000)
    assert inst["busbw_gbps"] == pytest.approx(inst["algbw_gbps"] * 2 * 3 / 4)


@pytest.mark.parametrize(("op", "factor"), [("all_gather", 0.75), ("reduce_scatter", 0.75), ("all_to_all", 0.75),
                                            ("broadcast", 1.0), ("all_reduce", 1.5)])
def test_bus_factors(op, factor):
    rows = [{"rank": r, "group": "g", "seq": 0, "op": op, "nranks": 4, "in_bytes": 1000, "out_bytes": 4000,
             "ts_ns": 0, "dur_ns": 1000} for r in range(4)]
    inst = stalls.instances(stalls.participants(*_prep(rows, 4))).row(0, named=True)
    size = 4000 if op in ("all_gather", "broadcast") else 1000
    assert inst["algbw_gbps"] == pytest.approx(size / 1000)
    assert inst["busbw_gbps"] == pytest.approx(size / 1000 * factor)


def _chain():
    """Rank 1 sleeps before instance A of group a={0,1}; rank 0 then arrives late at b={0,2,3}
    only because A ended late: rank 1 caused it, rank 0 passed it on."""
    rows = []
    for r, t in [(0, 0), (1, 50)]:
        rows.append({"rank": r, "group": "a", "seq": 0, "op": "all_reduce", "ts_ns": t, "dur_ns": 60 - t, "step": 0})
    for r, t in [(0, 65), (2, 10), (3, 12)]:
        rows.append({"rank": r, "group": "b", "seq": 0, "op": "all_reduce", "ts_ns": t, "dur_ns": 70 - t,
                     "step": 0})
    for r in (0, 2, 3):
        rows.append({"rank": r, "group": "c", "seq": 0, "op": "all_reduce", "ts_ns": -40, "dur_ns": 30 + (r == 0) * 0,
                     "step": 0})
    rows.append({"rank": 1, "group": "a", "seq": -1, "op": "all_reduce", "ts_ns": -40, "dur_ns": 30, "step": 0})
    rows.append({"rank": 0, "group": "a", "seq": -1, "op": "all_reduce", "ts_ns": -40, "dur_ns": 30, "step": 0})
    return rows


def test_lateness_is_blamed_on_its_cause():
    coll, rk = _prep(_chain(), 4)
    parts = stalls.participants(coll, rk)
    inst = stalls.instances(parts)
    b = inst.filter(pl.col("group") == "b").row(0, named=True)
    a = inst.filter((pl.col("group") == "a") & (pl.col("seq") == 0)).row(0, named=True)
    assert (a["last_rank"], a["max_wait_ns"], a["caused_ns"]) == (1, 50, 50)
    assert (b["last_rank"], b["max_wait_ns"], b["caused_ns"]) == (0, 55, 0)
    s = stalls.stragglers(inst, parts)
    assert s.row(0, named=True)["rank"] == 1
    assert s.filter(pl.col("rank") == 0).row(0, named=True)["delay_ns"] == 55


def test_ep_traffic_hot_rank_and_host_share():
    members = [0, 1, 2, 3]
    splits = {0: [10, 60, 10, 10], 1: [20, 10, 5, 5], 2: [10, 70, 0, 0], 3: [0, 50, 0, 10]}
    rows = [{"rank": r, "group": "ep", "seq": 0, "op": "all_to_all", "dim": "EP", "in_bytes": sum(s),
             "in_splits": s, "step": 0} for r, s in splits.items()]
    rows += [{"rank": r, "group": "ep", "seq": 1, "op": "all_to_all", "dim": "EP", "in_bytes": 40, "step": 0}
             for r in members]
    coll, rk = _prep(rows, 4, hosts=["a", "a", "b", "b"])
    pairs = ep.ep_pairs(coll, frame(groups_table([("ep", "ep", members)]), "groups"))
    assert pairs.filter((pl.col("instance") == 1) & (pl.col("src") == 3))["bytes"].to_list() == [10, 10, 10, 10]
    inst, groups, traffic = ep.ep_summary(pairs, rk)
    first = inst.filter(pl.col("instance") == 0).row(0, named=True)
    assert first["hot_rank"] == 1 and first["hot_share"] == pytest.approx(190 / 270)
    assert first["imbalance"] == pytest.approx(190 / (270 / 4))
    off = 270 - (10 + 10 + 0 + 10)
    inter = 10 + 10 + 5 + 5 + 10 + 70 + 0 + 50
    assert first["inter_host_share"] == pytest.approx(inter / off)
    g = groups.row(0, named=True)
    assert g["hot_rank"] == 1 and g["hot_ranks"] == [1] and g["instances"] == 2
    assert traffic.filter((pl.col("src") == 2) & (pl.col("dst") == 1))["bytes"].item() == 70 + 10


def test_pp_stages_and_recv_wait():
    rows = []
    for k, (t0, t1) in enumerate([(0, 40), (100, 105)]):
        rows.append({"rank": 0, "group": "p", "seq": k, "op": "send", "peer": 1, "dim": "PP", "ts_ns": t1,
                     "dur_ns": 5, "step": 0})
        rows.append({"rank": 1, "group": "p", "seq": k, "op": "recv", "peer": 0, "dim": "PP", "ts_ns": t0,
                     "dur_ns": t1 + 5 - t0, "step": 0})
    coll, rk = _prep(rows, 2)
    parts = stalls.participants(coll, rk)
    inst = stalls.instances(parts)
    groups = frame(groups_table([("p", "pp", [0, 1])]), "groups").with_columns(
        pl.Series("dims", [["PP"]], dtype=pl.List(pl.String)))
    assert pp.pp_stages(inst, groups) == {0: 0, 1: 1}
    breakdown = pl.DataFrame({"rank": [0, 1], "step": [0, 0], "span_ns": [200, 200], "idle_ns": [100, 20]},
                             schema={"rank": pl.Int32, "step": pl.Int32, "span_ns": pl.Int64, "idle_ns": pl.Int64})
    b = pp.pp_bubbles(parts, inst, groups, breakdown)
    r1 = b.filter(pl.col("rank") == 1).row(0, named=True)
    assert (r1["stage"], r1["recv_wait_ns"], r1["bubble_ns"]) == (1, 45, 65)
    assert b.filter(pl.col("rank") == 0).row(0, named=True)["recv_wait_ns"] == 0
