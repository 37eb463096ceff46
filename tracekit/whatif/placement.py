"""Placement what-if: run the same ranks on other hosts and GPUs, replay, compare inter-host bytes
per dim and the step.

A placement keeps the run's slots (the same hosts, the same number of ranks on each) and changes
which rank sits in which slot. Named placements order the ranks and fill the slots host by host:
`pp-adjacent` keeps each pipeline (the ranks joined by PP send/recv, in stage order) together,
`pp-spread` puts each stage on its own hosts (stage by stage), `ep-in-node` keeps each EP group
together. `auto` starts from the better of the traced placement and a greedy one that keeps the
heaviest-traffic pairs inside a host, then tries swaps of two ranks between hosts, best first by
the traffic they keep inside hosts, each judged by a replay and kept when it shortens the step by
more than 0.1% (the number of replays is bounded).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from tracekit import schema
from tracekit.analysis.ep import ep_pairs
from tracekit.errors import InputError
from tracekit.replay import parse_spec
from tracekit.whatif._files import read_rows
from tracekit.whatif.core import Baseline, Placement, ScenarioResult, WhatIfError

NAMED = ("pp-adjacent", "pp-spread", "ep-in-node", "auto")
RING_FACTOR = {"all_reduce": 2.0, "all_gather": 1.0, "reduce_scatter": 1.0, "broadcast": 1.0, "reduce": 1.0}
AUTO_REPLAYS = 16
AUTO_MIN_GAIN = 1e-3  # a change is kept only when it shortens the replayed step by more than this


def placement(base: Baseline, target: str | os.PathLike[str] | Placement, *, max_replays: int = AUTO_REPLAYS,
              scenario: str | None = None) -> ScenarioResult:
    """Replay the run placed by `target` (a named placement, a file, or a `Placement`)."""
    name = scenario or f"placement:{target if not isinstance(target, Placement) else 'custom'}"
    details: dict[str, Any] = {}
    if isinstance(target, Placement):
        new = target
    elif str(target) == "auto":
        new, after, details = auto_placement(base, max_replays=max_replays)
    elif str(target) in NAMED:
        new = named_placement(base.tables, base.placement, str(target))
    else:
        new = read_placement(target)
    check_fits(base, new)
    if str(target) != "auto":
        after = base.replay_with(placement=new)
    result = base.compare(name, "placement", after, placement=new)
    moved = sorted(r for r in new.slots if new.slots[r] != base.placement.slots.get(r))
    result.details = {"moved_ranks": len(moved), **details}
    return result


def check_fits(base: Baseline, new: Placement) -> None:
    """Every rank placed once, and no host holds more ranks than the topology has GPUs per host."""
    missing = sorted(set(base.placement.slots) - set(new.slots))
    if missing:
        raise WhatIfError(f"placement: no host for rank(s) {missing[:8]}")
    extra = sorted(set(new.slots) - set(base.placement.slots))
    if extra:
        raise WhatIfError(f"placement: rank(s) {extra[:8]} are not in the run")
    if len(set(new.slots.values())) < len(new.slots):
        raise WhatIfError("placement: two ranks share one (host, gpu)")
    gpus = parse_spec(base.topology).gpus
    if new.gpus_per_host > gpus:
        raise WhatIfError(f"placement: a host holds {new.gpus_per_host} GPUs but topology "
                          f"{base.topology} has {gpus} per host")


def fill(order: Sequence[int], slots: Placement) -> Placement:
    """Put `order`'s ranks into `slots`' (host, gpu) slots host by host, in order."""
    free = sorted(slots.slots.values())
    if len(order) != len(free) or set(order) != set(slots.slots):
        raise WhatIfError("placement: the order must hold every rank of the run exactly once")
    return Placement.of({r: free[i] for i, r in enumerate(order)}, slots.hosts)


def named_placement(tables: Mapping[str, pa.Table], traced: Placement, name: str) -> Placement:
    """`pp-adjacent`, `pp-spread` or `ep-in-node` on the run's slots."""
    ranks = sorted(traced.slots)
    if name in ("pp-adjacent", "pp-spread"):
        chains = pp_chains(tables)
        if not chains:
            raise WhatIfError(f"placement:{name}: the run has no PP send/recv between ranks")
        if name == "pp-adjacent":
            order = [r for chain in chains for r in chain]
        else:
            depth = max(len(c) for c in chains)
            order = [c[s] for s in range(depth) for c in chains if s < len(c)]
    elif name == "ep-in-node":
        groups = ep_groups(tables)
        if not groups:
            raise WhatIfError("placement:ep-in-node: the run has no EP all-to-all")
        order = []
        for members in groups:
            order += [r for r in members if r not in order]
    else:
        raise WhatIfError(f"placement: unknown placement {name!r}; give a file or one of {', '.join(NAMED)}")
    order = [r for r in order if r in traced.slots]
    order += [r for r in ranks if r not in order]
    return fill(order, traced)


