"""Kernel tier: what the parser accepts, and where every frame it does not account goes.

Each frame lands in exactly one category (README "Categories"); frames == their sum. The
expected category follows from how the frame was built (tests/frames.py), including the
header a truncated frame is cut in.
"""
from __future__ import annotations

import struct

import frames as F
import pytest
from kharness import assert_basic

WRITE = 0x0A  # RDMA_WRITE_ONLY: carries a RETH


# ---- encapsulations that must be accounted ---------------------------------------------------
ENCAPS = {
    "ipv4": dict(),
    "vlan": dict(vlans=(100,)),
    "qinq_88a8_8100": dict(vlans=((0x88A8, 10), (0x8100, 20))),
    "qinq_8100_8100": dict(vlans=((0x8100, 10), (0x8100, 20))),
    "ipv4_options_4": dict(ip_options=bytes([0x94, 0x04, 0x00, 0x00])),           # router alert
    "ipv4_options_40": dict(ip_options=bytes([0x01] * 39 + [0x00])),             # IHL 15
    "ipv4_options_vlan": dict(ip_options=bytes([0x01] * 8), vlans=(7,)),
    "ipv6": dict(src="fd00::1", dst="fd00::2"),
    "ipv6_vlan_flowlabel": dict(src="2001:db8::a", dst="2001:db8::b", vlans=(5,), flow_label=0xABCDE),
    "rocev1": dict(v1=True, src="fe80::1", dst="fe80::2"),
    "rocev1_vlan": dict(v1=True, src="fe80::1", dst="fe80::2", vlans=(3,)),
}


@pytest.mark.parametrize("encap", sorted(ENCAPS))
def test_encapsulations_are_accounted(kernel, entry, encap):
    kw = ENCAPS[encap]
    built = [F.roce(WRITE, payload=300, psn=7, **kw),
             F.roce(0x11, syndrome=0, psn=7, qp=0x99, **{**kw, "src": kw.get("dst", "10.0.0.2"),
                                                        "dst": kw.get("src", "10.0.0.1")})]
    res = kernel.run(built, entry)
    res.assert_cats(accounted=2)
    assert_basic(res, built)
    f = res.flow(built[0].key)
    assert int(f["ipver"]) == (6 if ("v1" in kw or ":" in kw.get("src", "")) else 4)
    assert int(f["roce"]) == (1 if kw.get("v1") else 2)
    assert int(f["messages"]) == 1 and int(f["msg_bytes"]) == 300


def test_wire_bytes_include_vlan_tags(kernel, entry):
    plain, tagged, qinq = (F.roce(WRITE, payload=64, qp=q, vlans=v) for q, v in ((1, ()), (2, (9,)), (3, (9, 10))))
    res = kernel.run([plain, tagged, qinq], entry)
    assert [int(res.flow(b.key)["bytes"]) for b in (plain, tagged, qinq)] == [len(plain), len(plain) + 4,
                                                                            len(plain) + 8]


def test_ethernet_padding_is_wire_bytes_not_payload(kernel, entry):
    """A minimum-size frame padded to 60 bytes: bytes = 60, payload from the UDP length."""
    b = F.roce(0x04, payload=0)  # 14+20+8+12+4 = 58 bytes
    assert len(b) == 58
    padded = b.frame + b"\0\0"
    res = kernel.run([padded], entry)
    res.assert_cats(accounted=1)
    f = res.flow(b.key)
    assert (int(f["bytes"]), int(f["payload_bytes"]), int(f["messages"])) == (60, 0, 1)


# ---- not RoCE ---------------------------------------------------------------------------------
NON_ROCE = {
    "arp": F.arp,
    "tcp_to_4791": lambda: F.tcp(dport=4791),
    "tcp_ipv6": lambda: F.tcp(ipv6=True),
    "udp_other_port": lambda: F.udp(dport=4792),
    "udp_from_4791": lambda: F.udp(sport=4791, dport=53),
    "udp_ipv6_other": lambda: F.udp(dport=4790, ipv6=True),
    "udp_vlan_other": lambda: F.udp(dport=1, vlans=(4,)),
    "icmp": F.icmp,
    "ethertype_lldp": lambda: F.ethertype(0x88CC),
    "ethertype_mpls": lambda: F.ethertype(0x8847),
    "macctl_other_opcode": F.macctl_other,
    "ipv6_hop_by_hop_then_udp": F.ipv6_hbh_roce,  # documented: IPv6 fixed header only
}


