"""Temporal metrics from message records: activity bursts (collective instances /
iterations), period and jitter, per-member phase offsets, cadence percentiles.
Definitions: docs/metrics.md "Timing".

* activity: union of the on-wire intervals of the data messages of a set of flows.
* bursts: activity split at its natural break: the gaps between activity intervals are
  sorted and cut at the largest ratio between consecutive gaps (>= 3x; gaps under
  1 us never cut). Training: one burst per iteration; inference decode: one per
  collective. When every gap is alike, each gap is a cut.
* period_s: least-squares slope of the burst starts against their iteration index (each
  spacing counts round(spacing / median spacing) periods: robust to drift and to a missing
  iteration); a period only when every start lies within 0.45 period (median 0.15) of
  the fitted grid.
* period_jitter_s: standard deviation of the burst starts around that fitted grid
  (needs >= 3 bursts); period_cv: std / mean of the spacings.
* When bursts cannot be separated (no idle gaps), the period comes from the first
  autocorrelation peak (>= 0.3, at a lag >= 4 median message durations) of the throughput
  series (each message's bytes spread over its on-wire time; bin = span / 65536, >= 1 us);
  jitter is then unknown (null).
* phase offset of a member: per burst, the start of its first data message as a sender
  minus the burst start; the member's start_lag_s is the median over bursts of that minus
  the median over members (with two members: minus the earlier one's).
"""
from __future__ import annotations

import warnings

import numpy as np

from skewscope.analysis.context import context
from skewscope.analysis.intervals import break_candidates, merge_sorted
from skewscope.analysis.stats import bisect_right, median, nanmedian, percentile
from skewscope.core.jit import njit

MIN_GAP_NS = 1000.0       # gaps below 1 us never separate bursts
BREAK_RATIO = 3.0
ACF_MIN = 0.3


def activity(ctx, flow_mask=None, ev_mask=None):
    """Merged busy intervals (start, end, records) of the data messages of the selected flows."""
    ok = ctx.data_mask(flow_mask)
    if ev_mask is not None:
        ok &= ev_mask
    s = ctx.ev_start[ok]
    e = ctx.ev_end[ok]
    if len(s) == 0:
        return np.zeros(0), np.zeros(0), np.zeros(0, np.int64)
    # records are in start order; ends are not, merge handles it
    return merge_sorted(np.ascontiguousarray(s), np.ascontiguousarray(e), 0.0)


def split_bursts(s, e, min_gap=MIN_GAP_NS, ratio=BREAK_RATIO, level="iteration"):
    """Bursts of activity intervals (s, e sorted): (burst starts, burst ends, threshold).
    Among the natural breaks of the gaps (top level first) the first whose bursts repeat
    regularly (fit_period) wins: iterations rather than sub-phases; else the top break.
    level "collective": the lowest break; "top": the top break."""
    if len(s) == 0:
        return np.zeros(0), np.zeros(0), np.inf
    gaps = s[1:] - e[:-1]
    cands = break_candidates(gaps, min_ratio=ratio, floor=min_gap)
    if not cands:
        return np.array([s[0]]), np.array([e.max()]), np.inf
    if level in ("collective", "top"):
        thr = cands[-1] if level == "collective" else cands[0]
        bs, be, _ = merge_sorted(np.ascontiguousarray(s), np.ascontiguousarray(e), float(thr))
        return bs, be, thr
    first = None
    for thr in cands[:8]:
        bs, be, _ = merge_sorted(np.ascontiguousarray(s), np.ascontiguousarray(e), float(thr))
        if first is None:
            first = (bs, be, thr)
        if len(bs) >= 2:
            per, _, _, regular = fit_period(bs)
            if regular and per:
                return bs, be, thr
    return first


