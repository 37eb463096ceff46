"""Per-instance timing on the common clock: stalls, stragglers and bandwidth."""

from __future__ import annotations

import polars as pl

from tracekit.analysis._frames import P2P_OPS

BUS_FACTOR = {"all_reduce": "ar", "all_gather": "ag", "reduce_scatter": "ag", "all_to_all": "ag"}


def participants(collectives: pl.DataFrame, ranks: pl.DataFrame) -> pl.DataFrame:
    """One row per (instance, rank) with aligned arrival/end and the wait it suffered.

    Only calls with a start and a duration count: a Flight Recorder dump without durations gives
    enqueue times, which say nothing about waits. arrive_ns = ts_ns + clock_offset_ns (the common
    clock); wait_ns = the instance's latest arrival minus this rank's arrival; gap_ns = the time
    between the end of this rank's previous instance and this arrival (its own work in between;
    null for its first).
    """
    off = ranks.select(pl.col("rank").cast(pl.Int32), pl.col("clock_offset_ns").fill_null(0).alias("_off"))
    c = (collectives.filter(pl.col("instance").is_not_null() & pl.col("ts_ns").is_not_null()
                            & pl.col("dur_ns").is_not_null())
         .with_columns(pl.col("rank").cast(pl.Int32))
         .join(off, on="rank", how="left")
         .with_columns(pl.col("_off").fill_null(0))
         .with_columns((pl.col("ts_ns") + pl.col("_off")).alias("arrive_ns"),
                       (pl.col("ts_ns") + pl.col("dur_ns").fill_null(0) + pl.col("_off")).alias("end_ns"))
         .unique(["instance", "rank"], keep="first", maintain_order=True))
    c = c.with_columns(pl.len().over("instance").alias("_n")).filter(pl.col("_n") > 1)
    c = c.with_columns((pl.col("arrive_ns").max().over("instance") - pl.col("arrive_ns")).alias("wait_ns"))
    c = c.sort("rank", "arrive_ns", "instance").with_columns(
        (pl.col("arrive_ns") - pl.col("end_ns").shift(1).over("rank")).clip(lower_bound=0).alias("gap_ns"))
    return c.select("instance", "rank", "group", "seq", "op", "dim", "step", "dtype", "in_bytes",
                    "out_bytes", "nranks", "peer", "arrive_ns", "end_ns", "dur_ns", "wait_ns",
                    "gap_ns")


