"""NCCL debug logs of every era (2.4 to 2.30, written with NCCL's own printf formats by
nccl_eras.py), wrapped every way users find them, mangled, and read into the tables."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nccl_eras import COMM_ID, ERAS, Job, job_log, rank_log
from nccl_helpers import parse_lines

from tracekit.errors import InputError
from tracekit.parsers import nccl_log
from tracekit.parsers.detect import detect_bytes
from tracekit.store import SourceStats

WORLD = f"0x{COMM_ID:016x}"


@pytest.mark.parametrize("era", ERAS)
def test_every_era(era: str, tmp_path: Path) -> None:
    job = Job(era, warn_rank=2)
    p = parse_lines(job_log(job), tmp_path)
    n = job.nranks
    coll = p.rows("collectives")
    per_rank = job.steps + 2 + 1  # AllReduce steps, Send + Recv, AllGather
    assert len(coll) == n * per_rank and p.result.collectives == n * per_rank
    assert sorted({r["rank"] for r in coll}) == list(range(n))
    groups = p.rows("groups")
    assert len(groups) == 1
    g = groups[0]
    if job.v() >= (2, 16):
        assert g["group"] == WORLD
    else:
        assert g["group"] == f"nranks{n}#0"
    assert g["ranks"] == list(range(n)) and g["ranks_complete"] and g["size"] == n
    ar = [r for r in coll if r["op"] == "all_reduce"]
    assert {(r["dtype"], r["in_bytes"], r["out_bytes"]) for r in ar} == {("Float", job.count * 4, job.count * 4)}
    assert [r["seq"] for r in ar if r["rank"] == 0] == list(range(job.steps))
    ag = [r for r in coll if r["op"] == "all_gather"]
    assert {(r["dtype"], r["in_bytes"], r["out_bytes"]) for r in ag} == {("Half", 128, 128 * n)}
    sends = [r for r in coll if r["op"] == "send"]
    assert {(r["rank"], r["peer"], r["peer_local"]) for r in sends} == {(r, r ^ 1, r ^ 1) for r in range(n)}
    assert {r["in_bytes"] for r in sends} == {512} and {r["dtype"] for r in sends} == {"BFloat16"}
    if job.v() >= (2, 20):
        algos = {(r["rank"], r["algo"], r["proto"]) for r in ar}
        expect_ranks = range(n) if job.v() >= (2, 24) else [0]
        assert algos >= {(r, "RING", "SIMPLE") for r in expect_ranks}
    else:
        assert {r["algo"] for r in ar} == {None}
    ch = p.rows("channels")
    ring_send = {(r["rank"], r["channel"]): r for r in ch if r["pattern"] == "ring" and r["direction"] == "send"}
    assert set(ring_send) == {(r, c) for r in range(n) for c in range(job.channels)}
    for (r, _c), row in ring_send.items():
        assert row["peer_rank"] == job.ring_next(r)
        if job.inter(r, job.ring_next(r)):
            assert (row["transport"], row["nic"]) == ("NET", "mlx5_0:1")
            assert row["detail"].startswith("IB/0") and "GDRDMA" in row["detail"]
        else:
            assert row["transport"] == "P2P" and row["detail"].startswith("P2P/IPC")
    ups = {(r["rank"], r["channel"]): r["peer_rank"] for r in ch if r["pattern"] == "tree" and r["direction"] == "up"}
    assert ups == {(r, c): r - 1 for r in range(1, n) for c in range(job.channels)}
    assert all(r["transport"] is not None for r in ch if r["pattern"] == "tree")
    ranks = p.rows("ranks")
    assert [r["rank"] for r in ranks] == list(range(n))
    assert {(r["host"], r["local_device"], r["pid"]) for r in ranks} == {
        (job.host(r), job.dev(r), job.pid(r)) for r in range(n)}
    assert {r["nccl_version"].rsplit(".", 1)[0] for r in ranks} == {era}
    if job.v() >= (2, 5):
        assert ranks[1]["bus_id"] == "0000:28:00.0"
    warns = [m for m in p.rows("log_messages") if m["level"] == "WARN"]
    assert [(m["rank"], m["host"], m["subsystem"]) for m in warns] == [(2, job.host(2), "NET")]
    assert p.result.stats.skipped.get("not an NCCL line", 0) == 0


def test_ring_order_alone_gives_next_hops(tmp_path: Path) -> None:
    """Without transport lines, rank 0's ring-order lines still give each rank in the file its ring."""
    job = Job("2.22")
    lines = [ln for ln in job_log(job) if " via " not in ln]
    p = parse_lines(lines, tmp_path)
    ring = {(r["rank"], r["channel"]): r["peer_rank"] for r in p.rows("channels") if r["pattern"] == "ring"}
    assert ring == {(0, c): 1 for c in range(job.channels)}


