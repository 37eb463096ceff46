"""Nsight Systems exports: SQLite files built from the exporter's documented schema of several
releases (tracekit.synth_nsys), with NCCL kernels and NVTX ranges of NCCL 2.18, 2.21 and 2.27."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
from contextlib import closing
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from tracekit import schema
from tracekit.cli import main
from tracekit.errors import InputError
from tracekit.ingest import ingest
from tracekit.parsers import detect, nsys
from tracekit.store import Run, SourceSink
from tracekit.synth import make_run_tables, write_kineto
from tracekit.synth_nsys import RELEASES, comm_hash, nsys_twin, with_nccl_ranges, write_nsys

SMALL = {"hosts": 2, "gpus_per_host": 2, "pp": 2, "ep": 1, "steps": 2, "seed": 3}
TABLES = ("ranks", "groups", "collectives")


@pytest.fixture(scope="module")
def small():
    return make_run_tables(**SMALL)[0]


def parse(path: Path, out: Path, **kw) -> tuple[nsys.ParseResult, dict[str, pa.Table]]:
    sink = SourceSink(out, "k")
    try:
        res = nsys.parse(path, sink, **kw)
    finally:
        sink.close()
    tables = {}
    for name in TABLES:
        p = out / "sources" / "k" / f"{name}.parquet"
        tables[name] = pq.read_table(p) if p.is_file() else schema.empty(name)
    tables["events"] = pa.concat_tables([pq.read_table(p) for p in sorted((out / "events").glob("rank=*/k.parquet"))])
    assert res.stats.balanced, res.stats.counts()
    return res, tables


def _str(df: pl.DataFrame) -> pl.DataFrame:
    return df.with_columns(pl.col(pl.Categorical).cast(pl.Utf8))


# -- the round trip -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def twins(tmp_path_factory, small):
    """One synth run written as Kineto traces (one per rank) and as Nsight reports (one per host)."""
    base = tmp_path_factory.mktemp("twins")
    twin = nsys_twin(small)
    write_kineto(twin, base / "kineto")
    write_nsys(twin, base / "nsys")
    rk = ingest([base / "kineto"], base / "rk")
    rn = ingest([base / "nsys"], base / "rn")
    assert not rk.failed and not rn.failed, [s.error for s in rk.failed + rn.failed]
    return base, rk, rn


def test_one_report_per_host_gives_a_rank_per_gpu(twins):
    _, _, rn = twins
    assert sorted(tuple(s.ranks) for s in rn.sources) == [(0, 1), (2, 3)]
    assert all(s.format == "nsys" and s.read == s.stored + sum(s.skipped.values()) for s in rn.sources)


def test_twins_give_the_same_events(twins):
    base, _, _ = twins
    cols = ["rank", "lane", "kind", "name", "ts_ns", "dur_ns", "step", "correlation", "cat", "sync_lane",
            "sync_correlation"]
    a, b = (_str(pl.from_arrow(Run(base / r).events())).select(cols).sort(cols) for r in ("rk", "rn"))
    assert a.height > 900 and a.equals(b)


def test_twins_give_the_same_collectives_groups_and_ranks(twins):
    base, _, _ = twins
    cols = ["rank", "group", "seq", "op", "in_bytes", "out_bytes", "nranks", "peer", "ts_ns", "dur_ns", "state",
            "algo", "instance", "dim", "name", "lane", "step", "seq_explicit"]
    ck, cn = (_str(pl.from_arrow(Run(base / r).table("collectives"))) for r in ("rk", "rn"))
    assert ck.select(cols).sort(cols).equals(cn.select(cols).sort(cols))
    per_group = cn.sort("ts_ns").group_by(["rank", "group"], maintain_order=True).agg(pl.col("seq"))
    assert all(seq == list(range(len(seq))) for seq in per_group["seq"].to_list())  # numbered in call order, from 0
    # NCCL's payloads name no dtype for point-to-point calls; the collectives' come from the kernels
    p2p = pl.col("op").is_in(["send", "recv"])
    assert cn.filter(p2p)["dtype"].null_count() == cn.filter(p2p).height > 0
    assert ck.filter(~p2p)["dtype"].to_list() == cn.filter(~p2p).sort(["rank", "ts_ns"])["dtype"].to_list()
    gcols = ["group", "ranks", "size", "ranks_complete"]
    gk, gn = (pl.from_arrow(Run(base / r).table("groups")).select(gcols) for r in ("rk", "rn"))
    assert gk.equals(gn)
    rcols = ["rank", "world_size", "host", "pid", "local_device", "device_name", "backend"]
    assert (pl.from_arrow(Run(base / "rk").table("ranks")).select(rcols)
            .equals(pl.from_arrow(Run(base / "rn").table("ranks")).select(rcols)))


def _cli_json(args: list[str], run: Path) -> dict:
    result = CliRunner().invoke(main, [args[0], str(run), "--json", *args[1:]])
    assert result.exit_code == 0, result.output
    text = result.output[result.output.index("{"):]
    return json.loads(text.replace(str(run), "RUN"))


def _drop(doc: dict) -> dict:
    """What only one profiler records: the source files, and the bus ids Nsight has."""
    doc.get("validity", {}).pop("jobs", None)
    locations = doc.get("hang", {}).get("locations", {})
    for loc in locations.values() if isinstance(locations, dict) else locations:
        loc.pop("bus_id", None)
    return doc


def test_twins_give_the_same_analysis(twins):
    base, _, _ = twins
    a, b = (_drop(_cli_json(["analyze"], base / r)) for r in ("rk", "rn"))
    assert a["stragglers"] and a == b


def test_twins_give_the_same_replay(twins):
    base, _, _ = twins
    a, b = (_cli_json(["replay", "--topology", "rail-optimized:gpus=2"], base / r) for r in ("rk", "rn"))
    assert a["results"][0]["instances"] and a == b


# -- releases and NCCL eras -------------------------------------------------------------------------


@pytest.mark.parametrize("nccl", ["2.21", "2.27"])
def test_payload_eras_give_ranks_groups_and_bytes(tmp_path, small, nccl):
    paths = write_nsys(small, tmp_path / "n", release="2024.5", nccl=nccl)
    res, t = parse(paths[0], tmp_path / "run")
    assert res.ranks == [0, 1]
    coll = _str(pl.from_arrow(t["collectives"]))
    want = _str(pl.from_arrow(small["collectives"])).filter(pl.col("rank").is_in([0, 1]))
    assert coll.height == want.height
    ar = coll.filter(pl.col("op") == "all_reduce")
    assert ar["in_bytes"].to_list() == want.filter(pl.col("op") == "all_reduce").sort("ts_ns")["in_bytes"].to_list()
    assert set(ar["dtype"]) == {"BFloat16"} and set(ar["algo"]) == {"RING|COLLNET_DIRECT|COLLNET_CHAIN|NVLS|NVLS_TREE"}
    dp = next(g for g in small["groups"].to_pylist() if g["ranks"] == [0, 1])
    assert set(ar["group"]) == {f"0x{comm_hash(dp['group']):016x}"}
    sends = coll.filter(pl.col("op") == "send")
    assert sends["peer"].null_count() == sends.height and set(sends["peer_local"]) == {1}  # global at the merge
    rm = {g["group"]: g["rank_map"] for g in t["groups"].to_pylist() if g.get("rank_map")}
    assert rm[f"0x{comm_hash(dp['group']):016x}"] == [0, 1]


def test_nccl_2_18_has_no_payload_and_needs_a_rank(tmp_path, small):
    paths = write_nsys(small, tmp_path / "n", release="2024.5", nccl="2.18")
    with pytest.raises(InputError, match=r"no rank: .*--rank-map"):
        parse(paths[0], tmp_path / "a")
    res, t = parse(paths[0], tmp_path / "b", rank_map={("node000", 10_000, 0): 0, ("node000", 10_001, 1): 1})
    assert res.ranks == [0, 1]
    coll = _str(pl.from_arrow(t["collectives"]))
    assert coll["name"].str.starts_with("ncclKernel_").all()
    ar = coll.filter(pl.col("op") == "all_reduce")
    assert ar.height == 8 and set(ar["algo"]) == {"RING"} and ar["in_bytes"].null_count() == ar.height


@pytest.mark.parametrize("release", sorted(RELEASES))
def test_every_release_reads_the_same_gpu_work(tmp_path, small, release):
    paths = write_nsys(small, tmp_path / "n", release=release, nccl="2.27")
    rank_map = {("node000" if RELEASES[release]["system_env"] else None, 10_000 + r, r): r for r in (0, 1)}
    res, t = parse(paths[0], tmp_path / "run", rank_map=rank_map)
    ev = _str(pl.from_arrow(t["events"]))
    want = _str(pl.from_arrow(small["events"])).filter(pl.col("rank").is_in([0, 1]))
    gpu = ["compute", "comm", "sync"]
    shift = 0 if RELEASES[release]["session_start"] else None
    got = ev.filter(pl.col("kind").is_in(gpu)).select("rank", "name", "ts_ns", "dur_ns").sort("rank", "ts_ns")
    exp = want.filter(pl.col("kind").is_in(gpu)).select("rank", "name", "ts_ns", "dur_ns").sort("rank", "ts_ns")
    assert got["name"].to_list() == exp["name"].to_list() and got["dur_ns"].to_list() == exp["dur_ns"].to_list()
    if shift is None:  # no session start: times relative to it (and a warning says so)
        assert any("TARGET_INFO_SESSION_START_TIME" in w for w in res.stats.warnings)
        assert (exp["ts_ns"] - got["ts_ns"]).n_unique() == 1
    else:
        assert got["ts_ns"].to_list() == exp["ts_ns"].to_list()
    waits = ev.filter(pl.col("kind") == "sync")
    assert waits["sync_lane"].null_count() == (0 if RELEASES[release]["cuda_event"] else waits.height)


def test_event_type_numbers_come_from_the_enum_table(tmp_path, small):
    """ENUM_NSYS_EVENT_TYPE, when exported, says which eventType a range is; nothing is assumed."""
    path = write_nsys(small, tmp_path / "n", release="2024.5")[0]
    with sqlite3.connect(path) as db:
        db.execute("UPDATE NVTX_EVENTS SET eventType = 159 WHERE eventType = 59")
        db.execute("UPDATE ENUM_NSYS_EVENT_TYPE SET id = 159 WHERE name = 'NvtxPushPopRange'")
    res, t = parse(path, tmp_path / "run")
    names = set(_str(pl.from_arrow(t["events"])).filter(pl.col("kind") == "annotation")["name"])
    assert {"ProfilerStep#0", "ncclAllReduce"} <= names and res.ranks == [0, 1]


def test_kernel_names_from_short_names_when_no_demangled_column(tmp_path, small):
    path = write_nsys(small, tmp_path / "n", release="2024.5")[0]
    with sqlite3.connect(path) as db:
        db.execute("ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL DROP COLUMN demangledName")
    _, t = parse(path, tmp_path / "run")
    comm = _str(pl.from_arrow(t["events"])).filter(pl.col("kind") == "comm")
    assert comm.height == 24 and comm["name"].str.starts_with("ncclDevKernel_").all()


@pytest.mark.parametrize(("name", "dtype"), [
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "BFloat16"),
    ("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", "Float"),
    ("ncclKernel_AllReduce_RING_LL_Sum___nv_bfloat16(ncclDevComm*, unsigned long, ncclWork*)", "BFloat16"),
    ("ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", "Char"),
    ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", None),
    ("ncclDevKernel_AllGather_RING_LL", None),
])
def test_kernel_dtype(name, dtype):
    assert nsys.kernel_dtype(name) == dtype


def test_payload_keys_by_schema_entry_or_field_name():
    entry = {"NCCL communicator ID": 7, "Message size [bytes]": 64, "Peer rank": 1}
    assert nsys.payload(json.dumps(entry)) == {"comm": 7, "bytes": 64, "peer": 1}
    nested = {"NcclNvtxParamsCommInitRank": {"newcomm": "0x10", "nranks": 4, "myrank": 2, "cudaDev": 1}}
    assert nsys.payload(json.dumps(nested)) == {"comm": 16, "nranks": 4, "rank": 2, "device": 1}
    assert nsys.payload("[" * 200 + "]" * 200) == {} and nsys.payload("not json") == {}


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=24), c, max_size=4),
                    max_leaves=30))
def test_payload_never_raises_and_keeps_only_known_unsigned_ints(doc):
    out = nsys.payload(json.dumps(doc))
    assert set(out) <= set(nsys.PAYLOAD_KEYS.values())
    assert all(type(v) is int and 0 <= v < 2**64 for v in out.values())


# -- directory exports, detection -------------------------------------------------------------------


def _to_dir(db_path: Path, out: Path, suffix: str) -> Path:
    """The SQLite export as `nsys export --type parquetdir|arrowdir` lays it out: a file per table."""
    out.mkdir()
    with sqlite3.connect(db_path) as db:
        for (table,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'").fetchall():
            cur = db.execute(f"SELECT * FROM {table}")
            cols = [d[0] for d in cur.description]
            rows = cur.fetchall()
            t = pa.table({c: [r[i] for r in rows] for i, c in enumerate(cols)}) if rows else \
                pa.table({c: pa.nulls(0, pa.int64()) for c in cols})
            if suffix == ".parquet":
                pq.write_table(t, out / f"{table}.parquet")
            else:
                with pa.OSFile(str(out / f"{table}.arrow"), "wb") as f, pa.ipc.new_file(f, t.schema) as w:
                    w.write_table(t)
    return out


@pytest.mark.parametrize("suffix", [".parquet", ".arrow"])
def test_directory_exports_read_like_the_sqlite(tmp_path, small, suffix):
    path = write_nsys(small, tmp_path / "n")[0]
    folder = _to_dir(path, tmp_path / "dir", suffix)
    assert detect.detect_format(folder / f"StringIds{suffix}") == "nsys"
    assert detect.detect_format(folder / f"CUPTI_ACTIVITY_KIND_KERNEL{suffix}") is None  # a part of the export
    _, a = parse(path, tmp_path / "a")
    _, b = parse(folder / f"StringIds{suffix}", tmp_path / "b")
    for name in ("events", "collectives", "groups"):
        assert pl.from_arrow(a[name]).equals(pl.from_arrow(b[name])), name
    report = ingest([folder], tmp_path / "run")  # the directory is one source; its other tables are parts of it
    assert [(Path(r.path).name, r.ranks) for r in report.sources] == [(f"StringIds{suffix}", [0, 1])]


def test_detection_by_content(tmp_path, small):
    path = write_nsys(small, tmp_path / "n")[0]
    renamed = tmp_path / "profile.bin"
    renamed.write_bytes(path.read_bytes())
    assert detect.detect_format(renamed) == "nsys"
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE t (x INT)")
    assert detect.detect_format(other) is None
    assert "Nsight Systems exports" in detect.supported_formats()


# -- ranks from an NCCL log, or a rank map --------------------------------------------------------


def test_ranks_from_the_runs_nccl_log(tmp_path, small):
    """NCCL 2.18 reports have no comm rank: the NCCL log of the same run gives it, joined by (host,
    pid, device)."""
    from tests.parsers.nccl_eras import Job, job_log

    job = Job("2.17", hosts=2, gpus=2)
    ranks = small["ranks"].to_pylist()
    for r in ranks:
        r["host"], r["pid"] = job.host(r["rank"]), job.pid(r["rank"])
    tables = {**small, "ranks": schema.conform("ranks", pa.Table.from_pylist(ranks))}
    write_nsys(tables, tmp_path / "in", nccl="2.18")
    (tmp_path / "in" / "nccl.log").write_text("\n".join(job_log(job)) + "\n")
    report = ingest([tmp_path / "in"], tmp_path / "run")
    reports = [s for s in report.sources if s.format == "nsys"]
    assert not report.failed and sorted(tuple(s.ranks) for s in reports) == [(0, 1), (2, 3)]
    run = Run(tmp_path / "run")
    got = {r["rank"]: (r["host"], r["pid"]) for r in run.table("ranks").to_pylist()}
    assert got == {r: (job.host(r), job.pid(r)) for r in range(4)}


def test_rank_map_option(tmp_path, small):
    write_nsys(small, tmp_path / "in", nccl="2.18")
    rank_map = tmp_path / "ranks.csv"
    rank_map.write_text("host,pid,device,rank\n" + "".join(
        f"node{r // 2:03d},{10_000 + r},{r % 2},{r}\n" for r in range(4)))
    result = CliRunner().invoke(main, ["ingest", str(tmp_path / "in"), "-o", str(tmp_path / "run"), "-q",
                                       "--rank-map", str(rank_map)])
    assert result.exit_code == 0, result.output
    assert sorted(Run(tmp_path / "run").table("ranks").column("rank").to_pylist()) == [0, 1, 2, 3]
    result = CliRunner().invoke(main, ["ingest", str(tmp_path / "in"), "-o", str(tmp_path / "run2"), "-q"])
    assert result.exit_code == 1 and "--rank-map" in result.output


# -- bad input ------------------------------------------------------------------------------------


def _one_line_error(path: Path, out: Path) -> str:
    with pytest.raises(InputError) as exc:
        parse(path, out)
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith(str(path))
    return msg


def test_not_an_nsight_database(tmp_path):
    path = tmp_path / "x.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE StringIds (id INT, value TEXT)")
        db.execute("CREATE TABLE other (x INT)")
    assert "not an Nsight Systems export" in _one_line_error(path, tmp_path / "run")


def test_truncated_database(tmp_path, small):
    path = write_nsys(small, tmp_path / "n")[0]
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])
    assert "truncated or corrupt" in _one_line_error(path, tmp_path / "run")
    report = ingest([path], tmp_path / "ingested")
    assert report.failed and not report.committed
    assert not list((tmp_path / "ingested").glob("events/*/*"))
    assert not (tmp_path / "ingested" / "manifest.json").exists()


def test_locked_database(tmp_path, small):
    path = write_nsys(small, tmp_path / "n")[0]
    holder = sqlite3.connect(path)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        assert "locked by another process" in _one_line_error(path, tmp_path / "run")
    finally:
        holder.rollback()
        holder.close()


def test_report_without_cuda_trace(tmp_path, small):
    path = write_nsys(small, tmp_path / "n")[0]
    with sqlite3.connect(path) as db:
        for t in ("KERNEL", "SYNCHRONIZATION", "MEMCPY", "CUDA_EVENT", "RUNTIME"):
            db.execute(f"DROP TABLE CUPTI_ACTIVITY_KIND_{t}")
    assert "no CUDA trace" in _one_line_error(path, tmp_path / "run")


def test_qdrep_refused_with_the_command(tmp_path):
    path = tmp_path / "old.qdrep"
    path.write_bytes(b"\x00" * 64)
    assert detect.detect_format(path) == "nsys"
    msg = _one_line_error(path, tmp_path / "run")
    assert ".qdrep" in msg and "nsys export --type sqlite -o old.sqlite old.qdrep" in msg


def test_report_suffix_on_a_text_file_is_not_a_report(tmp_path):
    """The report header is undocumented, so the suffix is the fallback, and only for binary content:
    a text file named x.nsys-rep is not a report, and its parse says so in one line."""
    for name in ("x.nsys-rep", "x.qdrep"):
        path = tmp_path / name
        path.write_text("step,time\n1,2.5\n")
        assert detect.detect_format(path) is None
        assert "is text (or empty), not an Nsight Systems report" in _one_line_error(path, tmp_path / f"run-{name}")
    binary = tmp_path / "y.nsys-rep"
    binary.write_bytes(bytes(range(256)) * 4)
    assert detect.detect_format(binary) == "nsys"


@pytest.mark.parametrize(("head", "binary"), [(b"", False), (b"abc\n", False), ("h\u00e9llo".encode(), False),
                                              ("\u00e9".encode()[:1], False), (b"a\x00b", True),
                                              (b"\xff\xfe\x80\x81abcd", True)])
def test_looks_binary(head, binary):
    assert nsys.looks_binary(head) is binary


def test_nsys_rep_without_nsys_names_the_command(tmp_path, monkeypatch):
    path = tmp_path / "prof.nsys-rep"
    path.write_bytes(b"\x00" * 64)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    msg = _one_line_error(path, tmp_path / "run")
    assert "nsys export --type sqlite --output prof.sqlite prof.nsys-rep" in msg


def test_nsys_rep_is_exported_when_nsys_is_on_path(tmp_path, small, monkeypatch):
    sqlite_file = write_nsys(small, tmp_path / "n")[0]
    path = tmp_path / "prof.nsys-rep"
    path.write_bytes(b"\x00" * 64)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "nsys"  # stands for `nsys export`: copies the SQLite export to --output
    fake.write_text("#!/bin/sh\nwhile [ \"$1\" != \"--output\" ]; do shift; done\n"
                    f"cp '{sqlite_file}' \"$2\"\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    res, _ = parse(path, tmp_path / "run")
    assert res.ranks == [0, 1]


def test_twin_tables_keep_the_synth_run(small):
    """with_nccl_ranges only adds NCCL's API ranges, one per collective kernel launch plus the inits."""
    twin = with_nccl_ranges(small)
    added = twin["events"].num_rows - small["events"].num_rows
    launched = pl.from_arrow(small["events"]).filter(pl.col("kind") == "comm").height
    inits = sum(1 + sum(r in g["ranks"] for g in small["groups"].to_pylist()) for r in range(4))
    assert added == launched + inits


