import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tracekit import schema, store
from tracekit.results import dumps
from tracekit.store import Run, RunError, SourceSink, SourceStats, remove_stale_sources, write_manifest


def _make(tmp_path):
    sink = SourceSink(tmp_path, "src1", row_group_size=2)
    sink.add_events({"rank": [1, 0, 1], "name": ["a", "b", "c"], "ts_ns": [3, 1, 2], "kind": ["compute"] * 3})
    sink.add_events({"rank": [0], "name": ["d"], "ts_ns": [9], "kind": ["comm"]})
    sink.add("collectives", {"coll_id": [7], "rank": [0], "op": ["all_reduce"]})
    parts = sink.close()
    write_manifest(tmp_path, {"sources": [{"key": "src1", "parts": parts}]})
    return Run(tmp_path), parts


def test_events_are_partitioned_by_rank(tmp_path):
    run, parts = _make(tmp_path)
    assert set(parts["events"]) == {"0", "1"}
    assert parts["rows"] == {"events": 4, "collectives": 1}
    assert run.events(ranks=[1]).column("name").to_pylist() == ["a", "c"]
    assert run.events().num_rows == 4
    assert run.scan("events").collect().height == 4


def test_tables_round_trip_with_schema(tmp_path):
    run, _ = _make(tmp_path)
    assert (tmp_path / "sources" / "src1" / "collectives.parquet").exists()
    run.write_table("collectives", schema.conform("collectives", {"coll_id": [7], "rank": [0], "op": ["all_reduce"]}))
    table = run.table("collectives")
    assert schema.validate("collectives", table) == []
    assert run.table("channels").num_rows == 0
    assert run.has("collectives") and not run.has("channels")


def test_results_json(tmp_path):
    run, _ = _make(tmp_path)
    run.write_json("analysis", {"x": {1, 2}})
    assert run.read_json("analysis") == {"x": [1, 2]}
    assert run.read_json("missing") is None


def test_not_a_run(tmp_path):
    with pytest.raises(RunError, match="not a tracekit run"):
        Run(tmp_path)
    (tmp_path / "manifest.json").write_text("{broken")
    with pytest.raises(RunError, match="unreadable"):
        Run(tmp_path)


def test_stale_sources_are_removed(tmp_path):
    _make(tmp_path)
    remove_stale_sources(tmp_path, keep=set())
    assert not list((tmp_path / "events").glob("**/*.parquet"))
    assert not (tmp_path / "sources" / "src1").exists()


def test_source_stats_balance():
    stats = SourceStats()
    stats.store(3)
    stats.skip("metadata", 2)
    assert stats.balanced and stats.read == 5
    assert json.loads(dumps(stats.counts()))["skipped"] == {"metadata": 2}


def test_sink_streams_a_large_small_table(tmp_path, monkeypatch):
    """A table past SPILL_ROWS is streamed to its part file, batch by batch, with every row kept."""
    import pyarrow.parquet as pq

    from tracekit import store

    monkeypatch.setattr(store, "SPILL_ROWS", 10)
    sink = store.SourceSink(tmp_path, "k")
    for b in range(5):
        sink.add("collectives", {"coll_id": list(range(b * 7, b * 7 + 7)), "rank": [b] * 7,
                                 "op": ["all_reduce"] * 7, "line": list(range(7))})
    sink.add("groups", {"group": ["g"]})
    parts = sink.close()
    table = pq.read_table(tmp_path / parts["collectives"])
    assert table.column("coll_id").to_pylist() == list(range(35))
    assert parts["rows"] == {"events": 0, "collectives": 35, "groups": 1}
    assert "line" in table.column_names


def _two_values(kind: pa.DataType) -> pa.Array:
    if pa.types.is_dictionary(kind):
        return pa.DictionaryArray.from_arrays(pa.array([0, 0], kind.index_type), pa.array(["x"], kind.value_type))
    if pa.types.is_list(kind):
        return pa.array([[], []], kind)
    if pa.types.is_string(kind):
        return pa.array(["x", "y"], kind)
    if pa.types.is_boolean(kind):
        return pa.array([False, True])
    return pa.array([0, 1]).cast(kind)


@pytest.mark.parametrize("name", sorted(schema.SCHEMAS))
def test_every_column_of_every_table_is_compressed(tmp_path, name):
    """Per-column compression is keyed by Parquet leaf paths (`flags.list.element`): a leaf the
    options miss would be written uncompressed. Floats are lz4, the rest zstd; the table reads
    back equal."""
    arrow_schema = schema.SCHEMAS[name]
    table = pa.table({f.name: pa.nulls(2, f.type) if f.nullable else _two_values(f.type) for f in arrow_schema},
                     schema=arrow_schema)
    path = tmp_path / "t.parquet"
    store.write_parquet(table, path)
    meta = pq.ParquetFile(path).metadata
    group = meta.row_group(0)
    leaves = dict(pq_leaf for f in arrow_schema for pq_leaf in store._parquet_leaves(f.name, f.type))
    got = {group.column(i).path_in_schema: group.column(i).compression for i in range(group.num_columns)}
    assert set(got) == set(leaves)
    assert got == {p: "LZ4" if pa.types.is_floating(t) else "ZSTD" for p, t in leaves.items()}
    assert pq.read_table(path).equals(table)
