"""The `top` screen's view model and its plain text: `build_model` turns an interval's
Snapshot into rows and header numbers; `ViewState.key` applies a key press; the analysis
panels (`timing_lines`, `collective_lines`, `finding_rows` -- incidents first --, `onset_note`); `plain_lines`
draws a model as bcc-style periodic tables (< 80 columns).

The rest of `top`: outputs/topformat.py (fixed-width cells), outputs/topmatrix.py (the node x
node matrix of key m / --matrix), outputs/toprich.py (the rich full-screen drawing), and the
run loops that drive a LiveSession with the analysis in the background: skewscope/live/top.py.

Per interval the work is one map read, one delta (numpy), sort, and formatting of the rows
shown. Analysis (collectives, findings) runs on a rolling window (`--window`, default 10 s)
in a worker thread so a slow analysis never stalls the screen; the panels say how old the
result is.
"""
from __future__ import annotations

import textwrap
import time
from dataclasses import dataclass, field

import numpy as np

from skewscope.core import layout as L
from skewscope.core.rates import flow_rates
from skewscope.core.snapshot import Snapshot, ip_str
from skewscope.outputs import report as R
from skewscope.outputs.topformat import PLAIN_WIDTH, fmt_bits, fmt_num, fmt_size, short_ip
from skewscope.outputs.topmatrix import MatrixView, matrix_lines, matrix_view
from skewscope.core.when import START_SHARE

SEV_SHORT = {"critical": "CRIT", "warning": "WARN", "info": "INFO"}

# (key in the model's rates, column title, descending by default)
SORTS = (("gbps", "bit/s", True), ("pps", "pkt/s", True), ("ce_pct", "CE%", True), ("cnp_ps", "CNP/s", True),
         ("retx", "retx", True), ("naks", "NAK", True), ("src", "src", False), ("dst", "dst", False))

HELP = ("q quit   s/S sort column   r reverse   / filter by IP   esc clear filter   "
        "up/down (j/k) select   enter/h size histogram   m node matrix / flows   c interval/cumulative   "
        "p pause   ? help")



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


def _order(rates: dict, flows: np.ndarray, sort: str, desc: bool, first: int = 0) -> np.ndarray:
    """Row indices in display order; first > 0: only (at least) the first `first` of them,
    the same rows in the same order (a table of a million flows shows twenty: they are
    picked by a partition, and only the rows tied with or above the twentieth are sorted)."""
    if sort in ("src", "dst"):
        k = np.ascontiguousarray(flows[sort]).view("S16").reshape(-1)
        o = np.argsort(k, kind="stable")
        return o[::-1] if desc else o
    v = -rates[sort] if desc else rates[sort]
    g = -rates["gbps"]
    if 0 < first < len(v):
        cand = np.nonzero(v <= np.partition(v, first - 1)[first - 1])[0]
        # ties broken by Gb/s then key order, so the view does not flicker
        return cand[np.lexsort((g[cand], v[cand]))]
    return np.lexsort((g, v))


