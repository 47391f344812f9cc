#!/usr/bin/env python3
"""Held-out detection sweep: the generator's presets at node counts, sizes, MTUs, lags,
router layouts and seeds that neither the presets nor the tests use; each capture goes
through the offline parser and the analysis, and its warning/critical findings are checked
against the generator's truth (the injected pathology found, on its entity; a healthy
variant quiet). One line per variant (OK / BAD / KNOWN: a gap marked in cases(), shown
and not counted), then the counts.

    .venv/bin/python tools/sweep_heldout.py [--filter TEXT] [--seeds 3,4]

A developer's tool, not a test: run it after changing a detector or the classification
(~30 s on 2 vCPUs). Variants below the detectors' documented floors are left out (an
incast of < 4 senders, a P/D imbalance a random router would give by chance)."""
from __future__ import annotations

import argparse
import copy
import itertools
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from skewscope import gen as skewgen  # noqa: E402
from skewscope.analysis import analyze  # noqa: E402
from skewscope.gen.presets import PRESETS  # noqa: E402
from skewscope.sources.offline import parse_file  # noqa: E402

#: truth pathology kind -> the finding kinds that report it
FINDS = {"slow_tp_shard": {"slow_tp_shard", "ring_straggler", "straggler"},
         "hot_destination": {"hot_destination", "alltoall_destination_skew"},
         "hot_expert": {"hot_destination", "alltoall_destination_skew"},
         "rotating_straggler": {"rotating_straggler"}, "pd_imbalance": {"pd_imbalance"},
         "kv_transfer_slow": {"kv_transfer_slow"}, "straggler": {"ring_straggler", "straggler"},
         "slow_link": {"slow_link", "ring_straggler", "straggler"}, "incast": {"incast"},
         "congestion": {"ecn_congestion", "cnp_storm"}, "loss": {"packet_loss", "retransmissions", "nak_errors"},
         "pipeline_bubble": {"pipeline_bubbles"}}


def variant(preset, nodes=None, mtu=None, node=None, wl=None, path=None, **top):
    sc = copy.deepcopy(PRESETS[preset])
    sc.pop("description", None)
    if nodes:
        sc["nodes"] = nodes
    if mtu:
        sc["mtu"] = mtu
    if node is not None and sc.get("pathologies"):
        sc["pathologies"][0]["node"] = node
    sc["workloads"][0].update(wl or {})
    if path:
        sc["pathologies"][0].update(path)
    sc.update(top)
    return sc


def blamed(p) -> str | None:
    """The truth's blamed IP: the destination for congestion and incast (their entity list
    is sorted), else the first entity."""
    e = p.get("entities") or {}
    if p["kind"] in ("congestion", "incast") and e.get("flows"):
        return e["flows"][0][1]
    if p["kind"] == "rotating_straggler":
        return None
    return (e.get("ips") or [None])[0]


def check(sc, seed, expect=None) -> tuple[bool, str]:
    """expect: [(finding kinds, blamed IP)] for what the scenario implies but its truth does
    not list as a pathology (an overloaded serving instance is a workload's batch)."""
    cap = skewgen.generate(sc, seed=seed)
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "x.pcap")
        cap.write_pcap(p, snaplen=128)
        an = analyze(parse_file(p))
    fs = [(f["kind"], (f.get("entities") or {}).get("ips", [])) for f in an["findings"]
          if f["severity"] in ("warning", "critical")]
    want = [(FINDS.get(p["kind"], {p["kind"]}), blamed(p), p["kind"]) for p in cap.truth["pathologies"]]
    want += [(set(k), ip, "/".join(sorted(k))) for k, ip in (expect or [])]
    inf = cap.truth.get("inference") or {}
    want += [({k}, None, k) for k in inf.get("expected_kinds") or [] if not any(k in w[0] for w in want)]
    why = []
    for kinds, ip, name in want:
        hits = [f for f in fs if f[0] in kinds]
        if not hits:
            why.append(f"missing {name} {ip or ''}")
        elif ip and not any(h[1][:1] == [ip] for h in hits):
            why.append(f"{name}: want {ip}, got {[h[1][:2] for h in hits]}")
    absent = set((cap.truth.get("inference") or {}).get("absent_kinds") or [])
    wrong = [(k, ips[:2]) for k, ips in fs if k in absent]
    if wrong:
        why.append(f"absent by the truth, but {wrong}")
    if not want and fs:
        why.append(f"healthy, but {[(k, ips[:2]) for k, ips in fs]}")
    return not why, "; ".join(why) + f"  [groups {sorted({c['kind'] for c in an['collectives']})}]"


