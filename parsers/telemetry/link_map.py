"""A user's link map: which link each measured (device, port) is on, as CSV or YAML.

CSV, with a header naming at least `device`, `port` and either `link` or `peer_device` and
`peer_port` (optional: `host`, `peer_host`, `gbps`, `network`):

    host,device,port,link
    node01,mlx5_0,1,node01-leaf3
    ,leaf3,17,node01-leaf3

or, naming the far end instead of the link:

    device,port,peer_device,peer_port,gbps
    leaf3,Ethernet17,spine1,Ethernet1,400

YAML: the same fields as a list under `links:`. A row with `link` names one end of that link
(the first row of a link is its `src`, the second its `dst`); a row with a peer names a cable.
The rows become `topology_links` (and their ends `topology_nodes`), and the map wins over
ibnetdiscover and names when telemetry ports are matched to links.
"""

from __future__ import annotations

import csv
import io
import os
import re
from typing import Any

import yaml

from tracekit import _yaml
from tracekit._limits import MAX_LINE_BYTES
from tracekit.errors import InputError
from tracekit.parsers.registry import Format
from tracekit.parsers.telemetry._common import decode_text, normal_port, port_owner, read_bytes
from tracekit.store import ParseResult, SourceSink, SourceStats

NAME = "link_map"
PARSER_VERSION = "2"
#: Fastest link speed believed, in Gb/s (a 1.6 Tb/s port is 1,600); beyond it, zero, negative or
#: not finite (NaN, inf) the row keeps no speed, with a warning.
MAX_GBPS = 100_000
_FIELDS = {"host", "device", "port", "link", "peer_host", "peer_device", "peer_port", "gbps", "network"}
_YAML_HEAD = re.compile(rb"(^|\n)links\s*:\s*(\n|$)")


def _csv_header(line: str) -> list[str] | None:
    cols = [c.strip().lower() for c in line.split(",")]
    if not {"device", "port"} <= set(cols):
        return None
    if "link" not in cols and not {"peer_device", "peer_port"} <= set(cols):
        return None
    return cols if set(cols) <= _FIELDS else None


def sniff(head: bytes) -> bool:
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    first_line = next((ln for ln in text.split(b"\n") if ln.strip() and not ln.startswith(b"#")), b"")
    if _csv_header(first_line.decode("utf-8", "replace")) is not None:
        return True
    return _YAML_HEAD.search(head) is not None and b"device" in head and b"port" in head


