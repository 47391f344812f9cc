"""Wire format of generated frames, checked against independent implementations:
scapy's RoCE layer (opcode, QP, PSN, RETH, ICRC) and tshark's InfiniBand dissector."""
import collections
import shutil
import struct
import subprocess
import zlib

import numpy as np
import pytest
from scapy.contrib.roce import AETH, BTH, CNPPadding
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Dot1Q, Ether
from test_gen_common import BIG, capture, parse, pcap_file, read_pcap

from skewscope import gen as skewgen
from skewscope.gen import frames as F

ALL = list(skewgen.PRESETS)
SMALL = [p for p in ALL if p not in BIG]


def test_zero_extension_operator_matches_zlib():
    rng = np.random.default_rng(1)
    lens = np.array([0, 1, 3, 4, 64, 1024, 4095, 4096, 100_000], dtype=np.int64)
    ops = F.zero_ops(lens, F.CRC_TABLE)
    for k, n in enumerate(lens):
        head = rng.integers(0, 256, size=37, dtype=np.uint8).tobytes()
        reg = (~zlib.crc32(head)) & 0xFFFFFFFF  # register after head
        z = ops[k]
        reg2 = int(z[0][reg & 0xFF] ^ z[1][(reg >> 8) & 0xFF] ^ z[2][(reg >> 16) & 0xFF]
                   ^ z[3][reg >> 24])
        assert (reg2 ^ 0xFFFFFFFF) == zlib.crc32(head + bytes(int(n))), n


def test_mlx5_sport_symmetric():
    for a, b in [(0x105, 0x4A7), (1, 2), (0xFFFFFF, 0x123456)]:
        s = F.mlx5_sport(a, b)
        assert s == F.mlx5_sport(b, a)
        assert 0xC000 <= s <= 0xFFFF


def test_frame_sizes_match_wire_md():
    """IB MTU 4096, IPv4, no VLAN, no FCS: MIDDLE 4154, FIRST 4170, ACK 62, CNP 74."""
    hl = 14 + 20 + 8
    ops = np.array([F.WRITE_MIDDLE, F.WRITE_FIRST, F.ACKNOWLEDGE, F.CNP], np.uint8)
    pl = np.array([4096, 4096, 0, 0], np.uint32)
    got = F.frame_lengths(np.zeros(4, np.uint8), ops, pl, hl)
    assert got.tolist() == [4154, 4170, 62, 74]


def _scapy_check(data, row, cap):
    """Decode with scapy; compare with the model row; verify ICRC with scapy."""
    p = Ether(data)
    job = cap.job
    if row["ftype"] == F.FT_PFC:
        assert p.dst == "01:80:c2:00:00:01" and p.type == 0x8808
        raw = bytes(p.payload)
        assert raw[:2] == b"\x01\x01"
        return "PFC"
    if row["ftype"] == F.FT_OTHER:
        assert BTH not in p
        return "OTHER"
    assert UDP in p and p[UDP].dport == 4791
    b = p[BTH]
    path = int(row["path"])
    assert b.opcode == row["opcode"]
    assert b.dqpn == job.p_dqp[path]
    assert b.psn == row["psn"]
    assert p[UDP].sport == job.p_sport[path]
    if job.sc["vlan"] is not None:
        assert p[Dot1Q].vlan == job.sc["vlan"] and p[Dot1Q].prio == job.sc["vlan_pcp"]
    ip = p[IP] if IP in p else p[IPv6]
    tos = ip.tos if IP in p else ip.tc
    assert tos == row["tos"]
    assert struct.pack("!I", b.icrc) == b.compute_icrc(None), "ICRC"
    body = bytes(b.payload)
    low = b.opcode & 0x1F
    if b.opcode == F.CNP:
        assert b.becn == 1 and b.pkey == 0xFFFF and CNPPadding in p
    elif low in (0x06, 0x0A, 0x0B):
        va, rkey, ln = struct.unpack("!QII", body[:16])
        assert ln == row["reth"]
        if low == 0x0B:
            imm = struct.unpack("!I", body[16:20])[0]
            assert imm == row["imm"]
    elif low == 0x11:
        assert p[AETH].syndrome == row["aeth"] >> 24
    elif low == 0x0C:       # READ REQUEST: RETH, no payload
        va, rkey, ln = struct.unpack("!QII", body[:16])
        assert ln == row["reth"] and row["plen"] == 0
    return F.OP_NAME[int(b.opcode)]


