"""All-to-all volume skew: hot_destination, alltoall_destination_skew (MoE routing).

Evidence is repetition over sources and over time (issue 12 item 1, issue 25 class 1). An
observation is one source's bytes per destination in one (iteration, phase) cell
(group_metrics._iteration_cells; a phase may be the only collective of the capture; the
one-host view: the hub's sends, and its receives). An observation counts when its source
sent to >= 2 destinations, and is skewed when its single hottest destination (ties: none)
gets >= `warning` x the mean of the source's other destinations. A destination is hot in a
window when it is the hottest of >= `min_observations` skewed observations and of a
majority (> `majority`) of the window's skewed observations, and not by chance: one of two
tests reaches `min_z` standard deviations after the look-elsewhere correction (x the
destinations it could have been, x the two tests, x the windows):

* votes: the exact binomial tail of its votes among the skewed observations of the sources
  that could name it, against 1 / (n - 1) (every destination equally likely the hottest);
* magnitude: the log-additive two-way fit of the window's observations (significance.
  additive_contrast: row = observation, column = destination), its contrast against the
  mean of the others over the residual (the sources' disagreement, floored at
  `noise_floor`): three sources of one collective that all put 4x on the same destination
  while splitting the rest evenly are as strong as the same destination over many
  iterations; a 3-node fabric (1 residual degree of freedom) or random routing is not.

Windows: maximal runs of iterations whose modal hottest destination is the same (a
drifting hot expert gives one window per position). Persistence: share of the iterations
(with traffic) in which the hot destination was the hottest. No byte floor: a 1 KiB
decode dispatch repeated 24 times is as significant as a 64 MiB training one.

Vantage (what an SRE can conclude from where the capture was taken):
* a mirror/fabric capture sees every source: the window's bytes are added up per
  (source, phase) and the sources are the observations of both tests (a fixed random
  imbalance repeated every iteration is no evidence; a per-iteration random one averages
  out); a warning needs >= MIN_SOURCES (3) sources naming it, fewer is info;
* one node's view (alltoall_star) sees one source's sends (and the peers' sends to it): the
  finding says "as seen from <node>" and is a warning only when the hot destination repeats
  over >= 2 iterations (its routing, every iteration); one collective from one node is info;
* the hot node's own view sees no other destination to compare with: its dispatch phase
  shows (nearly) every peer sending it >= `warning` x what it sends back (pair asymmetry):
  info, worded as what this node sees (it cannot tell "it receives more" from "it sends
  less"); the other nodes' views (cluster) or a mirror decide."""
from __future__ import annotations

import math

import numpy as np

from skewscope.analysis.detectors import actions as A
from skewscope.analysis.detectors.common import impact_of, pct, sev
from skewscope.analysis.detectors.registry import KEY_BLAMED, Detector, Kind, Threshold
from skewscope.analysis.group_metrics import node_throughput
from skewscope.analysis.onset import series_onset
from skewscope.analysis.significance import additive_contrast, binom_sf, t_sf, z_of
from skewscope.analysis.stats import median, nanmedian

_MIN_OBS = Threshold("min_observations", 3, "count",
                     "skewed (source, phase) observations naming the same hottest destination, at least")
_MAJORITY = Threshold("majority", 0.5, "fraction",
                      "share of its window's skewed observations that name the hot destination, more than")
_MIN_Z = Threshold("min_z", 3.0, "ratio", "evidence against chance in standard deviations (one-sided normal "
                   "quantile of the better of the two tests' p-values x 2 x the candidate destinations), at least")
_NOISE = Threshold("noise_floor", 0.1, "ratio", "magnitude test: the least residual spread assumed (log units: "
                   "0.1 = 10 % pair-to-pair jitter), so that exact byte counts are not infinitely significant")

#: the two chance tests (votes, magnitude): the look-elsewhere factor of taking the better
N_TESTS = 2
#: a mirror's hot destination is the job's when at least this many distinct sources name it
#: (two sources agreeing is what a random imbalance does half the time at 3 nodes); fewer:
#: info, worded as what those sources do
MIN_SOURCES = 3


def alltoall(inp, em):
    for gi, g, r, ev in inp.groups:
        if g.kind == "all_to_all" and ev.a2a_cells is not None:
            _one(em, inp, g, r, ev.a2a_cells, gi)


