"""`tracekit whatif`: replay a run changed by scenarios (EPLB, placement, checkpoint traffic, scale,
node-limited routing) and compare each with the baseline replay."""

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
      north-south traffic between every rank and storage nodes.
  scale:dp=K|hosts=H[,ep=E]
      the job with K copies of its ranks (DP x K, or H hosts), EP degree E
      (split by expert with --expert-loads), on the topology grown with it
      (weak scaling: compute as traced).
  routing:nodes=M
      node-limited routing: each token's experts on at most M nodes.
  schedule:gpipe|1f1b|interleaved-1f1b|zb-h1|dualpipe|dualpipev[,microbatches=M,chunks=V,sm_share=S]
      rebuild each PP stage's chunk order for that pipeline schedule from the
      traced chunks; sm_share: the SMs DualPipe's overlapped communication
      takes (default 20/132, DeepSeek-V3's)."""


@click.command(epilog=SCENARIO_HELP)
@click.argument("run", metavar="RUN")
@click.argument("scenarios", nargs=-1, required=True, metavar="SCENARIO...")
@click.option("--topology", default="rail-optimized", show_default=True, metavar="SPEC",
              help="The network both the baseline and the scenarios are replayed on.")
@click.option("--expert-loads", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="Per-expert token counts for eplb and scale:...,ep=E (CSV/JSON: step, layer, expert, "
                   "tokens).")
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
    from tracekit import workflows
    from tracekit.present import whatif_comparison
    from tracekit.whatif import parse_scenario, read_expert_loads, read_expert_map

    parsed = [parse_scenario(s) for s in scenarios]
    if (expert_loads is None) != (expert_map is None):
        raise click.UsageError("--expert-loads and --expert-map go together")
    loads = read_expert_loads(expert_loads, read_expert_map(expert_map)) if expert_loads and expert_map else None
    source = workflows.open([run], cache=cache)
    result = workflows.whatif(source, parsed, topology=topology, expert_loads=loads)
    click.echo(result.dumps()) if as_json else echo_lines(whatif_comparison(result))
    if report_path is not None:
        info = workflows.report(source, report_path, whatif=result)
        click.echo(f"report: {info.path}")
