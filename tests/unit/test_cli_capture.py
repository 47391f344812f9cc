"""`skewscope capture` without root: argument and error paths through the real CLI, and the
two kernel-independent halves of --pcap-out: the classic-BPF socket filter (run here by a
small interpreter written from the cBPF semantics, on frames built by scapy) and the
TPACKET_V3 block -> pcap conversion (read back with dpkt)."""
from __future__ import annotations

import io
import struct

import dpkt
import numpy as np
import pytest
from click.testing import CliRunner
from scapy.all import ARP, IP, TCP, UDP, Dot1AD, Dot1Q, Ether, IPv6, Raw

from skewscope.cli import main
from skewscope.cli.live import Duration
from skewscope.sources import pcaptap as T

runner = CliRunner()


# ---- CLI ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text,secs", [("30", 30), ("30s", 30), ("500ms", 0.5), ("2m", 120), ("1.5h", 5400),
                                       (" 10 s ", 10)])
def test_duration_parses(text, secs):
    assert Duration().convert(text, None, None) == pytest.approx(secs)


@pytest.mark.parametrize("text", ["", "abc", "-1", "0", "10 parsecs", "0s"])
def test_duration_rejects(text):
    import click
    with pytest.raises(click.BadParameter):
        Duration().convert(text, None, None)


def test_help_has_examples():
    r = runner.invoke(main, ["capture", "--help"])
    assert r.exit_code == 0 and "Examples:" in r.output and "--pcap-out" in r.output


def test_required_arguments(tmp_path):
    r = runner.invoke(main, ["capture", "-i", "lo", "--duration", "1"])
    assert r.exit_code == 2 and "-o" in r.output
    r = runner.invoke(main, ["capture", "-i", "lo", "-o", str(tmp_path / "x.snap")])
    assert r.exit_code == 2 and "--duration" in r.output


def test_output_directory_must_exist(tmp_path):
    r = runner.invoke(main, ["capture", "-i", "lo", "-d", "1", "-o", str(tmp_path / "nope" / "x.snap")])
    assert r.exit_code == 2 and "does not exist" in r.stderr and r.stderr.count("\n") == 1
    r = runner.invoke(main, ["capture", "-i", "lo", "-d", "1", "-o", str(tmp_path / "x.snap"),
                             "--pcap-out", str(tmp_path / "nope" / "x.pcap")])
    assert r.exit_code == 2 and "--pcap-out" in r.stderr


def test_snap_and_pcap_cannot_be_the_same_file(tmp_path):
    p = str(tmp_path / "x")
    r = runner.invoke(main, ["capture", "-i", "lo", "-d", "1", "-o", p, "--pcap-out", p])
    assert r.exit_code == 2 and "same file" in r.stderr


def test_missing_interface_is_exit_6_before_anything_is_written(tmp_path):
    r = runner.invoke(main, ["capture", "-i", "ssu-nosuchif0", "-d", "1", "-o", str(tmp_path / "x.snap"),
                             "--pcap-out", str(tmp_path / "x.pcap")])
    assert r.exit_code == 6 and "ssu-nosuchif0" in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_not_root_is_exit_4_and_nothing_written(tmp_path, monkeypatch):
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    r = runner.invoke(main, ["capture", "-i", "lo", "-d", "1", "-o", str(tmp_path / "x.snap"),
                             "--pcap-out", str(tmp_path / "x.pcap")])
    assert r.exit_code == 4 and "needs root" in r.stderr and r.stderr.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_direction_needs_tc(tmp_path):
    r = runner.invoke(main, ["capture", "-i", "lo", "-d", "1", "-o", str(tmp_path / "x.snap"), "--direction", "both"])
    assert r.exit_code == 2 and "--tc" in r.stderr


# ---- the socket filter, interpreted -------------------------------------------------------------
PACKET_HOST, PACKET_OUTGOING = 0, 4


