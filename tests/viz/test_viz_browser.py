"""Open reports of real pipeline outputs in headless Chromium (Playwright for Python) and check
what renders: every tab draws, no console error, no text on a canvas overlaps another or is cut
off, trace strings stay text, and tooltips name the rank waited on.

Needs /usr/bin/chromium (Debian's package) and the playwright Python package; the browser is
never downloaded by Playwright. Screenshots go to test-artifacts/.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from viz_runs import HOSTILE

from tracekit.workflows import report as write_report

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
#: Records every fillText on every canvas (its rotated box and the clip in force), reset when a
#: canvas is cleared, so the last paint of each canvas can be checked for overlaps and cut text.
TEXTS_JS = Path(__file__).with_name("canvas_texts.js")

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

TEXTS = """
() => [...window.__tk_texts.entries()].filter(([c, t]) => t.length)
  .map(([c, t]) => ({w: c.width, h: c.height, texts: t}))
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

ZOOM_JS = """
([start, end]) => {
  const xr = [...Bokeh.documents[0]._all_models.values()].find(
    (m) => m.type == "Range1d" && m.js_property_callbacks && Object.keys(m.js_property_callbacks).length > 0);
  xr.setv({start: start, end: end});
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
    """A page with its console errors and canvas texts collected."""

    def __init__(self, browser: Any, path: Path) -> None:
        self.page = browser.new_page(viewport={"width": 1480, "height": 1000})
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.add_init_script(path=str(TEXTS_JS))
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
        self.page.wait_for_timeout(250)
        return self.page.evaluate(TOOLTIP_JS)

    def canvases(self) -> list[dict[str, int]]:
        return self.page.evaluate(CANVASES_JS)

    def text_problems(self) -> list[str]:
        """Texts drawn on a canvas that overlap another text, or reach past the canvas or the clip
        they were drawn in (a cut-off title or label)."""
        problems = []
        for cv in self.page.evaluate(TEXTS):
            texts = cv["texts"]
            for t in texts:
                xs, ys = [q[0] for q in t["quad"]], [q[1] for q in t["quad"]]
                c = t["clip"] or [0, 0, cv["w"], cv["h"]]
                c = [max(c[0], 0), max(c[1], 0), min(c[2], cv["w"]), min(c[3], cv["h"])]
                if min(xs) < c[0] - 1 or min(ys) < c[1] - 1 or max(xs) > c[2] + 1 or max(ys) > c[3] + 1:
                    problems.append(f"cut: {t['text'][:60]!r}")
            for i in range(len(texts)):
                for j in range(i + 1, len(texts)):
                    if _overlap(texts[i]["quad"], texts[j]["quad"]):
                        problems.append(f"overlap: {texts[i]['text'][:40]!r} and {texts[j]['text'][:40]!r}")
        return problems

    def shot(self, name: str) -> Path:
        ARTIFACTS.mkdir(exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path

    def close(self) -> None:
        self.page.close()


def _overlap(a: list[list[float]], b: list[list[float]], margin: float = 0.5) -> bool:
    """Whether two (possibly rotated) text boxes overlap: no separating axis among their edges."""
    for quad in (a, b):
        for i in range(4):
            (x1, y1), (x2, y2) = quad[i], quad[(i + 1) % 4]
            nx, ny = y2 - y1, x1 - x2
            pa = [nx * x + ny * y for x, y in a]
            pb = [nx * x + ny * y for x, y in b]
            norm = max((nx * nx + ny * ny) ** 0.5, 1e-9)
            if max(pa) <= min(pb) + margin * norm or max(pb) <= min(pa) + margin * norm:
                return False
    return True


def test_overlap_check_itself() -> None:
    square = [[0, 0], [10, 0], [10, 10], [0, 10]]
    assert _overlap(square, [[5, 5], [15, 5], [15, 15], [5, 15]])
    assert not _overlap(square, [[11, 0], [20, 0], [20, 10], [11, 10]])
    diamond = [[20, 5], [25, 0], [30, 5], [25, 10]]  # rotated, its box would touch, itself does not
    assert not _overlap([[0, 0], [19, 0], [19, 2], [0, 2]], diamond)


def check_every_tab(page: Page, name: str) -> None:
    """Every root rendered, every tab with figures draws non-blank canvases, no text overlaps or
    is cut off, no console errors."""
    assert all(page.page.evaluate(ROOTS_JS))
    for tab in page.tabs():
        page.show(tab)
        page.shot(f"{name}-{tab.lower()}")
        if tab in ("Summary", "Hang") or (tab == "Replay" and name == "gloo"):
            continue  # text only (a CPU/gloo run's Replay tab says the network model does not apply)
        drawn = [c for c in page.canvases() if c["colours"] > 3]
        assert drawn, f"{tab}: no canvas with content"
    assert page.text_problems() == []
    assert page.errors == []


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("reports")
    made = {}
    for name in ("gloo", "synth", "hostile", "type_mismatch", "dlrm", "one_of_eight", "two_of_128"):
        try:
            p = request.getfixturevalue(name)
        except pytest.skip.Exception:
            continue
        made[name] = write_report(p.run, out / f"{name}.html", analysis=p.analysis, replay=p.replay).path
    return made


@pytest.mark.parametrize("name", ["gloo", "synth", "type_mismatch", "dlrm", "one_of_eight", "two_of_128"])
def test_reports_render_every_tab_with_no_text_overlapping(browser, reports, name) -> None:
    """Regression: overlapping and cut-off x labels on Replay, cut-off heatmap titles (SHARP and
    non-SHARP panels could not be told apart), overlapping ticks on the run overview."""
    if name not in reports:
        pytest.skip(f"{name}: input not present")
    page = Page(browser, reports[name])
    try:
        assert page.tabs()[0] == "Summary"
        check_every_tab(page, name)
    finally:
        page.close()


def test_hostile_names_render_as_text_and_run_nothing(browser, reports, hostile) -> None:
    page = Page(browser, reports["hostile"])
    try:
        check_every_tab(page, "hostile")
        page.show("Summary")
        assert HOSTILE in " ".join(page.page.locator(".tk").all_inner_texts())  # the group description, as text
        page.show("Timeline")
        td = hostile.data.timeline
        comp = td.levels[-1]["compute"]
        k = next(i for i, n in enumerate(comp["name_id"]) if td.names[n] == HOSTILE)
        x0, x1, y = float(comp["x0"][k]), float(comp["x1"][k]), float(comp["y"][k])
        page.page.evaluate(ZOOM_JS, [x0 - 0.05, x1 + 0.05])  # the finest level of detail shows the kernel
        page.page.wait_for_timeout(600)
        tip = page.hover("Timeline", (x0 + x1) / 2, y)
        assert HOSTILE in tip, tip
        page.shot("hostile-tooltip")
        assert page.page.evaluate("() => window.__pwned") is None
        assert page.errors == []
    finally:
        page.close()


def test_tooltip_names_the_rank_waited_on_and_the_root(browser, reports, gloo) -> None:
    """Regression: tooltips said how long a rank waited, not for whom."""
    worst = pl.from_arrow(gloo.analysis.instances).sort("max_wait_ns", descending=True).row(0, named=True)
    td = gloo.data.timeline
    cols = td.levels[-1][f"comm:{worst['dim']}"]
    row = td.rows.row[worst["first_rank"]]
    k = max((i for i in range(len(cols["y"])) if round(float(cols["y"][i]) - 0.2) == row
             and cols["waited_on"][i] == worst["waited_on"]), key=lambda i: cols["wait_ns"][i])
    page = Page(browser, reports["gloo"])
    try:
        page.show("Timeline")
        x0, x1 = float(cols["x0"][k]), float(cols["x1"][k])
        page.page.evaluate(ZOOM_JS, [x0 - 1, x1 + 1])
        page.page.wait_for_timeout(600)
        tip = page.hover("Timeline", (x0 + x1) / 2, float(cols["y"][k]))
        assert f"waited for: rank {worst['waited_on']}" in tip, tip
        assert f"root of the wait: rank {worst['root_rank']}" in tip and worst["root_rank"] == 5
        page.shot("gloo-wait-tooltip")
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
        page.show("Timeline")
        assert any(c["colours"] > 3 for c in page.canvases())
        assert page.text_problems() == []
        page.page.evaluate(ZOOM_JS, [10, 11])  # the level-of-detail callback swaps in finer bars
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


def test_whatif_tab_renders_with_no_text_overlapping(browser, synth, synth_whatif, tmp_path) -> None:
    """The What-if tab of the bundled sample (EPLB, placement, checkpoint): bars labelled in full,
    titles whole, the placement grids and the EP load drawn, no console error."""
    result, _ = synth_whatif
    path = write_report(synth.run, tmp_path / "whatif.html", analysis=synth.analysis, replay=synth.replay,
                        whatif=result).path
    page = Page(browser, path)
    try:
        assert page.tabs()[-1] == "What-if"
        page.show("What-if")
        page.shot("synth-what-if")
        assert sum(c["colours"] > 3 for c in page.canvases()) >= 5  # step, exposed, traffic, EP load, 2 grids
        assert "model vs model" in " ".join(page.page.locator(".tk").all_inner_texts())
        assert page.text_problems() == []
        assert page.errors == []
    finally:
        page.close()
