"""The fast paths of Kineto ingest against their plain twins: the phase-tagged decoder, the
vectorised lane column, the background gunzip and the detached marker args."""

from __future__ import annotations

import gzip
import json
import sys
import threading
from pathlib import Path

import msgspec
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracekit.parsers import kineto
from tracekit.parsers._stream import ByteStream
from tracekit.store import SourceStats

_value = st.one_of(st.none(), st.integers(-5, 5), st.floats(allow_nan=False, allow_infinity=False),
                   st.text(max_size=3), st.lists(st.integers(0, 3), max_size=2))
_event = st.fixed_dictionaries(
    {"ph": st.one_of(st.sampled_from(["X", "X", "X", "M", "s", "f", "i", "C", "B", "Z", ""]),
                     st.integers(0, 2))},
    optional={"cat": st.one_of(st.sampled_from(["kernel", "cpu_op", "cuda_runtime"]), _value),
              "name": st.one_of(st.text(max_size=5), _value), "pid": _value, "tid": _value,
              "ts": st.one_of(st.integers(0, 10**16), st.floats(0, 1e6), _value),
              "dur": _value, "args": st.one_of(_value, st.fixed_dictionaries(
                  {}, optional={"correlation": _value, "External id": _value,
                                "Collective name": _value}))})


def _fields(e: object) -> tuple:
    return (e.ph, e.cat, e.name, e.pid, e.tid, bytes(e.ts), bytes(e.dur),  # type: ignore[attr-defined]
            msgspec.json.encode(e.args))  # type: ignore[attr-defined]


@settings(max_examples=300, deadline=None)
@given(events=st.lists(_event, max_size=12), drop_ph=st.booleans())
def test_tagged_decoder_matches_event_decoder(events: list[dict], drop_ph: bool) -> None:
    if drop_ph and events:
        events[0].pop("ph")
    buf = json.dumps(events).encode()
    try:
        plain = kineto.EVENT_DECODER.decode(buf)
    except msgspec.ValidationError:
        plain = None
    try:
        fast = kineto.decode_events(buf)
    except msgspec.ValidationError:
        fast = None
    if plain is None:
        # only events tracekit skips may be looser than before (they are counted by phase)
        if fast is not None:
            bad = [e for e in events if e.get("ph") != "X"]
            assert bad and all(type(e) is not kineto.Event for e in fast)
        return
    assert fast is not None and len(fast) == len(plain)
    for f, p in zip(fast, plain, strict=True):
        assert f.ph == p.ph
        if p.ph == "X":
            assert _fields(f) == _fields(p)


def _naive_lanes(pids: list, tids: list, gpu: np.ndarray) -> pa.Array:
    p1 = kineto.Pass1(Path("unused"), kineto.compile_patterns(None), SourceStats())
    return pa.array(p1._lanes(pids, tids, gpu), pa.string()).dictionary_encode()


_ids = st.one_of(st.integers(0, 3), st.integers(2**40, 2**40 + 2), st.integers(-2, -1))


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(st.tuples(st.booleans(), _ids, _ids), min_size=1, max_size=40),
       odd=st.sampled_from([None, 1.0, 2.5, "Spans", 2**70]))
def test_lane_column_matches_naive(rows: list[tuple[bool, int, int]], odd: object) -> None:
    gpu = np.array([r[0] for r in rows], bool)
    pids = [r[1] for r in rows]
    tids = [r[2] for r in rows]
    for variant in ("ints", "odd"):
        if variant == "odd":
            if odd is None:
                continue
            pids = [*pids[:-1], odd]
        p1 = kineto.Pass1(Path("unused"), kineto.compile_patterns(None), SourceStats())
        # twice: the second call runs with a warm lane cache
        for _ in range(2):
            arr, vals, idx = p1._lane_column(pids, tids, gpu)
            want = _naive_lanes(pids, tids, gpu)
            assert arr.type == want.type
            assert arr.equals(want)
            assert vals == want.dictionary.to_pylist()
            assert [vals[i] for i in idx.tolist()] == want.to_pylist()


