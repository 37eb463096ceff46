"""Pipeline parallelism: stage order and bubbles (idle and recv-wait time inside each step)."""

from __future__ import annotations

import polars as pl


def pp_stages(inst: pl.DataFrame, groups: pl.DataFrame) -> dict[int, int]:
    """Stage index of every rank that takes part in PP.

    A PP group of more than two ranks lists its stages in order. Pairs are oriented by the
    direction of their first transfer (the forward pass sends first), and a stage is the length
    of the longest chain of oriented pairs leading to the rank.
    """
    stage: dict[int, int] = {}
    pp_groups = groups.filter(pl.col("dims").list.contains("PP") & (pl.col("size") > 2))
    for ranks in pp_groups.get_column("ranks").to_list():
        for i, r in enumerate(ranks or []):
            stage[r] = max(stage.get(r, 0), i)
    p2p = (inst.filter((pl.col("dim") == "PP") & pl.col("src").is_not_null() & pl.col("dst").is_not_null())
           .sort("first_arrival_ns", "instance"))
    edges: dict[frozenset[int], tuple[int, int]] = {}
    for a, b in p2p.select("src", "dst").iter_rows():
        edges.setdefault(frozenset((a, b)), (a, b))
    nodes = {r for e in edges.values() for r in e}
    depth = {r: stage.get(r, 0) for r in nodes}
    for _ in range(len(nodes)):
        changed = False
        for a, b in edges.values():
            if depth[b] < depth[a] + 1 and b not in stage:
                depth[b] = depth[a] + 1
                changed = True
        if not changed:
            break
    else:
        depth = {r: stage.get(r, 0) for r in nodes}
    return {**depth, **stage}


def pp_bubbles(parts: pl.DataFrame, inst: pl.DataFrame, groups: pl.DataFrame,
               breakdown: pl.DataFrame) -> pl.DataFrame:
    """Per PP rank and step: idle_ns, recv_wait_ns (time its PP receives waited for the sender,
    bounded by the receive's duration), bubble_ns = idle + recv wait, bubble_frac of the step."""
    stage = pp_stages(inst, groups)
    schema = {"rank": pl.Int32, "stage": pl.Int32, "step": pl.Int32, "span_ns": pl.Int64,
              "idle_ns": pl.Int64, "recv_wait_ns": pl.Int64, "bubble_ns": pl.Int64,
              "bubble_frac": pl.Float64}
    if not stage:
        return pl.DataFrame(schema=schema)
    st = pl.DataFrame({"rank": list(stage), "stage": list(stage.values())},
                      schema={"rank": pl.Int32, "stage": pl.Int32})
    waits = (parts.filter((pl.col("dim") == "PP") & (pl.col("op") == "recv"))
             .with_columns(pl.min_horizontal("wait_ns", pl.col("dur_ns").fill_null(pl.col("wait_ns"))).alias("_w"))
             .group_by("rank", "step").agg(pl.col("_w").sum().alias("recv_wait_ns")))
    out = (breakdown.select("rank", "step", "span_ns", "idle_ns").join(st, on="rank")
           .join(waits, on=["rank", "step"], how="left")
           .with_columns(pl.col("recv_wait_ns").fill_null(0))
           .with_columns((pl.col("idle_ns") + pl.col("recv_wait_ns")).alias("bubble_ns"))
           .with_columns((pl.col("bubble_ns") / pl.col("span_ns")).alias("bubble_frac")))
    return out.select(list(schema)).cast(schema).sort("stage", "rank", "step")
