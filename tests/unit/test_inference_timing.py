"""Timing at every scale and the slow shard / persistent vs rotating straggler (issue 12
items 2-4, 7, 9) against the generator's ground truth: the presets and scenario variants
built here (node counts, message sizes, MTUs, lags, jitter, compute gaps).

Truth used: truth["inference"] (token_period_s, tokens, iteration_period_s, absent_kinds),
the pathology entries (entities.ips, magnitude.lag_per_step_us, token_period_healthy_s,
gating_rank_per_iteration). Nothing here is computed by the code under test."""
from __future__ import annotations

import copy
import json
import math
from collections import Counter

import pytest
from click.testing import CliRunner

import genlib
from genlib import run


pytestmark = pytest.mark.timeout(900)

_cache: dict = {}


def warn(an, kind=None):
    return [f for f in an["findings"] if f["severity"] in ("warning", "critical") and (kind is None or f["kind"] == kind)]


def tp(nodes=4, lag_us=None, slow=2, mtu=4096, jitter=0.0, **wl):
    w = {"kind": "decode_tp", "layers": 8, "allreduces_per_layer": 2, "tokens": 6, "hidden": 4096, "batch": 1,
         "compute_gap_us": 2000, "layer_compute_us": 10}
    w.update(wl)
    if jitter:
        w["jitter"] = jitter
    sc = {"description": "test variant", "nodes": nodes, "mtu": mtu, "workloads": [w]}
    if lag_us is not None:
        sc["pathologies"] = [{"kind": "slow_tp_shard", "node": slow, "lag_us": lag_us}]
    return sc


def rotating(nodes=8, lag_us=200, noise_us=5, iterations=6, every_step=False, order=None, nbytes="2MiB"):
    p = {"kind": "rotating_straggler", "lag_us": lag_us, "noise_us": noise_us, "every_step": every_step}
    if order is not None:
        p["order"] = order
    return {"description": "test variant", "nodes": nodes, "iterations": iterations, "period_ms": 3.0,
            "workloads": [{"kind": "ring_allreduce", "bytes": nbytes, "channels": 1}], "pathologies": [p]}


def path_of(truth, kind):
    return [p for p in truth["pathologies"] if p["kind"] == kind]


# ---- slow shard --------------------------------------------------------------------------
def check_slow_shard(truth, an):
    inf = truth["inference"]
    (pat,) = path_of(truth, "slow_tp_shard")
    mag = pat["magnitude"]
    fs = warn(an, "slow_tp_shard")
    assert len(fs) == 1, [f["message"] for f in an["findings"]]
    f = fs[0]
    assert f["entities"]["ips"][0] == pat["entities"]["ips"][0]
    # the lag per step: the shard's own delay (truth: the lag added to every send; where the
    # shard's previous send is still on its way the ring's hop latency overlaps it: abs 2.5 us)
    assert f["evidence"]["lag_per_step_s"] == pytest.approx(mag["lag_per_step_us"] * 1e-6, rel=0.2, abs=2.5e-6)
    # time lost per token: the truth's counterfactual (same schedule without the lag)
    lost = mag["token_period_s"] - mag["token_period_healthy_s"]
    assert f["impact"]["seconds"] == pytest.approx(lost, rel=0.1)
    assert f["impact"]["share"] == pytest.approx(lost / mag["token_period_s"], rel=0.1)
    for k in inf["absent_kinds"]:
        assert not warn(an, k), (k, [x["message"] for x in warn(an, k)])
    # the period is the token's (the compute gap included), not a ring step's
    tm = an["timing"]
    assert tm["period_s"] == pytest.approx(inf["token_period_s"], rel=0.02)
    assert tm["tokens_per_s"] == pytest.approx(1.0 / inf["token_period_s"], rel=0.02)
    assert tm["itl_p50_s"] == pytest.approx(inf["token_period_s"], rel=0.02)
    assert tm["hierarchy"]["iteration"]["count"] == inf["tokens"]
    return f


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_preset_slow_shard(seed):
    truth, an, _ = run("tp-decode-slow-shard", seed)
    check_slow_shard(truth, an)


def test_issue_symptom_300us_shard_is_critical_and_period_is_the_token():
    # 4-node TP decode, 8 layers x 2 all-reduces, 2 ms compute gap, one shard 300 us late
    truth, an, _ = run(tp(nodes=4, lag_us=300, slow=1))
    f = check_slow_shard(truth, an)
    assert f["severity"] == "critical"
    assert an["timing"]["period_s"] > 0.02         # ~31 ms token, not the 0.3 ms ring step


