"""Kernel tier: the two entry points, the live clock, jumbo frames, sampling, map memory."""
from __future__ import annotations

import time

import frames as F
import numpy as np
import pytest
from kharness import TC_ACT_UNSPEC, TC_MAX_FRAME, XDP_PASS, assert_basic


def mixed_stream():
    """A bit of everything a mirror port shows, small enough for the TC test run."""
    out = []
    for i in range(6):
        out.append(F.roce(0x06, payload=1024, dma_len=3000, psn=3 * i, qp=5, tclass=0x02 | (i & 1)))
        out.append(F.roce(0x07, payload=1024, psn=3 * i + 1, qp=5))
        out.append(F.roce(0x09, payload=952, psn=3 * i + 2, qp=5, imm=3000))
        out.append(F.roce(0x11, src="10.0.0.2", dst="10.0.0.1", qp=6, syndrome=[0, 0x60, 0x20][i % 3], psn=3 * i + 2))
        out.append(F.roce(0x0A, payload=64, dma_len=64, src="fd00::2", dst="fd00::1", qp=7, psn=i, vlans=(3,)))
        out.append(F.roce(0x04, payload=100 + i, v1=True, src="fe80::1", dst="fe80::2", qp=8, psn=i))
        out.append(F.roce(0x64, payload=256, qp=1))
        out.append(F.arp())
        out.append(F.tcp())
    out.append(F.roce(0x81, src="10.0.0.2", dst="10.0.0.1", qp=6))
    out.append(F.pfc(0x08, [0, 0, 0, 7, 0, 0, 0, 0]))
    deep = F.roce(0x07, payload=10, vlans=(1, 2, 3))
    deep.kind = "too_deep"  # not accounted: no flow expected
    out.append(deep)
    out.append(F.raw_bth(0x42, body=bytes(20)))
    return out


def test_xdp_and_tc_agree_exactly(kernel):
    built = mixed_stream()
    x = kernel.run(built, "xdp")
    t = kernel.run(built, "tc")
    for res in (x, t):
        assert_basic(res, built)
        res.assert_cats(accounted=sum(b.kind == "roce" for b in built), non_roce=12, pfc=1, vlan_too_deep=1,
                        unknown_opcode=1)
    assert np.array_equal(x.flows, t.flows)
    assert np.array_equal(x.events, t.events)
    assert np.array_equal(x.g, t.g)


@pytest.fixture(scope="module")
def live_dp():
    """A live build: time from bpf_ktime_get_ns(), no replay clock map."""
    from skewscope.bpf.loader import Config, Dataplane
    dp = Dataplane(Config(max_flows=256, ev_per_cpu=256))
    try:
        yield dp
    finally:
        dp.close()


@pytest.mark.parametrize("kind", ["xdp", "tc"])
def test_live_build_uses_the_monotonic_clock(live_dp, kind):
    from skewscope.bpf import syscalls as bpfsys
    live_dp.reset()
    built = [F.roce(0x06, payload=512, dma_len=1024, psn=0), F.roce(0x08, payload=512, psn=1),
             F.roce(0x11, src="10.0.0.2", dst="10.0.0.1")]
    fd = live_dp.prog_fd(kind)
    before = time.monotonic_ns()
    for b in built:
        ret, _ = bpfsys.prog_test_run(fd, b.frame)
        assert ret == (XDP_PASS if kind == "xdp" else TC_ACT_UNSPEC)
    after = time.monotonic_ns()
    snap = live_dp.snapshot({"source": "test"})
    assert len(snap.flows) == 2
    for f in snap.flows:
        assert before <= int(f["first_ts"]) <= int(f["last_ts"]) <= after
    w = [f for f in snap.flows if int(f["dest_qp"]) == built[0].qp and int(f["packets"]) == 2][0]
    assert int(w["payload_bytes"]) == 1024 and int(w["messages"]) == 1
    (ev,) = snap.events
    assert before <= int(ev["start_ts"]) <= int(ev["end_ts"]) <= after and int(ev["bytes"]) == 1024



