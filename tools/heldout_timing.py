#!/usr/bin/env python3
"""Held-out timing variants (issue 25, classes 2 and 3): a slow member of a ring (TP decode
shard, training-ring straggler) under both step-timing models (data flow, barrier), at node
counts 2-16, lags 0.3x-100x the step, lag on the first send of a step or on every send,
1/2/4 channels, from the start or with an onset (since) or a recovery (until) mid-capture;
and the same rings healthy. Each capture goes through the offline parser and the analysis
on the all-seeing (mirror) vantage; a variant passes when a warning names the truth's
member (ring_straggler / slow_tp_shard / straggler, that member first) with `since` /
`until` within one token (iteration) of the truth's, and a healthy variant passes with no
warning at all.

    .venv/bin/python tools/heldout_timing.py [--n 120] [--seeds 3,4] [--filter TEXT]

The lag is given in steps: one step = the on-wire time of one member's message of a ring
step plus the hop (`hop_us`); the truth is the generator's (skewgen), never the analysis.
"""
from __future__ import annotations

import argparse
import collections
import copy
import itertools
import os
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from skewscope import gen as skewgen  # noqa: E402
from skewscope.analysis import analyze  # noqa: E402
from skewscope.gen.engine import EPOCH_NS  # noqa: E402
from skewscope.sources.offline import parse_file  # noqa: E402

KINDS = {"slow_tp_shard": {"slow_tp_shard", "ring_straggler", "straggler"},
         "straggler": {"ring_straggler", "straggler", "slow_tp_shard"}}
NODES = (2, 3, 4, 6, 8, 12, 16)
LAGS = (0.3, 1.0, 3.0, 10.0, 100.0)
SYNCS = ("dataflow", "barrier")
PERS = ("step", "send")
ONSETS = (None, "since", "until")


