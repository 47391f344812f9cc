"""Cardinality under churn (issue 29; docs/fleet.md "Cardinality"): the exporter's series per
node stay bounded when a new QP appears every second for an hour.

An hour is simulated as 3,600 one-second reads through the live exporter's own path
(`live.flow_delta` of successive cumulative flow tables -> `Accumulator(timing_nodes=0)`, as
skewscope/live/export.py builds it -> the exposition rendered by the real collector, parsed
with prometheus_client's parser). Node 10.0.0.1 is a member of an 8-node all-to-all (one
flow each way with each of its 7 peers, 40 KiB messages); every second a new QP starts a
1 MiB burst (16 x 64 KiB) to one of the peers and is evicted from the flow table (LRU) two
minutes later. The bursts are the table's largest flows, so the top-K flows churn too.
Expected counts come from that construction, not from the exporter.
"""
from __future__ import annotations

import collections

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from skewscope.core import layout as L
from skewscope.core.snapshot import ip_bytes
from skewscope.outputs import exporter as E
from skewscope.outputs import expose as X
from skewscope.sources.live import flow_delta

SELF = "10.0.0.1"
PEERS = [f"10.0.0.{i}" for i in range(2, 9)]
SECONDS = 3600
LRU_S = 120              # a churned QP stays in the flow table this long after it starts
TOP_K = E.DEFAULT_TOP_K
NS = 1_000_000_000


class Flow:
    def __init__(self, src, dst, qp, t0):
        self.src, self.dst, self.qp, self.t0 = src, dst, qp, t0
        self.sb = np.frombuffer(ip_bytes(src)[0], np.uint8)
        self.db = np.frombuffer(ip_bytes(dst)[0], np.uint8)
        self.pk = self.by = self.msgs = self.mb = 0


def table(flows):
    """The cumulative flow table now (one row per flow in it)."""
    f = np.zeros(len(flows), L.FLOW_DTYPE)
    f["src"] = np.stack([x.sb for x in flows])
    f["dst"] = np.stack([x.db for x in flows])
    f["ipver"], f["roce"] = 4, 2
    for col, attr in (("dest_qp", "qp"), ("packets", "pk"), ("bytes", "by"), ("messages", "msgs"),
                      ("msg_bytes", "mb"), ("first_ts", "t0")):
        f[col] = [getattr(x, attr) for x in flows]
    f["op"][:, L.OPC_WRITE] = f["packets"]
    return f


def send(x, t, msgs, size, events):
    """x sends `msgs` WRITEs of `size` bytes (4 KiB packets) starting at t (ns)."""
    for k in range(msgs):
        x.pk += size // 4096
        x.by += size // 4096 * 4154
        x.msgs += 1
        x.mb += size
        s = t + k * 20_000
        events.append((x, s, s + 15_000, size))


def series(text: str) -> dict:
    """{family: number of series} (a histogram's bucket/sum/count samples each one series)."""
    out = collections.Counter()
    for fam in text_string_to_metric_families(text):
        out[fam.name] += len(fam.samples)
    return out