def test_control_packets_take_the_cpu_clock_of_the_current_tick(live_dp):
    """Live build (docs/datapath.md "Time"): a flow's first packet and message boundaries read
    CLOCK_MONOTONIC; a control packet (here an ACK) takes the last clock reading of its CPU
    while the kernel tick (jiffies) has not moved, else reads the clock. Ground truth: the
    caller's own monotonic clock around each test run, all on one CPU."""
    import os

    from skewscope.bpf import syscalls as bpfsys
    fd = live_dp.prog_fd("xdp")
    write = F.roce(0x0A, payload=256, dma_len=256, qp=0x21)  # WRITE_ONLY: a boundary, clock read
    ack = F.roce(0x11, src="10.0.0.2", dst="10.0.0.1", qp=0x22)
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cpus)})  # test runs execute on the calling CPU
    try:
        reused = 0
        for attempt in range(8):
            live_dp.reset()
            bpfsys.prog_test_run(fd, ack.frame)            # the ACK flow's first packet: timed
            time.sleep(0.03)                               # > 1 tick at any HZ >= 100
            t0 = time.monotonic_ns()
            bpfsys.prog_test_run(fd, ack.frame)            # a new tick: reads the clock
            t1 = time.monotonic_ns()
            bpfsys.prog_test_run(fd, write.frame)          # a boundary on another flow, same CPU
            bpfsys.prog_test_run(fd, ack.frame)            # same tick (almost always): reuses it
            t2 = time.monotonic_ns()
            fl = {int(f["dest_qp"]): f for f in live_dp.snapshot({"source": "test"}).flows}
            a, w = fl[0x22], fl[0x21]
            assert int(a["packets"]) == 3 and int(a["acks"]) == 3
            assert int(a["first_ts"]) < t0 <= int(w["last_ts"]) <= int(a["last_ts"]) <= t2
            assert t2 - int(a["last_ts"]) < 10_000_000     # at most one tick early (HZ >= 100)
            reused += int(a["last_ts"]) == int(w["last_ts"])
            if int(a["last_ts"]) != int(w["last_ts"]):
                assert int(a["last_ts"]) >= t1             # the tick moved: a fresh reading
        assert reused >= 4, f"the ACK reused the boundary's clock reading in {reused} of 8 attempts"
    finally:
        os.sched_setaffinity(0, cpus)

# ---- jumbo frames (IB MTU 4096) through XDP with frags -----------------------------------------
def test_jumbo_write_through_xdp_frags(kernel):
    """A 64 KiB WRITE at IB MTU 4096 (frames of 4170/4154 bytes: larger than one page's
    linear XDP buffer, so the test run passes the tail as a fragment) and a 9000-byte frame."""
    n = 16
    built = [F.roce(0x06, payload=4096, dma_len=n * 4096, psn=0)]
    built += [F.roce(0x07, payload=4096, psn=i) for i in range(1, n - 1)]
    built += [F.roce(0x09, payload=4096, psn=n - 1, imm=n * 4096)]
    built += [F.roce(0x0A, payload=8950, dma_len=8950, psn=n, qp=9)]
    assert (len(built[0]), len(built[1])) == (4170, 4154)
    res = kernel.run(built, "xdp")
    res.assert_cats(accounted=len(built))
    assert_basic(res, built)
    f = res.flow(built[0].key)
    assert (int(f["payload_bytes"]), int(f["messages"]), int(f["psn_gaps"])) == (n * 4096, 1, 0)
    assert int(res.flow(built[-1].key)["bytes"]) == len(built[-1]) > 9000


def test_tc_test_run_limit_is_what_the_harness_assumes(kernel):
    """Guard for the harness constant: the skb test run accepts TC_MAX_FRAME bytes."""
    from skewscope.bpf import syscalls as bpfsys
    fr = F.roce(0x07, payload=TC_MAX_FRAME - 58).frame
    assert len(fr) == TC_MAX_FRAME
    kernel.dp.set_replay(0, len(fr))
    assert bpfsys.prog_test_run(kernel.fds["tc"], fr)[0] == TC_ACT_UNSPEC


