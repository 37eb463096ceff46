"""Run directories under stress (issue 14 item 5, issue 12 item 4): one writer at a time,
crash-safe commits (kill -9 at every write/rename/delete of a re-ingest), a full file system,
read-only runs, symlinks planted in a received run, exit codes and empty runs."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from tracekit import schema
from tracekit.cli import main
from tracekit.errors import TracekitError
from tracekit.ingest import ingest
from tracekit.store import STAGING, Run, RunError, RunLock

REPO = Path(__file__).resolve().parents[2]
GLOO = REPO / "sample_traces" / "gloo_moe_8rank"
SYNTH = REPO / "sample_traces" / "synth_moe_16rank"
KINETO = sorted(GLOO.glob("rank*.pt.trace.json.gz"))
#: the old run: every Kineto trace of the gloo sample; the new one drops four and adds the dumps
OLD = [str(p) for p in KINETO]
NEW = [str(p) for p in KINETO[:4]] + [str(GLOO / "fr" / "json")]


def consistent(run_dir: Path) -> dict:
    """Check that a run is self-consistent; return its identity (source paths, table rows)."""
    run = Run(run_dir)
    m = run.manifest
    for name, n in m.tables.items():
        if name == "events":
            got = sum(pq.ParquetFile(f).metadata.num_rows for f in run.event_files())
        else:
            path = run_dir / f"{name}.parquet"
            if run._staged and (run_dir / STAGING / f"{name}.parquet").is_file():
                path = run_dir / STAGING / f"{name}.parquet"
            got = pq.ParquetFile(path).metadata.num_rows if path.is_file() else 0
        assert got == n, (name, got, n)
    for s in m.sources:
        if not s.error and s.key:
            assert (run_dir / "sources" / s.key).is_dir(), s.path
    return {"sources": sorted(s.path for s in m.sources if not s.error), "tables": m.tables}


@pytest.fixture(scope="module")
def generations(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict]:
    """The identity of the old and of the new run, each ingested cleanly."""
    base = tmp_path_factory.mktemp("gen")
    ingest(OLD, base / "old", jobs=1)
    ingest(NEW, base / "new", jobs=1)
    return consistent(base / "old"), consistent(base / "new")


# -- one writer ------------------------------------------------------------------------------


def test_second_writer_fails_with_a_clear_message(tmp_path: Path) -> None:
    run = tmp_path / "run"
    ingest(OLD[:1], run, jobs=1)
    with RunLock(run):
        with pytest.raises(RunError, match="another tracekit process is writing this run"):
            ingest(OLD[:2], run, jobs=1)
        res = CliRunner().invoke(main, ["ingest", *OLD[:2], "-o", str(run)])
        assert res.exit_code == 1 and "Traceback" not in res.output
        assert "another tracekit process is writing" in res.stderr
    ingest(OLD[:2], run, jobs=1)  # released
    assert len(consistent(run)["sources"]) == 2


def test_concurrent_cli_ingests_never_mix(tmp_path: Path) -> None:
    """Two `tracekit ingest` into one -o at once (the two bundled samples): each either wins
    or fails with the lock message; the run is whole either way."""
    run = tmp_path / "run"
    env = {**os.environ, "COLUMNS": "200"}
    cmd = [sys.executable, "-m", "tracekit", "ingest", "-q", "-o", str(run)]
    procs = [subprocess.Popen([*cmd, str(src)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
             for src in (GLOO, SYNTH)]
    outs = [p.communicate(timeout=600) for p in procs]
    codes = [p.returncode for p in procs]
    for code, (_, err) in zip(codes, outs, strict=True):
        assert b"Traceback" not in err
        assert code in (0, 1, 2), err
        if code == 1:
            assert b"another tracekit process is writing" in err, err
    assert 0 in codes or 2 in codes
    ident = consistent(run)
    assert ident["tables"]["events"] > 0


# -- kill -9 at every step of a re-ingest ---------------------------------------------------

_KILLER = """
import os, shutil, signal, sys
from pathlib import Path
target = int(sys.argv[1])
count = [0]
def hook(fn):
    def wrapped(*a, **k):
        count[0] += 1
        if count[0] == target:
            os.kill(os.getpid(), signal.SIGKILL)
        return fn(*a, **k)
    return wrapped
