"""Frame builders for tests, on top of scapy (+ scapy.contrib.roce).

Ground truth rule: everything a test expects must come from how a frame was built here,
never from skewscope's own tables. So this module has its *own* copy of "which extension
headers an opcode carries" (`EXT_HEADERS`, written from the IBA spec tables as quoted in
../shared/docs/wire.md and Linux drivers/infiniband/sw/rxe/rxe_opcode.c), and every builder
returns a `Built` record holding the frame bytes plus the facts a test needs (wire length,
payload bytes, the RETH DMA length, ...), all known by construction.

scapy's RoCE layer provides BTH (with ICRC computed over IPv4/IPv6 pseudo headers), AETH,
GRH and the CNP padding; RETH, ImmDt/IETH, DETH, AtomicETH, AtomicAckETH and XRCETH are
declared below as plain scapy layers (field widths from the IBA spec).

Reusable: `roce(...)` for any RoCEv2/RoCEv1 packet, `arp/tcp/udp/...` for non-RoCE,
`pfc/pause` for MAC control frames, `key_of(...)` for the flow key of a Built frame.
"""
from __future__ import annotations

import ipaddress
import logging
import struct
from dataclasses import dataclass, field

logging.getLogger("scapy.runtime").setLevel(logging.ERROR)
logging.getLogger("scapy").setLevel(logging.ERROR)

from scapy.config import conf  # noqa: E402

conf.verb = 0

from pathlib import Path  # noqa: E402

from scapy.contrib.roce import AETH, BTH, GRH, CNPPadding  # noqa: E402,F401
from scapy.fields import ByteField, IntField, ShortField, X3BytesField, XIntField, XLongField, XShortField  # noqa: E402
from scapy.layers.inet import ICMP, IP, TCP, UDP, IPOption  # noqa: E402
from scapy.layers.inet6 import IPv6, IPv6ExtHdrFragment, IPv6ExtHdrHopByHop  # noqa: E402
from scapy.layers.l2 import ARP, Dot1AD, Dot1Q, Ether  # noqa: E402
from scapy.packet import Packet, Raw  # noqa: E402

#: the real captures beside the checkout (../shared/data/real); read them there, never copy
REAL_DATA = Path(__file__).resolve().parents[1].parent / "shared/data/real"

MAC_A = "02:00:00:00:00:0a"
MAC_B = "02:00:00:00:00:0b"
PFC_DMAC = "01:80:c2:00:00:01"
ROCE_PORT = 4791


# ---- extension headers (IBA vol 1, ch. 9.3) ----------------------------------------------
class RETH(Packet):
    name = "RETH"
    fields_desc = [XLongField("va", 0), XIntField("rkey", 0), IntField("dma_len", 0)]


class ImmDt(Packet):  # also IETH (the invalidate R_Key): same 4-byte shape
    name = "ImmDt"
    fields_desc = [XIntField("imm", 0)]


class DETH(Packet):
    name = "DETH"
    fields_desc = [XIntField("qkey", 0), ByteField("resv", 0), X3BytesField("srcqp", 0)]


class AtomicETH(Packet):
    name = "AtomicETH"
    fields_desc = [XLongField("va", 0), XIntField("rkey", 0), XLongField("swap_add", 0), XLongField("compare", 0)]


class AtomicAckETH(Packet):
    name = "AtomicAckETH"
    fields_desc = [XLongField("orig", 0)]


class XRCETH(Packet):
    name = "XRCETH"
    fields_desc = [ByteField("resv", 0), X3BytesField("xrcsrq", 0)]


class FETH(Packet):  # FLUSH extended transport header (IBA 1.5)
    name = "FETH"
    fields_desc = [XIntField("sel_plt", 0)]


class MacCtl(Packet):
    name = "MacCtl"
    fields_desc = [XShortField("opcode", 0x0101), XShortField("class_enable", 0)] + \
                  [ShortField(f"t{i}", 0) for i in range(8)]


