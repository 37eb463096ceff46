"""A single line longer than the bound (a 2 GB file with no newline) is skipped and counted by
the line readers and refused clearly by the telemetry text readers, in memory bounded by the
bound, never buffered whole (issue 22). The bound is patched small so the files stay small."""

from __future__ import annotations

import gzip
import tracemalloc
from pathlib import Path

import nccl_eras
import pytest

from tracekit.errors import InputError
from tracekit.parsers import _lines, nccl_inspector, nccl_log, nccl_profiler, nccl_tests
from tracekit.parsers.telemetry import ibnetdiscover, link_map, perfquery, prometheus, sysfs_ib
from tracekit.store import SourceSink

DATA = Path(__file__).resolve().parent / "nccl_data"
BOUND = 4096


def test_line_batches_skip_long_lines_and_count_them(tmp_path: Path) -> None:
    path = tmp_path / "log.txt"
    path.write_bytes(b"ok1\n" + b"x" * 10_000 + b"\nok2\n" + b"a" * 3000 + b"\n" + b"y" * 5000)
    info = _lines.LineSource()
    lines = [ln for batch in _lines.line_batches(path, info, batch_bytes=256, max_line_bytes=BOUND) for ln in batch]
    assert lines == [b"ok1", b"ok2", b"a" * 3000]
    assert info.long_lines == 2


@pytest.mark.parametrize("gz", [False, True])
def test_memory_stays_within_the_bound_on_a_file_with_no_newline(tmp_path: Path, gz: bool) -> None:
    """48 MiB without a newline, a 1 MiB bound: the reader's peak is a few times the bound."""
    body = b"NCCL INFO " + b"z" * (48 << 20) + b"\nlast line\n"
    path = tmp_path / ("big.txt.gz" if gz else "big.txt")
    path.write_bytes(gzip.compress(body, compresslevel=1) if gz else body)
    del body
    info = _lines.LineSource()
    tracemalloc.start()
    try:
        lines = [ln for b in _lines.line_batches(path, info, batch_bytes=256 << 10, max_line_bytes=1 << 20)
                 for ln in b]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert lines == [b"last line"] and info.long_lines == 1
    assert peak < 6 << 20, f"peak {peak / 2**20:.1f} MiB"


def _with_long_line(text: bytes, at: int) -> bytes:
    lines = text.split(b"\n")
    at = min(at, len(lines) - 1)
    return b"\n".join([*lines[:at], b"q" * (3 * BOUND), *lines[at:]])


def _nccl_log(tmp_path: Path) -> Path:
    path = tmp_path / "node.log"
    path.write_text("\n".join(nccl_eras.job_log(nccl_eras.Job("2.29"))) + "\n")
    return path


CASES = {
    "nccl_log": (nccl_log, _nccl_log),
    "nccl_tests": (nccl_tests, lambda _: DATA / "nccl_tests_all_reduce_4rank.txt"),
    "nccl_inspector": (nccl_inspector, lambda _: DATA / "inspector_node-a-pid4100.log"),
    "nccl_profiler": (nccl_profiler, lambda _: DATA / "nccl_profile_8796038454335958273_0.json"),
}


@pytest.mark.parametrize("fmt", sorted(CASES))
def test_line_parsers_skip_a_long_line_and_keep_the_rest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         fmt: str) -> None:
    module, seed = CASES[fmt]
    monkeypatch.setattr(_lines, "MAX_LINE_BYTES", BOUND)
    src = seed(tmp_path)
    base = module.parse(src, SourceSink(tmp_path / "a", "k")).stats
    long = tmp_path / "long" / src.name
    long.parent.mkdir()
    long.write_bytes(_with_long_line(src.read_bytes(), 3))
    st = module.parse(long, SourceSink(tmp_path / "b", "k")).stats
    assert st.skipped.get("line_too_long") == 1
    assert st.read == st.stored + sum(st.skipped.values()) and st.stored == base.stored
    assert any("longer than 4,096 bytes" in w for w in st.warnings)


TEXT_TELEMETRY = {
    "ibnetdiscover": (ibnetdiscover, "ibnetdiscover_p.txt"),
    "perfquery": (perfquery, "perfquery_x.txt"),
    "sysfs_ib": (sysfs_ib, "sysfs.txt"),
    "link_map": (link_map, "map.csv"),
}


@pytest.mark.parametrize("fmt", sorted(TEXT_TELEMETRY))
def test_telemetry_text_refuses_a_long_line_before_reading_it_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  fmt: str) -> None:
    module, name = TEXT_TELEMETRY[fmt]
    monkeypatch.setattr(module, "MAX_LINE_BYTES", BOUND)
    path = tmp_path / name
    path.write_bytes(b"1700000000\n" + b"w" * (400 * BOUND))
    with pytest.raises(InputError, match="a line longer than 4,096 bytes") as err:
        module.parse(path, SourceSink(tmp_path / "run", "k"))
    assert name in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("gz", [False, True])
def test_prometheus_refuses_a_long_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gz: bool) -> None:
    monkeypatch.setattr(prometheus, "MAX_LINE_BYTES", BOUND)
    monkeypatch.setattr(prometheus, "BLOCK_BYTES", BOUND)
    body = b'# TYPE x counter\nx{a="1"} 5 1700000000000\n' + b"9" * (400 * BOUND)
    path = tmp_path / ("switch.prom.gz" if gz else "switch.prom")
    path.write_bytes(gzip.compress(body) if gz else body)
    with pytest.raises(InputError, match="longer than the 4,096-byte limit"):
        prometheus.parse(path, SourceSink(tmp_path / "run", "k"))
