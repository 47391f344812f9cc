"""Offline parser: headers-only captures and truncation (issue 4), no root.

A record cut by a snap length is normal (`tcpdump -s 128` on a busy mirror): when the
headers the parser needs are present it is accounted in full from the original length
and the UDP length; when the cut falls inside a header it is counted in that header's
truncated_* category and never mis-parsed. The expected category of every cut offset comes
from the header layout (Ethernet 14, 802.1Q 4, IPv4 4*IHL, IPv6 40, UDP 8, GRH 40, BTH 12,
the opcode's extension headers; MAC control 2+2+16), i.e. from the protocol, not the code.
"""
from __future__ import annotations

import struct

import numpy as np
import pytest
from test_offline_formats import pcap_bytes, roce, rocev1, same_snapshot, write

from skewscope.core import layout as L
from skewscope.sources import offline

# (name, packet, [(end offset of header, category when cut before it)], ext end)
T = L


def _layout_ipv4(ext, vlan=0, ihl=5):
    o = 14
    marks = [(14, T.G_TRUNC_ETH)]
    for _ in range(vlan):
        marks.append((o + 4, T.G_TRUNC_VLAN))
        o += 4
    marks.append((o + 20, T.G_TRUNC_IP))
    if ihl > 5:
        marks.append((o + 4 * ihl, T.G_TRUNC_IP))   # options: UDP start beyond the cut
    o += 4 * ihl
    marks += [(o + 8, T.G_TRUNC_UDP), (o + 20, T.G_TRUNC_BTH), (o + 20 + ext, T.G_TRUNC_EXT)]
    return marks


def _layout_ipv6(ext):
    return [(14, T.G_TRUNC_ETH), (54, T.G_TRUNC_IP), (62, T.G_TRUNC_UDP), (74, T.G_TRUNC_BTH),
            (74 + ext, T.G_TRUNC_EXT)]


def _layout_v1(ext):
    return [(14, T.G_TRUNC_ETH), (54, T.G_TRUNC_GRH), (66, T.G_TRUNC_BTH), (66 + ext, T.G_TRUNC_EXT)]


def _with_ip_options(pkt):
    """Insert 4 bytes of IPv4 options (NOP x4): IHL 6, total length + 4."""
    f = bytearray(pkt.frame)
    ip = f[14:34]
    ip[0] = 0x46
    tot = struct.unpack(">H", ip[2:4])[0] + 4
    ip[2:4] = struct.pack(">H", tot)
    ip[10:12] = b"\0\0"
    s = sum(struct.unpack(">10H", bytes(ip[:20]))) + 0x0101 * 2
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    ip[10:12] = struct.pack(">H", ~s & 0xFFFF)
    pkt.frame = bytes(f[:14] + ip + b"\x01\x01\x01\x01" + f[34:])
    return pkt


CASES = [
    ("write_first_reth", lambda: roce(0x06, 0x11, 7, b"a" * 200, reth=4096), lambda: _layout_ipv4(16)),
    ("write_only_imm", lambda: roce(0x0B, 0x11, 7, b"a" * 64), lambda: _layout_ipv4(20)),
    ("ack_aeth", lambda: roce(0x11, 0x11, 7, syndrome=0x60), lambda: _layout_ipv4(4)),
    ("read_req_vlan", lambda: roce(0x0C, 0x11, 7, reth=1 << 20, vlan=5), lambda: _layout_ipv4(16, vlan=1)),
    ("send_qinq", lambda: roce(0x04, 0x11, 7, b"q" * 100, vlan=5, qinq=9), lambda: _layout_ipv4(0, vlan=2)),
    ("ipv4_options", lambda: _with_ip_options(roce(0x0A, 0x11, 7, b"o" * 80, reth=80)),
     lambda: _layout_ipv4(16, ihl=6)),
    ("ipv6_write_only", lambda: roce(0x0A, 0x11, 7, b"6" * 300, reth=300, src="fd00::1", dst="fd00::2", ipv6=True),
     lambda: _layout_ipv6(16)),
    ("rocev1_write_only", lambda: rocev1(0x0A, 0x11, 7, b"1" * 90, reth=90), lambda: _layout_v1(16)),
    ("cnp", lambda: roce(0x81, 0x11, 0, becn=1), lambda: _layout_ipv4(16)),
    ("ud_send", lambda: roce(0x64, 0x01, 0, b"u" * 32), lambda: _layout_ipv4(8)),
]


def _expected(marks, cut):
    for end, cat in marks:
        if cut < end:
            return cat
    return T.G_ACCOUNTED


