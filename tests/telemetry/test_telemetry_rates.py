"""Rates from constructed inputs with answers worked out by hand: wraps, resets, saturation,
4-byte words, gauges, rates (DCGM), duplicates, gaps, scrape snapping and link identity."""

from __future__ import annotations

import pyarrow as pa
import pytest
from telemetry_helpers import T0_MS, T0_NS, parse_file, prom_line, rows

from tracekit import schema
from tracekit.telemetry import oriented, rate_counters

S = 1_000_000_000
PORT = {"instance": "leaf1:9116", "ifName": "Ethernet7"}


def _rates_of(tmp_path, text: str, name: str = "in.prom", **kw):
    path = tmp_path / name
    path.write_text(text)
    got = parse_file(path, tmp_path / "parsed")
    return got, rate_counters(got.counters, got.nodes, got.links, **kw)


def _windows(rates) -> list[dict]:
    return rates.link_samples.to_pylist()


def test_32bit_wrap_inside_one_window_gives_the_exact_rate(tmp_path):
    # 10 Gb/s: a Counter32 of octets wraps in 2^32 / 1.25e9 B/s = 3.44 s; the window is 1 s.
    text = "\n".join([
        prom_line("ifHighSpeed", PORT, 10_000, T0_MS),
        prom_line("ifOutOctets", PORT, 4_294_967_000, T0_MS),
        prom_line("ifOutOctets", PORT, 1_000, T0_MS + 1_000),
    ]) + "\n"
    _, rates = _rates_of(tmp_path, text)
    (w,) = _windows(rates)
    assert w["tx_bytes"] == 1_000 + 2**32 - 4_294_967_000 == 1_296
    assert w["tx_util"] == pytest.approx(1_296 * 8 / 10e9)
    assert w["flags"] == ["wrapped"] and w["flag_detail"] == ["tx_bytes:wrapped"]
    assert (w["ts_ns"], w["interval_ns"]) == (T0_NS, S)
    assert w["speed_bps"] == 10e9 and w["link"] == "leaf1:Ethernet7"


def test_32bit_window_longer_than_the_wrap_time_is_flagged_not_rated(tmp_path):
    # 10 s windows at 10 Gb/s: any number of wraps may hide in them, even when the value grew.
    text = "\n".join([prom_line("ifHighSpeed", PORT, 10_000, T0_MS)] + [
        prom_line("ifOutOctets", PORT, v, T0_MS + k * 10_000) for k, v in enumerate((100, 5_000, 2_000))
    ]) + "\n"
    _, rates = _rates_of(tmp_path, text)
    ws = _windows(rates)
    assert [w["tx_bytes"] for w in ws] == [None, None]
    assert all(w["flag_detail"] == ["tx_bytes:wrap_ambiguous"] for w in ws)


def test_32bit_counter_without_a_speed_is_ambiguous(tmp_path):
    text = "\n".join(prom_line("ifInOctets", PORT, v, T0_MS + k * 1000) for k, v in enumerate((10, 20))) + "\n"
    _, rates = _rates_of(tmp_path, text)
    (w,) = _windows(rates)
    assert w["rx_bytes"] is None and w["flag_detail"] == ["rx_bytes:wrap_ambiguous"]


def test_64bit_reset_is_flagged_and_not_counted_as_traffic(tmp_path):
    values = (1_000, 11_000, 500, 2_500)  # cleared between the 2nd and 3rd scrape
    text = "\n".join(prom_line("ifHCOutOctets", PORT, v, T0_MS + k * 10_000) for k, v in enumerate(values)) + "\n"
    _, rates = _rates_of(tmp_path, text)
    ws = _windows(rates)
    assert [w["tx_bytes"] for w in ws] == [10_000, None, 2_000]
    assert ws[1]["flags"] == ["reset"] and ws[1]["flag_detail"] == ["tx_bytes:reset"]
    assert sum(w["tx_bytes"] or 0 for w in ws) == 12_000
    assert rates.stats.flagged == {"reset": 1}


