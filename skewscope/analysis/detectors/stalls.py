"""slow_link (mode stalls): a node whose messages stall both ways, as an outlier. Runs after
rates_and_lags (a node it already blamed for slow_link is not reported twice)."""
from __future__ import annotations

from skewscope.analysis.detectors.common import irregular, us
from skewscope.analysis.detectors.registry import Detector
from skewscope.analysis.onset import stall_onset


def stalls(inp, em):
    ips = inp.ctx.nodes.ips
    st = inp.ctx.fstat
    done = {tuple(f.entities.ips[:1]) for f in em.out if f.kind == "slow_link"}
    culprits, total, irr, one_host = inp.stall_culprits
    if irr:
        irregular(em, f"{total} data flows stall, " + ("in and out of this host at different times (one host's "
                                                        "view: its peers' pacing, not its port)" if one_host else
                                                        "spread over most nodes"), None)
    for m, fl in culprits:
        if (ips[m],) in done:
            continue
        em.add("slow_link", "warning", [m],
               f"messages to and from {ips[m]} stall (up to {us(float(st['stall_max_ns'][fl].max()))} on "
               f"{len(fl)} flows): its link pauses in both directions; check link flaps, error counters and PFC "
               "from that port",
               {"stalled_flows": int(len(fl)), "stall_s": float(st["stall_ns"][fl].sum()) / 1e9,
                "max_stall_s": float(st["stall_max_ns"][fl].max()) / 1e9, "mode": "stalls"}, flows=fl,
               onset=stall_onset(inp.ctx, fl, inp.th["slow_link"]["min_stall_s"] * 1e9))


DETECTORS = [
    Detector("stalls", stalls, emits=("slow_link", "sampling"), needs=frozenset({"flows", "records"}), stage=40,
                      doc="stalled messages concentrated on one node, both directions (evidence.stall_culprits)"),
]
