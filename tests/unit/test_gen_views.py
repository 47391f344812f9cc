"""Per-node views of the generator (`gen --view node:IP`, `--views DIR`): a view is exactly
the frames of the full pcap whose source or destination IP is the node (PFC frames: the
node's source MAC), as read back by scapy; the views together cover every frame."""
import json
import os

import pytest
from click.testing import CliRunner

from skewscope import gen as skewgen
from skewscope.cli.gen import gen

scapy_all = pytest.importorskip("scapy.all", reason="scapy is the independent reader")

SMALL_V6 = {"nodes": 3, "ip_version": 6, "mtu": 1024, "iterations": 2, "period_ms": 1,
            "workloads": [{"kind": "ring_allreduce", "bytes": "192KiB", "channels": 1}],
            "pathologies": [{"kind": "straggler", "node": 1, "rate_factor": 0.5}]}


def _records(path):
    """[(sec, frac, wirelen, bytes)] of a pcap, by scapy's raw reader."""
    out = []
    with scapy_all.RawPcapReader(path) as r:
        for data, meta in r:
            out.append((meta.sec, meta.usec, meta.wirelen, bytes(data)))
    return out


def _ends(raw, macs):
    """The node(s) a frame belongs to, from scapy's dissection only."""
    e = scapy_all.Ether(raw)
    if e.haslayer(scapy_all.IP):
        return {e[scapy_all.IP].src, e[scapy_all.IP].dst}
    if e.haslayer(scapy_all.IPv6):
        return {e[scapy_all.IPv6].src, e[scapy_all.IPv6].dst}
    assert e.type == 0x8808, f"frame neither IP nor PFC: {e.summary()}"
    return {macs[e.src]}


@pytest.mark.parametrize("scenario, seed", [("mixed", 0), ("vlan-alltoall", 1),
                                            ("tp-decode-slow-shard", 0), (SMALL_V6, 2)])
def test_views_are_the_per_ip_filter_of_the_full_pcap(tmp_path, scenario, seed):
    cap = skewgen.generate(scenario, seed=seed)
    full = str(tmp_path / "full.pcap")
    cap.write_pcap(full, snaplen=128)
    truth = cap.truth
    macs = {n["mac"]: n["ip"] for n in truth["model"]["nodes"]}
    recs = _records(full)
    assert len(recs) == len(cap)
    ends = [_ends(r[3], macs) for r in recs]
    kinds = {len(e) for e in ends}
    covered = [0] * len(recs)
    for ip, v in cap.views().items():
        p = str(tmp_path / f"{ip}.pcap")
        v.write_pcap(p, snaplen=128)
        got = _records(p)
        want = [r for r, e in zip(recs, ends) if ip in e]
        assert got == want, ip
        assert v.truth["view"]["node"] == ip and v.truth["view"]["frames"] == len(want)
        assert {k: x for k, x in v.truth.items() if k != "view"} == truth
        for k, e in enumerate(ends):
            covered[k] += ip in e
    # every frame is in a view: a RoCE/UDP frame in its two ends' views, a PFC frame in one
    assert all(c == len(e) for c, e in zip(covered, ends)) and min(covered) >= 1
    assert 2 in kinds
    if scenario == "mixed":
        assert 1 in kinds, "mixed has PFC frames: each in its sender's view only"


def test_gen_view_and_views_commands(tmp_path):
    cap = skewgen.generate("loss", seed=3)
    ref = tmp_path / "ref"
    ref.mkdir()
    r = CliRunner().invoke(gen, ["loss", "--seed", "3", "--snaplen", "96", "-o",
                                 str(tmp_path / "n2.pcap"), "--view", "node:10.0.0.2"])
    assert r.exit_code == 0, r.output
    assert "the view of node 10.0.0.2" in r.output
    cap.view("10.0.0.2").write_pcap(str(ref / "n2.pcap"), snaplen=96)
    assert _records(str(tmp_path / "n2.pcap")) == _records(str(ref / "n2.pcap"))
    t = json.loads((tmp_path / "n2.truth.json").read_text())
    assert t["view"]["node"] == "10.0.0.2" and t["view"]["of_frames"] == len(cap)
    # by index: the same node
    r = CliRunner().invoke(gen, ["loss", "--seed", "3", "--snaplen", "96", "-o",
                                 str(tmp_path / "i1.pcap"), "--view", "node:1"])
    assert r.exit_code == 0, r.output
    assert _records(str(tmp_path / "i1.pcap")) == _records(str(ref / "n2.pcap"))
    d = tmp_path / "views"
    r = CliRunner().invoke(gen, ["loss", "--seed", "3", "--snaplen", "96", "--views", str(d)])
    assert r.exit_code == 0, r.output
    names = sorted(os.listdir(d))
    ips = [n["ip"] for n in cap.truth["model"]["nodes"]]
    assert names == sorted([f"{ip}.pcap" for ip in ips] + [f"{ip}.truth.json" for ip in ips]
                           + ["truth.json"])
    total = sum(len(_records(str(d / f"{ip}.pcap"))) for ip in ips)
    assert total == 2 * len(cap)  # loss has no PFC/background: every frame in 2 views
    assert json.loads((d / "truth.json").read_text()) == cap.truth
    assert _records(str(d / "10.0.0.2.pcap")) == _records(str(ref / "n2.pcap"))


@pytest.mark.parametrize("args, msg", [
    (["--view", "node:10.9.9.9", "-o", "X"], "is not a node of this scenario"),
    (["--view", "node:7", "-o", "X"], "out of range"),
    (["--view", "10.0.0.2", "-o", "X"], "node:IP"),
    (["--view", "node:10.0.0.2"], "needs -o"),
])
def test_gen_view_errors_are_one_line(tmp_path, args, msg):
    args = [str(tmp_path / "x.pcap") if a == "X" else a for a in args]
    r = CliRunner().invoke(gen, ["loss", *args])
    assert r.exit_code != 0
    assert msg in r.output and "Traceback" not in r.output
    assert not os.path.exists(tmp_path / "x.pcap")


def test_clock_skew_shifts_each_view_by_its_own_fixed_offset(tmp_path):
    cap = skewgen.generate("tp-decode-slow-shard", seed=4)
    offs = []
    for ip in cap.truth["groups"][0]["members"]:
        plain, skew = cap.view(ip), cap.view(ip, clock_skew_us=50)
        off = skew.truth["view"]["clock_offset_ns"]
        assert plain.truth["view"]["clock_offset_ns"] == 0 and abs(off) <= 50_000
        d = skew.timestamps - plain.timestamps
        assert (d == off).all() and len(skew) == len(plain)
        offs.append(off)
    assert len(set(offs)) == len(offs), "each DPU its own offset"
    d = tmp_path / "v"
    r = CliRunner().invoke(gen, ["tp-decode-slow-shard", "--seed", "4", "--snaplen", "64",
                                 "--views", str(d), "--clock-skew", "50"])
    assert r.exit_code == 0, r.output
    for ip, off in zip(cap.truth["groups"][0]["members"], offs):
        t = json.loads((d / f"{ip}.truth.json").read_text())
        assert t["view"]["clock_offset_ns"] == off
        first = _records(str(d / f"{ip}.pcap"))[0]
        t0 = int(cap.view(ip).timestamps[0]) + off
        assert (first[0], first[1]) == (t0 // 10**9, t0 % 10**9)
    r = CliRunner().invoke(gen, ["loss", "-o", str(tmp_path / "y.pcap"), "--clock-skew", "5"])
    assert r.exit_code != 0 and "--clock-skew needs" in r.output
