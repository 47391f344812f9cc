"""Ring steps: per step, each member's own delay; per iteration (token), the member that
gated it; the slow stretch of a member (onset / recovery). Definitions: docs/metrics.md
"Steps and gates".

A ring member sends its step-k message once it has its own previous message out and the
step-(k-1) message from its predecessor in (data-flow timing, NCCL), or once every member's
step k-1 has ended (barrier timing: simulators, test rigs). Each member sends the same
number of messages per iteration, so within an iteration the j-th message of every member
is the same step (a column of the step matrix); with channels side by side, a member's own
previous step is D columns back and the predecessor's data R columns back (found from the
data; no such R: the sends do not wait for what arrives, and there are no steps).

* raw wait of column j >= D: send start - max(own message j-D end, received message j-D
  end); the first columns of an iteration and a collective's first step (every member
  waited > 4x the typical wait and > it + 1 us): send start - the step's earliest send.
* own delay: data flow, send start - max(own previous end, predecessor's data end + the
  step's hop); barrier (nobody starts before the previous step's last end, and more members
  start right after it than right after their own data): send start - max(own previous end,
  that last end + the step's hop).
* step lag of a member: its own delay minus the median of the step's members: the delay it
  adds to the step on its own (a lag handed on by the ring is not counted again
  downstream: the next member's ready time already includes it).
* the step's last member: the one with the largest lag, when that lag is >= the floor
  (STEP_FLOOR_NS); steps where nobody stands out have no last member. A member's share
  of last places counts over the waited steps (a last member, or any member waiting
  >= the floor): messages that every member sends back to back (the later pieces of a
  large step) are not steps of their own.
* lost per iteration of a member: the sum, over the steps it was last in, of its cost
  (data flow: its raw wait beyond the step's median; barrier: its lag), the largest over a
  step's side-by-side columns.
* jitter: 1.4826 x MAD of all the members' step lags (the spread of a healthy step);
  start jitter: the same over the collective-start steps only.
* gate of an iteration: the member with the largest lost time in it, when that is
  >= max(1 us, 4 x the larger jitter) and >= 2x the next member's (otherwise no gate:
  nobody held the iteration up).
* slow stretch (slow_segment): a change point on the member's per-step series of "last by a
  lag above the bar"; since / until of the finding.

Iterations whose members did not send the same number of messages (capture edges, a lost
record) are merged with the next ones until they align, else left out; bursts that are
single steps (a lag longer than a step idles the wire between steps) are merged into
iterations.
"""
from __future__ import annotations

import numpy as np

from skewscope.analysis.context import context
from skewscope.analysis.flows import csr_by_key
from skewscope.analysis.intervals import natural_break
from skewscope.analysis.stats import bisect_right, median, median_axis1, unique
from skewscope.core.jit import njit

#: a step lag below 1 us is the capture's timestamp resolution / one packet time, not a delay
STEP_FLOOR_NS = 1000.0
#: a gate: its lost time at least this many times the next member's
GATE_RATIO = 2.0
#: a gate: its lost time at least this many step jitters (the larger of all steps' and the
#: collective-start steps')
GATE_JITTER = 4.0
#: a ring's steps depend on each other when at least this share of the sends start after the
#: predecessor's previous step arrived (ring_steps); below it the streams are independent
DEPENDENT_SHARE = 0.8
#: a step is barrier-timed when every member starts it no earlier than this before the end
#: of the last message of the previous step (timestamp noise)
BARRIER_TOL_NS = 100.0
#: ... and more members wait within this of the least wait when measured from the barrier than
#: from their own dependencies
MODEL_TOL_NS = 250.0
#: a step where every member waited this many times the typical step's wait starts a
#: collective (they all waited for compute): its reference is its earliest send
BOUNDARY_FACTOR = 4.0


