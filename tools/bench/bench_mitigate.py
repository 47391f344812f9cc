#!/usr/bin/env python3
"""Mitigation measured in the namespace fabric (issue 28, deliverable 4): does re-marking the
KV-cache bulk give a TP decode group its token period back, and what does the bulk pay?

The fabric (skewscope.testbed.fabric, no mirror): nodes 0..3 are a TP decode group running a
ring in closed loop -- each rank sends its step's message to the next rank only when its
upstream's message has arrived (real kernel UDP on port 4791 carrying a BTH, through the
switch's bridge), and a token is `--hops` hops around the ring after a fixed compute gap (a message that
never comes ends its token after 2 s, counted as lost);
node 4 is a prefill node streaming KV-cache bulk (RDMA WRITE MIDDLE frames, the same UDP
port) into decode rank 1. The bottleneck: the switch port towards rank 1 is shaped to
`--link` (HTB) with two classes -- the default one and a low-priority one for DSCP 8 (CS1),
as a fabric whose ETS gives CS1 a small share -- so the bulk and the decode messages share
one queue until the bulk is re-marked.

Phases, one run (each `--phase` seconds): `quiet` (no bulk: the reference), `before` (bulk,
no mitigation), `during` (`skewscope mitigate apply --flow PREFILL,RANK1 --remark 8 --yes`
on the switch port the bulk enters), `after` (`mitigate revert --all`, bulk still on).
Printed per phase: token period p50/p99 (ms) and its ratio to `quiet`, tokens, and the
bulk's delivered rate (Mbit/s) with its ratio to `before` (the cost of the mitigation).
One line per phase, beginning with the phase name, for scripts.

Run as root: python tools/bench/bench_mitigate.py [--phase 4] [--link 40] [--bulk 80]
Everything made is torn down in finally; every send loop is bounded in time.
"""
from __future__ import annotations

import argparse
import os
import select
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from skewscope.core.netns import in_netns  # noqa: E402
from skewscope.testbed.fabric import Fabric  # noqa: E402

PORT = 4791
RANKS = 4
PREFILL = 4
VICTIM = 1           # the decode rank the KV bulk goes to


def bth(opcode: int, qp: int, psn: int) -> bytes:
    """A 12-byte BTH (opcode, flags, P_Key, DestQP, PSN) -- what the mitigation program matches on."""
    return struct.pack("!BBHII", opcode, 0, 0xFFFF, qp & 0xFFFFFF, psn & 0xFFFFFF)


def sock_in(ns: str, ip: str) -> socket.socket:
    with in_netns(ns):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        s.bind((ip, PORT))
    s.setblocking(False)
    return s


class Ring:
    """The decode group in closed loop: data flow, one process, one socket per rank."""

    def __init__(self, fab: Fabric, hops: int, msg: int, gap_s: float):
        self.ips = [fab.node_ip(i) for i in range(RANKS)]
        self.socks = [sock_in(fab.node_ns[i], self.ips[i]) for i in range(RANKS)]
        self.hops, self.gap_s = hops, gap_s
        self.payload = b"\0" * msg
        self.tokens: list[tuple[float, float]] = []      # (start, period)
        self.lost = 0                                    # tokens whose message never came (2 s)
        self.bulk_bytes = 0
        self.stop = threading.Event()
        self.t = threading.Thread(target=self.run, daemon=True)

    def send(self, r: int, hop: int) -> None:
        nxt = (r + 1) % RANKS
        self.socks[r].sendto(bth(0x0A, 0x100 + nxt, hop) + self.payload, (self.ips[nxt], PORT))

    def run(self) -> None:
        fd2rank = {s.fileno(): i for i, s in enumerate(self.socks)}
        up = {i: self.ips[(i - 1) % RANKS] for i in range(RANKS)}
        bulk_src = None
        while not self.stop.is_set():
            t0 = time.monotonic()
            hop = 0
            self.send(0, hop)
            deadline = t0 + 2.0              # a lost message ends the token (counted as 2 s)
            while hop < self.hops - 1 and not self.stop.is_set():
                r, _, _ = select.select(self.socks, [], [], max(0.0, deadline - time.monotonic()))
                if not r:
                    self.lost += 1
                    break
                for s in r:
                    rank = fd2rank[s.fileno()]
                    while True:
                        try:
                            data, (src, _p) = s.recvfrom(65536)
                        except BlockingIOError:
                            break
                        if src != up[rank]:
                            if bulk_src is None or src == bulk_src:
                                bulk_src = src
                                self.bulk_bytes += len(data)
                            continue
                        hop += 1
                        if hop < self.hops - 1:
                            self.send(rank, hop)
            self.tokens.append((t0, time.monotonic() - t0))
            end = time.monotonic() + self.gap_s
            while time.monotonic() < end and not self.stop.is_set():     # the compute gap: drain bulk
                r, _, _ = select.select(self.socks, [], [], max(0.0, end - time.monotonic()))
                for s in r:
                    while True:
                        try:
                            data, (src, _p) = s.recvfrom(65536)
                        except BlockingIOError:
                            break
                        if src not in up.values():
                            self.bulk_bytes += len(data)


