"""The rank or host common to the collectives that slowed, and not to the ones that did not."""

from __future__ import annotations

import polars as pl

from tracekit.diff.core import find_culprits


def _case(members: list[list[int]], slowed: list[bool]):
    n = len(members)
    inst_a = pl.DataFrame({"instance": list(range(n)), "duration_ns": [1000] * n})
    inst_b = pl.DataFrame({"instance": [100 + i for i in range(n)],
                           "duration_ns": [2000 if s else 1000 for s in slowed]})
    parts = pl.DataFrame({"instance": [100 + i for i, m in enumerate(members) for _ in m],
                          "rank": [r for m in members for r in m]})
    pairs = pl.DataFrame({"instance_a": list(range(n)), "instance_b": [100 + i for i in range(n)]})
    return inst_a, inst_b, parts, pairs


def test_the_rank_in_every_slowed_collective_and_few_others():
    # ranks 0 and 1 are in all 4 slowed collectives; rank 1 is also in 6 that did not slow
    members = [[0, 1]] * 4 + [[1, 2]] * 6 + [[2, 3]] * 2
    slowed = [True] * 4 + [False] * 8
    hosts = {0: "h0", 1: "h0", 2: "h1", 3: "h1"}
    found = find_culprits(*_case(members, slowed), hosts)
    assert [(c.kind, c.name, c.slowed, c.unslowed) for c in found] == [("rank", "0", 4, 0), ("host", "h0", 4, 6)]
    assert found[0].ratio == 2.0 and found[0].added_share == 1.0


def test_nothing_when_nothing_slowed():
    assert find_culprits(*_case([[0, 1]] * 4, [False] * 4), {0: "h0", 1: "h1"}) == []
