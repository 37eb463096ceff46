"""Status lines for long commands, on the process's stderr; silent unless the CLI turns them on.

Imports nothing heavy, so the CLI can say what it is doing before it loads polars, pyarrow and
numba (a first run is otherwise silent while they import and the kernels compile). The library
calls `status` at its slow stages; as a library (tests, notebooks) that prints nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

_stream: TextIO | None = None
_muted = 0


def enable(stream: TextIO | None = None) -> None:
    """Print status lines (and numba compile progress, see `tracekit._jit`) on `stream`
    (default: the process's stderr, bypassing any redirection of `sys.stderr`, so captured
    command output stays clean)."""
    global _stream
    _stream = stream if stream is not None else sys.__stderr__
    if "tracekit._jit" in sys.modules:  # kernels imported already: attach the compile listener now
        sys.modules["tracekit._jit"].report_compiles(_stream)


def stream() -> TextIO | None:
    """Where status lines go, or None when they are off."""
    return _stream


def status(text: str) -> None:
    """One line `tracekit: TEXT` when status lines are on (and not `muted`)."""
    if _stream is None or _muted:
        return
    try:
        _stream.write(f"tracekit: {text}\n")
        _stream.flush()
    except (OSError, ValueError):
        pass


@contextmanager
def muted() -> Iterator[None]:
    """No status lines inside: a caller that has said what it is doing (`whatif`'s "scenario k/n")
    keeps the replays it runs from repeating their own "replaying ... (baseline)" lines."""
    global _muted
    _muted += 1
    try:
        yield
    finally:
        _muted -= 1
