"""numba kernels of the offline path: record scanners (pcap, pcapng) and a line-by-line
mirror of ebpf/skewscope.bpf.c (`process`, `parse_l3`, `parse_gre`, `parse_bth`,
`handle_macctl`, `account`).

Keep this file in lock-step with the C. Every constant comes from skewscope/core/layout.py (the
mirror of ebpf/skewscope.h, checked against it by tests/unit/test_layout.py); the opcode
table is passed in as data (layout.OPCODE_TABLE, the same array the kernel's op_table map is
filled from). Differences from the kernel are deliberate and listed in docs/offline.md
(flow-table eviction is exact LRU here).

State lives in numpy arrays owned by skewscope/sources/offline/tables.py and passed to every call:

  g      int64[G_N]              the global counters (same indices as the BPF array)
  st     int64[ST_N]             scalars: flow-table fill, LRU ends, event/instance fill...
  hidx   int32[hsize]            open-addressing index (linear probing): slot + 1, 0 = empty
  fhash  int64[cap]              hash of each slot's key
  keys   int64[cap, 5]           flow key as 5 little-endian words = struct ss_flow_key bytes
  S      int64[cap, NCOL]        struct ss_flow_stats fields, one column per scalar/array elem
  lprev, lnext int32[cap]        LRU doubly-linked list (head = most recently used)
  finst  int64[cap]              flow instance id of the slot (G_FLOWS_CREATED at insert - 1)
  ev     int64[ev_cap, 5]        message records: instance, opclass, start, end, bytes (at most
                                 max_events are kept; the others are counted as lost)
  ikeys  int64[inst_cap, 5]      key of every flow instance ever created
  pk     int64[pk_cap, PK_N]     optional per-packet dissection (pk_cap 0 = off)

All integers are int64 (the C's u64 counters never get near 2^63); the final tables are
reinterpreted as the layout's unsigned dtypes.
"""
from __future__ import annotations

import numpy as np

from skewscope.core.jit import intrinsic, njit


@intrinsic
def borrow(typingctx, arr):
    """The same array without its meminfo: numba's reference counting becomes a no-op on it
    (the caller keeps the real array alive for the duration of the call)."""
    from numba.core import types  # heavy: typing runs only under numba

    def codegen(context, builder, sig, args):
        ary = context.make_array(sig.args[0])(context, builder, value=args[0])
        ary.meminfo = context.get_constant_null(types.MemInfoPointer(sig.args[0].dtype))
        return ary._getvalue()
    return arr(arr), codegen

from skewscope.core import layout as L

# ---- constants frozen into the compiled code (from layout.py only) ----------------------
G_N = L.G_N
G_ACCOUNTED = L.G_ACCOUNTED
G_NON_ROCE = L.G_NON_ROCE
G_PFC = L.G_PFC
G_PAUSE = L.G_PAUSE
G_FRAGMENT = L.G_FRAGMENT
G_UNKNOWN_OPCODE = L.G_UNKNOWN_OPCODE
G_TRUNC_ETH = L.G_TRUNC_ETH
G_TRUNC_VLAN = L.G_TRUNC_VLAN
G_VLAN_DEPTH = L.G_VLAN_DEPTH
G_TRUNC_IP = L.G_TRUNC_IP
G_TRUNC_UDP = L.G_TRUNC_UDP
G_TRUNC_GRH = L.G_TRUNC_GRH
G_TRUNC_BTH = L.G_TRUNC_BTH
G_TRUNC_EXT = L.G_TRUNC_EXT
G_TRUNC_MACCTL = L.G_TRUNC_MACCTL
G_BAD_LENGTH = L.G_BAD_LENGTH
G_FRAMES = L.G_FRAMES
G_FLOWS_CREATED = L.G_FLOWS_CREATED
G_MSG_PARTIAL = L.G_MSG_PARTIAL
G_DECAP = L.G_DECAP
G_PFC_PAUSE = L.G_PFC_PAUSE
G_PFC_XON = L.G_PFC_XON
G_PFC_QUANTA = L.G_PFC_QUANTA

ROCE_UDP_PORT = L.ROCE_UDP_PORT
ETH_P_ROCEV1 = L.ETH_P_ROCEV1
ETH_P_MACCTL = L.ETH_P_MACCTL
MACCTL_PAUSE = L.MACCTL_PAUSE
MACCTL_PFC = L.MACCTL_PFC
MAX_VLAN = L.MAX_VLAN
IPPROTO_GRE = L.IPPROTO_GRE
VXLAN_UDP_PORT = L.VXLAN_UDP_PORT
GRE_P_TEB = L.GRE_P_TEB
GRE_P_ERSPAN2 = L.GRE_P_ERSPAN2
GRE_P_ERSPAN3 = L.GRE_P_ERSPAN3
PSN_MASK = L.PSN_MASK
PSN_HALF = L.PSN_HALF

OPC_SEND = L.OPC_SEND
OPC_READ_REQ = L.OPC_READ_REQ
N_OPCLASS = L.N_OPCLASS
# classes of "middle" packets (skewscope.bpf.c SS_MID_CLASSES): no clock read, last_ts kept
MID_CLASSES = (1 << L.OPC_SEND) | (1 << L.OPC_WRITE) | (1 << L.OPC_READ_RESP)

OPT_EXTLEN_MASK = L.OPT_EXTLEN_MASK
OPT_CLASS_SHIFT = L.OPT_CLASS_SHIFT
OPT_CLASS_MASK = L.OPT_CLASS_MASK
OPT_VALID = L.OPT_VALID
OPT_REQUEST = L.OPT_REQUEST
OPT_FIRST = L.OPT_FIRST
OPT_LAST = L.OPT_LAST
OPT_RETH = L.OPT_RETH
OPT_AETH = L.OPT_AETH
OPT_PREFIX_SHIFT = L.OPT_PREFIX_SHIFT
OPT_PREFIX_MASK = L.OPT_PREFIX_MASK
OPT_CNP = L.OPT_CNP
OPT_ACKNOWLEDGE = L.OPT_ACKNOWLEDGE

FF_PSN_VALID = L.FF_PSN_VALID
FF_AFTER_READ = L.FF_AFTER_READ
FF_MSG_OPEN = L.FF_MSG_OPEN
FF_MSG_STARTED = L.FF_MSG_STARTED

