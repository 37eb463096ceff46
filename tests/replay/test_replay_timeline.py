"""The replayed timeline keeps back-to-back events back to back after rounding to nanoseconds."""

from types import SimpleNamespace

import numpy as np

from tracekit.replay.engine import _timeline


def test_rounding_keeps_adjacent_events_apart():
    start = np.array([0.6, 1.4, 2.5, 10.0])
    end = np.array([1.4, 2.5, 3.49, 10.0])
    prep = SimpleNamespace(kind=np.array([0, 1, 0, 2]), rank=np.zeros(4, np.int32),
                           lane=np.array(["gpu0/stream7"] * 4, dtype=object), t0=1000,
                           start=start, end=end)
    t = _timeline(prep, start, end).to_pydict()
    ts, dur = t["ts_ns"], t["dur_ns"]
    assert ts == [1001, 1001, 1002, 1010]
    for k in range(3):
        assert ts[k] + dur[k] <= ts[k + 1]  # no 1 ns overlap a viewer would drop
    assert t["kind"] == ["compute", "comm", "compute", "other"]
