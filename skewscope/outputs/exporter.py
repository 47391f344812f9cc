"""Prometheus exporter: a Snapshot (from a file) or the live data plane, as /metrics.

One custom Collector (`SkewscopeCollector`) renders the current `ExportState` on every
scrape; no prometheus_client Gauge/Counter objects per series. The state is built by an
`Accumulator`, which turns successive *cumulative* reads of the flow table into per-peer
counters that never go backwards, even when the LRU flow map evicts or re-creates flows:

    per-peer total = (sum of the last-seen values of every flow of the pair that left the
                      table or was re-created) + (sum over the pair's flows present now)

Every family (name, type, labels, help, where its value comes from) is a row of the metric
table, `outputs.metrics` (the contract for recording rules, alerts, the dashboard and
`skewscope cluster`; its list and the cardinality are in docs/fleet.md). For one DPU
(label `node`): per peer pair and traffic class (src, dst, class; up to --max-peers pairs,
then one overflow pair), per destination, per top-K flow (src, dst, qp), per node.

Histograms come from the data plane's log2 slots (slot 0 = value 0; slot s >= 1 holds
[2^(s-1), 2^s); the last slot also takes everything above). Like cloudflare/ebpf_exporter,
every bucket is always present (missing ones filled) and counts are cumulative; the bucket
bound `le` is the exact largest integer a slot holds (2^s - 1), so a 1 MiB message counts
in le="2097151", not in le="1048575", and `histogram_quantile` is never off by a slot.
The gap histogram has no `_sum` (the data plane keeps none; we do not invent one).
"""
from __future__ import annotations

import ipaddress
import os
import socket
import time
from dataclasses import dataclass, field

import numpy as np
from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest, start_http_server
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from skewscope import __version__
from skewscope.analysis.context import context
from skewscope.analysis.fleet import BULK_MIN_MESSAGE, CTS_MAX_BYTES
from skewscope.analysis.flows import flow_event_stats
from skewscope.analysis.intervals import union_kernel
from skewscope.analysis.nodeview import NodeViewError, per_node_timing, resolve_node
from skewscope.core import layout as L
from skewscope.core.snapshot import Snapshot, flow_key_words, ip_str, match_rows
from skewscope.outputs import metrics as M

DEFAULT_LISTEN = "127.0.0.1:9435"
DEFAULT_TOP_K = 10
DEFAULT_MAX_PEERS = 4096
OVERFLOW_LABEL = M.OVERFLOW_LABEL

# Per-flow counter columns accumulated per peer (name in FLOW_DTYPE).
SCALARS = ("packets", "bytes", "payload_bytes", "messages", "msg_bytes", "ce", "cnp",
           "retransmissions", "psn_gaps", "nak_seq", "nak_rnr", "nak_other")
COL = {n: i for i, n in enumerate(SCALARS)}
MSG0 = len(SCALARS)
GAP0 = MSG0 + L.MSG_SLOTS
NCOLS = GAP0 + L.GAP_SLOTS

# Families, names, labels and help: outputs.metrics (the metric table). Per-pair and
# per-flow counters read the FLOW_DTYPE column of their spec's "flows.<column>" source.
NAK_SYNDROMES = tuple(zip(M.SYNDROMES, ("nak_seq", "nak_rnr", "nak_other")))
PFC_FAMILIES = ((M.PFC_PAUSE_FRAMES, L.G_PFC_PAUSE), (M.PFC_RESUME_FRAMES, L.G_PFC_XON),
                (M.PFC_PAUSE_QUANTA, L.G_PFC_QUANTA))


def _le_bounds(nslots: int) -> list[int]:
    """Exact upper bounds of the finite log2 slots (all but the last, which is +Inf)."""
    return [(1 << s) - 1 for s in range(nslots - 1)]


MSG_LE = _le_bounds(L.MSG_SLOTS)
GAP_LE_NS = _le_bounds(L.GAP_SLOTS)


def _fmt_le(v: float) -> str:
    return floatToGoString(v)


MSG_LE_STR = [_fmt_le(v) for v in MSG_LE] + ["+Inf"]
GAP_LE_STR = [_fmt_le(v / 1e9) for v in GAP_LE_NS] + ["+Inf"]


def cumulative_buckets(slots: np.ndarray, le_str: list[str]) -> list[tuple[str, float]]:
    """log2 slot counts -> Prometheus cumulative buckets, every bucket present."""
    c = np.cumsum(np.asarray(slots, dtype=np.float64))
    return list(zip(le_str, c.tolist()))


# ---- tables ---------------------------------------------------------------------------
def flow_matrix(flows: np.ndarray) -> np.ndarray:
    """FLOW_DTYPE rows -> (n, NCOLS) uint64: SCALARS, msg_hist, gap_hist."""
    n = len(flows)
    m = np.empty((n, NCOLS), dtype=np.uint64)
    for i, name in enumerate(SCALARS):
        m[:, i] = flows[name]
    m[:, MSG0:GAP0] = flows["msg_hist"]
    m[:, GAP0:] = flows["gap_hist"]
    return m