# ---- the opcode facts, independent of skewscope.core.layout -------------------------------------
RC_NAMES = {
    0x00: "SEND_FIRST", 0x01: "SEND_MIDDLE", 0x02: "SEND_LAST", 0x03: "SEND_LAST_WITH_IMMEDIATE",
    0x04: "SEND_ONLY", 0x05: "SEND_ONLY_WITH_IMMEDIATE", 0x06: "RDMA_WRITE_FIRST", 0x07: "RDMA_WRITE_MIDDLE",
    0x08: "RDMA_WRITE_LAST", 0x09: "RDMA_WRITE_LAST_WITH_IMMEDIATE", 0x0A: "RDMA_WRITE_ONLY",
    0x0B: "RDMA_WRITE_ONLY_WITH_IMMEDIATE", 0x0C: "RDMA_READ_REQUEST", 0x0D: "RDMA_READ_RESPONSE_FIRST",
    0x0E: "RDMA_READ_RESPONSE_MIDDLE", 0x0F: "RDMA_READ_RESPONSE_LAST", 0x10: "RDMA_READ_RESPONSE_ONLY",
    0x11: "ACKNOWLEDGE", 0x12: "ATOMIC_ACKNOWLEDGE", 0x13: "COMPARE_SWAP", 0x14: "FETCH_ADD",
    0x16: "SEND_LAST_WITH_INVALIDATE", 0x17: "SEND_ONLY_WITH_INVALIDATE",
    0x1C: "FLUSH", 0x1D: "ATOMIC_WRITE",
}
# Extension headers after the BTH for the RC form of each operation, in wire order.
_RC_EXT = {
    0x00: (), 0x01: (), 0x02: (), 0x03: ("ImmDt",), 0x04: (), 0x05: ("ImmDt",),
    0x06: ("RETH",), 0x07: (), 0x08: (), 0x09: ("ImmDt",), 0x0A: ("RETH",), 0x0B: ("RETH", "ImmDt"),
    0x0C: ("RETH",), 0x0D: ("AETH",), 0x0E: (), 0x0F: ("AETH",), 0x10: ("AETH",), 0x11: ("AETH",),
    0x12: ("AETH", "AtomicAckETH"), 0x13: ("AtomicETH",), 0x14: ("AtomicETH",),
    0x16: ("IETH",), 0x17: ("IETH",), 0x1C: ("FETH", "RETH"), 0x1D: ("RETH",),
}
# Opcode classes as the README defines them (names, not numbers: compare by name).
_CLASS = {
    **{op: "send" for op in (0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x16, 0x17)},
    **{op: "write" for op in (0x06, 0x07, 0x08, 0x09, 0x0A, 0x0B)},
    0x0C: "read_request", 0x0D: "read_response", 0x0E: "read_response", 0x0F: "read_response",
    0x10: "read_response", 0x11: "ack", 0x12: "atomic_ack", 0x13: "atomic", 0x14: "atomic",
    0x1C: "write", 0x1D: "atomic",
}
# Message starts (README "messages") and message ends.
_STARTS = {0x00, 0x04, 0x05, 0x06, 0x0A, 0x0B, 0x0C, 0x17}
_ENDS = {0x02, 0x03, 0x04, 0x05, 0x08, 0x09, 0x0A, 0x0B, 0x16, 0x17}
# Request packets (consume requester PSNs; responses/ACKs do not).
_REQUESTS = {0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0A, 0x0B, 0x0C,
             0x13, 0x14, 0x16, 0x17, 0x1C, 0x1D}