def _collectives(tables: Mapping[str, pa.Table]) -> pl.DataFrame:
    coll = pl.from_arrow(schema.conform("collectives", tables["collectives"]))
    return coll.with_columns([pl.col(c).cast(pl.Utf8) for c in ("op", "dim", "group")])


def pp_chains(tables: Mapping[str, pa.Table]) -> list[list[int]]:
    """Pipelines: ranks joined by PP send/recv, each in stage order (from the end with the lowest
    rank), ordered by their first rank."""
    coll = _collectives(tables)
    p2p = coll.filter(pl.col("op").is_in(["send", "recv"]) & (pl.col("dim") == "PP") & pl.col("peer").is_not_null()
                      & (pl.col("peer") != pl.col("rank")))
    links: dict[int, set[int]] = {}
    for a, b in zip(p2p.get_column("rank").to_list(), p2p.get_column("peer").to_list(), strict=True):
        links.setdefault(int(a), set()).add(int(b))
        links.setdefault(int(b), set()).add(int(a))
    seen: set[int] = set()
    chains = []
    for start in sorted(links):
        if start in seen:
            continue
        component, stack = [], [start]
        while stack:
            r = stack.pop()
            if r in seen:
                continue
            seen.add(r)
            component.append(r)
            stack.extend(links[r] - seen)
        ends = sorted(r for r in component if len(links[r]) == 1)
        is_path = len(ends) == 2 and all(len(links[r]) <= 2 for r in component)
        if not is_path:
            chains.append(sorted(component))
            continue
        chain, prev = [ends[0]], None
        while len(chain) < len(component):
            nxt = [r for r in links[chain[-1]] if r != prev]
            prev = chain[-1]
            chain.append(nxt[0])
        chains.append(chain)
    return sorted(chains, key=lambda c: min(c))


def ep_groups(tables: Mapping[str, pa.Table]) -> list[list[int]]:
    """Members of each EP group (group order), ordered by their first rank."""
    coll = _collectives(tables)
    groups = pl.from_arrow(schema.conform("groups", tables.get("groups"))).with_columns(pl.col("group").cast(pl.Utf8))
    pairs = ep_pairs(coll, groups)
    listed = {str(g): [int(x) for x in (rs or [])] for g, rs in zip(
        groups.get_column("group").to_list(), groups.get_column("ranks").to_list(), strict=True)}
    out = []
    for (group,), part in pairs.group_by("group"):
        seen = sorted(set(part.get_column("src").to_list()) | set(part.get_column("dst").to_list()))
        out.append(listed.get(str(group)) or seen)
    return sorted(out, key=lambda m: min(m))


