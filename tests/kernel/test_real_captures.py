"""Kernel tier: the real captures in ../shared/data/real replayed through the BPF program.

Ground truth: the captures' README (what it states), and tshark for per-flow packet/byte/
payload sums (payload = UDP length - 8 - BTH - extension headers of the opcode (from
tests/frames.py's own table) - PadCnt - ICRC, opcode/QP/PadCnt read from the UDP payload
bytes tshark prints). Every file is replayed through both entry points.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from collections import defaultdict

import frames as F
import pytest
from frames import REAL_DATA

WRITE_PAIR = "softroce_write_pair__headers128.pcap"
READ_PAIR = "softroce_read_pair__headers128.pcap"
OFERBY = "oferby_proxy__roce.pcap"
SMB = "metzmacher_smbdirect_roce_interop__8pkts_DERIVED.pcap"
SCAPY = "scapy_roce_uts__3pkts_DERIVED.pcap"
ERF = "srinivaskoritala_rdma-softroce-demo__infiniband_ERF_nativeIB.pcap"
ETHERNET_FILES = [OFERBY, SMB, SCAPY, WRITE_PAIR, READ_PAIR]

pytestmark = pytest.mark.skipif(not REAL_DATA.is_dir(), reason=f"real captures not found at {REAL_DATA}")


@pytest.fixture(scope="module")
def replays():
    from skewscope.sources.replay import replay
    cache = {}

    def get(name, entry="xdp"):
        if (name, entry) not in cache:
            cache[(name, entry)] = replay(str(REAL_DATA / name), entry=entry, max_flows=1024, ev_per_cpu=4096)
        return cache[(name, entry)]
    return get


def flow_by(snap, **want):
    from skewscope.core.snapshot import ip_str
    rows = []
    for f in snap.flows:
        d = {"src": ip_str(f["src"], f["ipver"]), "dst": ip_str(f["dst"], f["ipver"]), "qp": int(f["dest_qp"])}
        if all(d[k] == v for k, v in want.items()):
            rows.append(f)
    assert len(rows) == 1, f"{want}: {len(rows)} flows"
    return rows[0]


def hist(row) -> dict:
    return {(0 if i == 0 else 1 << (i - 1)): int(c) for i, c in enumerate(row) if c}


def opclasses(row) -> dict:
    from skewscope.core import layout as L
    return {n: int(row["op"][i]) for i, n in enumerate(L.OPCLASS_NAMES) if row["op"][i]}


def cats(snap) -> dict:
    return {k: v for k, v in snap.category_counts().items() if v}


def tshark_truth(path) -> dict:
    """Per (src, dst, dest QP): packets, wire bytes, payload bytes, from tshark's fields."""
    assert shutil.which("tshark"), "tshark not found: `make setup` installs it"
    out = subprocess.run(["tshark", "-r", str(path), "-Y", "udp.dstport == 4791", "-T", "fields", "-E", "separator=,",
                          "-e", "frame.len", "-e", "ip.src", "-e", "ip.dst", "-e", "ipv6.src", "-e", "ipv6.dst",
                          "-e", "udp.length", "-e", "udp.payload"], check=True, capture_output=True, text=True).stdout
    truth: dict = defaultdict(lambda: {"packets": 0, "bytes": 0, "payload_bytes": 0})
    for line in out.splitlines():
        flen, s4, d4, s6, d6, ulen, pl = line.split(",")
        b = bytes.fromhex(pl.replace(":", ""))
        op, pad, qp = b[0], (b[1] >> 4) & 3, int.from_bytes(b[5:8], "big")
        t = truth[(s4 or s6, d4 or d6, qp)]
        t["packets"] += 1
        t["bytes"] += int(flen)
        t["payload_bytes"] += int(ulen) - 8 - 12 - F.ext_len(op) - pad - 4
    return dict(truth)


@pytest.mark.parametrize("entry", ["xdp", "tc"])
@pytest.mark.parametrize("name", [OFERBY, SMB, WRITE_PAIR, READ_PAIR])
def test_per_flow_sums_match_tshark(replays, name, entry):
    snap = replays(name, entry)
    truth = tshark_truth(REAL_DATA / name)
    assert len(snap.flows) == len(truth)
    for (src, dst, qp), t in truth.items():
        f = flow_by(snap, src=src, dst=dst, qp=qp)
        assert {k: int(f[k]) for k in t} == t, (src, dst, qp)


@pytest.mark.parametrize("entry", ["xdp", "tc"])
def test_oferby_huawei_capture(replays, entry):
    from skewscope.core import layout as L
    snap = replays(OFERBY, entry)
    assert snap.meta["frames"] == 123
    assert cats(snap) == {"accounted": 105, "non_roce": 18}   # 10 TCP, 4 ARP, 4 IPv6/ICMPv6
    qp45 = [f for f in snap.flows if int(f["dest_qp"]) == 0x45]
    qp48 = [f for f in snap.flows if int(f["dest_qp"]) == 0x48]
    assert len(qp45) == 1 and len(qp48) == 1
    a, b = qp45[0], qp48[0]
    assert int(a["packets"]) == 68 and (int(a["psn_gaps"]), int(a["retransmissions"])) == (0, 0)
    assert int(b["packets"]) == 37
    total = {k: sum(opclasses(f).get(k, 0) for f in snap.flows) for k in ("send", "ack")}
    assert total == {"send": 33 + 33 + 2, "ack": 37}
    assert sum(int(f["acks"]) for f in snap.flows) == 37          # syndromes 0x05/0x06: ACKs
    assert sum(int(f["nak_seq"] + f["nak_rnr"] + f["nak_other"]) for f in snap.flows) == 0
    assert sum(int(f["messages"]) for f in snap.flows) == 33 + 2  # SEND_FIRST + SEND_ONLY_IMM
    assert len(snap.events) == 35 and snap.globals[L.G_MSG_PARTIAL] == 0  # every SEND completes
    for f in snap.flows:                                          # every packet ECT(0), none CE
        assert (int(f["ecn_capable"]), int(f["ce"])) == (int(f["packets"]), 0)
        assert int(f["tclass"]) & 3 == 2
    assert sorted(int(f["sport"]) for f in snap.flows) == [69, 72]


