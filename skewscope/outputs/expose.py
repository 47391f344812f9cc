"""The exporter's exposition: SkewscopeCollector (an ExportState -> the Prometheus families
of the metric table, on every scrape), the registry, text and OpenMetrics rendering (with
one timestamp: backfill), --listen parsing and the plain prometheus_client server."""
from __future__ import annotations

import operator
import socket
import threading

import numpy as np

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest, start_http_server
from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from skewscope import __version__
from skewscope.core import layout as L
from skewscope.core.snapshot import ip_str
from skewscope.outputs import metrics as M
from skewscope.outputs.exporter import ExportState
from skewscope.outputs.exptables import (
    COL,
    GAP_LE_STR,
    MSG_LE_STR,
    NAK_SYNDROMES,
    PFC_FAMILIES,
    cumulative_buckets,
)

DEFAULT_LISTEN = "127.0.0.1:9435"


# ---- the collector ---------------------------------------------------------------------------
class ArrayFamily(Metric):
    """A family of one sample name whose series are label rows with a value array each
    (`parts`, in sample order): the text cache (_TextCache) formats the values straight from
    the arrays, without a Sample per series (~60,000 series at 4,096 peer pairs); `samples`
    (generate_latest, OpenMetrics) are made from the same rows and values when asked, as
    add_metric makes them."""

    def __init__(self, spec):
        proto = M.family(spec)
        super().__init__(proto.name, proto.documentation, proto.type)
        self.sample_name = proto.name + "_total" if proto.type == "counter" else proto.name
        self.labelnames = tuple(spec.labels)
        self.parts: list | None = []     # [(label rows, values)]; None once samples were set

    def add_array(self, rows: list, values: np.ndarray) -> None:
        self.parts.append((rows, values))

    @property
    def samples(self):
        if self.parts is not None:
            return [Sample(self.sample_name, dict(zip(self.labelnames, r)), v, None, None)
                    for rows, vals in self.parts for r, v in zip(rows, np.asarray(vals).tolist())]
        return self._samples

    @samples.setter
    def samples(self, v):
        self._samples = v
        self.parts = None


def value_texts(values) -> list:
    """prometheus_client's text of each value (floatToGoString), for an array: repr (one C
    pass) where the two agree -- finite values under 10^6 in magnitude: floatToGoString is
    repr there (it rewrites only positive values whose repr has over 6 digits before the
    point, and non-finite ones) --, its rewrite of whole numbers from the integer's digits,
    floatToGoString for the others. Integer arrays (uint64 counters) as float64, the float()
    of each integer."""
    x = np.asarray(values).astype(np.float64)
    out = list(map(repr, x.tolist()))
    big = ~(np.abs(x) < 1e6)
    if not big.any():
        return out
    # whole numbers in [1e6, 1e16) (the byte and packet counters): repr is their digits and
    # ".0", which floatToGoString writes as d.ddd (trailing zeros dropped) e+<digits - 1>
    whole = (x >= 1e6) & (x < 1e16) & (x == np.floor(x))
    w = np.nonzero(whole)[0]
    for i, d in zip(w.tolist(), map(str, x[w].astype(np.int64).tolist())):
        out[i] = f"{(d[0] + '.' + d[1:]).rstrip('0.')}e+{len(d) - 1:02d}"
    for i, v in zip(np.nonzero(big & ~whole)[0].tolist(), x[big & ~whole].tolist()):
        out[i] = floatToGoString(v)
    return out


