"""The Links tab's measured-vs-replayed panel draws a TelemetryComparison and nothing else."""

import pyarrow as pa
from bokeh.embed import file_html
from bokeh.resources import CDN

from tracekit import schema
from tracekit.telemetry.compare import compare_links
from tracekit.viz.links import NO_TELEMETRY, LinkComparison, comparison_data, comparison_panel

S = 1_000_000_000
T0 = 1_767_225_600 * S
HOSTILE = "<script>alert(1)</script>/mlx5_0:1--leaf0:1"


def _comparison(link: str = "h0/mlx5_0:1--leaf0:1"):
    rows = [{"link": link, "ts_ns": T0 + k * 4 * S, "interval_ns": 4 * S, "tx_bytes": 4e9, "rx_bytes": 0.0,
             "origin": "replay:observed", "flags": []} for k in range(8)]
    rows += [{"link": link, "ts_ns": T0 + k * 10 * S, "interval_ns": 10 * S, "tx_bytes": 0.0, "rx_bytes": 12.5e9,
              "origin": "telemetry", "link_end": "dst", "flags": [], "speed_bps": 400e9} for k in range(2)]
    rows[-1].update(rx_bytes=None, flags=["reset"])
    cols = {k: [r.get(k) for r in rows] for k in ("link", "ts_ns", "interval_ns", "tx_bytes", "rx_bytes", "origin",
                                                   "link_end", "flags", "speed_bps")}
    return compare_links(schema.conform("link_samples", pa.table(cols)))


def test_series_are_the_comparison_s_windows_in_gbps():
    data = comparison_data(_comparison(), has_telemetry=True, t0_ns=T0 - 5 * S)
    (s,) = data.series
    assert data.aligned and list(s.x_ms) == [5_000.0, 15_000.0]
    assert s.measured_gbps[0] == 10.0 and s.replayed_gbps[0] == 8.0  # 12.5 GB and 10 GB in 10 s
    assert s.flags == ["", "reset"]
    assert data.table[0].unexplained_bytes == 2.5e9


def test_one_line_instead_of_empty_panels():
    assert comparison_data(None, has_telemetry=False) == LinkComparison(message=NO_TELEMETRY)
    assert "tracekit replay RUN --topology observed" in comparison_data(None, has_telemetry=True).message


def test_link_names_are_escaped():
    html = file_html(comparison_panel(comparison_data(_comparison(HOSTILE), has_telemetry=True)), CDN)
    assert "<script>alert(1)</script>" not in html and "&lt;script&gt;" in html