def affinity(tables: Mapping[str, pa.Table]) -> tuple[list[int], np.ndarray]:
    """Bytes each pair of ranks exchanges, independent of placement: p2p bytes between the pair,
    all-to-all bytes from the splits, and for the other collectives each member's volume (factor x
    bytes, 2 for all-reduce) spread evenly over the other members."""
    coll = _collectives(tables).filter(pl.col("instance").is_not_null())
    ranks = sorted(set(coll.get_column("rank").to_list()))
    pos = {r: i for i, r in enumerate(ranks)}
    w = np.zeros((len(ranks), len(ranks)))
    sends = coll.filter((pl.col("op") == "send") & pl.col("peer").is_not_null())
    for r, peer, b in zip(sends.get_column("rank").to_list(), sends.get_column("peer").to_list(),
                          sends.get_column("in_bytes").fill_null(0).to_list(), strict=True):
        if r in pos and peer in pos and r != peer:
            w[pos[r], pos[peer]] += b
    groups = pl.from_arrow(schema.conform("groups", tables.get("groups"))).with_columns(pl.col("group").cast(pl.Utf8))
    a2a = coll.filter(pl.col("op") == "all_to_all").with_columns(pl.lit("EP").alias("dim"))
    for s, d, b in ep_pairs(a2a, groups).select("src", "dst", "bytes").iter_rows():
        if s in pos and d in pos and s != d:
            w[pos[s], pos[d]] += b
    ring = coll.filter(pl.col("op").is_in(list(RING_FACTOR)))
    for _, part in ring.group_by("instance"):
        members = sorted({int(r) for r in part.get_column("rank").to_list()})
        if len(members) < 2:
            continue
        op = part.get_column("op").to_list()[0]
        nbytes = float(max(part.get_column("in_bytes").fill_null(0).to_list()
                           + part.get_column("out_bytes").fill_null(0).to_list()))
        n = len(members)
        per_peer = RING_FACTOR[op] * (n - 1) / n * nbytes / (n - 1)
        idx = [pos[r] for r in members]
        block = np.full((n, n), per_peer)
        np.fill_diagonal(block, 0.0)
        w[np.ix_(idx, idx)] += block
    return ranks, w + w.T


def greedy_placement(tables: Mapping[str, pa.Table], traced: Placement) -> Placement:
    """Merge the ranks of the heaviest-traffic pairs into one host while they fit, then pack the
    clusters onto hosts (largest first, each to the host with the most free slots)."""
    ranks, w = affinity(tables)
    capacity = [len(traced.ranks_on(h)) for h in range(len(traced.hosts))]
    biggest = max(capacity)
    cluster = {r: [r] for r in traced.slots}
    pairs = np.argwhere(np.triu(w, 1) > 0)
    order = np.argsort(-w[pairs[:, 0], pairs[:, 1]], kind="stable")
    for i, j in pairs[order]:
        a, b = ranks[i], ranks[j]
        if cluster[a] is cluster[b] or len(cluster[a]) + len(cluster[b]) > biggest:
            continue
        merged = cluster[a] + cluster[b]
        for r in merged:
            cluster[r] = merged
    clusters = sorted({id(c): sorted(c) for c in cluster.values()}.values(), key=lambda c: (-len(c), c[0]))
    hosts: list[list[int]] = [[] for _ in capacity]
    leftovers: list[int] = []
    for c in clusters:
        room = [capacity[h] - len(hosts[h]) for h in range(len(hosts))]
        h = int(np.argmax(room))
        if room[h] >= len(c):
            hosts[h] += c
        else:
            leftovers += c
    for r in leftovers:
        h = int(np.argmax([capacity[h] - len(hosts[h]) for h in range(len(hosts))]))
        hosts[h].append(r)
    order = [r for h in range(len(hosts)) for r in sorted(hosts[h])]
    return fill(order, traced)


def _cut(w: np.ndarray, host: np.ndarray) -> float:
    return float(w[host[:, None] != host[None, :]].sum() / 2)


