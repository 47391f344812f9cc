"""Offline path: a capture file -> the Snapshot the kernel data plane would have produced;
and the one reader of capture files (`skewscope replay` reads its frames here too).

    from skewscope.sources import offline
    snap = offline.parse_file("trace.pcap.gz")        # Snapshot(source="offline")
    pkts = offline.dissect("trace.pcap", limit=1000)  # per-packet parse (debugging, tests)
    for batch in offline.read_frames("trace.pcap"):   # the records as Ethernet frames
        batch.ts, batch.orig_len, batch.frame(0)

The file is streamed in chunks through numba kernels (skewscope/sources/offline/kernel.py): one
record walk for pcap (µs/ns magic, either byte order) or pcapng (SHB, IDB, EPB, SPB, the
obsolete PB; several interfaces, each with its own link type and if_tsresol), then either a
line-by-line mirror of ebpf/skewscope.bpf.c's parser and accounting (parse_file, dissect) or
a copy of each record as an Ethernet frame (read_frames). Link-type conventions (kernel.py
link_view): Ethernet (1) as is; Linux cooked v1 (113) / v2 (276) and raw IP (101, and
DLT_RAW 12/14) become an Ethernet frame with a synthesised 14-byte header (zero MACs, the
packet's EtherType), original lengths adjusted by the same difference; timestamps in ns.
gzip is read transparently. Memory is bounded by the chunk buffer, the flow table
(max_flows) and the message records (one per message). See docs/offline.md.

Bad input: a file that is not a capture, or of an unsupported link type, raises PcapError
(one line; the CLI prints it and exits 3). A capture that is damaged part-way (cut short by
a killed tcpdump, a corrupt record length, a broken gzip stream) is read up to the damage,
with the reason in meta["warnings"] (read_frames: FrameReader.warnings).
"""
from __future__ import annotations

import hashlib
import mmap
import os
import stat
import sys
import threading
import time
import zlib
from pathlib import Path

import numpy as np

from skewscope.core import layout as L
from skewscope.core.errors import PcapError
from skewscope.core.snapshot import Snapshot, flow_key_matrix, flows_from_raw
from skewscope.sources.offline import kernel as K

LINKTYPE_ETHERNET = 1
LINKTYPE_RAW = 101
LINKTYPE_LINUX_SLL = 113
LINKTYPE_LINUX_SLL2 = 276
LINKTYPE_ERF = 197
DLT_RAW_ALIASES = (12, 14)
SUPPORTED_LINKTYPES = {LINKTYPE_ETHERNET: "Ethernet", LINKTYPE_RAW: "raw IP", 12: "raw IP", 14: "raw IP",
                       LINKTYPE_LINUX_SLL: "Linux cooked v1", LINKTYPE_LINUX_SLL2: "Linux cooked v2"}
LINKTYPE_NAMES = {LINKTYPE_ERF: "ERF (native InfiniBand/DAG)", 247: "InfiniBand", 105: "802.11",
                  127: "802.11 radiotap", 0: "BSD loopback", 113: "Linux cooked v1"}

PCAP_MAGIC_US = 0xA1B2C3D4
PCAP_MAGIC_NS = 0xA1B23C4D
PCAPNG_SHB = 0x0A0D0D0A


def _check_linktype(path: str, lt: int) -> None:
    if lt not in SUPPORTED_LINKTYPES:
        name = LINKTYPE_NAMES.get(lt, f"link type {lt}")
        raise PcapError(f"{path}: unsupported link type {lt} ({name}); skewscope reads Ethernet, "
                        "Linux cooked (v1/v2) and raw IP captures of RoCE")


def _purge_stale_numba_cache() -> None:
    """numba's on-disk cache is keyed by kernel.py's source only; the layout constants it
    freezes into the compiled code come from layout.py. Drop the cache when the layout
    changed since it was built (called before the first kernel call loads anything)."""
    fp = hashlib.sha256()
    for k in sorted(dir(L)):
        if k.isupper():
            v = getattr(L, k)
            if isinstance(v, np.ndarray):
                v = v.tobytes().hex()
            elif isinstance(v, (set, frozenset)):
                v = sorted(v)
            fp.update(f"{k}={v!r};".encode())
    digest = fp.hexdigest()[:16]
    try:
        cache = Path(K.scan._cache._cache_path)
    except Exception:  # numba internals changed: fall back to the default location
        cache = Path(__file__).resolve().parent / "__pycache__"
    stamp = cache / "kernel.layout-fingerprint"
    try:
        if stamp.read_text() == digest:
            return
    except OSError:
        pass
    try:
        cache.mkdir(parents=True, exist_ok=True)
        for p in cache.glob("kernel.*.nb[ic]"):
            p.unlink()
        stamp.write_text(digest)
    except OSError:
        pass  # unwritable cache: numba will not write there either


_purge_stale_numba_cache()

__all__ = ["parse_file", "dissect", "read_frames", "FrameReader", "FrameBatch", "PcapError", "DEFAULT_CHUNK"]

DEFAULT_CHUNK = 16 << 20
DEFAULT_MAX_EVENTS = 1 << 23   # ~1 GB at peak in the worst case (one message per packet)
PROGRESS_MIN_BYTES = 64 << 20

_KIND = {LINKTYPE_ETHERNET: K.K_ETHERNET, LINKTYPE_RAW: K.K_RAW, LINKTYPE_LINUX_SLL: K.K_SLL,
         LINKTYPE_LINUX_SLL2: K.K_SLL2, **{a: K.K_RAW for a in DLT_RAW_ALIASES}}

