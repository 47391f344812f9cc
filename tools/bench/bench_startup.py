"""Start-up cost of the commands a user runs first (issue 16, target 4: first result <= 0.5 s).

Runs each command N times as a fresh process and prints the median wall time and the median
CPU time (user+sys of the child: far less sensitive than wall time to other load on a shared
machine), each also as a ratio to two baselines measured in the same run: `python -c pass`
(the interpreter) and `python -c "import numpy"` (the floor of anything that reads arrays).
Then the import-time breakdown (`python -X importtime`) of `--help` and of `report`: the
imports' total, and their self time summed per package (skewscope per subpackage). What a
report spends beyond its imports is loading its kernels (the precompiled module, or numba and
its cached kernels: the "numba JIT" rows, SKEWSCOPE_AOT=0), and the work.

The child runs like an installed copy: bytecode caches on (PYTHONDONTWRITEBYTECODE unset,
into a private PYTHONPYCACHEPREFIX, warmed by one untimed run) and numba's kernel cache warm.

`--against DIR`: the same report/diagnose/--help rows for another checkout (e.g. the main
branch before a change), timed interleaved in the same run ("before" rows). `--parts`: where
`report --json` on the small capture spends its CPU time, step by step in the command's own
order (imports, the reader, the kernel module, the analysis, the document, JSON), with the
time the garbage collector took in each step. `--instructions`: the instructions each
command executes (valgrind's callgrind, one run each: ~15 s per command), which other load
on the machine does not change -- the steadiest before/after on a shared machine.

    .venv/bin/python tools/bench/bench_startup.py [-n 7] [--pcap FILE] [--against DIR] [--parts] [--instructions]
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from skewscope.core import aot  # noqa: E402  (the AOT module's status, printed with the table)

SMALL = Path("/work/shared/data/real/softroce_write_pair__headers128.pcap")

#: --parts: report --json's steps in the command's order (cli.files.report, cli.common.load_source),
#: each timed in the child (wall, CPU, and the collector's time, from gc.callbacks); one line per step
PARTS_CHILD = r"""
import gc, os, sys, time
T = [("", time.perf_counter(), time.process_time(), 0.0)]
G = [0.0, 0.0]
def _gc(phase, info):
    if phase == "start":
        G[1] = time.perf_counter()
    else:
        G[0] += time.perf_counter() - G[1]
gc.callbacks.append(_gc)
def mark(name):
    T.append((name, time.perf_counter(), time.process_time(), G[0]))
path = sys.argv[1]
import click; mark("import click")
import skewscope.cli; mark("import skewscope.cli (+ the package)")
from skewscope.cli import common
getattr(common, "pause_gc", lambda: None)()   # what main() does for the process's own command line
from skewscope.cli import files; mark("import cli.files (report's module)")
import numpy; mark("import numpy")
from skewscope.analysis import analyze; mark("import the analysis (detectors, registry)")
from skewscope.outputs import report as R; mark("import outputs.report (rest)")
enricher = common.make_enricher(None, ()); mark("enricher (telemetry.enrich)")
from skewscope.core.snapshot import Snapshot; mark("import core.snapshot (rest)")
from skewscope.sources import offline; mark("import the reader (sources.offline)")
getattr(common, "startup_done", lambda: None)()   # what load_source does once the reader is imported
from skewscope.core import aot; aot.status(); mark("kernel module: check + load (core.aot)")
snap = offline.parse_file(path); mark("parse (offline.parse_file)")
a = analyze(snap); mark("analyze")
enricher(a, meta=snap.meta)
d = R.to_dict(snap, a); mark("report to_dict (+ node_timing)")
import json; text = json.dumps(d, indent=2, sort_keys=False); mark("json.dumps")
for (_, w0, c0, g0), (n, w, c, g) in zip(T, T[1:]):
    print(f"{n}\t{w - w0}\t{c - c0}\t{g - g0}")