@pytest.mark.parametrize("name", sorted(NON_ROCE))
def test_non_roce(kernel, entry, name):
    res = kernel.run([NON_ROCE[name](), NON_ROCE[name]()], entry)
    res.assert_cats(non_roce=2)
    assert len(res.flows) == 0


def test_fragments_are_counted_not_parsed(kernel, entry):
    built = [F.ipv4_fragment(0, True), F.ipv4_fragment(10, False), F.ipv4_fragment(10, True), F.ipv6_fragment()]
    res = kernel.run(built, entry)
    res.assert_cats(fragment=4)
    assert len(res.flows) == 0


def test_dont_fragment_bit_is_not_a_fragment(kernel, entry):
    b = F.roce(WRITE, payload=10)  # built with DF set
    assert b.frame[14 + 6] & 0x40
    kernel.run([b], entry).assert_cats(accounted=1)


def test_third_vlan_tag_is_too_deep(kernel, entry):
    built = [F.roce(WRITE, payload=10, vlans=(1, 2, 3)), F.udp(vlans=(1, 2, 3)),
             F.roce(WRITE, payload=10, vlans=((0x88A8, 1), (0x88A8, 2), (0x8100, 3)))]
    res = kernel.run(built, entry)
    res.assert_cats(vlan_too_deep=3)
    assert len(res.flows) == 0


def _patch(frame: bytes, off: int, value: int) -> bytes:
    b = bytearray(frame)
    b[off] = value
    return bytes(b)


def test_invalid_ip_headers(kernel, entry):
    v4 = F.roce(WRITE, payload=10).frame
    v6 = F.roce(WRITE, payload=10, src="fd00::1", dst="fd00::2").frame
    v1 = F.roce(WRITE, payload=10, v1=True, src="fe80::1", dst="fe80::2").frame
    built = [_patch(v4, 14, 0x65),   # version 6 in an IPv4 EtherType
             _patch(v4, 14, 0x44),   # IHL 4 < 5
             _patch(v6, 14, 0x40),   # version 4 in an IPv6 EtherType
             ]
    res = kernel.run(built + [_patch(v1, 14, 0x40)], entry)  # RoCEv1 GRH IPVer 4
    res.assert_cats(truncated_ip=3, truncated_grh=1)
    assert len(res.flows) == 0


# ---- PFC and PAUSE --------------------------------------------------------------------------
def test_pfc_per_priority(kernel, entry):
    from skewscope.core import layout as L
    # enabled priorities 0, 2, 5, 7; times for disabled priorities (1, 3) must be ignored
    a = F.pfc(0b10100101, [100, 5, 0, 7, 0, 9, 0, 65535])
    b = F.pfc(0b00000100, [0, 0, 3, 0, 0, 0, 0, 0])
    xoff_all = F.pfc(0xFF, [1] * 8, vlans=(3,))
    res = kernel.run([a, a, b, xoff_all], entry)
    res.assert_cats(pfc=4)
    pause = [int(res.g[L.G_PFC_PAUSE + p]) for p in range(8)]
    xon = [int(res.g[L.G_PFC_XON + p]) for p in range(8)]
    quanta = [int(res.g[L.G_PFC_QUANTA + p]) for p in range(8)]
    assert pause == [2 + 1, 1, 1 + 1, 1, 1, 2 + 1, 1, 2 + 1]
    assert xon == [0, 0, 2, 0, 0, 0, 0, 0]
    assert quanta == [200 + 1, 1, 3 + 1, 1, 1, 18 + 1, 1, 2 * 65535 + 1]
    assert len(res.flows) == 0


