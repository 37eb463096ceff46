"""tracekit.ingest: expansion, detection, cache, per-source errors, merging, determinism."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tracekit import SCHEMA_VERSION, __version__, schema
from tracekit.errors import TracekitError
from tracekit.ingest import ingest
from tracekit.results import to_builtins
from tracekit.store import Run

REAL = Path(__file__).parents[2] / ".." / "shared" / "real_traces" / "kineto"
DLRM = REAL / "param_dlrm_kineto_8rank"


@pytest.fixture(scope="module")
def dlrm() -> list[Path]:
    if not DLRM.is_dir():
        pytest.skip(f"real traces not present at {DLRM}")
    return sorted(DLRM.resolve().glob("*.json"))


@pytest.fixture(scope="module")
def dlrm_run(dlrm: list[Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dlrm") / "run"
    report = ingest([DLRM], out)
    assert len(report.ingested) == 8 and not report.failed
    return out


def test_dlrm_eight_ranks_line_up(dlrm_run: Path) -> None:
    run = Run(dlrm_run)
    ranks = run.table("ranks").to_pylist()
    assert [r["rank"] for r in ranks] == list(range(8))
    coll = run.table("collectives").to_pylist()
    assert len(coll) == 64
    by_rank: dict[int, list[dict]] = {}
    for row in coll:
        by_rank.setdefault(row["rank"], []).append(row)
    ops = {r: [c["op"] for c in sorted(rows, key=lambda c: c["seq"])] for r, rows in by_rank.items()}
    assert len({tuple(v) for v in ops.values()}) == 1
    assert ops[0] == ["all_to_all"] * 4 + ["all_reduce", "all_to_all", "all_reduce", "all_reduce"]
    for seq in range(8):
        ends = [c["ts_ns"] + c["dur_ns"] for c in coll if c["seq"] == seq]
        assert len(ends) == 8 and max(ends) - min(ends) < 50_000
    assert run.scan("events").select("rank").collect().height == sum(
        s.stored for s in run.manifest.sources)


def test_manifest_contents(dlrm_run: Path, dlrm: list[Path]) -> None:
    m = json.loads((dlrm_run / "manifest.json").read_text())
    assert m["tracekit_version"] == __version__ and m["schema_version"] == SCHEMA_VERSION
    assert [s["path"] for s in m["sources"]] == [str(p) for p in dlrm]
    for s in m["sources"]:
        assert s["format"] == "kineto" and s["error"] is None and len(s["sha256"]) == 64
        assert s["read"] == s["stored"] + sum(s["skipped"].values())
        assert s["size"] == Path(s["path"]).stat().st_size
    assert m["tables"]["collectives"] == 64 and m["ranks"] == list(range(8))
    for name in ("ranks", "groups", "collectives"):
        table = pq.read_table(dlrm_run / f"{name}.parquet")
        assert schema.validate(name, table) == []


def test_cache_hit_and_option_change(dlrm: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "run"
    first = ingest(dlrm[:2], out)
    assert [s.cached for s in first.sources] == [False, False]
    before = (out / "collectives.parquet").read_bytes()
    again = ingest(dlrm[:2], out)
    assert [s.cached for s in again.sources] == [True, True]
    assert [s.stored for s in again.sources] == [s.stored for s in first.sources]
    assert (out / "collectives.parquet").read_bytes() == before
    changed = ingest(dlrm[:2], out, comm_patterns=[r"^ncclKernel_AllReduce"])
    assert [s.cached for s in changed.sources] == [False, False]
    assert changed.tables["collectives"] == 2 * 8
    fewer = ingest(dlrm[:1], out)
    assert [r["rank"] for r in Run(out).table("ranks").to_pylist()] == [0]
    assert len(list((out / "sources").iterdir())) == 1
    assert fewer.sources[0].cached is False


def test_unchanged_reingest_commits_nothing(dlrm: list[Path], tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Re-ingesting what the run holds (a warm `tracekit replay`) reports the committed run as is,
    without merging, checking or committing again; anything changed takes the full path."""
    import tracekit.ingest.merge as ingest_module

    out = tmp_path / "run"
    ingest(dlrm[:2], out)
    first = ingest(dlrm[:2], out)  # the manifest now says every source was a cache hit
    assert first.committed
    stamp = (out / "manifest.json").stat().st_mtime_ns
    full_merge = ingest_module.merge_tables

    def no_merge(*args, **kwargs):
        raise AssertionError("merged again")

    monkeypatch.setattr(ingest_module, "merge_tables", no_merge)
    again = ingest(dlrm[:2], out)
    assert (out / "manifest.json").stat().st_mtime_ns == stamp and not again.committed
    assert to_builtins(again) == to_builtins(first) and again.exit_code == 0
    (out / "groups.parquet").unlink()  # a table gone: merged and committed again
    with pytest.raises(AssertionError, match="merged again"):
        ingest(dlrm[:2], out)
    monkeypatch.setattr(ingest_module, "merge_tables", full_merge)
    assert ingest(dlrm[:2], out).committed and Run(out).has("groups")