MSG_SLOTS = L.MSG_SLOTS
GAP_SLOTS = L.GAP_SLOTS


def _stat_columns():
    """struct ss_flow_stats field -> (first column, width), in header order, pads skipped."""
    cols, c = {}, 0
    for f in L.FLOW_STATS_FIELDS:
        if f[0] == "_pad":
            continue
        w = f[2][0] if len(f) == 3 else 1
        cols[f[0]] = (c, w)
        c += w
    return cols, c


STAT_COLS, NCOL = _stat_columns()
C_PACKETS = STAT_COLS["packets"][0]
C_BYTES = STAT_COLS["bytes"][0]
C_PAYLOAD = STAT_COLS["payload_bytes"][0]
C_MESSAGES = STAT_COLS["messages"][0]
C_MSG_BYTES = STAT_COLS["msg_bytes"][0]
C_FIRST_TS = STAT_COLS["first_ts"][0]
C_LAST_TS = STAT_COLS["last_ts"][0]
C_OP = STAT_COLS["op"][0]
C_ECN = STAT_COLS["ecn_capable"][0]
C_CE = STAT_COLS["ce"][0]
C_FECN = STAT_COLS["fecn"][0]
C_BECN = STAT_COLS["becn"][0]
C_CNP = STAT_COLS["cnp"][0]
C_ACKS = STAT_COLS["acks"][0]
C_NAK_SEQ = STAT_COLS["nak_seq"][0]
C_NAK_RNR = STAT_COLS["nak_rnr"][0]
C_NAK_OTHER = STAT_COLS["nak_other"][0]
C_PSN_GAPS = STAT_COLS["psn_gaps"][0]
C_PSN_SKIPPED = STAT_COLS["psn_skipped"][0]
C_RETX = STAT_COLS["retransmissions"][0]
C_MSG_START = STAT_COLS["msg_start_ts"][0]
C_MSG_CUR = STAT_COLS["msg_cur_bytes"][0]
C_LAST_MSG = STAT_COLS["last_msg_ts"][0]
C_NEXT_PSN = STAT_COLS["next_psn"][0]
C_SPORT = STAT_COLS["sport"][0]
C_FLAGS = STAT_COLS["flags"][0]
C_TCLASS = STAT_COLS["tclass"][0]
C_MSG_CLASS = STAT_COLS["msg_class"][0]
C_LAST_OPCODE = STAT_COLS["last_opcode"][0]
C_MSG_HIST = STAT_COLS["msg_hist"][0]
C_GAP_HIST = STAT_COLS["gap_hist"][0]

# ---- scalar state indices ------------------------------------------------------------
ST_NUSED = 0       # slots in use (== live flows)
ST_HEAD = 1        # LRU head slot (most recent), -1 if none
ST_TAIL = 2        # LRU tail slot (least recent)
ST_MAXF = 3        # max_flows
ST_CAP = 4         # allocated slots (grows by doubling up to max_flows)
ST_HMASK = 5       # hidx size - 1
ST_EVN = 6
ST_EVCAP = 7
ST_INSTN = 8
ST_INSTCAP = 9
ST_FIRST_TS = 10   # -1 until the first record
ST_LAST_TS = 11
ST_CUT = 12        # records with caplen < original length (snaplen)
ST_RECORDS = 13    # records handed to process (== G_FRAMES)
ST_PKN = 14
ST_PKCAP = 15
ST_SKIP_LT = 16    # pcapng records on interfaces with an unsupported link type
ST_STOP_IF = 17    # pcapng: interface id of the offending record (corrupt stop)
ST_UNKNOWN_BLOCKS = 18  # pcapng blocks of a type the spec does not define (skipped)
ST_UNKNOWN_TYPE = 19    # the last such block type
ST_EVMAX = 20      # max_events: message records kept at most
ST_EVLOST = 21     # message records not kept (beyond max_events)
ST_N = 24

# scanner return status
S_NEED_DATA = 0    # pos = start of the first incomplete record/block (or end of data)
S_GROW = 1         # a table must grow before the record at pos can be processed
S_PYBLOCK = 2      # pcapng SHB/IDB at pos: Python parses it
S_BAD_RECLEN = 3   # pcap record length implausible
S_BAD_BLOCK = 4    # pcapng block length invalid / trailer mismatch / EPB overruns block
S_BAD_IFACE = 5    # pcapng packet for an interface not declared
S_FULL = 6         # scan_frames: no room in the output for the record at pos
S_RECORD = -1      # next_record: a complete record at pos

MAX_RECORD = 262144 * 4   # a pcap record claiming more is a corrupt file
MAX_BLOCK = 64 * 1024 * 1024

# link-layer kinds (link_view: the conventions)
K_UNSUPPORTED = -1
K_ETHERNET = 0
K_RAW = 1
K_SLL = 2
K_SLL2 = 3

# per-packet dissection columns
PK_TS, PK_CAT, PK_OPCODE, PK_QP, PK_PSN, PK_RETH, PK_PAYLOAD, PK_WIRE, PK_SYND, PK_FB, \
    PK_SPORT, PK_TCLASS, PK_IPVER, PK_ROCE, PK_W0, PK_W1, PK_W2, PK_W3 = range(18)
PK_N = 18

_M1 = np.int64(-7046029254386353131)   # 0x9E3779B97F4A7C15 as int64
_M2 = np.int64(-4658895280553007687)   # 0xBF58476D1CE4E5B9
_M3 = np.int64(-7723592293110705685)   # 0x94D049BB133111EB


# ---- byte helpers ----------------------------------------------------------------------
@njit(cache=True)
def be16(b, o):
    return (np.int64(b[o]) << 8) | np.int64(b[o + 1])


@njit(cache=True)
def le64(b, o):
    v = np.int64(0)
    for i in range(8):
        v |= np.int64(b[o + i]) << (8 * i)
    return v


@njit(cache=True)
def rd32(b, o, big):
    if big:
        return (np.int64(b[o]) << 24) | (np.int64(b[o + 1]) << 16) | (np.int64(b[o + 2]) << 8) | np.int64(b[o + 3])
    return (np.int64(b[o + 3]) << 24) | (np.int64(b[o + 2]) << 16) | (np.int64(b[o + 1]) << 8) | np.int64(b[o])


