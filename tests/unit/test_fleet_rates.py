"""Fleet stragglers by rate and by own lag (analysis/detectors/fleet.py, issue 25 class 5), on
fleet matrices built here from stated per-pair bytes, packets, messages and on-wire times
(what the exporters' series hold), so the expected blame follows from the numbers given:

* a ring of chunk pairs (64 KiB messages, as perftest's soft-RoCE ring or an NCCL ring of
  many ranks): the link at a quarter of the others' rate over active time names its sender
  (ring_straggler), as the single-node detector does on the mirror; with 1-2 packets per
  message the rates are not judged;
* an all-to-all member sending at 0.4x the members' rate over its own active time (source
  busy time) is a straggler;
* a ring whose members all wait alike (barrier timing: forward latencies equal) names the
  one member whose own DPU sees it late on its own (own lag), and nobody in a healthy one.
"""
from __future__ import annotations

import numpy as np

from skewscope.analysis.detectors.fleet import analyze_matrix
from skewscope.analysis.fleet import from_dense
from skewscope.outputs import metrics as M

NAMES = ("bytes", "packets", "messages", "message_bytes", "busy_seconds", "timed_message_bytes",
         "message_wire_seconds", "ce_packets", "cnp_packets", "retransmitted_packets", "psn_gaps")


class Fm:
    """A FleetMatrix stand-in: chunk-class pairs given by bytes, message size and rate."""

    def __init__(self, ips, chunk_bytes, msg_bytes, rate_bps, mtu=4096, src_busy=None, timing=None):
        n = len(ips)
        self.ips, self.window_s, self.timing = ips, None, timing or {}
        self.by_class = {k: np.zeros((3, n, n)) for k in NAMES}
        c = self.by_class
        msgs = np.where(chunk_bytes > 0, np.ceil(chunk_bytes / msg_bytes), 0)
        c["bytes"][1] = chunk_bytes
        c["message_bytes"][1] = chunk_bytes
        c["messages"][1] = msgs
        c["packets"][1] = msgs * np.ceil(msg_bytes / mtu)
        c["timed_message_bytes"][1] = chunk_bytes
        with np.errstate(divide="ignore", invalid="ignore"):
            c["message_wire_seconds"][1] = np.where(chunk_bytes > 0, 8 * chunk_bytes / np.where(rate_bps > 0, rate_bps, 1), 0)
        c["busy_seconds"][1] = c["message_wire_seconds"][1]
        self.naks = {"psn_sequence_error": np.zeros((n, n))}
        self.dst_busy_seconds = np.ones(n)
        self.src_busy_seconds = src_busy
        self.exported_by = {}
        self.pairs, self.by_class, self.naks = from_dense(self.by_class, self.naks)     # what cluster builds

    @property
    def pair(self):
        return {k: v.sum(axis=0) for k, v in self.by_class.items()}

    def cls(self, name, klass):
        return self.by_class[name][("bulk", "chunk", "control").index(klass)]


def _ring(n, slow, factor, msg=64 * 1024):
    ips = [f"10.77.0.{i + 1}" for i in range(n)]
    b = np.zeros((n, n))
    r = np.zeros((n, n))
    for i in range(n):
        b[i, (i + 1) % n] = 32 * msg
        r[i, (i + 1) % n] = 20e6 * (factor if i == slow else 1.0)
    return ips, b, r


def kinds(doc, kind):
    return [f for f in doc["findings"] if f["kind"] == kind and f["severity"] in ("warning", "critical")]


def test_a_chunk_ring_names_its_slow_sender():
    ips, b, r = _ring(4, 2, 0.25)
    doc = analyze_matrix(Fm(ips, b, 64 * 1024, r))
    f = kinds(doc, "ring_straggler")
    assert len(f) == 1 and f[0]["entities"]["ips"][:2] == ["10.77.0.3", "10.77.0.4"], doc["findings"]
    assert f[0]["severity"] == "critical" and abs(f[0]["evidence"]["score"] - 0.25) < 0.01
    ring = [c for c in doc["collectives"] if c["kind"] == "ring_allreduce"]
    assert ring and ring[0]["members"] == ips and ring[0]["metrics"]["traffic_class"] == "chunk"
    # healthy: the same ring at one rate
    ips, b, r = _ring(6, 0, 1.0)
    assert not kinds(analyze_matrix(Fm(ips, b, 64 * 1024, r)), "ring_straggler")


