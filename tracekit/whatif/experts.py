"""EP rebalancing what-if: plan redundant experts with EPLB, rewrite every EP all-to-all for the new
placement, replay.

Expert loads come from the run's EP traffic matrix (`tracekit.analysis.ep`: the bytes each rank
received in each all-to-all) or from a user file of per-expert token counts with a map of expert
to rank. Without per-expert detail, each rank's load is taken as `experts_per_rank` experts of
equal load (one expert per rank by default), and the notes say so.

Each all-to-all is read as a matrix B[i, j] of bytes member i -> member j (group order). Its
expert axis is the side whose totals are more skewed: the receivers for a dispatch (tokens go to
experts), the senders for a combine (expert outputs go back). Bytes to (or from) expert e are
split evenly over its replicas, so a dispatch becomes B' = B P R, where P spreads a rank's bytes
over its experts by their load shares and R[e, g] is the fraction of expert e's replicas on GPU g.
Senders' totals are unchanged for a dispatch, receivers' for a combine.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from tracekit import schema
from tracekit.analysis.ep import ep_pairs, expert_axis_is_receiver
from tracekit.errors import InputError
from tracekit.results import Result
from tracekit.whatif._files import load_json, read_rows
from tracekit.whatif.core import (
    Baseline,
    Change,
    Placement,
    RankLoad,
    ScenarioResult,
    WhatIfError,
    instance_times,
)
from tracekit.whatif.eplb import EplbError, ExpertPlan, rebalance_experts


@dataclass(frozen=True)
class ExpertLoads:
    """Per-expert token counts summed over steps and layers, and the rank that holds each expert."""

    tokens: Mapping[int, float]
    rank_of: Mapping[int, int]
    source: str = "file"


@dataclass(frozen=True)
class GroupPlan:
    """The EPLB plan of one EP group, in the group's member order."""

    group: str
    members: tuple[int, ...]
    experts_per_rank: int
    share: np.ndarray  # (members, experts_per_rank): each expert's share of its rank's traffic
    weight: np.ndarray  # load per logical expert (expert e lives on member e // experts_per_rank)
    plan: ExpertPlan
    gpu_member: np.ndarray  # plan GPU index -> member index
    nodes: int

    def fraction(self) -> np.ndarray:
        """(members x members): the share of bytes meant for member j's experts that goes to
        member k under the plan."""
        n, per = len(self.members), self.experts_per_rank
        spread = np.zeros((n, n * per))
        for j in range(n):
            spread[j, j * per:(j + 1) * per] = self.share[j]
        on_gpu = self.plan.replicas_on(0) / self.plan.count[0][:, None]
        to_member = np.zeros((n, n))
        to_member[np.arange(n), self.gpu_member] = 1.0
        return spread @ on_gpu @ to_member

    def layout(self) -> ExpertLayout:
        """Where the plan puts the experts: the replicated ones and each member's."""
        per_gpu = self.plan.slots_per_gpu
        slots = self.plan.phy2log[0]
        return ExpertLayout(
            group=self.group, policy=self.plan.policy, nodes=self.nodes, experts_per_rank=self.experts_per_rank,
            replicas={int(e): int(c) for e, c in enumerate(self.plan.count[0]) if c > 1},
            experts_on={int(self.members[int(self.gpu_member[g])]):
                        [int(e) for e in slots[g * per_gpu:(g + 1) * per_gpu]] for g in range(self.plan.n_gpus)})


class ExpertLayout(Result, frozen=True, kw_only=True):
    """An EP group's EPLB plan as the eplb scenario reports it (`details.plans`): the policy, the
    nodes it packed for, the replica count of each replicated expert, and the experts on each
    member rank."""

    group: str
    policy: str
    nodes: int
    experts_per_rank: int
    replicas: dict[int, int]
    experts_on: dict[int, list[int]]


