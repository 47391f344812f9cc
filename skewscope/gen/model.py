"""The traffic model: QP pairs, RDMA messages, packets, link timing, responder behaviour.

Pipeline (all per-packet work in numba):

1. Workload builders (collectives.py) create *paths* (one direction of an RC QP pair:
   src node -> dst node, dest QP) and *messages* on them (start time, size, pacing rate,
   type: NCCL data = WRITE chain ending in WRITE_WITH_IMM; CTS = 64-byte WRITE_ONLY).
2. ``packetize``: messages -> request packets per path, PSNs consecutive from the path's
   start PSN (24-bit wrap), paced at the message rate, a path's messages in order.  Loss
   is injected here (go-back-N): a dropped packet still occupies the sender's link; the
   sender keeps sending until the NAK reaches it (``rtt_ns`` after the drop), then resends
   everything from the lost PSN.
3. Uplink pass: each node's request frames are serialised at its link rate (frame + 24 B
   preamble/IFG/FCS), and held while its link is down (flapping).
4. Dropped frames disappear (the switch dropped them); CE marks are applied.
5. Downlink pass: frames towards each node are serialised at that node's link rate after
   ``prop_ns``, and held while that node has PFC-paused its downlink.  **The observer sits
   here** -- a mirror of every node's downlink (switch egress) -- so a frame's timestamp is
   its start on the downlink, and frames dropped in the fabric are never seen.
6. Responder: per request path, in observed order, the receiving NIC's state machine
   (expected PSN, NAK 0x60 once per sequence error, coalesced ACKs for AckReq packets,
   rate-limited CNPs for CE-marked packets) produces ACK/NAK/CNP frames observed on the
   requester's downlink ``2*prop_ns + resp_delay_ns`` later.  These small control frames
   are not serialised against data (they are < 0.1 % of the bytes).
"""
from __future__ import annotations

import numpy as np

from skewscope.core.jit import njit
from skewscope.gen import frames as F

# message types
MT_DATA = 0   # NCCL send: WRITE_FIRST/MIDDLE/LAST_IMM or WRITE_ONLY_IMM, imm = size
MT_CTS = 1    # clear-to-send FIFO element: WRITE_ONLY, no immediate
MT_WRITE = 2  # plain RDMA WRITE chain without immediate (bulk, adaptive-routing style)
MT_SEND = 3   # library mpi: SEND_FIRST/MIDDLE/LAST or SEND_ONLY, no immediate
MT_READ_REQ = 4   # library mpi: RDMA READ REQUEST, one packet, RETH length = the size read;
                  # it takes as many PSNs as its responses have packets
MT_READ_RESP = 5  # library mpi: READ RESPONSE FIRST/MIDDLE/LAST or ONLY, in the PSN space
                  # of its request (m_link), on the reverse path

PKT_FIELDS = {
    "ts": np.int64, "ftype": np.uint8, "path": np.int32, "opcode": np.uint8,
    "tos": np.uint8, "flags": np.uint8, "psn": np.uint32, "plen": np.uint32,
    "va": np.uint64, "reth": np.uint32, "imm": np.uint32, "aeth": np.uint32,
    # model-only annotations (not on the wire)
    "msg": np.int64, "retx": np.uint8,
}
FL_BECN, FL_FECN, FL_ACKREQ, FL_SE = 1, 2, 4, 8


def empty_pkts(n: int) -> dict:
    return {k: np.zeros(n, dtype=t) for k, t in PKT_FIELDS.items()}


def concat_pkts(parts: list[dict]) -> dict:
    return {k: np.concatenate([p[k] for p in parts]) if parts else np.zeros(0, t)
            for k, t in PKT_FIELDS.items()}


def take_pkts(p: dict, idx) -> dict:
    return {k: v[idx] for k, v in p.items()}


@njit(cache=True)
def _gather4(fo, a, b, c, d):
    """concatenate([a, b, c, d])[fo] without building the concatenation."""
    na = a.shape[0]
    nab = na + b.shape[0]
    nabc = nab + c.shape[0]
    out = np.empty(fo.shape[0], dtype=a.dtype)
    for i in range(fo.shape[0]):
        k = fo[i]
        if k < na:
            out[i] = a[k]
        elif k < nab:
            out[i] = b[k - na]
        elif k < nabc:
            out[i] = c[k - nab]
        else:
            out[i] = d[k - nabc]
    return out


def take_concat_pkts(parts: list[dict], fo) -> dict:
    """take_pkts(concat_pkts(parts), fo) for four parts, one pass per field, no copy;
    "ts" is left None for the caller to fill."""
    return {k: _gather4(fo, *[p[k] for p in parts]) if k != "ts" else None
            for k in PKT_FIELDS}


