"""The exporter's per-row cache (exptables.RowCache, issue 30): with each read's join to the
previous read (Interval.join, Accumulator.add(cum_join=)) a read looks only at its delta's
rows for their class and pair / destination / source rows, and carries the rest from the
previous read. Ground truth: the same reads through an Accumulator given no join (every
read's class, key rows and flows per pair from one pass over the whole table, as before),
and a per-pair flow count in plain Python; over random cumulative reads with flows
evicted, created, re-created and changing class, pairs appearing (sticky keys growing
read to read) and pairs over --max-peers (the overflow pair)."""
from __future__ import annotations

import numpy as np
import pytest

from skewscope.analysis.fleet import BULK_MIN_MESSAGE, CTS_MAX_BYTES
from skewscope.core import layout as L
from skewscope.core.rates import join_flows
from skewscope.core.snapshot import _key_order, flow_key_matrix, ip_bytes
from skewscope.outputs import exporter as E
from skewscope.outputs.exptables import CLASSES, RowCache
from skewscope.sources.live import flow_delta

NODES = ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6", "fd00::7", "fd00::8"]
SIZES = [0, 64, CTS_MAX_BYTES, CTS_MAX_BYTES + 1, BULK_MIN_MESSAGE, 1 << 20]


def _keys(rng, nodes):
    """Flow keys among the first `nodes` of NODES (v4 with v4, v6 with v6), a few QPs each."""
    pairs = [(a, b) for a in NODES[:nodes] for b in NODES[:nodes] if a != b and (":" in a) == (":" in b)]
    return [(a, b, 0x100 + 7 * k + q) for k, (a, b) in enumerate(pairs) for q in range(1 + k % 3)]


