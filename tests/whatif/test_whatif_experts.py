"""EP rebalancing what-if on hand-built runs: loads, split rewriting, imbalance, replay."""

import json

import polars as pl
import pytest
from whatif_helpers import skewed_ep_run

from tracekit.results import to_builtins
from tracekit.whatif import ExpertLoads, WhatIfError, eplb, make_baseline, read_expert_loads, read_expert_map

TOPO = "rail-optimized:gpus=4"


@pytest.fixture(scope="module")
def base():
    return make_baseline(skewed_ep_run(), TOPO)


def test_imbalance_before_and_after(base):
    # Each rank sends 700 kB, 280 kB of it to rank 0: rank 0 receives 8 x 280 kB = 2.24 MB, the mean
    # is 700 kB, so max/mean is 3.2. With 8 redundant slots the plan packs 3 GPUs at 0.72 MB and 5 at
    # 0.688 MB per all-to-all (see test_a_40_percent_expert_is_split): 0.72 / 0.7.
    r = eplb(base, redundant=8)
    assert r.ep_imbalance.before == pytest.approx(3.2)
    assert r.ep_imbalance.after == pytest.approx(0.72 / 0.7, rel=1e-4)
    assert r.ep_imbalance.after < 1.3
    assert r.ep_load[0].ranks == tuple(range(8))
    assert sum(r.ep_load[0].before) == sum(r.ep_load[0].after) == 4 * 8 * 700_000


def test_inter_host_bytes_by_hand(base):
    # Hosts h0 = ranks 0-3, h1 = ranks 4-7. Per all-to-all, h0 -> h1: 4 x 4 x 60 kB = 0.96 MB;
    # h1 -> h0: 4 x (280 kB + 3 x 60 kB) = 1.84 MB; four all-to-alls.
    assert base.result.tier_bytes["nic-leaf"] == {"EP": 4 * (960_000 + 1_840_000)}


def test_rewritten_splits_keep_senders_and_total(base):
    from tracekit.whatif.experts import _pairs, plan_groups, rewrite_all_to_all

    pairs = _pairs(base.tables)
    plans, _ = plan_groups(pairs, base.tables, base.placement, redundant=8)
    coll = pl.from_arrow(rewrite_all_to_all(base.tables, pairs, plans)).filter(pl.col("op") == "all_to_all")
    assert (coll.get_column("in_bytes") == 700_000).all()
    assert coll.get_column("in_splits").list.sum().to_list() == coll.get_column("in_bytes").to_list()
    assert coll.get_column("out_bytes").sum() == 4 * 8 * 700_000
    received = coll.group_by("rank").agg(pl.col("out_bytes").sum()).sort("rank").get_column("out_bytes").to_numpy()
    assert received.max() / received.mean() == pytest.approx(0.72 / 0.7, rel=1e-4)


def test_balanced_run_stays_put():
    tables = skewed_ep_run(hot_share=1 / 8, sent=800_000)
    base = make_baseline(tables, TOPO)
    r = eplb(base, redundant=8)
    assert r.ep_load[0].before == r.ep_load[0].after
    assert r.step_ns == r.baseline_step_ns and r.exposed_ns == r.baseline_exposed_ns
    assert r.inter_host_after == r.inter_host_before


def test_a_combine_is_rewritten_on_the_sender_side():
    base = make_baseline(skewed_ep_run(transpose=True), TOPO)
    from tracekit.whatif.experts import _pairs, plan_groups, rewrite_all_to_all

    pairs = _pairs(base.tables)
    plans, _ = plan_groups(pairs, base.tables, base.placement, redundant=8)
    coll = pl.from_arrow(rewrite_all_to_all(base.tables, pairs, plans)).filter(pl.col("op") == "all_to_all")
    assert (coll.get_column("out_bytes") == 700_000).all()
    sent = coll.group_by("rank").agg(pl.col("in_bytes").sum()).sort("rank").get_column("in_bytes").to_numpy()
    assert sent.max() / sent.mean() == pytest.approx(0.72 / 0.7, rel=1e-4)


