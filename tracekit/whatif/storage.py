"""North-south what-ifs: checkpoint writes and data loading as flows between every rank and storage
nodes, on a front-end network beside the back-end fabric or on the back-end itself.

The topology of the baseline gets storage nodes (and, for `via=frontend`, a front-end network when
it has none); those carry no collective traffic, so the baseline replay holds for it unchanged.
Each selected step releases, at one moment of the step's traced window, `bytes_per_rank` from every
rank striped evenly over the storage nodes (writes for a checkpoint, reads for a data load). The
writes are asynchronous: training does not wait for them, but collectives sharing links with them
slow down. When the run has telemetry (`link_samples` of origin "telemetry"), the bytes a link
carried beyond what the baseline replay puts on it are reported as north-south/other traffic.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from tracekit import schema
from tracekit.replay import TopologyResult, parse_spec
from tracekit.replay.storage import StorageFlows
from tracekit.whatif.core import (
    Baseline,
    ScenarioResult,
    Slowdown,
    WhatIfError,
    as_bytes,
    as_int,
    instance_times,
    parse_params,
)

FIELDS = ("bytes_per_rank", "every", "at", "via", "storage", "frontend_gbps", "storage_gbps")
DEFAULT_FRONTEND_GBPS = 200.0
SLOWER = 1e-6  # relative: an instance counts as slowed above this


def parse_storage_params(kind: str, text: str) -> dict[str, str]:
    """Validated fields of a `checkpoint:` or `dataload:` scenario, defaults filled in."""
    p = parse_params(kind, text, FIELDS)
    if "bytes_per_rank" not in p:
        raise WhatIfError(f"{kind}: field 'bytes_per_rank' is required (e.g. bytes_per_rank=4GB)")
    as_bytes(kind, "bytes_per_rank", p["bytes_per_rank"])
    p.setdefault("every", "1")
    p.setdefault("at", "end" if kind == "checkpoint" else "start")
    p.setdefault("via", "frontend")
    p.setdefault("storage", "1")
    as_int(kind, "every", p["every"], minimum=1)
    as_int(kind, "storage", p["storage"], minimum=1)
    _fraction(kind, p["at"])
    if p["via"] not in ("frontend", "backend"):
        raise WhatIfError(f"{kind}: field 'via' is frontend or backend, got {p['via']!r}")
    for key in ("frontend_gbps", "storage_gbps"):
        if key in p:
            try:
                ok = float(p[key]) > 0
            except ValueError:
                ok = False
            if not ok:
                raise WhatIfError(f"{kind}: field {key!r} expects a positive number, got {p[key]!r}")
    return p


def _fraction(kind: str, at: str) -> float:
    named = {"start": 0.0, "end": 1.0}
    if at in named:
        return named[at]
    try:
        value = float(at)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise WhatIfError(f"{kind}: field 'at' is start, end or a fraction of the step in 0..1, got {at!r}")
    return value


def storage_traffic(base: Baseline, scenario: Any) -> ScenarioResult:
    """Replay the run with the scenario's checkpoint or data-loading flows and compare."""
    kind, p = scenario.kind, scenario.params
    spec = parse_spec(base.topology)
    changes: dict[str, Any] = {"storage": int(p["storage"]), "storage_network": p["via"]}
    if "storage_gbps" in p:
        changes["storage_gbps"] = float(p["storage_gbps"])
    if p["via"] == "frontend" and ("frontend_gbps" in p or not spec.frontend_gbps):
        changes["frontend_gbps"] = float(p.get("frontend_gbps", DEFAULT_FRONTEND_GBPS))
    spec = spec.replace(**changes)
    flows = storage_flows(base.tables, base.placement.slots, kind=kind,
                                   bytes_per_rank=as_bytes(kind, "bytes_per_rank", p["bytes_per_rank"]),
                                   every=int(p["every"]), at=_fraction(kind, p["at"]), storage=int(p["storage"]))
    after = base.replay_with(topology=spec, storage=flows)
    result = base.compare(scenario.text, kind, after)
    durations = dict(after.storage_ns)
    if kind == "checkpoint":
        result.checkpoint_ns = max(durations.values()) if durations else None
    result.slowed = slowed(base.result, after)
    result.details = {"transfer_ns": durations, "network": p["via"],
                      "storage_nodes": int(p["storage"]), "storage_gbps": spec.storage_gbps,
                      "frontend_gbps": spec.frontend_gbps if p["via"] == "frontend" else None,
                      "storage_bytes": after.tier_bytes.get("storage", {}).get("storage", 0)}
    result.notes += [
        f"{len(durations)} {'checkpoint' if kind == 'checkpoint' else 'load'}(s) of {p['bytes_per_rank']} per rank "
        f"at {p['at']} of every {p['every']} step(s), striped over {p['storage']} storage node(s) on the "
        f"{p['via']}" + (f" ({spec.frontend_gbps:g} Gb/s front-end NIC per host)" if p["via"] == "frontend" else ""),
        "the transfers are asynchronous: training does not wait for them; collectives sharing links slow down",
    ]
    other = other_traffic(base.tables.get("link_samples"), base.result)
    if other is None:
        result.notes.append("no link telemetry in the run: traffic the trace does not hold (north-south, other "
                            "jobs) cannot be measured")
    elif not other:
        result.notes.append("link telemetry present, but none of its links is named as in the replayed topology "
                            "(a link map naming them like h0/nic0--p0/leaf0 makes them comparable)")
    else:
        extra = [x for x in other if x["other_bytes"] > 0]
        result.details["other_traffic"] = extra
        result.notes.append(f"telemetry on {len(other)} link(s): {sum(x['other_bytes'] for x in extra) / 1e9:.3g} GB "
                            f"on {len(extra)} of them beyond what the baseline replay explains (north-south/other)")
    return result


