"""One DPU's view of a ring (issue 25, class 4): what `diagnose` of a single node's capture
may honestly say, against the generator's truth. Each node's view is generated with its
own clock off by up to +-5 ms (`Capture.view(i, clock_skew_us=5000)`), in TP decode rings of
6 and 8 nodes with a slow shard (and a training ring with a late member), under data-flow
and barrier-synchronised step timing:

* the slow node's own DPU names it (slow_tp_shard / ring_straggler, warning or critical),
  with a lag per step near the injected one;
* no view raises a warning or a critical against any other node, nor any warning at all
  in a healthy member's view (before: four healthy DPUs of an 8-way data-flow ring raised
  decode_jitter, the slow node's own said nothing);
* a late upstream is an `late_upstream` info naming the view's upstream (the ring order of
  the truth), never the upstream of a healthy ring.
"""
from __future__ import annotations

import pytest

from skewscope import gen as skewgen
from skewscope.analysis import analyze
from skewscope.sources.offline import parse_file

SKEW_US = 5000.0
TPD = {"kind": "decode_tp", "layers": 8, "allreduces_per_layer": 2, "tokens": 5, "hidden": 8192,
       "batch": 1, "dtype_bytes": 2, "compute_gap_us": 2000, "layer_compute_us": 10}
BLAME = {"slow_tp_shard", "ring_straggler", "straggler", "rotating_straggler", "slow_link", "slow_receiver"}


def tp(nodes, lag, slow, sync, mtu=4096, **path):
    w = dict(TPD)
    if sync != "dataflow":
        w["step_sync"] = sync
    sc = {"nodes": nodes, "mtu": mtu, "workloads": [w]}
    if lag:
        sc["pathologies"] = [{"kind": "slow_tp_shard", "node": slow, "lag_us": lag, **path}]
    return sc


def ring(nodes, lag, slow, sync):
    w = {"kind": "ring_allreduce", "bytes": "2MiB", "channels": 1}
    if sync != "dataflow":
        w["step_sync"] = sync
    sc = {"nodes": nodes, "iterations": 4, "period_ms": 8.0, "workloads": [w]}
    if lag:
        sc["pathologies"] = [{"kind": "straggler", "node": slow, "rate_factor": 1.0, "start_lag_us": lag}]
    return sc


def view_findings(tmp_path, sc, seed):
    cap = skewgen.generate(sc, seed=seed)
    out = {}
    for i, ip in enumerate(cap.job.ip_str):
        p = tmp_path / f"v{i}.pcap"
        cap.view(i, clock_skew_us=SKEW_US).write_pcap(str(p), snaplen=128)
        out[ip] = analyze(parse_file(str(p)))["findings"]
    return cap, out


def ring_order(cap) -> list:
    g = next(g for g in cap.truth["groups"] if g["kind"] in ("tp_decode_allreduce", "ring_allreduce"))
    return list(g["details"].get("ring") or g["members"])


def warnings(fs):
    return [f for f in fs if f["severity"] in ("warning", "critical")]


SLOW = [
    # (scenario, seed, kind the slow node's own DPU reports, injected lag us)
    (tp(6, 80, 3, "dataflow"), 3, "slow_tp_shard", 80.0),
    (tp(8, 80, 4, "dataflow"), 5, "slow_tp_shard", 80.0),
    (tp(8, 25, 7, "dataflow", mtu=1024, lag_per="send"), 6, "slow_tp_shard", 25.0),
    (tp(6, 80, 0, "barrier"), 3, "slow_tp_shard", 80.0),
    (tp(8, 25, 5, "barrier"), 4, "slow_tp_shard", 25.0),
    (ring(5, 80, 2, "dataflow"), 3, "ring_straggler", 80.0),
    (ring(4, 80, 1, "barrier"), 4, "ring_straggler", 80.0),
]


