"""Fleet detectors on node-level matrices (the `skewscope cluster` path).

The single-node path analyses flows and message records; across a fleet, Prometheus
holds per-pair counters instead (skewscope export). This module runs the same questions
on an n x n matrix (row = source node, column = destination node) using the package's
statistics (`stats.skew_stats`, `stats.skew_rows`, `stats.robust_ratio_to_median`) and
the same definitions:

* traffic class of a flow (the exporter's `class` label, exporter.flow_class): bulk = mean
  message >= BULK_MIN_MESSAGE (ring/tree SIMPLE slices; all-to-all/P2P chunks are <= 128
  KiB), chunk = other data (mean > flows.CTS_MAX_BYTES), control = clear-to-send writes,
  ACK/NAK, CNP; a data pair carries bulk or chunk bytes; a ring link is a bulk pair;
* rate over active time of a pair: 8 * bytes of its multi-packet messages / their on-wire
  time (flows.flow_event_stats, summed over the pair's flows by the exporter);
* ring: a cycle of the successor map of bulk pairs (every member has exactly one bulk
  successor and one bulk predecessor); straggler score of a link = its rate over active
  time / the median over the ring's links;
* incast degree of a destination: sum over senders of the pair's busy time / the
  destination's busy time (union of all incoming message intervals) = mean number of
  senders transferring into it while it receives.

Findings have the shape of the single-node ones: kind, severity, entities (IP strings),
evidence, message.
"""
from __future__ import annotations

import numpy as np

from skewscope.analysis.findings import DEFAULTS as SINGLE
from skewscope.analysis.flows import CTS_MAX_BYTES  # noqa: F401 (re-exported: the exporter's class bounds)
from skewscope.analysis.stats import robust_ratio_to_median, skew_rows, skew_stats

BULK_MIN_MESSAGE = 160 * 1024

DEFAULTS = {
    "hot_destination.preference": 1.5,        # median over sources of (bytes to dst / to the others)
    "hot_destination.critical": 3.0,
    "hot_destination.min_nodes": 3,
    "alltoall_destination_skew.max_over_mean": 2.0,
    "alltoall_destination_skew.min_destinations": 3,
    "ring_straggler.rate_vs_median": 0.8,     # link rate over active time / ring median
    "ring_straggler.critical": 0.5,
    "incast.degree": 4.0,                     # mean concurrent senders into a destination
    "incast.vs_median": 2.0,                  # ... and this many times the median destination
    "ecn_congestion.ce_fraction": 0.01,
    "cnp_storm.per_second": 5000.0,           # CNPs/s telling one sender to slow down
    "cnp_storm.min_count": 100,               # (window 'all': a count instead of a rate)
    "retransmissions.fraction": 0.001,
    "nak_errors.count": 1,
}


def _bps(v: float) -> str:
    for unit, f in (("Gb/s", 1e9), ("Mb/s", 1e6), ("kb/s", 1e3)):
        if v >= f:
            return f"{v / f:.2f} {unit}"
    return f"{v:.0f} b/s"


# the single-node detectors' thresholds (analysis.findings.DEFAULTS) where the fleet
# detector asks the same question, so one number means the same thing in both paths
_SHARED = {"hot_destination.preference": ("hot_destination", "warning"),
           "hot_destination.critical": ("hot_destination", "critical"),
           "ring_straggler.rate_vs_median": ("ring_straggler", "warning"),
           "ring_straggler.critical": ("ring_straggler", "critical"),
           "incast.degree": ("incast", "min_senders"),
           "incast.vs_median": ("incast", "ratio")}


def _t(thresholds, key):
    if thresholds and key in thresholds:
        return thresholds[key]
    if key in _SHARED:
        try:
            sec, name = _SHARED[key]
            return SINGLE[sec][name]
        except (ImportError, KeyError):
            pass
    return DEFAULTS[key]


