"""The What-if tab, built from real pipeline outputs: the bundled 16-rank sample ingested,
analysed and replayed, then `tracekit.whatif` on it. The tab draws the `WhatIfResult` as it is,
and every number it shows is one `tracekit whatif` prints for the same result."""

from __future__ import annotations

import re

import pytest
from bokeh.models import ColumnDataSource, Div

from tracekit.present import whatif_comparison
from tracekit.viz import data as D
from tracekit.viz import figures

#: A number as the CLI and the report print it: a duration, a share, a size, a factor or a count.
NUMBER = re.compile(r"(?<![\w.])[-+]?\d[\d,]*(?:\.\d+)?(?: ?(?:ns|µs|ms|s|%|x|KB|MB|GB|B)\b)?")


def _mean(values: dict[str, int]) -> float:
    return sum(values.values()) / len(values)


def _shown(wd: dict) -> tuple[str, list[str]]:
    """The tab's text (every Div, tags stripped) and the labels drawn next to the bars."""
    import html

    lay = figures.whatif_figures(wd, width=1400)
    text = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", re.sub(r"<style>.*?</style>", " ", d.text, flags=re.S)))
                    for d in lay.select({"type": Div}))
    labels = [str(x) for s in lay.select({"type": ColumnDataSource}) for x in s.data.get("label", [])]
    return text, labels


def test_tab_is_the_result_unchanged(synth_whatif) -> None:
    result, data = synth_whatif
    wd = data.whatif
    eplb, place, ckpt = result.scenarios
    assert data.tabs[-1] == "What-if"
    assert wd.names == ["baseline", *(s.scenario for s in result.scenarios)]
    assert wd.step_ms == pytest.approx([_mean(result.baseline_step_ns) / 1e6,
                                           *(_mean(s.step_ns) / 1e6 for s in result.scenarios)])
    for name, s in zip(wd.names[1:], result.scenarios, strict=True):
        assert wd.exposed_ms[name] == pytest.approx({d: ns / 1e6 for d, ns in s.exposed_ns.items()})
        assert wd.traffic_gb[name] == pytest.approx({d: b / 1e9 for d, b in s.inter_host_after.items()})
        base = wd.traffic_gb["baseline"]
        for d in {*base, *s.inter_host_before}:  # one baseline: the same bytes before every scenario
            assert base.get(d, 0) == pytest.approx(s.inter_host_before.get(d, 0) / 1e9), (name, d)
    assert wd.exposed_ms["baseline"] == pytest.approx({d: ns / 1e6 for d, ns in result.baseline_exposed_ns.items()})
    ep = wd.ep[0]
    assert ep.scenario == eplb.scenario and len(ep.ranks) == 16 == len(set(ep.ranks))
    assert ep.before_gb == pytest.approx([b / 1e9 for g in eplb.ep_load for b in g.before])
    assert ep.after_gb == pytest.approx([a / 1e9 for g in eplb.ep_load for a in g.after])
    assert ep.imbalance == (eplb.ep_imbalance.before, eplb.ep_imbalance.after)
    assert ep.imbalance[0] > 3 > 1.3 > ep.imbalance[1]  # the sample's 70% expert, rebalanced
    grid = wd.grids[0]
    assert grid.scenario == place.scenario
    for side, pl_ in (("before", place.placement_before), ("after", place.placement_after)):
        g = getattr(grid, side)
        cells = {(g.hosts[h], gpu, r) for h, gpu, r in zip(g.host, g.gpu, g.rank, strict=True)}
        assert cells == {(pl_.hosts[h], gpu, r) for r, (h, gpu) in pl_.slots.items()}
    assert grid.moved and set(grid.moved) == {r for r in place.placement_after.slots
                                                   if place.placement_after.slots[r] != place.placement_before.slots[r]}
    st = wd.storage[0]
    assert st.scenario == ckpt.scenario and st.slowed == len(ckpt.slowed) > 0
    assert st.checkpoint_ms == pytest.approx(ckpt.checkpoint_ns / 1e6)
    assert wd.traffic_gb[ckpt.scenario]["storage"] > 0 == wd.traffic_gb["baseline"].get("storage", 0)


def test_every_number_on_the_tab_is_one_the_cli_prints(synth_whatif) -> None:
    """The bar labels, the EP and north-south figures, the replay error and the assumptions are
    printed the same way by `tracekit whatif` for the same result."""
    result, data = synth_whatif
    text, labels = _shown(data.whatif)
    said = set(NUMBER.findall("\n".join(whatif_comparison(result))))
    shown = set(NUMBER.findall(text + " " + " ".join(labels)))
    labels_shown = {n for x in labels for n in NUMBER.findall(x)}
    assert len(labels_shown) >= 2 * len(data.whatif.names) - 1  # value and change per scenario
    assert shown <= said, sorted(shown - said)


def test_bars_compare_with_the_baseline_as_the_cli_does(synth_whatif) -> None:
    result, data = synth_whatif
    _, labels = _shown(data.whatif)
    out = "\n".join(whatif_comparison(result))
    for s in result.scenarios:
        step = _mean(s.step_ns)
        base = _mean(s.baseline_step_ns)
        label = f"{step / 1e6:.3f} ms ({(step - base) / base:+.1%})"
        assert label in out and any(x.strip() == label for x in labels), label


def test_no_whatif_no_tab(synth) -> None:
    assert "What-if" not in synth.data.tabs and D.whatif_data(None) is None