VARIANTS = [
    dict(nodes=3, lag_us=30, slow=0),
    dict(nodes=8, lag_us=30, slow=5),
    dict(nodes=4, lag_us=300, slow=3, mtu=1024),
    dict(nodes=4, lag_us=30, slow=2, hidden=16384, mtu=2048),
    dict(nodes=8, lag_us=100, slow=6, hidden=2048, compute_gap_us=500),
    dict(nodes=4, lag_us=30, slow=1, jitter=0.05, compute_gap_us=1000),
    dict(nodes=3, lag_us=100, slow=2, layers=4, allreduces_per_layer=1, layer_compute_us=30),
    # lags as long as the layer compute: no wire break between collectives inside a token
    dict(nodes=4, lag_us=10, slow=1),
    dict(nodes=4, lag_us=5, slow=3),
    dict(nodes=16, lag_us=30, slow=9, tokens=4),
    dict(nodes=4, lag_us=30, slow=1, batch=8, hidden=8192),
    # 2-way TP: a ring of two, where the median of a step is no reference
    dict(nodes=2, lag_us=30, slow=1),
    dict(nodes=2, lag_us=300, slow=0, hidden=8192, mtu=1024),
    dict(nodes=2, lag_us=20, slow=1, hidden=5120, batch=2, layers=16),
]


@pytest.mark.parametrize("kw", VARIANTS, ids=lambda kw: "-".join(f"{k}{v}" for k, v in kw.items()))
def test_variant_slow_shard(kw):
    truth, an, _ = run(tp(**kw))
    check_slow_shard(truth, an)


# ---- healthy: quiet ----------------------------------------------------------------------
@pytest.mark.parametrize("sc", ["tp-decode-healthy", "ring-healthy", "tree-healthy", "alltoall-healthy",
                                "pipeline-healthy", "tp-decode", "ring-ll128",
                                "J:tp-decode-healthy-jitter", "J:tp3-jitter", "J:tp8-small",
                                "J:ring-noise", "J:ring-jitter-small", "J:tree-jitter-small", "J:tp2",
                                "J:tp2-jitter"])
def test_healthy_raises_no_warning(sc):
    if sc == "J:tp-decode-healthy-jitter":
        from skewscope.gen.presets import PRESETS
        sc = copy.deepcopy(PRESETS["tp-decode-healthy"])
        sc["workloads"][0]["jitter"] = 0.1
    elif sc == "J:tp3-jitter":
        sc = tp(nodes=3, jitter=0.2, compute_gap_us=800)
    elif sc == "J:tp8-small":
        sc = tp(nodes=8, hidden=1024, mtu=1024)
    elif sc == "J:tp2":
        sc = tp(nodes=2, hidden=7168, batch=2, layers=12)
    elif sc == "J:tp2-jitter":
        sc = tp(nodes=2, jitter=0.2, compute_gap_us=800)
    elif sc in ("J:ring-jitter-small", "J:tree-jitter-small"):
        # iteration starts jitter by 2 % of the period (below period_jitter's 5 %)
        from skewscope.gen.presets import PRESETS
        sc = copy.deepcopy(PRESETS["ring-healthy" if sc == "J:ring-jitter-small" else "tree-healthy"])
        sc["jitter"] = 0.02
    elif sc == "J:ring-noise":
        # every rank a little late by chance each iteration (<= 5 us): no gate, no finding
        sc = rotating(nodes=8, lag_us=0, noise_us=5)
    else:
        sc = genlib.scenario_path(sc)
    truth, an, _ = run(sc)
    assert not warn(an), [f["message"] for f in warn(an)]
    inf = truth.get("inference") or {}
    if inf.get("token_period_s"):
        assert an["timing"]["period_s"] == pytest.approx(inf["token_period_s"], rel=0.02)
        assert an["timing"]["tokens_per_s"] == pytest.approx(1 / inf["token_period_s"], rel=0.02)


def test_iteration_jitter_blames_no_rank():
    # iteration starts jitter by 10 % (the whole ring at once): period_jitter, no straggler of any kind
    truth, an, _ = run(genlib.scenario_path("ring-jitter"))
    for k in ("ring_straggler", "rotating_straggler", "slow_tp_shard", "straggler"):
        assert not warn(an, k), [f["message"] for f in warn(an, k)]


