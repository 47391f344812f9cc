"""Build the ahead-of-time kernel module that skewscope.core.aot loads (see its docstring).

    .venv/bin/python tools/aotbuild.py build [--quick] [--if-stale]   # make setup: ~4 min
    .venv/bin/python tools/aotbuild.py status                         # current? else why not

Imports numba (it compiles) and runs skewscope's commands on generated traffic; nothing in
skewscope imports this file.
"""
from __future__ import annotations

import argparse
import ast
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

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numba  # noqa: E402
import numba.pycc.compiler as pycc_compiler  # noqa: E402
from numba.core.typing.typeof import Purpose  # noqa: E402
from numba.pycc import CC  # noqa: E402

from skewscope import analysis  # noqa: E402
from skewscope.cli import main as cli  # noqa: E402
from skewscope.core import aot, jit, jitcache  # noqa: E402
from skewscope.core.aot import (  # noqa: E402
    FORMAT, MANIFEST, MODNAME, PKG, environment, sources_digest, sources_stats, status)
from skewscope.gen.presets import PRESETS  # noqa: E402
from skewscope.sources.offline import parse_file  # noqa: E402
from skewscope.sources.offline import pipeline as offline_pipeline  # noqa: E402


def _module_file(mod: str):
    """skewscope/<...>.py or <...>/__init__.py of a skewscope module name, else None."""
    parts = mod.split(".")
    if parts[0] != "skewscope":
        return None
    p = PKG.joinpath(*parts[1:])
    if (p / "__init__.py").is_file():
        return p / "__init__.py"
    return p.with_suffix(".py") if p.with_suffix(".py").is_file() else None


def _bound_imports(mod: str, path: Path) -> set[str]:
    """The skewscope modules `mod`'s module-level imports bind (core.jitcache.bound_imports: the
    numba cache's check applies the same rule)."""
    def known(m):
        return _module_file(m) is not None
    return {m for m in jitcache.bound_imports(mod, path.read_text(), path.name == "__init__.py", known) if known(m)}


def source_files(kernel_modules) -> list[str]:
    """What the compiled code can depend on: the kernels' modules and, transitively, every
    skewscope module their module-level imports bind (constants, dtypes and callee kernels are
    frozen in from there), plus core/jit.py (the intrinsics). Paths relative to skewscope/."""
    seen: dict[str, Path] = {}
    todo = list(kernel_modules) + ["skewscope.core.jit"]
    while todo:
        m = todo.pop()
        f = _module_file(m)
        if m in seen or f is None:
            continue
        seen[m] = f
        todo.extend(_bound_imports(m, f))
    return sorted(p.relative_to(PKG).as_posix() for p in seen.values())


TRAINING = ("ring-straggler", "tree-healthy", "moe-hot-expert", "pipeline-bubbles", "ipv6-ring", "vlan-alltoall",
            "pfc", "loss", "tp-decode-slow-shard", "ep-decode-hot-drift", "pd-imbalanced", "tp-decode-instances",
            "prefill-interference", "demo-mix", "mpi-alltoallv-hot")


def _live_workload(snap, path: str) -> None:
    """The live path's per-interval kernels (top, export, watch): the interval delta of two
    reads of a flow table sorted by key (the loader's) and of two unsorted ones (the hash
    join), its rates, the window following its anchor, the interval's records matched to its
    flows (sorted: a merge; unsorted: a hash table), the window's kept test against an older
    anchor from the reads' packets/first_ts columns, the exporter fed read after read (its
    window merge) and reading a capture once."""
    from skewscope.core import layout as L
    from skewscope.core.rates import (flow_rates, follow_join, kept_cols, order_words, record_rows, row_columns,
                                      words_sorted)
    from skewscope.core.snapshot import events_from_records
    from skewscope.sources.live import flow_delta, interval_delta
    cur = snap.flows[np.lexsort(order_words(snap.flows).T[::-1])]
    prev = cur.copy()
    for f in ("packets", "bytes"):
        prev[f] //= 2
    flow_rates(flow_delta(prev, cur, since_ns=1), 1.0)
    pw = order_words(prev)
    cols = np.empty((len(cur), 2), np.uint64)
    d, j, words = interval_delta(prev, cur, 1, pw, cols=cols)
    recs = np.zeros(min(len(cur), 64), L.MSG_REC_DTYPE)
    for f in ("src", "dst", "dest_qp", "ipver", "roce"):
        recs["key"][f] = cur[f][:len(recs)]
    events_from_records(d, recs)
    events_from_records(cur[::-1].copy(), recs)
    if words_sorted(pw):
        jf = follow_join(np.arange(len(prev)), j, pw, words)
        # the window against an older anchor: the kept test from the reads' columns, its
        # records matched on the read's key words
        kept = kept_cols(jf, cols, row_columns(prev))
        flow_delta(prev, cur, since_ns=1, j=jf, kept=kept)
        record_rows(words, kept[0], recs)
    flow_delta(prev[::-1].copy(), cur)
    # the exporter's steady state: read after read into one Accumulator (its window merge)
    from skewscope.outputs.exporter import Accumulator
    acc = Accumulator(timing_nodes=0)
    ev = events_from_records(d, recs)
    for k in range(3):
        e = ev.copy()
        e["start_ts"] += np.uint64(k * 1_000_000_000)
        e["end_ts"] += np.uint64(k * 1_000_000_000)
        acc.add(d, e, cum_flows=cur)
    with contextlib.redirect_stdout(io.StringIO()):
        cli.main(["export", "--from", path, "--once"], standalone_mode=False)