@pytest.mark.parametrize(("op", "kernel"), [("all_gather", "ncclDevKernel_AllGather_RING_LL"),
                                            ("reduce_scatter", "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL")])
def test_gather_and_scatter_sizes_from_the_message_size(tmp_path, small, op, kernel):
    """NCCL's message size is the send buffer of an AllGather and the receive buffer of a
    ReduceScatter (collectives.cc): the other side is nranks times it."""
    coll = pl.from_arrow(small["collectives"])
    ar = pl.col("op") == "all_reduce"
    shard = pl.col("in_bytes") // pl.col("nranks")
    gather, scatter = ar & (op == "all_gather"), ar & (op == "reduce_scatter")
    coll = coll.with_columns(pl.when(ar).then(pl.lit(op)).otherwise(pl.col("op").cast(pl.Utf8)).alias("op"),
                             pl.when(gather).then(shard).otherwise(pl.col("in_bytes")).alias("in_bytes"),
                             pl.when(scatter).then(shard).otherwise(pl.col("out_bytes")).alias("out_bytes"))
    ids = set(coll.filter(pl.col("op") == op)["coll_id"])
    ev = pl.from_arrow(small["events"]).with_columns(
        pl.when(pl.col("coll_id").is_in(ids)).then(pl.lit(kernel)).otherwise(pl.col("name").cast(pl.Utf8))
        .alias("name"))
    tables = {**small, "collectives": schema.conform("collectives", coll.to_arrow()),
              "events": schema.conform("events", ev.to_arrow())}
    _, t = parse(write_nsys(tables, tmp_path / "n")[0], tmp_path / "run")
    got = _str(pl.from_arrow(t["collectives"])).filter(pl.col("op") == op)
    want = coll.filter((pl.col("op") == op) & (pl.col("rank") < 2)).sort("rank", "ts_ns")
    assert got.height == want.height == 8
    assert got.sort("rank", "ts_ns").select("in_bytes", "out_bytes").equals(want.select("in_bytes", "out_bytes"))
    assert set(got["dtype"]) == ({None} if op == "all_gather" else {"BFloat16"})  # 2.19+ AllGather names no dtype


