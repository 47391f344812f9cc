"""Inference decode groups: decode_jitter, prefill_interference, slow_tp_shard; and the
decode-group parameters (analysis.inference.decode_metrics).

prefill_interference has two causes: prefill messages inside the decode group's own flows,
and KV-cache transfers of a kv_transfer group (P/D disaggregation) into the decode group's
members, sharing their links (_kv_interference)."""
from __future__ import annotations

from math import comb

import numpy as np

from skewscope.analysis.detectors.common import STEP_THRESHOLDS, impact_of, lag_outliers, pct, sev, us
from skewscope.analysis.detectors.registry import Detector, Kind, Parameters, Threshold
from skewscope.analysis.steps import persistent


def decode(inp, em):
    kvs = [(i, ev.kv) for i, g, _, ev in inp.groups if g.kind == "kv_transfer" and ev.kv is not None]
    for gi, g, r, ev in inp.groups:
        dec = r.get("decode")
        if dec:
            if not _one(em, inp.ctx, g, dec, ev, inp.th, gi, r):
                _kv_interference(em, inp.ctx, g, dec, r, kvs, inp.th["prefill_interference"], gi)


def _one(em, ctx, g, dec, ev, th, gi, r):
    """The group's own findings; True when it raised prefill_interference (in-group prefill)."""
    ips = ctx.nodes.ips
    t = th["decode_jitter"]
    ratio = dec["decode_jitter_ratio"]
    pre = dec.get("prefill")
    if dec.get("collective_source") == "wire_bursts":
        ratio = 0.0                 # no collective cadence to judge (analysis.inference)
    em.add("decode_jitter", sev(ratio, t["warning"], t["critical"]), g.members,
           f"decode collectives every {us(dec['collective_interval_p50_s'] * 1e9)} (p50) but p99 "
           f"{us(dec['collective_interval_p99_s'] * 1e9)} ({ratio:.1f}x): token latency tail"
           + (" — mostly prefill interference, see below" if pre and pre["interfered_intervals"] else
              "; look for host interference or a slow shard"),
           {"interval_p50_s": dec["collective_interval_p50_s"], "interval_p99_s": dec["collective_interval_p99_s"],
            "interval_max_s": dec["collective_interval_max_s"], "jitter_ratio": ratio,
            "collectives_per_s": dec["collectives_per_s"]}, flows=g.flows, group=gi)
    if pre and pre["interfered_intervals"] >= th["prefill_interference"]["min_intervals"]:
        t = th["prefill_interference"]
        em.add("prefill_interference", sev(pre["stall_share"], t["warning"], t["critical"]), g.members,
               f"{pre['interfered_intervals']} decode gap(s) (up to {us((pre['max_interval_s'] or 0) * 1e9)}, p50 "
               f"{us(dec['collective_interval_p50_s'] * 1e9)}) coincide with prefill traffic "
               f"({pre['bursts']} bursts of >= {pre['threshold_bytes'] // 1024} KiB messages): decode stalled "
               f"{pct(pre['stall_share'])} of the time; use chunked prefill or separate prefill/decode instances",
               {k: pre[k] for k in ("interfered_intervals", "stall_s", "stall_share", "bursts", "bytes",
                                    "max_interval_s", "threshold_bytes")}, flows=g.flows, group=gi,
               impact=_prefill_impact(dec, r, pre))
    fired = bool(pre and pre["interfered_intervals"] >= th["prefill_interference"]["min_intervals"])
    t = th["slow_tp_shard"]
    steps = r.get("_steps")
    if steps is not None:
        _steps_shard(em, ctx, g, dec, r, steps, t, gi)
        return fired
    # no step evidence (not a ring): the collective-level start lag
    busy = dec.get("collective_busy_p50_s", 0) * 1e9
    for i, v in lag_outliers(ev.decode_start_lag_ns, t["lag_mad"], max(t["min_lag_s"] * 1e9, t["lag_fraction"] * busy)):
        m = g.members[i]
        em.add("slow_tp_shard", "warning", [ips[m]] + [ips[x] for x in g.members if x != m],
               f"tensor-parallel shard {ips[m]} starts its part of each collective {us(v)} after the others "
               f"(collective takes {us(busy)} p50): every token waits for it; check that GPU/host",
               {"start_lag_s": v / 1e9, "collective_busy_p50_s": busy / 1e9},
               flows=[f for f in g.flows if ctx.nodes.src[f] == m], group=gi)
    return fired


