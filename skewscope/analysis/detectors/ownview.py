"""One DPU's view of a ring (a ring segment: upstream -> this node -> downstream, every data
edge touching the node): what a single view may honestly say.

Only the node's own timing is visible in full: its sends, its upstream's data arriving,
and so its own forward latency and the offset of its upstream's same step
(analysis.nodeview). Its upstream's own readiness (what the upstream received, from its
upstream) is not: "my upstream's step data arrives late" is an observation, not a verdict
-- in a data-flow ring a slow member's lag reaches every other member as a late upstream
(docs/metrics.md "Per-node timing"), so every healthy DPU would blame its own healthy
upstream. So from one view:

* the node itself is blamed (slow_tp_shard when its own view reads a decode ring:
  nodeview role tp_decode; ring_straggler otherwise) from its own lag per step (nodeview
  `own_lag`: min(forward latency, -arrival offset)): >= `min_lag_s` in >= `min_steps`
  steps that are >= `last_share` of the steps it waited in (forward latency >= the floor)
  between the first and the last such step (an onset, a recovery: since / until), their
  median >= `lag_jitter` x their spread (a level, not noise crossing the floor) and >=
  slow_tp_shard.`lag_fraction` (0.1) x the node's median step (a constant few-us offset in
  a long step costs nothing) -- under data-flow and barrier-synchronised step timing alike;
* a late upstream (its same-step data arriving after the node's own send, in most steps)
  is `late_upstream`, info: the upstream is named as observed late, not blamed.

The step matrix of the whole-ring detectors (analysis.steps) is not read for a ring
segment: the upstream's readiness is outside the view (decode.py, rings.py skip it)."""
from __future__ import annotations

import inspect

import numpy as np

from skewscope.analysis.detectors import actions as A
from skewscope.analysis.detectors.common import impact_of, pct, us
from skewscope.analysis.detectors.registry import KEY_MEMBERS, Detector, Kind, Threshold
from skewscope.analysis.stats import median, unique


def segment_ends(ctx, g):
    """(hub, upstream, downstream, send flows, receive flows) of a one-ring segment, or None."""
    if g.pattern != "ring_segment":
        return None
    ex = g.extra or {}
    hub, pre, suc = ex.get("hub"), ex.get("predecessors") or [], ex.get("successors") or []
    if hub is None or len(pre) != 1 or len(suc) != 1:
        return None
    gf = np.asarray(g.flows, dtype=np.int64)
    gf = gf[ctx.data[gf] & (ctx.cols["messages"][gf] > 0)]
    src, dst = ctx.nodes.src[gf], ctx.nodes.dst[gf]
    sf = gf[(src == hub) & (dst == suc[0])]
    rf = gf[(dst == hub) & (src == pre[0])]
    if not len(sf) or not len(rf):
        return None
    return int(hub), int(pre[0]), int(suc[0]), sf, rf


def segment_timing(ctx, g):
    """(ends, analysis.nodeview's ring timing of the segment's node) of a one-ring segment,
    or None; cached on the context per group (decode_jitter and own_view both read it)."""
    cache = getattr(ctx, "_ownview", None)
    if cache is None:
        cache = ctx._ownview = {}
    key = tuple(int(f) for f in g.flows)
    if key not in cache:
        ends = segment_ends(ctx, g)
        if ends is None:
            cache[key] = None
        else:
            from skewscope.analysis.nodeview import _ring  # heavy (numba kernels)
            hub, up, down, sf, rf = ends
            cache[key] = (ends, _ring(ctx, hub, sf, rf, up, down))
    return cache[key]


def collective_spacing(res) -> np.ndarray | None:
    """A segment node's own collective starts (nodeview: every M-th send of an iteration),
    spaced inside iterations (ns), or None without collectives to space."""
    tm = res["_samples"]["_times"]
    cs = np.asarray(tm["collectives"], dtype=np.float64)
    its = np.asarray(tm["iterations"], dtype=np.float64)
    if len(cs) < 3 or not len(its):
        return None
    it_of = np.searchsorted(its, cs, side="right") - 1
    d = np.diff(cs)[it_of[1:] == it_of[:-1]]
    return d if len(d) >= 2 else None


def _level(x) -> tuple[float, float]:
    """(median, 1.4826 x MAD) of the steps above the floor: a lag of the node's own is a
    level well above its spread; noise that crosses the floor now and then is spread like
    its tail."""
    m = float(median(x))
    return m, 1.4826 * float(median(np.abs(x - m)))


