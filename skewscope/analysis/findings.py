"""Detectors: metrics -> findings an SRE can act on. Every threshold is documented in
docs/metrics.md "Findings" and can be overridden (`--threshold KIND.NAME=VALUE`,
analyze(thresholds={"KIND.NAME": value}) or {"KIND": {"NAME": value}}).

A finding: {"kind", "severity" (info|warning|critical), "entities" {"ips", "qps",
"flows": [[src, dst, dest_qp], ...]}, "evidence" {numbers}, "message" (one line), "group"
(index into "collectives" or null)}. entities.ips lists the node(s) the finding blames
first (the hot node, the slow sender, the paused receiver), then the others involved.
"""
from __future__ import annotations

import copy
import math

import numpy as np

from skewscope.core import layout as L
from skewscope.core.snapshot import ip_str

SEVERITIES = ("info", "warning", "critical")
SEV_RANK = {s: i for i, s in enumerate(SEVERITIES)}

#: default thresholds, per finding kind (docs/metrics.md "Findings")
DEFAULTS: dict[str, dict[str, float]] = {
    "alltoall_destination_skew": {"warning": 1.5, "critical": 3.0, "min_bytes": 1 << 20},
    "hot_destination": {"warning": 1.5, "critical": 3.0, "min_bytes": 1 << 20},
    "incast": {"min_senders": 4, "ratio": 2.0, "min_time_s": 5e-6, "throttle": 0.7},
    "ring_straggler": {"warning": 0.8, "critical": 0.5, "min_lag_s": 5e-6, "lag_mad": 4.0},
    "straggler": {"warning": 0.8, "critical": 0.5, "min_lag_s": 5e-6, "lag_mad": 4.0},
    "slow_receiver": {"warning": 0.8, "critical": 0.5},
    "slow_link": {"warning": 0.8, "critical": 0.5, "min_stall_s": 50e-6, "min_late_s": 50e-6,
                  "late_share": 0.3},
    "pipeline_bubbles": {"warning": 1.5, "critical": 3.0, "min_bubble": 0.1},
    "ecn_congestion": {"warning": 0.01, "critical": 0.10, "min_ce": 10},
    "cnp_storm": {"warning": 1000.0, "critical": 10000.0, "min_cnp": 10},
    "packet_loss": {"min_gaps": 1, "critical": 1e-3},
    "retransmissions": {"min_packets": 1},
    "nak_errors": {"min_naks": 1},
    "pfc_pause": {"min_frames": 1, "critical": 0.05, "link_gbps": 0, "min_stall_s": 20e-6},
    "period_jitter": {"warning": 0.05, "critical": 0.15, "min_iterations": 3},
    "decode_jitter": {"warning": 1.5, "critical": 3.0},
    "prefill_interference": {"warning": 0.02, "critical": 0.2, "min_intervals": 1},
    "slow_tp_shard": {"min_lag_s": 5e-6, "lag_mad": 4.0, "lag_fraction": 0.1},
    "map_overflow": {"min_evicted": 1, "min_lost": 1},
    "sampling": {},
    # parameters of the analysis (not findings)
    "decode": {"max_interval_s": 0.005, "min_collectives": 16, "max_duty": 0.8, "max_message_bytes": 65536,
               "collectives_per_token": 0},
}
PARAM_SECTIONS = ("decode",)
KINDS = tuple(k for k in DEFAULTS if k not in PARAM_SECTIONS)


class ThresholdError(ValueError):
    """Unknown check or threshold name, or a bad value (one line for the user)."""


def resolve_thresholds(over=None) -> dict:
    th = copy.deepcopy(DEFAULTS)
    if not over:
        return th
    items = []
    for k, v in over.items():
        if isinstance(v, dict):
            items += [(f"{k}.{n}", x) for n, x in v.items()]
        else:
            items.append((k, v))
    for key, val in items:
        if "." not in key:
            raise ThresholdError(f"threshold {key!r}: use KIND.NAME=VALUE")
        kind, name = key.split(".", 1)
        if kind not in th:
            raise ThresholdError(f"unknown finding kind {kind!r} in threshold {key!r} (kinds: {', '.join(DEFAULTS)})")
        if name not in th[kind]:
            names = ", ".join(th[kind]) or "none"
            raise ThresholdError(f"unknown threshold {name!r} for {kind} (known: {names})")
        try:
            fv = float(val)
        except (TypeError, ValueError):
            raise ThresholdError(f"threshold {key}: not a number: {val!r}") from None
        if not math.isfinite(fv) or fv < 0:
            raise ThresholdError(f"threshold {key}: must be a finite number >= 0")
        th[kind][name] = fv
    return th


def resolve_checks(checks) -> set:
    if not checks:
        return set(KINDS)
    out = set()
    for c in checks:
        for part in str(c).split(","):
            part = part.strip()
            if not part:
                continue
            if part not in KINDS:
                raise ThresholdError(f"unknown check {part!r} (kinds: {', '.join(KINDS)})")
            out.add(part)
    return out


# ---- helpers -------------------------------------------------------------------------------
def _pct(x):
    return f"{100 * x:.1f}%" if x < 0.1 else f"{100 * x:.0f}%"


def _us(ns):
    if ns >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    return f"{ns / 1e3:.0f} us"


