"""Ingest streams rows in fixed chunks (parser spools, the sink's spills, the NCCL algo/proto fill):
the run's tables are the same whatever the chunk sizes, so every chunk boundary path is checked
against the defaults, on generated NCCL logs longer than a chunk and on the real traces."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from kineto_helpers import REAL as REAL_KINETO
from nccl_eras import Job, job_log

from tracekit import nccl_fabric, store
from tracekit.ingest import ingest
from tracekit.ingest import merge as ingest_mod
from tracekit.parsers import _lines, _stream, kineto, nccl_log
from tracekit.store import SMALL_TABLES, Run

REAL_NCCL = Path(__file__).resolve().parents[2] / ".." / "shared" / "real_traces" / "nccl_logs"


def _tables(run_dir: Path) -> dict[str, pa.Table]:
    run = Run(run_dir)
    out = {name: run.table(name) for name in SMALL_TABLES if run.has(name)}
    out["events"] = run.events()  # per rank in file order, which chunking must not change
    return out


def _ingest_both(paths: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[dict, dict]:
    ingest(paths, tmp_path / "default", jobs=1)
    with monkeypatch.context() as m:
        m.setattr(nccl_log, "BATCH_ROWS", 7)
        m.setattr(store, "SPILL_ROWS", 5)
        m.setattr(nccl_fabric, "FILL_CHUNK_ROWS", 3)
        m.setattr(ingest_mod, "MERGE_ROWS", 5)
        m.setattr(ingest_mod, "SPLIT_ROWS", 12)
        m.setattr(_stream, "CHUNK", 4096)
        m.setattr(_lines, "BATCH_BYTES", 4096)
        m.setattr(kineto, "SPOOL_MEMORY", 1 << 12)
        ingest(paths, tmp_path / "small", jobs=1)
    return _tables(tmp_path / "default"), _tables(tmp_path / "small")


def _assert_same(default: dict, small: dict) -> None:
    assert default.keys() == small.keys()
    for name, table in default.items():
        other = small[name]
        assert table.schema == other.schema, name
        assert table.num_rows == other.num_rows, name
        assert table.to_pylist() == other.to_pylist(), name


@pytest.mark.parametrize("era", ["2.17", "2.22", "2.29"])
def test_nccl_log_longer_than_a_chunk_gives_the_same_tables(era, tmp_path, monkeypatch):
    # 2.22 prints NCCL's algorithm on rank 0 only (the other ranks' rows are filled run-wide);
    # 4,096 + a few rows per rank so that the parser spools before its tuning window
    job = Job(era, hosts=2, gpus=2, steps=nccl_log.TUNING_WINDOW + 300)
    log = tmp_path / "node.log"
    log.write_text("\n".join(job_log(job)) + "\n")
    default, small = _ingest_both([log], tmp_path, monkeypatch)
    assert default["collectives"].num_rows > 4 * nccl_log.TUNING_WINDOW
    coll = default["collectives"]  # the node log interleaves ranks; the run's table is in rank, time order
    assert coll.sort_by([("rank", "ascending"), ("ts_ns", "ascending"), ("coll_id", "ascending")]).equals(coll)
    if era == "2.22":
        algo = default["collectives"].column("algo")
        assert algo.null_count < algo.length() // 4  # the fill ran (rank 0 alone printed it)
    _assert_same(default, small)


@pytest.mark.parametrize("name", ["gfbench_nccl2.20.5_straggler_2gpu", "slurmv4_nccl2.27.5_2node_16rank_roce",
                                  "slurmv4_nccl2.29.3_2node_16rank_roce"])
def test_real_nccl_logs_give_the_same_tables_in_small_chunks(name, tmp_path, monkeypatch):
    folder = REAL_NCCL / name
    if not folder.is_dir():
        pytest.skip(f"real traces not present at {folder}")
    default, small = _ingest_both(sorted(p for p in folder.iterdir() if p.name != "PROVENANCE.md"), tmp_path,
                                  monkeypatch)
    assert sum(t.num_rows for t in default.values()) > 40
    _assert_same(default, small)


@pytest.mark.parametrize("name", ["hta_nccl_parser_config", "tracelens_b200_eager_rank0of8"])
def test_real_kineto_traces_give_the_same_tables_in_small_chunks(name, tmp_path, monkeypatch):
    folder = REAL_KINETO / name
    if not folder.is_dir():
        pytest.skip(f"real traces not present at {folder}")
    default, small = _ingest_both(sorted(folder.iterdir()), tmp_path, monkeypatch)
    assert default["events"].num_rows > 1000
    _assert_same(default, small)