@pytest.mark.parametrize("sc,seed,kind,lag_us", SLOW,
                         ids=[f"{s['workloads'][0]['kind']}-n{s['nodes']}-{s['workloads'][0].get('step_sync', 'dataflow')}"
                              f"-lag{lag:g}" for s, _, _, lag in SLOW])
def test_only_the_slow_nodes_own_dpu_blames_it(tmp_path, sc, seed, kind, lag_us):
    cap, fs = view_findings(tmp_path, sc, seed)
    pat = cap.truth["pathologies"][0]
    slow = pat["entities"]["ips"][0]
    own = [f for f in warnings(fs[slow]) if f["kind"] == kind and f["entities"]["ips"][0] == slow]
    assert own, (slow, [(f["kind"], f["severity"], f["entities"]["ips"][:2]) for f in fs[slow]])
    assert abs(own[0]["evidence"]["lag_per_step_s"] * 1e6 - lag_us) <= 0.1 * lag_us + 1.0, own[0]["evidence"]
    order = ring_order(cap)
    up = {order[(k + 1) % len(order)]: order[k] for k in range(len(order))}
    for ip, f_ in fs.items():
        if ip == slow:
            continue
        # a healthy member's own view: no warning of any kind, no blame
        assert not warnings(f_), (ip, [(f["kind"], f["severity"], f["entities"]["ips"][:2]) for f in warnings(f_)])
        for f in f_:
            if f["kind"] == "late_upstream":
                assert f["severity"] == "info" and f["entities"]["ips"][0] == up[ip], (ip, f["entities"])
    # under data-flow timing the slow member's lag reaches every other member as a late
    # upstream; under a barrier only its downstream sees it late
    late = {ip for ip, f_ in fs.items() if any(f["kind"] == "late_upstream" for f in f_)}
    down = order[(order.index(slow) + 1) % len(order)]
    assert down in late
    if sc["workloads"][0].get("step_sync") == "barrier":
        assert late == {down}, late


@pytest.mark.parametrize("sc", [tp(6, 0, 0, "dataflow"), tp(8, 0, 0, "barrier"), ring(5, 0, 0, "barrier")],
                         ids=["tp6-dataflow", "tp8-barrier", "ring5-barrier"])
def test_healthy_views_are_quiet(tmp_path, sc):
    _, fs = view_findings(tmp_path, sc, 7)
    for ip, f_ in fs.items():
        assert not warnings(f_), (ip, [(f["kind"], f["entities"]["ips"][:2]) for f in warnings(f_)])
        assert not [f for f in f_ if f["kind"] == "late_upstream"], ip


def test_an_onset_is_judged_from_where_it_begins(tmp_path):
    """A shard healthy for the first tokens, then 80 us late per step: its own DPU names it,
    from its first late step (the truth's since) on."""
    sc = tp(6, 80, 2, "dataflow", since_ms=8.0)
    sc["workloads"][0]["tokens"] = 6
    cap, fs = view_findings(tmp_path, sc, 3)
    pat = cap.truth["pathologies"][0]
    slow = pat["entities"]["ips"][0]
    own = [f for f in warnings(fs[slow]) if f["kind"] == "slow_tp_shard" and f["entities"]["ips"][0] == slow]
    assert own, [(f["kind"], f["severity"]) for f in fs[slow]]
    since = own[0]["evidence"]["since_s"]
    # the view's clock is the truth's pcap clock plus this DPU's offset
    off = cap.clock_offset_ns(cap.job.ip_str.index(slow), SKEW_US)
    truth_since = (pat["since_ns"] + off) / 1e9
    token = pat["magnitude"]["token_period_healthy_s"]
    assert truth_since - 0.01 * token <= since <= truth_since + token, (since, truth_since, token)
    assert own[0]["evidence"]["until_s"] is None
    for ip, f_ in fs.items():
        if ip != slow:
            assert not [f for f in warnings(f_) if f["kind"] in BLAME], ip
