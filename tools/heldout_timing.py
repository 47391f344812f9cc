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
import zlib
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
    # the compute gap grows with the lag, so that a token's busy part stays below it (vary()
    # puts some variants back to the fixed gap: lags as long as the gap)
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


def with_onset(sc, healthy_truth, onset, mid=False):
    """The pathology active from the middle token (iteration) on ("since"), or up to it
    ("until"): the boundary 1 us before that token's start in the healthy run (the run with
    the lag is the same up to its onset), or (mid) 40 % into that token."""
    if onset is None or not sc.get("pathologies"):
        return sc
    g = healthy_truth["groups"][0]["details"]
    starts = g.get("token_starts_ns") or g.get("iteration_starts_ns")
    ends = g.get("token_ends_ns") or [s + b for s, b in zip(starts, g.get("iteration_busy_ns") or [0] * len(starts))]
    k = len(starts) // 2
    t = starts[k] + 0.4 * (ends[k] - starts[k]) if mid else starts[k] - 1000
    sc = copy.deepcopy(sc)
    sc["pathologies"][0]["since_ms" if onset == "since" else "until_ms"] = round(t / 1e6, 6)
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


def variation(c) -> dict:
    """The case's other held-out factors, fixed by the case (crc32 of its key): IB MTU, IP
    version, QPs per connection (training rings), compute-gap jitter (TP decode)."""
    r = random.Random(zlib.crc32(repr(c).encode()))
    return {"mtu": r.choice((1024, 2048, 4096)), "ip_version": r.choice((4, 6)),
            "qps": r.choice((1, 2)), "jitter": r.choice((0.0, 0.05)), "fixed_gap": r.random() < 0.5,
            "onset_mid": r.random() < 0.5}


def vary(sc, extra):
    sc["mtu"] = extra["mtu"]
    sc["ip_version"] = extra["ip_version"]
    w = sc["workloads"][0]
    if w["kind"] == "ring_allreduce":
        w["qps"] = extra["qps"]
    else:
        if extra["jitter"]:
            w["jitter"] = extra["jitter"]
        if extra["fixed_gap"]:
            w["compute_gap_us"] = 1500.0


def tags(sc) -> str:
    w = sc["workloads"][0]
    return f" mtu{sc['mtu']} ipv{sc['ip_version']}" + (f" qps{w['qps']}" if "qps" in w else "") + (
        f" jitter{w['jitter']:g}" if w.get("jitter") else "") + (
        f" gap{w['compute_gap_us']:g}us" if "compute_gap_us" in w else "")


#: lags below the detectors' documented floor (slow_tp_shard.min_lag_s, ring_straggler.min_step_lag_s:
#: the timestamp resolution of common captures / one packet) are shown, not counted
FLOOR_US = 1.0


def build(fam, n, sync, lag_x, per, ch, onset, seed):
    """(name, scenario, lag_us) of a variant, the onset resolved on the healthy run's token
    starts."""
    f = tp_scenario if fam == "tp" else ring_scenario
    kw = {"pieces": 2} if fam == "ring" and per == "send" and ch == 1 else {}
    sc, lag_us, step, healthy = f(n, sync, lag_x, per, ch, **kw)
    extra = variation((fam, n, sync, lag_x, per, ch, onset))
    for x in (sc, healthy):
        vary(x, extra)
    if onset:
        sc = with_onset(sc, skewgen.generate(healthy, seed=seed).truth, onset, mid=extra["onset_mid"])
    name = f"{fam} n{n} {sync} lag{lag_x:g}x({lag_us:g}us) per-{per} ch{ch}" + (
        f" {onset}{'-mid' if extra['onset_mid'] else ''}" if onset else "") + tags(sc)
    return name, sc, lag_us


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=120, help="variants with a slow member (sampled from the crossed grid)")
    ap.add_argument("--seeds", default="3", help="generator seeds, comma-separated")
    ap.add_argument("--filter", default="")
    ap.add_argument("--grid-seed", type=int, default=7, help="the sample of the crossed grid")
    ap.add_argument("--no-onset-check", action="store_true",
                    help="judge the naming only, not since/until (an analysis without onsets)")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",") if s]
    cases, healthy = grid(args.n, args.grid_seed)
    tab = collections.defaultdict(lambda: [0, 0])
    bad = 0
    known = 0
    for seed in seeds:
        for c in cases:
            name, sc, lag_us = build(*c, seed)
            if args.filter not in name:
                continue
            try:
                ok, why = judge(*analyse(sc, seed), onset_check=not args.no_onset_check)
            except Exception as e:          # a crash is a finding of the sweep
                ok, why = False, f"ERR {type(e).__name__}: {e}"
            if lag_us < FLOOR_US:
                known += 1
                print(f"{'OK ' if ok else 'KNOWN'} {name} seed={seed} (below the {FLOOR_US:g} us floor) {why}".rstrip(),
                      flush=True)
                continue
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
            vary(h, variation((fam, n, sync, ch)))
            name = f"{fam} n{n} {sync} ch{ch} healthy" + tags(h)
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
    print(f"bad: {bad}, below the floor (not counted): {known}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
