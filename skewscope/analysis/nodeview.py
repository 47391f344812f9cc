"""Per-node timing from ONE DPU's view (one DPU per node, no clock sync). Definitions:
docs/metrics.md "Per-node timing (one DPU per node)".

Input: a Snapshot of the traffic of one node (frames whose source or destination is the
node) and that node's IP (given, or inferred: the one address that is an end of every data
flow). Every number below is a difference of two timestamps of this Snapshot, i.e. of the
same DPU clock; nothing is compared with another DPU's timestamps.

Groups the node takes part in, from its own data flows (analysis.flows roles):

* one-way pairs (data with no clear-to-send writes coming back): ``kv_transfer``;
* peers the node both sends data to and receives data from (>= 2 of them): ``alltoall``;
* exactly one peer that only sends to the node (upstream) and one it only sends to
  (downstream): a ring member, ``tp_decode`` when its messages are small (mean below
  analysis.fleet.BULK_MIN_MESSAGE) and there are >= DECODE_MIN_COLLECTIVES collectives
  per iteration, else ``ring``; one peer both ways that is a 2-rank all-reduce (>= 256 KiB
  slices, or LL steps that answer each other: analysis.collectives.pair_allreduce): the
  same, with the peer as both upstream and downstream.

Iterations (tokens) are the bursts of the group's activity on this node
(timing.bursts_and_period: the first natural break whose bursts repeat regularly, else
the bursts that carry one message count). Within an
iteration the j-th message the node sends and the j-th it receives from its upstream are
the same ring step (as in analysis.steps); channels with one flow each way are lanes
paired by the order of their first message.

* arrival offset (ring, step j): start of received message j minus start of sent
  message j; alltoall: per collective, the first message from each peer minus the node's
  own first send of the collective.
* start offset: the arrival offset of the first step of each collective only (a node
  that starts a collective late has a negative one: its upstream's data was there first).
* forward latency (ring, step j >= 1): start of sent message j minus ready time, ready =
  the later of the end of sent message j-1 and the end of received message j-1 (when that
  one ended before the send; else the last receive that did), floored at 0. A send whose
  wait is > BOUNDARY_FACTOR x the node's median and > median + 1 us starts a collective
  (the node waited for compute) and is not a step.
* own lag (ring, step j >= 1 inside a collective): min(forward latency, -arrival offset),
  floored at 0: how much later than both its data-flow readiness and its upstream's same
  step the node sent step j. A node that lags on its own has it under either step timing
  (data flow: forward latency = its lag; barrier-synchronised steps: it sends its lag after
  the upstream's same step); a healthy node waiting for a barrier (long forward latency,
  arrival offset ~0) or forwarding late upstream data (arrival offset > 0) has ~0.
* step duration: start of sent message j minus start of sent message j-1, within a
  collective.
* collective: from a collective's first send to the last end of a message of the lane
  (sent or received) before the next one; alltoall: the bursts of the iteration at its
  lowest natural break; kv_transfer: a pair's messages split at their natural break.
* iteration (token) duration: start-to-start of consecutive iterations (compute gap
  included); decode: ITL p50/p99/max and tokens/s = (iterations - 1) / (last start -
  first start).
"""
from __future__ import annotations

import ipaddress

import numpy as np

from skewscope.analysis import flows as FL
from skewscope.analysis.collectives import background_flows
from skewscope.analysis.context import context
from skewscope.analysis.fleet import BULK_MIN_MESSAGE
from skewscope.analysis.intervals import break_candidates, merge_sorted
from skewscope.analysis.stats import median, percentile, unique
from skewscope.analysis.timing import BREAK_RATIO, MIN_GAP_NS, bursts_and_period, split_bursts
from skewscope.core.errors import EXIT_USAGE, SkewscopeError
from skewscope.core.jit import njit
from skewscope.core.snapshot import Snapshot

#: a wait this many times the node's median forward latency starts a collective
BOUNDARY_FACTOR = 4.0
#: ... and at least this much above the median (ns): timestamp resolution
BOUNDARY_FLOOR_NS = 1000.0
#: a long wait with the upstream's same step in for this share of it is the node's own lag
SAT_SHARE = 0.5
#: a ring member is tp_decode with at least this many collectives per iteration
DECODE_MIN_COLLECTIVES = 4
ROLES = ("ring", "tp_decode", "alltoall", "kv_transfer")


