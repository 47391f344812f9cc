"""Metrics of one collective group, per kind. Definitions: docs/metrics.md.

Common: group_links() — per directed node pair inside the group: bytes, per-QP rate over
active time, rate / median of the group's links, busy time, stalls.
Ring: ring order, link rate ratios, the slowest link, per-member start lag.
Tree: edges with their up (reduce) direction from timing -> parents, per-edge rates.
All-to-all: phases (dispatch / combine ...) inside each iteration, per-phase traffic matrix,
destination and source volume skew, per-source destination skew, hot destination/source,
incast degree.
P2P pipeline: stage order, per-link idle fraction, stage compute estimates, bubbles.
"""
from __future__ import annotations

import warnings

import numpy as np

from skewscope.analysis.context import context
from skewscope.analysis.intervals import break_candidates, keyed_busy, keyed_intervals, merge_sorted, natural_break
from skewscope.analysis.matrix import bits_per_s, incast_degree, pair_sums
from skewscope.analysis.stats import (_to_dict, grouped_weighted_median, median, nanmedian, skew_array, skew_rows,
                                      skew_stats, unique)
from skewscope.analysis.timing import MIN_GAP_NS, first_start_per_key

GROUP_LINK_DTYPE = np.dtype([
    ("src", "<i8"), ("dst", "<i8"), ("flows", "<i8"), ("bytes", "<f8"), ("messages", "<i8"),
    ("rate_bps", "<f8"), ("rate_med_bps", "<f8"), ("rate_ratio", "<f8"), ("busy_ns", "<f8"), ("first_ns", "<f8"), ("last_ns", "<f8"),
    ("stall_n", "<i8"), ("stall_ns", "<f8"), ("stall_max_ns", "<f8"),
    ("pkts_per_msg", "<f8"),                 # mean packets of its multi-packet messages
])


def _flow_mask(ctx, flows):
    m = np.zeros(len(ctx.flows), dtype=bool)
    m[flows] = True
    return m


def group_links(snap, flows) -> tuple[np.ndarray, np.ndarray]:
    """(links, pair id per flow of `flows`) for the directed node pairs of a flow set."""
    ctx = context(snap)
    flows = np.asarray(flows, dtype=np.int64)
    nn = max(1, ctx.nodes.n)
    key = ctx.nodes.src[flows].astype(np.int64) * nn + ctx.nodes.dst[flows]
    uk, pid = np.unique(key, return_inverse=True)
    n = len(uk)
    out = np.zeros(n, dtype=GROUP_LINK_DTYPE)
    if n == 0:
        return out, pid
    st = ctx.fstat
    out["src"] = uk // nn
    out["dst"] = uk % nn
    pair_sums(ctx, flows, pid, n, out)         # flows, bytes, messages, rate_bps, stalls
    # robust link rate: bytes-weighted median over the pair's flows of their median message rate
    rm = st["rate_med_bps"][flows]
    w = st["multi_bytes"][flows]
    out["rate_med_bps"] = grouped_weighted_median(pid.astype(np.int64), rm.astype(np.float64),
                                                  w.astype(np.float64), n)
    r = out["rate_med_bps"]
    ok = np.isfinite(r)
    # reference: the median link; with only two links (a ring segment seen from one host)
    # the faster one, so that the slow link is not compared with itself
    med = (float(median(r[ok])) if ok.sum() != 2 else float(np.max(r[ok]))) if ok.any() else np.nan
    out["rate_ratio"] = r / med if med and np.isfinite(med) and med > 0 else np.nan
    fpid = np.full(len(ctx.flows), -1, dtype=np.int64)
    fpid[flows] = pid
    f = ctx.ev_flow
    k = np.where(ctx.ev_data, fpid[np.maximum(f, 0)], -1)
    if len(ctx.events):
        busy, first, last = keyed_busy(k, ctx.ev_start, ctx.ev_end, n)
        out["busy_ns"], out["first_ns"], out["last_ns"] = busy, first, last
    nmul = np.bincount(pid, weights=st["n_multi"][flows], minlength=n)
    pk = np.bincount(pid, weights=st["multi_bytes"][flows] / np.maximum(st["mtu"][flows], 1), minlength=n)
    with np.errstate(invalid="ignore", divide="ignore"):
        out["pkts_per_msg"] = np.where(nmul > 0, pk / np.maximum(nmul, 1), 0.0)
    return out, pid


