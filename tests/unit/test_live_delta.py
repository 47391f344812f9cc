"""The live per-interval delta at speed (issue 30 part 3): match_rows (a hash join), take_rows
and flow_delta (rows kept first, counters subtracted in one numba pass) against references
written here per flow in plain Python, on randomized tables with new, evicted and re-created
flows and rows in any order."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from skewscope.core import layout as L
from skewscope.core import snapshot as S
from skewscope.core.rates import (counter_blocks, delta_rows, flow_rates, kept_cols, kept_rows, order_words,
                                  record_rows, row_columns, sorted_join)
from skewscope.sources import live
from skewscope.sources.live import COUNTER_FIELDS, flow_delta


def _dict_match(a, b):
    first = {}
    for i, r in enumerate(map(bytes, a)):
        first.setdefault(r, i)
    return np.array([first.get(bytes(r), -1) for r in b], dtype=np.int64)


@pytest.mark.parametrize("seed", [1, 2])
def test_match_rows_is_a_dict_lookup(seed):
    rng = np.random.default_rng(seed)
    a = np.unique(rng.integers(0, 4, (3000, 5)).astype(np.uint64), axis=0)   # few values: near rows
    a = a[rng.permutation(len(a))]
    b = np.concatenate([a[rng.integers(0, len(a), 2000)], rng.integers(0, 5, (500, 5)).astype(np.uint64)])
    got = S.match_rows(a, b)
    assert (got == _dict_match(a, b)).all()
    assert (got >= 0).sum() > 2000 and (got < 0).any()      # both outcomes exercised


def test_match_rows_exact_when_hashes_collide(monkeypatch):
    """Every row hashing alike: the join falls back to sorting the rows, same answer."""
    rng = np.random.default_rng(3)
    a = np.unique(rng.integers(0, 50, (400, 5)).astype(np.uint64), axis=0)
    b = np.concatenate([a[::3], rng.integers(50, 60, (20, 5)).astype(np.uint64)])
    monkeypatch.setattr(S, "_row_hash", lambda rows: np.zeros(len(rows), np.uint64))
    assert (S.match_rows(a, b) == _dict_match(a, b)).all()


def _table(rng, n):
    f = np.zeros(n, L.FLOW_DTYPE)
    f["src"][:, 15] = rng.integers(0, 8, n)
    f["dst"][:, 15] = rng.integers(0, 8, n)
    f["dest_qp"] = rng.permutation(n) + 1
    f["ipver"], f["roce"] = 4, 2
    for name in COUNTER_FIELDS:
        f[name] = rng.integers(0, 1 << 40, f[name].shape, dtype=np.uint64)
    f["first_ts"] = rng.integers(1, 100, n)
    f["last_ts"] = 1000
    f["sport"] = rng.integers(0, 1 << 16, n)
    return f


def test_take_rows_and_key_matrix_are_the_fieldwise_results():
    rng = np.random.default_rng(4)
    f = _table(rng, 500)
    idx = rng.integers(0, 500, 300)
    assert S.take_rows(f, idx).tobytes() == f[idx].tobytes()
    m = rng.random(500) < 0.3
    assert S.take_rows(f, m).tobytes() == f[m].tobytes()
    k = np.zeros(500, L.FLOW_KEY_DTYPE)
    for name in ("src", "dst", "dest_qp", "ipver", "roce"):
        k[name] = f[name]
    assert (S.flow_key_matrix(f) == k.view(np.uint8).reshape(500, -1)).all()
    assert (S.flow_key_matrix(f[::3]) == k.view(np.uint8).reshape(500, -1)[::3]).all()   # strided: by field


def test_delta_rows_is_take_rows_then_fieldwise_subtraction():
    rng = np.random.default_rng(5)
    p = _table(rng, 300)
    c = p.copy()
    for name in COUNTER_FIELDS:
        c[name] = c[name] + rng.integers(0, 1000, c[name].shape, dtype=np.uint64)
    c = c[rng.permutation(300)]
    keep = np.sort(rng.choice(300, 200, replace=False))
    rows = rng.integers(0, 300, 200)
    use = rng.random(200) < 0.7
    want = c[keep].copy()
    for name in COUNTER_FIELDS:
        want[name][use] -= p[name][rows[use]]
    got = delta_rows(c, p, rows, keep, use, counter_blocks(COUNTER_FIELDS))
    assert use.any() and not use.all()
    assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("blocks", [((38, 5), (94, 20), (258, 74)), ((38, 1),), ((40, 3), (94, 4), (300, 9)),
                                    ((0, 7), (94, 2), (834, 2)), ((2, 106),)])
def test_delta_rows_runs_of_any_length_are_the_bytewise_subtraction(blocks):
    """delta_rows' counter runs (four words a vector, the rest one by one; the bytes between
    runs copied): any run lengths and offsets, rows at every alignment, counters that wrap
    below zero -- the rows' bytes as numpy subtracts their little-endian words."""
    rng = np.random.default_rng(sum(o + w for o, w in blocks))
    p, c = (rng.integers(0, 256, (300, 850), dtype=np.uint8).view(L.FLOW_DTYPE).reshape(300) for _ in range(2))
    keep = np.sort(rng.choice(300, 200, replace=False))
    rows = rng.integers(0, 300, 200)
    use = rng.random(200) < 0.7
    want = c.view(np.uint8).reshape(300, 850)[keep].copy()
    pb = p.view(np.uint8).reshape(300, 850)[rows]
    for off, nw in blocks:
        w = want[use, off:off + 8 * nw].copy().view("<u8") - pb[use, off:off + 8 * nw].copy().view("<u8")
        want[use, off:off + 8 * nw] = w.view(np.uint8)
    got = delta_rows(c, p, rows, keep, use, blocks)
    assert got.view(np.uint8).reshape(200, 850).tobytes() == want.tobytes()
    assert (c["packets"][keep[use]] < p["packets"][rows[use]]).any()      # some words wrapped


