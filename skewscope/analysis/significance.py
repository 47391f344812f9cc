"""Chance tests of the repetition-based detectors (no scipy: the few tails they need).

    binom_sf(k, n, p)   P(X >= k), X ~ Binomial(n, p) (exact: the regularised incomplete beta)
    t_sf(t, df)         P(T >= t), T ~ Student's t with df degrees of freedom
    z_of(p)             the standard normal quantile z with P(Z >= z) = p (a p-value in
                        "standard deviations", the unit of the detectors' min_z thresholds)
    additive_contrast   the log-additive two-way fit of a (rows x columns) byte table and
                        the t statistic of one column against the mean of the others

Scalars and small matrices (a detector's window: observations x members), not per packet.
Definitions: docs/metrics.md "All-to-all evidence"."""
from __future__ import annotations

import math

import numpy as np


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        de = d * c
        h *= de
        if abs(de - 1.0) < 1e-14:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta I_x(a, b), a, b > 0, 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    lbt = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(lbt) * _betacf(a, b, x) / a
    return 1.0 - math.exp(lbt) * _betacf(b, a, 1.0 - x) / b


def binom_sf(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p)."""
    if k <= 0:
        return 1.0
    if k > n or p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    return betainc(float(k), float(n - k + 1), p)


def t_sf(t: float, df: float) -> float:
    """P(T >= t) for Student's t with df > 0 degrees of freedom."""
    if not math.isfinite(t):
        return 0.0 if t > 0 else 1.0
    x = df / (df + t * t)
    tail = 0.5 * betainc(df / 2.0, 0.5, x)
    return tail if t > 0 else 1.0 - tail


def z_of(p: float) -> float:
    """The z with P(Z >= z) = p for a standard normal Z (inf for p = 0)."""
    if p <= 0.0:
        return math.inf
    if p >= 1.0:
        return -math.inf
    lo, hi = -40.0, 40.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if 0.5 * math.erfc(mid / math.sqrt(2.0)) > p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-10:
            break
    return 0.5 * (lo + hi)


def additive_contrast(b: np.ndarray, present: np.ndarray, h: int, noise_floor: float) -> dict | None:
    """A two-way additive fit of log bytes, log b[r, d] = row_r + col_d + e (rows: the
    observations, e.g. (source, phase); columns: destinations; only the `present` cells
    (b > 0 and allowed) count, so a row's own absent destinations are no evidence), and the
    contrast of column h against the mean of the other present columns:
    {"contrast": log ratio, "t": contrast / its standard error, "df": residual degrees of
    freedom, "sigma": the residual standard deviation, floored at noise_floor (log units),
    "rows": rows used}. None when the table has no residual degree of freedom or h is not
    compared with another column in any row. The row effects absorb each source's (and
    phase's) own volume: only a destination that gets more than the others *from the same
    sources* has a positive contrast, and the sources' disagreement (a different hottest per
    source, random routing) is the residual that the contrast is measured against."""
    pr = present & (b > 0)
    pr = pr[pr.sum(axis=1) >= 2]
    bb = b[(present & (b > 0)).sum(axis=1) >= 2]
    if not len(pr) or not pr[:, h].any():
        return None
    y = np.where(pr, np.log(np.where(pr, bb, 1.0)), 0.0)
    k = pr.sum(axis=1).astype(np.float64)
    yc = np.where(pr, y - (y.sum(axis=1) / k)[:, None], 0.0)
    w = pr.astype(np.float64)
    lap = np.diag(w.sum(axis=0)) - (w / k[:, None]).T @ w
    z = yc.sum(axis=0)
    lp = np.linalg.pinv(lap, rcond=1e-10, hermitian=True)
    col = lp @ z
    rank = int(np.linalg.matrix_rank(lap, tol=1e-8))
    df = int(pr.sum()) - len(pr) - rank
    if df < 1:
        return None
    cm = np.where(pr, col[None, :], 0.0)
    fit = np.where(pr, cm - (cm.sum(axis=1) / k)[:, None], 0.0)
    rss = float(((yc - fit) ** 2).sum())
    sigma = max(math.sqrt(max(rss, 0.0) / df), float(noise_floor))
    cols = np.nonzero(pr.any(axis=0))[0]
    others = cols[cols != h]
    if not len(others) or rank != len(cols) - 1:     # columns in separate components: no contrast
        return None
    wv = np.zeros(b.shape[1])
    wv[h] = 1.0
    wv[others] = -1.0 / len(others)
    contrast = float(wv @ col)
    var = float(wv @ lp @ wv)
    if var <= 0:
        return None
    t = contrast / (sigma * math.sqrt(var))
    return {"contrast": contrast, "t": t, "df": df, "sigma": sigma, "rows": int(len(pr))}