def rows_of(cells):
    """The observation rows of an all-to-all's cells: ([I, K, S, n] bytes per destination,
    [S, n] allowed destinations, [S] source of each slot or -1). Fabric: slot = source, a
    source never sends to itself. One-host view (cells["hub"]): slot 0 = the hub's sends per
    destination, slot 1 = its receives per source (the combine phase brings a hot expert's
    results back: it is the hottest there); the hub itself is no destination."""
    m = np.asarray(cells["mats"], dtype=np.float64)          # [I, K, n, n]
    n = m.shape[-1]
    hub = cells.get("hub")
    if hub is not None:
        rows = np.stack([m[:, :, hub, :], m[:, :, :, hub]], axis=2)     # [I, K, 2, n]
        allowed = np.ones((2, n), dtype=bool)
        allowed[:, hub] = False
        src = np.array([hub, -1])
    else:
        rows = m
        allowed = ~np.eye(n, dtype=bool)
        src = np.arange(n)
    return rows, allowed, src


def observations(cells, warn):
    """Per (iteration, phase, observation slot): hottest destination (-1: not skewed, or no
    single hottest), its max/mean over the allowed destinations, the bytes above that mean,
    valid slots; and the per-cell destination totals [I, K, n]. Skewed: the single hottest
    gets >= warn x the mean of the *other* destinations (a hot expert at factor f is f x
    the others whatever n; against the mean of all it would be f (n - 1) / (n - 2 + f),
    below 1.5 for f = 1.5 at any n)."""
    rows, allowed, _ = rows_of(cells)
    n = rows.shape[-1]
    m = int(allowed.sum(axis=1).max()) if allowed.size else 0    # destinations per source
    mo = np.where(allowed, rows, np.nan)
    row = np.nansum(mo, axis=3)                               # [I, K, S]
    mean = row / max(1, n - 1)
    filled = np.where(np.isnan(mo), -1.0, mo)
    srt = np.sort(filled, axis=3)
    mx = srt[..., -1]
    second = srt[..., -2] if n >= 2 else np.full_like(mx, -1.0)
    hot = filled.argmax(axis=3)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(mean > 0, mx / mean, np.nan)
        rest = (row - mx) / max(1, m - 1)
        over_rest = np.where(rest > 0, mx / rest, np.inf)
    # an observation compares destinations: its source sent to >= 2 of them (a source that
    # talks to one peer only -- a ring successor, a start-up handshake -- names no hot one)
    valid = (row > 0) & (second > 0)
    # ties: equal bytes to two destinations name neither (argmax would name the first
    # member, the same one in every observation: repetition out of nothing)
    skewed = valid & (m >= 2) & (over_rest >= warn) & (mx > second)
    hot = np.where(skewed, hot, -1)
    excess = np.where(skewed, mx - mean, 0.0)
    return hot, np.where(valid, ratio, np.nan), excess, valid, np.asarray(cells["mats"], dtype=np.float64).sum(axis=2)


def windows(hot, valid, n):
    """Runs of iterations with the same modal hottest destination among their skewed
    observations (iterations without any skewed observation join the run around them).
    [(first_iteration, end_iteration exclusive, destination)]."""
    per_it = []
    for i in range(hot.shape[0]):
        h = hot[i][hot[i] >= 0]
        per_it.append(int(np.bincount(h, minlength=n).argmax()) if len(h) else -1)
    runs = []
    for i, h in enumerate(per_it):
        if h < 0:
            if runs:
                runs[-1][1] = i + 1
            continue
        if runs and runs[-1][2] == h:
            runs[-1][1] = i + 1
        else:
            if runs:
                runs[-1][1] = max(runs[-1][1], i)
            runs.append([i, i + 1, h])
    return [tuple(r) for r in runs], per_it


