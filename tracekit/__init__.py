"""tracekit: postmortem analysis of the network side of distributed training.

Ingest traces into normalized Arrow tables, align ranks on one clock, match and classify
collectives, replay the communication on a network model, and report.
"""

from __future__ import annotations

from tracekit.errors import InputError, TracekitError
from tracekit.schema import SCHEMA_VERSION
from tracekit.store import Run, RunError

__version__ = "0.1.0"

__all__ = ["SCHEMA_VERSION", "InputError", "Run", "RunError", "TracekitError", "__version__"]