def _table(keys, state):
    """The cumulative table of the flows in state (key -> [messages, msg_bytes, packets,
    first_ts]), sorted by key as the loader returns it."""
    fl = np.zeros(len(state), L.FLOW_DTYPE)
    for i, k in enumerate(sorted(state)):
        a, b, qp = keys[k]
        fl["src"][i] = np.frombuffer(ip_bytes(a)[0], np.uint8)
        fl["dst"][i] = np.frombuffer(ip_bytes(b)[0], np.uint8)
        fl["ipver"][i], fl["roce"][i], fl["dest_qp"][i] = ip_bytes(a)[1], 2, qp
        m, mb, pk, t0 = state[k]
        fl["messages"][i], fl["msg_bytes"][i], fl["packets"][i], fl["first_ts"][i] = m, mb, pk, t0
        fl["bytes"][i] = mb + 60 * pk
        fl["op"][i][L.OPC_WRITE] = pk
        fl["msg_hist"][i][min(33, int(mb // max(m, 1)).bit_length())] = m
    return fl[_key_order(flow_key_matrix(fl))] if len(fl) else fl


def _reads(rng, n_reads):
    """(cum table, its join to the previous read's) per read."""
    keys = _keys(rng, len(NODES))
    state, out, prev = {}, [], None
    for r in range(n_reads):
        nodes = min(len(NODES), 3 + r)                      # pairs keep appearing
        avail = [k for k, (a, b, _) in enumerate(keys) if a in NODES[:nodes] and b in NODES[:nodes]]
        for k in list(state):
            u = rng.random()
            if u < 0.1:
                del state[k]                                # evicted
            elif u < 0.15:
                state[k] = [0, 0, 1, 100 * r + 1]           # re-created: counts from zero
            elif u < 0.6:                                   # active: class may change
                m, mb, pk, t0 = state[k]
                add = int(rng.integers(1, 5))
                state[k] = [m + add, mb + add * int(rng.choice(SIZES)), pk + add + 1, t0]
        for k in rng.choice(avail, size=min(len(avail), int(rng.integers(1, 8))), replace=False).tolist():
            if k not in state:
                m = int(rng.integers(0, 4))
                state[k] = [m, m * int(rng.choice(SIZES)), m + 1, 100 * r]
        cur = _table(keys, state)
        out.append((cur, join_flows(prev, cur) if prev is not None and len(prev) else None))
        prev = cur
    return out


def _events(rng, delta, t):
    n = int(rng.integers(1, 40))
    ev = np.zeros(n, L.EVENT_DTYPE)
    ev["flow"] = rng.integers(-1, len(delta), n)
    st = t + np.sort(rng.integers(0, 50_000, n))
    ev["start_ts"], ev["end_ts"] = st, st + rng.integers(0, 20_000, n)
    ev["bytes"], ev["opclass"] = 4096, L.OPC_WRITE
    return ev


def _state(acc):
    s = acc.state("n", np.zeros(L.G_N, np.uint64), {}, 5)
    return (s.peer_src, s.peer_dst, s.peer_class, s.peer_counts.tolist(), s.peer_qps.tolist(),
            s.peer_busy_ns.tolist(), s.dst_labels, s.dst_busy_ns.tolist(), s.src_labels, s.src_busy_ns.tolist(),
            s.hist_msg.tolist(), s.flows.tobytes())


def _plain_qps(acc, cum):
    """Flows per exported pair (the last: the rest) counted in plain Python."""
    def rule(r):
        m, mb = int(r["messages"]), int(r["msg_bytes"])
        mu = mb / m if m else 0.0
        return "bulk" if mu >= BULK_MIN_MESSAGE else "chunk" if mu > CTS_MAX_BYTES else "control"
    from skewscope.core.snapshot import ip_str
    lab = [(ip_str(r["src"], int(r["ipver"])), ip_str(r["dst"], int(r["ipver"])), rule(r)) for r in cum]
    known = {x: i for i, x in enumerate(acc.peer_labels)}
    q = [0] * (len(known) + 1)
    for x in lab:
        q[known.get(x, len(known))] += 1
    return q


@pytest.mark.parametrize("seed,max_peers", [(1, 4096), (2, 4096), (3, 7), (4, 3), (5, 20)])
def test_carried_rows_equal_a_full_recompute(seed, max_peers):
    rng = np.random.default_rng(seed)
    a = E.Accumulator(max_peers=max_peers, window=False)
    b = E.Accumulator(max_peers=max_peers, window=False)
    prev, carried, t = None, 0, 1_000_000
    for cur, join in _reads(rng, 14):
        d = flow_delta(prev, cur) if prev is not None else cur[cur["packets"] > 0].copy()
        rows = join_flows(cur, d)
        ev = _events(rng, d, t) if len(d) and rng.random() < 0.8 else None
        t += 100_000
        a.add(d, ev, cum_flows=cur, cum_rows=rows, cum_join=join)
        b.add(d, ev, cum_flows=cur, cum_rows=rows)
        sa, sb = _state(a), _state(b)
        assert sa == sb
        assert a.qps_per_peer().tolist() == _plain_qps(a, cur)
        carried += a._rc is not None and join is not None
        prev = cur
    assert carried >= 5          # the carried path ran, not only the fill


def test_row_cache_carry_refuses_what_it_cannot_carry():
    """A join of another length, a join into rows the cache does not have, delta rows
    without a cumulative row, peer keys grown since: None (the caller fills a new cache)."""
    rng = np.random.default_rng(0)
    (t0, _), (t1, join) = _reads(rng, 2)[:2]
    keys = np.zeros((0, 5), np.uint64)
    rc = RowCache.fill(keys, t0)
    d = flow_delta(t0, t1)
    rows = join_flows(t1, d)
    cls = np.zeros(len(d), np.uint8)
    z3 = np.zeros((0, 3), np.uint64)
    assert rc.carry(join, rows, cls, t1, keys, z3, z3) is not None
    assert rc.carry(join[:-1], rows, cls, t1, keys, z3, z3) is None
    assert rc.carry(np.full(len(t1), len(t0)), rows, cls, t1, keys, z3, z3) is None
    assert rc.carry(join, np.full(len(d), -1), cls, t1, keys, z3, z3) is None
    assert rc.carry(join, rows, cls, t1, np.zeros((1, 5), np.uint64), z3, z3) is None
    assert RowCache.fill(keys, t0[::2]) is None and CLASSES


@pytest.mark.parametrize("preset", ["ring-straggler", "moe-hot-expert", "tp-decode-slow-shard", "pd-imbalanced",
                                    "mpi-ring-healthy", "demo-mix"])
def test_known_node_view_equals_the_whole_window(tmp_path, monkeypatch, preset):
    """With --node-ip and a capture of the whole fabric (a mirror's reads), the window's
    per-node timing reads the node's view (exptiming.WindowedTiming._node_view: the flows
    the node is an end of, their records), made once per read: the exported series are
    those of the analysis of the whole window (VIEW_SHARE < 0: never the view), read by
    read, for rings, all-to-all, decode, KV transfers and RDMA READs."""
    from skewscope import gen as skewgen
    from skewscope.analysis.context import context
    from skewscope.outputs import exptiming
    from skewscope.sources.offline import parse_file
    cap = skewgen.generate(preset, seed=0)
    p = tmp_path / "w.pcap"
    cap.write_pcap(str(p), snaplen=128)
    snap = parse_file(str(p))
    ips = (cap.truth.get("pathologies") or [{}])[0].get("entities", {}).get("ips") or context(snap).nodes.ips[:1]
    ev = snap.events
    t = ev["start_ts"].astype(np.int64)
    span = int(t.max() - t.min())
    cuts = [int(t.min()) + span * k // 5 for k in range(6)]
    cuts[-1] += 1
    real = exptiming.WindowedTiming._node_view
    for ip in list(ips)[:2]:
        def run(share):
            monkeypatch.setattr(exptiming, "VIEW_SHARE", share)
            views = []
            monkeypatch.setattr(exptiming.WindowedTiming, "_node_view",
                                lambda self: (lambda v: views.append(v is not None) or v)(real(self)))
            acc = E.Accumulator(node_ip=ip, window_s=span / 6 / 1e9)
            out = []
            for a, b in zip(cuts[:-1], cuts[1:]):
                acc.add(snap.flows, ev[(t >= a) & (t < b)], cum_flows=snap.flows)
                out.append([(s.name, k, repr(v)) for s, k, v in acc.timing.rows()])
            acc.add(snap.flows, ev[:0], cum_flows=snap.flows)
            out.append([(s.name, k, repr(v)) for s, k, v in acc.timing.rows()])
            return out, views
        view, used = run(0.5)
        whole, unused = run(-1.0)
        assert any(used) and not any(unused)
        assert view == whole and any(view[-1])
