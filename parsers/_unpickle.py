"""A restricted unpickler for untrusted pickles (Flight Recorder dumps).

Flight Recorder pickles are plain data: dicts, lists, tuples, strings, numbers, booleans and None.
Real dumps (torch 2.13, both the Python pickler and the C++ one) reference no global at all, so
nothing that could run code is ever needed. `find_class` therefore refuses every global except a
few pure data constructors (see `ALLOWED`), and persistent ids, extensions, BUILD and object
opcodes are refused too. A refused global raises `InputError` naming the file and the global;
nothing from the pickle is imported or called.

Plain data can still be a bomb: a few kB can reference one long string or one list thousands of
times through the memo, nest lists of lists that multiply on every level, or build dict keys that
all hash alike. The unpickler is therefore the pure-Python one with its opcodes wrapped, and
while it runs it enforces (see `tracekit/_limits.py`):

* output size: every container's size counts each reference to a child in full (an object
  referenced twice counts twice), i.e. the size of the tree a consumer would walk; past
  `PICKLE_MAX_OUTPUT` the load stops;
* nesting depth (`MAX_DEPTH`) and no cycles: a container cannot be changed once it has been put
  into another one, which is how every real pickler writes plain data;
* memo growth: at most `PICKLE_MAX_OUTPUT` memo entries;
* memory built in all (`PICKLE_MAX_BUILT`), charged before each container, REDUCE copy or set
  is allocated, and at most 2 x `MAX_DEPTH` MARKs open at once (a gzip of MARKs is a few kB);
* dict keys and set members: str, int (within +-2**60), bool or None only, so their hashes
  cannot be made to collide; integers at most `PICKLE_MAX_INT_BYTES` long.
"""

from __future__ import annotations

import io
import os
import pickle
from collections.abc import Callable
from typing import Any, ClassVar

from tracekit._limits import MAX_DEPTH, PICKLE_MAX_BUILT, PICKLE_MAX_INT_BYTES, PICKLE_MAX_OUTPUT
from tracekit.errors import InputError

#: Default cap on the size of a pickle we agree to read (Flight Recorder dumps are a few MB).
MAX_BYTES = 64 << 20


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

_CONTAINERS = (list, dict, tuple, set, frozenset)
_KEY_TYPES = (str, int, bool, type(None))
#: Integer keys in this range hash to themselves (Python reduces int hashes mod 2**61 - 1), so
#: they cannot be chosen to collide; str hashes are salted per process.
_KEY_INT_MIN, _KEY_INT_MAX = -(2**60), 2**60
_REFUSED = {pickle.BUILD: "BUILD", pickle.INST: "INST", pickle.OBJ: "OBJ", pickle.NEWOBJ: "NEWOBJ",
            pickle.NEWOBJ_EX: "NEWOBJ_EX", pickle.EXT1: "EXT1", pickle.EXT2: "EXT2",
            pickle.EXT4: "EXT4", pickle.PERSID: "PERSID", pickle.BINPERSID: "BINPERSID",
            pickle.NEXT_BUFFER: "NEXT_BUFFER", pickle.READONLY_BUFFER: "READONLY_BUFFER"}


class PickleLimitError(InputError):
    """A pickle exceeded a resource limit (output size, depth, memo, key type)."""