EXT_HEADERS: dict[int, tuple[str, ...]] = {}
OPCODE_NAME: dict[int, str] = {}
OPCODE_CLASS: dict[int, str] = {}
for _low, _ext in _RC_EXT.items():
    EXT_HEADERS[_low] = _ext
    OPCODE_NAME[_low] = "RC_" + RC_NAMES[_low]
    OPCODE_CLASS[_low] = _CLASS[_low]
    if _low <= 0x0B:  # UC: SEND and WRITE only
        EXT_HEADERS[0x20 | _low] = _ext
        OPCODE_NAME[0x20 | _low] = "UC_" + RC_NAMES[_low]
        OPCODE_CLASS[0x20 | _low] = _CLASS[_low]
    if _low <= 0x17:  # XRC: XRCETH first on requests only; responses/ACKs carry none
        EXT_HEADERS[0xA0 | _low] = (("XRCETH",) + _ext) if _low in _REQUESTS else _ext
        OPCODE_NAME[0xA0 | _low] = "XRC_" + RC_NAMES[_low]
        OPCODE_CLASS[0xA0 | _low] = _CLASS[_low]
EXT_HEADERS[0x64] = ("DETH",)
EXT_HEADERS[0x65] = ("DETH", "ImmDt")
OPCODE_NAME[0x64], OPCODE_NAME[0x65] = "UD_SEND_ONLY", "UD_SEND_ONLY_WITH_IMMEDIATE"
OPCODE_CLASS[0x64] = OPCODE_CLASS[0x65] = "send"
EXT_HEADERS[0x81] = ("CNPPadding",)
OPCODE_NAME[0x81] = "CNP"
OPCODE_CLASS[0x81] = "cnp"
del _low, _ext

EXT_SIZE = {"RETH": 16, "ImmDt": 4, "IETH": 4, "AETH": 4, "DETH": 8, "AtomicETH": 28, "AtomicAckETH": 8,
            "XRCETH": 4, "FETH": 4, "CNPPadding": 16}


def ext_len(op: int) -> int:
    return sum(EXT_SIZE[h] for h in EXT_HEADERS[op])


def _rcuc_xrc(op: int) -> bool:
    return (op & 0xE0) in (0x00, 0x20, 0xA0)


def is_start(op: int) -> bool:
    """Starts a message (README "messages"): SEND_FIRST, SEND_ONLY*, WRITE_FIRST, WRITE_ONLY*,
    READ_REQUEST in RC/UC/XRC form, and the UD SEND_ONLYs."""
    return op in (0x64, 0x65) or (op in OPCODE_CLASS and _rcuc_xrc(op) and (op & 0x1F) in _STARTS)


def is_end(op: int) -> bool:
    return op in (0x64, 0x65) or (op in OPCODE_CLASS and _rcuc_xrc(op) and (op & 0x1F) in _ENDS)


def is_request(op: int) -> bool:
    """PSN-tracked request packet: RC/UC/XRC requests (UD and CNP are not)."""
    return op in OPCODE_CLASS and _rcuc_xrc(op) and (op & 0x1F) in _REQUESTS


ALL_OPCODES = sorted(OPCODE_CLASS)


# ---- built frames --------------------------------------------------------------------------
@dataclass
class Built:
    frame: bytes
    kind: str                     # "roce", "pfc", "pause", "other"
    wire_len: int = 0             # == len(frame) (no FCS), VLAN tags included
    payload: int = 0              # payload bytes as built (without pad and ICRC)
    opcode: int = -1
    qp: int = 0
    psn: int = 0
    src: str = ""
    dst: str = ""
    ipver: int = 0
    roce_ver: int = 0
    dma_len: int | None = None    # RETH DMA length when a RETH was built
    syndrome: int | None = None
    sport: int = 0
    tclass: int = 0
    pad: int = 0
    fecn: int = 0
    becn: int = 0
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        self.wire_len = len(self.frame)

    @property
    def key(self) -> tuple:
        return key_of(self.src, self.dst, self.qp, self.ipver, self.roce_ver)

    def __len__(self):
        return len(self.frame)


def addr16(a: str) -> bytes:
    ip = ipaddress.ip_address(a)
    return (b"\0" * 10 + b"\xff\xff" + ip.packed) if ip.version == 4 else ip.packed


def key_of(src: str, dst: str, qp: int, ipver: int, roce: int = 2) -> tuple:
    """(src16, dst16, dest_qp, ipver, roce): the flow key, as the data plane documents it."""
    return (addr16(src), addr16(dst), int(qp), int(ipver), int(roce))


