"""Metric families users have, mapped onto canonical `counters` metrics with their units and widths.

Prometheus-style names (snmp_exporter IF-MIB, node_exporter InfiniBand and netdev, treydock's
infiniband_exporter, NVIDIA dcgm-exporter, gnmic's Prometheus output) are looked up by name;
OpenConfig / SR OS paths (gnmic json and event output, and gnmic's Prometheus names, which are
the path with `/` and `-` turned into `_`) by their key-less path. Anything else is skipped with
a reason, never guessed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tracekit.parsers.telemetry._common import MetricSpec, first, strip_port

#: Skip reasons (the `skipped` keys of a telemetry source).
UNUSED = "unused_metric"
SUBSET = "subset_of_another_counter"
LEGACY = "legacy_duplicate"
UNDOCUMENTED = "unit_undocumented"

Identity = tuple[str | None, str, str, str | None]  # host, device, port, qualifier


@dataclass(frozen=True)
class Family:
    """A metric name's meaning: a spec (or a skip reason) and how labels name its port."""

    spec: MetricSpec | None
    identity: Callable[[dict[str, str], str | None], Identity] | None = None
    skip: str | None = None


def _host(labels: dict[str, str], fallback: str | None = None) -> str | None:
    """The host a sample is from: a hostname label, else the scrape `instance` without its port;
    `fallback` (the file's name) only where a device needs some name."""
    return first(labels, ("hostname", "Hostname", "nodename", "node", "host")) or \
        strip_port(labels.get("instance")) or fallback


def _snmp(labels: dict[str, str], fallback: str | None) -> Identity:
    host = first(labels, ("sysName",)) or _host(labels, fallback) or "switch"
    port = first(labels, ("ifName", "ifDescr", "ifIndex")) or "?"
    return host, host, port, None


def _node_ib(labels: dict[str, str], fallback: str | None) -> Identity:
    return _host(labels), labels.get("device") or "?", labels.get("port") or "?", None


def _netdev(labels: dict[str, str], fallback: str | None) -> Identity:
    host = _host(labels, fallback) or "host"
    return host, host, labels.get("device") or "?", None


def _ib_exporter(labels: dict[str, str], fallback: str | None) -> Identity:
    return None, first(labels, ("guid",)) or "?", labels.get("port") or "?", None


def _dcgm(labels: dict[str, str], fallback: str | None) -> Identity:
    host = _host(labels)
    gpu = first(labels, ("gpu",))
    device = f"gpu{gpu}" if gpu is not None else first(labels, ("nvswitch", "device", "UUID")) or "?"
    return host, device, "?", None


def _dcgm_nvlink(labels: dict[str, str], fallback: str | None) -> Identity:
    host, device, _, _ = _dcgm(labels, fallback)
    link = labels.get("nvlink")
    return host, device, f"nvlink{link}" if link is not None else "nvlink", None


def _dcgm_pcie(labels: dict[str, str], fallback: str | None) -> Identity:
    host, device, _, _ = _dcgm(labels, fallback)
    return host, device, "pcie", None


def _spec(metric: str, direction: str | None, **kw) -> MetricSpec:
    return MetricSpec(metric, direction, **kw)


_IF_MIB = {
    "ifHCInOctets": _spec("rx_bytes", "rx"), "ifHCOutOctets": _spec("tx_bytes", "tx"),
    "ifInOctets": _spec("rx_bytes", "rx", bits=32), "ifOutOctets": _spec("tx_bytes", "tx", bits=32),
    "ifInDiscards": _spec("discards", "rx", bits=32), "ifOutDiscards": _spec("discards", "tx", bits=32),
    "ifInErrors": _spec("errors", "rx", bits=32), "ifOutErrors": _spec("errors", "tx", bits=32),
    "ifHighSpeed": _spec("speed_bps", None, kind="gauge", bits=None, scale=1e6),
}
_IF_MIB_SUBSETS = ("ifHCInUcastPkts", "ifHCOutUcastPkts", "ifHCInMulticastPkts", "ifHCOutMulticastPkts",
                   "ifHCInBroadcastPkts", "ifHCOutBroadcastPkts", "ifInUcastPkts", "ifOutUcastPkts",
                   "ifInNUcastPkts", "ifOutNUcastPkts")

