"""Live machinery shared by every command that watches an interface (top, capture,
diagnose --live, export): attach safely, read periodically, compute per-interval deltas,
detach whatever happens (the loop over intervals with its analysis: skewscope/live/).

    from skewscope.sources import live
    snap = live.capture("eth1", 30, mode="xdp", xdp_mode="native")        # one-shot

    with live.LiveSession("eth1") as s:                                    # periodic
        for iv in s.intervals(1.0, count=10):
            r = flow_rates(iv.delta.flows, iv.dt)  # core.rates: arrays per flow
            ...

Maps are cumulative in the kernel (never cleared: clearing races with the data path and
loses counts); each interval is the difference of two consecutive reads, matched by flow
key. Message records are drained from the per-CPU record regions at every read (and more
often by `capture`) so that they are not overwritten. Memory is bounded: records beyond
`max_events` are counted in `events_dropped`, never stored.

Safety: the programs are detached in `close()`, which runs on normal exit, exceptions,
Ctrl-C, SIGTERM and SIGHUP (see `terminate_on_signals`); attached through a bpf_link (the
default where the kernel has it, see bpf/attach.py) they also go with the process on SIGKILL.
A program left by a crashed run (netlink attach; no live process holds it) is "stale"; one
held by a running process (its program or link fd) is "in use": the first can be removed
(`on_stale="detach"`, or a callback that asks the user), the second never is.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time
from dataclasses import dataclass

import numpy as np

from skewscope.bpf.attach import Attachment, detach_ours, list_ours
from skewscope.bpf.attach import attach_api as attach_api_of
from skewscope.bpf.loader import OUR_PROG_NAMES, Config, Dataplane, check_privileges, import_bcc
from skewscope.core import layout as L
from skewscope.core.errors import EXIT_BUSY, EXIT_NO_IFACE, EXIT_USAGE, DataplaneError
from skewscope.core.pool import ArrayPool
from skewscope.core.signals import Terminated as _dp_Terminated
from skewscope.core.signals import exit_on_signals
from skewscope.core.rates import (COLS_DTYPE, WORDS_DTYPE, counter_blocks, delta_rows, follow_join, interval_join,
                                  join_flows, kept_cols, kept_rows, order_words, record_rows, row_columns,
                                  words_sorted)
from skewscope.core.snapshot import Snapshot, events_from_records, take_rows

# counters that are differences between two reads (everything else in FLOW_DTYPE is a key
# or "last value": first_ts/last_ts/sport/tclass/last_opcode)
_KEY_FIELDS = ("src", "dst", "dest_qp", "ipver", "roce")
_LAST_FIELDS = ("first_ts", "last_ts", "sport", "tclass", "last_opcode")
COUNTER_FIELDS = tuple(n for n in L.FLOW_DTYPE.names if n not in _KEY_FIELDS + _LAST_FIELDS)
_COUNTER_BLOCKS = counter_blocks(COUNTER_FIELDS)

MODES = ("xdp", "tc")
XDP_MODES = ("native", "generic")
DIRECTIONS = ("ingress", "egress", "both")


# ---- signals ------------------------------------------------------------------------------
# One mechanism for the whole package (core/signals.py): SIGTERM/SIGHUP raise Terminated, a
# SystemExit with status 128 + signal, so every `finally` (detach, namespace teardown) runs.
# Ctrl-C stays a KeyboardInterrupt (for top: the normal way out; for capture: "stop early").
Terminated = _dp_Terminated
terminate_on_signals = exit_on_signals


# ---- who holds a BPF program ------------------------------------------------------------
_HOLDER_FDS = ("anon_inode:bpf-prog", "anon_inode:bpf_link")   # a link's fdinfo names its prog_id too


def prog_holders(prog_id: int) -> list[tuple[int, str]]:
    """Processes (pid, command name) that hold an fd to BPF program `prog_id` (or to a
    bpf_link of it), other than this one. A skewscope program attached but held by nobody
    was left by a crashed run."""
    me = os.getpid()
    out = []
    want = f"prog_id:\t{int(prog_id)}\n"
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return out
    for p in pids:
        pid = int(p)
        if pid == me:
            continue
        fddir = f"/proc/{p}/fd"
        try:
            fds = os.listdir(fddir)
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"{fddir}/{fd}") not in _HOLDER_FDS:
                    continue
                with open(f"/proc/{p}/fdinfo/{fd}") as fh:
                    if want in fh.read():
                        try:
                            with open(f"/proc/{p}/comm") as c:
                                comm = c.read().strip()
                        except OSError:
                            comm = "?"
                        out.append((pid, comm))
                        break
            except OSError:
                continue
    return out


def _tc_prog_ids(ifname: str) -> list[tuple[str, int]]:
    """(direction, prog id) of skewscope's TC filters on ifname, from `tc -j` (pyroute2 does
    not decode TCA_BPF_ID). Runs in this thread's network namespace. Id 0 = unknown."""

    out = []
    tc = shutil.which("tc") or "/usr/sbin/tc"
    for d in ("ingress", "egress"):
        try:
            p = subprocess.run([tc, "-j", "filter", "show", "dev", ifname, d], capture_output=True, text=True,
                               timeout=10)
            items = json.loads(p.stdout) if p.returncode == 0 and p.stdout.strip() else []
        except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError):
            items = []
        for it in items:
            o = it.get("options") or {}
            name = str(o.get("bpf_name") or "").split(":")[0]
            if it.get("kind") == "bpf" and name in OUR_PROG_NAMES:
                out.append((d, int((o.get("prog") or {}).get("id") or 0)))
    return out


