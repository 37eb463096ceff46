"""Prometheus HTTP API results: `/api/v1/query_range` (matrix) and `/api/v1/query` (vector).

`{"status": "success", "data": {"resultType": "matrix", "result": [{"metric": {...},
"values": [[<unix seconds, float>, "<value as a string>"], ...]}]}}`. Every [time, value] pair
is one sample. Store raw counters queried this way (`ifHCInOctets{...}`), not `rate(...)`:
a `rate()` result has no `__name__` and is skipped (`no_metric_name`).
"""

from __future__ import annotations

import os
import re
from typing import Any

import msgspec

from tracekit.errors import InputError
from tracekit.parsers._json_keys import warn_repeated_keys
from tracekit.parsers.registry import Format
from tracekit.parsers.telemetry import families
from tracekit.parsers.telemetry._common import CounterBuffer, decode_text, epoch_to_ns, read_bytes
from tracekit.store import ParseResult, SourceSink, SourceStats

NAME = "prometheus_json"
PARSER_VERSION = "1"
_SNIFF = re.compile(rb'"resultType"\s*:\s*"(matrix|vector)"')


def sniff(head: bytes) -> bool:
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    return text.startswith(b"{") and b'"status"' in head and _SNIFF.search(head) is not None


def parse(path: str | os.PathLike[str], sink: SourceSink, *, rank: int | None = None) -> ParseResult:
    where = os.fspath(path)
    stats = SourceStats()
    text = decode_text(read_bytes(where, stats), where)
    try:
        doc = msgspec.json.decode(text)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise InputError(where, f"not valid JSON ({exc})") from exc
    warn_repeated_keys(text, stats.warnings)
    if not isinstance(doc, dict):
        raise InputError(where, "not a Prometheus API response (top level is not an object)")
    if doc.get("status") != "success":
        raise InputError(where, f"Prometheus API error: {doc.get('errorType', '?')}: {doc.get('error', '?')}")
    data = doc.get("data")
    if not isinstance(data, dict) or data.get("resultType") not in ("matrix", "vector"):
        kind = data.get("resultType") if isinstance(data, dict) else None
        raise InputError(where, f"resultType {kind!r}: only matrix and vector results hold samples")
    result = data.get("result")
    if not isinstance(result, list):
        raise InputError(where, "data.result is not a list")
    buf = CounterBuffer(sink, NAME, stats)
    for w in doc.get("warnings") or []:
        stats.warnings.append(f"Prometheus warning: {w}")
    for series in result:
        _series(series, buf, stats)
    return buf.result()


def _series(series: Any, buf: CounterBuffer, stats: SourceStats) -> None:
    if not isinstance(series, dict):
        stats.skip("malformed_series")
        return
    points = series.get("values")
    if points is None and "value" in series:
        points = [series["value"]]
    n_hist = len(series.get("histograms") or []) + (1 if "histogram" in series else 0)
    if n_hist:
        stats.skip("histogram", n_hist)
    if not isinstance(points, list):
        return
    labels = series.get("metric")
    labels = {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}
    name = labels.get("__name__")
    if not name:
        stats.skip("no_metric_name", len(points))
        return
    fam = families.prometheus_family(name)
    if fam.spec is None and fam.skip == families.UNUSED and name.endswith("_total"):
        fam = families.prometheus_family(name[: -len("_total")])
    if fam.spec is None or fam.identity is None:
        stats.skip(fam.skip or families.UNUSED, len(points))
        return
    host, device, port, qualifier = fam.identity(labels, None)
    spec = fam.spec
    for point in points:
        if not (isinstance(point, (list, tuple)) and len(point) == 2):
            stats.skip("malformed_point")
            continue
        t, v = point
        try:
            ts = epoch_to_ns(repr(t) if isinstance(t, float) else str(t))
            value = float(v)
        except (TypeError, ValueError):
            stats.skip("malformed_point")
            continue
        if value != value:
            stats.skip("nan_value")
            continue
        buf.add(ts, host, device, port, spec, value * spec.scale, name=name, qualifier=qualifier)


FORMAT = Format(name=NAME, description="Prometheus query_range JSON", version=PARSER_VERSION, parse=parse,
                sniffs=(lambda head: sniff(head.data),))