def _wire_ns(nbytes, gbps=100.0, eff=0.97, mtu=4096, share=1.0):
    n = max(1, -(-nbytes // mtu))
    return (nbytes + n * 94 + 20) * 8 / (gbps * 1e9 * eff * share) * 1e9


def tp_scenario(n, sync, lag_x, per, ch, onset=None, node=None, tokens=6, layers=4, hidden=8192, batch=4,
                layer_compute_us=40.0):
    """A decode_tp ring of n members with (lag_x > 0) a slow_tp_shard. Returns (scenario,
    lag_us, step_ns, healthy scenario)."""
    ar = hidden * batch * 2
    msg = -(-max(1, ar // ch // n) // 8) * 16              # LL: 16-byte lines with 8 data bytes
    pieces = -(-max(1, ar // ch // n) // (32 * 1024))
    step = _wire_ns(min(msg, 65536), share=1.0 / ch) * pieces + 2000.0
    lag_us = round(lag_x * step / 1e3, 3)
    w = {"kind": "decode_tp", "layers": layers, "allreduces_per_layer": 2, "tokens": tokens, "hidden": hidden,
         "batch": batch, "compute_gap_us": 1500, "layer_compute_us": layer_compute_us, "channels": ch,
         "step_sync": sync}
    # the compute gap grows with the lag, so that a token's busy part stays below it
    busy = layers * 2 * 2 * (n - 1) * (step + lag_us * 1e3 * (pieces if per == "send" else 1)) / 1e3
    w["compute_gap_us"] = max(1500.0, round(0.5 * busy))
    healthy = {"nodes": n, "workloads": [dict(w)]}
    sc = copy.deepcopy(healthy)
    if lag_x:
        sc["pathologies"] = [{"kind": "slow_tp_shard", "node": n // 2 if node is None else node, "lag_us": lag_us,
                              "lag_per": per}]
    return sc, lag_us, step, healthy


def ring_scenario(n, sync, lag_x, per, ch, onset=None, node=None, iterations=None, pieces=1):
    """A training ring_allreduce of n members, ch channels, with (lag_x > 0) a straggler
    adding lag_x steps to the first send of every step or to every send (rate unchanged).
    One step per channel: one 64 KiB SIMPLE message, or `pieces` (> 1) 64 KiB LL messages
    (32 KiB of data each)."""
    if iterations is None:      # >= 8 steps (STEP_THRESHOLDS min_steps) in half of the iterations
        iterations = max(6, 2 * -(-8 // (2 * (n - 1))))
    if pieces > 1:
        proto, data, msg = "ll", 32 * 1024 * pieces, 65536
    else:
        proto, data, msg = "simple", 65536, 65536
    nbytes = data * n * ch
    step = _wire_ns(msg, share=1.0 / ch) * pieces + 2000.0
    lag_us = round(lag_x * step / 1e3, 3)
    busy = 2 * (n - 1) * (step + lag_us * 1e3 * (pieces if per == "send" else 1))
    period_ms = max(3.0, round(2.0 * busy / 1e6 + 1.0, 3))
    w = {"kind": "ring_allreduce", "bytes": nbytes, "protocol": proto, "channels": ch, "step_sync": sync}
    healthy = {"nodes": n, "iterations": iterations, "period_ms": period_ms, "jitter": 0.01, "workloads": [dict(w)]}
    sc = copy.deepcopy(healthy)
    if lag_x:
        sc["pathologies"] = [{"kind": "straggler", "node": n // 2 if node is None else node, "rate_factor": 1.0,
                              "start_lag_us": lag_us, "lag_per": per}]
    return sc, lag_us, step, healthy


def with_onset(sc, healthy_truth, onset):
    """The pathology active from the middle token (iteration) on ("since"), or up to it
    ("until"): the boundary 1 us before that token's start in the healthy run (the run with
    the lag is the same up to its onset)."""
    if onset is None or not sc.get("pathologies"):
        return sc
    g = healthy_truth["groups"][0]["details"]
    starts = g.get("token_starts_ns") or g.get("iteration_starts_ns")
    k = len(starts) // 2
    t_ms = (starts[k] - 1000) / 1e6
    sc = copy.deepcopy(sc)
    sc["pathologies"][0]["since_ms" if onset == "since" else "until_ms"] = round(t_ms, 6)
    return sc


def analyse(sc, seed):
    cap = skewgen.generate(sc, seed=seed)
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "x.pcap")
        cap.write_pcap(p, snaplen=128)
        an = analyze(parse_file(p))
    return cap, an


def _since(f, key):
    """A finding's since/until (s): the top-level field when the output has it, else the
    evidence's since_s / until_s; (present, value)."""
    if key in f:
        return True, f[key]
    ev = f.get("evidence") or {}
    if key + "_s" in ev:
        return True, ev[key + "_s"]
    return False, None


def judge(cap, an, onset_check=True) -> tuple[bool, str]:
    fs = [f for f in an["findings"] if f["severity"] in ("warning", "critical")]
    pats = cap.truth["pathologies"]
    if not pats:
        return (not fs), ("" if not fs else f"healthy, but {[(f['kind'], f['entities']['ips'][:2]) for f in fs]}")
    p = pats[0]
    ip = p["entities"]["ips"][0]
    hits = [f for f in fs if f["kind"] in KINDS[p["kind"]]]
    named = [f for f in hits if f["entities"]["ips"][:1] == [ip]]
    if not named:
        return False, (f"missing {p['kind']} {ip}" if not hits else
                       f"want {ip}, got {[(f['kind'], f['entities']['ips'][:2]) for f in hits]}")
    wrong = [f for f in fs if f not in named and f["kind"] in KINDS[p["kind"]]]
    if wrong:
        return False, f"also blames {[(f['kind'], f['entities']['ips'][:2]) for f in wrong]}"
    if not onset_check or ("since_ns" not in p and "until_ns" not in p):
        return True, ""
    g = cap.truth["groups"][0]["details"]
    starts = g.get("token_starts_ns") or g.get("iteration_starts_ns")
    tol = float(max(starts[1:] - __import__("numpy").asarray(starts[:-1]))) if len(starts) > 1 else 1e6
    f = named[0]
    why = []
    for key in ("since", "until"):
        want = p.get(key + "_ns")
        has, got = _since(f, key)
        if not has:
            why.append(f"no {key}")
            continue
        if want is None:
            if got is not None and key == "since" and got * 1e9 > cap.truth["flows"][0]["first_ts"] + tol:
                why.append(f"{key} {got:.6f}, want the start")
            if got is not None and key == "until":
                why.append(f"until {got:.6f}, want null (still holding)")
            continue
        if got is None or abs(got * 1e9 - want) > tol:
            why.append(f"{key} {got}, want {(want) / 1e9:.6f} +- {tol / 1e9:.6f}")
    return not why, "; ".join(why)


def grid(n_cases=120, seed=7):
    """A crossed design sampled at random (fixed seed): every (family, nodes, sync, lag,
    per, channels, onset) level appears; plus the healthy ring of each (family, nodes,
    sync, channels)."""
    rng = random.Random(seed)
    full = list(itertools.product(("tp", "ring"), NODES, SYNCS, LAGS, PERS, (1, 2, 4), ONSETS))
    rng.shuffle(full)
    out, seen = [], collections.Counter()
    # cover every level of every factor first, then fill at random
    for c in full:
        key = [(i, v) for i, v in enumerate(c)]
        if any(seen[k] < 2 for k in key) or len(out) < n_cases:
            out.append(c)
            for k in key:
                seen[k] += 1
        if len(out) >= n_cases and all(v >= 2 for v in seen.values()):
            break
    healthy = sorted({(fam, n, sync, ch) for fam, n, sync, _, _, ch, _ in out})
    return out, healthy


def build(fam, n, sync, lag_x, per, ch, onset, seed):
    """(name, scenario) of a variant, the onset resolved on the healthy run's token starts."""
    f = tp_scenario if fam == "tp" else ring_scenario
    kw = {"pieces": 2} if fam == "ring" and per == "send" and ch == 1 else {}
    sc, lag_us, step, healthy = f(n, sync, lag_x, per, ch, **kw)
    if onset:
        sc = with_onset(sc, skewgen.generate(healthy, seed=seed).truth, onset)
    name = f"{fam} n{n} {sync} lag{lag_x:g}x({lag_us:g}us) per-{per} ch{ch}" + (f" {onset}" if onset else "")
    return name, sc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=120, help="variants with a slow member (sampled from the crossed grid)")
    ap.add_argument("--seeds", default="3", help="generator seeds, comma-separated")
    ap.add_argument("--filter", default="")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",") if s]
    cases, healthy = grid(args.n)
    tab = collections.defaultdict(lambda: [0, 0])
    bad = 0
    for seed in seeds:
        for c in cases:
            name, sc = build(*c, seed)
            if args.filter not in name:
                continue
            try:
                ok, why = judge(*analyse(sc, seed))
            except Exception as e:          # a crash is a finding of the sweep
                ok, why = False, f"ERR {type(e).__name__}: {e}"
            fam, n, sync, lag_x, per, ch, onset = c
            for k in (f"{fam}", f"{fam} {sync}", f"{fam} lag{lag_x:g}x", f"{fam} onset={onset}", f"{fam} per-{per}",
                      f"{fam} ch{ch}", f"{fam} n{n}"):
                tab[k][0] += ok
                tab[k][1] += 1
            bad += not ok
            print(f"{'OK ' if ok else 'BAD'} {name} seed={seed} {why}".rstrip(), flush=True)
        for fam, n, sync, ch in healthy:
            f = tp_scenario if fam == "tp" else ring_scenario
            _, _, _, h = f(n, sync, 0, "step", ch)
            name = f"{fam} n{n} {sync} ch{ch} healthy"
            if args.filter not in name:
                continue
            ok, why = judge(*analyse(h, seed))
            tab[f"{fam} healthy quiet"][0] += ok
            tab[f"{fam} healthy quiet"][1] += 1
            bad += not ok
            print(f"{'OK ' if ok else 'BAD'} {name} seed={seed} {why}".rstrip(), flush=True)
    print("\n| variants | passed |\n|---|---:|")
    for k in sorted(tab):
        a, b = tab[k]
        print(f"| {k} | {a}/{b} ({100 * a / b:.0f} %) |")
    print(f"bad: {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
