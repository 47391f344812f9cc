"""The detector registry (skewscope.analysis.detectors): every kind and threshold declared
once, the docs' tables generated from it, the live subset = the live=True entries, and the
single-node and fleet findings in one schema -- checked against generator ground truth and
matrices built here with a known hot destination / slow ring link."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import genlib

from skewscope.analysis import analyze, live_metrics
from skewscope.analysis import detectors as D
from skewscope.analysis.detectors import actions as A
from skewscope.analysis.detectors.fleet import analyze_matrix
from skewscope.analysis.fleet import from_dense
from skewscope.analysis.findings import DEFAULTS, KINDS, PARAM_SECTIONS, ThresholdError
from skewscope.cli import main
from skewscope.core.errors import EXIT_NOT_RUN, SkewscopeError
from skewscope.outputs import events as E

ROOT = Path(__file__).resolve().parents[2]
BEGIN = "<!-- BEGIN generated"
END = "<!-- END generated -->"
UNITS = {"ratio", "fraction", "bytes", "s", "count", "1/s", "Gb/s", "MADs"}


def test_docs_tables_are_the_registry():
    from skewscope.analysis.detectors.__main__ import DOCS as GENERATED
    from skewscope.analysis.detectors.__main__ import block
    for doc, blocks in GENERATED.items():
        text = (ROOT / doc).read_text()
        for begin, end, gen in blocks:
            a, b = block(text, begin, end)
            assert text[a:b] == gen(), (
                f"{doc} generated block {begin!r} differs from the registry: regenerate the tables with "
                "python -m skewscope.analysis.detectors")


def test_every_kind_declares_its_event_key_headline_actions_and_role():
    from skewscope.outputs.cluster import SEEN_BY_SERIES
    for d in D.REGISTRY:
        for k in d.kinds:
            k.check()                                       # key, headline, actions, role well-formed
            assert k.seen_by in ("", "link", *SEEN_BY_SERIES), (k.name, k.seen_by)
    # every kind a fleet detector emits on node pairs has its drill-down; the rest need none
    for k in ("hot_destination", "incast", "ecn_congestion", "ring_straggler"):
        assert D.registry.kind(k).seen_by


#: presets whose findings cover most kinds (the others: unit tests of their detectors)
KIND_PRESETS = ("demo-mix", "mixed", "slow-link", "incast", "ring-rotating-straggler", "pipeline-bubbles",
                "pd-imbalanced", "pd-slow-link", "tp-decode-slow-shard", "tp-decode-prefill", "tp-decode-instances")


def _preset_findings():
    for name in KIND_PRESETS:
        for f in genlib.analyzed(name)[2]["findings"]:
            yield name, f
    _truth, snap = genlib.get("ring-straggler")
    for f in analyze(genlib.vantage(snap, "10.0.0.3"))["findings"]:     # one DPU's view: late_upstream
        yield "ring-straggler@10.0.0.3", f


def test_event_ids_are_keyed_by_entities_the_findings_have():
    """A kind's event key names entities its findings carry (else every finding of it would
    share one id, or its id would change with the members' order)."""
    seen = set()
    for name, f in _preset_findings():
        k = D.registry.kind(f["kind"])
        seen.add(k.name)
        ips = f["entities"]["ips"]
        ents = set(ips) | {x for fl in f["entities"]["flows"] for x in fl[:2]}
        key = E.finding_key(f)
        assert set(key) <= ents, (name, f["kind"], key)
        if k.key.ips != 0 and ents:          # (a pfc_pause that cannot name the paused port has none)
            assert key, f"{name}: {f['kind']} has no key entities: every finding of it would share one id"
        if k.key.ips:
            assert len(ips) >= k.key.ips, (name, f["kind"], ips)
        assert E.finding_id(f) == E.finding_id({**f, "entities": {**f["entities"], "qps": [], "flows": (
            f["entities"]["flows"] if k.key.flow_ends else [])}})
    assert len(seen) >= 20, sorted(set(KINDS) - seen)


