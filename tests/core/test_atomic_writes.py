"""Outputs are written through unpredictable temporary names (issue 22 item 1): a symlink planted at
a guessable name is never followed, the destination is replaced rather than written through, and
an error (a full disk included) leaves the old output and no temporary file."""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from tracekit.atomic import atomic_open, atomic_write_text, atomic_write_with
from tracekit.cli import main
from tracekit.ingest import ingest

REPO = Path(__file__).resolve().parents[2]
GLOO = REPO / "sample_traces" / "gloo_moe_8rank"


@pytest.fixture(scope="module")
def gloo_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("atomic") / "run"
    ingest([str(p) for p in sorted(GLOO.glob("rank*.pt.trace.json.gz"))], run, jobs=1)
    return run


def _plant(out: Path, victim: Path) -> list[Path]:
    """Symlinks at every temporary name the old writers used, all pointing at `victim`."""
    links = [out.with_name(out.name + ".tmp"), out.with_suffix(out.suffix + ".tmp"),
             out.parent / f".{out.name}.tmp-{os.getpid()}"]
    for link in links:
        if not link.is_symlink():
            link.symlink_to(victim)
    return links


def _temporaries(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp") and not p.is_symlink())


@pytest.mark.parametrize("command", ["report", "export"])
def test_cli_outputs_never_follow_a_planted_temporary_link(gloo_run: Path, tmp_path: Path, command: str) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    out = tmp_path / ("r.html" if command == "report" else "t.json")
    links = _plant(out, victim)
    args = ["report", str(gloo_run), "-o", str(out)] if command == "report" else [
        "export", str(gloo_run), "--chrome", str(out)]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    assert victim.read_text() == "keep me"
    assert out.is_file() and not out.is_symlink() and out.stat().st_size > 1000
    assert all(link.is_symlink() for link in links)
    assert _temporaries(tmp_path) == []


def test_destination_symlink_is_replaced_not_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    out = tmp_path / "out.json"
    out.symlink_to(victim)
    atomic_write_text(out, "new")
    assert victim.read_text() == "keep me" and not out.is_symlink() and out.read_text() == "new"


def test_temporary_swapped_for_a_link_while_written_is_refused(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    out = tmp_path / "out.parquet"
    out.write_text("old")

    def hostile(tmp: str) -> None:
        os.unlink(tmp)
        os.symlink(victim, tmp)

    with pytest.raises(OSError, match="replaced while it was written"):
        atomic_write_with(out, hostile)
    assert out.read_text() == "old" and not out.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.parquet", "victim"]


@pytest.mark.parametrize("where", ["write", "fsync", "replace"])
def test_disk_full_at_every_step_keeps_the_old_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      where: str) -> None:
    out = tmp_path / "out.html"
    out.write_text("old")
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def fail(*_a: object, **_k: object) -> None:
        raise full

    if where != "write":
        monkeypatch.setattr(os, where, fail)
    with pytest.raises(OSError) as info, atomic_open(out, "w", encoding="utf-8") as fh:
        fh.write("partial")
        if where == "write":
            raise full
    monkeypatch.undo()
    assert info.value.errno == errno.ENOSPC
    assert out.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.html"]


def test_full_tmpfs_during_export_and_report_leaves_no_temporary(gloo_run: Path, tmp_path: Path) -> None:
    from tests.core.test_run_safety import _fill, tmpfs

    with tmpfs(tmp_path / "fs", "2m") as fs:
        outputs = ["ballast"]
        for command, name in (("export", "t.json"), ("report", "r.html")):
            out = fs / name
            out.write_text("old")
            ballast = _fill(fs, 0)
            args = ["export", str(gloo_run), "--chrome", str(out)] if command == "export" else [
                "report", str(gloo_run), "-o", str(out)]
            res = CliRunner().invoke(main, args)
            assert res.exit_code == 1 and "Traceback" not in res.output, res.output
            lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
            assert len(lines) == 1 and "No space left on device" in lines[0], res.stderr
            assert out.read_text() == "old"
            outputs.append(name)
            assert sorted(p.name for p in fs.iterdir()) == sorted(outputs)
            ballast.unlink()


_DIRECT_WRITE = re.compile(r"\.write_(text|bytes)\(|\bopen\([^)]*[\"'][wax]b?[\"']"
                           r"|\.write_(parquet|ipc|csv)\(\s*[\"'\w]|pq\.write_table\("
                           r"|sqlite3\.connect\((?!.*mode=ro)")


def test_every_writer_goes_through_the_atomic_writer() -> None:
    """No module of the package writes a file directly (a planted link would be followed, a full
    disk would leave half a file): every output goes through tracekit/atomic.py (issue 22)."""
    root = Path(__file__).resolve().parents[2]
    direct = []
    for path in sorted([*(root / "tracekit").rglob("*.py"), *(root / "parsers").rglob("*.py"),
                        *(root / "viz").rglob("*.py")]):
        if path.name == "atomic.py":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if _DIRECT_WRITE.search(line) and "atomic" not in line:
                direct.append(f"{path.relative_to(root)}:{n}: {line.strip()}")
    assert not direct, "\n".join(direct)




def test_synthetic_nsight_export_never_writes_through_a_planted_link(tmp_path: Path) -> None:
    """`tracekit synth --nsys` builds each SQLite export in an exclusive temporary (its journal
    named after it), so links planted at the export's name or its journal's are not followed."""
    from tracekit.synth import make_run_tables
    from tracekit.synth_nsys import write_nsys

    tables, _ = make_run_tables(hosts=1, gpus_per_host=2, pp=2, ep=1, steps=1, seed=5)
    out = tmp_path / "out"
    out.mkdir()
    victims = {name: tmp_path / f"victim_{name}" for name in ("node000.sqlite", "node000.sqlite-journal")}
    for name, victim in victims.items():
        victim.write_bytes(b"victim")
        (out / name).symlink_to(victim)
    (path,) = write_nsys(tables, out)
    assert all(v.read_bytes() == b"victim" for v in victims.values())
    assert not path.is_symlink() and path.read_bytes()[:16] == b"SQLite format 3\x00"
    assert sorted(p.name for p in out.iterdir()) == ["node000.sqlite", "node000.sqlite-journal"]


def _mark_as_earlier(run: Path) -> None:
    """Tag every derived file of `run` (same content, other bytes), so a file the next command
    rewrites with what it held already is still seen as replaced."""
    import json

    import pyarrow.parquet as pq

    for path in sorted((run / "results").glob("*.json")):
        path.write_text(json.dumps({**json.loads(path.read_text()), "_earlier": True}))
    for path in [*run.glob("*.parquet"), *(run / "results").glob("*.parquet")]:
        table = pq.read_table(path)
        pq.write_table(table.replace_schema_metadata({**(table.schema.metadata or {}), b"earlier": b"1"}), path)


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != ".lock"}


