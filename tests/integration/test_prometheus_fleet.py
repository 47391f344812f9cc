"""Fleet path end to end: three DPUs (network namespaces, each with a veth whose far end the
generator sends into) run `skewscope export -i <veth>` live; a real Prometheus (Debian's
/usr/bin/prometheus, started here on 127.0.0.1 with a temporary config, data directory
and the shipped rule files) scrapes them; `skewscope cluster` against that Prometheus must
name the hot expert and the slow ring link (seen from both ends' DPUs) -- the entities come
from the generator's ground truth, not from skewscope.

Fabric: 6 GPU nodes 10.0.0.1-6 running a ring all-reduce (node 2 straggles at 0.4x) and an
all-to-all with a hot expert on node 5. DPU k observes nodes {2k, 2k+1}: it is sent every
frame from or to those nodes (a frame between two DPUs' nodes is seen by both), time-
stretched (fabric.play) so relative timing survives. Traffic goes in two rounds: round 1
(the first part of the capture, in which every flow has started) creates every series;
round 2 is what rate()/increase() measure (Prometheus ignores a counter's first sample).

Everything made here is named ssp-* and removed in finally blocks.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from promharness import Prom, free_port, http_json, wait_until

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root: network namespaces, veth, XDP attach"),
              pytest.mark.skipif(shutil.which("prometheus") is None, reason="Debian package prometheus missing "
                                                                            "(make setup installs it)"),
              pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = {
    "name": "fleet-test", "nodes": 6, "iterations": 3, "period_ms": 4.0,
    "workloads": [{"kind": "ring_allreduce", "bytes": "3MiB", "channels": 1},
                  {"kind": "all_to_all", "bytes_per_peer": "128KiB", "channels": 1, "combine": True}],
    "pathologies": [{"kind": "straggler", "node": 1, "rate_factor": 0.4},
                    {"kind": "hot_expert", "node": 4, "factor": 4.0}],
}
GROUPS = ([0, 1], [2, 3], [4, 5])       # GPU nodes observed by DPU 0, 1, 2
FPS_PER_DPU = 3000                       # sets the time stretch
SCRAPE = 0.5


def sh(*args, check=True, timeout=30):
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=check)


# ---- the DPUs ------------------------------------------------------------------------------
class Dpu:
    """Namespace ssp-f<tag>-dK: veth vK-a (traffic in) -- vK-b (watched); a management veth
    to the root namespace (10.254.K.1 here, 10.254.K.2 in the namespace) for the scrape."""

    def __init__(self, k: int, tag: str):
        self.k = k
        self.ns = f"ssp-f{tag}-d{k}"
        self.tx, self.rx = f"ssp{tag}t{k}", f"ssp{tag}r{k}"
        self.mr, self.mn = f"ssp{tag}m{k}", f"ssp{tag}n{k}"
        self.addr = f"10.254.{200 + k}.2"
        self.proc: subprocess.Popen | None = None
        self.log = None

    def build(self):
        sh("ip", "netns", "add", self.ns)
        sh("ip", "netns", "exec", self.ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1")
        sh("ip", "link", "add", self.tx, "netns", self.ns, "type", "veth", "peer", "name", self.rx, "netns", self.ns)
        for v in (self.tx, self.rx):
            sh("ip", "-n", self.ns, "link", "set", v, "mtu", "9000")
            sh("ip", "-n", self.ns, "link", "set", v, "up")
        sh("ip", "link", "add", self.mr, "type", "veth", "peer", "name", self.mn, "netns", self.ns)
        sh("ip", "addr", "add", f"10.254.{200 + self.k}.1/30", "dev", self.mr)
        sh("ip", "link", "set", self.mr, "up")
        sh("ip", "-n", self.ns, "addr", "add", f"{self.addr}/30", "dev", self.mn)
        sh("ip", "-n", self.ns, "link", "set", self.mn, "up")
        sh("ip", "-n", self.ns, "link", "set", "lo", "up")

    def start_exporter(self, logdir: str, extra=()):
        self.log = open(os.path.join(logdir, f"export{self.k}.log"), "w")
        cmd = ["ip", "netns", "exec", self.ns, sys.executable, "-m", "skewscope.cli", "export", "-i", self.rx,
               "--listen", f"{self.addr}:9435", "--node", f"dpu{self.k}", "--interval", "0.25",
               "--xdp-mode", "generic", *extra]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def metrics_ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"exporter dpu{self.k} exited {self.proc.returncode}: "
                                 f"{Path(self.log.name).read_text()[-2000:]}")
        with urllib.request.urlopen(f"http://{self.addr}:9435/metrics", timeout=2) as r:
            return b"skewscope_exporter_info" in r.read()

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        if self.log:
            self.log.close()

    def teardown(self):
        self.stop()
        sh("ip", "link", "del", self.mr, check=False)
        sh("ip", "netns", "del", self.ns, check=False)


# ---- traffic ----------------------------------------------------------------------------------
def split_capture(cap):
    """Per DPU: (round-1 capture, round-2 capture) of the frames it observes."""
    from skewscope.gen import Capture
    from skewscope.gen.model import take_pkts
    job = cap.job
    ps, pd = np.asarray(job.p_src), np.asarray(job.p_dst)
    path = cap.pkts["path"]
    ts = cap.timestamps
    # round 1 ends after every flow has started (and after 30 % of the capture, so each
    # flow's traffic class is settled)
    first = {}
    for i, p in enumerate(path[: len(path)]):
        if p not in first:
            first[p] = ts[i]
    cut = max(max(first.values()) + 1, int(ts[0] + 0.3 * (ts[-1] - ts[0])))
    out = []
    for g in GROUPS:
        seen = np.isin(ps[path], g) | np.isin(pd[path], g)
        r1 = np.nonzero(seen & (ts <= cut))[0]
        r2 = np.nonzero(seen & (ts > cut))[0]
        out.append((Capture(job, take_pkts(cap.pkts, r1)), Capture(job, take_pkts(cap.pkts, r2))))
    return out


def play_all(dpus, caps, stretch):
    from skewscope.testbed.fabric import play
    errs = []

    def one(d, c):
        try:
            st = play([d.ns] * SCENARIO["nodes"], d.tx, [c], stretch, max_seconds=60, passes=1)
            assert st["unknown_source"] == 0 and st["sent"] == len(c), st
        except BaseException as e:  # noqa: BLE001
            errs.append(e)

    th = [threading.Thread(target=one, args=(d, c)) for d, c in zip(dpus, caps)]
    for t in th:
        t.start()
    for t in th:
        t.join(timeout=120)
    assert not errs, errs


def cluster(prom_url, *args):
    r = subprocess.run([sys.executable, "-m", "skewscope.cli", "cluster", "--prometheus", prom_url, "--json", *args],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def findings_of(doc, kind):
    return [f for f in doc["findings"] if f["kind"] == kind]


@pytest.fixture(scope="module")
def fleet():
    from skewscope import gen as skewgen
    cap = skewgen.generate(SCENARIO, seed=3)
    truth = cap.truth
    pat = {p["kind"]: p for p in truth["pathologies"]}
    hot = pat["hot_expert"]["entities"]["ips"][0]
    slow = pat["straggler"]["entities"]["ips"][0]
    ring = next(g for g in truth["groups"] if g["kind"] == "ring_allreduce")["members"]
    slow_link = (slow, ring[(ring.index(slow) + 1) % len(ring)])
    rounds = split_capture(cap)
    span = max(float(c.timestamps[-1] - c.timestamps[0]) for pair in rounds for c in pair) / 1e9
    stretch = max(len(c) for pair in rounds for c in pair) / (FPS_PER_DPU * span)
    tag = f"{os.getpid() % 10000}"
    dpus = [Dpu(k, tag) for k in range(len(GROUPS))]
    work = tempfile.mkdtemp(prefix="ssp-prom-")
    prom = Prom(Path(work), [f"{d.addr}:9435" for d in dpus], scrape_s=SCRAPE)
    try:
        for d in dpus:
            d.build()
        for d in dpus:
            d.start_exporter(work)
        prom.start()
        for d in dpus:
            wait_until(d.metrics_ready, 120, f"exporter dpu{d.k} /metrics")
        wait_until(lambda: len(prom.query('up{job="skewscope"} == 1')) == 3, 30, "3 targets up")
        play_all(dpus, [r[0] for r in rounds], stretch)
        time.sleep(4 * SCRAPE + 0.5)      # every series scraped at its round-1 value
        play_all(dpus, [r[1] for r in rounds], stretch)
        time.sleep(0.5 + 4 * SCRAPE)      # exporters read, Prometheus scraped the final values
        wait_until(lambda: prom.query("count(src_dst_class:skewscope_peer_bytes:rate5m)"), 30, "recording rules")
        time.sleep(2.5)                   # rule groups evaluated on the final samples
        yield {"prom": prom, "dpus": dpus, "hot": hot, "slow_link": slow_link, "truth": truth, "cap": cap,
               "rounds": rounds}
    finally:
        for d in dpus:
            try:
                d.teardown()
            except Exception:  # noqa: BLE001 -- keep tearing down the rest
                pass
        prom.stop()
        shutil.rmtree(work, ignore_errors=True)


def _check_doc(doc, fleet, dpu_names):
    if os.environ.get("SSP_DUMP"):
        Path(os.environ["SSP_DUMP"]).write_text(json.dumps(doc, indent=1))
    hot = findings_of(doc, "hot_destination")
    assert hot and hot[0]["entities"]["ips"][0] == fleet["hot"], json.dumps(doc["findings"], indent=1)
    st = findings_of(doc, "ring_straggler")
    assert st, json.dumps(doc["findings"], indent=1)
    assert tuple(st[0]["entities"]["ips"]) == fleet["slow_link"], st
    assert st[0]["entities"]["flows"] == [[*fleet["slow_link"], None]], st
    # same JSON shape as report --json
    for key in ("source", "meta", "totals", "pfc", "flows", "collectives", "timing", "findings", "incidents"):
        assert key in doc
    assert doc["timing"] is None
    assert set(st[0]) == {"kind", "severity", "entities", "evidence", "message", "group", "impact", "since", "until",
                          "incident"}
    # the fleet's findings are grouped too: the straggler leads an incident of its own (analysis.incidents)
    assert st[0]["incident"] in {x["id"] for x in doc["incidents"]}
    assert set(st[0]["entities"]) == {"ips", "qps", "flows"}
    assert sorted(doc["meta"]["dpus"]) == dpu_names
    kinds = {c["kind"] for c in doc["collectives"]}
    assert {"ring_allreduce", "all_to_all"} <= kinds
    return st[0]


def test_cluster_finds_hot_expert_and_slow_ring_link_raw(fleet):
    """--window 1m --no-rules: increase() over the raw per-DPU counters."""
    doc = cluster(fleet["prom"].url, "--window", "1m", "--no-rules")
    assert doc["meta"]["via_recording_rules"] is False
    st = _check_doc(doc, fleet, ["dpu0", "dpu1", "dpu2"])
    # the slow link is seen from both ends: its sender's DPU and its receiver's DPU
    a, b = fleet["slow_link"]
    owner = {f"10.0.0.{n + 1}": f"dpu{k}" for k, g in enumerate(GROUPS) for n in g}
    seen = {o["node"]: o for o in st["evidence"]["seen_by"]}
    assert set(seen) == {owner[a], owner[b]}, seen
    med = st["evidence"]["median_rate_bps"]
    for o in seen.values():
        assert o["rate_bps"] is not None and o["rate_bps"] < 0.8 * med, (o, med)


def test_cluster_via_recording_rules(fleet):
    """--window 5m with the shipped recording rules loaded: reads src_dst_class:*:rate5m."""
    doc = cluster(fleet["prom"].url, "--window", "5m")
    assert doc["meta"]["via_recording_rules"] is True
    _check_doc(doc, fleet, ["dpu0", "dpu1", "dpu2"])
    # the rules' fleet series agree: the hot destination and the slow link
    p = fleet["prom"]
    top = max(p.query("dst:skewscope_alltoall_preference:ratio5m"), key=lambda r: float(r["value"][1]))
    assert top["metric"]["dst"] == fleet["hot"] and float(top["value"][1]) > 1.5
    low = min(p.query("src_dst:skewscope_link_rate_vs_median:ratio5m"), key=lambda r: float(r["value"][1]))
    assert (low["metric"]["src"], low["metric"]["dst"]) == fleet["slow_link"] and float(low["value"][1]) < 0.8


def test_exporter_counts_every_frame_it_was_sent(fleet):
    """Live exporter totals vs what the generator sent into each DPU (ground truth: the
    frames of the two rounds): RoCE packets and wire bytes per DPU, both exact."""
    p = fleet["prom"]
    for d, (r1, r2) in zip(fleet["dpus"], fleet["rounds"]):
        pk = p.query(f'sum(skewscope_peer_packets_total{{node="dpu{d.k}"}})')
        by = p.query(f'sum(skewscope_peer_bytes_total{{node="dpu{d.k}"}})')
        want_pk = len(r1) + len(r2)
        want_by = int(r1.frame_lengths().sum()) + int(r2.frame_lengths().sum())
        assert int(float(pk[0]["value"][1])) == want_pk
        assert int(float(by[0]["value"][1])) == want_by


def test_cluster_errors_are_one_line():
    r = subprocess.run([sys.executable, "-m", "skewscope.cli", "cluster", "--prometheus",
                        f"http://127.0.0.1:{free_port()}"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 3 and r.stderr.count("\n") == 1 and "cannot reach Prometheus" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
