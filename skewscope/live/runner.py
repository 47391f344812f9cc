"""The analysis of the live window in a worker thread, one run at a time: the one runner of
top, export's /v1 endpoints and watch. Back-pressure: a window offered while the previous
analysis still runs is not queued (nothing piles up behind a slow analysis); the turn is
skipped and counted in `skipped`."""
from __future__ import annotations

import os
import threading
import time

from skewscope.core.when import Clock


def load_analyze():
    """analysis.analyze, or None when the analysis package is not installed/importable."""
    try:
        from skewscope.analysis import analyze  # heavy (numba)
        return analyze
    except ImportError:
        return None


class AnalysisRunner:
    """Runs analyze(window snapshot) in a worker thread; never more than one at a time.

    `result` is the last good analysis (its "_clock": the window's Clock on the wall);
    `last` the same with when, how long and which window (the /v1 documents' head);
    `enrich` (names, causes: telemetry.enrich) runs on each result in the same thread;
    `error` is "Type: message" of the last run when it failed (None after a good one; the
    last good result is kept); `when`, `window_s`, `took` describe the last run, good or not.
    `runs` counts good runs, `skipped` the windows offered while one still ran."""

    def __init__(self, analyze=None, disabled: bool = False, thresholds: dict | None = None, nice: int = 0,
                 enrich=None):
        self.analyze = analyze
        self.enrich = enrich             # telemetry.enrich.Enricher (names, causes) or None
        self.disabled = disabled
        self.thresholds = thresholds
        self.nice = int(nice)            # this thread only: below the data-plane reader and HTTP threads
        self.result: dict | None = None
        self.last: dict | None = None
        self.error: str | None = None
        self.when: float = 0.0
        self.window_s: float = 0.0
        self.took: float = 0.0
        self.runs = 0
        self.skipped = 0
        self._busy = threading.Event()
        self._lock = threading.Lock()

    def busy(self) -> bool:
        return self._busy.is_set()

    def idle(self) -> bool:
        return self.analyze is not None and not self._busy.is_set()

    def submit(self, snap, wall_end: float | None = None) -> bool:
        """Start an analysis of `snap` unless one still runs (then count it in `skipped`)."""
        if self.analyze is None:
            return False
        if self._busy.is_set():
            self.skipped += 1
            return False
        self.start(snap, wall_end)
        return True

    def start(self, snap, wall_end: float | None = None) -> threading.Thread:
        self._busy.set()
        t = threading.Thread(target=self._run, args=(snap, wall_end), name="skewscope-analysis", daemon=True)
        t.start()
        return t

    def run_sync(self, snap, wall_end: float | None = None) -> None:
        if self.analyze is not None:
            self._busy.set()
            self._run(snap, wall_end)

    def _run(self, snap, wall_end: float | None) -> None:
        try:
            self._analyse(snap, wall_end)
        finally:
            self._busy.clear()

    def _analyse(self, snap, wall_end: float | None) -> None:
        if self.nice:
            try:
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self.nice)
            except (OSError, AttributeError):
                pass
        t0 = time.monotonic()
        wall = time.time() if wall_end is None else wall_end     # puts the window's clock on the wall
        m = snap.meta
        res, err = None, None
        if self.analyze is None:
            err = "analysis module not available"
        else:
            try:
                res = (self.analyze(snap) if self.thresholds is None
                       else self.analyze(snap, thresholds=self.thresholds))
                if isinstance(res, dict):
                    if self.enrich:
                        self.enrich(res)
                    res["_clock"] = Clock.of(m, wall_end=wall)
            except Exception as e:  # an analysis bug must not stop the live loop; the consumer says it
                res, err = None, f"{type(e).__name__}: {e}"
        took = time.monotonic() - t0
        with self._lock:
            self.when = time.time()
            if res is not None:
                self.result = res
                self.runs += 1
                self.last = {"analysis": res, "analysed_at": self.when, "analysis_seconds": took,
                             "window": {"first_ts": m.get("first_ts"), "last_ts": m.get("last_ts"),
                                        "duration_s": float(m.get("duration_s", 0) or 0), "clock": m.get("clock"),
                                        "end_wall": wall_end}}
            self.error = err
            self.window_s = float(m.get("window_s", m.get("duration_s", 0)) or 0)
            self.took = took

    def latest(self) -> dict | None:
        with self._lock:
            return self.last
