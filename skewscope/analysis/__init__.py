"""skewscope.analysis: Snapshot -> skews and pathologies an SRE can act on.

Every metric is one function over a Snapshot (or its cached Context: `context(snap)`),
defined once here and in docs/metrics.md, and called by every output (report, diagnose,
top, the Prometheus exporter). Public functions:

    analyze(snap, thresholds=None, checks=None) -> {"collectives", "timing", "findings", "incidents", "metrics"}
        everything below, JSON-ready (the `report --json` / `diagnose --json` contract)
    live_metrics(snap, thresholds=None, records=False) -> dict
        the per-interval subset for a live view: flow-table metrics and the findings that
        need no classification/timing (docs/metrics.md "Live subset")

    skew_stats(x) -> {"n","sum","mean","max","min","max_over_mean","min_over_mean","cv","gini",
                      "jain","argmax","max_share"}                       stats.py
    node_index(snap.flows) -> Nodes(ips, src[], dst[])                  flows.py
    flow_roles(snap) -> int8[] (ROLE_NAMES: data/cts/ack/read_request/cnp/management/other)
    flow_event_stats(snap) -> per-flow FSTAT_DTYPE (rate over active time, busy, MTU, stalls)
    node_matrix(snap, flow_mask=None, t_range=None) -> (ips, bytes[i, j])   matrix.py
    link_rates(snap) -> LINK_DTYPE per directed node pair (rate, throughput, CE, CNP, loss)
    link_counters(snap) -> the same counters without the records (live per-interval work)
    node_volumes(snap) -> (bytes out[], bytes in[])
    incast_degree(snap, flow_mask=None) -> {"max_senders"[], "mean_senders"[], ...}
    flow_congestion(snap) -> CONG_DTYPE per flow (ce_fraction, cnp_rate_per_s, loss_rate, NAKs)
    pfc_summary(snap) -> {"frames", "per_priority": [...]}                congestion.py
    node_stalls(snap) -> per-node stalled-message time in/out
    discover(snap) -> [Group(kind, members, flows, confidence, evidence, pattern)]   collectives.py
    group_timing(snap, flow_mask, members) -> (timing dict, bursts)       timing.py
    timing(snap) -> capture-level period/jitter or None
    ring_metrics / tree_metrics / alltoall_metrics / pipeline_metrics     group_metrics.py
    decode_metrics(snap, group, thresholds["decode"])                     inference.py
    DEFAULTS (thresholds), KINDS (finding kinds)                          findings.py
    the detectors and their registry                                      detectors/
"""
from __future__ import annotations

import math

import numpy as np

from skewscope.analysis.collectives import KINDS as COLLECTIVE_KINDS
from skewscope.analysis.collectives import discover, size_hints
from skewscope.analysis.congestion import (
    congestion_columns,
    congestion_table,
    flow_congestion,
    link_speed_bps,
    node_stalls,
    pfc_summary,
)
from skewscope.analysis.context import Context, context
from skewscope.analysis.detectors.evidence import GroupEvidence
from skewscope.analysis.findings import (
    DEFAULTS,
    KINDS,
    ThresholdError,
    detect,
    live_findings,
    resolve_checks,
    resolve_thresholds,
)
from skewscope.analysis.flows import ROLE_NAMES, flow_event_stats, flow_roles, node_index
from skewscope.analysis.incidents import assign as assign_incidents
from skewscope.analysis.group_metrics import (
    MAX_LINK_ROWS,
    alltoall_metrics,
    group_links,
    node_throughput,
    p2p_metrics,
    pipeline_metrics,
    ring_metrics,
    tree_metrics,
)
from skewscope.analysis.inference import decode_metrics
from skewscope.analysis.kv import kv_metrics
from skewscope.analysis.matrix import incast_degree, link_counters, link_rates, node_matrix, node_volumes
from skewscope.analysis.stats import skew_stats
from skewscope.analysis.steps import group_steps
from skewscope.analysis.timing import group_timing, timing
from skewscope.core import layout as L

__all__ = ["analyze", "live_metrics", "skew_stats", "node_index", "flow_roles", "flow_event_stats", "node_matrix",
           "link_rates", "link_counters", "node_volumes", "incast_degree", "flow_congestion", "pfc_summary", "node_stalls",
           "discover", "group_timing", "timing", "ring_metrics", "tree_metrics", "alltoall_metrics",
           "pipeline_metrics", "decode_metrics", "context", "Context", "DEFAULTS", "KINDS", "ThresholdError",
           "ROLE_NAMES", "COLLECTIVE_KINDS", "link_speed_bps", "size_hints", "group_links"]

