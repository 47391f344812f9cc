"""What limits the analysis itself: map_overflow (counters / records incomplete) and sampling
(1-in-N, batched timestamps, no RoCE at all)."""
from __future__ import annotations

from skewscope.analysis.detectors import actions as A
from skewscope.analysis.detectors.registry import KEY_NONE, Detector, Kind, Threshold
from skewscope.core import layout as L

#: batched-timestamp messages are worth an info from this share of the multi-packet messages
FLAT_SHARE = 0.1


def caveats(inp, em):
    ctx = inp.ctx
    m = ctx.snap.meta
    g = ctx.snap.globals
    t = inp.th["map_overflow"]
    ev = int(m.get("flows_evicted", 0) or 0)
    lost = int(m.get("events_lost", 0) or 0) + int(m.get("events_dropped", 0) or 0)
    noslot = int(g[L.G_NO_FLOW_SLOT])
    if ev >= t["min_evicted"] or noslot:
        em.add("map_overflow", "warning", [],
               f"flow table full: {ev} flows evicted, {noslot} packets without a slot (max {m.get('max_flows', '?')} "
               "flows): per-flow counters are incomplete; capture with a larger --max-flows",
               {"flows_evicted": ev, "no_flow_slot": noslot, "max_flows": m.get("max_flows")})
    if lost >= t["min_lost"]:
        em.add("map_overflow", "warning", [],
               f"{lost} message records lost (record buffer overrun): timing, period and rate metrics are partial; "
               "capture a shorter window or raise the record buffer",
               {"message_records_lost": lost, "message_records": int(len(ctx.events))})
    fs = ctx.__dict__.get("_fstat")          # only when the records were analysed
    st = fs[0] if fs is not None else None
    d = ctx.data
    flat = int(st["n_flat"][d].sum()) if st is not None else 0
    timed = int(st["n_multi"][d].sum()) if st is not None else 0
    if flat and flat >= FLAT_SHARE * (flat + timed):
        em.add("sampling", "info", [],
               f"{flat} of {flat + timed} multi-packet messages have all their packets at one timestamp: the capture "
               "batched timestamps (coalescing/GRO on the capturing host); per-message rates use the other "
               f"{timed} only and are approximate",
               {"flat_messages": flat, "timed_messages": timed})
    n = int(m.get("sample_n", 1) or 1)
    if n > 1:
        em.add("sampling", "info", [],
               f"sampled 1 in {n}: counters are scaled by {n}, message records and timing cover the sampled flows only",
               {"sample_n": n})
    if g[L.G_FRAMES] and len(ctx.flows) == 0:
        em.add("sampling", "info", [], "no RoCE traffic in this capture: nothing to analyse",
               {"frames": int(g[L.G_FRAMES])})


DETECTORS = [
    Detector(
        "caveats", caveats, needs=frozenset({"flows"}), live=True, stage=80,
        doc="capture caveats from the snapshot's meta and global counters",
        kinds=(
            Kind("map_overflow",
                 key=KEY_NONE, headline=(), actions=(), role="context",
                 fires='flows evicted ≥ `min_evicted` or packets without a flow slot (warning: counters incomplete); message records lost ≥ `min_lost` (warning: timing partial)',
                 blames='—',
                 thresholds=(Threshold("min_evicted", 1, "count", "flows evicted from the flow table, at least"),
                             Threshold("min_lost", 1, "count", "message records lost, at least"))),
            Kind("sampling",
                 key=KEY_NONE, headline=(), actions=(), role="context",
                 fires='info: 1-in-N sampling in effect; ≥ 10 % of multi-packet messages with batched timestamps; no RoCE traffic at all',
                 blames='—'),
        )),
]