WRAPPERS = {
    "mpirun": lambda r, ln: f"[{r}] {ln}",
    "mpirun-tag-output": lambda r, ln: f"[1,{r}]<stdout>:{ln}",
    "srun": lambda r, ln: f"{r}: {ln}",
    "ray": lambda r, ln: f"\x1b[36m(RayTrainWorker pid={4000 + r}, ip=10.0.0.{r})\x1b[0m {ln}",
    "kubernetes": lambda r, ln: f"2026-04-14T21:28:19.{r:06d}123Z stdout F {ln}",
    "syslog": lambda r, ln: f"Apr 14 21:28:19 node-{r // 2} trainer[{4000 + r}]: {ln}",
    "torchrun": lambda r, ln: f"[rank{r}]:{ln}",
    "logger": lambda r, ln: f"[2026-04-14 21:28:19.085] INFO worker: {ln}",
}


@pytest.mark.parametrize("wrapper", sorted(WRAPPERS))
def test_launcher_and_logger_prefixes_change_nothing(wrapper: str, tmp_path: Path) -> None:
    job = Job("2.27")
    plain = parse_lines(job_log(job), tmp_path, "plain.log")
    wrap = WRAPPERS[wrapper]
    lines = [wrap(r, ln) if ln else ln for r in range(job.nranks) for ln in rank_log(job, r)]
    got = parse_lines(lines, tmp_path, f"{wrapper}.log")
    for name in ("collectives", "channels", "groups"):
        a = plain.tables[name].drop_columns([c for c in ("line", "ts_ns") if c in plain.tables[name].column_names])
        b = got.tables[name].drop_columns([c for c in ("line", "ts_ns") if c in got.tables[name].column_names])
        assert a.to_pylist() == b.to_pylist(), name
    assert got.result.stats.read == plain.result.stats.read
    if wrapper in ("kubernetes", "logger"):
        assert got.tables["collectives"].column("ts_ns").null_count == 0


def test_interleaved_ranks_and_a_trainer_log_in_markdown(tmp_path: Path) -> None:
    job = Job("2.24")
    per_rank = [rank_log(job, r) for r in range(job.nranks)]
    rng = random.Random(7)
    lines = ["# Training run", "", "```text", "epoch 0 step 0 loss 2.31"]
    cursors = [0] * job.nranks
    while any(c < len(x) for c, x in zip(cursors, per_rank, strict=True)):
        r = rng.choice([i for i in range(job.nranks) if cursors[i] < len(per_rank[i])])
        lines.append(per_rank[r][cursors[r]])
        cursors[r] += 1
        if rng.random() < 0.05:
            lines.append("epoch 0 step 1 loss 2.29")
    lines.append("```")
    plain = parse_lines(job_log(job), tmp_path, "plain.log")
    got = parse_lines(lines, tmp_path, "md.log")
    key = ("rank", "seq", "op", "in_bytes", "algo", "proto")
    assert sorted(tuple(r[k] for k in key) for r in got.rows("collectives")) == \
        sorted(tuple(r[k] for k in key) for r in plain.rows("collectives"))
    assert got.tables["channels"].num_rows == plain.tables["channels"].num_rows
    assert got.result.stats.skipped["not an NCCL line"] == sum(
        1 for ln in lines if ln.strip() and " NCCL " not in ln)


def test_glued_records_from_two_processes(tmp_path: Path) -> None:
    job = Job("2.27")
    a, b = rank_log(job, 0), rank_log(job, 1)
    coll_a = [ln for ln in a if "opCount" in ln]
    coll_b = [ln for ln in b if "opCount" in ln]
    setup = [ln for ln in a + b if "opCount" not in ln and "Bytes ->" not in ln]
    glued = [coll_a[0][:60] + coll_b[0], coll_b[1] + " " + coll_a[1], *coll_a[2:], *coll_b[2:]]
    p = parse_lines(setup + glued, tmp_path)
    stats = p.result.stats
    assert stats.skipped["truncated record"] == 1
    # coll_a[0] was cut (skipped); coll_b[1] + coll_a[1] are both whole
    assert p.result.collectives == len(coll_a) + len(coll_b) - 1
    assert stats.read == stats.stored + sum(stats.skipped.values())


