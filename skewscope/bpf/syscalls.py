"""Thin ctypes wrappers over the bpf(2) syscall for what bcc's Python API does not expose:
program load with flags (BPF_F_XDP_HAS_FRAGS), BPF_PROG_TEST_RUN, batched map reads into
numpy buffers, and object info (to recognise our own programs on an interface)."""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import platform
import struct

import numpy as np

_SYS_BPF = {"x86_64": 321, "aarch64": 280, "armv7l": 386, "ppc64le": 361, "s390x": 351, "riscv64": 280}
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.syscall.restype = ctypes.c_long

BPF_PROG_GET_FD_BY_ID = 13
BPF_PROG_LOAD = 5
BPF_PROG_TEST_RUN = 10
BPF_OBJ_GET_INFO_BY_FD = 15
BPF_MAP_LOOKUP_BATCH = 24

BPF_PROG_TYPE_SCHED_CLS = 3
BPF_PROG_TYPE_XDP = 6
BPF_F_XDP_HAS_FRAGS = 1 << 5
BPF_XDP = 37  # expected_attach_type for frags programs

ATTR_SIZE = 160


class BPFError(OSError):
    pass


def _sys_bpf(cmd: int, attr: ctypes.Array) -> int:
    nr = _SYS_BPF.get(platform.machine())
    if nr is None:
        raise BPFError(errno.ENOSYS, f"bpf(2) syscall number unknown for {platform.machine()}")
    ret = _libc.syscall(nr, cmd, ctypes.byref(attr), ctypes.sizeof(attr))
    if ret < 0:
        e = ctypes.get_errno()
        raise BPFError(e, os.strerror(e))
    return ret


def _attr() -> ctypes.Array:
    return (ctypes.c_uint8 * ATTR_SIZE)()


def _put(attr, off: int, fmt: str, value) -> None:
    struct.pack_into(fmt, attr, off, value)


def _get(attr, off: int, fmt: str):
    return struct.unpack_from(fmt, attr, off)[0]


