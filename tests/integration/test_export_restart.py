"""Upgrade and restart safety (issue 29, deliverable 4): a live exporter SIGKILLed under traffic
and restarted, scraped by a real Prometheus all along.

* bpf_link attach (the default): the kill takes the program with it (the interface has no XDP
  program between the kill and the restart), the restart attaches afresh;
* netlink attach (SKEWSCOPE_ATTACH=netlink, older kernels): the kill leaves a stale program;
  the restart with --force-detach (what the systemd unit runs) removes it and attaches;
* in both, Prometheus sees the counters restart from zero as a counter reset: `resets()`
  counts it, `rate()` is never negative across it, and the counters grow again after it.

Traffic: the generator's ring-healthy frames sent from node 0's namespace into the fabric
(bounded in frames and time); the exporter is node 0's DPU (per-node fabric, both directions
of its port mirrored)."""
from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time

import pytest
from promharness import Prom, wait_until

from skewscope.testbed.fabric import Fabric

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("prometheus") is None,
                                 reason="Debian package prometheus missing (make setup installs it)"),
              pytest.mark.timeout(600)]

PORT = 9435


def xdp_attached(fab: Fabric) -> bool:
    out = subprocess.run(["ip", "-n", fab.dpu_ns[0], "-j", "link", "show", "dev", fab.obs_if], capture_output=True,
                         text=True).stdout
    return bool((json.loads(out or "[{}]")[0]).get("xdp"))


def start_exporter(fab: Fabric, log, env_attach: str | None) -> subprocess.Popen:
    env = ["env", f"SKEWSCOPE_ATTACH={env_attach}"] if env_attach else []
    cmd = ["ip", "netns", "exec", fab.dpu_ns[0], *env, sys.executable, "-m", "skewscope.cli", "export", "-i",
           fab.obs_if, "--listen", f"{fab.dpu_addr(0)}:{PORT}", "--node", "dpu0", "--node-ip", fab.node_ip(0),
           "--interval", "0.25", "--xdp-mode", "generic", "--force-detach", "--no-analysis"]
    return fab.spawn(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def traffic(fab: Fabric, seconds: float) -> subprocess.Popen:
    return fab.spawn([sys.executable, "-m", "skewscope.cli", "gen", "ring-healthy", "--send", fab.node_if, "--netns",
                      fab.node_ns[0], "--rate", "3000", "--max-seconds", f"{seconds:g}", "--max-frames", "200000"],
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest.mark.parametrize("attach", [None, "netlink"], ids=["bpf_link", "netlink"])
def test_sigkill_and_restart_under_traffic(tmp_path, attach):
    fab = Fabric(nodes=2, prefix="ssu-", per_node_dpu=True, mtu=9000)
    prom = None
    try:
        fab.build()
        log = open(tmp_path / "export.log", "w")
        exp = start_exporter(fab, log, attach)
        prom = Prom(tmp_path, [f"{fab.dpu_addr(0)}:{PORT}"], scrape_s=0.5)
        prom.start()
        q_acc = 'skewscope_frames_total{node="dpu0",category="accounted"}'
        wait_until(lambda: prom.query(q_acc), 90, "the exporter scraped")
        traffic(fab, 40)
        wait_until(lambda: float(prom.query(q_acc)[0]["value"][1]) > 500, 60, "traffic counted")
        time.sleep(2)
        exp.send_signal(signal.SIGKILL)
        exp.wait(10)
        # bpf_link: the program went with the process; netlink: it stayed (stale)
        assert xdp_attached(fab) == (attach == "netlink")
        time.sleep(2)                                   # a scrape or more fails: the target is down
        exp2 = start_exporter(fab, log, attach)
        wait_until(lambda: float(prom.query(q_acc)[0]["value"][1]) > 200 and
                   prom.query(f"resets({q_acc}[5m])")[0]["value"][1] != "0", 90, "counted again after the restart")
        time.sleep(3)
        assert xdp_attached(fab)                        # one program: the new one
        resets = float(prom.query(f"resets({q_acc}[5m])")[0]["value"][1])
        assert resets >= 1
        # rate() over every 2 s window of the run, each peer pair: never negative
        rates = prom.query('min_over_time(rate(skewscope_peer_bytes_total{node="dpu0"}[2s])[5m:500ms])')
        assert rates and all(float(r["value"][1]) >= 0 for r in rates), rates
        frames = prom.query(f"increase({q_acc}[5m])")
        assert float(frames[0]["value"][1]) > 0
        exp2.send_signal(signal.SIGTERM)
        assert exp2.wait(30) in (0, 143)                # a serving export ends cleanly on SIGTERM
        assert not xdp_attached(fab)                    # SIGTERM detaches, whatever the attach
        log.close()
        if attach == "netlink":
            assert "removed stale" in (tmp_path / "export.log").read_text()
    finally:
        if prom is not None:
            prom.stop()
        fab.teardown()