def test_cut_hostnames_join_the_process(tmp_path: Path) -> None:
    job = Job("2.22")
    lines = job_log(job)
    cut = [ln[2:] if ln.startswith("node-1") and "opCount" in ln else ln for ln in lines]
    p = parse_lines(cut, tmp_path)
    assert p.result.processes == job.nranks
    assert sorted({r["rank"] for r in p.rows("collectives")}) == list(range(job.nranks))


def test_pxn_proxy_rank_and_comm_split(tmp_path: Path) -> None:
    job = Job("2.24", pxn=True)
    lines = job_log(job)
    split = [ln.replace("ncclCommInitRank comm 0x55", "ncclCommSplit comm 0x66")
               .replace(f"commId 0x{COMM_ID:x} - Init", "parent 0x5500a0b0c0 splitCount 1 color 0 key 0 commId "
                        "0x1234 - Init") for ln in rank_log(job, 0) if "- Init " in ln]
    p = parse_lines(lines + split, tmp_path)
    proxies = {(r["rank"], r["proxy_rank"]) for r in p.rows("channels") if r["proxy_rank"] is not None}
    assert proxies == {(1, 0), (3, 2)}
    groups = {g["group"]: g for g in p.rows("groups")}
    assert groups["0x0000000000001234"]["desc"] == "ncclCommSplit color 0 key 0"
    assert groups["0x0000000000001234"]["ranks"] == [0] and groups[WORLD]["pxn"] is True


def test_multi_gpu_process(tmp_path: Path) -> None:
    """One process driving every GPU (nccl-tests -g 4): ranks told apart by their device."""
    job = Job("2.19", hosts=1, gpus=4)
    lines = []
    for r in range(job.nranks):
        for ln in rank_log(job, r):
            lines.append(ln.replace(f":{job.pid(r)}:", ":4000:", 1))
    p = parse_lines(lines, tmp_path)
    assert p.result.processes == 1
    assert [(r["rank"], r["local_device"], r["pid"]) for r in p.rows("ranks")] == [(r, r, 4000) for r in range(4)]
    assert sorted({r["rank"] for r in p.rows("collectives")}) == [0, 1, 2, 3]


def test_sub_communicator_ranks_map_to_global(tmp_path: Path) -> None:
    """A 2-rank communicator between global ranks 1 and 3: its local ranks 0/1 become 1/3."""
    job = Job("2.22")
    lines = job_log(job)
    sub = []
    for local, r in enumerate((1, 3)):
        pre = f"{job.host(r)}:{job.pid(r)}:{job.pid(r) + 7} [{job.dev(r)}] NCCL INFO "
        sub += [pre + f"ncclCommInitRank comm 0x77{r} rank {local} nranks 2 cudaDev {job.dev(r)} nvmlDev "
                      f"{job.dev(r)} busId {job.bus(r)} commId 0xabc - Init START",
                pre + f"Channel 00/0 : {local}[{job.dev(r)}] -> {1 - local}[0] [send] via NET/IB/1/GDRDMA",
                pre + f"ncclCommInitRank comm 0x77{r} rank {local} nranks 2 cudaDev {job.dev(r)} nvmlDev "
                      f"{job.dev(r)} busId {job.bus(r)} commId 0xabc - Init COMPLETE",
                pre.replace(f":{job.pid(r) + 7} ", f":{job.pid(r)} ") +
                f"Send: opCount 0 sendbuff (nil) recvbuff 0x1 count 8 datatype 0 op 0 root {1 - local} comm "
                f"0x77{r} [nranks=2] stream 0x2"]
    p = parse_lines(lines + sub, tmp_path)
    g = {x["group"]: x for x in p.rows("groups")}["0x0000000000000abc"]
    assert g["rank_map"] == [1, 3] and g["ranks"] == [1, 3] and g["ranks_complete"]
    sends = [r for r in p.rows("collectives") if r["group"] == "0x0000000000000abc"]
    assert {(r["rank"], r["peer"], r["peer_local"], r["comm_rank"]) for r in sends} == {(1, 3, 1, 0), (3, 1, 0, 1)}
    edges = {(r["rank"], r["peer_rank"], r["nic"]) for r in p.rows("channels") if r["group"] == "0x0000000000000abc"}
    assert edges == {(1, 3, "mlx5_1:1"), (3, 1, "mlx5_1:1")}


