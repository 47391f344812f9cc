"""Flow roles, QP-pair partners, rates over active time, matrices and incast degree.

Ground truth: the generator's per-flow truth (role, reverse_flow, payload) for the
role/partner/matrix tests; hand-built Snapshots with known timing for the rate kernels.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import genlib

from skewscope.analysis import analyze, context, flow_roles, incast_degree, link_rates, node_matrix
from skewscope.analysis.flows import ROLE_NAMES
from skewscope.core import layout as L
from skewscope.core.snapshot import Snapshot, ip_bytes, ip_str


def keys(snap):
    return [(ip_str(f["src"], f["ipver"]), ip_str(f["dst"], f["ipver"]), int(f["dest_qp"])) for f in snap.flows]


@pytest.mark.parametrize("name", ["ring-healthy", "alltoall-healthy", "congestion", "loss", "pipeline-healthy",
                                  "mixed", "tp-decode-prefill", "ipv6-vlan-hot-expert", "incast"])
def test_roles_and_partners_match_truth(name):
    truth, snap = genlib.get(name)
    ctx = context(snap)
    tf = {(x["src"], x["dst"], x["dest_qp"]): x for x in truth["flows"]}
    ks = keys(snap)
    for i, k in enumerate(ks):
        t = tf[k]
        assert ROLE_NAMES[ctx.roles[i]] == t["role"], f"{name} {k}: {ROLE_NAMES[ctx.roles[i]]} vs {t['role']}"
        p = ctx.partner[i]
        assert (ks[p] if p >= 0 else None) == tuple(t["reverse_flow"]), f"{name} {k}: partner"


def test_partner_without_source_port():
    """With a constant UDP source port (sport: 0) the QP pairing falls back to elimination:
    a node pair with one data flow one way and one CTS flow back still pairs."""
    sc = {"nodes": 4, "sport": 0, "iterations": 2, "period_ms": 2.0,
          "workloads": [{"kind": "ring_allreduce", "bytes": "2MiB", "channels": 1}]}
    import os
    import tempfile

    from skewscope import gen as skewgen
    from skewscope.sources.offline import parse_file
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "t.pcap")
        cap = skewgen.write(sc, p, seed=0, snaplen=128)
        snap = parse_file(p)
        truth = cap.truth
    ctx = context(snap)
    assert (snap.flows["sport"] == 0).all()
    tf = {(x["src"], x["dst"], x["dest_qp"]): x for x in truth["flows"]}
    ks = keys(snap)
    for i, k in enumerate(ks):
        assert ROLE_NAMES[ctx.roles[i]] == tf[k]["role"]
        assert ks[ctx.partner[i]] == tuple(tf[k]["reverse_flow"])


def test_matrix_counts_data_only():
    truth, snap = genlib.get("moe-hot-expert")
    ips, m = node_matrix(snap)
    data = sum(x["payload_bytes"] for x in truth["flows"] if x["role"] == "data")
    cts = sum(x["payload_bytes"] for x in truth["flows"] if x["role"] == "cts")
    assert cts > 0 and m.sum() == data
    # per pair, from the truth flows
    for x in truth["flows"]:
        if x["role"] == "data":
            assert m[ips.index(x["src"]), ips.index(x["dst"])] >= x["payload_bytes"]


# ---- hand-built snapshots ------------------------------------------------------------------------
def make_snap(flow_specs, events, duration_ns=10**7):
    """flow_specs: [(src, dst, qp, dict of counters)], events: [(flow, start, end, bytes)]."""
    fl = np.zeros(len(flow_specs), dtype=L.FLOW_DTYPE)
    for i, (s, d, q, c) in enumerate(flow_specs):
        sb, v = ip_bytes(s)
        db, _ = ip_bytes(d)
        fl["src"][i] = np.frombuffer(sb, np.uint8)
        fl["dst"][i] = np.frombuffer(db, np.uint8)
        fl["dest_qp"][i] = q
        fl["ipver"][i] = v
        fl["roce"][i] = 2
        for k, val in c.items():
            if k == "op":
                for cls, n in val.items():
                    fl["op"][i, cls] = n
            elif k == "msg_hist":
                for slot, n in val.items():
                    fl["msg_hist"][i, slot] = n
            else:
                fl[k][i] = val
    ev = np.zeros(len(events), dtype=L.EVENT_DTYPE)
    for j, (f, s, e, b) in enumerate(events):
        ev[j] = (f, L.OPC_WRITE, s, e, b)
    ev = ev[np.argsort(ev["start_ts"], kind="stable")]
    g = np.zeros(L.G_N, np.uint64)
    return Snapshot(fl, ev, g, {"source": "test", "duration_s": duration_ns / 1e9, "first_ts": 0,
                                "last_ts": duration_ns})


def slot(b):
    return 0 if b == 0 else int(b).bit_length()


def test_rate_over_active_time_and_mtu():
    # 10 messages of 8192 B at IB MTU 1024 (8 packets), 100 ns between packets -> 700 ns
    # first-to-last: 8 packets of 1024 B every 100 ns = 81.92 Gb/s; long idle gaps between
    ev = [(0, 1_000_000 * k, 1_000_000 * k + 700, 8192) for k in range(10)]
    snap = make_snap([("10.0.0.1", "10.0.0.2", 7, {"packets": 80, "payload_bytes": 81920, "messages": 10,
                                                    "msg_bytes": 81920, "op": {L.OPC_WRITE: 80},
                                                    "msg_hist": {slot(8192): 10}})], ev)
    st = context(snap).fstat[0]
    assert st["mtu"] == 1024
    assert math.isclose(st["rate_bps"], 81.92e9, rel_tol=1e-9)
    assert math.isclose(st["pkt_ns"], 100.0)
    assert math.isclose(st["busy_ns"], 10 * 800.0)
    assert st["stall_n"] == 0
    lr = link_rates(snap)
    assert len(lr) == 1 and math.isclose(lr["throughput_bps"][0], 81920 * 8e9 / 8000)


def test_stalled_message():
    ev = [(0, 10_000 * k, 10_000 * k + 700, 8192) for k in range(9)] + [(0, 200_000, 200_000 + 7000, 8192)]
    snap = make_snap([("10.0.0.1", "10.0.0.2", 7, {"packets": 80, "payload_bytes": 81920, "messages": 10,
                                                    "msg_bytes": 81920, "op": {L.OPC_WRITE: 80},
                                                    "msg_hist": {slot(8192): 10}})], ev)
    st = context(snap).fstat[0]
    assert st["stall_n"] == 1
    assert math.isclose(st["stall_max_ns"], 8000 - 800)
    assert math.isclose(st["rate_med_bps"], 81.92e9)          # the median ignores the stall
    assert st["rate_bps"] < 0.6 * 81.92e9                     # the aggregate does not


def test_cts_role_needs_bigger_reverse():
    big = {"packets": 16, "payload_bytes": 65536, "messages": 1, "msg_bytes": 65536, "op": {L.OPC_WRITE: 16},
           "msg_hist": {slot(65536): 1}}
    small = {"packets": 1, "payload_bytes": 64, "messages": 1, "msg_bytes": 64, "op": {L.OPC_WRITE: 1},
             "msg_hist": {slot(64): 1}}
    snap = make_snap([("10.0.0.1", "10.0.0.2", 5, big), ("10.0.0.2", "10.0.0.1", 6, small),
                      ("10.0.0.3", "10.0.0.4", 5, small)], [])
    r = [ROLE_NAMES[x] for x in flow_roles(snap)]
    # a lone small-message flow is data (tiny messages of an application), not a CTS
    assert r == ["data", "cts", "data"]


def test_incast_degree_counts_distinct_senders():
    # node .9 receives from 5 senders at once (2 QPs from .1), node .8 from one
    specs = [(f"10.0.0.{s}", "10.0.0.9", 10 + k, {"messages": 1, "msg_bytes": 65536, "op": {L.OPC_WRITE: 16},
                                                  "msg_hist": {slot(65536): 1}, "payload_bytes": 65536,
                                                  "packets": 16})
             for k, s in enumerate([1, 1, 2, 3, 4, 5])]
    specs.append(("10.0.0.6", "10.0.0.8", 99, specs[0][3]))
    ev = [(k, 1000, 20000, 65536) for k in range(6)] + [(6, 1000, 20000, 65536)]
    snap = make_snap(specs, ev)
    inc = incast_degree(snap)
    ips = context(snap).nodes.ips
    assert inc["max_senders"][ips.index("10.0.0.9")] == 5
    assert inc["max_senders"][ips.index("10.0.0.8")] == 1


def test_evicted_and_empty_inputs():
    from skewscope.core.snapshot import empty
    a = analyze(empty({"source": "test"}))
    assert a["collectives"] == [] and a["timing"] is None and a["findings"] == []
    # records of an evicted flow (flow = -1) are ignored, not an error
    snap = make_snap([("10.0.0.1", "10.0.0.2", 7, {"packets": 8, "payload_bytes": 8192, "messages": 1,
                                                    "msg_bytes": 8192, "op": {L.OPC_WRITE: 8},
                                                    "msg_hist": {slot(8192): 1}})],
                     [(0, 100, 800, 8192), (-1, 200, 900, 8192)])
    analyze(snap)
    assert context(snap).fstat["n_rec"][0] == 1


@pytest.mark.parametrize("name", ["alltoall-healthy", "congestion", "ipv6-vlan-hot-expert"])
def test_flow_columns_equal_numpy_fields(name):
    """flow_columns (one pass over the 850-byte rows, with a software prefetch ahead) gives
    exactly numpy's own field reads -- also for a non-contiguous table (every other row,
    reversed) and for a table too short to prefetch anything."""
    from skewscope.analysis.flows import COL_U64, flow_columns
    _, snap = genlib.get(name)
    for fl in (snap.flows, snap.flows[::-2], snap.flows[:3]):
        c = flow_columns(fl)
        for k in COL_U64 + ("first_ts", "last_ts", "sport", "dest_qp", "ipver"):
            assert np.array_equal(c[k], fl[k]), k
        assert np.array_equal(c["op"], fl["op"])
        be = fl["src"].astype(np.uint64), fl["dst"].astype(np.uint64)
        for half, (arr, lo) in enumerate(((be[0], 0), (be[0], 8), (be[1], 0), (be[1], 8))):
            want = np.zeros(len(fl), np.uint64)
            for b in range(8):
                want = (want << np.uint64(8)) | arr[:, lo + b]
            assert np.array_equal(c["addr"][half], want)
        # max_slot: the highest non-empty message-size slot (small-message flows)
        small = (fl["messages"] > 0) & (fl["msg_bytes"] <= 1024 * fl["messages"])
        for i in np.nonzero(small)[0]:
            assert c["max_slot"][i] == np.nonzero(fl["msg_hist"][i])[0].max()
        empty = (fl["msg_hist"].sum(axis=1) == 0) & (fl["messages"] == 0)
        assert (c["max_slot"][empty] == -1).all()
