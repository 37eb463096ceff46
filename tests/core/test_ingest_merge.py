"""The run's collectives merge streams sorted slices (`ingest._merge_collectives`): it must give
what sorting the concatenated parts and filling them whole gave (the eager merge, written out
here as the reference), for any slice size, with sources whose ranks interleave."""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tracekit import nccl_fabric, schema
from tracekit.ingest import SourceReport
from tracekit.ingest import merge as ingest
from tracekit.ingest.merge import _Fill, _merge_collectives


def _part(rng: random.Random, ranks: list[int], n: int, *, nccl: bool) -> pa.Table:
    rows = []
    for i in range(n):
        algo = rng.choice([None, None, "RING", "TREE"])
        rows.append({
            "coll_id": rng.randrange(50), "rank": rng.choice(ranks), "group": rng.choice(["g0", "g1", None]),
            "seq": rng.choice([None, rng.randrange(6)]), "op": rng.choice(["all_reduce", "all_gather"]),
            "in_bytes": rng.choice([64, 128]), "nranks": 4, "peer": rng.choice([None, 1]),
            "ts_ns": rng.choice([None, rng.randrange(8)]), "dur_ns": i, "algo": algo,
            "proto": rng.choice([None, "LL", "SIMPLE"]) if algo else None,
            **({"peer_local": rng.choice([None, 0, 1, 2, 3])} if nccl else {}),
        })
    return schema.conform("collectives", pa.Table.from_pylist(rows))


def _run(tmp_path: Path, parts: list[tuple[list[int], pa.Table]]) -> tuple[Path, list[SourceReport]]:
    run = tmp_path / "run"
    reports = []
    for i, (ranks, table) in enumerate(parts):
        d = run / "sources" / f"s{i}"
        d.mkdir(parents=True)
        pq.write_table(table, d / "collectives.parquet", row_group_size=7)
        reports.append(SourceReport(path=f"/in/{i}", key=f"s{i}", ranks=ranks))
    return run, reports


def _eager(run: Path, order: list[SourceReport], primary: dict[int, list[str]], fill: _Fill | None) -> pa.Table:
    """The merge before streaming: concatenate, filter, sort, resolve peers, fill algo/proto."""
    parts = []
    for s in order:
        t = schema.conform("collectives", pq.read_table(run / "sources" / (s.key or "") / "collectives.parquet"))
        ranks = [r for r in s.ranks if (s.key or "") in primary.get(r, [])]
        keep = pa.compute.is_in(t.column("rank"), pa.array(ranks, pa.int32()))
        parts.append(t if pa.compute.all(keep).as_py() else t.filter(keep))
    table = pa.concat_tables(parts, promote_options="permissive").unify_dictionaries()
    table = table.sort_by([("rank", "ascending"), ("ts_ns", "ascending"), ("coll_id", "ascending")])
    if fill is not None:
        table, _ = nccl_fabric.resolve_peers(table, fill.maps, [("peer", "peer_local")])
        table, _ = nccl_fabric.fill_algo_proto(table, fill.donors)
    return schema.conform("collectives", table)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("merge_rows", [1, 3, 7, 1 << 16])
@pytest.mark.parametrize("split_rows", [0, 1 << 30])  # batches split into rank buckets first, or not
def test_streamed_merge_is_the_eager_merge(seed, merge_rows, split_rows, tmp_path, monkeypatch):
    rng = random.Random(seed)
    # sources 0 and 2 share rank 1 (two windows of it), source 1 has ranks 4-5 alone, source 3
    # is set aside for rank 6 (not primary), source 4 has rank 0 and 1 (interleaves with 0 and 2)
    layout = [([1, 2], True), ([4, 5], False), ([1], True), ([6], True), ([0, 1], False)]
    parts = [(ranks, _part(rng, ranks, rng.randrange(0, 30), nccl=nccl)) for ranks, nccl in layout]
    run, reports = _run(tmp_path, parts)
    primary = {0: ["s4"], 1: ["s0", "s2", "s4"], 2: ["s0"], 4: ["s1"], 5: ["s1"], 6: []}
    maps = {"g0": [10, 11, None, 13], "g1": [20, 21, 22, 23]}
    donors = pa.table({"rank": pa.array([2, 4], pa.int32()), "op": ["all_reduce", "all_gather"],
                       "in_bytes": [64, 128], "nranks": pa.array([4, 4], pa.int32()), "algo": ["NVLS", "PAT"],
                       "proto": ["SIMPLE", None]})
    order = sorted(reports, key=lambda s: (min(s.ranks), s.path))
    for fill in (None, _Fill(maps, donors), _Fill({}, None)):
        want = _eager(run, order, primary, fill)
        monkeypatch.setattr(ingest, "MERGE_ROWS", merge_rows)
        monkeypatch.setattr(ingest, "SPLIT_ROWS", split_rows)
        out = _merge_collectives(run, order, primary, fill, tmp_path / "merged.parquet")
        assert out is not None and out[1] == want.num_rows
        got = schema.conform("collectives", pq.ParquetFile(out[0]).read())
        assert got.schema == want.schema
        assert got.to_pylist() == want.to_pylist()
        if merge_rows == 1 << 16:
            assert pq.ParquetFile(out[0]).metadata.num_row_groups == 1
        assert not (run / ingest.MERGE_TMP).exists()


