import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute
import pytest

from tracekit import schema
from tracekit.errors import TracekitError
from tracekit.store import Run
from tracekit.synth import NET_STEP_NS, SynthSpec, _Instance, _Links, make_run_tables, write_run


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


def test_truth_names_a_straggler_only_when_its_step_is_in_the_run():
    _, truth = make_run_tables(SynthSpec(hosts=2, gpus_per_host=4, steps=1, straggler_step=1))
    assert truth["straggler"] is None
    _, at_zero = make_run_tables(SynthSpec(hosts=2, gpus_per_host=4, steps=1, straggler_step=0))
    assert at_zero["straggler"] == {"rank": 1, "step": 0, "delay_ns": 20_000_000}
    _, plain = make_run_tables(SynthSpec(hosts=2, gpus_per_host=4, steps=1, straggler_step=1, straggler_rank=None))
    assert plain["straggler"] is None


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


def _links(**spec):
    return _Links(SynthSpec(**spec))


def _inst(key, loads, n_steps=1, crosses=True):
    return _Instance(key, "g", "send", "PP", (0, 4), {}, "k", 0, loads, n_steps, crosses)


def test_lone_transfer_takes_bytes_over_capacity_plus_latency():
    """Hand closed form: 2 MiB over one 50 GB/s NIC = 41,943 ns, plus one 4 us network step."""
    links = _links()
    loads = links.p2p(0, 4, 2 << 20)
    assert loads == {4 * 0 + 0: 2 << 20, 4 * 4 + 1: 2 << 20}  # sender's NIC tx, receiver's NIC rx
    a = _inst(0, loads)
    links.start(a, 0)
    assert a.dur_ns == a.solo_ns == round((2 << 20) / 50.0) + NET_STEP_NS


def test_contention_shares_a_resource_at_its_start_and_never_after():
    links = _links()
    nbytes = 2 << 20
    a, b, c = (_inst(k, links.p2p(0, 4, nbytes)) for k in range(3))
    links.start(a, 0)
    links.start(b, 1_000)  # a still active on both NICs: b gets half of each
    assert b.dur_ns == round(2 * nbytes / 50.0) + NET_STEP_NS
    assert a.dur_ns == a.solo_ns  # a keeps the duration fixed at its start
    links.start(c, b.end)  # a and b are done
    assert c.dur_ns == c.solo_ns
    other = _inst(3, links.p2p(1, 5, nbytes))  # other GPUs' NICs: no contention
    links.start(other, b.end)
    assert other.dur_ns == other.solo_ns


def test_ring_all_reduce_loads_by_hand():
    """8 ranks on 2 hosts of 4: 2(n-1)/n S = 1.75 S per GPU; 4 channels, each leaving and entering
    every host through one member's NIC, so each NIC carries 1.75 S / 4 and NVLink the rest."""
    links = _links(hosts=2, gpus_per_host=4)
    s = 1 << 20
    loads = links.ring_all_reduce(tuple(range(8)), s)
    for m in range(8):
        assert loads[4 * m + 0] == loads[4 * m + 1] == pytest.approx(1.75 * s / 4)
        assert loads[4 * m + 2] == loads[4 * m + 3] == pytest.approx(1.75 * s * 3 / 4)
    inside = links.ring_all_reduce((0, 1, 2, 3), s)
    assert set(inside) == {4 * m + k for m in range(4) for k in (2, 3)}
    assert inside[2] == pytest.approx(1.5 * s)


def test_all_to_all_is_bound_by_the_hot_receiver():
    links = _links(hosts=2, gpus_per_host=2)
    send = np.array([[0, 10, 30], [40, 0, 50], [60, 70, 0]])
    loads = links.all_to_all((0, 1, 2), send)
    assert loads[4 * 0 + 3] == 40  # rank 1 -> 0 inside host 0: NVLink rx
    assert loads[4 * 0 + 1] == 60  # rank 2 -> 0 across hosts: NIC rx
    assert loads[4 * 2 + 1] == 30 + 50
    assert loads[4 * 2 + 0] == 60 + 70


def test_contention_stretches_durations_and_is_reported(small):
    _, truth = small
    stretch = truth["contention"]
    assert set(stretch) == {"all_reduce", "all_to_all", "send"}
    assert sum(v["slowed"] for v in stretch.values()) > 0
    assert all(v["max_stretch"] >= 1 for v in stretch.values())


def test_slow_nic_slows_what_crosses_it():
    base, _ = make_run_tables(SynthSpec(hosts=2, gpus_per_host=4, steps=1, straggler_rank=None))
    slow, truth = make_run_tables(SynthSpec(hosts=2, gpus_per_host=4, steps=1, straggler_rank=None,
                                            slow_nic_rank=1, slow_nic_factor=4.0))
    assert truth["slow_nic"] == {"rank": 1, "host": "node000", "device": 1, "gbs": 12.5, "factor": 4.0}

    def pp_dur(tables, rank):
        co = pl.from_arrow(tables["collectives"]).filter((pl.col("dim") == "PP") & (pl.col("rank") == rank))
        return co["dur_ns"].median()

    assert pp_dur(slow, 1) > 3 * pp_dur(base, 1)  # rank 1's sends leave the host through its NIC
    assert pp_dur(slow, 2) == pytest.approx(pp_dur(base, 2), rel=0.5)
    with pytest.raises(TracekitError, match="slow_nic_rank"):
        make_run_tables(hosts=2, gpus_per_host=4, slow_nic_rank=8)


