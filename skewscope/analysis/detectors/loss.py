"""packet_loss / retransmissions / nak_errors, one finding per directed node pair (the path
to check), listing its flows."""
from __future__ import annotations

import numpy as np

from skewscope.analysis.detectors import actions as A
from skewscope.analysis.detectors.common import by_pair, pct, qp_list
from skewscope.analysis.detectors.registry import KEY_LINK, Detector, Kind, Threshold
from skewscope.analysis.onset import resend_onset
from skewscope.core import layout as L


def _requests(ctx, f) -> float:
    """Request packets (SEND, WRITE, READ request, atomic) of flows f, as the counters count
    them (unscaled)."""
    op = ctx.cols["op"][np.asarray(f, dtype=np.int64)]
    return float((op[:, L.OPC_SEND] + op[:, L.OPC_WRITE] + op[:, L.OPC_READ_REQ] + op[:, L.OPC_ATOMIC]).sum())


def _request_col(ctx, f) -> np.ndarray:
    """Request packets of each of flows f (_requests' columns; only those rows: the
    op matrix's strided columns over every flow cost 6 ms at 1,048,576 flows)."""
    op = ctx.cols["op"][f]
    return op[:, L.OPC_SEND] + op[:, L.OPC_WRITE] + op[:, L.OPC_READ_REQ] + op[:, L.OPC_ATOMIC]


def _flat(groups):
    """by_pair's groups' flows end to end and where each group starts."""
    if not groups:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    sizes = [len(g[2]) for g in groups]
    flat = np.fromiter((i for g in groups for i in g[2]), np.int64, sum(sizes))
    return flat, np.cumsum([0] + sizes[:-1])


def _sums(col, starts) -> np.ndarray:
    """Per-group sums of col (groups from _flat; none: empty)."""
    return np.add.reduceat(col, starts) if len(starts) else col[:0]


def impact_severity(events: float, share: float, t: dict) -> str:
    """A loss-type symptom's severity by what it costs: `critical` when its share of the
    link's requests is >= t["critical"]; `warning` when it is measurable: >= t["warning"] of
    the requests and >= t["warning_events"] events; else `info` (one resend or NAK in a long
    run costs nothing measurable: a line, not a page)."""
    if share >= t["critical"]:
        return "critical"
    if share >= t["warning"] and events >= t["warning_events"]:
        return "warning"
    return "info"


def _share(x: float) -> str:
    """A small share with two significant digits (0.051%, not pct's 0.1%)."""
    return f"{100 * x:.2g}%" if x < 0.01 else pct(x)


