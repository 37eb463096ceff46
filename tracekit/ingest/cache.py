"""Where raw trace paths given to a command instead of a run directory are ingested: this user's
private cache of runs, one per set of paths, shared by every command on the same paths."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tracekit.errors import TracekitError
from tracekit.ingest.describe import IngestReport
from tracekit.store import MARKER, os_error

#: how long a command on raw traces waits for another one ingesting the same traces into the cache
CACHE_LOCK_WAIT_S = 600.0


def cache_root() -> Path:
    """This user's private cache of runs ingested from raw traces: $TMPDIR/tracekit-replay-UID,
    mode 0700. Refused when it is a link, not a directory, someone else's, or open to others (in
    a shared temp dir anyone could have made it first, to read or plant runs)."""
    import tempfile

    from tracekit._private_dir import private_dir

    root = Path(tempfile.gettempdir()) / f"tracekit-replay-{os.getuid()}"
    try:
        problem = private_dir(root)
    except OSError as exc:
        raise os_error(exc, str(root)) from exc
    if problem:
        raise TracekitError(f"{root}: the cache of ingested traces {problem}; refused (remove it, or set "
                            "TMPDIR to a directory of your own)")
    return root


def cache_dir(paths: Sequence[str | os.PathLike[str]], *, rank: int | None = None) -> Path:
    """Where raw trace paths given to a command instead of a run directory are ingested: one
    directory per set of paths (and `rank` option) in this user's private cache (`cache_root`),
    the one `tracekit replay` uses, so `analyze`, `report`, `export`, `hang` and `info` on the same
    paths find the run replay wrote (with its results)."""
    key = hashlib.sha1("\n".join(sorted(str(Path(p).resolve()) for p in paths)).encode()).hexdigest()
    return cache_root() / (key[:16] if rank is None else f"{key[:16]}-rank{rank}")


def is_run_dir(paths: Sequence[str | os.PathLike[str]]) -> bool:
    """Whether `paths` name one run directory (or an interrupted ingest into one, which then says
    so rather than being read as traces)."""
    from tracekit.store import Run

    return len(paths) == 1 and (Run.is_run(paths[0]) or (Path(paths[0]) / MARKER).exists())


def open_run(paths: Sequence[str | os.PathLike[str]], *, cache: str | os.PathLike[str] | None = None,
             rank: int | None = None) -> tuple[Any, IngestReport | None]:
    """A run directory as is, or raw trace paths ingested into `cache` (default `cache_dir(paths)`;
    unchanged sources are cache hits): (the `Run`, the ingest's report when `paths` were raw
    traces, else None)."""
    from tracekit.store import Run

    if is_run_dir(paths):
        return Run(paths[0]), None
    out = Path(cache) if cache is not None else cache_dir(paths, rank=rank)
    from tracekit._progress import status

    status(f"ingesting {len(paths)} path(s) into {out}")
    wait = CACHE_LOCK_WAIT_S if cache is None else 0.0
    from tracekit.ingest import ingest

    report = ingest(list(paths), out, lock_wait_s=wait, rank=rank)
    if not report.ingested:
        reasons = "; ".join(s.error or "" for s in report.failed[:3]) or "no input file in a supported format"
        raise TracekitError(f"nothing ingested from {', '.join(map(str, paths))}: {reasons}")
    run = Run(out)
    run.lock_wait_s = wait  # other commands on the same traces share this run: their saves wait too
    return run, report
