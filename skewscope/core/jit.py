"""skewscope's kernels: numba `njit` functions that can also run precompiled, without numba.

`@njit(...)` here does not import numba. It returns a `Kernel`: a stand-in that a call from
Python resolves, once, to one of two implementations of the same Python function:

- **ahead-of-time** (`skewscope/_aot*.so`, built by `tools/aotbuild.py build`, which
  `make setup` runs): machine code compiled by numba's pycc from the same source, for the
  argument types recorded on a training workload. Loading it imports neither numba nor
  llvmlite (`import numba` alone is ~0.55 s here, more than the whole first-result budget of
  `report`: docs/startup.md). It is used only when the module is *current* -- the kernels'
  modules and every module they import are unchanged since the build and the CPU is the one
  it was built for -- and only for a call whose argument types (dtype, ndim, layout, writeable, aligned;
  int/float/bool; tuples) equal a compiled signature: pycc's wrappers check an array's item size
  only, so the type check is ours (`arg_key`). `SKEWSCOPE_AOT=0` turns it off.
- **numba** (JIT, `cache=True`): everything else -- a stale or absent module, a new argument
  type, a kernel not in the module. numba is imported on the first such call; then kernels
  compile (or load from numba's cache) exactly as plain `numba.njit` would. Kernels calling
  kernels: numba sees a `Kernel` global as its dispatcher (a `typeof` registration, plus the
  `py_func` / `targetoptions` numba's inliner reads), and an `intrinsic` stand-in as the
  intrinsic.

Both run the same source with the same numba; results are identical (tests/unit/test_aot.py).

numba's on-disk cache is kept current for what a kernel inlines by core/jitcache.py
(`_fresh_cache`, once per process and package, before numba reads a cache).

numba's cache load is made cheaper (since the start-up work): numba's `Cache.load_overload`
begins with `BaseContext.refresh()`, which imports and registers every numba.np /
numba.cpython / numba.typed implementation (~0.3 s) that only *compiling* needs. The light
load initialises only the runtime (NRT) the loaded code calls; anything that compiles still
does the full refresh first, inside numba. `SKEWSCOPE_NUMBA_FULL_REFRESH=1` keeps numba's own
behaviour (for comparison).

`prefetch(a, i)`: a software prefetch of a[i]'s cache line (LLVM's llvm.prefetch: read,
all cache levels), for kernels that walk rows too far apart for the hardware prefetcher
(the flow table's 850-byte rows: it stops at every 4 KiB page). A hint only: never
faults, changes no result. `prefetch_span(a, start, nbytes)`: every cache line of
a[start:start + nbytes] (the row kernels' look-ahead, inlined); `prefetch_l2` /
`prefetch_span_l2` the same into L2 only (for a kernel that streams whole rows of two
tables: L1's miss buffers stay free for its own loads). `stream_lines(d, i, s, j, lines)`:
64-byte lines written by non-temporal stores (no read of each destination line before its
write), `stream_fence()` after them. `unaligned(bits, order,
store)`: the one codegen of an integer read or written at any byte of a uint8 array, in one
instruction; built on it, `load_u64(a, i)` / `store_u64(a, i, v)` (a flow row's counters sit
at odd offsets) and the offline parser's field readers ld8, be16, be32, le32, le64, rd16, rd32.
"""
from __future__ import annotations

import functools
import inspect
import os
import sys
from pathlib import Path

from skewscope.core import aot as _aotmod
from skewscope.core.jitcache import _fresh_cache

__all__ = ["njit", "intrinsic", "item_pointers", "prefetch", "prefetch_l2", "prefetch_span", "prefetch_span_l2",
           "stream_lines", "stream_fence", "unaligned", "load_u64", "store_u64", "ld8", "be16",
           "be32", "le32", "le64", "rd16", "rd32", "Kernel", "arg_key", "numba_loaded"]

