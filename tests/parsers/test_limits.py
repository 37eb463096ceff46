"""Regression tests for the hostile-input failure classes of issue 14: hangs, recursion,
overflow and silent wraps, memory bombs (declared world sizes, gzip and pickle bombs)."""

from __future__ import annotations

import contextlib
import gzip
import json
import pickle
import signal
import struct
import tracemalloc
import zlib
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from kineto_helpers import parse_into

from tracekit import _limits
from tracekit.errors import InputError
from tracekit.parsers import _unpickle, nccl_inspector
from tracekit.parsers import flight_recorder as fr
from tracekit.parsers._stream import ByteStream, ChromeTraceReader
from tracekit.store import SourceSink

EV = {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1, "dur": 2}
T0 = 1_700_000_000_000_000_000


@contextlib.contextmanager
def no_hang(seconds: int = 60) -> Iterator[None]:
    """Fail (instead of spinning forever) when the block runs longer than `seconds`: a hang
    detector with a bound far above the real time, not a timing test."""

    def boom(*_: object) -> None:
        raise AssertionError(f"no result after {seconds} s: hang")

    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _kineto(tmp_path: Path, name: str, data: bytes | dict):
    raw = json.dumps(data).encode() if isinstance(data, dict) else data
    p = tmp_path / name
    p.write_bytes(raw)
    with no_hang():
        return parse_into(p, tmp_path / f"run_{name}", rank=0)


def _balanced(parsed) -> None:
    st = parsed.result.stats
    assert st.read == st.stored + sum(st.skipped.values())
    assert parsed.events.num_rows == st.stored


# -- hangs ---------------------------------------------------------------------------------


@pytest.mark.parametrize("data", [
    b'{"traceEvents":[{"ph":"X"},}{"ph":"X","ts":1}, }]}',  # the 52-byte stray brace
    b'{"traceEvents":[}',
    b'{"traceEvents":[}}}}}}}}}}}}}}}}}}}}}}}}]}',
    b'{"traceEvents":[{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":1,"ts":1,"dur":2},]]]]]}',
    b'{"traceEvents":[,,,,,,,,{},,,,"x",1,null,[],{"a":}]}',
])
def test_stray_tokens_where_an_event_starts_do_not_hang(tmp_path: Path, data: bytes) -> None:
    try:
        p = _kineto(tmp_path, "stray.json", data)
    except InputError as exc:
        assert "stray.json" in str(exc) and "\n" not in str(exc)
    else:
        _balanced(p)


def test_stray_brace_in_the_stream_reader_makes_progress() -> None:
    with no_hang(20):
        reader = ChromeTraceReader(iter([b'{"traceEvents":[{"a":1},', b'}{"a":2}]}']), msgspec.json.decode)
        out = list(reader)
    assert ("bad", b"}") in out
    assert reader.finished


