"""The alert chain a controller subscribes to, with the real parts: `skewscope export --from`
a generator capture (bearer token on) -> Prometheus (/usr/bin/prometheus: the shipped
recording and alert rules, evaluated every second, `for:` shortened, scraping with the
token) -> Alertmanager (/usr/bin/prometheus-alertmanager, temporary config routing on the
`kind` label, group_wait 1s) -> a webhook receiver (http.server on 127.0.0.1) that must see
SkewscopeHotDestination with kind="hot_destination" and ip = the generator's hot expert, and
no hot-destination alert for any other node.

rate() needs a counter that moves: the exporter first serves the first half of the capture,
then (same port, same node label) the whole capture, so the counters grow by the second
half's traffic, as a live exporter's would. Everything listens on 127.0.0.1 only (the
Alertmanager cluster listener is off) and every process is stopped in finally blocks.
"""
from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from promharness import free_port, wait_until
from promharness import stop_proc as stop

from skewscope import gen as skewgen

AM = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("prometheus") is None,
                                 reason="Debian package prometheus missing (make setup installs it)"),
              pytest.mark.skipif(AM is None,
                                 reason="Debian package prometheus-alertmanager missing (make setup installs it)"),
              pytest.mark.timeout(400)]

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "docs" / "prometheus"
PRESET = "ep-decode-hot-expert"
TOKEN = "am-chain-token"
NODE = "ssam-dpu"


def cut_pcap(src: Path, dst: Path, frames: int) -> None:
    """The first `frames` records of a classic pcap."""
    b = src.read_bytes()
    big = b[:4] in (b"\xa1\xb2\xc3\xd4", b"\xa1\xb2\x3c\x4d")
    fmt = ">IIII" if big else "<IIII"
    off, n = 24, 0
    while off < len(b) and n < frames:
        incl = struct.unpack_from(fmt, b, off)[2]
        off += 16 + incl
        n += 1
    dst.write_bytes(b[:off])