def kv_intervals(steps, t_start, t_end):
    """The decode group's collective spacings (consecutive collective starts of its ring
    steps) against KV transfers [t_start, t_end) (ns): (spacing ns, crosses a token boundary,
    overlap with a KV transfer ns: the largest single overlap), or None without steps."""
    if steps is None:
        return None
    cs = steps["col_start_ns"][steps["collective_start"]]
    ci = steps["col_iteration"][steps["collective_start"]]
    if len(cs) < 2:
        return None
    a, b = cs[:-1].astype(np.float64), cs[1:].astype(np.float64)
    ov = np.zeros(len(a))
    if len(t_start):
        o = np.argsort(t_start)
        ts, te = np.asarray(t_start, dtype=np.float64)[o], np.asarray(t_end, dtype=np.float64)[o]
        for i in range(len(a)):
            k = int(np.searchsorted(ts, b[i], side="left"))      # transfers starting before b
            if k:
                ov[i] = max(0.0, float((np.minimum(te[:k], b[i]) - np.maximum(ts[:k], a[i])).max()))
    return b - a, ci[1:] != ci[:-1], ov


def _kv_interference(em, ctx, g, dec, r, kvs, t, gi):
    """KV transfers into the decode group's members stretch its collective spacings: the
    spacings a KV transfer covers for at least half their length are >= `kv_ratio` x the
    others (median vs median, >= `kv_min_intervals` of each, inside tokens; >= 2 covered
    ones suffice when they are the longest by a chance <= `kv_chance`). Impact: the
    spacings a transfer touches, above the clean median of their kind (inside a token /
    across a token boundary), summed, as a share of the span, x the token period."""
    ips = ctx.nodes.ips
    mem = set(int(m) for m in g.members)
    hit = [(kg, kv, np.isin(kv["t_dst"], list(mem))) for kg, kv in kvs]
    hit = [(kg, kv, sel) for kg, kv, sel in hit if sel.any()]
    if not hit:
        return
    ts = np.concatenate([kv["t_start_ns"][sel] for _, kv, sel in hit])
    te = ts + np.concatenate([kv["t_dur_ns"][sel] for _, kv, sel in hit])
    got = kv_intervals(r.get("_steps"), ts, te)
    if got is None:
        return
    d, bnd, ov = got
    inner = ~bnd
    over = inner & (ov >= 0.5 * d)
    clean = inner & (ov <= 0)
    n_min = int(t["kv_min_intervals"])
    n_over = int(over.sum())
    if n_over < 2 or clean.sum() < n_min:
        return
    med_o, med_c = float(np.median(d[over])), float(np.median(d[clean]))
    ratio = med_o / med_c if med_c > 0 else 0.0
    if ratio < t["kv_ratio"]:
        return
    # fewer covered spacings than kv_min_intervals (a short capture, few transfers landing
    # inside tokens) count when they are the longest ones by more than chance would have it
    p_chance = _top_chance(d[over], d[over | clean])
    if n_over < n_min and p_chance > t["kv_chance"]:
        return
    extra = 0.0
    for kind in (inner, bnd):
        ref = d[kind & (ov <= 0)]
        if len(ref):
            extra += float(np.maximum(d[kind & (ov > 0)] - np.median(ref), 0.0).sum())
    span = float(d.sum())
    share = extra / span if span > 0 else 0.0
    period = dec.get("token_interval_s") or r.get("period_s")
    imp = impact_of(share * period, period) if period else None
    severity = sev(imp["share"] if imp and imp["share"] is not None else share, t["warning"], t["critical"]) or "warning"
    # the affected members: those receiving the transfers that overlap the stretched spacings
    recv = sorted({int(x) for _, kv, sel in hit for x in kv["t_dst"][sel]})
    senders = sorted({ips[int(x)] for _, kv, sel in hit for x in kv["t_src"][sel]})
    per = "token" if dec.get("token_interval_s") else "iteration"
    em.add("prefill_interference", severity, [ips[m] for m in recv],
           f"decode group {', '.join(ips[m] for m in g.members)}: its collective spacings while KV-cache transfers "
           f"from prefill nodes {', '.join(senders)} arrive at {', '.join(ips[m] for m in recv)} take "
           f"{us(med_o)} (median of {int(over.sum())}) vs {us(med_c)} without ({int(clean.sum())}), {ratio:.1f}x: "
           f"each {per} loses about {us(share * (period or 0) * 1e9)}"
           + (f" ({pct(share)})" if period else "")
           + "; schedule or rate-limit the KV transfers, or separate prefill traffic from decode "
           "(another traffic class / priority, disaggregated links)",
           {"cause": "kv_transfer", "prefill_senders": senders, "kv_receivers": [ips[m] for m in recv],
            "kv_transfers": int(len(ts)), "overlapping_intervals": int(over.sum()), "clean_intervals": int(clean.sum()),
            "interval_overlapping_p50_s": med_o / 1e9, "interval_clean_p50_s": med_c / 1e9,
            "interval_ratio": round(ratio, 4), "stall_s": extra / 1e9, "stall_share": share,
            "token_interval_s": period, "kv_groups": [int(k) for k, _, _ in hit]},
           flows=[int(f) for f in g.flows if int(ctx.nodes.src[f]) in recv or int(ctx.nodes.dst[f]) in recv],
           group=gi, impact=imp)


