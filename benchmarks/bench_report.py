"""Benchmark the HTML report: data shaping, rendering, file size and (optionally) browser render time.

    python benchmarks/bench_report.py                      # 8, 128 and 512 ranks, 1 step
    python benchmarks/bench_report.py --ranks 128 --kernels 20 --browser
    python benchmarks/bench_report.py --screenshot docs/img/timeline.png   # the README picture

Synthetic runs come from `tracekit.synth` (8 GPUs per host, PP 4 where it fits, EP 8).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from tracekit.synth import make_run_tables, write_run
from tracekit.viz.report import render
from tracekit.workflows import report_data as build_report_data

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def browser_render_s(path: Path) -> float:
    """Seconds from navigation until BokehJS reports the document idle, in headless Chromium."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
        page = b.new_page(viewport={"width": 1480, "height": 1000})
        start = time.perf_counter()
        page.goto(path.resolve().as_uri())
        page.wait_for_function("() => window.Bokeh && Bokeh.documents.length > 0 && Bokeh.documents[0].is_idle",
                               timeout=300_000)
        elapsed = time.perf_counter() - start
        b.close()
    return elapsed


SHOT_JS = """() => {
  const models = [...Bokeh.documents[0]._all_models.values()];
  const box = (t) => Bokeh.index.find_one(models.find((m) => m.title && m.title.text
                                                      && m.title.text.startsWith(t))).el.getBoundingClientRect();
  const a = box("Timeline"), b = box("Whole run");
  return {x: a.left, y: a.top, width: Math.max(a.width, b.width), height: b.bottom - a.top};
}"""


def screenshot(out: Path, tmp: Path) -> None:
    """The timeline of a 16-rank synthetic run as a small PNG (64 colours)."""
    from PIL import Image
    from playwright.sync_api import sync_playwright

    from tracekit.workflows import report as write_report

    tables, _ = make_run_tables(hosts=4, gpus_per_host=4, pp=2, ep=4, steps=2)
    path = write_report(write_run(tables, tmp / "shot"), tmp / "shot.html").path
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
        page = b.new_page(viewport={"width": 1420, "height": 1000})
        page.goto(path.resolve().as_uri())
        page.wait_for_function("() => window.Bokeh && Bokeh.documents.length > 0 && Bokeh.documents[0].is_idle")
        page.locator(".bk-tab", has_text="Timeline").first.click()
        page.wait_for_timeout(800)
        page.screenshot(path=str(tmp / "shot.png"), clip=page.evaluate(SHOT_JS))
        b.close()
    img = Image.open(tmp / "shot.png").convert("RGB").quantize(colors=64, method=Image.Quantize.MEDIANCUT)
    img.save(out, optimize=True)
    print(f"wrote {out} ({out.stat().st_size / 1e3:.0f} KB)")


def bench(ranks: int, steps: int, kernels: int, browser: bool, out_dir: Path) -> dict[str, float]:
    hosts = max(ranks // 8, 1)
    gpus = min(ranks, 8)
    pp = 4 if ranks >= 32 else 2
    ep = 8 if ranks // pp >= 8 else 2
    tables, _ = make_run_tables(hosts=hosts, gpus_per_host=gpus, pp=pp, ep=ep, steps=steps,
                                kernels_per_block=kernels)
    run = write_run(tables, out_dir / f"run{ranks}")
    t0 = time.perf_counter()
    data = build_report_data(run)
    t1 = time.perf_counter()
    text = render(data)
    t2 = time.perf_counter()
    path = out_dir / f"report{ranks}.html"
    path.write_text(text, encoding="utf-8")
    td = data.timeline
    row = {"ranks": ranks, "events": tables["events"].num_rows, "intervals": td.raw_intervals,
           "merged_full": td.merged_full_view, "merged_finest": td.merged_finest, "data_s": t1 - t0,
           "render_s": t2 - t1, "size_mb": path.stat().st_size / 1e6}
    if browser:
        row["browser_s"] = browser_render_s(path)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, nargs="*", default=[8, 128, 512], help="world sizes to run")
    ap.add_argument("--steps", type=int, default=1, help="training steps")
    ap.add_argument("--kernels", type=int, default=3, help="compute kernels per block (more = denser timeline)")
    ap.add_argument("--browser", action="store_true", help="also time the render in headless Chromium")
    ap.add_argument("--screenshot", type=Path, help="only write the README timeline picture to this path")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.screenshot:
            screenshot(args.screenshot, Path(tmp))
            return
        for ranks in args.ranks:
            row = bench(ranks, args.steps, args.kernels, args.browser, Path(tmp))
            print("  ".join(f"{k}={v:,.2f}" if isinstance(v, float) else f"{k}={v:,}" for k, v in row.items()),
                  flush=True)


if __name__ == "__main__":
    main()
