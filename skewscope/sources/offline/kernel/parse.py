"""The parser (C: ebpf/parse.h: the VLAN tags of parse_l2, parse_l3, parse_gre, parse_vxlan,
parse_bth, handle_macctl) and `process` (C: ss_parse in parse.h, one frame parsed and one
level decapsulated, then accounted as process in ebpf/skewscope.bpf.c does)."""
from __future__ import annotations

import numpy as np

from skewscope.core.jit import be16, be32, ld8, le32, le64, njit
from skewscope.sources.offline.kernel.accounting import account, key_hash
from skewscope.sources.offline.kernel.base import (
    ETH_P_MACCTL,
    ETH_P_ROCEV1,
    G_ACCOUNTED,
    G_BAD_LENGTH,
    G_DECAP,
    G_FRAGMENT,
    G_NON_ROCE,
    G_PAUSE,
    G_PFC,
    G_PFC_PAUSE,
    G_PFC_QUANTA,
    G_PFC_XON,
    G_TRUNC_BTH,
    G_TRUNC_ETH,
    G_TRUNC_EXT,
    G_TRUNC_GRH,
    G_TRUNC_IP,
    G_TRUNC_MACCTL,
    G_TRUNC_UDP,
    G_TRUNC_VLAN,
    G_UNKNOWN_OPCODE,
    G_VLAN_DEPTH,
    GRE_P_ERSPAN2,
    GRE_P_ERSPAN3,
    GRE_P_TEB,
    IPPROTO_GRE,
    MACCTL_PAUSE,
    MACCTL_PFC,
    MAX_VLAN,
    OPT_AETH,
    OPT_EXTLEN_MASK,
    OPT_PREFIX_MASK,
    OPT_PREFIX_SHIFT,
    OPT_RETH,
    OPT_VALID,
    PK_FB,
    PK_IPVER,
    PK_OPCODE,
    PK_PAYLOAD,
    PK_PSN,
    PK_QP,
    PK_RETH,
    PK_ROCE,
    PK_SPORT,
    PK_SYND,
    PK_TCLASS,
    PK_W0,
    PK_W1,
    PK_W2,
    PK_W3,
    ROCE_UDP_PORT,
    ST_PKCAP,
    ST_PKN,
    VXLAN_UDP_PORT,
)


# ---- parsing (C: parse.h) ----------------------------------------------------------------
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
def parse_vxlan(udp, end):
    """C: parse_vxlan, at the outer UDP header `udp` (IPv4 or IPv6): the inner Ethernet frame
    follows the 8-byte VXLAN header. Returns (category or DECAP, inner, iproto = 0: an
    Ethernet frame, as parse_gre's TEB)."""
    if udp + 16 > end:
        return G_TRUNC_UDP, _Z, _Z
    return DECAP, udp + 16, _Z


@njit(cache=True, inline="always")
def parse_bth(b, bth, end, avail, optab):
    """C: parse_bth. Returns (category, opcode, opinfo, payload, fb, dqp, psn, reth_len,
    syndrome)."""
    if bth + 12 > end:
        return G_TRUNC_BTH, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z
    opcode = ld8(b, bth)
    opinfo = np.int64(optab[opcode])
    if not (opinfo & OPT_VALID):
        return G_UNKNOWN_OPCODE, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z
    ext = opinfo & OPT_EXTLEN_MASK
    prefix = (opinfo & OPT_PREFIX_MASK) >> OPT_PREFIX_SHIFT
    pad = (ld8(b, bth + 1) >> 4) & 3
    need = 12 + ext + pad + 4
    if avail < need:
        return G_BAD_LENGTH, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z
    payload = avail - need
    fb = ld8(b, bth + 4)
    dqp = be32(b, bth + 4) & 0xFFFFFF
    psn = be32(b, bth + 8) & 0xFFFFFF
    if bth + 12 + ext > end:
        return G_TRUNC_EXT, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z
    reth_len = _Z
    syndrome = _Z
    if opinfo & OPT_RETH:
        r = bth + 12 + (prefix & 0xF)
        if r + 16 > end:
            return G_TRUNC_EXT, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z
        reth_len = be32(b, r + 12)
    if opinfo & OPT_AETH:
        a = bth + 12 + (prefix & 0xF)
        if a + 4 > end:
            return G_TRUNC_EXT, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z
        syndrome = ld8(b, a)
    return G_ACCOUNTED, opcode, opinfo, payload, fb, dqp, psn, reth_len, syndrome


