"""Replay of microbenchmark sweeps (nccl-tests) against their measured bandwidth.

Each row of the `microbench` table (one op at one size on `nranks` ranks, `ranks_per_host` per
host) is one collective on the topology: decomposed as NCCL would run it (`decompose_plan`),
simulated alone, its transfer time stretched by its pipeline fill and NCCL's latency added. The
predicted bus bandwidth uses nccl-tests' own factors, so it compares with the measured one.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from tracekit import schema
from tracekit.errors import InputError, TracekitError
from tracekit.replay.decompose import Instance, decompose_plan
from tracekit.replay.simulate import route, simulate
from tracekit.replay.topology import TopologySpec, build, parse_spec


class ReplayError(TracekitError):
    """A microbenchmark table cannot be replayed on the topology."""


LATENCY_BOUND_BYTES = 64 * 2**20  # below this a row is reported as latency-bound, not scored

# nccl-tests' bus-bandwidth factors (doc/PERFORMANCE.md): busbw = algbw x factor(n).
_BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send": lambda n: 1.0,
    "recv": lambda n: 1.0,
    "sendrecv": lambda n: 1.0,
}


@dataclass(frozen=True)
class MicrobenchRow:
    """One size of a sweep: measured vs predicted (out-of-place), bandwidths in GB/s."""

    op: str
    size_bytes: int
    nranks: int
    measured_us: float
    predicted_us: float
    measured_busbw: float
    predicted_busbw: float
    algo: str
    proto: str
    channels: int
    latency_bound: bool

    @property
    def error(self) -> float:
        """predicted / measured busbw - 1."""
        return self.predicted_busbw / self.measured_busbw - 1.0 if self.measured_busbw > 0 else math.nan

    def to_json(self) -> dict[str, object]:
        return {"op": self.op, "size_bytes": self.size_bytes, "measured_busbw": self.measured_busbw,
                "predicted_busbw": self.predicted_busbw, "measured_us": self.measured_us,
                "predicted_us": self.predicted_us, "algo": self.algo, "proto": self.proto,
                "channels": self.channels, "latency_bound": self.latency_bound}


def busbw_factor(op: str, n: int) -> float:
    """nccl-tests' busbw / algbw for an op on n ranks."""
    return _BUS_FACTOR.get(op, lambda n: 1.0)(max(n, 1))


def _instance(op: str, size: float, n: int, ranks_per_host: int, *, nccl_version: str | None = None,
              tests_version: str | None = None) -> Instance:
    """The call one row times. nccl-tests' sendrecv is a ring of pairs: every rank sends `size`
    to the next and receives as much from the previous one at once (src/sendrecv.cu), and the
    reported time is the ranks' mean, which the slowest pair sets (every rank waits on its
    predecessor each iteration). nccl-tests 2.18.3+ on NCCL 2.30+ tells NCCL the comm has 2 p2p
    peers (`maxP2pPeers`), which keeps its channels per peer from being halved across hosts."""
    ranks = list(range(n))
    if op == "sendrecv":
        two_peers = _at_least(nccl_version, (2, 30)) and _at_least(tests_version, (2, 18, 3))
        return Instance(0, "sendrecv", ranks, size, max_p2p_peers=2 if two_peers else None)
    if op in ("send", "recv"):
        peer = ranks_per_host % n if n > ranks_per_host else (1 % n)
        return Instance(0, "send", [0, peer], size, src=0, dst=peer)
    return Instance(0, op, ranks, size, root=0)  # nccl-tests' size is this package's S


def _at_least(version: str | None, floor: tuple[int, ...]) -> bool:
    """Whether a dotted version ("2.30.7", "2.18.3") is at least `floor`; False when unknown."""
    if not version:
        return False
    parts = []
    for piece in str(version).split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return bool(parts) and tuple(parts) >= floor


