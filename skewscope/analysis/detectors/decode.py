"""Inference decode groups: decode_jitter, prefill_interference, slow_tp_shard; and the
decode-group parameters (analysis.inference.decode_metrics).

prefill_interference has two causes: prefill messages inside the decode group's own flows,
and KV-cache transfers of a kv_transfer group (P/D disaggregation) into the decode group's
members, sharing their links (_kv_interference)."""
from __future__ import annotations

from math import comb

import numpy as np

from skewscope.analysis.detectors import actions as A
from skewscope.analysis.detectors.common import (
    STEP_THRESHOLDS,
    impact_of,
    lag_outliers,
    pct,
    sev,
    shared_successors,
    us,
)
from skewscope.analysis.detectors.ownview import collective_spacing, segment_timing
from skewscope.analysis.detectors.registry import KEY_BLAMED, KEY_MEMBERS, Detector, Kind, Parameters, Threshold
from skewscope.analysis.collectives import Group, _one_way_ends
from skewscope.analysis.intervals import natural_break
from skewscope.analysis.kv import kv_metrics
from skewscope.analysis.onset import Onset, episode
from skewscope.analysis.stats import median, percentile, unique
from skewscope.analysis.steps import persistent
from skewscope.analysis.timing import BREAK_RATIO


class _Held:
    """Findings held back to be emitted after others (an emitter's add, recorded)."""

    def __init__(self):
        self.calls = []

    def add(self, *a, **k):
        self.calls.append((a, k))


def decode(inp, em):
    kvs = [(i, ev.kv, True) for i, g, _, ev in inp.groups if g.kind == "kv_transfer" and ev.kv is not None]
    t = inp.th["prefill_interference"]
    for gi, g, r, ev in inp.groups:
        dec = r.get("decode")
        if not dec:
            continue
        pre = dec.get("prefill")
        kv = _Held()
        if not (pre and pre["interfered_intervals"] >= t["min_intervals"]):
            # KV transfers into the members (judged first: decode_jitter then points at them)
            _kv_interference(kv, inp.ctx, g, dec, r, kvs + _bulk_into(inp, g), t, gi, ev.decode_colls)
        _one(em, inp.ctx, g, dec, ev, inp.th, gi, r, kv_cause=bool(kv.calls))
        for a, k in kv.calls:
            em.add(*a, **k)


def _bulk_into(inp, g) -> list:
    """One-way p2p components (a star, a pair) that send bulk messages into members of the
    decode group g from nodes outside it: the KV-cache transfers of a P/D deployment that
    the grouping left as p2p (a single star or pair is not a kv_transfer group on its own).
    Bulk: their median message >= max(64 KiB, 8 x the decode group's median message), the
    prefill_split rule. [(group index, per-transfer arrays (analysis.kv), False)]."""
    ctx = inp.ctx
    mem = {int(m) for m in g.members}
    mine = _median_message(ctx, g.flows)
    out = []
    if mine is None:
        return out
    for hi, h, _, _ in inp.groups:
        ends = _one_way_ends(h)
        if ends is None:
            continue
        snd, rcv = ends
        if mem.isdisjoint(rcv) or not mem.isdisjoint(snd):
            continue
        theirs = _median_message(ctx, h.flows)
        if theirs is None or theirs < max(64 * 1024, 8 * mine):
            continue
        pseudo = Group("kv_transfer", list(snd) + list(rcv), h.flows, h.confidence, [], "prefill_decode",
                       {"prefill": list(snd), "decode": list(rcv)})
        out.append((hi, kv_metrics(ctx, pseudo)["_kv"], False))
    return out


def _median_message(ctx, flows) -> float | None:
    ok = ctx.data_events(flows)
    return float(median(ctx.events["bytes"][ok])) if ok.any() else None


