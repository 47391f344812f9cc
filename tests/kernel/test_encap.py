"""Kernel tier: one level of decapsulation (ERSPAN I/II/III, GRE TEB, GRE carrying IP,
VXLAN), and the offline parser == the kernel on a capture of such frames.

Ground truth from how the frames were built (tests/frames.py `encap`, scapy's GRE, ERSPAN
and VXLAN layers): RoCE inside is accounted with the inner key; `bytes` is the inner
Ethernet frame's length (GRE carrying IP: inner IP packet + 14); every frame whose
encapsulation headers are complete counts once in `decapsulated` (G_DECAP), whatever its
category; a cut inside GRE/ERSPAN counts as truncated_ip (the IP header that carries it),
inside the VXLAN header as truncated_udp, inside the inner headers as that header.
"""
from __future__ import annotations

import os
import struct

import frames as F
import numpy as np
import pytest
from kharness import assert_basic

pytestmark = [
    pytest.mark.kernel,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root for BPF_PROG_TEST_RUN (CI runs as root)"),
]

OUTERS = {"v4": dict(), "v6": dict(outer_v6=True), "v4_vlan": dict(outer_vlans=(77,)),
          "v6_qinq": dict(outer_v6=True, outer_vlans=(10, 20))}
CATEGORY_OF = {"eth": "truncated_eth", "vlan": "truncated_vlan", "ip": "truncated_ip", "udp": "truncated_udp",
               "grh": "truncated_grh", "bth": "truncated_bth", "ext": "truncated_ext",
               "gre": "truncated_ip", "erspan": "truncated_ip", "vxlan": "truncated_udp"}


def decap(res) -> int:
    from skewscope.core import layout as L
    return int(res.g[L.G_DECAP])


def _inners(how):
    """Inner RoCE packets (distinct QPs): IPv4, IPv6, inner VLAN / QinQ, RoCEv1, an ACK."""
    out = [F.roce(0x0A, payload=300, psn=7, qp=0x101),
           F.roce(0x06, payload=1024, dma_len=8192, src="fd00::1", dst="fd00::2", qp=0x102, tclass=0x03),
           F.roce(0x11, syndrome=0x60, src="10.1.0.2", dst="10.1.0.1", qp=0x103)]
    if how != "gre_ip":
        out += [F.roce(0x04, payload=64, vlans=(5,), qp=0x104),
                F.roce(0x0A, payload=200, vlans=(1, 2), src="fd00::3", dst="fd00::4", qp=0x105),
                F.roce(0x0A, payload=40, v1=True, src="fe80::1", dst="fe80::2", qp=0x106)]
    return out


@pytest.mark.parametrize("outer", sorted(OUTERS))
@pytest.mark.parametrize("how", F.ENCAP_KINDS)
def test_roce_inside_is_accounted_with_the_inner_key(kernel, entry, how, outer):
    built = [F.encap(i, how, **OUTERS[outer]) for i in _inners(how)]
    res = kernel.run(built, entry)
    res.assert_cats(accounted=len(built))
    assert decap(res) == len(built)
    assert_basic(res, built)  # inner key, bytes = inner frame, payload, ops, ECN, sport, tclass
    for b in built:
        f = res.flow(b.key)
        inner_len = len(b.frame) - b.extra["inner_off"] + (14 if how == "gre_ip" else 0)
        assert int(f["bytes"]) == inner_len == b.wire_len
        assert int(f["payload_bytes"]) == b.payload


@pytest.mark.parametrize("how", ["erspan1", "erspan2", "gre_teb", "gre_ip"])
def test_gre_optional_fields(kernel, entry, how):
    """C/K/S bits add 4 bytes each."""
    inner = F.roce(0x0A, payload=100)
    built = [F.encap(inner, how, gre_csum=c, gre_key=k, gre_seq=s)
             for c, k, s in ((1, None, None), (0, 0x55, None), (0, None, 9), (1, 0x55, 9))]
    res = kernel.run(built, entry)
    res.assert_cats(accounted=4)
    assert decap(res) == 4
    f = res.flow(inner.key)
    assert int(f["packets"]) == 4 and int(f["bytes"]) == 4 * len(inner.frame)


def test_same_flow_with_and_without_the_mirror(kernel, entry):
    """bytes/payload of a flow seen through ERSPAN == seen directly."""
    inner = [F.roce(0x06, payload=2048, dma_len=4096, psn=1), F.roce(0x08, payload=2048, psn=2)]
    a = kernel.run(inner, entry)
    fa = a.flow(inner[0].key)
    b = kernel.run([F.encap(i, "erspan3_o", outer_vlans=(9,)) for i in inner], entry)
    fb = b.flow(inner[0].key)
    for k in ("packets", "bytes", "payload_bytes", "messages", "msg_bytes", "msg_hist", "op"):
        assert np.array_equal(fa[k], fb[k]), k
    assert len(b.events) == len(a.events) == 1 and decap(a) == 0 and decap(b) == 2


