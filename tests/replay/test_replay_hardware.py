"""Hardware profiles and the physics they feed: achievable NVLink, NIC and NVLS rates, NCCL's trees,
closed forms derived by hand, and the replay's error on real nccl-tests outputs no one here made."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.replay.naive import nccl_btree_children_naive
from tracekit.replay import hardware
from tracekit.replay.decompose import Instance, btree_parent, decompose_plan, dtree_parent
from tracekit.replay.microbench import replay_microbench
from tracekit.replay.simulate import route, simulate
from tracekit.replay.topology import TopologyError, build, parse_spec, with_gpu

REAL = Path(__file__).resolve().parents[2] / ".." / "shared" / "real_traces" / "nccl_tests"
NO_REAL = pytest.mark.skipif(not REAL.is_dir(), reason="needs ../shared/real_traces/nccl_tests")
MIB = 2**20
S = 2**30


def test_profiles_give_nccls_effective_nvlink_and_a_source():
    achieved = {name: round(p.nvlink_gbs, 1) for name, p in hardware.GPUS.items()}
    assert achieved == {"v100": 120.0, "a100": 240.0, "h100": 370.8, "h200": 370.8, "h800": 164.8, "b200": 721.8}
    assert all(p.source and p.nvlink_gbs < p.nvlink_line_gbs for p in hardware.GPUS.values())
    assert [hardware.nic_profile(g).fraction for g in (100, 200, 400)] == [0.96, 0.96, 0.94]


def test_gpu_field_sets_line_rates_and_explicit_fields_win():
    a100 = parse_spec("rail-optimized:gpus=8,gpu=a100")
    assert (a100.gpu, a100.nvlink_gbs, a100.nvls) == ("a100", 300.0, False)
    assert parse_spec("rail-optimized:gpus=8,gpu=A100,nvlink_gbs=250").nvlink_gbs == 250.0
    assert parse_spec("rail-optimized:gpus=8,gpu=h100").nvls
    with pytest.raises(TopologyError, match="gpu"):
        parse_spec("rail-optimized:gpu=z900")


def test_device_names_pick_the_profile_unless_the_spec_names_one():
    device = "NVIDIA H100 80GB HBM3"
    assert hardware.gpu_from_device(device) == "h100"
    assert hardware.gpu_from_device("Tesla V100-SXM2-32GB") == "v100"
    assert hardware.gpu_from_device("NVIDIA H100 PCIe") is None  # no NVSwitch, no NVLS
    picked = with_gpu(parse_spec("rail-optimized:hosts=1,gpus=8"), device)
    assert (picked.gpu, picked.nvls) == ("h100", True)
    assert not with_gpu(parse_spec("rail-optimized:hosts=1,gpus=8,nvls=false"), device).nvls
    assert with_gpu(parse_spec("rail-optimized:gpus=8,gpu=a100"), device).gpu == "a100"


def test_links_keep_line_rate_and_the_simulation_gets_the_achievable_rate():
    topo = build(parse_spec("rail-optimized:hosts=1,gpus=8,gpu=h100"))
    tiers = np.array(topo.links.column("tier").to_pylist())
    gbps = topo.links.column("gbps").to_numpy()
    assert set(gbps[tiers == "nvlink"]) == {450 * 8}
    nvlink_caps = topo.cap[:2 * len(tiers)][np.repeat(tiers == "nvlink", 2)]
    np.testing.assert_allclose(nvlink_caps, 370.8)  # B/ns = GB/s


# Closed forms, bandwidth term only (latencies zeroed). H100: B_nv = 370.8; 400G NIC: B_nic = 47.
PROFILE = "latency_ns=0,nvlink_latency_ns=0,gpu=h100,nic_gbps=400"
B_NV, B_NIC = 370.8, 47.0


def c_ring(hosts: int) -> float:
    """The measured ceiling of one ring channel over the network (docs/hardware.md), by hand."""
    return 22.27 - 0.713 * math.log2(hosts)



def _transfer_ns(spec: str, op: str, algo: str, n: int) -> float:
    topo = build(parse_spec(spec))
    dec = decompose_plan([Instance(0, op, list(range(n)), float(S))], topo, np.arange(n), algo=algo,
                         proto="Simple")
    return float(simulate(topo, *route(topo, dec.flows), dec.flows).finish.max())


@pytest.mark.parametrize("hosts, gpus, op, algo, by_hand", [
    # one host: a ring sends (n-1)/n S (x2 for all-reduce) through every GPU's NVLink port
    (1, 8, "all_gather", "ring", 7 / 8 * S / B_NV),
    (1, 8, "all_reduce", "ring", 2 * 7 / 8 * S / B_NV),
    # NVLS: S up and S down each port, at the measured multimem efficiency 0.74
    (1, 8, "all_reduce", "nvls", S / (0.74 * B_NV)),
    # 1 GPU per host: the NIC carries the ring's edge; NCCL's double binary tree's busiest host
    # sends 2 S (interior in one tree, leaf in the other), as S / 0.92
    (2, 1, "all_reduce", "ring", 2 * 1 / 2 * S / B_NIC),
    (8, 1, "all_reduce", "ring", 2 * 7 / 8 * S / B_NIC),
    (8, 1, "all_reduce", "tree", 2 * S / (0.92 * B_NIC)),
    (8, 1, "all_to_all", "ring", 7 / 8 * S / B_NIC),
    # 8 GPUs per host, 2 hosts: 16 channels, 2 per NIC; each channel enters and leaves a host on its
    # rail (PXN), so a GPU sends every channel over NVLink (16 r <= 370.8) and 2 over its NIC
    # (2 r <= 47), and a channel's network hop moves at most c(2) = 21.557: B_ring = min(B_nv,
    # 8 x 47, 16 c(2)) = 16 c(2) = 344.9
    (2, 8, "all_reduce", "ring", 2 * 15 / 16 * S / min(B_NV, 8 * B_NIC, 16 * c_ring(2))),
    # tree on 2 hosts: the rotated chain's NVLink (a GPU sends 2 x 7/8 S) binds below 8 NICs
    (2, 8, "all_reduce", "tree", S / (0.92 * B_NV * 8 / 14)),
    # tree on 8 hosts: a host's NICs carry 2 S: 8 x 47 / 2 = 188 < 211.9
    (8, 8, "all_reduce", "tree", 2 * S / (0.92 * 8 * B_NIC)),
    # all-to-all across 2 hosts: (n-g)/n of S leaves through each GPU's NIC
    (2, 8, "all_to_all", "ring", 8 / 16 * S / B_NIC),
    # 8 hosts x 8: the ring as on 2 hosts (the channel ceiling binds, 16 c(8) = 322.1), the
    # all-to-all's NIC carries 56/64 of S
    (8, 8, "all_reduce", "ring", 2 * 63 / 64 * S / min(B_NV, 8 * B_NIC, 16 * c_ring(8))),
    (8, 8, "all_to_all", "ring", 56 / 64 * S / B_NIC),
    # NVLS-tree on 2 hosts: NVLS inside (S / (0.74 B_nv) each way per GPU) binds before the heads'
    # tree over 8 NICs (S / (0.92 x 8 x 47) each way per host)
    (2, 8, "all_reduce", "nvls_tree", max(S / (0.74 * B_NV), S / (0.92 * 8 * B_NIC))),
])
def test_closed_forms_by_hand(hosts, gpus, op, algo, by_hand):
    spec = f"rail-optimized:hosts={hosts},gpus={gpus},{PROFILE}" + (",nvls=true" if "nvls" in algo else "")
    assert _transfer_ns(spec, op, algo, hosts * gpus) == pytest.approx(by_hand, rel=0.01)


@given(st.integers(1, 300))
def test_btree_matches_a_top_down_twin(m):
    children = nccl_btree_children_naive(m)
    parents = {c: p for p, cs in children.items() for c in cs}
    assert {pos: btree_parent(pos, m) for pos in range(1, m)} == parents
    assert btree_parent(0, m) is None


@given(st.integers(2, 300))
def test_double_tree_spans_and_splits_the_interior(m):
    for second in (False, True):
        for pos in range(m):
            seen, at = set(), pos
            while (up := dtree_parent(at, m, second)) is not None:
                assert up not in seen
                seen.add(up)
                at = up
    if m % 2 == 0:
        interior = [{p for p in (dtree_parent(x, m, t) for x in range(m)) if p is not None} for t in (False, True)]
        roots = {0, m - 1}
        assert not (interior[0] & interior[1]) - roots


# Real nccl-tests outputs (PROVENANCE.md in ../shared/real_traces/nccl_tests). The specs name only
# the shape: the GPU profile (and NVLS) comes from the device lines nccl-tests prints.
FILES = {
    "a3mega": ("all_reduce_perf_2node_16xH100.txt", "rail-optimized:gpus=8,nic_gbps=200"),
    "dgx": ("nvidia_exemplar_dgx_h100_1x8_all_reduce_perf.txt", "rail-optimized:hosts=1,gpus=8"),
    "n1": ("xxrjun_cluster01_N1_G8_cnode3-002_h100_5ops.log", "rail-optimized:hosts=1,gpus=8"),
    "n10": ("xxrjun_cluster01_N10_G8_h100_5ops.log", "rail-optimized:hosts=10,gpus=8,nic_gbps=400"),
}
_ROWS: dict[str, list] = {}


def _rows(key: str) -> list:
    if key not in _ROWS:
        from tracekit.workflows import open as open_run

        name, spec = FILES[key]
        run = open_run([REAL / name])
        _ROWS[key] = replay_microbench(run.table("microbench"), spec)
    return _ROWS[key]


def _median_abs_error(key: str, op: str, lo: int, hi: int) -> float:
    errs = [abs(r.error) for r in _rows(key) if r.op == op and lo <= r.size_bytes <= hi]
    assert errs, f"no {op} rows in {key} between {lo} and {hi} bytes"
    return statistics.median(errs)


LARGE = (64 * MIB, 2**62)
SMALL = (0, MIB)


@NO_REAL
@pytest.mark.parametrize("key, op", [("a3mega", "all_reduce"), ("dgx", "all_reduce"), ("n1", "all_reduce"),
                                     ("n1", "all_gather"), ("n1", "reduce_scatter"), ("n10", "all_to_all")])
def test_large_sizes_within_10_percent_on_real_runs(key, op):
    """NVLink- (n1 all-gather, reduce-scatter), NVLS- (dgx, n1 all-reduce) and NIC-bound (a3mega, n10
    all-to-all) alike: at line-rate NVLink the n1 rows are +27%, at NCCL's modelled NVLS +40%."""
    assert _median_abs_error(key, op, *LARGE) <= 0.10


