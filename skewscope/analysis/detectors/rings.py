"""Per-member rates and start lags of ring / tree / all-to-all groups: slow_link (mode slow,
flapping), ring_straggler, straggler, slow_receiver. One detector for the four kinds: a
member is blamed for at most one of them, in this order (a slow link first, then a flap, a
slow or late sender, a slow receiver), so the decisions share their state."""
from __future__ import annotations

import warnings
from types import SimpleNamespace

import numpy as np

from skewscope.analysis.detectors import actions as A
from skewscope.analysis.detectors.common import (
    STEP_THRESHOLDS,
    ce_explained,
    cross_loaded,
    few,
    gbps,
    impact_of,
    irregular,
    lag_outliers,
    pct,
    sev,
    shared_successors,
    split_by,
    us,
)
from skewscope.analysis.detectors.registry import KEY_BLAMED, KEY_LINK, KEY_RING, Detector, Kind, Threshold
from skewscope.analysis.onset import Onset, episode, slowdown_onset
from skewscope.analysis.stats import median, nanmedian
from skewscope.analysis.steps import member_summary, persistent, start_lag_onset

#: a member's rate is judged only when its links' messages have >= this many packets (median):
#: a rate over 1-2 packets is the capture's timestamp granularity, not the link
MIN_PKTS_PER_MSG = 3
#: a flap needs the member late both ways in at least this many iterations
MIN_LATE_ITERATIONS = 2
#: slow_receiver is withheld when at least this share of its senders are blamed stragglers
#: (their slowness explains its low receive rate)
BLAMED_SENDERS_SHARE = 0.5
def _lag_thresholds(what):
    return (Threshold("warning", 0.8, "ratio", f"{what} send rate / the median: warning at or below"),
            Threshold("critical", 0.5, "ratio", f"{what} send rate / the median: critical at or below"),
            Threshold("min_lag_s", 5e-6, "s", "start lag floor: a member starting each step this late or later"),
            Threshold("lag_mad", 4.0, "MADs", "a late one: later than the others' median + this many MADs"))


def rates_and_lags(inp, em):
    """slow_link (both directions slow, or silent both ways = flaps), ring_straggler /
    straggler (a slow or late sender), slow_receiver (all-to-all: slow ingress), per group.

    Rates: ring -> the median-message rate of its in/out links / the ring's median link
    (robust to a few stalled messages); other kinds -> the member's send/receive throughput
    over active time / the members' median (independent of how a collective splits a
    sender's bandwidth). Slowness explained by CE marks is left to ecn_congestion; a link
    into a node that is slow both ways is not blamed on its sender."""
    blamed = set()
    for gi, g, r, ev in inp.groups:
        if g.kind not in ("ring_allreduce", "tree_allreduce", "all_to_all"):
            continue                     # pipeline stages / p2p are staggered by design
        G = _member_rates(inp, gi, g, r, ev)
        if G is None:
            continue
        both = _slow_both_ways(inp, em, G, blamed)
        late = _flaps(inp, em, G, both, blamed)
        skip = both | late | blamed
        _slow_senders(inp, em, G, skip, both, blamed)
        _slow_receivers(inp, em, G, skip, blamed)


#: what _member_rates hands the four decisions of rates_and_lags (one group's state)
_G_FIELDS = ("gi", "g", "r", "ev", "mem", "nm", "links", "ring", "kind", "t", "sr", "rr", "sb", "rb", "reliable",
             "symmetric", "hub", "gf", "out_flows", "in_flows", "rthr", "shared")


