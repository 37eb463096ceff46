"""`tracekit diff`: why is one run slower than another, and is the network the reason?"""

from __future__ import annotations

from tracekit.diff.core import diff_runs, verdict
from tracekit.diff.results import RunDiff

__all__ = ["RunDiff", "diff_runs", "verdict"]