def _perfquery_block(lid: int, port: int, fields: dict[str, int], *, extended: bool) -> str:
    head = f"# Port {'extended ' if extended else ''}counters: Lid {lid} port {port} (CapMask: 0x5300)"
    return head + "\n" + "".join(f"{k}:{'.' * (33 - len(k))}{v}\n" for k, v in fields.items())


def test_saturated_ib_counter_is_flagged(tmp_path):
    # Basic PortCounters: 32-bit data counters stick at 2^32-1 (they never wrap).
    blocks = []
    for k, words in enumerate((4_000_000_000, 4_294_967_295, 4_294_967_295)):
        blocks.append(f"{1_760_000_000 + 10 * k}\n" + _perfquery_block(
            134, 1, {"PortXmitData": words, "PortRcvData": 1_000 * (k + 1), "PortXmitWait": 7}, extended=False))
    got, rates = _rates_of(tmp_path, "".join(blocks), "pq.txt")
    assert [r["saturated"] for r in rows(got.counters, metric="tx_bytes")] == [False, True, True]
    ws = _windows(rates)
    assert [w["tx_bytes"] for w in ws] == [None, None]
    assert [w["rx_bytes"] for w in ws] == [4_000, 4_000]  # words x4, the other counter is fine
    assert all("tx_bytes:saturated" in w["flag_detail"] for w in ws)
    assert all(w["xmit_wait"] == 0 for w in ws)


def test_ib_words_times_four_give_bytes(tmp_path):
    blocks = "".join(f"# ts: {1_760_000_000 + 5 * k}\n" + _perfquery_block(
        1719, 2, {"PortXmitData": 1_000 + 250 * k, "PortRcvData": 7}, extended=True) for k in range(2))
    _, rates = _rates_of(tmp_path, blocks, "pq.txt")
    (w,) = _windows(rates)
    assert w["tx_bytes"] == 250 * 4 and w["rx_bytes"] == 0
    assert w["interval_ns"] == 5 * S and (w["device"], w["port"]) == ("lid:1719", "2")


def _counters(rows_: list[tuple]) -> pa.Table:
    cols = ("ts_ns", "host", "device", "port", "metric", "direction", "value", "kind", "bits", "saturated",
            "saturable", "qualifier")
    data = {c: [r[i] if i < len(r) else None for r in rows_] for i, c in enumerate(cols)}
    data["saturated"] = [bool(v) for v in data["saturated"]]
    data["saturable"] = [bool(v) for v in data["saturable"]]
    return schema.conform("counters", data)


def test_gauges_are_never_rated():
    t = _counters([(T0_NS + k * S, "h", "gpu0", "nvlink0", "tx_bytes", "tx", 100.0 * (k + 1), "gauge", None)
                   for k in range(3)])
    res = rate_counters(t)
    assert res.link_samples.num_rows == 0
    assert res.stats.skipped == {"gauge_not_rated": 3} and res.stats.balanced


def test_rate_gauges_are_integrated_not_differenced():
    # DCGM PROF_NVLINK_TX_BYTES: bytes/s averaged over the period, exposed as a gauge.
    t = _counters([(T0_NS + k * 10 * S, "h", "gpu0", "nvlink0", "tx_bytes", "tx", v, "rate", None)
                   for k, v in enumerate((5e9, 1e9, 3e9))])
    ws = rate_counters(t).link_samples.to_pylist()
    assert [w["tx_bytes"] for w in ws] == [1e10, 3e10]  # value at the window's end x 10 s


def test_duplicates_are_dropped_and_counted():
    base = [(T0_NS + k * 10 * S, "", "sw", "p1", "tx_bytes", "tx", 1e6 * k, "counter", 64) for k in range(3)]
    res = rate_counters(_counters([*base, base[1]]))
    assert [w["tx_bytes"] for w in res.link_samples.to_pylist()] == [1e6, 1e6]
    assert res.stats.skipped == {"duplicate": 1} and res.stats.balanced


