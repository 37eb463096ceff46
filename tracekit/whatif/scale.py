"""Scale what-if: the job at a size it was not traced at (`scale:dp=K`, `scale:ep=E`,
`scale:hosts=H`), replayed on a topology grown with it.

Weak scaling: every rank computes as traced. The run's ranks are replicated into K copies
(`tracekit.replay.replicate`): DP all-reduces span all copies (K times the ranks, the gradient
bytes per rank as traced), EP all-to-alls are re-split for the new EP degree from the traced
traffic matrix, every other call repeats in each copy. The topology is the what-if's spec with
K times the hosts: the same leaves per host, spines and oversubscription per tier, more of them
(`grow`); a spec that states its hosts is kept as given, and must hold them.
"""

from __future__ import annotations

import math

import polars as pl

from tracekit import schema
from tracekit.replay import ReplayError, TopologySpec, parse_spec
from tracekit.replay.replicate import Replication, ReplicationError
from tracekit.replay.topology import TopologyError, leaves_per_plane
from tracekit.whatif.core import Baseline, ScenarioResult, WhatIfError
from tracekit.whatif.experts import ExpertLoads, expert_tokens

#: Link windows of a scale replay: none (its link samples are not shown, and windows cost a last
#: simulation of every flow and time per flow in each).
LINK_WINDOWS = 0
ASSUMPTIONS = ("weak scaling: per-rank compute, micro-batches and gradient bytes per rank as traced; only the "
               "communication is re-simulated at the new size",
               "copies run in lockstep: each collective takes as long as its slowest copy, and the traced ranks' "
               "schedule stands for every copy's")


def grow(spec: TopologySpec, hosts: int) -> tuple[TopologySpec, list[str]]:
    """The spec with `hosts` hosts, grown tier by tier: leaves and spines keep their radix and
    oversubscription; when one spine tier cannot join the leaves (more leaves per plane than a
    spine has ports), a core tier is added (`tiers=3`, core 1:1 unless given). A spec that gives
    its hosts keeps them (an error when fewer)."""
    notes: list[str] = []
    if "hosts" in spec.given:
        if (spec.hosts or 0) < hosts:
            raise WhatIfError(f"scale: the topology states {spec.hosts} hosts; the scaled job needs {hosts}")
        return spec, notes
    out = spec.replace(hosts=hosts)
    if out.kind != "single-switch" and out.tiers == 2 and leaves_per_plane(out) > out.leaf_radix:
        out = out.replace(tiers=3)
        notes.append(f"{leaves_per_plane(spec.replace(hosts=hosts))} leaves per plane exceed what one spine tier of "
                     f"radix {spec.leaf_radix} joins: a core tier is added (core oversubscription "
                     f"{out.core_oversub:g}:1)")
    return out, notes