def test_chunk_ring_rates_of_one_or_two_packet_messages_are_not_judged():
    ips, b, r = _ring(4, 2, 0.25, msg=8 * 1024)            # 2 packets per message
    doc = analyze_matrix(Fm(ips, b, 8 * 1024, r))
    assert not kinds(doc, "ring_straggler")
    assert all(x is None for x in doc["collectives"][0]["metrics"]["link_rate_bps"])


def test_two_chunk_pairs_both_ways_are_not_a_ring():
    ips = ["10.0.0.1", "10.0.0.2"]
    b = np.array([[0, 1e6], [1e6, 0]])
    doc = analyze_matrix(Fm(ips, b, 64 * 1024, np.array([[0, 1e9], [1e9, 0]])))
    assert not [c for c in doc["collectives"] if c["kind"] == "ring_allreduce"]


def test_an_alltoall_member_slow_over_its_own_active_time_is_a_straggler():
    n = 6
    ips = [f"10.0.0.{i + 1}" for i in range(n)]
    b = np.full((n, n), 4e6)
    np.fill_diagonal(b, 0)
    r = np.full((n, n), 40e9)
    busy = 8 * b.sum(axis=1) / 40e9            # each source busy as long as its bytes at 40 Gb/s ...
    busy[3] /= 0.4                             # ... but 10.0.0.4 takes 2.5x as long: 0.4x the rate
    doc = analyze_matrix(Fm(ips, b, 64 * 1024, r, src_busy=busy))
    f = kinds(doc, "straggler")
    assert len(f) == 1 and f[0]["entities"]["ips"][0] == "10.0.0.4", doc["findings"]
    assert f[0]["severity"] == "critical" and abs(f[0]["evidence"]["send_ratio"] - 0.4) < 0.01
    a2a = next(c for c in doc["collectives"] if c["kind"] == "all_to_all")
    assert abs(a2a["metrics"]["member_send_rate_bps"][3] / a2a["metrics"]["member_send_rate_bps"][0] - 0.4) < 0.01
    busy[3] = 8 * b[3].sum() / 40e9
    assert not kinds(analyze_matrix(Fm(ips, b, 64 * 1024, r, src_busy=busy)), "straggler")
    # a member whose own DPU exported no busy time is not rated (its bytes alone say nothing)
    busy[3] = np.nan
    assert not kinds(analyze_matrix(Fm(ips, b, 64 * 1024, r, src_busy=busy)), "straggler")


DUR = np.array(M.DURATION_BUCKETS)
OFF = np.array(M.OFFSET_BUCKETS)


def _h(samples, bounds):
    x = np.asarray(samples, dtype=np.float64)
    return bounds, np.array([np.count_nonzero(x <= b) for b in bounds] + [len(x)], dtype=np.float64), float(x.sum())


def _timing(ips, late_ip, lag_s, fwd_s, steps=120):
    """Per-node timing entries of a 4-way TP decode ring under barrier timing: every member's
    forward latency is the barrier wait (fwd_s), the late one's own lag is lag_s per step."""
    n = len(ips)
    out = {}
    for i, ip in enumerate(ips):
        own = [lag_s if ip == late_ip else 0.0] * steps
        out[(ip, "tp_decode")] = {
            "dpu": f"dpu{i}", "steps": float(steps), "collectives": 24.0, "iterations": 4.0,
            "hist": {"forward_latency": _h([fwd_s] * steps, DUR), "own_lag": _h(own, DUR),
                     "iteration": _h([3e-3] * 3, DUR)},
            "peers": {ips[(i - 1) % n]: {"arrival": _h([0.0] * steps, OFF), "start": _h([0.0] * 24, OFF)}}}
    return out


def test_a_barrier_ring_names_the_member_late_on_its_own():
    ips = [f"10.0.0.{i + 1}" for i in range(4)]
    z = np.zeros((4, 4))
    doc = analyze_matrix(Fm(ips, z, 1, z, timing=_timing(ips, "10.0.0.3", 80e-6, 82e-6)))
    f = kinds(doc, "slow_tp_shard")
    assert len(f) == 1 and f[0]["entities"]["ips"][0] == "10.0.0.3", doc["findings"]
    assert 50e-6 <= f[0]["evidence"]["own_lag_s"] <= 100e-6
    # nobody late on its own (every member waits alike): nobody named
    doc = analyze_matrix(Fm(ips, z, 1, z, timing=_timing(ips, None, 0.0, 82e-6)))
    assert not kinds(doc, "slow_tp_shard")