#: per-packet dissection (dissect()): -1 where a field does not apply (frame not RoCE, no RETH...)
PACKET_DTYPE = np.dtype([
    ("ts", "<i8"), ("category", "<i8"), ("wire_len", "<i8"), ("opcode", "<i8"), ("dest_qp", "<i8"),
    ("psn", "<i8"), ("reth_len", "<i8"), ("payload", "<i8"), ("syndrome", "<i8"), ("fb", "<i8"),
    ("sport", "<i8"), ("tclass", "<i8"), ("ipver", "<i8"), ("roce", "<i8"),
    ("src", "u1", (16,)), ("dst", "u1", (16,)),
])


class _Tables:
    """The numba kernel's state arrays (see kernel.py's docstring), with growth."""

    def __init__(self, max_flows: int, packets: int = 0, max_events: int = 1 << 23):
        self.g = np.zeros(L.G_N, np.int64)
        self.st = np.zeros(K.ST_N, np.int64)
        st = self.st
        st[K.ST_MAXF] = max_flows
        st[K.ST_EVMAX] = max_events
        st[K.ST_HEAD] = st[K.ST_TAIL] = -1
        st[K.ST_FIRST_TS] = -1
        self._alloc_flows(min(max_flows, 4096))
        self.ev = np.zeros((max(1, min(1 << 16, max_events)), 5), np.int64)
        st[K.ST_EVCAP] = len(self.ev)
        self.ikeys = np.zeros((4096, 5), np.int64)
        st[K.ST_INSTCAP] = len(self.ikeys)
        self.pk = np.zeros((max(packets, 0), K.PK_N), np.int64)
        st[K.ST_PKCAP] = packets
        self.pk_limit = None

    def _alloc_flows(self, cap: int, old=None):
        hsize = 1 << max(4, int(2 * cap - 1).bit_length())
        self.hidx = np.zeros(hsize, np.int32)
        self.fhash = np.zeros(cap, np.int64)
        self.keys = np.zeros((cap, 5), np.int64)
        self.S = np.zeros((cap, K.NCOL), np.int64)
        self.lprev = np.full(cap, -1, np.int32)
        self.lnext = np.full(cap, -1, np.int32)
        self.finst = np.zeros(cap, np.int64)
        if old is not None:
            n = int(self.st[K.ST_NUSED])
            for name in ("fhash", "keys", "S", "lprev", "lnext", "finst"):
                getattr(self, name)[:n] = getattr(old, name)[:n]
        self.st[K.ST_CAP] = cap
        self.st[K.ST_HMASK] = hsize - 1
        K.rebuild_index(self.st, self.hidx, self.fhash)

    def grow(self):
        st = self.st
        if st[K.ST_NUSED] >= st[K.ST_CAP] and st[K.ST_CAP] < st[K.ST_MAXF]:
            old = _Old(self)
            self._alloc_flows(int(min(st[K.ST_MAXF], 2 * st[K.ST_CAP])), old)
        if st[K.ST_INSTN] >= st[K.ST_INSTCAP]:
            self.ikeys = np.concatenate([self.ikeys, np.zeros_like(self.ikeys)])
            st[K.ST_INSTCAP] = len(self.ikeys)
        if st[K.ST_EVN] >= st[K.ST_EVCAP] and st[K.ST_EVCAP] < st[K.ST_EVMAX]:
            grow = min(len(self.ev), int(st[K.ST_EVMAX]) - len(self.ev))
            self.ev = np.concatenate([self.ev, np.zeros((grow, 5), np.int64)])
            st[K.ST_EVCAP] = len(self.ev)
        if st[K.ST_PKCAP] > 0 and st[K.ST_PKN] >= st[K.ST_PKCAP]:
            if self.pk_limit is not None and st[K.ST_PKN] >= self.pk_limit:
                raise _Full()
            want = 2 * len(self.pk) if self.pk_limit is None else min(2 * len(self.pk), self.pk_limit)
            self.pk = np.concatenate([self.pk, np.zeros((want - len(self.pk), K.PK_N), np.int64)])
            st[K.ST_PKCAP] = len(self.pk)

    def args(self):
        return (self.g, self.st, self.hidx, self.fhash, self.keys, self.S, self.lprev, self.lnext,
                self.finst, self.ikeys, self.ev, self.pk, _OPTAB)


class _Old:
    def __init__(self, t: _Tables):
        for name in ("fhash", "keys", "S", "lprev", "lnext", "finst"):
            setattr(self, name, getattr(t, name))


_OPTAB = np.ascontiguousarray(L.OPCODE_TABLE, dtype=np.uint32)
_NO_IF = np.zeros(1, np.int64)


class _Full(Exception):
    """dissect(): the requested number of packets has been read."""


class _Stop(Exception):
    """Damage part-way through the file: keep what was read, warn."""


