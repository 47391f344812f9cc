#!/usr/bin/env python3
"""The live per-interval work at scale: what one `top` / `export` / `watch` interval does in
user space after the map read, at 65,536 / 262,144 / 1,048,576 flows, per component, against
a straightforward numpy implementation of the same per-interval work measured in the same run;
and (as root) the map read itself: BPF_MAP_LOOKUP_BATCH of an LRU hash of that many entries.

    .venv/bin/python tools/bench/bench_live_scale.py [--flows 65536,262144,1048576] [--rounds 3]
        [--nodes 1024] [--group 32] [--records 100000] [--active 0.5] [--no-map]

The shape: `--nodes` nodes in all-to-all groups of `--group` (1,024 x 32: 31,744 directed node
pairs), each directed pair with q QPs (q = flows / (2 x pairs)): a data flow a->b and its CTS
flow b->a with the same UDP source port; ACK-only flows fill up to the flow count. Two
cumulative reads of the table one interval apart (sorted by key, as the loader returns them):
`--active` of the flows have packets in between, 0.5 % were evicted and re-created, and
`--records` message records of the active data flows belong to the interval. No kernel except
for the map read.

Rows (CPU time of this process, median of --rounds; the first round untimed):

  delta                sources.live.interval_delta(prev, cur, prev_words, pools): the interval's
                       counters as read_interval computes them (the previous read's key words and
                       packets/first_ts columns kept from its own interval: only the new read's
                       are computed; the table written into the session's pool, whose earlier
                       results are let go)
  records -> events    sources.live.read_events(delta flows, records, the read's key words, the
                       delta's rows in the read): read_interval's events, the records matched on
                       the read's key words
  window               sources.live.Window.add + Window.snapshot (the analysis window's delta
                       against its anchor, offered to the runner each read; the reads carry their
                       joins and key words as read_interval's Intervals do; the snapshots' tables
                       from one pool, as one Window's are read after read). The older anchor
                       is the previous read (reads of half the window or more apart): the
                       read's own delta and events are the window's
  window, older anchor the same when the read's delta does not start at the anchor (the live
                       loop's usual case: a 10 s window, 1 s reads): the kept test from the two
                       reads' packets/first_ts columns (Interval.cols), a delta_rows pass against
                       the anchor over the followed join, and the records' events (printed as
                       the top/export intervals "with an older anchor")
  rates                core.rates.flow_rates(delta): top's per-flow columns (part of top rows:
                       build_model computes them; not added to the top interval again)
  top rows             outputs.topview.build_model + plain_lines (sorted rows, totals, 20 shown)
  top matrix           outputs.topmatrix.matrix_view (key m: node x node bit/s)
  live detectors       analysis.live_metrics(delta): roles, partners, node matrix, link
                       counters, congestion table, the live=True detectors
  exporter             outputs.exporter.Accumulator.add + state + one /metrics scrape (the server's registry);
                       the read's delta rows in the cumulative table and its join to the previous read given
                       as live/export.py gives them (Interval.delta_rows, Interval.join: exptables.RowCache)
  exporter, known node the same with --node-ip NODE_IP (a node of the first group): its per-node
                       timing over the window of the last 100,000 records, each read in four
                       pieces (printed as the export interval "with a known node")
  numpy baseline       the same interval in plain numpy: delta by a lexsort key join, rates,
                       sorted rows, node index, node matrix, per-pair counters, per-flow CE/CNP
  map read (root)      BPF_MAP_LOOKUP_BATCH of a BPF_MAP_TYPE_LRU_HASH (the flows map's key and
                       value sizes) filled with the same flows by BPF_MAP_UPDATE_BATCH, then
                       core.snapshot.flows_from_raw (the loader's read_flows without a flow cache)
"""
from __future__ import annotations

import argparse
import ctypes
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from skewscope.core import layout as L  # noqa: E402
from skewscope.core.snapshot import Snapshot, _key_order, flow_key_matrix  # noqa: E402

NS = 1_000_000_000
NODE_IP = "10.0.0.5"      # the exporter's --node-ip in the "known node" row (_ips: node 5)


# ---- the flow tables ------------------------------------------------------------------------
def _ips(n: int) -> np.ndarray:
    ip = np.zeros((n, 16), np.uint8)
    ip[:, 10:12] = 0xFF
    ip[:, 12] = 10
    ip[:, 13] = (np.arange(n) >> 16) & 0xFF
    ip[:, 14] = (np.arange(n) >> 8) & 0xFF
    ip[:, 15] = np.arange(n) & 0xFF
    return ip


