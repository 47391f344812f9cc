"""Finding events (skewscope.outputs.events, docs/feedback.md) against the generator's truth:

* ids are stable across runs (other seeds: other QPs, jitter), processes (another hash seed)
  and finding order, and name the truth's entity (the same hot node = the same id, another
  hot node = another id);
* the Tracker's lifecycle on sequences of generator-made analyses: healthy -> hot (opened,
  entities = the truth's hot node) -> the same (nothing) -> hotter (updated) -> healthy within
  --hold (nothing) -> healthy past --hold (resolved), on the preset and on variants (node
  counts, bytes, MTU, hot node);
* actions from the truth's entities and magnitudes: rebalance_experts weights = the truth's
  dispatch shares, drain = the truth's slow node, spread_senders = the incast target and
  its senders, check_link = the lossy link;
* the Webhook sender never blocks and counts what it drops (a receiver that never answers)."""
from __future__ import annotations

import copy
import http.server
import json
import os
import random
import subprocess
import sys
import threading
import time

import pytest

import genlib

from skewscope.analysis import analyze
from skewscope.gen.presets import PRESETS
from skewscope.outputs import events as E

_cache: dict = {}


def analysis(sc, seed=0):
    """(truth, analysis) of a preset name or a scenario dict (generated, parsed, analysed)."""
    key = (json.dumps(sc, sort_keys=True) if isinstance(sc, dict) else sc, seed)
    if key not in _cache:
        truth, snap = genlib.get_any(sc, seed)
        _cache[key] = (truth, analyze(snap))
    return _cache[key]


def truth_of(truth, kind):
    ps = [p for p in truth["pathologies"] if p["kind"] == kind]
    assert len(ps) == 1, truth["pathologies"]
    return ps[0]


def hot_variant(nodes=8, node=5, factor=4.0, bytes_per_dest="2KiB", mtu=4096, tokens=6):
    sc = copy.deepcopy(PRESETS["ep-decode-hot-expert"])
    sc.pop("description", None)
    sc["nodes"], sc["mtu"] = nodes, mtu
    sc["workloads"][0]["bytes_per_dest"] = bytes_per_dest
    sc["workloads"][0]["tokens"] = tokens
    sc["pathologies"] = [{"kind": "hot_destination", "node": node, "factor": factor}]
    return sc


def healthy_variant(nodes=8, bytes_per_dest="2KiB", mtu=4096, tokens=6):
    sc = hot_variant(nodes=nodes, bytes_per_dest=bytes_per_dest, mtu=mtu, tokens=tokens)
    sc["pathologies"] = []
    return sc


def of_kind(fs, kind):
    out = [f for f in fs if f["kind"] == kind]
    assert out, (kind, [f["kind"] for f in fs])
    return out


# ---- ids -------------------------------------------------------------------------------------
def test_ids_stable_across_runs_order_and_processes():
    truth, a0 = analysis("ep-decode-hot-expert", 0)
    _, a1 = analysis("ep-decode-hot-expert", 1)           # other QPs, R_Keys, jitter
    hot = truth_of(truth, "hot_destination")["magnitude"]["hot"]
    ids0 = {f["kind"]: E.finding_id(f) for f in a0["findings"]}
    ids1 = {f["kind"]: E.finding_id(f) for f in a1["findings"]}
    assert "hot_destination" in ids0 and ids0 == ids1
    # the id names the truth's hot node, not the QPs
    hd = of_kind(a0["findings"], "hot_destination")[0]
    assert E.finding_key(hd) == [hot]
    assert {f["entities"]["qps"][0] for f in of_kind(a0["findings"], "hot_destination")} != \
        {f["entities"]["qps"][0] for f in of_kind(a1["findings"], "hot_destination")}
    # finding order (and entity order inside) does not matter
    rnd = random.Random(7)
    for _ in range(5):
        fs = copy.deepcopy(a0["findings"])
        rnd.shuffle(fs)
        for f in fs:
            rnd.shuffle(f["entities"]["flows"])
        assert {f["kind"]: E.finding_id(f) for f in fs} == ids0
    # another process with another hash seed computes the same ids from the JSON findings
    code = ("import json,sys; from skewscope.outputs import events as E; "
            "print(json.dumps(sorted(E.finding_id(f) for f in json.load(sys.stdin))))")
    r = subprocess.run([sys.executable, "-c", code], input=json.dumps(a0["findings"]), capture_output=True,
                       text=True, timeout=120, env={**os.environ, "PYTHONHASHSEED": "12345"}, check=True)
    assert json.loads(r.stdout) == sorted(E.finding_id(f) for f in a0["findings"])
    assert all(i.startswith(k + ":") for k, i in ids0.items())


