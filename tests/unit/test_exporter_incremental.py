"""The exporter's per-read work is incremental (issue 30 part 3): each read adds its new
records' busy time and message timing to running per-pair / per-destination / per-source
sums, timing only the flows the records refer to, and finds each flow's pair by one pass
over the table's rows (exptables.peer_rows / dst_rows). Ground truth here is recomputed
from scratch over the whole random record stream in plain Python: the union of every
message's on-wire interval per pair, destination and source, and the per-flow message
timing of each read by the analysis package's definition (analysis.flows.flow_event_stats
on the read's whole flow table, as the exporter did before it timed the referenced flows
only)."""
from __future__ import annotations

import numpy as np
import pytest

from skewscope.analysis.flows import flow_event_stats
from skewscope.core import layout as L
from skewscope.core.snapshot import Snapshot, flow_key_words, ip_bytes, ip_str, match_rows
from skewscope.outputs import exporter as E
from skewscope.outputs import metrics as M
from skewscope.outputs.exptables import (CLASSES, dst_ids, dst_rows, flow_class, peer_dst_src_rows, peer_ids,
                                        peer_rows)

NODES = ["10.0.0.1", "10.0.0.2", "10.0.0.3", "fd00::4", "fd00::5"]


def union_len(intervals):
    """Measure of a union of [s, e] intervals, plainly."""
    tot, cur_s, cur_e = 0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                tot += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return tot + (cur_e - cur_s if cur_e is not None else 0)


def flow_row(f, src, dst, qp):
    f["src"] = np.frombuffer(ip_bytes(src)[0], np.uint8)
    f["dst"] = np.frombuffer(ip_bytes(dst)[0], np.uint8)
    f["ipver"] = ip_bytes(src)[1]
    f["roce"] = 2
    f["dest_qp"] = qp