def _l2(vlans, ethertype=None, src=MAC_A, dst=MAC_B):
    """Ethernet + tags; `ethertype` goes in the innermost type field."""
    pkt = Ether(src=src, dst=dst)
    tags = []
    for i, v in enumerate(vlans):
        if isinstance(v, tuple):
            tpid, vid = v
        else:
            tpid, vid = (0x88A8 if (i == 0 and len(vlans) > 1) else 0x8100), v
        tags.append((tpid, vid))
    if tags:
        pkt.type = tags[0][0]
    for i, (tpid, vid) in enumerate(tags):
        nxt = tags[i + 1][0] if i + 1 < len(tags) else ethertype
        tag = Dot1AD(vlan=vid) if tpid == 0x88A8 else Dot1Q(vlan=vid)
        if nxt is not None:
            tag.type = nxt
        pkt = pkt / tag
    if not tags and ethertype is not None:
        pkt.type = ethertype
    return pkt


def _ext_layers(op: int, *, dma_len: int, syndrome: int, imm: int, msn: int):
    layers = []
    for h in EXT_HEADERS[op]:
        if h == "RETH":
            layers.append(RETH(va=0x7F0000001000, rkey=0x1234, dma_len=dma_len))
        elif h in ("ImmDt", "IETH"):
            layers.append(ImmDt(imm=imm))
        elif h == "AETH":
            layers.append(AETH(syndrome=syndrome, msn=msn))
        elif h == "DETH":
            layers.append(DETH(qkey=0x80010000, srcqp=0x2A))
        elif h == "AtomicETH":
            layers.append(AtomicETH(va=0x1000, rkey=0x77, swap_add=1))
        elif h == "AtomicAckETH":
            layers.append(AtomicAckETH(orig=5))
        elif h == "XRCETH":
            layers.append(XRCETH(xrcsrq=0x33))
        elif h == "FETH":
            layers.append(FETH(sel_plt=0x11))
        elif h == "CNPPadding":
            layers.append(CNPPadding())
        else:  # pragma: no cover
            raise KeyError(h)
    return layers


def roce(op: int, *, src: str = "10.0.0.1", dst: str = "10.0.0.2", qp: int = 0x11, psn: int = 0,
         payload: int = 0, pad: int = 0, dma_len: int | None = None, syndrome: int = 0, imm: int = 0,
         msn: int = 0, sport: int = 0xC001, tclass: int = 0x02, vlans=(), v1: bool = False,
         fecn: int = 0, becn: int | None = None, ip_options: bytes = b"", pkey: int = 0xFFFF,
         flow_label: int = 0, udp_len_delta: int = 0, ip_len_delta: int = 0, migreq: int = 0,
         ackreq: int = 0) -> Built:
    """One RoCE packet. `op` is the full BTH opcode. IPv6 when src/dst are IPv6 (or v1=True:
    RoCEv1 with a GRH, src/dst become the GIDs). `payload` bytes of data then `pad` pad bytes,
    then the 4-byte ICRC. `udp_len_delta` / `ip_len_delta` make the UDP / IP length lie."""
    if op not in EXT_HEADERS:
        raise ValueError(f"no extension-header facts for opcode 0x{op:02x}; use raw_bth()")
    if "RETH" in EXT_HEADERS[op] and dma_len is None:
        dma_len = payload
    becn = (1 if op == 0x81 else 0) if becn is None else becn
    bth = BTH(opcode=op, migreq=migreq, padcount=pad, pkey=0xFFFF if op == 0x81 else pkey, fecn=fecn, becn=becn,
              dqpn=qp, ackreq=ackreq, psn=psn & 0xFFFFFF)
    trans = bth
    for layer in _ext_layers(op, dma_len=dma_len or 0, syndrome=syndrome, imm=imm, msn=msn):
        trans = trans / layer
    body = bytes(payload) + bytes(pad)
    if body:
        trans = trans / Raw(body)
    ipver = 6 if (v1 or ipaddress.ip_address(src).version == 6) else 4
    if v1:
        tb = bytes(bth.__class__(bytes(trans)))  # no UDP underlayer: ICRC stays 0
        grh = GRH(ipver=6, tclass=tclass, flowlabel=flow_label, paylen=len(tb) + ip_len_delta, nexthdr=0x1B,
                  hoplmt=64, sgid=int.from_bytes(addr16(src), "big"), dgid=int.from_bytes(addr16(dst), "big"))
        pkt = _l2(vlans, 0x8915) / grh / Raw(tb)
    else:
        udp = UDP(sport=sport, dport=ROCE_PORT)
        if ipver == 4:
            ip = IP(src=src, dst=dst, tos=tclass, ttl=64, flags="DF")
            if ip_options:
                assert len(ip_options) % 4 == 0 and len(ip_options) <= 40
                ip.options = [IPOption(ip_options)]
        else:
            ip = IPv6(src=src, dst=dst, tc=tclass, fl=flow_label, hlim=64)
        pkt = _l2(vlans) / ip / udp / trans
        if udp_len_delta or ip_len_delta:
            pkt = _lie_lengths(pkt, udp_len_delta, ip_len_delta, ipver)
    frame = bytes(pkt)
    return Built(frame=frame, kind="roce", payload=payload, opcode=op, qp=qp, psn=psn & 0xFFFFFF, src=src, dst=dst,
                 ipver=ipver, roce_ver=1 if v1 else 2, dma_len=dma_len if "RETH" in EXT_HEADERS[op] else None,
                 syndrome=syndrome if "AETH" in EXT_HEADERS[op] else None, sport=0 if v1 else sport,
                 tclass=tclass, pad=pad, fecn=fecn, becn=becn)


