"""Workload builders: NCCL-shaped schedules of RDMA messages (wire.md, "How NCCL uses the
wire").  Each builder creates its QP pairs once (they persist across iterations, like a
communicator's connections), records a group for the ground truth, and emits messages
with start times from a simple rate/latency model:

* a flow paced at its share of the sender's link (``Job.rate``), messages on one QP
  strictly in order;
* data dependencies between ranks (ring: step k+1 of a slice needs step k of that slice
  from the predecessor; tree: children before parent, then parent before children;
  pipeline: a stage computes a micro-batch after receiving it) plus ``hop_us`` of
  reduction/processing latency per hop;
* stragglers: ``Job.rate_factor`` (sends slower) and ``Job.lag_ns`` (starts every step late).
"""
from __future__ import annotations

import numpy as np

MiB = 1 << 20
KiB = 1 << 10


def iteration_starts(job, wl) -> list[float]:
    """Start time (ns) of every iteration: start + i*period + N(0, jitter*period)."""
    it = int(wl["iterations"])
    per = float(wl["period_ms"]) * 1e6
    t0 = float(wl["start_ms"]) * 1e6
    jit = float(wl["jitter"]) * per
    out = []
    for i in range(it):
        j = float(job.rng.normal(0.0, jit)) if jit > 0 else 0.0
        j = max(-0.25 * per, min(0.25 * per, j))
        out.append(max(0.0, t0 + i * per + j) + 50_000.0)  # +50 us: room for the first CTS
    return out


