"""Step numbers from annotation names are range-checked where they are converted: a
`ProfilerStep#N` beyond int32 is not a step (ingest counts it as a dropped `step`), never an
overflow in `analyze` (issue 22)."""

from __future__ import annotations

import polars as pl

from tracekit.analysis.steps import STEP_MAX, event_windows


def test_annotation_steps_beyond_int32_are_not_windows() -> None:
    names = ["ProfilerStep#5", f"ProfilerStep#{STEP_MAX}", f"ProfilerStep#{STEP_MAX + 1}",
             "ProfilerStep#99999999999", "ProfilerStep#" + "9" * 5000]
    events = pl.DataFrame({"rank": [0] * len(names), "name": names,
                           "ts_ns": [100 * i for i in range(len(names))], "dur_ns": [50] * len(names),
                           "step": [None] * len(names)},
                          schema={"rank": pl.Int32, "name": pl.String, "ts_ns": pl.Int64, "dur_ns": pl.Int64,
                                  "step": pl.Int32})
    found, _ = event_windows(events)
    assert sorted(found.get_column("step").to_list()) == [5, STEP_MAX]
    assert found.schema["step"] == pl.Int32