@njit(cache=True)
def rd16(b, o, big):
    if big:
        return (np.int64(b[o]) << 8) | np.int64(b[o + 1])
    return (np.int64(b[o + 1]) << 8) | np.int64(b[o])


@njit(cache=True)
def ss_slot(v, nslots):
    """slot 0 for 0, else floor(log2 v) + 1, clamped to the last slot (C: ss_slot)."""
    if v <= 0:
        return 0
    s = 0
    while v > 0:
        v >>= 1
        s += 1
    return s if s < nslots else nslots - 1


@njit(cache=True)
def mulshift(t, c, s):
    """floor(t * c / 2**s) exactly, for 0 <= t < 2**63, 0 <= c < 2**32, 0 <= s < 128."""
    m32 = np.int64(0xFFFFFFFF)
    a = t >> 32
    b = t & m32
    x = a * c                         # < 2**63
    y = b * c                         # < 2**64: may wrap into the sign bit; use logical shifts
    y_lo = y & m32
    y_hi = (y >> 32) & m32
    mid = (x & m32) + y_hi            # < 2**33
    low = ((mid & m32) << 32) | y_lo  # low 64 bits (as a bit pattern)
    high = (x >> 32) + (mid >> 32)
    if s == 0:
        return low
    if s >= 64:     # (a shift by 64 or more is undefined: its result is whatever the CPU leaves)
        return high >> (s - 64)
    return (high << (64 - s)) | ((low >> s) & ((np.int64(1) << (64 - s)) - 1))


# ---- flow table ------------------------------------------------------------------------
@njit(cache=True)
def key_hash(w0, w1, w2, w3, w4):
    h = w0 * _M1
    h = (h ^ w1) * _M2
    h = (h ^ w2) * _M1
    h = (h ^ w3) * _M2
    h = (h ^ w4) * _M3
    h ^= (h >> 31) & np.int64(0x1FFFFFFFF)
    return h


@njit(cache=True, inline="always")
def lru_unlink(st, lprev, lnext, s):
    p = lprev[s]
    n = lnext[s]
    if p >= 0:
        lnext[p] = n
    else:
        st[ST_HEAD] = n
    if n >= 0:
        lprev[n] = p
    else:
        st[ST_TAIL] = p


@njit(cache=True, inline="always")
def lru_push_head(st, lprev, lnext, s):
    h = st[ST_HEAD]
    lprev[s] = -1
    lnext[s] = h
    if h >= 0:
        lprev[h] = s
    else:
        st[ST_TAIL] = s
    st[ST_HEAD] = s


@njit(cache=True)
def hidx_delete(hidx, fhash, i, mask):
    """Remove the entry at hidx[i] (linear probing, backward-shift deletion)."""
    j = i
    while True:
        j = (j + 1) & mask
        e = hidx[j]
        if e == 0:
            break
        k = fhash[e - 1] & mask
        # the entry at j may move to i unless its home k lies cyclically in (i, j]
        if i <= j:
            stay = i < k <= j
        else:
            stay = k > i or k <= j
        if stay:
            continue
        hidx[i] = e
        i = j
    hidx[i] = 0


@njit(cache=True, inline="always")
def flow_lookup_or_insert(g, st, hidx, fhash, keys, S, lprev, lnext, finst, ikeys,
                          w0, w1, w2, w3, w4):
    """The slot of the flow with this key; inserts (evicting the LRU flow when the table holds
    max_flows) when absent. Marks the flow most recently used. The caller guarantees a free
    slot or max_flows reached, and room in ikeys (see needs_grow)."""
    mask = st[ST_HMASK]
    h = key_hash(w0, w1, w2, w3, w4)
    i = h & mask
    while True:
        e = hidx[i]
        if e == 0:
            break
        s = e - 1
        if fhash[s] == h and keys[s, 0] == w0 and keys[s, 1] == w1 and keys[s, 2] == w2 \
                and keys[s, 3] == w3 and keys[s, 4] == w4:
            if st[ST_HEAD] != s:
                lru_unlink(st, lprev, lnext, s)
                lru_push_head(st, lprev, lnext, s)
            return s
        i = (i + 1) & mask
    # insert
    if st[ST_NUSED] >= st[ST_MAXF]:
        s = st[ST_TAIL]
        lru_unlink(st, lprev, lnext, s)
        # find and delete the victim's index entry
        j = fhash[s] & mask
        while hidx[j] != s + 1:
            j = (j + 1) & mask
        hidx_delete(hidx, fhash, j, mask)
        for c in range(S.shape[1]):
            S[s, c] = 0
        # the new key's probe position may have changed after the deletion
        i = h & mask
        while hidx[i] != 0:
            i = (i + 1) & mask
    else:
        s = st[ST_NUSED]
        st[ST_NUSED] = s + 1
    hidx[i] = s + 1
    fhash[s] = h
    keys[s, 0] = w0
    keys[s, 1] = w1
    keys[s, 2] = w2
    keys[s, 3] = w3
    keys[s, 4] = w4
    lru_push_head(st, lprev, lnext, s)
    inst = g[G_FLOWS_CREATED]
    g[G_FLOWS_CREATED] = inst + 1
    finst[s] = inst
    n = st[ST_INSTN]
    ikeys[n, 0] = w0
    ikeys[n, 1] = w1
    ikeys[n, 2] = w2
    ikeys[n, 3] = w3
    ikeys[n, 4] = w4
    st[ST_INSTN] = n + 1
    return s


@njit(cache=True)
def rebuild_index(st, hidx, fhash):
    mask = st[ST_HMASK]
    for i in range(hidx.shape[0]):
        hidx[i] = 0
    for s in range(st[ST_NUSED]):
        i = fhash[s] & mask
        while hidx[i] != 0:
            i = (i + 1) & mask
        hidx[i] = s + 1


@njit(cache=True)
def needs_grow(st):
    """True when one more record might not fit: flow slots below max_flows exhausted, or no
    room for one more instance / message record / dissection row."""
    if st[ST_NUSED] >= st[ST_CAP] and st[ST_CAP] < st[ST_MAXF]:
        return True
    if st[ST_INSTN] >= st[ST_INSTCAP] or (st[ST_EVN] >= st[ST_EVCAP] and st[ST_EVCAP] < st[ST_EVMAX]):
        return True
    if st[ST_PKCAP] > 0 and st[ST_PKN] >= st[ST_PKCAP]:
        return True
    return False