def eplb(base: Baseline, *, redundant: int, groups: int = 1, nodes: int | None = None,
         experts_per_rank: int = 1, loads: ExpertLoads | None = None, compute: str | None = None,
         scenario: str | None = None) -> ScenarioResult:
    """Rebalance every EP group with `redundant` extra expert slots, replay, compare.

    `compute` (a regular expression on kernel names) also scales those expert compute kernels by
    the tokens each rank receives in the dispatch before them; without it, compute is as traced."""
    name = scenario or f"eplb:redundant={redundant}"
    tables = base.tables
    pairs = _pairs(tables)
    if pairs.height == 0:
        why = ep_bytes_missing(tables, loads_given=loads is not None) or _no_ep(tables)
        raise WhatIfError(f"eplb: {why}")
    plans, notes = plan_groups(pairs, tables, base.placement, redundant=redundant, groups=groups, nodes=nodes,
                               experts_per_rank=experts_per_rank, loads=loads)
    changed = dict(tables)
    changed["collectives"] = rewrite_all_to_all(tables, pairs, plans)
    compute_note = ("expert compute keeps its traced durations: only communication is replayed, so the step "
                    "gain counts the network alone (balanced expert compute would add to it)")
    if compute:
        changed["events"], n_scaled = scale_expert_compute(tables, changed["collectives"], compute)
        compute_note = (f"expert compute: {n_scaled} kernels matching {compute!r} scaled by the tokens their "
                        "rank received in the dispatch before them (time proportional to tokens)")
    after = base.replay_with(tables=changed)
    result = base.compare(name, "eplb", after)
    before_load = rank_loads(pairs)
    after_load = rank_loads(_pairs(changed))
    result.ep_load = [RankLoad(g, tuple(before_load[g]), tuple(before_load[g].values()),
                               tuple(after_load[g].get(r, 0) for r in before_load[g]))
                      for g in sorted(before_load)]
    worst = [x.imbalance for x in result.ep_load]
    result.ep_imbalance = Change(max(c.before for c in worst), max(c.after for c in worst))
    result.a2a_ns = Change(_mean_ns(base.result), _mean_ns(after))
    result.details = {"plans": [p.layout() for p in plans.values()]}
    result.notes += [*notes, "replicas of an expert share its tokens evenly", compute_note]
    return result


def ep_bytes_missing(tables: Mapping[str, pa.Table], *, loads_given: bool = False) -> str | None:
    """Why EPLB has no traffic to move when the run does have EP calls but none carries a byte
    count or splits (DeepEP's dispatch/combine kernels record none), with what to give; else None."""
    coll = pl.from_arrow(schema.conform("collectives", tables["collectives"]))
    ep = coll.filter(pl.col("dim").cast(pl.Utf8) == "EP")
    if ep.height == 0:
        return None
    sized = ep.filter((pl.col("in_bytes").fill_null(0) > 0) | (pl.col("out_bytes").fill_null(0) > 0)
                      | pl.col("in_splits").is_not_null())
    if sized.height:
        return None
    ops = ", ".join(f"{n} {op}" for op, n in ep.group_by(pl.col("op").cast(pl.Utf8)).len().sort("op").iter_rows())
    what = (f"the run's {ep.height} EP calls ({ops}) carry no byte counts or splits (kernels such as DeepEP's "
            "dispatch/combine record none), so there is no all-to-all traffic to rebalance")
    if loads_given:
        return (what + "; the expert loads say how many tokens each expert gets, not how many bytes each "
                "all-to-all moves: a trace whose all-to-alls record their sizes (NCCL all_to_all / "
                "all_to_all_single with record_shapes) is needed")
    return (what + "; give the per-expert token counts and where each expert lives with --expert-loads FILE "
            "(step, layer, expert, tokens) and --expert-map FILE (expert, rank)")


def _no_ep(tables: Mapping[str, pa.Table]) -> str:
    """Why the run has no EP all-to-all, naming all-to-alls classified otherwise (an embedding exchange)."""
    coll = pl.from_arrow(schema.conform("collectives", tables["collectives"]))
    other = coll.filter((pl.col("op").cast(pl.Utf8) == "all_to_all") & (pl.col("dim").cast(pl.Utf8) != "EP"))
    text = "the run has no EP all-to-all to rebalance (no collective classified EP)"
    if other.height:
        dims = ", ".join(sorted(set(other.get_column("dim").cast(pl.Utf8).fill_null("OTHER").to_list())))
        text += (f"; its {other.height} all-to-all calls are {dims}, not expert parallelism (an embedding "
                 "exchange, docs/analysis.md): there are no experts to move")
    return text