TRUNC = {
    "erspan3_o_v4_vlan": lambda: F.encap(F.roce(0x06, payload=64, dma_len=4096, vlans=(3,)), "erspan3_o",
                                         outer_vlans=(8,)),
    "erspan2_v6_ipv6ack": lambda: F.encap(F.roce(0x11, src="fd00::1", dst="fd00::2"), "erspan2", outer_v6=True),
    "vxlan_v6_qinq": lambda: F.encap(F.roce(0x0B, payload=20, vlans=(1, 2)), "vxlan", outer_v6=True),
    "vxlan_v4_rocev1": lambda: F.encap(F.roce(0x0A, payload=8, v1=True, src="fe80::1", dst="fe80::2"), "vxlan"),
    "gre_ip_csum_key_seq": lambda: F.encap(F.roce(0xAC, dma_len=65536), "gre_ip", gre_csum=True, gre_key=1, gre_seq=2),
    "gre_teb_ipv4opt": lambda: F.encap(F.roce(0x0A, payload=10, ip_options=bytes([1, 1, 1, 0])), "gre_teb",
                                       outer_v6=True, gre_key=3),
}


def _expected(bounds, cut):
    for (start, name), (end, _) in zip(bounds, bounds[1:]):
        if start <= cut < end:
            return CATEGORY_OF[name]
    return "accounted"


@pytest.mark.parametrize("name", sorted(TRUNC))
def test_truncated_inside_every_header(kernel, entry, name):
    """Captured length cut at every byte of the outer, encapsulation and inner headers:
    the category of the header the cut is in, no flow; decapsulated counted once the
    encapsulation headers are complete."""
    b = TRUNC[name]()
    bounds = b.extra["bounds"]
    end = bounds[-1][0]
    for c in range(0, end + 1):
        fr = b.frame[:c] + bytes(len(b.frame) - c)
        res = kernel.run([fr], entry, caplens=[c])
        want = _expected(bounds, c)
        assert res.cats() == {want: 1}, f"cut at {c} ({bounds}): {res.cats()}"
        assert decap(res) == int(c >= b.extra["inner_off"]), f"cut at {c}: decap {decap(res)}"
        if want == "accounted":
            f = res.flow(b.key)
            assert int(f["payload_bytes"]) == b.payload and int(f["bytes"]) == b.wire_len
        else:
            assert len(res.flows) == 0, f"cut at {c} created a flow"


def _not_roce_inside():
    out = {}
    for how in ("erspan2", "gre_teb", "vxlan", "erspan3"):
        out[f"{how}_tcp"] = F.encap(F.tcp(dport=4791), how)
        out[f"{how}_udp_other"] = F.encap(F.udp(dport=4792), how)
        out[f"{how}_arp"] = F.encap(F.arp(), how)
    out["gre_ip_tcp"] = F.encap(F.tcp(), "gre_ip")
    out["gre_ip_udp6"] = F.encap(F.udp(ipv6=True), "gre_ip", outer_v6=True)
    return out


def test_non_roce_inside_is_non_roce(kernel, entry):
    built = list(_not_roce_inside().values())
    res = kernel.run(built, entry)
    res.assert_cats(non_roce=len(built))
    assert decap(res) == len(built) and len(res.flows) == 0


def test_double_encapsulation_is_non_roce(kernel, entry):
    roce = F.roce(0x0A, payload=64)
    built = [F.encap(F.encap(roce, "vxlan"), "vxlan"), F.encap(F.encap(roce, "gre_teb"), "erspan2"),
             F.encap(F.encap(roce, "erspan3"), "vxlan", outer_v6=True), F.encap(F.encap(roce, "gre_ip"), "gre_ip")]
    res = kernel.run(built, entry)
    res.assert_cats(non_roce=4)
    assert decap(res) == 4 and len(res.flows) == 0


def _gre(flags: int, proto: int, body: bytes, v6: bool = False) -> bytes:
    from scapy.layers.inet import IP
    from scapy.layers.inet6 import IPv6
    from scapy.layers.l2 import Ether
    from scapy.packet import Raw
    ip = IPv6(src="2001:db8::1", dst="2001:db8::2", nh=47) if v6 else IP(src="192.0.2.1", dst="192.0.2.2", proto=47)
    return bytes(Ether(src=F.MAC_A, dst=F.MAC_B) / ip / Raw(struct.pack(">HH", flags, proto) + body))


