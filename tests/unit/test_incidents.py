"""Incidents (skewscope.analysis.incidents, docs/metrics.md "Incidents") against the
generator's ground truth and the real captures, not against the code's own output:

* a hot expert (moe-hot-expert; + ECN/CNP on its downlink) is one incident naming the
  truth's hot node, holding both destination-skew kinds and the congestion findings;
* incast + the ECN marks and the CNP storm into the truth's victim are one incident, led by
  the incast;
* a slow TP shard leads; the decode jitter of its group (the shard slow for the first tokens
  only) is under it;
* ring-straggler: one incident, led by the straggler the truth names;
* healthy presets: no incident above info; two or three unrelated pathologies (demo-mix,
  mixed) stay as many incidents, each naming its own truth entity (no over-merging);
* the real hot-destination all-to-all: one incident for 10.77.0.4;
* the structure: every finding in exactly one incident (context: none, listed by each),
  ids = the lead's event id (the same across seeds for the same truth entity), the order,
  `report --json` / `diagnose` / `watch --json` through the CLI."""
from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import genlib

from skewscope.analysis.detectors import registry as R
from skewscope.analysis.incidents import markdown_table
from skewscope.gen.presets import PRESETS
from skewscope.outputs import events as E

ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT.parent / "shared/data/real"
CLI = [sys.executable, "-m", "skewscope.cli"]
SEEDS = (0, 1)
SEV = {"info": 0, "warning": 1, "critical": 2}


def variant(name, add=(), patch=None, **kw):
    """A preset with extra pathologies, its first pathology patched, top-level keys set."""
    sc = copy.deepcopy(PRESETS[name])
    sc.pop("description", None)
    sc.update(kw)
    if patch:
        sc["pathologies"][0].update(patch)
    sc["pathologies"] = sc["pathologies"] + list(add)
    return sc


def analysed(sc, seed):
    truth, a, _ = genlib.run(sc, seed)
    check_structure(a)
    return truth, a


def truth_of(truth, kind):
    (p,) = [p for p in truth["pathologies"] if p["kind"] == kind]
    return p


def incident_of(a, finding):
    (x,) = [x for x in a["incidents"] if x["id"] == finding["incident"]]
    return x


def members(a, x):
    """The findings of an incident: the lead, then the others."""
    return [a["findings"][x["lead"]]] + [a["findings"][j] for j in x["symptoms"]]


def check_structure(a):
    """What every analysis' incidents must be, whatever the traffic."""
    fs, incs = a["findings"], a["incidents"]
    context = [j for j, f in enumerate(fs) if R.kind(f["kind"]).role == "context"]
    seen = []
    for x in incs:
        idx = [x["lead"]] + x["symptoms"]
        seen += idx
        lead = fs[x["lead"]]
        assert x["id"] == E.finding_id(lead) and x["kind"] == lead["kind"]
        assert x["entities"] == lead["entities"]["ips"] and x["impact"] == lead["impact"]
        assert x["severity"] == max((fs[j]["severity"] for j in idx), key=SEV.get)
        assert x["context"] == context
        assert all(fs[j]["incident"] == x["id"] for j in idx)
        roles = [R.kind(fs[j]["kind"]).role for j in idx]
        assert "context" not in roles
        if "cause" in roles:                        # a cause leads when there is one
            assert R.kind(lead["kind"]).role == "cause"
        assert x["message"].startswith(lead["message"])
        for j in x["symptoms"]:
            assert fs[j]["kind"] in x["message"].split(" -- with: ", 1)[1]
    assert sorted(seen) == sorted(set(seen)) == [j for j in range(len(fs)) if j not in context]
    assert all(fs[j]["incident"] is None for j in context)
    assert len({x["id"] for x in incs}) == len(incs)
    keys = [(-SEV[x["severity"]], -((x["impact"] or {}).get("seconds") or 0)) for x in incs]
    assert keys == sorted(keys)


