"""Small hand-built runs for the what-if tests: every number in them is chosen so that the answers
can be derived by hand."""

from __future__ import annotations

import pyarrow as pa

T0 = 1_700_000_000_000_000_000


class RunBuilder:
    """Ranks on hosts, and a sequence of blocks per rank: compute, then a collective instance."""

    def __init__(self, hosts: dict[int, tuple[str, int]]) -> None:
        self.hosts = hosts
        self.ev = {k: [] for k in ("rank", "lane", "kind", "name", "ts_ns", "dur_ns", "step", "coll_id")}
        self.coll = {k: [] for k in ("coll_id", "rank", "group", "seq", "op", "in_bytes", "out_bytes", "nranks",
                                     "peer", "in_splits", "out_splits", "instance", "dim", "algo", "proto")}
        self.rings: dict[str, list[int]] = {}
        self.groups: dict[str, list[int]] = {}
        self.clock = dict.fromkeys(hosts, 0)
        self.seq: dict[str, int] = {}
        self.n_inst = 0

    def compute(self, rank: int, dur: int, name: str = "gemm", step: int = 0) -> None:
        self._event(rank, "gpu/s7", "compute", name, self.clock[rank], dur, step, None)
        self.clock[rank] += dur

    def _event(self, rank, lane, kind, name, ts, dur, step, coll):
        for k, v in zip(self.ev, [rank, lane, kind, name, T0 + ts, dur, step, coll], strict=True):
            self.ev[k].append(v)

    def collective(self, group: str, ranks: list[int], op: str, dim: str, *, dur: int, nbytes: int = 0,
                   splits: list[list[int]] | None = None, pair: tuple[int, int] | None = None,
                   step: int = 0, ring: bool = False) -> None:
        """One instance: every member arrives when its clock says and all end together. `ring`:
        the trace says (as NCCL logs do) that the group uses one ring channel in member order,
        with the Simple protocol."""
        if ring:
            self.rings[group] = list(ranks)
        self.groups.setdefault(group, list(ranks))
        seq = self.seq.get(group, 0)
        self.seq[group] = seq + 1
        start = max(self.clock[r] for r in ranks)
        for i, r in enumerate(ranks):
            cid = len(self.coll["coll_id"])
            if splits is not None:
                ins, outs = splits[i], [splits[j][i] for j in range(len(ranks))]
                inb, outb = sum(ins), sum(outs)
            else:
                ins = outs = None
                inb = outb = nbytes
            rop, peer = op, None
            if pair is not None:
                rop = "send" if r == pair[0] else "recv"
                peer = pair[1] if r == pair[0] else pair[0]
            algo, proto = ("ring", "simple") if ring else (None, None)
            for k, v in zip(self.coll, [cid, r, group, seq, rop, inb, outb, len(ranks), peer, ins, outs,
                                        self.n_inst, dim, algo, proto], strict=True):
                self.coll[k].append(v)
            self._event(r, "gpu/s20", "comm", f"nccl:{op}", self.clock[r], start + dur - self.clock[r], step, cid)
            self.clock[r] = start + dur
        self.n_inst += 1

    def tables(self) -> dict[str, pa.Table]:
        ranks = sorted(self.hosts)
        coll = dict(self.coll)
        coll["in_splits"] = pa.array(coll["in_splits"], pa.list_(pa.int64()))
        coll["out_splits"] = pa.array(coll["out_splits"], pa.list_(pa.int64()))
        channels = {"group": [], "rank": [], "channel": [], "pattern": [], "peer_rank": [], "direction": []}
        for group, members in self.rings.items():
            for i, r in enumerate(members):
                for k, v in zip(channels, [group, r, 0, "ring", members[(i + 1) % len(members)], "send"],
                                strict=True):
                    channels[k].append(v)
        return {
            "channels": pa.table(channels),
            "events": pa.table(self.ev),
            "collectives": pa.table(coll),
            "ranks": pa.table({"rank": ranks, "host": [self.hosts[r][0] for r in ranks],
                               "local_device": [self.hosts[r][1] for r in ranks],
                               "clock_offset_ns": [0] * len(ranks)}),
            "groups": pa.table({"group": list(self.groups), "ranks": list(self.groups.values()),
                                "size": [len(v) for v in self.groups.values()]}),
        }


def skewed_ep_run(*, hot_share: float = 0.4, sent: int = 700_000, n: int = 8, per_host: int = 4,
                  instances: int = 4, transpose: bool = False) -> dict[str, pa.Table]:
    """One EP group of `n` ranks on n/per_host hosts. Each layer: attention compute, a dispatch
    all-to-all in which each rank sends `sent` bytes, `hot_share` of them to rank 0 and the rest
    evenly to the others (itself included), then expert compute of 1 ns per byte received.
    `transpose` makes it a combine (rank 0 sends the skewed share)."""
    b = RunBuilder({r: (f"h{r // per_host}", r % per_host) for r in range(n)})
    hot = round(sent * hot_share)
    cold = (sent - hot) // (n - 1)
    row = [hot] + [cold] * (n - 1)
    matrix = [list(row) for _ in range(n)]
    if transpose:
        matrix = [[matrix[j][i] for j in range(n)] for i in range(n)]
    received = [sum(matrix[j][i] for j in range(n)) for i in range(n)]
    for _ in range(instances):
        for r in range(n):
            b.compute(r, 100_000, name="attention")
        b.collective("ep", list(range(n)), "all_to_all", "EP", dur=400_000, splits=matrix)
        for r in range(n):
            b.compute(r, received[r], name="expert_mlp")
    return b.tables()
