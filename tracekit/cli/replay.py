"""`tracekit replay`: replay a run's communication on other networks and compare."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from tracekit.cli._common import echo, json_option, unsaved_note, user_errors


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
              metavar="FILE", help="Replay each row of an nccl-tests output on --topology and compare "
                                   "predicted with measured busbw (instead of a run).")
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
    from tracekit.errors import TracekitError
    from tracekit.replay.engine import calibration_from as load_calibration
    from tracekit.replay.engine import open_run, replay_run

    if not topologies and baseline is None:
        raise click.UsageError("give at least one --topology")
    if nccl_tests is not None:
        _nccl_tests(nccl_tests, topologies[0] if topologies else str(baseline), cache, algo, as_json)
        return
    if not paths:
        raise click.UsageError("give a run directory or trace paths (or --nccl-tests FILE)")
    run = open_run(list(paths), cache=cache)
    run.require_data()
    options: dict = {}
    notes = []
    if calibration_from is not None:
        base = baseline if baseline is not None else topologies[0]
        saved = load_calibration(calibration_from, base, algo=algo)
        options = {"efficiency": saved.efficiency, "calibrated_on": saved.name}
        if saved.topology is not None and saved.topology != str(base):
            notes.append(f"note: the calibration was fitted on {saved.topology}, applied to baseline {base}")
    result = replay_run(run, list(topologies), baseline=baseline, write=not no_write, algo=algo,
                        merge=merge, **options)
    unsaved_note(run)
    if as_json:
        click.echo(result.dumps())
    else:
        echo(format_comparison(result.to_json(), result.efficiency, verbose=verbose))
        for note in notes:
            click.echo(_printable(note))
        if result.telemetry is not None:
            from tracekit.telemetry.compare import format_comparison as format_links

            click.echo(format_links(result.telemetry))
        _physics_notes(topologies)
    if report_path is not None:
        try:
            from tracekit.viz.report import write_report
        except ImportError as exc:
            raise TracekitError("--report needs tracekit.viz.report, which is not available") from exc
        status(f"replay: writing the report to {report_path}")
        info = write_report(run, report_path, replay=result)
        click.echo(f"report: {getattr(info, 'path', report_path)}")


def _physics_notes(topologies: tuple[str, ...]) -> None:
    from tracekit.replay.topology import parse_spec, physics_caps

    for text in topologies:
        if text == "observed":
            continue
        for finding in physics_caps(parse_spec(text)):
            echo(f"note: {text}: {finding.text}")


def _nccl_tests(path: Path, topology: str, cache: Path | None, algo: str, as_json: bool) -> None:
    import json

    from tracekit.replay.topology import parse_spec, physics_caps
    from tracekit.replay.validate import format_microbench, replay_nccl_tests

    rows = replay_nccl_tests(path, topology, cache=cache, algo=algo)
    caps = physics_caps(parse_spec(topology))
    if as_json:
        click.echo(json.dumps({"topology": topology, "rows": [r.to_json() for r in rows],
                               "findings": [f.to_json() for f in caps]}, indent=2))
        return
    for finding in caps:
        echo(f"note: {finding.text}")
    echo(f"nccl-tests {path.name} on {topology}:")
    echo(format_microbench(rows))


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.3f} ms"


def _delta(value: float, base: float) -> str:
    if not base:
        return ""
    return f" ({(value - base) / base:+.1%})"


def _pct(stats: dict[str, float]) -> str:
    return f"median {stats['median']:.1%}, p90 {stats['p90']:.1%}"


def _printable(text: str) -> str:
    """Trace strings on a terminal: control characters escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def format_comparison(doc: dict[str, Any], efficiency: dict[str, float] | None = None, *,
                      verbose: bool = False) -> str:
    """The comparison table: per topology, step time, exposed comm per dim and the hottest link,
    each against the baseline (the first result); the replay error (cross-validated, then in
    sample and uncalibrated), the identity check and any caution."""
    from tracekit.replay.calibration import WHAT_IF_NOTE

    results = doc["results"]
    base = results[0]
    dims = sorted({d for r in results for d in r["exposed_ns"]})
    lines = []
    err = base["replay_error"]
    if err.get("calibrated_on") is not None:
        lines.append(f"baseline {_printable(base['topology'])}: replay error per instance {_pct(err['out_of_sample'])} "
                     f"(out of sample: calibrated on {_printable(str(err['calibrated_on']))}); uncalibrated "
                     f"{_pct(err['uncalibrated'])}")
    else:
        lines.append(f"baseline {_printable(base['topology'])}: replay error per instance "
                     f"{_pct(err['cross_validated'])} (cross-validated, {err['split']}); in sample "
                     f"{_pct(err['in_sample'])}; uncalibrated {_pct(err['uncalibrated'])}")
    ident = doc.get("identity")
    if ident:
        lines.append(f"identity (traced durations replayed): max step error {ident['max_step_error']:.2e}, "
                     f"{ident['instances_fallen_back']} instance(s) fall back to the traced relation")
    header = ["topology", "step (mean)"] + [f"exposed {d}/step" for d in dims] + ["hottest link"]
    rows = []
    base_step = _mean(base["step_ns"])
    for r in results:
        step = _mean(r["step_ns"])
        row = [_printable(r["topology"]), _ms(step) + _delta(step, base_step)]
        for d in dims:
            v = r["exposed_ns"].get(d, 0)
            row.append(_ms(v) + _delta(v, base["exposed_ns"].get(d, 0)))
        hot = r["hot_links"][0] if r["hot_links"] else None
        row.append(f"{hot['link']} peak {hot['peak_util']:.0%}" if hot else "-")
        rows.append(row)
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=False)))
    for row in rows:
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=False)))
    lines.append(f"traced step (mean) {_ms(_mean(base['traced_step_ns']))}")
    if len(results) > 1:
        lines.append(f"note: {WHAT_IF_NOTE}")
    if efficiency:
        source = err.get("calibrated_on")
        lines.append(f"calibration ({'from ' + _printable(str(source)) + ', ' if source is not None else ''}"
                     "traced / modelled): " + ", ".join(
            f"{_printable(k)} x{v:.2f}" for k, v in sorted(efficiency.items())))
    for f in doc.get("findings") or []:
        if f["kind"] == "replay_caution" and f["severity"] != "info":
            lines.append(f"caution: {_printable(f['text'])}")
    if verbose:
        lines.extend(_verbose_lines(doc))
    return "\n".join(lines)


