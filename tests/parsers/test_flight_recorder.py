"""Flight Recorder parser: the real gloo dumps (torch 2.13), the project's 8-rank sample, and
synthetic dumps of the other versions and backends."""

from __future__ import annotations

import gzip
import json
import pickle
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracekit.errors import InputError
from tracekit.parsers import flight_recorder as fr
from tracekit.parsers.detect import detect_bytes
from tracekit.store import SourceSink

REPO = Path(__file__).resolve().parents[2]
FR_REAL = REPO / ".." / "shared" / "real_traces" / "flight_recorder" / "gloo_torch2.13_cpu"
SAMPLE = REPO / "sample_traces" / "gloo_moe_8rank"
SCENARIOS = ("healthy", "missing_rank", "type_mismatch")
ENCODINGS = ("pickle", "json", "pickle_pgconfig_rebuilt")
T0 = 1_700_000_000_000_000_000


def parse_file(path: Path, run_dir: Path, key: str = "k", **kw: Any) -> tuple[fr.FlightRecorderResult, dict]:
    """Parse one dump; return the result and its tables (name -> Arrow table or None)."""
    sink = SourceSink(run_dir, key)
    res = fr.parse(path, sink, **kw)
    sink.close()
    tables: dict[str, pa.Table | None] = {}
    for name in ("collectives", "groups", "ranks"):
        p = run_dir / "sources" / key / f"{name}.parquet"
        tables[name] = pq.read_table(p) if p.is_file() else None
    events = sorted((run_dir / "events").glob(f"rank=*/{key}.parquet"))
    tables["events"] = pa.concat_tables([pq.read_table(e) for e in events]) if events else None
    return res, tables


def entry(**over: Any) -> dict[str, Any]:
    """One NCCL-style entry of the current schema, with overrides."""
    e = {"record_id": 0, "pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": 1,
         "p2p_seq_id": 0, "op_id": 1, "profiling_name": "nccl:all_reduce", "time_created_ns": T0,
         "time_discovered_started_ns": T0 + 100_000, "time_discovered_completed_ns": T0 + 900_000,
         "duration_ms": 0.5, "input_sizes": [[1024]], "input_dtypes": ["Float"], "output_sizes": [[1024]],
         "output_dtypes": ["Float"], "state": "completed", "retired": True, "timeout_ms": 600000, "is_p2p": False}
    e.update(over)
    return e


def nccl_dump(entries: list[dict[str, Any]], **top: Any) -> dict[str, Any]:
    d = {"version": "2.4", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"},
                                         "1": {"name": "1", "desc": "pp", "ranks": "[1, 3]"}},
         "pg_status": {"0": {"last_enqueued_collective": 1}}, "entries": entries}
    d.update(top)
    return d


def write(path: Path, dump: Any, encoding: str = "pickle") -> Path:
    if encoding == "pickle":
        path.write_bytes(pickle.dumps(dump, protocol=4))
    else:
        path.write_text(json.dumps(dump))
    return path


@pytest.fixture(scope="module")
def real() -> Path:
    if not FR_REAL.is_dir():
        pytest.skip(f"real Flight Recorder dumps not present at {FR_REAL}")
    return FR_REAL.resolve()


# ------------------------------------------------------------------------------------ real dumps


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_real_dumps_parse_and_balance(real, tmp_path, scenario, encoding):
    files = sorted((real / scenario / encoding).glob("rank_*"))
    assert len(files) == 4
    for f in files:
        res, t = parse_file(f, tmp_path, key=f.name.replace(".", "_"))
        rank = int(f.name.split("_")[1].split(".")[0])
        assert res.rank == rank
        assert res.stats.balanced
        assert res.version == "2.10" and res.backend == "gloo"
        n = 16 if scenario == "healthy" or (scenario == "missing_rank" and rank == 1) else 17
        assert res.stats.read == n == res.collectives == t["collectives"].num_rows
        assert res.stats.skipped == {"no_duration": n}  # gloo records no durations
        assert res.events == 0 and t["events"] is None
        c = t["collectives"].to_pylist()
        assert {r["source"] for r in c} == {"flight_recorder"}
        assert all(r["seq_explicit"] for r in c)
        ranks = t["ranks"].to_pylist()
        assert ranks[0]["rank"] == rank and ranks[0]["source_format"] == "flight_recorder"
        assert ranks[0]["world_size"] == 4 and ranks[0]["backend"] == "gloo"


