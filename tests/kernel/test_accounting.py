"""Kernel tier: per-flow accounting, exactly (README "Counters").

Expected numbers are written from the frames as built and from the definitions in the
issue/README (what a message is, what a PSN gap is, how the log2 buckets are bounded),
never read back from skewscope's code.
"""
from __future__ import annotations

import frames as F
import pytest
from kharness import T0, assert_basic

A, B = "10.0.0.1", "10.0.0.2"
PSN_MOD = 1 << 24


def lower_bound(size: int) -> int:
    """README: bucket lower bound 0 for size 0, else 2^floor(log2 size)."""
    return 0 if size == 0 else 1 << (size.bit_length() - 1)


def hist(row) -> dict:
    """A flow's histogram row as {lower bound: count}; slot i covers [2^(i-1), 2^i)."""
    return {(0 if i == 0 else 1 << (i - 1)): int(c) for i, c in enumerate(row) if c}


def events(res) -> list:
    from skewscope.core import layout as L
    return [(int(e["flow"]), L.OPCLASS_NAMES[int(e["opclass"])], int(e["start_ts"]), int(e["end_ts"]),
             int(e["bytes"])) for e in res.events]


def partial(res) -> int:
    from skewscope.core import layout as L
    return int(res.g[L.G_MSG_PARTIAL])


# ---- every opcode class, RC/UC/UD/XRC -------------------------------------------------------
@pytest.mark.parametrize("op", F.ALL_OPCODES, ids=lambda o: F.OPCODE_NAME[o])
def test_single_packet_of_each_opcode(kernel, entry, op):
    payload = {0x81: 0, 0x13: 0, 0x14: 0, 0xB3: 0, 0xB4: 0, 0x1D: 8}.get(op, 24)
    b = F.roce(op, payload=payload, psn=100, dma_len=3000 if "RETH" in F.EXT_HEADERS[op] else None, qp=0x33)
    res = kernel.run([b], entry)
    res.assert_cats(accounted=1)
    assert_basic(res, [b])
    f = res.flow(b.key)
    start, end = F.is_start(op), F.is_end(op)
    assert int(f["messages"]) == int(start)
    if start and "RETH" in F.EXT_HEADERS[op]:
        size = 3000  # WRITE / READ_REQUEST: the RETH DMA length
    elif start and end:
        size = payload  # SEND_ONLY: its payload
    else:
        size = None  # no complete message
    exp_hist = {} if size is None else {lower_bound(size): 1}
    assert hist(f["msg_hist"]) == exp_hist
    assert int(f["msg_bytes"]) == (size or 0)
    # a message record when the message ends in this packet (ONLY) or at a READ_REQUEST
    cls = F.OPCODE_CLASS[op]
    if start and (end or cls == "read_request"):
        assert events(res) == [(0, cls, T0, T0, size)]
    else:
        assert events(res) == []
    assert partial(res) == int(end and not start)
    # nothing else moves on a single packet
    assert (int(f["psn_gaps"]), int(f["retransmissions"])) == (0, 0)
    assert int(f["acks"]) == int(op in (0x11, 0xB1))  # syndrome 0 = ACK, on ACKNOWLEDGE only


# ---- ECN, FECN/BECN, CNP ----------------------------------------------------------------------
def test_ecn_marks(kernel, entry):
    built = []
    for tc in (0x00, 0x02, 0x01, 0x03, 0xB8 | 0x03, 0xB8 | 0x02, 0x03):
        built.append(F.roce(0x07, payload=64, tclass=tc, qp=1))
        built.append(F.roce(0x07, payload=64, tclass=tc, qp=2, src="fd00::1", dst="fd00::2"))
    res = kernel.run(built, entry)
    assert_basic(res, built)
    for b in (built[0], built[1]):
        f = res.flow(b.key)
        assert (int(f["ecn_capable"]), int(f["ce"])) == (6, 3)
        assert int(f["tclass"]) == 0x03