#: every Kernel, in definition order (the AOT build compiles from this registry)
KERNELS: list["Kernel"] = []
_numba = None
#: set by skewscope.core.aot while it records a training workload: (kernel, key, args) -> None
_recorder = None


def numba_loaded() -> bool:
    """True once a kernel has needed numba in this process."""
    return _numba is not None


def _load_numba():
    """Import numba (once), with the light cache load and the Kernel/intrinsic typing."""
    global _numba
    if _numba is not None:
        return _numba
    import numba  # heavy (0.55 s): only when a kernel runs under numba
    from numba.core import caching  # heavy: numba
    from numba.core.runtime import rtsys  # heavy: numba
    from numba.extending import typeof_impl  # heavy: numba

    if not os.environ.get("SKEWSCOPE_NUMBA_FULL_REFRESH") and getattr(caching.Cache, "_skewscope_light", None) is None:
        def _light_load_overload(self, sig, target_context):
            """Cache.load_overload without the full context refresh: NRT only (idempotent)."""
            rtsys.initialize(target_context)
            with self._guard_against_spurious_io_errors():
                return self._load_overload(sig, target_context)
        caching.Cache.load_overload = _light_load_overload
        caching.Cache._skewscope_light = True

    @typeof_impl.register(Kernel)
    def _typeof_kernel(val, c):
        return numba.types.Dispatcher(val.dispatcher)

    @typeof_impl.register(Intrinsic)
    def _typeof_intrinsic(val, c):
        from numba.core.registry import cpu_target  # heavy: numba
        real = val.real
        ctx = cpu_target.typing_context
        ctx.refresh()  # registers an intrinsic made after the context's last refresh
        return ctx.resolve_value_type(real)

    _numba = numba
    return numba


#: numba's types of Python's scalars, as numpy dtypes (filled once numpy is loaded)
_PY: dict = {}


def arg_key(a):
    """The part of numba's type of a call argument that a compiled signature depends on, without
    numba: numpy's dtype for a scalar (Python's bool/int/float as numba types them), (dtype,
    ndim, layout, writeable, aligned) for an array, ("T", ...) for a tuple; None for a type the
    precompiled path does not take (the call goes to numba)."""
    np = sys.modules.get("numpy")
    if np is None:
        return None
    if not _PY:
        _PY.update({bool: np.dtype(np.bool_), int: np.dtype(np.int64), float: np.dtype(np.float64)})
    t = type(a)
    if t is int:
        return _PY[int] if -(1 << 63) <= a < (1 << 63) else None
    if t is bool or t is float:
        return _PY[t]
    if t is tuple:
        k = tuple(arg_key(x) for x in a)
        return None if any(x is None for x in k) else ("T",) + k
    if isinstance(a, np.ndarray):
        f = a.flags
        layout = "C" if f.c_contiguous else "F" if f.f_contiguous else "A"
        return (a.dtype, a.ndim, layout, bool(f.writeable), bool(f.aligned))
    if isinstance(a, np.generic) and t.__module__ == "numpy" and a.dtype.fields is None:
        return a.dtype
    return None


def _call_key(args):
    k = tuple(arg_key(a) for a in args)
    # `is`, not `in`: numpy's float64 dtype compares equal to None (np.dtype(None) is float64)
    return None if any(x is None for x in k) else k


