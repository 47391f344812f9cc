"""Names from Prometheus labels (issue 27, deliverable 1b) through a real Prometheus: each
DPU's `skewscope export --from VIEW --once --format openmetrics --inventory FILE` (so every
DPU publishes skewscope_inventory_info for the addresses it exports) -> promtool backfill ->
Prometheus -> `skewscope cluster --inventory http://PROMETHEUS` names the truth's straggler
by host and GPU, with no copy of the file on the machine that runs `cluster`."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.parse

import pytest
from promharness import Backfilled, http_json

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("prometheus") is None or shutil.which("promtool") is None,
                                 reason="Debian package prometheus missing (make setup installs it)"),
              pytest.mark.timeout(600)]


def skewscope(*args, ok=(0,)):
    r = subprocess.run([sys.executable, "-m", "skewscope.cli", *map(str, args)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode in ok, r.stderr[-3000:]
    return r


def test_cluster_names_the_straggler_from_the_dpus_inventory_series(tmp_path):
    views = tmp_path / "views"
    skewscope("gen", "ring-straggler", "--views", views, "--seed", "7")
    truth = json.loads((views / "truth.json").read_text())
    slow = next(p for p in truth["pathologies"] if p["kind"] == "straggler")["entities"]["ips"][0]
    ips = sorted(p.name[:-len(".pcap")] for p in views.glob("*.pcap"))
    inv = tmp_path / "inv.csv"
    inv.write_text("ip,host,gpu,rank\n" + "".join(f"{ip},host-{ip.split('.')[-1]},{k % 8},{k}\n"
                                                  for k, ip in enumerate(ips)))
    t = float(int(time.time()) - 120)
    om = [skewscope("export", "--from", views / f"{ip}.pcap", "--once", "--format", "openmetrics", "--timestamp", t,
                    "--node", f"dpu{k}", "--node-ip", ip, "--inventory", inv).stdout for k, ip in enumerate(ips)]
    assert all("skewscope_inventory_info{" in x for x in om)
    prom = Backfilled(tmp_path, om)
    try:
        prom.start()
        plain = json.loads(skewscope("cluster", "--prometheus", prom.url, "--window", "all", "--at", t + 1,
                                     "--json").stdout)
        named = json.loads(skewscope("cluster", "--prometheus", prom.url, "--window", "all", "--at", t + 1,
                                     "--json", "--inventory", prom.url).stdout)
        bad = skewscope("cluster", "--prometheus", prom.url, "--inventory", prom.url + "#no_such_info", ok=(3,))
        # docs/fleet.md "Inventory": the join that puts host and GPU on a per-pair series
        q = ('sum by (dst) (last_over_time(skewscope_peer_bytes_total[10m])) * on (dst) group_left (host, gpu) '
             'label_replace(max by (ip, host, gpu) (last_over_time(skewscope_inventory_info[10m])), '
             '"dst", "$1", "ip", "(.*)")')
        joined = http_json(f"{prom.url}/api/v1/query?" + urllib.parse.urlencode({"query": q, "time": t + 1}))
    finally:
        prom.stop()
    k = ips.index(slow)
    want = f"host-{slow.split('.')[-1]}/gpu{k % 8}"
    lead = [f for f in named["findings"] if f["severity"] in ("warning", "critical")]
    assert lead and lead[0]["entities"]["ips"][0] == slow, [(f["kind"], f["entities"]["ips"]) for f in lead]
    assert lead[0]["names"][slow] == want and f"{want} ({slow})" in lead[0]["message"]
    assert [(f["kind"], f["severity"], f["entities"]) for f in named["findings"]] == \
        [(f["kind"], f["severity"], f["entities"]) for f in plain["findings"]]
    assert named["inventory"][slow]["rank"] == k
    rows = {r["metric"]["dst"]: r["metric"] for r in joined["data"]["result"]}
    assert set(rows) == set(ips), rows
    assert all(rows[ip]["host"] == f"host-{ip.split('.')[-1]}" and rows[ip]["gpu"] == str(k % 8)
               for k, ip in enumerate(ips))
    err = bad.stderr.strip().splitlines()
    assert len(err) == 1 and "no_such_info" in err[0], bad.stderr
