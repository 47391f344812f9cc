"""Prefill/decode disaggregation (kv_transfer groups, analysis.kv): pd_imbalance (a decode
node receiving well above its fair share of the KV bytes), kv_transfer_slow (a prefill ->
decode link whose throughput is well below the median link's). Evidence counts
repetitions (transfers, messages) and ratios, never bytes."""
from __future__ import annotations

import numpy as np

from skewscope.analysis.detectors import actions as A
from skewscope.analysis.detectors.common import gbps, impact_of, pct, sev, us
from skewscope.analysis.detectors.registry import KEY_BLAMED, KEY_LINK, Detector, Kind, Threshold
from skewscope.analysis.onset import series_onset, slowdown_onset
from skewscope.analysis.stats import median

#: pd_imbalance onset: consecutive transfers are taken in chunks of at least this many
#: (and at least one per decode node) for the share series
PD_CHUNK = 4


def kv(inp, em):
    for gi, g, r, ev in inp.groups:
        if g.kind == "kv_transfer" and r.get("per_decode"):
            _imbalance(em, inp.ctx, g, r, inp.th["pd_imbalance"], gi, _requests(inp.ctx, r, ev.kv), ev.kv)
            _slow(em, inp.ctx, g, r, inp.th["kv_transfer_slow"], gi)


def _flows(ctx, g, src=None, dst=None):
    ips = ctx.nodes.ips
    return [int(f) for f in g.flows if (src is None or ips[ctx.nodes.src[f]] == src)
            and (dst is None or ips[ctx.nodes.dst[f]] == dst)]


def _requests(ctx, r, kv) -> dict:
    """Requests into each decode node. A transfer is a gap-separated burst on one (prefill,
    decode) pair, and two requests a router sends one after the other to the same pair queue
    back to back into one burst (the overloaded node's most of all): each transfer counts
    its bytes over the group's median transfer's, rounded, at least 1 (a ratio: a request's
    size is what the median transfer carries)."""
    pd = r["per_decode"]
    tb = np.asarray(kv["t_bytes"] if kv else [], dtype=np.float64)
    typical = float(median(tb)) if len(tb) else 0.0
    if typical <= 0:
        return {ip: d["transfers"] for ip, d in pd.items()}
    per = np.maximum(1, np.rint(tb / typical)).astype(np.int64)
    node = {a: i for i, a in enumerate(ctx.nodes.ips)}
    dst = np.asarray(kv["t_dst"])
    return {ip: int(per[dst == node[ip]].sum()) for ip in pd}


def _pd_onset(ctx, kv, ip, fair, thr):
    """Per chunk of consecutive transfers (time order; max(PD_CHUNK, decode nodes) each):
    the decode node's share of the requests (each transfer counted as in _requests); the
    stretch at or above thr (series scan)."""
    if not kv or not len(kv["t_bytes"]):
        return None
    node = ctx.nodes.ips.index(ip)
    o = np.argsort(np.asarray(kv["t_start_ns"], dtype=np.float64), kind="stable")
    ts = np.asarray(kv["t_start_ns"], dtype=np.float64)[o]
    te = ts + np.asarray(kv["t_dur_ns"], dtype=np.float64)[o]
    tb = np.asarray(kv["t_bytes"], dtype=np.float64)[o]
    typical = float(median(tb))
    per = np.maximum(1, np.rint(tb / typical)) if typical > 0 else np.ones(len(tb))
    mine = (np.asarray(kv["t_dst"])[o] == node) * per
    k = max(PD_CHUNK, int(round(1 / fair)))
    edges = np.arange(0, len(ts), k)
    if len(edges) < 2:
        return None
    share = np.add.reduceat(mine, edges) / np.add.reduceat(per, edges)
    ends = np.maximum.reduceat(te, edges)
    return series_onset(ts[edges], share, worse=1, thr=thr, t_end=ends)


def _imbalance(em, ctx, g, r, t, gi, req, kv=None):
    pd = r["per_decode"]
    if len(pd) < 2:
        return
    fair = 1.0 / len(pd)
    n = sum(req.values())
    for ip, d in sorted(pd.items(), key=lambda kv: -kv[1]["share"]):
        ratio = d["share"] / fair
        # chance: a router spreading n requests evenly at random gives a node n/D +- sd
        z = (req[ip] - n * fair) / max(1e-9, float(np.sqrt(n * fair * (1 - fair))))
        if ratio < t["warning"] or req[ip] < t["min_transfers"] or z < t["min_z"]:
            continue
        others = [x["transfer_time_p50_s"] for k, x in pd.items() if k != ip and x["transfer_time_p50_s"] is not None]
        lost = None
        if others and d["transfer_time_p50_s"] is not None:
            lost = max(0.0, d["transfer_time_p50_s"] - float(median(others)))
        em.add("pd_imbalance", sev(ratio, t["warning"], t["critical"]), [ip] + list(r["prefill_nodes"]),
               f"decode node {ip} receives {pct(d['share'])} of the KV-cache bytes ({req[ip]} requests in "
               f"{d['transfers']} transfers, "
               f"{ratio:.2f}x its fair share {pct(fair)} of {len(pd)} decode nodes); its transfers take "
               f"{us((d['transfer_time_p50_s'] or 0) * 1e9)} p50: the router overloads it; check the P/D router's "
               "load balancing (KV-cache / session affinity)",
               {"share": d["share"], "fair_share": round(fair, 4), "share_over_fair": round(ratio, 4),
                "transfers_z": round(z, 3), "transfers_total": sum(x["transfers"] for x in pd.values()),
                "requests": req[ip], "requests_total": n,
                "transfers": d["transfers"], "messages": d["messages"], "bytes": d["bytes"],
                "transfer_time_p50_s": d["transfer_time_p50_s"], "transfer_time_p99_s": d["transfer_time_p99_s"],
                "others_transfer_time_p50_s": float(median(others)) if others else None,
                "per_decode_share": {k: x["share"] for k, x in pd.items()}},
               flows=_flows(ctx, g, dst=ip), group=gi, impact=impact_of(lost, None),
               onset=_pd_onset(ctx, kv, ip, fair, fair * t["warning"]))