def replay_microbench(microbench: pa.Table, topology: str | TopologySpec, *,
                      algo: str = "auto") -> list[MicrobenchRow]:
    """Predicted vs measured busbw for every row of a `microbench` table on a topology.

    The topology is sized to the sweep's hosts and ranks per host when it does not give them.
    Rows are replayed independently (nccl-tests times one op at a time).
    """
    table = schema.conform("microbench", microbench)
    if table.num_rows == 0:
        raise ReplayError("the microbench table has no rows (no nccl-tests output was read)")
    spec = parse_spec(topology)
    rows = table.to_pylist()
    out: list[MicrobenchRow] = []
    built: dict[tuple[int, int], object] = {}
    for row in rows:
        op = str(row["op"] or "")
        n = int(row["nranks"] or 0)
        size = row["size_bytes"]
        measured_us = row["oop_time_us"]
        if not op or n < 1 or size is None or measured_us is None:
            continue
        per_host = int(row["ranks_per_host"] or min(n, spec.gpus))
        hosts = int(row["hosts"] or math.ceil(n / per_host))
        key = (hosts, per_host)
        if key not in built:
            sized = spec if spec.hosts else spec.replace(hosts=hosts)
            if per_host > sized.gpus:
                raise ReplayError(f"the sweep runs {per_host} ranks per host; topology {spec.name!r} has "
                                  f"{sized.gpus} GPUs per host")
            built[key] = build(sized)
        topo = built[key]
        gpu_of_rank = np.array([(r // per_host) * topo.spec.gpus + r % per_host for r in range(n)])
        inst = _instance(op, float(size), n, per_host, nccl_version=row.get("nccl_version"),
                         tests_version=row.get("tests_version"))
        dec = decompose_plan([inst], topo, gpu_of_rank, algo=algo)
        plan = dec.plans[0]
        if len(dec.flows):
            indptr, ids = route(topo, dec.flows)
            transfer = float(simulate(topo, indptr, ids, dec.flows).finish.max())
        else:
            transfer = 0.0
        predicted_ns = transfer * float(dec.fill[0]) + float(dec.latency_ns[0])
        predicted_us = max(predicted_ns / 1000.0, 1e-9)
        factor = busbw_factor(op, n)
        out.append(MicrobenchRow(
            op=op, size_bytes=int(size), nranks=n, measured_us=float(measured_us), predicted_us=predicted_us,
            measured_busbw=float(row["oop_busbw"]) if row["oop_busbw"] is not None
            else size / measured_us / 1000.0 * factor,
            predicted_busbw=size / predicted_us / 1000.0 * factor,
            algo=plan.algo if plan else "p2p", proto=plan.proto if plan else "Simple",
            channels=plan.channels if plan else 1, latency_bound=size < LATENCY_BOUND_BYTES))
    return out


def format_microbench(rows: list[MicrobenchRow]) -> str:
    """A table of predicted vs measured busbw per size."""
    lines = [f"{'op':<15}{'size':>12}{'measured':>11}{'predicted':>11}{'error':>8}  algo/proto"]
    for r in rows:
        err = f"{r.error:+.0%}" if math.isfinite(r.error) else "-"
        lines.append(f"{r.op:<15}{_size(r.size_bytes):>12}{r.measured_busbw:>10.1f} {r.predicted_busbw:>10.1f}"
                     f"{err:>8}  {r.algo}/{r.proto}{'  (latency-bound)' if r.latency_bound else ''}")
    lines.append("busbw in GB/s (out-of-place); latency-bound rows (< 64 MiB) are shown, not scored")
    return "\n".join(lines)


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def replay_nccl_tests(path: str | os.PathLike[str], topology: str | TopologySpec, *,
                      cache: str | os.PathLike[str] | None = None, algo: str = "auto") -> list[MicrobenchRow]:
    """`replay_microbench` on an nccl-tests output file (or a run directory holding its
    `microbench` table), ingested like any trace."""
    from tracekit.replay.engine import open_run  # engine imports this package's decompose

    run = open_run([path], cache=cache)
    if not run.has("microbench"):
        raise InputError(path, "no nccl-tests rows were read (the run has no microbench table)")
    return replay_microbench(run.table("microbench"), topology, algo=algo)
