"""Inference metrics of a collective group: decode cadence, its tail, prefill
interference, the slow tensor-parallel shard. Definitions: docs/metrics.md "Inference".

* decode group: a group whose collectives (bursts at the lowest natural break of its
  activity) come at a fast rhythm: >= decode.min_collectives (16), median interval between
  them <= decode.max_interval_s (5 ms), idle in between (median collective duration
  <= decode.max_duty (0.8) x the median interval; back-to-back bursts are the steps of one
  large collective), and small messages (median <= decode.max_message_bytes, 64 KiB: LL
  sizes; larger ones are training steps). A ring whose iterations hold fewer than 2
  all-reduces each (its messages per link per iteration < 2 x 2(N - 1)) is training: a TP
  decode token runs >= 2 per layer, and the "collectives" found were the steps of one.
* collectives: when the lowest break leaves too few collectives (it is the tokens' own:
  every gap inside a token alike; or other traffic on the links blurs the layer gaps), the
  wire's bursts at gaps >= 1 us instead (collective_source "wire_bursts", else
  "breaks"); the cadence is then the wire's, not the collectives' (decode_jitter skips it).
* prefill messages: messages >= max(64 KiB, 8 x the group's median message size) in a group
  that also has small ones; the decode cadence is measured on the other messages only.
* cadence: intervals between consecutive decode collectives (burst starts) inside the
  same iteration (token) when the activity also has a longer, regular period: p50, p99,
  max; collectives_per_s = 1 / p50. With such a period, the token interval is that period
  (token_source "iterations"). Per-token time needs the collectives per token (2 x layers
  for tensor-parallel decode), from decode.collectives_per_token when given; otherwise
  null (token boundaries are not visible on the wire when the per-layer collectives are
  evenly spaced).
* decode_jitter_ratio: p99 / p50 of the intervals.
* inter-token latency (token_source "iterations"): the spacings of the token starts, p50 /
  p99 / max (itl_*_s); token_comm_share: median over tokens of (the token's first to last
  message of the group) / its spacing: the share of the token spent in its collectives
  (layer compute between them included), the rest is the compute gap.
* prefill interference: intervals > 1.5 x p50 during which prefill messages are on the wire
  between the same ranks; stall_s sums (interval - p50) over them; stall_share divides by the
  decode span.
* slow TP shard: the member whose first message of each collective starts latest relative
  to the collective's median member (median over collectives), as a sender.
"""
from __future__ import annotations

import numpy as np

from skewscope.analysis.context import context
from skewscope.analysis.intervals import merge_sorted
from skewscope.analysis.stats import counted_median, median, percentile, unique
from skewscope.analysis.timing import MIN_GAP_NS, group_timing, split_bursts

KiB = 1024


def prefill_split(ctx, flows):
    """(is_prefill per event or None, threshold bytes)."""
    u, c = ctx.data_sizes(flows)
    n = int(c.sum())
    if n < 8:
        return None, None
    thr = max(64 * KiB, 8 * counted_median(u, c))
    nbig = int(c[u >= thr].sum())
    if nbig == 0 or nbig == n:
        return None, None
    return ctx.data_events(flows) & (ctx.events["bytes"] >= thr), thr


def ring_allreduces_per_iteration(ctx, g, sel, iterations: int) -> float:
    """A ring group's all-reduces per iteration from its messages: a ring all-reduce of N
    members sends 2(N - 1) messages on each link and channel (one per step; a SIMPLE step of
    more than one slice sends more, which only overcounts); the channels are the link's
    flows (with several QPs per connection this undercounts, towards a training step)."""
    f = ctx.ev_flow[sel]
    if not len(f):
        return 0.0
    links = len(set(zip(ctx.nodes.src[f].tolist(), ctx.nodes.dst[f].tolist())))
    flows = len(unique(f))
    steps = 2 * max(1, len(g.members) - 1)
    return float(len(f)) / max(1, flows) / steps / max(1, iterations) if links else 0.0