def proto_pieces(data: int, protocol: str) -> list[int]:
    """Wire sizes of the messages that carry `data` bytes of one step (wire.md table)."""
    if data <= 0:
        return [0]
    if protocol == "simple":
        n = -(-data // MiB)
        base = data // n
        sizes = [base] * n
        sizes[-1] += data - base * n
        return sizes
    if protocol == "ll":
        step = 32 * KiB  # 64 KiB of wire per step: 16-byte lines with 8 data bytes
        return [-(-min(step, data - o) // 8) * 16 for o in range(0, data, step)]
    if protocol == "ll128":
        step = 576_000  # 614,400 wire bytes
        return [-(-min(step, data - o) // 1920) * 2048 for o in range(0, data, step)]
    raise ValueError(f"unknown protocol {protocol!r}")


def p2p_chunk(per_peer: int) -> int:
    if per_peer < 128 * KiB:
        return 32 * KiB
    if per_peer < MiB:
        return 64 * KiB
    return 128 * KiB


def delta_order(n: int) -> list[int]:
    """NCCL's all-to-all peer offsets: delta = (x^2+x)/2 mod 2^k, skipping >= n."""
    k = 1
    while (1 << k) < n:
        k += 1
    out = []
    for x in range(1, 1 << k):
        d = ((x * x + x) // 2) % (1 << k)
        if 0 < d < n and d not in out:
            out.append(d)
    return out


# ------------------------------------------------------------------ ring all-reduce
class Ring:
    """A ring communicator: per channel, one connection member[l] -> member[l+1]."""

    def __init__(self, job, members, channels, group, qps=1):
        self.job, self.members, self.channels = job, list(members), channels
        n = len(self.members)
        # NCCL_IB_QPS_PER_CONNECTION: each connection has `qps` QP pairs; messages rotate
        self.conns = [[[job.connect(self.members[l], self.members[(l + 1) % n], group, c)
                        for _ in range(qps)] for l in range(n)] for c in range(channels)]
        self.slot = [[0] * n for _ in range(channels)]

    def allreduce(self, t0: float, nbytes: int, protocol: str, hop_ns: float,
                  lag=None, lag_first_step_only: bool = False, sync: str = "dataflow",
                  lag_per_send: bool = False) -> float:
        """`lag` (per node, ns; default the job's straggler lags) delays the first piece of
        every step (every piece with `lag_per_send`), or of step 0 only (a rank arriving
        late: rotating straggler). `sync`: "dataflow" = piece j of step k waits for the
        rank's own previous piece and piece j of step k-1 from its predecessor (+hop);
        "barrier" = step k of every rank starts when the last piece of step k-1 of every
        rank and channel has ended (+hop)."""
        job, mem = self.job, self.members
        lag_ns = job.lag_ns if lag is None else lag
        n = len(mem)
        if n < 2:
            return t0
        per_ch = nbytes // self.channels
        chunk = max(1, per_ch // n)
        sizes = proto_pieces(chunk, protocol)
        if sync == "barrier" or lag_per_send or job.timed_lag or job.timed_rate:
            return self._allreduce_general(t0, sizes, hop_ns, lag_ns, lag_first_step_only,
                                           sync == "barrier", lag_per_send)
        end_all = t0
        for c in range(self.channels):
            free = [t0] * n
            prev = None
            for k in range(2 * n - 2):
                cur = [[0.0] * len(sizes) for _ in range(n)]
                for l in range(n):
                    s, d = mem[l], mem[(l + 1) % n]
                    rate = job.rate(s, d, 1.0 / self.channels)
                    qps = self.conns[c][l]
                    for j, sz in enumerate(sizes):
                        fwd, rev = qps[self.slot[c][l] % len(qps)]
                        t = free[l]
                        if prev is not None:
                            t = max(t, prev[(l - 1) % n][j] + hop_ns)
                        if j == 0 and (k == 0 or not lag_first_step_only):
                            t += lag_ns[s]
                        va = (self.slot[c][l] % 4) * MiB
                        self.slot[c][l] += 1
                        e = job.send(fwd, rev, t, sz, rate, va=va)
                        free[l] = e
                        cur[l][j] = e
                prev = cur
            end_all = max(end_all, max(max(r) for r in prev))
        return end_all

    def _allreduce_general(self, t0, sizes, hop_ns, lag_ns, first_only, barrier, per_send):
        """allreduce with a barrier between steps, lags on every send, or timed
        pathologies (Job.timed_lag / timed_rate, active by each send's ready time)."""
        job, mem = self.job, self.members
        n, C = len(mem), self.channels
        free = [[t0] * n for _ in range(C)]
        prev = [None] * C
        bar = t0
        for k in range(2 * n - 2):
            step_end = bar
            for c in range(C):
                cur = [[0.0] * len(sizes) for _ in range(n)]
                for l in range(n):
                    s, d = mem[l], mem[(l + 1) % n]
                    qps = self.conns[c][l]
                    for j, sz in enumerate(sizes):
                        fwd, rev = qps[self.slot[c][l] % len(qps)]
                        t = free[c][l]
                        if barrier:
                            if k > 0:
                                t = max(t, bar + hop_ns)
                        elif prev[c] is not None:
                            t = max(t, prev[c][(l - 1) % n][j] + hop_ns)
                        ready = t
                        if (j == 0 or per_send) and (k == 0 or not first_only):
                            t += lag_ns[s]
                        if job.timed_lag:
                            t += job.extra_lag(s, ready, j == 0)
                        rate = job.rate(s, d, 1.0 / C, ready)
                        va = (self.slot[c][l] % 4) * MiB
                        self.slot[c][l] += 1
                        e = job.send(fwd, rev, t, sz, rate, va=va)
                        free[c][l] = e
                        cur[l][j] = e
                prev[c] = cur
                step_end = max(step_end, max(max(r) for r in cur))
            bar = step_end
        return bar

def ring_allreduce(job, wl, gid_hint=None):
    mem = wl["members"]
    group = job.add_group("ring_allreduce", mem, {})
    ring = Ring(job, mem, wl["channels"], group, wl["qps"])
    starts = iteration_starts(job, wl)
    ends = []
    rot = wl.get("_iter_lag")  # rotating straggler: per-iteration lags (pathologies)
    sync = wl.get("step_sync", "dataflow")
    win = wl.get("_iter_lag_window")
    if rot is not None and win is not None:
        # timed rotating straggler: outside [since, until) no rank is late (noise stays)
        act = [win[0] <= t < win[1] for t in starts]
        rot = [r if a else np.where(np.arange(len(r)) == g, 0.0, r)
               for r, a, g in zip(rot, act, wl["_iter_gate_nodes"])]
        wl["_gates_active"] = act
    for i, t in enumerate(starts):
        if rot is not None:
            ends.append(ring.allreduce(t, wl["bytes"], wl["protocol"], wl["hop_us"] * 1e3,
                                       lag=rot[i], lag_first_step_only=wl["_iter_lag_first_only"],
                                       sync=sync, lag_per_send=wl.get("_iter_lag_per_send", False)))
        else:
            ends.append(ring.allreduce(t, wl["bytes"], wl["protocol"], wl["hop_us"] * 1e3, sync=sync))
    job.groups[group]["details"] = {
        "channels": wl["channels"], "qps_per_connection": wl["qps"], "protocol": wl["protocol"],
        "bytes": wl["bytes"], "ring": [job.ip_str[m] for m in mem], "iterations": len(starts),
        "period_s": wl["period_ms"] / 1e3,
        "message_sizes": sorted(set(proto_pieces(max(1, wl["bytes"] // wl["channels"] // len(mem)),
                                                 wl["protocol"]))),
        "iteration_starts_ns": [int(s) for s in starts],
        "iteration_busy_ns": [int(e - s) for s, e in zip(starts, ends)],
    }
    if "step_sync" in wl:
        job.groups[group]["details"]["step_sync"] = sync
    return group


# ------------------------------------------------------------------ tree all-reduce
def nccl_btree(nranks: int, rank: int):
    """ncclGetBtree: (parent, child0, child1), -1 for none."""
    bit = 1
    while bit < nranks:
        if bit & rank:
            break
        bit <<= 1
    if rank == 0:
        return -1, -1, (bit >> 1) if nranks > 1 else -1
    up = (rank ^ bit) | (bit << 1)
    if up >= nranks:
        up = rank ^ bit
    lowbit = bit >> 1
    d0 = -1 if lowbit == 0 else rank - lowbit
    d1 = -1 if lowbit == 0 else rank + lowbit
    while d1 >= nranks:
        lowbit >>= 1
        d1 = -1 if lowbit == 0 else rank + lowbit
    return up, d0, d1


def nccl_dtree(nranks: int, rank: int):
    """ncclGetDtree: two trees; the second shifted (odd n) or mirrored (even n)."""
    t0 = nccl_btree(nranks, rank)
    if nranks % 2 == 1:
        sr = (rank - 1 + nranks) % nranks
        u, a, b = nccl_btree(nranks, sr)
        f = lambda x: -1 if x == -1 else (x + 1) % nranks  # noqa: E731
    else:
        sr = nranks - 1 - rank
        u, a, b = nccl_btree(nranks, sr)
        f = lambda x: -1 if x == -1 else nranks - 1 - x  # noqa: E731
    return t0, (f(u), f(a), f(b))


def tree_allreduce(job, wl):
    mem = wl["members"]
    n = len(mem)
    group = job.add_group("tree_allreduce", mem, {})
    trees = []
    for t in range(2):
        parent = {}
        for r in range(n):
            parent[r] = nccl_dtree(n, r)[t][0]
        trees.append(parent)
    chans = wl["channels"]
    conns = {}  # (channel, child, parent) -> (up conn, down conn)
    for c in range(chans):
        par = trees[c % 2]
        for r in range(n):
            if par[r] >= 0:
                up = job.connect(mem[r], mem[par[r]], group, c)
                down = job.connect(mem[par[r]], mem[r], group, c)
                conns[(c, r)] = (up, down)
    hop = wl["hop_us"] * 1e3
    chunk = 512 * KiB if wl["protocol"] == "simple" else 64 * KiB
    starts = iteration_starts(job, wl)
    barrier = wl.get("step_sync", "dataflow") == "barrier"
    for t0 in starts:
        for c in range(chans):
            par = trees[c % 2]
            kids = {r: [x for x in range(n) if par[x] == r] for r in range(n)}
            root = [r for r in range(n) if par[r] < 0][0]
            data = wl["bytes"] // chans
            pieces = []
            for o in range(0, max(1, data), chunk):
                pieces += proto_pieces(min(chunk, data - o) if data else 0, wl["protocol"])
            # post-order for the reduce
            post = []

            def visit(r):
                for k in kids[r]:
                    visit(k)
                post.append(r)
            visit(root)
            up_end = {}  # (r, j) -> time chunk j from r reached its parent
            free_up = {r: t0 for r in range(n)}
            if barrier:
                # a level (height in the tree) sends piece j when every node one level down
                # has sent its piece j
                height = {}
                for r in post:
                    height[r] = 1 + max([height[k] for k in kids[r]] or [-1])
                lvl_end = {}
            for r in post:
                if par[r] < 0:
                    continue
                fwd, rev = conns[(c, r)][0]
                rate = job.rate(mem[r], mem[par[r]], 1.0 / chans)
                for j, sz in enumerate(pieces):
                    t = free_up[r] + (job.lag_ns[mem[r]] if j == 0 else 0.0)
                    for k in kids[r]:
                        t = max(t, up_end[(k, j)] + hop)
                    if barrier and height[r] > 0:
                        t = max(t, lvl_end.get((height[r] - 1, j), t0) + hop)
                    if job.timed_lag or job.timed_rate:
                        rate = job.rate(mem[r], mem[par[r]], 1.0 / chans, t)
                        t += job.extra_lag(mem[r], t, j == 0)
                    e = job.send(fwd, rev, t, sz, rate, va=(j % 4) * MiB)
                    if barrier:
                        lvl_end[(height[r], j)] = max(lvl_end.get((height[r], j), e), e)
                    free_up[r] = e
                    up_end[(r, j)] = e
            # broadcast, pre-order
            have = {}
            for j in range(len(pieces)):
                have[(root, j)] = max([up_end[(k, j)] + hop for k in kids[root]] or [t0])
            free_dn = {r: t0 for r in range(n)}
            stack = [root]
            order = []
            while stack:
                r = stack.pop()
                order.append(r)
                stack.extend(kids[r])
            if barrier:
                # a depth sends piece j down when every node of the depth above has it
                depth = {root: 0}
                for r in order:
                    for k in kids[r]:
                        depth[k] = depth[r] + 1
                got = {}
                for r in order:
                    for j in range(len(pieces)):
                        got[(depth[r], j)] = max(got.get((depth[r], j), -np.inf), have.get((r, j), -np.inf))
            for r in sorted(order, key=lambda x: depth[x]) if barrier else order:
                for k in kids[r]:
                    fwd, rev = conns[(c, k)][1]
                    rate = job.rate(mem[r], mem[k], 1.0 / chans / max(1, len(kids[r])))
                    for j, sz in enumerate(pieces):
                        hv = have[(r, j)]
                        if barrier:
                            hv = max(hv, got[(depth[r], j)])
                        t = max(free_dn[k], hv)
                        if job.timed_lag or job.timed_rate:
                            rate = job.rate(mem[r], mem[k], 1.0 / chans / max(1, len(kids[r])), t)
                            t += job.extra_lag(mem[r], t, j == 0)
                        e = job.send(fwd, rev, t, sz, rate, va=(j % 4) * MiB)
                        free_dn[k] = e
                        have[(k, j)] = e + hop
                        if barrier:
                            got[(depth[k], j)] = max(got.get((depth[k], j), -np.inf), e + hop)
    job.groups[group]["details"] = {
        "channels": chans, "protocol": wl["protocol"], "bytes": wl["bytes"],
        "trees": [{job.ip_str[mem[r]]: (job.ip_str[mem[p]] if p >= 0 else None)
                   for r, p in trees[t].items()} for t in range(2)],
        "iterations": len(starts), "period_s": wl["period_ms"] / 1e3,
        "iteration_starts_ns": [int(s) for s in starts],
    }
    if "step_sync" in wl:
        job.groups[group]["details"]["step_sync"] = wl["step_sync"]
    return group


# ------------------------------------------------------------------ all-to-all
def volume_matrix(job, wl) -> np.ndarray:
    """Per (src, dst) bytes: explicit `matrix`, or bytes_per_peer x destination weights
    (uniform, Zipf(s) over a seeded expert ranking, hot-expert factors)."""
    mem = wl["members"]
    n = len(mem)
    if wl.get("matrix") is not None:
        v = np.array(wl["matrix"], dtype=np.float64)
        if v.shape != (n, n):
            raise ValueError(f"all_to_all matrix must be {n}x{n}")
        np.fill_diagonal(v, 0)
        return v.astype(np.int64)
    w = np.ones(n)
    if wl.get("zipf"):
        rank = job.rng.permutation(n)
        w = 1.0 / (rank + 1.0) ** float(wl["zipf"])
        w = w / w.mean()
    w0 = w.copy()
    for node, factor in (wl.get("_hot") or {}).items():
        if node in mem:
            w[mem.index(node)] *= factor

    def mat(w):
        v = np.outer(np.ones(n), w) * wl["bytes_per_peer"]
        np.fill_diagonal(v, 0)
        return np.round(v).astype(np.int64)
    if wl.get("_hot_window") is not None:
        wl["_vol_base"] = mat(w0)      # the iterations outside the hot expert's window
    return mat(w)


def hot_active(wl, t) -> bool:
    """The hot expert's volumes apply to an iteration / token starting at t."""
    win = wl.get("_hot_window")
    return win is None or win[0] <= t < win[1]


class AllToAll:
    def __init__(self, job, members, channels, group, qps=1):
        self.job, self.mem, self.channels = job, list(members), channels
        n = len(self.mem)
        self.qps = qps
        self.conns = {(i, j, c): job.connect(self.mem[i], self.mem[j], group, c)
                      for i in range(n) for j in range(n) if i != j
                      for c in range(channels * qps)}
        self.order = delta_order(n)

    def run(self, t0: float, vol: np.ndarray, inflight: int, hop_ns: float) -> float:
        job, mem, n = self.job, self.mem, len(self.mem)
        end = t0
        slots_n = max(1, min(inflight, n - 1))
        for i in range(n):
            s = mem[i]
            slots = [t0 + job.lag_ns[s]] * slots_n
            if job.timed_lag:
                slots = [x + job.extra_lag(s, t0, True, sends=False) for x in slots]
            for k, dlt in enumerate(self.order):
                j = (i + dlt) % n
                b = int(vol[i, j])
                chunk = p2p_chunk(b)
                sizes = [min(chunk, b - o) for o in range(0, b, chunk)] or [0]
                si = min(range(slots_n), key=lambda x: slots[x])
                t = slots[si] + (hop_ns if k >= slots_n else 0.0)
                rate = job.rate(s, mem[j], 1.0 / slots_n, t)
                if job.timed_lag:
                    t += job.extra_lag(s, t, False)   # lag_per send: every peer's transfer
                for m, sz in enumerate(sizes):
                    fwd, rev = self.conns[(i, j, m % (self.channels * self.qps))]
                    t = job.send(fwd, rev, t, sz, rate, va=(m % 8) * 128 * KiB)
                slots[si] = t
                end = max(end, t)
        return end


def all_to_all(job, wl):
    mem = wl["members"]
    group = job.add_group("all_to_all", mem, {})
    a2a = AllToAll(job, mem, wl["channels"], group, wl["qps"])
    vol = volume_matrix(job, wl)
    starts = iteration_starts(job, wl)
    for t0 in starts:
        v = vol if hot_active(wl, t0) else wl["_vol_base"]
        e = a2a.run(t0, v, wl["inflight"], wl["hop_us"] * 1e3)
        if wl.get("combine"):
            a2a.run(e + wl["hop_us"] * 1e3 * 5, v.T.copy(), wl["inflight"], wl["hop_us"] * 1e3)
    job.groups[group]["details"] = {
        "channels": wl["channels"], "peer_order_delta": a2a.order,
        "volume_matrix": vol.tolist(), "combine": bool(wl.get("combine")),
        "dest_bytes": vol.sum(axis=0).tolist(),
        "iterations": len(starts), "period_s": wl["period_ms"] / 1e3,
        "iteration_starts_ns": [int(s) for s in starts],
    }
    return group


# ------------------------------------------------------------------ P2P pipeline
def p2p_pipeline(job, wl):
    mem = wl["members"]
    S = len(mem)
    group = job.add_group("p2p", mem, {})
    conns_f = [job.connect(mem[s], mem[s + 1], group, 0) for s in range(S - 1)]
    conns_b = [job.connect(mem[s + 1], mem[s], group, 0) for s in range(S - 1)]
    A = int(wl["activation_bytes"])
    chunk = p2p_chunk(A)
    sizes = [min(chunk, A - o) for o in range(0, A, chunk)] or [0]
    Mb = int(wl["microbatches"])
    tf = np.full(S, wl["fwd_us"] * 1e3)
    tb = np.full(S, wl["bwd_us"] * 1e3)
    tf0, tb0 = tf.copy(), tb.copy()
    for s, f in (wl.get("_slow_stage") or {}).items():
        tf[s] *= f
        tb[s] *= f
    win = wl.get("_slow_stage_window")   # (since, until): the slow stage only in iterations starting then
    tf1, tb1 = tf, tb
    starts = iteration_starts(job, wl)
    link_busy = {}
    for t0 in starts:
        if win is not None:
            tf, tb = (tf1, tb1) if win[0] <= t0 < win[1] else (tf0, tb0)
        # forward (GPipe-style): stage s computes mb m when it has it and is free
        done = np.zeros((S, Mb))
        recv = np.full((S, Mb), t0)
        link_free = [t0] * (S - 1)
        for m in range(Mb):
            for s in range(S):
                prev = done[s, m - 1] if m > 0 else t0
                done[s, m] = max(prev, recv[s, m]) + tf[s]
                if s < S - 1:
                    fwd, rev = conns_f[s]
                    t = max(done[s, m], link_free[s])
                    rate = job.rate(mem[s], mem[s + 1], 1.0, t)
                    for sz in sizes:
                        t = job.send(fwd, rev, t, sz, rate, va=(m % 8) * chunk)
                    link_busy.setdefault(("f", s), []).append((max(done[s, m], link_free[s]), t))
                    link_free[s] = t
                    recv[s + 1, m] = t + wl["hop_us"] * 1e3
        # backward: last stage starts after its last forward
        bdone = np.zeros((S, Mb))
        brecv = np.full((S, Mb), done[S - 1, Mb - 1])
        blink_free = [t0] * (S - 1)
        for m in range(Mb):
            for s in range(S - 1, -1, -1):
                prev = bdone[s, m - 1] if m > 0 else done[s, Mb - 1]
                bdone[s, m] = max(prev, brecv[s, m]) + tb[s]
                if s > 0:
                    fwd, rev = conns_b[s - 1]
                    t = max(bdone[s, m], blink_free[s - 1])
                    rate = job.rate(mem[s], mem[s - 1], 1.0, t)
                    for sz in sizes:
                        t = job.send(fwd, rev, t, sz, rate, va=(m % 8) * chunk)
                    link_busy.setdefault(("b", s - 1), []).append(
                        (max(bdone[s, m], blink_free[s - 1]), t))
                    blink_free[s - 1] = t
                    brecv[s - 1, m] = t + wl["hop_us"] * 1e3
    idle, gaps = {}, {}
    for (d, s), iv in sorted(link_busy.items()):
        a, b = (mem[s], mem[s + 1]) if d == "f" else (mem[s + 1], mem[s])
        key = f"{job.ip_str[a]}->{job.ip_str[b]}"
        per_it = len(iv) // max(1, len(starts))
        fr, gp = [], []
        for k in range(0, len(iv), max(1, per_it)):
            seg = iv[k:k + per_it]
            span = seg[-1][1] - seg[0][0]
            busy = sum(e - st for st, e in seg)
            fr.append(1.0 - busy / span if span > 0 else 0.0)
            gp += [seg[x + 1][0] - seg[x][1] for x in range(len(seg) - 1)]
        idle[key] = round(float(np.mean(fr)), 4)
        gaps[key] = round(max(gp, default=0.0) / 1e3, 3)
    job.groups[group]["details"] = {
        "pattern": "pipeline", "stages": [job.ip_str[m] for m in mem], "microbatches": Mb,
        "activation_bytes": A, "chunk": chunk, "iterations": len(starts),
        "period_s": wl["period_ms"] / 1e3,
        "link_idle_fraction": idle, "link_max_gap_us": gaps,
        "iteration_starts_ns": [int(s) for s in starts],
    }
    return group


# ------------------------------------------------------------------ inference
def tp_decode(job, wl):
    """Tensor-parallel decode: per token, per layer two small LL ring all-reduces; every
    `prefill_every` tokens a prefill burst of large SIMPLE all-reduces on the same QPs."""
    mem = wl["members"]
    group = job.add_group("tp_decode_allreduce", mem, {})
    ring = Ring(job, mem, wl["channels"], group)
    L = int(wl["layers"])
    tok_ns = wl["token_ms"] * 1e6
    t = wl["start_ms"] * 1e6 + 50_000.0
    hop = wl["hop_us"] * 1e3
    n_coll = 0
    prefills = []
    sync = wl.get("step_sync", "dataflow")
    for tok in range(int(wl["tokens"])):
        t_tok = t
        if wl.get("prefill_every") and tok % int(wl["prefill_every"]) == 0:
            tp = t
            for _ in range(L):
                for _ in range(2):
                    tp = ring.allreduce(tp + wl["layer_compute_us"] * 1e3 * 4,
                                        wl["prefill_bytes"], "simple", hop, sync=sync)
                    n_coll += 1
            prefills.append([int(t), int(tp)])
            t_tok = tp
        tl = t_tok
        slot = (tok_ns - (t_tok - t)) / (2 * L) if t_tok - t < tok_ns else wl["layer_compute_us"] * 1e3
        for _ in range(L):
            for _ in range(2):
                e = ring.allreduce(tl + wl["layer_compute_us"] * 1e3, wl["ar_bytes"], "ll", hop, sync=sync)
                n_coll += 1
                tl = max(e, tl + slot)
        t = max(t + tok_ns, tl)
    dur = (t - wl["start_ms"] * 1e6) / 1e9
    job.groups[group]["details"] = {
        "layers": L, "tokens": int(wl["tokens"]), "token_interval_s": tok_ns / 1e9,
        "allreduce_bytes": wl["ar_bytes"], "protocol": "ll", "channels": wl["channels"],
        "collectives": n_coll, "collectives_per_s": round(n_coll / max(dur, 1e-9), 1),
        "prefill_bytes": wl.get("prefill_bytes") if wl.get("prefill_every") else None,
        "prefill_bursts_ns": prefills,
        "ring": [job.ip_str[m] for m in mem],
    }
    if "step_sync" in wl:
        job.groups[group]["details"]["step_sync"] = sync
    return group


def moe_decode(job, wl):
    """Expert-parallel MoE decode: per token, per MoE layer a small dispatch all-to-all
    and the matching combine (transpose)."""
    mem = wl["members"]
    group = job.add_group("all_to_all", mem, {})
    a2a = AllToAll(job, mem, wl["channels"], group, wl["qps"])
    vol = volume_matrix(job, wl)
    L = int(wl["layers"])
    tok_ns = wl["token_ms"] * 1e6
    t = wl["start_ms"] * 1e6 + 50_000.0
    hop = wl["hop_us"] * 1e3
    n = 0
    for tok in range(int(wl["tokens"])):
        tl = t
        v = vol if hot_active(wl, t) else wl["_vol_base"]
        for _ in range(L):
            e = a2a.run(tl + wl["layer_compute_us"] * 1e3, v, wl["inflight"], hop)
            e = a2a.run(e + wl["layer_compute_us"] * 1e3, v.T.copy(), wl["inflight"], hop)
            n += 2
            tl = e
        t = max(t + tok_ns, tl)
    job.groups[group]["details"] = {
        "variant": "moe_decode", "layers": L, "tokens": int(wl["tokens"]),
        "token_interval_s": tok_ns / 1e9, "volume_matrix": vol.tolist(),
        "dest_bytes": vol.sum(axis=0).tolist(), "collectives": n,
        "peer_order_delta": a2a.order, "channels": wl["channels"],
    }
    return group


BUILDERS = {
    "ring_allreduce": ring_allreduce,
    "tree_allreduce": tree_allreduce,
    "all_to_all": all_to_all,
    "p2p_pipeline": p2p_pipeline,
    "tp_decode": tp_decode,
    "moe_decode": moe_decode,
}