"""


def _env(pycache: str, extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = pycache
    env.update(extra or {})
    return env


def _run_once(argv, env, cwd: Path = ROOT) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=cwd)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode not in (0, 1, 2):
        sys.exit(f"bench_startup: {' '.join(map(str, argv))} exited {r.returncode}: {r.stderr.decode()[-400:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def measure(cases, n, env) -> dict:
    """Interleaved runs (case 1..k, then again) so that a load burst hits every case alike. A case
    is (name, argv, env or None, [cwd]): `python -m` finds skewscope in its working directory."""
    for _, argv, e, *cwd in cases:
        _run_once(argv, e or env, *cwd)         # warm: bytecode and numba caches
    res = {name: ([], []) for name, *_ in cases}
    for _ in range(n):
        for name, argv, e, *cwd in cases:
            w, c = _run_once(argv, e or env, *cwd)
            res[name][0].append(w)
            res[name][1].append(c)
    return {k: (statistics.median(w), statistics.median(c)) for k, (w, c) in res.items()}


def importtime(argv, env, top=12) -> tuple[float, list[tuple[str, float]]]:
    """`python -X importtime` of one run of argv: the total, and the self time (s) summed per
    package (skewscope by subpackage), largest first."""
    r = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], env=env, cwd=ROOT,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    per: dict[str, float] = {}
    for line in r.stderr.splitlines():
        if not line.startswith("import time:") or line.count("|") != 2:
            continue
        own, _, name = line[len("import time:"):].split("|")
        if not own.strip().isdigit():
            continue
        parts = name.strip().split(".")
        key = ".".join(parts[:2]) if parts[0] == "skewscope" else parts[0]
        per[key] = per.get(key, 0.0) + int(own) / 1e6
    return sum(per.values()), sorted(per.items(), key=lambda kv: -kv[1])[:top]


def parts(py, pcap: Path, env, n: int, cwd: Path) -> list[tuple[str, float, float, float]]:
    """Median (wall, CPU, GC) seconds per step of PARTS_CHILD over n runs (after one warm run)."""
    runs = []
    for i in range(n + 1):
        r = subprocess.run([py, "-c", PARTS_CHILD, str(pcap)], env=env, cwd=cwd, capture_output=True, text=True)
        if r.returncode:
            sys.exit(f"bench_startup: --parts child failed: {r.stderr[-400:]}")
        if i:
            runs.append([ln.split("\t") for ln in r.stdout.splitlines()])
    return [(runs[0][k][0], *(statistics.median(float(run[k][j]) for run in runs) for j in (1, 2, 3)))
            for k in range(len(runs[0]))]


def instructions(argv, env, cwd: Path) -> float:
    """Instructions executed by one run of argv (valgrind --tool=callgrind; nan without valgrind)."""
    vg = shutil.which("valgrind")
    if not vg:
        return float("nan")
    subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)   # warm
    r = subprocess.run([vg, "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv], env=env, cwd=cwd,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for line in r.stderr.splitlines():
        if "Collected :" in line:
            return float(line.split(":")[1])
    return float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=7, help="runs per command (median; default 7)")
    ap.add_argument("--pcap", type=Path, default=SMALL, help=f"the small capture (default {SMALL})")
    ap.add_argument("--full-refresh", action="store_true",
                    help="also time report with numba's own first-load context refresh "
                         "(SKEWSCOPE_NUMBA_FULL_REFRESH=1), to see what skewscope.core.jit saves")
    ap.add_argument("--against", type=Path, metavar="DIR",
                    help="also time another checkout (e.g. /work/main: before a change) in the same run")
    ap.add_argument("--parts", action="store_true", help="report --json small: CPU time per step")
    ap.add_argument("--instructions", action="store_true",
                    help="instructions per command (valgrind callgrind; steady under other load)")
    a = ap.parse_args()
    if not a.pcap.exists():
        sys.exit(f"bench_startup: no capture {a.pcap} (give one with --pcap)")
    py = sys.executable
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as pyc:
        env = _env(pyc)
        cases = [
            ("python -c pass", [py, "-c", "pass"], None),
            ("python -c 'import numpy'", [py, "-c", "import numpy"], None),
            ("python -c 'import numba'", [py, "-c", "import numba"], None),
            ("skewscope --help", [py, "-m", "skewscope", "--help"], None),
            ("skewscope report small", [py, "-m", "skewscope", "report", str(a.pcap)], None),
            ("skewscope report --json small", [py, "-m", "skewscope", "report", "--json", str(a.pcap)], None),
            ("skewscope diagnose small", [py, "-m", "skewscope", "diagnose", str(a.pcap)], None),
        ]
        jit_env = _env(pyc, {"SKEWSCOPE_AOT": "0"})
        cases += [("report --json small, numba JIT", [py, "-m", "skewscope", "report", "--json", str(a.pcap)], jit_env),
                  ("diagnose small, numba JIT", [py, "-m", "skewscope", "diagnose", str(a.pcap)], jit_env)]
        if a.full_refresh:
            cases.append(("report small, numba full refresh", [py, "-m", "skewscope", "report", str(a.pcap)],
                          _env(pyc, {"SKEWSCOPE_NUMBA_FULL_REFRESH": "1"})))
        if a.against:
            other = _env(pyc, {"PYTHONPATH": str(a.against.resolve())})
            cases += [(f"{label}, {a.against.name}", argv, other, a.against.resolve()) for label, argv in (
                ("skewscope --help", [py, "-m", "skewscope", "--help"]),
                ("report --json small", [py, "-m", "skewscope", "report", "--json", str(a.pcap)]),
                ("diagnose small", [py, "-m", "skewscope", "diagnose", str(a.pcap)]))]
        res = measure(cases, a.n, env)
        base_w, base_c = res["python -c pass"]
        np_w, np_c = res["python -c 'import numpy'"]
        ok, why = aot.status()
        print(f"AOT kernel module: {why}" + ("" if ok else "  (the report rows run under numba's JIT)"))
        print(f"startup, median of {a.n} runs (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs); "
              f"small capture: {a.pcap.name}")
        print(f"{'command':36s} {'wall s':>7s} {'cpu s':>7s} {'cpu/pass':>9s} {'cpu/numpy':>10s} {'wall/numpy':>11s}")
        for name, (w, c) in res.items():
            print(f"{name:36s} {w:7.3f} {c:7.3f} {c / base_c:8.1f}x {c / np_c:9.2f}x {w / np_w:10.2f}x")
        if a.parts:
            print(f"\nreport --json small, step by step (median of {a.n} runs, in the command's order; "
                  f"gc = the collector's time within the step):")
            rows = parts(py, a.pcap, env, a.n, ROOT)
            other = []
            if a.against:
                other = parts(py, a.pcap, _env(pyc, {"PYTHONPATH": str(a.against.resolve())}), a.n,
                              a.against.resolve())
                print(f"  ({a.against.name}: the same steps in that checkout, CPU and gc ms)")
            head = f"  {'step':46s} {'wall ms':>8s} {'cpu ms':>7s} {'gc ms':>6s}"
            print(head + (f" {'cpu ms':>7s} {'gc ms':>6s}  <- {a.against.name}" if other else ""))
            for k, (name, w, c, g) in enumerate(rows):
                o = other[k] if k < len(other) and other[k][0] == name else None
                print(f"  {name:46s} {w * 1e3:8.1f} {c * 1e3:7.1f} {g * 1e3:6.1f}"
                      + (f" {o[2] * 1e3:7.1f} {o[3] * 1e3:6.1f}" if o else ""))
            tot = [sum(r[j] for r in rows) * 1e3 for j in (1, 2, 3)]
            print(f"  {'sum (+ the interpreter: python -c pass)':46s} {tot[0]:8.1f} {tot[1]:7.1f} {tot[2]:6.1f}"
                  + (f" {sum(r[2] for r in other) * 1e3:7.1f} {sum(r[3] for r in other) * 1e3:6.1f}" if other else ""))
        if a.instructions:
            one = _env(pyc, {"OPENBLAS_NUM_THREADS": "1"})
            rows = [("python -c pass", [py, "-c", "pass"], one, ROOT),
                    ("python -c 'import numpy'", [py, "-c", "import numpy"], one, ROOT),
                    ("skewscope --help", [py, "-m", "skewscope", "--help"], one, ROOT),
                    ("skewscope report --json small", [py, "-m", "skewscope", "report", "--json", str(a.pcap)],
                     one, ROOT),
                    ("skewscope diagnose small", [py, "-m", "skewscope", "diagnose", str(a.pcap)], one, ROOT)]
            if a.against:
                one_b = dict(one, PYTHONPATH=str(a.against.resolve()))
                rows += [(f"{label}, {a.against.name}", argv, one_b, a.against.resolve())
                         for label, argv, _, _ in rows[2:]]
            print("\ninstructions executed, one run each (valgrind callgrind; OpenBLAS on one thread everywhere):")
            irs = [(label, instructions(argv, e, cwd)) for label, argv, e, cwd in rows]
            np_ir = irs[1][1]
            for label, ir in irs:
                print(f"  {label:46s} {ir / 1e6:8.1f} M  {ir / np_ir:5.2f}x numpy")
        for label, argv in (("skewscope --help", [py, "-m", "skewscope", "--help"]),
                            ("skewscope report small", [py, "-m", "skewscope", "report", str(a.pcap)])):
            total, rows = importtime(argv, env)
            print(f"\nimports of {label}: {total:.3f} s in one run; self time per package:")
            for name, s in rows:
                print(f"  {name:34s} {s:6.3f}  {s / total:5.1%}")


if __name__ == "__main__":
    main()
