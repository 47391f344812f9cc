#!/usr/bin/env python3
"""Sustained live rate: the highest packet rate at which skewscope's XDP program, attached
natively to a veth, still accounts every frame and loses no message record, next to the
same figure for a trivial XDP program (return XDP_PASS) measured in the same run; and the
kernel memory the maps take at 65,536 and 1,048,576 flows.

    sudo .venv/bin/python tools/bench/bench_live_rate.py [--frames 200000] [--rounds 3]

Set-up: two network namespaces (prefix `sslr-`) joined by a veth pair; RoCEv2 frames are
sent from one side by AF_PACKET + sendmmsg(2) in batches of 512 (testbed.traffic.blast: no
Python per packet), paced to a target rate; the program is attached natively (XDP_FLAGS_DRV_MODE)
to the other end, where veth runs it in its NAPI poll. The sender is pinned to one CPU, and
the NAPI poll runs in the softirq of each send on that CPU, so sender, veth and program
share it: what the program costs lowers the rate the sender reaches (the record reader, a
thread polling the rings as `skewscope top` does, runs on the other CPU). --threaded-napi runs
the receiving veth's NAPI in a kernel thread pinned to the other CPU instead; a frame the
thread does not take in time (its 256-frame ring full) is a veth drop, so on a CPU shared
with other load that mode measures scheduling latency more than the program. Two traffic mixes, 64 flows each:

  small   SEND_ONLY, 64-byte payload: every frame is a message (clock read, size histogram,
          one message record per frame: the worst case for the record rings)
  bulk    SEND_FIRST, 14 x SEND_MIDDLE, SEND_LAST: one record per 16 frames (the shape of
          RDMA bulk transfers; MIDDLE packets are the common case)

A rate "holds" for skewscope when, for one run of --frames frames at that rate: the veth
dropped nothing, `accounted` grew by exactly the frames sent, every flow's `packets` equals
what was sent to it, and the number of message records read equals the number of messages
sent with `events_lost` 0 (the default rings: 65,536 records per CPU, drained every 50 ms). For the
trivial program it holds when the veth dropped nothing (the program saw every frame). Rates
are tried upwards (geometric steps of 1.25 from --start-mpps), then --refine geometric
bisection steps between the last rate that held and the first that did not (3 steps: the
figure is within 1.25^(1/8) = 2.8% of the limit, not quantised to the ladder's steps); the
figure is the highest achieved rate (frames / seconds actually taken) of a run that held. Programs alternate at every step; each round repeats the ladder,
and the median over rounds is reported with the ratio skewscope / trivial per round (median
of ratios). The unpaced sender's own maximum is printed too: no rate above it can be tried.

Memory: the maps' `memlock` from /proc/self/fdinfo of each map fd (the kernel's own
accounting) for a loaded program at 65,536 flows, next to `Config.memory_bytes()` (from the
map definitions); at 1,048,576 flows the program is loaded only with --load-1m (it
preallocates ~1 GB), else the figure is the definition's.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

NFLOWS = 64
READER_CPUS: set = set()  # where the record reader runs (main: every CPU but the sender's)
BULK_LEN = 16
XDP_FLAGS_DRV_MODE = 1 << 2


def frames_for(fab, mix: str, n: int):
    """(frames, flow index, messages per flow) for `mix`; n rounded down to whole messages."""
    from skewscope.testbed.traffic import roce_frames
    per = max(BULK_LEN, n // NFLOWS // BULK_LEN * BULK_LEN)
    fr, flow = roce_frames(fab, NFLOWS, per, payload=64, order="round_robin")
    # destination MAC: not ns_b's, so after XDP_PASS the stack drops each frame at once as
    # PACKET_OTHERHOST (what a mirror port's traffic is to the host); only the programs differ
    fr[:, 0:6] = np.frombuffer(bytes.fromhex("02005c1a7e01"), dtype=np.uint8)
    if mix == "bulk":
        # opcode byte of the BTH (Ethernet 14 + IPv4 20 + UDP 8): FIRST, MIDDLE..., LAST per
        # message; PSNs already count up per flow
        psn = np.repeat(np.arange(per, dtype=np.int64), NFLOWS)
        pos = psn % BULK_LEN
        fr[:, 42] = np.where(pos == 0, 0x00, np.where(pos == BULK_LEN - 1, 0x02, 0x01)).astype(np.uint8)
        msgs = per // BULK_LEN
    else:
        msgs = per
    return fr, flow, msgs


def run_once(fab, frames, flow, pps: float, att_state: dict) -> dict:
    """Send `frames` at `pps` with a program attached (att_state["dp"]: skewscope's)."""
    from skewscope.core import layout as L
    from skewscope.testbed.traffic import blast, link_drops
    dp = att_state.get("dp")
    if dp is not None:
        dp.reset()
        dp.read_new_records()
        dp.events_lost = 0
    d0 = link_drops(fab)
    recs = [0]
    stop = threading.Event()

    def drain():  # what `skewscope top`/`capture` do: poll the rings several times a second
        if READER_CPUS:  # a reader is its own process on any CPU: not on the sender's
            os.sched_setaffinity(0, READER_CPUS)
        while not stop.is_set():
            recs[0] += len(dp.read_new_records())
            stop.wait(0.05)

    th = None
    if dp is not None:
        th = threading.Thread(target=drain, daemon=True)
        th.start()
    sent, secs = blast(fab.ns_a, fab.if_a, frames, timeout_s=30.0, pps=pps)
    time.sleep(0.15)
    drops = link_drops(fab) - d0
    out = {"sent": int(sent), "seconds": secs, "pps": sent / secs if secs else 0.0, "drops": int(drops)}
    if dp is not None:
        stop.set()
        th.join(5)
        recs[0] += len(dp.read_new_records())
        g = dp.read_globals()
        f = dp.read_flows()
        sent_per = np.bincount(flow[:sent], minlength=NFLOWS)
        got = np.zeros(NFLOWS, dtype=np.int64)
        qp = f["dest_qp"].astype(np.int64) - 0x100
        ok = (qp >= 0) & (qp < NFLOWS)
        got[qp[ok]] = f["packets"][ok]
        op = frames[:sent, 42]
        want_msgs = int(((op == 0x02) | (op == 0x04)).sum())  # SEND_LAST / SEND_ONLY end a message
        out.update(accounted=int(g[L.G_ACCOUNTED]), flows_exact=int((got == sent_per).sum()),
                   records=recs[0], events_lost=int(dp.events_lost), want_records=want_msgs)
        out["held"] = (drops == 0 and sent == len(frames) and out["accounted"] == sent
                       and out["flows_exact"] == NFLOWS and out["events_lost"] == 0
                       and recs[0] == want_msgs)
    else:
        out["held"] = drops == 0 and sent == len(frames)
    return out


class Programs:
    """Both programs loaded once (skewscope's live build, the trivial one); attach() puts
    one of them natively on if_b for a run."""

    def __init__(self, fab, flow_cache: int, napi_cpu: int | None):
        from bcc import BPF  # optional (python3-bpfcc): only for the trivial reference program

        from skewscope.bpf.loader import Config, Dataplane
        self.fab = fab
        self.napi_cpu = napi_cpu
        self.dp = Dataplane(Config(flow_cache=flow_cache))  # the defaults of top/capture
        self.dp.prog_fd("xdp")
        self.tb = BPF(text="int sslr_trivial(struct xdp_md *ctx) { return XDP_PASS; }")
        self.tfn = self.tb.load_func("sslr_trivial", BPF.XDP)

    def _napi_thread(self) -> None:
        """Threaded NAPI for the receiving veth (it has NAPI once an XDP program is attached),
        its thread pinned to napi_cpu: the program runs on another CPU than the sender."""
        if self.napi_cpu is None:
            return
        f = f"/sys/class/net/{self.fab.if_b}/threaded"
        self.fab.run("b", "sh", "-c", f"echo 1 > {f}")
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    comm = (d / "comm").read_text().strip()
                except OSError:
                    continue
                if comm.startswith(f"napi/{self.fab.if_b}"[:15]):
                    os.sched_setaffinity(int(d.name), {self.napi_cpu})

    def close(self):
        self.dp.close()
        self.tb.cleanup()

    @contextlib.contextmanager
    def attach(self, prog: str):
        from skewscope.bpf.attach import Attachment
        from skewscope.core.netns import in_netns
        if prog == "trivial":
            with in_netns(self.fab.ns_b):
                self.tb.attach_xdp(self.fab.if_b, self.tfn, XDP_FLAGS_DRV_MODE)
            self._napi_thread()
            try:
                yield {}
            finally:
                with in_netns(self.fab.ns_b):
                    self.tb.remove_xdp(self.fab.if_b, XDP_FLAGS_DRV_MODE)
            return
        with in_netns(self.fab.ns_b):
            att = Attachment(self.dp, self.fab.if_b, mode="xdp", xdp_mode="native").attach()
        self._napi_thread()
        try:
            yield {"dp": self.dp}
        finally:
            with in_netns(self.fab.ns_b):
                att.detach()


def ladder(start: float, stop: float, step: float = 1.25) -> list:
    out, r = [], start
    while r <= stop * 1.3:
        out.append(r)
        r *= step
    return out


def memory(load_1m: bool) -> list:
    """[(max_flows, measured bytes or None, defined bytes dict)]"""
    from skewscope.bpf.loader import Config, Dataplane
    from skewscope.testbed.traffic import map_memlock
    rows = []
    for n in (65536, 1 << 20):
        cfg = Config(max_flows=n)
        measured = None
        if n <= 65536 or load_1m:
            dp = Dataplane(Config(max_flows=n))
            try:
                dp.prog_fd("xdp")
                measured = {name: map_memlock(dp._fd(name)) for name in
                            ("flows", "msg_events", "fcache", "globals", "op_table", "zero_stats", "ev_head")}
            finally:
                dp.close()
        rows.append((n, measured, cfg.memory_bytes()))
    return rows


def run_all(a, fab, progs, mixes, results, sender_max, runs) -> None:
    from skewscope.testbed.traffic import blast
    for mix in mixes:
        frames, flow, msgs = frames_for(fab, mix, a.frames)
        sent, secs = blast(fab.ns_a, fab.if_a, frames, timeout_s=30.0)  # nothing attached
        sender_max[mix] = sent / secs / 1e6
        for rnd in range(a.rounds):
            best = {"trivial": 0.0, "skewscope": 0.0}
            alive = {"trivial": True, "skewscope": True}
            lo = {"trivial": 0.0, "skewscope": 0.0}  # highest target held / lowest that failed
            hi: dict = {}

            def attempt(prog, r):
                with progs.attach(prog) as st:
                    res = run_once(fab, frames, flow, r * 1e6, st)
                runs.append((mix, prog, r, res))
                if res["held"]:
                    best[prog] = max(best[prog], res["pps"] / 1e6)
                    lo[prog] = max(lo[prog], r)
                else:
                    hi[prog] = min(hi.get(prog, r), r)
                return res["held"]

            for r in ladder(min(a.start_mpps, sender_max[mix] / 4), sender_max[mix]):
                for prog in ("trivial", "skewscope"):
                    if alive[prog]:
                        alive[prog] = attempt(prog, r)
                if not any(alive.values()):
                    break
            # the ladder's 1.25 steps would quantise the ratio to powers of 0.8: bisect
            # (geometrically) between the last target held and the first that failed
            for _ in range(a.refine):
                for prog in ("trivial", "skewscope"):
                    if prog in hi and lo[prog] > 0:
                        attempt(prog, (lo[prog] * hi[prog]) ** 0.5)
            for prog in best:
                results.setdefault((mix, prog), []).append(best[prog])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--frames", type=int, default=200_000, help="frames per run (bounded)")
    ap.add_argument("--rounds", type=int, default=3, help="ladder repetitions; medians reported")
    ap.add_argument("--start-mpps", type=float, default=0.2, help="lowest rate tried (Mpps)")
    ap.add_argument("--refine", type=int, default=3,
                    help="bisection steps between the last rate held and the first that failed (3: within 3%%)")
    ap.add_argument("--mix", choices=("small", "bulk", "both"), default="both")
    ap.add_argument("--flow-cache", type=int, default=256, help="skewscope flow-cache slots per CPU (0 = off)")
    ap.add_argument("--threaded-napi", action="store_true",
                    help="run the receiving veth's NAPI (where XDP runs) in a thread pinned to another CPU "
                         "than the sender (default: in the sender's softirq, on its CPU)")
    ap.add_argument("--load-1m", action="store_true", help="also load a 1,048,576-flow program (~1 GB)")
    a = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_live_rate: needs root (namespaces, XDP attach)", file=sys.stderr)
        return 4
    from skewscope.testbed.netns import VethPair

    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[-1]})  # the sender on one CPU
    READER_CPUS.update(cpus[:-1])         # the record reader on the others
    # --threaded-napi: the program on another one
    napi_cpu = cpus[0] if len(cpus) > 1 and a.threaded_napi else None
    mixes = ("small", "bulk") if a.mix == "both" else (a.mix,)
    results: dict = {}
    sender_max: dict = {}
    runs: list = []
    with VethPair.create("lr", prefix="sslr", subnet="10.197.0", static_neighbours=True) as fab:
        progs = Programs(fab, a.flow_cache, napi_cpu)
        try:
            run_all(a, fab, progs, mixes, results, sender_max, runs)
        finally:
            progs.close()
    mem = memory(a.load_1m)


    print(f"skewscope sustained live rate: native XDP on veth, AF_PACKET sendmmsg sender, "
          f"{a.frames:,} frames per run, {NFLOWS} flows, median of {a.rounds} rounds")
    where = ("sender and veth NAPI on one CPU" if napi_cpu is None
             else f"sender on CPU {cpus[-1]}, threaded veth NAPI (the XDP program) on CPU {napi_cpu}")
    print(f"kernel {platform.release()}, {os.cpu_count()} CPUs ({where}); "
          f"flow cache {a.flow_cache} slots/CPU")
    print()
    hdr = f"{'mix':<7}{'sender max':>12}{'trivial':>11}{'skewscope':>11}{'ratio':>8}   per-round ratios"
    print(hdr)
    print("-" * len(hdr))
    for mix in mixes:
        t, s = results[(mix, "trivial")], results[(mix, "skewscope")]
        ratios = [x / y if y else 0.0 for x, y in zip(s, t)]
        print(f"{mix:<7}{sender_max[mix]:>7.2f} Mpps{statistics.median(t):>6.2f} Mpps"
              f"{statistics.median(s):>6.2f} Mpps{statistics.median(ratios):>7.2f}x   "
              + " ".join(f"{x:.2f}" for x in ratios))
    print("(rate = the highest achieved rate at which every frame was accounted and no record lost;"
          " trivial: no veth drop)")
    for mix in mixes:
        if statistics.median(results[(mix, "skewscope")]) >= 0.9 * sender_max[mix]:
            print(f"{mix}: skewscope held up to the sender's own maximum: the sender is the limit here, "
                  f"the program's is higher")
    fails = [(mix, r, res) for mix, prog, r, res in runs if prog == "skewscope" and not res["held"]]
    if fails:
        mix, r, res = fails[-1]
        print(f"first failure seen ({mix}, {r:.2f} Mpps target): {res}")
    print()
    print("map memory (kernel memlock from fdinfo; definition = Config.memory_bytes()):")
    for n, measured, d in mem:
        got = f"{sum(measured.values()) / 2**20:8.1f} MiB measured" if measured else f"{'-':>8} (not loaded)"
        print(f"  {n:>9,} flows: {got}; defined: flows {d['flows'] / 2**20:.1f} MiB + records "
              f"{d['events'] / 2**20:.1f} MiB + flow cache {d['flow_cache'] / 2**20:.2f} MiB = "
              f"{d['total'] / 2**20:.1f} MiB")
        if measured:
            print("             " + ", ".join(f"{k} {v / 2**20:.2f}" for k, v in measured.items()) + " MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
