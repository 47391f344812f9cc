#!/usr/bin/env python3
"""Held-out check on traffic skewscope's generator did not make: tools/xsim.py scenarios
(ring all-reduce, TP decode, all-to-all; data-flow and barrier step timing; lags per send or
per step, from the start or mid-capture; WRITE or SEND data; IPv4/IPv6; MTUs; channels and
QPs per connection) through the offline parser and the analysis, judged against xsim's
truth: the slow member (or hot destination) named first by a warning or critical finding
of a kind that reports it, and healthy variants without any warning.

    .venv/bin/python tools/xsim_check.py [--filter TEXT] [--seeds 1,2] [--vantage mirror,node]

vantage "node": every node's own view with an unsynchronised clock (offsets of several ms);
a view may blame only its own node (warning+), and the slow member's own view must say so
(the others may stay quiet or say, at info, that their upstream arrives late)."""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from xsim import Sim  # noqa: E402

SLOW_KINDS = {"ring_straggler", "slow_tp_shard", "straggler", "slow_link"}
HOT_KINDS = {"hot_destination", "alltoall_destination_skew"}


def cases(quick: bool = False):
    """(name, builder(seed) -> Sim) pairs."""
    out = []

    def ring(n, ch, timing, lag, per, since=None, mb=8, qps=1, ipv6=False, mtu=4096, op="write"):
        def build(seed):
            s = Sim(nodes=n, seed=seed, ipv6=ipv6, mtu=mtu, data_op=op)
            slow = {int(seed * 7 + n) % n: lag} if lag else {}
            s.ring(list(range(n)), nbytes=mb << 20, iterations=6, period_ms=12.0, channels=ch, timing=timing,
                   slow=slow, lag_per=per, since_ms=since, qps=qps)
            return s
        tag = f"ring n{n} ch{ch} {timing} " + (f"lag{lag}us/{per}" if lag else "healthy") + \
              (f" since{since}ms" if since else "") + (" v6" if ipv6 else "") + (f" mtu{mtu}" if mtu != 4096 else "") + \
              (f" qps{qps}" if qps > 1 else "") + (" send" if op == "send" else "")
        out.append((tag, build))

    def tp(n, timing, lag, per="send", since=None, tokens=30, ch=1, ipv6=False, mtu=4096, op="write", layers=6):
        def build(seed):
            s = Sim(nodes=n, seed=seed, ipv6=ipv6, mtu=mtu, data_op=op)
            slow = {int(seed * 5 + 1) % n: lag} if lag else {}
            s.tp_decode(list(range(n)), tokens=tokens, layers=layers, ars=2, ar_bytes=(16 << 10) * n,
                        compute_us=30.0, token_gap_us=200.0, channels=ch, timing=timing, slow=slow, lag_per=per,
                        since_ms=since)
            return s
        tag = f"tp n{n} {timing} " + (f"lag{lag}us/{per}" if lag else "healthy") + \
              (f" since{since}ms" if since else "") + (f" ch{ch}" if ch > 1 else "") + (" v6" if ipv6 else "") + \
              (f" mtu{mtu}" if mtu != 4096 else "") + (" send" if op == "send" else "")
        out.append((tag, build))

    def a2a(n, phases, factor, per_pair=1 << 20, ipv6=False, op="write"):
        def build(seed):
            s = Sim(nodes=n, seed=seed, ipv6=ipv6, data_op=op)
            hot = int(seed * 3 + 2) % n if factor else None
            s.alltoall(list(range(n)), bytes_per_pair=per_pair, phases=phases, hot=hot, factor=factor or 1.0)
            return s
        tag = f"a2a n{n} phases{phases} " + (f"hot x{factor}" if factor else "healthy") + (" v6" if ipv6 else "") + \
              (" send" if op == "send" else "")
        out.append((tag, build))

    for timing in ("dataflow", "barrier"):
        for n in ((4, 8) if quick else (2, 3, 4, 6, 8, 12, 16)):
            ring(n, 1, timing, 0, "step")
            for lag, per in ((300, "step"), (80, "send")) if quick else ((30, "step"), (300, "step"), (80, "send"),
                                                                          (3000, "step")):
                ring(n, 1 if n > 6 else 2, timing, lag, per)
            tp(n, timing, 0)
            for lag in ((300, 80) if quick else (10, 80, 300, 2000)):
                tp(n, timing, lag)
        ring(8, 2, timing, 80, "send")
        ring(4, 4, timing, 200, "send", qps=2)
        ring(6, 1, timing, 300, "step", since=40)
        tp(6, timing, 200, since=None, tokens=40)
        tp(6, timing, 200, since=25, tokens=40)
        tp(8, timing, 80, ch=2, ipv6=True, mtu=1024)
        tp(4, timing, 100, op="send")
    for n in ((4, 8) if quick else (3, 4, 6, 8, 12, 16)):
        a2a(n, 1, 0)
        a2a(n, 4, 0)
        if n >= 4:   # 2 sources per destination: below the documented floor (docs/metrics.md
            a2a(n, 1, 3.0)       # "All-to-all skew by repetition": a static random matrix
            a2a(n, 4, 2.0)       # favours one of two destinations for both half the time)
    a2a(4, 1, 4.0, per_pair=512 << 10, op="send")
    a2a(8, 1, 2.0, ipv6=True)
    return out


