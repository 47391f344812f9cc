"""The exporter's per-read work (issue 30): the live window without a node (no --node-ip,
no node to go through one by one: `export -i`'s Accumulator(timing_nodes=0)) is tested for
a node that could be inferred (exptables.no_common_end) before the analysis, and where none
can be, the analysis is not run -- it would find none (nodeview.infer_node) and export
nothing; the per-read helpers (the records' byte copies, the column gathers, the window's
one-pass key match, busy time without a sort by key) against numpy and the code they
replace; a live stream (evictions, returning and re-created flows, node changes, records
out of order) read by read against the reference paths. Ground truth: nodeview.infer_node
on the same tables, numpy, union_kernel over records sorted by key, and the /metrics text
of the same reads through the from-scratch paths."""
from __future__ import annotations

import numpy as np
import pytest

from skewscope.analysis.context import context
from skewscope.analysis.flows import CTS_MAX_BYTES
from skewscope.analysis.nodeview import infer_node
from skewscope.core import layout as L
from skewscope.core.snapshot import Snapshot, ip_bytes
from skewscope.outputs import exporter as E
from skewscope.outputs import exptiming
from skewscope.outputs.exptables import no_common_end

ADDRS = ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]


def random_table(rng):
    """Flows between a few addresses with random opclass counters (WRITE, SEND, READ
    requests and responses, ACK, CNP), message sizes around a CTS's bound, some on QP 1;
    records of random flows and opclasses (READ requests among them)."""
    n = int(rng.integers(1, 14))
    fl = np.zeros(n, L.FLOW_DTYPE)
    k = int(rng.integers(2, len(ADDRS) + 1))
    for i in range(n):
        a, b = rng.choice(k, 2, replace=False)
        fl["src"][i] = np.frombuffer(ip_bytes(ADDRS[a])[0], np.uint8)
        fl["dst"][i] = np.frombuffer(ip_bytes(ADDRS[b])[0], np.uint8)
    fl["ipver"], fl["roce"] = 4, 2
    fl["dest_qp"] = rng.choice([1, 0x100, 0x101, 0x102], n, p=[0.1, 0.3, 0.3, 0.3])
    for o in (L.OPC_SEND, L.OPC_WRITE, L.OPC_READ_REQ, L.OPC_READ_RESP, L.OPC_ACK, L.OPC_CNP):
        fl["op"][:, o] = rng.integers(0, 5, n) * (rng.random(n) < 0.4)
    fl["messages"] = rng.integers(0, 4, n)
    mean = rng.choice([64, CTS_MAX_BYTES, CTS_MAX_BYTES + 1, 4096, 1 << 20], n)
    fl["msg_bytes"] = fl["messages"] * mean
    fl["payload_bytes"] = fl["msg_bytes"] * (rng.random(n) < 0.8)
    fl["packets"] = fl["op"].sum(axis=1)
    fl["bytes"] = fl["packets"] * 100
    slot = np.minimum(63, np.floor(np.log2(np.maximum(mean, 1))).astype(int) + 1)
    fl["msg_hist"][np.arange(n), np.minimum(slot, L.MSG_SLOTS - 1)] = fl["messages"]
    m = int(rng.integers(0, 20))
    ev = np.zeros(m, L.EVENT_DTYPE)
    ev["flow"] = rng.integers(-1, n, m)
    ev["opclass"] = rng.choice([L.OPC_WRITE, L.OPC_SEND, L.OPC_READ_REQ], m)
    st = np.sort(rng.integers(0, 1_000_000, m))
    ev["start_ts"], ev["end_ts"] = st, st + 1000
    ev["bytes"] = rng.choice([64, 4096, 1 << 20], m)
    return Snapshot(fl, ev, np.zeros(L.G_N, np.uint64), {})


