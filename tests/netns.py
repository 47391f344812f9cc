"""Network-namespace test fabric (used by tests/conftest.py's `netns_pair` fixture, and by
scripts that need the same thing outside pytest).

NetnsPair: namespaces `ns_a` (the "host", injects) and `ns_b` (the "observer"), joined by a
veth pair `if_a` <-> `if_b`, unique `sst-` names, IPv6 off (so the kernel sends nothing on
its own and counts stay exact), 10.199.0.1/24 and .2/24. create_pair()/destroy_pair().
"""
from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import socket
import subprocess
import time
from dataclasses import dataclass

_libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNET = 0x40000000
_counter = itertools.count()


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"setns: {os.strerror(e)}")


@contextlib.contextmanager
def in_netns(name: str):
    """Run the block in network namespace `name` (this thread), then come back. Sockets and
    netlink handles opened inside stay bound to that namespace after leaving."""
    here = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    there = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        _setns(there)
        try:
            yield
        finally:
            _setns(here)
    finally:
        os.close(there)
        os.close(here)


def sh(*cmd: str, check: bool = True, timeout: float = 20) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), check=check, capture_output=True, text=True, timeout=timeout)


@dataclass
class NetnsPair:
    """Namespaces `ns_a` (the "host", injects) and `ns_b` (the "observer"), veth `if_a` in
    ns_a <-> `if_b` in ns_b. Helpers run commands in, send frames from, or enter a namespace."""
    tag: str
    ns_a: str
    ns_b: str
    if_a: str
    if_b: str
    ip_a: str = "10.199.0.1"
    ip_b: str = "10.199.0.2"
    mtu: int = 1500

    def ns(self, side: str) -> str:
        return self.ns_a if side == "a" else self.ns_b

    def ifname(self, side: str) -> str:
        return self.if_a if side == "a" else self.if_b

    def run(self, side: str, *cmd: str, check: bool = True, timeout: float = 20) -> subprocess.CompletedProcess:
        return sh("ip", "netns", "exec", self.ns(side), *cmd, check=check, timeout=timeout)

    def enter(self, side: str):
        return in_netns(self.ns(side))

    def mac(self, side: str) -> str:
        return self.run(side, "cat", f"/sys/class/net/{self.ifname(side)}/address").stdout.strip()

    def ifindex(self, side: str) -> int:
        return int(self.run(side, "cat", f"/sys/class/net/{self.ifname(side)}/ifindex").stdout.strip())

    def set_mtu(self, mtu: int) -> None:
        for side in "ab":
            self.run(side, "ip", "link", "set", "dev", self.ifname(side), "mtu", str(mtu))
        self.mtu = mtu

    def send(self, side: str, frames, *, gap_s: float = 0.0, timeout_s: float = 10.0) -> int:
        """Send raw Ethernet frames out of `side`'s veth with AF_PACKET (bounded in count and
        time). Returns how many were sent."""
        frames = [bytes(getattr(f, "frame", f)) for f in frames]
        assert len(frames) <= 100_000, "bounded send loop"
        with self.enter(side):
            s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
        sent = 0
        deadline = time.monotonic() + timeout_s
        try:
            s.bind((self.ifname(side), 0))
            for fr in frames:
                if time.monotonic() > deadline:
                    break
                for _ in range(200):  # ENOBUFS: the peer's backlog is full, back off briefly
                    try:
                        s.send(fr)
                        break
                    except OSError as e:
                        if e.errno not in (105, 11):  # ENOBUFS, EAGAIN
                            raise
                        time.sleep(0.001)
                sent += 1
                if gap_s:
                    time.sleep(gap_s)
        finally:
            s.close()
        return sent


def create_pair(tag: str) -> NetnsPair:
    n = next(_counter)
    uid = f"{os.getpid() % 100000}{n}"
    p = NetnsPair(tag=tag, ns_a=f"sst-{tag}-{uid}-a", ns_b=f"sst-{tag}-{uid}-b",
                  if_a=f"sst{uid}a"[:15], if_b=f"sst{uid}b"[:15])
    try:
        sh("ip", "netns", "add", p.ns_a)
        sh("ip", "netns", "add", p.ns_b)
        for side in "ab":
            for k in ("all", "default"):
                p.run(side, "sysctl", "-qw", f"net.ipv6.conf.{k}.disable_ipv6=1")
        sh("ip", "link", "add", p.if_a, "netns", p.ns_a, "type", "veth", "peer", "name", p.if_b, "netns", p.ns_b)
        for side, ip in (("a", p.ip_a), ("b", p.ip_b)):
            p.run(side, "ip", "link", "set", "lo", "up")
            p.run(side, "ip", "addr", "add", f"{ip}/24", "dev", p.ifname(side))
            p.run(side, "ip", "link", "set", p.ifname(side), "up")
    except BaseException:
        destroy_pair(p)
        raise
    return p


def destroy_pair(p: NetnsPair) -> None:
    for ns in (p.ns_a, p.ns_b):
        sh("ip", "netns", "del", ns, check=False)  # takes its veth end (and the peer) with it