class NodeViewError(SkewscopeError):
    """A given node IP that is not an IP address or not in the capture (exit 2)."""

    def __init__(self, msg: str):
        super().__init__(msg, EXIT_USAGE)


# ---- kernels ---------------------------------------------------------------------------
@njit(cache=True, nogil=True)
def ring_lane(s_start, s_end, s_it, r_start, r_end, r_it, n_it):
    """Per sent message of one lane (sorted by start; iteration index per message):
    offset (received j - sent j, start to start), wait (forward latency before send j),
    step (send j - send j-1), aligned (the iteration has as many sends as receives).
    NaN where undefined (first message of an iteration, unaligned iterations)."""
    ns = s_start.shape[0]
    off = np.full(ns, np.nan)
    wait = np.full(ns, np.nan)
    step = np.full(ns, np.nan)
    aligned = np.zeros(ns, dtype=np.bool_)
    a = 0
    b = 0
    nr = r_start.shape[0]
    for it in range(n_it):
        a0 = a
        while a < ns and s_it[a] == it:
            a += 1
        b0 = b
        while b < nr and r_it[b] == it:
            b += 1
        k = a - a0
        if k == 0 or k != b - b0:
            continue
        for j in range(k):
            i = a0 + j
            aligned[i] = True
            off[i] = r_start[b0 + j] - s_start[i]
            if j == 0:
                continue
            t = s_start[i]
            rdy = s_end[i - 1]
            rv = r_end[b0 + j - 1]
            if rv > t:  # not in yet: the last receive that was
                rv = -1.0
                for q in range(b0 + j - 2, b0 - 1, -1):
                    if r_end[q] <= t:
                        rv = r_end[q]
                        break
            if rv > rdy:
                rdy = rv
            w = t - rdy
            wait[i] = w if w > 0.0 else 0.0
            step[i] = t - s_start[i - 1]
    return off, wait, step, aligned


@njit(cache=True, nogil=True)
def collective_spans(s_start, s_it, coll_id, n_coll, ev_start, ev_end, ev_it):
    """(start, end) of each collective: its first send, and the last end of a message
    (ev, sorted by start) of the same iteration that starts before the next collective's
    first send."""
    st = np.full(n_coll, np.nan)
    en = np.full(n_coll, np.nan)
    cit = np.full(n_coll, -1, dtype=np.int64)
    for i in range(s_start.shape[0]):
        c = coll_id[i]
        if c >= 0 and np.isnan(st[c]):
            st[c] = s_start[i]
            cit[c] = s_it[i]
    c = -1
    for i in range(ev_start.shape[0]):
        while c + 1 < n_coll and ev_start[i] >= st[c + 1]:
            c += 1
        if c >= 0 and ev_it[i] == cit[c]:
            if np.isnan(en[c]) or ev_end[i] > en[c]:
                en[c] = ev_end[i]
    return st, en


# ---- helpers ---------------------------------------------------------------------------
def summary(x) -> dict:
    """{"count", "p50", "p99", "max", "mean"} of a sample (seconds from ns); nulls if empty."""
    x = np.asarray(x, dtype=np.float64)
    x = x[np.isfinite(x)]
    if not len(x):
        return {"count": 0, "p50": None, "p99": None, "max": None, "mean": None}
    return {"count": int(len(x)), "p50": float(percentile(x, 50)) / 1e9,
            "p99": float(percentile(x, 99)) / 1e9, "max": float(x.max()) / 1e9,
            "mean": float(x.mean()) / 1e9}


def _iterations(s, e):
    """Iteration (token) starts of a set of intervals sorted by start."""
    if not len(s):
        return np.zeros(0)
    a, b, c = merge_sorted(np.ascontiguousarray(s), np.ascontiguousarray(e), 0.0)
    return bursts_and_period(a, b, c)[0]


def _modal_per_burst(bs, ss) -> int:
    i = np.searchsorted(bs, ss, side="right") - 1
    i = i[i >= 0]
    return int(np.bincount(np.bincount(i)).argmax()) if len(i) else 0


def _aligned_share(bs, ss, rs) -> float:
    """Share of the bursts with a send of the lane that hold as many of its receives."""
    n = len(bs)
    cs = np.bincount(np.clip(np.searchsorted(bs, ss, side="right") - 1, 0, None), minlength=n)
    cr = np.bincount(np.clip(np.searchsorted(bs, rs, side="right") - 1, 0, None), minlength=n)
    used = cs > 0
    return float((cs[used] == cr[used]).mean()) if used.any() else 0.0


