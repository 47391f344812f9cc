"""All-to-all volume skew: hot_destination, alltoall_destination_skew (MoE routing).

Evidence is repetition, not volume (issue 12 item 1): an observation is one source's
bytes per destination in one (iteration, phase) cell (group_metrics._iteration_cells; the
one-host view: the hub's sends). An observation is skewed when its hottest destination
gets >= `warning` x the source's mean per destination. A destination is hot when it is the
hottest of >= `min_observations` skewed observations and of a majority (> `majority`) of the
skewed observations of its time window, and more often than chance (a binomial z >=
`min_z` against 1 / (n - 1) of the skewed observations). Windows: maximal runs of iterations whose modal
hottest destination is the same (a drifting hot expert gives one window per position).
Persistence: share of the iterations (with traffic) in which the hot destination was the
hottest. No byte floor: a 1 KiB decode dispatch repeated 24 times is as significant as a
64 MiB training one."""
from __future__ import annotations

import numpy as np

from skewscope.analysis.detectors.common import impact_of, pct, sev
from skewscope.analysis.detectors.registry import Detector, Kind, Threshold
from skewscope.analysis.onset import series_onset

_MIN_OBS = Threshold("min_observations", 4, "count",
                     "skewed (source, phase) observations naming the same hottest destination, at least")
_MAJORITY = Threshold("majority", 0.5, "fraction",
                      "share of its window's skewed observations that name the hot destination, more than")
_MIN_Z = Threshold("min_z", 3.0, "ratio", "(its observations - skewed observations / (n - 1)) / the binomial "
                   "standard deviation, at least: not chance")


def alltoall(inp, em):
    for gi, g, r, ev in inp.groups:
        if g.kind == "all_to_all" and ev.a2a_cells is not None:
            _one(em, inp, g, r, ev.a2a_cells, gi)


def observations(cells, warn):
    """Per (iteration, phase, observation slot = source; one-host view: the hub's sends and
    its receives): hottest destination (-1: none), its max/mean over the others, the bytes
    above that mean, valid slots; and the per-cell destination totals [I, K, n]."""
    m = np.asarray(cells["mats"], dtype=np.float64)          # [I, K, n, n]
    n = m.shape[-1]
    hub = cells.get("hub")
    if hub is not None:
        # one-host view: the hub's sends per destination and its receives per source (the
        # combine phase brings a hot expert's results back: it is the hottest source)
        rows = np.stack([m[:, :, hub, :], m[:, :, :, hub]], axis=2)     # [I, K, 2, n]
        off = np.ones((2, n), dtype=bool)
        off[:, hub] = False
    else:
        rows = m
        off = ~np.eye(n, dtype=bool)
    mo = np.where(off, rows, np.nan)
    row = np.nansum(mo, axis=3)                               # [I, K, S]
    mean = row / max(1, n - 1)
    filled = np.where(np.isnan(mo), -1.0, mo)
    mx = filled.max(axis=3)
    hot = filled.argmax(axis=3)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(mean > 0, mx / mean, np.nan)
    valid = row > 0
    skewed = valid & (ratio >= warn)
    hot = np.where(skewed, hot, -1)
    excess = np.where(skewed, mx - mean, 0.0)
    return hot, np.where(valid, ratio, np.nan), excess, valid, m.sum(axis=2)


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


