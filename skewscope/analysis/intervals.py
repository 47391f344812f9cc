"""Interval kernels over message records (numba): busy unions per key, merged intervals,
bursts and their natural break, concurrency sweeps.

Events are sorted by start_ts (Snapshot contract), so for every key the records arrive in
start order and one pass merges them.
"""
from __future__ import annotations

import numpy as np

from skewscope.core.jit import njit


@njit(cache=True, nogil=True)
def union_kernel(ev_key, start, end, floor, busy, first, last):
    """The one interval-union kernel. Records in start order per key (key < 0 skipped); each
    [start, end] is first clipped to start no earlier than floor[key] (what an earlier batch
    already counted: the exporter's carry across reads; -inf or 0 for none). Adds the length
    of the union per key to busy[key], sets first[key] (first start, unclipped, if unset) and
    last[key] (end of the union), and advances floor[key] to that end. Works on float or
    integer times (the exporter keeps integer ns, the analysis float ns)."""
    nkeys = busy.shape[0]
    cs = floor.copy()
    ce = floor.copy()
    seen = np.zeros(nkeys, dtype=np.bool_)
    for i in range(ev_key.shape[0]):
        k = ev_key[i]
        if k < 0:
            continue
        s = start[i]
        e = end[i]
        if not seen[k]:
            seen[k] = True
            first[k] = s
            if s < floor[k]:
                s = floor[k]
            cs[k] = s
            ce[k] = e if e > s else s
            continue
        if s < floor[k]:
            s = floor[k]
        if s > ce[k]:
            busy[k] += ce[k] - cs[k]
            cs[k] = s
            ce[k] = e if e > s else s   # a record wholly under the floor adds nothing
        elif e > ce[k]:
            ce[k] = e
    for k in range(nkeys):
        if seen[k]:
            busy[k] += ce[k] - cs[k]
            last[k] = ce[k]
            if ce[k] > floor[k]:
                floor[k] = ce[k]


def keyed_busy(ev_key, start, end, nkeys):
    """Union length of [start, end] per key (events in start order; key < 0 skipped).
    Returns (busy_ns[nkeys], first_start[nkeys], last_end[nkeys]) as float64 (NaN: no record)."""
    busy = np.zeros(nkeys)
    first = np.full(nkeys, np.nan)
    last = np.full(nkeys, np.nan)
    union_kernel(ev_key, np.asarray(start, np.float64), np.asarray(end, np.float64), np.full(nkeys, -np.inf),
                 busy, first, last)
    return busy, first, last


@njit(cache=True, nogil=True)
def keyed_intervals(ev_key, start, end, nkeys, merge_gap):
    """Merged busy intervals per key: records whose start is within merge_gap of the
    current interval's end extend it. Returns CSR (off[nkeys+1], ivs, ive, ivn) where ivn
    counts the records merged into each interval."""
    n = ev_key.shape[0]
    ok = np.empty(n, dtype=np.int64)
    os_ = np.empty(n)
    oe = np.empty(n)
    on = np.empty(n, dtype=np.int64)
    cs = np.full(nkeys, -1.0)
    ce = np.full(nkeys, -1.0)
    cn = np.zeros(nkeys, dtype=np.int64)
    m = 0
    for i in range(n):
        k = ev_key[i]
        if k < 0:
            continue
        s = start[i]
        e = end[i]
        if cs[k] < 0:
            cs[k] = s
            ce[k] = e
            cn[k] = 1
        elif s > ce[k] + merge_gap:
            ok[m] = k
            os_[m] = cs[k]
            oe[m] = ce[k]
            on[m] = cn[k]
            m += 1
            cs[k] = s
            ce[k] = e
            cn[k] = 1
        else:
            if e > ce[k]:
                ce[k] = e
            cn[k] += 1
    for k in range(nkeys):
        if cs[k] >= 0:
            ok[m] = k
            os_[m] = cs[k]
            oe[m] = ce[k]
            on[m] = cn[k]
            m += 1
    cnt = np.zeros(nkeys + 1, dtype=np.int64)
    for i in range(m):
        cnt[ok[i] + 1] += 1
    for k in range(nkeys):
        cnt[k + 1] += cnt[k]
    pos = cnt[:nkeys].copy()
    ivs = np.empty(m)
    ive = np.empty(m)
    ivn = np.empty(m, dtype=np.int64)
    for i in range(m):
        k = ok[i]
        p = pos[k]
        ivs[p] = os_[i]
        ive[p] = oe[i]
        ivn[p] = on[i]
        pos[k] += 1
    return cnt, ivs, ive, ivn