def _gzip_members(tmp_path: Path, payload: bytes) -> dict[str, Path]:
    comp = gzip.compress(payload)
    cases = {
        "plain": payload,
        "gzip": comp,
        "two_members": gzip.compress(payload[:1000]) + gzip.compress(payload[1000:]),
        "truncated": comp[: len(comp) // 2],
        "corrupt": comp[:40] + bytes(64) + comp[104:],
        "trailing_zeros": comp + bytes(16),
    }
    out = {}
    for name, data in cases.items():
        p = tmp_path / f"{name}.bin"
        p.write_bytes(data)
        out[name] = p
    return out


@pytest.mark.parametrize("chunk", [1 << 10, 1 << 21])
def test_prefetched_matches_chunks(tmp_path: Path, chunk: int) -> None:
    payload = json.dumps({"traceEvents": [{"ph": "X", "name": f"k{i}"} for i in range(3000)]}).encode()
    for name, path in _gzip_members(tmp_path, payload).items():
        with ByteStream(path, chunk_size=chunk) as a:
            want = b"".join(a.chunks())
            flags = (a.truncated_gzip, a.corrupt, a.bytes_in)
        with ByteStream(path, chunk_size=chunk) as b:
            got = b"".join(b.prefetched(depth=2))
            assert (b.truncated_gzip, b.corrupt, b.bytes_in) == flags, name
        assert got == want, name


def test_prefetched_stops_when_abandoned(tmp_path: Path) -> None:
    payload = b"x" * (1 << 22)
    path = tmp_path / "big.gz"
    path.write_bytes(gzip.compress(payload))
    before = threading.active_count()
    with ByteStream(path, chunk_size=1 << 12) as s:
        it = s.prefetched(depth=1)
        next(it)
        # the flags describe what the consumer has seen, not how far the thread has read
        assert not s.truncated_gzip and s.corrupt is None
    assert threading.active_count() == before


def test_marker_args_do_not_pin_the_batch() -> None:
    from tracekit.parsers._kineto_calls import MarkerStore

    ev = {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "ts": 1, "dur": 1,
          "args": {"Collective name": "allreduce", "Process Group Name": "0", "In msg nelems": 8}}
    ev2 = {**ev, "args": {"Collective name": "broadcast", "Process Group ID": 7}}
    buf = json.dumps([ev, ev2] + [{"ph": "X", "name": "pad" * 50}] * 2000).encode()
    decoded = kineto.decode_events(buf)
    args = [decoded[0].args, None, decoded[1].args]
    del decoded
    pinned = sys.getrefcount(buf)
    store = MarkerStore(kineto.Args)
    three = np.zeros(3, np.int64)
    store.append({"ordinal": three, "ts": three, "dur": three, "corr": three, "ext": three, "flags": three,
                  "lane": three, "name": three}, args)
    del args
    assert sys.getrefcount(buf) < pinned
    kept = store.args(0)
    assert bytes(kept.coll) == b'"allreduce"' and bytes(kept.pg_name) == b'"0"'
    assert bytes(kept.in_nelems) == b"8" and not kept.out_nelems and not kept.pg_id
    assert store.raw(0, "coll") == b'"allreduce"' and store.raw(0, "pg_id") == b""
    assert store.args(1) is None and store.raw(1, "coll") == b"" and not store.has_args(1)
    assert store.raw(2, "coll") == b'"broadcast"' and store.raw(2, "pg_id") == b"7"
    assert bytes(store.args(2).pg_id) == b"7" and not store.args(2).pg_name


def test_markers_with_equal_args_share_one_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """A call repeated every step has the same args: its markers share one row of them; args
    with the same bytes in other fields, or beyond the looked-up ones, keep their own."""
    from tracekit.parsers import _kineto_calls
    from tracekit.parsers._kineto_calls import MarkerStore

    def args(**raw: bytes) -> kineto.Args:
        return kineto.Args(**{k: msgspec.Raw(v) for k, v in raw.items()})

    same = [args(coll=b'"allreduce"', pg_name=b'"0"'), args(coll=b'"allreduce"', pg_name=b'"0"')]
    moved = args(coll=b'"allreduce"', pg_id=b'"0"')  # the same bytes, in another field
    other = args(coll=b'"broadcast"', pg_name=b'"0"')
    five = np.zeros(5, np.int64)
    cols = {"ordinal": five, "ts": five, "dur": five, "corr": five, "ext": five, "flags": five, "lane": five,
            "name": five}
    store = MarkerStore(kineto.Args)
    store.append(cols, [*same, None, moved, other])
    rows = [store.args_row(i) for i in range(5)]
    assert rows[0] == rows[1] >= 0 and rows[2] == -1 and len({rows[0], rows[3], rows[4]}) == 3
    assert store.n_args == 3
    assert [store.raw(i, "pg_name") for i in (0, 1, 3)] == [b'"0"', b'"0"', b""]
    assert store.raw(3, "pg_id") == b'"0"' and store.raw(4, "coll") == b'"broadcast"'
    assert store.fields_of(2) == 0 and store.fields_of(0) != store.fields_of(3)
    monkeypatch.setattr(_kineto_calls, "_SHARED_ARGS", 1)
    full = MarkerStore(kineto.Args)
    full.append(cols, [other, *same, moved, other])
    assert [full.args_row(i) for i in range(5)] == [0, 1, 2, 3, 0]  # only the first is looked up
    assert [bytes(full.args(i).coll) for i in range(5)] == [b'"broadcast"', *[b'"allreduce"'] * 3, b'"broadcast"']


def test_spooled_and_held_stages_give_the_same_tables(real: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from kineto_helpers import parse_into

    src = real / "hta_trace_filter_sampled_2rank" / "sampled_rank-0.json.gz"
    held = parse_into(src, tmp_path / "held", chunk_size=1 << 12)
    spills = []
    real_write = kineto.Pass1._write

    def write(self: kineto.Pass1, table: pa.Table) -> None:
        real_write(self, table)
        spills.append(self.spilled)

    monkeypatch.setattr(kineto.Pass1, "_write", write)
    monkeypatch.setattr(kineto, "SPOOL_MEMORY", 50_000)
    spooled = parse_into(src, tmp_path / "spooled", chunk_size=1 << 12)
    assert spills[0] is False and spills[-1] is True  # held first, then spilled
    assert held.result == spooled.result
    for name in ("events", "collectives", "groups", "ranks"):
        assert getattr(held, name).equals(getattr(spooled, name)), name
    assert held.events.num_rows > 1000 and held.collectives.num_rows
    assert not (tmp_path / "spooled" / "sources" / "k" / "_events.arrows").exists()


def test_markers_cost_the_bytes_of_their_columns(real: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The file's communication markers are held as columns until they are matched into calls:
    tens of bytes each (a marker object with its args took hundreds to a thousand)."""
    import gc
    import tracemalloc

    from kineto_helpers import parse_into

    held: list[tuple[int, int]] = []
    build = kineto.build_collectives

    def measure(p1, *args):  # type: ignore[no-untyped-def]
        out = build(p1, *args)
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        n = p1.markers.n
        p1.markers = None
        gc.collect()
        held.append((n, before - tracemalloc.get_traced_memory()[0]))
        return out

    monkeypatch.setattr(kineto, "build_collectives", measure)
    tracemalloc.start()
    try:
        parse_into(real / "hta_df_index_resolver" / "df_index_resolver.json.gz", tmp_path)
    finally:
        tracemalloc.stop()
    (n, nbytes), = held
    assert n > 10_000
    assert nbytes / n < 100


def _trace(tmp_path: Path, events: list[dict]) -> Path:
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({"distributedInfo": {"rank": 0, "world_size": 2}, "traceEvents": events}))
    return path


_RPC = {"Collective name": "allreduce", "Process Group Name": "0", "In msg nelems": 8, "Out msg nelems": 8,
        "dtype": "Float", "Group size": 2}


def test_markers_nested_at_one_start_are_one_call(tmp_path: Path) -> None:
    from kineto_helpers import parse_into

    # the c10d op and its record_param_comms start together: the longer one encloses the other
    path = _trace(tmp_path, [
        {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": 10, "dur": 5,
         "args": _RPC},
        {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": 1, "tid": 1, "ts": 10, "dur": 20},
    ])
    parsed = parse_into(path, tmp_path / "out")
    assert parsed.collectives.num_rows == 1
    assert parsed.collectives.column("in_bytes").to_pylist() == [32]


def test_a_kernel_joins_the_first_cpu_op_of_its_external_id(tmp_path: Path) -> None:
    from kineto_helpers import parse_into

    path = _trace(tmp_path, [
        {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": 10, "dur": 5,
         "args": {**_RPC, "External id": 77}},
        {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 2, "ts": 100, "dur": 5,
         "args": {**_RPC, "External id": 77}},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "pid": 0, "tid": 7,
         "ts": 200, "dur": 30, "args": {"External id": 77}},
    ])
    parsed = parse_into(path, tmp_path / "out")
    ev = {(e["lane"], e["ts_ns"]): e["coll_id"] for e in parsed.events.to_pylist()}
    assert ev[("gpu0/stream7", 200_000)] == ev[("cpu/thread1", 10_000)] != ev[("cpu/thread2", 100_000)]
