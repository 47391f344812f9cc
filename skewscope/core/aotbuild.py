"""Build the ahead-of-time kernel module that skewscope.core.aot loads (see its docstring).

    python -m skewscope.core.aotbuild build [--quick] [--if-stale]   # make setup: ~3-5 min
    python -m skewscope.core.aotbuild status                         # current? else why not

Imports numba (it compiles); nothing at run time imports this module.
"""
from __future__ import annotations

import argparse
import contextlib
import gzip
import io
import os
import pickle
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numba
import numba.pycc.compiler as pycc_compiler
from numba.core.typing.typeof import Purpose
from numba.pycc import CC

from skewscope import analysis
from skewscope.cli import main as cli
from skewscope.core import aot, jit
from skewscope.core.aot import FORMAT, MANIFEST, MODNAME, PKG, environment, sources_digest, status
from skewscope.gen.presets import PRESETS
from skewscope.sources.offline import parse_file


TRAINING = ("ring-straggler", "tree-healthy", "moe-hot-expert", "pipeline-bubbles", "ipv6-ring", "vlan-alltoall",
            "pfc", "loss", "tp-decode-slow-shard", "ep-decode-hot-drift", "pd-imbalanced", "tp-decode-instances",
            "prefill-interference", "demo-mix")


def _workload(tmp: Path, quick: bool = False) -> None:
    """Run what users run first, so the kernels' argument types are recorded."""

    def run(*argv):
        try:
            rv = cli.main(list(argv), standalone_mode=False)
        except SystemExit as e:  # diagnose: exit code = worst severity
            rv = e.code
        if rv not in (0, None) and not (argv[0] == "diagnose" and rv in (1, 2)):
            raise RuntimeError(f"training run `skewscope {' '.join(argv)}` exited {rv}")

    # one of each traffic kind (ring/tree all-reduce, all-to-all, pipeline, IPv6/VLAN, PFC and
    # loss, TP/EP decode, prefill/decode, mixed): the full preset list records no other
    # signature and takes 2.5x as long
    names = [n for n in TRAINING if n in PRESETS]
    if quick:
        names = ["ring-straggler", "tp-decode-slow-shard", "pd-imbalanced"]
    for i, name in enumerate(names):
        p = tmp / f"{name}.pcap"
        with contextlib.redirect_stdout(io.StringIO()):
            run("gen", name, "-o", str(p), "--snaplen", "128" if i % 2 else "0")
            run("report", "--json", str(p))
            run("report", str(p))
            run("diagnose", str(p))
            if i % 3 == 0:
                run("diagnose", "--json", str(p))
                run("report", "--html", str(tmp / f"{name}.html"), str(p))
        snap = parse_file(str(p))
        analysis.live_metrics(snap)
        analysis.live_metrics(snap, records=True)
        if i == 0:  # a compressed capture is read from memory, not a mapped file
            with open(p, "rb") as f, gzip.open(str(p) + ".gz", "wb") as g:
                shutil.copyfileobj(f, g)
            with contextlib.redirect_stdout(io.StringIO()):
                run("report", "--json", str(p) + ".gz")
    # one DPU per node: a per-node view and its node report
    p = tmp / "views"
    with contextlib.redirect_stdout(io.StringIO()):
        run("gen", "tp-decode-slow-shard", "--views", str(p))
        for v in sorted(p.glob("*.pcap"))[:2]:
            run("report", "--json", "--node-ip", v.stem, str(v))