os.replace = hook(os.replace)
shutil.rmtree = hook(shutil.rmtree)
Path.unlink = hook(Path.unlink)
from tracekit.ingest import ingest
ingest(sys.argv[3:], sys.argv[2], jobs=1)
print("OPS", count[0])
"""


def _ingest_killed_at(k: int, run: Path, paths: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _KILLER, str(k), str(run), *paths], capture_output=True,
                          text=True, timeout=600)


def test_kill_at_every_step_leaves_the_old_run_or_the_new(tmp_path: Path, generations) -> None:
    old, new = generations
    template = tmp_path / "template"
    ingest(OLD, template, jobs=1)
    dry = _ingest_killed_at(0, tmp_path / "dry", NEW)
    total = int(dry.stdout.split("OPS")[1])
    shutil.rmtree(tmp_path / "dry")
    # every write, rename and delete of the first re-ingest of the template, sampled
    dry = tmp_path / "dry2"
    shutil.copytree(template, dry)
    total = int(_ingest_killed_at(0, dry, NEW).stdout.split("OPS")[1])
    points = sorted({1, 2, 3, total // 4, total // 2, (3 * total) // 4, total - 3, total - 2, total - 1, total})
    seen = set()
    for k in points:
        run = tmp_path / f"k{k}"
        shutil.copytree(template, run)
        res = _ingest_killed_at(k, run, NEW)
        assert res.returncode == -9, (k, res.stderr[-2000:])
        ident = consistent(run)
        assert ident in (old, new), k
        seen.add("old" if ident == old else "new")
        # the next ingest recovers and gives the new run
        ingest(NEW, run, jobs=1)
        assert consistent(run) == new
        shutil.rmtree(run)
    assert seen == {"old", "new"}  # the kills landed both before and after the commit


def test_interrupted_first_ingest_is_not_a_run_and_can_be_redone(tmp_path: Path, generations) -> None:
    run = tmp_path / "run"
    res = _ingest_killed_at(5, run, NEW)
    assert res.returncode == -9
    with pytest.raises(RunError, match="did not finish"):
        Run(run)
    out = CliRunner().invoke(main, ["analyze", str(run)])
    assert out.exit_code == 1 and "did not finish" in out.stderr and "ingest" in out.stderr
    ingest(NEW, run, jobs=1)  # not refused as "not a run directory"
    assert consistent(run) == generations[1]


# -- full and read-only file systems ---------------------------------------------------------


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> object:
    path.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.decode().strip()})")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _fill(fs: Path, leave: int) -> Path:
    st = os.statvfs(fs)
    free = st.f_bavail * st.f_frsize
    ballast = fs / "ballast"
    with open(ballast, "wb") as fh:
        fh.write(b"\0" * max(0, free - leave))
    return ballast


@pytest.mark.parametrize("leave", [0, 64 << 10, 400 << 10])
def test_full_disk_during_reingest_keeps_the_old_run(tmp_path: Path, generations, leave: int) -> None:
    old, new = generations
    with tmpfs(tmp_path / "fs", "6m") as fs:
        run = fs / "run"
        ingest(OLD, run, jobs=1)
        assert consistent(run) == old
        ballast = _fill(fs, leave)
        res = CliRunner().invoke(main, ["ingest", *NEW, "-o", str(run)])
        assert "Traceback" not in res.output
        if res.exit_code == 1:
            lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
            assert len(lines) == 1 and "No space left on device" in lines[0], res.stderr
            assert consistent(run) == old
        else:  # there was room after all
            assert consistent(run) == new
        ballast.unlink()
        ingest(NEW, run, jobs=1)
        assert consistent(run) == new


def test_read_only_run_is_still_analysable(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "fs", "64m") as fs:
        run = fs / "run"
        ingest(OLD, run, jobs=1)
        subprocess.run(["mount", "-o", "remount,ro", str(fs)], check=True)
        runner = CliRunner()
        for args in (["info", str(run)], ["analyze", str(run)], ["hang", str(run)]):
            res = runner.invoke(main, args)
            assert res.exit_code == 0, (args, res.output)
            assert "Traceback" not in res.output
        res = runner.invoke(main, ["analyze", str(run), "--json"])
        assert res.exit_code == 0 and json.loads(res.stdout)["findings"] is not None
        assert "not saved" in res.stderr and "Read-only file system" in res.stderr
        res = runner.invoke(main, ["ingest", *NEW, "-o", str(run)])
        assert res.exit_code == 1
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and "Read-only file system" in lines[0], res.stderr


def test_os_errors_are_one_line(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    res = CliRunner().invoke(main, ["ingest", OLD[0], "-o", str(tmp_path / "file" / "run")])
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert len([ln for ln in res.stderr.splitlines() if ln.strip()]) == 1


# -- symlinks planted in a received run ------------------------------------------------------


@pytest.fixture
def received(tmp_path: Path) -> tuple[Path, Path]:
    run = tmp_path / "run"
    ingest(OLD, run, jobs=1)
    outside = tmp_path / "outside"
    outside.mkdir()
    return run, outside


def test_results_symlink_out_of_the_run_is_not_written_through(received) -> None:
    run, outside = received
    (run / "results").mkdir(exist_ok=True)
    shutil.rmtree(run / "results")
    (run / "results").symlink_to(outside)
    res = CliRunner().invoke(main, ["analyze", str(run)])
    assert res.exit_code == 0, res.output
    assert "not saved" in res.stderr and "leads out of the run directory" in res.stderr
    assert list(outside.iterdir()) == []


def test_reingest_never_deletes_through_symlinks(received) -> None:
    run, outside = received
    victim = outside / "precious.parquet"
    victim.write_bytes(b"keep me")
    (outside / "deadbeef.parquet").write_bytes(b"keep me too")
    (run / "events" / "rank=99").symlink_to(outside)
    (run / "sources" / "deadbeef").symlink_to(outside)
    ingest(NEW, run, jobs=1)  # sources of the old run become stale and are removed
    assert victim.read_bytes() == b"keep me" and (outside / "deadbeef.parquet").exists()
    assert consistent(run)["sources"] == sorted([str(Path(p).resolve()) for p in NEW[:4]] + [
        str(p.resolve()) for p in (GLOO / "fr" / "json").iterdir()])


def test_table_symlinked_out_of_the_run_is_refused(received) -> None:
    run, outside = received
    target = outside / "groups.parquet"
    shutil.copy(run / "groups.parquet", target)
    (run / "groups.parquet").unlink()
    (run / "groups.parquet").symlink_to(target)
    with pytest.raises(RunError, match="leads out of the run directory"):
        Run(run).table("groups")
    res = CliRunner().invoke(main, ["info", str(run)])
    assert res.exit_code == 1 and "leads out of the run directory" in res.stderr and "Traceback" not in res.output
    before = target.read_bytes()
    Run(run).write_table("groups", schema.empty("groups"))  # replaces the link, not its target
    assert target.read_bytes() == before
    assert not (run / "groups.parquet").is_symlink()


def test_events_file_symlinked_out_is_refused(received) -> None:
    run, outside = received
    f = next((run / "events").glob("rank=0/*.parquet"))
    shutil.move(f, outside / f.name)
    f.symlink_to(outside / f.name)
    with pytest.raises(RunError, match="leads out of the run directory"):
        Run(run).events()


# -- exit codes and empty runs (issue 12.4) --------------------------------------------------


def test_exit_codes_all_none_some(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_bytes(b"\x00 not a trace")
    r = CliRunner()
    assert r.invoke(main, ["ingest", OLD[0], "-o", str(tmp_path / "a")]).exit_code == 0
    none = r.invoke(main, ["ingest", str(bad), "-o", str(tmp_path / "b")])
    assert none.exit_code == 1 and "no run written" in none.stderr
    assert not (tmp_path / "b" / "manifest.json").exists()
    some = r.invoke(main, ["ingest", OLD[0], str(bad), "-o", str(tmp_path / "c")])
    assert some.exit_code == 2 and "1 of 2 source(s) ingested" in some.stderr
    # a re-ingest where nothing works leaves the previous run as it was
    before = consistent(tmp_path / "a")
    again = r.invoke(main, ["ingest", str(bad), "-o", str(tmp_path / "a")])
    assert again.exit_code == 1 and "left as it was" in again.stderr
    assert consistent(tmp_path / "a") == before


@pytest.mark.parametrize("command", [["analyze"], ["report", "-o", "REPORT"], ["hang"]])
def test_analyses_of_an_empty_run_fail_clearly(tmp_path: Path, command: list[str]) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({"sources": [{"path": "x", "error": "x: bad"}], "tables": {}}))
    args = [c.replace("REPORT", str(tmp_path / "r.html")) for c in command]
    res = CliRunner().invoke(main, [args[0], str(run), *args[1:]])
    assert res.exit_code == 1, res.output
    assert "no source was ingested" in res.stderr and "Traceback" not in res.output
    assert not (tmp_path / "r.html").exists()


def test_run_missing_an_events_part_is_refused(tmp_path: Path) -> None:
    """A run whose events part was deleted under it must not analyse as if complete."""
    run = tmp_path / "run"
    ingest(OLD, run, jobs=1)
    Run(run)
    victim = sorted((run / "events").glob("rank=*/*.parquet"))[-1]
    victim.unlink()
    with pytest.raises(RunError, match=r"inconsistent run: the events of .* are missing"):
        Run(run)
    res = CliRunner().invoke(main, ["analyze", str(run)])
    assert res.exit_code == 1 and "inconsistent run" in res.output and "Traceback" not in res.output


# -- a received run whose entries are links out of it (issue 22 item 2) ------------------------


def _tree(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): (None if p.is_dir() else p.read_bytes()) for p in sorted(root.rglob("*"))}


def _link_out(run: Path, outside: Path, entry: str) -> None:
    """Move `entry` (file or directory; made empty when absent) outside the run and leave a link."""
    target, path = outside / "moved", run / entry
    if path.is_dir():
        shutil.copytree(path, target)
        shutil.rmtree(path)
    elif path.exists():
        shutil.copy(path, target)
        path.unlink()
    else:
        target.mkdir()
    path.symlink_to(target)


TOP_LEVEL = ["sources", "events", "results", ".staging", ".merge-buckets", "manifest.json", ".lock", ".tracekit-run",
             "groups.parquet", "ranks.parquet"]


@pytest.mark.parametrize("entry", TOP_LEVEL)
def test_merge_into_a_run_with_a_top_level_link_is_refused_and_writes_nothing_outside(received, entry: str) -> None:
    run, outside = received
    _link_out(run, outside, entry)
    before = _tree(outside)
    res = CliRunner().invoke(main, ["ingest", *NEW, "-o", str(run)])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip() and not ln.startswith("tracekit:")]
    assert len(lines) == 1 and str(run / entry) in lines[0] and "refused" in lines[0], res.stderr
    assert _tree(outside) == before


def _keys(run: Path) -> tuple[str, str]:
    """A source key the new ingest reuses (a cache hit) and the rank directory of its events."""
    event = next((run / "events" / "rank=0").glob("*.parquet"))
    return event.stem, "rank=0"


@pytest.mark.parametrize("kind", ["source", "source table", "source record", "rank", "event file",
                                  "new source", "new rank"])
def test_merge_treats_links_inside_sources_and_events_as_absent(received, kind: str) -> None:
    run, outside = received
    key, rank = _keys(run)
    entry = {"source": f"sources/{key}", "source table": f"sources/{key}/groups.parquet",
             "source record": f"sources/{key}/source.json", "rank": f"events/{rank}",
             "event file": f"events/{rank}/{key}.parquet", "new source": "sources/0123456789abcdef0123",
             "new rank": "events/rank=7"}[kind]
    if kind == "new rank":
        shutil.rmtree(run / entry)
    _link_out(run, outside, entry)
    before = _tree(outside)
    ingest(NEW, run, jobs=1)
    assert _tree(outside) == before
    assert not [p for p in run.rglob("*") if p.is_symlink()]
    Run(run).events()  # readable, every file inside the run


def test_make_dirs_never_creates_through_a_link(tmp_path: Path) -> None:
    from tracekit.store import make_dirs

    run, outside = tmp_path / "run", tmp_path / "outside"
    run.mkdir()
    outside.mkdir()
    (run / "sources").symlink_to(outside)
    with pytest.raises(RunError, match=r"sources: leads out of the run directory"):
        make_dirs(run, run / "sources" / "abc" / "def")
    assert list(outside.iterdir()) == []
    (run / "events").mkdir()
    (run / "events" / "rank=0").symlink_to(run / "events")
    with pytest.raises(RunError, match=r"rank=0: is a symbolic link in the run directory"):
        make_dirs(run, run / "events" / "rank=0")
    assert make_dirs(run, run / "events" / "rank=1").is_dir()


# -- results belong to the generation they were computed from (issue 22 item 3) ---------------

OLD_RESULTS = {"replay.json", "replay_timeline.parquet", "calibration.json", "analysis.json"}


@pytest.fixture(scope="module")
def synth_results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 16-rank run with every result of `replay` and `analyze` stored."""
    run = tmp_path_factory.mktemp("stale") / "synth"
    ingest([str(SYNTH)], run, jobs=1)
    runner = CliRunner()
    for args in (["replay", str(run), "--topology", "rail-optimized:gpus=8"], ["analyze", str(run)]):
        res = runner.invoke(main, args)
        assert res.exit_code == 0, res.output
    assert {p.name for p in (run / "results").iterdir()} >= OLD_RESULTS
    return run


