"""Compile (bcc) and load the data plane, and read its maps into a Snapshot."""
from __future__ import annotations

import contextlib
import ctypes
import errno
import io
import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from skewscope.bpf import syscalls as bpfsys
from skewscope.bpf.btf import KF_SENTINEL_CAST_KCTX, KF_SENTINEL_RDONLY_CAST, patch_kfunc_calls, xdp_kctx_layout
from skewscope.core import layout as L
from skewscope.core.errors import EXIT_KERNEL, EXIT_NO_BCC, EXIT_NO_PRIV, EXIT_USAGE, DataplaneError
from skewscope.core.pool import ArrayPool
from skewscope.core.snapshot import Snapshot, events_from_records, flows_from_raw


def _ebpf_dir() -> Path:
    """The data plane's C sources: ebpf/ at the top of a checkout, or the copy a wheel carries
    inside the package (skewscope/ebpf, pyproject's package-dir mapping)."""
    pkg = Path(__file__).resolve().parent.parent
    for d in (pkg / "ebpf", pkg.parent / "ebpf"):
        if (d / "skewscope.bpf.c").is_file():
            return d
    return pkg.parent / "ebpf"  # missing: the compile error names this path


EBPF_DIR = _ebpf_dir()
SOURCE = EBPF_DIR / "skewscope.bpf.c"
PROG_XDP = "skewscope_xdp"
PROG_TC = "skewscope_tc"
OUR_PROG_NAMES = (PROG_XDP, PROG_TC)


def possible_cpus() -> int:
    try:
        txt = Path("/sys/devices/system/cpu/possible").read_text().strip()
        hi = 0
        for part in txt.split(","):
            hi = max(hi, int(part.split("-")[-1]))
        return hi + 1
    except (OSError, ValueError):
        return os.cpu_count() or 1


#: opcodes whose opcode-table entries the program has as constants (ss_opinfo), commonest first
HOT_OPCODES = (0x07, 0x11)  # RDMA_WRITE_MIDDLE, ACKNOWLEDGE


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
    # flow cache slots per CPU in front of the flows LRU hash (power of two; 0 = off), see
    # docs/datapath.md "Flow cache"
    flow_cache: int = 256

    def validate(self) -> None:
        # Only integers within these bounds ever become -D flags (no text reaches the C).
        for name, lo, hi in (("max_flows", 16, 1 << 24), ("ev_per_cpu", 16, 1 << 22),
                             ("sample_n", 1, 1 << 20), ("ncpus", 1, 4096)):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
                raise DataplaneError(f"invalid {name.replace('_', '-')}: {v!r} (must be an integer in {lo}..{hi})",
                                     EXIT_USAGE)
        fc = self.flow_cache
        if not isinstance(fc, int) or isinstance(fc, bool) or not (fc == 0 or (_pow2(fc) and fc <= 1 << 16)):
            raise DataplaneError(f"invalid flow-cache: {fc!r} (must be 0 or a power of two up to 65536)", EXIT_USAGE)
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
             f"-DSS_FC_SLOTS={int(self.flow_cache)}",
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
        if kernel_at_least(5, 5):
            f.append("-DSS_CTL_CLOCK=1")  # bpf_jiffies64: control packets reuse the tick's clock read
        # the commonest opcodes' op_table entries as constants (ss_opinfo): RDMA WRITE MIDDLE, the
        # bulk of NCCL's traffic, and ACKNOWLEDGE; from the table op_table is filled with
        for tag, op in zip("AB", HOT_OPCODES):
            f += [f"-DSS_HOT_OP_{tag}={op}", f"-DSS_HOT_INFO_{tag}={int(L.OPCODE_TABLE[op])}"]
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
        cache = self.ncpus * self.flow_cache * FC_ENTRY_DTYPE.itemsize
        return {"flows": flows, "events": events, "flow_cache": cache, "total": flows + events + cache,
                "flow_entry": elem, "event_entry": L.MSG_REC_DTYPE.itemsize}


#: a flow-cache slot (skewscope.bpf.c struct ss_fc_entry): the key, then the stats, no padding
FC_ENTRY_DTYPE = np.dtype([("key", L.FLOW_KEY_DTYPE), ("stats", L.FLOW_STATS_DTYPE)])
HTAB_ELEM_OVERHEAD = 48  # sizeof(struct htab_elem) on 64-bit kernels (hash node, LRU node, hash)
HTAB_BUCKET_SIZE = 16    # struct bucket: hlist_nulls_head + lock, padded


def _round8(n: int) -> int:
    return (n + 7) // 8 * 8


def _next_pow2(n: int) -> int:
    return 1 << (max(1, n) - 1).bit_length()


def check_privileges() -> None:
    if os.geteuid() != 0:
        raise DataplaneError("skewscope needs root (CAP_BPF + CAP_NET_ADMIN) to load eBPF programs; "
                             "run with sudo, or use 'skewscope report FILE.pcap' which needs no privileges",
                             EXIT_NO_PRIV)


def import_bcc():
    try:
        import bcc  # noqa: F401
        from bcc import BPF, lib  # optional (python3-bpfcc)
        return BPF, lib
    except ImportError:
        raise DataplaneError("bcc is not importable: install the OS package python3-bpfcc "
                             "(not the PyPI 'bcc') and run 'make setup'", EXIT_NO_BCC) from None


