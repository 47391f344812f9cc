"""GPU causes from a real Prometheus (issue 27, deliverables 2 and 4): Debian's prometheus
over a TSDB backfilled (`promtool tsdb create-blocks-from openmetrics`, promharness.Backfilled)
with DCGM series written in dcgm-exporter's names and labels (tests/scenarios/dcgmlib.py)
for the hosts of generated captures, every 5 s around each capture's time range (pcap time
is unix time). Who is slow comes from the generator's truth file, never from skewscope.

One Prometheus holds several worlds, told apart by host names (one inventory each):
  a*  tp-decode-slow-shard: the slow shard's GPU throttled (HW thermal) from T0 - 20 s
  b*  the same capture: a healthy member's GPU throttled instead
  c*  the same capture: no series at all for the slow shard's host
  d*  the same capture: series only an hour before the capture (none in the window)
  r*  ring-straggler: the straggler's GPU throttled
`skewscope diagnose/report --json --inventory INV --dcgm http://127.0.0.1:PORT` must name the
throttled GPU with its clock against the group median and the reason's first sample time,
say the GPU looks normal, say there is no data -- and keep every finding otherwise
identical to the run without --dcgm.
"""
from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import dcgmlib
import pytest
from promharness import Backfilled

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("prometheus") is None or shutil.which("promtool") is None,
                                 reason="Debian package prometheus (prometheus, promtool) missing "
                                        "(make setup installs it)"),
              pytest.mark.timeout(600)]

STEP = 5
THROTTLE_LEAD = 20       # s before the capture's first packet the throttle starts


