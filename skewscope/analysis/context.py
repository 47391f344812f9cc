"""Context: everything the metrics share for one Snapshot, computed once and cached.

`context(snap)` returns the Context stored on the Snapshot object (a new Snapshot -> a new
Context), so that `top`, the exporter, `report` and `diagnose` calling several metric
functions on the same Snapshot pay for nodes/roles/per-flow statistics once.
"""
from __future__ import annotations

import copy
from functools import cached_property

import numpy as np

from skewscope.analysis import flows as FL
from skewscope.analysis.hashing import count_u64
from skewscope.analysis.intervals import keyed_busy
from skewscope.core import layout as L
from skewscope.core.jit import njit
from skewscope.core.snapshot import ip_str


class Context:
    def __init__(self, snap):
        # a shallow twin (same arrays, same meta dict), not the Snapshot the Context is cached
        # on: no Snapshot <-> Context cycle, so a dropped interval's columns go at once (the
        # live loop's pooled buffers come back for the next interval, not at a garbage
        # collection)
        self.snap = _twin(snap)
        self.flows = snap.flows
        self.events = snap.events
        self._sizes = {}

    # ---- basics ---------------------------------------------------------------------
    @cached_property
    def cols(self) -> dict:
        """The flow table's scalar fields as contiguous arrays (flows.flow_columns)."""
        return FL.flow_columns(self.flows)

    @cached_property
    def nodes(self) -> FL.Nodes:
        return FL.node_index(self.flows, self.cols)

    @cached_property
    def partner_sport(self) -> np.ndarray:
        return FL.partners_by_sport(self.cols, self.nodes, self.pairs)

    @cached_property
    def roles(self) -> np.ndarray:
        return FL.flow_roles(self.snap, self.nodes, self.partner_sport, self.cols, self.pairs)

    @cached_property
    def pairs(self):
        """flows.pair_table: (pair id per flow, pair keys, reverse pair ids)."""
        return FL.pair_table(self.nodes)

    @cached_property
    def partner(self) -> np.ndarray:
        return FL.partners(self.cols, self.nodes, self.roles, self.partner_sport, self.pairs)

    @cached_property
    def data(self) -> np.ndarray:
        return self.roles == FL.ROLE_DATA

    @cached_property
    def read_flow(self) -> np.ndarray:
        """Per flow: the flow its RDMA READs' data comes back on (flows.read_response_flows)."""
        return FL.read_response_flows(self.cols, self.nodes, self.partner)

    @cached_property
    def _records(self):
        """(flow, opclass) of every record as the analysis reads them: an RDMA READ's record
        (written at its READ REQUEST, on the requester -> responder flow) belongs to the flow
        its data comes back on, with opclass READ_RESP (flow rows out of range: -1 then)."""
        ev = self.events
        nf = len(self.flows)
        if not (nf and len(ev) and (self.read_flow >= 0).any()):
            # no READ to reassign: the records as they are (the kernels range-check the rows)
            return np.ascontiguousarray(ev["flow"]), np.ascontiguousarray(ev["opclass"])
        f = ev["flow"].astype(np.int64)
        f = np.where((f >= 0) & (f < nf), f, -1)
        op = ev["opclass"].copy()
        rf = self.read_flow
        r = (op == L.OPC_READ_REQ) & (f >= 0)
        r[r] &= rf[f[r]] >= 0
        f[r] = rf[f[r]]
        op[r] = L.OPC_READ_RESP
        return f, op

    @cached_property
    def _fstat(self):
        f, op = self._records
        return FL.flow_event_stats(self.snap, self.cols, f, op)

    @property
    def fstat(self) -> np.ndarray:
        return self._fstat[0]

    @cached_property
    def volume(self) -> np.ndarray:
        """Bytes a flow moves for the job: payload bytes of data flows, 0 for the others."""
        v = self.cols["payload_bytes"].astype(np.float64)
        return np.where(self.data, v, 0.0)

    @cached_property
    def scale(self) -> int:
        return max(1, int(self.snap.meta.get("sample_n", 1) or 1))

    @cached_property
    def t0(self) -> float:
        m = self.snap.meta
        cands = []
        c = self.cols
        if len(self.flows) and (c["packets"] > 0).any():
            cands.append(float(c["first_ts"][c["packets"] > 0].min()))
        if m.get("first_ts"):
            cands.append(float(m["first_ts"]))
        return min(cands) if cands else 0.0

    @cached_property
    def duration_ns(self) -> float:
        m = self.snap.meta
        d = float(m.get("duration_s", 0) or 0) * 1e9
        c = self.cols
        if d <= 0 and len(self.flows) and (c["packets"] > 0).any():
            d = float(c["last_ts"].max()) - float(c["first_ts"][c["packets"] > 0].min())
        return max(d, 1.0)

    def flow_keys(self, idx) -> list:
        """[[src ip, dst ip, dest QP] of flow i for i in idx], as report "flows" writes them
        (the node table's strings: no per-flow formatting; the array lookups done once)."""
        idx = np.asarray(idx, dtype=np.int64).reshape(-1)
        if len(idx) == 0:
            return []
        c, nd = self.cols, self.nodes
        v = c["ipver"][idx]
        s, d = nd.src[idx], nd.dst[idx]
        same_s, same_d = (nd.ipver[s] == v).tolist(), (nd.ipver[d] == v).tolist()
        ips = nd.ips
        out = []
        for k, (si, di, q) in enumerate(zip(s.tolist(), d.tolist(), c["dest_qp"][idx].tolist())):
            src = ips[si] if same_s[k] else ip_str(self.flows["src"][idx[k]], int(v[k]))
            dst = ips[di] if same_d[k] else ip_str(self.flows["dst"][idx[k]], int(v[k]))
            out.append([src, dst, int(q)])
        return out

    # ---- events ----------------------------------------------------------------------
    @cached_property
    def _evcols(self):
        ev = self.events
        nf = len(self.flows)
        pkt = self.fstat["pkt_ns"] if nf else np.zeros(1)
        data = self.data if nf else np.zeros(1, dtype=np.bool_)
        f, op = self._records
        # the record table's fields as they lie (strided views): read once, not copied first
        return _event_columns(f, op, ev["start_ts"], ev["end_ts"], ev["bytes"], np.ascontiguousarray(pkt, dtype=np.float64),
                              np.ascontiguousarray(data), nf)

    @property
    def ev_flow(self) -> np.ndarray:
        """Flow row of each record (-1: evicted / unknown)."""
        return self._evcols[0]

    @property
    def ev_start(self) -> np.ndarray:
        return self._evcols[1]

    @property
    def ev_end(self) -> np.ndarray:
        """End of the message on the wire: last packet's timestamp + the flow's packet time."""
        return self._evcols[2]

    @property
    def ev_data(self) -> np.ndarray:
        """Records of data flows that carry data: WRITE/SEND messages and RDMA READs (on the
        flow the READ's data comes back on), without a library's control SENDs on a data
        flow (_event_columns)."""
        return self._evcols[3]

    @cached_property
    def ev_read(self) -> np.ndarray:
        """Records that are an RDMA READ's data (reassigned to the flow its data comes back
        on): their start is the request's, their on-wire time is not known."""
        return self._records[1] == L.OPC_READ_RESP

    def data_events(self, flows) -> np.ndarray:
        """ev_data restricted to the records of `flows` (flow rows): a new bool array."""
        fm = np.zeros(len(self.flows), dtype=bool)
        fm[np.asarray(flows, dtype=np.int64)] = True
        return _of_flows(self.ev_data, self.ev_flow, fm)

    def data_mask(self, flow_mask=None) -> np.ndarray:
        """ev_data restricted to the records of the flows where flow_mask (a bool per flow
        row) holds, all of them when None: a new bool array."""
        if flow_mask is None:
            return self.ev_data.copy()
        return _of_flows(self.ev_data, self.ev_flow, np.ascontiguousarray(flow_mask, dtype=np.bool_))

    def data_sizes(self, flows) -> tuple[np.ndarray, np.ndarray]:
        """The sizes of the data records of `flows` (flow rows): (the distinct sizes sorted,
        int64; how many records have each), counted once per set of flows (a group's size
        hints, its prefill split and its decode test read the same counts)."""
        flows = np.asarray(flows, dtype=np.int64)
        key = flows.tobytes()
        hit = self._sizes.get(key)
        if hit is None:
            v, c = count_u64(self.events["bytes"], self.data_events(flows))
            v = v.astype(np.int64)
            o = np.argsort(v, kind="stable")
            hit = self._sizes[key] = (v[o], c[o])
        return hit

    # ---- node pairs --------------------------------------------------------------------
    @cached_property
    def pair_index(self):
        """Directed node pairs with data flows: (pair id per flow or -1, src node, dst node),
        the pairs in key order (src node, dst node)."""
        nn = max(1, self.nodes.n)
        pid, keys, _ = self.pairs
        pd, uk = _data_pairs(pid, keys, self.data)
        return pd, uk // nn, uk % nn

    @cached_property
    def pair_busy(self):
        pid, ps, _ = self.pair_index
        if len(ps) == 0 or len(self.events) == 0:
            z = np.zeros(len(ps))
            return z, np.full(len(ps), np.nan), np.full(len(ps), np.nan)
        f = self.ev_flow
        k = np.where(self.ev_data, pid[np.maximum(f, 0)], -1)
        return keyed_busy(k, self.ev_start, self.ev_end, len(ps))


