"""Ring steps: per step, each member's own delay; per iteration (token), the member that
gated it. Definitions: docs/metrics.md "Steps and gates".

A ring member sends its step-k message once it has its own previous message out and the
step-(k-1) message from its predecessor in. Each member sends the same number of messages
per iteration, so within an iteration the j-th message of every member is the same step
(a column of the step matrix).

* ready time of step j > 0: the later of the end of the member's step j-1 send and the end
  of the (j-1)-th message it received in the iteration; raw wait = send start - ready time.
* the first step of an iteration, and a step in which every member waited > 4x the typical
  step's median wait (and > it + 1 us: the first step of a collective after compute):
  raw wait = send start - the step's earliest send.
* step lag of a member: its raw wait minus the median raw wait of the step's members:
  the delay it adds to the step on its own (a lag handed on by the ring is not counted
  again downstream: the next member's ready time already includes it).
* the step's last member: the one with the largest lag, when that lag is >= the floor
  (STEP_FLOOR_NS); steps where nobody stands out have no last member. A member's share
  of last places counts over the waited steps (a last member, or any member waiting
  >= the floor): messages that every member sends back to back (the later pieces of a
  large step) are not steps of their own.
* lost per iteration of a member: the sum of its lags over the steps it was last in.
* jitter: 1.4826 x MAD of all the members' step lags (the spread of a healthy step);
  start jitter: the same over the collective-start steps only.
* gate of an iteration: the member with the largest lost time in it, when that is
  >= max(1 us, 4 x the larger jitter) and >= 2x the next member's (otherwise no gate:
  nobody held the iteration up).

Iterations whose members did not send the same number of messages (capture edges, a lost
record) are left out.
"""
from __future__ import annotations

import numpy as np

from skewscope.analysis.context import context

#: a step lag below 1 us is the capture's timestamp resolution / one packet time, not a delay
STEP_FLOOR_NS = 1000.0
#: a gate: its lost time at least this many times the next member's
GATE_RATIO = 2.0
#: a gate: its lost time at least this many step jitters (the larger of all steps' and the
#: collective-start steps')
GATE_JITTER = 4.0
#: a step where every member waited this many times the typical step's wait starts a
#: collective (they all waited for compute): its reference is its earliest send
BOUNDARY_FACTOR = 4.0


