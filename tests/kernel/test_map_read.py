"""Kernel tier: the flows map read after read (bpf.loader.FlowReader, what every live interval
does): each read holds exactly the packets sent by then, in key order, whether earlier reads
are still held (their buffers must not be written over) or dropped (their buffers come
back). Expectations come from the frames sent, the order from Python's byte sort."""
from __future__ import annotations

import gc

import frames as F
import numpy as np
from kharness import DT, T0

from skewscope.core import layout as L
from skewscope.core.snapshot import flow_key_matrix

V4 = ["10.0.0.1", "10.0.3.7", "10.1.0.2", "10.0.0.9"]
V6 = ["fd00::5", "fd00::1:7"]


def _flows():
    """(src, dst, qp) of 30 flows: IPv4 host pairs and IPv6 ones, a QP each."""
    pairs = [(a, b) for a in V4 for b in V4 if a != b] + [(V6[0], V6[1]), (V6[1], V6[0])]
    return [(*pairs[i % len(pairs)], 0x100 + 37 * i) for i in range(30)]


def _read_and_check(kernel, sent: dict) -> np.ndarray:
    fl = kernel.dp.read_flows()
    got = {int(q): int(p) for q, p in zip(fl["dest_qp"], fl["packets"])}
    assert got == sent
    keys = flow_key_matrix(fl)
    assert [keys[i].tobytes() for i in range(len(fl))] == sorted(keys[i].tobytes() for i in range(len(fl)))
    return fl


def test_reads_held_and_dropped(kernel):
    flows = _flows()
    kernel.dp.reset()
    sent: dict = {}
    held, want = [], []
    t = T0
    for r in range(8):
        batch = flows[: 10 + 3 * r]             # the table grows; earlier flows keep counting
        frames = [F.roce(0x0A, src=s, dst=d, qp=q, payload=256, psn=r) for s, d, q in batch]
        kernel.run(frames, "xdp", t0=t, reset=False)
        t += len(frames) * DT
        for _, _, q in batch:
            sent[q] = sent.get(q, 0) + 1
        fl = _read_and_check(kernel, sent)
        if r % 2 == 0:                          # every other read held to the end
            held.append(fl)
            want.append(dict(sent))
        del fl
        gc.collect()
    for fl, w in zip(held, want):
        assert {int(q): int(p) for q, p in zip(fl["dest_qp"], fl["packets"])} == w
        assert fl.dtype == L.FLOW_DTYPE
    # the reads not held gave their buffers back to the next read
    assert kernel.dp._flow_reader.pool.reused >= 3
