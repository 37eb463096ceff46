"""Checkpoint and data-loading traffic on the front-end vs the back-end, against closed forms."""

import pyarrow as pa
import pytest
from whatif_helpers import RunBuilder

from tracekit.replay import build, describe, parse_spec
from tracekit.replay.topology import TopologyError
from tracekit.results import to_builtins
from tracekit.whatif import WhatIfError, make_baseline, parse_scenario, run_scenario
from tracekit.whatif.storage import other_traffic

C_GBPS = 100.0  # back-end NIC
S = 50_000_000  # all-reduce bytes
TOPO = f"single-switch:gpus=1,nic_gbps={C_GBPS:g},pcie_gbps=2000,nic_efficiency=1"


def _run():
    """Two ranks on two hosts: an all-reduce of S bytes at the start of the step (one ring channel,
    Simple protocol, as an NCCL log would say), then compute."""
    b = RunBuilder({0: ("a", 0), 1: ("b", 0)})
    b.collective("dp", [0, 1], "all_reduce", "DP", dur=5_000_000, nbytes=S, ring=True)
    for r in (0, 1):
        b.compute(r, 1_000_000)
    return b.tables()


@pytest.fixture(scope="module")
def base():
    return make_baseline(_run(), TOPO)


def _all_reduce_ns(result):
    return result.step_ns, next(i.replayed_ns for i in result.instances if i.op == "all_reduce")


def _efficiency(base):
    (eta,) = base.replay.efficiency.values()
    return eta


