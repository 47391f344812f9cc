"""The fleet's file path, one DPU per node: the generator writes per-node views (`skewscope gen
SCENARIO --views DIR`: the frames a DPU on node IP sees), one `skewscope export --from
VIEW.pcap --node dpuK --node-ip IP` per node, a real Prometheus (Debian's
/usr/bin/prometheus on 127.0.0.1, a temporary config and TSDB, the shipped rule files)
scrapes them all, and `skewscope cluster --window all --json` must name the injected entity --
from the generator's ground truth, never from skewscope -- with the single-node finding
schema and `seen_by` evidence (which DPUs saw what).

No DPU sees another node's traffic and nothing compares two DPUs' timestamps: the views are
generated with --clock-skew (each DPU's clock off by up to +-5 s), so a fusion that used
absolute times across DPUs would fail.

Cases (presets and variants: other node counts, sizes, MTUs, the blamed node moved):
slow TP shard (tp-decode-slow-shard; 6-way, shard 4, 30 us late), ring straggler (ring-straggler;
5 nodes, 2 MiB, node 1), rotating straggler (ring-rotating-straggler), hot expert
(ep-decode-hot-expert; 6-way with destination 1, IB MTU 1024, 4 KiB per destination), and the other fleet detectors
on their presets: incast, ECN congestion, CNP storm, retransmissions, NAKs (item 6). Each
case also runs the all-seeing `diagnose --json` on the full capture and compares: the same
kind blames the same entity. Cost (queries, samples, seconds) is measured on every case and
printed (`cluster --stats`).

Everything made is under a pytest tmp dir; every process started is stopped in finally.
"""
from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from promharness import Prom, free_port, stop_proc, wait_until

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("prometheus") is None, reason="Debian package prometheus missing "
                                                                            "(make setup installs it)"),
              pytest.mark.timeout(600)]

SCRAPE_S = 2.0


def _variant(preset: str, path: dict | None = None, **changes) -> dict:
    from skewscope.gen.presets import PRESETS
    sc = copy.deepcopy(PRESETS[preset])
    sc["name"] = f"{preset}-variant"
    for k, v in (path or {}).items():
        sc["pathologies"][0][k] = v
    for k, v in changes.items():
        if k in ("bytes", "channels", "bytes_per_peer", "bytes_per_dest"):
            sc["workloads"][0][k] = v
        else:
            sc[k] = v
    return sc


#: case -> (scenario, seed, the truth's pathology kind, the cluster's finding kind, the
#: all-seeing diagnose's finding kind for the comparison, or None when not compared)
CASES = {
    "slow_tp_shard": ("tp-decode-slow-shard", 2, "slow_tp_shard", "slow_tp_shard", "slow_tp_shard"),
    "slow_tp_shard_6way": (_variant("tp-decode-slow-shard", {"node": 4, "lag_us": 30}, nodes=6), 5,
                           "slow_tp_shard", "slow_tp_shard", "slow_tp_shard"),
    "ring_straggler": ("ring-straggler", 3, "straggler", "ring_straggler", "ring_straggler"),
    "ring_straggler_5n": (_variant("ring-straggler", {"node": 1}, nodes=5, bytes="2MiB", channels=1), 7,
                          "straggler", "ring_straggler", "ring_straggler"),
    "rotating_straggler": ("ring-rotating-straggler", 3, "rotating_straggler", "rotating_straggler",
                           "rotating_straggler"),
    "hot_expert": ("ep-decode-hot-expert", 3, "hot_destination", "hot_destination", "hot_destination"),
    "hot_expert_6way": (_variant("ep-decode-hot-expert", {"node": 1}, nodes=6, mtu=1024, bytes_per_dest="4KiB"), 4,
                        "hot_destination", "hot_destination", "hot_destination"),
    "moe_hot_expert": ("moe-hot-expert", 1, "hot_expert", "hot_destination", "hot_destination"),
    "incast": ("incast", 1, "incast", "incast", None),
    "ecn_congestion": ("congestion", 1, "congestion", "ecn_congestion", None),
    # more iterations: with --window all the CNP storm is a count (cnp_storm.min_count)
    "cnp_storm": (_variant("congestion", {"into": 4}, nodes=6, iterations=12), 2, "congestion", "cnp_storm", None),
    "retransmissions": ("loss", 1, "loss", "retransmissions", None),
    "nak_errors": (_variant("loss", {"pairs": [[3, 4]], "count": 4}, nodes=5), 3, "loss", "nak_errors", None),
}


