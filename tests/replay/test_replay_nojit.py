"""The kernel, routing (fat-tree and graph) and flow hash twin tests once more with numba off: the
kernels are plain Python that runs as written (an index or typing slip that compiled code hides
shows up here)."""

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
SLOW_UNDER_PYTHON = "not skewed_all_to_all and not merged_finishes and not closed_forms"


def test_kernel_and_routing_twins_pass_with_numba_disabled():
    env = {**os.environ, "NUMBA_DISABLE_JIT": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-k", SLOW_UNDER_PYTHON,
         str(HERE / "test_replay_routing.py"), str(HERE / "test_replay_kernels.py"), str(HERE / "test_replay_hash.py"),
         str(HERE / "test_replay_fabric_graph.py")],
        env=env, cwd=HERE.parent.parent, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