def _one(em, ctx, g, dec, ev, th, gi, r, kv_cause=False):
    """The group's own findings; True when it raised prefill_interference (in-group prefill).
    kv_cause: KV transfers into its members stretch its spacings (a finding that follows)."""
    ips = ctx.nodes.ips
    t = th["decode_jitter"]
    ratio = dec["decode_jitter_ratio"]
    p50, p99 = dec["collective_interval_p50_s"], dec["collective_interval_p99_s"]
    pre = dec.get("prefill")
    if dec.get("collective_source") == "wire_bursts":
        ratio = 0.0                 # no collective cadence to judge (analysis.inference)
    if g.pattern == "ring_segment" and not pre:
        # one DPU's view of a ring: when every step waits on a slow member, the view's
        # bursts are the steps, not the collectives; its node's own collectives (every
        # M-th send: analysis.nodeview) are what a token is made of
        seg = segment_timing(ctx, g)
        d = collective_spacing(seg[1]) if seg is not None else None
        if seg is not None and seg[1]["role"] != "tp_decode":
            ratio = 0.0             # the node's own view: one collective per iteration, no decode cadence
        elif d is not None:
            p50, p99 = float(median(d)) / 1e9, float(percentile(d, 99)) / 1e9
            ratio = p99 / p50 if p50 > 0 else 0.0
    em.add("decode_jitter", sev(ratio, t["warning"], t["critical"]), g.members,
           f"decode collectives every {us(p50 * 1e9)} (p50) but p99 "
           f"{us(p99 * 1e9)} ({ratio:.1f}x): token latency tail"
           + (" — mostly prefill interference, see below" if pre and pre["interfered_intervals"] else
              " — KV-cache transfers into its members, see prefill_interference below" if kv_cause else
              "; look for host interference or a slow shard"),
           {"interval_p50_s": p50, "interval_p99_s": p99,
            "interval_max_s": dec["collective_interval_max_s"], "jitter_ratio": ratio,
            "collectives_per_s": dec["collectives_per_s"]}, flows=g.flows, group=gi,
           onset=_jitter_onset(ev, dec, t["warning"]))
    if pre and pre["interfered_intervals"] >= th["prefill_interference"]["min_intervals"]:
        t = th["prefill_interference"]
        em.add("prefill_interference", sev(pre["stall_share"], t["warning"], t["critical"]), g.members,
               f"{pre['interfered_intervals']} decode gap(s) (up to {us((pre['max_interval_s'] or 0) * 1e9)}, p50 "
               f"{us(dec['collective_interval_p50_s'] * 1e9)}) coincide with prefill traffic "
               f"({pre['bursts']} bursts of >= {pre['threshold_bytes'] // 1024} KiB messages): decode stalled "
               f"{pct(pre['stall_share'])} of the time; use chunked prefill or separate prefill/decode instances",
               {k: pre[k] for k in ("interfered_intervals", "stall_s", "stall_share", "bursts", "bytes",
                                    "max_interval_s", "threshold_bytes")}, flows=g.flows, group=gi,
               impact=_prefill_impact(dec, r, pre), onset=_spacings_onset(ev.decode_colls, pre.get("_hit_ns")))
    fired = bool(pre and pre["interfered_intervals"] >= th["prefill_interference"]["min_intervals"])
    if g.pattern == "ring_segment":
        return fired                # one DPU's view: its own node only (ownview.py)
    t = th["slow_tp_shard"]
    steps = r.get("_steps")
    if steps is not None:
        _steps_shard(em, ctx, g, dec, r, steps, t, gi, ev.decode_start_lag_ns)
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


def _spacings_onset(colls, hits):
    """Occurrences (spacings [start, end) ns) as an episode against the group's collectives."""
    if colls is None or hits is None or not len(hits[0]) or not len(colls[0]):
        return None
    cs, ce = (np.asarray(x, dtype=np.float64) for x in colls)
    return episode(hits[0], hits[1], float(cs[0]), float(ce.max()))


