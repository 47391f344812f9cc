"""Names in every output (issue 27, deliverable 1): `--inventory` on report, diagnose, watch,
export and top; the names come from the inventory file the test writes, the blamed node
from the generator's truth. The wire's verdict does not move: kind, severity, entities and
the exit code are the same with and without an inventory; the IPs stay in the JSON."""
from __future__ import annotations

import copy
import ipaddress
import json
import re
import subprocess
import sys

from genlib import get, run

from skewscope.core.inventory import from_labels, parse
from skewscope.telemetry.enrich import Enricher, name_text

HOSTS = {f"10.0.0.{i}": (f"gpu-{i:02d}", i % 8) for i in range(1, 9)}


def inventory_csv(tmp_path, rows=HOSTS, skip=()):
    p = tmp_path / "inv.csv"
    p.write_text("ip,host,gpu,rank,job\n" + "".join(f"{ip},{h},{g},{k},llama\n" for k, (ip, (h, g))
                                                     in enumerate(rows.items()) if ip not in skip))
    return p


def cli(*args, ok=(0,)):
    r = subprocess.run([sys.executable, "-m", "skewscope.cli", *map(str, args)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode in ok, r.stderr[-2000:]
    return r


def verdict(doc):
    return [(f["kind"], f["severity"], f["entities"]) for f in doc["findings"]]


def test_report_names_the_truths_straggler_and_keeps_the_wire_verdict(tmp_path):
    truth, _a, pcap = run("ring-straggler", seed=7)
    slow = truth["pathologies"][0]["entities"]["ips"][0]
    inv = inventory_csv(tmp_path, skip={"10.0.0.8"})          # one member the inventory does not know
    plain = json.loads(cli("report", pcap, "--json").stdout)
    named = json.loads(cli("report", pcap, "--json", "--inventory", inv).stdout)
    assert verdict(named) == verdict(plain)
    host, gpu = HOSTS[slow]
    lead = next(f for f in named["findings"] if f["kind"] == "ring_straggler")
    assert lead["entities"]["ips"][0] == slow
    assert lead["names"][slow] == f"{host}/gpu{gpu}"
    assert f"{host}/gpu{gpu} ({slow})" in lead["message"]
    # the message says the same as without names once "name (ip)" is read back as the ip
    old = next(f for f in plain["findings"] if f["kind"] == "ring_straggler")["message"]
    assert re.sub(r"\S+ \((\d+\.\d+\.\d+\.\d+)\)", r"\1", lead["message"]) == old
    assert named["inventory"][slow]["host"] == host and "10.0.0.8" not in named["inventory"]
    ring = next(c for c in named["collectives"] if c["kind"] == "ring_allreduce")
    assert [n for n in ring["member_names"]] == [f"{HOSTS[m][0]}/gpu{HOSTS[m][1]}" if m != "10.0.0.8" else m
                                                 for m in ring["members"]]


def test_diagnose_human_and_exit_code_with_names(tmp_path):
    _truth, _a, pcap = run("ring-straggler", seed=7)
    inv = inventory_csv(tmp_path)
    a = cli("diagnose", pcap, ok=(2,))
    b = cli("diagnose", pcap, "--inventory", inv, ok=(2,))
    assert "gpu-04/gpu4 (10.0.0.4)" in b.stdout and "gpu-04" not in a.stdout


def test_bad_inventory_is_one_line_and_exit_3_before_any_work(tmp_path):
    _truth, _a, pcap = run("ring-straggler", seed=7)
    bad = tmp_path / "bad.csv"
    bad.write_text("ip,host\n10.0.0.1,gpu-01\n10.0.0.999,gpu-02\n")
    for cmd in (("diagnose", pcap), ("report", pcap), ("watch", "--from", pcap)):
        r = cli(*cmd, "--inventory", bad, ok=(3,))
        err = r.stderr.strip().splitlines()
        assert len(err) == 1 and "bad.csv:3" in err[0] and "10.0.0.999" in err[0], r.stderr
        assert "Traceback" not in r.stderr and r.stdout == ""


def test_watch_events_carry_names(tmp_path):
    truth, _a, pcap = run("ring-straggler", seed=7)
    slow = truth["pathologies"][0]["entities"]["ips"][0]
    r = cli("watch", "--from", pcap, "--json", "--inventory", inventory_csv(tmp_path), ok=(2,))
    evs = [json.loads(x) for x in r.stdout.splitlines() if '"finding"' in x]
    f = next(e["finding"] for e in evs if e["finding"]["kind"] == "ring_straggler")
    assert f["names"][slow] == "gpu-04/gpu4" and f["entities"]["ips"][0] == slow


def test_export_publishes_inventory_info_for_exported_addresses_only(tmp_path):
    _truth, _a, pcap = run("ring-straggler", seed=7)
    rows = dict(HOSTS, **{"10.9.9.9": ("elsewhere", 0)})     # in the inventory, not on the wire
    text = cli("export", "--from", pcap, "--once", "--inventory", inventory_csv(tmp_path, rows)).stdout
    got = {}
    for line in text.splitlines():
        if line.startswith("skewscope_inventory_info{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
            got[labels["ip"]] = labels
    assert set(got) == set(HOSTS)                              # every ring member, not 10.9.9.9
    assert all(got[ip]["host"] == h and got[ip]["gpu"] == str(g) and got[ip]["job_name"] == "llama"
               for ip, (h, g) in HOSTS.items())
    assert "job=" not in "".join(x for x in text.splitlines() if x.startswith("skewscope_inventory_info{"))
    assert "skewscope_inventory_info{" not in cli("export", "--from", pcap, "--once").stdout


def test_enrichment_is_idempotent_and_leaves_unknown_addresses():
    inv = parse("ip,host,gpu\n10.0.0.1,a,0\nfd00::2,b,\n", "t.csv")
    text = "from 10.0.0.1 to fd00::2, 10.0.0.3 and 10.0.0.10: 1.5x"
    once = name_text(text, inv)
    assert once == "from a/gpu0 (10.0.0.1) to b (fd00::2), 10.0.0.3 and 10.0.0.10: 1.5x"
    assert name_text(once, inv) == once
    doc = {"findings": [{"kind": "k", "entities": {"ips": ["10.0.0.1", "10.0.0.3"]}, "message": text}],
           "collectives": []}
    twice = Enricher(inv)(Enricher(inv)(copy.deepcopy(doc)))
    assert twice["findings"][0]["message"] == once and twice["findings"][0]["names"] == {"10.0.0.1": "a/gpu0"}
    assert not Enricher() and Enricher()(copy.deepcopy(doc)) == doc


def test_inventory_from_prometheus_labels_maps_label_names():
    rows = [{"__name__": "skewscope_inventory_info", "ip": "10.0.0.1", "host": "gpu-01", "gpu": "3",
             "job_name": "llama", "job": "dpus", "instance": "dpu1:9435", "node": "dpu1"},
            {"address": "fd00::0001", "Hostname": "gpu-02"},          # a site's metric, DCGM-style host label
            {"ip": "10.0.0.1", "host": "other"},                      # seen by a second DPU: first kept
            {"ip": "not-an-ip", "host": "x"}, {"host": "no-address"}]  # skipped, not fatal
    inv = from_labels(rows)
    assert len(inv) == 2
    e = inv.get("10.0.0.1")
    assert (e.host, e.gpu, e.job, e.instance) == ("gpu-01", 3, "llama", None)   # Prometheus' job/instance ignored
    assert inv.get(str(ipaddress.ip_address("fd00::1"))).host == "gpu-02"


def test_top_plain_rows_and_matrix_use_names():
    from skewscope.outputs.topmatrix import matrix_lines
    from skewscope.outputs.topview import ViewState, build_model
    _truth, snap = get("ring-straggler", 7)
    st = ViewState()
    st.names = {ip: h for ip, (h, _g) in HOSTS.items()}
    st.matrix = True
    m = build_model(snap, 1.0, st, limit=0)
    assert {r.src for r in m.rows} <= set(st.names.values()) and m.rows
    st.filter = "gpu-04"
    m2 = build_model(snap, 1.0, st, limit=0)
    assert m2.rows and all("gpu-04" in (r.src, r.dst) for r in m2.rows)
    assert any("gpu-04" in line for line in matrix_lines(m.matrix, width=200))


def test_gpu_cause_shows_in_watch_top_and_html(tmp_path):
    """A throttled GPU on the truth's straggler (a dcgm-exporter scrape file, --dcgm): the
    cause's line is in watch's human output, top's findings panel and the HTML card."""
    from dcgmlib import HEALTHY, THROTTLED, exposition

    from skewscope.outputs.topview import ViewState, build_model, plain_lines
    truth, snap = get("ring-straggler", 7)
    slow = truth["pathologies"][0]["entities"]["ips"][0]
    inv = inventory_csv(tmp_path)
    scrape = tmp_path / "dcgm.txt"
    scrape.write_text(exposition([(h, g, THROTTLED if ip == slow else HEALTHY) for ip, (h, g) in HOSTS.items()]))
    _t, _a, pcap = run("ring-straggler", seed=7)
    r = cli("watch", "--from", pcap, "--inventory", inv, "--dcgm", scrape, ok=(2,))
    cause_lines = [ln.strip() for ln in r.stdout.splitlines() if ln.strip().startswith("cause: ")]
    assert cause_lines and HOSTS[slow][0] in cause_lines[0] and "thermal" in cause_lines[0].lower(), r.stdout
    doc = json.loads(cli("report", pcap, "--json", "--inventory", inv, "--dcgm", scrape).stdout)
    lead = next(f for f in doc["findings"] if f["kind"] == "ring_straggler")
    assert lead["cause"]["verdict"] == "gpu"
    m = build_model(snap, 1.0, ViewState(), limit=5, analysis=doc)
    assert any("cause: " in ln for ln in plain_lines(m, max_findings=20))
    page = tmp_path / "r.html"
    cli("report", pcap, "--inventory", inv, "--dcgm", scrape, "--html", page)
    assert "cause (gpu)" in page.read_text() and lead["cause"]["text"].split(":")[0] in page.read_text()
