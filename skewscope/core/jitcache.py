"""numba's on-disk cache of skewscope's kernels kept current (core/jit.py calls `_fresh_cache`
before a Kernel's first dispatcher).

numba's on-disk cache is kept current for what a kernel inlines (`_fresh_cache`, once per
process before numba reads a cache): numba keys it by the kernel's own module's source only,
so an edit of jit.py's readers, layout.py's constants or a callee kernel's module (an upgrade
that changed only those) would otherwise run the old code. On a change of any file the
package's kernels can depend on, its cached kernels are dropped wherever numba keeps them.

`bound_imports` is also the AOT build's rule for its source list (tools/aotbuild.py)."""
from __future__ import annotations

import ast
import functools
import os
import sys
import threading
from pathlib import Path

from skewscope.core.digest import blake2b

#: the module kernels are made with (its importers define kernels or intrinsics)
JIT_MODULE = __name__.rpartition(".")[0] + ".jit"
#: top-level packages whose kernels' numba cache is known fresh in this process (_fresh_cache)
_fresh: set = set()
_fresh_lock = threading.Lock()


def _fresh_cache(module: str) -> None:
    """Make numba's on-disk cache of the kernels of `module`'s top-level package current, once
    per process and package, before numba reads any of it (a Kernel's first dispatcher):
    `_refresh`. A kernel in a loose module (no package) keeps numba's own keying."""
    top = module.partition(".")[0]
    if top in _fresh:
        return
    with _fresh_lock:  # a second thread must not load a cache this one is about to drop
        if top in _fresh:
            return
        paths = getattr(sys.modules.get(top), "__path__", None)
        if paths:
            _refresh(top, Path(os.path.abspath(list(paths)[0])))  # as numba names it: not resolved
        _fresh.add(top)


def _refresh(top: str, root: Path) -> None:
    """numba keys a kernel's cache by its own module's source only, but the compiled code also
    holds what it inlines or calls from other modules: core/jit.py's intrinsics and byte
    readers, core/layout.py's constants, core/snapshot.py's helpers in core/rates.py, the
    offline scanner's parser. So package `top` (at root) keeps a stamp in numba's cache
    directory: a hash of the (path, mtime_ns, size) of every .py under it, and the digest of
    `_kernel_sources`. While the stats are unchanged nothing else is read (~1 ms); when they
    moved the digest is recomputed (~0.3 s), and when it differs (or there is no stamp) every
    cached kernel of the package is dropped wherever numba may keep it (`_cache_dirs`); then
    the stamp is rewritten, atomically. Concurrent processes: a file already gone or a
    directory not writable is skipped; at worst a kernel is compiled again."""
    stats, dirs = _source_stats(root)
    key = blake2b(repr(stats).encode(), digest_size=16).hexdigest()
    stamp = _cache_dirs(root)[0] / f"{top}.kernels.stamp"
    try:
        old = stamp.read_text().split()
    except (OSError, UnicodeDecodeError):
        old = []
    if old[:1] == [key]:
        return
    h = blake2b(digest_size=16)
    for rel, src in sorted(_kernel_sources(root, top).items()):
        h.update(rel.encode() + b"\0" + src + b"\0")
    digest = h.hexdigest()
    if old[1:2] != [digest]:
        _drop_cached(dirs)
    from skewscope.core.files import atomic_write_text  # only when the sources moved
    try:
        stamp.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(stamp, f"{key} {digest}\n")
    except OSError:
        pass  # unwritable: numba cannot cache there either


def _source_stats(root: Path):
    """[(relative path, mtime_ns, size)] of every .py under root, and the directories holding them."""
    stats, dirs, todo, skip = [], [], [root], len(str(root)) + 1
    while todo:
        d = todo.pop()
        try:
            entries = sorted(os.scandir(d), key=lambda e: e.name)
        except OSError:
            continue
        has_py = False
        for e in entries:
            if e.name.endswith(".py") and e.is_file():
                st = e.stat()
                stats.append((e.path[skip:], st.st_mtime_ns, st.st_size))
                has_py = True
            elif e.is_dir() and e.name != "__pycache__" and not e.name.startswith("."):
                todo.append(Path(e.path))
        if has_py:
            dirs.append(d)
    return stats, dirs