def _csum(b: bytes) -> int:
    if len(b) % 2:
        b += b"\0"
    s = sum(struct.unpack(f">{len(b) // 2}H", b))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return (~s) & 0xFFFF


def _lie_lengths(pkt, udp_delta: int, ip_delta: int, ipver: int):
    raw = bytearray(bytes(pkt))
    l3 = len(raw) - len(bytes(pkt[IP] if ipver == 4 else pkt[IPv6]))
    if ipver == 4:
        ihl = (raw[l3] & 0xF) * 4
        tot = struct.unpack_from(">H", raw, l3 + 2)[0]
        struct.pack_into(">H", raw, l3 + 2, (tot + ip_delta) & 0xFFFF)
        struct.pack_into(">H", raw, l3 + 10, 0)
        struct.pack_into(">H", raw, l3 + 10, _csum(bytes(raw[l3:l3 + ihl])))
        l4 = l3 + ihl
    else:
        plen = struct.unpack_from(">H", raw, l3 + 4)[0]
        struct.pack_into(">H", raw, l3 + 4, (plen + ip_delta) & 0xFFFF)
        l4 = l3 + 40
    ulen = struct.unpack_from(">H", raw, l4 + 4)[0]
    struct.pack_into(">H", raw, l4 + 4, (ulen + udp_delta) & 0xFFFF)
    return Raw(bytes(raw))


def raw_bth(opcode: int, *, qp: int = 0x11, psn: int = 0, body: bytes = b"", src: str = "10.0.0.1",
            dst: str = "10.0.0.2", sport: int = 0xC001) -> Built:
    """UDP/4791 with a BTH of any opcode (also ones nobody defines) and arbitrary bytes."""
    pkt = _l2(()) / IP(src=src, dst=dst, tos=2) / UDP(sport=sport, dport=ROCE_PORT) / \
        BTH(opcode=opcode, dqpn=qp, psn=psn) / Raw(body)
    return Built(frame=bytes(pkt), kind="raw", opcode=opcode, qp=qp, psn=psn, src=src, dst=dst, ipver=4,
                 roce_ver=2, sport=sport)


# ---- non-RoCE and MAC control ----------------------------------------------------------------
def arp() -> Built:
    return Built(frame=bytes(Ether(src=MAC_A, dst="ff:ff:ff:ff:ff:ff") / ARP(psrc="10.0.0.1", pdst="10.0.0.2")),
                 kind="other")


