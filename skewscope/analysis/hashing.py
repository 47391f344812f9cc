"""Open-addressing hash tables in numba: unique/inverse of 128-bit keys (node indices) and
the distinct values of 64-bit keys with their counts (message sizes) in O(n) (np.unique
sorts: O(n log n) and several passes)."""
from __future__ import annotations

import numpy as np

from skewscope.core.jit import njit


@njit(cache=True, nogil=True, inline="always")
def _mix(x):
    # splitmix64 finaliser
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@njit(cache=True, nogil=True)
def _cap(n):
    c = 16
    while c < 2 * n + 1:
        c *= 2
    return c


#: first table size of unique_u128: node tables are small (a few hundred addresses for
#: 65,536 flows), a table sized for the worst case (2 n slots) costs more to allocate and
#: to miss in than the whole job; the table doubles when half full
_U128_START = 1024


@njit(cache=True, nogil=True)
def unique_u128(hi, lo):
    """ids[i] in 0..k-1 (order of first appearance), first[k] = index of first occurrence."""
    n = hi.shape[0]
    cap = min(_cap(n), _U128_START)
    slot_id = np.full(cap, -1, dtype=np.int64)
    slot_hi = np.zeros(cap, dtype=np.uint64)
    slot_lo = np.zeros(cap, dtype=np.uint64)
    ids = np.empty(n, dtype=np.int64)
    first = np.empty(n, dtype=np.int64)
    k = 0
    for i in range(n):
        x = hi[i]
        y = lo[i]
        if i > 0 and x == hi[i - 1] and y == lo[i - 1]:   # runs (flow tables are sorted by source)
            ids[i] = ids[i - 1]
            continue
        mask = np.uint64(cap - 1)
        j = np.int64(_mix(x ^ _mix(y)) & mask)
        while True:
            sid = slot_id[j]
            if sid < 0:
                slot_id[j] = k
                slot_hi[j] = x
                slot_lo[j] = y
                ids[i] = k
                first[k] = i
                k += 1
                break
            if slot_hi[j] == x and slot_lo[j] == y:
                ids[i] = sid
                break
            j = (j + 1) & (cap - 1)
        if 2 * k >= cap:                     # grow: re-insert the k keys into a table twice as big
            cap *= 2
            slot_id = np.full(cap, -1, dtype=np.int64)
            slot_hi = np.zeros(cap, dtype=np.uint64)
            slot_lo = np.zeros(cap, dtype=np.uint64)
            mask = np.uint64(cap - 1)
            for q in range(k):
                a = hi[first[q]]
                b = lo[first[q]]
                j = np.int64(_mix(a ^ _mix(b)) & mask)
                while slot_id[j] >= 0:
                    j = (j + 1) & (cap - 1)
                slot_id[j] = q
                slot_hi[j] = a
                slot_lo[j] = b
    return ids, first[:k]


#: first table size of count_u64: a capture's message records have a few distinct sizes
#: (a table sized for every record -- 2 x 8 MiB at 317,440 -- costs more in page faults than
#: the count); the table doubles when half full
_COUNT_START = 256


@njit(cache=True, nogil=True)
def count_u64(keys, mask):
    """The distinct values of keys[mask] in order of first appearance and how often each
    occurs: (values uint64[k], counts int64[k]) -- np.unique(return_counts=True) without its
    sort, in one pass over the keys where they lie (a record table's strided field)."""
    n = keys.shape[0]
    cap = _COUNT_START
    slot_id = np.full(cap, -1, dtype=np.int64)
    vals = np.empty(cap // 2, dtype=np.uint64)
    cnt = np.zeros(cap // 2, dtype=np.int64)
    k = 0
    for i in range(n):
        if not mask[i]:
            continue
        x = np.uint64(keys[i])
        j = np.int64(_mix(x) & np.uint64(cap - 1))
        while True:
            sid = slot_id[j]
            if sid < 0:
                slot_id[j] = k
                vals[k] = x
                cnt[k] = 1
                k += 1
                break
            if vals[sid] == x:
                cnt[sid] += 1
                break
            j = (j + 1) & (cap - 1)
        if 2 * k >= cap:                     # grow: re-insert the k values into a table twice as big
            cap *= 2
            slot_id = np.full(cap, -1, dtype=np.int64)
            v2 = np.empty(cap // 2, dtype=np.uint64)
            c2 = np.zeros(cap // 2, dtype=np.int64)
            v2[:k] = vals[:k]
            c2[:k] = cnt[:k]
            vals = v2
            cnt = c2
            for q in range(k):
                j = np.int64(_mix(vals[q]) & np.uint64(cap - 1))
                while slot_id[j] >= 0:
                    j = (j + 1) & (cap - 1)
                slot_id[j] = q
    return vals[:k].copy(), cnt[:k].copy()
