"""Fixtures for the viz tests: report inputs made by the real pipeline (see viz_runs.py).

Both bundled samples always run; the real third-party traces in ../shared/real_traces run when
present (a clean checkout skips only those). `hostile` is the gloo sample with a kernel name and a
process-group description replaced by HTML, ingested like any trace.
"""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import pytest
from viz_runs import (
    GLOO_TOPOLOGIES,
    HOSTILE,
    REAL,
    SAMPLES,
    SYNTH_TOPOLOGIES,
    WHATIF_SCENARIOS,
    WHATIF_TOPOLOGY,
    Pipeline,
    pipeline,
)


def _real(*parts: str) -> Path:
    path = REAL.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} not present")
    return path


@pytest.fixture(scope="session")
def gloo(tmp_path_factory: pytest.TempPathFactory) -> Pipeline:
    return pipeline([SAMPLES / "gloo_moe_8rank"], tmp_path_factory.mktemp("gloo") / "run", GLOO_TOPOLOGIES)


@pytest.fixture(scope="session")
def synth(tmp_path_factory: pytest.TempPathFactory) -> Pipeline:
    return pipeline([SAMPLES / "synth_moe_16rank"], tmp_path_factory.mktemp("synth") / "run", SYNTH_TOPOLOGIES)


@pytest.fixture(scope="session")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Pipeline:
    """The gloo sample's traces with `aten::mm` on rank 0 and the description of group 3
    (ep_stage0) on every rank replaced by HTML."""
    d = tmp_path_factory.mktemp("hostile")
    for src in sorted((SAMPLES / "gloo_moe_8rank").glob("rank*.pt.trace.json.gz")):
        text = gzip.decompress(src.read_bytes()).decode()
        text = text.replace("ep_stage0", HOSTILE)
        if src.name.startswith("rank0."):
            text = text.replace('"name": "aten::mm"', f'"name": "{HOSTILE}"')
        (d / src.name).write_bytes(gzip.compress(text.encode()))
    return pipeline([d], d / "run", GLOO_TOPOLOGIES[:1])


@pytest.fixture(scope="session")
def dlrm(tmp_path_factory: pytest.TempPathFactory) -> Pipeline:
    return pipeline([_real("kineto", "param_dlrm_kineto_8rank")], tmp_path_factory.mktemp("dlrm") / "run",
                    ["single-switch"])


@pytest.fixture(scope="session")
def type_mismatch(tmp_path_factory: pytest.TempPathFactory) -> Pipeline:
    path = _real("flight_recorder", "gloo_torch2.13_cpu", "type_mismatch")
    return pipeline([path / "pickle", path / "json"], tmp_path_factory.mktemp("fr") / "run")


@pytest.fixture(scope="session")
def one_of_eight(tmp_path_factory: pytest.TempPathFactory) -> Pipeline:
    return pipeline([_real("kineto", "tracelens_b200_eager_rank0of8")], tmp_path_factory.mktemp("b200") / "run")


@pytest.fixture(scope="session")
def two_of_128(tmp_path_factory: pytest.TempPathFactory) -> Pipeline:
    # a TorchRec trace: its all-to-alls are embedding exchanges (OTHER) unless the user names them EP
    return pipeline([_real("kineto", "hta_trace_filter_sampled_2rank")], tmp_path_factory.mktemp("hta") / "run",
                    dims="ep=0")


@pytest.fixture(scope="session")
def synth_whatif(synth: Pipeline) -> tuple[Any, dict[str, Any]]:
    """`tracekit.whatif` on the bundled 16-rank sample, and the report data built with it."""
    from tracekit import workflows

    result = workflows.whatif(synth.run.path, WHATIF_SCENARIOS, topology=WHATIF_TOPOLOGY)
    return result, workflows.report_data(synth.run, analysis=synth.analysis, replay=synth.replay, whatif=result)
