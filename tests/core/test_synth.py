import polars as pl
import pytest

from tracekit import schema
from tracekit.errors import TracekitError
from tracekit.store import Run
from tracekit.synth import SynthSpec, make_run_tables, write_run


@pytest.fixture(scope="module")
def small():
    return make_run_tables(SynthSpec(hosts=2, gpus_per_host=4, tp=1, pp=2, ep=2, steps=2))


def test_tables_conform(small):
    tables, _ = small
    for name, table in tables.items():
        assert schema.validate(name, table) == []


def test_instances_end_together_on_the_true_clock(small):
    tables, truth = small
    offsets = pl.DataFrame({"rank": [int(r) for r in truth["clock_offset_ns"]],
                            "off": list(truth["clock_offset_ns"].values())}).cast({"rank": pl.Int32})
    coll = pl.from_arrow(tables["collectives"]).join(offsets, on="rank")
    ends = coll.group_by("instance").agg((pl.col("ts_ns") + pl.col("dur_ns") + pl.col("off")).n_unique().alias("n"))
    assert ends["n"].max() == 1


def test_straggler_arrives_last_in_its_step(small):
    tables, truth = small
    s = truth["straggler"]
    offsets = {int(r): v for r, v in truth["clock_offset_ns"].items()}
    coll = pl.from_arrow(tables["collectives"]).with_columns(
        (pl.col("ts_ns") + pl.col("rank").replace_strict(offsets, return_dtype=pl.Int64)).alias("t"))
    joined = coll.filter((pl.col("rank") == s["rank"]) & (pl.col("step") == s["step"]))["instance"]
    first = (coll.filter(pl.col("instance").is_in(joined.implode())).sort("t")
             .group_by("instance", maintain_order=True).agg(pl.col("rank").last(), pl.col("t").max())
             .sort("t").row(0, named=True))
    assert first["rank"] == s["rank"]


def test_ep_skew_and_splits_balance(small):
    tables, truth = small
    coll = pl.from_arrow(tables["collectives"]).filter(pl.col("op") == "all_to_all")
    for inst in coll.partition_by("instance"):
        sent = sum(sum(x) for x in inst["in_splits"].to_list())
        received = sum(sum(x) for x in inst["out_splits"].to_list())
        assert sent == received
    for hot in truth["ep_hot"].values():
        assert hot["hot_rank"] == hot["ranks"][0]
        assert hot["hot_share"] > 0.6


def test_pp_pairs_are_send_recv(small):
    tables, _ = small
    pp = pl.from_arrow(tables["collectives"]).filter(pl.col("dim") == "PP")
    per_instance = pp.group_by("instance").agg(pl.col("op").sort())
    assert all(ops.to_list() == ["recv", "send"] for ops in per_instance["op"])


def test_write_run_round_trips(tmp_path, small):
    tables, truth = small
    run = write_run(tables, tmp_path / "run", truth=truth)
    again = Run(run.path)
    assert again.table("collectives").num_rows == tables["collectives"].num_rows
    assert again.events().num_rows == tables["events"].num_rows
    assert sorted(p.parent.name for p in again.event_files()) == sorted(f"rank={r}" for r in range(8))


def test_invalid_spec_names_the_problem():
    with pytest.raises(TracekitError, match="divisible"):
        make_run_tables(hosts=1, gpus_per_host=6, pp=4)