# ------------------------------------------------------------------ packetizer
@njit(cache=True)
def expand_messages(m_path, m_size, m_type, m_imm, m_va, path_psn0, mtu, ackreq_every,
                    n_paths, m_link):
    """Per original request packet: opcode, psn, plen, reth, imm, va, msg, flags. A READ
    response (m_type MT_READ_RESP) takes its PSNs from its request (m_link), which takes
    as many from its path as the response has packets; READ packets carry no AckReq."""
    nm = m_path.shape[0]
    npk = np.empty(nm, dtype=np.int64)
    total = 0
    has_read = False
    for m in range(nm):
        s = m_size[m]
        n = (s + mtu - 1) // mtu
        if n < 1:
            n = 1
        if m_type[m] == 4:
            n = 1
            has_read = True
        npk[m] = n
        total += n
    # the first PSN of every READ request (messages in path order, as emitted below)
    req_psn = np.zeros(nm if has_read else 1, dtype=np.int64)
    if has_read:
        cur0 = path_psn0.astype(np.int64).copy()
        for m in range(nm):
            p = m_path[m]
            if m_type[m] == 4:
                req_psn[m] = cur0[p]
                cur0[p] += max(1, (m_size[m] + mtu - 1) // mtu)
            elif m_type[m] != 5:
                cur0[p] += npk[m]
    opc = np.empty(total, dtype=np.uint8)
    psn = np.empty(total, dtype=np.uint32)
    plen = np.empty(total, dtype=np.uint32)
    reth = np.zeros(total, dtype=np.uint32)
    imm = np.zeros(total, dtype=np.uint32)
    va = np.zeros(total, dtype=np.uint64)
    msg = np.empty(total, dtype=np.int64)
    flags = np.zeros(total, dtype=np.uint8)
    cur = path_psn0.astype(np.int64).copy()
    cnt = np.zeros(n_paths, dtype=np.int64)
    g = 0
    for m in range(nm):
        p = m_path[m]
        n = npk[m]
        s = m_size[m]
        mt = m_type[m]
        if mt >= 3:
            _expand_verbs(m, p, n, s, mt, m_va, m_link, req_psn, cur, cnt, mtu, ackreq_every,
                          g, opc, psn, plen, reth, va, msg, flags)
            g += n
            continue
        for k in range(n):
            if n == 1:
                if m_type[m] == 0:
                    o = F.WRITE_ONLY_IMM
                else:
                    o = F.WRITE_ONLY
            elif k == 0:
                o = F.WRITE_FIRST
            elif k == n - 1:
                o = F.WRITE_LAST_IMM if m_type[m] == 0 else F.WRITE_LAST
            else:
                o = F.WRITE_MIDDLE
            opc[g] = o
            psn[g] = cur[p] & 0xFFFFFF
            cur[p] += 1
            pl = mtu if k < n - 1 else s - mtu * (n - 1)
            plen[g] = pl
            if k == 0:
                reth[g] = s
                va[g] = m_va[m]
            if k == n - 1 and m_type[m] == 0:
                imm[g] = m_imm[m]
            msg[g] = m
            cnt[p] += 1  # packets on the path mod ackreq_every (no division per packet)
            every = False
            if cnt[p] == ackreq_every:
                cnt[p] = 0
                every = True
            if k == n - 1 or every:
                flags[g] = 4  # AckReq
            g += 1
    return npk, opc, psn, plen, reth, imm, va, msg, flags


@njit(cache=True)
def _expand_verbs(m, p, n, s, mt, m_va, m_link, req_psn, cur, cnt, mtu, ackreq_every, g,
                  opc, psn, plen, reth, va, msg, flags):
    """The packets of one SEND / READ request / READ response message (library mpi) at
    packet index g."""
    if mt == 4:  # READ REQUEST: one packet, no payload, RETH = the length read
        opc[g] = F.READ_REQUEST
        psn[g] = cur[p] & 0xFFFFFF
        cur[p] += max(1, (s + mtu - 1) // mtu)
        plen[g] = 0
        reth[g] = s
        va[g] = m_va[m]
        msg[g] = m
        return
    for k in range(n):
        if mt == 3:
            if n == 1:
                o = F.SEND_ONLY
            elif k == 0:
                o = F.SEND_FIRST
            elif k == n - 1:
                o = F.SEND_LAST
            else:
                o = F.SEND_MIDDLE
        else:
            if n == 1:
                o = F.READ_RESP_ONLY
            elif k == 0:
                o = F.READ_RESP_FIRST
            elif k == n - 1:
                o = F.READ_RESP_LAST
            else:
                o = F.READ_RESP_MIDDLE
        opc[g + k] = o
        if mt == 3:
            psn[g + k] = cur[p] & 0xFFFFFF
            cur[p] += 1
        else:
            psn[g + k] = (req_psn[m_link[m]] + k) & 0xFFFFFF
        plen[g + k] = mtu if k < n - 1 else s - mtu * (n - 1)
        msg[g + k] = m
        if mt == 3:
            cnt[p] += 1
            every = False
            if cnt[p] == ackreq_every:
                cnt[p] = 0
                every = True
            if k == n - 1 or every:
                flags[g + k] = 4  # AckReq


@njit(cache=True)
def pace(m_path, m_t0, m_rate, npk, flen, drop, rtt_ns, max_out):
    """Emission order and intended times per path, with go-back-N after drops.

    Messages must be sorted by path then start.  Returns arrays over emissions:
    original packet index, intended time (ns, float), retx flag, dropped flag.
    """
    out_g = np.empty(max_out, dtype=np.int64)
    out_t = np.empty(max_out, dtype=np.float64)
    out_r = np.zeros(max_out, dtype=np.uint8)
    out_d = np.zeros(max_out, dtype=np.uint8)
    nm = m_path.shape[0]
    # message index of each original packet and first packet of each message
    first = np.empty(nm + 1, dtype=np.int64)
    first[0] = 0
    for m in range(nm):
        first[m + 1] = first[m] + npk[m]
    pmsg = np.empty(first[nm], dtype=np.int64)
    for m in range(nm):
        for g in range(first[m], first[m + 1]):
            pmsg[g] = m
    e = 0
    m = 0
    while m < nm:
        p = m_path[m]
        m_end = m
        while m_end < nm and m_path[m_end] == p:
            m_end += 1
        g0 = first[m]
        g1 = first[m_end]
        cursor = -1e30
        g = g0
        while g < g1:
            mm = pmsg[g]
            t = cursor
            if g == first[mm] and m_t0[mm] > t:
                t = m_t0[mm]
            out_g[e] = g
            out_t[e] = t
            cursor = t + flen[g] * 8.0 / m_rate[mm] * 1e9
            if drop[g]:
                out_d[e] = 1
                e += 1
                t_nak = t + rtt_ns
                h = g + 1
                # keep sending until the NAK arrives
                while h < g1:
                    mh = pmsg[h]
                    th = cursor
                    if h == first[mh] and m_t0[mh] > th:
                        th = m_t0[mh]
                    if th >= t_nak:
                        break
                    out_g[e] = h
                    out_t[e] = th
                    out_d[e] = drop[h]
                    cursor = th + flen[h] * 8.0 / m_rate[mh] * 1e9
                    e += 1
                    h += 1
                # go back: resend g .. h-1
                if cursor < t_nak:
                    cursor = t_nak
                for r in range(g, h):
                    mr = pmsg[r]
                    out_g[e] = r
                    out_t[e] = cursor
                    out_r[e] = 1
                    cursor = cursor + flen[r] * 8.0 / m_rate[mr] * 1e9
                    e += 1
                g = h
                continue
            e += 1
            g += 1
        m = m_end
    return out_g[:e], out_t[:e], out_r[:e], out_d[:e]


# ------------------------------------------------------------------ link passes
@njit(cache=True)
def serialise(order, node, t_in, wire_bytes, link_bps, blk_node, blk_start, blk_end):
    """Serialise frames per node in the given order (sorted by node, then time).

    A frame starts at max(arrival, link free, end of any blocking window it would start
    in).  Blocking windows (sorted by node then start) model a link down or PFC pause.
    Returns the start time of every frame (same indexing as t_in) and its queueing delay.
    """
    n = order.shape[0]
    out = np.empty(t_in.shape[0], dtype=np.float64)
    qd = np.zeros(t_in.shape[0], dtype=np.float64)
    i = 0
    nb = blk_node.shape[0]
    while i < n:
        nd = node[order[i]]
        free = -1e30
        # windows of this node
        b0 = 0
        while b0 < nb and blk_node[b0] < nd:
            b0 += 1
        b1 = b0
        while b1 < nb and blk_node[b1] == nd:
            b1 += 1
        bi = b0
        sec_per_byte = 8.0 / link_bps[nd] * 1e9
        while i < n and node[order[i]] == nd:
            k = order[i]
            t = t_in[k]
            if free > t:
                t = free
            moved = True
            while moved:
                moved = False
                while bi < b1 and blk_end[bi] <= t:
                    bi += 1
                if bi < b1 and blk_start[bi] <= t:
                    t = blk_end[bi]
                    moved = True
            out[k] = t
            qd[k] = t - t_in[k]
            free = t + wire_bytes[k] * sec_per_byte
            i += 1
    return out, qd


# ------------------------------------------------------------------ responder
@njit(cache=True)
def responder(order, path, t_obs, psn, flags, opcode, msg, is_last, tos, p_rev,
              coalesce_ns, cnp_gap_ns, delay_ns, ack_syndrome, n_paths, reth, mtu):
    """Receiving-NIC behaviour over request packets in observed order per path.

    Returns response events: (time, path to send on, kind 0=ACK 1=NAK 2=CNP, psn, aeth).
    READ RESPONSE packets (library mpi) are the responder's own answers, not requests: they
    are skipped; a READ REQUEST moves the expected PSN on by its responses' packets.
    """
    n = order.shape[0]
    cap = n + 16
    r_t = np.empty(cap, dtype=np.float64)
    r_p = np.empty(cap, dtype=np.int32)
    r_k = np.empty(cap, dtype=np.uint8)
    r_psn = np.empty(cap, dtype=np.uint32)
    r_aeth = np.empty(cap, dtype=np.uint32)
    e = 0
    i = 0
    while i < n:
        p = path[order[i]]
        rev = p_rev[p]
        epsn = -1
        nak_sent = False
        msn = 0
        pend = False
        pend_t = 0.0
        pend_psn = 0
        pend_msn = 0
        last_cnp = -1e30
        while i < n and path[order[i]] == p:
            k = order[i]
            t = t_obs[k]
            if opcode[k] >= 0x0D and opcode[k] <= 0x10:
                i += 1
                continue
            if pend and t > pend_t + coalesce_ns:
                r_t[e] = pend_t + delay_ns
                r_p[e] = rev
                r_k[e] = 0
                r_psn[e] = pend_psn
                r_aeth[e] = (ack_syndrome << 24) | (pend_msn & 0xFFFFFF)
                e += 1
                pend = False
            if (tos[k] & 3) == 3 and t >= last_cnp + cnp_gap_ns:
                last_cnp = t
                r_t[e] = t + delay_ns
                r_p[e] = rev
                r_k[e] = 2
                r_psn[e] = 0
                r_aeth[e] = 0
                e += 1
            ps = np.int64(psn[k])
            if epsn < 0:
                epsn = ps
            d = (ps - epsn) & 0xFFFFFF
            if d == 0:
                adv = 1
                if opcode[k] == 0x0C:
                    adv = max(1, (np.int64(reth[k]) + mtu - 1) // mtu)
                epsn = (epsn + adv) & 0xFFFFFF
                nak_sent = False
                if is_last[k]:
                    msn += 1
                if flags[k] & 4:
                    if not pend:
                        pend_t = t
                    pend = True
                    pend_psn = ps
                    pend_msn = msn
            elif d < (1 << 23):
                if not nak_sent:
                    if pend:  # flush the pending ACK first
                        r_t[e] = t + delay_ns
                        r_p[e] = rev
                        r_k[e] = 0
                        r_psn[e] = pend_psn
                        r_aeth[e] = (ack_syndrome << 24) | (pend_msn & 0xFFFFFF)
                        e += 1
                        pend = False
                    nak_sent = True
                    r_t[e] = t + delay_ns + 1.0
                    r_p[e] = rev
                    r_k[e] = 1
                    r_psn[e] = epsn
                    r_aeth[e] = (0x60 << 24) | (msn & 0xFFFFFF)
                    e += 1
            # d >= 2^23: duplicate, silently dropped
            i += 1
        if pend:
            r_t[e] = pend_t + delay_ns
            r_p[e] = rev
            r_k[e] = 0
            r_psn[e] = pend_psn
            r_aeth[e] = (ack_syndrome << 24) | (pend_msn & 0xFFFFFF)
            e += 1
            pend = False
        if e + 4 > cap - 4 and i < n:
            # grow (rare): double capacity
            cap2 = cap * 2
            a = np.empty(cap2, dtype=np.float64); a[:e] = r_t[:e]; r_t = a
            b = np.empty(cap2, dtype=np.int32); b[:e] = r_p[:e]; r_p = b
            c = np.empty(cap2, dtype=np.uint8); c[:e] = r_k[:e]; r_k = c
            d2 = np.empty(cap2, dtype=np.uint32); d2[:e] = r_psn[:e]; r_psn = d2
            f = np.empty(cap2, dtype=np.uint32); f[:e] = r_aeth[:e]; r_aeth = f
            cap = cap2
    return r_t[:e], r_p[:e], r_k[:e], r_psn[:e], r_aeth[:e]


@njit(cache=True)
def psn_scan(order, path, psn, opcode):
    """The report definition of psn_gaps / retransmissions, per request packet.

    Returns per-frame flags: 1 = gap (ahead), 2 = retransmission (behind).
    """
    n = order.shape[0]
    out = np.zeros(path.shape[0], dtype=np.uint8)
    i = 0
    while i < n:
        p = path[order[i]]
        exp = -1
        after_read = False
        while i < n and path[order[i]] == p:
            k = order[i]
            op = opcode[k]
            low = op & 0x1F
            tr = op & 0xE0
            is_req = tr <= 0x60 and (low <= 0x0C or low == 0x13 or low == 0x14
                                     or low == 0x16 or low == 0x17)
            if is_req:
                ps = np.int64(psn[k])
                if exp < 0:
                    exp = (ps + 1) & 0xFFFFFF
                else:
                    d = (ps - exp) & 0xFFFFFF
                    if d >= (1 << 23):
                        out[k] = 2
                    else:
                        if d > 0 and not after_read:
                            out[k] = 1
                        exp = (ps + 1) & 0xFFFFFF
                        after_read = False
                if low == 0x0C:
                    after_read = True
            i += 1
    return out


@njit(cache=True)
def group_min(keys, vals, n):
    """out[k] = min(vals[keys == k]) (inf where none) -- np.minimum.at, fast."""
    out = np.full(n, np.inf)
    for i in range(keys.shape[0]):
        k = keys[i]
        if vals[i] < out[k]:
            out[k] = vals[i]
    return out



@njit(cache=True)
def _natural_merge_sort(v, ids):
    """ids reordered by v, stable (ties keep the order of `ids`), merging the runs of
    non-decreasing v that are already there: O(n log runs)."""
    n = v.shape[0]
    rs = [0]
    for i in range(1, n):
        if v[i] < v[i - 1]:
            rs.append(i)
    rs.append(n)
    a_v = v.copy()
    a_i = ids.copy()
    if len(rs) <= 2:
        return a_i
    b_v = np.empty_like(a_v)
    b_i = np.empty_like(a_i)
    while len(rs) > 2:
        nrs = [0]
        k = 0
        while k + 1 < len(rs):
            lo = rs[k]
            if k + 2 < len(rs):
                mid = rs[k + 1]
                hi = rs[k + 2]
            else:
                mid = rs[k + 1]
                hi = mid
            i = lo
            j = mid
            o = lo
            while i < mid and j < hi:
                if a_v[j] < a_v[i]:   # strictly less: ties take the left (earlier) run
                    b_v[o] = a_v[j]
                    b_i[o] = a_i[j]
                    j += 1
                else:
                    b_v[o] = a_v[i]
                    b_i[o] = a_i[i]
                    i += 1
                o += 1
            while i < mid:
                b_v[o] = a_v[i]
                b_i[o] = a_i[i]
                i += 1
                o += 1
            while j < hi:
                b_v[o] = a_v[j]
                b_i[o] = a_i[j]
                j += 1
                o += 1
            nrs.append(hi)
            k += 2
        rs = nrs
        a_v, b_v = b_v, a_v
        a_i, b_i = b_i, a_i
    return a_i


@njit(cache=True)
def node_time_order(node, t, n_nodes):
    """Same permutation as np.lexsort((t, node)) -- by node, then time, ties by index --
    without lexsort's two full-length stable sorts: a counting sort by node, then a
    natural merge sort of each node's times, which are a few runs (one per path)."""
    n = node.shape[0]
    cnt = np.zeros(n_nodes + 1, dtype=np.int64)
    for i in range(n):
        cnt[node[i] + 1] += 1
    for k in range(n_nodes):
        cnt[k + 1] += cnt[k]
    pos = cnt[:n_nodes].copy()
    byn = np.empty(n, dtype=np.int64)
    tv = np.empty(n, dtype=np.float64)
    for i in range(n):
        nd = node[i]
        byn[pos[nd]] = i
        tv[pos[nd]] = t[i]
        pos[nd] += 1
    out = np.empty(n, dtype=np.int64)
    for k in range(n_nodes):
        a, b = cnt[k], cnt[k + 1]
        if b > a:
            out[a:b] = _natural_merge_sort(tv[a:b], byn[a:b])
    return out