def test_rocev1_has_no_ip_ecn(kernel, entry):
    """RoCEv1 has no IP header: its GRH traffic class is recorded, ECN is not counted."""
    b = F.roce(0x07, payload=64, tclass=0x03, v1=True, src="fe80::1", dst="fe80::2")
    f = kernel.run([b], entry).flow(b.key)
    assert (int(f["ecn_capable"]), int(f["ce"]), int(f["tclass"])) == (0, 0, 3)


def test_fecn_becn(kernel, entry):
    built = [F.roce(0x07, payload=8, fecn=1), F.roce(0x07, payload=8, becn=1), F.roce(0x07, payload=8, fecn=1, becn=1),
             F.roce(0x07, payload=8)]
    res = kernel.run(built, entry)
    f = res.flow(built[0].key)
    assert (int(f["fecn"]), int(f["becn"])) == (2, 2)


def test_cnp_counted_to_its_dest_qp(kernel, entry):
    """A CE-marked data flow A->B (QP 0x22 at B) makes B send CNPs to A's QP 0x118: they are
    counted on the flow B->A, QP 0x118 (where B's ACKs to that QP also land)."""
    data = [F.roce(0x07, payload=1024, qp=0x22, psn=i, tclass=0x03) for i in range(3)]
    cnps = [F.roce(0x81, src=B, dst=A, qp=0x118, tclass=0xC2, sport=0) for _ in range(2)]
    ack = F.roce(0x11, src=B, dst=A, qp=0x118, syndrome=0x1F)
    built = data + cnps + [ack]
    res = kernel.run(built, entry)
    assert_basic(res, built)
    back = res.flow(F.key_of(B, A, 0x118, 4))
    assert (int(back["cnp"]), int(back["becn"]), int(back["acks"]), int(back["payload_bytes"])) == (2, 2, 1, 0)
    assert int(back["messages"]) == 0
    assert int(res.flow(data[0].key)["cnp"]) == 0


# ---- AETH syndromes ---------------------------------------------------------------------------
def test_aeth_syndromes(kernel, entry):
    acks = [0x00, 0x05, 0x06, 0x1F]
    rnr = [0x20, 0x2E, 0x3F]
    seq = [0x60]
    other = [0x61, 0x62, 0x63, 0x64, 0x7F]
    built = [F.roce(0x11, src=B, dst=A, syndrome=s, msn=i) for i, s in enumerate(acks + rnr + seq + seq + other)]
    # syndromes in READ responses / atomic ACKs are not ACKNOWLEDGE packets: not acks
    built += [F.roce(op, src=B, dst=A, syndrome=0x00, payload=16) for op in (0x0D, 0x0F, 0x10, 0x12)]
    built += [F.roce(0xB1, src=B, dst=A, syndrome=0x60)]  # XRC ACKNOWLEDGE: a NAK too
    res = kernel.run(built, entry)
    res.assert_cats(accounted=len(built))
    f = res.flow(built[0].key)
    assert (int(f["acks"]), int(f["nak_rnr"]), int(f["nak_seq"]), int(f["nak_other"])) == (4, 3, 3, 5)
    assert int(f["op"][4]) == len(acks + rnr + seq + seq + other) + 1  # class ack


# ---- PSN tracking -----------------------------------------------------------------------------
def psn_run(kernel, entry, seq, ops=None, **kw):
    ops = ops or [0x07] * len(seq)
    built = [F.roce(op, payload=0 if op in (0x0C, 0x13) else 32, psn=p, dma_len=8192 if op == 0x0C else None, **kw)
             for op, p in zip(ops, seq)]
    res = kernel.run(built, entry)
    f = res.flow(built[0].key)
    return int(f["psn_gaps"]), int(f["psn_skipped"]), int(f["retransmissions"])


def test_psn_in_order_from_any_start(kernel, entry):
    assert psn_run(kernel, entry, [0x5A5A5A + i for i in range(10)]) == (0, 0, 0)


def test_psn_gap(kernel, entry):
    assert psn_run(kernel, entry, [0, 1, 2, 5, 6, 10]) == (2, 2 + 3, 0)