def ring_steps(snap, flows, members, iter_starts, ev_mask=None, _merge=True) -> dict | None:
    """Step matrix evidence of a ring group (ns), or None when there are no aligned
    iterations. iter_starts: the iteration (token) burst starts (timing.group_timing).
    Bursts that do not align on their own are merged with the next ones (up to
    MERGE_BURSTS) when together they do (_merge_bursts)."""
    ctx = context(snap)
    members = list(members)
    nm = len(members)
    if nm < 2 or iter_starts is None or len(iter_starts) == 0:
        return None
    fm = np.zeros(len(ctx.flows), dtype=np.bool_)
    fm[np.asarray(flows, dtype=np.int64)] = True
    pos = np.full(max(1, ctx.nodes.n), -1, dtype=np.int64)
    pos[np.asarray(members, dtype=np.int64)] = np.arange(nm)
    its = np.asarray(iter_starts, dtype=np.float64)
    nk = len(its) * nm
    # the group's data records (start, end), grouped by (iteration, member) as a sender and
    # as a receiver, start order kept (one pass: _ring_records)
    st, en, so, sb, ro, rb = _ring_records(
        ctx.ev_data, ctx.ev_flow, fm, np.ones(1, np.bool_) if ev_mask is None else np.ascontiguousarray(ev_mask),
        ev_mask is not None, ctx.ev_start, ctx.ev_end, ctx.nodes.src, ctx.nodes.dst, pos, its, nm)
    if len(st) < 2 * nm:
        return None
    sb, rb = sb[:nk + 1], rb[:nk + 1]
    lag_cols, start_cols, it_of_col, bound_cols, wait_cols, step_cols, cost_cols = [], [], [], [], [], [], []
    span = [np.inf, -np.inf]
    # an iteration is aligned when every member sent and received the same number k > 0 of
    # messages; runs of consecutive aligned iterations with one k are computed together as
    # (iterations, members, steps) arrays (the same values as one iteration at a time)
    ni = len(its)
    cs = np.diff(sb)[:nk].reshape(ni, nm)
    cr = np.diff(rb)[:nk].reshape(ni, nm)
    kk = cs[:, 0]
    aligned = (kk > 0) & (cs == kk[:, None]).all(axis=1) & (cr == kk[:, None]).all(axis=1)
    if _merge and ni >= 4 and aligned.any():
        # bursts that hold at most one message per flow are single steps (a lag much longer
        # than a step leaves the wire idle between steps, and the steps repeat regularly):
        # the iterations are the bursts merged across the gaps below the natural break of
        # the gaps between them (the compute between tokens / iterations); without one that
        # merges at least half of them, the whole capture
        per_flow = float(median(kk[aligned])) / max(1.0, _flows_per_member(ctx, flows, members))
        if per_flow <= 1.0 or _opened_by_one(st, en, so, sb, ni, nm, aligned):
            gaps = np.diff(its)
            thr = natural_break(gaps, 3.0, 1000.0)
            keep = np.concatenate([[0], np.nonzero(gaps > thr)[0] + 1]) if np.isfinite(thr) else np.zeros(1, np.int64)
            whole = len(keep) > 0.5 * ni
            # no gap stands out (the compute between tokens as long as the lag): the capture
            # is one iteration, its columns aligned by each member's ordinal
            out = ring_steps(snap, flows, members, its[:1] if whole else its[keep], ev_mask, _merge=True)
            if out is not None:
                out["whole_capture"] = whole
                out["bursts_are_steps"] = True
            return out
    if _merge and not aligned.all():
        # a burst split inside an iteration (a lag as long as the idle time between
        # iterations): the smallest runs of consecutive bursts that align together
        keep = _merge_bursts(cs, cr)
        if len(keep) < ni:
            return ring_steps(snap, flows, members, its[keep], ev_mask, _merge=False)
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
        # D: how many columns back a message's own previous step is (its channels' messages
        # of one step run side by side: D = the channels; pieces of a step back to back: 1);
        # R: how many columns back the predecessor's data it forwards is (a multiple of D:
        # the messages of one step), None when the sends do not wait for what arrives
        D = _dep_distance(S, E)
        R = k if k <= D else _rv_distance(S, E, RV, D, max(D, min(k // (2 * (nm - 1)), 16 * D)))
        if R is None:
            # the members' sends do not wait for what they receive (independent streams on
            # a ring of connections, e.g. a benchmark): no steps, no one waits for anyone
            i = j
            continue
        raw0 = np.empty_like(S)                                    # wait after its dependencies
        raw0[:, :, :R] = S[:, :, :R] - S[:, :, :R].min(axis=1, keepdims=True)
        raw = raw0.copy()                                          # its own delay (the hop removed)
        cost = raw0.copy()
        if k > R:
            Sx, Eo, Rv = S[:, :, R:], E[:, :, R - D:k - D], RV[:, :, :k - R]
            raw0[:, :, R:] = np.maximum(Sx - np.maximum(Eo, Rv), 0.0)
            # data flow: a member forwards a step a hop (reduction, processing) after its
            # predecessor's data arrived and its own previous message is out; the hop is the
            # step's typical one (centre over the members), so a member's own delay is its
            # start after max(own previous end, arrival + hop)
            h = _center(Sx - Rv)[:, None, :]
            rdf = np.maximum(Sx - np.maximum(Eo, Rv + h), 0.0)
            # barrier: every member starts a step a hop after the last message of the
            # previous step ended (each waits for the slowest)
            Bm = Eo.max(axis=1, keepdims=True)
            hb = _center(Sx - Bm)[:, None, :]
            rbar = np.maximum(Sx - np.maximum(Eo, Bm + hb), 0.0)
            # barrier-timed when nobody started before the barrier and more members start
            # right after it than right after their own dependencies (the healthy members
            # agree on the barrier, and wait different times for their own data; a laggard
            # stands out from it)
            barrier = (Sx >= Bm - BARRIER_TOL_NS).all(axis=1, keepdims=True) & (
                _at_min(rbar) > _at_min(raw0[:, :, R:]))
            raw[:, :, R:] = np.where(barrier, rbar, rdf)
            # what the step lost to a member (the impact): under data flow its wait beyond
            # the typical member's (a lag that overlaps the hop everyone waits anyway costs
            # nothing more), under a barrier its delay after it
            cost[:, :, R:] = np.where(barrier, rbar, raw0[:, :, R:])
        # the first step of a collective (after compute / idle): every member waited, the
        # step's reference is its earliest send. Found on each message's wait after its
        # previous step's message sent and the one received as many columns back (D)
        rold = np.empty_like(S)
        rold[:, :, :D] = S[:, :, :D] - S[:, :, :D].min(axis=1, keepdims=True)
        if k > D:
            rold[:, :, D:] = np.maximum(S[:, :, D:] - np.maximum(E[:, :, :-D], RV[:, :, :-D]), 0.0)
        bound = np.zeros((na, k), dtype=bool)
        bound[:, 0] = True
        if k > 2:
            least = rold.min(axis=1)
            typical = median(_center(rold)[:, 1:], axis=1)
            cand = np.zeros((na, k), dtype=bool)
            cand[:, 1:] = least[:, 1:] > np.maximum(BOUNDARY_FACTOR * typical, typical + STEP_FLOOR_NS)[:, None]
            redo = cand[:, 1:].any(axis=1)
            if redo.any():
                rb_ = cand & redo[:, None]
                ref = S - S.min(axis=1, keepdims=True)
                raw = np.where(rb_[:, None, :], ref, raw)
                rold = np.where(rb_[:, None, :], ref, rold)
                cost = np.where(rb_[:, None, :], ref, cost)
            # one collective start per step: its channels' D columns
            bound[:, 1:] = cand[:, 1:] & ~cand[:, :-1] if D > 1 else cand[:, 1:]
        med = _center(raw)
        lag_cols.append((raw - med[:, None, :]).transpose(1, 0, 2).reshape(nm, na * k))
        cost_cols.append((cost - _center(cost)[:, None, :]).transpose(1, 0, 2).reshape(nm, na * k))
        start_cols.append(S.min(axis=1).reshape(-1))
        span[0] = min(span[0], float(S.min()))
        span[1] = max(span[1], float(E.max()))
        it_of_col.append(np.repeat(np.arange(i, j), k))
        step_cols.append(np.tile(np.arange(k) // D, na))         # the step (D columns side by side)
        bound_cols.append(bound.reshape(-1))
        wait_cols.append((rold.max(axis=1) >= STEP_FLOOR_NS).reshape(-1))
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
    iters = unique(col_it)
    lost = np.zeros((len(iters), nm))
    has = last >= 0
    if has.any():
        cols = np.nonzero(has)[0]
        k_of = np.searchsorted(iters, col_it[cols])
        # the columns of one step run side by side (channels): a member loses the largest
        # of its lags in them, not their sum
        col_step = np.hstack(step_cols)
        blk = np.unique(np.stack([col_it[cols], col_step[cols]]), axis=1, return_inverse=True)[1].reshape(-1)
        per = np.zeros((int(blk.max()) + 1, nm))
        cst = np.hstack(cost_cols)
        np.maximum.at(per, (blk, last[cols]), np.maximum(cst[last[cols], cols], 0.0))
        b_it = np.zeros(per.shape[0], dtype=np.int64)
        b_it[blk] = k_of
        np.add.at(lost, b_it, per)
    gates = []
    for k in range(len(iters)):
        o = np.argsort(-lost[k])
        a, b = lost[k, o[0]], lost[k, o[1]]
        gates.append(int(o[0]) if a >= bar and a >= GATE_RATIO * b else -1)
    return {"lag_ns": lag, "last": last, "col_start_ns": col_t, "col_iteration": col_it,
            "collective_start": bounds, "waited": waited, "iterations": iters, "lost_ns": lost,
            "gates": np.asarray(gates, dtype=np.int64), "jitter_ns": jitter, "start_jitter_ns": start_jitter,
            "steps": int(lag.shape[1]), "span_ns": span[1] - span[0], "whole_capture": False,
            "bursts_are_steps": False}


@njit(cache=True, nogil=True)
def _ring_records(ev_data, ev_flow, fm, ev_mask, masked, ev_start, ev_end, nsrc, ndst, pos, its, nm):
    """ring_steps' records in one pass: those of data (ev_data) on the group's flows (fm,
    a bool per flow row) and in ev_mask when masked: (start, end, so, sb, ro, rb), so/sb the
    records by (iteration, sending member) and ro/rb by (iteration, receiving member) as
    csr_by_key orders them (key iteration x nm + member: the last burst start at or before
    the record's start, np.searchsorted side right - 1; records before the first burst or
    of a non-member: key nk, after every group). The same values as the numpy steps
    (mask, nonzero, gathers, searchsorted, where, csr_by_key) without their temporaries."""
    n = ev_data.shape[0]
    m = 0
    for i in range(n):
        if ev_data[i] and fm[ev_flow[i]] and (not masked or ev_mask[i]):
            m += 1
    st = np.empty(m, dtype=np.float64)
    en = np.empty(m, dtype=np.float64)
    ks = np.empty(m, dtype=np.int64)
    kr = np.empty(m, dtype=np.int64)
    ni = its.shape[0]
    nk = ni * nm
    j = 0
    for i in range(n):
        if ev_data[i] and fm[ev_flow[i]] and (not masked or ev_mask[i]):
            f = ev_flow[i]
            s = ev_start[i]
            st[j] = s
            en[j] = ev_end[i]
            it = bisect_right(its, s) - 1
            a = pos[nsrc[f]]
            b = pos[ndst[f]]
            ks[j] = it * nm + a if it >= 0 and a >= 0 else nk
            kr[j] = it * nm + b if it >= 0 and b >= 0 else nk
            j += 1
    so, sb = csr_by_key(ks, nk + 1)
    ro, rb = csr_by_key(kr, nk + 1)
    return st, en, so, sb, ro, rb


def _at_min(raw):
    """Per (iteration, column): how many members' waits are within MODEL_TOL_NS of the
    smallest (axis 1 = members), keepdims."""
    return (raw <= raw.min(axis=1, keepdims=True) + MODEL_TOL_NS).sum(axis=1, keepdims=True)


def _rv_distance(S, E, RV, D: int, rmax: int):
    """The smallest multiple R of D (<= rmax: a ring all-reduce has 2(n-1) steps; at most 16
    messages per channel and step) such that,
    for every member, >= DEPENDENT_SHARE of its messages start after the message it received
    R columns before ended (within half a message time: the last packets may still drain):
    the step's data it forwards. None when no such R: its sends do not wait for its receives."""
    r = _rv_first(S, E, RV, D, rmax, DEPENDENT_SHARE)
    return None if r < 0 else int(r)


@njit(cache=True, nogil=True)
def _rv_first(S, E, RV, D, rmax, share):
    """_rv_distance's search in one pass per candidate R, a member at a time, stopping at the
    first member below the share (the numpy form built three (iterations, members, columns)
    arrays per candidate: 0.1 s of a 10.6 M-frame report). The same float operations and the
    same share (count / entries) as numpy's mean of the comparisons; -1 when none."""
    na, nm, k = S.shape
    for r in range(D, min(k - 1, rmax) + 1, D):
        n = na * (k - r)
        good = True
        for m in range(nm):
            c = 0
            for a in range(na):
                for j in range(k - r):
                    if S[a, m, j + r] >= RV[a, m, j] - 0.5 * (E[a, m, j] - S[a, m, j]):
                        c += 1
            if c / n < share:
                good = False
                break
        if good:
            return r
    return -1


def _dep_distance(S, E, dmax: int = 64) -> int:
    """The smallest d such that a member's message d columns back was past its midpoint when
    it started (one after the other, the next may start while the last packets of the
    previous drain), for >= 90 % of the (iteration, member, column) entries: the columns a
    step spans (channels sending side by side start together). S, E: (iterations, members,
    columns)."""
    return int(_dep_first(S, E, dmax))


@njit(cache=True, nogil=True)
def _dep_first(S, E, dmax):
    """_dep_distance's search in one pass per candidate d without the (iterations, members,
    columns) temporaries of the numpy form: the same comparisons, the same share (count /
    entries, as numpy's mean of them); 1 when none."""
    na, nm, k = S.shape
    for d in range(1, min(k, dmax + 1)):
        n = na * nm * (k - d)
        if n == 0:
            continue
        c = 0
        for a in range(na):
            for m in range(nm):
                for j in range(k - d):
                    if S[a, m, j + d] >= 0.5 * (S[a, m, j] + E[a, m, j]):
                        c += 1
        if c / n >= 0.9:
            return d
    return 1


#: bursts are single steps when at least this share of them is opened by one member whose
#: first message ends before any other member starts (_opened_by_one)
OPENED_SHARE = 0.8


def _opened_by_one(st, en, so, sb, ni, nm, aligned) -> bool:
    """The aligned bursts are mostly opened by one member whose every message of the burst
    (one step's pieces, on every channel) the others wait for before they send at all: a collective
    starts with every member sending its first step together, so such bursts are single
    ring steps -- one slow member's step, the others' answers -- of a lag much longer than a
    step that leaves the wire idle between them (steps of several messages each; one
    message per flow is the per_flow test)."""
    if aligned.sum() < 4 or nm < 2:
        return False
    nk = ni * nm
    cnt = np.diff(sb)[:nk]
    first = np.full(nk, -1, dtype=np.int64)
    has = cnt > 0
    first[has] = so[sb[:nk][has]]
    # the end of a member's last message in the burst (its whole step: every piece, channel)
    last_end = np.full(nk, -np.inf)
    if has.any():
        es = en[so[:sb[nk]]]
        last_end[has] = np.maximum.reduceat(es, sb[:nk][has])
    f = first.reshape(ni, nm)[aligned]
    le = last_end.reshape(ni, nm)[aligned]
    if (f < 0).any():
        return False
    fs = st[f]
    lead = np.argmin(fs, axis=1)
    rows = np.arange(len(f))
    others = fs.copy()
    others[rows, lead] = np.inf
    opened = others.min(axis=1) >= le[rows, lead]
    return float(opened.mean()) >= OPENED_SHARE


def _flows_per_member(ctx, flows, members) -> float:
    """The median number of data flows a member sends on in the group (channels x QPs)."""
    f = np.asarray(flows, dtype=np.int64)
    src = ctx.nodes.src[f]
    return float(median([int((src == m).sum()) for m in members])) if len(f) else 1.0


#: at most this many consecutive bursts merge into one iteration (_merge_bursts)
MERGE_BURSTS = 8


def _merge_bursts(cs, cr) -> np.ndarray:
    """Indices of the bursts that start an iteration when unaligned bursts (members' sent /
    received message counts cs, cr [burst, member] unequal) are merged with the following
    ones: from each unaligned burst, the smallest run of <= MERGE_BURSTS bursts whose summed
    counts are equal over the members (and > 0) is one iteration; a burst that aligns with
    no such run stays on its own (left out as before)."""
    ni = len(cs)
    out = []
    i = 0
    while i < ni:
        out.append(i)
        a = cs[i].copy()
        b = cr[i].copy()
        j = i
        while not (a[0] > 0 and (a == a[0]).all() and (b == a[0]).all()) and j + 1 < min(ni, i + MERGE_BURSTS):
            j += 1
            a += cs[j]
            b += cr[j]
        if a[0] > 0 and (a == a[0]).all() and (b == a[0]).all():
            i = j + 1
        else:
            i += 1
    return np.asarray(out, dtype=np.int64)


def _center(raw):
    """A step's reference wait over the members (axis 1): their median; with two members the
    earlier one (a median of two is their midpoint: the late member would show half its lag)."""
    if raw.shape[1] == 2:
        return raw.min(axis=1)
    if raw.ndim == 3 and raw.dtype == np.float64 and raw.shape[1] > 0 and raw.size:
        return median_axis1(raw)                 # np.median(raw, axis=1), the same values
    return median(raw, axis=1)


def _spread(x) -> float:
    """1.4826 x MAD (a standard deviation robust to the outliers we look for)."""
    x = np.asarray(x, dtype=np.float64)
    if not len(x):
        return 0.0
    return 1.4826 * float(median(np.abs(x - median(x))))


def member_summary(steps: dict, m: int, cols=None) -> dict:
    """A member's step numbers: steps it was last in (count, share of the waited steps:
    those with a last member or where any member waited >= 1 us; continuation messages
    sent back to back by everyone are not steps of their own), its median lag in them (ns), its lost time per iteration (ns, median over the
    aligned iterations) and the iterations it gated. cols: a bool mask of the step columns
    to count (a segment of the capture: onset), default all; the iterations are then those
    the segment's steps belong to."""
    last = steps["last"]
    if cols is None:
        with_last, its = _all_columns(steps)[:2]
        mine = last == m
    else:
        sel = np.asarray(cols, dtype=bool)
        mine = (last == m) & sel
        with_last = int((((last >= 0) | steps["waited"]) & sel).sum())
        # the iterations of the selected columns ("iterations" holds every column's, sorted)
        its = np.zeros(len(steps["iterations"]), dtype=bool)
        its[np.searchsorted(steps["iterations"], steps["col_iteration"][sel])] = True
    lag = steps["lag_ns"][m, mine]
    lost = steps["lost_ns"][its, m]
    return {"last_steps": int(mine.sum()), "steps_with_last": with_last,
            "last_share": float(mine.sum()) / with_last if with_last else 0.0,
            "lag_ns": float(median(lag)) if len(lag) else 0.0,
            "lost_per_iteration_ns": float(median(lost)) if len(lost) else 0.0,
            "steps_per_iteration": float(mine.sum()) / max(1, int(its.sum())),
            "gated": int((steps["gates"][its] == m).sum())}


#: onset: outside a member's slow segment, at most this share of the waited steps may have it
#: last by the lag bar for that part to count as healthy (a change point, not noise)
HEALTHY_SHARE = 0.25
#: onset: a slow segment that neither starts nor ends with the data spans at least this many
#: iterations (tokens) -- one late iteration is a rotating straggler's gate, not an episode --
#: unless no other iteration has a gate (the ring was healthy but for it)
MIN_EPISODE_ITERATIONS = 2


def _all_columns(steps: dict):
    """The member-independent part of member_summary over every column (waited steps, the
    iterations' mask) and slow_segment's waited columns, once per matrix (persistent asks
    for every member): (with_last, its, waited, W)."""
    got = steps.get("_all_columns")
    if got is None:
        waited = (steps["last"] >= 0) | steps["waited"]
        its = np.zeros(len(steps["iterations"]), dtype=bool)
        its[np.searchsorted(steps["iterations"], steps["col_iteration"])] = True
        got = steps["_all_columns"] = (int(waited.sum()), its, waited, np.nonzero(waited)[0])
    return got


def member_jitter(steps: dict, m: int, min_steps: int = 8) -> float:
    """The step jitter a member's lags are judged against: of two members, the spread of
    their step gaps over the steps (inside collectives) where m was not the last -- a member
    slow for part of the capture would otherwise widen the spread with its own lags (half
    the gaps 0, half its lag); with fewer such steps than max(4, min_steps / 2), or more
    than two members (its lags are 1/n of the values), the group's step jitter."""
    if steps["lag_ns"].shape[0] != 2:
        return steps["jitter_ns"]
    gap = steps["lag_ns"].max(axis=0)
    need = max(4, min_steps // 2)
    sel = ~steps["collective_start"] & (steps["last"] != m)
    if int(sel.sum()) < need:
        sel = steps["last"] != m             # a 2-rank ring has few steps inside collectives
        if int(sel.sum()) < need:
            return steps["jitter_ns"]
    return _spread(gap[sel])


def _best_segment(z, p):
    """(a, b) inclusive bounds of the contiguous run of z (0/1) maximising sum(z - p)
    (the CUSUM segment of an elevated rate; maximum subarray by prefix sums), or None when
    no run scores > 0."""
    if not len(z):
        return None
    a, b = _best_segment_kernel(np.ascontiguousarray(z, dtype=np.float64), float(p))
    return None if a < 0 else (int(a), int(b))


@njit(cache=True, nogil=True)
def _best_segment_kernel(z, p):
    """_best_segment in one pass (it runs for every member of a ring: ~10k steps each): the
    prefix sums c (c[0] = 0, c[i + 1] = c[i] + (z[i] - p), np.cumsum's order), the best end b
    (first largest c[b + 1] - min(c[:b + 1])) and the first prefix a reaching that minimum;
    (-1, -1) when no run scores > 0."""
    n = z.shape[0]
    c = 0.0
    lo = 0.0                       # min of c[0..i]
    lo_at = 0                      # its first index
    best = -np.inf
    a = 0
    b = 0
    for i in range(n):
        c = z[i] - p if i == 0 else c + (z[i] - p)
        g = c - lo
        if g > best:
            best = g
            b = i
            a = lo_at
        if c < lo:
            lo = c
            lo_at = i + 1
    if best <= 0:
        return -1, -1
    return a, b


def _gated_elsewhere(steps: dict, its_in) -> bool:
    """Some iteration outside its_in has a gate (a member that held it up): the ring's gate
    moves, so one slow iteration is a rotating gate, not an episode of its own."""
    out = ~np.isin(steps["iterations"], its_in)
    return bool((steps["gates"][out] >= 0).any())


def _passes(s: dict, th: dict, bar: float) -> bool:
    return s["last_steps"] >= th["min_steps"] and s["last_share"] >= th["last_share"] and s["lag_ns"] >= bar


def _steps_per_iteration(steps: dict) -> float:
    """The median step columns per iteration (0 for a whole-capture matrix), worked out
    once per matrix (slow_segment asks for every member)."""
    spi = steps.get("_spi")
    if spi is None:
        col_it = steps["col_iteration"]
        spi = float(median(np.bincount(col_it - col_it.min()))) if len(col_it) and not steps.get(
            "whole_capture") else 0.0
        steps["_spi"] = spi
    return spi


def slow_segment(steps: dict, th: dict, m: int, min_lag_ns: float | None = None):
    """The member's slow stretch: (member_summary over it, since_ns, until_ns or None), or
    None. A change point on the member's per-step series: z = it is the step's last member by
    a lag >= the bar (max(min_lag, lag_jitter x step jitter)), over the waited steps; the run
    with the largest excess of z over `last_share` (Kadane) is the candidate. A side before
    (after) it counts as healthy -- the condition began (ended) there -- when it has
    >= max(4, min_steps / 2, half an iteration) steps and z in <= HEALTHY_SHARE of its waited ones;
    otherwise the stretch extends to that edge of the data. The stretch then has to pass the
    persistent criteria (>= min_steps last, share >= last_share, median lag >= the bar), and
    one with a healthy side has to span >= MIN_EPISODE_ITERATIONS iterations, or be the only
    gated iteration(s) of the capture. since_ns: the
    start of its first step (of the data's first step without a healthy side before);
    until_ns: the start of the first step after it, None while it still holds at the end;
    the summary's "began": a healthy side before it (an onset inside the capture)."""
    lag, last = steps["lag_ns"], steps["last"]
    ncol = lag.shape[1]
    if not ncol:
        return None
    floor = th["min_lag_s"] * 1e9 if min_lag_ns is None else min_lag_ns
    jit = member_jitter(steps, m, th["min_steps"])
    bar = max(floor, th["lag_jitter"] * jit)
    waited, W = _all_columns(steps)[2:]
    z = ((last == m) & (lag[m] >= bar)).astype(np.float64)
    col_it = steps["col_iteration"]
    spi = _steps_per_iteration(steps)
    side_min = max(4.0, float(th["min_steps"]) // 2, 0.5 * spi)

    def healthy(cols):
        if len(cols) < side_min:
            return False
        w = cols[waited[cols]]
        return not len(w) or float(z[w].mean()) <= HEALTHY_SHARE
    seg = _best_segment(z[W], float(th["last_share"])) if len(W) else None
    if seg is not None:
        c0, c1 = int(W[seg[0]]), int(W[seg[1]])
        h0, h1 = healthy(np.arange(0, c0)), healthy(np.arange(c1 + 1, ncol))
        a = c0 if h0 else 0
        b = c1 if h1 else ncol - 1
        sel = np.zeros(ncol, dtype=bool)
        sel[a:b + 1] = True
        s = member_summary(steps, m, sel)
        hit = (last == m) & sel & (lag[m] >= bar)
        its_in = unique(col_it[hit])
        if _passes(s, th, bar) and (not (h0 or h1) or len(its_in) >= MIN_EPISODE_ITERATIONS
                                    or not _gated_elsewhere(steps, its_in)):
            s["began"] = bool(h0)
            s["jitter_ns"] = jit
            return s, float(steps["col_start_ns"][a]), (float(steps["col_start_ns"][b + 1]) if h1 else None)
    s = member_summary(steps, m)
    if _passes(s, th, bar):
        s["began"] = False
        s["jitter_ns"] = jit
        return s, float(steps["col_start_ns"][0]), None
    return None


def start_lag_onset(dev, starts, thr_ns, min_side: int = 2) -> dict | None:
    """Onset of a member's start lag over the iterations (bursts): dev = its lateness per
    burst (ns, NaN unknown), starts = the bursts' starts; z = dev >= thr_ns. The run with the
    largest excess of z over 1/2 (_best_segment); a side with >= min_side bursts and z in
    <= HEALTHY_SHARE of them is healthy (the lag began / ended there). {"since_ns",
    "until_ns", "began"} or None when z never holds."""
    dev = np.asarray(dev, dtype=np.float64)
    z = (np.nan_to_num(dev, nan=-np.inf) >= thr_ns).astype(np.float64)
    seg = _best_segment(z, 0.5)
    if seg is None or not len(starts):
        return None
    a, b = seg

    def healthy(part):
        return len(part) >= min_side and float(part.mean()) <= HEALTHY_SHARE
    h0, h1 = healthy(z[:a]), healthy(z[b + 1:])
    if (h0 or h1) and b - a + 1 < MIN_EPISODE_ITERATIONS:
        h0 = h1 = False
    return {"since_ns": float(starts[a] if h0 else starts[0]),
            "until_ns": float(starts[b + 1]) if h1 else None, "began": bool(h0)}


def persistent(steps: dict, th: dict, nm: int, min_lag_ns: float | None = None, skip=()):
    """(member index, member_summary with "since_ns" / "until_ns") of the member that is last
    in most steps of its slow stretch (slow_segment: the whole capture, or from an onset /
    up to a recovery) with a lag well above the step jitter, or None. th: a ring_straggler /
    slow_tp_shard section (min_lag_s, lag_jitter, last_share, min_steps); min_lag_ns
    overrides min_lag_s; skip: member indices not to blame (their messages are seen late for
    another reason: a shared downlink at their successor)."""
    best = None
    for m in range(nm):
        if m in skip:
            continue
        got = slow_segment(steps, th, m, min_lag_ns)
        if got is None:
            continue
        s, since, until = got
        s = dict(s, since_ns=since, until_ns=until)
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
    p = float(median(d))
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
        regular = its is not None
        if its is None:
            its = dt.get("token_bursts")          # token bursts without a regular period
        if its is None and dt.get("bursts_start") is not None and len(dt["bursts_start"]):
            its = dt["bursts_start"]              # no token level: its collectives
        coll = hierarchy_level(dt.get("bursts_start", ()))
    else:
        its, mask = tinfo.get("bursts_start"), None
        coll = None
        regular = True
    it_level = {"period_s": r.get("period_s"), "jitter_s": r.get("period_jitter_s"),
                "count": int(r.get("iterations") or 0)}
    steps = None
    if g.kind == "ring_allreduce" and its is not None:
        steps = ring_steps(ctx, g.flows, g.members, its, ev_mask=mask)
        if steps is not None:
            steps["regular_tokens"] = regular
    step_level = {"period_s": None, "jitter_s": None, "count": 0}
    if steps is not None:
        t = steps["col_start_ns"]
        same = steps["col_iteration"][1:] == steps["col_iteration"][:-1]
        inner = ~steps["collective_start"][1:] & same
        d = np.diff(t)[inner]
        step_level = {"period_s": None, "jitter_s": None, "count": steps["steps"]}
        if len(d):
            p = float(median(d))
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
                                for m in unique(gated)},
                      "step_jitter_s": steps["jitter_ns"] / 1e9}
    r["hierarchy"] = {"step": step_level, "collective": coll or dict(it_level), "iteration": it_level}
    return steps
