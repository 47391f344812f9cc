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

    .venv/bin/python tools/bench/bench_startup.py [-n 7] [--pcap FILE]
"""
from __future__ import annotations

import argparse
import os
import resource
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


def _env(pycache: str, extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = pycache
    env.update(extra or {})
    return env


def _run_once(argv, env) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode not in (0, 1, 2):
        sys.exit(f"bench_startup: {' '.join(map(str, argv))} exited {r.returncode}: {r.stderr.decode()[-400:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def measure(cases, n, env) -> dict:
    """Interleaved runs (case 1..k, then again) so that a load burst hits every case alike."""
    for _, argv, e in cases:
        _run_once(argv, e or env)               # warm: bytecode and numba caches
    res = {name: ([], []) for name, _, _ in cases}
    for _ in range(n):
        for name, argv, e in cases:
            w, c = _run_once(argv, e or env)
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=7, help="runs per command (median; default 7)")
    ap.add_argument("--pcap", type=Path, default=SMALL, help=f"the small capture (default {SMALL})")
    ap.add_argument("--full-refresh", action="store_true",
                    help="also time report with numba's own first-load context refresh "
                         "(SKEWSCOPE_NUMBA_FULL_REFRESH=1), to see what skewscope.core.jit saves")
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
        for label, argv in (("skewscope --help", [py, "-m", "skewscope", "--help"]),
                            ("skewscope report small", [py, "-m", "skewscope", "report", str(a.pcap)])):
            total, rows = importtime(argv, env)
            print(f"\nimports of {label}: {total:.3f} s in one run; self time per package:")
            for name, s in rows:
                print(f"  {name:34s} {s:6.3f}  {s / total:5.1%}")


if __name__ == "__main__":
    main()