def _pairs(tables: Mapping[str, pa.Table]) -> pl.DataFrame:
    coll = pl.from_arrow(schema.conform("collectives", tables["collectives"]))
    groups = pl.from_arrow(schema.conform("groups", tables.get("groups")))
    cast = [pl.col(c).cast(pl.Utf8) for c in ("op", "dim", "group") if c in coll.columns]
    return ep_pairs(coll.with_columns(cast), groups.with_columns(pl.col("group").cast(pl.Utf8)))


def _members(pairs: pl.DataFrame, tables: Mapping[str, pa.Table]) -> dict[str, tuple[int, ...]]:
    """Each EP group's members in group order (the order of `in_splits`)."""
    groups = pl.from_arrow(schema.conform("groups", tables.get("groups")))
    listed = {str(g): [int(x) for x in (rs or [])] for g, rs in zip(
        groups.get_column("group").cast(pl.Utf8).to_list(), groups.get_column("ranks").to_list(), strict=True)}
    out = {}
    for (group,), part in pairs.group_by("group"):
        seen = sorted(set(part.get_column("src").to_list()) | set(part.get_column("dst").to_list()))
        order = listed.get(str(group)) or seen
        out[str(group)] = tuple(order)
    return out


def _matrices(pairs: pl.DataFrame, members: dict[str, tuple[int, ...]]
              ) -> dict[int, tuple[str, np.ndarray]]:
    """Per instance: (group, bytes matrix over the group's members)."""
    out: dict[int, tuple[str, np.ndarray]] = {}
    for (instance, group), part in pairs.group_by("instance", "group"):
        order = members[str(group)]
        pos = {r: i for i, r in enumerate(order)}
        m = np.zeros((len(order), len(order)))
        for s, d, b in zip(part.get_column("src").to_list(), part.get_column("dst").to_list(),
                           part.get_column("bytes").to_list(), strict=True):
            if s in pos and d in pos:
                m[pos[s], pos[d]] += b
        out[int(instance)] = (str(group), m)
    return out


def plan_groups(pairs: pl.DataFrame, tables: Mapping[str, pa.Table], placement: Placement, *,
                redundant: int, groups: int = 1, nodes: int | None = None, experts_per_rank: int = 1,
                loads: ExpertLoads | None = None) -> tuple[dict[str, GroupPlan], list[str]]:
    """An EPLB plan per EP group, and notes on the assumptions made."""
    members = _members(pairs, tables)
    mats = _matrices(pairs, members)
    notes: list[str] = []
    plans: dict[str, GroupPlan] = {}
    used_file = False
    for group in sorted(members):
        order = members[group]
        outside = [r for r in order if r not in placement.slots]
        if outside:
            notes.append(f"EP group {group}: ranks {', '.join(map(str, outside[:8]))} are outside the run: "
                         "no plan for it (its traffic to them is not in the trace)")
            continue
        n = len(order)
        received = np.zeros(n)
        for g, m in mats.values():
            if g == group:
                received += m.sum(axis=0) if expert_axis_is_receiver(m) else m.sum(axis=1)
        per, share, weight = _expert_loads(order, received, experts_per_rank, loads)
        used_file |= loads is not None and per is not None
        if per is None:
            per = experts_per_rank
            share = np.full((n, per), 1.0 / per)
            weight = np.repeat(received / per, per)
        hosts = [placement.host_of(r) for r in order]
        spanned = len(set(hosts))
        k = nodes or spanned
        gpu_member = np.array(sorted(range(n), key=lambda i: placement.slots[order[i]]), np.int64)
        slots = n * per + redundant
        g = groups
        if nodes is None and g % k == 0 and len({hosts.count(h) for h in set(hosts)}) > 1:
            notes.append(f"EP group {group}: its ranks are spread unevenly over {k} hosts; global policy used")
            g, k = 1, 1
        try:
            plan = rebalance_experts(weight, slots, g, k, n)
        except EplbError as exc:
            raise WhatIfError(f"eplb: EP group {group} ({n} ranks, {n * per} experts, {slots} slots): {exc}"
                              " (redundant must make the slot count a multiple of the group's ranks)"
                              ) from None
        plans[group] = GroupPlan(group=group, members=order, experts_per_rank=per, share=share,
                                 weight=weight, plan=plan, gpu_member=gpu_member, nodes=k)
    if used_file:
        notes.append(f"expert loads from {loads.source} (tokens per expert); each rank's traffic is split "
                     "over its experts by their token shares")
    elif experts_per_rank == 1:
        notes.append("no per-expert detail: each rank's load (bytes it received in the EP all-to-alls) is "
                     "taken as one expert")
    else:
        notes.append(f"no per-expert detail: each rank's load (bytes it received in the EP all-to-alls) is "
                     f"spread evenly over {experts_per_rank} experts")
    policies = sorted({p.plan.policy for p in plans.values()})
    if policies:
        notes.append(f"EPLB policy: {', '.join(policies)} ({redundant} redundant slots per EP group, "
                     f"groups={groups})")
    else:
        notes.append("no EP group could be planned: nothing was rebalanced")
    return plans, notes


