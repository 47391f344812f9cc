#!/usr/bin/env python3
"""Onset sweep: pathologies that begin (since_ms) or end (until_ms) mid-capture, at node
counts and times the tests do not use; each capture goes through the offline parser and the
analysis, and the finding's `since` / `until` are checked against the generator's truth
(since_ns / until_ns). One line per variant:

    OK    the finding, since within SINCE_TOL periods after the truth's onset (never more
          than 0.1 ms before it), until null when the pathology holds to the end, else
          between UNTIL_TOL periods before the truth's end and 0.1 ms after it (the last
          affected observation ends before the pathology's configured end when no traffic
          runs in between)
    BAD   otherwise (MISSED: no finding of the kind on the entity)

with the offsets in periods (iterations / tokens / micro-batch rounds), then the counts.

    .venv/bin/python tools/sweep_onset.py [--filter TEXT] [--seeds 1,2]

A developer's tool, not a test (tests/unit/test_onset.py has the fixed cases); ~1 min on 2
vCPUs."""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from skewscope import gen as skewgen  # noqa: E402
from skewscope.analysis import analyze  # noqa: E402
from skewscope.sources.offline import parse_file  # noqa: E402

SINCE_TOL = 1.0
UNTIL_TOL = 1.0
A2A = {"kind": "all_to_all", "bytes_per_peer": "128KiB", "channels": 1, "combine": True}
RING = {"kind": "ring_allreduce", "bytes": "8MiB", "channels": 2}


def cases():
    """(name, scenario, finding kind, the blamed IP or None, period ms)."""
    for n in (4, 8, 12):
        for since, until in ((15, None), (None, 25), (10, 30)):
            p = {"kind": "hot_expert", "node": 1, "factor": 3.0}
            if since is not None:
                p["since_ms"] = since
            if until is not None:
                p["until_ms"] = until
            yield (f"hot_expert a2a n={n} [{since}, {until})", {"nodes": n, "iterations": 8, "period_ms": 5.0,
                   "workloads": [dict(A2A)], "pathologies": [p]}, "hot_destination", "10.0.0.2", 5.0)
    for n in (4, 8):
        yield (f"congestion ring n={n} [14, -)", {"nodes": n, "iterations": 8, "period_ms": 4.0, "workloads": [dict(RING)],
               "pathologies": [{"kind": "congestion", "into": 1, "ce_fraction": 0.2, "rate_factor": 0.7, "since_ms": 14}]},
               "ecn_congestion", "10.0.0.2", 4.0)
        yield (f"slow_link ring n={n} [16, 40)", {"nodes": n, "iterations": 8, "period_ms": 8.0, "workloads": [dict(RING)],
               "pathologies": [{"kind": "slow_link", "node": 1, "mode": "slow", "speed_factor": 0.3, "since_ms": 16,
                                "until_ms": 40}]}, "slow_link", "10.0.0.2", 8.0)
        yield (f"straggler (rate) ring n={n} [24, -)", {"nodes": n, "iterations": 8, "period_ms": 6.0,
               "workloads": [dict(RING)], "pathologies": [{"kind": "straggler", "node": 2, "rate_factor": 0.5,
                                                           "start_lag_us": 0, "since_ms": 24}]},
               "ring_straggler", "10.0.0.3", 6.0)
        yield (f"hot_destination EP decode n={n} [10, -)", {"nodes": n, "workloads": [
               {"kind": "decode_ep", "layers": 4, "tokens": 12, "bytes_per_dest": "2KiB", "compute_gap_us": 2000}],
               "pathologies": [{"kind": "hot_destination", "node": 1, "factor": 3.0, "since_ms": 10}]},
               "hot_destination", "10.0.0.2", 2.2)
    yield ("straggler tree n=8 [18, -)", {"nodes": 8, "iterations": 6, "period_ms": 6.0,
           "workloads": [{"kind": "tree_allreduce", "bytes": "4MiB", "channels": 2}],
           "pathologies": [{"kind": "straggler", "node": 5, "rate_factor": 0.4, "since_ms": 18}]}, "straggler", "10.0.0.6", 6.0)
    yield ("pipeline bubble [36, -)", {"nodes": 4, "iterations": 6, "period_ms": 12.0,
           "workloads": [{"kind": "p2p_pipeline", "activation_bytes": "1MiB", "microbatches": 6}],
           "pathologies": [{"kind": "pipeline_bubble", "stage": 2, "compute_factor": 2.5, "since_ms": 36}]},
           "pipeline_bubbles", None, 12.0)
    yield ("loss ring n=4 [8, -)", {"nodes": 4, "iterations": 4, "period_ms": 4.0, "workloads": [dict(RING)],
           "pathologies": [{"kind": "loss", "pairs": [[1, 2]], "count": 6, "since_ms": 8}]}, "packet_loss", None, 4.0)


def judge(truth, snap, an, kind, ip, per_ms):
    """(ok, text)."""
    p = truth["pathologies"][0]
    fs = [f for f in an["findings"] if f["kind"] == kind and (ip is None or f["entities"]["ips"][0] == ip)]
    if not fs:
        return False, "MISSED"
    f = fs[0]
    per = per_ms * 1e6
    since = f["since"] * 1e9 if f["since"] is not None else None
    ok = since is not None
    parts = []
    if since is not None:
        ref = p["since_ns"] if p.get("since_ns") is not None else snap.meta["first_ts"]
        d = (since - ref) / per
        ok &= -0.1e6 / per <= d <= SINCE_TOL
        parts.append(f"since {d:+.2f} periods")
    if p.get("until_ns") is None:
        ok &= f["until"] is None
        parts.append("until null" if f["until"] is None else "until set")
    elif f["until"] is None:
        ok = False
        parts.append("until null")
    else:
        d = (f["until"] * 1e9 - p["until_ns"]) / per
        ok &= -UNTIL_TOL <= d <= 0.1e6 / per
        parts.append(f"until {d:+.2f} periods")
    return ok, ", ".join(parts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--filter", default="")
    ap.add_argument("--seeds", default="1,2")
    a = ap.parse_args()
    seeds = [int(x) for x in a.seeds.split(",") if x]
    good = bad = 0
    with tempfile.TemporaryDirectory(prefix="skewscope-onset-") as d:
        for name, sc, kind, ip, per in cases():
            if a.filter not in name:
                continue
            for seed in seeds:
                out = os.path.join(d, "x.pcap")
                cap = skewgen.write(sc, out, seed=seed, snaplen=128)
                snap = parse_file(out)
                ok, text = judge(cap.truth, snap, analyze(snap), kind, ip, per)
                good += ok
                bad += not ok
                print(f"{'OK ' if ok else 'BAD'}  {name} seed {seed}: {kind} {text}", flush=True)
    print(f"{good} OK, {bad} BAD")
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
