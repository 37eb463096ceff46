"""The Ray executor on a local Ray started here: ingest and analyze give the same tables as the
local executor. Skipped only when Ray is not installed (the `ray` extra)."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

ray = pytest.importorskip("ray")

from tracekit.analysis import analyze  # noqa: E402
from tracekit.cli import main  # noqa: E402
from tracekit.executors import Executor, ExecutorError, parse_size, run_tasks  # noqa: E402
from tracekit.ingest import ingest  # noqa: E402
from tracekit.store import SMALL_TABLES, Run  # noqa: E402
from tracekit.synth import make_run_tables, write_kineto  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    base = tmp_path_factory.mktemp("ray")
    tables, _ = make_run_tables(hosts=2, gpus_per_host=4, pp=2, ep=2, steps=2, straggler_rank=6,
                                clock_skew_ns=2_000_000, seed=11)
    write_kineto(tables, base / "synth")
    return {"synth": [base / "synth"],
            "gloo": [REPO / "sample_traces" / "gloo_moe_8rank"]}  # Kineto traces and Flight Recorder dumps


def _same_run(a: Path, b: Path) -> None:
    ra, rb = Run(a), Run(b)
    for name in SMALL_TABLES:
        assert ra.table(name).equals(rb.table(name)), name
    assert [p.relative_to(a) for p in ra.event_files()] == [p.relative_to(b) for p in rb.event_files()]
    assert ra.events().equals(rb.events())
    keep = ("path", "format", "key", "read", "stored", "skipped", "ranks", "events", "collectives")
    assert [{k: getattr(s, k) for k in keep} for s in ra.manifest.sources] == \
        [{k: getattr(s, k) for k in keep} for s in rb.manifest.sources]


@pytest.mark.parametrize("name", ["synth", "gloo"])
def test_ray_ingest_and_analyze_equal_local(local_ray, traces, tmp_path, name):
    local = ingest(traces[name], tmp_path / "local", jobs=1)
    seen = []
    remote = ingest(traces[name], tmp_path / "ray", executor="ray", progress=lambda s, d, t: seen.append(d))
    assert not remote.failed and len(remote.ingested) == len(local.ingested) >= 8
    assert sorted(seen) == list(range(1, len(remote.sources) + 1))
    _same_run(tmp_path / "local", tmp_path / "ray")
    a = analyze(tmp_path / "local", write=False)
    b = analyze(tmp_path / "ray", write=False, executor=Executor("ray", task_memory=256 << 20))
    for key, tab in a.tables().items():
        assert tab.equals(b.tables()[key]), key
    assert a.findings == b.findings and a.alignment == b.alignment
    assert a.per_rank_step.num_rows >= 16


def test_cli_ray_executor(local_ray, traces, tmp_path):
    run = tmp_path / "run"
    result = CliRunner().invoke(main, ["ingest", *map(str, traces["synth"]), "-o", str(run), "-q",
                                       "--executor", "ray"])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(main, ["analyze", str(run), "--json", "--executor", "ray", "--task-memory", "256MiB"])
    assert result.exit_code == 0, result.output
    local = CliRunner().invoke(main, ["analyze", str(run), "--json"])
    assert json.loads(result.output) == json.loads(local.output)


def test_a_failed_task_is_a_clean_error(local_ray):
    with pytest.raises(ExecutorError, match=r"Ray task parse_size\('lots'\) failed: ExecutorError: cannot read"):
        run_tasks(Executor("ray"), parse_size, [("1KiB",), ("lots",), ("2KiB",)])
    assert run_tasks(Executor("ray"), parse_size, [("1KiB",), ("2KiB",)]) == [1024, 2048]