def loss(inp, em):
    ctx, th = inp.ctx, inp.th
    cg = inp.congestion
    ips = ctx.nodes.ips
    fl = ctx.flows
    raw_retx = ctx.cols["retransmissions"]
    # every pair's sums at once: the summed columns are counts (x the integer sampling
    # factor), so np.add.reduceat's sums are exact and equal to each pair's own .sum()
    t = th["packet_loss"]
    groups = by_pair(ctx, np.nonzero(cg["psn_gaps"] >= max(1, t["min_gaps"]))[0])
    flat, starts = _flat(groups)
    part = ctx.partner[flat]
    lr = cg["loss_rate"][flat]
    # (the requests behind the skipped packets: skipped / loss rate of the flows that lost,
    # summed in flow order as before; a 0.0 term for the others leaves a sum unchanged)
    q = np.zeros(len(flat))
    q[lr > 0] = cg["psn_skipped"][flat][lr > 0] / lr[lr > 0]
    q = q.tolist()
    gaps_g, skipped_g, retx_g = (_sums(cg[k][flat], starts) for k in ("psn_gaps", "psn_skipped", "retransmissions"))
    nreq_g = _sums(_request_col(ctx, flat), starts)
    raw_g = _sums(ctx.cols["psn_skipped"][flat] + raw_retx[flat], starts)
    naks_g = _sums(np.where(part >= 0, cg["nak_seq"][np.maximum(part, 0)], 0.0), starts)
    bounds = starts.tolist() + [len(flat)]
    for k, (s, d, f) in enumerate(groups):
        gaps, skipped = float(gaps_g[k]), float(skipped_g[k])
        req = float(sum(q[bounds[k]:bounds[k + 1]]))
        rate = skipped / req if req > 0 else 0.0
        # what the loss cost: the packets missing and resent (go-back-N) / the link's requests
        cost = float(raw_g[k]) / max(1.0, float(nreq_g[k]))
        if rate >= t["critical"]:
            severity = "critical"
        else:
            severity = impact_severity(gaps, cost, {"critical": np.inf, "warning": t["warning"],
                                                    "warning_events": t["warning_events"]})
            if severity == "info" and gaps >= t["warning_events"]:
                severity = "warning"                     # repeated loss events: a lossy path
        naks = float(naks_g[k])
        em.add("packet_loss", severity, [s, d],
               f"packet loss on {ips[s]} -> {ips[d]} (QP {qp_list(ctx, f)}): {int(gaps)} PSN gap(s), {int(skipped)} packets "
               f"missing ({pct(rate)}), go-back-N resends follow; RoCE needs a lossless fabric: check PFC/buffer "
               "config and link errors on that path"
               + (f" (one loss event, its resends {_share(cost)} of the link's packets: no measurable cost)"
                  if severity == "info" else ""),
               {"psn_gaps": gaps, "psn_skipped": skipped, "loss_rate": rate,
                "retransmissions": float(retx_g[k]), "naks_psn_sequence": naks,
                "flows": len(f), "resent_share": cost}, flows=f, onset=resend_onset(ctx, f, int(gaps)))
    t = th["retransmissions"]
    groups = by_pair(ctx, np.nonzero(cg["retransmissions"] >= max(1, t["min_packets"]))[0])
    flat, starts = _flat(groups)
    retx_g, gaps_g = _sums(cg["retransmissions"][flat], starts), _sums(cg["psn_gaps"][flat], starts)
    raw_g, nreq_g = _sums(raw_retx[flat], starts), _sums(_request_col(ctx, flat), starts)
    nogap_g = _sums((cg["psn_gaps"][flat] <= 0).astype(np.int64), starts)
    for k, (s, d, f) in enumerate(groups):
        retx = float(retx_g[k])
        with_gap = bool(nogap_g[k] == 0)
        share = float(raw_g[k]) / max(1.0, float(nreq_g[k]))
        severity = "info" if with_gap else impact_severity(float(raw_g[k]), share, t)
        em.add("retransmissions", severity, [s, d],
               f"{int(retx)} retransmitted packets on {ips[s]} -> {ips[d]} (QP {qp_list(ctx, f)})"
               + (" (go-back-N recovery of the loss above)" if with_gap else
                  ": losses after this observation point or ACK timeouts; check the receiver side of the path"
                  + (f" ({_share(share)} of its packets: no measurable cost)" if severity == "info" else
                     f" ({_share(share)} of its packets resent)")),
               {"retransmissions": retx, "psn_gaps": float(gaps_g[k]), "flows": len(f),
                "retransmitted_share": share}, flows=f,
               onset=resend_onset(ctx, f, int(gaps_g[k]) or int(retx)))
    t = th["nak_errors"]
    tot = cg["nak_seq"] + cg["nak_rnr"] + cg["nak_other"]
    for s, d, f in by_pair(ctx, np.nonzero(tot >= max(1, t["min_naks"]))[0]):
        # NAKs travel responder -> requester: the data flows are the partners
        f = np.asarray(f)
        part = ctx.partner[f]
        data_flows = part[part >= 0].tolist()
        gaps = len(data_flows) > 0 and bool((cg["psn_gaps"][data_flows] > 0).all())
        seq, rnr, oth = (float(cg[k][f].sum()) for k in ("nak_seq", "nak_rnr", "nak_other"))
        n_raw = float(sum(ctx.cols[k][f].sum() for k in ("nak_seq", "nak_rnr", "nak_other")))
        # each NAK stops the requester (a resend from the NAKed PSN, an RNR timer): its share
        # of the requests NAKed (those of the data flows, or of the node pair's when unpaired)
        req = _requests(ctx, data_flows) if data_flows else _requests(ctx, np.nonzero(
            (ctx.nodes.src == d) & (ctx.nodes.dst == s))[0])
        share = n_raw / max(1.0, req)
        if oth > 0:
            severity, why = "critical", "remote access / invalid request errors: an application or memory-registration bug"
        elif rnr > 0:
            severity, why = impact_severity(n_raw, share, t), \
                "receiver-not-ready: the receiver did not post buffers in time (slow consumer)"
        else:
            severity, why = ("info" if gaps else impact_severity(n_raw, share, t)), \
                ("PSN sequence errors from the loss above" if gaps else "PSN sequence errors: packets lost before the receiver")
        em.add("nak_errors", severity, [d, s],
               f"{int(seq + rnr + oth)} NAK(s) from {ips[s]} to {ips[d]} (QP {qp_list(ctx, f)}): {why}"
               + (f" ({_share(share)} of the requests: no measurable cost)" if severity == "info" and not gaps else ""),
               {"psn_sequence_error": seq, "rnr": rnr, "other": oth, "flows": len(f), "nak_share": share},
               flows=data_flows + f.tolist(),
               qps=sorted({int(q) for q in fl["dest_qp"][f]} | {int(q) for q in fl["dest_qp"][data_flows]}),
               onset=resend_onset(ctx, data_flows, int(seq + rnr + oth)))


