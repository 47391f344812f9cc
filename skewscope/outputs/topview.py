"""The `top` screen: a rich full-screen live view on a terminal, or plain periodic tables
(bcc style, < 80 columns) when stdout is not a terminal or a count is given.

Pure parts (unit-tested without root or a kernel): `build_model` turns an interval's
Snapshot into rows and header numbers; `ViewState.key` applies a key press;
`render_rich`/`plain_lines` draw a model. `matrix_view` (analysis.matrix.node_matrix as
bit/s) with `render_matrix` (rich heatmap) / `matrix_lines` (plain table) is the node x node
view of key m and --matrix. `run_tty` and `run_plain` drive a LiveSession.

Per interval the work is one map read, one delta (numpy), sort, and formatting of the rows
shown. Analysis (collectives, findings) runs on a rolling window (`--window`, default 10 s)
in a worker thread so a slow analysis never stalls the screen; the panels say how old the
result is.
"""
from __future__ import annotations

import os
import select
import sys
import termios
import textwrap
import threading
import time
import tty
from dataclasses import dataclass

import numpy as np

from skewscope.core import layout as L
from skewscope.core.snapshot import Snapshot, ip_str
from skewscope.outputs import report as R
from skewscope.outputs.when import START_SHARE, Clock
from skewscope.sources.live import Window, flow_rates

SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}
SEV_SHORT = {"critical": "CRIT", "warning": "WARN", "info": "INFO"}

# (key in the model's rates, column title, descending by default)
SORTS = (("gbps", "bit/s", True), ("pps", "pkt/s", True), ("ce_pct", "CE%", True), ("cnp_ps", "CNP/s", True),
         ("retx", "retx", True), ("naks", "NAK", True), ("src", "src", False), ("dst", "dst", False))

HELP = ("q quit   s/S sort column   r reverse   / filter by IP   esc clear filter   "
        "up/down (j/k) select   enter/h size histogram   m node matrix / flows   c interval/cumulative   "
        "p pause   ? help")


# ---- formatting ---------------------------------------------------------------------------
def fmt_num(x: float, width: int = 6) -> str:
    """Compact non-negative number with about 3 significant digits: 0, 7.5, 950, 9.5K,
    12K, 630K, 3.8M, 1.2G. Never wider than max(width, 4)."""
    x = float(x)
    if x < 0:
        return "-" + fmt_num(-x, width - 1)
    if x < 1000:
        s = f"{x:.1f}" if (x < 9.95 and x != int(x)) else f"{x:.0f}"
        return s if len(s) <= width else f"{x / 1e3:.1f}K"
    for div, suf in ((1e3, "K"), (1e6, "M"), (1e9, "G"), (1e12, "T"), (1e15, "P")):
        v = x / div
        if v < 999.5:
            s = f"{v:.1f}{suf}" if v < 9.95 else f"{v:.0f}{suf}"
            return s
    return f"{x:.0e}"


def fmt_size(n: int) -> str:
    """Power-of-two message size bucket lower bound: 0, 64, 4K, 128K, 1M, 2G."""
    if n < 0:
        return "-"
    for div, suf in ((1 << 30, "G"), (1 << 20, "M"), (1 << 10, "K")):
        if n >= div:
            v = n / div
            return f"{v:.0f}{suf}" if v == int(v) else f"{v:.1f}{suf}"
    return str(int(n))


def fmt_bits(gbps: float, width: int = 6) -> str:
    """A rate given in Gb/s as bit/s with an SI suffix: 98.2G, 38.1M, 640K (readable at
    line rate and in a time-stretched demo alike)."""
    return fmt_num(gbps * 1e9, width)


def short_ip(s: str, width: int = 15) -> str:
    """IPv4 fits; a long IPv6 keeps its tail (the distinguishing part) behind an ellipsis."""
    return s if len(s) <= width else "…" + s[-(width - 1):]


# ---- the model -----------------------------------------------------------------------------
@dataclass
class Row:
    key: tuple
    src: str
    dst: str
    qp: int
    gbps: float
    pps: float
    msg_mode: int
    ce_pct: float
    cnp_ps: float
    retx: float
    naks: float
    index: int          # row in the snapshot's flow table


@dataclass
class Model:
    when: float
    iface: str
    attach: str
    interval: float
    dt: float
    elapsed: float
    cumulative: bool
    sample_n: int
    rows: list
    nflows_active: int
    nflows_shown: int
    nflows_map: int
    totals: dict
    not_accounted: dict
    evicted: int
    evicted_total: int
    events_lost: int
    hist: list | None = None           # [(lower bound, count)] of the selected flow
    hist_label: str = ""
    analysis: dict | None = None
    analysis_note: str = ""
    sort_title: str = "bit/s"
    reverse: bool = False
    filter: str = ""
    editing: str | None = None
    selected: int = -1
    paused: bool = False
    help: bool = False
    matrix: "MatrixView | None" = None   # the node x node view (key m / --matrix)


class _IpCache:
    """ip_str per distinct 16-byte address (few hosts, many QPs)."""

    def __init__(self):
        self._c: dict[bytes, str] = {}

    def strings(self, addrs: np.ndarray, ipver: np.ndarray) -> list[str]:
        out = []
        c = self._c
        for a, v in zip(addrs, ipver):
            b = a.tobytes()
            s = c.get(b)
            if s is None:
                s = ip_str(a, int(v))
                if len(c) > 200_000:
                    c.clear()
                c[b] = s
            out.append(s)
        return out


_ips = _IpCache()


def _order(rates: dict, flows: np.ndarray, sort: str, desc: bool) -> np.ndarray:
    if sort in ("src", "dst"):
        k = np.ascontiguousarray(flows[sort]).view("S16").reshape(-1)
        o = np.argsort(k, kind="stable")
        return o[::-1] if desc else o
    v = rates[sort]
    # ties broken by Gb/s then key order, so the view does not flicker
    o = np.lexsort((-rates["gbps"], -v if desc else v))
    return o