def episode(t, hit, counted, min_n: int, share: float):
    """The steps from the first to the last `hit` (in time order) when they hold >= min_n
    hits that are >= `share` of the `counted` steps among them: (since ns, until ns or None,
    hits, counted) or None. until: the first counted step after the last hit when at least
    min_n counted steps follow it without one (the condition stopped), else None (holding at
    the end of the data)."""
    o = np.argsort(t, kind="stable")
    t, hit, counted = t[o], hit[o], counted[o] | hit[o]
    h = np.nonzero(hit)[0]
    if len(h) < min_n:
        return None
    a, b = int(h[0]), int(h[-1])
    nc = int(counted[a:b + 1].sum())
    if not nc or len(h) / nc < share:
        return None
    after = np.nonzero(counted[b + 1:])[0]
    until = int(t[b + 1 + after[0]]) if len(after) >= min_n else None
    return int(t[a]), until, int(len(h)), nc


def _when(em, since_ns, until_ns) -> dict:
    """The finding's onset (s, the capture's clock), where the Finding has the fields."""
    if "since" not in inspect.signature(em.add).parameters:
        return {}
    return {"since": since_ns / 1e9, "until": None if until_ns is None else until_ns / 1e9}


def own_view(inp, em):
    ctx, th = inp.ctx, inp.th
    ips = ctx.nodes.ips
    tu = th["late_upstream"]
    for gi, g, r, ev in inp.groups:
        st = segment_timing(ctx, g)
        if st is None:
            continue
        (hub, up, down, sf, rf), res = st
        smp = res["_samples"]
        own = np.asarray(smp["own_lag"], dtype=np.float64)
        fwd = np.asarray(smp["forward_latency"], dtype=np.float64)
        off = np.asarray(smp["step_offset"], dtype=np.float64)
        tt = np.asarray(smp["_times"]["own_lag"], dtype=np.int64)
        ok = np.isfinite(own) & np.isfinite(fwd) & np.isfinite(off)
        own, fwd, off, tt = own[ok], fwd[ok], off[ok], tt[ok]
        if not len(own):
            continue
        # the node's own reading of its group (nodeview role: many small collectives per
        # iteration = decode); a training ring slowed into separate steps can look like a
        # decode cadence to the whole-view classification
        decode = res["role"] == "tp_decode"
        kind = "slow_tp_shard" if decode else "ring_straggler"
        t = th[kind]
        floor = float(t["min_lag_s"]) * 1e9
        late = own >= floor
        period = (res["iteration_s"] or {}).get("p50")
        per = "token" if decode else "iteration"
        ep = episode(tt, late, fwd >= floor, int(t["min_steps"]), float(t["last_share"]))
        jitter = lag = 0.0
        if ep is not None:
            since, until, n_late, n_wait = ep
            inw = (tt >= since) & ((tt < until) if until is not None else True)
            lag, jitter = _level(own[late & inw])
            step = (res["step_s"] or {}).get("p50")
            if lag < float(t["lag_jitter"]) * jitter:
                ep = None           # exceedances of the floor that do not form a level: noise
            elif step and lag < float(th["slow_tp_shard"]["lag_fraction"]) * step * 1e9:
                ep = None           # a constant offset too small to cost the ring a measurable share
        if ep is not None:
            # its lag in the late steps, per iteration (token) the slow stretch spans
            its = np.asarray(smp["_times"]["iterations"], dtype=np.int64)
            n_it = len(unique(np.searchsorted(its, tt[late & inw], side="right"))) if len(its) else 1
            lanes = max(1, int(res.get("lanes") or 1))    # channels wait side by side
            lost = lag * n_late / lanes / max(1, n_it) / 1e9
            whole = period is None or int(res["iterations"] or 0) <= 1
            if whole:
                # no iteration to be seen (its lag is longer than the token gap): what it
                # cost over the captured steps of its slow stretch
                span = float(tt[inw].max() - tt[inw].min()) / 1e9 if inw.any() else 0.0
                lost = lag * n_late / lanes / 1e9
                imp = {"seconds": lost, "share": min(1.0, lost / span) if span > 0 else None}
            else:
                imp = impact_of(lost, period)
            share = imp["share"] if imp else None
            severity = "critical" if share is not None and share >= th["slow_tp_shard"]["critical_share"] else "warning"
            label = "tensor-parallel shard" if decode else "ring member"
            em.add(kind, severity, [hub] + [x for x in g.members if x != hub],
                   f"{label} {ips[hub]} (this DPU's own node) sends {n_late} of {n_wait} ring steps "
                   f"{us(lag)} after it was ready and after its upstream {ips[up]}'s same step "
                   f"(spread {us(jitter)}): "
                   + (f"the ring waited ~{us(lost * 1e9)} for it over {us(span * 1e9)} of steps"
                      + (f" ({pct(share)})" if share is not None else "") if whole else
                      f"every {per} waits ~{us(lost * 1e9)} for it"
                      + (f" ({pct(share)} of the {us(period * 1e9)} {per})" if share is not None else ""))
                   + "; check that GPU/host (clocks, thermal throttling, a noisy neighbour, its NIC/PCIe)",
                   {"source": "own view", "lag_per_step_s": lag / 1e9, "late_steps": n_late, "steps": n_wait,
                    "last_share": n_late / n_wait, "forward_latency_p50_s": float(median(fwd[inw])) / 1e9,
                    "arrival_offset_p50_s": float(median(off[inw])) / 1e9, "lag_spread_s": jitter / 1e9,
                    ("lost_in_capture_s" if whole else "lost_per_token_s" if decode else "lost_per_iteration_s"): lost,
                    "token_share": share,
                    "token_interval_s": period, "upstream": ips[up], "downstream": ips[down],
                    "since_s": since / 1e9, "until_s": None if until is None else until / 1e9},
                   flows=[int(f) for f in sf], group=gi, impact=imp, **_when(em, since, until))
            continue
        # the upstream's same step after this node's own send: an observation only
        lateu = off >= float(tu["min_lag_s"]) * 1e9
        ep = episode(tt, lateu, np.ones(len(off), dtype=bool), int(t["min_steps"]), float(tu["share"]))
        if ep is not None:
            since, until, n_late, n_all = ep
            lag, spread = _level(off[lateu])
            if lag < float(t["lag_jitter"]) * spread:
                continue
            em.add("late_upstream", "info", [up, hub, down],
                   f"{ips[up]}'s step data arrives {us(lag)} after {ips[hub]}'s own send of the same step in "
                   f"{n_late} of {n_all} ring steps: {ips[up]} or a member before it in the ring is "
                   f"slow -- one DPU cannot tell which (a late member's own DPU sees its own lag; `skewscope "
                   f"cluster` over every DPU names it)",
                   {"source": "own view", "observed_late": ips[up], "arrival_offset_p50_s": lag / 1e9,
                    "late_steps": n_late, "steps": n_all, "role": res["role"],
                    "forward_latency_p50_s": float(median(fwd)) / 1e9,
                    "since_s": since / 1e9, "until_s": None if until is None else until / 1e9},
                   flows=[int(f) for f in rf], group=gi, **_when(em, since, until))


