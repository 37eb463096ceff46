import io
import subprocess
import sys

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