def test_every_kind_can_be_updated_by_numbers_its_findings_carry():
    """A kind that is not context names headline numbers, and its findings carry at least one
    of them (else its events would never say `updated` when the condition worsens)."""
    for d in D.REGISTRY:
        for k in d.kinds:
            assert k.headline or k.role == "context", f"{k.name}: no headline numbers"
    for name, f in _preset_findings():
        k = D.registry.kind(f["kind"])
        if k.headline:
            assert any(h in f["evidence"] for h in k.headline), (name, f["kind"], k.headline, sorted(f["evidence"]))
            o = E.finding_object(f)
            h = next(h for h in k.headline if isinstance(f["evidence"].get(h), (int, float)))
            worse = {**o, "evidence": {**o["evidence"], h: 2 * f["evidence"][h] + 1}}
            assert E.material_change(o, worse), (name, f["kind"], h)


def test_every_kind_and_threshold_declared_once():
    declared = [k.name for d in D.REGISTRY for k in d.kinds]
    assert len(declared) == len(set(declared))
    assert tuple(declared) == KINDS
    for d in D.REGISTRY:
        for k in d.emits:
            assert k in declared, f"{d.name} emits undeclared kind {k}"
        assert d.fn.__doc__ or d.doc, d.name
    keys = [(s, t.name) for s, t in D.registry.all_thresholds()]
    assert len(keys) == len(set(keys))
    for s, t in D.registry.all_thresholds():
        assert t.unit in UNITS, (s, t.name, t.unit)
        assert t.meaning.strip(), (s, t.name)
        assert t.default >= 0
    # DEFAULTS: every kind (with its thresholds, possibly none), then the parameter sections
    assert list(DEFAULTS) == list(KINDS) + list(PARAM_SECTIONS)
    for k in KINDS:
        assert DEFAULTS[k] == {t.name: t.default for t in D.registry.kind(k).thresholds}


def test_fleet_kinds_are_single_node_kinds_and_thresholds_separate():
    fleet_kinds = D.kinds("fleet")
    assert fleet_kinds and set(fleet_kinds) <= set(KINDS)
    fleet_th = D.defaults("fleet")
    node_th = D.defaults("node")
    # the fleet's own numbers stay out of the single-node thresholds (report --json keys)
    assert "min_nodes" in fleet_th["hot_destination"] and "min_nodes" not in node_th["hot_destination"]
    # where the fleet asks the single-node question it reads the single-node number
    assert fleet_th["ring_straggler"]["warning"] == node_th["ring_straggler"]["warning"]
    with pytest.raises(ThresholdError):
        D.resolve_thresholds({"hot_destination.min_nodes": 4})          # fleet-only name, node scope
    assert D.resolve_thresholds({"hot_destination.min_nodes": 4}, scope="fleet")["hot_destination"]["min_nodes"] == 4


def test_threshold_error_is_a_one_line_not_run_error():
    with pytest.raises(ThresholdError) as e:
        D.resolve_thresholds({"ring_straggler.nope": 1})
    assert isinstance(e.value, SkewscopeError) and e.value.code == EXIT_NOT_RUN
    assert "\n" not in str(e.value)


def test_live_subset_is_the_live_entries():
    live = D.detectors("node", live=True)
    assert live, "no live detector"
    for d in live:
        assert d.needs == frozenset({"flows"}), f"live detector {d.name} needs {set(d.needs)}"
    live_kinds = {k for d in live for k in d.all_kinds}
    # generator truth: a lossy link; the live subset finds it from the flow table alone
    truth, snap = genlib.get("loss")
    lossy = {tuple(f) for p in truth["pathologies"] for f in p["entities"].get("flows", [])
             if p["kind"] in ("loss", "packet_loss")}
    assert lossy, truth["pathologies"]
    lm = live_metrics(snap)
    assert lm["findings"] and {f["kind"] for f in lm["findings"]} <= live_kinds
    got = {tuple(x) for f in lm["findings"] if f["kind"] == "packet_loss" for x in f["entities"]["flows"]}
    assert got and got <= lossy
    # and a non-live kind never appears live, even where the full analysis reports it
    truth, snap = genlib.get("ring-straggler")
    assert [f["kind"] for f in analyze(snap)["findings"]] == ["ring_straggler"]
    assert not [f for f in live_metrics(snap, records=True)["findings"] if f["kind"] not in live_kinds]


