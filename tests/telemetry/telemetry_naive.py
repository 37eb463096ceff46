"""Slow, obviously correct twins of the telemetry kernels: the Prometheus line tokenizer and the
whole counters -> windows computation, written as plain loops over dicts."""

from __future__ import annotations

import itertools
import re
import statistics
from collections import defaultdict
from decimal import Decimal

from tracekit.telemetry import OUTPUT_COLUMNS, VALUE_COLUMNS

_LINE = re.compile(r'^[ \t]*([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{(?:[^"}\n]|"(?:[^"\\\n]|\\.)*")*\})?)[ \t]+(\S+)'
                   r'(?:[ \t]+(\S+))?[ \t]*\r?$')


def tokenize(text: bytes) -> list[tuple]:
    """Per line: ("blank"|"comment"|"malformed",) or ("sample", series bytes, value, ts or None)."""
    out = []
    lines = text.split(b"\n") if text else []
    if text.endswith(b"\n"):
        lines = lines[:-1]
    for raw in lines:
        line = raw.decode("latin-1")
        if not line.strip(" \t\r"):
            out.append(("blank",))
            continue
        if line.lstrip(" \t").startswith("#"):
            out.append(("comment",))
            continue
        m = _LINE.match(line)
        if not m:
            out.append(("malformed",))
            continue
        series, value, ts = m.groups()
        try:
            v = float(value)
        except ValueError:
            v = "bad"
        stamp = None
        if ts is not None:
            try:
                stamp = Decimal(ts)
            except ArithmeticError:
                stamp = "bad"
        out.append(("sample", series.encode("latin-1"), v, stamp))
    return out


VOID = {"saturated", "reset", "wrap_ambiguous", "gap"}


def rate(rows: list[dict], *, gap_factor: float = 1.5) -> dict[tuple, dict]:
    """(device, port, ts_ns) -> window values and flags, for counters rows given as dicts."""
    timed = [r for r in rows if r["ts_ns"] is not None]
    speeds = defaultdict(list)
    samples = []
    for r in timed:
        if r["kind"] == "gauge" and r["metric"] == "speed_bps":
            speeds[(r["host"] or "", r["device"], r["port"])].append((r["ts_ns"], r["value"]))
        elif r["kind"] in ("counter", "rate"):
            samples.append(r)
    by_port = defaultdict(list)
    for r in samples:
        by_port[(r["host"] or "", r["device"], r["port"])].append(r)
    out = {}
    for port, rs in by_port.items():
        series = defaultdict(list)
        for r in rs:
            series[(r["metric"], r["direction"] or "", r["qualifier"] or "")].append(r)
        steps = []
        for srs in series.values():
            ts = sorted(r["ts_ns"] for r in srs)
            steps += [b - a for a, b in itertools.pairwise(ts) if b > a]
        tol = 0.25 * min(steps) if steps else 0.0
        scrape_of, scrapes = {}, []
        previous = None
        for t in sorted({r["ts_ns"] for r in rs}):
            if previous is not None and t - previous <= tol:
                scrape_of[t] = scrapes[-1]
            else:
                scrapes.append(t)
                scrape_of[t] = t
            previous = t
        speed_list = sorted(speeds.get(port, []))
        top_speed = max((v for _, v in speed_list), default=None)
        cells = defaultdict(lambda: {"sum": 0.0, "present": False, "flags": set()})
        for key, srs in series.items():
            kept, seen = [], set()
            for r in sorted(srs, key=lambda r: r["ts_ns"]):
                s = scrape_of[r["ts_ns"]]
                if s not in seen:
                    seen.add(s)
                    kept.append((s, r))
            col = OUTPUT_COLUMNS.get((key[0], key[1] or None)) or OUTPUT_COLUMNS.get((key[0], None))
            for (s0, a), (s1, b) in itertools.pairwise(kept):
                if col is None:
                    continue
                k = scrapes.index(s1)
                cell = cells[(s1, col)]
                if scrapes[k - 1] != s0:
                    cell["flags"].add("gap")
                    continue
                dt = (s1 - s0) / 1e9
                if b["kind"] == "rate":
                    cell["sum"] += b["value"] * dt
                    cell["present"] = True
                    continue
                delta = b["value"] - a["value"]
                wraps = b["bits"] == 32 and not b["saturable"]
                per_s = None if top_speed is None else top_speed / 8 / (1 if key[0] in ("tx_bytes", "rx_bytes") else 64)
                wrap_s = 2**32 / per_s if per_s else None
                if b["saturated"]:
                    cell["flags"].add("saturated")
                elif wraps and (wrap_s is None or dt >= wrap_s):
                    cell["flags"].add("wrap_ambiguous")
                elif delta < 0 and wraps:
                    cell["flags"].add("wrapped")
                    cell["sum"] += delta + 2**32
                    cell["present"] = True
                elif delta < 0:
                    cell["flags"].add("reset")
                else:
                    cell["sum"] += delta
                    cell["present"] = True
        intervals = [b - a for a, b in itertools.pairwise(scrapes)]
        med = statistics.median(intervals) if intervals else None
        for k in range(1, len(scrapes)):
            s1 = scrapes[k]
            interval = s1 - scrapes[k - 1]
            speed = None
            for t, v in speed_list:
                if t <= s1:
                    speed = v
            if speed is None and speed_list:
                speed = speed_list[0][1]
            row = {"interval_ns": interval, "speed_bps": speed, "flag_detail": set(), "flags": set()}
            for col in VALUE_COLUMNS:
                cell = cells.get((s1, col))
                if cell is None:
                    row[col] = None
                    continue
                void = cell["flags"] & VOID
                row[col] = cell["sum"] if cell["present"] and not void else None
                row["flag_detail"] |= {f"{col}:{f}" for f in cell["flags"]}
            row["flags"] = {d.split(":")[1] for d in row["flag_detail"]}
            if interval > gap_factor * med:
                row["flags"].add("gap")
            out[(port[1], port[2], scrapes[k - 1])] = row
    return out
