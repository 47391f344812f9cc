"""Traffic and measurements across a VethPair: RoCEv2 frames built with numpy, a sendmmsg(2)
AF_PACKET blaster, a TCP transfer, the namespaces' counters, skewscope (or a trivial XDP
program) attached as the observer, and exact per-flow accounting. Used by the reliability
tests (tests/integration/test_reliability_*.py) and tools/reliability.py (the figures in
docs/reliability.md)."""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import socket
import struct
import threading
import time
from pathlib import Path

import numpy as np

from skewscope.bpf.attach import Attachment
from skewscope.bpf.loader import Config, Dataplane
from skewscope.core import layout as L
from skewscope.core.netns import in_netns
from skewscope.testbed.netns import VethPair, sh

_libc = ctypes.CDLL(None, use_errno=True)


def pair(tag: str) -> VethPair:
    """The reliability fabric: `ssr-` names, 10.198.0.0/24, static neighbours (no ARP)."""
    return VethPair.create(tag, prefix="ssr", subnet="10.198.0", static_neighbours=True)


def link_drops(fab: VethPair) -> int:
    """Drops the veth pair counted anywhere (rx/tx dropped on either end)."""
    n = 0
    for ns, ifn in ((fab.ns_a, fab.if_a), (fab.ns_b, fab.if_b)):
        s = VethPair.link(ns, ifn)["stats64"]
        n += int(s["rx"]["dropped"]) + int(s["tx"]["dropped"])
    return n


def udp_snmp(ns: str) -> dict:
    """/proc/net/snmp Udp counters of a namespace."""
    lines = [ln.split() for ln in sh("ip", "netns", "exec", ns, "cat", "/proc/net/snmp").stdout.splitlines()
             if ln.startswith("Udp:")]
    return {k: int(v) for k, v in zip(lines[0][1:], lines[1][1:])}


def iface_state(ns: str, ifn: str) -> dict:
    """What a program attach changes on an interface: XDP, qdiscs, TC filters (ids dropped:
    only what is attached matters)."""
    link = json.loads(sh("ip", "-n", ns, "-d", "-j", "link", "show", "dev", ifn).stdout)[0]
    qd = sh("ip", "netns", "exec", ns, "tc", "qdisc", "show", "dev", ifn).stdout
    flt = {d: sh("ip", "netns", "exec", ns, "tc", "filter", "show", "dev", ifn, d, check=False).stdout
           for d in ("ingress", "egress")}
    return {"xdp": link.get("xdp"), "flags": link.get("flags"), "mtu": link.get("mtu"), "qdisc": qd, "filters": flt}


# ---- frames --------------------------------------------------------------------------------
def _csum(b: bytes) -> int:
    s = sum(struct.unpack(f">{len(b) // 2}H", b))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def roce_frames(fab: VethPair, nflows: int, per_flow: int, payload: int = 64, qp0: int = 0x100,
                order: str = "round_robin") -> tuple[np.ndarray, np.ndarray]:
    """nflows * per_flow RoCEv2 SEND_ONLY frames ns_a -> ns_b (IPv4, valid IP checksum, UDP
    checksum 0, dest QP = qp0 + flow, PSN counting up per flow). Returns (frames (n, L) uint8,
    flow index per frame). round_robin: flow 0,1,..,n-1,0,1,...; blocks: each flow's frames
    back to back."""
    bth_len, icrc = 12, 4
    ulen = 8 + bth_len + payload + icrc
    tot = 20 + ulen
    ip = bytearray(struct.pack(">BBHHHBBH4s4s", 0x45, 26 << 2 | 2, tot, 0, 0x4000, 64, 17, 0,
                               socket.inet_aton(fab.ip_a), socket.inet_aton(fab.ip_b)))
    ip[10:12] = struct.pack(">H", _csum(bytes(ip)))
    eth = bytes.fromhex(fab.mac_b.replace(":", "")) + bytes.fromhex(fab.mac_a.replace(":", "")) + b"\x08\x00"
    udp = struct.pack(">HHHH", 0xC000, 4791, ulen, 0)
    bth = struct.pack(">BBHB3sB3s", 0x04, 0, 0xFFFF, 0, b"\0\0\0", 0, b"\0\0\0")
    tmpl = np.frombuffer(eth + bytes(ip) + udp + bth + bytes(payload) + b"\xca\xfe\xba\xbe", dtype=np.uint8)
    n = nflows * per_flow
    if order == "round_robin":
        flow = np.tile(np.arange(nflows, dtype=np.int64), per_flow)
        psn = np.repeat(np.arange(per_flow, dtype=np.int64), nflows)
    else:
        flow = np.repeat(np.arange(nflows, dtype=np.int64), per_flow)
        psn = np.tile(np.arange(per_flow, dtype=np.int64), nflows)
    fr = np.empty((n, len(tmpl)), dtype=np.uint8)
    fr[:] = tmpl
    b = 14 + 20 + 8
    qp = qp0 + flow
    fr[:, b + 5] = (qp >> 16) & 0xFF
    fr[:, b + 6] = (qp >> 8) & 0xFF
    fr[:, b + 7] = qp & 0xFF
    fr[:, b + 9] = (psn >> 16) & 0xFF
    fr[:, b + 10] = (psn >> 8) & 0xFF
    fr[:, b + 11] = psn & 0xFF
    return fr, flow


