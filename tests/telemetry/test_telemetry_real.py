"""Every shared telemetry sample parses; sample counts are checked by an independent scan of the
file (regexes here, not the parser's own accounting), and values against a second real file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from telemetry_helpers import parse_file, rows

from tracekit.parsers import detect

#: node_exporter InfiniBand metrics that carry link traffic, written out by hand.
NODE_IB_USED = {
    "node_infiniband_port_data_transmitted_bytes_total", "node_infiniband_port_data_received_bytes_total",
    "node_infiniband_port_packets_transmitted_total", "node_infiniband_port_packets_received_total",
    "node_infiniband_port_transmit_wait_total", "node_infiniband_port_discards_transmitted_total",
    "node_infiniband_port_discards_received_total", "node_infiniband_port_errors_received_total",
    "node_infiniband_rate_bytes_per_second",
}


def _ttar_values(path: Path) -> dict[str, str]:
    """sysfs file -> content from node_exporter's ttar fixture format."""
    text = path.read_text()
    return dict(re.findall(r"^Path: (\S+)\nLines: 1\n(.*)$", text, re.M))


def test_node_exporter_infiniband(real, tmp_path):
    path = real / "prometheus" / "node_exporter_infiniband.prom"
    text = path.read_text()
    samples = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    used = [ln for ln in samples if ln.split("{")[0] in NODE_IB_USED]
    got = parse_file(path, tmp_path)
    assert got.fmt == "prometheus"
    assert got.result.stats.read == len(samples) == 51
    assert got.result.stats.stored == len(used) == 13
    assert got.counters.num_rows == 13
    assert got.result.stats.skipped["legacy_duplicate"] == sum("_legacy_" in ln for ln in samples)
    # bytes already x4 in node_exporter: the same number as sysfs port_xmit_data (words) x 4
    sysfs = _ttar_values(real / "infiniband" / "sysfs_mlx4_0_port1_counters.ttar")
    words = int(sysfs["sys/class/infiniband/mlx4_0/ports/1/counters/port_xmit_data"])
    (tx,) = rows(got.counters, device="mlx4_0", port="1", metric="tx_bytes")
    assert tx["value"] == words * 4 == 14_933_760
    assert tx["ts_ns"] is None
    (wait,) = rows(got.counters, device="mlx4_0", port="1", metric="xmit_wait")
    assert wait["value"] == 2**32 - 1 and wait["saturated"] is True
    (speed,) = rows(got.counters, device="mlx4_0", port="1", metric="speed_bps")
    assert speed["value"] == 40e9 and speed["kind"] == "gauge"
    assert any("saturation ceiling" in w for w in got.result.stats.warnings)
    assert any("no time stamp" in w for w in got.result.stats.warnings)


def test_query_range_matrix(real, tmp_path):
    path = real / "prometheus" / "query_range_matrix_example.json"
    pairs = re.findall(r"\[\s*[\d.]+\s*,\s*\"", path.read_text())
    got = parse_file(path, tmp_path)
    assert got.fmt == "prometheus_json"
    assert got.result.stats.read == len(pairs) == 6
    assert got.result.stats.skipped == {"unused_metric": 6}  # `up` is not a link metric


@pytest.mark.parametrize("name", ["gnmic_json_format_sros_port_stats.pretty.txt",
                                  "gnmic_json_format_sros_port_stats.jsonl"])
def test_gnmic_json(real, tmp_path, name):
    path = real / "gnmi" / name
    text = path.read_text()
    leaves = re.findall(r'"values"\s*:\s*\{\s*"([^"]+)"', text)
    counters = re.findall(r'"(in|out)-octets"\s*:\s*"(\d+)"', text)
    got = parse_file(path, tmp_path)
    assert got.fmt == "gnmic"
    assert got.result.stats.read == len(leaves) == 4
    assert got.result.stats.stored == len(counters) == 2
    (rx,) = rows(got.counters, metric="rx_bytes")
    assert rx["value"] == 671552 and rx["device"] == "router1.lab.com" and rx["port"] == "1/1/c1/1"
    assert rx["ts_ns"] == 1594065873938155916
    (tx,) = rows(got.counters, metric="tx_bytes")
    assert tx["value"] == 370930 and tx["ts_ns"] == 1594065873938043848