def chance(cells, a, b, h, hot, t, looks=1) -> dict:
    """The chance tests of destination h in iterations [a, b): {"z" (the better of the
    two), "z_votes", "z_magnitude" (None: no residual to measure against), "trials",
    "sources" (distinct sources naming h), "contrast" (h's bytes over the other
    destinations' from the same observations, geometric), "df"}; each z = the one-sided
    normal quantile of its p-value x N_TESTS x looks x the candidate destinations (x the
    phase groups for the magnitude test).

    The unit of evidence is what can vary independently. A mirror sees every source: the
    window's bytes are added up per (source, phase) and the sources are the observations --
    an iteration repeating the same routing adds no evidence against a fixed random
    imbalance, and averages out a per-iteration random one. One node's view has one source:
    its (iteration, phase) observations are the repetition it has (a per-iteration random
    routing would move its hottest destination), and the finding says whose view it is."""
    hub = cells.get("hub")
    if hub is None:
        m = np.asarray(cells["mats"], dtype=np.float64)[a:b].sum(axis=0)[None]     # [1, K, n, n]
        pc = {"mats": m, "hub": None}
        ph, _, _, _, _ = observations(pc, t["warning"])
        a2, b2 = 0, 1
    else:
        pc, ph, a2, b2 = cells, hot, a, b
    rows, allowed, src = rows_of(pc)
    n = rows.shape[-1]
    cand = int(allowed.any(axis=0).sum())
    look = N_TESTS * looks * max(1, cand)
    hw = ph[a2:b2]                                            # [i, K, S]
    # votes: the skewed observations of the slots that could have named h
    can = allowed[:, h]
    trials = int((hw[..., can] >= 0).sum())
    votes = int((hw == h).sum())
    pv = binom_sf(votes, trials, 1.0 / max(1, n - 1))
    voters = np.nonzero((hw == h).any(axis=(0, 1)))[0]
    out = {"z_votes": z_of(min(1.0, pv * look)), "z_magnitude": None, "trials": trials, "contrast": None,
           "df": None, "sources": int(len({int(src[s_]) for s_ in voters if src[s_] >= 0}))}
    # magnitude: every observation (skewed or not), one row each, per phase ordinal (a
    # dispatch and its combine are not one table: the combine returns the hot expert's
    # bytes evenly) and, in one node's view, per slot (a destination's bytes from the hub
    # and its bytes to the hub are not one column); the best of these pre-set groups, x
    # their number
    rr = rows[a2:b2]                                          # [i, K, S, n]
    groups = [(k, None) for k in range(rr.shape[1])] if hub is None else \
        [(k, sl) for k in range(rr.shape[1]) for sl in range(rr.shape[2])]
    best = None
    for k, sl in groups:
        sub = rr[:, k] if sl is None else rr[:, k, sl:sl + 1]
        al = allowed if sl is None else allowed[sl:sl + 1]
        fit = additive_contrast(sub.reshape(-1, n), np.broadcast_to(al, sub.shape).reshape(-1, n), h,
                                t["noise_floor"])
        if fit is None:
            continue
        pm = t_sf(fit["t"], fit["df"]) if fit["contrast"] > 0 else 1.0
        if best is None or pm < best[0]:
            best = (pm, fit)
    if best is not None:
        pm, fit = best
        out.update(contrast=math.exp(fit["contrast"]), df=fit["df"])
        if fit["contrast"] > 0:
            out["z_magnitude"] = z_of(min(1.0, pm * look * len(groups)))
    out["z"] = max(out["z_votes"], out["z_magnitude"] if out["z_magnitude"] is not None else -math.inf)
    return out


def _r(x, nd=3):
    return None if x is None else (round(x, nd) if math.isfinite(x) else 99.0)


def hot_windows(cells, t) -> tuple[list[dict], list[int], np.ndarray]:
    """The hot-destination windows of an all-to-all's cells under thresholds t
    (hot_destination's): [{"_h": member position, first_iteration, end_iteration,
    observations, skewed_observations, z, z_votes, z_magnitude, contrast, sources,
    iterations_voting, max_over_mean, per_source_max_over_mean, share, phases, "_excess"}],
    the per-iteration hottest position (-1: none) and the iterations with traffic. Phase
    cells that left records out (cells["per_iteration"]: the same iterations, one cell
    each) get a second look when they find nothing, each look paying x 2 in the chance test."""
    return find(cells, t)[:3]


def find(cells, t):
    """hot_windows and the cells it used (the phase cells or their per-iteration look)."""
    alt = cells.get("per_iteration")
    looks = 2 if alt is not None else 1
    out = _hot_windows(cells, t, looks)
    if alt is not None and not out[0]:
        out2 = _hot_windows(alt, t, looks)
        if out2[0]:
            return (*out2, alt)
    return (*out, cells)