def build_model(snap: Snapshot, dt: float, state: "ViewState", *, iface: str = "", attach: str = "",
                interval: float = 1.0, elapsed: float = 0.0, cum: Snapshot | None = None,
                limit: int = 20, analysis: dict | None = None, analysis_note: str = "") -> Model:
    """Rows (sorted, filtered, at most `limit`) and header numbers of one interval."""
    f = snap.flows
    sample_n = int(snap.meta.get("sample_n", 1) or 1)
    rates = flow_rates(f, dt, sample_n)
    key, desc, _ = _sort_spec(state)
    order = _order(rates, f, key, desc if not state.reverse else not desc)
    keep = None
    if state.filter:
        src_s = _ips.strings(f["src"], f["ipver"])
        dst_s = _ips.strings(f["dst"], f["ipver"])
        flt = state.filter.strip()
        keep = np.array([flt in a or flt in b for a, b in zip(src_s, dst_s)], dtype=bool)
        order = order[keep[order]]
    shown = len(order)
    if limit > 0:
        order = order[:limit]
    rows = []
    for i in order:
        r = f[i]
        v = int(r["ipver"])
        rows.append(Row(key=(bytes(r["src"]), bytes(r["dst"]), int(r["dest_qp"])),
                        src=ip_str(r["src"], v), dst=ip_str(r["dst"], v), qp=int(r["dest_qp"]),
                        gbps=float(rates["gbps"][i]), pps=float(rates["pps"][i]),
                        msg_mode=int(rates["msg_mode"][i]), ce_pct=float(rates["ce_pct"][i]),
                        cnp_ps=float(rates["cnp_ps"][i]), retx=float(rates["retx"][i]),
                        naks=float(rates["naks"][i]), index=int(i)))
    # selection follows the selected flow while it is shown, else stays at its row position
    sel = -1
    if state.selected_key is not None:
        sel = next((p for p, r in enumerate(rows) if r.key == state.selected_key), -1)
    if sel < 0 and state.selecting and rows:
        sel = min(max(state.sel_row, 0), len(rows) - 1)
    if sel >= 0:
        state.selected_key, state.sel_row = rows[sel].key, sel
    g = snap.globals
    k = float(sample_n)
    dtt = max(dt, 1e-9)
    roce_bytes = float(f["bytes"].sum()) if len(f) else 0.0
    totals = {
        "roce_gbps": roce_bytes * 8 / dtt / 1e9 * k,
        "roce_pps": float(g[L.G_ACCOUNTED]) / dtt * k,
        "frames_ps": float(g[L.G_FRAMES]) / dtt,
        "frames": int(g[L.G_FRAMES]),
        "accounted": int(g[L.G_ACCOUNTED]),
        "pfc": int(g[L.G_PFC]),
        "ce_pct": (100.0 * float(f["ce"].sum()) / max(1.0, float(f["ecn_capable"].sum()))) if len(f) else 0.0,
        "cnp_ps": float(f["cnp"].sum()) / dtt * k if len(f) else 0.0,
        "retx": float(f["retransmissions"].sum()) * k if len(f) else 0.0,
        "naks": float((f["nak_seq"] + f["nak_rnr"] + f["nak_other"]).sum()) * k if len(f) else 0.0,
    }
    na = {name: int(g[i]) for i, name in enumerate(L.CATEGORY_NAMES) if i != L.G_ACCOUNTED and g[i]}
    hist, hist_label = None, ""
    if state.show_hist and 0 <= sel < len(rows):
        src_snap = cum if (cum is not None and not state.cumulative) else snap
        h = _flow_hist(src_snap, rows[sel].key)
        if h is not None:
            hist = [(L.slot_lower_bound(s), int(c)) for s, c in enumerate(h) if c]
            hist_label = f"{rows[sel].src}->{rows[sel].dst} qp {rows[sel].qp:x}"
    m = snap.meta
    cm = (cum.meta if cum is not None else m)
    return Model(when=time.time(), iface=iface or str(m.get("interface", "")), attach=attach, interval=interval,
                 dt=dt, elapsed=elapsed, cumulative=state.cumulative, sample_n=sample_n, rows=rows,
                 nflows_active=len(f), nflows_shown=shown,
                 nflows_map=int(cm.get("flows_present", len(f))), totals=totals, not_accounted=na,
                 evicted=int(m.get("flows_evicted", 0)), evicted_total=int(cm.get("flows_evicted", 0)),
                 events_lost=int(cm.get("events_lost", 0)) + int(cm.get("events_dropped", 0)),
                 hist=hist, hist_label=hist_label, analysis=analysis, analysis_note=analysis_note,
                 sort_title=SORTS[state.sort][1], reverse=state.reverse, filter=state.filter,
                 editing=state.editing, selected=sel, paused=state.paused, help=state.help,
                 matrix=matrix_view(snap, dt, state.cumulative, keep) if state.matrix else None)


def _flow_hist(snap: Snapshot, key: tuple):
    f = snap.flows
    if not len(f):
        return None
    src = np.frombuffer(key[0], dtype=np.uint8)
    dst = np.frombuffer(key[1], dtype=np.uint8)
    m = (f["dest_qp"] == key[2]) & np.all(f["src"] == src, axis=1) & np.all(f["dst"] == dst, axis=1)
    idx = np.nonzero(m)[0]
    return f["msg_hist"][idx[0]] if len(idx) else None


# ---- view state and keys --------------------------------------------------------------------
@dataclass
class ViewState:
    sort: int = 0
    reverse: bool = False
    filter: str = ""
    editing: str | None = None
    selected_key: tuple | None = None
    sel_row: int = -1
    selecting: bool = False
    show_hist: bool = False
    cumulative: bool = False
    paused: bool = False
    help: bool = False
    matrix: bool = False
    quit: bool = False

    def key(self, k: str, nrows: int = 0) -> None:
        """Apply one key ('up', 'down', 'enter', 'esc', 'backspace' or a character)."""
        if self.editing is not None:
            if k == "enter":
                self.filter, self.editing = self.editing.strip(), None
            elif k == "esc":
                self.editing = None
            elif k == "backspace":
                self.editing = self.editing[:-1]
            elif len(k) == 1 and (k.isalnum() or k in ".:"):
                self.editing += k
            return
        if k in ("q", "Q"):
            self.quit = True
        elif k == "s":
            self.sort = (self.sort + 1) % len(SORTS)
        elif k == "S":
            self.sort = (self.sort - 1) % len(SORTS)
        elif k == "r":
            self.reverse = not self.reverse
        elif k == "/":
            self.editing = self.filter
        elif k == "esc":
            if self.show_hist:
                self.show_hist = False
            elif self.filter:
                self.filter = ""
            else:
                self.selected_key, self.sel_row, self.selecting = None, -1, False
        elif k in ("down", "j"):
            self.selecting = True
            self.sel_row = min(self.sel_row + 1, max(nrows - 1, 0))
            self.selected_key = None
        elif k in ("up", "k"):
            self.selecting = True
            self.sel_row = max(self.sel_row - 1, 0)
            self.selected_key = None
        elif k in ("enter", "h"):
            if self.sel_row < 0:
                self.sel_row, self.selecting = 0, True
            self.show_hist = not self.show_hist
        elif k == "c":
            self.cumulative = not self.cumulative
        elif k == "m":
            self.matrix = not self.matrix
        elif k in ("p", " "):
            self.paused = not self.paused
        elif k == "?":
            self.help = not self.help


