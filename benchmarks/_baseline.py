"""Another git revision of tracekit as a benchmark baseline, measured in the same run.

The revision is checked out in a git worktree of this repository (kept in the user cache,
`~/.cache/tracekit-bench/<commit>`, so its numba kernels compile once) and imported by a worker
subprocess: the benchmark script itself, started with `--worker` under `PYTHONPATH=<worktree>`,
which answers one JSON request per line on stdin with one JSON line on stdout. No copy of old
code is kept in the tree, and the baseline is any commit (`--baseline REV`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tracekit-bench"


def checkout(revision: str) -> Path:
    """A worktree of `revision` (made on first use), importable as `tracekit` from its root."""
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", f"{revision}^{{commit}}"],
                            capture_output=True, text=True, check=True).stdout.strip()
    tree = CACHE / commit
    if not (tree / "tracekit" / "__init__.py").is_file():
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "--force", str(tree), commit],
                       check=True, capture_output=True)
    for sub in ("parsers", "viz"):  # installed as tracekit.parsers / tracekit.viz (pyproject's package-dir)
        link = tree / "tracekit" / sub
        if not link.exists():
            link.symlink_to(Path("..") / sub)
    return tree


class Worker:
    """A subprocess running `script --worker` on the tracekit of `revision`."""

    def __init__(self, script: Path, revision: str) -> None:
        self.revision = revision
        self.tree = checkout(revision)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(self.tree), os.environ.get("PYTHONPATH", "")])}
        self.proc = subprocess.Popen([sys.executable, str(script), "--worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env, cwd=self.tree, text=True)
        where = self.call(op="where")["tracekit"]
        if not Path(where).resolve().is_relative_to(self.tree.resolve()):
            self.close()
            raise RuntimeError(f"baseline worker imported tracekit from {where}, not {self.tree}")

    def call(self, **request: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"baseline worker ({self.revision}) exited with {self.proc.wait()}")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"baseline worker ({self.revision}): {reply['error']}")
        return reply

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def serve(handlers: dict[str, Any]) -> None:
    """The worker's loop: `{"op": name, ...}` per line -> handlers[name](**rest) as one JSON line
    (`{"error": ...}` when it raises). `where` names the tracekit it imported."""
    import tracekit

    handlers = {"where": lambda: {"tracekit": tracekit.__file__}, **handlers}
    out = sys.stdout
    sys.stdout = sys.stderr  # whatever the handlers print stays off the reply channel
    for line in sys.stdin:
        request = json.loads(line)
        try:
            reply = handlers[request.pop("op")](**request)
        except Exception as exc:  # reported to the parent, which raises
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()