class SkewscopeCollector:
    """prometheus_client custom collector: collect() renders the current ExportState."""

    def __init__(self, get_state, inventory=None):
        self._get_state = get_state
        self._inventory = inventory      # core.inventory.Inventory (--inventory) or None
        self._label_rows = None

    def describe(self):
        return []  # unchecked collector: families depend on the data

    def _rows(self, st: ExportState):
        """The label rows of the per-peer, per-destination and per-source series: made again
        only when the labels change (new pairs), else the same list objects (what the text
        cache keys the series' text by)."""
        key = (st.node, st.peer_src, st.peer_dst, st.peer_class, st.dst_labels, st.src_labels)
        got = self._label_rows
        if got is None or got[0] != key:
            node = st.node
            peer = [(node, s, d, c) for s, d, c in zip(st.peer_src, st.peer_dst, st.peer_class)]
            naks = [[r + (syn,) for r in peer] for syn, _ in NAK_SYNDROMES]
            got = self._label_rows = (key, peer, naks, [(node, d) for d in st.dst_labels],
                                      [(node, d) for d in st.src_labels])
        return got[1:]

    def collect(self):
        st: ExportState | None = self._get_state()
        if st is None:
            return
        node = st.node
        n = len(st.peer_src)
        rows, nak_rows, dst_rows, src_rows = self._rows(st)
        for spec in M.PEER_COUNTERS:
            fam = ArrayFamily(spec)
            fam.add_array(rows, st.peer_counts[:, COL[spec.column]])
            yield fam
        fam = ArrayFamily(M.PEER_NAKS)
        for r, (_, col) in zip(nak_rows, NAK_SYNDROMES):
            fam.add_array(r, st.peer_counts[:, COL[col]])
        yield fam
        for spec, vals in ((M.PEER_BUSY_SECONDS, st.peer_busy_ns / 1e9),
                           (M.PEER_TIMED_MESSAGE_BYTES, st.peer_timed[:, 0]),
                           (M.PEER_MESSAGE_WIRE_SECONDS, st.peer_timed[:, 1] / 1e9)):
            fam = ArrayFamily(spec)
            fam.add_array(rows, vals)
            yield fam
        fam = ArrayFamily(M.DESTINATION_BUSY_SECONDS)
        fam.add_array(dst_rows, st.dst_busy_ns / 1e9)
        yield fam
        fam = ArrayFamily(M.SOURCE_BUSY_SECONDS)
        fam.add_array(src_rows, st.src_busy_ns / 1e9)
        yield fam
        fam = ArrayFamily(M.PEER_QPS)
        fam.add_array(rows, st.peer_qps)
        yield fam
        # top-K flows
        frows = []
        for f in st.flows:
            v = int(f["ipver"])
            frows.append((node, ip_str(f["src"], v), ip_str(f["dst"], v), str(int(f["dest_qp"]))))
        for spec in M.FLOW_COUNTERS:
            fam = M.family(spec)
            for r, v in zip(frows, st.flows[spec.column].tolist() if len(st.flows) else []):
                fam.add_metric(r, v)
            yield fam
        fam = M.family(M.FLOW_NAKS)
        for r, f in zip(frows, st.flows):
            fam.add_metric(r, int(f["nak_seq"]) + int(f["nak_rnr"]) + int(f["nak_other"]))
        yield fam
        fam = M.family(M.FLOW_MESSAGE_SIZE_BYTES)
        for r, f in zip(frows, st.flows):
            fam.add_metric(r, cumulative_buckets(f["msg_hist"], MSG_LE_STR), float(f["msg_bytes"]))
        yield fam
        # node-level histograms
        fam = M.family(M.MESSAGE_SIZE_BYTES)
        fam.add_metric([node], cumulative_buckets(st.hist_msg, MSG_LE_STR), st.hist_msg_sum)
        yield fam
        fam = M.family(M.MESSAGE_GAP_SECONDS)
        b = cumulative_buckets(st.hist_gap, GAP_LE_STR)
        fam.add_metric([node], b, None)
        fam.samples.append(Sample(fam.name + "_count", {"node": node}, b[-1][1], None, None))
        yield fam
        # node-level counters and gauges
        g = st.globals
        fam = M.family(M.FRAMES)
        for i, cat in enumerate(L.CATEGORY_NAMES):
            fam.add_metric([node, cat], int(g[i]))
        yield fam
        for spec, base in PFC_FAMILIES:
            fam = M.family(spec)
            for p in range(8):
                fam.add_metric([node, str(p)], int(g[base + p]))
            yield fam
        m = st.meta
        yield _node(M.FLOWS, node, st.flows_present)
        yield _node(M.FLOWS_CREATED, node, int(g[L.G_FLOWS_CREATED]))
        yield _node(M.FLOWS_EVICTED, node, int(m.get("flows_evicted", 0)))
        yield _node(M.MESSAGE_RECORDS_LOST, node, int(m.get("events_lost", 0)))
        yield _node(M.PARTIAL_MESSAGES, node, int(g[L.G_MSG_PARTIAL]))
        yield _node(M.SAMPLING_DENOMINATOR, node, int(m.get("sample_n", 1) or 1))
        yield _node(M.PEERS, node, n)
        yield _node(M.LAST_READ_TIMESTAMP_SECONDS, node, st.read_ts)
        yield _node(M.READ_DURATION_SECONDS, node, st.read_seconds)
        info = M.family(M.EXPORTER_INFO)
        info.add_metric([node, __version__, str(m.get("source", "?")),
                         str(m.get("interface") or m.get("file") or "")], 1)
        yield info
        if self._inventory is not None:
            fam = M.family(M.INVENTORY_INFO)
            for ip in sorted(set(st.peer_src) | set(st.peer_dst)):
                e = self._inventory.get(ip)
                if e is not None:
                    fam.add_metric([node, ip, e.host] + ["" if v is None else str(v) for v in
                                                         (e.gpu, e.rank, e.job, e.pod, e.namespace, e.instance,
                                                          e.rail)], 1)
            yield fam
        # per-node timing: one family per table row, even when empty (no node, no groups)
        fams = {}
        for spec in M.METRICS[M.METRICS.index(M.NODE_FORWARD_LATENCY):]:
            fams[spec.name] = M.family(spec)
        for spec, key, payload in st.timing:
            if spec.type == M.HISTOGRAM:
                lab = (node,) + tuple(key)
                fam = fams[spec.name]
                fam.add_metric(lab, payload[0], payload[1])
                if float(payload[0][0][0]) < 0:  # signed buckets: no _sum (OpenMetrics), _count kept
                    fam.samples.append(Sample(fam.name + "_count", dict(zip(spec.labels, lab)),
                                              payload[0][-1][1], None, None))
            else:
                fams[spec.name].add_metric((node,) + tuple(key), payload)
        yield from fams.values()