def _hot_windows(cells, t, looks):
    hot, ratio, excess, valid, dest = observations(cells, t["warning"])
    n = dest.shape[-1]
    runs, per_it = windows(hot, valid, n)
    found = []
    for a, b, h in runs:
        # every window is a test of its own (their bounds come from the data): x the windows
        w = _window(cells, t, looks * len(runs), hot, ratio, excess, dest, a, b, h)
        if w is not None:
            found.append(w)
    return found, per_it, valid.any(axis=(1, 2))


def _window(cells, t, looks, hot, ratio, excess, dest, a, b, h):
    """The window [a, b) of destination h when it passes the rule, else None."""
    n = dest.shape[-1]
    hw = hot[a:b]
    sk = int((hw >= 0).sum())
    votes = int((hw == h).sum())
    if votes < t["min_observations"] or votes <= t["majority"] * sk:
        return None
    if not confirmed(cells, a, b, h, hw):
        return None
    c = chance(cells, a, b, h, hot, t, looks)
    if c["z"] < t["min_z"]:
        return None
    rv = ratio[a:b][hw == h]
    cells_h = dest[a:b]                                   # [i, K, n] bytes per destination
    tot = cells_h.sum(axis=2)
    hot_cell = (hw == h).any(axis=2)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(tot > 0, cells_h[..., h] / tot, np.nan)
        colr = np.where(tot > 0, cells_h[..., h] / (tot / n), np.nan)[hot_cell]
    pr = float(median(rv))
    dm = pr if cells.get("hub") is not None or not len(colr) else float(nanmedian(colr))
    return {"_h": h, "first_iteration": a, "end_iteration": b,
            "observations": votes, "skewed_observations": sk,
            "z": _r(c["z"]), "z_votes": _r(c["z_votes"]), "z_magnitude": _r(c["z_magnitude"]),
            "contrast": _r(c["contrast"]), "sources": c["sources"],
            "iterations_voting": int((hw == h).any(axis=(1, 2)).sum()),
            "max_over_mean": dm, "per_source_max_over_mean": pr,
            "share": float(nanmedian(share[hot_cell])) if hot_cell.any() else None,
            "phases": int(hot_cell.sum()),
            "_excess": float(excess[a:b][hw == h].sum())}


def confirmed(cells, a, b, h, hw) -> bool:
    """Phase votes agree with the iterations' totals: h is the single hottest destination
    of more than half of the voting (iteration, slot) rows once their phases are added up
    (with every record: cells["per_iteration"] when the phase cells left some out). The
    phase split is ours -- a flow's transfers cut at the same place in every iteration give
    a repeated "hottest" out of an even exchange --, an iteration's bytes are the source's."""
    m = np.asarray(cells["mats"], dtype=np.float64)
    if m.shape[1] == 1 and cells.get("per_iteration") is None:
        return True
    alt = cells.get("per_iteration")
    vote = (hw == h).any(axis=1)                              # [i, S]
    its = np.arange(a, b)
    if alt is not None:
        tot = np.asarray(alt["mats"], dtype=np.float64)[:, 0]
        j = np.searchsorted(np.asarray(alt["start_ns"]), np.asarray(cells["start_ns"])[its], side="right") - 1
        ok = j >= 0
        vote, tot = vote[ok], tot[j[ok]]
        hub = alt.get("hub")
    else:
        tot = m[a:b].sum(axis=1)
        hub = cells.get("hub")
    rows, allowed, _ = rows_of({"mats": tot[:, None], "hub": hub})
    r = np.where(allowed, rows[:, 0], -1.0)                   # [i, S, n]
    srt = np.sort(r, axis=2)
    single = (r.argmax(axis=2) == h) & (srt[..., -1] > srt[..., -2])
    return int((single & vote).sum()) * 2 > int(vote.sum())


