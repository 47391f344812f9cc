"""`skewscope watch` (docs/feedback.md) as a user runs it (subprocesses), against the
generator's truth and `skewscope diagnose`:

* `watch --from` on generator presets (hot expert, slow TP shard, ring straggler, at other
  node counts/MTUs too): one `opened` event per finding diagnose reports (same ids), the
  event's entities and actions = the generator's truth, the exit code = diagnose's; NDJSON
  parses line by line, the stats line last;
* webhooks: a real HTTP receiver on 127.0.0.1 gets every event, with the bearer token of
  --token-file, as application/json; two receivers both; a bad URL is one stderr line and
  the watch goes on; a receiver that sleeps or is down: the watch still finishes in bounded
  time and reports its drops and retries (stderr and the stats line);
* the reference consumer (docs/examples/consumer.py) on real output: NDJSON through a pipe,
  and as the webhook receiver; a real capture from ../shared/data/real;
* argument errors exit 3 (2 means critical here)."""
from __future__ import annotations

import copy
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from frames import REAL_DATA

from skewscope import gen as skewgen
from skewscope.gen.presets import PRESETS
from skewscope.outputs import events as E

ROOT = Path(__file__).resolve().parents[2]
CONSUMER = ROOT / "docs" / "examples" / "consumer.py"
CLI = [sys.executable, "-m", "skewscope.cli"]


def cli(*args, timeout=900, **kw):
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=ROOT, **kw)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("watch")


_pcaps: dict = {}


def pcap(work, sc, seed=0):
    """(path, truth) of a preset name or scenario dict, written once per module."""
    key = (json.dumps(sc, sort_keys=True), seed)
    if key not in _pcaps:
        path = work / f"w{len(_pcaps)}.pcap"
        cap = skewgen.write(copy.deepcopy(sc), str(path), seed=seed, snaplen=128)
        _pcaps[key] = (path, cap.truth)
    return _pcaps[key]


_diag: dict = {}


def diagnose(path):
    if path not in _diag:
        r = cli("diagnose", path, "--json")
        assert r.returncode in (0, 1, 2), r.stderr
        _diag[path] = (r.returncode, json.loads(r.stdout))
    return _diag[path]


def ndjson(text):
    lines = [json.loads(x) for x in text.splitlines() if x.strip()]   # every line parses alone
    assert lines and lines[-1]["schema"] == E.STATS_SCHEMA and lines[-1]["event"] == "stats"
    evs = lines[:-1]
    assert all(e["schema"] == E.SCHEMA for e in evs)
    return evs, lines[-1]


def variant(name, **kw):
    sc = copy.deepcopy(PRESETS[name])
    sc.pop("description", None)
    for k, v in kw.items():
        if k in ("nodes", "mtu", "iterations"):
            sc[k] = v
        elif k == "node":
            sc["pathologies"][0]["node"] = v
        else:
            sc["workloads"][0][k] = v
    return sc


CASES = [
    # (scenario, truth pathology kind, finding kind, action check)
    ("ep-decode-hot-expert", "hot_destination", "hot_destination", "rebalance_experts"),
    (variant("ep-decode-hot-expert", nodes=6, node=2, mtu=2048, bytes_per_dest="4KiB"),
     "hot_destination", "hot_destination", "rebalance_experts"),
    ("tp-decode-slow-shard", "slow_tp_shard", "slow_tp_shard", "drain"),
    (variant("tp-decode-slow-shard", nodes=6, node=4, mtu=2048), "slow_tp_shard", "slow_tp_shard", "drain"),
    ("ring-straggler", "straggler", "ring_straggler", "drain"),
]