def _verbose_lines(doc: dict[str, Any]) -> list[str]:
    lines = []
    deps = doc.get("dependencies") or {}
    if deps:
        lines.append("dependency edges per rule: " + ", ".join(f"{k} {v}" for k, v in deps.items()))
    err = doc["results"][0]["replay_error"]
    if err.get("calibrated_on") is not None:
        kinds_shown, heads = ("uncalibrated", "out_of_sample"), "uncalibrated | out of sample"
    else:
        kinds_shown = ("uncalibrated", "in_sample", "cross_validated")
        heads = "uncalibrated | in sample | cross-validated"
    lines.append(f"replay error per op (median / p90): {heads}")
    for op, kinds in err["by_op"].items():
        lines.append(f"  {_printable(op)}: " + " | ".join(
            f"{kinds[k]['median']:.1%} / {kinds[k]['p90']:.1%}" for k in kinds_shown))
    unseen = (doc.get("calibration") or {}).get("unseen_buckets") or {}
    if unseen:
        lines.append("buckets without a fit of their own under cross-validation: " + ", ".join(
            f"{_printable(b)} ({how})" for b, how in unseen.items()))
    for r in doc["results"]:
        cv = r.get("convergence")
        if cv:
            lines.append(f"fixed point on {_printable(r['topology'])}: {cv['rounds']} round"
                         f"{'s' if cv['rounds'] != 1 else ''}, last start move {cv['residual_ns'] / 1e3:.1f} µs "
                         f"(tolerance {cv['tolerance_ns'] / 1e3:.1f} µs){'' if cv['converged'] else ': not settled'}")
    ident = doc.get("identity") or {}
    for fb in (ident.get("fallbacks") or [])[:20]:
        lines.append(f"fallback: {_printable(fb['text'])}")
    if len(ident.get("fallbacks") or []) > 20:
        lines.append(f"fallback: ... and {len(ident['fallbacks']) - 20} more")
    for f in doc.get("findings") or []:
        if f["kind"] == "replay_caution" and f["severity"] == "info":
            lines.append(f"note: {_printable(f['text'])}")
    return lines


def _mean(values: dict[str, int]) -> float:
    return sum(values.values()) / len(values) if values else 0.0
