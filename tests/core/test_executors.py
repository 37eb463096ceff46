"""Executors without Ray: spec parsing, and the partitioned analysis (run inline) against the whole-run one."""

import os
import shutil
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from tracekit.analysis import analyze, partitioned
from tracekit.cli import main
from tracekit.executors import Executor, ExecutorError, parse_executor, parse_size, run_tasks
from tracekit.ingest import ingest
from tracekit.results import to_builtins
from tracekit.store import Run, RunError, event_frame, read_events
from tracekit.synth import make_run_tables, write_kineto, write_run

REPO = Path(__file__).resolve().parents[2]


def test_parse_executor():
    assert parse_executor(None) == parse_executor("local") == Executor()
    assert parse_executor("ray") == Executor("ray", None, None)
    assert parse_executor("ray://head:10001", task_memory="4GiB") == Executor("ray", "ray://head:10001", 4 << 30)
    assert parse_executor(Executor("ray"), task_memory=1000) == Executor("ray", None, 1000)
    for bad in ("spark", "ray://", "ray:head"):
        with pytest.raises(ExecutorError, match="unknown executor"):
            parse_executor(bad)


@pytest.mark.parametrize(("text", "size"), [("512MiB", 512 << 20), ("2G", 2_000_000_000), ("1.5gib", 3 << 29),
                                            ("4096", 4096), (" 3 KiB ", 3072)])
