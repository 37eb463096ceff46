"""NCCL debug logs of a small job, written with the printf formats of each NCCL era.

The formats are NCCL's own (NVIDIA/nccl `src/debug.cc`, `src/init.cc`, `src/enqueue.cc`,
`src/graph/{connect,rings,tuning}.cc`, `src/transport/{net,p2p,shm}.cc`, tags v2.4.2-1 to
v2.30.7-1; see shared/formats/nccl.md §1); the job is made up: `hosts` nodes of `gpus` GPUs, one
process per GPU, a ring that walks the GPUs of each node then crosses to the next node over NIC
0, a chain tree, and `steps` AllReduce calls (plus a Send/Recv pair and an AllGather).
"""

from __future__ import annotations

from dataclasses import dataclass, field

ERAS = ("2.4", "2.7", "2.12", "2.17", "2.19", "2.22", "2.24", "2.26", "2.29", "2.30")
COMM_ID = 0x7A11CE5EED5EED01


@dataclass
class Job:
    era: str
    hosts: int = 2
    gpus: int = 2
    channels: int = 2
    steps: int = 3
    count: int = 1024
    last_step: dict[int, int] = field(default_factory=dict)  # rank -> number of AllReduce it issued
    warn_rank: int | None = None
    pxn: bool = False

    @property
    def nranks(self) -> int:
        return self.hosts * self.gpus

    def v(self) -> tuple[int, ...]:
        return tuple(int(x) for x in self.era.split("."))

    def host(self, r: int) -> str:
        return f"node-{r // self.gpus}"

    def pid(self, r: int) -> int:
        return 4000 + r

    def dev(self, r: int) -> int:
        return r % self.gpus

    def comm(self, r: int) -> str:
        return f"0x55{r:02x}a0b0c0"

    def bus(self, r: int) -> str:
        return f"{0x18 + 0x10 * self.dev(r):x}000"

    def ring_next(self, r: int) -> int:
        return (r + 1) % self.nranks

    def ring_prev(self, r: int) -> int:
        return (r - 1) % self.nranks

    def tree(self, r: int) -> tuple[int, list[int]]:
        """A chain: parent r-1, child r+1."""
        return (r - 1 if r > 0 else -1), ([r + 1] if r + 1 < self.nranks else [])

    def inter(self, a: int, b: int) -> bool:
        return a // self.gpus != b // self.gpus


def prefix(job: Job, r: int, tid: int | None = None, *, warn: bool = False, ts: int = 0) -> str:
    t = job.pid(r) if tid is None else tid
    stamp = ""
    if job.v() >= (2, 26) and (warn or job.v() >= (2, 29)):
        stamp = f"[2026-03-12 13:57:{ts % 60:02d}] "
    return f"{stamp}{job.host(r)}:{job.pid(r)}:{t} [{job.dev(r)}] "


def _devtag(job: Job, r: int, net: bool) -> str:
    """What the brackets after a rank hold: nothing (2.4 NET), the busId (2.5 to 2.18.1), the
    nvmlDev (2.18.3+; 2.4 P2P)."""
    v = job.v()
    if v < (2, 5):
        return "" if net else f"[{job.dev(r)}]"
    if v < (2, 18):
        return f"[{job.bus(r)}]"
    return f"[{job.dev(r)}]"


def _chan(job: Job, c: int, conn: int = 0) -> str:
    v = job.v()
    if v < (2, 7):
        return f"Ring {c:02d}"
    if v < (2, 12):
        return f"Channel {c:02d}"
    return f"Channel {c:02d}/{conn}"


def transport_line(job: Job, r: int, peer: int, c: int, side: str, conn: int = 0) -> str:
    """One transport line printed by rank r about its connection to peer on channel c."""
    v = job.v()
    a, b = (r, peer) if side == "send" else (peer, r)
    net = job.inter(r, peer)
    ta, tb = _devtag(job, a, net), _devtag(job, b, net)
    if net:
        proxy = f"({r - r % job.gpus})" if job.pxn and side == "send" and r % job.gpus and v >= (2, 12) else ""
        gdr = "/GDRDMA" + ("(PCI)" if v >= (2, 26) else "")
        tag = f"[{'send' if side == 'send' else 'receive'}] "
        return f"{_chan(job, c, conn)} : {a}{ta} -> {b}{tb} {tag}via NET/IB/0{proxy}{gdr}"
    if side != "send":
        return ""
    return f"{_chan(job, c, conn)} : {a}{ta} -> {b}{tb} via P2P/IPC" + ("/read" if v >= (2, 20) else "")


