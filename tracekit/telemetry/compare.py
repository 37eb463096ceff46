"""Replayed vs measured bytes per link and telemetry window: how much of what the network saw the
trace explains.

Telemetry rows are turned to their link's src->dst direction (`oriented`); a link measured at
both ends keeps the end with more usable windows (the src end on a tie). Replayed bytes (origin
`replay:<topology>`, uniform windows) are re-binned onto each telemetry window through their
cumulative sum (bytes assumed even within a replay window). A window's `coverage` is the share of
it inside the replayed span: outside it the trace says nothing, so only covered windows count.
A window whose measured bytes are void (a flagged counter: reset, saturation, ambiguous wrap,
missed scrape) keeps its flags and no number, and is left out of the totals.
"""

from __future__ import annotations

import os

import msgspec
import numpy as np
import polars as pl
import pyarrow as pa

from tracekit import schema
from tracekit.results import Result, from_builtins
from tracekit.store import Run
from tracekit.telemetry import ORIGIN, oriented

#: Windows below this share of the replayed span are not compared.
MIN_COVERAGE = 0.999
#: A window's relative error is taken only where it measured at least this share of capacity.
MIN_UTIL_FOR_ERROR = 0.01


class LinkAgreement(Result, frozen=True, kw_only=True):
    """One link over the compared windows (both directions summed). `unexplained_bytes` and
    `explained_share` follow from the bytes: `__post_init__` sets them, whatever was given."""

    link: str
    end: str | None
    windows: int
    flagged_windows: int
    measured_bytes: float
    replayed_bytes: float
    unexplained_bytes: float = 0.0  # measured - replayed
    explained_share: float | None = None  # replayed / measured (None when nothing was measured)
    speed_bps: float | None
    worst_window_error: float | None  # max |replayed - measured| / measured over busy windows

    def __post_init__(self) -> None:
        m, r = self.measured_bytes, self.replayed_bytes
        msgspec.structs.force_setattr(self, "unexplained_bytes", m - r)
        msgspec.structs.force_setattr(self, "explained_share", r / m if m > 0 else None)


class TelemetryComparison(Result, frozen=True, kw_only=True):
    """Per link and telemetry window, measured vs replayed bytes (`windows`, a WINDOW_SCHEMA
    table, encoded as its rows), per-link totals sorted by disagreement (`links`), and what could
    not be compared (`notes`). The byte totals are the links' sums (`__post_init__` sets them)."""

    topology: str | None
    measured_bytes: float = 0.0
    replayed_bytes: float = 0.0
    links: list[LinkAgreement] = msgspec.field(default_factory=list)
    notes: list[str] = msgspec.field(default_factory=list)
    windows: pa.Table = msgspec.field(default_factory=lambda: schema.empty_table(WINDOW_SCHEMA))

    def __post_init__(self) -> None:
        msgspec.structs.force_setattr(self, "measured_bytes", float(sum(a.measured_bytes for a in self.links)))
        msgspec.structs.force_setattr(self, "replayed_bytes", float(sum(a.replayed_bytes for a in self.links)))
        if self.windows.schema != WINDOW_SCHEMA:  # read back from JSON rows
            rows = self.windows.to_pylist()
            msgspec.structs.force_setattr(self, "windows", pa.Table.from_pylist(rows, schema=WINDOW_SCHEMA)
                                          if rows else schema.empty_table(WINDOW_SCHEMA))

    @property
    def empty(self) -> bool:
        return not self.links


WINDOW_SCHEMA = pa.schema([
    ("link", pa.string()), ("ts_ns", pa.int64()), ("interval_ns", pa.int64()), ("coverage", pa.float64()),
    ("measured_tx", pa.float64()), ("measured_rx", pa.float64()), ("replayed_tx", pa.float64()),
    ("replayed_rx", pa.float64()), ("measured_bytes", pa.float64()), ("replayed_bytes", pa.float64()),
    ("unexplained_bytes", pa.float64()), ("flags", pa.list_(pa.string())),
])