def _gbps(bps):
    return f"{bps / 1e9:.1f} Gb/s"


def _sev(value, warn, crit, higher_is_worse=True):
    if higher_is_worse:
        if value >= crit:
            return "critical"
        if value >= warn:
            return "warning"
    else:
        if value <= crit:
            return "critical"
        if value <= warn:
            return "warning"
    return None


class Emitter:
    def __init__(self, ctx, checks):
        self.ctx = ctx
        self.checks = checks
        self.out = []

    def flow_key(self, i):
        f = self.ctx.flows[i]
        v = int(f["ipver"])
        return [ip_str(f["src"], v), ip_str(f["dst"], v), int(f["dest_qp"])]

    def add(self, kind, severity, ips, message, evidence, flows=(), qps=None, group=None):
        if kind not in self.checks or severity is None:
            return
        ips_out = []
        for x in ips:
            s = x if isinstance(x, str) else self.ctx.nodes.ips[int(x)]
            if s not in ips_out:
                ips_out.append(s)
        fl = [self.flow_key(int(i)) for i in flows]
        if qps is None:
            qps = sorted({k[2] for k in fl})
        self.out.append({"kind": kind, "severity": severity,
                         "entities": {"ips": ips_out, "qps": [int(q) for q in qps], "flows": fl},
                         "evidence": evidence, "message": message, "group": group})


def _mad_threshold(vals, i, k_mad, floor):
    """Threshold for vals[i] to stand out: median + k * MAD of the others (>= floor)."""
    others = np.delete(vals, i)
    others = others[np.isfinite(others)]
    if len(others) == 0:
        return floor
    med = float(np.median(others))
    mad = float(np.median(np.abs(others - med)))
    return max(floor, med + k_mad * max(mad, 1e3))


# ---- detectors ------------------------------------------------------------------------------
def detect(ctx, groups, results, th, checks, extra) -> list[dict]:
    em = Emitter(ctx, checks)
    extra["stall_culprits"] = _stall_culprits(ctx, th)
    extra["irregular"] = extra["stall_culprits"][2]
    _rates_and_lags(em, ctx, groups, results, th, extra)
    for gi, (g, r) in enumerate(zip(groups, results)):
        if g.kind == "all_to_all":
            _alltoall(em, ctx, g, r, th, gi)
        if g.kind == "p2p" and g.pattern == "pipeline":
            _pipeline(em, ctx, g, r, th, gi)
        dec = r.get("decode")
        if dec:
            _decode(em, ctx, g, r, dec, th, gi)
        elif (g.kind in ("ring_allreduce", "tree_allreduce", "all_to_all") or g.pattern == "pipeline") \
                and r.get("period_s") and r.get("period_jitter_s") is not None \
                and r.get("iterations", 0) >= th["period_jitter"]["min_iterations"]:
            rel = r["period_jitter_s"] / r["period_s"]
            t = th["period_jitter"]
            sev = _sev(rel, t["warning"], t["critical"])
            em.add("period_jitter", sev, g.members,
                   f"{g.kind} of {len(g.members)} nodes: iteration period {r['period_s'] * 1e3:.2f} ms jitters by "
                   f"{_pct(rel)} (std {_us(r['period_jitter_s'] * 1e9)}): look for a rank with variable compute, "
                   "data loading or host interference", {"period_s": r["period_s"], "period_jitter_s": r["period_jitter_s"],
                                                          "jitter_ratio": rel, "iterations": r["iterations"]},
                   flows=g.flows, group=gi)
    _incast(em, ctx, th, extra)
    _stalls(em, ctx, th, extra)
    _congestion(em, ctx, th, extra)
    _loss(em, ctx, th, extra)
    _pfc(em, ctx, th, extra)
    _caveats(em, ctx, th)
    em.out.sort(key=lambda f: (-SEV_RANK[f["severity"]], f["kind"]))
    return em.out


def _alltoall(em, ctx, g, r, th, gi):
    ips = ctx.nodes.ips
    tot = float(np.sum(r.get("dest_bytes") or [0]))
    ds = r.get("dest_skew") or {}
    hot = r.get("hot_destination")
    if hot is None or not ds.get("max_over_mean"):
        return
    hot_i = ips.index(hot)
    gf = np.asarray(g.flows, dtype=np.int64)
    into_hot = gf[ctx.nodes.dst[gf] == hot_i].tolist()
    t = th["hot_destination"]
    if tot >= t["min_bytes"]:
        mom = ds["max_over_mean"]
        sev = _sev(mom, t["warning"], t["critical"])
        em.add("hot_destination", sev, [hot], f"{hot} receives {mom:.2f}x the mean all-to-all bytes "
               f"({_pct(ds['max_share'])} of the phase, fair share {_pct(1 / len(g.members))}): hot expert/rank; "
               "rebalance experts or check the router's load-balancing loss",
               {"max_over_mean": mom, "share": ds["max_share"], "cv": ds["cv"], "gini": ds["gini"],
                "jain": ds["jain"], "phase": r.get("dest_skew_phase"), "dest_bytes": r.get("dest_bytes"),
                "members": [ips[m] for m in g.members]}, flows=into_hot, group=gi)
    t = th["alltoall_destination_skew"]
    ps = r.get("per_source_dest_max_over_mean")
    if ps and tot >= t["min_bytes"]:
        sev = _sev(ps, t["warning"], t["critical"])
        em.add("alltoall_destination_skew", sev, [hot] + [ips[m] for m in g.members],
               f"all-to-all of {len(g.members)} nodes: senders put up to {ps:.2f}x their mean bytes on one "
               f"destination (hot: {hot}, {ds['max_over_mean']:.2f}x overall): MoE routing imbalance, the step "
               "waits for the slowest destination", {"per_source_max_over_mean": ps, "dest_max_over_mean": ds["max_over_mean"],
                                                      "dest_gini": ds["gini"], "dest_jain": ds["jain"],
                                                      "phase": r.get("dest_skew_phase"), "hot_destination": hot},
               flows=into_hot, group=gi)


