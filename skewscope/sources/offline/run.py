"""One pass over one capture file (_Run): open it (gzip, mmap or copy buffer), read the
format header, walk its records (pcap.py, pcapng.py) through the numba scanner -- into the
tables (parse_file, dissect; large files: parsed here, accounted on a second thread, pipeline.py) or
out as frame batches (read_frames) --, then the damage and link-type warnings and the
Snapshot with its meta; the progress bar of large files."""
from __future__ import annotations

import os
import sys

import numpy as np

from skewscope.core import layout as L
from skewscope.core.errors import PcapError
from skewscope.core.snapshot import Snapshot, flows_from_raw
from skewscope.sources.offline import kernel as K
from skewscope.sources.offline import pipeline
from skewscope.sources.offline.formats import (
    _KIND,
    LINKTYPE_NAMES,
    PCAP_MAGIC_NS,
    PCAP_MAGIC_US,
    PCAPNG_SHB,
    _check_linktype,
    _u32,
)
from skewscope.sources.offline.frames import FRAME_BYTES, FrameBatch
from skewscope.sources.offline.pcap import _PcapWalk
from skewscope.sources.offline.pcapng import _PcapngWalk
from skewscope.sources.offline.streams import _Buffer, _MapBuffer, _Source, _Stop
from skewscope.sources.offline.tables import _OPTAB, _events, _Tables

PROGRESS_MIN_BYTES = 64 << 20


class _Run(_PcapWalk, _PcapngWalk):
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
        self.acc: pipeline._Accountant | None = None   # the accounting thread (pipelined parse)

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
            if not self.frames and not self.packets_limit and pipeline.wanted(src.size):
                self._start_pipeline()
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
            if self.acc is not None:
                self._end_pipeline()
            self._finish()
        finally:
            if self.acc is not None:   # left early (an error): stop the thread, drop its work
                acc, self.acc = self.acc, None
                try:
                    acc.finish()
                except Exception:
                    pass
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
        if self.acc is not None:
            return self._scan_rows((fmt, self.big, ts_mult, kind, if_kind, if_res, if_snap, n_if))
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

    def _start_pipeline(self) -> None:
        """Parse here, account on a second thread (pipeline.py): the parse counts into its
        own g/st (merged at the end), the accounting owns the tables."""
        self.g_parse = np.zeros(L.G_N, np.int64)
        self.st = np.zeros(K.ST_N, np.int64)
        self.st[K.ST_FIRST_TS] = -1
        self.acc = pipeline._Accountant(self.t)
        self.rows = self.acc.block()
        self.nrows = 0

    def _scan_rows(self, walk_args: tuple) -> int:
        """One scanner call of the pipelined parse: the records from b.pos parsed into the
        current row block (scan_rows), which goes to the accounting thread when full (a new
        one taken: S_GROW, call again) or at the end (_end_pipeline). Returns the status."""
        b = self.b
        pos, status, n = K.scan_rows(b.buf, b.pos, b.fill, *walk_args, self.g_parse, self.st, self.rows,
                                     self.nrows, _OPTAB)
        b.pos = int(pos)
        self.nrows = int(n)
        if status == K.S_FULL:
            self.acc.put(self.rows, self.nrows)
            self.rows, self.nrows = self.acc.block(), 0
            return K.S_GROW
        return int(status)

    def _end_pipeline(self) -> None:
        acc, self.acc = self.acc, None
        if self.nrows:
            acc.put(self.rows, self.nrows)
        self.rows, self.nrows = None, 0
        acc.finish()
        pipeline.merge(self.t, self.g_parse, self.st)
        self.st = self.t.st

    def _new_batch(self, nbytes: int) -> None:
        self.rec = np.empty((self.frames, 4), np.int64)
        self.out = np.empty(nbytes, np.uint8)
        self.n = self.o = 0

    def _take(self) -> FrameBatch:
        rec = self.rec[:self.n]
        batch = FrameBatch(rec[:, 0], rec[:, 1], rec[:, 2], rec[:, 3], self.out[:self.o])
        self._new_batch(max(FRAME_BYTES, len(self.out)))
        return batch

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