def test_gzipped_or_headerless_files_are_refused(tmp_path, small):
    import gzip

    path = write_nsys(small, tmp_path / "n")[0]
    packed = tmp_path / "report.sqlite.gz"
    packed.write_bytes(gzip.compress(path.read_bytes()))
    assert detect.detect_format(packed) == "nsys"  # detection reads through gzip; SQLite cannot
    assert "gunzip it first" in _one_line_error(packed, tmp_path / "a")
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"\x00" * 64)
    assert "no SQLite header" in _one_line_error(junk, tmp_path / "b")


# -- grouped point-to-point: PyTorch's all_to_all ---------------------------------------------------

EP = {"hosts": 2, "gpus_per_host": 2, "pp": 1, "ep": 2, "steps": 1, "seed": 3}
A2A_COLS = ["rank", "group", "seq", "op", "in_bytes", "out_bytes", "nranks", "peer", "in_splits", "out_splits",
            "ts_ns", "dur_ns", "state", "algo", "instance", "dim", "name", "lane", "step", "seq_explicit"]


@pytest.fixture(scope="module")
def ep_twins(tmp_path_factory):
    """An EP run (all_to_all) as Kineto traces and as Nsight reports whose all_to_all is NCCL's
    ncclGroupStart, a ncclSend and a ncclRecv per comm rank, ncclGroupEnd and one SendRecv kernel."""
    base = tmp_path_factory.mktemp("ep")
    twin = nsys_twin(make_run_tables(**EP)[0])
    write_kineto(twin, base / "kineto")
    rk = ingest([base / "kineto"], base / "rk")
    assert not rk.failed
    return base, twin, _str(pl.from_arrow(Run(base / "rk").table("collectives")))