def compare_links(link_samples: pa.Table, *, topology: str | None = None) -> TelemetryComparison:
    """Compare the telemetry rows of `link_samples` with the replayed rows of `topology` (default:
    the replay origin sharing the most links with telemetry)."""
    t = schema.conform("link_samples", link_samples)
    df = pl.from_arrow(t)
    assert isinstance(df, pl.DataFrame)
    df = df.with_columns(pl.col("origin").cast(pl.String), pl.col("link").cast(pl.String),
                         pl.col("link_end").cast(pl.String))
    tel = df.filter(pl.col("origin") == ORIGIN)
    if tel.height == 0:
        return TelemetryComparison(topology=topology, notes=["no telemetry in the run"])
    replays = df.filter(pl.col("origin").str.starts_with("replay:"))
    if replays.height == 0:
        return TelemetryComparison(topology=topology,
                                   notes=["no replay in the run: run `tracekit replay RUN --topology observed`"])
    tel_links = set(tel.filter(pl.col("link_end").is_not_null())["link"].unique().to_list())
    origins = replays["origin"].unique().sort().to_list()
    if topology is None:
        shared = {o: len(tel_links & set(replays.filter(pl.col("origin") == o)["link"].unique().to_list()))
                  for o in origins}
        origin = max(origins, key=lambda o: (shared[o], o == "replay:observed"))
    else:
        origin = f"replay:{topology}"
        if origin not in origins:
            return TelemetryComparison(topology=topology, notes=[f"no replay on {topology!r} in the run"])
    name = origin.split(":", 1)[1]
    rep = replays.filter(pl.col("origin") == origin)
    rep_links = set(rep["link"].unique().to_list())
    notes = []
    unmapped = tel.filter(pl.col("link_end").is_null())["link"].n_unique()
    if unmapped:
        notes.append(f"{unmapped} telemetry port(s) have no link in the fabric (no ibnetdiscover or link map "
                     "entry) and are not compared")
    off_topology = sorted(tel_links - rep_links)
    if off_topology:
        notes.append(f"{len(off_topology)} measured link(s) are not on the replayed topology {name!r} "
                     f"(e.g. {off_topology[0]}); replay on the observed fabric to compare them")
    both = sorted(tel_links & rep_links)
    if not both:
        notes.append(f"no link is both measured and replayed on {name!r}")
        return TelemetryComparison(topology=name, notes=notes)
    tel = pl.from_arrow(oriented(tel.filter(pl.col("link").is_in(both)).to_arrow()))
    assert isinstance(tel, pl.DataFrame)
    tel = tel.with_columns(pl.col("link").cast(pl.String), pl.col("link_end").cast(pl.String))
    r_lo = int(rep["ts_ns"].min())
    r_hi = int((rep["ts_ns"] + rep["interval_ns"]).max())
    cols: dict[str, list] = {f.name: [] for f in WINDOW_SCHEMA}
    agreements = []
    outside = 0
    for link in both:
        mine = tel.filter(pl.col("link") == link)
        usable = mine.group_by("link_end").agg(pl.col("tx_bytes").is_not_null().sum().alias("n"))
        ends = sorted(usable.iter_rows(named=True), key=lambda r: (-r["n"], r["link_end"] != "src"))
        end = ends[0]["link_end"]
        mine = mine.filter(pl.col("link_end") == end).sort("ts_ns")
        r = rep.filter(pl.col("link") == link).sort("ts_ns")
        # Times relative to the replay's start: ns since the epoch do not fit a float64 exactly.
        edges = (np.concatenate([r["ts_ns"].to_numpy(), [int(r["ts_ns"][-1] + r["interval_ns"][-1])]])
                 - r_lo).astype(float)
        cum_tx = np.concatenate([[0.0], np.cumsum(r["tx_bytes"].fill_null(0.0).to_numpy())])
        cum_rx = np.concatenate([[0.0], np.cumsum(r["rx_bytes"].fill_null(0.0).to_numpy())])
        a = (mine["ts_ns"].to_numpy() - r_lo).astype(float)
        b = a + mine["interval_ns"].to_numpy()
        coverage = np.clip((np.minimum(b, r_hi - r_lo) - np.maximum(a, 0.0)) / (b - a), 0.0, 1.0)
        keep = coverage >= MIN_COVERAGE
        outside += int((~keep).sum())
        if not keep.any():
            continue
        rep_tx = np.interp(b, edges, cum_tx) - np.interp(a, edges, cum_tx)
        rep_rx = np.interp(b, edges, cum_rx) - np.interp(a, edges, cum_rx)
        m_tx = mine["tx_bytes"].to_numpy().astype(float)
        m_rx = mine["rx_bytes"].to_numpy().astype(float)
        measured = m_tx + m_rx
        replayed = rep_tx + rep_rx
        flags = mine["flags"].to_list()
        ts = mine["ts_ns"].to_numpy()
        for k in np.flatnonzero(keep).tolist():
            valid = not np.isnan(measured[k])
            for key, value in (("link", link), ("ts_ns", int(ts[k])), ("interval_ns", int(b[k] - a[k])),
                               ("coverage", float(coverage[k])),
                               ("measured_tx", float(m_tx[k]) if valid else None),
                               ("measured_rx", float(m_rx[k]) if valid else None),
                               ("replayed_tx", float(rep_tx[k])), ("replayed_rx", float(rep_rx[k])),
                               ("measured_bytes", float(measured[k]) if valid else None),
                               ("replayed_bytes", float(replayed[k])),
                               ("unexplained_bytes", float(measured[k] - replayed[k]) if valid else None),
                               ("flags", list(flags[k] or []))):
                cols[key].append(value)
        ok = keep & ~np.isnan(measured)
        speed = mine["speed_bps"].drop_nulls()
        bps = float(speed.max()) if speed.len() else None
        busy = ok & (measured * 8.0 > MIN_UTIL_FOR_ERROR * (bps or 0.0) * (b - a) / 1e9) & (measured > 0)
        err = np.abs(replayed[busy] - measured[busy]) / measured[busy]
        agreements.append(LinkAgreement(
            link=link, end=end, windows=int(ok.sum()), flagged_windows=int((keep & np.isnan(measured)).sum()),
            measured_bytes=float(measured[ok].sum()), replayed_bytes=float(replayed[ok].sum()), speed_bps=bps,
            worst_window_error=float(err.max()) if err.size else None))
    if outside:
        notes.append(f"{outside} telemetry window(s) fall outside the traced span (partly or wholly) and are "
                     "not compared")
    agreements.sort(key=lambda x: (-abs(x.unexplained_bytes), x.link))
    return TelemetryComparison(topology=name, windows=pa.table(cols, schema=WINDOW_SCHEMA), links=agreements,
                               notes=notes)