def tcp(payload: int = 20, ipv6: bool = False, dport: int = 4791) -> Built:
    ip = IPv6(src="fd00::1", dst="fd00::2") if ipv6 else IP(src="10.0.0.1", dst="10.0.0.2")
    return Built(frame=bytes(Ether(src=MAC_A, dst=MAC_B) / ip / TCP(sport=4791, dport=dport) / Raw(bytes(payload))),
                 kind="other")


def udp(dport: int = 4792, sport: int = 4791, payload: int = 40, ipv6: bool = False, vlans=()) -> Built:
    ip = IPv6(src="fd00::1", dst="fd00::2") if ipv6 else IP(src="10.0.0.1", dst="10.0.0.2")
    return Built(frame=bytes(_l2(vlans) / ip / UDP(sport=sport, dport=dport) / Raw(bytes(payload))), kind="other")


def icmp() -> Built:
    return Built(frame=bytes(Ether(src=MAC_A, dst=MAC_B) / IP(src="10.0.0.1", dst="10.0.0.2") / ICMP()),
                 kind="other")


def ethertype(et: int, payload: int = 46) -> Built:
    return Built(frame=bytes(Ether(src=MAC_A, dst=MAC_B, type=et) / Raw(bytes(payload))), kind="other")


def ipv4_fragment(offset_units: int = 0, more: bool = True, dport: int = ROCE_PORT) -> Built:
    """An IPv4 fragment of a RoCE packet (first fragment: offset 0 with MF)."""
    inner = UDP(sport=0xC001, dport=dport) / BTH(opcode=0x0A, dqpn=0x11) / RETH(dma_len=64) / Raw(bytes(64))
    ip = IP(src="10.0.0.1", dst="10.0.0.2", tos=2, flags="MF" if more else 0, frag=offset_units, proto=17)
    return Built(frame=bytes(Ether(src=MAC_A, dst=MAC_B) / ip / Raw(bytes(inner))), kind="other")


def ipv6_fragment() -> Built:
    inner = UDP(sport=0xC001, dport=ROCE_PORT) / BTH(opcode=0x0A, dqpn=0x11) / RETH(dma_len=64) / Raw(bytes(64))
    pkt = Ether(src=MAC_A, dst=MAC_B) / IPv6(src="fd00::1", dst="fd00::2", nh=44) / \
        IPv6ExtHdrFragment(nh=17, m=1, offset=0, id=7) / Raw(bytes(inner))
    return Built(frame=bytes(pkt), kind="other")


def ipv6_hbh_roce() -> Built:
    """RoCEv2 over IPv6 behind a hop-by-hop extension header (parsed as fixed header only)."""
    pkt = Ether(src=MAC_A, dst=MAC_B) / IPv6(src="fd00::1", dst="fd00::2") / IPv6ExtHdrHopByHop() / \
        UDP(sport=0xC001, dport=ROCE_PORT) / BTH(opcode=0x04, dqpn=0x11) / Raw(bytes(8))
    return Built(frame=bytes(pkt), kind="other")


def pfc(class_enable: int, times: list[int], vlans=()) -> Built:
    """802.1Qbb PFC frame: opcode 0x0101, class-enable vector, 8 pause times (quanta)."""
    assert len(times) == 8
    m = MacCtl(opcode=0x0101, class_enable=class_enable, **{f"t{i}": t for i, t in enumerate(times)})
    pkt = _l2(vlans, 0x8808, dst=PFC_DMAC) / m / Raw(bytes(26))  # padded to the 60-byte minimum
    b = Built(frame=bytes(pkt), kind="pfc")
    b.extra = {"class_enable": class_enable, "times": list(times)}
    return b


def pause(quanta: int = 0xFFFF) -> Built:
    """802.3x global PAUSE: opcode 0x0001 then one 16-bit pause time."""
    pkt = Ether(src=MAC_A, dst=PFC_DMAC, type=0x8808) / Raw(struct.pack(">HH", 1, quanta) + bytes(42))
    return Built(frame=bytes(pkt), kind="pause")