# ---- sendmmsg(2) blaster ---------------------------------------------------------------------
class _IOV(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class _MSG(ctypes.Structure):
    _fields_ = [("name", ctypes.c_void_p), ("namelen", ctypes.c_uint32), ("iov", ctypes.POINTER(_IOV)),
                ("iovlen", ctypes.c_size_t), ("control", ctypes.c_void_p), ("controllen", ctypes.c_size_t),
                ("flags", ctypes.c_int)]


class _MMSG(ctypes.Structure):
    _fields_ = [("hdr", _MSG), ("len", ctypes.c_uint)]


_libc.sendmmsg.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int)
_libc.sendmmsg.restype = ctypes.c_int


def blast(ns: str, ifn: str, frames: np.ndarray, timeout_s: float = 60.0, batch: int = 512,
          pps: float | None = None) -> tuple[int, float]:
    """Send every row of `frames` out of ifn (in ns) with AF_PACKET + sendmmsg, in order,
    bounded by timeout_s; optionally paced to `pps`. Returns (sent, seconds)."""
    frames = np.ascontiguousarray(frames)
    n, flen = frames.shape
    with in_netns(ns):
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    try:
        s.bind((ifn, 0))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
        iov = (_IOV * batch)()
        msgs = (_MMSG * batch)()
        for i in range(batch):
            iov[i].len = flen
            msgs[i].hdr.iov = ctypes.pointer(iov[i])
            msgs[i].hdr.iovlen = 1
        base = frames.ctypes.data
        iov_np = np.frombuffer(iov, dtype=np.uint64).reshape(batch, 2)
        steps = np.arange(batch, dtype=np.uint64) * np.uint64(flen)
        sent = 0
        t0 = time.monotonic()
        deadline = t0 + timeout_s
        fd = s.fileno()
        while sent < n and time.monotonic() < deadline:
            k = min(batch, n - sent)
            iov_np[:k, 0] = steps[:k] + np.uint64(base + sent * flen)
            r = _libc.sendmmsg(fd, ctypes.addressof(msgs), k, 0)
            if r < 0:
                e = ctypes.get_errno()
                if e in (105, 11):  # ENOBUFS / EAGAIN: back off, resend the same frames
                    time.sleep(0.0005)
                    continue
                raise OSError(e, os.strerror(e))
            sent += r
            if pps:
                ahead = sent / pps - (time.monotonic() - t0)
                if ahead > 0:
                    time.sleep(ahead)
        return sent, time.monotonic() - t0
    finally:
        s.close()