def test_the_runs_check_reads_nothing_back(dlrm: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sources' jobs are checked on the ranks and groups the parse just wrote, kept in memory;
    the same check on parts read from disk (another process parsed them) gives the same validity."""
    from tracekit.validity import check_run_dir

    read: list[str] = []
    full_read = pq.read_table

    def spy(path, *args, **kwargs):
        read.append(str(path))
        return full_read(path, *args, **kwargs)

    monkeypatch.setattr(pq, "read_table", spy)
    report = ingest(dlrm[:2], tmp_path / "run", jobs=1)
    assert [p for p in read if "/sources/" in p] == []
    on_disk = check_run_dir(tmp_path / "run", report.ingested)
    assert len([p for p in read if "/sources/" in p]) == 4  # ranks and groups of two sources
    assert to_builtins(on_disk) == to_builtins(report.validity)


def test_one_event_writer_thread_for_every_file(dlrm: list[Path], tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: each Kineto file made (and joined) a thread pool of its own, ~4 ms a file."""
    import threading

    from tracekit.store import SourceSink

    writers: list[threading.Thread] = []
    add_events = SourceSink.add_events

    def spy(self, data):
        writers.append(threading.current_thread())
        return add_events(self, data)

    monkeypatch.setattr(SourceSink, "add_events", spy)
    ingest(dlrm[:3], tmp_path / "run", jobs=1)
    assert len(writers) >= 3 and all(t is writers[0] for t in writers)
    assert writers[0] is not threading.main_thread()


def test_errors_are_per_source(dlrm: list[Path], tmp_path: Path) -> None:
    inputs = tmp_path / "in"
    inputs.mkdir()
    shutil.copy(dlrm[0], inputs / "good.json")
    (inputs / "notes.txt").write_text("hello")
    (inputs / "broken.json").write_bytes(b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "ts": 1')
    (inputs / "norank.json").write_text(json.dumps({"traceEvents": []}))
    report = ingest([inputs, tmp_path / "missing.json"], tmp_path / "run")
    status = {Path(s.path).name: s.error for s in report.sources}
    assert status["good.json"] is None
    assert "notes.txt" not in status
    assert [Path(i.path).name for i in report.ignored] == ["notes.txt"]
    assert "no rank" in status["norank.json"] and "--rank" in status["norank.json"]
    assert "no such file" in status["missing.json"]
    broken = next(s for s in report.sources if s.path.endswith("broken.json"))
    assert broken.error and "broken.json" in broken.error
    m = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert sum(1 for s in m["sources"] if s["error"]) == 3
    assert [Path(i["path"]).name for i in m["ignored"]] == ["notes.txt"]
    named = ingest([inputs / "notes.txt"], tmp_path / "run2")
    assert "unknown format" in (named.sources[0].error or "")
    assert report.ranks == [0]


def test_globs_rank_option_and_out_dir_inside_input(tmp_path: Path) -> None:
    if not REAL.is_dir():
        pytest.skip("real traces absent")
    src = REAL / "hta_edge_cases"
    inputs = tmp_path / "traces"
    shutil.copytree(src, inputs)
    report = ingest([str(inputs / "rank_not_found*.gz"), str(inputs / "rank-34*")],
                    inputs / "run", rank=11, allow_mixed=True)  # two unrelated jobs
    assert sorted(report.ranks) == [11, 34]
    again = ingest([str(inputs / "rank_not_found*.gz"), inputs / "rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"],
                   inputs / "run", rank=11, allow_mixed=True)
    assert not any("run" in Path(s.path).parts[-2:-1] for s in again.sources)
    assert sum(s.cached for s in again.sources) == 2


def test_refuses_foreign_output_dir(tmp_path: Path, dlrm: list[Path]) -> None:
    (tmp_path / "keep.txt").write_text("precious")
    with pytest.raises(TracekitError, match="not a tracekit run"):
        ingest(dlrm[:1], tmp_path)
    with pytest.raises(TracekitError, match="invalid comm pattern"):
        ingest(dlrm[:1], tmp_path / "r", comm_patterns=["("])


def test_parallel_jobs_match_serial(dlrm: list[Path], tmp_path: Path) -> None:
    a = ingest(dlrm[:3], tmp_path / "a", jobs=1)
    b = ingest(dlrm[:3], tmp_path / "b", jobs=2)
    assert [s.stored for s in a.sources] == [s.stored for s in b.sources]
    for name in ("ranks", "groups", "collectives"):
        ta, tb = pq.read_table(tmp_path / "a" / f"{name}.parquet"), pq.read_table(tmp_path / "b" / f"{name}.parquet")
        if name == "ranks":
            assert ta.drop_columns(["source_file"]).equals(tb.drop_columns(["source_file"]))
        else:
            assert ta.equals(tb)


def test_byte_identical_outputs(dlrm: list[Path], tmp_path: Path) -> None:
    ingest(dlrm[:3], tmp_path / "a")
    ingest(list(reversed(dlrm[:3])), tmp_path / "b")
    for rel in ("ranks.parquet", "groups.parquet", "collectives.parquet", "manifest.json"):
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes(), rel
    ev_a = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a" / "events").rglob("*.parquet"))
    ev_b = sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b" / "events").rglob("*.parquet"))
    assert ev_a == ev_b
    for rel in ev_a:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes()


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(order=st.permutations(range(4)))
def test_file_order_does_not_matter(dlrm: list[Path], tmp_path_factory: pytest.TempPathFactory,
                                    order: list[int]) -> None:
    base = tmp_path_factory.mktemp("base")
    ref = ingest(dlrm[:4], base / "run")
    out = tmp_path_factory.mktemp("perm") / "run"
    ingest([dlrm[i] for i in order], out)
    for name in ("ranks", "groups", "collectives"):
        assert pq.read_table(out / f"{name}.parquet").equals(pq.read_table(base / "run" / f"{name}.parquet"))
    assert ref.ranks == [0, 1, 2, 3]


def test_reparse_removes_the_sources_stale_event_files(dlrm: list[Path], tmp_path: Path) -> None:
    """A source parsed again (its record gone, e.g. a crash after the events were written) loses
    every event file a previous parse left, at any rank, not only the ranks it writes now."""
    out = tmp_path / "run"
    ingest(dlrm[:2], out)
    key = json.loads((out / "manifest.json").read_text())["sources"][0]["key"]
    [part] = list((out / "events").glob(f"rank=*/{key}.parquet"))
    stale = out / "events" / "rank=99" / f"{key}.parquet"
    stale.parent.mkdir()
    shutil.copy(part, stale)
    (out / "sources" / key / "source.json").unlink()
    report = ingest(dlrm[:2], out)
    assert not report.failed and not stale.exists() and part.exists()
    assert 99 not in {r["rank"] for r in Run(out).events().select(["rank"]).to_pylist()}


def test_groups_listed_by_every_source_merge_to_one_row_each(tmp_path: Path) -> None:
    from tracekit.synth import make_run_tables, write_kineto

    tables, _ = make_run_tables(hosts=2, gpus_per_host=4, pp=2, ep=2, steps=1)
    write_kineto(tables, tmp_path / "k")
    report = ingest([tmp_path / "k"], tmp_path / "run")
    assert not report.failed and not report.warnings
    got = Run(tmp_path / "run").table("groups").to_pylist()
    want = {g["group"]: sorted(g["ranks"]) for g in tables["groups"].to_pylist()}
    assert {g["group"]: sorted(g["ranks"]) for g in got} == want
    assert all(g["ranks_complete"] and g["size"] == len(g["ranks"]) for g in got)


def test_group_rows_merge_in_source_order() -> None:
    """Repeated rows are dropped before merging; what differs still merges: the first complete
    rank list wins (a differing one warns), partial lists are unioned, desc/backend fill in."""
    import pyarrow as pa

    from tracekit.ingest.merge import _merge_groups

    a = {"group": "1", "desc": "", "backend": None, "ranks": [0, 1], "size": 2, "dims": ["DP"],
         "ranks_complete": False}
    rows = [a,
            {"group": "1", "desc": "x", "backend": "nccl", "ranks": [0, 2], "size": 3, "dims": [],
             "ranks_complete": True},
            a,
            {"group": "1", "desc": "y", "backend": "gloo", "ranks": [0, 3], "size": 2, "dims": None,
             "ranks_complete": True},
            {"group": "3", "desc": None, "backend": None, "ranks": [1, 2], "size": None, "dims": None,
             "ranks_complete": False},
            {"group": "3", "desc": "pp", "backend": None, "ranks": [0, 1], "size": 2, "dims": ["PP"],
             "ranks_complete": False},
            {"group": "3", "desc": None, "backend": None, "ranks": [1, 2], "size": None, "dims": None,
             "ranks_complete": False}]
    warnings: list[str] = []
    out = _merge_groups(schema.conform("groups", pa.Table.from_pylist(rows)), warnings)
    assert out.to_pylist() == [
        {"group": "1", "desc": "x", "backend": "nccl", "ranks": [0, 2], "size": 3, "dims": ["DP"],
         "ranks_complete": True},
        {"group": "3", "desc": "pp", "backend": None, "ranks": [0, 1, 2], "size": 2, "dims": ["PP"],
         "ranks_complete": False}]
    assert warnings == ["group '1': ranks differ between sources; kept the first"]