def test_gre_variants_not_decapsulated(kernel, entry):
    inner = F.roce(0x0A, payload=64).frame
    built = [_gre(0x0001, 0x6558, inner),            # version 1 (PPTP): not ours
             _gre(0x0000, 0x8847, inner),            # MPLS over GRE: not supported
             _gre(0x0000, 0x0806, inner, v6=True)]   # other protocol
    res = kernel.run(built + [_gre(0x4000, 0x6558, bytes(8) + inner)], entry)  # routing bit: malformed
    res.assert_cats(non_roce=3, truncated_ip=1)
    assert decap(res) == 0 and len(res.flows) == 0


def test_vxlan_only_on_its_port_and_plain_roce_not_counted(kernel, entry):
    """Plain RoCE is never counted as decapsulated; UDP 4789 from (not to) is non_roce."""
    plain = F.roce(0x0A, payload=64)
    res = kernel.run([plain, F.udp(sport=4789, dport=53)], entry)
    res.assert_cats(accounted=1, non_roce=1)
    assert decap(res) == 0


def test_inner_pfc_and_fragments(kernel, entry):
    from skewscope.core import layout as L
    built = [F.encap(F.pfc(0b1, [100] + [0] * 7), "erspan2"), F.encap(F.ipv4_fragment(0, True), "vxlan"),
             F.encap(F.roce(0x0A, payload=10, vlans=(1, 2, 3)), "gre_teb")]
    res = kernel.run(built, entry)
    res.assert_cats(pfc=1, fragment=1, vlan_too_deep=1)
    assert int(res.g[L.G_PFC_PAUSE + 0]) == 1 and decap(res) == 3


def test_length_lies_inside_and_outside(kernel, entry):
    built = [F.encap(F.roce(0x0A, payload=100), "erspan2", outer_ip_len_delta=+200),   # outer IP > frame
             F.encap(F.roce(0x0A, payload=100), "vxlan", outer_v6=True, outer_ip_len_delta=+200),
             F.encap(F.roce(0x0A, payload=100, udp_len_delta=+300, ip_len_delta=+300), "gre_teb"),  # inner lie
             F.encap(F.roce(0x11, src="fd00::1", dst="fd00::2", udp_len_delta=+8), "gre_ip")]
    res = kernel.run(built, entry)
    res.assert_cats(bad_length=4)
    assert decap(res) == 4 and len(res.flows) == 0


def test_outer_fragment_is_a_fragment(kernel, entry):
    raw = bytearray(F.encap(F.roce(0x0A, payload=64), "erspan2").frame)
    struct.pack_into(">H", raw, 14 + 6, 0x2000)  # MF
    res = kernel.run([bytes(raw)], entry)
    res.assert_cats(fragment=1)
    assert decap(res) == 0


# ---- offline == kernel on a capture of encapsulated frames ----------------------------------
def _capture_frames():
    """(frame, caplen) pairs: every encapsulation x outer, RoCE and not inside, GRE options,
    double encapsulation, length lies, and cuts inside every header of a few."""
    out = []
    for how in F.ENCAP_KINDS:
        for outer in OUTERS.values():
            out += [(F.encap(i, how, **outer).frame, None) for i in _inners(how)]
    out += [(b.frame, None) for b in _not_roce_inside().values()]
    roce = F.roce(0x0A, payload=64)
    out += [(F.encap(F.encap(roce, "vxlan"), "erspan2").frame, None),
            (F.encap(roce, "gre_ip", gre_csum=True, gre_key=1, gre_seq=2).frame, None),
            (F.encap(F.roce(0x0A, payload=100), "erspan2", outer_ip_len_delta=+200).frame, None),
            (_gre(0x4000, 0x6558, bytes(8) + roce.frame), None), (_gre(0x0001, 0x6558, roce.frame), None)]
    for mk in TRUNC.values():
        b = mk()
        for c in range(14, b.extra["bounds"][-1][0] + 1):
            out.append((b.frame, c))
    return out


def _write_pcap(path, items, t0=1_700_000_000 * 10**9, dt=1000):
    with open(path, "wb") as fh:
        fh.write(struct.pack("<IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, 65535, 1))
        for i, (fr, cap) in enumerate(items):
            t = t0 + i * dt
            data = fr if cap is None else fr[:cap]
            fh.write(struct.pack("<IIII", t // 10**9, t % 10**9, len(data), len(fr)) + data)


@pytest.mark.parametrize("entry_", ["xdp", "tc"])
def test_offline_equals_kernel_on_encapsulated_capture(tmp_path, entry_):
    from test_offline_vs_kernel import assert_equal_snapshots

    from skewscope.core import layout as L
    from skewscope.sources import offline
    from skewscope.sources.replay import replay
    items = _capture_frames()
    p = tmp_path / "encap.pcap"
    _write_pcap(p, items)
    off = offline.parse_file(str(p))
    ker = replay(str(p), entry=entry_)
    assert_equal_snapshots(off, ker, f"encapsulated capture ({entry_})")
    assert int(ker.globals[L.G_DECAP]) > len(items) // 2 and int(ker.globals[L.G_ACCOUNTED]) > 100
