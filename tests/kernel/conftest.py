"""Kernel tier fixtures: one replay-clock build of the data plane per session (reset between
tests), and the entry-point parameter. Helpers live in kharness.py."""
from __future__ import annotations

import pytest
from kharness import Kernel


@pytest.fixture(scope="session")
def kernel_dp():
    from skewscope.bpf.loader import Config, Dataplane
    dp = Dataplane(Config(replay_clock=True, max_flows=1024, ev_per_cpu=4096))
    try:
        yield dp
    finally:
        dp.close()


@pytest.fixture
def kernel(kernel_dp):
    return Kernel(kernel_dp)


@pytest.fixture(params=["xdp", "tc"])
def entry(request):
    return request.param


