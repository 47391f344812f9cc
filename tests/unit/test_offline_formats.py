"""Offline parser: capture containers and link types (issue 4), no root.

Frames are built with scapy (an independent implementation of the headers) and written
here, byte by byte, into every container the parser reads: classic pcap (µs and ns magic,
little- and big-endian), pcapng (EPB / SPB / obsolete PB, both byte orders, several
sections and interfaces with their own link type and if_tsresol), gzip of each; Linux
cooked v1/v2 and raw IP records. Expectations come from how the frames were built (the
README "Counters" definitions), not from the parser: every container must give exactly
the counters the plain Ethernet pcap gives, and those match the construction.

The writers at the top are imported by the other test_offline_* files.
"""
from __future__ import annotations

import gzip
import struct
from dataclasses import dataclass

import numpy as np
import pytest

from skewscope.core import layout as L
from skewscope.core.snapshot import ip_bytes
from skewscope.sources import offline
from skewscope.sources.offline import run as offline_run
from skewscope.sources.offline import streams

scapy_all = pytest.importorskip("scapy.all")
from scapy.contrib.roce import BTH, GRH, CNPPadding  # noqa: E402
from scapy.layers.inet import IP, UDP  # noqa: E402
from scapy.layers.inet6 import IPv6  # noqa: E402
from scapy.layers.l2 import ARP, Dot1Q, Ether  # noqa: E402
from scapy.packet import Raw  # noqa: E402

# ---- frame construction (scapy) -------------------------------------------------------
# opcode -> (class, carries RETH, AETH, ImmDt, DETH) per the IBA tables in wire.md
OPS = {
    0x00: ("send", 0, 0, 0, 0), 0x01: ("send", 0, 0, 0, 0), 0x02: ("send", 0, 0, 0, 0),
    0x03: ("send", 0, 0, 1, 0), 0x04: ("send", 0, 0, 0, 0), 0x05: ("send", 0, 0, 1, 0),
    0x06: ("write", 1, 0, 0, 0), 0x07: ("write", 0, 0, 0, 0), 0x08: ("write", 0, 0, 0, 0),
    0x09: ("write", 0, 0, 1, 0), 0x0A: ("write", 1, 0, 0, 0), 0x0B: ("write", 1, 0, 1, 0),
    0x0C: ("read_request", 1, 0, 0, 0), 0x0D: ("read_response", 0, 1, 0, 0),
    0x0E: ("read_response", 0, 0, 0, 0), 0x0F: ("read_response", 0, 1, 0, 0),
    0x10: ("read_response", 0, 1, 0, 0), 0x11: ("ack", 0, 1, 0, 0),
    0x64: ("send", 0, 0, 0, 1), 0x81: ("cnp", 0, 0, 0, 0),
}


@dataclass
class Pkt:
    """A built frame and what it should count as (from its construction)."""
    frame: bytes
    ts: int                 # ns
    key: tuple | None       # (src, dst, dest_qp, roce) of an accounted RoCE packet
    payload: int = 0
    opcode: int = -1
    psn: int = 0
    reth: int = -1
    category: int = L.G_ACCOUNTED
    l3: str = "ipv4"        # ipv4 / ipv6 / rocev1 / other


def roce(opcode, dqpn, psn=0, payload=b"", reth=None, syndrome=None, src="10.0.0.1", dst="10.0.0.2",
         sport=0xC000, tos=0x02, vlan=None, qinq=None, ipv6=False, pad=0, becn=0, fecn=0, ts=0) -> Pkt:
    cls, has_reth, has_aeth, has_imm, has_deth = OPS[opcode]
    if has_reth and reth is None:
        reth = len(payload)
    ext = b""
    if has_deth:
        ext += struct.pack(">II", 0x80010000, 0x000001)
    if has_reth:
        ext += struct.pack(">QII", 0x7F0000001000, 0x1234, reth)
    if has_aeth:
        ext += struct.pack(">I", ((syndrome or 0) << 24) | 7)
    if has_imm:
        ext += struct.pack(">I", len(payload))
    l2 = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
    if qinq is not None:
        l2 = l2 / Dot1Q(vlan=qinq, type=0x8100)
        l2.type = 0x88A8
    if vlan is not None:
        l2 = l2 / Dot1Q(vlan=vlan, prio=3)
    l3 = IPv6(src=src, dst=dst, tc=tos, fl=0) if ipv6 else IP(src=src, dst=dst, tos=tos, flags="DF")
    bth = BTH(opcode=opcode, dqpn=dqpn, psn=psn, padcount=pad, becn=becn, fecn=fecn, pkey=0xFFFF)
    if opcode == 0x81:
        body = bth / CNPPadding()
    else:
        body = bth / Raw(ext + payload + b"\0" * pad)
    f = bytes(l2 / l3 / UDP(sport=sport, dport=4791) / body)
    return Pkt(f, ts, (src, dst, dqpn, 2), len(payload), opcode, psn, reth if has_reth else -1,
               l3="ipv6" if ipv6 else "ipv4")