def _opened_by_one_side(bs, ss, se, rs, re_, s, e) -> bool:
    """Most bursts (>= 80 %) are opened by one side -- the node's send or its upstream's --
    whose first message ends before the other side's first starts, that late by >= 0.4 of
    the burst: bursts cut inside a lag much longer than a step (one member's step and the
    answer to it), not collectives, which every member starts together."""
    if len(bs) < 4:
        return False
    n = len(bs)
    bi = np.searchsorted(bs, s, side="right") - 1
    ok = bi >= 0
    end = np.full(n, -np.inf)
    np.maximum.at(end, bi[ok], e[ok])

    def firsts(x, y):
        i = np.searchsorted(bs, x, side="right") - 1
        fs, fe = np.full(n, np.nan), np.full(n, np.nan)
        k = i >= 0
        o = np.nonzero(k)[0]
        o = o[np.argsort(x[o], kind="stable")[::-1]]   # the first of each burst wins (written last)
        fs[i[o]], fe[i[o]] = x[o], y[o]
        return fs, fe

    a, ae = firsts(ss, se)
    b, be = firsts(rs, re_)
    both = np.isfinite(a) & np.isfinite(b)
    if both.sum() < 4:
        return False
    dur = np.maximum(end - bs, 1.0)
    lead = np.where(a <= b, (b >= ae) & (b - bs >= 0.4 * dur), (a >= be) & (a - bs >= 0.4 * dur))
    return float(lead[both].mean()) >= 0.8


def _ring_iterations(s, e, ss, se, rs, re_):
    """Iteration starts of a ring member (_iterations of its send and receive intervals s,
    e) where an iteration holds >= 2 sends of a lane (ss, rs: one lane's send and receive
    starts, se, re_ their ends) and as many receives, not opened by one side: a ring collective has >= 2 steps per member, each answered
    by one from its upstream, so bursts of one send each, or that split a step from its
    upstream's, are the member's own lag (longer than the token gap), not iterations. Then
    the next natural break up that holds them, else one iteration (steps matched in order)."""
    its = _iterations(s, e)

    def fits(bs):
        return len(bs) >= 1 and _modal_per_burst(bs, ss) >= 2 and _aligned_share(bs, ss, rs) >= 0.5 \
            and not _opened_by_one_side(bs, ss, se, rs, re_, s, e)

    if len(ss) < 4 or fits(its):
        return its
    a, b, _ = merge_sorted(np.ascontiguousarray(s), np.ascontiguousarray(e), 0.0)
    for thr in sorted(break_candidates(a[1:] - b[:-1], BREAK_RATIO, MIN_GAP_NS)):
        bs = merge_sorted(np.ascontiguousarray(s), np.ascontiguousarray(e), float(thr))[0]
        if len(bs) >= 2 and fits(bs):
            return bs
    return s[:1].astype(np.float64)


def infer_node(ctx) -> int | None:
    """The node index that is an end of every data flow (None: none or ambiguous)."""
    d = np.nonzero(ctx.data)[0]
    if not len(d) or ctx.nodes.n < 2:
        return None
    src, dst = ctx.nodes.src[d], ctx.nodes.dst[d]
    cand = None
    for x in (int(src[0]), int(dst[0])):
        if np.all((src == x) | (dst == x)):
            if cand is not None:  # a single pair: either end could be the node
                return None
            cand = x
    return cand


def resolve_node(ctx, ip: str | None):
    """(node index or None, "given" | "inferred" | None)."""
    if ip is None:
        n = infer_node(ctx)
        return n, ("inferred" if n is not None else None)
    try:
        a = ipaddress.ip_address(str(ip)).compressed
    except ValueError:
        raise NodeViewError(f"--node-ip {ip!r} is not an IP address") from None
    if a not in ctx.nodes.ips:
        raise NodeViewError(f"node {a} is not an address of this capture")
    return ctx.nodes.ips.index(a), "given"


