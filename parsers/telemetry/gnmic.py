"""gnmic subscribe output, `json` and `event` formats (OpenConfig and SR OS counters).

* `json` (gnmic's default): pretty-printed notification objects concatenated with no array and
  no separator (or one per line): `{"source", "timestamp" (ns), "prefix", "updates": [{"Path",
  "values": {<path>: <value>}}]}`. uint64 values arrive as strings (JSON_IETF, RFC 7951); a value
  may also be a subtree (a container path), which is flattened.
* `event` (what gnmic's Prometheus and InfluxDB outputs use): an array (or a stream) of
  `{"name", "timestamp" (ns), "tags": {"source", "interface_name", ...}, "values": {<xpath
  without keys>: value}}`; the path keys are in the tags as `<elem>_<key>`.

Non-JSON lines between objects (a `^C`, a log line) are skipped and counted; a truncated last
object is salvaged up to the previous one, with a warning.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from typing import Any

from tracekit._limits import MAX_DEPTH, checked_int, json_depth, out_of_range
from tracekit.errors import InputError
from tracekit.parsers._json_keys import RepeatedKeys
from tracekit.parsers.registry import Format
from tracekit.parsers.telemetry import families
from tracekit.parsers.telemetry._common import CounterBuffer, decode_text, read_bytes, strip_port
from tracekit.store import ParseResult, SourceSink, SourceStats

NAME = "gnmic"
PARSER_VERSION = "1"
_JSON_KEYS = re.compile(rb'"(subscription-name|updates|prefix)"\s*:')
_EVENT_KEYS = re.compile(rb'"(tags|values|name|timestamp)"\s*:')


def sniff(head: bytes) -> bool:
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if text[:1] not in (b"{", b"["):
        return False
    if b'"timestamp"' not in head:
        return False
    if text[:1] == b"{" and len({m.group(1) for m in _JSON_KEYS.finditer(head)}) >= 2:
        return True
    return len({m.group(1) for m in _EVENT_KEYS.finditer(head)}) == 4 and b'"source"' in head


def parse(path: str | os.PathLike[str], sink: SourceSink, *, rank: int | None = None) -> ParseResult:
    where = os.fspath(path)
    stats = SourceStats()
    text = decode_text(read_bytes(where, stats), where)
    if json_depth(text) > MAX_DEPTH:  # checked in one linear pass: json's own limit costs seconds per object
        raise InputError(where, f"JSON nested deeper than {MAX_DEPTH} levels")
    buf = CounterBuffer(sink, NAME, stats)
    n_objects = 0
    repeated = RepeatedKeys()
    for obj in _objects(text, stats, repeated):
        items = obj if isinstance(obj, list) else [obj]
        for item in items:
            n_objects += 1
            if not isinstance(item, dict):
                stats.skip("not_an_object")
            elif "updates" in item or "deletes" in item or "prefix" in item:
                _notification(item, buf, stats)
            elif "values" in item and "tags" in item:
                _event(item, buf, stats)
            else:
                stats.skip("not_a_notification")
    if n_objects == 0:
        raise InputError(where, "no gnmic notification or event found")
    if (w := repeated.warning()) is not None:
        stats.warnings.append(w)
    return buf.result()


def _objects(text: str, stats: SourceStats, repeated: RepeatedKeys) -> Iterator[Any]:
    decoder = json.JSONDecoder(object_pairs_hook=repeated.hook)
    pos, n = 0, len(text)
    while pos < n:
        while pos < n and text[pos] in " \t\r\n":
            pos += 1
        if pos >= n:
            return
        if text[pos] not in "{[":
            end = text.find("\n", pos)
            end = n if end < 0 else end + 1
            stats.skip("non_json_line")
            pos = end
            continue
        try:
            obj, pos = decoder.raw_decode(text, pos)
        except (ValueError, RecursionError) as exc:  # ValueError: also an integer of > 4,300 digits
            if not isinstance(exc, json.JSONDecodeError):
                why = "nested too deeply" if isinstance(exc, RecursionError) else "integer too long"
                exc = json.JSONDecodeError(why, text, pos)
            nxt = _next_object(text, pos)
            if nxt is None:
                stats.warnings.append(f"truncated or corrupt JSON at character {pos} ({exc.msg}); "
                                      "read up to the previous object")
                stats.skip("truncated_object")
                return
            stats.skip("corrupt_object")
            pos += nxt
            continue
        yield obj


def _next_object(text: str, pos: int) -> int | None:
    """Offset from `pos` of the next line starting an object (no copy of the rest: linear)."""
    m = _NEXT_OBJECT.search(text, pos + 1)
    return None if m is None else m.start() + 1 - pos


_NEXT_OBJECT = re.compile(r"\n[{\[]")


def _leaves(path: str, value: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(f"{path}/{k}" if path else str(k), v)
    else:
        yield path, value


def _notification(obj: dict[str, Any], buf: CounterBuffer, stats: SourceStats) -> None:
    ts = obj.get("timestamp")
    source = strip_port(str(obj.get("source") or obj.get("target") or "")) or "switch"
    prefix = str(obj.get("prefix") or "").strip("/")
    deletes = obj.get("deletes") or []
    if deletes:
        stats.skip("delete", len(deletes) if isinstance(deletes, list) else 1)
    for update in obj.get("updates") or []:
        if not isinstance(update, dict):
            stats.skip("not_an_object")
            continue
        values = update.get("values")
        if not isinstance(values, dict):
            stats.skip("no_values")
            continue
        base = str(update.get("Path") or "").strip("/")
        for key, value in values.items():
            # gnmic keys `values` by the update's path; a subtree value nests further.
            rel = str(key).strip("/")
            if base and rel != base and not rel.startswith(base + "/") and "/" not in rel:
                rel = base
            for leaf, v in _leaves(rel, value):
                full = f"{prefix}/{leaf}" if prefix else leaf
                elems, keys = families.path_elements(full)
                spec, where = families.classify_path(elems)
                if spec is None:
                    stats.skip(where)
                    continue
                port, qualifier = families.port_from_keys(where, keys)
                _store(buf, stats, ts, source, port, qualifier, spec, v, elems[-1])


def _event(obj: dict[str, Any], buf: CounterBuffer, stats: SourceStats) -> None:
    tags = obj.get("tags") if isinstance(obj.get("tags"), dict) else {}
    tags = {str(k): str(v) for k, v in tags.items()}
    source = strip_port(tags.get("source") or tags.get("target")) or "switch"
    values = obj.get("values")
    if not isinstance(values, dict):
        stats.skip("no_values")
        return
    for key, value in values.items():
        elems, keys = families.path_elements(str(key))
        spec, where = families.classify_path(elems)
        if spec is None:
            stats.skip(where)
            continue
        port, qualifier = families.port_from_keys(where, keys) if keys else families.port_from_tags(where, tags)
        _store(buf, stats, obj.get("timestamp"), source, port, qualifier, spec, value, elems[-1])


def _store(buf: CounterBuffer, stats: SourceStats, ts: Any, source: str, port: str | None,
           qualifier: str | None, spec: families.MetricSpec, value: Any, leaf: str) -> None:
    if port is None:
        stats.skip("no_port_key")
        return
    if isinstance(ts, bool) or not isinstance(ts, (int, str)) or not str(ts).lstrip("-").isdigit():
        stats.skip("no_timestamp")
        return
    stamp = checked_int(ts, "id")
    if stamp is None:
        stats.skip(out_of_range("ts"))
        return
    if isinstance(value, bool):
        stats.skip("bad_value")
        return
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        stats.skip("bad_value")
        return
    if number != number:
        stats.skip("nan_value")
        return
    buf.add(stamp, source, source, port, spec, number * spec.scale, name=leaf, qualifier=qualifier)


FORMAT = Format(name=NAME, description="gnmic output", version=PARSER_VERSION, parse=parse,
                sniffs=(lambda head: sniff(head.data),))
