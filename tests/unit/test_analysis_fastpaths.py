"""The analysis' fast paths give their reference's exact result: matrix.sweep_order is
np.lexsort((dl, t, k)) (ties in input order), on whole-number and fractional times, ties,
negative times, huge spans."""
from __future__ import annotations

import numpy as np
import pytest

from skewscope.analysis.matrix import sweep_order


@pytest.mark.parametrize("seed", range(40))
def test_sweep_order_is_lexsort(seed):
    rng = np.random.default_rng(seed)
    m = int(rng.integers(0, 400))
    k = rng.integers(0, int(rng.integers(1, 40)), m).astype(np.int64)
    kind = seed % 5
    if kind == 0:      # epoch ns as float64 (above 2^53: every value whole)
        t = 1.7e18 + rng.integers(0, 10 ** 9, m).astype(np.float64) * 64
    elif kind == 1:    # few distinct times: many ties
        t = rng.integers(-3, 3, m).astype(np.float64)
    elif kind == 2:    # fractional
        t = rng.random(m) * 100
    elif kind == 3:    # a span too wide for the key
        t = rng.choice([0.0, 2.0 ** 60, -(2.0 ** 60)], m)
    else:
        t = np.round(rng.random(m) * 1e6)
        if m:
            t[int(rng.integers(0, m))] = 0.5
    dl = rng.choice(np.array([-1, 1], dtype=np.int64), m)
    assert np.array_equal(sweep_order(k, t, dl), np.lexsort((dl, t, k)))


def _same(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=True)


@pytest.mark.parametrize("seed", range(60))
def test_small_median_is_numpys(seed):
    import warnings

    from skewscope.analysis.stats import SMALL_MEDIAN, median, nanmedian
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, SMALL_MEDIAN + 3))
    kind = seed % 6
    if kind == 0:
        x = rng.random(n) * 1e9
    elif kind == 1:
        x = rng.integers(-5, 5, n).astype(np.float64)          # ties
    elif kind == 2:
        x = rng.integers(-(2 ** 62), 2 ** 62, n)                # ints whose sum overflows int64
    elif kind == 3:
        x = rng.integers(0, 100, n).astype(np.uint32)
    elif kind == 4:
        x = rng.random(n)
        x[rng.integers(0, n, max(1, n // 5))] = np.nan
    else:
        x = rng.choice([np.inf, -np.inf, 1.0, 2.5], n)
    r = median(x)
    assert type(r) is type(np.median(x)) and _same(r, np.median(x))
    assert _same(median(x, axis=0), np.median(x, axis=0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        if x.dtype == np.float64:
            m = x[: (n // 4) * 4].reshape(-1, 4) if n >= 4 else x.reshape(1, -1)
            for ax in (0, 1, -1):
                assert _same(nanmedian(m, axis=ax), np.nanmedian(m, axis=ax))
            assert _same(nanmedian(x), np.nanmedian(x))


def test_nanmedian_all_nan_rows_warn_as_numpy():
    import warnings

    from skewscope.analysis.stats import nanmedian
    m = np.array([[np.nan, np.nan], [1.0, np.nan], [np.nan, np.nan]])
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        got = nanmedian(m, axis=1)
    assert _same(got, np.array([np.nan, 1.0, np.nan]))
    assert [str(x.message) for x in w] == ["All-NaN slice encountered"] * 2
    assert w[0].filename == __file__


@pytest.mark.parametrize("seed", range(30))
def test_median_axis1_is_numpys(seed):
    from skewscope.analysis.stats import median_axis1
    rng = np.random.default_rng(seed)
    shape = (int(rng.integers(1, 6)), int(rng.integers(1, 40)), int(rng.integers(1, 30)))
    kind = seed % 3
    if kind == 0:
        x = rng.random(shape) * 1e9
    elif kind == 1:
        x = rng.integers(0, 4, shape).astype(np.float64)
    else:
        x = rng.choice([np.nan, np.inf, -np.inf, 0.0, 3.0], shape, p=[0.05, 0.1, 0.1, 0.35, 0.4])
    assert _same(median_axis1(x), np.median(x, axis=1))


@pytest.mark.parametrize("seed", range(20))
def test_one_pass_record_kernels_are_the_numpy_steps(seed):
    """timing._first_starts and steps._ring_records against the numpy steps they replace
    (mask, gathers, searchsorted side right - 1, where, first_start_per_key / csr_by_key)."""
    from skewscope.analysis.flows import csr_by_key
    from skewscope.analysis.steps import _ring_records
    from skewscope.analysis.timing import _first_starts, first_start_per_key
    rng = np.random.default_rng(seed)
    n, nf, nn = int(rng.integers(0, 3000)), int(rng.integers(1, 30)), int(rng.integers(2, 12))
    ev_flow = rng.integers(-1, nf, n).astype(np.int64)
    ev_data = (rng.random(n) < 0.8) & (ev_flow >= 0)
    start = np.sort(rng.integers(0, 10 ** 6, n)).astype(np.float64)
    if seed % 3 == 0:
        rng.shuffle(start)                       # not in start order
    end = start + rng.integers(0, 1000, n)
    nsrc = rng.integers(0, nn, nf).astype(np.int32)
    ndst = rng.integers(0, nn, nf).astype(np.int32)
    members = rng.choice(nn, int(rng.integers(1, nn + 1)), replace=False)
    pos = np.full(nn, -1, dtype=np.int64)
    pos[members] = np.arange(len(members))
    nm = len(members)
    bs = np.sort(rng.choice(np.arange(0, 10 ** 6, 997), int(rng.integers(1, 20)), replace=False)).astype(np.float64)
    fm = rng.random(nf) < 0.7
    ev_mask = rng.random(n) < 0.9
    for masked in (False, True):
        ok = ev_data & fm[np.maximum(ev_flow, 0)]
        if masked:
            ok &= ev_mask
        ff, st = ev_flow[ok], start[ok]
        b = np.searchsorted(bs, st, side="right") - 1
        mk = ev_mask if masked else np.ones(1, np.bool_)
        got = _first_starts(ev_data, ev_flow, fm, mk, masked, start, nsrc, ndst, pos, bs, nm)
        nk = len(bs) * nm
        rr = _ring_records(ev_data, ev_flow, fm, mk, masked, start, end, nsrc, ndst, pos, bs, nm)
        assert np.array_equal(rr[0], st) and np.array_equal(rr[1], end[ok])
        for side, g, (o_got, off_got) in zip((nsrc, ndst), got, ((rr[2], rr[3]), (rr[4], rr[5]))):
            mi = pos[side[ff]]
            key = np.where((mi >= 0) & (b >= 0), b * nm + mi, -1)
            assert np.array_equal(g, first_start_per_key(key, st, nk))
            o, off = csr_by_key(np.where(key >= 0, key, nk), nk + 1)
            assert np.array_equal(o_got, o) and np.array_equal(off_got, off)
