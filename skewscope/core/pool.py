"""Reused result arrays for a reader called again and again (the live loop's map read).

Writing a fresh 850 MB flow table costs its page faults on every read (1.1 s on this VM the
first time a process touches that much memory, ~0.1 s when the kernel recycles freed pages);
writing into memory the process already has costs none. `ArrayPool.take(n)` hands out an
array of n rows whose memory is a buffer the pool keeps; a buffer is written again only
when nothing refers to it any more: no array handed out from it, nor any view of one (numpy
points every view's `base` at the array that owns the memory, so the owner's reference
count is exact: the pool's own reference and nothing else means unused). take() holds the
pool's lock: the live loop's analysis runner thread and the screen's take from one pool, and
a buffer found unused by two threads at once would be handed out twice (uncontended, the lock
costs nothing next to a take).
"""
from __future__ import annotations

import sys
import threading

import numpy as np

#: room for the table to grow by before a new buffer is needed (an eighth)
_GROW = 8


class ArrayPool:
    """Buffers of one dtype handed out as arrays of n rows and taken back once unused.

    Between two take() calls the pool keeps the buffers still in use (so they can come back)
    and the ones that became unused since; take() reuses one unused buffer that fits and
    lets the other unused ones go. `rows`: every buffer has that many rows (a reader with a
    known maximum, e.g. a map's max_entries: only the rows ever written become resident, and
    a table that grows or shrinks still fits); else n and an eighth more, reused for up to
    twice its n. `limit` bounds how many buffers in use are followed (a caller that keeps
    every result gets fresh arrays, as without a pool)."""

    def __init__(self, dtype, rows: int | None = None, limit: int = 6):
        self.dtype = np.dtype(dtype)
        self.rows = None if rows is None else max(int(rows), 1)
        self.limit = int(limit)
        self._bufs: list[np.ndarray] = []
        self._lock = threading.Lock()
        self.reused = 0
        self.allocated = 0

    def _unused(self, i: int) -> bool:
        # references: the list's and getrefcount's argument; any array handed out or view of
        # one holds another (its base is the buffer)
        return sys.getrefcount(self._bufs[i]) <= 2

    def take(self, n: int) -> np.ndarray:
        """An array of n rows (contents undefined: the caller writes every byte); safe from
        several threads at once."""
        n = int(n)
        with self._lock:
            return self._take(n)

    def _take(self, n: int) -> np.ndarray:
        pick = None
        for i in range(len(self._bufs)):
            cap = len(self._bufs[i])
            fits = n <= cap and (self.rows is not None or cap <= 2 * n + 4096)
            if fits and self._unused(i) and (pick is None or cap < len(self._bufs[pick])):
                pick = i
        if pick is not None:
            buf = self._bufs.pop(pick)
            self.reused += 1
        else:
            buf = np.empty(n + n // _GROW if self.rows is None or n > self.rows else self.rows, dtype=self.dtype)
            self.allocated += 1
        # unused buffers not taken are let go (their memory goes back to the allocator)
        self._bufs = [self._bufs[i] for i in range(len(self._bufs)) if not self._unused(i)]
        self._bufs.append(buf)
        del self._bufs[:-self.limit]
        return buf[:n]

    def clear(self) -> None:
        """Forget every buffer (the ones still in use live on with their arrays)."""
        with self._lock:
            self._bufs = []
