import io
import os
import subprocess
import sys
from pathlib import Path

import numba
import numpy as np
from numba.core import caching, event

from tracekit import _jit


def test_no_writable_cache_location_compiles_without_a_cache(monkeypatch):
    impl = getattr(caching, "CacheImpl", None) or caching._CacheImpl  # renamed in numba 0.61
    monkeypatch.setattr(impl, "_locator_classes", [])  # no writable place anywhere

    def twice(x):
        return 2 * x

    with np.testing.assert_raises(RuntimeError):  # what numba itself does with cache=True
        numba.njit(cache=True)(twice)
    kernel = _jit.njit(twice)
    assert kernel(np.arange(3)).tolist() == [0, 2, 4]


def test_compile_progress_names_each_top_level_kernel():
    out = io.StringIO()
    listener = _jit._CompileProgress(out, interval=0.001, prefix=__name__)

    def inner(x):
        return x + 1

    def outer(x):
        return inner_jit(x) * 2

    inner_jit = numba.njit(inner)
    outer_jit = numba.njit(outer)
    with event.install_listener("numba:compile", listener):
        assert outer_jit(1) == 4
        assert outer_jit(2) == 6  # compiled already: nothing more to say
    text = out.getvalue()
    assert text.startswith("compiling numba kernels (first run only; cached for later runs)...\n")
    assert text.count("\n") == 2 and "  outer " in text and "inner" not in text
    assert text.rstrip().endswith(" s")


def test_compile_progress_ignores_other_packages_kernels():
    out = io.StringIO()
    listener = _jit._CompileProgress(out, prefix="tracekit")
    with event.install_listener("numba:compile", listener):
        assert numba.njit(lambda x: x - 1)(3) == 2
    assert out.getvalue() == ""


def test_the_cli_reports_compiles_on_the_process_stderr_only():
    code = ("import sys; from click.testing import CliRunner; from tracekit.cli import main; "
            "h = CliRunner().invoke(main, ['topology', '--help']); n = 'numba' in sys.modules; "
            "r = CliRunner().invoke(main, ['topology', 'single-switch:hosts=2,gpus=1']); "
            "from tracekit._jit import _listener; print(r.exit_code, n, _listener is not None, "
            "_listener.stream is sys.__stderr__, 'compiling' in r.output)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    # the CLI turns compile reporting on without importing numba; the first kernel attaches it
    assert done.stdout.split() == ["0", "False", "True", "True", "False"]


PROBE = ("import numpy as np; from tracekit import _jit; from tracekit.analysis._kernels import segment_median; "
         "print(segment_median(np.array([3.0, 1.0, 2.0]), np.array([0, 3], np.int64)).tolist(), _jit._cache_problem())")


def _probe(cache_home) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True,
                          env={**env, "XDG_CACHE_HOME": str(cache_home)})
    return done.stdout.split(None, 1)


def test_kernels_are_cached_in_a_private_per_user_directory(tmp_path):
    """Regression: the cache sat next to the source, where a shared install's other users write."""
    import stat

    root = tmp_path / "tracekit" / "numba"
    beside_source = Path(_kernels_file()).parent / "__pycache__"
    before = {p: p.stat().st_mtime_ns for p in beside_source.glob("*.nb[ic]")}
    assert _probe(tmp_path) == ["[2.0]", "None\n"]
    assert stat.S_IMODE(root.stat().st_mode) == 0o700 and root.stat().st_uid == os.getuid()
    assert any(p.name.startswith("_kernels.segment_median") for p in root.rglob("*.nbi"))
    assert {p: p.stat().st_mtime_ns for p in beside_source.glob("*.nb[ic]")} == before


def test_a_cache_directory_open_to_others_is_not_used(tmp_path):
    root = tmp_path / "tracekit" / "numba"
    root.mkdir(parents=True)
    root.chmod(0o777)
    result, problem = _probe(tmp_path)
    assert result == "[2.0]" and "open to other users (mode 777)" in problem
    assert list(root.iterdir()) == []


def _kernels_file() -> str:
    from tracekit.analysis import _kernels

    return _kernels.__file__


TELEMETRY_FIRST_RUN = """
import sys, tempfile
from pathlib import Path
from numba.core import event
from tracekit.ingest import ingest

compiled = []


class Seen(event.Listener):
    def on_start(self, ev):
        fn = getattr((ev.data or {}).get("dispatcher"), "py_func", None)
        if fn is not None and fn.__module__.startswith("tracekit."):
            compiled.append(fn.__name__)

    def on_end(self, ev):
        pass


event.register("numba:compile", Seen())
out = Path(tempfile.mkdtemp())
(out / "t.prom").write_text('# TYPE ifHCOutOctets counter\\nifHCOutOctets{instance="a",ifName="b"} 1 1760000000000\\n'
                            'ifHCOutOctets{instance="a",ifName="b"} 2 1760000010000\\n')
assert not ingest([out / "t.prom"], out / "run").failed
print(len(compiled))
"""


def test_a_second_telemetry_ingest_compiles_nothing(tmp_path):
    """Issue 26: the first telemetry ingest compiles its kernels (seconds); every later one,
    in a new process, loads them from the user's private cache and compiles none."""
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "NUMBA_DISABLE_JIT")}
    env["XDG_CACHE_HOME"] = str(tmp_path)
    runs = [subprocess.run([sys.executable, "-c", TELEMETRY_FIRST_RUN], capture_output=True, text=True, check=True,
                           env=env).stdout.split()[-1] for _ in range(2)]
    assert int(runs[0]) > 5 and runs[1] == "0", runs
    assert any(p.name.startswith("_kernels.tokenize_exposition") for p in (tmp_path / "tracekit").rglob("*.nbi"))
