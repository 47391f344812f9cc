"""Wire format: RoCEv2 header building, ICRC, PFC frames, all as numba kernels.

Every frame is described by one row of a *packet table* (numpy arrays, see
``model.PKT_FIELDS``) plus a per-path header template (Ethernet [+ 802.1Q] + IPv4/IPv6 +
UDP, built once per path in Python).  ``build_into`` writes pcap records (16-byte record
header + frame bytes, optionally truncated to a snap length) for a slice of the table
straight into a preallocated byte buffer; nothing per frame happens in Python.

ICRC (IBA 1.4 annex A17 / RoCEv2): CRC-32 (the zlib/Ethernet polynomial, reflected,
init and final XOR 0xffffffff) over 8 bytes of 0xff (stand-in for the LRH), the IP header
with TOS/TTL/checksum masked (IPv4) or traffic class / flow label / hop limit masked
(IPv6), the UDP header with its checksum masked, the BTH with byte 4 (FECN/BECN/resv)
masked, the extension headers and the payload + pad.  All masks are 1-bits.  The result
is stored least-significant byte first (scapy ``BTH.pack_icrc``).

Payload bytes are zeros.  Appending n zero bytes to a CRC register is a linear map over
GF(2)^32, so instead of feeding 4 KiB of zeros through the table per frame we apply a
per-length operator, precomputed once per distinct length as four 256-entry tables
(``zero_ops``).  A frame's ICRC then costs ~70 table steps for its headers + 4 lookups.
"""
from __future__ import annotations

import struct

import numpy as np

from skewscope.core.jit import njit

ROCE_PORT = 4791
ETH_P_8021Q = 0x8100
ETH_P_IP = 0x0800
ETH_P_IPV6 = 0x86DD
ETH_P_PAUSE = 0x8808
PFC_DMAC = bytes.fromhex("0180c2000001")

# frame types in the packet table
FT_ROCE = 0
FT_PFC = 1
FT_OTHER = 2  # background UDP (non-RoCE)

# opcodes (RC)
OP = {
    "SEND_FIRST": 0x00, "SEND_MIDDLE": 0x01, "SEND_LAST": 0x02, "SEND_LAST_WITH_IMMEDIATE": 0x03,
    "SEND_ONLY": 0x04, "SEND_ONLY_WITH_IMMEDIATE": 0x05, "RDMA_WRITE_FIRST": 0x06,
    "RDMA_WRITE_MIDDLE": 0x07, "RDMA_WRITE_LAST": 0x08, "RDMA_WRITE_LAST_WITH_IMMEDIATE": 0x09,
    "RDMA_WRITE_ONLY": 0x0A, "RDMA_WRITE_ONLY_WITH_IMMEDIATE": 0x0B, "RDMA_READ_REQUEST": 0x0C,
    "RDMA_READ_RESPONSE_FIRST": 0x0D, "RDMA_READ_RESPONSE_MIDDLE": 0x0E,
    "RDMA_READ_RESPONSE_LAST": 0x0F, "RDMA_READ_RESPONSE_ONLY": 0x10, "ACKNOWLEDGE": 0x11,
    "ATOMIC_ACKNOWLEDGE": 0x12, "COMPARE_SWAP": 0x13, "FETCH_ADD": 0x14,
    "SEND_LAST_WITH_INVALIDATE": 0x16, "SEND_ONLY_WITH_INVALIDATE": 0x17, "CNP": 0x81,
}
OP_NAME = {v: k for k, v in OP.items()}
WRITE_FIRST, WRITE_MIDDLE, WRITE_LAST, WRITE_LAST_IMM = 0x06, 0x07, 0x08, 0x09
WRITE_ONLY, WRITE_ONLY_IMM, ACKNOWLEDGE, CNP = 0x0A, 0x0B, 0x11, 0x81
SEND_FIRST, SEND_MIDDLE, SEND_LAST, SEND_ONLY = 0x00, 0x01, 0x02, 0x04
READ_REQUEST, READ_RESP_FIRST, READ_RESP_MIDDLE, READ_RESP_LAST, READ_RESP_ONLY = 0x0C, 0x0D, 0x0E, 0x0F, 0x10