def _lag_outliers(lags, k_mad, floor_ns):
    out = []
    if lags is None:
        return out
    lags = np.asarray(lags, dtype=np.float64)
    for i, v in enumerate(lags):
        if not np.isfinite(v):
            continue
        if v >= _mad_threshold(lags, i, k_mad, floor_ns):
            out.append((i, float(v)))
    return out


def _split_by(flows, key, members) -> dict:
    """{member: [flows whose key is that member]} in one sort."""
    o = np.argsort(key, kind="stable")
    ks, fs = key[o], flows[o]
    out = {}
    for m in members:
        a, b = np.searchsorted(ks, m), np.searchsorted(ks, m, side="right")
        out[m] = fs[a:b].tolist()
    return out


def _ce_explained(ctx, flows, th, extra) -> bool:
    """Most of these flows' packets are CE-marked: slowness explained by ECN congestion."""
    if not len(flows):
        return False
    cg = extra["congestion"]
    fl = np.asarray(flows, dtype=np.int64)
    return bool(np.median(cg["ce_fraction"][fl]) >= th["ecn_congestion"]["warning"])


def _rates_and_lags(em, ctx, groups, results, th, extra):
    """slow_link (both directions slow, or silent both ways = flaps), ring_straggler /
    straggler (a slow or late sender), slow_receiver (all-to-all: slow ingress), per group.

    Rates: ring -> the median-message rate of its in/out links / the ring's median link
    (robust to a few stalled messages); other kinds -> the member's send/receive throughput
    over active time / the members' median (independent of how a collective splits a
    sender's bandwidth). Slowness explained by CE marks is left to ecn_congestion; a link
    into a node that is slow both ways is not blamed on its sender."""
    ips = ctx.nodes.ips
    tl = th["slow_link"]
    blamed = set()
    for gi, (g, r) in enumerate(zip(groups, results)):
        if g.kind not in ("ring_allreduce", "tree_allreduce", "all_to_all"):
            continue                     # pipeline stages / p2p are staggered by design
        # start lags compare members doing the same thing at the same time: not in a
        # one-host view, where each peer's first message to the hub comes at its own turn
        symmetric = g.kind in ("ring_allreduce", "all_to_all") and "hub" not in g.extra
        mem = list(g.members)
        nm = len(mem)
        links = r.get("_links")
        ring = g.kind == "ring_allreduce"
        kind = "ring_straggler" if ring else "straggler"
        t = th[kind]
        sr = np.full(nm, np.nan)
        rr = np.full(nm, np.nan)
        reliable = np.zeros(nm, dtype=bool)
        if links is not None and len(links):
            ratio = links["rate_ratio"]
            for i, m in enumerate(mem):
                o = (links["src"] == m) & np.isfinite(ratio)
                n_ = (links["dst"] == m) & np.isfinite(ratio)
                if ring:
                    sr[i] = ratio[o].min() if o.any() else np.nan
                    rr[i] = ratio[n_].min() if n_.any() else np.nan
                rel = (links["src"] == m) | (links["dst"] == m)
                reliable[i] = bool(rel.any()) and float(np.median(links["pkts_per_msg"][rel])) >= 3
        if g.pattern == "tree_node":
            continue                     # one tree node's links differ by role: nothing to compare
        hub = g.extra.get("hub") if g.pattern == "alltoall_star" else None
        if hub is not None and links is not None and len(links):
            # one-host view: each peer's link to / from the hub against the other peers'
            into = links["dst"] == hub
            outo = links["src"] == hub
            for i, m in enumerate(mem):
                if m == hub:
                    continue
                a = into & (links["src"] == m)
                b = outo & (links["dst"] == m)
                ri = links["rate_med_bps"]
                if a.any() and np.isfinite(ri[into]).any():
                    sr[i] = float(ri[a][0]) / float(np.nanmedian(ri[into]))
                if b.any() and np.isfinite(ri[outo]).any():
                    rr[i] = float(ri[b][0]) / float(np.nanmedian(ri[outo]))
        elif not ring:
            nt = r.get("_node_tp")
            if nt is not None:
                sr = nt["send_ratio"]
                rr = nt["recv_ratio"]
        gf = np.asarray(g.flows, dtype=np.int64)
        out_flows = _split_by(gf, ctx.nodes.src[gf], mem)
        in_flows = _split_by(gf, ctx.nodes.dst[gf], mem)
        rthr = tl["warning"] if g.kind != "tree_allreduce" else tl["critical"]
        # 1. slow both ways: the node's own link
        both = set()
        for i, m in enumerate(mem):
            if not reliable[i] or not (sr[i] <= tl["warning"] and rr[i] <= rthr):
                continue
            if _ce_explained(ctx, in_flows[m], th, extra) or m in blamed:
                continue
            both.add(m)
            worst = float(max(sr[i], rr[i]))
            rate = [float(x) for x in (links["rate_bps"][(links["src"] == m) | (links["dst"] == m)] if links is not None else [])
                    if np.isfinite(x)]
            em.add("slow_link", _sev(worst, tl["warning"], tl["critical"], higher_is_worse=False), [m],
                   f"{ips[m]}'s link is slow both ways: it sends at {sr[i]:.2f}x and receives at {rr[i]:.2f}x its "
                   f"peers' rate{(' (' + _gbps(float(np.median(rate))) + ' per QP)') if rate else ''}: check its port "
                   "speed, cable/optics, FEC errors and NIC link state",
                   {"send_ratio": float(sr[i]), "recv_ratio": float(rr[i]), "mode": "slow"},
                   flows=out_flows[m] + in_flows[m], group=gi)
        # 2. silent both ways in some iterations: flaps
        sd, rd = r.get("_send_dev_ns"), r.get("_recv_dev_ns")
        late = set()
        if symmetric and sd is not None and rd is not None and len(sd):
            late_ns = tl["min_late_s"] * 1e9
            cand = []
            for i, m in enumerate(mem):
                if m in both or m in blamed:
                    continue
                bl = (sd[:, i] >= late_ns) & (rd[:, i] >= late_ns)
                if bl.sum() >= 2 and float(bl.mean()) >= tl["late_share"]:
                    cand.append((i, m, bl))
            if extra.get("irregular"):
                pass                       # the capture's timing, not a link (see _stalls)
            elif _few(len(cand), nm):
                for i, m, bl in cand:
                    late.add(m)
                    worst = float(np.nanmax(np.minimum(sd[:, i], rd[:, i])))
                    em.add("slow_link", "warning", [m],
                           f"{ips[m]} goes silent in both directions for up to {_us(worst)} in {int(bl.sum())} of "
                           f"{len(bl)} iterations while its peers proceed: a flapping link or port; check link "
                           "down/up events and error counters",
                           {"late_iterations": int(bl.sum()), "iterations": int(len(bl)), "max_delay_s": worst / 1e9,
                            "mode": "flapping"}, flows=out_flows[m] + in_flows[m], group=gi)
            elif cand:
                _irregular(em, ctx, f"{len(cand)} of {nm} members of a {g.kind} are late both ways in the same "
                           "iterations", gi)
        skip = both | late | blamed
        # 3. slow senders
        lag = r.get("_start_lag_ns") if symmetric and not r.get("decode") else None
        lagged = dict(_lag_outliers(lag, t["lag_mad"], t["min_lag_s"] * 1e9))
        succ_both = {}
        if ring and links is not None:
            for k in range(len(links)):
                succ_both.setdefault(int(links["src"][k]), set()).add(int(links["dst"][k]))
        for i, m in enumerate(mem):
            if m in skip:
                continue
            slow = reliable[i] and sr[i] <= t["warning"]
            if slow and ring and succ_both.get(m, set()) & both:
                slow = False                       # its successor's port is the slow one
            if slow and _ce_explained(ctx, out_flows[m], th, extra):
                slow = False
            lag_ns = lagged.get(i)
            if not slow and lag_ns is None:
                continue
            sev = _sev(float(sr[i]), t["warning"], t["critical"], higher_is_worse=False) if slow else "warning"
            parts = []
            if slow:
                parts.append(f"sends at {sr[i]:.2f}x the {'median link rate' if ring else 'median member'}"
                             + (f" ({_gbps(float(r['_node_tp']['send'][i]))} while sending)" if not ring and r.get('_node_tp') else ""))
            if lag_ns is not None:
                parts.append(f"starts each step {_us(lag_ns)} late")
            dsts = sorted({int(ctx.nodes.dst[f]) for f in out_flows[m]})
            what = "ring" if ring else g.kind
            em.add(kind, sev, [m] + dsts,
                   f"{what} straggler {ips[m]}: " + " and ".join(parts)
                   + "; every rank waits for it: check that host's GPU/NIC (clocks, PCIe, thermal) or its uplink",
                   {"send_ratio": None if not np.isfinite(sr[i]) else float(sr[i]),
                    "start_lag_s": None if lag_ns is None else lag_ns / 1e9},
                   flows=out_flows[m], group=gi)
            blamed.add(m)
        # 4. slow receivers (all-to-all: every sender slows down towards one node)
        if g.kind == "all_to_all":
            for i, m in enumerate(mem):
                if m in skip or m in blamed or not reliable[i] or not rr[i] <= t["warning"]:
                    continue
                if _ce_explained(ctx, in_flows[m], th, extra):
                    continue
                srcs = {int(ctx.nodes.src[f]) for f in in_flows[m]}
                if len(srcs & blamed) * 2 >= len(srcs):
                    continue
                em.add("slow_receiver", _sev(float(rr[i]), t["warning"], t["critical"], higher_is_worse=False),
                       [m] + sorted(srcs),
                       f"every sender slows down towards {ips[m]} ({rr[i]:.2f}x the median receive rate) without CE "
                       "marks: its ingress is the bottleneck (PFC-paused port, receiver NIC/PCIe, ECN disabled?)",
                       {"recv_ratio": float(rr[i])}, flows=in_flows[m], group=gi)
    return blamed