@pytest.mark.parametrize("n_bad", [1, 12])
def test_bad_events_do_not_drop_the_rest_to_one_at_a_time(n_bad: int) -> None:
    """A wrong-typed field in one event used to decode the rest of the file event by event
    (53 MB: 4.8 s -> 146 s): decoded bytes and decode calls stay near-linear."""
    ok = json.dumps(EV).encode()
    bad = json.dumps(dict(EV, ts="x" * 10)).encode()
    events = [ok] * 40_000
    for i in range(n_bad):
        events[(i + 1) * len(events) // (n_bad + 1)] = bad
    doc = b'{"traceEvents":[' + b",".join(events) + b"]}"
    calls = [0, 0]

    def decode(raw: bytes):
        calls[0] += 1
        calls[1] += len(raw)
        out = msgspec.json.decode(raw)
        if any(isinstance(e.get("ts"), str) for e in out):
            raise msgspec.ValidationError("ts is a string")
        return out

    chunks = (doc[i:i + (1 << 16)] for i in range(0, len(doc), 1 << 16))
    reader = ChromeTraceReader(chunks, decode)
    with no_hang():
        got = list(reader)
    good = sum(len(x) for k, x in got if k == "batch")
    assert good == len(events) - n_bad
    assert sum(k == "bad" for k, _ in got) == n_bad
    assert calls[1] < 4 * len(doc)
    assert calls[0] < 800 * n_bad + 3 * len(doc) // (1 << 16) + 10


def test_value_split_over_many_chunks_is_scanned_once() -> None:
    """A long event arriving in 1-byte chunks: buffering is amortised, not quadratic."""
    big = json.dumps(dict(EV, args={"s": "y" * 200_000})).encode()
    doc = b'{"traceEvents":[' + big + b"]}"
    calls = [0]

    def chunks():
        for i in range(0, len(doc), 64):
            calls[0] += 1
            yield doc[i:i + 64]

    with no_hang(60):
        out = list(ChromeTraceReader(chunks(), msgspec.json.decode))
    assert sum(len(x) for k, x in out if k == "batch") == 1


# -- recursion -----------------------------------------------------------------------------

DEEP = "[" * 100_000 + "]" * 100_000


def test_deep_nesting_in_an_event_is_a_counted_skip(tmp_path: Path) -> None:
    deep = json.dumps(EV)[:-1] + ', "args": {"x": ' + DEEP + "}}"
    doc = '{"traceEvents":[' + ",".join([json.dumps(EV), deep, json.dumps(EV)]) + "]}"
    p = _kineto(tmp_path, "deep.json", doc.encode())
    _balanced(p)
    assert p.result.stats.stored == 2
    assert p.result.stats.skipped == {"invalid_event": 1}


@pytest.mark.parametrize("key", ["distributedInfo", "deviceProperties", "someOtherKey"])
def test_deep_nesting_in_a_top_level_key_is_a_warning(tmp_path: Path, key: str) -> None:
    doc = f'{{"{key}":{DEEP},"traceEvents":[{json.dumps(EV)}]}}'
    p = _kineto(tmp_path, "deep_top.json", doc.encode())
    _balanced(p)
    assert p.result.stats.stored == 1
    assert any(key in w for w in p.result.stats.warnings)


def test_deep_nesting_in_a_flight_recorder_json_dump(tmp_path: Path) -> None:
    path = tmp_path / "rank0.json"
    path.write_text(f'{{"entries": {DEEP}}}')
    with pytest.raises(InputError, match="nested deeper"):
        fr.load_dump(path)


def test_deep_nesting_in_a_pickle(tmp_path: Path) -> None:
    data = pickle.PROTO + b"\x04" + (pickle.EMPTY_LIST + pickle.MARK) * 5000
    with pytest.raises(InputError, match=r"nested deeper|truncated|MARK storm"):
        _unpickle.loads(data)
    nested: list = []
    for _ in range(200):
        nested = [nested]
    with pytest.raises(InputError, match="nested deeper"):
        _unpickle.loads(pickle.dumps(nested))


# -- overflow and silent wrap ----------------------------------------------------------------


def test_step_beyond_any_range_is_not_a_step(tmp_path: Path) -> None:
    step = dict(EV, cat="user_annotation", name="ProfilerStep#" + "9" * 30, dur=100)
    p = _kineto(tmp_path, "step.json", {"traceEvents": [step, EV]})
    _balanced(p)
    steps = [s for s in p.events.column("step").to_pylist() if s is not None]
    assert all(0 <= s < 2**31 for s in steps)


@pytest.mark.parametrize("ws", [2**63, 10**30, -1, 0, "1e999", 1.5, 2**18 + 1])
def test_world_size_out_of_range_is_ignored_with_a_warning(tmp_path: Path, ws) -> None:
    p = _kineto(tmp_path, "ws.json", {"distributedInfo": {"rank": 0, "world_size": ws}, "traceEvents": [EV]})
    _balanced(p)
    assert p.ranks.column("world_size").to_pylist() == [None]
    assert any("world_size" in w for w in p.result.stats.warnings)


def test_world_size_below_a_named_rank_is_ignored(tmp_path: Path) -> None:
    doc = {"distributedInfo": {"rank": 5, "world_size": 4}, "traceEvents": [EV]}
    path = tmp_path / "ws.json"
    path.write_text(json.dumps(doc))
    p = parse_into(path, tmp_path / "run")
    assert p.ranks.column("world_size").to_pylist() == [None]


@pytest.mark.parametrize("field", ["correlation", "External id"])
def test_ids_beyond_int64_are_dropped_and_counted(tmp_path: Path, field: str) -> None:
    ev = dict(EV, args={field: 2**70})
    p = _kineto(tmp_path, "corr.json", {"traceEvents": [ev]})
    _balanced(p)
    assert p.result.stats.stored == 1
    assert sum(p.result.stats.dropped.values()) == 1


@pytest.mark.parametrize("ts", [2**70, -(2**70), 2**62, "1e400", 1e300])
def test_timestamps_out_of_range_are_skipped_never_wrapped(tmp_path: Path, ts) -> None:
    raw = json.dumps({"traceEvents": [dict(EV, ts=0), EV]}).replace('"ts": 0', f'"ts": {ts}')
    p = _kineto(tmp_path, "ts.json", raw.encode())
    _balanced(p)
    assert p.result.stats.skipped == {"ts_out_of_range": 1}
    assert p.events.column("ts_ns").to_pylist() == [1000]


@pytest.mark.parametrize("dur", [2**70, 2**62, -5])
def test_durations_out_of_range_are_skipped(tmp_path: Path, dur) -> None:
    p = _kineto(tmp_path, "dur.json", {"traceEvents": [dict(EV, dur=dur), EV]})
    _balanced(p)
    assert p.result.stats.stored == 1
    assert max(p.events.column("dur_ns").to_pylist()) == 2000


def test_base_time_beyond_int64_is_a_clean_error(tmp_path: Path) -> None:
    path = tmp_path / "base.json"
    path.write_text(json.dumps({"baseTimeNanoseconds": 2**70, "traceEvents": [EV]}))
    with pytest.raises(InputError, match="baseTimeNanoseconds"):
        parse_into(path, tmp_path / "run", rank=0)


def test_base_time_that_would_wrap_event_times(tmp_path: Path) -> None:
    path = tmp_path / "base.json"
    path.write_text(json.dumps({"baseTimeNanoseconds": 2**62 - 10, "traceEvents": [dict(EV, ts=2**50)]}))
    try:
        p = parse_into(path, tmp_path / "run", rank=0)
    except InputError as exc:
        assert "baseTimeNanoseconds" in str(exc)
    else:
        _balanced(p)
        assert all(abs(t) < 2**62 for t in p.events.column("ts_ns").to_pylist())


@pytest.mark.parametrize("value", [True, float("nan"), float("inf"), "12a", "9" * 50, [1], 1.5])
def test_checked_int_refuses_non_integers(value) -> None:
    assert _limits.checked_int(value, "id") is None


def test_checked_int_ranges() -> None:
    assert _limits.checked_int(2**63 - 1, "id") == 2**63 - 1
    assert _limits.checked_int(2**63, "id") is None
    assert _limits.checked_int("-12", "time_ns") == -12
    assert _limits.checked_int(-1, "size") is None
    assert _limits.checked_int(3.0, "count") == 3


def _fr_parse(tmp_path: Path, dump: dict, name: str = "rank0.pkl"):
    path = tmp_path / name
    path.write_bytes(pickle.dumps(dump, protocol=4))
    sink = SourceSink(tmp_path / "run", "k")
    try:
        with no_hang():
            return fr.parse(path, sink)
    finally:
        sink.close()


def _fr_entry(**over) -> dict:
    e = {"record_id": 0, "pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": 1,
         "p2p_seq_id": 0, "op_id": 1, "profiling_name": "nccl:all_reduce", "time_created_ns": T0,
         "time_discovered_started_ns": T0 + 100, "time_discovered_completed_ns": T0 + 900,
         "duration_ms": 0.5, "input_sizes": [[1024]], "input_dtypes": ["Float"],
         "output_sizes": [[1024]], "output_dtypes": ["Float"], "state": "completed"}
    e.update(over)
    return e


@pytest.mark.parametrize("over", [
    {"time_created_ns": 2**70, "time_discovered_started_ns": 2**70, "time_discovered_completed_ns": 2**71},
    {"collective_seq_id": 2**70},
    {"op_id": -(2**70)},
    {"duration_ms": 1e300},
    {"input_sizes": [[2**40, 2**40]]},
    {"input_sizes": [[10**30]]},
])
def test_flight_recorder_numbers_out_of_range_never_wrap(tmp_path: Path, over: dict) -> None:
    res = _fr_parse(tmp_path, {"rank": 0, "entries": [_fr_entry(), _fr_entry(record_id=1, **over)]})
    st = res.stats
    assert st.read == st.stored + sum(st.skipped.values())
    import pyarrow.parquet as pq

    cols = pq.read_table(tmp_path / "run" / "sources" / "k" / "collectives.parquet").to_pylist()
    for row in cols:
        for v in row.values():
            if isinstance(v, int):
                assert -(2**63) <= v < 2**63


# -- memory bombs ----------------------------------------------------------------------------


def test_huge_flight_recorder_world_size_allocates_nothing(tmp_path: Path) -> None:
    tracemalloc.start()
    try:
        res = _fr_parse(tmp_path, {"rank": 0, "world_size": 2**40, "entries": [_fr_entry()],
                                   "pg_config": {"0": {"name": "0", "desc": "default_pg",
                                                       "ranks": f"[0, {2**40}]"}}})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20
    assert res.stats.stored >= 1


def test_huge_pg_config_rank_list_is_bounded(tmp_path: Path) -> None:
    ranks = list(range(2 * _limits.MAX_WORLD_SIZE))
    res = _fr_parse(tmp_path, {"rank": 0, "entries": [_fr_entry()],
                               "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": ranks}}})
    assert res.stats.read == res.stats.stored + sum(res.stats.skipped.values())


