"""Small hand-built runs for the replay tests: events (with launch calls), collectives, two hosts."""

from __future__ import annotations

import pyarrow as pa

T0 = 1_700_000_000_000_000_000
#: 50 MB over one 400 Gb/s NIC (50 bytes/ns) with no latency: a 2-rank all-reduce moves S per GPU.
NBYTES = 50_000_000
PHYSICS_NS = 1_000_000
BASE = "single-switch:gpus=1,latency_ns=0,pcie_gbps=2000,nic_efficiency=1"  # line rate: closed forms by hand
SLOW8 = BASE + ",nic_gbps=50"
#: NCCL's latency of a ring all-reduce over 2 ranks on 2 hosts (Simple, one GPU per node, so the
#: network hop is the tree's): base 8.4 us + 2 network steps x 14 us (docs/hardware.md, 1.2).
#: `latency_ns=0` zeroes the links' latency, not NCCL's.
NCCL_LATENCY_NS = 8_400 + 2 * 14_000
MODELLED_NS = PHYSICS_NS + NCCL_LATENCY_NS


def at_slow8(traced_ns: float) -> int:
    """The replayed time on SLOW8 of one such all-reduce traced at `traced_ns` on BASE: one size,
    so one factor (traced / 1.0364 ms) scales 8 ms of transfer plus the same latency."""
    return round(traced_ns * (8 * PHYSICS_NS + NCCL_LATENCY_NS) / MODELLED_NS)


class Trace:
    """Builds the tables of a run of `ranks` ranks on one host each."""

    COLS = ("rank", "lane", "kind", "name", "ts_ns", "dur_ns", "step", "coll_id", "correlation", "sync_lane",
            "sync_correlation")

    def __init__(self, ranks=(0, 1)):
        self.ranks = list(ranks)
        self.ev = {k: [] for k in self.COLS}
        self.coll = {k: [] for k in ("coll_id", "rank", "group", "seq", "op", "in_bytes", "out_bytes", "nranks",
                                     "instance", "dim", "peer", "step")}
        self._corr = 0

    def event(self, rank, lane, kind, ts, dur, *, step=0, coll=None, corr=None, sync_lane=None, sync_corr=None,
              name=None):
        row = {"rank": rank, "lane": lane, "kind": kind, "name": name or kind, "ts_ns": T0 + ts, "dur_ns": dur,
               "step": step, "coll_id": coll, "correlation": corr, "sync_lane": sync_lane,
               "sync_correlation": sync_corr}
        for k in self.COLS:
            self.ev[k].append(row[k])

    def kernel(self, rank, lane, kind, ts, dur, *, launch=None, step=0, coll=None):
        """A GPU event; with `launch`, a 1 µs launch call (runtime event) at that time. Returns
        its correlation id."""
        self._corr += 1
        corr = self._corr
        if launch is not None:
            self.event(rank, "cpu/thread1", "runtime", launch, 1_000, step=step, corr=corr, name="cudaLaunchKernel")
        self.event(rank, lane, kind, ts, dur, step=step, coll=coll, corr=corr)
        return corr

    def collective(self, instance, op, group, seq, rank, *, nbytes=NBYTES, peer=None, step=0, dim="DP"):
        coll_id = len(self.coll["coll_id"])
        for k, v in zip(self.coll, [coll_id, rank, group, seq, op, nbytes, nbytes, len(self.ranks), instance, dim,
                                    peer, step], strict=True):
            self.coll[k].append(v)
        return coll_id

    def tables(self):
        ev = pa.table(self.ev, schema=pa.schema([
            ("rank", pa.int32()), ("lane", pa.string()), ("kind", pa.string()), ("name", pa.string()),
            ("ts_ns", pa.int64()), ("dur_ns", pa.int64()), ("step", pa.int32()), ("coll_id", pa.int64()),
            ("correlation", pa.int64()), ("sync_lane", pa.string()), ("sync_correlation", pa.int64())]))
        return {"events": ev, "collectives": pa.table(self.coll),
                "ranks": pa.table({"rank": self.ranks, "host": [f"h{r}" for r in self.ranks],
                                   "local_device": [0] * len(self.ranks), "clock_offset_ns": [0] * len(self.ranks)}),
                "groups": pa.table({"group": ["dp"], "ranks": [self.ranks], "size": [len(self.ranks)]})}