def _pipeline(em, ctx, g, r, th, gi):
    t = th["pipeline_bubbles"]
    sl = r.get("slowest_stage")
    bub = r.get("bubble_fraction")
    if not sl or bub is None:
        return
    ratio = sl["compute_ratio"]
    sev = _sev(ratio, t["warning"], t["critical"])
    if sev is None or bub < t["min_bubble"]:
        return
    node = ctx.nodes.ips.index(sl["ip"])
    flows = [f for f in g.flows if ctx.nodes.src[f] == node]
    em.add("pipeline_bubbles", sev, [sl["ip"]] + r["stages"],
           f"pipeline stage {sl['stage']} ({sl['ip']}) takes {ratio:.2f}x the median stage time: the other stages "
           f"idle {_pct(bub)} of the steady state (bubbles); rebalance layers across stages or check that host",
           {"stage": sl["stage"], "compute_ratio": ratio, "bubble_fraction": bub,
            "fill_drain_bubble": r.get("fill_drain_bubble"), "stage_compute_fwd_s": r.get("stage_compute_fwd_s"),
            "link_idle_fraction": r.get("link_idle_fraction")}, flows=flows, group=gi)


def _decode(em, ctx, g, r, dec, th, gi):
    ips = ctx.nodes.ips
    t = th["decode_jitter"]
    ratio = dec["decode_jitter_ratio"]
    pre = dec.get("prefill")
    sev = _sev(ratio, t["warning"], t["critical"])
    em.add("decode_jitter", sev, g.members,
           f"decode collectives every {_us(dec['collective_interval_p50_s'] * 1e9)} (p50) but p99 "
           f"{_us(dec['collective_interval_p99_s'] * 1e9)} ({ratio:.1f}x): token latency tail"
           + (" — mostly prefill interference, see below" if pre and pre["interfered_intervals"] else
              "; look for host interference or a slow shard"),
           {"interval_p50_s": dec["collective_interval_p50_s"], "interval_p99_s": dec["collective_interval_p99_s"],
            "interval_max_s": dec["collective_interval_max_s"], "jitter_ratio": ratio,
            "collectives_per_s": dec["collectives_per_s"]}, flows=g.flows, group=gi)
    if pre and pre["interfered_intervals"] >= th["prefill_interference"]["min_intervals"]:
        t = th["prefill_interference"]
        sev = _sev(pre["stall_share"], t["warning"], t["critical"])
        em.add("prefill_interference", sev, g.members,
               f"{pre['interfered_intervals']} decode gap(s) (up to {_us((pre['max_interval_s'] or 0) * 1e9)}, p50 "
               f"{_us(dec['collective_interval_p50_s'] * 1e9)}) coincide with prefill traffic "
               f"({pre['bursts']} bursts of >= {pre['threshold_bytes'] // 1024} KiB messages): decode stalled "
               f"{_pct(pre['stall_share'])} of the time; use chunked prefill or separate prefill/decode instances",
               {k: pre[k] for k in ("interfered_intervals", "stall_s", "stall_share", "bursts", "bytes",
                                    "max_interval_s", "threshold_bytes")}, flows=g.flows, group=gi)
    t = th["slow_tp_shard"]
    lags = dec["_tinfo"].get("start_lag_ns")
    busy = dec.get("collective_busy_p50_s", 0) * 1e9
    for i, v in _lag_outliers(lags, t["lag_mad"], max(t["min_lag_s"] * 1e9, t["lag_fraction"] * busy)):
        m = g.members[i]
        em.add("slow_tp_shard", "warning", [ips[m]] + [ips[x] for x in g.members if x != m],
               f"tensor-parallel shard {ips[m]} starts its part of each collective {_us(v)} after the others "
               f"(collective takes {_us(busy)} p50): every token waits for it; check that GPU/host",
               {"start_lag_s": v / 1e9, "collective_busy_p50_s": busy / 1e9},
               flows=[f for f in g.flows if ctx.nodes.src[f] == m], group=gi)


