"""period_jitter: the iteration period of a training collective varies."""
from __future__ import annotations

from skewscope.analysis.detectors.common import pct, sev, us
from skewscope.analysis.detectors.registry import Detector, Kind, Threshold

PERIODIC = ("ring_allreduce", "tree_allreduce", "all_to_all")


def period_jitter(inp, em):
    t = inp.th["period_jitter"]
    for gi, g, r, _ in inp.groups:
        if r.get("decode"):
            continue                       # a decode group's cadence is decode_jitter's
        if not ((g.kind in PERIODIC or g.pattern == "pipeline") and r.get("period_s")
                and r.get("period_jitter_s") is not None and r.get("iterations", 0) >= t["min_iterations"]):
            continue
        rel = r["period_jitter_s"] / r["period_s"]
        em.add("period_jitter", sev(rel, t["warning"], t["critical"]), g.members,
               f"{g.kind} of {len(g.members)} nodes: iteration period {r['period_s'] * 1e3:.2f} ms jitters by "
               f"{pct(rel)} (std {us(r['period_jitter_s'] * 1e9)}): look for a rank with variable compute, "
               "data loading or host interference", {"period_s": r["period_s"], "period_jitter_s": r["period_jitter_s"],
                                                      "jitter_ratio": rel, "iterations": r["iterations"]},
               flows=g.flows, group=gi)


DETECTORS = [
    Detector(
        "period_jitter", period_jitter, needs=frozenset({"flows", "records", "groups"}), stage=20,
        doc="training groups: iteration period jitter",
        kinds=(Kind("period_jitter",
                    fires='ring/tree/all-to-all/pipeline with ≥ `min_iterations` (3) and period_jitter / period ≥ `warning` (5 %), critical 15 %',
                    blames='the members',
                    thresholds=(Threshold("warning", 0.05, "fraction", "period std / period: warning"),
                                Threshold("critical", 0.15, "fraction", "period std / period: critical"),
                                Threshold("min_iterations", 3, "count", "iterations seen, at least"))),)),
]
