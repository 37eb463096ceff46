"""A slow, obviously correct twin of the fluid simulator: full progressive filling at every event."""

from __future__ import annotations

import math

import numpy as np


def progressive_filling(paths: dict[int, list[int]], cap: np.ndarray) -> dict[int, float]:
    """Max-min fair rates of the flows `paths` (flow -> resources) on capacities `cap`."""
    rates: dict[int, float] = {}
    unfrozen = set(paths)
    remaining = {r: float(cap[r]) for p in paths.values() for r in p}
    while unfrozen:
        share = {}
        for r, c in remaining.items():
            n = sum(1 for f in unfrozen if r in paths[f])
            if n:
                share[r] = max(c, 0.0) / n
        r_min = min(share, key=lambda r: (share[r], r))
        inc = share[r_min]
        for f in unfrozen:
            rates[f] = rates.get(f, 0.0) + inc
            for r in paths[f]:
                remaining[r] -= inc
        saturated = {r for r, c in remaining.items() if c <= 1e-9 * cap[r]}
        saturated.add(r_min)
        unfrozen = {f for f in unfrozen if not saturated.intersection(paths[f])}
    return rates


def simulate_naive(indptr, res, nbytes, release, lat_mult, cap, res_lat, rel_eps=1e-9, windows=None):
    """Finish time of every flow (ns). With `windows=(n_windows, window_ns)` also the bytes each
    resource carried in each window from t = 0 (rate x overlap per flow, hop and interval), as
    (finish, bytes[resource, window])."""
    n = len(nbytes)
    n_win, width = windows if windows is not None else (0, 1.0)
    win = np.zeros((len(cap), n_win))
    paths = {f: [int(r) for r in res[indptr[f]:indptr[f + 1]]] for f in range(n)}
    latency = [lat_mult[f] * sum(res_lat[r] for r in paths[f]) for f in range(n)]
    finish = np.full(n, np.nan)
    rem = {f: float(nbytes[f]) for f in range(n)}
    pending = sorted(range(n), key=lambda f: (release[f], f))
    active: dict[int, float] = {}
    t = -math.inf
    while pending or active:
        t_rel = release[pending[0]] if pending else math.inf
        t_fin = min((t + rem[f] / r for f, r in active.items()), default=math.inf)
        now = min(t_rel, t_fin)
        for f, r in active.items():
            rem[f] -= r * (now - t)
            for w in range(n_win):
                overlap = min(now, (w + 1) * width) - max(t, w * width)
                if overlap > 0:
                    for hop in paths[f]:
                        win[hop, w] += r * overlap
        tol = rel_eps * abs(now) + 1e-6
        for f in list(active):
            if rem[f] <= tol * active[f]:
                finish[f] = now + latency[f]
                del active[f]
        while pending and release[pending[0]] <= now + tol:
            f = pending.pop(0)
            if rem[f] <= 0 or not paths[f]:
                finish[f] = release[f] + latency[f] + (0.0 if rem[f] <= 0 else math.inf)
                continue
            active[f] = 0.0
        if active:
            active = progressive_filling({f: paths[f] for f in active}, cap)
        t = now
    return finish if windows is None else (finish, win)


def schedule_naive(prev, deps, slack, tr_start, dur, inst, members, inst_dur, end_frac):
    """Replayed start/end per event (the rules of `_kernels.schedule`, recomputed by repeated
    passes): an event starts at the latest end of its lane predecessor `prev[i]` and of its
    dependencies `deps` ((src, dst) pairs) plus its slack (its traced start when it has none); a
    member of instance k arrives then; when all of `members[k]` have arrived, member j ends
    `end_frac[j] * inst_dur[k]` after the last arrival. Inputs must be acyclic."""
    n = len(tr_start)
    preds = [[] for _ in range(n)]
    for i in range(n):
        if prev[i] >= 0:
            preds[i].append(int(prev[i]))
    for s, d in deps:
        preds[d].append(int(s))
    start = [None] * n
    end = [None] * n
    inst_start = [None] * len(members)
    while any(e is None for e in end):
        progress = False
        for i in range(n):
            if start[i] is None and all(end[p] is not None for p in preds[i]):
                start[i] = max(end[p] for p in preds[i]) + slack[i] if preds[i] else tr_start[i]
                if inst[i] < 0:
                    end[i] = start[i] + dur[i]
                progress = True
        for k, ms in enumerate(members):
            if inst_start[k] is None and all(start[j] is not None for j in ms):
                inst_start[k] = max(start[j] for j in ms)
                for j in ms:
                    end[j] = inst_start[k] + inst_dur[k] * end_frac[j]
                progress = True
        if not progress:
            raise ValueError("cyclic input")
    return np.array(start, float), np.array(end, float), np.array(inst_start, float)