def auto_placement(base: Baseline, *, max_replays: int = AUTO_REPLAYS) -> tuple[Placement, Any, dict[str, Any]]:
    """Search for the placement with the shortest replayed step (mean over steps)."""
    if max_replays < 1:
        raise WhatIfError("placement:auto needs at least one replay")
    ranks, w = affinity(base.tables)

    def step(result: Any) -> float:
        return float(np.mean(list(result.step_ns.values())))

    greedy = greedy_placement(base.tables, base.placement)
    tried = [("traced", step(base.result))]
    best, best_result, best_step = base.placement, base.result, step(base.result)
    replays = 0
    if greedy.slots != base.placement.slots:
        result = base.replay_with(placement=greedy)
        replays += 1
        tried.append(("greedy", step(result)))
        if step(result) < best_step * (1 - AUTO_MIN_GAIN):
            best, best_result, best_step = greedy, result, step(result)
    start = "greedy" if best is greedy else "traced"
    seen = {_key(best)}
    while replays < max_replays:
        host = np.array([best.host_of(r) if r in best.slots else -1 for r in ranks])
        base_cut = _cut(w, host)
        candidates = []
        for a in range(len(ranks)):
            for b in range(a + 1, len(ranks)):
                if host[a] == host[b] or host[a] < 0 or host[b] < 0:
                    continue
                swapped = host.copy()
                swapped[a], swapped[b] = host[b], host[a]
                candidates.append((_cut(w, swapped) - base_cut, ranks[a], ranks[b]))
        candidates.sort()
        improved = False
        for _, a, b in candidates:
            if replays >= max_replays:
                break
            slots = dict(best.slots)
            slots[a], slots[b] = best.slots[b], best.slots[a]
            trial = Placement.of(slots, best.hosts)
            if _key(trial) in seen:
                continue
            seen.add(_key(trial))
            result = base.replay_with(placement=trial)
            replays += 1
            tried.append((f"swap {a}<->{b}", step(result)))
            if step(result) < best_step * (1 - AUTO_MIN_GAIN):
                best, best_result, best_step = trial, result, step(result)
                improved = True
                break
        if not improved:
            break
    return best, best_result, {"start": start, "replays": replays, "min_gain": AUTO_MIN_GAIN,
                               "tried": [{"placement": t, "step_ns": round(s)} for t, s in tried]}


def _key(p: Placement) -> tuple[tuple[int, int], ...]:
    """Placements that differ only by the order of ranks inside a host are the same to the search."""
    return tuple(sorted((p.slots[r][0], r) for r in p.slots))


def read_placement(path: str | os.PathLike[str]) -> Placement:
    """A placement file: CSV or JSON rows (rank, host[, gpu]), or a JSON object {rank: host} or
    {rank: [host, gpu]}. Hosts are names (or numbers); without gpu, ranks take a host's GPUs in
    rank order. Hosts are numbered by their lowest rank."""
    p = Path(path)
    if not p.exists():
        raise WhatIfError(f"placement: {path} is neither a named placement ({', '.join(NAMED)}) nor a file")
    rows = _rows(p)
    host_of: dict[int, str] = {}
    gpu_of: dict[int, int] = {}
    for i, row in enumerate(rows):
        try:
            rank = int(row["rank"])
            host = str(row["host"]).strip()
            gpu = row.get("gpu")
            if gpu not in (None, ""):
                gpu_of[rank] = int(gpu)
        except (TypeError, ValueError, KeyError):
            raise InputError(path, f"row {i + 1}: expected rank (integer), host and optional gpu (integer)") from None
        if not host:
            raise InputError(path, f"row {i + 1}: empty host")
        if rank in host_of:
            raise InputError(path, f"rank {rank} is placed twice")
        host_of[rank] = host
    members: dict[str, list[int]] = {}
    for r in sorted(host_of):
        members.setdefault(host_of[r], []).append(r)
    names = sorted(members, key=lambda h: min(members[h]))
    slots = {}
    for h, name in enumerate(names):
        on_host = members[name]
        if any(r in gpu_of for r in on_host):
            if not all(r in gpu_of for r in on_host):
                raise InputError(path, f"host {name}: give gpu for all of its ranks or for none")
            for r in on_host:
                slots[r] = (h, gpu_of[r])
        else:
            for g, r in enumerate(on_host):
                slots[r] = (h, g)
    if any(g < 0 for _, g in slots.values()):
        raise InputError(path, "negative gpu index")
    return Placement.of(slots, names)


def _rows(p: Path) -> list[dict[str, Any]]:
    rows = read_rows(p, from_json=_mapping_rows, expected="a JSON list of {rank, host, gpu} objects or {rank: host}")
    if not {"rank", "host"} <= set(rows[0]):
        raise InputError(p, "missing column(s): expected rank, host and optional gpu")
    return rows


def _mapping_rows(data: Any) -> Any:
    """{rank: host} or {rank: [host, gpu]} as rows; anything else unchanged."""
    if not isinstance(data, dict):
        return data
    rows = []
    for k, v in data.items():
        host, gpu = (v[0], v[1]) if isinstance(v, list) and len(v) == 2 else (v, None)
        rows.append({"rank": k, "host": host, "gpu": gpu})
    return rows
