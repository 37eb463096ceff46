"""A finding: one verdict in words with the numbers behind it, the shape every layer shares.

Analyses, `hang`, replay and ingest produce findings; the CLI prints their `text`, `--json`
emits `to_json()`, and the report draws them. Nobody re-derives a finding from another's text.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

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
    """One verdict: `kind` (see KINDS), `severity`, the sentence, and the facts it rests on."""

    kind: str
    text: str
    severity: str = "info"
    ranks: tuple[int, ...] = ()
    group: str | None = None
    step: int | None = None
    value: float | None = None
    data: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity {self.severity!r} is not one of {', '.join(SEVERITIES)}")
        object.__setattr__(self, "ranks", tuple(int(r) for r in self.ranks))

    def __str__(self) -> str:
        return self.text

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "severity": self.severity, "ranks": list(self.ranks), "group": self.group,
                "step": self.step, "value": self.value, "text": self.text, **({"data": dict(self.data)}
                                                                                if self.data else {})}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Finding:
        return cls(kind=str(obj["kind"]), text=str(obj["text"]), severity=str(obj.get("severity", "info")),
                   ranks=tuple(obj.get("ranks") or ()), group=obj.get("group"), step=obj.get("step"),
                   value=obj.get("value"), data=dict(obj.get("data") or {}))


def texts(findings: Iterable[Finding]) -> list[str]:
    """The sentences alone, in order."""
    return [f.text for f in findings]