def table(n_flows: int, nodes: int, group: int, seed: int = 1):
    """The cumulative flow table at the first read (sorted by key) and the number of data flows."""
    rng = np.random.default_rng(seed)
    g = np.arange(nodes) // group
    a, b = np.meshgrid(np.arange(nodes), np.arange(nodes), indexing="ij")
    same = (g[a] == g[b]) & (a != b)
    pa, pb = a[same], b[same]
    q = max(1, n_flows // (2 * len(pa)))
    nd = min(len(pa) * q, n_flows // 2)
    src = np.repeat(pa, q)[:nd]
    dst = np.repeat(pb, q)[:nd]
    n_ack = n_flows - 2 * nd
    asrc = rng.integers(0, nodes, n_ack)
    adst = (asrc + rng.integers(1, nodes, n_ack)) % nodes
    fsrc = np.concatenate([src, dst, asrc])
    fdst = np.concatenate([dst, src, adst])
    fl = np.zeros(n_flows, L.FLOW_DTYPE)
    ip = _ips(nodes)
    fl["src"], fl["dst"] = ip[fsrc], ip[fdst]
    fl["dest_qp"] = rng.permutation(n_flows) + 0x100
    fl["ipver"], fl["roce"] = 4, 2
    sp = 0xC000 + np.arange(nd) % 0x3FFF
    fl["sport"] = np.concatenate([sp, sp, np.zeros(n_ack, np.int64)])
    kind = np.concatenate([np.zeros(nd, np.int8), np.ones(nd, np.int8), np.full(n_ack, 2, np.int8)])
    _grow(fl, kind, rng, scale=100)
    fl["first_ts"] = 10 * NS
    fl["last_ts"] = 20 * NS
    o = _key_order(flow_key_matrix(fl))
    return fl[o], kind[o]


def _grow(fl, kind, rng, scale):
    """Add `scale` x a random amount of traffic of each flow's kind (data, CTS, ACK-only)."""
    n = len(fl)
    m = rng.integers(1, 10, n).astype(np.uint64) * np.uint64(scale)
    data, cts, ack = kind == 0, kind == 1, kind == 2
    fl["messages"] += np.where(ack, 0, m).astype(np.uint64)
    fl["msg_bytes"] += np.where(data, m * 65536, np.where(cts, m * 64, 0)).astype(np.uint64)
    fl["payload_bytes"] += np.where(data, m * 65536, np.where(cts, m * 64, 0)).astype(np.uint64)
    w = np.where(data, m * 16, np.where(cts, m, 0)).astype(np.uint64)
    fl["op"][:, L.OPC_WRITE] += w
    fl["op"][:, L.OPC_ACK] += (m // 4 + np.where(ack, m, 0)).astype(np.uint64)
    pk = fl["op"].sum(axis=1)
    add = pk - fl["packets"]
    fl["packets"] = pk
    fl["bytes"] += add * np.uint64(1100)
    fl["ecn_capable"] += add
    fl["msg_hist"][:, 17] += np.where(data, m, 0).astype(np.uint64)
    fl["msg_hist"][:, 7] += np.where(cts, m, 0).astype(np.uint64)
    fl["acks"] += (m // 4).astype(np.uint64)
    hot = rng.random(n) < 0.002
    fl["ce"][hot] += add[hot] // 20
    fl["cnp"][hot & cts] += np.uint64(50)
    loss = rng.random(n) < 0.0005
    fl["psn_gaps"][loss & data] += np.uint64(2)
    fl["retransmissions"][loss & data] += np.uint64(40)


def next_read(prev, kind, active: float, t_ns: int, seed: int = 2):
    """The table one interval later: `active` of the flows grew, 0.5 % were evicted and
    re-created (new first_ts, counters from zero), sorted by key."""
    rng = np.random.default_rng(seed)
    cur = prev.copy()
    act = rng.random(len(cur)) < active
    sub = cur[act]
    _grow(sub, kind[act], rng, scale=10)
    sub["last_ts"] = t_ns
    cur[act] = sub
    re = np.nonzero(act & (rng.random(len(cur)) < 0.005))[0]
    for name in L.FLOW_DTYPE.names:
        if name not in ("src", "dst", "dest_qp", "ipver", "roce", "sport", "tclass", "last_opcode", "first_ts",
                        "last_ts"):
            cur[name][re] = cur[name][re] - prev[name][re]
    cur["first_ts"][re] = t_ns - NS // 2
    return cur, act


def records(cur, kind, act, n: int, t0: int, seed: int = 3):
    """n message records of the active data flows (MSG_REC_DTYPE), in [t0, t0 + 1 s)."""
    rng = np.random.default_rng(seed)
    rows = np.nonzero(act & (kind == 0))[0]
    pick = rows[rng.integers(0, len(rows), n)]
    r = np.zeros(n, L.MSG_REC_DTYPE)
    for name in ("src", "dst", "dest_qp", "ipver", "roce"):
        r["key"][name] = cur[name][pick]
    st = t0 + np.sort(rng.integers(0, NS, n)).astype(np.uint64)
    r["start_ts"] = st
    r["end_ts"] = st + np.uint64(5000)
    r["bytes"] = 65536
    r["opclass"] = L.OPC_WRITE
    r["seq"] = np.arange(n) + 1
    return r


def snapshot(flows, events, t0, t1, nmax):
    g = np.zeros(L.G_N, np.uint64)
    g[L.G_ACCOUNTED] = g[L.G_FRAMES] = int(flows["packets"].sum())
    meta = {"source": "live", "interface": "bench", "clock": "monotonic", "first_ts": int(t0), "last_ts": int(t1),
            "duration_s": (t1 - t0) / 1e9, "sample_n": 1, "max_flows": nmax, "flows_present": len(flows),
            "flows_created": len(flows), "flows_evicted": 0, "events_lost": 0}
    return Snapshot(flows, events, g, meta)


# ---- the numpy baseline --------------------------------------------------------------------
def numpy_interval(prev, cur, recs):
    """The same interval in plain numpy: delta by a key join (lexsort), rates, sorted rows,
    node index, node matrix, per-pair counters, per-flow CE/CNP, the records' flows."""
    kw = lambda f: np.ascontiguousarray(flow_key_matrix(f)).view(">u8").reshape(len(f), 5)  # noqa: E731
    ka, kb = kw(prev), kw(cur)
    allk = np.concatenate([ka, kb])
    o = np.lexsort(allk.T[::-1])
    s = allk[o]
    same = np.all(s[1:] == s[:-1], axis=1)
    j = np.full(len(cur), -1, np.int64)
    lo, hi = o[:-1][same], o[1:][same]
    a_i, b_i = np.minimum(lo, hi), np.maximum(lo, hi)
    j[b_i - len(prev)] = a_i
    d = cur.copy()
    have = j >= 0
    p = prev[j[have]]
    back = (cur["packets"][have] < p["packets"]) | (cur["first_ts"][have] != p["first_ts"])
    for name in ("packets", "bytes", "payload_bytes", "messages", "msg_bytes", "op", "ecn_capable", "ce", "fecn",
                 "becn", "cnp", "acks", "nak_seq", "nak_rnr", "nak_other", "psn_gaps", "psn_skipped",
                 "retransmissions", "msg_hist", "gap_hist"):
        sub = p[name].copy()
        sub[back] = 0
        d[name][have] = d[name][have] - sub
    d = d[d["packets"] > 0]
    # rates and the rows shown
    gbps = d["bytes"] * 8.0 / 1e9
    ce = np.where(d["ecn_capable"] > 0, 100.0 * d["ce"] / np.maximum(d["ecn_capable"], 1), 0.0)
    mode = np.argmax(d["msg_hist"], axis=1)
    top = np.lexsort((-gbps, -gbps))[:20]
    # node index, node matrix, per-pair counters
    addr = np.concatenate([d["src"], d["dst"]]).view(">u8").reshape(-1, 2)
    _, inv = np.unique(addr, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    nf = len(d)
    fs, fd = inv[:nf], inv[nf:]
    nn = int(inv.max()) + 1
    mean = np.where(d["messages"] > 0, d["msg_bytes"] / np.maximum(d["messages"], 1), 0)
    data = mean > 512
    mat = np.zeros((nn, nn))
    np.add.at(mat, (fs[data], fd[data]), d["payload_bytes"][data].astype(np.float64))
    pair = fs * nn + fd
    up, pinv = np.unique(pair, return_inverse=True)
    pc = np.zeros((len(up), 5))
    for c, name in enumerate(("ce", "ecn_capable", "cnp", "psn_gaps", "retransmissions")):
        pc[:, c] = np.bincount(pinv, weights=d[name].astype(np.float64), minlength=len(up))
    hot = np.nonzero(ce > 1.0)[0]
    # the interval's records on the delta's flows
    rk = np.ascontiguousarray(recs["key"]).view(np.uint8).reshape(len(recs), -1)[:, :40].copy().view(">u8")
    dk = kw(d)
    allk = np.concatenate([dk, rk])
    _, inv = np.unique(allk, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    tab = np.full(inv.max() + 1, -1)
    tab[inv[:len(dk)]] = np.arange(len(dk))
    ev_flow = tab[inv[len(dk):]]
    return {"delta": d, "top": top, "mode": mode, "matrix": mat, "pairs": pc, "hot": hot, "ev_flow": ev_flow}


# ---- the map read ---------------------------------------------------------------------------
BPF_MAP_CREATE, BPF_MAP_UPDATE_BATCH = 0, 26
BPF_MAP_TYPE_LRU_HASH = 9


def map_read(flows, rounds: int):
    """(seconds to read a filled LRU hash of len(flows) entries: lookup batch, + flows_from_raw;
    the median of the reads after the first, and the first), read as the loader reads it
    (bpf.loader.FlowReader: read after read into the same buffers, the previous table still
    held while the next is made, as the live loop holds its previous read)."""
    from skewscope.bpf import syscalls as S
    from skewscope.bpf.loader import FlowReader
    from skewscope.core.snapshot import flows_from_raw
    n = len(flows)
    kz, vz = L.FLOW_KEY_DTYPE.itemsize, L.FLOW_STATS_DTYPE.itemsize
    a = S._attr()
    S._put(a, 0, "<I", BPF_MAP_TYPE_LRU_HASH)
    S._put(a, 4, "<I", kz)
    S._put(a, 8, "<I", vz)
    S._put(a, 12, "<I", n)
    fd = S._sys_bpf(BPF_MAP_CREATE, a)
    try:
        keys = np.ascontiguousarray(flow_key_matrix(flows))
        vals = np.zeros(n, L.FLOW_STATS_DTYPE)
        for name in L.FLOW_STATS_DTYPE.names:
            if name in flows.dtype.names:
                vals[name] = flows[name]
        vals = vals.view(np.uint8).reshape(n, vz)
        done = 0
        while done < n:
            k = min(65536, n - done)
            u = S._attr()
            S._put(u, 16, "<Q", keys.ctypes.data + done * kz)
            S._put(u, 24, "<Q", vals.ctypes.data + done * vz)
            S._put(u, 32, "<I", k)
            S._put(u, 36, "<I", fd)
            S._sys_bpf(BPF_MAP_UPDATE_BATCH, u)
            done += S._get(u, 32, "<I")
        del keys, vals
        reader = FlowReader(n)
        t_look, t_raw, got = [], [], 0
        for _ in range(rounds + 1):
            c = time.process_time()
            kk, vv = reader.entries(fd)
            c1 = time.process_time()
            f = flows_from_raw(kk, vv, pool=reader.pool)    # = reader.read(fd)
            t_look.append(c1 - c)
            t_raw.append(time.process_time() - c1)
            got = len(f)
        return statistics.median(t_look[1:]), statistics.median(t_raw[1:]), got, t_look[0], t_raw[0]
    finally:
        os.close(fd)


# ---- run ------------------------------------------------------------------------------------
def cpu(fn, rounds):
    """Median CPU time of fn over rounds, after one untimed round."""
    fn()
    cs = []
    for _ in range(rounds):
        c = time.process_time()
        fn()
        cs.append(time.process_time() - c)
    return statistics.median(cs)


def run(n_flows, a, rows):
    from prometheus_client import CollectorRegistry  # noqa: F401  (the exporter's renderer)

    from skewscope.analysis import live_metrics
    from skewscope.outputs import expose as X
    from skewscope.outputs.exporter import Accumulator
    from skewscope.outputs.topmatrix import matrix_view
    from skewscope.outputs.topview import ViewState, build_model, plain_lines
    from skewscope.core.pool import ArrayPool
    from skewscope.core.rates import COLS_DTYPE, WORDS_DTYPE, flow_rates, row_columns
    from skewscope.core.snapshot import events_from_records
    from skewscope.core.rates import order_words
    from skewscope.sources.live import Interval, Window, interval_delta, read_events

    t_build = time.perf_counter()
    prev, kind = table(n_flows, a.nodes, a.group)
    t1 = 21 * NS
    cur, act = next_read(prev, kind, a.active, t1)
    recs = records(cur, kind, act, a.records, 20 * NS)
    print(f"\n{n_flows:,} flows ({int((kind == 0).sum()):,} data, {int(act.sum()):,} active in the interval), "
          f"{a.records:,} records; built in {time.perf_counter() - t_build:.1f} s")
    prev_words = order_words(prev)         # the session kept them from the previous interval
    cols = np.empty((len(cur), 2), np.uint64)     # cur's packets/first_ts, filled by the delta's pass
    d0, j0, words, rows0 = interval_delta(prev, cur, 20 * NS, prev_words, cols=cols, with_rows=True)
    assert j0 is not None and np.array_equal(j0, np.arange(len(cur)))   # the same keys in both reads
    ev0 = read_events(d0, recs, words, rows0)
    assert ev0.tobytes() == events_from_records(d0, recs).tobytes()
    delta = snapshot(d0, ev0, 20 * NS, t1, n_flows)
    cum = snapshot(cur, np.zeros(0, L.EVENT_DTYPE), 0, t1, n_flows)
    cum0 = snapshot(prev, np.zeros(0, L.EVENT_DTYPE), 0, 20 * NS, n_flows)
    iv0 = Interval(0, 0.0, 20.0, 20.0, cum0, cum0, np.zeros(0, L.MSG_REC_DTYPE), words=prev_words,
                   cols=row_columns(prev))
    iv = Interval(1, 1.0, 1.0, 21.0, delta, cum, recs)
    state = ViewState()

    def fresh():
        return Snapshot(delta.flows, delta.events, delta.globals, dict(delta.meta))

    ivw = Interval(1, 26.0, 6.0, 26.0, delta, snapshot(cur, np.zeros(0, L.EVENT_DTYPE), 0, 26 * NS, n_flows), recs,
                   join=j0, words=words, cols=cols)

    # the session's pools (delta tables, key words) and the window's, as they are read after read
    dpool, kpool, wpool = ArrayPool(L.FLOW_DTYPE), ArrayPool(WORDS_DTYPE), ArrayPool(L.FLOW_DTYPE)
    cpool = ArrayPool(COLS_DTYPE)

    def f_window():
        # the steady state: the window's older anchor is the previous read (5 s before)
        w = Window(10.0, pool=wpool)
        w.add(iv0)
        w.add(ivw)
        return w.snapshot(ivw)

    # the same reads, the interval's delta (as if) from a read before the anchor: made again
    dmeta = dict(delta.meta, first_ts=15 * NS)
    ivo = Interval(1, 26.0, 6.0, 26.0, Snapshot(delta.flows, delta.events, delta.globals, dmeta), ivw.cum, recs,
                   join=j0, words=words, cols=cols)

    def f_window_older():
        w = Window(10.0, pool=wpool)
        w.add(iv0)
        w.add(ivo)
        return w.snapshot(ivo)

    shared, made = f_window(), f_window_older()   # the two cases measured, the same table
    assert shared.flows is delta.flows and made.flows is not delta.flows
    assert made.flows.tobytes() == shared.flows.tobytes()
    assert made.events.tobytes() == shared.events.tobytes()   # matched on the read's key words: the same events
    del shared, made

    def f_top():
        m = build_model(delta, 1.0, state, iface="bench", cum=cum, limit=20)
        return plain_lines(m)

    def exporter(node_ip=None):
        """The exporter's steady state: one Accumulator fed read after read (peers known), each
        read's records one second later than the previous read's; with node_ip (--node-ip) its
        per-node timing over the window every read."""
        acc = Accumulator(timing_nodes=0, node_ip=node_ip)
        shift = [0]
        cur_state = [None]
        registry = X.make_registry(X.SkewscopeCollector(lambda: cur_state[0]), process_metrics=False)

        def f():
            ev = delta.events.copy()
            ev["start_ts"] += np.uint64(shift[0] * NS)
            ev["end_ts"] += np.uint64(shift[0] * NS)
            shift[0] += 1
            # as live/export.py passes a read (j0: the read's join to the previous one, as here
            # to the same table: no flow came or went between the bench's two reads)
            acc.add(delta.flows, ev, cum_flows=cum.flows, cum_rows=rows0, cum_join=j0)
            cur_state[0] = acc.state("bench", cum.globals, dict(cum.meta), 20, read_ts=1.0)
            return registry.exposition()          # one /metrics scrape of the server's registry
        return f

    f_export = exporter()
    f_export_node = exporter(NODE_IP)

    r = a.rounds
    comp = [
        ("delta", cpu(lambda: interval_delta(prev, cur, 20 * NS, prev_words, pool=dpool, word_pool=kpool,
                                             cols=cpool.take(len(cur)), prev_cols=iv0.cols), r),
         "O(flows)"),
        ("records -> events", cpu(lambda: read_events(d0, recs, words, rows0), r), "O(flows + records)"),
        ("window", cpu(f_window, r), "O(flows + records)"),
        ("window, older anchor", cpu(f_window_older, r), "O(flows + records)  (not in the intervals)"),
        ("rates", cpu(lambda: flow_rates(d0, 1.0), r), "O(flows)  (in top rows)"),
        ("top rows", cpu(f_top, r), "O(flows)"),
        ("top matrix", cpu(lambda: matrix_view(fresh(), 1.0), r), "O(flows) + O(nodes^2)"),
        ("live detectors", cpu(lambda: live_metrics(fresh()), r), "O(flows) + O(pairs) + O(nodes^2)"),
        ("exporter", cpu(f_export, r), "O(delta + records) + O(flows) compact"),
        ("exporter, known node", cpu(f_export_node, r),
         "O(delta + records) + O(the node's view)  (not in the intervals)"),
    ]
    t_np = cpu(lambda: numpy_interval(prev, cur, recs), r)
    top_total = sum(c for name, c, _ in comp if name in ("delta", "records -> events", "window",
                                                           "top rows", "live detectors"))
    exp_total = sum(c for name, c, _ in comp if name in ("delta", "records -> events", "window", "exporter"))
    print(f"{'component':22s} {'CPU':>10s}  grows")
    for name, c, grows in comp:
        print(f"{name:22s} {c * 1e3:7.1f} ms  {grows}")
    print(f"{'top interval':22s} {top_total * 1e3:7.1f} ms  delta + events + window + rows + live detectors")
    print(f"{'export interval':22s} {exp_total * 1e3:7.1f} ms  delta + events + window + exporter")
    older = dict((name, c) for name, c, _ in comp)
    older = older["window, older anchor"] - older["window"]
    print(f"{'  with an older anchor':22s} {(top_total + older) * 1e3:7.1f} ms  top interval; export interval "
          f"{(exp_total + older) * 1e3:.1f} ms (the window's own delta against its anchor)")
    known = dict((name, c) for name, c, _ in comp)
    known = known["exporter, known node"] - known["exporter"]
    print(f"{'  with a known node':22s} {(exp_total + known) * 1e3:7.1f} ms  export interval (its per-node timing "
          f"window); {(exp_total + known + older) * 1e3:.1f} ms with an older anchor")
    print(f"{'numpy baseline':22s} {t_np * 1e3:7.1f} ms  ({t_np / top_total:.1f}x the top interval's CPU)")
    line = {"flows": n_flows, "top": top_total, "export": exp_total, "numpy": t_np, "older": older}
    if a.map:
        try:
            look, raw, got, look0, raw0 = map_read(cur, r)
            print(f"{'map read (root)':22s} {look * 1e3:7.1f} ms  lookup batch of {got:,} entries; "
                  f"+ {raw * 1e3:.1f} ms flows_from_raw (the first read: {look0 * 1e3:.1f} + {raw0 * 1e3:.1f} ms)")
            line.update(map=look, raw=raw)
        except OSError as e:
            print(f"map read: not measured ({e})")
    rows.append(line)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--flows", default="65536,262144,1048576")
    ap.add_argument("--nodes", type=int, default=1024)
    ap.add_argument("--group", type=int, default=32)
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--active", type=float, default=0.5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-map", dest="map", action="store_false", help="skip the map read (needs root)")
    a = ap.parse_args()
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.node()}, {os.cpu_count()} CPUs, "
          f"load {open('/proc/loadavg').read().split()[0]}; {a.nodes} nodes in groups of {a.group}")
    rows = []
    for n in (int(x) for x in a.flows.split(",")):
        run(n, a, rows)
    print(f"\nflows        top interval   export interval   numpy baseline   map read + flows_from_raw"
          f"   (older anchor: top, export)")
    for x in rows:
        mr = f"{x['map'] * 1e3:8.1f} + {x['raw'] * 1e3:.1f} ms" if "map" in x else "-"
        print(f"{x['flows']:>9,}   {x['top'] * 1e3:9.1f} ms   {x['export'] * 1e3:12.1f} ms   "
              f"{x['numpy'] * 1e3:11.1f} ms   {mr}   ({(x['top'] + x['older']) * 1e3:.1f}, "
              f"{(x['export'] + x['older']) * 1e3:.1f} ms)")
    print(f"load average at the end: {open('/proc/loadavg').read().split()[0]}")


if __name__ == "__main__":
    main()