def test_list_checks_prints_every_threshold_with_unit_and_meaning():
    r = CliRunner().invoke(main, ["diagnose", "--list-checks"])
    assert r.exit_code == 0
    sections, cur = {}, None
    for ln in r.output.splitlines():
        if ln and not ln.startswith(" "):
            cur = sections.setdefault(ln.split()[0], {})
        elif ln.strip():
            name, default, unit, meaning = ln.split(None, 3)
            cur[name] = (float(default), unit, meaning)
    assert set(KINDS) | set(PARAM_SECTIONS) == set(sections)
    for s, ts in D.registry.thresholds("node").items():
        assert set(sections[s]) == set(ts), s
        for n, t in ts.items():
            assert sections[s][n] == (float(t.default), t.unit, t.meaning), (s, n)


class _Fm:
    """A FleetMatrix stand-in (outputs.cluster.FleetMatrix's fields the detectors read)."""

    def __init__(self, ips, bulk, chunk, rate_bps, window_s=60.0):
        n = len(ips)
        z = np.zeros((3, n, n))
        self.ips = ips
        self.window_s = window_s
        self.by_class = {k: z.copy() for k in ("bytes", "packets", "messages", "message_bytes", "busy_seconds",
                                               "timed_message_bytes", "message_wire_seconds", "ce_packets",
                                               "cnp_packets", "retransmitted_packets", "psn_gaps")}
        self.by_class["bytes"][0] = bulk
        self.by_class["bytes"][1] = chunk
        self.by_class["packets"][0] = bulk / 4096
        self.by_class["packets"][1] = chunk / 4096
        self.by_class["timed_message_bytes"][0] = bulk
        with np.errstate(divide="ignore", invalid="ignore"):
            self.by_class["message_wire_seconds"][0] = np.where(bulk > 0, 8 * bulk / np.where(rate_bps > 0, rate_bps, 1), 0)
        self.naks = {"psn_sequence_error": np.zeros((n, n))}
        self.dst_busy_seconds = np.ones(n)
        self.pairs, self.by_class, self.naks = from_dense(self.by_class, self.naks)     # what cluster builds

    @property
    def pair(self):
        return {k: v.sum(axis=0) for k, v in self.by_class.items()}

    def cls(self, name, klass):
        return self.by_class[name][("bulk", "chunk", "control").index(klass)]


def test_fleet_findings_have_the_single_node_schema():
    """A 6-node fleet built here: every node sends chunk bytes to every other, 5x more to
    10.0.0.3 (the hot destination); a bulk ring 1->2->...->6->1 whose link 10.0.0.5->10.0.0.6
    runs at 0.3x the others' rate (the slow link)."""
    ips = [f"10.0.0.{i + 1}" for i in range(6)]
    n = len(ips)
    chunk = np.full((n, n), 1e6)
    chunk[:, 2] *= 5
    np.fill_diagonal(chunk, 0)
    bulk = np.zeros((n, n))
    rate = np.zeros((n, n))
    for i in range(n):
        bulk[i, (i + 1) % n] = 1e9
        rate[i, (i + 1) % n] = 100e9
    rate[4, 5] = 30e9
    doc = analyze_matrix(_Fm(ips, bulk, chunk, rate))
    text = json.dumps(doc, allow_nan=False)
    assert "NaN" not in text
    by = {}
    for f in doc["findings"]:
        assert list(f) == ["kind", "severity", "entities", "evidence", "message", "group", "impact", "since", "until",
                           "incident"]
        assert f["since"] is None and f["until"] is None          # Prometheus series: no onset
        assert list(f["entities"]) == ["ips", "qps", "flows"] and f["entities"]["qps"] == [] and f["group"] is None
        for src, dst, qp in f["entities"]["flows"]:
            assert src in ips and dst in ips and qp is None
        by.setdefault(f["kind"], []).append(f)
    assert by["hot_destination"][0]["entities"]["ips"] == ["10.0.0.3"]
    assert sorted(x[0] for x in by["hot_destination"][0]["entities"]["flows"]) == [ip for ip in ips if ip != "10.0.0.3"]
    st = by["ring_straggler"][0]
    assert st["entities"]["ips"] == ["10.0.0.5", "10.0.0.6"]
    assert st["entities"]["flows"] == [["10.0.0.5", "10.0.0.6", None]]
    assert st["severity"] == "critical"                       # 0.3x < ring_straggler.critical (0.5)
    # the fleet's findings are grouped into incidents too: the hot destination and the slow
    # link are two (the node each names first), each led by its own finding
    inc = {x["id"]: x for x in doc["incidents"]}
    hot = by["hot_destination"][0]
    assert hot["incident"] != st["incident"] and {hot["incident"], st["incident"]} <= set(inc)
    assert inc[st["incident"]]["entities"][0] == "10.0.0.5" and inc[hot["incident"]]["entities"][0] == "10.0.0.3"
    assert sorted(j for x in doc["incidents"] for j in [x["lead"]] + x["symptoms"]) == list(range(len(doc["findings"])))
    # the shared threshold moves the fleet verdict as it moves the single-node one
    doc2 = analyze_matrix(_Fm(ips, bulk, chunk, rate), thresholds={"ring_straggler.critical": 0.2})
    assert [f["severity"] for f in doc2["findings"] if f["kind"] == "ring_straggler"] == ["warning"]
    assert {f["kind"] for f in doc["findings"]} <= set(D.kinds("fleet"))


