"""The fleet fusion's histogram arithmetic and ring discovery (analysis.fleet), against
independent ground truth: numpy on the raw samples (exact where the buckets allow, within
the sample's bucket otherwise), the generator's ring order, and the exporter's own
bucketing of the generator's per-node views."""
from __future__ import annotations

import numpy as np
import pytest

from skewscope.analysis import fleet as F
from skewscope.outputs import metrics as M

DUR = np.array(M.DURATION_BUCKETS)
OFF = np.array(M.OFFSET_BUCKETS)


def hist(samples, bounds):
    """Cumulative counts per bound (x <= le), then +Inf: Prometheus' histogram semantics."""
    x = np.asarray(samples, dtype=np.float64)
    cum = np.array([np.count_nonzero(x <= b) for b in bounds] + [len(x)], dtype=np.float64)
    return bounds, cum


@pytest.mark.parametrize("seed", range(5))
def test_bucket_quantile_lands_in_the_true_quantiles_bucket(seed):
    rng = np.random.default_rng(seed)
    x = rng.lognormal(mean=np.log(rng.uniform(2e-6, 5e-3)), sigma=rng.uniform(0.1, 2.0), size=500)
    b, c = hist(x, DUR)
    for q in (0.5, 0.9, 0.99):
        true = float(np.quantile(x, q, method="inverted_cdf"))
        est = F.bucket_quantile(b, c, q)
        k = int(np.searchsorted(b, true, side="left"))
        lo = 0.0 if k == 0 else b[k - 1]
        hi = b[k] if k < len(b) else b[-1]
        assert lo <= est <= hi, (q, true, est, lo, hi)


def test_bucket_quantile_signed_and_empty():
    x = np.r_[np.full(90, -2.5e-6), np.full(10, 3e-5)]     # most negative, a positive tail
    b, c = hist(x, OFF)
    assert -5e-6 <= F.bucket_quantile(b, c, 0.5) <= -2e-6
    assert 2e-5 <= F.bucket_quantile(b, c, 0.95) <= 5e-5
    assert np.isnan(F.bucket_quantile(b, np.zeros(len(b) + 1), 0.5))


@pytest.mark.parametrize("seed", range(5))
def test_counts_at_bounds_are_exact(seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 3e-5, 400)
    b, c = hist(x, OFF)
    for t in (1e-6, 5e-6, 1e-5, 2e-5, 1e-4):
        assert F.count_le(b, c, -t) == np.count_nonzero(x <= -t)
        assert F.count_gt(b, c, t) == np.count_nonzero(x > t)
        # between bounds: the count at the bound below / above (never more than the truth)
        assert F.count_le(b, c, -1.5 * t) <= np.count_nonzero(x <= -1.5 * t)
        assert F.count_gt(b, c, 1.5 * t) <= np.count_nonzero(x > 1.5 * t)
    assert F.bound_at_or_below(OFF, 1.28e-5) == 1e-5
    assert F.bound_at_or_below(OFF, 9.4e-6) == 5e-6
    assert F.bound_at_or_below(OFF, 1e-9) == 1e-6


@pytest.mark.parametrize("n,seed", [(3, 0), (4, 1), (7, 2), (12, 3)])
def test_upstream_cycles_recover_the_ring_order(n, seed):
    rng = np.random.default_rng(seed)
    order = [f"10.0.{i}.{j}" for i, j in zip(rng.permutation(n), range(n))]
    up = {order[(k + 1) % n]: order[k] for k in range(n)}     # member -> who sends to it
    extra = {"10.9.0.1": "10.9.0.2", "10.9.0.2": "10.9.0.3"}   # a chain, not a ring
    rings = F.upstream_cycles({**up, **extra})
    assert len(rings) == 1
    r = rings[0]
    assert len(r) == n and set(r) == set(order)
    for k in range(n):   # send order: r[k] sends to r[k+1]
        assert up[r[(k + 1) % n]] == r[k]


def test_exporter_buckets_agree_with_the_fusion_counts(tmp_path):
    """The exporter's bucketing of the generator's per-node view of a slow TP shard and the
    fusion's counts: the truth's late shard has every collective start late on its own DPU,
    the others none (the lag is the generator's magnitude)."""
    from skewscope import gen as skewgen
    from skewscope.analysis.nodeview import node_timing
    from skewscope.outputs.exptiming import bucket_counts
    from skewscope.sources.offline import parse_file
    cap = skewgen.generate("tp-decode-slow-shard", seed=2)
    pat = next(p for p in cap.truth["pathologies"] if p["kind"] == "slow_tp_shard")
    slow = pat["entities"]["ips"][0]
    lag = pat["magnitude"]["lag_us"] * 1e-6
    views = tmp_path / "v"
    from skewscope.cli import main
    with pytest.raises(SystemExit) as e:
        main(["gen", "tp-decode-slow-shard", "--seed", "2", "--views", str(views)])
    assert e.value.code == 0
    for p in sorted(views.glob("10.*.pcap")):
        nt = node_timing(parse_file(str(p)), p.stem, samples=True)
        g = nt["groups"][0]
        st = next(iter(g["_samples"]["start_offset"].values()))
        cnt = bucket_counts(st, OFF)
        b, c = OFF, np.cumsum(cnt)
        late = F.count_le(b, c, -F.bound_at_or_below(OFF, lag / 2))
        if p.stem == slow:
            assert late == len(st) > 0
        else:
            assert late == 0


@pytest.mark.parametrize("odd", [0, 2, 3])
def test_a_member_whose_own_dpu_calls_the_ring_a_ring_stays_in_its_tp_group(odd):
    """Each DPU names its group's role from its own view, and a slow shard's own view can blur
    the compute gap that makes a ring 'tp_decode' (seen on the live per-node fabric: the
    shard's DPU said 'ring', the other three 'tp_decode'). The ring is one topology either
    way: the fusion builds the cycle over both roles, takes the majority role, and finds
    each member's entry under the role its own DPU used."""
    from types import SimpleNamespace

    from skewscope.analysis.detectors.fleet import FleetInputs
    ips = [f"10.0.0.{i + 1}" for i in range(4)]
    arrival = hist([1e-5] * 6, OFF)

    def entry(i, role):
        return {"dpu": f"dpu{i}", "hist": {}, "peers": {ips[(i - 1) % 4]: {"arrival": arrival}},
                "steps": 96.0, "collectives": 16.0, "iterations": 6.0}
    timing = {(ip, "ring" if i == odd else "tp_decode"): entry(i, None) for i, ip in enumerate(ips)}
    inp = FleetInputs(fm=SimpleNamespace(ips=ips, timing=timing), th={})
    groups = [g for g in inp.timing_groups if g["role"] in ("ring", "tp_decode")]
    assert len(groups) == 1 and groups[0]["role"] == "tp_decode", groups
    assert sorted(groups[0]["members"]) == ips
    # the odd member's entry is found under the group's role
    assert inp.entry(ips[odd], "tp_decode") is timing[(ips[odd], "ring")]
    # and a majority of 'ring' makes it a ring
    timing2 = {(ip, "tp_decode" if i == odd else "ring"): entry(i, None) for i, ip in enumerate(ips)}
    inp2 = FleetInputs(fm=SimpleNamespace(ips=ips, timing=timing2), th={})
    assert [g["role"] for g in inp2.timing_groups] == ["ring"]