def _slow(em, ctx, g, r, t, gi):
    links = r.get("kv_links") or []
    med = r.get("link_rate_median_bps")
    if len(links) < 3 or not med:
        return
    for x in sorted(links, key=lambda x: x["rate_ratio"] or 1.0):
        q, qd = x["rate_ratio"], x["rate_ratio_same_decode"]
        if q is None or q > t["warning"] or x["messages"] < t["min_messages"]:
            continue
        per_t = x["bytes"] / max(1, x["transfers"])
        lost = per_t * 8 * (1 / x["rate_bps"] - 1 / med) if x["rate_bps"] > 0 else None
        em.add("kv_transfer_slow", sev(q, t["warning"], t["critical"], higher_is_worse=False), [x["src"], x["dst"]],
               f"KV-cache link {x['src']} -> {x['dst']} moves data at {gbps(x['rate_bps'])}, {q:.2f}x the median "
               f"link ({gbps(med)}) over {x['messages']} messages: each transfer on it takes "
               f"{us((x['transfer_time_p50_s'] or 0) * 1e9)}; check that link's port speed, cabling, errors and "
               "the NIC's rate limiter",
               {"link": f"{x['src']}->{x['dst']}", "src": x["src"], "dst": x["dst"], "rate_bps": x["rate_bps"],
                "median_rate_bps": med, "rate_ratio": q, "rate_ratio_same_decode": qd,
                "transfers": x["transfers"], "messages": x["messages"], "bytes": x["bytes"],
                "transfer_time_p50_s": x["transfer_time_p50_s"]},
               flows=_flows(ctx, g, src=x["src"], dst=x["dst"]), group=gi, impact=impact_of(lost, None),
               onset=slowdown_onset(ctx, _flows(ctx, g, src=x["src"], dst=x["dst"]),
                                    [f for f in _flows(ctx, g) if not (ctx.nodes.ips[ctx.nodes.src[f]] == x["src"]
                                                                       and ctx.nodes.ips[ctx.nodes.dst[f]] == x["dst"])],
                                    thr=t["warning"]))


DETECTORS = [
    Detector(
        "kv", kv, needs=frozenset({"flows", "records", "groups"}), stage=20,
        doc="kv_transfer groups (prefill -> decode KV-cache transfers): decode-node share, link throughput",
        kinds=(
            Kind("pd_imbalance",
                 key=KEY_BLAMED, headline=("share",), actions=(A.REROUTE_DECODE,), role="cause",
                 fires='kv_transfer group with ≥ 2 decode nodes: a decode node\'s share of the KV bytes / its fair share '
                       '(1 / decode nodes) ≥ `warning` (1.5), ≥ `critical` (2.5), over ≥ `min_transfers` (3) requests, and its request '
                       'count ≥ `min_z` (2) standard deviations above an even random spread (n/D ± √(n·(1/D)(1−1/D))): not chance; '
                       'requests = its transfers, each counted as its bytes / the median transfer\'s, rounded, ≥ 1 (requests queued '
                       'back to back on a pair are one burst)',
                 blames='the decode node, then the prefill nodes',
                 thresholds=(Threshold("warning", 1.5, "ratio", "a decode node's KV byte share / fair share: warning"),
                             Threshold("critical", 2.5, "ratio", "a decode node's KV byte share / fair share: critical"),
                             Threshold("min_transfers", 3, "count", "KV requests into the decode node, at least"),
                             Threshold("min_z", 2.0, "ratio", "(its requests - the fair count) / the binomial standard deviation, at least")),
                 onset="per chunk of consecutive transfers (≥ 4, ≥ one per decode node), the node's share of the "
                       "requests; the stretch at or above `warning` × the fair share (series scan)"),
            Kind("kv_transfer_slow",
                 key=KEY_LINK, headline=("rate_ratio",), actions=(A.CHECK_LINK,), role="cause",
                 fires='kv_transfer group with ≥ 3 links: a prefill → decode link\'s rate (90th percentile of its '
                       'messages\' rates: uncontended) / the median link\'s ≤ `warning` (0.5), ≤ `critical` (0.25), '
                       'over ≥ `min_messages` (4) messages',
                 blames='the prefill node, the decode node; the link\'s flows',
                 thresholds=(Threshold("warning", 0.5, "ratio", "link rate / median link rate, at most: warning"),
                             Threshold("critical", 0.25, "ratio", "link rate / median link rate, at most: critical"),
                             Threshold("min_messages", 4, "count", "KV messages (block writes) on the link, at least")),
                 onset="per time bin, the link's median message rate / the group's other links' (series scan, lower "
                       "is worse, threshold `warning`)"),
        )),
]