def build_model(snap: Snapshot, dt: float, state: "ViewState", *, iface: str = "", attach: str = "",
                interval: float = 1.0, elapsed: float = 0.0, cum: Snapshot | None = None,
                limit: int = 20, analysis: dict | None = None, analysis_note: str = "") -> Model:
    """Rows (sorted, filtered, at most `limit`) and header numbers of one interval."""
    f = snap.flows
    sample_n = int(snap.meta.get("sample_n", 1) or 1)
    sums: dict = {}
    rates = flow_rates(f, dt, sample_n, sums=sums)
    key, desc, _ = _sort_spec(state)
    order = _order(rates, f, key, desc if not state.reverse else not desc, first=0 if state.filter else limit)
    shown = len(f)
    keep = None
    if state.filter:
        src_s = _ips.strings(f["src"], f["ipver"])
        dst_s = _ips.strings(f["dst"], f["ipver"])
        flt = state.filter.strip()
        nm = state.names
        keep = np.array([flt in a or flt in b or (bool(nm) and (flt in nm.get(a, "") or flt in nm.get(b, "")))
                         for a, b in zip(src_s, dst_s)], dtype=bool)
        order = order[keep[order]]
        shown = len(order)
    if limit > 0:
        order = order[:limit]
    rows = []
    for i in order:
        r = f[i]
        v = int(r["ipver"])
        s, d = ip_str(r["src"], v), ip_str(r["dst"], v)
        rows.append(Row(key=(bytes(r["src"]), bytes(r["dst"]), int(r["dest_qp"])),
                        src=state.names.get(s, s), dst=state.names.get(d, d), qp=int(r["dest_qp"]),
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
    roce_bytes = float(sums["bytes"]) if len(f) else 0.0
    totals = {
        "roce_gbps": roce_bytes * 8 / dtt / 1e9 * k,
        "roce_pps": float(g[L.G_ACCOUNTED]) / dtt * k,
        "frames_ps": float(g[L.G_FRAMES]) / dtt,
        "frames": int(g[L.G_FRAMES]),
        "accounted": int(g[L.G_ACCOUNTED]),
        "pfc": int(g[L.G_PFC]),
        "ce_pct": (100.0 * float(sums["ce"]) / max(1.0, float(sums["ecn_capable"]))) if len(f) else 0.0,
        "cnp_ps": float(sums["cnp"]) / dtt * k if len(f) else 0.0,
        "retx": float(sums["retransmissions"]) * k if len(f) else 0.0,
        "naks": float(sums["naks"]) * k if len(f) else 0.0,
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
                 matrix=matrix_view(snap, dt, state.cumulative, keep, state.names) if state.matrix else None)


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
    #: ip -> what people call it (--inventory): the flow table's and the matrix's labels; the
    #: filter matches both
    names: dict = field(default_factory=dict)

    def key(self, k: str, nrows: int = 0) -> None:
        """Apply one key ('up', 'down', 'enter', 'esc', 'backspace' or a character)."""
        if self.editing is not None:
            if k == "enter":
                self.filter, self.editing = self.editing.strip(), None
            elif k == "esc":
                self.editing = None
            elif k == "backspace":
                self.editing = self.editing[:-1]
            elif len(k) == 1 and (k.isalnum() or k in ".:-_/"):
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


# ---- the analysis panels --------------------------------------------------------------------
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


def cause_note(fd: dict) -> str:
    """ " -- cause: GPU 3 of gpu-17: ..." when GPU telemetry explained the finding (--dcgm)."""
    text = (fd.get("cause") or {}).get("text")
    return f" -- cause: {text}" if text else ""


def findings_sorted(analysis: dict | None) -> list[dict]:
    """By severity, then impact (estimated time lost per iteration/token; null last)."""
    return R.by_severity(list((analysis or {}).get("findings") or []))


def finding_rows(analysis: dict | None) -> list[tuple[int, dict]]:
    """(depth, finding) as the findings panel lists them: each incident's lead at depth 0,
    its other findings under it at depth 1, then the findings of no incident (context) at
    depth 0 (outputs.report.incident_sections)."""
    return [(1 if inc is not None and k else 0, fd) for inc, fs in R.incident_sections(analysis)
            for k, fd in enumerate(fs)]


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
    rows = finding_rows(m.analysis)
    for depth, fd in rows[:max_findings]:
        sev = SEV_SHORT.get(str(fd.get("severity")), str(fd.get("severity", "?"))[:4].upper())
        msg = str(fd.get("message") or fd.get("kind")) + onset_note(fd, m.analysis) + cause_note(fd)
        if depth:                               # a finding of the incident above
            out += textwrap.wrap(f"  + {fd.get('kind')}: {msg}", width=PLAIN_WIDTH, subsequent_indent="       ")
        else:
            out += textwrap.wrap(f"{sev} {msg}", width=PLAIN_WIDTH, subsequent_indent="     ")
    if len(rows) > max_findings:
        out.append(f"     ... {len(rows) - max_findings} more findings")
    return out
