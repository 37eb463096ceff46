"""The manifest's typed schema stays in step with what ingest writes into it."""

from __future__ import annotations

import msgspec

from tracekit.ingest import SourceReport
from tracekit.manifest import SourceEntry
from tracekit.results import to_builtins


def test_source_entry_checks_every_field_a_source_report_writes():
    written = set(SourceReport.__struct_fields__)
    checked = set(SourceEntry.__struct_fields__)
    assert written <= checked, sorted(written - checked)
    msgspec.convert(to_builtins(SourceReport(path="a.json", size=3)), SourceEntry, strict=True)