def _safe_div(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(b > 0, a / np.where(b > 0, b, 1.0), np.nan)


def _offdiag(m: np.ndarray) -> np.ndarray:
    m = m.copy()
    np.fill_diagonal(m, 0)
    return m


def class_bytes(fm, klass: str) -> np.ndarray:
    return _offdiag(fm.cls("bytes", klass))


def rate_over_active(fm, klass: str) -> np.ndarray:
    """bits/s per pair over the on-wire time of its multi-packet messages of one traffic
    class (NaN: none)."""
    return 8.0 * _safe_div(fm.cls("timed_message_bytes", klass), fm.cls("message_wire_seconds", klass))


def destination_preference(m: np.ndarray) -> np.ndarray:
    """Per destination j: the median over sources i (i != j, sending to j and to at least
    one other node) of m[i, j] / mean_{k != i, j} m[i, k] -- how much more than to the
    others a typical source sends to j. A MoE hot expert is over-sent by every source even
    when the combine phase (the expert sending back as much) dilutes its inbound total."""
    n = m.shape[0]
    out = np.full(n, np.nan)
    m = _offdiag(np.asarray(m, dtype=np.float64))
    rowsum = m.sum(axis=1)
    cnt = (m > 0).sum(axis=1)
    for j in range(n):
        others_n = cnt - (m[:, j] > 0)
        ok = (m[:, j] > 0) & (others_n > 0)
        ok[j] = False
        if not ok.any():
            continue
        mean_others = (rowsum[ok] - m[ok, j]) / others_n[ok]
        r = m[ok, j] / np.where(mean_others > 0, mean_others, np.nan)
        if np.isfinite(r).any():
            out[j] = float(np.nanmedian(r))
    return out


def find_rings(bulk: np.ndarray) -> list[list[int]]:
    """Cycles of the successor map of bulk pairs, each as the member order [a, succ(a), ...]."""
    n = bulk.shape[0]
    outd = bulk.sum(axis=1)
    ind = bulk.sum(axis=0)
    ok = (outd == 1) & (ind == 1)
    succ = np.where(ok, np.argmax(bulk, axis=1), -1)
    seen = np.zeros(n, dtype=bool)
    rings = []
    for a in range(n):
        if not ok[a] or seen[a]:
            continue
        cyc = [a]
        seen[a] = True
        b = int(succ[a])
        while b >= 0 and ok[b] and not seen[b]:
            cyc.append(b)
            seen[b] = True
            b = int(succ[b])
        if b == a and len(cyc) >= 2:
            rings.append(cyc)
    return rings


def all_to_all_groups(dp: np.ndarray, bulk: np.ndarray) -> list[list[int]]:
    """Groups of nodes where every member sends non-bulk data to every other member
    (connected components of mutual non-bulk data pairs, kept when >= 90 % dense)."""
    chunk = dp & ~bulk
    mutual = chunk & chunk.T
    n = dp.shape[0]
    comp = -np.ones(n, dtype=np.int64)
    groups = []
    for a in range(n):
        if comp[a] >= 0 or not mutual[a].any():
            continue
        stack, members = [a], []
        comp[a] = len(groups)
        while stack:
            x = stack.pop()
            members.append(x)
            for y in np.nonzero(mutual[x])[0]:
                if comp[y] < 0:
                    comp[y] = len(groups)
                    stack.append(int(y))
        members.sort()
        k = len(members)
        if k >= 3:
            sub = chunk[np.ix_(members, members)]
            if sub.sum() >= 0.9 * k * (k - 1):
                groups.append(members)
                continue
        groups.append([])
    return [g for g in groups if g]


def analyze_matrix(fm, thresholds=None) -> dict:
    """{"collectives", "timing": None, "findings", "metrics"} for a fleet matrix."""
    ips = fm.ips
    n = len(ips)
    findings = []
    collectives = []
    metrics: dict = {"nodes": n}
    if n == 0:
        return {"collectives": [], "timing": None, "findings": [], "metrics": metrics}
    tot = fm.pair
    bulk_b = class_bytes(fm, "bulk")
    chunk_b = class_bytes(fm, "chunk")
    data_b = bulk_b + chunk_b
    dp = data_b > 0
    bulk = bulk_b > 0
    rate = rate_over_active(fm, "bulk")

    # -- traffic matrix: hot destination / hot source -----------------------------------------
    # over the all-to-all (chunk) traffic when there is any: ring/tree volumes are equal by
    # construction and would only dilute an expert's skew; else over all data
    hot_b = chunk_b if chunk_b.sum() > 0 else data_b
    inbound = hot_b.sum(axis=0)
    outbound = hot_b.sum(axis=1)
    recv = np.nonzero(inbound > 0)[0]
    dst_stats = skew_stats(inbound[recv]) if len(recv) else skew_stats([])
    src_stats = skew_stats(outbound[outbound > 0])
    metrics["traffic_matrix"] = {"ips": ips, "data_bytes": data_b.tolist()}
    metrics["destination_skew"] = dst_stats
    metrics["source_skew"] = src_stats
    pref = destination_preference(hot_b)
    metrics["destination_preference"] = {ips[j]: float(pref[j]) for j in range(n) if np.isfinite(pref[j])}
    if len(recv) >= _t(thresholds, "hot_destination.min_nodes") and np.isfinite(pref).any():
        j = int(np.nanargmax(pref))
        p = float(pref[j])
        if p >= _t(thresholds, "hot_destination.preference"):
            hot = ips[j]
            share = float(inbound[j] / inbound.sum()) if inbound.sum() > 0 else None
            findings.append({
                "kind": "hot_destination",
                "severity": "critical" if p >= _t(thresholds, "hot_destination.critical") else "warning",
                "entities": [hot],
                "evidence": {"preference": p, "inbound_share": share, "inbound_max_over_mean":
                             dst_stats["max_over_mean"], "senders": int((hot_b[:, j] > 0).sum()),
                             "destinations": len(recv), "traffic": "chunk" if hot_b is chunk_b else "data"},
                "message": f"hot destination {hot}: a typical source sends it {p:.2f}x what it sends each other "
                           f"node ({int((hot_b[:, j] > 0).sum())} sources); in a MoE job, the node of a hot expert",
            })

    # -- collectives -------------------------------------------------------------------------
    for g in all_to_all_groups(chunk_b > 0, np.zeros_like(bulk)):
        sub = chunk_b[np.ix_(g, g)]
        mask = ~np.eye(len(g), dtype=bool)
        rows = skew_rows(sub, mask)
        col = skew_stats(sub.sum(axis=0))
        collectives.append({"kind": "all_to_all", "members": [ips[i] for i in g], "confidence": 0.8,
                            "metrics": {"destination_skew": col, "per_source_max_over_mean":
                                        [r["max_over_mean"] for r in rows]}})
        thr = _t(thresholds, "alltoall_destination_skew.max_over_mean")
        worst = [(r["max_over_mean"] or 0.0, k, r) for k, r in enumerate(rows)
                 if (r["n"] or 0) >= _t(thresholds, "alltoall_destination_skew.min_destinations")]
        skewed = [w for w in worst if w[0] >= thr]
        if skewed:
            # the destination most sources over-send to
            hot_cols = [g[int(r["argmax"])] for _, _, r in skewed]
            hot = max(set(hot_cols), key=hot_cols.count)
            srcs = [ips[g[k]] for _, k, _ in skewed]
            top = max(w[0] for w in skewed)
            findings.append({
                "kind": "alltoall_destination_skew", "severity": "warning",
                "entities": [ips[hot]] + [s for s in srcs if s != ips[hot]],
                "evidence": {"max_over_mean": top, "sources_skewed": len(skewed), "sources": len(g),
                             "hot_destination": ips[hot], "group": [ips[i] for i in g]},
                "message": f"all-to-all destination skew up to {top:.2f}x: {len(skewed)} of {len(g)} sources send "
                           f"most to {ips[hot]}",
            })
    for ring in find_rings(bulk):
        links = [(ring[k], ring[(k + 1) % len(ring)]) for k in range(len(ring))]
        lr = np.array([rate[a, c] for a, c in links])
        score = robust_ratio_to_median(lr)
        med = float(np.nanmedian(lr)) if np.isfinite(lr).any() else None
        collectives.append({"kind": "ring_allreduce", "members": [ips[i] for i in ring], "confidence": 0.8,
                            "metrics": {"link_rate_bps": [None if not np.isfinite(x) else float(x) for x in lr],
                                        "median_rate_bps": med,
                                        "straggler_score": [None if not np.isfinite(x) else float(x)
                                                            for x in score]}})
        if len(ring) >= 3 and np.isfinite(score).any():
            k = int(np.nanargmin(score))
            s = float(score[k])
            if s < _t(thresholds, "ring_straggler.rate_vs_median"):
                a, c = links[k]
                findings.append({
                    "kind": "ring_straggler",
                    "severity": "critical" if s < _t(thresholds, "ring_straggler.critical") else "warning",
                    "entities": [ips[a], ips[c]],
                    "evidence": {"link": [ips[a], ips[c]], "rate_bps": float(lr[k]), "median_rate_bps": med,
                                 "score": s, "ring": [ips[i] for i in ring]},
                    "message": f"ring link {ips[a]}->{ips[c]} at {s:.2f}x the median link rate over active time "
                               f"({_bps(lr[k])} vs {_bps(med)}): slow sender {ips[a]} or its link",
                })

    # -- incast -------------------------------------------------------------------------------
    busy = _offdiag(tot["busy_seconds"])
    degree = _safe_div(busy.sum(axis=0), fm.dst_busy_seconds)
    metrics["incast_degree"] = {ips[i]: float(degree[i]) for i in range(n) if np.isfinite(degree[i])}
    if np.isfinite(degree).any():
        med = float(np.nanmedian(degree))
        for i in np.argsort(-np.nan_to_num(degree, nan=-1.0)):
            d = degree[i]
            if not np.isfinite(d) or d < _t(thresholds, "incast.degree") or \
                    d < _t(thresholds, "incast.vs_median") * med:
                break
            senders = int((busy[:, i] > 0).sum())
            findings.append({
                "kind": "incast", "severity": "warning", "entities": [ips[i]],
                "evidence": {"degree": float(d), "median_degree": med, "senders": senders},
                "message": f"incast into {ips[i]}: {d:.1f} senders at once on average while it receives "
                           f"({senders} senders; fleet median {med:.1f})",
            })

    # -- congestion and loss --------------------------------------------------------------------
    pk = tot["packets"]
    ce_frac = _safe_div(tot["ce_packets"], pk)
    for i, j in np.argwhere(np.nan_to_num(ce_frac) >= _t(thresholds, "ecn_congestion.ce_fraction")):
        findings.append({
            "kind": "ecn_congestion", "severity": "warning", "entities": [ips[i], ips[j]],
            "evidence": {"ce_fraction": float(ce_frac[i, j]), "ce_packets": float(tot["ce_packets"][i, j])},
            "message": f"{ips[i]}->{ips[j]}: {100 * ce_frac[i, j]:.1f}% of packets CE-marked (congested path)",
        })
    cnp_to = tot["cnp_packets"].sum(axis=0)      # CNP pair src=receiver, dst=data sender
    for j in np.nonzero(cnp_to > 0)[0]:
        cnt = float(cnp_to[j])
        if fm.window_s:
            hit = cnt / fm.window_s >= _t(thresholds, "cnp_storm.per_second")
        else:
            hit = cnt >= _t(thresholds, "cnp_storm.min_count")
        if hit:
            from_ = [ips[i] for i in np.nonzero(tot["cnp_packets"][:, j] > 0)[0]]
            findings.append({
                "kind": "cnp_storm", "severity": "warning", "entities": [ips[j]] + from_,
                "evidence": {"cnp_packets": cnt, "per_second": cnt / fm.window_s if fm.window_s else None,
                             "from": from_},
                "message": f"{ips[j]} was told to slow down {cnt:.0f} times (CNPs from {', '.join(from_)})",
            })
    retx = tot["retransmitted_packets"]
    rf = _safe_div(retx, pk)
    for i, j in np.argwhere((retx > 0) & (np.nan_to_num(rf) >= _t(thresholds, "retransmissions.fraction"))):
        findings.append({
            "kind": "retransmissions", "severity": "critical", "entities": [ips[i], ips[j]],
            "evidence": {"retransmitted_packets": float(retx[i, j]), "fraction": float(rf[i, j]),
                         "psn_gaps": float(tot["psn_gaps"][i, j])},
            "message": f"{ips[i]}->{ips[j]}: {retx[i, j]:.0f} packets retransmitted ({100 * rf[i, j]:.2f}%): loss "
                       f"and go-back-N",
        })
    nak = sum(fm.naks.values())
    for i, j in np.argwhere(nak >= max(1, _t(thresholds, "nak_errors.count"))):
        findings.append({
            "kind": "nak_errors", "severity": "warning", "entities": [ips[i], ips[j]],
            "evidence": {s: float(fm.naks[s][i, j]) for s in fm.naks},
            "message": f"{ips[i]} sent {nak[i, j]:.0f} NAKs to {ips[j]}",
        })
    sev = {"critical": 0, "warning": 1, "info": 2}
    findings.sort(key=lambda f: sev.get(f["severity"], 3))
    return {"collectives": collectives, "timing": None, "findings": findings, "metrics": metrics}