def _one_way_pairs(ctx, data_idx):
    """Directed (src, dst) node pairs among data flows with no CTS flow coming back."""
    nn = max(1, ctx.nodes.n)
    cts = ctx.roles == FL.ROLE_CTS
    back = set((ctx.nodes.dst[cts].astype(np.int64) * nn + ctx.nodes.src[cts]).tolist())
    keys = ctx.nodes.src[data_idx].astype(np.int64) * nn + ctx.nodes.dst[data_idx]
    return np.array([k not in back for k in keys.tolist()], dtype=bool)


def _lanes(ctx, send_f, recv_f):
    """[(send flows, recv flows)]: one lane per channel when both sides have as many
    flows (paired by the order of their first message), else one lane of everything."""
    if len(send_f) == len(recv_f) and len(send_f) > 1:
        ft = ctx.cols["first_ts"]
        so = send_f[np.argsort(ft[send_f], kind="stable")]
        ro = recv_f[np.argsort(ft[recv_f], kind="stable")]
        return [(np.array([a]), np.array([b])) for a, b in zip(so, ro)]
    return [(send_f, recv_f)]


def _times(ctx):
    """(start, end) of every record in ns since the capture's first record start, as
    float64: exact (Context.ev_start/ev_end are epoch ns in float64, a 256 ns grid at
    today's epoch, and its packet-time estimate comes from them). start = first packet's
    timestamp, end = last packet's: only this DPU's own timestamps."""
    t = getattr(ctx, "_nodeview_times", None)
    if t is None:
        ev = ctx.events
        st = ev["start_ts"].astype(np.int64)
        base = int(st.min()) if len(st) else 0
        t = ((st - base).astype(np.float64), (ev["end_ts"].astype(np.int64) - base).astype(np.float64))
        ctx._nodeview_times = t
        ctx._nodeview_base = base
    return t


def _abs(ctx, t) -> np.ndarray:
    """Times of _times (ns since the first record, float64) as the DPU's own int64 ns."""
    _times(ctx)
    return np.asarray(t, dtype=np.float64).astype(np.int64) + int(ctx._nodeview_base)


def _events_of(ctx, flows):
    idx = np.nonzero(ctx.data_events(flows))[0]
    st, en = _times(ctx)
    return st[idx], en[idx], ctx.ev_flow[idx]


def _iter_stats(its) -> dict:
    d = np.diff(np.asarray(its, dtype=np.float64))
    out = {"iteration_s": summary(d), "iterations": int(len(its))}
    span = float(its[-1] - its[0]) if len(its) >= 2 else 0.0
    out["per_s"] = (len(its) - 1) / (span / 1e9) if span > 0 else None
    return out, d