def test_real_gloo_fields(real, tmp_path):
    res, t = parse_file(real / "missing_rank" / "json" / "rank_0.json", tmp_path)
    c = {(r["group"], r["seq"]): r for r in t["collectives"].to_pylist()}
    ag = c[("0", 1)]
    got = (ag["op"], ag["dtype"], ag["in_bytes"], ag["out_bytes"], ag["nranks"])
    assert got == ("all_gather", "Float", 512, 2048, 4)
    assert ag["state"] == "completed" and ag["fr_state"] == "scheduled" and ag["retired"] is True
    last = c[("0", 11)]
    assert (last["op"], last["in_bytes"], last["state"], last["retired"]) == ("all_reduce", 512, "scheduled", False)
    assert last["ts_ns"] == last["time_created_ns"] == 1795946199510343589 and last["dur_ns"] is None
    bf = c[("3", 1)]
    assert (bf["op"], bf["dtype"], bf["in_bytes"]) == ("all_reduce", "BFloat16", 8192)
    assert c[("0", 10)]["op"] == "barrier" and c[("0", 10)]["in_bytes"] == 0
    assert {r["op"] for r in c.values()} == {"all_reduce", "all_gather", "broadcast", "all_to_all", "barrier"}
    groups = {g["group"]: g for g in t["groups"].to_pylist()}
    assert set(groups) == {"0", "1", "3"}
    assert groups["0"] == {"group": "0", "desc": "default_pg", "backend": "gloo", "ranks": [0], "size": 4,
                           "dims": [], "ranks_complete": False}
    assert any("pg_config names no ranks" in w for w in res.stats.warnings)


def test_real_rebuilt_pg_config_gives_complete_groups(real, tmp_path):
    _, t = parse_file(real / "healthy" / "pickle_pgconfig_rebuilt" / "rank_1", tmp_path)
    groups = {g["group"]: (g["desc"], g["ranks"], g["ranks_complete"]) for g in t["groups"].to_pylist()}
    assert groups["0"] == ("default_pg", [0, 1, 2, 3], True)
    assert groups["1"] == ("dp_0", [0, 1], True)
    assert groups["4"] == ("pp_1", [1, 3], True)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_real_pickle_and_json_agree(real, tmp_path, scenario):
    keys = ("coll_id", "rank", "group", "seq", "op", "dtype", "in_bytes", "out_bytes", "nranks", "ts_ns",
            "record_id", "op_id", "timeout_ms", "is_p2p")
    for r in range(4):
        _, p = parse_file(real / scenario / "pickle" / f"rank_{r}", tmp_path / "p", key=f"p{r}")
        _, j = parse_file(real / scenario / "json" / f"rank_{r}.json", tmp_path / "j", key=f"j{r}")
        assert p["collectives"].select(keys).to_pylist() == j["collectives"].select(keys).to_pylist()
        assert p["groups"].to_pylist() == j["groups"].to_pylist()


def test_real_pickle_has_call_site_frames(real, tmp_path):
    _, t = parse_file(real / "type_mismatch" / "pickle" / "rank_3", tmp_path)
    last = t["collectives"].to_pylist()[-1]
    assert last["op"] == "broadcast" and last["frame"].startswith("worker at ") and last["frame"].endswith(":79")


def test_real_heads_are_detected(real):
    for scenario in SCENARIOS:
        for f in sorted((real / scenario).glob("*/rank_*")):
            assert fr.sniff(f.read_bytes()[:65536]), f
            assert detect_bytes(f.read_bytes()[:65536]) == "flight_recorder", f