# ---- TCP across the namespaces ---------------------------------------------------------------
def tcp_transfer(fab: VethPair, nbytes: int, port: int = 5201, timeout_s: float = 60.0) -> dict:
    """Send nbytes (pseudo-random, fixed seed) ns_a -> ns_b over TCP; the receiver hashes what
    it gets. Returns {sent, received, intact, seconds, gbps}."""
    data = np.random.default_rng(7).integers(0, 256, size=1 << 20, dtype=np.uint8).tobytes()
    with in_netns(fab.ns_b):
        srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((fab.ip_b, port))
    srv.listen(1)
    srv.settimeout(timeout_s)
    res = {"received": 0, "hash": None}

    def rx():
        try:
            c, _ = srv.accept()
        except OSError:
            return
        c.settimeout(timeout_s)
        h = hashlib.sha256()
        got = 0
        buf = bytearray(1 << 20)
        try:
            while True:
                k = c.recv_into(buf)
                if not k:
                    break
                h.update(memoryview(buf)[:k])
                got += k
        except OSError:
            pass
        finally:
            c.close()
        res["received"], res["hash"] = got, h.hexdigest()

    th = threading.Thread(target=rx, daemon=True)
    th.start()
    with in_netns(fab.ns_a):
        cl = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    cl.settimeout(timeout_s)
    want = hashlib.sha256()
    sent = 0
    t0 = time.monotonic()
    try:
        cl.connect((fab.ip_b, port))
        while sent < nbytes and time.monotonic() - t0 < timeout_s:
            chunk = data[: min(len(data), nbytes - sent)]
            cl.sendall(chunk)
            want.update(chunk)
            sent += len(chunk)
        cl.shutdown(socket.SHUT_WR)
    finally:
        cl.close()
    th.join(timeout_s)
    dt = time.monotonic() - t0
    srv.close()
    return {"sent": sent, "received": res["received"], "intact": res["hash"] == want.hexdigest(),
            "seconds": dt, "gbps": res["received"] * 8 / dt / 1e9 if dt > 0 else 0.0}


# ---- an observer attached inside ns_b --------------------------------------------------------
@contextlib.contextmanager
def observer(fab: VethPair, mode: str | None, max_flows: int = 65536):
    """None: nothing attached (baseline). 'xdp' (native), 'xdp-generic', 'tc': skewscope's
    program on if_b ingress. Yields the Dataplane (or None)."""
    if mode is None:
        yield None
        return
    if mode == "xdp-trivial":  # the reference: any XDP program (return XDP_PASS) on the veth
        with trivial_xdp(fab):
            yield None
        return
    dp = Dataplane(Config(max_flows=max_flows, ev_per_cpu=1 << 12))
    att = None
    try:
        with in_netns(fab.ns_b):
            att = Attachment(dp, fab.if_b, mode="tc" if mode == "tc" else "xdp",
                             xdp_mode="generic" if mode == "xdp-generic" else "native").attach()
        yield dp
    finally:
        if att is not None:
            with in_netns(fab.ns_b):
                att.detach()
        dp.close()


@contextlib.contextmanager
def trivial_xdp(fab: VethPair, native: bool = True):
    """An XDP program that only returns XDP_PASS, attached to if_b: what any XDP program costs
    on this interface (veth switches to NAPI + a 256-slot ring when one is attached)."""
    from bcc import BPF  # optional (python3-bpfcc): only for the trivial reference program
    b = BPF(text="int ssr_trivial(struct xdp_md *ctx) { return XDP_PASS; }")
    fn = b.load_func("ssr_trivial", BPF.XDP)
    flags = 1 << 2 if native else 1 << 1
    with in_netns(fab.ns_b):
        b.attach_xdp(fab.if_b, fn, flags)
    try:
        yield
    finally:
        with in_netns(fab.ns_b):
            b.remove_xdp(fab.if_b, flags)
        b.cleanup()