def bulk_sender(fab: Fabric, mbit: float, stop: threading.Event, size: int = 1400) -> threading.Thread:
    """KV-cache bulk from the prefill node to the victim, paced to `mbit` offered."""
    dst = fab.node_ip(VICTIM)
    s = sock_in(fab.node_ns[PREFILL], fab.node_ip(PREFILL))
    s.setblocking(True)
    body = b"\1" * (size - 12)

    def run():
        pps = mbit * 1e6 / 8 / (size + 28 + 14)
        t0, n = time.monotonic(), 0
        while not stop.is_set():
            due = t0 + n / pps
            now = time.monotonic()
            if due > now:
                time.sleep(min(due - now, 0.01))
                continue
            try:
                s.sendto(bth(0x07, 0x77, n) + body, (dst, PORT))
            except OSError:
                pass
            n += 1
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def shape(fab: Fabric, link_mbit: float) -> None:
    """The switch port towards the victim: HTB at the link rate, class 1:10 for everything, class
    1:20 (a small guaranteed share, lower priority) for DSCP 8."""
    sw, dev = fab.sw_ns, f"p{VICTIM}"
    run = lambda *a: subprocess.run(["tc", "-n", sw, *a], check=True, capture_output=True)  # noqa: E731
    run("qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "10")
    run("class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb", "rate", f"{link_mbit}mbit")
    run("class", "add", "dev", dev, "parent", "1:1", "classid", "1:10", "htb", "rate", f"{link_mbit * 0.9}mbit",
        "ceil", f"{link_mbit}mbit", "prio", "0")
    run("class", "add", "dev", dev, "parent", "1:1", "classid", "1:20", "htb", "rate", f"{link_mbit * 0.1}mbit",
        "ceil", f"{link_mbit}mbit", "prio", "1")
    for c in ("10", "20"):
        run("qdisc", "add", "dev", dev, "parent", f"1:{c}", "pfifo", "limit", "20000")
    run("filter", "add", "dev", dev, "parent", "1:", "prio", "1", "protocol", "ip", "u32", "match", "ip", "tos",
        "0x20", "0xfc", "flowid", "1:20")


def mitigate(fab: Fabric, *args: str) -> str:
    p = subprocess.run([sys.executable, "-m", "skewscope.cli", "mitigate", *args, "-i", f"p{PREFILL}", "--netns",
                        fab.sw_ns], capture_output=True, text=True, cwd=ROOT, timeout=120)
    if p.returncode != 0:
        raise SystemExit(f"bench_mitigate: mitigate {args[0]} failed: {p.stderr.strip()}")
    return p.stdout


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--phase", type=float, default=4.0, help="seconds per phase")
    ap.add_argument("--link", type=float, default=40.0, help="bottleneck Mbit/s")
    ap.add_argument("--bulk", type=float, default=44.0, help="KV bulk offered Mbit/s")
    ap.add_argument("--hops", type=int, default=2 * (RANKS - 1) * 2, help="ring hops per token")
    ap.add_argument("--msg", type=int, default=1024, help="decode message payload bytes")
    ap.add_argument("--gap-ms", type=float, default=2.0, help="compute gap between tokens")
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("bench_mitigate: needs root (network namespaces, tc)", file=sys.stderr)
        return 4
    fab = Fabric(nodes=RANKS + 1, prefix="ssb-", mirror=False, mtu=1500)
    print(f"bench_mitigate: {RANKS}-rank decode ring (closed loop, {a.hops} hops of {a.msg} B per token, "
          f"{a.gap_ms:g} ms compute gap) + KV bulk {a.bulk:g} Mbit/s offered from node {PREFILL} into rank {VICTIM}; "
          f"bottleneck {a.link:g} Mbit/s (HTB, DSCP 8 in a 10 % low-priority class); {a.phase:g} s per phase; "
          f"load {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs")
    try:
        fab.build()
        shape(fab, a.link)
        ring = Ring(fab, a.hops, a.msg, a.gap_ms / 1e3)
        ring.t.start()
        stop_bulk = threading.Event()
        rows = []
        bulk_t = None
        for phase in ("quiet", "before", "during", "after"):
            if phase == "before":
                bulk_t = bulk_sender(fab, a.bulk, stop_bulk)
                time.sleep(1.0)                        # the queue fills
            elif phase == "during":
                mitigate(fab, "apply", "--flow", f"{fab.node_ip(PREFILL)},{fab.node_ip(VICTIM)}", "--remark", "8",
                         "--yes", "--ttl", str(int(a.phase * 4 + 30)))
                time.sleep(0.5)
            elif phase == "after":
                mitigate(fab, "revert", "--all")
                time.sleep(1.0)
            n0, b0, l0, t0 = len(ring.tokens), ring.bulk_bytes, ring.lost, time.monotonic()
            time.sleep(a.phase)
            per = [p for _s, p in ring.tokens[n0:]]
            rows.append((phase, per, (ring.bulk_bytes - b0) * 8 / (time.monotonic() - t0) / 1e6, ring.lost - l0))
        stop_bulk.set()
        ring.stop.set()
        ring.t.join(5)
        if bulk_t is not None:
            bulk_t.join(5)
        ref = pct(rows[0][1], 0.5) if rows[0][1] else float("nan")
        bulk_ref = rows[1][2] or float("nan")
        for phase, per, mbit, lost in rows:
            if not per:
                print(f"{phase}: no token completed")
                continue
            p50, p99 = pct(per, 0.5), pct(per, 0.99)
            print(f"{phase:7s} token period p50 {p50 * 1e3:.2f} ms ({p50 / ref:.2f}x quiet), p99 {p99 * 1e3:.2f} ms "
                  f"({p99 / ref:.2f}x), {len(per)} tokens ({lost} lost); bulk {mbit:.1f} Mbit/s"
                  + (f" ({mbit / bulk_ref:.2f}x before)" if phase != "quiet" else ""))
    finally:
        left = fab.teardown()
        if left:
            print(f"bench_mitigate: could not remove {left}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
