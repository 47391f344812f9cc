"""One DPU per node, live: the namespace fabric with per_node_dpu=True (node i's switch port
mirrored in both directions to its own DPU namespace dpu<i>, which runs `skewscope export -i
obs0` on a management veth), a real Prometheus (Debian's /usr/bin/prometheus on 127.0.0.1,
scrape every 1 s, the shipped rule files of docs/prometheus loaded) scraping every DPU, the
generator's traffic played from the node namespaces, and `skewscope cluster --json --window
all` must name the injected entity -- taken from the generator's ground truth -- for a slow
TP shard, a ring straggler and a hot expert. Each DPU must have seen exactly its own node's
traffic: every series it exports involves its node, and its packet count equals the
generator's frames from or to that node.

No DPU sees another node's view: whatever `cluster` concludes about a ring or a TP group is
fused from per-node views through Prometheus (docs/fleet.md).

Cases (variants of the presets, so the node counts, the blamed node and the sizes are not
the presets' own): tp-decode-slow-shard (4-way TP, shard 2 late on every ring send), the
same at 2-way TP (shard 0 late: a ring of two, each DPU seeing every flow) and a 2-node ring
straggler (node 1) and a healthy 2-way TP (nothing may be blamed),
ring-straggler at 5 nodes / 1 MiB / 1 channel / 6 iterations (node 1 at 0.4x, 20 us late per
step; the stretched iteration stays shorter than an exporter read interval),
ep-decode-hot-expert at 6 nodes (destination 2 gets 4x). Each case builds its own fabric,
exporters and Prometheus (fresh counters, so `--window all` is exactly that case's traffic).
Everything made is named ssn-* and removed in finally blocks.
"""
from __future__ import annotations

import copy
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from promharness import Prom, http_json, wait_until

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root: network namespaces, veth, XDP attach"),
              pytest.mark.skipif(shutil.which("prometheus") is None, reason="Debian package prometheus missing "
                                                                            "(make setup installs it)"),
              pytest.mark.timeout(420)]

SCRAPE_S = 1.0
FPS = 4000                  # frames/s the whole fabric sends (sets the time stretch)
#: the exporters' read interval. Live per-node timing is measured over a sliding window of the
#: node's recent records (outputs/exptiming.py WindowedTiming, 60 s), exported once per step/iteration; the
#: stretch (~160x for the TP decode) makes a token ~1 s long here, where a real one is a few ms
EXPORT_INTERVAL = 3.0


def _variant(preset: str, **changes) -> dict:
    from skewscope.gen.presets import PRESETS
    sc = copy.deepcopy(PRESETS[preset])
    sc["name"] = f"{preset}-variant"
    for k, v in changes.items():
        if k == "node":
            sc["pathologies"][0]["node"] = v
        elif k in ("bytes", "channels"):
            sc["workloads"][0][k] = v
        else:
            sc[k] = v
    return sc


#: case -> (scenario, generator seed, the truth's pathology kind, the cluster finding kind,
#: frames/s of the whole fabric (sets the time stretch), exporter read interval (s)).
#: The TP decode's collectives are bursts 10 us apart: at 4000 frames/s on average the player
#: falls behind inside a burst (its peak over 10 us is 4.6x the average) and the gaps that
#: separate collectives vanish, so it is played ~2.4x slower than the others.
CASES = {
    "hot_expert": (_variant("ep-decode-hot-expert", nodes=6, node=2), 4, "hot_destination", "hot_destination",
                   FPS, EXPORT_INTERVAL),
    "slow_tp_shard": ("tp-decode-slow-shard", 2, "slow_tp_shard", "slow_tp_shard", FPS, EXPORT_INTERVAL),
    # 2-way TP: each DPU sees the whole job (its node is one of two ends of every flow), the
    # ring is one of two members whose upstream is its downstream
    "slow_tp_shard_2way": (_variant("tp-decode-slow-shard", nodes=2, node=0), 5, "slow_tp_shard", "slow_tp_shard",
                           FPS, EXPORT_INTERVAL),
    "ring_straggler_2way": (_variant("ring-straggler", nodes=2, node=1, bytes="1MiB", channels=1, iterations=6,
                                     period_ms=3.0), 6, "straggler", "ring_straggler", FPS, EXPORT_INTERVAL),
    # the same 2-way TP without a pathology: no member is blamed
    "healthy_tp_2way": (_variant("tp-decode-healthy", nodes=2), 7, None, None, FPS, EXPORT_INTERVAL),
    "ring_straggler": (_variant("ring-straggler", nodes=5, node=1, bytes="1MiB", channels=1, iterations=6,
                                period_ms=3.0), 3, "straggler", "ring_straggler", FPS, EXPORT_INTERVAL),
}


def node_views(cap):
    """Ground truth per node (from the generator): frames from or to it, and its peers."""
    job = cap.job
    ps, pd = np.asarray(job.p_src)[cap.pkts["path"]], np.asarray(job.p_dst)[cap.pkts["path"]]
    out = []
    for i in range(int(job.n)):
        mine = (ps == i) | (pd == i)
        peers = set(np.unique(np.concatenate([pd[ps == i], ps[pd == i]])).tolist())
        out.append({"frames": int(np.count_nonzero(mine)), "peers": {f"10.0.0.{j + 1}" for j in peers}})
    return out


