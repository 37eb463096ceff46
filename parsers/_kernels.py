"""numba kernels for the JSON readers: the repeated-key scan. Kernels see numpy arrays and
scalars only and read no module globals."""

from __future__ import annotations

import numpy as np

from tracekit._jit import njit


@njit
def repeated_keys(data, max_depth, max_keys, spans):
    """(objects giving a key twice, spans written, unsure) for the JSON text `data` (uint8).

    One pass, no decoding: each key is compared with the keys before it in its own object
    (hash first, then bytes). The first `spans.shape[0]` repeated keys' (start, end) offsets
    are written to `spans`. `unsure` is 1 when the scan cannot decide exactly (a key with a
    backslash escape, an object with more than `max_keys` keys, nesting deeper than
    `max_depth`): the caller then asks an exact, slower reader."""
    n = data.shape[0]
    obj_first = np.zeros(max_depth + 1, np.int64)  # index of an open object's first key
    obj_flagged = np.zeros(max_depth + 1, np.int8)
    is_obj = np.zeros(max_depth + 1, np.int8)
    cap = max_keys * 4
    key_hash = np.zeros(cap, np.uint64)
    key_start = np.zeros(cap, np.int64)
    key_end = np.zeros(cap, np.int64)
    nkeys = 0
    depth = 0
    objects = 0
    written = 0
    unsure = 0
    i = 0
    while i < n:
        c = data[i]
        if c == 34:  # '"'
            s = i + 1
            j = s
            escaped = False
            while j < n and data[j] != 34:
                if data[j] == 92:
                    escaped = True
                    j += 1
                j += 1
            e = j
            i = j + 1
            k = i
            while k < n and (data[k] == 32 or data[k] == 9 or data[k] == 10 or data[k] == 13):
                k += 1
            if k < n and data[k] == 58 and depth > 0 and is_obj[depth] == 1:
                if escaped:
                    unsure = 1
                h = np.uint64(14695981039346656037)
                for b in range(s, min(e, n)):
                    h = (h ^ np.uint64(data[b])) * np.uint64(1099511628211)
                first = obj_first[depth]
                if nkeys - first >= max_keys or nkeys >= cap:
                    unsure = 1
                    continue
                for q in range(first, nkeys):
                    if key_hash[q] == h and key_end[q] - key_start[q] == e - s:
                        same = True
                        for b in range(e - s):
                            if data[key_start[q] + b] != data[s + b]:
                                same = False
                                break
                        if same:
                            if obj_flagged[depth] == 0:
                                obj_flagged[depth] = 1
                                objects += 1
                            if written < spans.shape[0]:
                                spans[written, 0] = s
                                spans[written, 1] = e
                                written += 1
                            break
                key_hash[nkeys] = h
                key_start[nkeys] = s
                key_end[nkeys] = e
                nkeys += 1
            continue
        if c == 123 or c == 91:  # '{' '['
            if depth >= max_depth:
                return objects, written, 1
            depth += 1
            is_obj[depth] = 1 if c == 123 else 0
            obj_first[depth] = nkeys
            obj_flagged[depth] = 0
        elif (c == 125 or c == 93) and depth > 0:  # '}' ']'
            if is_obj[depth] == 1:
                nkeys = obj_first[depth]
            depth -= 1
        i += 1
    return objects, written, unsure
