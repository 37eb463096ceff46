"""Generate the CLI reference (docs/cli.md) from the commands' own `--help`.

Regenerate with: python -m tracekit.cli._docs > docs/cli.md
"""

from __future__ import annotations

import click

from tracekit.cli import COMMANDS, main


def cli_reference(width: int = 100) -> str:
    """The Markdown CLI reference: one section per command, its help text verbatim."""
    parts = ["# CLI reference", "", "Generated from `--help` by `python -m tracekit.cli._docs`; do not edit.", ""]
    root = click.Context(main, info_name="tracekit", terminal_width=width, max_content_width=width,
                         **main.context_settings)
    parts += ["## tracekit", "", "```", main.get_help(root), "```", ""]
    for name in sorted(COMMANDS):
        command = main.get_command(root, name)
        if command is None:
            continue
        ctx = click.Context(command, info_name=name, parent=root, terminal_width=width,
                            max_content_width=width, **main.context_settings)
        parts += [f"## tracekit {name}", "", "```", command.get_help(ctx), "```", ""]
    return "\n".join(parts)


if __name__ == "__main__":
    print(cli_reference(), end="")