def cluster(prom_url, *args):
    r = subprocess.run([sys.executable, "-m", "skewscope.cli", "cluster", "--prometheus", prom_url, "--json", *args],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.fixture(scope="module", params=list(CASES))
def fleet(request, tmp_path_factory):
    from skewscope import gen as skewgen
    from skewscope.testbed.fabric import Fabric, play
    case = request.param
    scenario, seed, truth_kind, finding_kind, fps, interval = CASES[case]
    cap = skewgen.generate(scenario, seed=seed)
    truth = cap.truth
    pat = next((p for p in truth["pathologies"] if p["kind"] == truth_kind), None)
    assert (pat is None) == (truth_kind is None), truth["pathologies"]
    n = int(cap.job.n)
    views = node_views(cap)
    assert len(views) == n and all(v["frames"] for v in views)
    ts = cap.timestamps
    span = int(ts[-1] - ts[0]) / 1e9
    stretch = max(1.0, len(cap) / (fps * span))
    work = tmp_path_factory.mktemp(f"ssn-{case}")
    fab = Fabric(nodes=n, prefix="ssn-", per_node_dpu=True)
    prom = None
    try:
        fab.build()
        targets = fab.start_exporters(port=9435, interval=interval, log_dir=work, nice=10,
                                      extra=("--no-analysis",))  # /v1 unused here: its CPU would only slow the reads
        prom = Prom(work, targets)
        prom.start()

        def ready():
            for i, p in enumerate(fab.procs):
                if p.poll() is not None:
                    log = (work / f"export-{fab.dpu_node(i)}.log").read_text()[-2000:]
                    raise AssertionError(f"exporter {fab.dpu_node(i)} exited {p.returncode}: {log}")
            return len(prom.query('skewscope_exporter_info{job="skewscope"}')) == n
        wait_until(ready, 180, f"{n} exporters attached and scraped")
        st = play(fab.node_ns, fab.node_if, [cap], stretch, max_seconds=span * stretch + 60, passes=1)
        assert st["sent"] == len(cap) and st["unknown_source"] == 0, st

        def settled():   # every DPU read its last frames and Prometheus scraped that read
            got = {r["metric"]["node"]: int(float(r["value"][1]))
                   for r in prom.query("sum by (node) (skewscope_peer_packets_total)")}
            return got if all(got.get(fab.dpu_node(i)) == v["frames"] for i, v in enumerate(views)) else None
        try:
            # generous: the exporters' first analysis of traffic may compile numba kernels
            # (a fresh checkout), and a scrape that waits for it times out meanwhile
            wait_until(settled, 150, "per-DPU packet totals = the generator's frames from or to each node")
        except AssertionError as e:
            got = prom.query("sum by (node) (skewscope_peer_packets_total)")
            health = [(t["scrapeUrl"], t["health"], t["lastError"])
                      for t in http_json(prom.url + "/api/v1/targets")["data"]["activeTargets"]]
            raise AssertionError(f"{e}; got {[(r['metric']['node'], r['value'][1]) for r in got]}, "
                                 f"want {[v['frames'] for v in views]}; targets {health}") from None
        time.sleep(interval + 2 * SCRAPE_S)   # the timing series of the same last read, rules evaluated
        doc = cluster(prom.url, "--window", "all")
        if os.environ.get("SSN_DUMP"):
            Path(os.environ["SSN_DUMP"], f"{case}.json").write_text(json.dumps(doc, indent=1))
            tm = prom.query('sum by (__name__, node, role) ({__name__=~"skewscope_node_.+_(count|total)"})')
            Path(os.environ["SSN_DUMP"], f"{case}.timing.json").write_text(json.dumps(tm, indent=1))
        series = {i: prom.query(f'{{node="{fab.dpu_node(i)}", __name__=~"skewscope_.+"}}') for i in range(n)}
        yield {"case": case, "doc": doc, "truth": truth, "pat": pat, "kind": finding_kind, "fab": fab, "n": n,
               "views": views, "series": series, "stretch": stretch}
    finally:
        try:
            assert not fab.teardown()
        finally:
            if prom is not None:
                prom.stop()


def test_each_dpu_sees_exactly_its_own_node(fleet):
    """Series with addresses on DPU i always involve node i (both ends for a pair, a peer of
    node i for a single address); the packet totals already matched the truth per node."""
    n, views = fleet["n"], fleet["views"]
    for i in range(n):
        me = f"10.0.0.{i + 1}"
        ok_peer = views[i]["peers"] | {me}
        pairs = 0
        assert fleet["series"][i], f"dpu{i} exported nothing"
        for s in fleet["series"][i]:
            m = s["metric"]
            src, dst = m.get("src"), m.get("dst")
            if src is not None and dst is not None:
                pairs += 1
                assert me in (src, dst) and {src, dst} <= ok_peer, (i, m)
            for lab in ("src", "dst", "peer"):
                if lab in m and m[lab] != "_overflow":
                    assert m[lab] in ok_peer, (i, lab, m)
            if "ip" in m:                      # per-node timing: about its own node only
                assert m["ip"] == me, (i, m)
        assert pairs, f"dpu{i}: no pair series"
        # every peer of node i (in the truth) appears in DPU i's pair series, both directions
        seen = {(s["metric"]["src"], s["metric"]["dst"]) for s in fleet["series"][i]
                if s["metric"]["__name__"] == "skewscope_peer_packets_total"}
        want = {(me, p) for p in views[i]["peers"]} | {(p, me) for p in views[i]["peers"]}
        assert seen == want, (i, sorted(seen ^ want))


def test_cluster_names_the_injected_entity(fleet):
    doc, pat, kind = fleet["doc"], fleet["pat"], fleet["kind"]
    if pat is None:      # a healthy job: no member of any group is blamed
        blame = [f for f in doc["findings"] if f["kind"] in ("slow_tp_shard", "ring_straggler", "rotating_straggler",
                                                             "straggler", "slow_link")]
        assert blame == [], blame
        assert doc["timing"]["groups"], doc["timing"]     # the group was seen, and timed
        return
    blamed = pat["entities"]["ips"][0]
    got = [f for f in doc["findings"] if f["kind"] == kind]
    assert got, (f"{fleet['case']}: no {kind} finding (want {blamed}); findings: "
                 f"{[(f['kind'], f['entities']['ips'][:3]) for f in doc['findings']]}")
    assert got[0]["entities"]["ips"][0] == blamed, got[0]
    assert sorted(doc["meta"]["dpus"]) == sorted(fleet["fab"].dpu_node(i) for i in range(fleet["n"]))
    # fused from per-node views: the evidence says which DPUs saw it (the pair's, the link's
    # or the per-node timing's seen_by); each is the DPU of a member of the blamed node's
    # group, the blamed node's own DPU among them, and a DPU citing a pair watches one end
    dpu_of = {f"10.0.0.{i + 1}": f"dpu{i}" for i in range(fleet["n"])}
    members = next(g["members"] for g in fleet["truth"]["groups"] if blamed in g["members"])
    ev = got[0]["evidence"]
    seen = (ev.get("seen_by") or []) + ((ev.get("timing") or {}).get("seen_by") or [])
    assert seen, got[0]
    names = {o.get("dpu", o.get("node")) for o in seen}
    assert names <= {dpu_of[ip] for ip in members} and dpu_of[blamed] in names, (seen, members)
    for o in seen:
        if o.get("pair"):
            assert o.get("dpu", o.get("node")) in {dpu_of[ip] for ip in o["pair"]}, o


CHILD = """
import json, sys, time
from skewscope.testbed.fabric import Fabric
fab = Fabric(nodes=2, prefix="ssd-", tag=sys.argv[1], per_node_dpu=True).build()
fab.start_exporters(port=9435)
print(json.dumps({"namespaces": fab.namespaces(), "links": fab.mgmt_root, "procs": [p.pid for p in fab.procs],
                  "state": str(fab.state_file)}), flush=True)
time.sleep(120)
"""


def test_demo_cleanup_removes_a_per_node_fabric_whose_owner_was_killed():
    """SIGKILL the owner of a per-node fabric with its exporters running: `skewscope demo
    --cleanup` removes its namespaces, its root-side management links, its exporters and its
    state file."""
    from skewscope.testbed.fabric import list_namespaces
    tag = f"n{os.getpid() % 4096:03x}"
    owner = subprocess.Popen([sys.executable, "-c", CHILD, tag], stdout=subprocess.PIPE, text=True,
                             start_new_session=True)
    made = None
    try:
        made = json.loads(owner.stdout.readline() or "null")
        assert made and len(made["namespaces"]) == 5 and len(made["procs"]) == 2, made
        assert all(Path(f"/sys/class/net/{ln}").exists() for ln in made["links"])
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(timeout=10)
        assert all(_alive(p) for p in made["procs"])          # the exporters outlive their owner
        skewscope = str(Path(sys.executable).with_name("skewscope"))
        p = subprocess.run([skewscope, "demo", "--cleanup"], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        assert [n for n in list_namespaces() if n.startswith(f"ssd-{tag}-")] == []
        assert not any(Path(f"/sys/class/net/{ln}").exists() for ln in made["links"])
        assert not Path(made["state"]).exists()
        wait_until(lambda: not any(_alive(p) for p in made["procs"]), 10, "exporters killed")
    finally:
        if owner.poll() is None:
            os.killpg(owner.pid, signal.SIGKILL)
            owner.wait(timeout=10)
        for pid in (made or {}).get("procs", []):
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        for n in list_namespaces():
            if n.startswith(f"ssd-{tag}-"):
                subprocess.run(["ip", "netns", "del", n], capture_output=True)


def _alive(pid: int) -> bool:
    """pid is running (not a zombie: cleanup's SIGKILL leaves the exporters to init)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False