@dataclass
class Leftover:
    """skewscope programs found on an interface before attaching."""
    iface: str
    xdp: int | None                       # prog id
    tc: list[tuple[str, int]]             # (direction, prog id): cls_bpf filters, then tcx links
    holders: list[tuple[int, str]]        # live processes holding any of them
    links: int = 0                        # how many of them are bpf_links (live with their holder)

    @property
    def stale(self) -> bool:
        """Held by no process -- and every program's id was known (an unknown id could be
        held by a running skewscope: never treat it as removable)."""
        return not self.holders and all(i for _, i in self.tc)

    def describe(self) -> str:
        parts = []
        if self.xdp:
            parts.append(f"XDP program id {self.xdp}")
        parts += [f"TC {d} program id {i}" for d, i in self.tc]
        return ", ".join(parts) + (" (bpf_link)" if self.links else "")


def find_leftover(ifname: str) -> Leftover | None:
    """skewscope programs on ifname, netlink filters and bpf_links alike, and who holds them."""
    ours = list_ours(ifname)
    tc = (_tc_prog_ids(ifname) or [(d, 0) for d, _, _ in ours["tc"]]) if ours["tc"] else []
    tc += [(d, prog) for d, _, prog in ours.get("tcx", [])]
    if not ours["xdp"] and not tc:
        return None
    holders = []
    for pid in [ours["xdp"]] + [i for _, i in tc]:
        if pid:
            holders += [h for h in prog_holders(pid) if h not in holders]
    nlinks = int(bool(ours.get("xdp_link"))) + sum(1 for _, lk, _ in ours.get("tcx", []) if lk)
    return Leftover(ifname, ours["xdp"], tc, holders, nlinks)


# ---- snapshots: deltas and rates ----------------------------------------------------------
def flow_delta(prev: np.ndarray | None, cur: np.ndarray, since_ns: int = 0, j: np.ndarray | None = None,
               pool=None, kept=None) -> np.ndarray:
    """Per-flow counters accumulated between two reads of the flow table. Flows without
    packets in between are omitted. A flow evicted and re-created in between (its counters
    went down, or its first_ts changed) counts from zero. first_ts is clamped to `since_ns` (the earlier read's
    time): the first packet of a flow that was already active is not known exactly.
    `j`: for each row of cur, prev's row with its key or -1 (core.rates.join_flows), when the
    caller has it. `pool`: a core.pool.ArrayPool of FLOW_DTYPE the result's rows are
    written into (a caller that computes a delta every interval: LiveSession, Window).
    `kept`: kept_rows(j, cur, prev) when the caller has it (with j; core.rates.kept_cols)."""
    return _flow_delta(prev, cur, since_ns, j, pool, kept)[0]


def _flow_delta(prev, cur, since_ns, j, pool, kept):
    """(flow_delta(...), the rows of cur it holds)."""
    if prev is None or len(prev) == 0:
        keep = np.flatnonzero(cur["packets"] > 0)
        d = take_rows(cur, keep)
        if since_ns:
            d["first_ts"] = np.maximum(d["first_ts"], np.uint64(since_ns))
        return d, keep
    # decide from the narrow columns which rows the interval keeps, then copy only those
    # (a row is 850 bytes: at 1,048,576 flows a whole-table copy is 0.5-1.5 s on its own)
    prev, cur = np.ascontiguousarray(prev), np.ascontiguousarray(cur)
    if j is None:
        j, kept = join_flows(prev, cur), None
    # evicted and re-created in between: its counters went down, or (when the new entry
    # already passed the old count) its first packet is newer than the old entry's
    keep, sub = kept_rows(j, cur, prev) if kept is None else kept
    return delta_rows(cur, prev, j[keep], keep, sub, _COUNTER_BLOCKS, since_ns=since_ns, pool=pool), keep


