"""What differs in how two runs were set up: versions, layout, NCCL's choices, the fabric it used."""

from __future__ import annotations

from collections.abc import Mapping

import polars as pl
import pyarrow as pa

from tracekit._text import fmt_bytes
from tracekit.analysis import AnalysisResult
from tracekit.diff.matching import frame
from tracekit.diff.results import SetupChange
from tracekit.store import Run

#: EP imbalance (max/mean of the bytes received) is a change when it moves by more than this share.
EP_IMBALANCE_SHARE = 0.05


def _table(run: Run | None, tabs: Mapping[str, pa.Table] | None, name: str) -> pl.DataFrame | None:
    if tabs is not None:
        t = tabs.get(name)
        return frame(t) if t is not None and t.num_rows else None
    if run is not None and run.has(name):
        t = run.table(name)
        return frame(t) if t.num_rows else None
    return None


def _set(values: list) -> str:
    vals = sorted({str(v) for v in values if v is not None})
    return ", ".join(vals) if vals else "-"


def setup_changes(ra: AnalysisResult, rb: AnalysisResult, run_a: Run | None, run_b: Run | None,
                  tabs_a: Mapping[str, pa.Table] | None, tabs_b: Mapping[str, pa.Table] | None) -> list[SetupChange]:
    """Every setup item whose value differs between A and B, in a fixed order."""
    items: list[tuple[str, str, str]] = []
    rk_a, rk_b = frame(ra.ranks), frame(rb.ranks)
    items.append(("world size", str(rk_a.height), str(rk_b.height)))
    items.append(("hosts", str(rk_a.get_column("host").n_unique()), str(rk_b.get_column("host").n_unique())))
    if "nccl_version" in rk_a.columns and "nccl_version" in rk_b.columns:
        items.append(("NCCL version", _set(rk_a.get_column("nccl_version").to_list()),
                      _set(rk_b.get_column("nccl_version").to_list())))
    items.append(("steps", str(ra.step_times.num_rows), str(rb.step_times.num_rows)))
    items.append(("process groups", _layout(frame(ra.groups)), _layout(frame(rb.groups))))
    ca, cb = frame(ra.collectives), frame(rb.collectives)
    for item, col in (("algorithm", "algo"), ("protocol", "proto"), ("dtypes", "dtype")):
        if col in ca.columns and col in cb.columns:
            items.append((item, _set(ca.get_column(col).to_list()), _set(cb.get_column(col).to_list())))
    items.append(("message sizes", _sizes(ca), _sizes(cb)))
    ch_a, ch_b = _table(run_a, tabs_a, "channels"), _table(run_b, tabs_b, "channels")
    if ch_a is not None and ch_b is not None:
        items.append(("channels", _channels(ch_a), _channels(ch_b)))
        for item, col in (("NICs", "nic"), ("transports", "detail")):
            items.append((item, _set(ch_a.get_column(col).to_list()), _set(ch_b.get_column(col).to_list())))
        items.append(("PXN", _pxn(ch_a), _pxn(ch_b)))
    elif (ch_a is None) != (ch_b is None):
        items.append(("channels", "-" if ch_a is None else _channels(ch_a), "-" if ch_b is None else _channels(ch_b)))
    ep_a, ep_b = _ep_imbalance(ra), _ep_imbalance(rb)
    if ep_a is not None and ep_b is not None and abs(ep_b - ep_a) > EP_IMBALANCE_SHARE * ep_a:
        items.append(("EP imbalance", f"{ep_a:.2f}x", f"{ep_b:.2f}x"))
    links_a, links_b = _table(run_a, tabs_a, "topology_links"), _table(run_b, tabs_b, "topology_links")
    if links_a is not None and links_b is not None:
        items.append(("fabric links", _fabric(links_a), _fabric(links_b)))
    items += telemetry_items(_table(run_a, tabs_a, "link_samples"), _table(run_b, tabs_b, "link_samples"),
                             _table(run_a, tabs_a, "counters"), _table(run_b, tabs_b, "counters"))
    return [SetupChange(item=i, a=a, b=b) for i, a, b in items if a != b]


#: Congestion and loss counters compared per second of telemetry, A against B.
CONGESTION = ("pfc_pause", "ecn_marked", "xmit_wait", "discards", "errors")