def _jitter_onset(ev, dec, warn):
    """decode_jitter's occurrences: the collective spacings >= warning x their p50 (inside a
    token when the tokens are known: a token boundary is no jitter)."""
    if ev.decode_colls is None or not dec.get("collective_interval_p50_s"):
        return None
    cs, ce = (np.asarray(x, dtype=np.float64) for x in ev.decode_colls)
    if len(cs) < 3:
        return None
    d = np.diff(cs)
    long_ = d >= warn * dec["collective_interval_p50_s"] * 1e9
    its = ev.decode_iters
    if its is not None and len(its) >= 2:
        k = np.searchsorted(np.asarray(its, dtype=np.float64), cs, side="right")
        long_ &= k[1:] == k[:-1]
    return _spacings_onset(ev.decode_colls, (cs[:-1][long_], cs[1:][long_]))


def _overlaps(a, b, t_start, t_end):
    """Per spacing [a_i, b_i): the largest single overlap with a transfer [t_start, t_end)."""
    ov = np.zeros(len(a))
    if len(t_start):
        o = np.argsort(t_start)
        ts, te = np.asarray(t_start, dtype=np.float64)[o], np.asarray(t_end, dtype=np.float64)[o]
        for i in range(len(a)):
            k = int(np.searchsorted(ts, b[i], side="left"))      # transfers starting before b
            if k:
                ov[i] = max(0.0, float((np.minimum(te[:k], b[i]) - np.maximum(ts[:k], a[i])).max()))
    return ov


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
    return b - a, ci[1:] != ci[:-1], _overlaps(a, b, t_start, t_end)


def token_positions(d, clean, min_tokens=3):
    """Token structure of a decode group's collective spacings d when no token split is
    known (interference stretched the token period out of regularity): every token has the
    same number n of collectives (2 x layers for tensor-parallel decode), so the token
    boundaries are the spacings above the top natural break of the `clean` ones (no
    transfer touches them: the compute gap between tokens against the spacings inside a
    token), n the smallest distance between two of them in collectives, and the other
    boundaries fall every n spacings from the first. (position of each spacing inside its
    token: 0 .. n-2 inside, n-1 = the boundary) or None: fewer than `min_tokens` clean
    boundaries, or ones that do not fall on one such grid (>= 80 % must)."""
    thr = natural_break(d[clean], BREAK_RATIO)
    if not np.isfinite(thr):
        return None
    idx = np.nonzero(clean & (d > thr))[0]
    if len(idx) < min_tokens:
        return None
    n = int(np.diff(idx).min())
    if n < 2:
        return None
    k0 = int(idx[0]) % n
    on_grid = (idx - k0) % n == 0
    if on_grid.mean() < 0.8:
        return None
    return (np.arange(len(d)) - k0 - 1) % n


def _stretch_by_steps(d, bnd, ov, t) -> dict | None:
    """Ring steps' collective spacings d (crossing a token boundary: bnd) against the
    transfers' overlaps ov: the covered ones inside tokens (>= half their length) against the
    untouched ones, median vs median (see _kv_interference)."""
    inner = ~bnd
    over = inner & (ov >= 0.5 * d)
    clean = inner & (ov <= 0)
    n_min = int(t["kv_min_intervals"])
    n_over = int(over.sum())
    if n_over < 2 or clean.sum() < n_min:
        return None
    med_c, med_o = float(median(d[clean])), float(median(d[over]))
    ratio = med_o / med_c if med_c > 0 else 0.0
    if ratio < t["kv_ratio"]:
        return None
    # fewer covered spacings than kv_min_intervals (a short capture, few transfers landing
    # inside tokens) count when they are the longest ones by more than chance would have it
    if n_over < n_min and _top_chance(d[over], d[over | clean]) > t["kv_chance"]:
        return None
    extra = 0.0
    for kind in (inner, bnd):
        r0 = d[kind & (ov <= 0)]
        if len(r0):
            extra += float(np.maximum(d[kind & (ov > 0)] - median(r0), 0.0).sum())
    return {"d": d, "over": over, "clean": clean, "ratio": ratio, "med_o": med_o, "med_c": med_c, "extra": extra}