def _member_rates(inp, gi, g, r, ev):
    """One group's members' rate ratios (sr/rr: send/receive against the group; sb/rb: a
    ring member's links against the links that do not touch it), which are reliable (enough
    packets per message) and its flows per member: a namespace of _G_FIELDS, or None for a
    group whose members cannot be compared."""
    ctx, th = inp.ctx, inp.th
    tl = th["slow_link"]
    # start lags compare members doing the same thing at the same time: not in a
    # one-host view, where each peer's first message to the hub comes at its own turn
    symmetric = g.kind in ("ring_allreduce", "all_to_all") and "hub" not in g.extra
    mem = list(g.members)
    nm = len(mem)
    links = ev.links
    ring = g.kind == "ring_allreduce"
    kind = "ring_straggler" if ring else "straggler"
    t = th[kind]
    sr = np.full(nm, np.nan)
    rr = np.full(nm, np.nan)
    # slow both ways (a node's own port): its links against the links that do not touch
    # it -- a slow port slows two links of the ring, which in a ring of 3 are the
    # median; the straggler ratios (sr, rr) keep the ring median
    sb = np.full(nm, np.nan)
    rb = np.full(nm, np.nan)
    reliable = np.zeros(nm, dtype=bool)
    if links is not None and len(links):
        ratio = links["rate_ratio"]
        rmed = links["rate_med_bps"]
        for i, m in enumerate(mem):
            o = (links["src"] == m) & np.isfinite(ratio)
            n_ = (links["dst"] == m) & np.isfinite(ratio)
            if ring:
                sr[i] = ratio[o].min() if o.any() else np.nan
                rr[i] = ratio[n_].min() if n_.any() else np.nan
                away = (links["src"] != m) & (links["dst"] != m) & np.isfinite(rmed)
                ref = float(median(rmed[away])) if away.any() else np.nan
                if ref > 0 and o.any() and n_.any():
                    sb[i] = float(rmed[o].min()) / ref
                    rb[i] = float(rmed[n_].min()) / ref
            rel = (links["src"] == m) | (links["dst"] == m)
            reliable[i] = bool(rel.any()) and float(median(links["pkts_per_msg"][rel])) >= MIN_PKTS_PER_MSG
    if g.pattern == "tree_node":
        return None                     # one tree node's links differ by role: nothing to compare
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
                sr[i] = float(ri[a][0]) / float(nanmedian(ri[into]))
            if b.any() and np.isfinite(ri[outo]).any():
                rr[i] = float(ri[b][0]) / float(nanmedian(ri[outo]))
    elif not ring:
        nt = ev.node_tp
        if nt is not None:
            sr = nt["send_ratio"]
            rr = nt["recv_ratio"]
            if g.kind == "all_to_all" and links is not None and len(links):
                # uneven per-pair volumes (MoE routing) leave a sender whose bytes go to
                # busy destinations slower over its active time: slow only when also
                # slower than the other senders into the same destinations (a receiver:
                # than the same senders into their other destinations)
                ps, pr = pair_ratios(links, mem)
                sr, rr = np.fmax(sr, ps), np.fmax(rr, pr)
    if not ring or hub is not None:
        sb, rb = sr, rr
    gf = np.asarray(g.flows, dtype=np.int64)
    out_flows = split_by(gf, ctx.nodes.src[gf], mem)
    in_flows = split_by(gf, ctx.nodes.dst[gf], mem)
    # a tree node receives from its children and its parent at different rates by role:
    # its receive side counts as slow only at the critical ratio
    rthr = tl["warning"] if g.kind != "tree_allreduce" else tl["critical"]
    shared = cross_loaded(ctx, g) if ring else None
    return SimpleNamespace(**{n: v for n, v in locals().items() if n in _G_FIELDS})


def _slow_both_ways(inp, em, G, blamed) -> set:
    """slow_link (mode slow): a member slow both ways -- its own port or link."""
    ctx, th = inp.ctx, inp.th
    ips = ctx.nodes.ips
    tl = th["slow_link"]
    (gi, g, r, ev, mem, nm, links, ring, kind, t, sr, rr, sb, rb, reliable, symmetric, hub, gf, out_flows, in_flows,
     rthr, shared) = (getattr(G, n) for n in _G_FIELDS)
    # 1. slow both ways: the node's own link
    both = set()
    for i, m in enumerate(mem):
        if not reliable[i] or not (sb[i] <= tl["warning"] and rb[i] <= rthr):
            continue
        if ce_explained(inp, in_flows[m]) or m in blamed:
            continue
        if shared is not None and shared[m]:
            # its slowest out-link ends at a node whose downlink is shared too: both
            # directions are explained by other traffic arriving, not by its port
            o = (links["src"] == m) & np.isfinite(links["rate_med_bps"])
            if o.any() and shared[int(links["dst"][o][np.argmin(links["rate_med_bps"][o])])]:
                continue
        both.add(m)
        worst = float(max(sb[i], rb[i]))
        rate = [float(x) for x in (links["rate_bps"][(links["src"] == m) | (links["dst"] == m)] if links is not None else [])
                if np.isfinite(x)]
        em.add("slow_link", sev(worst, tl["warning"], tl["critical"], higher_is_worse=False), [m],
               f"{ips[m]}'s link is slow both ways: it sends at {sb[i]:.2f}x and receives at {rb[i]:.2f}x its "
               f"peers' rate{(' (' + gbps(float(median(rate))) + ' per QP)') if rate else ''}: check its port "
               "speed, cable/optics, FEC errors and NIC link state",
               {"send_ratio": float(sb[i]), "recv_ratio": float(rb[i]), "mode": "slow"},
               flows=out_flows[m] + in_flows[m], group=gi,
               onset=slowdown_onset(ctx, out_flows[m] + in_flows[m],
                                    [f for f in gf.tolist() if int(ctx.nodes.src[f]) != m and int(ctx.nodes.dst[f]) != m],
                                    thr=tl["warning"]))
    return both


