"""Benchmark: full cross-rank analysis of a synthetic 1,024-rank step, against a naive baseline.

Usage::

    python benchmarks/bench_analyze.py [--hosts 128] [--gpus 8] [--steps 1] [--no-naive]

A synthetic DP x PP x EP run (tracekit.synth) is written as a run directory; then, each in a fresh
process so that peak RSS is its own, `tracekit.analysis.analyze` runs on it (per rank partition,
the default, and with ``partitioned=False``, which loads every event at once), and so does a
naive per-rank Python loop doing the core of the same work (per-instance waits, clock offsets by
rank-by-rank medians, per-rank interval unions for compute/comm/overlap). Prints wall time and
peak RSS of each and their ratios. Target: the analysis under 10 s and 4 GiB on 2 cores.

``--align 256,1024,4096,8192`` times the cross-rank clock alignment alone at each size (ranks =
hosts x 8, PP=4, EP=8, one step of synthetic collectives), the current sparse solver against the
dense one it replaced (`benchmarks/previous_clocks.py`), in the same run, on two inputs: the synth
ends as made (they agree exactly, so the solver stops after 2 steps: what `bench_e2e.py` sees) and
the same ends with 0-5 us jitter and 2% of them 1-20 ms late (the solver then does real work; both
solvers capped at ``--align-iters`` steps, and the current one also run to convergence). Prints CPU seconds
(the process's, BLAS threads included; wall time on a shared machine mostly measures the neighbours),
the largest offset difference between the two solvers and from the injected truth, and the growth
exponent of each column (slope of log time on log ranks, all sizes and the two largest). Target:
exponent <= 1.2 for the current solver's complete runs (clean, and noisy to convergence). The
10-step column grows a little faster: the first steps start far from the answer, and their
conjugate-gradient steps grow with the graph.

A second table compares the conjugate-gradient preconditioners in the same run: the spanning-tree
one (`clocks._TreePlan`) against the Jacobi one main used before it (swapped in here), on the same
synthetic inputs and on pipeline chains (``--align-chain 1000,4096``: ranks linked only by send/recv
to the next one, 8 transfers per link, exact and with 0-5 us end jitter), where Jacobi needs about
as many steps per solve as the chain is long. Prints solver iterations, CG steps and CPU seconds of
each, their largest offset difference and the error against the injected offsets.

A third table compares the damped Newton solver (`clocks._solve`) with the plain IRLS it replaced
(`_irls_solve` here, swapped in), on the jittered synth inputs and chains: iterations, CG steps and
CPU seconds of each at the shipped 100-iteration cap, and their largest offset difference from IRLS
run to 1e-3 ns (the reference optimum), and the error against the injected offsets.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
from _growth import growth_exponent


def _peak_rss_mib() -> float:
    from _rss import peak_rss_mb  # VmHWM: ru_maxrss carries the parent's peak over the spawn's exec

    return peak_rss_mb()


def _fast(run_dir: str, out: Any, partitioned: bool = True) -> None:
    from tracekit.analysis import analyze

    t0, c0 = time.perf_counter(), time.process_time()
    result = analyze(run_dir, write=False, partitioned=partitioned)
    out.put({"seconds": time.perf_counter() - t0, "cpu": time.process_time() - c0, "rss_mib": _peak_rss_mib(),
             "instances": result.instances.num_rows, "findings": result.findings[:2]})


def _eager(run_dir: str, out: Any) -> None:
    _fast(run_dir, out, partitioned=False)


def _union(iv: list[tuple[int, int]]) -> list[list[int]]:
    merged: list[list[int]] = []
    for s, e in sorted(iv):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return merged


def _overlap(a: list[list[int]], b: list[list[int]]) -> int:
    i = j = total = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def _naive(run_dir: str, out: Any) -> None:
    from tracekit.store import Run

    t0 = time.perf_counter()
    run = Run(run_dir)
    coll = run.table("collectives").select(["rank", "group", "seq", "op", "ts_ns", "dur_ns", "dim"]).to_pylist()
    # instances by (group, seq); p2p by (group, seq) too (the synthetic run numbers them alike)
    inst: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for c in coll:
        inst.setdefault((c["group"], c["seq"]), []).append(c)
    ranks = sorted({c["rank"] for c in coll})
    offset = dict.fromkeys(ranks, 0.0)
    for _ in range(20):
        common = {k: statistics.median(c["ts_ns"] + c["dur_ns"] + offset[c["rank"]] for c in v)
                  for k, v in inst.items() if len(v) > 1}
        per_rank: dict[int, list[float]] = {r: [] for r in ranks}
        for k, v in inst.items():
            if k in common:
                for c in v:
                    per_rank[c["rank"]].append(common[k] - c["ts_ns"] - c["dur_ns"])
        offset = {r: statistics.median(x) if x else 0.0 for r, x in per_rank.items()}
    waits = {}
    for k, v in inst.items():
        arr = {c["rank"]: c["ts_ns"] + offset[c["rank"]] for c in v}
        last = max(arr.values())
        waits[k] = (max(arr, key=arr.get), last - min(arr.values()))
    breakdown = {}
    for r in ranks:
        ev = run.events([r]).select(["kind", "ts_ns", "dur_ns", "coll_id"]).to_pylist()
        dims = {}
        for c in (c for c in coll if c["rank"] == r):
            dims.setdefault(c["dim"] or "OTHER", []).append((c["ts_ns"], c["ts_ns"] + c["dur_ns"]))
        comp = _union([(e["ts_ns"], e["ts_ns"] + e["dur_ns"]) for e in ev if e["kind"] == "compute"])
        breakdown[r] = {d: (sum(e - s for s, e in _union(iv)), _overlap(_union(iv), comp)) for d, iv in dims.items()}
    out.put({"seconds": time.perf_counter() - t0, "rss_mib": _peak_rss_mib(), "instances": len(waits)})


def _child(target: Any, run_dir: str) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=target, args=(run_dir, q))
    p.start()
    res = q.get()
    p.join()
    return res


def _align_inputs(hosts: int) -> tuple[Any, Any, Any, dict[int, int]]:
    """Matched synthetic collectives (clean and jittered), the ranks table and the true offsets."""
    import numpy as np
    import polars as pl

    from tracekit.analysis import match_collectives
    from tracekit.synth import SynthSpec, make_run_tables

    tables, truth = make_run_tables(SynthSpec(hosts=hosts, gpus_per_host=8, pp=4, ep=8, steps=1, seed=1,
                                              launch_events=False))
    coll, _ = match_collectives(tables["collectives"])
    c = pl.from_arrow(coll)
    rng = np.random.default_rng(0)
    late = (rng.random(c.height) < 0.02) * rng.integers(1_000_000, 20_000_000, c.height)
    noisy = c.with_columns(pl.col("dur_ns") + pl.Series(rng.integers(0, 5_000, c.height) + late))
    base = truth["clock_offset_ns"]["0"]
    return c, noisy, tables["ranks"], {int(r): v - base for r, v in truth["clock_offset_ns"].items()}


def _chain_inputs(n: int, jitter_ns: int, transfers: int = 8) -> tuple[Any, Any, dict[int, int]]:
    """A send/recv chain 0 -> 1 -> ... -> n-1 on clocks (r * 7919 mod 1000) us behind the common one."""
    import numpy as np
    import polars as pl

    from tracekit.analysis import match_collectives

    offset = (np.arange(n) * 7919 % 1000) * 1000
    link = np.repeat(np.arange(n - 1), transfers)
    end = 10**9 + np.arange(len(link)) * 100_000
    rank = np.stack([link, link + 1], 1).ravel()
    jitter = np.random.default_rng(0).integers(0, jitter_ns, len(rank)) if jitter_ns else 0
    ts = np.repeat(end, 2) + jitter - offset[rank] - 40_000
    df = pl.DataFrame({"coll_id": np.arange(len(rank)), "rank": rank, "group": "pp",
                       "op": np.tile(["send", "recv"], len(link)), "peer": np.stack([link + 1, link], 1).ravel(),
                       "in_bytes": 1 << 20, "out_bytes": 1 << 20, "ts_ns": ts, "dur_ns": 40_000})
    coll, _ = match_collectives(df)
    return coll, pl.DataFrame({"rank": np.arange(n)}), {r: int(offset[r]) for r in range(n)}


class _JacobiPlan:
    """The preconditioner `clocks._cg` used before the spanning tree: the Laplacian's diagonal."""

    def __init__(self, *_: Any) -> None:
        pass

    def preconditioner(self, w: Any, diag: Any) -> Any:
        import numpy as np

        inv = np.where(diag > 0, 1.0 / np.where(diag > 0, diag, 1.0), 0.0)
        return lambda res: inv * res


