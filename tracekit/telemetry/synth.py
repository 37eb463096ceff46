"""Synthetic switch telemetry consistent with a run: its fabric as `ibnetdiscover -p` output and
the leaf switches' host-facing port counters as Prometheus text (IF-MIB `ifHCInOctets` /
`ifHCOutOctets`, `ifHighSpeed`), with a configurable background (north-south, other jobs) load.

The bytes come from the run's collectives by closed forms, not from replay: per instance, the
bytes each host sends and receives over the network (ring all-reduce 2(n-1)/n x S per host, ring
all-gather / reduce-scatter (n-1)/n x S, all-to-all and send/recv their off-host bytes per
peer), spread evenly over the instance's network interval (last arrival to last end, clocks
corrected by `ranks.clock_offset_ns`) and over the host's HCAs (p2p bytes go out the HCA of the
sending GPU, rail-aligned). A test can then check replay against numbers it did not make.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa

from tracekit import schema
from tracekit.atomic import atomic_write_text

RING_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
               "reduce_scatter": lambda n: (n - 1) / n}
#: Data rate per lane (Gb/s) of the IB speed names written (4x lanes).
_SPEED_GBPS = {"EDR": 25.0, "HDR": 50.0, "NDR": 100.0}


@dataclass(frozen=True)
class SynthFabric:
    """A two-tier fabric: `hosts_per_leaf` hosts under each leaf, every leaf cabled to every spine,
    `nics` HCAs per host (`<host> mlx5_<i>`), 4x `speed` everywhere."""

    hosts: tuple[str, ...]
    nics: int = 1
    hosts_per_leaf: int = 2
    spines: int = 2
    speed: str = "NDR"

    @property
    def gbps(self) -> float:
        return 4 * _SPEED_GBPS[self.speed]

    def leaf_of(self, host_index: int) -> int:
        return host_index // self.hosts_per_leaf

    def leaf_port(self, host_index: int, nic: int) -> int:
        """The leaf port (1-based) a host's HCA is cabled to; uplinks follow the host ports."""
        return (host_index % self.hosts_per_leaf) * self.nics + nic + 1

    @property
    def leaves(self) -> int:
        return math.ceil(len(self.hosts) / self.hosts_per_leaf)


@dataclass
class SynthTelemetry:
    """What was written, and the true per-port bytes behind it (host, nic) -> per-window arrays."""

    fabric_path: Path
    prom_path: Path
    scrape_ns: np.ndarray
    tx_bytes: dict[tuple[str, int], np.ndarray] = field(default_factory=dict)
    rx_bytes: dict[tuple[str, int], np.ndarray] = field(default_factory=dict)
    background: dict[tuple[str, int], float] = field(default_factory=dict)


def ibnetdiscover_text(fabric: SynthFabric) -> str:
    """`ibnetdiscover -p` lines of the fabric, every cable from both ends."""
    lines: list[str] = []
    lid = iter(range(1, 1 << 16))
    leaf = [(f"0x1000{k:012x}", next(lid), f"leaf{k}") for k in range(fabric.leaves)]
    spine = [(f"0x2000{k:012x}", next(lid), f"spine{k}") for k in range(fabric.spines)]
    w = "4x " + fabric.speed

    def both(a: tuple, a_port: int, a_type: str, b: tuple, b_port: int, b_type: str) -> None:
        lines.append(f"{a_type}  {a[1]:>4} {a_port:>2} {a[0]} {w} - {b_type}  {b[1]:>4} {b_port:>2} {b[0]} "
                     f"( '{a[2]}' - '{b[2]}' )")
        lines.append(f"{b_type}  {b[1]:>4} {b_port:>2} {b[0]} {w} - {a_type}  {a[1]:>4} {a_port:>2} {a[0]} "
                     f"( '{b[2]}' - '{a[2]}' )")

    for h, host in enumerate(fabric.hosts):
        for i in range(fabric.nics):
            hca = (f"0x3000{h:08x}{i:04x}", next(lid), f"{host} mlx5_{i}")
            both(hca, 1, "CA", leaf[fabric.leaf_of(h)], fabric.leaf_port(h, i), "SW")
    down = fabric.hosts_per_leaf * fabric.nics
    for k, lf in enumerate(leaf):
        for s, sp in enumerate(spine):
            both(lf, down + s + 1, "SW", sp, k + 1, "SW")
    return "\n".join(lines) + "\n"