def stretch_by_position(d, ov, t) -> dict | None:
    """A decode group's collective spacings d without ring steps, against the transfers'
    overlaps ov: tokens rebuilt by token_positions; each spacing's reference is the median
    of the clean ones (no overlap) at its position in the token (attention and MLP
    all-reduces, the steps inside one, are spaced differently); the covered ones inside
    tokens (>= half their length) must sum to >= `kv_ratio` x their references, with more
    of them >= `kv_ratio` x their reference than a binomial chance <= `kv_chance` allows
    (the chance of one taken from the clean spacings: a transfer stretches some spacings,
    e.g. those between all-reduces, not the steps inside one). None: no token structure,
    too few spacings, or no such stretch. extra: the touched spacings' time above their
    references."""
    pos = token_positions(d, ov <= 0)
    if pos is None:
        return None
    inner = pos != pos.max()
    ref = np.full(len(d), np.nan)
    for q in unique(pos):
        c = d[(pos == q) & (ov <= 0)]
        if len(c):                                # a short capture may have one clean token
            ref[pos == q] = float(median(c))
    known = np.isfinite(ref)
    over = inner & (ov >= 0.5 * d) & known
    clean = inner & (ov <= 0) & known
    n_over = int(over.sum())
    if n_over < 2 or clean.sum() < int(t["kv_min_intervals"]):
        return None
    ratio = float(d[over].sum() / ref[over].sum())
    long_ = d >= t["kv_ratio"] * ref
    q = (int((clean & long_).sum()) + 1) / (int(clean.sum()) + 1)
    if ratio < t["kv_ratio"] or _tail(int((over & long_).sum()), n_over, q) > t["kv_chance"]:
        return None
    touched = (ov > 0) & known
    return {"d": d, "over": over, "clean": clean, "ratio": ratio, "med_o": float(median(d[over])),
            "med_c": float(median(d[clean])), "extra": float(np.maximum(d[touched] - ref[touched], 0.0).sum()),
            "pos": pos}