def own_asymmetry(cells, t) -> dict | None:
    """One-host view of a hot destination's own node: per phase ordinal, the observations
    (peer, iteration) where the peer sent the hub >= `warning` x what the hub sent it. The
    phase with most such observations, when they are >= `min_observations` and more than
    `majority` of that phase's peers-with-traffic-both-ways: {"phase", "observations",
    "of", "peers", "iterations", "recv_over_send" (median over them), "reverse" (the same
    ratio the other way in another phase: a combine phase returning it), "_excess"}."""
    hub = cells.get("hub")
    if hub is None:
        return None
    m = np.asarray(cells["mats"], dtype=np.float64)          # [I, K, n, n]
    send = m[:, :, hub, :]
    recv = m[:, :, :, hub]
    both = (send > 0) & (recv > 0)
    both[..., hub] = False
    with np.errstate(invalid="ignore", divide="ignore"):
        q = np.where(both, recv / np.where(both, send, 1.0), np.nan)     # [I, K, n]
    best = None
    for k in range(m.shape[1]):
        qk = q[:, k]
        ok = np.isfinite(qk)
        hi = ok & (qk >= t["warning"])
        v = int(hi.sum())
        if v < t["min_observations"] or v <= t["majority"] * int(ok.sum()):
            continue
        if best is None or v > best["observations"]:
            best = {"phase": k, "observations": v, "of": int(ok.sum()), "peers": int(hi.any(axis=0).sum()),
                    "iterations": int(hi.any(axis=1).sum()), "recv_over_send": float(median(qk[hi])),
                    "_excess": float(np.nansum(np.where(hi, recv[:, k] - send[:, k], 0.0)))}
    if best is not None:
        others = [k for k in range(m.shape[1]) if k != best["phase"]]
        rev = [float(nanmedian(1.0 / q[:, k])) for k in others if np.isfinite(q[:, k]).any()]
        best["reverse"] = max(rev) if rev else None
    return best


def hot_onset(cells, t, hot_positions):
    """Onset of a hot destination (set): per iteration (collective), the largest share over
    its phases of the (source) observations whose hottest destination is skewed and one of
    `hot_positions` (analysis.onset.series_onset, threshold `majority`); None without
    iteration times."""
    st, en = np.asarray(cells["start_ns"], dtype=np.float64), np.asarray(cells["end_ns"], dtype=np.float64)
    if len(st) < 2 or not (st > 0).all():
        return None
    hot, _, _, valid, _ = observations(cells, t["warning"])
    named = (np.isin(hot, list(hot_positions)) & valid).sum(axis=2)      # [I, K]
    nv = valid.sum(axis=2)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(nv > 0, named / np.maximum(nv, 1), np.nan)
    y = np.where(np.isfinite(share).any(axis=1), np.nanmax(np.where(np.isfinite(share), share, -1.0), axis=1), np.nan)
    return series_onset(st, y, worse=1, thr=t["majority"], t_end=en)


