"""Kernel tier: `skewscope replay` (pcap -> BPF_PROG_TEST_RUN -> Snapshot).

Captures are written here byte by byte (pcap / pcapng headers per the file-format specs),
so record lengths, snap lengths and timestamps are known exactly.
"""
from __future__ import annotations

import json
import struct
import subprocess
import sys

import frames as F
import pytest


def pcap_bytes(records, linktype=1, nanos=False, snaplen=65535) -> bytes:
    """records: (ts_ns, data, orig_len)."""
    magic = 0xA1B23C4D if nanos else 0xA1B2C3D4
    out = [struct.pack("<IHHiIII", magic, 2, 4, 0, 0, snaplen, linktype)]
    for ts, data, orig in records:
        sec, rest = divmod(ts, 1_000_000_000)
        frac = rest if nanos else rest // 1000
        out.append(struct.pack("<IIII", sec, frac, len(data), orig) + data)
    return b"".join(out)


def pcapng_bytes(records, linktype=1, tsresol=9) -> bytes:
    def block(btype, body):
        body += bytes((-len(body)) % 4)
        n = 12 + len(body)
        return struct.pack("<II", btype, n) + body + struct.pack("<I", n)
    shb = block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1))
    opt = struct.pack("<HHB3x", 9, 1, tsresol) + struct.pack("<HH", 0, 0)
    idb = block(1, struct.pack("<HHI", linktype, 0, 0) + opt)
    epbs = []
    for ts, data, orig in records:
        ticks = ts if tsresol == 9 else ts // 1000
        epbs.append(block(6, struct.pack("<IIIII", 0, ticks >> 32, ticks & 0xFFFFFFFF, len(data), orig) + data))
    return shb + idb + b"".join(epbs)


def cats(snap) -> dict:
    return {k: v for k, v in snap.category_counts().items() if v}


@pytest.fixture(params=["xdp", "tc"])
def entry(request):
    return request.param


def _replay(path, entry):
    from skewscope.sources.replay import replay
    return replay(str(path), entry=entry, max_flows=256, ev_per_cpu=1024)


def test_snaplen_cut_records_are_never_parsed_from_padding(tmp_path, entry):
    """Records cut inside a header count as truncated_<that header> although replay pads
    them back to their original length with zeros (zeros that would parse: EtherType 0 is
    not IP, but a zero BTH is a valid SEND_FIRST to QP 0). Cut after the headers: accounted
    with the original length."""
    w = F.roce(0x06, payload=3000, dma_len=65536, psn=5, vlans=(7,))
    bounds = dict((name, off) for off, name in F.header_boundaries(w))  # name -> start (last wins)
    cuts = {  # captured length -> category
        10: "truncated_eth",
        bounds["vlan"] + 2: "truncated_vlan",
        bounds["ip"] + 19: "truncated_ip",
        bounds["udp"] + 7: "truncated_udp",
        bounds["bth"]: "truncated_bth",          # cut exactly where the BTH starts
        bounds["bth"] + 11: "truncated_bth",
        bounds["ext"] + 15: "truncated_ext",
        bounds["end"]: "accounted",
        128: "accounted",
    }
    recs = [(1_000_000_000 + i * 1000, w.frame[:c], len(w)) for i, c in enumerate(cuts)]
    p = tmp_path / "cut.pcap"
    p.write_bytes(pcap_bytes(recs, nanos=True))
    snap = _replay(p, entry)
    want: dict = {}
    for c in cuts.values():
        want[c] = want.get(c, 0) + 1
    assert cats(snap) == want
    # the record shorter than an Ethernet header is counted by replay itself, not run
    assert snap.meta["padded_records"] == len(cuts) - 1 and snap.meta["too_short_for_test_run"] == 1
    (f,) = snap.flows
    assert int(f["dest_qp"]) == w.qp and int(f["packets"]) == 2
    assert int(f["bytes"]) == 2 * len(w) and int(f["payload_bytes"]) == 2 * 3000
    assert int(f["first_ts"]) == recs[-2][0] and int(f["last_ts"]) == recs[-1][0]


