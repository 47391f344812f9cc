"""Node-level views: traffic matrix, per-link (directed node pair) rates, per-node
in/out volumes and stalls, incast degree. Data flows only (CTS/ACK/CNP flows never count
as volume). Definitions: docs/metrics.md "Links and matrices".
"""
from __future__ import annotations

import numpy as np

from skewscope.analysis.context import context
from skewscope.analysis.intervals import concurrency_sweep, keyed_intervals
from skewscope.core.jit import njit


def node_matrix(snap, flow_mask=None, t_range=None):
    """(ips, M) with M[i, j] = data bytes from node i to node j (payload bytes of data
    flows; with t_range=(t0, t1) in ns: bytes of the data messages starting in it).
    flow_mask restricts to a subset of flows (e.g. one collective group)."""
    ctx = context(snap)
    n = ctx.nodes.n
    m = np.zeros((n, n))
    if n == 0:
        return ctx.nodes.ips, m
    sel = ctx.data if flow_mask is None else (ctx.data & flow_mask)
    if t_range is None:
        _add_cells(m, ctx.nodes.src, ctx.nodes.dst, ctx.volume, sel)
        return ctx.nodes.ips, m
    f = ctx.ev_flow
    ok = ctx.ev_data & (ctx.ev_start >= t_range[0]) & (ctx.ev_start < t_range[1])
    ok[ok] &= sel[f[ok]]
    ff = f[ok]
    np.add.at(m, (ctx.nodes.src[ff], ctx.nodes.dst[ff]), ctx.events["bytes"][ok].astype(np.float64))
    return ctx.nodes.ips, m


LINK_DTYPE = np.dtype([
    ("src", "<i8"), ("dst", "<i8"),          # node indices
    ("flows", "<i8"),                        # data flows (QPs) of the pair
    ("bytes", "<f8"), ("messages", "<i8"),
    ("rate_bps", "<f8"),                     # per-QP payload rate over active time
    ("busy_ns", "<f8"),                      # union of the pair's message on-wire time
    ("throughput_bps", "<f8"),               # 8 * bytes / busy_ns: the pair's rate while active
    ("first_ns", "<f8"), ("last_ns", "<f8"),
    ("ce", "<f8"), ("ecn_capable", "<f8"),   # data flows' packets
    ("cnp", "<f8"),                          # CNPs to the data senders' QPs (partner flows)
    ("psn_gaps", "<f8"), ("retransmissions", "<f8"),
    ("naks", "<f8"),                         # NAKs on the partner flows
    ("stall_n", "<i8"), ("stall_ns", "<f8"), ("stall_max_ns", "<f8"),
])


