"""Integration tier: the data plane attached to a real veth, real frames through it.

Two namespaces joined by veth (skewscope/testbed/netns.py); the program is attached to `if_b` (in ns b)
with XDP (native, generic) or TC (ingress, egress); frames are injected with AF_PACKET from
the other end (or, for egress, sent out of if_b itself). Expected counts come from the frames
as built (tests/frames.py). IPv6 is off in the namespaces, so nothing else crosses the link
unless a test sends it (ping).
"""
from __future__ import annotations

import time

import frames as F
import numpy as np
import pytest

SETTLE_S = 0.3


@pytest.fixture(scope="module")
def dp():
    from skewscope.bpf.loader import Config, Dataplane
    d = Dataplane(Config(max_flows=1024, ev_per_cpu=1024))
    try:
        yield d
    finally:
        d.close()


ATTACH = {
    "xdp_native": dict(mode="xdp", xdp_mode="native"),
    "xdp_generic": dict(mode="xdp", xdp_mode="generic"),
    "tc_ingress": dict(mode="tc", direction="ingress"),
    "tc_egress": dict(mode="tc", direction="egress"),
}


def attach(dp, pair, how):
    from skewscope.bpf.attach import Attachment
    with pair.enter("b"):
        return Attachment(dp, pair.if_b, **ATTACH[how]).attach()


def sender(how):
    """Where frames must come from to pass the hook: egress sees what b sends."""
    return "b" if how == "tc_egress" else "a"


def stream():
    out = []
    for i in range(40):
        out.append(F.roce(0x06, payload=1024, dma_len=3072, psn=3 * i, qp=0x21, tclass=0x02 | (i % 2)))
        out.append(F.roce(0x07, payload=1024, psn=3 * i + 1, qp=0x21))
        out.append(F.roce(0x09, payload=1024, psn=3 * i + 2, qp=0x21, imm=3072))
        out.append(F.roce(0x11, src="10.0.0.2", dst="10.0.0.1", qp=0x22, syndrome=0 if i % 5 else 0x60, psn=i))
        out.append(F.roce(0x0A, payload=64, dma_len=64, src="fd00::2", dst="fd00::1", qp=0x23, psn=i, vlans=(5,)))
    out += [F.roce(0x81, src="10.0.0.2", dst="10.0.0.1", qp=0x22) for _ in range(3)]
    out += [F.roce(0x04, payload=40, v1=True, src="fe80::1", dst="fe80::2", qp=0x24, psn=i) for i in range(4)]
    out += [F.arp(), F.tcp(), F.udp(dport=4792), F.pfc(0x01, [9] + [0] * 7)]
    return out


def expected(built):
    flows: dict = {}
    for b in built:
        if b.kind != "roce":
            continue
        e = flows.setdefault(b.key, {"packets": 0, "bytes": 0, "payload_bytes": 0})
        e["packets"] += 1
        e["bytes"] += len(b)
        e["payload_bytes"] += b.payload
    return flows


def flows_by_key(snap):
    out = {}
    for f in snap.flows:
        k = (bytes(f["src"]), bytes(f["dst"]), int(f["dest_qp"]), int(f["ipver"]), int(f["roce"]))
        out[k] = f
    return out


def cats(snap):
    return {k: v for k, v in snap.category_counts().items() if v}


@pytest.mark.parametrize("how", sorted(ATTACH))
def test_per_flow_counts_exact(dp, netns_pair, how):
    built = stream()
    dp.reset()
    att = attach(dp, netns_pair, how)
    try:
        assert netns_pair.send(sender(how), built) == len(built)
        time.sleep(SETTLE_S)
        snap = dp.snapshot({"source": "test"})
    finally:
        att.detach()
    exp = expected(built)
    got = flows_by_key(snap)
    assert set(got) == set(exp)
    for k, e in exp.items():
        assert {n: int(got[k][n]) for n in e} == e
    n_roce = sum(b.kind == "roce" for b in built)
    assert cats(snap) == {"accounted": n_roce, "non_roce": 3, "pfc": 1}
    w = got[F.key_of("10.0.0.1", "10.0.0.2", 0x21, 4)]
    assert (int(w["messages"]), int(w["psn_gaps"]), int(w["retransmissions"]), int(w["ce"])) == (40, 0, 0, 20)
    a = got[F.key_of("10.0.0.2", "10.0.0.1", 0x22, 4)]
    assert (int(a["acks"]), int(a["nak_seq"]), int(a["cnp"])) == (32, 8, 3)
    ev = snap.events
    assert len(ev) == 40 + 40 + 4 and (ev["bytes"] == 3072).sum() == 40
    # live clock: CLOCK_MONOTONIC ns, inside the run
    now = time.monotonic_ns()
    assert all(now - 60e9 < int(f["first_ts"]) <= int(f["last_ts"]) <= now for f in snap.flows)


