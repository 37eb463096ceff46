"""Replay of microbenchmark sweeps (nccl-tests) against their measured bandwidth.

Each row of the `microbench` table (one op at one size on `nranks` ranks, `ranks_per_host` per
host) is one collective on the topology: decomposed as NCCL would run it (`decompose_plan`),
simulated alone, its transfer time stretched by its pipeline fill and NCCL's latency added. The
predicted bus bandwidth uses nccl-tests' own factors, so it compares with the measured one.
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa

from tracekit import schema
from tracekit._limits import MAX_WORLD_SIZE, checked_int
from tracekit.errors import TracekitError
from tracekit.finding import Finding
from tracekit.replay import hardware
from tracekit.replay.decompose import Instance, decompose_plan
from tracekit.replay.simulate import route, simulate
from tracekit.replay.topology import TopologySpec, build, parse_spec, with_gpu
from tracekit.results import Result


class ReplayError(TracekitError):
    """A microbenchmark table cannot be replayed on the topology."""


LATENCY_BOUND_BYTES = 64 * 2**20  # below this a row is reported as latency-bound, not scored
#: A table whose measured busbw at large sizes is below this fraction of the model's is degraded.
DEGRADED_BELOW = 0.5
#: Without rows of 64 MiB and up, the health of a table rests on this many of its largest sizes.
LARGEST_SIZES = 3
FLOOR_BYTES = 64 * 2**10  # rows at or below this size measure a table's fixed cost
HIGH_FLOOR_RATIO = 2.0  # a measured floor this many times the model's is reported
MIB = 2**20
#: Size bands of the error table: (name, smallest, largest size in bytes), nccl-tests sizes inclusive.
BANDS = (("<= 1 MiB", 0, MIB), ("1-64 MiB", MIB + 1, 64 * MIB - 1), (">= 64 MiB", 64 * MIB, 2**62))

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


class MicrobenchRowSummary(Result, frozen=True, kw_only=True):
    """One size of a sweep as `replay --nccl-tests --json` gives it: measured vs predicted
    (out-of-place), bandwidths in GB/s."""

    source: str = ""  # the nccl-tests file the row was read from
    table: int = 0  # index of its table (one test's sweep) in that file
    test: str = ""  # the test binary, e.g. all_reduce_perf
    op: str
    size_bytes: int
    measured_busbw: float
    predicted_busbw: float
    measured_us: float
    predicted_us: float
    algo: str
    proto: str
    channels: int
    latency_bound: bool
    modelled: bool = True  # False when the model has no flows and no latency for the op (nothing predicted)
    gpu: str = ""  # the hardware profile the row was replayed with (hardware.GPUS)


@dataclass(frozen=True)
class MicrobenchRow:
    """One size of a sweep: its `summary` (the JSON) and the ranks it ran on, which the JSON leaves
    out (the table gives them)."""

    summary: MicrobenchRowSummary
    nranks: int

    @property
    def source(self) -> str:
        return self.summary.source

    @property
    def table(self) -> int:
        return self.summary.table

    @property
    def test(self) -> str:
        return self.summary.test

    @property
    def op(self) -> str:
        return self.summary.op

    @property
    def size_bytes(self) -> int:
        return self.summary.size_bytes

    @property
    def measured_busbw(self) -> float:
        return self.summary.measured_busbw

    @property
    def predicted_busbw(self) -> float:
        return self.summary.predicted_busbw

    @property
    def measured_us(self) -> float:
        return self.summary.measured_us

    @property
    def predicted_us(self) -> float:
        return self.summary.predicted_us

    @property
    def algo(self) -> str:
        return self.summary.algo

    @property
    def proto(self) -> str:
        return self.summary.proto

    @property
    def channels(self) -> int:
        return self.summary.channels

    @property
    def latency_bound(self) -> bool:
        return self.summary.latency_bound

    @property
    def modelled(self) -> bool:
        return self.summary.modelled

    @property
    def gpu(self) -> str:
        return self.summary.gpu

    @property
    def error(self) -> float:
        """predicted / measured busbw - 1."""
        return self.predicted_busbw / self.measured_busbw - 1.0 if self.measured_busbw > 0 else math.nan

    @property
    def timed_busbw(self) -> float:
        """The measured busbw from the time (nccl-tests prints it with two decimals: 0.00 at small sizes)."""
        return self.size_bytes / self.measured_us / 1000.0 * busbw_factor(self.op, self.nranks)

    @property
    def time_error(self) -> float:
        """measured / predicted time - 1: the busbw error from the times, so rows nccl-tests prints as
        0.00 GB/s are scored too (NaN for a row the model does not predict)."""
        if not self.modelled or self.predicted_us <= 0 or self.measured_us <= 0:
            return math.nan
        return self.measured_us / self.predicted_us - 1.0


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
    given = parse_spec(topology)
    rows = table.to_pylist()
    devices = _devices_by_source(rows)
    out: list[MicrobenchRow] = []
    built: dict[tuple[int, int], object] = {}
    for row in rows:
        if not_replayable(row) is not None:
            continue
        op, n, size, measured_us = str(row["op"]), int(row["nranks"]), row["size_bytes"], row["oop_time_us"]
        spec = with_gpu(given, devices.get(row.get("source")))
        per_host = int(row["ranks_per_host"] or min(n, spec.gpus))
        hosts = int(row["hosts"] or math.ceil(n / per_host))
        key = (hosts, per_host, spec.gpu)
        if key not in built:
            sized = spec if spec.hosts else spec.replace(hosts=hosts)
            where = f"{row['source']}: " if row.get("source") else ""
            if per_host > sized.gpus:
                raise ReplayError(f"{where}the sweep runs {per_host} ranks per host; topology {spec.name!r} has "
                                  f"{sized.gpus} GPUs per host")
            if hosts * per_host > sized.hosts * sized.gpus:
                raise ReplayError(f"{where}the sweep runs on {hosts} hosts x {per_host} ranks; topology "
                                  f"{spec.name!r} has {sized.hosts} hosts x {sized.gpus} GPUs (leave hosts= out "
                                  "to size it to each sweep)")
            built[key] = build(sized)
        topo = built[key]
        gpu_of_rank = np.array([(r // per_host) * topo.spec.gpus + r % per_host for r in range(n)])
        inst = _instance(op, float(size), n, per_host, nccl_version=row.get("nccl_version"),
                         tests_version=row.get("tests_version"))
        dec = decompose_plan([inst], topo, gpu_of_rank, algo=algo)
        plan = dec.plans[0]
        if len(dec.flows):
            # NCCL's latency (added below) already counts every hop: simulate the bandwidth alone
            flows = dataclasses.replace(dec.flows, lat_mult=np.zeros(len(dec.flows)))
            indptr, ids = route(topo, flows)
            transfer = float(simulate(topo, indptr, ids, flows).finish.max())
        else:
            transfer = 0.0
        predicted_ns = transfer * float(dec.fill[0]) + float(dec.latency_ns[0])
        modelled = predicted_ns > 0
        predicted_us = max(predicted_ns / 1000.0, 1e-9)
        factor = busbw_factor(op, n)
        out.append(MicrobenchRow(MicrobenchRowSummary(
            op=op, size_bytes=int(size), measured_us=float(measured_us), predicted_us=predicted_us,
            measured_busbw=float(row["oop_busbw"]) if row["oop_busbw"] is not None
            else size / measured_us / 1000.0 * factor,
            predicted_busbw=size / predicted_us / 1000.0 * factor,
            algo=plan.algo if plan else "p2p", proto=plan.proto if plan else "Simple",
            channels=plan.channels if plan else 1, latency_bound=size < LATENCY_BOUND_BYTES,
            source=str(row.get("source") or ""), table=int(row.get("run") or 0), test=str(row.get("test") or ""),
            modelled=modelled, gpu=topo.spec.gpu), nranks=n))
    return out


def not_replayable(row: dict[str, Any]) -> str | None:
    """Why `replay_microbench` cannot replay a `microbench` row, or None when it can (the one rule,
    used to skip rows and to name them in `unreplayable`)."""
    if not row.get("op"):
        return "its op is unknown"
    if not row.get("nranks") or row["nranks"] < 1:
        return "its rank count is unknown (no device lines, and the columns do not tell it)"
    if checked_int(row["nranks"], "world_size") is None:
        return f"its rank count {row['nranks']} is beyond {MAX_WORLD_SIZE:,}"
    if row.get("size_bytes") is None:
        return "its size is missing"
    if row.get("oop_time_us") is None:
        return "it has no out-of-place time"
    return None


def _devices_by_source(rows: list[dict[str, Any]]) -> dict[Any, str]:
    """Per nccl-tests file, the first device line naming a GPU a profile knows."""
    found: dict[Any, str] = {}
    for row in rows:
        if row.get("source") in found:
            continue
        for device in row.get("devices") or ():
            if device and hardware.gpu_from_device(device):
                found[row.get("source")] = str(device)
                break
    return found


def format_microbench(rows: list[MicrobenchRow]) -> str:
    """A table of predicted vs measured busbw per size."""
    lines = [f"{'op':<15}{'size':>12}{'measured':>11}{'predicted':>11}{'error':>8}  algo/proto"]
    for r in rows:
        if not r.modelled:
            lines.append(f"{r.op:<15}{_size(r.size_bytes):>12}{r.measured_busbw:>10.1f} {'-':>10}{'-':>8}  "
                         "not modelled")
            continue
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


# ------------------------------------------------------------------------------------------
# Health of a measured run: one verdict per nccl-tests table, and the error by file, op and band


Verdict = Literal["healthy", "degraded", "unknown"]


class Health(Result, frozen=True, kw_only=True):
    """How a table's measured busbw compares with the model at its large sizes.

    `measured_over_predicted` is the median over those rows of measured / predicted busbw (from the
    times); below `DEGRADED_BELOW` the run is `degraded`. `unknown` when the model predicts no row.
    """

    verdict: Verdict
    measured_over_predicted: float | None
    measured_busbw: float | None  # median over the rows scored, GB/s
    predicted_busbw: float | None
    sizes: str  # which rows were scored: ">= 64 MiB", or "the 3 largest sizes"
    rows: int


class LatencyFloor(Result, frozen=True, kw_only=True):
    """What a table's smallest messages (<= `FLOOR_BYTES`) take against the model, whose fixed
    cost is NCCL's latency constants (tuning.cc). `high` at `HIGH_FLOOR_RATIO` and above;
    `net_latency_us` is then the per-hop network latency (the spec field NCCL calls the net
    plugin's `latency`) that makes the model meet the measured floor, None on one host."""

    measured_us: float  # median over the rows
    predicted_us: float
    rows: int
    high: bool
    net_latency_us: float | None = None


class BenchTable(Result, frozen=True, kw_only=True):
    """One nccl-tests table (one test's sweep: a (source, run, test) block of `microbench`)."""

    source: str
    table: int
    test: str
    op: str
    nranks: int
    health: Health
    latency_floor: LatencyFloor | None = None


class ErrorBand(Result, frozen=True, kw_only=True):
    """The busbw error (predicted / measured - 1, from the times) of one file, op and size band."""

    source: str
    op: str
    band: str
    rows: int
    median_abs_error: float
    median_error: float
    worst_error: float


class MicrobenchSummary(Result, frozen=True, kw_only=True):
    """What `tracekit replay --nccl-tests --json` prints."""

    topology: str
    path: str
    rows: tuple[MicrobenchRowSummary, ...] = ()
    tables: tuple[BenchTable, ...] = ()
    bands: tuple[ErrorBand, ...] = ()
    findings: tuple[Finding, ...] = ()
    profiles: tuple[str, ...] = ()


@dataclass(frozen=True)
class MicrobenchReport:
    """nccl-tests outputs replayed on a topology: every row, a health verdict per table, the error
    by file, op and size band, and the physics caps that bind on the topology."""

    topology: str
    path: str
    rows: tuple[MicrobenchRow, ...]
    tables: tuple[BenchTable, ...]
    bands: tuple[ErrorBand, ...]
    findings: tuple[Finding, ...] = field(default=())
    profiles: tuple[str, ...] = field(default=())  # the hardware profile(s) the rows ran with, one line each

    @property
    def sources(self) -> list[str]:
        """The files read, in the order their rows came."""
        return list(dict.fromkeys(r.source for r in self.rows))

    @property
    def summary(self) -> MicrobenchSummary:
        return MicrobenchSummary(topology=self.topology, path=self.path, rows=tuple(r.summary for r in self.rows),
                                 tables=self.tables, bands=self.bands, findings=self.findings, profiles=self.profiles)


def table_health(rows: Sequence[MicrobenchRow]) -> Health:
    """The verdict on one table from its rows at the large sizes (>= 64 MiB, else its largest sizes),
    where bandwidth, not latency, sets the time and the model is closest to NCCL."""
    scored = [r for r in rows if r.modelled and r.measured_us > 0 and r.predicted_us > 0]
    large = [r for r in scored if r.size_bytes >= LATENCY_BOUND_BYTES]
    sizes = ">= 64 MiB"
    if not large and scored:
        biggest = sorted({r.size_bytes for r in scored})[-LARGEST_SIZES:]
        large = [r for r in scored if r.size_bytes in biggest]
        sizes = f"the {len(biggest)} largest sizes" if len(biggest) > 1 else "the largest size"
    if not large:
        return Health(verdict="unknown", measured_over_predicted=None, measured_busbw=None, predicted_busbw=None,
                      sizes="", rows=0)
    ratio = statistics.median(r.predicted_us / r.measured_us for r in large)
    measured = statistics.median(r.timed_busbw for r in large)
    predicted = statistics.median(r.predicted_busbw for r in large)
    return Health(verdict="degraded" if ratio < DEGRADED_BELOW else "healthy", measured_over_predicted=ratio,
                  measured_busbw=measured, predicted_busbw=predicted, sizes=sizes, rows=len(large))


TableKey = tuple[str, int, str]  # (source, table, test): one nccl-tests table


def table_blocks(rows: Sequence[MicrobenchRow]) -> dict[TableKey, list[MicrobenchRow]]:
    """The rows of each nccl-tests table, in the order of the rows."""
    blocks: dict[TableKey, list[MicrobenchRow]] = {}
    for r in rows:
        blocks.setdefault((r.source, r.table, r.test), []).append(r)
    return blocks


def bench_tables(rows: Sequence[MicrobenchRow],
                 floors: Mapping[TableKey, LatencyFloor | None] | None = None) -> list[BenchTable]:
    """One `BenchTable` per (source, table, test) block, in the order of the rows, with its
    latency floor when `floors` has one."""
    return [BenchTable(source=source, table=table, test=test, op=part[0].op, nranks=part[0].nranks,
                       health=table_health(part), latency_floor=(floors or {}).get((source, table, test)))
            for (source, table, test), part in table_blocks(rows).items()]


def error_bands(rows: Sequence[MicrobenchRow]) -> list[ErrorBand]:
    """The error of the modelled rows by file, op and size band (`BANDS`), in the order of the rows."""
    out = []
    keys = dict.fromkeys((r.source, r.op) for r in rows if r.modelled)
    for source, op in keys:
        for band, low, high in BANDS:
            errors = [e for r in rows if r.source == source and r.op == op and low <= r.size_bytes <= high
                      and math.isfinite(e := r.time_error)]
            if errors:
                out.append(ErrorBand(source=source, op=op, band=band, rows=len(errors),
                                     median_abs_error=statistics.median(abs(e) for e in errors),
                                     median_error=statistics.median(errors), worst_error=max(errors, key=abs)))
    return out


def microbench_report(rows: Sequence[MicrobenchRow], topology: str, *, path: str = "",
                      findings: Sequence[Finding] = (),
                      floors: Mapping[TableKey, LatencyFloor | None] | None = None) -> MicrobenchReport:
    """Rows replayed by `replay_microbench`, with their tables' health (and latency floors) and the
    error bands."""
    given = parse_spec(topology)
    profiles = tuple(dict.fromkeys(hardware.describe_profile(with_gpu(given, r.gpu or None)) for r in rows))
    return MicrobenchReport(topology=topology, path=path, rows=tuple(rows), tables=tuple(bench_tables(rows, floors)),
                            bands=tuple(error_bands(rows)), findings=tuple(findings), profiles=profiles)


def nccl_tests_report(microbench: pa.Table, topology: str, *, path: str | os.PathLike[str] = "",
                      algo: str = "auto") -> MicrobenchReport:
    """The rows of a `microbench` table (an nccl-tests output file, or a folder of them, at
    `path`) replayed on `topology`: `microbench_report` plus the physics caps that bind on the
    topology (`tracekit.workflows.nccl_tests` reads the table from the files)."""
    from tracekit.replay.topology import physics_caps

    rows = replay_microbench(microbench, topology, algo=algo)
    skipped = unreplayable(microbench)
    if not rows and skipped:
        raise ReplayError(skipped[0].text)
    spec = with_gpu(parse_spec(topology), rows[0].gpu if rows else None)
    floors = {key: latency_floor(microbench, key, part, topology, algo=algo)
              for key, part in table_blocks(rows).items()}
    return microbench_report(rows, topology, path=os.fspath(path), findings=[*skipped, *physics_caps(spec)],
                             floors=floors)


def latency_floor(microbench: pa.Table, key: TableKey, rows: Sequence[MicrobenchRow],
                  topology: str | TopologySpec, *, algo: str = "auto") -> LatencyFloor | None:
    """The fixed cost one table (`key`, its replayed `rows`) measures at its smallest sizes against
    the model's, and, when it is `HIGH_FLOOR_RATIO` or more times the model's on a table that
    crosses hosts, the per-hop `net_latency_us` that meets it. The model's fixed cost is linear in
    that field while the algorithm holds, so two replays give the slope and a third checks the answer."""
    small = [r for r in rows if r.modelled and r.size_bytes <= FLOOR_BYTES]
    if not small:
        return None
    measured = statistics.median(r.measured_us for r in small)
    predicted = statistics.median(r.predicted_us for r in small)
    high = measured >= HIGH_FLOOR_RATIO * predicted
    floor = LatencyFloor(measured_us=measured, predicted_us=predicted, rows=len(small), high=high)
    if not high:
        return floor
    source, table, _ = key
    sizes = {r.size_bytes for r in small}
    microbench = schema.conform("microbench", microbench)
    part = pa.Table.from_pylist([row for row in microbench.to_pylist() if str(row["source"] or "") == source
                                 and int(row["run"] or 0) == table and row["size_bytes"] in sizes],
                                schema=microbench.schema)
    if part.num_rows == 0:
        return floor
    spec = parse_spec(topology)

    def floor_at(net_latency_us: float) -> float:
        got = replay_microbench(part, spec.replace(net_latency_us=net_latency_us), algo=algo)
        return statistics.median(r.predicted_us for r in got)

    base = spec.net_latency_us
    step = 100.0
    slope = (floor_at(base + step) - predicted) / step
    if slope <= 0:
        return floor
    guess = max(0.0, base + (measured - predicted) / slope)
    got = floor_at(guess)
    if abs(got - measured) > 0.1 * measured and got != predicted:
        guess = max(0.0, guess + (measured - got) * (guess - base) / (got - predicted))
    return LatencyFloor(measured_us=measured, predicted_us=predicted, rows=len(small), high=True,
                        net_latency_us=round(guess, 1))


def unreplayable(microbench: pa.Table) -> list[Finding]:
    """One `microbench` warning per table and reason for the rows `replay_microbench` skips
    (`not_replayable`), so none drops silently."""
    counts: dict[tuple[str, int, str, str], int] = {}
    for row in schema.conform("microbench", microbench).to_pylist():
        if (why := not_replayable(row)) is not None:
            key = (str(row["source"] or ""), int(row["run"] or 0), str(row["test"] or "unknown test"), why)
            counts[key] = counts.get(key, 0) + 1
    return [Finding("microbench", f"{source}: table {table} ({test}): {n} row{'s' if n != 1 else ''} not replayed: "
                    f"{why}", severity="warning", data={"source": source, "table": table, "rows": n})
            for (source, table, test, why), n in counts.items()]


def is_folder(report: MicrobenchReport) -> bool:
    """Whether the report covers several files (then the error table by file replaces the rows)."""
    return len(report.sources) > 1 or Path(report.path).is_dir()