def _cache_dirs(src_dir: Path) -> list[Path]:
    """Where numba may keep the cache of src_dir's modules, the one it writes first: its locators
    (numba/core/caching.py) try NUMBA_CACHE_DIR (a directory per source directory, named by
    `get_suitable_cache_subpath`), then __pycache__ beside the source when writable, then the
    user-wide cache (same naming)."""
    from numba.core import caching, config  # heavy: numba (loaded by now)
    from numba.misc.appdirs import AppDirs  # heavy: as above

    sub = caching._CacheLocator.get_suitable_cache_subpath(str(src_dir / "__init__.py"))
    in_tree = src_dir / "__pycache__"
    user = Path(AppDirs(appname="numba", appauthor=False).user_cache_dir) / sub
    if config.CACHE_DIR:
        return [Path(config.CACHE_DIR) / sub, in_tree, user]
    if os.access(in_tree if in_tree.is_dir() else src_dir, os.W_OK):
        return [in_tree, user]
    return [user, in_tree]


def _drop_cached(src_dirs) -> None:
    """Remove numba's cached kernels (index *.nbi, data *.nbc) of the modules in src_dirs."""
    for d in src_dirs:
        for cache in _cache_dirs(d):
            try:
                names = os.listdir(cache)
            except OSError:
                continue
            for n in names:
                if n.endswith((".nbi", ".nbc")):
                    try:
                        os.unlink(cache / n)
                    except OSError:
                        pass  # gone already (another process) or not ours to remove


def bound_imports(mod: str, src, is_pkg: bool, known) -> frozenset:
    """The modules whose objects `mod`'s module-level imports bind into its globals (the only
    names a kernel can see): `import a.b as x` -> a.b; `from a import b` -> a.b when
    known(a.b) (it is a module), else a. Imports inside functions bind nothing a kernel sees.
    src: the module's source; is_pkg: it is a package's __init__. Shared by the numba cache's
    check (_kernel_sources) and the AOT build's source list (tools/aotbuild.py)."""
    try:
        tree = ast.parse(src)
    except (SyntaxError, ValueError):
        return frozenset()
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    out = set()
    todo = [tree]
    while todo:
        for ch in ast.iter_child_nodes(todo.pop()):
            if isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(ch, ast.Import):
                out.update(a.name for a in ch.names)
            elif isinstance(ch, ast.ImportFrom):
                m = ch.module or ""
                if ch.level:
                    m = ".".join(base[:len(base) - (ch.level - 1)] + ([ch.module] if ch.module else []))
                for a in ch.names:
                    sub = f"{m}.{a.name}"
                    out.add(sub if known(sub) else m)
            todo.append(ch)
    return frozenset(out)


def _kernel_sources(root: Path, top: str) -> dict:
    """{path relative to root: bytes} of the files package `top`'s compiled kernels can depend
    on: its modules that import core/jit.py (they define kernels or intrinsics; jit.py itself
    in skewscope) and, transitively, every module of the package their module-level imports
    bind (constants, dtypes and callee kernels are frozen in from there): the rule
    tools/aotbuild.py applies to the AOT module's kernels."""
    jit_mod = JIT_MODULE
    files = {}  # module name -> (relative path, bytes)
    for rel, _, _ in _source_stats(root)[0]:
        parts = rel[:-3].split(os.sep)
        if parts[-1] == "__init__":
            parts.pop()
        try:
            files[".".join([top] + parts)] = (rel.replace(os.sep, "/"), (root / rel).read_bytes())
        except OSError:
            continue

    @functools.cache
    def bound(mod):
        rel, src = files[mod]
        return bound_imports(mod, src, rel.endswith("__init__.py"), lambda m: m in files or m == jit_mod)

    todo = [m for m, (_, src) in files.items() if m == jit_mod or (b"jit" in src and jit_mod in bound(m))]
    seen = set()
    while todo:
        m = todo.pop()
        if m in seen or m not in files:
            continue
        seen.add(m)
        todo.extend(bound(m))
    return dict(files[m] for m in seen)
