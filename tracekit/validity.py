"""Run validity: which job a run holds, which of its ranks are present, and what is unknown.

Checked at ingest (`check_sources`: sources from different jobs are refused unless the user
allows it, and a rank with sources from two jobs is always an error) and read everywhere else
(`run_validity`), so every finding, table and tab that depends on missing ranks or unknown hosts
can say so in the same sentence.

Two sources belong to the same job when nothing they record disagrees: the same world size
(when both know it), the same members for every process group both list completely, and time
spans less than `MAX_GAP_NS` apart (profiler windows of one job overlap; Flight Recorder dumps
come minutes after the last step at most, as the collective timeout is ten minutes by default).
"""

from __future__ import annotations

import datetime as _dt
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa

from tracekit._text import fmt_ranks
from tracekit.errors import TracekitError
from tracekit.finding import Finding
from tracekit.manifest import ValidityEntry
from tracekit.results import Result, from_builtins, to_builtins

#: Sources further apart in time than this are from different jobs.
MAX_GAP_NS = 3_600 * 10**9

class MixedRunError(TracekitError):
    """The inputs come from different jobs (or one rank has sources from two jobs)."""


@dataclass(frozen=True)
class SourceJob:
    """What one source says about the job it came from."""

    path: str
    ranks: tuple[int, ...]
    world_size: int | None
    groups: Mapping[str, tuple[int, ...]]
    start_ns: int | None
    end_ns: int | None


class Job(Result, frozen=False, kw_only=True):
    """Sources that agree with each other: one training job."""

    world_size: int | None = None
    ranks: list[int] = msgspec.field(default_factory=list)
    sources: list[str] = msgspec.field(default_factory=list)
    start_ns: int | None = None
    end_ns: int | None = None

    def describe(self) -> str:
        """ "world 8, 8 ranks, from 2023-09-07 23:10 UTC (3 sources)"."""
        world = f"world {self.world_size}" if self.world_size else "world size unknown"
        when = f", from {_date(self.start_ns)}" if self.start_ns else ""
        n = len(self.sources)
        return f"{world}, rank{'s' if len(self.ranks) != 1 else ''} {fmt_ranks(self.ranks, limit=6)}{when} " \
               f"({n} source{'s' if n != 1 else ''})"



class RunValidity(Result, frozen=False, kw_only=True):
    """What a run holds of its job(s): the world size, the ranks present and missing, the ranks
    whose host is unknown, and the jobs its sources came from (more than one only when mixing was
    allowed)."""

    world_size: int | None = None
    ranks: list[int] = msgspec.field(default_factory=list)
    missing_ranks: list[int] = msgspec.field(default_factory=list)
    hosts_unknown: list[int] = msgspec.field(default_factory=list)
    jobs: list[Job] = msgspec.field(default_factory=list)
    allow_mixed: bool = False

    @property
    def n_present(self) -> int:
        return len(self.ranks)

    @property
    def partial(self) -> bool:
        """Some ranks of the job left nothing in this run."""
        return bool(self.missing_ranks)

    @property
    def mixed(self) -> bool:
        return len(self.jobs) > 1

    @property
    def cross_rank(self) -> bool:
        """Whether anything across ranks (waits, stragglers, clock offsets) can be measured."""
        return self.n_present >= 2

    def presence(self) -> str:
        """ "1 of 8 ranks present" (or "8 ranks, world size unknown")."""
        if self.world_size:
            return f"{self.n_present} of {self.world_size} ranks present"
        return f"{self.n_present} rank{'s' if self.n_present != 1 else ''} present, world size unknown"

    def caveat(self) -> str:
        """A clause to put in any sentence that depends on ranks being there, or ""."""
        if not self.partial:
            return ""
        if not self.cross_rank:
            return f"{self.presence()}: cross-rank findings are not possible"
        return f"{self.presence()}: ranks outside the run are not seen"

    def findings(self) -> list[Finding]:
        """partial_run, mixed_jobs and unknown_hosts findings (most serious first)."""
        out: list[Finding] = []
        if self.mixed:
            out.append(Finding(
                kind="mixed_jobs", severity="error", value=float(len(self.jobs)),
                ranks=tuple(self.ranks),
                text=f"This run mixes {len(self.jobs)} jobs (allowed with --allow-mixed): "
                     + "; ".join(j.describe() for j in self.jobs)
                     + ". Cross-rank results compare ranks of different jobs and mean nothing.",
                data={"jobs": to_builtins(self.jobs)}))
        if self.partial:
            missing = fmt_ranks(self.missing_ranks, limit=8)
            what = ("cross-rank findings (waits, stragglers, clock alignment, EP load) are not possible"
                    if not self.cross_rank else
                    "waits, stragglers and EP load only cover the ranks present, and a rank "
                    "outside the run may be the one the others waited for")
            out.append(Finding(
                kind="partial_run", severity="warning", ranks=tuple(self.missing_ranks),
                value=float(self.n_present),
                text=f"{self.presence()} (missing: {missing}): {what}.",
                data={"world_size": self.world_size, "present": self.ranks}))
        if self.hosts_unknown:
            n = len(self.hosts_unknown)
            who = "no rank's" if n == self.n_present else f"{n} of {self.n_present} ranks'"
            out.append(Finding(
                kind="unknown_hosts", severity="warning", ranks=tuple(self.hosts_unknown), value=float(n),
                text=f"The traces name {who} host: intra- and inter-host traffic cannot be told apart, "
                     "and replay places ranks on hosts by rank order (the topology's GPUs per host)."))
        return out


