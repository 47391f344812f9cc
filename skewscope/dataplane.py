"""Compile, load, attach and read the eBPF data plane (ebpf/skewscope.bpf.c).

- compile with bcc; every setting reaches the C source only as a validated integer -D flag
- load with our own BPF_PROG_LOAD (bcc's load_func cannot set BPF_F_XDP_HAS_FRAGS, which
  jumbo-frame RoCE on veth/mlx5 needs), named skewscope_xdp / skewscope_tc so that detach
  can recognise our programs and never touch anyone else's
- attach XDP (native or generic) or TC clsact (ingress, egress, both) with pyroute2
- read maps with BPF_MAP_LOOKUP_BATCH into numpy; message records through an mmap of the
  BPF_F_MMAPABLE array; no Python object per flow or per record
"""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import errno
import mmap
import os
import signal
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import bpfsys, layout as L
from .snapshot import Snapshot, events_from_records, flows_from_raw

EBPF_DIR = Path(__file__).resolve().parent.parent / "ebpf"
SOURCE = EBPF_DIR / "skewscope.bpf.c"
PROG_XDP = "skewscope_xdp"
PROG_TC = "skewscope_tc"
OUR_PROG_NAMES = (PROG_XDP, PROG_TC)

XDP_FLAGS_UPDATE_IF_NOEXIST = 1
XDP_FLAGS_SKB_MODE = 2
XDP_FLAGS_DRV_MODE = 4

# exit codes shared by the CLI (documented in README "Exit codes")
EXIT_USAGE = 2
EXIT_NOT_RUN = 3
EXIT_NO_PRIV = 4
EXIT_NO_BCC = 5
EXIT_NO_IFACE = 6
EXIT_BUSY = 7
EXIT_KERNEL = 8


class DataplaneError(Exception):
    """One-line, user-facing error with an exit code."""

    def __init__(self, msg: str, code: int = EXIT_NOT_RUN):
        super().__init__(msg)
        self.code = code


def possible_cpus() -> int:
    try:
        txt = Path("/sys/devices/system/cpu/possible").read_text().strip()
        hi = 0
        for part in txt.split(","):
            hi = max(hi, int(part.split("-")[-1]))
        return hi + 1
    except (OSError, ValueError):
        return os.cpu_count() or 1


def kernel_at_least(major: int, minor: int) -> bool:
    try:
        parts = os.uname().release.split(".")
        return (int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)) >= (major, minor)
    except (ValueError, IndexError):
        return True


def _pow2(n: int) -> bool:
    return n > 0 and (n & (n - 1)) == 0


