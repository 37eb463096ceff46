"""Small text formatters shared by the CLI and the analyses."""

from __future__ import annotations

import re
from collections.abc import Iterable

#: C0 controls but newline and tab, DEL, C1 controls, and the bidi overrides/isolates that
#: can reorder what a terminal shows.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def term(text: object) -> str:
    """`text` safe for a terminal: control characters (ESC, OSC, BEL, C1, bidi overrides) are
    shown escaped (`\\x1b`), never interpreted; newlines and tabs stay."""
    s = text if isinstance(text, str) else str(text)
    return _CONTROL.sub(_escape, s)


#: Everything `term` escapes, and the characters that end or move within a line: newline, tab,
#: carriage return and the Unicode line and paragraph separators.
_LINE_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def one_line(text: object) -> str:
    """`text` safe as one line of text output (a table cell, a finding, a `name: value` line):
    like `term`, and newlines, tabs and line separators are shown escaped too (`\\x0a`), so a
    name from a trace can neither start a line of its own nor break a table's columns."""
    s = text if isinstance(text, str) else str(text)
    return _LINE_CONTROL.sub(_escape, s)


def _escape(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


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


def fmt_ns(ns: float | None) -> str:
    """A duration for people: 812 ns, 35.2 µs, 81.2 ms, 1.23 s.

    The one duration format of the CLI, the findings and the report, so that the same number
    reads the same everywhere.
    """
    if ns is None or ns != ns or abs(ns) == float("inf"):
        return "n/a"
    a = abs(ns)
    if a < 1e3:
        return f"{ns:.0f} ns"
    if a < 1e6 - 50:
        return f"{ns / 1e3:.1f} µs"
    if a < 1e9 - 5e4:
        return f"{ns / 1e6:.1f} ms"
    return f"{ns / 1e9:.2f} s"


def fmt_bytes(n: float | None) -> str:
    """Bytes in B, KB, MB or GB (decimal units, as bandwidths are quoted): 812 B, 8.96 KB, 1.73 GB."""
    if n is None or n != n:
        return "n/a"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def bytes_unit(largest: float) -> tuple[str, float]:
    """The unit (and its scale) in which `largest` reads best: ("KB", 1e3) for 8,960 bytes."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(largest) >= scale:
            return unit, scale
    return "B", 1.0


def fmt_rate(gbps: float | None) -> str:
    """A bandwidth given in GB/s (bytes per ns), in the unit that reads best: 44.7 GB/s, 121 MB/s."""
    if gbps is None or gbps != gbps:
        return "-"
    for unit, scale in (("GB/s", 1.0), ("MB/s", 1e-3), ("KB/s", 1e-6)):
        if abs(gbps) >= scale:
            return f"{gbps / scale:.3g} {unit}"
    return f"{gbps * 1e9:.3g} B/s"


def fmt_pct(share: float | None) -> str:
    """A share as a percentage with no decimals: 0.701 -> "70%"; None -> "-"."""
    return "-" if share is None or share != share else f"{100 * share:.0f}%"


def short_paths(paths: Iterable[str]) -> dict[str, str]:
    """For each path, the shortest trailing part that tells it apart from the others.

    "fr/json/rank_0.json" and "fr/pickle/rank_0" both end in a name of their own, so they stay
    "rank_0.json" and "rank_0"; two "trace.json" in different folders become "a/trace.json" and
    "b/trace.json".
    """
    from pathlib import PurePath

    parts = {p: PurePath(p).parts for p in paths}
    depth = dict.fromkeys(parts, 1)
    while True:
        names: dict[str, list[str]] = {}
        for p, ps in parts.items():
            names.setdefault("/".join(ps[-depth[p]:]), []).append(p)
        clash = [p for group in names.values() if len(group) > 1 for p in group if depth[p] < len(parts[p])]
        if not clash:
            return {p: "/".join(ps[-depth[p]:]) for p, ps in parts.items()}
        for p in clash:
            depth[p] += 1


def grouped_warnings(per_source: Iterable[tuple[str, Iterable[str]]]) -> list[str]:
    """One line per distinct warning, naming the source or how many sources gave it.

    `per_source` is (source name, its warnings); the same text from 16 sources is said once
    ("16 sources: ..."), as `ingest` and `info` both print it.
    """
    by_text: dict[str, list[str]] = {}
    for name, warnings in per_source:
        for w in warnings:
            names = by_text.setdefault(w, [])
            if name not in names:
                names.append(name)
    return [f"{names[0] if len(names) == 1 else f'{len(names)} sources'}: {w}" for w, names in by_text.items()]
