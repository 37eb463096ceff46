"""`tracekit synth`: make a synthetic DP x PP x EP run with known injected facts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from tracekit.atomic import atomic_write_text
from tracekit.cli._common import user_errors
from tracekit.pipeline import SCHEDULES


@click.command()
@click.option("-o", "--out", "out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Output directory (a run directory, or a folder of Kineto traces with --format kineto).")
@click.option("--hosts", default=2, show_default=True, help="Number of hosts.")
@click.option("--gpus", "gpus_per_host", default=4, show_default=True, help="GPUs per host.")
@click.option("--tp", default=1, show_default=True, help="Tensor-parallel size.")
@click.option("--pp", default=2, show_default=True, help="Pipeline stages.")
@click.option("--ep", default=2, show_default=True, help="Expert-parallel group size (divides DP).")
@click.option("--steps", default=2, show_default=True, help="Training steps.")
@click.option("--micro-batches", "micro_batches", default=2, show_default=True, help="Micro-batches per step.")
@click.option("--layers", "layers_per_stage", default=2, show_default=True, help="Layers per pipeline stage.")
@click.option("--kernels", "kernels_per_block", default=3, show_default=True, help="Compute kernels per block.")
@click.option("--seed", default=0, show_default=True, help="Random seed.")
@click.option("--straggler", "straggler_rank", type=int, default=1, show_default=True,
              help="Rank that stalls at the start of --straggler-step (-1 for none).")
@click.option("--straggler-step", default=1, show_default=True, help="Step in which the straggler stalls.")
@click.option("--slow-nic", "slow_nic", default=None, metavar="RANK[:FACTOR]",
              help="Inject a degraded NIC: RANK's NIC runs FACTOR (default 4) times slower both ways.")
@click.option("--slow-stage", "slow_stage", default=None, metavar="STAGE[:FACTOR]",
              help="Inject a compute regression: STAGE's forward and backward kernels take FACTOR (default 1.5) "
                   "times longer.")
@click.option("--ring-channels", "ring_channels", type=click.IntRange(min=1), default=None,
              help="Ring channels of a cross-host all-reduce (default: one per GPU of a host; fewer load each NIC "
                   "more), written as a channels table.")
@click.option("--dp-buckets", "dp_buckets", type=click.IntRange(min=1), default=2, show_default=True,
              help="Gradient all-reduce buckets per step and stage.")
@click.option("--hot-expert-share", "hot_expert_share", type=click.FloatRange(0, 1), default=0.7, show_default=True,
              help="Share of the tokens routed to each EP group's hot expert (EP skew).")
@click.option("--schedule", type=click.Choice(SCHEDULES), default="gpipe", show_default=True,
              help="Pipeline schedule: each stage's order of forward, backward and weight-gradient chunks.")
@click.option("--pp-chunks", "pp_chunks", type=click.IntRange(min=1), default=1, show_default=True,
              help="Model chunks per stage (interleaved-1f1b).")
@click.option("--format", "fmt", type=click.Choice(["run", "kineto", "nsys"]), default="run", show_default=True,
              help="Write a run directory, one Kineto Chrome trace per rank, or one Nsight Systems SQLite export "
                   "per host (NCCL 2.27 NVTX payloads; see tracekit.synth_nsys).")
@click.option("--telemetry", is_flag=True,
              help="Also write the fabric (ibnetdiscover -p) and leaf-switch counters (Prometheus text) "
                   "consistent with the run (with --format kineto; see tracekit.telemetry.synth).")
@click.option("--background", multiple=True, metavar="HOST[:NIC]=BYTES_PER_S",
              help="Background (north-south, other jobs) load on a host's HCA cable in the telemetry; repeatable.")
@click.option("--scrape-ms", type=click.IntRange(min=1), default=None,
              help="Telemetry scrape interval (default: the run's span / 8).")
@user_errors
def synth(out: Path, fmt: str, straggler_rank: int, slow_nic: str | None, slow_stage: str | None, telemetry: bool,
          background: tuple[str, ...], scrape_ms: int | None, **params: Any) -> None:
    """Make a synthetic DP x PP x EP run (with clock skew, a straggler and EP skew) and its truth.json."""
    from tracekit.errors import TracekitError
    from tracekit.synth import make_run_tables, write_kineto, write_run

    if (telemetry or background) and fmt != "kineto":
        raise click.UsageError("--telemetry writes files to ingest with the traces: use --format kineto")
    load = {}
    for item in background:
        key, eq, value = item.partition("=")
        try:
            load[key] = float(value)
        except ValueError:
            raise click.UsageError(f"--background {item!r}: expected HOST[:NIC]=BYTES_PER_S") from None
        if not eq or not key:
            raise click.UsageError(f"--background {item!r}: expected HOST[:NIC]=BYTES_PER_S")
    extra: dict[str, float] = {}
    if slow_nic:
        rank, _, factor = slow_nic.partition(":")
        try:
            extra = {"slow_nic_rank": int(rank), "slow_nic_factor": float(factor) if factor else 4.0}
        except ValueError:
            raise TracekitError(f"--slow-nic {slow_nic!r}: expected RANK or RANK:FACTOR, e.g. 5:4") from None
    if slow_stage:
        stage, _, factor = slow_stage.partition(":")
        try:
            extra.update({"slow_stage": int(stage), "slow_stage_factor": float(factor) if factor else 1.5})
        except ValueError:
            raise TracekitError(f"--slow-stage {slow_stage!r}: expected STAGE or STAGE:FACTOR, e.g. 1:1.5") from None
    tables, truth = make_run_tables(straggler_rank=None if straggler_rank < 0 else straggler_rank, **params, **extra)
    if fmt == "kineto":
        paths = write_kineto(tables, out)
        atomic_write_text(out / "truth.json", json.dumps(truth, indent=1, sort_keys=True))
        click.echo(f"wrote {len(paths)} Kineto traces ({tables['events'].num_rows} events, "
                   f"{tables['collectives'].num_rows} collective calls) and truth.json to {out}")
        if telemetry or load:
            from tracekit.telemetry.synth import write_switch_telemetry

            try:
                made = write_switch_telemetry(tables, out, background=load,
                                              interval_ns=scrape_ms * 1_000_000 if scrape_ms else None)
            except ValueError as exc:
                raise click.UsageError(str(exc)) from None
            click.echo(f"wrote {made.fabric_path.name} and {made.prom_path.name} "
                       f"({len(made.scrape_ns)} scrapes, {len(made.tx_bytes)} HCA ports)")
    elif fmt == "nsys":
        from tracekit.synth_nsys import write_nsys

        paths = write_nsys(tables, out)
        atomic_write_text(out / "truth.json", json.dumps(truth, indent=1, sort_keys=True))
        click.echo(f"wrote {len(paths)} Nsight Systems exports ({tables['ranks'].num_rows} ranks, "
                   f"{tables['collectives'].num_rows} collective calls) and truth.json to {out}")
    else:
        write_run(tables, out, truth=truth)
        click.echo(f"wrote run {out}: {tables['ranks'].num_rows} ranks, {tables['events'].num_rows} events, "
                   f"{tables['collectives'].num_rows} collective calls")