def _sort_spec(state: ViewState):
    key, title, desc = SORTS[state.sort]
    return key, desc, title


def decode_keys(data: bytes) -> list[str]:
    """Terminal bytes -> key names."""
    out = []
    i = 0
    s = data.decode("utf-8", "replace")
    while i < len(s):
        c = s[i]
        if c == "\x1b":
            seq = s[i:i + 3]
            if seq in ("\x1b[A", "\x1bOA"):
                out.append("up")
                i += 3
                continue
            if seq in ("\x1b[B", "\x1bOB"):
                out.append("down")
                i += 3
                continue
            if seq[:2] == "\x1b[":       # other CSI sequence: skip it
                j = i + 2
                while j < len(s) and not s[j].isalpha() and s[j] != "~":
                    j += 1
                i = j + 1
                continue
            out.append("esc")
        elif c in ("\r", "\n"):
            out.append("enter")
        elif c in ("\x7f", "\x08"):
            out.append("backspace")
        else:
            out.append(c)
        i += 1
    return out


# ---- analysis in the background -------------------------------------------------------------
def load_analyze():
    """analysis.analyze, or None when the analysis package is not installed/importable."""
    try:
        from skewscope.analysis import analyze  # heavy (numba)
        return analyze
    except ImportError:
        return None


class AnalysisRunner:
    """Runs analyze(window snapshot) in a worker thread; never more than one at a time."""

    def __init__(self, analyze=None, disabled: bool = False):
        self.analyze = analyze
        self.disabled = disabled
        self.result: dict | None = None
        self.error: str = ""
        self.when: float = 0.0
        self.window_s: float = 0.0
        self.took: float = 0.0
        self._busy = threading.Event()
        self._lock = threading.Lock()

    def idle(self) -> bool:
        return self.analyze is not None and not self._busy.is_set()

    def submit(self, snap: Snapshot) -> bool:
        if self.analyze is None or self._busy.is_set():
            return False
        self._busy.set()
        t = threading.Thread(target=self._run, args=(snap,), name="skewscope-analysis", daemon=True)
        t.start()
        return True

    def run_sync(self, snap: Snapshot) -> None:
        if self.analyze is not None:
            self._busy.set()
            self._run(snap)

    def _run(self, snap: Snapshot) -> None:
        t0 = time.monotonic()
        wall = time.time()                 # the window's last read: puts its clock on the wall
        try:
            res = self.analyze(snap)
            if isinstance(res, dict):
                res["_clock"] = Clock.of(snap.meta, wall_end=wall)
            err = ""
        except Exception as e:  # an analysis bug must not kill the live view
            res, err = None, f"analysis failed: {type(e).__name__}: {e}"
        with self._lock:
            if res is not None:
                self.result = res
            self.error = err
            self.when = time.time()
            self.window_s = float(snap.meta.get("window_s", snap.meta.get("duration_s", 0)) or 0)
            self.took = time.monotonic() - t0
        self._busy.clear()

    def note(self) -> str:
        if self.disabled:
            return "analysis off (--no-analysis)"
        if self.analyze is None:
            return "analysis module not available"
        if self.error:
            return self.error
        if self.result is None:
            return "analysing…"
        age = time.time() - self.when
        return f"last {self.window_s:.0f} s, {age:.0f} s ago"


def onset_note(fd: dict, analysis: dict | None) -> str:
    """" (since 14:02:03)" / " (14:02:03-14:02:05)" in local time for a finding whose
    condition began inside the analysed window ("" when it was there from the window's
    start: it began before it, or when unknown)."""
    ck = (analysis or {}).get("_clock")
    s = fd.get("since")
    if ck is None or s is None or ck.first is None or ck.last is None:
        return ""
    if s - ck.first <= START_SHARE * max(0.0, ck.last - ck.first):
        return ""
    a, u = ck.wall(s), ck.wall(fd.get("until"))
    if a is None:
        return ""
    hm = "%H:%M:%S"
    return (f" (since {time.strftime(hm, time.localtime(a))})" if u is None else
            f" ({time.strftime(hm, time.localtime(a))}-{time.strftime(hm, time.localtime(u))})")


def findings_sorted(analysis: dict | None) -> list[dict]:
    """By severity, then impact (estimated time lost per iteration/token; null last)."""
    fs = list((analysis or {}).get("findings") or [])
    return sorted(fs, key=lambda d: (SEVERITY_ORDER.get(str(d.get("severity", "info")), 3),
                                     -float(((d.get("impact") or {}).get("seconds")) or 0)))


def timing_lines(analysis: dict | None) -> list[str]:
    """The timing (token period, ITL, step -> collective -> iteration), as report: the
    capture's; with several groups that have a rhythm (two jobs on one fabric), each
    group's, prefixed by the group (index, kind, first member, workload)."""
    a = analysis or {}
    timed = [(i, c) for i, c in enumerate(a.get("collectives") or []) if isinstance(c, dict) and c.get("timing")]
    if len(timed) <= 1:
        return [x.strip() for x in R.timing_lines(a.get("timing"))]
    out = []
    for i, c in timed:
        tm = c["timing"]
        mem = c.get("members") or ["?"]
        head = f"group {i} {c.get('kind')} {mem[0]}{'..+' + str(len(mem) - 1) if len(mem) > 1 else ''}"
        per = f"period {tm['period_s'] * 1e3:.3f} ms" if tm.get("period_s") else ""
        out.append(f"{head} {tm.get('workload') or ''}: {per}".rstrip(": "))
        out += ["  " + x.strip() for x in R.timing_lines(tm)]
    return out