def decode_metrics(snap, g, th: dict) -> dict | None:
    """Decode cadence / prefill / slow shard metrics of a group, or None if it is not a
    decode-like group."""
    ctx = context(snap)
    fm = np.zeros(len(ctx.flows), dtype=bool)
    fm[g.flows] = True
    big, thr = prefill_split(ctx, g.flows)
    dmask = None if big is None else ~big
    # decode collectives are small (LL-sized messages); larger ones are training steps
    u, c = ctx.data_sizes(g.flows)
    if big is not None:
        u, c = u[u < thr], c[u < thr]
    if not c.sum() or counted_median(u, c) > float(th["max_message_bytes"]):
        return None
    sel = ctx.data_events(g.flows)
    if dmask is not None:
        sel &= dmask
    tm, tinfo = group_timing(ctx, fm, members=g.members, ev_mask=dmask, level="collective")
    bs, be = tinfo["bursts_start"], tinfo["bursts_end"]
    # iterations (tokens, or prefill cycles) above the collective level, when there are any
    # (tokens by their natural breaks only: a token split by a KV stall into pieces of other
    # message counts must keep that stall inside the cadence)
    tm_it, ti_it = group_timing(ctx, fm, ev_mask=dmask, counts=False)
    its = ti_it["bursts_start"]
    src = "breaks"
    if len(bs) < int(th["min_collectives"]) and len(tinfo["activity"][0]):
        src = "wire_bursts"
        # no break below the tokens (a late shard's waits as long as the layer compute
        # make every gap inside a token alike): the wire's own bursts (gaps >= 1 us)
        a_s, a_e = tinfo["activity"]
        bs, be, _ = merge_sorted(np.ascontiguousarray(a_s), np.ascontiguousarray(a_e), MIN_GAP_NS)
    if len(bs) < int(th["min_collectives"]):
        return None
    if len(its) > 0.5 * len(bs) and len(tinfo["activity"][0]):
        # "iterations" with fewer than 2 collectives each are the steps of a slowed ring (a
        # shard's lag much longer than a step, the steps repeating regularly): the tokens are
        # the top-level bursts when coarser (their period need not be regular: a shard slow
        # from an onset)
        a_s, a_e = tinfo["activity"]
        top, _, _ = split_bursts(a_s, a_e, level="top")
        if 2 <= len(top) < len(its):
            its = top
            tm_it = dict(tm_it, period_s=None)
    if g.kind == "ring_allreduce" and 2 <= len(its) < len(bs) and \
            ring_allreduces_per_iteration(ctx, g, sel, len(its)) < 2:
        # a token of TP decode runs >= 2 all-reduces per layer; an iteration that holds one
        # (its bursts are the ring's steps) is a training step, however small its messages
        return None
    d_all = np.diff(bs)
    if 2 <= len(its) < len(bs):
        it_of = np.searchsorted(its, bs, side="right") - 1
        within = it_of[1:] == it_of[:-1]
        d = d_all[within]
    else:
        d = d_all
    if len(d) < 2:
        return None
    p50 = float(median(d))
    if p50 <= 0 or p50 > float(th["max_interval_s"]) * 1e9:
        return None
    # a decode rhythm idles between collectives (compute); back-to-back bursts are the steps
    # of one big collective, not decode
    if float(median(be - bs)) > float(th["max_duty"]) * p50:
        return None
    p99 = float(percentile(d, 99))
    out = {"workload": "decode", "collectives": int(len(bs)), "collective_source": src,
           "collectives_per_s": 1e9 / p50,
           "collective_interval_p50_s": p50 / 1e9, "collective_interval_p99_s": p99 / 1e9,
           "collective_interval_max_s": float(d.max()) / 1e9,
           "collective_busy_p50_s": float(median(be - bs)) / 1e9,
           "collective_busy_p99_s": float(percentile(be - bs, 99)) / 1e9,
           "decode_jitter_ratio": p99 / p50}
    cpt = th.get("collectives_per_token") or 0
    tok_src = None
    out["token_interval_s"] = None
    out["tokens_per_s"] = None
    if cpt:
        tok_src = "threshold"
        out["token_interval_s"] = cpt * p50 / 1e9
        out["tokens_per_s"] = 1e9 / (cpt * p50)
    elif 2 <= len(its) < len(bs) and tm_it.get("period_s") and big is None:
        tok_src = "iterations"
        out["token_interval_s"] = tm_it["period_s"]
        out["tokens_per_s"] = 1.0 / tm_it["period_s"]
        out["token_jitter_s"] = tm_it.get("period_jitter_s")
        out["collectives_per_token"] = round(len(bs) / len(its), 2)
    out["token_source"] = tok_src
    # inter-token latency and the share of each token spent communicating (token bursts)
    out["itl_p50_s"] = out["itl_p99_s"] = out["itl_max_s"] = out["token_comm_share"] = None
    if tok_src == "iterations" and len(its) >= 3:
        ite = ti_it["bursts_end"]
        itl = np.diff(its)
        out["itl_p50_s"] = float(percentile(itl, 50)) / 1e9
        out["itl_p99_s"] = float(percentile(itl, 99)) / 1e9
        out["itl_max_s"] = float(itl.max()) / 1e9
        out["token_comm_share"] = float(median(np.minimum(1.0, (ite[:-1] - its[:-1]) / itl)))
    # prefill interference
    if big is not None:
        pb = big
        ps, pe, _ = merge_sorted(np.ascontiguousarray(ctx.ev_start[pb]), np.ascontiguousarray(ctx.ev_end[pb]), 0.0)
        pps, ppe, _ = merge_sorted(ps, pe, max(1e3, p50 * 0.5))
        stretched = np.nonzero(d_all > 1.5 * p50)[0]
        d = d_all
        hit = []
        for i in stretched:
            a, b = be[i], bs[i + 1]
            j = np.searchsorted(ppe, a, side="left")
            if j < len(pps) and pps[j] < b:
                hit.append(i)
        stall = float(np.sum(d[hit] - p50)) if hit else 0.0
        span = float(bs[-1] - bs[0]) if len(bs) > 1 else 1.0
        out["prefill"] = {"threshold_bytes": int(thr), "bursts": int(len(pps)),
                          "bytes": int(ctx.events["bytes"][pb].sum()),
                          "interfered_intervals": int(len(hit)), "stretched_intervals": int(len(stretched)),
                          "stall_s": stall / 1e9, "stall_share": stall / span if span > 0 else 0.0,
                          "max_interval_s": float(d[hit].max()) / 1e9 if hit else None,
                          # the interfered spacings [end of a collective, start of the next]
                          # (ns): the onset's occurrences (not in the JSON)
                          "_hit_ns": (be[hit], bs[np.asarray(hit, dtype=np.int64) + 1]) if hit else None}
        # cadence without the interfered intervals
        clean = np.delete(d, hit) if hit else d
        if len(clean):
            out["collective_interval_p99_clean_s"] = float(percentile(clean, 99)) / 1e9
    lags = tinfo.get("start_lag_ns")
    ips = ctx.nodes.ips
    if lags is not None:
        out["member_start_lag_s"] = {ips[m]: (None if not np.isfinite(v) else float(v) / 1e9)
                                     for m, v in zip(g.members, lags)}
        if np.isfinite(lags).any():
            k = int(np.nanargmax(lags))
            out["slowest_shard"] = {"ip": ips[g.members[k]], "start_lag_s": float(lags[k]) / 1e9}
    tinfo["iter_starts"] = its if tok_src == "iterations" else None
    # token bursts without a regular period (a slow shard from an onset on stretches the
    # later tokens; prefill): the ring steps are still aligned per burst (analysis.steps)
    tinfo["token_bursts"] = its if 2 <= len(its) < len(bs) and big is None else None
    # the collectives this cadence was measured on: what the detectors compare spacings on
    # when the group has no ring steps (a token period stretched out of regularity)
    tinfo["coll_start"], tinfo["coll_end"] = bs, be
    tinfo["ev_mask"] = dmask
    out["_tinfo"] = tinfo
    return out