def run_cbpf(prog, pkt: bytes, pkttype: int = PACKET_HOST) -> int:
    """Classic BPF as the kernel runs a socket filter (subset: the opcodes a filter may use
    are checked; an out-of-bounds load rejects the packet, returning 0)."""
    A = X = 0
    pc = 0
    n = len(pkt)

    def load(k, size):
        if k == 0xFFFFF004 and size == 1:       # SKF_AD_OFF + SKF_AD_PKTTYPE
            return pkttype
        if k + size > n:
            raise IndexError
        return int.from_bytes(pkt[k:k + size], "big")
    steps = 0
    while True:
        steps += 1
        assert steps < 1000
        code, jt, jf, k = prog[pc]
        pc += 1
        try:
            if code == 0x30:                  # ldb [k]
                A = load(k, 1)
            elif code == 0x28:                # ldh [k]
                A = load(k, 2)
            elif code == 0x48:                # ldh [x + k]
                A = load(X + k, 2)
            elif code == 0xB1:                # ldxb 4*([k]&0xf)
                X = 4 * (load(k, 1) & 0xF)
            elif code == 0x15:                # jeq #k
                pc += jt if A == k else jf
            elif code == 0x45:                # jset #k
                pc += jt if A & k else jf
            elif code == 0x05:                # ja
                pc += k
            elif code == 0x06:                # ret #k
                return k
            else:
                raise AssertionError(f"unexpected opcode {code:#x}")
        except IndexError:
            return 0


def roce_payload(op=0x0A):
    return Raw(bytes([op]) + b"\x00" * 27 + b"\x00" * 36)


ACCEPT = [
    ("rocev2 ipv4", Ether() / IP(src="10.0.0.1", dst="10.0.0.2") / UDP(sport=49152, dport=4791) / roce_payload()),
    ("rocev2 ipv4 with options", Ether() / IP(options=[b"\x01\x01\x01\x00"]) / UDP(dport=4791) / roce_payload()),
    ("rocev2 ipv4 first fragment", Ether() / IP(flags="MF", frag=0) / UDP(dport=4791) / roce_payload()),
    ("rocev2 ipv6", Ether() / IPv6() / UDP(dport=4791) / roce_payload()),
    ("802.1Q ipv4", Ether() / Dot1Q(vlan=100) / IP() / UDP(dport=4791) / roce_payload()),
    ("802.1ad ipv4", Ether() / Dot1AD(vlan=7) / IP() / UDP(dport=4791) / roce_payload()),
    ("802.1Q ipv6", Ether() / Dot1Q(vlan=100) / IPv6() / UDP(dport=4791) / roce_payload()),
    ("rocev1", Ether(type=0x8915) / Raw(b"\x60" + b"\x00" * 70)),
    ("802.1Q rocev1", Ether() / Dot1Q(vlan=3, type=0x8915) / Raw(b"\x60" + b"\x00" * 70)),
    ("pfc", Ether(dst="01:80:c2:00:00:01", type=0x8808) / Raw(b"\x01\x01\x00\x08" + b"\x00" * 42)),
]
REJECT = [
    ("udp other port", Ether() / IP() / UDP(dport=53) / Raw(b"x" * 20)),
    ("udp 4791 as source port only", Ether() / IP() / UDP(sport=4791, dport=9) / Raw(b"x" * 20)),
    ("tcp 4791", Ether() / IP() / TCP(dport=4791)),
    ("later fragment", Ether() / IP(frag=100, proto=17) / Raw(b"\x12\xb7\x12\xb7" + b"x" * 40)),
    ("ipv6 tcp 4791", Ether() / IPv6() / TCP(dport=4791)),
    ("arp", Ether() / ARP()),
    ("QinQ (only one tag is looked through)", Ether() / Dot1AD(vlan=1) / Dot1Q(vlan=2) / IP() / UDP(dport=4791)),
    ("truncated ipv4", Ether() / Raw(b"\x45\x00\x00")),
]


@pytest.mark.parametrize("name,pkt", ACCEPT, ids=[a for a, _ in ACCEPT])
def test_filter_accepts_roce_and_pfc_returning_the_snap_length(name, pkt):
    prog = T.roce_filter(snaplen=128, direction="both")
    assert run_cbpf(prog, bytes(pkt)) == 128


@pytest.mark.parametrize("name,pkt", REJECT, ids=[a for a, _ in REJECT])
def test_filter_rejects_everything_else(name, pkt):
    assert run_cbpf(T.roce_filter(128, "both"), bytes(pkt)) == 0


def test_filter_direction_uses_pkttype():
    pkt = bytes(ACCEPT[0][1])
    ing, eg = T.roce_filter(200, "ingress"), T.roce_filter(200, "egress")
    assert run_cbpf(ing, pkt, PACKET_HOST) == 200 and run_cbpf(ing, pkt, PACKET_OUTGOING) == 0
    assert run_cbpf(eg, pkt, PACKET_OUTGOING) == 200 and run_cbpf(eg, pkt, PACKET_HOST) == 0
    assert run_cbpf(ing, bytes(REJECT[0][1]), PACKET_HOST) == 0


