"""`capture --pcap-out`: keep the RoCE headers seen on an interface in a pcap a colleague can
open in Wireshark.

How: an AF_PACKET socket bound to the interface with a classic-BPF socket filter that
accepts only RoCEv2 (UDP dport 4791, IPv4/IPv6, untagged or one 802.1Q/802.1ad tag in the
frame), RoCEv1 (EtherType 0x8915) and MAC-control/PFC (0x8808) frames, and returns the
snap length -- so the kernel itself truncates each frame to its first `snaplen` bytes
(default 128: Ethernet + IP + UDP + BTH + RETH/AETH/ImmDt with room for a tag) and records
the original length. Everything else is dropped in the kernel, before any copy.

Frames arrive in a TPACKET_V3 memory-mapped ring (no syscall per packet; blocks of many
frames retired by the kernel when full or after 50 ms); a thread turns each ready block
into pcap records with a numba kernel (no Python object per packet, GIL released) and
appends them to a temporary file next to the output, renamed over it on commit (atomic:
a failed or interrupted capture never leaves a half-written file under the final name).

Memory is bounded by the ring (block_size * block_nr, default 16 MiB); disk by
`max_bytes` (frames beyond it are counted, not written). When the thread cannot keep up,
the kernel drops frames from the ring and counts them: stats()["kernel_drops"], reported
by `capture`. A VLAN tag the driver moved into metadata is put back into the frame (as
libpcap does), so the pcap shows the tag that was on the wire.

AF_PACKET sees a frame after XDP passed it (ingress) or as it leaves (egress); which of
the two directions is kept follows --direction (ancillary pkttype load in the filter).
Timestamps are CLOCK_REALTIME (pcap convention), nanosecond pcap format.
"""
from __future__ import annotations

import ctypes
import mmap
import os
import select
import socket
import struct
import threading
import time

import numpy as np

from skewscope.core.errors import EXIT_NO_IFACE, EXIT_NOT_RUN, EXIT_USAGE, DataplaneError
from skewscope.core.files import AtomicFile
from skewscope.core.jit import njit

ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_RX_RING = 5
PACKET_STATISTICS = 6
PACKET_VERSION = 10
TPACKET_V3 = 2
SO_ATTACH_FILTER = 26
TP_STATUS_KERNEL = 0
TP_STATUS_USER = 1
TP_STATUS_VLAN_VALID = 1 << 4
TP_STATUS_VLAN_TPID_VALID = 1 << 6
PACKET_OUTGOING = 4
SKF_AD_PKTTYPE = 0xFFFFF000 + 4      # SKF_AD_OFF (-0x1000) + SKF_AD_PKTTYPE, as u32

PCAP_MAGIC_NS = 0xA1B23C4D
LINKTYPE_ETHERNET = 1

# ---- classic BPF ---------------------------------------------------------------------------
_LDB_ABS, _LDH_ABS, _LDH_IND, _LDXB_MSH, _RET_K = 0x30, 0x28, 0x48, 0xB1, 0x06
_JEQ_K, _JSET_K, _JA = 0x15, 0x45, 0x05


def _assemble(prog) -> list[tuple[int, int, int, int]]:
    """prog: list of labels (str) and instructions (code, k, jt_label|None, jf_label|None).
    Labels resolve to forward relative offsets (cBPF jumps only forward)."""
    pos, out, n = {}, [], 0
    for item in prog:
        if isinstance(item, str):
            pos[item] = n
        else:
            n += 1
    i = 0
    for item in prog:
        if isinstance(item, str):
            continue
        code, k, jt, jf = item

        def rel(lbl):
            if lbl is None:
                return 0
            d = pos[lbl] - (i + 1)
            assert 0 <= d < 256, (lbl, d)
            return d
        if code == _JA:
            k, jt_o, jf_o = rel(jt), 0, 0
        else:
            jt_o, jf_o = rel(jt), rel(jf)
        out.append((code, jt_o, jf_o, k & 0xFFFFFFFF))
        i += 1
    return out


