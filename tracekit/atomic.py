"""The one atomic file writer of the project.

Every output (reports, exports, run tables, records) is written to a temporary file with an
unpredictable name, created exclusively in the destination's directory, then flushed to disk and
renamed over the destination. A name planted in advance (a symlink at `OUT.tmp`, say) is never
opened, the destination itself is replaced and never written through, and on any error (a full
disk included) the temporary file is removed and the destination is left as it was.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _still_ours(fd: int, tmp: str) -> None:
    """Refuse to rename `tmp` if it is no longer the file created exclusively at `fd` (swapped
    for a link or another file while it was written)."""
    mine, now = os.fstat(fd), os.lstat(tmp)
    if stat.S_ISLNK(now.st_mode) or (mine.st_dev, mine.st_ino) != (now.st_dev, now.st_ino):
        raise OSError(f"{tmp}: the temporary file was replaced while it was written; refused")


def _commit(fd: int, tmp: str, path: Path) -> None:
    _still_ours(fd, tmp)
    os.fsync(fd)
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _read_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _read_umask()  # read once: os.umask is process-wide, so never toggled while threads write


def _create(path: Path) -> tuple[int, str]:
    """A temporary file next to `path`, created exclusively (mkstemp: O_EXCL, a random name),
    with the mode an ordinary open would give it."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    with contextlib.suppress(OSError):
        os.fchmod(fd, 0o666 & ~_UMASK)
    return fd, tmp


@contextlib.contextmanager
def _staged(path: Path) -> Iterator[tuple[int, str]]:
    """The exclusive temporary file next to `path` (fd, name): committed over `path` when the block
    ends without error, removed otherwise."""
    fd, tmp = _create(path)
    try:
        yield fd, tmp
        _commit(fd, tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike[str], mode: str = "wb", *, encoding: str | None = None
                ) -> Iterator[IO[Any]]:
    """A file object for `path` that appears there, whole, only when the block ends without error."""
    if mode not in ("wb", "w"):
        raise ValueError(f"mode must be 'wb' or 'w', not {mode!r}")
    with _staged(Path(path)) as (fd, _), os.fdopen(os.dup(fd), mode,
                                                   encoding=encoding if mode == "w" else None) as fh:
        yield fh


def atomic_write_with(path: str | os.PathLike[str], write: Callable[[str], Any]) -> Path:
    """Write `path` through `write(tmp_path)`, for writers that take a path (pyarrow, polars):
    the temporary path exists already, created exclusively, so `write` truncates our own file."""
    path = Path(path)
    with _staged(path) as (_, tmp):
        write(tmp)
    return path


def atomic_write_all(writes: Mapping[Path, Callable[[str], Any]]) -> list[Path]:
    """Write several files so that none is replaced unless every one was written: each goes to
    its own exclusive temporary through `write(tmp_path)`, and the temporaries are renamed over
    their destinations only once all are written and flushed, so a full disk at any of them
    leaves every destination as it was (tables that must agree, such as analyze's three)."""
    staged: list[tuple[int, str, Path]] = []
    try:
        for path, write in writes.items():
            path = Path(path)
            fd, tmp = _create(path)
            staged.append((fd, tmp, path))
            write(tmp)
            _still_ours(fd, tmp)
            os.fsync(fd)
        for _, tmp, path in staged:
            os.replace(tmp, path)
    except BaseException:
        for _, tmp, _ in staged:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise
    finally:
        for fd, _, _ in staged:
            os.close(fd)
    for directory in {path.parent for _, _, path in staged}:
        _fsync_dir(directory)
    return [path for _, _, path in staged]


def atomic_write_text(path: str | os.PathLike[str], text: str, *, encoding: str = "utf-8") -> Path:
    """Write `text` to `path` atomically."""
    with atomic_open(path, "w", encoding=encoding) as fh:
        fh.write(text)
    return Path(path)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write `data` to `path` atomically."""
    with atomic_open(path, "wb") as fh:
        fh.write(data)
    return Path(path)
