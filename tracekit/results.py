"""One JSON encoder for the typed results that cross layers.

Results are msgspec Structs whose fields are declared in the order their JSON lists them.
`to_builtins` turns one into plain JSON values (an Arrow table into its rows, a path into its
text), `dumps` into the text `--json` and results/*.json carry, and `from_builtins` types a stored
document again; no result writes or reads its JSON by hand.
"""

from __future__ import annotations

import json
import os
from pathlib import PurePath
from typing import Any, TypeVar

import msgspec
import numpy as np
import pyarrow as pa

T = TypeVar("T")


class Result(msgspec.Struct, frozen=True, kw_only=True):
    """Base of the typed results: immutable, keyword-built, encoded in field order."""


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if isinstance(obj, pa.Table):
        return obj.to_pylist()
    raise TypeError(f"{type(obj).__name__} is not a JSON result")


def _dec_hook(kind: type, obj: Any) -> Any:
    if kind is pa.Table and isinstance(obj, list):
        return pa.Table.from_pylist(obj)  # the result's __post_init__ gives it its schema
    if isinstance(kind, type) and issubclass(kind, PurePath) and isinstance(obj, str):
        return kind(obj)
    raise TypeError(f"{kind.__name__} is not read from JSON")


def to_builtins(obj: Any, *, str_keys: bool = True) -> Any:
    """`obj` as plain JSON values (dicts, lists, str, int, float, bool, None). Dict keys become strings
    unless `str_keys` is False (a document written with `sort_keys` orders int keys as numbers), but
    for the fields a result names in its class variable `number_keys`, whose int keys stay numbers."""
    doc = msgspec.to_builtins(obj, str_keys=str_keys, enc_hook=_enc_hook)
    for name in getattr(type(obj), "number_keys", ()):
        doc[name] = msgspec.to_builtins(getattr(obj, name), str_keys=False, enc_hook=_enc_hook)
    return doc


def dumps(obj: Any, *, indent: int | None = 1, sort_keys: bool = False) -> str:
    """The JSON text of a result (Python's float formatting, NaN kept as `NaN`, as the stored files have it)."""
    return json.dumps(to_builtins(obj), indent=indent, sort_keys=sort_keys)


def from_builtins(doc: Any, kind: type[T]) -> T:
    """A stored document typed again as `kind` (ints accepted where floats are declared)."""
    return msgspec.convert(doc, kind, strict=False, dec_hook=_dec_hook)

