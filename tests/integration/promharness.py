"""A throwaway Prometheus for the fleet tests, and the small helpers they share.

`Prom(workdir, targets)`: the Debian /usr/bin/prometheus on 127.0.0.1 (a free port), a
temporary config and TSDB, the shipped rule files with their 30 s evaluation interval cut to
1 s, scraping `targets` every `scrape_s`. The tests that use it: test_fleet_pernode (live
exporters, one per DPU namespace), test_fleet_views (export --from per node view).
"""
from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from pathlib import Path

from skewscope.testbed.prometheus import PrometheusError, Server, backfill, free_port, stop_proc  # noqa: F401 (re-exported)

RULES = Path(__file__).resolve().parents[2] / "docs" / "prometheus"


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


class _Ready:
    def ready(self) -> bool:
        """Prometheus answers /-/ready; its exit is an AssertionError (wait_until stops at once)."""
        try:
            return Server.ready(self)
        except PrometheusError as e:
            raise AssertionError(str(e)) from None

    def query(self, q: str):
        return http_json(f"{self.url}/api/v1/query?query={urllib.parse.quote(q)}")["data"]["result"]


class Prom(_Ready, Server):
    """Prometheus on 127.0.0.1 with the shipped rules (evaluated every second)."""

    def __init__(self, workdir: Path, targets: list[str], scrape_s: float = 1.0):
        rules = []
        for name in ("skewscope-rules.yml", "skewscope-alerts.yml"):
            p = workdir / name
            p.write_text((RULES / name).read_text().replace("interval: 30s", "interval: 1s"))
            rules.append(str(p))
        ms = f"{int(scrape_s * 1000)}ms"
        cfg = {"global": {"scrape_interval": ms, "scrape_timeout": ms, "evaluation_interval": "1s"},
               "rule_files": rules,
               "scrape_configs": [{"job_name": "skewscope", "static_configs": [{"targets": targets}]}]}
        super().__init__(workdir, cfg, args=("--storage.tsdb.retention.time=1h", "--log.level=warn"))


class Backfilled(_Ready, Server):
    """Prometheus on 127.0.0.1 over a TSDB backfilled from OpenMetrics text (`skewscope export
    --once --format openmetrics`, one file per DPU, concatenated) with `promtool tsdb
    create-blocks-from openmetrics`: no scraping, the samples lie at the files' timestamp
    (query with `skewscope cluster --window all --at T`)."""

    def __init__(self, workdir: Path, om_texts: list[str]):
        body = "".join(t.replace("# EOF\n", "") for t in om_texts) + "# EOF\n"
        self.om = workdir / "backfill.om"
        self.om.write_text(body)
        super().__init__(workdir, tsdb=workdir / "tsdb")

    def start(self, ready_timeout: float = 60):
        backfill(self.om, self.tsdb, timeout=300)
        return super().start(ready_timeout)
