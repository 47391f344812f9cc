"""Record-by-record pcap/pcapng reader (pure Python) for `skewscope replay`.

The bulk offline path (`skewscope report FILE.pcap`) has its own numba reader; both must
agree on these conventions, documented in docs/datapath.md:

- link types: Ethernet (1) as is; Linux cooked v1 (113) / v2 (276) and raw IP (101, and
  DLT_RAW 12/14) are turned into an Ethernet frame by synthesising a 14-byte Ethernet
  header (zero MACs, the packet's EtherType), so `bytes` counts 14 bytes of L2 header for
  them; original lengths are adjusted by the same difference.
- timestamps in ns (pcap µs or ns magic; pcapng if_tsresol per interface).
- a record shorter than its original length (snaplen) is reported with both lengths.
"""
from __future__ import annotations

import gzip
import struct
import zlib
from dataclasses import dataclass
from typing import Iterator

from skewscope.core.errors import SkewscopeError

LINKTYPE_ETHERNET = 1
LINKTYPE_RAW = 101
LINKTYPE_LINUX_SLL = 113
LINKTYPE_LINUX_SLL2 = 276
LINKTYPE_ERF = 197
DLT_RAW_ALIASES = (12, 14)
SUPPORTED_LINKTYPES = {LINKTYPE_ETHERNET: "Ethernet", LINKTYPE_RAW: "raw IP", 12: "raw IP", 14: "raw IP",
                       LINKTYPE_LINUX_SLL: "Linux cooked v1", LINKTYPE_LINUX_SLL2: "Linux cooked v2"}
LINKTYPE_NAMES = {LINKTYPE_ERF: "ERF (native InfiniBand/DAG)", 247: "InfiniBand", 105: "802.11",
                  127: "802.11 radiotap", 0: "BSD loopback", 113: "Linux cooked v1"}

PCAP_MAGIC_US = 0xA1B2C3D4
PCAP_MAGIC_NS = 0xA1B23C4D
PCAPNG_SHB = 0x0A0D0D0A


class PcapError(SkewscopeError):
    """Unreadable capture (one-line message)."""


@dataclass
class Record:
    ts_ns: int
    orig_len: int       # original length on the wire (of the Ethernet frame we hand on)
    data: bytes         # captured bytes (Ethernet frame; may be shorter than orig_len)
    linktype: int


def open_capture(path: str):
    fh = open(path, "rb")
    head = fh.read(2)
    fh.seek(0)
    if head == b"\x1f\x8b":
        fh.close()
        return gzip.open(path, "rb")
    return fh


def _to_ethernet(linktype: int, data: bytes, orig_len: int) -> tuple[bytes, int] | None:
    """Map a record of a supported link type to (ethernet_frame, orig_len_of_that_frame)."""
    if linktype == LINKTYPE_ETHERNET:
        return data, orig_len
    # A record too short for its link-layer header becomes an empty frame: counted (as
    # truncated_eth, like any frame shorter than an Ethernet header), never silently dropped.
    if linktype in (LINKTYPE_RAW, *DLT_RAW_ALIASES):
        if not data:
            return b"", orig_len + 14
        v = data[0] >> 4
        et = b"\x08\x00" if v == 4 else b"\x86\xdd" if v == 6 else b"\x00\x00"
        return b"\0" * 12 + et + data, orig_len + 14
    if linktype == LINKTYPE_LINUX_SLL:
        if len(data) < 16:
            return b"", max(orig_len - 2, 0)
        return b"\0" * 12 + data[14:16] + data[16:], orig_len - 2
    if linktype == LINKTYPE_LINUX_SLL2:
        if len(data) < 20:
            return b"", max(orig_len - 6, 0)
        return b"\0" * 12 + data[0:2] + data[20:], orig_len - 6
    return None


def read_records(path: str) -> Iterator[Record]:
    """Yield records as Ethernet frames. Raises PcapError for unreadable files or
    unsupported link types (e.g. ERF/native InfiniBand)."""
    try:
        fh = _Guarded(open_capture(path), path)
    except OSError as e:
        raise PcapError(f"{path}: {e.strerror or e}") from None
    with fh:
        try:
            head = fh.read(24)
        except (OSError, EOFError) as e:
            raise PcapError(f"{path}: {e}") from None
        if len(head) == 0:
            raise PcapError(f"{path}: empty file")
        if len(head) < 4:
            raise PcapError(f"{path}: too short to be a capture")
        m_le = struct.unpack("<I", head[:4])[0]
        m_be = struct.unpack(">I", head[:4])[0]
        if m_le == PCAPNG_SHB:
            yield from _read_pcapng(path, fh, head)
            return
        if m_le in (PCAP_MAGIC_US, PCAP_MAGIC_NS):
            e = "<"
        elif m_be in (PCAP_MAGIC_US, PCAP_MAGIC_NS):
            e = ">"
        else:
            raise PcapError(f"{path}: not a pcap or pcapng file (magic 0x{m_le:08x})")
        if len(head) < 24:
            raise PcapError(f"{path}: truncated pcap header")
        magic = struct.unpack(e + "I", head[:4])[0]
        mult = 1 if magic == PCAP_MAGIC_NS else 1000
        linktype = struct.unpack(e + "I", head[20:24])[0] & 0x0FFFFFFF
        _check_linktype(path, linktype)
        n = 0
        while True:
            rh = fh.read(16)
            if not rh:
                return
            if len(rh) < 16:
                raise PcapError(f"{path}: record {n + 1} header truncated")
            sec, frac, incl, orig = struct.unpack(e + "IIII", rh)
            if incl > 262144 * 4:
                raise PcapError(f"{path}: record {n + 1} length {incl} is implausible (corrupt file)")
            data = fh.read(incl)
            if len(data) < incl:
                raise PcapError(f"{path}: record {n + 1} runs past the end of the file")
            n += 1
            conv = _to_ethernet(linktype, data, max(orig, incl))
            if conv is None:
                continue
            yield Record(sec * 1_000_000_000 + frac * mult, conv[1], conv[0], linktype)