def test_ids_follow_the_entity():
    ta, a = analysis(hot_variant(nodes=6, node=2, bytes_per_dest="4KiB", mtu=1024))
    tb, b = analysis(hot_variant(nodes=6, node=4, bytes_per_dest="4KiB", mtu=1024))
    ha, hb = (truth_of(t, "hot_destination")["magnitude"]["hot"] for t in (ta, tb))
    assert ha != hb
    fa, fb = of_kind(a["findings"], "hot_destination")[0], of_kind(b["findings"], "hot_destination")[0]
    assert E.finding_key(fa) == [ha] and E.finding_key(fb) == [hb]
    assert E.finding_id(fa) != E.finding_id(fb)


# ---- the Tracker -----------------------------------------------------------------------------
@pytest.mark.parametrize("variant", [
    dict(),                                                      # the preset's shape
    dict(nodes=6, node=1, bytes_per_dest="8KiB", mtu=2048),
    dict(nodes=12, node=9, bytes_per_dest="1KiB", mtu=1024, tokens=8),
])
def test_tracker_lifecycle(variant):
    hot_kw = dict(variant)
    base = {k: v for k, v in variant.items() if k != "node"}
    th, a_hot = analysis(hot_variant(factor=4.0, **hot_kw))
    _, a_hot2 = analysis(hot_variant(factor=4.0, **hot_kw), seed=1)
    th3, a_hotter = analysis(hot_variant(factor=16.0, **hot_kw))
    _, a_ok = analysis(healthy_variant(**base))
    hot = truth_of(th, "hot_destination")["magnitude"]["hot"]
    share4 = truth_of(th, "hot_destination")["magnitude"]["dispatch_dest_share"]
    share16 = truth_of(th3, "hot_destination")["magnitude"]["dispatch_dest_share"]
    assert share16 / share4 - 1 > 0.25        # the truth moved materially (the rule's premise)
    assert not [f for f in a_ok["findings"] if f["kind"] == "hot_destination"]

    tr = E.Tracker(hold=10.0, source="test")
    ok_ids = {E.finding_id(f) for f in a_ok["findings"]}
    tr.update(a_ok["findings"], now=100.0)

    evs = [e for e in tr.update(a_hot["findings"], now=101.0) if e["id"] not in ok_ids]
    hd = [e for e in evs if e["finding"]["kind"] == "hot_destination"]
    assert len(hd) == 1 and hd[0]["event"] == "opened"
    assert hd[0]["finding"]["entities"]["ips"][0] == hot
    assert hd[0]["schema"] == E.SCHEMA and hd[0]["first_seen"] == hd[0]["last_seen"] == 101.0
    hid = hd[0]["id"]

    # the same condition again (another seed): no event for it
    assert [e for e in tr.update(a_hot2["findings"], now=102.0) if e["id"] == hid] == []
    # 4x -> 16x: the share moved > 25%: updated, once
    up = [e for e in tr.update(a_hotter["findings"], now=103.0) if e["id"] == hid]
    assert len(up) == 1 and up[0]["event"] == "updated" and up[0]["change"]
    assert up[0]["first_seen"] == 101.0 and up[0]["last_seen"] == 103.0
    assert [e for e in tr.update(a_hotter["findings"], now=104.0) if e["id"] == hid] == []
    # healthy again: nothing within the hold time, resolved once it has passed
    assert [e for e in tr.update(a_ok["findings"], now=113.0) if e["id"] == hid] == []
    res = [e for e in tr.update(a_ok["findings"], now=114.0) if e["id"] == hid]
    assert len(res) == 1 and res[0]["event"] == "resolved"
    assert res[0]["last_seen"] == 104.0 and res[0]["time"] == 114.0
    assert res[0]["finding"]["entities"]["ips"][0] == hot
    assert [e for e in tr.update(a_ok["findings"], now=200.0) if e["id"] == hid] == []
    # back again: a new opened
    again = [e for e in tr.update(a_hot["findings"], now=201.0) if e["id"] == hid]
    assert [e["event"] for e in again] == ["opened"]


def test_tracker_severity_change_is_an_update():
    _, a = analysis("tp-decode-slow-shard")
    f = of_kind(a["findings"], "slow_tp_shard")[0]
    tr = E.Tracker(hold=5)
    assert [e["event"] for e in tr.update([f], now=1.0)] == ["opened"]
    g = copy.deepcopy(f)
    g["severity"] = "warning" if f["severity"] == "critical" else "critical"
    ev = tr.update([g], now=2.0)
    assert [e["event"] for e in ev] == ["updated"] and "severity" in ev[0]["change"]
    # headline within 25%: no update; beyond: update
    h = copy.deepcopy(g)
    h["evidence"]["lag_per_step_s"] *= 1.2
    assert tr.update([h], now=3.0) == []
    h["evidence"]["lag_per_step_s"] *= 1.2               # 1.44x the last emitted value
    assert [e["event"] for e in tr.update([h], now=4.0)] == ["updated"]


