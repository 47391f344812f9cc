"""Held-out timing variants (issue 25, classes 2 and 3) on the all-seeing (mirror) vantage:
a slow member of a ring -- a TP decode shard (slow_tp_shard) or a training-ring straggler --
under data-flow and barrier step timing, at 2-16 nodes, lags of 0.3x-100x the step, the lag on
the first send of each step or on every send, 1/2/4 channels, other IB MTUs, IPv4/IPv6, QPs
per connection and compute-gap jitter, from the start or with an onset (since) or a recovery
(until) at the middle token / iteration; and the same rings healthy.

Truth: the generator's (tools/heldout_timing.py builds the scenarios; the pathology's member
and its since_ns / until_ns). Passing: a warning names the truth's member first (kinds
slow_tp_shard / ring_straggler / straggler), nobody else is blamed for it, its since / until
are within one token (iteration) of the truth's; a healthy ring raises no warning at all.
A crossed sample of the grid other than the tool's default, on a seed no other test uses;
lags below the detectors' 1 us floor are left out (tools/heldout_timing.py shows them)."""
from __future__ import annotations


import pytest

import heldout_timing as H

pytestmark = pytest.mark.timeout(600)

SEED = 13
CASES, HEALTHY = H.grid(44, seed=5)


def _cases():
    out = []
    for c in CASES:
        name, sc, lag_us = H.build(*c, SEED)
        if lag_us >= H.FLOOR_US:
            out.append((name, sc))
    return out


VARIANTS = _cases()


def test_grid_covers_every_level():
    """The sample crosses every level of every factor (the issue's held-out axes)."""
    for i, levels in enumerate((("tp", "ring"), H.NODES, H.SYNCS, H.LAGS, H.PERS, (1, 2, 4), H.ONSETS)):
        assert {c[i] for c in CASES} == set(levels), i
    assert len(VARIANTS) >= 36


@pytest.mark.parametrize("name,sc", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_slow_member_named_with_onset(name, sc):
    ok, why = H.judge(*H.analyse(sc, SEED))
    assert ok, why


@pytest.mark.parametrize("fam,n,sync,ch", HEALTHY, ids=[f"{f} n{n} {s} ch{c}" for f, n, s, c in HEALTHY])
def test_healthy_ring_is_quiet(fam, n, sync, ch):
    f = H.tp_scenario if fam == "tp" else H.ring_scenario
    _, _, _, sc = f(n, sync, 0, "step", ch)
    H.vary(sc, H.variation((fam, n, sync, ch)))
    ok, why = H.judge(*H.analyse(sc, SEED))
    assert ok, why
