"""Shared test fixtures and the root rule.

- Tests under tests/kernel and tests/integration need root (CAP_BPF, CAP_NET_ADMIN). When
  not root they are skipped with one clear reason; as root (CI) they always run, and a
  missing dependency (bcc, iproute2) is a failure, not a skip.
- `netns_pair`: two fresh network namespaces joined by a veth pair (unique names with the
  `sst-` prefix, IPv6 off so the kernel sends nothing on its own, addresses 10.199.0.1/24
  and .2/24), deleted in a finally. Reusable by every integration test; see skewscope.testbed.netns.VethPair.
- `REAL_DATA`: the real captures beside the checkout (../shared/data/real), never copied.
- sys.path: tests/, tests/scenarios and tools/ (below): a test imports genlib, fuzzcorpus,
  sweep_heldout ... directly, never edits sys.path itself.
"""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from skewscope.testbed.netns import VethPair, create_pair, destroy_pair

ROOT = Path(__file__).resolve().parents[1]
REAL_DATA = Path(__file__).resolve().parents[1].parent / "shared/data/real"
#: the one place test modules get their helpers' directories on sys.path: tests/ (fuzzcorpus,
#: frames, kharness), tests/scenarios (genlib: generator scenarios -> truth, Snapshot,
#: analysis) and tools/ (sweep_heldout, heldout_timing, reliability)
for _d in (ROOT / "tools", ROOT / "tests" / "scenarios", ROOT / "tests"):
    if str(_d) not in sys.path:
        sys.path.insert(0, str(_d))

# Ctrl-C and hang-up at their defaults for the commands the tests start: a suite started in
# the background of a non-interactive shell inherits SIGINT ignored (POSIX: no job control),
# under nohup SIGHUP ignored, and exec keeps an ignored signal ignored -- skewscope keeps an
# inherited SIG_IGN on purpose (a user's nohup), so the tests that send a child SIGINT/SIGHUP
# as a terminal would must start it with the terminal's defaults.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)

IS_ROOT = os.geteuid() == 0
ROOT_REASON = ("needs root (CAP_BPF + CAP_NET_ADMIN) for BPF_PROG_TEST_RUN / namespaces / attach; "
               "run the suite as root (CI does)")
needs_root = pytest.mark.skipif(not IS_ROOT, reason=ROOT_REASON)


def pytest_collection_modifyitems(config, items):
    """kernel/ and integration/ tests: marked, and skipped with a reason when not root."""
    for item in items:
        parts = Path(str(item.fspath)).parts
        if "kernel" in parts and "tests" in parts:
            item.add_marker(pytest.mark.kernel)
            if not IS_ROOT:
                item.add_marker(pytest.mark.skip(reason=ROOT_REASON))
        elif "integration" in parts and "tests" in parts:
            item.add_marker(pytest.mark.integration)
            if not IS_ROOT:
                item.add_marker(pytest.mark.skip(reason=ROOT_REASON))


@pytest.fixture
def netns_pair(request):
    """A fresh VethPair for one test, always deleted afterwards."""
    if not IS_ROOT:
        pytest.skip(ROOT_REASON)
    tag = "".join(c for c in request.node.name.lower() if c.isalnum())[:6] or "t"
    p = create_pair(tag)
    try:
        yield p
    finally:
        destroy_pair(p)


@pytest.fixture
def netns_pair_factory():
    """Build several pairs in one test (all deleted afterwards): factory(tag) -> VethPair."""
    if not IS_ROOT:
        pytest.skip(ROOT_REASON)
    made: list[VethPair] = []

    def make(tag: str = "f") -> VethPair:
        p = create_pair(tag)
        made.append(p)
        return p
    try:
        yield make
    finally:
        for p in made:
            destroy_pair(p)