# ---- actions ---------------------------------------------------------------------------------
def test_actions_from_the_truth():
    truth, a = analysis("ep-decode-hot-expert")
    mag = truth_of(truth, "hot_destination")["magnitude"]
    act = [x for x in E.actions_for(of_kind(a["findings"], "hot_destination")[0]) if x["type"] == "rebalance_experts"]
    assert len(act) == 1 and act[0]["hot"] == mag["hot"]
    w = act[0]["weights"]
    assert set(w) == set(mag["members"]) and abs(sum(w.values()) - 1) < 1e-3
    assert abs(w[mag["hot"]] - mag["dispatch_dest_share"]) < 0.01
    fair = 1 / len(mag["members"])
    assert abs(act[0]["move_fraction"] - (mag["dispatch_dest_share"] - fair) / mag["dispatch_dest_share"]) < 0.02

    truth, a = analysis("tp-decode-slow-shard")
    slow = truth_of(truth, "slow_tp_shard")["entities"]["ips"][0]
    acts = E.actions_for(of_kind(a["findings"], "slow_tp_shard")[0])
    assert {"type": "drain", "node": slow} in acts

    truth, a = analysis("ring-straggler")
    slow = truth_of(truth, "straggler")["entities"]["ips"][0]
    acts = E.actions_for(of_kind(a["findings"], "ring_straggler")[0])
    assert {"type": "drain", "node": slow} in acts

    truth, a = analysis("incast")
    p = truth_of(truth, "incast")
    dst = p["entities"]["flows"][0][1]
    senders = {fl[0] for fl in p["entities"]["flows"]}
    acts = [x for x in E.actions_for(of_kind(a["findings"], "incast")[0]) if x["type"] == "spread_senders"]
    assert len(acts) == 1 and acts[0]["dst"] == dst and senders <= set(acts[0]["senders"])
    assert acts[0]["max_senders"] == p["magnitude"]["degree"]

    truth, a = analysis("loss")
    src, dst = truth_of(truth, "loss")["entities"]["flows"][0][:2]
    acts = E.actions_for(of_kind(a["findings"], "packet_loss")[0])
    assert {"type": "check_link", "src": src, "dst": dst} in acts
    assert E.actions_for({"kind": "no_such_kind", "entities": {"ips": ["10.0.0.1"]}}) == []


def test_finding_object_shape():
    _, a = analysis("ep-decode-hot-expert")
    for f in a["findings"]:
        o = E.finding_object(f)
        assert set(o) == {"id", "kind", "severity", "entities", "message", "evidence", "impact", "actions", "since", "until"}
        assert set(o["entities"]) == {"ips", "qps", "flows"}
        json.dumps(o)                         # JSON-serialisable as is


# ---- the webhook sender ----------------------------------------------------------------------
class _Slow(http.server.BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802
        self.server.hits += 1
        time.sleep(self.server.delay)
        try:
            self.send_response(204)
            self.end_headers()
        except OSError:
            pass

    def log_message(self, *a):
        pass


def test_webhook_queue_full_drops_are_counted_and_post_never_blocks():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Slow)
    srv.hits, srv.delay = 0, 2.0
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}/ev"
        wh = E.Webhook(url, queue_size=2, timeout=0.3, retries=1, backoff=0.05)
        results = []
        t0 = time.monotonic()
        for i in range(20):
            results.append(wh.post({"n": i}))
        posting = time.monotonic() - t0
        wh.close(timeout=0.5)
        st = wh.stats()
        assert results.count(False) >= 17            # at most 1 in flight + 2 queued
        assert st["dropped_queue_full"] == results.count(False)
        assert st["sent"] == 0 and st["failed"] >= 1 and st["retries"] >= 1
        assert st["sent"] + st["dropped"] == 20
        assert posting < 1.0                          # 20 posts while the receiver sleeps 2 s each
        assert srv.hits >= 1
    finally:
        srv.shutdown()
        srv.server_close()


def test_webhook_url_checks():
    for bad in ("ftp://127.0.0.1/x", "127.0.0.1:8080", "http://", "http://host:99999/x", "not a url"):
        with pytest.raises(E.WebhookURLError):
            E.check_webhook_url(bad)
    assert E.check_webhook_url("https://ctl.example:8443/hook") == "https://ctl.example:8443/hook"


def test_tracker_confirm_keeps_one_analysis_flicker_quiet():
    _, a = analysis("tp-decode-slow-shard")
    f = of_kind(a["findings"], "slow_tp_shard")[0]
    g = copy.deepcopy(f)
    g["severity"] = "warning" if f["severity"] == "critical" else "critical"
    tr = E.Tracker(hold=5, confirm=2)
    assert [e["event"] for e in tr.update([f], now=1.0)] == ["opened"]
    assert tr.update([g], now=2.0) == []              # one analysis of the other severity
    assert tr.update([f], now=3.0) == []              # back: nothing was announced
    assert tr.update([g], now=4.0) == []
    ev = tr.update([g], now=5.0)                      # the second in a row: announced once
    assert [e["event"] for e in ev] == ["updated"] and ev[0]["finding"]["severity"] == g["severity"]
    assert tr.update([g], now=6.0) == []
