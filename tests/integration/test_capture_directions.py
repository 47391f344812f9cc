"""capture with TC sees the direction(s) asked for -- in the snapshot and in --pcap-out alike:
frames arriving on the interface are ingress, frames it sends are egress."""
from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from skewscope import gen as skewgen
from skewscope.core import layout as L
from skewscope.core.snapshot import Snapshot

SKEWSCOPE = str(Path(sys.executable).with_name("skewscope"))


@pytest.fixture(scope="module")
def frames():
    cap = skewgen.generate("loss", seed=9)
    fr = [f for _, f in cap.frames_iter()]
    return fr[:400], fr[400:700]            # two disjoint sets: one sent in, one sent out


@pytest.mark.parametrize("direction,want_in,want_out", [("ingress", True, False), ("egress", False, True),
                                                       ("both", True, True)])
def test_tc_direction_in_snapshot_and_pcap(netns_pair, tmp_path, frames, direction, want_in, want_out):
    p = netns_pair
    p.set_mtu(9000)
    inbound, outbound = frames
    proc = subprocess.Popen(["ip", "netns", "exec", p.ns_b, SKEWSCOPE, "capture", "-i", p.if_b, "--tc",
                             "--direction", direction, "-d", "6", "-o", str(tmp_path / "d.snap"), "--pcap-out",
                             str(tmp_path / "d.pcap"), "-q"], stderr=subprocess.PIPE, text=True)
    attached = threading.Event()
    err = []

    def pump():
        for ln in proc.stderr:
            err.append(ln)
            if ln.startswith("Capturing RoCE"):
                attached.set()
    threading.Thread(target=pump, daemon=True).start()
    try:
        assert attached.wait(60), "".join(err)
        time.sleep(0.3)
        assert p.send("a", inbound) == len(inbound)        # arrive on if_b: ingress
        assert p.send("b", outbound) == len(outbound)      # leave through if_b: egress
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, "".join(err)
    want = len(inbound) * want_in + len(outbound) * want_out
    snap = Snapshot.load(tmp_path / "d.snap")
    assert int(snap.globals[L.G_ACCOUNTED]) == want
    n = subprocess.run(["tshark", "-r", str(tmp_path / "d.pcap"), "-T", "fields", "-e", "frame.number"],
                       capture_output=True, text=True, timeout=60).stdout.split()
    assert len(n) == want
