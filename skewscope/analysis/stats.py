"""Skew statistics of a vector (numba kernels). Definitions: docs/metrics.md "Skew statistics".

For x = (x_1..x_n), x_i >= 0 (bytes or rates across peers, links, QPs):

    max_over_mean  max(x) / mean(x)              imbalance ratio; 1.0 = perfectly even
    cv             std(x) / mean(x)              population std (ddof 0)
    gini           sum_ij |x_i - x_j| / (2 n^2 mean)   0 = even, (n-1)/n = all in one
    jain           (sum x)^2 / (n sum x^2)       1 = fair, 1/n = all in one
    argmax         index of the largest element (first on ties)
    max_share      max(x) / sum(x)
    min_over_mean  min(x) / mean(x)

Empty vectors and all-zero vectors give n/sum and NaN for the ratios (nothing to compare).
"""
from __future__ import annotations

import math
import warnings

import numpy as np

from skewscope.core.jit import njit

STAT_NAMES = ("n", "sum", "mean", "max", "min", "max_over_mean", "min_over_mean", "cv", "gini",
              "jain", "argmax", "max_share")
_NS = len(STAT_NAMES)


@njit(cache=True, nogil=True)
def _skew_kernel(x, out):
    n = x.shape[0]
    for k in range(out.shape[0]):
        out[k] = np.nan
    out[0] = n
    out[1] = 0.0
    if n == 0:
        return
    mx = x[0]
    mn = x[0]
    am = 0
    for i in range(n):
        v = x[i]
        if v > mx:
            mx = v
            am = i
        if v < mn:
            mn = v
    s = 0.0
    for i in range(n):
        s += x[i]
    out[1] = s
    mean = s / n
    out[2] = mean
    out[3] = mx
    out[4] = mn
    out[10] = am
    if s <= 0.0 or mx <= 0.0:
        return
    # scale-free quantities on x / max (no under/overflow of the squares)
    sn = 0.0
    s2 = 0.0
    for i in range(n):
        v = x[i] / mx
        sn += v
        s2 += v * v
    mn_ = sn / n
    out[5] = 1.0 / mn_
    out[6] = (mn / mx) / mn_
    var = s2 / n - mn_ * mn_
    if var < 0.0:
        var = 0.0
    out[7] = math.sqrt(var) / mn_
    # Gini via the sorted vector: G = sum_i (2i - n - 1) x_(i) / (n sum x), i = 1..n
    xs = np.sort(x)
    g = 0.0
    for i in range(n):
        g += (2.0 * (i + 1) - n - 1.0) * (xs[i] / mx)
    out[8] = g / (n * sn)
    out[9] = sn * sn / (n * s2)
    out[11] = 1.0 / sn


@njit(cache=True, nogil=True)
def skew_rows_kernel(m, mask):
    """Skew statistics of every row of m over the columns where mask[row, col] is True."""
    r = m.shape[0]
    out = np.empty((r, _NS))
    buf = np.empty(m.shape[1])
    idx = np.empty(m.shape[1], dtype=np.int64)
    row = np.empty(_NS)
    for i in range(r):
        k = 0
        for j in range(m.shape[1]):
            if mask[i, j]:
                buf[k] = m[i, j]
                idx[k] = j
                k += 1
        _skew_kernel(buf[:k], row)
        for c in range(_NS):
            out[i, c] = row[c]
        if k > 0 and not np.isnan(row[10]):
            out[i, 10] = idx[int(row[10])]
    return out


def skew_array(x) -> np.ndarray:
    """skew statistics as a float64 array in STAT_NAMES order (for hot loops)."""
    x = np.ascontiguousarray(np.asarray(x, dtype=np.float64).ravel())
    out = np.empty(_NS)
    _skew_kernel(x, out)
    return out


def _to_dict(a) -> dict:
    d = {}
    for name, v in zip(STAT_NAMES, a):
        v = float(v)
        if name in ("n", "argmax"):
            d[name] = None if math.isnan(v) else int(v)
        else:
            d[name] = None if math.isnan(v) else v
    return d


def skew_stats(x) -> dict:
    """Skew statistics of a vector: {"n", "sum", "mean", "max", "min", "max_over_mean",
    "min_over_mean", "cv", "gini", "jain", "argmax", "max_share"} (None where undefined)."""
    return _to_dict(skew_array(x))


def skew_rows(m, mask=None) -> list[dict]:
    """skew_stats of every row of a matrix (optionally only over mask's True columns:
    e.g. a traffic matrix without its diagonal)."""
    m = np.ascontiguousarray(np.asarray(m, dtype=np.float64))
    if mask is None:
        mask = np.ones(m.shape, dtype=np.bool_)
    return [_to_dict(r) for r in skew_rows_kernel(m, np.ascontiguousarray(mask, dtype=np.bool_))]


