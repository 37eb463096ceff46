"""InfiniBand / RoCE port counters dumped from sysfs as `path:value` lines.

What `grep -H . /sys/class/infiniband/*/ports/*/{counters,counters_ext,hw_counters}/* \
/sys/class/infiniband/*/ports/*/rate` prints, optionally with a pdsh/clush `host: ` prefix:

    node01: /sys/class/infiniband/mlx5_0/ports/1/counters/port_xmit_data:3733440

`port_xmit_data`/`port_rcv_data` count 4-byte words (x4 here). `counters/` may be the 32-bit
PortCounters (saturating) on old HCAs; `counters_ext/*_64` are 64-bit and win when both are
present (the other is skipped as `legacy_duplicate`). `rate` ("400 Gb/sec (4X NDR)") gives the
speed. Time stamps as for perfquery: a line with only `date +%s.%N` (or ISO 8601) dates the
lines after it.
"""

from __future__ import annotations

import os
import re

from tracekit._limits import MAX_LINE_BYTES, out_of_range
from tracekit.errors import InputError
from tracekit.parsers.registry import Format
from tracekit.parsers.telemetry._common import CounterBuffer, MetricSpec, decode_text, read_bytes, time_line
from tracekit.store import ParseResult, SourceSink, SourceStats

NAME = "sysfs_ib"
PARSER_VERSION = "1"
_LINE = re.compile(r"^(?:([^\s:/]+):\s+)?/?sys/class/infiniband/([^/\s]+)/ports/(\d+)/"
                   r"(?:(counters|counters_ext|hw_counters)/)?([A-Za-z0-9_]+):\s*(.*?)\s*$")
_SNIFF = re.compile(rb"(^|\n)(?:[^\s:/]+:\s+)?/?sys/class/infiniband/[^/\s]+/ports/\d+/[A-Za-z0-9_/]+:[^\n]*\d")
_RATE = re.compile(r"^([\d.]+)\s*Gb/sec", re.I)

_W = {"saturable": True, "device_factor": 4.0, "scale": 4.0}
_COUNTERS = {
    ("counters", "port_xmit_data"): MetricSpec("tx_bytes", "tx", bits=None, **_W),
    ("counters", "port_rcv_data"): MetricSpec("rx_bytes", "rx", bits=None, **_W),
    ("counters", "port_xmit_packets"): MetricSpec("tx_pkts", "tx", bits=None, saturable=True),
    ("counters", "port_rcv_packets"): MetricSpec("rx_pkts", "rx", bits=None, saturable=True),
    ("counters", "port_xmit_wait"): MetricSpec("xmit_wait", "tx", bits=32, saturable=True),
    ("counters", "port_xmit_discards"): MetricSpec("discards", "tx", bits=16, saturable=True),
    ("counters", "port_rcv_errors"): MetricSpec("errors", "rx", bits=16, saturable=True),
    ("counters_ext", "port_xmit_data_64"): MetricSpec("tx_bytes", "tx", bits=64, **_W),
    ("counters_ext", "port_rcv_data_64"): MetricSpec("rx_bytes", "rx", bits=64, **_W),
    ("counters_ext", "port_xmit_packets_64"): MetricSpec("tx_pkts", "tx", bits=64, saturable=True),
    ("counters_ext", "port_rcv_packets_64"): MetricSpec("rx_pkts", "rx", bits=64, saturable=True),
    ("hw_counters", "np_ecn_marked_roce_packets"): MetricSpec("ecn_marked", "rx", bits=64),
    (None, "rate"): MetricSpec("speed_bps", None, kind="gauge", bits=None, scale=1e9),
}


def sniff(head: bytes) -> bool:
    """At least one `.../ports/<n>/<file>:<value>` line (a ttar fixture's `Path: ...` lines are not)."""
    return any(_LINE.match(ln.decode("utf-8", "replace").strip()) and not ln.startswith((b"Path:", b"Directory:"))
               for ln in head.split(b"\n")[:256] if _SNIFF.search(b"\n" + ln))


def parse(path: str | os.PathLike[str], sink: SourceSink, *, rank: int | None = None) -> ParseResult:
    where = os.fspath(path)
    stats = SourceStats()
    text = decode_text(read_bytes(where, stats, max_line_bytes=MAX_LINE_BYTES), where)
    ts: int | None = None
    rows: list[tuple] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        stamp = time_line(line)
        if stamp is not None:
            ts = stamp
            continue
        m = _LINE.match(line)
        if m is None:
            stats.skip("unrecognised_line")
            continue
        host, device, port, folder, name, value_text = m.groups()
        spec = _COUNTERS.get((folder, name))
        if spec is None:
            stats.skip("unused_metric")
            continue
        if name == "rate":
            r = _RATE.match(value_text)
            value = float(r.group(1)) if r else None
        else:
            try:
                count = int(value_text)
            except ValueError:
                count = None
            if count is not None and count.bit_length() > 64:  # counters are at most 64 bits wide
                stats.skip(out_of_range("value"))
                continue
            value = float(count) if count is not None else None
        if value is None:
            stats.skip("bad_value")
            continue
        rows.append((ts, host, device, port, folder, name, spec, value))
    if not rows and stats.read == 0:
        raise InputError(where, "no sysfs InfiniBand counter line found")
    extended = {(r[0], r[1], r[2], r[3], r[6].metric) for r in rows if r[4] == "counters_ext"}
    buf = CounterBuffer(sink, NAME, stats)
    for ts_ns, host, device, port, folder, name, spec, value in rows:
        if folder == "counters" and (ts_ns, host, device, port, spec.metric) in extended:
            stats.skip("legacy_duplicate")
            continue
        buf.add(ts_ns, host, device, port, spec, value * spec.scale, name=f"{folder}/{name}" if folder else name)
    if any(r[0] is None for r in rows):
        stats.warnings.append("lines with no time stamp line before them: stored untimed "
                              "(put `date +%s.%N` before each dump for rates)")
    return buf.result()


FORMAT = Format(name=NAME, description="sysfs InfiniBand counters", version=PARSER_VERSION, parse=parse,
                sniffs=(lambda head: sniff(head.data),))
