"""`--config FILE` (issue 29, deliverable 3): export, watch and top take their settings from
one YAML file; the command line wins; every error is one line naming the file and line.
Ground truth: the values the test writes, read back from the commands' real output (the
exporter's labels, watch's events)."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from genlib import run


def cli(*args, env=None, ok=(0,)):
    import os
    r = subprocess.run([sys.executable, "-m", "skewscope.cli", *map(str, args)], capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, **(env or {})))
    assert r.returncode in ok, (r.returncode, r.stderr[-2000:])
    return r


def labels(text, family):
    return [dict(re.findall(r'(\w+)="([^"]*)"', ln)) for ln in text.splitlines() if ln.startswith(family + "{")]


def test_export_reads_its_section_and_the_common_keys(tmp_path):
    _t, _a, pcap = run("ring-straggler", seed=7)
    inv = tmp_path / "inv.csv"
    inv.write_text("ip,host\n10.0.0.4,gpu-04\n")
    cfg = tmp_path / "skewscope.yaml"
    cfg.write_text(f"inventory: {inv}\nexport:\n  node: dpu-017\n  top-k: 2\nwatch:\n  hold: 5\n")
    out = cli("export", "--from", pcap, "--once", "--config", cfg).stdout
    assert {x["node"] for x in labels(out, "skewscope_exporter_info")} == {"dpu-017"}
    assert len({(x["src"], x["dst"], x["qp"]) for x in labels(out, "skewscope_flow_packets_total")}) == 2
    assert [x["host"] for x in labels(out, "skewscope_inventory_info")] == ["gpu-04"]
    # the command line wins; $SKEWSCOPE_CONFIG is the same as --config
    out2 = cli("export", "--from", pcap, "--once", "--node", "mine", env={"SKEWSCOPE_CONFIG": str(cfg)}).stdout
    assert {x["node"] for x in labels(out2, "skewscope_exporter_info")} == {"mine"}


def test_watch_takes_thresholds_from_the_config(tmp_path):
    _t, _a, pcap = run("ring-straggler", seed=7)
    cfg = tmp_path / "c.yaml"
    # the straggler sends at 0.40x: a threshold of 0.3 (critical below) makes it not critical
    base = json.loads(cli("diagnose", pcap, "--json", ok=(2,)).stdout)
    assert any(f["kind"] == "ring_straggler" and f["severity"] == "critical" for f in base["findings"])
    cfg.write_text("threshold: [ring_straggler.critical=0.3]\n")
    r = cli("watch", "--from", pcap, "--json", "--config", cfg, ok=(0, 1, 2))
    sev = [json.loads(x)["finding"]["severity"] for x in r.stdout.splitlines()
           if '"finding"' in x and '"ring_straggler"' in x]
    assert sev and "critical" not in sev


@pytest.mark.parametrize("text,where,word,cmd", [
    ("export:\n  nodee: x\n", ":2:", "--nodee", "export"),
    ("export:\n  top-k: many\n", ":2:", "top-k", "export"),
    ("bogus: 1\n", ":1:", "--bogus", "watch"),
    ("watch:\n  hold: 1\n  hold: 2\n", ":3:", "twice", "watch"),
    ("export: [1, 2]\n", ":1:", "section", "export"),
    ("export:\n  node: [\n", ":3:", "YAML", "export"),
    ("threshold: [nosuch.warning=1]\n", None, "nosuch", "watch"),     # checked by the registry: names the kind
])
def test_config_errors_are_one_line_naming_the_line(tmp_path, text, where, word, cmd):
    _t, _a, pcap = run("ring-straggler", seed=7)
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(text)
    args = ("export", "--from", pcap, "--once") if cmd == "export" else ("watch", "--from", pcap)
    r = cli(*args, "--config", cfg, ok=(2, 3))
    if cmd == "watch":
        assert r.returncode == 3                       # watch: 2 means critical
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and word in err[0] and "Traceback" not in r.stderr, r.stderr
    assert where is None or f"bad.yaml{where}" in err[0], r.stderr
    assert r.stdout == ""