def _kv_into_decode(dec, pre, into, blk, mtu=None, layers=None, requests=None) -> dict:
    """The prefill-interference preset with the TP decode group on nodes `dec`, prefill
    nodes `pre` sending KV blocks of `blk` into decode nodes `into`."""
    sc = copy.deepcopy(PRESETS["prefill-interference"])
    sc.pop("description", None)
    sc["nodes"] = max(dec + pre + into) + 1
    sc["workloads"][0]["members"] = dec
    sc["workloads"][1].update(prefill=pre, decode=into, block_bytes=blk)
    if mtu:
        sc["mtu"] = mtu
    if layers:
        sc["workloads"][0]["layers"] = layers
    if requests:
        sc["workloads"][1]["requests"] = requests
    return sc


def _random_matrix(n, seed, lo, hi) -> list:
    """Per-pair all-to-all volumes uniform in lo-hi KiB (seeded): size jitter (205-307: 256
    +-20 %) or random imbalance (16-256), no destination favoured -- a healthy variant."""
    import numpy as np
    m = np.random.default_rng(seed).integers(lo, hi + 1, (n, n)) * 1024
    np.fill_diagonal(m, 0)
    return m.tolist()


def cases():
    out = []
    for n, mtu, hid, bat, lag in [(2, 4096, 4096, 1, 15), (3, 1024, 4096, 1, 20), (5, 1024, 8192, 2, 8),
                                  (6, 4096, 8192, 4, 10), (8, 2048, 12288, 1, 50)]:
        out.append((f"tp-slow n{n} mtu{mtu} hidden{hid} batch{bat} lag{lag}us",
                    variant("tp-decode-slow-shard", nodes=n, mtu=mtu, node=n - 1, wl={"hidden": hid, "batch": bat},
                            path={"lag_us": lag})))
        out.append((f"tp-healthy n{n} mtu{mtu} hidden{hid} batch{bat}",
                    variant("tp-decode-healthy", nodes=n, mtu=mtu, wl={"hidden": hid, "batch": bat})))
    for n, gap, layers, apl, lag in [(4, 300, 32, 1, 10), (8, 500, 8, 2, 25), (4, 1000, 24, 2, 5)]:
        out.append((f"tp-slow n{n} gap{gap}us layers{layers}x{apl} lag{lag}us",
                    variant("tp-decode-slow-shard", nodes=n, node=1, path={"lag_us": lag},
                            wl={"compute_gap_us": gap, "layers": layers, "allreduces_per_layer": apl})))
        out.append((f"tp-healthy n{n} gap{gap}us layers{layers}x{apl}",
                    variant("tp-decode-healthy", nodes=n,
                            wl={"compute_gap_us": gap, "layers": layers, "allreduces_per_layer": apl})))
    for n, mtu, b, fac in [(4, 1024, "1KiB", 3.0), (6, 4096, "8KiB", 2.5), (12, 2048, "4KiB", 5.0),
                           (16, 1024, "2KiB", 3.0)]:
        out.append((f"ep-hot n{n} mtu{mtu} {b} x{fac}", variant("ep-decode-hot-expert", nodes=n, mtu=mtu, node=1,
                                                                 wl={"bytes_per_dest": b}, path={"factor": fac})))
        out.append((f"ep-healthy n{n} mtu{mtu} {b}", variant("ep-decode-healthy", nodes=n, mtu=mtu,
                                                              wl={"bytes_per_dest": b})))
    out.append(("ep-drift n12", variant("ep-decode-hot-drift", nodes=12, node=9, path={"drift_to": [3, 7]})))
    for n, mtu, lag in [(4, 1024, 100), (6, 4096, 300), (12, 2048, 150)]:
        out.append((f"ring-rotating n{n} mtu{mtu} lag{lag}us",
                    variant("ring-rotating-straggler", nodes=n, mtu=mtu, path={"lag_us": lag})))
    # P/D: pinned (one-way stars), queued equal-sized requests, other pool sizes
    for pre, dec, blk, req in [([0, 1], [2, 3, 4, 5], "128KiB", 16), ([0, 1, 2, 3, 4, 5], [6, 7, 8], "32KiB", 48),
                               ([0, 1, 2], [3, 4, 5, 6, 7, 8], "512KiB", 16)]:
        n = max(pre + dec) + 1
        wl = {"prefill": pre, "decode": dec, "block_bytes": blk, "block_bytes_max": None, "requests": req}
        tag = f"prefill{len(pre)} decode{len(dec)} {blk} x{req}"
        out.append((f"pd-imbalanced {tag}", variant("pd-imbalanced", nodes=n, node=dec[1], wl=wl)))
        out.append((f"pd-healthy {tag}", variant("pd-healthy", nodes=n, wl=wl)))
        # a link that carries transfers: the generator's round robin sends prefill 1 to decode 1
        out.append((f"pd-slow-link {tag}", variant("pd-slow-link", nodes=n, wl=wl, path={"src": pre[1], "dst": dec[1]})))
    # training
    for n, mtu, b, ch in [(3, 1024, "512KiB", 1), (5, 4096, "8MiB", 2), (16, 2048, "2MiB", 1), (6, 512, "1MiB", 1)]:
        out.append((f"ring-straggler n{n} mtu{mtu} {b} ch{ch}",
                    variant("ring-straggler", nodes=n, mtu=mtu, node=n // 2, wl={"bytes": b, "channels": ch})))
        out.append((f"ring-healthy n{n} mtu{mtu} {b} ch{ch}",
                    variant("ring-healthy", nodes=n, mtu=mtu, wl={"bytes": b, "channels": ch})))
        out.append((f"slow-link n{n} mtu{mtu} {b}", variant("slow-link", nodes=n, mtu=mtu, node=1, wl={"bytes": b})))
    for n, mtu, b in [(4, 1024, "64KiB"), (6, 4096, "1MiB"), (12, 2048, "256KiB")]:
        out.append((f"moe-hot n{n} mtu{mtu} {b}", variant("moe-hot-expert", nodes=n, mtu=mtu, node=n - 1,
                                                           wl={"bytes_per_peer": b})))
        out.append((f"alltoall-healthy n{n} mtu{mtu} {b}", variant("alltoall-healthy", nodes=n, mtu=mtu,
                                                                    wl={"bytes_per_peer": b})))
        out.append((f"congestion n{n} mtu{mtu} {b}", variant("congestion", nodes=n, mtu=mtu, wl={"bytes_per_peer": b},
                                                              path={"into": 1})))
    # a hot destination named by the sources of one collective (issue 25 class 1): no
    # iterations to repeat over, the dispatch alone (no combine phase), IPv6 too
    for n, mtu, fac, it, ipv in [(4, 1024, 4.0, 1, 4), (6, 4096, 2.0, 1, 6), (12, 2048, 2.5, 1, 4),
                                 (5, 4096, 1.5, 3, 6), (16, 1024, 3.0, 1, 6)]:
        out.append((f"a2a-hot n{n} mtu{mtu} x{fac} it{it} v{ipv}",
                    variant("moe-hot-expert", nodes=n, mtu=mtu, node=n - 2, wl={"combine": False},
                            path={"factor": fac}, iterations=it, ip_version=ipv)))
        out.append((f"a2a-jitter n{n} mtu{mtu} it{it} v{ipv}",
                    variant("alltoall-healthy", nodes=n, mtu=mtu, iterations=it, ip_version=ipv,
                            wl={"bytes_per_peer": None, "matrix": _random_matrix(n, n * 7 + it, 205, 307)})))
        out.append((f"a2a-random n{n} mtu{mtu} it{it} v{ipv}",
                    variant("alltoall-healthy", nodes=n, mtu=mtu, iterations=it, ip_version=ipv,
                            wl={"bytes_per_peer": None, "matrix": _random_matrix(n, n * 7 + it, 16, 256)}),
                    None, "rate-based straggler/slow_receiver on random per-pair volumes (rates_and_lags)"))
    for n, mtu in [(3, 1024), (6, 4096)]:
        out.append((f"pipeline-bubbles n{n} mtu{mtu}", variant("pipeline-bubbles", nodes=n, mtu=mtu,
                                                                path={"stage": n - 2})))
        out.append((f"pipeline-healthy n{n} mtu{mtu}", variant("pipeline-healthy", nodes=n, mtu=mtu)))
        out.append((f"loss n{n} mtu{mtu}", variant("loss", nodes=n, mtu=mtu, path={"pairs": [[0, 1]]})))
        out.append((f"incast n{n + 5} mtu{mtu}", variant("incast", nodes=n + 5, mtu=mtu,
                                                          path={"target": 2, "senders": n + 1})))
    # serving instances (TP decode groups on disjoint nodes), one of them overloaded
    for k, m, hot, batch in [(3, 2, 1, 4), (3, 4, 0, 3), (5, 3, 4, 4)]:
        base = dict(PRESETS["tp-decode-instances"]["workloads"][0])
        wls = [dict(base, members=list(range(i * m, (i + 1) * m)), batch=batch if i == hot else 1, start_ms=0.3 * i)
               for i in range(k)]
        sc = {"nodes": k * m, "workloads": wls}
        out.append((f"instances {k}x{m} hot{hot} batch{batch}", sc,
                    [({"instance_load_imbalance"}, f"10.0.0.{hot * m + 1}")]))
        out.append((f"instances {k}x{m} healthy", {"nodes": k * m, "workloads": [dict(w, batch=1) for w in wls]}))
    # prefill into a TP decode group: its token period stretches. KV from 2 prefill nodes
    # into 1 decode node is a many_to_one star, not a kv_transfer group (one-way bulk into
    # a decode member: decode._bulk_into), and the 2-way TP stretched 3.2x has no regular
    # token period (no ring steps): its tokens are rebuilt from the clean spacings
    # (decode.token_positions). 3 KV receivers of a 4-way TP group (period +8 %): the KV
    # load blurs the layer gaps (too few collectives at the lowest break: the wire's bursts
    # instead) and only 3 covered spacings fall inside its 4 tokens (they count when they
    # are the longest)
    for dec, into, blk, gap in [([2, 3], [2], "512KiB", None),
                                ([3, 4, 5, 6], [4, 5, 6], "256KiB", None)]:
        sc = _kv_into_decode(dec, list(range(min(dec))), into, blk)
        out.append((f"prefill-interference decode{len(dec)} into{len(into)} {blk}", sc, None, gap))
        if gap is None:          # shared downlinks at a small MTU: not a slow port (slow_link)
            out.append((f"prefill-interference decode{len(dec)} into{len(into)} {blk} mtu1024",
                        dict(copy.deepcopy(sc), mtu=1024), None, None))
    # KV stars and pairs into decode members (p2p components, not a kv_transfer group): the
    # decode group's stretched spacings against its clean ones at the same token position
    # (no ring steps when the stretch leaves no regular token period); a 1:1 pair and a 2:2
    # layout whose queues stretch nothing measurably are neutral in the truth, and a ring
    # link into the KV receiver is not a straggler. Known gap: a 2-way TP under KV for the
    # whole capture at MTU 1024 (no clean spacing to compare with; the layer gaps blur)
    for dec, pre, into, blk, extra, gap in [
            ([3, 4], [0, 1, 2], [3], "1MiB", {"mtu": 2048}, None),
            ([1, 2], [0], [1], "512KiB", {}, None),
            ([2, 3, 4, 5], [0, 1], [2], "512KiB", {}, None),
            ([2, 3], [0, 1], [2, 3], "512KiB", {}, None),
            ([2, 3], [0, 1], [2], "128KiB", {"layers": 8}, None),
            ([4, 5], [0, 1, 2, 3], [4], "512KiB", {"requests": 6}, None),
            ([2, 3], [0, 1], [2], "256KiB", {"mtu": 1024}, "2-way TP under KV for the whole capture at MTU 1024")]:
        sc = _kv_into_decode(dec, pre, into, blk, **extra)
        tag = " ".join(f"{k}{v}" for k, v in extra.items())
        out.append((f"kv {len(pre)}p into {len(into)} of {len(dec)}-way TP {blk} {tag}".rstrip(), sc, None, gap))
    # issue 25 classes 2 and 3 (tools/heldout_timing.py crosses them): barrier-timed steps, a
    # lag on every send, a slow shard / straggler from an onset or up to a recovery
    for n, sync, lag, per, extra in [(8, "barrier", 80, "step", {}), (4, "barrier", 300, "send", {}),
                                     (6, "dataflow", 200, "send", {"since_ms": 7.0}),
                                     (5, "barrier", 40, "send", {"until_ms": 7.0})]:
        tag = f"{sync} lag{lag}us per-{per}" + "".join(f" {k[:5]}{v:g}ms" for k, v in extra.items())
        out.append((f"tp-slow n{n} {tag}", variant("tp-decode-slow-shard", nodes=n, node=n - 1, wl={"step_sync": sync},
                                                   path=dict(extra, lag_us=lag, lag_per=per))))
    out.append(("tp-healthy n8 barrier", variant("tp-decode-healthy", nodes=8, wl={"step_sync": "barrier"})))
    for n, ch, sync, extra in [(8, 2, "dataflow", {}), (6, 4, "barrier", {}), (12, 1, "dataflow", {"since_ms": 4.0})]:
        tag = f"{sync} ch{ch}" + "".join(f" {k[:5]}{v:g}ms" for k, v in extra.items())
        out.append((f"ring-straggler n{n} {tag} 80us per-send", variant(
            "ring-straggler", nodes=n, node=n // 2, wl={"channels": ch, "step_sync": sync},
            path=dict(extra, rate_factor=1.0, start_lag_us=80, lag_per="send"), iterations=4, period_ms=8.0)))
        out.append((f"ring-healthy n{n} {sync} ch{ch}", variant("ring-healthy", nodes=n, wl={"channels": ch, "step_sync": sync})))
    # another collective library: Open MPI over verbs (generator library: mpi) -- eager SENDs
    # or RDMA READ by the receiver (eager limit), control SENDs back, a start-up exchange
    # between every pair (an MPI step is slower: iterations kept apart as compute keeps them)
    for n, eager in [(3, "12KiB"), (6, "64KiB"), (12, "12KiB")]:
        mpi = {"library": "mpi", "mpi": {"eager_bytes": eager}}
        out.append((f"mpi ring-straggler n{n} eager{eager}",
                    variant("ring-straggler", nodes=n, node=n // 2, period_ms=24.0, **mpi)))
        out.append((f"mpi ring-healthy n{n} eager{eager}", variant("ring-healthy", nodes=n, period_ms=16.0, **mpi)))
        out.append((f"mpi tp-slow n{n} eager{eager}", variant("tp-decode-slow-shard", nodes=n, node=n - 1, **mpi)))
        out.append((f"mpi tp-healthy n{n} eager{eager}", variant("tp-decode-healthy", nodes=n, **mpi)))
        if n > 3:
            out.append((f"mpi alltoallv-hot n{n} eager{eager}", variant("mpi-alltoallv-hot", nodes=n, node=1, **mpi)))
            out.append((f"mpi alltoall-healthy n{n} eager{eager}", variant("alltoall-healthy", nodes=n, **mpi)))
    return [(*c, None, None)[:4] for c in out]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--filter", default="", help="only the variants whose name contains this")
    ap.add_argument("--seeds", default="3,4", help="generator seeds, comma-separated")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",") if s]
    bad = known = 0
    for (name, sc, expect, gap), seed in itertools.product([c for c in cases() if args.filter in c[0]], seeds):
        try:
            ok, why = check(sc, seed, expect)
        except Exception as e:   # a crash is a finding of the sweep
            ok, why = False, f"ERR {type(e).__name__}: {e}"
        if gap and not ok:       # a gap we know of: shown, not counted
            known += 1
            print(f"KNOWN {name} seed={seed} ({gap}): {why}", flush=True)
            continue
        bad += not ok
        tag = "OK " if ok else "BAD"
        if ok and gap:
            tag = "OK (a known gap passes: drop its mark)"
        print(f"{tag} {name} seed={seed} {why if not ok else ''}".rstrip(), flush=True)
    print(f"bad: {bad}, known gaps: {known}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
