"""skewscope's numba cache is dropped when it could be stale, and only then (core/jitcache.py _refresh).

numba keys a kernel's on-disk cache by the source of the kernel's own module, but `scan`
(sources/offline/kernel/scanner.py) inlines the kernels of kernel/parse.py and
kernel/accounting.py, the compiled code freezes core/layout.py's constants and core/jit.py's
byte readers, core/rates.py calls core/snapshot.py's kernels: an edit there must drop every
cached kernel of the package. Run here on a copy of skewscope's sources (their own
__pycache__, or a temporary NUMBA_CACHE_DIR), so the real cache is never touched; the cached
"kernels" are files named as numba names them, put where numba's own locators say.
"""
from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import numba.core.caching as caching
import numba.core.config as numba_config
import pytest

from skewscope.core import jit, jitcache

PKG = Path(jit.__file__).resolve().parents[1]
#: (source file, numba's cache file names for a kernel in it)
CACHED = [("sources/offline/kernel/scanner.py", ("scanner.scan-263.py311.nbi", "scanner.scan-263.py311.1.nbc")),
          ("sources/offline/kernel/parse.py", ("parse.parse_l3-190.py311.nbi",)),
          ("core/rates.py", ("rates.rate_rows-40.py311.nbi", "rates.rate_rows-40.py311.1.nbc")),
          ("analysis/flows.py", ("flows.flow_columns-99.py311.nbi",))]


def _kernel():
    pass


def _not_source(d, names):
    return [n for n in names if n == "__pycache__" or not (n.endswith(".py") or os.path.isdir(os.path.join(d, n)))]


def _copy(tmp_path, monkeypatch, cache_dir=None):
    """A copy of skewscope/'s .py files, seen once (stamp written), then numba cache files beside
    its kernel modules (or in cache_dir as numba's NUMBA_CACHE_DIR locator would put them)."""
    root = tmp_path / "skewscope"
    shutil.copytree(PKG, root, ignore=_not_source)
    monkeypatch.setattr(numba_config, "CACHE_DIR", str(cache_dir) if cache_dir else "")
    jitcache._refresh("skewscope", root)
    cached = []
    for src, names in CACHED:
        if cache_dir:
            where = Path(caching.UserProvidedCacheLocator(_kernel, str(root / src)).get_cache_path())
        else:
            where = Path(caching.InTreeCacheLocator(_kernel, str(root / src)).get_cache_path())
        where.mkdir(parents=True, exist_ok=True)
        for n in names:
            (where / n).write_bytes(b"compiled")
            cached.append(where / n)
    return root, cached


def _edit(path: Path, old: str, new: str):
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def test_unchanged_sources_keep_the_cache(tmp_path, monkeypatch):
    root, cached = _copy(tmp_path, monkeypatch)
    jitcache._refresh("skewscope", root)
    assert all(p.exists() for p in cached)
    # a file touched (git checkout, a copy) but not changed: its digest is taken again, same
    os.utime(root / "core/layout.py", ns=(1, 1))
    jitcache._refresh("skewscope", root)
    assert all(p.exists() for p in cached)


def test_an_edit_to_any_kernel_module_drops_every_module_cache(tmp_path, monkeypatch):
    """The edit is in parse.py; scanner.py (whose own source did not change) loses its cache,
    and so do the other directories' kernels."""
    root, cached = _copy(tmp_path, monkeypatch)
    (root / "sources/offline/kernel/parse.py").write_text((root / "sources/offline/kernel/parse.py").read_text()
                                                          + "\n# edited\n")
    jitcache._refresh("skewscope", root)
    assert not any(p.exists() for p in cached)
    assert (root / "__pycache__" / "skewscope.kernels.stamp").exists()
    # and the new stamp is kept: a later run keeps what numba caches from then on
    cached[0].write_bytes(b"compiled")
    jitcache._refresh("skewscope", root)
    assert cached[0].exists()


def test_a_layout_change_drops_the_cache(tmp_path, monkeypatch):
    """layout.py defines no kernel: it is reached through the kernel modules' imports."""
    root, cached = _copy(tmp_path, monkeypatch)
    _edit(root / "core/layout.py", "MSG_SLOTS = ", "MSG_SLOTS = 1 + ")
    jitcache._refresh("skewscope", root)
    assert not any(p.exists() for p in cached)


def test_an_edit_to_core_jit_drops_the_cache(tmp_path, monkeypatch):
    """The parser's byte readers (be16, rd32, ...) and load_u64/store_u64 are core/jit.py's."""
    root, cached = _copy(tmp_path, monkeypatch)
    (root / "core/jit.py").write_text((root / "core/jit.py").read_text() + "\n# edited\n")
    jitcache._refresh("skewscope", root)
    assert not any(p.exists() for p in cached)


def test_an_edit_no_kernel_can_see_keeps_the_cache(tmp_path, monkeypatch):
    """cli/ is below every kernel module in the import layers (docs/architecture.md)."""
    root, cached = _copy(tmp_path, monkeypatch)
    (root / "cli/__init__.py").write_text((root / "cli/__init__.py").read_text() + "\n# edited\n")
    jitcache._refresh("skewscope", root)
    assert all(p.exists() for p in cached)


def test_numba_cache_dir(tmp_path, monkeypatch):
    """With NUMBA_CACHE_DIR the cache (and the stamp) is in numba's mirror of the tree there."""
    root, cached = _copy(tmp_path, monkeypatch, tmp_path / "nc")
    assert all(str(p).startswith(str(tmp_path / "nc")) for p in cached)
    assert not (root / "__pycache__" / "skewscope.kernels.stamp").exists()
    jitcache._refresh("skewscope", root)
    assert all(p.exists() for p in cached)
    _edit(root / "core/snapshot.py", "\n", "\n# edited\n")
    jitcache._refresh("skewscope", root)
    assert not any(p.exists() for p in cached)


def test_the_files_kernels_depend_on():
    files = jitcache._kernel_sources(PKG, "skewscope")
    for f in ("core/jit.py", "core/layout.py", "core/snapshot.py", "core/rates.py", "sources/offline/kernel/base.py",
              "sources/offline/kernel/parse.py", "sources/offline/kernel/accounting.py",
              "sources/offline/kernel/scanner.py", "analysis/flows.py"):
        assert f in files
    assert not any(f.startswith(("cli/", "live/", "testbed/")) for f in files)
    assert files["core/layout.py"] == (PKG / "core/layout.py").read_bytes()


def test_covers_the_aot_modules_files():
    """tools/aotbuild.py finds what the precompiled kernels depend on by running them: every
    such file is one the numba cache's check covers."""
    try:
        with open(PKG / "_aot.pkl", "rb") as f:
            aot_files = pickle.load(f)["files"]
    except FileNotFoundError:
        pytest.skip("no AOT module built")
    assert set(aot_files) <= set(jitcache._kernel_sources(PKG, "skewscope"))
