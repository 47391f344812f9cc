"""The exporter's per-flow columns and flow-table keys: the counter columns accumulated per
peer (SCALARS/COL, the message-size and gap histogram slots), their Prometheus bucket
bounds, flow classes, peer/destination ids and per-peer busy time (outputs/exporter.py
accumulates them; outputs/expose.py renders them)."""
from __future__ import annotations

from collections import namedtuple

import numpy as np
from prometheus_client.utils import floatToGoString

from skewscope.analysis.fleet import BULK_MIN_MESSAGE, CTS_MAX_BYTES
from skewscope.analysis.flows import flow_event_stats
from skewscope.analysis.intervals import union_kernel
from skewscope.core import layout as L
from skewscope.core.jit import njit, prefetch, prefetch_span
from skewscope.core.snapshot import _KEY_PREFIX, Snapshot
from skewscope.outputs import metrics as M

DEFAULT_TOP_K = 10
DEFAULT_MAX_PEERS = 4096
OVERFLOW_LABEL = M.OVERFLOW_LABEL

# Per-flow counter columns accumulated per peer (name in FLOW_DTYPE).
SCALARS = ("packets", "bytes", "payload_bytes", "messages", "msg_bytes", "ce", "cnp",
           "retransmissions", "psn_gaps", "nak_seq", "nak_rnr", "nak_other")
COL = {n: i for i, n in enumerate(SCALARS)}
MSG0 = len(SCALARS)
GAP0 = MSG0 + L.MSG_SLOTS
NCOLS = GAP0 + L.GAP_SLOTS

# Families, names, labels and help: outputs.metrics (the metric table). Per-pair and
# per-flow counters read the FLOW_DTYPE column of their spec's "flows.<column>" source.
NAK_SYNDROMES = tuple(zip(M.SYNDROMES, ("nak_seq", "nak_rnr", "nak_other")))
PFC_FAMILIES = ((M.PFC_PAUSE_FRAMES, L.G_PFC_PAUSE), (M.PFC_RESUME_FRAMES, L.G_PFC_XON),
                (M.PFC_PAUSE_QUANTA, L.G_PFC_QUANTA))


def _le_bounds(nslots: int) -> list[int]:
    """Exact upper bounds of the finite log2 slots (all but the last, which is +Inf)."""
    return [(1 << s) - 1 for s in range(nslots - 1)]


MSG_LE = _le_bounds(L.MSG_SLOTS)
GAP_LE_NS = _le_bounds(L.GAP_SLOTS)


def fmt_le(v: float) -> str:
    return floatToGoString(v)


MSG_LE_STR = [fmt_le(v) for v in MSG_LE] + ["+Inf"]
GAP_LE_STR = [fmt_le(v / 1e9) for v in GAP_LE_NS] + ["+Inf"]


def cumulative_buckets(slots: np.ndarray, le_str: list[str]) -> list[tuple[str, float]]:
    """log2 slot counts -> Prometheus cumulative buckets, every bucket present."""
    c = np.cumsum(np.asarray(slots, dtype=np.float64))
    return list(zip(le_str, c.tolist()))