def roce_filter(snaplen: int = 128, direction: str = "both") -> list[tuple[int, int, int, int]]:
    """The socket filter: (code, jt, jf, k) instructions. Accepts RoCEv2/RoCEv1/PFC frames
    (returning snaplen = bytes to keep), rejects everything else (returns 0)."""
    p = []
    if direction in ("ingress", "egress"):
        p.append((_LDB_ABS, SKF_AD_PKTTYPE, None, None))
        if direction == "ingress":
            p.append((_JEQ_K, PACKET_OUTGOING, "reject", "l2"))
        else:
            p.append((_JEQ_K, PACKET_OUTGOING, "l2", "reject"))
    p += ["l2", (_LDH_ABS, 12, None, None)]
    for l2, nxt in ((14, "vlan"), (18, None)):
        if l2 == 18:
            p += ["vlan", (_LDH_ABS, 16, None, None)]
        p += [(_JEQ_K, 0x8915, "accept", None), (_JEQ_K, 0x8808, "accept", None),
              (_JEQ_K, 0x0800, f"ip4_{l2}", None), (_JEQ_K, 0x86DD, f"ip6_{l2}", None)]
        if nxt:
            p += [(_JEQ_K, 0x8100, "vlan", None), (_JEQ_K, 0x88A8, "vlan", None)]
        p.append((_JA, 0, "reject", None))
    for l2 in (14, 18):
        p += [f"ip4_{l2}",
              (_LDB_ABS, l2 + 9, None, None), (_JEQ_K, 17, None, "reject"),       # UDP
              (_LDH_ABS, l2 + 6, None, None), (_JSET_K, 0x1FFF, "reject", None),  # not a later fragment
              (_LDXB_MSH, l2, None, None),                                        # X = IHL * 4
              (_LDH_IND, l2 + 2, None, None), (_JEQ_K, 4791, "accept", "reject"),
              f"ip6_{l2}",
              (_LDB_ABS, l2 + 6, None, None), (_JEQ_K, 17, None, "reject"),
              (_LDH_ABS, l2 + 42, None, None), (_JEQ_K, 4791, "accept", "reject")]
    p += ["accept", (_RET_K, int(snaplen), None, None), "reject", (_RET_K, 0, None, None)]
    return _assemble(p)


# ---- ring block -> pcap records (numba) ----------------------------------------------------
@njit(cache=True, nogil=True)
def _u32(b, o):
    return np.int64(b[o]) | (np.int64(b[o + 1]) << 8) | (np.int64(b[o + 2]) << 16) | (np.int64(b[o + 3]) << 24)


@njit(cache=True, nogil=True)
def _u16(b, o):
    return np.int64(b[o]) | (np.int64(b[o + 1]) << 8)


@njit(cache=True, nogil=True)
def _put32(b, o, v):
    b[o] = v & 0xFF
    b[o + 1] = (v >> 8) & 0xFF
    b[o + 2] = (v >> 16) & 0xFF
    b[o + 3] = (v >> 24) & 0xFF


