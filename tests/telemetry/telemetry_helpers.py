"""Helpers for telemetry tests: where the real samples live, a one-file parse, and builders of
small inputs with known answers."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tracekit import schema
from tracekit.parsers import detect, registry
from tracekit.store import ParseResult, SourceSink

REAL = Path(__file__).parents[2] / ".." / "shared" / "real_traces" / "telemetry"
T0_MS = 1_760_000_000_000
T0_NS = T0_MS * 1_000_000


@dataclass
class Parsed:
    result: ParseResult
    fmt: str
    counters: pa.Table
    nodes: pa.Table
    links: pa.Table


def parse_file(path: Path, out: Path, key: str = "k") -> Parsed:
    """Detect and parse one file into its own sink; read back what it stored."""
    fmt = detect.detect_format(path)
    assert fmt is not None, f"{path}: not detected"
    module = importlib.import_module(registry.MODULES[fmt])
    sink = SourceSink(out, key)
    try:
        res = module.parse(path, sink)
    finally:
        sink.close()
    assert res.stats.balanced, res.stats.counts()

    def table(name: str) -> pa.Table:
        p = out / "sources" / key / f"{name}.parquet"
        return schema.conform(name, pq.read_table(p)) if p.is_file() else schema.empty(name)

    return Parsed(res, fmt, table("counters"), table("topology_nodes"), table("topology_links"))


def prom_line(name: str, labels: dict[str, str], value: float | int | str, ts_ms: int | None = None) -> str:
    body = ",".join(f'{k}="{v}"' for k, v in labels.items())
    stamp = "" if ts_ms is None else f" {ts_ms}"
    return f"{name}{{{body}}} {value}{stamp}"


def rows(table: pa.Table, **match: str) -> list[dict]:
    """The rows of a table (strings compared as text) whose columns equal `match`."""
    out = []
    for r in table.to_pylist():
        if all(str(r.get(k)) == str(v) for k, v in match.items()):
            out.append(r)
    return out