def _workload(tmp: Path, quick: bool = False) -> None:
    """Run what users run first, so the kernels' argument types are recorded."""

    def run(*argv):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            try:
                rv = cli.main(list(argv), standalone_mode=False)
            except SystemExit as e:  # diagnose: exit code = worst severity
                rv = e.code
        if rv not in (0, None) and not (argv[0] == "diagnose" and rv in (1, 2)):
            raise RuntimeError(f"training run `skewscope {' '.join(argv)}` exited {rv}: {err.getvalue().strip()}")

    # one of each traffic kind (ring/tree all-reduce, all-to-all, pipeline, IPv6/VLAN, PFC and
    # loss, TP/EP decode, prefill/decode, mixed, Open MPI's SENDs and RDMA READs): the full
    # preset list records no other
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
        if i == 0:
            _live_workload(snap, str(p))
        if i == 0:  # a compressed capture is read from memory, not a mapped file
            with open(p, "rb") as f, gzip.open(str(p) + ".gz", "wb") as g:
                shutil.copyfileobj(f, g)
            with contextlib.redirect_stdout(io.StringIO()):
                run("report", "--json", str(p) + ".gz")
            # the pipelined parser (large files: offline/pipeline.py) on a mapped and a read buffer,
            # with row blocks small enough that this capture needs several
            old = os.environ.get("SKEWSCOPE_OFFLINE_PIPELINE")
            os.environ["SKEWSCOPE_OFFLINE_PIPELINE"] = "1"
            rows, offline_pipeline.ROWS = offline_pipeline.ROWS, 64
            try:
                parse_file(str(p))
                parse_file(str(p) + ".gz")
            finally:
                offline_pipeline.ROWS = rows
                if old is None:
                    os.environ.pop("SKEWSCOPE_OFFLINE_PIPELINE", None)
                else:
                    os.environ["SKEWSCOPE_OFFLINE_PIPELINE"] = old
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

    log("recording kernel signatures on the training workload (numba compiles what its cache lacks)")
    jit._recorder = record
    try:
        with tempfile.TemporaryDirectory(prefix="skewscope-aot-") as tmp:
            _workload(Path(tmp), quick=quick)
    finally:
        jit._recorder = None
    files = source_files({name.split(":")[0] for name in seen})
    stats = sources_stats(files)    # before the digest: a file edited in between is hashed at run time
    digest = sources_digest(files)

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
        man = {"format": FORMAT, **environment(), "numba": numba.__version__, "digest": digest, "files": files,
               "stats": stats, "build_id": build_id, "kernels": out}
        for old in PKG.glob(MODNAME + ".*.so"):
            if old.name != built[0]:
                old.unlink()
        os.replace(os.path.join(tmp, built[0]), PKG / built[0])
        mtmp = os.path.join(tmp, "manifest")
        with open(mtmp, "wb") as f:
            pickle.dump(man, f)
        os.replace(mtmp, MANIFEST)
    if sources_digest(files) != digest:
        MANIFEST.unlink()
        raise RuntimeError("skewscope's kernel sources changed during the build; run it again")
    log(f"wrote {PKG / built[0]} and {MANIFEST.name} (current while these {len(files)} files are unchanged: "
        f"{', '.join(files)})")
    return PKG / built[0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="tools/aotbuild.py", description=__doc__.split("\n")[0])
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