def test_watchdog_abort_and_error_lines(tmp_path: Path) -> None:
    job = Job("2.22")
    lines = [
        *job_log(job),
        "[rank3]:[E1119 13:21:12.512781555 ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught collective "
        "operation timeout: WorkNCCL(SeqNum=1, OpType=BROADCAST, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) "
        "ran for 1800000 milliseconds before timing out.",
        f"{job.host(2)}:{job.pid(2)}:{job.pid(2)} [0] NCCL INFO transport/net.cc:1320 -> 6",
        f"{job.host(2)}:{job.pid(2)}:{job.pid(2)} [0] NCCL INFO comm {job.comm(2)} rank 2 nranks 4 cudaDev 0 "
        f"busId {job.bus(2)} - Abort COMPLETE",
    ]
    p = parse_lines(lines, tmp_path)
    msgs = {(m["rank"], m["level"], m["subsystem"]) for m in p.rows("log_messages")}
    assert msgs == {(3, "ERROR", "watchdog"), (2, "INFO", "error"), (2, "INFO", "lifecycle")}


def test_nccl_tests_output_with_debug_lines(tmp_path: Path) -> None:
    job = Job("2.27", hosts=1)
    table = (Path(__file__).parent / "nccl_data" / "nccl_tests_all_reduce_4rank.txt").read_text().splitlines()
    lines = table[:12] + job_log(job) + table[12:]
    assert detect_bytes("\n".join(lines).encode()) == "nccl_log"
    assert detect_bytes("\n".join(table).encode()) == "nccl_tests"
    p = parse_lines(lines, tmp_path)
    assert p.tables["microbench"].num_rows == 3 and p.result.microbench_rows == 3
    assert p.result.collectives == job.nranks * 6


def test_no_records_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no NCCL debug records"):
        parse_lines(["hello", "NCCL INFO without a prefix"], tmp_path)


@pytest.mark.parametrize("head", [
    b"node-3:278:278 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>",
    b"[0] h100clust-worker-1:497888:498098 [0] NCCL INFO NCCL version 2.21.5+cuda12.4",
    b"1: node-3:278:278 [0] NCCL INFO cudaDriverVersion 12080",
    b"some text\n\nnode:1:2 [0] misc/socket.cc:50 NCCL WARN Net : Connection closed by remote peer",
])
def test_detect(head: bytes) -> None:
    assert detect_bytes(head) == "nccl_log"


@pytest.mark.parametrize("head", [b"NCCL INFO Init", b"host:1:2 NCCL is great", b'{"traceEvents": []}'])
def test_not_detected(head: bytes) -> None:
    assert detect_bytes(head) != "nccl_log"


# -- invariants ---------------------------------------------------------------------------------

_JOB_LINES = job_log(Job("2.22", warn_rank=1)) + job_log(Job("2.12"))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(_JOB_LINES), st.integers(0, 260), st.sampled_from(_JOB_LINES),
                          st.sampled_from(["keep", "cut", "glue", "junk", "bytes"])), max_size=60))
def test_mangled_or_interleaved_lines_never_raise_and_balance(tmp_path: Path, items: list) -> None:
    out = []
    for line, k, other, how in items:
        if how == "cut":
            out.append(line[:k])
        elif how == "glue":
            out.append(line[:k] + other)
        elif how == "junk":
            out.append(line[:k] + "\x00\x1b[1m\u00e9" + line[k:])
        elif how == "bytes":
            out.append(line.replace("NCCL INFO", "NCCL  INFO"))
        else:
            out.append(line)
    path = tmp_path / "m.log"
    path.write_text("\n".join(out) + "\n", errors="surrogateescape")
    from tracekit.store import SourceSink

    sink = SourceSink(tmp_path / "run", "k")
    try:
        res = nccl_log.parse(path, sink)
    except InputError:
        return
    finally:
        sink.close()
    s: SourceStats = res.stats
    assert s.read == s.stored + sum(s.skipped.values())
    # every non-blank line is at least one record (glued lines hold several)
    assert s.read >= sum(1 for ln in out if ln.strip() and not ln.isspace())


def test_hang_from_a_log_with_p2p_gaps_in_the_opcount(tmp_path: Path) -> None:
    """opCount also counts Send/Recv: rank 3 stopped after its Send/Recv (opCount 3) while the
    others issued the AllGather (opCount 4): the first divergent collective is 4, not 3."""
    from tracekit.workflows import hang as hang_from_paths

    job = Job("2.24", warn_rank=3)
    lines = [ln for ln in job_log(job) if not (ln.startswith(f"{job.host(3)}:{job.pid(3)}:") and "AllGather" in ln)]
    (tmp_path / "job.log").write_text("\n".join(lines) + "\n")
    result = hang_from_paths([str(tmp_path / "job.log")], out=tmp_path / "run")
    (g,) = result.groups
    assert (g.group, g.first_divergent_seq, g.missing_ranks, g.suspects) == (WORLD, 4, [3], [3])
    assert "reached all_gather seq 4" in g.verdict
    assert any(f.text.startswith("Rank 3 ran on host node-1, GPU 1") for f in result.findings)
    assert any("rank 3 (host node-1, GPU 1 (pid 4003)) logged NCCL WARN: NET/IB : Got completion" in f.text
               for f in result.findings)
    assert [m.rank for m in result.messages] == [3]