class _Gunzip:
    """gzip decompression that hands over every byte before a cut or corrupt stream (the
    gzip module loses the last buffer when it raises). Concatenated members are read in
    turn; zero padding after the last member is ignored, as gzip(1) does."""

    CHUNK = 1 << 20

    def __init__(self, raw):
        self.raw = raw
        self.d = zlib.decompressobj(31)
        self.buf = b""          # decompressed, not yet handed over
        self.inp = b""          # compressed, not yet given to the decompressor
        self.done = False
        self.error = None

    def _more(self) -> None:
        if not self.inp:
            self.inp = self.raw.read(self.CHUNK)
            if not self.inp:
                if not self.d.eof:
                    self.error = "gzip stream cut short (the file ends before the end-of-stream marker)"
                self.done = True
                return
        try:
            out = self.d.decompress(self.inp, self.CHUNK)
        except zlib.error as e:
            self.error = f"gzip stream corrupt ({e})"
            self.done = True
            return
        self.inp = self.d.unconsumed_tail
        self.buf += out
        if self.d.eof:
            rest = self.d.unused_data + self.inp
            self.inp = b""
            if rest.strip(b"\0"):
                if rest[:2] != b"\x1f\x8b":
                    self.error = "trailing garbage after the gzip stream"
                    self.done = True
                    return
                self.d = zlib.decompressobj(31)
                self.inp = rest
            else:
                tail = self.raw.read(self.CHUNK)
                if tail.strip(b"\0"):
                    self.d = zlib.decompressobj(31)
                    self.inp = tail
                else:
                    self.done = True

    def readinto(self, mv) -> int:
        n, want = 0, len(mv)
        while n < want:
            if self.buf:
                k = min(len(self.buf), want - n)
                mv[n:n + k] = self.buf[:k]
                self.buf = self.buf[k:]
                n += k
                continue
            if self.done:
                break
            self._more()
        if n == 0 and self.error:
            raise _Stop(self.error)
        return n


class _Prefixed:
    """An unseekable stream whose first 2 bytes were peeked at (read, readinto, tell)."""

    def __init__(self, raw):
        self.raw = raw
        self.head = b""
        while len(self.head) < 2:
            b = raw.read(2 - len(self.head))
            if not b:
                break
            self.head += b
        self.pending = self.head
        self.n = 0

    def read(self, n: int) -> bytes:
        if self.pending:
            out, self.pending = self.pending[:n], self.pending[n:]
        else:
            out = self.raw.read(n) or b""
        self.n += len(out)
        return out

    def readinto(self, mv) -> int:
        if self.pending:
            k = min(len(self.pending), len(mv))
            mv[:k] = self.pending[:k]
            self.pending = self.pending[k:]
            self.n += k
            return k
        n = self.raw.readinto(mv) or 0
        self.n += n
        return n

    def tell(self) -> int:
        return self.n


class _Source:
    """A capture file, gzip-decompressed when it starts with the gzip magic."""

    def __init__(self, path: str):
        self.path = path
        try:
            self.raw = open(path, "rb", buffering=0)
        except OSError as e:
            raise PcapError(f"{path}: {e.strerror or e}") from None
        try:
            st = os.fstat(self.raw.fileno())
            self.size = st.st_size
            self.regular = stat.S_ISREG(st.st_mode)
            if self.regular:
                head = self.raw.read(2)
                self.raw.seek(0)
                stream = self.raw
            else:  # a pipe or a device: no seeking back, hand the peeked bytes on
                stream = _Prefixed(self.raw)
                head = stream.head
        except OSError as e:
            self.raw.close()
            raise PcapError(f"{path}: {e.strerror or e}") from None
        self.gzip = head == b"\x1f\x8b"
        self.fh = _Gunzip(stream) if self.gzip else stream
        self.total_out = 0

    def readinto(self, mv) -> int:
        try:
            n = self.fh.readinto(mv)
        except OSError as e:
            raise _Stop(f"read error after {self.total_out} bytes ({e.strerror or e})") from None
        n = n or 0
        self.total_out += n
        return n

    def consumed(self) -> int:
        try:
            return self.raw.tell()
        except (OSError, ValueError):
            return 0

    def close(self):
        self.raw.close()


class _Buffer:
    """A growable read buffer over a _Source: data in buf[pos:fill]."""

    def __init__(self, src: _Source, size: int):
        self.src = src
        self.buf = np.empty(size, np.uint8)
        self.pos = 0
        self.fill = 0
        self.eof = False
        self.error: _Stop | None = None
        self.base = 0   # file (decompressed) offset of buf[0]

    def refill(self, need: int = 0) -> None:
        """Move the unread tail to the front and read until the buffer is full (or EOF);
        make room for at least `need` unread bytes."""
        rem = self.fill - self.pos
        if need > len(self.buf):
            nb = np.empty(max(need, 2 * len(self.buf)), np.uint8)
            nb[:rem] = self.buf[self.pos:self.fill]
            self.buf = nb
        elif rem and self.pos:
            self.buf[:rem] = self.buf[self.pos:self.fill]
        self.base += self.pos
        self.pos, self.fill = 0, rem
        mv = memoryview(self.buf)
        while self.fill < len(self.buf) and not self.eof:
            try:
                n = self.src.readinto(mv[self.fill:])
            except _Stop as e:
                # hand over what was read; the error surfaces when the data runs out
                self.error = e
                n = 0
            if n == 0:
                self.eof = True
            self.fill += n

    def ensure(self, n: int) -> bool:
        """At least n unread bytes available (False at EOF)."""
        if self.fill - self.pos < n and not self.eof:
            self.refill(n)
        return self.fill - self.pos >= n

    def avail(self) -> int:
        return self.fill - self.pos

    def consumed(self) -> int:
        return self.src.consumed()

    def close(self) -> None:
        pass


