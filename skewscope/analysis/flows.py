"""Per-flow building blocks every metric uses: nodes, flow roles, QP-pair partners and
per-flow message statistics over active time (numba over the Snapshot's arrays).

Definitions (docs/metrics.md "Flows"):

* node: one IP address (RoCEv1: GID); flows are (src node, dst node, dest QP).
* role of a flow:
    data          carries the job's bytes: WRITE/SEND messages larger than a CTS, READ
                  responses, or small messages that have no bigger partner going the other way
    cts           the control direction of a data QP pair: NCCL clear-to-send (only WRITE
                  messages of <= 512 bytes, n x 64-byte FIFO elements, n <= 8), or a verbs
                  library's control (only small SENDs: Open MPI's credits, rendezvous
                  headers, FINs; READ requests allowed), while the reverse direction carries
                  bigger messages or READ responses. Its direction is the reverse of the data.
    ack           no messages, only ACK/NAK (and maybe CNP) packets: responder -> requester
    read_request  only RDMA READ requests (the data comes back as READ responses)
    cnp           only CNPs
    management    dest QP 1 (GSI: connection management MADs)
    other         anything else
* partner: the flow of the same QP pair in the other direction, from the UDP source port
  (mlx5 derives it symmetrically from both QP numbers, so both directions share it) when it
  is unique for the node pair in both directions, else by elimination when the node pair
  has one flow each way. -1 when unknown.
* message on-wire interval: [start, end + pkt_ns]: a record spans the first to the last
  packet's timestamp, i.e. n-1 packet times for an n-packet message; pkt_ns, the flow's
  packet time, is estimated from its multi-packet messages (sum(end-start)/sum(n-1)), with
  n = ceil(bytes / IB MTU) and the IB MTU inferred per flow (the candidate 256..4096 whose
  packet count best matches the flow's WRITE/SEND packet counter).
* rate over active time (rate_bps): 8 * sum(bytes) / sum(on-wire time) over the flow's
  multi-packet messages: the payload rate while the flow is sending, independent of idle
  time, capture length and single-packet messages (which carry no timing).
* busy_ns: union of the flow's message on-wire intervals.
* stalled message: on-wire time >= 2x what the flow's median per-message rate predicts;
  stall_ns sums the excess over the stalled messages (PFC pauses, link flaps, queueing).
* flat message (n_flat): a multi-packet message whose packets all carry one timestamp:
  the capture batched timestamps (interrupt coalescing/GRO on the capturing host); such
  messages carry no timing and are left out of rates.
"""
from __future__ import annotations

import numpy as np

from skewscope.analysis.hashing import _mix
from skewscope.core import layout as L
from skewscope.core.jit import njit, prefetch_span_l2
from skewscope.core.pool import ArrayPool
from skewscope.core.snapshot import ip_str

ROLE_DATA, ROLE_CTS, ROLE_ACK, ROLE_READ_REQ, ROLE_CNP, ROLE_MGMT, ROLE_OTHER = range(7)
ROLE_NAMES = ("data", "cts", "ack", "read_request", "cnp", "management", "other")
CTS_MAX_BYTES = 512
MTU_CANDIDATES = np.array([256, 512, 1024, 2048, 4096], dtype=np.int64)
#: log2 of each candidate: a message's packets at an MTU by a shift, not a division (5 per
#: record at 317,440 records: 2.5 of the stats kernel's 8 ms)
MTU_SHIFTS = np.array([int(m).bit_length() - 1 for m in MTU_CANDIDATES], dtype=np.int64)
assert (np.int64(1) << MTU_SHIFTS == MTU_CANDIDATES).all(), "the MTU candidates are powers of 2"
STRETCH = 2.0

FSTAT_DTYPE = np.dtype([
    ("n_rec", "<i8"),          # message records of the flow
    ("rec_bytes", "<f8"),      # their bytes
    ("n_data", "<i8"),         # WRITE/SEND records
    ("data_bytes", "<f8"),
    ("n_multi", "<i8"),        # multi-packet WRITE/SEND records (carry timing)
    ("multi_bytes", "<f8"),
    ("wire_ns", "<f8"),        # their on-wire time (n/(n-1) corrected)
    ("mtu", "<i8"),            # inferred IB MTU
    ("pkt_ns", "<f8"),         # packet time
    ("rate_bps", "<f8"),       # payload rate over active time (NaN: no multi-packet message)
    ("busy_ns", "<f8"),        # union of on-wire intervals
    ("first_start", "<f8"),
    ("last_end", "<f8"),
    ("stall_n", "<i8"),
    ("stall_ns", "<f8"),
    ("stall_max_ns", "<f8"),
    ("rate_med_bps", "<f8"),   # median per-message rate (robust to a few stalled messages)
    ("n_flat", "<i8"),         # multi-packet WRITE/SEND records with all packets at one timestamp
])


