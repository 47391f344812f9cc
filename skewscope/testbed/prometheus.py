"""A throwaway Prometheus server (the OS package's /usr/bin/prometheus) for tests, sweeps and
benchmarks: on 127.0.0.1 at a free port, its config and TSDB in a work directory, started and
waited for (/-/ready) in one place, stopped with SIGTERM then SIGKILL.

    with Server(workdir, config={...}) as prom:         # scraping: a config dict (JSON is YAML)
        prom.url
    backfill(om_file, tsdb_dir)                         # promtool tsdb create-blocks-from openmetrics
    with Server(workdir, tsdb=tsdb_dir) as prom: ...    # serve a backfilled TSDB (no scraping)

Callers: tests/integration/promharness.py (fleet tests), tools/sweep_heldout.py (fleet views),
tools/bench/bench_fleet.py.
"""
from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path


class PrometheusError(RuntimeError):
    """Prometheus or promtool failed; the message ends with the tail of its log."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_proc(p: subprocess.Popen | None) -> None:
    """SIGTERM, then SIGKILL after 15 s."""
    if p is not None and p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=5)


def backfill(om: Path, tsdb: Path, timeout: float = 1800) -> None:
    """Blocks in `tsdb` from an OpenMetrics file (must end with `# EOF`)."""
    r = subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(om), str(tsdb)],
                       capture_output=True, text=True, timeout=timeout)
    if r.returncode:
        raise PrometheusError(f"promtool create-blocks-from failed: {(r.stdout + r.stderr)[-1500:]}")


class Server:
    """One Prometheus process. `config`: the configuration (a dict, written as JSON); `tsdb`:
    the storage directory (default workdir/data); `args`: more command-line flags."""

    def __init__(self, workdir: Path, config: dict | None = None, tsdb: Path | None = None,
                 args: tuple[str, ...] = ("--log.level=warn",)):
        self.dir = Path(workdir)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cfg = self.dir / f"prometheus-{self.port}.yml"
        self.cfg.write_text(json.dumps(config or {}))
        self.tsdb = Path(tsdb) if tsdb is not None else self.dir / "data"
        self.logfile = self.dir / "prometheus.log"
        self.args = args
        self.proc: subprocess.Popen | None = None
        self._log = None

    def start(self, ready_timeout: float = 60) -> "Server":
        self._log = open(self.logfile, "w")
        self.proc = subprocess.Popen(
            ["prometheus", f"--config.file={self.cfg}", f"--storage.tsdb.path={self.tsdb}",
             f"--web.listen-address=127.0.0.1:{self.port}", *self.args],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        end = time.monotonic() + ready_timeout
        while not self.ready():
            if time.monotonic() > end:
                self.stop()
                raise PrometheusError(f"prometheus not ready after {ready_timeout:.0f} s: {self.log_tail()}")
            time.sleep(0.2)
        return self

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise PrometheusError(f"prometheus exited ({self.proc.returncode}): {self.log_tail()}")
        try:
            with urllib.request.urlopen(self.url + "/-/ready", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    def log_tail(self, n: int = 1500) -> str:
        try:
            return self.logfile.read_text()[-n:]
        except OSError:
            return ""

    def stop(self) -> None:
        stop_proc(self.proc)
        if self._log:
            self._log.close()
            self._log = None

    def __enter__(self) -> "Server":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