@njit(cache=True, nogil=True)
def merge_sorted(start, end, merge_gap):
    """Merge intervals sorted by start into busy intervals (gap <= merge_gap joins)."""
    n = start.shape[0]
    s_out = np.empty(n)
    e_out = np.empty(n)
    c_out = np.empty(n, dtype=np.int64)
    m = -1
    for i in range(n):
        s = start[i]
        e = end[i]
        if m < 0 or s > e_out[m] + merge_gap:
            m += 1
            s_out[m] = s
            e_out[m] = e
            c_out[m] = 1
        else:
            if e > e_out[m]:
                e_out[m] = e
            c_out[m] += 1
    return s_out[:m + 1], e_out[:m + 1], c_out[:m + 1]


def break_candidates(gaps: np.ndarray, min_ratio: float = 3.0, floor: float = 0.0) -> list[float]:
    """Thresholds at the natural breaks of a gap series, top level first: scanning the
    gaps (> floor) from the largest down, every ratio >= min_ratio between consecutive
    sorted gaps is a break (threshold = geometric mean of the two). When there are >= 3
    gaps and no break, every gap above the floor separates (all gaps alike)."""
    g = np.sort(np.asarray(gaps, dtype=np.float64))[::-1]
    g = g[g > floor]
    if len(g) == 0:
        return []
    if floor > 0:
        lo = np.append(g[1:], floor)          # the smallest gap against the floor too
    else:
        g, lo = g[:-1], g[1:]
    lo = np.maximum(lo, 1e-9)
    ratios = g / lo
    ks = np.nonzero(ratios >= min_ratio)[0]
    out = [float(np.sqrt(g[k] * lo[k])) for k in ks]
    if not out and len(g) >= 3 and floor > 0:
        out = [floor]
    return out


def natural_break(gaps: np.ndarray, min_ratio: float = 3.0, floor: float = 0.0) -> float:
    """The top-level break of break_candidates (inf: none, the series is one burst)."""
    c = break_candidates(gaps, min_ratio, floor)
    return c[0] if c else np.inf


@njit(cache=True, nogil=True)
def concurrency_sweep(key, t, delta, src, nkeys, nsrc_max):
    """Sweep endpoints sorted by (key, t, delta) with delta -1 (end) before +1 (start).
    Counts distinct `src` active per key. Returns per key: max concurrent sources,
    time-weighted mean over the time with >= 1 source, time with >= 2 sources, total
    active time, and the time at max."""
    mx = np.zeros(nkeys, dtype=np.int64)
    mean_num = np.zeros(nkeys)
    active = np.zeros(nkeys)
    multi = np.zeros(nkeys)
    at_max = np.zeros(nkeys)
    n = key.shape[0]
    cnt = np.zeros(nsrc_max, dtype=np.int64)
    i = 0
    while i < n:
        k = key[i]
        cur = 0
        last_t = t[i]
        j = i
        while j < n and key[j] == k:
            dt = t[j] - last_t
            if cur > 0 and dt > 0:
                active[k] += dt
                mean_num[k] += cur * dt
                if cur >= 2:
                    multi[k] += dt
                if cur == mx[k]:
                    at_max[k] += dt
            last_t = t[j]
            s = src[j]
            if delta[j] > 0:
                cnt[s] += 1
                if cnt[s] == 1:
                    cur += 1
                    if cur > mx[k]:
                        mx[k] = cur
                        at_max[k] = 0.0
            else:
                cnt[s] -= 1
                if cnt[s] == 0:
                    cur -= 1
            j += 1
        for q in range(i, j):
            cnt[src[q]] = 0
        i = j
    mean = np.where(active > 0, mean_num / np.maximum(active, 1e-12), 0.0)
    return mx, mean, multi, active, at_max
