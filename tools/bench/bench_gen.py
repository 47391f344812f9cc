#!/usr/bin/env python3
"""Benchmark: skewgen frames/s vs a plain struct-packing Python loop, measured in one run.

Stages timed for skewgen on a >= 1M-frame preset (default ring-32, 2.1M frames, mostly
4154-byte WRITE_MIDDLEs):
  model        scenario -> packet table (schedules, pacing, link passes, responder)
  render       frames + ICRC into memory, pcap records written to /dev/null (no disk)
  pcap s=128   model table -> pcap file on disk, snaplen 128 (headers + ICRC computed)
  pcap full    the same with full frames (disk-bandwidth bound on most machines; --full)
  end to end   generate(preset) + write_pcap timed as one block, as a user runs it (best of
               --repeat runs; snaplen 128, and full frames with --full)
The baseline builds the same kind of frames (Ethernet/IPv4/UDP/BTH/RETH/payload, ICRC with
zlib.crc32 over the masked packet) one at a time with struct.pack and writes pcap records,
on a sample of --baseline-frames frames, to /dev/null and to disk (snaplen 128).

Usage: bench_gen.py [--preset ring-32] [--baseline-frames 100000] [--dir DIR] [--full]
                    [--repeat 3]
"""
from __future__ import annotations

import argparse
import os
import struct
import sys
import tempfile
import time
import zlib

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402

from skewscope import gen as skewgen  # noqa: E402
from skewscope.gen import pcapio  # noqa: E402