# ---- groups ----------------------------------------------------------------------------
def _ring(ctx, node, send_f, recv_f, up, down):
    ips = ctx.nodes.ips
    s_all, e_all, _ = _events_of(ctx, np.concatenate([send_f, recv_f]))
    lane0 = _lanes(ctx, send_f, recv_f)[0]
    its = _ring_iterations(s_all, e_all, *_events_of(ctx, lane0[0])[:2], *_events_of(ctx, lane0[1])[:2])
    offs, waits, steps, first, coll_t, start_offs, own, own_off = [], [], [], [], [], [], [], []
    t_offs, t_soffs, t_in = [], [], []
    lane_parts = []
    for sf, rf in _lanes(ctx, send_f, recv_f):
        ss, se, _ = _events_of(ctx, sf)
        rs, re_, _ = _events_of(ctx, rf)
        si = np.searchsorted(its, ss, side="right") - 1
        ri = np.searchsorted(its, rs, side="right") - 1
        ks, kr = si >= 0, ri >= 0
        ss, se, si, rs, re_, ri = ss[ks], se[ks], si[ks], rs[kr], re_[kr], ri[kr]
        off, wait, step, al = ring_lane(ss, se, si.astype(np.int64), rs, re_, ri.astype(np.int64), len(its))
        lane_parts.append((ss, se, si, rs, re_, ri, off, wait, step, al))
        waits.append(wait[np.isfinite(wait)])
    w_all = np.concatenate(waits) if waits else np.zeros(0)
    med = float(median(w_all)) if len(w_all) else 0.0
    bar = max(BOUNDARY_FACTOR * med, med + BOUNDARY_FLOOR_NS)
    period = collective_period(lane_parts)
    n_coll = 0
    coll_dur = []
    for ss, se, si, rs, re_, ri, off, wait, step, al in lane_parts:
        # a send after an iteration start starts a collective; inside an iteration, every
        # period-th send (collective_period) or, without one, a long wait
        newit = np.ones(len(ss), dtype=bool)
        newit[1:] = si[1:] != si[:-1]
        # a boundary's long wait that the node spent sitting on its upstream's same step
        # (_sat) is (also) a lag of its own: a member slower than its step (under either step
        # timing) or starting its collective late; its own lag is read there too
        sat = _sat(off, wait)
        if period:
            j = np.arange(len(ss)) - np.maximum.accumulate(np.where(newit, np.arange(len(ss)), 0))
            bound = newit | (j % period == 0)
        else:
            bound = newit | (np.nan_to_num(wait, nan=0.0) > bar)
        inside = al & ~(bound & ~(sat & ~newit))
        offs.append(off[al])
        start_offs.append(off[al & bound])
        t_offs.append(ss[al])
        t_soffs.append(ss[al & bound])
        t_in.append(ss[inside])
        first.append(wait[inside])
        # own lag: the step's send after both its data-flow readiness (forward latency) and
        # the upstream's same step (arrival offset < 0): a delay of the node's own
        with np.errstate(invalid="ignore"):
            own.append(np.maximum(np.minimum(wait[inside], -off[inside]), 0.0))
        own_off.append(off[inside])
        steps.append(step[inside])
        cid = np.cumsum(bound) - 1
        nc = int(bound.sum())
        ev_s = np.concatenate([ss, rs])
        ev_e = np.concatenate([se, re_])
        ev_i = np.concatenate([si, ri]).astype(np.int64)
        o = np.argsort(ev_s, kind="stable")
        cs, ce = collective_spans(ss, si.astype(np.int64), cid.astype(np.int64), nc, ev_s[o], ev_e[o], ev_i[o])
        # the last collective of each iteration ends at that iteration's last message
        coll_dur.append(ce - cs)
        n_coll = max(n_coll, nc)
        coll_t.append(cs)
    off = np.concatenate(offs) if offs else np.zeros(0)
    s_off = np.concatenate(start_offs) if start_offs else np.zeros(0)
    fwd = np.concatenate(first) if first else np.zeros(0)
    own_lag = np.concatenate(own) if own else np.zeros(0)
    step_off = np.concatenate(own_off) if own_off else np.zeros(0)
    stp = np.concatenate(steps) if steps else np.zeros(0)
    cd = np.concatenate(coll_dur) if coll_dur else np.zeros(0)
    ct = np.concatenate(coll_t) if coll_t else np.zeros(0)
    cat = lambda xs: np.concatenate(xs) if xs else np.zeros(0)  # noqa: E731
    t_off, t_soff, t_step = cat(t_offs), cat(t_soffs), cat(t_in)
    it, itd = _iter_stats(its)
    per_iter = n_coll / max(1, len(its))
    mean_msg = float(ctx.cols["msg_bytes"][send_f].sum()) / max(1.0, float(ctx.cols["messages"][send_f].sum()))
    role = "tp_decode" if (mean_msg < BULK_MIN_MESSAGE and per_iter >= DECODE_MIN_COLLECTIVES) else "ring"
    g = {"role": role, "upstream": [ips[up]], "downstream": [ips[down]],
         "lanes": len(lane_parts), "flows": int(len(send_f) + len(recv_f)),
         "iterations": it["iterations"], "collectives": int(n_coll), "steps": int(len(fwd)),
         "forward_latency_s": summary(fwd), "own_lag_s": summary(own_lag), "arrival_offset_s": {ips[up]: summary(off)},
         "start_offset_s": {ips[up]: summary(s_off)},
         "step_s": summary(stp), "collective_s": summary(cd), "iteration_s": it["iteration_s"],
         "mean_message_bytes": mean_msg, "decode": None}
    if role == "tp_decode":
        g["decode"] = _decode(it)
    g["_samples"] = {"forward_latency": fwd, "own_lag": own_lag, "step_offset": step_off,
                     "arrival_offset": {ips[up]: off[np.isfinite(off)]},
                     "start_offset": {ips[up]: s_off[np.isfinite(s_off)]},
                     "step": stp, "collective": cd[np.isfinite(cd)], "iteration": itd}
    # each sample's time (its send's start, the collective's / iteration's start; the
    # DPU's own ns): the live exporter's window counts each step / iteration once
    n_lane = int(np.argmax([len(c) for c in coll_t])) if coll_t else 0
    g["_samples"]["_times"] = {
        "forward_latency": _abs(ctx, t_step), "own_lag": _abs(ctx, t_step), "step": _abs(ctx, t_step),
        "arrival_offset": {ips[up]: _abs(ctx, t_off[np.isfinite(off)])},
        "start_offset": {ips[up]: _abs(ctx, t_soff[np.isfinite(s_off)])},
        "collective": _abs(ctx, ct[np.isfinite(cd)]), "iteration": _abs(ctx, its[:-1]),
        "steps": _abs(ctx, t_step), "collectives": _abs(ctx, coll_t[n_lane] if coll_t else ct),
        "iterations": _abs(ctx, its)}
    return g