def test_parse_size(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("bad", ["lots", "-1GiB", "0", "4PB"])
def test_parse_size_rejects(bad):
    with pytest.raises(ExecutorError):
        parse_size(bad)


def test_rank_chunks():
    assert partitioned.rank_chunks([5, 1, 3, 2, 4], max_tasks=2) == [[1, 2, 3], [4, 5]]
    assert partitioned.rank_chunks(range(4), max_tasks=10) == [[0], [1], [2], [3]]
    assert partitioned.rank_chunks([]) == []
    sizes = {0: 5, 1: 5, 2: 20, 3: 1, 4: 9}
    assert partitioned.rank_chunks([4, 3, 2, 1, 0], sizes=sizes, max_bytes=10) == [[0, 1], [2], [3, 4]]
    assert partitioned.rank_chunks(range(5), sizes=sizes, max_bytes=1 << 20) == [[0, 1, 2, 3, 4]]
    assert partitioned.rank_chunks(range(3), sizes={}, max_bytes=0) == [[0, 1, 2]]  # no files: no bytes


def test_event_frame_reads_what_read_events_reads(runs, tmp_path):
    """One multi-file scan, some columns or all; a file the scan cannot read goes through
    `read_events`, whose error names it; a file linked out of the run is refused."""
    files = [str(f) for f in Run(runs["synth"]).event_files()]
    want = pl.from_arrow(read_events(runs["synth"], files))
    got = event_frame(runs["synth"], files)
    assert got.with_columns(pl.col(pl.Categorical).cast(pl.String)).equals(
        want.with_columns(pl.col(pl.Categorical).cast(pl.String)))
    cols = list(partitioned.WINDOW_COLUMNS)
    assert event_frame(runs["synth"], files, cols).columns == cols
    assert event_frame(runs["synth"], [], cols).columns == cols
    run = tmp_path / "run"
    shutil.copytree(runs["synth"], run)
    bad = next((run / "events").glob("rank=1/*.parquet"))
    bad.write_bytes(bad.read_bytes()[:100])
    with pytest.raises(RunError, match=rf"{bad.name}: unreadable table"):
        event_frame(run, [str(f) for f in Run(run).event_files()])
    bad.unlink()
    (tmp_path / "out.parquet").write_bytes(Path(files[1]).read_bytes())
    bad.symlink_to(tmp_path / "out.parquet")
    with pytest.raises(RunError, match="leads out of the run directory"):
        event_frame(run, [bad])


def test_local_run_tasks_in_order():
    seen = []
    assert run_tasks(Executor(), pow, [(2, 3), (3, 2)], done=lambda i, r: seen.append((i, r))) == [8, 9]
    assert seen == [(0, 8), (1, 9)]


def test_cli_unknown_executor_is_a_clean_error(tmp_path):
    result = CliRunner().invoke(main, ["ingest", str(tmp_path), "-o", str(tmp_path / "run"), "--executor", "spark"])
    assert result.exit_code == 1
    assert "unknown executor 'spark'" in result.output and "Traceback" not in result.output
    result = CliRunner().invoke(main, ["analyze", str(tmp_path), "--executor", "ray", "--task-memory", "lots"])
    assert result.exit_code == 1 and "cannot read task memory 'lots'" in result.output


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("partitioned")
    tables, _ = make_run_tables(hosts=2, gpus_per_host=4, pp=2, ep=2, steps=2, straggler_rank=3,
                                clock_skew_ns=2_000_000, seed=7)
    write_kineto(tables, base / "traces")
    ingest([base / "traces"], base / "synth")
    ingest([REPO / "sample_traces" / "gloo_moe_8rank"], base / "gloo")  # CPU-only: compute from CPU ops
    # no ProfilerStep annotations and no step on events or collectives: windows from the DP cadence,
    # whose extents include the collectives, and steps assigned to collectives from those windows
    ev = tables["events"]
    keep = pc.invert(pc.fill_null(pc.starts_with(pc.cast(ev.column("name"), pa.string()), "ProfilerStep"), False))
    ev = ev.filter(keep)
    write_run({**tables, "events": ev}, base / "evstep")  # no annotations: windows from events.step
    bare = {**tables, "events": ev.set_column(ev.schema.get_field_index("step"), "step",
                                              pa.nulls(ev.num_rows, ev.schema.field("step").type))}
    coll = tables["collectives"]
    bare["collectives"] = coll.set_column(coll.schema.get_field_index("step"), "step",
                                          pa.nulls(coll.num_rows, coll.schema.field("step").type))
    write_run(bare, base / "cadence")
    return {"synth": base / "synth", "gloo": base / "gloo", "cadence": base / "cadence", "evstep": base / "evstep"}


@pytest.mark.parametrize("name", ["synth", "gloo", "cadence", "evstep"])
@pytest.mark.parametrize(("max_tasks", "local_bytes"), [(256, partitioned.LOCAL_TASK_BYTES), (3, 1)])
def test_partitioned_analysis_is_bit_identical(runs, name, max_tasks, local_bytes, monkeypatch):
    """The map over rank partitions (here run inline) gives the whole-run tables exactly: Ray's
    chunks (`max_tasks`) and the local executor's (`local_bytes` of files per task; 1 = one rank)."""
    monkeypatch.setattr(partitioned, "MAX_TASKS", max_tasks)
    monkeypatch.setattr(partitioned, "LOCAL_TASK_BYTES", local_bytes)
    whole = analyze(runs[name], write=False, partitioned=False)
    t, extra = partitioned.prepared(Run(runs[name]), Executor(), dims=None, write=False, compute="auto")
    from tracekit.analysis import breakdown
    from tracekit.analysis.core import _prepared

    _, ref = _prepared(runs[name], None, False)
    wide, long = breakdown.per_rank_step(ref["events"], ref["collectives"], ref["windows"])
    assert extra["windows"].equals(ref["windows"])
    assert extra["collectives"].equals(ref["collectives"])
    assert extra["wide"].equals(wide) and extra["long"].equals(long)
    assert t["collectives"].equals(whole.collectives) and t["ranks"].equals(whole.ranks)
    assert wide.height > 8 and long.height > 8
    # the whole analysis through the partitioned path (tasks run inline instead of on Ray)
    monkeypatch.setattr(partitioned, "run_tasks", lambda exe, fn, calls, done=None: [fn(*c) for c in calls])
    mapped = analyze(runs[name], write=False, executor="ray")
    local = analyze(runs[name], write=False)
    for key, tab in whole.tables().items():
        assert tab.equals(mapped.tables()[key]), key
        assert tab.equals(local.tables()[key]), key
    assert whole.critical_path.num_rows > 0
    assert to_builtins(whole.findings) == to_builtins(mapped.findings)
    assert to_builtins(whole.findings) == to_builtins(local.findings)
    if name == "evstep":
        assert set(ref["windows"].get_column("source")) == {"events.step"}
    if name == "cadence":
        assert "cadence" in set(ref["windows"].get_column("source"))
        assert ref["collectives"].get_column("step").null_count() < ref["collectives"].height


def test_cadence_windows_are_deterministic(runs):
    """Two DP groups tie as the cadence signature (one per PP stage); the choice must not depend
    on polars' group_by order, or the same run gives different windows from one call to the next."""
    from tracekit.analysis import steps
    from tracekit.analysis.core import _prepared

    _, ref = _prepared(runs["cadence"], None, False)
    first = steps.step_windows(ref["events"], ref["collectives"])
    assert "cadence" in set(first.get_column("source"))
    for _ in range(12):
        assert steps.step_windows(ref["events"], ref["collectives"]).equals(first)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 40), st.integers(0, 15)), max_size=30))
