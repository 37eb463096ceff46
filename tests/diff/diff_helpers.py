"""Synthetic pairs for the diff tests: one base run and variants with one known change each."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tests.analysis.analysis_helpers import strip_derived
from tracekit.synth import SynthSpec, make_run_tables

#: 4 hosts x 4 GPUs, PP=2 (stage 0 on node000-001, stage 1 on node002-003), 5 steps, no straggler.
BASE: dict[str, Any] = {"hosts": 4, "gpus_per_host": 4, "pp": 2, "ep": 2, "steps": 5, "straggler_rank": None,
                        "seed": 0}


def synth(**changes: Any) -> dict[str, pa.Table]:
    """The base run with `changes` to its spec, derived columns stripped."""
    tables, _ = make_run_tables(SynthSpec(**{**BASE, **changes}))
    return strip_derived(tables)


def shift_rank_clock(tables: dict[str, pa.Table], rank: int, ns: int) -> dict[str, pa.Table]:
    """The same run with one rank's own clock moved by `ns` (its events and collectives)."""
    out = dict(tables)
    for name in ("events", "collectives"):
        t = out[name]
        ts = t.column("ts_ns")
        moved = pc.if_else(pc.equal(t.column("rank"), rank), pc.add(ts, ns), ts)
        out[name] = t.set_column(t.schema.get_field_index("ts_ns"), "ts_ns", moved)
    return out


def drop_ranks(tables: dict[str, pa.Table], ranks: set[int]) -> dict[str, pa.Table]:
    """The run as if the traces of `ranks` were lost (world size kept)."""
    out = dict(tables)
    for name in ("ranks", "events", "collectives"):
        t = out[name]
        out[name] = t.filter(pc.invert(pc.is_in(t.column("rank"), pa.array(sorted(ranks), t.column("rank").type))))
    return out


def shift_steps(tables: dict[str, pa.Table], by: int) -> dict[str, pa.Table]:
    """The same run with its step numbers moved by `by` (another profiler schedule): the step
    columns and the `ProfilerStep#N` annotations."""
    import polars as pl

    from tracekit import schema

    out = dict(tables)
    for name in ("events", "collectives"):
        df = pl.from_arrow(out[name]).with_columns(pl.col("step") + by)
        if name == "events":
            n = pl.col("name").cast(pl.String)
            num = n.str.extract(r"^ProfilerStep#(\d+)$", 1).cast(pl.Int64)
            df = df.with_columns(pl.when(num.is_not_null()).then(pl.format("ProfilerStep#{}", num + by))
                                 .otherwise(n).alias("name"))
        out[name] = schema.conform(name, df.to_arrow())
    return out