# ---- persistent vs rotating --------------------------------------------------------------
def check_rotating(truth, an):
    (pat,) = path_of(truth, "rotating_straggler")
    mag = pat["magnitude"]
    assert mag["persistent_straggler"] is None
    for k in ("ring_straggler", "slow_tp_shard", "straggler"):
        assert not warn(an, k), [f["message"] for f in warn(an, k)]
    fs = warn(an, "rotating_straggler")
    assert len(fs) == 1, [f["message"] for f in an["findings"]]
    f = fs[0]
    assert f["severity"] == "warning"
    want = Counter(mag["gating_rank_per_iteration"])
    n = mag["iterations"]
    got = f["evidence"]["gate_share"]
    assert set(got) == set(want)
    for ip, c in want.items():
        assert got[ip] == pytest.approx(c / n)
    assert f["evidence"]["gating_rank_per_iteration"] == mag["gating_rank_per_iteration"]
    assert set(f["entities"]["ips"]) == set(want)
    assert "sequence" in f["message"] and "faulty" in f["message"]
    assert f["impact"] is not None and f["impact"]["seconds"] > 0
    return f


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_preset_rotating_straggler(seed):
    truth, an, _ = run("ring-rotating-straggler", seed)
    f = check_rotating(truth, an)
    # every iteration waits the late rank's lag
    assert f["evidence"]["lost_per_gated_iteration_s"] == pytest.approx(
        path_of(truth, "rotating_straggler")[0]["magnitude"]["lag_us"] * 1e-6, rel=0.1)


@pytest.mark.parametrize("kw", [dict(nodes=4, lag_us=100, order=[0, 1, 2, 3, 0, 1]),
                                dict(nodes=8, lag_us=60, noise_us=0, every_step=True, iterations=8),
                                dict(nodes=6, lag_us=50, nbytes="512KiB", iterations=8),
                                dict(nodes=2, lag_us=200),
                                dict(nodes=2, lag_us=80, order=[0, 0, 1, 0, 1, 1], nbytes="4MiB"),
                                # one rank gates half the iterations: late on average, but the
                                # gate rotates (no ring_straggler for its mean start lag)
                                dict(nodes=6, lag_us=300, order=[0, 3, 0, 5, 1, 0])],
                         ids=["n4-order", "n8-every-step", "n6-small", "n2", "n2-order", "n6-half"])
def test_variant_rotating(kw):
    truth, an, _ = run(rotating(**kw))
    check_rotating(truth, an)


@pytest.mark.parametrize("nodes,late", [(6, 4), (2, 1)])
def test_persistent_ring_straggler_is_not_rotating(nodes, late):
    # the same ring with one rank late in every iteration: ring_straggler, not rotating
    truth, an, _ = run(rotating(nodes=nodes, lag_us=200, order=[late]))
    assert not warn(an, "rotating_straggler"), [f["message"] for f in an["findings"]]
    fs = warn(an, "ring_straggler")
    assert fs and fs[0]["entities"]["ips"][0] == f"10.0.0.{late + 1}"
    assert fs[0]["impact"]["seconds"] == pytest.approx(200e-6, rel=0.15)


@pytest.mark.parametrize("nodes_lag", [(1, 30), (0, 50)])
def test_two_rank_ring_straggler_lag_is_the_whole_lag(nodes_lag):
    # a ring of two: the late rank's start lag is its lag behind the other (a median of two
    # members would give it half)
    node, lag = nodes_lag
    truth, an, _ = run({"description": "test variant", "nodes": 2, "iterations": 4, "period_ms": 6.0,
                        "workloads": [{"kind": "ring_allreduce", "bytes": "4MiB", "channels": 1}],
                        "pathologies": [{"kind": "straggler", "node": node, "start_lag_us": lag}]})
    (pat,) = path_of(truth, "straggler")
    ip = pat["entities"]["ips"][0]
    fs = warn(an, "ring_straggler")
    assert len(fs) == 1 and fs[0]["entities"]["ips"][0] == ip, [f["message"] for f in an["findings"]]
    (g,) = an["collectives"]
    assert g["metrics"]["start_lag_s"][ip] == pytest.approx(lag * 1e-6, rel=0.1)
    other = [m for m in g["members"] if m != ip][0]
    assert g["metrics"]["start_lag_s"][other] == pytest.approx(0.0, abs=1e-6)