def init_lines(job: Job, r: int, what: str) -> list[str]:
    v = job.v()
    cid = f" commId 0x{COMM_ID:x}"
    n, d = job.nranks, job.dev(r)
    if v < (2, 5):
        return [f"comm {job.comm(r)} rank {r} nranks {n} cudaDev {d} nvmlDev {d} - Init {what}"] if what == "COMPLETE" \
            else []
    if v < (2, 16):
        return [f"comm {job.comm(r)} rank {r} nranks {n} cudaDev {d} busId {job.bus(r)} - Init {what}"] \
            if what == "COMPLETE" else []
    if v < (2, 18):
        return [f"comm {job.comm(r)} rank {r} nranks {n} cudaDev {d} busId {job.bus(r)}{cid} - Init {what}"] \
            if what == "COMPLETE" else []
    body = f"comm {job.comm(r)} rank {r} nranks {n} cudaDev {d} nvmlDev {d} busId {job.bus(r)}{cid} - Init {what}"
    if v < (2, 21):
        return [body]
    api = "ncclCommInitRank " if v < (2, 29) else f"[Rank {r}] ncclCommInitRank "
    return [api + body]


def trees_line(job: Job, r: int) -> str:
    up, down = job.tree(r)
    d = [*down, -1, -1, -1][:3]
    parts = []
    for c in range(job.channels):
        if job.v() < (2, 5):
            parts.append(f" [{c}] {up}->{r}->{d[0]}/{d[1]}/{d[2]}")
        elif job.v() < (2, 8):
            parts.append(f" [{c}] {d[0]}/{d[1]}/{d[2]}->{r}->{up}|{up}->{r}->{d[0]}/{d[1]}/{d[2]}")
        else:
            parts.append(f" [{c}] {d[0]}/{d[1]}/{d[2]}->{r}->{up}")
    return "Trees" + "".join(parts)


def setup_lines(job: Job, r: int) -> list[str]:
    """What rank r prints while its communicator is set up (INFO), in NCCL's order."""
    v = job.v()
    out = [f"NCCL version {job.era}.{'3' if v < (2, 30) else '7'}+cuda12.4",
           "NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_1:1/RoCE ; OOB eth0:10.0.0.1<0>", "Using network IB"]
    out += init_lines(job, r, "START")
    if v >= (2, 20):
        out.append(f"comm {job.comm(r)} rank {r} nRanks {job.nranks} nNodes {job.hosts} localRanks {job.gpus} "
                   f"localRank {job.dev(r)} MNNVL 0")
    if r == 0 and v >= (2, 5):
        for c in range(job.channels):
            order = "".join(f" {x:3d}" for x in range(job.nranks)) if v < (2, 23) else \
                "".join(f" {x}" for x in range(job.nranks))
            out.append(f"Channel {c:02d}/{job.channels:02d} :{order}")
    out.append(trees_line(job, r))
    for c in range(job.channels):
        prev, nxt = job.ring_prev(r), job.ring_next(r)
        if job.inter(r, prev):
            out.append(transport_line(job, r, prev, c, "recv"))
        out.append(transport_line(job, r, nxt, c, "send"))
    if v >= (2, 8):
        out.append("Connected all rings" + (f", use ring PXN {int(job.pxn)} GDR 1" if v >= (2, 24) else ""))
    up, down = job.tree(r)
    for c in range(job.channels):
        for peer in [p for p in (up, *down) if p >= 0]:
            if peer in (job.ring_next(r),):
                continue  # the ring's send connection to that peer is reused (not printed again)
            if job.inter(r, peer):
                out.append(transport_line(job, r, peer, c, "recv"))
            out.append(transport_line(job, r, peer, c, "send"))
    if v >= (2, 8):
        out.append("Connected all trees")
    if v >= (2, 21):
        out.append(f"{job.channels} coll channels, {job.channels} collnet channels, 0 nvls channels, "
                   f"{job.channels} p2p channels, 2 p2p channels per peer")
    elif v >= (2, 17):
        out.append(f"{job.channels} coll channels, 0 nvls channels, {job.channels} p2p channels, 2 p2p channels "
                   "per peer")
    out += init_lines(job, r, "COMPLETE")
    return [x for x in out if x]


