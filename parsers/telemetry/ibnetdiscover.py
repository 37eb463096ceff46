"""`ibnetdiscover` output -> the fabric: `topology_nodes` (HCAs, switches) and `topology_links`.

Two forms are read:

* `ibnetdiscover -p` (ports report), one line per port:
  `CA 134 1 0x7cfe9003003b4bde 4x EDR - SW 1719 10 0x7cfe9003009ce5b0 ( 'o0001 HCA-1' - 'ib-i1l1s01' )`
  (type, LID, port, GUID, width, speed, then the peer's; a port with no peer is down).
* the default topology file: `Switch 36 "S-<guid>" # "<name>" ... lid N` / `Ca 1 "H-<guid>" # "<name>"`
  headers, each followed by `[port] "S-<peer guid>"[peer port] # "<peer name>" lid N 4xEDR`.

Every cable is listed from both ends; it is stored once (`other_end_of_a_stored_link` counts the
second sighting). A port claimed by two different cables keeps the first (`conflicting_cable`).

Names: an HCA described as `<host> <hca>` (`o0001 HCA-1`, `worker20 mlx5_3`) becomes node
`o0001/HCA-1` on host `o0001`; a switch keeps its description; two devices with the same
description get their GUID appended. A link is `<src>:<port>--<dst>:<port>`, src on the lower tier.

Tiers come from the graph: a switch with a host's HCA on it is a `leaf`; a switch one switch-hop
above a leaf (and none of the former) is a `spine`, two hops a `core`. A switch the graph cannot
place (no cabled neighbour) is named by its description when that says leaf/spine/core, else
stays `switch`. SHARP "Aggregation Node" CAs live inside switches and do not make a leaf.
Speeds are data rates per direction (4x EDR = 100 Gb/s; QDR and older lose 20 % to 8b/10b).
"""

from __future__ import annotations

import os
import re
from collections import deque
from dataclasses import dataclass, field

from tracekit._limits import MAX_LINE_BYTES
from tracekit.errors import InputError
from tracekit.parsers.registry import Format
from tracekit.parsers.telemetry._common import decode_text, read_bytes
from tracekit.store import ParseResult, SourceSink, SourceStats

NAME = "ibnetdiscover"
PARSER_VERSION = "1"
#: Data rate per lane in Gb/s (after line coding).
LANE_GBPS = {"SDR": 2.0, "DDR": 4.0, "QDR": 8.0, "FDR10": 10.0, "FDR": 14.0625 * 64 / 66, "EDR": 25.0,
             "HDR": 50.0, "NDR": 100.0, "XDR": 200.0}
_TYPES = {"CA": "CA", "SW": "SW", "RT": "RT", "Ca": "CA", "Switch": "SW", "Rt": "RT"}
_GUID = r"0x[0-9a-fA-F]+"
_N = r"(\d{1,9})"  # lids, ports, widths: bounded, so a huge number is an unrecognised line, not an overflow
_P_LINK = re.compile(rf"^(CA|SW|RT)\s+{_N}\s+{_N}\s+({_GUID})\s+{_N}x\s+(\S+)\s+-\s+(CA|SW|RT)\s+{_N}\s+{_N}\s+"
                     rf"({_GUID})\s+\((.*)\)\s*$")
_P_DOWN = re.compile(rf"^(CA|SW|RT)\s+{_N}\s+{_N}\s+({_GUID})\s+{_N}x\s+(\S+)\s+'(.*)'\s*$")
_T_NODE = re.compile(rf'^(Switch|Ca|Rt)\s+{_N}\s+"([SHR])-([0-9a-fA-F]+)"\s*(?:#\s*"(.*?)"(.*))?$')
_T_PORT = re.compile(rf'^\[{_N}\](?:\(([0-9a-fA-F]+)\))?\s+"([SHR])-([0-9a-fA-F]+)"\[{_N}\](?:\(([0-9a-fA-F]+)\))?'
                     r'\s*(?:#\s*(.*))?$')
_SNIFF_P = re.compile(rb"(^|\n)(CA|SW|RT)\s+\d+\s+\d+\s+0x[0-9a-fA-F]+\s+\d+x\s+\S+")
_SNIFF_T = re.compile(rb'(^|\n)(Switch|Ca|Rt)\s+\d+\s+"[SHR]-[0-9a-fA-F]+"')
_TIER_RANK = {"nic": 0, "leaf": 1, "spine": 2, "core": 3, "switch": 4}


def sniff(head: bytes) -> bool:
    return _SNIFF_P.search(head) is not None or _SNIFF_T.search(head) is not None


@dataclass
class _Node:
    guid: str
    type: str
    lid: int | None = None
    description: str = ""


