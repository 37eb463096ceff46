"""Helpers for the NCCL log tests: parse a file or some lines into tables."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tracekit import schema
from tracekit.parsers import nccl_log
from tracekit.store import SourceSink

TABLES = ("ranks", "groups", "collectives", "channels", "log_messages", "microbench",
          "unranked_collectives")


@dataclass
class Parsed:
    result: nccl_log.NcclLogResult
    tables: dict[str, pa.Table]

    def rows(self, name: str) -> list[dict]:
        return self.tables[name].to_pylist()


def parse_file(path: Path, out: Path, key: str = "k") -> Parsed:
    sink = SourceSink(out, key)
    try:
        res = nccl_log.parse(path, sink)
    finally:
        sink.close()
    tables = {}
    for name in TABLES:
        p = out / "sources" / key / f"{name}.parquet"
        tables[name] = schema.conform(name, pq.read_table(p)) if p.is_file() else schema.empty(name)
        assert not schema.validate(name, tables[name]), schema.validate(name, tables[name])
    assert res.stats.balanced, res.stats.counts()
    return Parsed(res, tables)


def parse_lines(lines: list[str], tmp: Path, name: str = "nccl.log") -> Parsed:
    path = tmp / name
    path.write_text("\n".join(lines) + "\n")
    return parse_file(path, tmp / ("run-" + name))
