"""Where per-file ingest and per-rank analysis run: in this process (the default), in a pool of
processes on this machine (ingest's choice for large inputs), or as Ray tasks.

`--executor ray` uses the Ray cluster this process is already connected to, else the one
RAY_ADDRESS names, else starts a local one; `--executor ray://HOST:PORT` connects through Ray
Client. Tasks read and write the run directory themselves, so on a cluster it must be on storage
every node mounts at the same path (see docs/scale.md). Ray is an optional extra:
`pip install 'tracekit-ml[ray]'`.
"""

from __future__ import annotations

import multiprocessing
import re
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from tracekit.errors import TracekitError

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)b?\s*$", re.I)


class ExecutorError(TracekitError):
    """An executor spec that cannot be used (unknown, Ray missing, cluster unreachable)."""


@dataclass(frozen=True)
class Executor:
    """Where tasks run: kind "local" (in this process, one after another), "process" (a pool of
    `workers` processes on this machine; chosen by the library, not by `--executor`) or "ray";
    for Ray the address (None: connected, RAY_ADDRESS or local) and the memory each task reserves
    in bytes (None: Ray's default)."""

    kind: str = "local"
    address: str | None = None
    task_memory: int | None = None
    workers: int | None = None

    @property
    def is_local(self) -> bool:
        return self.kind == "local"


def parse_executor(spec: str | Executor | None, *, task_memory: str | int | None = None) -> Executor:
    """"local" (or None), "ray" or "ray://HOST:PORT"; `task_memory` like "4GiB" or bytes."""
    memory = parse_size(task_memory) if task_memory is not None else None
    if isinstance(spec, Executor):
        return spec if memory is None else Executor(spec.kind, spec.address, memory)
    text = (spec or "local").strip()
    if text == "local":
        return Executor(task_memory=memory)
    if text == "ray":
        return Executor("ray", None, memory)
    if text.startswith("ray://") and len(text) > len("ray://"):
        return Executor("ray", text, memory)
    raise ExecutorError(f"unknown executor {text!r}: use local, ray or ray://HOST:PORT")


def parse_size(value: str | int) -> int:
    """Bytes from an int or a size such as 512MiB, 4GiB, 2G (powers of 1024 with i, else 1000)."""
    if isinstance(value, int):
        if value <= 0:
            raise ExecutorError(f"task memory must be positive, not {value}")
        return value
    m = _SIZE.match(value)
    if not m:
        raise ExecutorError(f"cannot read task memory {value!r}: give bytes or a size like 4GiB")
    number, unit, binary = float(m.group(1)), m.group(2).lower(), bool(m.group(3))
    power = " kmgt".index(unit) if unit else 0
    size = int(number * (1024 if binary else 1000) ** power)
    if size <= 0:
        raise ExecutorError(f"task memory must be positive, not {value!r}")
    return size


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ExecutorError("the ray executor needs Ray: pip install 'tracekit-ml[ray]'") from exc
    return ray


@contextmanager
def ray_session(executor: Executor) -> Iterator[Any]:
    """The ray module, connected: an existing connection is reused (and left open); otherwise this
    connects (or starts a local Ray) and shuts down afterwards."""
    ray = _ray()
    if ray.is_initialized():
        yield ray
        return
    try:
        ray.init(address=executor.address, ignore_reinit_error=True, log_to_driver=False,
                 include_dashboard=False)
    except Exception as exc:
        where = executor.address or "a local Ray (or RAY_ADDRESS)"
        raise ExecutorError(f"cannot start or reach {where}: {type(exc).__name__}: {exc}") from exc
    try:
        yield ray
    finally:
        ray.shutdown()


def run_tasks(executor: Executor, fn: Callable[..., Any], calls: Sequence[tuple[Any, ...]], *,
              done: Callable[[int, Any], None] | None = None,
              failed: Callable[[int, BaseException], Any] | None = None) -> list[Any]:
    """fn(*args) for every args in `calls` on `executor` (here, in a process pool, or as Ray tasks
    of one CPU each with `task_memory` reserved); results in the order of `calls`. `done(i, result)`
    is called (in this process) as each task finishes. A Ray task that raises fails the whole call
    with an ExecutorError naming it; a pool task that raises gives `failed(i, exc)` as its result
    (without `failed`, the ExecutorError); here, the exception propagates."""
    if executor.is_local:
        out = []
        for i, args in enumerate(calls):
            out.append(fn(*args))
            if done is not None:
                done(i, out[-1])
        return out
    if executor.kind == "process":
        return _run_in_pool(executor, fn, calls, done, failed)
    with ray_session(executor) as ray:
        options: dict[str, Any] = {"num_cpus": 1, "max_retries": 1}
        if executor.task_memory is not None:
            options["memory"] = executor.task_memory
        remote = ray.remote(fn).options(**options)
        refs = [remote.remote(*args) for args in calls]
        index = {ref: i for i, ref in enumerate(refs)}
        results: list[Any] = [None] * len(refs)
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for ref in ready:
                i = index[ref]
                try:
                    results[i] = ray.get(ref)
                except Exception as exc:
                    for other in pending:
                        ray.cancel(other)
                    raise ExecutorError(f"Ray task {getattr(fn, '__name__', fn)}{_brief(calls[i])} failed: "
                                        f"{_root(exc)}") from exc
                if done is not None:
                    done(i, results[i])
        return results


def _run_in_pool(executor: Executor, fn: Callable[..., Any], calls: Sequence[tuple[Any, ...]],
                 done: Callable[[int, Any], None] | None,
                 failed: Callable[[int, BaseException], Any] | None) -> list[Any]:
    """`run_tasks` on a pool of `executor.workers` spawned processes (a fork would copy this
    process's threads and memory pools)."""
    results: list[Any] = [None] * len(calls)
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=executor.workers, mp_context=context) as pool:
        futures = {pool.submit(fn, *args): i for i, args in enumerate(calls)}
        for future in as_completed(futures):
            i = futures[future]
            try:
                results[i] = future.result()
            except Exception as exc:
                if failed is None:
                    raise ExecutorError(f"task {getattr(fn, '__name__', fn)}{_brief(calls[i])} failed: "
                                        f"{type(exc).__name__}: {exc}") from exc
                results[i] = failed(i, exc)
            if done is not None:
                done(i, results[i])
    return results


def _brief(args: tuple[Any, ...]) -> str:
    text = ", ".join(repr(a) if not isinstance(a, (list, tuple, dict)) else f"<{len(a)} items>" for a in args[:2])
    return f"({text}{', ...' if len(args) > 2 else ''})"


def _root(exc: BaseException) -> str:
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):
        return f"{type(cause).__name__}: {cause}"
    return str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
