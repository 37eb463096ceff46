"""nccl-tests replay (`replay_microbench`) and the NCCL tuning rule."""

import statistics
from pathlib import Path

import pyarrow as pa
import pytest

from tracekit.replay import tuning
from tracekit.replay.microbench import ReplayError, busbw_factor, replay_microbench
from tracekit.replay.topology import parse_spec

REAL = Path(__file__).resolve().parents[2] / ".." / "shared" / "real_traces" / "nccl_tests" / \
    "all_reduce_perf_2node_16xH100.txt"
TOPOLOGY = "rail-optimized:gpus=8,nic_gbps=200"  # 2 hosts x 8 H100, 8 x 200 Gb/s NICs per host


def _table(rows):
    return pa.Table.from_pylist([dict(op=op, size_bytes=size, nranks=n, ranks_per_host=per, hosts=n // per,
                                      oop_time_us=t, oop_busbw=None) for op, size, n, per, t in rows])


def test_large_all_reduce_is_tree_with_pipeline_fill_by_hand():
    """8 GiB all-reduce on 2 x 8 H100, 200 Gb/s NICs: 25 B/ns line, 24 achievable (0.96, hardware.NICS).
    Tree/Simple (NCCL's choice): a host's 8 NICs carry S/0.92 each way -> 2^33 / (0.92 x 192) ns. The
    rotated chain's NVLink (370.8 x 8/14 = 211.9) does not bind. Fill: 16 channels of 2^29 B, chunks of
    512 KiB; a chunk crosses the 14 chain hops at 176.6/370.8 and the 2 NIC hops at 176.6/192 of the
    call's rate -> x (1 + 8.51 x 2^19 / 2^29). NCCL latency 8.4 + 2 x (7 x 4.0 + 14) = 92.4 us.
    busbw = S / t x 2 x 15/16."""
    size = 8 * 2**30
    [row] = replay_microbench(_table([("all_reduce", size, 16, 8, 47535.0)]), TOPOLOGY)
    rate = 0.92 * 192
    hops = 14 * rate / 370.8 + 2 * rate / 192
    t_us = size / rate / 1000 * (1 + hops * 2**19 / 2**29) + 92.4
    assert (row.algo, row.proto, row.channels) == ("tree", "Simple", 16)
    assert row.predicted_us == pytest.approx(t_us, rel=0.01)
    assert row.predicted_busbw == pytest.approx(size / t_us / 1000 * 30 / 16, rel=0.01)
    assert row.measured_busbw == pytest.approx(size / 47535.0 / 1000 * 30 / 16)
    assert not row.latency_bound


def test_small_sizes_are_marked_latency_bound():
    rows = replay_microbench(_table([("all_reduce", 8, 16, 8, 135.8), ("all_gather", 1 << 20, 16, 8, 50.0)]),
                             TOPOLOGY)
    assert [r.latency_bound for r in rows] == [True, True]
    assert rows[1].algo == "ring"


def test_empty_table_is_an_error():
    from tracekit import schema

    with pytest.raises(ReplayError):
        replay_microbench(schema.empty("microbench"), TOPOLOGY)


def test_busbw_factors_are_nccl_tests():
    assert busbw_factor("all_reduce", 16) == 30 / 16
    assert busbw_factor("all_gather", 4) == 0.75
    assert busbw_factor("broadcast", 8) == 1.0


