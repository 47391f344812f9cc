"""Inference decode groups: decode_jitter, prefill_interference, slow_tp_shard; and the
decode-group parameters (analysis.inference.decode_metrics)."""
from __future__ import annotations

from skewscope.analysis.detectors.common import impact_of, lag_outliers, pct, sev, us
from skewscope.analysis.detectors.registry import Detector, Kind, Parameters, Threshold
from skewscope.analysis.steps import persistent


def decode(inp, em):
    for gi, g, r, ev in inp.groups:
        dec = r.get("decode")
        if dec:
            _one(em, inp.ctx, g, dec, ev, inp.th, gi, r)


def _one(em, ctx, g, dec, ev, th, gi, r):
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
    t = th["slow_tp_shard"]
    steps = r.get("_steps")
    if steps is not None:
        _steps_shard(em, ctx, g, dec, r, steps, t, gi)
        return
    # no step evidence (not a ring): the collective-level start lag
    busy = dec.get("collective_busy_p50_s", 0) * 1e9
    for i, v in lag_outliers(ev.decode_start_lag_ns, t["lag_mad"], max(t["min_lag_s"] * 1e9, t["lag_fraction"] * busy)):
        m = g.members[i]
        em.add("slow_tp_shard", "warning", [ips[m]] + [ips[x] for x in g.members if x != m],
               f"tensor-parallel shard {ips[m]} starts its part of each collective {us(v)} after the others "
               f"(collective takes {us(busy)} p50): every token waits for it; check that GPU/host",
               {"start_lag_s": v / 1e9, "collective_busy_p50_s": busy / 1e9},
               flows=[f for f in g.flows if ctx.nodes.src[f] == m], group=gi)


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
                 fires='decode group with ≥ `min_intervals` (1) interfered spacings; severity by `stall_share` ≥ `warning` (2 %) / `critical` (20 %)',
                 blames='the members',
                 thresholds=(Threshold("warning", 0.02, "fraction", "decode time stalled by prefill traffic: warning"),
                             Threshold("critical", 0.2, "fraction", "decode time stalled by prefill traffic: critical"),
                             Threshold("min_intervals", 1, "count", "decode spacings with prefill on the wire, at least"))),
            Kind("slow_tp_shard",
                 fires="decode ring: a member is the last to send in ≥ `last_share` (50 %) and ≥ `min_steps` (8) of the ring steps, by a median lag ≥ max(`min_lag_s` 1 µs, `lag_jitter` (4) × the step jitter) (docs: \"Steps and gates\"); critical when the time it costs is ≥ `critical_share` (50 %) of the token. Decode groups without ring steps: the collective-level start lag ≥ max(`min_lag_s`, `lag_fraction` (0.1) × collective duration, median + `lag_mad` × MAD)",
                 blames='the shard, then the others',
                 thresholds=(Threshold("min_lag_s", 1e-6, "s", "a shard's own lag per step, at least (timestamp resolution / one packet)"),
                             Threshold("last_share", 0.5, "fraction", "last to send in at least this share of the steps that have a last member"),
                             Threshold("min_steps", 8, "count", "steps it was last in, at least"),
                             Threshold("lag_jitter", 4.0, "ratio", "its median lag per step / the step jitter (1.4826 x MAD of all step lags), at least"),
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
