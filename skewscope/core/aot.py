"""Ahead-of-time compiled kernels: the runtime's check that the module is current.

The module is built by `tools/aotbuild.py build` (make setup runs it when stale);
`tools/aotbuild.py status` says whether it is current, and if not why.

**Build** (tools/aotbuild.py). A training workload (presets written as pcaps, then `report`,
`report --json`, `diagnose`, `--html`, per-node views and the live analysis on them, in one
process) runs under numba, and every call from Python into a kernel records its argument key
(`jit.arg_key`) and numba's signature for it. numba's pycc then compiles each (kernel,
signature) from the same source into one extension module, `skewscope/_aot.<abi>.so`, for
this CPU (`target_cpu="host"`; wrappers release the GIL, as the kernels' `nogil` does under
numba). Next to it, `skewscope/_aot.pkl` (the manifest) names each exported function with
its kernel and argument key, and holds the files the compiled code depends on (the kernels'
modules and every skewscope module their module-level imports bind, transitively) with their
digest, the CPU, Python, numpy and numba versions, and a build id that the module itself
returns (`_build_id()`), so a module and a manifest from different builds are never paired.
Both files are written to temporary names and renamed into place.

**Run time** (`functions_for`, on a Kernel's first call): loads the manifest and uses the
module only when those files are unchanged, the CPU, Python and numpy match and the build id
agrees; otherwise every kernel runs under numba as before (a stale module is never used;
`status` says why). The check stats ~30 files once per process, and hashes them (~1 MB, ~3 ms)
only when a stat moved since the build (an edit, a checkout, a copy). `SKEWSCOPE_AOT=0`
disables the module.
"""
from __future__ import annotations

import importlib
import os
import pickle
import platform
import sys
from pathlib import Path

from skewscope.core.digest import blake2b

PKG = Path(__file__).resolve().parent.parent          # skewscope/
MANIFEST = PKG / "_aot.pkl"
MODNAME = "_aot"
FORMAT = 1

_state = None      # None: not checked; False: unusable; dict: manifest + module
_why = ""          # why the module is not used (status)


def sources_digest(files) -> str:
    """blake2b over the given files of skewscope/ (relative path + bytes, in order); a missing
    file digests differently from any content."""
    h = blake2b(digest_size=16)
    for rel in files:
        h.update(rel.encode() + b"\0")
        try:
            h.update((PKG / rel).read_bytes())
        except OSError:
            h.update(b"\1missing")
        h.update(b"\0")
    return h.hexdigest()


def sources_stats(files) -> list:
    """(mtime_ns, size) of each of the given files of skewscope/ (None when missing). The build
    records them beside the digest: while they are all unchanged the files are not read again
    (~3 ms of every command's start), as numba's cache stamp does (core/jitcache.py _refresh); any
    edit, checkout or copy moves them and the digest decides."""
    out = []
    for rel in files:
        try:
            st = os.stat(PKG / rel)
            out.append((st.st_mtime_ns, st.st_size))
        except OSError:
            out.append(None)
    return out


def cpu_id() -> str:
    """This CPU's model and feature flags (the module is compiled for them)."""
    model = flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not model and line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                elif not flags and line.startswith("flags"):
                    flags = line.split(":", 1)[1].strip()
                if model and flags:
                    break
    except OSError:
        pass
    return blake2b(f"{platform.machine()}|{model}|{flags}".encode(), digest_size=8).hexdigest()


def environment() -> dict:
    import numpy  # heavy: only once a kernel is called (numpy is loaded by then)
    return {"python": sys.version.split()[0], "numpy": numpy.__version__, "cpu": cpu_id()}


def _load():
    """The current module and manifest, or False (and _why says why)."""
    global _state, _why
    if _state is not None:
        return _state
    _state = False
    if os.environ.get("SKEWSCOPE_AOT", "1") == "0":
        _why = "disabled (SKEWSCOPE_AOT=0)"
        return _state
    try:
        with open(MANIFEST, "rb") as f:
            man = pickle.load(f)
    except FileNotFoundError:
        _why = f"not built ({MANIFEST.name} missing: python -m skewscope.core.aot build)"
        return _state
    except Exception as e:  # unreadable manifest: run under numba
        _why = f"unreadable manifest {MANIFEST.name}: {e}"
        return _state
    if not isinstance(man, dict) or man.get("format") != FORMAT:
        _why = "manifest of another format"
        return _state
    env = environment()
    for k, v in env.items():
        if man.get(k) != v:
            _why = f"built for {k} {man.get(k)}, this is {v}"
            return _state
    files = man.get("files", ())
    if man.get("stats") != sources_stats(files) and man.get("digest") != sources_digest(files):
        _why = "stale: a kernel's source (or a module it imports) changed since the build"
        return _state
    try:
        mod = importlib.import_module(f"skewscope.{MODNAME}")
    except ImportError as e:
        _why = f"module does not load: {e}"
        return _state
    if mod._build_id() != man["build_id"]:
        _why = "module and manifest are from different builds"
        return _state
    _why = ""
    _state = {"manifest": man, "module": mod}
    return _state


def functions_for(name: str) -> dict:
    """{argument key: compiled function} of kernel `name` ("module:qualname"), {} when none."""
    st = _load()
    if not st:
        return {}
    mod = st["module"]
    return {key: getattr(mod, sym) for key, sym in st["manifest"]["kernels"].get(name, ())}


def status() -> tuple[bool, str]:
    st = _load()
    if not st:
        return False, _why
    man = st["manifest"]
    n = sum(len(v) for v in man["kernels"].values())
    return True, f"current: {len(man['kernels'])} kernels, {n} signatures (numba {man['numba']})"