def test_psn_go_back_n_retransmission(kernel, entry):
    # 0..5, NAK, resend 3..5, continue at 6: three packets behind, no gap afterwards
    assert psn_run(kernel, entry, [0, 1, 2, 3, 4, 5, 3, 4, 5, 6, 7]) == (0, 0, 3)


def test_psn_duplicate_is_behind(kernel, entry):
    assert psn_run(kernel, entry, [7, 7, 8]) == (0, 0, 1)


def test_psn_wraps_at_24_bits(kernel, entry):
    top = PSN_MOD - 1
    assert psn_run(kernel, entry, [top - 2, top - 1, top, 0, 1, 2]) == (0, 0, 0)
    assert psn_run(kernel, entry, [top - 1, 1]) == (1, 2, 0)          # skips 0xFFFFFF and 0
    assert psn_run(kernel, entry, [top - 1, top, 0, 1, 2, top]) == (0, 0, 1)  # back across the wrap


def test_psn_half_window(kernel, entry):
    """24-bit serial arithmetic: d = psn - expected (mod 2^24); ahead when 0 < d < 2^23."""
    half = 1 << 23
    assert psn_run(kernel, entry, [0, 1 + half - 1]) == (1, half - 1, 0)
    assert psn_run(kernel, entry, [0, 1 + half]) == (0, 0, 1)


def test_psn_after_read_request_is_not_a_gap(kernel, entry):
    """READ responses consume the requester's PSNs: WRITE 10, READ 11 (2 response packets
    use 11..12), WRITE 13 is in order; WRITE 15 after that is a real gap."""
    W, R = 0x07, 0x0C
    assert psn_run(kernel, entry, [10, 11, 13, 15], [W, R, W, W]) == (1, 1, 0)
    # a retransmission right after the READ does not use up the exemption
    assert psn_run(kernel, entry, [10, 11, 5, 13, 14], [W, R, W, W, W]) == (0, 0, 1)
    # consecutive READs (perftest ib_read_bw): each jumps by its response count
    assert psn_run(kernel, entry, [100, 102, 104, 106], [R, R, R, R]) == (0, 0, 0)


def test_psn_only_requests_are_tracked(kernel, entry):
    """Responses, ACKs, CNPs (not requests) and UD (unreliable) never make gaps."""
    assert psn_run(kernel, entry, [0, 500, 3, 9000], [0x11] * 4) == (0, 0, 0)
    assert psn_run(kernel, entry, [0, 500, 3, 9000], [0x0E] * 4) == (0, 0, 0)
    assert psn_run(kernel, entry, [0, 500, 3, 9000], [0x64] * 4) == (0, 0, 0)
    assert psn_run(kernel, entry, [0, 500, 3, 9000], [0x81] * 4) == (0, 0, 0)
    # interleaved on one flow: requests 0,1,2 stay in order around responses with wild PSNs
    assert psn_run(kernel, entry, [0, 77, 1, 9000, 2], [0x07, 0x0E, 0x07, 0x11, 0x07]) == (0, 0, 0)


def test_psn_atomics_and_uc_xrc_are_requests(kernel, entry):
    assert psn_run(kernel, entry, [0, 2], [0x13, 0x14]) == (1, 1, 0)
    assert psn_run(kernel, entry, [0, 1, 3, 2], [0x27] * 4) == (1, 1, 1)
    assert psn_run(kernel, entry, [0, 1, 3, 2], [0xA7] * 4) == (1, 1, 1)


