"""The simulation of one topology's flows, round after round of the replay's schedule/simulate
fixed point, re-simulating only what new release times change.

Max-min fair rates decompose over the components of flows that share a resource while both are
active (`_kernels.flow_components`; a flow is active from its release to the end of its
transfer, its finish without the path latency the simulator adds after it: a ring's latency, 2
(n - 1) hops, grows with its ranks, and counting it joined ever more flows at scale). A
component of the last round whose flows all moved by one shift (within the kernel's event
tolerance) keeps its finish times, shifted; the other flows are simulated together. The result
is then checked: a component of the new timeline that mixes flows from different sources (two
shifted components, or one and newly simulated flows) is simulated again as a whole, until none
does. What remains is, component by component, the simulation of all flows together.
"""

from __future__ import annotations

import numpy as np

from tracekit.replay import _kernels
from tracekit.replay.simulate import Flows, simulate
from tracekit.replay.topology import Topology

#: The kernel's event tolerance: events closer than this (relative, plus 1e-6 ns) are one event.
REL_EPS = 1e-9


def path_latency(res_latency: np.ndarray, indptr: np.ndarray, ids: np.ndarray, lat_mult: np.ndarray) -> np.ndarray:
    """Per flow, the latency the simulator adds to its finish: its multiplier times the sum of its
    resources' latencies, summed in path order as the simulator sums them."""
    return _kernels.path_latency(res_latency, indptr, ids, lat_mult)


class Rounds:
    """Finish times of routed flows (CSR `indptr`/`ids`) for successive release times, starting
    from a simulation of all of them (`release`, `finish`); `weight`: the flows' weights in the
    weighted max-min sharing (`simulate.connection_weights`; default all 1)."""

    def __init__(self, topology: Topology, indptr: np.ndarray, ids: np.ndarray, nbytes: np.ndarray,
                 lat_mult: np.ndarray, release: np.ndarray, finish: np.ndarray, *, merge: float = 0.0,
                 max_gbs: np.ndarray | None = None, weight: np.ndarray | None = None) -> None:
        self.topology = topology
        self.indptr, self.ids, self.nbytes, self.lat_mult = indptr, ids, nbytes, lat_mult
        self.max_gbs = max_gbs  # per-flow rate limits (`Flows.max_gbs`)
        self.weight = np.ones(nbytes.size) if weight is None else np.asarray(weight, np.float64)
        self.merge = merge
        self.simulated = 0  # flows simulated by `step` so far (a flow simulated twice counts twice)
        self.calls = 0  # simulations run by `step` so far
        self.release, self.finish = np.asarray(release, np.float64), np.asarray(finish, np.float64)
        self.label: np.ndarray | None = None  # the last round's components, made when first needed
        self.latency = path_latency(topology.res_latency, indptr, ids, lat_mult)

    def components(self, release: np.ndarray, finish: np.ndarray) -> np.ndarray:
        """Per flow, its component's label (the smallest flow index in it): flows sharing a
        resource while both send, from release to the finish without the path latency."""
        return _kernels.flow_components(self.indptr, self.ids, release, finish - self.latency,
                                        self.topology.cap.size)

    def step(self, release: np.ndarray) -> np.ndarray:
        """Finish times of every flow released at `release` (ns, latency included), as one
        simulation of them all would give."""
        release = np.asarray(release, np.float64)
        n = release.size
        if self.label is None:
            self.label = self.components(self.release, self.finish)
        shift = release - self.release
        lo = np.full(n, np.inf)
        hi = np.full(n, -np.inf)
        np.minimum.at(lo, self.label, shift)
        np.maximum.at(hi, self.label, shift)
        tol = REL_EPS * float(np.max(np.abs(release), initial=0.0)) + 1e-6
        kept = (hi - lo)[self.label] <= tol
        finish = self.finish + shift
        unit = np.where(kept, self.label, -1)  # where each flow's result comes from
        todo = np.flatnonzero(~kept)
        budget = n  # past one simulation's worth of flows (or half of them at once), simulate all
        while True:
            if todo.size and (todo.size >= budget or 2 * todo.size >= n):
                finish = self.simulate_some(release, np.arange(n))
                self.simulated += n
                self.calls += 1
                label = self.components(release, finish)
                break
            budget -= todo.size
            if todo.size:
                finish[todo] = self.simulate_some(release, todo)
                self.simulated += todo.size
                self.calls += 1
                unit[todo] = -1 - self.calls
            label = self.components(release, finish)
            todo = np.flatnonzero(_kernels.mixed_components(label, unit))
            if not todo.size:
                break
        self.release, self.finish, self.label = release, finish, label
        return finish

    def simulate_some(self, release: np.ndarray, sel: np.ndarray) -> np.ndarray:
        """Finish times of the flows `sel` (indices) simulated alone."""
        lens = np.diff(self.indptr)[sel]
        ptr = np.zeros(sel.size + 1, np.int64)
        np.cumsum(lens, out=ptr[1:])
        at = np.repeat(self.indptr[sel] - ptr[:-1], lens) + np.arange(ptr[-1])
        flows = Flows.from_lists(np.zeros(sel.size), np.zeros(sel.size), self.nbytes[sel],
                                 release=release[sel], lat_mult=self.lat_mult[sel],
                                 max_gbs=None if self.max_gbs is None else self.max_gbs[sel])
        return simulate(self.topology, ptr, self.ids[at], flows, merge=self.merge, weight=self.weight[sel]).finish