def _ingest_nsys(base: Path, paths: list[Path], name: str) -> pl.DataFrame:
    rn = ingest(paths, base / name)
    assert not rn.failed, [s.error for s in rn.failed]
    assert all(s.read == s.stored + sum(s.skipped.values()) for s in rn.sources)
    return _str(pl.from_arrow(Run(base / name).table("collectives")))


def _nvtx_names(path: Path) -> dict[str, int]:
    with closing(sqlite3.connect(path)) as db:
        return {v: i for i, v in db.execute("SELECT id, value FROM StringIds")}


@pytest.mark.parametrize("nccl", ["2.21", "2.27"])
def test_grouped_sends_and_recvs_are_one_all_to_all(ep_twins, nccl):
    base, twin, ck = ep_twins
    paths = write_nsys(twin, base / f"nsys{nccl}", nccl=nccl)
    cn = _ingest_nsys(base, paths, f"rn{nccl}")
    a2a = ck.filter(pl.col("op") == "all_to_all")
    assert a2a.height == 64 and a2a.filter(pl.col("in_splits").list.n_unique() > 1).height > 0  # all_to_allv
    assert ck.select(A2A_COLS).sort(A2A_COLS).equals(cn.select(A2A_COLS).sort(A2A_COLS))
    assert cn.filter(pl.col("op").is_in(["send", "recv", "other"])).is_empty()


