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
"""
from __future__ import annotations

import os
import time

import numpy as np

from skewscope.bpf import syscalls as bpfsys
from skewscope.bpf.loader import Config, Dataplane
from skewscope.core import layout as L
from skewscope.core.errors import EXIT_KERNEL, DataplaneError
from skewscope.core.snapshot import Snapshot
from skewscope.sources.pcapfile import read_records

MAX_TEST_RUN_FRAME = 65535
TC_CUT = 2048


def replay(path: str, entry: str = "xdp", max_flows: int = 65536, progress=None,
           ev_per_cpu: int = 1 << 16) -> Snapshot:
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
        t0 = time.monotonic()
        for r in read_records(path):
            frames += 1
            if first_ts is None:
                first_ts = r.ts_ns
            last_ts = r.ts_ns
            data = r.data
            caplen = len(data)
            if caplen < 14:
                too_short += 1
                continue
            want = min(max(r.orig_len, caplen), MAX_TEST_RUN_FRAME)
            if want > caplen:
                padded += 1
            data = data[:want]
            wire = 0
            if entry == "tc" and want > TC_CUT:
                wire, want = want, TC_CUT
                data = data[:TC_CUT]
            if want > len(data):
                data = data + bytes(want - len(data))
            dp.set_replay(r.ts_ns, min(caplen, want), wire)
            try:
                bpfsys.prog_test_run(fd, data)
            except bpfsys.BPFError as e:
                raise DataplaneError(f"{path}: the kernel refused to run record {frames} ({len(data)} bytes) "
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