def _incast(em, ctx, th, extra):
    """incast: a destination with >= incast.min_senders senders at once, >= incast.ratio x
    the typical destination's peak, for >= incast.min_time_s, AND queueing evidence: its
    senders' flows into it run at <= incast.throttle x their rate to other destinations
    (when they have others), else the senders form a many-to-one pattern."""
    inc = extra.get("incast")
    if inc is None:
        return
    t = th["incast"]
    mx = inc["max_senders"].astype(np.float64)
    recv = inc["active_ns"] > 0
    if recv.sum() < 2:
        return
    med = float(np.median(mx[recv]))
    st = ctx.fstat
    data = np.nonzero(ctx.data)[0]
    rate = st["rate_med_bps"]
    for n in np.nonzero(recv)[0]:
        if mx[n] < t["min_senders"] or mx[n] < t["ratio"] * max(med, 1.0) or inc["at_max_ns"][n] < t["min_time_s"] * 1e9:
            continue
        senders = extra["incast_senders"].get(int(n), [])
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
                ratios.append(float(np.median(rate[into])) / max(1.0, float(np.median(rate[other]))))
        throttle = float(np.median(ratios)) if ratios else None
        back = set(ddst[dsrc == n].tolist())
        star = len(senders) >= t["min_senders"] and not (set(senders) & back)
        if throttle is not None and throttle > t["throttle"]:
            continue
        if throttle is None and not star:
            continue
        stalled = extra["stalls"]["in_stall_n"][n] > 0
        sev = "critical" if stalled or mx[n] >= 2 * t["min_senders"] or (throttle is not None and throttle <= 0.25) else "warning"
        em.add("incast", sev, [int(n)] + list(senders),
               f"incast into {ctx.nodes.ips[n]}: {int(mx[n])} senders at once (typical destination: {med:.0f}) for "
               f"{_us(inc['at_max_ns'][n])}"
               + (f", their flows into it run at {throttle:.2f}x their rate elsewhere" if throttle is not None else "")
               + ": its switch port queues; stagger the senders or spread the destination",
               {"max_senders": int(mx[n]), "median_max_senders": med, "time_at_max_s": float(inc["at_max_ns"][n]) / 1e9,
                "time_multi_s": float(inc["multi_ns"][n]) / 1e9, "mean_senders": float(inc["mean_senders"][n]),
                "throttle_ratio": throttle}, flows=flows)


