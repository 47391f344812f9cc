"""Period, jitter, bursts and decode detection on hand-built message records whose timing
is known by construction."""
from __future__ import annotations

import math

import numpy as np

from skewscope.analysis import group_timing, timing
from skewscope.analysis.intervals import break_candidates, natural_break
from skewscope.analysis.timing import fit_period
from skewscope.core import layout as L
from skewscope.core.snapshot import Snapshot, ip_bytes

MS = 1_000_000


def ring_snap(starts_ns, n=4, msg=262144, msgs_per_iter=6, pkt_ns=330.0, gap_ns=2000.0, sub_offsets=(0,)):
    """A 4-node ring: at each iteration start (+ each sub-burst offset) every link sends
    msgs_per_iter messages back to back (gap_ns between), at IB MTU 4096."""
    fl = np.zeros(n, dtype=L.FLOW_DTYPE)
    npk = msg // 4096
    for i in range(n):
        fl["src"][i] = np.frombuffer(ip_bytes(f"10.0.0.{i + 1}")[0], np.uint8)
        fl["dst"][i] = np.frombuffer(ip_bytes(f"10.0.0.{(i + 1) % n + 1}")[0], np.uint8)
        fl["dest_qp"][i] = 100 + i
        fl["ipver"][i] = 4
        fl["roce"][i] = 2
    ev = []
    dur = (npk - 1) * pkt_ns
    for t0 in starts_ns:
        for off in sub_offsets:
            for i in range(n):
                t = t0 + off
                for k in range(msgs_per_iter):
                    ev.append((i, L.OPC_WRITE, int(t), int(t + dur), msg))
                    t += dur + pkt_ns + gap_ns
    ev = np.array(ev, dtype=L.EVENT_DTYPE)
    ev = ev[np.argsort(ev["start_ts"], kind="stable")]
    cnt = np.bincount(ev["flow"], minlength=n)
    fl["messages"] = cnt
    fl["msg_bytes"] = cnt * msg
    fl["packets"] = cnt * npk
    fl["payload_bytes"] = cnt * msg
    fl["op"][:, L.OPC_WRITE] = cnt * npk
    fl["msg_hist"][:, int(msg).bit_length()] = cnt
    fl["first_ts"] = ev["start_ts"].min()
    fl["last_ts"] = ev["end_ts"].max()
    span = int(ev["end_ts"].max())
    return Snapshot(fl, ev, np.zeros(L.G_N, np.uint64), {"source": "test", "first_ts": 0, "last_ts": span,
                                                           "duration_s": span / 1e9})


def test_regular_period_and_jitter():
    rng = np.random.default_rng(7)
    off = rng.normal(0, 0.03 * 5 * MS, size=30)
    starts = 1 * MS + np.arange(30) * 5 * MS + off
    snap = ring_snap(starts)
    t = timing(snap)
    assert t["iterations"] == 30 and t["period_source"] == "bursts"
    # ground truth: the injected start offsets around their own best-fit grid
    idx = np.arange(30)
    c = np.polyfit(idx, starts, 1)
    true_jit = np.std(starts - np.polyval(c, idx), ddof=2)
    assert math.isclose(t["period_s"], c[0] / 1e9, rel_tol=1e-3)
    assert math.isclose(t["period_s"], 5e-3, rel_tol=0.02)
    assert math.isclose(t["period_jitter_s"], true_jit / 1e9, rel_tol=0.02)


def test_missing_iteration_and_sub_phases():
    starts = [k * 4 * MS for k in range(12) if k != 5]            # one iteration not captured
    snap = ring_snap(starts, sub_offsets=(0, 600_000))             # two phases per iteration
    t = timing(snap)
    assert math.isclose(t["period_s"], 4e-3, rel_tol=1e-3)
    assert t["iterations"] == 11


def test_no_period_in_random_traffic():
    rng = np.random.default_rng(1)
    starts = np.cumsum(rng.exponential(3 * MS, size=25))
    assert timing(ring_snap(starts)) is None


def test_period_from_autocorrelation_without_gaps():
    # continuous traffic (no idle gap >= 1 us): 1 ms of back-to-back 1 MiB messages, then
    # 1 ms of 4 KiB messages with 0.9 us between them (~27 % utilisation), repeated
    n = 2
    fl = np.zeros(n, dtype=L.FLOW_DTYPE)
    for i in range(n):
        fl["src"][i] = np.frombuffer(ip_bytes(f"10.0.0.{i + 1}")[0], np.uint8)
        fl["dst"][i] = np.frombuffer(ip_bytes(f"10.0.0.{2 - i}")[0], np.uint8)
        fl["dest_qp"][i] = 10 + i
        fl["ipver"][i] = 4
    ev = []
    t = 0.0
    while t < 40 * MS:
        big = (t % (2 * MS)) < 1 * MS
        b = 1 << 20 if big else 1 << 12
        d = b / 12.0                                             # ~96 Gb/s
        ev.append((0, L.OPC_WRITE, int(t), int(t + d), b))
        t += d + (200 if big else 900)
    ev = np.array(ev, dtype=L.EVENT_DTYPE)
    fl["messages"][0] = len(ev)
    fl["msg_bytes"][0] = ev["bytes"].sum()
    fl["payload_bytes"][0] = ev["bytes"].sum()
    fl["op"][0, L.OPC_WRITE] = int(np.sum(np.ceil(ev["bytes"] / 4096)))
    fl["packets"][0] = fl["op"][0, L.OPC_WRITE]
    fl["msg_hist"][0, 21] = len(ev)
    snap = Snapshot(fl, ev, np.zeros(L.G_N, np.uint64), {"source": "test", "duration_s": 0.04})
    tm, _ = group_timing(snap)
    assert tm["period_source"] == "autocorrelation"
    assert math.isclose(tm["period_s"], 2e-3, rel_tol=0.05)


def test_fit_period_edge_cases():
    assert fit_period([5.0])[0] is None
    per, jit, cv, regular = fit_period([0.0, 10.0])
    assert per == 10.0 and jit is None and regular
    # bursts closer than half the typical spacing are not iterations of one period
    assert not fit_period([0, 10, 12, 20, 30])[3]


def test_natural_breaks():
    gaps = np.array([2.0] * 50 + [80.0] * 20 + [3000.0] * 3)
    c = break_candidates(gaps, 3.0, 1.0)
    assert len(c) == 2 and 80 < c[0] < 3000 and 2 < c[1] < 80
    assert natural_break(gaps, 3.0, 1.0) == c[0]
    assert natural_break(np.array([5.0, 5.2, 4.9]), 3.0, 0.0) == np.inf


def test_decode_detection():
    """Small collectives every 100 us with idle time between are decode; the same count of
    back-to-back 1 MiB steps is one big training collective."""
    from skewscope.analysis import analyze
    starts = np.arange(64) * 100_000.0 + 50_000
    small = ring_snap(starts, msg=8192, msgs_per_iter=1)
    a = analyze(small)
    assert a["collectives"][0]["kind"] == "ring_allreduce"
    dec = a["collectives"][0]["metrics"].get("decode")
    assert dec and math.isclose(dec["collective_interval_p50_s"], 100e-6, rel_tol=1e-3)
    assert a["timing"]["workload"] == "decode"
    big = ring_snap(starts[:2] * 40, msg=1 << 20, msgs_per_iter=12)
    a = analyze(big)
    assert "decode" not in a["collectives"][0]["metrics"]