@njit(cache=True, nogil=True)
def _data_pairs(pid, keys, data):
    """The pairs of pair_table that carry data, renumbered in key order: (id per flow, -1
    for the other flows; their keys, sorted)."""
    k = keys.shape[0]
    has = np.zeros(k, dtype=np.bool_)
    n = pid.shape[0]
    for i in range(n):
        if data[i]:
            has[pid[i]] = True
    idx = np.nonzero(has)[0]
    o = np.argsort(keys[idx])             # (unique keys: no ties)
    rank = np.full(k, -1, dtype=np.int64)
    uk = np.empty(idx.shape[0], dtype=np.int64)
    for r in range(idx.shape[0]):
        rank[idx[o[r]]] = r
        uk[r] = keys[idx[o[r]]]
    out = np.full(n, -1, dtype=np.int64)
    for i in range(n):
        if data[i]:
            out[i] = rank[pid[i]]
    return out, uk


@njit(cache=True, nogil=True)
def _of_flows(ev_data, ev_flow, fm):
    """ev_data & fm[ev_flow] in one pass (fm: a mask over the flow rows)."""
    n = ev_data.shape[0]
    out = np.zeros(n, dtype=np.bool_)
    for i in range(n):
        if ev_data[i]:
            out[i] = fm[ev_flow[i]]
    return out


