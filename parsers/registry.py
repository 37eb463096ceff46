"""The parser registry: every input format tracekit reads, declared once by its parser module as
a `Format`, and the one detection order. Importing this module imports no parser: a format's
module is imported when detection reaches it or ingest parses with it (see docs/architecture.md
"The parser registry")."""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from tracekit.store import ParseResult

#: A parse option beyond `rank` that ingest hands to the parsers that declare it:
#: `comm_patterns` (the communication markers' name patterns), `rank_map` ((host, pid, device) -> rank).
Option = Literal["comm_patterns", "rank_map"]


@dataclass(frozen=True)
class Head:
    """What a sniff sees: a file's first (decompressed) bytes and its path (None for bytes alone)."""

    data: bytes
    path: Path | None = None

    @property
    def body(self) -> bytes:
        """The bytes after a byte-order mark and leading white space."""
        return self.data.lstrip(b"\xef\xbb\xbf \t\r\n")

    @property
    def json_object(self) -> bool:
        """Whether the file starts like a JSON object (line formats do not look at those)."""
        return self.body.startswith(b"{")


#: Whether a file looks like a format, from its head.
Sniff = Callable[[Head], bool]


@dataclass(frozen=True)
class Format:
    """One input format, declared by its parser module as `FORMAT` (see the module list below).

    `sniffs` are tried where DETECTION names the format (the first time the first sniff, ...);
    `parse(path, sink, rank=..., **options)` takes the `options` it declares; `priority` decides
    which source describes a rank's collectives and events when several do (lower wins; 99: it
    never competes); a `snapshot` format's files are copies of one history (one per rank counts).
    `maps_peers`: its groups map communicator-local peers to global ranks. `nccl_facts`: its
    collectives lend NCCL's algo/proto, its ranks table bus ids, hosts and (host, pid, device) ->
    rank to the ranks other sources describe. The two refusals name a parse error that ingest
    answers by parsing again: a lone file as rank 0 (`alone_is_rank0`), or with the ranks the
    run's NCCL logs and `--rank-map` give (`ranks_from_logs`)."""

    name: str
    description: str
    sniffs: tuple[Sniff, ...]
    parse: Callable[..., ParseResult]
    version: str
    options: tuple[Option, ...] = ()
    priority: int = 99
    snapshot: bool = False
    maps_peers: bool = False
    nccl_facts: bool = False
    alone_is_rank0: str | None = None
    ranks_from_logs: str | None = None

    @property
    def telemetry(self) -> bool:
        """Whether this is a telemetry or fabric format (sources with no rank)."""
        return MODULES[self.name].startswith(TELEMETRY_PACKAGE + ".")


TELEMETRY_PACKAGE = "tracekit.parsers.telemetry"
#: Every format, in the order messages list them (traces, then telemetry): name -> its module.
MODULES = {
    "kineto": "tracekit.parsers.kineto", "nsys": "tracekit.parsers.nsys",
    "flight_recorder": "tracekit.parsers.flight_recorder", "nccl_tests": "tracekit.parsers.nccl_tests",
    "nccl_log": "tracekit.parsers.nccl_log", "nccl_inspector": "tracekit.parsers.nccl_inspector",
    "nccl_profiler": "tracekit.parsers.nccl_profiler",
    **{name: f"{TELEMETRY_PACKAGE}.{name}" for name in (
        "prometheus", "prometheus_json", "gnmic", "perfquery", "ufm_telemetry", "sysfs_ib", "ibnetdiscover",
        "link_map")},
}
#: The detection order: the first sniff that says yes names a file's format. nccl-tests is tried
#: twice: its `-J` JSON before Inspector's JSONL, its text tables after the NCCL logs (a test run
#: with NCCL_DEBUG=INFO prints both, and is read as a log).
DETECTION = ("nsys", "kineto", "flight_recorder", "nccl_tests", "nccl_inspector", "nccl_profiler", "nccl_log",
             "nccl_tests", "prometheus", "prometheus_json", "gnmic", "perfquery", "ufm_telemetry", "sysfs_ib",
             "ibnetdiscover", "link_map")


def names() -> tuple[str, ...]:
    """Every format name, in MODULES order (imports no parser)."""
    return tuple(MODULES)


@functools.cache
def get(name: str) -> Format | None:
    """The format called `name` (its parser module imported), or None for a name tracekit does not know."""
    module = MODULES.get(name)
    if module is None:
        return None
    spec = importlib.import_module(module).FORMAT
    if not isinstance(spec, Format) or spec.name != name:
        raise TypeError(f"{module}.FORMAT must be the Format named {name!r}")
    return spec


def formats() -> tuple[Format, ...]:
    """Every format (all parser modules imported), in MODULES order."""
    return tuple(get(name) for name in MODULES)  # type: ignore[misc]


def detect(head: Head) -> str | None:
    """The format of a file with this head: the first in DETECTION whose sniff says yes, or None."""
    tried: dict[str, int] = {}
    for name in DETECTION:
        spec = get(name)
        turn = tried[name] = tried.get(name, -1) + 1
        if spec is not None and spec.sniffs[turn](head):
            return name
    return None


def priority(name: str | None) -> int:
    """Which format describes a rank when several do (lower wins; 99 for any that never competes)."""
    spec = get(name) if name else None
    return spec.priority if spec is not None else 99


def supported_formats() -> str:
    """ "traces: Kineto traces, ...; telemetry: Prometheus text, ...": every format ingest reads."""
    every = formats()
    traces = [f.description for f in every if not f.telemetry]
    telemetry = [f.description for f in every if f.telemetry]
    return f"traces: {', '.join(traces)}; telemetry: {', '.join(telemetry)}"