# ---- message assembly ---------------------------------------------------------------------------
def test_send_assembly(kernel, entry):
    """SEND size = payload summed FIRST..LAST; record start = FIRST's time, end = LAST's."""
    seqs = [
        [(0x00, 1024), (0x01, 1024), (0x01, 1024), (0x02, 500)],
        [(0x00, 2048), (0x03, 100)],               # LAST_WITH_IMMEDIATE
        [(0x00, 256), (0x01, 256), (0x16, 1)],      # LAST_WITH_INVALIDATE
        [(0x17, 7)],                                # ONLY_WITH_INVALIDATE
        [(0x20, 10), (0x21, 10), (0x22, 10)],       # UC
        [(0xA0, 300), (0xA2, 3)],                   # XRC
    ]
    built, ts, expect_ev = [], [], []
    t = T0
    for qp, seq in enumerate(seqs, start=1):
        start = t
        for i, (op, n) in enumerate(seq):
            built.append(F.roce(op, payload=n, qp=qp, psn=i, pad=(4 - n % 4) % 4))
            ts.append(t)
            t += 1000
        expect_ev.append((qp, start, t - 1000, sum(n for _, n in seq)))
    res = kernel.run(built, entry, ts=ts)
    res.assert_cats(accounted=len(built))
    assert_basic(res, built)
    got = events(res)
    assert len(got) == len(seqs)
    for (qp, start, end, size), ev in zip(expect_ev, got):
        key = F.key_of(A, B, qp, 4)
        f = res.flow(key)
        assert ev == (res.flow_index(key), "send", start, end, size)
        assert (int(f["messages"]), int(f["msg_bytes"]), hist(f["msg_hist"])) == (1, size, {lower_bound(size): 1})
    assert partial(res) == 0


def test_send_partial_and_restarted_messages(kernel, entry):
    built = [
        F.roce(0x01, payload=100, psn=0),   # MIDDLE with no start: ignored
        F.roce(0x02, payload=100, psn=1),   # LAST with no start: partial, no record
        F.roce(0x00, payload=100, psn=2),   # FIRST ... (LAST lost)
        F.roce(0x00, payload=50, psn=4),    # FIRST again: a new message (the old one is dropped)
        F.roce(0x02, payload=50, psn=5),
    ]
    res = kernel.run(built, entry)
    f = res.flow(built[0].key)
    assert partial(res) == 1
    assert (int(f["messages"]), int(f["msg_bytes"]), hist(f["msg_hist"])) == (2, 100, {64: 1})
    assert events(res) == [(0, "send", T0 + 3000, T0 + 4000, 100)]


def test_write_chain_and_records(kernel, entry):
    """WRITE: size = RETH DMA length of FIRST/ONLY; records span FIRST..LAST."""
    dma = 5000  # IB MTU 2048 here: TC test runs take frames up to ~3.5 KB
    chain = [F.roce(0x06, payload=2048, dma_len=dma, psn=0), F.roce(0x07, payload=2048, psn=1),
             F.roce(0x09, payload=dma - 4096, psn=2, imm=dma)]
    only = [F.roce(0x0B, payload=64, dma_len=64, psn=3, imm=64)]
    zero = [F.roce(0x0B, payload=0, dma_len=0, psn=4)]     # NCCL zero-byte send
    chain2 = [F.roce(0x06, payload=2048, dma_len=4096, psn=5), F.roce(0x08, payload=2048, psn=6)]
    built = chain + only + zero + chain2
    ts = [T0, T0 + 10, T0 + 25, T0 + 100, T0 + 200, T0 + 300, T0 + 333]
    res = kernel.run(built, entry, ts=ts)
    assert_basic(res, built)
    f = res.flow(built[0].key)
    assert int(f["messages"]) == 4
    assert int(f["msg_bytes"]) == dma + 64 + 0 + 4096
    assert int(f["payload_bytes"]) == dma + 64 + 4096
    assert hist(f["msg_hist"]) == {4096: 2, 64: 1, 0: 1}
    assert events(res) == [(0, "write", T0, T0 + 25, dma), (0, "write", T0 + 100, T0 + 100, 64),
                           (0, "write", T0 + 200, T0 + 200, 0), (0, "write", T0 + 300, T0 + 333, 4096)]
    assert (int(f["psn_gaps"]), int(f["retransmissions"]), partial(res)) == (0, 0, 0)


def test_write_last_of_another_class_is_partial(kernel, entry):
    built = [F.roce(0x00, payload=10, psn=0), F.roce(0x08, payload=10, psn=1), F.roce(0x02, payload=10, psn=2)]
    res = kernel.run(built, entry)
    assert partial(res) == 1
    assert events(res) == [(0, "send", T0, T0 + 2000, 20)]


