"""`tracekit whatif`: replay a run changed by scenarios (EPLB, placement, checkpoint traffic) and
compare each with the baseline replay."""

from __future__ import annotations

from pathlib import Path

import click

from tracekit.cli._common import echo_lines, json_option, user_errors

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
    from tracekit.present import whatif_comparison
    from tracekit.replay import open_run
    from tracekit.whatif import parse_scenario, read_expert_loads, read_expert_map
    from tracekit.whatif import whatif as run_whatif

    parsed = [parse_scenario(s) for s in scenarios]
    if (expert_loads is None) != (expert_map is None):
        raise click.UsageError("--expert-loads and --expert-map go together")
    loads = read_expert_loads(expert_loads, read_expert_map(expert_map)) if expert_loads and expert_map else None
    source = open_run([run], cache=cache)
    result = run_whatif(source, parsed, topology=topology, expert_loads=loads)
    click.echo(result.dumps()) if as_json else echo_lines(whatif_comparison(result))
    if report_path is not None:
        try:
            from tracekit.viz.report import write_report
        except ImportError as exc:
            raise TracekitError("--report needs tracekit.viz.report, which is not available") from exc
        info = write_report(source, report_path, whatif=result)
        click.echo(f"report: {getattr(info, 'path', report_path)}")
