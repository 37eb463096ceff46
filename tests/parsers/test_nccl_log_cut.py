"""Cut and lazily connected NCCL logs: COLL lines whose communicator's Init lines are missing are
kept in `unranked_collectives` (global rank null, with the reason); channel lines printed after
Init COMPLETE by another thread (lazy connection setup, NCCL 2.22+) join their process's
communicator. Small made-up logs reproduce each case; the real logs that showed them are read
when present (`../shared/real_traces/nccl_logs`, or a folder named by TRACEKIT_MORE_NCCL_LOGS)."""

from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path

import pytest
from nccl_helpers import parse_file, parse_lines

from tracekit.parsers import nccl_log

HOST = "gpu-node-17"


def _pre(pid: int, tid: int, dev: int) -> str:
    return f"{HOST}:{pid}:{tid} [{dev}] NCCL INFO "


def _init(pid: int, dev: int, comm: str, rank: int, nranks: int, comm_id: str, what: str = "COMPLETE",
          tid: int | None = None) -> str:
    return (_pre(pid, tid or pid, dev) + f"ncclCommInitRankConfig comm {comm} rank {rank} nranks {nranks} cudaDev "
            f"{dev} nvmlDev {dev} busId {dev + 1}0000 commId {comm_id} - Init {what}")


def _coll(pid: int, dev: int, comm: str, nranks: int, *, op: str = "AllReduce", op_count: int = 0,
          count: int = 1024, dtype: int = 7) -> str:
    return (_pre(pid, pid, dev) + f"{op}: opCount {op_count:x} sendbuff 0x7f0000000400 recvbuff 0x7f0000000400 "
            f"count {count} datatype {dtype} op 0 root 0 comm {comm} [nranks={nranks}] stream 0x5500000000a0")


def test_coll_lines_of_a_cut_job_are_kept_without_a_global_rank(tmp_path: Path) -> None:
    """Job A's Init lines were cut off (only its COLL lines remain), job B is whole: A's calls keep
    their comm handle, size, op, bytes and opCount, with no global rank and the reason."""
    cut = [_coll(100 + d, d, f"0xa{d}00", 4, op_count=k, count=256 * (k + 1)) for k in range(3) for d in range(2)]
    whole = [_init(200 + d, d, f"0xb{d}00", d, 2, "0x1234") for d in range(2)]
    whole += [_coll(200 + d, d, f"0xb{d}00", 2, op_count=k) for k in range(2) for d in range(2)]
    p = parse_lines(cut + whole, tmp_path)
    ranked = p.rows("collectives")
    assert sorted((r["rank"], r["seq"]) for r in ranked) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    lost = p.rows("unranked_collectives")
    assert p.result.unranked_collectives == len(lost) == 6
    assert {r["rank"] for r in lost} == {None}
    assert {r["rank_reason"] for r in lost} == {nccl_log.NO_INIT}
    assert sorted((r["comm"], r["seq"], r["in_bytes"], r["nranks"], r["op"], r["pid"]) for r in lost) == sorted(
        (f"0xa{d}00", k, 256 * (k + 1) * 4, 4, "all_reduce", 100 + d) for k in range(3) for d in range(2))
    assert {r["comm_rank"] for r in lost} == {None}
    assert p.result.stats.stored == len(cut) + len(whole)
    assert not p.result.stats.skipped
    assert any("6 COLL line(s) have no global rank" in w for w in p.result.stats.warnings)


def test_coll_lines_before_a_later_init_of_the_same_handle_get_its_rank(tmp_path: Path) -> None:
    """COLL lines printed before the Init COMPLETE of their handle (interleaved writes) take the
    rank that Init gives: nothing is left unranked."""
    lines = [_coll(300 + d, d, f"0xc{d}00", 2) for d in range(2)]
    lines += [_init(300 + d, d, f"0xc{d}00", d, 2, "0x77") for d in range(2)]
    p = parse_lines(lines, tmp_path)
    assert sorted((r["rank"], r["comm_rank"]) for r in p.rows("collectives")) == [(0, 0), (1, 1)]
    assert p.rows("unranked_collectives") == []