@njit(cache=True, nogil=True, inline="always")
def bisect_right(a, x):
    """np.searchsorted(a, x, "right") for a sorted 1-D a, in a kernel's per-element loop
    (numba's searchsorted there is slower than this plain bisection)."""
    lo = 0
    hi = a.shape[0]
    while lo < hi:
        mid = (lo + hi) >> 1
        if a[mid] <= x:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True, nogil=True)
def weighted_median(v, w):
    """Median of v weighted by w (w >= 0); NaN when the total weight is 0."""
    n = v.shape[0]
    if n == 0:
        return np.nan
    o = np.argsort(v)
    tot = 0.0
    for i in range(n):
        tot += w[i]
    if tot <= 0:
        return np.nan
    acc = 0.0
    for i in range(n):
        acc += w[o[i]]
        if acc >= tot / 2:
            return v[o[i]]
    return v[o[n - 1]]


def counted_median(values, counts) -> float:
    """np.median of the multiset where values[i] (sorted, distinct integers) occurs counts[i]
    times, from the counts (no array of every element): the middle element, or the mean of
    the two middle ones as np.median takes it ((float(a) + float(b)) / 2); NaN when empty."""
    n = int(counts.sum())
    if n == 0:
        return np.nan
    cum = np.cumsum(counts)
    hi = float(values[np.searchsorted(cum, n // 2, side="right")])      # element n // 2
    if n % 2:
        return hi
    return (float(values[np.searchsorted(cum, n // 2 - 1, side="right")]) + hi) / 2


def median(a, axis=None):
    """np.median(a, axis) (axis None or one int) to the bit: numpy's own steps (partition,
    np.mean of the middle one or two, NaN where a slice holds one) without its NaN check's
    np.ma lookup, which imports numpy.ma (~12 ms) on the first median of floats. A short
    1-D vector of float64 or integers takes _small_median (1 instead of ~15 us a call)."""
    a = np.asanyarray(a)
    if (type(a) is np.ndarray and a.ndim == 1 and 0 < a.shape[0] <= SMALL_MEDIAN and (axis is None or axis in (0, -1))
            and (a.dtype == np.float64 or a.dtype.kind in "iu")):
        return _small_median(a)
    if axis is not None:
        axis = axis % a.ndim
    sz = a.size if axis is None else a.shape[axis]
    kth = [sz // 2 - 1, sz // 2] if sz % 2 == 0 else [(sz - 1) // 2]
    nans = np.issubdtype(a.dtype, np.inexact)
    if nans:
        kth.append(-1)
    part = np.partition(a, kth, axis=axis)
    if part.shape == ():
        return part.item()
    ax = 0 if axis is None else axis
    index = part.shape[ax] // 2
    idx = [slice(None)] * part.ndim
    idx[ax] = slice(index, index + 1) if part.shape[ax] % 2 else slice(index - 1, index + 1)
    rout = np.mean(part[tuple(idx)], axis=ax)
    if not nans or part.size == 0:
        return rout
    last = part.take(-1, axis=ax)
    n = np.isnan(last)
    if not n.any():
        return rout
    if isinstance(rout, np.generic):
        return last
    np.copyto(rout, last, where=n)
    return rout


#: median's sorting fast path up to this many elements (numpy's partition, mean and NaN
#: check cost ~15 us a call whatever the size; a sort of 256 costs ~3)
SMALL_MEDIAN = 256


def _small_median(a):
    """np.median of a non-empty 1-D float64 or integer array, from its sorted copy: the middle
    element, or the two middle ones' sum / 2 (np.mean's float64 sum and division); a NaN
    when the vector holds one (sorted last: numpy's answer too). A numpy float64 scalar,
    as np.median's."""
    s = np.sort(a)
    n = s.shape[0]
    h = n >> 1
    if s.dtype.kind != "f":
        lo, hi = np.float64(s[h - 1]), np.float64(s[h])
    else:
        if s[n - 1] != s[n - 1]:
            return s[n - 1]
        lo, hi = s[h - 1], s[h]
    return hi / 1 if n & 1 else (lo + hi) / 2


def _nanmedian_rows(flat):
    """nanmedian of every row of a 2-D float64 array (one sort, NaNs last): per row the
    middle non-NaN value or the two middle ones' sum / 2; NaN (and numpy's warning, once a
    row) where a row has none."""
    s = np.sort(flat, axis=1)
    c = s.shape[1] - np.isnan(s).sum(axis=1)
    h = c >> 1
    rows = np.arange(s.shape[0])
    hi = s[rows, np.minimum(h, s.shape[1] - 1)]
    lo = s[rows, np.maximum(h - 1, 0)]
    out = np.where((c & 1) == 1, hi / 1, (lo + hi) / 2)
    empty = c == 0
    if empty.any():
        for _ in range(int(empty.sum())):
            warnings.warn("All-NaN slice encountered", RuntimeWarning, stacklevel=3)
        out[empty] = np.nan
    return out


@njit(cache=True, nogil=True)
def median_axis1(x):
    """np.median(x, axis=1) of a 3-D float64 array (e.g. (iterations, members, steps)):
    per (i, k) the middle of the sorted x[i, :, k] or the two middle ones' sum / 2 (np.mean's
    arithmetic), NaN when the slice holds one; an insertion sort per slice instead of
    numpy's partition along a strided axis (~5x faster for a few dozen members)."""
    a, m, k = x.shape
    out = np.empty((a, k))
    buf = np.empty(m)
    h = m // 2
    for i in range(a):
        for j in range(k):
            nan = False
            for q in range(m):
                v = x[i, q, j]
                if v != v:
                    nan = True
                p = q
                while p > 0 and buf[p - 1] > v:
                    buf[p] = buf[p - 1]
                    p -= 1
                buf[p] = v
            if nan:
                out[i, j] = np.nan
            elif m & 1:
                out[i, j] = buf[h]
            else:
                out[i, j] = (buf[h - 1] + buf[h]) / 2
    return out


def nanmedian(a, axis=None):
    """np.nanmedian(a, axis) (axis None or one int): the median of each slice's non-NaN
    values, NaN (with numpy's warning) where none is; numpy's takes them through numpy.ma."""
    a = np.asanyarray(a)
    if not np.issubdtype(a.dtype, np.inexact):
        return median(a, axis)
    if axis is None:
        v = a.ravel()
        v = v[~np.isnan(v)]
        if not v.size:
            warnings.warn("All-NaN slice encountered", RuntimeWarning, stacklevel=2)
            return a.dtype.type(np.nan)
        return median(v)
    a = np.moveaxis(a, axis, -1)
    flat = a.reshape(-1, a.shape[-1])
    if type(a) is np.ndarray and a.dtype == np.float64 and 0 < flat.shape[1] <= SMALL_MEDIAN and flat.shape[0]:
        return _nanmedian_rows(flat).reshape(a.shape[:-1])
    out = np.empty(flat.shape[0], dtype=median(np.zeros(1, dtype=a.dtype)).dtype)
    for i, row in enumerate(flat):
        v = row[~np.isnan(row)]
        if not v.size:
            warnings.warn("All-NaN slice encountered", RuntimeWarning, stacklevel=2)
            out[i] = np.nan
        else:
            out[i] = median(v)
    return out.reshape(a.shape[:-1])


def percentile(a, q) -> np.float64:
    """np.percentile(a, q) of a 1-D array and one number q (method 'linear') to the bit:
    numpy's index arithmetic and lerp, without the np.unique of its partition points (whose
    masked-array check imports numpy.ma)."""
    a = np.asanyarray(a).ravel()
    n = a.shape[0]
    vi = (n - 1) * np.true_divide(q, 100)
    prev = np.floor(vi)
    nxt = prev + 1
    if vi >= n - 1:
        prev = nxt = -1
    elif vi < 0:
        prev = nxt = 0
    elif np.isnan(vi):
        prev = nxt = -1
    prev, nxt = int(prev), int(nxt)
    kth = sorted({0 % n, n - 1, prev % n, nxt % n})
    part = np.partition(a, kth)
    if np.issubdtype(a.dtype, np.inexact) and np.isnan(part[-1]):
        return part[-1]
    lo, hi = part[prev], part[nxt]
    t = float(vi - prev)
    d = hi - lo
    return hi - d * (1 - t) if t >= 0.5 else lo + d * t


def unique(a) -> np.ndarray:
    """np.unique(a) (sorted distinct values, one NaN): without its masked-array check, which
    imports numpy.ma."""
    s = np.sort(np.ravel(a))
    keep = np.ones(len(s), dtype=np.bool_)
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    if len(s) and np.issubdtype(s.dtype, np.inexact) and np.isnan(s[-1]):
        keep[np.searchsorted(s, s[-1]) + 1:] = False
    return s[keep]


def robust_ratio_to_median(x) -> np.ndarray:
    """x / median(x) (NaN where x is NaN or the median is 0/undefined)."""
    x = np.asarray(x, dtype=np.float64)
    ok = np.isfinite(x)
    if not ok.any():
        return np.full(x.shape, np.nan)
    med = float(median(x[ok]))
    if med <= 0:
        return np.full(x.shape, np.nan)
    return x / med


@njit(cache=True, nogil=True)
def grouped_weighted_median(key, v, w, nkeys):
    """Weighted median of v per key (key in 0..nkeys-1; NaN values ignored)."""
    out = np.full(nkeys, np.nan)
    n = key.shape[0]
    o = np.argsort(key, kind="mergesort")
    i = 0
    while i < n:
        k = key[o[i]]
        j = i
        while j < n and key[o[j]] == k:
            j += 1
        m = 0
        vv = np.empty(j - i)
        ww = np.empty(j - i)
        for q in range(i, j):
            x = v[o[q]]
            if x == x:
                vv[m] = x
                ww[m] = w[o[q]]
                m += 1
        if m > 0:
            out[k] = weighted_median(vv[:m], ww[:m])
        i = j
    return out