# ---- accounting (C: account) -----------------------------------------------------------
@njit(cache=True)
def emit(st, ev, inst, start, end, nbytes, cls):
    n = st[ST_EVN]
    if n >= st[ST_EVMAX]:
        st[ST_EVLOST] += 1
        return
    ev[n, 0] = inst
    ev[n, 1] = cls
    ev[n, 2] = start
    ev[n, 3] = end
    ev[n, 4] = nbytes
    st[ST_EVN] = n + 1


@njit(cache=True, inline="always")
def account(g, st, hidx, fhash, keys, S, lprev, lnext, finst, ikeys, ev,
            w0, w1, w2, w3, w4, wire_len, payload, opinfo, psn, reth_len, sport, opcode,
            tclass, ecn_valid, fb, syndrome, ts):
    cls = (opinfo & OPT_CLASS_MASK) >> OPT_CLASS_SHIFT
    s = flow_lookup_or_insert(g, st, hidx, fhash, keys, S, lprev, lnext, finst, ikeys,
                              w0, w1, w2, w3, w4)
    g[G_ACCOUNTED] += 1
    f = S[s]
    # last_ts: the flow's last message boundary or control packet; middle packets (SEND/WRITE/
    # READ_RESPONSE MIDDLE: no FIRST/LAST, no RETH/AETH) leave it (the kernel reads no clock on them)
    if f[C_PACKETS] == 0:
        f[C_FIRST_TS] = ts
        f[C_LAST_TS] = ts
    elif (opinfo & (OPT_FIRST | OPT_LAST | OPT_RETH | OPT_AETH)) or not ((1 << cls) & MID_CLASSES):
        f[C_LAST_TS] = ts
    f[C_PACKETS] += 1
    f[C_BYTES] += wire_len
    f[C_PAYLOAD] += payload
    if cls < N_OPCLASS:
        f[C_OP + (cls & (N_OPCLASS - 1))] += 1
    if ecn_valid:
        ecn = tclass & 3
        if ecn:
            f[C_ECN] += 1
        if ecn == 3:
            f[C_CE] += 1
    if fb & 0x80:
        f[C_FECN] += 1
    if fb & 0x40:
        f[C_BECN] += 1
    f[C_SPORT] = sport
    f[C_TCLASS] = tclass
    f[C_LAST_OPCODE] = opcode

    if opinfo & OPT_CNP:
        f[C_CNP] += 1
    if opinfo & OPT_ACKNOWLEDGE:
        sc = syndrome >> 5
        if sc == 0:
            f[C_ACKS] += 1
        elif sc == 1:
            f[C_NAK_RNR] += 1
        elif sc == 3 and (syndrome & 0x1F) == 0:
            f[C_NAK_SEQ] += 1
        else:
            f[C_NAK_OTHER] += 1

    # PSN tracking on request packets (24-bit serial arithmetic)
    if opinfo & OPT_REQUEST:
        flags = f[C_FLAGS]
        if not (flags & FF_PSN_VALID):
            flags |= FF_PSN_VALID
            f[C_NEXT_PSN] = (psn + 1) & PSN_MASK
        else:
            d = (psn - f[C_NEXT_PSN]) & PSN_MASK
            if d >= PSN_HALF:
                f[C_RETX] += 1
            else:
                if d != 0 and not (flags & FF_AFTER_READ):
                    f[C_PSN_GAPS] += 1
                    f[C_PSN_SKIPPED] += d
                f[C_NEXT_PSN] = (psn + 1) & PSN_MASK
                flags &= ~FF_AFTER_READ
        if cls == OPC_READ_REQ:
            flags |= FF_AFTER_READ
        f[C_FLAGS] = flags

    # messages: starts, sizes, gaps, records
    if opinfo & OPT_FIRST:
        f[C_MESSAGES] += 1
        if opinfo & OPT_RETH:
            f[C_MSG_HIST + ss_slot(reth_len, MSG_SLOTS)] += 1
            f[C_MSG_BYTES] += reth_len
        if f[C_FLAGS] & FF_MSG_STARTED:
            last = f[C_LAST_MSG]
            gap = ts - last if ts >= last else 0
            f[C_GAP_HIST + ss_slot(gap, GAP_SLOTS)] += 1
        f[C_LAST_MSG] = ts
        f[C_FLAGS] |= FF_MSG_STARTED | FF_MSG_OPEN
        f[C_MSG_START] = ts
        f[C_MSG_CLASS] = cls
        f[C_MSG_CUR] = 0 if cls == OPC_SEND else reth_len
        if cls == OPC_READ_REQ:
            emit(st, ev, finst[s], ts, ts, reth_len, OPC_READ_REQ)
            f[C_FLAGS] &= ~FF_MSG_OPEN
    if cls == OPC_SEND and (f[C_FLAGS] & FF_MSG_OPEN) and f[C_MSG_CLASS] == OPC_SEND:
        f[C_MSG_CUR] += payload
    if opinfo & OPT_LAST:
        if (f[C_FLAGS] & FF_MSG_OPEN) and f[C_MSG_CLASS] == cls:
            if cls == OPC_SEND:
                f[C_MSG_HIST + ss_slot(f[C_MSG_CUR], MSG_SLOTS)] += 1
                f[C_MSG_BYTES] += f[C_MSG_CUR]
            emit(st, ev, finst[s], f[C_MSG_START], ts, f[C_MSG_CUR], cls)
            f[C_FLAGS] &= ~FF_MSG_OPEN
        else:
            g[G_MSG_PARTIAL] += 1


# ---- parsing (C: process / parse_bth / handle_macctl) -------------------------------------
@njit(cache=True, inline="always")
def handle_macctl(g, b, cur, end):
    if cur + 20 > end:
        # a global pause needs only opcode + 1 time
        if not (cur + 4 > end) and be16(b, cur) == MACCTL_PAUSE:
            return G_PAUSE
        return G_TRUNC_MACCTL
    opc = be16(b, cur)
    if opc == MACCTL_PAUSE:
        return G_PAUSE
    if opc != MACCTL_PFC:
        return G_NON_ROCE
    en = be16(b, cur + 2)
    for i in range(8):
        if en & (1 << i):
            t = be16(b, cur + 4 + 2 * i)
            if t:
                g[G_PFC_PAUSE + i] += 1
                g[G_PFC_QUANTA + i] += t
            else:
                g[G_PFC_XON + i] += 1
    return G_PFC