def test_coll_lines_of_another_job_in_the_same_log_keep_their_communicator(tmp_path: Path) -> None:
    """Two jobs in one file: the larger is the world; the other's calls keep their commId and
    communicator rank, with no global rank and the reason."""
    big = [_init(400 + d, d, f"0xd{d}00", d, 4, "0xb16") for d in range(4)]
    small = [_init(500 + d, d, f"0xe{d}00", d, 2, "0x5a11") for d in range(2)]
    small += [_coll(500 + d, d, f"0xe{d}00", 2, op="AllGather", count=16, dtype=0) for d in range(2)]
    p = parse_lines(big + small, tmp_path)
    assert p.rows("collectives") == []
    lost = p.rows("unranked_collectives")
    assert sorted((r["group"], r["comm_rank"], r["op"], r["out_bytes"], r["rank"], r["rank_reason"])
                  for r in lost) == [("0x0000000000005a11", d, "all_gather", 32, None, nccl_log.OUTSIDE_WORLD)
                                     for d in range(2)]


def _lazy_log(version: str | None) -> list[str]:
    """A 2.2x rank: Init COMPLETE on its main thread, channels connected later on another thread."""
    pid, dev = 600, 0
    lines = [_pre(pid, pid, dev) + f"NCCL version {version}+cuda12.4"] if version else []
    lines += [_init(pid, dev, "0xf00", 3, 4, "0x600d"),
              _pre(pid, pid + 5, dev) + "Channel 00/0 : 2[0] -> 3[0] [receive] via NET/Socket/0",
              _pre(pid, pid + 5, dev) + "Channel 01/0 : 2[0] -> 3[0] [receive] via NET/Socket/0",
              _pre(pid, pid + 5, dev) + "Channel 00/0 : 3[0] -> 0[0] [send] via NET/Socket/0",
              _pre(pid, pid + 5, dev) + "Connected all rings, use ring PXN 1 GDR 0"]
    return lines


@pytest.mark.parametrize("version", [None, "2.23.4"])
def test_channels_connected_after_init_complete_join_the_communicator(tmp_path: Path, version: str | None) -> None:
    p = parse_lines(_lazy_log(version), tmp_path)
    edges = sorted((r["group"], r["rank"], r["channel"], r["direction"], r["peer_comm_rank"], r["transport"])
                   for r in p.rows("channels"))
    g = "0x000000000000600d"
    assert edges == [(g, 3, 0, "recv", 2, "NET"), (g, 3, 0, "send", 0, "NET"), (g, 3, 1, "recv", 2, "NET")]
    assert [x["pxn"] for x in p.rows("groups")] == [True]
    assert not [w for w in p.result.stats.warnings if "no communicator Init line" in w]


def test_lazy_channels_join_the_last_communicator_initialised_before_them(tmp_path: Path) -> None:
    """A process with two communicators in which it is rank 3: the channel lines printed after the
    second one's Init COMPLETE are the second one's."""
    first = [_init(600, 0, "0xe00", 3, 4, "0x01d")]
    p = parse_lines(first + _lazy_log("2.23.4"), tmp_path)
    assert {r["group"] for r in p.rows("channels")} == {"0x000000000000600d"}


def test_channels_after_init_complete_before_lazy_setup_stay_unjoined(tmp_path: Path) -> None:
    """Before 2.22 a communicator's setup lines precede its Init COMPLETE: lines after the last one
    belong to a communicator whose Init was cut, not to the one before."""
    p = parse_lines(_lazy_log("2.18.1"), tmp_path)
    assert p.rows("channels") == []
    assert [w for w in p.result.stats.warnings if "4 topology line(s)" in w]
    assert p.result.stats.skipped[nccl_log.NO_INIT_TOPOLOGY] == 4


# -- the real logs ---------------------------------------------------------------------------------

