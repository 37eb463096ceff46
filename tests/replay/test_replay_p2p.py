"""Point-to-point as NCCL runs it: channels per peer, the per-channel ceiling, the p2p latency, and
nccl-tests' sendrecv (a ring of pairs) against real runs no one on the project made.

The real files (xxrjun N1 G8 and N10 G8, NCCL 2.29.2) are read by an independent split of their
data lines, not by the parser; nothing here was fitted to them. NVLink is given at NCCL's
achievable 370.8 GB/s (docs/hardware.md 1.1), as the hardware profiles will give it.
"""

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from tracekit.replay import tuning
from tracekit.replay.decompose import Instance, decompose_plan
from tracekit.replay.microbench import busbw_factor, replay_microbench
from tracekit.replay.simulate import Flows, route, simulate
from tracekit.replay.topology import build, parse_spec

REAL = Path(__file__).resolve().parents[2] / ".." / "shared" / "real_traces" / "nccl_tests"
N1 = REAL / "xxrjun_cluster01_N1_G8_cnode3-002_h100_5ops.log"
N10 = REAL / "xxrjun_cluster01_N10_G8_h100_5ops.log"
N1_SPEC = "rail-optimized:hosts=1,gpus=8"  # the H100 profile: NVLink 450 line, 370.8 achieved
N10_SPEC = "rail-optimized:hosts=10,gpus=8,nic_gbps=400"
MIB = 2**20


def _measured(path: Path, test: str) -> list[tuple[int, float]]:
    """(size, out-of-place time in us) of one test's table, split by hand (13 columns)."""
    rows, inside = [], False
    for line in path.read_text().splitlines():
        if "Collective test starting:" in line:
            inside = line.split(":")[-1].strip() == test
        f = line.split()
        if inside and len(f) == 13 and f[0].isdigit():
            rows.append((int(f[0]), float(f[5])))
    return rows