@NO_REAL
def test_small_all_reduce_on_one_host_within_35_percent():
    """Latency-bound: NCCL's ring/LL latency (6.6 + 7 x 0.6 us) sets the time below 1 MiB."""
    assert _median_abs_error("dgx", "all_reduce", *SMALL) <= 0.35


@NO_REAL
@pytest.mark.parametrize("op, readme", [("all_gather", 0.055), ("reduce_scatter", 0.035)])
def test_ten_host_rings_within_10_percent(op, readme):
    """10 x 8 H100 rings measure ~318 GB/s busbw, 0.85 of the NICs' achievable 376: the ring-channel
    ceiling fitted on another cluster (B200, docs/hardware.md) gives 16 c(10) = 318.5. Out of sample
    for this file: without the ceiling the median is +16 to +19%. The README says 5% and 3%."""
    assert _median_abs_error("n10", op, *LARGE) <= min(0.10, readme)


@NO_REAL
@pytest.mark.parametrize("key, op, readme", [("n10", "all_reduce", 0.105), ("n1", "all_to_all", 0.115)])
def test_known_gaps_stay_as_the_readme_says(key, op, readme):
    """The README's known gaps (10 x 8 all-reduce 10.3%, one host's all-to-all 11%): still over the
    10% target, and no worse than stated."""
    assert 0.10 < _median_abs_error(key, op, *LARGE) <= readme


@NO_REAL
def test_ten_host_ring_plateau_matches_the_channel_ceiling():
    """At 4 GiB and up NCCL runs ring/Simple on 10 x 8 and every row is channel-bound: within 3%."""
    rows = [r for r in _rows("n10") if r.op in ("all_reduce", "all_gather", "reduce_scatter")
            and r.size_bytes >= 4_000_000_000]
    assert len(rows) == 9
    assert max(abs(r.error) for r in rows) <= 0.03


@NO_REAL
@pytest.mark.xfail(strict=True, reason="known gap: A3-Mega's GPUDirect-TCPXO has a ~120 us floor; NCCL's "
                   "InfiniBand latencies give ~25 us. replay --nccl-tests reads ~51 us per hop from the "
                   "table's floor (LatencyFloor) and net_latency_us= replays with it; uncalibrated, no "
                   "public TCPXO figure sets it")
def test_tcpxo_small_sizes_known_gap():
    assert _median_abs_error("a3mega", "all_reduce", *SMALL) <= 0.35