# ---- tables ---------------------------------------------------------------------------
#: rows ahead _add_rows prefetches (850-byte rows: the hardware prefetcher stops at each page)
_PREFETCH_ROWS = 4
#: the NCOLS columns as u64 words of two strided views of a row: the SCALARS from the first
#: one's offset (all 8k bytes apart), msg_hist then gap_hist (adjacent in the row)
_SCAL_FIRST = min(SCALARS, key=lambda n: L.FLOW_DTYPE.fields[n][1])
_SCAL0 = L.FLOW_DTYPE.fields[_SCAL_FIRST][1]
_SCAL_WORDS = np.array([(L.FLOW_DTYPE.fields[n][1] - _SCAL0) // 8 for n in SCALARS], dtype=np.int64)
_HIST0 = L.FLOW_DTYPE.fields["msg_hist"][1]
if (any((L.FLOW_DTYPE.fields[n][1] - _SCAL0) % 8 for n in SCALARS)
        or L.FLOW_DTYPE.fields["gap_hist"][1] != _HIST0 + 8 * L.MSG_SLOTS):
    raise ImportError("exptables: FLOW_DTYPE's counter layout is not the one _add_rows reads")


@njit(cache=True, nogil=True)
def _add_rows(sw, sidx, hw, peer, counts, overflow, totals, raw, rs):
    """Each row's columns (sw[i, sidx[c]], then hw[i, :]) into totals and into its peer's
    row of counts (or overflow): straight loops over u64 words, no per-column dispatch; a
    word that is 0 (most histogram slots of a flow) is read and skipped, not added twice."""
    over = False
    ns, nh = sidx.shape[0], hw.shape[1]
    n = peer.shape[0]
    for i in range(n):
        if i + _PREFETCH_ROWS < n:
            b = (i + _PREFETCH_ROWS) * rs
            for o in range(0, rs, 64):
                prefetch(raw, b + o)
        p = peer[i]
        if p >= 0:
            for c in range(ns):
                v = sw[i, sidx[c]]
                if v != 0:
                    totals[c] += v
                    counts[p, c] += v
            for c in range(nh):
                v = hw[i, c]
                if v != 0:
                    totals[ns + c] += v
                    counts[p, ns + c] += v
        else:
            over = True
            for c in range(ns):
                v = sw[i, sidx[c]]
                if v != 0:
                    totals[c] += v
                    overflow[c] += v
            for c in range(nh):
                v = hw[i, c]
                if v != 0:
                    totals[ns + c] += v
                    overflow[ns + c] += v
    return over


def add_flow_counters(flows: np.ndarray, peer: np.ndarray, counts: np.ndarray, overflow: np.ndarray,
                      totals: np.ndarray) -> bool:
    """In place, each flow's NCOLS counter columns (SCALARS, msg_hist, gap_hist) into its
    peer's row of counts (peer -1: into overflow) and into totals; True when a flow went to
    overflow. One pass over the table's rows (a (flows, NCOLS) matrix first, then np.add.at
    and column sums: 1.2 s at 1,048,576 flows)."""
    if not len(flows):
        return False
    f = np.ascontiguousarray(flows, dtype=L.FLOW_DTYPE)
    return bool(_add_rows(_col(f, _SCAL_FIRST, int(_SCAL_WORDS.max()) + 1), _SCAL_WORDS,
                          _col(f, "msg_hist", L.MSG_SLOTS + L.GAP_SLOTS), np.ascontiguousarray(peer, dtype=np.int64),
                          counts, overflow, totals, f.view(np.uint8).reshape(-1), f.dtype.itemsize))


def _rows_u64(a: np.ndarray) -> np.ndarray:
    """(n, k) uint8 with k % 8 == 0 -> (n, k/8) uint64 (row identity only, not order)."""
    return np.ascontiguousarray(a).view("<u8").reshape(len(a), a.shape[1] // 8)


# Traffic class of a flow (the `class` label of the per-peer series), from its cumulative
# mean message size: NCCL runs each connection on its own QPs, so one flow carries one
# kind of traffic, and a node pair that carries a ring link and all-to-all chunks at once
# keeps them apart.
CLASSES = M.CLASSES
CLS_BULK, CLS_CHUNK, CLS_CONTROL = range(3)


def flow_class(flows: np.ndarray) -> np.ndarray:
    """bulk: mean message >= analysis.fleet.BULK_MIN_MESSAGE (ring/tree SIMPLE slices);
    chunk: other messages with mean > analysis.flows.CTS_MAX_BYTES (all-to-all, P2P, LL);
    control: everything else (NCCL clear-to-send writes, ACK/NAK, CNP, no messages)."""
    if len(flows) and flows.dtype == L.FLOW_DTYPE and flows.flags.c_contiguous:
        # one pass over the rows (the numpy version's 5 temporaries: 2x the time at 1,048,576 flows)
        c = np.empty(len(flows), dtype=np.uint8)
        _class_kernel(_col(flows, "messages", 1)[:, 0], _col(flows, "msg_bytes", 1)[:, 0],
                      float(CTS_MAX_BYTES), float(BULK_MIN_MESSAGE), c)
        return c
    m = flows["messages"].astype(np.float64)
    mean = np.where(m > 0, flows["msg_bytes"].astype(np.float64) / np.maximum(m, 1), 0.0)
    c = np.full(len(flows), CLS_CONTROL, dtype=np.uint8)
    c[mean > CTS_MAX_BYTES] = CLS_CHUNK
    c[mean >= BULK_MIN_MESSAGE] = CLS_BULK
    return c


@njit(cache=True, nogil=True, inline="always")
def _cls(msgs, msg_bytes, cts_max, bulk_min):
    """flow_class of one flow from its messages and message bytes."""
    m = np.float64(msgs)
    mean = np.float64(msg_bytes) / max(m, 1.0) if m > 0 else 0.0
    c = CLS_CONTROL
    if mean > cts_max:
        c = CLS_CHUNK
    if mean >= bulk_min:
        c = CLS_BULK
    return c


@njit(cache=True, nogil=True)
def _class_kernel(msgs, msg_bytes, cts_max, bulk_min, out):
    n = msgs.shape[0]
    for i in range(n):
        if i + 16 < n:
            prefetch(msgs, i + 16)
        out[i] = _cls(msgs[i], msg_bytes[i], cts_max, bulk_min)


@njit(cache=True, nogil=True)
def _join_class(cm, cb, j, dm, db, cts_max, bulk_min, out):
    n = j.shape[0]
    for k in range(n):
        if k + 16 < n and j[k + 16] >= 0:
            prefetch(cm, j[k + 16])
        r = j[k]
        out[k] = _cls(cm[r], cb[r], cts_max, bulk_min) if r >= 0 else _cls(dm[k], db[k], cts_max, bulk_min)


def _whole(t: np.ndarray) -> bool:
    return t.dtype == L.FLOW_DTYPE and t.flags.c_contiguous


def joined_class(cum: np.ndarray, j: np.ndarray, delta: np.ndarray) -> np.ndarray:
    """Per row k of delta: flow_class of cum[j[k]] (its cumulative row: the stable class),
    flow_class of delta[k] where j[k] is -1; one pass over the joined rows, not a class of
    the whole cumulative table first."""
    if not (len(delta) and _whole(cum) and _whole(delta)):
        c = flow_class(delta)
        c[j >= 0] = flow_class(cum)[j[j >= 0]]
        return c
    out = np.empty(len(delta), dtype=np.uint8)
    col = lambda t, name: _col(t, name, 1)[:, 0] if len(t) else np.zeros(1, np.uint64)  # noqa: E731
    _join_class(col(cum, "messages"), col(cum, "msg_bytes"), np.ascontiguousarray(j, dtype=np.int64),
                col(delta, "messages"), col(delta, "msg_bytes"), float(CTS_MAX_BYTES), float(BULK_MIN_MESSAGE), out)
    return out


def peer_ids(flows: np.ndarray, cls: np.ndarray | None = None) -> np.ndarray:
    """(n, 5) uint64 identity of each flow's peer series: src, dst, ipver, class."""
    k = np.zeros((len(flows), 40), dtype=np.uint8)
    k[:, 0:16] = flows["src"]
    k[:, 16:32] = flows["dst"]
    k[:, 32] = flows["ipver"]
    if cls is not None:
        k[:, 33] = cls
    return _rows_u64(k)


@njit(cache=True, nogil=True)
def _mix_row(w):
    h = np.uint64(0)
    for c in range(w.shape[0]):
        h ^= w[c]
        h *= np.uint64(0x9E3779B97F4A7C15)
        h ^= h >> np.uint64(29)
    return h


@njit(cache=True, nogil=True)
def _slots(table):
    """An open-addressing index of table's rows ((m, k) uint64, distinct): slot -> row, -1."""
    m = table.shape[0]
    cap = 16
    while cap < 2 * m:
        cap *= 2
    slots = np.full(cap, -1, dtype=np.int64)
    for r in range(m):
        j = np.int64(_mix_row(table[r]) & np.uint64(cap - 1))
        while slots[j] >= 0:
            j = (j + 1) & (cap - 1)
        slots[j] = r
    return slots


@njit(cache=True, nogil=True, inline="always")
def _find(slots, table, w):
    """The row of table equal to w, or -1 (slots: _slots(table))."""
    cap = slots.shape[0]
    j = np.int64(_mix_row(w) & np.uint64(cap - 1))
    while slots[j] >= 0:
        r = slots[j]
        same = True
        for c in range(w.shape[0]):
            if table[r, c] != w[c]:
                same = False
                break
        if same:
            return r
        j = (j + 1) & (cap - 1)
    return -1


@njit(cache=True, nogil=True)
def _key_rows(a, b, ipv, extra, table):
    """Row of `table` ((m, k) uint64, distinct rows) equal to each flow's id, or -1. The id
    of flow i, in the layout of peer_ids (k = 5) / dst_ids (k = 3): the words a[i] (src or
    dst: 2 words), b[i] (dst, k = 5 only), then ipver | extra[i] << 8. a, b, ipv are
    strided views into the table's rows: no (n, k) id matrix is built and nothing sorted."""
    k = table.shape[1]
    slots = _slots(table)
    n = a.shape[0]
    out = np.full(n, -1, dtype=np.int64)
    w = np.zeros(k, dtype=np.uint64)
    for i in range(n):
        if i + 16 < n:
            prefetch(ipv, i + 16)   # 850-byte rows: the hardware prefetcher stops at each page
        w[0] = a[i, 0]
        w[1] = a[i, 1]
        if k == 5:
            w[2] = b[i, 0]
            w[3] = b[i, 1]
        w[k - 1] = np.uint64(ipv[i]) | (np.uint64(extra[i]) << np.uint64(8))
        out[i] = _find(slots, table, w)
    return out


@njit(cache=True, nogil=True)
def _key_rows3(src, dst, ipv, cls, tp, td, ts, pr, dr, sr):
    """_key_rows of the peer, destination and source ids in one pass over the rows."""
    sp, sd, ss = _slots(tp), _slots(td), _slots(ts)
    wp = np.zeros(5, dtype=np.uint64)
    w3 = np.zeros(3, dtype=np.uint64)
    n = src.shape[0]
    for i in range(n):
        if i + 16 < n:
            prefetch(ipv, i + 16)
        v = np.uint64(ipv[i])
        wp[0], wp[1], wp[2], wp[3] = src[i, 0], src[i, 1], dst[i, 0], dst[i, 1]
        wp[4] = v | (np.uint64(cls[i]) << np.uint64(8))
        pr[i] = _find(sp, tp, wp)
        w3[0], w3[1], w3[2] = dst[i, 0], dst[i, 1], v
        dr[i] = _find(sd, td, w3)
        w3[0], w3[1] = src[i, 0], src[i, 1]
        sr[i] = _find(ss, ts, w3)


#: the flow key's u64 words at the start of a FLOW_DTYPE row (flow_key_words' layout), and
#: per word the bits that are key bytes (those past _KEY_PREFIX: the key's padding, 0)
_KEY_NW = L.FLOW_KEY_DTYPE.itemsize // 8
_KEY_FIRST = min(L.FLOW_DTYPE.names, key=lambda n: L.FLOW_DTYPE.fields[n][1])   # (at offset 0)
_KEY_MASK = np.array([sum(0xFF << (8 * b) for b in range(8) if 8 * c + b < _KEY_PREFIX) for c in range(_KEY_NW)],
                     dtype=np.uint64)


@njit(cache=True, nogil=True)
def _match_key_rows(kw, raw, rs, rows, mask, table, keys, j):
    """keys[k] = the key words of row rows[k] (kw[r] & mask); j[k] = the row of table
    ((m, nw) uint64, distinct rows) equal to them, or -1: a hash index of table, one
    look-up per row (no sort)."""
    slots = _slots(table)
    nw = mask.shape[0]
    n = rows.shape[0]
    for k in range(n):
        if k + 16 < n:
            prefetch_span(raw, rows[k + 16] * rs, nw * 8)
        r = rows[k]
        for c in range(nw):
            keys[k, c] = kw[r, c] & mask[c]
        j[k] = _find(slots, table, keys[k])


def match_key_rows(t: np.ndarray, rows: np.ndarray, table: np.ndarray) -> tuple | None:
    """(flow_key_words(t[rows]), match_rows(table, those)) in one pass over the rows' key
    bytes, by a hash index of table's rows (distinct); None when t is not a C-contiguous
    FLOW_DTYPE table whose rows start with the key's bytes (the caller matches them)."""
    if not (_whole(t) and _KEY_PREFIX and len(t)):
        return None
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    keys = np.empty((len(rows), _KEY_NW), np.uint64)
    j = np.empty(len(rows), np.int64)
    if len(rows):
        _match_key_rows(_col(t, _KEY_FIRST, _KEY_NW), t.view(np.uint8).reshape(-1), t.dtype.itemsize, rows,
                        _KEY_MASK, _keys(table, _KEY_NW), keys, j)
    return keys, j


@njit(cache=True, nogil=True)
def _no_common_end(op, msgs, msg_bytes, dest_qp, src, dst, raw, rs, cts_max):
    """no_common_end's pass: the candidates (the first such flow's two addresses) kept while
    every later such flow has them as an end; True once none is left."""
    ch = np.zeros(2, dtype=np.uint64)
    cl = np.zeros(2, dtype=np.uint64)
    ok = np.zeros(2, dtype=np.bool_)
    seen = False
    n = msgs.shape[0]
    for i in range(n):
        if i + _PREFETCH_ROWS < n:
            prefetch_span(raw, (i + _PREFETCH_ROWS) * rs, 128)
        m = msgs[i]
        if m == 0 or op[i, L.OPC_READ_REQ] != 0 or dest_qp[i] == 1:
            continue
        if op[i, L.OPC_WRITE] == 0 and op[i, L.OPC_SEND] == 0:
            continue
        if not float(msg_bytes[i]) / float(m) > cts_max:
            continue
        if not seen:
            seen = True
            ch[0], cl[0], ch[1], cl[1] = src[i, 0], src[i, 1], dst[i, 0], dst[i, 1]
            ok[0] = ok[1] = True
            continue
        left = False
        for c in range(2):
            if ok[c]:
                ok[c] = (ch[c] == src[i, 0] and cl[c] == src[i, 1]) or (ch[c] == dst[i, 0] and cl[c] == dst[i, 1])
                left = left or ok[c]
        if not left:
            return True
    return False


def no_common_end(flows: np.ndarray) -> bool:
    """True when no address is an end of every flow that is certainly a data flow: SEND or
    WRITE messages whose mean is above a CTS's (analysis.flows.CTS_MAX_BYTES: never a control
    candidate), no READ request (whose SENDs/WRITEs flow_roles judges by the records), not on
    the management QP (1). Those are data flows whatever the other flows and the records are
    (analysis.flows.flow_roles), so analysis.nodeview.infer_node finds no node then (the node
    must be an end of every data flow). One pass over the rows, stopping at the first flow
    that shows it (a mirror's table: within a few rows); False: not shown (the analysis
    decides), also for a table that is not a C-contiguous FLOW_DTYPE one."""
    if not (len(flows) and _whole(flows)):
        return False
    return bool(_no_common_end(_col(flows, "op", L.N_OPCLASS), _col(flows, "messages", 1)[:, 0],
                               _col(flows, "msg_bytes", 1)[:, 0], _col(flows, "dest_qp", 1, "<u4")[:, 0],
                               _col(flows, "src", 2), _col(flows, "dst", 2), flows.view(np.uint8).reshape(-1),
                               flows.dtype.itemsize, float(CTS_MAX_BYTES)))


@njit(cache=True, nogil=True)
def _neg_i64(col, out):
    n = col.shape[0]
    for i in range(n):
        if i + 16 < n:
            prefetch(col, i + 16)   # 850-byte rows: the hardware prefetcher stops at each page
        out[i] = -np.int64(col[i])


def neg_bytes(flows: np.ndarray) -> np.ndarray:
    """-flows["bytes"].astype(np.int64) (the top-K flows' sort key), in one pass over the
    rows with each row's cache line fetched ahead (numpy's strided cast: 2x the time at
    1,048,576 flows)."""
    if not (len(flows) and _whole(flows)):
        return -flows["bytes"].astype(np.int64)
    out = np.empty(len(flows), np.int64)
    _neg_i64(_col(flows, "bytes", 1)[:, 0], out)
    return out


@njit(cache=True, nogil=True)
def _take_words(col, raw, rs, off, rows, out):
    n = rows.shape[0]
    nw = col.shape[1]
    for k in range(n):
        if k + 16 < n:
            prefetch_span(raw, rows[k + 16] * rs + off, nw * 8)
        r = rows[k]
        for c in range(nw):
            out[k, c] = col[r, c]


def take_col(t: np.ndarray, name: str, rows: np.ndarray) -> np.ndarray:
    """t[name][rows] for a u64 (array) field of a C-contiguous FLOW_DTYPE table, each row's
    cache lines fetched ahead (numpy's gather of a strided field: 2-3x the time)."""
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    dt, off = L.FLOW_DTYPE.fields[name][:2]
    if not (len(t) and len(rows) and _whole(t) and dt.base == np.dtype("<u8")):
        return t[name][rows]
    nw = max(1, int(np.prod(dt.shape)))
    out = np.empty((len(rows), nw), np.uint64)
    _take_words(_col(t, name, nw), t.view(np.uint8).reshape(-1), t.dtype.itemsize, off, rows, out)
    return out.reshape((len(rows),) + dt.shape)


def peer_counts(keys: np.ndarray, flows: np.ndarray) -> np.ndarray:
    """Flows per row of keys (peer_ids with the flow's own flow_class), the last entry the
    flows of no row: flow_class, peer_rows and a count in one pass over the rows."""
    q = np.zeros(len(keys) + 1, dtype=np.int64)
    if not len(flows):
        return q
    if not _whole(flows):
        p = peer_rows(keys, flows, flow_class(flows))
        p[p < 0] = len(keys)
        return q + np.bincount(p, minlength=len(q))
    n = len(flows)
    _row_peers(_col(flows, "src", 2), _col(flows, "dst", 2), _col(flows, "ipver", 1, "u1")[:, 0],
               _col(flows, "messages", 1)[:, 0], _col(flows, "msg_bytes", 1)[:, 0], float(CTS_MAX_BYTES),
               float(BULK_MIN_MESSAGE), _keys(keys, 5), q, np.empty(n, np.uint8), np.empty(n, np.int32))
    return q


#: RowCache marks: a row whose class (cls) or series row (pr, dr, sr) is not known yet
UNKNOWN_CLS = 255
UNKNOWN_ROW = -2


@njit(cache=True, nogil=True)
def _carry_rows(join, pcls, ppr, pdr, psr, rows, dcls, src, dst, ipv, msgs, msg_bytes, cts_max, bulk_min,
                tp, td, ts, ncls, npr, ndr, nsr, q):
    """The RowCache of the next read (see RowCache.carry): each row's entries from its row in
    the previous read (join), the read's rows (rows, their class dcls) with the class they
    have now and, where it changed or the row is new, their series rows looked up again;
    rows new to the table and not in the read (no packets: not expected) computed whole;
    dr/sr of the read's rows looked up where unknown. q: flows per peer row (the last: none).
    False when rows has a -1 (a delta row without a cumulative row: not carried)."""
    sp, sd, ss = _slots(tp), _slots(td), _slots(ts)
    wp = np.zeros(5, dtype=np.uint64)
    w3 = np.zeros(3, dtype=np.uint64)
    n = join.shape[0]
    m = tp.shape[0]
    for i in range(n):
        p = join[i]
        if p >= 0:
            ncls[i] = pcls[p]
            npr[i] = ppr[p]
            ndr[i] = pdr[p]
            nsr[i] = psr[p]
        else:
            ncls[i] = UNKNOWN_CLS
            npr[i] = UNKNOWN_ROW
            ndr[i] = UNKNOWN_ROW
            nsr[i] = UNKNOWN_ROW
    for k in range(rows.shape[0]):
        i = rows[k]
        if i < 0:
            return False
        # (the row itself is read only where something is looked up: a class that stayed
        # and rows known are the previous read's, from the compact arrays)
        c = dcls[k]
        if c != ncls[i] or npr[i] == UNKNOWN_ROW:
            ncls[i] = c
            wp[0], wp[1], wp[2], wp[3] = src[i, 0], src[i, 1], dst[i, 0], dst[i, 1]
            wp[4] = np.uint64(ipv[i]) | (np.uint64(c) << np.uint64(8))
            npr[i] = _find(sp, tp, wp)
        if ndr[i] == UNKNOWN_ROW:
            w3[0], w3[1], w3[2] = dst[i, 0], dst[i, 1], np.uint64(ipv[i])
            ndr[i] = _find(sd, td, w3)
        if nsr[i] == UNKNOWN_ROW:
            w3[0], w3[1], w3[2] = src[i, 0], src[i, 1], np.uint64(ipv[i])
            nsr[i] = _find(ss, ts, w3)
    for i in range(n):
        if ncls[i] == UNKNOWN_CLS:
            c = _cls(msgs[i], msg_bytes[i], cts_max, bulk_min)
            ncls[i] = c
            wp[0], wp[1], wp[2], wp[3] = src[i, 0], src[i, 1], dst[i, 0], dst[i, 1]
            wp[4] = np.uint64(ipv[i]) | (np.uint64(c) << np.uint64(8))
            npr[i] = _find(sp, tp, wp)
        r = npr[i]
        q[r if r >= 0 else m] += 1
    return True


@njit(cache=True, nogil=True)
def _row_peers(src, dst, ipv, msgs, msg_bytes, cts_max, bulk_min, table, q, cls, pr):
    """Flows per peer row (q; the last entry: no row), and each row's class (cls) and peer
    row (pr): peer_counts and RowCache.fill."""
    slots = _slots(table)
    m = table.shape[0]
    w = np.zeros(5, dtype=np.uint64)
    n = src.shape[0]
    for i in range(n):
        if i + 16 < n:
            prefetch(ipv, i + 16)
            prefetch(msg_bytes, i + 16)
        c = _cls(msgs[i], msg_bytes[i], cts_max, bulk_min)
        w[0], w[1], w[2], w[3] = src[i, 0], src[i, 1], dst[i, 0], dst[i, 1]
        w[4] = np.uint64(ipv[i]) | (np.uint64(c) << np.uint64(8))
        r = _find(slots, table, w)
        cls[i] = c
        pr[i] = r
        q[r if r >= 0 else m] += 1


def _keys(k: np.ndarray, w: int) -> np.ndarray:
    return np.ascontiguousarray(k, dtype=np.uint64) if len(k) else np.zeros((0, w), np.uint64)


class RowCache:
    """Per row of one read's cumulative flow table: its flow_class, and its rows among the
    peer, destination and source keys (peer_rows / dst_rows; -1 none, UNKNOWN_ROW not looked
    up yet), and the flows per peer row (peer_counts). The next read's cache comes from
    this one through the read's join (each row's row in the previous read's table): a row
    the read did not change (not in its delta: no packets since, so the same counters and
    class) keeps its entries; only the read's rows (and rows new to the table) are looked
    at, so a read costs O(its delta) of row reads, not three passes over every row of the
    table. The keys only grow (sticky series): an entry found stays; an entry -1 is stale
    once its keys grew (forget_misses)."""

    def __init__(self, cls, pr, dr, sr, q, kp):
        self.cls, self.pr, self.dr, self.sr = cls, pr, dr, sr
        self.q = q          # flows per peer row with the peer keys of kp rows
        self.kp = kp

    def __len__(self):
        return len(self.cls)

    @classmethod
    def fill(cls_, pkeys: np.ndarray, flows: np.ndarray) -> "RowCache | None":
        """The cache of a table from scratch (one pass over its rows: peer_counts's), dr/sr
        unknown; None when the table is not a C-contiguous FLOW_DTYPE one."""
        if not (len(flows) and _whole(flows)):
            return None
        n = len(flows)
        q = np.zeros(len(pkeys) + 1, dtype=np.int64)
        c = np.empty(n, np.uint8)
        pr = np.empty(n, np.int32)
        _row_peers(_col(flows, "src", 2), _col(flows, "dst", 2), _col(flows, "ipver", 1, "u1")[:, 0],
                   _col(flows, "messages", 1)[:, 0], _col(flows, "msg_bytes", 1)[:, 0], float(CTS_MAX_BYTES),
                   float(BULK_MIN_MESSAGE), _keys(pkeys, 5), q, c, pr)
        return cls_(c, pr, np.full(n, UNKNOWN_ROW, np.int32), np.full(n, UNKNOWN_ROW, np.int32), q, len(pkeys))

    def carry(self, join: np.ndarray, rows: np.ndarray, dcls: np.ndarray, flows: np.ndarray, pkeys: np.ndarray,
              dkeys: np.ndarray, skeys: np.ndarray) -> "RowCache | None":
        """The cache of the next read's table `flows` (join: each of its rows' row in this
        cache's table or -1; rows: the read's delta rows' rows in it, dcls their class);
        None when it cannot be carried (the caller fills a new one)."""
        n = len(flows)
        if not (n and _whole(flows) and len(join) == n and len(rows) == len(dcls) and len(pkeys) == self.kp):
            return None
        join = np.ascontiguousarray(join, dtype=np.int64)
        if len(self) == 0 or int(join.max()) >= len(self):
            return None
        out = RowCache(np.empty(n, np.uint8), np.empty(n, np.int32), np.empty(n, np.int32), np.empty(n, np.int32),
                       np.zeros(len(pkeys) + 1, dtype=np.int64), len(pkeys))
        ok = _carry_rows(join, self.cls, self.pr, self.dr, self.sr, np.ascontiguousarray(rows, dtype=np.int64),
                         np.ascontiguousarray(dcls, dtype=np.uint8), _col(flows, "src", 2), _col(flows, "dst", 2),
                         _col(flows, "ipver", 1, "u1")[:, 0], _col(flows, "messages", 1)[:, 0],
                         _col(flows, "msg_bytes", 1)[:, 0], float(CTS_MAX_BYTES), float(BULK_MIN_MESSAGE),
                         _keys(pkeys, 5), _keys(dkeys, 3), _keys(skeys, 3), out.cls, out.pr, out.dr, out.sr, out.q)
        return out if ok else None

    def forget_misses(self, which: str) -> None:
        """Keys of `which` ("dr", "sr") grew: its -1 entries are to be looked up again (peer
        keys that grow drop the whole cache: Accumulator.add)."""
        a = getattr(self, which)
        a[a == -1] = UNKNOWN_ROW


def peer_dst_src_rows(pkeys: np.ndarray, dkeys: np.ndarray, skeys: np.ndarray, flows: np.ndarray,
                      cls: np.ndarray) -> tuple:
    """(peer_rows(pkeys, flows, cls), dst_rows(dkeys, flows), dst_rows(skeys, flows, "src"))
    in one pass over the rows (three passes read the same 850-byte rows three times)."""
    n = len(flows)
    out = tuple(np.full(n, -1, np.int64) for _ in range(3))
    if n:
        f = np.ascontiguousarray(flows)
        _key_rows3(_col(f, "src", 2), _col(f, "dst", 2), _col(f, "ipver", 1, "u1")[:, 0],
                   np.ascontiguousarray(cls, dtype=np.int64), _keys(pkeys, 5), _keys(dkeys, 3), _keys(skeys, 3), *out)
    return out


def _col(t: np.ndarray, name: str, nw: int, dtype: str = "<u8") -> np.ndarray:
    """Column `name` of a C-contiguous FLOW_DTYPE table as a strided (n, nw) view (any
    byte alignment: x86 loads it as is)."""
    off = L.FLOW_DTYPE.fields[name][1]
    return np.ndarray((len(t), nw), dtype, buffer=t, offset=off, strides=(t.dtype.itemsize, np.dtype(dtype).itemsize))


def peer_rows(keys: np.ndarray, flows: np.ndarray, cls: np.ndarray) -> np.ndarray:
    """match_rows(keys, peer_ids(flows, cls)) in one pass over the rows, without building
    the ids or sorting them (keys: a few thousand pairs; flows: up to the whole table)."""
    if not len(flows):
        return np.zeros(0, np.int64)
    if not len(keys):
        return np.full(len(flows), -1, np.int64)
    f = np.ascontiguousarray(flows)
    return _key_rows(_col(f, "src", 2), _col(f, "dst", 2), _col(f, "ipver", 1, "u1")[:, 0],
                     np.ascontiguousarray(cls, dtype=np.int64), np.ascontiguousarray(keys, dtype=np.uint64))


def dst_rows(keys: np.ndarray, flows: np.ndarray, end: str = "dst") -> np.ndarray:
    """match_rows(keys, dst_ids(flows, end)) in one pass over the rows (see peer_rows)."""
    if not len(flows):
        return np.zeros(0, np.int64)
    if not len(keys):
        return np.full(len(flows), -1, np.int64)
    f = np.ascontiguousarray(flows)
    a = _col(f, end, 2)
    return _key_rows(a, a, _col(f, "ipver", 1, "u1")[:, 0], np.zeros(len(f), np.int64),
                     np.ascontiguousarray(keys, dtype=np.uint64))


def _raw(t: np.ndarray) -> np.ndarray:
    """A C-contiguous table's rows as (n, itemsize) bytes (one dummy row when empty)."""
    if not len(t):
        return np.zeros((1, t.dtype.itemsize), np.uint8)
    return t.view(np.uint8).reshape(len(t), t.dtype.itemsize)


@njit(cache=True, nogil=True)
def _put_rows(a, ia, b, ib, out, dest):
    n, rs = dest.shape[0], out.shape[1]
    for i in range(n):
        k = i + _PREFETCH_ROWS
        if k < n:
            src = a[ia[k]] if ia[k] >= 0 else b[ib[k]]
            for o in range(0, rs, 64):
                prefetch(src, o)
        if ia[i] >= 0:
            out[dest[i], :] = a[ia[i], :]
        else:
            out[dest[i], :] = b[ib[i], :]


def put_rows(out: np.ndarray, dest: np.ndarray, a: np.ndarray, ia: np.ndarray, b: np.ndarray,
             ib: np.ndarray) -> None:
    """In place, out[dest[i]] = a[ia[i]] where ia[i] >= 0, else b[ib[i]] (C-contiguous
    tables of one dtype): each 850-byte row moved once, into rows the caller already has
    (a gather into a fresh table paid its page faults on every read)."""
    if len(dest):
        _put_rows(_raw(np.ascontiguousarray(a)), np.ascontiguousarray(ia, dtype=np.int64),
                  _raw(np.ascontiguousarray(b)), np.ascontiguousarray(ib, dtype=np.int64), _raw(out),
                  np.ascontiguousarray(dest, dtype=np.int64))


@njit(cache=True, nogil=True)
def _keep_rows(raw, rows):
    for k in range(rows.shape[0]):
        if rows[k] != k:
            raw[k, :] = raw[rows[k], :]


def keep_rows(t: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """t[rows] for increasing rows, moved down within t's own memory (a C-contiguous table
    the caller owns): the first len(rows) rows of t."""
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    if len(rows):
        _keep_rows(_raw(t), rows)
    return t[:len(rows)]


def _packed(*arrays) -> bool:
    """Each a C-contiguous structured array of one dtype without gaps between its fields
    (EVENT_DTYPE): its rows are its bytes."""
    dt = arrays[0].dtype
    return (dt.names is not None and all(a.dtype == dt and a.flags.c_contiguous for a in arrays)
            and sum(dt.fields[n][0].itemsize for n in dt.names) == dt.itemsize)


def _rows_u8(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint8).reshape(len(a), a.dtype.itemsize)


def rec_copy(a: np.ndarray) -> np.ndarray:
    """a.copy() of message records (numpy copies a packed structured array field by field:
    15x a copy of its bytes at 100,000 records)."""
    if not (len(a) and _packed(a)):
        return a.copy()
    return _rows_u8(a).copy().view(a.dtype).reshape(len(a))


def rec_concat(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """np.concatenate([a, b]) of message records, as their bytes (see rec_copy)."""
    if not (len(a) and len(b) and _packed(a, b)):
        return np.concatenate([a, b])
    return np.concatenate([_rows_u8(a), _rows_u8(b)]).view(a.dtype).reshape(len(a) + len(b))


def rec_take(a: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """a[idx] (an index array) of message records, as their bytes (see rec_copy)."""
    if not (len(a) and len(idx) and _packed(a)):
        return a[idx]
    return _rows_u8(a)[idx].view(a.dtype).reshape(len(idx))


def record_flows(flow: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct rows 0..n-1 that records' `flow` refers to, in increasing order; each
    record's index into them, -1 where flow is -1): np.unique and a binary search per record,
    by a mark per row (O(records + n), no sort)."""
    f = np.asarray(flow, dtype=np.int64)
    ok = f >= 0
    mark = np.zeros(n, dtype=bool)
    mark[f[ok]] = True
    ref = np.flatnonzero(mark)
    at = np.empty(n, dtype=np.int64)
    at[ref] = np.arange(len(ref))
    out = np.full(len(f), -1, dtype=np.int64)
    out[ok] = at[f[ok]]
    return ref, out


def dst_ids(flows: np.ndarray, end: str = "dst") -> np.ndarray:
    """(n, 3) uint64 identity of each flow's destination (or source: end="src"), ipver."""
    k = np.zeros((len(flows), 24), dtype=np.uint8)
    k[:, 0:16] = flows[end]
    k[:, 16] = flows["ipver"]
    return _rows_u64(k)


def message_timing(flows: np.ndarray, events: np.ndarray, rows: np.ndarray | None = None,
                   rec_flow: np.ndarray | None = None) -> np.ndarray:
    """Per-flow message timing of one interval, by the analysis package's definitions
    (analysis.flows.flow_event_stats: multi-packet message bytes, their on-wire time,
    packet time), so that the fleet's rate over active time is the single-node one.
    rows: the flows' rows the records' `flow` indexes (record flow k: flows[rows[k]]; the
    result one row per entry of rows): of those rows only the opclass counters are read
    (the stats' one flow column), not gathered whole. rec_flow: each record's index into
    rows (-1 none) in place of its `flow` (the records as they are, not a copy renumbered)."""
    if rows is None:
        st, _, _ = flow_event_stats(Snapshot(flows, events, np.zeros(L.G_N, np.uint64), {}))
        return st
    rows = np.asarray(rows, dtype=np.int64)
    f = None if rec_flow is None else np.asarray(rec_flow).astype(events.dtype["flow"])   # (the field's type)
    st, _, _ = flow_event_stats(_Rows(rows, events), {"op": take_col(flows, "op", rows)}, f)
    return st


#: what flow_event_stats reads of a Snapshot when given the flows' columns: the number of
#: flows (len(flows)) and the records
_Rows = namedtuple("_Rows", "flows events")


def record_times(events: np.ndarray, pkt_ns: np.ndarray | None = None) -> tuple:
    """(flow, start, end, order) of message records as busy_of reads them: each record's
    flow (int64, -1 none), start_ts and on-wire end (end_ts, at least start_ts, + pkt_ns:
    the record's packet time, NaN as 0; None: 0), and the order to read them in (None:
    as they are, already in start order; else a stable sort by start)."""
    f = events["flow"].astype(np.int64)
    s = events["start_ts"].astype(np.int64)
    e = np.maximum(events["end_ts"].astype(np.int64), s)
    if pkt_ns is not None and len(f):
        e += np.nan_to_num(np.asarray(pkt_ns, dtype=np.float64), nan=0.0).astype(np.int64)
    order = None if bool(np.all(s[1:] >= s[:-1])) else np.argsort(s, kind="stable")
    return f, s, e, order


def busy_of(times: tuple, flow_key: np.ndarray, nkeys: int,
            carry_end: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Busy time (ns) per key (flow_key: each flow's key, -1 none) of records as
    record_times gives them: the measure of the union of their on-wire intervals per key,
    clipped to no earlier than carry_end (the previous batch's end per key). Records of no
    flow (-1) or of a flow of no key are skipped. Returns (busy_ns, carry_end)."""
    busy = np.zeros(nkeys, dtype=np.int64)
    carry = np.zeros(nkeys, dtype=np.int64) if carry_end is None else carry_end.astype(np.int64).copy()
    if carry.shape[0] < nkeys:
        carry = np.concatenate([carry, np.zeros(nkeys - carry.shape[0], dtype=np.int64)])
    f, s, e, order = times
    if len(f) == 0 or len(flow_key) == 0:
        return busy, carry
    ok = f >= 0
    p = np.where(ok, np.asarray(flow_key, dtype=np.int64)[np.where(ok, f, 0)], -1)
    # union_kernel reads each key's records in start order, every key on its own: records
    # in start order (a read's are) go in as they are -- no sort by key (a stable sort by
    # key kept that order within each key: the same sequence per key); others by a stable
    # sort by start (per key: by start, then record order, lexsort((start, key))'s)
    if order is not None:
        p, s, e = p[order], s[order], e[order]
    scratch = np.zeros(nkeys, dtype=np.int64)  # first/last of union_kernel (not needed here)
    union_kernel(p, s, e, carry, busy, scratch, scratch.copy())
    return busy, carry


def busy_ns_per_peer(events: np.ndarray, flow_peer: np.ndarray, npeers: int,
                     carry_end: np.ndarray | None = None,
                     pkt_ns: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Busy time (ns) per peer pair from message records: the measure of the union of the
    on-wire intervals [start_ts, end_ts + pkt_ns(flow)] of the pair's messages (pkt_ns:
    the flow's packet time, analysis.flows; 0 if not given). Records of flows no longer in
    the table (flow = -1), or of a flow whose flow_peer is -1, are skipped. Returns
    (busy_ns, carry_end)."""
    pk = None
    if pkt_ns is not None and len(events):
        f = events["flow"].astype(np.int64)
        pk = np.asarray(pkt_ns, dtype=np.float64)[np.where(f >= 0, f, 0)]
        pk[f < 0] = 0.0
    return busy_of(record_times(events, pk), flow_peer, npeers, carry_end)
