"""`skewscope replay`: run every frame of a capture through the real BPF program with
BPF_PROG_TEST_RUN and return the Snapshot the live data plane would have produced.

Time and truncation: the program is compiled with -DSS_REPLAY_CLOCK; before each test run
we store the record's pcap timestamp (ns) and captured length in the per-CPU `clock` map,
and the program uses them instead of bpf_ktime_get_ns() and the end of the data. A record
cut by a snaplen is padded with zeros back to its original length (so wire lengths and
frags are those of the original frame); the program never parses bytes past caplen, so a
cut inside the headers is counted as truncated exactly like the offline parser does.

Frames shorter than an Ethernet header cannot be given to BPF_PROG_TEST_RUN (the kernel
refuses < 14 bytes); replay counts them as `truncated_eth` itself and says so in meta.

The TC entry's test run builds an skb from one page (frames must stay below ~3.7 KiB): for
`--entry tc`, frames longer than TC_CUT bytes are handed over cut to TC_CUT bytes with their
original length in the clock map's wire_len (headers are < 140 bytes, so nothing the parser
reads is lost). XDP runs take up to 64 KiB (the tail becomes XDP fragments).

The capture is read by the offline path's reader (offline.read_frames: the same formats,
link-type conventions, errors and warnings as `skewscope report FILE.pcap`, in meta["warnings"]
when there are any), strictly: a capture damaged part-way (cut short, corrupt) is refused
with one PcapError line, since a replay is for comparing the kernel's view of a whole file.
"""
from __future__ import annotations

import itertools
import os
import time

import numpy as np

from skewscope.bpf import syscalls as bpfsys
from skewscope.bpf.loader import Config, Dataplane, check_privileges
from skewscope.core import layout as L
from skewscope.core.errors import EXIT_KERNEL, DataplaneError
from skewscope.core.snapshot import Snapshot

MAX_TEST_RUN_FRAME = 65535
TC_CUT = 2048
U64 = (1 << 64) - 1


def replay(path: str, entry: str = "xdp", max_flows: int = 65536, progress=None,
           ev_per_cpu: int = 1 << 16) -> Snapshot:
    check_privileges()   # not root: say so before reading (and compiling) anything
    from skewscope.sources import offline  # heavy (numba): the capture reader
    reader = offline.read_frames(path, strict=True)
    batches = iter(reader)
    first = next(batches, None)   # an unreadable capture fails here, before the compile
    cfg = Config(max_flows=max_flows, replay_clock=True, ev_per_cpu=ev_per_cpu)
    # Pin to one CPU: all message records land in one region, read in order.
    try:
        old_aff = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {min(old_aff)})
    except (AttributeError, OSError):
        old_aff = None
    dp = Dataplane(cfg)
    try:
        fd = dp.prog_fd(entry)
        recs = []
        frames = padded = too_short = 0
        first_ts = last_ts = None
        flush_every = max(1, ev_per_cpu // 2)
        tc = entry == "tc"
        set_replay, test_run = dp.set_replay, bpfsys.prog_test_run
        t0 = time.monotonic()
        for batch in itertools.chain([first] if first is not None else [], batches):
            if not len(batch):
                continue
            buf = batch.data
            raw = buf.tobytes()   # padded frames are built as bytes: cheaper than numpy per frame
            if first_ts is None:
                first_ts = int(batch.ts[0])
            last_ts = int(batch.ts[-1])
            for ts, orig, caplen, o in zip(batch.ts.tolist(), batch.orig_len.tolist(), batch.caplen.tolist(),
                                           batch.offset.tolist()):
                frames += 1
                if caplen < 14:
                    too_short += 1
                    continue
                want = min(max(orig, caplen), MAX_TEST_RUN_FRAME)
                if want > caplen:
                    padded += 1
                wire = 0
                if tc and want > TC_CUT:
                    wire, want = want, TC_CUT
                n = min(caplen, want)
                data = buf[o:o + want] if n == want else raw[o:o + n] + bytes(want - n)
                set_replay(ts & U64, n, wire)
                try:
                    test_run(fd, data)
                except bpfsys.BPFError as e:
                    raise DataplaneError(f"{path}: the kernel refused to run record {frames} ({want} bytes) "
                                         f"through {entry}: {e.strerror}", EXIT_KERNEL) from None
                if frames % flush_every == 0:
                    recs.append(dp.read_new_records())
                    if progress:
                        progress(frames)
        recs.append(dp.read_new_records())
        meta = {
            "source": "replay",
            "file": os.path.abspath(path),
            "entry": entry,
            "clock": "pcap",
            "frames": frames,
            "padded_records": padded,
            "too_short_for_test_run": too_short,
            "first_ts": first_ts or 0,
            "last_ts": last_ts or 0,
            "duration_s": ((last_ts - first_ts) / 1e9) if first_ts is not None else 0.0,
            "replay_seconds": time.monotonic() - t0,
        }
        if reader.warnings:
            meta["warnings"] = list(reader.warnings)
        snap = dp.snapshot(meta, records=np.concatenate(recs) if recs else None)
        if too_short:
            snap.globals[L.G_FRAMES] += too_short
            snap.globals[L.G_TRUNC_ETH] += too_short
        return snap
    finally:
        dp.close()
        if old_aff is not None:
            try:
                os.sched_setaffinity(0, old_aff)
            except OSError:
                pass
