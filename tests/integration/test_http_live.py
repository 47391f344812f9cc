"""/v1/findings live: `skewscope export -i` on the observer end of a veth pair (XDP generic,
in its own namespace, listening on that namespace's loopback) while the generator sends the
`congestion` preset (CE marks and CNPs on the flows into one node) from the other end,
bounded in frames and time. The exporter's background analysis of the recent window must
show ecn_congestion blaming the node the generator congested (the common destination of the
truth's affected flows), and drop it once the traffic has stopped and left the window.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from skewscope import gen as skewgen
from skewscope.gen.send import send_capture

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

PORT = 9435     # inside the observer's own namespace: nothing else listens there


def get(pair, path):
    r = pair.run("b", "curl", "-s", "-m", "5", "-w", "\n%{http_code}", f"http://127.0.0.1:{PORT}{path}", check=False)
    body, _, code = r.stdout.rpartition("\n")
    return int(code or 0), body


def wait_for(fn, timeout, what, step=0.5):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = fn()
        if v:
            return v
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def findings(pair):
    code, body = get(pair, "/v1/findings")
    return json.loads(body) if code == 200 else None


def test_live_findings_show_the_injected_congestion(netns_pair, tmp_path):
    pair = netns_pair
    pair.set_mtu(9000)
    cap = skewgen.generate("congestion", seed=2)
    (pat,) = cap.truth["pathologies"]
    dsts = {f[1] for f in pat["entities"]["flows"]}
    assert len(dsts) == 1
    (into,) = dsts
    log = open(tmp_path / "export.log", "w")
    cmd = ["ip", "netns", "exec", pair.ns_b, sys.executable, "-m", "skewscope.cli", "export", "-i", pair.if_b,
           "--listen", f"127.0.0.1:{PORT}", "--xdp-mode", "generic", "--interval", "0.5",
           "--analysis-every", "2", "--analysis-window", "3", "--node", "ssh-live"]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def up():
            assert proc.poll() is None, (tmp_path / "export.log").read_text()[-2000:]
            return get(pair, "/metrics")[0] == 200
        wait_for(up, 180, "exporter /metrics")
        # the idle window first: analysed, nothing found
        idle = wait_for(lambda: findings(pair), 60, "the first live analysis")
        assert idle["source"] == "live" and idle["version"] == 1
        assert not [f for f in idle["findings"] if f["kind"] == "ecn_congestion"]
        runs0 = idle["analyses"]["runs"]

        st = send_capture(cap, pair.if_a, netns=pair.ns_a, rate_pps=6000, max_seconds=20)
        assert st["sent"] == len(cap)

        def congested():
            d = findings(pair)
            if d is None:
                return None
            fs = [f for f in d["findings"] if f["kind"] == "ecn_congestion"]
            return (d, fs[0]) if fs else None
        doc, f = wait_for(congested, 30, "ecn_congestion in /v1/findings")
        assert f["entities"]["ips"][0] == into
        assert f["severity"] in ("warning", "critical")
        assert f["id"].startswith("ecn_congestion:") and f["actions"]
        assert doc["analyses"]["runs"] > runs0
        assert 0 < doc["window"]["duration_s"] <= 3.5 and doc["window"]["clock"] == "monotonic"
        # the load endpoint answers from the same analysis
        code, body = get(pair, "/v1/load")
        assert code == 200 and json.loads(body)["analysed_at"] >= doc["analysed_at"] - 1e-6

        # the traffic stopped: once the window has moved past it, the finding is gone
        def cleared():
            d = findings(pair)
            return d is not None and d["analysed_at"] > doc["analysed_at"] + 3.5 and \
                not [x for x in d["findings"] if x["kind"] == "ecn_congestion"]
        wait_for(cleared, 40, "ecn_congestion to leave the window")
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
