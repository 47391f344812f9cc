"""Send mode end to end: `gen --send` from inside one network namespace, frames counted
with an AF_PACKET socket in a second namespace at the other end of a veth pair.
Needs root; everything it creates is named sgt-* and removed in a finally."""
import os
import shutil
import socket
import subprocess
import sys
import threading
import time

import pytest

from skewscope import gen as skewgen
from skewscope.core.netns import in_netns

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root for netns + veth"),
              pytest.mark.skipif(shutil.which("ip") is None, reason="iproute2 missing")]


def sh(*args, check=True):
    return subprocess.run(args, capture_output=True, text=True, timeout=30, check=check)


@pytest.fixture
def veth_pair():
    tag = f"{os.getpid() % 100000}"
    na, nb = f"sgt-a{tag}", f"sgt-b{tag}"
    va, vb = f"sgtva{tag}", f"sgtvb{tag}"
    try:
        for ns in (na, nb):
            sh("ip", "netns", "add", ns)
            sh("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1")
            sh("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1")
        sh("ip", "link", "add", va, "netns", na, "type", "veth", "peer", "name", vb, "netns", nb)
        for ns, v in ((na, va), (nb, vb)):
            sh("ip", "-n", ns, "link", "set", v, "mtu", "9000")
            sh("ip", "-n", ns, "link", "set", v, "up")
        yield na, va, nb, vb
    finally:
        for ns in (na, nb):
            sh("ip", "netns", "del", ns, check=False)


class Counter(threading.Thread):
    """AF_PACKET receiver counting RoCEv2 (UDP 4791) and PFC frames, bounded in time."""

    def __init__(self, ns, iface, want, timeout):
        super().__init__(daemon=True)
        with in_netns(ns):
            self.s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
            self.s.setsockopt(socket.SOL_SOCKET, 33, 64 << 20)  # SO_RCVBUFFORCE
            self.s.bind((iface, 0))
        self.s.settimeout(0.5)
        self.want, self.deadline = want, time.monotonic() + timeout
        self.roce = 0
        self.first = None

    def run(self):
        while self.roce < self.want and time.monotonic() < self.deadline:
            try:
                data = self.s.recv(65536)
            except socket.timeout:
                continue
            if data[12:14] == b"\x08\x00" and data[23] == 17 and data[36:38] == b"\x12\xb7":
                if self.first is None:
                    self.first = data
                self.roce += 1
        self.s.close()


def test_send_mode_delivers_every_frame(veth_pair):
    na, va, nb, vb = veth_pair
    n = 3000
    rx = Counter(nb, vb, n, timeout=60)
    rx.start()
    r = subprocess.run([sys.executable, "-m", "skewscope.gen", "tp-decode", "--send", va, "--netns", na,
                        "--rate", "20000", "--max-frames", str(n)],
                       capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stderr
    assert f"sent {n} frames on {va} in netns {na}" in r.stdout
    rx.join(timeout=70)
    assert rx.roce == n
    cap = skewgen.generate("tp-decode")
    ts, first = next(cap.frames_iter())
    assert rx.first == first


def test_send_mode_is_bounded_in_time(veth_pair):
    na, va, nb, vb = veth_pair
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "skewscope.gen", "alltoall-healthy", "--send", va,
                        "--netns", na, "--rate", "2000", "--max-seconds", "1"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    sent = int(r.stdout.split("sent ")[1].split()[0])
    assert 1000 <= sent <= 2600
    assert time.monotonic() - t0 < 20


def test_send_to_missing_namespace_is_one_line_error():
    r = subprocess.run([sys.executable, "-m", "skewscope.gen", "loss", "--send", "eth0", "--netns",
                        "sgt-does-not-exist"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "not found" in r.stderr
