"""`skewscope capture` end to end on the namespace fabric: the generator's frames leave the
GPU namespaces, cross the bridge, are mirrored to the DPU namespace, and the CLI captures
them there. With no sampling, the Snapshot's per-flow counters equal the generator's ground
truth exactly, and the --pcap-out file, read by tshark (an independent dissector), holds
every RoCE frame cut to 128 bytes with its original length."""
from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from skewscope import gen as skewgen
from skewscope.core import layout as L
from skewscope.core.netns import in_netns
from skewscope.core.snapshot import Snapshot, ip_str
from skewscope.sources import live
from skewscope.testbed.fabric import Fabric, play

SKEWSCOPE = str(Path(sys.executable).with_name("skewscope"))
RATE = 8000           # frames/s the fabric sends: far below what the path can carry, so no drop


@pytest.fixture(scope="module")
def fabric():
    fab = Fabric(nodes=8, prefix="ssu-")
    fab.build()
    try:
        yield fab
    finally:
        assert not fab.teardown()


def start_capture(fab, out: Path, duration: float, extra=()):
    p = subprocess.Popen(["ip", "netns", "exec", fab.obs_ns, SKEWSCOPE, "capture", "-i", fab.obs_if,
                          "--duration", f"{duration:.1f}", "-o", str(out / "run.snap"), "--pcap-out",
                          str(out / "run.pcap"), "--json", *extra],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    outl: list[str] = []
    attached = threading.Event()

    def pump():
        for ln in p.stderr:
            lines.append(ln)
            if ln.startswith("Capturing RoCE"):
                attached.set()
    threads = [threading.Thread(target=pump, daemon=True),
               threading.Thread(target=lambda: outl.extend(p.stdout), daemon=True)]
    for t in threads:
        t.start()

    def finish(timeout=60) -> str:
        p.wait(timeout=timeout)
        for t in threads:
            t.join(10)
        return "".join(outl)
    p.finish = finish
    assert attached.wait(60), f"capture did not attach: {''.join(lines)}"
    return p, lines


def truth_by_key(truth):
    return {(f["src"], f["dst"], f["dest_qp"]): f for f in truth["flows"]}


def flows_by_key(snap: Snapshot):
    out = {}
    for r in snap.flows:
        v = int(r["ipver"])
        out[(ip_str(r["src"], v), ip_str(r["dst"], v), int(r["dest_qp"]))] = r
    return out


def hist_pairs(row):
    return sorted([L.slot_lower_bound(i), int(c)] for i, c in enumerate(row) if c)


@pytest.mark.parametrize("preset,extra", [("loss", ()), ("congestion", ("--tc",))], ids=["loss-xdp", "congestion-tc"])
def test_capture_counts_equal_ground_truth_and_pcap_opens_in_tshark(fabric, tmp_path, preset, extra):
    cap = skewgen.generate(preset, seed=5)
    truth = cap.truth
    ts = cap.timestamps
    stretch = len(cap) / (RATE * (int(ts[-1] - ts[0]) / 1e9))
    play_s = int(ts[-1] - ts[0]) / 1e9 * stretch
    proc, err = start_capture(fabric, tmp_path, play_s + 3.0, extra)
    try:
        st = play(fabric.node_ns, fabric.node_if, [cap], stretch, max_seconds=play_s + 20, passes=1)
        assert st["sent"] == len(cap) and st["unknown_source"] == 0
        out = proc.finish()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, "".join(err)
    with in_netns(fabric.obs_ns):
        ours = live.list_ours(fabric.obs_if)
    assert ours["xdp"] is None and ours["tc"] == []

    snap = Snapshot.load(tmp_path / "run.snap")
    assert snap.meta["source"] == "capture" and snap.meta["interface"] == fabric.obs_if
    g = snap.globals
    assert int(g[L.G_ACCOUNTED]) == truth["roce_frames"], (st, "".join(err), snap.meta)
    assert int(g[L.G_FRAMES]) == truth["frames"]            # the mirror copies RoCE only
    got, want = flows_by_key(snap), truth_by_key(truth)
    assert set(got) == set(want)
    fields = [("packets", "packets"), ("bytes", "bytes"), ("payload_bytes", "payload_bytes"),
              ("messages", "messages"), ("ce", "ce_packets"), ("ecn_capable", "ecn_capable_packets"),
              ("cnp", "cnp_packets"), ("acks", "acks"), ("psn_gaps", "psn_gaps"),
              ("retransmissions", "retransmissions")]
    for k, t in want.items():
        r = got[k]
        for mine, theirs in fields:
            assert int(r[mine]) == t[theirs], (k, mine, int(r[mine]), t[theirs])
        assert int(r["nak_seq"] + r["nak_rnr"] + r["nak_other"]) == t["naks"], k
        assert hist_pairs(r["msg_hist"]) == sorted(t["msg_size_hist"]), k
    if preset == "loss":
        assert sum(int(r["retransmissions"]) for r in got.values()) > 0          # the pathology is there
    else:
        assert sum(int(r["cnp"]) for r in got.values()) > 0
    # the printed JSON is the same snapshot's report
    import json
    doc = json.loads(out)
    assert doc["totals"]["roce_packets"] == truth["roce_frames"]

    # --pcap-out, read by tshark: every frame, cut at 128 bytes, original length kept
    assert shutil.which("tshark"), "tshark is installed by make setup"
    tf = subprocess.run(["tshark", "-r", str(tmp_path / "run.pcap"), "-T", "fields", "-E", "separator=,",
                         "-e", "frame.len", "-e", "frame.cap_len", "-e", "ip.src", "-e", "ip.dst",
                         "-e", "infiniband.bth.destqp", "-e", "infiniband.bth.opcode"],
                        capture_output=True, text=True, timeout=120)
    assert tf.returncode == 0, tf.stderr
    rows = [ln.split(",") for ln in tf.stdout.splitlines() if ln]
    assert len(rows) == truth["frames"]
    assert all(int(r[1]) == min(128, int(r[0])) for r in rows)
    assert sum(int(r[0]) for r in rows) == sum(f["bytes"] for f in truth["flows"])
    per_flow = Counter((r[2], r[3], int(r[4], 0)) for r in rows)
    assert per_flow == Counter({k: t["packets"] for k, t in want.items()})
    ops = Counter(int(r[5]) for r in rows)
    assert ops[0x11] == sum(sum(c for n, c in t["opcodes"].items() if n == "ACKNOWLEDGE") for t in want.values())


def test_capture_ctrl_c_ends_early_and_still_saves(fabric, tmp_path):
    cap = skewgen.generate("moe-hot-expert", seed=2)
    proc, err = start_capture(fabric, tmp_path, 60.0)
    try:
        st = play(fabric.node_ns, fabric.node_if, [cap], 2000.0, max_seconds=3.0)
        time.sleep(0.5)
        proc.send_signal(2)                      # SIGINT, as Ctrl-C
        proc.finish()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, "".join(err)
    assert any("interrupted" in ln for ln in err)
    snap = Snapshot.load(tmp_path / "run.snap")
    assert snap.meta["interrupted"] is True
    assert int(snap.globals[L.G_ACCOUNTED]) == st["sent"] > 0
    assert (tmp_path / "run.pcap").exists()
    with in_netns(fabric.obs_ns):
        assert live.list_ours(fabric.obs_if)["xdp"] is None


def test_capture_sigterm_leaves_nothing(fabric, tmp_path):
    proc, err = start_capture(fabric, tmp_path, 60.0)
    try:
        time.sleep(0.5)
        proc.terminate()
        proc.finish()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + 15, "".join(err)
    assert "nothing written" in "".join(err)
    assert sorted(p.name for p in tmp_path.iterdir()) == []        # no .snap, no pcap, no temp files
    with in_netns(fabric.obs_ns):
        ours = live.list_ours(fabric.obs_if)
    assert ours["xdp"] is None and ours["tc"] == []