@dataclass
class Config:
    max_flows: int = 65536
    ev_per_cpu: int = 65536
    sample_n: int = 1
    replay_clock: bool = False
    xdp_frags: bool | None = None  # None: on when the kernel supports it (>= 5.18), probed
    # XDP wire length computed inline from the kernel's xdp_buff (kfuncs + BTF) instead of a
    # bpf_xdp_get_buff_len call; None: on when the kernel's BTF has what it needs and the
    # load-time check agrees with the helper (Dataplane falls back to the helper otherwise)
    xdp_kctx: bool | None = None
    ncpus: int = field(default_factory=possible_cpus)

    def validate(self) -> None:
        # Only integers within these bounds ever become -D flags (no text reaches the C).
        for name, lo, hi in (("max_flows", 16, 1 << 24), ("ev_per_cpu", 16, 1 << 22),
                             ("sample_n", 1, 1 << 20), ("ncpus", 1, 4096)):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
                raise DataplaneError(f"invalid {name.replace('_', '-')}: {v!r} (must be an integer in {lo}..{hi})",
                                     EXIT_USAGE)
        if not _pow2(self.ev_per_cpu):
            raise DataplaneError(f"invalid ev-per-cpu: {self.ev_per_cpu} (must be a power of two)", EXIT_USAGE)

    def resolve(self) -> "Config":
        """Fill in what depends on the running kernel (xdp_frags)."""
        if self.xdp_frags is None:
            self.xdp_frags = bpfsys.xdp_frags_supported()
        return self

    def cflags(self) -> list[str]:
        self.validate()
        self.resolve()
        f = [f"-I{EBPF_DIR}", f"-DSS_MAX_FLOWS={int(self.max_flows)}", f"-DSS_NCPUS={int(self.ncpus)}",
             f"-DSS_EV_PER_CPU={int(self.ev_per_cpu)}", f"-DSS_SAMPLE_N={int(self.sample_n)}",
             "-Wno-unused-function"]
        if self.replay_clock:
            f.append("-DSS_REPLAY_CLOCK=1")
        if self.xdp_frags:
            f.append("-DSS_XDP_FRAGS=1")
            kx = xdp_kctx_layout() if self.xdp_kctx is not False else None
            if kx is not None:
                f += ["-DSS_XDP_KCTX=1", f"-DSS_KF_CAST_KCTX={KF_SENTINEL_CAST_KCTX}",
                      f"-DSS_KF_RDONLY_CAST={KF_SENTINEL_RDONLY_CAST}",
                      f"-DSS_KX_FLAGS_OFF={kx['flags_off']}", f"-DSS_KX_HAS_FRAGS={kx['frags_bit']}",
                      f"-DSS_KX_HARD_OFF={kx['hard_off']}", f"-DSS_KX_FRAMESZ_OFF={kx['framesz_off']}",
                      f"-DSS_KX_SINFO_ALIGNED={kx['sinfo_aligned']}", f"-DSS_KX_SINFO_ID={kx['sinfo_id']}",
                      f"-DSS_KX_FRAGS_SIZE_OFF={kx['frags_size_off']}"]
        if kernel_at_least(5, 12):
            f.append("-DSS_ORDERED_SEQ=1")  # BPF_XCHG for the message-record seq stores
        return f

    def memory_bytes(self) -> dict:
        """Kernel memory of the two big maps, as the kernel accounts it (memlock in fdinfo),
        for a 64-bit kernel: the flows LRU hash preallocates every element (struct htab_elem,
        48 bytes, + key + value, each rounded to 8) and has 16-byte buckets for the next power
        of two of entries; the message-record array is mmapable, so page-rounded (+1 page).
        Small maps (globals, op_table, ev_head, ...) add a few KiB."""
        elem = HTAB_ELEM_OVERHEAD + _round8(L.FLOW_KEY_DTYPE.itemsize) + _round8(L.FLOW_STATS_DTYPE.itemsize)
        flows = self.max_flows * elem + _next_pow2(self.max_flows) * HTAB_BUCKET_SIZE
        page = mmap.PAGESIZE
        events = (self.ncpus * self.ev_per_cpu * L.MSG_REC_DTYPE.itemsize + page - 1) // page * page + page
        return {"flows": flows, "events": events, "total": flows + events,
                "flow_entry": elem, "event_entry": L.MSG_REC_DTYPE.itemsize}


HTAB_ELEM_OVERHEAD = 48  # sizeof(struct htab_elem) on 64-bit kernels (hash node, LRU node, hash)
HTAB_BUCKET_SIZE = 16    # struct bucket: hlist_nulls_head + lock, padded


def _round8(n: int) -> int:
    return (n + 7) // 8 * 8


def _next_pow2(n: int) -> int:
    return 1 << (max(1, n) - 1).bit_length()


# ---- inline XDP wire length (SS_XDP_KCTX) ---------------------------------------------
KF_SENTINEL_CAST_KCTX = 1000001    # helper numbers no kernel has; prog_fd rewrites the calls
KF_SENTINEL_RDONLY_CAST = 1000002  # into kfunc calls (BPF_PSEUDO_KFUNC_CALL, vmlinux BTF id)
BPF_PSEUDO_KFUNC_CALL = 2
SMP_CACHE_BYTES = 64  # SKB_DATA_ALIGN of x86-64 and arm64; the load-time probe catches others

_BTF_EXTRA = {1: 4, 3: 12, 14: 4, 17: 4}                     # kind -> bytes after the header
_BTF_PER_VLEN = {4: 12, 5: 12, 6: 8, 13: 8, 15: 12, 19: 12}  # kind -> bytes per vlen entry
_KCTX_LAYOUT: dict | None | bool = False


def xdp_kctx_layout(path: str = "/sys/kernel/btf/vmlinux") -> dict | None:
    """What ss_xdp_len needs from the running kernel's BTF (read once): the kfunc ids of
    bpf_cast_to_kern_ctx / bpf_rdonly_cast, offsets of xdp_buff.{data_hard_start, frame_sz,
    flags}, XDP_FLAGS_HAS_FRAGS, skb_shared_info's id, aligned size and xdp_frags_size
    offset. None when anything is missing (old kernel, no BTF): the helper is used then."""
    global _KCTX_LAYOUT
    if _KCTX_LAYOUT is not False:
        return _KCTX_LAYOUT
    try:
        _KCTX_LAYOUT = _parse_kctx_layout(Path(path).read_bytes())
    except (OSError, struct.error, KeyError, IndexError, ValueError):
        _KCTX_LAYOUT = None
    return _KCTX_LAYOUT