# AETH syndromes
AETH_ACK = 0x00          # 0b000xxxxx | credit code
NAK_PSN_SEQ_ERR = 0x60

# IB opcode -> extension header bytes (BTH excluded), for the opcodes we emit or count.
EXT_LEN = np.zeros(256, dtype=np.int32)
for _op in range(256):
    low, tr = _op & 0x1F, _op & 0xE0
    n = 0
    if tr in (0x00, 0x20, 0x40):
        if low in (0x06, 0x0A, 0x0B, 0x0C):
            n += 16  # RETH
        if low in (0x03, 0x05, 0x09, 0x0B):
            n += 4  # ImmDt
        if tr != 0x20 and low in (0x0D, 0x0F, 0x10, 0x11, 0x12):
            n += 4  # AETH
        if tr != 0x20 and low in (0x13, 0x14):
            n += 28  # AtomicETH
        if tr == 0x40:
            n += 4  # RDETH (RD only; not generated)
    elif tr == 0x60 and low in (0x04, 0x05):
        n += 8 + (4 if low == 0x05 else 0)  # DETH (+ImmDt)
    EXT_LEN[_op] = n
EXT_LEN[CNP] = 16  # 16 reserved bytes
del _op, low, tr, n


def mlx5_sport(lqpn: int, rqpn: int) -> int:
    """UDP source port mlx5 derives from the QP pair when the flow label is 0 (symmetric)."""
    fl = (lqpn * rqpn) & 0xFFFFFFFFFFFFFFFF
    fl ^= fl >> 20
    fl ^= fl >> 40
    fl &= 0xFFFFF
    return 0xC000 | ((fl & 0x3FFF) ^ (fl >> 14))


def node_mac(i: int) -> bytes:
    """Locally administered unicast MAC for node i: 02:5c:00:00:hi:lo."""
    return bytes([0x02, 0x5C, 0x00, (i >> 16) & 0xFF, (i >> 8) & 0xFF, i & 0xFF])


# ---------------------------------------------------------------- CRC-32 machinery
def _make_table() -> np.ndarray:
    t = np.zeros(256, dtype=np.uint32)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0xEDB88320 if c & 1 else c >> 1
        t[i] = c
    return t


CRC_TABLE = _make_table()


@njit(cache=True)
def crc_update(reg, buf, start, end, table):
    """Feed buf[start:end] into a (non-inverted-at-the-end) CRC-32 register."""
    for i in range(start, end):
        reg = table[(reg ^ buf[i]) & 0xFF] ^ (reg >> 8)
    return reg


@njit(cache=True)
def _apply_cols(cols, v):
    r = np.uint32(0)
    for b in range(32):
        if (v >> b) & 1:
            r ^= cols[b]
    return r


@njit(cache=True)
def _zero_op_cols(n, table):
    """Columns of the GF(2) matrix 'append n zero bytes' acting on the CRC register."""
    # one zero byte: reg -> table[reg & 0xff] ^ (reg >> 8)
    one = np.zeros(32, dtype=np.uint32)
    for b in range(32):
        reg = np.uint32(1) << np.uint32(b)
        one[b] = table[reg & 0xFF] ^ (reg >> np.uint32(8))
    res = np.zeros(32, dtype=np.uint32)
    for b in range(32):
        res[b] = np.uint32(1) << np.uint32(b)  # identity
    base = one.copy()
    tmp = np.zeros(32, dtype=np.uint32)
    while n > 0:
        if n & 1:
            for b in range(32):  # res = base o res
                tmp[b] = _apply_cols(base, res[b])
            res[:] = tmp
        n >>= 1
        if n:
            for b in range(32):  # base = base o base
                tmp[b] = _apply_cols(base, base[b])
            base[:] = tmp
    return res


@njit(cache=True)
def zero_ops(lengths, table):
    """For each length n: 4x256 tables T so that reg' = T0[b0]^T1[b1]^T2[b2]^T3[b3]."""
    out = np.zeros((lengths.shape[0], 4, 256), dtype=np.uint32)
    for k in range(lengths.shape[0]):
        cols = _zero_op_cols(lengths[k], table)
        for byte in range(4):
            for v in range(256):
                r = np.uint32(0)
                for bit in range(8):
                    if (v >> bit) & 1:
                        r ^= cols[byte * 8 + bit]
                out[k, byte, v] = r
    return out