REAL = Path(__file__).resolve().parents[2] / ".." / "shared" / "real_traces" / "nccl_logs"
#: github.com/devopsrustem/slurmv4 `3/13.sh` at 613d8370bf625b62bb10996f0d44722c3af36eb6, the lines
#: matching `^host:pid:tid ` (as PROVENANCE.md does for that repository's other files): three
#: 16-rank NCCL 2.27.5 jobs one after the other, the first one's Init lines cut off.
CUT_LOG = "slurmv4_nccl2.27.5_3jobs_16rank_cut.log"
#: A 4-rank torchrun job's `esm2-worker-0` log lines (a Kubernetes ESM-2 training README): its
#: channels are connected after Init COMPLETE, on another thread.
LAZY_LOG = "esm2_lazy_connect_4rank_worker0.log"

COLL = re.compile(r"^(\S+):(\d+):\d+ \[\d+\] NCCL INFO (\w+): opCount (\w+) .* count (\d+) datatype (\d+) .*"
                  r"comm (0x[0-9a-f]+) \[nranks=(\d+)\]")
INIT_PTR = re.compile(r"^(\S+):(\d+):\d+ \[\d+\] NCCL INFO .*comm (0x[0-9a-f]+) rank \d+ nranks \d+ .*- Init")
EDGE = re.compile(r"NCCL INFO Channel \d+/\d+ : \d+\[\d+\] -> \d+\[\d+\] \[(send|receive)\] via NET/")


def _real(name: str) -> Path:
    for folder in (os.environ.get("TRACEKIT_MORE_NCCL_LOGS"), REAL):
        if folder and (Path(folder) / name).is_file():
            return Path(folder) / name
    pytest.skip(f"real log {name} not present in {REAL} (or $TRACEKIT_MORE_NCCL_LOGS)")


def test_real_cut_log_keeps_all_16_coll_lines(tmp_path: Path) -> None:
    """Before: 0 of the 16 COLL lines stored (12 'no Init line', 4 'outside the world
    communicator' skipped). After: all 16 kept, each with what its line says."""
    path = _real(CUT_LOG)
    lines = path.read_text().splitlines()
    found = [m for ln in lines if (m := COLL.search(ln))]
    with_init = {(m.group(1), m.group(2), m.group(3)) for ln in lines if (m := INIT_PTR.search(ln))}
    p = parse_file(path, tmp_path / "run")
    lost = p.rows("unranked_collectives")
    assert len(found) == 16 and p.rows("collectives") == []
    assert len(lost) == p.result.unranked_collectives == 16
    no_init = sum(1 for m in found if (m.group(1), m.group(2), m.group(7)) not in with_init)
    assert Counter(r["rank_reason"] for r in lost) == {nccl_log.NO_INIT: no_init,
                                                        nccl_log.OUTSIDE_WORLD: 16 - no_init} == {
        nccl_log.NO_INIT: 12, nccl_log.OUTSIDE_WORLD: 4}
    assert sorted((r["comm"], r["pid"], r["seq"], r["nranks"], r["in_bytes"]) for r in lost) == sorted(
        (m.group(7), int(m.group(2)), int(m.group(4), 16), int(m.group(8)), int(m.group(5)) * 4) for m in found)
    assert not [k for k in p.result.stats.skipped if "collective" in k]


def test_real_lazy_connect_log_keeps_its_channels(tmp_path: Path) -> None:
    """Before: 0 channel rows ('5 topology line(s) ... came with no communicator Init line: not
    used'). After: its 4 NET edges, on the communicator its Init COMPLETE line names."""
    path = _real(LAZY_LOG)
    lines = path.read_text().splitlines()
    p = parse_file(path, tmp_path / "run")
    edges = p.rows("channels")
    assert len(edges) == sum(1 for ln in lines if EDGE.search(ln)) == 4
    assert {(e["group"], e["rank"], e["transport"]) for e in edges} == {("0x15c1c76db987339e", 3, "NET")}
    assert not [w for w in p.result.stats.warnings if "no communicator Init line" in w]