def _memo_bomb(fanout: int, levels: int, leaf: bytes) -> bytes:
    """A pickle of a few kB whose tree has fanout**levels references to one long string."""
    out = [pickle.PROTO, b"\x04", pickle.SHORT_BINUNICODE if len(leaf) < 256 else pickle.BINUNICODE]
    out.append(bytes([len(leaf)]) if len(leaf) < 256 else struct.pack("<I", len(leaf)))
    out += [leaf, pickle.MEMOIZE]
    for lvl in range(levels):
        out += [pickle.EMPTY_LIST, pickle.MARK]
        out += [pickle.BINGET + bytes([lvl])] * fanout
        out += [pickle.APPENDS, pickle.MEMOIZE]
    out.append(pickle.STOP)
    return b"".join(out)


@pytest.mark.parametrize(("fanout", "levels", "leaf"), [
    (1000, 1, b"x" * 1_000_000),  # one long string referenced 1000 times: 1 GB as text
    (100, 6, b"y"),  # lists of lists that multiply on every level: 10**12 leaves
])
def test_pickle_memo_bombs_stop_early(fanout: int, levels: int, leaf: bytes) -> None:
    data = _memo_bomb(fanout, levels, leaf)
    assert len(data) < 1_100_000
    tracemalloc.start()
    try:
        with no_hang(), pytest.raises(InputError, match="output larger"):
            _unpickle.loads(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20


def test_pickle_hash_colliding_int_keys_are_refused() -> None:
    keys = [i * (2**61 - 1) for i in range(1, 30_000)]  # all hash to 0
    data = pickle.dumps(dict.fromkeys(keys), protocol=4)
    with no_hang(), pytest.raises(InputError, match="share one hash"):
        _unpickle.loads(data)


def test_pickle_memo_growth_is_capped() -> None:
    data = pickle.PROTO + b"\x04" + (pickle.NONE + pickle.MEMOIZE + pickle.POP) * 2000 + pickle.NONE + pickle.STOP
    with pytest.raises(InputError, match="memo"):
        _unpickle.RestrictedUnpickler.__init__  # noqa: B018
        import io

        _unpickle.RestrictedUnpickler(io.BytesIO(data), path="x", max_output=1000).load()


def test_pickle_long_integers_are_refused() -> None:
    with pytest.raises(InputError, match="integer"):
        _unpickle.loads(pickle.dumps(2**10_000))


def test_gzip_ratio_cap_stops_a_bomb(tmp_path: Path) -> None:
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    zero = bytes(1 << 20)
    comp = b"".join(z.compress(zero) for _ in range(64)) + z.flush()
    path = tmp_path / "bomb.json.gz"
    path.write_bytes(comp)
    guard = _limits.DecompressionGuard(ratio=50, free=1 << 20)
    out = 0
    with ByteStream(path, guard=guard, chunk_size=1 << 16) as s:
        for c in s.chunks():
            out += len(c)
        assert s.limit is not None and "decompression bomb" in s.limit
    assert out < 4 << 20


def test_gzip_bomb_through_kineto_is_a_clean_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    head = b'{"traceEvents":[{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":1,"ts":1,"dur":2,"args":{"s":"'
    comp = z.compress(head) + b"".join(z.compress(b"a" * (1 << 20)) for _ in range(32)) + z.flush()
    path = tmp_path / "rank0.json.gz"
    path.write_bytes(comp)
    monkeypatch.setattr(_limits.DecompressionGuard.__init__, "__kwdefaults__",
                        {"ratio": 50, "free": 1 << 20, "max_out": None})
    with no_hang(), pytest.raises(InputError, match="decompression bomb"):
        parse_into(path, tmp_path / "run", rank=0)
    assert gzip.decompress(comp)[:10] == head[:10]


# -- pickle bombs the output limit alone let through (issue 22 item 6) ------------------------

_BOMB_RUNNER = """
import resource, sys, time
from tracekit.errors import InputError
from tracekit.parsers import flight_recorder as fr
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
try:
    fr.load_dump(sys.argv[1])
    verdict = "loaded"
except InputError as exc:
    verdict = "refused: " + str(exc)
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(f"{time.perf_counter() - t0:.3f} {grown} {verdict}")
"""


def _reduce_bomb(constructor: tuple[bytes, bytes], strings: int, copies: int) -> bytes:
    """`copies` REDUCEs of an allowed constructor over one memoized tuple of `strings` distinct strings,
    kept on the stack under one MARK: small on disk, `copies * strings` references in memory."""
    module, name = constructor
    head = pickle.PROTO + b"\x04" + pickle.MARK
    head += pickle.SHORT_BINUNICODE + bytes([len(module)]) + module
    head += pickle.SHORT_BINUNICODE + bytes([len(name)]) + name + pickle.STACK_GLOBAL + pickle.MEMOIZE  # memo 0
    head += pickle.MARK + b"".join(pickle.SHORT_BINUNICODE + b"\x06" + f"{i:06d}".encode() for i in range(strings))
    head += pickle.TUPLE + pickle.TUPLE1 + pickle.MEMOIZE + pickle.POP + pickle.POP  # memo 1: (strings,)
    body = (pickle.BINGET + b"\x00" + pickle.BINGET + b"\x01" + pickle.REDUCE) * copies
    return head + body + pickle.LIST + pickle.STOP


def _run_bomb(path: Path) -> tuple[float, int, str]:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _BOMB_RUNNER, str(path)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    seconds, grown_kb, verdict = out.stdout.strip().split(" ", 2)
    return float(seconds), int(grown_kb), verdict


@pytest.mark.parametrize(("name", "constructor", "copies"), [
    ("strlist", (b"torch.jit._pickle", b"build_strlist"), 400),
    ("frozenset", (b"builtins", b"frozenset"), 60),
])
def test_reduce_bombs_are_refused_before_they_allocate(tmp_path: Path, name: str, constructor, copies: int) -> None:
    path = tmp_path / f"rank0_{name}.pkl"
    path.write_bytes(_reduce_bomb(constructor, 200_000, copies))
    assert path.stat().st_size < 1_700_000  # 8 bytes per distinct string, 5 per copy
    seconds, grown_kb, verdict = _run_bomb(path)
    assert verdict.startswith("refused") and "references built in all" in verdict, verdict
    assert seconds < 5 and grown_kb < 150_000, (seconds, grown_kb)  # the bomb itself would need > 600 MB


def test_mark_storm_inside_a_gzip_is_refused_quickly_and_small(tmp_path: Path) -> None:
    path = tmp_path / "rank0.pkl.gz"
    path.write_bytes(gzip.compress(pickle.PROTO + b"\x04" + pickle.MARK * 6_000_000 + pickle.STOP))
    assert path.stat().st_size < 64_000
    seconds, grown_kb, verdict = _run_bomb(path)
    assert verdict.startswith("refused") and "MARK" in verdict, verdict
    assert seconds < 5 and grown_kb < 100_000, (seconds, grown_kb)  # 6 M open MARKs are > 400 MB


def test_real_sized_dump_still_loads_under_the_new_budgets() -> None:
    entries = [{"record_id": i, "frames": [{"name": f"f{j}", "line": j} for j in range(20)],
                "input_sizes": [[1024, 1024]], "state": "completed"} for i in range(20_000)]
    assert _unpickle.loads(pickle.dumps({"entries": entries, "version": "2.4"})) == {
        "entries": entries, "version": "2.4"}


INSPECTOR = Path(__file__).resolve().parent / "nccl_data" / "inspector_node-a-pid4100.log"


@pytest.mark.parametrize(("field", "value"), [("n_ranks", 2**40), ("n_ranks", 2**31), ("rank", 2**31),
                                              ("rank", 4294967296), ("coll_exec_time_us", 2**62),
                                              ("coll_msg_size_bytes", 10**30)])
def test_inspector_numbers_out_of_range_never_wrap_or_allocate(tmp_path: Path, field: str, value: int) -> None:
    """Found by the fuzzer's huge-number class (issue 22): a communicator size of 2^40 sized a rank
    map (an OOM kill), a rank of 2^31 failed the int32 cast."""
    import resource

    lines = INSPECTOR.read_text().splitlines()
    doc = json.loads(lines[1])
    part = doc["header"] if field in doc["header"] else doc["coll_perf"]
    part[field] = value
    path = tmp_path / "inspector.log"
    path.write_text("\n".join([lines[0], json.dumps(doc), *lines[2:]]) + "\n")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    st = nccl_inspector.parse(path, SourceSink(tmp_path / "run", "k")).stats
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200 << 10
    assert st.read == st.stored + sum(st.skipped.values())
    if field == "rank":
        assert st.skipped.get("rank_out_of_range") == 1