def collective_lines(analysis: dict | None, limit: int = 8) -> list[str]:
    """One line per detected collective group: kind, size, confidence and its skew (the
    analysis' own numbers: all-to-all destination skew and hot destination, the slowest
    ring link's rate ratio, else the spread of link rates)."""
    cols = (analysis or {}).get("collectives") or []
    out = []
    for c in cols[:limit]:
        if not isinstance(c, dict):
            out.append(str(c))
            continue
        m = c.get("metrics") or {}
        members = c.get("members") or []
        parts = [str(c.get("kind") or "?"), f"{len(members)} nodes"]
        if c.get("confidence") is not None:
            parts.append(f"conf {float(c['confidence']):.2f}")
        if m.get("workload"):                 # the group's own (two jobs on one fabric)
            parts.append(str(m["workload"]))
        ds = m.get("dest_skew") or {}
        sl = m.get("slowest_link") or {}
        lr = m.get("link_rate_skew") or {}
        if ds.get("max_over_mean"):
            s = f"dest skew {float(ds['max_over_mean']):.2f}x"
            if m.get("hot_destination") and float(ds["max_over_mean"]) > 1.05:
                s += f" hot {m['hot_destination']}"
            parts.append(s)
        elif sl.get("rate_ratio") is not None:
            parts.append(f"slowest {sl.get('src')}->{sl.get('dst')} {float(sl['rate_ratio']):.2f}x")
        elif lr.get("min_over_mean") is not None:
            parts.append(f"link rates {float(lr['min_over_mean']):.2f}-{float(lr.get('max_over_mean') or 0):.2f}x")
        out.append("  ".join(parts))
    if len(cols) > limit:
        out.append(f"… {len(cols) - limit} more")
    return out


# ---- plain output (bcc style) -----------------------------------------------------------------
PLAIN_HEADER = f"{'SRC':<15} {'DST':<15} {'QP':>6} {'BIT/S':>6} {'PKT/S':>6} {'MSG':>5} {'CE%':>4} " \
               f"{'CNP/S':>5} {'RETX':>4} {'NAK':>3}"
PLAIN_WIDTH = 79


def plain_row(r: Row) -> str:
    return (f"{short_ip(r.src):<15} {short_ip(r.dst):<15} {r.qp:>6x} {fmt_bits(r.gbps):>6} {fmt_num(r.pps, 6):>6} "
            f"{fmt_size(r.msg_mode):>5} {min(r.ce_pct, 100):>4.1f} {fmt_num(r.cnp_ps, 5):>5} "
            f"{fmt_num(r.retx, 4):>4} {fmt_num(r.naks, 3):>3}")


def header_line(m: Model) -> str:
    t = m.totals
    ts = time.strftime("%H:%M:%S", time.localtime(m.when))
    s = (f"{ts} RoCE {fmt_bits(t['roce_gbps'])}bit/s {fmt_num(t['roce_pps'])} pkt/s, "
         f"{m.nflows_active} flows")
    if m.sample_n > 1:
        s += f", sampled 1/{m.sample_n} (scaled)"
    return s


def counters_line(m: Model) -> str:
    t = m.totals
    na = sum(m.not_accounted.values())
    parts = [f"frames {t['frames']}"]
    if na:
        top = sorted(m.not_accounted.items(), key=lambda kv: -kv[1])[:3]
        parts.append("not accounted " + str(na) + " (" + ", ".join(f"{k} {v}" for k, v in top) + ")")
    else:
        parts.append("not accounted 0")
    parts.append(f"evicted {m.evicted}")
    if m.events_lost:
        parts.append(f"records lost {m.events_lost}")
    return "  ".join(parts)


def plain_lines(m: Model, max_findings: int = 5) -> list[str]:
    out = [header_line(m)[:PLAIN_WIDTH], ("  " + counters_line(m))[:PLAIN_WIDTH]]
    if m.matrix is not None:
        out += matrix_lines(m.matrix, PLAIN_WIDTH)
    else:
        out.append(PLAIN_HEADER)
        out += [plain_row(r) for r in m.rows]
        if m.nflows_shown > len(m.rows):
            out.append(f"  ... {m.nflows_shown - len(m.rows)} more flows")
    out += ["  " + x for x in timing_lines(m.analysis)]
    fs = findings_sorted(m.analysis)
    for fd in fs[:max_findings]:
        sev = SEV_SHORT.get(str(fd.get("severity")), str(fd.get("severity", "?"))[:4].upper())
        msg = str(fd.get("message") or fd.get("kind")) + onset_note(fd, m.analysis)
        out += textwrap.wrap(f"{sev} {msg}", width=PLAIN_WIDTH, subsequent_indent="     ")
    if len(fs) > max_findings:
        out.append(f"     ... {len(fs) - max_findings} more findings")
    return out


# ---- the node x node matrix (key m, --matrix) -------------------------------------------------
# A dark-to-bright ramp (matplotlib's "inferno", without its black end so no cell vanishes on a
# black terminal): cold links dark, hot ones bright. White text on the first HEAT_DARK colours.
HEAT = ("#1b0c41", "#4a0c6b", "#781c6d", "#a52c60", "#cf4446", "#ed6925", "#fb9b06", "#f7d13d", "#fcffa4")
HEAT_DARK = 5
HEAT_DECADES = 6          # the colour scale spans at most this many decades below the hottest cell
MATRIX_MIN_CELL = 6       # characters per cell: value (<= 4-5 chars) + a marker
MATRIX_LINES = 8          # title, header, in-row, legend, up to 4 summary/note lines
CORNER = "SRC\\DST"
HOT_SHOWN = 1.1           # the hot destination is highlighted when it receives >= this x the mean
COLD_SHOWN = 0.8          # the summary names the coldest link when it is below this x the median link


@dataclass
class MatrixView:
    """The traffic matrix of one interval (or since start): analysis.matrix.node_matrix (data
    payload bytes from node i to node j, data flows only), as bit/s over dt, scaled by the
    sampling factor like every rate of top."""
    ips: list
    bps: np.ndarray
    dt: float
    cumulative: bool
    error: str = ""
    hot_dst: int = -1             # column with the largest sum (the hot destination)
    hot_cell: tuple | None = None
    dest_skew: dict | None = None  # analysis.stats.skew_stats of the column sums
    cold_link: tuple | None = None  # (i, j, ratio to the median non-zero link) with >= 3 links

    @property
    def n(self) -> int:
        return len(self.ips)


