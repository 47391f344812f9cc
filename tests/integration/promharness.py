"""A throwaway Prometheus for the fleet tests, and the small helpers they share.

`Prom(workdir, targets)`: the Debian /usr/bin/prometheus on 127.0.0.1 (a free port), a
temporary config and TSDB, the shipped rule files with their 30 s evaluation interval cut to
1 s, scraping `targets` every `scrape_s`. The tests that use it: test_fleet_pernode (live
exporters, one per DPU namespace), test_fleet_views (export --from per node view).
"""
from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

RULES = Path(__file__).resolve().parents[2] / "docs" / "prometheus"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_json(url: str, timeout: float = 5.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def wait_until(fn, timeout: float, what: str, step: float = 0.25):
    """fn() until it returns something true (returned); an AssertionError from fn stops at
    once; other exceptions are retried until the deadline, then reported."""
    end = time.monotonic() + timeout
    last = None
    while time.monotonic() < end:
        try:
            v = fn()
            if v:
                return v
            last = v
        except AssertionError:
            raise
        except Exception as e:  # noqa: BLE001 -- retried until the deadline
            last = e
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def stop_proc(p: subprocess.Popen | None) -> None:
    """SIGTERM, then SIGKILL after 15 s."""
    if p is not None and p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=5)


class Prom:
    """Prometheus on 127.0.0.1 with the shipped rules (evaluated every second)."""

    def __init__(self, workdir: Path, targets: list[str], scrape_s: float = 1.0):
        self.dir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        rules = []
        for name in ("skewscope-rules.yml", "skewscope-alerts.yml"):
            p = workdir / name
            p.write_text((RULES / name).read_text().replace("interval: 30s", "interval: 1s"))
            rules.append(str(p))
        ms = f"{int(scrape_s * 1000)}ms"
        cfg = {"global": {"scrape_interval": ms, "scrape_timeout": ms, "evaluation_interval": "1s"},
               "rule_files": rules,
               "scrape_configs": [{"job_name": "skewscope", "static_configs": [{"targets": targets}]}]}
        self.cfg = workdir / "prometheus.yml"
        self.cfg.write_text(json.dumps(cfg))          # JSON is YAML
        self.proc = None
        self.log = None

    def start(self, ready_timeout: float = 60):
        self.log = open(self.dir / "prometheus.log", "w")
        self.proc = subprocess.Popen(
            ["prometheus", f"--config.file={self.cfg}", f"--storage.tsdb.path={self.dir}/data",
             f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1h", "--log.level=warn"],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_until(self.ready, ready_timeout, "prometheus ready")

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited: {(self.dir / 'prometheus.log').read_text()[-2000:]}")
        return urllib.request.urlopen(self.url + "/-/ready", timeout=1).status == 200

    def query(self, q: str):
        return http_json(f"{self.url}/api/v1/query?query={urllib.parse.quote(q)}")["data"]["result"]

    def stop(self):
        stop_proc(self.proc)
        if self.log:
            self.log.close()


class Backfilled:
    """Prometheus on 127.0.0.1 over a TSDB backfilled from OpenMetrics text (`skewscope export
    --once --format openmetrics`, one file per DPU, concatenated) with `promtool tsdb
    create-blocks-from openmetrics`: no scraping, the samples lie at the files' timestamp
    (query with `skewscope cluster --window all --at T`)."""

    def __init__(self, workdir: Path, om_texts: list[str]):
        self.dir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        body = "".join(t.replace("# EOF\n", "") for t in om_texts) + "# EOF\n"
        self.om = workdir / "backfill.om"
        self.om.write_text(body)
        self.data = workdir / "tsdb"
        self.proc = None
        self.log = None

    def start(self, ready_timeout: float = 60):
        r = subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(self.om), str(self.data)],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        cfg = self.dir / "prometheus-backfilled.yml"
        cfg.write_text("{}")
        self.log = open(self.dir / "prometheus.log", "w")
        self.proc = subprocess.Popen(
            ["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={self.data}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_until(self.ready, ready_timeout, "prometheus ready")

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited: {(self.dir / 'prometheus.log').read_text()[-2000:]}")
        return urllib.request.urlopen(self.url + "/-/ready", timeout=1).status == 200

    def stop(self):
        stop_proc(self.proc)
        if self.log:
            self.log.close()