# ------------------------------------------------------------------------ the project's sample


@pytest.fixture(scope="module")
def truth() -> dict[str, Any]:
    path = SAMPLE / "truth.json"
    if not path.is_file() or not (SAMPLE / "fr").is_dir():
        pytest.skip(f"{SAMPLE} not present")
    return json.loads(path.read_text())


@pytest.mark.parametrize("encoding", ["pickle", "json"])
def test_sample_counts_match_truth(truth, tmp_path, encoding):
    layout = {g["pg_name"]: g for g in truth["layout"]["groups"]}
    for f in sorted((SAMPLE / "fr" / encoding).glob("rank_*")):
        res, t = parse_file(f, tmp_path, key=f.name.replace(".", "_"))
        rank = res.rank
        expected = truth["expected_calls"][str(rank)]["all_steps"]
        checks = truth["self_checks"]["flight_recorder"][str(rank)]
        assert res.stats.balanced and res.collectives == checks["entries"] == 32
        c = t["collectives"].to_pylist()
        for op in ("all_to_all", "all_reduce"):
            rows = [r for r in c if r["op"] == op]
            assert len(rows) == expected[op]["count"], op
            assert sum(r["in_bytes"] for r in rows) == expected[op]["in_bytes"], op
            assert sum(r["out_bytes"] for r in rows) == expected[op]["out_bytes"], op
        assert [r["op"] for r in c].count("barrier") == 2
        assert not [r for r in c if r["op"] in ("send", "recv")]  # gloo FR records no p2p
        # a dump can race gloo's lazy retirement: rank 2's pickle has its final barrier not yet retired
        pending = [(r["op"], r["retired"]) for r in c if r["state"] != "completed"]
        assert pending in ([], [("barrier", False)])
        for g in t["groups"].to_pylist():
            assert rank in layout[g["group"]]["ranks"] and g["desc"] == layout[g["group"]]["desc"]
        ranks = t["ranks"].to_pylist()[0]
        assert ranks["world_size"] is None  # default_pg ran only barriers: nothing in one dump says 8


# --------------------------------------------------------------------- versions and variants


def test_nccl_entries_states_durations_and_p2p(tmp_path):
    entries = [
        entry(record_id=0, collective_seq_id=1),
        entry(record_id=1, collective_seq_id=2, profiling_name="nccl:_allgather_base", input_sizes=[[256]],
              output_sizes=[[1024]], input_dtypes=["BFloat16"], output_dtypes=["BFloat16"], duration_ms=None),
        entry(record_id=2, process_group=("1", "pp"), is_p2p=True, p2p_seq_id=1, collective_seq_id=0,
              profiling_name="nccl:send 0->1", output_sizes=[], output_dtypes=[]),
        entry(record_id=3, process_group=("1", "pp"), is_p2p=True, p2p_seq_id=2, collective_seq_id=0,
              profiling_name="nccl:recv 0<-1", input_sizes=[], input_dtypes=[]),
        entry(record_id=4, collective_seq_id=3, state="started", retired=True, duration_ms=None,
              time_discovered_completed_ns=None),
        entry(record_id=5, collective_seq_id=4, state="scheduled", retired=False, duration_ms=None,
              time_discovered_started_ns=None, time_discovered_completed_ns=None,
              profiling_name="nccl:reduce_scatter_tensor_coalesced"),
    ]
    res, t = parse_file(write(tmp_path / "nccl_trace_rank_1", nccl_dump(entries, nccl_version="2.21.5")), tmp_path)
    assert res.rank == 1 and res.backend == "nccl"
    assert (res.stats.read, res.stats.stored, dict(res.stats.skipped)) == (6, 4, {"no_duration": 2})
    c = t["collectives"].to_pylist()
    assert [r["op"] for r in c] == ["all_reduce", "all_gather", "send", "recv", "all_reduce", "reduce_scatter"]
    assert [r["seq"] for r in c] == [1, 2, 1, 2, 3, 4]
    assert [r["state"] for r in c] == ["completed", "completed", "completed", "completed", "started", "scheduled"]
    assert c[0]["ts_ns"] == T0 + 100_000 and c[0]["dur_ns"] == 500_000  # duration_ms wins over discovered times
    assert c[1]["dur_ns"] == 800_000 and c[1]["in_bytes"] == 512 and c[1]["out_bytes"] == 2048
    assert c[1]["nranks"] == 4  # from pg_config
    assert (c[2]["peer_local"], c[2]["peer"], c[2]["in_bytes"], c[2]["nranks"]) == (1, 3, 4096, 2)
    assert (c[3]["peer_local"], c[3]["peer"], c[3]["out_bytes"]) == (1, 3, 4096)
    assert c[4]["retired"] is True and c[4]["state"] == "started"  # NCCL: retired without completing = timed out
    assert c[5]["ts_ns"] == T0 and c[5]["dur_ns"] is None
    ev = t["events"].to_pylist()
    assert len(ev) == 4 and {e["kind"] for e in ev} == {"comm"}
    assert [e["coll_id"] for e in ev] == [r["coll_id"] for r in c[:4]]
    groups = {g["group"]: g for g in t["groups"].to_pylist()}
    assert groups["1"]["ranks"] == [1, 3] and groups["1"]["ranks_complete"] is True
    assert t["ranks"].to_pylist()[0]["nccl_version"] == "2.21.5"