def _expert_loads(order: tuple[int, ...], received: np.ndarray, experts_per_rank: int,
                  loads: ExpertLoads | None) -> tuple[int | None, np.ndarray | None, np.ndarray | None]:
    if loads is None:
        return None, None, None
    held = expert_tokens(loads)
    counts = {len(held.get(r, ())) for r in order}
    if counts == {0}:
        return None, None, None
    if len(counts) != 1:
        raise WhatIfError(f"expert map: ranks {list(order)} hold different numbers of experts "
                          f"({sorted(counts)}); EPLB needs the same number per rank")
    per = counts.pop()
    share = np.zeros((len(order), per))
    weight = np.zeros(len(order) * per)
    for j, r in enumerate(order):
        tokens = np.array(held[r])
        total = tokens.sum()
        share[j] = tokens / total if total > 0 else 1.0 / per
        weight[j * per:(j + 1) * per] = tokens
    return per, share, weight


def expert_tokens(loads: ExpertLoads) -> dict[int, tuple[float, ...]]:
    """Per rank of the expert map, the tokens of its experts in expert order."""
    held: dict[int, list[int]] = {}
    for expert, rank in loads.rank_of.items():
        held.setdefault(int(rank), []).append(int(expert))
    return {r: tuple(float(loads.tokens.get(e, 0.0)) for e in sorted(experts)) for r, experts in held.items()}


def rewrite_all_to_all(tables: Mapping[str, pa.Table], pairs: pl.DataFrame, plans: Mapping[str, GroupPlan]
                       ) -> pa.Table:
    """The collectives table with every EP all-to-all's splits and byte counts rewritten for the
    plans (instances of groups without a plan are left as they are)."""
    fractions = {g: p.fraction() for g, p in plans.items()}
    return rewrite_matrices(tables, pairs, lambda group, _members, d: d @ fractions[group] if group in fractions
                            else None)


