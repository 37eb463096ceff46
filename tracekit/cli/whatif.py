"""`tracekit whatif`: replay a run changed by scenarios (EPLB, placement, checkpoint traffic) and
compare each with the baseline replay."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from tracekit.cli._common import echo, json_option, user_errors

SCENARIO_HELP = """\b
Scenarios (each compared with the baseline replay on the same --topology):
  eplb:redundant=N[,groups=G,nodes=K,experts=E,compute=REGEX]
      DeepSeek EPLB: N extra expert slots per EP group; hierarchical when the
      nodes divide the expert groups. compute= also scales the expert kernels
      whose names match REGEX by the tokens each rank receives.
  placement:pp-adjacent|pp-spread|ep-in-node|auto[,replays=N]|FILE
      put the ranks on other hosts (FILE: CSV/JSON rank,host[,gpu]).
  checkpoint:bytes_per_rank=B[,every=S,at=start|end|F,via=frontend|backend,storage=N]
  dataload:bytes_per_rank=B[,every=S,at=...,via=...,storage=N]
      north-south traffic between every rank and storage nodes."""


@click.command(epilog=SCENARIO_HELP)
@click.argument("run", metavar="RUN")
@click.argument("scenarios", nargs=-1, required=True, metavar="SCENARIO...")
@click.option("--topology", default="rail-optimized", show_default=True, metavar="SPEC",
              help="The network both the baseline and the scenarios are replayed on.")
@click.option("--expert-loads", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="Per-expert token counts for eplb (CSV/JSON: step, layer, expert, tokens).")
@click.option("--expert-map", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="Which rank holds each expert (CSV/JSON: expert, rank); needed with --expert-loads.")
@click.option("--report", "report_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the HTML report with the What-if tab to this file.")
@click.option("--cache", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where raw trace paths are ingested (default: a temp directory keyed by the path).")
@json_option
@user_errors
def whatif(run: str, scenarios: tuple[str, ...], topology: str, expert_loads: Path | None,
           expert_map: Path | None, report_path: Path | None, cache: Path | None, as_json: bool) -> None:
    """Replay RUN (a run directory or raw traces) changed by each SCENARIO and compare step time,
    exposed communication per dim, EP load and inter-host bytes with the baseline replay of the
    unchanged run on the same topology (model vs model, never vs the trace)."""
    from tracekit.errors import TracekitError
    from tracekit.replay import open_run
    from tracekit.whatif import parse_scenario, read_expert_loads, read_expert_map
    from tracekit.whatif import whatif as run_whatif

    parsed = [parse_scenario(s) for s in scenarios]
    if (expert_loads is None) != (expert_map is None):
        raise click.UsageError("--expert-loads and --expert-map go together")
    loads = read_expert_loads(expert_loads, read_expert_map(expert_map)) if expert_loads and expert_map else None
    source = open_run([run], cache=cache)
    result = run_whatif(source, parsed, topology=topology, expert_loads=loads)
    click.echo(result.dumps()) if as_json else echo(format_whatif(result))
    if report_path is not None:
        try:
            from tracekit.viz.report import write_report
        except ImportError as exc:
            raise TracekitError("--report needs tracekit.viz.report, which is not available") from exc
        info = write_report(source, report_path, whatif=result)
        click.echo(f"report: {getattr(info, 'path', report_path)}")


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.3f} ms"


def _delta(value: float, base: float) -> str:
    return f" ({(value - base) / base:+.1%})" if base else ""


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f}"


def _mean(values: dict[str, int]) -> float:
    return sum(values.values()) / len(values) if values else 0.0


def format_whatif(result: Any) -> str:
    """The comparison table, then each scenario's notes (and its rank -> host map)."""
    doc = result.to_json()
    rows = doc["scenarios"]
    dims = sorted({d for s in rows for d in (*s["exposed_ns"], *s["baseline_exposed_ns"])})
    ih_dims = sorted({d for s in rows for side in ("before", "after") for d in s["inter_host_bytes"][side]})
    cv = (doc["replay_error"] or {}).get("cross_validated") or {}
    lines = [f"what-if on {doc['topology']}: each scenario vs the baseline replay of the unchanged run "
             "(model vs model, not vs the trace)",
             f"replay error of the baseline (cross-validated, per collective): median {cv.get('median', 0):.1%}, "
             f"p90 {cv.get('p90', 0):.1%}; the scenarios carry it plus the model's limits"]
    lines += [f"caution: {c['text']}" for c in doc["cautions"] if c.get("severity") == "warning"]
    header = (["scenario", "step (mean)"] + [f"exposed {d}/step" for d in dims]
              + ["EP max/mean", "inter-host GB " + "/".join(ih_dims), "checkpoint"])
    table = []
    if rows:
        first = rows[0]
        table.append(["baseline", _ms(_mean(first["baseline_step_ns"]))]
                     + [_ms(first["baseline_exposed_ns"].get(d, 0)) for d in dims]
                     + ["", "/".join(_gb(first["inter_host_bytes"]["before"].get(d, 0)) for d in ih_dims), ""])
    for s in rows:
        base_step = _mean(s["baseline_step_ns"])
        step = _mean(s["step_ns"])
        imb = s["ep_imbalance"]
        table.append(
            [s["scenario"], _ms(step) + _delta(step, base_step)]
            + [_ms(s["exposed_ns"].get(d, 0)) + _delta(s["exposed_ns"].get(d, 0), s["baseline_exposed_ns"].get(d, 0))
               for d in dims]
            + [f"{imb['before']:.2f} -> {imb['after']:.2f}" if imb else "-",
               "/".join(_gb(s["inter_host_bytes"]["after"].get(d, 0)) for d in ih_dims),
               _ms(s["checkpoint_ns"]) if s["checkpoint_ns"] is not None else "-"])
    widths = [max(len(str(r[i])) for r in [header, *table]) for i in range(len(header))]
    for r in [header, *table]:
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    for s in rows:
        lines.append("")
        lines.append(f"{s['scenario']}:")
        if s["a2a_ns"]:
            lines.append(f"  EP all-to-all per instance (mean): {_ms(s['a2a_ns']['before'])} -> "
                         f"{_ms(s['a2a_ns']['after'])}")
        if s["slowed"] is not None:
            worst = max(s["slowed"], key=lambda x: x["scenario_ns"] - x["baseline_ns"], default=None)
            lines.append(f"  collectives slowed: {len(s['slowed'])}" + (
                f" (worst {worst['op']} {worst['dim']} group {worst['group']} seq {worst['seq']}: "
                f"{_ms(worst['baseline_ns'])} -> {_ms(worst['scenario_ns'])})" if worst else ""))
        if s["placement"]:
            after = s["placement"]["after"]
            by_host: dict[str, list[tuple[int, str]]] = {}
            for rank, (host, gpu) in after["ranks"].items():
                by_host.setdefault(host, []).append((gpu, rank))
            for host in after["hosts"]:
                lines.append(f"  {host}: ranks {' '.join(r for _, r in sorted(by_host.get(host, [])))} (by GPU)")
        details = s["details"] or {}
        if "replays" in details:
            moved = details["moved_ranks"]
            kept = f"moved {moved} ranks" if moved else "kept the traced placement"
            lines.append(f"  search: started from the {details['start']} placement, {details['replays']} replays, "
                         f"{kept} (a change must shorten the step by more than {details['min_gain']:.1%})")
        for note in s["notes"]:
            lines.append(f"  - {note}")
    return "\n".join(lines)
