"""Input format detection by content (the first kilobytes, gunzipped transparently), never by name."""

from __future__ import annotations

import os
import re

from tracekit.parsers._stream import peek

KINETO = "kineto"
NCCL_LOG = "nccl_log"
FLIGHT_RECORDER = "flight_recorder"
NCCL_INSPECTOR = "nccl_inspector"
NCCL_TESTS = "nccl_tests"
NCCL_PROFILER = "nccl_profiler"
PROMETHEUS = "prometheus"
PROMETHEUS_JSON = "prometheus_json"
GNMIC = "gnmic"
PERFQUERY = "perfquery"
UFM = "ufm_telemetry"
SYSFS_IB = "sysfs_ib"
IBNETDISCOVER = "ibnetdiscover"
LINK_MAP = "link_map"
NSYS = "nsys"

#: Telemetry and fabric formats (sources with no rank): parser modules under parsers/telemetry/.
TELEMETRY_FORMATS = (PROMETHEUS, PROMETHEUS_JSON, GNMIC, PERFQUERY, UFM, SYSFS_IB, IBNETDISCOVER, LINK_MAP)
#: Every format name tracekit knows.
FORMATS = (KINETO, NSYS, NCCL_LOG, FLIGHT_RECORDER, NCCL_INSPECTOR, NCCL_TESTS, NCCL_PROFILER, *TELEMETRY_FORMATS)
#: Formats that can be ingested today: format -> parser module (with `parse` and PARSER_VERSION).
PARSERS = {KINETO: "tracekit.parsers.kineto", NSYS: "tracekit.parsers.nsys",
           FLIGHT_RECORDER: "tracekit.parsers.flight_recorder", NCCL_TESTS: "tracekit.parsers.nccl_tests",
           NCCL_LOG: "tracekit.parsers.nccl_log",
           NCCL_INSPECTOR: "tracekit.parsers.nccl_inspector", NCCL_PROFILER: "tracekit.parsers.nccl_profiler",
           **{fmt: f"tracekit.parsers.telemetry.{fmt}" for fmt in TELEMETRY_FORMATS}}

#: How each format is called in messages, traces first, then telemetry.
DESCRIPTIONS = {
    KINETO: "Kineto traces", NSYS: "Nsight Systems exports", FLIGHT_RECORDER: "Flight Recorder dumps",
    NCCL_LOG: "NCCL logs", NCCL_INSPECTOR: "NCCL Inspector", NCCL_PROFILER: "profiler-plugin files",
    NCCL_TESTS: "nccl-tests output",
    PROMETHEUS: "Prometheus text", PROMETHEUS_JSON: "Prometheus query_range JSON", GNMIC: "gnmic output",
    PERFQUERY: "perfquery -x", UFM: "UFM telemetry JSON", SYSFS_IB: "sysfs InfiniBand counters",
    IBNETDISCOVER: "ibnetdiscover -p", LINK_MAP: "link maps",
}


def supported_formats() -> str:
    """ "traces: Kineto traces, ...; telemetry: Prometheus text, ...": every format ingest reads."""
    traces = [DESCRIPTIONS[f] for f in PARSERS if f not in TELEMETRY_FORMATS]
    telemetry = [DESCRIPTIONS[f] for f in TELEMETRY_FORMATS if f in PARSERS]
    return f"traces: {', '.join(traces)}; telemetry: {', '.join(telemetry)}"


PEEK_BYTES = 65536
_KINETO_KEYS = re.compile(rb'"(traceEvents|schemaVersion|deviceProperties|distributedInfo)"\s*:')


def detect_bytes(head: bytes) -> str | None:
    """The format of a file whose first (decompressed) bytes are `head`, or None."""
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if text.startswith(b"{") and _KINETO_KEYS.search(text):
        return KINETO
    from tracekit.parsers import flight_recorder

    if flight_recorder.sniff(head):
        return FLIGHT_RECORDER
    from tracekit.parsers import nccl_inspector, nccl_log, nccl_profiler, nccl_tests

    if nccl_tests.sniff_json(head):
        return NCCL_TESTS
    if nccl_inspector.sniff(head):
        return NCCL_INSPECTOR
    if nccl_profiler.sniff(head):
        return NCCL_PROFILER
    if not text.startswith(b"{"):
        if nccl_log.sniff(head):
            return NCCL_LOG
        if nccl_tests.sniff_text(head):
            return NCCL_TESTS
    return _detect_telemetry(head)


def _detect_telemetry(head: bytes) -> str | None:
    """Telemetry and fabric formats, each by its own `sniff` (first match wins)."""
    import importlib

    for fmt in TELEMETRY_FORMATS:
        module = importlib.import_module(PARSERS[fmt])
        if module.sniff(head):
            return fmt
    return None


def detect_format(path: str | os.PathLike[str]) -> str | None:
    """Detect a file's format from its content; None when unknown or unreadable."""
    try:
        head = peek(path, PEEK_BYTES)
    except OSError:
        return None
    from tracekit.parsers import nsys

    if nsys.sniff_path(path, head):
        return NSYS
    return detect_bytes(head)