def _one(em, inp, g, r, cells, gi):
    ctx, th = inp.ctx, inp.th
    ips = ctx.nodes.ips
    mem = list(g.members)
    n = len(mem)
    t = th["hot_destination"]
    hub = cells.get("hub")
    found, per_it, act_it, cells = find(cells, t)
    n_it = int(act_it.sum()) or 1
    st, en = np.asarray(cells["start_ns"]), np.asarray(cells["end_ns"])
    t0 = float(ctx.t0)
    period = r.get("period_s")
    link = (inp.pfc or {}).get("link_gbps_est")
    for w in found:
        a, b = w["first_iteration"], w["end_iteration"]
        w.update(hot=ips[mem[w["_h"]]], start_s=(float(st[a]) - t0) / 1e9, end_s=(float(en[b - 1]) - t0) / 1e9)
    if not found:
        if hub is not None:
            _own_view(em, inp, g, r, cells, gi, n_it, period, link)
        return
    # the blamed destination: the one with the most votes over all its windows
    votes_by = {}
    for w in found:
        votes_by[w["_h"]] = votes_by.get(w["_h"], 0) + w["observations"]
    order = sorted(votes_by, key=lambda h: (-votes_by[h], min(w["first_iteration"] for w in found if w["_h"] == h)))
    h0 = order[0]
    persistence = {ips[mem[h]]: round(sum(1 for i, x in enumerate(per_it) if x == h and act_it[i]) / n_it, 4)
                   for h in order}
    mine = [w for w in found if w["_h"] == h0]
    mom = float(median([w["max_over_mean"] for w in mine]))
    share = mine[0]["share"]
    drift = len(order) > 1
    hot_ips = [ips[mem[h]] for h in order]
    gf = np.asarray(g.flows, dtype=np.int64)
    hot_nodes = np.array([mem[h] for h in order])
    into_hot = gf[np.isin(ctx.nodes.dst[gf], hot_nodes)].tolist()
    # impact: the bytes the skewed senders put on the hot destination above their mean,
    # serialised on its downlink, per iteration (null without a link rate estimate)
    lost = None
    if link:
        lost = sum(w["_excess"] for w in found) * 8 * ctx.scale / (link * 1e9) / n_it
    imp = impact_of(lost, period)
    wins = [{k: v for k, v in w.items() if not k.startswith("_")} for w in found]
    onset = hot_onset(cells, t, order)
    # vantage: a mirror sees every source; one node's view sees its own sends (a warning
    # only when its routing repeats the hot destination over iterations)
    seen = ips[mem[hub]] if hub is not None else None
    if seen is None:
        cap = "critical" if max(w["sources"] for w in mine) >= MIN_SOURCES else "info"
    else:
        cap = "critical" if max(w["iterations_voting"] for w in mine) >= 2 else "info"
    ev = {"max_over_mean": mom, "share": share, "fair_share": round(1 / n, 4),
          "persistence": persistence[hot_ips[0]], "persistence_by_destination": persistence,
          "observations": sum(w["observations"] for w in mine),
          "skewed_observations": sum(w["skewed_observations"] for w in found), "iterations": n_it,
          "phases_per_iteration": int(np.asarray(cells["mats"]).shape[1]), "drift": drift, "windows": wins,
          "hot_destinations": hot_ips, "members": [ips[m] for m in mem],
          "z": max(w["z"] for w in mine), "sources": max(w["sources"] for w in mine),
          "vantage": "node" if seen else "fabric", "seen_from": seen}
    ds = r.get("dest_skew") or {}
    for k in ("cv", "gini", "jain"):
        ev[k] = ds.get(k)
    ev["phase"] = r.get("dest_skew_phase")
    ev["dest_bytes"] = r.get("dest_bytes")
    where = ("the hottest destination moves: " + " -> ".join(f"{w['hot']} (iterations {w['first_iteration']}-"
                                                              f"{w['end_iteration'] - 1})" for w in wins)
             if drift else f"hottest in {pct(persistence[hot_ips[0]])} of {n_it} iteration(s)")
    cs = [w["contrast"] for w in mine if w["contrast"]]
    ev["contrast"] = float(median(cs)) if cs else None
    contrast = (f" ({ev['contrast']:.2f}x what {'it sends' if hub is not None else 'the same sources send'} "
                f"each other destination)" if cs else "")
    if seen is None:
        who = f"{ev['sources']} source(s)"
        tail = ("hot expert/rank; rebalance experts or check the router's load-balancing loss"
                if ev["sources"] >= MIN_SOURCES else
                f"only {ev['sources']} source(s) name it: too few to tell a hot destination from random imbalance")
    else:
        who = f"{seen}'s own sends and receives"
        tail = ("as seen from this node only: whether it is hot for every source needs the other nodes' views "
                "(cluster) or a mirror")
    # found = skewed observations at `warning`, not chance: a warning; critical by its bytes
    # against the mean destination's
    em.add("hot_destination", _capped("critical" if mom >= t["critical"] else "warning", cap), hot_ips,
           f"{'as seen from ' + seen + ': ' if seen else ''}{hot_ips[0]} receives {mom:.2f}x the mean destination's "
           f"bytes{contrast}, hottest in {ev['observations']} (source, phase) observations of {who} ({pct(share or 0)} "
           f"of its phases' bytes, fair share {pct(1 / n)}); {where}: {tail}",
           ev, flows=into_hot, group=gi, impact=imp, onset=onset)
    if seen is None and cap != "info":
        _explained_rates(em, inp, g, gi, hot_nodes, hot_ips[0])
    t2 = th["alltoall_destination_skew"]
    ps = float(np.max([w["per_source_max_over_mean"] for w in found]))
    if sum(w["observations"] for w in found) >= t2["min_observations"]:
        em.add("alltoall_destination_skew", _capped(sev(ps, t2["warning"], t2["critical"]), cap),
               hot_ips + [ips[m] for m in mem],
               f"{'as seen from ' + seen + ': ' if seen else ''}all-to-all of {n} nodes: "
               f"{'it puts' if seen else 'senders put'} up to {ps:.2f}x "
               f"{'its' if seen else 'their'} mean bytes on one destination "
               f"(hot: {', '.join(hot_ips)}; {sum(w['observations'] for w in found)} skewed observations over "
               f"{n_it} iteration(s)): MoE routing imbalance, the step waits for the slowest destination",
               {"per_source_max_over_mean": ps, "dest_max_over_mean": ds.get("max_over_mean"),
                "dest_gini": ds.get("gini"), "dest_jain": ds.get("jain"), "phase": r.get("dest_skew_phase"),
                "hot_destination": hot_ips[0], "persistence": persistence[hot_ips[0]], "drift": drift,
                "windows": wins, "vantage": ev["vantage"], "seen_from": seen}, flows=into_hot, group=gi, impact=imp,
               onset=onset)


