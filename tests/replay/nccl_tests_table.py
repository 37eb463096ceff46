"""Print the replay's busbw error on every real nccl-tests output as Markdown tables (docs/hardware.md).

Runnable script, not a test: each file is replayed with `python -m tracekit replay --nccl-tests FILE
--topology SPEC --json` on the spec that describes its hardware (PROVENANCE.md in the traces folder), and
the error of the out-of-place busbw is summarised by op and size band as the median |error|.

    python tests/replay/nccl_tests_table.py [--traces DIR] [--cache DIR] [--rows]

The error is predicted / measured busbw - 1, computed from the times (busbw is size / time times a
factor that both sides share), so rows whose printed busbw rounds to 0.00 are scored too.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

MIB = 2**20
DEFAULT_TRACES = Path(__file__).resolve().parents[3] / "shared" / "real_traces" / "nccl_tests"
FALLBACK_TRACES = Path("/work/shared/real_traces/nccl_tests")


@dataclass(frozen=True)
class Case:
    """One nccl-tests file replayed on one topology spec; `primary` marks the spec that describes the hardware."""

    file: str
    spec: str
    hardware: str
    primary: bool = True


CASES = (
    Case("all_reduce_perf_2node_16xH100.txt", "rail-optimized:gpus=8,nic_gbps=200",
         "2 GCP A3-Mega x 8 H100, 8 x 200 Gb/s GPU NICs per host (GPUDirect-TCPXO)"),
    Case("nvidia_exemplar_dgx_h100_1x8_all_reduce_perf.txt", "rail-optimized:hosts=1,gpus=8",
         "1 DGX H100, 8 x H100 SXM, NVSwitch: the device lines pick the H100 profile, NVLS on"),
    Case("nvidia_exemplar_dgx_h100_1x8_all_reduce_perf.txt", "rail-optimized:hosts=1,gpus=8,nvls=false",
         "same, NVLS off in the spec (ring over NVLink)", primary=False),
    Case("xxrjun_cluster01_N1_G8_cnode3-002_h100_5ops.log", "rail-optimized:hosts=1,gpus=8",
         "1 host x 8 H100 SXM, NVSwitch, NVLS; NCCL 2.29.2"),
    Case("xxrjun_cluster01_N1_G8_cnode3-002_h100_5ops.log", "rail-optimized:hosts=1,gpus=8,nvls=false",
         "same, NVLS off in the spec", primary=False),
    Case("xxrjun_cluster01_N10_G8_h100_5ops.log", "rail-optimized:hosts=10,gpus=8,nic_gbps=400",
         "10 hosts x 8 H100, 1 x 400 Gb/s NIC per GPU (inferred); NCCL 2.29.2"),
    Case("xxrjun_cluster01_N10_G8_h100_5ops.log", "rail-optimized:hosts=10,gpus=8,nic_gbps=400,nvls=false",
         "same, NVLS off in the spec", primary=False),
)

BANDS = (("<= 1 MiB", 0, MIB), ("1-64 MiB", MIB + 1, 64 * MIB - 1), (">= 64 MiB", 64 * MIB, 2**62))


@dataclass(frozen=True)
class Scored:
    """One replayed row: op, size, signed error of busbw and the algorithm/protocol the replay chose."""

    op: str
    size_bytes: int
    error: float
    measured_busbw: float
    predicted_busbw: float
    algo_proto: str


def replay_rows(case: Case, traces: Path, cache: Path | None) -> list[dict[str, object]]:
    """The replay's JSON rows for one case (read from the cache directory when it holds them)."""
    cached = (cache / f"{Path(case.file).name}__{case.spec.replace(':', '_').replace(',', '_')}.json"
              if cache else None)
    if cached is not None and cached.exists():
        return json.loads(cached.read_text())["rows"]
    command = [sys.executable, "-m", "tracekit", "replay", "--nccl-tests", str(traces / case.file),
               "--topology", case.spec, "--json"]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        cached.write_text(done.stdout)
    return json.loads(done.stdout)["rows"]


def score(rows: list[dict[str, object]]) -> list[Scored]:
    """Signed busbw error per row, from the times (measured_us / predicted_us - 1)."""
    out = []
    for row in rows:
        measured_us, predicted_us = float(row["measured_us"]), float(row["predicted_us"])
        if measured_us <= 0 or predicted_us <= 0:
            continue
        out.append(Scored(str(row["op"]), int(row["size_bytes"]), measured_us / predicted_us - 1.0,
                          float(row["measured_busbw"]), float(row["predicted_busbw"]),
                          f"{row['algo']}/{row['proto']}"))
    return out


def _percent(x: float, sign: str = "+") -> str:
    """A percentage, or the ratio in scientific notation when it is absurd (rows predicted at ~0 us)."""
    return f"{x:{sign}.0%}" if abs(x) < 100 else f"{x:{sign}.1e}x"


def band_table(case: Case, scored: list[Scored]) -> list[str]:
    """Markdown rows: op, band, rows, median |error|, median signed error, worst, the replay's algo/proto."""
    lines = []
    for op in dict.fromkeys(s.op for s in scored):
        for band, low, high in BANDS:
            picked = [s for s in scored if s.op == op and low <= s.size_bytes <= high]
            if not picked:
                continue
            errors = [s.error for s in picked]
            median_abs = statistics.median(abs(e) for e in errors)
            worst = max(errors, key=abs)
            choices = ", ".join(f"{k} x{v}" for k, v in Counter(s.algo_proto for s in picked).most_common())
            lines.append(f"| {Path(case.file).name} | `{case.spec}` | {op} | {band} | {len(picked)} | "
                         f"{_percent(median_abs, '')} | {_percent(statistics.median(errors))} | "
                         f"{_percent(worst)} | {choices} |")
    return lines


def row_table(case: Case, scored: list[Scored]) -> list[str]:
    """Markdown rows, one per replayed size."""
    return [f"| {Path(case.file).name} | {s.op} | {s.size_bytes} | {s.measured_busbw:.2f} | {s.predicted_busbw:.3g} | "
            f"{_percent(s.error)} | {s.algo_proto} |" for s in scored]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES if DEFAULT_TRACES.exists() else FALLBACK_TRACES)
    parser.add_argument("--cache", type=Path, help="keep (and reuse) each replay's JSON in this directory")
    parser.add_argument("--rows", action="store_true", help="also print every row")
    parser.add_argument("--primary", action="store_true", help="only the specs that describe the hardware")
    parser.add_argument("--extra", nargs=2, action="append", default=[], metavar=("FILE", "SPEC"),
                        help="also score another nccl-tests output (any path) on a spec; repeatable")
    args = parser.parse_args()

    cases = [c for c in CASES if c.primary or not args.primary]
    cases += [Case(str(Path(f).resolve()), spec, "extra") for f, spec in args.extra]
    results = [(case, score(replay_rows(case, args.traces, args.cache))) for case in cases]
    print("| file | spec | op | band | rows | median abs error | median error | worst | replay algo/proto |")
    print("|---|---|---|---|---|---|---|---|---|")
    for case, scored in results:
        print("\n".join(band_table(case, scored)))
    if args.rows:
        print()
        print("| file | op | size (B) | measured busbw | predicted busbw | error | replay algo/proto |")
        print("|---|---|---|---|---|---|---|")
        for case, scored in results:
            if case.primary:
                print("\n".join(row_table(case, scored)))


if __name__ == "__main__":
    main()