def rocev1(opcode, dqpn, psn=0, payload=b"", reth=None, ts=0, sgid="fe80::1", dgid="fe80::2") -> Pkt:
    cls, has_reth, has_aeth, has_imm, _ = OPS[opcode]
    if has_reth and reth is None:
        reth = len(payload)
    ext = b""
    if has_reth:
        ext += struct.pack(">QII", 0x1000, 0x55, reth)
    if has_aeth:
        ext += struct.pack(">I", 0)
    if has_imm:
        ext += struct.pack(">I", 0)
    bth = bytes(BTH(opcode=opcode, dqpn=dqpn, psn=psn, icrc=0) / Raw(ext + payload))
    grh = GRH(tclass=0x68, paylen=len(bth), nexthdr=0x1B, hoplmt=1,
              sgid=int.from_bytes(ip_bytes(sgid)[0], "big"), dgid=int.from_bytes(ip_bytes(dgid)[0], "big"))
    f = bytes(Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02", type=0x8915) / grh) + bth
    return Pkt(f, ts, (sgid, dgid, dqpn, 1), len(payload), opcode, psn, reth if has_reth else -1, l3="rocev1")


def other(ts=0) -> Pkt:
    """Non-RoCE traffic: UDP to another port, ARP."""
    return Pkt(bytes(Ether() / IP(src="10.0.0.9", dst="10.0.0.8") / UDP(sport=4791, dport=9000) / Raw(b"x" * 40)),
               ts, None, category=L.G_NON_ROCE, l3="ipv4")


def arp(ts=0) -> Pkt:
    return Pkt(bytes(Ether(dst="ff:ff:ff:ff:ff:ff") / ARP(pdst="10.0.0.2")), ts, None, category=L.G_NON_ROCE,
               l3="other")


def pfc(prio_mask, times, ts=0) -> Pkt:
    body = struct.pack(">HH8H", 0x0101, prio_mask, *times)
    f = bytes.fromhex("0180c2000001" "020000000004" "8808") + body + b"\0" * 26
    return Pkt(f, ts, None, category=L.G_PFC, l3="other")


def reference_packets(t0: int = 1_700_000_000_123_456_000) -> list[Pkt]:
    """A mixed stream: RC WRITE message (FIRST/MIDDLE/LAST_IMM), WRITE_ONLY_IMM, SEND
    FIRST/LAST, READ request + responses, ACK/NAK/RNR, a CNP, CE marks, IPv6, VLAN, QinQ,
    RoCEv1, UD, a PSN gap and a retransmission, PFC, non-RoCE. Timestamps 1 µs apart."""
    p = []
    a, b = "10.0.0.1", "10.0.0.2"
    p.append(roce(0x06, 0x11, 100, b"\1" * 1024, reth=3000, src=a, dst=b))
    p.append(roce(0x07, 0x11, 101, b"\2" * 1024, src=a, dst=b, tos=0x03))          # CE
    p.append(roce(0x09, 0x11, 102, b"\3" * 952, src=a, dst=b))
    p.append(roce(0x11, 0x22, 102, syndrome=0x1F, src=b, dst=a))                     # ACK
    p.append(roce(0x0B, 0x11, 103, b"\4" * 64, reth=64, src=a, dst=b))
    p.append(roce(0x0B, 0x11, 106, b"\4" * 64, reth=64, src=a, dst=b))               # gap of 2
    p.append(roce(0x11, 0x22, 104, syndrome=0x60, src=b, dst=a))                     # NAK seq
    p.append(roce(0x0B, 0x11, 104, b"\4" * 64, reth=64, src=a, dst=b))               # retransmission
    p.append(roce(0x11, 0x22, 107, syndrome=0x25, src=b, dst=a))                     # RNR NAK
    p.append(roce(0x81, 0x11, 0, src=b, dst=a, becn=1, tos=0xC2))                     # CNP to QP 0x11
    p.append(roce(0x00, 0x33, 5, b"s" * 4096, src=a, dst="10.0.0.3", pad=0))
    p.append(roce(0x02, 0x33, 6, b"t" * 13, src=a, dst="10.0.0.3", pad=3))            # pad count 3
    p.append(roce(0x0C, 0x44, 50, reth=65536, src="10.0.0.3", dst=a))                # READ request
    p.append(roce(0x0D, 0x55, 50, b"r" * 4096, syndrome=0, src=a, dst="10.0.0.3"))
    p.append(roce(0x0F, 0x55, 51, b"r" * 4096, syndrome=0, src=a, dst="10.0.0.3"))
    p.append(roce(0x0A, 0x66, 9, b"v" * 512, reth=512, src="fd00::1", dst="fd00::2", ipv6=True, tos=0x6A))
    p.append(roce(0x0A, 0x77, 1, b"w" * 128, reth=128, vlan=100))
    p.append(roce(0x0A, 0x77, 2, b"w" * 128, reth=128, vlan=100, qinq=7))
    p.append(roce(0x64, 0x01, 0, b"u" * 256, src="10.0.0.4", dst="10.0.0.5"))        # UD SEND_ONLY to QP1
    p.append(rocev1(0x0A, 0x88, 3, b"1" * 100, reth=100))
    p.append(rocev1(0x11, 0x99, 3))
    p.append(roce(0x0A, 0x11, 107, b"", reth=0, src=a, dst=b, fecn=1))               # zero-length write
    p.append(pfc(0b00001000, [0, 0, 0, 0xFFFF, 0, 0, 0, 0]))
    p.append(pfc(0b00001001, [7, 0, 0, 0, 0, 0, 0, 0]))
    p.append(other())
    p.append(arp())
    for i, x in enumerate(p):
        x.ts = t0 + i * 1000
    return p


# ---- containers ------------------------------------------------------------------------
def pcap_bytes(records, big=False, ns=True, linktype=1, snaplen=65535) -> bytes:
    """records: [(ts_ns, data, orig_len)]"""
    e = ">" if big else "<"
    out = [struct.pack(e + "IHHiIII", 0xA1B23C4D if ns else 0xA1B2C3D4, 2, 4, 0, 0, snaplen, linktype)]
    for ts, data, orig in records:
        sec, rem = divmod(ts, 1_000_000_000)
        frac = rem if ns else rem // 1000
        out.append(struct.pack(e + "IIII", sec, frac, len(data), orig) + data)
    return b"".join(out)


def _pad4(b: bytes) -> bytes:
    return b + b"\0" * (-len(b) % 4)


def ng_block(btype: int, body: bytes, e: str = "<") -> bytes:
    body = _pad4(body)
    n = 12 + len(body)
    return struct.pack(e + "II", btype, n) + body + struct.pack(e + "I", n)


def ng_shb(e="<") -> bytes:
    return ng_block(0x0A0D0D0A, struct.pack(e + "IHHq", 0x1A2B3C4D, 1, 0, -1), e)


def ng_idb(linktype, tsresol=None, snaplen=0, e="<") -> bytes:
    opts = b""
    if tsresol is not None:
        opts += struct.pack(e + "HH", 9, 1) + bytes([tsresol]) + b"\0\0\0"
    opts += struct.pack(e + "HH", 0, 0)
    return ng_block(1, struct.pack(e + "HHI", linktype, 0, snaplen) + opts, e)


def ticks_for(ts_ns: int, tsresol: int) -> int:
    if tsresol & 0x80:
        return (ts_ns << (tsresol & 0x7F)) // 1_000_000_000 + 1  # a tick just after ts
    return ts_ns // 10 ** (9 - tsresol) if tsresol <= 9 else ts_ns * 10 ** (tsresol - 9)


def ns_of_ticks(ticks: int, tsresol: int) -> int:
    if tsresol & 0x80:
        return (ticks * 1_000_000_000) >> (tsresol & 0x7F)
    return ticks * 10 ** (9 - tsresol) if tsresol <= 9 else ticks // 10 ** (tsresol - 9)


def ng_epb(iface, ticks, data, orig, e="<") -> bytes:
    return ng_block(6, struct.pack(e + "IIIII", iface, ticks >> 32, ticks & 0xFFFFFFFF, len(data), orig) + data, e)


def ng_pb(iface, ticks, data, orig, e="<") -> bytes:
    return ng_block(2, struct.pack(e + "HHIIII", iface, 0, ticks >> 32, ticks & 0xFFFFFFFF, len(data), orig) + data, e)


def ng_spb(data, orig, e="<") -> bytes:
    return ng_block(3, struct.pack(e + "I", orig) + data, e)


def to_sll(frame: bytes) -> bytes:
    """Ethernet frame -> Linux cooked v1 record (packet type 0 host, ARPHRD_ETHER)."""
    return struct.pack(">HHH8sH", 0, 1, 6, frame[6:12] + b"\0\0", struct.unpack(">H", frame[12:14])[0]) + frame[14:]


def to_sll2(frame: bytes) -> bytes:
    return struct.pack(">HHIHBB8s", struct.unpack(">H", frame[12:14])[0], 0, 3, 1, 0, 6, frame[6:12] + b"\0\0") \
        + frame[14:]


def to_raw(frame: bytes) -> bytes:
    return frame[14:]


def write(path, data: bytes, gz=False):
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def same_snapshot(a, b, meta_keys=("frames", "first_ts", "last_ts", "flows_created", "flows_evicted")):
    """Field-by-field equality of two Snapshots (flows, events, globals, some meta)."""
    assert a.flows.dtype == b.flows.dtype
    assert len(a.flows) == len(b.flows), (len(a.flows), len(b.flows))
    for n in a.flows.dtype.names:
        assert np.array_equal(a.flows[n], b.flows[n]), f"flows.{n} differs"
    assert len(a.events) == len(b.events), (len(a.events), len(b.events))
    for n in a.events.dtype.names:
        assert np.array_equal(a.events[n], b.events[n]), f"events.{n} differs"
    diff = np.nonzero(a.globals != b.globals)[0]
    assert not len(diff), {L.CATEGORY_NAMES[i] if i < L.G_NCAT else i: (int(a.globals[i]), int(b.globals[i]))
                           for i in diff}
    for k in meta_keys:
        assert a.meta[k] == b.meta[k], (k, a.meta[k], b.meta[k])


def flow_row(snap, src, dst, qp, roce=2):
    sb, v = ip_bytes(src)
    db, _ = ip_bytes(dst)
    f = snap.flows
    m = (f["dest_qp"] == qp) & (f["roce"] == roce) & np.all(f["src"] == np.frombuffer(sb, np.uint8), axis=1) \
        & np.all(f["dst"] == np.frombuffer(db, np.uint8), axis=1)
    idx = np.nonzero(m)[0]
    assert len(idx) == 1, (src, dst, qp, len(idx))
    return f[idx[0]]


# ---- tests -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ref():
    return reference_packets()


@pytest.fixture(scope="module")
def ref_snap(ref, tmp_path_factory):
    p = tmp_path_factory.mktemp("fmt") / "ref.pcap"
    write(p, pcap_bytes([(x.ts, x.frame, len(x.frame)) for x in ref]))
    return offline.parse_file(p)


def test_reference_counts_match_construction(ref, ref_snap):
    snap = ref_snap
    g = snap.globals
    n_acc = sum(1 for x in ref if x.key)
    assert int(g[L.G_FRAMES]) == len(ref) == snap.meta["frames"]
    assert int(g[L.G_ACCOUNTED]) == n_acc
    assert int(g[L.G_NON_ROCE]) == 2 and int(g[L.G_PFC]) == 2
    assert int(g[:L.G_NCAT].sum()) == len(ref)
    # PFC per priority: prio 3 paused with 0xFFFF quanta; prio 0 paused 7 quanta, prio 3 resumed
    assert int(g[L.G_PFC_PAUSE + 3]) == 1 and int(g[L.G_PFC_QUANTA + 3]) == 0xFFFF
    assert int(g[L.G_PFC_XON + 3]) == 1
    assert int(g[L.G_PFC_PAUSE + 0]) == 1 and int(g[L.G_PFC_QUANTA + 0]) == 7
    # per flow: packets, wire bytes, payload from construction
    by_key = {}
    for x in ref:
        if x.key:
            d = by_key.setdefault(x.key, {"packets": 0, "bytes": 0, "payload": 0, "first": x.ts, "last": x.ts})
            d["packets"] += 1
            d["bytes"] += len(x.frame)
            d["payload"] += x.payload
            d["last"] = x.ts
    assert len(snap.flows) == len(by_key)
    for (s, d, qp, rv), exp in by_key.items():
        r = flow_row(snap, s, d, qp, rv)
        assert int(r["packets"]) == exp["packets"], (s, d, qp)
        assert int(r["bytes"]) == exp["bytes"], (s, d, qp)
        assert int(r["payload_bytes"]) == exp["payload"], (s, d, qp)
        assert int(r["first_ts"]) == exp["first"] and int(r["last_ts"]) == exp["last"]
    # the data flow 10.0.0.1 -> .2 QP 0x11: write message 3000 B, 3 single-packet writes
    # (one retransmitted), a 0-byte write; PSN gap 103 -> 106 (2 skipped), one retransmission;
    # CE on 1 packet; FECN 1; CNP counted on the sender's QP, from .2 to .1
    w = flow_row(snap, "10.0.0.1", "10.0.0.2", 0x11)
    assert int(w["messages"]) == 5 and int(w["msg_bytes"]) == 3000 + 3 * 64
    assert int(w["psn_gaps"]) == 1 and int(w["psn_skipped"]) == 2 and int(w["retransmissions"]) == 1
    assert int(w["ce"]) == 1 and int(w["ecn_capable"]) == 7 and int(w["fecn"]) == 1
    assert int(w["op"][L.OPC_WRITE]) == 7
    assert int(w["msg_hist"][0]) == 1 and int(w["msg_hist"][12]) == 1 and int(w["msg_hist"][7]) == 3
    cnp = flow_row(snap, "10.0.0.2", "10.0.0.1", 0x11)
    assert int(cnp["cnp"]) == 1 and int(cnp["becn"]) == 1 and int(cnp["op"][L.OPC_CNP]) == 1
    ack = flow_row(snap, "10.0.0.2", "10.0.0.1", 0x22)
    assert (int(ack["acks"]), int(ack["nak_seq"]), int(ack["nak_rnr"]), int(ack["nak_other"])) == (1, 1, 1, 0)
    # SEND: payload summed FIRST..LAST (4096 + 13, pad count 3 not payload)
    s = flow_row(snap, "10.0.0.1", "10.0.0.3", 0x33)
    assert int(s["msg_bytes"]) == 4109 and int(s["payload_bytes"]) == 4109 and int(s["messages"]) == 1
    # READ request: RETH 65536, responses on the reverse flow; IPv6 flow; VLAN + QinQ same flow
    assert int(flow_row(snap, "10.0.0.3", "10.0.0.1", 0x44)["msg_bytes"]) == 65536
    assert int(flow_row(snap, "10.0.0.1", "10.0.0.3", 0x55)["op"][L.OPC_READ_RESP]) == 2
    v6 = flow_row(snap, "fd00::1", "fd00::2", 0x66)
    assert int(v6["ipver"]) == 6 and int(v6["tclass"]) == 0x6A and int(v6["msg_bytes"]) == 512
    assert int(flow_row(snap, "10.0.0.1", "10.0.0.2", 0x77)["packets"]) == 2
    r1 = flow_row(snap, "fe80::1", "fe80::2", 0x88, roce=1)
    assert int(r1["payload_bytes"]) == 100 and int(r1["sport"]) == 0 and int(r1["ecn_capable"]) == 0
    # message records: WRITE 3000 (FIRST..LAST_IMM: start = first packet, end = last), ...
    ev = snap.events
    assert np.all(np.diff(ev["start_ts"].astype(np.int64)) >= 0)
    wrow = int(np.nonzero((snap.flows["dest_qp"] == 0x11) & (snap.flows["roce"] == 2)
                          & (snap.flows["packets"] > 5))[0][0])
    big = ev[(ev["flow"] == wrow) & (ev["bytes"] == 3000)]
    assert len(big) == 1 and int(big["start_ts"][0]) == ref[0].ts and int(big["end_ts"][0]) == ref[2].ts
    assert int(((ev["opclass"] == L.OPC_READ_REQ) & (ev["bytes"] == 65536)).sum()) == 1
    assert snap.meta["source"] == "offline" and snap.meta["first_ts"] == ref[0].ts
    assert snap.meta["last_ts"] == ref[-1].ts and snap.meta["warnings"] == []


@pytest.mark.parametrize("big", [False, True], ids=["le", "be"])
@pytest.mark.parametrize("ns", [False, True], ids=["usec", "nsec"])
@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_pcap_variants(ref, ref_snap, tmp_path, big, ns, gz):
    p = write(tmp_path / "v.pcap", pcap_bytes([(x.ts, x.frame, len(x.frame)) for x in ref], big=big, ns=ns), gz)
    snap = offline.parse_file(p)
    if ns:
        same_snapshot(snap, ref_snap)
    else:
        # µs resolution: timestamps truncated to µs (the reference has whole µs steps + 456 µs)
        same_snapshot(snap, ref_snap, meta_keys=("frames",))
        assert snap.meta["first_ts"] == ref[0].ts // 1000 * 1000
    assert snap.meta["format"] == "pcap" and snap.meta["compressed"] == ("gzip" if gz else None)


@pytest.mark.parametrize("e", ["<", ">"], ids=["le", "be"])
@pytest.mark.parametrize("block", ["epb", "pb"])
def test_pcapng_blocks(ref, ref_snap, tmp_path, e, block):
    mk = ng_epb if block == "epb" else ng_pb
    body = ng_shb(e) + ng_idb(1, 9, e=e)
    body += b"".join(mk(0, x.ts, x.frame, len(x.frame), e) for x in ref)
    snap = offline.parse_file(write(tmp_path / "v.pcapng", body))
    same_snapshot(snap, ref_snap)
    assert snap.meta["format"] == "pcapng" and snap.meta["warnings"] == []


def test_pcapng_interfaces_link_types_and_resolutions(ref, ref_snap, tmp_path):
    """Three interfaces (Ethernet µs default, Linux cooked v2 at ns, Ethernet at 2^-32 s),
    packets spread over them; a second section (big-endian) with its own interfaces
    (Ethernet 10^-7, raw IP); NRB/ISB/custom blocks in between. Timestamps in ns as each
    interface's resolution gives them; counters as the reference."""
    blocks = [ng_shb(), ng_idb(1), ng_idb(276, 9), ng_idb(1, 0x80 | 32),
              ng_block(4, struct.pack("<HH", 0, 0)),                    # NRB (empty)
              ng_block(0x40000BAD, b"\0\0\0\0vendor")]                 # custom block
    expect_ts = []
    half = len(ref) // 2
    for i, x in enumerate(ref[:half]):
        iface = i % 3
        if iface == 1 and x.l3 == "other":
            iface = 0
        res = (6, 9, 0x80 | 32)[iface]
        ticks = ticks_for(x.ts, res)
        data = to_sll2(x.frame) if iface == 1 else x.frame
        blocks.append(ng_epb(iface, ticks, data, len(data)))
        expect_ts.append(ns_of_ticks(ticks, res))
    blocks.append(ng_block(5, struct.pack("<III", 0, 0, 0)))             # ISB
    blocks += [ng_shb(">"), ng_idb(1, 7, e=">"), ng_idb(101, e=">")]
    for i, x in enumerate(ref[half:]):
        iface = 1 if (i % 2 and x.l3 in ("ipv4", "ipv6")) else 0
        res = (7, 6)[iface]
        ticks = ticks_for(x.ts, res)
        data = to_raw(x.frame) if iface == 1 else x.frame
        if iface == 1 and x.frame[12:14] != b"\x08\x00" and x.frame[12:14] != b"\x86\xdd":
            data, iface, res = x.frame, 0, 7
            ticks = ticks_for(x.ts, res)
        blocks.append(ng_epb(iface, ticks, data, len(data), ">"))
        expect_ts.append(ns_of_ticks(ticks, res))
    snap = offline.parse_file(write(tmp_path / "multi.pcapng", b"".join(blocks)))
    same_snapshot(snap, ref_snap, meta_keys=("frames",))
    assert snap.meta["linktypes"] == [1, 101, 276] and snap.meta["pcapng_sections"] == 2
    assert snap.meta["warnings"] == []
    pk = offline.dissect(tmp_path / "multi.pcapng")
    assert pk["ts"].tolist() == expect_ts


def test_every_if_tsresol_byte_gives_exact_ns(ref, tmp_path):
    """if_tsresol is one byte from the file: every value (10^-e and 2^-s for e, s = 0..127)
    gives the exact ns (Python integers: ns_of_ticks), wherever it fits in 63 bits. A damaged
    or hostile file may hold any of them: 10^-73 s once killed the reader with SIGFPE (10^64
    wraps to 0 in 64 bits and the compiled division had no zero check), found by
    test_fuzz_offline's random IDB options."""
    frame = ref[0].frame
    ticks = (0, 1, 999_999_999, 12345 << 20, (1 << 40) + 7, (1 << 62) + 3, (1 << 63) - 1)
    blocks, expect = [ng_shb()], []
    for res in range(256):
        blocks.append(ng_idb(1, res))
    for res in range(256):
        for t in ticks:
            if ns_of_ticks(t, res) < 1 << 63:
                blocks.append(ng_epb(res, t, frame, len(frame)))
                expect.append(ns_of_ticks(t, res))
    p = write(tmp_path / "tsresol.pcapng", b"".join(blocks))
    assert offline.dissect(p)["ts"].tolist() == expect
    snap = offline.parse_file(p)
    assert int(snap.globals[L.G_FRAMES]) == len(expect)
    assert snap.meta["warnings"] == []


def test_spb_uses_interface_snaplen(ref, tmp_path):
    """SPB: no timestamp, interface 0; captured length = min(original, IDB snaplen), the
    block's padding is not data."""
    x = ref[0]  # WRITE_FIRST with RETH: 1086-byte frame
    cut = 66    # the RETH ends at 70: cut at 66 -> truncated_ext, whatever the padding holds
    data = x.frame[:cut] + b"\xff\xff"     # 2 bytes of garbage padding (block padded to 4)
    body = ng_shb() + ng_idb(1, snaplen=cut) + ng_block(3, struct.pack("<I", len(x.frame)) + data)
    snap = offline.parse_file(write(tmp_path / "spb.pcapng", body))
    assert int(snap.globals[L.G_TRUNC_EXT]) == 1 and snap.meta["first_ts"] == 0
    body = ng_shb() + ng_idb(1) + ng_spb(x.frame, len(x.frame))
    snap = offline.parse_file(write(tmp_path / "spb2.pcapng", body))
    assert int(snap.globals[L.G_ACCOUNTED]) == 1 and int(snap.flows["bytes"][0]) == len(x.frame)


@pytest.mark.parametrize("conv,lt", [(to_sll, 113), (to_sll2, 276), (to_raw, 101), (to_raw, 12), (to_raw, 14)],
                         ids=["sll", "sll2", "raw101", "raw12", "raw14"])
def test_cooked_and_raw_link_types(ref, tmp_path, conv, lt):
    """Each record becomes an Ethernet frame with a synthesised 14-byte header: wire bytes
    are those of the Ethernet frame, so the counters are the Ethernet capture's."""
    # raw IP carries no L2: only untagged IP frames; cooked: anything but QinQ
    pkts = [x for x in ref if x.frame[12:14] in (b"\x08\x00", b"\x86\xdd")] if conv is to_raw else \
        [x for x in ref if x.frame[12:14] != b"\x88\xa8"]
    eth = offline.parse_file(write(tmp_path / "e.pcap", pcap_bytes([(x.ts, x.frame, len(x.frame)) for x in pkts])))
    recs = [(x.ts, conv(x.frame), len(conv(x.frame))) for x in pkts]
    snap = offline.parse_file(write(tmp_path / "c.pcap", pcap_bytes(recs, linktype=lt)))
    same_snapshot(snap, eth)
    assert snap.meta["linktypes"] == [lt]


def test_link_header_short_records_are_truncated_eth(tmp_path):
    """A cooked/raw record too short for its own link header is a frame cut before its
    Ethernet header: truncated_eth (counted, never dropped); read_frames (replay's reader)
    hands it on as an empty frame of that Ethernet length (Ethernet: its bytes as they are)."""
    for lt, data, wire in ((113, b"\0" * 15, 98), (276, b"\0" * 19, 94), (101, b"", 114), (1, b"\0" * 13, 100)):
        p = write(tmp_path / f"s{lt}.pcap", pcap_bytes([(1, data, 100)], linktype=lt))
        snap = offline.parse_file(p)
        assert int(snap.globals[L.G_FRAMES]) == 1 and int(snap.globals[L.G_TRUNC_ETH]) == 1, lt
        # the Ethernet-frame length of the link-type conversion (what replay hands the kernel)
        assert int(offline.dissect(p)["wire_len"][0]) == wire
        (batch,) = offline.read_frames(p)
        assert (len(batch), int(batch.orig_len[0]), int(batch.ts[0])) == (1, wire, 1)
        assert batch.frame(0).tobytes() == (data if lt == 1 else b"")


def test_chunk_boundaries_and_oversized_records(ref, ref_snap, tmp_path):
    """Records straddle chunk boundaries (smallest chunk) and one record is larger than the
    chunk (buffer grows): identical counters."""
    recs = [(x.ts, x.frame, len(x.frame)) for x in ref]
    jumbo = other(ref[-1].ts + 1)
    jf = jumbo.frame + b"z" * 200_000
    p = write(tmp_path / "c.pcap", pcap_bytes(recs + [(jumbo.ts, jf, len(jf))]))
    a = offline.parse_file(p, chunk_bytes=1 << 16)
    b = offline.parse_file(p)
    same_snapshot(a, b)
    assert int(a.globals[L.G_NON_ROCE]) == int(ref_snap.globals[L.G_NON_ROCE]) + 1
    # many small records over many chunks, pcapng too
    many = recs * 400
    many = [(i * 1000, f, o) for i, (_, f, o) in enumerate(many)]
    p1 = write(tmp_path / "m.pcap", pcap_bytes(many))
    p2 = write(tmp_path / "m.pcapng", ng_shb() + ng_idb(1, 9) + b"".join(ng_epb(0, t, f, o) for t, f, o in many))
    s1 = offline.parse_file(p1, chunk_bytes=1 << 16)
    same_snapshot(s1, offline.parse_file(p1))
    same_snapshot(offline.parse_file(p2, chunk_bytes=1 << 16), s1)
    assert int(s1.globals[L.G_FRAMES]) == len(many)


def test_dissect_matches_construction(ref, tmp_path):
    p = write(tmp_path / "d.pcap", pcap_bytes([(x.ts, x.frame, len(x.frame)) for x in ref]))
    pk = offline.dissect(p)
    assert len(pk) == len(ref)
    for x, r in zip(ref, pk):
        assert int(r["ts"]) == x.ts and int(r["wire_len"]) == len(x.frame)
        assert int(r["category"]) == x.category
        if x.key:
            assert int(r["opcode"]) == x.opcode and int(r["dest_qp"]) == x.key[2]
            assert int(r["psn"]) == x.psn and int(r["reth_len"]) == x.reth and int(r["payload"]) == x.payload
            assert bytes(r["src"]) == ip_bytes(x.key[0])[0] and bytes(r["dst"]) == ip_bytes(x.key[1])[0]
    assert len(offline.dissect(p, limit=5)) == 5


def test_gzip_multi_member_and_zero_padding(ref, ref_snap, tmp_path):
    """Concatenated gzip members (e.g. `cat a.gz b.gz`, bgzip) are one stream; zero padding
    after the last member (tape/block devices) is ignored, as gzip(1) does."""
    data = pcap_bytes([(x.ts, x.frame, len(x.frame)) for x in ref])
    cut = 24 + 5 * 1000 + 7
    z = gzip.compress(data[:cut]) + gzip.compress(data[cut:]) + b"\0" * 512
    snap = offline.parse_file(write(tmp_path / "m.pcap.gz", z))
    same_snapshot(snap, ref_snap)
    assert snap.meta["warnings"] == [] and snap.meta["bytes_read"] == len(data)


def test_read_paths_agree(ref, ref_snap, tmp_path, monkeypatch):
    """Plain files are scanned through mmap windows, gzip and pipes through a read buffer:
    both give the same Snapshot, also with records straddling every window/chunk edge."""
    import os
    import threading
    recs = [(x.ts, x.frame, len(x.frame)) for x in ref] * 300
    data = pcap_bytes(recs)
    p = write(tmp_path / "p.pcap", data)
    mapped = offline.parse_file(p, chunk_bytes=1 << 16)
    fifo = tmp_path / "fifo.pcap"
    os.mkfifo(fifo)
    t = threading.Thread(target=lambda: fifo.write_bytes(data))
    t.start()
    piped = offline.parse_file(fifo, chunk_bytes=1 << 16)
    t.join()
    same_snapshot(piped, mapped)

    class NoMap:
        def __init__(self, *a):
            raise OSError("mmap not possible here")
    monkeypatch.setattr(offline_run, "_MapBuffer", NoMap)     # the run opens its read buffer there
    same_snapshot(offline.parse_file(p, chunk_bytes=1 << 16), mapped)
    assert int(mapped.globals[L.G_FRAMES]) == len(recs)


def test_prefetched_windows_give_the_same_snapshot(ref, tmp_path, monkeypatch):
    """The mapped windows come from the helper thread (the next window mapped during the
    scan) or, for a record the prefetch does not cover (longer than its overlap), in place:
    at every window size, both kinds happen and the snapshot is the read buffer's."""
    import os
    import threading
    recs = [(x.ts, x.frame, len(x.frame)) for x in ref] * 300
    jumbo = other(ref[-1].ts + 1)
    jf = jumbo.frame + b"z" * 300_000      # longer than a 64 KiB and a 256 KiB window
    recs = recs[:len(recs) // 2] + [(jumbo.ts, jf, len(jf))] + recs[len(recs) // 2:]
    p = write(tmp_path / "w.pcap", pcap_bytes(recs))
    maps = {"helper": 0, "in place": 0}
    real_map, real_work = streams._MapBuffer._map, streams._MapBuffer._work

    def work(self, *a):
        maps["helper"] += 1
        return real_work(self, *a)

    def in_place(self, *a):
        if threading.current_thread() is threading.main_thread():
            maps["in place"] += 1
        return real_map(self, *a)
    monkeypatch.setattr(streams._MapBuffer, "_work", work)
    monkeypatch.setattr(streams._MapBuffer, "_map", in_place)
    fifo = tmp_path / "fifo.pcap"
    os.mkfifo(fifo)
    t = threading.Thread(target=lambda: fifo.write_bytes(p.read_bytes()))
    t.start()
    piped = offline.parse_file(fifo)
    t.join()
    for win in (1 << 16, 1 << 18, 1 << 20):
        maps.update({"helper": 0, "in place": 0})
        same_snapshot(offline.parse_file(p, chunk_bytes=win), piped)
        # in place: the first window, and the jumbo's when it does not fit the prefetched one
        assert maps["helper"] > 0 and maps["in place"] == (2 if win < len(jf) else 1), (win, maps)
    assert int(piped.globals[L.G_FRAMES]) == len(recs)


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_prefetch_depth_keeps_windows_in_order(ref, tmp_path, monkeypatch, depth):
    """The helper maps up to DEPTH windows ahead, in file order, each starting inside the one
    before it; the scanner takes them in that order (a record longer than the overlap maps its
    window in place and starts the chain again). Same snapshot at every depth and window size;
    never more than DEPTH + 2 windows mapped at once (the scanned one, those ahead, the one the
    helper is unmapping)."""
    import threading
    recs = [(x.ts, x.frame, len(x.frame)) for x in ref] * 300
    jumbo = other(ref[-1].ts + 1)
    jf = jumbo.frame + b"z" * 300_000
    recs = recs[:len(recs) // 3] + [(jumbo.ts, jf, len(jf))] + recs[len(recs) // 3:]
    p = write(tmp_path / "d.pcap", pcap_bytes(recs))
    monkeypatch.setattr(streams._MapBuffer, "DEPTH", 1)
    want = offline.parse_file(p, chunk_bytes=1 << 20)
    monkeypatch.setattr(streams._MapBuffer, "DEPTH", depth)
    live, peak, lock = [0], [0], threading.Lock()
    served = []
    real_map, real_close, real_work = streams._MapBuffer._map, streams._close_map, streams._MapBuffer._work

    def counted_map(self, offset, length):
        mm = real_map(self, offset, length)
        with lock:
            live[0] += 1
            peak[0] = max(peak[0], live[0])
        return mm

    def counted_close(mm):
        if not mm.closed:
            with lock:
                live[0] -= 1
        real_close(mm)

    def work(self, offset, length, old):
        served.append(offset)
        return real_work(self, offset, length, old)
    monkeypatch.setattr(streams._MapBuffer, "_map", counted_map)
    monkeypatch.setattr(streams, "_close_map", counted_close)
    monkeypatch.setattr(streams._MapBuffer, "_work", work)
    for win in (1 << 16, 1 << 18):
        served.clear()
        peak[0] = 0
        same_snapshot(offline.parse_file(p, chunk_bytes=win), want)
        assert served and peak[0] <= depth + 2, (win, peak[0])
        assert live[0] == 0   # every window unmapped at the end
        # the helper's windows go forward, except where a chain starts again after the jumbo
        assert sum(b <= a for a, b in zip(served, served[1:])) <= 1, served