def _flaps(inp, em, G, both, blamed) -> set:
    """slow_link (mode flapping): a member silent both ways in some iterations."""
    ctx, th = inp.ctx, inp.th
    ips = ctx.nodes.ips
    tl = th["slow_link"]
    (gi, g, r, ev, mem, nm, links, ring, kind, t, sr, rr, sb, rb, reliable, symmetric, hub, gf, out_flows, in_flows,
     rthr, shared) = (getattr(G, n) for n in _G_FIELDS)
    # 2. silent both ways in some iterations: flaps
    sd, rd = ev.send_dev_ns, ev.recv_dev_ns
    late = set()
    if symmetric and sd is not None and rd is not None and len(sd) and not (
            ring and (r.get("_steps") or {}).get("bursts_are_steps")):
        late_ns = tl["min_late_s"] * 1e9
        cand = []
        for i, m in enumerate(mem):
            if m in both or m in blamed:
                continue
            bl = (sd[:, i] >= late_ns) & (rd[:, i] >= late_ns)
            if bl.sum() >= MIN_LATE_ITERATIONS and float(bl.mean()) >= tl["late_share"]:
                cand.append((i, m, bl))
        if inp.stall_culprits.irregular:
            pass                       # the capture's timing, not a link (see stalls.py)
        elif few(len(cand), nm):
            for i, m, bl in cand:
                late.add(m)
                worst = float(np.nanmax(np.minimum(sd[:, i], rd[:, i])))
                em.add("slow_link", "warning", [m],
                       f"{ips[m]} goes silent in both directions for up to {us(worst)} in {int(bl.sum())} of "
                       f"{len(bl)} iterations while its peers proceed: a flapping link or port; check link "
                       "down/up events and error counters",
                       {"late_iterations": int(bl.sum()), "iterations": int(len(bl)), "max_delay_s": worst / 1e9,
                        "mode": "flapping"}, flows=out_flows[m] + in_flows[m], group=gi,
                       onset=_late_onset(ev.bursts, bl))
        elif cand:
            irregular(em, f"{len(cand)} of {nm} members of a {g.kind} are late both ways in the same "
                      "iterations", gi)
    return late