def test_global_pause_is_not_pfc(kernel, entry):
    from skewscope.core import layout as L
    res = kernel.run([F.pause(0xFFFF), F.pause(0)], entry)
    res.assert_cats(pause=2)
    assert not any(int(res.g[L.G_PFC_PAUSE + p]) + int(res.g[L.G_PFC_XON + p]) for p in range(8))


def test_mac_control_cut(kernel, entry):
    """A PFC frame cut inside its vector/times; a PAUSE needs only opcode + one time."""
    p = F.pfc(0xFF, [1] * 8)
    g = F.pause(5)
    res = kernel.run([p, p, g, g], entry, caplens=[14 + 19, 14 + 1, 14 + 3, 14 + 4])
    res.assert_cats(truncated_macctl=3, pause=1)


# ---- truncation at every header boundary ------------------------------------------------------
TRUNC_FRAMES = {
    "ipv4_reth": lambda: F.roce(0x06, payload=200, dma_len=4096),
    "vlan_ipv4opt_reth_imm": lambda: F.roce(0x0B, payload=64, vlans=(5,), ip_options=bytes([1, 1, 1, 0])),
    "qinq_ipv6_ack": lambda: F.roce(0x11, syndrome=0x60, src="fd00::1", dst="fd00::2", vlans=(1, 2)),
    "rocev1_write": lambda: F.roce(WRITE, payload=5, pad=3, v1=True, src="fe80::1", dst="fe80::2"),
    "xrc_read_request": lambda: F.roce(0xAC, dma_len=65536),
    "ud_send_imm": lambda: F.roce(0x65, payload=40, qp=1),
    "atomic": lambda: F.roce(0x13),
    "middle_no_ext": lambda: F.roce(0x07, payload=100),
    "cnp": lambda: F.roce(0x81, qp=0x118),
}
CATEGORY_OF = {"eth": "truncated_eth", "vlan": "truncated_vlan", "ip": "truncated_ip", "udp": "truncated_udp",
               "grh": "truncated_grh", "bth": "truncated_bth", "ext": "truncated_ext"}


def _expected_category(bounds, cut):
    for (start, name), (end, _) in zip(bounds, bounds[1:]):
        if start <= cut < end:
            return CATEGORY_OF[name]
    return "accounted"


@pytest.mark.parametrize("name", sorted(TRUNC_FRAMES))
def test_truncated_at_every_header_boundary(kernel, entry, name):
    """Captured length cut at every byte inside the headers (the bytes after the cut are
    present but zero, like a snaplen-cut record padded back): each cut lands in the category
    of the header it is in, and no flow is created; a cut after the last header is accounted
    with the full payload."""
    b = TRUNC_FRAMES[name]()
    bounds = F.header_boundaries(b)
    end = bounds[-1][0]
    cuts = list(range(0, end + 1))
    padded = [b.frame[:c] + bytes(len(b) - c) for c in cuts]
    for c, fr in zip(cuts, padded):
        res = kernel.run([fr], entry, caplens=[c])
        want = _expected_category(bounds, c)
        assert res.cats() == {want: 1}, f"cut at {c} ({bounds}): {res.cats()}"
        if want == "accounted":
            f = res.flow(b.key)
            assert int(f["payload_bytes"]) == b.payload and int(f["bytes"]) == len(b)
        else:
            assert len(res.flows) == 0, f"cut at {c} created a flow"


@pytest.mark.parametrize("name", ["ipv4_reth", "qinq_ipv6_ack", "rocev1_write"])
def test_short_frames_truncated(kernel, entry, name):
    """Frames that really end inside a header (a live runt, not a snaplen cut). The kernel
    test run needs >= 14 bytes, so cuts start at the Ethernet header's end."""
    b = TRUNC_FRAMES[name]()
    bounds = F.header_boundaries(b)
    end = bounds[-1][0]
    ip = [(s, e) for (s, n), (e, _) in zip(bounds, bounds[1:]) if n == "ip"]
    for c in range(14, end):
        if entry == "tc" and ip and c < ip[0][1]:
            continue  # the skb test run refuses IPv4/IPv6 frames shorter than their IP header
        res = kernel.run([b.frame[:c]], entry)
        assert res.cats() == {_expected_category(bounds, c): 1}, f"frame cut at {c}: {res.cats()}"
        assert len(res.flows) == 0


