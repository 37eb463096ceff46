"""The real NCCL logs in ../shared/real_traces/nccl_logs: every count is checked against an
independent scan of the file (grep-like regexes written here, not the parser's)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest
from nccl_helpers import parse_file

from tracekit import schema
from tracekit.parsers.detect import detect_format

REAL = Path(__file__).resolve().parents[2] / ".." / "shared" / "real_traces" / "nccl_logs"
GF = "gfbench_nccl2.20.5_straggler_2gpu"
FILES = [
    f"{GF}/nccl_logs_2e194b931ff6_15980.txt",
    f"{GF}/nccl_logs_2e194b931ff6_15981.txt",
    "slurmv4_nccl2.27.5_2node_16rank_roce/node_tpgds-aihub0008_ranks8-15.log",
    "slurmv4_nccl2.29.3_2node_16rank_roce/node_tpgds-aihub0003.log",
]

COLL = re.compile(r"NCCL INFO (\w+): opCount ([0-9a-f]+) .* comm (0x[0-9a-f]+) \[nranks=(\d+)\]")
INIT = re.compile(r"(\S+):(\d+):\d+ \[\d+\] NCCL INFO .*comm (0x[0-9a-f]+) rank (\d+) nranks (\d+).* - Init")
COMM_ID = re.compile(r"commId (0x[0-9a-f]+)")
PROC = re.compile(r"^(\S+):(\d+):\d+ ")
VIA = re.compile(r"NCCL INFO Channel (\d+)(?:/\d+)? : (\d+)\[\d+\] -> (\d+)\[\d+\] (\[(send|receive)\] )?via (\w+)")
CHANNELS = re.compile(r"NCCL INFO (\d+) coll channels")


@pytest.fixture(scope="module", params=FILES, ids=[f.split("/")[0][:20] + "/" + f.rsplit("/", 1)[1][:16]
                                                   for f in FILES])
def real(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object, list[str]]:
    path = REAL / request.param
    if not path.is_file():
        pytest.skip(f"real traces not present at {REAL}")
    parsed = parse_file(path, tmp_path_factory.mktemp("run"))
    return path, parsed, path.read_text().splitlines()


def test_detected_by_content(real: tuple) -> None:
    path, _, _ = real
    assert detect_format(path) == "nccl_log"


def test_every_line_accounted(real: tuple) -> None:
    _, p, lines = real
    assert p.result.stats.read == sum(1 for ln in lines if ln.strip())
    assert p.result.stats.skipped.get("not an NCCL line", 0) == 0


def test_coll_lines(real: tuple) -> None:
    _, p, lines = real
    found = [m for ln in lines if (m := COLL.search(ln))]
    coll = p.rows("collectives")
    assert len(coll) == len(found) == p.result.collectives
    assert [r["seq"] for r in coll] == [int(m.group(2), 16) for m in found]
    assert Counter(r["name"] for r in coll) == Counter(m.group(1) for m in found)
    assert {r["nranks"] for r in coll} == {int(m.group(4)) for m in found}


def test_communicators_and_processes(real: tuple) -> None:
    _, p, lines = real
    comms = {(m.group(1), m.group(2), m.group(3)) for ln in lines if (m := INIT.search(ln))}
    procs = {m.groups() for ln in lines if (m := PROC.search(ln))}
    comm_ids = {m.group(1) for ln in lines if " - Init" in ln and (m := COMM_ID.search(ln))}
    assert p.result.communicators == len(comms)
    assert p.result.processes == len(procs)
    assert {g["group"] for g in p.rows("groups")} == {"0x" + c[2:].rjust(16, "0") for c in comm_ids}
    ranks = {int(m.group(4)) for ln in lines if (m := INIT.search(ln))}
    assert sorted(p.result.ranks) == sorted(ranks)


def test_channels_by_transport(real: tuple) -> None:
    _, p, lines = real
    edges = [m for ln in lines if (m := VIA.search(ln))]
    by_transport = Counter(m.group(6) for m in edges)
    rows = p.rows("channels")
    for m in edges:
        ch, a, b, side, transport = int(m.group(1)), int(m.group(2)), int(m.group(3)), m.group(5), m.group(6)
        me, peer = (b, a) if side == "receive" else (a, b)
        assert any(r["rank"] == me and r["channel"] == ch and r["peer_rank"] == peer and r["transport"] == transport
                   for r in rows), m.group(0)
    printed = Counter(r["transport"] for r in rows if not r.get("inherited"))
    for transport in by_transport:
        assert printed[transport] > 0
    n_channels = {int(m.group(1)) for ln in lines if (m := CHANNELS.search(ln))} or {
        len({int(m.group(1)) for m in edges})}
    ring = Counter(r["rank"] for r in rows if r["pattern"] == "ring" and r["direction"] == "send")
    assert set(ring.values()) == n_channels
    assert all(r["transport"] is not None for r in rows)


def test_numbers_of_the_real_files(real: tuple) -> None:
    """Figures read off the files by hand (cross-check of the scans above), and the NICs: the
    devices NCCL listed (`NET/IB : Using [i]name`) at the indices the NET lines name."""
    path, p, lines = real
    name = path.name
    transports = Counter((r["pattern"], r["transport"]) for r in p.rows("channels"))
    if name.startswith("nccl_logs_2e194b931ff6_1598"):
        assert transports == {("ring", "SHM"): 2, ("tree", "SHM"): 2}
        return
    assert transports == {("ring", "P2P"): 112, ("ring", "NET"): 32, ("tree", "P2P"): 224, ("tree", "NET"): 16}
    listed = dict(re.findall(r"\[(\d+)\](mlx5_\d+:\d+)", next(ln for ln in lines if "NET/IB : Using" in ln)))
    used = {m.group(1) for ln in lines if (m := re.search(r"via NET/IB/(\d+)", ln))}
    nics = {r["nic"] for r in p.rows("channels") if r["transport"] == "NET"}
    assert nics == {listed[i] for i in used} and len(nics) == 8


def test_gfbench_straggler_is_rank_0(tmp_path: Path) -> None:
    """Rank 1 enqueued opCount 0..0x11, rank 0 only reached 0x10 (the delayed rank)."""
    if not (REAL / GF).is_dir():
        pytest.skip(f"real traces not present at {REAL}")
    from tracekit.workflows import hang as hang_from_paths

    result = hang_from_paths([str(REAL / GF)], out=tmp_path / "run")
    (g,) = result.groups
    assert g.last_seq == {0: 0x10, 1: 0x11}
    assert (g.status, g.first_divergent_seq, g.missing_ranks, g.suspects) == ("hang", 0x11, [0], [0])
    assert result.suspects == [0]
    assert any("Rank 0 ran on host 2e194b931ff6, GPU 0 (pid 15980)" in f.text for f in result.findings)
    assert result.source == "nccl_log"


ORDER = re.compile(r"NCCL INFO Channel (\d+)/(\d+) :((?: +\d+)+) *$")


def test_ring_orders_reach_replay(real: tuple) -> None:
    """The rings rank 0 printed (`Channel 00/16 :  0  7  6 ...`) are the replay's rings, one per
    channel NCCL built; the network edges go through the NICs the NET lines name."""
    from tracekit.nccl_fabric import replay_fabric

    _, p, lines = real
    printed = {int(m.group(1)): [int(x) for x in m.group(3).split()] for ln in lines if (m := ORDER.search(ln))}
    groups = schema.conform("groups", pa.Table.from_pylist(p.rows("groups")))
    fab = replay_fabric(groups, p.tables["channels"])
    n_channels = {int(m.group(1)) for ln in lines if (m := CHANNELS.search(ln))}
    for g in p.rows("groups"):
        if g["ring_orders"]:
            assert [list(o) for o in g["ring_orders"]] == [printed[c] for c in sorted(printed)]
    if not printed:
        return
    (world,) = [g["group"] for g in p.rows("groups") if g["ring_orders"]]
    rings = fab.rings[world]
    assert len(rings) == fab.channels[world] == max(n_channels or {len(printed)})
    assert all(rings[c] == printed[c % len(printed)] for c in range(len(rings)))
    send = re.compile(r"Channel (\d+)/\d+ : (\d+)\[\d+\] -> (\d+)\[\d+\] \[send\] via NET")

    def on_ring(c: int, a: int, b: int) -> bool:
        o = printed[c % len(printed)]
        return o[(o.index(a) + 1) % len(o)] == b

    net = [m for ln in lines if (m := send.search(ln)) and on_ring(*(int(x) for x in m.groups()))]
    if not net:
        assert world not in fab.hops
        return
    hops = fab.hops[world]
    recv = re.compile(r"Channel (\d+)/\d+ : (\d+)\[\d+\] -> (\d+)\[\d+\] \[receive\] via NET")
    got = [m for ln in lines if (m := recv.search(ln)) and on_ring(*(int(x) for x in m.groups()))]
    assert set(hops) == {tuple(int(x) for x in m.groups()) for m in net + got}
    assert all(hops[(int(m.group(1)), int(m.group(2)), int(m.group(3)))][1] == int(m.group(3)) for m in got)
    assert all(hops[(int(m.group(1)), int(m.group(2)), int(m.group(3)))][0] == int(m.group(2)) for m in net)