class FlowReader:
    """Reads the flows map (an LRU hash of FLOW_KEY_DTYPE -> FLOW_STATS_DTYPE) into a
    FLOW_DTYPE table sorted by key. Read after read (the live loop) the entries are copied
    into the same key and value buffers and the table into the buffer of an earlier table
    nothing refers to any more (core.pool): memory the process has touched already, no page
    faults for each interval's fresh ~0.9 GB at 1,048,576 flows. Every buffer has max_entries
    rows, resident as far as a read ever filled it. One reader at a time."""

    def __init__(self, max_entries: int):
        self.max_entries = int(max_entries)
        self._raw: tuple[np.ndarray, np.ndarray] | None = None
        self.pool = ArrayPool(L.FLOW_DTYPE, rows=self.max_entries)

    def entries(self, map_fd: int, cache: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
        """The map's (key bytes, value bytes) in the map's order, in this reader's buffers
        (valid until the next read); `cache`: the flow cache's occupied slots
        (Dataplane._read_cache), merged in."""
        kz, vz = L.FLOW_KEY_DTYPE.itemsize, L.FLOW_STATS_DTYPE.itemsize
        if self._raw is None:
            rows = max(self.max_entries, 1)
            self._raw = (np.empty((rows, kz), dtype=np.uint8), np.empty((rows, vz), dtype=np.uint8))
        keys, vals = bpfsys.map_lookup_batch(map_fd, kz, vz, self.max_entries, out=self._raw)
        if cache is not None and len(cache[0]):
            _merge_cache(keys, vals, *cache)
        return keys, vals

    def read(self, map_fd: int, cache: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> np.ndarray:
        """The table (entries() sorted by key into a pooled buffer)."""
        return flows_from_raw(*self.entries(map_fd, cache), pool=self.pool)

    def close(self) -> None:
        """Let the buffers go (tables handed out live on)."""
        self._raw = None
        self.pool.clear()


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
        self._flow_reader = FlowReader(self.config.max_flows)
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

    def _function(self, name: str) -> tuple[int, int, bytes]:
        """(address, size, license) of a compiled BPF function, for our own BPF_PROG_LOAD."""
        bname = name.encode()
        start = self._lib.bpf_function_start(self.bpf.module, bname)
        size = self._lib.bpf_function_size(self.bpf.module, bname)
        if not start:
            raise DataplaneError(f"BPF function {name} missing from the compiled object", EXIT_KERNEL)
        return start, size, ctypes.string_at(self._lib.bpf_module_license(self.bpf.module)) or b"GPL"

    def _load_xdp(self, name: str) -> int:
        start, size, lic = self._function(name)
        flags = bpfsys.BPF_F_XDP_HAS_FRAGS if self.config.xdp_frags else 0
        if self.config.xdp_kctx is not False and xdp_kctx_layout() is not None:
            buf = ctypes.create_string_buffer(patch_kfunc_calls(ctypes.string_at(start, size)), size)
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
        try:
            if kind == "xdp":
                fd = self._load_xdp(name)
            else:
                start, size, lic = self._function(name)
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
        self._flow_reader.close()
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
        if self.config.flow_cache:
            self.bpf[b"fcache"].clear()
        ncpu = self.config.ncpus
        zero = bytes(8 * ncpu)
        # the global counters: one per-CPU entry of G_N counters (struct ss_globals)
        bpfsys.map_update(self._fd("globals"), (0).to_bytes(4, "little"), bytes(8 * L.G_N * ncpu))
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
        # one per-CPU entry: ncpu copies of struct ss_globals (G_N u64 each)
        _, vals = bpfsys.map_lookup_batch(self._fd("globals"), 4, 8 * L.G_N * ncpu, 1)
        return vals[0].view("<u8").reshape(ncpu, L.G_N).sum(axis=0).astype(np.uint64)

    def read_flows(self) -> np.ndarray:
        """The flow table: the LRU entries, each with the current copy from the flow cache
        slot of the CPU that owns it (stats.owner = cpu + 1). The slots are read first: a slot
        written back between the two reads is then found in its LRU entry (owner 0), a flow
        brought into a slot after the first read still has its (older, consistent) LRU copy,
        so counters never go backwards between reads."""
        cache = self._read_cache() if self.config.flow_cache else None
        return self._flow_reader.read(self._fd("flows"), cache)

    def _read_cache(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The occupied flow-cache slots: (key bytes, stats bytes, cpu + 1 of each)."""
        n = self.config.ncpus * self.config.flow_cache
        _, vals = bpfsys.map_lookup_batch(self._fd("fcache"), 4, FC_ENTRY_DTYPE.itemsize, n)
        ent = vals[:n].view(FC_ENTRY_DTYPE).reshape(-1)
        used = np.nonzero(ent["key"]["roce"] != 0)[0]
        raw = vals[used]
        kz = L.FLOW_KEY_DTYPE.itemsize
        return raw[:, :kz], raw[:, kz:], (used // self.config.flow_cache + 1).astype(np.uint16)

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


def _merge_cache(keys: np.ndarray, vals: np.ndarray, ckeys: np.ndarray, cvals: np.ndarray,
                 cowner: np.ndarray) -> None:
    """In place: each LRU row (keys, vals byte matrices) owned by a CPU whose cache slot holds
    the same key gets that slot's stats. Slots of flows no longer in the LRU (evicted) or
    owned by another CPU (taken over) are stale and ignored."""
    s = vals.view(L.FLOW_STATS_DTYPE).reshape(-1)
    rows = np.nonzero(s["owner"] != 0)[0]
    if not len(rows):
        return
    want = {(bytes(ckeys[i]), int(cowner[i])): i for i in range(len(ckeys))}
    owners = s["owner"][rows]
    for r, o in zip(rows.tolist(), owners.tolist()):
        i = want.get((bytes(keys[r]), o))
        if i is not None:
            vals[r] = cvals[i]
