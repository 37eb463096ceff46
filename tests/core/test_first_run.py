"""A first run is never silent for long: the README's main job, run as a subprocess with an empty
numba cache, says something before its heavy imports and keeps printing while it works.

Gaps are judged relative to the run's own total time, not in seconds (the machine is shared)."""

import itertools
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
TRACEKIT = [sys.executable, "-m", "tracekit"]


def _main_job_args(tmp_path: Path) -> list[str]:
    text = (ROOT / "README.md").read_text()
    command = next(line for line in text.splitlines() if line.startswith("pip install -e . && tracekit replay"))
    args = command.split("tracekit ", 1)[1].split()
    args[args.index("--report") + 1] = str(tmp_path / "report.html")
    return [*args, "--cache", str(tmp_path / "run")]


def _timed_output(args: list[str], env: dict[str, str]) -> tuple[list[tuple[float, bytes]], float]:
    """Each chunk of the merged stdout/stderr with its arrival time, and the total time."""
    t0 = time.perf_counter()
    chunks = []
    with subprocess.Popen([*TRACEKIT, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT) as proc:
        while data := os.read(proc.stdout.fileno(), 4096):
            chunks.append((time.perf_counter() - t0, data))
    total = time.perf_counter() - t0
    assert proc.returncode == 0, b"".join(c for _, c in chunks).decode()[-3000:]
    return chunks, total


def _lines(chunks: list[tuple[float, bytes]]) -> list[tuple[float, str]]:
    """Complete lines with the time their first byte arrived."""
    out, buf, start = [], b"", None
    for t, data in chunks:
        for part in re.split(rb"(\n)", data):
            if not part:
                continue
            if start is None:
                start = t
            if part == b"\n":
                out.append((start, buf.decode(errors="replace")))
                buf, start = b"", None
            else:
                buf += part
    return out


@pytest.mark.slow
def test_main_job_first_run_is_never_silent_for_long(tmp_path):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba-cache"), "PYTHONUNBUFFERED": "1"}
    chunks, total = _timed_output(_main_job_args(tmp_path), env)
    lines = _lines(chunks)
    texts = [text for _, text in lines]
    compiling = next(i for i, text in enumerate(texts) if text.startswith("compiling numba kernels"))
    assert texts[0] == "tracekit: replay: loading libraries" and compiling > 0
    first = lines[0][0]
    assert first < 0.1 * total, (first, total)
    arrivals = [0.0] + [t for t, _ in chunks] + [total]
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    assert max(gaps) < 0.2 * total, (max(gaps), total, lines)
    assert any(text.startswith("report: ") for text in texts)

    # second run: kernels come from the cache; Python's import log (on the same stderr) shows the
    # status line is out before polars, pyarrow and numba are imported
    warm, _ = _timed_output(_main_job_args(tmp_path), {**env, "PYTHONPROFILEIMPORTTIME": "1"})
    text = b"".join(c for _, c in warm).decode()
    assert "compiling numba kernels" not in text
    first = text.index("tracekit: replay: loading libraries")
    for module in ("polars", "pyarrow", "numba"):
        assert first < re.search(rf"\| +{module}[.\n]", text).start(), module
