"""`skewscope cluster`: the fleet's traffic matrix, skew and findings from Prometheus.

Every DPU runs `skewscope export`; one Prometheus scrapes them all. This module queries
the Prometheus HTTP API (instant queries, urllib only), builds the node-level matrices and
runs the fleet detectors (`analysis.fleet`, on top of the analysis package's statistics),
and returns a document with the shape of `report --json`:

  {"source": URL, "meta": {...}, "totals": {...}, "pfc": {...},
   "flows": [one per (src, dst) pair, dest_qp null],
   "collectives": [...], "timing": null, "findings": [...], "metrics": {...}}

Queries. A pair (src, dst) is exported by the DPUs of both ends; `max by (src, dst)` keeps
one value per pair (the larger view). With --window 5m (the recording rules' window) and
the rules of docs/prometheus/skewscope-rules.yml loaded, the pair matrix is read from the
recorded `src_dst:...:rate5m` series (one sample per pair, already deduplicated) times the
window; otherwise from `increase(raw[window])`. `--window all` reads the counters as they
are (totals since each exporter started: for `export --from FILE` demos). Drill-down
queries (which DPUs saw a finding's pair, at what rate) touch only that pair's series.
"""
from __future__ import annotations

import ipaddress
import json
import math
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from skewscope.core import layout as L
from skewscope.core.errors import EXIT_USAGE, SkewscopeError
from skewscope.core.snapshot import Snapshot, ip_bytes
from skewscope.outputs import metrics as M
from skewscope.outputs import report as R
from skewscope.outputs.report import fmt_bytes
from skewscope.core.when import Clock

RULE_WINDOW = "5m"
#: drill-down queries for seen_by: at most this many findings (bounded cost)
MAX_DRILLDOWNS = 32
OVERFLOW = M.OVERFLOW_LABEL