def ring_steps(snap, flows, members, iter_starts, ev_mask=None) -> dict | None:
    """Step matrix evidence of a ring group (ns), or None when there are no aligned
    iterations. iter_starts: the iteration (token) burst starts (timing.group_timing)."""
    ctx = context(snap)
    members = list(members)
    nm = len(members)
    if nm < 2 or iter_starts is None or len(iter_starts) == 0:
        return None
    ok = ctx.data_events(flows)
    if ev_mask is not None:
        ok &= ev_mask
    idx = np.nonzero(ok)[0]
    if len(idx) < 2 * nm:
        return None
    st = ctx.ev_start[idx].astype(np.float64)
    en = ctx.ev_end[idx].astype(np.float64)
    pos = np.full(max(1, ctx.nodes.n), -1, dtype=np.int64)
    pos[np.asarray(members, dtype=np.int64)] = np.arange(nm)
    src_m = pos[ctx.nodes.src[ctx.ev_flow[idx]]]
    dst_m = pos[ctx.nodes.dst[ctx.ev_flow[idx]]]
    its = np.asarray(iter_starts, dtype=np.float64)
    it_all = np.searchsorted(its, st, side="right") - 1
    # one sort per side: messages grouped by (iteration, member), start order kept
    nk = len(its) * nm
    groups = []
    for side in (src_m, dst_m):
        key = np.where((it_all >= 0) & (side >= 0), it_all * nm + side, nk)
        o = np.argsort(key, kind="stable")
        bounds_ = np.searchsorted(key[o], np.arange(nk + 1))
        groups.append((o, bounds_))
    (so, sb), (ro, rb) = groups
    lag_cols, start_cols, it_of_col, bound_cols, wait_cols = [], [], [], [], []
    # an iteration is aligned when every member sent and received the same number k > 0 of
    # messages; runs of consecutive aligned iterations with one k are computed together as
    # (iterations, members, steps) arrays (the same values as one iteration at a time)
    ni = len(its)
    cs = np.diff(sb)[:nk].reshape(ni, nm)
    cr = np.diff(rb)[:nk].reshape(ni, nm)
    kk = cs[:, 0]
    aligned = (kk > 0) & (cs == kk[:, None]).all(axis=1) & (cr == kk[:, None]).all(axis=1)
    i = 0
    while i < ni:
        if not aligned[i]:
            i += 1
            continue
        j = i + 1
        while j < ni and aligned[j] and kk[j] == kk[i]:
            j += 1
        k = int(kk[i])
        na = j - i
        s_idx = so[sb[i * nm]:sb[j * nm]]                          # (iteration, member) groups in order
        r_idx = ro[rb[i * nm]:rb[j * nm]]
        S = st[s_idx].reshape(na, nm, k)                           # (iterations, members, steps)
        E = en[s_idx].reshape(na, nm, k)
        RV = en[r_idx].reshape(na, nm, k)                          # the j-th message received
        raw = np.empty_like(S)
        raw[:, :, 0] = S[:, :, 0] - S[:, :, 0].min(axis=1, keepdims=True)
        if k > 1:
            ready = np.maximum(E[:, :, :-1], RV[:, :, :-1])
            raw[:, :, 1:] = np.maximum(S[:, :, 1:] - ready, 0.0)
        med = _center(raw)
        # the first step of a collective (after compute / idle): every member waited, the
        # step's reference is its earliest send
        bound = np.zeros((na, k), dtype=bool)
        bound[:, 0] = True
        if k > 2:
            least = raw.min(axis=1)
            typical = np.median(med[:, 1:], axis=1)
            bound[:, 1:] = least[:, 1:] > np.maximum(BOUNDARY_FACTOR * typical, typical + STEP_FLOOR_NS)[:, None]
            redo = bound[:, 1:].any(axis=1)
            if redo.any():
                rb_ = bound & redo[:, None]
                ref = S - S.min(axis=1, keepdims=True)
                raw = np.where(rb_[:, None, :], ref, raw)
                med = np.where(redo[:, None], _center(raw), med)
        lag_cols.append((raw - med[:, None, :]).transpose(1, 0, 2).reshape(nm, na * k))
        start_cols.append(S.min(axis=1).reshape(-1))
        it_of_col.append(np.repeat(np.arange(i, j), k))
        bound_cols.append(bound.reshape(-1))
        wait_cols.append((raw.max(axis=1) >= STEP_FLOOR_NS).reshape(-1))
        i = j
    if not lag_cols:
        return None
    lag = np.hstack(lag_cols)
    col_t = np.hstack(start_cols)
    col_it = np.hstack(it_of_col)
    bounds = np.hstack(bound_cols)
    waited = np.hstack(wait_cols)
    last = np.argmax(lag, axis=0)
    top = lag[last, np.arange(lag.shape[1])]
    last = np.where(top >= STEP_FLOOR_NS, last, -1)
    if nm == 2:
        # two members: the earlier is the reference (lag 0) of every step, so pooling both
        # would mix that 0 in; the jitter is how far apart the two are, over the steps
        # inside collectives (a 2-rank collective has few: a late start, pooled with them,
        # would be its own jitter), and over the collective starts
        gap = lag.max(axis=0)
        inner = gap[~bounds]
        jitter = _spread(inner if len(inner) else gap)
        start_jitter = _spread(gap[bounds])
    else:
        jitter = _spread(lag.ravel())
        start_jitter = _spread(lag[:, bounds].ravel())
    bar = max(STEP_FLOOR_NS, GATE_JITTER * max(jitter, start_jitter))
    iters = np.unique(col_it)
    lost = np.zeros((len(iters), nm))
    has = last >= 0
    if has.any():
        cols = np.nonzero(has)[0]
        k_of = np.searchsorted(iters, col_it[cols])
        np.add.at(lost, (k_of, last[cols]), np.maximum(lag[last[cols], cols], 0.0))
    gates = []
    for k in range(len(iters)):
        o = np.argsort(-lost[k])
        a, b = lost[k, o[0]], lost[k, o[1]]
        gates.append(int(o[0]) if a >= bar and a >= GATE_RATIO * b else -1)
    return {"lag_ns": lag, "last": last, "col_start_ns": col_t, "col_iteration": col_it,
            "collective_start": bounds, "waited": waited, "iterations": iters, "lost_ns": lost,
            "gates": np.asarray(gates, dtype=np.int64), "jitter_ns": jitter, "start_jitter_ns": start_jitter,
            "steps": int(lag.shape[1])}


def _center(raw):
    """A step's reference wait over the members (axis 1): their median; with two members the
    earlier one (a median of two is their midpoint: the late member would show half its lag)."""
    return raw.min(axis=1) if raw.shape[1] == 2 else np.median(raw, axis=1)


def _spread(x) -> float:
    """1.4826 x MAD (a standard deviation robust to the outliers we look for)."""
    x = np.asarray(x, dtype=np.float64)
    if not len(x):
        return 0.0
    return 1.4826 * float(np.median(np.abs(x - np.median(x))))