class Receiver:
    """The controller's webhook: keeps every Alertmanager notification."""

    def __init__(self):
        self.posts: list[dict] = []
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.posts.append(json.loads(body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.srv.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}/alerts"
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def alerts(self):
        return [a for p in self.posts for a in p.get("alerts", [])]

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


def start(cmd, log):
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def start_export(pcap, port, tok, log):
    p = start([sys.executable, "-m", "skewscope.cli", "export", "--from", str(pcap), "--listen", f"127.0.0.1:{port}",
               "--node", NODE, "--token-file", str(tok), "--no-analysis", "--top-k", "0"], log)

    def ready():
        if p.poll() is not None:
            raise ExporterExited(f"export exited {p.returncode}")
        req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(req, timeout=2) as r:
            return r.status == 200
    wait_until(ready, 240, "exporter ready")
    return p


class ExporterExited(AssertionError):
    pass


def prom_query(url, q):
    with urllib.request.urlopen(f"{url}/api/v1/query?query={urllib.parse.quote(q)}", timeout=5) as r:
        return json.loads(r.read())["data"]["result"]


def test_hot_destination_alert_reaches_the_webhook_with_kind_and_ip(tmp_path):
    cap = skewgen.write(PRESET, str(tmp_path / "full.pcap"), seed=5)
    truth = cap.truth
    (hot,) = [p for p in truth["pathologies"] if p["kind"] == "hot_destination"]
    hot_ip = hot["magnitude"]["hot"]
    members = hot["magnitude"]["members"]
    cut_pcap(tmp_path / "full.pcap", tmp_path / "half.pcap", len(cap) // 2)
    tok = tmp_path / "token"
    tok.write_text(TOKEN + "\n")

    # the shipped rules: evaluated every second; alert `for:` shortened to 1s
    rule_files = []
    for name in ("skewscope-rules.yml", "skewscope-alerts.yml"):
        text = (RULES / name).read_text().replace("interval: 30s", "interval: 1s")
        text = re.sub(r"(?m)^(\s+for: )\d+[smh]$", r"\g<1>1s", text)
        (tmp_path / name).write_text(text)
        rule_files.append(str(tmp_path / name))
    shipped = (RULES / "skewscope-alerts.yml").read_text()
    assert 'kind: hot_destination' in shipped and 'ip: "{{ $labels.dst }}"' in shipped

    rx = Receiver()
    exp_port, prom_port, am_port = free_port(), free_port(), free_port()
    am_cfg = {
        "route": {"receiver": "default", "group_by": ["alertname", "kind", "ip"], "group_wait": "1s",
                  "group_interval": "1s", "repeat_interval": "1h",
                  "routes": [{"receiver": "controller",
                              "matchers": ['kind=~"hot_destination|alltoall_destination_skew"']}]},
        "receivers": [{"name": "default"},
                      {"name": "controller", "webhook_configs": [{"url": rx.url, "send_resolved": True}]}],
    }
    (tmp_path / "am.yml").write_text(json.dumps(am_cfg))
    prom_cfg = {
        # a loaded CI machine renders /metrics slowly: 1 s scrapes, 1 s timeout
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": rule_files,
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
        "scrape_configs": [{"job_name": "skewscope", "static_configs": [{"targets": [f"127.0.0.1:{exp_port}"]}],
                            "authorization": {"type": "Bearer", "credentials_file": str(tok)}}],
    }
    (tmp_path / "prometheus.yml").write_text(json.dumps(prom_cfg))
    log = open(tmp_path / "chain.log", "w")
    procs = []
    try:
        am = start([AM, f"--config.file={tmp_path / 'am.yml'}", f"--storage.path={tmp_path / 'am'}",
                    f"--web.listen-address=127.0.0.1:{am_port}", "--cluster.listen-address=", "--log.level=warn"], log)
        procs.append(am)
        prom = start(["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
                      f"--storage.tsdb.path={tmp_path / 'prom'}", f"--web.listen-address=127.0.0.1:{prom_port}",
                      "--log.level=warn"], log)
        procs.append(prom)
        purl = f"http://127.0.0.1:{prom_port}"
        wait_until(lambda: urllib.request.urlopen(purl + "/-/ready", timeout=1).status == 200, 60, "prometheus ready")
        wait_until(lambda: urllib.request.urlopen(f"http://127.0.0.1:{am_port}/-/ready", timeout=1).status == 200, 60,
                   "alertmanager ready")

        # round 1: the first half of the capture; Prometheus keeps a few samples of it
        e1 = start_export(tmp_path / "half.pcap", exp_port, tok, log)
        procs.append(e1)
        try:
            wait_until(lambda: prom_query(purl, f'count_over_time(skewscope_peers{{node="{NODE}"}}[1m]) >= 3'), 120,
                       "scrapes of round 1 (with the bearer token)")
        except AssertionError as e:
            with urllib.request.urlopen(purl + "/api/v1/targets", timeout=5) as r:
                tg = [(t["health"], t["lastError"]) for t in json.loads(r.read())["data"]["activeTargets"]]
            raise AssertionError(f"{e}; targets: {tg}") from None
        stop(e1)
        # round 2: the whole capture on the same port: the counters grow by the second half
        e2 = start_export(tmp_path / "full.pcap", exp_port, tok, log)
        procs.append(e2)

        def hot_alert():
            return [a for a in rx.alerts() if a["labels"].get("kind") == "hot_destination"
                    and a["status"] == "firing"]
        got = wait_until(hot_alert, 120, "the hot_destination alert at the webhook", step=0.5)
        a = got[0]
        assert a["labels"]["alertname"] == "SkewscopeHotDestination"
        assert a["labels"]["ip"] == hot_ip == a["labels"]["dst"]
        assert a["labels"]["severity"] == "warning"
        assert hot_ip in a["annotations"]["summary"]
        # no other member is called hot, and only routed kinds reached the controller
        time.sleep(3)
        assert {x["labels"]["ip"] for x in rx.alerts() if x["labels"].get("kind") == "hot_destination"} == {hot_ip}
        assert {x["labels"]["kind"] for x in rx.alerts()} <= {"hot_destination", "alltoall_destination_skew"}
        assert hot_ip in members
    finally:
        for p in reversed(procs):
            stop(p)
        rx.close()
        log.close()
