"""Shared helpers for the generator tests (no tests here).

`recount` is an independent re-implementation of the per-flow definitions, straight from
the pcap bytes with struct (it shares no code with skewgen), used to check the truth."""
from __future__ import annotations

import atexit
import functools
import ipaddress
import os
import shutil
import struct
import tempfile

from skewscope import gen as skewgen

TMP = tempfile.mkdtemp(prefix="sgt-gen-")
atexit.register(shutil.rmtree, TMP, ignore_errors=True)  # full-frame pcaps are ~2 GB in all
BIG = {"ring-32"}            # sampled / snaplen in tests
MSG_START = {0x00, 0x04, 0x05, 0x06, 0x0A, 0x0B, 0x0C, 0x17, 0x20, 0x24, 0x25, 0x26, 0x2A,
             0x2B, 0x64, 0x65}
RETH_OPS = {0x06, 0x0A, 0x0B, 0x0C}
IMM_OPS = {0x03, 0x05, 0x09, 0x0B}
AETH_OPS = {0x0D, 0x0F, 0x10, 0x11, 0x12}


@functools.lru_cache(maxsize=None)
def capture(name: str, seed: int = 0):
    return skewgen.generate(name, seed=seed)


@functools.lru_cache(maxsize=None)
def pcap_file(name: str, seed: int = 0, snaplen: int = 0) -> str:
    path = os.path.join(TMP, f"{name}-{seed}-{snaplen}.pcap")
    capture(name, seed).write_pcap(path, snaplen=snaplen)
    return path


def read_pcap(path):
    """Yield (ts_ns, orig_len, data) from a nanosecond pcap."""
    with open(path, "rb") as f:
        hdr = f.read(24)
        magic, vmaj, vmin, _, _, snap, link = struct.unpack("<IHHiIII", hdr)
        assert magic == 0xA1B23C4D, hex(magic)
        assert (vmaj, vmin, link) == (2, 4, 1)
        while True:
            rh = f.read(16)
            if not rh:
                return
            sec, nsec, incl, orig = struct.unpack("<IIII", rh)
            yield sec * 10**9 + nsec, orig, f.read(incl)


def parse(data: bytes):
    """Minimal independent dissector -> dict, or None for non-RoCE / PFC info."""
    o = 12
    et = struct.unpack_from("!H", data, o)[0]
    o += 2
    vlan = None
    while et in (0x8100, 0x88A8):
        vlan = struct.unpack_from("!H", data, o)[0]
        et = struct.unpack_from("!H", data, o + 2)[0]
        o += 4
    if et == 0x8808:
        opc, cev = struct.unpack_from("!HH", data, o)
        times = struct.unpack_from("!8H", data, o + 4)
        return {"pfc": True, "opcode": opc, "cev": cev, "times": times, "dmac": data[:6]}
    if et == 0x0800:
        ihl = (data[o] & 0xF) * 4
        tos = data[o + 1]
        src = str(ipaddress.IPv4Address(data[o + 12:o + 16]))
        dst = str(ipaddress.IPv4Address(data[o + 16:o + 20]))
        proto = data[o + 9]
        o += ihl
    elif et == 0x86DD:
        v = struct.unpack_from("!I", data, o)[0]
        tos = (v >> 20) & 0xFF
        proto = data[o + 6]
        src = ipaddress.IPv6Address(data[o + 8:o + 24]).compressed
        dst = ipaddress.IPv6Address(data[o + 24:o + 40]).compressed
        o += 40
    else:
        return None
    if proto != 17:
        return None
    sport, dport, ulen = struct.unpack_from("!HHH", data, o)
    if dport != 4791:
        return None
    b = o + 8
    op, f1 = data[b], data[b + 1]
    pkey = struct.unpack_from("!H", data, b + 2)[0]
    f4 = data[b + 4]
    dq = int.from_bytes(data[b + 5:b + 8], "big")
    ar = data[b + 8]
    psn = int.from_bytes(data[b + 9:b + 12], "big")
    pad = (f1 >> 4) & 3
    e = b + 12
    r = {"src": src, "dst": dst, "sport": sport, "ulen": ulen, "op": op, "pad": pad,
         "pkey": pkey, "fecn": f4 >> 7, "becn": (f4 >> 6) & 1, "dqp": dq, "ackreq": ar >> 7,
         "psn": psn, "tos": tos, "vlan": vlan, "reth_len": None, "imm": None, "aeth": None}
    ext = 0
    if op == 0x81:
        ext = 16
    else:
        low = op & 0x1F
        if low in RETH_OPS:
            r["va"], r["rkey"], r["reth_len"] = struct.unpack_from("!QII", data, e + ext)
            ext += 16
        if low in IMM_OPS:
            r["imm"] = struct.unpack_from("!I", data, e + ext)[0]
            ext += 4
        if low in AETH_OPS:
            r["aeth"] = struct.unpack_from("!I", data, e + ext)[0]
            ext += 4
    r["payload"] = ulen - 8 - 12 - ext - pad - 4
    return r


