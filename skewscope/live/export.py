"""`export -i IFACE`: the live data plane read on a clock by the live loop's Reader thread
(drains the message-record rings before they wrap; scrapes render the last state), each read
folded into the exporter's Accumulator (outputs/exporter.py) and, when the /v1 endpoints are
on, into the analysis window (live.loop.Loop, every K reads, skipped while one still runs)."""
from __future__ import annotations

import threading
import time

from skewscope.live.loop import Loop, Reader
from skewscope.live.runner import AnalysisRunner
from skewscope.outputs.exporter import Accumulator, ExportState
from skewscope.sources.live import LiveSession


class LiveSource:
    """The live data plane on an interface (`LiveSession`: attach, leftover checks,
    per-interval deltas, detach), read every `interval` seconds by a thread: `get()` is the
    last ExportState. With `runner`, the reads also feed the analysis window (`every` reads,
    `window_s` seconds) whose results the HTTP /v1 documents serve."""

    def __init__(self, iface: str, node: str, top_k: int, max_peers: int, interval: float = 1.0,
                 mode: str = "xdp", xdp_mode: str = "native", direction: str = "ingress",
                 max_flows: int = 65536, sample_n: int = 1, on_stale="error", node_ip: str | None = None,
                 runner: AnalysisRunner | None = None, every: int = 1, window_s: float = 10.0):
        self.node, self.top_k, self.interval = node, top_k, float(interval)
        # live: the node given or inferred only (every node of a mirror costs one analysis
        # of its sub-view per node per read: ~55 ms per node at 4k records, ring-32; files only)
        self.acc = Accumulator(max_peers=max_peers, node_ip=node_ip, timing_nodes=0)
        self.runner = runner
        self.session = LiveSession(iface, mode=mode, xdp_mode=xdp_mode, direction=direction,
                                   sample_n=sample_n, max_flows=max_flows, on_stale=on_stale,
                                   source="live").open()
        self.loop = Loop(self.session, interval, window_s, runner, every=every) if runner is not None else None
        self._lock = threading.Lock()
        self._state: ExportState | None = None
        try:
            self._absorb(self.session.read_interval())
        except BaseException:
            self.session.close()
            raise
        self.reader = Reader(self.session, self.interval, self._absorb, name="skewscope-export-reader").start()

    @property
    def error(self) -> BaseException | None:
        return self.reader.error

    def describe(self) -> str:
        return self.session.describe()

    def _absorb(self, iv) -> None:
        t0 = time.monotonic()
        self.acc.add(iv.delta.flows, iv.delta.events, cum_flows=iv.cum.flows, cum_rows=iv.delta_rows,
                     cum_join=iv.join)
        meta = dict(iv.cum.meta)
        meta["events_lost"] = int(meta.get("events_lost", 0)) + int(meta.get("events_dropped", 0))
        st = self.acc.state(self.node, iv.cum.globals, meta, self.top_k, read_ts=iv.wall,
                            read_seconds=time.monotonic() - t0)
        with self._lock:
            self._state = st
        if self.loop is not None:
            try:
                self.loop.step(iv)
            except Exception as e:  # never stop the reader; /v1/findings says it
                self.runner.error = f"{type(e).__name__}: {e}"
        # records are handed over per interval; the session keeps none

    def get(self) -> ExportState | None:
        with self._lock:
            return self._state

    def close(self) -> None:
        self.reader.close()
