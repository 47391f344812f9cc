"""The findings contract: JSON shape, thresholds and checks, and `skewscope diagnose`
(exit codes, --json document, bad input)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import genlib

from skewscope.analysis import DEFAULTS, KINDS, ThresholdError, analyze
from skewscope.cli import main

FINDING_KEYS = {"kind", "severity", "entities", "evidence", "message", "group", "impact", "since", "until", "incident"}


def test_json_contract():
    truth, snap, an = genlib.analyzed("demo-mix")
    text = json.dumps(an, allow_nan=False)            # strict JSON: no NaN/inf anywhere
    assert set(an) >= {"collectives", "timing", "findings", "incidents", "metrics"}
    for c in an["collectives"]:
        assert set(c) >= {"kind", "members", "confidence", "metrics"}
    assert set(an["timing"]) >= {"period_s", "period_jitter_s"}
    ips = {x["src"] for x in truth["flows"]} | {x["dst"] for x in truth["flows"]}
    qps = {x["dest_qp"] for x in truth["flows"]}
    for f in an["findings"]:
        assert set(f) == FINDING_KEYS
        assert f["severity"] in ("info", "warning", "critical")
        assert f["kind"] in KINDS
        assert "\n" not in f["message"] and len(f["message"]) < 400
        assert set(f["entities"]["ips"]) <= ips
        assert set(f["entities"]["qps"]) <= qps
        for fl in f["entities"]["flows"]:
            assert fl[0] in ips and fl[1] in ips and fl[2] in qps
    assert "NaN" not in text


def test_checks_filter_and_thresholds_change_outcome():
    truth, snap, an = genlib.analyzed("ring-straggler")
    assert [f["kind"] for f in an["findings"]] == ["ring_straggler"]
    assert an["findings"][0]["severity"] == "critical"
    # only other checks: nothing
    a2 = analyze(snap, checks=["packet_loss", "pfc_pause"])
    assert a2["findings"] == []
    # relax the straggler thresholds: 0.4x is no longer critical, then no longer anything
    a3 = analyze(snap, thresholds={"ring_straggler.critical": 0.3})
    assert a3["findings"][0]["severity"] == "warning"
    a4 = analyze(snap, thresholds={"ring_straggler": {"warning": 0.3, "critical": 0.2, "min_lag_s": 1.0,
                                                      "min_step_lag_s": 1.0}})
    assert a4["findings"] == []
    assert a4["thresholds"]["ring_straggler"]["warning"] == 0.3


def test_threshold_errors():
    truth, snap = genlib.get("ring-healthy")
    for bad in ({"nope.warning": 1}, {"ring_straggler.nope": 1}, {"ring_straggler.warning": "x"},
                {"ring_straggler.warning": -1}, {"ring_straggler": 3}):
        with pytest.raises(ThresholdError):
            analyze(snap, thresholds=bad)
    with pytest.raises(ThresholdError):
        analyze(snap, checks=["not_a_check"])


def test_every_kind_documented():
    doc = (Path(__file__).resolve().parents[2] / "docs/metrics.md").read_text()
    for kind, th in DEFAULTS.items():
        assert f"`{kind}`" in doc, kind
        for name in th:
            assert f"`{kind}.{name}`" in doc, f"{kind}.{name}"


# ---- diagnose ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def snaps(tmp_path_factory):
    d = tmp_path_factory.mktemp("diag")
    out = {}
    for name in ("ring-healthy", "ring-straggler", "moe-hot-expert", "loss"):
        _, snap = genlib.get(name)
        p = d / f"{name}.snap"
        snap.save(p)
        out[name] = str(p)
    return out


def run(args):
    r = CliRunner().invoke(main, ["diagnose"] + args)
    return r.exit_code, r.output


def test_diagnose_exit_codes(snaps):
    assert run([snaps["ring-healthy"]])[0] == 0
    assert run([snaps["moe-hot-expert"]])[0] == 1
    code, out = run([snaps["ring-straggler"]])
    assert code == 2 and "ring_straggler" in out and "10.0.0.4" in out
    # --check narrows, --threshold relaxes
    assert run([snaps["ring-straggler"], "--check", "packet_loss"])[0] == 0
    assert run([snaps["ring-straggler"], "--threshold", "ring_straggler.critical=0.1"])[0] == 1


def test_diagnose_json(snaps):
    code, out = run([snaps["loss"], "--json"])
    doc = json.loads(out)
    assert code == doc["exit_code"] == {"critical": 2, "warning": 1}[doc["status"]]
    worst = max(("info", "warning", "critical").index(f["severity"]) for f in doc["findings"])
    assert doc["status"] == ("info", "warning", "critical")[worst]
    assert set(doc) == {"diagnose_version", "source", "status", "exit_code", "counts", "findings", "incidents",
                        "collectives", "timing", "checks", "thresholds", "capture"}
    assert doc["counts"]["critical"] + doc["counts"]["warning"] + doc["counts"]["info"] == len(doc["findings"])
    assert {f["kind"] for f in doc["findings"]} == {"packet_loss", "retransmissions", "nak_errors"}
    assert doc["collectives"][0]["kind"] == "ring_allreduce"
    assert doc["capture"]["flows"] > 0


@pytest.mark.parametrize("args,msg", [
    (["/nonexistent.snap"], "no such file"),
    (["--threshold", "ring_straggler.bogus=1", "X"], "unknown threshold"),
    (["--check", "bogus", "X"], "unknown check"),
    (["--bogus-option"], "No such option"),
    ([], "give a FILE"),
    (["X", "-i", "lo"], "not both"),
    (["-i", "lo", "--duration", "abc"], "not a duration"),
])
def test_diagnose_bad_input(args, msg, snaps, tmp_path):
    args = [snaps["ring-healthy"] if a == "X" else a for a in args]
    r = CliRunner().invoke(main, ["diagnose"] + args)
    assert r.exit_code == 3, (args, r.output)
    assert msg in r.output
    assert "Traceback" not in r.output
    assert r.output.strip().count("\n") == 0        # one line


def test_diagnose_garbage_file(tmp_path):
    p = tmp_path / "junk.pcap"
    p.write_bytes(b"\x00" * 100)
    r = CliRunner().invoke(main, ["diagnose", str(p)])
    assert r.exit_code == 3 and "Traceback" not in r.output


def test_list_checks():
    r = CliRunner().invoke(main, ["diagnose", "--list-checks"])
    assert r.exit_code == 0
    for kind in KINDS:
        assert kind in r.output


def test_without_message_records():
    """Sampling (or lost records) leaves only the flow counters: classification and the
    volume findings still work from the flow table, timing is null, and it says so."""
    import numpy as np

    from skewscope.core import layout as L
    from skewscope.core.snapshot import Snapshot
    truth, snap = genlib.get("moe-hot-expert")
    s2 = Snapshot(snap.flows, np.zeros(0, L.EVENT_DTYPE), snap.globals, dict(snap.meta, sample_n=8))
    an = analyze(s2)
    assert an["collectives"][0]["kind"] == "all_to_all" and an["timing"] is None
    hot = [f for f in an["findings"] if f["kind"] == "hot_destination"]
    assert hot and hot[0]["entities"]["ips"] == truth["pathologies"][0]["entities"]["ips"]
    assert any(f["kind"] == "sampling" for f in an["findings"])
    json.dumps(an, allow_nan=False)


def test_irregular_timing_is_the_captures_not_the_nodes():
    """When messages of most nodes stall (batched delivery on the capture path, e.g. frames
    replayed through AF_PACKET), no node is blamed for a flapping link; one info says why."""
    import numpy as np

    from skewscope.core.snapshot import Snapshot
    truth, snap = genlib.get("alltoall-healthy")
    ev = snap.events.copy()
    big = ev["bytes"] > 4096
    idx = np.nonzero(big)[0][::3]
    ev["end_ts"][idx] += (ev["end_ts"][idx] - ev["start_ts"][idx]) * 10 + 200_000
    an = analyze(Snapshot(snap.flows, ev, snap.globals, snap.meta))
    assert not [f for f in an["findings"] if f["kind"] == "slow_link"]
    assert any(f["kind"] == "sampling" and f["evidence"].get("irregular_timing") for f in an["findings"])
    # one node's messages stalling both ways is that node's link
    ips = [x["src"] for x in truth["flows"]]
    from skewscope.analysis import context
    s2 = Snapshot(snap.flows, snap.events.copy(), snap.globals, snap.meta)
    ctx = context(s2)
    node = ctx.nodes.ips.index("10.0.0.4")
    ev = s2.events
    f = ev["flow"]
    touch = (f >= 0) & ((ctx.nodes.src[np.maximum(f, 0)] == node) | (ctx.nodes.dst[np.maximum(f, 0)] == node)) & big
    sel = np.nonzero(touch)[0][::3]
    ev2 = ev.copy()
    ev2["end_ts"][sel] += 300_000
    an = analyze(Snapshot(snap.flows, ev2, snap.globals, snap.meta))
    sl = [f for f in an["findings"] if f["kind"] == "slow_link"]
    assert sl and sl[0]["entities"]["ips"] == ["10.0.0.4"]