def _rows_u64(a: np.ndarray) -> np.ndarray:
    """(n, k) uint8 with k % 8 == 0 -> (n, k/8) uint64 (row identity only, not order)."""
    return np.ascontiguousarray(a).view("<u8").reshape(len(a), a.shape[1] // 8)


# Traffic class of a flow (the `class` label of the per-peer series), from its cumulative
# mean message size: NCCL runs each connection on its own QPs, so one flow carries one
# kind of traffic, and a node pair that carries a ring link and all-to-all chunks at once
# keeps them apart.
CLASSES = M.CLASSES
CLS_BULK, CLS_CHUNK, CLS_CONTROL = range(3)


def flow_class(flows: np.ndarray) -> np.ndarray:
    """bulk: mean message >= analysis.fleet.BULK_MIN_MESSAGE (ring/tree SIMPLE slices);
    chunk: other messages with mean > analysis.flows.CTS_MAX_BYTES (all-to-all, P2P, LL);
    control: everything else (NCCL clear-to-send writes, ACK/NAK, CNP, no messages)."""
    m = flows["messages"].astype(np.float64)
    mean = np.where(m > 0, flows["msg_bytes"].astype(np.float64) / np.maximum(m, 1), 0.0)
    c = np.full(len(flows), CLS_CONTROL, dtype=np.uint8)
    c[mean > CTS_MAX_BYTES] = CLS_CHUNK
    c[mean >= BULK_MIN_MESSAGE] = CLS_BULK
    return c


def peer_ids(flows: np.ndarray, cls: np.ndarray | None = None) -> np.ndarray:
    """(n, 5) uint64 identity of each flow's peer series: src, dst, ipver, class."""
    k = np.zeros((len(flows), 40), dtype=np.uint8)
    k[:, 0:16] = flows["src"]
    k[:, 16:32] = flows["dst"]
    k[:, 32] = flows["ipver"]
    if cls is not None:
        k[:, 33] = cls
    return _rows_u64(k)


def dst_ids(flows: np.ndarray, end: str = "dst") -> np.ndarray:
    """(n, 3) uint64 identity of each flow's destination (or source: end="src"), ipver."""
    k = np.zeros((len(flows), 24), dtype=np.uint8)
    k[:, 0:16] = flows[end]
    k[:, 16] = flows["ipver"]
    return _rows_u64(k)


def message_timing(flows: np.ndarray, events: np.ndarray) -> np.ndarray:
    """Per-flow message timing of one interval, by the analysis package's definitions
    (analysis.flows.flow_event_stats: multi-packet message bytes, their on-wire time,
    packet time), so that the fleet's rate over active time is the single-node one."""
    st, _, _ = flow_event_stats(Snapshot(flows, events, np.zeros(L.G_N, np.uint64), {}))
    return st


def busy_ns_per_peer(events: np.ndarray, flow_peer: np.ndarray, npeers: int,
                     carry_end: np.ndarray | None = None,
                     pkt_ns: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Busy time (ns) per peer pair from message records: the measure of the union of the
    on-wire intervals [start_ts, end_ts + pkt_ns(flow)] of the pair's messages (pkt_ns:
    the flow's packet time, analysis.flows; 0 if not given). Records of flows no longer in
    the table (flow = -1) are skipped. Returns (busy_ns, carry_end)."""
    busy = np.zeros(npeers, dtype=np.int64)
    carry = np.zeros(npeers, dtype=np.int64) if carry_end is None else carry_end.astype(np.int64).copy()
    if carry.shape[0] < npeers:
        carry = np.concatenate([carry, np.zeros(npeers - carry.shape[0], dtype=np.int64)])
    ev = events[events["flow"] >= 0]
    if len(ev) == 0:
        return busy, carry
    p = flow_peer[ev["flow"]].astype(np.int64)
    s = ev["start_ts"].astype(np.int64)
    e = np.maximum(ev["end_ts"].astype(np.int64), s)
    if pkt_ns is not None:
        e = e + np.nan_to_num(pkt_ns[ev["flow"]], nan=0.0).astype(np.int64)
    order = np.lexsort((s, p))
    scratch = np.zeros(npeers, dtype=np.int64)  # first/last of union_kernel (not needed here)
    union_kernel(p[order], s[order], e[order], carry, busy, scratch, scratch.copy())
    return busy, carry


# ---- per-node timing (analysis.nodeview) ---------------------------------------------------
DUR_LE_STR = [_fmt_le(v) for v in M.DURATION_BUCKETS] + ["+Inf"]
OFF_LE_STR = [_fmt_le(v) for v in M.OFFSET_BUCKETS] + ["+Inf"]
LE_STR = {id(b): [_fmt_le(v) for v in b] + ["+Inf"]
          for b in (M.DURATION_BUCKETS, M.OFFSET_BUCKETS, M.OWN_LAG_BUCKETS)}


def bucket_counts(samples_ns, bounds_s) -> np.ndarray:
    """Non-cumulative counts per bucket (x <= le; the last = +Inf) of samples in ns."""
    x = np.asarray(samples_ns, dtype=np.float64)
    x = x[np.isfinite(x)] / 1e9
    idx = np.searchsorted(np.asarray(bounds_s, dtype=np.float64), x, side="left")
    return np.bincount(idx, minlength=len(bounds_s) + 1).astype(np.float64)


class TimingAccumulator:
    """Cumulative per-node timing histograms and counters: analysis.nodeview results of
    successive reads (a file = one read) added up; per (ip, role) at most max_peers peers,
    later ones in peer="_overflow"."""

    def __init__(self, max_peers: int = DEFAULT_MAX_PEERS, max_nodes: int = 64):
        self.max_peers, self.max_nodes = int(max_peers), int(max_nodes)
        self.hist: dict = {}      # (spec name, labels minus node) -> [counts, sum_s]
        self.count: dict = {}     # (spec name, labels minus node) -> value
        self.peers: dict = {}     # (ip, role) -> set of peers with their own series

    def _h(self, spec, key, samples, bounds):
        h = self.hist.setdefault((spec.name, key), [np.zeros(len(bounds) + 1), 0.0])
        x = np.asarray(samples, dtype=np.float64)
        x = x[np.isfinite(x)]
        h[0] += bucket_counts(x, bounds)
        h[1] += float(x.sum()) / 1e9

    def add_results(self, results: list) -> None:
        for nt in results:
            ip = nt["node"]
            for g in nt["groups"]:
                role, smp = g["role"], g.get("_samples") or {}
                base = (ip, role)
                for spec, key, bounds in M.TIMING_HISTOGRAMS:
                    self._h(spec, base, smp.get(key, ()), bounds)
                known = self.peers.setdefault(base, set())
                for spec, key, bounds in M.TIMING_PEER_HISTOGRAMS:
                    for peer, v in (smp.get(key) or {}).items():
                        if peer not in known and len(known) >= self.max_peers:
                            peer = OVERFLOW_LABEL
                        else:
                            known.add(peer)
                        self._h(spec, base + (peer,), v, bounds)
                for spec, key in M.TIMING_COUNTERS:
                    k = (spec.name, base)
                    self.count[k] = self.count.get(k, 0) + int(g.get(key) or 0)

    def add(self, snap: Snapshot, node_ip: str | None = None) -> None:
        if not len(snap.events):
            return
        try:
            res = per_node_timing(snap, node_ip, max_nodes=self.max_nodes, samples=True)
        except NodeViewError:  # the node sent and received nothing in this read
            return
        self.add_results(res)

    def rows(self) -> list:
        """[(spec, labels without node, payload)]: histograms (cumulative buckets, sum),
        counters (value), in table order."""
        out = []
        for spec, _, bounds in M.TIMING_HISTOGRAMS + M.TIMING_PEER_HISTOGRAMS:
            le = LE_STR[id(bounds)]
            for (name, key), (cnt, sm) in sorted(self.hist.items()):
                if name == spec.name:
                    out.append((spec, key, (cumulative_buckets(cnt, le), sm)))
        for spec, _ in M.TIMING_COUNTERS:
            for (name, key), v in sorted(self.count.items()):
                if name == spec.name:
                    out.append((spec, key, v))
        order = {m.name: i for i, m in enumerate(M.METRICS)}
        return sorted(out, key=lambda r: order[r[0].name])


#: live per-node timing: the sliding window of the node's recent message records
WINDOW_S = 60.0            # seconds of records kept (and back to half a window before the ...
WINDOW_RECORDS = 100_000   # ... oldest open watermark), at most this many records
WINDOW_MIN_ITERATIONS = 3  # confirmed iterations (collectives: kv_transfer) before a group's role is fixed


def _sel(t, lo, hi):
    t = np.asarray(t, dtype=np.int64)
    return (t >= lo) & (t < hi)


class WindowedTiming:
    """The live exporter's per-node timing: analysis.nodeview over a sliding window of the
    node's recent message records (the last WINDOW_S seconds, at most WINDOW_RECORDS), so
    groups, roles and iteration boundaries are decided with context rather than from one
    read interval. Each read exports only the window's NEW samples, by their start times
    (steps, collectives, iterations each counted once), up to the latest iteration start
    that is at least half the window (WINDOW_S / 2, or half the window's span when
    WINDOW_RECORDS bounds it) older than the newest record and that the previous read saw
    too: every boundary is decided with that much context after it. A read that brings no
    records for the node closes the tail (flush: the rest, decided on the whole window). A
    group (ring lane, alltoall peers, kv) keeps the role it had at its first export, made
    with WINDOW_MIN_ITERATIONS confirmed iterations at least (flush: what there is)."""

    def __init__(self, timing: TimingAccumulator, node_ip: str | None = None, window_s: float = WINDOW_S,
                 max_records: int = WINDOW_RECORDS, min_iterations: int = WINDOW_MIN_ITERATIONS):
        self.timing, self.node_ip = timing, node_ip
        self.window_ns, self.max_records = int(window_s * 1e9), int(max_records)
        self.min_iterations = int(min_iterations)
        self.flows = np.zeros(0, L.FLOW_DTYPE)
        self.events = np.zeros(0, L.EVENT_DTYPE)
        self.wm: dict = {}        # group -> samples before this time (ns) are exported
        self.role: dict = {}      # group -> its fixed role
        self.seen: dict = {}      # group -> iteration starts of the previous read
        self.pending = False      # records not yet exported (flush has work)
        self.horizon = 0          # export boundaries up to this time (ns)
        self.full = False         # the window has spanned WINDOW_S (or held max_records)

    def add(self, delta: np.ndarray, events: np.ndarray | None, cum_flows: np.ndarray | None = None) -> None:
        if events is None or not len(events):
            self.flush()
            return
        ev = events.copy()
        f = ev["flow"].astype(np.int64)
        ok = f >= 0
        d = delta
        if cum_flows is not None and len(cum_flows) and len(delta):
            # the cumulative row (stable counters: roles, mean message size) where there is one
            j = match_rows(flow_key_words(cum_flows), flow_key_words(delta))
            d = delta.copy()
            d[j >= 0] = cum_flows[j[j >= 0]]
        if len(self.flows) and len(d):
            j = match_rows(flow_key_words(self.flows), flow_key_words(d))
        else:
            j = np.full(len(d), -1, np.int64)
        fl = self.flows.copy()
        fl[j[j >= 0]] = d[j >= 0]
        new = np.nonzero(j < 0)[0]
        j = j.astype(np.int64)
        j[new] = len(fl) + np.arange(len(new))
        fl = np.concatenate([fl, d[new]])
        ev["flow"][ok] = j[f[ok]]
        self.flows = fl
        # a read longer than a quarter window (or of many records) goes in pieces: the
        # window never drops records it has not exported from
        ev = ev[np.argsort(ev["start_ts"], kind="stable")]
        t = ev["start_ts"].astype(np.int64)
        piece = np.maximum((t - t[0]) // max(1, self.window_ns // 4), np.arange(len(t)) // max(1, self.max_records // 4))
        for k in np.unique(piece):
            self._slide(ev[piece == k])
        # the flows the window still refers to
        w = self.events
        used, inv = np.unique(w["flow"][w["flow"] >= 0], return_inverse=True)
        w["flow"][w["flow"] >= 0] = inv
        self.flows = self.flows[used]

    def _slide(self, ev) -> None:
        allev = np.concatenate([self.events, ev])
        allev = allev[np.argsort(allev["start_ts"], kind="stable")]
        # nothing exported yet: keep everything (up to max_records)
        cut = int(allev["end_ts"].max()) - self.window_ns if self.wm else np.iinfo(np.int64).min
        live = [w for w in self.wm.values() if w >= cut]   # groups gone for a window: not kept
        if live:
            cut = min(cut, min(live) - self.window_ns // 2)
        allev = allev[allev["start_ts"].astype(np.int64) >= cut]
        capped = len(allev) > self.max_records
        allev = allev[-self.max_records:]
        end = int(allev["end_ts"].max())
        lag = (end - int(allev["start_ts"][0])) // 2 if capped else self.window_ns // 2
        self.horizon = end - lag
        # exports start once the window is full (all the context it can hold)
        self.full = self.full or capped or end - int(allev["start_ts"][0]) >= 0.9 * self.window_ns
        self.events = allev
        self.pending = True
        self._export(final=False)

    def flush(self) -> None:
        if self.pending and len(self.events):
            self._export(final=True)
        self.pending = False

    def _export(self, final: bool) -> None:
        snap = Snapshot(self.flows, self.events, np.zeros(L.G_N, np.uint64), {})
        try:
            res = per_node_timing(snap, self.node_ip, max_nodes=self.timing.max_nodes, samples=True)
        except NodeViewError:
            return
        out = []
        for nt in res:
            gs = []
            for g in nt["groups"]:
                g2 = self._new_part(nt["node"], g, final)
                if g2 is not None:
                    gs.append(g2)
            if gs:
                out.append({"node": nt["node"], "groups": gs})
        self.timing.add_results(out)

    def _new_part(self, ip, g, final):
        kind = "lane" if g["role"] in ("ring", "tp_decode") else g["role"]
        key = (ip, kind, tuple(g["upstream"]), tuple(g["downstream"]))
        smp = g["_samples"]
        tm = smp["_times"]
        starts = tm["collectives"] if kind == "kv_transfer" else tm["iterations"]
        starts = np.asarray(starts, dtype=np.int64)
        prev = self.seen.get(key)
        self.seen[key] = starts
        lo = self.wm.get(key, np.iinfo(np.int64).min)
        if final:
            hi = np.iinfo(np.int64).max
        else:
            # the last start is open (its iteration may go on); of the others, the latest
            # one the previous read saw too
            conf = starts[:-1][np.isin(starts[:-1], prev)] if prev is not None else starts[:0]
            conf = conf[conf <= self.horizon] if self.full else conf[:0]
            if key not in self.role:
                if len(conf) < self.min_iterations:
                    return None
                self.role[key] = g["role"]
            if not len(conf) or conf[-1] <= lo:
                return None
            hi = int(conf[-1])
        role = self.role.setdefault(key, g["role"])
        if final:
            allt = [np.asarray(v, np.int64) for v in tm.values() if not isinstance(v, dict) and len(v)]
            self.wm[key] = int(max(int(x.max()) for x in allt)) + 1 if allt else lo
        else:
            self.wm[key] = hi
        ns = {}
        for spec, k, _ in M.TIMING_HISTOGRAMS:
            x = np.asarray(smp.get(k, ()), dtype=np.float64)
            t = np.asarray(tm.get(k, ()), dtype=np.int64)
            ns[k] = x[_sel(t, lo, hi) & np.isfinite(x)]
        for spec, k, _ in M.TIMING_PEER_HISTOGRAMS:
            ns[k] = {}
            for peer, x in (smp.get(k) or {}).items():
                x = np.asarray(x, dtype=np.float64)
                t = np.asarray(tm[k][peer], dtype=np.int64)
                ns[k][peer] = x[_sel(t, lo, hi) & np.isfinite(x)]
        g2 = {"role": role, "_samples": ns}
        for spec, k in M.TIMING_COUNTERS:
            g2[k] = int(_sel(tm[k], lo, hi).sum())
        return g2


# ---- state --------------------------------------------------------------------------------
@dataclass
class ExportState:
    """What one scrape renders. Immutable once published (the reader builds a new one)."""
    node: str
    peer_src: list            # label strings, one per exported peer row
    peer_dst: list
    peer_class: list          # traffic class (CLASSES)
    peer_counts: np.ndarray   # (m, NCOLS) cumulative
    peer_busy_ns: np.ndarray  # (m,) cumulative
    peer_timed: np.ndarray    # (m, 2) multi-packet message bytes, their on-wire ns
    peer_qps: np.ndarray      # (m,) flows currently in the table
    flows: np.ndarray         # top-K FLOW_DTYPE rows (current values)
    hist_msg: np.ndarray      # (MSG_SLOTS,) cumulative over all flows
    hist_gap: np.ndarray      # (GAP_SLOTS,)
    hist_msg_sum: float       # sum of all message sizes (the message histogram's _sum)
    dst_labels: list          # destinations with a busy-time series
    dst_busy_ns: np.ndarray
    src_labels: list          # sources of data messages with a busy-time series
    src_busy_ns: np.ndarray
    flows_present: int        # rows in the flow table at the last read
    globals: np.ndarray
    meta: dict
    read_ts: float = 0.0
    read_seconds: float = 0.0
    info: dict = field(default_factory=dict)
    timing: list = field(default_factory=list)   # TimingAccumulator.rows()


class Accumulator:
    """Adds per-interval flow deltas (what happened between two reads of the cumulative
    flow table: `live.flow_delta`, which already handles evicted/re-created flows) into
    monotonic per-peer totals, and the interval's message records into busy time. Pure
    numpy; no kernel needed (unit-testable). A Snapshot from a file is one big delta."""

    def __init__(self, max_peers: int = DEFAULT_MAX_PEERS, node_ip: str | None = None,
                 timing_nodes: int = 64, window: bool = True, window_s: float | None = None):
        if max_peers < 1:
            raise ValueError("max_peers must be >= 1")
        self.max_peers = int(max_peers)
        self.node_ip = node_ip                    # per-node timing: this node (None: inferred)
        # a mirror (no node inferable): every node's timing, up to timing_nodes of them
        self.timing = TimingAccumulator(max_peers=max_peers, max_nodes=timing_nodes)
        # live: a sliding window of recent records (WindowedTiming); a file is one whole read
        self.window = (WindowedTiming(self.timing, node_ip, window_s=window_s or WINDOW_S)
                       if window else None)
        self.peer_keys = np.zeros((0, 5), dtype=np.uint64)   # known pairs (sticky)
        self.peer_labels: list[tuple[str, str, str]] = []
        self.peer_counts = np.zeros((0, NCOLS), dtype=np.uint64)
        self.peer_busy = np.zeros(0, dtype=np.int64)
        self.peer_carry = np.zeros(0, dtype=np.int64)
        self.peer_timed = np.zeros((0, 2), dtype=np.float64)   # multi-packet message bytes, on-wire ns
        self.overflow_timed = np.zeros(2, dtype=np.float64)
        self.overflow_counts = np.zeros(NCOLS, dtype=np.uint64)
        self.overflow_busy = 0
        self.overflow_carry = 0
        self.overflow_used = False
        self.totals = np.zeros(NCOLS, dtype=np.uint64)        # all flows, all pairs (node histograms)
        # per destination: union of incoming message intervals (incast degree = sum of the
        # pairs' busy time into dst / this); same bound and overflow rule as pairs
        self.dst_keys = np.zeros((0, 3), dtype=np.uint64)
        self.dst_labels: list[str] = []
        self.dst_busy = np.zeros(0, dtype=np.int64)
        self.dst_carry = np.zeros(0, dtype=np.int64)
        # per source: union of its outgoing data messages (bulk, chunk): a member's send rate
        # over active time; same bound and overflow rule
        self.src_keys = np.zeros((0, 3), dtype=np.uint64)
        self.src_labels: list[str] = []
        self.src_busy = np.zeros(0, dtype=np.int64)
        self.src_carry = np.zeros(0, dtype=np.int64)
        self.events_without_flow = 0
        self.cum_flows = np.zeros(0, L.FLOW_DTYPE)
        self.reads = 0

    def _peer_index(self, flows: np.ndarray, cls: np.ndarray) -> np.ndarray:
        """Peer row per flow (-1 = overflow). New pairs become rows until max_peers."""
        pk = peer_ids(flows, cls)
        idx = match_rows(self.peer_keys, pk)
        new = np.nonzero(idx < 0)[0]
        room = self.max_peers - len(self.peer_keys)
        if len(new) and room > 0:
            uniq, first = np.unique(pk[new], axis=0, return_index=True)
            take = np.sort(first)[:room]            # first-seen order among the new ones
            k = len(take)
            self.peer_keys = np.concatenate([self.peer_keys, pk[new[take]]])
            for r in new[take]:
                f = flows[r]
                v = int(f["ipver"])
                self.peer_labels.append((ip_str(f["src"], v), ip_str(f["dst"], v), CLASSES[int(cls[r])]))
            self.peer_counts = np.concatenate([self.peer_counts, np.zeros((k, NCOLS), np.uint64)])
            self.peer_busy = np.concatenate([self.peer_busy, np.zeros(k, np.int64)])
            self.peer_carry = np.concatenate([self.peer_carry, np.zeros(k, np.int64)])
            self.peer_timed = np.concatenate([self.peer_timed, np.zeros((k, 2), np.float64)])
            idx = match_rows(self.peer_keys, pk)
        return idx

    def _dst_index(self, flows: np.ndarray, end: str = "dst", use: np.ndarray | None = None) -> np.ndarray:
        """Destination (end="src": source) row per flow (-1 = none: over the bound, or not in
        `use`). New ones become rows until max_peers."""
        pre = "dst" if end == "dst" else "src"
        keys, labels = getattr(self, f"{pre}_keys"), getattr(self, f"{pre}_labels")
        dk = dst_ids(flows, end)
        idx = match_rows(keys, dk)
        new = np.nonzero((idx < 0) & (True if use is None else use))[0]
        room = self.max_peers - len(keys)
        if len(new) and room > 0:
            _, first = np.unique(dk[new], axis=0, return_index=True)
            take = np.sort(first)[:room]
            k = len(take)
            setattr(self, f"{pre}_keys", np.concatenate([keys, dk[new[take]]]))
            for r in new[take]:
                labels.append(ip_str(flows[r][end], int(flows[r]["ipver"])))
            for a in ("busy", "carry"):
                setattr(self, f"{pre}_{a}", np.concatenate([getattr(self, f"{pre}_{a}"), np.zeros(k, np.int64)]))
            idx = match_rows(getattr(self, f"{pre}_keys"), dk)
        if use is not None:
            idx = np.where(use, idx, -1)
        return idx

    cum_class = np.zeros(0, np.uint8)

    def add(self, delta: np.ndarray, events: np.ndarray | None = None,
            cum_flows: np.ndarray | None = None) -> None:
        """delta: FLOW_DTYPE counters accumulated since the previous add; events: the
        message records of the same interval (`flow` indexes `delta`); cum_flows: the
        cumulative flow table now (for the top-K flows and per-pair QP counts)."""
        self.reads += 1
        if cum_flows is not None:
            self.cum_flows = cum_flows
            self.cum_class = flow_class(cum_flows)
        # class from the cumulative table (stable), not from the interval's few messages
        cls = flow_class(delta)
        if len(self.cum_flows) and len(delta):
            j = match_rows(flow_key_words(self.cum_flows), flow_key_words(delta))
            cls = np.where(j >= 0, self.cum_class[np.maximum(j, 0)], cls).astype(np.uint8)
        peer = self._peer_index(delta, cls)
        m = flow_matrix(delta)
        if len(m):
            inside = peer >= 0
            if inside.any():
                np.add.at(self.peer_counts, peer[inside], m[inside])
            if (~inside).any():
                self.overflow_counts += m[~inside].sum(axis=0, dtype=np.uint64)
                self.overflow_used = True
            self.totals += m.sum(axis=0, dtype=np.uint64)
        if events is not None and len(events):
            self.events_without_flow += int((events["flow"] < 0).sum())
            npeers = len(self.peer_keys) + 1                   # + the overflow pair, last
            fp = np.where(peer >= 0, peer, npeers - 1)
            fst = message_timing(delta, events)
            timed = np.zeros((npeers, 2), dtype=np.float64)
            np.add.at(timed[:, 0], fp, fst["multi_bytes"])
            np.add.at(timed[:, 1], fp, fst["wire_ns"])
            self.peer_timed += timed[:-1]
            self.overflow_timed += timed[-1]
            pkt = fst["pkt_ns"]
            carry = np.concatenate([self.peer_carry, np.array([self.overflow_carry], np.int64)])
            busy, carry = busy_ns_per_peer(events, fp, npeers, carry, pkt_ns=pkt)
            self.peer_busy += busy[:-1]
            self.peer_carry = carry[:-1]
            self.overflow_busy += int(busy[-1])
            self.overflow_carry = int(carry[-1])
            di = self._dst_index(delta)
            keep = di >= 0
            if keep.any():
                ev = events[events["flow"] >= 0]
                ev = ev[keep[ev["flow"]]]
                busy_d, self.dst_carry = busy_ns_per_peer(ev, di, len(self.dst_keys), self.dst_carry, pkt_ns=pkt)
                self.dst_busy += busy_d
            si = self._dst_index(delta, "src", use=cls != CLS_CONTROL)
            keep = si >= 0
            if keep.any():
                ev = events[events["flow"] >= 0]
                ev = ev[keep[ev["flow"]]]
                busy_s, self.src_carry = busy_ns_per_peer(ev, si, len(self.src_keys), self.src_carry, pkt_ns=pkt)
                self.src_busy += busy_s
            if self.window is not None:
                self.window.add(delta, events, cum_flows)
            else:
                self.timing.add(Snapshot(delta, events, np.zeros(L.G_N, np.uint64), {}), self.node_ip)
        elif self.window is not None:
            self.window.flush()   # a read without records: the node is quiet, close the tail

    def qps_per_peer(self) -> np.ndarray:
        """Flows per exported pair in the cumulative table (last entry: overflow)."""
        q = np.zeros(len(self.peer_keys) + 1, dtype=np.int64)
        if len(self.cum_flows):
            p = match_rows(self.peer_keys, peer_ids(self.cum_flows, self.cum_class))
            p[p < 0] = len(self.peer_keys)
            np.add.at(q, p, 1)
        return q

    def state(self, node: str, globals_: np.ndarray, meta: dict, top_k: int, read_ts: float = 0.0,
              read_seconds: float = 0.0, info: dict | None = None) -> ExportState:
        qps = self.qps_per_peer()
        src = [x[0] for x in self.peer_labels]
        dst = [x[1] for x in self.peer_labels]
        klass = [x[2] for x in self.peer_labels]
        counts, busy, q, timed = self.peer_counts, self.peer_busy, qps[:-1], self.peer_timed
        if self.overflow_used:
            src, dst, klass = src + [OVERFLOW_LABEL], dst + [OVERFLOW_LABEL], klass + [OVERFLOW_LABEL]
            timed = np.concatenate([timed, self.overflow_timed[None, :]])
            counts = np.concatenate([counts, self.overflow_counts[None, :]])
            busy = np.concatenate([busy, np.array([self.overflow_busy], np.int64)])
            q = qps
        m = dict(meta)
        m["events_without_flow"] = self.events_without_flow
        return ExportState(node=node, peer_src=src, peer_dst=dst, peer_class=klass, peer_counts=counts.copy(),
                           peer_busy_ns=busy.copy(), peer_timed=timed.copy(), peer_qps=q.copy(), flows=top_flows(self.cum_flows, top_k),
                           hist_msg=self.totals[MSG0:GAP0].copy(), hist_gap=self.totals[GAP0:].copy(),
                           hist_msg_sum=float(self.totals[COL["msg_bytes"]]), flows_present=len(self.cum_flows),
                           dst_labels=list(self.dst_labels), dst_busy_ns=self.dst_busy.copy(),
                           src_labels=list(self.src_labels), src_busy_ns=self.src_busy.copy(),
                           globals=np.asarray(globals_).copy(),
                           meta=m, read_ts=read_ts, read_seconds=read_seconds, info=dict(info or {}),
                           timing=self.timing.rows())


def top_flows(flows: np.ndarray, k: int) -> np.ndarray:
    if k <= 0 or len(flows) == 0:
        return np.zeros(0, L.FLOW_DTYPE)
    b = flows["bytes"].astype(np.int64)
    if len(flows) > k:
        idx = np.argpartition(-b, k - 1)[:k]
    else:
        idx = np.arange(len(flows))
    idx = idx[np.lexsort((idx, -b[idx]))]   # by bytes desc, then table order (stable)
    return flows[idx].copy()


def state_from_snapshot(snap: Snapshot, node: str, top_k: int = DEFAULT_TOP_K,
                        max_peers: int = DEFAULT_MAX_PEERS, info: dict | None = None,
                        node_ip: str | None = None) -> ExportState:
    acc = Accumulator(max_peers=max_peers, node_ip=node_ip, window=False)   # a file: one whole read
    acc.add(snap.flows, snap.events, cum_flows=snap.flows)
    return acc.state(node, snap.globals, snap.meta, top_k, read_ts=time.time(), info=info)


# ---- the collector ---------------------------------------------------------------------------
class SkewscopeCollector:
    """prometheus_client custom collector: collect() renders the current ExportState."""

    def __init__(self, get_state):
        self._get_state = get_state

    def describe(self):
        return []  # unchecked collector: families depend on the data

    def collect(self):
        st: ExportState | None = self._get_state()
        if st is None:
            return
        node = st.node
        n = len(st.peer_src)
        rows = [(node, st.peer_src[i], st.peer_dst[i], st.peer_class[i]) for i in range(n)]
        for spec in M.PEER_COUNTERS:
            fam = M.family(spec)
            vals = st.peer_counts[:, COL[spec.column]].tolist()
            for r, v in zip(rows, vals):
                fam.add_metric(r, v)
            yield fam
        fam = M.family(M.PEER_NAKS)
        for syn, col in NAK_SYNDROMES:
            vals = st.peer_counts[:, COL[col]].tolist()
            for r, v in zip(rows, vals):
                fam.add_metric(r + (syn,), v)
        yield fam
        fam = M.family(M.PEER_BUSY_SECONDS)
        for r, v in zip(rows, (st.peer_busy_ns / 1e9).tolist()):
            fam.add_metric(r, v)
        yield fam
        fam = M.family(M.PEER_TIMED_MESSAGE_BYTES)
        for r, v in zip(rows, st.peer_timed[:, 0].tolist()):
            fam.add_metric(r, v)
        yield fam
        fam = M.family(M.PEER_MESSAGE_WIRE_SECONDS)
        for r, v in zip(rows, (st.peer_timed[:, 1] / 1e9).tolist()):
            fam.add_metric(r, v)
        yield fam
        fam = M.family(M.DESTINATION_BUSY_SECONDS)
        for d, v in zip(st.dst_labels, (st.dst_busy_ns / 1e9).tolist()):
            fam.add_metric([node, d], v)
        yield fam
        fam = M.family(M.SOURCE_BUSY_SECONDS)
        for d, v in zip(st.src_labels, (st.src_busy_ns / 1e9).tolist()):
            fam.add_metric([node, d], v)
        yield fam
        fam = M.family(M.PEER_QPS)
        for r, v in zip(rows, st.peer_qps.tolist()):
            fam.add_metric(r, v)
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


# ---- sources (the live one, LiveSource, is skewscope/live/export.py) ---------------------
class StaticSource:
    """A Snapshot file (or a capture through the offline parser): one fixed state."""

    def __init__(self, snap: Snapshot, node: str, top_k: int, max_peers: int, node_ip: str | None = None):
        t0 = time.monotonic()
        st = state_from_snapshot(snap, node, top_k=top_k, max_peers=max_peers, node_ip=node_ip)
        st.read_seconds = time.monotonic() - t0
        self._state = st

    def get(self) -> ExportState:
        return self._state

    def close(self) -> None:
        pass


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


def make_registry(collector: SkewscopeCollector, process_metrics: bool = True):
    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
    if process_metrics:
        ProcessCollector(registry=reg)
    return reg


def render(registry) -> str:
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


def check_node_ip(ip: str) -> str:
    """--node-ip as the analysis writes IPs (compressed); NodeViewError (exit 2) if not an IP."""
    try:
        return ipaddress.ip_address(ip.strip()).compressed
    except ValueError:
        raise NodeViewError(f"--node-ip {ip!r} is not an IP address") from None


def check_node_in(snap: Snapshot, ip: str | None) -> None:
    """A file's --node-ip must be one of its addresses (NodeViewError, exit 2)."""
    if ip is not None and len(snap.flows):
        resolve_node(context(snap), ip)


def default_node() -> str:
    return os.environ.get("SKEWSCOPE_NODE") or socket.gethostname()