@njit(cache=True, nogil=True)
def block_to_pcap(ring, base, out, snaplen, t_from=0, t_to=0):
    """Convert one TPACKET_V3 block at ring[base:] into pcap (ns) records in out, keeping
    the frames whose timestamp (ns since the epoch) is in [t_from, t_to] (0 = open end).
    Returns (bytes written, frames kept, sum of their original lengths, frames outside)."""
    num = _u32(ring, base + 12)
    p = np.int64(base) + _u32(ring, base + 16)
    o = np.int64(0)
    orig_sum = np.int64(0)
    kept = np.int64(0)
    outside = np.int64(0)
    for _ in range(num):
        nxt = _u32(ring, p)
        sec = _u32(ring, p + 4)
        nsec = _u32(ring, p + 8)
        t = sec * 1000000000 + nsec
        if (t_from > 0 and t < t_from) or (t_to > 0 and t > t_to):
            outside += 1
            if nxt == 0:
                break
            p += nxt
            continue
        kept += 1
        cap = _u32(ring, p + 12)
        length = _u32(ring, p + 16)
        status = _u32(ring, p + 20)
        mac = _u16(ring, p + 24)
        d = p + mac
        vlan = (status & 0x10) != 0 and cap >= 12
        if vlan:
            tci = _u32(ring, p + 32) & 0xFFFF
            tpid = _u16(ring, p + 36) if (status & 0x40) != 0 else np.int64(0x8100)
            if tpid == 0:
                tpid = np.int64(0x8100)
            incl = cap + 4
            if incl > snaplen:
                incl = snaplen
            orig = length + 4
        else:
            incl = cap
            orig = length
        _put32(out, o, sec)
        _put32(out, o + 4, nsec)
        _put32(out, o + 8, incl)
        _put32(out, o + 12, orig)
        o += 16
        if vlan:
            for k in range(12):
                out[o + k] = ring[d + k]
            out[o + 12] = (tpid >> 8) & 0xFF
            out[o + 13] = tpid & 0xFF
            out[o + 14] = (tci >> 8) & 0xFF
            out[o + 15] = tci & 0xFF
            rest = incl - 16
            for k in range(rest):
                out[o + 16 + k] = ring[d + 12 + k]
        else:
            for k in range(incl):
                out[o + k] = ring[d + k]
        o += incl
        orig_sum += orig
        if nxt == 0:
            break
        p += nxt
    return o, kept, orig_sum, outside


def pcap_file_header(snaplen: int) -> bytes:
    return struct.pack("<IHHiIII", PCAP_MAGIC_NS, 2, 4, 0, 0, snaplen, LINKTYPE_ETHERNET)