def rewrite_matrices(tables: Mapping[str, pa.Table], pairs: pl.DataFrame,
                     change: Callable[[str, tuple[int, ...], np.ndarray], np.ndarray | None]) -> pa.Table:
    """The collectives table with every EP all-to-all rewritten by `change(group, members, D)`,
    which takes the instance's matrix in dispatch orientation (rows send tokens, columns hold
    experts; a combine's is its transpose) and gives the new one, or None to keep it."""
    members = _members(pairs, tables)
    mats = _matrices(pairs, members)
    rows: dict[tuple[int, int], tuple[list[int], list[int]]] = {}
    for instance, (group, m) in mats.items():
        dispatch = expert_axis_is_receiver(m)
        changed = change(group, members[group], m if dispatch else m.T)
        if changed is None:
            continue
        new = _integral(changed) if dispatch else _integral(changed).T
        for i, r in enumerate(members[group]):
            rows[instance, r] = ([int(x) for x in new[i]], [int(x) for x in new[:, i]])
    coll = schema.conform("collectives", tables["collectives"])
    inst = coll.column("instance").to_pylist()
    rank = coll.column("rank").to_pylist()
    in_splits = coll.column("in_splits").to_pylist()
    out_splits = coll.column("out_splits").to_pylist()
    in_bytes = coll.column("in_bytes").to_pylist()
    out_bytes = coll.column("out_bytes").to_pylist()
    for k, (i, r) in enumerate(zip(inst, rank, strict=True)):
        new = rows.get((i, r)) if i is not None else None
        if new is None:
            continue
        in_splits[k], out_splits[k] = new
        in_bytes[k], out_bytes[k] = sum(new[0]), sum(new[1])
    for name, values in (("in_splits", in_splits), ("out_splits", out_splits), ("in_bytes", in_bytes),
                         ("out_bytes", out_bytes)):
        idx = coll.schema.get_field_index(name)
        coll = coll.set_column(idx, coll.schema.field(name), pa.array(values, coll.schema.field(name).type))
    return coll


def _integral(m: np.ndarray) -> np.ndarray:
    """Round each row to integers that keep the row's (rounded) total: largest remainders first."""
    out = np.floor(m).astype(np.int64)
    for i in range(m.shape[0]):
        missing = round(float(m[i].sum())) - int(out[i].sum())
        if missing > 0:
            out[i, np.argsort(-(m[i] - out[i]), kind="stable")[:missing]] += 1
    return out


def scale_expert_compute(tables: Mapping[str, pa.Table], rewritten: pa.Table, pattern: str
                         ) -> tuple[pa.Table, int]:
    """The events table with a `replay_dur_ns` column: every compute kernel whose name matches
    `pattern` scaled by the bytes its rank received in the last EP dispatch before it (rewritten
    over traced), every other event as traced. Returns the table and the kernels scaled."""
    try:
        re.compile(pattern)
    except re.error as exc:
        raise WhatIfError(f"eplb: compute={pattern!r} is not a regular expression: {exc}") from None
    old = pl.from_arrow(schema.conform("collectives", tables["collectives"]))
    new = pl.from_arrow(rewritten)
    keys = ["coll_id", "rank"]
    ep = (old.filter((pl.col("op").cast(pl.Utf8) == "all_to_all") & (pl.col("dim").cast(pl.Utf8) == "EP"))
          .select(*keys, "instance", pl.col("out_bytes").alias("_old"))
          .join(new.select(*keys, pl.col("out_bytes").alias("_new")), on=keys, how="left"))
    dispatch = set(_dispatch_instances(_pairs(tables), tables))
    ep = ep.filter(pl.col("instance").is_in(list(dispatch)) & (pl.col("_old") > 0))
    ep = ep.with_columns((pl.col("_new").cast(pl.Float64) / pl.col("_old")).alias("_factor"))
    events = pl.from_arrow(tables["events"])
    events = events.with_columns(pl.int_range(pl.len()).alias("_row"))
    ends = (events.filter(pl.col("kind").cast(pl.Utf8) == "comm")
            .join(ep.select("coll_id", "_factor"), on="coll_id", how="inner")
            .select("rank", (pl.col("ts_ns") + pl.col("dur_ns").fill_null(0)).alias("_t"), "_factor")
            .sort("rank", "_t"))
    kernels = (events.filter((pl.col("kind").cast(pl.Utf8) == "compute")
                             & pl.col("name").cast(pl.Utf8).str.contains(pattern) & pl.col("ts_ns").is_not_null())
               .select("_row", "rank", pl.col("ts_ns").alias("_t")).sort("rank", "_t"))
    if kernels.height == 0:
        raise WhatIfError(f"eplb: compute={pattern!r} matches no compute kernel in the run")
    matched = kernels.join_asof(ends, on="_t", by="rank", strategy="backward",
                                check_sortedness=False).drop_nulls("_factor")
    factor = np.ones(events.height)
    factor[matched.get_column("_row").to_numpy()] = matched.get_column("_factor").to_numpy()
    dur = events.get_column("dur_ns").cast(pl.Float64).to_numpy()
    scaled = pa.array(np.round(dur * factor), pa.float64(), from_pandas=True).cast(pa.int64())
    out = tables["events"]
    if "replay_dur_ns" in out.column_names:
        out = out.drop_columns(["replay_dur_ns"])
    return out.append_column("replay_dur_ns", scaled), matched.height


