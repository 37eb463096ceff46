"""CPU/gloo runs: detected from the trace (backend, no GPU lanes), said in one line by `replay` and
`whatif`, and never given GPU-fabric physics or calibrated what-if times."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from click.testing import CliRunner
from hand_traces import BASE, Trace

from tracekit.cli import main
from tracekit.replay.backend import cpu_backend
from tracekit.replay.engine import replay

ROOT = Path(__file__).resolve().parents[2]
S20 = "gpu0/stream20"
GLOO = ROOT / "sample_traces" / "gloo_moe_8rank"
REAL = ROOT.parent / "shared" / "real_traces"


def _prepared(path: Path, tmp: Path) -> dict:
    from tracekit.analysis import prepare
    from tracekit.workflows import open as open_run

    return dict(prepare(open_run([path], cache=tmp), write=False))


@pytest.fixture(scope="module")
def gloo_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tracekit.ingest import ingest

    out = tmp_path_factory.mktemp("gloo") / "run"
    ingest([str(GLOO)], out)
    return out


def _cpu_trace(backend: str | list[str], *, gpu_lane: bool = False, on_tp: bool = False) -> dict[str, pa.Table]:
    """Two ranks, one all-reduce on CPU threads (as gloo runs record it) on group "dp" with `backend`;
    with `gpu_lane`, one compute kernel on a GPU stream as well. A list gives a second group "tp", which
    carries a second all-reduce with `on_tp`."""
    tr = Trace()
    for r in (0, 1):
        tr.event(r, "cpu/thread1", "cpu_op", 0, 30_000, coll=tr.collective(0, "all_reduce", "dp", 0, r))
        tr.event(r, "cpu/thread1", "cpu_op", 40_000, 10_000, name="aten::mm")
        if on_tp:
            tr.event(r, "cpu/thread1", "cpu_op", 50_000, 5_000, coll=tr.collective(1, "all_reduce", "tp", 0, r))
    if gpu_lane:
        tr.kernel(0, S20, "compute", 60_000, 5_000)
    tables = tr.tables()
    backends = [backend] if isinstance(backend, str) else backend
    names = ["dp", "tp"][:len(backends)]
    tables["groups"] = pa.table({"group": names, "backend": backends, "ranks": [[0, 1]] * len(names),
                                 "size": [2] * len(names)})
    return tables


def test_gloo_sample_is_cpu_with_its_evidence(gloo_run, tmp_path):
    finding = cpu_backend(_prepared(gloo_run, tmp_path / "c"))
    assert finding is not None and finding.kind == "cpu_backend" and finding.severity == "warning"
    assert finding.data == {"backends": {"gloo": 8}, "groups": 8, "events": 14129, "gpu_events": 0}
    assert finding.text.startswith("this is a CPU/gloo run (backend gloo on all 8 process groups, no GPU event "
                                   "among 14,129): the network model is NCCL on GPU fabrics and does not apply")


def test_hand_built_cpu_run_and_its_near_misses():
    assert cpu_backend(_cpu_trace("gloo")) is not None
    assert cpu_backend(_cpu_trace("gloo", gpu_lane=True)) is None  # a GPU kernel ran: not a CPU run
    assert cpu_backend(_cpu_trace("cpu:gloo,cuda:nccl")) is None  # PyTorch's default for a GPU job
    assert cpu_backend(_cpu_trace("nccl")) is None
    idle_nccl = cpu_backend(_cpu_trace(["gloo", "nccl"]))  # collectives ran on gloo "dp" only; NCCL "tp" idle
    assert idle_nccl is not None and idle_nccl.data["backends"] == {"gloo": 1}
    assert "backend gloo on its one process group, no GPU event among 4" in idle_nccl.text
    assert cpu_backend(_cpu_trace(["nccl", "gloo"])) is None  # the group that carried the collective is NCCL
    assert cpu_backend(_cpu_trace(["gloo", "nccl"], on_tp=True)) is None  # an NCCL group carried one too
    unknown = _cpu_trace("gloo")
    unknown["groups"] = unknown["groups"].drop_columns(["backend"])
    assert cpu_backend(unknown) is None  # no backend known: no evidence either way


def test_replay_of_a_cpu_run_has_no_modelled_times():
    res = replay(_cpu_trace("gloo"), [BASE, BASE + ",nic_gbps=50"])
    assert res.results == [] and res.efficiency == {} and res.errors is None
    assert [f.kind for f in res.findings] == ["cpu_backend"]
    tr = Trace()
    for r in (0, 1):
        tr.kernel(r, S20, "comm", 0, 30_000, coll=tr.collective(0, "all_reduce", "dp", 0, r))
    tables = tr.tables()
    tables["groups"] = tables["groups"].append_column("backend", pa.array(["nccl"]))
    gpu = replay(tables, [BASE])
    assert len(gpu.results) == 1 and not [f for f in gpu.findings if f.kind == "cpu_backend"]


def test_replay_and_whatif_cli_say_it_in_one_line(gloo_run):
    runner = CliRunner()
    text = runner.invoke(main, ["replay", str(gloo_run), "--topology", "rail-optimized", "--topology",
                                "fat-tree:nic_gbps=100,oversub=4", "--no-write"])
    assert text.exit_code == 0, text.output
    lines = text.stdout.splitlines()
    assert lines[0].startswith("this is a CPU/gloo run (backend gloo on all 8 process groups")
    assert lines[1].startswith("identity (traced durations replayed): max step error 0.00e+00")
    assert not [x for x in lines if x.startswith(("calibration", "topology", "rail-optimized", "note:"))]
    doc = json.loads(runner.invoke(main, ["replay", str(gloo_run), "--topology", "rail-optimized", "--no-write",
                                          "--json"]).stdout)
    assert doc["results"] == [] and doc["calibration"]["efficiency"] == {}
    [cpu] = [f for f in doc["findings"] if f["kind"] == "cpu_backend"]
    assert cpu["text"] == lines[0] and cpu["data"]["backends"] == {"gloo": 8}
    what = runner.invoke(main, ["whatif", str(gloo_run), "eplb:redundant=8", "placement:pp-adjacent",
                                "--topology", "rail-optimized"])
    assert what.exit_code == 0, what.output
    assert what.stdout.splitlines() == [f"what-if on rail-optimized: {lines[0]}"]
    wdoc = json.loads(runner.invoke(main, ["whatif", str(gloo_run), "eplb:redundant=8", "--topology",
                                           "rail-optimized", "--json"]).stdout)
    assert wdoc["scenarios"] == [] and [c["kind"] for c in wdoc["cautions"]] == ["cpu_backend"]


@pytest.mark.parametrize("parts", [("kineto", "hta_edge_cases", "rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"),
                                   ("flight_recorder", "gloo_torch2.13_cpu", "healthy", "json")],
                         ids=["kineto_gloo_rank34", "fr_gloo_healthy"])
def test_real_gloo_traces_are_cpu(parts, tmp_path):
    path = REAL.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} not present")
    finding = cpu_backend(_prepared(path, tmp_path / "c"))
    assert finding is not None and finding.data["gpu_events"] == 0 and set(finding.data["backends"]) == {"gloo"}


@pytest.mark.parametrize("name", ["param_dlrm_kineto_8rank", "hta_trace_filter_sampled_2rank"])
def test_real_gpu_traces_are_not(name, tmp_path):
    path = REAL / "kineto" / name
    if not path.exists():
        pytest.skip(f"{path} not present")
    assert cpu_backend(_prepared(path, tmp_path / "c")) is None


def test_whatif_report_of_a_cpu_run_says_so(gloo_run, tmp_path):
    out = tmp_path / "w.html"
    res = CliRunner().invoke(main, ["whatif", str(gloo_run), "eplb:redundant=8", "--topology", "rail-optimized",
                                    "--report", str(out)])
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert '"title":"What-if"' in text and "this is a CPU/gloo run" in text
