"""Exceptions that the CLI turns into one-line messages (exit code 1), never tracebacks."""

from __future__ import annotations

import os


class TracekitError(Exception):
    """A user-facing error: bad input, a bad option, a missing run."""


class InputError(TracekitError):
    """An input file is unknown, corrupt or unusable; the message names the file and the problem."""

    def __init__(self, path: str | os.PathLike[str], problem: str) -> None:
        self.path = os.fspath(path)
        problem = " ".join(str(problem).split()) if "\n" in str(problem) else str(problem)  # always one line
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")
