"""analysis.steps._rv_distance (numba) against the numpy form it replaced, written here: the
smallest multiple R of D such that every member's share of "starts after the message received
R columns back ended (within half a message)" is >= DEPENDENT_SHARE."""
import numpy as np
import pytest

from skewscope.analysis import steps


def _reference(S, E, RV, D, rmax):
    k = S.shape[2]
    for r in range(D, min(k - 1, rmax) + 1, D):
        dur = E[:, :, :k - r] - S[:, :, :k - r]
        ok = S[:, :, r:] >= RV[:, :, :k - r] - 0.5 * dur
        if float(ok.mean(axis=(0, 2)).min()) >= steps.DEPENDENT_SHARE:
            return r
    return None


def _ring(rng, na, nm, k, lag, jitter, nan_share=0.0):
    """Messages one after the other; a message received `lag` columns back ends just before
    a member's start (data flow) for most entries, noise elsewhere."""
    base = np.cumsum(rng.uniform(1.0, 2.0, size=(na, nm, k)), axis=2)
    S = base.copy()
    E = S + rng.uniform(0.2, 0.9, size=S.shape)
    RV = np.empty_like(S)
    RV[:, :, :k - lag] = S[:, :, lag:] - rng.uniform(-jitter, 0.3, size=(na, nm, k - lag))
    RV[:, :, k - lag:] = S[:, :, k - lag:]
    if nan_share:
        m = rng.random(S.shape) < nan_share
        S[m] = np.nan
    return S, E, RV


@pytest.mark.parametrize("seed", range(12))
def test_rv_distance_equals_numpy_form(seed):
    rng = np.random.default_rng(seed)
    na, nm, k = int(rng.integers(1, 5)), int(rng.integers(2, 9)), int(rng.integers(3, 60))
    D = int(rng.integers(1, 4))
    lag = D * int(rng.integers(1, max(2, k // D)))
    lag = min(lag, k - 1)
    S, E, RV = _ring(rng, na, nm, k, lag, jitter=float(rng.uniform(0, 3)),
                     nan_share=0.05 if seed % 3 == 0 else 0.0)
    for rmax in (D, 4 * D, k):
        assert steps._rv_distance(S, E, RV, D, rmax) == _reference(S, E, RV, D, rmax)


def test_rv_distance_finds_the_lag_and_none():
    rng = np.random.default_rng(99)
    S, E, RV = _ring(rng, 3, 6, 40, lag=6, jitter=0.0)
    assert steps._rv_distance(S, E, RV, 2, 40) == _reference(S, E, RV, 2, 40) is not None
    RV[:] = S.max() + 100.0          # everything received after every send: no dependency
    assert steps._rv_distance(S, E, RV, 2, 40) is None is _reference(S, E, RV, 2, 40)