def telemetry_items(ls_a: pl.DataFrame | None, ls_b: pl.DataFrame | None, co_a: pl.DataFrame | None,
                    co_b: pl.DataFrame | None) -> list[tuple[str, str, str]]:
    """Per-link telemetry where both runs have it: mean link utilization and the busiest link
    (the larger of tx and rx per sample, telemetry samples only), and each congestion counter's
    increase per second summed over ports."""
    items: list[tuple[str, str, str]] = []
    util_a, util_b = _utilization(ls_a), _utilization(ls_b)
    if util_a is not None and util_b is not None:
        items.append(("link utilization (mean)", f"{util_a[0]:.0%}", f"{util_b[0]:.0%}"))
        items.append(("busiest link", f"{util_a[1]} {util_a[2]:.0%}", f"{util_b[1]} {util_b[2]:.0%}"))
    rates_a, rates_b = _counter_rates(co_a), _counter_rates(co_b)
    if rates_a is not None and rates_b is not None:
        for metric in CONGESTION:
            if metric in rates_a or metric in rates_b:
                items.append((f"{metric} per second", f"{rates_a.get(metric, 0.0):.3g}",
                              f"{rates_b.get(metric, 0.0):.3g}"))
    return items


def _utilization(ls: pl.DataFrame | None) -> tuple[float, str, float] | None:
    if ls is None or "origin" not in ls.columns:
        return None
    tel = ls.filter(pl.col("origin") == "telemetry").with_columns(
        pl.max_horizontal(pl.col("tx_util"), pl.col("rx_util")).alias("_u")).filter(pl.col("_u").is_not_null())
    if tel.height == 0:
        return None
    per = tel.group_by("link").agg(pl.col("_u").mean()).sort(["_u", "link"], descending=[True, False])
    return float(per.get_column("_u").mean()), str(per.item(0, "link")), float(per.item(0, "_u"))


def _counter_rates(co: pl.DataFrame | None) -> dict[str, float] | None:
    if co is None:
        return None
    c = co.filter(pl.col("metric").is_in(list(CONGESTION)) & pl.col("value").is_not_null())
    if c.height == 0:
        return {}
    span = (c.get_column("ts_ns").max() - c.get_column("ts_ns").min()) / 1e9
    rises = c.group_by("device", "port", "metric").agg((pl.col("value").max() - pl.col("value").min()).alias("d"))
    totals = dict(rises.group_by("metric").agg(pl.col("d").sum()).iter_rows())
    return {m: float(v) / span if span > 0 else float(v) for m, v in totals.items()}


def _layout(groups: pl.DataFrame) -> str:
    if groups.height == 0:
        return "-"
    counts: dict[str, int] = {}
    for dims, size in groups.select("dims", "size").iter_rows():
        key = f"{'/'.join(dims or ['?'])}x{size}"
        counts[key] = counts.get(key, 0) + 1
    return ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))


def _sizes(coll: pl.DataFrame) -> str:
    if coll.height == 0:
        return "-"
    parts = []
    for op, sizes in (coll.filter(pl.col("in_bytes").is_not_null()).group_by("op")
                      .agg(pl.col("in_bytes").unique().sort()).sort("op").iter_rows()):
        shown = ", ".join(fmt_bytes(s) for s in sizes[:4]) + (f" (+{len(sizes) - 4})" if len(sizes) > 4 else "")
        parts.append(f"{op}: {shown}")
    return "; ".join(parts) or "-"


def _channels(ch: pl.DataFrame) -> str:
    per = ch.group_by("group", "rank").agg(pl.col("channel").n_unique())
    return _set(per.get_column("channel").unique().to_list())


def _pxn(ch: pl.DataFrame) -> str:
    if "proxy_rank" not in ch.columns:
        return "-"
    used = ch.filter(pl.col("proxy_rank").is_not_null() & (pl.col("proxy_rank") != pl.col("rank"))).height
    return "used" if used else "not used"


def _ep_imbalance(r: AnalysisResult) -> float | None:
    ep = frame(r.ep_groups)
    if ep.height == 0 or "imbalance" not in ep.columns:
        return None
    vals = ep.get_column("imbalance").drop_nulls()
    return float(vals.median()) if vals.len() else None


def _fabric(links: pl.DataFrame) -> str:
    n = links.height
    gbps = _set(links.get_column("gbps").to_list()) if "gbps" in links.columns else "-"
    return f"{n} links ({gbps} Gb/s)"
