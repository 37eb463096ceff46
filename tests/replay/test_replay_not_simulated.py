"""A run whose collectives have members outside it: what the model cannot simulate is said so
(a `not_simulated` finding), the replay error scores only what was simulated, and when nothing
was there is no replay error (null), no table of topologies that cannot differ, no diagonal of
traced durations and no heatmap of idle links. Hand-made runs, then the real one-rank traces."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from hand_traces import BASE, Trace

from tracekit.present import replay_comparison, whatif_comparison
from tracekit.replay.engine import replay
from tracekit.results import to_builtins
from tracekit.viz import data as D
from tracekit.whatif import whatif

ROOT = Path(__file__).parents[2]
REAL = ROOT.parent / "shared" / "real_traces" / "kineto"
S20 = "gpu0/stream20"
ALT = "single-switch:gpus=1,latency_ns=0,pcie_gbps=2000,nic_gbps=50"


def _with_nranks(tables: dict, nranks: dict[int, int]) -> dict:
    """The tables with some instances' calls on a larger communicator (members outside the run)."""
    coll = tables["collectives"]
    sizes = [nranks.get(i, n) for i, n in zip(coll.column("instance").to_pylist(), coll.column("nranks").to_pylist(),
                                               strict=True)]
    return {**tables, "collectives": coll.set_column(coll.schema.get_field_index("nranks"), "nranks",
                                                     pa.array(sizes, pa.int64()))}


def _two_all_reduces(outside: tuple[int, ...]) -> dict:
    """Two all-reduces on ranks 0 and 1 (steps 0 and 1); those in `outside` traced on rank 0 only,
    on a 4-rank communicator whose other members are not in the run."""
    tr = Trace()
    for inst in (0, 1):
        for r in (0, 1) if inst not in outside else (0,):
            tr.kernel(r, S20, "comm", inst * 10_000_000, 2_000_000 + 100_000 * r, step=inst,
                      coll=tr.collective(inst, "all_reduce", "dp", inst, r, step=inst))
            tr.kernel(r, S20, "compute", inst * 10_000_000 + 3_000_000, 1_000_000, step=inst)
    return _with_nranks(tr.tables(), {i: 4 for i in outside})


def test_partly_simulated_run_says_how_many_were_not_and_scores_the_rest():
    res = replay(_two_all_reduces(outside=(1,)), [BASE, ALT])
    found = [f for f in res.findings if f.kind == "not_simulated"]
    assert len(found) == 1
    assert dict(found[0].data) == {"instances": 2, "simulated": 1, "not_simulated": 1, "members_outside": 1,
                                  "no_bytes": 0, "no_peer": 0, "ranks_present": 2}
    assert "1 of 2 collective instances were not simulated (1 with members outside the run)" in found[0].text
    assert res.errors is not None and res.scored == 1
    assert res.results[1].replay_error is not None
    lines = replay_comparison(res)
    assert any(line.startswith("caution: 1 of 2 collective instances were not simulated") for line in lines)
    assert D.replay_data(res).instances["seq"] == [0, 0]  # the simulated one, on each topology


def test_nothing_simulated_has_no_replay_error_and_no_comparison_table():
    res = replay(_two_all_reduces(outside=(0, 1)), [BASE, ALT])
    assert res.errors is None and [r.replay_error for r in res.results] == [None, None]
    doc = json.loads(res.dumps())
    assert [r["replay_error"] for r in doc["results"]] == [None, None]
    (found,) = [f for f in doc["findings"] if f["kind"] == "not_simulated"]
    assert found["severity"] == "warning" and found["data"]["simulated"] == 0
    lines = replay_comparison(res)
    assert lines[0].startswith("replay error: not available: nothing was simulated: none of the 2 collective "
                               "instances has traffic in the model (2 with members outside the run)")
    assert not [line for line in lines if "%" in line]
    rd = D.replay_data(res)
    assert rd.simulated is False and rd.instances["traced_ms"] == []
    assert D.link_data(res.link_samples(), None, order=res.topologies) is None


def test_send_to_a_rank_outside_the_run_is_not_simulated():
    """A send whose receiver was not traced: no flow, no crash, said so."""
    tr = Trace(ranks=(0,))
    tr.kernel(0, S20, "comm", 0, 1_000_000, coll=tr.collective(0, "send", "pp", 0, 0, peer=5, dim="PP"))
    tr.kernel(0, S20, "compute", 2_000_000, 1_000_000)
    res = replay(tr.tables(), [BASE])
    assert res.errors is None
    (found,) = [f for f in res.findings if f.kind == "not_simulated"]
    assert found.data["members_outside"] == 1


def test_whatif_on_a_run_with_nothing_simulated_replays_no_collective_scenario():
    ckpt = "checkpoint:bytes_per_rank=1MB,at=start,via=backend,storage=1"
    res = whatif(_two_all_reduces(outside=(0, 1)), ["placement:auto", ckpt], topology=BASE)
    assert [s.scenario for s in res.scenarios] == [ckpt] and [s.scenario for s in res.skipped] == ["placement:auto"]
    assert "these transfers can slow none" in res.scenarios[0].notes[-1]
    doc = to_builtins(res.summary)
    assert doc["skipped"][0]["reason"].startswith("not replayed: the baseline simulated no collective")
    assert doc["replay_error"] is None
    text = "\n".join(whatif_comparison(res))
    assert "replay error of the baseline: not available" in text and "%" not in text.split("caution")[0]
    assert "placement:auto: not replayed" in text