@pytest.mark.skipif(not REAL.is_file(), reason="needs ../shared/real_traces")
def test_held_out_nccl_tests_bandwidth_bound_sizes_within_10_percent():
    """The measured sweep (2 GCP A3-Mega nodes) is held out: nothing here was fitted to it. Rows
    are read with an independent split of the data lines (13 columns, numeric size). From 512 MiB
    the NICs bind and every row is within 10%; 64-256 MiB are optimistic (GPUDirect-TCPXO's
    per-hop cost is not InfiniBand's, docs/hardware.md), and the band's median stays within 10%."""
    rows = []
    for line in REAL.read_text().splitlines():
        f = line.split()
        if len(f) == 13 and f[0].isdigit():
            rows.append(("all_reduce", int(f[0]), 16, 8, float(f[5])))
    assert len(rows) == 31
    result = replay_microbench(_table(rows), TOPOLOGY)
    scored = [r for r in result if r.size_bytes >= 64 * 2**20]
    assert len(scored) == 8
    assert sorted(abs(r.error) for r in scored)[len(scored) // 2] < 0.10
    for r in scored:
        if r.size_bytes >= 512 * 2**20:
            assert abs(r.error) < 0.10, (r.size_bytes, r.error)


def test_tuning_rule_latency_matches_nccls_formulas():
    shape = tuning.shape_of(parse_spec("rail-optimized:hosts=2,gpus=8,nic_gbps=200"))
    assert (shape.n_nodes, shape.ppn, shape.n_ranks) == (2, 8, 16)
    # tree/Simple: base 8.4 + 2 x ((ppn-1) x NVLink 4.0 + log2(2) x NET 14)
    assert tuning.latency_us("all_reduce", "tree", "Simple", shape) == pytest.approx(8.4 + 2 * (7 * 4.0 + 14))
    # ring/LL: 6.6 + (nsteps - 2) x max(0.6, net overhead 1.0) + 2 x 2.7
    assert tuning.latency_us("all_reduce", "ring", "LL", shape) == pytest.approx(6.6 + 28 * 1.0 + 2 * 2.7)


def test_tuning_rule_enables_only_what_the_fabric_has():
    plain = tuning.shape_of(parse_spec("rail-optimized:hosts=2,gpus=8"))
    assert not tuning.enabled("all_reduce", "nvls_tree", "Simple", plain)
    assert not tuning.enabled("all_reduce", "collnet_direct", "Simple", plain)
    assert not tuning.enabled("broadcast", "tree", "Simple", plain)
    full = tuning.shape_of(parse_spec("rail-optimized:hosts=2,gpus=8,nvls=true,sharp=true"))
    assert tuning.enabled("all_reduce", "nvls", "Simple", full)
    assert not tuning.enabled("all_reduce", "nvls", "LL", full)
    # a forced algorithm the shape cannot run falls back to the rule
    plan = tuning.select("all_reduce", 1e6, plain, 16, algo="nvls")
    assert plan.algo != "nvls" and plan.source == "tuning"


def test_normalize_names():
    assert tuning.normalize_algo("NVLS_TREE") == "nvls_tree"
    assert tuning.normalize_algo("CollNetDirect") == "collnet_direct"
    assert tuning.normalize_proto("simple") == "Simple"
    assert tuning.normalize_algo("bogus") is None


def test_rows_without_a_rank_count_are_named_not_dropped():
    """A pasted sendrecv table without device lines has no rank count: its rows are listed in a
    warning beside the rows that were replayed, and a file of nothing else is an error."""
    from tracekit.replay.microbench import nccl_tests_report

    rows = [dict(source="pasted.log", run=0, test="all_gather_perf", op="all_gather", size_bytes=1 << 30, nranks=8,
                 ranks_per_host=8, hosts=1, oop_time_us=2900.0, oop_busbw=None)]
    rows += [dict(source="pasted.log", run=1, test="sendrecv_perf", op="sendrecv", size_bytes=size, nranks=None,
                  ranks_per_host=None, hosts=None, oop_time_us=3000.0, oop_busbw=None) for size in (1 << 30, 1 << 31)]
    report = nccl_tests_report(pa.Table.from_pylist(rows), "rail-optimized:hosts=1,gpus=8")
    assert [r.op for r in report.rows] == ["all_gather"]
    [warning] = [f for f in report.findings if f.kind == "microbench"]
    assert warning.severity == "warning"
    assert "pasted.log: table 1 (sendrecv_perf): 2 rows not replayed: its rank count is unknown" in warning.text
    with pytest.raises(ReplayError, match=r"table 1 \(sendrecv_perf\): 2 rows not replayed"):
        nccl_tests_report(pa.Table.from_pylist(rows[1:]), "rail-optimized:hosts=1,gpus=8")


def _bench(rows, source="floor.log"):
    return pa.Table.from_pylist([dict(source=source, run=0, test=f"{op}_perf", op=op, size_bytes=size, nranks=n,
                                      ranks_per_host=per, hosts=n // per, oop_time_us=t, oop_busbw=None)
                                 for op, size, n, per, t in rows])


def test_latency_floor_gives_the_per_hop_latency_by_hand():
    """2 hosts x 8, all-reduce of 8-1024 B: tree/LL, whose fixed cost in tuning.cc is
    baseLat + 2 (7 intraLat + log2(2) interLat) with the plugin latency in interLat once (LL):
    2 us per us of `net_latency_us`. A floor 80 us above the model's is 40 us per hop."""
    from tracekit.replay.microbench import nccl_tests_report

    sizes = (8, 64, 1024)
    model = replay_microbench(_bench([("all_reduce", s, 16, 8, 100.0) for s in sizes]), TOPOLOGY)
    assert {(r.algo, r.proto) for r in model} == {("tree", "LL")}
    bench = _bench([("all_reduce", r.size_bytes, 16, 8, r.predicted_us + 80.0) for r in model])
    [table] = nccl_tests_report(bench, TOPOLOGY).tables
    floor = table.latency_floor
    assert floor.high and floor.rows == 3
    assert floor.net_latency_us == pytest.approx(40.0, abs=0.2)
    assert floor.measured_us - floor.predicted_us == pytest.approx(80.0)


def test_latency_floor_as_modelled_or_on_one_host_names_no_network_latency():
    from tracekit.present import floor_sentence
    from tracekit.replay.microbench import nccl_tests_report

    near = _bench([("all_reduce", 64, 16, 8, 30.0)])
    [table] = nccl_tests_report(near, TOPOLOGY).tables
    assert not table.latency_floor.high and floor_sentence(table) is None
    one_host = _bench([("all_reduce", 64, 8, 8, 500.0)])
    [table] = nccl_tests_report(one_host, "rail-optimized:hosts=1,gpus=8").tables
    assert table.latency_floor.high and table.latency_floor.net_latency_us is None
    assert "not the network" in floor_sentence(table)
    big = _bench([("all_reduce", 1 << 30, 16, 8, 9000.0)])
    assert nccl_tests_report(big, TOPOLOGY).tables[0].latency_floor is None


def test_a3_mega_floor_predicts_the_sizes_it_was_not_read_from():
    """The 16 x H100 GPUDirect-TCPXO sweep's floor, read from its rows <= 64 KiB only, is about 50 us
    per network hop (NCCL's constants know no such latency: 393% at <= 1 MiB). Replayed with it,
    the held-out 128 KiB - 1 MiB rows come within 35%, the issue's target for that band."""
    from tracekit.parsers import nccl_tests
    from tracekit.replay.microbench import nccl_tests_report
    from tracekit.store import SourceSink

    if not REAL.is_file():
        pytest.skip(f"real traces not present at {REAL}")
    import tempfile

    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory() as tmp:
        sink = SourceSink(Path(tmp) / "run", "k")
        nccl_tests.parse(REAL, sink)
        sink.close()
        bench = pq.read_table(Path(tmp) / "run" / "sources" / "k" / "microbench.parquet")
    [table] = nccl_tests_report(bench, TOPOLOGY).tables
    latency = table.latency_floor.net_latency_us
    assert round(latency) == 51  # the README's "about 51 us per hop"
    held_out = bench.filter(pa.compute.and_(pa.compute.greater(bench["size_bytes"], 64 * 2**10),
                                            pa.compute.less_equal(bench["size_bytes"], 2**20)))
    rows = replay_microbench(held_out, parse_spec(TOPOLOGY).replace(net_latency_us=latency))
    assert len(rows) == 4
    errors = sorted(abs(r.time_error) for r in rows)
    assert statistics.median(errors) < 0.35, errors  # the target for <= 1 MiB
    assert round(statistics.median(errors), 2) == 0.16  # the README's "within 16% (median)"
    before = sorted(abs(r.time_error) for r in replay_microbench(held_out, TOPOLOGY))
    assert before[len(before) // 2] > 1.0


def test_rows_skipped_for_any_reason_are_named_by_the_same_rule():
    """`replay_microbench` skips and `unreplayable` names through one rule (`not_replayable`): an
    in-place-only row (no out-of-place time) is named too, with its reason."""
    from tracekit.replay.microbench import not_replayable, unreplayable

    base = dict(source="a.log", run=0, test="all_gather_perf", op="all_gather", size_bytes=1 << 30, nranks=8,
                ranks_per_host=8, hosts=1, oop_time_us=2900.0, oop_busbw=None)
    rows = [base, {**base, "oop_time_us": None}, {**base, "op": None}]
    assert [not_replayable(r) for r in rows] == [None, "it has no out-of-place time", "its op is unknown"]
    table = pa.Table.from_pylist(rows)
    assert len(replay_microbench(table, "rail-optimized:hosts=1,gpus=8")) == 1
    assert sorted(f.text.split(": ", 3)[-1] for f in unreplayable(table)) == ["it has no out-of-place time",
                                                                              "its op is unknown"]