MAX_LINK_ROWS = 4096


def _link_dicts(ctx, links, top=MAX_LINK_ROWS):
    """Rows for the JSON; more than `top` links: the slowest `top` (by rate ratio)."""
    ips = ctx.nodes.ips
    rows = []
    if top and len(links) > top:
        r_ = np.where(np.isfinite(links["rate_ratio"]), links["rate_ratio"], np.inf)
        links = links[np.argsort(r_, kind="stable")[:top]]
    for r in links:
        rows.append({"src": ips[int(r["src"])], "dst": ips[int(r["dst"])], "flows": int(r["flows"]),
                     "bytes": int(r["bytes"]),
                     "rate_bps": None if not np.isfinite(r["rate_bps"]) else float(r["rate_bps"]),
                     "rate_ratio": None if not np.isfinite(r["rate_ratio"]) else round(float(r["rate_ratio"]), 4),
                     "busy_s": float(r["busy_ns"]) / 1e9})
    return rows


def _per_burst_pair_first(ctx, flows, pid, bs):
    """Median over bursts of (first data message start of each pair - burst start); NaN."""
    npair = int(pid.max()) + 1 if len(pid) else 0
    if npair == 0 or len(bs) == 0:
        return np.full(npair, np.nan)
    fpid = np.full(len(ctx.flows), -1, dtype=np.int64)
    fpid[flows] = pid
    f = ctx.ev_flow
    ok = ctx.ev_data & (fpid[np.maximum(f, 0)] >= 0)
    st = ctx.ev_start[ok]
    p = fpid[f[ok]]
    b = np.searchsorted(bs, st, side="right") - 1
    key = np.where(b >= 0, b * npair + p, -1)
    fs = first_start_per_key(key, st, len(bs) * npair).reshape(len(bs), npair) - bs[:, None]
    fs[~np.isfinite(fs)] = np.nan
    with np.errstate(all="ignore"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return nanmedian(fs, axis=0)


# ---- ring -------------------------------------------------------------------------------
def ring_metrics(snap, g, tinfo) -> dict:
    ctx = context(snap)
    links, pid = group_links(ctx, g.flows)
    ips = ctx.nodes.ips
    order = g.extra.get("ring") or g.members
    ratios = links["rate_ratio"]
    rs = skew_stats(links["rate_bps"][np.isfinite(links["rate_bps"])])
    out = {"ring": [ips[m] for m in order] if g.extra.get("ring") else None,
           "rings": g.extra.get("rings", 1),
           "links": _link_dicts(ctx, links),
           "link_rate_skew": rs}
    if np.isfinite(ratios).any():
        k = int(np.nanargmin(ratios))
        out["slowest_link"] = {"src": ips[int(links["src"][k])], "dst": ips[int(links["dst"][k])],
                               "rate_bps": float(links["rate_bps"][k]), "rate_ratio": round(float(ratios[k]), 4)}
    # per member: out / in link ratio (min over its links), start lag
    mem = {}
    lags = tinfo.get("start_lag_ns")
    for i, m in enumerate(g.members):
        o = ratios[(links["src"] == m) & np.isfinite(ratios)]
        n_ = ratios[(links["dst"] == m) & np.isfinite(ratios)]
        mem[ips[m]] = {"out_rate_ratio": None if len(o) == 0 else round(float(o.min()), 4),
                       "in_rate_ratio": None if len(n_) == 0 else round(float(n_.min()), 4),
                       "start_lag_s": None if lags is None or not np.isfinite(lags[i]) else float(lags[i]) / 1e9}
    out["members"] = mem
    out["_links"] = links
    return out


# ---- tree ---------------------------------------------------------------------------------
def tree_metrics(snap, g, tinfo) -> dict:
    ctx = context(snap)
    links, pid = group_links(ctx, g.flows)
    ips = ctx.nodes.ips
    first = _per_burst_pair_first(ctx, g.flows, pid, tinfo["bursts_start"])
    idx = {(int(a), int(b)): i for i, (a, b) in enumerate(zip(links["src"], links["dst"]))}
    parents = {}
    edges = []
    for (a, b), i in idx.items():
        if a < b and (b, a) in idx:
            j = idx[(b, a)]
            fa, fb = first[i], first[j]
            up = None
            if np.isfinite(fa) and np.isfinite(fb) and fa != fb:
                up = (a, b) if fa < fb else (b, a)      # reduce goes child -> parent first
            edges.append({"a": ips[a], "b": ips[b], "up": None if up is None else [ips[up[0]], ips[up[1]]]})
            if up:
                parents.setdefault(ips[up[0]], []).append(ips[up[1]])
    has_parent = set(parents)
    roots = [ips[m] for m in g.members if ips[m] not in has_parent]
    return {"edges": edges, "parents": parents, "roots": roots, "links": _link_dicts(ctx, links),
            "link_rate_skew": skew_stats(links["rate_bps"][np.isfinite(links["rate_bps"])]),
            "max_degree": int(max(np.bincount(np.concatenate([links["src"], links["dst"]])).max() // 2, 0)),
            "_links": links}


# ---- all-to-all ---------------------------------------------------------------------------
def _flow_phase_ordinals(ctx, flows, ok, bs, thr):
    """Per selected record (ok mask, start order): the ordinal of its transfer on its flow
    inside its iteration, -1 when that flow/iteration has an unusual number of transfers.
    Returns (ordinals for ok records, K = modal transfers per flow and iteration)."""
    fl = np.asarray(flows, dtype=np.int64)
    loc = np.full(len(ctx.flows), -1, dtype=np.int64)
    loc[fl] = np.arange(len(fl))
    f = ctx.ev_flow
    kfull = np.where(ok, loc[np.maximum(f, 0)], -1)
    nk = len(fl)
    off, ivs, ive, ivn = keyed_intervals(kfull, ctx.ev_start, ctx.ev_end, nk, float(thr))
    sel_k = kfull[ok]
    o = np.argsort(sel_k, kind="stable")
    iv_id = np.repeat(np.arange(len(ivs)), ivn)
    rec_iv = np.empty(len(sel_k), dtype=np.int64)
    rec_iv[o] = iv_id
    ib = np.searchsorted(bs, ivs, side="right") - 1
    key_of_iv = np.repeat(np.arange(nk), np.diff(off))
    grp = key_of_iv * (len(bs) + 1) + (ib + 1)
    if len(grp) == 0:
        return np.full(len(sel_k), -1, dtype=np.int64), 0
    first = np.ones(len(grp), dtype=bool)
    first[1:] = grp[1:] != grp[:-1]
    run_start = np.maximum.accumulate(np.where(first, np.arange(len(grp)), 0))
    ordn = np.arange(len(grp)) - run_start
    run_id = np.cumsum(first) - 1
    run_len = np.bincount(run_id)
    K = int(np.bincount(run_len).argmax())
    valid = run_len[run_id] == K
    iv_ord = np.where(valid, ordn, -1)
    return iv_ord[rec_iv], K


def phases(ctx, flows, tinfo):
    """Phase start/end (ns) inside each burst and the phase ordinal of each: a second
    natural break over the gaps inside the bursts. Returns (ps, pe, ordinal, K) with K the
    modal number of phases per burst (bursts with another count get ordinal -1)."""
    s, e = tinfo["activity"]
    bs, be = tinfo["bursts_start"], tinfo["bursts_end"]
    if len(s) == 0 or len(bs) == 0:
        return np.zeros(0), np.zeros(0), np.zeros(0, np.int64), 0
    b_of = np.searchsorted(bs, s, side="right") - 1
    same = b_of[1:] == b_of[:-1]
    gaps = (s[1:] - e[:-1])[same]
    thr = natural_break(gaps, min_ratio=3.0, floor=MIN_GAP_NS)
    tinfo["phase_threshold_ns"] = thr
    if not np.isfinite(thr):
        return bs.copy(), be.copy(), np.zeros(len(bs), np.int64), 1
    ps, pe, _ = merge_sorted(np.ascontiguousarray(s), np.ascontiguousarray(e), float(thr))
    pb = np.searchsorted(bs, ps, side="right") - 1
    cnt = np.bincount(np.maximum(pb, 0), minlength=len(bs))
    K = int(np.bincount(cnt).argmax())
    first_of_b = np.searchsorted(pb, np.arange(len(bs)))
    ordn = np.arange(len(ps)) - first_of_b[np.maximum(pb, 0)]
    ordn = np.where(cnt[np.maximum(pb, 0)] == K, ordn, -1)
    return ps, pe, ordn.astype(np.int64), K


def alltoall_metrics(snap, g, tinfo) -> dict:
    ctx = context(snap)
    ips = ctx.nodes.ips
    mem = list(g.members)
    n = len(mem)
    pos = np.full(ctx.nodes.n, -1, dtype=np.int64)
    pos[mem] = np.arange(n)
    fm = _flow_mask(ctx, g.flows)
    f = ctx.ev_flow
    ok = ctx.data_events(g.flows)
    by = ctx.events["bytes"][ok].astype(np.float64)
    si = pos[ctx.nodes.src[f[ok]]]
    di = pos[ctx.nodes.dst[f[ok]]]
    ps, pe, ordn, K = phases(ctx, g.flows, tinfo)
    # most bytes moved by RDMA READs (Open MPI's RGET): their records carry the request time
    # only, no on-wire time whose gaps could separate phases; each READ is a transfer of its
    # own, and its ordinal on its flow inside the iteration is its phase
    reads = bool(ok.any()) and float(by[ctx.ev_read[ok]].sum()) > 0.5 * float(by.sum())
    # whole window matrix (without message records -- sampling, records lost -- from the
    # flows' payload bytes)
    if ok.any():
        whole = np.bincount(si * n + di, weights=by, minlength=n * n).reshape(n, n)
    else:
        gf = np.asarray(g.flows, dtype=np.int64)
        whole = np.bincount(pos[ctx.nodes.src[gf]] * n + pos[ctx.nodes.dst[gf]], weights=ctx.volume[gf],
                            minlength=n * n).reshape(n, n)
    offdiag = ~np.eye(n, dtype=bool)
    out = {"matrix_whole": whole.tolist()}
    mats = []
    cells = None
    coverage = None
    if K >= 2 or reads:
        # phase of a message = ordinal of its transfer on its own flow inside the iteration
        # (transfers: the flow's messages merged across gaps <= the phase break): robust to
        # a late node, whose phases are shifted in time but not in order
        thr = 0.0 if reads else tinfo.get("phase_threshold_ns")
        rec_ord, K2 = _flow_phase_ordinals(ctx, g.flows, ok, tinfo["bursts_start"], thr)
        if K2 >= 1:
            K = K2
            good = rec_ord >= 0
            coverage = float(by[good].sum()) / max(1.0, float(by.sum()))
            idx = rec_ord[good] * n * n + si[good] * n + di[good]
            m3 = np.bincount(idx, weights=by[good], minlength=K * n * n).reshape(K, n, n)
            mats = [m3[k] for k in range(K)]
            cells = _iteration_cells(ctx, ok, good, rec_ord, si, di, by, tinfo["bursts_start"], K, n)
    out["phases_per_iteration"] = K if mats else 1
    out["phase_coverage"] = coverage
    if not mats:
        mats = [whole]
        cells = None
    # one cell per iteration with all its records: the evidence without a phase split (K = 1),
    # and the second look when the phase ordinals leave records out (a flow with an unusual
    # number of transfers -- the hot destination's, which carries more chunks -- is missing
    # from every phase cell, the opposite of the evidence)
    it_cells = None
    if ok.any():
        it_cells = _iteration_cells(ctx, ok, np.ones(int(ok.sum()), dtype=bool), np.zeros(int(ok.sum()), np.int64),
                                    si, di, by, tinfo["bursts_start"], 1, n)
    if cells is None:
        cells, it_cells = it_cells, None
    elif coverage is not None and coverage >= CELL_COVERAGE:
        it_cells = None
    if cells is None:
        cells = {"mats": whole[None, None], "start_ns": np.zeros(1), "end_ns": np.full(1, float(ctx.duration_ns))}
    if it_cells is not None:
        cells["per_iteration"] = it_cells
    cells["hub"] = mem.index(g.extra["hub"]) if g.pattern == "alltoall_star" and g.extra.get("hub") is not None else None
    if cells.get("per_iteration") is not None:
        cells["per_iteration"]["hub"] = cells["hub"]
    out["_a2a_cells"] = cells
    total = sum(float(m.sum()) for m in mats) or 1.0
    per_phase = []
    best = None
    hub = g.extra.get("hub") if g.pattern == "alltoall_star" else None
    hi = mem.index(hub) if hub is not None else None
    others = np.array([i for i in range(n) if i != hi], dtype=np.int64)
    for k, m in enumerate(mats):
        if hi is not None:
            # one-host view: the hub's sends per destination / receives per source
            col = skew_array(m[hi, others])
            row = skew_array(m[others, hi])
            col[10] = others[int(col[10])] if np.isfinite(col[10]) else col[10]
            row[10] = others[int(row[10])] if np.isfinite(row[10]) else row[10]
        else:
            col = skew_array(m.sum(axis=0))
            row = skew_array(m.sum(axis=1))
        rows = skew_rows(m, offdiag) if hi is None else skew_rows(m[hi:hi + 1], offdiag[hi:hi + 1])
        ps_mom = [r["max_over_mean"] for r in rows if r["max_over_mean"] is not None]
        share = float(m.sum()) / total
        d = {"phase": k, "bytes_share": round(share, 4),
             "dest_skew": _sk(col), "source_skew": _sk(row),
             "hot_destination": ips[mem[int(col[10])]] if np.isfinite(col[10]) and col[1] > 0 else None,
             "hot_source": ips[mem[int(row[10])]] if np.isfinite(row[10]) and row[1] > 0 else None,
             "per_source_dest_max_over_mean_max": max(ps_mom) if ps_mom else None,
             "per_source_dest_max_over_mean_median": float(median(ps_mom)) if ps_mom else None}
        per_phase.append(d)
        if share >= 0.1 and col[5] == col[5] and (best is None or col[5] > per_phase[best]["dest_skew"]["max_over_mean"]):
            best = k
    out["phases"] = per_phase
    if best is None:
        best = 0
    bp = per_phase[best]
    out["dest_skew"] = bp["dest_skew"]
    out["hot_destination"] = bp["hot_destination"]
    out["dest_skew_phase"] = best
    sbest = max(range(len(per_phase)), key=lambda k: (per_phase[k]["source_skew"]["max_over_mean"] or 0)
                if per_phase[k]["bytes_share"] >= 0.1 else -1)
    out["source_skew"] = per_phase[sbest]["source_skew"]
    out["hot_source"] = per_phase[sbest]["hot_source"]
    out["per_source_dest_max_over_mean"] = bp["per_source_dest_max_over_mean_max"]
    out["dest_bytes"] = (mats[best][hi].tolist() if hi is not None else mats[best].sum(axis=0).tolist())
    inc = incast_degree(ctx, fm)
    md = inc["max_senders"][mem]
    out["incast_max_senders"] = {ips[m]: int(v) for m, v in zip(mem, md)}
    out["incast_mean_senders"] = {ips[m]: round(float(v), 3) for m, v in zip(mem, inc["mean_senders"][mem])}
    links, _ = group_links(ctx, g.flows)
    out["link_rate_skew"] = skew_stats(links["rate_bps"][np.isfinite(links["rate_bps"])])
    out["links"] = _link_dicts(ctx, links, top=MAX_LINK_ROWS)
    out["_links"] = links
    out["_mats"] = mats
    return out


def _sk(a):
    return _to_dict(a)


#: per-phase cells whose phase ordinals cover less than this share of the group's bytes get
#: a second look: one cell per iteration (cells["per_iteration"])
CELL_COVERAGE = 0.95

#: per-iteration cells kept for the detectors, at most this many matrix entries
#: (iterations x phases x n x n); beyond it the iterations are pooled in chunks
MAX_CELL_ENTRIES = 1 << 22


def _iteration_cells(ctx, ok, good, rec_ord, si, di, by, bs, K, n):
    """The volume matrix of each (iteration, phase) cell: the evidence the repetition-based
    all-to-all detectors count (how often the same destination is the hottest). Iteration
    of a record = the burst its start falls in. Returns {"mats": [I, K, n, n] bytes,
    "start_ns", "end_ns": [I] the iterations' first/last record} or None."""
    st = ctx.ev_start[ok][good]
    en = ctx.ev_end[ok][good]
    it = np.searchsorted(bs, st, side="right") - 1
    sel = it >= 0
    if not sel.any():
        return None
    it = it[sel]
    nI = int(it.max()) + 1
    chunk = max(1, -(-nI * K * n * n // MAX_CELL_ENTRIES))
    it = it // chunk
    nI = int(it.max()) + 1
    idx = ((it * K + rec_ord[good][sel]) * n + si[good][sel]) * n + di[good][sel]
    mats = np.bincount(idx, weights=by[good][sel], minlength=nI * K * n * n).reshape(nI, K, n, n)
    s0 = np.full(nI, np.inf)
    e0 = np.full(nI, -np.inf)
    np.minimum.at(s0, it, st[sel])
    np.maximum.at(e0, it, en[sel])
    return {"mats": mats, "start_ns": s0, "end_ns": e0}


# ---- p2p / pipeline -----------------------------------------------------------------------
def pipeline_metrics(snap, g, tinfo, period_s) -> dict:
    ctx = context(snap)
    ips = ctx.nodes.ips
    links, pid = group_links(ctx, g.flows)
    stages = list(g.extra.get("stages") or g.members)
    idx = {(int(a), int(b)): i for i, (a, b) in enumerate(zip(links["src"], links["dst"]))}
    bs = tinfo["bursts_start"]
    first = _per_burst_pair_first(ctx, g.flows, pid, bs)
    # orientation: stage 0 sends first
    if len(stages) >= 2:
        fwd0 = idx.get((stages[0], stages[1]))
        bwd0 = idx.get((stages[-1], stages[-2]))
        f0 = first[fwd0] if fwd0 is not None else np.inf
        b0 = first[bwd0] if bwd0 is not None else np.inf
        if np.isfinite(b0) and (not np.isfinite(f0) or b0 < f0):
            stages = stages[::-1]
    S = len(stages)
    out = {"stages": [ips[s] for s in stages], "links": _link_dicts(ctx, links)}
    # per-link transfers (micro-batch transfers): merged message intervals per link
    fpid = np.full(len(ctx.flows), -1, dtype=np.int64)
    fpid[g.flows] = pid
    f = ctx.ev_flow
    key = np.where(ctx.ev_data, fpid[np.maximum(f, 0)], -1)
    nl = len(links)
    off, ivs, ive, _ = keyed_intervals(key, ctx.ev_start, ctx.ev_end, nl, 0.0)
    transfers = {}
    for i in range(nl):
        s_, e_ = ivs[off[i]:off[i + 1]], ive[off[i]:off[i + 1]]
        gaps = s_[1:] - e_[:-1]
        # the lowest natural break: messages of one micro-batch transfer vs the gaps between
        cands = break_candidates(gaps, min_ratio=3.0, floor=MIN_GAP_NS)
        thr = cands[-1] if cands else np.inf
        if np.isfinite(thr) and len(s_):
            ts, te, _ = merge_sorted(np.ascontiguousarray(s_), np.ascontiguousarray(e_), float(thr))
        else:
            ts, te = (s_[:1], e_[-1:]) if len(s_) else (s_, e_)
        transfers[i] = (ts, te)
    # per link and iteration: idle share between its first and last transfer, longest gap
    idle = {}
    maxgap = {}
    busy_of_period = {}
    per = period_s * 1e9 if period_s else None
    for (a, b), i in idx.items():
        ts, te = transfers[i]
        if len(ts) == 0:
            continue
        tb = np.searchsorted(bs, ts, side="right") - 1
        fr, gp = [], []
        for bi in unique(tb):
            sel = tb == bi
            s_, e_ = ts[sel], te[sel]
            span = float(e_[-1] - s_[0])
            busy = float(np.sum(e_ - s_))
            fr.append(1.0 - busy / span if span > 0 else 0.0)
            if len(s_) > 1:
                gp.append(float(np.max(s_[1:] - e_[:-1])))
        key = f"{ips[a]}->{ips[b]}"
        idle[key] = round(float(np.mean(fr)), 4)
        maxgap[key] = max(gp) / 1e9 if gp else 0.0
        if per:
            busy_of_period[key] = round(float(links["busy_ns"][i]) / max(1, len(bs)) / per, 4)
    out["link_idle_fraction"] = idle
    out["link_max_gap_s"] = maxgap
    out["link_busy_share_of_period"] = busy_of_period

    def est(in_i, out_i):
        """Median compute time of a stage: out-transfer start minus the later of (the
        matching in-transfer end, the previous out-transfer start) -- exact whether the
        stage waits for its input or its input waits for it. Matching is by ordinal when
        both links carry the same number of transfers, else the latest input before."""
        if out_i is None:
            return np.nan
        os_, _ = transfers[out_i]
        if len(os_) == 0:
            return np.nan
        ins, ine = transfers[in_i] if in_i is not None else (np.zeros(0), np.zeros(0))
        same = len(ine) == len(os_)
        vals = []
        for m in range(len(os_)):
            ref = os_[m - 1] if m > 0 else -np.inf
            if in_i is not None:
                if same:
                    arr = ine[m]
                else:
                    j = np.searchsorted(ine, os_[m], side="right") - 1
                    arr = ine[j] if j >= 0 else -np.inf
                if arr <= os_[m]:
                    ref = max(ref, arr)
            if np.isfinite(ref):
                vals.append(os_[m] - ref)
        return float(median(vals)) if vals else np.nan

    fwd = []
    bwd = []
    for s in range(S):
        in_f = idx.get((stages[s - 1], stages[s])) if s > 0 else None
        out_f = idx.get((stages[s], stages[s + 1])) if s < S - 1 else None
        fwd.append(est(in_f, out_f))
        in_b = idx.get((stages[s + 1], stages[s])) if s < S - 1 else None
        out_b = idx.get((stages[s], stages[s - 1])) if s > 0 else None
        bwd.append(est(in_b, out_b))
    fwd = np.array(fwd)
    bwd = np.array(bwd)
    ratio = np.full(S, np.nan)
    for arr in (fwd, bwd):
        ok = np.isfinite(arr) & (arr > 0)
        if ok.sum() >= 2:
            # each stage against the median of the other stages (same direction)
            r = np.full(S, np.nan)
            for i in np.nonzero(ok)[0]:
                r[i] = arr[i] / float(median(arr[ok & (np.arange(S) != i)]))
            ratio = np.where(np.isfinite(r) & ((~np.isfinite(ratio)) | (r > ratio)), r, ratio)
    out["stage_compute_fwd_s"] = {ips[s]: None if not np.isfinite(v) else float(v) / 1e9 for s, v in zip(stages, fwd)}
    out["stage_compute_bwd_s"] = {ips[s]: None if not np.isfinite(v) else float(v) / 1e9 for s, v in zip(stages, bwd)}
    out["stage_compute_ratio"] = {ips[s]: None if not np.isfinite(v) else round(float(v), 4) for s, v in zip(stages, ratio)}
    # imbalance bubble: share of the steady-state cadence each stage idles waiting for the slowest
    fin = fwd[np.isfinite(fwd) & (fwd > 0)]
    if len(fin) >= 2:
        out["bubble_fraction"] = round(float(np.mean(1.0 - fin / fin.max())), 4)
    else:
        out["bubble_fraction"] = None
    mb = [len(transfers[i][0]) / max(1, len(bs)) for i in transfers]
    M = float(median(mb)) if mb else 0
    out["microbatches_per_iteration"] = M
    out["fill_drain_bubble"] = round((S - 1) / (M + S - 1), 4) if M > 0 and S > 1 else None
    if np.isfinite(ratio).any():
        k = int(np.nanargmax(ratio))
        out["slowest_stage"] = {"ip": ips[stages[k]], "stage": k, "compute_ratio": round(float(ratio[k]), 4)}
    out["_links"] = links
    return out


def p2p_metrics(snap, g, tinfo) -> dict:
    ctx = context(snap)
    links, _ = group_links(ctx, g.flows)
    return {"links": _link_dicts(ctx, links), "volume_skew": skew_stats(links["bytes"]),
            "link_rate_skew": skew_stats(links["rate_bps"][np.isfinite(links["rate_bps"])]), "_links": links}


def node_throughput(snap, flows, members):
    """Per member: (send, receive) throughput over active time inside a flow set: bytes of
    its data messages / union of their on-wire intervals, and the ratio to the members'
    median. A slow sender (NIC, PCIe, GPU) lowers its send throughput whatever the
    collective's shape; a congested or paused ingress lowers the receive one."""
    ctx = context(snap)
    flows = np.asarray(flows, dtype=np.int64)
    f = ctx.ev_flow
    ok = ctx.data_events(flows)
    nn = max(1, ctx.nodes.n)
    res = {}
    for name, nodes_of in (("send", ctx.nodes.src), ("recv", ctx.nodes.dst)):
        key = np.where(ok, nodes_of[np.maximum(f, 0)], -1).astype(np.int64)
        busy, _, _ = keyed_busy(key, ctx.ev_start, ctx.ev_end, nn)
        by = np.bincount(key[ok], weights=ctx.events["bytes"][ok].astype(np.float64), minlength=nn)
        thr = bits_per_s(by, busy)
        t = thr[np.asarray(members, dtype=np.int64)]
        okm = np.isfinite(t)
        med = float(median(t[okm])) if okm.any() else np.nan
        res[name] = t
        res[name + "_ratio"] = t / med if med and np.isfinite(med) and med > 0 else np.full(len(t), np.nan)
    return res
