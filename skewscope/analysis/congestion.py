"""Congestion and loss indicators per flow / QP, and PFC. Definitions: docs/metrics.md
"Congestion and loss".

    ce_fraction      CE-marked / ECN-capable packets of a flow (CE / packets when no packet
                     is ECN-capable, which only happens when the marks are bogus)
    cnp_rate_per_s   CNPs addressed to a QP per second of that QP's activity: CNPs of the
                     flow (receiver -> sender, dest QP = the sender's QP) / the busy time
                     (message on-wire time) of the data flow it throttles (its partner),
                     else / the flow's own first..last span
    loss_rate        PSNs skipped / (request packets + PSNs skipped) of a data flow
    naks             NAKs are sent by the responder on the reverse flow; they are counted
                     there and attributed to the data flow through the QP-pair partner
    pfc pause time   pause quanta x 512 bit times at the link speed (estimated: the fastest
                     node pair's throughput over active time, rounded up to a standard
                     Ethernet speed; overridable)
"""
from __future__ import annotations

import numpy as np

from skewscope.analysis.context import context
from skewscope.analysis.flows import CONG_POOL
from skewscope.analysis.matrix import link_rates
from skewscope.core import layout as L
from skewscope.core.jit import njit

OPC_SEND, OPC_WRITE, OPC_READ_REQ, OPC_ATOMIC = L.OPC_SEND, L.OPC_WRITE, L.OPC_READ_REQ, L.OPC_ATOMIC
STANDARD_GBPS = (1, 10, 25, 40, 50, 100, 200, 400, 800, 1600)

CONG_DTYPE = np.dtype([
    ("ce", "<f8"), ("ecn_capable", "<f8"), ("ce_fraction", "<f8"),
    ("cnp", "<f8"), ("cnp_rate_per_s", "<f8"),
    ("psn_gaps", "<f8"), ("psn_skipped", "<f8"), ("retransmissions", "<f8"), ("loss_rate", "<f8"),
    ("nak_seq", "<f8"), ("nak_rnr", "<f8"), ("nak_other", "<f8"),
])


def flow_congestion(snap, active_time: bool = True) -> np.ndarray:
    """Per-flow congestion/loss indicators (CONG_DTYPE), counters scaled by the sampling
    denominator. active_time=False: CNP rates over the flow's first..last span (no message
    records needed: the live view's per-interval work)."""
    cols = congestion_table(snap, active_time)
    out = np.empty(len(context(snap).flows), dtype=CONG_DTYPE)
    for name in CONG_DTYPE.names:
        out[name] = cols[name]
    return out


def congestion_columns(snap, active_time: bool = True) -> dict:
    """flow_congestion as {field: float64 array} (what the detectors index: a field of the
    structured array is a view made anew at every access, slow to index flow by flow)."""
    return congestion_table(snap, active_time)


def congestion_table(snap, active_time) -> dict:
    """{CONG_DTYPE field: contiguous float64 column}: one (fields x flows) table, each
    field a row of it (the detectors scan whole columns; a strided field of a row-major
    table costs a cache line per flow)."""
    ctx = context(snap)
    fl = ctx.cols
    n = len(ctx.flows)
    nc = len(CONG_DTYPE.names)
    tab = CONG_POOL.take(nc * n).reshape(nc, n)    # (the kernel writes every element)
    if n:
        part = ctx.partner
        busy = ctx.fstat["busy_ns"] if active_time else np.zeros(0)
        _cong_kernel(fl["ce"], fl["ecn_capable"], fl["packets"], fl["cnp"], fl["first_ts"], fl["last_ts"], part, busy,
                     fl["psn_gaps"], fl["psn_skipped"], fl["retransmissions"], fl["op"], fl["nak_seq"], fl["nak_rnr"],
                     fl["nak_other"], float(ctx.scale), ctx.duration_ns / 1e9, tab)
    return {name: tab[k] for k, name in enumerate(CONG_DTYPE.names)}


