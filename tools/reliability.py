#!/usr/bin/env python3
"""Reliability and safety figures for skewscope (issue 8): the bigger versions of the tests in
tests/kernel/test_fuzz_kernel.py and tests/integration/test_reliability_*.py, printed as the
figures kept in docs/reliability.md.

    .venv/bin/python tools/reliability.py            # everything (root; ~5 min on 2 cores)
    .venv/bin/python tools/reliability.py fuzz load  # a subset: fuzz, load, accounting, map

The helpers those tests share live in the package: skewscope.testbed.netns (the veth pair)
and skewscope.testbed.traffic (frames, the sendmmsg blaster, TCP, counters, the observer).
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from skewscope.testbed.traffic import (
    exact_accounting,
    map_pressure,
    pair,
    roce_flood_with_tcp,
)

ROOT = Path(__file__).resolve().parents[1]


# ---- the figures -------------------------------------------------------------------------------
def fig_fuzz(n: int) -> dict:
    sys.path.insert(0, str(ROOT / "tests"))
    import fuzzcorpus as fc

    from skewscope.bpf.loader import Config, Dataplane
    from skewscope.core import layout as L
    t = time.monotonic()
    c = fc.make_corpus(n, seed=8)
    out = {"frames": n, "corpus_seconds": time.monotonic() - t, "kinds": c.kind_counts()}
    for entry in ("xdp", "tc"):
        dp = Dataplane(Config(max_flows=1 << 17, ev_per_cpu=1 << 10))
        try:
            r = fc.run_kernel(dp, entry, c)
            g = dp.read_globals()
            f = dp.read_flows()
        finally:
            dp.close()
        ran = r.verdict >= 0
        cats = np.bincount(r.category[ran], minlength=L.G_NCAT)
        out[entry] = {
            "seconds": r.seconds, "ran": int(ran.sum()), "refused_by_test_run": int((~ran).sum()),
            "verdicts": {int(v): int(k) for v, k in zip(*np.unique(r.verdict[ran], return_counts=True))},
            "one_category_each": bool(r.one_category[ran].all()),
            "categories_sum_eq_frames": int(g[:L.G_NCAT].sum()) == int(g[L.G_FRAMES]) == int(ran.sum()),
            "flows_created_by_not_accounted": int(r.delta[ran & (r.category != 0), L.G_FLOWS_CREATED].sum()),
            "flows_with_payload_gt_bytes": int((f["payload_bytes"] > f["bytes"]).sum()),
            "categories": {L.CATEGORY_NAMES[i]: int(cats[i]) for i in range(L.G_NCAT)},
        }
        if entry == "xdp":
            xcat = r.category
        else:
            out["tc"]["disagree_with_xdp"] = int((ran & (r.category != xcat)).sum())
    try:
        import tempfile

        from skewscope.sources import offline
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "fz.pcap")
            c.write_pcap(p)
            t = time.monotonic()
            rows = offline.dissect(p)
            out["offline"] = {"seconds": time.monotonic() - t,
                              "disagree_with_xdp": int((rows["category"].astype(np.int64) != xcat).sum())}
    except ImportError:
        out["offline"] = None
    return out


def fig_load(nframes: int, tcp_bytes: int, rounds: int = 3) -> dict:
    modes = (None, "tc", "xdp-generic", "xdp-trivial", "xdp")
    res = {m or "none": [] for m in modes}
    with pair("load") as fab:
        for _ in range(rounds):
            for m in modes:
                res[m or "none"].append(roce_flood_with_tcp(fab, m, nframes, tcp_bytes))
    summ = {}
    for m, runs in res.items():
        summ[m] = {"roce_lost": sum(r["roce_lost"] for r in runs), "roce_sent": sum(r["roce_sent"] for r in runs),
                   "roce_pps_median": float(np.median([r["roce_pps"] for r in runs])),
                   "tcp_gbps_median": float(np.median([r["tcp"]["gbps"] for r in runs])),
                   "tcp_intact": all(r["tcp"]["intact"] for r in runs),
                   "link_drops": sum(r["link_drops"] for r in runs),
                   "program_saw_all_roce": all(r["seen"] is None or r["seen"]["accounted"] == r["roce_sent"]
                                               for r in runs)}
    for m in ("tc", "xdp-generic", "xdp-trivial", "xdp"):
        summ[m]["tcp_ratio_vs_none"] = summ[m]["tcp_gbps_median"] / summ["none"]["tcp_gbps_median"]
        summ[m]["roce_pps_ratio_vs_none"] = summ[m]["roce_pps_median"] / summ["none"]["roce_pps_median"]
    summ["xdp"]["tcp_ratio_vs_trivial_xdp"] = summ["xdp"]["tcp_gbps_median"] / summ["xdp-trivial"]["tcp_gbps_median"]
    return summ


def fig_accounting(nframes: int) -> dict:
    out = {}
    with pair("acct") as fab:
        for m in ("xdp", "tc"):
            out[m] = exact_accounting(fab, m, 256, max(1, nframes // 256))
    return out


def main(argv=None) -> int:
    argv = argv if argv is not None else sys.argv[1:]
    want = set(argv) or {"fuzz", "load", "accounting", "map"}
    if os.geteuid() != 0:
        print("tools/reliability.py needs root (BPF_PROG_TEST_RUN, namespaces, attach)", file=sys.stderr)
        return 4
    figs = {}
    if "fuzz" in want:
        figs["fuzz"] = fig_fuzz(int(os.environ.get("SKEWSCOPE_FUZZ_FRAMES", "2000000")))
        print(json.dumps({"fuzz": figs["fuzz"]}, indent=1), flush=True)
    if "load" in want:
        figs["load"] = fig_load(int(os.environ.get("SKEWSCOPE_LOAD_FRAMES", "500000")), 512 << 20)
        print(json.dumps({"load": figs["load"]}, indent=1), flush=True)
    if "accounting" in want:
        figs["accounting"] = fig_accounting(int(os.environ.get("SKEWSCOPE_ACCT_FRAMES", "5000000")))
        print(json.dumps({"accounting": figs["accounting"]}, indent=1), flush=True)
    if "map" in want:
        figs["map"] = map_pressure()
        print(json.dumps({"map": figs["map"]}, indent=1), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