@pytest.mark.parametrize("name", ALL)
def test_scapy_parses_every_preset(name):
    cap = capture(name)
    n = len(cap)
    # a spread of frames plus every "interesting" one (not WRITE_MIDDLE), capped
    op = cap.pkts["opcode"]
    special = np.nonzero((op != F.WRITE_MIDDLE) | (cap.pkts["ftype"] != 0)
                         | (cap.pkts["retx"] != 0))[0]
    rng = np.random.default_rng(0)
    if special.size > 500:
        keep = np.concatenate([special[cap.pkts["opcode"][special] == F.CNP][:50],
                               special[cap.pkts["ftype"][special] != 0][:50],
                               rng.choice(special, 400, replace=False)])
        special = keep
    idx = np.unique(np.concatenate([np.linspace(0, n - 1, 300).astype(int), special]))
    want = set(idx.tolist())
    # render through the same kernel as the pcap writer, in memory (test_gen_model checks
    # frames_iter == pcap bytes); avoids writing GBs of full-frame pcaps
    kinds = collections.Counter()
    pos = 0
    for ts, buf, offs, lens in cap.frame_chunks(chunk_bytes=16 << 20):
        for k in range(ts.shape[0]):
            if pos + k in want:
                o = int(offs[k])
                row = {x: v[pos + k] for x, v in cap.pkts.items()}
                kinds[_scapy_check(bytes(buf[o:o + int(lens[k])]), row, cap)] += 1
        pos += ts.shape[0]
        if pos > idx.max():
            break
    assert sum(kinds.values()) == len(want)
    if cap.truth["scenario"].get("library") == "mpi":
        # Open MPI over verbs: SENDs (data and control), READs by the receiver, no WRITE
        assert kinds["SEND_ONLY"] > 0 and not any(k.startswith("RDMA_WRITE") for k in kinds)
        return
    # CTS, except for P/D KV transfers alone (one-way WRITEs of >= 64 KiB, no CTS)
    one_way = all(g["kind"] == "kv_transfer" for g in cap.truth["groups"])
    assert (kinds["RDMA_WRITE_ONLY"] > 0) != one_way


def test_corrupted_frame_fails_icrc():
    """The ICRC check above is not vacuous."""
    cap = capture("loss")
    for ts, orig, data in read_pcap(pcap_file("loss")):
        d = bytearray(data)
        d[60] ^= 1
        b = Ether(bytes(d))[BTH]
        assert struct.pack("!I", b.icrc) != b.compute_icrc(None)
        break


@pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark not installed")
@pytest.mark.parametrize("name", SMALL)
def test_tshark_opcode_counts_match_truth(name):
    path = pcap_file(name, 0, 128)  # headers suffice; orig lengths kept
    out = subprocess.run(["tshark", "-r", path, "-d", "udp.port==4791,infiniband", "-T",
                          "fields", "-e", "infiniband.bth.opcode", "-e", "infiniband.bth.destqp"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    cnt = collections.Counter()
    empty = 0
    for line in out.splitlines():
        op = line.split("\t")[0]
        if op == "":
            empty += 1
        else:
            cnt[F.OP_NAME[int(op, 0)]] += 1
    t = capture(name).truth
    assert dict(cnt) == t["opcodes"]
    assert empty == t["non_roce_frames"]


def test_special_frame_formats():
    """CNP, NAK and PFC frames as wire.md describes them."""
    cap = capture("mixed")
    seen = set()
    for ts, orig, data in read_pcap(pcap_file("mixed")):
        r = parse(data)
        if r is None:
            continue
        if r.get("pfc"):
            assert r["dmac"] == bytes.fromhex("0180c2000001") and r["opcode"] == 0x0101
            assert r["cev"] == 1 << 3 and r["times"][3] > 0 and len(data) == 60
            seen.add("pfc")
        elif r["op"] == 0x81:
            assert r["becn"] and r["pkey"] == 0xFFFF and r["payload"] == 0
            assert orig == 74
            seen.add("cnp")
        elif r["op"] == 0x11 and (r["aeth"] >> 24) == 0x60:
            seen.add("nak")
        elif r["op"] == 0x11:
            assert (r["aeth"] >> 24) & 0xE0 == 0
            assert orig == 62
    assert seen == {"pfc", "cnp", "nak"}