def test_read_request_record(kernel, entry):
    built = [F.roce(0x0C, dma_len=65536, psn=0), F.roce(0xAC, dma_len=1 << 20, psn=16, qp=7)]
    res = kernel.run(built, entry)
    a, b = res.flow(built[0].key), res.flow(built[1].key)
    assert (int(a["messages"]), hist(a["msg_hist"]), int(a["msg_bytes"])) == (1, {65536: 1}, 65536)
    assert (int(b["messages"]), hist(b["msg_hist"])) == (1, {1 << 20: 1})
    assert sorted(events(res)) == sorted([(res.flow_index(built[0].key), "read_request", T0, T0, 65536),
                                          (res.flow_index(built[1].key), "read_request", T0 + 1000, T0 + 1000,
                                           1 << 20)])


def test_retransmitted_start_is_a_message(kernel, entry):
    built = [F.roce(0x0A, payload=100, psn=0), F.roce(0x0A, payload=100, psn=1), F.roce(0x0A, payload=100, psn=1)]
    f = kernel.run(built, entry).flow(built[0].key)
    assert (int(f["messages"]), int(f["retransmissions"])) == (3, 1)


@pytest.mark.parametrize("size", [1, 2, 3, 63, 64, 65, 4095, 4096, 1 << 20, (1 << 31) + 5, (1 << 32) - 1])
def test_message_size_buckets(kernel, entry, size):
    b = F.roce(0x0A, payload=8, dma_len=size)
    f = kernel.run([b], entry).flow(b.key)
    assert hist(f["msg_hist"]) == {lower_bound(size): 1}


def test_gap_histogram(kernel, entry):
    """Gaps between consecutive message starts of a flow, log2 ns buckets; the last bucket
    (lower bound 2^38 ns) takes everything above. Non-start packets in between do not count."""
    gaps = [0, 1, 1000, 2000, 1 << 20, (1 << 38) + 1, 1 << 45]
    starts = [T0]
    for g in gaps:
        starts.append(starts[-1] + g)
    plan = [(0x0A, t) for t in starts]
    plan.insert(3, (0x07, starts[2] + 500))   # a WRITE_MIDDLE and an ACK between starts
    plan.insert(5, (0x11, starts[3] + 1))
    built = [F.roce(op, payload=8, psn=i) for i, (op, _) in enumerate(plan)]
    res = kernel.run(built, entry, ts=[t for _, t in plan])
    f = res.flow(built[0].key)
    want: dict = {}
    for g in gaps:
        lb = min(lower_bound(g), 1 << 38)
        want[lb] = want.get(lb, 0) + 1
    assert hist(f["gap_hist"]) == want
    assert int(f["messages"]) == len(starts)


# ---- several flows at once ---------------------------------------------------------------------
def test_many_flows_interleaved(kernel, entry):
    """IPv4, IPv6 and RoCEv1 flows, several QPs per address pair, interleaved."""
    specs = [dict(src=A, dst=B, qp=0x10), dict(src=A, dst=B, qp=0x11), dict(src=B, dst=A, qp=0x10),
             dict(src="fd00::1", dst="fd00::2", qp=0x10), dict(src="fe80::1", dst="fe80::2", qp=0x10, v1=True),
             dict(src="10.0.0.3", dst=B, qp=0x10, vlans=(12,))]
    built = []
    for step in range(12):
        for i, kw in enumerate(specs):
            op = [0x06, 0x07, 0x07, 0x08][step % 4]
            built.append(F.roce(op, payload=256 + i, psn=step, dma_len=3 * 256 + 3 * i if op == 0x06 else None,
                                sport=0xC000 + i + step, tclass=[0x02, 0x03][step % 2], **kw))
    res = kernel.run(built, entry)
    res.assert_cats(accounted=len(built))
    assert_basic(res, built)
    for kw in specs:
        f = res.flow(F.roce(0x07, **kw).key)
        assert (int(f["messages"]), int(f["psn_gaps"]), int(f["retransmissions"])) == (3, 0, 0)
    assert len(res.events) == 3 * len(specs)
    assert all(int(e["flow"]) >= 0 for e in res.events)
