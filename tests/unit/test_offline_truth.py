"""Offline parser against the generator's ground truth (issue 4), no root.

For every skewgen preset (whatever presets exist: PRESETS is iterated, the largest one
skipped for time), written headers-only (snaplen 128, the normal mirror-port capture),
`offline.parse_file` must report exactly the per-flow counters skewgen computed from its own
packet table (not from the pcap): packets, wire bytes, payload bytes, messages, CE/ECT,
CNPs, ACKs/NAKs, PSN gaps, retransmissions, first/last timestamps, RETH message-size
histogram, opcode classes; and the capture-wide frame, RoCE, non-RoCE and PFC counts.
"""
from __future__ import annotations

import numpy as np
import pytest

from skewscope.core import layout as L
from skewscope.outputs.report import flow_dicts
from skewscope.sources import offline

skewgen = pytest.importorskip("skewscope.gen")

SKIP = {"ring-32"}  # 2M frames: covered by tools/bench/bench_offline.py
PRESETS = [p for p in skewgen.PRESETS if p not in SKIP]

# opcode name (skewgen's) -> the class it must be counted in (wire.md's opcode table)
CLASS_OF = {
    "SEND_FIRST": "send", "SEND_MIDDLE": "send", "SEND_LAST": "send", "SEND_LAST_WITH_IMMEDIATE": "send",
    "SEND_ONLY": "send", "SEND_ONLY_WITH_IMMEDIATE": "send", "SEND_LAST_WITH_INVALIDATE": "send",
    "SEND_ONLY_WITH_INVALIDATE": "send",
    "RDMA_WRITE_FIRST": "write", "RDMA_WRITE_MIDDLE": "write", "RDMA_WRITE_LAST": "write",
    "RDMA_WRITE_LAST_WITH_IMMEDIATE": "write", "RDMA_WRITE_ONLY": "write",
    "RDMA_WRITE_ONLY_WITH_IMMEDIATE": "write", "RDMA_READ_REQUEST": "read_request",
    "RDMA_READ_RESPONSE_FIRST": "read_response", "RDMA_READ_RESPONSE_MIDDLE": "read_response",
    "RDMA_READ_RESPONSE_LAST": "read_response", "RDMA_READ_RESPONSE_ONLY": "read_response",
    "ACKNOWLEDGE": "ack", "ATOMIC_ACKNOWLEDGE": "atomic_ack", "COMPARE_SWAP": "atomic", "FETCH_ADD": "atomic",
    "CNP": "cnp",
}
FIELDS = ("packets", "bytes", "payload_bytes", "messages", "ce_packets", "ecn_capable_packets", "cnp_packets",
          "acks", "naks", "psn_gaps", "retransmissions", "first_ts", "last_ts", "udp_sport")


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_matches_ground_truth(tmp_path, preset):
    out = tmp_path / f"{preset}.pcap"
    cap = skewgen.write(preset, out, seed=7, snaplen=128)
    truth = cap.truth
    snap = offline.parse_file(out)
    g = snap.globals
    assert int(g[L.G_FRAMES]) == truth["frames"] == len(cap)
    assert int(g[L.G_ACCOUNTED]) == truth["roce_frames"]
    assert int(g[L.G_PFC]) == truth["pfc"]["pause_frames"]
    assert [int(g[L.G_PFC_PAUSE + p]) + int(g[L.G_PFC_XON + p]) for p in range(8)] == truth["pfc"]["per_priority"]
    assert int(g[L.G_NON_ROCE]) + int(g[L.G_PFC]) == truth["non_roce_frames"]
    assert int(g[:L.G_NCAT].sum()) == truth["frames"]
    assert snap.meta["first_ts"] == int(cap.timestamps[0]) and snap.meta["last_ts"] == int(cap.timestamps[-1])

    got = {(d["src"], d["dst"], d["dest_qp"]): d for d in flow_dicts(snap)}
    want = {(f["src"], f["dst"], f["dest_qp"]): f for f in truth["flows"]}
    assert set(got) == set(want), (set(got) ^ set(want))
    for k, t in want.items():
        d = got[k]
        diff = {f: (d[f], t[f]) for f in FIELDS if d[f] != t[f]}
        assert not diff, (preset, k, diff)
        classes = {}
        for name, n in t["opcodes"].items():
            classes[CLASS_OF[name]] = classes.get(CLASS_OF[name], 0) + n
        assert d["opcode_classes"] == classes, (preset, k)
        # skewgen's histogram covers RETH sizes (WRITE/READ); SEND sizes would add to ours
        if "send" not in classes:
            assert d["msg_size_hist"] == t["msg_size_hist"], (preset, k)
    # message records: one per completed WRITE (LAST/ONLY) and per READ_REQUEST, sized by RETH
    ev = snap.events
    assert np.all(ev["flow"] >= 0) and np.all(np.diff(ev["start_ts"].astype(np.int64)) >= 0)
    assert np.all(ev["end_ts"] >= ev["start_ts"])
