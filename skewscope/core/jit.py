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

`prefetch(a, i)`: a software prefetch of a[i]'s cache line (LLVM's llvm.prefetch: read,
all cache levels), for kernels that walk rows too far apart for the hardware prefetcher
(the flow table's 850-byte rows: it stops at every 4 KiB page). A hint only: never
faults, changes no result.
"""
from __future__ import annotations

import os

import numba
from llvmlite import ir
from llvmlite.binding import llvm_version_info
from numba.core import caching, cgutils, types
from numba.core.runtime import rtsys
from numba.extending import intrinsic

__all__ = ["njit", "prefetch"]

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


#: the intrinsic's pointer suffix: opaque pointers (LLVM >= 15) or i8* (LLVM 14: numba 0.59)
_PREFETCH = "llvm.prefetch.p0" if llvm_version_info[0] >= 15 else "llvm.prefetch.p0i8"


@intrinsic
def prefetch(typingctx, arr, idx):
    """prefetch(a, i): hint the CPU to load the cache line of a[i] (1-D array, no bounds
    check needed: a prefetch never faults)."""
    sig = types.void(arr, idx)

    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [args[1]], wraparound=False)
        i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
                                            _PREFETCH)
        # (address, rw = 0 read, locality = 3 keep in all levels, cache type = 1 data)
        builder.call(fn, [builder.bitcast(ptr, i8p), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return sig, codegen
