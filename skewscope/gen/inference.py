"""LLM-inference workloads with ground truth (issue 12): token-timed TP decode, EP (MoE)
decode, prefill->decode KV-cache transfers, and the truth a detector should match.

* ``decode_tp``: per token `layers` x `allreduces_per_layer` ring all-reduces of
  hidden x batch x dtype_bytes (or `ar_bytes`), each ring step one LL (or LL128/SIMPLE)
  message per link; `layer_compute_us` between collectives, `compute_gap_us` between
  tokens.  A slow shard (pathology ``slow_tp_shard``) starts every send `lag_us` late;
  KV bursts of a ``kv_transfer`` workload into the members' downlinks delay the ring
  messages by the switch-egress queue they build (prefill interference).
* ``decode_ep``: per token, per layer a dispatch all-to-all (`bytes_per_dest` to every
  peer) and its combine (the transpose); pathology ``hot_destination`` multiplies one
  destination's dispatch bytes, optionally moving after `drift_after_tokens` tokens.
* ``kv_transfer``: prefill nodes push the KV cache of each request to a decode node as
  one-way RDMA WRITEs (no CTS, no collective structure), the last one WRITE_WITH_IMM as
  the completion notice; requests arrive every `interval_us` (uniform or Poisson), a
  prefill node serves its requests one at a time, a router picks the decode node
  (smooth weighted round robin over `weights`; pathology ``pd_imbalance``).
  Pathology ``kv_transfer_slow`` runs one prefill->decode link at `rate_factor`.

The builders compute their schedules twice where the truth needs a counterfactual
(token period without the slow shard / without the interference): the same code with
the pathology switched off, never emitted.
"""
from __future__ import annotations

import numpy as np

from skewscope.gen import collectives as C
from skewscope.gen.engine import timed, window

KiB = 1 << 10
# kind names the analysis reports (truth["inference"]["expected_kinds"/"absent_kinds"])
DETECTOR_KINDS = ("slow_tp_shard", "ring_straggler", "rotating_straggler", "hot_destination",
                  "alltoall_destination_skew", "pd_imbalance", "kv_transfer_slow",
                  "prefill_interference")
TOKEN_KINDS = ("decode_tp", "decode_ep")
#: KV queues at a decode member make prefill_interference expected when they stretch the token
#: period by at least this share over the same run without them
MIN_STRETCH = 0.02


def _info(job) -> dict:
    inf = job.inference
    inf.setdefault("expected_kinds", [])
    inf.setdefault("roles", {})
    inf.setdefault("groups", [])
    return inf


def _add_neutral(job, *kinds):
    """Kinds neither expected nor absent: the truth does not decide them."""
    ne = _info(job).setdefault("neutral_kinds", [])
    for k in kinds:
        if k not in ne:
            ne.append(k)


def _add_expected(job, *kinds):
    ex = _info(job)["expected_kinds"]
    for k in kinds:
        if k not in ex:
            ex.append(k)


# ------------------------------------------------------------------ switch-egress queue
class EgressQueue:
    """Fluid FIFO queue of one node's downlink from the KV messages sent into it:
    q(t) in ns of waiting time for a frame arriving at t."""

    def __init__(self, loads, link_bps: float):
        # loads: [(t_start, t_end, rate_bps)]
        self.t = np.zeros(1)
        self.q = np.zeros(1)
        if not loads:
            return
        ev = {}
        for a, b, r in loads:
            ev[a] = ev.get(a, 0.0) + r
            ev[b] = ev.get(b, 0.0) - r
        ts = sorted(ev)
        tt, qq = [ts[0]], [0.0]
        arr, q = 0.0, 0.0
        for i, t in enumerate(ts):
            arr += ev[t]
            if i + 1 == len(ts):
                break
            dt = ts[i + 1] - t
            slope = (arr - link_bps) / 1e9  # bits per ns
            if slope < 0 and q + slope * dt < 0:
                tz = t + q / -slope
                tt.append(tz)
                qq.append(0.0)
                q = 0.0
            else:
                q = max(0.0, q + slope * dt)
            tt.append(ts[i + 1])
            qq.append(q)
        if q > 0:  # after the last burst ends the queue drains at the link rate
            tt.append(ts[-1] + q / link_bps * 1e9)
            qq.append(0.0)
        self.t = np.array(tt)
        self.q = np.array(qq) / link_bps * 1e9  # bits -> ns of waiting

    def delay(self, t: float) -> float:
        return float(np.interp(t, self.t, self.q, left=0.0, right=0.0))