#: a SEND record below this size on a data flow whose largest data record is at least
#: CONTROL_RATIO times bigger is a control message (credits, rendezvous headers, FINs,
#: barriers of a verbs library such as Open MPI), not a data message
CONTROL_MAX_BYTES = 1024
CONTROL_RATIO = 8


@njit(cache=True, nogil=True)
def _event_columns(flow, opc, start, end, nbytes, pkt, data, nf):
    """(flow, start, end, data) per record. data: a record of a data flow that carries its
    data: WRITE, SEND (opclass 0/1) or an RDMA READ reassigned to the flow its data comes
    back on (opclass 3); a SEND smaller than CONTROL_MAX_BYTES on a flow whose largest data
    record is >= CONTROL_RATIO x bigger is the library's control, not data."""
    n = flow.shape[0]
    f = np.empty(n, dtype=np.int64)
    s = np.empty(n, dtype=np.float64)
    e = np.empty(n, dtype=np.float64)
    d = np.zeros(n, dtype=np.bool_)
    big = np.zeros(max(nf, 1), dtype=np.int64)
    for i in range(n):
        x = np.int64(flow[i])
        o = opc[i]
        if x >= 0 and x < nf and (o == 0 or o == 1 or o == 3) and np.int64(nbytes[i]) > big[x]:
            big[x] = np.int64(nbytes[i])
    for i in range(n):
        x = np.int64(flow[i])
        if x < 0 or x >= nf:
            x = -1
        f[i] = x
        s[i] = float(start[i])
        e[i] = float(end[i]) + (pkt[x] if x >= 0 else 0.0)
        o = opc[i]
        if x >= 0 and data[x] and (o == 0 or o == 1 or o == 3):
            b = np.int64(nbytes[i])
            d[i] = not (o == 0 and b < CONTROL_MAX_BYTES and b * CONTROL_RATIO <= big[x])
    return f, s, e, d


def _twin(snap):
    t = copy.copy(snap)
    getattr(t, "__dict__", {}).pop("_skewscope_ctx", None)
    return t


def context(snap) -> Context:
    """The cached Context of a Snapshot (or the argument itself if it is a Context)."""
    if isinstance(snap, Context):
        return snap
    ctx = getattr(snap, "_skewscope_ctx", None)
    if ctx is None or ctx.flows is not snap.flows or ctx.events is not snap.events:
        ctx = Context(snap)
        try:
            snap._skewscope_ctx = ctx
        except AttributeError:
            pass
    return ctx
