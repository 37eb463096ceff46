import polars as pl
import pytest
from analysis_helpers import coll_table, groups_table, ranks_table

from tracekit.analysis import classify, parse_dims, prepare
from tracekit.analysis.classify import DimsError, desc_dims


def _dims(coll, groups) -> dict[str, list[str]]:
    df = pl.from_arrow(groups)
    return dict(zip(df["group"].to_list(), df["dims"].to_list(), strict=True))


def _call_dims(coll) -> dict[tuple[str, str], str]:
    df = pl.from_arrow(coll).unique(["group", "op"])
    return {(g, o): d for g, o, d in df.select("group", "op", "dim").iter_rows()}


def test_desc_tokens():
    assert desc_dims("dp_stage0") == ["DP"]
    assert desc_dims("ep_stage1") == ["EP"]
    assert desc_dims("pp_pair3") == ["PP"]
    assert desc_dims("default_pg") == ["WORLD"]
    assert desc_dims("undefined") == []
    assert desc_dims("tp+sp") == ["TP"]
    assert desc_dims(None) == []


def test_parse_dims():
    assert parse_dims("dp=3,5,ep=moe") == {"DP": ["3", "5"], "EP": ["moe"]}
    assert parse_dims({"pp": "7"}) == {"PP": ["7"]}
    assert parse_dims(None) == {}
    with pytest.raises(DimsError):
        parse_dims("xx=1")
    with pytest.raises(DimsError):
        parse_dims("3")


def _shape_run():
    """16 ranks on 2 hosts of 8: TP groups of 4 inside a host, DP across hosts, EP all-to-all,
    PP pairs, and a world barrier; no descriptions."""
    hosts = [f"h{r // 8}" for r in range(16)]
    groups = [(f"tp{i}", None, list(range(4 * i, 4 * i + 4))) for i in range(4)]
    groups += [(f"dp{i}", None, [i, i + 8]) for i in range(8)]
    groups += [("ep0", None, [0, 1, 2, 3]), ("pp0", None, [0, 4]), ("world", None, list(range(16)))]
    rows = []
    for g, _, members in groups:
        for r in members:
            if g.startswith("tp"):
                rows += [{"rank": r, "group": g, "seq": s, "op": "all_reduce", "in_bytes": 1 << 20}
                         for s in range(20)]
            elif g.startswith("dp"):
                rows += [{"rank": r, "group": g, "seq": s, "op": "reduce_scatter", "in_bytes": 1 << 28}
                         for s in range(2)]
            elif g == "ep0":
                rows.append({"rank": r, "group": g, "seq": 0, "op": "all_to_all", "in_bytes": 1 << 20})
            elif g == "pp0":
                rows.append({"rank": r, "group": g, "seq": 0, "op": "send" if r == 0 else "recv",
                             "peer": 4 if r == 0 else 0, "in_bytes": 1 << 20})
            else:
                rows.append({"rank": r, "group": g, "seq": 0, "op": "barrier"})
    return coll_table(rows), groups_table(groups), ranks_table(16, hosts)


def test_shape_rules():
    coll, groups, ranks = _shape_run()
    c, g = classify(coll, groups, ranks)
    dims = _dims(c, g)
    assert dims["tp0"] == ["TP"] and dims["dp3"] == ["DP"]
    assert dims["ep0"] == ["EP"] and dims["pp0"] == ["PP"] and dims["world"] == ["WORLD"]


def test_overrides_win_and_match_by_id_or_desc():
    coll, groups, ranks = _shape_run()
    c, g = classify(coll, groups, ranks, overrides="cp=tp1,ep=world")
    dims = _dims(c, g)
    assert dims["tp1"] == ["CP"] and dims["world"] == ["EP"] and dims["tp0"] == ["TP"]
    with pytest.raises(DimsError, match="no group matches"):
        classify(coll, groups, ranks, overrides="dp=nope")


def test_one_group_can_carry_several_dims():
    rows = [{"rank": r, "group": "g", "seq": s, "op": op, "in_bytes": 1 << 20}
            for r in range(4) for s, op in enumerate(["all_reduce", "all_to_all"])]
    c, g = classify(coll_table(rows), groups_table([("g", "dp_ep", [0, 1, 2, 3])]), ranks_table(4))
    assert _call_dims(c) == {("g", "all_reduce"): "DP", ("g", "all_to_all"): "EP"}
    assert _dims(c, g)["g"] == ["DP", "EP"]


def test_dim_hint_and_default_pg():
    rows = [{"rank": r, "group": "0", "seq": 0, "op": "other", "dim_hint": "EP"} for r in range(4)]
    rows += [{"rank": r, "group": "0", "seq": 1, "op": "all_reduce"} for r in range(4)]
    c, _ = classify(coll_table(rows), groups_table([("0", "default_pg", [0, 1, 2, 3])]), ranks_table(4))
    # the only reducing group of a pure data-parallel job is DP; the hinted kernel is EP
    assert _call_dims(c) == {("0", "other"): "EP", ("0", "all_reduce"): "DP"}


def test_synth_groups_get_their_true_dims(synth_wide):
    tables, truth = synth_wide
    g = pl.from_arrow(prepare(tables)["groups"])
    got = dict(zip(g["group"].to_list(), g["dims"].to_list(), strict=True))
    for group in truth["groups"]:
        assert got[group["group"]] == [group["dim"]], group


def test_synth_groups_without_descriptions(synth_wide):
    tables, truth = synth_wide
    g = tables["groups"]
    g = g.set_column(g.schema.get_field_index("desc"), "desc", pl.Series([None] * g.num_rows, dtype=pl.String)
                     .to_arrow())
    out = pl.from_arrow(prepare({**tables, "groups": g})["groups"])
    got = dict(zip(out["group"].to_list(), out["dims"].to_list(), strict=True))
    for group in truth["groups"]:
        assert got[group["group"]] == [group["dim"]], group
