"""Snapshot every command's output on the bundled samples and the real traces, to show that a
change which should not change behaviour did not.

    python tests/golden_outputs.py write DIR [JOBS] [NAME_PART...]   # run the commands, store stdout/stderr/exit
    python tests/golden_outputs.py compare BASE NEW [--stderr]       # the cases of NEW whose outputs differ

Paths that differ between checkouts (the repository, the real traces, the temporary runs) are
replaced by placeholders, so two checkouts of the same behaviour give identical snapshots.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REAL = (REPO.parent / "shared" / "real_traces").resolve()
ALT = "fat-tree:nic_gbps=100,oversub=4"
README_TOPOLOGIES = ["rail-optimized:nic_gbps=400", "rail-optimized:nic_gbps=400,sharp=true", ALT]
WHATIF = ["eplb:redundant=8", "eplb:redundant=8,compute=_expert_", "placement:pp-adjacent",
          "checkpoint:bytes_per_rank=1GB,every=2,at=0.5,via=backend,storage=4"]


def inputs() -> list[tuple[str, Path]]:
    found = [("sample/synth_moe_16rank", REPO / "sample_traces/synth_moe_16rank"),
             ("sample/gloo_moe_8rank", REPO / "sample_traces/gloo_moe_8rank")]
    if REAL.is_dir():
        for kind in sorted(p for p in REAL.iterdir() if p.is_dir()):
            for item in sorted(kind.iterdir()):
                if item.name != "PROVENANCE.md":
                    found.append((f"real/{kind.name}/{item.name}", item))
    return found


def commands(name: str, path: Path, run: str) -> list[tuple[str, list[str]]]:
    if "nccl_tests" in name:
        return [("replay-nccl-tests", ["replay", "--nccl-tests", str(path), "--topology",
                                        "rail-optimized:hosts=2,gpus=8,nic_gbps=400", "--json"]),
                ("replay-nccl-tests-text", ["replay", "--nccl-tests", str(path), "--topology",
                                             "rail-optimized:hosts=2,gpus=8,nic_gbps=400"]),
                ("ingest", ["ingest", str(path), "-o", run]),
                ("info", ["info", run, "--json"])]
    cmds = [("ingest", ["ingest", str(path), "-o", run]),
            ("info", ["info", run, "--json"]), ("info-text", ["info", run]),
            ("analyze", ["analyze", run, "--json"]), ("analyze-text", ["analyze", run])]
    topologies = README_TOPOLOGIES if name.startswith("sample/synth") else ["rail-optimized", ALT]
    topo_args = [a for t in topologies for a in ("--topology", t)]
    scenarios = WHATIF if name.startswith("sample/synth") else [w for w in WHATIF if "compute=" not in w]
    cmds += [("replay", ["replay", run, *topo_args, "--json"]), ("replay-text", ["replay", run, *topo_args]),
             ("hang", ["hang", run, "--json"]), ("hang-text", ["hang", run]),
             ("whatif", ["whatif", run, *scenarios, "--topology", topologies[0], "--json"]),
             ("whatif-text", ["whatif", run, *scenarios, "--topology", topologies[0]])]
    return cmds


def _normalise(text: str, run: str) -> str:
    for old, new in ((run, "<RUN>"), (str(REAL), "<REAL>"), (str(REPO), "<REPO>"),
                     (tempfile.gettempdir(), "<TMP>")):
        text = text.replace(old, new)
    return text


def _one(name: str, path: Path) -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = {}
    work = Path(tempfile.mkdtemp(prefix="tk-golden-"))
    run = str(work / "run")
    env = {**os.environ, "TRACEKIT_NO_PROGRESS": "1", "COLUMNS": "200"}
    try:
        for label, args in commands(name, path, run):
            proc = subprocess.run([sys.executable, "-m", "tracekit", *args], capture_output=True, text=True,
                                  env=env, cwd=work, timeout=900)
            out[label] = {"exit": proc.returncode, "stdout": _normalise(proc.stdout, run),
                          "stderr": _normalise(proc.stderr, run)}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def write(target: Path, jobs: int = 2, only: list[str] | None = None) -> None:
    target.mkdir(parents=True, exist_ok=True)
    chosen = [(n, p) for n, p in inputs() if not only or any(part in n for part in only)]
    with concurrent.futures.ProcessPoolExecutor(jobs) as pool:
        futures = {pool.submit(_one, name, path): name for name, path in chosen}
        for fut in concurrent.futures.as_completed(futures):
            name = futures[fut]
            (target / (name.replace("/", "__") + ".json")).write_text(json.dumps(fut.result(), indent=1))
            print("wrote", name, flush=True)


def compare(a: Path, b: Path, *, stderr: bool = False) -> int:
    differ = 0
    for fb in sorted(b.glob("*.json")):
        fa = a / fb.name
        if not fa.exists():
            print(f"missing in {a}: {fb.name}")
            differ += 1
            continue
        da, db = json.loads(fa.read_text()), json.loads(fb.read_text())
        for label in sorted(set(da) | set(db)):
            keys = ("exit", "stdout", "stderr") if stderr else ("exit", "stdout")
            if label not in da or label not in db or any(da[label][k] != db[label][k] for k in keys):
                print(f"DIFFERS {fa.stem} {label}")
                differ += 1
    print(f"{differ} case(s) differ")
    return 1 if differ else 0


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "write":
        write(Path(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 2, sys.argv[4:])
    elif len(sys.argv) >= 4 and sys.argv[1] == "compare":
        sys.exit(compare(Path(sys.argv[2]), Path(sys.argv[3]), stderr="--stderr" in sys.argv))
    else:
        print(__doc__)
        sys.exit(2)