# ---- the flow table as contiguous columns -------------------------------------------------
#: scalar counters copied out of the flow table (a 848-byte record per flow: touching it
#: once is cheaper than one strided numpy pass per field)
COL_U64 = ("packets", "bytes", "payload_bytes", "messages", "msg_bytes", "ecn_capable", "ce", "fecn", "becn", "cnp",
           "acks", "nak_seq", "nak_rnr", "nak_other", "psn_gaps", "psn_skipped", "retransmissions")
COL_TS = ("first_ts", "last_ts")


@njit(cache=True, nogil=True, inline="always")
def _clz64(x):
    n = 0
    if x == 0:
        return 64
    while (x & np.uint64(0x8000000000000000)) == 0:
        x = x << np.uint64(1)
        n += 1
    return n


#: rows ahead to prefetch, and the first bytes of a row the kernel reads (key .. sport)
PREFETCH_ROWS = 4
PREFETCH_BYTES = 320


@njit(cache=True, nogil=True)
def _columns_kernel(fl, raw, u, ts, op, small, addr):
    n = fl.shape[0]
    rs = raw.shape[0] // max(n, 1)
    for i in range(n):
        # the row PREFETCH_ROWS ahead fetched ourselves (2.4x on 65,536 flows), into L2 (not L1:
        # 1.08x at 1,048,576 flows)
        if i + PREFETCH_ROWS < n:
            prefetch_span_l2(raw, (i + PREFETCH_ROWS) * rs, PREFETCH_BYTES)
        r = fl[i]
        # addresses as big-endian 64-bit halves (src hi, src lo, dst hi, dst lo)
        a0 = np.uint64(0)
        a1 = np.uint64(0)
        b0 = np.uint64(0)
        b1 = np.uint64(0)
        for k in range(8):
            a0 = (a0 << np.uint64(8)) | np.uint64(r.src[k])
            a1 = (a1 << np.uint64(8)) | np.uint64(r.src[k + 8])
            b0 = (b0 << np.uint64(8)) | np.uint64(r.dst[k])
            b1 = (b1 << np.uint64(8)) | np.uint64(r.dst[k + 8])
        addr[0, i] = a0
        addr[1, i] = a1
        addr[2, i] = b0
        addr[3, i] = b1
        u[0, i] = r.packets
        u[1, i] = r.bytes
        u[2, i] = r.payload_bytes
        u[3, i] = r.messages
        u[4, i] = r.msg_bytes
        u[5, i] = r.ecn_capable
        u[6, i] = r.ce
        u[7, i] = r.fecn
        u[8, i] = r.becn
        u[9, i] = r.cnp
        u[10, i] = r.acks
        u[11, i] = r.nak_seq
        u[12, i] = r.nak_rnr
        u[13, i] = r.nak_other
        u[14, i] = r.psn_gaps
        u[15, i] = r.psn_skipped
        u[16, i] = r.retransmissions
        ts[0, i] = r.first_ts
        ts[1, i] = r.last_ts
        for k in range(8):
            op[i, k] = r.op[k]
        # highest message-size slot: only needed for flows whose mean message could be a
        # CTS (<= 1 KiB); bigger ones get a slot from the mean (saves reading the histogram)
        # (no message is bigger than the flow's total, so the scan starts at the total's
        # slot: an empty flow reads one slot, not the histogram's cache lines)
        m = -1
        if r.messages > 0 and r.msg_bytes > np.uint64(1024) * r.messages:
            m = 63 - _clz64(r.msg_bytes // r.messages) + 1
        else:
            top = 0
            if r.msg_bytes > 0:
                top = min(64 - _clz64(r.msg_bytes), r.msg_hist.shape[0] - 1)
            for k in range(top, -1, -1):
                if r.msg_hist[k] > 0:
                    m = k
                    break
        small[0, i] = m
        small[1, i] = r.sport
        small[2, i] = r.dest_qp
        small[3, i] = r.ipver


def flow_columns(flows) -> dict:
    """name -> contiguous array for the flow table's scalar fields (+ "op" (n, 8),
    "addr" (4, n) address halves, and "max_slot": the highest non-empty message-size slot
    for flows whose mean message is <= 1 KiB, the mean's slot above, -1 without
    messages), in one pass. The columns are views of one buffer of COLUMNS_POOL."""
    n = len(flows)
    nu = len(COL_U64)
    # (the kernel writes every element: no zero-fill)
    buf = COLUMNS_POOL.take((nu + 2 + L.N_OPCLASS + 4 + 4) * n)
    u = buf[:nu * n].reshape(nu, n)
    o = nu * n
    ts = buf[o:o + 2 * n].reshape(2, n)
    o += 2 * n
    op = buf[o:o + L.N_OPCLASS * n].reshape(n, L.N_OPCLASS)
    o += L.N_OPCLASS * n
    small = buf[o:o + 4 * n].view(np.int64).reshape(4, n)
    o += 4 * n
    addr = buf[o:o + 4 * n].reshape(4, n)
    if n:
        flows = np.ascontiguousarray(flows)
        _columns_kernel(flows, flows.view(np.uint8).reshape(-1), u, ts, op, small, addr)
    out = {k: u[i] for i, k in enumerate(COL_U64)}
    out["addr"] = addr
    out.update(first_ts=ts[0], last_ts=ts[1], op=op, max_slot=small[0], sport=small[1], dest_qp=small[2],
               ipver=small[3])
    return out


#: the per-Snapshot columns of a live loop (flow_columns, the congestion table) are made anew
#: every interval: at 1,048,576 flows ~300 MB whose fresh pages cost more to fault in and
#: zero than the passes that write them; buffers the process already has cost none
#: (core/pool.py: a buffer is written again only once no array refers to it)
COLUMNS_POOL = ArrayPool(np.uint64, limit=4)
CONG_POOL = ArrayPool(np.float64, limit=4)


# ---- nodes ---------------------------------------------------------------------------
class Nodes:
    """Node table: ips[i] (strings as in report "flows"), src[f]/dst[f] node of each flow."""

    def __init__(self, ips, src, dst, ipver=None):
        self.ips = ips
        self.src = src
        self.dst = dst
        self.ipver = ipver          # the IP version each address string was formatted with

    @property
    def n(self) -> int:
        return len(self.ips)

    def index(self, ip: str) -> int:
        return self.ips.index(ip)


def node_index(flows, cols: dict | None = None) -> Nodes:
    """Unique addresses of a flow table -> Nodes (sorted by address bytes)."""
    n = len(flows)
    if n == 0:
        return Nodes([], np.zeros(0, np.int32), np.zeros(0, np.int32))
    if cols is None:
        cols = flow_columns(flows)
    ad = cols["addr"]
    src = np.empty(n, dtype=np.int32)
    dst = np.empty(n, dtype=np.int32)
    first = _address_ids(ad, src, dst)            # the first flow (src, then dst) of each address
    hi = np.where(first < n, ad[0][first % n], ad[2][first % n])
    lo = np.where(first < n, ad[1][first % n], ad[3][first % n])
    order = np.lexsort((lo, hi))                  # nodes sorted by address bytes
    rank = np.empty(len(first), dtype=np.int32)
    rank[order] = np.arange(len(first), dtype=np.int32)
    _renumber(src, dst, rank)
    ipver = cols["ipver"]
    ips = []
    fo = first[order]
    for i, x, y in zip(fo.tolist(), hi[order].tolist(), lo[order].tolist()):
        b = int(x).to_bytes(8, "big") + int(y).to_bytes(8, "big")
        ips.append(ip_str(np.frombuffer(b, np.uint8), int(ipver[i % n])))
    return Nodes(ips, src, dst, ipver[fo % n])


@njit(cache=True, nogil=True)
def _address_ids(addr, src, dst):
    """src/dst[i] = the id of flow i's source/destination address (order of first
    appearance: the sources, then the destinations), by an open-addressing table over the
    (few) addresses; each run of one address (a key-sorted table) probes once. Returns each
    id's first position (i: source of flow i, n + i: its destination)."""
    n = src.shape[0]
    cap = 1024
    slot = np.full(cap, -1, dtype=np.int64)
    khi = np.empty(64, dtype=np.uint64)
    klo = np.empty(64, dtype=np.uint64)
    first = np.empty(64, dtype=np.int64)
    k = 0
    for side in range(2):
        out = src if side == 0 else dst
        H = addr[2 * side]
        Lo = addr[2 * side + 1]
        last_h = np.uint64(0)
        last_l = np.uint64(0)
        last_id = -1
        for i in range(n):
            x = H[i]
            y = Lo[i]
            if last_id >= 0 and x == last_h and y == last_l:
                out[i] = last_id
                continue
            mask = cap - 1
            j = np.int64(_mix(x ^ _mix(y)) & np.uint64(mask))
            while slot[j] >= 0 and not (khi[slot[j]] == x and klo[slot[j]] == y):
                j = (j + 1) & mask
            sid = slot[j]
            if sid < 0:
                if k == khi.shape[0]:
                    khi = np.concatenate((khi, np.empty(k, dtype=np.uint64)))
                    klo = np.concatenate((klo, np.empty(k, dtype=np.uint64)))
                    first = np.concatenate((first, np.empty(k, dtype=np.int64)))
                sid = k
                slot[j] = k
                khi[k] = x
                klo[k] = y
                first[k] = side * n + i
                k += 1
                if 2 * k >= cap:         # grow: the k addresses again into a table twice as big
                    cap *= 2
                    slot = np.full(cap, -1, dtype=np.int64)
                    for q in range(k):
                        jj = np.int64(_mix(khi[q] ^ _mix(klo[q])) & np.uint64(cap - 1))
                        while slot[jj] >= 0:
                            jj = (jj + 1) & (cap - 1)
                        slot[jj] = q
            out[i] = sid
            last_h = x
            last_l = y
            last_id = sid
    return first[:k].copy()


@njit(cache=True, nogil=True)
def _renumber(src, dst, rank):
    for i in range(src.shape[0]):
        src[i] = rank[src[i]]
        dst[i] = rank[dst[i]]


# ---- per-flow message statistics -----------------------------------------------------
@njit(cache=True, nogil=True)
def csr_by_key(keys, nkeys):
    """Counting sort by a small key (stable: the records by flow keep their start order):
    (order, off): the indices with key k are order[off[k]:off[k + 1]]; keys outside
    0..nkeys-1 are left out. For keys all in range, order is np.argsort(keys, kind="stable")
    and off[:nkeys] np.searchsorted(keys[order], np.arange(nkeys)), in O(n)."""
    cnt = np.zeros(nkeys + 1, dtype=np.int64)
    n = keys.shape[0]
    for i in range(n):
        f = keys[i]
        if 0 <= f < nkeys:
            cnt[f + 1] += 1
    for f in range(nkeys):
        cnt[f + 1] += cnt[f]
    off = cnt.copy()
    pos = cnt[:nkeys].copy()
    order = np.empty(off[nkeys], dtype=np.int64)
    for i in range(n):
        f = keys[i]
        if 0 <= f < nkeys:
            order[pos[f]] = i
            pos[f] += 1
    return order, off


@njit(cache=True, nogil=True, inline="always")
def _npk(b, mtu, shift):
    """Packets of a b-byte message at an MTU of 2**shift bytes: ceil(b / mtu), at least 1
    (an arithmetic shift floors as // does, for any b)."""
    k = (b + mtu - 1) >> shift
    return k if k >= 1 else 1


@njit(cache=True, nogil=True, inline="always")
def _data_msg(ev_op, ev_start, ev_end, ev_bytes, i, mtu, shift):
    """Record i as a data message (op 0 or 1) for the stats kernel's passes: (is data, bytes,
    packets at the flow's MTU, end - start in ns)."""
    op = ev_op[i]
    by = np.int64(ev_bytes[i])
    return op == 0 or op == 1, by, _npk(by, mtu, shift), float(ev_end[i]) - float(ev_start[i])


@njit(cache=True, nogil=True)
def _flow_stats_kernel(ev_flow, ev_op, ev_start, ev_end, ev_bytes, req_pkts, mtus, shifts, out_i, out_f):
    """out_i[f] = n_rec, n_data, n_multi, mtu, stall_n, n_flat; out_f[f] = rec_bytes,
    data_bytes, multi_bytes, wire_ns, pkt_ns, rate_bps, busy_ns, first_start, last_end,
    stall_ns, stall_max_ns, rate_med_bps. Three passes over the records in their order with
    per-flow sums (each flow's records in that order, as a grouping by flow would visit
    them): the columns read where they lie (a record table's strided fields), nothing
    gathered; only the per-message rates (for each flow's median) are put in flow order."""
    nflows = out_i.shape[0]
    nm = mtus.shape[0]
    n = ev_flow.shape[0]
    pk = np.zeros((nflows, nm), dtype=np.int64)
    n01 = np.zeros(nflows + 1, dtype=np.int64)      # SEND/WRITE records per flow, then offsets
    first = np.full(nflows, np.inf)
    last = np.full(nflows, -np.inf)
    for i in range(n):
        f = np.int64(ev_flow[i])
        if f < 0 or f >= nflows:
            continue
        by = np.int64(ev_bytes[i])
        out_i[f, 0] += 1
        out_f[f, 0] += by
        s = float(ev_start[i])
        t = float(ev_end[i])
        if s < first[f]:
            first[f] = s
        if t > last[f]:
            last[f] = t
        op = ev_op[i]
        if op == 0 or op == 1:  # SEND / WRITE
            out_i[f, 1] += 1
            out_f[f, 1] += by
            n01[f + 1] += 1
            for c in range(nm):
                pk[f, c] += _npk(by, mtus[c], shifts[c])
        elif op == 3:           # an RDMA READ's data (its request's record, on this flow)
            out_i[f, 1] += 1
            out_f[f, 1] += by
    mtu = np.empty(nflows, dtype=np.int64)
    msh = np.empty(nflows, dtype=np.int64)
    for f in range(nflows):
        n01[f + 1] += n01[f]
        # IB MTU: the candidate whose packet count is closest to the observed one (ties: larger)
        m = nm - 1
        if out_i[f, 1] > 0 and req_pkts[f] > 0:
            best = -1
            for c in range(nm - 1, -1, -1):
                d = abs(pk[f, c] - req_pkts[f])
                if best < 0 or d < best:
                    best = d
                    m = c
        mtu[f] = mtus[m]
        msh[f] = shifts[m]
    rbuf = np.empty(n01[nflows], dtype=np.float64)
    nr = np.zeros(nflows, dtype=np.int64)
    span = np.zeros(nflows)
    gaps = np.zeros(nflows)
    for i in range(n):
        f = np.int64(ev_flow[i])
        if f < 0 or f >= nflows:
            continue
        data, by, npk, d = _data_msg(ev_op, ev_start, ev_end, ev_bytes, i, mtu[f], msh[f])
        if not data:
            continue
        if npk >= 2 and d <= 0:
            out_i[f, 5] += 1
        if npk >= 2 and d > 0:
            out_i[f, 2] += 1
            out_f[f, 2] += by
            w = d * npk / (npk - 1)
            out_f[f, 3] += w
            span[f] += d
            gaps[f] += npk - 1
            rbuf[n01[f] + nr[f]] = by / w
            nr[f] += 1
    med = np.full(nflows, np.nan)
    pkt = np.empty(nflows)
    for f in range(nflows):
        pkt[f] = span[f] / gaps[f] if gaps[f] > 0 else 0.0
        # np.median of one or two values without its copy of them (numba's: the value; the
        # two values' sum / 2)
        if nr[f] == 1:
            med[f] = rbuf[n01[f]]
        elif nr[f] == 2:
            med[f] = (rbuf[n01[f]] + rbuf[n01[f] + 1]) / 2
        elif nr[f] >= 3:
            med[f] = np.median(rbuf[n01[f]:n01[f] + nr[f]])
    # busy: union of [start, end + pkt]; stalls against the median per-message rate
    cs = np.full(nflows, -1.0)
    ce = np.full(nflows, -1.0)
    busy = np.zeros(nflows)
    for i in range(n):
        f = np.int64(ev_flow[i])
        if f < 0 or f >= nflows:
            continue
        s = float(ev_start[i])
        t = float(ev_end[i]) + pkt[f]
        if cs[f] < 0:
            cs[f] = s
            ce[f] = t
        elif s > ce[f]:
            busy[f] += ce[f] - cs[f]
            cs[f] = s
            ce[f] = t
        elif t > ce[f]:
            ce[f] = t
        if nr[f] < 3 or not med[f] > 0:
            continue
        data, by, npk, d = _data_msg(ev_op, ev_start, ev_end, ev_bytes, i, mtu[f], msh[f])
        if not data or npk < 2 or d <= 0:
            continue
        w = d * npk / (npk - 1)
        exp = by / med[f]
        if w >= STRETCH * exp:
            out_i[f, 4] += 1
            out_f[f, 9] += w - exp
            if w - exp > out_f[f, 10]:
                out_f[f, 10] = w - exp
    for f in range(nflows):
        if cs[f] >= 0:
            busy[f] += ce[f] - cs[f]
        wire = out_f[f, 3]
        out_i[f, 3] = mtu[f]
        out_f[f, 4] = pkt[f]
        out_f[f, 5] = out_f[f, 2] * 8e9 / wire if wire > 0 else np.nan
        out_f[f, 6] = busy[f]
        out_f[f, 7] = first[f] if out_i[f, 0] > 0 else np.nan
        out_f[f, 8] = last[f] if out_i[f, 0] > 0 else np.nan
        out_f[f, 11] = med[f] * 8e9 if nr[f] >= 1 else np.nan


def flow_event_stats(snap, cols: dict | None = None, ev_flow: np.ndarray | None = None,
                     ev_op: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-flow message statistics (FSTAT_DTYPE) + the CSR grouping of events by flow
    (order, offsets: events of flow f are events[order[off[f]:off[f+1]]], in start order).
    cols: flow_columns(snap.flows) when the caller has them (analysis.context caches them).
    ev_flow/ev_op: the records' flow and opclass when the caller reassigned them
    (Context.ev_flow: an RDMA READ's record belongs to the flow its data comes back on,
    with opclass READ_RESP: counted as a data message without timing)."""
    fl, ev = snap.flows, snap.events
    nf = len(fl)
    evf = np.ascontiguousarray(ev["flow"] if ev_flow is None else ev_flow)
    order, off = csr_by_key(evf, nf)
    c = flow_columns(fl) if cols is None else cols
    req = (c["op"][:, L.OPC_SEND] + c["op"][:, L.OPC_WRITE]).astype(np.int64) if nf else np.zeros(0, np.int64)
    oi = np.zeros((nf, 6), dtype=np.int64)
    of = np.zeros((nf, 12), dtype=np.float64)
    if nf:
        # the record table's fields as they lie (strided views): the kernel reads each once
        # per pass, in record order
        _flow_stats_kernel(evf, ev["opclass"] if ev_op is None else ev_op, ev["start_ts"], ev["end_ts"],
                           ev["bytes"], req, MTU_CANDIDATES, MTU_SHIFTS, oi, of)
    st = np.zeros(nf, dtype=FSTAT_DTYPE)
    for k, name in enumerate(("n_rec", "n_data", "n_multi", "mtu", "stall_n", "n_flat")):
        st[name] = oi[:, k]
    for k, name in enumerate(("rec_bytes", "data_bytes", "multi_bytes", "wire_ns", "pkt_ns", "rate_bps", "busy_ns",
                              "first_start", "last_end", "stall_ns", "stall_max_ns", "rate_med_bps")):
        st[name] = of[:, k]
    return st, order, off


def read_response_flows(fl, nodes: Nodes, partner: np.ndarray) -> np.ndarray:
    """Per flow: the flow its RDMA READs' data comes back on (-1: none or unknown). A READ
    REQUEST goes requester -> responder on the responder's QP; its data returns as READ
    RESPONSEs responder -> requester on the requester's QP: the partner flow when it carries
    READ responses, else the only flow with READ responses of the reverse node pair."""
    n = len(partner)
    out = np.full(n, -1, dtype=np.int64)
    if n == 0:
        return out
    op = fl["op"]
    req = op[:, L.OPC_READ_REQ] > 0
    if not req.any():
        return out
    resp = (op[:, L.OPC_READ_RESP] > 0) & (fl["payload_bytes"] > 0)
    p = partner
    by_p = req & (p >= 0)
    by_p[by_p] &= resp[p[by_p]]
    out[by_p] = p[by_p]
    need = np.nonzero(req & ~by_p)[0]
    ri = np.nonzero(resp)[0]
    if len(need) and len(ri):
        nn = max(1, nodes.n)
        s = nodes.src.astype(np.int64)
        d = nodes.dst.astype(np.int64)
        rk = s[ri] * nn + d[ri]
        u, first, cnt = np.unique(rk, return_index=True, return_counts=True)
        want = d[need] * nn + s[need]
        pos = np.minimum(np.searchsorted(u, want), len(u) - 1)
        hit = (u[pos] == want) & (cnt[pos] == 1)
        out[need[hit]] = ri[first[pos[hit]]]
    return out


# ---- roles and partners ----------------------------------------------------------------
def partners_by_sport(fl, nodes: Nodes, pairs=None) -> np.ndarray:
    """Partner flow (other direction of the QP pair) from the shared UDP source port: the
    flow of the reverse node pair with the same port, when the port is the only one of its
    value in both directions (not 0, not a node to itself); -1. pairs: pair_table(nodes)."""
    n = len(nodes.src)
    out = np.full(n, -1, dtype=np.int64)
    if n == 0:
        return out
    pid, _, rev = pair_table(nodes) if pairs is None else pairs
    _sport_kernel(pid, rev, np.ascontiguousarray(fl["sport"]), out)
    return out


#: a pair's flows are put in port order by insertion up to this many, by a merge sort above
_SHORT_RUN = 48


@njit(cache=True, nogil=True)
def _sport_kernel(pid, rev, sport, out):
    """The flows grouped by node pair (its runs in a key-sorted table, else a counting sort:
    flow order within a pair), each pair's ports sorted, then each pair's ports merged with
    its reverse pair's: no hash table over the flows."""
    k = rev.shape[0]
    n = pid.shape[0]
    off = np.zeros(k + 1, dtype=np.int64)
    fl = np.empty(n, dtype=np.int64)
    # a key-sorted table holds each pair's flows in one run, pairs numbered in run order:
    # the groups are the runs
    runs = 0
    for i in range(n):
        if i == 0 or pid[i] != pid[i - 1]:
            if pid[i] != runs:           # a pair seen before: not one run each
                runs = -1
                break
            off[runs] = i
            runs += 1
        fl[i] = i
    if runs == k:
        off[k] = n
    else:
        off[:] = 0
        for i in range(n):
            off[pid[i] + 1] += 1
        for q in range(k):
            off[q + 1] += off[q]
        pos = off[:k].copy()
        for i in range(n):
            fl[pos[pid[i]]] = i
            pos[pid[i]] += 1
    sp = np.empty(n, dtype=np.int64)
    for q in range(k):
        a = off[q]
        b = off[q + 1]
        if b - a <= _SHORT_RUN:
            for t in range(a, b):
                f = fl[t]
                v = sport[f]
                u = t
                while u > a and sp[u - 1] > v:
                    sp[u] = sp[u - 1]
                    fl[u] = fl[u - 1]
                    u -= 1
                sp[u] = v
                fl[u] = f
        else:
            seg = fl[a:b].copy()
            vals = np.empty(b - a, dtype=np.int64)
            for t in range(b - a):
                vals[t] = sport[seg[t]]
            o = np.argsort(vals, kind="mergesort")
            for t in range(b - a):
                fl[a + t] = seg[o[t]]
                sp[a + t] = vals[o[t]]
    for q in range(k):
        r = rev[q]
        if r < 0 or r == q:                  # no reverse pair, or a node to itself
            continue
        i = off[q]
        ie = off[q + 1]
        j = off[r]
        je = off[r + 1]
        while i < ie and j < je:
            v = sp[i]
            i2 = i + 1
            while i2 < ie and sp[i2] == v:
                i2 += 1
            while j < je and sp[j] < v:
                j += 1
            j2 = j
            while j2 < je and sp[j2] == v:
                j2 += 1
            if v != 0 and i2 - i == 1 and j2 - j == 1:
                out[fl[i]] = fl[j]
            i = i2
            j = j2


@njit(cache=True, nogil=True)
def _roles_kernel(op, msgs, msg_bytes, payload, packets, maxslot, dest_qp, sw_n, sw_bytes, sw_max,
                  roles, big, cand):
    """The per-flow part of flow_roles: base role, big (data with messages bigger than a
    CTS, or READ responses), cand (control candidate: small WRITE-only messages, or small
    SEND messages without WRITEs and READ responses). sw_n/sw_bytes/sw_max: the flow's
    SEND/WRITE records (count, bytes, largest) for flows whose counters mix them with READ
    requests (sw_n < 0: not needed, the counters are the SEND/WRITE messages). All three
    empty: not looked up; returns whether a flow mixes them (the caller then looks them up
    and runs the kernel again)."""
    n = msgs.shape[0]
    mixed = False
    for i in range(n):
        m = msgs[i]
        w = op[i, L.OPC_WRITE] > 0
        sd = op[i, L.OPC_SEND] > 0
        rreq = op[i, L.OPC_READ_REQ]
        rresp = op[i, L.OPC_READ_RESP] > 0 and payload[i] > 0
        mean = float(msg_bytes[i]) / float(m) if m > 0 else 0.0
        small = m > 0 and maxslot[i] >= 0 and maxslot[i] <= 10 and mean <= CTS_MAX_BYTES
        if rreq > 0 and sw_n.shape[0] == n and sw_n[i] >= 0:
            # the message counters hold the READ lengths too: judge the SENDs/WRITEs alone
            k = sw_n[i]
            small = k > 0 and sw_max[i] < 1024 and sw_bytes[i] <= CTS_MAX_BYTES * k
        has = m > 0 and (w or sd)
        r = ROLE_OTHER
        if has or rresp:
            r = ROLE_DATA
        elif rreq > 0:
            r = ROLE_READ_REQ
        elif op[i, L.OPC_CNP] == packets[i] and packets[i] > 0:
            r = ROLE_CNP
        elif op[i, L.OPC_ACK] + op[i, L.OPC_ATOMIC_ACK] > 0:
            r = ROLE_ACK
        roles[i] = r
        big[i] = (has and not small) or rresp
        # NCCL's CTS: small WRITEs; a verbs library's control (Open MPI's credits, rendezvous
        # headers, FINs): small SENDs on a flow that carries no bulk (no READ responses)
        cand[i] = small and not rresp and ((w and not sd and rreq == 0) or (sd and not w))
        if rreq > 0 and (w or sd) and sw_n.shape[0] != n:
            mixed = True
    return mixed


def _send_write_records(snap, fl) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(count, bytes, largest) of the SEND/WRITE records of each flow that also sends SENDs
    or WRITEs next to RDMA READ requests (a READ requester's counters add the READ lengths to
    its messages), -1/0/0 for the others; three empty arrays when the Snapshot has no
    records."""
    n = len(snap.flows)
    ev = snap.events
    op = fl["op"]
    if n == 0 or len(ev) == 0:
        z = np.zeros(0, dtype=np.int64)          # none: _roles_kernel reads the counters
        return z, np.zeros(0), z
    cnt = np.full(n, -1, dtype=np.int64)
    tot = np.zeros(n, dtype=np.float64)
    mx = np.zeros(n, dtype=np.int64)
    mixed = (op[:, L.OPC_READ_REQ] > 0) & ((op[:, L.OPC_SEND] > 0) | (op[:, L.OPC_WRITE] > 0))
    f = ev["flow"].astype(np.int64)
    oc = ev["opclass"]
    ok = (f >= 0) & (f < n) & ((oc == L.OPC_SEND) | (oc == L.OPC_WRITE))
    ok[ok] &= mixed[f[ok]]
    ff, by = f[ok], ev["bytes"][ok].astype(np.int64)
    cnt[mixed] = 0
    cnt += np.bincount(ff, minlength=n)
    tot[:] = np.bincount(ff, weights=by.astype(np.float64), minlength=n)
    if len(ff):
        np.maximum.at(mx, ff, by)
    return cnt, tot, mx


def flow_roles(snap, nodes: Nodes | None = None, partner: np.ndarray | None = None,
               cols: dict | None = None, pairs=None) -> np.ndarray:
    """Role of every flow (ROLE_* codes, names in ROLE_NAMES). See the module docstring.
    cols/nodes/partner/pairs: flow_columns/node_index/partners_by_sport/pair_table when the
    caller has them."""
    fl = flow_columns(snap.flows) if cols is None else cols
    n = len(snap.flows)
    roles = np.full(n, ROLE_OTHER, dtype=np.int8)
    if n == 0:
        return roles
    if nodes is None:
        nodes = node_index(snap.flows, fl)
    if pairs is None:
        pairs = pair_table(nodes)
    if partner is None:
        partner = partners_by_sport(fl, nodes, pairs)
    big = np.zeros(n, dtype=bool)
    cand = np.zeros(n, dtype=bool)
    args = (fl["op"], fl["messages"], fl["msg_bytes"], fl["payload_bytes"], fl["packets"], fl["max_slot"],
            fl["dest_qp"])
    z = np.zeros(0, dtype=np.int64)
    if _roles_kernel(*args, z, np.zeros(0), z, roles, big, cand):
        # READ requesters that also SEND/WRITE: judge those by their own records (rare)
        _roles_kernel(*args, *_send_write_records(snap, fl), roles, big, cand)
    # CTS: small WRITE-only messages facing bigger messages the other way (the partner flow's,
    # else any flow of the reverse node pair's); management last (it overrides)
    pid, _, rev = pairs
    _cts_roles(partner, big, cand, fl["dest_qp"], pid, rev, roles)
    return roles


@njit(cache=True, nogil=True)
def _cts_roles(partner, big, cand, dest_qp, pid, rev, roles):
    """roles: CTS where a control candidate faces bigger messages (its partner's, else any
    flow's of the reverse node pair: pair_table's ids), management on dest QP 1; in passes
    over the flows, no boolean masks."""
    n = roles.shape[0]
    need = False
    for i in range(n):
        if cand[i]:
            p = partner[i]
            if p < 0:
                need = True
            elif big[p]:
                roles[i] = ROLE_CTS
    if need:
        has_big = np.zeros(rev.shape[0], dtype=np.bool_)
        for i in range(n):
            if big[i]:
                has_big[pid[i]] = True
        for i in range(n):
            if cand[i] and partner[i] < 0:
                q = rev[pid[i]]
                if q >= 0 and has_big[q]:
                    roles[i] = ROLE_CTS
    for i in range(n):
        if dest_qp[i] == 1:
            roles[i] = ROLE_MGMT


def partners(fl, nodes: Nodes, roles: np.ndarray, by_sport: np.ndarray, pairs=None) -> np.ndarray:
    """by_sport, completed by elimination: a node pair with exactly one data flow one way and
    exactly one non-data (cts/ack/cnp/read request) flow the other way pairs them. pairs:
    pair_table(nodes) when the caller has it."""
    out = by_sport.copy()
    if len(by_sport) == 0:
        return out
    pid, _, rev = pair_table(nodes) if pairs is None else pairs
    _eliminate(pid, rev, roles, out)
    return out


@njit(cache=True, nogil=True)
def _eliminate(pid, rev, roles, out):
    """partners' elimination: each node pair's data and control flow counts in one pass, then
    every unpaired data flow alone on its pair takes the only control flow of the reverse
    pair when that one is unpaired too (distinct pairs: no two data flows compete)."""
    k = rev.shape[0]
    nd = np.zeros(k, dtype=np.int64)
    nc = np.zeros(k, dtype=np.int64)
    ctrl = np.full(k, -1, dtype=np.int64)
    n = roles.shape[0]
    for i in range(n):
        r = roles[i]
        if r == ROLE_DATA:
            nd[pid[i]] += 1
        elif r == ROLE_CTS or r == ROLE_ACK or r == ROLE_CNP or r == ROLE_READ_REQ:
            nc[pid[i]] += 1
            ctrl[pid[i]] = i
    for i in range(n):
        if roles[i] != ROLE_DATA or out[i] >= 0 or nd[pid[i]] != 1:
            continue
        q = rev[pid[i]]
        if q >= 0 and nc[q] == 1:
            j = ctrl[q]
            if out[j] < 0:
                out[i] = j
                out[j] = i


# ---- directed node pairs ----------------------------------------------------------------
def pair_table(nodes: Nodes):
    """The directed node pairs of the flows: (pair id per flow, in order of first
    appearance; each pair's key src * n + dst; each pair's reverse pair id, -1 when no flow
    goes that way), by hash (no sort)."""
    n = len(nodes.src)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    return _pair_table(np.ascontiguousarray(nodes.src), np.ascontiguousarray(nodes.dst), np.int64(max(1, nodes.n)))


@njit(cache=True, nogil=True)
def _pair_probe(slot_id, keys, key):
    """The slot of key in an open-addressing table over keys (its id's slot, or the empty
    slot where it goes)."""
    mask = slot_id.shape[0] - 1
    j = np.int64(_mix(np.uint64(key)) & np.uint64(mask))
    while slot_id[j] >= 0 and keys[slot_id[j]] != key:
        j = (j + 1) & mask
    return j


@njit(cache=True, nogil=True)
def _pair_table(src, dst, nn):
    n = src.shape[0]
    cap = 1024
    slot_id = np.full(cap, -1, dtype=np.int64)
    keys = np.empty(n, dtype=np.int64)
    pid = np.empty(n, dtype=np.int64)
    k = 0
    last = np.int64(-1)
    for i in range(n):
        key = np.int64(src[i]) * nn + np.int64(dst[i])
        if key == last:                  # a key-sorted table: runs of one pair, one probe each
            pid[i] = pid[i - 1]
            continue
        last = key
        j = _pair_probe(slot_id, keys, key)
        if slot_id[j] >= 0:
            pid[i] = slot_id[j]
            continue
        slot_id[j] = k
        keys[k] = key
        pid[i] = k
        k += 1
        if 2 * k >= cap:                 # grow: the k keys again into a table twice as big
            cap *= 2
            slot_id = np.full(cap, -1, dtype=np.int64)
            for q in range(k):
                slot_id[_pair_probe(slot_id, keys, keys[q])] = q
    rev = np.empty(k, dtype=np.int64)
    for q in range(k):
        s = keys[q] // nn
        d = keys[q] % nn
        rev[q] = slot_id[_pair_probe(slot_id, keys, d * nn + s)]
    return pid, keys[:k].copy(), rev
