"""analysis.stats.median / nanmedian / percentile against numpy's own (np.median, np.nanmedian,
np.percentile, np.unique) on random inputs: ints, floats, float32, NaN, inf, even/odd, empty, axis; and
that analyze() on a generated capture no longer imports numpy.ma."""
import subprocess
import sys
import warnings

import numpy as np
import pytest

from skewscope.analysis.stats import median, nanmedian, percentile, unique


def _same(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    assert np.array_equal(a, b, equal_nan=True), (a, b)


def _inputs(rng):
    for n in (1, 2, 3, 4, 5, 6, 7, 8, 31, 32, 33, 600, 601):
        yield rng.integers(-50, 50, n)
        yield rng.integers(0, 2**40, n).astype(np.uint64)
        yield rng.normal(0, 1e6, n)
        yield rng.normal(0, 1, n).astype(np.float32)
        x = rng.normal(0, 1, n)
        x[rng.random(n) < 0.3] = np.nan
        yield x
        x = rng.integers(0, 4, n).astype(np.float64)    # ties
        x[rng.random(n) < 0.1] = np.inf
        yield x


def test_median_matches_numpy():
    rng = np.random.default_rng(7)
    for x in _inputs(rng):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            _same(median(x), np.median(x))
            _same(nanmedian(x), np.nanmedian(x))
    for x in (np.array([np.nan]), np.full(4, np.nan), np.array([1.0, np.nan, 3.0])):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            _same(median(x), np.median(x))
            _same(nanmedian(x), np.nanmedian(x))


def test_median_empty():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for x in (np.array([], dtype=np.float64), np.array([], dtype=np.int64)):
            _same(median(x), np.median(x))
        _same(median(np.zeros((0, 3)), axis=1), np.median(np.zeros((0, 3)), axis=1))


@pytest.mark.parametrize("shape", [(5, 4), (4, 5), (3, 7, 2), (1, 6), (6, 1)])
def test_median_axis_matches_numpy(shape):
    rng = np.random.default_rng(sum(shape))
    for _ in range(20):
        x = rng.normal(0, 100, shape)
        x[rng.random(shape) < 0.2] = np.nan
        x[0] = np.nan                                   # an all-NaN slice along axis 1+
        xi = rng.integers(-9, 9, shape)
        for axis in range(-len(shape), len(shape)):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                _same(median(x, axis=axis), np.median(x, axis=axis))
                _same(nanmedian(x, axis=axis), np.nanmedian(x, axis=axis))
                _same(median(xi, axis=axis), np.median(xi, axis=axis))
                _same(nanmedian(xi, axis=axis), np.nanmedian(xi, axis=axis))


def test_percentile_matches_numpy():
    rng = np.random.default_rng(3)
    for x in _inputs(rng):
        for q in (0, 1, 10, 25, 50, 75, 90, 95, 99, 99.9, 100, 33.3):
            _same(percentile(x, q), np.percentile(x, q))


def test_unique_matches_numpy():
    rng = np.random.default_rng(5)
    for x in _inputs(rng):
        _same(unique(x), np.unique(x))
        _same(unique(x.reshape(1, -1)), np.unique(x.reshape(1, -1)))
    for x in (np.array([], dtype=np.int64), np.array([], dtype=np.float64), np.full(3, np.nan), [3, 1, 3]):
        _same(unique(x), np.unique(x))


#: run in a fresh interpreter: numpy's lazy `np.ma` lookups recorded (numba's own type check,
#: which the precompiled kernels skip, answered with an empty MaskedArray class and let pass)
_MA_PROBE = """
import sys, traceback, types
import numpy
bad = []
class _Masked:
    pass
fake = types.SimpleNamespace(MaskedArray=_Masked, is_masked=lambda a: False, isMaskedArray=lambda a: False)
def getattr_(name):
    if name != "ma":
        return orig(name)
    st = traceback.extract_stack()[:-1]
    if not any("/numba/" in f.filename for f in st):
        bad.append("".join(traceback.format_list(st[-4:])))
    return fake
orig = numpy.__getattr__
numpy.__getattr__ = getattr_
from skewscope.cli.common import load_source
from skewscope.analysis import analyze
from skewscope.outputs import report
s = load_source(sys.argv[1], progress=False)
report.to_json(s, analyze(s))
print("numpy.ma" in sys.modules, len(bad))
print("\\n".join(bad[:3]), file=sys.stderr)
"""


def test_analyze_does_not_import_numpy_ma(tmp_path):
    """numpy.ma costs ~12 ms of a fresh `report`: the analysis of a generated ring must not
    reach for it (np.median/nanmedian/percentile/unique did)."""
    cap = tmp_path / "ring.pcap"
    subprocess.run([sys.executable, "-m", "skewscope.gen", "ring-straggler", "-o", str(cap)], check=True,
                   capture_output=True)
    r = subprocess.run([sys.executable, "-c", _MA_PROBE, str(cap)], capture_output=True, text=True)
    assert r.stdout.split() == ["False", "0"], r.stderr
