"""Skew statistics against independent (pure Python / numpy) implementations of the
textbook definitions, on hand-made and random vectors."""
from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from skewscope.analysis import skew_stats
from skewscope.analysis.stats import grouped_weighted_median, skew_rows, weighted_median


def ref_gini(x):
    n = len(x)
    mean = sum(x) / n
    return sum(abs(a - b) for a in x for b in x) / (2 * n * n * mean)


def ref(x):
    x = [float(v) for v in x]
    n = len(x)
    s = sum(x)
    mean = s / n
    var = sum((v - mean) ** 2 for v in x) / n
    return {"max_over_mean": max(x) / mean, "min_over_mean": min(x) / mean, "cv": math.sqrt(var) / mean,
            "gini": ref_gini(x), "jain": s * s / (n * sum(v * v for v in x)), "max_share": max(x) / s,
            "argmax": x.index(max(x))}


def test_even_vector():
    d = skew_stats([5, 5, 5, 5])
    assert d["max_over_mean"] == 1.0 and d["cv"] == 0.0 and d["gini"] == 0.0 and d["jain"] == 1.0
    assert d["max_share"] == 0.25 and d["n"] == 4 and d["sum"] == 20


def test_all_in_one():
    d = skew_stats([0, 0, 0, 8])
    assert d["argmax"] == 3
    assert d["max_over_mean"] == 4.0
    assert math.isclose(d["gini"], 3 / 4)          # (n-1)/n
    assert math.isclose(d["jain"], 1 / 4)          # 1/n
    assert d["max_share"] == 1.0


def test_hot_expert_example():
    # 8 destinations, one gets 4x: max/mean = 4 / (11/8)
    d = skew_stats([1, 1, 1, 1, 1, 4, 1, 1])
    assert math.isclose(d["max_over_mean"], 32 / 11)
    assert d["argmax"] == 5


def test_tiny_and_huge_values_do_not_under_or_overflow():
    d = skew_stats([5e-163, 5e-163])
    assert d["max_over_mean"] == 1.0 and d["jain"] == 1.0
    d = skew_stats([1e300, 3e300])
    assert math.isclose(d["max_over_mean"], 1.5) and math.isclose(d["jain"], 16 / 20)


def test_empty_and_zero():
    d = skew_stats([])
    assert d["n"] == 0 and d["max_over_mean"] is None and d["argmax"] is None
    d = skew_stats([0, 0])
    assert d["sum"] == 0 and d["max_over_mean"] is None and d["gini"] is None


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.just(0.0), st.floats(min_value=1e-6, max_value=1e12)), min_size=1, max_size=40))
def test_matches_reference(x):
    if sum(x) <= 0:
        return
    d = skew_stats(x)
    r = ref(x)
    for k in ("max_over_mean", "min_over_mean", "cv", "gini", "jain", "max_share"):
        assert math.isclose(d[k], r[k], rel_tol=1e-9, abs_tol=1e-9), (k, d[k], r[k])
    assert x[d["argmax"]] == max(x)


def test_rows_with_mask():
    m = np.array([[0, 1, 1, 4], [2, 0, 2, 2], [1, 1, 0, 1], [3, 3, 3, 0]], dtype=float)
    rows = skew_rows(m, ~np.eye(4, dtype=bool))
    assert math.isclose(rows[0]["max_over_mean"], 4 / 2)
    assert rows[0]["argmax"] == 3                   # column index, not position in the row
    assert rows[1]["max_over_mean"] == 1.0
    assert rows[3]["n"] == 3


def test_weighted_median():
    v = np.array([1.0, 2.0, 3.0, 100.0])
    w = np.array([1.0, 1.0, 1.0, 0.5])
    assert weighted_median(v, w) == 2.0
    assert weighted_median(v, np.array([0.0, 0.0, 0.0, 1.0])) == 100.0
    key = np.array([1, 0, 1, 0, 2], dtype=np.int64)
    out = grouped_weighted_median(key, np.array([5.0, 1.0, 7.0, 3.0, np.nan]), np.ones(5), 4)
    assert out[0] in (1.0, 3.0) and out[1] in (5.0, 7.0)
    assert np.isnan(out[2]) and np.isnan(out[3])


# ---- the one interval-union kernel (analysis.intervals.union_kernel) -----------------------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as hst  # noqa: E402
from test_exporter import brute_busy as _brute_union  # noqa: E402  (one brute-force union for the tests)


@settings(max_examples=80, deadline=None)
@given(hst.lists(hst.tuples(hst.integers(-1, 3), hst.integers(0, 1000), hst.integers(0, 300)), max_size=60))
def test_keyed_busy_is_the_union_per_key(recs):
    """keyed_busy (float times, records in start order) = the brute-force union per key, with the
    first start and the union's end; key -1 is skipped."""
    from skewscope.analysis.intervals import keyed_busy
    recs = sorted(recs, key=lambda r: r[1])
    k = np.array([r[0] for r in recs], dtype=np.int64)
    s = np.array([r[1] for r in recs], dtype=np.float64)
    e = s + np.array([r[2] for r in recs], dtype=np.float64)
    busy, first, last = keyed_busy(k, s, e, 4)
    for key in range(4):
        iv = [(int(a), int(b)) for kk, a, b in zip(k, s, e) if kk == key]
        assert busy[key] == _brute_union(iv)
        if iv:
            assert first[key] == min(a for a, _ in iv) and last[key] == max(b for _, b in iv)
        else:
            assert np.isnan(first[key]) and np.isnan(last[key])
