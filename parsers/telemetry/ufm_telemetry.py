"""NVIDIA UFM Telemetry records (the TFS/fluentd stream, or a list / JSON lines of port records).

One object per port: `timestamp` (µs since the epoch), `node_guid`, `port_guid`, `port_num`, then
counters. Two naming schemes are read:

* TFS names, `Infiniband_<Name>_u_<unit>` (`_f_` marks a float): packets, errors, `XmitWait`
  (ticks), and `MBOut`/`MBIn`, the data counters. Their unit label is taken at face value only
  when it is plausible: bytes per packet (data / packets of the same record) must stay within an
  InfiniBand packet (<= 4,224 B). The label `Gb` on the TFS sample fails that check by a factor
  of about 10^8, so such values are skipped (`implausible_unit`) with a warning, not guessed.
* UFM Telemetry CSV names (`PortXmitDataExtended`, `PortRcvDataExtended`, `PortXmitPktsExtended`,
  ...): IB PortCountersExtended, data in 4-byte words (x4 here).

A record in delta mode carries only the counters that changed; absent counters are not samples.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from typing import Any

import msgspec

from tracekit.errors import InputError
from tracekit.parsers._json_keys import warn_repeated_keys
from tracekit.parsers.registry import Format
from tracekit.parsers.telemetry._common import CounterBuffer, MetricSpec, decode_text, epoch_to_ns, read_bytes
from tracekit.store import ParseResult, SourceSink, SourceStats

NAME = "ufm_telemetry"
PARSER_VERSION = "1"
MAX_BYTES_PER_PACKET = 4224
_TFS = re.compile(r"^Infiniband_([A-Za-z0-9]+?)(?:_f)?_u_([A-Za-z]+)$")
_SNIFF = re.compile(rb'"(Infiniband_[A-Za-z]+_u_|Port(Xmit|Rcv)DataExtended)')
#: TFS counter name -> (metric, direction)
_TFS_COUNTERS = {
    "MBOut": ("tx_bytes", "tx"), "MBIn": ("rx_bytes", "rx"),
    "PckOut": ("tx_pkts", "tx"), "PckIn": ("rx_pkts", "rx"),
    "XmitWait": ("xmit_wait", "tx"), "XmtDiscards": ("discards", "tx"), "RcvErrors": ("errors", "rx"),
}
_DATA_UNITS = {"B": 1.0, "Bytes": 1.0, "Byte": 1.0, "KB": 1e3, "MB": 1e6, "GB": 1e9,
               "Kb": 125.0, "Mb": 1.25e5, "Gb": 1.25e8, "Words": 4.0}
_CSV_COUNTERS = {
    "PortXmitDataExtended": ("tx_bytes", "tx", 4.0), "PortRcvDataExtended": ("rx_bytes", "rx", 4.0),
    "PortXmitPktsExtended": ("tx_pkts", "tx", 1.0), "PortRcvPktsExtended": ("rx_pkts", "rx", 1.0),
    "PortXmitWaitExtended": ("xmit_wait", "tx", 1.0), "PortXmitWait": ("xmit_wait", "tx", 1.0),
    "PortXmitDiscards": ("discards", "tx", 1.0), "PortRcvErrors": ("errors", "rx", 1.0),
}
_IDENTITY = {"timestamp", "source_id", "tag", "node_guid", "port_guid", "port_num", "sys_image_guid",
             "aport", "node_description", "m_label", "port_label", "status_message", "Port_Number",
             "Node_GUID", "Device_ID", "device_id", "port_type"}


def sniff(head: bytes) -> bool:
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    return text[:1] in (b"{", b"[") and b'"port_num"' in head and _SNIFF.search(head) is not None


def _records(text: str, where: str) -> list[Any]:
    try:
        doc = msgspec.json.decode(text)
    except (msgspec.DecodeError, RecursionError):
        try:
            return [msgspec.json.decode(line) for line in text.splitlines() if line.strip()]
        except (msgspec.DecodeError, RecursionError) as exc:
            raise InputError(where, f"not valid JSON or JSON lines ({exc})") from exc
    if isinstance(doc, dict) and isinstance(doc.get("values"), list):
        return doc["values"]
    if isinstance(doc, list):
        return doc
    if isinstance(doc, dict):
        return [doc]
    raise InputError(where, "not UFM telemetry (top level is neither an object nor a list)")


def parse(path: str | os.PathLike[str], sink: SourceSink, *, rank: int | None = None) -> ParseResult:
    where = os.fspath(path)
    stats = SourceStats()
    text = decode_text(read_bytes(where, stats), where)
    records = _records(text, where)
    warn_repeated_keys(text, stats.warnings)
    buf = CounterBuffer(sink, NAME, stats)
    implausible: Counter[str] = Counter()
    for rec in records:
        if not isinstance(rec, dict):
            stats.skip("not_a_record")
            continue
        _record(rec, buf, stats, implausible)
    for key, n in sorted(implausible.items()):
        stats.warnings.append(f"{key}: the unit label is implausible ({n} record(s): more bytes per packet "
                              f"than an InfiniBand packet holds); skipped, not guessed")
    return buf.result()


def _record(rec: dict[str, Any], buf: CounterBuffer, stats: SourceStats, implausible: Counter[str]) -> None:
    counters = {k: v for k, v in rec.items() if k not in _IDENTITY}
    device = rec.get("node_guid") or rec.get("Node_GUID") or rec.get("source_id")
    port = rec.get("port_num", rec.get("Port_Number"))
    ts = rec.get("timestamp")
    if device is None or port is None or isinstance(ts, bool) or not isinstance(ts, (int, float, str)):
        stats.skip("record_without_port_or_time", max(1, len(counters)))
        return
    try:
        ts_ns = epoch_to_ns(str(ts))
    except ValueError:
        stats.skip("record_without_port_or_time", max(1, len(counters)))
        return
    device, port = str(device), str(port)
    packets = {"tx": _number(rec.get("Infiniband_PckOut_u_Packets")),
               "rx": _number(rec.get("Infiniband_PckIn_u_Packets"))}
    for key, raw in counters.items():
        value = _number(raw)
        if value is None:
            stats.skip("bad_value")
            continue
        spec, reason = _spec(key)
        if spec is None:
            stats.skip(reason)
            continue
        if spec.metric in ("tx_bytes", "rx_bytes") and key.startswith("Infiniband_") and spec.scale != 1.0:
            pkts = packets[spec.direction or "tx"]
            if not pkts:
                stats.skip("unit_unchecked")
                continue
            if value * spec.scale / pkts > MAX_BYTES_PER_PACKET:
                implausible[key] += 1
                stats.skip("implausible_unit")
                continue
        buf.add(ts_ns, None, device, port, spec, value * spec.scale, name=key)


def _spec(key: str) -> tuple[MetricSpec | None, str]:
    """The spec of a record key, or (None, skip reason)."""
    if key in _CSV_COUNTERS:
        metric, direction, scale = _CSV_COUNTERS[key]
        return MetricSpec(metric, direction, bits=64, scale=scale, saturable=True, device_factor=scale), ""
    m = _TFS.match(key)
    if m is None or m.group(1) not in _TFS_COUNTERS:
        return None, "unused_metric"
    metric, direction = _TFS_COUNTERS[m.group(1)]
    if metric in ("tx_bytes", "rx_bytes"):
        scale = _DATA_UNITS.get(m.group(2))
        if scale is None:
            return None, "unknown_unit"
        return MetricSpec(metric, direction, bits=64, scale=scale), ""
    return MetricSpec(metric, direction, bits=64), ""


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if number == number else None


FORMAT = Format(name=NAME, description="UFM telemetry JSON", version=PARSER_VERSION, parse=parse,
                sniffs=(lambda head: sniff(head.data),))