# name in the matrix -> raw counter (outputs.metrics, the metric table); the recorded
# series is src_dst_class:<counter without _total>:rate5m (docs/prometheus/skewscope-rules.yml)
PAIR_SERIES = (
    ("bytes", M.PEER_BYTES),
    ("packets", M.PEER_PACKETS),
    ("messages", M.PEER_MESSAGES),
    ("message_bytes", M.PEER_MESSAGE_BYTES),
    ("busy_seconds", M.PEER_BUSY_SECONDS),
    ("timed_message_bytes", M.PEER_TIMED_MESSAGE_BYTES),
    ("message_wire_seconds", M.PEER_MESSAGE_WIRE_SECONDS),
    ("ce_packets", M.PEER_CE_PACKETS),
    ("cnp_packets", M.PEER_CNP_PACKETS),
    ("retransmitted_packets", M.PEER_RETRANSMITTED_PACKETS),
    ("psn_gaps", M.PEER_PSN_GAPS),
)
CLASSES = M.CLASSES
SYNDROMES = M.SYNDROMES
# the recorded series `skewscope cluster` reads with --window 5m (rule_name, below)
PAIR_LEVEL = "src_dst_class"
_DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")
_UNIT_S = {"ms": 1e-3, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


class ClusterError(SkewscopeError):
    """Prometheus unreachable or answering nonsense, or a bad --window/--selector."""


def window_seconds(window: str) -> float | None:
    """'5m' -> 300.0; '1h30m' -> 5400.0; 'all' -> None. ClusterError on anything else."""
    w = window.strip()
    if w == "all":
        return None
    if not _DURATION.match(w):
        raise ClusterError(f"invalid --window {window!r}: use a Prometheus duration like 30s, 5m, 1h "
                           "(or 'all')", EXIT_USAGE)
    total = sum(int(n) * _UNIT_S[u] for n, u in re.findall(r"(\d+)(ms|s|m|h|d|w|y)", w))
    if total <= 0:
        raise ClusterError(f"invalid --window {window!r}: must be > 0", EXIT_USAGE)
    return float(total)


# ---- the HTTP API client --------------------------------------------------------------
class Prometheus:
    """Minimal Prometheus HTTP API client (instant queries) on urllib."""

    def __init__(self, url: str, timeout: float = 30.0):
        u = urllib.parse.urlsplit(url.strip())
        if u.scheme not in ("http", "https") or not u.netloc:
            raise ClusterError(f"invalid --prometheus {url!r}: expected http://HOST:PORT", EXIT_USAGE)
        self.base = url.strip().rstrip("/")
        self.timeout = float(timeout)
        self.queries = 0
        self.samples = 0
        self.seconds = 0.0

    def _post(self, path: str, params: dict) -> dict:
        data = urllib.parse.urlencode(params).encode()
        req = urllib.request.Request(self.base + path, data=data, method="POST",
                                     headers={"Content-Type": "application/x-www-form-urlencoded",
                                              "Accept": "application/json"})
        t0 = time.monotonic()
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                body = r.read()
        except urllib.error.HTTPError as e:
            body = e.read()
            try:
                doc = json.loads(body)
                msg = doc.get("error") or body[:200].decode(errors="replace")
            except (ValueError, AttributeError):
                msg = body[:200].decode(errors="replace").strip() or e.reason
            raise ClusterError(f"Prometheus at {self.base} refused the query (HTTP {e.code}): {msg}") from None
        except urllib.error.URLError as e:
            reason = getattr(e, "reason", e)
            raise ClusterError(f"cannot reach Prometheus at {self.base}: {reason}") from None
        except (TimeoutError, OSError) as e:
            raise ClusterError(f"cannot reach Prometheus at {self.base}: {e}") from None
        finally:
            self.seconds += time.monotonic() - t0
        try:
            doc = json.loads(body)
        except ValueError:
            raise ClusterError(f"{self.base} did not answer with JSON: is it a Prometheus server?") from None
        if doc.get("status") != "success":
            raise ClusterError(f"Prometheus query failed: {doc.get('errorType', '?')}: {doc.get('error', '?')}")
        return doc["data"]

    def query(self, expr: str, at: float | None = None) -> list[tuple[dict, float]]:
        """Instant query -> [(labels, value)] (NaN/Inf values dropped)."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self._post("/api/v1/query", params)
        self.queries += 1
        if data.get("resultType") == "scalar":
            return [({}, float(data["result"][1]))]
        if data.get("resultType") != "vector":
            raise ClusterError(f"unexpected Prometheus result type {data.get('resultType')!r} for {expr!r}")
        out = []
        for r in data["result"]:
            v = float(r["value"][1])
            if math.isfinite(v):
                out.append((r["metric"], v))
        self.samples += len(out)
        return out


# ---- the fleet matrix ----------------------------------------------------------------
def rule_name(metric: M.MetricSpec, extra: str = "") -> str:
    """The recording rule over a per-pair counter: src_dst_class[extra]:<base>:rate5m."""
    return M.recorded(PAIR_LEVEL + extra, metric)


@dataclass
class FleetMatrix:
    """Node-level matrices over `ips` (sorted): counts over the window (or totals), sparse:
    `pairs` (analysis.fleet.Pairs) are the (src, dst) node pairs any series names, and
    by_class[name][c, k]: from ips[pairs.src[k]] to ips[pairs.dst[k]] in traffic class
    CLASSES[c]. Memory and work grow with the pairs, linearly in a fleet of groups (a dense
    n x n matrix was 2 GiB at 2,000 nodes: docs/fleet.md "Measured at scale")."""
    ips: list
    pairs: object                  # analysis.fleet.Pairs over ips
    by_class: dict                 # name -> (3, P) float64
    naks: dict                     # syndrome -> (P,), all classes
    dst_busy_seconds: np.ndarray   # (n,)
    window_s: float | None
    at: float
    via_rules: bool
    dpus: list = field(default_factory=list)
    stale_dpus: list = field(default_factory=list)
    frames: dict = field(default_factory=dict)
    pfc: dict = field(default_factory=dict)
    flows_evicted: float = 0.0
    records_lost: float = 0.0
    # per-node timing (analysis.nodeview via the exporters' skewscope_node_* histograms):
    # (ip, role) -> {"dpu", "hist": {family: (bounds, cum, sum)}, "peers": {peer: {"arrival"|
    # "start": (bounds, cum, sum)}}, "steps", "collectives", "iterations"}
    timing: dict = field(default_factory=dict)
    # (src, dst, class) -> DPUs exporting the pair (count by ... of the raw series)
    exported_by: dict = field(default_factory=dict)
    clock: str = "unsynchronised"
    # (n,): union of each source's outgoing data messages (NaN: no DPU exported it)
    src_busy_seconds: np.ndarray | None = None

    @property
    def n(self) -> int:
        return len(self.ips)

    @cached_property
    def pair(self) -> dict:
        """name -> (P,) over all classes (computed once)."""
        return {k: v.sum(axis=0) for k, v in self.by_class.items()}

    def cls(self, name: str, klass: str) -> np.ndarray:
        return self.by_class[name][CLASSES.index(klass)]


def _sel(selector: str, *more: str) -> str:
    parts = [p for p in (selector.strip().strip("{}").strip(), *more) if p]
    return "{" + ", ".join(parts) + "}" if parts else ""


def _ip_sort_key(s: str):
    try:
        a = ipaddress.ip_address(s)
        return (a.version, a.packed)
    except ValueError:
        return (99, s.encode())


#: the duration families of the per-node timing (metric, key in FleetMatrix.timing hist)
TIMING_FAMILIES = ((M.NODE_FORWARD_LATENCY, "forward_latency"), (M.NODE_OWN_LAG, "own_lag"), (M.NODE_STEP, "step"),
                   (M.NODE_COLLECTIVE, "collective"), (M.NODE_ITERATION, "iteration"))
TIMING_PEER_FAMILIES = ((M.NODE_ARRIVAL_OFFSET, "arrival"), (M.NODE_START_OFFSET, "start"))
#: the roles whose per-peer offset buckets the fusion reads (analysis.detectors.fleet RING_ROLES)
RING_PEER_ROLES = ("ring", "tp_decode")
CLOCKS = ("unsynchronised", "ptp")
#: --clock ptp: a DPU whose last read is older than this (its own clock vs ours) is stale
STALE_S = 120.0


def _le(v: str) -> float:
    return math.inf if v == "+Inf" else float(v)


class Fetcher:
    def __init__(self, prom: Prometheus, window: str, selector: str = "", use_rules: bool = True,
                 clock: str = "unsynchronised", at: float | None = None):
        if clock not in CLOCKS:
            raise ClusterError(f"invalid --clock {clock!r}: one of {', '.join(CLOCKS)}", EXIT_USAGE)
        self.clock = clock
        self.prom = prom
        self.window = window
        self.window_s = window_seconds(window)
        self.selector = selector
        self.at = time.time() if at is None else float(at)
        self.via_rules = False
        if use_rules and self.window_s is not None and self.window_s == window_seconds(RULE_WINDOW) \
                and not selector.strip():
            probe = prom.query(f"count({rule_name(M.PEER_BYTES)})", at=self.at)
            self.via_rules = bool(probe) and probe[0][1] > 0

    def _raw(self, metric: M.MetricSpec, by: str, extra_sel: str = "", inner_by: str | None = None) -> str:
        sel = _sel(self.selector, extra_sel)
        if self.window_s is None:
            e = f"{metric.name}{sel}"
        else:
            e = f"increase({metric.name}{sel}[{self.window}])"
        if inner_by:
            e = f"sum by ({inner_by}) ({e})"
        return f"max by ({by}) ({e})"

    def pair_values(self, metric: M.MetricSpec, by: str = "src, dst, class", extra: str = "") -> list[tuple[dict, float]]:
        if self.via_rules:
            return [(m, v * self.window_s) for m, v in self.prom.query(rule_name(metric, extra), at=self.at)]
        return self.prom.query(self._raw(metric, by, f'src!="{OVERFLOW}"'), at=self.at)

    def scalar_by(self, metric: M.MetricSpec, by: str, agg: str = "sum") -> list[tuple[dict, float]]:
        sel = _sel(self.selector)
        e = f"{metric.name}{sel}" if self.window_s is None else f"increase({metric.name}{sel}[{self.window}])"
        return self.prom.query(f"{agg} by ({by}) ({e})", at=self.at)

    def fetch(self) -> FleetMatrix:
        sel = _sel(self.selector)
        info = self.prom.query(f"max by (node) ({M.LAST_READ_TIMESTAMP_SECONDS.name}{sel})", at=self.at)
        if not info:
            raise ClusterError(f"Prometheus at {self.prom.base} has no skewscope series"
                               f"{' matching ' + sel if sel else ''}: is it scraping `skewscope export`?")
        dpus = sorted(m.get("node", "?") for m, _ in info)
        if self.clock == "ptp":
            # synchronised clocks: a DPU's own read time may be compared with ours
            stale = sorted(m.get("node", "?") for m, v in info if self.at - v > STALE_S)
        elif self.window_s is None:
            stale = []      # --window all: file exporters (one read) never advance, by design
        else:
            # no clock sync: only Prometheus' clock -- a DPU whose reads stopped advancing
            # over the last STALE_S (its read-time gauge did not change while scraped)
            ch = self.prom.query(f"max by (node) (changes({M.LAST_READ_TIMESTAMP_SECONDS.name}{sel}"
                                 f"[{int(STALE_S)}s]))", at=self.at)
            cnt = {m.get("node", "?"): v for m, v in self.prom.query(
                f"max by (node) (count_over_time({M.LAST_READ_TIMESTAMP_SECONDS.name}{sel}[{int(STALE_S)}s]))",
                at=self.at)}
            # stale: scraped at least 3 times in the last STALE_S and the read time never moved
            stale = sorted(m.get("node", "?") for m, v in ch if v == 0 and cnt.get(m.get("node", "?"), 0) >= 3)
        raw = {}
        for name, metric in PAIR_SERIES:
            raw[name] = self.pair_values(metric)
        nak = self.pair_values(M.PEER_NAKS, "src, dst, class, syndrome", "_syndrome")
        if self.via_rules:
            dbusy = [(m, v * self.window_s) for m, v in
                     self.prom.query(M.recorded("dst", M.DESTINATION_BUSY_SECONDS), at=self.at)]
        else:
            dbusy = self.prom.query(self._raw(M.DESTINATION_BUSY_SECONDS, "dst",
                                              f'dst!="{OVERFLOW}"'), at=self.at)
        from skewscope.analysis.fleet import Pairs  # the analysis package: loaded once a fleet is fetched
        ips = set()
        for rows in list(raw.values()) + [nak]:
            for m, _ in rows:
                if "src" in m and "dst" in m:
                    ips.add(m["src"])
                    ips.add(m["dst"])
        ips = sorted(ips, key=_ip_sort_key)
        pos = {ip: i for i, ip in enumerate(ips)}
        n = len(ips)
        # the pairs a value lands on; every other pair of the n x n matrix is 0
        cell = {name: [(CLASSES.index(m["class"]), pos[m["src"]], pos[m["dst"]], v) for m, v in rows
                       if m.get("src") in pos and m.get("dst") in pos and m.get("class") in CLASSES]
                for name, rows in raw.items()}
        nak_cell = [(m["syndrome"], pos[m["src"]], pos[m["dst"]], v) for m, v in nak
                    if m.get("syndrome") in SYNDROMES and m.get("src") in pos and m.get("dst") in pos]
        ends = [(i, j) for rows in cell.values() for _, i, j, _ in rows] + [(i, j) for _, i, j, _ in nak_cell]
        pairs = Pairs.of(n, [i for i, _ in ends], [j for _, j in ends])
        pair = {}
        for name, rows in cell.items():
            a = np.zeros((len(CLASSES), len(pairs)))
            if rows:
                c, i, j, v = (np.array(x) for x in zip(*rows))
                a[c.astype(np.int64), pairs.find(i, j)] = v
            pair[name] = a
        naks = {s: np.zeros(len(pairs)) for s in SYNDROMES}
        at = pairs.find([i for _, i, _, _ in nak_cell], [j for _, _, j, _ in nak_cell])
        for (s, _, _, v), k in zip(nak_cell, at.tolist()):
            naks[s][k] += v
        db = np.zeros(n)
        for m, v in dbusy:
            if m.get("dst") in pos:
                db[pos[m["dst"]]] = v
        # a source's own DPU sees all its sends: the largest view of its busy time
        sb = np.full(n, np.nan)
        for m, v in self.prom.query(self._raw(M.SOURCE_BUSY_SECONDS, "src", f'src!="{OVERFLOW}"'), at=self.at):
            if m.get("src") in pos:
                sb[pos[m["src"]]] = v
        frames = {m.get("category", "?"): v for m, v in self.scalar_by(M.FRAMES, "category")}
        pfc = {}
        for metric, key in ((M.PFC_PAUSE_FRAMES, "pause"), (M.PFC_RESUME_FRAMES, "resume"),
                            (M.PFC_PAUSE_QUANTA, "quanta")):
            for m, v in self.scalar_by(metric, "priority"):
                pfc.setdefault(int(m.get("priority", 0)), {})[key] = v
        ev = self.scalar_by(M.FLOWS_EVICTED, "node")
        lost = self.scalar_by(M.MESSAGE_RECORDS_LOST, "node")
        not_over = f'src!="{OVERFLOW}"'
        exported_by = {(m.get("src"), m.get("dst"), m.get("class")): v for m, v in self.prom.query(
            f"count by (src, dst, class) ({M.PEER_BYTES.name}{_sel(self.selector, not_over)})", at=self.at)}
        return FleetMatrix(ips=ips, pairs=pairs, by_class=pair, naks=naks, dst_busy_seconds=db, src_busy_seconds=sb,
                           window_s=self.window_s, at=self.at,
                           via_rules=self.via_rules, dpus=dpus, stale_dpus=stale, frames=frames, pfc=pfc,
                           flows_evicted=sum(v for _, v in ev), records_lost=sum(v for _, v in lost),
                           timing=self.fetch_timing(), exported_by=exported_by, clock=self.clock)

    def _agg(self, name: str, by: str, extra_sel: str = "") -> list[tuple[dict, float]]:
        sel = _sel(self.selector, extra_sel)
        e = f"{name}{sel}" if self.window_s is None else f"increase({name}{sel}[{self.window}])"
        return self.prom.query(f"sum by ({by}) ({e})", at=self.at)

    def fetch_timing(self) -> dict:
        """The per-node timing histograms, one query per family part (buckets, sum): every
        DPU's own durations and offsets; (ip, role) -> FleetMatrix.timing entry."""
        out: dict = {}

        def entry(m):
            k = (m.get("ip"), m.get("role"))
            if None in k:
                return None
            return out.setdefault(k, {"dpu": m.get("node", "?"), "hist": {}, "peers": {},
                                      "steps": 0.0, "collectives": 0.0, "iterations": 0.0})

        def hist_of(rows, sums, keyf):
            acc: dict = {}
            for m, v in rows:
                acc.setdefault(keyf(m), {})[_le(m.get("le", "+Inf"))] = v
            sm = {keyf(m): v for m, v in sums}
            res = {}
            for k, d in acc.items():
                les = sorted(d)
                fin = [x for x in les if math.isfinite(x)]
                cum = np.array([d[x] for x in les], dtype=np.float64)
                res[k] = (np.array(fin), np.maximum.accumulate(cum), sm.get(k, 0.0))
            return res

        for spec, key in TIMING_FAMILIES:
            rows = self._agg(spec.name + "_bucket", "node, ip, role, le")
            sums = self._agg(spec.name + "_sum", "node, ip, role")
            for (node, ip, role), h in hist_of(rows, sums, lambda m: (m.get("node"), m.get("ip"),
                                                                    m.get("role"))).items():
                e = entry({"node": node, "ip": ip, "role": role})
                if e is not None:
                    e["hist"][key] = h
        ring_like = "|".join(RING_PEER_ROLES)
        for spec, key in TIMING_PEER_FAMILIES:
            # signed offsets: the exporter keeps no _sum (buckets and count only). Their
            # buckets are read for the ring-like roles only (the fusion's upstream offsets);
            # for the others (all-to-all, kv) who the peers are and their counts are all that
            # is used, and their buckets were half of the samples of a 1,000-node fleet
            # (tools/bench/bench_fleet.py): the +Inf bucket alone
            rows = self._agg(spec.name + "_bucket", "node, ip, role, peer, le",
                             f'peer!="{OVERFLOW}", role=~"{ring_like}"')
            rows += self._agg(spec.name + "_bucket", "node, ip, role, peer, le",
                              f'peer!="{OVERFLOW}", role!~"{ring_like}", le="+Inf"')
            sums = []
            for (node, ip, role, peer), h in hist_of(rows, sums, lambda m: (m.get("node"), m.get("ip"),
                                                                          m.get("role"), m.get("peer"))).items():
                e = entry({"node": node, "ip": ip, "role": role})
                if e is not None and peer:
                    e["peers"].setdefault(peer, {})[key] = h
        for spec, key in ((M.NODE_STEPS, "steps"), (M.NODE_COLLECTIVES, "collectives"),
                          (M.NODE_ITERATIONS, "iterations")):
            for m, v in self._agg(spec.name, "node, ip, role"):
                e = entry(m)
                if e is not None:
                    e[key] = v
        return out

    def pair_observers(self, fd: dict) -> list[dict]:
        """seen_by of a node-pair finding: per DPU and pair of the finding, its own count of
        the finding's counter (one drill-down query, only those pairs' series)."""
        metric = SEEN_BY_SERIES[seen_by(fd["kind"])]
        pairs = {(a, b) for a, b, _ in fd["entities"]["flows"]}
        if not pairs:
            return []
        esc = lambda s: re.escape(s).replace("\\", "\\\\").replace('"', '\\"')  # noqa: E731
        srcs = "|".join(sorted({esc(a) for a, _ in pairs}))
        dsts = "|".join(sorted({esc(b) for _, b in pairs}))
        sel = _sel(self.selector, f'src=~"{srcs}", dst=~"{dsts}"')
        e = f"{metric.name}{sel}" if self.window_s is None else f"increase({metric.name}{sel}[{self.window}])"
        rows = []
        for m, v in self.prom.query(f"sum by (node, src, dst) ({e})", at=self.at):
            if (m.get("src"), m.get("dst")) in pairs and v > 0:
                rows.append({"dpu": m.get("node", "?"), "ip": None, "pair": [m.get("src"), m.get("dst")],
                             "saw": metric.name, "value": v})
        return sorted(rows, key=lambda r: (r["pair"], r["dpu"]))

    def observers(self, src: str, dst: str, klass: str = "bulk") -> list[dict]:
        """Each DPU's own view of one pair: bytes, rate over active time (drill-down query)."""
        esc = lambda s: s.replace("\\", "\\\\").replace('"', '\\"')  # noqa: E731
        pair_sel = f'src="{esc(src)}", dst="{esc(dst)}", class="{esc(klass)}"'
        out = {}
        for key, metric in (("bytes", M.PEER_BYTES), ("timed_message_bytes", M.PEER_TIMED_MESSAGE_BYTES),
                            ("message_wire_seconds", M.PEER_MESSAGE_WIRE_SECONDS)):
            sel = _sel(self.selector, pair_sel)
            e = f"{metric.name}{sel}" if self.window_s is None else \
                f"increase({metric.name}{sel}[{self.window}])"
            for m, v in self.prom.query(f"sum by (node) ({e})", at=self.at):
                out.setdefault(m.get("node", "?"), {})[key] = v
        rows = []
        for node in sorted(out):
            d = out[node]
            w = d.get("message_wire_seconds", 0.0)
            rate = 8.0 * d.get("timed_message_bytes", 0.0) / w if w > 0 else None
            rows.append({"node": node, "dpu": node, "bytes": round(d.get("bytes", 0.0)), "rate_bps": rate})
        return rows


# ---- document ---------------------------------------------------------------------------
#: the counter a node-pair finding's seen_by reports per DPU, by its Kind's `seen_by` (the
#: FleetMatrix series name; "link" is Fetcher.observers of evidence.link instead)
SEEN_BY_SERIES = {**dict(PAIR_SERIES), "naks": M.PEER_NAKS}


def seen_by(kind: str) -> str:
    """The kind's drill-down (detector registry, Kind.seen_by): a SEEN_BY_SERIES name,
    "link", or "" (none; also for a kind the registry does not know)."""
    from skewscope.analysis.detectors import registry  # heavy (numpy, the analysis package)
    try:
        return registry.kind(kind).seen_by
    except KeyError:
        return ""


def snapshot_of(fm: FleetMatrix, url: str) -> Snapshot:
    """The fleet matrix as a Snapshot whose flows are the (src, dst) pairs (dest_qp 0), so
    that report.to_dict gives the `report --json` shape. Counts are rounded to integers."""
    tot = fm.pair
    nz = np.nonzero(tot["packets"] + tot["bytes"] > 0)[0]
    f = np.zeros(len(nz), dtype=L.FLOW_DTYPE)
    t1 = int(fm.at * 1e9)
    t0 = int((fm.at - fm.window_s) * 1e9) if fm.window_s else 0
    cols = {"bytes": "bytes", "packets": "packets", "messages": "messages",
            "msg_bytes": "message_bytes", "ce": "ce_packets", "cnp": "cnp_packets",
            "retransmissions": "retransmitted_packets", "psn_gaps": "psn_gaps"}
    si, di = fm.pairs.src[nz], fm.pairs.dst[nz]
    addr = np.zeros((len(fm.ips), 16), dtype=np.uint8)     # once per node (of a pair here), not per pair
    ver = np.zeros(len(fm.ips), dtype=np.int64)
    for i in np.unique(np.concatenate([si, di])).tolist():
        b, ver[i] = ip_bytes(fm.ips[i])
        addr[i] = np.frombuffer(b, np.uint8)
    f["src"], f["dst"], f["ipver"], f["roce"] = addr[si], addr[di], ver[si], 2
    for col, name in cols.items():
        f[col] = np.round(tot[name][nz])                      # half to even, as round()
    f["nak_seq"] = np.round(fm.naks["psn_sequence_error"][nz])
    f["nak_rnr"] = np.round(fm.naks["rnr"][nz])
    f["nak_other"] = np.round(fm.naks["other"][nz])
    f["first_ts"], f["last_ts"] = t0, t1
    order = np.lexsort((f["dst"].view(">u8").reshape(-1, 2)[:, 1], f["dst"].view(">u8").reshape(-1, 2)[:, 0],
                        f["src"].view(">u8").reshape(-1, 2)[:, 1], f["src"].view(">u8").reshape(-1, 2)[:, 0])) \
        if len(f) else np.zeros(0, np.int64)
    f = f[order]
    g = np.zeros(L.G_N, dtype=np.uint64)
    for i, cat in enumerate(L.CATEGORY_NAMES):
        g[i] = int(round(fm.frames.get(cat, 0.0)))
    g[L.G_FRAMES] = int(g[:L.G_NCAT].sum())
    for p, d in fm.pfc.items():
        if 0 <= p < 8:
            g[L.G_PFC_PAUSE + p] = int(round(d.get("pause", 0.0)))
            g[L.G_PFC_XON + p] = int(round(d.get("resume", 0.0)))
            g[L.G_PFC_QUANTA + p] = int(round(d.get("quanta", 0.0)))
    meta = {
        "source": "prometheus",
        "prometheus": url,
        "window": "all" if fm.window_s is None else fm.window_s,
        "at": fm.at,
        "first_ts": t0,
        "last_ts": t1,
        "duration_s": fm.window_s or 0.0,
        "clock": "unix",
        "via_recording_rules": fm.via_rules,
        "dpus": fm.dpus,
        "stale_dpus": fm.stale_dpus,
        "nodes": len(fm.ips),
        "flows_are": "node pairs (src, dst): max over the DPUs that export the pair",
        "flows_evicted": int(round(fm.flows_evicted)),
        "events_lost": int(round(fm.records_lost)),
        "note_totals": "frame and PFC totals add every DPU's view: a frame seen by two DPUs counts twice",
    }
    return Snapshot(flows=f, events=np.zeros(0, L.EVENT_DTYPE), globals=g, meta=meta)


def build_document(fm: FleetMatrix, url: str, fetcher: Fetcher | None = None, thresholds=None) -> dict:
    from skewscope.analysis.detectors.fleet import analyze_matrix  # heavy (numba)
    snap = snapshot_of(fm, url)
    result = analyze_matrix(fm, thresholds=thresholds)
    if fetcher is not None:
        for k, fd in enumerate(result["findings"]):
            link = fd.get("evidence", {}).get("link")
            via = seen_by(fd["kind"])
            if via == "link" and link:
                fd["evidence"]["seen_by"] = fetcher.observers(link[0], link[1],
                                                              fd["evidence"].get("traffic_class", "bulk"))
            elif "seen_by" not in fd["evidence"] and via in SEEN_BY_SERIES and k < MAX_DRILLDOWNS:
                fd["evidence"]["seen_by"] = fetcher.pair_observers(fd)
    doc = R.to_dict(snap, result)
    doc["meta"]["dpu_clocks"] = fm.clock
    # pair rows: dest_qp is not applicable; add the fleet-only columns
    pos = {ip: i for i, ip in enumerate(fm.ips)}
    tot = fm.pair
    at = fm.pairs.find([pos[r["src"]] for r in doc["flows"]], [pos[r["dst"]] for r in doc["flows"]]).tolist()
    for row, e in zip(doc["flows"], at):
        row["dest_qp"] = None
        for k in ("msg_size_hist", "msg_gap_hist_ns", "opcode_classes", "udp_sport", "dscp", "acks",
                  "ecn_capable_packets", "fecn_packets", "becn_packets", "psn_skipped", "payload_bytes"):
            row.pop(k, None)
        row["busy_seconds"] = float(tot["busy_seconds"][e])
        row["by_class"] = {}
        for c in CLASSES:
            b = fm.cls("bytes", c)[e]
            if b <= 0:
                continue
            w = fm.cls("message_wire_seconds", c)[e]
            row["by_class"][c] = {"bytes": int(round(b)), "messages": int(round(fm.cls("messages", c)[e])),
                                  "rate_bps": 8.0 * fm.cls("timed_message_bytes", c)[e] / w if w > 0 else None}
    return doc


def run(url: str, window: str = "5m", timeout: float = 30.0, selector: str = "", use_rules: bool = True,
        thresholds=None, clock: str = "unsynchronised", at: float | None = None) -> dict:
    """at: the evaluation time (Unix s; default now): every query is an instant query at it
    (a backfilled TSDB's samples lie in the past)."""
    prom = Prometheus(url, timeout=timeout)
    fetcher = Fetcher(prom, window, selector=selector, use_rules=use_rules, clock=clock, at=at)
    fm = fetcher.fetch()
    doc = build_document(fm, url, fetcher, thresholds=thresholds)
    doc["meta"]["queries"] = prom.queries
    doc["meta"]["samples_returned"] = prom.samples
    doc["meta"]["query_seconds"] = round(prom.seconds, 4)
    return doc


def human(doc: dict, top: int = 20, console=None) -> None:
    from rich.console import Console  # heavy (rich): only when drawing
    from rich.table import Table  # heavy (rich): only when drawing

    con = console or Console()
    m = doc["meta"]
    w = m["window"]
    con.print(f"[bold]skewscope cluster[/bold]  {m['prometheus']}  window "
              f"{'all (since exporter start)' if w == 'all' else f'{w:g} s'}  "
              f"{len(m['dpus'])} DPUs, {m['nodes']} nodes, {len(doc['flows'])} pairs"
              f"{'  (recording rules)' if m['via_recording_rules'] else ''}")
    if m["stale_dpus"]:
        con.print(f"[yellow]stale DPUs (no read for > 2 min): {', '.join(m['stale_dpus'])}[/yellow]")
    tab = Table(title=f"pairs (top {top} by bytes)")
    for c in ("src", "dst", "bytes", "msgs", "bulk rate", "chunk rate", "CE", "CNP", "NAK", "retx"):
        tab.add_column(c, justify="left" if c in ("src", "dst") else "right")

    def _rate(r, c):
        v = r["by_class"].get(c, {}).get("rate_bps")
        return "-" if v is None else f"{v / 1e9:.2f} Gb/s"

    for r in sorted(doc["flows"], key=lambda r: -r["bytes"])[:top]:
        tab.add_row(r["src"], r["dst"], fmt_bytes(r["bytes"]), str(r["messages"]),
                    _rate(r, "bulk"), _rate(r, "chunk"), str(r["ce_packets"]), str(r["cnp_packets"]),
                    str(r["naks"]), str(r["retransmissions"]))
    con.print(tab)
    for g in (doc.get("timing") or {}).get("groups", []):
        tok = (f"ITL mean {g['itl_mean_s'] * 1e3:.2f} ms, {g['tokens_per_s']:.1f} tokens/s"
               if g.get("tokens_per_s") else
               f"iteration mean {g['iteration_mean_s'] * 1e3:.2f} ms" if g.get("iteration_mean_s") else "")
        con.print(f"group {g['role']} ({len(g['members'])} nodes, {len(g['dpus'])} DPUs): {g['workload']}"
                  f"{', ' + tok if tok else ''}")
    fs = doc.get("findings") or []
    if not fs:
        con.print("[green]no findings: the fleet's traffic looks healthy[/green]")
    for line in R.finding_lines(doc, Clock.of(doc["meta"])):       # incidents first, their findings under them
        con.print(line)