def _few(k: int, n: int) -> bool:
    """A node-level timing fault is an outlier: at most a quarter of the nodes (>= 1)."""
    return k <= max(1, n // 4)


def _irregular(em, ctx, what: str, group):
    """Timing faults everywhere at once are the capture's, not the nodes': say so once."""
    if any(f["kind"] == "sampling" and f["evidence"].get("irregular_timing") for f in em.out):
        return
    em.add("sampling", "info", [],
           f"{what}: the message timing is irregular across the capture (batched delivery or "
           "pacing on the capture/replay path?), so node-level stall and flap findings are withheld",
           {"irregular_timing": True}, group=group)


def _stall_culprits(ctx, th):
    """Nodes whose links stall both ways, as outliers: the stalled data flows (a message
    >= 2x its flow's typical duration, by >= slow_link.min_stall_s) are assigned greedily to
    the node most of them share; a node that collects >= 80 % of the remaining stalled
    flows, with stalled flows both in and out, is a culprit. Returns (culprits, stalled
    flow count, irregular): irregular when stalled flows remain spread over more than a
    quarter of the nodes (the capture's timing, not a link)."""
    st = ctx.fstat
    lim = th["slow_link"]["min_stall_s"] * 1e9
    rest = np.nonzero(ctx.data & (st["stall_max_ns"] >= lim))[0]
    total = len(rest)
    out = []
    while len(rest):
        cover = np.bincount(ctx.nodes.src[rest], minlength=ctx.nodes.n) + \
            np.bincount(ctx.nodes.dst[rest], minlength=ctx.nodes.n)
        n = int(cover.argmax())
        if cover[n] < 0.8 * len(rest):
            break
        mine = (ctx.nodes.src[rest] == n) | (ctx.nodes.dst[rest] == n)
        if (ctx.nodes.src[rest][mine] == n).any() and (ctx.nodes.dst[rest][mine] == n).any():
            out.append((n, rest[mine]))
        rest = rest[~mine]
    touched = set(ctx.nodes.src[rest].tolist()) | set(ctx.nodes.dst[rest].tolist())
    irregular = len(rest) > 0 and not _few(len(touched), ctx.nodes.n)
    return out, total, irregular


def _stalls(em, ctx, th, extra):
    """slow_link (mode stalls): a node whose messages stall both ways, as an outlier."""
    ips = ctx.nodes.ips
    st = ctx.fstat
    done = {tuple(f["entities"]["ips"][:1]) for f in em.out if f["kind"] == "slow_link"}
    culprits, total, irregular = extra.get("stall_culprits") or _stall_culprits(ctx, th)
    if irregular:
        _irregular(em, ctx, f"{total} data flows stall, spread over most nodes", None)
    for m, fl in culprits:
        if (ips[m],) in done:
            continue
        em.add("slow_link", "warning", [m],
               f"messages to and from {ips[m]} stall (up to {_us(float(st['stall_max_ns'][fl].max()))} on "
               f"{len(fl)} flows): its link pauses in both directions; check link flaps, error counters and PFC "
               "from that port",
               {"stalled_flows": int(len(fl)), "stall_s": float(st["stall_ns"][fl].sum()) / 1e9,
                "max_stall_s": float(st["stall_max_ns"][fl].max()) / 1e9, "mode": "stalls"}, flows=fl)


def _group_by_node(ctx, flows):
    """Greedy: repeatedly take the node (as destination, then as source) shared by most of
    the remaining flows."""
    rest = np.asarray(flows, dtype=np.int64)
    out = []
    while len(rest):
        dn = ctx.nodes.dst[rest]
        sn = ctx.nodes.src[rest]
        d = np.bincount(dn, minlength=ctx.nodes.n)
        s_ = np.bincount(sn, minlength=ctx.nodes.n)
        if d.max() >= s_.max():
            n = int(d.argmax())
            sel = dn == n
            role = "into"
        else:
            n = int(s_.argmax())
            sel = sn == n
            role = "from"
        out.append((n, role, rest[sel].tolist()))
        rest = rest[~sel]
    return out


def _congestion(em, ctx, th, extra):
    cg = extra["congestion"]
    ips = ctx.nodes.ips
    t = th["ecn_congestion"]
    marked = np.nonzero(ctx.data & (cg["ce"] > 0))[0]
    for n, role, fl in _group_by_node(ctx, marked):
        ce = float(cg["ce"][fl].sum())
        fr = ce / max(1.0, float(cg["ecn_capable"][fl].sum()))
        if ce < t["min_ce"]:
            continue
        sev = _sev(fr, t["warning"], t["critical"])
        if sev is None:
            continue
        peers = sorted({int(ctx.nodes.src[f] if role == "into" else ctx.nodes.dst[f]) for f in fl})
        cnp = float(sum(cg["cnp"][ctx.partner[f]] for f in fl if ctx.partner[f] >= 0))
        em.add("ecn_congestion", sev, [n] + peers,
               f"ECN congestion {role} {ips[n]}: {_pct(fr)} of packets CE-marked on {len(fl)} flow(s) "
               f"{'from' if role == 'into' else 'to'} {len(peers)} peer(s)" + (f", {int(cnp)} CNPs back" if cnp else "")
               + (": the switch port towards it is the bottleneck (incast/oversubscription); check its queue and "
                  "traffic placement" if role == "into" else ": its uplink queue is congested"),
               {"ce_fraction": fr, "ce_packets": ce, "flows": len(fl), "cnp_packets": cnp},
               flows=fl)
    # CNP storms: per CNP sender (= the congested data receiver), all the QPs it throttles
    t = th["cnp_storm"]
    by = {}
    for f in np.nonzero(cg["cnp"] > 0)[0]:
        by.setdefault(int(ctx.nodes.src[f]), []).append(int(f))
    for n, fl in by.items():
        total = float(cg["cnp"][fl].sum())
        rates = cg["cnp_rate_per_s"][fl]
        if total < t["min_cnp"] or float(rates.max()) < t["warning"]:
            continue
        sev = _sev(float(rates.max()), t["warning"], t["critical"])
        senders = sorted({int(ctx.nodes.dst[f]) for f in fl})
        qps = sorted({int(ctx.flows["dest_qp"][f]) for f in fl})
        data_flows = [int(ctx.partner[f]) for f in fl if ctx.partner[f] >= 0]
        em.add("cnp_storm", sev, [n] + senders,
               f"CNP storm from {ips[n]}: {int(total)} CNPs to {len(qps)} sender QP(s) on {len(senders)} node(s), up to "
               f"{rates.max():,.0f}/s per QP while it sends: DCQCN keeps cutting those senders' rates; relieve the "
               f"congestion towards {ips[n]} (see ecn_congestion) or tune DCQCN",
               {"cnp_packets": total, "max_cnp_rate_per_s": float(rates.max()),
                "median_cnp_rate_per_s": float(np.median(rates)), "qps": len(qps)},
               flows=data_flows + fl, qps=qps)


def _by_pair(ctx, flows):
    """Flows grouped by directed node pair: [(src node, dst node, [flows])]."""
    flows = np.asarray(flows, dtype=np.int64)
    if len(flows) == 0:
        return []
    key = ctx.nodes.src[flows].astype(np.int64) * max(1, ctx.nodes.n) + ctx.nodes.dst[flows]
    o = np.argsort(key, kind="stable")
    k, f = key[o], flows[o]
    cuts = np.nonzero(np.diff(k))[0] + 1
    return [(int(ctx.nodes.src[g[0]]), int(ctx.nodes.dst[g[0]]), g.tolist()) for g in np.split(f, cuts)]


def _qps(ctx, flows):
    return ", ".join(str(int(q)) for q in ctx.flows["dest_qp"][flows][:4]) + (" ..." if len(flows) > 4 else "")


def _loss(em, ctx, th, extra):
    """packet_loss / retransmissions / nak_errors, one finding per directed node pair (the
    path to check), listing its flows."""
    cg = extra["congestion"]
    ips = ctx.nodes.ips
    fl = ctx.flows
    t = th["packet_loss"]
    for s, d, f in _by_pair(ctx, np.nonzero(cg["psn_gaps"] >= max(1, t["min_gaps"]))[0]):
        gaps = float(cg["psn_gaps"][f].sum())
        skipped = float(cg["psn_skipped"][f].sum())
        req = float(sum(cg["psn_skipped"][x] / cg["loss_rate"][x] for x in f if cg["loss_rate"][x] > 0))
        rate = skipped / req if req > 0 else 0.0
        sev = "critical" if rate >= t["critical"] else "warning"
        part = ctx.partner[f]
        naks = float(cg["nak_seq"][part[part >= 0]].sum())
        em.add("packet_loss", sev, [s, d],
               f"packet loss on {ips[s]} -> {ips[d]} (QP {_qps(ctx, f)}): {int(gaps)} PSN gap(s), {int(skipped)} packets "
               f"missing ({_pct(rate)}), go-back-N resends follow; RoCE needs a lossless fabric: check PFC/buffer "
               "config and link errors on that path",
               {"psn_gaps": gaps, "psn_skipped": skipped, "loss_rate": rate,
                "retransmissions": float(cg["retransmissions"][f].sum()), "naks_psn_sequence": naks,
                "flows": len(f)}, flows=f)
    t = th["retransmissions"]
    for s, d, f in _by_pair(ctx, np.nonzero(cg["retransmissions"] >= max(1, t["min_packets"]))[0]):
        retx = float(cg["retransmissions"][f].sum())
        with_gap = bool((cg["psn_gaps"][f] > 0).all())
        sev = "info" if with_gap else "warning"
        em.add("retransmissions", sev, [s, d],
               f"{int(retx)} retransmitted packets on {ips[s]} -> {ips[d]} (QP {_qps(ctx, f)})"
               + (" (go-back-N recovery of the loss above)" if with_gap else
                  ": losses after this observation point or ACK timeouts; check the receiver side of the path"),
               {"retransmissions": retx, "psn_gaps": float(cg["psn_gaps"][f].sum()), "flows": len(f)}, flows=f)
    t = th["nak_errors"]
    tot = cg["nak_seq"] + cg["nak_rnr"] + cg["nak_other"]
    for s, d, f in _by_pair(ctx, np.nonzero(tot >= max(1, t["min_naks"]))[0]):
        # NAKs travel responder -> requester: the data flows are the partners
        f = np.asarray(f)
        part = ctx.partner[f]
        data_flows = part[part >= 0].tolist()
        gaps = len(data_flows) > 0 and bool((cg["psn_gaps"][data_flows] > 0).all())
        seq, rnr, oth = (float(cg[k][f].sum()) for k in ("nak_seq", "nak_rnr", "nak_other"))
        if oth > 0:
            sev, why = "critical", "remote access / invalid request errors: an application or memory-registration bug"
        elif rnr > 0:
            sev, why = "warning", "receiver-not-ready: the receiver did not post buffers in time (slow consumer)"
        else:
            sev, why = ("info" if gaps else "warning"), ("PSN sequence errors from the loss above" if gaps else
                                                           "PSN sequence errors: packets lost before the receiver")
        em.add("nak_errors", sev, [d, s],
               f"{int(seq + rnr + oth)} NAK(s) from {ips[s]} to {ips[d]} (QP {_qps(ctx, f)}): {why}",
               {"psn_sequence_error": seq, "rnr": rnr, "other": oth, "flows": len(f)}, flows=data_flows + f.tolist(),
               qps=sorted({int(q) for q in fl["dest_qp"][f]} | {int(q) for q in fl["dest_qp"][data_flows]}))


def _pfc(em, ctx, th, extra):
    t = th["pfc_pause"]
    pfc = extra["pfc"]
    ips = ctx.nodes.ips
    st = extra["stalls"]
    # the paused receivers: inbound stalls without outbound ones
    score = st["in_stall_ns"] - st["out_stall_ns"]
    q = max([p["pause_s"] / max(1, p["pause_frames"]) for p in pfc["per_priority"]
             if p["pause_frames"] and p["pause_s"]] or [0.0]) * 1e9
    floor = max(2 * q, t["min_stall_s"] * 1e9)
    suspects = [int(n) for n in np.argsort(-score) if score[n] > 0 and st["in_stall_max_ns"][n] >= floor][:3]
    for p in pfc["per_priority"]:
        if p["pause_frames"] < t["min_frames"]:
            continue
        frac = p["pause_fraction"]
        sev = "critical" if frac is not None and frac >= t["critical"] else "warning"
        who = (f"; traffic into {', '.join(ips[s] for s in suspects)} stalls meanwhile (the likely paused port)"
               if suspects else "")
        em.add("pfc_pause", sev, suspects,
               f"{p['pause_frames']} PFC pause frames on priority {p['priority']}"
               + (f" ({_us(p['pause_s'] * 1e9)} of pause at {pfc['link_gbps_est']:.0f} Gb/s, up to {_pct(frac)} of the capture)"
                  if p["pause_s"] is not None else "") + who
               + ": a receiver's buffers fill up; find the congested port (ECN/CNP findings) and check PFC headroom",
               {"priority": p["priority"], "pause_frames": p["pause_frames"], "resume_frames": p["resume_frames"],
                "quanta": p["quanta"], "pause_s": p["pause_s"], "pause_fraction": frac,
                "link_gbps_est": pfc["link_gbps_est"]},
               flows=np.nonzero(ctx.data & np.isin(ctx.nodes.dst, suspects))[0])
    if pfc["global_pause_frames"] >= t["min_frames"]:
        em.add("pfc_pause", "warning", [], f"{pfc['global_pause_frames']} 802.3x global pause frames: a link pauses all "
               "traffic; RoCE should use per-priority PFC", {"global_pause_frames": pfc["global_pause_frames"]})


def _caveats(em, ctx, th):
    m = ctx.snap.meta
    g = ctx.snap.globals
    t = th["map_overflow"]
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
    if flat and flat >= 0.1 * (flat + timed):
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