def interval_delta(prev: np.ndarray | None, cur: np.ndarray, since_ns: int = 0,
                   prev_words: np.ndarray | None = None, pool=None, word_pool=None, cols=None, prev_cols=None,
                   with_rows: bool = False):
    """flow_delta(prev, cur) of a live read, and what the next read and the window reuse:
    (delta, cur's rows joined to prev's or None, cur's order_words), + with_rows: each
    delta row's row in cur (what core.rates.join_flows(cur, delta) finds; None when this
    path does not know it: the exporter joins then). prev_words: the
    previous read's words (its interval_delta's third value); pool: as flow_delta's;
    word_pool: an ArrayPool of core.rates.WORDS_DTYPE for the words. Two reads sorted by
    key (the loader's) are joined in the pass that makes the words (interval_join).
    cols: a (len(cur), 2) uint64 array filled with core.rates.row_columns(cur) (the window's
    kept test against its anchor reads them: Interval.cols; the next read's prev_cols);
    prev_cols: prev's (read instead of prev's rows)."""
    if prev is not None and prev_words is not None:
        pc = prev_cols if prev_cols is not None and len(prev_cols) == len(prev) else None
        got = interval_join(prev, cur, prev_words, pool=word_pool, cols=cols, prev_cols=pc)
        if got is not None:
            words, j, keep, sub = got
            d = delta_rows(cur, prev, j[keep], keep, sub, _COUNTER_BLOCKS, since_ns=since_ns, pool=pool)
            return (d, j, words, keep) if with_rows else (d, j, words)   # delta row k = cur[keep[k]]
    words = order_words(cur, pool=word_pool)
    if cols is not None:
        row_columns(cur, out=cols)
    j = join_flows(prev, cur, prev_words, words) if prev is not None and len(prev) and len(cur) else None
    d = flow_delta(prev, cur, since_ns, j=j, pool=pool)
    return (d, j, words, None) if with_rows else (d, j, words)


def read_events(delta: np.ndarray, recs: np.ndarray, words: np.ndarray | None, rows: np.ndarray | None) -> np.ndarray:
    """events_from_records(delta, recs) of a read's delta whose row k is the read's row
    rows[k] (interval_delta's fourth value; None: not known): the records matched on the
    read's key words (words: its order_words) at those rows (record_rows: 40 bytes a row
    where they lie together, not a cache line of each 850-byte delta row; ~8 ms less at
    524,000 delta rows and 100,000 records), else on the delta's rows."""
    flow = record_rows(words, rows, recs) if rows is not None and words is not None and len(recs) \
        and len(rows) == len(delta) else None
    return events_from_records(delta, recs, flow=flow)


def globals_delta(prev: np.ndarray | None, cur: np.ndarray) -> np.ndarray:
    if prev is None:
        return cur.copy()
    return np.where(cur >= prev, cur - prev, cur).astype(np.uint64)


# ---- the session --------------------------------------------------------------------------
@dataclass
class Interval:
    """One periodic read. `delta` holds only what happened during the interval (flows with
    packets in it, counter differences, the interval's message records); `cum` is the
    cumulative table since attach (no events)."""
    index: int
    wall: float            # time.time() at the read
    dt: float              # seconds covered
    elapsed: float         # seconds since attach
    delta: Snapshot
    cum: Snapshot
    records: np.ndarray    # the interval's raw message records (layout.MSG_REC_DTYPE)
    # for each row of cum.flows its row in the previous read's table or -1 (None: not known),
    # and cum.flows' core.rates.order_words: the window follows its anchors with them
    join: np.ndarray | None = None
    words: np.ndarray | None = None
    # cum.flows' packets and first_ts ((n, 2) uint64, core.rates.row_columns) or None: the
    # window's kept test against an older anchor
    cols: np.ndarray | None = None
    # for each row of delta.flows its row in cum.flows (None: not known): the exporter's
    # class and window rows read them instead of joining the two tables again
    delta_rows: np.ndarray | None = None


