"""Prometheus exporter: a Snapshot (from a file) or the live data plane, as /metrics.

One custom Collector (`SkewscopeCollector`) renders the current `ExportState` on every
scrape; no prometheus_client Gauge/Counter objects per series. The state is built by an
`Accumulator`, which turns successive *cumulative* reads of the flow table into per-peer
counters that never go backwards, even when the LRU flow map evicts or re-creates flows:

    per-peer total = (sum of the last-seen values of every flow of the pair that left the
                      table or was re-created) + (sum over the pair's flows present now)

This module holds the state (Accumulator, ExportState, StaticSource); the columns and flow
ids are outputs/exptables.py, the per-node timing series outputs/exptiming.py, the rendering
on a scrape (SkewscopeCollector, registry, OpenMetrics) outputs/expose.py, the live reader
skewscope/live/export.py.

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

from skewscope.analysis.context import context
from skewscope.analysis.nodeview import NodeViewError, resolve_node
from skewscope.core import layout as L
from skewscope.core.rates import join_flows
from skewscope.core.snapshot import Snapshot, ip_str
from skewscope.outputs.exptables import (
    CLASSES,
    CLS_CONTROL,
    COL,
    DEFAULT_MAX_PEERS,
    DEFAULT_TOP_K,
    GAP0,
    MSG0,
    NCOLS,
    OVERFLOW_LABEL,
    RowCache,
    add_flow_counters,
    busy_of,
    busy_ns_per_peer,  # noqa: F401  (the exporter's API: tests, tools)
    dst_ids,
    dst_rows,
    flow_class,
    joined_class,
    message_timing,
    neg_bytes,
    peer_ids,
    peer_counts,
    peer_dst_src_rows,
    peer_rows,
    record_flows,
    record_times,
)
from skewscope.outputs.exptiming import WINDOW_S, TimingAccumulator, WindowedTiming


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
        # per row of cum_flows: class, pair/destination/source rows, flows per pair
        # (exptables.RowCache), carried read to read through the reads' joins; None: made
        # again by the next state() (one pass over the table)
        self._rc: RowCache | None = None
        self.reads = 0

    def _peer_index(self, flows: np.ndarray, cls: np.ndarray, idx: np.ndarray | None = None) -> np.ndarray:
        """Peer row per flow (-1 = overflow). New pairs become rows until max_peers. idx:
        peer_rows(self.peer_keys, flows, cls) when the caller has it."""
        idx = peer_rows(self.peer_keys, flows, cls) if idx is None else idx
        new = np.nonzero(idx < 0)[0]
        room = self.max_peers - len(self.peer_keys)
        if len(new) and room > 0:
            pk = peer_ids(flows, cls)
            _, first = np.unique(pk[new], axis=0, return_index=True)
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
            idx = peer_rows(self.peer_keys, flows, cls)
        return idx

    def _dst_index(self, flows: np.ndarray, end: str = "dst", use: np.ndarray | None = None,
                   idx: np.ndarray | None = None) -> np.ndarray:
        """Destination (end="src": source) row per flow (-1 = none: over the bound, or not in
        `use`). New ones become rows until max_peers. idx: dst_rows of the current keys when
        the caller has it."""
        pre = "dst" if end == "dst" else "src"
        keys, labels = getattr(self, f"{pre}_keys"), getattr(self, f"{pre}_labels")
        idx = dst_rows(keys, flows, end) if idx is None else idx
        new = np.nonzero((idx < 0) & (True if use is None else use))[0]
        room = self.max_peers - len(keys)
        if len(new) and room > 0:
            dk = dst_ids(flows, end)
            _, first = np.unique(dk[new], axis=0, return_index=True)
            take = np.sort(first)[:room]
            k = len(take)
            setattr(self, f"{pre}_keys", np.concatenate([keys, dk[new[take]]]))
            for r in new[take]:
                labels.append(ip_str(flows[r][end], int(flows[r]["ipver"])))
            for a in ("busy", "carry"):
                setattr(self, f"{pre}_{a}", np.concatenate([getattr(self, f"{pre}_{a}"), np.zeros(k, np.int64)]))
            idx = dst_rows(getattr(self, f"{pre}_keys"), flows, end)
        if use is not None:
            idx = np.where(use, idx, -1)
        return idx

    def add(self, delta: np.ndarray, events: np.ndarray | None = None,
            cum_flows: np.ndarray | None = None, cum_rows: np.ndarray | None = None,
            cum_join: np.ndarray | None = None) -> None:
        """delta: FLOW_DTYPE counters accumulated since the previous add; events: the
        message records of the same interval (`flow` indexes `delta`); cum_flows: the
        cumulative flow table now (for the top-K flows and per-pair QP counts); cum_rows:
        each delta row's row in cum_flows when the caller has it (the live session's
        Interval.delta_rows: join_flows(cum_flows, delta) without the join); cum_join: each
        row of cum_flows' row in the cum_flows of the previous add or -1 (Interval.join),
        when the caller has it: the rows the delta does not hold keep what the previous
        read found for them (exptables.RowCache), only the delta's rows are read."""
        self.reads += 1
        rc, self._rc = self._rc, None
        if cum_flows is not None:
            self.cum_flows = cum_flows
        # class from the cumulative table (stable), not from the interval's few messages
        j = None
        if cum_flows is not None and cum_rows is not None and len(cum_rows) == len(delta) and len(delta):
            j = np.ascontiguousarray(cum_rows, dtype=np.int64)
            cls = joined_class(self.cum_flows, j, delta)
        elif len(self.cum_flows) and len(delta):
            j = join_flows(self.cum_flows, delta)          # sorted by key both: one merge
            cls = joined_class(self.cum_flows, j, delta)
        else:
            cls = flow_class(delta)
        has_ev = events is not None and len(events)
        # the rows of the flows' pair, destination and source series: from the previous
        # read's for the rows this one did not change, else one pass over the delta's rows
        rc = (rc.carry(cum_join, j, cls, cum_flows, self.peer_keys, self.dst_keys, self.src_keys)
              if rc is not None and cum_join is not None and cum_flows is not None and j is not None and len(delta)
              else None)
        if rc is not None:
            pr, dr, sr = (rc.pr.take(j).astype(np.int64), rc.dr.take(j).astype(np.int64),
                          rc.sr.take(j).astype(np.int64))
        else:
            pr, dr, sr = (peer_dst_src_rows(self.peer_keys, self.dst_keys, self.src_keys, delta, cls) if has_ev
                          else (None, None, None))
        kp, kd, ks = len(self.peer_keys), len(self.dst_keys), len(self.src_keys)
        peer = self._peer_index(delta, cls, pr)
        if len(self.peer_keys) != kp:
            rc = None             # its -1 peer rows and counts are stale: made again by state()
        if add_flow_counters(delta, peer, self.peer_counts, self.overflow_counts, self.totals):
            self.overflow_used = True
        if has_ev:
            self.events_without_flow += int((events["flow"] < 0).sum())
            npeers = len(self.peer_keys) + 1                   # + the overflow pair, last
            fp = np.where(peer >= 0, peer, npeers - 1)
            # message timing of the flows the records refer to only (a flow's statistics are
            # its own records'; the others add 0): O(records), not O(delta)
            ref, at = record_flows(events["flow"], len(delta))
            fst = message_timing(delta, events, ref, rec_flow=at)
            timed = np.zeros((npeers, 2), dtype=np.float64)
            np.add.at(timed[:, 0], fp[ref], fst["multi_bytes"])
            np.add.at(timed[:, 1], fp[ref], fst["wire_ns"])
            self.peer_timed += timed[:-1]
            self.overflow_timed += timed[-1]
            # each record's on-wire interval (its flow's packet time added), once for the
            # pairs, destinations and sources
            pkt = np.zeros(len(events), dtype=np.float64)
            okr = at >= 0
            pkt[okr] = fst["pkt_ns"][at[okr]]
            times = record_times(events, pkt)
            carry = np.concatenate([self.peer_carry, np.array([self.overflow_carry], np.int64)])
            busy, carry = busy_of(times, fp, npeers, carry)
            self.peer_busy += busy[:-1]
            self.peer_carry = carry[:-1]
            self.overflow_busy += int(busy[-1])
            self.overflow_carry = int(carry[-1])
            di = self._dst_index(delta, idx=dr)
            keep = di >= 0
            if keep.any():
                # (the records of the flows without a row: di -1, skipped)
                busy_d, self.dst_carry = busy_of(times, di, len(self.dst_keys), self.dst_carry)
                self.dst_busy += busy_d
            si = self._dst_index(delta, "src", use=cls != CLS_CONTROL, idx=sr)
            keep = si >= 0
            if keep.any():
                # (the records of the flows without a row: si -1, skipped)
                busy_s, self.src_carry = busy_of(times, si, len(self.src_keys), self.src_carry)
                self.src_busy += busy_s
            if rc is not None:
                if len(self.dst_keys) != kd:
                    rc.forget_misses("dr")
                if len(self.src_keys) != ks:
                    rc.forget_misses("sr")
            if self.window is not None:
                self.window.add(delta, events, cum_flows, cum_rows=j if cum_flows is not None else None,
                                refs=(ref, at))
            else:
                self.timing.add(Snapshot(delta, events, np.zeros(L.G_N, np.uint64), {}), self.node_ip)
        elif self.window is not None:
            self.window.flush()   # a read without records: the node is quiet, close the tail
        if cum_flows is not None:
            self._rc = rc

    def qps_per_peer(self) -> np.ndarray:
        """Flows per exported pair in the cumulative table (last entry: overflow)."""
        rc = self._rc
        if rc is None or rc.kp != len(self.peer_keys) or len(rc) != len(self.cum_flows):
            rc = self._rc = RowCache.fill(self.peer_keys, self.cum_flows)
            if rc is None:
                return peer_counts(self.peer_keys, self.cum_flows)
        return rc.q.copy()

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
    nb = neg_bytes(flows)                   # -bytes as int64
    if len(flows) > k:
        idx = np.argpartition(nb, k - 1)[:k]
    else:
        idx = np.arange(len(flows))
    idx = idx[np.lexsort((idx, nb[idx]))]   # by bytes desc, then table order (stable)
    return flows[idx].copy()


def state_from_snapshot(snap: Snapshot, node: str, top_k: int = DEFAULT_TOP_K,
                        max_peers: int = DEFAULT_MAX_PEERS, info: dict | None = None,
                        node_ip: str | None = None) -> ExportState:
    acc = Accumulator(max_peers=max_peers, node_ip=node_ip, window=False)   # a file: one whole read
    acc.add(snap.flows, snap.events, cum_flows=snap.flows)
    return acc.state(node, snap.globals, snap.meta, top_k, read_ts=time.time(), info=info)


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