def test_json_strings_zero_times_and_no_entries_key(tmp_path):
    d = nccl_dump([entry(time_discovered_started_ns=0, time_discovered_completed_ns=0, duration_ms=None,
                         process_group=["0", "default_pg"])], comm_lib_version="2.27.3")
    res, t = parse_file(write(tmp_path / "rank_2.json", d, "json"), tmp_path)
    c = t["collectives"].to_pylist()[0]
    assert res.rank == 2 and c["ts_ns"] == T0 and c["dur_ns"] is None
    empty = {"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
             "pg_status": {"0": {"last_completed_collective": "3"}}}
    res, t = parse_file(write(tmp_path / "rank_5.json", empty, "json"), tmp_path, key="e")
    assert res.collectives == 0 and res.stats.read == 0 and t["collectives"] is None
    assert t["ranks"].num_rows == 1 and t["groups"].to_pylist()[0]["ranks"] == [0, 1]


def test_oldest_bare_list_dump_and_missing_fields(tmp_path):
    old = [{"record_id": i, "pg_id": 0, "seq_id": i + 1, "profiling_name": "nccl:all_reduce",
            "time_created_ns": T0 + i, "input_sizes": [[8]], "output_sizes": [[8]], "state": "completed",
            "retired": True} for i in range(3)]
    res, t = parse_file(write(tmp_path / "dump_rank0", old), tmp_path)
    c = t["collectives"].to_pylist()
    assert res.rank == 0 and [r["seq"] for r in c] == [1, 2, 3] and {r["group"] for r in c} == {"pg_id:0"}
    assert c[0]["dtype"] is None and c[0]["in_bytes"] is None  # no dtype, no bytes
    assert any("pg_id" in w for w in res.stats.warnings)


def test_invalid_entries_are_skipped_with_reasons(tmp_path):
    entries = [entry(), "garbage", entry(process_group=None, pg_id=None), entry(collective_seq_id=None),
               entry(input_sizes="nonsense", collective_seq_id=2), entry(collective_seq_id=3, time_created_ns=2**70)]
    res, t = parse_file(write(tmp_path / "rank_0", nccl_dump(entries)), tmp_path)
    assert res.stats.balanced and res.stats.read == 6
    assert dict(res.stats.skipped) == {"invalid_entry": 1, "no_process_group": 1, "no_seq": 1}
    c = t["collectives"].to_pylist()
    assert [r["seq"] for r in c] == [1, 2, 3] and c[1]["in_bytes"] is None