def matrix_view(snap: Snapshot, dt: float, cumulative: bool = False, flow_mask=None) -> MatrixView:
    """The matrix of snap over dt seconds; flow_mask (bool per flow: the IP filter) keeps
    only those flows and the nodes they reach."""
    try:
        from skewscope.analysis.matrix import node_matrix  # heavy (numba): only in the matrix view
        from skewscope.analysis.stats import skew_stats  # heavy (numba): only in the matrix view
    except ImportError as e:
        return MatrixView([], np.zeros((0, 0)), dt, cumulative, error=f"the node matrix needs the analysis ({e})")
    ips, mat = node_matrix(snap, flow_mask)
    k = float(int(snap.meta.get("sample_n", 1) or 1))
    bps = np.asarray(mat, dtype=np.float64) * 8.0 * k / max(dt, 1e-9)
    ips = list(ips)
    if flow_mask is not None and len(ips):
        live_n = (bps.sum(axis=0) + bps.sum(axis=1)) > 0
        ips = [ip for ip, x in zip(ips, live_n) if x]
        bps = bps[np.ix_(live_n, live_n)]
    mv = MatrixView(ips, bps, dt, cumulative)
    if not len(ips) or not (bps > 0).any():
        return mv
    col = bps.sum(axis=0)
    mv.hot_dst = int(np.argmax(col))
    i, j = np.unravel_index(int(np.argmax(bps)), bps.shape)
    mv.hot_cell = (int(i), int(j))
    mv.dest_skew = skew_stats(col[col > 0])
    off = ~np.eye(len(ips), dtype=bool) & (bps > 0)
    if off.sum() >= 3:
        v = np.where(off, bps, np.inf)
        ci, cj = np.unravel_index(int(np.argmin(v)), v.shape)
        mv.cold_link = (int(ci), int(cj), float(bps[ci, cj] / np.median(bps[off])))
    return mv


def _common_prefix(ips: list) -> str:
    """The address prefix all nodes share, cut after a '.' or ':' (10.0.0.), or ''."""
    if len(ips) < 2:
        return ""
    p = os.path.commonprefix(ips)
    cut = max(p.rfind("."), p.rfind(":"))
    return p[:cut + 1] if cut >= 0 else ""


@dataclass
class MatrixLayout:
    nodes: list          # indices of the nodes shown (address order)
    labels: list         # their labels
    other: bool          # an "other" row/column sums the nodes not shown
    prefix: str          # labels are the addresses without this common prefix ('' = full)
    cell_w: int          # characters per column, the separating space included
    label_w: int


def _fit(labels: list, n: int, width: int, max_rows: int | None):
    lw = max([len(x) for x in labels] + [len(CORNER)])
    cw = max(MATRIX_MIN_CELL, max(len(x) for x in labels)) + 1
    tail = MATRIX_MIN_CELL + 1                      # the OUT column
    if lw + n * cw + tail <= width and (max_rows is None or n <= max_rows):
        return n, cw, lw
    k = (width - lw - cw - tail) // cw              # one column goes to "other"
    if max_rows is not None:
        k = min(k, max_rows - 1)
    return max(1, min(k, n - 1)), cw, lw


def matrix_layout(mv: MatrixView, width: int, max_rows: int | None = None) -> MatrixLayout:
    """Which nodes fit width (and max_rows): all, else the top ones by traffic (in + out),
    the hot destination and the hottest cell's pair always among them, the rest summed into
    "other". Labels: full addresses, or without their common prefix when that shows more."""
    n = mv.n
    full = [short_ip(ip) for ip in mv.ips]
    pre = _common_prefix(mv.ips)
    best = None
    for labels, prefix in ((full, ""), ([short_ip(ip[len(pre):]) for ip in mv.ips] if pre else None, pre)):
        if labels is None:
            continue
        k, cw, lw = _fit(labels, n, width, max_rows)
        if best is None or k > best[0]:
            best = (k, cw, lw, labels, prefix)
    if best is None:
        return MatrixLayout([], [], False, "", MATRIX_MIN_CELL + 1, len(CORNER))
    k, cw, lw, labels, prefix = best
    if k >= n:
        nodes = list(range(n))
    else:
        must = [x for x in (mv.hot_dst, *(mv.hot_cell or ())) if x >= 0]
        traffic = mv.bps.sum(axis=0) + mv.bps.sum(axis=1)
        nodes = list(dict.fromkeys(must))[:k]
        for x in np.argsort(-traffic, kind="stable"):
            if len(nodes) >= k:
                break
            if int(x) not in nodes:
                nodes.append(int(x))
        nodes.sort()
    return MatrixLayout(nodes, [labels[i] for i in nodes], k < n, prefix, cw, lw)


def matrix_grid(mv: MatrixView, lay: MatrixLayout):
    """(shown matrix, row sums, column sums): the shown nodes' cells, plus an "other" row
    and column summing the rest when lay.other. Sums are over every node."""
    ix = np.asarray(lay.nodes, dtype=np.int64)
    g = mv.bps[np.ix_(ix, ix)]
    if lay.other:
        rest = np.setdiff1d(np.arange(mv.n), ix)
        top = np.hstack([g, mv.bps[np.ix_(ix, rest)].sum(axis=1, keepdims=True)])
        bot = np.hstack([mv.bps[np.ix_(rest, ix)].sum(axis=0, keepdims=True),
                         [[mv.bps[np.ix_(rest, rest)].sum()]]])
        g = np.vstack([top, bot])
    return g, g.sum(axis=1), g.sum(axis=0)


def heat_scale(values: np.ndarray) -> tuple[float, float]:
    """(log10 low, log10 high) of the colour scale: the hottest value down to the coldest
    non-zero one, at least one decade and at most HEAT_DECADES."""
    v = np.asarray(values, dtype=np.float64)
    v = v[v > 0]
    if not len(v):
        return 0.0, 1.0
    hi = float(np.log10(v.max()))
    lo = float(np.log10(v.min()))
    return max(min(lo, hi - 1.0), hi - HEAT_DECADES), hi


def heat_index(x: float, scale: tuple[float, float]) -> int:
    """Colour index (0 = coldest) of a value > 0 on the log scale."""
    lo, hi = scale
    if x <= 0:
        return -1
    f = (np.log10(x) - lo) / max(hi - lo, 1e-12)
    return int(min(len(HEAT) - 1, max(0, round(f * (len(HEAT) - 1)))))


