"""Open MPI over verbs (generator `library: mpi`, issue 25 class 6): the wire shape the
generator promises (docs/generator.md "Other collective libraries"), and the analysis on
it against the generator's truth, over node counts, eager limits (SEND vs RDMA READ by the
receiver) and seeds: a ring all-reduce, a TP decode with a slow rank, an MPI_Alltoallv with
a hot destination, healthy variants quiet. The truth is the model's (which rank is slow,
which destination is hot), never our output."""
from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest

from skewscope import gen as skewgen
from skewscope.analysis import analyze, context, node_matrix
from skewscope.analysis.flows import ROLE_NAMES
from skewscope.analysis.nodeview import node_timing
from skewscope.gen import ScenarioError, load_scenario
from skewscope.sources.offline import parse_file

import sweep_heldout as S


def _parse(cap):
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "x.pcap")
        cap.write_pcap(p, snaplen=128)
        return parse_file(p)


def _mpi(preset, nodes, eager, **top):
    sc = S.variant(preset, nodes=nodes, library="mpi", mpi={"eager_bytes": eager}, **top)
    for p in sc.get("pathologies") or []:
        if p.get("node") is not None and p["node"] >= nodes:
            p["node"] = nodes - 1
    return sc


def test_default_library_changes_nothing():
    sc = load_scenario("ring-healthy")
    assert "library" not in sc and "mpi" not in sc          # the truth's scenario as before
    with pytest.raises(ScenarioError, match="library must be"):
        load_scenario({"library": "gloo", "workloads": [{"kind": "ring_allreduce"}]})
    with pytest.raises(ScenarioError, match="unknown key"):
        load_scenario({"library": "mpi", "mpi": {"eager": 1}, "workloads": [{"kind": "ring_allreduce"}]})


@pytest.mark.parametrize("eager,read", [("1MiB", False), ("12KiB", True)])
def test_wire_shape(eager, read):
    """SENDs for data (no WRITE, no CTS), small control SENDs back, READ REQUESTs by the
    receiver and READ RESPONSEs carrying the data sender -> receiver above the eager limit,
    a start-up exchange between every pair; the parser's data matrix is the model's."""
    sc = {"nodes": 4, "library": "mpi", "mpi": {"eager_bytes": eager}, "iterations": 2, "period_ms": 8.0,
          "workloads": [{"kind": "ring_allreduce", "bytes": "1MiB", "channels": 1}]}
    cap = skewgen.generate(sc, seed=3)
    ops = cap.truth["opcodes"]
    assert not any(k.startswith("RDMA_WRITE") for k in ops)
    assert ("RDMA_READ_REQUEST" in ops) == read and ("RDMA_READ_RESPONSE_FIRST" in ops) == read
    assert ("SEND_FIRST" in ops) != read
    ring = cap.truth["groups"][0]["members"]
    succ = {ring[i]: ring[(i + 1) % 4] for i in range(4)}
    fl = cap.truth["flows"]
    # every pair of ranks spoke at start-up; only the ring's direction carries the bytes
    pairs = {(f["src"], f["dst"]) for f in fl}
    assert len(pairs) == 12
    snap = _parse(cap)
    ips, m = node_matrix(snap)
    for f in fl:
        big = succ[f["src"]] == f["dst"]
        got = m[ips.index(f["src"]), ips.index(f["dst"])]
        if big:
            assert got >= 1 << 20 // 4                       # a quarter of the all-reduce per step
            assert ("RDMA_READ_RESPONSE_FIRST" in f["opcodes"]) == read
        else:
            assert got < 1024, (f["src"], f["dst"], got)    # control and start-up only
    # roles: the model's (data / cts for the reverse direction / data for start-up-only pairs)
    ctx = context(snap)
    want = {(f["src"], f["dst"], f["dest_qp"]): f["role"] for f in fl}
    got = {tuple(k): ROLE_NAMES[r] for k, r in zip(ctx.flow_keys(range(len(snap.flows))), ctx.roles)}
    assert got == want


RING_CASES = [(p, n, e, s) for p in ("ring-healthy", "ring-straggler") for n in (3, 4, 8, 16)
              for e in ("12KiB", "1MiB") for s in (5, 6)]


@pytest.mark.parametrize("preset,nodes,eager,seed", RING_CASES)
def test_ring_allreduce(preset, nodes, eager, seed):
    # an MPI step is slower than NCCL's (rendezvous round trips): iterations far enough
    # apart not to overlap, as a training loop's compute keeps them
    sc = _mpi(preset, nodes, eager, period_ms=4 * S.PRESETS[preset]["period_ms"])
    ok, why = S.check(sc, seed)
    assert ok, why


DECODE_CASES = [(p, n, s) for p in ("tp-decode-healthy", "tp-decode-slow-shard", "mpi-decode-slow-rank")
                for n in (2, 4, 6, 8) for s in (5, 6)]


@pytest.mark.parametrize("preset,nodes,seed", DECODE_CASES)
def test_tp_decode_slow_rank(preset, nodes, seed):
    sc = S.variant(preset, nodes=nodes, library="mpi")
    for p in sc.get("pathologies") or []:
        p["node"] = min(p["node"], nodes - 1)
    ok, why = S.check(sc, seed)
    assert ok, why


A2A_CASES = [(p, n, e, s) for p in ("alltoall-healthy", "moe-hot-expert", "ep-decode-hot-expert", "mpi-alltoallv-hot")
             for n in (4, 6, 8) for e in ("12KiB", "1MiB") for s in (5, 6)]


@pytest.mark.parametrize("preset,nodes,eager,seed", A2A_CASES)
def test_alltoallv_hot_destination(preset, nodes, eager, seed):
    ok, why = S.check(_mpi(preset, nodes, eager), seed)
    assert ok, why


@pytest.mark.parametrize("nodes", [4, 6])
def test_each_dpu_on_an_mpi_decode(nodes):
    """One DPU per node: every view is a ring segment with the model's neighbours; the slow
    rank's own DPU sees its own forward latency (the truth's lag) and nobody blames another
    node from one view."""
    sc = S.variant("mpi-decode-slow-rank", nodes=nodes)
    sc["pathologies"][0]["node"] = nodes - 2
    cap = skewgen.generate(sc, seed=4)
    slow = cap.truth["pathologies"][0]["entities"]["ips"][0]
    lag = sc["pathologies"][0]["lag_us"] * 1e-6
    ring = cap.truth["groups"][0]["members"]
    fwd = {}
    for ip, view in cap.views().items():
        snap = _parse(view)
        an = analyze(snap)
        i = ring.index(ip)
        g = an["collectives"][0]
        assert (g["kind"], g["pattern"]) == ("ring_allreduce", "ring_segment")
        assert g["members"] == [ring[i - 1], ip, ring[(i + 1) % nodes]]
        blamed = {f["entities"]["ips"][0] for f in an["findings"] if f["severity"] != "info"
                  and f["kind"] in ("ring_straggler", "slow_tp_shard", "straggler", "slow_link")}
        assert blamed <= {ip}, (ip, blamed)
        (rg,) = [x for x in node_timing(snap)["groups"] if x["role"] in ("ring", "tp_decode")]
        fwd[ip] = rg["forward_latency_s"]["p50"]
    assert max(fwd, key=fwd.get) == slow
    assert fwd[slow] >= 0.8 * lag and all(v < 0.5 * lag for k, v in fwd.items() if k != slow), fwd
    assert np.isfinite(list(fwd.values())).all()