def test_gnmic_event(real, tmp_path):
    path = real / "gnmi" / "gnmic_event_format_interface_counters.json"
    text = path.read_text()
    values = re.findall(r'"(/[^"]+)"\s*:', text)
    got = parse_file(path, tmp_path)
    assert got.result.stats.read == len(values) == 3
    assert got.result.stats.stored == sum(v.endswith("octets") for v in values) == 2
    (rx,) = rows(got.counters, metric="rx_bytes")
    assert (rx["device"], rx["port"], rx["value"], rx["ts_ns"]) == ("leaf1", "Ethernet1", 100.0, 1)


@pytest.mark.parametrize("name, blocks", [("perfquery_x_switch_0x7cfe9003009ce5b0.txt", 2),
                                          ("perfquery_x_hca_0x7cfe9003003b4bde.txt", 1)])
def test_perfquery(real, tmp_path, name, blocks):
    path = real / "infiniband" / name
    text = path.read_text()
    fields = re.findall(r"^(\w+):\.+(\S+)$", text, re.M)
    headers = re.findall(r"^# Port extended counters: Lid (\d+) port (\d+)", text, re.M)
    got = parse_file(path, tmp_path)
    assert got.fmt == "perfquery"
    assert len(headers) == blocks
    assert got.result.stats.read == len(fields)
    assert got.result.stats.stored == 7 * blocks
    values = dict(fields[:25])
    lid, port = headers[0]
    (tx,) = rows(got.counters, device=f"lid:{lid}", port=port, metric="tx_bytes")
    assert tx["value"] == int(values["PortXmitData"]) * 4  # 4-byte words
    assert tx["bits"] == 64
    (wait,) = rows(got.counters, device=f"lid:{lid}", port=port, metric="xmit_wait")
    assert wait["value"] == int(values["PortXmitWait"]) and wait["saturated"] is False


def test_ufm_telemetry(real, tmp_path):
    path = real / "infiniband" / "ufm_telemetry_tfs_small.json"
    text = path.read_text()
    counters = re.findall(r'"((?:Infiniband|hist)\w+)"\s*:', text)
    records = re.findall(r'"port_num"\s*:', text)
    got = parse_file(path, tmp_path)
    assert got.fmt == "ufm_telemetry"
    assert got.result.stats.read == len(counters) == 150
    # MBOut/MBIn labelled `Gb` would be ~10^8 bytes per packet: refused, not guessed
    assert got.result.stats.skipped["implausible_unit"] == 2 * len(records) == 12
    assert got.result.stats.stored == 5 * len(records)
    assert not rows(got.counters, metric="tx_bytes")
    first = re.search(r'"node_guid": "(0x[0-9a-f]+)",\s*"port_guid": "[^"]+",\s*"port_num": (\d+),\s*'
                      r'"Infiniband_MBOut_u_Gb": \d+,\s*"Infiniband_MBIn_u_Gb": \d+,\s*'
                      r'"Infiniband_PckOut_u_Packets": (\d+)', text)
    (pkts,) = rows(got.counters, device=first.group(1), port=first.group(2), metric="tx_pkts")
    assert pkts["value"] == int(first.group(3))
    assert pkts["ts_ns"] == 1709652347161873 * 1000  # µs


def test_ibnetdiscover_ports_report(real, tmp_path):
    path = real / "infiniband" / "ibnetdiscover_p_links.txt"
    text = path.read_text()
    linked = re.findall(r"^(CA|SW)\s+\d+\s+(\d+)\s+(0x\w+)\s+\d+x \w+ - (CA|SW)\s+\d+\s+(\d+)\s+(0x\w+)", text, re.M)
    cables = {frozenset({(a[2], a[1]), (a[5], a[4])}) for a in linked}
    lines = re.findall(r"^(CA|SW) ", text, re.M)
    got = parse_file(path, tmp_path)
    assert got.fmt == "ibnetdiscover"
    assert got.result.stats.read == len(lines) == 9
    assert got.links.num_rows == len(cables) == 4
    assert got.result.stats.skipped == {"other_end_of_a_stored_link": len(linked) - len(cables),
                                        "unconnected_port": len(lines) - len(linked)}
    nodes = {r["node"]: r for r in got.nodes.to_pylist()}
    assert nodes["o0001/HCA-1"]["kind"] == "nic" and nodes["o0001/HCA-1"]["host"] == "o0001"
    assert nodes["o0001/HCA-1"]["lid"] == 134
    assert nodes["ib-i1l1s01"]["kind"] == "leaf"      # has hosts' HCAs
    assert nodes["ib-i1l2s01"]["kind"] == "spine"     # one hop above a leaf, no HCA
    assert nodes["ib-i7l2s01"]["kind"] == "switch"    # no cable: the graph cannot place it
    link = rows(got.links, src="o0001/HCA-1")[0]
    assert link["link"] == "o0001/HCA-1:1--ib-i1l1s01:10"
    assert (link["gbps"], link["tier"], link["medium"], link["network"]) == (100.0, "nic-leaf", "ib", "backend")
    assert rows(got.links, src="ib-i1l1s01", dst="ib-i1l2s01")[0]["tier"] == "leaf-spine"


