"""The offline parser's state: the numba kernel's tables (flow table with its LRU and index,
message records, flow instances, optional per-packet rows: kernel/__init__.py's docstring), grown
between scanner calls; the message records turned into the Snapshot's events; the
per-packet dissection dtype (dissect())."""
from __future__ import annotations

import numpy as np

from skewscope.core import layout as L
from skewscope.core.snapshot import flow_key_matrix
from skewscope.sources.offline import kernel as K

#: per-packet dissection (dissect()): -1 where a field does not apply (frame not RoCE, no RETH...)
PACKET_DTYPE = np.dtype([
    ("ts", "<i8"), ("category", "<i8"), ("wire_len", "<i8"), ("opcode", "<i8"), ("dest_qp", "<i8"),
    ("psn", "<i8"), ("reth_len", "<i8"), ("payload", "<i8"), ("syndrome", "<i8"), ("fb", "<i8"),
    ("sport", "<i8"), ("tclass", "<i8"), ("ipver", "<i8"), ("roce", "<i8"),
    ("src", "u1", (16,)), ("dst", "u1", (16,)),
])


class _Tables:
    """The numba kernel's state arrays (see kernel/__init__.py's docstring), with growth."""

    def __init__(self, max_flows: int, packets: int = 0, max_events: int = 1 << 23):
        self.g = np.zeros(L.G_N, np.int64)
        self.st = np.zeros(K.ST_N, np.int64)
        st = self.st
        st[K.ST_MAXF] = max_flows
        st[K.ST_EVMAX] = max_events
        st[K.ST_HEAD] = st[K.ST_TAIL] = -1
        st[K.ST_FIRST_TS] = -1
        self._alloc_flows(min(max_flows, 4096))
        # room for 2^20 message records from the start: zeros from calloc take memory only where
        # written, and each doubling copies the records on the pipeline's serial thread
        self.ev = np.zeros((max(1, min(1 << 20, max_events)), 5), np.int64)
        st[K.ST_EVCAP] = len(self.ev)
        self.ikeys = np.zeros((4096, 5), np.int64)
        st[K.ST_INSTCAP] = len(self.ikeys)
        self.pk = np.zeros((max(packets, 0), K.PK_N), np.int64)
        st[K.ST_PKCAP] = packets
        self.pk_limit = None

    def _alloc_flows(self, cap: int, old=None):
        hsize = 1 << max(4, int(2 * cap - 1).bit_length())
        self.hidx = np.zeros(hsize, np.int32)
        self.fhash = np.zeros(cap, np.int64)
        self.keys = np.zeros((cap, 5), np.int64)
        self.S = _aligned_zeros(cap, K.NCOL)
        self.lprev = np.full(cap, -1, np.int32)
        self.lnext = np.full(cap, -1, np.int32)
        self.finst = np.zeros(cap, np.int64)
        if old is not None:
            n = int(self.st[K.ST_NUSED])
            for name in ("fhash", "keys", "S", "lprev", "lnext", "finst"):
                getattr(self, name)[:n] = getattr(old, name)[:n]
        self.st[K.ST_CAP] = cap
        self.st[K.ST_HMASK] = hsize - 1
        K.rebuild_index(self.st, self.hidx, self.fhash)

    def grow(self):
        st = self.st
        if st[K.ST_NUSED] >= st[K.ST_CAP] and st[K.ST_CAP] < st[K.ST_MAXF]:
            old = _Old(self)
            self._alloc_flows(int(min(st[K.ST_MAXF], 2 * st[K.ST_CAP])), old)
        if st[K.ST_INSTN] >= st[K.ST_INSTCAP]:
            self.ikeys = np.concatenate([self.ikeys, np.zeros_like(self.ikeys)])
            st[K.ST_INSTCAP] = len(self.ikeys)
        if st[K.ST_EVN] >= st[K.ST_EVCAP] and st[K.ST_EVCAP] < st[K.ST_EVMAX]:
            grow = min(len(self.ev), int(st[K.ST_EVMAX]) - len(self.ev))
            self.ev = np.concatenate([self.ev, np.zeros((grow, 5), np.int64)])
            st[K.ST_EVCAP] = len(self.ev)
        if st[K.ST_PKCAP] > 0 and st[K.ST_PKN] >= st[K.ST_PKCAP]:
            if self.pk_limit is not None and st[K.ST_PKN] >= self.pk_limit:
                raise _Full()
            want = 2 * len(self.pk) if self.pk_limit is None else min(2 * len(self.pk), self.pk_limit)
            self.pk = np.concatenate([self.pk, np.zeros((want - len(self.pk), K.PK_N), np.int64)])
            st[K.ST_PKCAP] = len(self.pk)

    def args(self):
        return (self.g, self.st, self.hidx, self.fhash, self.keys, self.S, self.lprev, self.lnext,
                self.finst, self.ikeys, self.ev, self.pk, _OPTAB)


def _aligned_zeros(rows: int, cols: int) -> np.ndarray:
    """int64[rows, cols] of zeros starting on a 64-byte boundary (with rows of a multiple of 8
    columns, every row starts a cache line: a packet's first fields are one line, not two)."""
    buf = np.zeros(rows * cols + 8, np.int64)
    off = (-buf.ctypes.data % 64) // 8
    return buf[off:off + rows * cols].reshape(rows, cols)


class _Old:
    def __init__(self, t: _Tables):
        for name in ("fhash", "keys", "S", "lprev", "lnext", "finst"):
            setattr(self, name, getattr(t, name))


_OPTAB = np.ascontiguousarray(L.OPCODE_TABLE, dtype=np.uint32)
_NO_IF = np.zeros(1, np.int64)


class _Full(Exception):
    """dissect(): the requested number of packets has been read."""


def _events(flows: np.ndarray, ikeys: np.ndarray, ev: np.ndarray) -> np.ndarray:
    """Message records -> EVENT_DTYPE with flow = row of the record's key in `flows` (-1 when
    that key is not in the table: evicted), sorted by start_ts (stable), exactly as
    snapshot.events_from_records does for the kernel's records; matched per flow instance
    (few) instead of per record (many)."""
    n = len(ev)
    out = np.zeros(n, dtype=L.EVENT_DTYPE)
    if n == 0:
        return out
    fk = flow_key_matrix(flows).view("<i8").reshape(len(flows), 5)
    ik = np.ascontiguousarray(ikeys).astype("<i8")
    allk = np.concatenate([fk, ik])
    _, inv = np.unique(allk, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    table = np.full(int(inv.max()) + 1, -1, dtype=np.int32)
    table[inv[:len(fk)]] = np.arange(len(fk), dtype=np.int32)
    inst_row = table[inv[len(fk):]]
    out["flow"] = inst_row[ev[:, 0]]
    out["opclass"] = ev[:, 1]
    out["start_ts"] = ev[:, 2]
    out["end_ts"] = ev[:, 3]
    out["bytes"] = ev[:, 4]
    start = ev[:, 2]
    if np.any(start[1:] < start[:-1]):   # (usually in order already: the copy costs ~10 ms per 300 k)
        out = out[np.argsort(out["start_ts"], kind="stable")]
    return out
