"""Ingest of a folder mixing profiler traces, Flight Recorder dumps, an NCCL log and nccl-tests
output: every table filled, each from the source that knows it. NCCL Inspector files of another
job are refused."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from tracekit.ingest import ingest
from tracekit.store import Run
from tracekit.workflows import info

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "sample_traces" / "gloo_moe_8rank"
PARSERS_TESTS = REPO / "tests" / "parsers"
NCCL_TESTS_REAL = REPO / ".." / "shared" / "real_traces" / "nccl_tests" / "all_reduce_perf_2node_16xH100.txt"
sys.path.insert(0, str(PARSERS_TESTS))

from nccl_eras import COMM_ID, Job, coll_line, job_log, prefix  # noqa: E402

DP = "0x00000000000d9001"


def nccl_log_for_the_sample() -> list[str]:
    """An NCCL 2.24 log of the sample's 8 ranks: the world communicator (2 nodes x 4 GPUs), and a
    4-rank communicator of ranks 0-3 whose AllReduce of 8960 bytes NCCL ran as TREE/LL, the call
    the profiler traces show on the sample's group "1"."""
    job = Job("2.24", hosts=2, gpus=4, warn_rank=5)
    lines = job_log(job)
    for r in range(4):
        pre = prefix(job, r) + "NCCL INFO "
        comm = f"0x66{r}"
        init = (f"ncclCommSplit comm {comm} rank {r} nranks 4 cudaDev {job.dev(r)} nvmlDev {job.dev(r)} busId "
                f"{job.bus(r)} parent {job.comm(r)} splitCount 1 color 0 key {r} commId {DP} - Init ")
        lines += [pre + init + "START", pre + init + "COMPLETE"]
        for k in range(4):
            line = coll_line(job, r, "AllReduce", k, 2240, 7, 0).replace(job.comm(r), comm).replace("nranks=8",
                                                                                                  "nranks=4")
            lines += [pre + line, pre + "AllReduce: 8960 Bytes -> Algo TREE proto LL channel{Lo..Hi}={0..1}"]
    return lines


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not NCCL_TESTS_REAL.is_file():
        pytest.skip("real nccl-tests output not present")
    src = tmp_path_factory.mktemp("inputs")
    shutil.copytree(SAMPLE, src / "trainer")
    (src / "nccl" / "node.log").parent.mkdir()
    (src / "nccl" / "node.log").write_text("\n".join(nccl_log_for_the_sample()) + "\n")
    shutil.copy(NCCL_TESTS_REAL, src / "nccl" / "all_reduce_perf.txt")
    out = tmp_path_factory.mktemp("run") / "run"
    report = ingest([src], out)
    assert not report.failed, [s.error for s in report.failed]
    return out


def test_inspector_files_of_another_job_are_refused(tmp_path: Path) -> None:
    """The NCCL Inspector fixtures are a 2-rank job of July 2026, not the sample's 8-rank job of
    November: mixed in, rank 0 would have sources from two jobs, which ingest refuses (issue 12)."""
    from tracekit.validity import MixedRunError

    inspector = sorted((PARSERS_TESTS / "nccl_data").glob("inspector_*.log"))
    alone = ingest(inspector, tmp_path / "inspector")
    assert not alone.failed and {s.format for s in Run(tmp_path / "inspector").manifest.sources} == {
        "nccl_inspector"}
    with pytest.raises(MixedRunError, match=r"rank 0 has sources from two of them: .*inspector_node-a"):
        ingest([SAMPLE, *inspector], tmp_path / "mixed")


def test_every_table_from_its_source(mixed: Path) -> None:
    run = Run(mixed)
    formats = {s.format for s in run.manifest.sources}
    assert formats == {"kineto", "flight_recorder", "nccl_log", "nccl_tests"}
    coll = run.table("collectives").to_pylist()
    assert {r["source"] for r in coll} == {"kineto"}
    assert sorted({r["rank"] for r in coll}) == list(range(8))
    groups = {g["group"]: g for g in run.table("groups").to_pylist()}
    world = f"0x{COMM_ID:016x}"
    assert {"1", world, DP} <= set(groups)
    assert groups[DP]["rank_map"] == [0, 1, 2, 3] and groups[world]["ranks"] == list(range(8))
    channels = run.table("channels").to_pylist()
    assert sorted({r["rank"] for r in channels}) == list(range(8))
    assert {r["transport"] for r in channels} == {"NET", "P2P"}
    assert run.table("microbench").num_rows == 31
    ranks = run.table("ranks").to_pylist()
    assert [(r["rank"], r["source_format"]) for r in ranks] == [(r, "kineto") for r in range(8)]
    assert all(r["bus_id"] for r in ranks) and ranks[1]["bus_id"] == "0000:28:00.0"
    warn = [m for m in run.table("log_messages").to_pylist() if m["level"] == "WARN"]
    assert [m["rank"] for m in warn] == [5]


def test_profiler_rows_take_nccls_algorithm(mixed: Path) -> None:
    coll = Run(mixed).table("collectives").to_pylist()
    ar = [r for r in coll if r["op"] == "all_reduce" and r["in_bytes"] == 8960 and r["rank"] < 4]
    assert ar and {(r["algo"], r["proto"]) for r in ar} == {("TREE", "LL")}
    others = [r for r in coll if r["op"] == "all_to_all"]
    assert {r["algo"] for r in others} == {None}


def test_info_shows_the_fabric(mixed: Path) -> None:
    comms = {c.group: c for c in info(mixed).communicators}
    world = comms[f"0x{COMM_ID:016x}"]
    assert world.hosts == ["node-0", "node-1"] and world.size == 8
    assert world.transports["ring"] == {"NET": 4, "P2P": 12}
    assert world.nics_used == {"node-0": ["mlx5_0:1"], "node-1": ["mlx5_0:1"]}
    assert any("only 1 of 2 NICs on node-0 carried traffic" in n for n in world.notes)
    from click.testing import CliRunner

    from tracekit.cli import main

    out = CliRunner().invoke(main, ["info", str(mixed)])
    assert out.exit_code == 0, out.output
    assert "NCCL communicators" in out.output and "only 1 of 2 NICs on node-0" in out.output
    assert "nccl: rank 5 logged WARN: NET/IB : Got completion from peer" in out.output
    assert [list(w.ranks) for w in info(mixed).nccl_warnings] == [[5]]


def test_hang_prefers_flight_recorder_in_a_mixed_run(mixed: Path) -> None:
    from tracekit.hang import hang_from_run

    result = hang_from_run(mixed)
    assert result.source == "flight_recorder"


def test_a_log_cut_during_setup_says_so_instead_of_blaming_nics(tmp_path: Path) -> None:
    """The real 2.29 node log cut after 30 kB (mid-line, before most transport lines): the cut
    line is a counted skip, and info says the fabric is partial rather than "only 3 of 9 NICs"."""
    real = REPO / ".." / "shared" / "real_traces" / "nccl_logs" / "slurmv4_nccl2.29.3_2node_16rank_roce"
    if not real.is_dir():
        pytest.skip("real NCCL logs not present")
    (src := tmp_path / "in").mkdir()
    (src / "node.log").write_bytes((real / "node_tpgds-aihub0003.log").read_bytes()[:30000])
    report = ingest([src], tmp_path / "run")
    (s,) = report.sources
    assert s.read == s.stored + sum(s.skipped.values()) and s.skipped.get("not an NCCL line") == 1
    (comm,) = info(tmp_path / "run").communicators
    assert any("no transport line" in n for n in comm.notes)
    assert not any(n.startswith("only ") for n in comm.notes)
