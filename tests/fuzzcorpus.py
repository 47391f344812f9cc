"""Mutation corpus for fuzzing the RoCE parsers (kernel and offline), plus the harness that
runs a corpus through BPF_PROG_TEST_RUN and learns each frame's category.

A corpus is N frames stored flat (one uint8 buffer + offsets + lengths) so that millions of
frames cost a few hundred MB at most and are built with numpy, not per-frame Python:

1. a few thousand *templates* are built with struct (valid RoCEv2 IPv4/IPv6, RoCEv1, with
   0..2 VLAN tags, every opcode the table knows, payloads 0..~3 KiB with consistent PadCnt,
   IPv4 options, Ethernet trailer padding; plus PFC/pause, non-RoCE, fragments, and VLAN
   stacks 3..6 deep). Each template records where its headers are (ethertype, L3, UDP,
   BTH, extension headers, end of headers).
2. every frame picks a mutation kind and a template eligible for it, is copied from the
   template (one vectorised gather per template), then mutated with fancy indexing:
   truncation (anywhere, or inside the extension headers), random header bytes / bit flips,
   bogus IHL / IP version, UDP length lies, IP/GRH length lies, PadCnt past the payload,
   unknown or mismatched opcodes, random EtherTypes, fragment bits, several at once, or
   random bytes of random length.

Nothing here knows which category a frame will land in: that is what the parsers under
test decide, and the tests compare them with each other and check the invariants.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import struct
from dataclasses import dataclass

import numpy as np

from skewscope.core import layout as L

KINDS = (
    "valid",          # template unchanged
    "random_bytes",   # random length, random content
    "truncate",       # cut anywhere (mostly inside the headers)
    "truncate_ext",   # cut inside BTH / extension headers / ICRC
    "field",          # 1..3 random header bytes set to random values
    "bitflip",        # 1..8 random bit flips in the headers
    "ihl",            # IPv4 IHL nibble random (0..15)
    "ip_version",     # IP/GRH version nibble random
    "udp_len",        # UDP length lie (0..7, +-1..64, random 16 bit)
    "ip_len",         # IPv4 total length / IPv6 payload length / GRH payload length lie
    "pad",            # BTH PadCnt set to 1..3, often on an empty payload
    "opcode_unknown", # an opcode the table does not know
    "opcode_any",     # any opcode (known ones with the wrong extension headers)
    "vlan_deep",      # 3..6 VLAN tags
    "ethertype",      # the last EtherType replaced
    "fragment",       # IPv4 MF / offset bits, IPv6 next header 44
    "multi",          # 2..4 of field / udp_len / ip_len / pad / opcode, then maybe a cut
)
K = {n: i for i, n in enumerate(KINDS)}

# template families
FAM_V4, FAM_V6, FAM_V1, FAM_PFC, FAM_PAUSE, FAM_NONROCE, FAM_FRAG, FAM_DEEPVLAN, FAM_ENCAP = range(9)

VALID_OPCODES = np.nonzero(L.OPCODE_TABLE & L.OPT_VALID)[0].astype(np.uint8)
UNKNOWN_OPCODES = np.nonzero((L.OPCODE_TABLE & L.OPT_VALID) == 0)[0].astype(np.uint8)

MAX_FRAME = 3600   # BPF_PROG_TEST_RUN for TC takes at most ~3.7 KB of linear data


@dataclass
class Templates:
    data: np.ndarray      # flat uint8
    off: np.ndarray       # int64
    length: np.ndarray    # int32
    family: np.ndarray    # uint8
    et_off: np.ndarray    # offset of the last EtherType (int32)
    l3_off: np.ndarray    # IP/GRH header (or -1)
    udp_off: np.ndarray   # UDP header (or -1)
    bth_off: np.ndarray   # BTH (or -1)
    hdr_end: np.ndarray   # end of all headers (BTH + extension headers, or L4 header)


def _ip4(rng, pool):
    return bytes([10, 0, int(rng.integers(0, 4)), int(rng.integers(1, pool + 1))])


def _ip6(rng, pool):
    return bytes.fromhex("fd000000000000000000000000000000")[:14] + bytes([int(rng.integers(0, 4)),
                                                                           int(rng.integers(1, pool + 1))])


def _ext_bytes(rng, opinfo: int, ext: int) -> bytes:
    b = bytearray(rng.integers(0, 256, size=ext, dtype=np.uint8).tobytes())
    prefix = (opinfo & L.OPT_PREFIX_MASK) >> L.OPT_PREFIX_SHIFT
    if opinfo & L.OPT_RETH and ext >= prefix + 16:
        ln = int(rng.choice([0, 1, 64, 4096, 65536, 1 << 20, int(rng.integers(0, 1 << 32))]))
        b[prefix + 12:prefix + 16] = struct.pack(">I", ln)
    if opinfo & L.OPT_AETH and ext >= prefix + 4:
        b[prefix] = int(rng.choice([0x00, 0x1F, 0x20, 0x60, 0x61, 0x64, int(rng.integers(0, 256))]))
    return bytes(b)


def _transport(rng, op: int, plen: int) -> bytes:
    """BTH + extension headers + payload + pad + ICRC for opcode op (PadCnt consistent)."""
    opinfo = int(L.OPCODE_TABLE[op])
    ext = opinfo & L.OPT_EXTLEN_MASK
    pad = (-plen) % 4
    fb = int(rng.choice([0, 0x80, 0x40]))
    bth = struct.pack(">BBHB3sB3s", op, (pad << 4) | int(rng.integers(0, 2)) << 7, 0xFFFF, fb,
                      int(rng.integers(1, 64)).to_bytes(3, "big"), 0,
                      int(rng.integers(0, 1 << 24)).to_bytes(3, "big"))
    return bth + _ext_bytes(rng, opinfo, ext) + bytes(plen + pad) + b"\xde\xad\xbe\xef", 12 + ext


def _vlans(n: int) -> bytes:
    out = b""
    for i in range(n):
        out += struct.pack(">HH", 0x88A8 if (i == 0 and n > 1) else 0x8100, 100 + i)
    return out


def _eth(rng, ethertype: int, nvlan: int) -> tuple[bytes, int]:
    h = bytes([2, 0x5C, 0, 0, 0, int(rng.integers(1, 9))]) + bytes([2, 0x5C, 0, 0, 0, int(rng.integers(1, 9))])
    if nvlan:
        v = _vlans(nvlan)
        # first TPID in the Ethernet type field, the inner protocol after the last tag
        return h + v[:2] + b"".join(v[i * 4 + 2:i * 4 + 4] + (v[i * 4 + 4:i * 4 + 6] if i + 1 < nvlan else
                                    struct.pack(">H", ethertype)) for i in range(nvlan)), 12 + 4 * nvlan
    return h + struct.pack(">H", ethertype), 12


def _plen(rng) -> int:
    r = rng.random()
    if r < 0.5:
        return int(rng.integers(0, 9))
    if r < 0.92:
        return int(rng.integers(9, 200))
    if r < 0.99:
        return int(rng.integers(300, 1500))
    return int(rng.integers(1500, 3300))


def _encap_outer(rng, inner: bytes, eth_only: bool) -> tuple[bytes, bool, int]:
    """Outer headers for one encapsulation of `inner` (an Ethernet frame): (bytes, ip_only,
    offset of the GRE protocol field).
    ERSPAN I/II/III (+ platform subheader), GRE TEB, GRE carrying IP (ip_only: the caller
    drops the inner Ethernet header), VXLAN; outer IPv4/IPv6, 0..1 outer VLAN tags; GRE C/K
    bits at random. Lengths consistent (outer IP length = the rest of the frame)."""
    kind = int(rng.integers(0, 6 if eth_only else 7))
    ip_only = kind == 6
    nv = int(rng.choice([0, 0, 1]))
    v6 = rng.random() < 0.4
    if kind == 5:  # VXLAN
        encap = struct.pack(">HHHH", int(rng.integers(0xC000, 0x10000)), 4789, 16 + len(inner), 0) + \
            struct.pack(">II", 0x08000000, 0x424200)
        proto = 17
    else:
        gp = {0: 0x88BE, 1: 0x88BE, 2: 0x22EB, 3: 0x22EB, 4: 0x6558}.get(kind, 0)
        if ip_only:
            gp = struct.unpack_from(">H", inner, 12)[0]
        c, k = rng.random() < 0.2, rng.random() < 0.3
        s = kind == 1 or (kind in (2, 3) and rng.random() < 0.5)
        flags = (0x8000 if c else 0) | (0x2000 if k else 0) | (0x1000 if s else 0)
        encap = struct.pack(">HH", flags, gp) + (b"\0" * 4 if c else b"") + (b"\0\0\0\x07" if k else b"") + \
            (struct.pack(">I", int(rng.integers(0, 1 << 32))) if s else b"")
        if kind == 1:
            encap += struct.pack(">II", 0x10010005, 3)
        elif kind in (2, 3):
            encap += struct.pack(">III", 0x20000006, 0, 1 if kind == 3 else 0) + (bytes(8) if kind == 3 else b"")
        proto = 47
    rest = len(encap) + len(inner) - (14 if ip_only else 0)
    if v6:
        ip = struct.pack(">IHBB16s16s", 6 << 28, rest, proto, 64, bytes(15) + b"\1", bytes(15) + b"\2")
    else:
        ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + rest, 0, 0x4000, 64, proto, 0, bytes([192, 0, 2, 1]),
                         bytes([192, 0, 2, 2]))
    eth, _ = _eth(rng, 0x86DD if v6 else 0x0800, nv)
    return eth + ip + encap, ip_only, len(eth) + len(ip) + 2  # (GRE protocol field offset)


def build_templates(n: int = 3000, seed: int = 1, addr_pool: int = 6) -> Templates:
    rng = np.random.default_rng(seed)
    frames, fam, eto, l3o, udpo, btho, hend = [], [], [], [], [], [], []
    fams = rng.choice(9, size=n, p=[0.31, 0.16, 0.11, 0.05, 0.03, 0.1, 0.06, 0.1, 0.08])
    for f in fams:
        f = int(f)
        nv = int(rng.choice([0, 0, 0, 1, 2])) if f != FAM_DEEPVLAN else int(rng.integers(3, 7))
        l3 = udp = bth = -1
        if f in (FAM_V4, FAM_V6, FAM_V1, FAM_DEEPVLAN, FAM_FRAG, FAM_ENCAP):
            op = int(rng.choice(VALID_OPCODES))
            tr, hlen = _transport(rng, op, _plen(rng))
            inner = int(rng.choice([FAM_V4, FAM_V6, FAM_V1])) if f in (FAM_DEEPVLAN, FAM_FRAG, FAM_ENCAP) else f
            if f == FAM_FRAG and inner == FAM_V1:
                inner = FAM_V4
            tos = int(rng.integers(0, 256))
            if inner == FAM_V4:
                eth, et = _eth(rng, 0x0800, nv)
                nopt = int(rng.choice([0, 0, 0, 1, 2, 10]))
                ihl = 5 + nopt
                ulen = 8 + len(tr)
                frag = 0x4000
                if f == FAM_FRAG:
                    frag = int(rng.choice([0x2000, 0x2000 | int(rng.integers(1, 0x1FFF)), int(rng.integers(1, 0x1FFF))]))
                ip = struct.pack(">BBHHHBBH4s4s", 0x40 | ihl, tos, ihl * 4 + ulen, 0, frag, 64, 17, 0,
                                 _ip4(rng, addr_pool), _ip4(rng, addr_pool)) + bytes(4 * nopt)
                u = struct.pack(">HHHH", int(rng.integers(0xC000, 0x10000)), 4791, ulen, 0)
                body = ip + u + tr
                l3 = len(eth)
                udp = l3 + ihl * 4
                bth = udp + 8
            elif inner == FAM_V6:
                eth, et = _eth(rng, 0x86DD, nv)
                ulen = 8 + len(tr)
                nh = 44 if f == FAM_FRAG else 17
                ip = struct.pack(">IHBB16s16s", (6 << 28) | (tos << 20), ulen, nh, 64, _ip6(rng, addr_pool),
                                 _ip6(rng, addr_pool))
                u = struct.pack(">HHHH", int(rng.integers(0xC000, 0x10000)), 4791, ulen, 0)
                body = ip + u + tr
                l3 = len(eth)
                udp = l3 + 40
                bth = udp + 8
            else:
                eth, et = _eth(rng, L.ETH_P_ROCEV1, nv)
                grh = struct.pack(">IHBB16s16s", (6 << 28) | (tos << 20), len(tr), 0x1B, 64, _ip6(rng, addr_pool),
                                  _ip6(rng, addr_pool))
                body = grh + tr
                l3 = len(eth)
                bth = l3 + 40
            he = bth + hlen
        elif f in (FAM_PFC, FAM_PAUSE):
            eth, et = _eth(rng, L.ETH_P_MACCTL, 0)
            if f == FAM_PFC:
                body = struct.pack(">HH8H", L.MACCTL_PFC, int(rng.integers(0, 256)),
                                   *[int(rng.choice([0, 0xFFFF, int(rng.integers(0, 0x10000))])) for _ in range(8)])
            else:
                body = struct.pack(">HH", L.MACCTL_PAUSE, int(rng.integers(0, 0x10000)))
            he = len(eth) + len(body)
        else:  # non-RoCE: TCP, other UDP port, ARP
            which = int(rng.integers(0, 3))
            if which == 2:
                eth, et = _eth(rng, 0x0806, nv)
                body = bytes(28)
                he = len(eth) + 28
            else:
                eth, et = _eth(rng, 0x0800, nv)
                proto = 6 if which == 0 else 17
                l4 = bytes(20) if proto == 6 else struct.pack(">HHHH", 1234, int(rng.choice([53, 4790, 4792, 0])), 8 + 16, 0)
                pay = bytes(int(rng.integers(0, 64)))
                ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + len(l4) + len(pay), 0, 0x4000, 64, proto, 0,
                                 _ip4(rng, addr_pool), _ip4(rng, addr_pool))
                body = ip + l4 + pay
                l3 = len(eth)
                if proto == 17:
                    udp = l3 + 20
                he = len(eth) + 20 + len(l4)
        fr = eth + body
        if f == FAM_ENCAP:
            # one encapsulation in front (RoCE inside): offsets point at the inner headers
            outer = _encap_outer(rng, fr, inner == FAM_V1 or nv > 0)
            if outer[1]:  # GRE carrying IP: the inner Ethernet header is dropped
                fr, l3, udp, bth, he = fr[14:], l3 - 14, udp - 14, bth - 14, he - 14
            sh = len(outer[0])
            fr = outer[0] + fr
            et = outer[2] if outer[1] else et + sh  # the GRE protocol is the inner EtherType
            l3, he = l3 + sh, he + sh
            udp = udp + sh if udp >= 0 else -1
            bth = bth + sh if bth >= 0 else -1
        if len(fr) < 60 and rng.random() < 0.5:
            fr = fr + bytes(60 - len(fr))  # Ethernet minimum-size padding after the IP packet
        fr = fr[:MAX_FRAME]
        frames.append(fr)
        fam.append(f)
        eto.append(et)
        l3o.append(l3)
        udpo.append(udp)
        btho.append(bth)
        hend.append(min(he, len(fr)))
    length = np.array([len(x) for x in frames], dtype=np.int32)
    off = np.zeros(n, dtype=np.int64)
    off[1:] = np.cumsum(length[:-1])
    return Templates(np.frombuffer(b"".join(frames), dtype=np.uint8).copy(), off, length,
                     np.array(fam, np.uint8), np.array(eto, np.int32), np.array(l3o, np.int32),
                     np.array(udpo, np.int32), np.array(btho, np.int32), np.array(hend, np.int32))


@dataclass
class Corpus:
    data: np.ndarray     # flat uint8
    off: np.ndarray      # int64
    length: np.ndarray   # int32 (the frame; the buffer region may be longer after a cut)
    kind: np.ndarray     # uint8 index into KINDS
    template: np.ndarray  # int32 (-1: random bytes)

    def __len__(self) -> int:
        return len(self.off)

    def frame(self, i: int) -> bytes:
        o = int(self.off[i])
        return self.data[o:o + int(self.length[i])].tobytes()

    def subset(self, idx) -> "Corpus":
        idx = np.asarray(idx)
        ln = self.length[idx]
        off = np.zeros(len(idx), dtype=np.int64)
        if len(idx):
            off[1:] = np.cumsum(ln[:-1], dtype=np.int64)
        data = np.empty(int(ln.sum()), dtype=np.uint8)
        _gather(data, off, self.data, self.off[idx], ln)
        return Corpus(data, off, ln.copy(), self.kind[idx].copy(), self.template[idx].copy())

    def kind_counts(self) -> dict:
        c = np.bincount(self.kind, minlength=len(KINDS))
        return {n: int(c[i]) for i, n in enumerate(KINDS)}

    def write_pcap(self, path: str, ts0_ns: int = 1_735_689_600 * 10**9, step_ns: int = 1000) -> None:
        """One record per frame (caplen = orig len), nanosecond pcap, Ethernet."""
        n = len(self)
        ts = ts0_ns + np.arange(n, dtype=np.int64) * step_ns
        rec = np.zeros(n, dtype=[("sec", "<u4"), ("nsec", "<u4"), ("incl", "<u4"), ("orig", "<u4")])
        rec["sec"] = ts // 10**9
        rec["nsec"] = ts % 10**9
        rec["incl"] = self.length
        rec["orig"] = self.length
        rl = 16 + self.length.astype(np.int64)
        roff = np.zeros(n, dtype=np.int64)
        roff[1:] = np.cumsum(rl[:-1])
        out = np.empty(int(rl.sum()), dtype=np.uint8)
        hdr = rec.view(np.uint8).reshape(n, 16)
        _scatter_rows(out, roff, hdr)
        _gather(out, roff + 16, self.data, self.off, self.length)
        with open(path, "wb") as fh:
            fh.write(struct.pack("<IHHiIII", L_PCAP_NS, 2, 4, 0, 0, 65535, 1))
            fh.write(out.tobytes())


L_PCAP_NS = 0xA1B23C4D


def _positions(dst_off: np.ndarray, length: np.ndarray) -> np.ndarray:
    """Flat positions dst_off[i] + 0..length[i]-1 for all i (int64)."""
    tot = int(length.sum())
    if tot == 0:
        return np.zeros(0, dtype=np.int64)
    starts = np.repeat(dst_off - np.concatenate([[0], np.cumsum(length[:-1], dtype=np.int64)]), length)
    return starts + np.arange(tot, dtype=np.int64)


def _gather(dst, dst_off, src, src_off, length, chunk: int = 1 << 16) -> None:
    """dst[dst_off[i]:+length[i]] = src[src_off[i]:+length[i]], in chunks of frames."""
    length = np.asarray(length, dtype=np.int64)
    for a in range(0, len(length), chunk):
        b = min(a + chunk, len(length))
        dst[_positions(dst_off[a:b], length[a:b])] = src[_positions(src_off[a:b], length[a:b])]


def _scatter_rows(dst, dst_off, rows) -> None:
    w = rows.shape[1]
    dst[(dst_off[:, None] + np.arange(w)[None, :]).reshape(-1)] = rows.reshape(-1)


def make_corpus(n: int, seed: int = 0, min_len: int = 14, templates: Templates | None = None,
                kinds: tuple[str, ...] | None = None) -> Corpus:
    """n frames, each a mutation (KINDS) of a template or random bytes. min_len: frames
    shorter than this are never produced (BPF_PROG_TEST_RUN refuses < 14 bytes; the offline
    parser takes any length, so pass 0 there)."""
    T = templates if templates is not None else build_templates(seed=seed + 1)
    rng = np.random.default_rng(seed)
    kinds_ok = np.array([K[k] for k in (kinds or KINDS)])
    weights = np.array([{"valid": 2.0, "random_bytes": 1.0, "multi": 1.5}.get(KINDS[k], 1.0) for k in kinds_ok])
    kind = kinds_ok[rng.choice(len(kinds_ok), size=n, p=weights / weights.sum())].astype(np.uint8)

    # eligible templates per kind
    fam = T.family
    roce = np.isin(fam, (FAM_V4, FAM_V6, FAM_V1, FAM_ENCAP))
    elig = {
        K["ihl"]: np.nonzero(fam == FAM_V4)[0],
        K["ip_version"]: np.nonzero(T.l3_off >= 0)[0],
        K["udp_len"]: np.nonzero((T.udp_off >= 0) & roce)[0],
        K["ip_len"]: np.nonzero(roce)[0],
        K["pad"]: np.nonzero(roce)[0],
        K["opcode_unknown"]: np.nonzero(roce)[0],
        K["opcode_any"]: np.nonzero(roce)[0],
        K["truncate_ext"]: np.nonzero(roce)[0],
        K["vlan_deep"]: np.nonzero(fam == FAM_DEEPVLAN)[0],
        K["fragment"]: np.nonzero(np.isin(fam, (FAM_V4, FAM_V6)))[0],
        K["multi"]: np.nonzero(roce)[0],
    }
    tmpl = np.full(n, -1, dtype=np.int32)
    allt = np.nonzero(fam != FAM_DEEPVLAN)[0]
    for k in range(len(KINDS)):
        sel = np.nonzero(kind == k)[0]
        if not len(sel) or k == K["random_bytes"]:
            continue
        pool = elig.get(k, allt)
        tmpl[sel] = pool[rng.integers(0, len(pool), size=len(sel))]

    # buffer sizes: template length, or random length for random bytes
    rb = kind == K["random_bytes"]
    region = np.where(rb, 0, T.length[np.maximum(tmpl, 0)]).astype(np.int64)
    r = rng.random(n)
    rlen = np.where(r < 0.5, rng.integers(max(min_len, 0), 100, size=n),
                    np.where(r < 0.9, rng.integers(100, 600, size=n), rng.integers(600, 1600, size=n)))
    region[rb] = np.maximum(rlen[rb], min_len)
    off = np.zeros(n, dtype=np.int64)
    off[1:] = np.cumsum(region[:-1])
    data = np.empty(int(region.sum()), dtype=np.uint8)
    # random bytes
    ri = np.nonzero(rb)[0]
    if len(ri):
        pos = _positions(off[ri], region[ri])
        data[pos] = rng.integers(0, 256, size=len(pos), dtype=np.uint8)
    ti = np.nonzero(~rb)[0]
    _gather(data, off[ti], T.data, T.off[tmpl[ti]], region[ti])
    length = region.astype(np.int32)

    t = np.maximum(tmpl, 0)
    l3, udp, bth, hend = (T.l3_off[t].astype(np.int64), T.udp_off[t].astype(np.int64),
                          T.bth_off[t].astype(np.int64), T.hdr_end[t].astype(np.int64))
    base = off

    def sel(k):
        return np.nonzero(kind == K[k])[0]

    def put16(idx, rel, val):
        p = base[idx] + rel
        data[p] = (val >> 8) & 0xFF
        data[p + 1] = val & 0xFF

    def field(idx, count=1):
        for _ in range(count):
            p = base[idx] + (rng.random(len(idx)) * np.maximum(hend[idx], 1)).astype(np.int64)
            data[p] = rng.integers(0, 256, size=len(idx), dtype=np.uint8)

    def udp_len(idx):
        has = idx[udp[idx] >= 0]
        cur = (data[base[has] + udp[has] + 4].astype(np.int64) << 8) | data[base[has] + udp[has] + 5]
        m = rng.integers(0, 3, size=len(has))
        v = np.where(m == 0, rng.integers(0, 8, size=len(has)),
                     np.where(m == 1, cur + rng.integers(-64, 65, size=len(has)), rng.integers(0, 1 << 16, size=len(has))))
        put16(has, udp[has] + 4, np.clip(v, 0, 0xFFFF))

    def ip_len(idx):
        v4 = idx[data[base[idx] + l3[idx]] >> 4 == 4]
        v6 = idx[data[base[idx] + l3[idx]] >> 4 != 4]
        for grp, rel in ((v4, 2), (v6, 4)):
            cur = (data[base[grp] + l3[grp] + rel].astype(np.int64) << 8) | data[base[grp] + l3[grp] + rel + 1]
            m = rng.integers(0, 3, size=len(grp))
            v = np.where(m == 0, rng.integers(0, 48, size=len(grp)),
                         np.where(m == 1, cur + rng.integers(-64, 65, size=len(grp)),
                                  rng.integers(0, 1 << 16, size=len(grp))))
            put16(grp, l3[grp] + rel, np.clip(v, 0, 0xFFFF))

    def pad(idx):
        p = base[idx] + bth[idx] + 1
        data[p] = (data[p] & 0xCF) | (rng.integers(1, 4, size=len(idx)) << 4).astype(np.uint8)

    def opcode(idx, unknown):
        pool = UNKNOWN_OPCODES if unknown else np.arange(256, dtype=np.uint8)
        data[base[idx] + bth[idx]] = pool[rng.integers(0, len(pool), size=len(idx))]

    def cut(idx, lo, hi):
        lo = np.maximum(lo, min_len)
        hi = np.maximum(np.minimum(hi, length[idx]), lo)
        length[idx] = (lo + (rng.random(len(idx)) * (hi - lo + 1)).astype(np.int64)).clip(max=length[idx])

    i = sel("truncate")
    if len(i):
        inhdr = rng.random(len(i)) < 0.8
        cut(i[inhdr], 0, hend[i[inhdr]] + 4)
        cut(i[~inhdr], 0, length[i[~inhdr]] - 1)
    i = sel("truncate_ext")
    cut(i, bth[i], hend[i] + 4)
    field(sel("field"), 1)
    i = sel("field")
    field(i[rng.random(len(i)) < 0.5], 2)
    i = sel("bitflip")
    for _ in range(4):
        p = base[i] + (rng.random(len(i)) * np.maximum(hend[i], 1)).astype(np.int64)
        data[p] ^= (1 << rng.integers(0, 8, size=len(i))).astype(np.uint8)
    i = sel("ihl")
    p = base[i] + l3[i]
    data[p] = (data[p] & 0xF0) | rng.integers(0, 16, size=len(i)).astype(np.uint8)
    i = sel("ip_version")
    p = base[i] + l3[i]
    data[p] = (data[p] & 0x0F) | (rng.integers(0, 16, size=len(i)) << 4).astype(np.uint8)
    udp_len(sel("udp_len"))
    ip_len(sel("ip_len"))
    pad(sel("pad"))
    opcode(sel("opcode_unknown"), True)
    opcode(sel("opcode_any"), False)
    i = sel("ethertype")
    put16(i, T.et_off[t[i]].astype(np.int64),
          np.array([0x0800, 0x86DD, 0x8915, 0x8808, 0x8100, 0x88A8, 0x0806, 0x0000, 0xFFFF])[
              rng.integers(0, 9, size=len(i))])
    i = sel("ethertype")
    j = i[rng.random(len(i)) < 0.3]
    put16(j, T.et_off[t[j]].astype(np.int64), rng.integers(0, 1 << 16, size=len(j)))
    i = sel("fragment")
    v4 = i[data[base[i] + l3[i]] >> 4 == 4]
    put16(v4, l3[v4] + 6, rng.integers(1, 0x4000, size=len(v4)) | 0x2000 * rng.integers(0, 2, size=len(v4)))
    v6 = i[data[base[i] + l3[i]] >> 4 != 4]
    data[base[v6] + l3[v6] + 6] = 44
    i = sel("multi")
    ops = rng.random((5, len(i)))
    field(i[ops[0] < 0.5], 1)
    udp_len(i[ops[1] < 0.5])
    ip_len(i[ops[2] < 0.5])
    pad(i[ops[3] < 0.5])
    opcode(i[ops[4] < 0.3], False)
    j = i[rng.random(len(i)) < 0.4]
    cut(j, 0, hend[j] + 64)
    return Corpus(data, off, length, kind, tmpl)


# ---- BPF_PROG_TEST_RUN harness ------------------------------------------------------------
_SYS_BPF = {"x86_64": 321, "aarch64": 280, "armv7l": 386, "ppc64le": 361, "s390x": 351, "riscv64": 280}
BPF_MAP_LOOKUP_BATCH = 24
BPF_PROG_TEST_RUN = 10
N_READ = L.G_MSG_PARTIAL + 1   # categories, FRAMES, FLOWS_CREATED, MSG_PARTIAL


@dataclass
class KernelRun:
    verdict: np.ndarray    # int64 per frame (-errno when the kernel refused the run)
    delta: np.ndarray      # (n, N_READ) int64: change of the global counters per frame
    seconds: float

    @property
    def category(self) -> np.ndarray:
        """Category per frame (argmax of the category deltas; check `one_category` first)."""
        return np.argmax(self.delta[:, :L.G_NCAT], axis=1)

    @property
    def one_category(self) -> np.ndarray:
        """Per frame: exactly one category +1 and every other unchanged, FRAMES +1."""
        d = self.delta[:, :L.G_NCAT]
        return ((d == 1).sum(axis=1) == 1) & ((d == 0).sum(axis=1) == L.G_NCAT - 1) & (self.delta[:, L.G_FRAMES] == 1)


def run_kernel(dp, entry: str, corpus: Corpus, chunk: int = 1 << 15) -> KernelRun:
    """Run every frame through dp's `entry` program ('xdp'/'tc') with BPF_PROG_TEST_RUN and
    read the global counters after each one (process pinned to one CPU, so only that CPU's
    counters move). Two syscalls per frame, no numpy work per frame."""
    import time

    nr = _SYS_BPF[platform.machine()]
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    sysc = libc.syscall
    sysc.restype = ctypes.c_long
    sysc.argtypes = (ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_long)
    fd = dp.prog_fd(entry)
    gfd = dp.bpf["globals"].map_fd
    ncpu = dp.config.ncpus
    n = len(corpus)
    old = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(old)})
    # attrs as numpy words: test run (data_size @8, data_in @16, retval @4), batch lookup
    run = np.zeros(20, dtype=np.uint64)
    run32 = run.view(np.uint32)
    run32[0] = fd
    run32[8] = 1  # repeat
    look = np.zeros(20, dtype=np.uint64)
    look32 = look.view(np.uint32)
    keys = np.zeros(1, dtype=np.uint32)     # one per-CPU entry: struct ss_globals (G_N counters)
    look[2] = keys.ctypes.data
    look32[10] = 0
    look32[9] = gfd
    vals = np.zeros((chunk + 1, ncpu, L.G_N), dtype=np.uint64)
    verdict = np.empty(n, dtype=np.int64)
    delta = np.empty((n, N_READ), dtype=np.int64)
    run_p, look_p = run.ctypes.data, look.ctypes.data
    data_p = corpus.data.ctypes.data
    offs = (corpus.off + data_p).tolist()
    lens = corpus.length.tolist()
    stride = L.G_N * ncpu * 8
    t0 = time.monotonic()

    scratch = np.zeros(16, dtype=np.uint64)  # out_batch token (never read)

    def read_into(row):
        look[0] = 0
        look[1] = scratch.ctypes.data
        look[3] = vals.ctypes.data + row * stride
        look32[8] = 1
        if sysc(nr, BPF_MAP_LOOKUP_BATCH, look_p, 160) < 0:
            e = ctypes.get_errno()
            if e != 2 or look32[8] != 1:  # ENOENT with the one entry read = end of array
                raise OSError(e, os.strerror(e))

    try:
        read_into(0)
        for a in range(0, n, chunk):
            b = min(a + chunk, n)
            for k in range(a, b):
                run[2] = offs[k]
                run32[2] = lens[k]
                run32[3] = 0  # data_size_out: written back by the kernel; 0 = no output wanted
                if sysc(nr, BPF_PROG_TEST_RUN, run_p, 160) < 0:
                    verdict[k] = -ctypes.get_errno()
                else:
                    verdict[k] = run32[1]
                read_into(k - a + 1)
            s = vals[: b - a + 1].sum(axis=1)[:, :N_READ].astype(np.int64)
            delta[a:b] = np.diff(s, axis=0)
            vals[0] = vals[b - a]
    finally:
        os.sched_setaffinity(0, old)
    return KernelRun(verdict, delta, time.monotonic() - t0)
