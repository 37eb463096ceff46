"""Pipeline parallelism: stage order and bubbles (idle and recv-wait time inside each step)."""

from __future__ import annotations

import polars as pl


def pp_stages(inst: pl.DataFrame, groups: pl.DataFrame) -> dict[int, int]:
    """Stage index of every rank that takes part in PP.

    A PP group of more than two ranks lists its stages in order. Ranks joined by PP transfers in
    pairs form chains (`pp_chains`), and a rank's stage is its place in its chain.
    """
    stage: dict[int, int] = {}
    pp_groups = groups.filter(pl.col("dims").list.contains("PP") & (pl.col("size") > 2))
    for ranks in pp_groups.get_column("ranks").to_list():
        for i, r in enumerate(ranks or []):
            stage[r] = max(stage.get(r, 0), i)
    p2p = inst.filter((pl.col("dim") == "PP") & pl.col("src").is_not_null() & pl.col("dst").is_not_null()
                      & pl.col("first_arrival_ns").is_not_null())
    transfers = p2p.select(pl.col("src").cast(pl.Int64), pl.col("dst").cast(pl.Int64),
                           pl.col("first_arrival_ns").alias("t"))
    depth = {r: i for chain in pp_chains(transfers) for i, r in enumerate(chain)}
    return {**depth, **stage}


def pp_chains(transfers: pl.DataFrame) -> list[list[int]]:
    """The ranks of each pipeline, stage 0 first, from its PP transfers (src, dst, t on the common
    clock). Pairs are joined in the order of their first transfer, skipping one that would close a
    ring (interleaved 1F1B's last-to-first hop comes last) or give a rank a third neighbour. A chain
    starts at the end whose first transfer is a send (the last stage's is a receive); when both
    ends or neither start so (DualPipe feeds both ends at once), at its lower rank."""
    if transfers.height == 0:
        return []
    firsts = (transfers.with_columns(pl.min_horizontal("src", "dst").alias("a"),
                                     pl.max_horizontal("src", "dst").alias("b"))
              .group_by("a", "b").agg(pl.col("t").min()).sort("t", "a", "b"))
    parent: dict[int, int] = {}

    def root(x: int) -> int:
        while parent.setdefault(x, x) != x:
            x = parent[x]
        return x

    nbrs: dict[int, list[int]] = {}
    for a, b, _ in firsts.iter_rows():
        ra, rb = root(a), root(b)
        if ra == rb or len(nbrs.get(a, [])) >= 2 or len(nbrs.get(b, [])) >= 2:
            continue
        parent[ra] = rb
        nbrs.setdefault(a, []).append(b)
        nbrs.setdefault(b, []).append(a)
    sends = pl.concat([transfers.select(pl.col("src").alias("rank"), "t", pl.lit(True).alias("send")),
                       transfers.select(pl.col("dst").alias("rank"), "t", pl.lit(False).alias("send"))])
    starts_with_send = dict(sends.sort("t", "send", descending=[False, True]).group_by("rank", maintain_order=True)
                            .agg(pl.col("send").first()).iter_rows())
    chains, done = [], set()
    for end in sorted(nbrs):
        if end in done or len(nbrs[end]) != 1:
            continue
        chain, prev = [end], None
        while True:
            nxt = [n for n in nbrs[chain[-1]] if n != prev]
            if not nxt:
                break
            prev = chain[-1]
            chain.append(nxt[0])
        done.update(chain)
        first, last = starts_with_send.get(chain[0], False), starts_with_send.get(chain[-1], False)
        if last and not first:  # walked from its lower-rank end, kept when both ends start alike
            chain.reverse()
        chains.append(chain)
    return sorted(chains, key=lambda c: min(c))


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
