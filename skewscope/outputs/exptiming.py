"""The exporter's per-node timing series (analysis.nodeview): TimingAccumulator (histograms
per node and peer of step/collective/iteration durations, offsets, forward latency, own
lag) and WindowedTiming (the live records of the last WINDOW_S seconds, exported once a
group's role is fixed)."""
from __future__ import annotations

from collections import namedtuple
from functools import cached_property

import numpy as np

from skewscope.analysis import flows as FL
from skewscope.analysis.context import Context
from skewscope.analysis.nodeview import NodeViewError, events_of, per_node_timing
from skewscope.core import layout as L
from skewscope.core.rates import join_flows
from skewscope.core.snapshot import _KEY_PREFIX, Snapshot, flow_key_words, ip_bytes, match_rows, take_rows
from skewscope.outputs import metrics as M
from skewscope.outputs.exptables import (DEFAULT_MAX_PEERS, OVERFLOW_LABEL, _col, cumulative_buckets, fmt_le,
                                         keep_rows, match_key_rows, no_common_end, put_rows,
                                         rec_concat, rec_copy, rec_take, record_flows)

# ---- per-node timing (analysis.nodeview) ---------------------------------------------------
DUR_LE_STR = [fmt_le(v) for v in M.DURATION_BUCKETS] + ["+Inf"]
OFF_LE_STR = [fmt_le(v) for v in M.OFFSET_BUCKETS] + ["+Inf"]
LE_STR = {id(b): [fmt_le(v) for v in b] + ["+Inf"]
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


def _key_words(t: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """flow_key_words(t[rows]) from the rows' key bytes only (not their whole 850 bytes)."""
    if not (t.dtype == L.FLOW_DTYPE and t.flags.c_contiguous and _KEY_PREFIX and len(t)):
        return flow_key_words(take_rows(t, rows))
    nk = L.FLOW_KEY_DTYPE.itemsize
    k = t.view(np.uint8).reshape(len(t), t.dtype.itemsize)[rows, :nk]
    k[:, _KEY_PREFIX:] = 0
    return k.view("<u8").reshape(len(rows), nk // 8)


#: the flows context of the window's pieces shares: what depends on the flow table alone
_FLOWS_ONLY = ("cols", "nodes", "pairs", "partner_sport")
#: ... and the roles and what follows from them when no flow mixes RDMA READ requests with
#: SENDs/WRITEs (flows.flow_roles reads the records of those flows only, the rest of it the
#: table): one roles pass per read, not one per piece
_ROLES = ("roles", "data", "partner", "read_flow")


def _flows_only(ctx) -> dict:
    """The entries of ctx the next piece of the same flow table may reuse."""
    d = ctx.__dict__
    keys = _FLOWS_ONLY
    if "cols" in d:
        op = d["cols"]["op"]
        if not ((op[:, L.OPC_READ_REQ] > 0) & ((op[:, L.OPC_SEND] > 0) | (op[:, L.OPC_WRITE] > 0))).any():
            keys = keys + _ROLES
    return {k: d[k] for k in keys if k in d}


def _merge_by_start(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Records a then b, stably sorted by start_ts, when a and b are each sorted (the window
    and a piece of a read): one merge, not a sort of the whole window per piece."""
    if not len(a) or not len(b) or a["start_ts"][-1] <= b["start_ts"][0]:
        return rec_concat(a, b)
    pos = np.searchsorted(a["start_ts"], b["start_ts"], side="right") + np.arange(len(b))
    rest = np.ones(len(a) + len(b), dtype=bool)
    rest[pos] = False
    # the merged order as indices into a then b (one gather of the records' bytes)
    at = np.empty(len(rest), dtype=np.int64)
    at[pos] = len(a) + np.arange(len(b))
    at[rest] = np.arange(len(a))
    return rec_take(rec_concat(a, b), at)


#: what analysis.flows.flow_event_stats reads of a Snapshot (flows: its length only, when
#: the caller gives the columns)
_Records = namedtuple("_Records", "flows events")


class _PieceContext(Context):
    """The Context of one piece of a read: its per-flow record statistics (Context._fstat)
    made by WindowedTiming._piece_fstat (those made last, for the flows whose records or row
    changed since made again), computed only when the analysis asks for them."""
    window = None

    @cached_property
    def _fstat(self):
        return self.window._piece_fstat(self)


def _piece_context(snap, window) -> Context:
    """A _PieceContext of snap, cached on it as analysis.context.context() caches its own."""
    ctx = _PieceContext(snap)
    ctx.window = window
    snap._skewscope_ctx = ctx
    return ctx


def _same_flows(a, b) -> bool:
    """READ response flows a (Context.read_flow of the statistics kept; None: not made) are
    those of b for a's rows (b may have rows appended since)."""
    if a is None or b is None:
        return a is b
    return a is b or (len(a) <= len(b) and np.array_equal(a, b[:len(a)]))


def _node_words(ip: str | None) -> np.ndarray | None:
    """The 16 address bytes of ip (as the flow table holds them) as two u64 words; None
    without an ip (or one that is not an address: the whole window is analysed then)."""
    if ip is None:
        return None
    try:
        b, _ = ip_bytes(str(ip).strip())
    except ValueError:
        return None
    return np.frombuffer(b, dtype="<u8").copy()


#: a known node's view replaces the window in the analysis when it holds at most this
#: share of the window's flows (else the whole window: its per-flow statistics are carried
#: piece to piece, _piece_fstat; a DPU's own window is all its node's view)
VIEW_SHARE = 0.5


def _extend(a: np.ndarray, n: int, fill) -> np.ndarray:
    """a with rows up to n of `fill` (a itself when it has them)."""
    if len(a) >= n:
        return a
    out = np.zeros(n, dtype=a.dtype) if fill == 0 else np.full(n, fill, dtype=a.dtype)
    out[:len(a)] = a
    return out


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
        self.flows = np.zeros(0, L.FLOW_DTYPE)      # the first rows of _buf
        # a known node's view of the window (its flows, each window row's row in them or -1),
        # made once per flow table (_node_view), None: not made; False: the whole window
        self._node = _node_words(node_ip)
        self._view = None
        # no node known nor to go through (max_nodes 0): whether the window's flows show
        # that none can be inferred (exptables.no_common_end), made once per flow table
        self._apart = None
        self._buf = self.flows
        self.keys = np.zeros((0, L.FLOW_KEY_DTYPE.itemsize // 8), np.uint64)   # flow_key_words(self.flows)
        self._shared = None       # within one add: the flows-only context of its pieces
        # the per-flow record statistics made last (flow_event_stats: st, order, off; the
        # READ response flows the records were reassigned by), carried from read to read, and
        # the flow rows whose records or row changed since (_piece_fstat)
        self._fst = None
        self._moved: list = []
        self.events = np.zeros(0, L.EVENT_DTYPE)
        self.wm: dict = {}        # group -> samples before this time (ns) are exported
        self.role: dict = {}      # group -> its fixed role
        self.seen: dict = {}      # group -> iteration starts of the previous read
        self.pending = False      # records not yet exported (flush has work)
        self.horizon = 0          # export boundaries up to this time (ns)
        self.full = False         # the window has spanned WINDOW_S (or held max_records)

    def add(self, delta: np.ndarray, events: np.ndarray | None, cum_flows: np.ndarray | None = None,
            cum_rows: np.ndarray | None = None, refs: tuple | None = None) -> None:
        """cum_rows: each delta row's row in cum_flows (-1: none) when the caller joined them
        already (the Accumulator does: a second join of the whole table is not needed);
        refs: exptables.record_flows(events["flow"], len(delta)) when the caller has it."""
        self._shared = None
        if events is None or not len(events):
            self.flush()
            return
        ev = rec_copy(events)
        # only the flows the records refer to stay in the window: carry just those (the
        # rest of the table would be copied and matched only to be dropped below; at
        # 1,048,576 flows that was most of the exporter's per-read time)
        ref, f = record_flows(ev["flow"], len(delta)) if refs is None else refs
        ok = f >= 0
        # the cumulative row (stable counters: roles, mean message size) where there is one
        if cum_flows is not None and len(cum_flows) and len(ref):
            jc = join_flows(cum_flows, take_rows(delta, ref)) if cum_rows is None else np.asarray(cum_rows)[ref]
        else:
            cum_flows, jc = delta, np.full(len(ref), -1, np.int64)
        got = match_key_rows(delta, ref, self.keys)     # the rows' keys and window rows, one pass
        if got is not None:
            keys, j = got
        else:
            keys = _key_words(delta, ref)
            if len(self.flows) and len(ref):
                j = match_rows(self.keys, keys).astype(np.int64)
            else:
                j = np.full(len(ref), -1, np.int64)
        # the rows the read brings again are written over in place, the new ones appended
        new = np.nonzero(j < 0)[0]
        j[new] = len(self.flows) + np.arange(len(new))
        self._grow(len(new))
        put_rows(self.flows, j, cum_flows, jc, delta, ref)
        self._view = self._apart = None
        if self._fst is not None:      # (none kept: the next ones are made whole)
            self._moved.append(j)      # rows written: their statistics are made again
        self.keys = np.concatenate([self.keys, keys[new]])
        ev["flow"][ok] = j[f[ok]]
        # a read longer than a quarter window (or of many records) goes in pieces: the
        # window never drops records it has not exported from
        t = ev["start_ts"].astype(np.int64)
        if not bool(np.all(t[1:] >= t[:-1])):     # (a read's records are in start order)
            o = np.argsort(ev["start_ts"], kind="stable")
            ev, t = rec_take(ev, o), t[o]
        piece = np.maximum((t - t[0]) // max(1, self.window_ns // 4), np.arange(len(t)) // max(1, self.max_records // 4))
        cut = np.r_[0, np.flatnonzero(piece[1:] != piece[:-1]) + 1, len(piece)]   # piece: non-decreasing
        for a, b in zip(cut[:-1].tolist(), cut[1:].tolist()):
            self._slide(ev[a:b])
        # the flows the window still refers to (in order; numbered again)
        w = self.events
        wf = w["flow"]
        okw = wf >= 0
        mark = np.zeros(len(self.flows), dtype=bool)
        mark[wf[okw]] = True
        if not mark.all():
            used = np.nonzero(mark)[0]
            w["flow"][okw] = (np.cumsum(mark) - 1)[wf[okw]]
            self.flows = keep_rows(self.flows, used)
            self.keys = self.keys[used]
            self._renumber(mark)
            self._view = self._apart = None
        self._shared = None

    def _renumber(self, mark) -> None:
        """The per-flow record statistics carried to the next read (and the rows whose
        statistics are due) in the flow table's new numbering: the rows where mark."""
        if self._fst is None:
            self._moved = []
            return
        n = len(mark)
        at = np.cumsum(mark) - 1
        m = np.concatenate(self._moved).astype(np.int64) if self._moved else np.zeros(0, np.int64)
        m = m[(m >= 0) & (m < n)]
        self._moved = [at[m[mark[m]]]]
        st, _, _, rf = self._fst
        used = np.flatnonzero(mark)
        # rows the statistics do not cover yet (appended by this read: all due) as zeros
        st = _extend(st, n, 0)[used]
        if rf is not None:
            r = _extend(rf, n, -1)[used]
            ok = r >= 0
            r[ok] = np.where(mark[r[ok]], at[r[ok]], -2)   # -2: a dropped flow (never equal)
            rf = r
        self._fst = (st, None, None, rf)

    def _grow(self, k: int) -> None:
        """self.flows k rows longer (rows undefined), in the window's own buffer while it
        has room (half as much again when it has to move)."""
        n = len(self.flows)
        if n + k > len(self._buf):
            buf = np.empty(n + k + (n + k) // 2, dtype=L.FLOW_DTYPE)
            buf[:n] = self.flows
            self._buf = buf
        self.flows = self._buf[:n + k]

    def _slide(self, ev) -> None:
        allev = _merge_by_start(self.events, ev)
        # nothing exported yet: keep everything (up to max_records)
        cut = int(allev["end_ts"].max()) - self.window_ns if self.wm else np.iinfo(np.int64).min
        live = [w for w in self.wm.values() if w >= cut]   # groups gone for a window: not kept
        if live:
            cut = min(cut, min(live) - self.window_ns // 2)
        lo = int(np.searchsorted(allev["start_ts"].astype(np.int64), cut, side="left"))   # sorted: a suffix
        capped = len(allev) - lo > self.max_records
        if self.max_records > 0:     # (allev[-0:]: all of it)
            lo = max(lo, len(allev) - self.max_records)
        # the flows whose records changed: the piece's and those of the records that leave
        if self._fst is not None:
            self._moved += [ev["flow"], allev["flow"][:lo]]
        allev = allev[lo:]
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

    def _node_view(self):
        """(the window's rows with the known node as an end, their flow table, each window
        row's row in it or -1), made once per flow table; None: analyse the whole window (no
        node known, or its view holds more than VIEW_SHARE of the flows)."""
        if self._node is None:
            return None
        if self._view is None:
            n = len(self.flows)
            self._view = False
            if n:
                t = self.flows
                a, b = self._node
                s, d = _col(t, "src", 2), _col(t, "dst", 2)
                rows = np.flatnonzero(((s[:, 0] == a) & (s[:, 1] == b)) | ((d[:, 0] == a) & (d[:, 1] == b)))
                if len(rows) <= VIEW_SHARE * n:
                    at = np.full(n, -1, dtype=np.int64)
                    at[rows] = np.arange(len(rows))
                    self._view = (rows, take_rows(t, rows), at)
        return self._view or None

    def _export(self, final: bool) -> None:
        if self.node_ip is None and self.timing.max_nodes <= 0:
            # no node given and none to go through one by one: per_node_timing has a node
            # only when it infers one; where the window's flows show it cannot, it is []
            if self._apart is None:
                self._apart = no_common_end(self.flows)
            if self._apart:
                return
        view = self._node_view()
        if view is not None:
            # a known node: its timing is a function of the flows it is an end of and their
            # records alone (analysis.nodeview: per flow, node pair and partner; a DPU's
            # own view is that), so the analysis reads its view, not the whole window (the
            # fabric's flows, with a mirror's or a switch's reads)
            _, vflows, at = view
            snap = Snapshot(vflows, events_of(self.events, at), np.zeros(L.G_N, np.uint64), {})
            ctx = Context(snap)
            snap._skewscope_ctx = ctx
            self._fst, self._moved = None, []     # the whole window's statistics: made again
        else:
            snap = Snapshot(self.flows, self.events, np.zeros(L.G_N, np.uint64), {})
            # the pieces of one read share its flow table: columns, nodes, pairs, sport partners
            # (and roles, when they do not read the records: _flows_only) made once per read;
            # the per-flow record statistics are made again only for the flows whose records
            # changed (_piece_fstat)
            ctx = _piece_context(snap, self)
        if self._shared is not None:
            ctx.__dict__.update(self._shared)
        try:
            res = per_node_timing(snap, self.node_ip, max_nodes=self.timing.max_nodes, samples=True)
        except NodeViewError:
            return
        finally:
            self._shared = _flows_only(ctx)
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

    def _piece_fstat(self, ctx):
        """Context._fstat of a piece (flow_event_stats over the whole window): a flow's
        statistics are a function of its own records (in window order) and its flow-table
        row alone, so only the flows whose records came or went, or whose row a read wrote,
        since the statistics last made are computed again, from their records; the rest are
        kept. The first statistics, or READ response flows that changed (records reassigned
        otherwise), compute them all. Carried from read to read too
        (WindowedTiming._renumber): the rows a read writes are among the moved ones."""
        f, op = ctx._records
        nf = len(ctx.flows)
        rf = ctx.__dict__.get("read_flow")
        prev, moved = self._fst, self._moved
        self._moved = []
        if prev is None or len(prev[0]) > nf or not _same_flows(prev[3], rf):
            got = FL.flow_event_stats(ctx.snap, ctx.cols, f, op)
            self._fst = got + (rf,)
            return got
        st = _extend(prev[0], nf, 0)      # rows appended since: among the moved ones
        raw = np.concatenate(moved).astype(np.int64) if moved else np.zeros(0, np.int64)
        raw = raw[(raw >= 0) & (raw < nf)]
        mark = np.zeros(nf + 1, dtype=bool)
        mark[raw] = True
        if rf is not None and len(raw):
            to = rf[raw]
            mark[to[to >= 0]] = True      # an RDMA READ's record counts on its data's flow
        aff = np.flatnonzero(mark[:nf])
        if len(aff):
            ff = np.asarray(f, dtype=np.int64)
            sel = np.flatnonzero(mark[np.where((ff >= 0) & (ff < nf), ff, nf)])
            at = np.full(nf, -1, dtype=np.int64)
            at[aff] = np.arange(len(aff))
            sub = FL.flow_event_stats(_Records(aff, ctx.events[sel]), {"op": ctx.cols["op"][aff]},
                                      at[ff[sel]], np.asarray(op)[sel])[0]
            v = np.dtype((np.void, st.dtype.itemsize))      # whole rows, not field by field
            st.view(v)[aff] = sub.view(v)        # in place: the previous piece's Context is gone
        order, off = FL.csr_by_key(np.ascontiguousarray(f), nf)
        self._fst = (st, order, off, rf)
        return st, order, off

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


