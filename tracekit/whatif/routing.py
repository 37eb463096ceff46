"""Node-limited routing what-if (`routing:nodes=M`, DeepSeek-V3): each token's experts on at most M
nodes, so its dispatch and combine cross at most M - 1 other nodes.

The trace holds no per-token routing, only each all-to-all's bytes matrix. The approximation: a
sender's tokens, in aggregate, keep their traced preference over nodes (the bytes to each node);
limited routing sends them to the M nodes that got most of its bytes (its own node first on a
tie, then the lowest host), and the bytes for the other nodes go to the kept experts in
proportion to what each kept expert got. Row totals (tokens per sender) are unchanged. This is an
upper bound on the locality the limit buys: per-token limits let different tokens of one sender
pick different nodes. Closed form (tested): traffic spread evenly over H nodes keeps a share
(M - 1) / M of a sender's bytes off its node, against (H - 1) / H traced.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tracekit.whatif.core import Baseline, Change, ScenarioResult, WhatIfError
from tracekit.whatif.experts import _mean_ns, _pairs, ep_bytes_missing, rewrite_matrices

APPROXIMATION = ("per-token routing is not in the trace: each sender's bytes stand for its tokens' expert choices "
                 "in aggregate, and node-limited routing keeps the M nodes that received most of them (an upper "
                 "bound on the locality: real per-token limits let one sender's tokens pick different nodes)")


def limit_nodes(d: np.ndarray, node: Sequence[int], m: int) -> np.ndarray:
    """Dispatch matrix `d` (rows send, columns hold experts; `node[j]`: column j's node) with each
    row's bytes restricted to the `m` nodes that got most of them (own node first on ties), the
    rest spread over the kept columns in proportion to their bytes."""
    node_of = np.asarray(node, np.int64)
    nodes = np.unique(node_of)
    out = np.zeros_like(d, dtype=np.float64)
    for i in range(d.shape[0]):
        row = d[i].astype(np.float64)
        total = row.sum()
        if total <= 0:
            continue
        per_node = np.array([row[node_of == n].sum() for n in nodes])
        own = nodes == node_of[i]
        ranked = np.lexsort((nodes, ~own, -per_node))  # most bytes, then own node, then lowest host
        kept = np.isin(node_of, nodes[ranked[:m]])
        out[i, kept] = row[kept] * (total / row[kept].sum())
    return out


def cross_node_bytes(d: np.ndarray, node: Sequence[int]) -> float:
    """Bytes of `d` between members on different nodes."""
    node_of = np.asarray(node, np.int64)
    return float(d[node_of[:, None] != node_of[None, :]].sum())


def node_limited(base: Baseline, *, nodes: int, scenario: str | None = None) -> ScenarioResult:
    """Rewrite every EP all-to-all for node-limited routing to `nodes` nodes, replay, compare."""
    name = scenario or f"routing:nodes={nodes}"
    tables = base.tables
    pairs = _pairs(tables)
    if pairs.height == 0:
        raise WhatIfError(f"routing: {ep_bytes_missing(tables) or 'the run has no EP all-to-all with byte counts'}")
    totals = {"before": 0.0, "after": 0.0}
    spanned: set[int] = set()

    def change(group: str, members: tuple[int, ...], d: np.ndarray) -> np.ndarray | None:
        if any(r not in base.placement.slots for r in members):
            return None
        node = [base.placement.host_of(r) for r in members]
        spanned.add(len(set(node)))
        new = limit_nodes(d, node, nodes)
        totals["before"] += cross_node_bytes(d, node)
        totals["after"] += cross_node_bytes(new, node)
        return new

    changed = dict(tables)
    changed["collectives"] = rewrite_matrices(tables, pairs, change)
    after = base.replay_with(tables=changed)
    result = base.compare(name, "routing", after)
    result.a2a_ns = Change(_mean_ns(base.result), _mean_ns(after))
    result.details = {"nodes": nodes, "ep_nodes": sorted(spanned),
                      "cross_node_bytes": {"before": round(totals["before"]), "after": round(totals["after"])}}
    result.notes += [APPROXIMATION]
    if spanned and max(spanned) <= nodes:
        result.notes.append(f"every EP group spans at most {max(spanned)} nodes: a limit of {nodes} changes nothing")
    return result
