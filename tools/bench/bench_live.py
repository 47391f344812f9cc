#!/usr/bin/env python3
"""Live overhead: what attaching skewscope costs per packet on a real receive path, under
generated RoCE load, against the same path with nothing attached and with a trivial XDP
program, all measured in the same run.

    sudo .venv/bin/python tools/bench/bench_live.py [--seconds 3] [--rounds 5]

Set-up: two network namespaces joined by a veth pair (MTU 9000). The generator's frames
(a ring all-reduce and an MoE all-to-all: 4 KiB WRITEs, 64 B CTS, ACKs) are sent from one
side with sendmmsg(2) in batches (kernel speed, no Python per packet), the whole process
pinned to one CPU, so the sender, the veth hand-off and the receive softirq (where XDP and
TC run) all execute on that CPU. Two numbers per configuration:

  prog ns/pkt   the program's own run time per invocation, from the kernel's BPF run-time
                statistics (kernel.bpf_stats_enabled=1, run_time_ns / run_cnt), i.e. what
                the attached program costs on live traffic (real caches, real map state);
  CPU ns/pkt    CPU time spent on the traffic per frame, whole path: the sending thread
                (which, on kernels without IRQ_TIME_ACCOUNTING, is charged the softirqs run
                in its context: veth hand-off, receive path, XDP/TC) + the CPU's ksoftirqd;
                other processes on the machine are not counted. "extra" is the difference
                to "nothing attached".

Configurations are interleaved within each round; the minimum over rounds is reported
(interference from other load only ever adds), with the median beside it.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

NS_A, NS_B, IF_A, IF_B = "ssu-bl-a", "ssu-bl-b", "ssubla", "ssublb"


def sh(*cmd, check=True):
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


def setup():
    teardown()
    sh("ip", "netns", "add", NS_A)
    sh("ip", "netns", "add", NS_B)
    sh("ip", "-n", NS_A, "link", "add", IF_A, "mtu", "9000", "type", "veth", "peer", "name", IF_B, "netns", NS_B)
    for ns, i in ((NS_A, IF_A), (NS_B, IF_B)):
        sh("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1")
        sh("ip", "-n", ns, "link", "set", i, "mtu", "9000", "up")


def teardown():
    for ns in (NS_A, NS_B):
        sh("ip", "netns", "del", ns, check=False)


def frames(n_each=4096):
    from skewscope import gen as skewgen
    sg = skewgen
    out = []
    for preset in ("ring-straggler", "moe-hot-expert"):
        cap = sg.generate(preset, seed=11)
        for k, (_, f) in enumerate(cap.frames_iter()):
            if k >= n_each:
                break
            out.append(f)
    out.sort(key=len)              # no order effect: interleave big and small evenly
    big, small = [f for f in out if len(f) > 1000], [f for f in out if len(f) <= 1000]
    mixed = []
    ratio = max(1, len(big) // max(1, len(small)))
    while big or small:
        mixed += [big.pop() for _ in range(min(ratio, len(big)))]
        if small:
            mixed.append(small.pop())
    return mixed


class MMsgSender:
    """sendmmsg(2) over an AF_PACKET socket: one syscall per batch of frames."""

    class IOVec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

    class MsgHdr(ctypes.Structure):
        _fields_ = [("name", ctypes.c_void_p), ("namelen", ctypes.c_uint32), ("iov", ctypes.c_void_p),
                    ("iovlen", ctypes.c_size_t), ("control", ctypes.c_void_p), ("controllen", ctypes.c_size_t),
                    ("flags", ctypes.c_int)]

    class MMsgHdr(ctypes.Structure):
        pass

    MMsgHdr._fields_ = [("hdr", MsgHdr), ("len", ctypes.c_uint)]

    def __init__(self, sock: socket.socket, frames: list[bytes]):
        self.sock = sock
        self.libc = ctypes.CDLL(None, use_errno=True)
        n = len(frames)
        self.bufs = [ctypes.create_string_buffer(f, len(f)) for f in frames]
        self.iov = (self.IOVec * n)()
        self.msgs = (self.MMsgHdr * n)()
        for i, b in enumerate(self.bufs):
            self.iov[i].base = ctypes.addressof(b)
            self.iov[i].len = len(frames[i])
            self.msgs[i].hdr.iov = ctypes.addressof(self.iov[i])
            self.msgs[i].hdr.iovlen = 1
        self.n = n

    def send_all(self) -> int:
        off = 0
        while off < self.n:
            k = min(1024, self.n - off)
            r = self.libc.sendmmsg(self.sock.fileno(), ctypes.byref(self.msgs, off * ctypes.sizeof(self.MMsgHdr)),
                                   k, 0)
            if r < 0:
                e = ctypes.get_errno()
                if e in (105, 11):          # ENOBUFS / EAGAIN: back off
                    time.sleep(0.0002)
                    continue
                raise OSError(e, os.strerror(e))
            off += r
        return self.n


def _ksoftirqd_pid(cpu: int) -> int | None:
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                if Path(f"/proc/{p}/comm").read_text().strip() == f"ksoftirqd/{cpu}":
                    return int(p)
            except OSError:
                pass
    return None


def cpu_ns(ksoftirqd: int | None) -> int:
    """CPU time spent on our behalf: this thread (user + system, which on a kernel without
    IRQ_TIME_ACCOUNTING includes the softirqs -- veth hand-off, receive path, XDP/TC --
    run in its context) + the pinned CPU's ksoftirqd (softirqs deferred to it). Other
    processes on the CPU are not counted, so the shared machine's load does not leak in."""
    import resource
    r = resource.getrusage(resource.RUSAGE_THREAD)
    t = int((r.ru_utime + r.ru_stime) * 1e9)
    if ksoftirqd:
        try:
            f = Path(f"/proc/{ksoftirqd}/stat").read_text().rsplit(")", 1)[1].split()
            t += (int(f[11]) + int(f[12])) * (10**9 // os.sysconf("SC_CLK_TCK"))
        except (OSError, IndexError, ValueError):
            pass
    return t


def prog_stats(prog_id: int) -> tuple[int, int]:
    """(run_time_ns, run_cnt) of a BPF program (struct bpf_prog_info @ 192/200)."""
    from skewscope.bpf import syscalls as bpfsys
    fd = bpfsys.prog_fd_by_id(prog_id)
    try:
        info = (ctypes.c_uint8 * 256)()
        a = bpfsys._attr()
        bpfsys._put(a, 0, "<I", fd)
        bpfsys._put(a, 4, "<I", ctypes.sizeof(info))
        bpfsys._put(a, 8, "<Q", ctypes.addressof(info))
        bpfsys._sys_bpf(bpfsys.BPF_OBJ_GET_INFO_BY_FD, a)
        import struct
        return struct.unpack_from("<QQ", bytes(info), 192)
    finally:
        os.close(fd)


TRIVIAL = b"int trivial(struct xdp_md *ctx) { return XDP_PASS; }"


class Trivial:
    """A trivial XDP program (return XDP_PASS), loaded like ours (frags), attached native."""

    def __init__(self, ifname):
        from bcc import BPF, lib

        from skewscope.bpf import attach as dataplane
        from skewscope.bpf import syscalls as bpfsys
        self.b = BPF(text=TRIVIAL)
        st, sz = lib.bpf_function_start(self.b.module, b"trivial"), lib.bpf_function_size(self.b.module, b"trivial")
        self.fd = bpfsys.prog_load(bpfsys.BPF_PROG_TYPE_XDP, st, sz, "trivial", b"GPL",
                                   flags=bpfsys.BPF_F_XDP_HAS_FRAGS, expected_attach_type=bpfsys.BPF_XDP)
        self.id = bpfsys.prog_info(self.fd)["id"]
        self.ifname = ifname
        self.idx = socket.if_nametoindex(ifname)
        dataplane._xdp_set(self.idx, self.fd, dataplane.XDP_FLAGS_DRV_MODE)

    def close(self):
        from skewscope.bpf import attach as dataplane
        dataplane._xdp_set(self.idx, -1, dataplane.XDP_FLAGS_DRV_MODE)
        os.close(self.fd)
        self.b.cleanup()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0, help="traffic per configuration per round")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_live: needs root (namespaces, attach)", file=sys.stderr)
        return 4
    from skewscope.core.netns import in_netns
    from skewscope.sources import live

    cpu = sorted(os.sched_getaffinity(0))[-1]
    os.sched_setaffinity(0, {cpu})
    ksd = _ksoftirqd_pid(cpu)
    old_stats = Path("/proc/sys/kernel/bpf_stats_enabled").read_text().strip()
    fr = frames()
    setup()
    res: dict = {}
    try:
        Path("/proc/sys/kernel/bpf_stats_enabled").write_text("1")
        with in_netns(NS_A):
            s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
        s.bind((IF_A, 0))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
        sender = MMsgSender(s, fr)
        configs = ["none", "trivial XDP (native)", "skewscope XDP native", "skewscope XDP generic",
                   "skewscope TC ingress", "skewscope XDP native, --sample 8"]

        def attach(name):
            with in_netns(NS_B):
                if name == "none":
                    return None, None
                if name.startswith("trivial"):
                    t = Trivial(IF_B)
                    return t, t.id
                kw = {"mode": "tc"} if "TC" in name else {"xdp_mode": "generic" if "generic" in name else "native"}
                if "sample" in name:
                    kw["sample_n"] = 8
                sess = live.LiveSession(IF_B, **kw).open()
                pid = getattr(sess.att, "prog_id", 0)  # bpf_link (tcx, XDP link) or netlink
                if not pid:
                    pid = live._tc_prog_ids(IF_B)[0][1] if "TC" in name else live.list_ours(IF_B)["xdp"]
                return sess, pid

        def detach(h):
            if h is None:
                return
            with in_netns(NS_B):
                h.close()

        sender.send_all()    # warm-up
        for rnd in range(a.rounds):
            for name in configs:
                h, pid = attach(name)
                try:
                    sender.send_all()                           # warm: flows exist
                    st0 = prog_stats(pid) if pid else (0, 0)
                    c0, t0 = cpu_ns(ksd), time.monotonic()
                    sent = 0
                    while time.monotonic() - t0 < a.seconds:
                        sent += sender.send_all()
                    time.sleep(0.05)                            # let the last softirqs finish
                    c1 = cpu_ns(ksd)
                    st1 = prog_stats(pid) if pid else (0, 0)
                    el = time.monotonic() - t0
                finally:
                    detach(h)
                runs = st1[1] - st0[1]
                res.setdefault(name, []).append({
                    "cpu_ns": (c1 - c0) / sent, "prog_ns": (st1[0] - st0[0]) / runs if runs else None,
                    "runs_per_sent": runs / sent if pid else None, "pps": sent / el})
            print(f"round {rnd + 1}/{a.rounds} done", file=sys.stderr)
    finally:
        Path("/proc/sys/kernel/bpf_stats_enabled").write_text(old_stats)
        teardown()

    def med(name, k):
        v = [x[k] for x in res[name] if x[k] is not None]
        return statistics.median(v) if v else None

    def low(name, k):
        v = [x[k] for x in res[name] if x[k] is not None]
        return min(v) if v else None
    base = low("none", "cpu_ns")
    sizes = [len(f) for f in fr]
    print(f"skewscope live overhead: veth, {len(fr)} generator frames (ring all-reduce + MoE all-to-all, "
          f"{sum(1 for x in sizes if x > 1000) * 100 // len(sizes)}% 4 KiB), sendmmsg, 1 CPU")
    print(f"kernel {platform.release()}, {os.cpu_count()} CPUs, {a.rounds} rounds x {a.seconds:g} s, "
          "minimum over rounds (median beside)")
    print()
    hdr = f"{'configuration':<34}{'prog ns/pkt':>12}{'CPU ns/pkt':>12}{'(median)':>10}{'extra':>8}"
    print(hdr)
    print("-" * len(hdr))
    for name in res:
        p = low(name, "prog_ns")
        c = low(name, "cpu_ns")
        extra = "" if name == "none" else f"{c - base:+.0f}"
        print(f"{name:<34}{('-' if p is None else f'{p:.0f}'):>12}{c:>12.0f}{med(name, 'cpu_ns'):>10.0f}{extra:>8}")
    print()
    print("prog ns/pkt: kernel BPF run-time statistics of the attached program (the statistics add ~30 ns of\n"
          "their own per run: compare 'trivial' with its BPF_PROG_TEST_RUN figure in bench_dataplane.py).\n"
          "CPU ns/pkt: CPU time of the sending thread (charged with the softirqs it runs) + ksoftirqd per frame,\n"
          "whole send+veth+receive path; extra: over 'none'.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
