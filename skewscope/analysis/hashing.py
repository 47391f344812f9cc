"""Open-addressing hash tables in numba: unique/inverse of 64- and 128-bit keys in O(n)
(np.unique sorts: O(n log n) and several passes), used for node and node-pair indices."""
from __future__ import annotations

import numpy as np

from skewscope.core.jit import njit, prefetch

_EMPTY = np.int64(-1)
#: build_u64/lookup_u64 prefetch the slot of the key this many keys ahead
PROBE_AHEAD = 8


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


@njit(cache=True, nogil=True)
def build_u64(keys):
    """Table over keys: (slot key, slot id, ids per key, first occurrence per id)."""
    n = keys.shape[0]
    cap = _cap(n)
    mask = np.uint64(cap - 1)
    slot_id = np.full(cap, -1, dtype=np.int64)
    slot_key = np.zeros(cap, dtype=np.uint64)
    ids = np.empty(n, dtype=np.int64)
    first = np.empty(n, dtype=np.int64)
    # the slots are random accesses into tables bigger than L2 (2 x 4 MiB at 262,144 keys):
    # hash every key first and prefetch PROBE_AHEAD keys ahead, so the misses overlap
    h = np.empty(n, dtype=np.int64)
    for i in range(n):
        h[i] = np.int64(_mix(keys[i]) & mask)
    k = 0
    for i in range(n):
        if i + PROBE_AHEAD < n:
            prefetch(slot_id, h[i + PROBE_AHEAD])
            prefetch(slot_key, h[i + PROBE_AHEAD])
        x = keys[i]
        j = h[i]
        while True:
            sid = slot_id[j]
            if sid < 0:
                slot_id[j] = k
                slot_key[j] = x
                ids[i] = k
                first[k] = i
                k += 1
                break
            if slot_key[j] == x:
                ids[i] = sid
                break
            j = (j + 1) & (cap - 1)
    return slot_key, slot_id, ids, first[:k]


@njit(cache=True, nogil=True)
def lookup_u64(slot_key, slot_id, q):
    """id of each query key in a build_u64 table, -1 when absent."""
    cap = slot_id.shape[0]
    mask = np.uint64(cap - 1)
    out = np.empty(q.shape[0], dtype=np.int64)
    n = q.shape[0]
    h = np.empty(n, dtype=np.int64)
    for i in range(n):
        h[i] = np.int64(_mix(q[i]) & mask)
    for i in range(n):
        if i + PROBE_AHEAD < n:
            prefetch(slot_id, h[i + PROBE_AHEAD])
            prefetch(slot_key, h[i + PROBE_AHEAD])
        x = q[i]
        j = h[i]
        r = -1
        while True:
            sid = slot_id[j]
            if sid < 0:
                break
            if slot_key[j] == x:
                r = sid
                break
            j = (j + 1) & (cap - 1)
        out[i] = r
    return out


def sorted_unique_u64(keys):
    """(unique keys sorted, inverse) like np.unique(return_inverse=True), in O(n + k log k)."""
    keys = np.ascontiguousarray(keys, dtype=np.uint64)
    if len(keys) == 0:
        return keys, np.zeros(0, np.int64)
    _, _, ids, first = build_u64(keys)
    uk = keys[first]
    order = np.argsort(uk, kind="stable")
    rank = np.empty(len(uk), dtype=np.int64)
    rank[order] = np.arange(len(uk))
    return uk[order], rank[ids]
