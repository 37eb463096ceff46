"""`tracekit replay`: replay a run's communication on other networks and compare."""

from __future__ import annotations

from pathlib import Path

import click

from tracekit.cli._common import echo, echo_lines, json_option, unsaved_note, user_errors


@click.command()
@click.argument("paths", nargs=-1, required=False, metavar="RUN|PATH...")
@click.option("--topology", "topologies", multiple=True, metavar="SPEC",
              help="A network to replay on (preset string, YAML file, or `observed`: the run's fabric from "
                   "ibnetdiscover); repeat to compare.")
@click.option("--baseline", default=None, metavar="SPEC",
              help="The observed network, used to calibrate (default: the first --topology).")
@click.option("--report", "report_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the HTML report with the replay tab to this file.")
@click.option("--cache", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where raw trace paths are ingested (default: a temp directory keyed by the paths).")
@click.option("--algo", type=click.Choice(["auto", "ring", "tree"]), default="auto", show_default=True,
              help="Collective algorithm (auto: the traced one from kernel names or NCCL logs where the "
                   "topology can run it, else NCCL's tuning rule; a what-if also weighs algorithms it adds).")
@click.option("--merge", type=click.FloatRange(min=0, max=0.1), default=0.0, show_default=True,
              help="Let flows finish early by up to this fraction of their age to merge events "
                   "(faster, approximate; 0: exact).")
@click.option("--calibration-from", "calibration_from", default=None, metavar="RUN|FILE",
              help="Apply the calibration fitted on another run of the job (a run directory or traces, "
                   "replayed on the baseline to fit it, or a results/calibration.json written by replay) "
                   "instead of fitting on this one: the error is then out of sample.")
@click.option("--no-write", is_flag=True, help="Do not store results/replay.json and link samples in the run.")
@click.option("--nccl-tests", "nccl_tests", type=click.Path(exists=True, path_type=Path), default=None,
              metavar="FILE|DIR", help="Replay each row of an nccl-tests output (or a folder of them) on "
                                       "--topology, compare predicted with measured busbw and say per table "
                                       "whether the run is healthy or degraded (instead of a run); --report "
                                       "draws predicted against measured per file.")
@click.option("-v", "--verbose", is_flag=True,
              help="Also print dependency edges per rule, the error per op, fallbacks and unseen buckets.")
@json_option
@user_errors
def replay(paths: tuple[str, ...], topologies: tuple[str, ...], baseline: str | None,
           report_path: Path | None, cache: Path | None, algo: str, merge: float, calibration_from: str | None,
           no_write: bool, nccl_tests: Path | None, verbose: bool, as_json: bool) -> None:
    """Replay the communication of RUN (a run directory, or raw trace paths) on each --topology
    and compare step time, exposed communication per dim and the hottest link with the baseline."""
    from tracekit._progress import status

    status("replay: loading libraries")
    from tracekit import workflows
    from tracekit.present import printable, replay_comparison

    if not topologies and baseline is None:
        raise click.UsageError("give at least one --topology")
    if nccl_tests is not None:
        _nccl_tests(nccl_tests, topologies[0] if topologies else str(baseline), cache, algo, as_json, verbose,
                    report_path)
        return
    if not paths:
        raise click.UsageError("give a run directory or trace paths (or --nccl-tests FILE)")
    run = workflows.open(list(paths), cache=cache)
    run.require_data()
    from tracekit.microbench import replay_hint

    hint = replay_hint(run, topologies[0] if topologies else str(baseline))
    if hint is not None:
        raise click.ClickException(hint)
    saved = (workflows.calibration(calibration_from, topologies, baseline=baseline, algo=algo)
             if calibration_from is not None else None)
    notes = [f"note: {saved.note}"] if saved is not None and saved.note else []
    # the report's analysis goes on from the replay's preparation instead of preparing again
    prepared = workflows.prepared(run) if report_path is not None else None
    result = workflows.replay(run, list(topologies), baseline=baseline, write=not no_write, algo=algo,
                              merge=merge, calibration=saved, prepared_run=prepared)
    unsaved_note(run)
    if as_json:
        click.echo(result.dumps())
    else:
        echo_lines(replay_comparison(result, verbose=verbose))
        for note in notes:
            click.echo(printable(note))
        if result.telemetry is not None:
            from tracekit.telemetry.compare import format_comparison as format_links

            click.echo(format_links(result.telemetry))
        if result.results:
            _physics_notes(topologies)
    if report_path is not None:
        status(f"replay: writing the report to {report_path}")
        analysis = workflows.analyze(run, write=False, prepared_run=prepared)
        info = workflows.report(run, report_path, analysis=analysis, replay=result)
        click.echo(f"report: {info.path}")


def _physics_notes(topologies: tuple[str, ...]) -> None:
    from tracekit.replay.engine import physics_notes

    for text, finding in physics_notes(topologies):
        echo(f"note: {text}: {finding.text}")


def _nccl_tests(path: Path, topology: str, cache: Path | None, algo: str, as_json: bool, verbose: bool,
                report_path: Path | None) -> None:
    from tracekit import workflows
    from tracekit.present import nccl_tests_lines
    from tracekit.results import dumps

    report = workflows.nccl_tests(path, topology, cache=cache, algo=algo)
    if as_json:
        click.echo(dumps(report.summary, indent=2))
    else:
        echo_lines(nccl_tests_lines(report, verbose=verbose))
    if report_path is not None:
        from tracekit.viz.report import write_microbench_report

        info = write_microbench_report(report, report_path)
        click.echo(f"report: {info.path}")