class RestrictedUnpickler(pickle._Unpickler):  # type: ignore[name-defined,misc]
    """An Unpickler that resolves only the globals in `ALLOWED` and enforces the limits above."""

    dispatch: ClassVar[dict[int, Callable[[Any], None]]] = dict(pickle._Unpickler.dispatch)  # type: ignore[attr-defined]

    def __init__(self, file: io.BufferedIOBase, *, path: str, max_output: int = PICKLE_MAX_OUTPUT,
                 max_depth: int = MAX_DEPTH, max_built: int = PICKLE_MAX_BUILT) -> None:
        super().__init__(file)
        self._path = path
        self._max_output = max_output
        self._max_depth = max_depth
        self._built = 0  # references allocated in all containers so far (the memory actually used)
        self._max_built = max_built
        self._size: dict[int, int] = {}
        self._depth: dict[int, int] = {}
        self._frozen: set[int] = set()

    def find_class(self, module: str, name: str) -> Any:
        allowed = ALLOWED.get((module, name))
        if allowed is None:
            raise InputError(self._path, f"refused to unpickle global {module}.{name} "
                                         "(only plain data is accepted from a pickle)")
        return allowed

    def persistent_load(self, pid: Any) -> Any:
        raise InputError(self._path, "refused to unpickle a persistent id (only plain data is accepted)")

    # -- bookkeeping -------------------------------------------------------------------------

    def _limit(self, what: str) -> PickleLimitError:
        return PickleLimitError(self._path, f"pickle refused: {what}")

    def _weight(self, obj: Any) -> int:
        t = type(obj)
        if t is str or t is bytes or t is bytearray:
            return 1 + len(obj) // 8
        if t in _CONTAINERS:
            return self._size.get(id(obj), 1)
        return 1

    def _charge(self, slots: int) -> None:
        """Count `slots` more references about to be allocated, before they are: the output limit
        bounds each tree, this bounds what is built in all (containers left on the stack or in the
        memo, REDUCE copies), so a small file cannot allocate gigabytes before a check."""
        self._built += slots
        if self._built > self._max_built:
            raise self._limit(f"more than {self._max_built:,} references built in all (containers that "
                              "are copied or never used count too)")

    def _made(self, obj: Any, children: Any = ()) -> None:
        """Register a new container built from `children` (its size and depth)."""
        key = id(obj)
        self._frozen.discard(key)
        self._size[key] = 1
        self._depth[key] = 1
        self._attach(obj, children)

    def _attach(self, target: Any, children: Any) -> None:
        """`children` were put into `target`: count them, freeze them, check the limits."""
        key = id(target)
        if key in self._frozen:
            raise self._limit("a container is changed after being put into another one")
        self._charge((5 if type(target) in (set, frozenset) else 1) * (1 + len(children)))
        size = self._size.get(key, 1)
        depth = self._depth.get(key, 1)
        for child in children:
            if child is target:
                raise self._limit("a container contains itself")
            size += self._weight(child)
            if type(child) in _CONTAINERS:
                self._frozen.add(id(child))
                d = self._depth.get(id(child), 1) + 1
                if d > depth:
                    depth = d
        if size > self._max_output:
            raise self._limit(f"output larger than {self._max_output:,} units (objects + bytes/8, "
                              "counting every reference)")
        if depth > self._max_depth:
            raise self._limit(f"nested deeper than {self._max_depth}")
        self._size[key] = size
        self._depth[key] = depth

    def _check_keys(self, keys: Any) -> None:
        for k in keys:
            if not isinstance(k, _KEY_TYPES):
                raise self._limit(f"a dict key or set member of type {type(k).__name__} "
                                  "(only str, int, bool and None are accepted)")
            if type(k) is int and not _KEY_INT_MIN <= k <= _KEY_INT_MAX:
                raise self._limit("an integer dict key or set member beyond +-2**60 "
                                  "(larger ones can be made to share one hash)")

    def _memo_check(self) -> None:
        if len(self.memo) >= self._max_output:
            raise self._limit(f"more than {self._max_output:,} memo entries")

    # -- wrapped opcodes ---------------------------------------------------------------------

    def load_empty_list(self) -> None:
        self.append([])
        self._made(self.stack[-1])

    def load_empty_dictionary(self) -> None:
        self.append({})
        self._made(self.stack[-1])

    def load_empty_set(self) -> None:
        self.append(set())
        self._made(self.stack[-1])

    def load_empty_tuple(self) -> None:
        self.append(())
        self._made(self.stack[-1])

    def load_tuple(self) -> None:
        items = self.pop_mark()
        self.append(tuple(items))
        self._made(self.stack[-1], items)

    def load_tuple1(self) -> None:
        self.stack[-1] = (self.stack[-1],)
        self._made(self.stack[-1], self.stack[-1])

    def load_tuple2(self) -> None:
        self.stack[-2:] = [(self.stack[-2], self.stack[-1])]
        self._made(self.stack[-1], self.stack[-1])

    def load_tuple3(self) -> None:
        self.stack[-3:] = [(self.stack[-3], self.stack[-2], self.stack[-1])]
        self._made(self.stack[-1], self.stack[-1])

    def load_list(self) -> None:
        items = self.pop_mark()
        self.append(items)
        self._made(items, list(items))

    def load_dict(self) -> None:
        items = self.pop_mark()
        keys = items[0::2]
        self._check_keys(keys)
        d = {items[i]: items[i + 1] for i in range(0, len(items), 2)}
        self.append(d)
        self._made(d, items)

    def load_frozenset(self) -> None:
        items = self.pop_mark()
        self._check_keys(items)
        self.append(frozenset(items))
        self._made(self.stack[-1], items)

    def load_append(self) -> None:
        value = self.stack.pop()
        target = self.stack[-1]
        if type(target) is not list:
            raise self._limit(f"APPEND to a {type(target).__name__}")
        self._attach(target, (value,))
        target.append(value)

    def load_appends(self) -> None:
        items = self.pop_mark()
        target = self.stack[-1]
        if type(target) is not list:
            raise self._limit(f"APPENDS to a {type(target).__name__}")
        self._attach(target, items)
        target.extend(items)

    def load_setitem(self) -> None:
        value = self.stack.pop()
        key = self.stack.pop()
        target = self.stack[-1]
        if type(target) is not dict:
            raise self._limit(f"SETITEM on a {type(target).__name__}")
        self._check_keys((key,))
        self._attach(target, (key, value))
        target[key] = value

    def load_setitems(self) -> None:
        items = self.pop_mark()
        target = self.stack[-1]
        if type(target) is not dict:
            raise self._limit(f"SETITEMS on a {type(target).__name__}")
        self._check_keys(items[0::2])
        self._attach(target, items)
        for i in range(0, len(items) - 1, 2):
            target[items[i]] = items[i + 1]

    def load_additems(self) -> None:
        items = self.pop_mark()
        target = self.stack[-1]
        if type(target) is not set:
            raise self._limit(f"ADDITEMS to a {type(target).__name__}")
        self._check_keys(items)
        self._attach(target, items)
        target.update(items)

    def load_reduce(self) -> None:
        args = self.stack.pop()
        func = self.stack[-1]
        if func not in ALLOWED.values() or type(args) is not tuple or len(args) > 1:
            raise self._limit("REDUCE of something other than an allowed data constructor")
        if args and type(args[0]) not in _CONTAINERS:
            raise self._limit(f"REDUCE of a data constructor over a {type(args[0]).__name__}")
        # the copy below, the constructor's (a set's hash table), and the pairs flattened
        self._charge((7 if func in (set, frozenset) else 3) * len(args[0]) if args else 0)
        items = list(args[0]) if args else []
        if isinstance(args[0] if args else None, dict):
            items = list(args[0].items())
        if func in (set, frozenset):
            self._check_keys(items)
        elif func is dict:
            if not all(type(p) in (tuple, list) and len(p) == 2 for p in items):
                raise self._limit("OrderedDict built from something other than pairs")
            self._check_keys([p[0] for p in items])
            items = [x for p in items for x in p]
        obj = func(*args)
        self.stack[-1] = obj
        self._made(obj, items)

    def load_long1(self) -> None:
        n = self.read(1)[0]
        self._long(n)

    def load_long4(self) -> None:
        raw = self.read(4)
        if len(raw) < 4:
            raise EOFError
        n = int.from_bytes(raw, "little", signed=True)
        if n < 0:
            raise pickle.UnpicklingError("LONG pickle has negative byte count")
        self._long(n)

    def _long(self, n: int) -> None:
        if n > PICKLE_MAX_INT_BYTES:
            raise self._limit(f"an integer of {n} bytes (at most {PICKLE_MAX_INT_BYTES})")
        data = self.read(n)
        if len(data) < n:
            raise EOFError
        self.append(pickle.decode_long(data))

    def load_int(self) -> None:
        self._check_line_int()

    def load_long(self) -> None:
        self._check_line_int()

    def _check_line_int(self) -> None:
        line = self.readline()
        text = line[:-1].rstrip(b"L")
        if len(text) > 2 * PICKLE_MAX_INT_BYTES + 8:
            raise self._limit("an integer literal too long")
        if text == b"00":
            self.append(False)
        elif text == b"01":
            self.append(True)
        else:
            self.append(int(text, 0))

    def load_put(self) -> None:
        self._memo_check()
        pickle._Unpickler.load_put(self)  # type: ignore[attr-defined]

    def load_binput(self) -> None:
        self._memo_check()
        pickle._Unpickler.load_binput(self)  # type: ignore[attr-defined]

    def load_long_binput(self) -> None:
        self._memo_check()
        pickle._Unpickler.load_long_binput(self)  # type: ignore[attr-defined]

    def load_memoize(self) -> None:
        self._memo_check()
        pickle._Unpickler.load_memoize(self)  # type: ignore[attr-defined]

    def load_mark(self) -> None:
        if len(self.metastack) >= 2 * self._max_depth:
            raise self._limit(f"more than {2 * self._max_depth} MARKs open at once (a MARK storm)")
        pickle._Unpickler.load_mark(self)  # type: ignore[attr-defined]

    def _refused(self) -> None:
        raise self._limit("an object-building opcode (only plain data is accepted)")