def findings(path):
    from skewscope.analysis import analyze
    from skewscope.sources.offline import parse_file
    an = analyze(parse_file(path))
    return [(f["kind"], (f.get("entities") or {}).get("ips", []), f["severity"], f.get("since"))
            for f in an["findings"]], an


#: an onset is right within this of the truth's (ns): the first slow step comes with the next
#: step / iteration after the model's since (rings of 12 ms iterations here)
ONSET_EARLY_NS, ONSET_LATE_NS = 2_000_000, 15_000_000


def onset_wrong(s: Sim, f, ip, offset_ns: int = 0) -> str | None:
    """Why the naming finding f's `since` is not the truth's onset of ip's slowness (the
    view's clock is offset_ns ahead), or None."""
    t0 = [t.get("since_ns") for t in s.truth if ip in t.get("slow", [])]
    if not t0 or t0[0] is None:
        return None
    if len(f) < 4 or f[3] is None:
        return f"onset of {ip} not reported (truth {t0[0]})"
    d = int(round(f[3] * 1e9)) - offset_ns - int(t0[0])
    if not -ONSET_EARLY_NS <= d <= ONSET_LATE_NS:
        return f"onset of {ip} off by {d / 1e6:.1f} ms"
    return None


def judge(s: Sim, fs, view_ip=None, offset_ns: int = 0) -> str | None:
    """None when right, else why not. offset_ns: the view's clock offset (onsets)."""
    loud = [f for f in fs if f[2] in ("warning", "critical")]
    slow = [ip for t in s.truth for ip in t.get("slow", [])]
    hot = [t["hot"] for t in s.truth if t.get("hot")]
    if view_ip is not None:
        wrong = [f for f in loud if f[0] in SLOW_KINDS and f[1][:1] and f[1][0] != view_ip]
        if wrong:
            return f"view of {view_ip} blames another node: {wrong}"
        mine = [f for f in loud if f[0] in SLOW_KINDS and f[1][:1] == [view_ip]]
        if view_ip in slow and not mine:
            return f"the slow node's own view says nothing: {loud}"
        if view_ip in slow:
            return onset_wrong(s, mine[0], view_ip, offset_ns)
        if not slow and not hot and loud:
            return f"healthy, but {loud}"
        return None
    why = []
    for ip in slow:
        mine = [f for f in loud if f[0] in SLOW_KINDS and f[1][:1] == [ip]]
        if not mine:
            why.append(f"slow {ip} not named: {loud}")
        elif onset_wrong(s, mine[0], ip):
            why.append(onset_wrong(s, mine[0], ip))
    for ip in hot:
        if not any(f[0] in HOT_KINDS and f[1][:1] == [ip] for f in loud):
            why.append(f"hot {ip} not named: {loud}")
    wrong = [f for f in loud if f[0] in SLOW_KINDS | HOT_KINDS and f[1][:1] and f[1][0] not in slow + hot]
    if wrong:
        why.append(f"blames healthy: {wrong}")
    if not slow and not hot and loud:
        why.append(f"healthy, but {loud}")
    return "; ".join(why) or None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--filter", default="")
    ap.add_argument("--seeds", default="1")
    ap.add_argument("--vantage", default="mirror")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    bad = total = 0
    with tempfile.TemporaryDirectory() as d:
        for name, build in cases(a.quick):
            if a.filter and a.filter not in name:
                continue
            for seed in (int(x) for x in a.seeds.split(",")):
                s = build(seed)
                for v in a.vantage.split(","):
                    # a ring of two: each DPU sees the whole job (judged as the mirror)
                    views = [None] if v == "mirror" or s.n == 2 else list(range(s.n))
                    for node in views:
                        p = os.path.join(d, "x.pcap")
                        off = 0 if node is None else int((node * 2_345_678 + seed * 1_000_003) % 9_000_000) - 4_500_000
                        s.write(p, view=node, clock_offset_ns=off)
                        try:
                            fs, _ = findings(p)
                            why = judge(s, fs, None if node is None else s.ip_str[node], off)
                        except Exception as e:   # a crash is a result too
                            why = f"crash: {type(e).__name__}: {e}"
                        total += 1
                        bad += why is not None
                        where = "mirror" if node is None else f"view {s.ip_str[node]}"
                        print(f"{'OK ' if why is None else 'BAD'} {name} seed{seed} {where}" + (f": {why}" if why else ""),
                              flush=True)
    print(f"{total - bad}/{total} right")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