DETECTORS = [
    Detector(
        "loss", loss, needs=frozenset({"flows"}), live=True, stage=60,
        doc="flow-table PSN gaps, retransmissions and NAKs per directed node pair",
        kinds=(
            Kind("packet_loss",
                 key=KEY_LINK, headline=("loss_rate",), actions=(A.CHECK_LINK,), role="cause",
                 fires='per link: PSN gaps ≥ `min_gaps` (1); critical when PSNs skipped / requests ≥ `critical` (0.1 %); warning when ≥ `warning_events` (2) gaps, or when the packets missing and resent (go-back-N) are ≥ `warning` (0.1 %) of the link\'s requests; else info (one loss event of no measurable cost)',
                 blames='src, dst; the lossy flows',
                 thresholds=(Threshold("min_gaps", 1, "count", "PSN gaps on a flow, at least"),
                             Threshold("critical", 1e-3, "fraction", "PSNs skipped / requests: critical"),
                             Threshold("warning", 1e-3, "fraction", "(skipped + retransmitted) / requests: warning at or above"),
                             Threshold("warning_events", 2, "count", "PSN gaps on the link: warning at or above")),
                 onset="the flow table counts losses without time, but a go-back-N resend stretches the message it hits: "
                       "the flows' N most stretched messages (N = the PSN gaps; wire time / what the flow's median message "
                       "rate predicts, ≥ 4 robust standard deviations above the flows' median, ≥ +1 %) as an episode "
                       "against the flows' data; none, or no records (live): generic"),
            Kind("retransmissions",
                 key=KEY_LINK, headline=("retransmissions",), actions=(A.CHECK_LINK,),
                 role="symptom", seen_by="retransmitted_packets",
                 fires='per link: retransmitted packets ≥ `min_packets`; info when every flow also shows gaps (recovery of the loss above); else (loss after the observation point, timeouts) by what the resends cost: critical when retransmitted / requests ≥ `critical` (1 %), warning when ≥ `warning` (0.1 %) and ≥ `warning_events` (2) packets, else info (one resend in a long run: a line, not a page)',
                 blames='src, dst',
                 thresholds=(Threshold("min_packets", 1, "count", "retransmitted packets on a flow, at least"),
                             Threshold("warning", 1e-3, "fraction", "retransmitted / requests: warning at or above"),
                             Threshold("warning_events", 2, "count", "retransmitted packets: warning at or above"),
                             Threshold("critical", 1e-2, "fraction", "retransmitted / requests: critical")),
                 onset="as `packet_loss` (N = the PSN gaps, else the retransmitted packets)"),
            Kind("nak_errors",
                 key=KEY_LINK, headline=("psn_sequence_error",), actions=(A.CHECK_LINK,),
                 role="symptom", seen_by="naks",
                 fires='per link of NAK senders: NAKs ≥ `min_naks`; other syndromes (remote access / invalid request) critical; PSN sequence errors info when the data flow shows gaps (the loss above); RNR and the other PSN sequence errors by what they cost: critical when NAKs / the NAKed requests ≥ `critical` (1 %), warning when ≥ `warning` (0.1 %) and ≥ `warning_events` (2) NAKs, else info',
                 blames='the requester, then the responder',
                 thresholds=(Threshold("min_naks", 1, "count", "NAKs on a flow, at least"),
                             Threshold("warning", 1e-3, "fraction", "NAKs / the NAKed requests: warning at or above"),
                             Threshold("warning_events", 2, "count", "NAKs: warning at or above"),
                             Threshold("critical", 1e-2, "fraction", "NAKs / the NAKed requests: critical")),
                 onset="as `packet_loss` (N = the NAKs), on the data flows the NAKs answer"),
        )),
]