def sh(*args, timeout=300):
    p = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def hms(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%H:%M:%S")


def generate(work: Path, preset: str) -> tuple[str, dict]:
    out = work / f"{preset}.pcap"
    rc, _, err = sh("skewscope.gen", preset, "-o", str(out), "--seed", "7")
    assert rc == 0, err
    return str(out), json.loads((work / f"{preset}.truth.json").read_text())


def span(truth: dict) -> tuple[float, float]:
    """The capture's first and last packet (unix s) from the generator's per-flow truth."""
    return (min(f["first_ts"] for f in truth["flows"]) / 1e9, max(f["last_ts"] for f in truth["flows"]) / 1e9)


def host_name(prefix: str, i: int) -> str:
    """Host names with regex metacharacters (. and -), as real ones have: the Hostname=~
    matcher (escaped for RE2) must still match them."""
    return f"{prefix}-gpu{i + 1}.rack-1.example"


def inventory(work: Path, prefix: str, members: list[str]) -> str:
    p = work / f"inv-{prefix}.csv"
    p.write_text("ip,host,gpu\n" + "".join(f"{ip},{host_name(prefix, i)},0\n" for i, ip in enumerate(members)))
    return str(p)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    work = tmp_path_factory.mktemp("dcgm-prom")
    tp, tp_truth = generate(work, "tp-decode-slow-shard")
    ring, ring_truth = generate(work, "ring-straggler")
    samples = []

    def series(prefix, truth, state_of, times):
        members = truth["groups"][0]["members"]
        for i, ip in enumerate(members):
            for t in times:
                st = state_of(ip, t)
                if st is not None:
                    samples.append((t, host_name(prefix, i), 0, st))

    worlds = {}
    for prefix, preset, truth, pcap in (("a", "tp", tp_truth, tp), ("b", "tp", tp_truth, tp),
                                        ("c", "tp", tp_truth, tp), ("d", "tp", tp_truth, tp),
                                        ("r", "ring", ring_truth, ring)):
        t0, t1 = span(truth)
        start = math.floor(t0) - 60
        times = [start + STEP * k for k in range(int((t1 + 60 - start) // STEP) + 1)]
        thr = math.floor(t0) - THROTTLE_LEAD
        slow = truth["pathologies"][0]["entities"]["ips"][0]
        other = next(ip for ip in truth["groups"][0]["members"] if ip != slow)
        H, T = dcgmlib.HEALTHY, dcgmlib.THROTTLED
        if prefix in ("a", "r"):
            series(prefix, truth, lambda ip, t: T if ip == slow and t >= thr else H, times)
        elif prefix == "b":
            series(prefix, truth, lambda ip, t: T if ip == other and t >= thr else H, times)
        elif prefix == "c":
            series(prefix, truth, lambda ip, t: None if ip == slow else H, times)
        else:
            series(prefix, truth, lambda ip, t: H, [t - 3600 for t in times])
        members = truth["groups"][0]["members"]
        worlds[prefix] = {"pcap": pcap, "truth": truth, "slow": slow, "other": other, "throttle_at": thr,
                          "inv": inventory(work, prefix, members), "members": members,
                          "host": host_name(prefix, members.index(slow))}
    prom = Backfilled(work, [dcgmlib.openmetrics(samples)])
    prom.start()
    try:
        yield prom.url, worlds
    finally:
        prom.stop()


def diagnose(pcap, inv, url=None):
    args = ["skewscope", "diagnose", pcap, "--json", "--inventory", inv] + (["--dcgm", url] if url else [])
    rc, out, err = sh(*args)
    assert rc in (0, 1, 2), err
    return json.loads(out)


def strip(doc):
    return [{k: v for k, v in f.items() if k != "cause"} for f in doc["findings"]]


def blamed(doc, kind, ip):
    fs = [f for f in doc["findings"] if f["kind"] == kind]
    assert fs, [f["kind"] for f in doc["findings"]]
    assert fs[0]["entities"]["ips"][0] == ip
    return fs[0]


def test_throttled_gpu_on_the_slow_shard_is_named(world):
    url, w = world
    a = w["a"]
    doc = diagnose(a["pcap"], a["inv"], url)
    f = blamed(doc, "slow_tp_shard", a["slow"])
    c = f["cause"]
    assert (c["verdict"], c["host"], c["gpu"]) == ("gpu", a["host"], 0)
    assert c["text"] == (f"GPU 0 of {a['host']}: SM clock 1,215 MHz vs 1,980 MHz group median, "
                         f"HW thermal slowdown since {hms(a['throttle_at'])} UTC, GPU at 91 C, "
                         "power 690 W at its 700 W limit")    # 689.5 W in most of the window's samples
    assert c["evidence"]["source_kind"] == "prometheus"
    assert c["evidence"]["slowdown_since"] == a["throttle_at"]
    assert c["evidence"]["group_gpus"] == len(a["members"]) - 1
    assert strip(doc) == diagnose(a["pcap"], a["inv"])["findings"]


def test_report_json_carries_the_same_cause(world):
    url, w = world
    a = w["a"]
    rc, out, err = sh("skewscope", "report", a["pcap"], "--json", "--inventory", a["inv"], "--dcgm", url)
    assert rc == 0, err
    f = blamed(json.loads(out), "slow_tp_shard", a["slow"])
    assert (f["cause"]["verdict"], f["cause"]["host"]) == ("gpu", a["host"])


def test_throttled_gpu_on_a_healthy_host_blames_no_one_new(world):
    url, w = world
    b = w["b"]
    doc = diagnose(b["pcap"], b["inv"], url)
    f = blamed(doc, "slow_tp_shard", b["slow"])
    c = f["cause"]
    assert (c["verdict"], c["host"]) == ("gpu_normal", b["host"])
    assert c["text"] == (f"GPU 0 of {b['host']} looks normal (SM clock 1,980 MHz, group median 1,980 MHz, "
                         "no throttle reasons, no XID): look at the NIC/link")
    assert strip(doc) == diagnose(b["pcap"], b["inv"])["findings"]


def test_no_series_and_no_samples_in_the_window_say_so(world):
    url, w = world
    for key in ("c", "d"):
        x = w[key]
        doc = diagnose(x["pcap"], x["inv"], url)
        f = blamed(doc, "slow_tp_shard", x["slow"])
        c = f["cause"]
        lo, hi = c["evidence"]["window"]
        assert c["verdict"] == "no_data"
        assert c["text"] == f"no DCGM data for GPU 0 of {x['host']} between {hms(lo)} and {hms(hi)} UTC"
        t0, t1 = span(x["truth"])
        assert lo <= t0 and hi >= t1
        assert strip(doc) == diagnose(x["pcap"], x["inv"])["findings"]


def test_ring_straggler_cause(world):
    url, w = world
    r = w["r"]
    doc = diagnose(r["pcap"], r["inv"], url)
    covered = [f for f in doc["findings"] if f["kind"] in ("ring_straggler", "straggler")]
    assert covered
    for f in covered:
        assert f["entities"]["ips"][0] == r["slow"]
        assert (f["cause"]["verdict"], f["cause"]["host"]) == ("gpu", r["host"])
        assert f"HW thermal slowdown since {hms(r['throttle_at'])} UTC" in f["cause"]["text"]
    assert strip(doc) == diagnose(r["pcap"], r["inv"])["findings"]


def test_cluster_cause_from_the_fleet_series_and_dcgm_in_one_prometheus(tmp_path):
    """`skewscope cluster --dcgm`: the DPUs' skewscope series (export --from VIEW --once) and the
    GPUs' DCGM series in one Prometheus; the fleet's straggler gets the cause of its throttled
    GPU, over the window of `--at` (a unix clock), and the findings are those of the run
    without --dcgm."""
    views = tmp_path / "views"
    rc, _, err = sh("skewscope", "gen", "ring-straggler", "--views", str(views), "--seed", "7")
    assert rc == 0, err
    truth = json.loads((views / "truth.json").read_text())
    slow = next(p for p in truth["pathologies"] if p["kind"] == "straggler")["entities"]["ips"][0]
    ips = sorted(p.name[:-len(".pcap")] for p in views.glob("*.pcap"))
    inv = tmp_path / "inv.csv"
    inv.write_text("ip,host,gpu\n" + "".join(f"{ip},{host_name('f', k)},0\n" for k, ip in enumerate(ips)))
    t = float(int(datetime.now(timezone.utc).timestamp()) - 120)
    om = []
    for k, ip in enumerate(ips):
        rc, out, err = sh("skewscope", "export", "--from", str(views / f"{ip}.pcap"), "--once", "--format",
                          "openmetrics", "--timestamp", str(t), "--node", f"dpu{k}", "--node-ip", ip)
        assert rc == 0, err
        om.append(out)
    thr = t - 200
    om.append(dcgmlib.openmetrics([(t - 300 + STEP * j, host_name("f", k), 0,
                                    dcgmlib.THROTTLED if ip == slow and t - 300 + STEP * j >= thr else dcgmlib.HEALTHY)
                                   for j in range(300 // STEP + 1) for k, ip in enumerate(ips)]))
    prom = Backfilled(tmp_path, om)
    prom.start()
    try:
        base = ["skewscope", "cluster", "--prometheus", prom.url, "--window", "all", "--at", str(t + 1), "--json",
                "--inventory", str(inv)]
        rc, out, err = sh(*base)
        assert rc == 0, err
        plain = json.loads(out)
        rc, out, err = sh(*base, "--dcgm", prom.url)
        assert rc == 0, err
        withc = json.loads(out)
    finally:
        prom.stop()
    assert strip(withc) == plain["findings"]
    covered = [f for f in withc["findings"] if f["kind"] in ("straggler", "ring_straggler", "slow_tp_shard")]
    assert covered, [f["kind"] for f in withc["findings"]]
    f = covered[0]
    assert f["entities"]["ips"][0] == slow
    c = f["cause"]
    assert (c["verdict"], c["host"], c["gpu"]) == ("gpu", host_name("f", ips.index(slow)), 0)
    assert c["text"].startswith(f"GPU 0 of {c['host']}: SM clock 1,215 MHz vs 1,980 MHz group median, "
                                f"HW thermal slowdown since {hms(thr)} UTC")
    lo, hi = c["evidence"]["window"]
    assert lo <= thr and hi >= t + 1