def random_stream(rng, reads):
    """reads x (delta flow table, its records): flows between NODES (v4 with v4, v6 with v6),
    some without records in a read; record starts increase from read to read (a read holds
    the messages that started since the previous one), ends overlap freely."""
    pairs = [(a, b) for a in NODES for b in NODES if a != b and (":" in a) == (":" in b)]
    keys = [(a, b, 0x100 + q) for k, (a, b) in enumerate(pairs) for q in range(1 + k % 3)]
    out, t = [], 1_000_000
    for _ in range(reads):
        use = sorted(rng.choice(len(keys), size=rng.integers(2, len(keys) + 1), replace=False))
        fl = np.zeros(len(use), L.FLOW_DTYPE)
        for i, k in enumerate(use):
            flow_row(fl[i:i + 1], *keys[k])
        size = rng.choice([64, 4096, 65536, 1 << 20], size=len(use))
        n = int(rng.integers(1, 60))
        ev = np.zeros(n, L.EVENT_DTYPE)
        ev["flow"] = rng.integers(-1, len(use), n)           # -1: a record of an evicted flow
        st = t + np.sort(rng.integers(0, 50_000, n))
        ev["start_ts"] = st
        ev["end_ts"] = st + rng.integers(0, 20_000, n)
        ev["bytes"] = size[np.maximum(ev["flow"], 0)]
        ev["opclass"] = L.OPC_WRITE
        for i in range(len(use)):
            mine = ev["flow"] == i
            m = int(mine.sum()) + int(rng.integers(0, 3))
            b = int(ev["bytes"][mine].sum()) + int(size[i]) * (m - int(mine.sum()))
            pk = max(1, b // 4096) + m
            fl["messages"][i], fl["msg_bytes"][i] = m, b
            fl["packets"][i], fl["bytes"][i] = pk, b + 58 * pk
            fl["op"][i][L.OPC_WRITE] = pk
        out.append((fl, ev))
        t = int(st[-1]) + int(rng.integers(0, 30_000))
    return out


def scratch(stream):
    """Per pair (src, dst, class), destination and data source: busy ns (plain union over all
    reads) and per pair the summed message timing, from the records of the whole stream."""
    iv_pair, iv_dst, iv_src, timed = {}, {}, {}, {}
    for fl, ev in stream:
        fst = flow_event_stats(Snapshot(fl, ev, np.zeros(L.G_N, np.uint64), {}))[0]
        cls = flow_class(fl)
        for i in range(len(fl)):
            v = int(fl["ipver"][i])
            src, dst = ip_str(fl["src"][i], v), ip_str(fl["dst"][i], v)
            pair = (src, dst, CLASSES[int(cls[i])])
            t = timed.setdefault(pair, [0.0, 0.0])
            t[0] += float(fst["multi_bytes"][i])
            t[1] += float(fst["wire_ns"][i])
            pkt = int(np.nan_to_num(fst["pkt_ns"][i]))
            for r in np.nonzero(ev["flow"] == i)[0]:
                s = int(ev["start_ts"][r])
                e = max(int(ev["end_ts"][r]), s) + pkt
                iv_pair.setdefault(pair, []).append((s, e))
                iv_dst.setdefault(dst, []).append((s, e))
                if CLASSES[int(cls[i])] != "control":
                    iv_src.setdefault(src, []).append((s, e))
    busy = lambda d: {k: union_len(v) for k, v in d.items()}  # noqa: E731
    return busy(iv_pair), busy(iv_dst), busy(iv_src), timed


@pytest.mark.parametrize("seed", range(6))
def test_running_sums_equal_a_from_scratch_union_of_the_whole_stream(seed):
    rng = np.random.default_rng(seed)
    stream = random_stream(rng, reads=int(rng.integers(2, 7)))
    acc = E.Accumulator(window=False)
    for fl, ev in stream:
        acc.add(fl, ev)                   # each read: a delta and its records, no cumulative table
    pair_busy, dst_busy, src_busy, timed = scratch(stream)
    got = {lab: int(b) for lab, b in zip(acc.peer_labels, acc.peer_busy)}
    assert got == {k: pair_busy.get(k, 0) for k in got}
    assert set(pair_busy) <= set(got)
    assert dict(zip(acc.dst_labels, acc.dst_busy.tolist())) == {k: dst_busy.get(k, 0) for k in acc.dst_labels}
    assert set(dst_busy) <= set(acc.dst_labels)
    assert dict(zip(acc.src_labels, acc.src_busy.tolist())) == src_busy
    for lab, (mb, wire) in zip(acc.peer_labels, acc.peer_timed):
        assert mb == pytest.approx(timed[lab][0]) and wire == pytest.approx(timed[lab][1])
    assert not acc.overflow_used and acc.overflow_busy == 0
    assert acc.events_without_flow == sum(int((ev["flow"] < 0).sum()) for _, ev in stream)


@pytest.mark.parametrize("seed", range(4))
def test_key_rows_match_the_id_matrix_join(seed):
    """peer_rows / dst_rows (one pass over the rows) = match_rows on the (n, k) id matrix,
    IPv4 and IPv6, known and unknown ids, every class."""
    rng = np.random.default_rng(seed)
    n = 3000
    fl = np.zeros(n, L.FLOW_DTYPE)
    ips = [f"10.{i}.0.{j}" for i in range(3) for j in range(1, 9)] + [f"fd00::{i:x}" for i in range(1, 20)]
    for i in range(n):
        a, b = rng.choice(len(ips), 2, replace=False)
        flow_row(fl[i:i + 1], ips[a], ips[b], i)
    fl["ipver"][rng.random(n) < 0.05] = 6              # an inconsistent ipver is its own id
    cls = rng.integers(0, 3, n).astype(np.uint8)
    pk = peer_ids(fl, cls)
    known = np.unique(pk[rng.random(n) < 0.3], axis=0)
    rows = peer_rows(known, fl, cls)
    assert np.array_equal(rows, match_rows(known, pk))
    assert (rows >= 0).any() and (rows < 0).any()
    ends = {}
    for end in ("src", "dst"):
        dk = dst_ids(fl, end)
        kd = ends[end] = np.unique(dk[rng.random(n) < 0.3], axis=0)
        r = dst_rows(kd, fl, end)
        assert np.array_equal(r, match_rows(kd, dk)) and (r >= 0).any()
    # the three in one pass (the exporter's per-read lookup), also with tables still empty
    got = peer_dst_src_rows(known, ends["dst"], ends["src"], fl, cls)
    want = (match_rows(known, pk), match_rows(ends["dst"], dst_ids(fl)), match_rows(ends["src"], dst_ids(fl, "src")))
    assert all(np.array_equal(g, w) for g, w in zip(got, want))
    got = peer_dst_src_rows(known[:0], ends["dst"], ends["src"][:0], fl, cls)
    assert (got[0] < 0).all() and np.array_equal(got[1], want[1]) and (got[2] < 0).all()
    assert len(peer_rows(known[:0], fl, cls)) == n and (peer_rows(known[:0], fl, cls) < 0).all()
    assert len(peer_rows(known, fl[:0], cls[:0])) == 0


def test_join_flows_equals_a_plain_key_lookup():
    """core.rates.join_flows (the exporter's and the window's join: the key words read in
    place, one merge; the order_words merge when the caller has the words; else the hash
    join) = a plain dict lookup of each row's key fields, for sorted tables with shared,
    missing and extra keys, row subsets, unsorted ones (the fallback), non-contiguous ones
    and given words. The bytes after the key (counters, and the two past roce) never count."""
    from skewscope.core.rates import join_flows, order_words
    from skewscope.core.snapshot import _key_order, flow_key_matrix
    rng = np.random.default_rng(7)
    n = 4000
    a = np.zeros(n, L.FLOW_DTYPE)
    ips = [f"10.0.{i}.{j}" for i in range(2) for j in range(1, 30)] + [f"fd00::{i:x}" for i in range(1, 30)]
    for i in range(n):
        x, y = rng.choice(len(ips), 2, replace=False)
        flow_row(a[i:i + 1], ips[x], ips[y], int(rng.integers(0, 1 << 32)))
    a["roce"] = rng.integers(1, 3, n)
    a["packets"] = rng.integers(0, 1 << 60, n)
    a = a[_key_order(flow_key_matrix(a))]
    a = a[np.concatenate([[True], np.any(flow_key_matrix(a)[1:] != flow_key_matrix(a)[:-1], axis=1)])]
    raw = a.view(np.uint8).reshape(len(a), -1)
    raw[:, 38:40] = rng.integers(0, 256, (len(a), 2))     # padding after roce: not the key
    b = a[np.sort(rng.choice(len(a), len(a) // 2, replace=False))].copy()
    b["packets"] = rng.integers(0, 1 << 60, len(b))
    extra = b[:50].copy()
    extra["dest_qp"] ^= 0x5A5A5A5A                      # keys a lacks
    b2 = np.concatenate([b, extra])
    b2 = b2[_key_order(flow_key_matrix(b2))]
    a_sub = a[np.sort(rng.choice(len(a), len(a) * 3 // 4, replace=False))].copy()

    def plain(x, y):
        key = lambda r: (bytes(r["src"]), bytes(r["dst"]), int(r["dest_qp"]), int(r["ipver"]), int(r["roce"]))  # noqa: E731
        at = {key(r): i for i, r in enumerate(x)}
        return np.array([at.get(key(r), -1) for r in y], dtype=np.int64)

    cases = ((a, b), (a, b2), (a_sub, b2), (b2, a), (a, b2[::-1].copy()), (a[::-1].copy(), b2), (a[::2], b2),
             (a, b2[:0]), (a[:0], b2))
    for x, y in cases:
        want = plain(x, y)
        assert np.array_equal(join_flows(x, y), want)
        if len(x) and len(y):
            assert np.array_equal(join_flows(x, y, order_words(x), order_words(y)), want)
            assert np.array_equal(join_flows(x, y, order_words(x)), want)
    assert (join_flows(a_sub, b2) < 0).sum() > 50 and (join_flows(a, b2) >= 0).sum() == len(b)


def test_flow_class_kernel_matches_the_mean_message_rule():
    """flow_class (one pass over the rows) = the rule by the mean message size, computed
    plainly per flow, including means exactly at both thresholds and flows without messages."""
    from skewscope.analysis.fleet import BULK_MIN_MESSAGE, CTS_MAX_BYTES
    rng = np.random.default_rng(3)
    n = 5000
    fl = np.zeros(n, L.FLOW_DTYPE)
    m = rng.integers(0, 1000, n)
    m[:10] = 0
    fl["messages"] = m
    mean = rng.choice([0, 1, CTS_MAX_BYTES, CTS_MAX_BYTES + 1, BULK_MIN_MESSAGE - 1, BULK_MIN_MESSAGE, 1 << 20], n)
    fl["msg_bytes"] = m * mean + rng.integers(0, 2, n) * (m > 0)
    want = []
    for i in range(n):
        mi, bi = int(fl["messages"][i]), int(fl["msg_bytes"][i])
        mu = bi / mi if mi else 0.0
        want.append("bulk" if mu >= BULK_MIN_MESSAGE else "chunk" if mu > CTS_MAX_BYTES else "control")
    got = [CLASSES[c] for c in flow_class(fl)]
    assert got == want and len(set(got)) == 3
    assert [CLASSES[c] for c in flow_class(fl[::2])] == want[::2]      # a strided table: numpy path


@pytest.mark.parametrize("seed", range(5))
def test_window_merge_equals_a_stable_sort(seed):
    """The window's records and a read's piece, each sorted by start: the merge = a stable
    sort of the two concatenated (ties: the window's records first), overlapping or not."""
    from skewscope.outputs.exptiming import _merge_by_start
    rng = np.random.default_rng(seed)
    for na, nb, lo in ((0, 5, 0), (5, 0, 0), (300, 200, 0), (300, 200, 150), (50, 400, 0), (200, 200, 1000)):
        a = np.zeros(na, L.EVENT_DTYPE)
        b = np.zeros(nb, L.EVENT_DTYPE)
        a["start_ts"] = np.sort(rng.integers(0, 100, na))
        b["start_ts"] = np.sort(rng.integers(lo, lo + 100, nb))
        a["flow"], b["flow"] = np.arange(na), 10_000 + np.arange(nb)      # identity, to see the order
        both = np.concatenate([a, b])
        want = both[np.argsort(both["start_ts"], kind="stable")]
        assert _merge_by_start(a, b).tobytes() == want.tobytes()


def _window_stream(rng, reads):
    """reads x (delta, records, cumulative table): the delta's flows a random subset of the
    cumulative table's (some delta flows missing from it: no cumulative row), counters
    random (every row distinct), records with distinct start times (each record's own)."""
    pairs = [(a, b) for a in NODES for b in NODES if a != b and (":" in a) == (":" in b)]
    keys = [(a, b, 0x100 + q) for (a, b) in pairs for q in range(3)]
    out, t = [], 1_000_000_000
    for _ in range(reads):
        cum = np.zeros(len(keys), L.FLOW_DTYPE)
        for i, k in enumerate(keys):
            flow_row(cum[i:i + 1], *k)
        for name in ("packets", "bytes", "messages", "msg_bytes", "first_ts"):
            cum[name] = rng.integers(1, 1 << 40, len(cum))
        use = np.sort(rng.choice(len(keys), size=int(rng.integers(2, len(keys))), replace=False))
        delta = cum[use].copy()
        delta["packets"] = rng.integers(1, 1 << 20, len(delta))
        cum = cum[np.isin(np.arange(len(keys)), use[rng.random(len(use)) < 0.2], invert=True)]
        n = int(rng.integers(1, 400))
        ev = np.zeros(n, L.EVENT_DTYPE)
        ev["flow"] = rng.integers(-1, len(delta), n)
        ev["start_ts"] = t + np.sort(rng.choice(4_000_000_000, n, replace=False))
        ev["end_ts"] = ev["start_ts"] + rng.integers(0, 50_000, n)
        ev["bytes"] = 65536
        ev["opclass"] = L.OPC_WRITE
        out.append((delta, ev, cum))
        t = int(ev["start_ts"][-1]) + int(rng.integers(1, 2_000_000_000))
    return out


@pytest.mark.parametrize("seed", range(4))
def test_window_flow_table_equals_a_plain_model(seed):
    """The window's flow table, updated in place read after read (rows a read brings again
    written over, new ones appended, the ones no record refers to any more dropped): every
    window record points at its own flow's row, that row is the latest read's cumulative row
    of the key (the delta's when the table has none), and the table holds exactly the keys
    the window's records refer to, in the order they first came -- a dict and a list in
    plain Python as the reference, with reads in pieces and records dropped as it slides."""
    from skewscope.outputs.exptiming import TimingAccumulator, WindowedTiming
    rng = np.random.default_rng(seed)
    w = WindowedTiming(TimingAccumulator(max_nodes=0), window_s=8.0, max_records=int(rng.choice([60, 1000])))
    key = lambda r: r.tobytes()[:38]                     # noqa: E731  (src, dst, dest_qp, ipver, roce)
    order, row, of_start, total = [], {}, {}, 0
    for delta, ev, cum in _window_stream(rng, 8):
        w.add(delta, ev, cum_flows=cum)
        at_cum = {key(r): r.tobytes() for r in cum}
        for f in sorted({int(x) for x in ev["flow"] if x >= 0}):
            k = key(delta[f])
            row[k] = at_cum.get(k, delta[f].tobytes())
            if k not in order:
                order.append(k)
        for e in ev:
            of_start[int(e["start_ts"])] = key(delta[e["flow"]]) if e["flow"] >= 0 else None
        refs = set()
        for e in w.events:
            k = of_start[int(e["start_ts"])]
            assert (e["flow"] < 0) == (k is None)
            if k is not None:
                assert w.flows[e["flow"]].tobytes() == row[k]
                refs.add(k)
        order = [k for k in order if k in refs]
        assert [key(r) for r in w.flows] == order
        assert np.array_equal(w.keys, flow_key_words(w.flows))
        total += len(ev)
    assert 0 < len(w.events) < total            # the window slid: records and their flows dropped


def _node_view_in_thirds(cap, ip, p):
    """The capture as node ip sees it, parsed from p: (snapshot, its records, their start
    times, their span, the times cutting them into three reads)."""
    from skewscope.sources.offline import parse_file
    cap.view(ip).write_pcap(str(p), snaplen=128)
    snap = parse_file(str(p))
    ev = snap.events
    t = ev["start_ts"].astype(np.int64)
    span = int(t.max() - t.min())
    cuts = [int(t.min()) + span * k // 3 for k in range(4)]
    cuts[-1] += 1
    return snap, ev, t, span, cuts


def test_window_pieces_share_the_flows_context_without_changing_the_timing(tmp_path, monkeypatch):
    """The pieces of one read reuse its flow table's columns, nodes and sport partners:
    the node's exported timing series are those made with a fresh context per piece, for
    reads in many pieces (a window a few iterations long)."""
    from skewscope import gen as skewgen
    from skewscope.outputs import exptiming
    cap = skewgen.generate("tp-decode-slow-shard", seed=0)
    ip = cap.truth["pathologies"][0]["entities"]["ips"][0]
    p = tmp_path / "v.pcap"
    snap, ev, t, span, cuts = _node_view_in_thirds(cap, ip, p)

    def run():
        calls = []
        real = exptiming.per_node_timing
        monkeypatch.setattr(exptiming, "per_node_timing", lambda *a, **k: calls.append(1) or real(*a, **k))
        acc = E.Accumulator(node_ip=ip, window_s=span / 8 / 1e9)
        for a, b in zip(cuts[:-1], cuts[1:]):
            acc.add(snap.flows, ev[(t >= a) & (t < b)], cum_flows=snap.flows)
        acc.add(snap.flows, ev[:0], cum_flows=snap.flows)
        monkeypatch.setattr(exptiming, "per_node_timing", real)
        return [(s.name, k, repr(v)) for s, k, v in acc.timing.rows()], len(calls)

    shared, pieces = run()
    monkeypatch.setattr(exptiming, "_FLOWS_ONLY", ())
    monkeypatch.setattr(exptiming, "_ROLES", ())
    fresh, _ = run()
    assert shared == fresh and pieces > 3 * 3
    assert any(name == M.NODE_STEPS.name and float(v) > 0 for name, _, v in shared)


def test_window_pieces_share_roles_only_when_they_do_not_read_the_records(tmp_path):
    """_flows_only hands the next piece the roles (and partners, READ response flows) only
    when flow_roles does not read the records: then they are those flow_roles makes afresh
    from the same flow table with any other records (none, or the other half); a flow that
    mixes READ requests with WRITEs keeps them per piece."""
    from skewscope import gen as skewgen
    from skewscope.analysis import flows as FL
    from skewscope.analysis.context import context
    from skewscope.outputs.exptiming import _flows_only
    from skewscope.sources.offline import parse_file
    cap = skewgen.generate("tp-decode-slow-shard", seed=0)
    p = tmp_path / "v.pcap"
    cap.write_pcap(str(p), snaplen=128)
    snap = parse_file(str(p))
    ev = snap.events
    half = len(ev) // 2
    g = np.zeros(L.G_N, np.uint64)
    ctx = context(Snapshot(snap.flows, ev[:half], g, {}))
    ctx.data, ctx.read_flow            # computed as a piece's per_node_timing would
    kept = _flows_only(ctx)
    assert {"cols", "nodes", "pairs", "partner_sport", "roles", "data", "partner", "read_flow"} <= set(kept)
    for other in (ev[half:], ev[:0]):
        fresh = Snapshot(snap.flows, other, g, {})
        roles = FL.flow_roles(fresh)
        assert np.array_equal(kept["roles"], roles) and (roles == FL.ROLE_DATA).any()
        assert np.array_equal(kept["data"], roles == FL.ROLE_DATA)
        fc = context(fresh)
        assert np.array_equal(kept["partner"], fc.partner) and np.array_equal(kept["read_flow"], fc.read_flow)
    mixed = snap.flows.copy()
    i = int(np.nonzero(kept["data"])[0][0])
    mixed["op"][i, L.OPC_READ_REQ] = 1
    mixed["op"][i, L.OPC_WRITE] = max(1, int(mixed["op"][i, L.OPC_WRITE]))
    ctx = context(Snapshot(mixed, ev[:half], g, {}))
    ctx.read_flow
    assert set(_flows_only(ctx)) == {"cols", "nodes", "pairs", "partner_sport"}


def test_joined_class_and_peer_counts_equal_a_plain_count():
    """joined_class (each delta row's class from its cumulative row, else its own) and
    peer_counts (flows per known pair with their own class, the rest last) against the mean
    message rule and a dict count over the rows in plain Python; strided tables: the numpy path."""
    from skewscope.analysis.fleet import BULK_MIN_MESSAGE, CTS_MAX_BYTES
    from skewscope.outputs.exptables import joined_class, peer_counts
    rng = np.random.default_rng(9)
    n = 3000
    cum = np.zeros(n, L.FLOW_DTYPE)
    for i in range(n):
        a, b = rng.choice(len(NODES) - 2, 2, replace=False)
        flow_row(cum[i:i + 1], NODES[a], NODES[b], i)
    m = rng.integers(0, 50, n)
    cum["messages"] = m
    cum["msg_bytes"] = m * rng.choice([0, 64, CTS_MAX_BYTES, CTS_MAX_BYTES + 1, BULK_MIN_MESSAGE, 1 << 20], n)
    delta = cum[rng.random(n) < 0.5].copy()
    delta["messages"], delta["msg_bytes"] = 1, rng.choice([64, 1 << 20], len(delta))
    j = np.where(rng.random(len(delta)) < 0.8, rng.integers(0, n, len(delta)), -1)

    def rule(r):
        mi, bi = int(r["messages"]), int(r["msg_bytes"])
        mu = bi / mi if mi else 0.0
        return CLASSES.index("bulk" if mu >= BULK_MIN_MESSAGE else "chunk" if mu > CTS_MAX_BYTES else "control")

    want = [rule(cum[j[k]]) if j[k] >= 0 else rule(delta[k]) for k in range(len(delta))]
    assert joined_class(cum, j, delta).tolist() == want
    assert joined_class(cum[::2], j // 2, delta[::1]).tolist() == [rule(cum[::2][j[k] // 2]) if j[k] >= 0
                                                                   else rule(delta[k]) for k in range(len(delta))]
    lab = lambda r: (bytes(r["src"]), bytes(r["dst"]), int(r["ipver"]), rule(r))  # noqa: E731
    pairs = sorted({lab(r) for r in cum})
    known = pairs[::2]
    keys = peer_ids(np.concatenate([cum[[lab(r) == p for r in cum]][:1] for p in known]),
                    np.array([p[3] for p in known], np.uint8))
    count = {}
    for r in cum:
        count[lab(r)] = count.get(lab(r), 0) + 1
    want = [count[p] for p in known] + [sum(v for p, v in count.items() if p not in known)]
    assert peer_counts(keys, cum).tolist() == want
    half = {}
    for r in cum[::2]:
        half[lab(r)] = half.get(lab(r), 0) + 1
    assert peer_counts(keys, cum[::2]).tolist() == ([half.get(p, 0) for p in known]
                                                    + [sum(v for p, v in half.items() if p not in known)])
    assert peer_counts(keys[:0], cum).tolist() == [n] and peer_counts(keys, cum[:0]).tolist() == [0] * (len(keys) + 1)


@pytest.mark.parametrize("preset", ["tp-decode-slow-shard", "mpi-ring-healthy"])
def test_window_piece_stats_equal_a_full_recompute(tmp_path, monkeypatch, preset):
    """The pieces of a read keep the previous piece's per-flow record statistics for the
    flows whose records did not change (WindowedTiming._piece_fstat): at every piece they
    are byte for byte analysis.flows.flow_event_stats over the whole window (the reference:
    the same function on the piece's Snapshot, as a fresh Context computes it), RDMA READs
    (mpi-ring: records reassigned to their data's flow) included; and the node's exported
    series are those of a full recompute per piece."""
    from skewscope import gen as skewgen
    from skewscope.analysis import flows as FL
    from skewscope.outputs import exptiming
    from skewscope.sources.offline import parse_file
    cap = skewgen.generate(preset, seed=0)
    ip = (cap.truth.get("pathologies") or [{}])[0].get("entities", {}).get("ips", [None])[0]
    p = tmp_path / "v.pcap"
    if ip is None:                    # a healthy preset: its first node
        from skewscope.analysis.context import context
        cap.write_pcap(str(p), snaplen=128)
        ip = context(parse_file(str(p))).nodes.ips[0]
    snap, ev, t, span, cuts = _node_view_in_thirds(cap, ip, p)
    real = exptiming.WindowedTiming._piece_fstat
    seen = {"kept": 0, "pieces": 0, "read": 0}

    def checked(self, ctx):
        kept = self._fst is not None
        got = real(self, ctx)
        f, op = ctx._records
        want = FL.flow_event_stats(ctx.snap, FL.flow_columns(ctx.flows), f, op)
        for a, b in zip(got, want):
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
        seen["pieces"] += 1
        seen["kept"] += kept
        seen["read"] += int((np.asarray(op) == L.OPC_READ_RESP).sum())
        return got

    def run(incremental):
        if incremental:
            monkeypatch.setattr(exptiming.WindowedTiming, "_piece_fstat", checked)
        else:
            monkeypatch.setattr(exptiming.WindowedTiming, "_piece_fstat",
                                lambda self, ctx: (setattr(self, "_fst", None), real(self, ctx))[1])
        acc = E.Accumulator(node_ip=ip, window_s=span / 8 / 1e9)
        for a, b in zip(cuts[:-1], cuts[1:]):
            acc.add(snap.flows, ev[(t >= a) & (t < b)], cum_flows=snap.flows)
        acc.add(snap.flows, ev[:0], cum_flows=snap.flows)
        monkeypatch.setattr(exptiming.WindowedTiming, "_piece_fstat", real)
        return [(s.name, k, repr(v)) for s, k, v in acc.timing.rows()]

    inc = run(True)
    assert seen["pieces"] > 5 and seen["kept"] >= seen["pieces"] // 2, seen
    assert (seen["read"] > 0) == (preset == "mpi-ring-healthy")
    assert inc == run(False) and any(not v.startswith("(") and int(v) > 0 for _, _, v in inc)


@pytest.mark.parametrize("seed", range(4))
def test_window_piece_stats_follow_records_in_and_out(seed, monkeypatch):
    """_piece_fstat on random reads in many pieces through a small window (records of
    flows that no later record refers to leave it, flows come and go, a read writes its
    flows' rows again: other request packets, another MTU): at every piece, the statistics
    carried from piece to piece and read to read are flow_event_stats' over the whole
    window, byte for byte."""
    from skewscope.analysis import flows as FL
    from skewscope.analysis.context import context
    from skewscope.outputs import exptiming
    rng = np.random.default_rng(seed)
    w = exptiming.WindowedTiming(exptiming.TimingAccumulator(max_nodes=0), window_s=8.0, max_records=40)
    real, seen = exptiming.per_node_timing, {"kept": 0, "pieces": 0}

    def checked(snap, *a, **k):
        ctx = context(snap)
        seen["kept"] += w._fst is not None
        seen["pieces"] += 1
        got = ctx._fstat
        want = FL.flow_event_stats(ctx.snap, FL.flow_columns(ctx.flows), *ctx._records)
        for x, y in zip(got, want):
            assert x.tobytes() == y.tobytes()
        return real(snap, *a, **k)

    monkeypatch.setattr(exptiming, "per_node_timing", checked)
    for delta, ev, cum in _window_stream(rng, 10):
        ev["bytes"] = rng.choice([64, 4096, 65536, 1 << 20], len(ev))
        ev["opclass"] = rng.choice([L.OPC_WRITE, L.OPC_SEND, L.OPC_WRITE, 2], len(ev))
        for t in (delta, cum):      # request packets (the MTU's pick) that change read to read
            t["op"][:, L.OPC_WRITE] = rng.integers(0, 600, len(t))
        first = seen["pieces"]
        w.add(delta, ev, cum_flows=cum)
        seen["carried"] = seen.get("carried", 0) + (seen["pieces"] > first and seen["kept"] > 0)
    assert seen["kept"] > seen["pieces"] // 2 and seen["carried"] > 5, seen