# ---- hot expert --------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("congested", [False, True])
def test_hot_expert_is_one_incident(seed, congested):
    add = [{"kind": "congestion", "into": 5, "ce_fraction": 0.3, "rate_factor": 0.6}] if congested else []
    truth, a = analysed(variant("moe-hot-expert", add=add), seed)
    hot = truth_of(truth, "hot_expert")["entities"]["ips"][0]
    skew = [f for f in a["findings"] if f["kind"] in ("alltoall_destination_skew", "hot_destination")]
    assert {f["kind"] for f in skew} == {"alltoall_destination_skew", "hot_destination"}
    x = incident_of(a, skew[0])
    assert x["entities"][0] == hot and x["kind"] in ("alltoall_destination_skew", "hot_destination")
    got = members(a, x)
    assert {f["kind"] for f in got} >= {"alltoall_destination_skew", "hot_destination"}
    # the ECN marks and CNPs on the hot node's downlink are its symptoms, not an incident of their own
    cong = [f for f in a["findings"] if f["kind"] in ("ecn_congestion", "cnp_storm")]
    if congested:
        assert {f["kind"] for f in cong} == {"ecn_congestion", "cnp_storm"}
        assert all(f["entities"]["ips"][0] == hot for f in cong)
    assert all(f["incident"] == x["id"] for f in cong)
    assert len(a["incidents"]) == 1
    assert x["message"].startswith(a["findings"][x["lead"]]["message"] + " -- with: ")


def test_hot_expert_id_is_stable_across_seeds():
    ids = {analysed("moe-hot-expert", s)[1]["incidents"][0]["id"] for s in SEEDS}
    assert len(ids) == 1
    other = variant("moe-hot-expert")
    other["pathologies"][0]["node"] = 2                 # another hot node: another incident id
    assert analysed(other, 0)[1]["incidents"][0]["id"] not in ids


# ---- incast --------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("congested", [False, True])
def test_incast_ecn_cnp_are_one_incident(seed, congested):
    add = [{"kind": "congestion", "into": 0, "ce_fraction": 0.3, "rate_factor": 0.6}] if congested else []
    truth, a = analysed(variant("incast", add=add), seed)
    victim = {fl[1] for fl in truth_of(truth, "incast")["entities"]["flows"]}
    (victim,) = victim
    (inc,) = [f for f in a["findings"] if f["kind"] == "incast"]
    x = incident_of(a, inc)
    assert a["findings"][x["lead"]] is inc and x["entities"][0] == victim
    into = [f for f in a["findings"] if f["kind"] in ("ecn_congestion", "cnp_storm")]
    if congested:
        assert {f["kind"] for f in into} == {"ecn_congestion", "cnp_storm"}
    for f in into:
        assert f["entities"]["ips"][0] == victim and f["incident"] == x["id"]
    assert len(a["incidents"]) == 1


# ---- a slow TP shard and the decode jitter it causes -----------------------------------------------
@pytest.mark.parametrize("seed", SEEDS)
def test_slow_shard_leads_its_decode_jitter(seed):
    # slow for the first tokens only: the token cadence varies (decode_jitter of the same group)
    truth, a = analysed(variant("tp-decode-slow-shard", patch={"until_ms": 10, "lag_us": 60}), seed)
    shard = truth_of(truth, "slow_tp_shard")["entities"]["ips"][0]
    (slow,) = [f for f in a["findings"] if f["kind"] == "slow_tp_shard"]
    (jit,) = [f for f in a["findings"] if f["kind"] == "decode_jitter"]
    assert slow["entities"]["ips"][0] == shard and jit["group"] == slow["group"]
    x = incident_of(a, slow)
    assert a["findings"][x["lead"]] is slow and jit["incident"] == x["id"]
    assert x["severity"] == "critical" and x["message"].endswith(" -- with: decode_jitter")


@pytest.mark.parametrize("seed", SEEDS)
def test_slow_shard_preset_is_one_incident(seed):
    truth, a = analysed("tp-decode-slow-shard", seed)
    shard = truth_of(truth, "slow_tp_shard")["entities"]["ips"][0]
    (x,) = a["incidents"]
    assert x["kind"] == "slow_tp_shard" and x["entities"][0] == shard


def test_prefill_interference_leads_the_jitter_it_causes():
    truth, a = analysed("tp-decode-prefill", 0)
    kinds = {f["kind"]: f for f in a["findings"]}
    assert {"prefill_interference", "decode_jitter"} <= set(kinds)
    x = incident_of(a, kinds["decode_jitter"])
    assert x["kind"] == "prefill_interference"