def _slow_senders(inp, em, G, skip, both, blamed):
    """ring_straggler / straggler: a slow or late sender (rate, start lag, ring steps); the
    members blamed are added to `blamed`."""
    ctx, th = inp.ctx, inp.th
    ips = ctx.nodes.ips
    tl = th["slow_link"]
    (gi, g, r, ev, mem, nm, links, ring, kind, t, sr, rr, sb, rb, reliable, symmetric, hub, gf, out_flows, in_flows,
     rthr, shared) = (getattr(G, n) for n in _G_FIELDS)
    # 3. slow senders
    # the group's bursts are its steps (a lag much longer than a step): a burst's first
    # sender is whoever broke the silence, not an iteration's late starter
    steps_bursts = ring and bool((r.get("_steps") or {}).get("bursts_are_steps"))
    lag = ev.start_lag_ns if symmetric and not r.get("decode") and not steps_bursts else None
    lagged = dict(lag_outliers(lag, t["lag_mad"], t["min_lag_s"] * 1e9))
    if lagged and ev.send_dev_ns is not None:
        # "starts each step late" needs repetition: late in >= MIN_LATE_ITERATIONS bursts
        # (one late start -- a process that came up later, a capture edge -- is not a
        # straggler; a single burst is one observation)
        sd = np.nan_to_num(np.asarray(ev.send_dev_ns, dtype=np.float64), nan=-np.inf)
        lagged = {i: v for i, v in lagged.items()
                  if int((sd[:, i] >= max(t["min_lag_s"] * 1e9, 0.5 * v)).sum()) >= MIN_LATE_ITERATIONS}
    if lagged and not ring and ev.bursts is not None and len(ev.bursts[0]):
        # a start lag that is a sliver of the collective it delays costs the group that
        # sliver (a few us of launch skew in a multi-ms all-to-all): not a straggler (in a
        # ring the steps carry it: each step waits for the late member)
        dur = float(median(np.asarray(ev.bursts[1]) - np.asarray(ev.bursts[0])))
        lagged = {i: v for i, v in lagged.items() if v >= t["min_lag_share"] * dur}
    # one DPU's view (a ring segment): the members' step matrix needs the upstream's own
    # readiness, which is outside the view -- its own node's lag is judged by ownview.py
    steps = r.get("_steps") if ring and g.pattern != "ring_segment" else None
    if lagged and rotation(steps, th["rotating_straggler"], nm) is not None:
        # a member late on average because it gated some of the iterations, while the
        # gate moves between members: rotating_straggler, not a straggler of its own
        lagged = {}
    seg = {}
    if steps is not None and not r.get("decode"):
        # the member last to send in most ring steps of its slow stretch (analysis.steps:
        # the whole capture, or from an onset / up to a recovery), at any volume
        hit = persistent(steps, t, nm, min_lag_ns=t["min_step_lag_s"] * 1e9,
                         skip=shared_successors(ctx, g, shared))
        if hit is not None:
            seg[hit[0]] = hit[1]
            if hit[0] not in lagged:
                lagged[hit[0]] = hit[1]["lag_ns"]
            # a member the ring waits for in its steps: the others' start lags shorter than
            # its lag are their answers to its late data (a burst that it opens), not lags
            lagged = {i: v for i, v in lagged.items() if i in seg or v >= hit[1]["lag_ns"]}
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
        if slow and shared is not None and any(shared[d] for d in succ_both.get(m, ())):
            slow = False                       # its successor's downlink is shared (KV into a decode member)
        if slow and ce_explained(inp, out_flows[m]):
            slow = False
        lag_ns = lagged.get(i)
        if not slow and lag_ns is None:
            continue
        severity = sev(float(sr[i]), t["warning"], t["critical"], higher_is_worse=False) if slow else "warning"
        parts = []
        if slow:
            parts.append(f"sends at {sr[i]:.2f}x the {'median link rate' if ring else 'median member'}"
                         + (f" ({gbps(float(ev.node_tp['send'][i]))} while sending)" if not ring and ev.node_tp else ""))
        if lag_ns is not None:
            parts.append(f"starts each step {us(lag_ns)} late")
        dsts = sorted({int(ctx.nodes.dst[f]) for f in out_flows[m]})
        what = "ring" if ring else g.kind
        evd = {"send_ratio": None if not np.isfinite(sr[i]) else float(sr[i]),
               "start_lag_s": None if lag_ns is None else lag_ns / 1e9}
        imp = None
        when = seg.get(i)
        if when is None and lag_ns is not None and ev.send_dev_ns is not None and ev.bursts is not None:
            when = start_lag_onset(ev.send_dev_ns[:, i], ev.bursts[0], 0.5 * lag_ns)
        if steps is not None:
            ms = seg.get(i) or member_summary(steps, i)
            if steps.get("whole_capture"):
                # no iteration boundary to be seen: what it cost over the captured steps
                lost, span = ms["lost_per_iteration_ns"] / 1e9, steps["span_ns"] / 1e9
                imp = {"seconds": lost, "share": min(1.0, lost / span) if span > 0 else None}
                evd.update(lost_in_capture_s=lost, capture_share=imp["share"])
            else:
                imp = impact_of(ms["lost_per_iteration_ns"] / 1e9, r.get("period_s"))
            evd.update(lag_per_step_s=ms["lag_ns"] / 1e9, last_steps=ms["last_steps"],
                       last_share=ms["last_share"], lost_per_iteration_s=ms["lost_per_iteration_ns"] / 1e9,
                       gated_iterations=ms["gated"], iterations=int(len(steps["iterations"])))
            if ms["last_steps"]:
                parts.append(f"is the last to send in {ms['last_steps']} of {ms['steps_with_last']} steps "
                             f"({us(ms['lag_ns'])} each)")
        if severity != "critical" and imp is not None and (imp.get("share") or 0) >= th["slow_tp_shard"]["critical_share"]:
            severity = "critical"      # the ring spends most of its time waiting for it
        cost = ""
        if imp is not None and imp["seconds"] > 0 and steps is not None and steps.get("whole_capture"):
            cost = (f"; the ring waited {us(imp['seconds'] * 1e9)} for it in {us(steps['span_ns'])} of steps"
                    + (f" ({pct(imp['share'])})" if imp["share"] is not None else ""))
        elif imp is not None and imp["seconds"] > 0:
            cost = f"; each iteration waits {us(imp['seconds'] * 1e9)} for it" + (
                f" ({pct(imp['share'])} of the period)" if imp["share"] is not None else "")
        em.add(kind, severity, [m] + dsts,
               f"{what} straggler {ips[m]}: " + " and ".join(parts) + cost
               + "; every rank waits for it: check that host's GPU/NIC (clocks, PCIe, thermal) or its uplink",
               evd, flows=out_flows[m], group=gi, impact=imp,
               onset=None if when is None else Onset(when["since_ns"], when["until_ns"]))
        blamed.add(m)


