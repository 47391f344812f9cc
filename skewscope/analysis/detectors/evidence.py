"""Typed values the detectors read: what analyze()/live_metrics() computed (Inputs), the
per-group intermediate arrays that never reach the JSON (GroupEvidence), and evidence one
detector computes for others (StallCulprits)."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, NamedTuple

import numpy as np

from skewscope.analysis.detectors.common import few

#: a node is a stall culprit when the stalled data flows touching it are at least this share
#: of the (remaining) stalled flows
CULPRIT_SHARE = 0.8


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
    link)."""
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
    return StallCulprits(out, total, irregular)