def test_rank_resolution(tmp_path):
    d = nccl_dump([entry()], rank=7)
    res, _ = parse_file(write(tmp_path / "rank_3", d), tmp_path, key="a", rank=1)
    assert res.rank == 7  # the dump's own rank wins
    res, _ = parse_file(write(tmp_path / "comm_lib_trace_rank_12", nccl_dump([entry()])), tmp_path, key="b", rank=1)
    assert res.rank == 12  # then the file name
    res, _ = parse_file(write(tmp_path / "dump.pkl", nccl_dump([entry()])), tmp_path, key="c", rank=4)
    assert res.rank == 4  # then --rank
    with pytest.raises(InputError, match="no rank"):
        parse_file(write(tmp_path / "dump.pkl", nccl_dump([entry()])), tmp_path, key="d")
    assert fr.rank_from_name("nccl_trace_rank_node1_5.json.gz") == 5


def test_gzipped_dump(tmp_path):
    path = tmp_path / "rank_1.json.gz"
    path.write_bytes(gzip.compress(json.dumps(nccl_dump([entry()])).encode()))
    res, _ = parse_file(path, tmp_path)
    assert res.rank == 1 and res.collectives == 1 and res.encoding == "json"


def test_split_name_and_ops():
    assert fr.split_name("nccl:send 0->1") == ("nccl", "send", "0->1")
    assert fr.split_name("gloo:all_gather") == ("gloo", "all_gather", "")
    ops = {"nccl:_reduce_scatter_base": "reduce_scatter", "nccl:all_gather_into_tensor_coalesced": "all_gather",
           "nccl:coalesced": "other", "ncclx:all_to_all": "all_to_all", "xccl:broadcast": "broadcast",
           "nccl:recv 1<-0": "recv", "nccl:mystery": "other", "gloo:barrier": "barrier"}
    for name, op in ops.items():
        assert fr.op_of(fr.split_name(name)[1]) == op, name


# --------------------------------------------------------------------------- hostile and broken


class _Boom:
    def __init__(self, cmd: str) -> None:
        self.cmd = cmd

    def __reduce__(self):
        import os
        return (os.system, (self.cmd,))


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_hostile_pickle_is_refused_and_runs_nothing(tmp_path, protocol):
    marker = tmp_path / "pwned"
    dump = {"version": "2.10", "pg_config": {}, "entries": [_Boom(f"touch {marker}")]}
    path = tmp_path / "rank_0"
    path.write_bytes(pickle.dumps(dump, protocol=protocol))
    sink = SourceSink(tmp_path / "run", "k")
    with pytest.raises(InputError) as err:
        fr.parse(path, sink)
    assert str(path) in str(err.value) and "system" in str(err.value) and "refused" in str(err.value)
    assert not marker.exists()


@pytest.mark.parametrize("payload", [
    b"\x80\x04cbuiltins\neval\n(S'1+1'\ntR.",
    b"\x80\x02csubprocess\nPopen\n(S'true'\ntR.",
    b"(ios\nsystem\nS'true'\n.",  # protocol-0 INST
    b"\x80\x04\x8c\x08builtins\x8c\n__import__\x93\x8c\x02os\x85R.",  # STACK_GLOBAL
    b"\x80\x02Pxyz\n.",  # persistent id
])
def test_other_code_paths_are_refused(tmp_path, payload):
    path = tmp_path / "rank_0"
    path.write_bytes(payload)
    with pytest.raises(InputError, match="refused"):
        fr.load_dump(path)


def test_allow_list_is_data_only():
    from tracekit.parsers import _unpickle

    data = pickle.dumps({"s": {1, 2}, "f": frozenset([3])}, protocol=2)  # protocol 2 pickles sets by global
    assert _unpickle.loads(data) == {"s": {1, 2}, "f": frozenset([3])}
    assert all(callable(v) and v.__module__ in ("builtins", _unpickle.__name__) for v in _unpickle.ALLOWED.values())