def skewscope(*args, timeout=300, check=True):
    r = subprocess.run([sys.executable, "-m", "skewscope.cli", *args], capture_output=True, text=True,
                       timeout=timeout)
    if check:
        assert r.returncode in (0, 1, 2) if args[0] == "diagnose" else r.returncode == 0, r.stderr[-3000:]
    return r


def run_fleet(scenario, seed: int, work: Path) -> dict:
    """gen --views, one exporter per view, Prometheus, cluster --window all --json --stats."""
    if isinstance(scenario, dict):
        sc_file = work / "scenario.yaml"
        sc_file.write_text(json.dumps(scenario))           # JSON is YAML
        scenario = str(sc_file)
    views = work / "views"
    skewscope("gen", scenario, "--views", str(views), "--seed", str(seed), "--clock-skew", "5000000")
    full = work / "full.pcap"
    skewscope("gen", scenario, "-o", str(full), "--seed", str(seed))
    truth = json.loads((views / "truth.json").read_text())
    pcaps = sorted(p for p in views.glob("*.pcap"))
    procs, logs, targets = [], [], []
    prom = None
    try:
        for k, p in enumerate(pcaps):
            port = free_port()
            log = open(work / f"export{k}.log", "w")
            logs.append(log)
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "skewscope.cli", "export", "--from", str(p), "--listen", f"127.0.0.1:{port}",
                 "--node", f"dpu{k}", "--node-ip", p.stem, "--no-analysis"], stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True))
            targets.append(f"127.0.0.1:{port}")
        prom = Prom(work, targets, scrape_s=SCRAPE_S)
        prom.start()
        url = prom.url

        def scraped():
            prom.ready()
            for k, p in enumerate(procs):
                if p.poll() is not None:
                    raise AssertionError(f"exporter {k} exited {p.returncode}: "
                                         f"{(work / f'export{k}.log').read_text()[-2000:]}")
            return len(prom.query("count by (node) (skewscope_exporter_info)")) == len(pcaps)
        wait_until(scraped, 240, f"{len(pcaps)} exporters up and scraped")
        time.sleep(4 * SCRAPE_S)
        r = skewscope("cluster", "--prometheus", url, "--window", "all", "--json", "--stats")
        doc = json.loads(r.stdout)
        # a controller's subscription to the same fleet: watch --prometheus, two queries
        w = skewscope("watch", "--prometheus", url, "--prometheus-window", "all", "--json", "--interval", "1",
                      "--duration", "1.5")
        events = [json.loads(line) for line in w.stdout.splitlines() if line.strip()]
        diag = json.loads(skewscope("diagnose", str(full), "--json").stdout)
        return {"doc": doc, "truth": truth, "diag": diag, "stats": r.stderr, "n": len(pcaps), "events": events,
                "dpu_ip": {f"dpu{k}": p.stem for k, p in enumerate(pcaps)}}
    finally:
        for p in procs:
            stop_proc(p)
        if prom is not None:
            prom.stop()
        for f in logs:
            f.close()


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    name = request.param
    scenario, seed, truth_kind, kind, diag_kind = CASES[name]
    res = run_fleet(scenario, seed, tmp_path_factory.mktemp(f"fv-{name}"))
    if os.environ.get("SSV_DUMP"):
        Path(os.environ["SSV_DUMP"], f"{name}.json").write_text(json.dumps(res["doc"], indent=1))
    res.update(name=name, truth_kind=truth_kind, kind=kind, diag_kind=diag_kind,
               pat=next(p for p in res["truth"]["pathologies"] if p["kind"] == truth_kind))
    return res


def _blamed(pat) -> str:
    m = pat.get("magnitude") or {}
    return m.get("hot") or pat["entities"]["ips"][0]


