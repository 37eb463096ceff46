"""Helpers for parser tests: where the real traces live and a one-source parse helper."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tracekit import schema
from tracekit.parsers import kineto
from tracekit.store import SourceSink

REAL = Path(__file__).parents[2] / ".." / "shared" / "real_traces" / "kineto"


@dataclass
class Parsed:
    result: kineto.KinetoResult
    events: pa.Table
    collectives: pa.Table
    groups: pa.Table
    ranks: pa.Table


def parse_into(path: Path, out: Path, key: str = "k", **kwargs) -> Parsed:
    sink = SourceSink(out, key)
    try:
        res = kineto.parse(path, sink, **kwargs)
    finally:
        sink.close()
    files = sorted((out / "events").glob(f"rank=*/{key}.parquet"))
    events = (pa.concat_tables([pq.read_table(f) for f in files]) if files
              else schema.empty("events"))

    def small(name: str) -> pa.Table:
        p = out / "sources" / key / f"{name}.parquet"
        return pq.read_table(p) if p.is_file() else schema.empty(name)

    return Parsed(res, events, small("collectives"), small("groups"), small("ranks"))