def _kv_interference(em, ctx, g, dec, r, kvs, t, gi, colls=None):
    """KV transfers into the decode group's members stretch its collective spacings: the
    spacings a KV transfer covers for at least half their length are >= `kv_ratio` x the
    others (median vs median, >= `kv_min_intervals` of each, inside tokens; >= 2 covered
    ones suffice when they are the longest by a chance <= `kv_chance`). Impact: the
    spacings a transfer touches, above the clean median of their kind (inside a token /
    across a token boundary), summed, as a share of the span, x the token period.
    Transfers: the kv_transfer groups' (kvs, grouped True) and one-way bulk components into
    the members (_bulk_into). A group without ring steps (its token period stretched out of
    regularity) is read on its decode collectives `colls`, tokens rebuilt by
    token_positions, each covered spacing against the clean median at its position in the
    token: the covered ones' sum >= `kv_ratio` x their references' sum, and more of them
    >= `kv_ratio` x their reference than a binomial chance <= `kv_chance` allows, the chance
    of one taken from the clean spacings."""
    ips = ctx.nodes.ips
    mem = set(int(m) for m in g.members)
    hit = [(kg, kv, np.isin(kv["t_dst"], list(mem)), grouped) for kg, kv, grouped in kvs]
    hit = [(kg, kv, sel, grouped) for kg, kv, sel, grouped in hit if sel.any()]
    if not hit:
        return
    ts = np.concatenate([kv["t_start_ns"][sel] for _, kv, sel, _ in hit])
    te = ts + np.concatenate([kv["t_dur_ns"][sel] for _, kv, sel, _ in hit])
    steps = r.get("_steps")
    # steps over token bursts without a regular period: the collectives by token position
    got = kv_intervals(steps if steps is None or steps.get("regular_tokens", True) else None, ts, te)
    if got is not None:
        res = _stretch_by_steps(*got, t)
        st_ = r["_steps"]
        cs = np.asarray(st_["col_start_ns"][st_["collective_start"]], dtype=np.float64)
    elif colls is not None and len(colls[0]) >= 3:
        # no ring steps: the decode collectives, tokens rebuilt from the clean spacings
        cs = np.asarray(colls[0], dtype=np.float64)
        res = stretch_by_position(cs[1:] - cs[:-1], _overlaps(cs[:-1], cs[1:], ts, te), t)
    else:
        return
    if res is None:
        return
    d, over, clean, ratio, med_o, med_c, extra = (res[k] for k in ("d", "over", "clean", "ratio", "med_o", "med_c",
                                                                    "extra"))
    pos = res.get("pos")
    span = float(d.sum())
    share = extra / span if span > 0 else 0.0
    period = dec.get("token_interval_s") or r.get("period_s")
    imp = impact_of(share * period, period) if period else None
    severity = sev(imp["share"] if imp and imp["share"] is not None else share, t["warning"], t["critical"]) or "warning"
    # the affected members: those receiving the transfers that overlap the stretched spacings
    recv = sorted({int(x) for _, kv, sel, _ in hit for x in kv["t_dst"][sel]})
    senders = sorted({ips[int(x)] for _, kv, sel, _ in hit for x in kv["t_src"][sel]})
    per = "token" if dec.get("token_interval_s") else "iteration"
    grouped = all(gr for _, _, _, gr in hit)
    what = ("KV-cache transfers from prefill nodes" if grouped else
            "one-way bulk transfers (KV-cache from prefill, by their shape) from")
    em.add("prefill_interference", severity, [ips[m] for m in recv],
           f"decode group {', '.join(ips[m] for m in g.members)}: its collective spacings while {what} "
           f"{', '.join(senders)} arrive at {', '.join(ips[m] for m in recv)} take "
           + (f"{us(med_o)} (median of {int(over.sum())}) vs {us(med_c)} without ({int(clean.sum())}), {ratio:.1f}x: "
              if pos is None else
              f"{ratio:.1f}x as long in all as the same spacings of the tokens no transfer touches "
              f"({int(over.sum())} spacings; median {us(med_o)} vs {us(med_c)}): ")
           + (f"each {per} loses about {us(share * period * 1e9)} ({pct(share)})" if period else
              f"decode lost {us(extra)} ({pct(share)} of its span)")
           + "; schedule or rate-limit the KV transfers, or separate prefill traffic from decode "
           "(another traffic class / priority, disaggregated links)",
           {"cause": "kv_transfer" if grouped else "one_way_bulk", "prefill_senders": senders,
            "kv_receivers": [ips[m] for m in recv], "reference": "all tokens" if pos is None else "same position in the token",
            "kv_transfers": int(len(ts)), "overlapping_intervals": int(over.sum()), "clean_intervals": int(clean.sum()),
            "interval_overlapping_p50_s": med_o / 1e9, "interval_clean_p50_s": med_c / 1e9,
            "interval_ratio": round(ratio, 4), "stall_s": extra / 1e9, "stall_share": share,
            "token_interval_s": period, "kv_groups": [int(k) for k, _, _, _ in hit]},
           flows=[int(f) for f in g.flows if int(ctx.nodes.src[f]) in recv or int(ctx.nodes.dst[f]) in recv],
           group=gi, impact=imp,
           onset=episode(cs[:-1][over], cs[1:][over], float(cs[0]), float(cs[-1])) if len(cs) == len(over) + 1 else None)


def _tail(k: int, n: int, q: float) -> float:
    """P(X >= k), X ~ Binomial(n, q)."""
    return float(sum(comb(n, j) * q ** j * (1 - q) ** (n - j) for j in range(k, n + 1))) if k > 0 else 1.0


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


