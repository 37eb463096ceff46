"""A directory only this user can use: made mode 0700, refused when it is a link, not a
directory, someone else's, or open to others (in a shared place anyone could have made it first,
to read what is put there or plant something for this user to load)."""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path


def private_dir(path: Path) -> str | None:
    """Make `path` (its missing parents too) mode 0700 if absent; None when it is this user's
    own private directory, else what is wrong with it ("is a symbolic link", ...)."""
    os.makedirs(path.parent, mode=0o700, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid != os.getuid():
        return f"belongs to uid {st.st_uid}, not you"
    if st.st_mode & 0o077:
        return f"is open to other users (mode {stat.S_IMODE(st.st_mode):o})"
    return None