def parse(path: str | os.PathLike[str], sink: SourceSink, *, rank: int | None = None) -> ParseResult:
    where = os.fspath(path)
    stats = SourceStats()
    text = decode_text(read_bytes(where, stats, max_line_bytes=MAX_LINE_BYTES), where)
    rows = _rows(text, where, stats)
    links: dict[str, dict[str, Any]] = {}
    nodes: dict[str, str | None] = {}
    bad_gbps = 0
    for i, row in enumerate(rows, 1):
        device, port = (str(row.get("device") or "").strip(), str(row.get("port") or "").strip())
        if not device or not port:
            stats.skip("row_without_device_or_port")
            if len(stats.warnings) < 20:
                stats.warnings.append(f"row {i}: no device or port")
            continue
        host = str(row.get("host") or "").strip() or None
        owner = port_owner(host, device)
        nodes.setdefault(owner, host)
        gbps = _float(row.get("gbps"))
        if gbps is not None and not 0 < gbps <= MAX_GBPS:
            bad_gbps += 1
            gbps = None
        link = str(row.get("link") or "").strip()
        if row.get("peer_device"):
            peer_host = str(row.get("peer_host") or "").strip() or None
            peer = port_owner(peer_host, str(row["peer_device"]).strip())
            peer_port = normal_port(row.get("peer_port") or "")
            nodes.setdefault(peer, peer_host)
            name = link or f"{owner}:{normal_port(port)}--{peer}:{peer_port}"
            if name in links:
                stats.skip("duplicate_row")
                continue
            links[name] = {"src": owner, "src_port": normal_port(port), "dst": peer, "dst_port": peer_port,
                           "gbps": gbps, "network": row.get("network")}
            stats.store()
            continue
        if not link:
            stats.skip("row_without_link_or_peer")
            continue
        have = links.get(link)
        if have is None:
            links[link] = {"src": owner, "src_port": normal_port(port), "dst": None, "dst_port": None,
                           "gbps": gbps, "network": row.get("network")}
            stats.store()
        elif have["dst"] is None:
            have.update(dst=owner, dst_port=normal_port(port))
            have["gbps"] = have["gbps"] if have["gbps"] is not None else gbps
            stats.store()
        else:
            stats.skip("third_end_of_a_link")
            stats.warnings.append(f"link {link!r} named on more than two ports; kept the first two")
    if bad_gbps:
        stats.warnings.append(f"{bad_gbps:,} row{'s' if bad_gbps != 1 else ''} with gbps not a number in "
                              f"(0, {MAX_GBPS:,}]: stored without a speed")
    if stats.read == 0:
        raise InputError(where, "no link-map row")
    names = sorted(links)
    sink.add("topology_links", {
        "link": names, "src": [links[n]["src"] for n in names], "dst": [links[n]["dst"] for n in names],
        "gbps": [links[n]["gbps"] for n in names], "network": [links[n]["network"] for n in names],
        "cables": [1] * len(names), "src_port": [links[n]["src_port"] for n in names],
        "dst_port": [links[n]["dst_port"] for n in names], "source_format": [NAME] * len(names)})
    owners = sorted(nodes)
    sink.add("topology_nodes", {"node": owners, "host": [nodes[o] for o in owners],
                                "source_format": [NAME] * len(owners)})
    return ParseResult(stats=stats)


def _rows(text: str, where: str, stats: SourceStats) -> list[dict[str, Any]]:
    """The map's rows; a key given twice (a CSV column named twice, a YAML mapping's key) keeps
    the last value, as csv and PyYAML do, and is named in a warning (issue 22)."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if lines and _csv_header(lines[0]) is not None:
        reader = csv.DictReader(io.StringIO("\n".join(lines)))
        try:
            reader.fieldnames = [f.strip().lower() for f in reader.fieldnames or []]
            twice = sorted({f for f in reader.fieldnames if f and reader.fieldnames.count(f) > 1})
            if twice:
                stats.warnings.append(f"the CSV header names {twice} more than once: the last column kept")
            return [{k: (v.strip() if isinstance(v, str) else v) for k, v in r.items() if k} for r in reader]
        except csv.Error as exc:
            raise InputError(where, f"malformed CSV link map ({exc})") from exc
    repeated: list[list[str]] = []
    try:
        doc = _yaml.load(text, repeated=repeated)
    except _yaml.YAMLBudgetError as exc:
        raise InputError(where, str(exc)) from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        why = getattr(exc, "problem", None) or "syntax error"
        raise InputError(where, f"not a CSV link map and not valid YAML ({why}{at})") from exc
    except RecursionError as exc:
        raise InputError(where, "YAML nested too deeply") from exc
    except ValueError as exc:  # an integer of more than 4,300 digits
        raise InputError(where, f"not a valid YAML link map ({str(exc).split(':')[0]})") from exc
    rows = doc.get("links") if isinstance(doc, dict) else None
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise InputError(where, "a YAML link map needs `links:` as a list of mappings")
    if repeated:
        names = sorted({k for keys in repeated for k in keys})
        stats.warnings.append(f"{len(repeated)} mapping{'s' if len(repeated) != 1 else ''} with keys given more "
                              f"than once, the last value kept ({names[:5]})")
    return rows


def _float(value: Any) -> float | None:
    try:
        return float(value) if value not in (None, "") else None
    except (TypeError, ValueError):
        return None


FORMAT = Format(name=NAME, description="link maps", version=PARSER_VERSION, parse=parse,
                sniffs=(lambda head: sniff(head.data),))