def _table(op: str, n: int, per_host: int, rows: list[tuple[int, float]]) -> pa.Table:
    return pa.Table.from_pylist([dict(op=op, size_bytes=size, nranks=n, ranks_per_host=per_host,
                                      hosts=n // per_host, oop_time_us=t, oop_busbw=None) for size, t in rows])


def _median_abs(errors: list[float]) -> float:
    return float(np.median(np.abs(errors)))


# ---- the per-flow rate limit -------------------------------------------------------------------

def test_rate_limited_flow_leaves_the_rest_of_a_nic_to_its_neighbour():
    """Two flows leave GPU 0's 50 GB/s NIC (400G); one is limited to 14 GB/s (one p2p channel):
    it takes S / 14, the other gets the remaining 36 until the first ends, then all 50. The naive
    simulator on the same extended resources agrees (the limit is a resource private to its flow)."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from naive import simulate_naive

    from tracekit.replay.simulate import with_rate_limits

    topo = build(parse_spec("rail-optimized:hosts=2,gpus=1,nic_gbps=400,latency_ns=0,nic_efficiency=1"))
    S = 14e6
    flows = Flows.from_lists([0, 0], [1, 1], [S, 3 * S], max_gbs=[14.0, np.inf], channel=[0, 1])
    indptr, ids = route(topo, flows)
    finish = simulate(topo, indptr, ids, flows).finish
    t0 = S / 14.0
    assert finish[0] == pytest.approx(t0, rel=1e-6)
    assert finish[1] == pytest.approx(t0 + (3 * S - 36.0 * t0) / 50.0, rel=1e-6)
    ip2, ids2, cap2, lat2 = with_rate_limits(indptr, ids, flows.max_gbs, topo.cap, topo.res_latency)
    assert ids2.size == ids.size + 1 and cap2[-1] == 14.0
    naive = simulate_naive(ip2, ids2, flows.nbytes, flows.release, flows.lat_mult, cap2, lat2)
    np.testing.assert_allclose(finish, naive, rtol=1e-9)
    unlimited = Flows.from_lists([0, 0], [1, 1], [S, 3 * S], channel=[0, 1])
    assert simulate(topo, indptr, ids, unlimited).finish[0] == pytest.approx(2 * S / 50.0, rel=1e-6)


# ---- NCCL's rules, by hand ---------------------------------------------------------------------

def test_channels_per_peer_follow_nccls_rules():
    """paths.cc and enqueue.cc, by hand. One H100 host: every peer over 18 NVLinks gets 2 x 18 =
    36 channels, a power of two (64), capped by the 32 p2p channels; an operation starts from
    32 halved until 8 ranks fit once (4). 10 x 8 H100, one 400G NIC per GPU: a network peer gets
    max(1 NIC, ceil(50 / 14)) = 4; 16 p2p channels (2 per NIC); 4 x ceil(80 / 8) = 40 > 16, halved
    to 1. 2 x 8 with 200G NICs: ceil(25 / 14) = 2, and 2 x ceil(16 / 8) fits 16: 2 (as NCCL
    2.27's log in real_traces/nccl_logs/slurmv4_nccl2.27.5_2node_16rank_roce says)."""
    cases = {N1_SPEC: (32, 32, 4, "nvlink"), N10_SPEC: (16, 1, 1, "net"),
             "rail-optimized:hosts=2,gpus=8,nic_gbps=200": (16, 2, 1, "net")}
    for text, expected in cases.items():
        spec = parse_spec(text)
        p2p = tuning.p2p_channels_per_peer(spec, tuning.shape_of(spec))
        assert (p2p.channels, p2p.per_peer, p2p.min_per_op, p2p.link) == expected, text
    # NCCL 2.30 lets nccl-tests' sendrecv say it has 2 peers (maxP2pPeers): 4 x 1 fits, 4 channels
    spec = parse_spec(N10_SPEC)
    assert tuning.p2p_channels_per_peer(spec, tuning.shape_of(spec), max_peers=2).per_peer == 4


def test_channel_count_across_hosts_follows_nccls_search_and_connect():
    """search.cc and connect.cc by hand, H100: a 400G port (50 GB/s) takes the 48 GB/s search step,
    one channel per port; up to 4 channels at >= 25 GB/s are duplicated (24 GB/s each), then the
    connect step doubles them: 4 per port at 1, 2 and 4 GPUs per host, and 2 per port at 8 (8
    channels at 48 are not duplicated on Hopper: 16). A 200G port (24 GB/s step) is never
    duplicated: 2 per port. On Ampere the >4 exception does not apply: 8 x 400G gives 32. Hopper
    doubles once more while a channel carries over 45 GB/s and there are fewer than 16."""
    cases = {"rail-optimized:hosts=10,gpus=1,nic_gbps=400": 4, "rail-optimized:hosts=10,gpus=2,nic_gbps=400": 8,
             "rail-optimized:hosts=10,gpus=4,nic_gbps=400": 16, N10_SPEC: 16,
             "rail-optimized:hosts=2,gpus=1,nic_gbps=200": 2, "rail-optimized:hosts=2,gpus=8,nic_gbps=200": 16,
             "rail-optimized:hosts=2,gpus=8,nic_gbps=400,gpu=a100": 32,
             # 6 ports at 48 GB/s: not duplicated, 12 after connect, doubled again (> 45 GB/s, < 16)
             "rail-optimized:hosts=2,gpus=6,nic_gbps=400": 24,
             # Blackwell, 800G: the 96 GB/s step is duplicated even with 8 channels (>= 50): 32
             "rail-optimized:hosts=2,gpus=8,nic_gbps=800,pcie_gbps=1024,gpu=b200": 32}
    for text, expected in cases.items():
        spec = parse_spec(text)
        assert tuning.default_channels(spec, tuning.shape_of(spec)) == expected, text
    # a 2-rank comm across hosts of 8 GPUs has one GPU and one NIC per host in the comm: 4
    spec = parse_spec(N10_SPEC)
    assert tuning.default_channels(spec, tuning.shape_of(spec, [0, 8])) == 4


def test_two_rank_pair_across_400g_hosts_is_bound_by_the_nic():
    """A send between two hosts' GPUs gets 4 comm channels, so 4 p2p channels per peer at 14 GB/s:
    56 GB/s of channels over a 47 GB/s NIC, which binds (a measured 400G pair reaches 44 GB/s,
    docs/hardware.md 6, out of sample)."""
    spec = parse_spec("rail-optimized:hosts=2,gpus=1,nic_gbps=400")
    p2p = tuning.p2p_channels_per_peer(spec, tuning.shape_of(spec))
    assert (p2p.channels, p2p.per_peer) == (4, 4)


def test_operation_channels_grow_with_size_on_nvlink():
    """One H100 host: 4 channels up to 64 MiB (parts of at most 16 MiB = 32 chunks of 512 KiB),
    then doubled per doubling of the size up to the 32 per peer."""
    spec = parse_spec(N1_SPEC)
    p2p = tuning.p2p_channels_per_peer(spec, tuning.shape_of(spec))
    sizes = np.array([4096, 32 * MIB, 64 * MIB, 128 * MIB, 256 * MIB, 512 * MIB, 16 * 2**30])
    assert p2p.op_channels(sizes, 1).tolist() == [1, 4, 4, 8, 16, 32, 32]
    assert tuning.p2p_proto(4096, 1) == "LL" and tuning.p2p_proto(64 * 1024, 1) == "Simple"


def test_p2p_latency_from_nccls_ring_constants():
    """No p2p model in NCCL's tuning: base + one hop of the link (ring constants, Hopper), once per
    round of 8 operations a channel runs in sequence."""
    assert tuning.p2p_latency_us("LL", "nvlink") == pytest.approx(6.6 + 0.6)
    assert tuning.p2p_latency_us("Simple", "net") == pytest.approx(8.4 + 14.0)
    p2p = tuning.P2pChannels(channels=16, per_peer=1, min_per_op=1, link="net")
    # 255 peers of 1 channel over 16 channels x 8 per batch: 2 rounds
    assert tuning.p2p_latency_us("Simple", "net", peers=255, op_channels=1, p2p=p2p) == pytest.approx(8.4 + 2 * 14)


# ---- sendrecv against the real runs ------------------------------------------------------------

@pytest.mark.skipif(not N1.is_file(), reason="needs ../shared/real_traces")
def test_sendrecv_one_h100_host_within_15_percent_from_64_mib():
    """8 ranks over NVLink: at >= 512 MiB 32 channels, NVLink-bound (370.8, measured 356-367); at
    64-256 MiB 4-16 channels of about one NVLink (20.6 GB/s) each (measured 82, 163, 299)."""
    rows = replay_microbench(_table("sendrecv", 8, 8, _measured(N1, "sendrecv_perf")), N1_SPEC)
    assert len(rows) == 10 and {r.op for r in rows} == {"sendrecv"}
    large = [r for r in rows if r.size_bytes >= 64 * MIB]
    assert _median_abs([r.error for r in large]) <= 0.15, [(r.size_bytes, round(r.error, 3)) for r in large]
    by_size = {r.size_bytes: r for r in rows}
    assert by_size[64 * MIB].predicted_busbw == pytest.approx(4 * 20.6, rel=0.05)
    assert by_size[16 * 2**30].predicted_busbw == pytest.approx(370.8, rel=0.01)
    assert all(r.predicted_us > 1.0 for r in rows)


@pytest.mark.skipif(not N10.is_file(), reason="needs ../shared/real_traces")
def test_sendrecv_ten_h100_hosts_within_15_percent():
    """80 ranks in a ring of pairs: 10 pairs cross hosts. One channel per peer (4 halved to fit 80
    peers in 16 channels), 14 GB/s per network channel: the crossing pairs set the time (nccl-tests
    averages the ranks' times, and every rank waits on its predecessor each iteration). Measured
    15.2 GB/s; 100G per NIC would be 50."""
    rows = replay_microbench(_table("sendrecv", 80, 8, _measured(N10, "sendrecv_perf")), N10_SPEC)
    assert len(rows) == 10
    assert _median_abs([r.error for r in rows if r.size_bytes >= 64 * MIB]) <= 0.15
    assert all(r.predicted_busbw == pytest.approx(14.0, rel=0.02) for r in rows if r.size_bytes >= 64 * MIB)
    assert busbw_factor("sendrecv", 80) == 1.0


def test_sendrecv_on_nccl_2_30_keeps_four_channels_per_network_peer():
    """nccl-tests 2.18.3+ built on NCCL 2.30 declares 2 p2p peers for sendrecv (maxP2pPeers), so
    the 4 channels per network peer are not halved: 4 x 14 GB/s exceeds a 400G NIC's achieved 47 GB/s, which binds.
    The xxrjun run (nccl-tests 2.17.8, NCCL 2.29.2) keeps the halving."""
    rows = [dict(op="sendrecv", size_bytes=1 << 30, nranks=80, ranks_per_host=8, hosts=10, oop_time_us=70_000.0,
                 oop_busbw=None, nccl_version=nccl, tests_version=tests)
            for nccl, tests in (("2.30.7", "2.19.6"), ("2.29.2", "2.17.8"), ("2.30.7", "2.17.8"))]
    new, old, old_tests = replay_microbench(pa.Table.from_pylist(rows), N10_SPEC)
    assert new.predicted_busbw == pytest.approx(0.94 * 50.0, rel=0.03)
    assert old.predicted_busbw == pytest.approx(14.0, rel=0.02) == old_tests.predicted_busbw


def test_sendrecv_is_a_ring_of_sends():
    """nccl-tests' sendrecv: rank r sends S to r+1 (src/sendrecv.cu), every rank at once."""
    topo = build(parse_spec("rail-optimized:hosts=2,gpus=4,nic_gbps=400"))
    dec = decompose_plan([Instance(0, "sendrecv", list(range(8)), 64 * MIB)], topo, np.arange(8))
    pairs = sorted({(int(s), int(d)) for s, d in zip(dec.flows.src, dec.flows.dst, strict=True)})
    assert pairs == [(r, (r + 1) % 8) for r in range(8)]
    sent = np.bincount(dec.flows.src, weights=dec.flows.nbytes, minlength=8)
    assert sent.tolist() == [64 * MIB] * 8
    crossing = dec.flows.src // 4 != dec.flows.dst // 4
    assert set(dec.flows.max_gbs[crossing].tolist()) == {14.0}
    assert dec.plans[0].algo == "p2p" and dec.latency_ns[0] > 0


# ---- latency: never near zero ------------------------------------------------------------------

def test_small_all_to_all_and_send_have_nccls_floor():
    """DLRM's 24 KiB all-to-all on 8 GPUs of one host (8-11 us measured; NCCL's floor 5-10 us):
    3 KiB per peer goes as LL, 6.6 + 0.6 us plus under a microsecond of path and transfer. A 1 KiB
    send between hosts: 6.6 + 2.7 us plus the same."""
    spec = "rail-optimized:hosts=1,gpus=8,nvlink_gbs=150"
    rows = replay_microbench(_table("all_to_all", 8, 8, [(24 * 1024, 9.0)]), spec)
    assert rows[0].proto == "LL" and rows[0].predicted_us >= 5.0
    assert 7.2 < rows[0].predicted_us < 8.2
    rows = replay_microbench(_table("sendrecv", 16, 8, [(1024, 20.0)]),
                             "rail-optimized:hosts=2,gpus=8,nic_gbps=400")
    assert 9.3 < rows[0].predicted_us < 11.5  # the path adds 1.5 us of switch and cable latency


def test_all_to_all_latency_is_in_the_plan():
    topo = build(parse_spec("rail-optimized:hosts=2,gpus=8,nic_gbps=400"))
    dec = decompose_plan([Instance(0, "all_to_all", list(range(16)), 16 * MIB)], topo, np.arange(16))
    assert dec.latency_ns[0] == pytest.approx((8.4 + 14.0) * 1000)
    indptr, ids = route(topo, dec.flows)
    assert float(simulate(topo, indptr, ids, dec.flows).finish.max()) > 0