class _MapBuffer:
    """The same interface as _Buffer over an uncompressed regular file, without copying:
    windows of the file are mapped read-only (MAP_POPULATE: the page-cache pages are wired
    in one go) and scanned in place. Reads the file as long as it was when opened.

    While the scanner works on one window (numba, without the GIL) a helper thread maps the
    next one and unmaps the previous one: wiring and unwiring the pages is kernel work,
    0.13 s per 1.5 GB here, that then runs on another CPU instead of between two scans. The
    next window starts PREFETCH_BACK bytes (at most a quarter window) before the current one
    ends, where the scanner stops at the first record it cannot see whole; a refill that it
    does not cover (a record longer than that) maps its window in place, as without the
    helper."""

    PREFETCH_BACK = 1 << 20

    def __init__(self, src: _Source, size: int):
        self.src = src
        self.fd = src.raw.fileno()
        self.size = src.size
        self.win = max(mmap.PAGESIZE, size // mmap.PAGESIZE * mmap.PAGESIZE)
        self.mm = None
        self.buf = np.zeros(0, np.uint8)
        self.pos = self.fill = self.base = 0
        self.eof = self.size == 0
        self.error: _Stop | None = None
        self._helper: threading.Thread | None = None
        self._next: tuple[int, int, mmap.mmap | None] | None = None   # (offset, length, map)

    def _map(self, offset: int, length: int) -> mmap.mmap:
        return mmap.mmap(self.fd, length, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
                         prot=mmap.PROT_READ, offset=offset)

    def _work(self, offset: int, length: int, old: mmap.mmap | None) -> None:
        if old is not None:
            _close_map(old)
        try:
            self._next = (offset, length, self._map(offset, length))
        except (OSError, ValueError, OverflowError):
            self._next = None   # the refill maps in place (and reports what went wrong)

    def _join(self) -> tuple[int, int, mmap.mmap | None] | None:
        if self._helper is not None:
            self._helper.join()
            self._helper = None
        nxt, self._next = self._next, None
        return nxt

    def _unmap(self) -> None:
        self.buf = np.zeros(0, np.uint8)
        if self.mm is not None:
            _close_map(self.mm)
            self.mm = None

    def refill(self, need: int = 0) -> None:
        start = self.base + self.pos
        aligned = start - start % mmap.PAGESIZE
        length = min(max(self.win, need + start - aligned), self.size - aligned)
        nxt = self._join()
        self.buf = np.zeros(0, np.uint8)
        old, self.mm = self.mm, None
        if nxt is not None and nxt[0] <= start and start + max(need, 1) <= nxt[0] + nxt[1]:
            aligned, length, self.mm = nxt
        else:
            if nxt is not None:
                _close_map(nxt[2])
            if old is not None:
                _close_map(old)
                old = None
            if length > 0:
                self.mm = self._map(aligned, length)
        if self.mm is not None:
            self.buf = np.frombuffer(self.mm, np.uint8)
        self.base, self.pos, self.fill = aligned, start - aligned, max(length, 0)
        self.eof = aligned + length >= self.size
        self.src.total_out = aligned + self.fill
        # the next window, mapped meanwhile (and the previous one unmapped)
        if not self.eof:
            off = aligned + max(self.fill - min(self.PREFETCH_BACK, self.win // 4), 0)
            off -= off % mmap.PAGESIZE
            if off > aligned:
                n = min(self.win, self.size - off)
                self._helper = threading.Thread(target=self._work, args=(off, n, old), daemon=True)
                self._helper.start()
                old = None
        if old is not None:
            _close_map(old)

    def ensure(self, n: int) -> bool:
        if self.fill - self.pos < n and not self.eof:
            self.refill(n)
        return self.fill - self.pos >= n

    def avail(self) -> int:
        return self.fill - self.pos

    def consumed(self) -> int:
        return self.base + self.pos

    def close(self) -> None:
        nxt = self._join()
        if nxt is not None:
            _close_map(nxt[2])
        self._unmap()


def _close_map(mm: mmap.mmap) -> None:
    try:
        mm.close()
    except BufferError:   # an array still refers to the window: the GC will unmap it
        pass


def _u32(b: np.ndarray, o: int, big: bool) -> int:
    return int.from_bytes(b[o:o + 4].tobytes(), "big" if big else "little")


def _u16(b: np.ndarray, o: int, big: bool) -> int:
    return int.from_bytes(b[o:o + 2].tobytes(), "big" if big else "little")


class _Run:
    """One pass over one file."""

    def __init__(self, path: str, max_flows: int, chunk: int, packets: int, progress: bool,
                 max_events: int = 1 << 23, frames: int = 0):
        self.path = path
        # frames > 0: copy records out as Ethernet frames, batches of at most `frames`
        # (read_frames); else parse and account them into the tables
        self.frames = frames
        self.strict = False   # damage part-way: PcapError instead of a warning
        self.t = None if frames else _Tables(max_flows, packets, max_events)
        self.st = np.zeros(K.ST_N, np.int64) if frames else self.t.st
        if frames:
            self._new_batch(FRAME_BYTES)
        self.warnings: list[str] = []
        self.fmt = None
        self.linktypes: set[int] = set()
        self.unsupported: dict[int, int] = {}   # link type -> interfaces declared
        self.skipped_blocks: dict[int, int] = {}
        self.sections = 0
        self.chunk = chunk
        self.progress = progress
        self.packets_limit = packets

    # -- driver ------------------------------------------------------------------------
    def run(self) -> None:
        for _ in self.walk():
            pass

    def walk(self):
        """Read the file; in frames mode, yield FrameBatch-es (the last one after the
        damage warning, if any, is recorded)."""
        src = _Source(self.path)
        self.src = src
        bar = None
        try:
            self.b = None
            if not src.gzip and src.regular and src.size > 0:
                try:
                    self.b = _MapBuffer(src, self.chunk)
                    self.b.refill()
                except (OSError, ValueError, OverflowError):
                    self.b = None
            if self.b is None:
                self.b = _Buffer(src, self.chunk)
                self.b.refill()
            if self.b.avail() == 0 and self.b.error is not None:
                raise PcapError(f"{self.path}: not a readable capture: {self.b.error}")
            self._open()
            if self.progress and not _parser_compiled():
                print("skewscope: compiling the offline parser (first run only: ~15-30 s, cached afterwards)",
                      file=sys.stderr, flush=True)
            if self.progress and src.size >= PROGRESS_MIN_BYTES:
                bar = _Progress(self.path, src.size)
                self.bar = bar
            else:
                self.bar = None
            try:
                if self.fmt == "pcap":
                    yield from self._run_pcap()
                else:
                    yield from self._run_pcapng()
            except _Stop as e:
                if self.strict:
                    raise PcapError(f"{self.path}: capture truncated or damaged: {e} (replay needs the whole "
                                    "capture; `skewscope report` reads up to the damage)") from None
                self.warnings.append(f"{self.path}: {e}; the report covers the "
                                     f"{int(self.st[K.ST_RECORDS])} records before it")
            if self.frames and self.n:
                yield self._take()
            self._finish()
        finally:
            if bar is not None:
                bar.close()
            if getattr(self, "b", None) is not None:
                self.b.close()
            src.close()

    def _tick(self):
        if self.bar is not None:
            self.bar.update(self.b.consumed())

    def _open(self) -> None:
        b = self.b
        if b.avail() == 0:
            raise PcapError(f"{self.path}: empty file")
        if b.avail() < 4:
            raise PcapError(f"{self.path}: too short to be a capture")
        m_le = _u32(b.buf, 0, False)
        m_be = _u32(b.buf, 0, True)
        if m_le == PCAPNG_SHB:
            self.fmt = "pcapng"
            return
        if m_le in (PCAP_MAGIC_US, PCAP_MAGIC_NS):
            big = False
        elif m_be in (PCAP_MAGIC_US, PCAP_MAGIC_NS):
            big = True
        else:
            what = " (gzip-compressed)" if self.src.gzip else ""
            raise PcapError(f"{self.path}{what}: not a pcap or pcapng file (magic 0x{m_le:08x})")
        if b.avail() < 24:
            raise PcapError(f"{self.path}: truncated pcap header")
        self.fmt = "pcap"
        self.big = big
        self.ts_mult = 1 if _u32(b.buf, 0, big) == PCAP_MAGIC_NS else 1000
        lt = _u32(b.buf, 20, big) & 0x0FFFFFFF
        _check_linktype(self.path, lt)
        self.linktypes.add(lt)
        self.kind = _KIND[lt]
        b.pos = 24

    def _scan(self, fmt: int, ts_mult: int, kind: int, if_kind, if_res, if_snap, n_if: int) -> int:
        """One scanner call from b.pos (the accounting one, or the frame copier in frames
        mode); grows the tables / hands over a full batch as needed. Returns the status."""
        b = self.b
        if self.frames:
            pos, status, n, o = K.scan_frames(b.buf, b.pos, b.fill, fmt, self.big, ts_mult, kind, if_kind, if_res,
                                              if_snap, n_if, self.st, self.rec, self.n, self.out, self.o)
            self.n, self.o = int(n), int(o)
        else:
            pos, status = K.scan(b.buf, b.pos, b.fill, fmt, self.big, ts_mult, kind, if_kind, if_res, if_snap, n_if,
                                 *self.t.args())
        b.pos = int(pos)
        if status == K.S_GROW:
            self.t.grow()
        elif status == K.S_FULL and self.n == 0:   # one frame larger than the batch buffer
            self._new_batch(2 * len(self.out))
        return int(status)

    def _new_batch(self, nbytes: int) -> None:
        self.rec = np.empty((self.frames, 4), np.int64)
        self.out = np.empty(nbytes, np.uint8)
        self.n = self.o = 0

    def _take(self) -> FrameBatch:
        rec = self.rec[:self.n]
        batch = FrameBatch(rec[:, 0], rec[:, 1], rec[:, 2], rec[:, 3], self.out[:self.o])
        self._new_batch(max(FRAME_BYTES, len(self.out)))
        return batch

    def _run_pcap(self):
        b = self.b
        while True:
            status = self._scan(K.FMT_PCAP, self.ts_mult, self.kind, _NO_IF, _NO_IF, _NO_IF, 0)
            if status == K.S_GROW:
                continue
            if status == K.S_FULL:
                if self.n:
                    yield self._take()
                continue
            if status == K.S_BAD_RECLEN:
                incl = _u32(b.buf, b.pos + 8, self.big)
                raise _Stop(f"record {int(self.st[K.ST_RECORDS]) + 1} (file offset {b.base + b.pos}) claims "
                            f"{incl} captured bytes, more than any capture holds: the file is corrupt there")
            # need data
            self._tick()
            if b.eof:
                if b.error is not None:
                    raise b.error
                if b.avail():
                    raise _Stop(f"the file ends inside record {int(self.st[K.ST_RECORDS]) + 1} "
                                f"({b.avail()} bytes of it present; capture cut short?)")
                return
            need = 16
            if b.avail() >= 16:
                need = 16 + _u32(b.buf, b.pos + 8, self.big)
            b.refill(need)

    # -- pcapng --------------------------------------------------------------------------
    def _run_pcapng(self):
        b = self.b
        self.big = False
        self.ifaces: list[tuple[int, int, int, int]] = []  # (link type, kind, tsresol, snaplen)
        self._if_arrays()
        while True:
            status = self._scan(K.FMT_PCAPNG, 1, 0, self.if_kind, self.if_res, self.if_snap, len(self.ifaces))
            if status == K.S_GROW:
                continue
            if status == K.S_FULL:
                if self.n:
                    yield self._take()
                continue
            if status == K.S_PYBLOCK:
                self._py_block()
                continue
            if status == K.S_BAD_BLOCK:
                raise _Stop(f"corrupt pcapng block at file offset {b.base + b.pos}")
            if status == K.S_BAD_IFACE:
                raise _Stop(f"packet block at file offset {b.base + b.pos} refers to interface "
                            f"{int(self.st[K.ST_STOP_IF])}, which the file never declared: corrupt")
            self._tick()
            if b.eof:
                if b.error is not None:
                    raise b.error
                if b.avail():
                    raise _Stop(f"the file ends inside a pcapng block at offset {b.base + b.pos} "
                                f"({b.avail()} bytes of it present; capture cut short?)")
                return
            need = 12
            if b.avail() >= 8:
                blen = _u32(b.buf, b.pos + 4, self.big)
                if 12 <= blen <= K.MAX_BLOCK:
                    need = blen
            b.refill(need)

    def _if_arrays(self):
        n = max(1, len(self.ifaces))
        self.if_kind = np.full(n, K.K_UNSUPPORTED, np.int64)
        self.if_res = np.zeros(n, np.int64)
        self.if_snap = np.zeros(n, np.int64)
        for i, (_lt, kind, res, snap) in enumerate(self.ifaces):
            self.if_kind[i] = kind
            self.if_res[i] = res
            self.if_snap[i] = snap

    def _py_block(self) -> None:
        """SHB or IDB at b.pos (whole block made available here)."""
        b = self.b
        if not b.ensure(12):
            raise b.error or _Stop(f"the file ends inside a pcapng block header at offset {b.base + b.pos}")
        btype = _u32(b.buf, b.pos, False)
        if btype == PCAPNG_SHB:
            bom = b.buf[b.pos + 8:b.pos + 12].tobytes()
            if bom == b"\x4d\x3c\x2b\x1a":
                big = False
            elif bom == b"\x1a\x2b\x3c\x4d":
                big = True
            else:
                if self.sections == 0:
                    raise PcapError(f"{self.path}: bad pcapng byte-order magic")
                raise _Stop(f"bad pcapng byte-order magic in the section header at offset {b.base + b.pos}")
            self.big = big
        blen = _u32(b.buf, b.pos + 4, self.big)
        if blen < 12 or blen % 4 or blen > K.MAX_BLOCK:
            if self.sections == 0 and btype == PCAPNG_SHB:
                raise PcapError(f"{self.path}: corrupt pcapng section header (block length {blen})")
            raise _Stop(f"corrupt pcapng block length {blen} at file offset {b.base + b.pos}")
        if not b.ensure(blen):
            raise b.error or _Stop(f"the file ends inside a pcapng block at offset {b.base + b.pos}")
        o = b.pos
        if _u32(b.buf, o + blen - 4, self.big) != blen:
            raise _Stop(f"corrupt pcapng block at file offset {b.base + o} (trailing length mismatch)")
        body, end = o + 8, o + blen - 4
        if btype == PCAPNG_SHB:
            self.sections += 1
            self.ifaces = []
        else:  # IDB
            if body + 8 > end:
                raise _Stop(f"truncated interface description block at file offset {b.base + o}")
            lt = _u16(b.buf, body, self.big)
            snap = _u32(b.buf, body + 4, self.big)
            res = 6
            p = body + 8
            while p + 4 <= end:
                code = _u16(b.buf, p, self.big)
                olen = _u16(b.buf, p + 2, self.big)
                if code == 0:
                    break
                if code == 9 and olen >= 1 and p + 5 <= end:
                    res = int(b.buf[p + 4])
                p += 4 + ((olen + 3) & ~3)
            kind = _KIND.get(lt, K.K_UNSUPPORTED)
            if kind == K.K_UNSUPPORTED:
                self.unsupported[lt] = self.unsupported.get(lt, 0) + 1
            else:
                self.linktypes.add(lt)
            self.ifaces.append((lt, kind, res, snap))
        self._if_arrays()
        b.pos = o + blen

    # -- result --------------------------------------------------------------------------
    def _finish(self) -> None:
        """At the end of the file: refuse a file whose only packets are on interfaces of an
        unsupported link type; warn about skipped packets and unknown blocks."""
        st = self.st
        skipped = int(st[K.ST_SKIP_LT])
        if skipped:
            names = ", ".join(f"{lt} ({LINKTYPE_NAMES.get(lt, 'link type %d' % lt)})" for lt in sorted(self.unsupported))
            if int(st[K.ST_RECORDS]) == 0:
                lt = min(self.unsupported) if self.unsupported else -1
                _check_linktype(self.path, lt)  # raises the refusal
            self.warnings.append(f"{self.path}: skipped {skipped} packets on interfaces of unsupported link "
                                 f"type {names}")
        if st[K.ST_UNKNOWN_BLOCKS]:
            self.warnings.append(f"{self.path}: skipped {int(st[K.ST_UNKNOWN_BLOCKS])} pcapng blocks of unknown type "
                                 f"(last: 0x{int(st[K.ST_UNKNOWN_TYPE]):08x})")

    def snapshot(self, seconds: float) -> Snapshot:
        t = self.t
        st, g = t.st, t.g
        skipped = int(st[K.ST_SKIP_LT])
        lost = int(st[K.ST_EVLOST])
        if lost:
            self.warnings.append(f"{self.path}: kept the first {int(st[K.ST_EVMAX])} message records, "
                                 f"{lost} more not kept (max_events; counters are complete)")
        n = int(st[K.ST_NUSED])
        keys40 = np.ascontiguousarray(t.keys[:n]).astype("<i8").view(np.uint8).reshape(n, 40)
        stats = np.zeros(n, L.FLOW_STATS_DTYPE)
        for name, (c, w) in K.STAT_COLS.items():
            col = t.S[:n, c:c + w]
            stats[name] = (col[:, 0] if w == 1 else col).astype(stats.dtype[name].base)
        flows = flows_from_raw(keys40, stats.view(np.uint8).reshape(n, L.FLOW_STATS_DTYPE.itemsize))
        events = _events(flows, t.ikeys[:int(st[K.ST_INSTN])], t.ev[:int(st[K.ST_EVN])])
        glob = g.astype(np.uint64)
        created = int(g[L.G_FLOWS_CREATED])
        first = int(st[K.ST_FIRST_TS])
        last = int(st[K.ST_LAST_TS])
        frames = int(st[K.ST_RECORDS])
        meta = {
            "source": "offline",
            "file": os.path.abspath(self.path),
            "format": self.fmt,
            "compressed": "gzip" if self.src.gzip else None,
            "linktypes": sorted(self.linktypes),
            "clock": "pcap",
            "frames": frames,
            "snaplen_cut_records": int(st[K.ST_CUT]),
            "first_ts": first if first >= 0 else 0,
            "last_ts": last if frames else 0,
            "duration_s": ((last - first) / 1e9) if frames else 0.0,
            "max_flows": int(st[K.ST_MAXF]),
            "sample_n": 1,
            "flows_present": n,
            "flows_created": created,
            "flows_evicted": max(0, created - n),
            "events_lost": lost,
            "parse_seconds": seconds,
            "bytes_read": int(self.src.total_out),
            "warnings": list(self.warnings),
        }
        if self.fmt == "pcapng":
            meta["pcapng_sections"] = self.sections
            if skipped:
                meta["skipped_unsupported_linktype"] = skipped
        return Snapshot(flows=flows, events=events, globals=glob, meta=meta)


def _events(flows: np.ndarray, ikeys: np.ndarray, ev: np.ndarray) -> np.ndarray:
    """Message records -> EVENT_DTYPE with flow = row of the record's key in `flows` (-1 when
    that key is not in the table: evicted), sorted by start_ts (stable), exactly as
    snapshot.events_from_records does for the kernel's records; matched per flow instance
    (few) instead of per record (many)."""
    n = len(ev)
    out = np.zeros(n, dtype=L.EVENT_DTYPE)
    if n == 0:
        return out
    fk = flow_key_matrix(flows).view("<i8").reshape(len(flows), 5)
    ik = np.ascontiguousarray(ikeys).astype("<i8")
    allk = np.concatenate([fk, ik])
    _, inv = np.unique(allk, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    table = np.full(int(inv.max()) + 1, -1, dtype=np.int32)
    table[inv[:len(fk)]] = np.arange(len(fk), dtype=np.int32)
    inst_row = table[inv[len(fk):]]
    out["flow"] = inst_row[ev[:, 0]]
    out["opclass"] = ev[:, 1]
    out["start_ts"] = ev[:, 2]
    out["end_ts"] = ev[:, 3]
    out["bytes"] = ev[:, 4]
    order = np.argsort(out["start_ts"], kind="stable")
    return out[order]


class _Progress:
    def __init__(self, path: str, total: int):
        from rich.console import Console  # heavy (rich): only when drawing
        from rich.progress import (  # heavy (rich): only when drawing
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )
        self.p = Progress(TextColumn("[bold]reading[/bold] {task.description}"), BarColumn(), DownloadColumn(),
                          TransferSpeedColumn(), TimeRemainingColumn(), console=Console(stderr=True),
                          transient=True)
        self.p.start()
        self.task = self.p.add_task(os.path.basename(path), total=total)

    def update(self, done: int):
        self.p.update(self.task, completed=done)

    def close(self):
        self.p.stop()


def _parser_compiled() -> bool:
    """True when the parser is compiled in this process or in numba's on-disk cache (so the
    first call will not spend ~15-30 s compiling), or precompiled (skewscope.core.aot)."""
    if K.scan.aot_keys() or K.scan.signatures:
        return True
    try:
        return bool(K.scan.dispatcher._cache._cache_file._load_index())
    except Exception:  # numba internals: when in doubt, say nothing
        return True


def _check_max_flows(max_flows) -> int:
    if isinstance(max_flows, bool) or not isinstance(max_flows, (int, np.integer)) or not 1 <= max_flows <= 1 << 24:
        raise ValueError(f"max_flows must be an integer in 1..{1 << 24}, not {max_flows!r}")
    return int(max_flows)


def parse_file(path, progress: bool = False, max_flows: int = 65536, chunk_bytes: int = DEFAULT_CHUNK,
               max_events: int = DEFAULT_MAX_EVENTS) -> Snapshot:
    """Read a pcap/pcapng capture (optionally gzip-compressed) and return the Snapshot the
    kernel data plane would have produced for it (source "offline"; see docs/offline.md).

    max_flows bounds the flow table (least recently used flows are evicted, as the kernel's
    LRU map does); max_events bounds the message records kept (the first ones; the rest are
    counted in meta["events_lost"], like the kernel's record ring). progress: a rich bar on
    stderr for large files.

    Raises PcapError (one-line message) for a file that cannot be read as a capture.
    Damage part-way through gives the Snapshot of what came before, with meta["warnings"]."""
    path = os.fspath(path)
    if isinstance(max_events, bool) or not isinstance(max_events, (int, np.integer)) or max_events < 0:
        raise ValueError(f"max_events must be an integer >= 0, not {max_events!r}")
    run = _Run(path, _check_max_flows(max_flows), max(1 << 16, int(chunk_bytes)), 0, progress, int(max_events))
    t0 = time.perf_counter()
    run.run()
    return run.snapshot(time.perf_counter() - t0)


def dissect(path, limit: int | None = None, max_flows: int = 65536) -> np.ndarray:
    """Per-packet parse of the first `limit` records (all when None), PACKET_DTYPE: what the
    parser read from each frame and the category it was counted in. For tests and debugging
    (holds every row in memory)."""
    path = os.fspath(path)
    limit = None if limit is None else max(0, int(limit))
    if limit == 0:
        return np.zeros(0, PACKET_DTYPE)
    run = _Run(path, _check_max_flows(max_flows), DEFAULT_CHUNK, min(1 << 12, limit or 1 << 12), False)
    run.t.pk_limit = limit
    try:
        run.run()
    except _Full:
        pass
    rows = run.t.pk[:int(run.t.st[K.ST_PKN])]
    out = np.zeros(len(rows), PACKET_DTYPE)
    for name, col in (("ts", K.PK_TS), ("category", K.PK_CAT), ("wire_len", K.PK_WIRE), ("opcode", K.PK_OPCODE),
                      ("dest_qp", K.PK_QP), ("psn", K.PK_PSN), ("reth_len", K.PK_RETH), ("payload", K.PK_PAYLOAD),
                      ("syndrome", K.PK_SYND), ("fb", K.PK_FB), ("sport", K.PK_SPORT), ("tclass", K.PK_TCLASS),
                      ("ipver", K.PK_IPVER), ("roce", K.PK_ROCE)):
        out[name] = rows[:, col]
    addr = np.ascontiguousarray(rows[:, K.PK_W0:K.PK_W3 + 1]).astype("<i8").view(np.uint8).reshape(len(rows), 32)
    roce = out["roce"] >= 0
    out["src"][roce] = addr[roce, :16]
    out["dst"][roce] = addr[roce, 16:]
    return out


FRAME_BATCH = 8192           # records per FrameBatch at most
FRAME_BYTES = 4 << 20        # and frame bytes per batch (grows for a larger single frame)


class FrameBatch:
    """Consecutive records of a capture as Ethernet frames (read_frames): numpy int64 arrays
    ts (ns), orig_len (the Ethernet frame's length on the wire, >= caplen), caplen (bytes
    captured) and offset (of each frame in data, uint8, the frames back to back). A record
    too short for its link-layer header is an empty frame (a too short Ethernet record keeps
    its bytes); every record is there, none dropped."""

    __slots__ = ("ts", "orig_len", "caplen", "offset", "data")

    def __init__(self, ts, orig_len, caplen, offset, data):
        self.ts, self.orig_len, self.caplen, self.offset, self.data = ts, orig_len, caplen, offset, data

    def __len__(self) -> int:
        return len(self.ts)

    def frame(self, i: int) -> np.ndarray:
        """The captured bytes of record i (a view into data)."""
        o = int(self.offset[i])
        return self.data[o:o + int(self.caplen[i])]

    def __iter__(self):
        """(ts_ns, orig_len, frame bytes) per record: convenient, not fast."""
        for i, (ts, orig) in enumerate(zip(self.ts.tolist(), self.orig_len.tolist())):
            yield ts, orig, self.frame(i).tobytes()


class FrameReader:
    """Iterating yields FrameBatch-es in file order (one pass). Raises PcapError (one line)
    for a file that cannot be read as a capture; damage part-way ends the iteration after
    the records before it, with the reason in `warnings` (strict: raises PcapError there,
    after the batches before it). After the iteration: warnings, format ("pcap"/"pcapng"),
    linktypes, compressed ("gzip" or None)."""

    def __init__(self, path, batch: int = FRAME_BATCH, strict: bool = False, chunk_bytes: int = DEFAULT_CHUNK):
        self.path = os.fspath(path)
        self._run = _Run(self.path, 1, max(1 << 16, int(chunk_bytes)), 0, False, 1, frames=max(1, int(batch)))
        self._run.strict = bool(strict)
        self.warnings = self._run.warnings
        self._used = False

    def __iter__(self):
        if self._used:
            raise RuntimeError("a FrameReader reads its file once")
        self._used = True
        yield from self._run.walk()

    @property
    def format(self) -> str | None:
        return self._run.fmt

    @property
    def linktypes(self) -> list[int]:
        return sorted(self._run.linktypes)

    @property
    def compressed(self) -> str | None:
        src = getattr(self._run, "src", None)
        return "gzip" if src is not None and src.gzip else None


def read_frames(path, batch: int = FRAME_BATCH, strict: bool = False) -> FrameReader:
    """The records of a pcap/pcapng capture (optionally gzip-compressed) as Ethernet frames,
    in batches (FrameBatch) of at most `batch` records: what `skewscope replay` hands the
    kernel. The same reader as parse_file: same formats, link-type conventions, errors and
    warnings (FrameReader.warnings); strict: a capture damaged part-way raises PcapError
    (after the batches before the damage) instead of a warning."""
    return FrameReader(path, batch, strict)