def replay_cautions(v: RunValidity) -> list[Finding]:
    """What a replay of this run must say about the data it rests on (replay_caution findings)."""
    out: list[Finding] = []
    if v.mixed:
        out.append(Finding(kind="replay_caution", severity="warning", value=float(len(v.jobs)),
                           text=f"this run mixes {len(v.jobs)} jobs: the replay schedules their traffic as one job",
                           data={"reason": "mixed_jobs"}))
    if v.partial:
        out.append(Finding(
            kind="replay_caution", severity="warning", value=float(v.n_present), ranks=tuple(v.missing_ranks),
            text=f"{v.presence()}: the replay moves only their traffic, and a collective whose other members are "
                 "outside the run has no flows, so topologies can hardly differ",
            data={"reason": "partial_run"}))
    if v.hosts_unknown:
        out.append(Finding(
            kind="replay_caution", severity="warning", value=float(len(v.hosts_unknown)),
            ranks=tuple(v.hosts_unknown),
            text="hosts unknown: ranks were placed on hosts by rank order (the topology's GPUs per host), so "
                 "which traffic crosses NICs and leaves follows that guess, not the job",
            data={"reason": "unknown_hosts"}))
    return out


def _date(ns: int | None) -> str:
    if ns is None:
        return "?"
    return _dt.datetime.fromtimestamp(ns / 1e9, tz=_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def source_job(path: str, ranks: Sequence[int], ranks_table: pa.Table | None, groups_table: pa.Table | None,
               start_ns: int | None, end_ns: int | None) -> SourceJob:
    """The job facts of one source, from its own `ranks` and `groups` parts."""
    world = None
    if ranks_table is not None and "world_size" in ranks_table.column_names:
        sizes = [w for w in ranks_table.column("world_size").to_pylist() if w]
        world = max(sizes) if sizes else None
    groups: dict[str, tuple[int, ...]] = {}
    if groups_table is not None and groups_table.num_rows:
        cols = groups_table.select([c for c in ("group", "ranks", "ranks_complete")
                                    if c in groups_table.column_names]).to_pylist()
        for g in cols:
            if g.get("ranks_complete") and g.get("group") is not None and g.get("ranks"):
                groups[str(g["group"])] = tuple(sorted(g["ranks"]))
    return SourceJob(path=path, ranks=tuple(sorted(ranks)), world_size=world, groups=groups,
                     start_ns=start_ns, end_ns=end_ns)


def _conflict(job: Job, groups: Mapping[str, tuple[int, ...]], src: SourceJob) -> str | None:
    """Why `src` cannot belong to `job` (whose sources list `groups` completely), or None."""
    if job.world_size and src.world_size and job.world_size != src.world_size:
        return f"world size {src.world_size} vs {job.world_size}"
    for g, members in src.groups.items():
        other = groups.get(g)
        if other is not None and other != members:
            return f"process group {g!r} has other members"
    if src.start_ns is not None and job.start_ns is not None:
        gap = max(src.start_ns - (job.end_ns or job.start_ns), job.start_ns - (src.end_ns or src.start_ns))
        if gap > MAX_GAP_NS:
            return f"{gap / 3.6e12:.0f} hours apart"
    return None


def group_jobs(sources: Sequence[SourceJob]) -> list[Job]:
    """Sources clustered into jobs, earliest first (a source joins the first job it agrees with)."""
    jobs: list[Job] = []
    groups: list[dict[str, tuple[int, ...]]] = []  # per job: its process groups' members
    order = sorted(sources, key=lambda s: (s.start_ns is None, s.start_ns or 0, s.path))
    for src in order:
        if not src.ranks:
            continue  # telemetry, nccl-tests: not tied to a rank, so not to a job either
        at = next((i for i, j in enumerate(jobs) if _conflict(j, groups[i], src) is None), None)
        if at is None:
            at = len(jobs)
            jobs.append(Job())
            groups.append({})
        home = jobs[at]
        home.world_size = home.world_size or src.world_size
        home.ranks = sorted(set(home.ranks) | set(src.ranks))
        home.sources.append(src.path)
        for g, members in src.groups.items():
            groups[at].setdefault(g, members)
        if src.start_ns is not None:
            home.start_ns = src.start_ns if home.start_ns is None else min(home.start_ns, src.start_ns)
            end = src.end_ns if src.end_ns is not None else src.start_ns
            home.end_ns = end if home.end_ns is None else max(home.end_ns, end)
    return jobs


def check_run_dir(run_dir: str | os.PathLike[str], sources: Sequence[Any], *,
                  allow_mixed: bool = False) -> RunValidity:
    """`check_sources` on the sources ingest just parsed into `run_dir` (reports with `key`,
    `path`, `ranks`, `ts_min_ns`, `ts_max_ns`): the hook ingest calls before it merges."""
    import pyarrow.parquet as pq

    from tracekit.store import part_path, peek_written

    def part(key: str, name: str) -> pa.Table | None:
        path = part_path(run_dir, key, name)
        if not path.is_file():
            return None
        written = peek_written(path)  # a parse in this process kept it: no read back
        return written if written is not None else pq.read_table(path)

    facts = []
    hosts: dict[int, str | None] = {}
    for s in sources:
        ranks_part = part(s.key, "ranks")
        facts.append(source_job(s.path, s.ranks, ranks_part, part(s.key, "groups"), s.ts_min_ns, s.ts_max_ns))
        if ranks_part is not None and "host" in ranks_part.column_names:
            for r, h in zip(ranks_part.column("rank").to_pylist(), ranks_part.column("host").to_pylist(),
                            strict=True):
                if r is not None:
                    hosts[int(r)] = hosts.get(int(r)) or h
    return check_sources(facts, allow_mixed=allow_mixed, hosts=hosts)


def check_sources(sources: Sequence[SourceJob], *, allow_mixed: bool = False,
                  hosts: Mapping[int, str | None] | None = None) -> RunValidity:
    """The validity of a run made of these sources; raises `MixedRunError` when they come from
    different jobs (unless `allow_mixed`) or when one rank has sources from two jobs (always)."""
    jobs = group_jobs(sources)
    owner: dict[int, Job] = {}
    for job in jobs:
        for r in job.ranks:
            first = owner.setdefault(r, job)
            if first is not job:
                a = next(s for s in first.sources if any(r in x.ranks for x in sources if x.path == s))
                b = next(s for s in job.sources if any(r in x.ranks for x in sources if x.path == s))
                raise MixedRunError(
                    f"the inputs come from {len(jobs)} different jobs, and rank {r} has sources from two of them: "
                    f"{a} ({first.describe()}) and {b} ({job.describe()}); the jobs: {_jobs_listing(jobs)}; "
                    "ingest each job into its own run")
    if len(jobs) > 1 and not allow_mixed:
        raise MixedRunError(f"the inputs come from {len(jobs)} different jobs ({_jobs_listing(jobs)}); ingest each "
                            "job into its own run, or pass --allow-mixed to keep them in one")
    return _validity(jobs, hosts or {}, allow_mixed=allow_mixed)


#: Files named per job in the mixed-jobs error (the rest are counted).
MAX_FILES_NAMED = 8


def _jobs_listing(jobs: list[Job]) -> str:
    """ "job 1: world 8, ranks 0-7, from ... (2 sources): a.json, b.json; job 2: ...": every job and its files."""
    from tracekit._text import short_paths

    names = short_paths([p for j in jobs for p in j.sources])
    parts = []
    for i, j in enumerate(jobs):
        files = [names[p] for p in j.sources[:MAX_FILES_NAMED]]
        more = len(j.sources) - len(files)
        parts.append(f"job {i + 1}: {j.describe()}: {', '.join(files)}" + (f" and {more} more" if more else ""))
    return "; ".join(parts)


def _validity(jobs: list[Job], hosts: Mapping[int, str | None], *, allow_mixed: bool) -> RunValidity:
    ranks = sorted({r for j in jobs for r in j.ranks} | set(hosts))
    world = max((j.world_size for j in jobs if j.world_size), default=None)
    if len(jobs) > 1:
        missing = sorted({j_r for j in jobs if j.world_size for j_r in range(j.world_size)} - set(ranks))
    else:
        missing = sorted(set(range(world)) - set(ranks)) if world else []
    unknown = sorted(r for r in ranks if not hosts.get(r))
    return RunValidity(world_size=world, ranks=ranks, missing_ranks=missing, hosts_unknown=unknown, jobs=jobs,
                       allow_mixed=allow_mixed)


def from_ranks(ranks: pa.Table | None) -> RunValidity:
    """Validity from a `ranks` table alone (a run without a validity record, or a dict of tables)."""
    if ranks is None or ranks.num_rows == 0:
        return RunValidity(world_size=None, ranks=[], missing_ranks=[], hosts_unknown=[])
    cols = ranks.select([c for c in ("rank", "world_size", "host") if c in ranks.column_names]).to_pylist()
    hosts: dict[int, str | None] = {}
    for row in cols:
        if row.get("rank") is not None:
            r = int(row["rank"])
            hosts[r] = hosts.get(r) or row.get("host")
    sizes = [int(row["world_size"]) for row in cols if row.get("world_size")]
    job = Job(world_size=max(sizes) if sizes else None, ranks=sorted(hosts), sources=[], start_ns=None, end_ns=None)
    return _validity([job], hosts, allow_mixed=False)


def run_validity(source: Any) -> RunValidity:
    """The validity of a run directory (path or `Run`), or of a dict of tables.

    The ranks present and their hosts always come from the run's `ranks` table; the jobs come
    from the record ingest left in the manifest, when there is one.
    """
    from tracekit.store import Run

    if isinstance(source, Mapping):
        return from_ranks(source.get("ranks"))
    run = source if isinstance(source, Run) else Run(source)
    found = from_ranks(run.table("ranks"))
    saved = run.manifest.validity
    if isinstance(saved, ValidityEntry):
        recorded = from_builtins(to_builtins(saved), RunValidity)
        found.jobs = recorded.jobs
        found.allow_mixed = recorded.allow_mixed
        if recorded.world_size and not found.world_size:
            found.world_size = recorded.world_size
            found.missing_ranks = sorted(set(range(recorded.world_size)) - set(found.ranks))
    return found


def run_name(source: Any) -> str:
    """A name for people: the folder the sources were read from ("synth_moe_16rank"), not the
    run directory's (which may be a cache key)."""
    from tracekit.store import Run

    if isinstance(source, Mapping):
        return "tables"
    run = source if isinstance(source, Run) else Run(source)
    paths = [s.path for s in run.manifest.sources if s.path and not s.error]
    if paths:
        common = Path(os.path.commonpath([str(Path(p).parent) for p in paths]))
        if common.name and common.name not in ("json", "pickle", "fr"):
            return common.name
        if common.name:
            return common.parent.name or common.name
    return run.path.name
