"""The What-if report tab draws a WhatIfResult as it is: plain data and the written file, with
hostile host names. The bundled sample's tab, its numbers against the CLI and the browser check
are in tests/viz/test_viz_whatif.py and tests/viz/test_viz_browser.py."""

import re

import pytest

from tracekit.synth import SynthSpec, make_run_tables, write_run
from tracekit.viz import data as D
from tracekit.workflows import report as write_report
from tracekit.workflows import whatif

HOSTILE = "<img src=x onerror=window.__pwned=1>"
SPEC = SynthSpec(hosts=2, gpus_per_host=4, pp=2, ep=4, steps=1, straggler_rank=None)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    out = tmp_path_factory.mktemp("whatif-report")
    tables, truth = make_run_tables(SPEC)
    run = write_run(tables, out / "run", truth=truth)
    (out / "place.csv").write_text("rank,host\n" + "".join(
        f"{r},{HOSTILE if r % 2 else 'plain'}\n" for r in range(8)))
    result = whatif(run.path, ["eplb:redundant=4", f"placement:{out / 'place.csv'}",
                               "checkpoint:bytes_per_rank=64MB,via=backend,storage=2"],
                    topology="rail-optimized:gpus=4")
    return run, result, out


def test_data_is_the_result_unchanged(study):
    _, result, _ = study
    wd = D.whatif_data(result)
    eplb, place, ckpt = result.scenarios
    assert wd.names[0] == "baseline" and wd.names[1:] == [s.scenario for s in result.scenarios]
    assert wd.labels[1] == "1. eplb:redundant=4"
    mean = sum(eplb.step_ns.values()) / len(eplb.step_ns)
    assert wd.step_ms[1] == pytest.approx(mean / 1e6)
    assert wd.exposed_ms["baseline"]["EP"] == pytest.approx(result.baseline_exposed_ns["EP"] / 1e6)
    assert wd.ep[0].after_gb == pytest.approx([b / 1e9 for g in eplb.ep_load for b in g.after])
    assert wd.ep[0].ranks == [r for g in eplb.ep_load for r in g.ranks]
    grid = wd.grids[0].after
    assert grid.hosts == list(place.placement_after.hosts)
    assert {(grid.hosts[h], g, r) for h, g, r in zip(grid.host, grid.gpu, grid.rank, strict=True)} == {
        (place.placement_after.hosts[h], g, r) for r, (h, g) in place.placement_after.slots.items()}
    assert wd.storage[0].slowed == len(ckpt.slowed) and wd.storage[0].network == "backend"
    assert wd.traffic_gb[wd.names[3]]["storage"] == pytest.approx(ckpt.inter_host_after["storage"] / 1e9)
    assert D.whatif_data(None) is None


def test_report_has_the_tab_and_escapes_names(study):
    run, result, out = study
    info = write_report(run, out / "report.html", whatif=result)
    assert info.tabs[-1] == "What-if" or info.tabs[info.tabs.index("What-if") + 1] == "Hang"
    text = info.path.read_text()
    assert HOSTILE not in text
    assert re.search(r"<script[^>]*>\s*window.__pwned", text) is None
    without = write_report(run, out / "plain.html")
    assert "What-if" not in without.tabs