def _slow_receivers(inp, em, G, skip, blamed):
    """slow_receiver (all-to-all): every sender slows down towards one member."""
    ctx, th = inp.ctx, inp.th
    ips = ctx.nodes.ips
    tl = th["slow_link"]
    (gi, g, r, ev, mem, nm, links, ring, kind, t, sr, rr, sb, rb, reliable, symmetric, hub, gf, out_flows, in_flows,
     rthr, shared) = (getattr(G, n) for n in _G_FIELDS)
    # 4. slow receivers (all-to-all: every sender slows down towards one node)
    if g.kind == "all_to_all":
        for i, m in enumerate(mem):
            if m in skip or m in blamed or not reliable[i] or not rr[i] <= t["warning"]:
                continue
            if ce_explained(inp, in_flows[m]):
                continue
            srcs = {int(ctx.nodes.src[f]) for f in in_flows[m]}
            if len(srcs & blamed) >= BLAMED_SENDERS_SHARE * len(srcs):
                continue
            em.add("slow_receiver", sev(float(rr[i]), t["warning"], t["critical"], higher_is_worse=False),
                   [m] + sorted(srcs),
                   f"every sender slows down towards {ips[m]} ({rr[i]:.2f}x the median receive rate) without CE "
                   "marks: its ingress is the bottleneck (PFC-paused port, receiver NIC/PCIe, ECN disabled?)",
                   {"recv_ratio": float(rr[i])}, flows=in_flows[m], group=gi,
                   onset=slowdown_onset(ctx, in_flows[m], [f for x in mem if x != m for f in in_flows[x]],
                                        thr=t["warning"]))


def pair_ratios(links, mem) -> tuple[np.ndarray, np.ndarray]:
    """Per member of an all-to-all: the median over its out-links of the link's median-message
    rate / the median of the other senders' links into the same destination (send), and over
    its in-links of the rate / the same sender's links to its other destinations (receive);
    NaN with fewer than 2 comparable links. One member x member matrix (links are per ordered
    pair), one vectorised median per member: a 256-member all-to-all is 256 calls."""
    nm = len(mem)
    pos = {int(m): i for i, m in enumerate(mem)}
    R = np.full((nm, nm), np.nan)
    r = links["rate_med_bps"]
    for s_, d_, v in zip(links["src"].tolist(), links["dst"].tolist(), r.tolist()):
        i, j = pos.get(int(s_)), pos.get(int(d_))
        if i is not None and j is not None and np.isfinite(v) and v > 0:
            R[i, j] = v
    ps, pr = np.full(nm, np.nan), np.full(nm, np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)          # all-NaN columns: NaN, as meant
        for i in range(nm):
            for out, M in ((ps, R), (pr, R.T)):
                others = np.delete(M, i, axis=0)                 # the other senders (receivers)
                ok = np.isfinite(others).sum(axis=0) >= 2
                x = M[i] / nanmedian(others, axis=0)
                x = x[ok & np.isfinite(x)]
                if len(x) >= 2:
                    out[i] = float(median(x))
    return ps, pr