def test_group_without_group_ranges_falls_back_to_the_shared_kernel(ep_twins):
    base, twin, ck = ep_twins
    path = base / "nogroup"
    paths = write_nsys(twin, path)
    for p in paths:
        ids = _nvtx_names(p)
        with closing(sqlite3.connect(p)) as db:
            db.execute("DELETE FROM NVTX_EVENTS WHERE textId IN (?, ?)", (ids["ncclGroupStart"], ids["ncclGroupEnd"]))
            db.commit()
    cn = _ingest_nsys(base, paths, "rn_nogroup")
    assert ck.select(A2A_COLS).sort(A2A_COLS).equals(cn.select(A2A_COLS).sort(A2A_COLS))


def _drop_ranges(paths: list[Path], name: str, peer: int) -> None:
    """Delete one rank-0 ncclSend or ncclRecv range to or from comm rank `peer`."""
    for p in paths:
        ids = _nvtx_names(p)
        with closing(sqlite3.connect(p)) as db:
            rows = db.execute("SELECT rowid, jsonText, globalTid FROM NVTX_EVENTS WHERE textId = ? ORDER BY start",
                              (ids[name],)).fetchall()
            gtid = min(r[2] for r in rows)
            for rowid, text, g in rows:
                if g == gtid and json.loads(text)["Peer rank"] == peer:
                    db.execute("DELETE FROM NVTX_EVENTS WHERE rowid = ?", (rowid,))
            db.commit()
        return  # the first report (ranks 0 and 1) only


def test_group_without_its_send_to_itself_is_still_an_all_to_all(ep_twins):
    base, twin, ck = ep_twins
    paths = write_nsys(twin, base / "noself")
    _drop_ranges(paths, "ncclSend", 0)  # rank 0 is comm rank 0 of its EP group: its send to itself
    cn = _ingest_nsys(base, paths, "rn_noself")
    mine = cn.filter(pl.col("rank") == 0)
    assert set(mine["op"]) == {"all_to_all", "all_reduce"}
    want = ck.filter((pl.col("rank") == 0) & (pl.col("op") == "all_to_all")).sort("ts_ns")
    got = mine.filter(pl.col("op") == "all_to_all").sort("ts_ns")
    assert [s[0] for s in got["in_splits"]] == [0] * got.height
    assert got["in_bytes"].to_list() == [b - s[0] for b, s in zip(want["in_bytes"], want["in_splits"], strict=True)]
    assert got["out_splits"].to_list() == want["out_splits"].to_list()


def test_partial_group_keeps_its_p2p_rows_and_the_kernel_is_the_coalesced_call(ep_twins):
    """Like PyTorch's batch_isend_irecv in a Kineto trace: a send/recv row per call, and the
    group's kernel as the communicator's `coalesced` call (op other), timed by the kernel."""
    base, twin, ck = ep_twins
    paths = write_nsys(twin, base / "partial")
    _drop_ranges(paths, "ncclSend", 1)  # rank 0 no longer sends to the other rank of its EP group
    cn = _ingest_nsys(base, paths, "rn_partial")
    mine = cn.filter(pl.col("rank") == 0)
    want = ck.filter((pl.col("rank") == 0) & (pl.col("op") == "all_to_all")).sort("ts_ns")
    other = mine.filter(pl.col("op") == "other").sort("ts_ns")
    assert other.select("group", "ts_ns", "dur_ns", "name").equals(want.select("group", "ts_ns", "dur_ns", "name"))
    sends, recvs = (mine.filter(pl.col("op") == op) for op in ("send", "recv"))
    assert sends.height == want.height and recvs.height == 2 * want.height  # to itself only; from both
    assert set(sends["peer"]) == {0} and set(recvs["peer"]) == {0, 1}
    assert sorted(sends["in_bytes"]) == sorted(s[0] for s in want["in_splits"])
    assert cn.filter(pl.col("rank") == 1).select(A2A_COLS).sort(A2A_COLS).equals(
        ck.filter(pl.col("rank") == 1).select(A2A_COLS).sort(A2A_COLS))


def test_group_sending_to_all_but_not_receiving_from_all_stays_partial(ep_twins):
    """A group that sends to every comm rank but misses one receive is not an all_to_all."""
    base, twin, ck = ep_twins
    paths = write_nsys(twin, base / "norecv")
    _drop_ranges(paths, "ncclRecv", 1)  # rank 0 no longer receives from the other rank of its EP group
    cn = _ingest_nsys(base, paths, "rn_norecv")
    mine = cn.filter(pl.col("rank") == 0)
    want = ck.filter((pl.col("rank") == 0) & (pl.col("op") == "all_to_all"))
    assert "all_to_all" not in set(mine["op"])
    assert mine.filter(pl.col("op") == "other").height == want.height
    assert mine.filter(pl.col("op") == "send").height == 2 * want.height


def _p2p(start, op, comm, peer, nbytes=8):
    return nsys._P2P(start, start + 10, op, comm, nbytes, peer)


def _resolve(ranges, marks, launches, comms):
    ps = nsys._Parse("x", None, None, None, None, nsys.SourceStats())
    ps.procs[(7, 0)] = nsys._Proc(7, 0, {c: nsys._Comm(c, n, r) for c, (n, r) in comms.items()}, 0)
    gtid = (7 << 24) | 1
    ps.p2p[gtid] = ranges
    ps.group_marks[gtid] = marks
    ps.launches[gtid] = launches
    ps.resolve_groups()
    return {c: msgspec_json(a.coll) for (_, c), a in ps.kernel_args.items()}, ps.absorbed


