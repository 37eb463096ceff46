"""Rows of the small user files the what-ifs read (expert loads, expert and rank maps): CSV with a
header, or JSON, each failure a one-line `InputError` naming the file."""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tracekit.errors import InputError


def load_json(path: Path) -> Any:
    """The decoded JSON of `path`."""
    try:
        return json.loads(path.read_text())
    except OSError as exc:
        raise InputError(path, f"cannot read: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(path, f"not valid JSON: {exc}") from None


def read_rows(path: str | os.PathLike[str], *, from_json: Callable[[Any], Any] | None = None,
              expected: str = "a JSON list of objects") -> list[dict[str, Any]]:
    """Rows as dicts: a `.json` file (reshaped by `from_json` into a list of objects), else CSV."""
    p = Path(path)
    if p.suffix.lower() == ".json":
        data = load_json(p)
        if from_json is not None:
            data = from_json(data)
        if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
            raise InputError(p, f"expected {expected}")
        rows = data
    else:
        try:
            with p.open(newline="") as fh:
                rows = list(csv.DictReader(fh))
        except OSError as exc:
            raise InputError(p, f"cannot read: {exc.strerror or exc}") from None
        except (UnicodeDecodeError, csv.Error) as exc:
            raise InputError(p, f"not a readable CSV file: {exc}") from None
    if not rows:
        raise InputError(p, "no rows")
    return rows
