"""Small text formatters shared by the CLI and the analyses."""

from __future__ import annotations

from collections.abc import Iterable


def fmt_ranks(ranks: Iterable[int], *, limit: int = 24) -> str:
    """"0,2,3", "0-7,9": runs of three or more become a range; long lists are cut."""
    rs = sorted(set(ranks))
    parts: list[str] = []
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        if j - i >= 2:
            parts.append(f"{rs[i]}-{rs[j]}")
        else:
            parts.extend(str(r) for r in rs[i:j + 1])
        i = j + 1
    if len(parts) > limit:
        return ",".join(parts[:limit]) + f",… ({len(rs)} ranks)"
    return ",".join(parts)
