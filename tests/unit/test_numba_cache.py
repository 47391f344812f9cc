"""numba's on-disk cache never runs code inlined from a module that changed since it was cached.

numba keys a cached kernel by its own module's source; core/jit.py drops a package's cached
kernels when any file they can depend on changed (a callee kernel's module, a constants
module). Each run is a fresh process over a temporary package: kern.run inlines
helper.helper (a kernel of another module) and adds consts.OFFSET (a module with no kernel);
the expected value is plain arithmetic on the numbers written into the files.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

HELPER = """from skewscope.core.jit import njit

@njit(cache=True, inline="always")
def helper(x):
    return x * {mul}
"""
CONSTS = "OFFSET = {offset}\n"
KERN = """from skewscope.core.jit import njit
from tpkg.consts import OFFSET
from tpkg.helper import helper

@njit(cache=True)
def run(x):
    return helper(x) + OFFSET
"""
RUN = "from tpkg.kern import run; print(run(3))"


def _package(tmp_path, mul=2, offset=10):
    pkg = tmp_path / "tpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "helper.py").write_text(HELPER.format(mul=mul))
    (pkg / "consts.py").write_text(CONSTS.format(offset=offset))
    (pkg / "kern.py").write_text(KERN)
    return pkg


def _env(tmp_path, cache_dir=None):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(tmp_path)])
    # no .pyc: Python's own check (mtime in whole seconds + size) would take an edit within
    # the second of the previous run, of the same size, for the old file
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if cache_dir is not None:
        env["NUMBA_CACHE_DIR"] = str(cache_dir)
    return env


def _run(env) -> int:
    out = subprocess.run([sys.executable, "-c", RUN], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return int(out.stdout)


def _index(where: Path) -> list[Path]:
    """numba's index files of kern.run (the kernel whose own source never changes)."""
    return sorted(where.rglob("kern.run-*.nbi"))


def test_an_edit_to_an_inlined_module_is_compiled_in(tmp_path):
    pkg = _package(tmp_path)
    env = _env(tmp_path)
    assert _run(env) == 3 * 2 + 10
    idx = _index(pkg / "__pycache__")
    assert idx, "numba cached kern.run beside its source"
    (pkg / "helper.py").write_text(HELPER.format(mul=5))        # the inlined callee
    assert _run(env) == 3 * 5 + 10
    (pkg / "consts.py").write_text(CONSTS.format(offset=70))     # a constant frozen in
    assert _run(env) == 3 * 5 + 70
    # nothing changed: the cache is loaded, not dropped and written again
    before = [p.stat().st_mtime_ns for p in _index(pkg / "__pycache__")]
    assert _run(env) == 3 * 5 + 70
    assert [p.stat().st_mtime_ns for p in _index(pkg / "__pycache__")] == before


def test_with_numba_cache_dir(tmp_path):
    """The cache is in NUMBA_CACHE_DIR's mirror of the source tree, not beside the source."""
    pkg = _package(tmp_path)
    cache = tmp_path / "numba-cache"
    env = _env(tmp_path, cache)
    assert _run(env) == 3 * 2 + 10
    assert _index(cache) and not _index(pkg)
    (pkg / "helper.py").write_text(HELPER.format(mul=7))
    assert _run(env) == 3 * 7 + 10


def test_processes_starting_together_after_an_edit(tmp_path):
    """Both see the stamp stale, both drop the cache and write the stamp: neither fails."""
    pkg = _package(tmp_path)
    env = _env(tmp_path)
    assert _run(env) == 3 * 2 + 10
    (pkg / "helper.py").write_text(HELPER.format(mul=3))
    procs = [subprocess.Popen([sys.executable, "-c", RUN], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(3)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [e for _, e in outs]
    assert [int(o) for o, _ in outs] == [3 * 3 + 10] * 3
    assert _run(env) == 3 * 3 + 10