def scale(base: Baseline, *, dp: int | None = None, ep: int | None = None, hosts: int | None = None,
          loads: ExpertLoads | None = None, scenario: str | None = None) -> ScenarioResult:
    """Replay the run with its DP degree multiplied by `dp` (or grown to `hosts` hosts) and its EP
    degree set to `ep`, on the baseline's topology grown to match; compare with the baseline.

    `loads` (per-expert token counts and the rank of each expert) re-split a larger EP degree
    expert by expert: each rank's experts are cut into contiguous blocks of whole experts, and a
    block's tokens go where the block goes; without them a rank's experts spread evenly."""
    name = scenario or "scale:" + ",".join(f"{k}={v}" for k, v in (("dp", dp), ("ep", ep), ("hosts", hosts)) if v)
    traced_hosts = len(base.placement.hosts)
    if dp is not None and hosts is not None:
        raise WhatIfError("scale: give dp or hosts, not both (hosts=H means dp = H / the traced hosts)")
    if hosts is not None:
        if hosts % traced_hosts:
            raise WhatIfError(f"scale: hosts={hosts} is not a multiple of the run's {traced_hosts} hosts")
        dp = hosts // traced_hosts
    copies = dp or 1
    coll = pl.from_arrow(schema.conform("collectives", base.tables["collectives"]))
    dims = coll.select(pl.col("group").cast(pl.Utf8), pl.col("dim").cast(pl.Utf8), pl.col("op").cast(pl.Utf8)).unique()
    dp_groups = frozenset(dims.filter(pl.col("dim") == "DP").get_column("group").to_list())
    ep_groups = frozenset(dims.filter((pl.col("dim") == "EP") & (pl.col("op") == "all_to_all"))
                          .get_column("group").to_list())
    if copies > 1 and not dp_groups:
        raise WhatIfError("scale: the run has no DP collective to widen (no call classified DP)")
    if ep is not None and not ep_groups:
        raise WhatIfError("scale: ep= needs EP all-to-alls, and the run has none classified EP")
    ranks = max(base.placement.slots) + 1
    shares = _expert_shares(coll, ep_groups, loads) if ep and loads is not None else {}
    rep = Replication(copies=copies, ranks_per_copy=ranks, widen=dp_groups,
                      ep_groups=ep_groups if ep else frozenset(), ep_size=ep, expert_shares=shares)
    spec = parse_spec(base.topology)
    per_host = base.placement.gpus_per_host
    hosts_per_copy = traced_hosts if per_host <= spec.gpus else math.ceil(traced_hosts * per_host / spec.gpus)
    grown, grow_notes = grow(spec, hosts_per_copy * copies)
    try:
        after = base.replay_with(topology=grown, replication=rep, link_windows=LINK_WINDOWS)
    except (ReplicationError, TopologyError, ReplayError) as exc:
        raise WhatIfError(f"{name}: {exc}") from None
    result = base.compare(name, "scale", after)
    traced_gpus = len(base.placement.slots)
    result.simulated_gpus = traced_gpus * copies
    ep_before = _ep_size(coll)
    result.details = {"traced_gpus": traced_gpus, "copies": copies, "hosts": grown.hosts,
                      "gpus_per_host": grown.gpus, "tiers": grown.tiers, "dp_groups": sorted(dp_groups),
                      "ep_size": {"before": ep_before, "after": ep or ep_before}, "flows": after.n_flows}
    result.notes += [
        f"topology {grown.kind} grown to {grown.hosts} hosts (leaf oversubscription {grown.oversub:g}:1 as given)",
        *ASSUMPTIONS, *grow_notes,
        "DP all-reduces span every copy (the gradient bytes per rank as traced); PP and TP calls repeat in each "
        "copy; inter-host bytes count every copy's"]
    if ep and shares and loads is not None:
        result.notes.append(_loads_note(ep_before, ep, shares, loads))
        result.details["expert_loads"] = {"source": loads.source, "ranks": len(shares),
                                          "experts_per_rank": sorted({len(v) for v in shares.values()})}
    elif ep:
        result.notes.append(
            f"EP degree {ep_before} -> {ep}: all-to-all splits re-derived from the traced traffic matrix (a rank's "
            "experts spread evenly over the ranks that take them, or gathered from the ranks that give them up); "
            "expert compute as traced")
    return result


def _expert_shares(coll: pl.DataFrame, ep_groups: frozenset[str], loads: ExpertLoads
                   ) -> dict[int, tuple[float, ...]]:
    """The expert map's tokens per expert of every rank in the EP groups that the map covers."""
    members = set(coll.filter(pl.col("group").cast(pl.Utf8).is_in(list(ep_groups))).get_column("rank")
                  .drop_nulls().to_list())
    return {r: t for r, t in expert_tokens(loads).items() if r in members}


def _loads_note(ep_before: int | None, ep: int, shares: dict[int, tuple[float, ...]], loads: ExpertLoads) -> str:
    text = (f"EP degree {ep_before} -> {ep}: all-to-all splits re-derived from the traced traffic matrix and the "
            f"expert loads of {loads.source} ({len(shares)} ranks): ")
    if ep_before and ep > ep_before:
        text += (f"each rank's experts (tokens as loaded) are cut into {ep // ep_before} contiguous blocks of whole "
                 "experts, the rank at its position in each joined copy takes one, and the tokens the traced "
                 "matrix sent the rank go to the blocks in proportion to their experts' tokens (a hot expert's "
                 "traffic moves with it)")
    elif ep_before and ep < ep_before:
        text += ("each rank's experts move together to the rank that gathers them, so their loads do not change "
                 "the split")
    else:
        text += "the EP size is as traced, so the splits are too"
    return text + "; ranks outside the expert map have their experts spread evenly; expert compute as traced"


def _ep_size(coll: pl.DataFrame) -> int | None:
    ep = coll.filter((pl.col("dim").cast(pl.Utf8) == "EP") & (pl.col("op").cast(pl.Utf8) == "all_to_all"))
    sizes = ep.get_column("nranks").drop_nulls()
    return int(sizes.max()) if sizes.len() else None