@njit(cache=True, nogil=True)
def _cong_kernel(ce, ect, pk, cnp, first, last, part, busy, gaps, skipped, retx, op, ns, nr, no, sc, dur, out):
    """busy: per-flow busy ns (active time), or empty: CNP rates over first..last."""
    n = ce.shape[0]
    has_busy = busy.shape[0] == n
    for i in range(n):
        c = float(ce[i])
        e = float(ect[i])
        out[0, i] = c * sc
        out[1, i] = e * sc
        out[2, i] = 0.0
        if e > 0:
            out[2, i] = c / e
        elif pk[i] > 0:
            out[2, i] = c / float(pk[i])
        k = float(cnp[i])
        out[3, i] = k * sc
        out[4, i] = 0.0
        if k > 0:
            span = (float(last[i]) - float(first[i])) / 1e9
            p = part[i]
            den = busy[p] / 1e9 if has_busy and p >= 0 and busy[p] > 0 else (span if span > 0 else dur)
            out[4, i] = k * sc / max(den, 1e-9)
        out[5, i] = float(gaps[i]) * sc
        sk = float(skipped[i])
        out[6, i] = sk * sc
        out[7, i] = float(retx[i]) * sc
        out[8, i] = 0.0
        if sk > 0:
            # requests: the flow's SEND, WRITE, READ request and atomic packets
            req = op[i, OPC_SEND] + op[i, OPC_WRITE] + op[i, OPC_READ_REQ] + op[i, OPC_ATOMIC]
            out[8, i] = sk / max(1.0, float(req) + sk)
        out[9, i] = float(ns[i]) * sc
        out[10, i] = float(nr[i]) * sc
        out[11, i] = float(no[i]) * sc


def link_speed_bps(snap, override_gbps: float | None = None) -> float | None:
    """Estimated Ethernet link speed: the highest node-pair throughput over active time,
    x 1.03 for headers, rounded up to a standard speed. None without timing data."""
    if override_gbps:
        return float(override_gbps) * 1e9
    ctx = context(snap)
    lr = link_rates(ctx)
    vals = []
    if len(lr):
        t = lr["throughput_bps"][np.isfinite(lr["throughput_bps"])]
        r = lr["rate_bps"][np.isfinite(lr["rate_bps"])]
        vals = list(t) + list(r)
    if not vals:
        return None
    top = max(vals) * 1.03 / 1e9
    for s in STANDARD_GBPS:
        if top <= s * 1.02:
            return s * 1e9
    return STANDARD_GBPS[-1] * 1e9


def pfc_summary(snap, link_gbps: float | None = None) -> dict:
    """PFC per priority: pause / resume frames, quanta, pause time (s) and the share of the
    capture it covers (an upper bound: pauses of one priority may overlap)."""
    ctx = context(snap)
    g = ctx.snap.globals
    sc = float(ctx.scale)
    bps = link_speed_bps(ctx, link_gbps)
    dur = ctx.duration_ns / 1e9
    pr = []
    for p in range(8):
        q = float(g[L.G_PFC_QUANTA + p]) * sc
        t = q * 512 / bps if bps else None
        pr.append({"priority": p, "pause_frames": int(g[L.G_PFC_PAUSE + p] * sc),
                   "resume_frames": int(g[L.G_PFC_XON + p] * sc), "quanta": int(q),
                   "pause_s": t, "pause_fraction": (min(1.0, t / dur) if t is not None and dur > 0 else None)})
    return {"frames": int(g[L.G_PFC] * sc), "global_pause_frames": int(g[L.G_PAUSE] * sc),
            "link_gbps_est": None if bps is None else bps / 1e9, "per_priority": pr}


def node_stalls(snap) -> dict:
    """Per node: stalled-message time on its inbound and outbound data flows (ns), the
    longest stall each way, and their counts."""
    ctx = context(snap)
    n = ctx.nodes.n
    st = ctx.fstat
    d = ctx.data
    src, dst = ctx.nodes.src[d], ctx.nodes.dst[d]
    res = {}
    for name, idx in (("in", dst), ("out", src)):
        res[f"{name}_stall_ns"] = np.bincount(idx, weights=st["stall_ns"][d], minlength=n)
        res[f"{name}_stall_n"] = np.bincount(idx, weights=st["stall_n"][d], minlength=n)
        mx = np.zeros(n)
        np.maximum.at(mx, idx, st["stall_max_ns"][d])
        res[f"{name}_stall_max_ns"] = mx
        res[f"{name}_busy_ns"] = np.bincount(idx, weights=st["busy_ns"][d], minlength=n)
    return res