class Kernel:
    """A numba kernel that may run precompiled (see the module doc)."""

    def __init__(self, py_func, options: dict):
        self.py_func = py_func
        self.options = dict(options)
        #: what numba's inliner reads from a callee global (inline="always")
        self.targetoptions = {k: v for k, v in options.items() if k != "cache"}
        self.name = f"{py_func.__module__}:{py_func.__qualname__}"
        code = py_func.__code__
        self._nparams = code.co_argcount
        self._defaults = py_func.__defaults__ or ()
        self._dispatcher = None
        self._aot = None  # None: not looked up yet; {}: none; {key: compiled function}
        functools.update_wrapper(self, py_func)
        KERNELS.append(self)

    @property
    def dispatcher(self):
        """The numba dispatcher (imports numba on first use)."""
        if self._dispatcher is None:
            numba = _load_numba()
            _fresh_cache(self.py_func.__module__)
            self._dispatcher = numba.njit(**self.options)(self.py_func)
        return self._dispatcher

    @property
    def signatures(self):
        """numba's compiled signatures in this process ([] when numba has compiled nothing)."""
        return self._dispatcher.signatures if self._dispatcher is not None else []

    def aot_keys(self):
        """The argument keys this kernel has precompiled code for (empty when none is current)."""
        if self._aot is None:
            self._aot = _aotmod.functions_for(self.name)
        return list(self._aot)

    def __call__(self, *args, **kwargs):
        aot = self._aot
        if aot is None:
            aot = self._aot = _aotmod.functions_for(self.name)
        if kwargs or _recorder is not None:
            args = self._bind(args, kwargs)
        elif len(args) < self._nparams and self._defaults:
            args = args + self._defaults[len(args) - self._nparams:]
        if aot:
            fn = aot.get(_call_key(args))
            if fn is not None:
                return fn(*args)
        out = self.dispatcher(*args)
        if _recorder is not None:
            _recorder(self, args)
        return out

    def _bind(self, args, kwargs):
        b = inspect.signature(self.py_func).bind(*args, **kwargs)
        b.apply_defaults()
        return tuple(b.args)

    def __repr__(self):
        return f"<skewscope kernel {self.name}>"


def njit(*args, **options):
    """`numba.njit` for skewscope (same options); `@njit` or `@njit(cache=True, ...)`."""
    if args and callable(args[0]) and not options:
        return Kernel(args[0], {})

    def deco(fn):
        return Kernel(fn, options)
    return deco


class Intrinsic:
    """`numba.extending.intrinsic`, applied when numba is first needed."""

    def __init__(self, defn):
        self.defn = defn
        self._real = None
        functools.update_wrapper(self, defn)

    @property
    def real(self):
        if self._real is None:
            _load_numba()
            from numba.extending import intrinsic as _intrinsic  # heavy: numba
            self._real = _intrinsic(self.defn)
        return self._real

    def __call__(self, *args):
        raise TypeError(f"{self.defn.__name__} is an intrinsic: call it from a kernel")


def intrinsic(defn):
    """Declare a numba intrinsic without importing numba (the definition's body imports what it uses)."""
    return Intrinsic(defn)


def item_pointers(context, builder, signature, args, at=(0, 2)):
    """In an intrinsic's codegen: the pointers to the elements named by its (1-D array, index)
    argument pairs that start at the positions `at` (default: a destination pair then a
    source pair, as stream_lines's and core.snapshot._copy_bytes's); no bounds check."""
    from numba.core import cgutils  # heavy: codegen runs only under numba

    out = []
    for p in at:
        ty = signature.args[p]
        ary = context.make_array(ty)(context, builder, args[p])
        out.append(cgutils.get_item_pointer(context, builder, ty, ary, [args[p + 1]], wraparound=False))
    return out


def _prefetcher(locality: int, name: str) -> "Intrinsic":
    """prefetch(a, i) with LLVM's `locality` (3: all levels, x86 prefetcht0; 2: L2 and out,
    prefetcht1)."""
    def typer(typingctx, arr, idx):
        from llvmlite import ir  # heavy: typing runs only under numba
        from llvmlite.binding import llvm_version_info  # heavy: as above
        from numba.core import cgutils, types  # heavy: as above

        # the intrinsic's pointer suffix: opaque pointers (LLVM >= 15) or i8* (LLVM 14: numba 0.59)
        fname = "llvm.prefetch.p0" if llvm_version_info[0] >= 15 else "llvm.prefetch.p0i8"
        sig = types.void(arr, idx)

        def codegen(context, builder, signature, args):
            aryty = signature.args[0]
            ary = context.make_array(aryty)(context, builder, args[0])
            ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [args[1]], wraparound=False)
            i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
                                                fname)
            # (address, rw = 0 read, locality, cache type = 1 data)
            builder.call(fn, [builder.bitcast(ptr, i8p), i32(0), i32(locality), i32(1)])
            return context.get_dummy_value()

        return sig, codegen
    typer.__name__ = typer.__qualname__ = name
    return intrinsic(typer)