def test_launches_and_syncs_are_recorded(small):
    tables, _ = small
    ev = pl.from_arrow(tables["events"]).with_columns(pl.col("kind").cast(pl.Utf8), pl.col("name").cast(pl.Utf8))
    gpu = ev.filter(pl.col("kind").is_in(["compute", "comm"]))
    launches = ev.filter(pl.col("name").is_in(["cudaLaunchKernel", "cuLaunchKernelEx"]))
    assert gpu["correlation"].null_count() == 0
    joined = gpu.join(launches.select("rank", "correlation", pl.col("ts_ns").alias("launch_ts"),
                                      (pl.col("ts_ns") + pl.col("dur_ns")).alias("launched")),
                      on=["rank", "correlation"])
    assert joined.height == gpu.height  # every kernel has its launch call
    assert (joined["ts_ns"] >= joined["launched"]).all()  # and starts after it returned
    sync = ev.filter(pl.col("kind") == "sync")
    assert set(sync["name"]) == {"Event Sync", "Stream Wait Event"}
    assert sync["sync_lane"].null_count() == 0 and sync["sync_correlation"].null_count() == 0
    records = set(zip(*ev.filter(pl.col("name") == "cudaEventRecord").select("rank", "correlation"), strict=True))
    assert all((r, c) in records for r, c in zip(sync["rank"], sync["sync_correlation"], strict=True))


def test_without_launch_events_the_timing_is_the_same():
    a, _ = make_run_tables(SynthSpec(hosts=2, gpus_per_host=4, steps=1))
    b, _ = make_run_tables(SynthSpec(hosts=2, gpus_per_host=4, steps=1, launch_events=False))
    assert b["events"].filter(pa.compute.is_in(b["events"].column("kind"),
                                               pa.array(["runtime", "sync"]))).num_rows == 0
    assert a["collectives"].column("dur_ns").equals(b["collectives"].column("dur_ns"))


def test_slow_stage_stretches_that_stages_compute_only():
    spec = {"hosts": 2, "gpus_per_host": 4, "steps": 1, "straggler_rank": None}
    base, _ = make_run_tables(SynthSpec(**spec))
    slow, truth = make_run_tables(SynthSpec(**spec, slow_stage=1, slow_stage_factor=2.0))
    assert truth["slow_stage"] == {"stage": 1, "factor": 2.0}

    def kernel(tables, rank, name):
        ev = pl.from_arrow(tables["events"]).filter((pl.col("rank") == rank) & (pl.col("name") == name))
        return ev["dur_ns"].to_list()

    assert kernel(slow, 4, "fwd_attn_l0_k0") == pytest.approx([2 * d for d in kernel(base, 4, "fwd_attn_l0_k0")],
                                                             abs=2)
    assert kernel(slow, 0, "fwd_attn_l0_k0") == kernel(base, 0, "fwd_attn_l0_k0")  # stage 0 unchanged
    assert kernel(slow, 4, "optimizer_step_k0") == kernel(base, 4, "optimizer_step_k0")
    with pytest.raises(TracekitError, match="slow_stage"):
        make_run_tables(**spec, slow_stage=2)


def test_ring_channels_concentrate_the_all_reduce_on_fewer_nics():
    spec = {"hosts": 2, "gpus_per_host": 4, "pp": 1, "ep": 2, "steps": 1, "straggler_rank": None}
    four, _ = make_run_tables(SynthSpec(**spec, ring_channels=4))
    one, truth = make_run_tables(SynthSpec(**spec, ring_channels=1))
    assert truth["ring_channels"] == 1 and "channels" not in make_run_tables(SynthSpec(**spec))[0]
    ch = pl.from_arrow(one["channels"])
    assert ch.height == 8 and set(ch["transport"].to_list()) == {"NET", "P2P"}  # 8 DP members, one channel
    assert pl.from_arrow(four["channels"]).height == 32

    def dp(tables):
        co = pl.from_arrow(tables["collectives"]).filter(pl.col("dim") == "DP")
        return co["dur_ns"].median()

    assert dp(one) > 2 * dp(four)  # one NIC per host carries the whole ring instead of four


def test_schedules_are_stated_in_the_truth_and_checked():
    _, default = make_run_tables(steps=1)
    assert "schedule" not in default["spec"] and "pp_chunks" not in default["spec"]  # default output unchanged
    _, truth = make_run_tables(schedule="interleaved-1f1b", pp_chunks=2, micro_batches=4, steps=1)
    assert (truth["spec"]["schedule"], truth["spec"]["pp_chunks"]) == ("interleaved-1f1b", 2)
    with pytest.raises(TracekitError, match=r"synth: dualpipe: needs .* at least twice the stages"):
        make_run_tables(schedule="dualpipe", micro_batches=2, steps=1)
    with pytest.raises(TracekitError, match="unknown schedule 'pipedream'"):
        make_run_tables(schedule="pipedream", steps=1)