def load_comparison(run: Run | str | os.PathLike[str]) -> TelemetryComparison | None:
    """The stored comparison of a run (results/links.json), or None."""
    run = run if isinstance(run, Run) else Run(run)
    doc = run.read_json("links")
    return from_builtins(doc, TelemetryComparison) if doc else None


def format_comparison(result: TelemetryComparison, *, top: int = 10) -> str:
    """Lines for the CLI: the links where measured and replayed disagree most."""
    lines = []
    if result.links:
        m, r = result.measured_bytes, result.replayed_bytes
        lines.append(f"telemetry vs replay on {result.topology}: {len(result.links)} link(s), measured "
                     f"{m / 1e9:.3f} GB, replayed {r / 1e9:.3f} GB, the trace explains "
                     f"{(r / m if m else 0.0):.1%} of the measured bytes")
        lines.append(f"  {'link':<40} {'measured':>11} {'replayed':>11} {'explained':>9} {'worst win':>9} flagged")
        for a in result.links[:top]:
            share = f"{a.explained_share:.1%}" if a.explained_share is not None else "-"
            worst = f"{a.worst_window_error:.1%}" if a.worst_window_error is not None else "-"
            lines.append(f"  {a.link[:40]:<40} {a.measured_bytes / 1e6:>8.1f} MB {a.replayed_bytes / 1e6:>8.1f} MB "
                         f"{share:>9} {worst:>9} {a.flagged_windows}")
        if len(result.links) > top:
            lines.append(f"  ... {len(result.links) - top} more in results/links.json")
    lines += [f"note: {n}" for n in result.notes]
    return "\n".join(lines)
