"""The manifest's typed schema stays in step with what ingest writes into it."""

from __future__ import annotations

import dataclasses

import msgspec

from tracekit.ingest import SourceReport
from tracekit.manifest import SourceEntry


def test_source_entry_checks_every_field_a_source_report_writes():
    written = {f.name for f in dataclasses.fields(SourceReport)}
    checked = set(SourceEntry.__struct_fields__)
    assert written <= checked, sorted(written - checked)
    msgspec.convert(msgspec.to_builtins(dataclasses.asdict(SourceReport(path="a.json", size=3))), SourceEntry,
                    strict=True)