def test_a_new_kind_is_one_declaration(monkeypatch):
    """What the follow-up work relies on: one Detector with one Kind, and analyze(), --check,
    --threshold, the live subset and the docs table all know it."""
    from skewscope.analysis.detectors import registry as R

    def members_of_rings(inp, em):
        t = inp.th["x_ring_members"]
        for gi, g, r, ev in inp.groups:
            if g.kind == "ring_allreduce" and len(g.members) >= t["min_members"]:
                em.add("x_ring_members", "info", g.members, f"a ring of {len(g.members)}", {"n": len(g.members)},
                       group=gi)

    with pytest.raises(TypeError):                         # no event key, headline, actions, role: no kind
        R.Kind("x_ring_members", fires="a ring", blames="its members")
    det = R.Detector("x_rings", members_of_rings, needs=frozenset({"flows", "groups"}), stage=99,
                     kinds=(R.Kind("x_ring_members", fires="a ring", blames="its members",
                                   thresholds=(R.Threshold("min_members", 3, "count", "ring members, at least"),),
                                   key=R.KEY_MEMBERS, headline=("n",), actions=(A.CHECK_NODE,), role="symptom"),))
    monkeypatch.setattr(R, "REGISTRY", list(R.REGISTRY))
    R.register(det)
    truth, snap = genlib.get("ring-straggler")
    ring = next(g for g in truth["groups"] if g["kind"] == "ring_allreduce")
    full = analyze(snap)
    got = [f for f in full["findings"] if f["kind"] == "x_ring_members"]
    assert len(got) == 1 and set(got[0]["entities"]["ips"]) == set(ring["members"])
    alone = analyze(snap, checks=["x_ring_members"])["findings"]
    # its incident role too: a symptom of the ring's group joins the straggler's incident;
    # checked alone it leads its own
    (lead,) = [f for f in full["findings"] if f["kind"] == "ring_straggler"]
    assert got[0]["incident"] == lead["incident"] and alone[0]["incident"] == E.finding_id(alone[0])
    assert [{k: v for k, v in f.items() if k != "incident"} for f in alone] == \
        [{k: v for k, v in f.items() if k != "incident"} for f in got]
    assert not [f for f in analyze(snap, thresholds={"x_ring_members.min_members": len(ring["members"]) + 1})["findings"]
                if f["kind"] == "x_ring_members"]
    assert "x_ring_members" in D.resolve_checks(None) and "`x_ring_members.min_members`" in R.markdown_tables()
    assert det not in D.detectors("node", live=True)
    with pytest.raises(ValueError):
        R.register(det)                                    # a kind is declared once
    # its events: the id keyed by its members, its action, an `updated` when its headline moves
    f = got[0]
    assert E.finding_key(f) == sorted(ring["members"], key=R.ip_sort_key)
    assert E.actions_for(f) == [{"type": "check_node", "node": f["entities"]["ips"][0]}]
    moved = {**f, "evidence": {"n": 2 * f["evidence"]["n"]}}
    assert E.material_change(f, moved) == f"n {f['evidence']['n']} -> {2 * f['evidence']['n']}"


def test_a_malformed_kind_is_refused():
    from skewscope.analysis.detectors import registry as R
    ok = dict(fires="x", blames="y", key=R.KEY_BLAMED, headline=(), actions=(), role="cause")
    R.Kind("x_ok", **ok).check()
    for bad in ({"role": "culprit"}, {"key": 1}, {"headline": "share"}, {"actions": ("drain",)},
                {"figure": "nope"}):
        with pytest.raises(ValueError):
            R.Kind("x_bad", **{**ok, **bad}).check()
