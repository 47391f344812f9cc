"""Fast pcap writer: numba fills chunk buffers with records (GIL released) while a writer
thread writes the previous chunk, so rendering and the write syscalls overlap.

Format: classic pcap, nanosecond magic 0xa1b23c4d (little-endian file), version 2.4,
linktype 1 (Ethernet), frames without FCS.  With ``snaplen`` > 0 each record holds the
first ``snaplen`` bytes of the frame and keeps the original length (like ``tcpdump -s``).
Files are written to a temporary name in the destination directory and renamed into
place, so a failure never leaves a half-written pcap behind.
"""
from __future__ import annotations

import os
import queue
import struct
import threading

import numpy as np

from skewscope.core.files import AtomicFile
from skewscope.core.jit import njit
from skewscope.gen import frames as F

PCAP_MAGIC_NS = 0xA1B23C4D
LINKTYPE_ETHERNET = 1
MAX_FRAME = 9216


def pcap_header(snaplen: int) -> bytes:
    return struct.pack("<IHHiIII", PCAP_MAGIC_NS, 2, 4, 0, 0, snaplen if snaplen else 65535,
                       LINKTYPE_ETHERNET)


@njit(cache=True, nogil=True)
def build_records(out, first, last, ts, ftype, path, opcode, tos, flags, psn, plen, va,
                  reth, imm, aeth, zidx, tmpl, hl, l2, ipv6, p_dqp, p_rkey, pkey, macs,
                  zops, table, snaplen, with_rec_hdr, offsets):
    """Write records for frames first..last-1 until `out` is full.

    Returns (next frame index, bytes used).  With with_rec_hdr=False only frame bytes are
    written (send mode); offsets[k] receives the start of frame first+k in `out`.
    """
    scratch = np.empty(9216 + 64, dtype=np.uint8)
    pfc_dmac = np.array([0x01, 0x80, 0xC2, 0x00, 0x00, 0x01], dtype=np.uint8)
    o = 0
    cap = out.shape[0]
    i = first
    while i < last:
        ft = ftype[i]
        flen = F.frame_len(ft, opcode[i], plen[i], hl)
        incl = flen
        if snaplen > 0 and incl > snaplen:
            incl = snaplen
        need = incl + (16 if with_rec_hdr else 0)
        if o + need > cap:
            break
        if with_rec_hdr:
            t = ts[i]
            F._put32le(out, o, np.uint32(t // 1000000000))
            F._put32le(out, o + 4, np.uint32(t % 1000000000))
            F._put32le(out, o + 8, np.uint32(incl))
            F._put32le(out, o + 12, np.uint32(flen))
            o += 16
        offsets[i - first] = o
        p = path[i]
        if ft == 1:
            mac = macs[p]
            pk = 0
            dq = 0
            rk = 0
            tp = tmpl[0]
        else:
            mac = macs[0]
            tp = tmpl[p]
            dq = p_dqp[p]
            rk = p_rkey[p]
            pk = 0xFFFF if opcode[i] == 0x81 else pkey
        # A truncated RoCE frame is written in place too when there is room behind it: the
        # bytes past `incl` it may write (headers longer than snaplen, the ICRC straddling
        # it; at most 98 + 4 bytes) are overwritten by the next record or never written out.
        if incl == flen or (ft == 0 and o + incl + 256 <= cap):
            F.write_frame(out, o, tp, hl, l2, ipv6, ft, opcode[i], tos[i], flags[i], pk, dq,
                          psn[i], plen[i], va[i], rk, reth[i], imm[i], aeth[i], zidx[i],
                          zops, table, mac, pfc_dmac, incl)
        else:  # truncated record: headers in scratch, payload zeros only up to snaplen
            F.write_frame(scratch, 0, tp, hl, l2, ipv6, ft, opcode[i], tos[i], flags[i], pk,
                          dq, psn[i], plen[i], va[i], rk, reth[i], imm[i], aeth[i], zidx[i],
                          zops, table, mac, pfc_dmac, incl)
            for k in range(incl):  # a loop: a slice copy may allocate a temporary
                out[o + k] = scratch[k]
        o += incl
        i += 1
    return i, o


class FrameSource:
    """Everything `build_records` needs, bound to one packet table."""

    def __init__(self, pkts: dict, paths: dict, hdr: dict):
        self.p = pkts
        self.paths = paths
        self.hdr = hdr
        pad = (4 - (pkts["plen"].astype(np.int64) & 3)) & 3
        zl = pkts["plen"].astype(np.int64) + pad
        zl[pkts["ftype"] != F.FT_ROCE] = 0
        uniq = np.nonzero(np.bincount(zl))[0] if zl.size else np.zeros(1, np.int64)
        lut = np.zeros(int(uniq.max()) + 1, dtype=np.int32)
        lut[uniq] = np.arange(uniq.size, dtype=np.int32)
        self.zidx = lut[zl]
        self.zops = F.zero_ops(uniq.astype(np.int64), F.CRC_TABLE)
        self.n = len(pkts["ts"])

    def fill(self, out, first, last, snaplen, with_rec_hdr, offsets):
        p, h, pa = self.p, self.hdr, self.paths
        return build_records(out, first, last, p["ts"], p["ftype"], p["path"], p["opcode"],
                             p["tos"], p["flags"], p["psn"], p["plen"], p["va"], p["reth"],
                             p["imm"], p["aeth"], self.zidx, h["tmpl"], h["hl"], h["l2"],
                             h["ipv6"], pa["dqp"], pa["rkey"], h["pkey"], h["macs"],
                             self.zops, F.CRC_TABLE, snaplen, with_rec_hdr, offsets)


def _write_all(fd: int, mv) -> None:
    while len(mv):
        k = os.write(fd, mv)
        mv = mv[k:]


def write_records(src: FrameSource, fd: int, snaplen: int, chunk_bytes: int = 2 << 20,
                  nbuf: int = 3) -> None:
    """Render all records of `src` and write them to `fd`, rendering and writing overlapped.

    `build_records` releases the GIL, so the main thread renders chunk k+1 while a writer
    thread's os.write of chunk k (which also releases it) copies it into the page cache:
    the cost is max(render, write) instead of their sum.  `nbuf` buffers circulate between
    the two threads; an error on either side stops both and is raised here.
    """
    bufs = [np.empty(chunk_bytes, dtype=np.uint8) for _ in range(nbuf)]
    offs = np.empty(chunk_bytes // 60 + 1, dtype=np.int64)
    full: queue.Queue = queue.Queue()
    free: queue.Queue = queue.Queue()
    for k in range(nbuf):
        free.put(k)
    err: list = []

    def writer():
        while True:
            item = full.get()
            if item is None:
                return
            k, used = item
            if not err:
                try:
                    _write_all(fd, memoryview(bufs[k])[:used])
                except BaseException as e:  # noqa: BLE001 - re-raised in the caller
                    err.append(e)
            free.put(k)

    th = threading.Thread(target=writer, name="skewgen-pcap-writer", daemon=True)
    th.start()
    try:
        i = 0
        while i < src.n:
            k = free.get()
            if err:
                break
            j, used = src.fill(bufs[k], i, src.n, snaplen, True, offs)
            if j == i:
                raise RuntimeError("chunk buffer too small for one frame")
            full.put((k, used))
            i = j
    finally:
        full.put(None)
        th.join()
    if err:
        raise err[0]


def write_pcap(src: FrameSource, path: str, snaplen: int = 0, chunk_bytes: int = 2 << 20):
    """Write all frames of `src` to `path` atomically (temp file + os.replace)."""
    with AtomicFile(path, suffix=".pcap.tmp", prefix=".skewgen-", fsync=False) as f:
        _write_all(f.fd, memoryview(pcap_header(snaplen)))
        write_records(src, f.fd, snaplen, chunk_bytes)