#: rate-based verdicts on other members that a hot destination explains
EXPLAINED_KINDS = {"straggler": "send_ratio", "slow_receiver": "recv_ratio"}


def _explained_rates(em, inp, g, gi, hot_nodes, hot_ip):
    """A hot destination's downlink queues every sender's flows into it: their send (and
    their other receivers' receive) throughput over active time drops, and healthy members
    look like stragglers or slow receivers. A straggler / slow_receiver finding of this group
    on another member whose ratio is back above its warning without the flows to and from
    the hot node(s) is the hot destination's doing: info, saying so. A member slow on its
    other flows too (a real straggler next to a hot expert) keeps its finding."""
    ctx, th = inp.ctx, inp.th
    mine = [f for f in em.out if f.group == gi and f.kind in EXPLAINED_KINDS and f.severity != "info"]
    if not mine:
        return
    gf = np.asarray(g.flows, dtype=np.int64)
    rest = gf[~np.isin(ctx.nodes.src[gf], hot_nodes) & ~np.isin(ctx.nodes.dst[gf], hot_nodes)]
    if not len(rest):
        return
    nt = node_throughput(ctx, rest, g.members)
    pos = {ctx.nodes.ips[m]: i for i, m in enumerate(g.members)}
    hot_set = {ctx.nodes.ips[int(h)] for h in hot_nodes}
    for f in mine:
        ip = f.entities.ips[0] if f.entities.ips else None
        if ip is None or ip in hot_set or ip not in pos:
            continue
        r = float(nt[EXPLAINED_KINDS[f.kind]][pos[ip]])
        if np.isfinite(r) and r > th[f.kind]["warning"]:
            f.severity = "info"
            f.evidence = dict(f.evidence, explained_by="hot_destination", hot_destination=hot_ip,
                              ratio_without_hot=round(r, 4))
            f.message += (f" -- explained by the hot destination {hot_ip}: without the flows to and from it the "
                          f"ratio is {r:.2f}")


def _capped(s, cap):
    """Severity s, at most cap (info < warning < critical); None stays None."""
    order = ("info", "warning", "critical")
    if s is None:
        return None
    return s if order.index(s) <= order.index(cap) else cap


def _own_view(em, inp, g, r, cells, gi, n_it, period, link):
    """The hot node's own view: no other destination to compare with, only what the peers
    send it against what it sends them (info: what this node sees)."""
    ctx, t = inp.ctx, inp.th["hot_destination"]
    a = own_asymmetry(cells, t)
    if a is None:
        return
    ips = ctx.nodes.ips
    mem = list(g.members)
    me = mem[cells["hub"]]
    gf = np.asarray(g.flows, dtype=np.int64)
    into = gf[ctx.nodes.dst[gf] == me].tolist()
    lost = a["_excess"] * 8 * ctx.scale / (link * 1e9) / n_it if link else None
    rev = (f"; in another phase it sends {a['reverse']:.2f}x what it receives (a combine returning the results)"
           if a["reverse"] and a["reverse"] >= t["warning"] else "")
    em.add("hot_destination", "info", [me],
           f"as seen from {ips[me]}: in phase {a['phase']} of its all-to-all, {a['peers']} of {len(mem) - 1} peers send "
           f"it {a['recv_over_send']:.2f}x what it sends them ({a['observations']} of {a['of']} (peer, iteration) "
           f"observations over {a['iterations']} iteration(s)){rev}: its downlink carries more than its uplink, as a "
           f"hot expert's does -- or it sends less than its peers; the other nodes' views (cluster) or a mirror decide",
           {"vantage": "node", "seen_from": ips[me], "basis": "pair_asymmetry", "phase": a["phase"],
            "observations": a["observations"], "of_observations": a["of"], "peers": a["peers"],
            "iterations": a["iterations"], "recv_over_send": round(a["recv_over_send"], 4),
            "send_over_recv_other_phase": None if a["reverse"] is None else round(a["reverse"], 4),
            "members": [ips[m] for m in mem]},
           flows=into, group=gi, impact=impact_of(lost, period))


