"""The offline kernels' numba cache is dropped when it could be stale, no root.

numba keys a kernel's on-disk cache by the source of the kernel's own module, but `scan`
(kernel/scanner.py) inlines the kernels of kernel/parse.py and kernel/accounting.py: an edit
there must drop the whole package's cache, or the next run would load code compiled from the
old parser. offline/__init__ fingerprints every kernel/*.py, core/jit.py (the byte readers) and
layout.py's constants. Run here on a copy of the package (its own __pycache__), so the real
cache is never touched.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from skewscope.sources import offline
from skewscope.sources.offline import kernel as K


def _copy(tmp_path, monkeypatch):
    pkg = tmp_path / "kernel"
    pkg.mkdir()
    for src in Path(K.__file__).parent.glob("*.py"):
        shutil.copy(src, pkg / src.name)
    monkeypatch.setattr(K, "__file__", str(pkg / "__init__.py"))
    offline._purge_stale_numba_cache()          # first sight: fingerprint written
    cached = [pkg / "__pycache__" / n for n in ("scanner.scan-263.py311.nbi", "scanner.scan-263.py311.1.nbc",
                                               "parse.parse_l3-190.py311.nbi")]
    for p in cached:
        p.write_bytes(b"compiled")
    return pkg, cached


def test_unchanged_sources_keep_the_cache(tmp_path, monkeypatch):
    pkg, cached = _copy(tmp_path, monkeypatch)
    offline._purge_stale_numba_cache()
    assert all(p.exists() for p in cached)


def test_an_edit_to_any_kernel_module_drops_every_module_cache(tmp_path, monkeypatch):
    """The edit is in parse.py; scanner.py (whose own source did not change) loses its cache too."""
    pkg, cached = _copy(tmp_path, monkeypatch)
    (pkg / "parse.py").write_text((pkg / "parse.py").read_text() + "\n# edited\n")
    offline._purge_stale_numba_cache()
    assert not any(p.exists() for p in cached)
    assert (pkg / "__pycache__" / "kernel.fingerprint").exists()
    # and the new fingerprint is kept: a later run keeps what numba caches from then on
    cached[0].write_bytes(b"compiled")
    offline._purge_stale_numba_cache()
    assert cached[0].exists()


def test_a_layout_change_drops_the_cache(tmp_path, monkeypatch):
    pkg, cached = _copy(tmp_path, monkeypatch)
    monkeypatch.setattr(offline.L, "MSG_SLOTS", offline.L.MSG_SLOTS + 1)
    offline._purge_stale_numba_cache()
    assert not any(p.exists() for p in cached)


def test_an_edit_to_core_jit_drops_the_cache(tmp_path, monkeypatch):
    """The parser's byte readers (be16, rd32, ...) are core/jit.py's: their code is inlined too."""
    pkg, cached = _copy(tmp_path, monkeypatch)
    jit_copy = tmp_path / "jit.py"
    jit_copy.write_text(Path(offline.jit.__file__).read_text() + "\n# edited\n")
    monkeypatch.setattr(offline.jit, "__file__", str(jit_copy))
    offline._purge_stale_numba_cache()
    assert not any(p.exists() for p in cached)