def host_bytes(tables: Mapping[str, pa.Table], fabric: SynthFabric, scrape_ns: np.ndarray
               ) -> tuple[dict[tuple[str, int], np.ndarray], dict[tuple[str, int], np.ndarray]]:
    """Bytes each HCA sends and receives in each window [scrape_ns[k], scrape_ns[k+1]) (closed forms
    of the module docstring)."""
    coll = pl.from_arrow(schema.conform("collectives", tables["collectives"]))
    ranks = pl.from_arrow(schema.conform("ranks", tables["ranks"]))
    assert isinstance(coll, pl.DataFrame) and isinstance(ranks, pl.DataFrame)
    host_of = dict(zip(ranks["rank"].to_list(), ranks["host"].to_list(), strict=True))
    local_of = dict(zip(ranks["rank"].to_list(), ranks["local_device"].fill_null(0).to_list(), strict=True))
    off = dict(zip(ranks["rank"].to_list(), ranks["clock_offset_ns"].fill_null(0).to_list(), strict=True))
    h_index = {h: i for i, h in enumerate(fabric.hosts)}
    n_win = len(scrape_ns) - 1
    tx = {(h, i): np.zeros(n_win) for h in fabric.hosts for i in range(fabric.nics)}
    rx = {(h, i): np.zeros(n_win) for h in fabric.hosts for i in range(fabric.nics)}
    base = int(scrape_ns[0])
    edges = (scrape_ns - base).astype(np.float64)  # ns since the epoch do not fit a float64 exactly
    coll = coll.filter(pl.col("instance").is_not_null() & pl.col("ts_ns").is_not_null()).with_columns(
        (pl.col("ts_ns") + pl.col("rank").replace_strict(off, default=0) - base).alias("t0"))
    coll = coll.with_columns((pl.col("t0") + pl.col("dur_ns").fill_null(0)).alias("t1"))

    def spread(store: dict, host: str, nic: int | None, nbytes: float, a: float, b: float) -> None:
        nics = range(fabric.nics) if nic is None else [nic % fabric.nics]
        share = nbytes / len(nics)
        for i in nics:
            store[(host, i)] += _overlap(edges, a, b) * share

    for (_,), part in coll.group_by(["instance"]):
        op = str(part["op"][0])
        a, b = float(part["t0"].max()), float(part["t1"].max())
        members = sorted(part["rank"].to_list())
        if op in RING_FACTOR:
            hosts = {host_of[r] for r in members}
            if len(hosts) < 2:
                continue
            n = len(members)
            size = float(part["out_bytes" if op == "all_gather" else "in_bytes"].max())
            per_host = RING_FACTOR[op](n) * size
            for h in hosts:
                spread(tx, h, None, per_host, a, b)
                spread(rx, h, None, per_host, a, b)
        elif op == "all_to_all":
            for row in part.iter_rows(named=True):
                splits = row["in_splits"] or [row["in_bytes"] / len(members)] * len(members)
                for peer, nbytes in zip(members, splits, strict=False):
                    if host_of[peer] != host_of[row["rank"]] and nbytes:
                        spread(tx, host_of[row["rank"]], local_of[row["rank"]], nbytes, a, b)
                        spread(rx, host_of[peer], local_of[peer], nbytes, a, b)
        elif op == "send":
            for row in part.filter(pl.col("op") == "send").iter_rows(named=True):
                peer = row["peer"]
                if peer is not None and host_of.get(peer) != host_of[row["rank"]]:
                    spread(tx, host_of[row["rank"]], local_of[row["rank"]], row["in_bytes"], a, b)
                    spread(rx, host_of[peer], local_of[peer], row["in_bytes"], a, b)
    for key in tx:
        if key[0] not in h_index:
            raise ValueError(f"host {key[0]} is not in the fabric")
    return tx, rx


def _overlap(edges: np.ndarray, a: float, b: float) -> np.ndarray:
    """Share of [a, b) in each window [edges[k], edges[k+1]) (a point interval: its window)."""
    if b <= a:
        out = np.zeros(len(edges) - 1)
        k = np.searchsorted(edges, a, side="right") - 1
        if 0 <= k < len(out):
            out[k] = 1.0
        return out
    lo = np.clip(edges[:-1], a, b)
    hi = np.clip(edges[1:], a, b)
    return (hi - lo) / (b - a)