#: count_bursts: a level whose bursts carry the same number of messages, for at least this
#: share of the messages ...
COUNT_SHARE = 0.6
#: ... in at least this many bursts
COUNT_MIN_BURSTS = 3
#: number of cuts tried: every count up to COUNT_DENSE, then growing by COUNT_GROWTH
COUNT_DENSE = 64
COUNT_GROWTH = 1.05
COUNT_MAX_CUTS = 1 << 16
#: ... counts within this share of the modal count are the same count (>= 50 messages)
COUNT_TOL = 0.02
#: ... and with a steady rate: at least COUNT_STEADY_SHARE of the spacings (per iteration)
#: within COUNT_STEADY x their median
COUNT_STEADY = (2.0 / 3.0, 1.5)
COUNT_STEADY_SHARE = 0.75


def count_bursts(s, e, c, floor=MIN_GAP_NS):
    """Iterations recognised by what they carry rather than by when they come: cutting the
    activity (s, e: merged intervals in start order, c: messages in each) at its m largest
    gaps (m = 1, 2, ... : the coarsest level first), the first cut whose bursts carry one
    message count (the modal count, in >= COUNT_MIN_BURSTS bursts holding >= COUNT_SHARE of
    the messages) coming at a steady rate (>= COUNT_STEADY_SHARE of the spacings per
    iteration within COUNT_STEADY x their median): a collective's iteration repeats the same
    messages even when host noise makes its gaps and spacings too irregular for fit_period
    (emulated hosts, a library's waits as long as the gap between iterations). The first
    level with one message count is the iterations': without a steady rate there is no
    period (the finer levels are their steps). Returns (burst starts, burst ends, threshold, period ns,
    cv) or None; period = the median over consecutive modal bursts of their spacing divided
    by the iterations it spans (the messages from one to the next / the modal count)."""
    n = len(s)
    if n < COUNT_MIN_BURSTS * 2:
        return None
    gaps = s[1:] - e[:-1]
    order = np.argsort(-gaps, kind="stable")
    top = int(min(COUNT_MAX_CUTS, int((gaps > floor).sum())))
    if top < COUNT_MIN_BURSTS - 1:
        return None
    cum = np.concatenate([[0], np.cumsum(c)])
    total = float(cum[-1])
    m = 1
    while m <= top:
        g_m = gaps[order[m - 1]]
        # ties: a cut takes every gap as large as its smallest
        if m < top and gaps[order[m]] == g_m:
            m += 1
            continue
        cut = np.sort(order[:m]) + 1                      # first interval of each new burst
        edges = np.concatenate([[0], cut, [n]])
        cnt = cum[edges[1:]] - cum[edges[:-1]]
        vals, k = np.unique(cnt, return_counts=True)
        best = int(np.argmax(k * vals))                   # the count holding the most messages
        v = int(vals[best])
        # one count, give or take COUNT_TOL of it (a message the capture lost or cut at an edge)
        near = np.abs(cnt - v) <= int(COUNT_TOL * v)
        nk = int(near.sum())
        if nk >= COUNT_MIN_BURSTS and float(cnt[near].sum()) >= COUNT_SHARE * total and v >= 2:
            lo = gaps[order[m]] if m < len(order) else floor
            thr = float(np.sqrt(max(lo, 1.0) * g_m))
            bs = s[edges[:-1]]
            be = np.maximum.reduceat(e, edges[:-1])
            modal = np.nonzero(near)[0]
            # the spacing of two consecutive modal bursts over the iterations between them
            # (their messages / the modal count: a split or merged iteration in between)
            units = np.round((cum[edges[modal[1:]]] - cum[edges[modal[:-1]]]) / float(v))
            ok = units >= 1
            d = np.diff(bs[modal])[ok] / units[ok]
            per = float(median(d)) if len(d) else 0.0
            # ... and they come at a steady rate (identical bursts at random times do not)
            steady = (d >= COUNT_STEADY[0] * per) & (d <= COUNT_STEADY[1] * per)
            if len(d) >= COUNT_MIN_BURSTS - 1 and per > 0 and float(np.mean(steady)) >= COUNT_STEADY_SHARE:
                dd = d[(d > 0.5 * per) & (d < 1.5 * per)]
                cv = float(np.std(dd) / np.mean(dd)) if len(dd) >= 2 else None
                return bs, be, thr, per, cv
            return None          # the iterations, at no steady rate: no period (not their steps')
        m = m + 1 if m < COUNT_DENSE else max(m + 1, int(m * COUNT_GROWTH))
    return None


