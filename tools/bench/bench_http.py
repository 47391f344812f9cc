#!/usr/bin/env python3
"""The exporter's /metrics latency while the background analysis of /v1/* runs, against the
same server with no analysis running, in the same run (outputs/http.py: the analysis is a
nice-10 thread; it shares the GIL with the HTTP threads).

    .venv/bin/python tools/bench/bench_http.py [--preset demo-mix] [--requests 200]

One process: a generator capture through the offline parser, the exporter's StaticSource
registry behind outputs.http.Server on 127.0.0.1 (ephemeral port), urllib GET /metrics
--requests times (1) idle, (2) while analyses of the same Snapshot run back to back.
Prints p50/p99 latency of each and the ratios (busy / idle). No root.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from skewscope import gen as skewgen  # noqa: E402
from skewscope.cli.common import load_source  # noqa: E402
from skewscope.live.runner import AnalysisRunner, load_analyze  # noqa: E402
from skewscope.outputs import exporter as E  # noqa: E402
from skewscope.outputs import expose as X  # noqa: E402
from skewscope.outputs import http as H  # noqa: E402


def timed_gets(url: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        with urllib.request.urlopen(url, timeout=60) as r:
            r.read()
        out.append(time.perf_counter() - t0)
    return out


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="demo-mix")
    ap.add_argument("--requests", type=int, default=200)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ssbench-http-") as d:
        p = os.path.join(d, "x.pcap")
        skewgen.write(a.preset, p, seed=0)
        snap = load_source(p)
    src = E.StaticSource(snap, "bench", top_k=10, max_peers=4096)
    reg = X.make_registry(X.SkewscopeCollector(src.get))
    an = H.Analyst("bench", "file", AnalysisRunner(load_analyze(), nice=H.ANALYSIS_NICE))
    an.start_once(snap).join()                     # numba compiled, caches warm
    srv = H.Server("127.0.0.1", 0, reg, analyst=an)
    srv.start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/metrics"
    timed_gets(url, 10)
    idle = timed_gets(url, a.requests)
    stop = threading.Event()
    runs = [0]

    def churn():
        while not stop.is_set():
            an.start_once(snap).join()
            runs[0] += 1
    t = threading.Thread(target=churn, daemon=True)
    t.start()
    time.sleep(0.2)
    busy = timed_gets(url, a.requests)
    stop.set()
    t.join(timeout=120)
    srv.stop()
    print(f"preset {a.preset}: {len(snap.flows)} flows, {len(snap.events)} message records; "
          f"analysis {an.result()['analysis_seconds'] * 1e3:.0f} ms, {runs[0]} analyses during the busy run")
    print(f"{'':10s} {'p50 ms':>8s} {'p99 ms':>8s} {'mean ms':>8s}")
    for name, xs in (("idle", idle), ("analysing", busy)):
        print(f"{name:10s} {pct(xs, .5) * 1e3:8.2f} {pct(xs, .99) * 1e3:8.2f} {statistics.mean(xs) * 1e3:8.2f}")
    print(f"ratio busy/idle: p50 {pct(busy, .5) / pct(idle, .5):.2f}x, p99 {pct(busy, .99) / pct(idle, .99):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