@pytest.mark.parametrize("encoding", ["pickle", "json"])
@pytest.mark.parametrize("keep", [0.0, 0.3, 0.97])
def test_truncated_dumps_are_clean_errors(tmp_path, encoding, keep):
    full = write(tmp_path / "full", nccl_dump([entry(record_id=i, collective_seq_id=i + 1) for i in range(50)]),
                 encoding).read_bytes()
    path = tmp_path / ("rank_0.json" if encoding == "json" else "rank_0")
    path.write_bytes(full[: int(len(full) * keep)])
    with pytest.raises(InputError) as err:
        fr.parse(path, SourceSink(tmp_path / "run", "k"))
    assert str(path) in str(err.value)
    if keep:
        assert "truncated" in str(err.value)


def test_truncated_real_pickle(real, tmp_path):
    data = (real / "healthy" / "pickle" / "rank_0").read_bytes()
    path = tmp_path / "rank_0"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match="truncated pickle"):
        fr.parse(path, SourceSink(tmp_path / "run", "k"))


@pytest.mark.parametrize("content", [b"\x80\x04K\x05.", b"[1, 2, 3]", b'{"a": 1}', b"\x80\x04\x95garbage",
                                     b"\x1f\x8b\x08\x00garbage", b"   "])
def test_not_a_dump(tmp_path, content):
    path = tmp_path / "rank_0"
    path.write_bytes(content)
    sink = SourceSink(tmp_path / "run", "k")
    try:
        res = fr.parse(path, sink)
    except InputError as exc:
        assert str(path) in str(exc)
    else:  # a list of non-entries parses, but every entry is skipped
        assert res.stats.balanced and res.collectives == 0


def test_size_limit(tmp_path):
    path = write(tmp_path / "rank_0", nccl_dump([entry() for _ in range(100)]))
    with pytest.raises(InputError, match="limit"):
        fr.parse(path, SourceSink(tmp_path / "run", "k"), max_bytes=1000)


def test_sniff():
    assert fr.sniff(pickle.dumps(nccl_dump([entry()]), protocol=2)[:4096])
    assert fr.sniff(json.dumps(nccl_dump([entry()])).encode()[:4096])
    assert fr.sniff(pickle.dumps([entry()], protocol=4))
    assert not fr.sniff(b'{"traceEvents": [], "schemaVersion": 1}')
    assert not fr.sniff(pickle.dumps({"version": 1, "weights": [1, 2]}))
    assert not fr.sniff(b"NCCL INFO ...")


# ------------------------------------------------------------------------------------- fuzzing

_scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True) | st.text(max_size=12)
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
                       | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
_FIELDS = ("record_id", "pg_id", "process_group", "collective_seq_id", "p2p_seq_id", "op_id", "profiling_name",
           "time_created_ns", "time_discovered_started_ns", "time_discovered_completed_ns", "duration_ms",
           "input_sizes", "input_dtypes", "output_sizes", "output_dtypes", "state", "retired", "is_p2p", "frames")


@settings(max_examples=150, deadline=None)
@given(entries=st.lists(st.one_of(
    st.fixed_dictionaries({}, optional={k: _values for k in _FIELDS}),
    st.builds(lambda e, o: {**e, **o}, st.just(entry()), st.dictionaries(st.sampled_from(_FIELDS), _values)),
    _values), max_size=6), cfg=_values | st.dictionaries(st.text(max_size=3), st.fixed_dictionaries(
        {}, optional={"name": _values, "desc": _values, "ranks": _values | st.lists(st.integers(-(2**40), 2**40))}),
        max_size=3))
def test_fuzzed_entries_never_crash(tmp_path_factory, entries, cfg):
    tmp = tmp_path_factory.mktemp("fuzz")
    path = tmp / "rank_0"
    path.write_bytes(pickle.dumps({"version": "2.4", "pg_config": cfg, "entries": entries}, protocol=4))
    try:
        res = fr.parse(path, SourceSink(tmp / "run", "k"))
    except InputError:
        return
    assert res.stats.balanced and res.stats.read == len(entries)
