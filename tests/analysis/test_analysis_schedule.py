"""Reading the pipeline schedule: synthetic runs made with each schedule, and the bundled samples."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from analysis_helpers import strip_derived

from tracekit.analysis import analyze, prepare
from tracekit.analysis.schedule import UNRECOGNISED, read_schedule
from tracekit.ingest import ingest
from tracekit.synth import make_run_tables, write_kineto

SAMPLES = Path(__file__).parents[2] / "sample_traces"

CASES = [  # schedule, stages, micro-batches, chunks
    ("gpipe", 2, 4, 1), ("1f1b", 2, 4, 1), ("1f1b", 4, 8, 1), ("interleaved-1f1b", 2, 4, 2),
    ("interleaved-1f1b", 4, 8, 2), ("zb-h1", 2, 4, 1), ("zb-h1", 4, 8, 1), ("dualpipe", 2, 4, 1),
    ("dualpipe", 4, 8, 1), ("dualpipev", 2, 4, 1), ("dualpipev", 4, 8, 1),
]


def _run(name: str, pp: int, m: int, v: int, **extra):
    tables, _ = make_run_tables(schedule=name, pp=pp, pp_chunks=v, micro_batches=m, hosts=pp, gpus_per_host=8 // pp,
                                ep=2, steps=2, straggler_rank=None, **extra)
    return tables


@pytest.mark.parametrize(("name", "pp", "m", "v"), CASES)
def test_each_schedule_is_recognised(name: str, pp: int, m: int, v: int) -> None:
    got = read_schedule(prepare(strip_derived(_run(name, pp, m, v)), write=False))
    assert got is not None
    assert (got.name, got.stages, got.microbatches, got.chunks) == (name, pp, m, v), got.seen
    assert got.stage_ranks[0] == tuple(range(8 // pp))


def test_recognised_without_launch_records() -> None:
    """Without the CPU launches, a receive counts at its end and a send at the end of the compute before it."""
    got = read_schedule(prepare(strip_derived(_run("1f1b", 4, 8, 1, launch_events=False)), write=False))
    assert got is not None and (got.name, got.microbatches) == ("1f1b", 8)


def test_an_order_no_schedule_leaves_is_unrecognised_with_what_was_seen() -> None:
    """Stage 1 of a 1F1B run with its second forward's receive moved after its last send: no
    known schedule leaves that order."""
    import pyarrow as pa

    tables = prepare(strip_derived(_run("1f1b", 2, 4, 1, launch_events=False)), write=False)
    coll = tables["collectives"].to_pylist()
    stage1 = sorted((c for c in coll if c["rank"] == 4 and c["dim"] == "PP" and c["step"] == 0),
                    key=lambda c: c["ts_ns"])
    recv = [c for c in stage1 if c["op"] == "recv"][1]
    last = [c for c in stage1 if c["op"] == "send"][-1]
    recv["ts_ns"] = last["ts_ns"] + last["dur_ns"] + 1
    tables["collectives"] = pa.Table.from_pylist(coll, schema=tables["collectives"].schema)
    assert read_schedule(prepare(strip_derived(_run("1f1b", 2, 4, 1, launch_events=False)), write=False),
                         step=0).name == "1f1b"
    got = read_schedule(tables, step=0)
    assert got is not None and got.name == UNRECOGNISED and got.microbatches is None
    assert got.seen.startswith("stage 0: ") and "; stage 1: recv< C send< C recv< send< C" in got.seen


def test_no_pipeline_no_schedule() -> None:
    tables, _ = make_run_tables(pp=1, hosts=1, gpus_per_host=4, ep=2, steps=1, straggler_rank=None)
    assert read_schedule(prepare(strip_derived(tables), write=False)) is None


def test_kineto_round_trip_keeps_the_schedule(tmp_path: Path) -> None:
    write_kineto(_run("zb-h1", 2, 4, 1), tmp_path / "traces")
    ingest([tmp_path / "traces"], tmp_path / "run")
    doc = json.loads(analyze(tmp_path / "run", write=False).dumps())
    assert doc["pp_schedule"] == {"name": "zb-h1", "stages": 2, "microbatches": 4, "chunks": 1}


@pytest.mark.parametrize(("sample", "expected"), [
    ("synth_moe_16rank", {"name": "gpipe", "stages": 2, "microbatches": 2, "chunks": 1}),
    ("gloo_moe_8rank", {"name": "gpipe", "stages": 2, "microbatches": 1, "chunks": 1}),
])
def test_bundled_samples(tmp_path: Path, sample: str, expected: dict) -> None:
    ingest([SAMPLES / sample], tmp_path / "run")
    result = analyze(tmp_path / "run", write=False)
    assert json.loads(result.dumps())["pp_schedule"] == expected
    if sample == "gloo_moe_8rank":  # one micro-batch: GPipe and 1F1B leave the same trace
        assert result.pp_schedule is not None and "1f1b" in result.pp_schedule.also


@pytest.mark.parametrize("name", ["1f1b", "interleaved-1f1b", "dualpipe"])
def test_pipeline_stages_follow_the_chain(name: str) -> None:
    """One rule for stages (`pp.pp_chains`): interleaved 1F1B's last-to-first hop closes no ring, and
    DualPipe's two ends, which start alike, are numbered from the lower rank."""
    tables = _run(name, 4, 8, 2 if name == "interleaved-1f1b" else 1)
    doc = json.loads(analyze(strip_derived(tables)).dumps())
    assert doc["pp_stages"] == {str(r): r // 2 for r in range(8)}


def test_pp_chains_by_hand() -> None:
    import polars as pl

    from tracekit.analysis.pp import pp_chains

    def chains(*transfers: tuple[int, int, int]) -> list[list[int]]:
        return pp_chains(pl.DataFrame(transfers, schema=["src", "dst", "t"], orient="row"))

    assert chains((2, 1, 10), (1, 0, 20), (0, 1, 30), (1, 2, 40)) == [[2, 1, 0]]  # rank 2 is stage 0
    assert chains((0, 1, 10), (1, 2, 20), (2, 0, 30), (0, 1, 40)) == [[0, 1, 2]]  # the wrap-around closes no ring
    assert chains((0, 1, 10), (2, 1, 10), (1, 2, 20), (1, 0, 20)) == [[0, 1, 2]]  # both ends start alike
    assert chains((5, 7, 10), (4, 6, 10)) == [[4, 6], [5, 7]]