# ---- lengths that lie -----------------------------------------------------------------------
def _set_u16(frame: bytes, off: int, v: int) -> bytes:
    b = bytearray(frame)
    struct.pack_into(">H", b, off, v)
    return bytes(b)


def test_bad_lengths(kernel, entry):
    ok = F.roce(WRITE, payload=100)
    ulen_off = 14 + 20 + 4
    built = [
        F.roce(WRITE, payload=100, udp_len_delta=+4),            # UDP claims more than the IP packet holds
        _set_u16(ok.frame, ulen_off, 7),                          # UDP length < 8
        F.roce(WRITE, payload=0, udp_len_delta=-1, ip_len_delta=-1),  # too short for BTH+RETH+ICRC
        F.roce(WRITE, payload=100, udp_len_delta=+400, ip_len_delta=+400),  # IP/UDP longer than the frame
        F.roce(0x11, src="fd00::1", dst="fd00::2", udp_len_delta=+8),       # IPv6: UDP > payload length
        F.roce(0x11, src="fd00::1", dst="fd00::2", udp_len_delta=+500, ip_len_delta=+500),
        F.roce(0x11, v1=True, src="fe80::1", dst="fe80::2", ip_len_delta=-1),   # GRH too short for BTH+AETH+ICRC
        F.roce(0x11, v1=True, src="fe80::1", dst="fe80::2", ip_len_delta=+300),  # GRH longer than the frame
    ]
    # pad count that does not fit: an ACK (no payload) claiming 3 pad bytes
    ack = bytearray(F.roce(0x11).frame)
    ack[14 + 20 + 8 + 1] |= 3 << 4
    built.append(bytes(ack))
    res = kernel.run(built, entry)
    res.assert_cats(bad_length=len(built))
    assert len(res.flows) == 0


def test_pad_count_is_not_payload(kernel, entry):
    built = [F.roce(0x04, payload=p, pad=pad, qp=0x10 + pad) for p, pad in ((5, 3), (6, 2), (7, 1), (8, 0))]
    res = kernel.run(built, entry)
    res.assert_cats(accounted=4)
    assert_basic(res, built)
    for b in built:
        assert int(res.flow(b.key)["msg_bytes"]) == b.payload


# ---- opcodes -------------------------------------------------------------------------------
def test_every_opcode_value(kernel):
    """All 256 BTH opcodes: the ones the IBA defines for RC/UC/UD/XRC (+CNP) are accounted in
    their class; every other value (RD, reserved, vendor) is unknown_opcode."""
    from skewscope.core import layout as L
    wrong = []
    for op in range(256):
        if op in F.OPCODE_CLASS:
            b = F.roce(op, payload=8 if op != 0x81 else 0, qp=0x42)
        else:
            b = F.raw_bth(op, qp=0x42, body=bytes(64))
        res = kernel.run([b], "xdp")
        if op in F.OPCODE_CLASS:
            got = res.cats()
            if got != {"accounted": 1}:
                wrong.append(f"0x{op:02x} {F.OPCODE_NAME[op]}: {got}")
                continue
            f = res.flow(b.key)
            cls = [n for i, n in enumerate(L.OPCLASS_NAMES) if f["op"][i]]
            if cls != [F.OPCODE_CLASS[op]] or int(f["payload_bytes"]) != b.payload:
                wrong.append(f"0x{op:02x} {F.OPCODE_NAME[op]}: class {cls}, payload {int(f['payload_bytes'])}")
        elif res.cats() != {"unknown_opcode": 1} or len(res.flows):
            wrong.append(f"0x{op:02x} (undefined): {res.cats()}")
    assert not wrong, "\n".join(wrong)


def test_unknown_opcode_both_entries(kernel, entry):
    res = kernel.run([F.raw_bth(0x40, body=bytes(32)), F.raw_bth(0xFF, body=bytes(32)),
                      F.raw_bth(0x15, body=bytes(32))], entry)
    res.assert_cats(unknown_opcode=3)
