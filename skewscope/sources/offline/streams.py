"""Reading a capture file's bytes: gzip decompression that hands over every byte before a
cut or corrupt stream (_Gunzip), pipes (_Prefixed), the file (_Source) and the two read
buffers the record scanners walk -- a growable copy (_Buffer) and read-only mmap windows of
an uncompressed regular file, the next one mapped by a helper thread (_MapBuffer). Damage
part-way is _Stop (the run keeps what was read and warns)."""
from __future__ import annotations

import mmap
import os
import queue
import stat
import threading
import zlib

import numpy as np

from skewscope.core.errors import PcapError


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
    next DEPTH ones and unmaps the previous one: wiring and unwiring the pages is kernel work,
    0.13-0.18 s per 1.5 GB here, that then runs on another CPU instead of between two scans. The
    helper is one thread for the whole file, handed its work through a queue: starting a
    thread per window made each refill wait until the new thread ran, ~1 ms when the parse
    threads hold both CPUs. Each window starts PREFETCH_BACK bytes (at most a quarter
    window) before the one before it ends, where the scanner stops at the first record it
    cannot see whole; a refill that the next prefetched window does not cover (a record longer
    than that) maps its window in place, as without the helper, and the windows ahead are
    dropped and prefetched again from there.

    DEPTH 2 (two windows ahead, at most 4 x 16 MiB mapped: the scanned one, two ahead, the one
    being unmapped) rather than 1: with three busy threads on two CPUs the helper is not always
    on a CPU when the scanner hands it a window; one window ahead left the scanner waiting for
    it (`report --json` on the 10.6 M-frame capture alternated with the code that mapped one window
    ahead, 2026-12-06, median of 102 paired runs -20.5 ms; docs/offline.md "The mapped capture in a
    fresh process").
    For the same reason the helper hands a window over before it unmaps the one the scanner left."""

    PREFETCH_BACK = 1 << 20
    DEPTH = 2

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
        self._helper: threading.Thread | None = None   # started by the first prefetch
        self._todo: queue.SimpleQueue = queue.SimpleQueue()   # (offset, length, old map) or None: stop
        self._done: queue.SimpleQueue = queue.SimpleQueue()   # (offset, length, map) or None: map in place
        self._pending = 0       # prefetches handed to the helper and not yet taken (their results in order)
        self._next: tuple[int, int] | None = None   # the window to prefetch after the last one handed over

    def _map(self, offset: int, length: int) -> mmap.mmap:
        return mmap.mmap(self.fd, length, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
                         prot=mmap.PROT_READ, offset=offset)

    def _work(self, offset: int, length: int, old: mmap.mmap | None) -> tuple[int, int, mmap.mmap] | None:
        try:
            return offset, length, self._map(offset, length)
        except (OSError, ValueError, OverflowError):
            return None   # the refill maps in place (and reports what went wrong)

    def _serve(self) -> None:
        while True:
            item = self._todo.get()
            if item is None:
                return
            try:
                out = self._work(*item)
            except Exception:   # never leave the refill waiting: it maps in place (and raises there)
                out = None
            self._done.put(out)
            if item[2] is not None:   # the window the scanner left: unmapped after the next is handed over
                _close_map(item[2])

    def _prefetch(self, offset: int, length: int, old: mmap.mmap | None) -> None:
        if self._helper is None:
            self._helper = threading.Thread(target=self._serve, name="skewscope-map", daemon=True)
            self._helper.start()
        self._todo.put((offset, length, old))
        self._pending += 1

    def _join(self) -> tuple[int, int, mmap.mmap | None] | None:
        if not self._pending:
            return None
        self._pending -= 1
        return self._done.get()

    def _drop_pending(self) -> None:
        while self._pending:
            nxt = self._join()
            if nxt is not None:
                _close_map(nxt[2])
        self._next = None

    def _following(self, offset: int, length: int) -> tuple[int, int] | None:
        """The window after [offset, offset + length): it starts PREFETCH_BACK (at most a quarter
        window) before that one ends, where the scanner stops at the first record it cannot see whole."""
        if offset + length >= self.size:
            return None
        off = offset + max(length - min(self.PREFETCH_BACK, self.win // 4), 0)
        off -= off % mmap.PAGESIZE
        if off <= offset:
            return None
        return off, min(self.win, self.size - off)

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
            self._drop_pending()   # the chain of windows ahead assumed this one: start it again
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
        # the next windows, mapped meanwhile (and the previous one unmapped)
        if self._next is None and not self._pending:
            self._next = self._following(aligned, max(length, 0))
        while self._pending < self.DEPTH and self._next is not None:
            off, n = self._next
            self._prefetch(off, n, old)
            old = None
            self._next = self._following(off, n)
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
        self._drop_pending()
        if self._helper is not None:
            self._todo.put(None)
            self._helper.join()
            self._helper = None
        self._unmap()


def _close_map(mm: mmap.mmap) -> None:
    try:
        mm.close()
    except BufferError:   # an array still refers to the window: the GC will unmap it
        pass