def step_windows(tables: Mapping[str, pa.Table]) -> dict[int, tuple[float, float]]:
    """Per step, the first start and last end of its timed events on the run's common clock."""
    events = pl.from_arrow(schema.conform("events", tables["events"]))
    ranks = pl.from_arrow(schema.conform("ranks", tables.get("ranks"))).select(
        "rank", pl.col("clock_offset_ns").fill_null(0).alias("_off"))
    ev = (events.filter(pl.col("step").is_not_null() & pl.col("ts_ns").is_not_null()
                        & pl.col("kind").cast(pl.Utf8).is_in(["compute", "comm", "memcpy", "memset"]))
          .join(ranks, on="rank", how="left")
          .with_columns((pl.col("ts_ns") + pl.col("_off").fill_null(0)).alias("_t"))
          .group_by("step").agg(pl.col("_t").min().alias("start"),
                                (pl.col("_t") + pl.col("dur_ns").fill_null(0)).max().alias("end"))
          .sort("step"))
    return {int(s): (float(a), float(b)) for s, a, b in ev.iter_rows()}


def storage_flows(tables: Mapping[str, pa.Table], slots: Mapping[int, tuple[int, int]], *, kind: str,
                  bytes_per_rank: int, every: int, at: float, storage: int) -> StorageFlows:
    """Flows of every rank to (checkpoint) or from (dataload) each storage node, at fraction `at`
    of every `every`-th step's window."""
    windows = step_windows(tables)
    if not windows:
        raise WhatIfError(f"{kind}: the run has no steps to place the transfers in")
    chosen = [s for i, s in enumerate(sorted(windows)) if (i + 1) % every == 0]
    if not chosen:
        raise WhatIfError(f"{kind}: every={every} selects none of the run's {len(windows)} step(s)")
    rank, node, nbytes, release, tag = [], [], [], [], []
    tags = []
    for t, s in enumerate(chosen):
        start, end = windows[s]
        tags.append(f"{kind}@step{s}")
        for r in sorted(slots):
            for i in range(storage):
                rank.append(r)
                node.append(i)
                nbytes.append(bytes_per_rank / storage)
                release.append(start + at * (end - start))
                tag.append(t)
    write = [kind == "checkpoint"] * len(rank)
    return StorageFlows.from_lists(rank, node, nbytes, release, write, tag, tags)


def slowed(before: TopologyResult, after: TopologyResult) -> list[Slowdown]:
    """Instances whose replayed time grew, slowest first."""
    base = instance_times(before)
    out = []
    for key, inst in instance_times(after).items():
        ref = base.get(key)
        if ref is None or inst.replayed_ns <= ref.replayed_ns * (1 + SLOWER):
            continue
        out.append(Slowdown(group=str(inst.group), seq=int(inst.seq), op=inst.op, dim=inst.dim,
                            baseline_ns=int(ref.replayed_ns), scenario_ns=int(inst.replayed_ns)))
    return sorted(out, key=lambda x: (x.baseline_ns - x.scenario_ns, x.group, x.seq))


def other_traffic(link_samples: pa.Table | None, replayed: TopologyResult) -> list[dict[str, Any]] | None:
    """Per link present in both telemetry and the baseline replay (largest first), the bytes
    telemetry counted over the replayed span beyond those the replay put there (0 when it counted
    no more); None without telemetry."""
    if link_samples is None or link_samples.num_rows == 0:
        return None
    tel = pl.from_arrow(schema.conform("link_samples", link_samples)).with_columns(
        pl.col("origin").cast(pl.Utf8), pl.col("link").cast(pl.Utf8))
    tel = tel.filter(pl.col("origin") == "telemetry")
    if tel.height == 0:
        return None
    rep = pl.from_arrow(replayed.link_samples).with_columns(pl.col("link").cast(pl.Utf8))
    if rep.height == 0:
        return []
    origin = int(rep.get_column("ts_ns").min())
    hi = float((rep.get_column("ts_ns") + rep.get_column("interval_ns")).max() - origin)
    start = (tel.get_column("ts_ns") - origin).cast(pl.Float64).to_numpy()
    span = tel.get_column("interval_ns").cast(pl.Float64).fill_null(0).to_numpy()
    overlap = np.clip(np.minimum(start + span, hi) - np.maximum(start, 0.0), 0, None)
    share = np.where(span > 0, overlap / np.where(span > 0, span, 1), 0.0)
    tel = tel.with_columns(((pl.col("tx_bytes").fill_null(0) + pl.col("rx_bytes").fill_null(0))
                            * pl.Series(share)).alias("_b"))
    measured = tel.group_by("link").agg(pl.col("_b").sum().alias("telemetry_bytes"))
    modelled = rep.group_by("link").agg((pl.col("tx_bytes") + pl.col("rx_bytes")).sum().alias("replay_bytes"))
    both = measured.join(modelled, on="link", how="inner").with_columns(
        (pl.col("telemetry_bytes") - pl.col("replay_bytes")).clip(lower_bound=0).alias("other_bytes"))
    rows = both.sort(["other_bytes", "link"], descending=[True, False])
    return [{"link": r["link"], "telemetry_bytes": round(r["telemetry_bytes"]),
             "replay_bytes": round(r["replay_bytes"]), "other_bytes": round(r["other_bytes"])}
            for r in rows.iter_rows(named=True)]