def test_a_missed_scrape_is_a_gap_with_its_bytes_kept():
    times = (0, 10, 20, 40, 50)  # the scrape at 30 s is missing
    t = _counters([(T0_NS + s * S, "", "sw", "p1", "tx_bytes", "tx", 1e3 * s, "counter", 64) for s in times])
    ws = rate_counters(t).link_samples.to_pylist()
    assert [w["interval_ns"] // S for w in ws] == [10, 10, 20, 10]
    assert [w["flags"] for w in ws] == [[], [], ["gap"], []]
    assert [w["tx_bytes"] for w in ws] == [1e4, 1e4, 2e4, 1e4]


def test_a_series_missing_one_scrape_voids_it_in_the_two_windows():
    tx = [(T0_NS + s * S, "", "sw", "p1", "tx_bytes", "tx", 1e3 * s, "counter", 64) for s in (0, 10, 20, 30)]
    rx = [(T0_NS + s * S, "", "sw", "p1", "rx_bytes", "rx", 2e3 * s, "counter", 64) for s in (0, 10, 30)]
    ws = rate_counters(_counters(tx + rx)).link_samples.to_pylist()
    assert [w["tx_bytes"] for w in ws] == [1e4, 1e4, 1e4]
    assert [w["rx_bytes"] for w in ws] == [2e4, None, None]
    assert ws[2]["flag_detail"] == ["rx_bytes:gap"]


def test_leaves_stamped_apart_are_one_scrape(tmp_path):
    # gnmic stamps every leaf on its own: in/out octets of one sample interval differ by ~100 us.
    events = []
    for k in range(3):
        for leaf, v, jitter in (("in-octets", 1_000 * k, 0), ("out-octets", 3_000 * k, 112_068)):
            events.append(f'{{"name": "s", "timestamp": {T0_NS + k * 10 * S + jitter}, '
                          f'"tags": {{"source": "leaf1:6030", "interface_name": "Ethernet1"}}, '
                          f'"values": {{"/interfaces/interface/state/counters/{leaf}": "{v}"}}}}')
    _, rates = _rates_of(tmp_path, "[" + ",\n".join(events) + "]", "ev.json")
    ws = _windows(rates)
    assert [(w["tx_bytes"], w["rx_bytes"]) for w in ws] == [(3_000, 1_000), (3_000, 1_000)]
    assert [w["interval_ns"] for w in ws] == [10 * S, 10 * S]


def test_per_queue_ecn_marks_are_summed(tmp_path):
    lines = []
    for k in range(2):
        for q, v in (("q3", 10 * k), ("q4", 5 * k)):
            labels = {"source": "leaf2", "interface_name": "Ethernet9", "queue_name": q}
            lines.append(prom_line("gnmic_qos_qos_interfaces_interface_output_queues_queue_state_ecn_marked_pkts",
                                   labels, v, T0_MS + 10_000 * k))
        lines.append(prom_line("gnmic_eth_interfaces_interface_ethernet_state_counters_in_mac_pause_frames",
                               {"source": "leaf2", "interface_name": "Ethernet9"}, 7 * k, T0_MS + 10_000 * k))
    _, rates = _rates_of(tmp_path, "\n".join(lines) + "\n")
    (w,) = _windows(rates)
    assert (w["ecn_marked"], w["rx_pause"], w["tx_pause"]) == (15, 7, None)



def test_one_reset_queue_voids_the_window_s_ecn_sum(tmp_path):
    """A metric summed over queues is all or nothing: when one queue resets in a window, the
    window's ECN count is null (not the other queue's part) and says why."""
    lines = []
    for k, (q3, q4) in enumerate(((0, 0), (10, 5), (2, 12))):  # q3 resets in the second window
        for q, v in (("q3", q3), ("q4", q4)):
            labels = {"source": "leaf2", "interface_name": "Ethernet9", "queue_name": q}
            lines.append(prom_line("gnmic_qos_qos_interfaces_interface_output_queues_queue_state_ecn_marked_pkts",
                                   labels, v, T0_MS + 10_000 * k))
    _, rates = _rates_of(tmp_path, "\n".join(lines) + "\n")
    first, second = _windows(rates)
    assert first["ecn_marked"] == 15 and first["flags"] == []
    assert second["ecn_marked"] is None and second["flag_detail"] == ["ecn_marked:reset"]

IBNET = """\
CA   134  1 0x7cfe9003003b4bde 4x EDR - SW  1719 10 0x7cfe9003009ce5b0 ( 'o0001 HCA-1' - 'ib-i1l1s01' )
SW  1719 10 0x7cfe9003009ce5b0 4x EDR - CA   134  1 0x7cfe9003003b4bde ( 'ib-i1l1s01' - 'o0001 HCA-1' )
SW  1719  1 0x7cfe9003009ce5b0 4x EDR - SW  1516  1 0x7cfe900300b07320 ( 'ib-i1l1s01' - 'ib-i1l2s01' )
"""


def test_ports_map_to_ibnetdiscover_links_by_lid_name_and_guid(tmp_path):
    from tracekit.ingest import ingest
    from tracekit.store import Run

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "fabric.txt").write_text(IBNET)
    (tmp_path / "in" / "switch.txt").write_text("".join(
        f"{1_760_000_000 + 10 * k}\n" + _perfquery_block(1719, 1, {"PortXmitData": 25_000_000 * k}, extended=True)
        for k in range(2)))
    (tmp_path / "in" / "node.prom").write_text("".join(
        prom_line("node_infiniband_port_data_received_bytes_total", {"instance": "o0001:9100", "device": "HCA-1",
                                                                     "port": "1"}, 1e9 * k, T0_MS + 10_000 * k) + "\n"
        for k in range(2)))
    report = ingest([tmp_path / "in"], tmp_path / "run")
    assert not report.failed
    ws = Run(tmp_path / "run").table("link_samples").to_pylist()
    by_link = {w["link"]: w for w in ws}
    up = by_link["ib-i1l1s01:1--ib-i1l2s01:1"]        # perfquery by LID; the leaf is the link's src
    assert (up["link_end"], up["tx_bytes"], up["speed_bps"]) == ("src", 1e8, 100e9)
    assert up["tx_util"] == pytest.approx(1e8 * 8 / (100e9 * 10))
    hca = by_link["o0001/HCA-1:1--ib-i1l1s01:10"]     # node_exporter by <instance host>/<device>
    assert (hca["link_end"], hca["rx_bytes"]) == ("src", 1e9)


def test_link_map_csv_wins_and_oriented_swaps_the_dst_end(tmp_path):
    from tracekit.ingest import ingest
    from tracekit.store import Run

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "map.csv").write_text(
        "host,device,port,link\nnode7,mlx5_0,1,node7-rail0\n,leaf3,17,node7-rail0\n")
    (tmp_path / "in" / "leaf.prom").write_text("".join(
        prom_line("ifHCOutOctets", {"instance": "leaf3", "ifName": "17"}, 4e9 * k, T0_MS + 10_000 * k) + "\n"
        for k in range(2)))
    ingest([tmp_path / "in"], tmp_path / "run")
    run = Run(tmp_path / "run")
    (w,) = run.table("link_samples").to_pylist()
    assert (w["link"], w["link_end"], w["tx_bytes"], w["rx_bytes"]) == ("node7-rail0", "dst", 4e9, None)
    (o,) = oriented(run.table("link_samples")).to_pylist()
    assert (o["tx_bytes"], o["rx_bytes"]) == (None, 4e9)  # leaf3 -> node7 is the link's dst->src