def _node(spec, node, v):
    """A family with the one series of this node."""
    f = M.family(spec)
    f.add_metric([node], v)
    return f


# ---- serving ----------------------------------------------------------------------------------
class ListenError(ValueError):
    pass


def parse_listen(s: str) -> tuple[str, int]:
    """'ADDR:PORT', '[v6]:PORT' or ':PORT' (= 127.0.0.1) -> (addr, port)."""
    s = s.strip()
    if s.startswith("["):
        host, sep, port = s[1:].partition("]:")
        if not sep:
            raise ListenError(f"invalid --listen {s!r}: expected [ADDR]:PORT")
    else:
        host, sep, port = s.rpartition(":")
        if not sep:
            raise ListenError(f"invalid --listen {s!r}: expected ADDR:PORT (e.g. {DEFAULT_LISTEN})")
        if ":" in host:
            raise ListenError(f"invalid --listen {s!r}: write IPv6 addresses as [ADDR]:PORT")
    host = host or "127.0.0.1"
    try:
        p = int(port)
    except ValueError:
        raise ListenError(f"invalid --listen {s!r}: port {port!r} is not a number") from None
    if not 0 <= p <= 65535:
        raise ListenError(f"invalid --listen {s!r}: port must be 0..65535")
    try:
        socket.getaddrinfo(host, p, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST)
    except socket.gaierror:
        raise ListenError(f"invalid --listen {s!r}: {host!r} is not a numeric IP address") from None
    return host, p


