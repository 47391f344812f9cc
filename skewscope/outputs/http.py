"""The exporter's HTTP server: GET /metrics (Prometheus), GET /v1/findings, GET /v1/load and
GET /v1/mitigations (JSON for controllers: request routers, expert-placement planners,
schedulers).

Light to import (the CLI reads its defaults): the analysis and prometheus_client are
imported where they are used. One stdlib `ThreadingHTTPServer` (daemon threads), read-only: GET and HEAD only (any other
method is 405), 404 for any other path. Optional bearer token (`Server(token=...)`): a
request without `Authorization: Bearer <token>` gets 401; /metrics too unless
`open_metrics` (docs/fleet.md "Exporter HTTP API").

The JSON endpoints serve the last result of an `Analyst` over an analysis runner
(live.runner.AnalysisRunner): `analysis.analyze` (what `diagnose` runs) on the --from file
once, or live on the recent window every K reads of the data plane (live.export.LiveSource),
in a background thread. A new analysis is skipped (and counted) while the previous one still
runs, so the CPU it takes is bounded and /metrics never waits on it.

Schemas (version API_VERSION; docs/fleet.md has them with an example):

    /v1/findings {"version", "node", "source", "status", "counts", "analysed_at",
                  "analysis_seconds", "window": {"first_ts", "last_ts", "duration_s", "clock"},
                  "analyses": {"runs", "skipped", "every", "window_s", "error"},
                  "finding_schema": events.SCHEMA,
                  "findings": [events.finding_object: {"id", "kind", "severity", "entities",
                               "message", "evidence", "impact", "actions", "since", "until"}
                               + "incident" (its incident's id, null for context)],
                  "incidents": [analysis.incidents: {"id", "severity", "kind", "lead",
                                "symptoms", "context" (indices into "findings"), "entities",
                                "impact", "since", "until", "message"}]}
    /v1/load     {"version", "node", "source", "analysed_at", "window",
                  "alltoall": [{"group", "members", "workload", "destinations": [{"ip",
                                "bytes_per_s", "share", "share_all_phases"}], "hot_destination",
                                "max_over_mean"}],
                  "rings": [{"group", "kind", "members", "workload", "lag_s": {ip: s},
                             "slowest": {"ip", "lag_s"} | null (no member lags), "gate_share": {ip: share}}],
                  "instances": [instance_loads rows: {"group", "kind", "members", "size",
                                "bytes", "bytes_per_s", "tokens", "tokens_per_s",
                                "token_interval_s", "busy_share", "message_size_bytes"}]}
    /v1/mitigations {"version", "mitigations": [{"id", "action", "src", "dst", "sport", "dest_qp",
                     "dscp", "rate_bps", "burst", "ttl", "note" (the finding id), "describe",
                     "expires_in", "created_at", "counters", "interface", "direction"}]}: every
                  skewscope mitigation active in the exporter's network namespace, read from the
                  kernel (docs/mitigation.md)
"""
from __future__ import annotations

import gzip
import hmac
import ipaddress
import json
import math
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from skewscope.core.errors import EXIT_USAGE, SkewscopeError
from skewscope.outputs.events import SCHEMA as EVENT_SCHEMA
from skewscope.outputs.events import finding_object

API_VERSION = 1
DEFAULT_EVERY = 5          # live: analyse the window every K reads
DEFAULT_WINDOW_S = 10.0    # live: the analysed window (s)
ANALYSIS_NICE = 10         # the analysis thread's nice value (Linux: per thread)
REQUEST_TIMEOUT_S = 30.0   # a client that sends nothing for this long is dropped
JSON_TYPE = "application/json"
PATHS = ("/metrics", "/v1/findings", "/v1/load", "/v1/mitigations")


class TokenError(SkewscopeError):
    """--token-file unreadable or empty."""

    def __init__(self, msg: str):
        super().__init__(msg, EXIT_USAGE)