JSON_VERSION = 1
MAX_GROUP_DETAIL = 64


_PLAIN = (str, int, bool, type(None))


def clean(x):
    """JSON-safe copy: numpy -> Python, NaN/inf -> None, private keys (leading _) dropped."""
    t = type(x)
    if t in _PLAIN:                          # the common leaves first (a finding has ~30 of them)
        return x
    if t is float:
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): clean(v) for k, v in x.items() if not str(k).startswith("_")}
    if isinstance(x, (list, tuple)):
        return [clean(v) for v in x]
    if isinstance(x, np.ndarray):
        return clean(x.tolist())
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating, float)):
        v = float(x)
        return v if math.isfinite(v) else None
    if isinstance(x, np.bool_):
        return bool(x)
    return x


def _group_result(ctx, g, th) -> dict:
    fm = np.zeros(len(ctx.flows), dtype=bool)
    fm[g.flows] = True
    dec = decode_metrics(ctx, g, th["decode"]) if g.kind in ("ring_allreduce", "all_to_all", "tree_allreduce") else None
    # a decode group's tokens are decode_metrics' (natural breaks); iterations by their
    # message counts would be its collectives when prefill makes the tokens' counts differ
    tm, tinfo = group_timing(ctx, fm, members=g.members, counts=dec is None)
    r = dict(tm)
    r["bytes"] = float(ctx.volume[g.flows].sum())
    r["flows"] = int(len(g.flows))
    pairs = len(set(zip(ctx.nodes.src[g.flows].tolist(), ctx.nodes.dst[g.flows].tolist())))
    r["qps_per_pair"] = round(len(g.flows) / max(1, pairs), 3)
    hints = g.extra.get("_hints") or size_hints(ctx, g.flows)
    r["message_sizes"] = hints["top_sizes"]
    r["protocol_hint"] = hints["protocol"]
    r["protocol_shares"] = hints.get("protocol_shares")
    lags = tinfo.get("start_lag_ns")
    if lags is not None:
        r["start_lag_s"] = {ctx.nodes.ips[m]: (None if not np.isfinite(v) else float(v) / 1e9)
                            for m, v in zip(g.members, lags)}
    r["_start_lag_ns"] = lags
    r["_send_dev_ns"] = tinfo.get("send_dev_ns")
    r["_recv_dev_ns"] = tinfo.get("recv_dev_ns")
    if tinfo.get("bursts_start") is not None:
        r["_bursts"] = (tinfo["bursts_start"], tinfo["bursts_end"])
    if g.kind != "ring_allreduce":
        nt = node_throughput(ctx, g.flows, g.members)
        r["_node_tp"] = nt
        r["member_send_ratio"] = {ctx.nodes.ips[m]: v for m, v in zip(g.members, nt["send_ratio"])}
    if g.kind == "ring_allreduce":
        r.update(ring_metrics(ctx, g, tinfo))
    elif g.kind == "tree_allreduce":
        r.update(tree_metrics(ctx, g, tinfo))
    elif g.kind == "all_to_all":
        r.update(alltoall_metrics(ctx, g, tinfo))
    elif g.kind == "p2p" and g.pattern == "pipeline":
        r.update(pipeline_metrics(ctx, g, tinfo, tm.get("period_s")))
    elif g.kind == "kv_transfer":
        r.update(kv_metrics(ctx, g))
    else:
        r.update(p2p_metrics(ctx, g, tinfo))
    if dec is not None:
        r["decode"] = dec
        r["workload"] = "decode"
    if g.kind in ("ring_allreduce", "all_to_all", "tree_allreduce"):
        r["_steps"] = group_steps(ctx, g, r, tinfo)       # hierarchy, gates (analysis.steps)
    r.setdefault("workload", "training" if r.get("period_s") else None)
    return r, GroupEvidence.split(r)


