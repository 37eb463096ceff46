"""Shared Bokeh helpers: hover formatters (units a person reads), styling, escaped HTML."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from bokeh.models import CustomJSHover, Div
from bokeh.plotting import figure


def standalone_html(root: Any, *, cdn: bool, title: str) -> str:
    """Bokeh's `file_html` of `root` (BokehJS inlined unless `cdn`) without its document validation,
    a walk over every model that only logs and costs a fifth of the render; the tests check each
    report's layout with `validation_issues` instead."""
    from bokeh.embed import file_html
    from bokeh.resources import CDN, INLINE
    from bokeh.settings import settings

    validate = settings.perform_document_validation
    before = validate()
    validate.set_value(False)
    try:
        return file_html(root, CDN if cdn else INLINE, title=title)
    finally:
        validate.set_value(before)


def validation_issues(root: Any) -> list[str]:
    """What Bokeh's document validation says of a layout: its errors and warnings, one line each."""
    from bokeh.core.validation import check_integrity

    issues = check_integrity(list(root.references()))
    return [f"{i.code} {i.name}: {i.text}" for i in [*issues.error, *issues.warning]]


FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, Helvetica, Arial, sans-serif"


# Hover formatters (negative values mean "not applicable").


def duration_fmt() -> CustomJSHover:
    """A new hover formatter (a Bokeh model belongs to one document)."""
    return CustomJSHover(code="""
const v = value;
if (v == null || v < 0) return "n/a";
if (v >= 1e9) return (v / 1e9).toFixed(3) + " s";
if (v >= 1e6) return (v / 1e6).toFixed(3) + " ms";
if (v >= 1e3) return (v / 1e3).toFixed(1) + " µs";
return v.toFixed(0) + " ns";
""")


def bytes_fmt() -> CustomJSHover:
    """A new hover formatter (a Bokeh model belongs to one document)."""
    return CustomJSHover(code="""
const v = value;
if (v == null || v < 0) return "n/a";
if (v >= 1e9) return (v / 1e9).toFixed(2) + " GB";
if (v >= 1e6) return (v / 1e6).toFixed(2) + " MB";
if (v >= 1e3) return (v / 1e3).toFixed(1) + " KB";
return v.toFixed(0) + " B";
""")


def gbps_fmt() -> CustomJSHover:
    """A new hover formatter (a Bokeh model belongs to one document)."""
    return CustomJSHover(code="""
return (value == null || value < 0) ? "n/a" : value.toFixed(1) + " GB/s";
""")


def seq_fmt() -> CustomJSHover:
    """A new hover formatter (a Bokeh model belongs to one document)."""
    return CustomJSHover(code="return (value == null || value < 0) ? 'n/a' : String(value);")


def rank_fmt() -> CustomJSHover:
    """ "rank 5" for a rank column; "n/a" where it does not apply (-1)."""
    return CustomJSHover(code="return (value == null || value < 0) ? 'n/a' : 'rank ' + String(value);")


def lookup(values: Sequence[str]) -> CustomJSHover:
    """A formatter mapping an integer column to `values[i]` (Bokeh escapes the result)."""
    return CustomJSHover(args={"values": list(values)}, code="""
const i = Math.round(value);
return (i >= 0 && i < values.length) ? values[i] : "";
""")


def style(p: figure, *, title_size: str = "12pt") -> figure:
    """Quiet, consistent styling: light grid, readable fonts, no outline."""
    p.title.text_font_size = title_size
    p.title.text_font = FONT
    p.outline_line_color = None
    p.toolbar.logo = None
    p.background_fill_color = "#ffffff"
    for axis in (*p.xaxis, *p.yaxis):
        axis.axis_label_text_font_size = "10pt"
        axis.axis_label_text_font_style = "normal"
        axis.axis_label_text_font = FONT
        axis.major_label_text_font_size = "9pt"
        axis.major_label_text_font = FONT
    p.xgrid.grid_line_color = "#eeeeee"
    p.ygrid.grid_line_color = "#eeeeee"
    return p


def esc(value: Any) -> str:
    """HTML-escape any value taken from a trace."""
    return html.escape(str(value), quote=True)


CSS = f"""
<style>
.tk {{ font-family: {FONT}; font-size: 14px; color: #222; line-height: 1.45; max-width: 1400px; }}
.tk h2 {{ font-size: 18px; margin: 6px 0 8px; font-weight: 600; }}
.tk h3 {{ font-size: 15px; margin: 14px 0 6px; font-weight: 600; }}
.tk p.muted, .tk .muted {{ color: #666; }}
.tk ul {{ margin: 4px 0 8px 18px; padding: 0; }}
.tk li {{ margin: 2px 0; }}
.tk table {{ border-collapse: collapse; margin: 4px 0 10px; font-size: 13px; }}
.tk th, .tk td {{ border-bottom: 1px solid #e4e4e4; padding: 3px 10px 3px 0; text-align: left;
  vertical-align: top; }}
.tk th {{ color: #555; font-weight: 600; }}
.tk td.num {{ text-align: right; font-variant-numeric: tabular-nums; }}
.tk .note {{ background: #fff8e1; border-left: 3px solid #E69F00; padding: 6px 10px; margin: 6px 0;
  font-size: 13px; }}
.tk .kpi {{ display: inline-block; min-width: 150px; margin: 0 18px 10px 0; }}
.tk .kpi b {{ display: block; font-size: 20px; font-weight: 600; }}
.tk .kpi span {{ color: #666; font-size: 12px; }}
.tk .cell {{ display: inline-block; min-width: 44px; padding: 2px 4px; margin: 1px; border-radius: 3px;
  text-align: center; font-size: 12px; font-variant-numeric: tabular-nums; }}
.tk code {{ background: #f4f4f4; padding: 0 3px; border-radius: 3px; font-size: 12px; }}
.tk .warn {{ background: #fdecea; border-left: 3px solid #c0392b; padding: 6px 10px; margin: 6px 0;
  font-size: 13px; }}
.tk .small {{ font-size: 12px; }}
.tk ul.findings li.sev-error {{ color: #8e1b10; font-weight: 600; }}
.tk ul.findings li.sev-warning::marker {{ content: "⚠ "; color: #c0392b; }}
</style>
"""


def html_div(body: str, *, width: int | None = None) -> Div:
    """A Div of report HTML (the caller has escaped every trace string in `body`)."""
    kw: dict[str, Any] = {"sizing_mode": "stretch_width"} if width is None else {"width": width}
    return Div(text=CSS + f'<div class="tk">{body}</div>', **kw)


def note_div(notes: Sequence[str], *, width: int | None = None, warn: bool = False) -> Div | None:
    """Notices shown above a figure (resampling, truncation; with `warn`, what the data lacks:
    missing ranks, unknown hosts, assumed splits), or None when there are none."""
    if not notes:
        return None
    cls = "warn" if warn else "note"
    return html_div("".join(f'<div class="{cls}">{esc(n)}</div>' for n in notes), width=width)