def test_a_proto_without_algo_stays_unless_something_is_filled(tmp_path):
    table = schema.conform("collectives", pa.table({
        "coll_id": [0, 1], "rank": pa.array([0, 0], pa.int32()), "group": ["g", "g"], "seq": [0, 1],
        "op": ["all_reduce", "all_reduce"], "in_bytes": [64, 128], "nranks": pa.array([2, 2], pa.int32()),
        "ts_ns": [0, 1], "algo": pa.array([None, None], pa.string()), "proto": ["LL", None]}))
    run, reports = _run(tmp_path, [([0], table)])
    out = _merge_collectives(run, reports, {0: ["s0"]}, _Fill({}, None), tmp_path / "m.parquet")
    assert out is not None
    assert pq.read_table(out[0]).column("proto").to_pylist() == ["LL", None]  # as fill_algo_proto leaves it
    donors = pa.table({"rank": pa.array([0], pa.int32()), "op": ["all_reduce"], "in_bytes": [128],
                       "nranks": pa.array([2], pa.int32()), "algo": ["RING"], "proto": ["SIMPLE"]})
    out = _merge_collectives(run, reports, {0: ["s0"]}, _Fill({}, donors), tmp_path / "m.parquet")
    assert out is not None
    got = pq.read_table(out[0])
    assert got.column("algo").to_pylist() == [None, "RING"] and got.column("proto").to_pylist() == [None, "SIMPLE"]


def test_no_part_no_table_and_empty_parts_give_an_empty_table(tmp_path):
    run, reports = _run(tmp_path, [([0], schema.empty("collectives"))])
    out = _merge_collectives(run, reports, {0: ["s0"]}, None, tmp_path / "m.parquet")
    assert out is not None and out[1] == 0 and pq.read_table(out[0]).num_rows == 0
    assert _merge_collectives(run, [SourceReport(path="x", key="none", ranks=[0])], {0: ["none"]}, None,
                              tmp_path / "m.parquet") is None


@pytest.mark.parametrize(("rows", "want"), [(6, [["a", "b", "c"], ["d"]]), (2, [["a", "b", "c", "d"]])])
def test_sources_with_interleaving_ranks_are_sorted_together(rows, want, monkeypatch):
    monkeypatch.setattr(ingest, "MERGE_ROWS", 10)
    parts = [ingest._Part(0, 1, 0, Path("a"), [0, 1], rows), ingest._Part(2, 2, 1, Path("b"), [2], rows),
             ingest._Part(1, 3, 2, Path("c"), [1, 3], rows), ingest._Part(5, 6, 3, Path("d"), [5, 6], rows)]
    batches = ingest._merge_batches(parts)
    # a, b, c overlap in ranks: one batch whatever its size; d joins it while the batch is small
    assert [sorted(p.path.name for p in b) for b in batches] == want


@pytest.mark.parametrize("split_rows", [0, 1 << 30])
def test_a_call_logged_twice_takes_the_first_choice_in_run_order(split_rows, tmp_path, monkeypatch):
    # the same call (group, seq, op, bytes) with two choices: the row first in (rank, time) order
    # gives its choice to the rank that logged none, whatever order the file holds them in
    monkeypatch.setattr(ingest, "SPLIT_ROWS", split_rows)
    monkeypatch.setattr(ingest, "MERGE_ROWS", 1)
    table = schema.conform("collectives", pa.table({
        "coll_id": [0, 1, 2], "rank": pa.array([1, 0, 2], pa.int32()), "group": ["g", "g", "g"],
        "seq": [4, 4, 4], "op": ["all_reduce"] * 3, "in_bytes": [64, 64, 64], "nranks": pa.array([3, 3, 3], pa.int32()),
        "ts_ns": [0, 5, 9], "algo": ["RING", "TREE", None], "proto": ["LL", "SIMPLE", None]}))
    run, reports = _run(tmp_path, [([0, 1, 2], table)])
    out = _merge_collectives(run, reports, {0: ["s0"], 1: ["s0"], 2: ["s0"]}, _Fill({}, None), tmp_path / "m.parquet")
    assert out is not None
    got = pq.read_table(out[0])
    assert got.column("rank").to_pylist() == [0, 1, 2]
    assert got.column("algo").to_pylist() == ["TREE", "RING", "TREE"]
    assert got.column("proto").to_pylist() == ["SIMPLE", "LL", "SIMPLE"]