_IB = {"saturable": True}
_NODE_IB = {
    "node_infiniband_port_data_transmitted_bytes_total": _spec("tx_bytes", "tx", device_factor=4.0, **_IB),
    "node_infiniband_port_data_received_bytes_total": _spec("rx_bytes", "rx", device_factor=4.0, **_IB),
    "node_infiniband_port_packets_transmitted_total": _spec("tx_pkts", "tx", **_IB),
    "node_infiniband_port_packets_received_total": _spec("rx_pkts", "rx", **_IB),
    "node_infiniband_port_transmit_wait_total": _spec("xmit_wait", "tx", bits=32, **_IB),
    "node_infiniband_port_discards_transmitted_total": _spec("discards", "tx", bits=16, **_IB),
    "node_infiniband_port_discards_received_total": _spec("discards", "rx", bits=16, **_IB),
    "node_infiniband_port_errors_received_total": _spec("errors", "rx", bits=16, **_IB),
    "node_infiniband_rate_bytes_per_second": _spec("speed_bps", None, kind="gauge", bits=None, scale=8.0),
}
_NODE_IB_SUBSETS = ("node_infiniband_unicast_packets_transmitted_total",
                    "node_infiniband_unicast_packets_received_total",
                    "node_infiniband_multicast_packets_transmitted_total",
                    "node_infiniband_multicast_packets_received_total",
                    "node_infiniband_port_constraint_errors_transmitted_total",
                    "node_infiniband_port_constraint_errors_received_total")
_NETDEV = {
    "node_network_transmit_bytes_total": _spec("tx_bytes", "tx"),
    "node_network_receive_bytes_total": _spec("rx_bytes", "rx"),
    "node_network_transmit_packets_total": _spec("tx_pkts", "tx"),
    "node_network_receive_packets_total": _spec("rx_pkts", "rx"),
    "node_network_transmit_drop_total": _spec("discards", "tx"),
    "node_network_receive_drop_total": _spec("discards", "rx"),
    "node_network_transmit_errs_total": _spec("errors", "tx"),
    "node_network_receive_errs_total": _spec("errors", "rx"),
    "node_network_speed_bytes": _spec("speed_bps", None, kind="gauge", bits=None, scale=8.0),
}
_IB_EXPORTER_SUFFIX = {
    "port_transmit_data_bytes_total": _spec("tx_bytes", "tx", device_factor=4.0, **_IB),
    "port_receive_data_bytes_total": _spec("rx_bytes", "rx", device_factor=4.0, **_IB),
    "port_transmit_packets_total": _spec("tx_pkts", "tx", **_IB),
    "port_receive_packets_total": _spec("rx_pkts", "rx", **_IB),
    "port_transmit_wait_total": _spec("xmit_wait", "tx", **_IB),
    "port_transmit_discards_total": _spec("discards", "tx", bits=16, **_IB),
    "port_receive_errors_total": _spec("errors", "rx", bits=16, **_IB),
}
#: dcgm-exporter: PROF_* are bytes per second averaged over DCGM's sample period, exposed as
#: gauges. They are rates: integrated over a window, never differenced.
_DCGM = {
    "DCGM_FI_PROF_NVLINK_TX_BYTES": (_spec("tx_bytes", "tx", kind="rate", bits=None), _dcgm_nvlink),
    "DCGM_FI_PROF_NVLINK_RX_BYTES": (_spec("rx_bytes", "rx", kind="rate", bits=None), _dcgm_nvlink),
    "DCGM_FI_PROF_PCIE_TX_BYTES": (_spec("tx_bytes", "tx", kind="rate", bits=None), _dcgm_pcie),
    "DCGM_FI_PROF_PCIE_RX_BYTES": (_spec("rx_bytes", "rx", kind="rate", bits=None), _dcgm_pcie),
}
_DCGM_UNDOCUMENTED = ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_DEV_NVLINK_BANDWIDTH_L")