_Z = np.int64(0)
DECAP = 0xFF   # internal result of parse_l3 on an outer frame (C: SS_DECAP), never a category


@njit(cache=True, inline="always")
def parse_vlans(b, proto, cur, end):
    """VLAN tags after an Ethernet header that ends at `cur` with EtherType `proto`
    (C: parse_l2 after its Ethernet check). Returns (category, proto, cur)."""
    for _ in range(MAX_VLAN):
        if proto != 0x8100 and proto != 0x88A8:
            break
        if cur + 4 > end:
            return G_TRUNC_VLAN, proto, cur
        proto = be16(b, cur + 2)
        cur += 4
    if proto == 0x8100 or proto == 0x88A8:
        return G_VLAN_DEPTH, proto, cur
    return G_ACCOUNTED, proto, cur


@njit(cache=True, inline="always")
def parse_gre(b, gre, end):
    """C: parse_gre. Returns (category or DECAP, inner, iproto)."""
    if gre + 4 > end:
        return G_TRUNC_IP, _Z, _Z
    flags = be16(b, gre)
    gp = be16(b, gre + 2)
    if flags & 0x0007:
        return G_NON_ROCE, _Z, _Z
    if flags & 0x4000:
        return G_TRUNC_IP, _Z, _Z
    cur = gre + 4 + ((flags >> 13) & 4) + ((flags >> 11) & 4) + ((flags >> 10) & 4)
    iproto = _Z
    if gp == GRE_P_TEB:
        pass
    elif gp == GRE_P_ERSPAN2:
        if flags & 0x1000:
            cur += 8
    elif gp == GRE_P_ERSPAN3:
        if cur + 12 > end:
            return G_TRUNC_IP, _Z, _Z
        cur += 20 if (b[cur + 11] & 1) else 12
    elif gp == 0x0800 or gp == 0x86DD:
        iproto = gp
    else:
        return G_NON_ROCE, _Z, _Z
    if cur > end:
        return G_TRUNC_IP, _Z, _Z
    return DECAP, cur, iproto


@njit(cache=True, inline="always")
def parse_bth(b, bth, end, avail, optab):
    """C: parse_bth. Returns (category, opcode, opinfo, payload, fb, dqp, psn, reth_len,
    syndrome)."""
    if bth + 12 > end:
        return G_TRUNC_BTH, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z
    opcode = np.int64(b[bth])
    opinfo = np.int64(optab[opcode])
    if not (opinfo & OPT_VALID):
        return G_UNKNOWN_OPCODE, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z
    ext = opinfo & OPT_EXTLEN_MASK
    prefix = (opinfo & OPT_PREFIX_MASK) >> OPT_PREFIX_SHIFT
    pad = (np.int64(b[bth + 1]) >> 4) & 3
    need = 12 + ext + pad + 4
    if avail < need:
        return G_BAD_LENGTH, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z
    payload = avail - need
    fb = np.int64(b[bth + 4])
    dqp = (np.int64(b[bth + 5]) << 16) | (np.int64(b[bth + 6]) << 8) | np.int64(b[bth + 7])
    psn = (np.int64(b[bth + 9]) << 16) | (np.int64(b[bth + 10]) << 8) | np.int64(b[bth + 11])
    if bth + 12 + ext > end:
        return G_TRUNC_EXT, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z
    reth_len = _Z
    syndrome = _Z
    if opinfo & OPT_RETH:
        r = bth + 12 + (prefix & 0xF)
        if r + 16 > end:
            return G_TRUNC_EXT, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z
        reth_len = (np.int64(b[r + 12]) << 24) | (np.int64(b[r + 13]) << 16) \
            | (np.int64(b[r + 14]) << 8) | np.int64(b[r + 15])
    if opinfo & OPT_AETH:
        a = bth + 12 + (prefix & 0xF)
        if a + 4 > end:
            return G_TRUNC_EXT, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z
        syndrome = np.int64(b[a])
    return G_ACCOUNTED, opcode, opinfo, payload, fb, dqp, psn, reth_len, syndrome