def test_balancing_shortens_the_all_to_all_and_the_step(base):
    r = eplb(base, redundant=8)
    assert r.a2a_ns.after < r.a2a_ns.before
    assert r.step_change.after < r.step_change.before
    assert to_builtins(r)["checkpoint_ns"] is None and to_builtins(r)["ep_imbalance"]["before"] == pytest.approx(3.2)


def test_expert_compute_scaled_by_tokens_received(base):
    # Expert compute lasts 1 ns per byte received: 2.24 ms on rank 0, 0.48 ms elsewhere. Scaled by
    # the rewritten bytes, every rank's expert kernel lasts what it now receives.
    from tracekit.whatif.experts import _pairs, plan_groups, rewrite_all_to_all, scale_expert_compute

    pairs = _pairs(base.tables)
    plans, _ = plan_groups(pairs, base.tables, base.placement, redundant=8)
    coll = rewrite_all_to_all(base.tables, pairs, plans)
    events, n = scale_expert_compute(base.tables, coll, "expert")
    assert n == 4 * 8
    ev = pl.from_arrow(events).filter(pl.col("name") == "expert_mlp").sort("rank", "ts_ns")
    received = (pl.from_arrow(coll).sort("rank", "seq").get_column("out_bytes").to_numpy())
    assert ev.get_column("replay_dur_ns").to_list() == received.tolist()
    r = eplb(base, redundant=8, compute="expert")
    net_only = eplb(base, redundant=8)
    # the slowest rank's expert kernel drops from 2.24 ms to 0.72 ms per layer
    assert r.step_change.before - r.step_change.after > net_only.step_change.before - net_only.step_change.after
    assert r.step_change.before - r.step_change.after == pytest.approx(
        4 * (2_240_000 - 720_000) + (net_only.step_change.before - net_only.step_change.after), rel=0.05)


def test_no_ep_traffic_is_an_error():
    from whatif_helpers import RunBuilder

    b = RunBuilder({0: ("a", 0), 1: ("b", 0)})
    b.collective("dp", [0, 1], "all_reduce", "DP", dur=100_000, nbytes=1_000_000)
    with pytest.raises(WhatIfError, match="no EP all-to-all"):
        eplb(make_baseline(b.tables(), TOPO), redundant=2)


def test_slot_count_must_divide(base):
    with pytest.raises(WhatIfError, match="redundant must make the slot count a multiple"):
        eplb(base, redundant=3)


def test_expert_files(tmp_path, base):
    (tmp_path / "map.csv").write_text("expert,rank\n" + "".join(f"{e},{e // 2}\n" for e in range(16)))
    rows = [{"step": 0, "layer": 0, "expert": e, "tokens": 90 if e == 0 else 10} for e in range(16)]
    (tmp_path / "loads.json").write_text(json.dumps(rows))
    loads = read_expert_loads(tmp_path / "loads.json", read_expert_map(tmp_path / "map.csv"))
    assert loads.tokens[0] == 90 and loads.rank_of[15] == 7
    r = eplb(base, redundant=8, loads=loads)
    assert any("loads.json" in n for n in r.notes)
    plan = r.details["plans"][0]
    assert plan.experts_per_rank == 2 and 0 in plan.replicas
    assert "0" in to_builtins(r)["details"]["plans"][0]["replicas"]
    (tmp_path / "bad.csv").write_text("expert,tokens\nx,1\n")
    from tracekit.errors import InputError

    with pytest.raises(InputError, match=r"bad\.csv: row 1"):
        read_expert_loads(tmp_path / "bad.csv", {0: 0})
    with pytest.raises(InputError, match="not in the expert map"):
        read_expert_loads(tmp_path / "loads.json", {0: 0})
    uneven = ExpertLoads(tokens={0: 1.0}, rank_of={0: 0, 1: 0, 2: 1})
    with pytest.raises(WhatIfError, match="different numbers of experts"):
        eplb(base, redundant=8, loads=uneven)

