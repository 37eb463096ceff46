"""nccl-tests sweeps in a run: the busbw per size and the peak, per table (one test invocation).

A run ingested from nccl-tests output holds no ranks, events or collectives, only `microbench`
rows; this turns them into typed results that `info`, `analyze` and the report show, so such a
run is not "empty". The numbers are the ones nccl-tests printed, not recomputed.
"""

from __future__ import annotations

import pyarrow as pa

from tracekit._text import fmt_bytes, fmt_rate
from tracekit.finding import Finding
from tracekit.results import Result
from tracekit.store import Run


class MicrobenchSize(Result):
    """One row of an nccl-tests table: the size and what each side (out-of-place, in-place) measured."""

    size_bytes: int
    oop_time_us: float | None
    oop_busbw_gbps: float | None
    ip_time_us: float | None
    ip_busbw_gbps: float | None
    wrong: int | None


class MicrobenchRun(Result):
    """One nccl-tests table (one test binary on one set of ranks) and its peak busbw over sizes and sides."""

    source: str
    table: int
    test: str | None
    op: str | None
    dtype: str | None
    redop: str | None
    nranks: int | None
    hosts: int | None
    ranks_per_host: int | None
    host_names: list[str]
    devices: list[str]
    sizes: list[MicrobenchSize]
    peak_busbw_gbps: float | None
    peak_size_bytes: int | None
    peak_side: str | None  # "out-of-place" or "in-place"

    def headline(self) -> str:
        """ "nccl-tests all_reduce_perf (float sum) on 16 ranks, 2 hosts x 8: peak busbw 339 GB/s at 8.59 GB
        (out-of-place), 31 sizes"."""
        what = " ".join(x for x in (self.dtype, self.redop) if x)
        where = f"{self.nranks} ranks" if self.nranks else "ranks not printed"
        if self.hosts:
            where += f", {self.hosts} host{'s' if self.hosts != 1 else ''}"
            if self.ranks_per_host:
                where += f" x {self.ranks_per_host}"
        peak = ("no busbw printed" if self.peak_busbw_gbps is None else
                f"peak busbw {fmt_rate(self.peak_busbw_gbps)} at {fmt_bytes(self.peak_size_bytes)} ({self.peak_side})")
        return (f"nccl-tests {self.test or 'test not named'}{f' ({what})' if what else ''} on {where}: {peak}, "
                f"{len(self.sizes)} size{'s' if len(self.sizes) != 1 else ''}")


def microbench_runs(microbench: pa.Table) -> list[MicrobenchRun]:
    """The `microbench` table as one `MicrobenchRun` per (source, table), in the order they were read."""
    rows = microbench.to_pylist()
    by_table: dict[tuple[str, int], list[dict]] = {}
    for r in rows:
        by_table.setdefault((str(r["source"]), int(r["run"] or 0)), []).append(r)
    out = []
    for (source, table), rs in by_table.items():
        first = rs[0]
        sizes = [MicrobenchSize(size_bytes=int(r["size_bytes"]), oop_time_us=r["oop_time_us"],
                                oop_busbw_gbps=r["oop_busbw"], ip_time_us=r["ip_time_us"],
                                ip_busbw_gbps=r["ip_busbw"],
                                wrong=None if r["oop_wrong"] is None and r["ip_wrong"] is None
                                else int((r["oop_wrong"] or 0) + (r["ip_wrong"] or 0)))
                 for r in rs if r["size_bytes"] is not None]
        sides = [(s.oop_busbw_gbps, s.size_bytes, "out-of-place") for s in sizes if s.oop_busbw_gbps is not None]
        sides += [(s.ip_busbw_gbps, s.size_bytes, "in-place") for s in sizes if s.ip_busbw_gbps is not None]
        peak = max(sides, key=lambda x: (x[0], -x[1]), default=(None, None, None))
        out.append(MicrobenchRun(
            source=source, table=table, test=first["test"], op=first["op"], dtype=first["dtype"],
            redop=first["redop"], nranks=first["nranks"], hosts=first["hosts"], ranks_per_host=first["ranks_per_host"],
            host_names=sorted({h for h in first.get("host_names") or [] if h is not None}),
            devices=sorted({d for d in first["devices"] or [] if d is not None}),
            sizes=sizes, peak_busbw_gbps=peak[0], peak_size_bytes=peak[1], peak_side=peak[2]))
    return out


def microbench_findings(runs: list[MicrobenchRun]) -> list[Finding]:
    """One finding per nccl-tests table: its peak busbw, and the command that replays it."""
    return [Finding(kind="microbench", text=f"{r.headline()}; `tracekit replay --nccl-tests {r.source} --topology T` "
                    "predicts it on a topology", value=r.peak_busbw_gbps,
                    data={"source": r.source, "table": r.table, "test": r.test}) for r in runs]


def replay_hint(run: Run, topology: str = "T") -> str | None:
    """For a run that holds nccl-tests tables and no collective call, the command that replays
    them (`tracekit replay RUN` replays collectives, which such a run lacks); else None."""
    if run.table("collectives").num_rows or not run.has("microbench"):
        return None
    runs = microbench_runs(run.table("microbench"))
    if not runs:
        return None
    sources = list(dict.fromkeys(r.source for r in runs))
    cmds = " or ".join(f"`tracekit replay --nccl-tests {s} --topology {topology}`" for s in sources)
    return (f"{run.path} holds nccl-tests output ({sum(len(r.sizes) for r in runs)} rows in {len(runs)} "
            f"table{'s' if len(runs) != 1 else ''}) and no collective calls to replay; replay the sweep with {cmds}")
