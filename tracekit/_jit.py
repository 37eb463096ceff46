"""The project's one numba decorator: kernels compile once and are cached on disk.

numba writes its cache next to the source (`__pycache__`), or in a user-wide cache directory when
the package is installed read-only; when neither is writable the kernels compile without a cache
on every run rather than fail. `report_compiles` prints a progress line while a first run compiles,
so a cold start is never silent for long; the CLI turns it on through `tracekit._progress.enable`
without importing numba itself (the first kernel definition attaches it).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

import numba
from numba.core import event

from tracekit import _progress

_OPTIONS = {"nogil": True}


def njit(fn: Callable[..., Any] | None = None, *, inline: bool = False) -> Any:
    """`numba.njit(cache=True, nogil=True)`; `inline=True` also inlines it into its callers."""

    def wrap(f: Callable[..., Any]) -> Any:
        if _listener is None and _progress.stream() is not None:
            report_compiles(_progress.stream())
        extra = {"inline": "always"} if inline else {}
        try:
            return numba.njit(cache=True, **_OPTIONS, **extra)(f)
        except RuntimeError:  # no writable cache location: compile on every run instead
            return numba.njit(cache=False, **_OPTIONS, **extra)(f)

    return wrap if fn is None else wrap(fn)


class _CompileProgress(event.Listener):
    """Prints one header line on the first compile of a tracekit kernel, then the name and time
    of each top-level kernel, with a dot every second while it compiles."""

    def __init__(self, stream: TextIO, interval: float = 1.0, prefix: str = "tracekit") -> None:
        self.stream = stream
        self.interval = interval
        self.prefix = prefix
        self.depth = 0
        self.announced = False
        self.t_start = 0.0
        self.stop: threading.Event | None = None
        self.ticker: threading.Thread | None = None

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):
            pass

    def _tick(self, stop: threading.Event) -> None:
        while not stop.wait(self.interval):
            self._write(".")

    def on_start(self, ev: event.Event) -> None:
        dispatcher = (ev.data or {}).get("dispatcher")
        module = getattr(getattr(dispatcher, "py_func", None), "__module__", "") or ""
        if self.depth == 0 and not module.startswith(self.prefix):
            return
        self.depth += 1
        if self.depth > 1:
            return
        if not self.announced:
            self.announced = True
            self._write("compiling numba kernels (first run only; cached for later runs)...\n")
        self._write(f"  {dispatcher.py_func.__name__} ")
        self.t_start = time.perf_counter()
        self.stop = threading.Event()
        self.ticker = threading.Thread(target=self._tick, args=(self.stop,), daemon=True)
        self.ticker.start()

    def on_end(self, ev: event.Event) -> None:
        if self.depth == 0:
            return
        self.depth -= 1
        if self.depth:
            return
        if self.stop is not None and self.ticker is not None:
            self.stop.set()
            self.ticker.join()
        self._write(f" {time.perf_counter() - self.t_start:.1f} s\n")


_listener: _CompileProgress | None = None


def report_compiles(stream: TextIO | None = None) -> None:
    """Show compile progress of tracekit's kernels on `stream` (default: the process's stderr,
    bypassing any redirection of `sys.stderr`, so captured command output stays clean)."""
    global _listener
    stream = stream if stream is not None else sys.__stderr__
    if _listener is not None or stream is None:
        return
    _listener = _CompileProgress(stream)
    event.register("numba:compile", _listener)
