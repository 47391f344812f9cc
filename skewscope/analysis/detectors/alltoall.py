"""All-to-all volume skew: hot_destination, alltoall_destination_skew (MoE routing)."""
from __future__ import annotations

import numpy as np

from skewscope.analysis.detectors.common import pct, sev
from skewscope.analysis.detectors.registry import Detector, Kind, Threshold

_MIN_BYTES = Threshold("min_bytes", 1 << 20, "bytes", "all-to-all phase volume below which no skew is judged")


def alltoall(inp, em):
    for gi, g, r, _ in inp.groups:
        if g.kind == "all_to_all":
            _one(em, inp.ctx, g, r, inp.th, gi)


def _one(em, ctx, g, r, th, gi):
    ips = ctx.nodes.ips
    tot = float(np.sum(r.get("dest_bytes") or [0]))
    ds = r.get("dest_skew") or {}
    hot = r.get("hot_destination")
    if hot is None or not ds.get("max_over_mean"):
        return
    hot_i = ips.index(hot)
    gf = np.asarray(g.flows, dtype=np.int64)
    into_hot = gf[ctx.nodes.dst[gf] == hot_i].tolist()
    t = th["hot_destination"]
    if tot >= t["min_bytes"]:
        mom = ds["max_over_mean"]
        em.add("hot_destination", sev(mom, t["warning"], t["critical"]), [hot],
               f"{hot} receives {mom:.2f}x the mean all-to-all bytes "
               f"({pct(ds['max_share'])} of the phase, fair share {pct(1 / len(g.members))}): hot expert/rank; "
               "rebalance experts or check the router's load-balancing loss",
               {"max_over_mean": mom, "share": ds["max_share"], "cv": ds["cv"], "gini": ds["gini"],
                "jain": ds["jain"], "phase": r.get("dest_skew_phase"), "dest_bytes": r.get("dest_bytes"),
                "members": [ips[m] for m in g.members]}, flows=into_hot, group=gi)
    t = th["alltoall_destination_skew"]
    ps = r.get("per_source_dest_max_over_mean")
    if ps and tot >= t["min_bytes"]:
        em.add("alltoall_destination_skew", sev(ps, t["warning"], t["critical"]), [hot] + [ips[m] for m in g.members],
               f"all-to-all of {len(g.members)} nodes: senders put up to {ps:.2f}x their mean bytes on one "
               f"destination (hot: {hot}, {ds['max_over_mean']:.2f}x overall): MoE routing imbalance, the step "
               "waits for the slowest destination", {"per_source_max_over_mean": ps, "dest_max_over_mean": ds["max_over_mean"],
                                                      "dest_gini": ds["gini"], "dest_jain": ds["jain"],
                                                      "phase": r.get("dest_skew_phase"), "hot_destination": hot},
               flows=into_hot, group=gi)


DETECTORS = [
    Detector(
        "alltoall", alltoall, needs=frozenset({"flows", "groups"}), stage=20,
        doc="all-to-all groups: destination byte skew (whole group, and per source)",
        kinds=(
            Kind("alltoall_destination_skew",
                 fires='all-to-all ≥ `min_bytes`: the worst per-source destination max/mean in the most skewed phase ≥ `warning` (1.5), ≥ `critical` (3.0)',
                 blames='the hot destination, then the members',
                 thresholds=(Threshold("warning", 1.5, "ratio", "worst per-source max/mean bytes per destination: warning"),
                             Threshold("critical", 3.0, "ratio", "worst per-source max/mean bytes per destination: critical"),
                             _MIN_BYTES)),
            Kind("hot_destination",
                 fires='all-to-all: destination bytes max/mean (most skewed phase) ≥ `warning` 1.5 / `critical` 3.0',
                 blames='the hot node; flows into it',
                 thresholds=(Threshold("warning", 1.5, "ratio", "destination bytes max/mean (fleet: a typical source's "
                                       "bytes to it / to each other node): warning"),
                             Threshold("critical", 3.0, "ratio", "destination bytes max/mean: critical"),
                             _MIN_BYTES)),
        )),
]
