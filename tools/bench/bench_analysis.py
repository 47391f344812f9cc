#!/usr/bin/env python3
"""Analysis speed: skewscope.analysis (numba kernels) against a straightforward numpy
implementation of the same metrics, on the same synthetic Snapshot, in the same run.

    .venv/bin/python tools/bench/bench_analysis.py [--flows 65536] [--records 10000000] [--rounds 3]
    .venv/bin/python tools/bench/bench_analysis.py --decode [--tokens 700] [--rounds 3]

--decode: instead of the synthetic training Snapshot, a real decode capture: the generator's
4-node TP decode (16 layers x 2 ring all-reduces of one LL message per link per step, 2 ms
compute gap, one slow shard) with enough tokens for >= 1 M message records, written as a
headers-only pcap and read by the offline parser; the same rows are timed on it.

The Snapshot: a 128-node all-to-all with 2 channels (32,512 data flows, 32,512 CTS flows,
512 ACK-only flows = 65,536 flows) and 10 M message records (80 % 64 KiB data writes of 16
packets, 20 % 64-byte CTS), 10 iterations 50 ms apart, sorted by start time like a real
Snapshot. No root, no kernel.

Rows (median of --rounds, each on a fresh Snapshot object so nothing is cached; the live row:
3 untimed rounds, then the median of max(--rounds, 15): the steady state of a view that runs
every interval, and on a shared VM the CPU time of one round varies by +-30 %):

  live (per interval)  live_metrics(snap): the live view's per-interval work, from the flow
                       table only -- roles + QP-pair partners, node matrix + destination/
                       source skews, per-link counters, per-flow CE/CNP/loss, the
                       congestion/loss/PFC/caveat findings. Target <= 50 ms (10 Hz view).
  live + records       live_metrics(snap, records=True): + per-flow rate over active time,
                       busy time, link rates/throughput, stalls from the message records.
  full analysis        analyze(snap): everything (+ collective discovery/classification,
                       timing, incast degree, per-group metrics, all detectors).
  numpy baseline       the same per-flow/record metrics written with plain numpy (argsort,
                       reduceat, accumulate): per-flow record stats (count, bytes, MTU
                       inference, rate over active time, packet time, busy union, median
                       rate, stalls), per-pair busy unions, node matrix, incast degree,
                       activity bursts + period fit, skew statistics; no classification,
                       no findings (so the comparison flatters the baseline).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from skewscope.core import layout as L  # noqa: E402
from skewscope.core.snapshot import Snapshot  # noqa: E402


# ---- the synthetic snapshot -------------------------------------------------------------------
def synthetic(nodes=128, channels=2, n_flows=65536, n_records=10_000_000, iterations=10, period_ns=50_000_000,
              seed=1):
    rng = np.random.default_rng(seed)
    s_, d_ = np.meshgrid(np.arange(nodes), np.arange(nodes), indexing="ij")
    off = s_ != d_
    src = np.repeat(s_[off], channels)
    dst = np.repeat(d_[off], channels)
    nd = len(src)
    n_ack = max(0, n_flows - 2 * nd)
    fsrc = np.concatenate([src, dst, rng.integers(0, nodes, n_ack)])
    fdst = np.concatenate([dst, src, (rng.integers(1, nodes, n_ack) + fsrc[2 * nd:]) % nodes])
    n = len(fsrc)
    fl = np.zeros(n, dtype=L.FLOW_DTYPE)
    ip = np.zeros((nodes, 16), np.uint8)
    ip[:, 10:12] = 0xFF
    ip[:, 12] = 10
    ip[:, 14] = np.arange(nodes) // 256
    ip[:, 15] = np.arange(nodes) % 256
    fl["src"] = ip[fsrc]
    fl["dst"] = ip[fdst]
    fl["dest_qp"] = np.arange(n) + 0x100
    fl["ipver"] = 4
    fl["roce"] = 2
    sport = (0xC000 + np.arange(nd)) & 0xFFFF
    fl["sport"] = np.concatenate([sport, sport, np.zeros(n_ack, np.int64)])
    # records: 80 % data over the data flows, 20 % CTS over the CTS flows
    per_it = max(1, int(n_records * 0.8) // (nd * iterations))
    n_data = nd * iterations * per_it
    n_cts = max(0, n_records - n_data)
    data_flow = np.tile(np.repeat(np.arange(nd), per_it), iterations)
    k_in_flow = np.tile(np.tile(np.arange(per_it), nd), iterations)
    it = np.repeat(np.arange(iterations), nd * per_it)
    nd_rec = len(data_flow)
    pkt = 330.0
    dur = 15 * pkt
    start = (it * period_ns + 100_000 + (fsrc[data_flow] % 16) * 1000 + k_in_flow * (dur + pkt + 200)
             + rng.integers(0, 200, nd_rec)).astype(np.uint64)
    cts_flow = nd + rng.integers(0, nd, n_cts)
    cts_start = start[rng.integers(0, nd_rec, n_cts)] - np.uint64(2000)
    ev = np.zeros(nd_rec + n_cts, dtype=L.EVENT_DTYPE)
    ev["flow"] = np.concatenate([data_flow, cts_flow])
    ev["opclass"] = L.OPC_WRITE
    ev["start_ts"] = np.concatenate([start, cts_start])
    ev["end_ts"] = np.concatenate([start + np.uint64(dur), cts_start])
    ev["bytes"] = np.concatenate([np.full(nd_rec, 65536, np.uint64), np.full(n_cts, 64, np.uint64)])
    ev = ev[np.argsort(ev["start_ts"], kind="stable")]
    cnt = np.bincount(ev["flow"], minlength=n)
    fl["messages"] = cnt
    data = np.arange(n) < nd
    fl["msg_bytes"] = np.where(data, cnt * 65536, cnt * 64)
    fl["payload_bytes"] = fl["msg_bytes"]
    fl["op"][:, L.OPC_WRITE] = np.where(data, cnt * 16, cnt)
    fl["op"][:, L.OPC_ACK] = np.where(np.arange(n) >= 2 * nd, 100, cnt // 4)
    fl["packets"] = fl["op"].sum(axis=1)
    fl["msg_hist"][:, 17] = np.where(data, cnt, 0)
    fl["msg_hist"][:, 7] = np.where(~data, cnt, 0)
    fl["first_ts"] = int(ev["start_ts"][0])
    fl["last_ts"] = int(ev["end_ts"].max())
    fl["ecn_capable"] = fl["packets"]
    # a little congestion and loss so the detectors have work
    hot = rng.choice(nd, min(200, nd // 4), replace=False)
    fl["ce"][hot] = fl["packets"][hot] // 20
    fl["cnp"][hot + nd] = 50
    fl["psn_gaps"][hot[:20]] = 2
    fl["psn_skipped"][hot[:20]] = 3
    fl["retransmissions"][hot[:20]] = 40
    g = np.zeros(L.G_N, np.uint64)
    g[L.G_ACCOUNTED] = int(fl["packets"].sum())
    g[L.G_FRAMES] = g[L.G_ACCOUNTED]
    span = int(ev["end_ts"].max() - ev["start_ts"][0])
    meta = {"source": "bench", "first_ts": int(ev["start_ts"][0]), "last_ts": int(ev["end_ts"].max()),
            "duration_s": span / 1e9, "sample_n": 1, "max_flows": 65536}
    return Snapshot(fl, ev, g, meta)


def fresh(snap):
    return Snapshot(snap.flows, snap.events, snap.globals, dict(snap.meta))


# ---- the numpy baseline ---------------------------------------------------------------------------
def np_union(key, s, e):
    """Union length per key of intervals (any order): sort by (key, start), running max of
    the ends made global by offsetting each key far apart."""
    o = np.lexsort((s, key))
    k, s, e = key[o], s[o], e[o]
    t0 = s.min() if len(s) else 0.0
    width = (e.max() - t0 + 1.0) if len(s) else 1.0
    base = k.astype(np.float64) * width - t0          # keys far apart, precision kept
    s2, e2 = s + base, e + base
    run = np.maximum.accumulate(e2)
    new = np.ones(len(s2), dtype=bool)
    new[1:] = s2[1:] > run[:-1]
    ivs = s2[new]
    ive = np.maximum.reduceat(e2, np.nonzero(new)[0])
    ik = k[new]
    return ik, ivs - (ik * width - t0), ive - (ik * width - t0)


def np_skew(x):
    x = np.asarray(x, dtype=np.float64)
    m = x.mean()
    xs = np.sort(x)
    n = len(x)
    return {"max_over_mean": x.max() / m, "cv": x.std() / m,
            "gini": float(np.sum((2 * np.arange(1, n + 1) - n - 1) * xs) / (n * x.sum())),
            "jain": x.sum() ** 2 / (n * np.sum(x * x))}


def numpy_baseline(snap):
    fl, ev = snap.flows, snap.events
    nf = len(fl)
    # nodes and data flows (same role rule: messages bigger than a CTS)
    addr = np.concatenate([fl["src"], fl["dst"]]).view(">u8").reshape(-1, 2)
    _, inv = np.unique(addr, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    fs, fd = inv[:nf], inv[nf:]
    nn = int(inv.max()) + 1
    mean = np.where(fl["messages"] > 0, fl["msg_bytes"] / np.maximum(fl["messages"], 1), 0)
    data = mean > 512
    # per-flow record stats
    f = ev["flow"].astype(np.int64)
    st = ev["start_ts"].astype(np.float64)
    en = ev["end_ts"].astype(np.float64)
    by = ev["bytes"].astype(np.int64)
    o = np.argsort(f, kind="stable")
    fo, so, eo, bo = f[o], st[o], en[o], by[o]
    cnt = np.bincount(fo, minlength=nf)
    bsum = np.bincount(fo, weights=bo, minlength=nf)
    req = (fl["op"][:, L.OPC_WRITE] + fl["op"][:, L.OPC_SEND]).astype(np.int64)
    best = None
    for mtu in (4096, 2048, 1024, 512, 256):
        pk = np.bincount(fo, weights=np.maximum(1, -(-bo // mtu)), minlength=nf)
        d = np.abs(pk - req)
        if best is None:
            best, mtus = d, np.full(nf, mtu)
        else:
            better = d < best
            best = np.where(better, d, best)
            mtus = np.where(better, mtu, mtus)
    npk = np.maximum(1, -(-bo // mtus[fo]))
    dur = eo - so
    multi = (npk >= 2) & (dur > 0)
    wire = np.where(multi, dur * npk / np.maximum(npk - 1, 1), 0)
    mb = np.bincount(fo, weights=np.where(multi, bo, 0), minlength=nf)
    wn = np.bincount(fo, weights=wire, minlength=nf)
    rate = np.where(wn > 0, mb * 8e9 / np.maximum(wn, 1e-9), np.nan)
    gaps = np.bincount(fo, weights=np.where(multi, npk - 1, 0), minlength=nf)
    pkt = np.where(gaps > 0, np.bincount(fo, weights=np.where(multi, dur, 0), minlength=nf) / np.maximum(gaps, 1), 0)
    e_adj = eo + pkt[fo]
    k, a, b = np_union(fo, so, e_adj)
    busy = np.bincount(k, weights=b - a, minlength=nf)
    # median per-message rate and stalls
    r = np.where(multi, bo / np.maximum(wire, 1e-9), np.nan)
    o2 = np.lexsort((r, fo))
    rs, ks = r[o2], fo[o2]
    valid = np.isfinite(rs)
    nv = np.bincount(ks[valid], minlength=nf)
    first = np.searchsorted(ks, np.arange(nf))
    mid = first + nv // 2
    med = np.where(nv > 0, rs[np.minimum(mid, len(rs) - 1)], np.nan)
    exp = bo / med[fo]
    stalled = multi & (wire >= 2 * exp)
    stall = np.bincount(fo, weights=np.where(stalled, wire - exp, 0), minlength=nf)
    # per node-pair busy union, node matrix, incast degree
    pair = fs * nn + fd
    dev = data[f] & (f >= 0)
    pk_, pa, pb = np_union(pair[f[dev]], st[dev], en[dev] + pkt[f[dev]])
    pair_busy = np.bincount(np.unique(pk_, return_inverse=True)[1], weights=pb - pa)
    mat = np.zeros((nn, nn))
    np.add.at(mat, (fs[data], fd[data]), fl["payload_bytes"][data].astype(np.float64))
    dst = pk_ % nn
    t = np.concatenate([pa, pb])
    dl = np.concatenate([np.ones(len(pa)), -np.ones(len(pa))])
    dd = np.concatenate([dst, dst])
    o3 = np.lexsort((dl, t, dd))
    c = np.cumsum(dl[o3])
    segstart = np.searchsorted(dd[o3], np.arange(nn))
    base = np.concatenate([[0.0], c])[segstart]
    cc = c - np.repeat(base, np.diff(np.append(segstart, len(c))))
    incast = np.zeros(nn)
    np.maximum.at(incast, dd[o3], cc)
    # activity bursts and period
    s_all, e_all = st[dev], en[dev]
    _, ua, ub = np_union(np.zeros(len(s_all), np.int64), s_all, e_all)
    g = ua[1:] - ub[:-1]
    gs = np.sort(g)[::-1]
    rr = gs[:-1] / np.maximum(gs[1:], 1e-9)
    kk = int(np.argmax(rr[:50])) if len(rr) else 0
    thr = np.sqrt(gs[kk] * gs[kk + 1]) if len(gs) > 1 else np.inf
    starts = np.concatenate([[ua[0]], ua[1:][g > thr]])
    per = np.polyfit(np.arange(len(starts)), starts, 1)[0] if len(starts) > 2 else None
    sk = (np_skew(mat.sum(axis=0)), np_skew(mat.sum(axis=1)), np_skew(rate[data & np.isfinite(rate)]))
    return {"rate": rate, "busy": busy, "stall": stall, "pair_busy": pair_busy, "incast": incast, "period": per,
            "skews": sk, "cnt": cnt, "bsum": bsum}


# ---- run ----------------------------------------------------------------------------------------
CPU = {}


def decode_snapshot(tokens: int, seed: int = 1):
    """A TP-decode capture from the generator (>= 1 M message records at 700 tokens), parsed."""
    import tempfile

    from skewscope import gen
    from skewscope.gen.presets import PRESETS
    from skewscope.sources.offline import parse_file
    sc = dict(PRESETS["tp-decode-slow-shard"])
    sc["workloads"] = [dict(w, tokens=tokens) for w in sc["workloads"]]
    cap = gen.generate(sc, seed=seed)
    with tempfile.TemporaryDirectory(prefix="bench-decode-") as d:
        path = f"{d}/decode.pcap"
        cap.write_pcap(path, snaplen=128)
        return parse_file(path, max_flows=65536)


def timed(fn, rounds):
    """Median wall time over rounds (also records the median CPU time of this process,
    which the other users of a shared machine do not inflate)."""
    ts, cs = [], []
    out = None
    for _ in range(rounds):
        c = time.process_time()
        t = time.perf_counter()
        out = fn()
        ts.append(time.perf_counter() - t)
        cs.append(time.process_time() - c)
    CPU[fn] = statistics.median(cs)
    return statistics.median(ts), out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--flows", type=int, default=65536)
    ap.add_argument("--records", type=int, default=10_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--decode", action="store_true", help="a generated TP-decode capture instead of the synthetic one")
    ap.add_argument("--tokens", type=int, default=700, help="--decode: tokens in the capture")
    a = ap.parse_args()
    from skewscope.analysis import analyze, live_metrics
    from skewscope.analysis.context import context
    # warm the numba caches on a small one
    small = synthetic(nodes=8, n_flows=256, n_records=20_000)
    analyze(fresh(small))
    live_metrics(fresh(small))
    live_metrics(fresh(small), records=True)
    numpy_baseline(small)
    t0 = time.perf_counter()
    if a.decode:
        snap = decode_snapshot(a.tokens)
        what = f"TP-decode capture ({a.tokens} tokens, generator -> pcap -> offline parser)"
    else:
        snap = synthetic(n_flows=a.flows, n_records=a.records)
        what = "synthetic snapshot"
    print(f"{what}: {len(snap.flows):,} flows, {len(snap.events):,} message records "
          f"({time.perf_counter() - t0:.1f} s to build)")
    rows = []
    f_live = lambda: live_metrics(fresh(snap))  # noqa: E731
    f_liver = lambda: live_metrics(fresh(snap), records=True)  # noqa: E731
    f_full = lambda: analyze(fresh(snap))  # noqa: E731
    f_np = lambda: numpy_baseline(snap)  # noqa: E731
    # the live view runs every interval: its steady state, after 3 untimed rounds on this
    # snapshot (the first rounds after building a 2 GB snapshot also pay for the kernel
    # settling the new memory), the median of >= 15 rounds
    for _ in range(3):
        f_live()
    t_live, _ = timed(f_live, max(a.rounds, 15))
    t_liver, _ = timed(f_liver, a.rounds)
    t_full, an = timed(f_full, a.rounds)
    t_np, base = timed(f_np, a.rounds)
    # the same numbers? (the baseline implements the same definitions)
    ctx = context(fresh(snap))
    st = ctx.fstat
    ok = np.isfinite(base["rate"])
    agree = bool(np.allclose(st["rate_bps"][ok], base["rate"][ok], rtol=1e-9)
                 and np.allclose(st["busy_ns"], base["busy"], rtol=1e-9)
                 and np.allclose(st["stall_ns"], base["stall"], rtol=1e-6, atol=1e-3))
    # record-only part of ours, for the like-for-like ratio
    def ours_records():
        c = context(fresh(snap))
        from skewscope.analysis import incast_degree, link_rates, node_matrix, timing
        c.fstat
        link_rates(c)
        node_matrix(c)
        incast_degree(c)
        timing(c)
    t_rec, _ = timed(ours_records, a.rounds)
    rows = [("live (per interval)", t_live, CPU[f_live], "flow table only; target <= 50 ms"),
            ("live + records", t_liver, CPU[f_liver], "+ rates over active time, busy, stalls"),
            ("full analysis", t_full, CPU[f_full], f"{len(an['collectives'])} groups, {len(an['findings'])} findings"),
            ("record metrics (ours)", t_rec, CPU[ours_records], "same metric set as the numpy baseline"),
            ("numpy baseline", t_np, CPU[f_np], "plain numpy, same definitions")]
    print(f"\n{'step':24s} {'wall':>10s} {'CPU':>10s} {'vs numpy':>9s}  notes")
    for name, t, c, note in rows:
        print(f"{name:24s} {t * 1e3:8.1f} ms {c * 1e3:7.1f} ms {t_np / t:8.1f}x  {note}")
    print(f"\nours vs numpy on the same metrics: {t_np / t_rec:.1f}x faster; results agree: {agree}")
    print(f"live per-interval work: {t_live * 1e3:.1f} ms wall, {CPU[f_live] * 1e3:.1f} ms CPU "
          f"({'meets' if CPU[f_live] <= 0.05 else 'MISSES'} the 50 ms target); load average "
          f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