def read_token(path: str) -> str:
    """The bearer token: the file's first line, stripped (one line on error)."""
    try:
        with open(path, encoding="utf-8") as fh:
            tok = fh.readline().strip()
    except OSError as e:
        raise TokenError(f"--token-file {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise TokenError(f"--token-file {path}: not text") from None
    if not tok:
        raise TokenError(f"--token-file {path}: empty (put the token on the first line)")
    if any(c.isspace() for c in tok):
        raise TokenError(f"--token-file {path}: the token must not contain spaces")
    return tok


def is_loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False


def clean(x):
    """JSON-safe copy: non-finite floats -> null, numpy scalars -> Python numbers."""
    if isinstance(x, dict):
        return {str(k): clean(v) for k, v in x.items() if not str(k).startswith("_")}
    if isinstance(x, (list, tuple)):
        return [clean(v) for v in x]
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if hasattr(x, "item") and not isinstance(x, (str, bytes)):
        return clean(x.item())
    return x


# ---- the analysis ---------------------------------------------------------------------------
class Analyst:
    """The /v1 documents of an analysis runner (live.runner.AnalysisRunner: the background
    thread, its last good result, `runs`, `skipped`, `error`). Static (a file):
    `start_once(snap)`. Live: the runner is fed by live.export.LiveSource (the window of
    `window_s` seconds, every `every` reads, skipped and counted while one still runs)."""

    def __init__(self, node: str, source: str, runner, every: int = DEFAULT_EVERY,
                 window_s: float = DEFAULT_WINDOW_S):
        self.node, self.source, self.runner = node, source, runner
        self.every, self.window_s = max(1, int(every)), float(window_s)

    @property
    def runs(self) -> int:
        return self.runner.runs

    @property
    def skipped(self) -> int:
        return self.runner.skipped

    @property
    def error(self) -> str | None:
        return self.runner.error

    # a file
    def start_once(self, snap) -> threading.Thread:
        return self.runner.start(snap)

    def result(self) -> dict | None:
        return self.runner.latest()

    # the documents
    def _head(self, res) -> dict:
        return {"version": API_VERSION, "node": self.node, "source": self.source,
                "analysed_at": res["analysed_at"], "analysis_seconds": res["analysis_seconds"],
                "window": res["window"],
                "analyses": {"runs": self.runs, "skipped": self.skipped, "every": self.every,
                             "window_s": self.window_s if self.source == "live" else None,
                             "error": self.error}}

    def findings_doc(self) -> dict | None:
        res = self.result()
        if res is None:
            return None
        a = res["analysis"]
        # each finding's incident id (analysis.incidents) next to the event object's keys
        fs = [{**finding_object(f), "incident": f.get("incident")} for f in a["findings"]]
        counts = {s: sum(1 for f in fs if f["severity"] == s) for s in ("critical", "warning", "info")}
        status = "critical" if counts["critical"] else "warning" if counts["warning"] else "healthy"
        doc = self._head(res)
        doc.update({"status": status, "counts": counts, "finding_schema": EVENT_SCHEMA, "findings": fs,
                    "incidents": a.get("incidents") or []})
        return clean(doc)

    def load_doc(self) -> dict | None:
        res = self.result()
        if res is None:
            return None
        doc = self._head(res)
        doc.update(load_vectors(res["analysis"], res["window"]["duration_s"]))
        return clean(doc)


def load_vectors(a: dict, duration_s: float) -> dict:
    """The load vectors of /v1/load from an analysis document (no recomputation)."""
    from skewscope.analysis.detectors.instances import instance_loads  # heavy (numba: the analysis package)
    dur = float(duration_s or 0)
    a2a, rings = [], []
    for gi, c in enumerate(a["collectives"]):
        m, mem = c["metrics"], list(c["members"])
        if c["kind"] == "all_to_all":
            phase = m.get("dest_bytes") or []
            whole = m.get("matrix_whole")
            col = [sum(row[j] for row in whole) for j in range(len(mem))] if whole else list(phase)
            tp, tw = float(sum(phase)), float(sum(col))
            dests = [{"ip": ip,
                      "bytes_per_s": col[j] / dur if dur > 0 and j < len(col) else None,
                      "share": phase[j] / tp if tp > 0 and j < len(phase) else None,
                      "share_all_phases": col[j] / tw if tw > 0 and j < len(col) else None}
                     for j, ip in enumerate(mem)]
            a2a.append({"group": gi, "members": mem, "workload": m.get("workload"), "destinations": dests,
                        "hot_destination": m.get("hot_destination"),
                        "max_over_mean": (m.get("dest_skew") or {}).get("max_over_mean")})
        elif c["kind"] in ("ring_allreduce", "tree_allreduce"):
            lag = m.get("start_lag_s") or (m.get("decode") or {}).get("member_start_lag_s")
            if not lag:
                continue
            lag = {ip: v for ip, v in lag.items() if v is not None}
            slow = max(lag.items(), key=lambda kv: kv[1]) if lag else None
            slow = slow if slow and slow[1] > 0 else None    # nobody later than the others
            rings.append({"group": gi, "kind": c["kind"], "members": mem, "workload": m.get("workload"),
                          "lag_s": lag, "slowest": {"ip": slow[0], "lag_s": slow[1]} if slow else None,
                          "gate_share": (m.get("gates") or {}).get("share") or {}})
    return {"alltoall": a2a, "rings": rings, "instances": instance_loads(a["collectives"], dur)}


# ---- the server ---------------------------------------------------------------------------
class Server(ThreadingHTTPServer):
    """The exporter's listener (daemon threads; IPv4 or IPv6 by the address)."""
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, addr: str, port: int, registry, analyst: Analyst | None = None,
                 token: str | None = None, open_metrics: bool = False, mitigations=None):
        self.address_family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        self.registry, self.analyst = registry, analyst
        self.mitigations = mitigations     # () -> [active mitigation dicts] (mitigate.software.list_all)
        self.token = token.encode() if token else None
        self.open_metrics = bool(open_metrics)
        super().__init__((addr, port), Handler)

    def handle_error(self, request, client_address):
        """A client that went away is not an error; anything else is one line, no traceback."""
        e = sys.exc_info()[1]
        if isinstance(e, (ConnectionError, TimeoutError)):
            return
        print(f"skewscope export: HTTP request from {client_address[0]} failed: {type(e).__name__}: {e}",
              file=sys.stderr)

    def start(self) -> threading.Thread:
        t = threading.Thread(target=self.serve_forever, name="skewscope-http", daemon=True)
        t.start()
        return t

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class Handler(BaseHTTPRequestHandler):
    server_version = "skewscope"
    protocol_version = "HTTP/1.1"
    timeout = REQUEST_TIMEOUT_S

    def log_message(self, fmt, *args):  # no access log on stderr
        pass

    def _send(self, code: int, body: bytes, ctype: str, extra: dict | None = None, head: bool = False):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _json(self, code: int, doc: dict, extra: dict | None = None, head: bool = False):
        self._send(code, json.dumps(doc, allow_nan=False).encode(), JSON_TYPE, extra, head)

    def _error(self, code: int, msg: str, extra: dict | None = None, head: bool = False):
        self._json(code, {"version": API_VERSION, "error": msg}, extra, head)

    def _authorized(self, path: str) -> bool:
        tok = self.server.token
        if tok is None or (path == "/metrics" and self.server.open_metrics):
            return True
        h = self.headers.get("Authorization", "")
        scheme, _, given = h.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), tok)

    def do_GET(self, head: bool = False):
        path = urlsplit(self.path).path.rstrip("/") or "/"
        if path not in PATHS:
            return self._error(404, f"no such endpoint {path}; try {', '.join(PATHS)}", head=head)
        if not self._authorized(path):
            return self._error(401, "missing or wrong bearer token", {"WWW-Authenticate": 'Bearer realm="skewscope"'},
                               head=head)
        if path == "/metrics":
            from prometheus_client import CONTENT_TYPE_LATEST, generate_latest  # optional (prometheus_client)
            reg = self.server.registry
            body = reg.exposition() if hasattr(reg, "exposition") else generate_latest(reg)
            extra = {}
            if "gzip" in self.headers.get("Accept-Encoding", ""):
                body = gzip.compress(body)
                extra["Content-Encoding"] = "gzip"
            return self._send(200, body, CONTENT_TYPE_LATEST, extra, head)
        if path == "/v1/mitigations":
            if self.server.mitigations is None:
                return self._error(503, "mitigations are not readable here", head=head)
            return self._json(200, {"version": API_VERSION, "mitigations": self.server.mitigations()}, head=head)
        an = self.server.analyst
        doc = None
        if an is not None:
            doc = an.findings_doc() if path == "/v1/findings" else an.load_doc()
        if doc is None:
            if an is None:
                why = "no analysis in this exporter"
            else:
                why = f"analysis failed: {an.error}" if an.error else "analysis pending"
            return self._error(503, why, {"Retry-After": "1"}, head=head)
        return self._json(200, doc, head=head)

    def do_HEAD(self):
        self.do_GET(head=True)

    def _not_allowed(self):
        n = int(self.headers.get("Content-Length") or 0)
        if 0 < n <= 1 << 20:
            self.rfile.read(n)
        self.close_connection = True   # a body we did not read must not become the next request
        self._error(405, "read-only: GET or HEAD", {"Allow": "GET, HEAD", "Connection": "close"})

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _not_allowed