def hot_windows(cells, t) -> tuple[list[dict], list[int], np.ndarray]:
    """The hot-destination windows of an all-to-all's cells under thresholds t
    (hot_destination's): [{"_h": member position, first_iteration, end_iteration,
    observations, skewed_observations, max_over_mean, per_source_max_over_mean, share,
    phases, "_excess"}], the per-iteration hottest position (-1: none) and the iterations
    with traffic."""
    hot, ratio, excess, valid, dest = observations(cells, t["warning"])
    n = dest.shape[-1]
    runs, per_it = windows(hot, valid, n)
    found = []
    for a, b, h in runs:
        hw = hot[a:b]
        sk = int((hw >= 0).sum())
        votes = int((hw == h).sum())
        # not chance: a source's hottest destination is a given one with p0 = 1 / (n - 1)
        p0 = 1.0 / max(1, n - 1)
        z = (votes - sk * p0) / max(1e-9, float(np.sqrt(sk * p0 * (1 - p0))))
        if votes < t["min_observations"] or votes <= t["majority"] * sk or z < t["min_z"]:
            continue
        rv = ratio[a:b][hw == h]
        cells_h = dest[a:b]                                   # [i, K, n] bytes per destination
        tot = cells_h.sum(axis=2)
        hot_cell = (hw == h).any(axis=2)
        with np.errstate(invalid="ignore", divide="ignore"):
            share = np.where(tot > 0, cells_h[..., h] / tot, np.nan)
            colr = np.where(tot > 0, cells_h[..., h] / (tot / n), np.nan)[hot_cell]
        pr = float(np.median(rv))
        dm = pr if cells.get("hub") is not None or not len(colr) else float(np.nanmedian(colr))
        found.append({"_h": h, "first_iteration": a, "end_iteration": b,
                      "observations": votes, "skewed_observations": sk, "z": round(z, 3),
                      "max_over_mean": dm, "per_source_max_over_mean": pr,
                      "share": float(np.nanmedian(share[hot_cell])) if hot_cell.any() else None,
                      "phases": int(hot_cell.sum()),
                      "_excess": float(excess[a:b][hw == h].sum())})
    return found, per_it, valid.any(axis=(1, 2))


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
    found, per_it, act_it = hot_windows(cells, t)
    n_it = int(act_it.sum()) or 1
    st, en = np.asarray(cells["start_ns"]), np.asarray(cells["end_ns"])
    t0 = float(ctx.t0)
    period = r.get("period_s")
    for w in found:
        a, b = w["first_iteration"], w["end_iteration"]
        w.update(hot=ips[mem[w["_h"]]], start_s=(float(st[a]) - t0) / 1e9, end_s=(float(en[b - 1]) - t0) / 1e9)
    if not found:
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
    mom = float(np.median([w["max_over_mean"] for w in mine]))
    share = mine[0]["share"]
    drift = len(order) > 1
    hot_ips = [ips[mem[h]] for h in order]
    gf = np.asarray(g.flows, dtype=np.int64)
    hot_nodes = np.array([mem[h] for h in order])
    into_hot = gf[np.isin(ctx.nodes.dst[gf], hot_nodes)].tolist()
    # impact: the bytes the skewed senders put on the hot destination above their mean,
    # serialised on its downlink, per iteration (null without a link rate estimate)
    link = (inp.pfc or {}).get("link_gbps_est")
    lost = None
    if link:
        lost = sum(w["_excess"] for w in found) * 8 * ctx.scale / (link * 1e9) / n_it
    imp = impact_of(lost, period)
    wins = [{k: v for k, v in w.items() if not k.startswith("_")} for w in found]
    onset = hot_onset(cells, t, order)
    ev = {"max_over_mean": mom, "share": share, "fair_share": round(1 / n, 4),
          "persistence": persistence[hot_ips[0]], "persistence_by_destination": persistence,
          "observations": sum(w["observations"] for w in mine),
          "skewed_observations": sum(w["skewed_observations"] for w in found), "iterations": n_it,
          "phases_per_iteration": int(np.asarray(cells["mats"]).shape[1]), "drift": drift, "windows": wins,
          "hot_destinations": hot_ips, "members": [ips[m] for m in mem]}
    ds = r.get("dest_skew") or {}
    for k in ("cv", "gini", "jain"):
        ev[k] = ds.get(k)
    ev["phase"] = r.get("dest_skew_phase")
    ev["dest_bytes"] = r.get("dest_bytes")
    where = ("the hottest destination moves: " + " -> ".join(f"{w['hot']} (iterations {w['first_iteration']}-"
                                                              f"{w['end_iteration'] - 1})" for w in wins)
             if drift else f"hottest in {pct(persistence[hot_ips[0]])} of {n_it} iteration(s)")
    em.add("hot_destination", sev(mom, t["warning"], t["critical"]), hot_ips,
           f"{hot_ips[0]} receives {mom:.2f}x the mean destination's bytes, hottest in "
           f"{ev['observations']} (source, phase) observations ({pct(share or 0)} of its phases' bytes, fair share "
           f"{pct(1 / n)}); {where}: hot expert/rank; rebalance experts or check the router's load-balancing loss",
           ev, flows=into_hot, group=gi, impact=imp, onset=onset)
    t2 = th["alltoall_destination_skew"]
    ps = float(np.max([w["per_source_max_over_mean"] for w in found]))
    if sum(w["observations"] for w in found) >= t2["min_observations"]:
        em.add("alltoall_destination_skew", sev(ps, t2["warning"], t2["critical"]), hot_ips + [ips[m] for m in mem],
               f"all-to-all of {n} nodes: senders put up to {ps:.2f}x their mean bytes on one destination "
               f"(hot: {', '.join(hot_ips)}; {sum(w['observations'] for w in found)} skewed observations over "
               f"{n_it} iteration(s)): MoE routing imbalance, the step waits for the slowest destination",
               {"per_source_max_over_mean": ps, "dest_max_over_mean": ds.get("max_over_mean"),
                "dest_gini": ds.get("gini"), "dest_jain": ds.get("jain"), "phase": r.get("dest_skew_phase"),
                "hot_destination": hot_ips[0], "persistence": persistence[hot_ips[0]], "drift": drift,
                "windows": wins}, flows=into_hot, group=gi, impact=imp, onset=onset)


