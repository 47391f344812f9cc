"""pfc_pause: PFC pause frames per priority, and the receiver they likely pause."""
from __future__ import annotations

import numpy as np

from skewscope.analysis.detectors import actions as A
from skewscope.analysis.detectors.common import pct, us
from skewscope.analysis.detectors.registry import KEY_MEMBERS, Detector, Kind, Threshold
from skewscope.analysis.onset import stall_onset

#: the likely paused receivers named, at most
MAX_SUSPECTS = 3
#: an inbound stall counts as a pause only when it lasts this many pause quanta (the longest
#: single pause) or more
MIN_STALL_QUANTA = 2


def pfc(inp, em):
    ctx = inp.ctx
    t = inp.th["pfc_pause"]
    pf = inp.pfc
    ips = ctx.nodes.ips
    st = inp.stalls
    # the paused receivers: inbound stalls without outbound ones
    score = st["in_stall_ns"] - st["out_stall_ns"]
    q = max([p["pause_s"] / max(1, p["pause_frames"]) for p in pf["per_priority"]
             if p["pause_frames"] and p["pause_s"]] or [0.0]) * 1e9
    floor = max(MIN_STALL_QUANTA * q, t["min_stall_s"] * 1e9)
    suspects = [int(n) for n in np.argsort(-score) if score[n] > 0 and st["in_stall_max_ns"][n] >= floor][:MAX_SUSPECTS]
    into = np.nonzero(ctx.data & np.isin(ctx.nodes.dst, suspects))[0]
    # when: PFC frames carry no time in the counters; the stalls they cause into the paused
    # receivers do
    onset = stall_onset(ctx, into, floor) if suspects else None
    for p in pf["per_priority"]:
        if p["pause_frames"] < t["min_frames"]:
            continue
        frac = p["pause_fraction"]
        severity = "critical" if frac is not None and frac >= t["critical"] else "warning"
        who = (f"; traffic into {', '.join(ips[s] for s in suspects)} stalls meanwhile (the likely paused port)"
               if suspects else "")
        em.add("pfc_pause", severity, suspects,
               f"{p['pause_frames']} PFC pause frames on priority {p['priority']}"
               + (f" ({us(p['pause_s'] * 1e9)} of pause at {pf['link_gbps_est']:.0f} Gb/s, up to {pct(frac)} of the capture)"
                  if p["pause_s"] is not None else "") + who
               + ": a receiver's buffers fill up; find the congested port (ECN/CNP findings) and check PFC headroom",
               {"priority": p["priority"], "pause_frames": p["pause_frames"], "resume_frames": p["resume_frames"],
                "quanta": p["quanta"], "pause_s": p["pause_s"], "pause_fraction": frac,
                "link_gbps_est": pf["link_gbps_est"]},
               flows=into, onset=onset)
    if pf["global_pause_frames"] >= t["min_frames"]:
        em.add("pfc_pause", "warning", [], f"{pf['global_pause_frames']} 802.3x global pause frames: a link pauses all "
               "traffic; RoCE should use per-priority PFC", {"global_pause_frames": pf["global_pause_frames"]})


DETECTORS = [
    Detector(
        "pfc", pfc, needs=frozenset({"flows"}), live=True, stage=70,
        doc="PFC/802.3x pause counters; pause time and the paused port when message records give a link speed and stalls",
        kinds=(Kind("pfc_pause",
                    key=KEY_MEMBERS, headline=("pause_fraction",), actions=(A.CHECK_NODE,),
                    role="symptom", figure="pfc_per_priority",
                    fires='pause frames of a priority ≥ `min_frames`; critical when pause time ≥ `critical` (5 %) of the capture. The paused port is named when traffic into it stalled (inbound stalls ≥ max(2 pause quanta, `min_stall_s`) without outbound ones), else entities are empty. Also 802.3x global pauses',
                    blames='the likely paused receiver',
                    thresholds=(Threshold("min_frames", 1, "count", "pause frames of a priority, at least"),
                                Threshold("critical", 0.05, "fraction", "pause time / capture duration: critical"),
                                Threshold("link_gbps", 0, "Gb/s", "link speed for pause time (0: estimate from the rates)"),
                                Threshold("min_stall_s", 20e-6, "s", "inbound stall naming the paused receiver, at least")),
                    onset="the stalled messages (≥ the naming floor) into the paused receivers as an episode against "
                          "their data (pause frames are counted without time); no paused receiver named: null"),)),
]