def coll_line(job: Job, r: int, name: str, op_count: int, count: int, dtype: int, root: int,
              sendbuff: str = "0x7f0000000200", recvbuff: str = "0x7f0000000400") -> str:
    return (f"{name}: opCount {op_count:x} sendbuff {sendbuff} recvbuff {recvbuff} count {count} datatype {dtype} "
            f"op 0 root {root} comm {job.comm(r)} [nranks={job.nranks}] stream 0x5500000001")


def tuning_line(job: Job, name: str, nbytes: int) -> str | None:
    v = job.v()
    if v >= (2, 24):
        return f"{name}: {nbytes} Bytes -> Algo RING proto SIMPLE channel{{Lo..Hi}}={{0..{job.channels - 1}}}"
    if v >= (2, 23):
        return f"{name}: {nbytes} Bytes -> Algo 1 proto 2 time 12.500000"
    if v >= (2, 20):
        return f"{nbytes} Bytes -> Algo 1 proto 2 time 12.500000"
    return None


def run_lines(job: Job, r: int) -> list[tuple[str, str]]:
    """(level, message) of rank r's calls after init: AllReduce steps, then a Send/Recv pair with
    its neighbour, then one AllGather."""
    v = job.v()
    out: list[tuple[str, str]] = []
    op_count = 0
    steps = job.last_step.get(r, job.steps)
    for _ in range(steps):
        out.append(("INFO", coll_line(job, r, "AllReduce", op_count, job.count, 7, 0)))
        t = tuning_line(job, "AllReduce", job.count * 4)
        if t and (r == 0 or v >= (2, 24)):
            out.append(("INFO", t))
        op_count += 1
    if steps < job.steps:
        return out
    peer = r ^ 1
    if v >= (2, 12):
        send = coll_line(job, r, "Send", op_count, 256, 9, peer, sendbuff="(nil)", recvbuff="0x7f0000000800")
    else:
        send = coll_line(job, r, "Send", op_count, 256, 9, peer, sendbuff="0x7f0000000800", recvbuff="(nil)")
    recv = coll_line(job, r, "Recv", op_count, 256, 9, peer, sendbuff="(nil)", recvbuff="0x7f0000000a00")
    out += [("INFO", send), ("INFO", recv)] if r % 2 == 0 else [("INFO", recv), ("INFO", send)]
    op_count += 1
    out.append(("INFO", coll_line(job, r, "AllGather", op_count, 64, 6, 0)))
    if job.warn_rank == r:
        out.append(("WARN", "NET/IB : Got completion from peer 10.0.0.2<43211> with status=12 opcode=0 len=0 "
                            "vendor err 129 (Send) localGid ::ffff:10.0.0.1 remoteGids::ffff:10.0.0.2"))
    return out


def rank_log(job: Job, r: int) -> list[str]:
    """Every line rank r's process prints, as NCCL_DEBUG_FILE would hold them."""
    v = job.v()
    init_tid = job.pid(r) + 100 if v >= (2, 12) else job.pid(r)
    lines = [prefix(job, r, init_tid, ts=i) + "NCCL INFO " + m for i, m in enumerate(setup_lines(job, r))]
    for i, (level, msg) in enumerate(run_lines(job, r)):
        if level == "WARN":
            loc = "net_ib.cc:1696" + (" (ncclIbTest)" if v >= (2, 30) else "")
            lines.append("")
            lines.append(prefix(job, r, warn=True, ts=30 + i) + f"{loc} NCCL WARN {msg}")
        else:
            lines.append(prefix(job, r, ts=30 + i) + "NCCL INFO " + msg)
    return lines


def job_log(job: Job) -> list[str]:
    """All ranks' lines, rank after rank (a node-level concatenation)."""
    out: list[str] = []
    for r in range(job.nranks):
        out.extend(rank_log(job, r))
    return out
