"""A real Open MPI run over soft-RoCE (../shared/data/real/openmpi_softroce_decode_slow_rank*:
Open MPI 4.1.4 ob1/openib, 4 ranks, 20 tokens of 8 ring all-reduces + 100 ms, the rank on
10.77.0.3 entering every all-reduce 40 ms late). Every expectation comes from the run's
truth file (what the MPI program did, measured by the ranks), not from our output: the
ring (expected_bytes_by_ip_pair: who sends to whom), the token period (token_period_s),
the slow rank (ranks[].slow, expected_analysis), the retransmission counters of the NICs
(one completer retry on vm1: a healthy run's single resend)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from skewscope.analysis import analyze, context, node_matrix
from skewscope.analysis.flows import ROLE_NAMES
from skewscope.analysis.nodeview import node_timing
from skewscope.cli.common import load_source

REAL = Path(__file__).resolve().parents[2].parent / "shared/data/real"
BASE = "openmpi_softroce_decode_slow_rank"
pytestmark = pytest.mark.skipif(not (REAL / f"{BASE}.truth.json").is_file(), reason=f"{REAL} not present")


@pytest.fixture(scope="module")
def truth():
    return json.loads((REAL / f"{BASE}.truth.json").read_text())


@pytest.fixture(scope="module")
def mirror():
    snap = load_source(str(REAL / f"{BASE}__mirror_headers128.pcap.gz"))
    return snap, analyze(snap)


def _ring_edges(truth):
    return [tuple(k.split("->")) for k in truth["expected_bytes_by_ip_pair"]]


def _ring_order(edges):
    succ = dict(edges)
    order = [sorted(succ)[0]]
    while succ[order[-1]] != order[0]:
        order.append(succ[order[-1]])
    return order


def _slow(truth):
    return [r["ip"] for r in truth["mpi"]["ranks"] if r["slow"]]


def test_mirror_data_goes_around_the_ring(mirror, truth):
    snap, _ = mirror
    ips, m = node_matrix(snap)
    edges = _ring_edges(truth)
    for a, b in edges:
        got = m[ips.index(a), ips.index(b)]
        want = truth["expected_bytes_by_ip_pair"][f"{a}->{b}"]
        # the wire carries the MPI payload plus ob1/openib headers (truth notes): >=, and close
        assert want <= got <= 1.05 * want, (a, b, got, want)
    # every other byte of data (start-up, barriers, clock sync) is a sliver of the ring's
    ring = sum(m[ips.index(a), ips.index(b)] for a, b in edges)
    assert m.sum() - ring < 0.001 * ring
    # the reverse QPs carry the library's control SENDs, not data
    ctx = context(snap)
    for a, b in edges:
        rev = [i for i in range(len(snap.flows)) if ctx.nodes.ips[ctx.nodes.src[i]] == b
               and ctx.nodes.ips[ctx.nodes.dst[i]] == a and int(snap.flows["dest_qp"][i]) != 1]
        assert rev and all(ROLE_NAMES[ctx.roles[i]] == "cts" for i in rev), (b, a)


def test_mirror_finds_the_ring_its_token_period_and_the_slow_rank(mirror, truth):
    _, an = mirror
    exp = truth["expected_analysis"]
    g = an["collectives"][0]
    assert g["kind"] == exp["collectives"][0]["kind"] == "ring_allreduce"
    assert sorted(g["members"]) == sorted(exp["collectives"][0]["members"])
    order = _ring_order(_ring_edges(truth))
    k = g["members"].index(order[0])
    assert g["members"][k:] + g["members"][:k] == order          # the ring's direction
    # the token period: one token = 8 all-reduces + the 100 ms gap, as the ranks measured it
    per = g["metrics"]["period_s"]
    assert per == pytest.approx(truth["mpi"]["token_period_s"], rel=0.05), per
    assert an["timing"]["period_s"] == pytest.approx(truth["mpi"]["token_period_s"], rel=0.05)
    # the rank every other waits for is named, and nobody else
    want = exp["expected_findings"][0]
    slow = _slow(truth)
    assert set(want["entities_include"]) == set(slow)
    hits = [f for f in an["findings"] if f["kind"] in want["any_of_kinds"] and f["severity"] in ("warning", "critical")]
    assert hits and {f["entities"]["ips"][0] for f in hits} == set(slow), \
        [(f["kind"], f["entities"]["ips"][:2]) for f in hits]
    # its cost: it enters each of the 8 all-reduces of a token 40 ms late (slow_extra), the
    # others wait; the estimate is of that order (not a ring step's, not a whole token's)
    extra = truth["mpi"]["bench_args"]["slow_extra"] * truth["mpi"]["bench_args"]["layers"]
    imp = hits[0]["impact"]["seconds"]
    assert 0.5 * extra <= imp <= 2.0 * extra, (imp, extra)


def test_one_retransmitted_packet_is_a_line_not_a_page(mirror, truth):
    _, an = mirror
    retries = sum(v["rxe_hw_counters_delta"].get("completer_retry_err", 0) for v in truth["network"]["vms"])
    assert retries == 1                                   # the NICs' own count: one resend in the run
    rt = [f for f in an["findings"] if f["kind"] == "retransmissions"]
    assert sum(f["evidence"]["retransmissions"] for f in rt) == retries
    assert all(f["severity"] == "info" for f in rt)
    assert not [f for f in an["findings"] if f["kind"] in ("retransmissions", "packet_loss", "nak_errors")
                and f["severity"] != "info"]


@pytest.mark.parametrize("vm", [1, 2, 3, 4])
def test_each_dpu_sees_its_ring_segment_and_the_token_period(vm, truth):
    snap = load_source(str(REAL / f"{BASE}__vm{vm}_headers128.pcap.gz"))
    an = analyze(snap)
    ip = next(v["ip"] for v in truth["network"]["vms"] if v["vm"] == vm)
    edges = _ring_edges(truth)
    up = next(a for a, b in edges if b == ip)
    down = next(b for a, b in edges if a == ip)
    g = an["collectives"][0]
    assert g["kind"] == "ring_allreduce" and g["pattern"] == "ring_segment"
    assert g["members"] == [up, ip, down]
    assert g["metrics"]["period_s"] == pytest.approx(truth["mpi"]["token_period_s"], rel=0.05)
    nt = node_timing(snap)
    assert nt["node"] == ip
    rings = [x for x in nt["groups"] if x["role"] in ("ring", "tp_decode")]
    assert len(rings) == 1 and rings[0]["upstream"] == [up] and rings[0]["downstream"] == [down]
    assert not [x for x in nt["groups"] if x["role"] == "kv_transfer"]    # barriers are no KV transfer
    assert rings[0]["iteration_s"]["p50"] == pytest.approx(truth["mpi"]["token_period_s"], rel=0.05)
    # one DPU names nobody else (its upstream's late data is an observation), and no healthy
    # node: the stalls every VM's link shows in and out at different times are the capture's
    # and its peers' pacing (the mirror sees them on every node), not its port
    slow = _slow(truth)
    blamed = {(f["entities"]["ips"] or [None])[0] for f in an["findings"] if f["severity"] != "info"}
    assert blamed <= ({ip} if ip in slow else set()), [(f["kind"], f["message"]) for f in an["findings"]]


def test_the_slow_ranks_own_dpu_sees_it_start_late(truth):
    """Only a node's own DPU sees when its node starts a collective against its upstream's
    data: the slow rank (40 ms late into every all-reduce) starts most late, by about that."""
    extra = truth["mpi"]["bench_args"]["slow_extra"]
    offs = {}
    for v in truth["network"]["vms"]:
        snap = load_source(str(REAL / f"{BASE}__vm{v['vm']}_headers128.pcap.gz"))
        nt = node_timing(snap)
        g = next(x for x in nt["groups"] if x["role"] in ("ring", "tp_decode"))
        offs[v["ip"]] = g["start_offset_s"][g["upstream"][0]]["p50"]
    slow = _slow(truth)[0]
    assert min(offs, key=offs.get) == slow, offs
    assert offs[slow] <= -0.5 * extra, offs
    assert all(v > -0.5 * extra for k, v in offs.items() if k != slow), offs
    assert np.isfinite(list(offs.values())).all()
