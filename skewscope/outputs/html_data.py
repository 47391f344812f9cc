"""The data of the HTML page (outputs/html.py) that is not in the analysis document, taken
from the Snapshot through the analysis' own functions on its cached Context: the node
matrices (analysis.matrix.node_matrix / link_rates) and their "other" aggregation, per-link
and overall data rate per time bin, the timing group's instance starts and ring step lags
(analysis.timing / analysis.steps), message-size histograms per group."""
from __future__ import annotations

import numpy as np

#: nodes drawn one by one in the matrix; the others are summed into "other (n)"
MATRIX_TOP = 32
#: time bins of the rate-over-time plots
TIME_BINS = 240


def _ctx(snap):
    from skewscope.analysis.context import context  # heavy (numba)
    return context(snap)


def _matrices(snap):
    """(ips, bytes matrix, rate matrix in bit/s over active time, NaN where no data)."""
    from skewscope.analysis.matrix import link_rates, node_matrix  # heavy (numba)
    ips, m = node_matrix(snap)
    n = len(ips)
    rate = np.full((n, n), np.nan)
    lr = link_rates(snap)
    if len(lr):
        rate[lr["src"], lr["dst"]] = lr["rate_bps"]
    return list(ips), m, rate


def _aggregate(ips, m, rate, top=MATRIX_TOP):
    """The busiest `top` nodes (bytes in + out) one by one, the rest as one "other (k)" node
    whose cells are the mean bytes per node pair carrying data (comparable with the other
    cells) and the bytes-weighted mean of its links' rates."""
    n = len(ips)
    if n <= top + 1:
        return ips, m, rate, np.arange(n)
    load = m.sum(0) + m.sum(1)
    keep = np.sort(np.argsort(-load, kind="stable")[:top])
    rest = np.setdiff1d(np.arange(n), keep)
    grp = np.full(n, top)
    grp[keep] = np.arange(top)
    k = top + 1
    mb = np.zeros((k, k))
    np.add.at(mb, (grp[:, None], grp[None, :]), m)
    # an "other" cell is the mean over its node pairs that carry data (a sum over 40 x 40
    # pairs would own the colour scale and wash every real cell out)
    cnt = np.zeros((k, k))
    np.add.at(cnt, (grp[:, None], grp[None, :]), (m > 0).astype(np.float64))
    agg = np.zeros((k, k), dtype=bool)
    agg[top, :] = agg[:, top] = True
    mb = np.where(agg & (cnt > 0), mb / np.maximum(cnt, 1), mb)
    w = np.where(np.isfinite(rate), m, 0.0)
    rw = np.zeros((k, k))
    np.add.at(rw, (grp[:, None], grp[None, :]), np.where(np.isfinite(rate), rate, 0.0) * w)
    ws = np.zeros((k, k))
    np.add.at(ws, (grp[:, None], grp[None, :]), w)
    with np.errstate(invalid="ignore", divide="ignore"):
        rb = np.where(ws > 0, rw / ws, np.nan)
    names = [ips[i] for i in keep] + [f"other ({len(rest)})"]      # cells: mean per node pair
    return names, mb, rb, keep


def _link_series(snap, pairs, t0, t1, bins=TIME_BINS):
    """Per (src node, dst node) pair: data bit/s per time bin (message bytes by start time)."""
    ctx = _ctx(snap)
    edges = np.linspace(t0, t1, bins + 1)
    width = max(1.0, (t1 - t0) / bins) / 1e9
    out = np.zeros((len(pairs), bins))
    if not len(pairs) or not len(ctx.events):
        return edges, out
    n = max(1, ctx.nodes.n)
    pid = np.full(n * n, -1, dtype=np.int64)
    for k, (s, d) in enumerate(pairs):
        pid[s * n + d] = k
    f = ctx.ev_flow
    ok = ctx.ev_data.copy()
    ff = f[ok]
    p = pid[ctx.nodes.src[ff] * n + ctx.nodes.dst[ff]]
    sel = p >= 0
    st = ctx.ev_start[ok][sel].astype(np.float64)
    b = ctx.events["bytes"][ok][sel].astype(np.float64)
    p = p[sel]
    bi = np.clip(((st - t0) / max(1.0, t1 - t0) * bins).astype(np.int64), 0, bins - 1)
    np.add.at(out, (p, bi), b * 8.0 * ctx.scale / width)
    return edges, out