def test_no_common_end_means_no_node_is_inferred():
    """Where no_common_end says so, the analysis infers no node, on any table (data flows,
    CTS, READs judged by their records, management QP, ACK/CNP-only flows); and it says so
    on tables where the node cannot be inferred often enough to matter."""
    rng = np.random.default_rng(3)
    shown = none = 0
    for _ in range(3000):
        snap = random_table(rng)
        got = no_common_end(snap.flows)
        node = infer_node(context(snap))
        if got:
            assert node is None
            shown += 1
        none += node is None
    assert shown > 60 and none > shown
    assert not no_common_end(np.zeros(0, L.FLOW_DTYPE))


def _reads(tmp_path):
    """A stream of reads whose window's node can be inferred, then cannot (a mirror's read:
    every node's flows), then can again (the mirror's flows left the window): a DPU view
    (node ip) of a generated job in sixths, a quiet read after the second, the whole job's
    records in the third."""
    from skewscope import gen as skewgen
    from skewscope.sources.offline import parse_file
    cap = skewgen.generate("tp-decode-slow-shard", seed=0)
    ip = cap.truth["pathologies"][0]["entities"]["ips"][0]
    cap.write_pcap(str(tmp_path / "all.pcap"), snaplen=128)
    cap.view(ip).write_pcap(str(tmp_path / "v.pcap"), snaplen=128)
    whole, view = parse_file(str(tmp_path / "all.pcap")), parse_file(str(tmp_path / "v.pcap"))
    t = view.events["start_ts"].astype(np.int64)
    span = int(t.max() - t.min())
    cuts = [int(t.min()) + span * k // 6 for k in range(7)]
    cuts[-1] += 1
    out = []
    for k, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])):
        src = whole if k == 2 else view
        tt = src.events["start_ts"].astype(np.int64)
        out.append((src.flows, src.events[(tt >= a) & (tt < b)]))
        if k == 1:
            out.append((view.flows, view.events[:0]))   # a quiet read: the window exports (flush)
    return out, span


def test_node_less_window_exports_what_the_analysis_of_every_piece_does(tmp_path, monkeypatch):
    """Accumulator(timing_nodes=0) without --node-ip over reads whose node can be inferred,
    then cannot, then can again: the timing series and the /metrics text are those of the
    same reads with every piece analysed (the test disabled), the test skipped pieces, and
    the node's series are there."""
    from skewscope.outputs import expose as X
    reads, span = _reads(tmp_path)
    real = exptiming.no_common_end

    def run(test_on):
        skipped = []
        if test_on:
            monkeypatch.setattr(exptiming, "no_common_end", lambda f: skipped.append(real(f)) or skipped[-1])
        else:
            monkeypatch.setattr(exptiming, "no_common_end", lambda f: False)
        acc = E.Accumulator(timing_nodes=0, window_s=span / 12 / 1e9)
        st = [None]
        reg = X.make_registry(X.SkewscopeCollector(lambda: st[0]), process_metrics=False)
        texts = []
        for flows, ev in reads + [(reads[-1][0], reads[-1][1][:0])]:
            acc.add(flows, ev, cum_flows=flows)
            st[0] = acc.state("n", np.zeros(L.G_N, np.uint64), {}, 5, read_ts=1.0)
            texts.append(reg.exposition())
        monkeypatch.setattr(exptiming, "no_common_end", real)
        return [(s.name, k, repr(v)) for s, k, v in acc.timing.rows()], texts, skipped

    rows, texts, skipped = run(True)
    want_rows, want_texts, _ = run(False)
    assert rows == want_rows and texts == want_texts
    assert any(skipped) and not all(skipped)          # the mirror's read skipped, the DPU's not
    assert any(name.startswith("skewscope_node_") for name, _, _ in rows)


