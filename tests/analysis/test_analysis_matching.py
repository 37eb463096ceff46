import polars as pl
from analysis_helpers import coll_table

from tracekit.analysis import match_collectives


def _ar(rank, seq, **kw):
    return {"rank": rank, "group": "g", "seq": seq, "op": "all_reduce", "dtype": "Float",
            "in_bytes": 1024, "out_bytes": 1024, **kw}


def test_explicit_seq_gives_one_instance_per_group_seq():
    rows = [_ar(r, s) for s in range(3) for r in range(4)]
    out, mm = match_collectives(coll_table(rows))
    df = pl.from_arrow(out)
    assert df.group_by("seq").agg(pl.col("instance").n_unique())["instance"].to_list() == [1, 1, 1]
    assert df["instance"].n_unique() == 3
    assert mm.num_rows == 0


def test_implicit_seq_is_the_nth_call_on_the_group():
    rows = [{**_ar(r, None), "ts_ns": 1000 * s + r, "group": g} for g in ("a", "b") for s in range(2)
            for r in range(2)]
    df = pl.from_arrow(match_collectives(coll_table(rows))[0])
    assert sorted(df["seq"].unique().to_list()) == [0, 1]
    assert df.group_by("group", "seq").agg(pl.col("instance").n_unique().alias("n"))["n"].to_list() == [1] * 4
    assert df["instance"].n_unique() == 4


def test_instances_are_stable_under_row_order():
    rows = [_ar(r, s) for s in range(5) for r in range(3)]
    a = pl.from_arrow(match_collectives(coll_table(rows))[0]).select("rank", "seq", "instance").sort("rank", "seq")
    b = pl.from_arrow(match_collectives(coll_table(rows[::-1]))[0]).select("rank", "seq", "instance").sort(
        "rank", "seq")
    assert a.equals(b)


def test_p2p_pairs_by_per_pair_ordinal():
    rows = []
    for k in range(3):
        rows.append({"rank": 0, "group": "pp", "seq": 2 * k, "op": "send", "peer": 1, "in_bytes": 64, "ts_ns": 10 * k})
        rows.append({"rank": 1, "group": "pp", "seq": 2 * k, "op": "recv", "peer": 0, "out_bytes": 64,
                     "ts_ns": 10 * k})
        rows.append({"rank": 1, "group": "pp", "seq": 2 * k + 1, "op": "send", "peer": 0, "in_bytes": 8,
                     "ts_ns": 10 * k + 5})
        rows.append({"rank": 0, "group": "pp", "seq": 2 * k + 1, "op": "recv", "peer": 1, "out_bytes": 8,
                     "ts_ns": 10 * k + 5})
    out, mm = match_collectives(coll_table(rows))
    df = pl.from_arrow(out)
    per = df.group_by("instance").agg(pl.col("op").sort().alias("ops"), pl.col("rank").n_unique().alias("n"))
    assert per.height == 6
    assert all(o == ["recv", "send"] for o in per["ops"].to_list())
    assert mm.num_rows == 0


def test_mismatches_report_values_per_rank():
    rows = [_ar(0, 0), _ar(1, 0, in_bytes=2048, out_bytes=2048), _ar(2, 0, op="all_gather", dtype="Half"),
            {"rank": 0, "group": "p", "seq": 0, "op": "send", "peer": 3, "in_bytes": 10},
            {"rank": 3, "group": "p", "seq": 0, "op": "recv", "peer": 0, "out_bytes": 12},
            {"rank": 0, "group": "p", "seq": 1, "op": "send", "peer": 3, "in_bytes": 10}]
    _, mm = match_collectives(coll_table(rows))
    df = pl.from_arrow(mm)
    fields = set(df["field"].to_list())
    assert {"op", "dtype", "in_bytes", "bytes", "unpaired"} <= fields
    row = df.filter(pl.col("field") == "in_bytes").row(0, named=True)
    assert row["ranks"] == [0, 1, 2] and row["values"] == ["1024", "2048", "1024"]


def test_all_to_all_totals_must_balance():
    rows = [{"rank": r, "group": "e", "seq": 0, "op": "all_to_all", "in_bytes": 100, "out_bytes": 100 + r}
            for r in range(2)]
    _, mm = match_collectives(coll_table(rows))
    assert "bytes_total" in pl.from_arrow(mm)["field"].to_list()


def test_empty_input():
    out, mm = match_collectives(coll_table([]))
    assert out.num_rows == 0 and mm.num_rows == 0
