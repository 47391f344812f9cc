"""`skewscope mirror` on real veths: RoCE crossing one interface is copied to another where
the XDP program counts it -- exactly the RoCE frames, nothing else; `del` removes only
skewscope's filters (a foreign filter on the same hook survives) and the copies stop."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from scapy.all import IP, UDP, Ether, Raw

from skewscope import gen as skewgen
from skewscope.core import layout as L
from skewscope.sources import live

SKEWSCOPE = [sys.executable, "-m", "skewscope.cli"]


def cli(*args, check=True):
    p = subprocess.run(SKEWSCOPE + list(args), capture_output=True, text=True, timeout=60)
    if check:
        assert p.returncode == 0, p.stderr
    return p


@pytest.fixture(scope="module")
def roce_frames():
    cap = skewgen.generate("loss", seed=3)
    frames = [f for _, f in cap.frames_iter()][:600]
    return frames


def test_mirror_copies_roce_to_the_capture_interface_and_del_removes_it(netns_pair, roce_frames):
    p = netns_pair
    ns = p.ns_b
    p.set_mtu(9000)
    p.run("b", "ip", "link", "add", "mir0", "mtu", "9000", "type", "veth", "peer", "name", "mir1", "mtu", "9000")
    p.run("b", "ip", "link", "set", "mir0", "up")
    p.run("b", "ip", "link", "set", "mir1", "up")
    # somebody else's filter on the same hook: must survive our del
    p.run("b", "tc", "qdisc", "add", "dev", p.if_b, "clsact")
    p.run("b", "tc", "filter", "add", "dev", p.if_b, "ingress", "prio", "7", "protocol", "ip", "u32",
          "match", "ip", "protocol", "6", "0xff", "classid", "1:1")

    noise = [bytes(Ether() / IP(src="10.0.0.1", dst="10.0.0.2") / UDP(dport=53) / Raw(b"x" * 60))] * 50
    with p.enter("b"):
        sess = live.LiveSession("mir1", xdp_mode="native").open()
    try:
        out = cli("mirror", "add", "--from", p.if_b, "--to", "mir0", "--netns", ns)
        assert "mirroring RoCE ingress" in out.stdout
        sent = p.send("a", roce_frames + noise)
        assert sent == len(roce_frames) + len(noise)
        with p.enter("b"):
            g = sess.dp.read_globals()
        assert int(g[L.G_ACCOUNTED]) == len(roce_frames)       # every RoCE frame, once
        assert int(g[L.G_FRAMES]) == len(roce_frames)          # and nothing that is not RoCE
        lst = json.loads(cli("mirror", "list", "--from", p.if_b, "--json", "--netns", ns).stdout)
        v4 = [m for m in lst if m["protocol"] == "ip"]
        assert len(lst) == 3 and v4[0]["to"] == "mir0" and v4[0]["packets"] == len(roce_frames)

        out = cli("mirror", "del", "--from", p.if_b, "--netns", ns)
        assert "removed 3 mirror filter(s)" in out.stdout
        p.send("a", roce_frames[:100])
        with p.enter("b"):
            g2 = sess.dp.read_globals()
        assert int(g2[L.G_FRAMES]) == len(roce_frames)          # no more copies
        flt = p.run("b", "tc", "filter", "show", "dev", p.if_b, "ingress").stdout
        assert "pref 7 " in flt and "736b657773636f7065" not in flt and "pref 4937" not in flt
        assert "no skewscope mirror" in cli("mirror", "list", "--netns", ns).stdout
        # del again: nothing of ours left, says so, exit 0
        assert "no skewscope mirror" in cli("mirror", "del", "--from", p.if_b, "--netns", ns).stdout
    finally:
        with p.enter("b"):
            sess.close()


def test_mirror_both_directions_and_qdisc_removed_when_we_made_it_empty(netns_pair, roce_frames):
    p = netns_pair
    ns = p.ns_b
    p.set_mtu(9000)
    p.run("b", "ip", "link", "add", "mir0", "mtu", "9000", "type", "veth", "peer", "name", "mir1", "mtu", "9000")
    p.run("b", "ip", "link", "set", "mir0", "up")
    p.run("b", "ip", "link", "set", "mir1", "up")
    cli("mirror", "add", "--from", p.if_b, "--to", "mir0", "--direction", "both", "--netns", ns)
    again = cli("mirror", "add", "--from", p.if_b, "--to", "mir0", "--direction", "both", "--netns", ns)
    assert "already mirroring" in again.stdout                      # idempotent
    with p.enter("b"):
        sess = live.LiveSession("mir1", xdp_mode="generic").open()
    try:
        p.send("a", roce_frames[:200])
        # egress of if_b: frames sent from ns_b out of if_b
        p.send("b", roce_frames[200:300])
        with p.enter("b"):
            g = sess.dp.read_globals()
        assert int(g[L.G_ACCOUNTED]) == 300
    finally:
        with p.enter("b"):
            sess.close()
    cli("mirror", "del", "--from", p.if_b, "--netns", ns)
    assert "clsact" not in p.run("b", "tc", "qdisc", "show", "dev", p.if_b).stdout


def test_skip_sw_on_a_nic_without_offload_refuses_and_leaves_nothing(netns_pair):
    p = netns_pair
    r = cli("mirror", "add", "--from", p.if_b, "--to", "lo", "--skip-sw", "--netns", p.ns_b, check=False)
    assert r.returncode == 8 and "nothing would be copied" in r.stderr
    assert "clsact" not in p.run("b", "tc", "qdisc", "show", "dev", p.if_b).stdout