@njit(cache=True, inline="always")
def parse_l3(g, b, proto, cur, end, l3off, outer, optab):
    """C: parse_l3. Returns (category or DECAP, l3end, inner, iproto, w0, w1, w2, w3, ipver,
    roce, tclass, ecn_valid, sport, bth, avail): the transport is then parsed by the caller
    (parse_bth) when the category is accounted and bth >= 0."""
    if proto == 0x0800:
        if cur + 20 > end:
            return G_TRUNC_IP, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z
        vi = np.int64(b[cur])
        ihl = (vi & 0xF) * 4
        if (vi >> 4) != 4 or ihl < 20:
            return G_TRUNC_IP, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z
        if be16(b, cur + 6) & 0x3FFF:
            return G_FRAGMENT, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z
        if b[cur + 9] != 17:
            if outer and b[cur + 9] == IPPROTO_GRE:
                c, inner, iproto = parse_gre(b, cur + ihl, end)
                return c, l3off + be16(b, cur + 2), inner, iproto, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z
            return G_NON_ROCE, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z
        udp = cur + ihl
        if udp + 8 > end:
            return (G_TRUNC_IP if udp > end else G_TRUNC_UDP), _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, \
                _Z, _Z, _Z
        dport = be16(b, udp + 2)
        if dport != ROCE_UDP_PORT:
            if outer and dport == VXLAN_UDP_PORT:
                if udp + 16 > end:
                    return G_TRUNC_UDP, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z
                return DECAP, l3off + be16(b, cur + 2), udp + 16, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z
            return G_NON_ROCE, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z
        tot = be16(b, cur + 2)
        ulen = be16(b, udp + 4)
        if ulen < 8 or tot < ihl + ulen:
            return G_BAD_LENGTH, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z
        w1 = (np.int64(0xFFFF) << 16) | (np.int64(b[cur + 12]) << 32) | (np.int64(b[cur + 13]) << 40) \
            | (np.int64(b[cur + 14]) << 48) | (np.int64(b[cur + 15]) << 56)
        w3 = (np.int64(0xFFFF) << 16) | (np.int64(b[cur + 16]) << 32) | (np.int64(b[cur + 17]) << 40) \
            | (np.int64(b[cur + 18]) << 48) | (np.int64(b[cur + 19]) << 56)
        return G_ACCOUNTED, l3off + tot, _Z, _Z, _Z, w1, _Z, w3, np.int64(4), np.int64(2), \
            np.int64(b[cur + 1]), np.int64(1), be16(b, udp), udp + 8, ulen - 8
    elif proto == 0x86DD:
        if cur + 40 > end:
            return G_TRUNC_IP, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z
        if (b[cur] >> 4) != 6:
            return G_TRUNC_IP, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z
        nh = b[cur + 6]
        if nh == 44:
            return G_FRAGMENT, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z
        if nh != 17:
            if outer and nh == IPPROTO_GRE:
                c, inner, iproto = parse_gre(b, cur + 40, end)
                return c, l3off + 40 + be16(b, cur + 4), inner, iproto, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z
            return G_NON_ROCE, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z
        udp = cur + 40
        if udp + 8 > end:
            return G_TRUNC_UDP, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z
        dport = be16(b, udp + 2)
        if dport != ROCE_UDP_PORT:
            if outer and dport == VXLAN_UDP_PORT:
                if udp + 16 > end:
                    return G_TRUNC_UDP, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z
                return DECAP, l3off + 40 + be16(b, cur + 4), udp + 16, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, \
                    _Z, _Z
            return G_NON_ROCE, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z
        plen = be16(b, cur + 4)
        ulen = be16(b, udp + 4)
        if ulen < 8 or plen < ulen:
            return G_BAD_LENGTH, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z
        tclass = ((np.int64(b[cur]) & 0xF) << 4) | (np.int64(b[cur + 1]) >> 4)
        return G_ACCOUNTED, l3off + 40 + plen, _Z, _Z, le64(b, cur + 8), le64(b, cur + 16), le64(b, cur + 24), \
            le64(b, cur + 32), np.int64(6), np.int64(2), tclass, np.int64(1), be16(b, udp), udp + 8, ulen - 8
    elif proto == ETH_P_ROCEV1:
        if cur + 40 > end:
            return G_TRUNC_GRH, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z
        if (b[cur] >> 4) != 6:
            return G_TRUNC_GRH, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z
        tclass = ((np.int64(b[cur]) & 0xF) << 4) | (np.int64(b[cur + 1]) >> 4)
        avail = be16(b, cur + 4)
        return G_ACCOUNTED, l3off + 40 + avail, _Z, _Z, le64(b, cur + 8), le64(b, cur + 16), le64(b, cur + 24), \
            le64(b, cur + 32), np.int64(6), np.int64(1), tclass, _Z, _Z, cur + 40, avail
    elif proto == ETH_P_MACCTL:
        return handle_macctl(g, b, cur, end), _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z
    return G_NON_ROCE, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z


@njit(cache=True, inline="always")
def process(g, st, hidx, fhash, keys, S, lprev, lnext, finst, ikeys, ev, pk, optab,
            b, proto, cur, end, wire_len, ts):
    """Parse one frame whose 14-byte Ethernet header ends at `cur` (EtherType `proto`),
    captured bytes up to `end` (exclusive), `wire_len` bytes long on the wire; account it.
    Returns the category. One level of decapsulation (GRE/ERSPAN/VXLAN) as the C: the
    inner frame is parsed like a top-level one, its bytes are the inner Ethernet frame's."""
    l2end = cur
    opcode = opinfo = payload = fb = dqp = psn = reth_len = syndrome = _Z
    cat, proto, cur = parse_vlans(b, proto, cur, end)
    if cat != G_ACCOUNTED:
        return cat
    # where L3 starts in the frame; l3end = where its length field says it ends (checked last)
    cat, l3end, inner, iproto, w0, w1, w2, w3, ipver, roce, tclass, ecn_valid, sport, bth, avail = \
        parse_l3(g, b, proto, cur, end, 14 + (cur - l2end), True, optab)
    if cat == DECAP:
        g[G_DECAP] += 1
        outer_end = l3end
        frame_len = wire_len
        ioff = inner - l2end + 14     # wire offset of the inner frame
        wire_len = wire_len - ioff if wire_len > ioff else 0
        if iproto:
            wire_len += 14            # GRE carrying IP: synthesised Ethernet header
            proto = iproto
            cur = inner
            l3off = 14
        else:
            if inner + 14 > end:
                return G_TRUNC_ETH
            cat, proto, cur = parse_vlans(b, be16(b, inner + 12), inner + 14, end)
            if cat != G_ACCOUNTED:
                return cat
            l3off = cur - inner
        cat, l3end, inner, iproto, w0, w1, w2, w3, ipver, roce, tclass, ecn_valid, sport, bth, avail = \
            parse_l3(g, b, proto, cur, end, l3off, False, optab)
        if cat == G_ACCOUNTED:
            cat, opcode, opinfo, payload, fb, dqp, psn, reth_len, syndrome = parse_bth(b, bth, end, avail, optab)
        if cat == G_ACCOUNTED and outer_end > frame_len:
            return G_BAD_LENGTH
    elif cat == G_ACCOUNTED:
        cat, opcode, opinfo, payload, fb, dqp, psn, reth_len, syndrome = parse_bth(b, bth, end, avail, optab)
    if cat != G_ACCOUNTED:
        return cat
    # Headers all present, but the IP/GRH length claims more bytes than the frame has: a
    # length lie, bad_length (C: checked after the header parse, so a frame cut inside a
    # header still counts as truncated_<that header>)
    if l3end > wire_len:
        return G_BAD_LENGTH

    w4 = dqp | (np.int64(ipver) << 32) | (np.int64(roce) << 40)
    if st[ST_PKCAP] > 0:
        n = st[ST_PKN]
        pk[n, PK_OPCODE] = opcode
        pk[n, PK_QP] = dqp
        pk[n, PK_PSN] = psn
        pk[n, PK_RETH] = reth_len if (opinfo & OPT_RETH) else -1
        pk[n, PK_PAYLOAD] = payload
        pk[n, PK_SYND] = syndrome if (opinfo & OPT_AETH) else -1
        pk[n, PK_FB] = fb
        pk[n, PK_SPORT] = sport
        pk[n, PK_TCLASS] = tclass
        pk[n, PK_IPVER] = ipver
        pk[n, PK_ROCE] = roce
        pk[n, PK_W0] = w0
        pk[n, PK_W1] = w1
        pk[n, PK_W2] = w2
        pk[n, PK_W3] = w3
    account(g, st, hidx, fhash, keys, S, lprev, lnext, finst, ikeys, ev,
            w0, w1, w2, w3, w4, wire_len, payload, opinfo, psn, reth_len, sport, opcode,
            tclass, ecn_valid, fb, syndrome, ts)
    return G_ACCOUNTED