def macctl_other(opcode: int = 0x0002) -> Built:
    pkt = Ether(src=MAC_A, dst=PFC_DMAC, type=0x8808) / Raw(struct.pack(">H", opcode) + bytes(44))
    return Built(frame=bytes(pkt), kind="other")


def header_boundaries(b: Built) -> list[tuple[int, str]]:
    """For a RoCE frame built by roce(): (offset, name) of where each header starts and the
    end of the last one, computed from the layers scapy built (not from skewscope)."""
    frame = b.frame
    bounds = [(0, "eth")]
    off = 14
    et = struct.unpack_from(">H", frame, 12)[0]
    while et in (0x8100, 0x88A8):
        bounds.append((off, "vlan"))
        et = struct.unpack_from(">H", frame, off + 2)[0]
        off += 4
    if et == 0x0800:
        bounds.append((off, "ip"))
        off += (frame[off] & 0xF) * 4
        bounds.append((off, "udp"))
        off += 8
    elif et == 0x86DD:
        bounds.append((off, "ip"))
        off += 40
        bounds.append((off, "udp"))
        off += 8
    elif et == 0x8915:
        bounds.append((off, "grh"))
        off += 40
    bounds.append((off, "bth"))
    off += 12
    if ext_len(b.opcode):
        bounds.append((off, "ext"))
        off += ext_len(b.opcode)
    bounds.append((off, "end"))
    return bounds


# ---- encapsulations (one level: remote mirrors and overlays) ---------------------------------
from scapy.contrib.erspan import ERSPAN_II, ERSPAN_III, ERSPAN_PlatformSpecific  # noqa: E402
from scapy.layers.l2 import GRE  # noqa: E402
from scapy.layers.vxlan import VXLAN  # noqa: E402

ENCAP_KINDS = ("erspan1", "erspan2", "erspan3", "erspan3_o", "gre_teb", "gre_ip", "vxlan")
OUTER_MAC_A = "02:00:00:00:01:0a"
OUTER_MAC_B = "02:00:00:00:01:0b"


