"""Input format detection by content (the first kilobytes, gunzipped transparently), never by name:
the registry's detection order (`tracekit.parsers.registry.DETECTION`) over a file's head."""

from __future__ import annotations

import os
from pathlib import Path

from tracekit.parsers._stream import peek
from tracekit.parsers.registry import Head, detect, supported_formats

__all__ = ["PEEK_BYTES", "detect_bytes", "detect_format", "supported_formats"]

PEEK_BYTES = 65536


def detect_bytes(head: bytes) -> str | None:
    """The format of a file whose first (decompressed) bytes are `head`, or None (formats that
    need the file itself, Nsight's SQLite and directory exports, are not recognised from bytes)."""
    return detect(Head(head))


def detect_format(path: str | os.PathLike[str]) -> str | None:
    """Detect a file's format from its content; None when unknown or unreadable."""
    try:
        head = peek(path, PEEK_BYTES)
    except OSError:
        return None
    return detect(Head(head, Path(path)))