def prometheus_family(name: str) -> Family:
    """What a Prometheus metric name means (the name as exposed, `_total` included)."""
    if name in _IF_MIB:
        return Family(_IF_MIB[name], _snmp)
    if name in _NODE_IB:
        return Family(_NODE_IB[name], _node_ib)
    if name in _NETDEV:
        return Family(_NETDEV[name], _netdev)
    if name in _DCGM:
        spec, ident = _DCGM[name]
        return Family(spec, ident)
    if name in _IF_MIB_SUBSETS or name in _NODE_IB_SUBSETS:
        return Family(None, skip=SUBSET)
    if name.startswith("node_infiniband_legacy_"):
        return Family(None, skip=LEGACY)
    if name.startswith(_DCGM_UNDOCUMENTED):
        return Family(None, skip=UNDOCUMENTED)
    for prefix in ("infiniband_switch_", "infiniband_hca_"):
        if name.startswith(prefix) and name[len(prefix):] in _IB_EXPORTER_SUFFIX:
            return Family(_IB_EXPORTER_SUFFIX[name[len(prefix):]], _ib_exporter)
    path_spec = _underscore_path(name)
    if path_spec is not None:
        spec, where = path_spec
        if spec is None:
            return Family(None, skip=where)
        return Family(spec, _gnmic_identity(where))
    return Family(None, skip=UNUSED)


# --------------------------------------------------------------------------------------------
# OpenConfig and SR OS paths (gnmic)

_OC_COUNTERS = {
    "in-octets": _spec("rx_bytes", "rx"), "out-octets": _spec("tx_bytes", "tx"),
    "in-pkts": _spec("rx_pkts", "rx"), "out-pkts": _spec("tx_pkts", "tx"),
    "in-discards": _spec("discards", "rx"), "out-discards": _spec("discards", "tx"),
    "in-errors": _spec("errors", "rx"), "out-errors": _spec("errors", "tx"),
}
_OC_SUBSETS = ("in-unicast-pkts", "out-unicast-pkts", "in-multicast-pkts", "out-multicast-pkts",
               "in-broadcast-pkts", "out-broadcast-pkts", "in-fcs-errors")
_SROS_COUNTERS = {
    "in-octets": _spec("rx_bytes", "rx"), "out-octets": _spec("tx_bytes", "tx"),
    "in-packets": _spec("rx_pkts", "rx"), "out-packets": _spec("tx_pkts", "tx"),
    "in-discards": _spec("discards", "rx"), "out-discards": _spec("discards", "tx"),
    "in-errors": _spec("errors", "rx"), "out-errors": _spec("errors", "tx"),
}
_PAUSE = {"in-mac-pause-frames": _spec("pfc_pause", "rx"), "out-mac-pause-frames": _spec("pfc_pause", "tx")}
_ECN = {"ecn-marked-pkts": _spec("ecn_marked", "tx")}

#: (container path without keys, leaf table, where the port name comes from)
_CONTAINERS: tuple[tuple[str, dict[str, MetricSpec], str], ...] = (
    ("interfaces/interface/subinterfaces/subinterface/state/counters", _OC_COUNTERS, "subinterface"),
    ("interfaces/interface/state/counters", _OC_COUNTERS, "interface"),
    ("interfaces/interface/ethernet/state/counters", _PAUSE, "interface"),
    ("qos/interfaces/interface/output/queues/queue/state", _ECN, "queue"),
    ("state/port/statistics", _SROS_COUNTERS, "sros_port"),
    ("port/statistics", _SROS_COUNTERS, "sros_port"),
)


