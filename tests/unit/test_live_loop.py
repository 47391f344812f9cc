"""The live room (skewscope/live/): the loop's back-pressure (an analysis slower than the
interval never piles up: the turns it misses are skipped and counted), `every`, the sync
mode of plain top, and the signal handling of an attach (SIGTERM/SIGHUP/Ctrl-C leave the
block with the session closed, i.e. detached). No root: a fake session stands in."""
from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

from skewscope.core import layout as L
from skewscope.core.signals import Terminated
from skewscope.core.snapshot import Snapshot
from skewscope.live.loop import Attached, Loop
from skewscope.live.runner import AnalysisRunner
from skewscope.sources import live


def make_interval(i: int):
    g = np.zeros(L.G_N, np.uint64)
    meta = {"first_ts": i * 10**9, "last_ts": (i + 1) * 10**9, "sample_n": 1, "interface": "fake0",
            "clock": "monotonic"}
    d = Snapshot(np.zeros(0, L.FLOW_DTYPE), np.zeros(0, L.EVENT_DTYPE), g, dict(meta))
    return live.Interval(index=i, wall=1000.0 + i, dt=1.0, elapsed=i + 1.0, delta=d, cum=d,
                         records=np.zeros(0, L.MSG_REC_DTYPE))


class FakeSession:
    def __init__(self, n: int, pause: float = 0.0):
        self.n, self.pause = n, pause
        self.opened = self.closed = 0

    def open(self, before_attach=None):
        self.opened += 1
        return self

    def close(self):
        self.closed += 1

    def intervals(self, interval, count=None, stop=None, wait=None):
        for i in range(self.n if count is None else min(count, self.n)):
            if self.pause:
                time.sleep(self.pause)
            yield make_interval(i)




def test_a_slow_analysis_is_skipped_and_counted_never_queued():
    running, peak, lock = [0], [0], threading.Lock()

    def slow(snap):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.3)
        with lock:
            running[0] -= 1
        return {"findings": []}
    r = AnalysisRunner(slow)
    loop = Loop(FakeSession(6, pause=0.02), 1.0, 10.0, r)
    n = sum(1 for _ in loop.ticks())
    deadline = time.monotonic() + 5
    while r.busy() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert n == 6 and loop.reads == 6
    assert peak[0] == 1                               # never two analyses at once
    assert r.runs == 1 and r.skipped == 5             # the first read started one; the rest found it busy
    assert r.last["window"]["end_wall"] == 1000.0     # the window of the read that started it
    assert r.result["_clock"].wall(1.0) == pytest.approx(1000.0)


def test_every_k_reads_and_sync_mode():
    seen = []
    r = AnalysisRunner(lambda snap: seen.append(snap.meta["last_ts"]) or {"findings": []})
    loop = Loop(FakeSession(6), 1.0, 10.0, r, every=3, sync=True)
    list(loop.ticks())
    assert seen == [3 * 10**9, 6 * 10**9] and r.runs == 2 and r.skipped == 0


def test_a_failing_analysis_keeps_the_last_good_result():
    calls = []

    def flaky(snap):
        calls.append(1)
        if len(calls) == 2:
            raise ValueError("boom")
        return {"findings": [len(calls)]}
    r = AnalysisRunner(flaky)
    loop = Loop(FakeSession(2), 1.0, 10.0, r, sync=True)
    list(loop.ticks())
    assert r.error == "ValueError: boom" and r.result["findings"] == [1] and r.runs == 1


@pytest.mark.parametrize("exc,code", [(KeyboardInterrupt, 0), (Terminated(signal.SIGTERM), 143),
                                      (Terminated(signal.SIGHUP), 129)])
def test_attached_detaches_on_signals_and_ctrl_c(exc, code):
    s = FakeSession(1)
    with Attached(s) as att:
        att.open()
        raise exc
    assert att.code == code and s.opened == 1 and s.closed == 1


def test_attached_turns_a_real_sigterm_into_a_detach():
    s = FakeSession(1)
    old = signal.getsignal(signal.SIGTERM)
    with Attached(s) as att:
        att.open()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)                                 # the handler raises before this ends
        pytest.fail("SIGTERM did not stop the block")
    assert att.code == 143 and s.closed == 1
    assert signal.getsignal(signal.SIGTERM) is old    # the previous handler is back


def test_attached_closes_and_propagates_other_errors():
    s = FakeSession(1)
    with pytest.raises(ValueError):
        with Attached(s) as att:
            att.open()
            raise ValueError("bad")
    assert s.closed == 1
