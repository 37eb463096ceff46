"""Small hand-built tables for the analysis tests."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from tracekit import schema


def coll_table(rows: list[dict[str, Any]]) -> pa.Table:
    """Collectives from dicts; coll_id defaults to the row index."""
    if not rows:
        return schema.empty("collectives")
    cols: dict[str, list[Any]] = {}
    for i, r in enumerate(rows):
        r = {"coll_id": i, **r}
        for k in r:
            cols.setdefault(k, [None] * i)
        for k in cols:
            cols[k].append(r.get(k))
    return schema.conform("collectives", {k: pa.array(v, type=schema.COLLECTIVES.field(k).type
                                                        if k in schema.COLLECTIVES.names else None)
                                          for k, v in cols.items()})


def ranks_table(n: int, hosts: list[str] | None = None) -> pa.Table:
    return schema.conform("ranks", {"rank": list(range(n)), "world_size": [n] * n,
                                    "host": hosts or ["h0"] * n})


def groups_table(groups: list[tuple[str, str | None, list[int]]]) -> pa.Table:
    return schema.conform("groups", {"group": [g for g, _, _ in groups], "desc": [d for _, d, _ in groups],
                                     "ranks": [r for _, _, r in groups], "size": [len(r) for _, _, r in groups]})


def events_table(rows: list[dict[str, Any]]) -> pa.Table:
    keys = ["rank", "lane", "kind", "name", "ts_ns", "dur_ns", "step", "coll_id"]
    return schema.conform("events", {k: pa.array([r.get(k) for r in rows], type=schema.EVENTS.field(k).type)
                                     for k in keys})


def strip_derived(tables: dict[str, pa.Table]) -> dict[str, pa.Table]:
    """Remove what the analysis must find itself: instance, dim, clock offsets, group dims."""
    out = dict(tables)
    c = out["collectives"]
    for col in ("instance", "dim"):
        i = c.schema.get_field_index(col)
        c = c.set_column(i, c.schema.field(col), pa.nulls(c.num_rows, c.schema.field(col).type))
    out["collectives"] = c
    r = out["ranks"]
    i = r.schema.get_field_index("clock_offset_ns")
    out["ranks"] = r.set_column(i, r.schema.field(i), pa.nulls(r.num_rows, pa.int64()))
    g = out["groups"]
    i = g.schema.get_field_index("dims")
    out["groups"] = g.set_column(i, g.schema.field(i), pa.nulls(g.num_rows, g.schema.field(i).type))
    return out
