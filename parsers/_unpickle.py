"""A restricted unpickler for untrusted pickles (Flight Recorder dumps).

Flight Recorder pickles are plain data: dicts, lists, tuples, strings, numbers, booleans and None.
Real dumps (torch 2.13, both the Python pickler and the C++ one) reference no global at all, so
nothing that could run code is ever needed. `find_class` therefore refuses every global except a
few pure data constructors (see `ALLOWED`), and persistent ids are refused too. A refused global
raises `InputError` naming the file and the global; nothing from the pickle is imported or called.
"""

from __future__ import annotations

import io
import os
import pickle
from collections.abc import Callable
from typing import Any

from tracekit.errors import InputError

#: Default cap on the size of a pickle we agree to read (Flight Recorder dumps are a few MB).
MAX_BYTES = 256 << 20


def _as_list(values: Any = ()) -> list[Any]:
    return list(values)


#: The only globals a pickle may name. All are pure data constructors; none touches the
#: system. The torch.jit ones are what the TorchScript pickler emits for typed lists; they
#: map to `list` here, so torch is never imported.
ALLOWED: dict[tuple[str, str], Callable[..., Any]] = {
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("__builtin__", "set"): set,  # protocol 0-2 spelling
    ("__builtin__", "frozenset"): frozenset,
    ("collections", "OrderedDict"): dict,
    ("torch.jit._pickle", "build_intlist"): _as_list,
    ("torch.jit._pickle", "build_doublelist"): _as_list,
    ("torch.jit._pickle", "build_boollist"): _as_list,
    ("torch.jit._pickle", "build_strlist"): _as_list,
}


class RestrictedUnpickler(pickle.Unpickler):
    """An Unpickler that resolves only the globals in `ALLOWED` and no persistent ids."""

    def __init__(self, file: io.BufferedIOBase, *, path: str) -> None:
        super().__init__(file)
        self._path = path

    def find_class(self, module: str, name: str) -> Any:
        allowed = ALLOWED.get((module, name))
        if allowed is None:
            raise InputError(self._path, f"refused to unpickle global {module}.{name} "
                                         "(only plain data is accepted from a pickle)")
        return allowed

    def persistent_load(self, pid: Any) -> Any:
        raise InputError(self._path, "refused to unpickle a persistent id (only plain data is accepted)")


def loads(data: bytes, *, path: str | os.PathLike[str] = "<bytes>", max_bytes: int = MAX_BYTES) -> Any:
    """Unpickle `data` with the restricted unpickler; raise InputError on anything else."""
    where = os.fspath(path)
    if len(data) > max_bytes:
        raise InputError(where, f"pickle is {len(data)} bytes, more than the {max_bytes}-byte limit")
    try:
        return RestrictedUnpickler(io.BytesIO(data), path=where).load()
    except InputError:
        raise
    except EOFError as exc:
        raise InputError(where, "truncated pickle (ended before its STOP opcode)") from exc
    except pickle.UnpicklingError as exc:
        if "truncated" in str(exc):
            raise InputError(where, "truncated pickle (ended before its STOP opcode)") from exc
        raise InputError(where, f"corrupt pickle ({exc})") from exc
    except RecursionError as exc:
        raise InputError(where, "pickle nested too deeply") from exc
    except MemoryError as exc:
        raise InputError(where, "pickle too large to load") from exc
    except Exception as exc:  # UnpicklingError, ValueError, KeyError (bad memo), TypeError, ...
        raise InputError(where, f"corrupt pickle ({type(exc).__name__}: {exc})") from exc


def load(path: str | os.PathLike[str], *, max_bytes: int = MAX_BYTES) -> Any:
    """Read and unpickle a file (at most `max_bytes`) with the restricted unpickler."""
    where = os.fspath(path)
    with open(where, "rb") as fh:
        data = fh.read(max_bytes + 1)
    return loads(data, path=where, max_bytes=max_bytes)
