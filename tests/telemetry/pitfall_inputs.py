"""Small Prometheus inputs with every counter pitfall and every kind of bad line, made here.

Each writer returns the files it made. The contents are fixed (no randomness), so the golden
outputs in golden/ingest_golden.json pin what the parser and the rating make of them."""

from __future__ import annotations

import gzip
from pathlib import Path

from telemetry_helpers import T0_MS, prom_line

STEP_MS = 10_000
SCRAPES = 12
WRAP = 2**32


def _lines() -> list[str]:
    out = ["# HELP ifHCOutOctets The total number of octets transmitted.",
           "# TYPE ifHCOutOctets counter", "# TYPE ifHighSpeed gauge", ""]
    a1 = {"instance": "leafA:9116", "ifName": "Ethernet1"}
    a2 = {"instance": "leafA:9116", "ifName": "Ethernet2"}
    b3 = {"sysName": "leafB", "ifName": "Ethernet3"}
    hca = {"instance": "node01:9100", "device": "mlx5_0", "port": "1"}
    gpu = {"Hostname": "node01", "gpu": "0", "nvlink": "2"}
    esc = {"instance": "leafC", "ifName": 'Eth\\"4\\\\x'}
    for k in range(SCRAPES):
        t = T0_MS + k * STEP_MS
        out.append(prom_line("ifHighSpeed", a1, 400000, t))
        out.append(prom_line("ifHighSpeed", a2, 1000, t))
        # 64-bit: steady, then a reset (cleared counters) at scrape 6
        out.append(prom_line("ifHCOutOctets", a1, (k if k < 6 else k - 6) * 3_000_000_000 + 17, t))
        out.append(prom_line("ifHCInOctets", a1, 10**12 + k * 1_234_567_891, t))
        # 32-bit at 1 Gb/s (wrap time 34 s > 10 s windows): wraps are unwrapped
        out.append(prom_line("ifInOctets", a2, (3_900_000_000 + k * 987_654_321) % WRAP, t))
        if k != 4:  # this series misses one scrape (a gap in the series, not the port)
            out.append(prom_line("ifOutOctets", a2, (k * 1_000_000_007) % WRAP, t))
        if k != 7:  # the whole port misses one scrape (a port gap)
            # 32-bit, no speed known: every window is ambiguous
            out.append(prom_line("ifOutOctets", b3, (k * 2_000_000_011) % WRAP, t))
            out.append(prom_line("ifOutDiscards", b3, k * 3, t))
        if k == 2:  # the same sample twice
            out.append(prom_line("ifOutOctets", b3, (k * 2_000_000_011) % WRAP, t))
        # IB: data in bytes (x4 already), saturating at (2^32-1) words from scrape 8
        words = min(k * 900_000_000, WRAP - 1)
        out.append(prom_line("node_infiniband_port_data_transmitted_bytes_total", hca, words * 4, t))
        out.append(prom_line("node_infiniband_port_transmit_wait_total", hca, min(k * 600_000_000, WRAP - 1), t))
        out.append(prom_line("node_infiniband_rate_bytes_per_second", hca, 50_000_000_000, t))
        # a 64-bit packet counter stuck at the 16-bit ceiling from scrape 9
        out.append(prom_line("node_infiniband_port_packets_transmitted_total", hca, min(k * 9000, 2**16 - 1), t))
        out.append(prom_line("node_infiniband_legacy_data_transmitted_bytes_total", hca, k, t))
        out.append(prom_line("node_infiniband_unicast_packets_transmitted_total", hca, k, t))
        out.append(prom_line("DCGM_FI_PROF_NVLINK_TX_BYTES", gpu, f"{1.5e9 + k * 1e8:.6e}", t))
        out.append(prom_line("go_gc_duration_seconds", {"quantile": "0.5"}, 0.001, t))
        out.append(prom_line("ifHCOutOctets", esc, k * 1000, t))
    t = T0_MS + SCRAPES * STEP_MS
    out += [
        "this is not a sample",
        'ifHCOutOctets{instance="leafA:9116",ifName="Ethernet1" 5 ' + str(t),
        prom_line("ifHCInOctets", a1, "abc", t),
        prom_line("ifHCInOctets", a1, 5, "17x"),
        prom_line("ifHCInOctets", a1, "NaN", t),
        prom_line("ifHCInOctets", a1, "+Inf", t + 1),
        prom_line("ifHCInOctets", {"instance": "leafA:9116", "ifName": "Ethernet9"}, "1.5e3", t),
        prom_line("ifHCInOctets", {"instance": "leafA:9116", "ifName": "Ethernet9"}, "0x10", t + 1),
        'ifHCInOctets{instance="leafA:9116",ifName="Ethernet9",bad} 7 ' + str(t),
        prom_line("ifHCInOctets", {"instance": "leafA:9116", "ifName": "Ethernet9"}, 9, 1) + "\r",
        prom_line("ifHCInOctets", {"instance": "leafA:9116", "ifName": "Ethernet9"}, 11, 99_999_999_999_999_999),
        prom_line("ifHCInOctets", {"instance": "leafA:9116", "ifName": "Ethernet9"}, 13, "1.76e12"),
        "   ",
        "# EOF-ish comment",
    ]
    return out


def write_pitfalls(folder: Path) -> list[Path]:
    """The pitfall exposition as plain text, gzipped, and as OpenMetrics with float-second stamps,
    plus one untimed scrape."""
    folder.mkdir(parents=True, exist_ok=True)
    text = "\n".join(_lines()) + "\n"
    plain = folder / "pitfalls.prom"
    plain.write_text(text)
    gz = folder / "pitfalls_gz.prom.gz"
    gz.write_bytes(gzip.compress(text.replace("leafA", "leafG").encode(), mtime=0))
    om = folder / "pitfalls_openmetrics.prom"
    om_lines = ["# TYPE ifHCOutOctets counter", "# UNIT ifHCOutOctets bytes"]
    for k in range(SCRAPES):
        stamp = f"{(T0_MS + k * STEP_MS) / 1000:.3f}"
        om_lines.append(prom_line("ifHCOutOctets", {"instance": "leafO", "ifName": "Ethernet1"}, k * 7_000_000,
                                  stamp))
        om_lines.append(prom_line("ifHCOutOctets", {"instance": "leafO", "ifName": "Ethernet2"}, k * 5_000_000,
                                  T0_MS + k * STEP_MS))
    om_lines.append("# EOF")
    om.write_text("\n".join(om_lines) + "\n")
    untimed = folder / "pitfalls_untimed.prom"
    samples = [prom_line("ifHCOutOctets", {"instance": "leafU", "ifName": f"Ethernet{p}"}, p * 11) for p in range(1, 5)]
    untimed.write_text("# TYPE ifHCOutOctets counter\n" + "\n".join(samples) + "\n")
    return [plain, gz, om, untimed]
