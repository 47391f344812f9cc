"""DCGM GPU telemetry for the hosts a finding blames (issue 27, deliverable 2): read the
series of dcgm-exporter (on a BlueField, DOCA Telemetry Service's DCGM provider exports the
same field names and labels) from one of three places:

* a saved scrape file (the exporter's text exposition): instant values, read and validated
  when the source is opened (a bad file is an error before any capture);
* a dcgm-exporter `/metrics` URL: instant values, read when a cause is made;
* a Prometheus base URL (it answers /api/v1/status/buildinfo): the raw samples of each
  finding's window, for the hosts involved only (a `Hostname=~` matcher).

`open_source(spec)` tells them apart. Every failure is a DcgmError (one line, EXIT_NOT_RUN);
telemetry/cause.py turns a failure while reading a URL into a cause that says the telemetry
could not be read (the findings come out anyway).

The Prometheus read is one range-vector selector per finding, `{__name__=~"DCGM_...",
Hostname=~"h1|h2"}[Ds]` evaluated at the window's end: the samples with their own
timestamps. query_range would resample at steps and carry a sample forward for up to the
5 min lookback, so a window without samples would not look empty and "first seen" would be
a step, not a sample.
"""
from __future__ import annotations

import json
import math
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

from skewscope.core.errors import EXIT_NOT_RUN, SkewscopeError
from skewscope.core.textfile import read_text

SM_CLOCK = "DCGM_FI_DEV_SM_CLOCK"                      # MHz
POWER = "DCGM_FI_DEV_POWER_USAGE"                     # W
#: the power limit: the enforced one (the lower of the management and the board limits) when
#: exported, else the management limit
POWER_LIMITS = ("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "DCGM_FI_DEV_POWER_MGMT_LIMIT")
#: the clocks-event reasons bitmask under its DCGM >= 3.3 name and its older name (field 112)
REASONS = ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS")
XID = "DCGM_FI_DEV_XID_ERRORS"                        # gauge: the last XID seen
PCIE_REPLAY = "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"       # counter
NVLINK_ERRORS = ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
                 "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL")
TENSOR = "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"            # ratio 0..1
TEMP = "DCGM_FI_DEV_GPU_TEMP"                         # C
FIELDS = (SM_CLOCK, POWER, *POWER_LIMITS, *REASONS, XID, PCIE_REPLAY, *NVLINK_ERRORS, TENSOR, TEMP)

#: NVML clocks-event (throttle) reason bits (nvmlClocksEventReason*, the DCGM
#: DCGM_CLOCKS_THROTTLE_REASON_* masks are 1:1)
REASON_BITS = {0x1: "GPU idle", 0x2: "applications clocks setting", 0x4: "SW power cap", 0x8: "HW slowdown",
               0x10: "sync boost", 0x20: "SW thermal slowdown", 0x40: "HW thermal slowdown",
               0x80: "HW power brake slowdown", 0x100: "display clock setting"}
#: the bits that lower the clocks of a loaded GPU (the others: idle, a setting, sync boost)
SLOWDOWN_BITS = 0x4 | 0x8 | 0x20 | 0x40 | 0x80

#: labels kept per GPU besides Hostname and gpu
KEEP_LABELS = ("UUID", "modelName", "pod", "namespace", "container")
TIMEOUT_S = 5.0
#: a finding's window is widened by this much each side: dcgm-exporter collects every 30 s by
#: default, so a capture of a few seconds usually holds no sample of its own
WINDOW_PAD_S = 60.0


class DcgmError(SkewscopeError):
    def __init__(self, msg: str):
        super().__init__(msg, EXIT_NOT_RUN)


def decode_reasons(mask: int) -> list[str]:
    """The names of the bits of a clocks-event reasons mask (unknown bits as hex)."""
    mask = int(mask)
    out = [name for bit, name in REASON_BITS.items() if mask & bit]
    rest = mask & ~sum(REASON_BITS)
    if rest:
        out.append(f"reason bits 0x{rest:x}")
    return out


