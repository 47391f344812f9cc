"""The fleet from per-node views through a real Prometheus fed by backfill (issue 25, class
5 and the sweep's fleet vantage): each view -> `skewscope export --from VIEW --once --format
openmetrics --timestamp T --node DPU --node-ip IP` (the exporter's exact output, one file
per DPU) -> `promtool tsdb create-blocks-from openmetrics` -> Prometheus (Debian's
/usr/bin/prometheus on 127.0.0.1, a temporary TSDB) -> `skewscope cluster --window all --at
T --json`.

* the real soft-RoCE ring, one capture per VM (../shared/data/real/softroce_ring__vm1..4:
  each VM's own NIC, its own clock): 10.77.0.3 sends at a quarter of its peers' rate (the
  README's truth); the cluster names it, as the mirror's `diagnose` does, and nobody else;
* generated TP decode slow shards under barrier-synchronised and data-flow step timing
  (views with each DPU's clock off by up to +-5 ms): the truth's shard is named; a healthy
  barrier ring is quiet;
* a slice of tools/sweep_heldout.py's grid at the fleet vantage.

Everything made is under a pytest tmp dir; every process started is stopped in finally."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from promharness import Backfilled

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("prometheus") is None or shutil.which("promtool") is None,
                                 reason="Debian package prometheus missing (make setup installs it)"),
              pytest.mark.timeout(600)]

REAL = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "real"


def skewscope(*args, timeout=300):
    r = subprocess.run([sys.executable, "-m", "skewscope.cli", *args], capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode in ((0, 1, 2) if args[0] == "diagnose" else (0,)), r.stderr[-3000:]
    return r


def fleet(work: Path, views: list[tuple[str, str]]) -> dict:
    """views: [(pcap path, node IP)] -> the cluster document over their backfilled exports."""
    t = float(int(time.time()) - 120)
    om = [skewscope("export", "--from", str(p), "--once", "--format", "openmetrics", "--timestamp", str(t),
                    "--node", f"dpu{k}", "--node-ip", ip).stdout for k, (p, ip) in enumerate(views)]
    prom = Backfilled(work, om)
    try:
        prom.start()
        r = skewscope("cluster", "--prometheus", prom.url, "--window", "all", "--at", str(t + 1), "--json")
        return json.loads(r.stdout)
    finally:
        prom.stop()


def blames(doc):
    return [(f["kind"], f["severity"], f["entities"]["ips"][:2]) for f in doc["findings"]
            if f["severity"] in ("warning", "critical")]


def test_real_softroce_ring_views_name_the_slow_member(tmp_path):
    views = [(REAL / f"softroce_ring__vm{i}.pcap.gz", f"10.77.0.{i}") for i in range(1, 5)]
    if not all(p.exists() for p, _ in views):
        pytest.skip("../shared/data/real softroce_ring views missing")
    doc = fleet(tmp_path, views)
    rs = [f for f in doc["findings"] if f["kind"] == "ring_straggler" and f["severity"] in ("warning", "critical")]
    assert rs and rs[0]["entities"]["ips"][0] == "10.77.0.3", blames(doc)
    ev = rs[0]["evidence"]
    assert ev["link"] == ["10.77.0.3", "10.77.0.4"] and ev["ring"] and set(ev["ring"]) == {v[1] for v in views}
    # README: its rate over active time is ~0.25x its peers' (the ring's median: within 2x of that)
    assert 0.125 <= ev["score"] <= 0.5, ev
    # each end's DPU saw the slow link with its own clock (drill-down rows)
    assert {row["dpu"] for row in ev["seen_by"]} == {"dpu2", "dpu3"}, ev["seen_by"]
    # only 10.77.0.3 is slowed: nobody else is blamed
    assert all(ips[0] == "10.77.0.3" for _, _, ips in blames(doc)), blames(doc)
    # the all-seeing mirror concludes the same
    mirror = REAL / "softroce_ring__mirror.pcap.gz"
    if mirror.exists():
        d = json.loads(skewscope("diagnose", str(mirror), "--json").stdout)
        first = [f for f in d["findings"] if f["kind"] == "ring_straggler"][0]
        assert first["entities"]["ips"][0] == "10.77.0.3"


def _gen_views(work: Path, sc: dict, seed: int):
    f = work / "scenario.yaml"
    f.write_text(json.dumps(sc))                     # JSON is YAML
    d = work / "views"
    skewscope("gen", str(f), "--views", str(d), "--seed", str(seed), "--clock-skew", "5000", "--snaplen", "128")
    truth = json.loads((d / "truth.json").read_text())
    return [(p, p.stem) for p in sorted(d.glob("*.pcap"))], truth


TPD = {"kind": "decode_tp", "layers": 8, "allreduces_per_layer": 2, "tokens": 5, "hidden": 8192,
       "batch": 1, "dtype_bytes": 2, "compute_gap_us": 2000, "layer_compute_us": 10}


@pytest.mark.parametrize("nodes,slow,lag,sync,seed", [(6, 2, 80, "barrier", 3), (8, 5, 25, "barrier", 4),
                                                      (8, 4, 80, "dataflow", 5)])
def test_generated_slow_shard_is_named_through_the_fleet(tmp_path, nodes, slow, lag, sync, seed):
    sc = {"nodes": nodes, "workloads": [dict(TPD, step_sync=sync)],
          "pathologies": [{"kind": "slow_tp_shard", "node": slow, "lag_us": lag}]}
    views, truth = _gen_views(tmp_path, sc, seed)
    want = truth["pathologies"][0]["entities"]["ips"][0]
    doc = fleet(tmp_path, views)
    fs = [f for f in doc["findings"] if f["kind"] == "slow_tp_shard" and f["severity"] in ("warning", "critical")]
    assert fs and fs[0]["entities"]["ips"][0] == want, blames(doc)
    assert all(ips[0] == want for _, _, ips in blames(doc)), blames(doc)
    ev = fs[0]["evidence"]
    assert ev["own_lag_s"] is not None and 0.5 * lag <= ev["own_lag_s"] * 1e6 <= 1.5 * lag, ev


def test_healthy_barrier_ring_is_quiet_through_the_fleet(tmp_path):
    views, _ = _gen_views(tmp_path, {"nodes": 6, "workloads": [dict(TPD, step_sync="barrier")]}, 2)
    doc = fleet(tmp_path, views)
    assert not blames(doc)
    assert doc["timing"] and doc["timing"]["groups"][0]["workload"] == "decode"


def test_sweep_fleet_slice(tmp_path):
    import sweep_heldout as S
    names = {"tp-slow n4 lag80us barrier", "tp-healthy n4 barrier", "ring-straggler n4 ratex0.4 dataflow ch2",
             "ring-rotating n8 lag200us dataflow"}
    cases = [c for c in S.grid(quick=True) if c.name in names]
    assert len(cases) == len(names)
    tally = S.run_grid(cases, [21], ["fleet"], tmp_path)
    rows = tally.rows
    for kind in ("slow_tp_shard", "straggler", "rotating_straggler"):
        t = rows[(kind, "fleet")]
        assert t["judged"] == t["hit"] == 1 and t["wrong"] == 0 and t["na"] == t["err"] == 0, (kind, t)
    h = rows[("healthy", "fleet")]
    assert h["cases"] == 1 and h["warned"] == 0, h