@pytest.mark.parametrize("command", [["analyze"], ["replay", "--topology", "rail-optimized"]])
def test_disk_full_at_every_write_point_leaves_the_run_as_it_was(gloo_run: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 command: list[str]) -> None:
    """ENOSPC injected at the k-th flush to disk (every file written goes through one), for every
    k until the command succeeds: no temporary file is left, the command's tables and results/
    files are replaced all or none (analyze's tables one at a time at first, so a full disk left
    new collectives beside old ranks; then results/*.json one after another, so new tables sat
    beside no analysis.json), and the failure is said (issue 22). The run already holds results
    of an earlier run of both commands, so "none" means the old ones, whole."""
    import shutil

    real = os.fsync
    calls = {"n": 0}
    base = tmp_path / "base"
    shutil.copytree(gloo_run, base)
    for earlier in (["analyze"], ["replay", "--topology", "fat-tree"]):
        assert CliRunner().invoke(main, [earlier[0], str(base), *earlier[1:]]).exit_code == 0
    _mark_as_earlier(base)
    for k in range(40):
        run = tmp_path / f"run{k}"
        shutil.copytree(base, run)
        before = _snapshot(run)
        calls["n"] = 0

        def fsync(fd: int, k: int = k) -> None:
            if stat.S_ISDIR(os.fstat(fd).st_mode):  # a directory's flush is best effort
                return real(fd)
            calls["n"] += 1
            if calls["n"] > k:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            real(fd)

        monkeypatch.setattr(os, "fsync", fsync)
        res = CliRunner().invoke(main, [command[0], str(run), *command[1:]])
        monkeypatch.setattr(os, "fsync", real)
        assert "Traceback" not in res.output, res.output
        assert not [p for p in run.rglob("*.tmp")], k
        if calls["n"] <= k:  # every write point passed
            assert k > 0
            return
        after = _snapshot(run)
        changed = sorted(n for n in set(before) | set(after) if before.get(n) != after.get(n))
        assert changed == [], (k, changed)
        assert res.exit_code == 1 or "not saved" in res.stderr, (k, res.output[-500:])
    raise AssertionError("the command never finished within 40 write points")


def test_a_full_disk_during_a_parse_stops_the_ingest_and_commits_nothing(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A source whose parse cannot write the run (ENOSPC) is not one failed source among others:
    the ingest stops with a RunError, commits no manifest, and leaves an earlier run as it was."""
    from tracekit.ingest import ingest
    from tracekit.ingest import parse as parsing
    from tracekit.store import RunError

    traces = Path(__file__).resolve().parents[2] / "sample_traces" / "synth_moe_16rank"
    out = tmp_path / "run"

    def full(path: Path, text: str) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(parsing, "atomic_write_text", full)
    with pytest.raises(RunError, match="nothing was committed"):
        ingest([traces], out, jobs=1)
    assert not (out / "manifest.json").exists()
