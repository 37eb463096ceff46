"""Conversions between Arrow tables and polars frames, shared by the analyses."""

from __future__ import annotations

from typing import Any

import polars as pl
import pyarrow as pa

from tracekit import schema

Frame = pa.Table | pl.DataFrame | pl.LazyFrame

P2P_OPS = ("send", "recv")


def frame(data: Frame | None, name: str) -> pl.DataFrame:
    """A polars frame with the named table's columns; dictionary columns become plain strings."""
    if data is None:
        data = schema.empty(name)
    if isinstance(data, pl.LazyFrame):
        data = data.collect()
    if isinstance(data, pl.DataFrame):
        df = data
    else:
        df = pl.from_arrow(schema.conform(name, data))
        assert isinstance(df, pl.DataFrame)
    missing = [f for f in schema.SCHEMAS[name] if f.name not in df.columns]
    if missing:
        empty = pl.from_arrow(schema.empty_table(pa.schema(missing)))
        assert isinstance(empty, pl.DataFrame)
        df = df.with_columns(pl.lit(None, dtype=empty.schema[f.name]).alias(f.name) for f in missing)
    return df.with_columns(pl.col(pl.Categorical, pl.Enum).cast(pl.String))


def table(df: pl.DataFrame, name: str | None = None) -> pa.Table:
    """Back to Arrow, conformed to the named schema when given."""
    out = df.to_arrow()
    if name is not None:
        return schema.conform(name, out)
    return out.cast(pa.schema([_plain(f) for f in out.schema]))


def _plain(field: pa.Field) -> pa.Field:
    t = field.type
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.field(field.name, pa.string())
    if pa.types.is_large_list(t):
        return pa.field(field.name, pa.list_(_plain(pa.field("item", t.value_type)).type))
    return field


def records(df: pl.DataFrame) -> list[dict[str, Any]]:
    """Rows as plain dicts (for JSON)."""
    return df.to_dicts()