def _activity(snap, t0, t1, bins=TIME_BINS):
    """All data messages: bit/s per time bin."""
    ctx = _ctx(snap)
    out = np.zeros(bins)
    ok = ctx.ev_data
    if not ok.any():
        return out
    st = ctx.ev_start[ok].astype(np.float64)
    b = ctx.events["bytes"][ok].astype(np.float64)
    bi = np.clip(((st - t0) / max(1.0, t1 - t0) * bins).astype(np.int64), 0, bins - 1)
    np.add.at(out, bi, b * 8.0 * ctx.scale / (max(1.0, (t1 - t0) / bins) / 1e9))
    return out


def _group_flows(ctx, coll: dict, links_only: bool):
    """(data-flow mask, member node indices) of a group: its links' flows (rings) or the data
    flows with both ends among its members."""
    pos = {ip: i for i, ip in enumerate(ctx.nodes.ips)}
    members = [pos[m] for m in coll.get("members") or [] if m in pos]
    n = max(1, ctx.nodes.n)
    want = np.zeros(n * n, dtype=bool)
    if links_only:
        for lk in (coll.get("metrics") or {}).get("links") or []:
            a, b = pos.get(lk["src"], -1), pos.get(lk["dst"], -1)
            if a >= 0 and b >= 0:
                want[a * n + b] = True
    else:
        mi = np.asarray(members, dtype=np.int64)
        want.reshape(n, n)[np.ix_(mi, mi)] = True
    return ctx.data & want[ctx.nodes.src * n + ctx.nodes.dst], members


def _timeline(snap, coll: dict, tm: dict):
    """{level name: instance start times (ns)} of the timing group: iterations/tokens and
    collectives (analysis.timing.group_timing's bursts at both levels) and ring steps
    (analysis.steps.ring_steps' step starts)."""
    from skewscope.analysis.steps import ring_steps  # heavy (numba)
    from skewscope.analysis.timing import group_timing  # heavy (numba)
    ctx = _ctx(snap)
    ring = coll.get("kind") == "ring_allreduce"
    fm, members = _group_flows(ctx, coll, links_only=ring)
    if not fm.any():
        return {}
    top = "token" if tm.get("workload") == "decode" and tm.get("token_interval_s") else "iteration"
    _t, it = group_timing(ctx, fm, members=members)
    _t, co = group_timing(ctx, fm, members=members, level="collective")
    out = {top: it.get("bursts_start"), "collective": co.get("bursts_start")}
    if ring and len(members) >= 3:
        st = ring_steps(ctx, np.nonzero(fm)[0], members, it.get("bursts_start"))
        if st is not None:
            out["step"] = st["col_start_ns"]
            cs = st["col_start_ns"][st["collective_start"]]
            if len(cs) > len(st["iterations"]):   # the hierarchy's rule (analysis.steps.group_steps)
                out["collective"] = cs
    return {k: np.asarray(v, dtype=np.float64) for k, v in out.items() if v is not None and len(v)}


def _step_lags(snap, coll: dict):
    """(member ips, lag matrix members x steps in seconds) of a ring group, from the analysis'
    own step matrix (analysis.steps.ring_steps over its ring links and its iterations /
    tokens), or None."""
    from skewscope.analysis.steps import ring_steps  # heavy (numba)
    from skewscope.analysis.timing import group_timing  # heavy (numba)
    ctx = _ctx(snap)
    if coll.get("kind") != "ring_allreduce" or len(coll.get("members") or []) < 3:
        return None
    fm, members = _group_flows(ctx, coll, links_only=True)
    if len(members) < 3 or not fm.any():
        return None
    _tm, tinfo = group_timing(ctx, fm, members=members)
    st = ring_steps(ctx, np.nonzero(fm)[0], members, tinfo.get("bursts_start"))
    if st is None:
        return None
    return [ctx.nodes.ips[m] for m in members], st["lag_ns"] / 1e9


def _group_hist(snap, members_idx):
    """Summed log2 message-size histogram of the flows with both ends in the group."""
    ctx = _ctx(snap)
    n = max(1, ctx.nodes.n)
    inm = np.zeros(n, dtype=bool)
    inm[np.asarray(members_idx, dtype=np.int64)] = True
    sel = inm[ctx.nodes.src] & inm[ctx.nodes.dst]
    return snap.flows["msg_hist"][sel].sum(axis=0).astype(np.int64)