def _export_and_report(run: Path, tmp_path: Path) -> tuple[dict, str]:
    runner = CliRunner()
    res = runner.invoke(main, ["export", str(run), "--chrome", str(tmp_path / "t.json"), "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    rep = runner.invoke(main, ["report", str(run), "-o", str(tmp_path / "r.html")])
    assert rep.exit_code == 0, rep.output
    return summary, rep.output


def test_reingesting_another_job_drops_the_old_jobs_results(synth_results: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(synth_results, run)
    ingest(OLD, run, jobs=1)  # the 8-rank gloo job into the 16-rank run
    assert not OLD_RESULTS & {p.name for p in (run / "results").iterdir()}
    summary, report = _export_and_report(run, tmp_path)
    assert summary["ranks"] == 8 and summary["replay"] == {} and summary["notes"] == []
    assert "Replay" not in report.split("tabs:")[1].splitlines()[0]


def test_results_of_another_generation_are_left_out_and_said_so(synth_results: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    ingest(OLD, run, jobs=1)
    shutil.copytree(synth_results / "results", run / "results", dirs_exist_ok=True)  # carried in by hand
    summary, report = _export_and_report(run, tmp_path)
    assert summary["ranks"] == 8 and summary["replay"] == {}
    assert any("replay_timeline.parquet was computed from an earlier ingest" in n for n in summary["notes"])
    assert "Replay" not in report.split("tabs:")[1].splitlines()[0]
    assert "note: results/replay.json was computed from an earlier ingest" in report


def test_reingesting_the_same_job_keeps_its_results(synth_results: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(synth_results, run)
    ingest([str(SYNTH)], run, jobs=1)
    assert {p.name for p in (run / "results").iterdir()} >= OLD_RESULTS
    summary, _ = _export_and_report(run, tmp_path)
    assert summary["replay"] and summary["notes"] == []


# -- analyze racing an ingest on one run (issue 22 item 4) ------------------------------------


def test_analyze_never_lands_its_tables_on_a_newer_generation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An ingest of another job commits while analyze works on the old one (injected between
    analyze's reads and its writes): analyze's tables and results are refused, the run is the new job."""
    import tracekit.analysis.partitioned as core  # the path `tracekit analyze` takes on a run directory

    run = tmp_path / "run"
    ingest([str(SYNTH)], run, jobs=1)
    real_match = core.match_collectives
    calls = []

    def match_then_reingest(*args, **kwargs):
        out = real_match(*args, **kwargs)
        if not calls:
            calls.append(1)
            ingest(OLD, run, jobs=1)  # the 8-rank job replaces the 16-rank one
        return out

    monkeypatch.setattr(core, "match_collectives", match_then_reingest)
    res = CliRunner().invoke(main, ["analyze", str(run)])
    monkeypatch.undo()
    assert calls and res.exit_code == 0, res.output
    assert "not saved" in res.stderr and "an ingest replaced the run's data" in res.stderr, res.stderr
    fresh = tmp_path / "fresh"
    ingest(OLD, fresh, jobs=1)
    for name in ("ranks", "groups", "collectives"):
        assert pq.read_table(run / f"{name}.parquet").equals(pq.read_table(fresh / f"{name}.parquet")), name
    assert not (run / "results" / "analysis.json").exists()
    info = CliRunner().invoke(main, ["info", str(run), "--json"])
    assert json.loads(info.stdout)["ranks"] in (8, list(range(8))), info.stdout[:300]
    again = CliRunner().invoke(main, ["analyze", str(run)])  # and a new analyze saves normally
    assert again.exit_code == 0 and "not saved" not in again.stderr, again.stderr


def test_concurrent_analyze_and_ingest_never_mix_generations(tmp_path: Path) -> None:
    """The real race, in two processes, looped (bounded) until analyze has read the old job while
    the ingest committed the new one; after each round the run's tables are one job's."""
    run = tmp_path / "run"
    tables = {}
    for name, paths in (("synth", [str(SYNTH)]), ("gloo", OLD)):
        ingest(paths, tmp_path / name, jobs=1)
        tables[name] = {t: pq.read_table(tmp_path / name / f"{t}.parquet").num_rows for t in ("ranks", "groups")}
    hit, rounds = 0, 12
    for i in range(rounds):
        shutil.rmtree(run, ignore_errors=True)
        ingest([str(SYNTH)], run, jobs=1)
        analyze = subprocess.Popen([sys.executable, "-m", "tracekit", "analyze", str(run)],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(0.1 * i)  # sweep the moment the ingest commits across analyze's work
        with contextlib.suppress(RunError):  # the lock was busy: analyze was writing
            ingest(OLD, run, jobs=1)
        _, err = analyze.communicate(timeout=600)
        assert analyze.returncode == 0 and "Traceback" not in err, err
        hit += "an ingest replaced the run's data" in err
        got = {t: pq.read_table(run / f"{t}.parquet").num_rows for t in ("ranks", "groups")}
        assert got in tables.values(), (i, got, err)
        assert consistent(run)
        if hit:
            break
    assert hit, f"the race was never hit in {rounds} rounds"


# -- a manifest edited by hand (issue 22 item 5) ----------------------------------------------

#: (where, bad value, the field the error must name)
EDITS = [
    (["sources"], {}, "sources"),
    (["sources"], 5, "sources"),
    (["sources", 0], [], "sources[0]"),
    (["sources", 0, "path"], 7, "sources[0].path"),
    (["sources", 0, "key"], 7, "sources[0].key"),
    (["sources", 0, "ranks"], "0", "sources[0].ranks"),
    (["sources", 0, "ranks"], ["x"], "sources[0].ranks[0]"),
    (["tables"], [1], "tables"),
    (["tables", "events"], "x", "tables[...]"),
    (["ranks"], {}, "ranks"),
    (["options"], [], "options"),
    (["primary_sources"], [1], "primary_sources"),
    (["primary_sources", "0"], "abc", "primary_sources[...]"),
    (["validity"], [], "validity"),
    (["validity", "jobs"], 3, "validity.jobs"),
    (["warnings"], "x", "warnings"),
    (["ignored"], {}, "ignored"),
    (["generation"], 5, "generation"),
]


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("manifest") / "run"
    ingest(OLD, run, jobs=1)
    return run


@pytest.mark.parametrize(("where", "value", "field"), EDITS, ids=[e[2] + "=" + type(e[1]).__name__ for e in EDITS])
def test_hand_edited_manifest_is_refused_naming_file_and_field(clean_run: Path, tmp_path: Path, where, value,
                                                              field: str) -> None:
    run = tmp_path / "run"
    shutil.copytree(clean_run, run)
    doc = json.loads((run / "manifest.json").read_text())
    here = doc
    for key in where[:-1]:
        here = here[key]
    here[where[-1]] = value
    (run / "manifest.json").write_text(json.dumps(doc))
    runner = CliRunner()
    for args in (["info", str(run)], ["analyze", str(run)], ["hang", str(run)],
                 ["export", str(run), "--chrome", str(tmp_path / "t.json")],
                 ["report", str(run), "-o", str(tmp_path / "r.html")]):
        res = runner.invoke(main, args)
        assert res.exit_code == 1 and "Traceback" not in res.output, (args, res.output)
        assert res.exception is None or isinstance(res.exception, SystemExit), (args, repr(res.exception))
        lines = [ln for ln in res.stderr.splitlines() if ln.strip() and not ln.startswith("tracekit:")]
        assert len(lines) == 1 and str(run / "manifest.json") in lines[0], (args, res.stderr)
        assert f"`{field}`" in lines[0], (args, lines[0])
    ingest(OLD, run, jobs=1)  # a new ingest repairs it
    assert runner.invoke(main, ["info", str(run)]).exit_code == 0


def test_manifest_that_is_not_an_object_is_refused(clean_run: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(clean_run, run)
    (run / "manifest.json").write_text("[]")
    res = CliRunner().invoke(main, ["info", str(run)])
    assert res.exit_code == 1 and "manifest.json: unreadable manifest (not a JSON object)" in res.stderr
    assert "not a tracekit run directory" not in res.stderr


@pytest.mark.parametrize("record", ['[1, 2]', '{"tables": 5}', '{"tables": ["../../outside/x"]}',
                                    '{"tables": ["ranks"], "remove": {"ranks": 1}}', '{"remove": ["a/b"]}'])
def test_hand_edited_commit_marker_is_refused_naming_it(clean_run: Path, tmp_path: Path, record: str) -> None:
    """RUN/.staging/COMMIT names the tables a commit moves in and removes: a received run's marker
    that is not that record is refused, in one line naming it, before anything is moved."""
    run = tmp_path / "run"
    shutil.copytree(clean_run, run)
    (run / STAGING).mkdir()
    (run / STAGING / "ranks.parquet").write_bytes(b"not parquet")
    (run / STAGING / "COMMIT").write_text(record)
    before = {p: p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}
    runner = CliRunner()
    for args in (["info", str(run)], ["analyze", str(run)], ["ingest", *OLD[:1], "-o", str(run)]):
        res = runner.invoke(main, args)
        assert res.exit_code == 1, (args, res.output)
        assert res.exception is None or isinstance(res.exception, SystemExit), (args, repr(res.exception))
        lines = [ln for ln in res.stderr.splitlines() if ln.startswith("Error")]
        assert len(lines) == 1 and f"{run / STAGING / 'COMMIT'}: not a commit record" in lines[0], (args, res.stderr)
    assert {p: p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()} == before
    shutil.rmtree(run / STAGING)  # what the error says to do
    assert runner.invoke(main, ["info", str(run)]).exit_code == 0


# -- the cache of runs ingested from raw traces (issue 22 item 7) -----------------------------


def _replay_raw(tmpdir: Path) -> subprocess.Popen:
    env = {**os.environ, "TMPDIR": str(tmpdir)}
    return subprocess.Popen([sys.executable, "-m", "tracekit", "replay", str(SYNTH), "--topology",
                             "rail-optimized:gpus=8"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)


def test_concurrent_replays_of_the_same_raw_traces_share_the_cache(tmp_path: Path) -> None:
    procs = [_replay_raw(tmp_path) for _ in range(3)]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0 and "Traceback" not in err, err[-2000:]
        assert "another tracekit process" not in err, err[-2000:]
    root = tmp_path / f"tracekit-replay-{os.getuid()}"
    assert root.is_dir() and (root.stat().st_mode & 0o777) == 0o700
    (run,) = list(root.iterdir())
    assert consistent(run)["tables"]["ranks"] == 16


@pytest.mark.parametrize("plant", ["open to others", "a link", "someone else's", "a file"])
def test_a_cache_root_planted_by_someone_else_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         plant: str) -> None:
    import tempfile

    from tracekit.ingest import cache_dir

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    root = tmp_path / f"tracekit-replay-{os.getuid()}"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    if plant == "open to others":
        root.mkdir()
        root.chmod(0o777)
    elif plant == "a link":
        root.symlink_to(elsewhere)
    elif plant == "someone else's":
        if os.getuid() != 0:
            pytest.skip("needs root to give a directory to another user")
        root.mkdir(mode=0o700)
        os.chown(root, 12345, 12345)
    else:
        root.write_text("x")
    with pytest.raises(TracekitError, match=r"tracekit-replay-\d+: the cache of ingested traces .*; refused"):
        cache_dir([str(SYNTH)])
    res = CliRunner().invoke(main, ["info", str(SYNTH)])
    assert res.exit_code == 1 and "refused" in res.stderr and "Traceback" not in res.output
    assert list(elsewhere.iterdir()) == []


def test_a_run_made_before_generations_keeps_its_results(clean_run: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(clean_run, run)
    doc = json.loads((run / "manifest.json").read_text())
    del doc["generation"]
    (run / "manifest.json").write_text(json.dumps(doc))
    shutil.rmtree(run / "results", ignore_errors=True)
    (run / "results").mkdir()
    (run / "results" / "analysis.json").write_text('{"schema": "tracekit.analysis/1"}')
    r = Run(run)
    assert r.generation.startswith("legacy-") and r.read_json("analysis") is not None
    assert r.write_json("hang", {"hung": False}) is not None
    assert {p.name for p in (run / "results").iterdir()} >= {"analysis.json", "hang.json", "GENERATION"}
    assert Run(run).read_json("analysis") is not None and Run(run).stale == []


@pytest.mark.parametrize("moving", ["manifest.json", "ranks.parquet"])
def test_a_staged_file_moved_into_place_while_a_run_opens_is_read_where_it_went(tmp_path: Path, monkeypatch,
                                                                              moving: str) -> None:
    """The race the looped test above hit once under load: a reader finds the committed manifest
    (and a table) in RUN/.staging/, the writer's `recover` moves them into place, then the reader
    reads: it must read them where they went, not fail with 'No such file or directory'."""
    from tracekit import store

    run = tmp_path / "run"
    ingest([str(SYNTH)], run, jobs=1)
    staging = run / store.STAGING
    staging.mkdir()
    for name in ("manifest.json", "ranks.parquet"):
        shutil.copyfile(run / name, staging / name)
    (staging / store.COMMIT).write_text(json.dumps({"tables": ["ranks"]}))
    real_read_text, real_read = Path.read_text, store._read

    def moved(path: Path) -> None:
        if path.parent == staging and path.name == moving and path.exists():
            path.unlink()  # what recover's os.replace does to the staged copy

    def read_text_after_move(self: Path, *args, **kwargs) -> str:
        moved(self)
        return real_read_text(self, *args, **kwargs)

    def read_after_move(run_dir: Path, path: Path):
        moved(path)
        return real_read(run_dir, path)

    monkeypatch.setattr(Path, "read_text", read_text_after_move)
    monkeypatch.setattr(store, "_read", read_after_move)
    opened = store.Run(run)
    assert opened.table("ranks").num_rows == pq.read_table(run / "ranks.parquet").num_rows
