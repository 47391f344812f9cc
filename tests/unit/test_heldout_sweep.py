"""The held-out detection sweep (tools/sweep_heldout.py) as a regression test: every variant
of the presets at other node counts, sizes, MTUs, lags, router layouts and instance shapes
reports what the generator's truth says (the injected pathology on its entity; healthy
variants quiet), on one seed none of the other tests use. The gaps the tool marks KNOWN are
shown there and not counted; a variant that newly fails here is a regression."""
from __future__ import annotations


import pytest

import sweep_heldout as S

pytestmark = pytest.mark.timeout(600)

CASES = S.cases()


@pytest.mark.parametrize("name,sc,expect,gap", CASES, ids=[c[0] for c in CASES])
def test_heldout_variant_matches_truth(name, sc, expect, gap):
    ok, why = S.check(sc, 21, expect)
    if gap and not ok:
        pytest.xfail(f"known gap: {gap}: {why}")
    assert ok, why


# ---- the robustness grid (issue 25): a slice, fabric and node vantages (the fleet vantage
# needs Prometheus: tests/integration/test_fleet_real_views.py runs its slice)
GRID = {c.name: c for c in S.grid(quick=True)}
SLICE = [  # (case, vantage): what each vantage must report on a seed the sweep does not use
    ("tp-slow n8 lag80us dataflow", "node"), ("tp-slow n8 lag80us barrier", "node"),
    ("tp-slow n4 lag5us dataflow", "fabric"), ("tp-slow n4 lag5us barrier", "node"),
    ("ring-straggler n8 80us barrier ch2", "node"), ("ring-straggler n8 ratex0.4 dataflow ch2", "fabric"),
    ("ep-hot n8 x2", "node"), ("moe-hot n6 x3", "fabric"),
    ("tp-healthy n8 barrier", "node"), ("ring-healthy n8 barrier ch1", "node"), ("alltoall-healthy n6", "fabric"),
]


@pytest.mark.parametrize("name,vantage", SLICE, ids=[f"{v}: {n}" for n, v in SLICE])
def test_grid_slice(tmp_path, name, vantage):
    tally = S.run_grid([GRID[name]], [21], [vantage], tmp_path)
    (kind, v), t = next(iter(tally.rows.items()))
    assert v == vantage and t["na"] == t["err"] == 0, t
    if kind == "healthy":
        assert t["warned"] == 0, t
    else:
        assert t["judged"] == t["hit"] == 1 and t["wrong"] == 0, t
