"""The `tracekit` command line: a thin layer over the library, one module per command."""

from __future__ import annotations

import importlib

import click

from tracekit import __version__

# command name -> "module:attribute"; modules are imported only when their command runs.
COMMANDS: dict[str, str] = {
    "ingest": "tracekit.cli.ingest:ingest",
    "info": "tracekit.cli.info:info",
    "analyze": "tracekit.cli.analyze:analyze",
    "hang": "tracekit.cli.hang:hang",
    "replay": "tracekit.cli.replay:replay",
    "report": "tracekit.cli.report:report",
    "topology": "tracekit.cli.topology:topology",
    "synth": "tracekit.cli.synth:synth",
    "whatif": "tracekit.cli.whatif:whatif",
    "export": "tracekit.cli.export:export",
    "diff": "tracekit.cli.diff:diff",
}


class LazyGroup(click.Group):
    """A click group that imports each command's module on first use (keeps `--help` fast)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(COMMANDS))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return super().get_command(ctx, cmd_name)
        module_name, attr = target.split(":")
        return getattr(importlib.import_module(module_name), attr)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tracekit")
def main() -> None:
    """Postmortem analysis of the network side of distributed training."""
    from tracekit import _progress

    _progress.enable()