# ---- sampling ----------------------------------------------------------------------------------
def test_sampling_counts_one_in_n():
    """-DSS_SAMPLE_N=4: each RoCE packet is accounted with probability 1/4, the rest are
    sampled_out; non-RoCE frames are not sampled. PSN tracking and message records are off
    (they need every packet)."""
    from skewscope.bpf import syscalls as bpfsys
    from skewscope.bpf.loader import Config, Dataplane
    from skewscope.core import layout as L
    dp = Dataplane(Config(sample_n=4, max_flows=64, ev_per_cpu=64, replay_clock=True))
    try:
        fd = dp.prog_fd("xdp")
        n = 4000
        frames = [F.roce(0x0A, payload=64, psn=i * 7).frame for i in range(8)]
        for i in range(n):
            dp.set_replay(1000 + i, len(frames[i % 8]))
            bpfsys.prog_test_run(fd, frames[i % 8])
        for _ in range(10):
            bpfsys.prog_test_run(fd, F.arp().frame)
        snap = dp.snapshot({"source": "test"})
    finally:
        dp.close()
    g = snap.globals
    acc, out = int(g[L.G_ACCOUNTED]), int(g[L.G_SAMPLED_OUT])
    assert acc + out == n and int(g[L.G_NON_ROCE]) == 10 and int(g[L.G_FRAMES]) == n + 10
    sigma = (n * 0.25 * 0.75) ** 0.5
    assert abs(acc - n / 4) < 6 * sigma, acc
    (f,) = snap.flows
    assert int(f["packets"]) == acc and int(f["messages"]) == acc
    assert (int(f["psn_gaps"]), int(f["retransmissions"]), len(snap.events)) == (0, 0, 0)
    assert snap.meta["sample_n"] == 4


# ---- memory --------------------------------------------------------------------------------------
def test_documented_map_memory_matches_the_kernel():
    """Config.memory_bytes() (what docs/datapath.md tabulates) against the kernel's own
    accounting (memlock in /proc/self/fdinfo) for a non-default size."""
    from skewscope.bpf.loader import Config, Dataplane
    cfg = Config(max_flows=4096, ev_per_cpu=1024)
    dp = Dataplane(cfg)
    try:
        est = cfg.memory_bytes()
        for name in ("flows", "msg_events"):
            fd = dp._fd(name)
            memlock = int([ln.split()[1] for ln in open(f"/proc/self/fdinfo/{fd}") if ln.startswith("memlock")][0])
            key = "flows" if name == "flows" else "events"
            assert abs(est[key] - memlock) <= 0.02 * memlock + 8192, (name, est[key], memlock)
    finally:
        dp.close()


# ---- bounded maps: eviction and record overrun are counted, never silent --------------------
def test_flow_eviction_is_counted():
    """More flows than --max-flows: the LRU map evicts, every packet is still accounted, and
    flows_created - flows present = flows_evicted."""
    from skewscope.bpf import syscalls as bpfsys
    from skewscope.bpf.loader import Config, Dataplane
    from skewscope.core import layout as L
    dp = Dataplane(Config(max_flows=16, ev_per_cpu=64, replay_clock=True))
    try:
        fd = dp.prog_fd("xdp")
        n = 100
        for i in range(n):
            fr = F.roce(0x0A, payload=8, qp=0x1000 + i).frame
            dp.set_replay(i, len(fr))
            bpfsys.prog_test_run(fd, fr)
        snap = dp.snapshot({"source": "test"})
    finally:
        dp.close()
    g = snap.globals
    assert int(g[L.G_ACCOUNTED]) == n and int(g[L.G_NO_FLOW_SLOT]) == 0
    assert int(g[L.G_FLOWS_CREATED]) == n
    assert 0 < len(snap.flows) <= 16
    assert snap.meta["flows_evicted"] == n - len(snap.flows)
    # the flows still present are whole: one packet each, of the qps sent last-ish
    assert all(int(f["packets"]) == 1 for f in snap.flows)


def test_message_record_overrun_is_counted():
    """Records not read before their per-CPU ring wraps are lost and counted."""
    from skewscope.bpf import syscalls as bpfsys
    from skewscope.bpf.loader import Config, Dataplane
    dp = Dataplane(Config(max_flows=64, ev_per_cpu=16, replay_clock=True))
    try:
        fd = dp.prog_fd("xdp")
        os_cpu = __import__("os").sched_getaffinity(0)
        __import__("os").sched_setaffinity(0, {min(os_cpu)})
        try:
            for i in range(40):
                fr = F.roce(0x0A, payload=8, dma_len=100 + i, psn=i).frame
                dp.set_replay(1000 + i, len(fr))
                bpfsys.prog_test_run(fd, fr)
        finally:
            __import__("os").sched_setaffinity(0, os_cpu)
        snap = dp.snapshot({"source": "test"})
    finally:
        dp.close()
    assert len(snap.events) == 16 and snap.meta["events_lost"] == 24
    # the 16 kept are the newest, complete and in order
    assert [int(e["bytes"]) for e in snap.events] == [100 + i for i in range(24, 40)]
