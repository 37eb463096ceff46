"""Digests of what ingest writes for a fixed set of inputs (bundled samples, the real Kineto and
NCCL traces, made-up NCCL logs whose sources interleave ranks). `golden/ingest_digests.json` holds
the digests the object-per-marker Kineto parser and the copy-and-sort run merge gave; the
columnar and streamed versions must give the same tables, bit for bit.

Regenerate (only when an intended output change lands): python tests/parsers/ingest_digests.py
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from kineto_helpers import REAL as REAL_KINETO  # noqa: E402
from kineto_helpers import parse_into  # noqa: E402
from nccl_eras import Job, job_log, rank_log  # noqa: E402

from tracekit.errors import InputError  # noqa: E402
from tracekit.ingest import ingest  # noqa: E402
from tracekit.results import dumps  # noqa: E402
from tracekit.store import SMALL_TABLES, Run  # noqa: E402

ROOT = HERE.parents[1]
SAMPLES = ROOT / "sample_traces"
REAL_NCCL = REAL_KINETO.parent / "nccl_logs"
GOLDEN = HERE / "golden" / "ingest_digests.json"


def digest(table: pa.Table, tmp: Path | None = None) -> str:
    """sha256 of the schema and every row's values (the same tables give the same digest); the
    temporary directory `tmp`, the checkout's root and the real traces' root are left out of
    paths, so any worktree or CI checkout gives the same digests."""
    h = hashlib.sha256(str(table.schema).encode())
    text = repr(table.to_pylist())
    if tmp is not None:
        text = text.replace(str(tmp), "<tmp>")
    text = text.replace(str(REAL_KINETO.parent.resolve()), "<real>").replace(str(REAL_KINETO.parent), "<real>")
    h.update(text.replace(str(ROOT), "<repo>").encode())
    return f"{table.num_rows}:{h.hexdigest()[:24]}"


def kineto_files() -> list[Path]:
    files = sorted(SAMPLES.glob("*/*.pt.trace.json.gz"))
    files += sorted(p for p in REAL_KINETO.rglob("*") if p.is_file() and ".json" in p.name)
    return files


def parse_case(path: Path, tmp: Path) -> dict[str, str]:
    try:
        parsed = parse_into(path, tmp)
    except InputError as exc:
        return {"error": str(exc).replace(str(path), "<path>")}
    return {"events": digest(parsed.events), "collectives": digest(parsed.collectives),
            "groups": digest(parsed.groups), "stats": dumps(parsed.result.stats.counts(), indent=None, sort_keys=True)}


def _split_log(tmp: Path) -> list[Path]:
    """One node log cut in two at a line count: two sources of the same ranks, interleaving in time."""
    lines = job_log(Job("2.22", hosts=2, gpus=2, steps=90))
    cut = len(lines) * 2 // 3
    out = []
    for i, part in enumerate((lines[:cut], lines[cut:])):
        p = tmp / f"window{i}.log"
        p.write_text("\n".join(part) + "\n")
        out.append(p)
    return out


def _per_rank_logs(tmp: Path) -> list[Path]:
    """Per-process logs (2.17: algo on every rank) and a node log of two of the same ranks."""
    job = Job("2.17", hosts=2, gpus=2, steps=40)
    out = []
    for r in range(job.nranks):
        p = tmp / f"proc{r}.log"
        p.write_text("\n".join(rank_log(job, r)) + "\n")
        out.append(p)
    return out


def run_cases() -> dict[str, Callable[[Path], list[Path]]]:
    cases: dict[str, Callable[[Path], list[Path]]] = {}
    for folder in sorted(p for p in SAMPLES.iterdir() if p.is_dir()):
        cases[f"samples/{folder.name}"] = lambda _t, f=folder: [f]
    for folder in sorted(p for p in REAL_NCCL.iterdir() if p.is_dir()) if REAL_NCCL.is_dir() else []:
        cases[f"nccl_logs/{folder.name}"] = lambda _t, f=folder: sorted(
            p for p in f.iterdir() if p.name not in ("PROVENANCE.md", "metadata.json"))
    if (REAL_KINETO / "param_dlrm_kineto_8rank").is_dir():
        cases["kineto/param_dlrm_kineto_8rank"] = lambda _t: [REAL_KINETO / "param_dlrm_kineto_8rank"]
    cases["made/split_node_log"] = _split_log
    cases["made/per_rank_logs"] = _per_rank_logs
    cases["made/split_and_per_rank"] = lambda t: _split_log(t) + _per_rank_logs(t)
    return cases


def run_case(make: Callable[[Path], list[Path]], tmp: Path) -> dict[str, str]:
    src = tmp / "in"
    src.mkdir()
    report = ingest(make(src), tmp / "run", jobs=1)
    run = Run(tmp / "run")
    out = {name: digest(run.table(name), tmp) for name in SMALL_TABLES if run.has(name)}
    out["events"] = digest(run.events())
    out["warnings"] = json.dumps(report.warnings)
    return out


def compute(only: set[str] | None = None) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for path in kineto_files():
        name = "parse/" + str(path.relative_to(ROOT if path.is_relative_to(ROOT) else REAL_KINETO.parent))
        if only is not None and name not in only:
            continue
        with tempfile.TemporaryDirectory() as t:
            out[name] = parse_case(path, Path(t))
    for name, make in run_cases().items():
        if only is not None and name not in only:
            continue
        with tempfile.TemporaryDirectory() as t:
            out[name] = run_case(make, Path(t))
    return out


if __name__ == "__main__":
    GOLDEN.write_text(json.dumps(compute(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")