for _op, _name in {
        pickle.EMPTY_LIST: "load_empty_list", pickle.EMPTY_DICT: "load_empty_dictionary",
        pickle.EMPTY_SET: "load_empty_set", pickle.EMPTY_TUPLE: "load_empty_tuple",
        pickle.TUPLE: "load_tuple", pickle.TUPLE1: "load_tuple1", pickle.TUPLE2: "load_tuple2",
        pickle.TUPLE3: "load_tuple3", pickle.LIST: "load_list", pickle.DICT: "load_dict",
        pickle.FROZENSET: "load_frozenset", pickle.APPEND: "load_append",
        pickle.APPENDS: "load_appends", pickle.SETITEM: "load_setitem",
        pickle.SETITEMS: "load_setitems", pickle.ADDITEMS: "load_additems",
        pickle.REDUCE: "load_reduce", pickle.LONG1: "load_long1", pickle.LONG4: "load_long4",
        pickle.INT: "load_int", pickle.LONG: "load_long", pickle.PUT: "load_put",
        pickle.BINPUT: "load_binput", pickle.LONG_BINPUT: "load_long_binput",
        pickle.MEMOIZE: "load_memoize", pickle.MARK: "load_mark"}.items():
    RestrictedUnpickler.dispatch[_op[0]] = getattr(RestrictedUnpickler, _name)