def test_cluster_names_the_injected_entity(case):
    doc, pat, kind = case["doc"], case["pat"], case["kind"]
    fs = [f for f in doc["findings"] if f["kind"] == kind]
    assert fs, (case["name"], [(f["kind"], f["entities"]["ips"][:3], f["message"]) for f in doc["findings"]])
    truth_ips = pat["entities"]["ips"]
    if kind == "rotating_straggler":
        # every gate the generator injected, and nobody else, is named
        gates = set(pat["magnitude"]["gating_rank_per_iteration"])
        assert set(fs[0]["entities"]["ips"]) == gates, (fs[0]["entities"]["ips"], gates)
        assert fs[0]["evidence"]["distinct_gates"] == len(gates)
    elif kind in ("ecn_congestion", "retransmissions", "nak_errors"):
        # pair findings: exactly the truth's pairs (NAKs go back: receiver -> sender), with
        # the truth's counts (each pair seen by both ends' DPUs, counted once)
        pairs = {(a, b) for a, b, _ in pat["entities"]["flows"]}
        if kind == "nak_errors":
            pairs = {(b, a) for a, b in pairs}
        got = {tuple(f["entities"]["ips"][:2]) for f in fs}
        assert got == pairs, (got, pairs)
        mag = pat["magnitude"]
        if kind == "ecn_congestion":
            assert sum(f["evidence"]["ce_packets"] for f in fs) == mag["ce_packets"]
        elif kind == "retransmissions":
            assert sum(f["evidence"]["retransmitted_packets"] for f in fs) == mag["retransmissions"]
        else:
            assert sum(f["evidence"]["psn_sequence_error"] for f in fs) == mag["naks"]
    elif kind == "cnp_storm":
        # the data senders into the congested node are the ones told to slow down
        senders = {a for a, _, _ in pat["entities"]["flows"]}
        got = {f["entities"]["ips"][0] for f in fs}
        assert got and got <= senders, (got, senders)
        assert sum(f["evidence"]["cnp_packets"] for f in fs) == pat["magnitude"]["cnp_packets"]
    else:
        assert fs[0]["entities"]["ips"][0] == _blamed(pat), (fs[0]["entities"]["ips"], truth_ips, fs[0]["message"])
    for f in fs:   # the single-node schema, plus who saw it
        assert list(f) == ["kind", "severity", "entities", "evidence", "message", "group", "impact", "since", "until",
                           "incident"]
        assert f["severity"] in ("warning", "critical")
        ev = f["evidence"].get("timing", f["evidence"])
        assert ev["seen_by"], f
        assert all(row["dpu"].startswith("dpu") for row in ev["seen_by"]), ev["seen_by"]


def test_watch_prometheus_opens_the_injected_finding(case):
    """`watch --prometheus` (the controller's feed) opens an event of the cluster's kind naming
    the truth's entity, once: the second query sees the same id and opens nothing new."""
    events, pat, kind = case["events"], case["pat"], case["kind"]
    assert events and events[-1].get("schema", "").startswith("skewscope.watch_stats"), events[-1:]
    ev = [e for e in events if e.get("event") in ("opened", "updated", "resolved")]
    opened = [e for e in ev if e["event"] == "opened" and e["finding"]["kind"] == kind]
    assert opened, [(e["event"], e["finding"]["kind"]) for e in ev]
    assert any(_blamed(pat) in e["finding"]["entities"]["ips"] for e in opened), opened
    ids = [e["id"] for e in ev if e["event"] == "opened"]
    assert len(ids) == len(set(ids)), "an id opened twice across two queries of the same fleet"
    cluster_kinds = {f["kind"] for f in case["doc"]["findings"]}
    assert {e["finding"]["kind"] for e in ev} <= cluster_kinds


def test_seen_by_names_the_dpus_of_the_blamed_node(case):
    """seen_by rows come from the right DPUs: a pair row from the DPU of one of the pair's
    ends, a timing row from the DPU of the node it describes; the blamed node's own DPU is
    among them (and for a timing blame, its downstream's DPU corroborates)."""
    doc, kind, dpu_ip = case["doc"], case["kind"], case["dpu_ip"]
    f = next(f for f in doc["findings"] if f["kind"] == kind)
    ev = f["evidence"].get("timing", f["evidence"])
    blamed = f["entities"]["ips"][0]
    saw = set()
    for row in ev["seen_by"]:
        mine = dpu_ip[row["dpu"]]
        if row.get("pair"):
            assert mine in row["pair"], row
            saw.update(row["pair"] if mine == blamed else ())
        elif row.get("ip"):
            assert row["ip"] == mine, row
            saw.add(mine)
        else:                                 # a rate ring_straggler: each end's DPU
            assert mine in ev["link"], row
            saw.add(mine)
    assert blamed in saw, (blamed, ev["seen_by"])
    if kind == "slow_tp_shard" or (kind == "ring_straggler" and "timing" in f["evidence"]):
        assert ev["corroborated_by_downstream"], ev
        assert ev["downstream"] in saw