TWO_NODE = [
    # (scenario, truth group kind): TP decode all-reduces of LL messages both ways at once
    (tp(nodes=2), "tp_decode_allreduce"),
    (tp(nodes=2, hidden=5120, batch=4, layers=6, compute_gap_us=1500, layer_compute_us=25), "tp_decode_allreduce"),
    (tp(nodes=2, lag_us=40, slow=0), "tp_decode_allreduce"),
    # batch 4 x hidden 4096 / 8192 x bf16 = 32 / 64 KiB messages: a P2P chunk's size, told by the timing
    (tp(nodes=2, batch=4), "tp_decode_allreduce"),
    (tp(nodes=2, hidden=8192, batch=4), "tp_decode_allreduce"),
    ({"description": "test variant", "nodes": 2, "workloads": [{"kind": "tp_decode", "layers": 16, "tokens": 3,
      "token_ms": 4.0, "ar_bytes": "8KiB", "layer_compute_us": 15}]}, "tp_decode_allreduce"),
    # pipelines of two stages, small (LL-sized) and P2P-chunked activations: forward and
    # backward a compute time apart
    ({"description": "test variant", "nodes": 2, "iterations": 3, "period_ms": 6.0,
      "workloads": [{"kind": "p2p_pipeline", "activation_bytes": "16KiB", "microbatches": 8}]}, "p2p"),
    ({"description": "test variant", "nodes": 2, "iterations": 2, "period_ms": 8.0,
      "workloads": [{"kind": "p2p_pipeline", "activation_bytes": "1MiB", "microbatches": 6}]}, "p2p"),
    ({"description": "test variant", "nodes": 2, "iterations": 3, "period_ms": 6.0,
      "workloads": [{"kind": "p2p_pipeline", "activation_bytes": "64KiB", "microbatches": 8}]}, "p2p"),
    ({"description": "test variant", "nodes": 2, "iterations": 3, "period_ms": 4.0,
      "workloads": [{"kind": "ring_allreduce", "bytes": "8MiB", "channels": 2}]}, "ring_allreduce"),
    # 2-way expert parallel decode: LL-sized all-to-all, dispatch and combine both ways at
    # once: not an all-reduce (no step answers the other's)
    ({"description": "test variant", "nodes": 2, "workloads": [{"kind": "decode_ep", "layers": 4, "tokens": 6,
      "bytes_per_dest": "2KiB", "compute_gap_us": 2000}]}, "all_to_all"),
    ({"description": "test variant", "nodes": 2, "workloads": [{"kind": "decode_ep", "layers": 6, "tokens": 4,
      "bytes_per_dest": "6KiB", "compute_gap_us": 1500}],
      "pathologies": [{"kind": "hot_destination", "node": 1, "factor": 4.0}]}, "all_to_all"),
    ({"description": "test variant", "nodes": 2, "workloads": [{"kind": "moe_decode", "layers": 4, "tokens": 3,
      "token_ms": 3.0, "bytes_per_peer": "12KiB", "zipf": 0.8}]}, "all_to_all"),
    ({"description": "test variant", "nodes": 2, "workloads": [{"kind": "decode_ep", "layers": 4, "tokens": 6,
      "bytes_per_dest": "64KiB", "compute_gap_us": 2000}]}, "all_to_all"),
    ({"description": "test variant", "nodes": 2, "workloads": [{"kind": "decode_ep", "layers": 4, "tokens": 6,
      "bytes_per_dest": "32KiB", "compute_gap_us": 800}]}, "all_to_all"),
]


@pytest.mark.parametrize("sc,kind", TWO_NODE, ids=lambda x: x if isinstance(x, str) else None)
def test_two_node_groups_are_classified_by_their_timing(sc, kind):
    """Two nodes exchanging data both ways: a 2-way TP decode is a 2-rank all-reduce
    (ring_allreduce, decode workload: the decode detectors then apply); a 2-stage pipeline
    and a 2-node all-to-all are not (p2p: the all_to_all kind needs >= 3 nodes). Truth: the
    generator's group kind."""
    truth, an, _ = run(sc)
    assert [g["kind"] for g in truth["groups"]] == [kind]
    (g,) = an["collectives"]
    want = "ring_allreduce" if kind in ("tp_decode_allreduce", "ring_allreduce") else "p2p"
    assert g["kind"] == want, g["evidence"]
    if kind == "tp_decode_allreduce":
        assert g["metrics"]["workload"] == "decode"
    if want == "p2p":   # why, by the size class: P2P chunks, LL steps that do not answer each other, neither
        why = g["evidence"][-1]
        hint = g["metrics"]["protocol_hint"]
        assert ("P2P-sized chunks" in why) == (hint == "p2p_chunks"), (hint, why)
        assert ("LL" in why and "do not answer each other" in why) == (hint in ("ll", "ll128")), (hint, why)
    lagged = path_of(truth, "slow_tp_shard")
    assert len(warn(an, "slow_tp_shard")) == len(lagged), [f["message"] for f in an["findings"]]