@njit(cache=True, inline="always")
def link_view(b, off, incl, orig, kind):
    """The Ethernet view of one capture record of link-layer `kind` at b[off:off+incl],
    original length `orig` (the link-type conventions, docs/offline.md): Ethernet as is;
    Linux cooked v1/v2 and raw IP become an Ethernet frame with a synthesised 14-byte
    header (zero MACs, the packet's EtherType), the original length adjusted by the same
    difference. Returns (ok, proto, cur, wire): ok False when the record is too short for
    its link-layer header (counted as truncated_eth, never dropped); proto the EtherType,
    cur the first byte after the link-layer header, wire the Ethernet frame's length on the
    wire (at least its captured length)."""
    wire = orig if orig > incl else incl
    ok = True
    proto = 0
    cur = off
    if kind == K_ETHERNET:
        if incl < 14:
            ok = False
        else:
            proto = be16(b, off + 12)
            cur = off + 14
    elif kind == K_RAW:
        wire += 14
        if incl < 1:
            ok = False
        else:
            v = b[off] >> 4
            proto = 0x0800 if v == 4 else (0x86DD if v == 6 else 0)
    elif kind == K_SLL:
        wire = wire - 2 if wire > 2 else 0
        if incl < 16:
            ok = False
        else:
            proto = be16(b, off + 14)
            cur = off + 16
    else:  # K_SLL2
        wire = wire - 6 if wire > 6 else 0
        if incl < 20:
            ok = False
        else:
            proto = be16(b, off)
            cur = off + 20
    return ok, proto, cur, wire


@njit(cache=True, inline="always")
def record(g, st, hidx, fhash, keys, S, lprev, lnext, finst, ikeys, ev, pk, optab,
           b, off, incl, orig, kind, ts):
    """One capture record of link-layer `kind` at b[off:off+incl], original length `orig`,
    seen as an Ethernet frame (link_view); one too short for its link header counts as
    truncated_eth."""
    if st[ST_FIRST_TS] < 0:
        st[ST_FIRST_TS] = ts
    st[ST_LAST_TS] = ts
    st[ST_RECORDS] += 1
    g[G_FRAMES] += 1
    if orig > incl:
        st[ST_CUT] += 1
    if st[ST_PKCAP] > 0:
        n = st[ST_PKN]
        for c in range(PK_N):
            pk[n, c] = -1
        pk[n, PK_TS] = ts
    ok, proto, cur, wire = link_view(b, off, incl, orig, kind)
    cat = G_ACCOUNTED if ok else G_TRUNC_ETH
    if cat == G_ACCOUNTED:
        cat = process(g, st, hidx, fhash, keys, S, lprev, lnext, finst, ikeys, ev, pk, optab,
                      b, proto, cur, off + incl, wire, ts)
    if cat != G_ACCOUNTED:
        g[cat] += 1
    if st[ST_PKCAP] > 0:
        n = st[ST_PKN]
        pk[n, PK_CAT] = cat
        pk[n, PK_WIRE] = wire
        st[ST_PKN] = n + 1


# ---- record scanner -----------------------------------------------------------------------
@njit(cache=True)
def pcapng_ts(ticks, res):
    """if_tsresol -> ns, exactly (integer arithmetic, no float rounding at ns), for every value
    the option's byte can hold: 2^-s s for s = 0..127, 10^-e s for e = 0..127."""
    if res & 0x80:
        return mulshift(ticks, 1000000000, res & 0x7F)
    if res <= 9:
        m = 1
        for _ in range(9 - res):
            m *= 10
        return ticks * m
    if res > 9 + 18:
        # ticks < 2^63 < 10^19: 0 ns. (Not only a shortcut: 10^k wraps int64 to 0 from k = 64,
        # and the compiler, which takes a product of nonzero factors for nonzero, drops the
        # zero check: the divide instruction then kills the process with SIGFPE.)
        return 0
    d = 1
    for _ in range(res - 9):
        d *= 10
    return ticks // d


FMT_PCAP = 0
FMT_PCAPNG = 1


