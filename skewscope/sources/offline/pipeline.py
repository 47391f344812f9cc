"""The pipelined parser: one file parsed on two cores with the result of one core, exactly.

Two threads. The reading thread walks the file and parses every record (kernel/scanner.py
scan_rows: record framing, link-type conventions, headers, categories) into row blocks of
ROWS rows, one compact row per accounted frame (run._Run._scan_rows; a block is filled across
refills of the read buffer). Each full block goes to the accounting thread (_Accountant),
which feeds the rows, in file order, through the same `account` as the one-core scan
(kernel/scanner.py account_rows) and hands the block back for reuse; at most BLOCKS are in
flight. Everything stateful across packets -- the flow table and its LRU, PSN state,
messages, flow instances, message records -- lives only in the accounting thread and sees
the packets in file order, so the Snapshot is the one-core Snapshot; the parse's counters
(frames, categories, decapsulation, PFC, snaplen cuts, first/last time, skipped blocks) stay
in the reading thread and are merged at the end (merge). The mmap window helper
(streams._MapBuffer) is the third thread of the process: its page-table work (~11 ns per
packet) is scheduled by the OS on whichever core has room. All kernels run without the GIL
(numba nogil; the precompiled module's wrappers release it too).

Why not more threads: a second parsing thread (each buffer cut in two, the back part parsed
beside the front part; until 2026-12-05) used no less CPU and its per-cut waits left a core
idle: on the 10.6 M-frame capture the parse takes ~0.2 CPU-s, the accounting ~0.2 and the
page tables ~0.1, which the OS spreads over two cores as they come.

On for large captures: SKEWSCOPE_OFFLINE_PIPELINE=auto (the default, also when unset) uses it
for files of at least PIPELINE_MIN_BYTES when this process may run on two CPUs or more, =1 for
any file (tests), =0 never. The threshold is measured (docs/offline.md "Two cores").
gzip input pipelines the same way (decompression stays in the reading thread)."""
from __future__ import annotations

import os
import queue
import threading

import numpy as np

from skewscope.core import layout as L
from skewscope.sources.offline import kernel as K
from skewscope.sources.offline.tables import _OPTAB, _Tables

PIPELINE_MIN_BYTES = 768 << 20
ROWS = 1 << 16      # rows per block handed over (5.8 MB)
BLOCKS = 4          # blocks in flight at most (memory bound: ~23 MB)

#: the parse half's scalar state, copied into the tables' at the end (the accounting half
#: owns every other index: flow table, LRU, instances, message records)
PARSE_ST = (K.ST_FIRST_TS, K.ST_LAST_TS, K.ST_CUT, K.ST_RECORDS, K.ST_SKIP_LT, K.ST_STOP_IF,
            K.ST_UNKNOWN_BLOCKS, K.ST_UNKNOWN_TYPE)


def wanted(size: int) -> bool:
    """Pipeline a file of `size` bytes? (SKEWSCOPE_OFFLINE_PIPELINE: see the module doc.)"""
    mode = os.environ.get("SKEWSCOPE_OFFLINE_PIPELINE", "auto")
    if mode != "auto":
        return mode == "1"
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return cpus >= 2 and size >= PIPELINE_MIN_BYTES


def account_block(t: _Tables, rows: np.ndarray, n: int) -> None:
    """rows[:n] (scan_rows') accounted into t, in order, growing t between kernel calls."""
    i = 0
    while i < n:
        i = int(K.account_rows(t.g, t.st, t.hidx, t.fhash, t.keys, t.S, t.lprev, t.lnext, t.finst, t.ikeys, t.ev,
                               rows, i, n))
        if i < n:
            t.grow()


class _Accountant:
    """The accounting thread: takes row blocks in order (put), accounts them into the tables
    (growing them between kernel calls), hands the blocks back for reuse (block). finish()
    waits for the last block and re-raises what went wrong in the thread."""

    def __init__(self, t: _Tables):
        self.t = t
        self.todo: queue.Queue = queue.Queue()
        self.free: queue.Queue = queue.Queue()
        for _ in range(BLOCKS):
            self.free.put(np.empty((ROWS, K.R_N), np.int64))
        self.exc: BaseException | None = None
        self.thread = threading.Thread(target=self._work, name="skewscope-accounting", daemon=True)
        self.thread.start()

    def block(self) -> np.ndarray:
        """An empty row block (waits while BLOCKS are in flight)."""
        return self.free.get()

    def put(self, rows: np.ndarray, n: int) -> None:
        self.todo.put((rows, n))

    def _work(self) -> None:
        while True:
            item = self.todo.get()
            if item is None:
                return
            rows, n = item
            if self.exc is None:   # after a failure: only hand the blocks back (no deadlock)
                try:
                    account_block(self.t, rows, n)
                except BaseException as e:  # re-raised in the reading thread by finish()
                    self.exc = e
            self.free.put(rows)

    def finish(self) -> None:
        self.todo.put(None)
        self.thread.join()
        if self.exc is not None:
            raise self.exc


def merge(t: _Tables, g_parse: np.ndarray, st_parse: np.ndarray) -> None:
    """The parse half's counters into the tables: global counters add up (each is counted by
    exactly one half), the record-level scalars are the parse half's."""
    t.g += g_parse
    for i in PARSE_ST:
        t.st[i] = st_parse[i]