def msgspec_json(raw):
    import msgspec

    return msgspec.json.decode(raw)


def test_groups_interleaved_on_two_communicators():
    """Groups on two communicators in one span: each communicator's calls go to its own kernel
    (one launch per communicator, in the order the group first used them)."""
    k = "ncclDevKernel_SendRecv"
    ranges = [_p2p(10, "send", 1, 1), _p2p(20, "send", 2, 0), _p2p(30, "recv", 1, 1), _p2p(40, "recv", 2, 1),
              _p2p(110, "send", 2, 1), _p2p(120, "recv", 2, 1)]
    marks = [(0, 5, True), (50, 80, False), (100, 105, True), (130, 160, False)]
    launches = [(60, k, 501), (70, k, 502), (140, k, 503)]
    coll, absorbed = _resolve(ranges, marks, launches, {1: (2, 0), 2: (2, 0)})
    assert coll == {501: "all_to_all", 502: "coalesced", 503: "all_to_all"}  # comm 2's first never sends to 1
    assert absorbed == {((7 << 24) | 1, t, op) for t, op in ((10, "send"), (30, "recv"), (110, "send"),
                                                              (120, "recv"))}


def test_ungrouped_calls_and_other_kernels_are_no_group():
    k = "ncclDevKernel_SendRecv"
    ranges = [_p2p(10, "send", 1, 1), _p2p(30, "recv", 1, 1), _p2p(50, "send", 1, 1), _p2p(52, "recv", 1, 1)]
    launches = [(15, k, 1), (35, k, 2), (70, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 3)]
    coll, absorbed = _resolve(ranges, [], launches, {1: (2, 0)})
    assert coll == {} and absorbed == set()  # each launched inside its range; the last pair's kernel is no p2p one
    coll, absorbed = _resolve(ranges[2:], [], [(70, k, 4), (71, k, 5)], {1: (2, 0)})
    assert coll == {4: "all_to_all"} and len(absorbed) == 2


# -- batches: the read is the same whatever the batch size ------------------------------------------


def _with_bad_rows(path: Path) -> Path:
    """Rows the parse skips, spread through the tables: kernels without a process, runtime calls
    of an unknown one, text times, NVTX marks."""
    with closing(sqlite3.connect(path)) as db:
        for table, pid_col in ((nsys.KERNEL, "globalPid"), (nsys.RUNTIME, "globalTid")):
            cols = [r[1] for r in db.execute(f"PRAGMA table_info({table})")]
            unknown = "NULL" if table == nsys.KERNEL else f"{pid_col} + (977 << 24)"
            sel = ", ".join(unknown if c == pid_col else c for c in cols)
            db.execute(f"INSERT INTO {table} ({', '.join(cols)}) SELECT {sel} FROM {table} WHERE rowid % 5 = 0")
            db.execute(f"UPDATE {table} SET start = 'x' WHERE rowid % 97 = 3")
        db.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, globalTid, text) "
                   "SELECT start, NULL, 34, globalTid, 'mark' FROM NVTX_EVENTS WHERE rowid % 11 = 0")
        db.commit()
    return path


def _read_all(path: Path, out: Path) -> tuple[nsys.ParseResult, dict[str, pl.DataFrame]]:
    res, tables = parse(path, out)
    return res, {k: _str(pl.from_arrow(v)) for k, v in tables.items()}


@pytest.fixture(scope="module")
def one_batch(tmp_path_factory, small):
    """A report with skipped rows everywhere, read in one batch per table."""
    base = tmp_path_factory.mktemp("batches")
    path = _with_bad_rows(write_nsys(small, base / "n")[0])
    with closing(sqlite3.connect(path)) as db:
        most = max(db.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in (nsys.KERNEL, nsys.RUNTIME))
    mp = pytest.MonkeyPatch()
    mp.setattr(nsys, "BATCH_ROWS", most + 1)
    try:
        res, tables = _read_all(path, base / "one")
    finally:
        mp.undo()
    assert res.stats.skipped["no_rank"] > 0 and res.stats.skipped["missing_or_bad_ts"] > 0
    return path, most, res, tables


@settings(max_examples=6, deadline=None)
@given(rows=st.sampled_from([1, 2, 7, 64, 100, 200]))
def test_batches_give_the_tables_of_one_batch(one_batch, tmp_path_factory, rows):
    path, most, res, tables = one_batch
    assert rows < most
    mp = pytest.MonkeyPatch()
    mp.setattr(nsys, "BATCH_ROWS", rows)
    try:
        got, got_tables = _read_all(path, tmp_path_factory.mktemp("b"))
    finally:
        mp.undo()
    for name in ("events", *TABLES):
        assert got_tables[name].equals(tables[name]), name  # the same rows in the same order
    assert got.stats.counts() == res.stats.counts()
    assert got.stats.read == got.stats.stored + sum(got.stats.skipped.values())


def test_kernels_run_after_their_step_get_the_step_of_their_launch(tmp_path, small):
    """A GPU row's step is its launch's (the runtime call with its correlation id, joined in SQL),
    as Kineto's is; by its own time it would have none."""
    path = write_nsys(small, tmp_path / "n")[0]
    k, r = nsys.KERNEL, nsys.RUNTIME
    with closing(sqlite3.connect(path)) as db:
        steps = db.execute("SELECT n.start, n.end, n.globalTid >> 24, coalesce(n.text, s.value) FROM NVTX_EVENTS n "
                           "LEFT JOIN StringIds s ON s.id = n.textId WHERE coalesce(n.text, s.value) "
                           "LIKE 'ProfilerStep#%'").fetchall()
        last = max(e for _, e, _, _ in steps)
        moved = db.execute(f"SELECT k.rowid, k.correlationId, r.start, r.globalTid >> 24 FROM {k} k JOIN {r} r "
                           "ON r.correlationId = k.correlationId AND r.globalTid >> 24 = k.globalPid >> 24 "
                           "WHERE k.rowid % 7 = 0").fetchall()
        for rowid, *_ in moved:
            db.execute(f"UPDATE {k} SET start = start + ?, end = end + ? WHERE rowid = ?", (last, last, rowid))
        db.commit()
    _, t = parse(path, tmp_path / "run")
    ev = _str(pl.from_arrow(t["events"])).filter(pl.col("kind").is_in(["compute", "comm"]))
    want = {}
    for _, corr, launched, pid in moved:
        want[corr] = next((int(n.split("#")[1]) for s, e, p, n in steps if p == pid and s <= launched <= e), None)
    got = dict(ev.filter(pl.col("correlation").is_in(list(want))).select("correlation", "step").iter_rows())
    assert len(want) > 10 and got == want and any(v is not None for v in want.values())