class LiveSession:
    """Compile, check the interface, attach, read, detach. Use as a context manager."""

    def __init__(self, iface: str, mode: str = "xdp", xdp_mode: str = "native", direction: str = "ingress",
                 sample_n: int = 1, max_flows: int = 65536, ev_per_cpu: int = 65536,
                 max_events: int = 1_000_000, on_stale="error", source: str = "live",
                 attach_api: str | None = None):
        if mode not in MODES:
            raise DataplaneError(f"invalid mode {mode!r} (xdp or tc)", EXIT_USAGE)
        if xdp_mode not in XDP_MODES:
            raise DataplaneError(f"invalid XDP mode {xdp_mode!r} (native or generic)", EXIT_USAGE)
        if direction not in DIRECTIONS:
            raise DataplaneError(f"invalid direction {direction!r} (ingress, egress or both)", EXIT_USAGE)
        if mode == "xdp" and direction != "ingress":
            raise DataplaneError("XDP sees ingress only; use --tc for egress or both directions", EXIT_USAGE)
        self.iface, self.mode, self.xdp_mode, self.direction = iface, mode, xdp_mode, direction
        self.attach_api = attach_api_of(attach_api)   # $SKEWSCOPE_ATTACH, else auto (bpf_link, netlink fallback)
        self.config = Config(max_flows=int(max_flows), sample_n=int(sample_n), ev_per_cpu=int(ev_per_cpu))
        self.config.validate()
        self.max_events = int(max_events)
        self.on_stale = on_stale
        self.source = source
        self.dp: Dataplane | None = None
        self.att: Attachment | None = None
        self.removed_leftover: Leftover | None = None
        self.t0_mono_ns = 0
        self.t0_wall = 0.0
        self._recs: list[np.ndarray] = []
        self._nrecs = 0
        self.events_dropped = 0
        self._lock = threading.Lock()
        self._prev_flows = None
        self._prev_words = None
        self._prev_cols = None          # the previous read's packets/first_ts (core.rates.row_columns)
        # the interval deltas' tables: written into buffers earlier intervals no longer use
        self._pool = ArrayPool(L.FLOW_DTYPE)
        self._word_pool = ArrayPool(WORDS_DTYPE)
        self._col_pool = ArrayPool(COLS_DTYPE)
        self._prev_glob = None
        self._prev_mono = 0
        self._prev_evicted = 0
        self._index = 0

    # -- open / close ---------------------------------------------------------------------
    def preflight(self) -> None:
        """The checks that need no kernel change, in the order a user can fix them:
        interface exists, privileges, bcc importable."""
        try:
            socket.if_nametoindex(self.iface)
        except OSError:
            raise DataplaneError(f"interface {self.iface!r} does not exist (see 'ip link')", EXIT_NO_IFACE) from None
        check_privileges()
        import_bcc()

    def open(self, before_attach=None) -> "LiveSession":
        """Preflight, leftover check, compile + load, attach. `before_attach()` runs between
        the (slow, ~1 s) compile and the attach: what must start with the counting, not
        before it (capture's pcap tap)."""
        self.preflight()
        self._handle_leftover()
        self.dp = Dataplane(self.config)
        try:
            if before_attach is not None:
                before_attach()
            self.att = Attachment(self.dp, self.iface, mode=self.mode, xdp_mode=self.xdp_mode,
                                  direction=self.direction, api=self.attach_api)
            self.att.attach()
        except BaseException:
            self.close()
            raise
        self.t0_mono_ns = time.monotonic_ns()
        self.t0_wall = time.time()
        self._prev_mono = self.t0_mono_ns
        return self

    def _handle_leftover(self) -> None:
        lo = find_leftover(self.iface)
        if lo is None:
            return
        if not lo.stale:
            who = ", ".join(f"pid {p} ({c})" for p, c in lo.holders)
            raise DataplaneError(f"{self.iface} is already being watched by skewscope ({lo.describe()}, "
                                 f"held by {who}); stop that run first", EXIT_BUSY)
        ok = self.on_stale == "detach" or (callable(self.on_stale) and self.on_stale(lo))
        if not ok:
            raise DataplaneError(f"{self.iface} has a stale skewscope program ({lo.describe()}) left by a run "
                                 f"that did not exit cleanly; remove it with 'skewscope detach -i {self.iface}' "
                                 "or rerun with --force-detach", EXIT_BUSY)
        detach_ours(self.iface)
        self.removed_leftover = lo

    iface_gone = False  # set once _check_iface saw the interface disappear

    def _check_iface(self) -> None:
        """At most twice a second: is the interface we attached to still there (same index)?
        Deleted, or gone with its namespace, the program went with it and nothing more will be
        counted: stop with one clear line instead of running on blind."""
        now = time.monotonic()
        if self.att is None or self.iface_gone or now < getattr(self, "_iface_checked", 0.0) + 0.5:
            return
        self._iface_checked = now
        try:
            idx = socket.if_nametoindex(self.iface)
        except OSError:
            idx = 0
        if idx != self.att.idx:
            self.iface_gone = True
            raise DataplaneError(f"{self.iface} went away while attached (interface deleted or its network "
                                 "namespace removed); stopped", EXIT_NO_IFACE)

    def close(self) -> None:
        """Detach and free. Idempotent; never raises (it runs in finally blocks)."""
        att, self.att = self.att, None
        if att is not None:
            try:
                att.detach()
            except Exception:
                pass
            # belt and braces: whatever skewscope left on this interface goes
            try:
                left = list_ours(self.iface)
                if (self.mode == "xdp" and left["xdp"]) or (self.mode == "tc" and left["tc"]):
                    detach_ours(self.iface, xdp=self.mode == "xdp", tc=self.mode == "tc")
            except Exception:
                pass
        dp, self.dp = self.dp, None
        if dp is not None:
            dp.close()

    def __enter__(self):
        return self.open()

    def __exit__(self, *exc):
        self.close()

    # -- description ----------------------------------------------------------------------
    @property
    def attached_via(self) -> str:
        """How the program is attached: "bpf_link" (goes with the process, SIGKILL included)
        or "netlink" (survives a SIGKILL: `skewscope detach`); "" before attach."""
        return (self.att.api or "") if self.att is not None else ""

    def describe(self) -> str:
        """The startup line's 'what is attached where', e.g. 'skewscope_xdp attached to eth1
        as XDP native (bpf_link), prog id 17' or '... as TC clsact both (netlink), ...'."""
        via = self.attached_via
        if self.mode == "xdp":
            where = f"XDP {self.xdp_mode}"
        else:
            where = f"TC {'tcx' if via == 'bpf_link' else 'clsact'} {self.direction}"
        if via:
            where += f" ({via})"
        pid = ""
        try:
            if self.att is not None and self.att.prog_id:
                pid = f", prog id {self.att.prog_id}"
            elif self.mode == "xdp":
                pid = f", prog id {list_ours(self.iface)['xdp']}"
        except Exception:
            pass
        s = f"skewscope_{self.mode} attached to {self.iface} as {where}{pid}"
        if self.config.sample_n > 1:
            s += f"; sampling 1 in {self.config.sample_n} (rates scaled)"
        return s

    def startup_line(self) -> str:
        """bcc-style startup line, short enough for 80 columns with long interface names:
        'Tracing RoCE on IFACE (XDP native, prog 1684, bpf_link)... Ctrl-C to end.' (the last
        item says how it is attached: bpf_link, or netlink on kernels without links)"""
        try:
            if self.att is not None and self.att.prog_id:
                pid = self.att.prog_id
            elif self.mode == "xdp":
                pid = list_ours(self.iface)["xdp"]
            else:
                pid = next((i for _, i in _tc_prog_ids(self.iface)), 0)
        except Exception:
            pid = 0
        how = f"XDP {self.xdp_mode}" if self.mode == "xdp" else f"TC {self.direction}"
        if pid:
            how += f", prog {pid}"
        if self.attached_via:
            how += f", {self.attached_via}"
        if self.config.sample_n > 1:
            how += f", 1/{self.config.sample_n} sampled"
        return f"Tracing RoCE on {self.iface} ({how})... Ctrl-C to end."

    # -- reading --------------------------------------------------------------------------
    def poll_records(self) -> int:
        """Drain new message records from the kernel into memory (bounded). Returns how
        many were read. Call at least every ev_per_cpu / (records/s per CPU) seconds."""
        if self.dp is None:
            return 0
        self._check_iface()
        recs = self.dp.read_new_records()
        n = len(recs)
        if n:
            with self._lock:
                room = self.max_events - self._nrecs
                if room < n:
                    self.events_dropped += n - max(room, 0)
                    recs = recs[: max(room, 0)]
                if len(recs):
                    self._recs.append(recs)
                    self._nrecs += len(recs)
        return n

    def take_records(self) -> np.ndarray:
        """All records drained so far (and clear the buffer)."""
        with self._lock:
            parts, self._recs, self._nrecs = self._recs, [], 0
        if not parts:
            return np.zeros(0, dtype=L.MSG_REC_DTYPE)
        return np.concatenate(parts)

    def meta(self, now_mono_ns: int, since_mono_ns: int | None = None) -> dict:
        since = self.t0_mono_ns if since_mono_ns is None else since_mono_ns
        return {
            "source": self.source,
            "interface": self.iface,
            "attach": self.mode if self.mode == "tc" else f"xdp-{self.xdp_mode}",
            "direction": self.direction,
            "clock": "monotonic",
            "first_ts": int(since),
            "last_ts": int(now_mono_ns),
            "duration_s": max(0.0, (now_mono_ns - since) / 1e9),
            "started_at": self.t0_wall,
            "events_dropped": int(self.events_dropped),
        }

    def snapshot(self, include_events: bool = True) -> Snapshot:
        """Cumulative Snapshot since attach; with include_events, every record drained so
        far (records are kept: a later call includes them again)."""
        self.poll_records()
        now = time.monotonic_ns()
        with self._lock:
            recs = np.concatenate(self._recs) if (include_events and self._recs) else None
        if recs is None:
            recs = np.zeros(0, dtype=L.MSG_REC_DTYPE)
        return self.dp.snapshot(self.meta(now), records=recs)

    def read_interval(self) -> Interval:
        """One periodic read: the delta since the previous read_interval (or attach). The
        records drained since then move into the Interval (the session keeps none)."""
        self.poll_records()
        recs = self.take_records()
        now = time.monotonic_ns()
        cum = self.dp.snapshot(self.meta(now), records=np.zeros(0, L.MSG_REC_DTYPE))
        cols = self._col_pool.take(len(cum.flows))
        dflows, join, words, drows = interval_delta(self._prev_flows, cum.flows, self._prev_mono, self._prev_words,
                                                    pool=self._pool, word_pool=self._word_pool, cols=cols,
                                                    prev_cols=self._prev_cols, with_rows=True)
        dglob = globals_delta(self._prev_glob, cum.globals)
        dmeta = dict(cum.meta)
        dmeta.update(self.meta(now, self._prev_mono))
        dmeta["flows_evicted"] = max(0, int(cum.meta.get("flows_evicted", 0)) - self._prev_evicted)
        delta = Snapshot(flows=dflows, events=read_events(dflows, recs, words, drows), globals=dglob, meta=dmeta)
        iv = Interval(index=self._index, wall=time.time(), dt=(now - self._prev_mono) / 1e9,
                      elapsed=(now - self.t0_mono_ns) / 1e9, delta=delta, cum=cum, records=recs, join=join,
                      words=words, cols=cols, delta_rows=drows)
        self._prev_flows, self._prev_words, self._prev_glob, self._prev_mono = cum.flows, words, cum.globals, now
        self._prev_cols = cols
        self._prev_evicted = int(cum.meta.get("flows_evicted", 0))
        self._index += 1
        return iv

    def intervals(self, interval: float, count: int | None = None, stop: threading.Event | None = None,
                  wait=None):
        """Yield an Interval every `interval` seconds (count times, or until stop is set).
        Records are drained several times per interval. `wait(timeout)` replaces the sleep
        (top uses it to read keys); it returns True to stop early."""
        n = 0
        next_t = time.monotonic() + interval
        while count is None or n < count:
            while True:
                left = next_t - time.monotonic()
                if left <= 0:
                    break
                step = min(left, 0.25)
                if wait is not None:
                    if wait(step):
                        return
                else:
                    time.sleep(step)
                if stop is not None and stop.is_set():
                    return
                self.poll_records()
            yield self.read_interval()
            n += 1
            next_t += interval
            if next_t < time.monotonic():          # fell behind (slow consumer): resync
                next_t = time.monotonic() + interval