@pytest.mark.parametrize("how", ["xdp_native", "xdp_generic", "tc_ingress", "tc_egress"])
def test_jumbo_frames(dp, netns_pair, how):
    """IB MTU 4096 on a 9000-byte-MTU link: XDP with frags counts the whole multi-buffer
    frame; TC pulls the headers of AF_PACKET's non-linear skbs (14-byte linear part for
    frames of a page or more) instead of calling them truncated."""
    netns_pair.set_mtu(9000)
    n = 8
    built = [F.roce(0x06, payload=4096, dma_len=n * 4096, psn=0)]
    built += [F.roce(0x07, payload=4096, psn=i) for i in range(1, n - 1)]
    built += [F.roce(0x09, payload=4096, psn=n - 1)]
    built += [F.roce(0x0A, payload=8900, dma_len=8900, psn=n, qp=0x31)]
    dp.reset()
    att = attach(dp, netns_pair, how)
    try:
        assert netns_pair.send(sender(how), built) == len(built)
        time.sleep(SETTLE_S)
        snap = dp.snapshot({"source": "test"})
    finally:
        att.detach()
    assert cats(snap) == {"accounted": len(built)}
    got = flows_by_key(snap)
    for k, e in expected(built).items():
        assert {x: int(got[k][x]) for x in e} == e
    f = got[built[0].key]
    assert (int(f["messages"]), int(f["msg_bytes"]), len(snap.events)) == (1, n * 4096, 2)


@pytest.mark.parametrize("how", ["xdp_native", "xdp_generic", "tc_ingress"])
def test_vlan_tags_on_the_wire(dp, netns_pair, how):
    """On ingress the stack moves the outer tag into skb metadata before TC; XDP sees it in
    the frame. Both must count the same bytes and the same depth limit (3 tags: too deep)."""
    built = [F.roce(0x0A, payload=100, dma_len=100, qp=0x41, vlans=(10,)),
             F.roce(0x0A, payload=100, dma_len=100, qp=0x42, vlans=((0x88A8, 10), (0x8100, 20))),
             F.roce(0x0A, payload=100, dma_len=100, qp=0x43, vlans=((0x8100, 10), (0x8100, 20)))]
    deep = F.roce(0x0A, payload=100, dma_len=100, qp=0x44, vlans=((0x88A8, 1), (0x8100, 2), (0x8100, 3)))
    dp.reset()
    att = attach(dp, netns_pair, how)
    try:
        netns_pair.send("a", built + [deep])
        time.sleep(SETTLE_S)
        snap = dp.snapshot({"source": "test"})
    finally:
        att.detach()
    assert cats(snap) == {"accounted": 3, "vlan_too_deep": 1}
    got = flows_by_key(snap)
    for b in built:
        assert (int(got[b.key]["bytes"]), int(got[b.key]["payload_bytes"])) == (len(b), 100)


@pytest.mark.parametrize("how", ["xdp_native", "xdp_generic", "tc_both"])
def test_ping_still_works_while_attached(dp, netns_pair, how):
    from skewscope.bpf.attach import Attachment
    kw = ATTACH.get(how, dict(mode="tc", direction="both"))
    dp.reset()
    with netns_pair.enter("b"):
        att = Attachment(dp, netns_pair.if_b, **kw).attach()
    try:
        r = netns_pair.run("a", "ping", "-c", "3", "-i", "0.2", "-W", "2", netns_pair.ip_b, check=False)
        assert r.returncode == 0, r.stdout + r.stderr
        netns_pair.send("a", [F.roce(0x0A, payload=10, dma_len=10)])
        time.sleep(SETTLE_S)
        snap = dp.snapshot({"source": "test"})
    finally:
        att.detach()
    c = cats(snap)
    assert c.get("accounted") == 1
    assert c.get("non_roce", 0) >= 3  # ICMP echo (+ replies on egress) and ARP


def test_both_entries_see_the_same_stream(dp, netns_pair_factory):
    """The same frames through XDP (native) and TC ingress on two links give equal tables."""
    from skewscope.bpf.attach import Attachment
    from skewscope.bpf.loader import Config, Dataplane
    built = stream()
    snaps = []
    for how in ("xdp_native", "tc_ingress"):
        pair = netns_pair_factory(how[:3])
        d = Dataplane(Config(max_flows=1024, ev_per_cpu=1024))
        try:
            with pair.enter("b"):
                att = Attachment(d, pair.if_b, **ATTACH[how]).attach()
            try:
                pair.send("a", built)
                time.sleep(SETTLE_S)
                snaps.append(d.snapshot({"source": "test"}))
            finally:
                att.detach()
        finally:
            d.close()
    a, b = snaps
    skip = {"first_ts", "last_ts", "gap_hist"}  # live times differ between the two runs
    for name in a.flows.dtype.names:
        if name not in skip:
            assert np.array_equal(a.flows[name], b.flows[name]), name
    assert np.array_equal(a.globals, b.globals)
    assert np.array_equal(a.events["bytes"], b.events["bytes"])


def test_ip_tools_see_nothing_after_detach(dp, netns_pair):
    for how in ATTACH:
        att = attach(dp, netns_pair, how)
        att.detach()
    link = netns_pair.run("b", "ip", "-d", "link", "show", netns_pair.if_b).stdout
    assert "xdp" not in link
    for d in ("ingress", "egress"):
        out = netns_pair.run("b", "tc", "filter", "show", "dev", netns_pair.if_b, d).stdout
        assert "skewscope" not in out
    assert "clsact" not in netns_pair.run("b", "tc", "qdisc", "show", "dev", netns_pair.if_b).stdout