def _capture_metrics(ctx, extra) -> dict:
    fl = ctx.cols
    roles = ctx.roles
    by_role = {}
    for i, name in enumerate(ROLE_NAMES):
        sel = roles == i
        if sel.any():
            by_role[name] = {"flows": int(sel.sum()), "packets": int(fl["packets"][sel].sum()),
                             "bytes": int(fl["bytes"][sel].sum())}
    out_b, in_b = node_volumes(ctx)
    recv = in_b > 0
    send = out_b > 0
    lr = link_rates(ctx)
    ips = ctx.nodes.ips
    if len(lr) > MAX_LINK_ROWS:            # the JSON keeps the busiest links
        lr = lr[np.argsort(-lr["bytes"], kind="stable")[:MAX_LINK_ROWS]]
    m = {
        "nodes": ctx.nodes.n,
        "flows_by_role": by_role,
        "data_bytes": float(ctx.volume.sum()) * ctx.scale,
        "node_in_bytes": {ips[i]: float(in_b[i]) for i in np.nonzero(recv)[0]},
        "node_out_bytes": {ips[i]: float(out_b[i]) for i in np.nonzero(send)[0]},
        "dest_volume_skew": skew_stats(in_b[recv]),
        "source_volume_skew": skew_stats(out_b[send]),
        "link_rate_skew": skew_stats(lr["rate_bps"][np.isfinite(lr["rate_bps"])]) if len(lr) else skew_stats([]),
        "links": [{"src": ips[int(r["src"])], "dst": ips[int(r["dst"])], "flows": int(r["flows"]),
                   "bytes": float(r["bytes"]), "rate_bps": float(r["rate_bps"]),
                   "throughput_bps": float(r["throughput_bps"]), "busy_s": float(r["busy_ns"]) / 1e9,
                   "ce": float(r["ce"]), "cnp": float(r["cnp"]), "psn_gaps": float(r["psn_gaps"]),
                   "retransmissions": float(r["retransmissions"]), "naks": float(r["naks"])} for r in lr],
        "pfc": extra["pfc"],
        "incast_max_senders": {ips[i]: int(v) for i, v in enumerate(extra["incast"]["max_senders"]) if v > 0},
        "congestion": {
            "ce_packets": float(extra["congestion"]["ce"].sum()),
            "cnp_packets": float(extra["congestion"]["cnp"].sum()),
            "psn_gaps": float(extra["congestion"]["psn_gaps"].sum()),
            "retransmissions": float(extra["congestion"]["retransmissions"].sum()),
            "naks": float((extra["congestion"]["nak_seq"] + extra["congestion"]["nak_rnr"]
                           + extra["congestion"]["nak_other"]).sum()),
        },
        "link_gbps_est": extra["pfc"]["link_gbps_est"],
    }
    return m


def _extra(ctx, th):
    inc = incast_degree(ctx)
    # senders into each node (data flows) for incast entities
    senders = {}
    d = np.nonzero(ctx.data)[0]
    for f in d:
        senders.setdefault(int(ctx.nodes.dst[f]), set()).add(int(ctx.nodes.src[f]))
    link_gbps = th["pfc_pause"].get("link_gbps") or None
    return {"incast": inc, "incast_senders": {k: sorted(v) for k, v in senders.items()},
            "congestion": congestion_columns(ctx), "pfc": pfc_summary(ctx, link_gbps), "stalls": node_stalls(ctx)}


def group_timing_summary(i, g, r) -> dict | None:
    """A group's timing as the report prints it (the `timing` shape: period, jitter,
    iterations, workload, decode cadence and tokens, hierarchy; "group" = its index), or
    None: no period, or not a rhythm (a lone pair's, a kv_transfer's)."""
    # a rhythm is a collective's (or a pipeline's), not a lone pair's
    if g.kind not in ("ring_allreduce", "tree_allreduce", "all_to_all") and g.pattern != "pipeline":
        return None
    if not r.get("period_s"):
        return None
    tim = {k: r.get(k) for k in ("period_s", "period_jitter_s", "period_cv", "iterations", "busy_fraction",
                                 "burst_busy_s", "period_source", "interval_p50_s", "interval_p99_s")}
    tim["group"] = i
    tim["workload"] = r.get("workload")
    dec = r.get("decode")
    if dec:
        tim.update({k: dec.get(k) for k in ("collectives_per_s", "collective_interval_p50_s",
                                            "collective_interval_p99_s", "decode_jitter_ratio",
                                            "token_interval_s", "tokens_per_s", "itl_p50_s", "itl_p99_s",
                                            "itl_max_s", "token_comm_share")})
    tim["hierarchy"] = r.get("hierarchy")
    return tim