def recount(path):
    """Per-flow counters by the report definitions, from the pcap alone."""
    flows = {}
    exp = {}
    pfc = [0, [0] * 8]
    non_roce = 0
    frames = 0
    for ts, orig, data in read_pcap(path):
        frames += 1
        r = parse(data)
        if r is None or r.get("pfc"):
            non_roce += 1
            if r is not None:
                pfc[0] += 1
                for b in range(8):
                    if (r["cev"] >> b) & 1:
                        pfc[1][b] += 1
            continue
        k = (r["src"], r["dst"], r["dqp"])
        f = flows.setdefault(k, dict(packets=0, bytes=0, payload_bytes=0, messages=0, ce_packets=0,
                                     ecn_capable_packets=0, cnp_packets=0, acks=0, naks=0,
                                     psn_gaps=0, retransmissions=0, first_ts=ts, last_ts=ts,
                                     hist={}))
        op = r["op"]
        f["packets"] += 1
        f["bytes"] += orig
        f["payload_bytes"] += r["payload"]
        f["messages"] += op in MSG_START
        f["ce_packets"] += (r["tos"] & 3) == 3
        f["ecn_capable_packets"] += (r["tos"] & 3) != 0
        f["cnp_packets"] += op == 0x81
        if op == 0x11:
            syn = r["aeth"] >> 24
            f["acks"] += (syn & 0xE0) == 0
            f["naks"] += (syn & 0xE0) in (0x60, 0x20)
        f["first_ts"] = min(f["first_ts"], ts)
        f["last_ts"] = max(f["last_ts"], ts)
        low = op & 0x1F
        if op < 0x80 and (low <= 0x0C or low in (0x13, 0x14, 0x16, 0x17)):
            st = exp.get(k)
            if st is None:
                exp[k] = [(r["psn"] + 1) % (1 << 24), op == 0x0C]
            else:
                d = (r["psn"] - st[0]) % (1 << 24)
                if d >= 1 << 23:
                    f["retransmissions"] += 1
                else:
                    if d > 0 and not st[1]:
                        f["psn_gaps"] += 1
                    st[0] = (r["psn"] + 1) % (1 << 24)
                    st[1] = False
                if op == 0x0C:
                    st[1] = True
        if r["reth_len"] is not None and op in RETH_OPS:
            s = r["reth_len"]
            bk = 0 if s == 0 else 1 << (s.bit_length() - 1)
            f["hist"][bk] = f["hist"].get(bk, 0) + 1
    for f in flows.values():
        f["msg_size_hist"] = sorted([list(x) for x in f.pop("hist").items()])
    return {"flows": flows, "pfc": pfc, "non_roce": non_roce, "frames": frames}


def model_row(cap, i):
    return {k: v[i] for k, v in cap.pkts.items()}