# ---- a ring straggler ---------------------------------------------------------------------------
@pytest.mark.parametrize("seed", SEEDS)
def test_ring_straggler_leads_one_incident(seed):
    truth, a = analysed("ring-straggler", seed)
    slow = truth_of(truth, "straggler")["entities"]["ips"][0]
    assert len(a["incidents"]) == 1
    (x,) = a["incidents"]
    assert x["kind"] == "ring_straggler" and x["entities"][0] == slow


# ---- healthy, and no over-merging ----------------------------------------------------------------
@pytest.mark.parametrize("preset", ["ring-healthy", "alltoall-healthy", "tp-decode-healthy"])
@pytest.mark.parametrize("seed", SEEDS)
def test_healthy_has_no_incident_above_info(preset, seed):
    truth, a = analysed(preset, seed)
    assert truth["pathologies"] == []
    assert all(x["severity"] == "info" for x in a["incidents"])


#: truth pathology kind -> (the finding kinds that report it, the node they name first: from
#: the truth's entities)
REPORTED_BY = {"straggler": (("ring_straggler", "straggler"), lambda e: e["ips"][0]),
               "hot_expert": (("alltoall_destination_skew", "hot_destination"), lambda e: e["ips"][0]),
               "congestion": (("ecn_congestion", "cnp_storm"), lambda e: one({fl[1] for fl in e["flows"]})),
               "loss": (("packet_loss", "retransmissions", "nak_errors"), lambda e: one({fl[0] for fl in e["flows"]}))}


def one(xs):
    (x,) = xs
    return x


@pytest.mark.parametrize("preset", ["demo-mix", "mixed"])
@pytest.mark.parametrize("seed", SEEDS)
def test_unrelated_pathologies_stay_apart(preset, seed):
    truth, a = analysed(preset, seed)
    per = {}
    for p in truth["pathologies"]:
        if p["kind"] not in REPORTED_BY:
            continue
        kinds, blamed = REPORTED_BY[p["kind"]]
        ip = blamed(p["entities"])
        fs = [f for f in a["findings"] if f["kind"] in kinds and f["entities"]["ips"][0] == ip]
        assert fs, (p["kind"], ip)
        ids = {f["incident"] for f in fs}
        assert len(ids) == 1, (p["kind"], ids)       # one pathology, one incident
        (per[p["kind"]],) = ids
        assert incident_of(a, fs[0])["entities"][0] == ip
    assert len(per) >= 2 and len(set(per.values())) == len(per)   # as many incidents as pathologies


# ---- real captures -------------------------------------------------------------------------------
real = pytest.mark.skipif(not REAL.is_dir(), reason=f"{REAL} not present")


@real
def test_real_hot_destination_is_one_incident():
    from skewscope.analysis import analyze
    from skewscope.cli.common import load_source
    a = analyze(load_source(str(REAL / "softroce_all_to_all_skew__mirror.pcap.gz")))
    check_structure(a)
    hot = [x for x in a["incidents"] if x["entities"][:1] == ["10.77.0.4"]]   # the README's hot destination
    assert len(hot) == 1
    assert {f["kind"] for f in members(a, hot[0])} == {"alltoall_destination_skew", "hot_destination"}
    assert [x for x in a["incidents"] if x["severity"] != "info"] == hot


@real
@pytest.mark.parametrize("name", ["softroce_ring__mirror.pcap.gz",
                                  "openmpi_softroce_decode_slow_rank__mirror_headers128.pcap.gz"])
def test_real_slow_node_leads(name):
    from skewscope.analysis import analyze
    from skewscope.cli.common import load_source
    a = analyze(load_source(str(REAL / name)))
    check_structure(a)
    top = a["incidents"][0]
    assert top["entities"][0] == "10.77.0.3" and R.kind(top["kind"]).role == "cause"   # README: the slow VM


# ---- through the CLI -----------------------------------------------------------------------------
def cli(*args):
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=900, cwd=ROOT)


