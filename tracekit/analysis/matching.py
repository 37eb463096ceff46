"""Matching: give every collective call the cross-rank instance it belongs to."""

from __future__ import annotations

import polars as pl
import pyarrow as pa

from tracekit import schema
from tracekit.analysis._frames import P2P_OPS, Frame, frame, table

MISMATCH_SCHEMA = pa.schema([
    pa.field("instance", pa.int64()),
    pa.field("group", pa.string()),
    pa.field("seq", pa.int64()),
    pa.field("op", pa.string()),
    pa.field("field", pa.string()),
    pa.field("ranks", pa.list_(pa.int32())),
    pa.field("values", pa.list_(pa.string())),
])

_UNEVEN_OPS = ("all_to_all", "gather", "scatter")


def match_collectives(collectives: Frame) -> tuple[pa.Table, pa.Table]:
    """Number the cross-rank instances of collective calls and flag disagreements.

    A collective instance is (group, seq): `seq` is the explicit sequence number when the source
    has one (`seq_explicit`), else the n-th call on that group on that rank. A send on rank a to
    b and the recv on b from a pair up by their per-pair ordinal. `instance` is the dense rank of
    the sorted key, an int64 that is stable for the same input.

    Returns the collectives with `instance` (and `seq` where it was missing) filled, and a
    mismatches table: instance, group, seq, op, field, ranks, values (one row per field that
    disagrees; fields: op, dtype, in_bytes, out_bytes, bytes for p2p, bytes_total for
    all-to-all, unpaired for a send or recv without its other side).
    """
    df = keyed(frame(collectives, "collectives"))
    mismatches = _mismatches(df)
    out = df.drop("_row", "_kind", "_k", "_src", "_dst", "_g")
    return table(out, "collectives"), mismatches


def keyed(df: pl.DataFrame) -> pl.DataFrame:
    """Add the matching key (_kind, _g, _k, _src, _dst) and `instance` to a collectives frame."""
    if df.height == 0:
        return df.with_columns(
            pl.lit(None, pl.Int64).alias(c) for c in ("_row", "_kind", "_k", "_src", "_dst")
        ).with_columns(pl.lit(None, pl.String).alias("_g"))
    df = df.with_row_index("_row").with_columns(pl.col("_row").cast(pl.Int64))
    order = [pl.col("ts_ns").fill_null(0), pl.col("coll_id")]
    is_p2p = pl.col("op").is_in(P2P_OPS) & pl.col("peer").is_not_null()
    df = df.with_columns(
        pl.col("group").fill_null("").alias("_g"),
        is_p2p.alias("_is_p2p"),
    )
    implicit = (
        pl.int_range(pl.len(), dtype=pl.Int64).sort_by(order).over(["rank", "_g", "_is_p2p"])
    )
    df = df.with_columns(
        pl.when(pl.col("seq").is_null() & ~pl.col("_is_p2p")).then(implicit)
        .otherwise(pl.col("seq")).alias("seq"),
        pl.col("seq_explicit").fill_null(pl.col("seq").is_not_null()),
    )
    src = pl.when(pl.col("op") == "send").then(pl.col("rank")).otherwise(pl.col("peer"))
    dst = pl.when(pl.col("op") == "send").then(pl.col("peer")).otherwise(pl.col("rank"))
    df = df.with_columns(
        pl.when(pl.col("_is_p2p")).then(src).otherwise(-1).cast(pl.Int64).alias("_src"),
        pl.when(pl.col("_is_p2p")).then(dst).otherwise(-1).cast(pl.Int64).alias("_dst"),
        pl.col("_is_p2p").cast(pl.Int64).alias("_kind"),
    )
    ordinal = (
        pl.int_range(pl.len(), dtype=pl.Int64)
        .sort_by([pl.col("seq").fill_null(0), *order])
        .over(["rank", "_g", "op", "_src", "_dst"])
    )
    df = df.with_columns(
        pl.when(pl.col("_is_p2p")).then(ordinal).otherwise(pl.col("seq")).alias("_k")
    ).drop("_is_p2p")
    key = ["_g", "_kind", "_k", "_src", "_dst"]
    keys = df.select(key).unique().sort(key).with_row_index("instance")
    keys = keys.with_columns(pl.col("instance").cast(pl.Int64))
    return df.drop("instance").join(keys, on=key, how="left", nulls_equal=True, maintain_order="left")


def _mismatches(df: pl.DataFrame) -> pa.Table:
    if df.height == 0:
        return schema.empty_table(MISMATCH_SCHEMA)
    coll = df.filter(pl.col("_kind") == 0)
    p2p = df.filter(pl.col("_kind") == 1)
    found: list[pl.DataFrame] = []

    def differing(part: pl.DataFrame, field: str, value: pl.Expr) -> None:
        part = part.with_columns(value.cast(pl.String).alias("_v"))
        bad = (
            part.filter(pl.col("_v").is_not_null())
            .group_by("instance").agg(pl.col("_v").n_unique().alias("_n"))
            .filter(pl.col("_n") > 1).select("instance")
        )
        if bad.height:
            found.append(_listing(part.join(bad, on="instance"), field))

    differing(coll, "op", pl.col("op"))
    differing(coll, "dtype", pl.col("dtype"))
    even = coll.filter(~pl.col("op").is_in(_UNEVEN_OPS))
    differing(even, "in_bytes", pl.col("in_bytes"))
    differing(even, "out_bytes", pl.col("out_bytes"))
    a2a = coll.filter(pl.col("op") == "all_to_all")
    if a2a.height:
        totals = a2a.group_by("instance").agg(
            pl.col("in_bytes").sum().alias("_in"), pl.col("out_bytes").sum().alias("_out"),
            pl.col("in_bytes").is_null().any().alias("_nul"),
        ).filter(~pl.col("_nul") & (pl.col("_in") != pl.col("_out")))
        if totals.height:
            part = a2a.join(totals.select("instance"), on="instance").with_columns(
                pl.format("in={} out={}", "in_bytes", "out_bytes").alias("_v"))
            found.append(_listing(part, "bytes_total"))
    if p2p.height:
        differing(p2p, "dtype", pl.col("dtype"))
        differing(p2p, "bytes", pl.max_horizontal("in_bytes", "out_bytes"))
        sides = p2p.group_by("instance").agg(
            (pl.col("op") == "send").sum().alias("_s"), (pl.col("op") == "recv").sum().alias("_r"))
        bad = sides.filter((pl.col("_s") != 1) | (pl.col("_r") != 1)).select("instance")
        if bad.height:
            found.append(_listing(p2p.join(bad, on="instance").with_columns(
                pl.col("op").alias("_v")), "unpaired"))
    if not found:
        return schema.empty_table(MISMATCH_SCHEMA)
    out = pl.concat(found, how="vertical_relaxed").sort(["instance", "field"])
    return out.to_arrow().cast(MISMATCH_SCHEMA)


def _listing(part: pl.DataFrame, field: str) -> pl.DataFrame:
    return (
        part.sort(["instance", "rank"])
        .group_by("instance", maintain_order=True)
        .agg(
            pl.col("group").first(), pl.col("_k").first().alias("seq"), pl.col("op").first(),
            pl.col("rank").cast(pl.Int32).alias("ranks"), pl.col("_v").cast(pl.String).alias("values"),
        )
        .with_columns(pl.lit(field).alias("field"))
        .select("instance", "group", "seq", "op", "field", "ranks", "values")
    )
