"""The live exporter's per-node timing window without a node (no --node-ip, no node to go
through one by one: `export -i`'s Accumulator(timing_nodes=0)): the window's flows are
tested for a node that could be inferred (exptables.no_common_end) before the analysis, and
where none can be, the analysis is not run -- it would find none (nodeview.infer_node) and
export nothing. Ground truth: nodeview.infer_node on the same tables, and the series of the
same reads with the test disabled (every piece analysed)."""
from __future__ import annotations

import numpy as np
import pytest

from skewscope.analysis.context import context
from skewscope.analysis.flows import CTS_MAX_BYTES
from skewscope.analysis.nodeview import infer_node
from skewscope.core import layout as L
from skewscope.core.snapshot import Snapshot, ip_bytes
from skewscope.outputs import exporter as E
from skewscope.outputs import exptiming
from skewscope.outputs.exptables import no_common_end

ADDRS = ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]


def random_table(rng):
    """Flows between a few addresses with random opclass counters (WRITE, SEND, READ
    requests and responses, ACK, CNP), message sizes around a CTS's bound, some on QP 1;
    records of random flows and opclasses (READ requests among them)."""
    n = int(rng.integers(1, 14))
    fl = np.zeros(n, L.FLOW_DTYPE)
    k = int(rng.integers(2, len(ADDRS) + 1))
    for i in range(n):
        a, b = rng.choice(k, 2, replace=False)
        fl["src"][i] = np.frombuffer(ip_bytes(ADDRS[a])[0], np.uint8)
        fl["dst"][i] = np.frombuffer(ip_bytes(ADDRS[b])[0], np.uint8)
    fl["ipver"], fl["roce"] = 4, 2
    fl["dest_qp"] = rng.choice([1, 0x100, 0x101, 0x102], n, p=[0.1, 0.3, 0.3, 0.3])
    for o in (L.OPC_SEND, L.OPC_WRITE, L.OPC_READ_REQ, L.OPC_READ_RESP, L.OPC_ACK, L.OPC_CNP):
        fl["op"][:, o] = rng.integers(0, 5, n) * (rng.random(n) < 0.4)
    fl["messages"] = rng.integers(0, 4, n)
    mean = rng.choice([64, CTS_MAX_BYTES, CTS_MAX_BYTES + 1, 4096, 1 << 20], n)
    fl["msg_bytes"] = fl["messages"] * mean
    fl["payload_bytes"] = fl["msg_bytes"] * (rng.random(n) < 0.8)
    fl["packets"] = fl["op"].sum(axis=1)
    fl["bytes"] = fl["packets"] * 100
    slot = np.minimum(63, np.floor(np.log2(np.maximum(mean, 1))).astype(int) + 1)
    fl["msg_hist"][np.arange(n), np.minimum(slot, L.MSG_SLOTS - 1)] = fl["messages"]
    m = int(rng.integers(0, 20))
    ev = np.zeros(m, L.EVENT_DTYPE)
    ev["flow"] = rng.integers(-1, n, m)
    ev["opclass"] = rng.choice([L.OPC_WRITE, L.OPC_SEND, L.OPC_READ_REQ], m)
    st = np.sort(rng.integers(0, 1_000_000, m))
    ev["start_ts"], ev["end_ts"] = st, st + 1000
    ev["bytes"] = rng.choice([64, 4096, 1 << 20], m)
    return Snapshot(fl, ev, np.zeros(L.G_N, np.uint64), {})


def test_no_common_end_means_no_node_is_inferred():
    """Where no_common_end says so, the analysis infers no node, on any table (data flows,
    CTS, READs judged by their records, management QP, ACK/CNP-only flows); and it says so
    on tables where the node cannot be inferred often enough to matter."""
    rng = np.random.default_rng(3)
    shown = none = 0
    for _ in range(3000):
        snap = random_table(rng)
        got = no_common_end(snap.flows)
        node = infer_node(context(snap))
        if got:
            assert node is None
            shown += 1
        none += node is None
    assert shown > 60 and none > shown
    assert not no_common_end(np.zeros(0, L.FLOW_DTYPE))


def _reads(tmp_path):
    """A stream of reads whose window's node can be inferred, then cannot (a mirror's read:
    every node's flows), then can again (the mirror's flows left the window): a DPU view
    (node ip) of a generated job in sixths, a quiet read after the second, the whole job's
    records in the third."""
    from skewscope import gen as skewgen
    from skewscope.sources.offline import parse_file
    cap = skewgen.generate("tp-decode-slow-shard", seed=0)
    ip = cap.truth["pathologies"][0]["entities"]["ips"][0]
    cap.write_pcap(str(tmp_path / "all.pcap"), snaplen=128)
    cap.view(ip).write_pcap(str(tmp_path / "v.pcap"), snaplen=128)
    whole, view = parse_file(str(tmp_path / "all.pcap")), parse_file(str(tmp_path / "v.pcap"))
    t = view.events["start_ts"].astype(np.int64)
    span = int(t.max() - t.min())
    cuts = [int(t.min()) + span * k // 6 for k in range(7)]
    cuts[-1] += 1
    out = []
    for k, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])):
        src = whole if k == 2 else view
        tt = src.events["start_ts"].astype(np.int64)
        out.append((src.flows, src.events[(tt >= a) & (tt < b)]))
        if k == 1:
            out.append((view.flows, view.events[:0]))   # a quiet read: the window exports (flush)
    return out, span


def test_node_less_window_exports_what_the_analysis_of_every_piece_does(tmp_path, monkeypatch):
    """Accumulator(timing_nodes=0) without --node-ip over reads whose node can be inferred,
    then cannot, then can again: the timing series and the /metrics text are those of the
    same reads with every piece analysed (the test disabled), the test skipped pieces, and
    the node's series are there."""
    from skewscope.outputs import expose as X
    reads, span = _reads(tmp_path)
    real = exptiming.no_common_end

    def run(test_on):
        skipped = []
        if test_on:
            monkeypatch.setattr(exptiming, "no_common_end", lambda f: skipped.append(real(f)) or skipped[-1])
        else:
            monkeypatch.setattr(exptiming, "no_common_end", lambda f: False)
        acc = E.Accumulator(timing_nodes=0, window_s=span / 12 / 1e9)
        st = [None]
        reg = X.make_registry(X.SkewscopeCollector(lambda: st[0]), process_metrics=False)
        texts = []
        for flows, ev in reads + [(reads[-1][0], reads[-1][1][:0])]:
            acc.add(flows, ev, cum_flows=flows)
            st[0] = acc.state("n", np.zeros(L.G_N, np.uint64), {}, 5, read_ts=1.0)
            texts.append(reg.exposition())
        monkeypatch.setattr(exptiming, "no_common_end", real)
        return [(s.name, k, repr(v)) for s, k, v in acc.timing.rows()], texts, skipped

    rows, texts, skipped = run(True)
    want_rows, want_texts, _ = run(False)
    assert rows == want_rows and texts == want_texts
    assert any(skipped) and not all(skipped)          # the mirror's read skipped, the DPU's not
    assert any(name.startswith("skewscope_node_") for name, _, _ in rows)