def test_delta_rows_clamps_first_ts_and_writes_into_unused_pool_buffers():
    """delta_rows(since_ns=, pool=): the same rows with first_ts raised to since_ns; a result
    still referred to is never written again, one let go is (the pool's buffer comes back)."""
    from skewscope.core.pool import ArrayPool
    rng = np.random.default_rng(14)
    p = _table(rng, 400)
    c = p.copy()
    for name in COUNTER_FIELDS:
        c[name] = c[name] + rng.integers(0, 1000, c[name].shape, dtype=np.uint64)
    blocks = counter_blocks(COUNTER_FIELDS)
    pool = ArrayPool(L.FLOW_DTYPE)
    held = []
    for k in range(4):
        keep = np.sort(rng.choice(400, 250 - 20 * k, replace=False))
        rows = rng.integers(0, 400, len(keep))
        use = rng.random(len(keep)) < 0.6
        want = c[keep].copy()
        for name in COUNTER_FIELDS:
            want[name][use] -= p[name][rows[use]]
        want["first_ts"] = np.maximum(want["first_ts"], 50)
        got = delta_rows(c, p, rows, keep, use, blocks, since_ns=50, pool=pool)
        assert got.tobytes() == want.tobytes()
        if k < 2:
            held.append((got, want))        # still referred to: must survive the next calls
        del got
    for got, want in held:
        assert got.tobytes() == want.tobytes()
    assert pool.reused >= 1 and pool.allocated == 3
    assert (want["first_ts"] == 50).any() and (want["first_ts"] > 50).any()


class _AtOffset:
    """A pool whose take(n) hands out n FLOW_DTYPE rows starting `off` bytes past a 64-byte
    boundary of a larger buffer, guard bytes on both sides."""

    def __init__(self, off):
        self.off = off
        self.buf = None

    def take(self, n):
        self.buf = np.full(n * 850 + 256, 0xA5, np.uint8)
        start = (-self.buf.ctypes.data) % 64 + 64 + self.off
        self.start = start
        return self.buf[start:start + n * 850].view(L.FLOW_DTYPE)


@pytest.mark.parametrize("n", [1, 2, 3, 9, 10, 11, 19, 97, 1001])
def test_delta_rows_streamed_out_at_any_alignment_is_the_bytewise_result(n):
    """delta_rows makes its rows in a staging area and streams them out a 64-byte line at a
    time (non-temporal stores, aligned), the output's bytes before its first line boundary
    and after its last full line by ordinary stores: every row count (below, at and past the
    staging area's ~9.6 rows, many times it) at every output alignment gives numpy's bytes,
    and not a byte outside the output is written."""
    rng = np.random.default_rng(n)
    blocks = counter_blocks(COUNTER_FIELDS)
    m = n + 7
    p, c = (rng.integers(0, 256, (m, 850), dtype=np.uint8).view(L.FLOW_DTYPE).reshape(m) for _ in range(2))
    keep = np.sort(rng.choice(m, n, replace=False))
    rows = rng.integers(0, m, n)
    use = rng.random(n) < 0.7
    want = c[keep].copy()
    for name in COUNTER_FIELDS:
        want[name][use] -= p[name][rows[use]]
    want["first_ts"] = np.maximum(want["first_ts"], np.uint64(1 << 63))
    for off in range(64):
        pool = _AtOffset(off)
        got = delta_rows(c, p, rows, keep, use, blocks, since_ns=1 << 63, pool=pool)
        assert got.tobytes() == want.tobytes(), off
        b = pool.buf
        assert (b[:pool.start] == 0xA5).all() and (b[pool.start + n * 850:] == 0xA5).all(), off
    if n > 8:
        assert (want["first_ts"] == 1 << 63).any() and (want["first_ts"] > 1 << 63).any()


def _key_bytes(t):
    return [bytes(r) for r in S.flow_key_matrix(t)]


@pytest.mark.parametrize("seed", [15, 16])
def test_record_flows_is_a_dict_lookup_of_the_key_bytes(seed):
    """Each record's flow row: the row whose 40 key bytes (the C key: two zero pad bytes)
    equal the record's -- a Python dict of byte strings, the last row of equal keys winning
    (as match_rows); records of unknown flows and records whose pad bytes are not zero: -1.
    Flows in any order, keys that differ in one byte anywhere."""
    rng = np.random.default_rng(seed)
    f = _table(rng, 3000)
    f["dest_qp"] = rng.integers(0, 64, 3000)
    f["src"][:, rng.integers(0, 16, 3000)] ^= 1                # near keys, differing anywhere
    f["ipver"] = rng.choice([4, 6], 3000)
    f[2999] = f[17]                                           # a duplicate key: the last row wins
    f["packets"][2999] += 1
    ref = {}
    for i, k in enumerate(_key_bytes(f)):
        ref[k] = i
    r = np.zeros(5000, L.MSG_REC_DTYPE)
    pick = rng.integers(0, 3000, 5000)
    for name in ("src", "dst", "dest_qp", "ipver", "roce"):
        r["key"][name] = f[name][pick]
    r["key"]["dest_qp"][::7] += 64                             # unknown flows
    r["key"]["_pad"][3::11, 1] = 1                             # a pad byte set: not the C key of any flow
    rk = np.ascontiguousarray(r["key"]).view(np.uint8).reshape(5000, -1)[:, :40]
    want = np.array([ref.get(bytes(k), -1) for k in rk], np.int64)
    got = S.record_flows(f, r)
    assert (got == want).all()
    assert (want >= 0).sum() > 3000 and (want < 0).sum() > 500 and (got == 2999).any() and not (got == 17).any()
    ev = S.events_from_records(f, r)
    assert (np.sort(ev["flow"]) == np.sort(want.astype(np.int32))).all()
    assert (S.record_flows(f[:0], r) == -1).all() and S.record_flows(f, r[:0]).shape == (0,)
    assert (S.record_flows(f[::2], r) == S.match_rows(S.flow_key_words(f[::2]), _rec_words(r))).all()   # strided
    # sorted by key, keys distinct (a live read or delta): the records merged with the rows
    _, first = np.unique(S.flow_key_matrix(f), axis=0, return_index=True)
    fs = f[np.sort(first)]
    fs = fs[S._key_order(S.flow_key_matrix(fs))]
    ref = {k: i for i, k in enumerate(_key_bytes(fs))}
    want = np.array([ref.get(bytes(k), -1) for k in rk], np.int64)
    out = np.empty(len(r), np.int64)
    raw, rraw = fs.view(np.uint8).reshape(-1), r.view(np.uint8).reshape(-1)
    assert S._record_flows_merge(raw, fs.dtype.itemsize, S._KEY_PREFIX, rraw, r.dtype.itemsize,
                                 S._key_order(rk), out)
    assert (out == want).all() and (S.record_flows(fs, r) == want).all()
    assert (want >= 0).sum() > 3000 and (want < 0).sum() > 500