def _marks(mv: MatrixView, lay: MatrixLayout) -> dict:
    """{(shown row, shown column): 'hot' | 'rowmax'}: the hottest cell and each source's
    largest destination (over all its destinations; marked when that column is shown)."""
    pos = {x: p for p, x in enumerate(lay.nodes)}
    out = {}
    for p, i in enumerate(lay.nodes):
        row = mv.bps[i]
        if row.max() > 0:
            j = int(np.argmax(row))
            if j in pos:
                out[(p, pos[j])] = "rowmax"
    if mv.hot_cell and mv.hot_cell[0] in pos and mv.hot_cell[1] in pos:
        out[(pos[mv.hot_cell[0]], pos[mv.hot_cell[1]])] = "hot"
    return out


def _is_hot(mv: MatrixView) -> bool:
    """The busiest destination stands out (>= HOT_SHOWN x the mean of the receiving nodes)."""
    ds = mv.dest_skew or {}
    return mv.hot_dst >= 0 and ds.get("n", 0) > 1 and float(ds.get("max_over_mean") or 0) >= HOT_SHOWN


def _matrix_title(mv: MatrixView) -> str:
    span = f"since start ({mv.dt:.0f} s)" if mv.cumulative else f"last {mv.dt:.2g} s"
    return f"node matrix, data bit/s, {span} (rows: source, columns: destination)"


def matrix_summary(mv: MatrixView, lay: MatrixLayout) -> list[str]:
    """The hot destination, the hottest cell, the coldest link, and what is not shown."""
    out = []
    if mv.hot_dst >= 0:
        ds = mv.dest_skew or {}
        if _is_hot(mv):
            out.append(f"hot destination {mv.ips[mv.hot_dst]}: {100 * float(ds['max_share']):.0f}% of the bytes in, "
                       f"{float(ds['max_over_mean']):.2f}x the mean")
        elif ds.get("max_over_mean") is not None:
            out.append(f"destinations even: the busiest receives {float(ds['max_over_mean']):.2f}x the mean")
        i, j = mv.hot_cell
        s = f"hottest cell {mv.ips[i]}->{mv.ips[j]} {fmt_num(mv.bps[i, j])}bit/s"
        if mv.cold_link is not None and mv.cold_link[2] < COLD_SHOWN:
            i, j, r = mv.cold_link
            s += f"; coldest link {mv.ips[i]}->{mv.ips[j]} {r:.2f}x the median"
        out.append(s)
    if lay.prefix:
        out.append(f"labels: the address after {lay.prefix}")
    if lay.other:
        out.append(f"top {len(lay.nodes)} of {mv.n} nodes by traffic; other = the {mv.n - len(lay.nodes)} others summed")
    return out


def matrix_lines(mv: MatrixView, width: int = PLAIN_WIDTH, max_rows: int | None = None) -> list[str]:
    """The matrix as an aligned plain table (bit/s with SI suffixes; '-' = no data; '*' the
    hottest cell, '+' a source's largest destination), width-bounded."""
    if mv.error:
        return [mv.error[:width]]
    out = [_matrix_title(mv)[:width]]
    if not mv.n or mv.hot_dst < 0:
        return out + ["(no data traffic between nodes)"]
    lay = matrix_layout(mv, width, max_rows)
    g, rs, cs = matrix_grid(mv, lay)
    marks = _marks(mv, lay)
    labels = lay.labels + (["other"] if lay.other else [])
    c = lay.cell_w
    out.append(f"{CORNER:<{lay.label_w}}" + "".join(f"{x:>{c}}" for x in labels) + f"{'OUT':>{MATRIX_MIN_CELL + 1}}")
    for p, lab in enumerate(labels):
        cells = []
        for q in range(len(labels)):
            v = g[p, q]
            mk = {"hot": "*", "rowmax": "+"}.get(marks.get((p, q)), " ")
            cells.append(f"{(fmt_num(v) if v > 0 else '-'):>{c - 1}}{mk}")
        out.append(f"{lab:<{lay.label_w}}" + "".join(cells) + f"{fmt_num(rs[p]):>{MATRIX_MIN_CELL + 1}}")
    out.append(f"{'IN':<{lay.label_w}}" + "".join(f"{fmt_num(v):>{c - 1}} " for v in cs)
               + f"{fmt_num(g.sum()):>{MATRIX_MIN_CELL + 1}}")
    out += [x[:width] for x in ["* hottest cell  + largest destination of its source  - none"]
            + matrix_summary(mv, lay)]
    return out