# ---- the per-read helpers against numpy / the code they replace ---------------------------------
def test_record_bytes_helpers_equal_numpy():
    """rec_copy / rec_concat / rec_take (the records' bytes) = numpy's copy, concatenate and
    take of the structured records, empty and non-contiguous inputs included."""
    from skewscope.outputs.exptables import rec_concat, rec_copy, rec_take
    rng = np.random.default_rng(5)
    for n, m in ((0, 0), (0, 3), (5, 0), (40, 17)):
        a, b = np.zeros(n, L.EVENT_DTYPE), np.zeros(m, L.EVENT_DTYPE)
        for x in (a, b):
            for name in x.dtype.names:
                x[name] = rng.integers(-5 if name == "flow" else 0, 1 << 30, len(x))
        for got, want in ((rec_copy(a), a.copy()), (rec_concat(a, b), np.concatenate([a, b])),
                          (rec_concat(a[::2], b), np.concatenate([a[::2], b])),
                          (rec_take(b, rng.permutation(m)[: m // 2]), None)):
            if want is None:
                continue
            assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
        idx = rng.integers(0, max(n, 1), 9) if n else np.zeros(0, np.int64)
        assert rec_take(a, idx).tobytes() == a[idx].tobytes()
        c = rec_copy(a)
        if n:
            c["flow"][0] += 1
            assert a["flow"][0] != c["flow"][0]        # a copy, not a view


def _flows(rng, n):
    f = np.zeros(n, L.FLOW_DTYPE)
    raw = f.view(np.uint8).reshape(n, -1)
    raw[:] = rng.integers(0, 256, raw.shape, dtype=np.uint8)
    return f


def test_take_col_and_neg_bytes_equal_numpy():
    from skewscope.outputs.exptables import neg_bytes, take_col
    rng = np.random.default_rng(6)
    f = _flows(rng, 500)
    f["bytes"][:3] = [0, 1 << 63, (1 << 64) - 1]        # int64 wraps as numpy's astype does
    rows = np.sort(rng.choice(500, 120, replace=False))
    for name in ("op", "msg_hist", "bytes", "packets"):
        got, want = take_col(f, name, rows), f[name][rows]
        assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want)
    assert take_col(f, "op", rows[:0]).shape == (0, L.N_OPCLASS)
    with np.errstate(over="ignore"):
        assert np.array_equal(neg_bytes(f), -f["bytes"].astype(np.int64))
        assert np.array_equal(neg_bytes(f[::3]), -f["bytes"][::3].astype(np.int64))
    assert neg_bytes(f[:0]).shape == (0,)


def test_match_key_rows_equals_flow_key_words_and_match_rows():
    """The window's one-pass key match = flow_key_words of the rows and match_rows against
    the window's keys (found, not found, an empty window)."""
    from skewscope.core.snapshot import flow_key_words, match_rows, take_rows
    from skewscope.outputs.exptables import match_key_rows
    rng = np.random.default_rng(7)
    f = _flows(rng, 300)
    f["ipver"] = rng.choice([4, 6], 300)
    words = flow_key_words(f)
    for table in (words[:0], words[rng.choice(300, 80, replace=False)],
                  np.concatenate([words[:50], words[:10] + np.uint64(1)])):
        rows = np.sort(rng.choice(300, 100, replace=False))
        keys, j = match_key_rows(f, rows, table)
        assert np.array_equal(keys, flow_key_words(take_rows(f, rows)))
        want = match_rows(table, keys) if len(table) else np.full(len(rows), -1)
        assert np.array_equal(j, want) and (len(table) == 0 or (j >= 0).any())


def _busy_by_key_sort(events, key, nkeys, carry, pkt):
    """The busy time as the exporter made it before (records of a flow, by a stable sort by
    key, or lexsort by (start, key)), from union_kernel."""
    from skewscope.analysis.intervals import union_kernel
    busy = np.zeros(nkeys, np.int64)
    carry = carry.copy()
    ev = events[events["flow"] >= 0]
    p = key[ev["flow"]].astype(np.int64)
    s = ev["start_ts"].astype(np.int64)
    e = np.maximum(ev["end_ts"].astype(np.int64), s) + np.nan_to_num(pkt[ev["flow"]], nan=0.0).astype(np.int64)
    order = np.lexsort((s, p))
    z = np.zeros(nkeys, np.int64)
    union_kernel(p[order], s[order], e[order], carry, busy, z, z.copy())
    return busy, carry


@pytest.mark.parametrize("sort", [True, False])
def test_busy_without_a_sort_by_key_equals_the_sorted_union(sort):
    """busy_of over records in start order (as they are) or not (a stable sort by start):
    the busy time and carry of the records sorted by key, flows without a key (-1) and
    records without a flow (-1) skipped, NaN packet times as 0."""
    from skewscope.outputs.exptables import busy_ns_per_peer, busy_of, record_times
    rng = np.random.default_rng(8 + sort)
    for _ in range(50):
        n, nf, nk = int(rng.integers(0, 60)), int(rng.integers(1, 12)), int(rng.integers(1, 5))
        ev = np.zeros(n, L.EVENT_DTYPE)
        ev["flow"] = rng.integers(-1, nf, n)
        st = rng.integers(0, 10_000, n)
        ev["start_ts"] = np.sort(st) if sort else st
        ev["end_ts"] = ev["start_ts"] + rng.integers(-50, 800, n).clip(0)
        key = rng.integers(-1, nk, nf)
        pkt = rng.choice([0.0, 3.0, 40.5, np.nan], nf)
        carry = rng.integers(0, 3_000, nk)
        want = _busy_by_key_sort(ev, key, nk, carry, pkt)
        got = busy_ns_per_peer(ev, key, nk, carry, pkt_ns=pkt)
        f = ev["flow"].astype(np.int64)
        per_rec = np.where(f >= 0, pkt[np.maximum(f, 0)], 0.0)
        got2 = busy_of(record_times(ev, per_rec), key, nk, carry)
        for g in (got, got2):
            assert np.array_equal(g[0], want[0]) and np.array_equal(g[1], want[1])


# ---- a live stream: the exporter read by read against its reference paths ------------------------
def _live_stream(rng, reads=7):
    """Reads of a cumulative flow table as the live session makes them (sources.live's
    interval_delta: the delta, each delta row's cumulative row, the join to the previous
    read): flows of a 6-node job, of node 0's flows only in the first reads (a DPU's view,
    the node inferable), every node's later (a mirror's), flows evicted, returning and
    re-created (counters from zero), records of absent flows, records out of start order."""
    from skewscope.core.snapshot import _key_order, events_from_records, flow_key_matrix
    from skewscope.sources.live import interval_delta
    ips = [f"10.1.0.{i}" for i in range(6)]
    keys = [(a, b, 0x100 + q) for a in range(6) for b in range(6) if a != b for q in range(2)]
    m = np.zeros(len(keys), L.FLOW_DTYPE)
    for i, (a, b, q) in enumerate(keys):
        m["src"][i] = np.frombuffer(ip_bytes(ips[a])[0], np.uint8)
        m["dst"][i] = np.frombuffer(ip_bytes(ips[b])[0], np.uint8)
        m["dest_qp"][i] = q
        m["sport"][i] = 0xC000 + i // 2
    m["ipver"], m["roce"] = 4, 2
    m = m[_key_order(flow_key_matrix(m))]
    own = (m["src"][:, 15] == 0) | (m["dst"][:, 15] == 0)
    size = np.where(rng.random(len(m)) < 0.7, 1 << 20, 64)
    prev = prev_w = None
    out, t = [], 1_000_000_000
    for k in range(reads):
        grow = rng.integers(0, 4, len(m)).astype(np.uint64)
        reset = rng.random(len(m)) < 0.05          # re-created (by a packet): counters from zero
        grow[reset] = np.maximum(grow[reset], 1)
        m["messages"] += grow
        m["msg_bytes"] += grow * size.astype(np.uint64)
        m["payload_bytes"] += grow * size.astype(np.uint64)
        m["op"][:, L.OPC_WRITE] += grow * 3
        m["packets"] += grow * 3
        m["bytes"] += grow * 3 * np.uint64(1100)
        m["msg_hist"][:, 17] += grow
        m["first_ts"] = np.where(m["first_ts"] == 0, t, m["first_ts"])
        m["last_ts"] = t
        for name in ("messages", "msg_bytes", "payload_bytes", "packets", "bytes"):
            m[name][reset] = grow[reset] * (3 if name == "packets" else 1)
        m["first_ts"][reset] = t
        present = (own if k < 3 else np.ones(len(m), bool)) & (rng.random(len(m)) > 0.1)
        cur = np.ascontiguousarray(m[present])
        if prev is None:
            d, j, w = interval_delta(None, cur, 0)
            rows = None
        else:
            d, j, w, rows = interval_delta(prev, cur, t - 1, prev_w, with_rows=True)
        pick = np.flatnonzero((grow > 0) & (size > 64) & (present | (rng.random(len(m)) < 0.1)))
        recs = np.zeros(min(len(pick) * 3, 300), L.MSG_REC_DTYPE)
        r = pick[rng.integers(0, len(pick), len(recs))] if len(pick) else np.zeros(0, np.int64)
        for name in ("src", "dst", "dest_qp", "ipver", "roce"):
            recs["key"][name] = m[name][r]
        st = t + np.sort(rng.integers(0, 900_000_000, len(recs)))
        recs["start_ts"], recs["end_ts"], recs["bytes"] = st, st + 40_000, 1 << 20
        recs["opclass"], recs["seq"] = L.OPC_WRITE, np.arange(len(recs)) + 1
        ev = events_from_records(d, recs)
        if k % 3 == 2:
            ev = ev[rng.permutation(len(ev))]
        out.append((d, ev, cur, rows, j))
        prev, prev_w, t = cur, w, t + 1_000_000_000
    return out


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("node", [None, "10.1.0.0"])
def test_live_reads_equal_the_reference_paths(seed, node, monkeypatch):
    """An Accumulator fed live reads (delta rows, joins: the carried RowCache, the window's
    one-pass key match, busy time without a sort by key, the no-node test, the records'
    byte copies) exports, read by read, the /metrics text of one fed the same reads through
    the reference paths: no joins (each read's rows found from scratch), the window's keys
    by flow_key_words + match_rows, every piece analysed, numpy's record copies."""
    from skewscope.outputs import expose as X
    from skewscope.outputs import exptables
    reads = _live_stream(np.random.default_rng(seed))

    def run(reference):
        if reference:
            monkeypatch.setattr(exptiming, "match_key_rows", lambda *a: None)
            monkeypatch.setattr(exptiming, "no_common_end", lambda f: False)
            monkeypatch.setattr(exptiming, "rec_copy", lambda a: a.copy())
            monkeypatch.setattr(exptiming, "rec_concat", lambda a, b: np.concatenate([a, b]))
            monkeypatch.setattr(exptiming, "rec_take", lambda a, i: a[i])
            monkeypatch.setattr(exptables, "take_col", lambda t, name, rows: t[name][rows])
        acc = E.Accumulator(timing_nodes=0, node_ip=node, window_s=3.0)
        st = [None]
        reg = X.make_registry(X.SkewscopeCollector(lambda: st[0]), process_metrics=False)
        texts = []
        for d, ev, cur, rows, j in reads:
            if reference:
                acc.add(d, ev, cum_flows=cur)
            else:
                acc.add(d, ev, cum_flows=cur, cum_rows=rows, cum_join=j)
            st[0] = acc.state("n", np.zeros(L.G_N, np.uint64), {}, 5, read_ts=1.0)
            texts.append(reg.exposition())
        monkeypatch.undo()
        return texts

    got, want = run(False), run(True)
    assert len(got) == len(reads) and got == want