# ---------------------------------------------------------------- header templates
def l3_template(src_mac: bytes, dst_mac: bytes, vlan: int, pcp: int, ipv6: bool,
                src_ip: bytes, dst_ip: bytes, sport: int, dport: int, ttl: int = 64) -> bytes:
    """Ethernet [+802.1Q] + IP + UDP with lengths/TOS/checksum left 0 (filled per frame)."""
    eth = dst_mac + src_mac
    if vlan >= 0:
        eth += struct.pack("!HH", ETH_P_8021Q, ((pcp & 7) << 13) | (vlan & 0xFFF))
    if ipv6:
        eth += struct.pack("!H", ETH_P_IPV6)
        ip = struct.pack("!IHBB", 6 << 28, 0, 17, ttl) + src_ip + dst_ip
    else:
        eth += struct.pack("!H", ETH_P_IP)
        # ver/ihl, tos, totlen, id, flags(DF)/frag, ttl, proto, csum, src, dst
        ip = struct.pack("!BBHHHBBH", 0x45, 0, 0, 0, 0x4000, ttl, 17, 0) + src_ip + dst_ip
    udp = struct.pack("!HHHH", sport, dport, 0, 0)
    return eth + ip + udp


@njit(cache=True)
def frame_len(ftype, opcode, plen, hl):
    if ftype == 0:
        return hl + 12 + EXT_LEN_NB[opcode] + plen + ((4 - (plen & 3)) & 3) + 4
    if ftype == 1:
        return 60
    n = hl + plen
    return n if n >= 60 else 60


EXT_LEN_NB = EXT_LEN  # numba freezes global arrays as constants


@njit(cache=True)
def frame_lengths(ftype, opcode, plen, hl):
    out = np.empty(ftype.shape[0], dtype=np.int64)
    for i in range(ftype.shape[0]):
        out[i] = frame_len(ftype[i], opcode[i], plen[i], hl)
    return out


@njit(cache=True)
def _put16(b, o, v):
    b[o] = (v >> 8) & 0xFF
    b[o + 1] = v & 0xFF


@njit(cache=True)
def _put24(b, o, v):
    b[o] = (v >> 16) & 0xFF
    b[o + 1] = (v >> 8) & 0xFF
    b[o + 2] = v & 0xFF


@njit(cache=True)
def _put32(b, o, v):
    b[o] = (v >> 24) & 0xFF
    b[o + 1] = (v >> 16) & 0xFF
    b[o + 2] = (v >> 8) & 0xFF
    b[o + 3] = v & 0xFF


@njit(cache=True)
def _put32le(b, o, v):
    b[o] = v & 0xFF
    b[o + 1] = (v >> 8) & 0xFF
    b[o + 2] = (v >> 16) & 0xFF
    b[o + 3] = (v >> 24) & 0xFF