def render_matrix(mv: MatrixView, width: int, max_rows: int | None = None):
    """The matrix as a colour heatmap (rich Text): background = log scale of bit/s, a legend
    with the scale, the hot destination's column header highlighted, the hottest cell
    marked ◆ and each source's largest destination •."""
    from rich.text import Text  # heavy (rich): only when drawing

    t = Text(no_wrap=True, overflow="crop")
    if mv.error:
        t.append(mv.error, style="yellow")
        return t
    t.append(_matrix_title(mv) + "\n", style="bold")
    if not mv.n or mv.hot_dst < 0:
        t.append("(no data traffic between nodes in this view)")
        return t
    lay = matrix_layout(mv, width - 1, max_rows)
    g, rs, cs = matrix_grid(mv, lay)
    marks = _marks(mv, lay)
    scale = heat_scale(g)
    labels = lay.labels + (["other"] if lay.other else [])
    c = lay.cell_w
    hot_pos = lay.nodes.index(mv.hot_dst) if (_is_hot(mv) and mv.hot_dst in lay.nodes) else -1
    t.append(f"{CORNER:<{lay.label_w}}", style="bold")
    for q, x in enumerate(labels):
        t.append(" ")
        t.append(f"{x:>{c - 1}}", style="bold reverse red" if q == hot_pos else "bold")
    t.append(f"{'OUT':>{MATRIX_MIN_CELL + 1}}\n", style="bold")
    for p, lab in enumerate(labels):
        t.append(f"{lab:<{lay.label_w}}", style="bold")
        for q in range(len(labels)):
            v = g[p, q]
            t.append(" ")
            if v <= 0:
                t.append(f"{'·':>{c - 2}} ", style="dim")
                continue
            h = heat_index(v, scale)
            mk = {"hot": "◆", "rowmax": "•"}.get(marks.get((p, q)), " ")
            fg = "white" if h < HEAT_DARK else "black"
            t.append(f"{fmt_num(v):>{c - 2}}{mk}", style=f"{'bold ' if mk == '◆' else ''}{fg} on {HEAT[h]}")
        t.append(f"{fmt_num(rs[p]):>{MATRIX_MIN_CELL + 1}}\n")
    t.append(f"{'IN':<{lay.label_w}}", style="bold")
    for q, v in enumerate(cs):
        t.append(" ")
        t.append(f"{fmt_num(v):>{c - 2}} ", style="bold red" if q == hot_pos else None)
    t.append(f"{fmt_num(g.sum()):>{MATRIX_MIN_CELL + 1}}\n")
    # legend: the colour steps with the bit/s each starts at, as many as fit
    lead = "log scale, bit/s: "
    tail = "  ◆ hottest cell  • largest destination of its source"
    nsw = max(2, min(len(HEAT), (width - 1 - len(lead) - len(tail)) // 7))
    t.append(lead, style="dim")
    lo, hi = scale
    for s in range(nsw):
        h = round(s * (len(HEAT) - 1) / (nsw - 1))
        val = 10 ** (lo + (hi - lo) * h / (len(HEAT) - 1))
        t.append(f"{fmt_num(val):^6}", style=f"{'white' if h < HEAT_DARK else 'black'} on {HEAT[h]}")
        t.append(" ")
    t.append(tail[:max(0, width - 1 - len(lead) - 7 * nsw)] + "\n", style="dim")
    summ = matrix_summary(mv, lay)
    for k, line in enumerate(summ):
        t.append(line[:width - 1] + ("\n" if k < len(summ) - 1 else ""), style="yellow" if k == 0 else None)
    return t


# ---- rich rendering ---------------------------------------------------------------------------
def render_rich(m: Model, height: int = 40, width: int = 120, banner: str = ""):
    from rich.console import Group  # heavy (rich): only when drawing
    from rich.panel import Panel  # heavy (rich): only when drawing
    from rich.table import Table  # heavy (rich): only when drawing
    from rich.text import Text  # heavy (rich): only when drawing

    t = m.totals
    hdr = Text()
    hdr.append(f"skewscope top  {m.iface}  ", style="bold")
    hdr.append(m.attach, style="cyan")
    hdr.append(f"   {time.strftime('%H:%M:%S', time.localtime(m.when))}  interval {m.interval:g}s  "
               f"up {int(m.elapsed) // 3600:02d}:{int(m.elapsed) % 3600 // 60:02d}:{int(m.elapsed) % 60:02d}")
    if m.paused:
        hdr.append("  PAUSED", style="bold yellow")
    hdr.append("\n")
    hdr.append(f"RoCE {fmt_bits(t['roce_gbps'])}bit/s  {fmt_num(t['roce_pps'])} pkt/s   ", style="bold")
    hdr.append(f"frames {fmt_num(t['frames_ps'])}/s  CE {t['ce_pct']:.1f}%  CNP {fmt_num(t['cnp_ps'])}/s  "
               f"retx {fmt_num(t['retx'])}  NAK {fmt_num(t['naks'])}  PFC {t['pfc']}\n")
    na = sum(m.not_accounted.values())
    hdr.append(f"not accounted {na}", style="yellow" if na else None)
    if na:
        top = sorted(m.not_accounted.items(), key=lambda kv: -kv[1])[:4]
        hdr.append(" (" + ", ".join(f"{k} {v}" for k, v in top) + ")")
    hdr.append(f"   flows {m.nflows_active} active / {m.nflows_map} in map   evicted {m.evicted}"
               f" (total {m.evicted_total})", style="red" if m.evicted else None)
    hdr.append(f"   records lost {m.events_lost}", style="red" if m.events_lost else None)
    hdr.append("   sampling " + (f"1/{m.sample_n}, rates scaled" if m.sample_n > 1 else "off"),
               style="yellow" if m.sample_n > 1 else None)
    parts = [Panel(hdr, padding=(0, 1), title=banner or None, title_align="left")]

    arrow = "▲" if m.reverse else "▼"
    title = (f"flows ({'cumulative average' if m.cumulative else 'last interval'}) sorted by "
             f"{m.sort_title} {arrow}")
    if m.editing is not None:
        title += f"   filter: {m.editing}█"
    elif m.filter:
        title += f"   filter: {m.filter}"
    title += f"   {len(m.rows)} of {m.nflows_shown}"
    tab = Table(title=title, title_justify="left", expand=True, pad_edge=False, box=None, header_style="bold")
    for name, just in (("SRC", "left"), ("DST", "left"), ("QP", "right"), ("bit/s", "right"), ("pkt/s", "right"),
                       ("msg", "right"), ("CE%", "right"), ("CNP/s", "right"), ("retx", "right"), ("NAK", "right")):
        tab.add_column(name, justify=just, no_wrap=True)
    for i, r in enumerate(m.rows):
        style = "reverse" if i == m.selected else None
        ce_style = "red" if r.ce_pct >= 5 else None
        tab.add_row(r.src, r.dst, f"{r.qp:x}", fmt_bits(r.gbps), fmt_num(r.pps), fmt_size(r.msg_mode),
                    Text(f"{r.ce_pct:.1f}", style=ce_style), fmt_num(r.cnp_ps),
                    Text(fmt_num(r.retx), style="red" if r.retx else None),
                    Text(fmt_num(r.naks), style="red" if r.naks else None), style=style)
    if not m.rows:
        tab.add_row("(no RoCE traffic in this interval)" if not m.filter else "(no flow matches the filter)",
                    *[""] * 9)
    if m.matrix is not None:
        parts.append(render_matrix(m.matrix, width, max_rows=max(3, height - 16 - MATRIX_LINES)))
    else:
        parts.append(tab)

    # bottom panels: collectives (or the histogram of the selected flow) | findings
    fs = findings_sorted(m.analysis)
    ftext = Text()
    for fd in fs[:12]:
        sev = str(fd.get("severity", "info"))
        color = {"critical": "bold red", "warning": "yellow"}.get(sev, "cyan")
        ftext.append(f"{SEV_SHORT.get(sev, sev[:4].upper()):<5}", style=color)
        ftext.append(f"{fd.get('message') or fd.get('kind')}{onset_note(fd, m.analysis)}\n")
    if len(fs) > 12:
        ftext.append(f"… {len(fs) - 12} more\n")
    if m.analysis is not None and not fs:
        ftext.append("no findings: traffic looks healthy\n", style="green")
    if m.analysis is None:
        ftext.append(m.analysis_note or "no analysis yet\n")
    fpanel = Panel(ftext, title=f"findings ({m.analysis_note})" if m.analysis is not None else "findings",
                   title_align="left")
    if m.hist is not None:
        ht = Text()
        mx = max((c for _, c in m.hist), default=1)
        barw = max(8, width * 2 // 5 - 24)
        for lb, c in m.hist:
            ht.append(f"{fmt_size(lb):>6}+ {c:>9} ")
            ht.append("█" * max(1, int(round(barw * c / mx))) + "\n", style="green")
        if not m.hist:
            ht.append("(no message recorded)")
        left = Panel(ht, title=f"sizes {m.hist_label}, {'interval' if m.cumulative else 'since start'}",
                     title_align="left")
    else:
        cl = collective_lines(m.analysis) + timing_lines(m.analysis)
        ct = Text("\n".join(cl) if cl else ("none detected" if m.analysis is not None else "…"))
        left = Panel(ct, title="collectives", title_align="left")
    grid = Table.grid(expand=True)
    grid.add_column(ratio=2)
    grid.add_column(ratio=3)
    grid.add_row(left, fpanel)
    parts.append(grid)
    foot = Text(HELP if m.help else "q quit  s sort  r reverse  / filter  ↑↓ select  enter histogram  "
                f"m {'flows' if m.matrix is not None else 'matrix'}  c cumulative  p pause  ? help", style="dim")
    parts.append(foot)
    return Group(*parts)


# ---- drivers ----------------------------------------------------------------------------------
def table_rows_for(height: int) -> int:
    # header panel 5 lines, table title + header 2, bottom panels ~ 8, footer 1
    return max(3, height - 17)


def run_plain(session, interval: float, count: int | None, out=None, rows: int = 20, window: float = 10.0,
              state: ViewState | None = None, analyze="auto", stop: threading.Event | None = None) -> int:
    """bcc-style periodic tables. Returns the number of intervals printed."""
    out = out or sys.stdout
    state = state or ViewState()
    runner = AnalysisRunner(load_analyze() if analyze == "auto" else analyze, disabled=analyze is None)
    win = Window(window)
    n = 0
    for iv in session.intervals(interval, count, stop=stop):
        win.add(iv)
        if runner.analyze is not None:
            runner.run_sync(win.snapshot(iv))
        m = build_model(iv.delta, iv.dt, state, iface=session.iface, attach=session.describe(), interval=interval,
                        elapsed=iv.elapsed, cum=iv.cum, limit=rows, analysis=runner.result,
                        analysis_note=runner.note())
        print("", file=out)
        for line in plain_lines(m):
            print(line, file=out)
        if runner.error:
            print(f"note: {runner.error}"[:PLAIN_WIDTH], file=out)
        out.flush()
        n += 1
    return n


def run_tty(session, interval: float, rows: int = 0, window: float = 10.0, state: ViewState | None = None,
            analyze="auto", stop: threading.Event | None = None, banner: str = "") -> None:
    """The full-screen view. Returns on q; Ctrl-C raises KeyboardInterrupt (the caller's
    finally detaches). The terminal is restored in every case."""

    from rich.console import Console  # heavy (rich): only when drawing
    from rich.live import Live  # heavy (rich): only when drawing

    state = state or ViewState()
    runner = AnalysisRunner(load_analyze() if analyze == "auto" else analyze, disabled=analyze is None)
    win = Window(window)
    # A full-screen view follows the real terminal (and its resizes): exported COLUMNS/LINES
    # (often stale -- e.g. inherited into tmux panes) would pin it to a wrong size.
    for v in ("COLUMNS", "LINES"):
        os.environ.pop(v, None)
    console = Console()
    fd = sys.stdin.fileno()
    old = termios.tcgetattr(fd)
    last = {"iv": None, "model": None}

    def redraw(live):
        iv = last["iv"]
        if iv is None:
            return
        h = console.size.height
        limit = rows or table_rows_for(h)
        if state.show_hist:
            limit = max(3, limit - 4)
        snap, dt = (iv.cum, max(iv.elapsed, 1e-9)) if state.cumulative else (iv.delta, iv.dt)
        m = build_model(snap, dt, state, iface=session.iface, attach=_attach_label(session), interval=interval,
                        elapsed=iv.elapsed, cum=iv.cum, limit=limit, analysis=runner.result,
                        analysis_note=runner.note())
        last["model"] = m
        live.update(render_rich(m, height=h, width=console.size.width, banner=banner), refresh=True)

    try:
        tty.setcbreak(fd)
        with Live(console=console, screen=True, auto_refresh=False, transient=False) as live:
            from rich.text import Text  # heavy (rich): only when drawing
            live.update(Text((banner + "\n" if banner else "") + f"skewscope top: {session.describe()}; "
                             f"first refresh in {interval:g} s …  (q quits)"), refresh=True)

            def wait(timeout):
                r, _, _ = select.select([fd], [], [], timeout)
                if stop is not None and stop.is_set():
                    return True
                if not r:
                    return state.quit
                data = os.read(fd, 64)
                nrows = len(last["model"].rows) if last["model"] is not None else 0
                for k in decode_keys(data):
                    state.key(k, nrows)
                if state.quit:
                    return True
                redraw(live)
                return False

            for iv in session.intervals(interval, None, wait=wait):
                win.add(iv)
                if not state.paused:
                    last["iv"] = iv
                if runner.idle():                 # build the window snapshot only when it will be used
                    runner.submit(win.snapshot(iv))
                redraw(live)
                if state.quit:
                    break
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, old)


def _attach_label(session) -> str:
    if session.mode == "xdp":
        s = f"XDP {session.xdp_mode}"
    else:
        s = f"TC {session.direction}"
    via = getattr(session, "attached_via", "")      # bpf_link, or netlink (survives a SIGKILL)
    if via:
        s += f" ({via})"
    if session.config.sample_n > 1:
        s += f", 1/{session.config.sample_n} sampled"
    return s