@dataclass
class Readings:
    """DCGM samples by GPU: (Hostname, gpu index) -> field -> [(t, value)] (t: unix s, None
    for an exporter's instant value), sorted by t; `labels` per GPU (UUID, pod, ...)."""
    source: str = ""
    kind: str = ""                 # "file", "exporter" or "prometheus"
    series: dict = field(default_factory=dict)
    labels: dict = field(default_factory=dict)

    def add(self, name: str, labels: dict, t: float | None, v: float) -> None:
        host, gpu = labels.get("Hostname"), labels.get("gpu")
        if not host or gpu is None or not str(gpu).isdigit() or not math.isfinite(v):
            return                 # a sample of no GPU (the fixture's dummy rows have no labels)
        key = (str(host), int(gpu))
        self.series.setdefault(key, {}).setdefault(name, []).append((t, float(v)))
        lab = self.labels.setdefault(key, {})
        for k in KEEP_LABELS:
            if labels.get(k):
                lab.setdefault(k, labels[k])

    def finish(self) -> "Readings":
        for per in self.series.values():
            for name, xs in per.items():
                xs.sort(key=lambda s: -math.inf if s[0] is None else s[0])
        return self

    def gpus(self, host: str) -> list[int]:
        return sorted(g for h, g in self.series if h == host)

    def get(self, host: str, gpu: int, name: str) -> list[tuple]:
        return self.series.get((host, gpu), {}).get(name, [])

    def first_of(self, host: str, gpu: int, names) -> list[tuple]:
        """The samples of the first of `names` that has any (a field under its two names)."""
        for n in names:
            xs = self.get(host, gpu, n)
            if xs:
                return xs
        return []

    def merge(self, other: "Readings") -> None:
        for key, per in other.series.items():
            mine = self.series.setdefault(key, {})
            for name, xs in per.items():
                mine.setdefault(name, []).extend(xs)
        for key, lab in other.labels.items():
            self.labels.setdefault(key, dict(lab))


def parse_exposition(text: str, source: str = "scrape") -> Readings:
    """Readings from a Prometheus text exposition (a dcgm-exporter scrape): the DCGM fields
    skewscope reads, per Hostname and gpu. DcgmError when it is not the text format, or
    holds no DCGM series."""
    from prometheus_client.parser import text_string_to_metric_families  # only when a scrape is read
    r = Readings(source=source, kind="exporter")
    seen = 0
    wanted = set(FIELDS)
    try:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                # the parser names a counter's samples <family>_total whatever the text said;
                # DCGM field names are upper case, so a lower-case _total is the parser's
                name = s.name[:-6] if fam.type == "counter" and s.name.endswith("_total") else s.name
                if name.startswith("DCGM_FI_"):
                    seen += 1
                if name in wanted:
                    r.add(name, s.labels, s.timestamp if s.timestamp is None else float(s.timestamp), s.value)
    except ValueError as e:
        raise DcgmError(f"{source}: not a Prometheus text exposition ({_short(e)})") from None
    if not seen:
        raise DcgmError(f"{source}: no DCGM_FI_* series (is this a dcgm-exporter scrape?)")
    return r.finish()


def _short(e) -> str:
    s = " ".join(str(e).split())
    return s if len(s) <= 120 else s[:117] + "..."


