"""pipeline_bubbles: the slowest pipeline stage makes the others idle."""
from __future__ import annotations

import numpy as np

from skewscope.analysis.detectors import actions as A
from skewscope.analysis.detectors.common import pct, sev
from skewscope.analysis.detectors.registry import KEY_BLAMED, Detector, Kind, Threshold
from skewscope.analysis.intervals import break_candidates
from skewscope.analysis.onset import flow_events, series_onset
from skewscope.analysis.stats import median, unique

#: gaps between a stage's messages below this (ns) are never between two transfers
MIN_GAP_NS = 1000.0


def pipeline(inp, em):
    for gi, g, r, _ in inp.groups:
        if g.kind == "p2p" and g.pattern == "pipeline":
            _one(em, inp.ctx, g, r, inp.th, gi)


def _onset(ctx, flows):
    """The slow stage's compute time per micro-batch: per link it sends on (forward,
    backward), the gaps between its transfers (its messages' spacings above their lowest
    natural break: inside a transfer messages go back to back), each over the link's median
    gap (the two directions compute differently); the stretch of longer ones over both
    (series scan, no threshold)."""
    idx = flow_events(ctx, flows)
    if len(idx) < 4:
        return None
    dst = ctx.nodes.dst[ctx.ev_flow[idx]]
    ts, ys = [], []
    for d in unique(dst):
        k = idx[dst == d]
        st, en = ctx.ev_start[k], ctx.ev_end[k]
        gap = st[1:] - np.maximum.accumulate(en)[:-1]
        cand = break_candidates(gap[gap > 0], 3.0, MIN_GAP_NS) if (gap > 0).any() else []
        if not cand:
            continue
        big = np.flatnonzero(gap > min(cand))    # the lowest break: messages of one transfer below it
        if len(big) < 2:
            continue
        ts.append(st[big + 1])
        ys.append(gap[big] / float(median(gap[big])))
    if not ts:
        return None
    return series_onset(np.concatenate(ts), np.concatenate(ys), worse=1, first=float(ctx.ev_start[idx[0]]))


def _one(em, ctx, g, r, th, gi):
    t = th["pipeline_bubbles"]
    sl = r.get("slowest_stage")
    bub = r.get("bubble_fraction")
    if not sl or bub is None:
        return
    ratio = sl["compute_ratio"]
    severity = sev(ratio, t["warning"], t["critical"])
    if severity is None or bub < t["min_bubble"]:
        return
    node = ctx.nodes.ips.index(sl["ip"])
    flows = [f for f in g.flows if ctx.nodes.src[f] == node]
    em.add("pipeline_bubbles", severity, [sl["ip"]] + r["stages"],
           f"pipeline stage {sl['stage']} ({sl['ip']}) takes {ratio:.2f}x the median stage time: the other stages "
           f"idle {pct(bub)} of the steady state (bubbles); rebalance layers across stages or check that host",
           {"stage": sl["stage"], "compute_ratio": ratio, "bubble_fraction": bub,
            "fill_drain_bubble": r.get("fill_drain_bubble"), "stage_compute_fwd_s": r.get("stage_compute_fwd_s"),
            "link_idle_fraction": r.get("link_idle_fraction")}, flows=flows, group=gi, onset=_onset(ctx, flows))


DETECTORS = [
    Detector(
        "pipeline", pipeline, needs=frozenset({"flows", "records", "groups"}), stage=20,
        doc="pipeline groups: the slowest stage's compute time and the bubbles it causes",
        kinds=(Kind("pipeline_bubbles",
                    key=KEY_BLAMED, headline=("bubble_fraction",), actions=(A.CHECK_NODE,), role="cause",
                    fires='pipeline: slowest stage compute / median ≥ `warning` 1.5 (critical 3.0) and `bubble_fraction` ≥ `min_bubble` (0.1)',
                    blames='the slow stage, then the stages',
                    thresholds=(Threshold("warning", 1.5, "ratio", "slowest stage compute / the median stage: warning"),
                                Threshold("critical", 3.0, "ratio", "slowest stage compute / the median stage: critical"),
                                Threshold("min_bubble", 0.1, "fraction", "steady-state idle share of the other stages, at least")),
                    onset="the slow stage's compute time per micro-batch: per link it sends on, the gaps between its "
                          "transfers (its messages' spacings above their lowest natural break) over the link's median gap; "
                          "the stretch of longer ones (series scan, no threshold: ≥ 20 % longer)"),)),
]