def _parse_kctx_layout(b: bytes) -> dict | None:
    unpack = struct.unpack_from
    magic, _v, _f, hdr_len, toff, tlen, soff, slen = unpack("<HBBIIIII", b, 0)
    if magic != 0xEB9F:
        return None
    t0, s0 = hdr_len + toff, hdr_len + soff
    strs = b[s0:s0 + slen]
    names = ("bpf_cast_to_kern_ctx", "bpf_rdonly_cast", "xdp_buff", "skb_shared_info", "XDP_FLAGS_HAS_FRAGS",
             "data_hard_start", "frame_sz", "flags", "xdp_frags_size")
    want = {}
    for n in names:
        i = strs.find(b"\0" + n.encode() + b"\0")
        if i < 0:
            return None
        want[n] = i + 1
    inv = {v: k for k, v in want.items()}
    types: dict[int, tuple] = {}  # id -> (kind, size/type, offset of extra data, vlen, kind_flag)
    found: dict[str, int] = {}
    pos, tid, end = t0, 1, t0 + tlen
    while pos < end:
        no, info, sz = unpack("<III", b, pos)
        kind, vlen = (info >> 24) & 0x1F, info & 0xFFFF
        types[tid] = (kind, sz, pos + 12, vlen, info >> 31)
        n = inv.get(no)
        if n is not None and n not in found:
            if (kind == 12 and n.startswith("bpf_")) or (kind == 4 and n in ("xdp_buff", "skb_shared_info")):
                found[n] = tid
        if kind == 6 and "frags_bit" not in found:
            for i in range(vlen):
                eno, ev = unpack("<Ii", b, pos + 12 + 8 * i)
                if eno == want["XDP_FLAGS_HAS_FRAGS"]:
                    found["frags_bit"] = ev
        pos += 12 + _BTF_EXTRA.get(kind, 0) + _BTF_PER_VLEN.get(kind, 0) * vlen
        tid += 1
    if len(found) < 5:
        return None

    def resolve(t):
        while types[t][0] in (8, 9, 10, 11, 18):  # typedef, volatile, const, restrict, type_tag
            t = types[t][1]
        return t

    def member(sid, name, base=0):  # (byte offset, size) of a member, through anonymous ones
        _k, _sz, mpos, vlen, kf = types[sid]
        for i in range(vlen):
            mno, mt, moff = unpack("<III", b, mpos + 12 * i)
            bit = moff & 0xFFFFFF if kf else moff
            rt = resolve(mt)
            if mno == want.get(name):
                msize = 8 if types[rt][0] == 2 else types[rt][1]  # a PTR's size field is its target
                return (base + bit // 8, msize) if bit % 8 == 0 else None
            if mno == 0 and types[rt][0] in (4, 5):
                r = member(rt, name, base + bit // 8)
                if r:
                    return r
        return None

    xb, si = found["xdp_buff"], found["skb_shared_info"]
    hard, fsz, fl = member(xb, "data_hard_start"), member(xb, "frame_sz"), member(xb, "flags")
    fs = member(si, "xdp_frags_size")
    if not (hard and fsz and fl and fs) or hard[1] != 8 or fsz[1] != 4 or fl[1] != 4 or fs[1] != 4:
        return None
    size = types[si][1]
    return {"cast_kctx": found["bpf_cast_to_kern_ctx"], "rdonly_cast": found["bpf_rdonly_cast"],
            "sinfo_id": si, "sinfo_aligned": (size + SMP_CACHE_BYTES - 1) // SMP_CACHE_BYTES * SMP_CACHE_BYTES,
            "frags_bit": found["frags_bit"], "hard_off": hard[0], "framesz_off": fsz[0], "flags_off": fl[0],
            "frags_size_off": fs[0]}


def _patch_kfunc_calls(insns: bytes) -> bytes:
    """Rewrite the sentinel helper calls of an SS_XDP_KCTX build into kfunc calls."""
    kx = xdp_kctx_layout()
    ids = {KF_SENTINEL_CAST_KCTX: kx["cast_kctx"], KF_SENTINEL_RDONLY_CAST: kx["rdonly_cast"]}
    out = bytearray(insns)
    for off in range(0, len(out) - 7, 8):
        if out[off] == 0x85:  # BPF_JMP | BPF_CALL
            imm = struct.unpack_from("<i", out, off + 4)[0]
            if imm in ids:
                out[off + 1] = (BPF_PSEUDO_KFUNC_CALL << 4) | (out[off + 1] & 0x0F)
                struct.pack_into("<hi", out, off + 2, 0, ids[imm])
    return bytes(out)


def check_privileges() -> None:
    if os.geteuid() != 0:
        raise DataplaneError("skewscope needs root (CAP_BPF + CAP_NET_ADMIN) to load eBPF programs; "
                             "run with sudo, or use 'skewscope report FILE.pcap' which needs no privileges",
                             EXIT_NO_PRIV)


def import_bcc():
    try:
        import bcc  # noqa: F401
        from bcc import BPF, lib
        return BPF, lib
    except ImportError:
        raise DataplaneError("bcc is not importable: install the OS package python3-bpfcc "
                             "(not the PyPI 'bcc') and run 'make setup'", EXIT_NO_BCC) from None


class Dataplane:
    """The compiled BPF object: maps + loaded programs (not yet attached)."""

    def __init__(self, config: Config | None = None):
        self.config = config or Config()
        self.config.validate()
        check_privileges()
        self.config.resolve()
        BPF, self._lib = import_bcc()
        self.prog_fds: dict[str, int] = {}
        self._map_fds: dict[str, int] = {}
        text = SOURCE.read_text()
        self.bpf = self._compile(BPF, text)
        if self.config.xdp_frags and self.config.xdp_kctx is not False and xdp_kctx_layout() is not None:
            ok = self._check_kctx_len()
            if not ok:  # helper fallback: rebuild without the inline length
                self.bpf.cleanup()
                self.config.xdp_kctx = False
                self.bpf = self._compile(BPF, text)
            else:
                self.config.xdp_kctx = True
        else:
            self.config.xdp_kctx = False
        self._init_op_table()
        self._ev_map = None
        self._ev_head_read = np.zeros(self.config.ncpus, dtype=np.uint64)
        self.events_lost = 0
        self._clock_key = None

    def _compile(self, BPF, text):
        import contextlib
        import io
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                return BPF(text=text.encode(), cflags=self.config.cflags())
        except Exception as e:  # bcc raises bare Exception on compile errors
            detail = (str(e) or err.getvalue().strip().splitlines()[-1:] or ["?"])
            msg = detail if isinstance(detail, str) else detail[0]
            if "kernel headers" in msg or "/lib/modules" in msg or "build" in msg.lower() and "found" in msg.lower():
                raise DataplaneError(f"cannot compile the BPF program: {msg} (run 'make setup' to install "
                                     "kernel headers)", EXIT_KERNEL) from None
            raise DataplaneError(f"cannot compile the BPF program: {msg}", EXIT_KERNEL) from None

    def _init_op_table(self):
        t = self.bpf[b"op_table"]
        for op in np.nonzero(L.OPCODE_TABLE)[0]:
            t[ctypes.c_int(int(op))] = ctypes.c_uint(int(L.OPCODE_TABLE[op]))

    def _load_xdp(self, name: str) -> int:
        bname = name.encode()
        start = self._lib.bpf_function_start(self.bpf.module, bname)
        size = self._lib.bpf_function_size(self.bpf.module, bname)
        lic = ctypes.string_at(self._lib.bpf_module_license(self.bpf.module)) or b"GPL"
        if not start:
            raise DataplaneError(f"BPF function {name} missing from the compiled object", EXIT_KERNEL)
        flags = bpfsys.BPF_F_XDP_HAS_FRAGS if self.config.xdp_frags else 0
        if self.config.xdp_kctx is not False and xdp_kctx_layout() is not None:
            buf = ctypes.create_string_buffer(_patch_kfunc_calls(ctypes.string_at(start, size)), size)
            start = ctypes.addressof(buf)
        return bpfsys.prog_load(bpfsys.BPF_PROG_TYPE_XDP, start, size, name, lic, flags=flags,
                                expected_attach_type=bpfsys.BPF_XDP if flags else 0)

    def _check_kctx_len(self) -> bool:
        """Does the inline XDP wire length (SS_XDP_KCTX) load, and agree with
        bpf_xdp_get_buff_len on a linear and on a multi-buffer frame?"""
        try:
            fd = self._load_xdp("skewscope_lenprobe")
        except bpfsys.BPFError:
            return False
        try:
            for n in (60, 1514, 9000):
                ret, _ = bpfsys.prog_test_run(fd, bytes(n))
                if ret != 1:
                    return False
            return True
        except bpfsys.BPFError:
            return False
        finally:
            os.close(fd)

    # ---- programs ----------------------------------------------------------------
    def prog_fd(self, kind: str) -> int:
        """Load (once) and return the fd of 'xdp' or 'tc'."""
        if kind in self.prog_fds:
            return self.prog_fds[kind]
        name = PROG_XDP if kind == "xdp" else PROG_TC
        bname = name.encode()
        start = self._lib.bpf_function_start(self.bpf.module, bname)
        size = self._lib.bpf_function_size(self.bpf.module, bname)
        lic = ctypes.string_at(self._lib.bpf_module_license(self.bpf.module)) or b"GPL"
        if not start:
            raise DataplaneError(f"BPF function {name} missing from the compiled object", EXIT_KERNEL)
        try:
            if kind == "xdp":
                fd = self._load_xdp(name)
            else:
                fd = bpfsys.prog_load(bpfsys.BPF_PROG_TYPE_SCHED_CLS, start, size, name, lic)
        except bpfsys.BPFError as e:
            if e.errno == errno.EPERM:
                raise DataplaneError("the kernel refused to load the BPF program (EPERM): need root/CAP_BPF, "
                                     "or raise RLIMIT_MEMLOCK", EXIT_NO_PRIV) from None
            raise DataplaneError(f"the kernel refused {name}: {e.strerror}", EXIT_KERNEL) from None
        self.prog_fds[kind] = fd
        return fd

    def close(self):
        for fd in self.prog_fds.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self.prog_fds.clear()
        if self._ev_map is not None:
            try:
                self._ev_map.close()
            except BufferError:
                pass
            self._ev_map = None
        try:
            self.bpf.cleanup()
        except Exception:
            pass

    # ---- replay clock ---------------------------------------------------------------
    def set_replay(self, ts_ns: int, caplen: int = 0xFFFF, wire_len: int = 0) -> None:
        """Replay builds only: the time, captured length and (if not 0) original wire length
        the next test run sees (set on every CPU, so CPU migration between syscalls cannot
        matter)."""
        if self._clock_key is None:
            self._clock_key = (0).to_bytes(4, "little")
            self._clock_fd = self._fd("clock")
        v = struct.pack("<QII", int(ts_ns), int(caplen) & 0xFFFF, int(wire_len) & 0xFFFFFFFF)
        bpfsys.map_update(self._clock_fd, self._clock_key, v * self.config.ncpus)

    def reset(self) -> None:
        """Forget everything counted so far: flows, global counters, message records.
        For tests and replays between runs; not atomic against a program receiving traffic."""
        self.bpf[b"flows"].clear()
        ncpu = self.config.ncpus
        zero = bytes(8 * ncpu)
        gfd = self._fd("globals")
        for i in range(L.G_N):
            bpfsys.map_update(gfd, i.to_bytes(4, "little"), zero)
        bpfsys.map_update(self._fd("ev_head"), (0).to_bytes(4, "little"), zero)
        self._ev_head_read[:] = 0
        self.events_lost = 0

    # ---- reading ----------------------------------------------------------------------
    def _fd(self, name: str) -> int:
        fd = self._map_fds.get(name)
        if fd is None:
            fd = self._map_fds[name] = self.bpf[name.encode()].map_fd
        return fd

    def read_globals(self) -> np.ndarray:
        ncpu = self.config.ncpus
        _, vals = bpfsys.map_lookup_batch(self._fd("globals"), 4, 8 * ncpu, L.G_N)
        return vals.view("<u8").reshape(-1, ncpu).sum(axis=1).astype(np.uint64)

    def read_flows(self) -> np.ndarray:
        keys, vals = bpfsys.map_lookup_batch(self._fd("flows"), L.FLOW_KEY_DTYPE.itemsize,
                                             L.FLOW_STATS_DTYPE.itemsize, self.config.max_flows)
        return flows_from_raw(keys, vals)

    def _events_view(self) -> np.ndarray:
        if self._ev_map is None:
            n = self.config.ncpus * self.config.ev_per_cpu
            size = n * L.MSG_REC_DTYPE.itemsize
            size = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE
            self._ev_map = mmap.mmap(self._fd("msg_events"), size, mmap.MAP_SHARED, mmap.PROT_READ)
        n = self.config.ncpus * self.config.ev_per_cpu
        return np.frombuffer(self._ev_map, dtype=L.MSG_REC_DTYPE, count=n)

    def _ev_heads(self) -> np.ndarray:
        ncpu = self.config.ncpus
        _, vals = bpfsys.map_lookup_batch(self._fd("ev_head"), 4, 8 * ncpu, 1)
        return vals.view("<u8").reshape(ncpu).copy()

    def read_new_records(self) -> np.ndarray:
        """Message records written since the previous call (per-CPU regions, seq-checked).
        Records overwritten before being read are added to self.events_lost."""
        view = self._events_view()
        per = self.config.ev_per_cpu
        heads = self._ev_heads()
        parts = []
        for cpu in np.nonzero(heads != self._ev_head_read)[0]:
            lo, hi = int(self._ev_head_read[cpu]), int(heads[cpu])
            if hi - lo > per:
                self.events_lost += hi - lo - per
                lo = hi - per
            seqs = np.arange(lo, hi, dtype=np.uint64)
            region = view[cpu * per:(cpu + 1) * per]
            idx = (seqs % per).astype(np.int64)
            # seqlock-style: the writer zeroes a slot's seq, writes the record, then sets
            # seq = its sequence + 1. A slot is good when its seq is the expected one before
            # and after the copy (a writer that touched it meanwhile changed seq).
            before = region["seq"][idx].copy()
            recs = region[idx].copy()
            after = region["seq"][idx]
            want = seqs + 1
            ok = (before == want) & (recs["seq"] == want) & (after == want)
            self.events_lost += int((~ok).sum())
            parts.append(recs[ok])
            self._ev_head_read[cpu] = hi
        if not parts:
            return np.zeros(0, dtype=L.MSG_REC_DTYPE)
        return np.concatenate(parts)

    def snapshot(self, meta: dict, records: np.ndarray | None = None) -> Snapshot:
        """Read everything into a Snapshot. `records`: accumulated message records (else
        the ones still unread in the maps)."""
        glob = self.read_globals()
        flows = self.read_flows()
        if records is None:
            records = self.read_new_records()
        events = events_from_records(flows, records)
        m = dict(meta)
        created = int(glob[L.G_FLOWS_CREATED])
        m.update({
            "max_flows": self.config.max_flows,
            "sample_n": self.config.sample_n,
            "flows_present": int(len(flows)),
            "flows_created": created,
            "flows_evicted": max(0, created - len(flows)),
            "events_lost": int(self.events_lost),
            "events_capacity_per_cpu": self.config.ev_per_cpu,
        })
        return Snapshot(flows=flows, events=events, globals=glob, meta=m)


# ---- attach / detach ------------------------------------------------------------------
def ifindex(name: str) -> int:
    try:
        return socket.if_nametoindex(name)
    except OSError:
        raise DataplaneError(f"interface {name!r} does not exist", EXIT_NO_IFACE) from None


def _ipr():
    from pyroute2 import IPRoute
    return IPRoute()


def xdp_prog_id(ifname: str) -> int:
    """Id of the XDP program attached to ifname (0 = none)."""
    idx = ifindex(ifname)
    with _ipr() as ipr:
        link = ipr.get_links(idx)[0]
    xdp = link.get_attr("IFLA_XDP")
    if not xdp:
        return 0
    return int(xdp.get_attr("IFLA_XDP_PROG_ID") or 0)


def _xdp_set(idx: int, fd: int, flags: int) -> None:
    with _ipr() as ipr:
        ipr.link("set", index=idx, xdp={"attrs": [("IFLA_XDP_FD", fd), ("IFLA_XDP_FLAGS", flags)]})


# ---- signals: a process that attached always detaches ---------------------------------------
class Terminated(SystemExit):
    """SIGTERM/SIGHUP as an exception: `finally` blocks, `with` exits and atexit hooks (which
    detach) run, and the process exits with status 128 + signal number, without a traceback."""

    def __init__(self, signum: int):
        super().__init__(128 + int(signum))
        self.signum = int(signum)


EXIT_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def exit_on_signals(signums=EXIT_SIGNALS, only_if_default: bool = False):
    """Within the block, SIGTERM/SIGHUP raise Terminated in the main thread (Ctrl-C already
    raises KeyboardInterrupt), so the cleanup of an attach runs. With only_if_default, a
    signal whose handler the application has set already is left alone. Previous handlers
    are restored on exit. Use it around anything that attaches (top, capture, export, ...)."""
    old = _install_exit_handlers(signums, only_if_default)
    try:
        yield
    finally:
        _restore_handlers(old)


def _raise_terminated(signum, frame):
    raise Terminated(signum)


def _install_exit_handlers(signums, only_if_default: bool) -> dict:
    old: dict = {}
    if threading.current_thread() is not threading.main_thread():
        return old  # signal handlers can only be set from the main thread
    for sig in signums:
        try:
            cur = signal.getsignal(sig)
            if only_if_default and cur is not signal.SIG_DFL:
                continue
            old[sig] = signal.signal(sig, _raise_terminated)
        except (ValueError, OSError):
            pass
    return old


def _restore_handlers(old: dict) -> None:
    for sig, h in old.items():
        try:
            if signal.getsignal(sig) is _raise_terminated:
                signal.signal(sig, h if h is not None else signal.SIG_DFL)
        except (ValueError, OSError):
            pass


class Attachment:
    """Programs attached to one interface; detach() restores the interface.

    Safety: once attached, the attachment is detached when the process exits normally
    (atexit), on an exception or Ctrl-C through `with` / the caller's finally, and on
    SIGTERM/SIGHUP: if the application has not set its own handler for them, attach()
    installs one that raises Terminated (SystemExit) until detach(). Only SIGKILL (or a
    crash of the interpreter) leaves a program attached: `skewscope detach -i IFACE`."""

    def __init__(self, dp: Dataplane, ifname: str, mode: str = "xdp", xdp_mode: str = "native",
                 direction: str = "ingress"):
        if mode not in ("xdp", "tc") or xdp_mode not in ("native", "generic") or \
                direction not in ("ingress", "egress", "both"):
            raise DataplaneError(f"invalid attach mode {mode}/{xdp_mode}/{direction}", EXIT_USAGE)
        if mode == "xdp" and direction != "ingress":
            raise DataplaneError("XDP sees ingress only; use TC for egress or both directions", EXIT_USAGE)
        self.dp, self.ifname, self.mode, self.xdp_mode, self.direction = dp, ifname, mode, xdp_mode, direction
        self.idx = ifindex(ifname)
        self.attached = False
        self._created_clsact = False
        self._xdp_flags = 0
        self._xdp_prog = 0
        self._old_handlers: dict = {}
        self._netns_fd = -1

    def attach(self) -> "Attachment":
        if self.mode == "xdp":
            cur = xdp_prog_id(self.ifname)
            if cur:
                name = bpfsys.prog_name_by_id(cur)
                if name in OUR_PROG_NAMES:
                    raise DataplaneError(f"{self.ifname} already has a skewscope XDP program (id {cur}), probably "
                                         f"left by a crashed run: 'skewscope detach -i {self.ifname}' removes it",
                                         EXIT_BUSY)
                raise DataplaneError(f"{self.ifname} already has an XDP program ({name or '?'}, id {cur}) that is "
                                     "not ours; skewscope will not replace it (use --tc)", EXIT_BUSY)
            fd = self.dp.prog_fd("xdp")
            self._xdp_prog = bpfsys.prog_info(fd)["id"]
            mode_flag = XDP_FLAGS_DRV_MODE if self.xdp_mode == "native" else XDP_FLAGS_SKB_MODE
            self._xdp_flags = XDP_FLAGS_UPDATE_IF_NOEXIST | mode_flag
            try:
                _xdp_set(self.idx, fd, self._xdp_flags)
            except Exception as e:  # pyroute2 NetlinkError
                code = getattr(e, "code", 0)
                hint = ""
                if code in (errno.EOPNOTSUPP, errno.EINVAL) and self.xdp_mode == "native":
                    hint = " (driver lacks native XDP or MTU too large; try --xdp-mode generic or --tc)"
                raise DataplaneError(f"cannot attach XDP to {self.ifname}: {os.strerror(code) if code else e}{hint}",
                                     EXIT_KERNEL) from None
        else:
            fd = self.dp.prog_fd("tc")
            dirs = ("ingress", "egress") if self.direction == "both" else (self.direction,)
            with _ipr() as ipr:
                try:
                    ipr.tc("add", "clsact", self.idx)
                    self._created_clsact = True
                except Exception as e:
                    if getattr(e, "code", 0) != errno.EEXIST:
                        raise DataplaneError(f"cannot add clsact qdisc on {self.ifname}: {e}", EXIT_KERNEL) from None
                for d in dirs:
                    parent = 0xFFFFFFF2 if d == "ingress" else 0xFFFFFFF3
                    try:
                        ipr.tc("add-filter", "bpf", self.idx, ":1", fd=fd, name=PROG_TC, parent=parent,
                               classid=1, direct_action=True, prio=_TC_PRIO)
                    except Exception as e:
                        self.attached = True
                        self.detach()
                        raise DataplaneError(f"cannot attach TC {d} program to {self.ifname}: {e}",
                                             EXIT_KERNEL) from None
        self.attached = True
        try:  # detach must happen in this network namespace even if the thread moves later
            self._netns_fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self._netns_fd = -1
        atexit.register(self.detach)
        self._old_handlers = _install_exit_handlers(EXIT_SIGNALS, only_if_default=True)
        return self

    def detach(self) -> None:
        if not self.attached:
            return
        self.attached = False
        try:
            atexit.unregister(self.detach)
        except Exception:
            pass
        _restore_handlers(self._old_handlers)
        self._old_handlers = {}
        dirs = ("ingress", "egress") if self.direction == "both" else (self.direction,)
        try:
            with _in_netns(self._netns_fd):
                if self.mode == "xdp":
                    detach_ours(self.ifname, tc=False, xdp_prog=self._xdp_prog)
                else:
                    detach_ours(self.ifname, xdp=False, remove_clsact=self._created_clsact, directions=dirs)
        except (DataplaneError, OSError):
            pass  # interface (or namespace) gone: nothing left to clean
        finally:
            if self._netns_fd >= 0:
                os.close(self._netns_fd)
                self._netns_fd = -1

    def __enter__(self):
        return self.attach()

    def __exit__(self, *exc):
        self.detach()


_CLONE_NEWNET = 0x40000000


@contextlib.contextmanager
def _in_netns(fd: int):
    """Run the block in the network namespace of fd (if it is not the current one)."""
    if fd < 0 or os.fstat(fd).st_ino == os.stat("/proc/thread-self/ns/net").st_ino:
        yield
        return
    libc = ctypes.CDLL(None, use_errno=True)
    here = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns")
        try:
            yield
        finally:
            libc.setns(here, _CLONE_NEWNET)
    finally:
        os.close(here)


_TC_PRIO = 0xC0DE & 0xFFFF  # our filter priority: distinctive, so detach finds ours


def _tc_filters(ipr, idx: int, parent: int):
    try:
        return ipr.get_filters(index=idx, parent=parent)
    except Exception:
        return []


def _tc_prog_name(flt) -> str | None:
    """Name of the BPF program behind a cls_bpf filter: the kernel's prog name (by id) when
    the netlink library decodes TCA_BPF_ID (pyroute2 0.7 does not), else the filter's
    TCA_BPF_NAME, which skewscope sets to its program name."""
    opts = flt.get_attr("TCA_OPTIONS")
    if not opts:
        return None
    pid = opts.get_attr("TCA_BPF_ID")
    name = bpfsys.prog_name_by_id(int(pid)) if pid else None
    return name or (opts.get_attr("TCA_BPF_NAME") or "").split(":")[0] or None


def list_ours(ifname: str) -> dict:
    """What skewscope has attached to ifname: {'xdp': prog_id|None, 'tc': [(dir, prio, name)]}"""
    idx = ifindex(ifname)
    out = {"xdp": None, "tc": []}
    pid = xdp_prog_id(ifname)
    if pid and bpfsys.prog_name_by_id(pid) in OUR_PROG_NAMES:
        out["xdp"] = pid
    with _ipr() as ipr:
        for d, parent in (("ingress", 0xFFFFFFF2), ("egress", 0xFFFFFFF3)):
            for flt in _tc_filters(ipr, idx, parent):
                name = _tc_prog_name(flt)
                if name in OUR_PROG_NAMES:
                    out["tc"].append((d, flt["info"] >> 16, name))
    return out


def detach_ours(ifname: str, xdp: bool = True, tc: bool = True, remove_clsact: bool = True,
                directions=("ingress", "egress"), xdp_prog: int | None = None) -> dict:
    """Remove skewscope's programs (and only those) from ifname. Returns what was removed.
    directions: TC hooks to clean; xdp_prog: remove the XDP program only if it is this id."""
    idx = ifindex(ifname)
    found = list_ours(ifname)
    removed = {"xdp": None, "tc": []}
    pid = found["xdp"]
    if xdp and pid and (xdp_prog is None or pid == xdp_prog):
        # IFLA_XDP_FD -1 in the mode it was attached in (drv / skb); re-check the id each time
        for flags in (XDP_FLAGS_DRV_MODE, XDP_FLAGS_SKB_MODE, 0):
            try:
                _xdp_set(idx, -1, flags)
            except Exception:
                continue
            if xdp_prog_id(ifname) != pid:
                removed["xdp"] = pid
                break
    mine = [t for t in found["tc"] if t[0] in directions]
    if tc and mine:
        with _ipr() as ipr:
            for d, prio, name in mine:
                parent = 0xFFFFFFF2 if d == "ingress" else 0xFFFFFFF3
                try:
                    ipr.tc("del-filter", "bpf", idx, parent=parent, prio=prio)
                    removed["tc"].append((d, prio, name))
                except Exception:
                    pass
            if remove_clsact and not any(_tc_filters(ipr, idx, p) for p in (0xFFFFFFF2, 0xFFFFFFF3)):
                try:
                    ipr.tc("del", "clsact", idx)
                except Exception:
                    pass
    return removed


def wait_ms(ms: float) -> None:
    time.sleep(ms / 1000.0)