def encap(inner: Built, how: str, *, outer_v6: bool = False, outer_vlans=(), gre_csum: bool = False,
          gre_key: int | None = None, gre_seq: int | None = None, outer_ip_len_delta: int = 0) -> Built:
    """`inner` (a Built Ethernet frame) wrapped in one encapsulation, as a remote mirror or an
    overlay sends it: ERSPAN type I (GRE 0x88BE, no sequence number, no header), II (0x88BE
    with sequence, 8-byte header), III (0x22EB, 12-byte header; "erspan3_o" with the O bit
    and the 8-byte platform-specific subheader), GRE transparent Ethernet bridging (0x6558),
    GRE carrying the inner IP packet directly (the inner Ethernet header is dropped: inner
    must be untagged IPv4/IPv6), or VXLAN (UDP 4789). Outer IPv4 or IPv6, outer VLAN tags.

    The result keeps the inner facts (key, payload, ...); `wire_len` is the defined `bytes`
    of an encapsulated packet: the inner Ethernet frame's length (for GRE carrying IP, the
    inner IP packet + 14). extra["bounds"]: (offset, header) of every header, outer and
    inner, for truncation tests; extra["inner_off"]: where the inner frame starts."""
    assert how in ENCAP_KINDS, how
    payload = inner.frame
    if how == "gre_ip":
        et = struct.unpack_from(">H", payload, 12)[0]
        assert et in (0x0800, 0x86DD), "GRE carrying IP: the inner frame must be untagged IP"
        payload = payload[14:]
    if how == "vxlan":
        l4 = UDP(sport=0xD00D, dport=4789) / VXLAN(flags=0x08, vni=0x4242) / Raw(payload)
        enc = [("udp", 8), ("vxlan", 8)]
    else:
        kw = dict(chksum_present=int(gre_csum), key_present=int(gre_key is not None),
                  seqnum_present=int(gre_seq is not None))
        if gre_key is not None:
            kw["key"] = gre_key
        if gre_seq is not None:
            kw["sequence_number"] = gre_seq
        if how == "erspan1":
            kw["seqnum_present"] = 0
            kw.pop("sequence_number", None)
            l4, sub = GRE(proto=0x88BE, **kw), []
        elif how == "erspan2":
            kw["seqnum_present"] = 1
            kw.setdefault("sequence_number", 11)
            l4, sub = GRE(proto=0x88BE, **kw) / ERSPAN_II(session_id=5, index=3), [("erspan", 8)]
        elif how == "erspan3":
            l4, sub = GRE(proto=0x22EB, **kw) / ERSPAN_III(session_id=6, o=0), [("erspan", 12)]
        elif how == "erspan3_o":
            l4 = GRE(proto=0x22EB, **kw) / ERSPAN_III(session_id=6, o=1) / ERSPAN_PlatformSpecific(platf_id=3)
            sub = [("erspan", 20)]
        elif how == "gre_teb":
            l4, sub = GRE(proto=0x6558, **kw), []
        else:
            l4, sub = GRE(proto=struct.unpack_from(">H", inner.frame, 12)[0], **kw), []
        l4 = l4 / Raw(payload)
        glen = 4 + 4 * (gre_csum + (gre_key is not None) + (kw["seqnum_present"] == 1))
        enc = [("gre", glen)] + sub
    if outer_v6:
        ip = IPv6(src="2001:db8:ff::1", dst="2001:db8:ff::2", nh=17 if how == "vxlan" else 47)
    else:
        ip = IP(src="192.0.2.1", dst="192.0.2.2", proto=17 if how == "vxlan" else 47, ttl=64)
    pkt = _l2(outer_vlans, src=OUTER_MAC_A, dst=OUTER_MAC_B) / ip / l4
    frame = bytes(pkt)
    ip_len = 40 if outer_v6 else 20
    off = 14 + 4 * len(outer_vlans)
    bounds = [(0, "eth")] + [(14 + 4 * i, "vlan") for i in range(len(outer_vlans))] + [(off, "ip")]
    off += ip_len
    for name, n in enc:
        bounds.append((off, name))
        off += n
    inner_off = off
    assert len(frame) == inner_off + len(payload), (how, len(frame), inner_off, len(payload))
    ib = header_boundaries(inner) if inner.kind == "roce" else [(0, "eth"), (len(inner.frame), "end")]
    if how == "gre_ip":
        ib = [(o - 14, n) for o, n in ib if n != "eth"]
    bounds += [(inner_off + o, n) for o, n in ib]
    if outer_ip_len_delta:
        raw = bytearray(frame)
        l3 = 14 + 4 * len(outer_vlans)
        if outer_v6:
            struct.pack_into(">H", raw, l3 + 4, struct.unpack_from(">H", raw, l3 + 4)[0] + outer_ip_len_delta)
        else:
            struct.pack_into(">H", raw, l3 + 2, struct.unpack_from(">H", raw, l3 + 2)[0] + outer_ip_len_delta)
            struct.pack_into(">H", raw, l3 + 10, 0)
            struct.pack_into(">H", raw, l3 + 10, _csum(bytes(raw[l3:l3 + 20])))
        frame = bytes(raw)
    b = Built(frame=frame, kind=inner.kind, payload=inner.payload, opcode=inner.opcode, qp=inner.qp, psn=inner.psn,
              src=inner.src, dst=inner.dst, ipver=inner.ipver, roce_ver=inner.roce_ver, dma_len=inner.dma_len,
              syndrome=inner.syndrome, sport=inner.sport, tclass=inner.tclass, pad=inner.pad, fecn=inner.fecn,
              becn=inner.becn, extra={**inner.extra, "bounds": bounds, "inner_off": inner_off, "encap": how})
    b.wire_len = len(inner.frame)
    return b