@njit(cache=True, inline="always")
def next_record(b, pos, end, fmt, big, ts_mult, kind, if_kind, if_res, if_snap, n_if, st):
    """The record walk: the one place that reads the capture formats' record framing (both
    scanners below inline it). From b[pos:end], classic pcap (fmt FMT_PCAP: byte order
    `big`, ts_mult 1 (ns) or 1000 (us), link-layer `kind`) or pcapng (FMT_PCAPNG: blocks of
    byte order `big`; n_if interfaces with link-layer kind / if_tsresol / snaplen in if_*).
    Skips (and counts in st) pcapng blocks that carry no packet and packets on interfaces of
    an unsupported link type. Returns (status, pos, nxt, data, incl, orig, kind, ts):
    status S_RECORD for a complete record at pos (its bytes b[data:data+incl], the next
    record at nxt), else the reason to stop at pos (S_NEED_DATA, S_PYBLOCK, S_BAD_*)."""
    while True:
        if fmt == FMT_PCAP:
            if pos + 16 > end:
                return S_NEED_DATA, pos, pos, 0, 0, 0, 0, 0
            incl = rd32(b, pos + 8, big)
            if incl > MAX_RECORD:
                return S_BAD_RECLEN, pos, pos, 0, 0, 0, 0, 0
            nxt = pos + 16 + incl
            if nxt > end:
                return S_NEED_DATA, pos, pos, 0, 0, 0, 0, 0
            orig = rd32(b, pos + 12, big)
            ts = rd32(b, pos, big) * 1000000000 + rd32(b, pos + 4, big) * ts_mult
            return S_RECORD, pos, nxt, pos + 16, incl, orig, kind, ts
        if pos + 12 > end:
            return S_NEED_DATA, pos, pos, 0, 0, 0, 0, 0
        btype = rd32(b, pos, big)
        if btype == 0x0A0D0D0A or btype == 1:
            return S_PYBLOCK, pos, pos, 0, 0, 0, 0, 0
        blen = rd32(b, pos + 4, big)
        if blen < 12 or (blen & 3) or blen > MAX_BLOCK:
            return S_BAD_BLOCK, pos, pos, 0, 0, 0, 0, 0
        nxt = pos + blen
        if nxt > end:
            return S_NEED_DATA, pos, pos, 0, 0, 0, 0, 0
        if rd32(b, nxt - 4, big) != blen:
            return S_BAD_BLOCK, pos, pos, 0, 0, 0, 0, 0
        body = pos + 8
        blim = nxt - 4
        if btype != 6 and btype != 3 and btype != 2:
            if not (btype == 4 or btype == 5 or btype == 7 or btype == 8 or btype == 9
                    or btype == 10 or btype == 0xBAD or btype == 0x40000BAD):
                # NRB, ISB, IRIG, AFDX, systemd journal, DSB and custom blocks are
                # known and irrelevant; anything else is skipped too (the spec says so)
                # but reported
                st[ST_UNKNOWN_BLOCKS] += 1
                st[ST_UNKNOWN_TYPE] = btype
            pos = nxt
            continue
        if btype == 3:      # SPB: interface 0, no timestamp
            if body + 4 > blim:
                return S_BAD_BLOCK, pos, pos, 0, 0, 0, 0, 0
            iid = 0
            ticks = 0
            orig = rd32(b, body, big)
            data = body + 4
            incl = blim - data
            if orig < incl:
                incl = orig
            if n_if > 0 and if_snap[0] > 0 and if_snap[0] < incl:
                incl = if_snap[0]
        else:               # EPB (6) or the obsolete Packet Block (2)
            if body + 20 > blim:
                return S_BAD_BLOCK, pos, pos, 0, 0, 0, 0, 0
            iid = rd32(b, body, big) if btype == 6 else rd16(b, body, big)
            ticks = (rd32(b, body + 4, big) << 32) | rd32(b, body + 8, big)
            incl = rd32(b, body + 12, big)
            orig = rd32(b, body + 16, big)
            data = body + 20
            if data + incl > blim:
                return S_BAD_BLOCK, pos, pos, 0, 0, 0, 0, 0
        if iid >= n_if:
            st[ST_STOP_IF] = iid
            return S_BAD_IFACE, pos, pos, 0, 0, 0, 0, 0
        k = if_kind[iid]
        if k == K_UNSUPPORTED:
            st[ST_SKIP_LT] += 1
            pos = nxt
            continue
        return S_RECORD, pos, nxt, data, incl, orig, k, pcapng_ts(ticks, if_res[iid])


@njit(cache=True)
def scan(b, pos, end, fmt, big, ts_mult, kind, if_kind, if_res, if_snap, n_if,
         g, st, hidx, fhash, keys, S, lprev, lnext, finst, ikeys, ev, pk, optab):
    """Parse and account the records in b[pos:end] (the walk: next_record). Stops at the
    first record or block that is incomplete, that Python must handle (pcapng SHB/IDB), that
    needs a table to grow, or that is corrupt. Returns (pos, status).

    One call site of `record` (everything is inlined into this function: compiled once).
    The arrays are `borrow`ed: without that, numba's reference counting of the many array
    arguments of the inlined helpers costs ~100 ns per packet."""
    b = borrow(b)
    if_kind = borrow(if_kind)
    if_res = borrow(if_res)
    if_snap = borrow(if_snap)
    g = borrow(g)
    st = borrow(st)
    hidx = borrow(hidx)
    fhash = borrow(fhash)
    keys = borrow(keys)
    S = borrow(S)
    lprev = borrow(lprev)
    lnext = borrow(lnext)
    finst = borrow(finst)
    ikeys = borrow(ikeys)
    ev = borrow(ev)
    pk = borrow(pk)
    optab = borrow(optab)
    while True:
        status, pos, nxt, data, incl, orig, k, ts = next_record(b, pos, end, fmt, big, ts_mult, kind, if_kind,
                                                                if_res, if_snap, n_if, st)
        if status != S_RECORD:
            return pos, status
        if needs_grow(st):
            return pos, S_GROW
        record(g, st, hidx, fhash, keys, S, lprev, lnext, finst, ikeys, ev, pk, optab,
               b, data, incl, orig, k, ts)
        pos = nxt


@njit(cache=True)
def scan_frames(b, pos, end, fmt, big, ts_mult, kind, if_kind, if_res, if_snap, n_if, st, rec, n, out, o):
    """Copy the records in b[pos:end] out as Ethernet frames (the walk: next_record; the
    link-type conventions: link_view), for readers that need the frames themselves
    (`skewscope replay`). Row n of rec (int64[cap, 4]) gets [ts ns, original length, captured
    length, offset in out] of the frame written to out[o:] (uint8). A record too short for
    its link-layer header becomes an empty frame (Ethernet ones keep their bytes). Counts
    records in st[ST_RECORDS]. Returns (pos, status, n, o): S_FULL when rec or out has no
    room for the record at pos, else as scan."""
    b = borrow(b)
    if_kind = borrow(if_kind)
    if_res = borrow(if_res)
    if_snap = borrow(if_snap)
    st = borrow(st)
    rec = borrow(rec)
    out = borrow(out)
    cap = rec.shape[0]
    room = out.shape[0]
    while True:
        status, pos, nxt, data, incl, orig, k, ts = next_record(b, pos, end, fmt, big, ts_mult, kind, if_kind,
                                                                if_res, if_snap, n_if, st)
        if status != S_RECORD:
            return pos, status, n, o
        ok, proto, cur, wire = link_view(b, data, incl, orig, k)
        if k == K_ETHERNET:
            flen = incl
        elif ok:
            flen = 14 + data + incl - cur
        else:
            flen = 0
        if n >= cap or o + flen > room:
            return pos, S_FULL, n, o
        if k == K_ETHERNET:
            out[o:o + flen] = b[data:data + flen]
        elif ok:
            out[o:o + 12] = 0
            out[o + 12] = proto >> 8
            out[o + 13] = proto & 0xFF
            out[o + 14:o + flen] = b[cur:data + incl]
        rec[n, 0] = ts
        rec[n, 1] = wire
        rec[n, 2] = flen
        rec[n, 3] = o
        st[ST_RECORDS] += 1
        n += 1
        o += flen
        pos = nxt