def _sat(off, wait) -> np.ndarray:
    """Sends whose wait (forward latency) the node spent with its upstream's same step
    already in for >= SAT_SHARE of it: a lag of the node's own, not a collective boundary
    (at a boundary every member computed; the upstream's next step is not long in)."""
    w = np.nan_to_num(wait, nan=0.0)
    return (w > 0) & (np.nan_to_num(-off, nan=0.0) >= SAT_SHARE * w)


def collective_period(lane_parts) -> int | None:
    """Sends per collective inside an iteration, when the iteration holds several: the
    smallest divisor M of the (modal) sends per iteration whose every-M-th send waited
    longer than the others by >= 0.9x the best such contrast and by >= BOUNDARY_FLOOR_NS
    and >= BOUNDARY_FACTOR x the spread (1.4826 MAD) of the other waits; None otherwise."""
    js, ws = [], []
    for ss, se, si, rs, re_, ri, off, wait, step, al in lane_parts:
        if not len(ss):
            continue
        newit = np.ones(len(ss), dtype=bool)
        newit[1:] = si[1:] != si[:-1]
        start_idx = np.maximum.accumulate(np.where(newit, np.arange(len(ss)), 0))
        j = np.arange(len(ss)) - start_idx
        _, cnt = np.unique(si, return_counts=True)
        k = int(np.bincount(cnt).argmax())
        full = np.isin(si, unique(si)[cnt == k]) & al & (j > 0)
        js.append(j[full])
        ws.append(wait[full])
    if not js:
        return None
    j, w = np.concatenate(js), np.concatenate(ws)
    if not len(j):
        return None
    k = int(j.max()) + 1
    best, scores = 0.0, []
    for m in range(2, k):
        if k % m:
            continue
        b = j % m == 0
        if not b.any() or b.all():
            continue
        other = w[~b]
        c = float(median(w[b]) - median(other))
        spread = 1.4826 * float(median(np.abs(other - median(other))))
        bar = max(BOUNDARY_FLOOR_NS, BOUNDARY_FACTOR * spread)
        ok = c >= bar
        scores.append((m, c, ok))
        best = max(best, c)
    for m, c, ok in scores:
        if ok and c >= 0.9 * best:
            return m
    return None


def _decode(it) -> dict:
    s = it["iteration_s"]
    return {"tokens": it["iterations"], "itl_p50_s": s["p50"], "itl_p99_s": s["p99"],
            "itl_max_s": s["max"], "tokens_per_s": it["per_s"]}


