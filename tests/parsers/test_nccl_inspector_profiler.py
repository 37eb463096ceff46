"""NCCL Inspector JSONL and the NCCL profiler example plugin's trace (fixtures in nccl_data/, made
from NCCL's own printf/JSON code; their first record says so)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tracekit import schema
from tracekit.errors import InputError
from tracekit.parsers import nccl_inspector, nccl_profiler
from tracekit.parsers.detect import detect_format
from tracekit.store import SourceSink

DATA = Path(__file__).parent / "nccl_data"
WORLD = "0x7a11ce5eed5eed01"
INSPECTOR = sorted(DATA.glob("inspector_*.log"))
PROFILER = sorted(DATA.glob("nccl_profile_*.json"))


def parse(module: Any, path: Path, tmp: Path) -> tuple[Any, dict[str, list[dict]]]:
    sink = SourceSink(tmp, path.stem)
    res = module.parse(path, sink)
    sink.close()
    tables = {}
    for name in ("collectives", "groups", "ranks", "events"):
        if name == "events":
            files = list((tmp / "events").glob(f"rank=*/{path.stem}.parquet"))
            tables[name] = [r for f in files for r in pq.read_table(f).to_pylist()]
            continue
        p = tmp / "sources" / path.stem / f"{name}.parquet"
        t = schema.conform(name, pq.read_table(p)) if p.is_file() else schema.empty(name)
        assert not schema.validate(name, t)
        tables[name] = t.to_pylist()
    assert res.stats.balanced
    return res, tables


def test_inspector_detected_and_read(tmp_path: Path) -> None:
    assert [detect_format(p) for p in INSPECTOR] == ["nccl_inspector"] * 2
    res, t = parse(nccl_inspector, INSPECTOR[1], tmp_path)
    coll = t["collectives"]
    assert [(r["rank"], r["group"], r["op"], r["seq"], r["coll_sn"]) for r in coll] == [
        (1, WORLD, "all_reduce", 0, 0), (1, WORLD, "all_reduce", 1, 1), (1, WORLD, "all_reduce", 2, 2),
        (1, WORLD, "all_gather", 3, 0), (1, WORLD, "recv", 0, 0)]
    ar = coll[2]
    assert (ar["dur_ns"], ar["state"], ar["in_bytes"], ar["timing_source"]) == (17_800_000, "completed", 67108864,
                                                                                  "kernel_gpu")
    assert ar["ts_ns"] == (1_784_074_548_000_000 + 200_000 + 40 + 12) * 1000  # the first kernel start
    assert coll[3]["out_bytes"] == 2 * 1048576 and coll[4]["peer"] == 0
    assert [e["coll_id"] for e in t["events"]] == [ar["coll_id"]]
    assert res.stats.skipped == {"not an Inspector record": 1, "malformed JSON line": 1}
    assert (t["ranks"][0]["host"], t["ranks"][0]["pid"]) == ("node-b", 4200)
    assert t["groups"][0]["rank_map"] == [None, 1] and t["groups"][0]["desc"] == "default_pg"


def test_inspector_run_joins_both_ranks(tmp_path: Path) -> None:
    from tracekit.ingest import ingest
    from tracekit.store import Run

    ingest(INSPECTOR, tmp_path / "run")
    run = Run(tmp_path / "run")
    (g,) = run.table("groups").to_pylist()
    assert (g["group"], g["ranks"], g["ranks_complete"], g["rank_map"]) == (WORLD, [0, 1], True, [0, 1])
    coll = run.table("collectives").to_pylist()
    slow = [r for r in coll if r["op"] == "all_reduce" and r["seq"] == 2]
    assert {r["rank"]: r["dur_ns"] for r in slow} == {0: 17_000_000, 1: 17_800_000}


def test_profiler_trace_lenient_and_salvaged(tmp_path: Path) -> None:
    assert [detect_format(p) for p in PROFILER] == ["nccl_profiler"] * 2
    res, t = parse(nccl_profiler, PROFILER[0], tmp_path)
    coll = t["collectives"]
    assert [(r["op"], r["seq"], r["algo"], r["proto"], r["dtype"]) for r in coll] == [
        ("all_reduce", s, "RING", "SIMPLE", "Float") for s in range(3)] + [("send", 0, None, None, "BFloat16")]
    assert [r["dur_ns"] for r in coll[:3]] == [15_002_000] * 3  # the longest channel's GPU time
    assert (coll[0]["group"], coll[0]["in_bytes"], coll[3]["peer_local"], coll[3]["in_bytes"]) == (
        WORLD, 64 << 20, 1, 512 << 10)
    assert res.stats.skipped["malformed event"] == 1 and res.stats.skipped["readme event"] == 1
    res1, t1 = parse(nccl_profiler, PROFILER[1], tmp_path)
    assert [(r["seq"], r["state"]) for r in t1["collectives"]] == [(0, "completed"), (1, "completed"),
                                                                     (2, "started")]
    assert any("cut short" in w for w in res1.stats.warnings)
    assert t1["collectives"][2]["dur_ns"] == 15_802_000


def test_not_these_formats(tmp_path: Path) -> None:
    p = tmp_path / "x.log"
    p.write_text('{"hello": 1}\n')
    with pytest.raises(InputError, match="no NCCL Inspector records"):
        parse(nccl_inspector, p, tmp_path)
    p.write_text("[\n{}]\n")
    with pytest.raises(InputError, match="no COLL or P2P events"):
        parse(nccl_profiler, p, tmp_path)
