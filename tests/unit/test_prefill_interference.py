"""prefill_interference from KV-cache transfers (issue 12): a kv_transfer group (prefill ->
decode RDMA WRITEs) sending into the members of a tensor-parallel decode group stretches its
token period. Against the generator's ground truth (skewscope.gen truth `inference` block:
the kv_transfer group's decode nodes, the decode group's token period with and without the
KV bursts):

* the preset `prefill-interference` (several seeds) raises prefill_interference naming the
  decode members that receive the KV transfers (and only those), the prefill senders in
  its evidence, and an impact close to the truth's token period difference;
* the same scenario without the kv_transfer workload, or with the KV into decode nodes
  outside the TP group, `tp-decode-healthy` and `pd-healthy` raise none."""
from __future__ import annotations

import copy

import pytest

from genlib import run

from skewscope.gen.presets import KV, PRESETS, TPD


def pif(an):
    return [f for f in an["findings"] if f["kind"] == "prefill_interference"]


#: a variant of the preset: 5-way TP decode on nodes 3-7, 3 prefill nodes into 3 and 4,
#: MTU 2048, 5 tokens, hidden 4096
VARIANT = {"nodes": 8, "mtu": 2048, "workloads": [
    dict(TPD, members=[3, 4, 5, 6, 7], tokens=5, hidden=4096),
    dict(KV, prefill=[0, 1, 2], decode=[3, 4], requests=18, interval_us=1200, arrival_batch=3,
         block_bytes="256KiB", block_bytes_max=None, start_ms=0.2)]}
#: 4-way TP decode on nodes 3-6, 3 prefill nodes into 3 of its members: under the KV load
#: the layer gaps blur into the step gaps (the lowest break leaves 8 collectives, the wire's
#: bursts count instead) and only 3 covered spacings fall inside its 4 tokens
BLURRED = copy.deepcopy(PRESETS["prefill-interference"])
BLURRED.update(nodes=7, description="")
BLURRED["workloads"][0]["members"] = [3, 4, 5, 6]
BLURRED["workloads"][1].update(prefill=[0, 1, 2], decode=[4, 5, 6])
CASES = ([("preset", PRESETS["prefill-interference"], s) for s in (0, 1, 2)] + [("variant", VARIANT, s) for s in (0, 6)]
         + [("blurred", BLURRED, 3), ("blurred", dict(BLURRED, mtu=1024), 1)])


@pytest.mark.parametrize("label,sc,seed", CASES, ids=[f"{c[0]}-{c[2]}" for c in CASES])
def test_preset_names_kv_receivers_and_impact(label, sc, seed):
    truth, an, _ = run(sc, seed)
    inf = truth["inference"]
    assert "prefill_interference" in inf["expected_kinds"]
    kvg = next(g for g in inf["groups"] if g["kind"] == "kv_transfer")
    dg = next(g for g in inf["groups"] if g["kind"] == "decode_tp")
    fs = pif(an)
    assert len(fs) == 1, [(f["kind"], f["entities"]["ips"]) for f in an["findings"]]
    f = fs[0]
    assert f["severity"] in ("warning", "critical")
    want = sorted(set(kvg["decode"]) & set(dg["members"]))
    assert sorted(f["entities"]["ips"]) == want
    assert sorted(f["evidence"]["prefill_senders"]) == sorted(kvg["prefill"])
    assert f["evidence"]["cause"] == "kv_transfer"
    lost = dg["token_period_s"] - dg["token_period_without_interference_s"]
    assert lost > 0
    if label == "blurred":
        # a third of the collective starts are not seen under the KV load (merged spacings
        # are counted whole): within a factor of 2 of the truth's stretch
        assert lost / 2 <= f["impact"]["seconds"] <= 2 * lost
    else:
        assert f["impact"]["seconds"] == pytest.approx(lost, rel=0.3)
        assert f["impact"]["share"] == pytest.approx(lost / dg["token_period_s"], rel=0.3)
    # the KV load slows the ring links into the receivers: shared downlinks, not a port
    assert not [x for x in an["findings"] if x["kind"] == "slow_link"]
    assert any(w in f["message"] for w in ("traffic class", "priority", "rate-limit"))


def test_without_kv_workload_is_quiet():
    sc = copy.deepcopy(PRESETS["prefill-interference"])
    sc["workloads"] = [w for w in sc["workloads"] if w["kind"] != "kv_transfer"]
    assert len(sc["workloads"]) == 1
    truth, an, _ = run(sc, 0)
    assert "prefill_interference" not in (truth.get("inference") or {}).get("expected_kinds", [])
    assert any((c["metrics"].get("decode") or {}) for c in an["collectives"])     # still a decode group
    assert pif(an) == []


@pytest.mark.parametrize("name", ["tp-decode-healthy", "pd-healthy"])
def test_healthy_presets_are_quiet(name):
    truth, an, _ = run(PRESETS[name], 0)
    assert "prefill_interference" not in (truth.get("inference") or {}).get("expected_kinds", [])
    assert pif(an) == []


def test_kv_beside_the_decode_group_is_quiet():
    """The KV transfers go to decode nodes that are not the TP group's (no shared link): the
    group's token period is not stretched (truth) and nothing is blamed."""
    sc = copy.deepcopy(BLURRED)
    sc["nodes"] = 9
    sc["workloads"][1]["decode"] = [7, 8]
    truth, an, _ = run(sc, 3)
    assert "prefill_interference" not in truth["inference"]["expected_kinds"]
    assert any((c["metrics"].get("decode") or {}) for c in an["collectives"])     # still a decode group
    assert pif(an) == []


def test_one_way_pairs_split_off_a_mixed_component_join_the_kv_group():
    """Under the KV load some prefill -> decode flows are split off the mixed component by
    their message count (one-way pairs whose last evidence line is the split's): they belong
    to the kv_transfer group with the rest, not left as point-to-point pairs."""
    truth, an, _ = run(BLURRED, 3)
    kvg = next(g for g in truth["inference"]["groups"] if g["kind"] == "kv_transfer")
    kinds = sorted(c["kind"] for c in an["collectives"])
    assert kinds == ["kv_transfer", "ring_allreduce"], an["collectives"]
    g = next(c for c in an["collectives"] if c["kind"] == "kv_transfer")
    assert sorted(g["members"]) == sorted(kvg["prefill"] + kvg["decode"])
    assert any(e.startswith("merged from") for e in g["evidence"])
