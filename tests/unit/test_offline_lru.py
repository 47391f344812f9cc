"""Offline parser: the bounded flow table and message-record list (issue 4), no root.

The kernel keeps flows in a BPF LRU hash of max_flows entries; the offline parser bounds
its table the same way and evicts the least recently used flow (exactly, one at a time;
the kernel's LRU is an approximation that frees in batches: docs/offline.md). Expected
survivors come from a plain Python LRU model (OrderedDict); evictions are counted the
kernel's way: flows_evicted = flows_created - flows present.
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest
from test_offline_formats import pcap_bytes, roce, write

from skewscope.core import layout as L
from skewscope.sources import offline

TEMPLATE = {op: roce(op, 1, 0, b"p" * 100, reth=100).frame for op in (0x06, 0x08, 0x0A)}


def frame(flow: int, op=0x0A, psn=0) -> bytes:
    """The template with source address 10.<flow>, destination QP = flow + 1."""
    f = bytearray(TEMPLATE[op])
    f[26:30] = bytes([10, (flow >> 16) & 0xFF, (flow >> 8) & 0xFF, flow & 0xFF])
    f[14 + 20 + 8 + 5:14 + 20 + 8 + 8] = (flow + 1).to_bytes(3, "big")
    f[14 + 20 + 8 + 9:14 + 20 + 8 + 12] = psn.to_bytes(3, "big")
    return bytes(f)


def model(seq, max_flows):
    """LRU model: returns (present {flow: packets}, created)."""
    lru, created = OrderedDict(), 0
    for fl in seq:
        if fl in lru:
            lru.move_to_end(fl)
            lru[fl] += 1
        else:
            if len(lru) >= max_flows:
                lru.popitem(last=False)
            lru[fl] = 1
            created += 1
    return dict(lru), created


def present(snap):
    return {int(q) - 1: int(p) for q, p in zip(snap.flows["dest_qp"], snap.flows["packets"])}


@pytest.mark.parametrize("pipeline", ["0", "1"])
@pytest.mark.parametrize("n_flows,max_flows", [(40, 16), (9000, 5000), (10000, 1 << 16), (3000, 2999)])
def test_eviction_follows_lru(tmp_path, monkeypatch, n_flows, max_flows, pipeline):
    """Both accountings -- the one-core scan and the pipelined one, whose lookups use a slot
    found rows ahead (scanner.account_rows) -- evict as the LRU model."""
    monkeypatch.setenv("SKEWSCOPE_OFFLINE_PIPELINE", pipeline)
    rng = np.random.default_rng(n_flows)
    # a hot set touched all the time + a long tail of flows touched once or twice
    hot = list(range(min(8, max_flows // 2)))
    seq = []
    for fl in range(n_flows):
        seq.append(fl)
        if fl % 3 == 0:
            seq.append(int(rng.choice(hot)))
        if fl % 7 == 0 and fl > 10:
            seq.append(fl - int(rng.integers(1, 10)))
    recs = [(i, frame(fl), 1200) for i, fl in enumerate(seq)]
    p = write(tmp_path / "f.pcap", pcap_bytes(recs))
    snap = offline.parse_file(p, max_flows=max_flows)
    want, created = model(seq, max_flows)
    assert present(snap) == want
    m = snap.meta
    assert m["flows_created"] == created == int(snap.globals[L.G_FLOWS_CREATED])
    assert m["flows_present"] == len(snap.flows) == min(max_flows, len(set(seq)))
    assert m["flows_evicted"] == created - len(snap.flows)
    assert int(snap.globals[L.G_ACCOUNTED]) == len(seq)   # eviction never loses a packet's category
    # message records of evicted flows point nowhere (-1); the others at their flow's row
    ev = snap.events
    assert len(ev) == len(seq)
    rows = {int(q) - 1: i for i, q in enumerate(snap.flows["dest_qp"])}
    exp = np.array([rows.get(fl, -1) for fl in seq], dtype=np.int32)   # records in capture order (ts = i)
    assert np.array_equal(ev["flow"], exp)


def test_eviction_mid_message_gives_partial(tmp_path):
    """A flow evicted between WRITE_FIRST and WRITE_LAST comes back without its message
    start: the LAST is a partial message (no record), as in the kernel."""
    seq = [(0, 0x06, 0)] + [(k, 0x0A, 0) for k in range(1, 5)] + [(0, 0x08, 1)]
    recs = [(i, frame(fl, op, psn), 1200) for i, (fl, op, psn) in enumerate(seq)]
    snap = offline.parse_file(write(tmp_path / "m.pcap", pcap_bytes(recs)), max_flows=4)
    assert int(snap.globals[L.G_MSG_PARTIAL]) == 1
    assert snap.meta["flows_created"] == 6 and snap.meta["flows_evicted"] == 2
    f0 = snap.flows[snap.flows["dest_qp"] == 1][0]
    assert int(f0["packets"]) == 1 and int(f0["messages"]) == 0


def test_max_flows_validation(tmp_path):
    p = write(tmp_path / "x.pcap", pcap_bytes([(1, frame(1), 1200)]))
    for bad in (0, -1, 1 << 25, 2.5, True, "16"):
        with pytest.raises(ValueError):
            offline.parse_file(p, max_flows=bad)
    assert len(offline.parse_file(p, max_flows=1).flows) == 1


def test_message_records_bounded(tmp_path):
    """max_events bounds the message records kept (the first ones, in capture order); the
    others are counted in meta['events_lost'] with a warning; counters are complete."""
    seq = [(i % 5, 0x0A, i // 5) for i in range(40)]
    recs = [(i, frame(fl, op, psn), 1200) for i, (fl, op, psn) in enumerate(seq)]
    p = write(tmp_path / "e.pcap", pcap_bytes(recs))
    full = offline.parse_file(p)
    part = offline.parse_file(p, max_events=7)
    assert len(full.events) == 40 and full.meta["events_lost"] == 0
    assert len(part.events) == 7 and part.meta["events_lost"] == 33
    assert np.array_equal(part.events, full.events[:7])
    assert any("33 more not kept" in w for w in part.meta["warnings"])
    for n in full.flows.dtype.names:
        assert np.array_equal(part.flows[n], full.flows[n])
    assert len(offline.parse_file(p, max_events=0).events) == 0
    with pytest.raises(ValueError):
        offline.parse_file(p, max_events=-1)


def _accounted(path, max_flows: int, list_from_start: bool, rows: bool):
    """The tables after accounting the pcap at `path` (ns timestamps): through the one-core
    scan, or (rows) through scan_rows + the pipeline's account_block. list_from_start: keep the
    LRU list from the first packet (ST_LRU set up front), as before the list was deferred."""
    from skewscope.sources.offline import kernel as K
    from skewscope.sources.offline import pipeline
    from skewscope.sources.offline.tables import _NO_IF, _OPTAB, _Tables
    b = np.fromfile(path, np.uint8)
    t = _Tables(max_flows)
    if list_from_start:
        t.st[K.ST_LRU] = 1
    walk = (K.FMT_PCAP, False, 1, K.K_ETHERNET, _NO_IF, _NO_IF, _NO_IF, 0)
    if rows:
        g, st = np.zeros(L.G_N, np.int64), np.zeros(K.ST_N, np.int64)
        block = np.empty((len(b) // 60, K.R_N), np.int64)
        pos, status, n = K.scan_rows(b, 24, len(b), *walk, g, st, block, 0, _OPTAB)
        assert int(pos) == len(b)
        pipeline.account_block(t, block, int(n))
    else:
        pos = 24
        while True:
            pos, status = K.scan(b, pos, len(b), *walk, *t.args())
            if status != K.S_GROW:
                break
            t.grow()
        assert int(pos) == len(b)
    return t


@pytest.mark.parametrize("rows", [False, True])
@pytest.mark.parametrize("n_flows,max_flows", [(3000, 100), (600, 599), (5, 1), (300, 1 << 16)])
def test_deferred_lru_list_is_the_kept_one(tmp_path, n_flows, max_flows, rows):
    """The LRU list is kept only from the first eviction on, built then from each slot's last
    use (accounting.lru_build): every table -- flows, counters, last uses, instances, message
    records, and the list itself with its ends once there were evictions -- is the one of the
    list kept from the first packet, in both accountings."""
    from skewscope.sources.offline import kernel as K
    rng = np.random.default_rng(n_flows + max_flows)
    seq = [int(x) for x in rng.integers(0, n_flows, 6 * n_flows)] + list(range(n_flows))
    seq += [int(x) for x in rng.integers(0, min(n_flows, 2 * max_flows), 2 * n_flows)]
    recs = [(i, frame(fl, op=(0x06, 0x08, 0x0A)[i % 3], psn=i & 0xFFFFFF), 1200) for i, fl in enumerate(seq)]
    p = write(tmp_path / "lru.pcap", pcap_bytes(recs))
    a = _accounted(p, max_flows, False, rows)
    b = _accounted(p, max_flows, True, rows)
    evicted = int(a.g[L.G_FLOWS_CREATED]) > int(a.st[K.ST_NUSED])
    assert evicted == (len(set(seq)) > max_flows)
    assert int(a.st[K.ST_LRU]) == int(evicted) and int(b.st[K.ST_LRU]) == 1
    n = int(a.st[K.ST_NUSED])
    assert np.array_equal(a.g, b.g)
    for name in ("S", "keys", "fhash", "finst"):
        assert np.array_equal(getattr(a, name)[:n], getattr(b, name)[:n]), name
    assert np.array_equal(a.ikeys[:int(a.st[K.ST_INSTN])], b.ikeys[:int(b.st[K.ST_INSTN])])
    assert np.array_equal(a.ev[:int(a.st[K.ST_EVN])], b.ev[:int(b.st[K.ST_EVN])])
    same = [i for i in range(K.ST_N) if i not in (K.ST_HEAD, K.ST_TAIL, K.ST_LRU)]
    assert np.array_equal(a.st[same], b.st[same])
    if evicted:
        assert a.st[K.ST_HEAD] == b.st[K.ST_HEAD] and a.st[K.ST_TAIL] == b.st[K.ST_TAIL]
        assert np.array_equal(a.lprev[:n], b.lprev[:n]) and np.array_equal(a.lnext[:n], b.lnext[:n])
    else:   # nothing kept the list: it is still empty
        assert a.st[K.ST_HEAD] == -1 and a.st[K.ST_TAIL] == -1 and (a.lprev[:n] == -1).all()
    # the most recently used flow is the head, the least recently used the tail
    last = {fl: i for i, fl in enumerate(seq)}
    qp = a.keys[:n, 4] & 0xFFFFFF
    assert int(a.S[:n, K.C_LRU].argmax()) == int(np.flatnonzero(qp == seq[-1] + 1)[0])
    if evicted:
        assert int(qp[a.st[K.ST_TAIL]]) - 1 == min((fl for fl in set(seq) if (qp == fl + 1).any()), key=last.get)