def prog_load(prog_type: int, insns_ptr: int, insn_bytes: int, name: str, license: bytes = b"GPL",
              flags: int = 0, expected_attach_type: int = 0, log_size: int = 1 << 22) -> int:
    """BPF_PROG_LOAD; on failure raises BPFError with the verifier log's tail."""
    lic = ctypes.create_string_buffer(license)
    for level in (0, 1):
        log = ctypes.create_string_buffer(log_size if level else 1)
        a = _attr()
        _put(a, 0, "<I", prog_type)
        _put(a, 4, "<I", insn_bytes // 8)
        _put(a, 8, "<Q", insns_ptr)
        _put(a, 16, "<Q", ctypes.addressof(lic))
        if level:
            _put(a, 24, "<I", 1)
            _put(a, 28, "<I", log_size)
            _put(a, 32, "<Q", ctypes.addressof(log))
        _put(a, 44, "<I", flags)
        nm = name.encode()[:15]
        a[48:48 + len(nm)] = nm
        _put(a, 68, "<I", expected_attach_type)
        try:
            return _sys_bpf(BPF_PROG_LOAD, a)
        except BPFError as e:
            if level == 0 and e.errno not in (errno.EPERM,):
                continue  # retry with the verifier log
            tail = log.value.decode(errors="replace").strip().splitlines()[-12:] if level else []
            raise BPFError(e.errno, f"{os.strerror(e.errno)}" + ("\n" + "\n".join(tail) if tail else ""))
    raise AssertionError("unreachable")


_FRAGS_SUPPORTED: bool | None = None


def xdp_frags_supported() -> bool:
    """Does the kernel take XDP programs with BPF_F_XDP_HAS_FRAGS (Linux >= 5.18, which also
    brought bpf_xdp_get_buff_len)? Probed once by loading `r0 = XDP_PASS; exit` with it."""
    global _FRAGS_SUPPORTED
    if _FRAGS_SUPPORTED is None:
        insns = (ctypes.c_uint8 * 16).from_buffer_copy(bytes.fromhex("b700000002000000" "9500000000000000"))
        try:
            fd = prog_load(BPF_PROG_TYPE_XDP, ctypes.addressof(insns), 16, "ss_frags_probe", flags=BPF_F_XDP_HAS_FRAGS,
                           expected_attach_type=BPF_XDP)
            os.close(fd)
            _FRAGS_SUPPORTED = True
        except BPFError as e:
            if e.errno == errno.EPERM:
                raise
            _FRAGS_SUPPORTED = False
    return _FRAGS_SUPPORTED


def prog_test_run(prog_fd: int, data: bytes | memoryview | np.ndarray, repeat: int = 1,
                  ctx: bytes | None = None) -> tuple[int, int]:
    """BPF_PROG_TEST_RUN: returns (retval, duration_ns_per_run)."""
    buf = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data
    if not buf.flags.c_contiguous:
        buf = np.ascontiguousarray(buf)
    a = _attr()
    _put(a, 0, "<I", prog_fd)
    _put(a, 8, "<I", buf.nbytes)
    _put(a, 16, "<Q", buf.ctypes.data)
    _put(a, 32, "<I", repeat)
    if ctx is not None:
        cbuf = ctypes.create_string_buffer(ctx, len(ctx))
        _put(a, 40, "<I", len(ctx))
        _put(a, 48, "<Q", ctypes.addressof(cbuf))
    _sys_bpf(BPF_PROG_TEST_RUN, a)
    return _get(a, 4, "<I"), _get(a, 36, "<I")


def prog_test_run_out(prog_fd: int, data: bytes) -> tuple[int, bytes]:
    """BPF_PROG_TEST_RUN once, with the packet as the program left it: (retval, bytes out)."""
    inb = ctypes.create_string_buffer(bytes(data), len(data))
    outb = ctypes.create_string_buffer(len(data) + 256)
    a = _attr()
    _put(a, 0, "<I", prog_fd)
    _put(a, 8, "<I", len(data))
    _put(a, 12, "<I", len(outb))
    _put(a, 16, "<Q", ctypes.addressof(inb))
    _put(a, 24, "<Q", ctypes.addressof(outb))
    _put(a, 32, "<I", 1)
    _sys_bpf(BPF_PROG_TEST_RUN, a)
    return _get(a, 4, "<I"), outb.raw[:_get(a, 12, "<I")]


def map_lookup_batch(map_fd: int, key_size: int, value_size: int, max_entries: int,
                     chunk: int = 4096, out: tuple[np.ndarray, np.ndarray] | None = None
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Read a whole hash/array map with BPF_MAP_LOOKUP_BATCH into (keys, values) byte
    matrices. For per-CPU maps pass value_size = round_up(size, 8) * ncpus. `out`: (keys,
    values) uint8 matrices of at least max_entries rows and these widths to read into (the
    result is their first rows): a reader called again and again keeps its buffers, and the
    kernel then copies into memory the process has already touched (the flows map at
    1,048,576 entries: 0.75 s, into fresh memory 1.0-1.6 s)."""
    rows = max(max_entries, 1)
    if out is None:
        keys = np.empty((rows, key_size), dtype=np.uint8)
        vals = np.empty((rows, value_size), dtype=np.uint8)
    else:
        keys, vals = out
        if (keys.dtype != np.uint8 or vals.dtype != np.uint8 or not keys.flags.c_contiguous
                or not vals.flags.c_contiguous or keys.shape[1:] != (key_size,) or vals.shape[1:] != (value_size,)
                or len(keys) < rows or len(vals) < rows):
            raise ValueError(f"map_lookup_batch: out must be C-contiguous uint8 ({rows}, {key_size}) and "
                             f"({rows}, {value_size}) matrices")
    tok_in = (ctypes.c_uint8 * max(key_size, 8))()
    tok_out = (ctypes.c_uint8 * max(key_size, 8))()
    n = 0
    first = True
    a = _attr()
    while n < max_entries:
        want = min(chunk, max_entries - n)
        _put(a, 0, "<Q", 0 if first else ctypes.addressof(tok_in))
        _put(a, 8, "<Q", ctypes.addressof(tok_out))
        _put(a, 16, "<Q", keys.ctypes.data + n * key_size)
        _put(a, 24, "<Q", vals.ctypes.data + n * value_size)
        _put(a, 32, "<I", want)
        _put(a, 36, "<I", map_fd)
        try:
            _sys_bpf(BPF_MAP_LOOKUP_BATCH, a)
            got = _get(a, 32, "<I")
            n += got
        except BPFError as e:
            if e.errno == errno.ENOENT:
                n += _get(a, 32, "<I")
                break
            if e.errno == errno.ENOSPC and want < max_entries:
                chunk = max(chunk * 2, 1)  # a bucket bigger than the chunk: grow
                continue
            raise
        ctypes.memmove(tok_in, tok_out, len(tok_in))
        first = False
    return keys[:n], vals[:n]


def _obj_info(fd: int, info) -> None:
    """BPF_OBJ_GET_INFO_BY_FD into the ctypes buffer `info` (fields the caller put there, e.g.
    where the map ids go, are read by the kernel)."""
    a = _attr()
    _put(a, 0, "<I", fd)
    _put(a, 4, "<I", ctypes.sizeof(info))
    _put(a, 8, "<Q", ctypes.addressof(info))
    _sys_bpf(BPF_OBJ_GET_INFO_BY_FD, a)


def prog_info(prog_fd: int) -> dict:
    """id, type, name of a program (struct bpf_prog_info prefix)."""
    info = (ctypes.c_uint8 * 256)()
    _obj_info(prog_fd, info)
    ptype, pid = struct.unpack_from("<II", info, 0)
    name = bytes(info[64:80]).split(b"\0")[0].decode(errors="replace")
    return {"type": ptype, "id": pid, "name": name}


def prog_fd_by_id(prog_id: int) -> int:
    a = _attr()
    _put(a, 0, "<I", prog_id)
    return _sys_bpf(BPF_PROG_GET_FD_BY_ID, a)


def prog_name_by_id(prog_id: int) -> str | None:
    try:
        fd = prog_fd_by_id(prog_id)
    except BPFError:
        return None
    try:
        return prog_info(fd)["name"]
    finally:
        os.close(fd)


BPF_MAP_LOOKUP_ELEM = 1
BPF_MAP_UPDATE_ELEM = 2
BPF_MAP_GET_FD_BY_ID = 14
BPF_F_LOCK = 4


def prog_map_ids(prog_fd: int) -> list[int]:
    """The ids of the maps a loaded program uses (bpf_prog_info nr_map_ids / map_ids): how a
    process that did not load it reaches its maps (skewscope mitigate status/revert)."""
    ids = (ctypes.c_uint32 * 64)()
    info = (ctypes.c_uint8 * 256)()
    struct.pack_into("<IQ", info, 52, 64, ctypes.addressof(ids))
    _obj_info(prog_fd, info)
    n = struct.unpack_from("<I", info, 52)[0]
    return [int(ids[i]) for i in range(min(n, 64))]


def map_fd_by_id(map_id: int) -> int:
    a = _attr()
    _put(a, 0, "<I", map_id)
    return _sys_bpf(BPF_MAP_GET_FD_BY_ID, a)


def map_info(map_fd: int) -> dict:
    """type, id, key_size, value_size, max_entries, name of a map (struct bpf_map_info prefix)."""
    info = (ctypes.c_uint8 * 128)()
    _obj_info(map_fd, info)
    t, i, ks, vs, me, _fl = struct.unpack_from("<IIIIII", info, 0)
    name = bytes(info[24:40]).split(b"\0")[0].decode(errors="replace")
    return {"type": t, "id": i, "key_size": ks, "value_size": vs, "max_entries": me, "name": name}


def _map_elem(cmd: int, map_fd: int, key: bytes, vb, flags: int) -> None:
    """One BPF_MAP_*_ELEM call on key with the value buffer vb."""
    kb = ctypes.create_string_buffer(key, len(key))
    a = _attr()
    _put(a, 0, "<I", map_fd)
    _put(a, 8, "<Q", ctypes.addressof(kb))
    _put(a, 16, "<Q", ctypes.addressof(vb))
    _put(a, 24, "<Q", flags)
    _sys_bpf(cmd, a)


def map_lookup(map_fd: int, key: bytes, value_size: int, flags: int = 0) -> bytes:
    """BPF_MAP_LOOKUP_ELEM (flags: BPF_F_LOCK reads a value with a bpf_spin_lock consistently)."""
    vb = ctypes.create_string_buffer(value_size)
    _map_elem(BPF_MAP_LOOKUP_ELEM, map_fd, key, vb, flags)
    return vb.raw


def map_update(map_fd: int, key: bytes, value: bytes, flags: int = 0) -> None:
    """BPF_MAP_UPDATE_ELEM (for per-CPU maps, value = ncpus * round_up(size, 8) bytes)."""
    _map_elem(BPF_MAP_UPDATE_ELEM, map_fd, key, ctypes.create_string_buffer(value, len(value)), flags)


# ---- bpf_link: attachments owned by a file descriptor ----------------------------------------
# An attachment made with BPF_LINK_CREATE lives as long as its link fd (unless pinned, which
# skewscope never does): when the process dies, however it dies, the kernel closes the fd and
# detaches the program. XDP links: Linux >= 5.9; tcx (TC without a qdisc): Linux >= 6.6.
BPF_PROG_QUERY = 16
BPF_LINK_CREATE = 28
BPF_LINK_GET_FD_BY_ID = 30
BPF_LINK_GET_NEXT_ID = 31
BPF_LINK_DETACH = 34

BPF_TCX_INGRESS = 46
BPF_TCX_EGRESS = 47

BPF_LINK_TYPE_XDP = 6
BPF_LINK_TYPE_TCX = 11

# what a kernel without the link type (or without BPF_LINK_CREATE) answers
LINK_UNSUPPORTED = frozenset({errno.EINVAL, errno.EOPNOTSUPP, errno.ENOSYS, errno.E2BIG, 524})  # 524: ENOTSUPP


def link_create(prog_fd: int, target_ifindex: int, attach_type: int, flags: int = 0) -> int:
    """BPF_LINK_CREATE on a network interface (link_create: prog_fd @0, target_ifindex @4,
    attach_type @8, flags @12; for tcx the relative_fd/expected_revision @16/@24 stay 0:
    append, any revision). XDP links take the XDP mode (XDP_FLAGS_DRV_MODE / SKB_MODE) in
    flags. Returns the link fd (close-on-exec)."""
    a = _attr()
    _put(a, 0, "<I", prog_fd)
    _put(a, 4, "<I", target_ifindex)
    _put(a, 8, "<I", attach_type)
    _put(a, 12, "<I", flags)
    return _sys_bpf(BPF_LINK_CREATE, a)


def link_detach(link_fd: int) -> None:
    """BPF_LINK_DETACH: the program leaves the hook now; the fd stays valid (defunct link)."""
    a = _attr()
    _put(a, 0, "<I", link_fd)
    _sys_bpf(BPF_LINK_DETACH, a)


def link_fd_by_id(link_id: int) -> int:
    a = _attr()
    _put(a, 0, "<I", link_id)
    return _sys_bpf(BPF_LINK_GET_FD_BY_ID, a)


def link_info(link_fd: int) -> dict:
    """type, id, prog_id and (XDP / tcx links) ifindex, attach_type of a link (struct
    bpf_link_info: type @0, id @4, prog_id @8, the per-type union @16)."""
    info = (ctypes.c_uint8 * 128)()
    _obj_info(link_fd, info)
    ltype, lid, pid, ifidx, atype = struct.unpack_from("<IIIxxxxII", info, 0)
    return {"type": ltype, "id": lid, "prog_id": pid, "ifindex": ifidx,
            "attach_type": atype if ltype == BPF_LINK_TYPE_TCX else (BPF_XDP if ltype == BPF_LINK_TYPE_XDP else 0)}


def link_ids() -> list[int]:
    """Ids of every bpf_link in the system (BPF_LINK_GET_NEXT_ID; [] on kernels without links)."""
    out: list[int] = []
    cur = 0
    while True:
        a = _attr()
        _put(a, 0, "<I", cur)
        try:
            _sys_bpf(BPF_LINK_GET_NEXT_ID, a)
        except BPFError:
            return out                      # ENOENT: no more (EINVAL: no links in this kernel)
        cur = _get(a, 4, "<I")
        out.append(cur)


def link_info_by_id(link_id: int) -> dict | None:
    try:
        fd = link_fd_by_id(link_id)
    except BPFError:
        return None                         # gone meanwhile
    try:
        return link_info(fd)
    except BPFError:
        return None
    finally:
        os.close(fd)


def tcx_query(ifindex: int, attach_type: int) -> list[tuple[int, int]]:
    """(prog id, link id) of the programs on a tcx hook (BPF_PROG_QUERY; link id 0 = attached
    without a link). The ifindex is looked up in this thread's network namespace. [] on
    kernels without tcx (EINVAL) or when the interface has none."""
    for cap in (64, 4096):
        progs = (ctypes.c_uint32 * cap)()
        links = (ctypes.c_uint32 * cap)()
        a = _attr()
        _put(a, 0, "<I", ifindex)
        _put(a, 4, "<I", attach_type)
        _put(a, 16, "<Q", ctypes.addressof(progs))
        _put(a, 24, "<I", cap)
        _put(a, 40, "<Q", ctypes.addressof(links))
        try:
            _sys_bpf(BPF_PROG_QUERY, a)
        except BPFError as e:
            if e.errno == errno.ENOSPC and cap == 64:
                continue
            if e.errno in LINK_UNSUPPORTED or e.errno in (errno.ENODEV, errno.ENOENT):
                return []
            raise
        n = _get(a, 24, "<I")
        return [(int(progs[i]), int(links[i])) for i in range(min(n, cap))]
    return []