def _steps_shard(em, ctx, g, dec, r, steps, t, gi, start_lags=None):
    """The shard last to send in most ring steps, by a lag well above the step jitter.
    start_lags: the members' collective-level start lags (ns), for the evidence."""
    ips = ctx.nodes.ips
    hit = persistent(steps, t, len(g.members), skip=shared_successors(ctx, g))
    if hit is None:
        return
    i, s = hit
    m = g.members[i]
    period = dec.get("token_interval_s") or r.get("period_s")
    lost = s["lost_per_iteration_ns"] / 1e9
    whole = bool(steps.get("whole_capture"))
    if whole:
        # no token (iteration) boundary to be seen: what it cost over the captured steps
        span = steps["span_ns"] / 1e9
        imp = {"seconds": lost, "share": min(1.0, lost / span) if span > 0 else None}
        period = None
    else:
        imp = impact_of(lost, period)
    share = imp["share"] if imp else None
    severity = "critical" if share is not None and share >= t["critical_share"] else "warning"
    per = "token" if dec.get("token_interval_s") else "iteration"
    cost = (f"the ring waited {us(lost * 1e9)} for it in {us(steps['span_ns'])} of collectives"
            + (f" ({pct(share)})" if share is not None else "") if whole else
            f"every {per} waits {us(lost * 1e9)} for it"
            + (f" ({pct(share)} of the {us(period * 1e9)} {'inter-token latency' if per == 'token' else 'period'})"
               if share is not None else ""))
    em.add("slow_tp_shard", severity, [ips[m]] + [ips[x] for x in g.members if x != m],
           f"tensor-parallel shard {ips[m]} is the last to send in {s['last_steps']} of {s['steps_with_last']} "
           f"ring steps, {us(s['lag_ns'])} after the others each time (step jitter {us(s.get('jitter_ns', steps['jitter_ns']))}): "
           + cost + "; check that GPU/host (clocks, thermal throttling, a noisy neighbour, its NIC/PCIe)",
           {"lag_per_step_s": s["lag_ns"] / 1e9, "last_steps": s["last_steps"], "steps": s["steps_with_last"],
            "last_share": s["last_share"], "steps_per_token": s["steps_per_iteration"],
            "lost_per_token_s": None if whole else lost, "token_share": None if whole else share,
            "lost_in_capture_s": lost if whole else None, "capture_share": share if whole else None,
            "step_jitter_s": s.get("jitter_ns", steps["jitter_ns"]) / 1e9,
            "token_interval_s": period, "gated_tokens": s["gated"], "tokens": int(len(steps["iterations"])),
            "start_lag_s": (float(start_lags[i]) / 1e9 if start_lags is not None and i < len(start_lags)
                            and np.isfinite(start_lags[i]) else None)},
           flows=[f for f in g.flows if ctx.nodes.src[f] == m], group=gi, impact=imp,
           onset=Onset(s["since_ns"], s["until_ns"]))


