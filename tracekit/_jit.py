"""The project's one numba decorator: kernels compile once and are cached on disk.

tracekit's kernels are cached in this user's private directory (`kernel_cache_dir`: mode 0700,
checked like the cache of ingested traces), never next to the source, where another user of a
shared install could plant a cache entry for this one to load; `NUMBA_CACHE_DIR`, when set, is
the user's own choice and wins. When the private directory cannot be used the kernels compile
without a cache on every run rather than fail. `report_compiles` prints a progress line while a first run compiles,
so a cold start is never silent for long; the CLI turns it on through `tracekit._progress.enable`
without importing numba itself (the first kernel definition attaches it).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import numba
from numba.core import caching, event

from tracekit import _progress
from tracekit._private_dir import private_dir

_OPTIONS = {"nogil": True}


def njit(fn: Callable[..., Any] | None = None, *, inline: bool = False) -> Any:
    """`numba.njit(cache=True, nogil=True)`; `inline=True` also inlines it into its callers."""

    def wrap(f: Callable[..., Any]) -> Any:
        if _listener is None and _progress.stream() is not None:
            report_compiles(_progress.stream())
        extra = {"inline": "always"} if inline else {}
        cache = _use_private_cache()
        try:
            return numba.njit(cache=cache, **_OPTIONS, **extra)(f)
        except RuntimeError:  # no writable cache location: compile on every run instead
            return numba.njit(cache=False, **_OPTIONS, **extra)(f)

    return wrap if fn is None else wrap(fn)


def kernel_cache_dir() -> Path:
    """Where tracekit's compiled kernels are cached: $XDG_CACHE_HOME (or ~/.cache)/tracekit/numba."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tracekit" / "numba"


class _PrivateCacheLocator(caching._SourceFileBackedLocatorMixin, caching._CacheLocator):
    """numba's cache locator for tracekit's kernels: under `kernel_cache_dir`, one folder per source folder."""

    def __init__(self, py_func: Callable[..., Any], py_file: str) -> None:
        self._py_file = py_file
        self._lineno = py_func.__code__.co_firstlineno
        self._cache_path = str(kernel_cache_dir() / self.get_suitable_cache_subpath(py_file))

    def get_cache_path(self) -> str:
        return self._cache_path

    @classmethod
    def from_function(cls, py_func: Callable[..., Any], py_file: str) -> Any:
        if not (getattr(py_func, "__module__", "") or "").startswith("tracekit.") or _cache_problem() is not None:
            return None
        return super().from_function(py_func, py_file)


_cache_state: list[str | None] = []  # [problem with kernel_cache_dir, or None], once checked


def _cache_problem() -> str | None:
    if not _cache_state:
        try:
            _cache_state.append(private_dir(kernel_cache_dir()))
        except OSError as exc:
            _cache_state.append(f"cannot be made ({exc.strerror or exc})")
    return _cache_state[0]


def _use_private_cache() -> bool:
    """Put the private locator first in numba's list (after `NUMBA_CACHE_DIR`'s); False when the
    private directory cannot be used and no `NUMBA_CACHE_DIR` is set: then no cache at all."""
    impl = getattr(caching, "CacheImpl", None) or caching._CacheImpl  # renamed in numba 0.61
    if _PrivateCacheLocator not in impl._locator_classes:
        impl._locator_classes = [c for c in impl._locator_classes if c.__name__.endswith("UserProvidedCacheLocator")] \
            + [_PrivateCacheLocator] + [c for c in impl._locator_classes
                                         if not c.__name__.endswith("UserProvidedCacheLocator")]
    return bool(numba.config.CACHE_DIR) or _cache_problem() is None


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
