"""What-if axis labels are distinct and readable (issue 21, item 8): scenarios that differ only
late in a long string used to be cut to the same label."""

from __future__ import annotations

import re
from pathlib import Path

from tracekit.viz.data import AXIS_CHARS, scenario_labels

README = Path(__file__).resolve().parents[2] / "README.md"


def _readme_scenarios() -> list[str]:
    """The scenarios of the README's `tracekit whatif` command on the bundled sample."""
    text = README.read_text()
    block = re.search(r"tracekit whatif sample_traces/\S+ (.*?)--topology", text, re.S)
    assert block is not None
    return block.group(1).replace("\\\n", " ").split()


def test_the_readmes_checkpoint_scenarios_get_distinct_labels():
    texts = _readme_scenarios()
    labels = scenario_labels(texts)
    assert len(set(labels)) == len(texts) == 6
    assert labels[-2:] == ["checkpoint:via=frontend", "checkpoint:via=backend"]
    assert labels[:4] == texts[:4]  # the ones that fit stay whole
    assert all(len(x) <= AXIS_CHARS for x in labels)


def test_labels_that_still_collide_are_numbered_and_long_ones_cut():
    long = "checkpoint:bytes_per_rank=1GB,every=2,at=0.5,via=frontend,storage=4,extra=" + "x" * 40
    labels = scenario_labels([long, long, "eplb:redundant=8"])
    assert labels[0].endswith("…") and len(labels[0]) == AXIS_CHARS
    assert labels[1] == labels[0] + " #2" and labels[2] == "eplb:redundant=8"
