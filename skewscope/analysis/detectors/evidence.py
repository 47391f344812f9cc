"""Typed values the detectors read: what analyze()/live_metrics() computed (Inputs), the
per-group intermediate arrays that never reach the JSON (GroupEvidence), and evidence one
detector computes for others (StallCulprits)."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, NamedTuple

import numpy as np

from skewscope.analysis.detectors.common import few
from skewscope.analysis.flows import STRETCH
from skewscope.analysis.intervals import merge_sorted

#: a node is a stall culprit when the stalled data flows touching it are at least this share
#: of the (remaining) stalled flows
CULPRIT_SHARE = 0.8
#: one host's view: its stalls are its port's when its in- and out-stalls coincide for at
#: least this share of the smaller side's stalled time
COINCIDE = 0.5


@dataclass
class GroupEvidence:
    """A group's intermediate metrics for the detectors (not in the JSON)."""
    links: np.ndarray | None = None           # group_links rows: src, dst, rate_ratio, rate_med_bps, pkts_per_msg, rate_bps
    node_tp: dict | None = None               # node_throughput: send/recv, send_ratio/recv_ratio per member
    start_lag_ns: np.ndarray | None = None    # per member, the median burst start lag as a sender
    send_dev_ns: np.ndarray | None = None     # [burst, member] lateness as a sender
    recv_dev_ns: np.ndarray | None = None     # [burst, member] lateness as a receiver
    decode_start_lag_ns: np.ndarray | None = None   # decode groups: collective-level start lag per member
    a2a_cells: dict | None = None             # all-to-all: per (iteration, phase) volume matrices (group_metrics._iteration_cells)
    kv: dict | None = None                    # kv_transfer: per-transfer arrays (analysis.kv.kv_metrics)
    decode_colls: tuple | None = None         # decode groups: (collective starts, ends) ns (analysis.inference)
    bursts: tuple | None = None               # (iteration starts, ends) ns (timing.group_timing): onset series
    decode_iters: np.ndarray | None = None    # decode groups: token (iteration) starts ns, or None

    @classmethod
    def of(cls, r: dict) -> "GroupEvidence":
        """Read the intermediate (underscore) keys of a group result dict (not removing them)."""
        tinfo = (r.get("decode") or {}).get("_tinfo") or {}
        return cls(links=r.get("_links"), node_tp=r.get("_node_tp"), start_lag_ns=r.get("_start_lag_ns"),
                   send_dev_ns=r.get("_send_dev_ns"), recv_dev_ns=r.get("_recv_dev_ns"),
                   decode_start_lag_ns=tinfo.get("start_lag_ns"), a2a_cells=r.get("_a2a_cells"), kv=r.get("_kv"),
                   decode_colls=_colls(tinfo), bursts=r.get("_bursts"), decode_iters=tinfo.get("iter_starts"))

    @classmethod
    def split(cls, r: dict) -> "GroupEvidence":
        """Take the intermediate (underscore) keys out of a group result dict."""
        dec = r.get("decode") or {}
        tinfo = dec.pop("_tinfo", None) or {}
        r.pop("_mats", None)
        return cls(links=r.pop("_links", None), node_tp=r.pop("_node_tp", None),
                   start_lag_ns=r.pop("_start_lag_ns", None), send_dev_ns=r.pop("_send_dev_ns", None),
                   recv_dev_ns=r.pop("_recv_dev_ns", None), decode_start_lag_ns=tinfo.get("start_lag_ns"),
                   a2a_cells=r.pop("_a2a_cells", None), kv=r.pop("_kv", None), decode_colls=_colls(tinfo),
                   bursts=r.pop("_bursts", None), decode_iters=tinfo.get("iter_starts"))


def _colls(tinfo: dict) -> tuple | None:
    """A decode group's collectives (analysis.inference.decode_metrics)."""
    if tinfo.get("coll_start") is None:
        return None
    return tinfo["coll_start"], tinfo["coll_end"]


class GroupInput(NamedTuple):
    index: int               # into "collectives"
    group: Any               # collectives.Group
    metrics: dict            # the group's JSON metrics
    ev: GroupEvidence


class StallCulprits(NamedTuple):
    culprits: list           # [(node, stalled flow indices)]
    stalled_flows: int       # data flows with a stall >= slow_link.min_stall_s
    irregular: bool          # stalls spread over more than a quarter of the nodes: the capture's timing
    one_host: bool = False   # one host's view whose in- and out-stalls do not coincide


@dataclass
class Inputs:
    """Everything a single-node detector may read."""
    ctx: Any                                  # analysis.context.Context
    th: dict                                  # resolved thresholds {kind: {name: value}}
    congestion: dict                          # congestion_columns: CONG_DTYPE field -> float64 per flow
    pfc: dict                                 # pfc_summary
    stalls: dict                              # node_stalls
    groups: list[GroupInput] = field(default_factory=list)
    incast: dict | None = None                # incast_degree
    incast_senders: dict = field(default_factory=dict)   # {dst node: [sender nodes]}

    @cached_property
    def stall_culprits(self) -> StallCulprits:
        return stall_culprits(self.ctx, self.th)