def test_comm_kernels_whose_correlation_ids_only_other_processes_launch(tmp_path, small):
    """Runtime rows with the comm kernels' correlation ids, all of another process: no launch is
    found (a fuzz case once crashed here) and the rows are skipped as without a rank."""
    path = write_nsys(small, tmp_path / "n")[0]
    with closing(sqlite3.connect(path)) as db:
        n = db.execute(f"UPDATE {nsys.RUNTIME} SET globalTid = globalTid + (977 << 24)").rowcount
        db.commit()
    res, t = parse(path, tmp_path / "run")
    assert res.stats.skipped["no_rank"] == n > 0 and t["events"].num_rows == res.events


# -- hostile payloads (issue 22): bounded, repeated keys counted, numbers range-checked ----------------


def test_payload_bounds_say_why_a_text_was_not_read():
    assert nsys.read_payload("x" * (nsys.MAX_PAYLOAD_BYTES + 1)).unread == "too_large"
    assert nsys.read_payload("[" * 65 + "]" * 65).unread == "too_deep"
    assert nsys.read_payload("[" * 64 + "]" * 64).unread is None
    assert nsys.read_payload('{"rank": 1').unread == "not_json"
    assert nsys.read_payload(b'{"rank": "\xff"}').unread == "not_json"
    assert nsys.read_payload("").unread is None and nsys.read_payload(None).values == {}


def test_payload_repeated_key_keeps_the_last_value_and_names_it():
    p = nsys.read_payload('{"Rank": 9, "No. of ranks": 4, "Rank": 2, "inner": {"cudaDev": 5, "cudaDev": 1}}')
    assert p.values == {"rank": 2, "nranks": 4, "device": 1}
    assert p.repeated_keys == ("Rank", "cudaDev") and p.bad_numbers == ()


@pytest.mark.parametrize(("text", "field"), [
    ('{"No. of ranks": 0}', "nranks"),
    (f'{{"No. of ranks": {2**18 + 1}}}', "nranks"),
    (f'{{"Rank": {2**18}}}', "rank"),
    ('{"Peer rank": -1}', "peer"),
    (f'{{"Message size [bytes]": {2**62 + 1}}}', "bytes"),
    (f'{{"NCCL communicator ID": {2**64}}}', "comm"),
    ('{"NCCL communicator ID": -5}', "comm"),
    ('{"CUDA device": 1.5}', "device"),
    ('{"CUDA device": "0xzz"}', "device"),
    ('{"Message size [bytes]": 1e400}', "bytes"),
    ('{"Rank": true}', "rank"),
])
def test_payload_numbers_out_of_range_are_dropped_and_named(text, field):
    p = nsys.read_payload(text)
    assert field not in p.values and p.bad_numbers == (field,)


def test_payload_range_edges_are_kept():
    p = nsys.read_payload(f'{{"NCCL communicator ID": "0x{2**64 - 1:x}", "No. of ranks": {2**18}, '
                          f'"Rank": {2**18 - 1}, "Message size [bytes]": {2**62}}}')
    assert p.values == {"comm": 2**64 - 1, "nranks": 2**18, "rank": 2**18 - 1, "bytes": 2**62}
    assert p.bad_numbers == ()


def _set_payloads(db_path: Path, call: str, texts: list[str]) -> list[str]:
    """Give the first len(texts) `call` ranges of the export the payload texts `texts`; their old texts."""
    with closing(sqlite3.connect(db_path)) as db:
        rows = db.execute("SELECT e.rowid, e.jsonText FROM NVTX_EVENTS e JOIN StringIds s ON s.id = e.textId "
                          "WHERE s.value = ? AND e.jsonText IS NOT NULL ORDER BY e.start", (call,)).fetchall()
        assert len(rows) >= len(texts)
        for (rowid, _), text in zip(rows, texts, strict=False):
            db.execute("UPDATE NVTX_EVENTS SET jsonText = ? WHERE rowid = ?", (text, rowid))
        db.commit()
    return [t for _, t in rows[:len(texts)]]


def test_hostile_payloads_in_an_export_are_counted_in_its_warnings(tmp_path, small):
    plain = write_nsys(small, tmp_path / "a", release="2024.5", nccl="2.27")[0]
    hostile = write_nsys(small, tmp_path / "b", release="2024.5", nccl="2.27")[0]
    with closing(sqlite3.connect(hostile)) as db:
        doc = json.loads(db.execute("SELECT e.jsonText FROM NVTX_EVENTS e JOIN StringIds s ON s.id = e.textId "
                                    "WHERE s.value = 'ncclAllReduce' ORDER BY e.start").fetchone()[0])
    decoy = '{"Message size [bytes]": 1, ' + json.dumps(doc)[1:]  # the real value comes last
    texts = [decoy, decoy, json.dumps({**doc, "Message size [bytes]": 2**63}),
             '{"a": ' * 40 + "1" + "}" * 40 + " " * nsys.MAX_PAYLOAD_BYTES]
    _set_payloads(hostile, "ncclAllReduce", texts)
    a, ta = parse(plain, tmp_path / "ra")
    b, tb = parse(hostile, tmp_path / "rb")
    assert b.stats.read == a.stats.read and b.stats.stored == a.stats.stored
    warned = [w for w in b.stats.warnings if "NVTX payload" in w]
    assert not [w for w in a.stats.warnings if "NVTX payload" in w]
    assert any(w.startswith("1 NCCL NVTX payload not read (too_large 1;") for w in warned), warned
    assert any(w.startswith("2 NCCL NVTX payloads with keys given more than once") and "Message size" in w
               for w in warned), warned
    assert any(w.startswith("1 NCCL NVTX payload value not an integer in range, dropped (bytes 1)")
               for w in warned), warned
    ca, cb = ({(r["rank"], r["ts_ns"]): r["in_bytes"] for r in t["collectives"].to_pylist()
               if r["op"] == "all_reduce"} for t in (ta, tb))
    assert ca.keys() == cb.keys()
    assert [cb[k] for k in ca if ca[k] != cb[k]] == [None, None]  # the two unread, not the decoys