@pytest.mark.parametrize("ckpt_bytes", [S // 2, 2 * S])
def test_backend_checkpoint_slows_the_all_reduce_by_the_closed_form(base, ckpt_bytes):
    # Ring all-reduce of 2 ranks: S bytes each way, rank 0 -> 1 over NIC 0's uplink. Rank 0's
    # checkpoint of B bytes shares that uplink from the same instant: both get C/2 until the
    # shorter ends. B < S: the all-reduce ends at 2B/C + (S - B)/C, B >= S: at 2S/C. The slowdown
    # is min(B, S)/C, times the baseline's calibration.
    sc = f"checkpoint:bytes_per_rank={ckpt_bytes},at=start,via=backend,storage=1,storage_gbps={20 * C_GBPS:g}"
    r = run_scenario(base, sc)
    before = next(i.replayed_ns for i in base.result.instances)
    after = next(i.replayed_ns for i in base.replay_with(
        topology=parse_spec(TOPO).replace(storage=1, storage_network="backend", storage_gbps=20 * C_GBPS),
        storage=_flows(base, ckpt_bytes)).instances)
    c = C_GBPS / 8
    assert after - before == pytest.approx(_efficiency(base) * min(ckpt_bytes, S) / c, rel=1e-4)
    assert len(r.slowed) == 1 and r.slowed[0].op == "all_reduce"
    assert r.slowed[0].scenario_ns - r.slowed[0].baseline_ns == pytest.approx(after - before, abs=1)
    # the checkpoint alone after the all-reduce ends (B > S) or while sharing (B < S): per rank
    # 2 min(B, S)/C + (B - min(B, S))/C, plus latency over NIC-leaf and leaf-storage (600 ns each)
    shared = min(ckpt_bytes, S)
    assert r.checkpoint_ns == pytest.approx(2 * shared / c + (ckpt_bytes - shared) / c + 1200, rel=1e-4)
    assert r.step_change.after > r.step_change.before


def _flows(base, nbytes):
    from tracekit.whatif.storage import storage_flows

    return storage_flows(base.tables, base.placement.slots, kind="checkpoint", bytes_per_rank=nbytes,
                         every=1, at=0.0, storage=1)


@pytest.mark.parametrize("pcie_gbps", [2000, C_GBPS])
def test_frontend_checkpoint_never_slows_a_collective(pcie_gbps):
    # A dedicated front-end (F = 25 Gb/s per host) carries the checkpoint: the all-reduce and the
    # step are exactly the baseline's (also when PCIe is as slow as the NIC, so that sharing any
    # GPU-side link would show); the checkpoint takes B / F plus 3 hops of 600 ns.
    base = make_baseline(_run(), f"single-switch:gpus=1,nic_gbps={C_GBPS:g},pcie_gbps={pcie_gbps:g},nic_efficiency=1")
    r = run_scenario(base, f"checkpoint:bytes_per_rank={2 * S},at=start,via=frontend,storage=1,frontend_gbps=25")
    assert r.slowed == []
    assert r.step_ns == r.baseline_step_ns and r.exposed_ns == r.baseline_exposed_ns
    assert r.checkpoint_ns == pytest.approx(2 * S / (25 / 8) + 1800, rel=1e-6)
    back = run_scenario(base, f"checkpoint:bytes_per_rank={2 * S},at=start,via=backend,storage=1,"
                              f"storage_gbps={20 * C_GBPS:g}")
    assert back.checkpoint_ns < r.checkpoint_ns and back.slowed


def test_storage_nodes_do_not_change_the_baseline(base):
    with_storage = parse_spec(TOPO).replace(storage=2, storage_network="backend")
    assert base.replay_with(topology=with_storage).step_ns == base.result.step_ns
    fe = parse_spec(TOPO).replace(frontend_gbps=100, storage=2)
    assert base.replay_with(topology=fe).step_ns == base.result.step_ns


def test_dataload_reads_from_storage(base):
    r = run_scenario(base, f"dataload:bytes_per_rank={S},via=backend,storage=1,storage_gbps={20 * C_GBPS:g}")
    assert r.checkpoint_ns is None and r.details["transfer_ns"]["dataload@step0"] > 0
    # reads come down leaf -> NIC, the all-reduce's 1 -> 0 flow shares leaf -> NIC 0: same closed form
    assert len(r.slowed) == 1
    assert r.details["storage_bytes"] == 2 * S


def test_every_selects_steps():
    b = RunBuilder({0: ("a", 0), 1: ("b", 0)})
    for step in range(4):
        b.collective("dp", [0, 1], "all_reduce", "DP", dur=5_000_000, nbytes=S, step=step)
        for r in (0, 1):
            b.compute(r, 1_000_000, step=step)
    base = make_baseline(b.tables(), TOPO)
    r = run_scenario(base, "checkpoint:bytes_per_rank=1MB,every=2,via=frontend")
    assert sorted(r.details["transfer_ns"]) == ["checkpoint@step1", "checkpoint@step3"]
    with pytest.raises(WhatIfError, match="selects none"):
        run_scenario(base, "checkpoint:bytes_per_rank=1MB,every=5")


@pytest.mark.parametrize(("text", "message"), [
    ("checkpoint:every=2", "'bytes_per_rank' is required"),
    ("checkpoint:bytes_per_rank=4XB", "expects bytes"),
    ("checkpoint:bytes_per_rank=4GB,via=sideband", "frontend or backend"),
    ("checkpoint:bytes_per_rank=4GB,at=1.5", "fraction of the step"),
    ("dataload:bytes_per_rank=1GB,storage=0", "must be >= 1"),
])
def test_bad_fields(text, message):
    with pytest.raises(WhatIfError, match=message):
        parse_scenario(text)


def test_topology_front_end_and_storage_fields(tmp_path):
    spec = parse_spec("rail-optimized:hosts=4,gpus=4,frontend_gbps=200,storage=2")
    topo = build(spec)
    nets = dict(zip(topo.links.column("link").to_pylist(), topo.links.column("network").to_pylist(), strict=True))
    assert nets["h0/fe-nic0--fe/tor0"] == "frontend" and nets["storage1--fe/agg"] == "frontend"
    assert nets["h0/nic0--p0/leaf0"] == "backend"
    kinds = dict(zip(topo.nodes.column("node").to_pylist(), topo.nodes.column("kind").to_pylist(), strict=True))
    assert kinds["storage0"] == "storage"
    info = describe(topo)
    assert info.links_per_tier["host-tor"].links == 4
    assert info.links_per_tier["tor-agg"].gbps == 800
    assert to_builtins(info.storage) == {"nodes": 2, "network": "frontend", "gbps": 400.0}
    (tmp_path / "t.yaml").write_text("preset: rail-optimized\nfrontend_gbps: 100\nstorage: 1\n"
                                     "storage_network: backend\n")
    assert parse_spec(str(tmp_path / "t.yaml")).storage_network == "backend"
    with pytest.raises(TopologyError, match="'frontend_gbps'"):
        parse_spec("rail-optimized:storage=2")
    with pytest.raises(TopologyError, match="'storage_network'"):
        parse_spec("rail-optimized:storage=2,storage_network=moon")
    plain = build(parse_spec("rail-optimized:hosts=4,gpus=4"))
    assert set(plain.links.column("network").to_pylist()) == {"backend"}


def test_telemetry_beyond_the_replay_is_other_traffic(base):
    # Telemetry counted the replayed bytes plus 7 MB on one link over the replayed span, and 2 MB
    # in a sample half inside the span: 7 + 1 MB the trace cannot explain.
    rep = base.result.link_samples
    link = "h0/nic0--p0/leaf0"
    t0 = min(rep.column("ts_ns").to_pylist())
    span = max(rep.column("ts_ns").to_pylist()) + rep.column("interval_ns")[0].as_py() - t0
    replayed = sum(tx + rx for name, tx, rx in zip(rep.column("link").to_pylist(), rep.column("tx_bytes").to_pylist(),
                                                   rep.column("rx_bytes").to_pylist(), strict=True) if name == link)
    tel = pa.table({"link": [link, link, "unknown-link"], "ts_ns": [t0, t0 + span // 2, t0],
                    "interval_ns": [span, span, span], "tx_bytes": [replayed + 7e6, 2e6, 5.0],
                    "rx_bytes": [0.0, 0.0, 0.0], "origin": ["telemetry"] * 3})
    other = other_traffic(tel, base.result)
    assert len(other) == 1 and other[0]["link"] == link
    assert other[0]["other_bytes"] == pytest.approx(8e6, abs=2)
    assert other_traffic(None, base.result) is None
    quiet = pa.table({"link": [link], "ts_ns": [t0], "interval_ns": [span], "tx_bytes": [replayed / 2],
                      "rx_bytes": [0.0], "origin": ["telemetry"]})
    assert other_traffic(quiet, base.result)[0]["other_bytes"] == 0


def test_telemetry_in_the_run_is_reported(base):
    rep = base.result.link_samples
    t0 = min(rep.column("ts_ns").to_pylist())
    tel = pa.table({"link": ["h1/nic0--p0/leaf0", "sw7/p3--sw9/p1"], "ts_ns": [t0, t0], "interval_ns": [10**7] * 2,
                    "tx_bytes": [9e8, 1.0], "rx_bytes": [0.0, 0.0], "origin": ["telemetry"] * 2})
    with_tel = make_baseline({**_run(), "link_samples": tel}, TOPO)
    r = run_scenario(with_tel, "checkpoint:bytes_per_rank=1MB,via=frontend")
    assert [x["link"] for x in r.details["other_traffic"]] == ["h1/nic0--p0/leaf0"]
    assert any("telemetry on 1 link(s)" in n for n in r.notes)
    unmatched = make_baseline({**_run(), "link_samples": tel.slice(1)}, TOPO)
    notes = run_scenario(unmatched, "checkpoint:bytes_per_rank=1MB").notes
    assert any("none of its links is named" in n for n in notes)
