#!/usr/bin/env python3
"""xsim: an independent RoCEv2 traffic simulator for held-out detection checks.

skewscope's own generator (skewscope.gen) is the ground truth of most tests, so a detector
can end up fitted to its shapes. This module shares no code with it or with the parser:
its own frame packer (struct), its own timing models, its own sizes and QP habits, and a
truth written by the scenario, not measured. What it models, each with a choice the
generator does not make:

* ring all-reduce (ring order = member list), per channel one connection, messages of a
  step cut into pieces of `piece` bytes; step timing "dataflow" (a rank sends step k when
  its own step k-1 is out and its predecessor's step k-1 is in, + hop) or "barrier" (step
  k of every member starts when the last member finished step k-1, + hop);
* TP decode: tokens of `layers` x `ars` small ring all-reduces with a compute gap between
  layers and a gap between tokens, both timing models;
* all-to-all: every source to every destination, chunked, senders interleave their peers
  round robin at their link rate; a hot destination gets `factor` x the bytes; `phases`
  repetitions (1 = one collective, no iterations);
* a slow member: `lag_us` added to every send ("send") or to the first piece of every step
  ("step"), only while the model time is in [since_ms, until_ms);
* data as RDMA WRITE (FIRST/MIDDLE/LAST_IMM, ONLY_IMM) or as SEND (FIRST/MIDDLE/LAST,
  ONLY), ACKs every `ack_every` packets and at each message end (or none), no CTS unless
  asked (`cts=True`: a 64-byte WRITE_ONLY back before each message);
* per-node views (only frames from or to the node) with that node's clock offset.

    from xsim import Sim
    s = Sim(nodes=8, seed=3)
    truth = s.ring(list(range(8)), nbytes=8 << 20, iterations=4, period_ms=30,
                   timing="barrier", slow={5: 80.0}, lag_per="send")
    s.write("ring.pcap", snaplen=128)            # the mirror's view
    s.write("n2.pcap", view=2, clock_offset_ns=3_000_000)

Truth: a dict per workload with kind, members (IPs), the slow member's IP, the hot
destination's IP, the onset (since_ns/until_ns in pcap time)."""
from __future__ import annotations

import ipaddress
import struct

import numpy as np

EPOCH_NS = 1_767_225_600 * 10**9     # 2026-01-01 UTC: pcap time of model t = 0
ROCE_PORT = 4791

OP_SEND_FIRST, OP_SEND_MIDDLE, OP_SEND_LAST, OP_SEND_ONLY = 0x00, 0x01, 0x02, 0x04
OP_W_FIRST, OP_W_MIDDLE, OP_W_LAST_IMM, OP_W_ONLY, OP_W_ONLY_IMM = 0x06, 0x07, 0x09, 0x0A, 0x0B
OP_ACK = 0x11