def instances(parts: pl.DataFrame) -> pl.DataFrame:
    """One row per instance: who arrived last and by how much, its duration and bandwidth.

    first_rank = the earliest to arrive (it waited longest), last_rank = the last (the rank the
    others waited on); complete = every member of the group took part (false when ranks are
    missing from the run: the real last rank may be one of them).
    duration_ns = last end - last arrival (the time it ran once everyone was there);
    algbw_gbps = size / duration (bytes per ns = GB/s) with size the all_reduce, reduce_scatter
    and all_to_all input, the all_gather output, or the message; busbw_gbps = algbw x the
    nccl-tests factor (all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n; 1
    otherwise). caused_ns = the part of max_wait_ns that the last rank's own work explains:
    its gap since its previous instance minus the median gap of the others (a rank that arrives
    last only because its previous collective ended late passes lateness on; it does not cause
    it). slot = the instance's place among the calls of its group and op in its step; lead_ns =
    how much later the last rank arrived than the next latest; baseline_lead_ns = that rank's
    usual lead (negative when it usually waits) at the same slot in the other steps (null with
    one step); excess_ns = min(caused_ns, lead_ns - baseline_lead_ns): the part that is not the
    step's regular pattern (pipeline fill, a hot expert) but a one-off.
    """
    last = (latest_first(parts)
            .group_by("instance", maintain_order=True)
            .agg(pl.col("rank").first().alias("last_rank"),
                 pl.col("gap_ns").first().alias("_gap"),
                 pl.col("gap_ns").slice(1).median().alias("_others_gap")))
    size_expr = (
        pl.when(pl.col("op") == "all_gather").then(pl.col("out_bytes").fill_null(pl.col("in_bytes") * pl.col("n")))
        .when(pl.col("op").is_in(["all_reduce", "reduce_scatter", "all_to_all"])).then(pl.col("in_bytes"))
        .otherwise(pl.max_horizontal("in_bytes", "out_bytes"))
    )
    agg = (
        parts.with_columns(pl.len().over("instance").alias("n"))
        .with_columns(size_expr.alias("_size"))
        .group_by("instance")
        .agg(
            pl.col("group").first(), pl.col("seq").min(),
            pl.col("op").first(), pl.col("op").is_in(P2P_OPS).all().alias("_p2p"),
            pl.col("dim").first(), pl.col("step").min(), pl.len().alias("participants"),
            pl.col("nranks").max(), pl.col("dtype").first(), pl.col("_size").max().alias("bytes"),
            pl.col("arrive_ns").min().alias("first_arrival_ns"),
            pl.col("arrive_ns").max().alias("last_arrival_ns"), pl.col("end_ns").max().alias("last_end_ns"),
            pl.col("wait_ns").mean().alias("mean_wait_ns"),
            pl.col("rank").filter(pl.col("op") == "send").first().alias("src"),
            pl.col("rank").filter(pl.col("op") == "recv").first().alias("dst"),
            pl.col("rank").sort_by(["arrive_ns", "rank"]).first().alias("first_rank"),
        )
        .join(last, on="instance")
        .with_columns(pl.when(pl.col("_p2p")).then(pl.lit("send_recv")).otherwise(pl.col("op")).alias("op"))
        .drop("_p2p")
    )
    n = pl.coalesce("nranks", "participants").cast(pl.Float64)
    factor = (pl.when(pl.col("op") == "all_reduce").then(2 * (n - 1) / n)
              .when(pl.col("op").is_in(["all_gather", "reduce_scatter", "all_to_all"])).then((n - 1) / n)
              .otherwise(1.0))
    out = agg.with_columns(
        (pl.col("last_arrival_ns") - pl.col("first_arrival_ns")).alias("max_wait_ns"),
        (pl.col("last_end_ns") - pl.col("last_arrival_ns")).clip(lower_bound=0).alias("duration_ns"),
    ).with_columns(
        pl.when(pl.col("_gap").is_null()).then(pl.col("max_wait_ns"))
        .otherwise(pl.min_horizontal(
            "max_wait_ns", (pl.col("_gap") - pl.col("_others_gap").fill_null(0)).clip(lower_bound=0)))
        .cast(pl.Int64).alias("caused_ns"),
        pl.when(pl.col("duration_ns") > 0).then(pl.col("bytes") / pl.col("duration_ns")).alias("algbw_gbps"),
    ).with_columns((pl.col("algbw_gbps") * factor).alias("busbw_gbps")).drop("_gap", "_others_gap")
    out = out.with_columns(
        pl.col("seq").rank("ordinal").over("group", "op", "step").cast(pl.Int64).alias("slot"),
        (pl.col("participants").cast(pl.Int64) >= pl.coalesce("nranks", "participants").cast(pl.Int64))
        .alias("complete"))
    second = (parts.sort(["instance", "arrive_ns"], descending=[False, True])
              .group_by("instance", maintain_order=True).agg(pl.col("arrive_ns").get(1).alias("_second")))
    lead = (parts.select("instance", "rank", "arrive_ns")
            .join(out.select("instance", "group", "op", "slot", "last_rank", "last_arrival_ns"), on="instance")
            .join(second, on="instance")
            .with_columns(pl.when(pl.col("rank") == pl.col("last_rank"))
                          .then(pl.col("arrive_ns") - pl.col("_second"))
                          .otherwise(pl.col("arrive_ns") - pl.col("last_arrival_ns")).alias("_lead")))
    key = ["group", "op", "slot", "rank"]
    n = pl.len().over(key)
    baseline = (pl.when(n <= 1).then(None)
                .when(n == 2).then(pl.col("_lead").sum().over(key) - pl.col("_lead"))
                .otherwise(pl.col("_lead").median().over(key)))
    lead = (lead.with_columns(baseline.alias("baseline_lead_ns"))
            .filter(pl.col("rank") == pl.col("last_rank"))
            .select("instance", pl.col("_lead").alias("lead_ns"), pl.col("baseline_lead_ns").cast(pl.Int64)))
    out = out.join(lead, on="instance", how="left").with_columns(
        pl.when(pl.col("baseline_lead_ns").is_null()).then(pl.col("caused_ns"))
        .otherwise(pl.min_horizontal(
            "caused_ns", (pl.col("lead_ns") - pl.col("baseline_lead_ns")).clip(lower_bound=0)))
        .cast(pl.Int64).alias("excess_ns"))
    return out.sort("instance")