DETECTORS = [
    Detector(
        "decode", decode, needs=frozenset({"flows", "records", "groups"}), stage=20,
        doc="decode groups (many small collectives): cadence tail, prefill interference, a late TP shard",
        kinds=(
            Kind("decode_jitter",
                 key=KEY_MEMBERS, headline=("jitter_ratio",), actions=(), role="symptom",
                 fires='decode group: `decode_jitter_ratio` ≥ `warning` 1.5 (critical 3.0)',
                 blames='the members',
                 thresholds=(Threshold("warning", 1.5, "ratio", "p99 / p50 of the decode collective spacing: warning"),
                             Threshold("critical", 3.0, "ratio", "p99 / p50 of the decode collective spacing: critical")),
                 onset="the collective spacings ≥ `warning` × their p50 (inside a token when the tokens are known) "
                       "as an episode against the group's collectives"),
            Kind("prefill_interference",
                 key=KEY_MEMBERS, headline=("stall_share",), actions=(A.ISOLATE_PREFILL,), role="cause",
                 fires='decode group with ≥ `min_intervals` (1) interfered spacings (prefill messages in its own flows); '
                       'else a kv_transfer group, or a one-way star or pair of bulk messages (median ≥ max(64 KiB, 8 × the group\'s)) '
                       'from outside the group, sends into its members and its collective spacings that a transfer covers '
                       'for ≥ half their length have a median ≥ `kv_ratio` (1.5) × the median of those no transfer touches, '
                       'over ≥ `kv_min_intervals` (4) of each (of the covered ones ≥ 2 suffice when they are the longest by a chance ≤ `kv_chance`, 0.001); '
                       'a group without ring steps (its token period stretched out of regularity): tokens rebuilt from the clean spacings '
                       '(every token has the same number of collectives), the covered spacings sum to ≥ `kv_ratio` × their clean references '
                       'at the same token position and more of them are ≥ `kv_ratio` × their reference than a binomial chance ≤ `kv_chance` allows; '
                       'severity by `stall_share` (KV: the impact share) ≥ `warning` (2 %) / `critical` (20 %)',
                 blames='the members (KV: the members receiving the transfers)',
                 thresholds=(Threshold("warning", 0.02, "fraction", "decode time stalled by prefill traffic: warning"),
                             Threshold("critical", 0.2, "fraction", "decode time stalled by prefill traffic: critical"),
                             Threshold("min_intervals", 1, "count", "decode spacings with prefill on the wire, at least"),
                             Threshold("kv_ratio", 1.5, "ratio", "KV cause: median spacing of the collectives a KV transfer covers / of those it does not, at least"),
                             Threshold("kv_min_intervals", 4, "count", "KV cause: collective spacings covered by a KV transfer, and untouched, at least (each)"),
                             Threshold("kv_chance", 0.001, "fraction", "KV cause, fewer covered spacings than kv_min_intervals (>= 2): the chance that as many random spacings would be as long, at most")),
                 onset="the interfered spacings (in-group prefill: the stretched ones with prefill on the wire; KV: "
                       "the ones a transfer covers for ≥ half their length) as an episode against the group's "
                       "collectives"),
            Kind("slow_tp_shard",
                 key=KEY_BLAMED, headline=("lag_per_step_s", "token_share"), actions=(A.DRAIN, A.CHECK_NODE),
                 role="cause",
                 fires="decode ring: a member is the last to send in ≥ `last_share` (50 %) and ≥ `min_steps` (8) of the ring steps of its slow stretch (the whole capture, or from an onset / up to a recovery: a change point on its per-step lag, `since`/`until`), by a median lag ≥ max(`min_lag_s` 1 µs, `lag_jitter` (4) × the step jitter) (docs: \"Steps and gates\"), not when its own or its successor's downlink is shared (other traffic arriving there ≥ 25 % of the group's bytes into it: its messages, or its successor's clear-to-send, queue behind KV transfers); critical when the time it costs is ≥ `critical_share` (50 %) of the token. Decode groups without ring steps: the collective-level start lag ≥ max(`min_lag_s`, `lag_fraction` (0.1) × collective duration, median + `lag_mad` × MAD). One node's view of a ring (a ring segment, one DPU): only its own node, by its own lag per step (min of its forward latency and minus the arrival offset of its upstream's same step: docs \"Per-node timing\") ≥ `min_lag_s` in ≥ `min_steps` steps that are ≥ `last_share` of the steps it waited in between the first and the last such step, their median ≥ `lag_jitter` × their spread and ≥ slow_tp_shard.`lag_fraction` × its median step; a late upstream is `late_upstream` (info)",
                 blames='the shard, then the others',
                 onset="its slow stretch: a change point on its per-step series 'last by a lag above the bar' (docs: \"Steps and gates\"); without ring steps the generic one",
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