def _top_chance(picked, pool) -> float:
    """The chance that len(picked) spacings drawn at random from pool are all at least as
    long as the shortest of picked: C(q, k) / C(n, k), q = the pool's spacings that long."""
    k, n = len(picked), len(pool)
    q = int((pool >= float(np.min(picked))).sum())
    return comb(q, k) / comb(n, k) if n >= k > 0 else 1.0


def _prefill_impact(dec, r, pre):
    """The stalled share of the decode span times the token (else iteration) period."""
    period = dec.get("token_interval_s") or r.get("period_s")
    if not period:
        return None
    return impact_of(pre["stall_share"] * period, period)


def _steps_shard(em, ctx, g, dec, r, steps, t, gi):
    """The shard last to send in most ring steps, by a lag well above the step jitter."""
    ips = ctx.nodes.ips
    hit = persistent(steps, t, len(g.members))
    if hit is None:
        return
    i, s = hit
    m = g.members[i]
    period = dec.get("token_interval_s") or r.get("period_s")
    lost = s["lost_per_iteration_ns"] / 1e9
    imp = impact_of(lost, period)
    share = imp["share"] if imp else None
    severity = "critical" if share is not None and share >= t["critical_share"] else "warning"
    per = "token" if dec.get("token_interval_s") else "iteration"
    em.add("slow_tp_shard", severity, [ips[m]] + [ips[x] for x in g.members if x != m],
           f"tensor-parallel shard {ips[m]} is the last to send in {s['last_steps']} of {s['steps_with_last']} "
           f"ring steps, {us(s['lag_ns'])} after the others each time (step jitter {us(steps['jitter_ns'])}): "
           f"every {per} waits {us(lost * 1e9)} for it"
           + (f" ({pct(share)} of the {us(period * 1e9)} {'inter-token latency' if per == 'token' else 'period'})"
              if share is not None else "")
           + "; check that GPU/host (clocks, thermal throttling, a noisy neighbour, its NIC/PCIe)",
           {"lag_per_step_s": s["lag_ns"] / 1e9, "last_steps": s["last_steps"], "steps": s["steps_with_last"],
            "last_share": s["last_share"], "steps_per_token": s["steps_per_iteration"],
            "lost_per_token_s": lost, "token_share": share, "step_jitter_s": steps["jitter_ns"] / 1e9,
            "token_interval_s": period, "gated_tokens": s["gated"], "tokens": int(len(steps["iterations"]))},
           flows=[f for f in g.flows if ctx.nodes.src[f] == m], group=gi, impact=imp)


