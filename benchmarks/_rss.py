"""Peak memory of a benchmark process, shared by the benchmark scripts."""

from __future__ import annotations

import resource
from pathlib import Path


def peak_rss_mb() -> float:
    """Peak RSS of this process in MB (VmHWM: unlike ru_maxrss it is not inherited over exec)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def reset_peak_rss() -> bool:
    """Reset this process's VmHWM to its current RSS (Linux >= 4.0), so the next `peak_rss_mb`
    is the peak of what ran in between; False where that is not possible."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False