def test_fleet_matches_the_all_seeing_mirror(case):
    """diagnose on the full capture (one mirror that sees everything) and cluster on the
    per-node views conclude the same: same kind, same blamed entity."""
    if case["diag_kind"] is None:
        # pair kinds: diagnose's findings are per QP, the fleet's per node pair, so their entity
        # lists differ in grain; both must report the kind and name the truth's node
        diag, doc, kind, blamed = case["diag"], case["doc"], case["kind"], _blamed(case["pat"])
        for who, fs in (("diagnose", diag["findings"]), ("cluster", doc["findings"])):
            assert any(f["kind"] == kind and blamed in f["entities"]["ips"] for f in fs), \
                (who, blamed, [(f["kind"], f["entities"]["ips"][:3]) for f in fs])
        return
    diag, doc, kind = case["diag"], case["doc"], case["diag_kind"]
    d = next((f for f in diag["findings"] if f["kind"] == kind), None)
    c = next((f for f in doc["findings"] if f["kind"] == kind), None)
    assert d is not None and c is not None, ([f["kind"] for f in diag["findings"]], [f["kind"] for f in doc["findings"]])
    if kind == "rotating_straggler":
        assert set(d["entities"]["ips"]) == set(c["entities"]["ips"])
    else:
        assert d["entities"]["ips"][0] == c["entities"]["ips"][0], (d["entities"]["ips"], c["entities"]["ips"])


def test_timing_per_group_and_collective_confidence(case):
    doc, truth, name = case["doc"], case["truth"], case["name"]
    tm = doc["timing"]
    if name.startswith("slow_tp_shard") or name.startswith("hot_expert"):
        assert tm is not None and tm["clock"] == "unsynchronised"
        dec = [g for g in tm["groups"] if g["workload"] == "decode"]
        assert dec, tm
        # ground truth: the generator's token period (slowed by the shard) / token count
        # the generator's token period (slowed by the shard) where its truth has one, else
        # the all-seeing mirror's (diagnose on the full capture)
        period = case["pat"]["magnitude"].get("token_period_s") or case["diag"]["timing"]["token_interval_s"]
        g = max(dec, key=lambda g: len(g["members"]))
        assert g["tokens_per_s"] and g["itl_mean_s"]
        assert abs(g["itl_mean_s"] - period) / period < 0.05, (g["itl_mean_s"], period)
        assert abs(g["tokens_per_s"] * period - 1) < 0.05, (g["tokens_per_s"], period)
        assert len(g["members"]) == case["n"]
        assert tm["tokens_per_s"] == g["tokens_per_s"]
    for c in doc["collectives"]:
        assert 0.0 <= c["confidence"] <= 1.0
    truth_groups = [set(g["members"]) for g in truth.get("groups", []) if g.get("members")]
    if name.startswith(("slow_tp_shard", "ring_straggler", "rotating", "hot_expert")):
        # every member exported by its own DPU, both ends of every link: the evidence is
        # complete, so the confidence is 1; the group is the generator's
        c = max(doc["collectives"], key=lambda c: len(c["members"]))
        assert c["confidence"] == 1.0, c
        if truth_groups:
            assert set(c["members"]) in truth_groups, (c["members"], truth_groups)


def test_query_cost_is_measured_and_printed(case):
    m = case["doc"]["meta"]
    assert m["queries"] > 0 and m["samples_returned"] > 0 and m["query_seconds"] > 0
    assert f"queries {m['queries']}" in case["stats"], case["stats"]
    print(f"{case['name']}: {case['n']} DPUs: {case['stats'].strip()}")