def _get(url: str, timeout: float, form: dict | None = None) -> tuple[int, bytes]:
    """(HTTP status, body) of a GET (a POST of `form`: a query naming a large group's hosts
    can outgrow a URL)."""
    data = urllib.parse.urlencode(form).encode() if form is not None else None
    req = urllib.request.Request(url, data=data, headers={"Accept": "text/plain, application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read(64 << 20)
    except urllib.error.HTTPError as e:
        try:
            return e.code, e.read(1 << 20)        # Prometheus explains a bad query in the body
        except OSError:
            return e.code, b""
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", None) or e
        if isinstance(reason, TimeoutError) or "timed out" in str(reason):
            raise DcgmError(f"{url}: no answer within {timeout:g} s") from None
        raise DcgmError(f"{url}: cannot connect ({_short(reason)})") from None


class ScrapeFile:
    """A saved dcgm-exporter scrape: read and validated when opened."""
    kind = "file"

    def __init__(self, path: str):
        self.spec = path
        text = read_text(path, "the scrape", DcgmError, prefix="--dcgm ")
        try:
            self.readings = parse_exposition(text, path)
        except DcgmError as e:
            raise DcgmError(f"--dcgm {e}") from None
        self.readings.kind = "file"

    def read(self, hosts, start=None, end=None) -> Readings:
        return self.readings


class ExporterUrl:
    """A dcgm-exporter /metrics URL: scraped once per `ttl` seconds (one enrichment of many
    findings reads it once)."""
    kind = "exporter"

    def __init__(self, url: str, timeout: float = TIMEOUT_S, ttl: float = 5.0):
        self.spec, self.timeout, self.ttl = url, timeout, ttl
        self._at, self._readings = -math.inf, None

    def read(self, hosts, start=None, end=None) -> Readings:
        now = time.monotonic()
        if self._readings is None or now - self._at > self.ttl:
            code, body = _get(self.spec, self.timeout)
            if code != 200:
                raise DcgmError(f"{self.spec}: HTTP {code}")
            try:
                text = body.decode("utf-8")
            except UnicodeDecodeError:
                raise DcgmError(f"{self.spec}: the answer is not UTF-8 text") from None
            self._readings, self._at = parse_exposition(text, self.spec), now
        return self._readings


def _re_alt(values) -> str:
    """A PromQL string literal of a regex matching exactly these values."""
    rx = "|".join(re.escape(v) for v in sorted(set(values)))
    return json.dumps(rx)          # a JSON string is a valid PromQL double-quoted string


class PrometheusUrl:
    """A Prometheus holding dcgm-exporter's series: the raw samples of a window."""
    kind = "prometheus"

    def __init__(self, base: str, timeout: float = TIMEOUT_S):
        self.spec = base.rstrip("/")
        self.timeout = timeout

    def query(self, hosts, start: float | None, end: float | None) -> str:
        span = max(1, math.ceil((end - start) if start is not None and end is not None else 2 * WINDOW_PAD_S))
        return "{__name__=~%s,Hostname=~%s}[%ds]" % (_re_alt(FIELDS), _re_alt(hosts), span)

    def read(self, hosts, start=None, end=None) -> Readings:
        r = Readings(source=self.spec, kind="prometheus")
        hosts = [h for h in hosts if h]
        if not hosts:
            return r
        params = {"query": self.query(hosts, start, end)}
        if end is not None:
            params["time"] = f"{end:.3f}"
        code, body = _get(f"{self.spec}/api/v1/query", self.timeout, form=params)
        try:
            doc = json.loads(body)
        except ValueError:
            doc = None
        if not isinstance(doc, dict) or doc.get("status") != "success":
            err = doc.get("error") if isinstance(doc, dict) else None
            raise DcgmError(f"{self.spec}: the DCGM query failed (HTTP {code}{': ' + _short(err) if err else ''})")
        data = doc.get("data") or {}
        for series in data.get("result") or []:
            labels = series.get("metric") or {}
            name = labels.get("__name__", "")
            for t, v in series.get("values") or []:
                try:
                    r.add(name, labels, float(t), float(v))
                except (TypeError, ValueError):
                    continue
        return r.finish()


class Sources:
    """Several --dcgm sources read as one (e.g. one exporter URL or scrape file per host)."""

    def __init__(self, sources: list):
        self.sources = sources
        self.spec = ", ".join(s.spec for s in sources)
        kinds = {s.kind for s in sources}
        self.kind = kinds.pop() if len(kinds) == 1 else "mixed"

    def read(self, hosts, start=None, end=None) -> Readings:
        out = Readings(source=self.spec, kind=self.kind)
        for s in self.sources:
            out.merge(s.read(hosts, start, end))
        return out.finish()


class UrlSource:
    """An http(s) URL whose kind is found on first use: Prometheus when it answers
    /api/v1/status/buildinfo, else a dcgm-exporter scrape (a bare host:port gets /metrics)."""

    #: after a failure, reads within this many seconds fail at once with the same error (one
    #: enrichment of many findings waits for one timeout, not one per finding)
    HOLD_S = 30.0

    def __init__(self, url: str, timeout: float = TIMEOUT_S):
        self.spec, self.timeout = url, timeout
        self._inner = None
        self._failed: tuple[float, DcgmError] | None = None

    @property
    def kind(self) -> str:
        return self._inner.kind if self._inner is not None else "url"

    def resolve(self):
        if self._inner is None:
            u = urllib.parse.urlsplit(self.spec)
            path = u.path.rstrip("/")
            if path.endswith("/metrics"):
                self._inner = ExporterUrl(self.spec, self.timeout)
                return self._inner
            base = urllib.parse.urlunsplit((u.scheme, u.netloc, path, "", ""))
            code, body = _get(base + "/api/v1/status/buildinfo", self.timeout)
            is_prom = False
            if code == 200:
                try:
                    is_prom = json.loads(body).get("status") == "success"
                except (ValueError, AttributeError):
                    is_prom = False
            self._inner = (PrometheusUrl(base, self.timeout) if is_prom
                           else ExporterUrl(base + "/metrics" if not path else self.spec, self.timeout))
        return self._inner

    def read(self, hosts, start=None, end=None) -> Readings:
        now = time.monotonic()
        if self._failed is not None and now - self._failed[0] < self.HOLD_S:
            raise self._failed[1]
        try:
            out = self.resolve().read(hosts, start, end)
        except DcgmError as e:
            self._failed = (now, e)
            raise
        self._failed = None
        return out


def open_source(specs, timeout: float = TIMEOUT_S):
    """The source of --dcgm (one spec or several): an http(s) URL (kind found on first use)
    or a local scrape file (read now: DcgmError when missing or not a scrape)."""
    if isinstance(specs, str):
        specs = [specs]
    out = []
    for spec in specs:
        spec = str(spec).strip()
        if re.match(r"^https?://", spec, re.I):
            out.append(UrlSource(spec, timeout))
        elif "://" in spec:
            raise DcgmError(f"--dcgm {spec}: use an http(s) URL (dcgm-exporter /metrics or a Prometheus) or a file")
        elif os.path.isdir(spec):
            raise DcgmError(f"--dcgm {spec}: is a directory (give a saved dcgm-exporter scrape)")
        else:
            out.append(ScrapeFile(spec))
    if not out:
        raise DcgmError("--dcgm: nothing given")
    return out[0] if len(out) == 1 else Sources(out)
