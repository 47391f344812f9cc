"""incast: many senders into one destination at once, with queueing evidence."""
from __future__ import annotations

import numpy as np

from skewscope.analysis.detectors import actions as A
from skewscope.analysis.detectors.common import us
from skewscope.analysis.detectors.registry import KEY_BLAMED, Detector, Kind, Threshold
from skewscope.analysis.onset import incast_onset
from skewscope.analysis.stats import median

#: flows into the destination at <= this x their rate elsewhere: severe throttling (critical)
SEVERE_THROTTLE = 0.25
#: this many times incast.min_senders at once is critical by itself
CRITICAL_SENDERS_FACTOR = 2
#: the typical destination's peak is taken as at least one sender (a fleet of idle
#: destinations does not make two senders an incast)
MIN_TYPICAL_PEAK = 1.0
#: a destination is compared with the others: at least this many receiving destinations
MIN_DESTINATIONS = 2


def incast(inp, em):
    """a destination with >= incast.min_senders senders at once, >= incast.ratio x the
    typical destination's peak, for >= incast.min_time_s, AND queueing evidence: its
    senders' flows into it run at <= incast.throttle x their rate to other destinations
    (when they have others), else the senders form a many-to-one pattern."""
    ctx, th = inp.ctx, inp.th
    inc = inp.incast
    if inc is None:
        return
    t = th["incast"]
    mx = inc["max_senders"].astype(np.float64)
    recv = inc["active_ns"] > 0
    if recv.sum() < MIN_DESTINATIONS:
        return
    med = float(median(mx[recv]))
    st = ctx.fstat
    data = np.nonzero(ctx.data)[0]
    rate = st["rate_med_bps"]
    for n in np.nonzero(recv)[0]:
        if mx[n] < t["min_senders"] or mx[n] < t["ratio"] * max(med, MIN_TYPICAL_PEAK) or inc["at_max_ns"][n] < t["min_time_s"] * 1e9:
            continue
        senders = inp.incast_senders.get(int(n), [])
        dsrc, ddst = ctx.nodes.src[data], ctx.nodes.dst[data]
        into_n = ddst == n
        flows = data[into_n].tolist()
        fin = np.isfinite(rate[data])
        ratios = []
        for sn in senders:
            mine = dsrc == sn
            into = data[mine & into_n & fin]
            other = data[mine & ~into_n & fin]
            if len(into) and len(other):
                ratios.append(float(median(rate[into])) / max(1.0, float(median(rate[other]))))
        throttle = float(median(ratios)) if ratios else None
        back = set(ddst[dsrc == n].tolist())
        star = len(senders) >= t["min_senders"] and not (set(senders) & back)
        if throttle is not None and throttle > t["throttle"]:
            continue
        if throttle is None and not star:
            continue
        stalled = inp.stalls["in_stall_n"][n] > 0
        severity = "critical" if stalled or mx[n] >= CRITICAL_SENDERS_FACTOR * t["min_senders"] or \
            (throttle is not None and throttle <= SEVERE_THROTTLE) else "warning"
        em.add("incast", severity, [int(n)] + list(senders),
               f"incast into {ctx.nodes.ips[n]}: {int(mx[n])} senders at once (typical destination: {med:.0f}) for "
               f"{us(inc['at_max_ns'][n])}"
               + (f", their flows into it run at {throttle:.2f}x their rate elsewhere" if throttle is not None else "")
               + ": its switch port queues; stagger the senders or spread the destination",
               {"max_senders": int(mx[n]), "median_max_senders": med, "time_at_max_s": float(inc["at_max_ns"][n]) / 1e9,
                "time_multi_s": float(inc["multi_ns"][n]) / 1e9, "mean_senders": float(inc["mean_senders"][n]),
                "throttle_ratio": throttle}, flows=flows, onset=incast_onset(ctx, int(n), int(t["min_senders"])))


DETECTORS = [
    Detector(
        "incast", incast, needs=frozenset({"flows", "records"}), stage=30,
        doc="destinations with many concurrent senders whose flows into it are throttled",
        kinds=(
            Kind("incast",
                 key=KEY_BLAMED, headline=("max_senders", "throttle_ratio"), actions=(A.SPREAD_INCAST_SENDERS,),
                 role="cause", seen_by="busy_seconds",
                 fires="a destination with ≥ `min_senders` (4) senders at once, ≥ `ratio` (2) × the typical destination's peak, for ≥ `min_time_s` (5 µs), and queueing evidence: its senders' flows into it run at ≤ `throttle` (0.7) × their rate elsewhere (or, without other flows, a many-to-one pattern). Critical with stalls, ≥ 2 × `min_senders`, or throttle ≤ 0.25",
                 blames='the destination, then the senders',
                 thresholds=(Threshold("min_senders", 4, "count", "senders at once into one destination (fleet: mean "
                                       "concurrent senders while it receives)"),
                             Threshold("ratio", 2.0, "ratio", "senders at once: at least this many times the typical destination's peak"),
                             Threshold("min_time_s", 5e-6, "s", "time spent at that many senders"),
                             Threshold("throttle", 0.7, "ratio", "the senders' rate into it / their rate elsewhere, at most")),
                 onset="the spans with ≥ `min_senders` senders into it at once (a sender's messages merged across "
                       "gaps < 1 µs) as an episode against the data into it"),
        )),
]
