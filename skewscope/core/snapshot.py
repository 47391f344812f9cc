"""The Snapshot: the one seam between the data sources (live BPF maps, kernel replay,
offline pcap parser) and everything downstream (metrics, findings, report, top, export).

A Snapshot is numpy structured arrays + a metadata dict:
  flows    layout.FLOW_DTYPE, one row per (ipver, src, dst, dest_qp), sorted by key bytes
  events   layout.EVENT_DTYPE, message records (flow index, opclass, start, end, bytes),
           sorted by start_ts
  globals  uint64[layout.G_N], the data plane's global counters (categories, PFC, ...)
  meta     dict (JSON-able): source, interface/file, duration, sampling, versions, ...

File format (.snap), format_version 1: a ZIP archive (numpy .npz layout) with members
`flows.npy`, `events.npy`, `globals.npy` (plain .npy, no pickles: loaded with
allow_pickle=False) and `meta.npy` (UTF-8 JSON as a uint8 array) whose "magic" is
"skewscope-snapshot". Writes are atomic (temp file in the same directory, fsync, rename).
"""
from __future__ import annotations

import functools
import io
import ipaddress
import json
import os
from dataclasses import dataclass, field

import numpy as np

from skewscope.core import layout as L
from skewscope.core.errors import SkewscopeError
from skewscope.core.files import atomic_write
from skewscope.core.jit import intrinsic, item_pointers, load_u64, njit, prefetch_span, prefetch_span_l2

FORMAT_VERSION = 1
MAGIC = "skewscope-snapshot"


class SnapshotError(SkewscopeError):
    """A snapshot file that cannot be read (one-line message for the user)."""


@dataclass
class Snapshot:
    flows: np.ndarray
    events: np.ndarray
    globals: np.ndarray
    meta: dict = field(default_factory=dict)

    # ---- convenience -------------------------------------------------------------
    def category_counts(self) -> dict[str, int]:
        return {name: int(self.globals[i]) for i, name in enumerate(L.CATEGORY_NAMES)}

    @property
    def flows_evicted(self) -> int:
        return int(self.meta.get("flows_evicted", 0))

    def flow_label(self, i: int) -> str:
        f = self.flows[i]
        return f"{ip_str(f['src'], f['ipver'])}->{ip_str(f['dst'], f['ipver'])} qp {int(f['dest_qp'])}"

    # ---- persistence -------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> None:
        meta = dict(self.meta)
        meta["magic"] = MAGIC
        meta["format_version"] = FORMAT_VERSION
        meta["layout_version"] = L.LAYOUT_VERSION
        members = {
            "flows": self.flows,
            "events": self.events,
            "globals": np.asarray(self.globals, dtype=np.uint64),
            "meta": np.frombuffer(json.dumps(meta, sort_keys=True).encode(), dtype=np.uint8),
        }
        atomic_write(path, lambda fh: _write_npz(fh, members))

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Snapshot":
        import zipfile  # only .snap files (np.load imports it too): not loaded by a report on a capture
        try:
            with np.load(path, allow_pickle=False) as z:
                names = set(z.files)
                missing = {"flows", "events", "globals", "meta"} - names
                if missing:
                    raise SnapshotError(f"{path}: not a skewscope snapshot (missing {', '.join(sorted(missing))})")
                meta = json.loads(bytes(z["meta"]).decode())
                if meta.get("magic") != MAGIC:
                    raise SnapshotError(f"{path}: not a skewscope snapshot (bad magic)")
                if int(meta.get("format_version", 0)) > FORMAT_VERSION:
                    raise SnapshotError(f"{path}: snapshot format {meta.get('format_version')} is newer than "
                                        f"this skewscope understands ({FORMAT_VERSION}); upgrade skewscope")
                flows, events, glob = z["flows"], z["events"], z["globals"]
        except SnapshotError:
            raise
        except (OSError, ValueError, zipfile.BadZipFile, KeyError, json.JSONDecodeError, EOFError) as e:
            raise SnapshotError(f"{path}: cannot read snapshot: {e}") from None
        if flows.dtype != L.FLOW_DTYPE or events.dtype != L.EVENT_DTYPE or glob.shape != (L.G_N,):
            raise SnapshotError(f"{path}: snapshot tables do not match layout version {L.LAYOUT_VERSION}")
        return cls(flows=flows, events=events, globals=glob, meta=meta)