# ---- a rolling window for analysis ----------------------------------------------------------
class Window:
    """Keeps enough state to build a Snapshot of roughly the last `seconds` (between
    seconds/2 and seconds): two anchors (cumulative reads) re-taken every seconds/2, and
    the message records since the older one. Memory: two flow tables + bounded records.

    Each anchor also keeps, read after read, the join of the latest read to its table
    (follow_join over the reads' own joins, O(flows) per read), so the window's delta does
    not join the whole table again; reads that do not carry their join (Interval.join) or
    that skip one make the snapshot join as before. When the older anchor is the read just
    before (reads half the window or more apart) the snapshot is that read's delta and, if
    its records are the window's, events: shared with the Interval, read-only for both.
    `pool`: the core.pool.ArrayPool its
    snapshots' flow tables come from (default: its own; memory: the tables still referred
    to, plus one spare of the latest size)."""

    def __init__(self, seconds: float, max_events: int = 500_000, pool: ArrayPool | None = None):
        self.seconds = float(seconds)
        self.max_events = int(max_events)
        # [mono_ns, flows, globals, order_words if strictly increasing else None, latest read's join or None,
        #  the flows' row_columns or None]
        self._anchors: list[list] = []
        self._ev: list[np.ndarray] = []          # raw records (MSG_REC_DTYPE) and their read time
        self._ev_t: list[int] = []
        self.dropped = 0
        self._last: tuple[int, np.ndarray] | None = None     # (index, cum.flows) of the latest read
        self._before: np.ndarray | None = None   # cum.flows of the read just before it (consecutive indexes)
        # the snapshots' tables, written into buffers no earlier snapshot's reader still holds
        self._pool = ArrayPool(L.FLOW_DTYPE) if pool is None else pool

    def _follow(self, iv: Interval) -> None:
        """Carry each anchor's join from the previous read to iv's read."""
        chain = (iv.join is not None and iv.words is not None and self._last is not None
                 and iv.index == self._last[0] + 1 and len(iv.join) == len(iv.cum.flows) == len(iv.words))
        for a in self._anchors:
            if chain and a[3] is not None and a[4] is not None and len(a[1]):
                a[4] = follow_join(a[4], iv.join, a[3], iv.words)
            else:
                a[4] = None
        self._before = self._last[1] if self._last is not None and iv.index == self._last[0] + 1 else None
        self._last = (iv.index, iv.cum.flows)

    def add(self, iv: Interval) -> None:
        now = int(iv.cum.meta["last_ts"])
        if not self._anchors:
            # the attach itself is the first anchor: empty tables
            t0 = int(iv.delta.meta.get("first_ts", now))
            self._anchors.append([t0, np.zeros(0, L.FLOW_DTYPE), np.zeros(L.G_N, np.uint64), None, None, None])
        self._follow(iv)
        if now - self._anchors[-1][0] >= self.seconds / 2 * 1e9:
            f = iv.cum.flows
            w = iv.words if iv.words is not None and len(iv.words) == len(f) and words_sorted(iv.words) else None
            c = iv.cols if iv.cols is not None and len(iv.cols) == len(f) else None
            self._anchors.append([now, f, iv.cum.globals, w, np.arange(len(f)) if w is not None else None, c])
            if len(self._anchors) > 2:
                self._anchors.pop(0)
        if len(iv.records):
            self._ev.append(iv.records)
            self._ev_t.append(now)
        # a batch read before the oldest anchor holds only messages that started before it
        oldest = self._anchors[0][0]
        while self._ev_t and self._ev_t[0] < oldest:
            self._ev.pop(0)
            self._ev_t.pop(0)
        total = sum(len(e) for e in self._ev)
        while total > self.max_events and self._ev:
            self.dropped += len(self._ev[0])
            total -= len(self._ev[0])
            self._ev.pop(0)
            self._ev_t.pop(0)

    def snapshot(self, iv: Interval) -> Snapshot:
        t0, f0, g0, _, j0, c0 = self._anchors[0]
        latest = self._last is not None and self._last[1] is iv.cum.flows
        # the anchor is the read before iv and iv's delta starts at it (a read interval of half
        # the window or more): that delta is this one, already made (shared, not copied)
        own = latest and iv.join is not None and len(f0) and f0 is self._before \
            and int(iv.delta.meta.get("first_ts", -1)) == t0
        if own:
            flows, keep = iv.delta.flows, None
        else:
            j0 = j0 if latest else None
            # the kept test from both reads' packets/first_ts columns when they have them
            kept = kept_cols(j0, iv.cols, c0) if j0 is not None and c0 is not None and iv.cols is not None \
                and len(iv.cols) == len(iv.cum.flows) == len(j0) and len(f0) else None
            flows, keep = _flow_delta(f0, iv.cum.flows, t0, j0, self._pool, kept)
        glob = globals_delta(g0, iv.cum.globals)
        # the batches as they are when one holds them all and none started before t0 (the
        # records are only read: no copy of a whole interval's records)
        recs = np.concatenate(self._ev) if len(self._ev) > 1 else self._ev[0] if self._ev else \
            np.zeros(0, L.MSG_REC_DTYPE)
        events = None
        if len(recs):
            late = recs["start_ts"] >= t0
            if own and self._ev[-1] is iv.records and late[len(recs) - len(iv.records):].all() \
                    and not late[:len(recs) - len(iv.records)].any():
                events = iv.delta.events        # the window's records are iv's: so are its events
            elif not late.all():
                recs = recs[late]
        if events is None:
            # the window's rows are the read's rows keep: the records merged with the read's key
            # words there (record_rows), else with the window's rows
            rows = record_rows(iv.words, keep, recs) if keep is not None and len(recs) and iv.words is not None \
                and len(iv.words) == len(iv.cum.flows) else None
            events = events_from_records(flows, recs, flow=rows)
        meta = dict(iv.cum.meta)
        now = int(iv.cum.meta["last_ts"])
        meta.update({"first_ts": t0, "last_ts": now, "duration_s": max(1e-9, (now - t0) / 1e9),
                     "window_s": (now - t0) / 1e9})
        return Snapshot(flows=flows, events=events, globals=glob, meta=meta)