def member_summary(steps: dict, m: int) -> dict:
    """A member's step numbers: steps it was last in (count, share of the waited steps:
    those with a last member or where any member waited >= 1 us; continuation messages
    sent back to back by everyone are not steps of their own), its median lag in them (ns), its lost time per iteration (ns, median over the
    aligned iterations) and the iterations it gated."""
    last = steps["last"]
    mine = last == m
    with_last = int(((last >= 0) | steps["waited"]).sum())
    lag = steps["lag_ns"][m, mine]
    return {"last_steps": int(mine.sum()), "steps_with_last": with_last,
            "last_share": float(mine.sum()) / with_last if with_last else 0.0,
            "lag_ns": float(np.median(lag)) if len(lag) else 0.0,
            "lost_per_iteration_ns": float(np.median(steps["lost_ns"][:, m])) if len(steps["lost_ns"]) else 0.0,
            "steps_per_iteration": float(mine.sum()) / max(1, len(steps["iterations"])),
            "gated": int((steps["gates"] == m).sum())}


def persistent(steps: dict, th: dict, nm: int):
    """(member index, member_summary) of the member that is last in most steps with a lag
    well above the step jitter, or None. th: a ring_straggler / slow_tp_shard section
    (min_lag_s, lag_jitter, last_share, min_steps)."""
    best = None
    for m in range(nm):
        s = member_summary(steps, m)
        if s["last_steps"] < th["min_steps"] or s["last_share"] < th["last_share"]:
            continue
        if s["lag_ns"] < max(th["min_lag_s"] * 1e9, th["lag_jitter"] * steps["jitter_ns"]):
            continue
        if best is None or s["last_steps"] > best[1]["last_steps"]:
            best = (m, s)
    return best


def hierarchy_level(starts, count=None) -> dict:
    """{"period_s", "jitter_s", "count"} of a level from its instance start times (ns):
    period = median spacing, jitter = std of the spacings within 0.5-1.5x of it."""
    s = np.asarray(starts, dtype=np.float64)
    out = {"period_s": None, "jitter_s": None, "count": int(len(s) if count is None else count)}
    if len(s) < 2:
        return out
    d = np.diff(s)
    d = d[d > 0]
    if not len(d):
        return out
    p = float(np.median(d))
    dd = d[(d >= 0.5 * p) & (d <= 1.5 * p)]
    out["period_s"] = p / 1e9
    out["jitter_s"] = float(np.std(dd)) / 1e9 if len(dd) >= 2 else None
    return out


def group_steps(snap, g, r: dict, tinfo: dict) -> dict | None:
    """The step evidence of a ring group (training: iterations = its bursts; decode: tokens,
    prefill messages left out), or None. Adds r["hierarchy"] (step -> collective ->
    iteration, each {"period_s", "jitter_s", "count"}) and r["gates"] to the group's
    metrics."""
    ctx = context(snap)
    dec = r.get("decode")
    if dec is not None:
        dt = dec.get("_tinfo") or {}
        its, mask = dt.get("iter_starts"), dt.get("ev_mask")
        coll = hierarchy_level(dt.get("bursts_start", ()))
    else:
        its, mask = tinfo.get("bursts_start"), None
        coll = None
    it_level = {"period_s": r.get("period_s"), "jitter_s": r.get("period_jitter_s"),
                "count": int(r.get("iterations") or 0)}
    steps = None
    if g.kind == "ring_allreduce" and its is not None:
        steps = ring_steps(ctx, g.flows, g.members, its, ev_mask=mask)
    step_level = {"period_s": None, "jitter_s": None, "count": 0}
    if steps is not None:
        t = steps["col_start_ns"]
        same = steps["col_iteration"][1:] == steps["col_iteration"][:-1]
        inner = ~steps["collective_start"][1:] & same
        d = np.diff(t)[inner]
        step_level = {"period_s": None, "jitter_s": None, "count": steps["steps"]}
        if len(d):
            p = float(np.median(d))
            dd = d[(d >= 0.5 * p) & (d <= 1.5 * p)]
            step_level.update(period_s=p / 1e9, jitter_s=float(np.std(dd)) / 1e9 if len(dd) >= 2 else None)
        # the collectives: the steps that start one (every member waited), when there are
        # several per iteration; else the decode bursts / the iterations
        cs = t[steps["collective_start"]]
        if len(cs) > len(steps["iterations"]):
            coll = hierarchy_level(cs)
        ips = ctx.nodes.ips
        gates = steps["gates"]
        gated = gates[gates >= 0]
        r["gates"] = {"per_iteration": [None if x < 0 else ips[g.members[int(x)]] for x in gates],
                      "share": {ips[g.members[int(m)]]: float((gated == m).sum()) / len(gates)
                                for m in np.unique(gated)},
                      "step_jitter_s": steps["jitter_ns"] / 1e9}
    r["hierarchy"] = {"step": step_level, "collective": coll or dict(it_level), "iteration": it_level}
    return steps
