"""Expert parallelism: traffic matrices from all-to-all splits, load imbalance, hot ranks."""

from __future__ import annotations

import numpy as np
import polars as pl

#: A rank is "hot" only when it receives at least this many times the mean (max/mean), not merely
#: the largest share: perfectly even traffic over 8 ranks gives every rank 12.5%, and none is hot.
HOT_IMBALANCE = 1.25

_PAIR_SCHEMA = {"instance": pl.Int64, "group": pl.String, "step": pl.Int32, "src": pl.Int32,
                "dst": pl.Int32, "bytes": pl.Int64, "assumed": pl.Boolean}


def ep_pairs(collectives: pl.DataFrame, groups: pl.DataFrame) -> pl.DataFrame:
    """Bytes src -> dst for every EP all-to-all instance (instance, group, step, src, dst, bytes,
    assumed).

    in_splits[j] on rank r is what r sends to the j-th member of the group (groups.ranks order,
    or the sorted participants when the group's membership is unknown). Without splits, or with
    splits whose length does not match the group, the input is taken as evenly split and the
    pair is marked `assumed`: such a matrix shows no imbalance because none could be measured.
    """
    a2a = collectives.filter((pl.col("dim") == "EP") & (pl.col("op") == "all_to_all")
                             & pl.col("instance").is_not_null())
    if a2a.height == 0:
        return pl.DataFrame(schema=_PAIR_SCHEMA)
    seen = a2a.group_by("instance").agg(pl.col("rank").unique().sort().cast(pl.Int32).alias("_seen"))
    members = groups.select("group", pl.col("ranks").cast(pl.List(pl.Int32)).alias("_members"))
    rows = (a2a.join(seen, on="instance").join(members, on="group", how="left")
            .with_columns(pl.when(pl.col("_members").list.len() > 0).then("_members")
                          .otherwise("_seen").alias("_members")))
    n = pl.col("_members").list.len()
    good = pl.col("in_splits").is_not_null() & (pl.col("in_splits").list.len() == n)
    even = (pl.col("in_bytes").fill_null(0) // n).repeat_by(n)
    rows = rows.with_columns(pl.when(good).then(pl.col("in_splits")).otherwise(even).alias("_splits"),
                             (~good).alias("assumed"))
    pairs = (rows.select("instance", "group", "step", pl.col("rank").cast(pl.Int32).alias("src"),
                         pl.col("_members").alias("dst"), pl.col("_splits").alias("bytes"), "assumed")
             .explode(["dst", "bytes"]))
    return pairs.cast(_PAIR_SCHEMA).filter(pl.col("bytes").is_not_null() & (pl.col("bytes") > 0))


def expert_axis_is_receiver(m: np.ndarray) -> bool:
    """True for a dispatch (an all-to-all's receivers' totals more skewed than its senders': the
    tokens go to the experts), False for a combine (the expert outputs go back)."""
    return _skew(m.sum(axis=0)) >= _skew(m.sum(axis=1))


def _skew(totals: np.ndarray) -> float:
    mean = totals.mean() if totals.size else 0.0
    return float(totals.max() / mean) if mean > 0 else 1.0


GROUP_SCHEMA = {
    "group": pl.String, "ranks": pl.List(pl.Int32), "members": pl.Int64, "present": pl.Int64,
    "complete": pl.Boolean, "instances": pl.Int64, "splits_assumed": pl.Float64, "hot_rank": pl.Int32,
    "hot_ranks": pl.List(pl.Int32), "hot_share": pl.Float64, "imbalance": pl.Float64,
    "imbalance_mean": pl.Float64, "inter_host_share": pl.Float64, "bytes": pl.Int64,
    "bytes_outside": pl.Int64}


def ep_summary(pairs: pl.DataFrame, ranks: pl.DataFrame, *, imbalanced: float = HOT_IMBALANCE
               ) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """Per instance and per group load figures, plus the run's traffic matrix.

    Returns (ep_instances, ep_groups, ep_traffic). Only ranks present in the run count as
    receivers: bytes sent to members outside the run are `bytes_outside`, never drawn.

    Per instance: bytes, received bytes per rank, imbalance = max/mean of received bytes over
    the members, hot_rank (most received, null below `imbalanced`), hot_share (its share of the
    bytes), inter_host_share (bytes between hosts over bytes between distinct ranks; null when a
    host is unknown), complete (every member present) and assumed (split sizes not in the trace).

    Per group: members (group size), present, complete; splits_assumed = the share of its
    all-to-alls whose splits were assumed; imbalance = the largest, imbalance_mean; hot_rank = the
    rank most often hot among instances with imbalance >= `imbalanced`, hot_share = its mean
    share there, hot_ranks = hot in at least a quarter of those instances (all null or empty when
    no instance reaches `imbalanced`); load figures are null when the group is incomplete or its
    splits were all assumed, since nothing was measured.
    """
    host = ranks.select(pl.col("rank").cast(pl.Int32), "host")
    present = set(host.get_column("rank").to_list())
    known_hosts = not host.filter(pl.col("host").is_null()).height
    p = (pairs.join(host.rename({"rank": "src", "host": "_hs"}), on="src", how="left")
         .join(host.rename({"rank": "dst", "host": "_hd"}), on="dst", how="left")
         .with_columns(pl.col("dst").is_in(list(present)).alias("_in"),
                       (pl.col("src") != pl.col("dst")).alias("_off"),
                       ((pl.col("src") != pl.col("dst")) & pl.col("_hs").is_not_null()
                        & pl.col("_hd").is_not_null() & (pl.col("_hs") != pl.col("_hd"))).alias("_inter")))
    members = p.group_by("instance").agg(pl.col("dst").n_unique().alias("_members"),
                                         pl.col("dst").filter(pl.col("_in")).n_unique().alias("_present"))
    inside = p.filter(pl.col("_in"))
    recv = inside.group_by("instance", "dst").agg(pl.col("bytes").sum().alias("recv"))
    hot = (recv.sort(["instance", "recv", "dst"], descending=[False, True, False])
           .group_by("instance", maintain_order=True)
           .agg(pl.col("dst").first().alias("_top"), pl.col("recv").first().alias("max_recv"),
                pl.col("recv").sum().alias("_tot"), pl.len().alias("_n")))
    inst = (p.group_by("instance").agg(
                pl.col("group").first(), pl.col("step").min(), pl.col("bytes").sum().alias("bytes"),
                pl.col("assumed").any().alias("assumed"),
                pl.col("bytes").filter(pl.col("_off") & pl.col("_in")).sum().alias("_offb"),
                pl.col("bytes").filter(pl.col("_inter") & pl.col("_in")).sum().alias("_interb"))
            .join(members, on="instance").join(hot, on="instance", how="left")
            .with_columns((pl.col("_present") == pl.col("_members")).alias("complete"))
            .with_columns(
                pl.when(pl.col("complete") & ~pl.col("assumed"))
                .then(pl.col("max_recv") / (pl.col("_tot") / pl.col("_n"))).alias("imbalance"),
                pl.when(pl.col("complete") & ~pl.col("assumed"))
                .then(pl.col("max_recv") / pl.col("_tot")).alias("hot_share"),
                pl.when((pl.col("_offb") > 0) & pl.lit(known_hosts))
                .then(pl.col("_interb") / pl.col("_offb")).alias("inter_host_share"))
            .with_columns(pl.col("imbalance").fill_nan(None), pl.col("hot_share").fill_nan(None))
            .with_columns(pl.when(pl.col("imbalance") >= imbalanced).then(pl.col("_top")).alias("hot_rank"))
            .drop("_offb", "_interb", "_tot", "_n", "_top", "_members", "_present").sort("instance"))
    traffic = (inside.group_by("group", "src", "dst")
               .agg(pl.col("bytes").sum(), pl.col("assumed").any()).sort("group", "src", "dst"))
    rows = []
    for g, part in inst.group_by("group", maintain_order=True):
        group = g[0]
        gp = p.filter(pl.col("group").eq_missing(group))
        all_members = sorted(set(gp.get_column("src").to_list()) | set(gp.get_column("dst").to_list()))
        here = [r for r in all_members if r in present]
        measured = part.filter(pl.col("imbalance").is_not_null())
        pick = measured.filter(pl.col("imbalance") >= imbalanced)
        top: dict = {"hot_rank": None, "s": None}
        hot_ranks: list[int] = []
        if pick.height:
            counts = (pick.group_by("hot_rank").agg(pl.len().alias("k"), pl.col("hot_share").mean().alias("s"))
                      .sort(["k", "s", "hot_rank"], descending=[True, True, False]))
            top = counts.row(0, named=True)
            hot_ranks = sorted(counts.filter(pl.col("k") * 4 >= pick.height).get_column("hot_rank").to_list())
        off = gp.filter(pl.col("_off") & pl.col("_in"))
        offb = off.get_column("bytes").sum()
        interb = off.filter(pl.col("_inter")).get_column("bytes").sum()
        rows.append({
            "group": group, "ranks": here, "members": len(all_members), "present": len(here),
            "complete": len(here) == len(all_members), "instances": part.height,
            "splits_assumed": float(part.get_column("assumed").mean() or 0.0),
            "hot_rank": top["hot_rank"], "hot_ranks": hot_ranks, "hot_share": top["s"],
            "imbalance": measured.get_column("imbalance").max() if measured.height else None,
            "imbalance_mean": measured.get_column("imbalance").mean() if measured.height else None,
            "inter_host_share": interb / offb if offb and known_hosts else None,
            "bytes": part.get_column("bytes").sum(),
            "bytes_outside": gp.filter(~pl.col("_in")).get_column("bytes").sum(),
        })
    groups = pl.DataFrame(rows, schema=GROUP_SCHEMA)
    return inst, groups, traffic