DETECTORS = [
    Detector(
        "alltoall", alltoall, needs=frozenset({"flows", "groups"}), stage=20,
        doc="all-to-all groups: destination byte skew repeated over (source, phase) observations",
        kinds=(
            Kind("alltoall_destination_skew",
                 fires='with a `hot_destination` window: its skewed observations ≥ `min_observations` (4); severity by the '
                       'median per-source max/mean of the hot destination\'s observations (worst window) ≥ `warning` (1.5), ≥ `critical` (3.0)',
                 blames='the hot destination(s), then the members',
                 thresholds=(Threshold("warning", 1.5, "ratio", "per-source max/mean bytes per destination: warning"),
                             Threshold("critical", 3.0, "ratio", "per-source max/mean bytes per destination: critical"),
                             _MIN_OBS),
                 onset="as `hot_destination` (the same observations)"),
            Kind("hot_destination",
                 fires='all-to-all: one destination is the hottest (≥ `warning` 1.5 × the source\'s mean per destination) '
                       'in ≥ `min_observations` (4) (source, phase) observations and in > `majority` (50 %) of its window\'s '
                       'skewed observations, ≥ `min_z` (3) binomial standard deviations above chance (1 / (n − 1) of them); severity by its bytes / the mean destination\'s in those phases (median) ≥ `warning` / ≥ `critical` 3.0; no byte floor',
                 blames='the hot node (a drifting one: every window\'s, most observations first); flows into it',
                 thresholds=(Threshold("warning", 1.5, "ratio", "a source's bytes to its hottest destination / its mean per "
                                       "destination: an observation counts as skewed (fleet: a typical source's bytes "
                                       "to it / to each other node): warning"),
                             Threshold("critical", 3.0, "ratio", "the hot destination's bytes / the mean destination's (median over its phases): critical"),
                             _MIN_OBS, _MAJORITY, _MIN_Z),
                 onset="per iteration (collective), the largest share over its phases of the sources whose hottest "
                       "destination is skewed and one of the finding's hot destinations (a drifting one: any of its "
                       "windows'); the stretch of iterations with a median share ≥ `majority` against the rest below "
                       "it (the series scan); since/until at an iteration's start / end"),
        )),
]
