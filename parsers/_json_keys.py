"""Keys a JSON object gives more than once, in every JSON input (issue 22).

The rule, one for every reader: the last value is kept, as msgspec, Python's json and
JavaScript's JSON.parse (so chrome://tracing and Perfetto, which show the same trace) all do,
and the file's warnings count the objects and name the keys, so no earlier value is dropped
unseen. Kineto events (the hot path) are checked by one numba pass over the bytes
(`_kernels.repeated_keys`, no second decode); text that pass cannot decide exactly (escaped
keys, objects with very many keys), and the small JSON inputs of the other readers, are read
by json with a pairs hook (`scan_exact`), which spares those readers numba's start-up.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

#: Objects with more keys than this are checked by the exact (slower) reader.
MAX_KEYS = 128
_DEPTH = 512
_NAMES = 5


class RepeatedKeys:
    """A tally of the objects that give a key twice, over every text `scan`ned."""

    def __init__(self) -> None:
        self.objects = 0
        self.names: Counter[str] = Counter()

    def scan(self, text: bytes | bytearray | memoryview | str) -> int:
        """Count the objects of `text` (one JSON value or a run of them) that repeat a key."""
        import numpy as np

        from tracekit.parsers import _kernels  # imported here: numba only where the scan runs

        raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
        if not raw:
            return 0
        data = np.frombuffer(raw, np.uint8)
        spans = np.zeros((_NAMES, 2), np.int64)
        objects, written, unsure = _kernels.repeated_keys(data, _DEPTH, MAX_KEYS, spans)
        if unsure:
            exact, whole = _exact(bytes(raw))
            if whole:
                self.objects += exact.objects
                self.names.update(exact.names)
                return exact.objects
        self.objects += objects
        for s, e in spans[:written]:
            self.names[bytes(raw[s:e]).decode("utf-8", "replace")] += 1
        return objects

    def scan_exact(self, text: bytes | bytearray | memoryview | str) -> int:
        """`scan` by json with a pairs hook (one value, or values separated by white space or
        commas); text json cannot read is left uncounted (its reader skips or refuses it)."""
        raw = bytes(text) if not isinstance(text, str) else text.encode("utf-8", "surrogatepass")
        exact, _ = _exact(raw)
        self.objects += exact.objects
        self.names.update(exact.names)
        return exact.objects

    def hook(self, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        """json's `object_pairs_hook`: the dict json would build, the repeats counted."""
        obj = dict(pairs)
        if len(obj) != len(pairs):
            self.objects += 1
            self.names.update(k for k, n in Counter(k for k, _ in pairs).items() if n > 1)
        return obj

    def warning(self, what: str = "object") -> str | None:
        """The one warning about the repeats, or None when there were none."""
        if not self.objects:
            return None
        noun = what if self.objects == 1 else what + "s"
        return (f"{self.objects} {noun} with keys given more than once, the last value kept "
                f"({sorted(self.names)[:_NAMES]})")


def _exact(raw: bytes) -> tuple[RepeatedKeys, bool]:
    """The tally by json with a pairs hook, and whether json read all of `raw` (one value, or
    values separated by white space or commas) rather than stopping at bad JSON."""
    keys = RepeatedKeys()
    decoder = json.JSONDecoder(object_pairs_hook=keys.hook)
    try:
        text = raw.decode("utf-8", "replace")
        i, n = 0, len(text)
        while i < n:
            while i < n and text[i] in " \t\r\n,":
                i += 1
            if i >= n:
                break
            _, i = decoder.raw_decode(text, i)
    except (ValueError, RecursionError):
        return keys, False
    return keys, True


def warn_repeated_keys(text: bytes | bytearray | memoryview | str, warnings: list[str]) -> None:
    """Scan a whole JSON (or JSON lines) file and add the repeats' warning to `warnings`."""
    keys = RepeatedKeys()
    keys.scan_exact(text)
    if (w := keys.warning()) is not None:
        warnings.append(w)