class Sim:
    def __init__(self, nodes: int, seed: int = 0, ipv6: bool = False, mtu: int = 4096, gbps: float = 100.0,
                 ack_every: int = 16, data_op: str = "write", cts: bool = False, base: str | None = None):
        self.n = nodes
        self.rng = np.random.default_rng(seed)
        self.ipv6 = ipv6
        self.mtu = mtu
        self.bps = gbps * 1e9 * 0.92
        self.ack_every = ack_every
        self.data_op = data_op
        self.cts = cts
        if base is None:
            base = "fd00:77::10" if ipv6 else f"172.{16 + int(self.rng.integers(0, 8))}.{int(self.rng.integers(0, 250))}.10"
        b = ipaddress.ip_address(base)
        self.ip = [b + 7 * i for i in range(nodes)]         # not consecutive on purpose
        self.ip_str = [a.compressed for a in self.ip]
        self.ip_b = [a.packed for a in self.ip]
        self.mac = [bytes([0x02, 0x1b, 0x21, 0, i >> 8, i & 0xFF]) for i in range(nodes)]
        self.pkts = []        # (t_ns, src, dst, dqp, psn_qp_key, opcode, payload, reth_len)
        self.psn = {}
        self.truth = []
        self._rot = {}

    # ---------------------------------------------------------------- connections
    def conn(self, a: int, b: int):
        """One RC QP pair a<->b: (a's QPN, b's QPN, UDP source port)."""
        qa, qb = (int(x) for x in self.rng.integers(0x40, 0xFFFFF, size=2))
        sport = int(self.rng.integers(0xC000, 0xFFFF))
        for q in (qa, qb):
            self.psn[q] = int(self.rng.integers(0, 1 << 24))
        return qa, qb, sport

    # ---------------------------------------------------------------- one message
    def message(self, t: float, a: int, b: int, c, size: int, rate: float | None = None) -> float:
        """Send `size` bytes a -> b on connection c starting at t (ns); returns the end time."""
        qa, qb, sport = c
        rate = rate or self.bps
        if self.cts:
            self._pkt(t - 2000.0, b, a, qa, sport, OP_W_ONLY, 64, 64)
        npk = max(1, -(-size // self.mtu))
        tt = t
        for i in range(npk):
            pl = min(self.mtu, size - i * self.mtu) if size else 0
            if self.data_op == "send":
                op = OP_SEND_ONLY if npk == 1 else (OP_SEND_FIRST if i == 0 else
                                                    OP_SEND_LAST if i == npk - 1 else OP_SEND_MIDDLE)
                reth = None
            else:
                op = OP_W_ONLY_IMM if npk == 1 else (OP_W_FIRST if i == 0 else
                                                     OP_W_LAST_IMM if i == npk - 1 else OP_W_MIDDLE)
                reth = size if op in (OP_W_FIRST, OP_W_ONLY_IMM) else None
            self._pkt(tt, a, b, qb, sport, op, pl, reth)
            if self.ack_every and ((i + 1) % self.ack_every == 0 or i == npk - 1):
                self._pkt(tt + 1500.0, b, a, qa, sport, OP_ACK, 0, None)
            tt += (pl + 70) * 8e9 / rate
        return tt

    def _pkt(self, t, s, d, dqp, sport, op, pl, reth):
        key = dqp
        psn = self.psn.setdefault(key, 0)
        if op != OP_ACK:
            self.psn[key] = (psn + 1) & 0xFFFFFF
        self.pkts.append((t, s, d, dqp, sport, op, pl, reth, psn))

    # ---------------------------------------------------------------- lags
    @staticmethod
    def _lag(slow, node, t, since, until):
        if node not in slow:
            return 0.0
        if since is not None and t < since:
            return 0.0
        if until is not None and t >= until:
            return 0.0
        return slow[node] * 1e3

    def _onset(self, since_ms, until_ms):
        return (None if since_ms is None else since_ms * 1e6, None if until_ms is None else until_ms * 1e6)

    # ---------------------------------------------------------------- ring collectives
    def _ring_once(self, mem, conns, t0, chunk, piece, timing, hop, slow, lag_per, since, until, rate):
        """One ring all-reduce of every channel from t0; returns its end."""
        n = len(mem)
        end_all = t0
        pieces = [piece] * (chunk // piece) + ([chunk % piece] if chunk % piece else [])
        if not pieces:
            pieces = [chunk]
        for cc in conns:
            prev_end = [t0] * n          # when member l finished its previous step
            prev_recv = [t0] * n         # when member l's previous-step data arrived (from l-1)
            for k in range(2 * n - 2):
                if timing == "barrier":
                    gate = max(prev_end) + (hop if k else 0.0)
                    ready = [gate] * n
                else:
                    ready = [max(prev_end[l], prev_recv[l] + (hop if k else 0.0)) for l in range(n)]
                ends = [0.0] * n
                for l in range(n):
                    t = ready[l]
                    for j, sz in enumerate(pieces):
                        if j == 0 or lag_per == "send":
                            t += self._lag(slow, mem[l], t, since, until)
                        qs = cc[l]
                        self._rot[id(qs)] = r = self._rot.get(id(qs), -1) + 1
                        t = self.message(t, mem[l], mem[(l + 1) % n], qs[r % len(qs)], sz, rate)
                    ends[l] = t
                prev_recv = [ends[(l - 1) % n] for l in range(n)]
                prev_end = ends
            end_all = max(end_all, max(prev_end))
        return end_all

    def _ring_conns(self, mem, channels, qps):
        """Per channel, per member: its `qps` connections to its successor (messages rotate)."""
        n = len(mem)
        return [[[self.conn(mem[l], mem[(l + 1) % n]) for _ in range(qps)] for l in range(n)]
                for _ in range(channels)]

    def ring(self, members, nbytes, iterations=4, period_ms=20.0, channels=1, timing="dataflow", hop_us=3.0,
             piece=512 << 10, slow=None, lag_per="step", since_ms=None, until_ms=None, start_ms=1.0, qps=1):
        slow = slow or {}
        since, until = self._onset(since_ms, until_ms)
        conns = self._ring_conns(members, channels, qps)
        n = len(members)
        chunk = max(1, nbytes // (channels * n))
        rate = self.bps / channels
        t = start_ms * 1e6
        for i in range(iterations):
            j = float(self.rng.normal(0, 0.01 * period_ms * 1e6))
            end = self._ring_once(members, conns, t + j, chunk, piece, timing, hop_us * 1e3, slow, lag_per, since,
                                  until, rate)
            # the next all-reduce starts on the period's grid, or after this one ended when a
            # lag made it longer than the period (a QP carries its messages in order)
            t = max(t + period_ms * 1e6, end + 0.1 * period_ms * 1e6)
        return self._note("ring_allreduce", members, slow=slow, since=since, until=until, timing=timing)

    def tp_decode(self, members, tokens=40, layers=8, ars=2, ar_bytes=64 << 10, compute_us=40.0, token_gap_us=300.0,
                  channels=1, timing="dataflow", hop_us=2.0, slow=None, lag_per="send", since_ms=None, until_ms=None,
                  start_ms=1.0, qps=1):
        slow = slow or {}
        since, until = self._onset(since_ms, until_ms)
        conns = self._ring_conns(members, channels, qps)
        n = len(members)
        chunk = max(64, ar_bytes // (channels * n))
        rate = self.bps / channels
        t = start_ms * 1e6
        for _ in range(tokens):
            for _ in range(layers):
                for _ in range(ars):
                    t = self._ring_once(members, conns, t, chunk, chunk, timing, hop_us * 1e3, slow, lag_per, since,
                                        until, rate)
                t += compute_us * 1e3 * (1 + 0.02 * float(self.rng.standard_normal()))
            t += token_gap_us * 1e3
        return self._note("tp_decode", members, slow=slow, since=since, until=until, timing=timing)

    # ---------------------------------------------------------------- all-to-all
    def alltoall(self, members, bytes_per_pair=2 << 20, phases=1, period_ms=20.0, hot=None, factor=3.0,
                 chunk=256 << 10, start_ms=1.0, sources=None):
        """Every member to every other; `hot` (a member) receives factor x from every source.
        sources: only these members send (a view of some senders), default all."""
        n = len(members)
        conns = {(a, b): self.conn(a, b) for a in members for b in members if a != b}
        t = start_ms * 1e6
        for _ in range(phases):
            for a in (sources or members):
                dests = [b for b in members if b != a]
                self.rng.shuffle(dests)
                left = {b: int(bytes_per_pair * (factor if b == hot else 1.0)
                               * (1 + 0.05 * float(self.rng.standard_normal()))) for b in dests}
                tt = t + float(self.rng.uniform(0, 20e3))
                while any(v > 0 for v in left.values()):
                    for b in dests:
                        if left[b] > 0:
                            sz = min(chunk, left[b])
                            left[b] -= sz
                            tt = self.message(tt, a, b, conns[(a, b)], sz)
            t += period_ms * 1e6
        del n
        return self._note("all_to_all", members, hot=hot, factor=factor)

    def _note(self, kind, members, slow=None, hot=None, since=None, until=None, **more):
        tr = {"kind": kind, "members": [self.ip_str[m] for m in members]}
        if slow:
            tr["slow"] = [self.ip_str[m] for m in slow]
            tr["since_ns"] = None if since is None else int(EPOCH_NS + since)
            tr["until_ns"] = None if until is None else int(EPOCH_NS + until)
        if hot is not None:
            tr["hot"] = self.ip_str[hot]
        tr.update(more)
        self.truth.append(tr)
        return tr

    # ---------------------------------------------------------------- output
    def frames(self, view: int | None = None, clock_offset_ns: int = 0, snaplen: int = 128):
        """(ts_ns, captured bytes, original length) in time order."""
        order = sorted(range(len(self.pkts)), key=lambda i: self.pkts[i][0])
        for i in order:
            t, s, d, dqp, sport, op, pl, reth, psn = self.pkts[i]
            if view is not None and view not in (s, d):
                continue
            yield (int(EPOCH_NS + t) + clock_offset_ns, *self._frame(s, d, dqp, sport, op, pl, reth, psn, snaplen))

    def _frame(self, s, d, dqp, sport, op, pl, reth, psn, snaplen):
        ext = b""
        if reth is not None:
            ext += struct.pack(">QII", 0x7F00_0000_0000 + psn * 64, 0x1234, reth)
        if op in (OP_W_LAST_IMM, OP_W_ONLY_IMM):
            ext += struct.pack(">I", 0)
        if op == OP_ACK:
            ext += struct.pack(">I", psn & 0xFFFFFF)       # syndrome 0 (ACK), MSN
        pad = (-pl) % 4
        bth = struct.pack(">BBHII", op, pad << 4, 0xFFFF, dqp & 0xFFFFFF,
                          (0x80000000 if op != OP_ACK else 0) | (psn & 0xFFFFFF))
        roce_len = len(bth) + len(ext) + pl + pad + 4
        udp = struct.pack(">HHHH", sport, ROCE_PORT, 8 + roce_len, 0)
        tos = (26 << 2) | 2
        if self.ipv6:
            ip = struct.pack(">IHBB", (6 << 28) | (tos << 20), 8 + roce_len, 17, 64) + self.ip_b[s] + self.ip_b[d]
            et = 0x86DD
        else:
            hdr = struct.pack(">BBHHHBBH4s4s", 0x45, tos, 20 + 8 + roce_len, 0, 0x4000, 64, 17, 0,
                              self.ip_b[s], self.ip_b[d])
            w = sum(struct.unpack(">10H", hdr))
            while w >> 16:
                w = (w & 0xFFFF) + (w >> 16)
            ip = hdr[:10] + struct.pack(">H", ~w & 0xFFFF) + hdr[12:]
            et = 0x0800
        eth = self.mac[d] + self.mac[s] + struct.pack(">H", et)
        head = eth + ip + udp + bth + ext
        orig = len(head) + pl + pad + 4
        cap = orig if not snaplen else min(orig, snaplen)
        data = head[:cap] + bytes(max(0, cap - len(head)))
        return data, orig

    def write(self, path, view: int | None = None, clock_offset_ns: int = 0, snaplen: int = 128) -> int:
        """A nanosecond pcap (link type Ethernet) of the mirror's view or one node's."""
        n = 0
        with open(path, "wb") as f:
            f.write(struct.pack("<IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, 65535 if not snaplen else snaplen, 1))
            for ts, data, orig in self.frames(view, clock_offset_ns, snaplen):
                f.write(struct.pack("<IIII", ts // 10**9, ts % 10**9, len(data), orig))
                f.write(data)
                n += 1
        return n
