"""The live loop, once: a session's intervals -> the analysis window -> the analysis runner
(every `every` reads; skipped and counted while the previous run still goes), a background
reader for consumers that serve rather than draw (export), and the signal handling of a
process that attached (SIGTERM/SIGHUP/Ctrl-C: leave the loop, detach, nothing left attached)."""
from __future__ import annotations

import threading

from skewscope.live.runner import AnalysisRunner
from skewscope.sources.live import Terminated, Window, terminate_on_signals


class Loop:
    """session.intervals(interval) -> Window(window_s) -> runner. `sync`: the analysis runs
    inline before the read is handed on (plain top: every table shows its own window);
    otherwise in the runner's thread, offered every `every` reads."""

    def __init__(self, session, interval: float, window_s: float = 10.0, runner: AnalysisRunner | None = None,
                 every: int = 1, sync: bool = False):
        self.session, self.interval = session, float(interval)
        self.window = Window(window_s)
        self.runner = runner
        self.every = max(1, int(every))
        self.sync = sync
        self.reads = 0

    def step(self, iv) -> None:
        """Add one read to the window; offer the window to the runner when it is due."""
        self.window.add(iv)
        self.reads += 1
        r = self.runner
        if r is None or r.analyze is None or self.reads % self.every:
            return
        if self.sync:
            r.run_sync(self.window.snapshot(iv))
        elif r.busy():                     # back-pressure: skip (counted), build no snapshot
            r.skipped += 1
        else:
            r.submit(self.window.snapshot(iv), wall_end=iv.wall)

    def ticks(self, count: int | None = None, stop: threading.Event | None = None, wait=None):
        """The session's intervals, each added to the window (and analysed when due) first."""
        for iv in self.session.intervals(self.interval, count, stop=stop, wait=wait):
            self.step(iv)
            yield iv


class Reader:
    """Reads `session` every `interval` seconds in a thread and hands each read to
    `on_interval` (export: reading on a clock rather than on scrape drains the message-record
    rings before they wrap). An exception stops the reader and is kept in `error` (the
    command stops on it); close() stops the thread and detaches."""

    def __init__(self, session, interval: float, on_interval, name: str = "skewscope-reader"):
        self.session, self.interval, self.on_interval = session, float(interval), on_interval
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> "Reader":
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            for iv in self.session.intervals(self.interval, stop=self._stop):
                self.on_interval(iv)
        except BaseException as e:  # serve the last good state; the command stops on it
            self.error = e

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.interval + 5)
        self.session.close()


class Attached:
    """`with Attached(session) as a: a.open(); ...` -- inside the block SIGTERM/SIGHUP raise
    Terminated (Ctrl-C: KeyboardInterrupt), so a signal during the compile or the loop leaves
    through the exit, which closes (detaches) the session in every case. A signal or Ctrl-C
    ends the block quietly: `a.code` is then 128 + the signal number after SIGTERM/SIGHUP, 0
    after Ctrl-C; any other error propagates after the detach."""

    def __init__(self, session):
        self.session = session
        self.code = 0
        self._signals = None

    def __enter__(self) -> "Attached":
        self._signals = terminate_on_signals()
        self._signals.__enter__()
        return self

    def open(self, before_attach=None):
        """Preflight, compile, attach (sources.live.LiveSession.open)."""
        return self.session.open(before_attach=before_attach)

    def __exit__(self, et, e, tb) -> bool:
        try:
            self.session.close()
        finally:
            self._signals.__exit__(None, None, None)
        if isinstance(e, Terminated):
            self.code = 128 + e.signum
            return True
        return et is not None and issubclass(et, KeyboardInterrupt)