def roce_flood_with_tcp(fab: VethPair, mode: str | None, nframes: int, tcp_bytes: int, nflows: int = 64) -> dict:
    """One transparency run: a RoCE flood (UDP 4791 to a bound socket in ns_b) and a TCP transfer
    at the same time, with `mode` attached. Loss = frames sent - datagrams the UDP layer took in."""
    frames, _ = roce_frames(fab, nflows, max(1, nframes // nflows))
    with in_netns(fab.ns_b):
        rs = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rs.setsockopt(socket.SOL_SOCKET, 33, 1 << 30)  # SO_RCVBUFFORCE: hold the whole flood
    rs.bind((fab.ip_b, 4791))
    rs.setblocking(False)
    try:
        with observer(fab, mode) as dp:
            u0, d0 = udp_snmp(fab.ns_b), link_drops(fab)
            out = {}
            th = threading.Thread(target=lambda: out.update(tcp=tcp_transfer(fab, tcp_bytes)), daemon=True)
            th.start()
            sent, secs = blast(fab.ns_a, fab.if_a, frames)
            th.join(120)
            time.sleep(0.2)
            delivered = 0  # what reached the socket (InDatagrams counts only what is read)
            buf = bytearray(2048)
            while True:
                try:
                    rs.recv_into(buf)
                except BlockingIOError:
                    break
                delivered += 1
            u1, d1 = udp_snmp(fab.ns_b), link_drops(fab)
            seen = None
            if dp is not None:
                g = dp.read_globals()
                seen = {"accounted": int(g[L.G_ACCOUNTED]), "frames": int(g[L.G_FRAMES])}
    finally:
        rs.close()
    return {"mode": mode or "none", "roce_sent": sent, "roce_delivered": delivered, "roce_lost": sent - delivered,
            "rcvbuf_errors": u1["RcvbufErrors"] - u0["RcvbufErrors"], "link_drops": d1 - d0,
            "roce_pps": sent / secs if secs else 0.0, "tcp": out.get("tcp"), "seen": seen}


def exact_accounting(fab: VethPair, mode: str, nflows: int, per_flow: int) -> dict:
    frames, flow = roce_frames(fab, nflows, per_flow)
    with observer(fab, mode, max_flows=max(1024, nflows * 2)) as dp:
        d0 = link_drops(fab)
        sent, secs = blast(fab.ns_a, fab.if_a, frames, timeout_s=120)
        time.sleep(0.3)
        d1 = link_drops(fab)
        f = dp.read_flows()
        g = dp.read_globals()
    sent_per = np.bincount(flow[:sent], minlength=nflows)
    got = np.zeros(nflows, dtype=np.int64)
    qp = f["dest_qp"].astype(np.int64) - 0x100
    ok = (qp >= 0) & (qp < nflows)
    got[qp[ok]] = f["packets"][ok]
    return {"mode": mode, "sent": int(sent), "seconds": secs, "pps": sent / secs if secs else 0.0,
            "accounted": int(g[L.G_ACCOUNTED]), "frames_seen": int(g[L.G_FRAMES]),
            "flows_exact": int((got == sent_per).sum()), "flows": nflows,
            "flows_over": int((got > sent_per).sum()), "shortfall": int((sent_per - got).sum()),
            "link_drops": int(d1 - d0), "other_flows": int((~ok).sum())}


def map_memlock(fd: int) -> int:
    for ln in Path(f"/proc/self/fdinfo/{fd}").read_text().splitlines():
        if ln.startswith("memlock:"):
            return int(ln.split()[1])
    raise RuntimeError("no memlock in fdinfo")


def map_pressure(nflows: int = 5000, max_flows: int = 1024) -> dict:
    """Flows beyond max_flows: what the LRU keeps, what it evicts, and the memory it takes."""
    out = {}
    with pair("map") as fab:
        frames, _ = roce_frames(fab, nflows, 3)
        with observer(fab, "xdp", max_flows=max_flows) as dp:
            fd = dp.bpf["flows"].map_fd
            mem0 = map_memlock(fd)
            sent, _ = blast(fab.ns_a, fab.if_a, frames)
            time.sleep(0.2)
            mem1 = map_memlock(fd)
            snap = dp.snapshot({"source": "live"})
        g = snap.globals
        out = {"flows_sent": nflows, "frames_sent": sent, "max_flows": max_flows,
               "flows_present": len(snap.flows), "flows_created": int(g[L.G_FLOWS_CREATED]),
               "flows_evicted": snap.meta["flows_evicted"], "accounted": int(g[L.G_ACCOUNTED]),
               "packets_in_present_flows": int(snap.flows["packets"].sum()),
               "memlock_before": mem0, "memlock_after": mem1,
               "documented_bound": Config(max_flows=max_flows).memory_bytes()["flows"]}
    return out