def stall_culprits(ctx, th) -> StallCulprits:
    """Nodes whose links stall both ways, as outliers: the stalled data flows (a message
    >= 2x its flow's typical duration, by >= slow_link.min_stall_s) are assigned greedily to
    the node most of them share; a node that collects >= CULPRIT_SHARE of the remaining
    stalled flows, with stalled flows both in and out, is a culprit. irregular when stalled
    flows remain spread over more than a quarter of the nodes (the capture's timing, not a
    link). In one host's view (every data flow touches one node) that node collects every
    stall: it is a culprit only when its in- and out-stalls coincide (>= COINCIDE of the
    smaller side's stalled time), else irregular."""
    st = ctx.fstat
    lim = th["slow_link"]["min_stall_s"] * 1e9
    rest = np.nonzero(ctx.data & (st["stall_max_ns"] >= lim))[0]
    total = len(rest)
    out = []
    while len(rest):
        cover = np.bincount(ctx.nodes.src[rest], minlength=ctx.nodes.n) + \
            np.bincount(ctx.nodes.dst[rest], minlength=ctx.nodes.n)
        n = int(cover.argmax())
        if cover[n] < CULPRIT_SHARE * len(rest):
            break
        mine = (ctx.nodes.src[rest] == n) | (ctx.nodes.dst[rest] == n)
        if (ctx.nodes.src[rest][mine] == n).any() and (ctx.nodes.dst[rest][mine] == n).any():
            out.append((n, rest[mine]))
        rest = rest[~mine]
    touched = set(ctx.nodes.src[rest].tolist()) | set(ctx.nodes.dst[rest].tolist())
    irregular = len(rest) > 0 and not few(len(touched), ctx.nodes.n)
    hub = _hub(ctx)
    if hub is not None and any(n == hub for n, _ in out):
        # one host's view: every flow touches the hub, so it collects every stall whatever
        # stalls. Its port pausing stalls its sends and its receives at the same time; in-
        # and out-stalls that do not coincide are its peers' pacing or the capture's timing
        fl = dict(out)[hub]
        src = ctx.nodes.src[fl]
        if _coincidence(ctx, fl[src == hub], fl[src != hub], lim) < COINCIDE:
            out = [(n, f) for n, f in out if n != hub]
            return StallCulprits(out, total, True, True)
    return StallCulprits(out, total, irregular)


def _hub(ctx) -> int | None:
    """The node every data flow touches when there are >= 3 nodes (one host's view), else None."""
    d = np.nonzero(ctx.data)[0]
    if ctx.nodes.n < 3 or not len(d):
        return None
    src, dst = ctx.nodes.src[d], ctx.nodes.dst[d]
    for x in (int(src[0]), int(dst[0])):
        if np.all((src == x) | (dst == x)):
            return x
    return None


def _stalled_intervals(ctx, flows, lim):
    """Merged [start, end] (ns) of the stalled messages of flows (the flows.py definition:
    on-wire time >= STRETCH x what the flow's median rate predicts, by >= lim)."""
    st = ctx.fstat
    ok = ctx.data_events(flows) & ~ctx.ev_read
    f = ctx.ev_flow[ok]
    s = ctx.ev_start[ok]
    e = ctx.events["end_ts"][ok].astype(np.float64)
    by = ctx.events["bytes"][ok].astype(np.float64)
    npk = np.maximum(1.0, np.ceil(by / np.maximum(st["mtu"][f], 1)))
    d = e - s
    med = st["rate_med_bps"][f] / 8e9
    with np.errstate(invalid="ignore", divide="ignore"):
        w = d * npk / np.maximum(npk - 1, 1)
        exp = np.where(med > 0, by / med, np.nan)
        stl = (npk >= 2) & (d > 0) & (w >= STRETCH * exp) & (w - exp >= lim)
    a, b, _ = merge_sorted(np.ascontiguousarray(s[stl]), np.ascontiguousarray(e[stl]), 0.0)
    return a, b


def _coincidence(ctx, out_f, in_f, lim) -> float:
    """Share of the smaller side's stalled time (out- or in-flows) during which the other
    side was stalled too."""
    a1, b1 = _stalled_intervals(ctx, out_f, lim)
    a2, b2 = _stalled_intervals(ctx, in_f, lim)
    t1, t2 = float((b1 - a1).sum()), float((b2 - a2).sum())
    if min(t1, t2) <= 0:
        return 0.0
    a, b = np.concatenate([a1, a2]), np.concatenate([b1, b2])
    o = np.argsort(a, kind="stable")
    ua, ub, _ = merge_sorted(np.ascontiguousarray(a[o]), np.ascontiguousarray(b[o]), 0.0)
    both = t1 + t2 - float((ub - ua).sum())
    return both / min(t1, t2)
