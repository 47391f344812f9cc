"""Offline path: a capture file -> the Snapshot the kernel data plane would have produced;
and the one reader of capture files (`skewscope replay` reads its frames here too).

    from skewscope.sources import offline
    snap = offline.parse_file("trace.pcap.gz")        # Snapshot(source="offline")
    pkts = offline.dissect("trace.pcap", limit=1000)  # per-packet parse (debugging, tests)
    for batch in offline.read_frames("trace.pcap"):   # the records as Ethernet frames
        batch.ts, batch.orig_len, batch.frame(0)

The file is streamed in chunks through numba kernels (kernel/): one
record walk for pcap (µs/ns magic, either byte order) or pcapng (SHB, IDB, EPB, SPB, the
obsolete PB; several interfaces, each with its own link type and if_tsresol), then either a
line-by-line mirror of ebpf/skewscope.bpf.c's parser and accounting (parse_file, dissect) or
a copy of each record as an Ethernet frame (read_frames). Link-type conventions (kernel/scanner.py
link_view): Ethernet (1) as is; Linux cooked v1 (113) / v2 (276) and raw IP (101, and
DLT_RAW 12/14) become an Ethernet frame with a synthesised 14-byte header (zero MACs, the
packet's EtherType), original lengths adjusted by the same difference; timestamps in ns.
gzip is read transparently. Memory is bounded by the chunk buffer, the flow table
(max_flows) and the message records (one per message). See docs/offline.md.

Bad input: a file that is not a capture, or of an unsupported link type, raises PcapError
(one line; the CLI prints it and exits 3). A capture that is damaged part-way (cut short by
a killed tcpdump, a corrupt record length, a broken gzip stream) is read up to the damage,
with the reason in meta["warnings"] (read_frames: FrameReader.warnings).

Modules, one job each: this one the API (parse_file, dissect, read_frames / FrameReader);
streams.py the bytes (gzip, pipes, mmap windows, read buffers); formats.py the pcap/pcapng
magic and link types; run.py one pass over a file
(open, format header, warnings, the Snapshot); pcap.py and pcapng.py its record walks;
pipeline.py the accounting on a second thread (opt-in; same result, exactly);
tables.py the kernel's state arrays and the events; frames.py the frame batches;
kernel/ the numba kernels (base, accounting, parse, scanner).
"""
from __future__ import annotations

import os
import time

import numpy as np

from skewscope.core.errors import PcapError  # noqa: F401 (re-exported: __all__)
from skewscope.core.snapshot import Snapshot
from skewscope.sources.offline import kernel as K
from skewscope.sources.offline.formats import (  # noqa: F401 (the link-type names: docs/offline.md)
    DLT_RAW_ALIASES,
    LINKTYPE_ERF,
    LINKTYPE_ETHERNET,
    LINKTYPE_LINUX_SLL,
    LINKTYPE_LINUX_SLL2,
    LINKTYPE_NAMES,
    LINKTYPE_RAW,
    SUPPORTED_LINKTYPES,
)
from skewscope.sources.offline.frames import FRAME_BATCH, FrameBatch
from skewscope.sources.offline.run import _Run
from skewscope.sources.offline.tables import PACKET_DTYPE, _Full


__all__ = ["parse_file", "dissect", "read_frames", "FrameReader", "FrameBatch", "PcapError", "DEFAULT_CHUNK"]

DEFAULT_CHUNK = 16 << 20
DEFAULT_MAX_EVENTS = 1 << 23   # ~1 GB at peak in the worst case (one message per packet)


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