def test_four_ranks_of_the_bundled_sample_score_only_their_simulated_collectives(tmp_path: Path) -> None:
    """Ranks 0-3 of the 16-rank sample: their PP sends go to ranks outside (not simulated), their
    EP all-to-alls and DP all-reduces have members inside (simulated among those)."""
    from tracekit.workflows import open as open_run
    from tracekit.workflows import replay as replay_run

    paths = [ROOT / "sample_traces" / "synth_moe_16rank" / f"rank{r}.pt.trace.json.gz" for r in range(4)]
    res = replay_run(open_run(paths, cache=tmp_path / "run"), ["rail-optimized"], write=False)
    (found,) = [f for f in res.findings if f.kind == "not_simulated"]
    assert {k: found.data[k] for k in ("instances", "simulated", "not_simulated", "members_outside")} == {
        "instances": 102, "simulated": 54, "not_simulated": 48, "members_outside": 48}
    idle = {(i.dim, i.op) for i in res.results[0].instances if i.calibration == "no_flows"}
    assert idle == {("PP", "send")}
    assert res.errors is not None and res.scored == 54


# -- the real one-rank traces -----------------------------------------------------------------

ONE_RANK = ["tracelens_b200_eager_rank0of8", "tracelens_mi300_resnet_rank0of8"]


@pytest.mark.parametrize("name", ONE_RANK)
def test_real_one_rank_trace_reports_no_replay_error(name: str, tmp_path: Path) -> None:
    """Before: 'replay error per instance median 0.0%, p90 0.0%' and every topology '+0.0%'.
    After: replay_error null, a not_simulated finding, one line of text and no delta."""
    path = REAL / name
    if not path.is_dir():
        pytest.skip(f"real traces not present at {path}")
    env = {**os.environ, "TRACEKIT_NO_PROGRESS": "1"}
    base = [sys.executable, "-m", "tracekit", "replay", str(path), "--cache", str(tmp_path / "run"), "--topology",
            "rail-optimized", "--topology", "fat-tree:nic_gbps=100,oversub=4"]
    doc = json.loads(subprocess.run([*base, "--json"], capture_output=True, text=True, env=env, check=True).stdout)
    assert [r["replay_error"] for r in doc["results"]] == [None, None]
    (found,) = [f for f in doc["findings"] if f["kind"] == "not_simulated"]
    assert found["data"]["simulated"] == 0 and found["data"]["instances"] == len(doc["results"][0]["instances"])
    text = subprocess.run(base, capture_output=True, text=True, env=env, check=True).stdout
    assert text.splitlines()[0].startswith("replay error: not available: nothing was simulated")
    assert "0.0%" not in text and "(+" not in text
    from tracekit.workflows import report_data as build_report_data

    report = build_report_data(tmp_path / "run")
    assert "Links" not in report.tabs and "Replay" in report.tabs
    assert report.summary.replay[0].startswith("Replay error not available: nothing was simulated")
    # each caveat once: the replay's "1 of 8 ranks present" and "hosts unknown" repeated the analysis' (issue 21, 10)
    kinds = [f.kind for f in report.summary.findings]
    assert kinds.count("partial_run") == 1 and kinds.count("unknown_hosts") == 1 and "replay_caution" not in kinds


def test_whatif_eplb_given_expert_loads_still_runs_with_nothing_simulated():
    """EPLB with expert loads derives its own traffic: it is run (here it finds no EP all-to-all)."""
    from tracekit.errors import TracekitError
    from tracekit.whatif.experts import ExpertLoads

    tables = _two_all_reduces(outside=(0, 1))
    assert [s.scenario for s in whatif(tables, ["eplb:redundant=1"], topology=BASE).skipped] == ["eplb:redundant=1"]
    with pytest.raises(TracekitError, match="eplb"):
        whatif(tables, ["eplb:redundant=1"], topology=BASE, expert_loads=ExpertLoads(tokens={0: 1.0}, rank_of={0: 0}))


def _deepep_like() -> dict:
    """Two ranks' EP all-to-alls with no byte count, as DeepEP's dispatch/combine kernels are traced
    (DeepSeek-V3's train.json: 24 such calls, no sizes)."""
    tr = Trace()
    for inst in (0, 1):
        for r in (0, 1):
            tr.kernel(r, S20, "comm", inst * 10_000_000, 2_000_000, step=inst,
                      coll=tr.collective(inst, "all_to_all", "ep", inst, r, nbytes=None, step=inst, dim="EP"))
            tr.kernel(r, S20, "compute", inst * 10_000_000 + 3_000_000, 1_000_000, step=inst)
    return tr.tables()


def test_whatif_eplb_on_ep_calls_without_bytes_says_what_is_missing_and_how_to_give_it():
    """Before: skipped as 'the baseline simulated no collective', or 'no collective classified EP'
    though analyze classifies them EP."""
    from tracekit.errors import TracekitError
    from tracekit.whatif.experts import ExpertLoads

    tables = _deepep_like()
    res = whatif(tables, ["eplb:redundant=1"], topology=BASE)
    (skipped,) = res.skipped
    assert skipped.reason.startswith("not replayed: the run's 4 EP calls (4 all_to_all) carry no byte counts")
    assert "--expert-loads FILE" in skipped.reason and "--expert-map FILE" in skipped.reason
    assert "no collective classified EP" not in skipped.reason
    with pytest.raises(TracekitError, match=r"carry no byte counts.*not how many bytes"):
        whatif(tables, ["eplb:redundant=1"], topology=BASE,
               expert_loads=ExpertLoads(tokens={0: 3.0, 1: 1.0}, rank_of={0: 0, 1: 1}))
