"""InfiniBand `perfquery` output: `-x` (PortCountersExtended) and basic PortCounters.

Each block starts with `# Port extended counters: Lid 1719 port 1 (CapMask: ...)` or
`# Port counters: Lid 134 port 1 ...`, then `Name:....value` lines. PortXmitData/PortRcvData
count 4-byte words (x4 here). The basic counters are 32-bit (data, packets, PortXmitWait) or
16/8/4-bit (errors) and saturate at all ones instead of wrapping; the extended data and packet
counters are 64-bit.

perfquery prints no time. A line holding only a time stamp (epoch seconds/ms/us/ns as printed
by `date +%s.%N`, or ISO 8601, optionally after `#` and `ts:`) dates the blocks after it, so a
loop like `while :; do date +%s.%N; perfquery -x $lid $port; sleep 10; done` gives rates.
Blocks before any such line are stored untimed. The port is named `lid:<LID>` (resolved to a
node through ibnetdiscover's LIDs).
"""

from __future__ import annotations

import os
import re

from tracekit._limits import MAX_LINE_BYTES, checked_int, out_of_range
from tracekit.errors import InputError
from tracekit.parsers.registry import Format
from tracekit.parsers.telemetry._common import CounterBuffer, MetricSpec, decode_text, read_bytes, time_line
from tracekit.store import ParseResult, SourceSink, SourceStats

NAME = "perfquery"
PARSER_VERSION = "1"
_HEADER = re.compile(r"^#\s*Port (extended )?counters:\s*Lid\s+(\d+)\s+port\s+(\d+)", re.I)
_FIELD = re.compile(r"^([A-Za-z][A-Za-z0-9]*):\.*\s*(\S+)\s*$")
_SNIFF = re.compile(rb"(^|\n)#\s*Port (extended )?counters:\s*Lid\s+\d+\s+port\s+\d+|(^|\n)PortXmitData:\.{3,}")

_BASIC_WIDTHS = {
    "PortXmitData": 32, "PortRcvData": 32, "PortXmitPkts": 32, "PortRcvPkts": 32, "PortXmitWait": 32,
    "SymbolErrorCounter": 16, "LinkErrorRecoveryCounter": 8, "LinkDownedCounter": 8,
    "PortRcvErrors": 16, "PortRcvRemotePhysicalErrors": 16, "PortRcvSwitchRelayErrors": 16,
    "PortXmitDiscards": 16, "PortXmitConstraintErrors": 8, "PortRcvConstraintErrors": 8,
    "LocalLinkIntegrityErrors": 4, "ExcessiveBufferOverrunErrors": 4, "VL15Dropped": 16,
}
#: field -> (metric, direction, scale)
_FIELDS = {
    "PortXmitData": ("tx_bytes", "tx", 4.0), "PortRcvData": ("rx_bytes", "rx", 4.0),
    "PortXmitPkts": ("tx_pkts", "tx", 1.0), "PortRcvPkts": ("rx_pkts", "rx", 1.0),
    "PortXmitWait": ("xmit_wait", "tx", 1.0), "PortXmitDiscards": ("discards", "tx", 1.0),
    "PortRcvErrors": ("errors", "rx", 1.0),
}
_EXTENDED_64 = ("PortXmitData", "PortRcvData", "PortXmitPkts", "PortRcvPkts")
#: Fields that are parts of another counter or not traffic: counted as skipped.
_NOT_USED = {"PortSelect": "header_field", "CounterSelect": "header_field", "CounterSelect2": "header_field"}


def sniff(head: bytes) -> bool:
    return _SNIFF.search(head) is not None


def spec_for(field: str, extended: bool) -> MetricSpec | None:
    """The spec of one perfquery field in a basic or extended block (None = not used)."""
    if field not in _FIELDS:
        return None
    metric, direction, scale = _FIELDS[field]
    bits = 64 if extended and field in _EXTENDED_64 else _BASIC_WIDTHS.get(field, 32)
    return MetricSpec(metric, direction, bits=bits, scale=scale, saturable=True,
                      device_factor=scale)


def parse(path: str | os.PathLike[str], sink: SourceSink, *, rank: int | None = None) -> ParseResult:
    where = os.fspath(path)
    stats = SourceStats()
    text = decode_text(read_bytes(where, stats, max_line_bytes=MAX_LINE_BYTES), where)
    buf = CounterBuffer(sink, NAME, stats)
    ts: int | None = None
    block: tuple[str, str, bool] | None = None
    blocks = untimed = 0
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        m = _HEADER.match(line)
        if m:
            lid, port = checked_int(m.group(2)), checked_int(m.group(3))
            if lid is None or port is None:  # beyond int64, or thousands of digits
                block = None
                stats.skip(out_of_range("lid" if lid is None else "port"))
                continue
            block = (f"lid:{lid}", str(port), bool(m.group(1)))
            blocks += 1
            untimed += ts is None
            continue
        stamp = time_line(line)
        if stamp is not None:
            ts = stamp
            continue
        if line.startswith("#"):
            continue
        f = _FIELD.match(line)
        if f is None:
            stats.skip("unrecognised_line")
            continue
        if block is None:
            stats.skip("field_outside_a_block")
            continue
        name, text_value = f.groups()
        spec = spec_for(name, block[2])
        if spec is None:
            stats.skip(_NOT_USED.get(name, "unused_metric"))
            continue
        try:
            value = int(text_value, 16) if text_value.lower().startswith("0x") else int(text_value)
        except ValueError:
            stats.skip("bad_value")
            continue
        if value.bit_length() > 64:  # counters are at most 64 bits wide
            stats.skip(out_of_range("value"))
            continue
        buf.add(ts, None, block[0], block[1], spec, value * spec.scale, name=name)
    if blocks == 0:
        raise InputError(where, "no `# Port counters:` block found")
    if untimed:
        stats.warnings.append(f"{untimed} block(s) with no time stamp line before them: stored untimed "
                              "(perfquery prints no time; put `date +%s.%N` before each call for rates)")
    return buf.result()


FORMAT = Format(name=NAME, description="perfquery -x", version=PARSER_VERSION, parse=parse,
                sniffs=(lambda head: sniff(head.data),))