def test_union_by_rank_is_rootcause_union_per_rank(rows):
    """All ranks at once, as `rootcause._union` does rank by rank (touching intervals kept apart)."""
    from tracekit.analysis import rootcause

    iv = pl.DataFrame({"rank": [r for r, _, _ in rows], "s": [s for _, s, _ in rows],
                       "e": [s + d for _, s, d in rows]}, schema={"rank": pl.Int32, "s": pl.Int64, "e": pl.Int64})
    got = partitioned._union_by_rank(iv)
    want = []
    for rank in sorted({r for r, _, _ in rows}):
        part = iv.filter(pl.col("rank") == rank)
        s, e = rootcause._union(part["s"].to_numpy(), part["e"].to_numpy())
        want += [(rank, int(a), int(b)) for a, b in zip(s, e, strict=True)]
    assert got.rows() == want
    assert got.schema == {"rank": pl.Int32, "s": pl.Int64, "e": pl.Int64}


def test_a_process_pool_gives_results_in_call_order_and_a_failed_task_its_stand_in():
    import operator

    pool = Executor("process", workers=2)
    seen: list[int] = []
    got = run_tasks(pool, operator.truediv, [(1, 2), (1, 0), (3, 1)], done=lambda i, r: seen.append(i),
                    failed=lambda i, exc: f"{i}: {type(exc).__name__}")
    assert got == [0.5, "1: ZeroDivisionError", 3.0] and sorted(seen) == [0, 1, 2]
    with pytest.raises(ExecutorError, match=r"task truediv\(1, 0\) failed: ZeroDivisionError"):
        run_tasks(pool, operator.truediv, [(1, 0)])


def test_the_parse_of_an_ingest_picks_its_executor():
    from tracekit.ingest.parse import PARALLEL_MIN_BYTES, parse_executor_for
    from tracekit.manifest import SourceRecord

    big = [(SourceRecord(path=str(i), size=PARALLEL_MIN_BYTES), "kineto") for i in range(3)]
    small = [(SourceRecord(path=str(i), size=1), "kineto") for i in range(3)]
    here, ray = Executor(), Executor("ray")
    workers = min(os.cpu_count() or 1, len(big))
    assert parse_executor_for(here, None, big) == (Executor("process", workers=workers) if workers > 1 else here)
    assert parse_executor_for(here, None, small) == here  # workers cost more than these files
    assert parse_executor_for(here, 2, small) == Executor("process", workers=2)
    assert parse_executor_for(here, 1, big) == here and parse_executor_for(here, 8, big[:1]) == here
    assert parse_executor_for(ray, 1, small) == ray