class _TextCache:
    """The text exposition, byte-identical to prometheus_client's generate_latest, without
    formatting every series' name and labels on every scrape: the exporter serves tens of
    thousands of series (4,096 peer pairs x the per-pair families) whose labels rarely change,
    and generate_latest's per-sample label sorting and escaping was ~0.5 s of every scrape.
    A series' text up to its value is made by prometheus_client itself, the first time the
    series appears (one generate_latest over all new series at value 0, cut at the value),
    and kept while the series is still there; a scrape formats only the values (with
    prometheus_client's floatToGoString: value_texts). An ArrayFamily's series are kept per
    part as a list beside its label rows: while the collector hands the same rows, the part
    is its kept texts joined with its values, no lookup per series. Families with
    timestamps, exemplars or OpenMetrics-only samples (which generate_latest moves) are
    rendered by generate_latest as they are."""

    def __init__(self):
        self._heads: dict = {}
        self._series: dict = {}
        self._parts: dict = {}      # (family name, part) -> (label rows, their texts)
        self._fresh: dict = {}      # (sample name, row) -> text: learned, not yet in a part
        self._vals: dict = {}       # (family name, part) -> (label rows, values, the part's text)
        self._lock = threading.Lock()

    def render(self, registry) -> bytes:
        fams = list(registry.collect())
        with self._lock:
            text, todo = self._render(fams)
            if todo:                      # new families or series: learn them, render again
                if not self._learn(todo):
                    return generate_latest(_Families(fams))
                text, todo = self._render(fams)
            self._fresh = {}
            return text

    def _part_texts(self, m, i, rows):
        """The kept texts of part i of ArrayFamily m for these rows, or None when a row's
        series is not known yet."""
        c = self._parts.get((m.name, i))
        if c is not None and c[0] is rows:
            return c
        old = dict(zip(c[0], c[1])) if c is not None else {}
        fresh, name, hs = self._fresh, m.sample_name, []
        for r in rows:
            h = old.get(r) or fresh.get((name, r))
            if h is None:
                return None
            hs.append(h)
        return rows, hs

    def _render(self, fams):
        """(the text, []) when every family and series is known, else (None, the families
        with something new)."""
        heads, series, old_vals = self._heads, self._series, self._vals
        out, keep, parts, todo, vals_text = [], {}, {}, [], {}
        add = operator.add
        for m in fams:
            hk = (m.name, m.type, m.documentation)
            head = heads.get(hk)
            if head is None:
                todo.append(m)
                continue
            if isinstance(m, ArrayFamily) and m.parts is not None:
                got = [self._part_texts(m, i, rows) for i, (rows, _) in enumerate(m.parts)]
                if any(g is None for g in got):
                    todo.append(m)
                    continue
                out.append(head)
                for i, (g, (_, vals)) in enumerate(zip(got, m.parts)):
                    parts[(m.name, i)] = g
                    if g[1]:
                        # a part whose rows and values are the last scrape's (counters that did
                        # not move: NAKs, CNPs, idle pairs) is the last scrape's text; the values
                        # compared as bytes (-0.0 and 0.0 are written differently)
                        v = np.asarray(vals)
                        c = old_vals.get((m.name, i))
                        if (c is not None and c[0] is g[0] and c[1].dtype == v.dtype and c[1].shape == v.shape
                                and c[1].tobytes() == v.tobytes()):
                            text = c[2]
                        else:
                            text = "\n".join(map(add, g[1], value_texts(v)))
                        vals_text[(m.name, i)] = (g[0], v.copy(), text)
                        out.append(text)
                        out.append("\n")
                continue
            out.append(head)
            app = out.append
            for s in m.samples:
                k = (s.name, *s.labels.items())
                h = series.get(k)
                if h is None or s.timestamp is not None or s.exemplar is not None:
                    todo.append(m)
                    break
                keep[k] = h
                app(f"{h}{floatToGoString(s.value)}\n")
        if todo:
            return None, todo
        self._series = keep           # series gone from this scrape are forgotten
        self._parts = parts
        self._vals = vals_text
        return "".join(out).encode("utf-8"), []

    def _learn(self, fams) -> bool:
        """Make the text of the families and series not seen before; False when a family
        needs generate_latest's own handling (timestamps, exemplars, OpenMetrics samples)."""
        heads, series = self._heads, self._series
        new = []
        for m in fams:
            fresh, rows = [], []
            if isinstance(m, ArrayFamily) and m.parts is not None:
                for i, (rs, _) in enumerate(m.parts):
                    c = self._parts.get((m.name, i))
                    known = set(c[0]) if c is not None else set()
                    for r in rs:
                        if r not in known and (m.sample_name, r) not in self._fresh:
                            fresh.append(Sample(m.sample_name, dict(zip(m.labelnames, r)), 0.0, None, None))
                            rows.append((m.sample_name, r))
            else:
                for s in m.samples:
                    if (s.timestamp is not None or s.exemplar is not None
                            or any(s.name == m.name + x for x in ("_created", "_gsum", "_gcount"))):
                        return False
                    if (s.name, *s.labels.items()) not in series:
                        fresh.append(Sample(s.name, s.labels, 0.0, None, None))
                        rows.append(None)
            hk = (m.name, m.type, m.documentation)
            if fresh or hk not in heads:
                fam = Metric(m.name, m.documentation, m.type)
                fam.samples = fresh
                new.append((hk, fam, rows))
        lines = generate_latest(_Families([f for _, f, _ in new])).decode("utf-8").split("\n")
        i = 0
        for hk, fam, rows in new:
            heads[hk] = lines[i] + "\n" + lines[i + 1] + "\n"
            i += 2
            for s, r in zip(fam.samples, rows):
                line = lines[i]
                i += 1
                if not line.endswith(" 0.0"):
                    return False
                if r is None:
                    series[(s.name, *s.labels.items())] = line[:-3]
                else:
                    self._fresh[r] = line[:-3]
        return True


