"""instance_load_imbalance on variants of several serving instances (instance counts, sizes,
TP and EP, MTUs, seeds): fires on the instance the generator overloaded, with a load ratio
that matches the generator's plan, and on nothing else; never with fewer than 3 comparable
instances or when every instance carries the same load.

Ground truth: the generator's truth per group (decode_tp: all-reduce bytes x all-reduces per
token / token period; decode_ep: the dispatch+combine bytes per token / token period)."""
from __future__ import annotations

import pytest

from skewscope import gen as skewgen
from skewscope.analysis import analyze
from skewscope.sources.offline import parse_file

TPD = {"kind": "decode_tp", "layers": 16, "allreduces_per_layer": 2, "tokens": 6,
       "hidden": 8192, "batch": 1, "dtype_bytes": 2, "compute_gap_us": 2000, "layer_compute_us": 10}
EPD = {"kind": "decode_ep", "layers": 4, "tokens": 6, "bytes_per_dest": "2KiB", "compute_gap_us": 2000}


def scenario(kind, k, size, hot, factor, mtu=4096):
    wls = []
    for i in range(k):
        mem = list(range(i * size, (i + 1) * size))
        f = factor if i == hot else 1
        if kind == "tp":
            wls.append(dict(TPD, members=mem, batch=f, start_ms=0.3 * i))
        else:
            wls.append(dict(EPD, members=mem, bytes_per_dest=f"{2 * f}KiB", start_ms=0.3 * i))
    return {"nodes": k * size, "mtu": mtu, "workloads": wls}


def truth_loads(truth):
    out = []
    for g in truth["groups"]:
        d = g.get("details") or {}
        if d.get("variant") == "decode_tp":
            out.append((g["members"], d["allreduce_bytes"] * d["allreduces_per_token"] / d["token_period_s"]))
        elif d.get("variant") == "decode_ep":
            out.append((g["members"], sum(d["dest_bytes"]) / d["tokens"] / d["token_period_s"]))
    return out


def run(tmp_path, sc, seed):
    cap = skewgen.generate(sc, seed=seed)
    p = tmp_path / "x.pcap"
    cap.write_pcap(str(p))
    a = analyze(parse_file(str(p)))
    return a, truth_loads(cap.truth)


@pytest.mark.parametrize("kind,k,size,hot,factor,mtu,seed", [
    ("tp", 4, 4, 1, 4, 4096, 0),      # the preset's shape
    ("tp", 6, 3, 4, 2, 1024, 1),      # more, smaller instances; IB MTU 1024
    ("tp", 3, 8, 0, 2, 2048, 2),      # three 8-way instances (batch 3 would run them back to back: not decode)
    ("ep", 3, 4, 2, 3, 4096, 3),      # expert-parallel instances
    ("ep", 4, 8, 0, 2, 2048, 4),
])
def test_overloaded_instance_found(tmp_path, kind, k, size, hot, factor, mtu, seed):
    a, tl = run(tmp_path, scenario(kind, k, size, hot, factor, mtu), seed)
    assert len(tl) == k
    loads = sorted(v for _, v in tl)
    hot_members, hot_load = max(tl, key=lambda t: t[1])
    others = sorted(v for m, v in tl if m != hot_members)
    want = hot_load / others[len(others) // 2] if len(others) % 2 else \
        hot_load / ((others[len(others) // 2 - 1] + others[len(others) // 2]) / 2)
    assert loads[-1] == hot_load and want >= 1.5
    fs = [f for f in a["findings"] if f["kind"] == "instance_load_imbalance"]
    assert len(fs) == 1, [(f["kind"], f["entities"]["ips"]) for f in a["findings"]]
    f = fs[0]
    assert sorted(f["entities"]["ips"]) == sorted(hot_members)
    assert f["evidence"]["load_ratio"] == pytest.approx(want, rel=0.1)
    assert f["severity"] == ("critical" if want >= 2.5 * 1.05 else "warning" if want < 2.5 * 0.95 else f["severity"])
    assert f["evidence"]["instances"] == k and f["evidence"]["instance_size"] == size
    assert f["evidence"]["tokens"] == 6
    # no other finding blames the healthy instances
    assert not [x for x in a["findings"] if x["severity"] != "info" and x["kind"] != "instance_load_imbalance"]


@pytest.mark.parametrize("kind,k,size,hot,factor,seed", [
    ("tp", 4, 4, None, 1, 0),         # even load
    ("tp", 5, 3, None, 1, 5),
    ("ep", 3, 4, None, 1, 6),
    ("tp", 2, 4, 1, 4, 7),            # two instances: either could be the odd one
])
def test_no_finding_without_an_outlier_or_enough_instances(tmp_path, kind, k, size, hot, factor, seed):
    a, tl = run(tmp_path, scenario(kind, k, size, hot, factor), seed)
    assert len(tl) == k
    assert not [f for f in a["findings"] if f["kind"] == "instance_load_imbalance"]


def test_threshold_overrides(tmp_path):
    """The thresholds are the documented knobs: a warning bar above the ratio silences it."""
    cap = skewgen.generate(scenario("tp", 4, 4, 1, 2), seed=8)
    p = tmp_path / "x.pcap"
    cap.write_pcap(str(p))
    snap = parse_file(str(p))
    assert [f["severity"] for f in analyze(snap)["findings"] if f["kind"] == "instance_load_imbalance"] == ["warning"]
    quiet = analyze(snap, thresholds={"instance_load_imbalance.warning": "3"})
    assert not [f for f in quiet["findings"] if f["kind"] == "instance_load_imbalance"]
    few = analyze(snap, thresholds={"instance_load_imbalance.min_instances": "5"})
    assert not [f for f in few["findings"] if f["kind"] == "instance_load_imbalance"]