@pytest.mark.parametrize("entry", ["xdp", "tc"])
def test_smbdirect_capture(replays, entry):
    snap = replays(SMB, entry)
    assert cats(snap) == {"accounted": 8}
    assert sum(int(f["packets"]) for f in snap.flows if int(f["dest_qp"]) == 1) == 3   # UD to QP 1
    assert {int(f["dest_qp"]) for f in snap.flows} == {1, 0x19, 0x58}
    for f in snap.flows:
        assert opclasses(f) == {"send": int(f["packets"])}
        assert int(f["messages"]) == int(f["packets"])       # all SEND_ONLY
        assert (int(f["ecn_capable"]), int(f["psn_gaps"]), int(f["retransmissions"])) == (0, 0, 0)
    assert len(snap.events) == 8


@pytest.mark.parametrize("entry", ["xdp", "tc"])
def test_scapy_uts_cnp_and_rocev1(replays, entry):
    snap = replays(SCAPY, entry)
    assert cats(snap) == {"accounted": 3}
    cnp = [f for f in snap.flows if int(f["dest_qp"]) == 0x118]
    assert len(cnp) == 1
    c = cnp[0]
    assert (int(c["cnp"]), int(c["becn"]), int(c["packets"]), int(c["payload_bytes"])) == (1, 1, 1, 0)
    assert (int(c["tclass"]), int(c["sport"]), int(c["roce"])) == (0xC2, 0, 2)
    v1 = [f for f in snap.flows if int(f["roce"]) == 1]
    assert len(v1) == 2 and all(int(f["ipver"]) == 6 for f in v1)
    w = [f for f in v1 if opclasses(f) == {"write": 1}][0]
    assert hist(w["msg_hist"]) == {4: 1} and int(w["msg_bytes"]) == 5   # RETH DMA length 5
    assert int(w["payload_bytes"]) == 5                                 # GRH length 40 - 12 - 16 - pad 3 - 4
    ack = [f for f in v1 if opclasses(f) == {"ack": 1}][0]
    assert int(ack["acks"]) == 1 and int(ack["dest_qp"]) == 0x109


@pytest.mark.parametrize("entry", ["xdp", "tc"])
def test_softroce_write_pair(replays, entry):
    snap = replays(WRITE_PAIR, entry)
    assert snap.meta["frames"] == 1742 and snap.meta["padded_records"] > 1500
    assert cats(snap) == {"accounted": 1700, "non_roce": 42}
    d = flow_by(snap, src="10.77.0.1", dst="10.77.0.2", qp=17)
    assert (int(d["packets"]), int(d["payload_bytes"]), int(d["messages"])) == (1600, 6_553_600, 100)
    assert opclasses(d) == {"write": 1600} and hist(d["msg_hist"]) == {65536: 100}
    assert (int(d["psn_gaps"]), int(d["retransmissions"])) == (0, 0)   # PSNs start at random: no gap
    a = flow_by(snap, src="10.77.0.2", dst="10.77.0.1", qp=17)
    assert (int(a["packets"]), int(a["acks"]), opclasses(a)) == (100, 100, {"ack": 100})
    assert len(snap.events) == 100 and all(int(e["bytes"]) == 65536 for e in snap.events)
    assert all(int(e["end_ts"]) >= int(e["start_ts"]) for e in snap.events)


@pytest.mark.parametrize("entry", ["xdp", "tc"])
def test_softroce_read_pair(replays, entry):
    snap = replays(READ_PAIR, entry)
    assert cats(snap) == {"accounted": 1700, "non_roce": 42}
    req = flow_by(snap, src="10.77.0.1", dst="10.77.0.2", qp=17)
    assert opclasses(req) == {"read_request": 100} and int(req["messages"]) == 100
    assert hist(req["msg_hist"]) == {65536: 100}
    # READ responses consume the requester's PSN space: consecutive requests jump, no gap
    assert (int(req["psn_gaps"]), int(req["retransmissions"])) == (0, 0)
    resp = flow_by(snap, src="10.77.0.2", dst="10.77.0.1", qp=17)
    assert (int(resp["packets"]), int(resp["payload_bytes"])) == (1600, 6_553_600)
    assert opclasses(resp) == {"read_response": 1600} and int(resp["messages"]) == 0
    assert len(snap.events) == 100
    assert all(int(e["bytes"]) == 65536 and int(e["start_ts"]) == int(e["end_ts"]) for e in snap.events)


def test_entries_agree_on_real_captures(replays):
    import numpy as np
    for name in ETHERNET_FILES:
        x, t = replays(name, "xdp"), replays(name, "tc")
        assert np.array_equal(x.flows, t.flows), name
        assert np.array_equal(x.events, t.events), name
        assert np.array_equal(x.globals, t.globals), name


def test_erf_capture_is_refused_by_replay(tmp_path):
    """Native InfiniBand (ERF, link type 197): one clear line on stderr, non-zero exit, no
    traceback, no output file."""
    out = tmp_path / "x.snap"
    p = subprocess.run([sys.executable, "-m", "skewscope.cli", "replay", str(REAL_DATA / ERF), "-o", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 3, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in p.stderr
    assert "link type 197" in lines[0] and "ERF" in lines[0]
    assert not out.exists()
