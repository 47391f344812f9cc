"""Prefill/decode disaggregation (collective kind `kv_transfer`): one-way bulk RDMA
transfers of KV-cache blocks from prefill nodes to decode nodes (docs/metrics.md
"KV-cache transfers").

A transfer = the messages of one (prefill, decode) flow merged across gaps below the
lowest natural break (above MIN_BREAK_NS) of the group's inter-message gaps (one
request's blocks go back to back; requests on a pair are separated by the router's
spacing). Per decode node: transfers, messages,
bytes, share of the group's bytes, transfer time p50/p99, its senders. Per link (prefill ->
decode): transfers, messages, bytes, throughput_bps = bytes x 8 / the summed wire time of
its messages (each from its first packet to its last + one packet time), rate_bps = the
90th percentile of its messages' rates (what the link reaches when its messages do not
share the decode node's downlink with concurrent transfers), and rate_bps / the median
link's (rate_ratio) and / the median of the other links into the same decode node
(rate_ratio_same_decode: a shared downlink slows all its links alike, a slow link alone)."""
from __future__ import annotations

import numpy as np

from skewscope.analysis.context import context
from skewscope.analysis.intervals import break_candidates
from skewscope.analysis.stats import median, percentile

#: a link's rate = this percentile of its messages' rates (bytes x 8 / wire time): the
#: rate the link reaches when its messages do not share the decode node's downlink
RATE_PCT = 90

#: gaps inside one transfer: below this floor (ns) a gap is packet spacing, never a break
#: between two requests (the physics floor: a few packet times at 100-400 Gb/s)
MIN_BREAK_NS = 2_000.0


def _pct(a, q):
    return float(percentile(a, q)) if len(a) else None


def kv_metrics(snap, g) -> dict:
    ctx = context(snap)
    ips = ctx.nodes.ips
    pre = list(g.extra.get("prefill") or [])
    dec = list(g.extra.get("decode") or [])
    fl = np.asarray(g.flows, dtype=np.int64)
    f = ctx.ev_flow
    ok = ctx.data_events(fl)
    idx = np.nonzero(ok)[0]
    rf = f[idx]
    st, en = ctx.ev_start[idx], ctx.ev_end[idx]
    by = ctx.events["bytes"][idx].astype(np.float64)
    o = np.lexsort((st, rf))
    rf, st, en, by = rf[o], st[o], en[o], by[o]
    same = rf[1:] == rf[:-1]
    gaps = (st[1:] - en[:-1])[same]
    # the lowest natural break: a request's blocks go back to back (gaps of a packet time),
    # anything clearly longer than the floor is the next request on the same pair
    cand = break_candidates(gaps, min_ratio=3.0, floor=MIN_BREAK_NS) if len(gaps) else []
    thr = min(cand) if cand else np.inf
    new = np.ones(len(rf), dtype=bool)
    if len(rf) > 1:
        new[1:] = ~same | ((st[1:] - en[:-1]) > thr)
    tid = np.cumsum(new) - 1
    nt = int(tid[-1]) + 1 if len(tid) else 0
    t_start = np.full(nt, np.inf)
    t_end = np.full(nt, -np.inf)
    np.minimum.at(t_start, tid, st)
    np.maximum.at(t_end, tid, en)
    t_bytes = np.bincount(tid, weights=by, minlength=nt)
    t_msgs = np.bincount(tid, minlength=nt)
    t_flow = rf[new] if nt else np.zeros(0, dtype=np.int64)
    t_src = ctx.nodes.src[t_flow]
    t_dst = ctx.nodes.dst[t_flow]
    t_dur = np.maximum(t_end - t_start, 1.0)
    sc = ctx.scale
    total = float(t_bytes.sum()) or 1.0
    per_dec = {}
    for d in dec:
        sel = t_dst == d
        dur = t_dur[sel] / 1e9
        per_dec[ips[d]] = {"transfers": int(sel.sum()), "messages": int(t_msgs[sel].sum()),
                           "bytes": float(t_bytes[sel].sum()) * sc, "share": round(float(t_bytes[sel].sum()) / total, 4),
                           "transfer_time_p50_s": _pct(dur, 50), "transfer_time_p99_s": _pct(dur, 99),
                           "senders": sorted({ips[int(s)] for s in t_src[sel]})}
    # links: wire time of the messages (rate while sending), per (src, dst)
    m_src = ctx.nodes.src[rf]
    m_dst = ctx.nodes.dst[rf]
    pairs = sorted(set(zip(m_src.tolist(), m_dst.tolist())))
    links = []
    for s, d in pairs:
        sel = (m_src == s) & (m_dst == d)
        w = np.maximum(en[sel] - st[sel], 1.0)
        wire = float(w.sum())
        b = float(by[sel].sum())
        tsel = (t_src == s) & (t_dst == d)
        links.append({"src": ips[s], "dst": ips[d], "transfers": int(tsel.sum()), "messages": int(sel.sum()),
                      "bytes": b * sc, "rate_bps": float(percentile(by[sel] * 8 / (w / 1e9), RATE_PCT)),
                      "throughput_bps": b * 8 / (wire / 1e9), "wire_s": wire / 1e9,
                      "transfer_time_p50_s": _pct(t_dur[tsel] / 1e9, 50)})
    rates = np.array([x["rate_bps"] for x in links])
    med = float(median(rates)) if len(rates) else None
    for x in links:
        x["rate_ratio"] = round(x["rate_bps"] / med, 4) if med else None
        peers = [y["rate_bps"] for y in links if y["dst"] == x["dst"] and y is not x]
        pm = float(median(peers)) if peers else 0.0
        # zero-byte messages only (an all-to-all's empty pairs send one 0-byte write): no rate
        x["rate_ratio_same_decode"] = round(x["rate_bps"] / pm, 4) if pm > 0 else None
    dur_all = t_dur / 1e9
    out = {"prefill_nodes": [ips[p] for p in pre], "decode_nodes": [ips[d] for d in dec],
           "roles": {**{ips[p]: "prefill" for p in pre}, **{ips[d]: "decode" for d in dec}},
           "transfers": nt, "kv_bytes": total * sc, "fair_share": round(1 / max(1, len(dec)), 4),
           "transfer_time_p50_s": _pct(dur_all, 50), "transfer_time_p99_s": _pct(dur_all, 99),
           "transfer_gap_threshold_s": None if not np.isfinite(thr) else float(thr) / 1e9,
           "per_decode": per_dec, "kv_links": links, "link_rate_median_bps": med,
           "workload": "prefill_decode",
           "_kv": {"t_src": t_src, "t_dst": t_dst, "t_dur_ns": t_dur, "t_bytes": t_bytes, "t_msgs": t_msgs,
                   "t_start_ns": t_start}}
    return out
