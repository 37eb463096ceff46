"""Helpers shared by the CLI commands: error translation and shared option decorators."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import click

from tracekit.errors import TracekitError

F = TypeVar("F", bound=Callable[..., Any])


def user_errors(fn: F) -> F:
    """Turn library errors into one-line click errors (exit code 1) instead of tracebacks."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except TracekitError as exc:
            raise click.ClickException(str(exc)) from exc

    return wrapper  # type: ignore[return-value]


def json_option(fn: F) -> F:
    """`--json`: print machine-readable JSON instead of tables."""
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")(fn)


def console(*, stderr: bool = False) -> Any:
    """A rich console that prints trace strings as they are (no markup): the terminal's width, or
    160 columns when the output is not a terminal (a pipe, a file, a test)."""
    from rich.console import Console

    out = Console(stderr=stderr, markup=False, highlight=False, soft_wrap=True)
    if not out.is_terminal:
        out = Console(stderr=stderr, markup=False, highlight=False, soft_wrap=True, width=160)
    return out


def executor_options(fn: F) -> F:
    """`--executor` and `--task-memory`: run per-file or per-rank work here or as Ray tasks."""
    fn = click.option("--task-memory", default=None, metavar="SIZE",
                      help="Memory each Ray task reserves, e.g. 4GiB (Ray schedules by it; default: none).")(fn)
    return click.option("--executor", default="local", show_default=True, metavar="local|ray[://HOST:PORT]",
                        help="Run the work here, or as Ray tasks: `ray` joins the connected cluster, RAY_ADDRESS "
                             "or a new local Ray; `ray://HOST:PORT` connects through Ray Client. The run "
                             "directory must be on storage every node shares (docs/scale.md).")(fn)