def test_timestamps_and_message_records_from_the_capture(tmp_path, entry):
    """pcap (µs) and pcapng (ns) timestamps become the flow/record times, exactly."""
    chain = [F.roce(0x06, payload=1024, dma_len=2048, psn=0), F.roce(0x08, payload=1024, psn=1),
             F.roce(0x0B, payload=64, dma_len=64, psn=2)]
    ts = [1_700_000_000_123_456_789, 1_700_000_000_123_556_789, 1_700_000_001_000_000_001]
    for kind in ("pcap_us", "pcapng_ns"):
        if kind == "pcap_us":
            data = pcap_bytes([(t, b.frame, len(b)) for t, b in zip(ts, chain)])
            exp = [t // 1000 * 1000 for t in ts]
        else:
            data = pcapng_bytes([(t, b.frame, len(b)) for t, b in zip(ts, chain)])
            exp = ts
        p = tmp_path / f"{kind}.cap"
        p.write_bytes(data)
        snap = _replay(p, entry)
        (f,) = snap.flows
        assert (int(f["first_ts"]), int(f["last_ts"])) == (exp[0], exp[2])
        ev = [(int(e["start_ts"]), int(e["end_ts"]), int(e["bytes"])) for e in snap.events]
        assert ev == [(exp[0], exp[1], 2048), (exp[2], exp[2], 64)]
        assert snap.meta["clock"] == "pcap" and snap.meta["first_ts"] == exp[0]


def test_jumbo_capture_through_both_entries(tmp_path, entry):
    """IB MTU 4096 frames (4154/4170 bytes) replay through TC too (handed over cut, with
    their original length), with the same tables as XDP."""
    built = [F.roce(0x06, payload=4096, dma_len=3 * 4096, psn=0), F.roce(0x07, payload=4096, psn=1),
             F.roce(0x08, payload=4096, psn=2)]
    p = tmp_path / "jumbo.pcap"
    p.write_bytes(pcap_bytes([(i * 1000, b.frame, len(b)) for i, b in enumerate(built)]))
    snap = _replay(p, entry)
    (f,) = snap.flows
    assert (int(f["bytes"]), int(f["payload_bytes"]), int(f["messages"])) == (4170 + 2 * 4154, 3 * 4096, 1)
    assert cats(snap) == {"accounted": 3}


def test_linux_cooked_and_raw_ip_captures(tmp_path, entry):
    """Link types 113 (SLL), 276 (SLL2), 101 (raw IP): turned into Ethernet frames with a
    synthesised 14-byte header, so `bytes` counts 14 bytes of L2 (docs/datapath.md)."""
    b = F.roce(0x0A, payload=200, dma_len=200)
    ip = b.frame[14:]
    sll = struct.pack(">HHHQH", 0, 1, 6, 0, 0x0800) + ip
    sll2 = struct.pack(">HHIHBB8s", 0x0800, 0, 2, 1, 0, 6, bytes(8)) + ip
    for lt, data in ((113, sll), (276, sll2), (101, ip)):
        p = tmp_path / f"lt{lt}.pcap"
        p.write_bytes(pcap_bytes([(0, data, len(data))], linktype=lt))
        snap = _replay(p, entry)
        (f,) = snap.flows
        assert (int(f["bytes"]), int(f["payload_bytes"])) == (len(b), 200), lt


def _cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "skewscope.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_cli_replay_then_report_json(tmp_path):
    built = [F.roce(0x0A, payload=100, dma_len=100, psn=i, qp=0x45) for i in range(3)] + [F.arp()]
    p = tmp_path / "t.pcap"
    p.write_bytes(pcap_bytes([(i * 1000, b.frame, len(b)) for i, b in enumerate(built)]))
    out = tmp_path / "t.snap"
    r = _cli("replay", str(p), "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert "replayed 4 frames" in r.stdout
    r = _cli("report", str(out), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["totals"]["packets_seen"] == 4 and doc["totals"]["roce_packets"] == 3
    assert doc["totals"]["non_roce_packets"] == 1
    (fl,) = doc["flows"]
    assert (fl["src"], fl["dst"], fl["dest_qp"], fl["packets"], fl["payload_bytes"]) == \
        ("10.0.0.1", "10.0.0.2", 0x45, 3, 300)
    assert fl["msg_size_hist"] == [[64, 3]]


@pytest.mark.parametrize("content,needle", [
    (b"", "empty"),
    (b"hello, not a capture at all", "not a pcap"),
    (pcap_bytes([(0, bytes(60), 60)])[:30], "truncated"),
    (pcap_bytes([(0, bytes(60), 60)], linktype=197), "link type 197"),
])
def test_cli_replay_bad_input_is_one_line(tmp_path, content, needle):
    p = tmp_path / "bad.pcap"
    p.write_bytes(content)
    out = tmp_path / "o.snap"
    r = _cli("replay", str(p), "-o", str(out))
    assert r.returncode == 3, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert needle in r.stderr
    assert not out.exists()


def test_cli_replay_missing_file(tmp_path):
    r = _cli("replay", str(tmp_path / "nope.pcap"), "-o", str(tmp_path / "o.snap"))
    assert r.returncode != 0 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_pcapng_with_an_unsupported_interface_is_replayed_with_a_warning(tmp_path):
    """A pcapng mixing an Ethernet and an ERF (197) interface: the ERF interface's packets
    are skipped with one warning line (as `skewscope report` does: the same reader), the
    Ethernet ones replayed; a damaged capture is still refused (exit 3, one line)."""
    def block(btype, body):
        body += bytes((-len(body)) % 4)
        n = 12 + len(body)
        return struct.pack("<II", btype, n) + body + struct.pack("<I", n)

    def epb(iface, ts, frame):
        return block(6, struct.pack("<IIIII", iface, ts >> 32, ts & 0xFFFFFFFF, len(frame), len(frame)) + frame)

    built = [F.roce(0x0A, payload=100, dma_len=100, psn=i, qp=0x45) for i in range(3)]
    parts = [block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1)),
             block(1, struct.pack("<HHI", 1, 0, 0)), block(1, struct.pack("<HHI", 197, 0, 0))]
    for i, b in enumerate(built):
        parts += [epb(0, 1000 + i, b.frame), epb(1, 2000 + i, bytes(40))]
    p = tmp_path / "mixed.pcapng"
    p.write_bytes(b"".join(parts))
    out = tmp_path / "m.snap"
    r = _cli("replay", str(p), "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert "replayed 3 frames" in r.stdout
    (line,) = r.stderr.strip().splitlines()
    assert "warning" in line and "skipped 3 packets" in line and "197" in line, line
    r = _cli("report", str(out), "--json")
    doc = json.loads(r.stdout)
    (fl,) = doc["flows"]
    assert (fl["packets"], fl["payload_bytes"], fl["dest_qp"]) == (3, 300, 0x45)
    assert doc["meta"]["warnings"] == [line.split("warning: ", 1)[1]]
    cut = tmp_path / "cut.pcapng"
    cut.write_bytes(p.read_bytes()[:-10])
    r = _cli("replay", str(cut), "-o", str(tmp_path / "c.snap"))
    assert r.returncode == 3 and len(r.stderr.strip().splitlines()) == 1 and "truncated" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "c.snap").exists()