def simulate(new_peer_each_second: bool, max_peers: int, checkpoints, seconds: int = SECONDS):
    """Runs the hour; returns {second: {family: series}} at the checkpoints, the
    exporter's state at the end and the steady flows."""
    acc = E.Accumulator(max_peers=max_peers, node_ip=SELF, timing_nodes=0)
    steady = [Flow(SELF, p, 100 + i, 1) for i, p in enumerate(PEERS)] + \
             [Flow(p, SELF, 200 + i, 1) for i, p in enumerate(PEERS)]
    churn: list[Flow] = []
    prev, out, st = None, {}, None
    for s in range(1, seconds + 1):
        t = s * NS
        events = []
        for x in steady:
            send(x, t, 1, 40 * 1024, events)
        dst = f"10.1.{s >> 8}.{s & 255}" if new_peer_each_second else PEERS[s % len(PEERS)]
        churn.append(Flow(SELF, dst, 10_000 + s, t))
        send(churn[-1], t + 100_000, 16, 64 * 1024, events)
        churn = [x for x in churn if t - x.t0 < LRU_S * NS]          # LRU eviction
        flows = steady + churn
        cum = table(flows)
        d = flow_delta(prev, cum, since_ns=t - NS)
        # the interval's message records, `flow` indexing the delta's rows (QPs are unique)
        qp_to_d = {int(q): j for j, q in enumerate(d["dest_qp"])}
        ev = np.zeros(len(events), L.EVENT_DTYPE)
        ev["flow"] = [qp_to_d[x.qp] for x, _, _, _ in events]
        ev["opclass"] = L.OPC_WRITE
        ev["start_ts"] = [a for _, a, _, _ in events]
        ev["end_ts"] = [b for _, _, b, _ in events]
        ev["bytes"] = [size for _, _, _, size in events]
        acc.add(d, ev, cum_flows=cum)
        prev = cum
        if s in checkpoints:
            st = acc.state("dpu1", np.zeros(L.G_N, np.uint64), {}, TOP_K, read_ts=float(s))
            text = X.render(X.make_registry(X.SkewscopeCollector(lambda: st), process_metrics=False))
            out[s] = series(text)
    return out, st, steady


def per_pair_families(c: dict) -> int:
    return sum(v for k, v in c.items() if k.startswith("skewscope_peer_"))


def test_new_qp_every_second_for_an_hour_keeps_series_constant():
    """QP churn on a fixed set of peers: every family's series count is the same after 10
    minutes and after an hour, and equals docs/fleet.md's formula with P = 14 pair-class rows
    (7 peers x 2 directions, class chunk), D = S = 8 (the node and its 7 peers), K = 10."""
    marks = (600, 1800, SECONDS)
    got, st, steady = simulate(False, E.DEFAULT_MAX_PEERS, marks)
    assert got[600] == got[1800] == got[SECONDS], {k: (got[600][k], got[SECONDS][k]) for k in got[SECONDS]
                                                   if got[600][k] != got[SECONDS][k]}
    c = got[SECONDS]
    P, D, S, K = 2 * len(PEERS), len(PEERS) + 1, len(PEERS) + 1, TOP_K
    assert len(st.peer_src) == P and set(st.peer_class) == {"chunk"}
    assert per_pair_families(c) == 15 * P
    assert c["skewscope_destination_busy_seconds"] == D and c["skewscope_source_busy_seconds"] == S
    assert sum(v for k, v in c.items() if k.startswith("skewscope_flow_")) == 43 * K
    timing = sum(v for k, v in c.items() if k.startswith("skewscope_node_"))
    assert sum(c.values()) == 15 * P + D + S + 43 * K + 129 + timing
    # top-K is by cumulative bytes: the long-lived flows hold it, the churned QPs never enter
    # (their series would churn in Prometheus, 43 per flow: docs/fleet.md "Cardinality")
    assert {int(q) for q in st.flows["dest_qp"]} <= {x.qp for x in steady}


def test_new_peer_every_second_is_capped_by_max_peers():
    """Address churn (each new QP to a new address): pair rows are kept (a counter must not
    vanish) until --max-peers, then everything new adds up in the one overflow row, so the
    series stop growing at 15 x (max_peers + 1) for the pair families (five minutes of it:
    the cap is reached after ~50 s)."""
    max_peers = 64
    got, st, _ = simulate(True, max_peers, (150, 300), seconds=300)      # saturated after ~50 s
    assert got[150] == got[300]
    assert len(st.peer_src) == max_peers + 1 and st.peer_src[-1] == E.OVERFLOW_LABEL
    assert per_pair_families(got[300]) == 15 * (max_peers + 1)
    assert got[300]["skewscope_destination_busy_seconds"] <= max_peers
    assert got[300]["skewscope_source_busy_seconds"] <= max_peers