def stragglers(inst: pl.DataFrame, parts: pl.DataFrame) -> pl.DataFrame:
    """Per rank: times_last, delay_ns (sum of the max wait of the instances where it was last),
    caused_ns (the part its own work explains, see `instances`), excess_ns (net also of the step's
    regular waits, see `instances`), worst_wait_ns, instances it joined, and the steps and
    groups where it was last (largest excess first). Sorted by excess_ns, caused_ns, delay_ns."""
    joined = parts.group_by("rank").agg(pl.len().alias("instances"))
    late = inst.filter(pl.col("max_wait_ns") > 0)
    per = (late.group_by("last_rank")
           .agg(pl.len().alias("times_last"), pl.col("max_wait_ns").sum().alias("delay_ns"),
                pl.col("caused_ns").sum().alias("caused_ns"), pl.col("excess_ns").sum().alias("excess_ns"),
                pl.col("max_wait_ns").max().alias("worst_wait_ns"))
           .rename({"last_rank": "rank"}))
    by_step = (late.group_by("last_rank", "step").agg(pl.col("excess_ns").sum().alias("_c"),
                                                     pl.col("max_wait_ns").sum().alias("_d"))
               .sort(["_c", "_d", "step"], descending=[True, True, False], nulls_last=True)
               .group_by("last_rank", maintain_order=True).agg(pl.col("step").alias("steps"))
               .rename({"last_rank": "rank"}))
    by_group = (late.group_by("last_rank", "group").agg(pl.col("excess_ns").sum().alias("_c"))
                .sort(["_c", "group"], descending=[True, False])
                .group_by("last_rank", maintain_order=True).agg(pl.col("group").alias("groups"))
                .rename({"last_rank": "rank"}))
    out = (joined.join(per, on="rank", how="left").join(by_step, on="rank", how="left")
           .join(by_group, on="rank", how="left")
           .with_columns(pl.col("times_last", "delay_ns", "caused_ns", "excess_ns", "worst_wait_ns")
                         .fill_null(0)))
    return out.sort(["excess_ns", "caused_ns", "delay_ns", "rank"], descending=[True, True, True, False]).select(
        "rank", "times_last", "instances", "delay_ns", "caused_ns", "excess_ns", "worst_wait_ns", "steps",
        "groups")


def latest_first(parts: pl.DataFrame) -> pl.DataFrame:
    """Participants per instance, the last to arrive first (ties: lowest rank): who the others waited for."""
    return parts.sort(["instance", "arrive_ns", "rank"], descending=[False, True, False])


def waited_for(parts: pl.DataFrame) -> pl.DataFrame:
    """Per instance, `source_rank`, the rank every other participant waited for (the sender of a
    send/recv, else the last to arrive), and `last_rank`, the last to arrive."""
    return (latest_first(parts)
            .group_by("instance", maintain_order=True)
            .agg(pl.col("rank").filter(pl.col("op") == "send").first().alias("_sender"),
                 pl.col("rank").first().alias("_last"))
            .select("instance", pl.coalesce("_sender", "_last").alias("source_rank"),
                    pl.col("_last").alias("last_rank")))


def kernel_bandwidth(collectives: pl.DataFrame, inst: pl.DataFrame) -> pl.DataFrame:
    """Bandwidth per (dim, op, group, size) from each call's own kernel time, for the calls no
    other rank of the run joined (a run where one rank was profiled): the only time such a call
    has. A kernel's time includes waiting for the ranks outside the run, so it is an upper bound
    on the transfer time and the algbw/busbw derived from it are lower bounds. Sizes and bus
    factors as in `instances`; columns as the instance-based bandwidth rows, by dim, op, group, size."""
    joined = inst.get_column("instance") if inst.height else pl.Series("instance", [], pl.Int64)
    c = collectives.filter(pl.col("instance").is_not_null() & ~pl.col("instance").is_in(joined.implode())
                           & pl.col("dur_ns").is_not_null() & (pl.col("dur_ns") > 0))
    n = pl.col("nranks").cast(pl.Float64)
    size = (pl.when(pl.col("op") == "all_gather").then(pl.col("out_bytes").fill_null(pl.col("in_bytes") * n))
            .when(pl.col("op").is_in(["all_reduce", "reduce_scatter", "all_to_all"])).then(pl.col("in_bytes"))
            .otherwise(pl.max_horizontal("in_bytes", "out_bytes")))
    factor = (pl.when(n.is_null() | (n < 1)).then(None)
              .when(pl.col("op") == "all_reduce").then(2 * (n - 1) / n)
              .when(pl.col("op").is_in(["all_gather", "reduce_scatter", "all_to_all"])).then((n - 1) / n)
              .otherwise(1.0))
    c = (c.with_columns(size.cast(pl.Int64).alias("bytes"))
         .filter(pl.col("bytes").is_not_null() & (pl.col("bytes") > 0))
         .with_columns((pl.col("bytes") / pl.col("dur_ns")).alias("algbw_gbps"))
         .with_columns((pl.col("algbw_gbps") * factor).alias("busbw_gbps")))
    return (c.group_by("dim", "op", "group", "bytes")
            .agg(pl.len().alias("instances"), pl.col("bytes").median().alias("bytes_median"),
                 pl.col("dur_ns").median().alias("duration_median_ns"),
                 pl.col("algbw_gbps").median().alias("algbw_median_gbps"),
                 pl.col("busbw_gbps").median().alias("busbw_median_gbps"),
                 pl.col("busbw_gbps").quantile(0.1).alias("busbw_p10_gbps"))
            .sort("dim", "op", "group", "bytes", nulls_last=True).drop("bytes")
            .with_columns(pl.col("group").cast(pl.String), pl.col("op").cast(pl.String), pl.col("dim").cast(pl.String)))