def build(quick: bool = False, verbose: bool = True) -> Path:
    t0 = time.monotonic()

    def log(msg):
        if verbose:
            print(f"aot: [{time.monotonic() - t0:5.0f} s] {msg}", file=sys.stderr, flush=True)

    os.environ["SKEWSCOPE_AOT"] = "0"   # record under numba, not under an older module
    aot._state, aot._why = False, "building"
    for k in jit.KERNELS:
        k._aot = {}

    seen: dict[str, dict] = {}
    kernels: dict[str, "jit.Kernel"] = {}

    def record(kernel, args):
        key = jit._call_key(args)
        if key is None:
            return
        d = seen.setdefault(kernel.name, {})
        if key in d:
            return
        argtypes = tuple(numba.typeof(a, Purpose.argument) for a in args)
        cres = kernel.dispatcher.overloads.get(argtypes)
        if cres is None:
            return
        d[key] = cres.signature
        kernels[kernel.name] = kernel

    digest = sources_digest()
    log("recording kernel signatures on the training workload (numba compiles what its cache lacks)")
    jit._recorder = record
    try:
        with tempfile.TemporaryDirectory(prefix="skewscope-aot-") as tmp:
            _workload(Path(tmp), quick=quick)
    finally:
        jit._recorder = None
    if sources_digest() != digest:
        raise RuntimeError("skewscope's sources changed during the build; run it again")

    def _compile_extra(typingctx, targetctx, func, args, return_type, flags, **kw):
        """pycc compiles every export with one Flags object, and numba's inliner sets
        enable_ssa=False on the flags it is given (inline_closurecall.run_untyped_passes), so
        every export after one that inlines a callee would be typed without SSA. A copy per
        export, as numba's dispatcher makes; release_gil as the kernels' nogil under numba
        (the live view and the exporter run analysis in a thread)."""
        flags = flags.copy()
        flags.release_gil = True
        return _orig_compile_extra(typingctx, targetctx, func, args, return_type, flags, **kw)

    _orig_compile_extra = pycc_compiler.compile_extra
    build_id = int.from_bytes(os.urandom(7), "little")
    out: dict[str, list] = {}
    with tempfile.TemporaryDirectory(prefix="skewscope-aot-", dir=PKG) as tmp:
        cc = CC(MODNAME)
        cc.output_dir = tmp
        cc.target_cpu = "host"
        cc.verbose = False
        n = 0
        for name, sigs in sorted(seen.items()):
            k = kernels[name]
            for key, sig in sigs.items():
                sym = f"k{n}"
                cc.export(sym, sig)(k.py_func)
                out.setdefault(name, []).append((key, sym))
                n += 1

        def _build_id_fn():
            return build_id
        cc.export("_build_id", "int64()")(_build_id_fn)
        log(f"compiling {n} signatures of {len(out)} kernels with numba.pycc for this CPU")
        pycc_compiler.compile_extra = _compile_extra
        try:
            cc.compile()
        finally:
            pycc_compiler.compile_extra = _orig_compile_extra
        built = [f for f in os.listdir(tmp) if f.startswith(MODNAME + ".") and f.endswith((".so", ".pyd"))]
        if len(built) != 1:
            raise RuntimeError(f"pycc produced {built}")
        man = {"format": FORMAT, **environment(), "numba": numba.__version__, "digest": digest,
               "build_id": build_id, "kernels": out}
        for old in PKG.glob(MODNAME + ".*.so"):
            if old.name != built[0]:
                old.unlink()
        os.replace(os.path.join(tmp, built[0]), PKG / built[0])
        mtmp = os.path.join(tmp, "manifest")
        with open(mtmp, "wb") as f:
            pickle.dump(man, f)
        os.replace(mtmp, MANIFEST)
    log(f"wrote {PKG / built[0]} and {MANIFEST.name}")
    return PKG / built[0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m skewscope.core.aotbuild", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="record the kernels' signatures and compile them")
    b.add_argument("--quick", action="store_true", help="three presets only (tests)")
    b.add_argument("--if-stale", action="store_true", help="do nothing when the module is current")
    sub.add_parser("status", help="is the module current?")
    a = ap.parse_args(argv)
    if a.cmd == "status":
        ok, why = status()
        print(why)
        return 0 if ok else 1
    if a.if_stale and status()[0]:
        print("aot: current", file=sys.stderr)
        return 0
    build(quick=a.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
