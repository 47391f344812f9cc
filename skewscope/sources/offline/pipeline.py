"""The pipelined parser: one file parsed on two cores with the result of one core, exactly.

The walk and the parse (kernel/scanner.py scan_rows: record framing, link-type conventions,
headers, categories) run in the reading thread and write one compact row per accounted frame;
an accounting thread (this module's _Accountant) feeds those rows, in file order, through the
same `account` as the one-core scan (kernel/scanner.py account_rows). Everything stateful
across packets -- the flow table and its LRU, PSN state, messages, flow instances, message
records -- lives only in the accounting thread and sees the packets in the same order, so the
Snapshot is the one-core Snapshot; the parse half's counters (frames, categories,
decapsulation, PFC, snaplen cuts, first/last time) are sums and ends, merged at the end
(merge). Both kernels run without the GIL (numba nogil; the precompiled module's wrappers
release it too).

Off unless asked for: measured on a 2-vCPU VM it did not pay reliably (docs/offline.md "Two
cores": the parse half, which streams the whole capture, bounds it, and the rows cost ~25 %
more CPU). SKEWSCOPE_OFFLINE_PIPELINE=auto uses it for files of at least PIPELINE_MIN_BYTES
when this process may run on two CPUs or more (the bench's setting), =1 for any file (tests),
unset or 0 never. gzip input pipelines the same way (decompression stays in the reading
thread, with the parse)."""
from __future__ import annotations

import os
import queue
import threading

import numpy as np

from skewscope.sources.offline import kernel as K
from skewscope.sources.offline.tables import _Tables

PIPELINE_MIN_BYTES = 16 << 20
ROWS = 1 << 15      # rows per block handed over (2.6 MB)
BLOCKS = 4          # blocks in flight at most (memory bound: ~10 MB)

#: the parse half's scalar state, copied into the tables' at the end (the accounting half
#: owns every other index: flow table, LRU, instances, message records)
PARSE_ST = (K.ST_FIRST_TS, K.ST_LAST_TS, K.ST_CUT, K.ST_RECORDS, K.ST_SKIP_LT, K.ST_STOP_IF,
            K.ST_UNKNOWN_BLOCKS, K.ST_UNKNOWN_TYPE)


def wanted(size: int) -> bool:
    """Pipeline a file of `size` bytes? (SKEWSCOPE_OFFLINE_PIPELINE: see the module doc.)"""
    mode = os.environ.get("SKEWSCOPE_OFFLINE_PIPELINE", "0")
    if mode != "auto":
        return mode == "1"
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return cpus >= 2 and size >= PIPELINE_MIN_BYTES


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
        t = self.t
        while True:
            item = self.todo.get()
            if item is None:
                return
            rows, n = item
            if self.exc is None:   # after a failure: only hand the blocks back (no deadlock)
                try:
                    i = 0
                    while i < n:
                        i = int(K.account_rows(t.g, t.st, t.hidx, t.fhash, t.keys, t.S, t.lprev, t.lnext, t.finst,
                                               t.ikeys, t.ev, rows, i, n))
                        if i < n:
                            t.grow()
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