def fit_period(starts):
    """(period_ns, jitter_ns or None, cv or None, regular) from burst start times."""
    starts = np.asarray(starts, dtype=np.float64)
    if len(starts) < 2:
        return None, None, None, False
    d = np.diff(starts)
    p0 = float(median(d))
    if p0 <= 0:
        return None, None, None, False
    # index each start by the whole periods since the previous one (robust to drift and
    # to a missing iteration), then fit start = a + index * period
    steps = np.round(d / p0)
    if np.any(steps < 1):
        return float(p0), None, None, False
    idx = np.concatenate([[0.0], np.cumsum(steps)])
    if len(starts) == 2:
        return float(d[0]), None, None, True
    a = np.vstack([np.ones(len(idx)), idx]).T
    coef, *_ = np.linalg.lstsq(a, starts, rcond=None)
    per = float(coef[1])
    res = starts - a @ coef
    frac = np.abs(res) / per if per > 0 else np.full(len(res), np.inf)
    regular = bool(np.max(frac) <= 0.45 and median(frac) <= 0.15)
    jit = float(np.sqrt(np.sum(res ** 2) / max(1, len(res) - 2))) if len(res) > 2 else None
    dd = d[(d > 0.5 * p0) & (d < 1.5 * p0)]
    cv = float(np.std(dd) / np.mean(dd)) if len(dd) >= 2 else None
    return per, jit, cv, regular