def test_a_point_to_point_payload_read_twice_is_counted_once(tmp_path, small):
    path = write_nsys(small, tmp_path / "n", release="2024.5", nccl="2.27")[0]
    with closing(sqlite3.connect(path)) as db:
        text = db.execute("SELECT e.jsonText FROM NVTX_EVENTS e JOIN StringIds s ON s.id = e.textId "
                          "WHERE s.value = 'ncclSend' ORDER BY e.start").fetchone()[0]
    _set_payloads(path, "ncclSend", ['{"Peer rank": 0, ' + text[1:]])
    res, _ = parse(path, tmp_path / "run")
    assert next(w for w in res.stats.warnings if "keys given more than once" in w).startswith(
        "1 NCCL NVTX payload with keys given more than once")


# -- detection by content: renamed exports (issue 25) ---------------------------------------------


@pytest.mark.parametrize("name", ["profile.nsys-rep", "profile.qdrep", "profile", "profile.json", "run.log"])
def test_a_renamed_sqlite_export_is_read_by_its_content(tmp_path, small, name):
    """An SQLite export is one whatever its name: the SQLite header wins over a report suffix."""
    path = write_nsys(small, tmp_path / "n")[0]
    renamed = tmp_path / name
    renamed.write_bytes(path.read_bytes())
    assert detect.detect_format(renamed) == "nsys"
    a, ta = parse(path, tmp_path / "a")
    b, tb = parse(renamed, tmp_path / "b")
    assert b.ranks == a.ranks == [0, 1]
    for table in ("events", *TABLES):
        keep = [c for c in ta[table].column_names if c != "source_file"]
        assert ta[table].select(keep).equals(tb[table].select(keep)), table


@pytest.mark.parametrize("folder", ["profile.sqlite", "profile.nsys-rep", "anything"])
def test_a_renamed_directory_export_is_read(tmp_path, small, folder):
    path = write_nsys(small, tmp_path / "n")[0]
    _to_dir(path, tmp_path / folder, ".parquet")
    report = ingest([tmp_path / folder], tmp_path / "run")
    assert not report.failed and [(s.format, s.ranks) for s in report.sources] == [("nsys", [0, 1])]


def test_a_renamed_report_is_not_recognised_and_says_so_in_one_line(tmp_path):
    """The .nsys-rep container's header is not publicly documented: without its suffix a report
    cannot be told from any binary file (docs/formats.md); ingest names the file, in one line."""
    path = tmp_path / "profile.dat"
    path.write_bytes(bytes(range(256)) * 16)
    assert detect.detect_format(path) is None
    report = ingest([path], tmp_path / "run")
    (failed,) = report.failed
    assert "\n" not in failed.error and failed.error.startswith(str(path)) and "unknown format" in failed.error


# -- bad input: the rest of the list -------------------------------------------------------------


def test_a_failed_nsys_export_is_one_line_and_stores_nothing(tmp_path, monkeypatch):
    path = tmp_path / "prof.nsys-rep"
    path.write_bytes(b"\x00" * 64)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "nsys"
    fake.write_text("#!/bin/sh\necho 'Importer error: the report is\nfrom a newer version' >&2\nexit 3\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    msg = _one_line_error(path, tmp_path / "run")
    assert "nsys export failed (exit 3: from a newer version)" in msg
    report = ingest([path], tmp_path / "ingested")
    assert report.failed and not list((tmp_path / "ingested").glob("events/*/*"))


def test_two_process_device_pairs_given_one_rank(tmp_path, small):
    path = write_nsys(small, tmp_path / "n", nccl="2.18")[0]
    with pytest.raises(InputError) as exc:
        parse(path, tmp_path / "run", rank_map={(None, 10_000, 0): 0, (None, 10_001, 1): 0})
    assert "rank 0 given to two (process, device) pairs" in str(exc.value) and "\n" not in str(exc.value)


# -- the collectives pass: calls repeat, their rows share -----------------------------------------


def test_the_collectives_pass_costs_tens_of_bytes_a_call(tmp_path, monkeypatch):
    """A report's calls repeat every step (same group, sizes, kernel): their markers share one
    row of args and their collective rows one set of fields, so the pass costs tens of bytes a
    call (each call's own markers, times and ids), where objects per call cost about a kilobyte."""
    import sys
    import tracemalloc

    sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
    import bench_nsys

    from tracekit.parsers import kineto

    path = bench_nsys.make_db(tmp_path / "n")
    bench_nsys.grow(path, 8)
    measured: list[tuple[int, int, int]] = []
    build = kineto.build_collectives

    def measure(p1, *args):  # type: ignore[no-untyped-def]
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        out = build(p1, *args)
        measured.append((len(out[0]["coll_id"]), p1.markers.n, tracemalloc.get_traced_memory()[1] - before))
        return out

    monkeypatch.setattr(kineto, "build_collectives", measure)
    tracemalloc.start()
    try:
        sink = SourceSink(tmp_path / "run", "k")
        try:
            nsys.parse(path, sink)
        finally:
            sink.close()
    finally:
        tracemalloc.stop()
    calls = sum(c for c, _, _ in measured)
    assert calls > 5_000
    assert max(peak / c for c, _, peak in measured) < 400, measured



def test_payloads_given_through_string_ids(tmp_path, small):
    """`NVTX_EVENTS.jsonTextId` into `StringIds` (instead of the inline `jsonText`) gives the same."""
    inline = write_nsys(small, tmp_path / "a", release="2024.5", nccl="2.27")[0]
    by_id = write_nsys(small, tmp_path / "b", release="2024.5", nccl="2.27")[0]
    with closing(sqlite3.connect(by_id)) as db:
        top = db.execute("SELECT max(id) FROM StringIds").fetchone()[0]
        texts = db.execute("SELECT DISTINCT jsonText FROM NVTX_EVENTS WHERE jsonText IS NOT NULL").fetchall()
        ids = {t: top + 1 + i for i, (t,) in enumerate(texts)}
        db.executemany("INSERT INTO StringIds (id, value) VALUES (?, ?)", [(i, t) for t, i in ids.items()])
        db.executemany("UPDATE NVTX_EVENTS SET jsonTextId = ?, jsonText = NULL WHERE jsonText = ?",
                       [(i, t) for t, i in ids.items()])
        db.commit()
        assert len(ids) > 3 and not db.execute("SELECT count(*) FROM NVTX_EVENTS WHERE jsonText IS NOT NULL"
                                               ).fetchone()[0]
    a, ta = parse(inline, tmp_path / "ra")
    b, tb = parse(by_id, tmp_path / "rb")
    assert a.ranks == b.ranks == [0, 1]
    for table in ("events", *TABLES):
        keep = [c for c in ta[table].column_names if c != "source_file"]
        assert ta[table].select(keep).equals(tb[table].select(keep)), table
