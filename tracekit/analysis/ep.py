"""Expert parallelism: traffic matrices from all-to-all splits, load imbalance, hot ranks."""

from __future__ import annotations

import polars as pl

_PAIR_SCHEMA = {"instance": pl.Int64, "group": pl.String, "step": pl.Int32, "src": pl.Int32,
                "dst": pl.Int32, "bytes": pl.Int64}


def ep_pairs(collectives: pl.DataFrame, groups: pl.DataFrame) -> pl.DataFrame:
    """Bytes src -> dst for every EP all-to-all instance (instance, group, step, src, dst, bytes).

    in_splits[j] on rank r is what r sends to the j-th member of the group (groups.ranks order,
    or the sorted participants when the group's membership is unknown). Without splits, or with
    splits whose length does not match the group, the input is taken as evenly split.
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
    rows = rows.with_columns(pl.when(good).then(pl.col("in_splits")).otherwise(even).alias("_splits"))
    pairs = (rows.select("instance", "group", "step", pl.col("rank").cast(pl.Int32).alias("src"),
                         pl.col("_members").alias("dst"), pl.col("_splits").alias("bytes"))
             .explode(["dst", "bytes"]))
    return pairs.cast(_PAIR_SCHEMA).filter(pl.col("bytes").is_not_null() & (pl.col("bytes") > 0))


def ep_summary(pairs: pl.DataFrame, ranks: pl.DataFrame, *, imbalanced: float = 1.1
               ) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """Per instance and per group load figures, plus the run's traffic matrix.

    Returns (ep_instances, ep_groups, ep_traffic). Per instance: bytes, received bytes per rank,
    imbalance = max/mean of received bytes over the members, hot_rank (most received),
    hot_share (its share of the bytes), inter_host_share (bytes between hosts over bytes
    between distinct ranks). Per group: hot_rank = the rank most often hot among instances
    with imbalance >= `imbalanced` (all instances when none is), hot_share = its mean share in
    those, imbalance = the largest, imbalance_mean, inter_host_share over the run, and
    hot_ranks (hot in at least a quarter of those instances).
    """
    host = ranks.select(pl.col("rank").cast(pl.Int32), "host")
    p = (pairs.join(host.rename({"rank": "src", "host": "_hs"}), on="src", how="left")
         .join(host.rename({"rank": "dst", "host": "_hd"}), on="dst", how="left")
         .with_columns((pl.col("src") != pl.col("dst")).alias("_off"),
                       ((pl.col("src") != pl.col("dst")) & pl.col("_hs").is_not_null()
                        & pl.col("_hd").is_not_null() & (pl.col("_hs") != pl.col("_hd"))).alias("_inter")))
    recv = p.group_by("instance", "dst").agg(pl.col("bytes").sum().alias("recv"))
    members = p.group_by("instance").agg(pl.col("src").n_unique().alias("_n"))
    hot = (recv.sort(["instance", "recv", "dst"], descending=[False, True, False])
           .group_by("instance", maintain_order=True)
           .agg(pl.col("dst").first().alias("hot_rank"), pl.col("recv").first().alias("max_recv"),
                pl.col("recv").sum().alias("_tot")))
    inst = (p.group_by("instance").agg(
                pl.col("group").first(), pl.col("step").min(), pl.col("bytes").sum().alias("bytes"),
                pl.col("bytes").filter(pl.col("_off")).sum().alias("_offb"),
                pl.col("bytes").filter(pl.col("_inter")).sum().alias("_interb"))
            .join(hot, on="instance").join(members, on="instance")
            .with_columns(
                (pl.col("max_recv") / (pl.col("_tot") / pl.col("_n"))).alias("imbalance"),
                (pl.col("max_recv") / pl.col("_tot")).alias("hot_share"),
                pl.when(pl.col("_offb") > 0).then(pl.col("_interb") / pl.col("_offb")).alias("inter_host_share"))
            .with_columns(pl.col("imbalance").fill_nan(None), pl.col("hot_share").fill_nan(None))
            .drop("_offb", "_interb", "_tot", "_n").sort("instance"))
    traffic = p.group_by("group", "src", "dst").agg(pl.col("bytes").sum()).sort("group", "src", "dst")
    rows = []
    for g, part in inst.group_by("group", maintain_order=True):
        group = g[0]
        pick = part.filter(pl.col("imbalance") >= imbalanced)
        if pick.height == 0:
            pick = part
        counts = pick.group_by("hot_rank").agg(pl.len().alias("k"), pl.col("hot_share").mean().alias("s"))
        counts = counts.sort(["k", "s", "hot_rank"], descending=[True, True, False])
        top = counts.row(0, named=True)
        tr = traffic.filter(pl.col("group") == group)
        ranks_in = sorted(set(tr.get_column("src").to_list()) | set(tr.get_column("dst").to_list()))
        off = p.filter((pl.col("group") == group) & pl.col("_off"))
        offb = off.get_column("bytes").sum()
        interb = off.filter(pl.col("_inter")).get_column("bytes").sum()
        rows.append({
            "group": group, "ranks": ranks_in, "instances": part.height, "hot_rank": top["hot_rank"],
            "hot_ranks": sorted(counts.filter(pl.col("k") * 4 >= pick.height).get_column("hot_rank").to_list()),
            "hot_share": top["s"], "imbalance": part.get_column("imbalance").max(),
            "imbalance_mean": part.get_column("imbalance").mean(),
            "inter_host_share": interb / offb if offb else None,
            "bytes": part.get_column("bytes").sum(),
        })
    groups = pl.DataFrame(rows, schema={
        "group": pl.String, "ranks": pl.List(pl.Int32), "instances": pl.Int64, "hot_rank": pl.Int32,
        "hot_ranks": pl.List(pl.Int32), "hot_share": pl.Float64, "imbalance": pl.Float64,
        "imbalance_mean": pl.Float64, "inter_host_share": pl.Float64, "bytes": pl.Int64})
    return inst, groups, traffic