def test_filter_program_is_valid_cbpf():
    for d in ("ingress", "egress", "both"):
        prog = T.roce_filter(128, d)
        assert 0 < len(prog) <= 4096
        for i, (code, jt, jf, k) in enumerate(prog):
            assert i + 1 + max(jt, jf) < len(prog) + 1       # jumps stay inside the program
        assert prog[-1][0] == 0x06 and prog[-2][0] == 0x06   # ends with the two returns


# ---- ring block -> pcap ------------------------------------------------------------------------------
def _block(frames):
    """A TPACKET_V3 block as the kernel lays it out: (sec, nsec, data, wire_len, vlan(tci,tpid)|None)."""
    buf = bytearray(4096)
    off = 48
    struct.pack_into("<IIIII", buf, 0, 1, 0, 1, len(frames), off)
    for k, (sec, nsec, data, wire_len, vlan) in enumerate(frames):
        mac = 80
        status = 1 | (0x10 if vlan else 0) | (0x40 if vlan and vlan[1] else 0)
        nxt = 0 if k == len(frames) - 1 else (mac + len(data) + 15) // 16 * 16
        struct.pack_into("<IIIIIIHH", buf, off, nxt, sec, nsec, len(data), wire_len, status, mac, mac + 14)
        if vlan:
            struct.pack_into("<IIH", buf, off + 28, 0, vlan[0], vlan[1])
        buf[off + mac: off + mac + len(data)] = data
        off += nxt
    return np.frombuffer(bytes(buf), dtype=np.uint8)


def test_block_to_pcap_keeps_original_lengths_and_puts_vlan_tags_back():
    f1 = bytes(Ether(src="02:00:00:00:00:01") / IP() / UDP(dport=4791) / roce_payload())
    f2 = bytes(Ether(src="02:00:00:00:00:02") / IP() / UDP(dport=4791) / Raw(b"\x06" + b"\x00" * 200))[:128]
    f3 = bytes(Ether(src="02:00:00:00:00:03", type=0x8915) / Raw(b"\x60" + b"\x00" * 50))
    ring = _block([(100, 5, f1, len(f1), None), (101, 999_999_999, f2, 4170, (0x6005, 0)),
                   (102, 7, f3, len(f3), (0x0064, 0x88A8))])
    out = np.zeros(1 << 16, np.uint8)
    n, frames, orig, outside = T.block_to_pcap(ring, 0, out, 128)
    assert frames == 3 and outside == 0 and orig == len(f1) + 4174 + len(f3) + 4
    pcap = T.pcap_file_header(128) + out[:n].tobytes()
    recs = list(dpkt.pcap.Reader(io.BytesIO(pcap)))
    assert len(recs) == 3
    (t1, b1), (t2, b2), (t3, b3) = recs
    assert float(t1) == pytest.approx(100.000000005) and b1 == f1
    assert float(t2) == pytest.approx(101.999999999)
    # the tag is back after the MACs, the frame still cut at the snap length
    assert b2[:12] == f2[:12] and b2[12:16] == b"\x81\x00\x60\x05" and b2[16:] == f2[12:124] and len(b2) == 128
    assert b3[12:16] == b"\x88\xa8\x00\x64" and b3[16:] == f3[12:]
    hdrs = [struct.unpack_from("<IIII", pcap, off) for off in _record_offsets(pcap)]
    assert [h[3] for h in hdrs] == [len(f1), 4174, len(f3) + 4]          # original lengths


def _record_offsets(pcap):
    off, outs = 24, []
    while off < len(pcap):
        outs.append(off)
        off += 16 + struct.unpack_from("<I", pcap, off + 8)[0]
    return outs


def test_pcap_header_is_nanosecond_ethernet():
    magic, vmaj, vmin, _, _, snap, link = struct.unpack("<IHHiIII", T.pcap_file_header(128))
    assert magic == 0xA1B23C4D and (vmaj, vmin) == (2, 4) and snap == 128 and link == 1


def test_block_to_pcap_keeps_only_the_capture_window():
    f = bytes(Ether() / IP() / UDP(dport=4791) / roce_payload())
    ring = _block([(100, 0, f, len(f), None), (101, 0, f, len(f), None), (102, 500_000, f, len(f), None),
                   (103, 0, f, len(f), None)])
    out = np.zeros(1 << 16, np.uint8)
    n, kept, orig, outside = T.block_to_pcap(ring, 0, out, 128, 101 * 10**9, 102 * 10**9 + 500_000)
    assert (kept, outside, orig) == (2, 2, 2 * len(f))
    recs = list(dpkt.pcap.Reader(io.BytesIO(T.pcap_file_header(128) + out[:n].tobytes())))
    assert [round(float(t), 6) for t, _ in recs] == [101.0, 102.0005]