def write_switch_telemetry(tables: Mapping[str, pa.Table], out: str | os.PathLike[str], *,
                           interval_ns: int | None = None, nics: int = 1, hosts_per_leaf: int = 2,
                           spines: int = 2, background: Mapping[str, float] | None = None,
                           seed: int = 0) -> SynthTelemetry:
    """Write OUT/fabric.ibnetdiscover.txt and OUT/switches.prom for a run's tables.

    `background`: host name (or `host:nic`) -> extra bytes/s in each direction on that HCA's
    cable, load the job's trace does not explain. `interval_ns`: scrape interval (default: the
    run's span / 8, rounded to whole ms)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ranks = pl.from_arrow(schema.conform("ranks", tables["ranks"]))
    assert isinstance(ranks, pl.DataFrame)
    order = ranks.sort("rank").group_by("host", maintain_order=True).agg(pl.len())["host"].to_list()
    fabric = SynthFabric(tuple(str(h) for h in order), nics=nics, hosts_per_leaf=hosts_per_leaf, spines=spines)
    coll = tables["collectives"]
    ts = pa.compute.min_max(coll.column("ts_ns")).as_py() if coll.num_rows else {"min": 0, "max": 0}
    ends = pa.compute.max(pa.compute.add(coll.column("ts_ns"), coll.column("dur_ns"))).as_py() or ts["max"]
    events = tables.get("events")
    first = None
    if events is not None and events.num_rows:
        off = dict(zip(ranks["rank"].to_list(), ranks["clock_offset_ns"].fill_null(0).to_list(), strict=True))
        ev = pl.from_arrow(events.select(["rank", "ts_ns"]))
        assert isinstance(ev, pl.DataFrame)
        first = ev.select((pl.col("ts_ns") + pl.col("rank").replace_strict(off, default=0)).min()).item()
    # The first scrape at the first whole ms of the trace (on the corrected clock), so the windows
    # sit inside what it covers.
    start = -(-int(first if first is not None else ts["min"]) // 1_000_000) * 1_000_000
    span = max(1, int(ends) - start)
    step = interval_ns or max(1_000_000, (span // 8) // 1_000_000 * 1_000_000)
    n_win = math.ceil(span / step) + 1
    scrape = start + step * np.arange(n_win + 1, dtype=np.int64)
    tx, rx = host_bytes(tables, fabric, scrape)
    bg: dict[tuple[str, int], float] = {}
    for key, rate in (background or {}).items():
        host, _, nic = key.partition(":")
        bg[(host, int(nic or 0))] = float(rate)
        if (host, int(nic or 0)) not in tx:
            raise ValueError(f"background on {key!r}: no such host HCA in the fabric")
    rng = np.random.default_rng(seed)
    secs = step / 1e9
    lines = ["# HELP ifHCInOctets The total number of octets received on the interface.",
             "# TYPE ifHCInOctets counter",
             "# HELP ifHCOutOctets The total number of octets transmitted out of the interface.",
             "# TYPE ifHCOutOctets counter",
             "# TYPE ifHighSpeed gauge"]
    for h, host in enumerate(fabric.hosts):
        for i in range(fabric.nics):
            key = (host, i)
            extra = bg.get(key, 0.0) * secs
            # The leaf's port faces the HCA: what the HCA sends arrives as the port's In octets.
            into = np.concatenate([[0.0], np.cumsum(np.round(tx[key] + extra))]) + float(rng.integers(1 << 40))
            outof = np.concatenate([[0.0], np.cumsum(np.round(rx[key] + extra))]) + float(rng.integers(1 << 40))
            labels = f'instance="leaf{fabric.leaf_of(h)}",ifName="{fabric.leaf_port(h, i)}"'
            for k, t in enumerate(scrape.tolist()):
                ms = t // 1_000_000
                lines.append(f"ifHCInOctets{{{labels}}} {into[k]:.0f} {ms}")
                lines.append(f"ifHCOutOctets{{{labels}}} {outof[k]:.0f} {ms}")
                lines.append(f"ifHighSpeed{{{labels}}} {fabric.gbps * 1000:.0f} {ms}")
    prom = out / "switches.prom"
    atomic_write_text(prom, "\n".join(lines) + "\n")
    fab = out / "fabric.ibnetdiscover.txt"
    atomic_write_text(fab, ibnetdiscover_text(fabric))
    return SynthTelemetry(fab, prom, scrape, tx, rx, bg)