class _Guarded:
    """A capture file whose read errors (a cut or corrupt gzip stream: EOFError,
    zlib.error, BadGzipFile; I/O errors) become PcapError, the reader's one documented error."""

    def __init__(self, fh, path: str):
        self.fh, self.path = fh, path

    def read(self, n: int = -1) -> bytes:
        try:
            return self.fh.read(n)
        except (OSError, EOFError, zlib.error) as e:
            raise PcapError(f"{self.path}: cannot read the capture: {getattr(e, 'strerror', None) or e}") from None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.fh.close()


def _check_linktype(path: str, lt: int) -> None:
    if lt not in SUPPORTED_LINKTYPES:
        name = LINKTYPE_NAMES.get(lt, f"link type {lt}")
        raise PcapError(f"{path}: unsupported link type {lt} ({name}); skewscope reads Ethernet, "
                        "Linux cooked (v1/v2) and raw IP captures of RoCE")


def _read_pcapng(path: str, fh, head: bytes) -> Iterator[Record]:
    buf = head
    ifaces: list[tuple[int, int, int]] = []  # (linktype, if_tsresol, snaplen)
    e = "<"
    n = 0

    def need(k):
        nonlocal buf
        while len(buf) < k:
            chunk = fh.read(max(65536, k - len(buf)))
            if not chunk:
                return False
            buf += chunk
        return True

    while True:
        if not need(8):
            if buf:
                raise PcapError(f"{path}: truncated pcapng block at the end")
            return
        btype_raw = buf[:4]
        if struct.unpack("<I", btype_raw)[0] == PCAPNG_SHB:
            if not need(12):
                raise PcapError(f"{path}: truncated section header")
            bom = buf[8:12]
            e = "<" if bom == b"\x4d\x3c\x2b\x1a" else ">" if bom == b"\x1a\x2b\x3c\x4d" else None
            if e is None:
                raise PcapError(f"{path}: bad pcapng byte-order magic")
            ifaces = []
        btype, blen = struct.unpack(e + "II", buf[:8])
        if blen < 12 or blen % 4 or blen > 64 * 1024 * 1024:
            raise PcapError(f"{path}: corrupt pcapng block length {blen}")
        if not need(blen):
            raise PcapError(f"{path}: pcapng block runs past the end of the file")
        body = buf[8:blen - 4]
        buf = buf[blen:]
        if btype == 1:  # IDB
            if len(body) < 8:
                raise PcapError(f"{path}: truncated interface description block")
            lt = struct.unpack(e + "H", body[:2])[0]
            tsres = 6
            snaplen = struct.unpack(e + "I", body[4:8])[0]
            opts = body[8:]
            while len(opts) >= 4:
                code, olen = struct.unpack(e + "HH", opts[:4])
                if code == 0:
                    break
                if code == 9 and olen >= 1:
                    tsres = opts[4]
                opts = opts[4 + ((olen + 3) & ~3):]
            ifaces.append((lt, tsres, snaplen))
        elif btype in (6, 3, 2):  # EPB, SPB, obsolete Packet Block
            if btype in (6, 2):
                if len(body) < 20:
                    raise PcapError(f"{path}: truncated enhanced packet block")
                if btype == 6:
                    iid, th, tl, incl, orig = struct.unpack(e + "IIIII", body[:20])
                else:  # PB: 16-bit interface id, 16-bit drops count
                    iid, _drops, th, tl, incl, orig = struct.unpack(e + "HHIIII", body[:20])
                data = body[20:20 + incl]
                ticks = (th << 32) | tl
            else:
                if len(body) < 4:
                    raise PcapError(f"{path}: truncated simple packet block")
                iid, ticks = 0, 0
                orig = struct.unpack(e + "I", body[:4])[0]
                # captured = min(original, the interface's snaplen): the rest is padding
                snap = ifaces[0][2] if ifaces and ifaces[0][2] else orig
                data = body[4:4 + min(orig, snap)]
                incl = len(data)
            if iid >= len(ifaces):
                raise PcapError(f"{path}: packet for undeclared interface {iid}")
            lt, tsres, _snap = ifaces[iid]
            _check_linktype(path, lt)
            if tsres & 0x80:  # exact integer arithmetic (no float rounding at ns)
                ts = (ticks * 1_000_000_000) >> (tsres & 0x7F)
            else:
                p = tsres
                ts = ticks * 10 ** (9 - p) if p <= 9 else ticks // 10 ** (p - 9)
            n += 1
            conv = _to_ethernet(lt, bytes(data), max(orig, incl))
            if conv is None:
                continue
            yield Record(ts, conv[1], conv[0], lt)
        # other blocks (NRB, ISB, DSB, custom, unknown) are skipped