# ---- one-shot capture ---------------------------------------------------------------------
def capture(iface: str, duration: float, mode: str = "xdp", xdp_mode: str = "native", direction: str = "ingress",
            sample_n: int = 1, max_flows: int = 65536, progress=None, on_stale="error",
            stop: threading.Event | None = None, pcap_out: str | None = None, pcap_snaplen: int = 128,
            pcap_max_bytes: int = 1 << 30, max_events: int = 4_000_000, on_attached=None,
            session_opts: dict | None = None) -> Snapshot:
    """Attach, collect for `duration` seconds (or until `stop` is set / Ctrl-C), detach,
    return the cumulative Snapshot (source "capture"). `progress(elapsed, duration, snap_globals)`
    is called about 10 times a second. `pcap_out`: also write the RoCE headers seen
    (first `pcap_snaplen` bytes of each RoCE/PFC frame, original length kept) to a pcap
    file, atomically (see skewscope.sources.pcaptap). `on_attached(session)` is called once the
    program is attached (startup line). Ctrl-C ends the capture early and still returns
    the data collected so far (meta["interrupted"] = True)."""
    if not duration or duration <= 0:
        raise DataplaneError(f"invalid duration {duration!r} (must be > 0)", EXIT_USAGE)
    sess = LiveSession(iface, mode=mode, xdp_mode=xdp_mode, direction=direction, sample_n=sample_n,
                       max_flows=max_flows, on_stale=on_stale, source="capture", max_events=max_events,
                       **(session_opts or {}))
    tap = None
    interrupted = False
    iface_gone = None
    sess.preflight()
    taps = []

    def start_tap():
        # the tap starts right before the attach, so pcap and snapshot cover the same window
        from skewscope.sources.pcaptap import PcapTap
        t = PcapTap(iface, pcap_out, snaplen=pcap_snaplen, direction=direction, max_bytes=pcap_max_bytes)
        taps.append(t)
        t.start()
        t.window(t_from=time.time_ns())

    with terminate_on_signals():
        try:
            if pcap_out:
                from skewscope.sources.pcaptap import PcapTap  # noqa: F401  (import errors before anything is attached)
            sess.open(before_attach=start_tap if pcap_out else None)
            tap = taps[0] if taps else None
            if on_attached:
                on_attached(sess)
            t_end = time.monotonic() + duration
            try:
                while True:
                    left = t_end - time.monotonic()
                    if left <= 0 or (stop is not None and stop.is_set()):
                        break
                    time.sleep(min(0.1, left))
                    sess.poll_records()
                    if progress:
                        progress(min(duration, duration - max(0.0, t_end - time.monotonic())), duration,
                                 sess.dp.read_globals())
            except KeyboardInterrupt:
                interrupted = True
            except DataplaneError as e:
                # The interface went away: the maps still hold everything counted until then.
                # Keep it (the caller saves it and reports the early stop) instead of losing it.
                if e.code != EXIT_NO_IFACE or not sess.iface_gone:
                    raise
                iface_gone = str(e)
            snap = sess.snapshot(include_events=True)
            if iface_gone:
                snap.meta["stopped_early"] = iface_gone
            if tap is not None:
                # from just before attach to just after the read: the pcap holds every frame the
                # snapshot counted (and the few that arrived while attaching / reading)
                tap.window(t_to=time.time_ns())
            snap.meta["events_dropped"] = int(sess.events_dropped)
            snap.meta["interrupted"] = interrupted
            snap.meta["requested_duration_s"] = float(duration)
            if sess.removed_leftover is not None:
                snap.meta["removed_stale"] = sess.removed_leftover.describe()
        except BaseException:
            sess.close()
            for t in taps:
                t.abort()
            raise
        finally:
            sess.close()
            for t in taps:
                t.stop()
        tap = taps[0] if taps else None
        if tap is not None:
            tap.commit()
            snap.meta["pcap"] = tap.stats()
    return snap
