"""The live per-interval rates of a flow table (`top`'s columns): bit/s, packets/s, CNP/s,
CE%, retransmits, NAKs and the most frequent message size, from an interval's counter
differences (sources/live.py flow_delta, whose row-wise subtraction is `subtract_counters`
here). The analysis' rates over a flow's active time are analysis/flows.py flow_event_stats."""
from __future__ import annotations

import numpy as np

from skewscope.core import layout as L
from skewscope.core.jit import njit


def counter_blocks(names) -> tuple:
    """The counter fields `names` of FLOW_DTYPE as runs of adjacent u64 words:
    ((byte offset, words), ...) -- three runs for the flow table's 25 counter fields."""
    runs: list[list[int]] = []
    for name in sorted(names, key=lambda n: L.FLOW_DTYPE.fields[n][1]):
        dt, off = L.FLOW_DTYPE.fields[name][:2]
        if dt.base != np.dtype("<u8"):
            raise TypeError(f"counter field {name} is {dt.base}, not u64")
        if runs and runs[-1][0] + 8 * runs[-1][1] == off:
            runs[-1][1] += dt.itemsize // 8
        else:
            runs.append([off, dt.itemsize // 8])
    return tuple((o, w) for o, w in runs)


@njit(cache=True, nogil=True)
def _subtract_rows(a, b, rows, use):
    for i in range(a.shape[0]):
        if use[i]:
            r = rows[i]
            for k in range(a.shape[1]):
                a[i, k] -= b[r, k]


@njit(cache=True, nogil=True)
def _kept(j, cur_pk, cur_first, prev_pk, prev_first):
    """Rows of cur with packets in the interval, and whether each subtracts its match."""
    n = j.shape[0]
    keep = np.empty(n, dtype=np.int64)
    sub = np.empty(n, dtype=np.bool_)
    k = 0
    for i in range(n):
        r = j[i]
        s = r >= 0 and cur_pk[i] >= prev_pk[r] and cur_first[i] == prev_first[r]
        if cur_pk[i] > (prev_pk[r] if s else 0):
            keep[k] = i
            sub[k] = s
            k += 1
    return keep[:k], sub[:k]


def kept_rows(j: np.ndarray, cur: np.ndarray, prev: np.ndarray):
    """(rows of cur with packets since prev, whether each is cur - prev[j]: matched and not
    re-created -- packets did not go down, first_ts unchanged -- else counted from zero)."""
    return _kept(np.ascontiguousarray(j, dtype=np.int64), cur["packets"], cur["first_ts"], prev["packets"],
                 prev["first_ts"])


@njit(cache=True, nogil=True, inline="always")
def _cmp(a, i, b, j):
    for k in range(a.shape[1]):
        if a[i, k] != b[j, k]:
            return -1 if a[i, k] < b[j, k] else 1
    return 0


@njit(cache=True, nogil=True)
def _sorted_join(a, b):
    out = np.full(b.shape[0], -1, dtype=np.int64)
    for i in range(1, a.shape[0]):
        if _cmp(a, i - 1, a, i) >= 0:
            return out, False
    for j in range(1, b.shape[0]):
        if _cmp(b, j - 1, b, j) >= 0:
            return out, False
    i = 0
    for j in range(b.shape[0]):
        while i < a.shape[0] and _cmp(a, i, b, j) < 0:
            i += 1
        if i < a.shape[0] and _cmp(a, i, b, j) == 0:
            out[j] = i
    return out, True


def sorted_join(a: np.ndarray, b: np.ndarray):
    """For each row of b the index of the equal row of a, or -1, by one merge of two row
    matrices ((n, k) uint64) that are both strictly increasing (compared word by word);
    None when either is not (then a hash join: core.snapshot.match_rows). The loader's flow
    tables are sorted by key (flows_from_raw), so two reads join in one sequential pass."""
    if not len(a) or not len(b):
        return None
    out, ok = _sorted_join(np.ascontiguousarray(a, dtype=np.uint64), np.ascontiguousarray(b, dtype=np.uint64))
    return out if ok else None


def _words(t: np.ndarray, off: int, nw: int) -> np.ndarray:
    # the table's 850-byte rows put these words at any byte alignment (x86 loads them as is)
    return np.ndarray((len(t), nw), "<u8", buffer=t, offset=off, strides=(t.dtype.itemsize, 8))


def subtract_counters(d: np.ndarray, p: np.ndarray, rows: np.ndarray, use: np.ndarray, blocks: tuple) -> None:
    """In place: d[i] -= p[rows[i]] over the counter words `blocks` (counter_blocks) of the
    rows with use[i]; d and p are C-contiguous FLOW_DTYPE tables. One pass over the rows,
    reading p where it is (numpy's per-field subtraction on these unaligned columns, after a
    gather of p's rows, was 8x slower)."""
    if not len(d) or not len(p):
        return
    use = np.ascontiguousarray(use, dtype=np.bool_)
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    for off, nw in blocks:
        _subtract_rows(_words(d, off, nw), _words(p, off, nw), rows, use)