def test_ibnetdiscover_hdr_with_sharp_node(real, tmp_path):
    path = real / "infiniband" / "ibnetdiscover_p_links_hdr.txt"
    text = path.read_text()
    lines = re.findall(r"^(CA|SW) ", text, re.M)
    got = parse_file(path, tmp_path)
    assert got.result.stats.read == len(lines) == 6
    assert got.result.stats.skipped["conflicting_cable"] == 1  # the fixture cables one CA port twice
    assert got.result.stats.skipped["unconnected_port"] == 3
    nodes = {r["node"]: r for r in got.nodes.to_pylist()}
    assert nodes["5FB0405-leaf-IB01"]["kind"] == "leaf"  # worker20's HCA hangs off it
    assert nodes["worker20/mlx5_3"]["host"] == "worker20"
    assert nodes["5FB0406-spine-IB02"]["kind"] == "spine"  # no cable: named by its description
    assert nodes["Mellanox Technologies Aggregation Node"]["host"] is None
    assert {r["gbps"] for r in got.links.to_pylist()} == {200.0}  # 4x HDR


def test_sysfs_dump_from_the_ttar_fixture(real, tmp_path):
    """The ttar fixture turned into what `grep -H . /sys/class/infiniband/...` prints."""
    values = _ttar_values(real / "infiniband" / "sysfs_mlx4_0_port1_counters.ttar")
    dump = tmp_path / "sysfs.txt"
    dump.write_text("1700000000\n" + "".join(f"/{p}:{v}\n" for p, v in values.items()))
    got = parse_file(dump, tmp_path / "out")
    assert got.fmt == "sysfs_ib"
    assert got.result.stats.read == len(values)
    (tx,) = rows(got.counters, metric="tx_bytes")
    assert tx["value"] == int(values["sys/class/infiniband/mlx4_0/ports/1/counters_ext/port_xmit_data_64"]) * 4
    assert tx["ts_ns"] == 1_700_000_000 * 10**9
    assert got.result.stats.skipped["legacy_duplicate"] >= 2  # counters/ and counters_ext/ both give data
    (wait,) = rows(got.counters, metric="xmit_wait")
    assert wait["saturated"] is True
    (speed,) = rows(got.counters, metric="speed_bps")
    assert speed["value"] == 40e9  # "40 Gb/sec (4X QDR)"


def test_not_telemetry_samples_are_not_claimed(real):
    """The dcgm-exporter counter list is a configuration (field, type, help), not samples; the
    sFlow text and the ttar fixture are formats tracekit does not read."""
    for rel in ("dcgm/dcgm_exporter_default-counters.csv", "sflow/sflowtool_pretty_example.txt",
                "sflow/sflowtool_line_mode_example.csv", "infiniband/sysfs_mlx4_0_port1_counters.ttar"):
        assert detect.detect_format(real / rel) is None, rel


def test_whole_directory_ingests(real, tmp_path):
    from tracekit.ingest import ingest
    from tracekit.store import Run

    report = ingest([real], tmp_path / "run")
    assert not report.failed
    formats = sorted({s.format for s in report.ingested})
    assert formats == ["gnmic", "ibnetdiscover", "perfquery", "prometheus", "prometheus_json", "ufm_telemetry"]
    for s in report.ingested:
        assert s.read == s.stored + sum(s.skipped.values())
    run = Run(tmp_path / "run")
    assert run.table("counters").num_rows == sum(s.stored for s in report.ingested
                                                 if s.format not in ("ibnetdiscover",))
    assert run.table("topology_links").num_rows == 6
    assert run.manifest.ranks == []