def _alltoall(ctx, node, flows, peers):
    ips = ctx.nodes.ips
    s_all, e_all, f_all = _events_of(ctx, flows)
    its = _iterations(s_all, e_all)
    a, b, _ = merge_sorted(np.ascontiguousarray(s_all), np.ascontiguousarray(e_all), 0.0)
    cs, ce, _ = split_bursts(a, b, level="collective") if len(a) else (np.zeros(0), np.zeros(0), 0)
    ci = np.searchsorted(cs, s_all, side="right") - 1
    sender = ctx.nodes.src[f_all]
    mine = sender == node
    offs, t_offs = {}, {}
    nc = len(cs)
    own_first = np.full(nc, np.nan)
    for c, t in zip(ci[mine], s_all[mine]):
        if c >= 0 and np.isnan(own_first[c]):
            own_first[c] = t
    for p in peers:
        sel = (sender == p) & (ci >= 0)
        first_p = np.full(nc, np.nan)
        for c, t in zip(ci[sel], s_all[sel]):
            if np.isnan(first_p[c]):
                first_p[c] = t
        d = first_p - own_first
        offs[ips[p]] = d[np.isfinite(d)]
        t_offs[ips[p]] = _abs(ctx, cs[np.isfinite(d)])
    it, itd = _iter_stats(its)
    per_iter = nc / max(1, len(its))
    mean_msg = float(ctx.cols["msg_bytes"][flows].sum()) / max(1.0, float(ctx.cols["messages"][flows].sum()))
    g = {"role": "alltoall", "upstream": [ips[p] for p in peers], "downstream": [ips[p] for p in peers],
         "lanes": 1, "flows": int(len(flows)), "iterations": it["iterations"], "collectives": int(nc),
         "steps": int(sum(len(v) for v in offs.values())),
         "forward_latency_s": summary([]), "own_lag_s": summary([]),
         "arrival_offset_s": {k: summary(v) for k, v in offs.items()},
         "start_offset_s": {k: summary(v) for k, v in offs.items()},
         "step_s": summary([]), "collective_s": summary(ce - cs), "iteration_s": it["iteration_s"],
         "mean_message_bytes": mean_msg, "decode": None}
    if mean_msg < BULK_MIN_MESSAGE and per_iter >= DECODE_MIN_COLLECTIVES:
        g["decode"] = _decode(it)
    g["_samples"] = {"forward_latency": np.zeros(0), "own_lag": np.zeros(0), "arrival_offset": offs,
                     "start_offset": offs,
                     "step": np.zeros(0),
                     "collective": ce - cs, "iteration": itd}
    allt = np.sort(np.concatenate(list(t_offs.values()))) if t_offs else np.zeros(0, np.int64)
    g["_samples"]["_times"] = {"forward_latency": np.zeros(0, np.int64), "own_lag": np.zeros(0, np.int64),
                               "step": np.zeros(0, np.int64),
                               "arrival_offset": t_offs, "start_offset": t_offs,
                               "collective": _abs(ctx, cs), "iteration": _abs(ctx, its[:-1]),
                               "steps": allt, "collectives": _abs(ctx, cs), "iterations": _abs(ctx, its)}
    return g


def _kv(ctx, node, flows):
    ips = ctx.nodes.ips
    s_all, e_all, f_all = _events_of(ctx, flows)
    up = sorted({int(x) for x in ctx.nodes.src[flows]} - {node})
    down = sorted({int(x) for x in ctx.nodes.dst[flows]} - {node})
    durs, starts = [], []
    peer = np.where(ctx.nodes.src[f_all] == node, ctx.nodes.dst[f_all], ctx.nodes.src[f_all])
    for p in unique(peer):
        k = peer == p
        a, b, _ = merge_sorted(np.ascontiguousarray(s_all[k]), np.ascontiguousarray(e_all[k]), 0.0)
        bs, be, _ = split_bursts(a, b, level="collective") if len(a) else (np.zeros(0), np.zeros(0), 0)
        durs.append(be - bs)
        starts.append(bs)
    cd = np.concatenate(durs) if durs else np.zeros(0)
    ct = _abs(ctx, np.concatenate(starts)) if starts else np.zeros(0, np.int64)
    z = summary([])
    g = {"role": "kv_transfer", "upstream": [ips[p] for p in up], "downstream": [ips[p] for p in down],
         "lanes": 1, "flows": int(len(flows)), "iterations": 0, "collectives": int(len(cd)), "steps": 0,
         "forward_latency_s": z, "own_lag_s": z, "arrival_offset_s": {}, "start_offset_s": {}, "step_s": z,
         "collective_s": summary(cd),
         "iteration_s": z, "mean_message_bytes": float(ctx.cols["msg_bytes"][flows].sum())
         / max(1.0, float(ctx.cols["messages"][flows].sum())), "decode": None}
    g["_samples"] = {"forward_latency": np.zeros(0), "own_lag": np.zeros(0), "arrival_offset": {},
                     "start_offset": {}, "step": np.zeros(0), "collective": cd, "iteration": np.zeros(0)}
    z0 = np.zeros(0, np.int64)
    g["_samples"]["_times"] = {"forward_latency": z0, "own_lag": z0, "step": z0, "arrival_offset": {},
                               "start_offset": {},
                               "collective": ct, "iteration": z0, "steps": z0, "collectives": np.sort(ct),
                               "iterations": z0}
    return g