# ---- the JSON, the human outputs ---------------------------------------------------------
def test_every_finding_has_impact_and_order_is_severity_then_impact():
    from skewscope.analysis.detectors.registry import SEV_RANK
    for sc in ("tp-decode-slow-shard", "ring-rotating-straggler", "ring-straggler"):
        truth, an, _ = run(genlib.scenario_path(sc))
        keys = [(-SEV_RANK[f["severity"]], -((f["impact"] or {}).get("seconds") or 0.0)) for f in an["findings"]]
        assert keys == sorted(keys)
        for f in an["findings"]:
            assert "impact" in f
            imp = f["impact"]
            assert imp is None or (set(imp) == {"seconds", "share"} and imp["seconds"] >= 0
                                   and (imp["share"] is None or 0 <= imp["share"] <= 1))
        json.dumps(an, allow_nan=False)


def test_timing_hierarchy_keys_training():
    truth, an, _ = run("ring-rotating-straggler")
    h = an["timing"]["hierarchy"]
    assert list(h) == ["step", "collective", "iteration"]
    assert h["iteration"]["period_s"] == pytest.approx(truth["inference"]["iteration_period_s"], rel=0.02)
    assert h["iteration"]["count"] == truth["inference"]["iterations"]
    # 2 (n - 1) steps per all-reduce, one all-reduce per iteration
    assert h["step"]["count"] == truth["inference"]["iterations"] * 2 * 7
    assert h["step"]["period_s"] < h["iteration"]["period_s"]


def test_decode_hierarchy_counts():
    truth, an, _ = run("tp-decode-slow-shard")
    g = [x for x in truth["groups"] if x["kind"] == "tp_decode_allreduce"][0]["details"]
    h = an["timing"]["hierarchy"]
    assert h["collective"]["count"] == g["collectives"]
    assert h["step"]["count"] == g["collectives"] * g["steps_per_allreduce"] * g["messages_per_step_per_link"]
    assert h["iteration"]["count"] == g["tokens"]
    assert 0 < an["timing"]["token_comm_share"] < 1


def test_report_and_diagnose_print_token_period_and_itl():
    from skewscope.cli import main
    truth, an, path = run("tp-decode-slow-shard")
    per_ms = truth["inference"]["token_period_s"] * 1e3
    res = CliRunner().invoke(main, ["report", path])
    assert res.exit_code == 0, res.output
    assert "token" in res.output and "ITL" in res.output
    assert f"{per_ms:.2f} ms" in res.output
    res = CliRunner().invoke(main, ["diagnose", path])
    assert res.exit_code == 2, res.output           # the slow shard costs > 50 % of each token: critical
    assert "ITL" in res.output and f"{per_ms:.2f} ms" in res.output and "slow_tp_shard" in res.output
    res = CliRunner().invoke(main, ["diagnose", "--json", path])
    doc = json.loads(res.output)
    assert math.isclose(doc["timing"]["itl_p50_s"], truth["inference"]["token_period_s"], rel_tol=0.02)
    assert doc["findings"][0]["kind"] == "slow_tp_shard" and doc["findings"][0]["impact"]["seconds"] > 0


def test_top_shows_token_timing_and_orders_by_impact():
    from skewscope.outputs import topview
    truth, an, _ = run("tp-decode-slow-shard")
    lines = topview.timing_lines(an)
    per_ms = truth["inference"]["token_period_s"] * 1e3
    assert any("ITL" in x and f"{per_ms:.2f} ms" in x for x in lines), lines
    fs = [{"kind": "a", "severity": "warning", "impact": {"seconds": 1e-3, "share": 0.1}},
          {"kind": "b", "severity": "warning", "impact": {"seconds": 5e-3, "share": 0.5}},
          {"kind": "c", "severity": "critical", "impact": None},
          {"kind": "d", "severity": "warning", "impact": None}]
    assert [f["kind"] for f in topview.findings_sorted({"findings": fs})] == ["c", "b", "a", "d"]