def path_elements(path: str) -> tuple[list[str], dict[str, dict[str, str]]]:
    """`/a/b[k=v]/c` -> (["a", "b", "c"], {"b": {"k": "v"}}); module prefixes (`oc-if:`) dropped."""
    elems: list[str] = []
    keys: dict[str, dict[str, str]] = {}
    i, n = 0, len(path)
    current = ""
    while i <= n:
        ch = path[i] if i < n else "/"
        if ch == "[":
            j = path.find("]", i)
            if j < 0:
                j = n
            k, _, v = path[i + 1:j].partition("=")
            name = current.rsplit(":", 1)[-1]
            keys.setdefault(name, {})[k.strip()] = v.strip().strip("'\"")
            i = j + 1
            continue
        if ch == "/":
            if current:
                elems.append(current.rsplit(":", 1)[-1])
            current = ""
        else:
            current += ch
        i += 1
    return elems, keys


def classify_path(elems: list[str]) -> tuple[MetricSpec | None, str]:
    """(spec, port source) for a key-less path, or (None, skip reason)."""
    joined = "/".join(elems)
    for container, leaves, where in _CONTAINERS:
        prefix, _, leaf = joined.rpartition("/")
        if prefix == container or prefix.endswith("/" + container):
            if leaf in leaves:
                return leaves[leaf], where
            if leaf in _OC_SUBSETS:
                return None, SUBSET
            return None, UNUSED
    return None, UNUSED


def port_from_keys(where: str, keys: dict[str, dict[str, str]]) -> tuple[str | None, str | None]:
    """(port, qualifier) for a path's keys (gnmic json)."""
    if where == "sros_port":
        return first(keys.get("port", {}), ("port-id",)), None
    if where == "queue":
        iface = first(keys.get("interface", {}), ("interface-id", "name"))
        return iface, first(keys.get("queue", {}), ("name",))
    iface = first(keys.get("interface", {}), ("name",))
    if where == "subinterface" and iface is not None:
        return f"{iface}.{first(keys.get('subinterface', {}), ('index',)) or '0'}", None
    return iface, None


def port_from_tags(where: str, tags: dict[str, str]) -> tuple[str | None, str | None]:
    """(port, qualifier) for gnmic event tags / Prometheus labels (`<elem>_<key>`, `-` or `_`)."""
    def tag(*names: str) -> str | None:
        return first(tags, [v for n in names for v in (n, n.replace("-", "_"))])

    if where == "sros_port":
        return tag("port_port-id"), None
    if where == "queue":
        return tag("interface_interface-id", "interface_name"), tag("queue_name")
    iface = tag("interface_name")
    if where == "subinterface" and iface is not None:
        return f"{iface}.{tag('subinterface_index') or '0'}", None
    return iface, None


_UNDERSCORE: dict[str, tuple[MetricSpec, str]] = {}
for _container, _leaves, _where in _CONTAINERS:
    for _leaf, _s in _leaves.items():
        _UNDERSCORE[(_container + "/" + _leaf).replace("/", "_").replace("-", "_")] = (_s, _where)
_UNDERSCORE_SUBSETS = tuple((c + "/" + leaf).replace("/", "_").replace("-", "_")
                            for c, _, _ in _CONTAINERS[:2] for leaf in _OC_SUBSETS)


def _underscore_path(name: str) -> tuple[MetricSpec | None, str] | None:
    """gnmic's Prometheus output names a metric `<prefix>_<subscription>_<path with _>`."""
    best = None
    for suffix, value in _UNDERSCORE.items():
        if name.endswith("_" + suffix) and (best is None or len(suffix) > len(best[0])):
            best = (suffix, value)
    if best is not None:
        return best[1]
    if name.endswith(_UNDERSCORE_SUBSETS):
        return None, SUBSET
    return None


def _gnmic_identity(where: str) -> Callable[[dict[str, str], str | None], Identity]:
    def ident(labels: dict[str, str], fallback: str | None) -> Identity:
        host = strip_port(first(labels, ("source", "target"))) or _host(labels, fallback) or "switch"
        port, qualifier = port_from_tags(where, labels)
        return host, host, port or "?", qualifier
    return ident