def _late_onset(bursts, late):
    """A flap's onset: the iterations it was late both ways in, as an episode against the
    group's iterations."""
    if bursts is None or late is None or not late.any():
        return None
    bs, be = (np.asarray(x, dtype=np.float64) for x in bursts)
    k = min(len(bs), len(late))
    sel = np.asarray(late[:k], dtype=bool)
    return episode(bs[:k][sel], be[:k][sel], float(bs[0]), float(be.max()))


def rotation(steps: dict | None, t: dict, nm: int):
    """(which iterations have a gate, the gating member of each of those, gates per member)
    when the ring's gate rotates: enough gated iterations, >= 2 distinct gates, none gating
    more than persistent_share; else None."""
    if steps is None or not steps.get("regular_tokens", True):
        return None                            # iterations that are not a regular token cadence
    gates = steps["gates"]
    n_it = len(gates)
    lost = steps["lost_ns"]
    ok = np.array([x >= 0 and lost[k, x] >= t["min_lag_s"] * 1e9 for k, x in enumerate(gates)], dtype=bool)
    gated = gates[ok]
    if len(gated) < t["min_iterations"] or len(gated) < t["gated_share"] * n_it:
        return None
    cnt = np.bincount(gated, minlength=nm)
    if cnt.max() > t["persistent_share"] * len(gated) or (cnt > 0).sum() < 2:
        return None                            # one member gates most: a persistent straggler
    return ok, gated, cnt


def rotating(inp, em):
    """rotating_straggler: per iteration (token) the member that gated it
    (analysis.steps); the gate moving between members, none gating most iterations."""
    ips = inp.ctx.nodes.ips
    t = inp.th["rotating_straggler"]
    for gi, g, r, _ in inp.groups:
        steps = r.get("_steps")
        if steps is None or g.kind != "ring_allreduce":
            continue
        rot = rotation(steps, t, len(g.members))
        if rot is None:
            continue
        ok, gated, cnt = rot
        gates = steps["gates"]
        n_it = len(gates)
        lost = steps["lost_ns"]
        if em.has("ring_straggler", lambda f: f.group == gi) or em.has("slow_tp_shard", lambda f: f.group == gi):
            continue
        order = [int(x) for x in np.argsort(-cnt, kind="stable") if cnt[x] > 0]
        per_gate = np.array([lost[k, x] for k, x in enumerate(gates) if ok[k]])
        dec = r.get("decode")
        period = (dec or {}).get("token_interval_s") or r.get("period_s")
        loss = float(median(per_gate)) / 1e9
        imp = impact_of(loss * len(gated) / n_it, period)
        unit = "token" if dec else "iteration"
        shares = {ips[g.members[x]]: float(cnt[x]) / n_it for x in order}
        top = ", ".join(f"{ip} {100 * v:.0f}%" for ip, v in list(shares.items())[:4])
        em.add("rotating_straggler", "warning", [g.members[x] for x in order],
               f"{len(gated)} of {n_it} {unit}s of a {len(g.members)}-rank ring wait on one late rank "
               f"({us(loss * 1e9)} each, median), but a different one each time ({len(order)} ranks: {top}): "
               "no faulty node; this is data-dependent load imbalance (uneven sequence lengths or batch "
               "composition per rank): pack or bucket sequences by length. A faulty node would be late in "
               f"most {unit}s (ring_straggler / slow_tp_shard)",
               {"gated_iterations": int(len(gated)), "iterations": int(n_it), "distinct_gates": len(order),
                "gate_share": shares, "max_share": float(cnt.max()) / n_it,
                "lost_per_gated_iteration_s": loss,
                "gating_rank_per_iteration": [ips[g.members[int(x)]] if ok[k] else None for k, x in enumerate(gates)],
                "period_s": period},
               flows=g.flows, group=gi, impact=imp)