def node_timing(snap, ip: str | None = None, samples: bool = False) -> dict | None:
    """The per-node timing of `ip`'s own view (docs/metrics.md), or None when no node is
    given and none can be inferred. samples=True keeps each group's raw samples (ns) under
    "_samples" (the exporter's histograms). Raises NodeViewError for an unknown ip."""
    ctx = context(snap)
    if len(ctx.flows) == 0:
        if ip is not None:
            raise NodeViewError(f"node {ip} is not an address of this capture")
        return None
    node, how = resolve_node(ctx, ip)
    if node is None:
        return None
    src, dst = ctx.nodes.src, ctx.nodes.dst
    data = np.nonzero(ctx.data & ((src == node) | (dst == node)) & (ctx.cols["messages"] > 0))[0]
    data = data[~background_flows(ctx, data)]       # start-up / barrier traffic (collectives)
    groups = []
    if len(data):
        oneway = _one_way_pairs(ctx, data)
        kv = data[oneway]
        two = data[~oneway]
        out_p = {int(x) for x in dst[two][src[two] == node]}
        in_p = {int(x) for x in src[two][dst[two] == node]}
        both = sorted(out_p & in_p)
        if len(both) >= 2:
            fl = two[np.isin(np.where(src[two] == node, dst[two], src[two]), both)]
            groups.append(_alltoall(ctx, node, fl, both))
        up, down = sorted(in_p - out_p), sorted(out_p - in_p)
        if len(up) == 1 and len(down) == 1:
            sf = two[(src[two] == node) & (dst[two] == down[0])]
            rf = two[(dst[two] == node) & (src[two] == up[0])]
            groups.append(_ring(ctx, node, sf, rf, up[0], down[0]))
        elif len(both) == 1 and not up and not down:
            # one peer both ways: a ring of two (its upstream is its downstream) when the
            # pair is a 2-rank all-reduce, as the whole-capture classification decides it
            from skewscope.analysis.collectives import pair_allreduce  # (not a kernel's import)
            if pair_allreduce(ctx, two, node):
                groups.append(_ring(ctx, node, two[src[two] == node], two[dst[two] == node], both[0], both[0]))
        if len(kv):
            groups.append(_kv(ctx, node, kv))
    if not samples:
        for g in groups:
            g.pop("_samples", None)
    return {"node": ctx.nodes.ips[node], "node_source": how, "groups": groups}


def events_of(ev: np.ndarray, remap: np.ndarray) -> np.ndarray:
    """The message records of the flows `remap` keeps (remap[flow]: the flow's row in the
    sub-view, -1 not kept), their `flow` renumbered: a sub-view's records (view_of, and the
    exporter's known-node view of its timing window)."""
    f = ev["flow"].astype(np.int64)
    ok = (f >= 0) & (f < len(remap))
    ok[ok] &= remap[f[ok]] >= 0
    sub = ev[ok]
    sub["flow"] = remap[f[ok]]
    return sub


def view_of(snap, node: int) -> Snapshot:
    """The Snapshot one DPU on node `node` (an index of context(snap).nodes) would have
    taken: the flows with the node as an end and their message records (a flow-level
    filter is the frame-level one: every frame of a flow has the flow's two ends)."""
    ctx = context(snap)
    keep = np.nonzero((ctx.nodes.src == node) | (ctx.nodes.dst == node))[0]
    remap = np.full(len(ctx.flows) + 1, -1, dtype=np.int64)
    remap[keep] = np.arange(len(keep))
    meta = dict(snap.meta, view=ctx.nodes.ips[node])
    return Snapshot(snap.flows[keep], events_of(snap.events, remap), snap.globals, meta)


def per_node_timing(snap, ip: str | None = None, max_nodes: int = 64, samples: bool = False) -> list:
    """node_timing for the node `ip`, or the inferred node; when there is none (a mirror
    that sees several nodes), for each of the capture's nodes (up to max_nodes) on its own
    sub-view (view_of), as if every node had its DPU. [] when nothing applies."""
    ctx = context(snap)
    if ip is not None or infer_node(ctx) is not None:
        nt = node_timing(snap, ip, samples=samples)
        return [nt] if nt is not None else []
    out = []
    for i in range(min(ctx.nodes.n, max_nodes)):
        nt = node_timing(view_of(snap, i), ctx.nodes.ips[i], samples=samples)
        if nt is not None and nt["groups"]:
            out.append(nt)
    return out