@njit(cache=True)
def write_frame(buf, o, tmpl, hl, l2, ipv6, ftype, opcode, tos, flags, pkey, dqpn, psn,
                plen, va, rkey, reth_len, imm, aeth, zidx, zops, table, mac_src, pfc_pad,
                limit):
    """Write one frame at buf[o:], return its length.  Layout per the module docstring.

    Only the first `limit` bytes of a RoCE frame's zero payload are cleared (a snaplen
    record never looks further; headers and the ICRC are always written, so `buf` needs
    room for the headers past the limit); the ICRC is computed and written only when it
    starts before the limit.  limit >= frame length: the whole frame.
    """
    if ftype == 1:  # PFC: dst mac, src mac, 0x8808, opcode 0x0101, class-enable, 8 times
        for k in range(6):
            buf[o + k] = pfc_pad[k]
            buf[o + 6 + k] = mac_src[k]
        _put16(buf, o + 12, 0x8808)
        _put16(buf, o + 14, 0x0101)
        _put16(buf, o + 16, psn & 0xFF)          # class-enable vector
        for p in range(8):
            _put16(buf, o + 18 + 2 * p, imm if (psn >> p) & 1 else 0)
        for k in range(34, 60):
            buf[o + k] = 0
        return 60
    for k in range(hl):
        buf[o + k] = tmpl[k]
    ip = o + l2
    udp = ip + (40 if ipv6 else 20)
    if ftype == 2:
        n = hl + plen
        ulen = 8 + plen
    else:
        pad = (4 - (plen & 3)) & 3
        ext = EXT_LEN_NB[opcode]
        ulen = 8 + 12 + ext + plen + pad + 4
        n = hl + 12 + ext + plen + pad + 4
    if ipv6:
        buf[ip] = 0x60 | (tos >> 4)
        buf[ip + 1] = ((tos & 0xF) << 4) | (buf[ip + 1] & 0x0F)
        _put16(buf, ip + 4, ulen)
    else:
        buf[ip + 1] = tos
        _put16(buf, ip + 2, 20 + ulen)
        s = 0
        for k in range(0, 20, 2):
            if k != 10:
                s += (buf[ip + k] << 8) | buf[ip + k + 1]
        while s >> 16:
            s = (s & 0xFFFF) + (s >> 16)
        _put16(buf, ip + 10, (~s) & 0xFFFF)
    _put16(buf, udp + 4, ulen)
    if ftype == 2:
        for k in range(o + hl, o + n):
            buf[k] = 0
        for k in range(o + n, o + 60):
            buf[k] = 0
        return n if n >= 60 else 60
    b = udp + 8
    buf[b] = opcode
    buf[b + 1] = ((flags >> 3) & 1) << 7 | (pad << 4)       # SE, M=0, PadCnt, TVer=0
    _put16(buf, b + 2, pkey)
    buf[b + 4] = (flags & 2) << 6 | (flags & 1) << 6        # FECN bit7, BECN bit6
    _put24(buf, b + 5, dqpn)
    buf[b + 8] = ((flags >> 2) & 1) << 7                    # AckReq
    _put24(buf, b + 9, psn)
    e = b + 12
    low = opcode & 0x1F
    if opcode == 0x81:
        for k in range(16):
            buf[e + k] = 0
        e += 16
    else:
        if low == 0x06 or low == 0x0A or low == 0x0B or low == 0x0C:
            _put32(buf, e, (va >> 32) & 0xFFFFFFFF)
            _put32(buf, e + 4, va & 0xFFFFFFFF)
            _put32(buf, e + 8, rkey)
            _put32(buf, e + 12, reth_len)
            e += 16
        if low == 0x03 or low == 0x05 or low == 0x09 or low == 0x0B:
            _put32(buf, e, imm)
            e += 4
        if low == 0x11 or low == 0x0D or low == 0x0F or low == 0x10 or low == 0x12:
            _put32(buf, e, aeth)
            e += 4
    hdr_end = e
    zl = plen + pad
    zend = e + zl
    if zend > o + limit:
        zend = o + limit
    if zend > e:
        buf[e:zend] = 0
    if zl + (hdr_end - o) >= limit:
        return n  # the ICRC lies past the snap length: nobody sees it, skip computing it
    # ICRC over the masked pseudo packet: 8 x 0xff, IP, UDP, BTH, ext hdrs, payload+pad
    reg = np.uint32(0xFFFFFFFF)
    for k in range(8):
        reg = table[(reg ^ 0xFF) & 0xFF] ^ (reg >> 8)
    for k in range(ip, hdr_end):
        v = buf[k]
        r = k - ip
        if ipv6:
            if r == 0:
                v = v | 0x0F
            elif r == 1 or r == 2 or r == 3 or r == 7:
                v = 0xFF
        else:
            if r == 1 or r == 8 or r == 10 or r == 11:
                v = 0xFF
        if k == udp + 6 or k == udp + 7 or k == b + 4:
            v = 0xFF
        reg = table[(reg ^ v) & 0xFF] ^ (reg >> 8)
    if zl > 0:
        reg = (zops[zidx, 0, reg & 0xFF] ^ zops[zidx, 1, (reg >> 8) & 0xFF]
               ^ zops[zidx, 2, (reg >> 16) & 0xFF] ^ zops[zidx, 3, (reg >> 24) & 0xFF])
    _put32le(buf, e + zl, reg ^ np.uint32(0xFFFFFFFF))
    return n