def acf_period(ctx, flow_mask=None, max_bins=65536, min_bin_ns=1000.0, min_lag_ns=0.0):
    """Period (ns) from the autocorrelation of bytes per time bin; None if no peak >= ACF_MIN."""
    ok = ctx.data_mask(flow_mask)
    t = ctx.ev_start[ok]
    te = ctx.ev_end[ok]
    if len(t) < 8:
        return None
    t0, t1 = float(t.min()), float(te.max())
    span = t1 - t0
    if span <= 0:
        return None
    b = max(min_bin_ns, span / max_bins)
    nb = int(span // b) + 2
    # throughput series: each message's bytes spread evenly over its on-wire time
    sb = ((t - t0) // b).astype(np.int64)
    eb = np.maximum(((te - t0) // b).astype(np.int64), sb) + 1
    dens = ctx.events["bytes"][ok].astype(np.float64) / (eb - sb)
    x = np.cumsum(np.bincount(sb, weights=dens, minlength=nb + 1) - np.bincount(eb, weights=dens, minlength=nb + 1))[:nb]
    x = x - x.mean()
    if not np.any(x):
        return None
    fx = np.fft.rfft(x, 2 * nb)
    ac = np.fft.irfft(fx * np.conj(fx))[:nb]
    if ac[0] <= 0:
        return None
    ac = ac / ac[0]
    # skip the zero-lag lobe, look for the highest peak among lags up to half the span
    neg = np.nonzero(ac < 0)[0]
    if len(neg) == 0:
        return None
    lo = max(int(neg[0]), int(np.ceil(min_lag_ns / b)), 20)
    hi = max(lo + 1, nb // 2)
    if hi <= lo + 1:
        return None
    seg = ac[lo:hi]
    k = int(np.argmax(seg))
    if seg[k] < ACF_MIN:
        return None
    # prefer the first peak of comparable height (a fundamental over its multiples)
    cand = np.nonzero(seg >= 0.9 * seg[k])[0]
    k0 = int(cand[0])
    # local max around k0
    j = k0
    while j + 1 < len(seg) and seg[j + 1] >= seg[j]:
        j += 1
    return float((lo + j) * b)


@njit(cache=True, nogil=True)
def first_start_per_key(key, start, nkeys):
    out = np.full(nkeys, np.inf)
    for i in range(key.shape[0]):
        k = key[i]
        if k >= 0 and start[i] < out[k]:
            out[k] = start[i]
    return out


@njit(cache=True, nogil=True)
def _first_starts(ev_data, ev_flow, fm, ev_mask, masked, start, nsrc, ndst, pos, bs, nm):
    """group_timing's first data-message start per (burst, member) as a sender and as a
    receiver, in one pass over the records: those of data (ev_data) on the flows where fm
    holds (and ev_mask when masked), the burst the last one starting at or before the
    record (np.searchsorted side right - 1; none before the first), the member pos[node]
    (-1: not one); inf where none. first_start_per_key's minimum over the same records."""
    nb = bs.shape[0]
    out_s = np.full(nb * nm, np.inf)
    out_r = np.full(nb * nm, np.inf)
    for i in range(ev_data.shape[0]):
        if not (ev_data[i] and fm[ev_flow[i]] and (not masked or ev_mask[i])):
            continue
        s = start[i]
        b = bisect_right(bs, s) - 1
        if b < 0:
            continue
        f = ev_flow[i]
        a = pos[nsrc[f]]
        if a >= 0 and s < out_s[b * nm + a]:
            out_s[b * nm + a] = s
        a = pos[ndst[f]]
        if a >= 0 and s < out_r[b * nm + a]:
            out_r[b * nm + a] = s
    return out_s, out_r


def bursts_and_period(s, e, c, level="iteration", counts=True):
    """Bursts of activity intervals (s, e sorted by start, c messages each) and their period:
    (starts, ends, threshold, period ns or None, jitter ns or None, cv, period_source).
    The bursts at the first natural break that repeats regularly (split_bursts, fit_period:
    "bursts"); at the iteration level, when there is no such rhythm, or its bursts are
    lopsided (one holds all but under 1/LOPSIDED of the messages: a warm-up before the run),
    the iterations by their message counts (count_bursts: "burst_counts", jitter null: no
    regular grid to measure it against), cutting no finer than the natural break when that
    one gives >= 3 bursts that are not lopsided. counts=False: natural breaks only."""
    bs, be, thr = split_bursts(s, e, level=level)
    per = jit = cv = src = None
    if len(bs) >= 2:
        p, j, v, regular = fit_period(bs)
        if regular and p:
            per, jit, cv, src = p, j, v, "bursts"
    lop = _lopsided(bs, s, c)
    if counts and level == "iteration" and len(s) and (per is None or lop):
        # bursts separated by a natural break are the iterations (if anything is): the
        # counts may only merge them, unless one of them holds nearly everything
        floor = thr if len(bs) >= 3 and not lop and np.isfinite(thr) else MIN_GAP_NS
        cb = count_bursts(s, e, c, floor)
        if cb is not None:
            bs, be, thr, per, cv = cb
            jit, src = None, "burst_counts"
    return bs, be, thr, per, jit, cv, src


def group_timing(snap, flow_mask=None, members=None, ev_mask=None, level="iteration", counts=True):
    """Timing of a set of data flows (a collective group). Returns a dict (seconds) and
    the bursts (ns arrays) for the other metrics. counts: bursts_and_period's."""
    ctx = context(snap)
    s, e, c = activity(ctx, flow_mask, ev_mask)
    bs, be, thr, per, jit, cv, src = bursts_and_period(s, e, c, level, counts)
    out = {"period_s": None, "period_jitter_s": None, "period_cv": None, "iterations": int(len(bs)),
           "busy_fraction": None, "burst_busy_s": None, "period_source": None}
    busy_total = float(np.sum(e - s)) if len(s) else 0.0
    if per:
        out.update(period_s=per / 1e9, period_jitter_s=None if jit is None else jit / 1e9,
                   period_cv=cv, period_source=src)
    if out["period_s"] is None and len(bs) <= 1 and len(s) >= 8:
        # no idle gap separates iterations: periodic rate modulation, if any
        ok = ctx.data_mask(flow_mask)
        md = float(median(ctx.ev_end[ok] - ctx.ev_start[ok])) if ok.any() else 0.0
        p = acf_period(ctx, flow_mask, min_lag_ns=4.0 * md)
        if p:
            out.update(period_s=p / 1e9, period_source="autocorrelation")
    if len(bs):
        span = float(be.max() - bs[0])
        if out["period_s"] and len(bs) >= 2:
            span = out["period_s"] * 1e9 * len(bs)
        out["busy_fraction"] = min(1.0, busy_total / span) if span > 0 else None
        out["burst_busy_s"] = float(median(be - bs)) / 1e9
    if len(bs) >= 3:
        d = np.diff(bs)
        out["interval_p50_s"] = float(percentile(d, 50)) / 1e9
        out["interval_p99_s"] = float(percentile(d, 99)) / 1e9
        out["interval_max_s"] = float(d.max()) / 1e9
    # phase offsets per member, as a sender and as a receiver
    lags = rlags = None
    if members is not None and len(bs) >= 1:
        pos = np.full(max(1, ctx.nodes.n), -1, dtype=np.int64)
        pos[np.asarray(members, dtype=np.int64)] = np.arange(len(members))
        nm = len(members)
        fm = (np.ones(max(1, len(ctx.flows)), dtype=np.bool_) if flow_mask is None
              else np.ascontiguousarray(flow_mask, dtype=np.bool_))
        firsts = _first_starts(ctx.ev_data, ctx.ev_flow, fm,
                               np.ones(1, np.bool_) if ev_mask is None else np.ascontiguousarray(ev_mask),
                               ev_mask is not None, ctx.ev_start, ctx.nodes.src, ctx.nodes.dst, pos,
                               np.ascontiguousarray(bs, dtype=np.float64), nm)
        res = []
        for fs in firsts:
            fs = fs.reshape(len(bs), nm)
            rel = fs - bs[:, None]
            rel[~np.isfinite(rel)] = np.nan
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                # per burst: the typical member; of two, the earlier (their median is the
                # midpoint, which would give the late one half its lag)
                ref = np.nanmin(rel, axis=1) if nm == 2 else nanmedian(rel, axis=1)
                dev = rel - ref[:, None]
                med = nanmedian(dev, axis=0)
            res.append((med, dev))
        lags, dev_s = res[0]
        rlags, dev_r = res[1]
    info = {"bursts_start": bs, "bursts_end": be, "threshold_ns": thr, "start_lag_ns": lags,
            "activity": (s, e), "recv_lag_ns": rlags}
    if lags is not None:
        info["send_dev_ns"] = dev_s       # (bursts, members): first send minus the burst's median member
        info["recv_dev_ns"] = dev_r
    return out, info


#: bursts are not iterations when one holds all but under 1/this of the messages
LOPSIDED = 8


def _lopsided(bs, s, c) -> bool:
    """Several bursts, one of which holds all but under 1/LOPSIDED of the messages (a
    warm-up or start-up exchange before the run, not an iteration of it)."""
    if len(bs) < 2:
        return False
    k = np.searchsorted(s, bs, side="left")
    cum = np.concatenate([[0], np.cumsum(c)])
    per = np.diff(np.append(cum[k], cum[-1])).astype(np.float64)
    return float(per.max()) * LOPSIDED > (LOPSIDED - 1) * float(cum[-1])


def timing(snap, flow_mask=None) -> dict | None:
    """Capture-level timing over all data flows (or a subset): period, jitter, busy share;
    None when no period can be found."""
    out, _ = group_timing(snap, flow_mask)
    if out["period_s"] is None:
        return None
    return out