def _write_npz(fh, members: dict) -> None:
    import zipfile  # only .snap files: not loaded by a report on a capture
    with zipfile.ZipFile(fh, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        for name, arr in members.items():
            bio = io.BytesIO()
            np.lib.format.write_array(bio, np.ascontiguousarray(arr), allow_pickle=False)
            zf.writestr(name + ".npy", bio.getvalue())


# ---- building tables -------------------------------------------------------------------
_V4_MAPPED = b"\0" * 10 + b"\xff\xff"


def ip_str(addr16, ipver: int) -> str:
    """The one address formatter: IPv4 (RoCEv2 over IPv4, and a RoCEv1 GID that maps an IPv4
    address, ::ffff:a.b.c.d) as a.b.c.d; any other 16-byte address as IPv6."""
    return _ip_text(bytes(np.asarray(addr16, dtype=np.uint8)), int(ipver) == 4)


@functools.lru_cache(maxsize=1 << 16)
def _ip_text(b: bytes, v4: bool) -> str:
    """ip_str of the address bytes b (kept: a live exporter formats the same few thousand
    addresses read after read -- node_index's every node, ~15 us each in ipaddress)."""
    if v4 or b[:12] == _V4_MAPPED:
        return str(ipaddress.IPv4Address(b[12:]))
    return str(ipaddress.IPv6Address(b))


def ip_bytes(s: str) -> tuple[bytes, int]:
    """'10.0.0.1' -> (16 bytes ::ffff:10.0.0.1, 4); IPv6 -> (16 bytes, 6)."""
    a = ipaddress.ip_address(s)
    if a.version == 4:
        return b"\0" * 10 + b"\xff\xff" + a.packed, 4
    return a.packed, 6


def _key_order(key_bytes: np.ndarray) -> np.ndarray:
    """Indices sorting rows of a (n, 40) uint8 matrix lexicographically (stable). Sort order
    is the key bytes: ipver-independent address bytes first (src, dst), then dest_qp bytes.
    Only the bits that differ between rows decide the order, so those alone are packed into
    as few u64 words as they fit in and radix-sorted (IPv4 addresses of a cluster and 24-bit
    QPs: one word, ~4 passes; np.lexsort of the 5 big-endian words was 0.35-0.8 s at
    1,048,576 rows, this ~0.07 s)."""
    n = len(key_bytes)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    k = np.ascontiguousarray(key_bytes, dtype=np.uint8).reshape(n, -1)
    fields, bits = _key_packing(_varying_bits(k))
    if not bits:
        return np.arange(n, dtype=np.int64)   # all rows equal
    return _radix_order(_pack_keys(k, fields, len(bits)), np.array(bits, dtype=np.int64))


@njit(cache=True, nogil=True)
def _varying_bits(k):
    """Per column of a uint8 matrix: the bits in which some row differs from row 0."""
    out = np.zeros(k.shape[1], dtype=np.uint8)
    for i in range(1, k.shape[0]):
        for j in range(k.shape[1]):
            out[j] |= k[i, j] ^ k[0, j]
    return out


def _key_packing(diff: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """Where each varying byte's bits go: (fields (m, 4) int64 of (byte, lowest varying
    bit, width, word), bits used per word). A byte contributes its bits from the highest to
    the lowest varying one (the bits around them are the same in every row), bytes in key
    order, a new word when the next byte's bits do not fit in 64: comparing the words in
    order compares the keys."""
    fields, bits = [], []
    for j, m in enumerate(diff.tolist()):
        if m:
            lo = (m & -m).bit_length() - 1
            width = m.bit_length() - lo
            if not bits or bits[-1] + width > 64:
                bits.append(0)
            fields.append((j, lo, width, len(bits) - 1))
            bits[-1] += width
    return np.array(fields, dtype=np.int64).reshape(-1, 4), bits


@njit(cache=True, nogil=True)
def _pack_keys(k, fields, nwords):
    """Each row's varying bits (_key_packing's fields) as nwords u64 words."""
    out = np.zeros((k.shape[0], nwords), dtype=np.uint64)
    for i in range(k.shape[0]):
        for f in range(fields.shape[0]):
            w = fields[f, 3]
            v = (np.uint64(k[i, fields[f, 0]]) >> np.uint64(fields[f, 1])) & np.uint64((1 << fields[f, 2]) - 1)
            out[i, w] = (out[i, w] << np.uint64(fields[f, 2])) | v
    return out


@njit(cache=True, nogil=True)
def _radix_order(words, bits):
    """The stable order of the rows of words ((n, w) uint64, compared word by word; bits[j]
    = the low bits word j uses): LSD radix sort, digits of <= 11 bits from the last word's
    lowest to the first word's highest, each pass moving the words still to be sorted on
    with the row indices (sequential reads, 2,048 write streams)."""
    n, nw = words.shape
    idx, idx2 = np.arange(n), np.empty(n, dtype=np.int64)
    cur, nxt = words, np.empty_like(words)
    cnt = np.empty(1 << 11, dtype=np.int64)
    for w in range(nw - 1, -1, -1):
        npass = (bits[w] + 10) // 11
        b = 0
        for p in range(npass):
            d = (bits[w] - b + npass - p - 1) // (npass - p)      # balanced digits
            mask, sh = np.uint64((1 << d) - 1), np.uint64(b)
            cnt[:1 << d] = 0
            for i in range(n):
                cnt[np.int64((cur[i, w] >> sh) & mask)] += 1
            s = 0
            for v in range(1 << d):
                c = cnt[v]
                cnt[v] = s
                s += c
            for i in range(n):
                v = np.int64((cur[i, w] >> sh) & mask)
                to = cnt[v]
                cnt[v] = to + 1
                for j in range(w + 1):              # the words after w are sorted on already
                    nxt[to, j] = cur[i, j]
                idx2[to] = idx[i]
            cur, nxt = nxt, cur
            idx, idx2 = idx2, idx
            b += d
    return idx


def _raw_segments() -> np.ndarray:
    """FLOW_DTYPE's bytes as runs copied from the map's key (40 B) and value (848 B) rows:
    (n, 4) int64 of (from the value?, source offset, destination offset, length); adjacent
    fields that lie back to back in both layouts are one run."""
    runs: list[list[int]] = []
    for name in sorted(L.FLOW_DTYPE.names, key=lambda n: L.FLOW_DTYPE.fields[n][1]):
        dt, dst = L.FLOW_DTYPE.fields[name][:2]
        val = int(name not in L.FLOW_KEY_DTYPE.names)
        src = (L.FLOW_STATS_DTYPE if val else L.FLOW_KEY_DTYPE).fields[name][1]
        size = dt.itemsize
        if runs and runs[-1][0] == val and runs[-1][1] + runs[-1][3] == src and runs[-1][2] + runs[-1][3] == dst:
            runs[-1][3] += size
        else:
            runs.append([val, src, dst, size])
    return np.array(runs, dtype=np.int64)


_RAW_RUNS = _raw_segments()
_KZ, _VZ, _RZ = L.FLOW_KEY_DTYPE.itemsize, L.FLOW_STATS_DTYPE.itemsize, L.FLOW_DTYPE.itemsize


@intrinsic
def _copy_bytes(typingctx, dst, di, src, si, nbytes):
    """_copy_bytes(d, i, s, j, n): d[i:i + n] = s[j:j + n] of 1-D uint8 arrays as one
    memcpy, no bounds check (numba's slice assignment checks overlap and copies byte by
    byte: the map read's copy took 3x as long)."""
    from numba.core import cgutils, types  # heavy: typing runs only under numba

    def codegen(context, builder, signature, args):
        d, s = item_pointers(context, builder, signature, args)
        cgutils.raw_memcpy(builder, d, s, args[4], 1)
        return context.get_dummy_value()

    return types.void(dst, di, src, si, nbytes), codegen


#: entries ahead _gather_raw prefetches
_GATHER_AHEAD = 4


@njit(cache=True, nogil=True)
def _gather_raw(keys, stats, order, runs, out):
    """out row i = the FLOW_DTYPE bytes of map entry order[i], one memcpy per run of bytes
    (keys, stats, out: the byte matrices flattened). The entries ahead in order (in no order
    in memory: the hardware prefetcher cannot guess them) are prefetched into L2: 1.8x as
    fast at 1,048,576 entries (into L1 as well: 1.3x; L1's miss buffers then stall the
    copies' own loads)."""
    n = order.shape[0]
    for i in range(n):
        if i + _GATHER_AHEAD < n:
            q = order[i + _GATHER_AHEAD]
            prefetch_span_l2(stats, q * _VZ, _VZ)
            prefetch_span_l2(keys, q * _KZ, _KZ)
        r = order[i]
        for k in range(runs.shape[0]):
            if runs[k, 0]:
                _copy_bytes(out, i * _RZ + runs[k, 2], stats, r * _VZ + runs[k, 1], runs[k, 3])
            else:
                _copy_bytes(out, i * _RZ + runs[k, 2], keys, r * _KZ + runs[k, 1], runs[k, 3])


def flows_from_raw(keys: np.ndarray, stats: np.ndarray, pool=None) -> np.ndarray:
    """(n, 40) key bytes + (n, 848) stats bytes -> FLOW_DTYPE table sorted by key. `pool`
    (core.pool.ArrayPool of FLOW_DTYPE): the table is written into a buffer no earlier
    result refers to any more (the live read, every interval) instead of fresh memory."""
    n = len(keys)
    keys = np.ascontiguousarray(keys, dtype=np.uint8).reshape(n, _KZ)
    stats = np.ascontiguousarray(stats, dtype=np.uint8).reshape(n, _VZ)
    # every byte of a row is one of the runs': nothing to zero first
    out = np.empty(n, dtype=L.FLOW_DTYPE) if pool is None else pool.take(n)
    _gather_raw(keys.reshape(-1), stats.reshape(-1), _key_order(keys), _RAW_RUNS, out.view(np.uint8).reshape(-1))
    return out


def take_rows(table: np.ndarray, idx) -> np.ndarray:
    """table[idx] (indices or a mask) copied as whole rows: numpy copies a structured row
    field by field (the flow table's 30 fields: 4x slower than moving its 850 bytes)."""
    if not table.flags.c_contiguous:
        return table[idx]
    return table.view(np.dtype((np.void, table.dtype.itemsize)))[idx].view(table.dtype)


_KEY_NAMES = ("src", "dst", "dest_qp", "ipver", "roce")
#: bytes at the start of a FLOW_DTYPE row that are the key's fields at the key's offsets (0
#: if the two layouts ever differ there: then field by field)
_KEY_PREFIX = (max(L.FLOW_KEY_DTYPE.fields[n][1] + L.FLOW_KEY_DTYPE.fields[n][0].itemsize for n in _KEY_NAMES)
               if all(L.FLOW_KEY_DTYPE.fields[n][:2] == L.FLOW_DTYPE.fields[n][:2] for n in _KEY_NAMES) else 0)


def flow_key_matrix(flows: np.ndarray) -> np.ndarray:
    """FLOW_DTYPE rows -> (n, 40) key bytes in the C layout."""
    n = len(flows)
    if flows.dtype == L.FLOW_DTYPE and flows.flags.c_contiguous and _KEY_PREFIX:
        # the key fields lead each row in the same layout: one strided byte copy
        k = np.zeros((n, L.FLOW_KEY_DTYPE.itemsize), dtype=np.uint8)
        k[:, :_KEY_PREFIX] = flows.view(np.uint8).reshape(n, L.FLOW_DTYPE.itemsize)[:, :_KEY_PREFIX]
        return k
    k = np.zeros(n, dtype=L.FLOW_KEY_DTYPE)
    for name in _KEY_NAMES:
        k[name] = flows[name]
    return k.view(np.uint8).reshape(n, L.FLOW_KEY_DTYPE.itemsize)


def flow_key_words(flows: np.ndarray) -> np.ndarray:
    """FLOW_DTYPE rows -> (n, 5) uint64: the 40 key bytes as words (row identity, for match_rows)."""
    return flow_key_matrix(flows).view("<u8").reshape(len(flows), L.FLOW_KEY_DTYPE.itemsize // 8)


def _row_hash(rows: np.ndarray) -> np.ndarray:
    """A 64-bit hash per row of an (n, k) uint64 matrix (multiply-xorshift over the words)."""
    h = np.zeros(len(rows), dtype=np.uint64)
    for c in range(rows.shape[1]):
        h ^= rows[:, c]
        h *= np.uint64(0x9E3779B97F4A7C15)
        h ^= h >> np.uint64(29)
    return h


def match_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """For each row of b, the index of the equal row of a, or -1. Rows are (n, k) uint64
    (e.g. flow_key_words); a's rows must be distinct. A join on a 64-bit row hash (1-D sort
    and binary search: np.unique(axis=0) of the rows was 20x slower, 0.4 s at 65,536 flows),
    every candidate checked word by word; exact: when two of a's rows share a hash (never
    seen), the rows themselves are sorted instead."""
    if len(b) == 0:
        return np.zeros(0, dtype=np.int64)
    if len(a) == 0:
        return np.full(len(b), -1, dtype=np.int64)
    a, b = np.ascontiguousarray(a, dtype=np.uint64), np.ascontiguousarray(b, dtype=np.uint64)
    ha = _row_hash(a)
    o = np.argsort(ha)
    hs = ha[o]
    if np.any(hs[1:] == hs[:-1]):
        return _match_rows_sorted(a, b)
    hb = _row_hash(b)
    ob = np.argsort(hb)              # sorted queries: the binary searches walk hs in order (6x faster)
    pos = np.empty(len(b), dtype=np.int64)
    pos[ob] = np.searchsorted(hs, hb[ob])
    np.minimum(pos, len(hs) - 1, out=pos)
    cand = o[pos]
    ok = (hs[pos] == hb) & np.all(a[cand] == b, axis=1)
    return np.where(ok, cand, -1)


def _match_rows_sorted(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    _, inv = np.unique(np.concatenate([a, b]), axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    table = np.full(int(inv.max()) + 1, -1, dtype=np.int64)
    table[inv[: len(a)]] = np.arange(len(a), dtype=np.int64)
    return table[inv[len(a):]]


@njit(cache=True, nogil=True, inline="always")
def key_word(raw, b, nkey, w):
    """Word w of the key at raw[b:] as a little-endian u64, the bytes from nkey on (padding
    after the key's last field) read as zero (raw: 1-D uint8)."""
    left = nkey - 8 * w
    if left >= 8:
        return load_u64(raw, b + 8 * w)
    if left > 0:
        return load_u64(raw, b + 8 * w) & ((np.uint64(1) << np.uint64(8 * left)) - np.uint64(1))
    return np.uint64(0)


@njit(cache=True, nogil=True, inline="always")
def bswap64(v):
    """v with its bytes reversed (LLVM makes this one bswap): a little-endian loaded word in
    its bytes' lexicographic order."""
    return (((v & np.uint64(0xFF)) << np.uint64(56)) | ((v & np.uint64(0xFF00)) << np.uint64(40))
            | ((v & np.uint64(0xFF0000)) << np.uint64(24)) | ((v & np.uint64(0xFF000000)) << np.uint64(8))
            | ((v >> np.uint64(8)) & np.uint64(0xFF000000)) | ((v >> np.uint64(24)) & np.uint64(0xFF0000))
            | ((v >> np.uint64(40)) & np.uint64(0xFF00)) | (v >> np.uint64(56)))


@njit(cache=True, nogil=True, inline="always")
def _key_hash(raw, b, nkey):
    """The 40-byte key at raw[b:] with bytes from nkey on read as zero: its five
    little-endian words (as flow_key_words) and a 64-bit hash of them."""
    h = np.uint64(0)
    w0 = w1 = w2 = w3 = w4 = np.uint64(0)
    for w in range(5):
        v = key_word(raw, b, nkey, w)
        if w == 0:
            w0 = v
        elif w == 1:
            w1 = v
        elif w == 2:
            w2 = v
        elif w == 3:
            w3 = v
        else:
            w4 = v
        h = (h ^ v) * np.uint64(0x9E3779B97F4A7C15)
        h ^= h >> np.uint64(29)
    return w0, w1, w2, w3, w4, h


@njit(cache=True, nogil=True)
def _record_flows(raw, rs, nkey, rraw, rrs, out):
    """out[r] = the row of a flow table (raw: rows of rs bytes, key in the first nkey bytes,
    the rest of its 40 read as zero) whose key equals record r's 40 key bytes (rraw: rows
    of rrs bytes), else -1; of rows with equal keys the last (as match_rows). One pass over
    the rows' key bytes into an open-addressing table of (high hash bits, row + 1), then one
    probe per record: the row's key is read again only when the hash bits agree."""
    n = raw.shape[0] // rs if rs else 0
    bits = 10
    while (1 << bits) < 2 * n:
        bits += 1
    mask = (1 << bits) - 1
    table = np.zeros(1 << bits, dtype=np.int64)
    sh = np.uint64(64 - bits)
    for i in range(n):
        if i + 16 < n:
            prefetch_span(raw, (i + 16) * rs, nkey)
        a0, a1, a2, a3, a4, h = _key_hash(raw, i * rs, nkey)
        tag = np.int64(h >> np.uint64(32)) << 32
        s = np.int64(h >> sh)
        while True:
            t = table[s]
            if t == 0:
                table[s] = tag | (i + 1)
                break
            if (t >> 32) << 32 == tag:
                r = (t & 0xFFFFFFFF) - 1
                b0, b1, b2, b3, b4, _ = _key_hash(raw, r * rs, nkey)
                if a0 == b0 and a1 == b1 and a2 == b2 and a3 == b3 and a4 == b4:
                    table[s] = tag | (i + 1)
                    break
            s = (s + 1) & mask
    for q in range(out.shape[0]):
        a0, a1, a2, a3, a4, h = _key_hash(rraw, q * rrs, 40)
        tag = np.int64(h >> np.uint64(32)) << 32
        s = np.int64(h >> sh)
        out[q] = -1
        while True:
            t = table[s]
            if t == 0:
                break
            if (t >> 32) << 32 == tag:
                r = (t & 0xFFFFFFFF) - 1
                b0, b1, b2, b3, b4, _ = _key_hash(raw, r * rs, nkey)
                if a0 == b0 and a1 == b1 and a2 == b2 and a3 == b3 and a4 == b4:
                    out[q] = r
                    break
            s = (s + 1) & mask


@njit(cache=True, nogil=True, inline="always")
def _be_words(raw, b, nkey, out, i):
    """out[i] = the 40-byte key at raw[b:] (bytes from nkey on read as zero) as big-endian
    u64 words: comparing them word by word compares the key bytes."""
    for w in range(5):
        out[i, w] = bswap64(key_word(raw, b, nkey, w))


@njit(cache=True, nogil=True)
def _record_flows_merge(raw, rs, nkey, rraw, rrs, order, out):
    """record_flows of a flow table whose keys strictly increase (the loader's reads and row
    subsets of them): the records in key order (order) merged with the rows in one pass over
    the rows' key bytes. Returns False, out unfinished, at the first row not above the one
    before it."""
    n, m = raw.shape[0] // rs if rs else 0, order.shape[0]
    rw = np.empty((m, 5), dtype=np.uint64)
    for q in range(m):
        _be_words(rraw, q * rrs, 40, rw, q)
        out[q] = -1
    fw = np.zeros((2, 5), dtype=np.uint64)
    q = 0
    for i in range(n):
        if i + 16 < n:
            prefetch_span(raw, (i + 16) * rs, nkey)
        cw = i & 1
        _be_words(raw, i * rs, nkey, fw, cw)
        if i:
            c = 0
            for w in range(5):
                if fw[1 - cw, w] != fw[cw, w]:
                    c = -1 if fw[1 - cw, w] < fw[cw, w] else 1
                    break
            if c >= 0:
                return False
        while q < m:
            r = order[q]
            c = 0
            for w in range(5):
                if rw[r, w] != fw[cw, w]:
                    c = -1 if rw[r, w] < fw[cw, w] else 1
                    break
            if c > 0:
                break
            if c == 0:
                out[r] = i
            q += 1
    return True


def record_flows(flows: np.ndarray, recs: np.ndarray) -> np.ndarray:
    """For each message record (MSG_REC_DTYPE), the row of flows with its 40 key bytes, or
    -1: match_rows(flow_key_words(flows), the records' key words) without the key matrix
    (a strided copy of 40 bytes per row, then a sort of the flows' hashes: 85 ms at 524,288
    flows). A table sorted by key (a live read or delta, a parsed capture) is merged with
    the records sorted by key in one pass over its rows' key bytes; any other goes through
    a hash table built in one such pass."""
    n = len(recs)
    if not (flows.dtype == L.FLOW_DTYPE and flows.flags.c_contiguous and _KEY_PREFIX and len(flows) < 1 << 31
            and recs.dtype == L.MSG_REC_DTYPE and recs.dtype.fields["key"][1] == 0):
        rk = np.ascontiguousarray(recs["key"]).view(np.uint8).reshape(n, -1)[:, :40].copy().view("<u8").reshape(n, 5)
        return match_rows(flow_key_words(flows), rk)
    out = np.empty(n, dtype=np.int64)
    if not n:
        return out
    recs = np.ascontiguousarray(recs)
    raw, rraw = flows.view(np.uint8).reshape(-1), recs.view(np.uint8).reshape(-1)
    order = _key_order(rraw.reshape(n, -1)[:, :40])
    if not _record_flows_merge(raw, flows.dtype.itemsize, _KEY_PREFIX, rraw, recs.dtype.itemsize, order, out):
        _record_flows(raw, flows.dtype.itemsize, _KEY_PREFIX, rraw, recs.dtype.itemsize, out)
    return out


def events_from_records(flows: np.ndarray | None, recs: np.ndarray, flow: np.ndarray | None = None) -> np.ndarray:
    """MSG_REC_DTYPE records -> EVENT_DTYPE sorted by start_ts, with flow = row in flows
    (-1 when the flow is no longer in the table, e.g. evicted); `flow`: those rows when the
    caller has them (flows unused)."""
    n = len(recs)
    ev = np.zeros(n, dtype=L.EVENT_DTYPE)
    if n == 0:
        return ev
    ev["opclass"] = recs["opclass"]
    ev["start_ts"] = recs["start_ts"]
    ev["end_ts"] = recs["end_ts"]
    ev["bytes"] = recs["bytes"]
    ev["flow"] = record_flows(flows, recs) if flow is None else flow
    st = ev["start_ts"]
    if len(st) > 1 and np.any(st[1:] < st[:-1]):
        ev = ev[np.argsort(st, kind="stable")]
    return ev


def empty(meta: dict | None = None) -> Snapshot:
    return Snapshot(np.zeros(0, L.FLOW_DTYPE), np.zeros(0, L.EVENT_DTYPE),
                    np.zeros(L.G_N, np.uint64), dict(meta or {}))
