"""The repeated-key scan (`_kernels.repeated_keys` behind `_json_keys.RepeatedKeys`) against its
naive twin, json with a pairs hook, on generated JSON with keys given twice."""

from __future__ import annotations

import json

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tracekit.parsers import _kernels
from tracekit.parsers._json_keys import MAX_KEYS, RepeatedKeys

_KEY = st.sampled_from(["a", "b", "ts", "t\\u0073", "x\\\"y", "{", "}\\\\", "é", ""])
_SCALAR = st.one_of(st.integers(-5, 5).map(str), st.sampled_from(['"}"', '"{\\"a\\": 1}"', '"\\\\"', "null", "1.5e3"]))


def _value(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    pairs = st.lists(st.tuples(_KEY, children), max_size=6)
    return st.one_of(
        st.lists(children, max_size=4).map(lambda xs: "[" + ", ".join(xs) + "]"),
        pairs.map(lambda ps: "{" + ", ".join(f'"{k}" : {v}' for k, v in ps) + "}"))


_DOC = st.recursive(_SCALAR, _value, max_leaves=30)


def naive_repeating_objects(text: str) -> tuple[int, set[str]]:
    n, names = 0, set()

    def hook(pairs: list) -> dict:
        nonlocal n
        keys = [k for k, _ in pairs]
        if len(set(keys)) != len(keys):
            n += 1
            names.update(k for k in keys if keys.count(k) > 1)
        return dict(pairs)

    json.loads(text, object_pairs_hook=hook)
    return n, names


@settings(max_examples=400, deadline=None)
@given(_DOC)
def test_scan_counts_what_json_sees(text: str) -> None:
    want, names = naive_repeating_objects(text)
    keys = RepeatedKeys()
    assert keys.scan(text.encode()) == want
    assert set(keys.names) <= names | {"t\\u0073"} and bool(keys.names) == bool(want)


@settings(max_examples=200, deadline=None)
@given(_DOC)
def test_kernel_is_exact_or_says_unsure(text: str) -> None:
    want, _ = naive_repeating_objects(text)
    objects, _, unsure = _kernels.repeated_keys(np.frombuffer(text.encode(), np.uint8), 512, MAX_KEYS,
                                                np.zeros((5, 2), np.int64))
    assert unsure or objects == want
    if "\\u" not in text and "\\\\" not in text and '\\"' not in text:
        assert not unsure


def test_an_object_with_many_keys_is_checked_exactly() -> None:
    body = ", ".join(f'"k{i}": {i}' for i in range(MAX_KEYS * 3))
    text = "[{" + body + ', "k5": 0}, {"k5": 1}]'
    keys = RepeatedKeys()
    assert keys.scan(text.encode()) == 1 and set(keys.names) == {"k5"}