DETECTORS = [
    Detector(
        "own_view", own_view, needs=frozenset({"flows", "records", "groups"}), stage=22,
        emits=("slow_tp_shard", "ring_straggler"),
        doc="one DPU's view of a ring (a ring segment): its own node's lag per step, its upstream observed late",
        kinds=(
            Kind("late_upstream",
                 key=KEY_MEMBERS, headline=("arrival_offset_p50_s",), actions=(), role="symptom",
                 fires="one node's view of a ring (ring segment: upstream -> this node -> downstream): the upstream's "
                       "step-k data starts ≥ `min_lag_s` (1 µs) after this node's own step-k send in ≥ `share` (50 %) "
                       "of the steps between the first and the last such step, ≥ `min_steps` (8, of slow_tp_shard / "
                       "ring_straggler) of them, their median ≥ `lag_jitter` (4) × their spread (1.4826 × MAD), and "
                       "the node itself is not late. An observation: the upstream or a member before it is slow (in "
                       "a data-flow ring a slow member's lag reaches every member as a late upstream)",
                 blames="the upstream observed late (not a verdict), then this node and its downstream",
                 thresholds=(Threshold("min_lag_s", 1e-6, "s", "the upstream's same step after this node's send, at least"),
                             Threshold("share", 0.5, "fraction", "share of the ring steps with such a late upstream, at least"))),
        )),
]