# ------------------------------------------------------------------ TP decode
def _ring_schedule(job, mem, sizes, t0, lag, hop, queues, channels, emit=None, sync="dataflow",
                   tlag=None):
    """One ring all-reduce (2(N-1) steps, `sizes` pieces per step per channel).  A rank's
    step-k piece j starts when its own previous piece left and piece j of step k-1 arrived
    from its predecessor (+hop), plus its lag (first piece of every step); a piece into a
    node whose downlink holds a KV queue ends that much later.  `emit(c, l, j, t, size,
    rate)` is called per message when given.  Returns the end time.  `sync="barrier"`:
    step k of every rank starts when every rank's step k-1 (all channels) has arrived
    (+hop); `tlag`: {node: [(since, until, lag, per_send)]} lags by the send's ready time
    (slow_tp_shard with since_ms / until_ms / lag_per: send)."""
    n = len(mem)
    if sync == "barrier" or tlag:
        return _ring_schedule_general(job, mem, sizes, t0, lag, hop, queues, channels, emit,
                                      sync == "barrier", tlag or {})
    end_all = t0
    for c in range(channels):
        free = [t0] * n
        prev = None
        for k in range(2 * n - 2):
            cur = [[0.0] * len(sizes) for _ in range(n)]
            for l in range(n):
                s, d = mem[l], mem[(l + 1) % n]
                rate = job.rate(s, d, 1.0 / channels)
                for j, sz in enumerate(sizes):
                    t = free[l]
                    if prev is not None:
                        t = max(t, prev[(l - 1) % n][j] + hop)
                    if j == 0:
                        t += lag.get(s, 0.0)
                    lead = job.cts_lead_ns
                    qs = queues.get(s)
                    if qs is not None:
                        # the receiver's CTS (sent `lead` before) queues behind the KV burst
                        # on the sender's downlink: the data waits for it (model rule 5)
                        tc = t - lead
                        tq = tc + qs.delay(tc) + 2 * job.sc["prop_ns"] + 400.0
                        if tq > t:
                            lead += tq - t
                            t = tq
                    if emit is not None:
                        emit(c, l, j, t, sz, rate, lead)
                    e = t + job.duration_ns(sz, rate)
                    free[l] = e
                    q = queues.get(d)
                    cur[l][j] = e + (q.delay(t) if q is not None else 0.0)
            prev = cur
        end_all = max(end_all, max(max(r) for r in prev))
    return end_all


def _tlag_at(tlag, node, t, first):
    out = 0.0
    for a, b, lg, per_send in tlag.get(node, ()):
        if a <= t < b and (first or per_send):
            out += lg
    return out


def _ring_schedule_general(job, mem, sizes, t0, lag, hop, queues, channels, emit, barrier, tlag):
    """_ring_schedule with a barrier between steps and/or timed / per-send lags."""
    n = len(mem)
    free = [[t0] * n for _ in range(channels)]
    prev = [None] * channels
    bar = t0
    for k in range(2 * n - 2):
        step_end = bar
        for c in range(channels):
            cur = [[0.0] * len(sizes) for _ in range(n)]
            for l in range(n):
                s, d = mem[l], mem[(l + 1) % n]
                for j, sz in enumerate(sizes):
                    t = free[c][l]
                    if barrier:
                        if k > 0:
                            t = max(t, bar + hop)
                    elif prev[c] is not None:
                        t = max(t, prev[c][(l - 1) % n][j] + hop)
                    ready = t
                    if j == 0:
                        t += lag.get(s, 0.0)
                    t += _tlag_at(tlag, s, ready, j == 0)
                    rate = job.rate(s, d, 1.0 / channels, ready)
                    lead = job.cts_lead_ns
                    qs = queues.get(s)
                    if qs is not None:
                        tc = t - lead
                        tq = tc + qs.delay(tc) + 2 * job.sc["prop_ns"] + 400.0
                        if tq > t:
                            lead += tq - t
                            t = tq
                    if emit is not None:
                        emit(c, l, j, t, sz, rate, lead)
                    e = t + job.duration_ns(sz, rate)
                    free[c][l] = e
                    q = queues.get(d)
                    cur[l][j] = e + (q.delay(t) if q is not None else 0.0)
            prev[c] = cur
            step_end = max(step_end, max(max(r) for r in cur))
        bar = step_end
    return bar


def _tp_tokens(job, wl, mem, sizes, lag, queues, jit, emit=None, tlag=None):
    L, A, T = int(wl["layers"]), int(wl["allreduces_per_layer"]), int(wl["tokens"])
    hop = wl["hop_us"] * 1e3
    comp = wl["layer_compute_us"] * 1e3
    gap = wl["compute_gap_us"] * 1e3
    t = wl["start_ms"] * 1e6 + 50_000.0
    sync = wl.get("step_sync", "dataflow")
    starts, ends = [], []
    for tok in range(T):
        starts.append(t)
        tl = t
        for i in range(L * A):
            if i:
                tl += comp
            tl = _ring_schedule(job, mem, sizes, tl, lag, hop, queues, wl["channels"],
                                None if emit is None else (lambda *a, _i=i, _tok=tok: emit(_tok, _i, *a)),
                                sync=sync, tlag=tlag)
        ends.append(tl)
        t = tl + max(0.0, gap + jit[tok])
    return starts, ends