def test_hang_agrees_when_every_rank_logged_the_same_calls(tmp_path: Path) -> None:
    from tracekit.workflows import hang as hang_from_paths

    (tmp_path / "job.log").write_text("\n".join(job_log(Job("2.19"))) + "\n")
    result = hang_from_paths([str(tmp_path / "job.log")], out=tmp_path / "run")
    assert [g.status for g in result.groups] == ["ok"] and not result.hung
    assert "issued, not when it finished" in result.groups[0].verdict


def test_tuning_line_goes_to_the_collective_of_its_group_call(tmp_path: Path) -> None:
    """In one group call (one opCount) a Send, a Recv and an AllReduce; NCCL 2.22 prints one
    unnamed tuning line, for the AllReduce (point-to-point calls have no algorithm)."""
    from nccl_eras import coll_line, prefix

    job = Job("2.22")
    setup = [ln for ln in rank_log(job, 0) if "opCount" not in ln and "Bytes ->" not in ln]
    pre = prefix(job, 0) + "NCCL INFO "
    calls = [coll_line(job, 0, "Send", 5, 8, 7, 1), coll_line(job, 0, "Recv", 5, 8, 7, 1),
             coll_line(job, 0, "AllReduce", 5, 16, 7, 0), "64 Bytes -> Algo 0 proto 1 time 3.000000"]
    p = parse_lines(setup + [pre + c for c in calls], tmp_path)
    got = {r["op"]: (r["algo"], r["proto"]) for r in p.rows("collectives")}
    assert got == {"send": (None, None), "recv": (None, None), "all_reduce": ("TREE", "LL128")}


@pytest.mark.parametrize("tuning", ["64 Bytes -> Algo 0 proto 1 time 3.000000" + "x" * 60_000,
                                    "y" * 60_000 + " 64 Bytes -> Algo 0 proto 1 time 3.000000"])
def test_a_long_tuning_line_is_read_in_linear_time(tuning: str, tmp_path: Path) -> None:
    """A tuning line with a long run of word characters: the tuning patterns' `(\\w+): ` searched
    the whole line and backtracked quadratically (a 4 MB line ran for hours under `tracekit
    ingest`; found by the round-three campaign's long_line class through the CLI). They now see
    256 bytes either side of " Bytes -> ": this line parses in milliseconds (minutes before)."""
    from nccl_eras import coll_line, prefix

    job = Job("2.22")
    setup = [ln for ln in rank_log(job, 0) if "opCount" not in ln and "Bytes ->" not in ln]
    pre = prefix(job, 0) + "NCCL INFO "
    p = parse_lines([*setup, pre + coll_line(job, 0, "AllReduce", 5, 16, 7, 0), pre + tuning], tmp_path)
    got = {r["op"]: (r["algo"], r["proto"]) for r in p.rows("collectives")}
    assert got == {"all_reduce": ("TREE", "LL128")}


@pytest.mark.parametrize("prefix", ["[9999999999.5] ", "[9999-12-31 23:59:59.000] INFO worker: "])
def test_a_line_time_beyond_the_int64_range_is_read_as_untimed_with_a_warning(prefix: str, tmp_path: Path) -> None:
    """A prefix time past 2116 (a 10-digit epoch near 1e10 s, the year 9999) overflowed int64 when
    the collectives were written (found by the hostile-number fuzz class); the line is kept untimed."""
    job = Job("2.27")
    plain = parse_lines(job_log(job), tmp_path, "plain.log")
    lines = [prefix + ln if ln else ln for r in range(job.nranks) for ln in rank_log(job, r)]
    got = parse_lines(lines, tmp_path, "future.log")
    assert got.tables["collectives"].num_rows == plain.tables["collectives"].num_rows
    assert got.tables["collectives"].column("ts_ns").null_count == got.tables["collectives"].num_rows
    assert any("outside +-2^62 ns" in w for w in got.result.stats.warnings)