@njit(cache=True, inline="always")
def parse_l3(g, b, proto, cur, end, l3off, outer, optab):
    """C: parse_l3. Returns (category or DECAP, l3end, inner, iproto, w0, w1, w2, w3, ipver,
    roce, tclass, ecn_valid, sport, bth, avail): the transport is then parsed by the caller
    (parse_bth) when the category is accounted and bth >= 0."""
    if proto == 0x0800:
        if cur + 20 > end:
            return G_TRUNC_IP, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z
        vi = ld8(b, cur)
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
                c, inner, iproto = parse_vxlan(udp, end)
                return c, l3off + be16(b, cur + 2), inner, iproto, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z
            return G_NON_ROCE, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z
        tot = be16(b, cur + 2)
        ulen = be16(b, udp + 4)
        if ulen < 8 or tot < ihl + ulen:
            return G_BAD_LENGTH, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z
        # the IPv4-mapped IPv6 address's last 8 bytes as a little-endian word (as le64)
        w1 = (np.int64(0xFFFF) << 16) | (le32(b, cur + 12) << 32)
        w3 = (np.int64(0xFFFF) << 16) | (le32(b, cur + 16) << 32)
        return G_ACCOUNTED, l3off + tot, _Z, _Z, _Z, w1, _Z, w3, np.int64(4), np.int64(2), \
            ld8(b, cur + 1), np.int64(1), be16(b, udp), udp + 8, ulen - 8
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
                c, inner, iproto = parse_vxlan(udp, end)
                return c, l3off + 40 + be16(b, cur + 4), inner, iproto, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z
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
def parse_frame(g, b, proto, cur, end, wire_len, optab):
    """Parse one frame whose 14-byte Ethernet header ends at `cur` (EtherType `proto`),
    captured bytes up to `end` (exclusive), `wire_len` bytes long on the wire, without
    accounting it (process accounts; the pipelined parser hands the fields to another thread).
    Returns (category, w0..w4, wire_len, payload, opinfo, psn, reth_len, sport, opcode, tclass,
    ecn_valid, fb, syndrome, dqp, ipver, roce): the fields are meaningful only when the category
    is accounted. One level of decapsulation (GRE/ERSPAN/VXLAN) as the C: the inner frame is
    parsed like a top-level one, its bytes are the inner Ethernet frame's."""
    l2end = cur
    opcode = opinfo = payload = fb = dqp = psn = reth_len = syndrome = _Z
    cat, proto, cur = parse_vlans(b, proto, cur, end)
    if cat != G_ACCOUNTED:
        return cat, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z
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
                return G_TRUNC_ETH, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z
            cat, proto, cur = parse_vlans(b, be16(b, inner + 12), inner + 14, end)
            if cat != G_ACCOUNTED:
                return cat, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z
            l3off = cur - inner
        cat, l3end, inner, iproto, w0, w1, w2, w3, ipver, roce, tclass, ecn_valid, sport, bth, avail = \
            parse_l3(g, b, proto, cur, end, l3off, False, optab)
        if cat == G_ACCOUNTED:
            cat, opcode, opinfo, payload, fb, dqp, psn, reth_len, syndrome = parse_bth(b, bth, end, avail, optab)
        if cat == G_ACCOUNTED and outer_end > frame_len:
            cat = G_BAD_LENGTH
    elif cat == G_ACCOUNTED:
        cat, opcode, opinfo, payload, fb, dqp, psn, reth_len, syndrome = parse_bth(b, bth, end, avail, optab)
    # Headers all present, but the IP/GRH length claims more bytes than the frame has: a
    # length lie, bad_length (C: checked after the header parse, so a frame cut inside a
    # header still counts as truncated_<that header>)
    if cat == G_ACCOUNTED and l3end > wire_len:
        cat = G_BAD_LENGTH
    if cat != G_ACCOUNTED:
        return cat, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z
    w4 = dqp | (np.int64(ipver) << 32) | (np.int64(roce) << 40)
    return (cat, w0, w1, w2, w3, w4, wire_len, payload, opinfo, psn, reth_len, sport, opcode, tclass,
            np.int64(ecn_valid), fb, syndrome, dqp, np.int64(ipver), np.int64(roce))


@njit(cache=True, inline="always")
def process(g, st, hidx, fhash, keys, S, lprev, lnext, finst, ikeys, ev, pk, optab,
            b, proto, cur, end, wire_len, ts):
    """Parse one frame (parse_frame) and account it (C: ss_parse, then process in
    ebpf/skewscope.bpf.c). Returns the category."""
    cat, w0, w1, w2, w3, w4, wire_len, payload, opinfo, psn, reth_len, sport, opcode, tclass, ecn_valid, fb, \
        syndrome, dqp, ipver, roce = parse_frame(g, b, proto, cur, end, wire_len, optab)
    if cat != G_ACCOUNTED:
        return cat
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
            w0, w1, w2, w3, w4, key_hash(w0, w1, w2, w3, w4), -1, wire_len, payload, opinfo, psn, reth_len, sport, opcode,
            tclass, ecn_valid, fb, syndrome, ts)
    return G_ACCOUNTED
