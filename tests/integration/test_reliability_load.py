"""Transparency and exact accounting under load (issue 8), on a real veth pair between two
fresh namespaces (`ssr-` names, deleted afterwards), with skewscope's program attached to the
observer end exactly as `top`/`capture` attach it.

Transparency: a bounded RoCE flood (UDP 4791 to a socket bound in the observer namespace) and
a TCP transfer run at the same time, without a program and then with XDP (native and generic)
and TC. What the application sees must not get worse: every RoCE datagram the baseline
delivers is delivered, the TCP stream arrives complete and byte-identical. Native XDP on veth
drops packets at the veth's 256-slot NAPI ring whatever the program (a 3-line XDP_PASS program
drops as many; tools/reliability.py measures both): there, any loss beyond the baseline must
be visible in the link's drop counters. Throughput with/without is printed (ratios in
docs/reliability.md).

Exact accounting: 2,048,000 frames over 256 flows at the fastest rate sendmmsg(2) reaches;
every flow's packet count equals what was sent to it, or the shortfall equals the link's drop
counters.
"""
from __future__ import annotations

import os

import pytest

import reliability as R

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root for namespaces, veth and attach (CI runs as root)"),
    pytest.mark.timeout(300),
]

FLOOD = 64 * 1600
TCP_BYTES = 128 << 20


@pytest.fixture
def fab():
    f = R.pair("load")
    try:
        yield f
    finally:
        f.destroy()


def test_transparency_under_load(fab, capsys):
    runs = {m or "none": R.roce_flood_with_tcp(fab, m, FLOOD, TCP_BYTES)
            for m in (None, "tc", "xdp-generic", "xdp")}
    base = runs["none"]
    assert base["roce_sent"] == FLOOD and base["tcp"]["sent"] == TCP_BYTES
    for m, r in runs.items():
        assert r["roce_sent"] == FLOOD, m
        assert r["tcp"]["received"] == TCP_BYTES and r["tcp"]["intact"], f"{m}: TCP stream damaged: {r['tcp']}"
        if m != "none":
            assert r["seen"]["accounted"] == FLOOD, f"{m}: the program did not see the whole flood: {r['seen']}"
    for m in ("tc", "xdp-generic"):
        r = runs[m]
        assert r["roce_lost"] <= base["roce_lost"], f"{m} lost RoCE frames the baseline did not: {r}"
        assert r["link_drops"] <= base["link_drops"], f"{m}: link drops with the program: {r}"
    r = runs["xdp"]
    assert r["roce_lost"] - base["roce_lost"] <= r["link_drops"], f"xdp native: unexplained loss: {r}"
    with capsys.disabled():
        print("\n  transparency: " + "  ".join(
            f"{m}: tcp {r['tcp']['gbps']:.2f} Gbit/s ({r['tcp']['gbps'] / base['tcp']['gbps']:.2f}x) "
            f"roce lost {r['roce_lost']} drops {r['link_drops']}" for m, r in runs.items()))


@pytest.mark.parametrize("mode", ["xdp", "tc"])
def test_exact_accounting_under_load(fab, mode, capsys):
    r = R.exact_accounting(fab, mode, nflows=256, per_flow=8000 if mode == "xdp" else 4000)
    assert r["sent"] == 256 * (8000 if mode == "xdp" else 4000), f"sender stopped early: {r}"
    assert r["other_flows"] == 0 and r["flows_over"] == 0, r
    # every flow exact, or the total shortfall is what the link says it dropped
    assert r["shortfall"] == 0 or r["shortfall"] == r["link_drops"], r
    assert r["flows_exact"] == r["flows"] or r["link_drops"] > 0, r
    assert r["accounted"] == r["sent"] - r["shortfall"]
    with capsys.disabled():
        print(f"\n  accounting {mode}: {r['sent']} frames at {r['pps']:.0f} pps, {r['flows_exact']}/{r['flows']} "
              f"flows exact, shortfall {r['shortfall']}, link drops {r['link_drops']}")
