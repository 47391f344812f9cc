"""Inference decode groups: decode_jitter, prefill_interference, slow_tp_shard; and the
decode-group parameters (analysis.inference.decode_metrics)."""
from __future__ import annotations

from skewscope.analysis.detectors.common import lag_outliers, pct, sev, us
from skewscope.analysis.detectors.registry import Detector, Kind, Parameters, Threshold


def decode(inp, em):
    for gi, g, r, ev in inp.groups:
        dec = r.get("decode")
        if dec:
            _one(em, inp.ctx, g, dec, ev, inp.th, gi)


def _one(em, ctx, g, dec, ev, th, gi):
    ips = ctx.nodes.ips
    t = th["decode_jitter"]
    ratio = dec["decode_jitter_ratio"]
    pre = dec.get("prefill")
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
                                    "max_interval_s", "threshold_bytes")}, flows=g.flows, group=gi)
    t = th["slow_tp_shard"]
    busy = dec.get("collective_busy_p50_s", 0) * 1e9
    for i, v in lag_outliers(ev.decode_start_lag_ns, t["lag_mad"], max(t["min_lag_s"] * 1e9, t["lag_fraction"] * busy)):
        m = g.members[i]
        em.add("slow_tp_shard", "warning", [ips[m]] + [ips[x] for x in g.members if x != m],
               f"tensor-parallel shard {ips[m]} starts its part of each collective {us(v)} after the others "
               f"(collective takes {us(busy)} p50): every token waits for it; check that GPU/host",
               {"start_lag_s": v / 1e9, "collective_busy_p50_s": busy / 1e9},
               flows=[f for f in g.flows if ctx.nodes.src[f] == m], group=gi)


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
                 fires="decode group: a member's collective-level start lag ≥ max(`min_lag_s` 5 µs, `lag_fraction` (0.1) × collective duration, median + `lag_mad` × MAD)",
                 blames='the shard, then the others',
                 thresholds=(Threshold("min_lag_s", 5e-6, "s", "a shard's start lag in each collective, at least"),
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