#: prefetch(a, i): hint the CPU to load the cache line of a[i] into every cache level (1-D
#: array, no bounds check needed: a prefetch never faults). prefetch_l2(a, i): into L2 (and
#: L3), not L1: a kernel that streams whole rows of two tables (core.rates._delta_rows, ~28
#: lines a row in flight) ran 1.6x as fast so on this VM's Zen 4 -- L1's few miss buffers
#: held by prefetches stalled its own loads
prefetch = _prefetcher(3, "prefetch")
prefetch_l2 = _prefetcher(2, "prefetch_l2")


@njit(cache=True, nogil=True, inline="always")
def prefetch_span(raw, start, nbytes):
    """Prefetch each cache line of raw[start:start + nbytes] (raw: 1-D uint8). Row kernels
    call it for the row a few ahead: the hardware prefetcher stops at every 4 KiB page, and
    the flow table's 850-byte rows cross one every fifth row."""
    o = start - start % 64
    while o < start + nbytes:
        prefetch(raw, o)
        o += 64


@njit(cache=True, nogil=True, inline="always")
def prefetch_span_l2(raw, start, nbytes):
    """prefetch_span into L2 (prefetch_l2): for kernels that stream whole rows."""
    o = start - start % 64
    while o < start + nbytes:
        prefetch_l2(raw, o)
        o += 64


@intrinsic
def stream_lines(typingctx, dst, di, src, si, lines):
    """stream_lines(d, i, s, j, lines): the 64 x lines bytes at d[i:] = those at s[j:] (1-D
    uint8 arrays, no bounds check) by non-temporal stores: written to memory without the
    CPU reading each destination line first (an ordinary store's write-allocate: a third
    more memory traffic for output written once and not read again by the writer). d + i
    must be 64-byte aligned (s: any alignment). Call stream_fence() before the writes are
    read by another thread (non-temporal stores are weakly ordered)."""
    from llvmlite import ir  # heavy: typing runs only under numba
    from numba.core import cgutils, types  # heavy: as above

    def codegen(context, builder, signature, args):
        d, s = item_pointers(context, builder, signature, args)
        i64 = ir.IntType(64)
        vec = ir.VectorType(i64, 4)
        nt = builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)])
        n = context.cast(builder, args[4], signature.args[4], types.int64)
        with cgutils.for_range(builder, builder.mul(n, i64(2))) as loop:
            off = builder.mul(loop.index, i64(32))
            x = builder.load(builder.bitcast(builder.gep(s, [off]), vec.as_pointer()), align=1)
            st = builder.store(x, builder.bitcast(builder.gep(d, [off]), vec.as_pointer()), align=32)
            st.set_metadata("nontemporal", nt)
        return context.get_dummy_value()

    return types.void(dst, di, src, si, lines), codegen


@intrinsic
def stream_fence(typingctx):
    """stream_fence(): the non-temporal stores before it are visible to every CPU before
    any store after it (x86: sfence; elsewhere a full fence)."""
    from llvmlite import ir  # heavy: typing runs only under numba
    from numba.core import cgutils, types  # heavy: as above

    def codegen(context, builder, signature, args):
        triple = str(getattr(builder.module, "triple", "") or "")
        if not triple:
            from llvmlite import binding  # heavy: as above
            triple = binding.get_process_triple()
        if triple.startswith(("x86_64", "i386", "i686")):
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []),
                                                "llvm.x86.sse.sfence")
            builder.call(fn, [])
        else:
            builder.fence("seq_cst")
        return context.get_dummy_value()

    return types.void(), codegen