def _period(starts):
    return round(float(np.mean(np.diff(starts))) / 1e9, 9) if len(starts) > 1 else None


def decode_tp(job, wl):
    mem = wl["members"]
    n = len(mem)
    group = job.add_group("tp_decode_allreduce", mem, {})
    ar = wl["ar_bytes"]
    if ar is None:
        ar = int(wl["hidden"]) * int(wl["batch"]) * int(wl["dtype_bytes"])
    if int(wl["allreduces_per_layer"]) < 1 or int(wl["layers"]) < 1 or int(wl["tokens"]) < 1:
        raise ValueError("decode_tp: layers, allreduces_per_layer and tokens must be >= 1")
    chunk = max(1, ar // wl["channels"] // n)
    sizes = C.proto_pieces(chunk, wl["protocol"])
    conns = [[job.connect(mem[l], mem[(l + 1) % n], group, c) for l in range(n)]
             for c in range(wl["channels"])]
    lag = dict(wl.get("_lag") or {})
    T = int(wl["tokens"])
    gap = wl["compute_gap_us"] * 1e3
    jit = [float(job.rng.normal(0.0, float(wl["jitter"]) * gap)) if wl["jitter"] else 0.0
           for _ in range(T)]
    loads = getattr(job, "_kv_loads", {})
    queues = {d: EgressQueue(loads[d], job.link_bps[d]) for d in mem if loads.get(d)}
    slot = {}

    def emit(tok, i, c, l, j, t, sz, rate, lead):
        fwd, rev = conns[c][l]
        k = slot.get((c, l), 0)
        slot[(c, l)] = k + 1
        keep, job.cts_lead_ns = job.cts_lead_ns, lead  # CTS at its own (earlier) time
        try:
            job.send(fwd, rev, t, sz, rate, va=(k % 4) * (512 * KiB))
        finally:
            job.cts_lead_ns = keep

    tlag = wl.get("_tlag") or {}
    starts, ends = _tp_tokens(job, wl, mem, sizes, lag, queues, jit, emit, tlag)
    # counterfactuals (not emitted): without the slow shard and the KV queues / without
    # the KV queues only
    healthy = _tp_tokens(job, wl, mem, sizes, {}, {}, jit)[0] if lag or queues or tlag else starts
    quiet = _tp_tokens(job, wl, mem, sizes, lag, {}, jit, tlag=tlag)[0] if queues else starts
    steps = 2 * (n - 1)
    colls = int(wl["layers"]) * int(wl["allreduces_per_layer"])
    det = {
        "variant": "decode_tp", "ring": [job.ip_str[m] for m in mem], "tp_size": n,
        "layers": int(wl["layers"]), "allreduces_per_layer": int(wl["allreduces_per_layer"]),
        "allreduces_per_token": colls, "tokens": T, "allreduce_bytes": int(ar),
        "protocol": wl["protocol"], "channels": wl["channels"], "steps_per_allreduce": steps,
        "message_sizes": sorted(set(sizes)), "messages_per_step_per_link": len(sizes),
        "data_messages": T * colls * wl["channels"] * n * steps * len(sizes),
        "compute_gap_us": wl["compute_gap_us"], "layer_compute_us": wl["layer_compute_us"],
        "token_starts_ns": [int(s) for s in starts], "token_ends_ns": [int(e) for e in ends],
        "token_period_s": _period(starts),
        "token_period_healthy_s": _period(healthy),
        "token_period_without_interference_s": _period(quiet),
        "interference_nodes": sorted(job.ip_str[d] for d in queues),
        "collectives": T * colls,
    }
    if "step_sync" in wl:
        det["step_sync"] = wl["step_sync"]
    job.groups[group]["details"] = det
    wl["_period_s"] = det["token_period_s"]
    wl["_group"] = group
    inf = _info(job)
    for m in mem:
        inf["roles"].setdefault(job.ip_str[m], "decode")
    inf["groups"].append({"group": group, "kind": "decode_tp", "role": "decode",
                          "members": [job.ip_str[m] for m in mem], "tokens": T,
                          "token_period_s": det["token_period_s"],
                          "token_period_healthy_s": det["token_period_healthy_s"],
                          "token_period_without_interference_s":
                              det["token_period_without_interference_s"]})
    if queues:
        # KV queues at a member: interference the detector must find when it stretches the
        # token period measurably (>= 2 %, its warning share); below that either answer is
        # right (a transfer that stretches only the last token, or none measurably)
        if det["token_period_s"] and det["token_period_without_interference_s"] and \
                det["token_period_s"] >= (1 + MIN_STRETCH) * det["token_period_without_interference_s"]:
            _add_expected(job, "prefill_interference")
        else:
            _add_neutral(job, "prefill_interference")
    return group


# ------------------------------------------------------------------ EP (MoE) decode
def _hot_windows(wl, n):
    """[(first_token, last_token_excl, member index or None, factor)]"""
    hot = wl.get("_hot_dest")
    T = int(wl["tokens"])
    if not hot:
        return [(0, T, None, 1.0)]
    K = int(hot["drift_after_tokens"] or 0)
    seq = hot["drift_to"] or []
    out = []
    node = hot["idx"]
    t = 0
    w = 0
    while t < T:
        e = T if K <= 0 else min(T, t + K)
        out.append((t, e, node, float(hot["factor"])))
        t = e
        w += 1
        if seq:
            node = seq[(w - 1) % len(seq)]
        else:
            node = (node + 1) % n
    return out


def _ep_matrix(n, B, hot_idx, factor):
    w = np.ones(n)
    if hot_idx is not None:
        w[hot_idx] = factor
    v = np.round(np.outer(np.ones(n), w) * B).astype(np.int64)
    np.fill_diagonal(v, 0)
    return v


def decode_ep(job, wl):
    mem = wl["members"]
    n = len(mem)
    group = job.add_group("all_to_all", mem, {})
    a2a = C.AllToAll(job, mem, wl["channels"], group, wl["qps"])
    B = int(wl["bytes_per_dest"])
    L, T = int(wl["layers"]), int(wl["tokens"])
    if L < 1 or T < 1:
        raise ValueError("decode_ep: layers and tokens must be >= 1")
    hop = wl["hop_us"] * 1e3
    comp = wl["layer_compute_us"] * 1e3
    expert = wl["expert_compute_us"] * 1e3
    gap = wl["compute_gap_us"] * 1e3
    windows = _hot_windows(wl, n)
    t = wl["start_ms"] * 1e6 + 50_000.0
    starts, ends, wout = [], [], []
    hwin = (wl.get("_hot_dest") or {}).get("window")   # (since, until) of a timed hot destination
    segs = []          # [first_token, end_token, hot index or None, factor, start_ns]
    for wi, (a, b, hidx, f) in enumerate(windows):
        for tok in range(a, b):
            on = hidx is not None and (hwin is None or hwin[0] <= t < hwin[1])
            key = (wi, on)
            if not segs or segs[-1][5] != key:
                segs.append([tok, tok + 1, hidx if on else None, f if on else 1.0, t, key])
            else:
                segs[-1][1] = tok + 1
            vol = _ep_matrix(n, B, segs[-1][2], segs[-1][3])
            starts.append(t)
            tl = t
            for _ in range(L):
                e = a2a.run(tl + comp, vol, wl["inflight"], hop)
                e = a2a.run(e + expert, vol.T.copy(), wl["inflight"], hop)
                tl = e
            ends.append(tl)
            j = float(job.rng.normal(0.0, float(wl["jitter"]) * gap)) if wl["jitter"] else 0.0
            t = tl + max(0.0, gap + j)
    for a, b, hidx, f, w0, _ in segs:
        vol = _ep_matrix(n, B, hidx, f)
        db = vol.sum(axis=0).astype(float)
        sb = vol.sum(axis=1).astype(float)
        wout.append({
            "first_token": a, "end_token": b,
            "hot": None if hidx is None else job.ip_str[mem[hidx]],
            "start_ns": int(w0), "end_ns": int(ends[b - 1]),
            "volume_matrix": vol.tolist(),
            "dispatch_dest_share": {job.ip_str[mem[i]]: round(db[i] / db.sum(), 6) for i in range(n)},
            "combine_src_share": {job.ip_str[mem[i]]: round(db[i] / db.sum(), 6) for i in range(n)},
            "combine_dest_share": {job.ip_str[mem[i]]: round(sb[i] / sb.sum(), 6) for i in range(n)},
        })
    det = {
        "variant": "decode_ep", "layers": L, "tokens": T, "ep_size": n,
        "bytes_per_dest": B, "alltoalls_per_token": 2 * L, "alltoalls": 2 * L * T,
        "phases": ["dispatch", "combine"], "peer_order_delta": a2a.order,
        "channels": wl["channels"], "token_starts_ns": [int(s) for s in starts],
        "token_ends_ns": [int(e) for e in ends], "token_period_s": _period(starts),
        "windows": wout, "dest_bytes": np.sum([np.array(w["volume_matrix"]) * (w["end_token"] - w["first_token"])
                                               for w in wout], axis=0).sum(axis=0).tolist(),
    }
    job.groups[group]["details"] = det
    wl["_period_s"] = det["token_period_s"]
    wl["_group"] = group
    inf = _info(job)
    for m in mem:
        inf["roles"].setdefault(job.ip_str[m], "expert")
    inf["groups"].append({"group": group, "kind": "decode_ep", "role": "expert",
                          "members": [job.ip_str[m] for m in mem], "tokens": T,
                          "token_period_s": det["token_period_s"], "alltoalls": 2 * L * T})
    return group


# ------------------------------------------------------------------ P/D disaggregation
def _swrr(weights, k):
    """Smooth weighted round robin: k picks, exact shares over a cycle."""
    w = np.asarray(weights, dtype=float)
    cur = np.zeros(len(w))
    out = []
    for _ in range(k):
        cur += w
        i = int(np.argmax(cur))
        out.append(i)
        cur[i] -= w.sum()
    return out


def _side(v, mem, default, what):
    if v is None:
        return default
    if isinstance(v, int) and not isinstance(v, bool):
        if not 1 <= v < len(mem):
            raise ValueError(f"kv_transfer: {what} count must be in 1..{len(mem) - 1}")
        return mem[:v] if what == "prefill" else mem[-v:]
    if not isinstance(v, list) or not v or any(x not in mem for x in v):
        raise ValueError(f"kv_transfer: {what} must be a count or a list of member nodes")
    return list(v)


def kv_transfer(job, wl):
    mem = wl["members"]
    pre = _side(wl["prefill"], mem, mem[:len(mem) // 2], "prefill")
    dec = _side(wl["decode"], mem, [m for m in mem if m not in pre], "decode")
    if set(pre) & set(dec) or not dec:
        raise ValueError("kv_transfer: prefill and decode nodes must be disjoint and non-empty")
    group = job.add_group("kv_transfer", pre + dec, {})
    qps = max(1, int(wl["channels"]))
    conns = {(p, d): [job.connect(p, d, group, c) for c in range(qps)] for p in pre for d in dec}
    R = int(wl["requests"])
    weights = wl.get("_weights") or wl["weights"] or [1.0] * len(dec)
    if len(weights) != len(dec) or min(weights) < 0 or sum(weights) <= 0:
        raise ValueError(f"kv_transfer: weights needs {len(dec)} non-negative entries")
    if wl["router"] == "weighted_rr":
        picks = _swrr(weights, R)
    elif wl["router"] == "random":
        pw = np.asarray(weights, float)
        picks = [int(x) for x in job.rng.choice(len(dec), size=R, p=pw / pw.sum())]
    else:
        raise ValueError("kv_transfer: router must be weighted_rr or random")
    iv = wl["interval_us"] * 1e3
    if wl["arrival"] == "poisson":
        gaps = job.rng.exponential(iv, size=R)
    elif wl["arrival"] == "uniform":
        gaps = np.full(R, iv)
    else:
        raise ValueError("kv_transfer: arrival must be uniform or poisson")
    t0 = wl["start_ms"] * 1e6 + 50_000.0
    k = int(wl["arrival_batch"])
    if k < 1:
        raise ValueError("kv_transfer: arrival_batch must be >= 1")
    gaps[np.arange(R) % k != 0] = 0.0  # a batch of k requests arrives at one instant
    arrivals = t0 + np.concatenate([[0.0], np.cumsum(gaps[1:])])
    bmin = int(wl["block_bytes"])
    bmax = wl["block_bytes_max"]
    nb = int(wl["blocks_per_request"])
    if bmin < 1 or nb < 1 or (bmax is not None and int(bmax) < bmin):
        raise ValueError("kv_transfer: block_bytes >= 1, blocks_per_request >= 1, block_bytes_max >= block_bytes")
    free = {p: 0.0 for p in pre}
    loads = job.__dict__.setdefault("_kv_loads", {})
    reqs = []
    P = len(pre)
    per_dec_bytes = {d: 0 for d in dec}
    per_dec_reqs = {d: 0 for d in dec}
    pair_bytes = {}
    pair_msgs = {}
    for r in range(R):
        p = pre[(r + r // P) % P]
        d = dec[picks[r]]
        if bmax is None:
            blocks = [bmin] * nb
        else:
            lo, hi = -(-bmin // 4096), int(bmax) // 4096
            blocks = [int(x) * 4096 for x in job.rng.integers(lo, max(lo, hi) + 1, size=nb)]
        st = max(arrivals[r] + wl["prefill_us"] * 1e3, free[p])
        t = st
        rate = job.rate(p, d, 1.0, st)
        cl = conns[(p, d)]
        for m, sz in enumerate(blocks):
            fwd, rev = cl[(r * nb + m) % qps]
            last = m == nb - 1
            e = job.send(fwd, rev, t, sz, rate, va=(m % 64) * (256 * KiB), cts=False,
                         mtype=0 if (last and wl["notify"]) else 2)
            loads.setdefault(d, []).append((t, e, rate))
            t = e
        free[p] = t
        tot = int(sum(blocks))
        per_dec_bytes[d] += tot
        per_dec_reqs[d] += 1
        key = f"{job.ip_str[p]}->{job.ip_str[d]}"
        pair_bytes[key] = pair_bytes.get(key, 0) + tot
        pair_msgs[key] = pair_msgs.get(key, 0) + nb
        reqs.append({"id": r, "arrival_ns": int(arrivals[r]), "prefill": job.ip_str[p],
                     "decode": job.ip_str[d], "start_ns": int(st), "end_ns": int(t),
                     "blocks": len(blocks), "bytes": tot, "block_sizes": sorted(set(blocks))})
    total = sum(per_dec_bytes.values())
    det = {
        "variant": "kv_transfer", "pattern": "one-way RDMA WRITE (no CTS)",
        "prefill": [job.ip_str[p] for p in pre], "decode": [job.ip_str[d] for d in dec],
        "requests": reqs, "router": wl["router"], "weights": list(map(float, weights)),
        "notify": bool(wl["notify"]),
        "decode_bytes": {job.ip_str[d]: per_dec_bytes[d] for d in dec},
        "decode_share": {job.ip_str[d]: round(per_dec_bytes[d] / total, 6) for d in dec},
        "decode_requests": {job.ip_str[d]: per_dec_reqs[d] for d in dec},
        "pair_bytes": pair_bytes, "pair_messages": pair_msgs, "total_bytes": total,
        "messages": R * nb,
    }
    job.groups[group]["details"] = det
    wl["_group"] = group
    inf = _info(job)
    for p in pre:
        inf["roles"][job.ip_str[p]] = "prefill"
    for d in dec:
        inf["roles"].setdefault(job.ip_str[d], "decode")
    inf["groups"].append({"group": group, "kind": "kv_transfer", "prefill": det["prefill"],
                          "decode": det["decode"], "requests": R,
                          "decode_share": det["decode_share"]})
    return group


BUILDERS = {"decode_tp": decode_tp, "decode_ep": decode_ep, "kv_transfer": kv_transfer}


# ------------------------------------------------------------------ pathologies
def prepare(job, sc, pat) -> None:
    k = pat["kind"]
    wls = sc["workloads"]
    if k == "slow_tp_shard":
        hit = [w for w in wls if w["kind"] in ("decode_tp", "tp_decode") and pat["node"] in w["members"]]
        if not hit:
            raise ValueError("slow_tp_shard: the node is in no decode_tp workload")
        for w in hit:
            if w["kind"] == "tp_decode":
                raise ValueError("slow_tp_shard: use a decode_tp workload (tp_decode takes a straggler)")
            if timed(pat) or pat.get("lag_per", "step") == "send":
                a, b = window(pat)
                w.setdefault("_tlag", {}).setdefault(pat["node"], []).append(
                    (a, b, pat["lag_us"] * 1e3, pat.get("lag_per") == "send"))
            else:
                w.setdefault("_lag", {})[pat["node"]] = pat["lag_us"] * 1e3
    elif k == "hot_destination":
        hit = [w for w in wls if w["kind"] == "decode_ep" and pat["node"] in w["members"]]
        if not hit:
            raise ValueError("hot_destination: the node is in no decode_ep workload")
        for w in hit:
            m = w["members"]
            to = pat["drift_to"]
            if to is not None and any(x not in m for x in to):
                raise ValueError("hot_destination: drift_to nodes must be members")
            w["_hot_dest"] = {"idx": m.index(pat["node"]), "factor": pat["factor"],
                              "drift_after_tokens": pat["drift_after_tokens"],
                              "drift_to": None if to is None else [m.index(x) for x in to],
                              "window": window(pat) if timed(pat) else None}
    elif k == "pd_imbalance":
        hit = [w for w in wls if w["kind"] == "kv_transfer"]
        if not hit:
            raise ValueError("pd_imbalance needs a kv_transfer workload")
        w = hit[0]
        pre = _side(w["prefill"], w["members"], w["members"][:len(w["members"]) // 2], "prefill")
        dec = _side(w["decode"], w["members"], [m for m in w["members"] if m not in pre], "decode")
        if pat["node"] not in dec:
            raise ValueError("pd_imbalance: node must be a decode node of the kv_transfer")
        if not 0 < float(pat["share"]) < 1 or len(dec) < 2:
            raise ValueError("pd_imbalance: share must be in (0, 1), with >= 2 decode nodes")
        s = float(pat["share"])
        w["_weights"] = [s if d == pat["node"] else (1 - s) / (len(dec) - 1) for d in dec]
    elif k == "kv_transfer_slow":
        if pat["src"] == pat["dst"]:
            raise ValueError("kv_transfer_slow: src and dst must differ")
        pr = (pat["src"], pat["dst"])
        if timed(pat):
            job.timed_rate.append((*window(pat), pr[0], pr[1], float(pat["rate_factor"])))
        else:
            job.pair_rate[pr] = job.pair_rate.get(pr, 1.0) * float(pat["rate_factor"])
    elif k == "rotating_straggler":
        hit = [w for w in wls if w["kind"] == "ring_allreduce"]
        if not hit:
            raise ValueError("rotating_straggler needs a ring_allreduce workload")
        w = hit[0]
        mem = w["members"]
        it = int(w["iterations"])
        order = pat["order"]
        if order is None:
            order = []
            for _ in range(it):  # a fresh rank each iteration, never the same twice in a row
                c = [m for m in mem if not order or m != order[-1]]
                order.append(int(c[int(job.rng.integers(0, len(c)))]))
        elif any(x not in mem for x in order):
            raise ValueError("rotating_straggler: order nodes must be ring members")
        gates = [order[i % len(order)] for i in range(it)]
        lag = pat["lag_us"] * 1e3
        noise = pat["noise_us"] * 1e3
        per = []
        for g in gates:
            d = {m: float(job.rng.uniform(0.0, noise)) if noise > 0 else 0.0 for m in mem}
            d[g] = lag
            per.append(np.array([d.get(i, 0.0) for i in range(job.n)]))
        w["_iter_lag"] = per
        w["_iter_lag_first_only"] = not pat["every_step"]
        w["_gates"] = gates
        if pat.get("lag_per") == "send":
            w["_iter_lag_per_send"] = True
        if timed(pat):
            # the late rank only in the iterations starting in [since, until)
            w["_iter_lag_window"] = window(pat)
            w["_iter_gate_nodes"] = gates


def finish(job, sc, pat, entities):
    """(entities, magnitude, detector kinds) of a new pathology kind."""
    k = pat["kind"]
    wls = sc["workloads"]
    if k == "slow_tp_shard":
        node = pat["node"]
        w = [w for w in wls if w["kind"] == "decode_tp" and node in w["members"]][0]
        g = job.groups[w["_group"]]
        d = g["details"]
        paths = [p for p in job.paths_between(group=[w["_group"]]) if job.p_src[p] == node]
        ent = entities(job, paths, ips=[node])
        per_tok = d["allreduces_per_token"] * d["steps_per_allreduce"]
        per_step = pat["lag_us"] * (d["messages_per_step_per_link"] if pat.get("lag_per") == "send" else 1)
        mag = {"lag_us": pat["lag_us"], "lag_per_step_us": per_step,
               "steps_per_token": per_tok, "tokens": d["tokens"],
               "token_period_s": d["token_period_s"],
               "token_period_healthy_s": d["token_period_healthy_s"],
               "group": w["_group"], "members": g["members"]}
        return ent, mag, ["slow_tp_shard"]
    if k == "hot_destination":
        w = [w for w in wls if w["kind"] == "decode_ep" and pat["node"] in w["members"]][0]
        d = job.groups[w["_group"]]["details"]
        hots = []
        for win in d["windows"]:
            if win["hot"] is not None and win["hot"] not in hots:
                hots.append(win["hot"])
        if not hots:
            raise ValueError("hot_destination: no token starts inside since_ms..until_ms")
        idx = [job.ip_str.index(h) for h in hots]
        paths = [p for p in job.paths_between(group=[w["_group"]]) if job.p_dst[p] in idx]
        ent = entities(job, paths, ips=idx)
        first = [x for x in d["windows"] if x["hot"] is not None][0]
        mag = {"factor": pat["factor"], "hot": first["hot"],
               "dispatch_dest_share": first["dispatch_dest_share"][first["hot"]],
               "combine_src_share": first["combine_src_share"][first["hot"]],
               "alltoalls": d["alltoalls"], "alltoalls_per_token": d["alltoalls_per_token"],
               "tokens": d["tokens"], "drift": sum(x["hot"] is not None for x in d["windows"]) > 1,
               "windows": [{"first_token": x["first_token"], "end_token": x["end_token"],
                            "hot": x["hot"], "start_ns": x["start_ns"], "end_ns": x["end_ns"],
                            "dispatch_dest_share": None if x["hot"] is None else x["dispatch_dest_share"][x["hot"]],
                            "combine_src_share": None if x["hot"] is None else x["combine_src_share"][x["hot"]]}
                           for x in d["windows"]],
               "group": w["_group"], "members": job.groups[w["_group"]]["members"]}
        return ent, mag, ["hot_destination", "alltoall_destination_skew"]
    if k == "pd_imbalance":
        w = [w for w in wls if w["kind"] == "kv_transfer"][0]
        d = job.groups[w["_group"]]["details"]
        node = pat["node"]
        paths = [p for p in job.paths_between(group=[w["_group"]]) if job.p_dst[p] == node]
        ent = entities(job, paths, ips=[node])
        mag = {"share": d["decode_share"][job.ip_str[node]], "configured_share": pat["share"],
               "per_decode_share": d["decode_share"], "fair_share": round(1 / len(d["decode"]), 6),
               "per_decode_requests": d["decode_requests"], "group": w["_group"]}
        return ent, mag, ["pd_imbalance"]
    if k == "kv_transfer_slow":
        a, b = pat["src"], pat["dst"]
        paths = [p for p in job.paths_between() if job.p_src[p] == a and job.p_dst[p] == b
                 and job.groups[job.p_group[p]]["kind"] == "kv_transfer"]
        if not paths:
            raise ValueError("kv_transfer_slow: no kv_transfer traffic from src to dst")
        ent = entities(job, paths, ips=[a, b])
        gd = job.groups[job.p_group[paths[0]]]["details"]
        key = f"{job.ip_str[a]}->{job.ip_str[b]}"
        mag = {"link": key, "src": job.ip_str[a], "dst": job.ip_str[b],
               "rate_factor": pat["rate_factor"],
               "rate_gbps": round(job.rate(a, b) / 1e9 * (pat["rate_factor"] if timed(pat) else 1.0), 4),
               "normal_rate_gbps": round(job.rate(a, b) / (1.0 if timed(pat) else pat["rate_factor"]) / 1e9, 4),
               "messages": gd["pair_messages"].get(key, 0), "bytes": gd["pair_bytes"].get(key, 0)}
        return ent, mag, ["kv_transfer_slow"]
    if k == "rotating_straggler":
        w = [w for w in wls if w["kind"] == "ring_allreduce"][0]
        gates = w["_gates"]
        act = w.get("_gates_active")
        if act is not None:   # timed: no late rank outside the window
            gates = [g_ for g_, a_ in zip(gates, act) if a_]
        ips = []
        for gnode in gates:
            if gnode not in ips:
                ips.append(gnode)
        gid = [g["id"] for g in job.groups if g["kind"] == "ring_allreduce"][0]
        paths = [p for p in job.paths_between(group=[gid]) if job.p_src[p] in ips]
        ent = entities(job, paths, ips=ips)
        cnt = {x: gates.count(x) for x in ips}
        det = job.groups[gid]["details"]
        mag = {"lag_us": pat["lag_us"], "noise_us": pat["noise_us"],
               "every_step": bool(pat["every_step"]),
               "gating_rank_per_iteration": [job.ip_str[x] for x in gates] if act is None else
               [job.ip_str[x] if a_ else None for x, a_ in zip(w["_gates"], act)],
               "iterations": len(gates), "distinct_gates": len(ips),
               "max_iterations_same_rank": max(cnt.values()),
               "persistent_straggler": None,
               "iteration_starts_ns": det.get("iteration_starts_ns"),
               "iteration_period_s": det.get("period_s"), "group": gid}
        return ent, mag, ["rotating_straggler"]
    raise ValueError(f"unknown pathology {k}")


def summarize(job, sc) -> None:
    """truth["inference"]: what a detector should and should not report, roles, periods.
    Only for scenarios that use the kinds of this module."""
    new_w = [w for w in sc["workloads"] if w["kind"] in BUILDERS]
    new_p = [p for p in sc["pathologies"] if p["kind"] in PATHOLOGY_KINDS]
    if not new_w and not new_p:
        return
    inf = _info(job)
    for rec in job.pathologies:
        for k in rec.get("detector_kinds", []):
            _add_expected(job, k)
    if any(p["kind"] == "rotating_straggler" for p in new_p):
        w = [w for w in sc["workloads"] if w["kind"] == "ring_allreduce"][0]
        inf["iteration_period_s"] = w["period_ms"] / 1e3
        inf["iterations"] = int(w["iterations"])
        for m in w["members"]:
            inf["roles"].setdefault(job.ip_str[m], "train")
    toks = [g for g in inf["groups"] if g["kind"] in TOKEN_KINDS]
    if toks:
        inf["token_period_s"] = toks[0]["token_period_s"]
        inf["tokens"] = toks[0]["tokens"]
    inf["absent_kinds"] = [k for k in DETECTOR_KINDS if k not in inf["expected_kinds"]
                           and k not in inf.get("neutral_kinds", ())
                           and not (k == "alltoall_destination_skew" and "hot_destination" in inf["expected_kinds"])]


PATHOLOGY_KINDS = ("slow_tp_shard", "hot_destination", "pd_imbalance", "kv_transfer_slow",
                   "rotating_straggler")
