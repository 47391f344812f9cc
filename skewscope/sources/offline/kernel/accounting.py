"""The flow table and the accounting (C: account in ebpf/skewscope.bpf.c): open addressing
with linear probing and backward-shift deletion over numpy arrays, an intrusive exact-LRU
list, flow instances, message records; the columns of struct ss_flow_stats."""
from __future__ import annotations

import numpy as np

from skewscope.core import layout as L
from skewscope.core.jit import njit
from skewscope.sources.offline.kernel.base import (
    FF_AFTER_READ,
    FF_MSG_OPEN,
    FF_MSG_STARTED,
    FF_PSN_VALID,
    G_ACCOUNTED,
    G_FLOWS_CREATED,
    G_MSG_PARTIAL,
    GAP_SLOTS,
    MID_CLASSES,
    MSG_SLOTS,
    N_OPCLASS,
    OPC_READ_REQ,
    OPC_SEND,
    OPT_ACKNOWLEDGE,
    OPT_AETH,
    OPT_CLASS_MASK,
    OPT_CLASS_SHIFT,
    OPT_CNP,
    OPT_FIRST,
    OPT_LAST,
    OPT_REQUEST,
    OPT_RETH,
    PSN_HALF,
    PSN_MASK,
    ST_CAP,
    ST_EVCAP,
    ST_EVLOST,
    ST_EVMAX,
    ST_EVN,
    ST_HEAD,
    ST_HMASK,
    ST_INSTCAP,
    ST_INSTN,
    ST_LRU,
    ST_MAXF,
    ST_NUSED,
    ST_PKCAP,
    ST_PKN,
    ST_TAIL,
)


# ---- the columns of struct ss_flow_stats -------------------------------------------------
#: S's columns, hot first: a packet touches the first three cache lines of its flow's row (the
#: rows are 64-byte multiples on a 64-byte aligned base: tables.py), a message boundary the
#: fourth, and only rare events (NAKs, PSN gaps, retransmissions) and the histograms the
#: rest. Fields not named here follow in struct order. "_lru" is no struct field: the slot's
#: last use (flow_lookup_or_insert).
_HOT = (
    "packets", "bytes", "payload_bytes", "last_ts", "flags", "sport", "tclass", "last_opcode",
    "op",
    "next_psn", "ecn_capable", "ce", "fecn", "becn", "cnp", "acks", "_lru",
    "messages", "msg_bytes", "msg_start_ts", "msg_cur_bytes", "msg_class", "last_msg_ts", "first_ts", "nak_seq",
)


def _stat_columns():
    """struct ss_flow_stats field -> (first column, width) in S (pads skipped), the _HOT ones
    first; the number of columns, rounded up to 8 (64-byte rows); the _lru column."""
    width = {f[0]: (f[2][0] if len(f) == 3 else 1) for f in L.FLOW_STATS_FIELDS if f[0] != "_pad"}
    width["_lru"] = 1
    order = list(_HOT) + [name for name in width if name not in _HOT]
    cols, c = {}, 0
    for name in order:
        cols[name] = (c, width[name])
        c += width[name]
    lru = cols.pop("_lru")[0]
    return cols, (c + 7) & ~7, lru


STAT_COLS, NCOL, C_LRU = _stat_columns()
assert STAT_COLS["op"][0] % 8 == 0 and STAT_COLS["messages"][0] % 8 == 0   # op: one cache line
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

# key_hash's multipliers (splitmix64's)
_M1 = np.int64(-7046029254386353131)   # 0x9E3779B97F4A7C15 as int64
_M2 = np.int64(-4658895280553007687)   # 0xBF58476D1CE4E5B9
_M3 = np.int64(-7723592293110705685)   # 0x94D049BB133111EB


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


@njit(cache=True)
def lru_build(st, S, lprev, lnext):
    """The exact LRU list (lprev/lnext, ST_HEAD/ST_TAIL) of the ST_NUSED live slots from their
    last use (S[:, C_LRU]: distinct, later = more recent), from now on kept (ST_LRU)."""
    n = st[ST_NUSED]
    order = np.argsort(S[:n, C_LRU])      # least recently used first
    for i in range(n):
        s = order[i]
        lnext[s] = order[i - 1] if i > 0 else -1
        lprev[s] = order[i + 1] if i + 1 < n else -1
    st[ST_TAIL] = order[0] if n > 0 else -1
    st[ST_HEAD] = order[n - 1] if n > 0 else -1
    st[ST_LRU] = 1