def analyze(snap, thresholds=None, checks=None) -> dict:
    """All metrics, collective groups, timing and findings of a Snapshot (JSON-ready).
    thresholds: {"KIND.NAME": value} or {"KIND": {"NAME": value}} over findings.DEFAULTS;
    checks: finding kinds to run (None = all). Raises ThresholdError on unknown names."""
    th = resolve_thresholds(thresholds)
    ck = resolve_checks(checks)
    ctx = context(snap)
    groups = discover(ctx)
    # per-group metrics for the largest groups (each costs a pass over the records); the
    # others keep their classification, bytes and flows
    detail = [_group_result(ctx, g, th) if i < MAX_GROUP_DETAIL else
              ({"bytes": float(ctx.volume[g.flows].sum()), "flows": int(len(g.flows)), "detail": "omitted"},
               GroupEvidence())
              for i, g in enumerate(groups)]
    results = [r for r, _ in detail]
    extra = _extra(ctx, th)
    findings = detect(ctx, groups, results, th, ck, extra, evidence=[e for _, e in detail])
    ips = ctx.nodes.ips
    coll = []
    for g, r in zip(groups, results):
        coll.append({"kind": g.kind, "pattern": g.pattern, "members": [ips[m] for m in g.members],
                     "confidence": g.confidence, "evidence": g.evidence,
                     "metrics": {k: v for k, v in r.items() if not k.startswith("_")}})
    # every group keeps its own timing (two jobs on one fabric: a training ring's iterations
    # next to a decode group's tokens); "timing" stays the first one's (the capture's rhythm)
    tim = None
    for i, (g, r) in enumerate(zip(groups, results)):
        t = group_timing_summary(i, g, r)
        coll[i]["timing"] = t
        if t is not None and tim is None:
            tim = t
    doc = {"analysis_version": JSON_VERSION, "collectives": coll, "timing": tim, "findings": findings,
           "metrics": _capture_metrics(ctx, extra), "thresholds": th}
    return assign_incidents(clean(doc))


def live_metrics(snap, thresholds=None, records: bool = False) -> dict:
    """The per-interval subset a live view refreshes (docs/metrics.md "Live subset"):
    from the flow table only -- roles, QP-pair partners, node matrix and its destination/
    source skews, per-link counters (bytes, CE, CNPs, PSN gaps, retransmissions, NAKs),
    per-flow congestion/loss indicators, and the findings that need no classification or
    timing: the detectors registered live=True (congestion: ecn_congestion, cnp_storm; loss:
    packet_loss, retransmissions, nak_errors; pfc: pfc_pause; caveats: map_overflow,
    sampling). records=True adds the message-record metrics: per-flow
    rate over active time and busy time, link rates and throughput, stalls."""
    th = resolve_thresholds(thresholds)
    ctx = context(snap)
    ips, mat = node_matrix(ctx)
    cg = congestion_table(ctx, active_time=records)   # {field: column} (what the detectors read)
    out_b, in_b = mat.sum(axis=1), mat.sum(axis=0)
    n = ctx.nodes.n
    if records:
        stalls = node_stalls(ctx)
    else:
        z = np.zeros(n)
        stalls = {f"{d}_{k}": z for d in ("in", "out") for k in ("stall_ns", "stall_n", "stall_max_ns", "busy_ns")}
    gbps = th["pfc_pause"].get("link_gbps") or None
    extra = {"congestion": cg, "pfc": pfc_summary(ctx, gbps) if (records or gbps) else _pfc_counts(ctx),
             "stalls": stalls}
    findings = live_findings(ctx, th, cg, extra["pfc"], stalls)  # the detectors registered live=True
    res = {"roles": ctx.roles, "partner": ctx.partner, "ips": ips, "matrix": mat,
           "links": link_counters(ctx),
           "dest_volume_skew": skew_stats(in_b[in_b > 0]), "source_volume_skew": skew_stats(out_b[out_b > 0]),
           "congestion": cg, "pfc": extra["pfc"], "findings": clean(findings)}
    if records:
        st = ctx.fstat
        lr = link_rates(ctx)
        res.update({"rate_bps": st["rate_bps"], "busy_ns": st["busy_ns"], "link_rates": lr,
                    "link_rate_skew": skew_stats(lr["rate_bps"][np.isfinite(lr["rate_bps"])]) if len(lr)
                    else skew_stats([])})
    return res


def _pfc_counts(ctx) -> dict:
    """pfc_summary without a link speed (no records to estimate it): counts only."""
    g = ctx.snap.globals
    sc = float(ctx.scale)
    return {"frames": int(g[L.G_PFC] * sc), "global_pause_frames": int(g[L.G_PAUSE] * sc), "link_gbps_est": None,
            "per_priority": [{"priority": p, "pause_frames": int(g[L.G_PFC_PAUSE + p] * sc),
                              "resume_frames": int(g[L.G_PFC_XON + p] * sc),
                              "quanta": int(g[L.G_PFC_QUANTA + p] * sc), "pause_s": None, "pause_fraction": None}
                             for p in range(8)]}