def baseline(cap, n: int, out, snaplen: int) -> float:
    """Per-frame Python: struct.pack headers, zero payload, zlib ICRC, pcap record."""
    p = cap.pkts
    job = cap.job
    n = min(n, len(cap))
    t0 = time.perf_counter()
    out.write(pcapio.pcap_header(snaplen))
    for i in range(n):
        path = int(p["path"][i])
        op = int(p["opcode"][i])
        plen = int(p["plen"][i])
        pad = -plen & 3
        ext = b""
        if op in (0x06, 0x0A, 0x0B):
            ext = struct.pack("!QII", int(p["va"][i]), 0x1234, int(p["reth"][i]))
        if op in (0x09, 0x0B):
            ext += struct.pack("!I", int(p["imm"][i]))
        if op == 0x11:
            ext = struct.pack("!I", int(p["aeth"][i]))
        bth = struct.pack("!BBHBBHBBH", op, pad << 4, 0xFFFF, 0, (job.p_dqp[path] >> 16) & 0xFF,
                          job.p_dqp[path] & 0xFFFF, int(p["flags"][i]) << 5, int(p["psn"][i]) >> 16,
                          int(p["psn"][i]) & 0xFFFF)
        body = bth + ext + bytes(plen + pad)
        ulen = 8 + len(body) + 4
        udp = struct.pack("!HHHH", job.p_sport[path], 4791, ulen, 0)
        ip = struct.pack("!BBHHHBBH4s4s", 0x45, int(p["tos"][i]), 20 + ulen, 0, 0x4000, 64, 17, 0,
                         job.ips[job.p_src[path]].packed, job.ips[job.p_dst[path]].packed)
        masked = (b"\xff" * 8 + ip[:1] + b"\xff" + ip[2:8] + b"\xff" + ip[9:10] + b"\xff\xff"
                  + ip[12:] + udp[:6] + b"\xff\xff" + bth[:4] + b"\xff" + bth[5:] + body[12:])
        icrc = struct.pack("<I", zlib.crc32(masked))
        eth = b"\x02\x5c\x00\x00\x00\x01\x02\x5c\x00\x00\x00\x02\x08\x00"
        frame = eth + ip + udp + body + icrc
        incl = frame if not snaplen else frame[:snaplen]
        ts = int(p["ts"][i])
        out.write(struct.pack("<IIII", ts // 10**9, ts % 10**9, len(incl), len(frame)) + incl)
    return n / (time.perf_counter() - t0)


def render_null(cap, snaplen: int) -> float:
    src = cap._source()
    buf = np.zeros(64 << 20, dtype=np.uint8)
    offs = np.empty((64 << 20) // 60 + 1, dtype=np.int64)
    t0 = time.perf_counter()
    with open(os.devnull, "wb", buffering=0) as f:
        i = 0
        while i < src.n:
            j, used = src.fill(buf, i, src.n, snaplen, True, offs)
            f.write(memoryview(buf)[:used])
            i = j
    return src.n / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="ring-32")
    ap.add_argument("--baseline-frames", type=int, default=100_000)
    ap.add_argument("--dir", default=None, help="where to write pcaps (default: a temp dir)")
    ap.add_argument("--full", action="store_true", help="also write the full-frame pcap to disk")
    ap.add_argument("--repeat", type=int, default=3, help="end-to-end runs (best one is shown)")
    a = ap.parse_args()
    d = a.dir or tempfile.mkdtemp(prefix="sgt-bench-")
    skewgen.generate("loss")  # JIT warm-up (numba cache load), not timed
    t0 = time.perf_counter()
    cap = skewgen.generate(a.preset, seed=0)
    t_model = time.perf_counter() - t0
    n = len(cap)
    lens = cap.frame_lengths()
    rows = []
    rows.append(("skewgen model (packet table)", n, n / t_model))
    rows.append(("skewgen render full frames -> /dev/null", n, render_null(cap, 0)))
    rows.append(("skewgen render snaplen 128 -> /dev/null", n, render_null(cap, 128)))
    pc = os.path.join(d, "bench.pcap")
    t0 = time.perf_counter()
    cap.write_pcap(pc, snaplen=128)
    rows.append(("skewgen write pcap snaplen 128 (disk)", n, n / (time.perf_counter() - t0)))
    os.unlink(pc)
    if a.full:
        t0 = time.perf_counter()
        cap.write_pcap(pc, snaplen=0)
        dt = time.perf_counter() - t0
        rows.append((f"skewgen write pcap full ({os.path.getsize(pc) / dt / 1e9:.2f} GB/s disk)",
                     n, n / dt))
        os.unlink(pc)
    e2e = []
    for snaplen in ([128, 0] if a.full else [128]):
        best = 0.0
        for _ in range(max(1, a.repeat if snaplen else 1)):
            t0 = time.perf_counter()
            c2 = skewgen.generate(a.preset, seed=0)
            c2.write_pcap(pc, snaplen=snaplen)
            dt = time.perf_counter() - t0
            os.unlink(pc)
            best = max(best, len(c2) / dt)
            del c2
        e2e.append((f"end to end: generate + write pcap "
                    f"{'snaplen 128' if snaplen else 'full frames'} (disk)", n, best))
    bn = min(a.baseline_frames, n)
    with open(os.devnull, "wb") as f:
        b_full = baseline(cap, bn, f, 0)
    with open(os.devnull, "wb") as f:
        b_snap = baseline(cap, bn, f, 128)
    with open(pc, "wb") as f:
        b_disk = baseline(cap, bn, f, 128)
    os.unlink(pc)
    rows.append(("python struct loop, full frames -> /dev/null", bn, b_full))
    rows.append(("python struct loop, snaplen 128 -> /dev/null", bn, b_snap))
    rows.append(("python struct loop, snaplen 128 (disk)", bn, b_disk))
    print(f"preset {a.preset}: {n} frames, mean frame {lens.mean():.0f} B, "
          f"{lens.sum() / 1e9:.2f} GB of frames; {os.cpu_count()} CPUs")
    print(f"{'stage':<54} {'frames':>9} {'frames/s':>12}")
    for name, k, fps in rows:
        print(f"{name:<54} {k:>9} {fps:>12,.0f}")
    for name, k, fps in e2e:
        print(f"{name:<54} {k:>9} {fps:>12,.0f}")
    try:
        load = " (load average %.1f)" % os.getloadavg()[0]
    except OSError:
        load = ""
    print()
    print(f"end to end, generate + pcap snaplen 128 on disk: {e2e[0][2]:,.0f} frames/s{load}")
    print(f"ratio render full frames vs python loop: {rows[1][2] / b_full:.1f}x")
    print(f"ratio pcap snaplen 128 on disk vs python loop: {rows[3][2] / b_disk:.1f}x")
    print(f"ratio end to end (generate + pcap s=128) vs python loop (s=128, disk, model "
          f"excluded): {e2e[0][2] / b_disk:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
