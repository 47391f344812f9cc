"""ecn_congestion (CE-marked flows by the node they share), cnp_storm (per CNP sender)."""
from __future__ import annotations

import numpy as np

from skewscope.analysis.detectors import actions as A
from skewscope.analysis.detectors.common import group_by_node, pct, sev
from skewscope.analysis.detectors.registry import KEY_BLAMED, Detector, Kind, Threshold
from skewscope.analysis.onset import slowdown_onset
from skewscope.analysis.stats import median


def congestion(inp, em):
    ctx, th = inp.ctx, inp.th
    cg = inp.congestion
    ips = ctx.nodes.ips
    t = th["ecn_congestion"]
    marked = np.nonzero(ctx.data & (cg["ce"] > 0))[0]
    groups = group_by_node(ctx, marked)
    if groups:
        # every group's CE and ECN-capable sums at once (integer counts: exact in any order);
        # only the groups over min_ce go on
        flat = np.concatenate([np.asarray(g[2], dtype=np.int64) for g in groups])
        starts = np.cumsum([0] + [len(g[2]) for g in groups[:-1]])
        ce_g = np.add.reduceat(cg["ce"][flat], starts)
        ect_g = np.add.reduceat(cg["ecn_capable"][flat], starts)
        part = ctx.partner[flat]
        cnp_g = np.add.reduceat(np.where(part >= 0, cg["cnp"][np.maximum(part, 0)], 0.0), starts)
        keep = np.nonzero(ce_g >= t["min_ce"])[0].tolist()
    else:
        keep = []
    for k in keep:
        n, role, fl = groups[k]
        ce = float(ce_g[k])
        fr = ce / max(1.0, float(ect_g[k]))
        severity = sev(fr, t["warning"], t["critical"])
        if severity is None:
            continue
        # (a few flows per group, hundreds of groups: a set, not np.unique's sort per group)
        peers = sorted(set((ctx.nodes.src if role == "into" else ctx.nodes.dst)[fl].tolist()))
        cnp = float(cnp_g[k])                 # the CNPs back on the groups' partner flows
        # when: CE marks and CNPs carry no time (flow-table counters); the marked flows'
        # slowdown does (their message rates against the other data flows')
        onset = slowdown_onset(ctx, fl) if ctx.__dict__.get("_fstat") is not None else None
        em.add("ecn_congestion", severity, [n] + peers,
               f"ECN congestion {role} {ips[n]}: {pct(fr)} of packets CE-marked on {len(fl)} flow(s) "
               f"{'from' if role == 'into' else 'to'} {len(peers)} peer(s)" + (f", {int(cnp)} CNPs back" if cnp else "")
               + (": the switch port towards it is the bottleneck (incast/oversubscription); check its queue and "
                  "traffic placement" if role == "into" else ": its uplink queue is congested"),
               {"ce_fraction": fr, "ce_packets": ce, "flows": len(fl), "cnp_packets": cnp},
               flows=fl, onset=onset)
    # CNP storms: per CNP sender (= the congested data receiver), all the QPs it throttles
    t = th["cnp_storm"]
    cf = np.nonzero(cg["cnp"] > 0)[0]
    cs = ctx.nodes.src[cf].astype(np.int64)
    # per CNP sender in order of its first flow, its flows in flow order: a stable sort by
    # the position of the sender's first flow
    _, first, inv = np.unique(cs, return_index=True, return_inverse=True)
    o = np.argsort(first[inv], kind="stable")
    cuts = np.nonzero(np.diff(cs[o]))[0] + 1
    for g in (np.split(cf[o], cuts) if len(cf) else []):
        n, fl = int(ctx.nodes.src[g[0]]), g.tolist()
        total = float(cg["cnp"][fl].sum())
        rates = cg["cnp_rate_per_s"][fl]
        if total < t["min_cnp"] or float(rates.max()) < t["warning"]:
            continue
        severity = sev(float(rates.max()), t["warning"], t["critical"])
        senders = sorted(set(ctx.nodes.dst[g].tolist()))
        qps = sorted(set(ctx.cols["dest_qp"][g].tolist()))
        part = ctx.partner[g]
        data_flows = part[part >= 0].tolist()
        em.add("cnp_storm", severity, [n] + senders,
               f"CNP storm from {ips[n]}: {int(total)} CNPs to {len(qps)} sender QP(s) on {len(senders)} node(s), up to "
               f"{rates.max():,.0f}/s per QP while it sends: DCQCN keeps cutting those senders' rates; relieve the "
               f"congestion towards {ips[n]} (see ecn_congestion) or tune DCQCN",
               {"cnp_packets": total, "max_cnp_rate_per_s": float(rates.max()),
                "median_cnp_rate_per_s": float(median(rates)), "qps": len(qps)},
               flows=data_flows + fl, qps=qps,
               onset=slowdown_onset(ctx, data_flows) if data_flows and ctx.__dict__.get("_fstat") is not None
               else None)


DETECTORS = [
    Detector(
        "congestion", congestion, needs=frozenset({"flows"}), live=True, stage=50,
        doc="flow-table ECN/CNP counters",
        kinds=(
            Kind("ecn_congestion",
                 key=KEY_BLAMED, headline=("ce_fraction",), actions=(A.CHECK_PORT_INTO, A.SPREAD_SENDERS),
                 role="symptom", seen_by="ce_packets",
                 fires='CE-marked data flows grouped by the node most of them share (into it, else from it): Σ CE ≥ `min_ce` (10) and CE / ECN-capable ≥ `warning` (1 %), critical ≥ 10 %',
                 blames='that node, then its peers',
                 thresholds=(Threshold("warning", 0.01, "fraction", "CE / ECN-capable packets: warning"),
                             Threshold("critical", 0.10, "fraction", "CE / ECN-capable packets: critical"),
                             Threshold("min_ce", 10, "count", "CE-marked packets, at least")),
                 onset="CE marks and CNPs carry no time (flow-table counters): the marked flows' slowdown does -- per "
                       "time bin, the median message rate of its flows / their median over the capture (series scan, "
                       "lower is worse, no threshold: a change of ≥ 20 %); live (no records) or no timed message: "
                       "generic"),
            Kind("cnp_storm",
                 key=KEY_BLAMED, headline=("max_cnp_rate_per_s",), actions=(A.CHECK_PORT_INTO, A.SPREAD_SENDERS),
                 role="symptom", seen_by="cnp_packets",
                 fires='per CNP sender (the congested receiver): Σ CNPs ≥ `min_cnp` (10) and the highest per-QP CNP rate over active time ≥ `warning` (1,000/s), critical ≥ 10,000/s; all QPs it throttles listed',
                 blames='the CNP sender, then the throttled senders',
                 thresholds=(Threshold("warning", 1000.0, "1/s", "highest per-QP CNP rate while the throttled flow sends: warning"),
                             Threshold("critical", 10000.0, "1/s", "highest per-QP CNP rate while the throttled flow sends: critical"),
                             Threshold("min_cnp", 10, "count", "CNPs from that node, at least")),
                 onset="as `ecn_congestion`, on the data flows it throttles"),
        )),
]
