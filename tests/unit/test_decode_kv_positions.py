"""KV interference on a decode group without ring steps (analysis.detectors.decode):
token_positions rebuilds the tokens from the spacings no transfer touches, and
stretch_by_position compares each covered spacing with the clean ones at its position in
the token. Synthetic spacings whose token structure and stretch are known by construction:
tensor-parallel decode spaces its two all-reduces per layer differently (attention, MLP),
so a median over all spacings mixes two classes and a covered set drawn from the longer
class would look stretched; by position it does not."""
from __future__ import annotations

import numpy as np
import pytest

from skewscope.analysis.detectors.decode import _tail, stretch_by_position, token_positions

T = {"kv_ratio": 1.5, "kv_min_intervals": 4, "kv_chance": 0.001}


def tokens(n_tokens=6, n=12, short=3_000.0, long=11_000.0, gap=2_000_000.0, jitter=0.02, seed=0):
    """Spacings of n_tokens tokens of n collectives each: n - 1 inside a token alternating
    short / long (the two all-reduces of a layer), then the compute gap to the next token."""
    rng = np.random.default_rng(seed)
    one = [short if k % 2 == 0 else long for k in range(n - 1)] + [gap]
    d = np.tile(np.asarray(one), n_tokens)
    return d * (1 + jitter * rng.standard_normal(len(d)))


def test_positions_follow_the_token_grid():
    n = 12
    d = tokens(n=n)
    pos = token_positions(d, np.ones(len(d), dtype=bool))
    assert pos is not None
    assert np.array_equal(pos, np.arange(len(d)) % n)          # boundary = position n - 1
    # a covered stretch (tokens 2-3, boundary included) does not move the grid
    ov = np.zeros(len(d))
    ov[2 * n:4 * n] = 1.0
    d2 = d.copy()
    d2[2 * n:4 * n] *= 40
    assert np.array_equal(token_positions(d2, ov <= 0), pos)


def test_no_grid_no_positions():
    d = tokens(n_tokens=2)                                      # 2 clean boundaries: too few
    assert token_positions(d, np.ones(len(d), dtype=bool)) is None
    # tokens of 10, 15 and 12 collectives: boundaries on no common grid
    parts = [tokens(n_tokens=1, n=k, seed=k) for k in (10, 15, 12, 10)]
    d = np.concatenate(parts)
    assert token_positions(d, np.ones(len(d), dtype=bool)) is None


def test_stretch_between_allreduces_is_found():
    n = 12
    d = tokens(n=n)
    ov = np.zeros(len(d))
    cov = slice(2 * n, 4 * n)
    ov[cov] = d[cov]                                            # two tokens under KV
    d2 = d.copy()
    long_pos = (np.arange(len(d)) % n) % 2 == 1
    sel = np.zeros(len(d), dtype=bool)
    sel[cov] = True
    d2[sel & long_pos] *= 8                                     # only the spacings before an all-reduce
    ov[cov] = d2[cov]
    res = stretch_by_position(d2, ov, T)
    assert res is not None and res["ratio"] > 3
    assert int(res["over"].sum()) == 2 * (n - 1)
    want = float((d2[sel] - d[sel]).sum())
    assert res["extra"] == pytest.approx(want, rel=0.1)


@pytest.mark.parametrize("seed", range(40))
def test_unstretched_long_class_is_not_interference(seed):
    """Transfers covering only the longer spacings of the layer (and some boundaries),
    stretching nothing: no finding, though their median is ~3.7x the clean median."""
    n = 12
    d = tokens(n_tokens=8, n=n, seed=seed)
    rng = np.random.default_rng(100 + seed)
    pos = np.arange(len(d)) % n
    pick = np.nonzero((pos % 2 == 1) | (pos == n - 1))[0]
    pick = rng.choice(pick, size=12, replace=False)
    ov = np.zeros(len(d))
    ov[pick] = d[pick]
    cover_inner = pick[pos[pick] != n - 1]
    clean_inner = np.nonzero((ov <= 0) & (pos != n - 1))[0]
    assert np.median(d[cover_inner]) > 3 * np.median(d[clean_inner])   # what median-vs-median would see
    assert stretch_by_position(d, ov, T) is None


def test_binomial_tail():
    assert _tail(0, 10, 0.3) == 1.0
    assert _tail(10, 10, 0.3) == pytest.approx(0.3 ** 10)
    assert _tail(1, 5, 0.2) == pytest.approx(1 - 0.8 ** 5)
