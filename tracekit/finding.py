"""A finding: one verdict in words with the numbers behind it, the shape every layer shares.

Analyses, `hang`, replay and ingest produce findings; the CLI prints their `text`, `--json`
emits them through `tracekit.results`, and the report draws them. Nobody re-derives a finding
from another's text.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from msgspec import UNSET, UnsetType

SEVERITIES = ("info", "warning", "error")

#: Known kinds; producers may add more, documented next to the code that emits them.
KINDS = (
    "straggler", "systemic_straggler", "root_cause", "stall", "exposed_comm", "idle", "ep_imbalance",
    "pp_bubble", "mismatch", "no_group", "alignment", "partial_run", "mixed_jobs", "assumed_splits",
    "unknown_hosts", "replay_caution", "hang", "nccl_warn", "telemetry_flag", "physics_cap", "cpu_backend",
    "not_simulated", "microbench", "telemetry",
)


@dataclass(frozen=True)
class Finding:
    """One verdict: `kind` (see KINDS), `severity`, the sentence, and the facts it rests on.

    Built as `Finding(kind, text, severity=..., ...)`; the fields are declared in the order the
    JSON lists them (`text` after `value`), and `data` is UNSET (so left out of the JSON) when
    there are no facts beyond the others."""

    kind: str
    severity: str = field(default="info", kw_only=True)
    ranks: tuple[int, ...] = field(default=(), kw_only=True)
    group: str | None = field(default=None, kw_only=True)
    step: int | None = field(default=None, kw_only=True)
    value: float | None = field(default=None, kw_only=True)
    text: str
    data: Mapping[str, Any] | UnsetType = field(default=UNSET, kw_only=True)

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity {self.severity!r} is not one of {', '.join(SEVERITIES)}")
        object.__setattr__(self, "ranks", tuple(int(r) for r in self.ranks))
        if not self.data:
            object.__setattr__(self, "data", UNSET)

    def __str__(self) -> str:
        return self.text


def texts(findings: Iterable[Finding]) -> list[str]:
    """The sentences alone, in order."""
    return [f.text for f in findings]