class PcapTap:
    """Start before attaching, stop after detaching, then commit() (or abort())."""

    def __init__(self, iface: str, path: str, snaplen: int = 128, direction: str = "ingress",
                 max_bytes: int = 1 << 30, block_size: int = 1 << 20, block_nr: int = 16):
        if not 64 <= snaplen <= 65535:
            raise DataplaneError(f"invalid pcap snap length {snaplen} (64..65535)", EXIT_USAGE)
        self.iface, self.path, self.snaplen, self.direction = iface, os.fspath(path), int(snaplen), direction
        self.max_bytes = int(max_bytes)
        self.block_size, self.block_nr = int(block_size), int(block_nr)
        self.frames = 0
        self.orig_bytes = 0
        self.not_written = 0
        self.outside = 0
        self.written = 0
        self.t_from = 0         # ns since the epoch; frames outside [t_from, t_to] are not kept
        self.t_to = 0
        self._err: BaseException | None = None
        self._stop = threading.Event()
        self._thread = None
        self._sock = self._mm = self._ring = None
        self._fh = None
        self._out = None  # core.files.AtomicFile
        self._kstats = (0, 0)
        self._committed = False

    # -- setup -------------------------------------------------------------------------------
    def start(self) -> "PcapTap":
        d = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(d):
            raise DataplaneError(f"{self.path}: directory {d} does not exist", EXIT_NOT_RUN)
        try:
            socket.if_nametoindex(self.iface)
        except OSError:
            raise DataplaneError(f"interface {self.iface!r} does not exist (see 'ip link')", EXIT_NO_IFACE) from None
        self._out = AtomicFile(self.path, suffix=".pcap.tmp")
        self._fh = self._out.fh
        self._fh.write(pcap_file_header(self.snaplen))
        try:
            self._open_socket()
        except BaseException:
            self.abort()
            raise
        self._thread = threading.Thread(target=self._run, name="skewscope-pcaptap", daemon=True)
        self._thread.start()
        return self

    def _open_socket(self):
        # protocol 0: no frames until bind(), so nothing unfiltered slips in before the filter
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
        self._sock = s
        insns = roce_filter(self.snaplen, self.direction)
        arr = (ctypes.c_uint8 * (8 * len(insns)))()
        ctypes.memmove(arr, b"".join(struct.pack("<HBBI", *i) for i in insns), 8 * len(insns))
        self._filter_buf = arr
        fprog = struct.pack("HxxxxxxQ", len(insns), ctypes.addressof(arr))
        s.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
        s.setsockopt(SOL_PACKET, PACKET_VERSION, TPACKET_V3)
        frame_size = 2048
        req = struct.pack("7I", self.block_size, self.block_nr, frame_size,
                          self.block_size // frame_size * self.block_nr, 50, 0, 0)
        s.setsockopt(SOL_PACKET, PACKET_RX_RING, req)
        self._mm = mmap.mmap(s.fileno(), self.block_size * self.block_nr, mmap.MAP_SHARED,
                             mmap.PROT_READ | mmap.PROT_WRITE)
        self._ring = np.frombuffer(self._mm, dtype=np.uint8)
        s.bind((self.iface, ETH_P_ALL))

    # -- the reader thread ---------------------------------------------------------------------
    def _run(self):
        out = np.empty(self.block_size * 2 + 65536, dtype=np.uint8)
        blk = 0
        poller = select.poll()
        poller.register(self._sock.fileno(), select.POLLIN | select.POLLERR)
        try:
            while True:
                base = blk * self.block_size
                if not (_u32(self._ring, base + 8) & TP_STATUS_USER):
                    if self._stop.is_set():
                        break
                    poller.poll(100)
                    continue
                n, frames, orig, outside = block_to_pcap(self._ring, base, out, self.snaplen, self.t_from,
                                                         self.t_to)
                self.outside += int(outside)
                self.frames += int(frames)
                self.orig_bytes += int(orig)
                if self.written + n <= self.max_bytes:
                    self._fh.write(out[:n].tobytes())
                    self.written += n
                else:
                    self.not_written += int(frames)
                self._ring[base + 8: base + 12] = 0       # TP_STATUS_KERNEL: hand the block back
                blk = (blk + 1) % self.block_nr
        except BaseException as e:  # reported by stop()
            self._err = e

    # -- teardown -----------------------------------------------------------------------------
    def window(self, t_from: int | None = None, t_to: int | None = None) -> None:
        """Keep only frames stamped in [t_from, t_to] (CLOCK_REALTIME ns): capture sets them
        at attach and at detach, so the pcap and the snapshot cover the same window."""
        if t_from is not None:
            self.t_from = int(t_from)
        if t_to is not None:
            self.t_to = int(t_to)

    def stop(self) -> None:
        """Stop reading: wait for the kernel to retire the last partly-filled block, drain
        it, read the kernel's counters, close the socket. Idempotent."""
        if self._thread is not None:
            time.sleep(0.08)          # > retire_blk_tov (50 ms): the open block gets retired
            self._stop.set()
            self._thread.join(timeout=10)
            self._thread = None
        if self._sock is not None:
            try:
                st = self._sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 12)
                pk, drops, _ = struct.unpack("3I", st)
                self._kstats = (pk, drops)
            except OSError:
                pass
            self._ring = None
            try:
                self._mm.close()
            except (BufferError, AttributeError):
                pass
            self._sock.close()
            self._sock = None

    def commit(self) -> None:
        self.stop()
        if self._err is not None:
            err, self._err = self._err, None
            self.abort()
            raise DataplaneError(f"{self.path}: pcap writer failed: {err}", EXIT_NOT_RUN)
        if self._out is not None:
            self._fh = None
            self._out.commit()
            self._out = None
            self._committed = True

    def abort(self) -> None:
        self.stop()
        self._fh = None
        if self._out is not None:
            self._out.abort()
            self._out = None

    def stats(self) -> dict:
        return {"file": self.path, "frames": self.frames, "bytes_written": self.written + 24,
                "frames_not_written": self.not_written, "frames_outside_window": self.outside,
                "kernel_frames": self._kstats[0],
                "kernel_drops": self._kstats[1], "snaplen": self.snaplen}