@pytest.mark.parametrize("name,mk,marks", CASES, ids=[c[0] for c in CASES])
def test_every_cut_offset(tmp_path, name, mk, marks):
    pkt = mk()
    f = pkt.frame
    marks = marks()
    # one record per cut length 0..len(f), all with the original length
    recs = [(1000 + c, f[:c], len(f)) for c in range(len(f) + 1)]
    p = write(tmp_path / "cuts.pcap", pcap_bytes(recs))
    pk = offline.dissect(p)
    got = pk["category"].tolist()
    want = [_expected(marks, c) for c in range(len(f) + 1)]
    bad = [(c, L.CATEGORY_NAMES[g], L.CATEGORY_NAMES[w]) for c, (g, w) in enumerate(zip(got, want)) if g != w]
    assert not bad, f"{name}: cut -> (got, want): {bad[:6]}"
    # every accounted cut is accounted in full: original length, payload from the UDP/GRH length
    acc = pk[pk["category"] == L.G_ACCOUNTED]
    assert len(acc) and np.all(acc["wire_len"] == len(f)) and np.all(acc["payload"] == pkt.payload)
    assert np.all(acc["reth_len"] == pkt.reth) and np.all(acc["psn"] == pkt.psn)
    snap = offline.parse_file(p)
    assert len(snap.flows) == 1 and int(snap.flows["packets"][0]) == len(acc)
    assert int(snap.flows["bytes"][0]) == len(acc) * len(f)
    assert int(snap.flows["payload_bytes"][0]) == len(acc) * pkt.payload
    assert snap.meta["snaplen_cut_records"] == len(f)


@pytest.mark.parametrize("opcode,cut,want", [(0x0101, 17, L.G_TRUNC_MACCTL), (0x0101, 33, L.G_TRUNC_MACCTL),
                                             (0x0101, 34, L.G_PFC), (0x0001, 17, L.G_TRUNC_MACCTL),
                                             (0x0001, 18, L.G_PAUSE), (0x0001, 60, L.G_PAUSE),
                                             (0x0002, 60, L.G_NON_ROCE)])
def test_mac_control_cuts(tmp_path, opcode, cut, want):
    """802.3x pause needs opcode + one time (4 bytes); PFC needs the whole 20-byte body."""
    f = bytes.fromhex("0180c2000001" "020000000004" "8808") + struct.pack(">HH8H", opcode, 1, 5, *[0] * 7) \
        + b"\0" * 26
    snap = offline.parse_file(write(tmp_path / "m.pcap", pcap_bytes([(1, f[:cut], len(f))])))
    assert int(snap.globals[want]) == 1, L.CATEGORY_NAMES[want]


def _set16(f, off, v):
    return f[:off] + struct.pack(">H", v) + f[off + 2:]


def test_length_fields_that_lie(tmp_path):
    """bad_length: UDP length < 8, UDP length beyond the IP total length, a transport too
    short for BTH + its extension headers + pad + ICRC, and an IP total length (or IPv6/GRH
    payload length) claiming more bytes than the frame has. A snaplen-cut record whose
    lengths are right is not a lie (the original length counts)."""
    w = roce(0x0A, 0x11, 7, b"x" * 100, reth=100).frame       # IPv4 at 14, UDP at 34
    v6 = roce(0x0A, 0x11, 7, b"x" * 100, reth=100, src="fd00::1", dst="fd00::2", ipv6=True).frame
    v1 = rocev1(0x0A, 0x11, 7, b"x" * 100, reth=100).frame
    tot = struct.unpack(">H", w[16:18])[0]
    cases = [
        (_set16(w, 38, 7), L.G_BAD_LENGTH),                   # UDP length < 8
        (_set16(w, 38, tot - 20 + 1), L.G_BAD_LENGTH),        # UDP length > IP payload
        (_set16(_set16(w, 38, 8 + 12 + 16 + 3), 16, 20 + 8 + 12 + 16 + 3), L.G_BAD_LENGTH),  # < ICRC
        (_set16(w, 16, tot + 1), L.G_BAD_LENGTH),             # IP total length beyond the frame
        (_set16(v6, 18, struct.unpack(">H", v6[18:20])[0] + 1), L.G_BAD_LENGTH),
        (_set16(v1, 18, struct.unpack(">H", v1[18:20])[0] + 1), L.G_BAD_LENGTH),   # GRH payload length
        (_set16(w, 16, tot - 1), L.G_BAD_LENGTH),             # IP shorter than UDP says
        (w + b"\0" * 20, L.G_ACCOUNTED),                      # Ethernet padding/trailer: fine
    ]
    recs = [(i, f, len(f)) for i, (f, _) in enumerate(cases)]
    recs.append((99, w[:72], len(w)))                          # snaplen cut after the RETH
    pk = offline.dissect(write(tmp_path / "lies.pcap", pcap_bytes(recs)))
    want = [c for _, c in cases] + [L.G_ACCOUNTED]
    assert pk["category"].tolist() == want
    assert pk["payload"][-1] == 100 and pk["wire_len"][-1] == len(w)


GEN_PRESETS = ["mixed", "loss", "ipv6-ring", "vlan-alltoall", "tp-decode"]


@pytest.mark.parametrize("preset", GEN_PRESETS)
def test_headers_only_capture_equals_full_capture(tmp_path, preset):
    """skewgen: the same traffic captured in full and with snaplen 128 gives the same
    Snapshot (every counter, histogram and message record)."""
    skewgen = pytest.importorskip("skewscope.gen")
    cap = skewgen.generate(preset, seed=3)
    full, cut = tmp_path / "full.pcap", tmp_path / "cut.pcap"
    cap.write_pcap(full, snaplen=0)
    cap.write_pcap(cut, snaplen=128)
    a, b = offline.parse_file(full), offline.parse_file(cut)
    same_snapshot(a, b, meta_keys=("frames", "first_ts", "last_ts", "flows_created", "duration_s"))
    assert a.meta["snaplen_cut_records"] == 0 and b.meta["snaplen_cut_records"] > 0
    assert int(a.globals[L.G_FRAMES]) == len(cap)
