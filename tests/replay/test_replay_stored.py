"""results/replay.json as a release before the typed results wrote it (tests/replay/golden/, written
by the code of commit 3257cb9 through `Run.write_json`): the same replay writes it again byte for
byte, and the stored file reads back into the same document."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hand_traces import BASE, PHYSICS_NS, SLOW8, Trace

from tracekit.replay.engine import ReplayResult, ReplaySummary, replay
from tracekit.results import from_builtins, to_builtins
from tracekit.store import Run, write_manifest

GOLDEN = Path(__file__).parent / "golden"


def _allreduces(durations):
    tr = Trace()
    for k, d in enumerate(durations):
        for r in (0, 1):
            tr.kernel(r, "gpu0/stream20", "comm", 10_000_000 * k, d, step=k,
                      coll=tr.collective(k, "all_reduce", "dp", k, r, step=k))
    return tr.tables()


@pytest.fixture(scope="module")
def replays() -> dict[str, ReplayResult]:
    tables = _allreduces([PHYSICS_NS, 2 * PHYSICS_NS, int(1.5 * PHYSICS_NS)])
    measured = replay(tables, [BASE, SLOW8])
    calibrated = replay(tables, [BASE, SLOW8], efficiency=dict(measured.efficiency), terms=dict(measured.terms),
                        calibrated_on="runs/healthy")
    return {"measured": measured, "calibrated": calibrated}


def _stored_text(doc: object) -> str:
    """What `Run.write_json` writes."""
    return json.dumps(doc, indent=1, sort_keys=True)


@pytest.mark.parametrize("kind", ["measured", "calibrated"])
def test_replay_json_is_written_as_before(replays, kind):
    assert _stored_text(to_builtins(replays[kind].summary)) == (GOLDEN / f"replay_{kind}_main.json").read_text()


@pytest.mark.parametrize("kind", ["measured", "calibrated"])
def test_stored_replay_json_reads_back_whole(tmp_path, kind):
    text = (GOLDEN / f"replay_{kind}_main.json").read_text()
    write_manifest(tmp_path, {"sources": []})
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "replay.json").write_text(text)
    back = ReplayResult.load(Run(tmp_path))
    assert back is not None and _stored_text(to_builtins(back.summary)) == text
    assert from_builtins(json.loads(text), ReplaySummary) == back.summary
    err = back.errors
    assert err is not None and err.basis == "measured" and back.results[1].replay_error.basis == "baseline"
    assert (err.calibrated_on is None) == (kind == "measured")
    assert err.cross_validated == err.quoted and err.in_sample.median >= 0
    assert back.results[0].convergence is not None and back.results[0].link_samples.num_rows == 0


def test_buckets_cross_validation_could_not_fit_reach_the_json():
    """Two sizes, one per step: leaving a step out leaves its size bucket without a fit of its own."""
    tr = Trace()
    for k, nbytes in enumerate((2**20, 2**24)):
        for r in (0, 1):
            tr.kernel(r, "gpu0/stream20", "comm", 10_000_000 * k, PHYSICS_NS, step=k,
                      coll=tr.collective(k, "all_reduce", "dp", k, r, nbytes=nbytes, step=k))
    res = replay(tr.tables(), [BASE])
    assert res.unseen == {"all_reduce:2^20": "interpolated", "all_reduce:2^24": "interpolated"}
    assert to_builtins(res.summary)["calibration"]["unseen_buckets"] == res.unseen
