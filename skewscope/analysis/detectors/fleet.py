"""Fleet detectors on node-level matrices (`skewscope cluster`, analysis/fleet.py has the
matrix definitions): the same finding kinds and Finding schema as the single-node path,
entities.ips = IP strings (the blamed node first), entities.flows = the node pairs
[src, dst, null] as in the cluster document's flows[] rows, qps = [], group = null.

Where a fleet detector asks the single-node question it reads the single-node threshold
(hot_destination.warning/critical, ring_straggler.warning/critical, incast.min_senders/
ratio); its own numbers are registered as `extra` thresholds (scope fleet)."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from skewscope.analysis.detectors.common import Emitter
from skewscope.analysis.detectors.registry import Detector, Threshold, detectors, kinds, resolve_thresholds
from skewscope.analysis.fleet import (
    all_to_all_groups,
    class_bytes,
    destination_preference,
    find_rings,
    fmt_bps,
    offdiag,
    rate_over_active,
    safe_div,
)
from skewscope.analysis.stats import robust_ratio_to_median, skew_rows, skew_stats


@dataclass
class FleetInputs:
    """A FleetMatrix, the thresholds, and the document parts the detectors fill."""
    fm: Any                                    # outputs.cluster.FleetMatrix
    th: dict
    metrics: dict = field(default_factory=dict)
    collectives: list = field(default_factory=list)

    @cached_property
    def ips(self):
        return self.fm.ips

    @cached_property
    def chunk_b(self):
        return class_bytes(self.fm, "chunk")

    @cached_property
    def bulk_b(self):
        return class_bytes(self.fm, "bulk")

    @cached_property
    def data_b(self):
        return self.bulk_b + self.chunk_b

    @cached_property
    def hot_b(self):
        # over the all-to-all (chunk) traffic when there is any: ring/tree volumes are equal
        # by construction and would only dilute an expert's skew; else over all data
        return self.chunk_b if self.chunk_b.sum() > 0 else self.data_b


def hot_destination(inp, em):
    ips, th, n = inp.ips, inp.th, len(inp.ips)
    hot_b = inp.hot_b
    inbound = hot_b.sum(axis=0)
    outbound = hot_b.sum(axis=1)
    recv = np.nonzero(inbound > 0)[0]
    dst_stats = skew_stats(inbound[recv]) if len(recv) else skew_stats([])
    inp.metrics["traffic_matrix"] = {"ips": ips, "data_bytes": inp.data_b.tolist()}
    inp.metrics["destination_skew"] = dst_stats
    inp.metrics["source_skew"] = skew_stats(outbound[outbound > 0])
    pref = destination_preference(hot_b)
    inp.metrics["destination_preference"] = {ips[j]: float(pref[j]) for j in range(n) if np.isfinite(pref[j])}
    t = th["hot_destination"]
    if len(recv) >= t["min_nodes"] and np.isfinite(pref).any():
        j = int(np.nanargmax(pref))
        p = float(pref[j])
        if p >= t["warning"]:
            hot = ips[j]
            share = float(inbound[j] / inbound.sum()) if inbound.sum() > 0 else None
            srcs = np.nonzero(hot_b[:, j] > 0)[0]
            em.add_fleet("hot_destination", "critical" if p >= t["critical"] else "warning", [hot],
                         f"hot destination {hot}: a typical source sends it {p:.2f}x what it sends each other "
                         f"node ({len(srcs)} sources); in a MoE job, the node of a hot expert",
                         {"preference": p, "inbound_share": share, "inbound_max_over_mean": dst_stats["max_over_mean"],
                          "senders": int(len(srcs)), "destinations": len(recv),
                          "traffic": "chunk" if hot_b is inp.chunk_b else "data"},
                         pairs=[(ips[i], hot) for i in srcs])


def alltoall(inp, em):
    ips = inp.ips
    chunk_b = inp.chunk_b
    t = inp.th["alltoall_destination_skew"]
    for g in all_to_all_groups(chunk_b > 0, np.zeros_like(inp.bulk_b > 0)):
        sub = chunk_b[np.ix_(g, g)]
        mask = ~np.eye(len(g), dtype=bool)
        rows = skew_rows(sub, mask)
        col = skew_stats(sub.sum(axis=0))
        inp.collectives.append({"kind": "all_to_all", "members": [ips[i] for i in g], "confidence": 0.8,
                                "metrics": {"destination_skew": col, "per_source_max_over_mean":
                                            [r["max_over_mean"] for r in rows]}})
        worst = [(r["max_over_mean"] or 0.0, k, r) for k, r in enumerate(rows)
                 if (r["n"] or 0) >= t["min_destinations"]]
        skewed = [w for w in worst if w[0] >= t["max_over_mean"]]
        if skewed:
            # the destination most sources over-send to
            hot_cols = [g[int(r["argmax"])] for _, _, r in skewed]
            hot = max(set(hot_cols), key=hot_cols.count)
            srcs = [ips[g[k]] for _, k, _ in skewed]
            top = max(w[0] for w in skewed)
            em.add_fleet("alltoall_destination_skew", "warning", [ips[hot]] + [s for s in srcs if s != ips[hot]],
                         f"all-to-all destination skew up to {top:.2f}x: {len(skewed)} of {len(g)} sources send "
                         f"most to {ips[hot]}",
                         {"max_over_mean": top, "sources_skewed": len(skewed), "sources": len(g),
                          "hot_destination": ips[hot], "group": [ips[i] for i in g]},
                         pairs=[(s, ips[hot]) for s in srcs if s != ips[hot]])


#: a ring straggler is judged against the ring's median only with at least this many links
MIN_RING_LINKS = 3


def rings(inp, em):
    ips = inp.ips
    t = inp.th["ring_straggler"]
    rate = rate_over_active(inp.fm, "bulk")
    for ring in find_rings(inp.bulk_b > 0):
        links = [(ring[k], ring[(k + 1) % len(ring)]) for k in range(len(ring))]
        lr = np.array([rate[a, c] for a, c in links])
        score = robust_ratio_to_median(lr)
        med = float(np.nanmedian(lr)) if np.isfinite(lr).any() else None
        inp.collectives.append({"kind": "ring_allreduce", "members": [ips[i] for i in ring], "confidence": 0.8,
                                "metrics": {"link_rate_bps": [None if not np.isfinite(x) else float(x) for x in lr],
                                            "median_rate_bps": med,
                                            "straggler_score": [None if not np.isfinite(x) else float(x)
                                                                for x in score]}})
        if len(ring) >= MIN_RING_LINKS and np.isfinite(score).any():
            k = int(np.nanargmin(score))
            s = float(score[k])
            if s < t["warning"]:
                a, c = links[k]
                em.add_fleet("ring_straggler", "critical" if s < t["critical"] else "warning", [ips[a], ips[c]],
                             f"ring link {ips[a]}->{ips[c]} at {s:.2f}x the median link rate over active time "
                             f"({fmt_bps(lr[k])} vs {fmt_bps(med)}): slow sender {ips[a]} or its link",
                             {"link": [ips[a], ips[c]], "rate_bps": float(lr[k]), "median_rate_bps": med,
                              "score": s, "ring": [ips[i] for i in ring]},
                             pairs=[(ips[a], ips[c])])


def incast(inp, em):
    fm, ips, n = inp.fm, inp.ips, len(inp.ips)
    t = inp.th["incast"]
    busy = offdiag(fm.pair["busy_seconds"])
    degree = safe_div(busy.sum(axis=0), fm.dst_busy_seconds)
    inp.metrics["incast_degree"] = {ips[i]: float(degree[i]) for i in range(n) if np.isfinite(degree[i])}
    if not np.isfinite(degree).any():
        return
    med = float(np.nanmedian(degree))
    for i in np.argsort(-np.nan_to_num(degree, nan=-1.0)):
        d = degree[i]
        if not np.isfinite(d) or d < t["min_senders"] or d < t["ratio"] * med:
            break
        srcs = np.nonzero(busy[:, i] > 0)[0]
        em.add_fleet("incast", "warning", [ips[i]],
                     f"incast into {ips[i]}: {d:.1f} senders at once on average while it receives "
                     f"({len(srcs)} senders; fleet median {med:.1f})",
                     {"degree": float(d), "median_degree": med, "senders": int(len(srcs))},
                     pairs=[(ips[s], ips[i]) for s in srcs])


def congestion(inp, em):
    fm, ips, th = inp.fm, inp.ips, inp.th
    tot = fm.pair
    ce_frac = safe_div(tot["ce_packets"], tot["packets"])
    for i, j in np.argwhere(np.nan_to_num(ce_frac) >= th["ecn_congestion"]["ce_fraction"]):
        em.add_fleet("ecn_congestion", "warning", [ips[i], ips[j]],
                     f"{ips[i]}->{ips[j]}: {100 * ce_frac[i, j]:.1f}% of packets CE-marked (congested path)",
                     {"ce_fraction": float(ce_frac[i, j]), "ce_packets": float(tot["ce_packets"][i, j])},
                     pairs=[(ips[i], ips[j])])
    t = th["cnp_storm"]
    cnp_to = tot["cnp_packets"].sum(axis=0)      # CNP pair src=receiver, dst=data sender
    for j in np.nonzero(cnp_to > 0)[0]:
        cnt = float(cnp_to[j])
        if fm.window_s:
            hit = cnt / fm.window_s >= t["per_second"]
        else:
            hit = cnt >= t["min_count"]
        if hit:
            from_ = [ips[i] for i in np.nonzero(tot["cnp_packets"][:, j] > 0)[0]]
            em.add_fleet("cnp_storm", "warning", [ips[j]] + from_,
                         f"{ips[j]} was told to slow down {cnt:.0f} times (CNPs from {', '.join(from_)})",
                         {"cnp_packets": cnt, "per_second": cnt / fm.window_s if fm.window_s else None, "from": from_},
                         pairs=[(s, ips[j]) for s in from_])


def loss(inp, em):
    fm, ips, th = inp.fm, inp.ips, inp.th
    tot = fm.pair
    retx = tot["retransmitted_packets"]
    rf = safe_div(retx, tot["packets"])
    for i, j in np.argwhere((retx > 0) & (np.nan_to_num(rf) >= th["retransmissions"]["fraction"])):
        em.add_fleet("retransmissions", "critical", [ips[i], ips[j]],
                     f"{ips[i]}->{ips[j]}: {retx[i, j]:.0f} packets retransmitted ({100 * rf[i, j]:.2f}%): loss "
                     f"and go-back-N",
                     {"retransmitted_packets": float(retx[i, j]), "fraction": float(rf[i, j]),
                      "psn_gaps": float(tot["psn_gaps"][i, j])},
                     pairs=[(ips[i], ips[j])])
    nak = sum(fm.naks.values())
    for i, j in np.argwhere(nak >= max(1, th["nak_errors"]["count"])):
        em.add_fleet("nak_errors", "warning", [ips[i], ips[j]], f"{ips[i]} sent {nak[i, j]:.0f} NAKs to {ips[j]}",
                     {s: float(fm.naks[s][i, j]) for s in fm.naks}, pairs=[(ips[i], ips[j])])


_FLEET = frozenset({"fleet"})
DETECTORS = [
    Detector("fleet_hot_destination", hot_destination, emits=("hot_destination",), needs=_FLEET, stage=10,
             doc="destination preference of a typical source (metrics: traffic_matrix, destination/source skew)",
             extra=(("hot_destination", Threshold("min_nodes", 3, "count",
                                                  "destinations receiving, at least")),)),
    Detector("fleet_alltoall", alltoall, emits=("alltoall_destination_skew",), needs=_FLEET, stage=20,
             doc="all-to-all groups of mutual chunk pairs: per-source destination skew",
             extra=(("alltoall_destination_skew", Threshold("max_over_mean", 2.0, "ratio",
                                                            "a source's max/mean bytes per destination")),
                    ("alltoall_destination_skew", Threshold("min_destinations", 3, "count",
                                                            "destinations of that source, at least")))),
    Detector("fleet_rings", rings, emits=("ring_straggler",), needs=_FLEET, stage=30,
             doc="rings of bulk pairs: link rate over active time / the ring median"),
    Detector("fleet_incast", incast, emits=("incast",), needs=_FLEET, stage=40,
             doc="incast degree: sum of pair busy time into a destination / its busy time"),
    Detector("fleet_congestion", congestion, emits=("ecn_congestion", "cnp_storm"), needs=_FLEET, stage=50,
             doc="CE fraction per pair; CNPs per throttled sender",
             extra=(("ecn_congestion", Threshold("ce_fraction", 0.01, "fraction", "CE / packets of a pair")),
                    ("cnp_storm", Threshold("per_second", 5000.0, "1/s",
                                            "CNPs per second telling one sender to slow down")),
                    ("cnp_storm", Threshold("min_count", 100, "count",
                                            "window 'all': CNPs to one sender (a count instead of a rate)")))),
    Detector("fleet_loss", loss, emits=("retransmissions", "nak_errors"), needs=_FLEET, stage=60,
             doc="retransmitted fraction and NAKs per pair",
             extra=(("retransmissions", Threshold("fraction", 0.001, "fraction",
                                                  "retransmitted / packets of a pair")),
                    ("nak_errors", Threshold("count", 1, "count", "NAKs on a pair, at least")))),
]

_SEV_ORDER = {"critical": 0, "warning": 1, "info": 2}


def analyze_matrix(fm, thresholds=None) -> dict:
    """{"collectives", "timing": None, "findings", "metrics"} for a fleet matrix; thresholds:
    overrides as for analyze() over the fleet scope (resolve_thresholds(scope="fleet"))."""
    th = resolve_thresholds(thresholds, scope="fleet")
    metrics: dict = {"nodes": len(fm.ips)}
    if len(fm.ips) == 0:
        return {"collectives": [], "timing": None, "findings": [], "metrics": metrics}
    inp = FleetInputs(fm, th, metrics)
    em = Emitter(None, set(kinds("fleet")))
    for d in detectors("fleet"):
        d.fn(inp, em)
    fs = sorted(em.out, key=lambda f: _SEV_ORDER.get(f.severity, 3))
    return {"collectives": inp.collectives, "timing": None, "findings": [f.to_dict() for f in fs],
            "metrics": metrics}