@pytest.mark.parametrize("sc,tkind,fkind,action", CASES, ids=lambda x: x if isinstance(x, str) else "variant")
def test_watch_from_file_events_are_the_truth(work, sc, tkind, fkind, action):
    path, truth = pcap(work, sc)
    code, doc = diagnose(path)
    r = cli("watch", "--from", path, "--json")
    assert r.returncode == code, r.stderr
    evs, stats = ndjson(r.stdout)
    assert stats["events"] == len(evs) == len(doc["findings"]) and stats["dropped"] == 0
    assert all(e["event"] == "opened" for e in evs)
    assert sorted(e["id"] for e in evs) == sorted(E.finding_id(f) for f in doc["findings"])
    assert [e["finding"]["kind"] for e in evs if e["finding"]["severity"] != "info"]
    p = [x for x in truth["pathologies"] if x["kind"] == tkind][0]
    blamed = p["magnitude"]["hot"] if tkind == "hot_destination" else p["entities"]["ips"][0]
    mine = [e for e in evs if e["finding"]["kind"] == fkind]
    assert len(mine) == 1, [e["finding"]["kind"] for e in evs]
    ev = mine[0]
    assert ev["finding"]["entities"]["ips"][0] == blamed
    acts = [a for a in ev["finding"]["actions"] if a["type"] == action]
    assert acts and (acts[0].get("hot") or acts[0].get("node")) == blamed
    # source times of the file (the generator's model time 0 = 2025-01-01T00:00:00Z)
    assert 1735689600.0 <= ev["first_seen"] <= ev["last_seen"] < 1735689600.0 + 60
    # human lines: one per event (plus its action line), the same exit code
    h = cli("watch", "--from", path)
    assert h.returncode == code
    opened = [x for x in h.stdout.splitlines() if " OPENED " in x]
    assert len(opened) == len(evs) and any(blamed in x and fkind in x for x in opened)


class Receiver:
    """http.server on 127.0.0.1 in a thread: records (headers, body) of every POST;
    `delay` seconds before answering; `status` to answer."""

    def __init__(self, delay=0.0, status=204):
        rec = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with rec.lock:
                    rec.got.append((dict(self.headers), body))
                time.sleep(rec.delay)
                try:
                    self.send_response(rec.status)
                    self.end_headers()
                except OSError:
                    pass

            def log_message(self, *a):
                pass

        self.got, self.lock, self.delay, self.status = [], threading.Lock(), delay, status
        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.srv.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}/events"
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_webhooks_receive_every_event_with_the_token(work):
    path, truth = pcap(work, "ep-decode-hot-expert")
    code, _ = diagnose(path)
    tok = work / "token"
    tok.write_text("s3cret-token\n")
    a, b = Receiver(), Receiver()
    try:
        r = cli("watch", "--from", path, "--json", "--webhook", a.url, "--webhook", "ftp://127.0.0.1/nope",
                "--webhook", b.url, "--token-file", tok)
    finally:
        a.close()
        b.close()
    assert r.returncode == code, r.stderr
    evs, stats = ndjson(r.stdout)
    bad = [x for x in r.stderr.splitlines() if "ftp://127.0.0.1/nope" in x]
    assert len(bad) == 1 and "ignored" in bad[0]
    for rec in (a, b):
        assert [json.loads(body) for _, body in rec.got] == evs          # every event, in order
        for hdr, _ in rec.got:
            h = {k.lower(): v for k, v in hdr.items()}
            assert h["authorization"] == "Bearer s3cret-token"
            assert h["content-type"] == "application/json"
    assert [w["sent"] for w in stats["webhooks"]] == [len(evs), len(evs)] and stats["dropped"] == 0


def test_slow_and_down_receivers_do_not_stall_the_watch(work):
    path, _ = pcap(work, "ep-decode-hot-expert")
    code, doc = diagnose(path)
    n = len(doc["findings"])
    assert n >= 2
    t0 = time.monotonic()
    base = cli("watch", "--from", path, "--json")
    plain_s = time.monotonic() - t0
    slow = Receiver(delay=120.0)
    down = f"http://127.0.0.1:{free_port()}/events"
    try:
        t0 = time.monotonic()
        r = cli("watch", "--from", path, "--json", "--webhook", slow.url, "--webhook", down,
                "--webhook-timeout", "0.5", "--webhook-retries", "2", "--drain", "2")
        took = time.monotonic() - t0
    finally:
        slow.close()
    assert r.returncode == code == base.returncode, r.stderr
    evs, stats = ndjson(r.stdout)
    assert [e["id"] for e in evs] == [e["id"] for e in ndjson(base.stdout)[0]]   # stdout unaffected
    # a receiver that sleeps 120 s per event would hold a stalled watch >= 120 s longer than
    # the same run without webhooks (the margin is for a loaded machine)
    assert took < plain_s + 60
    ws, wd = stats["webhooks"]
    assert ws["url"] == slow.url and wd["url"] == down
    assert ws["sent"] == 0 and ws["failed"] >= 1 and ws["sent"] + ws["dropped"] == n
    assert wd["sent"] == 0 and wd["dropped"] == n and wd["failed"] >= 3 and wd["retries"] >= 2
    assert stats["dropped"] == ws["dropped"] + wd["dropped"]
    err = r.stderr.splitlines()
    assert any(down in x and "retrying" in x for x in err)
    assert any(down in x and f"{n} dropped" in x for x in err)         # the final summary line
    assert all("Traceback" not in x for x in err)