def _dispatch_instances(pairs: pl.DataFrame, tables: Mapping[str, pa.Table]) -> list[int]:
    mats = _matrices(pairs, _members(pairs, tables))
    return [i for i, (_, m) in mats.items() if expert_axis_is_receiver(m)]


def rank_loads(pairs: pl.DataFrame) -> dict[str, dict[int, int]]:
    """Per EP group, bytes each member received over the run's all-to-alls (members in rank order)."""
    out: dict[str, dict[int, int]] = {}
    ranks: dict[str, set[int]] = {}
    for row in pairs.iter_rows(named=True):
        g = str(row["group"])
        ranks.setdefault(g, set()).update((row["src"], row["dst"]))
        out.setdefault(g, {})
        out[g][row["dst"]] = out[g].get(row["dst"], 0) + int(row["bytes"])
    return {g: {r: out[g].get(r, 0) for r in sorted(ranks[g])} for g in out}


def _mean_ns(result: Any) -> float:
    times = [i.replayed_ns for i in instance_times(result, op="all_to_all", dim="EP").values()]
    return float(np.mean(times)) if times else 0.0


def read_expert_loads(path: str | os.PathLike[str], rank_of: Mapping[int, int]) -> ExpertLoads:
    """Per-expert token counts from CSV or JSON rows (step, layer, expert, tokens), summed."""
    rows = _read_rows(path, ("expert", "tokens"))
    tokens: dict[int, float] = {}
    for i, row in enumerate(rows):
        try:
            expert, count = int(row["expert"]), float(row["tokens"])
        except (TypeError, ValueError):
            raise InputError(path, f"row {i + 1}: expert must be an integer and tokens a number") from None
        if count < 0:
            raise InputError(path, f"row {i + 1}: negative token count")
        tokens[expert] = tokens.get(expert, 0.0) + count
    unknown = sorted(set(tokens) - set(rank_of))
    if unknown:
        raise InputError(path, f"experts {unknown[:8]} are not in the expert map")
    return ExpertLoads(tokens=tokens, rank_of=dict(rank_of), source=Path(path).name)


def read_expert_map(path: str | os.PathLike[str]) -> dict[int, int]:
    """Expert -> rank from CSV or JSON rows (expert, rank), or a JSON object {expert: rank}."""
    text_path = Path(path)
    if text_path.suffix.lower() == ".json":
        data = load_json(text_path)
        if isinstance(data, dict):
            try:
                return {int(k): int(v) for k, v in data.items()}
            except (TypeError, ValueError):
                raise InputError(path, "expected {expert: rank} with integer keys and values") from None
    out: dict[int, int] = {}
    for i, row in enumerate(_read_rows(path, ("expert", "rank"))):
        try:
            out[int(row["expert"])] = int(row["rank"])
        except (TypeError, ValueError):
            raise InputError(path, f"row {i + 1}: expert and rank must be integers") from None
    return out


def _read_rows(path: str | os.PathLike[str], needed: tuple[str, ...]) -> list[dict[str, Any]]:
    rows = read_rows(path, from_json=lambda d: d["rows"] if isinstance(d, dict) and isinstance(d.get("rows"), list)
                     else d)
    missing = [c for c in needed if c not in rows[0]]
    if missing:
        raise InputError(path, f"missing column(s) {', '.join(missing)}; expected {', '.join(needed)}")
    return rows