DETECTORS = [
    Detector(
        "alltoall", alltoall, needs=frozenset({"flows", "groups"}), stage=20,
        doc="all-to-all groups: destination byte skew repeated over (source, phase) observations",
        kinds=(
            Kind("alltoall_destination_skew",
                 key=KEY_BLAMED, headline=("dest_max_over_mean",), actions=(A.REBALANCE_EXPERTS,),
                 role="cause", seen_by="bytes",
                 fires='with a `hot_destination` window: its skewed observations ≥ `min_observations` (3); severity by the '
                       'median per-source max/mean of the hot destination\'s observations (worst window) ≥ `warning` (1.5), '
                       '≥ `critical` (3.0), at most `hot_destination`\'s (one node\'s view of one collective: info)',
                 blames='the hot destination(s), then the members',
                 thresholds=(Threshold("warning", 1.5, "ratio", "per-source max/mean bytes per destination: warning"),
                             Threshold("critical", 3.0, "ratio", "per-source max/mean bytes per destination: critical"),
                             _MIN_OBS),
                 onset="as `hot_destination` (the same observations)"),
            Kind("hot_destination",
                 key=KEY_BLAMED, headline=("max_over_mean", "share"), actions=(A.REBALANCE_EXPERTS,),
                 role="cause", seen_by="bytes",
                 fires='all-to-all: one destination is the single hottest (≥ `warning` 1.5 × the source\'s mean per '
                       'destination) in ≥ `min_observations` (3) (source, phase) observations — sources of one collective '
                       'and iterations alike — and in > `majority` (50 %) of its window\'s skewed observations, and not chance: '
                       'the exact binomial test of its votes against 1 / (n − 1), or the log-additive two-way fit of the '
                       'window\'s bytes (its contrast over the residual, floored at `noise_floor` 0.1), reaches ≥ `min_z` (3) '
                       'standard deviations after × 2 tests × the destinations; severity by its bytes / the mean '
                       'destination\'s in those phases (median) ≥ `warning` / ≥ `critical` 3.0; no byte floor. One node\'s '
                       'view: "as seen from", a warning only when it repeats over ≥ 2 iterations, else info; the hot node\'s '
                       'own view: info when (nearly) every peer sends it ≥ `warning` × what it sends back in one phase. '
                       'From a mirror it also turns a `straggler` / `slow_receiver` of the group on another member into '
                       'info when that member\'s ratio is above its warning without the flows to and from the hot node '
                       '(evidence `explained_by`, `ratio_without_hot`): the hot downlink\'s queue, not the member',
                 blames='the hot node (a drifting one: every window\'s, most observations first); flows into it',
                 thresholds=(Threshold("warning", 1.5, "ratio", "a source's bytes to its hottest destination / its mean per "
                                       "destination: an observation counts as skewed (fleet: a typical source's bytes "
                                       "to it / to each other node): warning"),
                             Threshold("critical", 3.0, "ratio", "the hot destination's bytes / the mean destination's (median over its phases): critical"),
                             _MIN_OBS, _MAJORITY, _MIN_Z, _NOISE),
                 onset="per iteration (collective), the largest share over its phases of the sources whose hottest "
                       "destination is skewed and one of the finding's hot destinations (a drifting one: any of its "
                       "windows'); the stretch of iterations with a median share ≥ `majority` against the rest below "
                       "it (the series scan); since/until at an iteration's start / end. The hot node's own view "
                       "(info): generic"),
        )),
]