def bits_per_s(nbytes, ns):
    """8 × bytes / time (ns) in bit/s; NaN where the time is 0 (nothing timed)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(ns > 0, nbytes * 8e9 / np.maximum(ns, 1e-9), np.nan)


def pair_sums(ctx, sel, p, n: int, out) -> None:
    """The per-pair aggregation of flows (link_rates, group_metrics.group_links): the flows
    `sel` (index or mask into the flow table) with pair ids `p` (0..n-1) summed into out's
    "flows", "bytes" (data volume), "messages", "rate_bps" (the pair's per-QP payload rate
    over active time: its multi-packet messages' bytes / their on-wire time),
    "stall_n", "stall_ns", "stall_max_ns"."""
    st = ctx.fstat
    out["flows"] = np.bincount(p, minlength=n)
    out["bytes"] = np.bincount(p, weights=ctx.volume[sel], minlength=n)
    out["messages"] = np.bincount(p, weights=st["n_data"][sel], minlength=n).astype(np.int64)
    mb = np.bincount(p, weights=st["multi_bytes"][sel], minlength=n)
    wn = np.bincount(p, weights=st["wire_ns"][sel], minlength=n)
    out["rate_bps"] = bits_per_s(mb, wn)
    out["stall_n"] = np.bincount(p, weights=st["stall_n"][sel], minlength=n).astype(np.int64)
    out["stall_ns"] = np.bincount(p, weights=st["stall_ns"][sel], minlength=n)
    mx = np.zeros(n)
    np.maximum.at(mx, p, st["stall_max_ns"][sel])
    out["stall_max_ns"] = mx


def link_rates(snap) -> np.ndarray:
    """One row per directed node pair carrying data (LINK_DTYPE)."""
    ctx = context(snap)
    pid, ps, pd = ctx.pair_index
    n = len(ps)
    out = np.zeros(n, dtype=LINK_DTYPE)
    if n == 0:
        return out
    out["src"] = ps
    out["dst"] = pd
    d = pid >= 0
    p = pid[d]
    fl = ctx.cols
    pair_sums(ctx, d, p, n, out)
    busy, first, last = ctx.pair_busy
    out["busy_ns"] = busy
    out["first_ns"] = first
    out["last_ns"] = last
    out["throughput_bps"] = bits_per_s(out["bytes"], busy)
    for name, col in (("ce", "ce"), ("ecn_capable", "ecn_capable"), ("psn_gaps", "psn_gaps"),
                      ("retransmissions", "retransmissions")):
        out[name] = np.bincount(p, weights=fl[col][d].astype(np.float64), minlength=n)
    out["cnp"], out["naks"] = _reverse_feedback(ctx, d, p, n)
    return out



def _reverse_feedback(ctx, d, p, n):
    """Per node pair, the CNPs and NAKs that came back on the reverse flow of each data
    flow (the partner QP: a CNP/ACK flow is receiver -> sender, dest QP = the sender's)."""
    fl = ctx.cols
    part = ctx.partner[d]
    hp = part >= 0
    cnp = np.zeros(len(p))
    naks = np.zeros(len(p))
    cnp[hp] = fl["cnp"][part[hp]]
    naks[hp] = (fl["nak_seq"] + fl["nak_rnr"] + fl["nak_other"])[part[hp]]
    return np.bincount(p, weights=cnp, minlength=n), np.bincount(p, weights=naks, minlength=n)

COUNTER_LINK_DTYPE = np.dtype([
    ("src", "<i8"), ("dst", "<i8"), ("flows", "<i8"), ("bytes", "<f8"), ("messages", "<f8"),
    ("ce", "<f8"), ("ecn_capable", "<f8"), ("cnp", "<f8"), ("psn_gaps", "<f8"), ("retransmissions", "<f8"),
    ("naks", "<f8"),
])


def link_counters(snap) -> np.ndarray:
    """link_rates without the message records: one row per directed node pair carrying
    data, counters only (bytes, messages, CE, CNPs to the senders' QPs, PSN gaps,
    retransmissions, NAKs): what a live view refreshes every interval."""
    ctx = context(snap)
    pid, ps, pd = ctx.pair_index
    n = len(ps)
    out = np.zeros(n, dtype=COUNTER_LINK_DTYPE)
    if n == 0:
        return out
    out["src"], out["dst"] = ps, pd
    fl = ctx.cols
    # one pass over the flows, sums in flow order as np.bincount makes them (same floats)
    _counter_sums(pid, ctx.volume, fl["messages"], fl["ce"], fl["ecn_capable"], fl["psn_gaps"],
                  fl["retransmissions"], ctx.partner, fl["cnp"], fl["nak_seq"], fl["nak_rnr"], fl["nak_other"],
                  out["flows"], out["bytes"], out["messages"], out["ce"], out["ecn_capable"], out["psn_gaps"],
                  out["retransmissions"], out["cnp"], out["naks"])
    return out


@njit(cache=True, nogil=True)
def _add_cells(m, src, dst, v, sel):
    """m[src[i], dst[i]] += v[i] for the flows sel, in flow order (= np.add.at)."""
    for i in range(src.shape[0]):
        if sel[i]:
            m[src[i], dst[i]] += v[i]


@njit(cache=True, nogil=True)
def _counter_sums(pid, vol, msgs, ce, ect, gaps, retx, part, cnp, ns, nr, no,
                  o_flows, o_bytes, o_msgs, o_ce, o_ect, o_gaps, o_retx, o_cnp, o_naks):
    """link_counters' sums per pair id (pid -1: not a data flow), in flow order; CNPs and
    NAKs from each data flow's partner flow."""
    for i in range(pid.shape[0]):
        p = pid[i]
        if p < 0:
            continue
        o_flows[p] += 1
        o_bytes[p] += vol[i]
        o_msgs[p] += float(msgs[i])
        o_ce[p] += float(ce[i])
        o_ect[p] += float(ect[i])
        o_gaps[p] += float(gaps[i])
        o_retx[p] += float(retx[i])
        q = part[i]
        c = 0.0
        k = 0.0
        if q >= 0:
            c = float(cnp[q])
            k = float(ns[q] + nr[q] + no[q])
        o_cnp[p] += c
        o_naks[p] += k


def node_volumes(snap):
    """Per node: (bytes out, bytes in) over data flows."""
    ctx = context(snap)
    n = ctx.nodes.n
    out = np.bincount(ctx.nodes.src, weights=ctx.volume, minlength=n) if n else np.zeros(0)
    inn = np.bincount(ctx.nodes.dst, weights=ctx.volume, minlength=n) if n else np.zeros(0)
    return out, inn


def incast_degree(snap, flow_mask=None):
    """Concurrent senders per destination node, from the data messages' on-wire intervals
    merged per (source node -> destination node) across gaps under 1 us. Returns a dict of arrays indexed by node:
    max_senders, mean_senders (time-weighted over the time the node receives), multi_ns
    (time with >= 2 senders at once), active_ns (time receiving), at_max_ns."""
    ctx = context(snap)
    n = ctx.nodes.n
    z = {"max_senders": np.zeros(n, np.int64), "mean_senders": np.zeros(n), "multi_ns": np.zeros(n),
         "active_ns": np.zeros(n), "at_max_ns": np.zeros(n)}
    pid, ps, pd = ctx.pair_index
    if n == 0 or len(ps) == 0 or len(ctx.events) == 0:
        return z
    f = ctx.ev_flow
    ok = ctx.data_mask(flow_mask)
    key = np.where(ok, pid[np.maximum(f, 0)], -1)
    # per pair busy intervals; gaps under 1 us do not end a sender's activity
    off, ivs, ive, _ = keyed_intervals(key, ctx.ev_start, ctx.ev_end, len(ps), 1000.0)
    cnt = np.diff(off)
    pair_of = np.repeat(np.arange(len(ps)), cnt)
    dst = pd[pair_of]
    src = ps[pair_of]
    m = len(ivs)
    k = np.concatenate([dst, dst])
    t = np.concatenate([ivs, ive])
    dl = np.concatenate([np.ones(m, np.int64), -np.ones(m, np.int64)])
    s = np.concatenate([src, src])
    o = sweep_order(k, t, dl)
    mx, mean, multi, active, at_max = concurrency_sweep(k[o], t[o], dl[o], s[o], n, n)
    return {"max_senders": mx, "mean_senders": mean, "multi_ns": multi, "active_ns": active, "at_max_ns": at_max}


def sweep_order(k, t, dl) -> np.ndarray:
    """np.lexsort((dl, t, k)) (by node, then time, then -1 before +1; ties in input order):
    one stable argsort of an int64 key (node, time offset, dl bit) when the times are
    whole numbers whose span fits (ns timestamps: timsort runs over the pairs' sorted
    intervals, ~5x faster than lexsort's three passes), else lexsort."""
    if len(t) == 0:
        return np.zeros(0, np.int64)
    t0, t1 = float(t.min()), float(t.max())
    span = t1 - t0
    top = int(k.max()) if len(k) else 0
    if (np.isfinite(span) and span < 2.0 ** 52 and int(k.min()) >= 0 and (top + 1) * (int(span) + 1) < 2 ** 61
            and bool(np.all(t == np.floor(t)))):
        # t - t0: exact (whole numbers within 2^52 of each other)
        key = (k.astype(np.int64) * (int(span) + 1) + (t - t0).astype(np.int64)) * 2 + (dl > 0)
        return np.argsort(key, kind="stable")
    return np.lexsort((dl, t, k))
