"""Whether a run is CPU/gloo: the one place that decides, with the evidence.

tracekit's network model is NCCL on GPU fabrics (NVLink, NICs, switches). A run whose collectives
all went through gloo and that has no GPU activity moved its bytes over TCP between CPU processes;
replaying it on a GPU topology and calibrating the model to its times (x1,000 and more) gives what-if
numbers that mean nothing. `replay` and `whatif` ask `cpu_backend` first and, when it answers,
report the finding instead of modelled times.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

import pyarrow as pa
import pyarrow.compute as pc

from tracekit.finding import Finding

#: Backend names that drive a GPU (PyTorch writes "cpu:gloo,cuda:nccl" for a group with both).
GPU_BACKENDS = ("nccl", "rccl", "xccl", "hccl", "cuda", "ucc", "mpi")


def _backends(tables: Mapping[str, pa.Table]) -> Counter[str]:
    """Backend per process group that carried a collective (every group when the collectives name
    none; the ranks' own backend without a groups table)."""
    groups = tables.get("groups")
    if groups is not None and groups.num_rows and "backend" in groups.column_names:
        names = [str(g) for g in groups.column("group").to_pylist()]
        backends = [str(b).lower() if b is not None else "" for b in groups.column("backend").to_pylist()]
        coll = tables.get("collectives")
        used = set()
        if coll is not None and coll.num_rows and "group" in coll.column_names:
            used = {str(g) for g in pc.unique(coll.column("group")).to_pylist() if g is not None}
        return Counter(b for g, b in zip(names, backends, strict=True) if not used or g in used)
    ranks = tables.get("ranks")
    if ranks is not None and ranks.num_rows and "backend" in ranks.column_names:
        return Counter(str(b).lower() if b is not None else "" for b in ranks.column("backend").to_pylist())
    return Counter()


def _gloo_only(backend: str) -> bool:
    return "gloo" in backend and not any(g in backend for g in GPU_BACKENDS)


def cpu_backend(tables: Mapping[str, pa.Table]) -> Finding | None:
    """A `cpu_backend` finding when the run is CPU/gloo, else None.

    CPU/gloo means both: every process group that carried a collective is gloo (and no GPU backend),
    and no event ran on a GPU lane (no kernel, memcpy or memset). A GPU run with a gloo side group for
    barriers is not one; nor is a run whose backend is unknown (no evidence either way).
    """
    backends = _backends(tables)
    if not backends or not all(_gloo_only(b) for b in backends):
        return None
    events = tables.get("events")
    n_events = events.num_rows if events is not None else 0
    gpu_events = 0
    if n_events and "lane" in events.column_names:
        lanes = pc.cast(events.column("lane"), pa.string())
        gpu_events = int(pc.sum(pc.cast(pc.fill_null(pc.starts_with(lanes, "gpu"), False), pa.int64())).as_py() or 0)
    if gpu_events:
        return None
    groups = sum(backends.values())
    names = ", ".join(sorted(backends))
    seen = f"no GPU event among {n_events:,}" if n_events else "no GPU events"
    where = f"all {groups} process groups" if groups > 1 else "its one process group"
    text = (f"this is a CPU/gloo run (backend {names} on {where}, {seen}): the network model is NCCL on GPU "
            "fabrics and does not apply, so there are no modelled or calibrated what-if times")
    return Finding(kind="cpu_backend", text=text, severity="warning",
                   data={"backends": dict(backends), "groups": groups, "events": n_events, "gpu_events": gpu_events})
