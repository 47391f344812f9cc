"""The running kernel's BTF: struct offsets for the inline XDP frame length, kfunc patching."""
from __future__ import annotations

import struct
from pathlib import Path

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


def patch_kfunc_calls(insns: bytes) -> bytes:
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