DETECTORS = [
    Detector(
        "decode", decode, needs=frozenset({"flows", "records", "groups"}), stage=20,
        doc="decode groups (many small collectives): cadence tail, prefill interference, a late TP shard",
        kinds=(
            Kind("decode_jitter",
                 fires='decode group: `decode_jitter_ratio` ≥ `warning` 1.5 (critical 3.0)',
                 blames='the members',
                 thresholds=(Threshold("warning", 1.5, "ratio", "p99 / p50 of the decode collective spacing: warning"),
                             Threshold("critical", 3.0, "ratio", "p99 / p50 of the decode collective spacing: critical"))),
            Kind("prefill_interference",
                 fires='decode group with ≥ `min_intervals` (1) interfered spacings (prefill messages in its own flows); '
                       'else a kv_transfer group sends into its members and its collective spacings that a KV transfer covers '
                       'for ≥ half their length have a median ≥ `kv_ratio` (1.5) × the median of those no transfer touches, '
                       'over ≥ `kv_min_intervals` (4) of each (of the covered ones ≥ 2 suffice when they are the longest by a chance ≤ `kv_chance`, 0.001); severity by `stall_share` (KV: the impact share) ≥ `warning` (2 %) / `critical` (20 %)',
                 blames='the members (KV: the members receiving the transfers)',
                 thresholds=(Threshold("warning", 0.02, "fraction", "decode time stalled by prefill traffic: warning"),
                             Threshold("critical", 0.2, "fraction", "decode time stalled by prefill traffic: critical"),
                             Threshold("min_intervals", 1, "count", "decode spacings with prefill on the wire, at least"),
                             Threshold("kv_ratio", 1.5, "ratio", "KV cause: median spacing of the collectives a KV transfer covers / of those it does not, at least"),
                             Threshold("kv_min_intervals", 4, "count", "KV cause: collective spacings covered by a KV transfer, and untouched, at least (each)"),
                             Threshold("kv_chance", 0.001, "fraction", "KV cause, fewer covered spacings than kv_min_intervals (>= 2): the chance that as many random spacings would be as long, at most"))),
            Kind("slow_tp_shard",
                 fires="decode ring: a member is the last to send in ≥ `last_share` (50 %) and ≥ `min_steps` (8) of the ring steps, by a median lag ≥ max(`min_lag_s` 1 µs, `lag_jitter` (4) × the step jitter) (docs: \"Steps and gates\"); critical when the time it costs is ≥ `critical_share` (50 %) of the token. Decode groups without ring steps: the collective-level start lag ≥ max(`min_lag_s`, `lag_fraction` (0.1) × collective duration, median + `lag_mad` × MAD)",
                 blames='the shard, then the others',
                 thresholds=(Threshold("min_lag_s", 1e-6, "s", "a shard's own lag per step, at least (timestamp resolution / one packet)"),
                             *STEP_THRESHOLDS,
                             Threshold("critical_share", 0.5, "fraction", "time lost per token / the token interval: critical"),
                             Threshold("lag_mad", 4.0, "MADs", "a late one: later than the others' median + this many MADs"),
                             Threshold("lag_fraction", 0.1, "fraction", "a late shard: later than this share of the collective's p50 duration"))),
        )),
]

PARAMETERS = [Parameters("decode", doc="decode-group classification (analysis.inference.decode_metrics)", thresholds=(
    Threshold("max_interval_s", 0.005, "s", "median spacing of a decode group's collectives, at most"),
    Threshold("min_collectives", 16, "count", "collectives in a decode group, at least"),
    Threshold("max_duty", 0.8, "fraction", "median collective duration / spacing, at most"),
    Threshold("max_message_bytes", 65536, "bytes", "median message of a decode group, at most (LL sizes)"),
    Threshold("collectives_per_token", 0, "count", "collectives per token (0 = unknown; 2 x layers for TP decode)"),
))]