def test_consumer_on_watch_output(work):
    path, truth = pcap(work, "ep-decode-hot-expert")
    hot = [p for p in truth["pathologies"] if p["kind"] == "hot_destination"][0]["magnitude"]
    w = cli("watch", "--from", path, "--json")
    c = subprocess.run([sys.executable, str(CONSUMER)], input=w.stdout, capture_output=True, text=True, timeout=60)
    assert c.returncode == 0, c.stderr
    fair = 1 / len(hot["members"])
    pct = round(100 * (hot["dispatch_dest_share"] - fair) / hot["dispatch_dest_share"])
    lines = c.stdout.splitlines()
    assert any(f"would move {pct}% of expert traffic off {hot['hot']}" in x for x in lines), lines
    assert lines[-1].startswith("stats: ")

    path, truth = pcap(work, "tp-decode-slow-shard")
    slow = [p for p in truth["pathologies"] if p["kind"] == "slow_tp_shard"][0]["entities"]["ips"][0]
    w = cli("watch", "--from", path, "--json")
    c = subprocess.run([sys.executable, str(CONSUMER)], input=w.stdout, capture_output=True, text=True, timeout=60)
    assert f"would drain {slow}" in c.stdout


def test_consumer_as_webhook_receiver(work):
    path, truth = pcap(work, "tp-decode-slow-shard")
    slow = [p for p in truth["pathologies"] if p["kind"] == "slow_tp_shard"][0]["entities"]["ips"][0]
    _, doc = diagnose(path)
    tok = work / "ctok"
    tok.write_text("abc\n")
    port = free_port()
    srv = subprocess.Popen([sys.executable, str(CONSUMER), "--listen", f"127.0.0.1:{port}", "--token-file", str(tok),
                            "--max-events", str(len(doc["findings"]))],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        # a wrong token is refused (401), counted as a failed, dropped event by watch
        bad = work / "badtok"
        bad.write_text("wrong\n")
        r = cli("watch", "--from", path, "--json", "--webhook", f"http://127.0.0.1:{port}/", "--token-file", bad,
                "--webhook-retries", "0")
        assert ndjson(r.stdout)[1]["webhooks"][0]["dropped"] == len(doc["findings"])
        r = cli("watch", "--from", path, "--json", "--webhook", f"http://127.0.0.1:{port}/", "--token-file", tok)
        out, err = srv.communicate(timeout=60)
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait()
    assert ndjson(r.stdout)[1]["webhooks"][0]["sent"] == len(doc["findings"])
    assert srv.returncode == 0
    assert f"would drain {slow}" in out


def test_consumer_on_a_real_capture():
    f = REAL_DATA / "softroce_write_pair__headers128.pcap"
    if not f.exists():
        pytest.skip(f"real capture missing: {f}")
    code, doc = diagnose(str(f))
    w = cli("watch", "--from", f, "--json")
    assert w.returncode == code
    evs, stats = ndjson(w.stdout)
    assert sorted(e["id"] for e in evs) == sorted(E.finding_id(x) for x in doc["findings"])
    c = subprocess.run([sys.executable, str(CONSUMER)], input=w.stdout, capture_output=True, text=True, timeout=60)
    assert c.returncode == 0 and len(c.stdout.splitlines()) == len(evs) + 1


@pytest.mark.parametrize("args", [
    ["watch"],
    ["watch", "--from", "x.pcap", "-i", "lo"],
    ["watch", "--from", "x.pcap", "--bogus"],
    ["watch", "-i", "lo", "--direction", "egress"],
])
def test_argument_errors_exit_3(args):
    r = cli(*args)
    assert r.returncode == 3 and len(r.stderr.strip().splitlines()) == 1 and r.stdout == ""


def test_unreadable_file_exits_3_one_line(work):
    bad = work / "bad.pcap"
    bad.write_bytes(b"not a capture at all")
    r = cli("watch", "--from", bad, "--json")
    assert r.returncode == 3 and len(r.stderr.strip().splitlines()) == 1 and r.stdout == ""
    r = cli("watch", "--from", work / "missing.pcap", "--token-file", work / "missing.tok")
    assert r.returncode == 3 and len(r.stderr.strip().splitlines()) == 1
    assert os.path.exists(bad)


def test_prometheus_unreachable_is_one_line_exit_3():
    r = cli("watch", "--prometheus", f"http://127.0.0.1:{free_port()}", "--json", "--timeout", "2")
    assert r.returncode == 3 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and "Prometheus" in r.stderr