def unaligned(bits: int, order: str = "le", store: bool = False, result: str = "uint64") -> "Intrinsic":
    """An intrinsic that reads (or, `store`, writes) the `bits`-bit unsigned integer at byte i
    of a 1-D uint8 array in one instruction at any alignment (x86 loads unaligned words as
    they are; numba would read the bytes one by one, each with a negative-index wraparound,
    a compare and a cmov). No bounds check, no wraparound: the callers' offsets are never
    negative and their bytes are there.

    load: f(a, i) -> the value zero-extended to `result` (a numba integer type name);
    order "le" / "be" / "arg" (f(a, i, big): big-endian when the bool big is true).
    store: f(a, i, v) -> None, v cast to uint64 and its low `bits` written in `order`."""
    if store and order == "arg":
        raise ValueError("a store's byte order is fixed")

    def codegen(context, builder, sig, args):
        from llvmlite import ir  # heavy: codegen runs only under numba
        from numba.core import cgutils, types  # heavy: as above
        aryty = sig.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        off = context.cast(builder, args[1], sig.args[1], types.intp)
        ity = ir.IntType(bits)
        ptr = builder.bitcast(cgutils.get_item_pointer(context, builder, aryty, ary, [off], wraparound=False),
                              ity.as_pointer())
        if store:
            v = context.cast(builder, args[2], sig.args[2], types.uint64)
            v = builder.trunc(v, ity) if bits < 64 else v
            builder.store(builder.bswap(v) if order == "be" and bits > 8 else v, ptr, align=1)
            return context.get_dummy_value()
        v = builder.load(ptr, align=1)
        if bits > 8 and order == "be":
            v = builder.bswap(v)
        elif bits > 8 and order == "arg":
            big = context.cast(builder, args[2], sig.args[2], types.boolean)
            v = builder.select(big, builder.bswap(v), v)
        return builder.zext(v, ir.IntType(64)) if bits < 64 else v

    if store or order == "arg":
        def typer(typingctx, arr, idx, third):
            from numba.core import types  # heavy: typing runs only under numba
            return (types.void if store else getattr(types, result))(arr, idx, third), codegen
    else:
        def typer(typingctx, arr, idx):
            from numba.core import types  # heavy: typing runs only under numba
            return getattr(types, result)(arr, idx), codegen
    typer.__name__ = typer.__qualname__ = f"{'store' if store else 'load'}{bits}{order}"
    return intrinsic(typer)


#: load_u64(a, i) / store_u64(a, i, v): a flow row's counters (u64 at odd offsets)
load_u64 = unaligned(64)
store_u64 = unaligned(64, store=True)
#: the offline parser's field readers (int64, its integers): ld8 (b[o]), be16/be32 (network
#: order), le32/le64, rd16/rd32 (a capture's own byte order: big-endian when `big`)
ld8 = unaligned(8, result="int64")
be32 = unaligned(32, "be", result="int64")
le32 = unaligned(32, result="int64")
_be16 = unaligned(16, "be", result="int64")
_le64 = unaligned(64, result="int64")
_rd16 = unaligned(16, "arg", result="int64")
_rd32 = unaligned(32, "arg", result="int64")


# be16, le64, rd16, rd32 stay numba functions around their intrinsic (compiled apart, then
# inlined by LLVM), as they were before the intrinsics: calling the intrinsic directly gives
# the parser's kernels other register allocation (machine code not measured)
@njit(cache=True)
def be16(b, o):
    return _be16(b, o)


@njit(cache=True)
def le64(b, o):
    return _le64(b, o)


@njit(cache=True)
def rd16(b, o, big):
    return _rd16(b, o, big)


@njit(cache=True)
def rd32(b, o, big):
    return _rd32(b, o, big)