@dataclass
class _Fabric:
    nodes: dict[str, _Node] = field(default_factory=dict)
    cables: dict[tuple[str, int], tuple[tuple[str, int], str, str]] = field(default_factory=dict)
    order: list[tuple[tuple[str, int], tuple[str, int], str, str]] = field(default_factory=list)

    def node(self, guid: str, type_: str, lid: int | None, desc: str | None) -> None:
        n = self.nodes.get(guid)
        if n is None:
            n = self.nodes[guid] = _Node(guid, type_)
        if lid is not None and n.lid is None and (type_ == "CA" or n.type != "CA"):
            n.lid = lid
        if desc and not n.description:
            n.description = desc.strip()

    def cable(self, a: tuple[str, int], b: tuple[str, int], width: str, speed: str, stats: SourceStats) -> None:
        have_a, have_b = self.cables.get(a), self.cables.get(b)
        if have_a is not None and have_a[0] == b:
            stats.skip("other_end_of_a_stored_link")
            return
        if have_a is not None or have_b is not None:
            taken = a if have_a is not None else b
            stats.skip("conflicting_cable")
            stats.warnings.append(f"port {taken[0]}/{taken[1]} is cabled twice (to {(have_a or have_b)[0][0]}/"
                                  f"{(have_a or have_b)[0][1]} and to {(b if have_a is not None else a)[0]}/"
                                  f"{(b if have_a is not None else a)[1]}); kept the first")
            return
        self.cables[a] = (b, width, speed)
        self.cables[b] = (a, width, speed)
        self.order.append((a, b, width, speed))
        stats.store()


def parse(path: str | os.PathLike[str], sink: SourceSink, *, rank: int | None = None) -> ParseResult:
    where = os.fspath(path)
    stats = SourceStats()
    text = decode_text(read_bytes(where, stats, max_line_bytes=MAX_LINE_BYTES), where)
    fabric = _Fabric()
    lines = text.splitlines()
    if any(_T_NODE.match(ln.strip()) for ln in lines[:4000]):
        _read_topology_file(lines, fabric, stats)
    else:
        _read_ports_report(lines, fabric, stats)
    if not fabric.nodes:
        raise InputError(where, "no InfiniBand node found")
    nodes, links = build_tables(fabric)
    nodes["source_format"] = [NAME] * len(nodes["node"])
    links["source_format"] = [NAME] * len(links["link"])
    sink.add("topology_nodes", nodes)
    sink.add("topology_links", links)
    return ParseResult(stats=stats)


def _read_ports_report(lines: list[str], fabric: _Fabric, stats: SourceStats) -> None:
    for raw in lines:
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _P_LINK.match(line)
        if m:
            t1, lid1, port1, guid1, width, speed, t2, lid2, port2, guid2, names = m.groups()
            desc1, desc2 = _split_names(names)
            fabric.node(guid1.lower(), t1, int(lid1), desc1)
            fabric.node(guid2.lower(), t2, int(lid2), desc2)
            fabric.cable((guid1.lower(), int(port1)), (guid2.lower(), int(port2)), f"{width}x", speed, stats)
            continue
        m = _P_DOWN.match(line)
        if m:
            t1, lid1, _, guid1, _, _, desc = m.groups()
            fabric.node(guid1.lower(), t1, int(lid1), desc)
            stats.skip("unconnected_port")
            continue
        stats.skip("unrecognised_line")


def _split_names(inside: str) -> tuple[str, str]:
    text = inside.strip()
    if text.startswith("'") and text.endswith("'") and "' - '" in text:
        left, _, right = text[1:-1].rpartition("' - '")
        return left.strip(), right.strip()
    return "", ""


_WIDTH_SPEED = re.compile(r"\b(\d{1,9})x([A-Z][A-Z0-9]*)\b")
_QUOTED = re.compile(r'"(.*?)"')
_LID = re.compile(r"\blid\s+(\d{1,9})")


def _read_topology_file(lines: list[str], fabric: _Fabric, stats: SourceStats) -> None:
    current: tuple[str, str] | None = None
    for raw in lines:
        line = raw.strip()
        if not line or line.startswith("#") or "=" in line.split(" ", 1)[0]:
            continue
        m = _T_NODE.match(line)
        if m:
            kind, _, _, guid, desc, rest = m.groups()
            lid = _LID.search(rest or "")
            guid = "0x" + guid.lower()
            fabric.node(guid, _TYPES[kind], int(lid.group(1)) if lid else None, desc)
            current = (guid, _TYPES[kind])
            continue
        m = _T_PORT.match(line)
        if m and current is not None:
            port, _, peer_type, peer_guid, peer_port, _, comment = m.groups()
            comment = comment or ""
            quoted = _QUOTED.search(comment)
            lids = _LID.findall(comment)
            ws = _WIDTH_SPEED.search(comment)
            peer = "0x" + peer_guid.lower()
            peer_lid = int(lids[-1]) if lids else None
            if current[1] == "CA" and lids:
                node = fabric.nodes[current[0]]
                node.lid = node.lid if node.lid is not None else int(lids[0])
            fabric.node(peer, {"S": "SW", "H": "CA", "R": "RT"}[peer_type], peer_lid,
                        quoted.group(1) if quoted else None)
            fabric.cable((current[0], int(port)), (peer, int(peer_port)),
                         f"{ws.group(1)}x" if ws else "?", ws.group(2) if ws else "?", stats)
            continue
        stats.skip("unrecognised_line")