for _op in _REFUSED:
    RestrictedUnpickler.dispatch[_op[0]] = RestrictedUnpickler._refused


def loads(data: bytes, *, path: str | os.PathLike[str] = "<bytes>", max_bytes: int = MAX_BYTES,
          max_output: int = PICKLE_MAX_OUTPUT) -> Any:
    """Unpickle `data` with the restricted unpickler; raise InputError on anything else."""
    where = os.fspath(path)
    if len(data) > max_bytes:
        raise InputError(where, f"pickle is {len(data)} bytes, more than the {max_bytes}-byte limit")
    stream = io.BytesIO(data)
    try:
        return RestrictedUnpickler(stream, path=where, max_output=max_output).load()
    except InputError:
        raise
    except RecursionError as exc:
        raise InputError(where, "pickle nested too deeply") from exc
    except MemoryError as exc:
        raise InputError(where, "pickle too large to load") from exc
    except Exception as exc:  # EOFError, UnpicklingError, ValueError, KeyError (bad memo), IndexError, ...
        if isinstance(exc, EOFError) or stream.tell() >= len(data) or "truncated" in str(exc):
            raise InputError(where, "truncated pickle (ended before its STOP opcode)") from exc
        raise InputError(where, f"corrupt pickle ({type(exc).__name__}: {exc})") from exc


def load(path: str | os.PathLike[str], *, max_bytes: int = MAX_BYTES) -> Any:
    """Read and unpickle a file (at most `max_bytes`) with the restricted unpickler."""
    where = os.fspath(path)
    with open(where, "rb") as fh:
        data = fh.read(max_bytes + 1)
    return loads(data, path=where, max_bytes=max_bytes)
