"""Real RoCE captures (../shared/data/real, README there): the analysis must give the
sensible reading of each, checked against the README's independent description."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from skewscope.analysis import analyze, context, node_matrix
from skewscope.analysis.flows import ROLE_NAMES
from skewscope.cli import main
from skewscope.cli.common import load_source
from skewscope.core.snapshot import ip_str

REAL = Path(__file__).resolve().parents[2].parent / "shared/data/real"
pytestmark = pytest.mark.skipif(not REAL.is_dir(), reason=f"{REAL} not present")


def load(name):
    snap = load_source(str(REAL / name))
    return snap, analyze(snap)


def roles(snap):
    ctx = context(snap)
    out = {}
    for i, f in enumerate(snap.flows):
        out[(ip_str(f["src"], f["ipver"]), ip_str(f["dst"], f["ipver"]), int(f["dest_qp"]))] = ROLE_NAMES[ctx.roles[i]]
    return out


def no_alarm(an):
    return [(f["kind"], f["message"]) for f in an["findings"] if f["severity"] != "info"]


def test_softroce_write_pair():
    snap, an = load("softroce_write_pair__headers128.pcap")
    r = roles(snap)
    assert r == {("10.77.0.1", "10.77.0.2", 17): "data", ("10.77.0.2", "10.77.0.1", 17): "ack"}
    ctx = context(snap)
    d = [i for i in range(len(snap.flows)) if ctx.roles[i] == 0][0]
    assert ctx.partner[d] >= 0 and ROLE_NAMES[ctx.roles[ctx.partner[d]]] == "ack"
    ips, m = node_matrix(snap)
    assert m[ips.index("10.77.0.1"), ips.index("10.77.0.2")] == 6_553_600 and m.sum() == 6_553_600
    g = an["collectives"]
    assert len(g) == 1 and g[0]["kind"] == "p2p" and g[0]["members"] == ["10.77.0.1", "10.77.0.2"]
    assert g[0]["metrics"]["message_sizes"][0] == [65536, 100]
    assert ctx.fstat["mtu"][d] == 4096                       # README: IB MTU 4096
    assert not no_alarm(an), no_alarm(an)
    # rxe/VM capture: a third of the 16-packet writes carry a single timestamp: said so
    assert any(f["kind"] == "sampling" and "one timestamp" in f["message"] for f in an["findings"])
    assert an["timing"] is None                              # a perftest pair has no collective rhythm


def test_softroce_read_pair():
    snap, an = load("softroce_read_pair__headers128.pcap")
    r = roles(snap)
    assert r == {("10.77.0.1", "10.77.0.2", 17): "read_request", ("10.77.0.2", "10.77.0.1", 17): "data"}
    ips, m = node_matrix(snap)
    # the data flows from the responder back to the requester
    assert m[ips.index("10.77.0.2"), ips.index("10.77.0.1")] == 6_553_600 and m.sum() == 6_553_600
    assert an["collectives"][0]["members"] == ["10.77.0.2", "10.77.0.1"]
    assert not no_alarm(an)


def test_huawei_send_capture():
    snap, an = load("oferby_proxy__roce.pcap")
    r = roles(snap)
    # QP 0x45 carries the SEND messages; QP 0x48 the coalesced ACKs (and one SEND back)
    assert r[("192.168.70.6", "192.168.70.4", 0x45)] == "data"
    assert an["collectives"][0]["kind"] == "p2p"
    assert an["metrics"]["congestion"]["ce_packets"] == 0       # every packet ECT(0), none CE
    assert not no_alarm(an)


def test_smbdirect_connection_management():
    snap, an = load("metzmacher_smbdirect_roce_interop__8pkts_DERIVED.pcap")
    r = roles(snap)
    assert {k: v for k, v in r.items() if k[2] == 1} and all(v == "management" for k, v in r.items() if k[2] == 1)
    assert all(v == "data" for k, v in r.items() if k[2] in (0x19, 0x58))
    assert not no_alarm(an)


def test_scapy_cnp_and_rocev1():
    snap, an = load("scapy_roce_uts__3pkts_DERIVED.pcap")
    r = roles(snap)
    assert r[("10.0.17.1", "10.0.18.1", 0x118)] == "cnp"
    assert sorted(v for k, v in r.items() if k[2] != 0x118) == ["ack", "data"]
    assert an["metrics"]["congestion"]["cnp_packets"] == 1
    assert not no_alarm(an)                                     # one CNP is no storm


def test_native_infiniband_refused_with_one_line():
    r = CliRunner().invoke(main, ["diagnose", str(REAL / "srinivaskoritala_rdma-softroce-demo__infiniband_ERF_nativeIB.pcap")])
    assert r.exit_code == 3
    assert "link type" in r.output and r.output.strip().count("\n") == 0


@pytest.mark.parametrize("name", ["softroce_write_pair__headers128.pcap", "softroce_read_pair__headers128.pcap",
                                  "oferby_proxy__roce.pcap", "metzmacher_smbdirect_roce_interop__8pkts_DERIVED.pcap",
                                  "scapy_roce_uts__3pkts_DERIVED.pcap"])
def test_diagnose_healthy_real(name):
    r = CliRunner().invoke(main, ["diagnose", str(REAL / name), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["status"] == "healthy"