def _names(fabric: _Fabric) -> dict[str, tuple[str, str | None, str]]:
    """guid -> (node name, host, kind before tiering)."""
    raw: dict[str, tuple[str, str | None, str]] = {}
    for guid, n in fabric.nodes.items():
        desc = n.description.strip()
        if n.type == "CA":
            if "aggregation node" in desc.lower() or not desc:
                raw[guid] = (desc or f"ca {guid}", None, "nic")
            else:
                host, _, hca = desc.partition(" ")
                raw[guid] = (f"{host}/{hca.strip()}" if hca.strip() else host, host, "nic")
        else:
            raw[guid] = (desc or f"switch {guid}", None, "switch")
    seen: dict[str, int] = {}
    for name, _, _ in raw.values():
        seen[name] = seen.get(name, 0) + 1
    return {g: ((f"{name} ({g})" if seen[name] > 1 else name), host, kind) for g, (name, host, kind) in raw.items()}


def infer_tiers(fabric: _Fabric, names: dict[str, tuple[str, str | None, str]]) -> dict[str, str]:
    """guid -> nic | leaf | spine | core | switch (see the module docstring)."""
    neighbours: dict[str, set[str]] = {g: set() for g in fabric.nodes}
    for a, b, _, _ in fabric.order:
        neighbours[a[0]].add(b[0])
        neighbours[b[0]].add(a[0])
    switches = {g for g, n in fabric.nodes.items() if n.type != "CA"}
    host_cas = {g for g, n in fabric.nodes.items() if n.type == "CA" and names[g][1] is not None}
    tier = {g: "nic" for g in fabric.nodes if g not in switches}
    leaves = {s for s in switches if neighbours[s] & host_cas}
    dist = {s: 0 for s in leaves}
    queue = deque(leaves)
    while queue:
        s = queue.popleft()
        for t in neighbours[s] & switches:
            if t not in dist:
                dist[t] = dist[s] + 1
                queue.append(t)
    for s in switches:
        d = dist.get(s)
        if d is not None:
            tier[s] = ("leaf", "spine", "core")[min(d, 2)]
            continue
        desc = fabric.nodes[s].description.lower()
        tier[s] = next((t for t in ("leaf", "spine", "core") if t in desc), "switch")
    return tier


def build_tables(fabric: _Fabric) -> tuple[dict[str, list], dict[str, list]]:
    names = _names(fabric)
    tiers = infer_tiers(fabric, names)
    nodes: dict[str, list] = {k: [] for k in ("node", "kind", "host", "network", "guid", "lid", "description")}
    for guid in sorted(fabric.nodes, key=lambda g: names[g][0]):
        n = fabric.nodes[guid]
        for k, v in (("node", names[guid][0]), ("kind", tiers[guid]), ("host", names[guid][1]),
                     ("network", "backend"), ("guid", guid), ("lid", n.lid), ("description", n.description)):
            nodes[k].append(v)
    links: dict[str, list] = {k: [] for k in ("link", "src", "dst", "gbps", "medium", "network", "tier", "cables",
                                              "src_port", "dst_port", "width", "speed")}
    for a, b, width, speed in fabric.order:
        ends = sorted([a, b], key=lambda e: (_TIER_RANK[tiers[e[0]]], names[e[0]][0], e[1]))
        (sg, sp), (dg, dp) = ends
        src, dst = names[sg][0], names[dg][0]
        ts, td = tiers[sg], tiers[dg]
        tier = f"{ts}-{td}" if f"{ts}-{td}" in ("nic-leaf", "leaf-spine", "spine-core") else "other"
        lanes = int(width[:-1]) if width[:-1].isdigit() else None
        lane = LANE_GBPS.get(speed)
        for k, v in (("link", f"{src}:{sp}--{dst}:{dp}"), ("src", src), ("dst", dst),
                     ("gbps", lane * lanes if lane and lanes else None), ("medium", "ib"), ("network", "backend"),
                     ("tier", tier), ("cables", 1), ("src_port", str(sp)), ("dst_port", str(dp)),
                     ("width", width), ("speed", speed)):
            links[k].append(v)
    return nodes, links


FORMAT = Format(name=NAME, description="ibnetdiscover -p", version=PARSER_VERSION, parse=parse,
                sniffs=(lambda head: sniff(head.data),))
