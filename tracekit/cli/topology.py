"""`tracekit topology`: describe and validate a network spec."""

from __future__ import annotations

import click

from tracekit.cli._common import echo, json_option, user_errors


@click.command()
@click.argument("spec")
@click.option("--hosts", type=click.IntRange(min=1), default=None,
              help="Size a spec that gives no hosts (default: 1 host).")
@json_option
@user_errors
def topology(spec: str, hosts: int | None, as_json: bool) -> None:
    """Describe a topology SPEC (a preset string such as `rail-optimized:hosts=16,oversub=2`,
    or a YAML file): GPUs, links per tier, bisection bandwidth and oversubscription per tier."""
    from tracekit.present import topology_description
    from tracekit.replay.topology import describe, parse_spec
    from tracekit.results import dumps

    parsed = parse_spec(spec)
    if hosts is not None:
        parsed = parsed.replace(hosts=hosts)
    info = describe(parsed)
    if as_json:
        click.echo(dumps(info))
    else:
        echo(topology_description(info))
