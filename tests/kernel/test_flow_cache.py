"""Kernel tier: the per-CPU flow cache in front of the flows LRU hash (docs/datapath.md
"Flow cache"). With one slot per CPU every packet of interleaved flows replaces the slot
(write back + copy in), reads in between must see exact, never-decreasing counters, and a
flow that moves to another CPU mid-message keeps its state. Expectations come from how the
frames were built (kharness.basic_expectations, message boundaries counted here), never
from the program."""
from __future__ import annotations

import os

import frames as F
import numpy as np
import pytest
from kharness import DT, T0, Kernel, assert_basic

NFLOWS = 5
MSG = 3  # packets per WRITE message: FIRST, MIDDLE, LAST


def interleaved(nmsg: int = 4) -> list:
    """nmsg 3-packet WRITE messages on each of NFLOWS flows, round-robin packet by packet,
    plus an ACK and a CNP per message on the reverse flows."""
    out = []
    for m in range(nmsg):
        for step in range(MSG):
            for q in range(NFLOWS):
                op = (0x06, 0x07, 0x08)[step]
                out.append(F.roce(op, payload=512, dma_len=1536 if op == 0x06 else None, psn=m * MSG + step,
                                  qp=0x40 + q, tclass=0x02))
        for q in range(NFLOWS):
            out.append(F.roce(0x11, src="10.0.0.2", dst="10.0.0.1", qp=0x80 + q, syndrome=0, psn=m * MSG + 2))
            out.append(F.roce(0x81, src="10.0.0.2", dst="10.0.0.1", qp=0x80 + q))
    return out


def expected_records(built: list, ts: list) -> list:
    """(dest_qp, start, end, bytes) of every complete WRITE message, from the frames."""
    start, out = {}, []
    for b, t in zip(built, ts):
        if b.opcode == 0x06:
            start[b.qp] = t
        elif b.opcode == 0x08 and b.qp in start:
            out.append((b.qp, start.pop(b.qp), t, 1536))
    return sorted(out)


def records(res) -> list:
    fl = res.flows
    return sorted((int(fl["dest_qp"][e["flow"]]), int(e["start_ts"]), int(e["end_ts"]), int(e["bytes"]))
                  for e in res.events)


@pytest.fixture(scope="module")
def one_slot():
    from skewscope.bpf.loader import Config, Dataplane
    dp = Dataplane(Config(replay_clock=True, max_flows=1024, ev_per_cpu=4096, flow_cache=1))
    try:
        yield Kernel(dp)
    finally:
        dp.close()


def test_every_packet_replaces_the_slot_and_nothing_is_lost(one_slot, entry):
    built = interleaved()
    res = one_slot.run(built, entry)
    assert_basic(res, built)
    res.assert_cats(accounted=len(built))
    assert records(res) == expected_records(built, res.ts)
    data = res.flows[res.flows["dest_qp"] < 0x80]
    assert sorted(int(q) for q in data["dest_qp"]) == [0x40 + q for q in range(NFLOWS)]
    assert (data["messages"] == 4).all() and (data["psn_gaps"] == 0).all() and (data["retransmissions"] == 0).all()
    acks = res.flows[res.flows["dest_qp"] >= 0x80]
    assert (acks["acks"] == 4).all() and (acks["cnp"] == 4).all()


def test_same_tables_with_and_without_the_cache(one_slot):
    """The cache is invisible: a build without it gives identical tables on the same frames."""
    from skewscope.bpf.loader import Config, Dataplane
    built = interleaved(3)
    a = one_slot.run(built, "xdp")
    dp0 = Dataplane(Config(replay_clock=True, max_flows=1024, ev_per_cpu=4096, flow_cache=0))
    try:
        b = Kernel(dp0).run(built, "xdp")
    finally:
        dp0.close()
    assert np.array_equal(a.flows, b.flows) and np.array_equal(a.events, b.events)
    assert np.array_equal(a.g, b.g)


def test_reads_between_packets_are_exact(one_slot):
    """A read after every packet (what a live interval does) sees exactly the packets sent so
    far on every flow, whether the flow sits in the slot or was written back."""
    built = interleaved(2)
    sent: dict = {}
    one_slot.dp.reset()
    for i, b in enumerate(built):
        one_slot.run([b], "xdp", t0=T0 + i * DT, reset=False)
        sent[b.qp] = sent.get(b.qp, 0) + 1
        fl = one_slot.dp.read_flows()
        got = {int(q): int(p) for q, p in zip(fl["dest_qp"], fl["packets"])}
        assert got == sent, f"after packet {i}: {got} != {sent}"


def _two_cpus():
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs 2 CPUs to move a flow between CPUs")
    return cpus[0], cpus[1]


def test_flow_moving_cpu_mid_message_keeps_its_state(one_slot):
    """FIRST+MIDDLE on one CPU, MIDDLE+LAST on another (BPF_PROG_TEST_RUN runs on the calling
    CPU): the second CPU takes the first one's slot over, so PSN tracking, the open message
    and the counters continue; a read in between sees the first part."""
    from skewscope.core import layout as L
    a, b = _two_cpus()
    old = os.sched_getaffinity(0)
    msg = [F.roce(0x06, payload=512, dma_len=2048, psn=0, qp=0x33), F.roce(0x07, payload=512, psn=1, qp=0x33),
           F.roce(0x07, payload=512, psn=2, qp=0x33), F.roce(0x08, payload=512, psn=3, qp=0x33)]
    ts = [T0 + i * DT for i in range(4)]
    try:
        one_slot.dp.reset()
        os.sched_setaffinity(0, {a})
        one_slot.run(msg[:2], "xdp", ts=ts[:2], reset=False)
        mid = one_slot.dp.read_flows()
        assert [int(x) for x in mid["packets"]] == [2]
        os.sched_setaffinity(0, {b})
        second = one_slot.run(msg[2:], "xdp", ts=ts[2:], reset=False)
        # back on the first CPU: its slot no longer holds the flow (taken over), a new
        # packet there takes it back
        os.sched_setaffinity(0, {a})
        tail = F.roce(0x0A, payload=64, dma_len=64, psn=4, qp=0x33)
        res = one_slot.run([tail], "xdp", ts=[T0 + 10 * DT], reset=False)
    finally:
        os.sched_setaffinity(0, old)
    (f,) = res.flows
    assert int(f["packets"]) == 5 and int(f["bytes"]) == sum(len(x) for x in msg + [tail])
    assert int(f["messages"]) == 2 and int(f["psn_gaps"]) == 0 and int(f["retransmissions"]) == 0
    assert int(f["first_ts"]) == ts[0] and int(f["last_ts"]) == T0 + 10 * DT
    assert int(res.g[L.G_MSG_PARTIAL]) == 0
    assert records(second) == [(0x33, ts[0], ts[3], 2048)]  # the message begun on the other CPU
    assert records(res) == [(0x33, T0 + 10 * DT, T0 + 10 * DT, 64)]