class _Families:
    """A fixed list of families as a collector (what generate_latest reads)."""

    def __init__(self, fams):
        self.fams = fams

    def collect(self):
        return iter(self.fams)


class Registry(CollectorRegistry):
    """The exporter's registry: exposition() is generate_latest's text, made by _TextCache."""

    def __init__(self):
        super().__init__(auto_describe=False)
        self._text = _TextCache()

    def exposition(self) -> bytes:
        return self._text.render(self)


def make_registry(collector: SkewscopeCollector, process_metrics: bool = True):
    reg = Registry()
    reg.register(collector)
    if process_metrics:
        ProcessCollector(registry=reg)
    return reg


def render(registry) -> str:
    """One text exposition (export --once: nothing to reuse; the server's scrapes call
    Registry.exposition)."""
    return generate_latest(registry).decode()


class _Stamped:
    """A registry's families with every sample at one timestamp (seconds)."""

    def __init__(self, registry, ts: float):
        self.registry, self.ts = registry, float(ts)

    def collect(self):
        for fam in self.registry.collect():
            fam.samples = [Sample(s.name, s.labels, s.value, self.ts, s.exemplar) for s in fam.samples]
            yield fam


def render_openmetrics(registry, ts: float) -> str:
    """The exposition in the OpenMetrics text format (what a scrape that asks for it gets),
    every sample stamped with `ts` (Unix seconds), ending in `# EOF`: the input of
    `promtool tsdb create-blocks-from openmetrics` (backfill a Prometheus from a capture
    without running an exporter). Files of several DPUs may be concatenated, each with its
    own `node` label, minus every `# EOF` but the last."""
    from prometheus_client.openmetrics.exposition import generate_latest as om_latest  # only for --format openmetrics
    return om_latest(_Stamped(registry, ts)).decode()


def serve(registry, addr: str, port: int):
    """Start the HTTP server (daemon threads). Returns (server, thread)."""
    return start_http_server(port, addr=addr, registry=registry)