DETECTORS = [
    Detector(
        "rates_and_lags", rates_and_lags, needs=frozenset({"flows", "records", "groups"}), stage=10,
        doc="ring/tree/all-to-all members: rate ratios and start lags -> the slow link, the straggler, the slow receiver",
        kinds=(
            Kind("ring_straggler",
                 key=KEY_LINK, headline=("send_ratio", "lag_per_step_s"), actions=(A.DRAIN, A.CHECK_NODE, A.CHECK_LINK),
                 role="cause", seen_by="link",
                 fires="ring: a member's out-link median-message rate / ring median ≤ `warning` (0.8) (≤ `critical` 0.5), or its start lag ≥ max(`min_lag_s` 5 µs, median + `lag_mad` (4) × MAD of the others), or it is the last to send in ≥ `last_share` (50 %) and ≥ `min_steps` (8) of the ring steps of its slow stretch by a median lag ≥ max(`min_step_lag_s` 1 µs, `lag_jitter` (4) × the step jitter) (the stretch: the whole capture, or from an onset / up to a recovery found by a change point on its per-step lag; docs: \"Steps and gates\"); critical also when the time the ring loses to it is ≥ slow_tp_shard.`critical_share` (50 %) of the period (or of the captured steps). Not when its successor is slow both ways (slow_link), nor (by rate) when its successor's downlink is shared (other traffic arriving there while the ring runs ≥ 25 % of the ring's bytes into it: KV transfers into a decode member; its messages are seen queued there), nor (by steps) when its own or its successor's is (its successor's clear-to-send queues on its own), nor when its flows are CE-marked (ecn_congestion); the start lag alone not while the ring's gate rotates (rotating_straggler: a member that gated some iterations is late on average), needs ≥ 2 late bursts, and is not read when the ring's bursts are its single steps (docs: \"Steps and gates\"). One node's view of a ring (a ring segment, one DPU): only its own node, by its own lag per step (min of its forward latency and minus the arrival offset of its upstream's same step: docs \"Per-node timing\") ≥ `min_lag_s` in ≥ `min_steps` steps that are ≥ `last_share` of the steps it waited in between the first and the last such step, their median ≥ `lag_jitter` × their spread and ≥ slow_tp_shard.`lag_fraction` × its median step; a late upstream is `late_upstream` (info)",
                 blames='the sender, then its successor',
                 onset="by steps: its slow stretch, a change point on its per-step series 'last by a lag above the bar' (docs: \"Steps and gates\"); by start lag: the same over the iterations (late by half its lag); by rate: the generic rate series (ONSET_FNS)",
                 thresholds=_lag_thresholds("ring link (fleet: link rate over active time)") + STEP_THRESHOLDS
                 + (Threshold("min_step_lag_s", 1e-6, "s", "steps: its median lag per step, at least (timestamp resolution / one packet; the start lag floor is min_lag_s)"),)),
            Kind("straggler",
                 key=KEY_BLAMED, headline=("send_ratio", "max_delay_s"), actions=(A.DRAIN, A.CHECK_NODE),
                 role="cause", seen_by="message_wire_seconds",
                 fires="tree/all-to-all: a member's send throughput over active time / members' median ≤ `warning` 0.8 (critical 0.5) -- in an all-to-all also its links' rates / the other senders' links into the same destinations (median over its destinations: uneven per-pair volumes slow a sender whose bytes go to busy destinations), or start lag as above (all-to-all) and ≥ `min_lag_share` (5 %) of the group's median burst",
                 blames='the sender, then its receivers',
                 thresholds=_lag_thresholds("member") + (
                     Threshold("min_lag_share", 0.05, "fraction", "start lag: at least this share of the group's "
                               "median burst (the collective it delays); a shorter one costs the group less"),)),
            Kind("slow_receiver",
                 key=KEY_BLAMED, headline=("recv_ratio",), actions=(A.CHECK_NODE,), role="cause",
                 fires="all-to-all: a member's receive throughput ratio ≤ `warning` 0.8 (critical 0.5) and its in-links' rates / the same senders' links to their other destinations (median over its senders) too, not CE-marked, not explained by slow senders",
                 blames='the receiver, then its senders',
                 thresholds=(Threshold("warning", 0.8, "ratio", "receive throughput / the members' median: warning at or below"),
                             Threshold("critical", 0.5, "ratio", "receive throughput / the members' median: critical at or below")),
                 onset="per time bin, the median message rate into it / into the other members (series scan, lower is "
                       "worse, threshold `warning`)"),
            Kind("slow_link",
                 key=KEY_BLAMED, headline=("send_ratio", "recv_ratio", "max_delay_s", "max_stall_s"),
                 actions=(A.CHECK_OWN_LINK,), role="cause",
                 fires="a node slow both ways: send and receive ratio ≤ `warning` 0.8 (critical 0.5) (`mode: slow`; in a ring its slowest out- and in-link against the median of the links that do not touch it: its port slows two links, in a ring of 3 the median; not when other traffic arriving at the node and at the end of its slowest out-link, while the ring runs, is ≥ 25 % of the ring's bytes into each: shared downlinks, e.g. KV transfers into decode members); or late ≥ `min_late_s` (50 µs) both as sender and receiver in ≥ 2 and ≥ `late_share` (30 %) of the iterations (`mode: flapping`); or the stalled data flows (a message ≥ 2× its flow's typical time, by ≥ `min_stall_s` = 50 µs) concentrate on it — ≥ 80 % of them touch it, in both directions (`mode: stalls`). Flaps and stalls are node faults only as outliers: when they spread over more than a quarter of the nodes, one `sampling` info says the capture's timing is irregular instead; in one host's view (every data flow touches it, so it collects every stall) its stalls are its port's only when its in- and out-stalls coincide for ≥ 50 % of the smaller side's stalled time, else the same `sampling` info",
                 blames='the node',
                 thresholds=(Threshold("warning", 0.8, "ratio", "send and receive rate / the median, both: warning at or below"),
                             Threshold("critical", 0.5, "ratio", "send and receive rate / the median: critical at or below (tree: the receive side's bar)"),
                             Threshold("min_stall_s", 50e-6, "s", "a stalled message's excess over its flow's typical time"),
                             Threshold("min_late_s", 50e-6, "s", "lateness both as sender and receiver in an iteration (flap)"),
                             Threshold("late_share", 0.3, "fraction", "a flap: late both ways in at least this share of the iterations")),
                 onset="`mode: slow`: per time bin, the median message rate of its links / the group's other links "
                       "(series scan, lower is worse, threshold `warning`); `flapping`: the iterations it was late both "
                       "ways in, as an episode against the group's iterations; `stalls`: its stalled messages as an "
                       "episode against its flows' data"),
        )),
    Detector(
        "rotating_straggler", rotating, needs=frozenset({"flows", "records", "groups"}), stage=25,
        doc="ring groups: the member that gated each iteration (token) moves between members",
        kinds=(
            Kind("rotating_straggler",
                 key=KEY_RING, headline=("max_share", "lost_per_gated_iteration_s"), actions=(A.REBALANCE_BATCHES,),
                 role="cause",
                 fires="ring: ≥ `min_iterations` (3) and ≥ `gated_share` (50 %) of the iterations (tokens) have a gate — a member whose own step lags in it total ≥ max(`min_lag_s` 5 µs, 4 × the step jitter) and ≥ 2× any other member's (docs: \"Steps and gates\") — with ≥ 2 distinct gates and none gating more than `persistent_share` (50 %) of them (that is ring_straggler / slow_tp_shard)",
                 blames='the gating members, most iterations first',
                 thresholds=(Threshold("min_iterations", 3, "count", "iterations with a gate, at least"),
                             Threshold("gated_share", 0.5, "fraction", "share of the iterations with a gate, at least"),
                             Threshold("persistent_share", 0.5, "fraction", "one member gating more than this share of the gated iterations: persistent, not rotating"),
                             Threshold("min_lag_s", 5e-6, "s", "a gate's lost time in its iteration, at least"))),
        )),
]


def _rate_onset(inp, f):
    """A sender blamed by its rate (evidence send_ratio at or below the kind's `warning`):
    its flows' message rate against the group's other senders' (slowdown_onset)."""
    r = f.evidence.get("send_ratio")
    if f.group is None or r is None or not f.evidence or r > inp.th[f.kind]["warning"] or f.rows is None:
        return None
    ctx = inp.ctx
    g = inp.groups[f.group].group
    me = int(ctx.nodes.src[f.rows[0]]) if len(f.rows) else -1
    gf = np.asarray(g.flows, dtype=np.int64)
    others = gf[ctx.nodes.src[gf] != me]
    return slowdown_onset(ctx, f.rows, others, thr=inp.th[f.kind]["warning"]) if len(others) else None


#: the onset of a straggler its detector left without one (the steps give ring stragglers
#: theirs): by rate (registry.ONSET_FNS)
_RATE_DOC = ("a sender blamed by rate: per time bin, its flows' median message rate / the group's other senders' "
             "(series scan, lower is worse, threshold `warning`)")
ONSET_FNS = {"straggler": (_rate_onset, _RATE_DOC), "ring_straggler": (_rate_onset, _RATE_DOC)}

