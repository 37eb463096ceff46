"""tracekit: postmortem analysis of the network side of distributed training.

Ingest traces into normalized Arrow tables, align ranks on one clock, match and classify
collectives, replay the communication on a network model, and report. The library API is the
front door, `tracekit.workflows`: `open`, `analyze`, `replay`, `hang`, `whatif`, `report`,
`export` and `diff`, one function per command over a run.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tracekit import workflows
    from tracekit.errors import InputError, TracekitError
    from tracekit.schema import SCHEMA_VERSION
    from tracekit.store import Run, RunError

__version__ = "0.1.0"

__all__ = ["SCHEMA_VERSION", "InputError", "Run", "RunError", "TracekitError", "__version__", "workflows"]

# Imported on first use, so `import tracekit.cli` does not load pyarrow and polars: the CLI can
# say something before its heavy imports.
_LAZY = {"SCHEMA_VERSION": "tracekit.schema", "InputError": "tracekit.errors", "TracekitError": "tracekit.errors",
         "Run": "tracekit.store", "RunError": "tracekit.store", "workflows": "tracekit.workflows"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tracekit' has no attribute {name!r}")
    value = importlib.import_module(module) if module == f"tracekit.{name}" else getattr(
        importlib.import_module(module), name)
    globals()[name] = value
    return value