@njit(cache=True, inline="always")
def flow_lookup_or_insert(g, st, hidx, fhash, keys, S, lprev, lnext, finst, ikeys,
                          w0, w1, w2, w3, w4, h, cand):
    """The slot of the flow with this key (h: its key_hash); inserts (evicting the LRU flow
    when the table holds max_flows) when absent. Marks the flow most recently used: its
    S[s, C_LRU] = g[G_ACCOUNTED] (this packet's number), and, once evictions began (ST_LRU),
    its place at the head of the LRU list -- until then nothing reads the list, which
    lru_build makes from the C_LRU column at the first eviction. The caller guarantees a free
    slot or max_flows reached, and room in ikeys (see needs_grow). cand: a slot that may hold
    the key (found ahead of time: probe), or -1; used when it does (every slot below ST_NUSED
    is a live flow, and a key is in one slot at most)."""
    if cand >= 0 and cand < st[ST_NUSED] and keys[cand, 0] == w0 and keys[cand, 1] == w1 \
            and keys[cand, 2] == w2 and keys[cand, 3] == w3 and keys[cand, 4] == w4:
        S[cand, C_LRU] = g[G_ACCOUNTED]
        if st[ST_LRU] and st[ST_HEAD] != cand:
            lru_unlink(st, lprev, lnext, cand)
            lru_push_head(st, lprev, lnext, cand)
        return cand
    mask = st[ST_HMASK]
    i = h & mask
    while True:
        e = hidx[i]
        if e == 0:
            break
        s = e - 1
        if fhash[s] == h and keys[s, 0] == w0 and keys[s, 1] == w1 and keys[s, 2] == w2 \
                and keys[s, 3] == w3 and keys[s, 4] == w4:
            S[s, C_LRU] = g[G_ACCOUNTED]
            if st[ST_LRU] and st[ST_HEAD] != s:
                lru_unlink(st, lprev, lnext, s)
                lru_push_head(st, lprev, lnext, s)
            return s
        i = (i + 1) & mask
    # insert
    if st[ST_NUSED] >= st[ST_MAXF]:
        if not st[ST_LRU]:
            lru_build(st, S, lprev, lnext)
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
        lru_push_head(st, lprev, lnext, s)
    else:
        s = st[ST_NUSED]
        st[ST_NUSED] = s + 1
        if st[ST_LRU]:
            lru_push_head(st, lprev, lnext, s)
    S[s, C_LRU] = g[G_ACCOUNTED]
    hidx[i] = s + 1
    fhash[s] = h
    keys[s, 0] = w0
    keys[s, 1] = w1
    keys[s, 2] = w2
    keys[s, 3] = w3
    keys[s, 4] = w4
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


@njit(cache=True, inline="always")
def probe(hidx, fhash, h, mask):
    """The slot the index holds for hash h (the first with that hash on h's probe path), or -1:
    a candidate for flow_lookup_or_insert, which checks the key."""
    i = h & mask
    while True:
        e = hidx[i]
        if e == 0:
            return -1
        if fhash[e - 1] == h:
            return e - 1
        i = (i + 1) & mask


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


@njit(cache=True)
def has_room(st, m):
    """True when the next m accounted packets cannot need a table to grow (needs_grow): each
    adds one flow slot, flow instance and message record at most, and records no dissection
    row (the pipelined accounting, whose parse keeps none)."""
    return (st[ST_NUSED] + m <= st[ST_CAP] or st[ST_CAP] >= st[ST_MAXF]) and st[ST_INSTN] + m <= st[ST_INSTCAP] \
        and (st[ST_EVN] + m <= st[ST_EVCAP] or st[ST_EVCAP] >= st[ST_EVMAX]) and st[ST_PKCAP] == 0


# ---- accounting (C: account) -----------------------------------------------------------
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
            w0, w1, w2, w3, w4, h, cand, wire_len, payload, opinfo, psn, reth_len, sport, opcode,
            tclass, ecn_valid, fb, syndrome, ts):
    """One accounted packet of the flow with key w0..w4 (h, cand: flow_lookup_or_insert's)."""
    cls = (opinfo & OPT_CLASS_MASK) >> OPT_CLASS_SHIFT
    s = flow_lookup_or_insert(g, st, hidx, fhash, keys, S, lprev, lnext, finst, ikeys,
                              w0, w1, w2, w3, w4, h, cand)
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
