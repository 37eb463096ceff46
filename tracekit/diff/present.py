"""A `RunDiff` into rows and lines for the CLI (and the report): every figure formatted once, here."""

from __future__ import annotations

from tracekit._text import fmt_bytes, fmt_ns, fmt_rate
from tracekit.diff.results import RunDiff

WATERFALL_COLUMNS = ["part", "A", "B", "change", "noise", ""]
BUCKET_COLUMNS = ["op", "dim", "group", "size", "per step", "duration A", "duration B", "busbw A", "busbw B",
                  "speed", ""]
RANK_COLUMNS = ["rank", "host", "compute", "exposed comm", "late", "slower in"]
SETUP_COLUMNS = ["what", "A", "B"]
BAR_WIDTH = 24


def signed(ns: float) -> str:
    """A signed duration: +3.2 ms, -812 ns."""
    return ("+" if ns >= 0 else "-") + fmt_ns(abs(ns))


def _bar(delta: float, scale: float) -> str:
    if not scale:
        return ""
    n = round(BAR_WIDTH * abs(delta) / scale)
    return ("+" if delta > 0 else "-") * n


def waterfall_rows(d: RunDiff) -> list[list[str]]:
    """The step time in A, each part's change (with a bar and `*` when it stands out of the noise),
    the remainder and the step time in B."""
    deco = d.decomposition
    scale = max([abs(p.delta_ns) for p in deco.parts] + [abs(deco.remainder_ns)], default=0.0)
    rows = [["step time in A", fmt_ns(deco.step_a_ns), "", "", "", ""]]
    for p in deco.parts:
        rows.append([p.name, fmt_ns(p.a_ns), fmt_ns(p.b_ns), signed(p.delta_ns), f"±{fmt_ns(p.noise_ns)}",
                     _bar(p.delta_ns, scale) + (" *" if p.significant else "")])
    rows.append(["remainder", "", "", signed(deco.remainder_ns), "", _bar(deco.remainder_ns, scale)])
    rows.append(["step time in B", fmt_ns(deco.step_b_ns), "", signed(deco.delta_ns), f"±{fmt_ns(deco.noise_ns)}",
                 " *" if deco.significant else ""])
    return rows


def _count(x: float) -> str:
    return str(int(x)) if abs(x - round(x)) < 1e-9 else f"{x:.2f}"


def bucket_rows(d: RunDiff, top: int = 10, *, flagged_only: bool = True) -> list[list[str]]:
    """Collective buckets, flagged ones first (largest change of time per step first)."""
    rows = []
    for b in d.buckets:
        if flagged_only and not b.flagged:
            continue
        per = _count(b.per_step_a)
        if b.per_step_a != b.per_step_b:
            per += f" -> {_count(b.per_step_b)}"
        rows.append([b.op, b.dim or "-", b.group_b or b.group_a or "-", fmt_bytes(b.bytes), per,
                     _dur(b.duration_a_ns, b.spread_a_ns), _dur(b.duration_b_ns, b.spread_b_ns),
                     _rate(b.busbw_a_gbps, b.busbw_spread_a_gbps), _rate(b.busbw_b_gbps, b.busbw_spread_b_gbps),
                     "-" if b.ratio is None else f"{b.ratio:.2f}x", "changed" if b.flagged else ""])
        if len(rows) >= top:
            break
    return rows


def _rate(gbps: float | None, spread: float | None) -> str:
    return fmt_rate(gbps) + (f" ±{fmt_rate(spread)}" if gbps is not None and spread else "")


def _dur(ns: float | None, spread: float | None) -> str:
    if ns is None:
        return "-"
    return fmt_ns(ns) + (f" ±{fmt_ns(spread)}" if spread else "")


def rank_rows(d: RunDiff, top: int = 10) -> list[list[str]]:
    """The ranks that got slower, most first: per step window, A -> B."""
    rows = []
    for r in d.ranks:
        if not r.slower_in:
            break
        name = str(r.rank_b) if r.rank_a == r.rank_b else f"{r.rank_a} -> {r.rank_b}"
        rows.append([name, r.host or "-", f"{fmt_ns(r.compute_a_ns)} -> {fmt_ns(r.compute_b_ns)}",
                     f"{fmt_ns(r.exposed_a_ns)} -> {fmt_ns(r.exposed_b_ns)}",
                     f"{fmt_ns(r.late_a_ns)} -> {fmt_ns(r.late_b_ns)}", ", ".join(r.slower_in)])
        if len(rows) >= top:
            break
    return rows


def culprit_lines(d: RunDiff) -> list[str]:
    """One line per rank or host common to the collectives that slowed."""
    return [f"{c.kind} {c.name}{' (NIC ' + ', '.join(c.nics) + ')' if c.nics else ''}: in {c.slowed} of the "
            f"{c.slowed_total} collectives that slowed "
            f"({c.added_share:.0%} of the time they added), {c.unslowed} of its others did not; "
            f"median {c.ratio:.2f}x their duration in A" for c in d.culprits]


def wait_lines(d: RunDiff, top: int = 5) -> list[str]:
    """The root ranks whose waits changed most: rank-time lost per step, A -> B."""
    return [f"waits rooted at rank {w.rank}{f' ({w.host})' if w.host else ''}: {fmt_ns(w.a_ns)} -> {fmt_ns(w.b_ns)} "
            f"per step ({signed(w.delta_ns)})" for w in d.waits[:top]]


def setup_rows(d: RunDiff) -> list[list[str]]:
    return [[s.item, s.a, s.b] for s in d.setup]


def matching_line(d: RunDiff) -> str:
    """How the runs were lined up, in one line."""
    m = d.matching
    inst = m.instances_by_seq + m.instances_by_position
    how = {"rank": "by rank", "host_device": "by host and local device", "order": "in rank order"}[m.ranks_by]
    return (f"matched {len(m.ranks)} ranks {how}, {len(m.groups)} process groups, {len(m.steps)} steps, "
            f"{inst} collectives ({m.instances_by_seq} by sequence, {m.instances_by_position} by position)")


def network_line(d: RunDiff) -> str:
    """The network-or-job split in one line, with the replay's errors."""
    n = d.network
    if n is None:
        return ""
    cv = ("" if n.instance_error_median is None else f"; per collective, cross-validated on A: median "
          f"{n.instance_error_median:.1%}, p90 {n.instance_error_p90:.1%}")
    return (f"network or job (replayed on {n.topology} with A's calibration): A {fmt_ns(n.replayed_a_ns)} replayed "
            f"against {fmt_ns(n.step_a_ns)} traced, B's work on A's network {fmt_ns(n.replayed_b_ns)}: "
            f"job {signed(n.job_ns)}, network {signed(n.network_ns)}; step error of the replay {n.step_error:.1%}{cv}")
