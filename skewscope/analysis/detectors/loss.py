"""packet_loss / retransmissions / nak_errors, one finding per directed node pair (the path
to check), listing its flows."""
from __future__ import annotations

import numpy as np

from skewscope.analysis.detectors.common import by_pair, pct, qp_list
from skewscope.analysis.detectors.registry import Detector, Kind, Threshold
from skewscope.analysis.onset import resend_onset


def loss(inp, em):
    ctx, th = inp.ctx, inp.th
    cg = inp.congestion
    ips = ctx.nodes.ips
    fl = ctx.flows
    t = th["packet_loss"]
    for s, d, f in by_pair(ctx, np.nonzero(cg["psn_gaps"] >= max(1, t["min_gaps"]))[0]):
        gaps = float(cg["psn_gaps"][f].sum())
        skipped = float(cg["psn_skipped"][f].sum())
        lr, sk = cg["loss_rate"][f], cg["psn_skipped"][f]
        req = float(sum((sk[lr > 0] / lr[lr > 0]).tolist()))
        rate = skipped / req if req > 0 else 0.0
        severity = "critical" if rate >= t["critical"] else "warning"
        part = ctx.partner[f]
        naks = float(cg["nak_seq"][part[part >= 0]].sum())
        em.add("packet_loss", severity, [s, d],
               f"packet loss on {ips[s]} -> {ips[d]} (QP {qp_list(ctx, f)}): {int(gaps)} PSN gap(s), {int(skipped)} packets "
               f"missing ({pct(rate)}), go-back-N resends follow; RoCE needs a lossless fabric: check PFC/buffer "
               "config and link errors on that path",
               {"psn_gaps": gaps, "psn_skipped": skipped, "loss_rate": rate,
                "retransmissions": float(cg["retransmissions"][f].sum()), "naks_psn_sequence": naks,
                "flows": len(f)}, flows=f, onset=resend_onset(ctx, f, int(gaps)))
    t = th["retransmissions"]
    for s, d, f in by_pair(ctx, np.nonzero(cg["retransmissions"] >= max(1, t["min_packets"]))[0]):
        retx = float(cg["retransmissions"][f].sum())
        with_gap = bool((cg["psn_gaps"][f] > 0).all())
        em.add("retransmissions", "info" if with_gap else "warning", [s, d],
               f"{int(retx)} retransmitted packets on {ips[s]} -> {ips[d]} (QP {qp_list(ctx, f)})"
               + (" (go-back-N recovery of the loss above)" if with_gap else
                  ": losses after this observation point or ACK timeouts; check the receiver side of the path"),
               {"retransmissions": retx, "psn_gaps": float(cg["psn_gaps"][f].sum()), "flows": len(f)}, flows=f,
               onset=resend_onset(ctx, f, int(cg["psn_gaps"][f].sum()) or int(retx)))
    t = th["nak_errors"]
    tot = cg["nak_seq"] + cg["nak_rnr"] + cg["nak_other"]
    for s, d, f in by_pair(ctx, np.nonzero(tot >= max(1, t["min_naks"]))[0]):
        # NAKs travel responder -> requester: the data flows are the partners
        f = np.asarray(f)
        part = ctx.partner[f]
        data_flows = part[part >= 0].tolist()
        gaps = len(data_flows) > 0 and bool((cg["psn_gaps"][data_flows] > 0).all())
        seq, rnr, oth = (float(cg[k][f].sum()) for k in ("nak_seq", "nak_rnr", "nak_other"))
        if oth > 0:
            severity, why = "critical", "remote access / invalid request errors: an application or memory-registration bug"
        elif rnr > 0:
            severity, why = "warning", "receiver-not-ready: the receiver did not post buffers in time (slow consumer)"
        else:
            severity, why = ("info" if gaps else "warning"), ("PSN sequence errors from the loss above" if gaps else
                                                                "PSN sequence errors: packets lost before the receiver")
        em.add("nak_errors", severity, [d, s],
               f"{int(seq + rnr + oth)} NAK(s) from {ips[s]} to {ips[d]} (QP {qp_list(ctx, f)}): {why}",
               {"psn_sequence_error": seq, "rnr": rnr, "other": oth, "flows": len(f)}, flows=data_flows + f.tolist(),
               qps=sorted({int(q) for q in fl["dest_qp"][f]} | {int(q) for q in fl["dest_qp"][data_flows]}),
               onset=resend_onset(ctx, data_flows, int(seq + rnr + oth)))


DETECTORS = [
    Detector(
        "loss", loss, needs=frozenset({"flows"}), live=True, stage=60,
        doc="flow-table PSN gaps, retransmissions and NAKs per directed node pair",
        kinds=(
            Kind("packet_loss",
                 fires='per link: PSN gaps ≥ `min_gaps` (1); critical when PSNs skipped / requests ≥ `critical` (0.1 %)',
                 blames='src, dst; the lossy flows',
                 thresholds=(Threshold("min_gaps", 1, "count", "PSN gaps on a flow, at least"),
                             Threshold("critical", 1e-3, "fraction", "PSNs skipped / requests: critical")),
                 onset="the flow table counts losses without time, but a go-back-N resend stretches the message it hits: "
                       "the flows' N most stretched messages (N = the PSN gaps; wire time / what the flow's median message "
                       "rate predicts, ≥ 4 robust standard deviations above the flows' median, ≥ +1 %) as an episode "
                       "against the flows' data; none, or no records (live): generic"),
            Kind("retransmissions",
                 fires='per link: retransmitted packets ≥ `min_packets`; info when every flow also shows gaps (recovery of the loss above), else warning (loss after the observation point, timeouts)',
                 blames='src, dst',
                 thresholds=(Threshold("min_packets", 1, "count", "retransmitted packets on a flow, at least"),),
                 onset="as `packet_loss` (N = the PSN gaps, else the retransmitted packets)"),
            Kind("nak_errors",
                 fires='per link of NAK senders: NAKs ≥ `min_naks`; other syndromes (remote access / invalid request) critical, RNR warning, PSN sequence errors info when the data flow shows gaps, else warning',
                 blames='the requester, then the responder',
                 thresholds=(Threshold("min_naks", 1, "count", "NAKs on a flow, at least"),),
                 onset="as `packet_loss` (N = the NAKs), on the data flows the NAKs answer"),
        )),
]
