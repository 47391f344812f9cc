"""`skewscope watch -i` live (root): a veth pair in two fresh namespaces (prefix swd-), watch
attached (XDP generic) to the observer end, the generator's MoE decode hot-expert frames sent
once (bounded, time-stretched, testbed.fabric.play) from the other end: the hot_destination
event opens naming the generator's hot node, then — after the traffic stops — resolves once
--hold has passed; SIGINT ends the watch with exit 0, a stats line last, and nothing left
attached."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from skewscope import gen as skewgen
from skewscope.outputs import events as E
from skewscope.testbed import fabric
from skewscope.testbed.netns import VethPair

ROOT = Path(__file__).resolve().parents[2]
HOLD, WINDOW = 3.0, 3.0

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (namespaces, veth, XDP attach)")


@pytest.fixture
def pair():
    p = VethPair.create("wl", prefix="swd", subnet="10.198.0")
    try:
        p.set_mtu(9000)                     # the generator's 4 KiB IB MTU frames
        yield p
    finally:
        p.destroy()


def test_live_event_opens_then_resolves(pair):
    cap = skewgen.generate("ep-decode-hot-expert", seed=0)
    hot = [p for p in cap.truth["pathologies"] if p["kind"] == "hot_destination"][0]["magnitude"]["hot"]
    nodes = len(cap.truth["pathologies"][0]["magnitude"]["members"])
    cmd = ["ip", "netns", "exec", pair.ns_b, sys.executable, "-m", "skewscope.cli", "watch", "-i", pair.if_b,
           "--xdp-mode", "generic", "--json", "--interval", "0.5", "--window", str(WINDOW), "--hold", str(HOLD),
           "--duration", "90"]
    w = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    lines: list[dict] = []
    attached = threading.Event()
    seen = threading.Event()
    sent = {"end": None}

    def read_out():
        for line in w.stdout:
            d = json.loads(line)                        # every line parses alone (NDJSON)
            lines.append(d)
            if d.get("event") == "resolved" and d["finding"]["kind"] == "hot_destination" \
                    and d["finding"]["entities"]["ips"][0] == hot and sent["end"] and d["time"] > sent["end"]:
                seen.set()

    def read_err():
        for line in w.stderr:
            err.append(line)
            if "Tracing RoCE" in line:
                attached.set()
    err: list[str] = []
    threads = [threading.Thread(target=f, daemon=True) for f in (read_out, read_err)]
    for t in threads:
        t.start()
    try:
        assert attached.wait(60), "".join(err)
        t_start = time.time()
        st = fabric.play([pair.ns_a] * nodes, pair.if_a, [cap], stretch=300.0, max_seconds=20, passes=1)
        t_end = sent["end"] = time.time()
        assert st["sent"] == len(cap)
        assert seen.wait(45), [(d.get("event"), d.get("id")) for d in lines]
        w.send_signal(signal.SIGINT)
        w.wait(timeout=30)
    finally:
        if w.poll() is None:
            w.kill()
            w.wait()
    for t in threads:
        t.join(5)
    assert w.returncode == 0, "".join(err)
    assert lines[-1]["schema"] == E.STATS_SCHEMA and lines[-1]["event"] == "stats"
    # the hot node's events (a loaded machine's replay can add others: not asserted on)
    hd = [d for d in lines[:-1] if d["finding"]["kind"] == "hot_destination"
          and d["finding"]["entities"]["ips"][0] == hot]
    assert hd[0]["event"] == "opened" and hd[0]["finding"]["entities"]["ips"][0] == hot
    assert t_start - 1 <= hd[0]["time"] <= t_end + WINDOW + 10
    assert {d["id"] for d in hd} == {hd[0]["id"]}        # one id for the one hot node
    # lifecycle per id: opened first, alternating open/closed, the last event resolved
    state = None
    for d in hd:
        assert (d["event"] == "opened") == (state in (None, "resolved")), [x["event"] for x in hd]
        state = d["event"]
    res = hd[-1]
    assert res["event"] == "resolved" and res["time"] > t_end and res["time"] - res["last_seen"] >= HOLD
    assert any("detached" in x for x in err)
    # nothing left attached on the observer's interface
    link = VethPair.link(pair.ns_b, pair.if_b)
    assert "xdp" not in link, link


def test_sigterm_detaches_and_exits_143(pair):
    cmd = ["ip", "netns", "exec", pair.ns_b, sys.executable, "-m", "skewscope.cli", "watch", "-i", pair.if_b,
           "--xdp-mode", "generic", "--json", "--duration", "60"]
    w = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        line = ""
        while "Tracing RoCE" not in line and time.monotonic() < deadline:
            line = w.stderr.readline()
            if not line and w.poll() is not None:
                break
        assert "Tracing RoCE" in line, w.stderr.read() if w.poll() is not None else line
        assert "xdp" in VethPair.link(pair.ns_b, pair.if_b)
        w.send_signal(signal.SIGTERM)
        out, err = w.communicate(timeout=30)
    finally:
        if w.poll() is None:
            w.kill()
            w.wait()
    assert w.returncode == 143, err
    assert json.loads(out.splitlines()[-1])["event"] == "stats"
    assert "detached" in err and "Traceback" not in err
    assert "xdp" not in VethPair.link(pair.ns_b, pair.if_b)