def precond_scaling(sizes: list[int], chains: list[int]) -> None:
    """Spanning-tree vs Jacobi preconditioning of the alignment's CG, same inputs, same run."""
    from tracekit.analysis import clocks

    tree = clocks._TreePlan
    print("\nCG preconditioners: tree = spanning tree (current), jacobi = diagonal (before); CPU seconds")
    print(f"{'case':>14} {'ranks':>6} {'iters':>7} {'tree s':>8} {'tree CG':>8} {'jacobi s':>9} "
          f"{'jacobi CG':>9} {'tree-jac':>9} {'truth err':>10}")

    def compare(name: str, world: int, coll: Any, ranks: Any, truth: dict[int, int]) -> None:
        out = {}
        for label, plan in (("tree", tree), ("jacobi", _JacobiPlan)):
            clocks._TreePlan = plan
            try:
                out[label] = _timed_align(clocks.align_clocks, coll, ranks)
            finally:
                clocks._TreePlan = tree
        (ts, to, tr), (js, jo, jr) = out["tree"], out["jacobi"]
        print(f"{name:>14} {world:>6} {tr['iterations']:>7} {ts:>7.2f}s {tr['solver_steps']:>8} {js:>8.2f}s "
              f"{jr['solver_steps']:>9} {max(abs(to[r] - jo[r]) for r in to):>6} ns "
              f"{max(abs(to[r] - truth[r]) for r in truth):>7} ns", flush=True)

    for world in sizes:
        clean, noisy, ranks, truth = _align_inputs(max(world // 8, 4))
        compare("synth clean", world, clean, ranks, truth)
        compare("synth noisy", world, noisy, ranks, truth)
    for n in chains:
        compare("chain exact", n, *_chain_inputs(n, 0))
        compare("chain jitter", n, *_chain_inputs(n, 5_000))


def _irls_solve(r_idx: Any, i_idx: Any, e: Any, n_r: int, n_i: int, max_iter: int, tol: float, fixed: Any,
                *, floor_ns: float = 100.0) -> tuple[Any, int, int, bool]:
    """`clocks._solve` before the damped Newton steps: plain IRLS, each CG solve warm-started from the
    previous offsets, stopping when no offset moves more than `tol`."""
    import numpy as np

    from tracekit.analysis.clocks import _cg, _TreePlan

    by_i = np.lexsort((r_idx, i_idx))
    r_s, i_s, e_s = r_idx[by_i], i_idx[by_i], e[by_i]
    starts = np.searchsorted(i_s, np.arange(n_i + 1))
    w = np.ones(len(e))
    off = np.zeros(n_r)
    plan = _TreePlan(r_s, starts, n_r, fixed)
    it = steps = 0
    for it in range(1, max_iter + 1):
        new, k = _cg(r_s, starts, e_s, w, n_r, fixed, off, plan=plan)
        steps += k
        shifted = e_s + new[r_s]
        common = np.bincount(i_s, w * shifted, n_i) / np.bincount(i_s, w, n_i)
        res = shifted - common[i_s]
        w = 1.0 / np.sqrt(res * res + floor_ns * floor_ns)
        moved = float(np.max(np.abs(new - off))) if n_r else 0.0
        off = new
        if moved <= tol and it > 1:
            return off, it, steps, True
    return off, it, steps, False


def solver_scaling(sizes: list[int], chains: list[int]) -> None:
    """The damped Newton solver against the plain IRLS before it (capped at 100 steps as it shipped,
    and run to 1e-3 ns as the reference optimum), same inputs, same run."""
    from tracekit.analysis import clocks

    newton = clocks._solve
    print("\nSolvers: newton = damped Newton (current), irls = plain IRLS (before); "
          "ref = IRLS to 1e-3 ns, up to 100,000 steps; CPU seconds")
    print(f"{'case':>14} {'ranks':>6} {'newton it':>9} {'CG':>6} {'s':>6} {'irls it':>7} {'CG':>6} {'s':>6} "
          f"{'ref it':>7} {'newton-ref':>10} {'irls-ref':>9} {'truth err':>10}")

    def compare(name: str, world: int, coll: Any, ranks: Any, truth: dict[int, int]) -> None:
        clocks._solve = _irls_solve
        try:
            i_s, i_o, i_r = _timed_align(clocks.align_clocks, coll, ranks)
            _, ref, ref_r = _timed_align(clocks.align_clocks, coll, ranks, max_iter=100_000, tol_ns=1e-3)
        finally:
            clocks._solve = newton
        n_s, n_o, n_r = _timed_align(clocks.align_clocks, coll, ranks)
        print(f"{name:>14} {world:>6} {n_r['iterations']:>9} {n_r['solver_steps']:>6} {n_s:>5.2f}s "
              f"{i_r['iterations']:>7} {i_r['solver_steps']:>6} {i_s:>5.2f}s {ref_r['iterations']:>7} "
              f"{max(abs(n_o[r] - ref[r]) for r in ref):>7} ns {max(abs(i_o[r] - ref[r]) for r in ref):>6} ns "
              f"{max(abs(n_o[r] - truth[r]) for r in truth):>7} ns", flush=True)

    for world in sizes:
        _, noisy, ranks, truth = _align_inputs(max(world // 8, 4))
        compare("synth noisy", world, noisy, ranks, truth)
    for n in chains:
        compare("chain jitter", n, *_chain_inputs(n, 5_000))


def _timed_align(fn: Any, coll: Any, ranks: Any, **kw: Any) -> tuple[float, dict[int, int], dict[str, Any]]:
    import polars as pl

    from tracekit.results import to_builtins

    t0 = time.process_time()
    out, report = fn(coll, ranks, **kw)
    dt = time.process_time() - t0
    df = pl.from_arrow(out)
    if not isinstance(report, dict):  # the current Alignment; the previous implementation returns a dict
        report = to_builtins(report, str_keys=False)
    return dt, dict(zip(df["rank"].to_list(), df["clock_offset_ns"].to_list(), strict=True)), report


def align_scaling(sizes: list[int], iters: int, old_max: int, chains: list[int]) -> int:
    """Clock alignment alone, current (sparse CG) vs previous (dense) solver, at growing rank counts."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import previous_clocks

    from tracekit.analysis.clocks import align_clocks

    previous_clocks.DENSE_LIMIT = sys.maxsize  # time the dense solve, not the wrong medians path
    warm, _, warm_ranks, _ = _align_inputs(4)
    align_clocks(warm, warm_ranks)
    previous_clocks.align_clocks(warm, warm_ranks)  # compile the dense kernel outside the timings
    cols = ("clean new", "clean old", f"noisy{iters} new", f"noisy{iters} old", "noisy new")
    rows: list[tuple[int, dict[str, float]]] = []
    print("CPU seconds of align_clocks; new = sparse CG solver, old = previous dense solver")
    print(f"{'ranks':>6} {'calls':>8} " + " ".join(f"{c:>14}" for c in cols) + "   notes")
    for world in sizes:
        t0 = time.perf_counter()
        clean, noisy, ranks, truth = _align_inputs(max(world // 8, 4))
        made = time.perf_counter() - t0
        t: dict[str, float] = {}
        notes = []
        t["clean new"], new, rep = _timed_align(align_clocks, clean, ranks)
        notes.append(f"truth err {max(abs(new[r] - truth[r]) for r in truth)} ns, {rep['iterations']} it")
        if world <= old_max:
            t["clean old"], old, _ = _timed_align(previous_clocks.align_clocks, clean, ranks)
            notes.append(f"old-new {max(abs(old[r] - new[r]) for r in new)} ns")
        t[f"noisy{iters} new"], new, _ = _timed_align(align_clocks, noisy, ranks, max_iter=iters)
        if world <= old_max:
            t[f"noisy{iters} old"], old, _ = _timed_align(previous_clocks.align_clocks, noisy, ranks, max_iter=iters)
            notes.append(f"noisy old-new {max(abs(old[r] - new[r]) for r in new)} ns")
        t["noisy new"], new, rep = _timed_align(align_clocks, noisy, ranks)
        notes.append(f"noisy: truth err {max(abs(new[r] - truth[r]) for r in truth)} ns, {rep['iterations']} it, "
                     f"{rep['solver_steps']} CG steps; inputs {made:.0f} s")
        rows.append((world, t))
        print(f"{world:>6} {noisy.height:>8,} " + " ".join(
            f"{t[c]:>13.2f}s" if c in t else f"{'-':>14}" for c in cols) + "   " + "; ".join(notes), flush=True)
    ok = True
    for label, pick in (("all sizes", rows), ("two largest", rows[-2:])):
        exps = []
        for c in cols:
            pts = [(w, t[c]) for w, t in pick if c in t]
            e = growth_exponent([p[0] for p in pts], [p[1] for p in pts]) if len(pts) >= 2 else None
            exps.append("-" if e is None else f"{e:.2f}")
            if c in ("clean new", "noisy new") and e is not None and e > 1.2:
                ok = False
        print(f"{'exponent':>6} {label:>8} " + " ".join(f"{x:>14}" for x in exps))
    print(f"target (current solver's complete runs, exponent <= 1.2): {'met' if ok else 'MISSED'}")
    precond_scaling(sizes, chains)
    solver_scaling(sizes, chains)
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=128)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--pp", type=int, default=4)
    ap.add_argument("--ep", type=int, default=8)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--layers", type=int, default=4, help="Layers per stage.")
    ap.add_argument("--micro-batches", type=int, default=4)
    ap.add_argument("--kernels", type=int, default=16, help="Compute kernels per block.")
    ap.add_argument("--no-naive", action="store_true", help="Skip the naive baseline.")
    ap.add_argument("--align", metavar="RANKS", help="Only the clock alignment at these rank counts "
                    "(comma-separated, e.g. 256,1024,4096,8192), current vs previous solver.")
    ap.add_argument("--align-iters", type=int, default=10, help="Iteration cap for the like-for-like noisy timing.")
    ap.add_argument("--align-chain", default="1000,4096", help="Send/recv chain lengths for the "
                    "preconditioner comparison (comma-separated; empty for none).")
    ap.add_argument("--align-old-max", type=int, default=8192, help="Largest rank count the dense solver runs at.")
    args = ap.parse_args(argv)
    if args.align:
        return align_scaling([int(x) for x in args.align.split(",")], args.align_iters, args.align_old_max,
                             [int(x) for x in args.align_chain.split(",") if x])

    from tracekit.synth import SynthSpec, make_run_tables, write_run

    spec = SynthSpec(hosts=args.hosts, gpus_per_host=args.gpus, pp=args.pp, ep=args.ep, steps=args.steps,
                     layers_per_stage=args.layers, micro_batches=args.micro_batches,
                     kernels_per_block=args.kernels)
    t0 = time.perf_counter()
    tables, _ = make_run_tables(spec)
    for name in ("collectives", "ranks", "groups"):  # what the analysis must find itself
        t = tables[name]
        col = {"collectives": "instance", "ranks": "clock_offset_ns", "groups": "dims"}[name]
        i = t.schema.get_field_index(col)
        tables[name] = t.set_column(i, t.schema.field(i), pa.nulls(t.num_rows, t.schema.field(i).type))
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = str(Path(tmp) / "run")
        write_run(tables, run_dir)
        print(f"synthetic run: {spec.world} ranks, {spec.steps} step(s), {tables['events'].num_rows:,} events, "
              f"{tables['collectives'].num_rows:,} collective calls ({time.perf_counter() - t0:.1f} s to make)")
        del tables
        fast = _child(_fast, run_dir)
        print(f"analyze:  {fast['seconds']:6.2f} s  {fast['cpu']:6.2f} s CPU  peak RSS {fast['rss_mib']:7.0f} MiB  "
              f"({fast['instances']:,} instances; events read per rank partition)")
        eager = _child(_eager, run_dir)
        print(f"eager:    {eager['seconds']:6.2f} s  {eager['cpu']:6.2f} s CPU  peak RSS {eager['rss_mib']:7.0f} MiB  "
              f"(partitioned=False: all events at once); partitioned/eager CPU "
              f"{fast['cpu'] / eager['cpu']:.2f}x, peak RSS {fast['rss_mib'] / eager['rss_mib']:.2f}x")
        ok = fast["seconds"] < 10 and fast["rss_mib"] < 4096
        if not args.no_naive:
            naive = _child(_naive, run_dir)
            print(f"naive:    {naive['seconds']:6.2f} s  peak RSS {naive['rss_mib']:7.0f} MiB  "
                  f"(a subset of the work: waits, offsets, per-rank unions)")
            print(f"ratio:    analyze is {naive['seconds'] / fast['seconds']:.1f}x faster than naive, "
                  f"with {fast['rss_mib'] / naive['rss_mib']:.2f}x its peak RSS")
        print(f"target (< 10 s, < 4 GiB): {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