@pytest.mark.parametrize("seed", [22, 23])
def test_record_rows_are_the_dict_lookup_in_the_rows_kept(seed):
    """record_rows(words, keep, recs): each record's row of the table fs[keep] (a window: a
    read's rows kept) from fs's order_words -- a dict of that table's key bytes; unknown
    flows, flows of fs not kept, and records whose pad bytes are set: -1. Rows not strictly
    increasing (a duplicate key, or out of order): None (the caller's record_flows)."""
    rng = np.random.default_rng(seed)
    f = _table(rng, 3000)
    f["dest_qp"] = rng.integers(0, 64, 3000)
    f["src"][:, rng.integers(0, 16, 3000)] ^= 1
    f["ipver"] = rng.choice([4, 6], 3000)
    _, first = np.unique(S.flow_key_matrix(f), axis=0, return_index=True)
    fs = f[np.sort(first)]
    fs = fs[S._key_order(S.flow_key_matrix(fs))]
    keep = np.sort(rng.choice(len(fs), len(fs) // 2, replace=False))
    keep[0], keep[-1] = 0, len(fs) - 1                           # the first and last rows kept
    ref = {k: i for i, k in enumerate(_key_bytes(fs[keep]))}
    r = np.zeros(5000, L.MSG_REC_DTYPE)
    pick = rng.integers(0, len(fs), 5000)
    pick[[1, 2, 4, 5]] = [0, len(fs) - 1, keep[1], keep[1]]        # both ends, one flow twice
    for name in ("src", "dst", "dest_qp", "ipver", "roce"):
        r["key"][name] = fs[name][pick]
    r["key"]["dest_qp"][::7] += 64
    r["key"]["_pad"][3::11, 1] = 1
    rk = np.ascontiguousarray(r["key"]).view(np.uint8).reshape(5000, -1)[:, :40]
    want = np.array([ref.get(bytes(k), -1) for k in rk], np.int64)
    w = order_words(fs)
    got = record_rows(w, keep, r)
    assert (got == want).all() and (got == S.record_flows(fs[keep], r)).all()
    assert (want >= 0).sum() > 1500 and ((want < 0) & np.isin(pick, keep, invert=True)).sum() > 1000
    assert got[[1, 2, 4, 5]].tolist() == [0, len(keep) - 1, 1, 1]
    assert record_rows(w, keep, r[:0]).shape == (0,) and (record_rows(w, keep[:0], r) == -1).all()
    assert record_rows(w, keep[[0, 2, 1]], r) is None                # out of order
    assert record_rows(w, keep[[5, 5, 6]], r) is None                # a row twice: not strictly increasing
    dup = w.copy()
    dup[keep[-1]] = dup[keep[-2]]                                    # equal keys at the end, after every record
    assert record_rows(dup, keep, r[:100]) is None


def _rec_words(r):
    return np.ascontiguousarray(r["key"]).view(np.uint8).reshape(len(r), -1)[:, :40].copy().view("<u8")


def _words(t):
    return S.flow_key_matrix(t).view(">u8").astype(np.uint64)


def test_order_words_are_the_big_endian_key_words():
    f = _table(np.random.default_rng(12), 300)
    f["src"][:, :12] = np.random.default_rng(13).integers(0, 256, (300, 12))
    assert (order_words(f) == _words(f)).all() and order_words(f).dtype == np.uint64
    assert (order_words(f[::3]) == _words(f[::3])).all()                   # strided: the byte matrix
    assert order_words(f[:0]).shape == (0, 5)


def _reference_delta(prev, cur, since_ns):
    """Per flow, by key: counters minus the previous read's unless the flow is new or was
    re-created (packets went down or first_ts changed); only flows with packets in between."""
    old = {bytes(S.flow_key_matrix(prev[i:i + 1])[0]): prev[i] for i in range(len(prev))}
    rows = []
    for i in range(len(cur)):
        r = cur[i].copy()
        p = old.get(bytes(S.flow_key_matrix(cur[i:i + 1])[0]))
        if p is not None and not (r["packets"] < p["packets"] or r["first_ts"] != p["first_ts"]):
            for name in COUNTER_FIELDS:
                r[name] = r[name] - p[name]
        if r["packets"] > 0:
            r["first_ts"] = max(int(r["first_ts"]), since_ns)
            rows.append(r)
    return np.array(rows, dtype=L.FLOW_DTYPE)


@pytest.mark.parametrize("seed", [6, 7])
def test_flow_delta_matches_the_per_flow_reference(seed):
    rng = np.random.default_rng(seed)
    prev = _table(rng, 400)
    cur = prev.copy()
    grow = rng.random(400) < 0.6
    for name in COUNTER_FIELDS:
        cur[name][grow] += rng.integers(0, 50, cur[name][grow].shape, dtype=np.uint64)
    cur["packets"][grow] += 1
    recreated = rng.random(400) < 0.05               # evicted and back: fewer packets, or a new first_ts
    cur["packets"][recreated & (rng.random(400) < 0.5)] = 3
    cur["first_ts"][recreated] += 1000
    cur = cur[rng.random(400) > 0.05]                # evicted
    new = _table(rng, 30)
    new["dest_qp"] += 10_000
    cur = np.concatenate([cur, new])[rng.permutation(len(cur) + 30)]
    prev = prev[rng.permutation(400)]
    got = flow_delta(prev, cur, since_ns=50)
    want = _reference_delta(prev, cur, 50)
    assert len(got) == len(want) > 200
    assert got.tobytes() == want.tobytes()
    # sorted by key as the loader returns them: the merge join instead of the hash join
    prev_s, cur_s = (t[S._key_order(S.flow_key_matrix(t))] for t in (prev, cur))
    assert sorted_join(_words(prev_s), _words(cur_s)) is not None
    assert sorted_join(_words(prev), _words(cur)) is None
    assert flow_delta(prev_s, cur_s, since_ns=50).tobytes() == _reference_delta(prev_s, cur_s, 50).tobytes()
    assert flow_delta(None, cur).tobytes() == cur[cur["packets"] > 0].tobytes()


def _next(rng, prev, gone, t):
    """The read after prev, sorted by key: flows grown, some evicted (kept aside in gone),
    some re-created, some of the evicted back (with their old first_ts or a new one), new ones."""
    cur = prev.copy()
    grow = rng.random(len(cur)) < 0.5
    for name in COUNTER_FIELDS:
        cur[name][grow] += rng.integers(0, 50, cur[name][grow].shape, dtype=np.uint64)
    cur["packets"][grow] += 1
    rec = rng.random(len(cur)) < 0.03
    cur["packets"][rec & (rng.random(len(cur)) < 0.5)] = 2
    cur["first_ts"][rec] = t
    out = rng.random(len(cur)) < 0.05
    m = rng.random(len(gone)) < 0.5
    back, gone = gone[m], gone[~m]
    back["packets"] += rng.integers(0, 3, len(back)).astype(np.uint64)
    back["first_ts"][rng.random(len(back)) < 0.5] = t
    new = _table(rng, 10)
    new["dest_qp"] += 10_000 + 100 * (t // 1_000_000_000)
    gone = np.concatenate([gone, cur[out]])
    cur = np.concatenate([cur[~out], back, new])
    return cur[S._key_order(S.flow_key_matrix(cur))], gone


def _snap(flows, t, first):
    return S.Snapshot(flows, np.zeros(0, L.EVENT_DTYPE), np.zeros(L.G_N, np.uint64),
                      {"first_ts": first, "last_ts": t})


@pytest.mark.parametrize("seed,cols", [(17, False), (18, False), (17, True), (18, True)])
def test_interval_delta_one_pass_join_is_the_separate_passes(seed, cols):
    """interval_delta's one pass over two key-sorted reads (interval_join: words, join and
    kept rows together), its tables from pools read after read: the per-flow reference delta,
    order_words and join_flows of the same reads; earlier results still held stay as they
    were; reads out of key order take the hash join, same answer. cols: each read's
    packets/first_ts columns filled in the pass and read as the next read's prev_cols
    (instead of prev's rows: a wrong column would change the kept rows)."""
    from skewscope.core.pool import ArrayPool
    from skewscope.core.rates import WORDS_DTYPE, interval_join, join_flows
    rng = np.random.default_rng(seed)
    cur = _table(rng, 400)
    cur = cur[S._key_order(S.flow_key_matrix(cur))]
    gone = cur[:0]
    pool, wpool = ArrayPool(L.FLOW_DTYPE), ArrayPool(WORDS_DTYPE)
    prev, pw, held = cur, order_words(cur), []
    pc = row_columns(prev) if cols else None
    for i in range(6):
        t = (i + 2) * 1_000_000_000
        cur, gone = _next(rng, cur, gone, t)
        assert interval_join(prev, cur, pw) is not None
        c = np.zeros((len(cur), 2), np.uint64) if cols else None
        d, j, words = live.interval_delta(prev, cur, t - 1_000_000_000, pw, pool=pool, word_pool=wpool, cols=c,
                                          prev_cols=pc)
        if cols:
            assert (c == np.stack([cur["packets"], cur["first_ts"]], axis=1)).all()
            bad = pc.copy()
            bad[:, 1] += 1                     # every prev first_ts moved: all counted from zero
            d2 = live.interval_delta(prev, cur, t - 1_000_000_000, pw, prev_cols=bad)[0]
            assert d2.tobytes() == _reference_delta(prev[:0], cur, t - 1_000_000_000).tobytes() != d.tobytes()
            pc = c
        want = _reference_delta(prev, cur, t - 1_000_000_000)
        assert d.tobytes() == want.tobytes()
        assert (words == order_words(cur)).all() and (j == S.match_rows(pw, words)).all()
        assert (j >= 0).any() and (j < 0).any()
        if i % 2:
            held.append((d, want, words.copy(), words))
        prev, pw = cur, words
    for d, want, w0, w in held:
        assert d.tobytes() == want.tobytes() and (w == w0).all()
    assert pool.reused and wpool.reused
    shuf = prev[rng.permutation(len(prev))]                    # not sorted: no one-pass join
    assert interval_join(shuf, cur, order_words(shuf)) is None
    tail = prev.copy()
    tail["src"][-1, 0] = 0xFF                                  # the last row after all of cur's
    tail[[-2, -1]] = tail[[-1, -2]]                            # ... and out of order: seen after the merge
    assert interval_join(tail, cur, order_words(tail)) is None
    assert interval_join(prev, cur[::-1].copy(), pw) is None   # cur out of order
    assert interval_join(prev[[0, 0]], cur, pw[[0, 0]]) is None   # equal rows: not strictly increasing
    d, j, _ = live.interval_delta(shuf, cur, 5, order_words(shuf), pool=pool, word_pool=wpool)
    assert d.tobytes() == _reference_delta(shuf, cur, 5).tobytes()
    assert (j == join_flows(shuf, cur)).all()


@pytest.mark.parametrize("seed", [24, 25])
def test_read_events_from_the_reads_key_words_are_the_records_matched_to_the_delta(seed):
    """read_interval's events (sources.live.read_events: the records matched on the read's
    key words at the delta's rows) are each record's row of the delta by its 40 key bytes (a
    dict), -1 for flows without packets in the interval, unknown flows and records with a pad
    byte set, sorted by start_ts stably -- events_from_records(delta, recs) byte for byte;
    and without the rows (a read joined by hash) the same."""
    rng = np.random.default_rng(seed)
    prev = _table(rng, 600)
    prev = prev[S._key_order(S.flow_key_matrix(prev))]
    cur, _ = _next(rng, prev, prev[:0], 3_000_000_000)
    d, j, words, rows = live.interval_delta(prev, cur, 2_000_000_000, order_words(prev), with_rows=True)
    assert rows is not None and len(d) < len(cur)
    r = np.zeros(3000, L.MSG_REC_DTYPE)
    pick = rng.integers(0, len(cur), 3000)
    for name in ("src", "dst", "dest_qp", "ipver", "roce"):
        r["key"][name] = cur[name][pick]
    r["key"]["dest_qp"][::7] += 50_000                         # unknown flows
    r["key"]["_pad"][3::11, 1] = 1                             # not the C key of any flow
    r["start_ts"] = rng.integers(0, 1000, 3000)                # not in order: sorted stably
    r["bytes"] = np.arange(3000)
    ref = {k: i for i, k in enumerate(_key_bytes(d))}
    rk = np.ascontiguousarray(r["key"]).view(np.uint8).reshape(3000, -1)[:, :40]
    want = np.array([ref.get(bytes(k), -1) for k in rk], np.int64)
    order = np.argsort(r["start_ts"], kind="stable")
    got = live.read_events(d, r, words, rows)
    assert (got["flow"] == want[order]).all() and (got["bytes"] == r["bytes"][order]).all()
    assert got.tobytes() == S.events_from_records(d, r).tobytes()
    assert live.read_events(d, r, None, None).tobytes() == got.tobytes()
    assert live.read_events(d, r[:0], words, rows).shape == (0,)
    inactive = ~np.isin(np.arange(len(cur)), rows)
    assert (want >= 0).sum() > 1000 and inactive[pick[(want < 0)]].any()


def test_window_events_are_the_records_read_since_its_anchor(monkeypatch):
    """The window's events: the record batches read since its older anchor, the records that
    started at or after it, in start order, each on the window's row with its key (a dict of
    key bytes) -- one batch or several, all late or some early; matched on the read's key
    words (record_rows) when the read has them, and events_from_records' bytes."""
    merged = []
    monkeypatch.setattr(live, "record_rows", lambda *a: merged.append(record_rows(*a)) or merged[-1])
    rng = np.random.default_rng(19)
    w = live.Window(4.0)
    cur = _table(rng, 200)
    cur = cur[S._key_order(S.flow_key_matrix(cur))]
    prev = pw = None
    gone, batches, seen = cur[:0], [], set()
    for i in range(9):
        t = (i + 1) * 1_000_000_000
        if i:
            cur, gone = _next(rng, cur, gone, t)
        d, j, words = live.interval_delta(prev, cur, t - 1_000_000_000, pw)
        r = np.zeros(int(rng.integers(0, 60)), L.MSG_REC_DTYPE)
        pick = rng.integers(0, len(cur), len(r))
        for name in ("src", "dst", "dest_qp", "ipver", "roce"):
            r["key"][name] = cur[name][pick]
        r["start_ts"] = np.sort(t - rng.integers(1, 1_500_000_000, len(r)))   # some before the last read
        r["bytes"] = np.arange(len(r)) + 1000 * i
        iv = live.Interval(i, 0.0, 1.0, i + 1.0, _snap(d, t, t - 1_000_000_000), _snap(cur, t, 0), r, join=j,
                           words=words)
        w.add(iv)
        batches.append((t, r))
        ws = w.snapshot(iv)
        t0 = w._anchors[0][0]
        want = np.concatenate([b for tb, b in batches if tb >= t0])
        want = want[want["start_ts"] >= t0]
        want = want[np.argsort(want["start_ts"], kind="stable")]
        rows = {k: i for i, k in enumerate(_key_bytes(ws.flows))}
        keys = np.ascontiguousarray(want["key"]).view(np.uint8).reshape(len(want), -1)[:, :40]
        flow = [rows.get(bytes(k), -1) for k in keys]
        assert ws.events["start_ts"].tolist() == want["start_ts"].tolist()
        assert ws.events["bytes"].tolist() == want["bytes"].tolist() and ws.events["flow"].tolist() == flow
        assert ws.events.tobytes() == S.events_from_records(ws.flows, want).tobytes()
        seen.add((sum(tb >= t0 for tb, _ in batches), bool(len(want)) and len(want) < sum(
            (b["start_ts"] >= 0).sum() for tb, b in batches if tb >= t0)))
        prev, pw = cur, words
    assert {n for n, _ in seen} >= {1, 2} and any(early for _, early in seen)
    assert sum(m is not None for m in merged) >= 5


@pytest.mark.parametrize("seed,cols", [(8, False), (9, False), (8, True), (9, True)])
def test_window_follows_its_anchor_to_the_reference_delta(seed, cols, monkeypatch):
    """The window's delta against its anchor, from the anchors' joins carried read after read
    (Interval.join): the per-flow reference of that anchor and the latest read, with flows
    evicted and back in between (looked up in the anchor) and new ones. cols: the reads carry
    their packets/first_ts columns (Interval.cols, filled by interval_delta) and the window's
    kept test reads them instead of the rows."""
    calls = []
    monkeypatch.setattr(live, "kept_cols", lambda *a: calls.append(1) or kept_cols(*a))
    rng = np.random.default_rng(seed)
    w = live.Window(4.0)
    cur = _table(rng, 300)
    cur = cur[S._key_order(S.flow_key_matrix(cur))]
    prev = pw = None
    gone = cur[:0]
    followed = 0
    for i in range(9):
        t = (i + 1) * 1_000_000_000
        if i:
            cur, gone = _next(rng, cur, gone, t)
        c = np.full((len(cur), 2), 7, np.uint64) if cols else None
        d, j, words = live.interval_delta(prev, cur, t - 1_000_000_000, pw, cols=c)
        if cols:
            assert (c[:, 0] == cur["packets"]).all() and (c[:, 1] == cur["first_ts"]).all()
        iv = live.Interval(i, 0.0, 1.0, i + 1.0, _snap(d, t, t - 1_000_000_000), _snap(cur, t, 0),
                           np.zeros(0, L.MSG_REC_DTYPE), join=j, words=words, cols=c)
        w.add(iv)
        t0, anchor = w._anchors[0][0], w._anchors[0][1]
        followed += w._anchors[0][4] is not None and len(anchor) > 0 and t0 < t
        got = w.snapshot(iv).flows
        assert got.tobytes() == _reference_delta(anchor, cur, t0).tobytes()
        prev, pw = cur, words
    assert followed >= 4
    assert (len(calls) >= 4) if cols else not calls
    # a read the window did not see: the next one joins the whole table again, same result
    cur, gone = _next(rng, cur, gone, 11_000_000_000)
    skip = live.Interval(10, 0.0, 1.0, 11.0, _snap(cur[:0], 11_000_000_000, 0), _snap(cur, 11_000_000_000, 0),
                         np.zeros(0, L.MSG_REC_DTYPE), join=np.zeros(len(cur), np.int64), words=_words(cur))
    w.add(skip)
    assert w._anchors[0][4] is None
    assert w.snapshot(skip).flows.tobytes() == _reference_delta(w._anchors[0][1], cur, w._anchors[0][0]).tobytes()


def test_window_anchored_at_the_previous_read_is_the_interval_delta():
    """A window of twice the read interval re-anchors at every read: its delta is the read's
    own (taken, not made again), and so are its events when the read's records are the
    window's; both still the per-flow reference of anchor and read and the records since the
    anchor. A read whose delta does not start at the anchor (a skipped read), or with records
    from before the anchor, makes its own."""
    rng = np.random.default_rng(21)
    w = live.Window(2.0)
    cur = _table(rng, 300)
    cur = cur[S._key_order(S.flow_key_matrix(cur))]
    prev = pw = None
    gone, batches = cur[:0], []
    shared = shared_ev = 0
    for i in range(9):
        t = (i + 1) * 1_000_000_000
        if i:
            cur, gone = _next(rng, cur, gone, t)
        since = t - (2_000_000_000 if i == 5 else 1_000_000_000)      # read 5: its delta spans two reads
        d, j, words = live.interval_delta(prev, cur, since, pw)
        r = np.zeros(int(rng.integers(1, 60)), L.MSG_REC_DTYPE)
        pick = rng.integers(0, len(cur), len(r))
        for name in ("src", "dst", "dest_qp", "ipver", "roce"):
            r["key"][name] = cur[name][pick]
        early = 1_500_000_000 if i % 3 == 2 else 999_999_999          # some reads: records from before the anchor
        r["start_ts"] = np.sort(t - rng.integers(0, early, len(r)))
        if i % 4 == 1:
            r["start_ts"][-1] = t             # started at the read: in the next read's window too
        r["bytes"] = np.arange(len(r)) + 1000 * i
        ds = S.Snapshot(d, S.events_from_records(d, r), np.zeros(L.G_N, np.uint64),
                        {"first_ts": since, "last_ts": t})
        iv = live.Interval(i, 0.0, 1.0, i + 1.0, ds, _snap(cur, t, 0), r, join=j, words=words)
        w.add(iv)
        batches.append((t, r))
        t0, anchor = w._anchors[0][0], w._anchors[0][1]
        ws = w.snapshot(iv)
        ref = _reference_delta(anchor, cur, t0)
        want = np.concatenate([b for tb, b in batches if tb >= t0])
        want = want[want["start_ts"] >= t0]
        assert ws.flows.tobytes() == ref.tobytes()
        assert ws.events.tobytes() == S.events_from_records(ref, want).tobytes()
        shared += ws.flows is d
        shared_ev += ws.events is ds.events
        assert not (i == 5 and ws.flows is d)
        assert not (i % 3 == 2 and ws.events is ds.events and (r["start_ts"] < t0).any())
        prev, pw = cur, words
    assert shared >= 6 and 3 <= shared_ev < shared


@pytest.mark.parametrize("sample_n", [1, 4])
def test_flow_rates_one_pass_is_the_per_column_numpy(sample_n):
    """flow_rates' one numba pass: bit for bit the per-column numpy expressions of the
    definitions, and the header sums top shows."""
    rng = np.random.default_rng(10)
    f = _table(rng, 500)
    f["ecn_capable"][::7] = 0
    f["msg_hist"][::5] = 0
    f["msg_hist"][1::5] = 3                                   # ties: the first fullest slot
    dt, k = 0.7, float(sample_n)
    sums = {}
    got = flow_rates(f, dt, sample_n, sums=sums)
    ecn = f["ecn_capable"].astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        ce = np.where(ecn > 0, 100.0 * f["ce"].astype(np.float64) / np.maximum(ecn, 1), 0.0)
    h = f["msg_hist"]
    slot = np.argmax(h, axis=1)
    mode = np.where(h.max(axis=1) == 0, -1, np.where(slot == 0, 0, 1 << np.maximum(slot - 1, 0)))
    want = {"gbps": f["bytes"].astype(np.float64) * 8.0 / dt / 1e9 * k,
            "pps": f["packets"].astype(np.float64) / dt * k,
            "cnp_ps": f["cnp"].astype(np.float64) / dt * k, "ce_pct": ce,
            "retx": f["retransmissions"].astype(np.float64) * k,
            "naks": (f["nak_seq"] + f["nak_rnr"] + f["nak_other"]).astype(np.float64) * k, "msg_mode": mode}
    assert set(got) == set(want)
    for c in want:
        assert got[c].tobytes() == want[c].astype(got[c].dtype).tobytes(), c
    assert sums == {"bytes": int(f["bytes"].sum()), "ce": int(f["ce"].sum()), "ecn_capable": int(f["ecn_capable"].sum()),
                    "cnp": int(f["cnp"].sum()), "retransmissions": int(f["retransmissions"].sum()),
                    "naks": int((f["nak_seq"] + f["nak_rnr"] + f["nak_other"]).sum())}
    assert (mode == -1).any() and (mode > 0).any()
    assert flow_rates(f[:0], dt)["gbps"].shape == (0,)


def test_exporter_adds_flow_counters_per_peer_as_add_at():
    """outputs.exptables.add_flow_counters (one pass) = the (flows, NCOLS) matrix summed with
    np.add.at per peer, the rest (peer -1) into overflow, everything into totals."""
    from skewscope.outputs.exptables import GAP0, MSG0, NCOLS, SCALARS, add_flow_counters
    rng = np.random.default_rng(8)
    f = _table(rng, 2000)
    peer = rng.integers(-1, 40, 2000)
    m = np.empty((2000, NCOLS), np.uint64)
    for i, name in enumerate(SCALARS):
        m[:, i] = f[name]
    m[:, MSG0:GAP0], m[:, GAP0:] = f["msg_hist"], f["gap_hist"]
    want = np.zeros((40, NCOLS), np.uint64)
    np.add.at(want, peer[peer >= 0], m[peer >= 0])
    counts, over, tot = np.zeros((40, NCOLS), np.uint64), np.zeros(NCOLS, np.uint64), np.zeros(NCOLS, np.uint64)
    assert add_flow_counters(f, peer, counts, over, tot) is True
    assert (counts == want).all()
    assert (over == m[peer < 0].sum(axis=0, dtype=np.uint64)).all()
    assert (tot == m.sum(axis=0, dtype=np.uint64)).all()
    inside = peer >= 0
    assert add_flow_counters(f[inside], peer[inside], counts, over, tot) is False


def test_top_rows_partitioned_are_the_first_rows_of_the_full_sort():
    """topview._order(first=k): the first k rows of the full display order (numpy lexsort by
    the column, then Gb/s, then table order), ties at the cut included."""
    from skewscope.outputs.topview import _order
    rng = np.random.default_rng(9)
    for _ in range(50):
        n = int(rng.integers(1, 400))
        r = {"gbps": rng.integers(0, 5, n).astype(float), "pps": rng.integers(0, 4, n).astype(float),
             "ce_pct": rng.random(n) * (rng.random(n) < 0.3)}
        for sort in ("gbps", "pps", "ce_pct"):
            for desc in (True, False):
                full = np.lexsort((-r["gbps"], -r[sort] if desc else r[sort]))
                for k in (1, 7, 20, n, n + 5):
                    assert (_order(r, None, sort, desc, k)[:k] == full[:k]).all()


@pytest.mark.parametrize("n", [0, 1, 9, 3000])
def test_flows_from_raw_is_the_fieldwise_conversion_sorted_by_key(n):
    """The map read's conversion (key + value bytes -> FLOW_DTYPE rows in key order), copied
    as runs of bytes per row, against numpy's field-by-field copy of each field in key order
    (sorted here by Python's own byte-string order, not by the code under test)."""
    rng = np.random.default_rng(n)
    keys = rng.integers(0, 256, (n, L.FLOW_KEY_DTYPE.itemsize), dtype=np.uint8)
    vals = rng.integers(0, 256, (n, L.FLOW_STATS_DTYPE.itemsize), dtype=np.uint8)
    keys[: n // 2, :12] = 0                         # IPv4-mapped addresses share their first words
    order = sorted(range(n), key=lambda i: keys[i].tobytes())
    k = keys.view(L.FLOW_KEY_DTYPE).reshape(n)
    v = vals.view(L.FLOW_STATS_DTYPE).reshape(n)
    want = np.zeros(n, dtype=L.FLOW_DTYPE)
    for name in L.FLOW_DTYPE.names:
        want[name] = (k if name in L.FLOW_KEY_DTYPE.names else v)[name][order]
    assert S.flows_from_raw(keys, vals).tobytes() == want.tobytes()


def test_kept_cols_is_the_per_flow_kept_test():
    """kept_cols over the tables' packets/first_ts columns: the rows with packets since prev
    and whether each subtracts its match, as a per-flow loop decides them (matched, packets
    not down, first_ts unchanged: cur - prev; else from zero; kept when above the base),
    and the same as kept_rows reading the rows."""
    rng = np.random.default_rng(31)
    prev = _table(rng, 400)
    cur = prev[rng.permutation(400)[:350]].copy()
    j = np.array([int(np.nonzero(prev["dest_qp"] == q)[0][0]) for q in cur["dest_qp"]], np.int64)
    j[rng.random(350) < 0.1] = -1                                     # new flows
    grow = rng.integers(0, 3, 350).astype(np.uint64)                  # some without packets
    cur["packets"] = np.where(j >= 0, prev["packets"][j], 0) + grow
    down = rng.random(350) < 0.05                                     # re-created, fewer packets
    cur["packets"][down] = rng.integers(0, 5, down.sum())
    newer = rng.random(350) < 0.05                                    # re-created, newer first packet
    cur["first_ts"][newer] += 1
    want_k, want_s = [], []
    for i in range(350):
        r = int(j[i])
        s = r >= 0 and int(cur["packets"][i]) >= int(prev["packets"][r]) and \
            int(cur["first_ts"][i]) == int(prev["first_ts"][r])
        if int(cur["packets"][i]) > (int(prev["packets"][r]) if s else 0):
            want_k.append(i)
            want_s.append(s)
    keep, sub = kept_cols(j, row_columns(cur), row_columns(prev))
    assert keep.tolist() == want_k and sub.tolist() == want_s
    assert 0 < sum(want_s) < len(want_s) < 350
    k2, s2 = kept_rows(j, cur, prev)
    assert k2.tolist() == want_k and s2.tolist() == want_s


def test_the_shared_window_table_is_only_read():
    """A window anchored at the read before shares the read's delta table and events with the
    Interval (not copied). They are not marked read-only (numpy writeable=False): a read-only
    array is another numba type (core/jit.arg_key), so every kernel given it would miss the
    precompiled module and compile under numba. What the live commands run on the two instead
    -- top's rows and matrix, live_metrics, the exporter's Accumulator, the window snapshot
    again, the full analysis -- leaves both byte for byte as they were."""
    from skewscope.analysis import analyze, live_metrics
    from skewscope.outputs.exporter import Accumulator
    from skewscope.outputs.topmatrix import matrix_view
    from skewscope.outputs.topview import ViewState, build_model
    rng = np.random.default_rng(41)
    w = live.Window(2.0)
    cur = _table(rng, 300)
    cur["src"][:, 10:12] = 0xFF                          # IPv4-mapped addresses, as the loader's
    cur = cur[S._key_order(S.flow_key_matrix(cur))]
    prev = pw = None
    gone = cur[:0]
    acc = Accumulator(timing_nodes=0)
    shared = 0
    for i in range(4):
        t = (i + 1) * 1_000_000_000
        if i:
            cur, gone = _next(rng, cur, gone, t)
        d, j, words = live.interval_delta(prev, cur, t - 1_000_000_000, pw)
        r = np.zeros(40, L.MSG_REC_DTYPE)
        pick = rng.integers(0, len(cur), len(r))
        for name in ("src", "dst", "dest_qp", "ipver", "roce"):
            r["key"][name] = cur[name][pick]
        r["start_ts"] = np.sort(t - rng.integers(0, 999_999_999, len(r)))
        r["end_ts"] = r["start_ts"] + 5000
        r["bytes"], r["opclass"] = 65536, L.OPC_WRITE
        ds = S.Snapshot(d, S.events_from_records(d, r), np.zeros(L.G_N, np.uint64),
                        {"first_ts": t - 1_000_000_000, "last_ts": t, "duration_s": 1.0, "source": "live",
                         "clock": "monotonic", "sample_n": 1})
        iv = live.Interval(i, 0.0, 1.0, i + 1.0, ds, _snap(cur, t, 0), r, join=j, words=words)
        w.add(iv)
        ws = w.snapshot(iv)
        before = (d.tobytes(), ds.events.tobytes())
        build_model(ds, 1.0, ViewState(), iface="x", cum=iv.cum, limit=20)
        matrix_view(ws, 1.0)
        live_metrics(ws)
        acc.add(d, ds.events, cum_flows=cur)
        analyze(ws)
        assert w.snapshot(iv).flows.tobytes() == before[0]
        assert (d.tobytes(), ds.events.tobytes()) == before
        shared += ws.flows is d and ws.events is ds.events
        prev, pw = cur, words
    assert shared >= 2


@pytest.mark.parametrize("seed", [21, 22])
def test_interval_delta_rows_are_the_join_and_the_exporter_state_is_the_same(seed):
    """interval_delta(with_rows=True)'s fourth value, each delta row's row in the new read,
    is core.rates.join_flows(cur, delta) (the exporter's own join: what it reads instead),
    a read out of key order None; and an Accumulator fed those rows (live/export.py) ends in
    the state of one that joins the tables itself, read after read, with records."""
    from skewscope.core.rates import join_flows
    from skewscope.outputs.exporter import Accumulator
    rng = np.random.default_rng(seed)
    cur = _table(rng, 400)
    cur = cur[S._key_order(S.flow_key_matrix(cur))]
    gone = cur[:0]
    prev, pw = cur, order_words(cur)
    a, b = Accumulator(max_peers=16), Accumulator(max_peers=16)
    for i in range(5):
        t = (i + 2) * 1_000_000_000
        cur, gone = _next(rng, cur, gone, t)
        d, j, words, rows = live.interval_delta(prev, cur, t - 1_000_000_000, pw, with_rows=True)
        assert len(d) and (rows == join_flows(cur, d)).all()
        n = 300
        ev = np.zeros(n, L.EVENT_DTYPE)
        ev["flow"] = rng.integers(-1, len(d), n)
        ev["start_ts"] = t + np.sort(rng.integers(0, 900_000_000, n))
        ev["end_ts"] = ev["start_ts"] + rng.integers(0, 50_000, n)
        ev["bytes"] = rng.choice([64, 4096, 1 << 20], n)
        ev["opclass"] = L.OPC_WRITE
        a.add(d, ev, cum_flows=cur, cum_rows=rows)
        b.add(d, ev, cum_flows=cur)
        sa, sb = (x.state("n", np.zeros(L.G_N, np.uint64), {}, 5) for x in (a, b))
        for f in dataclasses.fields(sa):
            x, y = getattr(sa, f.name), getattr(sb, f.name)
            assert (x.tobytes() == y.tobytes()) if isinstance(x, np.ndarray) else repr(x) == repr(y), f.name
        assert sa.peer_timed.sum() > 0 and sa.peer_busy_ns.sum() > 0
        prev, pw = cur, words
    shuf = prev[rng.permutation(len(prev))]
    assert live.interval_delta(shuf, cur, 5, order_words(shuf), with_rows=True)[3] is None
