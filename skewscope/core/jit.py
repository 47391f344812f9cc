"""numba's `njit` for skewscope's kernels, with a cheaper first load of cached kernels.

Every kernel is `@njit(cache=True)`; a run that finds them all in numba's on-disk cache
still paid for numba's full context set-up on the first load: `BaseContext.refresh()`
imports and registers every numba.np / numba.cpython / numba.typed implementation
(`load_additional_registries`, ~0.3 s unloaded), which only *compiling* needs -- a cached
kernel is machine code plus its environment. Here the cache load initialises only the
runtime (NRT) that the loaded code calls; the full refresh still happens, as numba does
it, the first time anything is actually compiled (`CompilerBase.__init__`, and
`BaseContext.get_function` on a miss) -- so a cache miss, a changed kernel or a new
signature behaves exactly as before. Measured in tools/bench/bench_startup.py and
docs/startup.md.

Set SKEWSCOPE_NUMBA_FULL_REFRESH=1 to keep numba's own behaviour (for comparison).
"""
from __future__ import annotations

import os

import numba
from numba.core import caching
from numba.core.runtime import rtsys

__all__ = ["njit"]

njit = numba.njit

_orig_load_overload = caching.Cache.load_overload


def _light_load_overload(self, sig, target_context):
    """Cache.load_overload without the full context refresh: NRT only (idempotent)."""
    rtsys.initialize(target_context)
    with self._guard_against_spurious_io_errors():
        return self._load_overload(sig, target_context)


if not os.environ.get("SKEWSCOPE_NUMBA_FULL_REFRESH") and getattr(caching.Cache, "_skewscope_light", None) is None:
    caching.Cache.load_overload = _light_load_overload
    caching.Cache._skewscope_light = True