def test_cli_report_diagnose_watch():
    sc = variant("moe-hot-expert", add=[{"kind": "congestion", "into": 5, "ce_fraction": 0.3, "rate_factor": 0.6}])
    truth, a, path = genlib.run(sc, 0)
    hot = truth_of(truth, "hot_expert")["entities"]["ips"][0]
    r = cli("report", path, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    check_structure(doc)
    (x,) = doc["incidents"]
    assert x["entities"][0] == hot and len(x["symptoms"]) == 3
    # the per-kind findings stay, with only "incident" added
    for f in doc["findings"]:
        assert list(f) == ["kind", "severity", "entities", "evidence", "message", "group", "impact", "since", "until",
                           "incident"]
    r = cli("diagnose", path, "--json")
    assert r.returncode == 2
    dj = json.loads(r.stdout)
    assert dj["incidents"] == doc["incidents"]
    r = cli("diagnose", path)
    lines = r.stdout.splitlines()
    (k,) = [i for i, ln in enumerate(lines) if ln.startswith("CRITICAL incident ")]
    assert x["id"] in lines[k] and hot in lines[k]
    under = [ln for ln in lines[k + 1:] if ln.startswith("  ") and ":" in ln and ln.strip().split()[0].isupper()]
    assert {ln.split()[1].rstrip(":") for ln in under} == {f["kind"] for f in doc["findings"]}
    # watch: every event carries its finding's incident; human lines put the lead first
    r = cli("watch", "--from", path, "--json")
    evs = [json.loads(ln) for ln in r.stdout.splitlines() if 'finding_event/v1' in ln]
    assert len(evs) == 4 and {e["incident"] for e in evs} == {x["id"]}
    r = cli("watch", "--from", path)
    body = [ln for ln in r.stdout.splitlines() if "OPENED" in ln]
    assert "OPENED" in body[0] and not body[0].startswith(" ") and body[0].split()[3] == x["kind"]
    assert all(ln.startswith("  └ ") for ln in body[1:])


def test_by_incident_keeps_events_of_no_incident_in_place():
    evs = [{"id": "a:1", "incident": "b:1"}, {"id": "c:1", "incident": None}, {"id": "b:1", "incident": "b:1"},
           {"id": "d:1", "incident": "e:1"}]
    got = [(e["id"], n) for e, n in E.by_incident(evs)]
    assert got == [("b:1", False), ("a:1", True), ("c:1", False), ("d:1", False)]


def test_docs_list_every_kind_and_its_root():
    text = (ROOT / "docs" / "metrics.md").read_text()
    assert markdown_table() in text, "docs/metrics.md 'Incidents': paste analysis.incidents.markdown_table()"


def hot_and_congested():
    sc = variant("moe-hot-expert", add=[{"kind": "congestion", "into": 5, "ce_fraction": 0.3, "rate_factor": 0.6}])
    truth, a, path = genlib.run(sc, 1)
    return truth_of(truth, "hot_expert")["entities"]["ips"][0], a, path


def test_top_panel_puts_symptoms_under_their_lead():
    from skewscope.outputs import topview
    hot, a, _ = hot_and_congested()
    rows = topview.finding_rows(a)
    (x,) = a["incidents"]
    assert rows[0] == (0, a["findings"][x["lead"]]) and rows[0][1]["entities"]["ips"][0] == hot
    assert [d for d, _ in rows[1:]] == [1, 1, 1]
    assert {f["kind"] for _, f in rows[1:]} | {rows[0][1]["kind"]} == {f["kind"] for f in a["findings"]}


def test_html_incidents_section_nests_symptoms(tmp_path):
    from skewscope.cli.common import load_source
    from skewscope.outputs import html as H
    hot, a, path = hot_and_congested()
    out = tmp_path / "p.html"
    H.write(str(out), load_source(path), a)
    page = out.read_text()
    assert page.index('<h2 id="incidents">') < page.index('<h2 id="findings">')
    sec = page[page.index('<h2 id="incidents">'):page.index('<h2 id="findings">')]
    (box,) = re.findall(r'<div class="incident critical" id="incident-0">.*?</div>', sec, re.S)
    assert f"on <b>{hot}</b>" in box
    lead = a["findings"][a["incidents"][0]["lead"]]
    # the lead's item, then a nested list holding every other finding of the incident
    outer = re.search(r"<ul><li>(.*)</li></ul>", box, re.S).group(1)
    assert f'<a href="#finding-{a["incidents"][0]["lead"]}">{lead["kind"]}</a>' in outer.split("<ul>")[0]
    nested = outer.split("<ul>", 1)[1]
    assert sorted(re.findall(r'href="#finding-(\d+)"', nested)) == sorted(str(j) for j in a["incidents"][0]["symptoms"])
