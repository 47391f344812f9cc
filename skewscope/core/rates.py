"""The live per-interval rates of a flow table (`top`'s columns): bit/s, packets/s, CNP/s,
CE%, retransmits, NAKs and the most frequent message size, from an interval's counter
differences (sources/live.py flow_delta, whose row-wise copy and subtraction is `delta_rows`
here). The analysis' rates over a flow's active time are analysis/flows.py flow_event_stats."""
from __future__ import annotations

import numpy as np

from skewscope.core import layout as L
from skewscope.core.jit import (intrinsic, load_u64, njit, prefetch, prefetch_span, prefetch_span_l2, store_u64,
                                 stream_fence, stream_lines)
from skewscope.core.snapshot import (_KEY_PREFIX, _copy_bytes, _key_order, bswap64, flow_key_matrix, key_word,
                                     match_rows)


def counter_blocks(names) -> tuple:
    """The counter fields `names` of FLOW_DTYPE as runs of adjacent u64 words:
    ((byte offset, words), ...) -- three runs for the flow table's 25 counter fields."""
    runs: list[list[int]] = []
    for name in sorted(names, key=lambda n: L.FLOW_DTYPE.fields[n][1]):
        dt, off = L.FLOW_DTYPE.fields[name][:2]
        if dt.base != np.dtype("<u8"):
            raise TypeError(f"counter field {name} is {dt.base}, not u64")
        if runs and runs[-1][0] + 8 * runs[-1][1] == off:
            runs[-1][1] += dt.itemsize // 8
        else:
            runs.append([off, dt.itemsize // 8])
    return tuple((o, w) for o, w in runs)


#: rows ahead the row kernels prefetch (850-byte rows: the hardware prefetcher stops at
#: each 4 KiB page)
_PREFETCH_ROWS = 4


@njit(cache=True, nogil=True)
def _kept(j, cur_pk, cur_first, prev_pk, prev_first):
    """Rows of cur with packets in the interval, and whether each subtracts its match. Every
    row is written and the count advanced by the test (no branch on it: half the rows of a
    half-active table kept at random mispredicted one branch in two)."""
    n = j.shape[0]
    keep = np.empty(n, dtype=np.int64)
    sub = np.empty(n, dtype=np.bool_)
    k = 0
    for i in range(n):
        r = j[i]
        q = max(r, 0)                   # prev has a row 0 (the callers' guard): read, then unused
        s = (r >= 0) & (cur_pk[i] >= prev_pk[q]) & (cur_first[i] == prev_first[q])
        keep[k] = i
        sub[k] = s
        k += cur_pk[i] > (prev_pk[q] if s else np.uint64(0))
    return keep[:k], sub[:k]


def kept_rows(j: np.ndarray, cur: np.ndarray, prev: np.ndarray):
    """(rows of cur with packets since prev, whether each is cur - prev[j]: matched and not
    re-created -- packets did not go down, first_ts unchanged -- else counted from zero)."""
    if not len(prev):                   # nothing to match (_kept reads a row of prev)
        keep = np.flatnonzero(cur["packets"] > 0)
        return keep, np.zeros(len(keep), dtype=np.bool_)
    return _kept(np.ascontiguousarray(j, dtype=np.int64), cur["packets"], cur["first_ts"], prev["packets"],
                 prev["first_ts"])


def row_columns(flows: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """A flow table's packets and first_ts as an (n, 2) uint64 array (into `out` when given):
    what kept_cols reads (interval_join fills it for a live read in its pass over the rows)."""
    out = np.empty((len(flows), 2), dtype=np.uint64) if out is None else out
    out[:, 0], out[:, 1] = flows["packets"], flows["first_ts"]
    return out


def kept_cols(j: np.ndarray, cur_cols: np.ndarray, prev_cols: np.ndarray):
    """kept_rows(j, cur, prev) from the tables' row_columns (cur_cols, prev_cols): the same
    rows and flags, reading 16 bytes a row instead of the rows (the analysis window's
    delta against an anchor several reads old: its kept test was a sixth of its work)."""
    c = np.ascontiguousarray(cur_cols, dtype=np.uint64)
    p = np.ascontiguousarray(prev_cols, dtype=np.uint64) if len(prev_cols) else np.zeros((1, 2), np.uint64)
    return _kept(np.ascontiguousarray(j, dtype=np.int64), c[:, 0], c[:, 1], p[:, 0], p[:, 1])


@njit(cache=True, nogil=True, inline="always")
def _cmp(a, i, b, j):
    """-1, 0, 1 as row i of the words a is below, equal to or above row j of b."""
    for k in range(a.shape[1]):
        if a[i, k] != b[j, k]:
            return -1 if a[i, k] < b[j, k] else 1
    return 0


@njit(cache=True, nogil=True)
def _sorted_join(a, b):
    out = np.full(b.shape[0], -1, dtype=np.int64)
    for i in range(1, a.shape[0]):
        if _cmp(a, i - 1, a, i) >= 0:
            return out, False
    for j in range(1, b.shape[0]):
        if _cmp(b, j - 1, b, j) >= 0:
            return out, False
    i = 0
    for j in range(b.shape[0]):
        while i < a.shape[0] and _cmp(a, i, b, j) < 0:
            i += 1
        if i < a.shape[0] and _cmp(a, i, b, j) == 0:
            out[j] = i
    return out, True


def sorted_join(a: np.ndarray, b: np.ndarray):
    """For each row of b the index of the equal row of a, or -1, by one merge of two row
    matrices ((n, k) uint64) that are both strictly increasing (compared word by word);
    None when either is not (then a hash join: core.snapshot.match_rows). The loader's flow
    tables are sorted by key (flows_from_raw), so two reads join in one sequential pass."""
    if not len(a) or not len(b):
        return None
    out, ok = _sorted_join(np.ascontiguousarray(a, dtype=np.uint64), np.ascontiguousarray(b, dtype=np.uint64))
    return out if ok else None


@intrinsic
def _sub_words(typingctx, dst, di, a, ai, b, bi, n):
    """_sub_words(d, i, a, j, b, k, n): the n u64 words at d[i:] = those at a[j:] minus those at
    b[k:] (1-D uint8 arrays, any alignment, no bounds check), four words a vector (the row
    kernel's counter runs: numba's word loop, one word at a time, was most of the subtraction)."""
    from llvmlite import ir  # heavy: typing runs only under numba
    from numba.core import cgutils, types  # heavy: as above

    def codegen(context, builder, signature, args):
        ptr = []
        for k in (0, 2, 4):
            aty = signature.args[k]
            ary = context.make_array(aty)(context, builder, args[k])
            ptr.append(cgutils.get_item_pointer(context, builder, aty, ary, [args[k + 1]], wraparound=False))
        i64 = ir.IntType(64)
        n = context.cast(builder, args[6], signature.args[6], types.int64)
        quads = builder.udiv(n, i64(4))

        def at(base, off, ty):
            return builder.bitcast(builder.gep(base, [off]), ty.as_pointer())

        for ty, count, first, step in ((ir.VectorType(i64, 4), quads, None, 32), (i64, None, quads, 8)):
            count = builder.sub(n, builder.mul(quads, i64(4))) if count is None else count
            with cgutils.for_range(builder, count) as loop:
                off = builder.mul(loop.index, i64(step))
                if first is not None:
                    off = builder.add(off, builder.mul(first, i64(32)))
                d, x, y = (at(p, off, ty) for p in ptr)
                builder.store(builder.sub(builder.load(x, align=1), builder.load(y, align=1)), d, align=1)
        return context.get_dummy_value()

    return types.void(dst, di, a, ai, b, bi, n), codegen


#: bytes of rows _delta_rows makes in its staging area before it streams them out (L1-sized)
_STAGE_BYTES = 8192


@njit(cache=True, nogil=True)
def _delta_rows(craw, praw, rs, keep, rows, use, runs, gaps, ts_off, since, oraw, head):
    """Row k of out (oraw: rows of rs bytes) = cur's row keep[k] (craw), with the counter
    words of runs ((byte offset, words) rows) minus prev's row rows[k] (praw) where use[k],
    and the u64 at ts_off raised to since (ts_off < 0: none): one pass, each output byte
    written once -- a row that subtracts is its gaps' bytes ((byte offset, bytes) rows: the
    rest of the row) copied and its runs' differences written, a row that does not one
    memcpy (a copy then the counters again in place re-read each word just stored).
    The rows are made in a small staging area (it stays in L1) and go out a 64-byte line at
    a time by non-temporal stores (stream_lines: the output is written once, not read: no
    read of each line before its write), oraw's first `head` bytes (before its first 64-byte
    boundary) and its last partial line by ordinary ones. The rows ahead are prefetched into
    L2, not L1 (prefetch_span_l2: 1.6x as fast; and the staging 1.1x again, 1,048,576 flows)."""
    n = keep.shape[0]
    stage = np.empty(_STAGE_BYTES + rs, dtype=np.uint8)
    done = 0      # oraw[:done] written
    fill = 0      # stage[:fill] = oraw[done:done + fill]
    for k in range(n):
        if k + _PREFETCH_ROWS < n:
            prefetch_span_l2(craw, keep[k + _PREFETCH_ROWS] * rs, rs)
            if use[k + _PREFETCH_ROWS]:
                prefetch_span_l2(praw, rows[k + _PREFETCH_ROWS] * rs, rs)
        cb = keep[k] * rs
        if use[k]:
            pb = rows[k] * rs
            for g in range(gaps.shape[0]):
                _copy_bytes(stage, fill + gaps[g, 0], craw, cb + gaps[g, 0], gaps[g, 1])
            for r in range(runs.shape[0]):
                o = runs[r, 0]
                _sub_words(stage, fill + o, craw, cb + o, praw, pb + o, runs[r, 1])
        else:
            _copy_bytes(stage, fill, craw, cb, rs)
        if ts_off >= 0 and load_u64(stage, fill + ts_off) < since:
            store_u64(stage, fill + ts_off, since)
        fill += rs
        if fill >= _STAGE_BYTES:
            a = head if done == 0 else 0        # then oraw + done is on a 64-byte boundary
            _copy_bytes(oraw, done, stage, 0, a)
            m = (fill - a) // 64 * 64
            stream_lines(oraw, done + a, stage, a, m // 64)
            _copy_bytes(stage, 0, stage, a + m, fill - a - m)
            done += a + m
            fill -= a + m
    _copy_bytes(oraw, done, stage, 0, fill)
    stream_fence()


def _gaps(blocks: tuple, size: int) -> np.ndarray:
    """The bytes of a row of `size` outside the counter runs `blocks`: (byte offset, bytes) rows."""
    out, pos = [], 0
    for off, nw in sorted(blocks):
        if off < pos:
            raise ValueError(f"delta_rows: counter runs overlap at byte {off}")
        if off > pos:
            out.append((pos, off - pos))
        pos = off + 8 * nw
    if pos < size:
        out.append((pos, size - pos))
    return np.array(out, dtype=np.int64).reshape(-1, 2)


def delta_rows(cur: np.ndarray, prev: np.ndarray, rows: np.ndarray, keep: np.ndarray, use: np.ndarray,
               blocks: tuple, since_ns: int = 0, pool=None) -> np.ndarray:
    """cur[keep] with the counter words `blocks` (counter_blocks) of the rows with use[k]
    minus prev[rows[k]], and first_ts raised to since_ns when given: take_rows, the
    subtraction and the clamp in one pass (separate passes wrote and re-read half a gigabyte
    at 1,048,576 flows). C-contiguous FLOW_DTYPE tables; rows[k] is the row of prev matched to
    cur[keep[k]]. `pool` (core.pool.ArrayPool of FLOW_DTYPE): the result is written into a
    buffer no earlier result refers to any more, not into fresh pages (a live loop: page
    zeroing was a third of the work). The rows go out by non-temporal stores (_delta_rows):
    the result is complete and visible to other threads when this returns."""
    keep = np.ascontiguousarray(keep, dtype=np.int64)
    out = np.empty(len(keep), dtype=cur.dtype) if pool is None else pool.take(len(keep))
    if not len(keep):
        return out
    for off, nw in blocks:
        if off < 0 or off + 8 * nw > cur.dtype.itemsize:
            raise ValueError(f"delta_rows: counter run ({off}, {nw}) outside the row")
    since = int(since_ns)
    ts_off = cur.dtype.fields["first_ts"][1] if since > 0 else -1
    raw = out.view(np.uint8).reshape(-1)
    _delta_rows(cur.view(np.uint8).reshape(-1), prev.view(np.uint8).reshape(-1) if len(prev) else np.zeros(8, np.uint8),
                cur.dtype.itemsize, keep, np.ascontiguousarray(rows, dtype=np.int64),
                np.ascontiguousarray(use, dtype=np.bool_), np.array(blocks, dtype=np.int64).reshape(-1, 2),
                _gaps(blocks, cur.dtype.itemsize), ts_off, np.uint64(since), raw, -raw.ctypes.data % 64)
    return out


#: the rates kernel's bytes of a row (key .. msg_hist)
_ROW_BYTES_READ = L.FLOW_DTYPE.fields["msg_hist"][1] + L.FLOW_DTYPE.fields["msg_hist"][0].itemsize
#: the column sums flow_rates(sums=) fills: top's header totals
SUM_FIELDS = ("bytes", "ce", "ecn_capable", "cnp", "retransmissions", "naks")


@njit(cache=True, nogil=True)
def _rates_kernel(fl, raw, dt, k, gbps, pps, cnp_ps, ce_pct, retx, naks, mode, sums):
    """flow_rates' columns and SUM_FIELDS' sums in one pass over the rows (one numpy pass per
    column re-read the 850-byte rows seven times); the same float operations in the same
    order as the per-column numpy expressions. msg_mode: the lower bound of the first
    fullest log2 slot (slot 0: 0; s: 2^(s-1)), -1 for an empty histogram."""
    n = fl.shape[0]
    rs = raw.shape[0] // max(n, 1)
    for i in range(n):
        if i + _PREFETCH_ROWS < n:
            # into L2, not L1 (1.25x at 1,048,576 flows: L1's miss buffers free for the row's loads)
            prefetch_span_l2(raw, (i + _PREFETCH_ROWS) * rs, _ROW_BYTES_READ)
        r = fl[i]
        gbps[i] = float(r.bytes) * 8.0 / dt / 1e9 * k
        pps[i] = float(r.packets) / dt * k
        cnp_ps[i] = float(r.cnp) / dt * k
        ecn = float(r.ecn_capable)
        ce_pct[i] = 100.0 * float(r.ce) / max(ecn, 1.0) if ecn > 0 else 0.0
        retx[i] = float(r.retransmissions) * k
        nk = r.nak_seq + r.nak_rnr + r.nak_other
        naks[i] = float(nk) * k
        best, top = -1, np.uint64(0)
        for s in range(r.msg_hist.shape[0]):
            if r.msg_hist[s] > top:
                top, best = r.msg_hist[s], s
        mode[i] = -1 if best < 0 else (0 if best == 0 else np.int64(1) << np.int64(best - 1))
        sums[0] += r.bytes
        sums[1] += r.ce
        sums[2] += r.ecn_capable
        sums[3] += r.cnp
        sums[4] += r.retransmissions
        sums[5] += nk


def flow_rates(flows: np.ndarray, dt: float, sample_n: int = 1, sums: dict | None = None) -> dict[str, np.ndarray]:
    """The live per-interval rates of a delta flow table over dt seconds, scaled by the sampling factor (with
    1-in-N sampling the counters are of sampled packets; N times them is the unbiased
    estimate). Definitions (README "Counters"/"Live rates"):
      gbps      wire bytes (Ethernet frame without FCS) * 8 / dt / 1e9
      pps       packets / dt
      cnp_ps    CNP packets / dt
      ce_pct    100 * CE packets / ECN-capable packets (0 when none is ECN-capable)
      retx, naks  counts in the interval (scaled)
      msg_mode  lower bound (bytes) of the most frequent message-size bucket, -1 if none
    `sums`: filled with the unscaled column totals of SUM_FIELDS (Python ints; naks: the
    three NAK counters), from the same pass.
    """
    dt = max(float(dt), 1e-9)
    k = float(max(1, int(sample_n)))
    n = len(flows)
    out = {c: np.empty(n, np.float64) for c in ("gbps", "pps", "cnp_ps", "ce_pct", "retx", "naks")}
    out["msg_mode"] = np.empty(n, np.int64)
    tot = np.zeros(len(SUM_FIELDS), np.uint64)
    if n:
        f = np.ascontiguousarray(flows, dtype=L.FLOW_DTYPE)
        _rates_kernel(f, f.view(np.uint8).reshape(-1), dt, k, out["gbps"], out["pps"], out["cnp_ps"], out["ce_pct"],
                      out["retx"], out["naks"], out["msg_mode"], tot)
    if sums is not None:
        sums.update({c: int(v) for c, v in zip(SUM_FIELDS, tot)})
    return out


#: rows ahead _order_words prefetches (little work per row: further ahead than the others)
_KEY_PREFETCH_ROWS = 16


@njit(cache=True, nogil=True)
def _order_words(raw, rs, nkey, out):
    """out[i] = the big-endian words of row i's first nkey bytes (zero-padded): one pass,
    each row's key bytes read where they are."""
    n = out.shape[0]
    for i in range(n):
        if i + _KEY_PREFETCH_ROWS < n:
            b = (i + _KEY_PREFETCH_ROWS) * rs
            prefetch(raw, b)
            prefetch(raw, b + nkey - 1)
        b = i * rs
        for w in range(out.shape[1]):
            v = np.uint64(0)
            for k in range(8 * w, 8 * w + 8):
                v = (v << np.uint64(8)) | (np.uint64(raw[b + k]) if k < nkey else np.uint64(0))
            out[i, w] = v


def order_words(flows: np.ndarray, pool=None) -> np.ndarray:
    """The flow keys as native u64 words whose word-by-word order is the loader's key order
    (big-endian words of the key bytes: core.snapshot._key_order). A FLOW_DTYPE table in
    one numba pass over its rows' key bytes (the byte matrix and its byte swap were two
    strided numpy passes, 55 ms at 1,048,576 flows). pool: a core.pool.ArrayPool of
    WORDS_DTYPE the words are written into (a live read's, every interval)."""
    nw = L.FLOW_KEY_DTYPE.itemsize // 8
    if flows.dtype == L.FLOW_DTYPE and flows.flags.c_contiguous and _KEY_PREFIX:
        out = np.empty((len(flows), nw), dtype=np.uint64) if pool is None else pool.take(len(flows))
        if len(flows):
            _order_words(flows.view(np.uint8).reshape(-1), flows.dtype.itemsize, _KEY_PREFIX, out)
        return out
    k = flow_key_matrix(flows)
    return k.view(">u8").astype(np.uint64).reshape(len(flows), k.shape[1] // 8)


@njit(cache=True, nogil=True, inline="always")
def _kcmp(a, i, b, j, last):
    for c in range(a.shape[1]):
        x, y = a[i, c], b[j, c]
        if c == a.shape[1] - 1:
            x &= last
            y &= last
        if x != y:
            return -1 if bswap64(x) < bswap64(y) else 1
    return 0


@njit(cache=True, nogil=True)
def _key_join(a, b, last):
    """_sorted_join on the key words where they lie in the rows (a, b: strided (n, 5)
    views; last: the mask of the last word's key bytes), checking the order as it goes.
    (out, False) if either table is not strictly increasing."""
    out = np.full(b.shape[0], -1, dtype=np.int64)
    na, nb = a.shape[0], b.shape[0]
    i = 0
    for j in range(nb):
        if j + 8 < nb:
            prefetch(b[:, 0], j + 8)
        if j > 0 and _kcmp(b, j - 1, b, j, last) >= 0:
            return out, False
        while i < na:
            c = _kcmp(a, i, b, j, last)
            if c >= 0:
                if c == 0:
                    out[j] = i
                break
            i += 1
            if i + 8 < na:
                prefetch(a[:, 0], i + 8)
            if i < na and _kcmp(a, i - 1, a, i, last) >= 0:
                return out, False
    for k in range(max(i, 1), na):
        if _kcmp(a, k - 1, a, k, last) >= 0:
            return out, False
    return out, True


def _in_rows(t: np.ndarray) -> bool:
    """A table whose key words the merge can read in place: C-contiguous FLOW_DTYPE, the
    key's bytes (_KEY_PREFIX) leading each row and ending in its fifth word."""
    return t.dtype == L.FLOW_DTYPE and t.flags.c_contiguous and 32 < _KEY_PREFIX <= 40


#: one row of order_words (an ArrayPool of it hands out (n, 5) uint64 arrays)
WORDS_DTYPE = np.dtype((np.uint64, L.FLOW_KEY_DTYPE.itemsize // 8))
_PK_OFF, _TS_OFF = L.FLOW_DTYPE.fields["packets"][1], L.FLOW_DTYPE.fields["first_ts"][1]
#: one row of row_columns (an ArrayPool of it hands out (n, 2) uint64 arrays)
COLS_DTYPE = np.dtype((np.uint64, 2))
_NO_COLS = np.zeros((0, 2), dtype=np.uint64)


@njit(cache=True, nogil=True)
def _interval_join(craw, praw, rs, nkey, pw, words, j, keep, sub, cols, pcols):
    """order_words of cur (craw) into words, sorted_join of them to prev's words pw into j,
    and _kept's rows into keep/sub, in one pass over cur's first bytes (key .. first_ts;
    three passes read them three times), and when cols has rows cur's packets and first_ts
    into it (row_columns). prev's packets and first_ts from pcols when it has rows (the
    previous read's cols: 16 bytes a row), else from its rows (praw). Returns how many rows
    are kept, or -1 when pw or cur's words are not strictly increasing (then the caller
    joins by hash): each pair of adjacent pw rows is checked once, as the merge steps over
    it, or after it."""
    n, m, nw = words.shape[0], pw.shape[0], words.shape[1]
    own = pcols.shape[0] == m
    p = 0
    k = 0
    for i in range(n):
        if i + _KEY_PREFETCH_ROWS < n:
            prefetch_span(craw, (i + _KEY_PREFETCH_ROWS) * rs, _TS_OFF + 8)
        if not own and p + _KEY_PREFETCH_ROWS < m:
            prefetch_span(praw, (p + _KEY_PREFETCH_ROWS) * rs + _PK_OFF, _TS_OFF + 8 - _PK_OFF)
        b = i * rs
        for w in range(nw):
            words[i, w] = bswap64(key_word(craw, b, nkey, w))
        if i and _cmp(words, i - 1, words, i) >= 0:
            return -1
        # the merge: the first row of prev not below row i
        c = -1
        while p < m:
            c = _cmp(pw, p, words, i)
            if c >= 0:
                break
            p += 1
            if p < m and _cmp(pw, p - 1, pw, p) >= 0:
                return -1
        r = p if p < m and c == 0 else -1
        j[i] = r
        cpk = load_u64(craw, b + _PK_OFF)
        cts = load_u64(craw, b + _TS_OFF)
        if cols.shape[0]:
            cols[i, 0] = cpk
            cols[i, 1] = cts
        s = False
        base = np.uint64(0)
        if r >= 0:
            if own:
                ppk, pts = pcols[r, 0], pcols[r, 1]
            else:
                ppk, pts = load_u64(praw, r * rs + _PK_OFF), load_u64(praw, r * rs + _TS_OFF)
            s = cpk >= ppk and cts == pts
            if s:
                base = ppk
        keep[k] = i                     # written always, counted when kept (_kept: no branch)
        sub[k] = s
        k += cpk > base
    for r in range(max(p, 0) + 1, m):
        if _cmp(pw, r - 1, pw, r) >= 0:
            return -1
    return k


def interval_join(prev: np.ndarray, cur: np.ndarray, prev_words: np.ndarray, pool=None, cols=None,
                  prev_cols=None):
    """(cur's order_words, join_flows(prev, cur), kept_rows' keep and sub) of two loader reads
    (C-contiguous FLOW_DTYPE tables sorted by key; prev_words: prev's order_words) in one
    pass; None when they are not both strictly increasing or not such tables (then the
    three separately: join_flows falls back to a hash join). pool: as order_words'.
    cols: a (len(cur), 2) uint64 array filled in the same pass with cur's packets and
    first_ts (row_columns: a later kept test against an older read reads 16 bytes a row,
    not two cache lines of 850-byte rows); prev_cols: prev's, read instead of prev's rows
    (the session keeps each read's for the next: a fifth of the pass at 1,048,576 flows)."""
    nw = WORDS_DTYPE.shape[0]
    if not (cur.dtype == prev.dtype == L.FLOW_DTYPE and cur.flags.c_contiguous and prev.flags.c_contiguous
            and _KEY_PREFIX and len(prev) and len(cur) and prev_words.shape == (len(prev), nw)
            and prev_words.dtype == np.uint64):
        return None
    n = len(cur)
    words = np.empty((n, nw), dtype=np.uint64) if pool is None else pool.take(n)
    j, keep, sub = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64), np.empty(n, dtype=np.bool_)
    for c, rows in ((cols, n), (prev_cols, len(prev))):
        if c is not None and (c.shape != (rows, 2) or c.dtype != np.uint64):
            raise ValueError(f"interval_join: columns of shape {c.shape} ({c.dtype}), not ({rows}, 2) uint64")
    k = _interval_join(cur.view(np.uint8).reshape(-1), prev.view(np.uint8).reshape(-1), cur.dtype.itemsize,
                       _KEY_PREFIX, np.ascontiguousarray(prev_words), words, j, keep, sub,
                       _NO_COLS if cols is None else cols,
                       _NO_COLS if prev_cols is None else np.ascontiguousarray(prev_cols))
    return None if k < 0 else (words, j, keep[:k], sub[:k])


def join_flows(a: np.ndarray, b: np.ndarray, ka: np.ndarray | None = None, kb: np.ndarray | None = None) -> np.ndarray:
    """For each row of flow table b, the row of flow table a with the same key, or -1: one
    merge when both are sorted by key (the loader's reads and row subsets of them), else a
    hash join (core.snapshot.match_rows). ka / kb: a's / b's order_words when the caller kept
    them (a live read's words serve as the next interval's: 70 ms at 1,048,576 flows); without
    them the merge reads the key words where they lie in the rows (no word matrices: ~3x
    faster than order_words + sorted_join at 1,048,576 flows)."""
    if ka is None and kb is None and len(a) and len(b) and _in_rows(a) and _in_rows(b):
        words = lambda t: np.ndarray((len(t), 5), "<u8", buffer=t, strides=(t.dtype.itemsize, 8))  # noqa: E731
        out, ok = _key_join(words(a), words(b), np.uint64((1 << (8 * (_KEY_PREFIX - 32))) - 1))
        return out if ok else match_rows(order_words(a), order_words(b))
    ka = order_words(a) if ka is None else ka
    kb = order_words(b) if kb is None else kb
    j = sorted_join(ka, kb)
    return match_rows(ka, kb) if j is None else j


@njit(cache=True, nogil=True)
def _follow(jprev, j, a, b):
    """jprev composed with j (-1 stays -1); rows with j -1 looked up in a by binary search."""
    out = np.empty(j.shape[0], dtype=np.int64)
    for i in range(j.shape[0]):
        r = j[i]
        if r >= 0:
            out[i] = jprev[r]
            continue
        lo, hi = 0, a.shape[0]
        while lo < hi:
            m = (lo + hi) // 2
            if _cmp(a, m, b, i) < 0:
                lo = m + 1
            else:
                hi = m
        out[i] = lo if lo < a.shape[0] and _cmp(a, lo, b, i) == 0 else -1
    return out


@njit(cache=True, nogil=True)
def _increasing(a):
    for i in range(1, a.shape[0]):
        if _cmp(a, i - 1, a, i) >= 0:
            return False
    return True


def words_sorted(k: np.ndarray) -> bool:
    """order_words strictly increasing (a loader read: follow_join can look rows up in it)."""
    return bool(_increasing(np.ascontiguousarray(k, dtype=np.uint64)))


def follow_join(jprev: np.ndarray, j: np.ndarray, ka: np.ndarray, kc: np.ndarray) -> np.ndarray:
    """The join of a newer read c to an older table a (for each row of c, a's row with its
    key, or -1) from the join to a of the read b before c (jprev) and the join of c to b (j):
    jprev[j], and the rows new in c looked up in a by binary search. ka: a's order_words,
    strictly increasing (words_sorted); kc: c's. O(rows of c) + O(new rows x log a): the
    analysis window's delta against its anchor without a second join of the whole table."""
    return _follow(np.ascontiguousarray(jprev, dtype=np.int64), np.ascontiguousarray(j, dtype=np.int64),
                   np.ascontiguousarray(ka, dtype=np.uint64), np.ascontiguousarray(kc, dtype=np.uint64))


@njit(cache=True, nogil=True)
def _record_rows(words, keep, rraw, rrs, order, out):
    """The records (rraw: rows of rrs bytes, their 40 key bytes first) in key order (order)
    merged with the rows words[keep[i]]; out[record] = i or -1. False, out unfinished, at the
    first of those rows not above the one before it. The records' words are laid out in key
    order (the merge reads them in sequence, not through order: a third faster)."""
    m, n, nw = order.shape[0], keep.shape[0], words.shape[1]
    rw = np.empty((m, nw), dtype=np.uint64)
    for q in range(m):
        b = order[q] * rrs
        for w in range(nw):
            rw[q, w] = bswap64(key_word(rraw, b, 8 * nw, w))
        out[q] = -1
    q = 0
    for i in range(n):
        r = keep[i]
        if i and _cmp(words, keep[i - 1], words, r) >= 0:
            return False
        while q < m:
            c = _cmp(rw, q, words, r)
            if c > 0:
                break
            if c == 0:
                out[order[q]] = i
            q += 1
    return True


def record_rows(words: np.ndarray, keep: np.ndarray, recs: np.ndarray):
    """core.snapshot.record_flows(table, recs) of a table whose rows are a read's rows keep
    (the window's delta: cur[keep] less its anchor) from the read's order_words (words)
    instead of the table's rows: a merge over 40 bytes a row where they lie together, not one
    cache line of each 850-byte row (its key bytes turned into words again). None when the
    rows words[keep] are not strictly increasing (then record_flows: its hash join) or the
    records are not MSG_REC_DTYPE."""
    n = len(recs)
    if recs.dtype != L.MSG_REC_DTYPE or recs.dtype.fields["key"][1] != 0 or words.shape[1:] != WORDS_DTYPE.shape:
        return None
    recs = np.ascontiguousarray(recs)
    rraw = recs.view(np.uint8).reshape(-1)
    out = np.empty(n, dtype=np.int64)
    if not n:
        return out
    order = _key_order(rraw.reshape(n, -1)[:, :8 * WORDS_DTYPE.shape[0]])
    ok = _record_rows(np.ascontiguousarray(words, dtype=np.uint64), np.ascontiguousarray(keep, dtype=np.int64), rraw,
                      recs.dtype.itemsize, order, out)
    return out if ok else None
