"""period_jitter: the iteration period of a training collective varies."""
from __future__ import annotations

import numpy as np

from skewscope.analysis.detectors import actions as A
from skewscope.analysis.detectors.common import pct, sev, us
from skewscope.analysis.detectors.registry import KEY_MEMBERS, Detector, Kind, Threshold
from skewscope.analysis.onset import series_onset

#: the median |period deviation| / period of iterations jittering with std = s x period is
#: about this x s (normal deviations): the per-iteration bar of the onset series
MEDIAN_ABS_DEV = 0.6745

PERIODIC = ("ring_allreduce", "tree_allreduce", "all_to_all")


def period_jitter(inp, em):
    t = inp.th["period_jitter"]
    for gi, g, r, ev in inp.groups:
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
               flows=g.flows, group=gi, onset=_onset(ev.bursts, r["period_s"] * 1e9, t["warning"]))


def _onset(bursts, period_ns, warn):
    """Per iteration: |its spacing to the next - the period| / the period; the stretch above
    warning x MEDIAN_ABS_DEV (series scan)."""
    if bursts is None or len(bursts[0]) < 3 or not period_ns:
        return None
    bs = np.asarray(bursts[0], dtype=np.float64)
    y = np.abs(np.diff(bs) - period_ns) / period_ns
    return series_onset(bs[:-1], y, worse=1, thr=warn * MEDIAN_ABS_DEV, t_end=bs[1:])


DETECTORS = [
    Detector(
        "period_jitter", period_jitter, needs=frozenset({"flows", "records", "groups"}), stage=20,
        doc="training groups: iteration period jitter",
        kinds=(Kind("period_jitter",
                    key=KEY_MEMBERS, headline=("jitter_ratio",), actions=(), role="symptom",
                    fires='ring/tree/all-to-all/pipeline with ≥ `min_iterations` (3) and period_jitter / period ≥ `warning` (5 %), critical 15 %',
                    blames='the members',
                    thresholds=(Threshold("warning", 0.05, "fraction", "period std / period: warning"),
                                Threshold("critical", 0.15, "fraction", "period std / period: critical"),
                                Threshold("min_iterations", 3, "count", "iterations seen, at least")),
                    onset="per iteration, the absolute difference of its spacing to the next and the period / the period; the stretch of "
                          "iterations above 0.67 × `warning` (the median deviation of a jitter that size; series scan)"),)),
]
