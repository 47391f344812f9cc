"""Context: everything the metrics share for one Snapshot, computed once and cached.

`context(snap)` returns the Context stored on the Snapshot object (a new Snapshot -> a new
Context), so that `top`, the exporter, `report` and `diagnose` calling several metric
functions on the same Snapshot pay for nodes/roles/per-flow statistics once.
"""
from __future__ import annotations

from functools import cached_property

import numpy as np

from .. import layout as L
from . import flows as FL
from .intervals import keyed_busy


class Context:
    def __init__(self, snap):
        self.snap = snap
        self.flows = snap.flows
        self.events = snap.events

    # ---- basics ---------------------------------------------------------------------
    @cached_property
    def nodes(self) -> FL.Nodes:
        return FL.node_index(self.flows)

    @cached_property
    def partner_sport(self) -> np.ndarray:
        return FL.partners_by_sport(self.flows, self.nodes)

    @cached_property
    def roles(self) -> np.ndarray:
        return FL.flow_roles(self.snap, self.nodes, self.partner_sport)

    @cached_property
    def partner(self) -> np.ndarray:
        return FL.partners(self.flows, self.nodes, self.roles, self.partner_sport)

    @cached_property
    def data(self) -> np.ndarray:
        return self.roles == FL.ROLE_DATA

    @cached_property
    def _fstat(self):
        return FL.flow_event_stats(self.snap)

    @property
    def fstat(self) -> np.ndarray:
        return self._fstat[0]

    @property
    def ev_order(self) -> np.ndarray:
        return self._fstat[1]

    @property
    def ev_off(self) -> np.ndarray:
        return self._fstat[2]

    @cached_property
    def volume(self) -> np.ndarray:
        """Bytes a flow moves for the job: payload bytes of data flows, 0 for the others."""
        v = self.flows["payload_bytes"].astype(np.float64)
        return np.where(self.data, v, 0.0)

    @cached_property
    def scale(self) -> int:
        return max(1, int(self.snap.meta.get("sample_n", 1) or 1))

    @cached_property
    def t0(self) -> float:
        m = self.snap.meta
        cands = []
        if len(self.flows):
            cands.append(float(self.flows["first_ts"][self.flows["packets"] > 0].min()) if (self.flows["packets"] > 0).any() else 0.0)
        if m.get("first_ts"):
            cands.append(float(m["first_ts"]))
        return min(cands) if cands else 0.0

    @cached_property
    def duration_ns(self) -> float:
        m = self.snap.meta
        d = float(m.get("duration_s", 0) or 0) * 1e9
        if d <= 0 and len(self.flows):
            d = float(self.flows["last_ts"].max()) - float(self.flows["first_ts"][self.flows["packets"] > 0].min()) \
                if (self.flows["packets"] > 0).any() else 0.0
        return max(d, 1.0)

    # ---- events ----------------------------------------------------------------------
    @cached_property
    def ev_flow(self) -> np.ndarray:
        f = self.events["flow"].astype(np.int64)
        f[(f < 0) | (f >= len(self.flows))] = -1
        return f

    @cached_property
    def ev_start(self) -> np.ndarray:
        return self.events["start_ts"].astype(np.float64)

    @cached_property
    def ev_end(self) -> np.ndarray:
        """End of the message on the wire: last packet's timestamp + the flow's packet time."""
        e = self.events["end_ts"].astype(np.float64)
        f = self.ev_flow
        pk = np.where(f >= 0, self.fstat["pkt_ns"][np.maximum(f, 0)] if len(self.flows) else 0.0, 0.0)
        return e + pk

    @cached_property
    def ev_data(self) -> np.ndarray:
        """Records of data flows that carry data (WRITE/SEND)."""
        f = self.ev_flow
        ok = f >= 0
        out = np.zeros(len(f), dtype=bool)
        if len(self.flows):
            out[ok] = self.data[f[ok]]
        op = self.events["opclass"]
        return out & ((op == L.OPC_WRITE) | (op == L.OPC_SEND))

    # ---- node pairs --------------------------------------------------------------------
    @cached_property
    def pair_index(self):
        """Directed node pairs with data flows: (pair id per flow or -1, src node, dst node)."""
        nn = max(1, self.nodes.n)
        key = self.nodes.src.astype(np.int64) * nn + self.nodes.dst.astype(np.int64)
        key = np.where(self.data, key, -1)
        uk = np.unique(key[key >= 0])
        pid = np.full(len(key), -1, dtype=np.int64)
        if len(uk):
            pid[key >= 0] = np.searchsorted(uk, key[key >= 0])
        return pid, (uk // nn).astype(np.int64), (uk % nn).astype(np.int64)

    @cached_property
    def pair_busy(self):
        pid, ps, _ = self.pair_index
        if len(ps) == 0 or len(self.events) == 0:
            z = np.zeros(len(ps))
            return z, np.full(len(ps), np.nan), np.full(len(ps), np.nan)
        f = self.ev_flow
        k = np.where(self.ev_data, pid[np.maximum(f, 0)], -1)
        return keyed_busy(k, self.ev_start, self.ev_end, len(ps))


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
