"""Helpers shared by the CLI commands: error translation, terminal-safe output and shared option
decorators."""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import click

from tracekit._text import one_line, term
from tracekit.errors import TracekitError

F = TypeVar("F", bound=Callable[..., Any])


def user_errors(fn: F) -> F:
    """Turn library and OS errors into one-line click errors (exit code 1) instead of
    tracebacks; the message is escaped for the terminal (it may quote a trace string or a file
    name), line breaks included."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        pyarrow_without_pandas()
        try:
            return fn(*args, **kwargs)
        except click.ClickException as exc:  # ours are one line: a newline in it came from a trace or path
            exc.message = one_line(exc.message)
            raise
        except TracekitError as exc:
            raise click.ClickException(_one_line(str(exc))) from exc
        except OSError as exc:
            from tracekit.store import os_error

            raise click.ClickException(_one_line(str(os_error(exc)))) from exc

    return wrapper  # type: ignore[return-value]


class _NoPandas(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Sequence[str] | None = None, target: Any = None) -> None:
        if name.split(".")[0] == "pandas":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


class _AfterPyarrow(importlib.abc.MetaPathFinder):
    """Finds pyarrow as the other finders do, and has its import end with `_probe_pandas`."""

    def find_spec(self, name: str, path: Sequence[str] | None = None, target: Any = None) -> Any:
        if name != "pyarrow":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            exec_module = spec.loader.exec_module

            def exec_then_probe(module: Any) -> None:
                exec_module(module)
                _probe_pandas(module)

            spec.loader.exec_module = exec_then_probe  # type: ignore[method-assign]
        return spec


def pyarrow_without_pandas() -> None:
    """Let pyarrow's one look for pandas in this process find none (unless pandas is imported
    already), once pyarrow is imported: pyarrow imports pandas, when installed, on the first array
    it builds, only to ask of every value whether it is a pandas object, and a command makes none:
    0.2-0.3 s of CPU and about 100 MB per command (issue 26). pyarrow still imports pandas where
    it is asked for (`Table.to_pandas`), and `import pandas` works as ever."""
    if "pyarrow" in sys.modules:
        _probe_pandas(sys.modules["pyarrow"])
    elif not any(isinstance(f, _AfterPyarrow) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterPyarrow())


def _probe_pandas(pa: Any) -> None:
    if "pandas" in sys.modules:
        return
    finder = _NoPandas()
    sys.meta_path.insert(0, finder)
    try:
        pa.array([0])
    finally:
        sys.meta_path.remove(finder)


def _one_line(text: str) -> str:
    return term(" ".join(text.strip().splitlines()) or "error")


def echo(text: object = "", **kwargs: Any) -> None:
    """click.echo with control characters escaped (see `tracekit._text.term`)."""
    click.echo(term(text), **kwargs)


def echo_lines(lines: Iterable[str], **kwargs: Any) -> None:
    """Print a presenter's lines, each one line whatever names it quotes (`tracekit._text.one_line`)."""
    click.echo("\n".join(one_line(line) for line in lines), **kwargs)


def console(*, stderr: bool = False, **kwargs: Any) -> Any:
    """A rich Console (no markup) that escapes control characters in everything it prints
    (strings and the cells and titles of tables), so trace strings never reach the terminal raw.
    Each string printed is one line and each cell one cell: a newline or tab inside is escaped
    too (`tracekit._text.one_line`). The terminal's width, or 160 columns when the output is not
    a terminal (a pipe, a test)."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    class SafeConsole(Console):
        def print(self, *objects: Any, **kw: Any) -> None:  # type: ignore[override]
            super().print(*(_safe(o) for o in objects), **kw)

    def _safe(obj: Any) -> Any:
        if isinstance(obj, str):
            return one_line(obj)
        if isinstance(obj, Text):
            return Text(one_line(obj.plain), style=obj.style)
        if isinstance(obj, Table):
            if isinstance(obj.title, str):
                obj.title = one_line(obj.title)
            for col in obj.columns:
                col._cells = [_safe(c) for c in col._cells]
                if isinstance(col.header, str):
                    col.header = one_line(col.header)
        return obj

    kwargs.setdefault("markup", False)
    kwargs.setdefault("highlight", False)
    kwargs.setdefault("soft_wrap", True)
    out = SafeConsole(stderr=stderr, **kwargs)
    if not out.is_terminal and "width" not in kwargs:
        out = SafeConsole(stderr=stderr, width=160, **kwargs)
    return out


def unsaved_note(run: Any) -> None:
    """Say on stderr which results could not be saved into a (read-only, full or busy) run."""
    for text in getattr(run, "unsaved", []) or []:
        click.echo(term(f"note: {text}"), err=True)


def json_option(fn: F) -> F:
    """`--json`: print machine-readable JSON instead of tables."""
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")(fn)


def executor_options(fn: F) -> F:
    """`--executor` and `--task-memory`: run per-file or per-rank work here or as Ray tasks."""
    fn = click.option("--task-memory", default=None, metavar="SIZE",
                      help="Memory each Ray task reserves, e.g. 4GiB (Ray schedules by it; default: none).")(fn)
    return click.option("--executor", default="local", show_default=True, metavar="local|ray[://HOST:PORT]",
                        help="Run the work here, or as Ray tasks: `ray` joins the connected cluster, RAY_ADDRESS "
                             "or a new local Ray; `ray://HOST:PORT` connects through Ray Client. The run "
                             "directory must be on storage every node shares (docs/scale.md).")(fn)


def run_argument(fn: F) -> F:
    """RUN: a run directory, or a trace file or folder that is ingested first (see `open_run_arg`)."""
    from pathlib import Path

    return click.argument("run", metavar="RUN|PATH", type=click.Path(path_type=Path))(fn)


def open_run_arg(path: Any) -> Any:
    """The `Run` for a RUN|PATH argument: a run directory as is; raw traces ingested into the cache
    `tracekit replay` uses for the same path, with a note on stderr saying where."""
    from pathlib import Path

    from tracekit import workflows
    from tracekit.errors import TracekitError
    from tracekit.ingest import is_run_dir

    if not Path(path).exists():
        raise TracekitError(f"{path}: no such file or directory (so not a tracekit run directory, nor traces)")
    if is_run_dir([path]):
        return workflows.open(path)  # a run directory: its own error (a malformed manifest, say) as is
    try:
        got = workflows.opened([path])
    except TracekitError as exc:
        raise TracekitError(f"{path}: not a tracekit run directory, and ingesting it as traces failed ({exc}); "
                            "run `tracekit ingest PATH -o RUN` to see what was read") from exc
    if got.ingested:
        click.echo(term(f"note: {path} is not a run directory: ingested into {got.run.path} (the run `tracekit "
                        "replay` keeps for these traces; later commands on them reuse it)"), err=True)
    return got.run
