"""The parser registry: every format declared once by its module, one detection order, and the
same answer as the hand-written ladder it replaced (kept here as the naive twin)."""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from tracekit.parsers import detect, registry

REPO = Path(__file__).parents[2]
DATA = Path(__file__).parent / "nccl_data"


def ladder(head: bytes) -> str | None:
    """Detection from bytes as parsers/detect.py wrote it before the registry (the naive twin)."""
    import re

    from tracekit.parsers import flight_recorder, nccl_inspector, nccl_log, nccl_profiler, nccl_tests
    from tracekit.parsers.telemetry import (
        gnmic,
        ibnetdiscover,
        link_map,
        perfquery,
        prometheus,
        prometheus_json,
        sysfs_ib,
        ufm_telemetry,
    )

    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if text.startswith(b"{") and re.search(rb'"(traceEvents|schemaVersion|deviceProperties|distributedInfo)"\s*:',
                                           text):
        return "kineto"
    if flight_recorder.sniff(head):
        return "flight_recorder"
    if nccl_tests.sniff_json(head):
        return "nccl_tests"
    if nccl_inspector.sniff(head):
        return "nccl_inspector"
    if nccl_profiler.sniff(head):
        return "nccl_profiler"
    if not text.startswith(b"{"):
        if nccl_log.sniff(head):
            return "nccl_log"
        if nccl_tests.sniff_text(head):
            return "nccl_tests"
    for module in (prometheus, prometheus_json, gnmic, perfquery, ufm_telemetry, sysfs_ib, ibnetdiscover, link_map):
        if module.sniff(head):
            return module.NAME
    return None


def test_every_format_is_declared_once_by_its_module():
    every = registry.formats()
    assert [f.name for f in every] == list(registry.MODULES) == list(registry.names())
    for spec in every:
        assert registry.DETECTION.count(spec.name) == len(spec.sniffs), spec.name
        assert spec.parse.__module__ == registry.MODULES[spec.name]
        assert set(spec.options) <= {"comm_patterns", "rank_map"}
    assert set(registry.DETECTION) == set(registry.MODULES)
    assert registry.get("no_such_format") is None and registry.priority(None) == 99


def test_the_message_lists_formats_as_before():
    assert registry.supported_formats() == (
        "traces: Kineto traces, Nsight Systems exports, Flight Recorder dumps, nccl-tests output, NCCL logs, "
        "NCCL Inspector, profiler-plugin files; telemetry: Prometheus text, Prometheus query_range JSON, "
        "gnmic output, perfquery -x, UFM telemetry JSON, sysfs InfiniBand counters, ibnetdiscover -p, link maps")


def test_the_registry_imports_no_parser():
    code = ("import sys, tracekit.parsers.registry, tracekit.parsers.detect\n"
            "print(' '.join(m for m in sys.modules if m.startswith('tracekit.parsers.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = set(out.split())
    assert not loaded & set(registry.MODULES.values()), loaded


def test_ambiguous_heads_follow_the_order():
    """A test run with NCCL_DEBUG=INFO is a log; an -J report that also looks like Inspector JSONL
    is nccl-tests; line formats do not look at a JSON object."""
    log_and_table = (b"node1:123:123 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>\n"
                     b"#  nThread 1 nGpus 8 minBytes 8 maxBytes 128 step: 2(factor)\n")
    both_json = b'{"results": [], "nccl_version": "2.21", "header": 1, "coll_perf": 2}\n'
    assert detect.detect_bytes(log_and_table) == ladder(log_and_table) == "nccl_log"
    assert detect.detect_bytes(both_json) == ladder(both_json) == "nccl_tests"
    assert detect.detect_bytes(b"#  nThread 1 nGpus 8 minBytes 8 maxBytes 128\n") == "nccl_tests"


def _lines() -> list[bytes]:
    """First lines of the repository's inputs of several formats, and markers of the others."""
    out = [b"node1:123:123 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>",
           b"node1:123:125 [1] NCCL INFO comm 0x55d0 rank 1 nranks 8 cudaDev 1 busId 1b000 - Init COMPLETE",
           b'{"pg_config": {}, "entries": [{"collective_seq_id": 1, "profiling_name": "nccl:all_reduce"}]}',
           b'"traceEvents": [', b'{"schemaVersion": 1,', b"# HELP x_bytes_total bytes", b"# TYPE x counter",
           b'x_bytes_total{port="1"} 12 1700000000000', b'{"status": "success", "data": {"resultType": "matrix"',
           b"# Port counters: Lid 3 port 1", b"PortXmitData:....................12345", b"[", b"{", b"}", b""]
    for path in sorted(DATA.glob("*")) + sorted((REPO / "sample_traces" / "nccl_tests").glob("*.txt")):
        raw = path.read_bytes()
        raw = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
        out += [line[:400] for line in raw.splitlines()[:12]]
    return out


LINES = _lines()


@settings(max_examples=400, deadline=None, derandomize=True)
@given(st.lists(st.sampled_from(LINES), min_size=1, max_size=6), st.sampled_from([b"", b"\xef\xbb\xbf", b"  \n"]))
def test_detection_matches_the_old_ladder(lines: list[bytes], prefix: bytes):
    head = prefix + b"\n".join(lines)
    assert detect.detect_bytes(head) == ladder(head)


def test_nsys_needs_the_file(tmp_path: Path):
    """An Nsight report is recognised from the file (suffix, SQLite), never from bytes alone."""
    report = tmp_path / "run.nsys-rep"
    report.write_bytes(b"\x00\x01binary")
    assert detect.detect_format(report) == "nsys"
    assert detect.detect_bytes(b"\x00\x01binary") is None
