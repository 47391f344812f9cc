"""Two network namespaces joined by a veth pair: the smallest test fabric (tests' `netns_pair`
fixture, tools/reliability.py). The N-node fabric with a switch and a DPU is testbed.fabric.

VethPair: `ns_a` (the "host", sends) <-veth-> `ns_b` (the "observer"); unique names
`PREFIX-TAG-UID-a/b`, IPv6 off (so the kernel sends nothing on its own and counts stay exact),
SUBNET.1/24 and SUBNET.2/24, optionally static neighbours (no ARP at all).
"""
from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import time
from dataclasses import dataclass

from skewscope.core.netns import in_netns

_counter = itertools.count()


def sh(*cmd, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
    """Run a command (every argument str()-ed), capture its output, raise on failure if check."""
    return subprocess.run([str(c) for c in cmd], check=check, capture_output=True, text=True, timeout=timeout)


def unique_id() -> str:
    """A short id unique within this machine's running processes (pid + a counter)."""
    return f"{os.getpid() % 100000}{next(_counter)}"


@dataclass
class VethPair:
    """Namespaces `ns_a` and `ns_b`, veth `if_a` in ns_a <-> `if_b` in ns_b. Helpers run
    commands in, send frames from, or enter a namespace; `with VethPair.create(...)` deletes it."""
    tag: str
    ns_a: str
    ns_b: str
    if_a: str
    if_b: str
    ip_a: str = "10.199.0.1"
    ip_b: str = "10.199.0.2"
    mtu: int = 1500
    mac_a: str = ""
    mac_b: str = ""

    @classmethod
    def create(cls, tag: str = "t", prefix: str = "sst", subnet: str = "10.199.0",
               static_neighbours: bool = False) -> "VethPair":
        uid = unique_id()
        p = cls(tag=tag, ns_a=f"{prefix}-{tag}-{uid}-a", ns_b=f"{prefix}-{tag}-{uid}-b",
                if_a=f"{prefix}{uid}a"[:15], if_b=f"{prefix}{uid}b"[:15], ip_a=f"{subnet}.1", ip_b=f"{subnet}.2")
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
            p.mac_a, p.mac_b = p.mac("a"), p.mac("b")
            if static_neighbours:  # no ARP traffic to muddy the counts
                p.run("a", "ip", "neigh", "replace", p.ip_b, "lladdr", p.mac_b, "dev", p.if_a, "nud", "permanent")
                p.run("b", "ip", "neigh", "replace", p.ip_a, "lladdr", p.mac_a, "dev", p.if_b, "nud", "permanent")
        except BaseException:
            p.destroy()
            raise
        return p

    def destroy(self) -> None:
        for ns in (self.ns_a, self.ns_b):
            sh("ip", "netns", "del", ns, check=False)  # takes its veth end (and the peer) with it

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.destroy()

    def ns(self, side: str) -> str:
        return self.ns_a if side == "a" else self.ns_b

    def ifname(self, side: str) -> str:
        return self.if_a if side == "a" else self.if_b

    def run(self, side: str, *cmd, check: bool = True, timeout: float = 20) -> subprocess.CompletedProcess:
        return sh("ip", "netns", "exec", self.ns(side), *cmd, check=check, timeout=timeout)

    def exec(self, ns: str, *cmd, **kw) -> subprocess.CompletedProcess:
        return sh("ip", "netns", "exec", ns, *cmd, **kw)

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

    @staticmethod
    def link(ns: str, ifn: str) -> dict:
        """`ip -s -j link show` of one interface (stats64 included)."""
        return json.loads(sh("ip", "-n", ns, "-s", "-j", "link", "show", "dev", ifn).stdout)[0]

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


def create_pair(tag: str) -> VethPair:
    """The tests' pair: `sst-` names, 10.199.0.0/24, ARP as usual."""
    return VethPair.create(tag)


def destroy_pair(p: VethPair) -> None:
    p.destroy()
