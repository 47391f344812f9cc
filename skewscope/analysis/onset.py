"""Onset and end of a finding's condition: when it began (`since`) and when it stopped
holding (`until`, None = still holding at the end of the data). Definitions:
docs/metrics.md "Onset".

Two kinds of evidence over time, one function each:

* a **series** (one value per step, iteration, transfer or time bin of the blamed entity:
  its share, rate ratio, lag, ...): `series_onset(t, y, ...)` looks for the one stretch
  [a, b) of the series that stands out in the worse direction from the rest (an "epidemic"
  change-point scan on the ranks: robust to outliers, no distribution assumed), at least
  MIN_SEG observations inside and outside (MIN_EDGE in each part outside), significant
  against the scan's own chance level (z_min). Without such a stretch, or when the rest
  is not on the healthy side of the kind's threshold (a condition that only changes
  strength), the condition held over the whole series: since = its first observation,
  until = None. A stretch at
  the start: it ended (until = the end of its last observation); at the end: it began
  (since = the start of its first observation); in the middle: both.
* **occurrences** (sparse events: stalled messages, CNPs, interfered spacings, incast
  bursts): `episode(starts, ends, first, last)`: since = the first occurrence, until =
  the end of the last one -- except that a first (last) occurrence within EPISODE_GAPS
  typical gaps of the first (last) data counts as "from the start" ("still holding").

Times are ns on the snapshot's clock (pcap or monotonic); `Onset.seconds()` gives the
Finding's `since`/`until` (s). Kernels here are numpy over arrays (one pass per finding,
at most MAX_POINTS observations scanned: longer series are averaged into that many).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from skewscope.analysis.intervals import keyed_intervals
from skewscope.analysis.stats import median, unique

#: observations inside the stretch, and in each part of the series outside it, at least
MIN_SEG = 3
#: each part outside the stretch (before, after) has at least this many observations, or none
#: (a healthy stretch at both ends of a short series: 2 + 2 around the condition)
MIN_EDGE = 2
#: a series longer than this is averaged in consecutive groups down to this many points
#: (the scan is O(n^2)); the onset's resolution is then one group
MAX_POINTS = 240
#: a stretch split cleanly by the kind's threshold (>= this share of its observations at or
#: beyond it, and of the others not) counts below the scan's chance level, from this z
CLEAN_SHARE = 0.9
CLEAN_Z = 1.5
#: a series without a threshold of its own: the stretch must differ from the rest by at least
#: this share of the rest's level (median against median)
MIN_EFFECT = 0.2
#: episode: a first (last) occurrence within this many typical gaps between occurrences
#: (their mean spacing) of the first (last) data is "from the start" ("still holding"): a
#: periodic condition would have shown up in that many periods, and occurrences at a steady
#: random rate leave a silence that long with probability ~exp(-3) = 5 %
EPISODE_GAPS = 3.0
#: episode with fewer occurrences than this (no typical gap): a last occurrence within
#: this share of the data's span of its end is "still holding"
EPISODE_TAIL_SHARE = 0.02


class Onset(NamedTuple):
    since_ns: float | None
    until_ns: float | None

    def seconds(self) -> tuple[float | None, float | None]:
        return (None if self.since_ns is None else float(self.since_ns) / 1e9,
                None if self.until_ns is None else float(self.until_ns) / 1e9)


NONE = Onset(None, None)


def z_min(n: int) -> float:
    """The scan's significance bar for n observations: the 99.9th percentile of the
    largest standardized rank sum over the admissible stretches of n iid observations
    (measured by simulation, tests/unit/test_onset.py::test_scan_chance_level), rounded up:
    ~3.8 at n = 20, ~4.0 at 40, ~4.7 at 240."""
    return 2.6 + 0.9 * math.log10(max(2, n))


def _ranks(y: np.ndarray) -> np.ndarray:
    """Average ranks (ties share their mean rank)."""
    o = np.argsort(y, kind="stable")
    ys = y[o]
    r = np.empty(len(y))
    # runs of equal values get the mean of their positions
    cut = np.flatnonzero(np.diff(ys) != 0) + 1
    starts = np.concatenate(([0], cut))
    ends = np.concatenate((cut, [len(y)]))
    mean_rank = (starts + ends - 1) / 2.0
    r[o] = np.repeat(mean_rank, ends - starts)
    return r


def scan(y, worse: int = 1, min_seg: int = MIN_SEG) -> tuple[int, int, float]:
    """(a, b, z): the stretch [a, b) of y most shifted in the `worse` direction (+1: higher
    is worse, -1: lower) from the rest, and its z (the standardized sum of its standardized
    ranks: ~N(0, 1) for one stretch of an exchangeable series). Admissible: >= min_seg
    observations inside and outside; an outside part before (after) it is empty or has
    >= min(min_seg, MIN_EDGE). (0, n, 0.0) when nothing is admissible or the series is constant."""
    y = np.asarray(y, dtype=np.float64)
    n = len(y)
    if n < 2 * min_seg:
        return 0, n, 0.0
    r = _ranks(y)
    sd = float(r.std())
    if sd <= 0:
        return 0, n, 0.0
    z = worse * (r - r.mean()) / sd
    S = np.concatenate(([0.0], np.cumsum(z)))
    a = np.arange(n + 1)[:, None]
    b = np.arange(n + 1)[None, :]
    n_in = b - a
    n_out = n - n_in
    edge = min(min_seg, MIN_EDGE)
    ok = (n_in >= min_seg) & (n_out >= min_seg) & ((a == 0) | (a >= edge)) & ((b == n) | (n - b >= edge))
    if not ok.any():
        return 0, n, 0.0
    with np.errstate(invalid="ignore", divide="ignore"):
        stat = np.where(ok, (S[None, :] - S[:, None]) / np.sqrt(np.maximum(n_in * n_out, 1) / (n - 1)), -np.inf)
    k = int(np.argmax(stat))
    ia, ib = divmod(k, n + 1)
    return ia, ib, float(stat[ia, ib])


def _coarsen(t, te, y, max_points):
    """Consecutive groups averaged down to at most max_points (start of the first, end of
    the last, mean value)."""
    n = len(y)
    if n <= max_points:
        return t, te, y
    edges = np.linspace(0, n, max_points + 1).astype(np.int64)
    edges = unique(edges)
    cnt = np.diff(edges)
    ys = np.add.reduceat(y, edges[:-1]) / cnt
    return t[edges[:-1]], te[edges[1:] - 1], ys


def _edge(bad, k, lo, hi, rising: bool) -> int:
    """The edge near k (within [lo, hi], at most a quarter of the series away) that
    misclassifies the fewest observations around it: rising = bad after the edge (a start),
    else bad before it (an end). An edge at 0 / len stays (no part outside)."""
    n = len(bad)
    if k in (0, n):
        return k
    w = max(MIN_SEG, n // 4)
    a0, a1 = max(lo, k - w), min(hi, k + w)
    if a1 <= a0:
        return k
    seg = bad[a0:a1 + 1] if a1 < n else bad[a0:a1]
    c = np.concatenate(([0], np.cumsum(seg)))
    m = len(seg)
    ks = np.arange(a0, a1 + 1)
    j = ks - a0
    j = j[j <= m]
    ks = ks[: len(j)]
    before_bad, after_bad = c[j], c[m] - c[j]
    cost = before_bad + ((m - j) - after_bad) if rising else ((j - before_bad) + after_bad)
    best = np.flatnonzero(cost == cost.min())
    return int(ks[best[np.argmin(np.abs(ks[best] - k))]])


def series_onset(t, y, worse: int = 1, thr: float | None = None, t_end=None, min_seg: int = MIN_SEG,
                 max_points: int = MAX_POINTS, first: float | None = None) -> Onset:
    """Onset of a condition from its series: y[i] at observation i (start t[i], end t_end[i],
    default t[i]; sorted by time), higher worse (worse=+1) or lower (-1). thr: the kind's
    threshold on y (the condition holds where y is at or beyond it): a stretch counts only
    when its median is at or beyond thr and the rest's median is not. first: the time of
    "from the start" (the entity's first data when its first observation comes later;
    default the first observation). NaN observations are dropped. No observation: NONE."""
    t = np.asarray(t, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    te = t if t_end is None else np.asarray(t_end, dtype=np.float64)
    ok = np.isfinite(y) & np.isfinite(t)
    t, te, y = t[ok], te[ok], y[ok]
    if not len(y):
        return NONE
    o = np.argsort(t, kind="stable")
    t, te, y = t[o], te[o], y[o]
    t_first = float(t[0]) if first is None or not np.isfinite(first) else min(float(first), float(t[0]))
    whole = Onset(t_first, None)
    tc, tec, yc = _coarsen(t, te, y, max_points)
    n = len(yc)
    a, b, z = scan(yc, worse, min_seg)
    if a == 0 and b == n or z <= CLEAN_Z:
        return whole
    inside = np.zeros(n, dtype=bool)
    inside[a:b] = True
    mi, mo = float(median(yc[inside])), float(median(yc[~inside]))
    if thr is not None:
        if not (mi >= thr if worse > 0 else mi <= thr) or (mo >= thr if worse > 0 else mo <= thr):
            return whole
        cut = thr
    else:
        # no threshold of the kind's own: the midpoint of the two levels, for a change of
        # at least MIN_EFFECT of the healthy level
        if abs(mi - mo) < MIN_EFFECT * max(abs(mo), 1e-12):
            return whole
        cut = (mi + mo) / 2.0
    # a short series split cleanly (by the kind's threshold, else the midpoint) is an onset
    # even below the scan's chance level (which needs ~20 observations for any split)
    bad = yc >= cut if worse > 0 else yc <= cut
    clean = bad[inside].mean() >= CLEAN_SHARE and (~bad[~inside]).mean() >= CLEAN_SHARE
    if z < z_min(n) and not clean:
        return whole
    # the scan on ranks places an edge a little inside a lopsided stretch (its weakest
    # members rank below the middle); the edges go where the observations cross the cut
    a, b = _edge(bad, a, 0, b - min_seg, rising=True), _edge(bad, b, a + min_seg, n, rising=False)
    since = float(tc[a]) if a > 0 else t_first
    until = float(tec[b - 1]) if b < n else None
    return Onset(since, until)


def episode(starts, ends, first: float, last: float, gaps: float = EPISODE_GAPS, gap: float | None = None) -> Onset:
    """Onset of a condition seen as occurrences [starts, ends) (ns) within data that runs
    from `first` to `last`: since = the first occurrence's start, until = the last one's end
    (None when it is within `gaps` typical gaps of `last`: still holding); the first within
    `gaps` typical gaps of `first` counts from `first`. The typical gap: the mean spacing
    of the occurrences' starts (>= 3 occurrences: robust to occurrences that come in
    clusters), or `gap` when the caller knows it; with fewer and no `gap`, only a last
    occurrence within
    EPISODE_TAIL_SHARE of the span of `last` is still holding. No occurrence: NONE."""
    s = np.asarray(starts, dtype=np.float64)
    e = np.asarray(ends, dtype=np.float64)
    ok = np.isfinite(s)
    s, e = s[ok], np.where(np.isfinite(e[ok]), e[ok], s[ok])
    if not len(s):
        return NONE
    o = np.argsort(s, kind="stable")
    s, e = s[o], e[o]
    s0, e1 = float(s[0]), float(e.max())
    first, last = float(min(first, s0)), float(max(last, e1))
    if gap is not None and np.isfinite(gap) and gap > 0:
        lead, tail = gaps * gap, gaps * gap
    elif len(s) >= 3:
        g = (float(s[-1]) - s0) / (len(s) - 1)
        lead, tail = gaps * g, gaps * g
    else:
        lead, tail = 0.0, EPISODE_TAIL_SHARE * (last - first)
    since = first if s0 - first <= lead else s0
    until = None if last - e1 <= tail else e1
    return Onset(since, until)


def first_last(t) -> Onset:
    """From the first observation, still holding: the onset of a condition the data shows
    throughout (or whose timing is not known finer)."""
    t = np.asarray(t, dtype=np.float64)
    t = t[np.isfinite(t)]
    return Onset(float(t.min()), None) if len(t) else NONE


# ---- evidence helpers over the message records -----------------------------------------------
def flow_events(ctx, flows) -> np.ndarray:
    """Indices of the data records of `flows` (flow rows), in time order, through the records'
    grouping by flow (analysis.flows.flow_event_stats): O(their records), not a pass over
    all of them (a capture with hundreds of lossy links asks once per link)."""
    r = unique(np.asarray(flows, dtype=np.int64))
    if not len(r) or not len(ctx.events):
        return np.zeros(0, dtype=np.int64)
    _, order, off = ctx._fstat
    a, n = off[r], off[r + 1] - off[r]
    tot = int(n.sum())
    if not tot:
        return np.zeros(0, dtype=np.int64)
    pos = np.repeat(a - np.concatenate(([0], np.cumsum(n)[:-1])), n) + np.arange(tot)
    idx = np.sort(order[pos])
    return idx[ctx.ev_data[idx]]


def messages(ctx, flows):
    """The data messages of `flows` (flow rows) that carry timing (>= 2 packets, packets not
    at one timestamp): (index into the records, start ns, end ns, rate bytes/ns over the
    message's wire time, stretch = wire time / what the flow's median per-message rate
    predicts). The definitions of analysis.flows (wire time = span x n / (n - 1))."""
    idx = flow_events(ctx, flows)
    f = ctx.ev_flow[idx]
    ev = ctx.events
    by = ev["bytes"][idx].astype(np.float64)
    st = ev["start_ts"][idx].astype(np.float64)
    span = ev["end_ts"][idx].astype(np.float64) - st
    mtu = np.maximum(ctx.fstat["mtu"][f], 1).astype(np.float64)
    npk = np.maximum(1.0, np.ceil(by / mtu))
    keep = (npk >= 2) & (span > 0)
    if not keep.all():
        k = np.flatnonzero(keep)
        idx, f, by, st, span, npk = idx[k], f[k], by[k], st[k], span[k], npk[k]
    wire = span * npk / (npk - 1)
    rate = by / wire
    med = ctx.fstat["rate_med_bps"][f] / 8e9
    with np.errstate(invalid="ignore", divide="ignore"):
        stretch = np.where(med > 0, wire / (by / med), np.nan)
    return idx, st, st + wire, rate, stretch


def stalls(ctx, flows, min_excess_ns: float = 0.0, stretch: float = 2.0):
    """Stalled messages of `flows` (the flows.py definition: wire time >= `stretch` x what the
    flow's median per-message rate predicts, by >= min_excess_ns): (starts, ends) ns."""
    _, st, en, rate, stx = messages(ctx, flows)
    exp = (en - st) / np.where(np.isfinite(stx) & (stx > 0), stx, np.inf)
    sel = np.isfinite(stx) & (stx >= stretch) & ((en - st) - exp >= min_excess_ns)
    return st[sel], en[sel]


def bins_for(t0: float, t1: float, n_obs: int, per_bin: int = 2, max_bins: int = MAX_POINTS) -> np.ndarray:
    """Equal time bin edges over [t0, t1] for n_obs observations: about per_bin per bin,
    between 8 and max_bins bins."""
    k = int(min(max_bins, max(8, n_obs // max(1, per_bin))))
    return np.linspace(t0, max(t1, t0 + 1.0), k + 1)


def rate_ratio_series(ctx, flows, ref_flows, edges=None):
    """Per time bin: the median message rate of `flows` / the median message rate of
    `ref_flows` in the same bin (a bin without reference messages: their median over all
    bins -- the blamed flows still sending after the others finished). (first start, last
    end of `flows`' messages in the bin, ratio), bins with messages of `flows` -- the series
    of slow_link (mode slow), slow_receiver, kv_transfer_slow, the congestion kinds."""
    _, sa, ea, ra, _ = messages(ctx, flows)
    _, sb, _, rb, _ = messages(ctx, ref_flows)
    if not len(sa) or not len(sb):
        return np.zeros(0), np.zeros(0), np.zeros(0)
    if edges is None:
        edges = bins_for(float(min(sa.min(), sb.min())), float(max(sa.max(), sb.max())), len(sa))
    k = len(edges) - 1
    ia = np.clip(np.searchsorted(edges, sa, side="right") - 1, 0, k - 1)
    ib = np.clip(np.searchsorted(edges, sb, side="right") - 1, 0, k - 1)
    ma, mb = _bin_median(ia, ra, k), _bin_median(ib, rb, k)
    mb = np.where(np.isfinite(mb), mb, float(median(rb)))
    first = np.full(k, np.inf)
    last = np.full(k, -np.inf)
    np.minimum.at(first, ia, sa)
    np.maximum.at(last, ia, ea)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = ma / mb
    sel = np.isfinite(ratio)
    return first[sel], last[sel], ratio[sel]


def _bin_median(ix, v, k):
    """Median of v per bin index ix in [0, k) (NaN for an empty bin)."""
    out = np.full(k, np.nan)
    if not len(v):
        return out
    o = np.lexsort((v, ix))
    ixs, vs = ix[o], v[o]
    lo = np.searchsorted(ixs, np.arange(k), side="left")
    hi = np.searchsorted(ixs, np.arange(k), side="right")
    has = hi > lo
    a = lo[has] + (hi[has] - lo[has] - 1) // 2
    b = lo[has] + (hi[has] - lo[has]) // 2
    out[has] = (vs[a] + vs[b]) / 2.0
    return out


def concurrency_spans(starts, ends, at_least: int):
    """Spans of time where >= at_least intervals [starts, ends) are open at once (give one
    interval per sender at a time -- merge a sender's own intervals first -- and this
    counts senders): (span starts, span ends)."""
    s = np.asarray(starts, dtype=np.float64)
    e = np.maximum(np.asarray(ends, dtype=np.float64), s)
    if not len(s):
        return np.zeros(0), np.zeros(0)
    t = np.concatenate([s, e])
    d = np.concatenate([np.ones(len(s)), -np.ones(len(e))])
    o = np.lexsort((d, t))                   # at one instant, closes before opens
    t, d = t[o], d[o]
    on = np.cumsum(d) >= at_least
    prev = np.concatenate(([False], on[:-1]))
    up = np.flatnonzero(on & ~prev)
    down = np.flatnonzero(~on & prev)        # the count ends at 0: one down after every up
    return t[up], t[down]


def data_span(ctx, flows) -> tuple[float, float]:
    """(first, last) ns of the data of `flows`: their message records' first start and last
    end, else the flow table's first/last packet. (nan, nan) for no flow."""
    r = np.asarray(flows, dtype=np.int64)
    if not len(r):
        return np.nan, np.nan
    fs = ctx.__dict__.get("_fstat")             # the records' stats, when the analysis has them
    if fs is not None and len(ctx.events):
        a, b = fs[0]["first_start"][r], fs[0]["last_end"][r]
        if np.isfinite(a).any():
            return float(np.nanmin(a)), float(np.nanmax(b))
    c = ctx.cols
    has = c["packets"][r] > 0
    if not has.any():
        return np.nan, np.nan
    return float(c["first_ts"][r][has].min()), float(c["last_ts"][r][has].max())


def slowdown_onset(ctx, flows, ref_flows=None, thr: float | None = None) -> Onset | None:
    """Onset of a slowdown of `flows`: their per-bin median message rate over the reference
    flows' in the same bins (rate_ratio_series), lower is worse (series_onset with thr);
    without reference flows, over their own median rate (a change of their own speed: one
    pass over their records only, however many findings ask). None when they have no timed
    message."""
    flows = np.asarray(flows, dtype=np.int64)
    if ref_flows is not None:
        t0, t1, y = rate_ratio_series(ctx, flows, ref_flows)
    else:
        _, st, en, rate, _ = messages(ctx, flows)
        if not len(st):
            return None
        edges = bins_for(float(st.min()), float(st.max()), len(st))
        k = len(edges) - 1
        ix = np.clip(np.searchsorted(edges, st, side="right") - 1, 0, k - 1)
        mine = _bin_median(ix, rate, k)
        first = np.full(k, np.inf)
        last = np.full(k, -np.inf)
        np.minimum.at(first, ix, st)
        np.maximum.at(last, ix, en)
        sel = np.isfinite(mine)
        t0, t1, y = first[sel], last[sel], mine[sel] / float(median(rate))
    if not len(y):
        return None
    return series_onset(t0, y, worse=-1, thr=thr, t_end=t1)


def stall_onset(ctx, flows, min_excess_ns: float = 0.0) -> Onset | None:
    """Onset of a condition seen as stalled messages of `flows` (stalls()): an episode of
    them against the flows' data. None without records or without a stalled message."""
    if ctx.__dict__.get("_fstat") is None or not len(flows):
        return None
    s, e = stalls(ctx, flows, min_excess_ns)
    if not len(s):
        return None
    first, last = data_span(ctx, flows)
    return episode(s, e, first, last)


#: a message stretched by a loss: its stretch above the flows' median by this many robust
#: standard deviations (1.4826 x MAD), and by STRETCH_FLOOR at least
STRETCH_Z = 4.0
STRETCH_FLOOR = 0.01


def resend_onset(ctx, flows, events: int) -> Onset | None:
    """Onset of losses / resends on `flows`: the flow table counts them (`events`: PSN
    gaps, NAKs) without time, but a go-back-N resend stretches the message it hits: the
    `events` most stretched messages among those stretched beyond the flows' median by
    STRETCH_Z robust standard deviations (>= STRETCH_FLOOR), as an episode against the
    flows' data. None without records or without such a message."""
    if ctx.__dict__.get("_fstat") is None or not len(flows) or events < 1:
        return None
    _, st, en, _, sx = messages(ctx, flows)
    ok = np.isfinite(sx)
    st, en, sx = st[ok], en[ok], sx[ok]
    if len(sx) < 3:
        return None
    med = float(median(sx))
    bar = med + max(STRETCH_Z * 1.4826 * float(median(np.abs(sx - med))), STRETCH_FLOOR)
    cand = np.flatnonzero(sx >= bar)
    if not len(cand):
        return None
    top = cand[np.argsort(-sx[cand], kind="stable")[:int(events)]]
    first, last = data_span(ctx, flows)
    return episode(st[top], en[top], first, last)


#: incast onset: a sender's messages into the destination closer than this (ns) are one
#: stretch of activity (matrix.incast_degree's merge gap)
SENDER_MERGE_NS = 1000.0


def incast_onset(ctx, dst: int, at_least: int) -> Onset | None:
    """Onset of an incast into node `dst`: the spans where >= at_least senders send into it
    at once (each sender's data messages merged across gaps < SENDER_MERGE_NS, as
    matrix.incast_degree), as an episode against the data into it."""
    into = np.flatnonzero(ctx.data & (ctx.nodes.dst == dst))
    if not len(into) or not len(ctx.events):
        return None
    ok = ctx.data_events(into)
    key = np.where(ok, ctx.nodes.src[np.maximum(ctx.ev_flow, 0)], -1).astype(np.int64)
    off, ivs, ive, _ = keyed_intervals(key, ctx.ev_start, ctx.ev_end, max(1, ctx.nodes.n), SENDER_MERGE_NS)
    s, e = concurrency_spans(ivs, ive, at_least)
    if not len(s):
        return None
    first, last = data_span(ctx, into)
    return episode(s, e, first, last)
