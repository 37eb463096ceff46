"""Open generated reports in headless Chromium (Playwright for Python) and check what renders.

Needs /usr/bin/chromium (Debian's package) and the playwright Python package; the browser is
never downloaded by Playwright. Screenshots go to test-artifacts/.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from viz_inputs import HOSTILE, tiny_analysis, tiny_link_samples, tiny_replay, tiny_tables

from tracekit.viz.report import write_report

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"

# every visible canvas (Bokeh draws inside shadow roots): its size and how many colours it shows
CANVASES_JS = """
() => {
  const found = [];
  const walk = (root) => {
    for (const el of root.querySelectorAll("*")) {
      if (el.tagName === "CANVAS") found.push(el);
      if (el.shadowRoot) walk(el.shadowRoot);
    }
  };
  walk(document);
  return found.filter((c) => c.getBoundingClientRect().width > 0 && c.width > 0 && c.height > 0).map((c) => {
    const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
    const colours = new Set();
    for (let i = 0; i < d.length; i += 4 * 7) colours.add((d[i] << 24) | (d[i + 1] << 16) | (d[i + 2] << 8) | d[i + 3]);
    return {w: c.width, h: c.height, colours: colours.size};
  });
}
"""

ROOTS_JS = """
() => {
  const doc = Bokeh.documents[0];
  return doc.roots().map((m) => Bokeh.index.find_one(m) != null);
}
"""

# screen position of a data point in a figure, found by its title
HOVER_JS = """
([title, x, y]) => {
  const models = [...Bokeh.documents[0]._all_models.values()];
  const fig = models.find((m) => m.title && m.title.text && m.title.text.startsWith(title));
  const view = Bokeh.index.find_one(fig);
  const box = view.canvas_view.el.getBoundingClientRect();
  return [box.left + view.frame.x_scale.compute(x), box.top + view.frame.y_scale.compute(y)];
}
"""

TOOLTIP_JS = """
() => {
  let text = "";
  const walk = (root) => {
    for (const el of root.querySelectorAll("*")) {
      if (el.shadowRoot) walk(el.shadowRoot);
      if (el.classList && el.classList.contains("bk-tooltip-content")) text += el.textContent + " ";
    }
  };
  walk(document);
  return text.replace(/\\s+/g, " ");
}
"""


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


class Page:
    """A page with its console errors collected."""

    def __init__(self, browser: Any, path: Path) -> None:
        self.page = browser.new_page(viewport={"width": 1480, "height": 1000})
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        start = time.perf_counter()
        self.page.goto(path.resolve().as_uri())
        self.page.wait_for_function(
            "() => window.Bokeh && Bokeh.documents.length > 0 && Bokeh.documents[0].is_idle", timeout=120_000)
        self.render_s = time.perf_counter() - start

    def tabs(self) -> list[str]:
        return [t.strip() for t in self.page.locator(".bk-tab").all_inner_texts()]

    def show(self, tab: str) -> None:
        self.page.locator(".bk-tab", has_text=tab).first.click()
        self.page.wait_for_function("() => Bokeh.documents[0].is_idle")
        self.page.wait_for_timeout(250)

    def hover(self, title: str, x: float, y: float) -> str:
        """Move the mouse to data point (x, y) of the figure whose title starts with `title`;
        return the tooltip text shown."""
        sx, sy = self.page.evaluate(HOVER_JS, [title, x, y])
        self.page.mouse.move(sx, sy)
        self.page.wait_for_timeout(200)
        return self.page.evaluate(TOOLTIP_JS)

    def canvases(self) -> list[dict[str, int]]:
        return self.page.evaluate(CANVASES_JS)

    def shot(self, name: str) -> Path:
        ARTIFACTS.mkdir(exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path

    def close(self) -> None:
        self.page.close()


def check_every_tab(page: Page, name: str) -> None:
    """Every root rendered, every tab with figures draws non-blank canvases, no console errors."""
    assert all(page.page.evaluate(ROOTS_JS))
    for tab in page.tabs():
        page.show(tab)
        page.shot(f"{name}-{tab.lower()}")
        if tab in ("Summary", "Hang"):
            continue  # text only
        drawn = [c for c in page.canvases() if c["colours"] > 3]
        assert drawn, f"{tab}: no canvas with content"
    assert page.errors == []


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tracekit.synth import make_run_tables

    out = tmp_path_factory.mktemp("reports")
    tables, _ = make_run_tables(hosts=2, gpus_per_host=4, pp=2, ep=2, steps=2)
    synth = write_report({**tables, "link_samples": tiny_link_samples()}, out / "synth.html", replay=tiny_replay(),
                         hang={"1": {0: 12, 1: 11, 2: 12, 3: 12}}).path
    hostile = write_report({**tiny_tables(), "link_samples": tiny_link_samples()}, out / "hostile.html",
                           analysis=tiny_analysis(), replay=tiny_replay(), hang={HOSTILE: {0: 3, 1: 2}}).path
    return {"synth": synth, "hostile": hostile}


def test_synthetic_report_renders_every_tab(browser, reports) -> None:
    page = Page(browser, reports["synth"])
    try:
        assert page.tabs() == ["Summary", "Timeline", "Overlap", "EP", "Links", "Replay", "Hang"]
        check_every_tab(page, "synth")
    finally:
        page.close()


def test_hostile_names_render_as_text_and_run_nothing(browser, reports) -> None:
    page = Page(browser, reports["hostile"])
    try:
        check_every_tab(page, "hostile")
        page.show("Summary")
        assert HOSTILE in " ".join(page.page.locator(".tk").all_inner_texts())  # shown as text
        page.show("Timeline")
        compute_tip = page.hover("Timeline", 1.0, -0.2)  # rank 0's hostile kernel, 0-2 ms
        assert HOSTILE in compute_tip and "duration: 2.000 ms" in compute_tip
        page.shot("hostile-tooltip")
        comm_tip = page.hover("Timeline", 2.5, 0.2)  # rank 0 in the DP all-reduce, waiting for rank 3
        assert "op: all_reduce" in comm_tip and "wait for last rank: 1.000 ms" in comm_tip
        assert "busbw: 96.0 GB/s" in comm_tip and "bytes: 64.00 MB" in comm_tip
        assert page.page.evaluate("() => window.__pwned") is None
        assert page.errors == []
    finally:
        page.close()


def test_128_rank_report_size_and_time_to_render(browser, tmp_path) -> None:
    from tracekit.synth import make_run_tables, write_run

    tables, _ = make_run_tables(hosts=16, gpus_per_host=8, pp=4, ep=8, steps=1, kernels_per_block=8)
    run = write_run(tables, tmp_path / "run")
    start = time.perf_counter()
    info = write_report(run, tmp_path / "r128.html")
    write_s = time.perf_counter() - start
    page = Page(browser, info.path)
    try:
        print(f"\n128 ranks x 1 step: {info.raw_intervals:,} intervals, {info.size_bytes / 1e6:.1f} MB, "
              f"written in {write_s:.1f} s, rendered in {page.render_s:.1f} s")
        assert info.size_bytes < 20_000_000
        assert page.render_s < 60
        page.show("Timeline")
        assert any(c["colours"] > 3 for c in page.canvases())
        # zoom in: the level-of-detail callback swaps in finer bars without errors
        page.page.evaluate("""() => {
          const doc = Bokeh.documents[0];
          const src = doc._all_models ? [...doc._all_models.values()] : [];
          const xr = src.find((m) => m.type == "Range1d" && m.js_property_callbacks
                                  && Object.keys(m.js_property_callbacks).length > 0);
          xr.setv({start: 10, end: 11});
        }""")
        page.page.wait_for_timeout(400)
        page.shot("r128-zoomed")
        shown = page.page.evaluate("""() => {
          const src = [...Bokeh.documents[0]._all_models.values()].find((m) => m.name == "timeline:compute");
          return {rows: src.data.x0.length, merged: Math.max(...src.data.count), x0: Math.min(...src.data.x0)};
        }""")
        assert info.merged_intervals == 0 and shown["merged"] == 1  # every kernel on its own
        assert shown["x0"] > 8 and shown["rows"] < info.raw_intervals  # only bars near the view
        assert page.errors == []
    finally:
        page.close()



SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces"
REAL = Path(__file__).resolve().parents[2].parent / "shared" / "real_traces" / "kineto"


@pytest.mark.parametrize("source", [
    "sample:gloo_moe_8rank", "sample:synth_moe_16rank", "real:param_dlrm_kineto_8rank",
    "real:hta_nccl_parser_config", "real:tracelens_mi300_resnet_rank0of8", "real:tracelens_b200_eager_rank0of8",
])
def test_reports_of_samples_and_real_traces_render(browser, tmp_path, source) -> None:
    from click.testing import CliRunner

    from tracekit.cli import main

    kind, name = source.split(":")
    path = (SAMPLE if kind == "sample" else REAL) / name
    if not path.is_dir():
        pytest.skip(f"{path} not present")
    out = tmp_path / "report.html"
    if kind == "sample":
        args = ["replay", str(path), "--topology", "single-switch", "--topology", "fat-tree:oversub=4",
                "--cache", str(tmp_path / "run"), "--report", str(out)]
    else:
        ingest = CliRunner().invoke(main, ["ingest", str(path), "-o", str(tmp_path / "run"), "-q"])
        assert ingest.exit_code == 0, ingest.output
        args = ["report", str(tmp_path / "run"), "-o", str(out)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    page = Page(browser, out)
    try:
        assert page.tabs()[:2] == ["Summary", "Timeline"]
        if kind == "sample":
            assert "Replay" in page.tabs()
        check_every_tab(page, f"{kind}-{name}")
    finally:
        page.close()
