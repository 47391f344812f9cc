"""Snapshot + analysis -> one self-contained HTML page (`report --html`, `capture --html`).

The pictures are server-side SVG drawn by matplotlib (docs/html.md says why: no JavaScript,
no network, the smallest page, printable), inlined in the page; no script, no external
font, style sheet or image. What is drawn comes from the analysis document (the JSON
contract of outputs/report.py: collectives, timing, findings with their evidence, metrics)
and, for time series and histograms, from the Snapshot through the analysis' own functions
(analysis.matrix.node_matrix / link_rates on the cached Context): nothing is recomputed
differently here.

Sections: findings (each with its evidence drawn), node x node traffic matrix (bytes and rate
over active time; the busiest MATRIX_TOP nodes, the rest summed into one "other" row and
column), per-link rate over time for the largest groups, the timing hierarchy, message-size
histograms per group, counters.
"""
from __future__ import annotations

import html
import io
import math
import os
import re

import numpy as np

from skewscope.core import layout as L
from skewscope.core.errors import EXIT_NOT_RUN, EXIT_USAGE, SkewscopeError
from skewscope.core.files import atomic_write_text
from skewscope.core.snapshot import Snapshot
from skewscope.outputs import report as R
from skewscope.outputs.when import START_SHARE, Clock

#: nodes drawn one by one in the matrix; the others are summed into "other (n)"
MATRIX_TOP = 32
#: matrices up to this many nodes get their values written in the cells
MATRIX_LABELS = 12
#: groups (collectives) with a rate-over-time plot and a size histogram
GROUPS_TOP = 4
#: links drawn per group in the rate-over-time plot
LINKS_TOP = 8
#: time bins of the rate-over-time plots
TIME_BINS = 240
#: findings drawn (all are listed), and at most this many of one kind
FINDINGS_DRAWN = 10
DRAWN_PER_KIND = 2
#: bars (links, nodes) in one evidence panel
PANEL_BARS = 16

SEV_COLOR = {"critical": "#c62828", "warning": "#ef6c00", "info": "#1565c0"}
HOT = "#c62828"
BASE = "#4c72b0"


class HtmlError(SkewscopeError):
    """The page cannot be written (output path, missing plotting library)."""


def check_output(path: str, flag: str = "--html") -> None:
    """Before any work: the page's directory exists, the path is not a directory, and the
    plotting library is there."""
    d = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(d):
        raise HtmlError(f"{flag} {path}: directory {d} does not exist", EXIT_USAGE)
    if os.path.isdir(path):
        raise HtmlError(f"{flag} {path} is a directory", EXIT_USAGE)
    _mpl()


def _mpl():
    """matplotlib's Figure class and rc_context (a missing library: one line, exit 3)."""
    try:
        import matplotlib  # heavy (plotting): only for --html
        from matplotlib.figure import Figure  # heavy (plotting): only for --html
    except ImportError:
        raise HtmlError("--html needs matplotlib: pip install 'skewscope[html]' (or make setup)",
                        EXIT_NOT_RUN) from None
    return Figure, matplotlib.rc_context


_RC = {"svg.fonttype": "none", "svg.hashsalt": "skewscope", "font.size": 9, "axes.titlesize": 10,
       "axes.spines.top": False, "axes.spines.right": False, "figure.dpi": 96}


def _svg(fig) -> str:
    """A figure as inline SVG (no XML prolog, no DOCTYPE, no metadata: nothing that names a URL
    other than the SVG namespace)."""
    buf = io.StringIO()
    # margins are set per figure in inches (_margins): bbox_inches="tight" would draw twice
    fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None, "Format": None, "Type": None})
    s = buf.getvalue()
    s = s[s.index("<svg"):]
    s = re.sub(r"<metadata>.*?</metadata>", "", s, flags=re.S)
    return f'<div class="fig">{s}</div>'


def _margins(fig, left, bottom, right=0.2, top=0.35, **kw):
    """subplots_adjust with margins in inches."""
    w, h = fig.get_size_inches()
    fig.subplots_adjust(left=left / w, right=1 - right / w, bottom=bottom / h, top=1 - top / h, **kw)


def _esc(x) -> str:
    return html.escape(str(x), quote=True)


def _num(v) -> str:
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if v == 0 or not math.isfinite(v):
            return str(v)
        a = abs(v)
        return f"{v:.4g}" if 1e-3 <= a < 1e6 else f"{v:.3e}"
    return str(v)


def _si(v: float, unit: str = "") -> str:
    for k, p in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(v) >= p:
            return f"{v / p:.3g} {k}{unit}"
    return f"{v:.3g} {unit}".rstrip()


def _dur(s) -> str:
    if s is None:
        return "?"
    if s >= 1:
        return f"{s:.3g} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} us"


# ---- data from the Snapshot (through the analysis' functions) ------------------------------------
def _ctx(snap):
    from skewscope.analysis.context import context  # heavy (numba)
    return context(snap)


def _matrices(snap):
    """(ips, bytes matrix, rate matrix in bit/s over active time, NaN where no data)."""
    from skewscope.analysis.matrix import link_rates, node_matrix  # heavy (numba)
    ips, m = node_matrix(snap)
    n = len(ips)
    rate = np.full((n, n), np.nan)
    lr = link_rates(snap)
    if len(lr):
        rate[lr["src"], lr["dst"]] = lr["rate_bps"]
    return list(ips), m, rate


def _aggregate(ips, m, rate, top=MATRIX_TOP):
    """The busiest `top` nodes (bytes in + out) one by one, the rest as one "other (k)" node
    whose cells are the mean bytes per node pair carrying data (comparable with the other
    cells) and the bytes-weighted mean of its links' rates."""
    n = len(ips)
    if n <= top + 1:
        return ips, m, rate, np.arange(n)
    load = m.sum(0) + m.sum(1)
    keep = np.sort(np.argsort(-load, kind="stable")[:top])
    rest = np.setdiff1d(np.arange(n), keep)
    grp = np.full(n, top)
    grp[keep] = np.arange(top)
    k = top + 1
    mb = np.zeros((k, k))
    np.add.at(mb, (grp[:, None], grp[None, :]), m)
    # an "other" cell is the mean over its node pairs that carry data (a sum over 40 x 40
    # pairs would own the colour scale and wash every real cell out)
    cnt = np.zeros((k, k))
    np.add.at(cnt, (grp[:, None], grp[None, :]), (m > 0).astype(np.float64))
    agg = np.zeros((k, k), dtype=bool)
    agg[top, :] = agg[:, top] = True
    mb = np.where(agg & (cnt > 0), mb / np.maximum(cnt, 1), mb)
    w = np.where(np.isfinite(rate), m, 0.0)
    rw = np.zeros((k, k))
    np.add.at(rw, (grp[:, None], grp[None, :]), np.where(np.isfinite(rate), rate, 0.0) * w)
    ws = np.zeros((k, k))
    np.add.at(ws, (grp[:, None], grp[None, :]), w)
    with np.errstate(invalid="ignore", divide="ignore"):
        rb = np.where(ws > 0, rw / ws, np.nan)
    names = [ips[i] for i in keep] + [f"other ({len(rest)})"]      # cells: mean per node pair
    return names, mb, rb, keep


def _link_series(snap, pairs, t0, t1, bins=TIME_BINS):
    """Per (src node, dst node) pair: data bit/s per time bin (message bytes by start time)."""
    ctx = _ctx(snap)
    edges = np.linspace(t0, t1, bins + 1)
    width = max(1.0, (t1 - t0) / bins) / 1e9
    out = np.zeros((len(pairs), bins))
    if not len(pairs) or not len(ctx.events):
        return edges, out
    n = max(1, ctx.nodes.n)
    pid = np.full(n * n, -1, dtype=np.int64)
    for k, (s, d) in enumerate(pairs):
        pid[s * n + d] = k
    f = ctx.ev_flow
    ok = ctx.ev_data.copy()
    ff = f[ok]
    p = pid[ctx.nodes.src[ff] * n + ctx.nodes.dst[ff]]
    sel = p >= 0
    st = ctx.ev_start[ok][sel].astype(np.float64)
    b = ctx.events["bytes"][ok][sel].astype(np.float64)
    p = p[sel]
    bi = np.clip(((st - t0) / max(1.0, t1 - t0) * bins).astype(np.int64), 0, bins - 1)
    np.add.at(out, (p, bi), b * 8.0 * ctx.scale / width)
    return edges, out


def _activity(snap, t0, t1, bins=TIME_BINS):
    """All data messages: bit/s per time bin."""
    ctx = _ctx(snap)
    out = np.zeros(bins)
    ok = ctx.ev_data
    if not ok.any():
        return out
    st = ctx.ev_start[ok].astype(np.float64)
    b = ctx.events["bytes"][ok].astype(np.float64)
    bi = np.clip(((st - t0) / max(1.0, t1 - t0) * bins).astype(np.int64), 0, bins - 1)
    np.add.at(out, bi, b * 8.0 * ctx.scale / (max(1.0, (t1 - t0) / bins) / 1e9))
    return out


def _group_flows(ctx, coll: dict, links_only: bool):
    """(data-flow mask, member node indices) of a group: its links' flows (rings) or the data
    flows with both ends among its members."""
    pos = {ip: i for i, ip in enumerate(ctx.nodes.ips)}
    members = [pos[m] for m in coll.get("members") or [] if m in pos]
    n = max(1, ctx.nodes.n)
    want = np.zeros(n * n, dtype=bool)
    if links_only:
        for lk in (coll.get("metrics") or {}).get("links") or []:
            a, b = pos.get(lk["src"], -1), pos.get(lk["dst"], -1)
            if a >= 0 and b >= 0:
                want[a * n + b] = True
    else:
        mi = np.asarray(members, dtype=np.int64)
        want.reshape(n, n)[np.ix_(mi, mi)] = True
    return ctx.data & want[ctx.nodes.src * n + ctx.nodes.dst], members


def _timeline(snap, coll: dict, tm: dict):
    """{level name: instance start times (ns)} of the timing group: iterations/tokens and
    collectives (analysis.timing.group_timing's bursts at both levels) and ring steps
    (analysis.steps.ring_steps' step starts)."""
    from skewscope.analysis.steps import ring_steps  # heavy (numba)
    from skewscope.analysis.timing import group_timing  # heavy (numba)
    ctx = _ctx(snap)
    ring = coll.get("kind") == "ring_allreduce"
    fm, members = _group_flows(ctx, coll, links_only=ring)
    if not fm.any():
        return {}
    top = "token" if tm.get("workload") == "decode" and tm.get("token_interval_s") else "iteration"
    _t, it = group_timing(ctx, fm, members=members)
    _t, co = group_timing(ctx, fm, members=members, level="collective")
    out = {top: it.get("bursts_start"), "collective": co.get("bursts_start")}
    if ring and len(members) >= 3:
        st = ring_steps(ctx, np.nonzero(fm)[0], members, it.get("bursts_start"))
        if st is not None:
            out["step"] = st["col_start_ns"]
            cs = st["col_start_ns"][st["collective_start"]]
            if len(cs) > len(st["iterations"]):   # the hierarchy's rule (analysis.steps.group_steps)
                out["collective"] = cs
    return {k: np.asarray(v, dtype=np.float64) for k, v in out.items() if v is not None and len(v)}


def _step_lags(snap, coll: dict):
    """(member ips, lag matrix members x steps in seconds) of a ring group, from the analysis'
    own step matrix (analysis.steps.ring_steps over its ring links and its iterations /
    tokens), or None."""
    from skewscope.analysis.steps import ring_steps  # heavy (numba)
    from skewscope.analysis.timing import group_timing  # heavy (numba)
    ctx = _ctx(snap)
    if coll.get("kind") != "ring_allreduce" or len(coll.get("members") or []) < 3:
        return None
    fm, members = _group_flows(ctx, coll, links_only=True)
    if len(members) < 3 or not fm.any():
        return None
    _tm, tinfo = group_timing(ctx, fm, members=members)
    st = ring_steps(ctx, np.nonzero(fm)[0], members, tinfo.get("bursts_start"))
    if st is None:
        return None
    return [ctx.nodes.ips[m] for m in members], st["lag_ns"] / 1e9


def _group_hist(snap, members_idx):
    """Summed log2 message-size histogram of the flows with both ends in the group."""
    ctx = _ctx(snap)
    n = max(1, ctx.nodes.n)
    inm = np.zeros(n, dtype=bool)
    inm[np.asarray(members_idx, dtype=np.int64)] = True
    sel = inm[ctx.nodes.src] & inm[ctx.nodes.dst]
    return snap.flows["msg_hist"][sel].sum(axis=0).astype(np.int64)


# ---- figures ----------------------------------------------------------------------------------
def _size_label(b: int) -> str:
    for u, p in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= p:
            return f"{b // p} {u}" if b % p == 0 else f"{b / p:.1f} {u}"
    return f"{b} B"


def fig_matrix(Figure, names, m, rate, hot: str | None):
    k = len(names)
    side = min(6.2, 2.2 + 0.16 * k)
    fig = Figure(figsize=(2 * side + 4.2, side + 1.6))
    axs = fig.subplots(1, 2)
    _margins(fig, 1.15, 1.25, right=0.95, top=0.3, wspace=2.2 / side)
    for ax, val, title, unit in ((axs[0], m, "bytes (data)", "B"), (axs[1], rate, "rate over active time", "bit/s")):
        v = np.where(np.isfinite(val) & (val > 0), val, np.nan)
        # from 0: equal rates look equal (a scale from the minimum would paint 1% as contrast)
        im = ax.imshow(v, cmap="magma_r", interpolation="nearest", aspect="equal", vmin=0)
        cb = fig.colorbar(im, ax=ax, fraction=0.046, pad=0.03)
        cb.ax.yaxis.set_major_formatter(_si_formatter(unit))
        ax.set_title(title)
        ax.set_xlabel("destination")
        ax.set_ylabel("source")
        step = max(1, k // 34 + 1) if k > 34 else 1
        ticks = list(range(0, k, step))
        ax.set_xticks(ticks, [names[i] for i in ticks], rotation=90, fontsize=7 if k > 16 else 8)
        ax.set_yticks(ticks, [names[i] for i in ticks], fontsize=7 if k > 16 else 8)
        for lab in ax.get_xticklabels():
            if hot and lab.get_text() == hot:
                lab.set_color(HOT)
                lab.set_fontweight("bold")
        if hot in names:
            j = names.index(hot)
            ax.add_patch(_rect(j - 0.5, -0.5, 1, k, fig))
        if k <= MATRIX_LABELS:
            mx = np.nanmax(v) if np.isfinite(v).any() else 0
            for i in range(k):
                for j in range(k):
                    if np.isfinite(v[i, j]):
                        ax.text(j, i, _si(v[i, j]), ha="center", va="center", fontsize=6.5,
                                color="white" if v[i, j] > 0.55 * mx else "black")
    return fig


def _rect(x, y, w, h, fig):
    from matplotlib.patches import Rectangle  # heavy (plotting)
    return Rectangle((x, y), w, h, fill=False, edgecolor=HOT, linewidth=1.6)


def _si_formatter(unit):
    from matplotlib.ticker import FuncFormatter  # heavy (plotting)
    return FuncFormatter(lambda v, _p: _si(v, unit))


def onset_spans(findings, t0: float, t1: float, group=None) -> list[tuple]:
    """[(since ms, until ms, colour, label)] since the capture start (t0 ns) for the findings
    (of one group, when given) whose condition began or ended inside the capture: what the
    time charts shade. A condition there from the start to the end is not drawn (it would
    shade the whole chart)."""
    out = []
    span = max(1.0, t1 - t0)
    for f in findings or []:
        if group is not None and f.get("group") != group:
            continue
        s, u = f.get("since"), f.get("until")
        if s is None:
            continue
        a = (s * 1e9 - t0)
        if a <= START_SHARE * span and u is None:
            continue
        b = (u * 1e9 - t0) if u is not None else span
        out.append((max(0.0, a) / 1e6, max(a, b) / 1e6, SEV_COLOR.get(f.get("severity"), "#555"), f.get("kind")))
    return out[:6]


def _shade(ax, spans):
    """Shade each finding's [since, until) and mark its onset (onset_spans)."""
    for a, b, color, label in spans:
        ax.axvspan(a, b, color=color, alpha=0.08, linewidth=0)
        ax.axvline(a, color=color, linestyle="--", linewidth=0.9)
        ax.annotate(f"{label} since", (a, 1.0), xycoords=("data", "axes fraction"), xytext=(2, -2),
                    textcoords="offset points", fontsize=6.5, color=color, va="top")


def fig_link_rates(Figure, title, labels, edges, series, t0, spans=()):
    fig = Figure(figsize=(10, 2.8))
    ax = fig.subplots()
    x = (edges[:-1] - t0) / 1e6
    _shade(ax, spans)
    for lab, y in zip(labels, series):
        ax.step(x, y, where="post", linewidth=1.0, label=lab)
    ax.set_title(title)
    ax.set_xlabel("time since capture start (ms)")
    ax.set_ylabel("data rate")
    ax.yaxis.set_major_formatter(_si_formatter("bit/s"))
    _margins(fig, 0.95, 0.5)
    if labels:
        ax.legend(fontsize=7, ncol=2, loc="upper right", frameon=False)
    return fig


def fig_timing(Figure, tm, activity, t0, t1, timeline, spans=()):
    fig = Figure(figsize=(10, 4.6))
    a1, a3, a2 = fig.subplots(3, 1, gridspec_kw={"height_ratios": [1.1, 0.9, 1]})
    x = np.linspace(0, (t1 - t0) / 1e6, len(activity) + 1)[:-1]
    _shade(a1, spans)
    a1.fill_between(x, activity, step="post", color=BASE, alpha=0.8, linewidth=0)
    a1.set_ylabel("all data")
    a1.yaxis.set_major_formatter(_si_formatter("bit/s"))
    a1.set_title("activity over the capture")
    a1.set_xlim(0, (t1 - t0) / 1e6)
    # the timeline: one row per level, a tick at each instance's start
    colors = {"step": "#8172b2", "collective": "#55a868", "iteration": "#c44e52", "token": "#c44e52"}
    rows = [k for k in ("step", "collective", "iteration", "token") if k in timeline]
    if rows:
        a3.eventplot([(timeline[k] - t0) / 1e6 for k in rows], lineoffsets=range(len(rows)), linelengths=0.7,
                     linewidths=[0.4 if k == "step" else 1.0 for k in rows], colors=[colors[k] for k in rows])
        a3.set_yticks(range(len(rows)), [f"{k} ({len(timeline[k])})" for k in rows])
        a3.set_ylim(-0.6, len(rows) - 0.4)
    else:
        a3.set_yticks([])
        a3.text(0.01, 0.4, "no instances found", transform=a3.transAxes, fontsize=8)
    a3.set_xlim(0, (t1 - t0) / 1e6)
    a3.set_title("timeline: start of each step / collective / iteration or token (timing group)")
    a3.set_xlabel("time since capture start (ms)")
    h = (tm or {}).get("hierarchy") or {}
    top = "token" if (tm or {}).get("workload") == "decode" and (tm or {}).get("token_interval_s") else "iteration"
    levels = [(n, h.get(k) or {}) for n, k in (("step", "step"), ("collective", "collective"), (top, "iteration"))]
    levels = [(n, lv) for n, lv in levels if lv.get("period_s")]
    if levels:
        ys = np.arange(len(levels))
        per = [lv["period_s"] for _, lv in levels]
        jit = [lv.get("jitter_s") or 0.0 for _, lv in levels]
        a2.barh(ys, per, xerr=jit, color=[colors[n] for n, _ in levels], height=0.55)
        a2.set_xscale("log")
        a2.set_yticks(ys, [n for n, _ in levels])
        for y, (n, lv) in zip(ys, levels):
            j = f" ±{_dur(lv['jitter_s'])}" if lv.get("jitter_s") else ""
            a2.text(lv["period_s"] * 1.15, y, f"{_dur(lv['period_s'])}{j}  x{lv.get('count', 0)}", va="center",
                    fontsize=8)
        a2.set_xlabel("period (log scale, s)")
        a2.set_title("timing hierarchy: period (±jitter) and count per level")
        a2.set_xlim(min(per) / 3, max(per) * 30)
    else:
        a2.axis("off")
        a2.text(0.0, 0.5, "no periodic structure found (timing: none)", fontsize=9)
    _margins(fig, 1.25, 0.45, right=1.6, hspace=1.1)
    return fig


def fig_hists(Figure, groups):
    """groups: [(title, hist[34])]."""
    k = len(groups)
    fig = Figure(figsize=(10, 2.4 * math.ceil(k / 2) + 0.3))
    axs = np.atleast_1d(fig.subplots(math.ceil(k / 2), 2 if k > 1 else 1)).ravel()
    for ax, (title, hist) in zip(axs, groups):
        nz = np.nonzero(hist)[0]
        if not len(nz):
            ax.axis("off")
            continue
        lo, hi = int(nz.min()), int(nz.max())
        xs = np.arange(lo, hi + 1)
        ax.bar(xs, hist[lo:hi + 1], color=BASE)
        ax.set_yscale("log")
        ax.set_xticks(xs, [_size_label(L.slot_lower_bound(int(i))) + "+" for i in xs], rotation=60, fontsize=7)
        ax.set_title(title, fontsize=9)
        ax.set_ylabel("messages")
    for ax in axs[k:]:
        ax.axis("off")
    _margins(fig, 0.8, 0.75, top=0.3, hspace=1.25, wspace=0.25)
    return fig


def _bars(ax, labels, values, hot=(), ylabel="", fmt=None):
    cols = [HOT if lab in hot else BASE for lab in labels]
    ax.bar(range(len(values)), values, color=cols)
    if len(labels) > 24:          # too many to read: label the highlighted ones only
        idx = [i for i, lab in enumerate(labels) if lab in hot]
        ax.set_xticks(idx, [labels[i] for i in idx], fontsize=7, color=HOT)
        ax.set_xlabel(f"{len(labels)} members")
    else:
        ax.set_xticks(range(len(labels)), labels, rotation=60 if len(labels) > 4 else 0, fontsize=7)
        for t in ax.get_xticklabels():
            if t.get_text() in hot:
                t.set_color(HOT)
    ax.set_ylabel(ylabel)
    if fmt:
        ax.yaxis.set_major_formatter(fmt)


def _figure(kind) -> str:
    """The kind's capture-wide picture (detector registry, Kind.figure), "" for none or an
    unknown kind."""
    from skewscope.analysis.detectors import registry  # heavy (numba)
    try:
        return registry.kind(str(kind)).figure
    except KeyError:
        return ""


def fig_finding(Figure, f, doc, snap) -> object | None:
    """The evidence of one finding, drawn; None when it has nothing to draw."""
    ev = f.get("evidence") or {}
    ents = f.get("entities") or {}
    ips = ents.get("ips") or []
    colls = doc.get("collectives") or []
    g = f.get("group")
    gm = (colls[g].get("metrics") or {}) if isinstance(g, int) and 0 <= g < len(colls) else {}
    members = colls[g]["members"] if gm else []
    panels = []
    # 1. hot destination / destination skew: bytes per destination, share per phase / window
    db = ev.get("dest_bytes") or (gm.get("dest_bytes") if "hot_destination" in ev else None)
    if db and members and len(db) == len(members):
        hot = ev.get("hot_destinations") or ([ev["hot_destination"]] if ev.get("hot_destination") else ips[:1])
        panels.append(("bytes received per destination", lambda ax: (
            _bars(ax, members, db, hot, "bytes", _si_formatter("B")),
            ax.axhline(sum(db) / len(members), color="gray", ls="--", lw=0.8, label="fair share"),
            ax.legend(fontsize=7, frameon=False))))
        phases = gm.get("phases") or []
        if phases:
            def draw_phases(ax, phases=phases, hot=hot, ev=ev, members=members):
                sh = [(p.get("dest_skew") or {}).get("max_share") or 0 for p in phases]
                hd = [p.get("hot_destination") for p in phases]
                ax.bar(range(len(sh)), sh, color=[HOT if h in hot else BASE for h in hd])
                ax.axhline(ev.get("fair_share") or 1 / max(1, len(members)), color="gray", ls="--", lw=0.8,
                           label="fair share")
                ax.set_xticks(range(len(sh)), [f"{p.get('phase')}\n{h or ''}" for p, h in zip(phases, hd)],
                              fontsize=6.5)
                ax.set_ylabel("hottest destination's share")
                ax.legend(fontsize=7, frameon=False)
            panels.append(("hot destination's share per phase", draw_phases))
        win = ev.get("windows") or []
        if len(win) > 1:
            def draw_win(ax, win=win, hot=hot):
                ax.bar(range(len(win)), [w.get("share") or 0 for w in win],
                       color=[HOT if w.get("hot") in hot else BASE for w in win])
                ax.set_xticks(range(len(win)), [f"it {w.get('first_iteration')}-{w.get('end_iteration')}\n"
                                                f"{w.get('hot')}" for w in win], fontsize=6.5)
                ax.set_ylabel("share")
            panels.append(("share per window (drift)", draw_win))
    # 2. stragglers / slow shards: start lag per member, gating member per iteration
    if ("lag_per_step_s" in ev or "start_lag_s" in ev) and gm.get("start_lag_s"):
        lag = gm["start_lag_s"]
        dec = (gm.get("decode") or {}).get("member_start_lag_s") or {}
        src = lag if any(v for v in lag.values() if v) else dec
        labs = list(src)
        vals = [1e6 * (src[k] or 0.0) for k in labs]

        def draw_lag(ax, labs=labs, vals=vals, ev=ev, hot=ips[:1]):
            _bars(ax, labs, vals, hot, "start lag (us)")
            if ev.get("lag_per_step_s"):
                ax.axhline(1e6 * ev["lag_per_step_s"], color=HOT, ls=":", lw=1,
                           label=f"{hot[0] if hot else ''} lag per step {_dur(ev['lag_per_step_s'])}")
                ax.legend(fontsize=7, frameon=False)
        panels.append(("start lag per member", draw_lag))
        sl = _step_lags(snap, colls[g]) if g is not None and gm else None
        if sl is not None and ips and ips[0] in sl[0]:
            def draw_steps(ax, sl=sl, who=ips[0]):
                names, lag = sl
                k = names.index(who)
                c = max(1, lag.shape[1] // 1000)        # long runs: the max of each c steps
                if c > 1:
                    w = lag.shape[1] // c * c
                    lag = np.concatenate([lag[:, :w].reshape(len(names), -1, c).max(2),
                                          lag[:, :w].reshape(len(names), -1, c).min(2)])
                    x = np.arange(lag.shape[1]) * c
                    mine, others = lag[k], np.delete(lag, [k, k + len(names)], axis=0)
                else:
                    x = np.arange(lag.shape[1])
                    mine, others = lag[k], np.delete(lag, k, axis=0)
                if len(others):
                    ax.fill_between(x, 1e6 * others.min(0), 1e6 * others.max(0), color="#bbbbbb", step="mid",
                                    linewidth=0, label="other members (min-max)")
                ax.plot(x, 1e6 * mine, color=HOT, linewidth=0.8, label=who, drawstyle="steps-mid")
                ax.set_xlabel("step")
                ax.set_ylabel("lag (us)")
                ax.legend(fontsize=7, frameon=False)
            panels.append(("lag per step (own delay vs the step's median)", draw_steps))
        gates = (gm.get("gates") or {}).get("per_iteration") or []
        if gates:
            def draw_gates(ax, gates=gates, members=members, hot=ips[:1]):
                pos = {m: i for i, m in enumerate(members)}
                xs = [i for i, x in enumerate(gates) if x in pos]
                ax.scatter(xs, [pos[gates[i]] for i in xs], c=[HOT if gates[i] in hot else BASE for i in xs],
                           marker="s", s=18)
                ax.set_yticks(range(len(members)), members, fontsize=7)
                ax.set_xlabel("iteration / token")
                ax.set_ylim(-0.5, len(members) - 0.5)
                ax.set_xlim(-0.5, len(gates) - 0.5)
            panels.append(("member that gated each iteration", draw_gates))
    # 3. any per-entity mapping in the evidence (stage compute, idle fraction per link, ...)
    for key, val in ev.items():
        if len(panels) >= 3:
            break
        if isinstance(val, dict) and len(val) >= 2 and all(isinstance(v, (int, float)) or v is None
                                                           for v in val.values()):
            labs = list(val)
            panels.append((key.replace("_", " "), lambda ax, labs=labs, val=val: _bars(
                ax, labs, [val[k] or 0 for k in labs], ips[:1])))
    pp = (doc.get("pfc") or {}).get("per_priority") or []
    if not panels and _figure(f.get("kind")) == "pfc_per_priority" and any(x["pause"] for x in pp):
        panels.append(("PFC pause frames per priority (capture)", lambda ax: _bars(
            ax, [str(x["priority"]) for x in pp], [x["pause"] for x in pp],
            {str(x["priority"]) for x in pp if x["pause"] == max(y["pause"] for y in pp)}, "pause frames")))
    # 4. else: the per-link counters of its flows, or the volumes of its nodes
    if not panels:
        links = (doc.get("metrics") or {}).get("links") or []
        fl = {(a, b) for a, b, *_ in (ents.get("flows") or [])}
        rows = [lk for lk in links if (lk["src"], lk["dst"]) in fl] if fl else []
        cols = [c for c in ("ce", "cnp", "psn_gaps", "retransmissions", "naks") if any(r.get(c) for r in rows)]
        rows = sorted(rows, key=lambda r: -sum(r.get(c) or 0 for c in cols))[:PANEL_BARS]
        if rows and cols:
            def draw_links(ax, rows=rows, cols=cols):
                w = 0.8 / len(cols)
                for k, c in enumerate(cols):
                    ax.bar(np.arange(len(rows)) + k * w, [r.get(c) or 0 for r in rows], width=w, label=c)
                ax.set_xticks(np.arange(len(rows)) + 0.4 - w / 2, [f"{r['src']}\n->{r['dst']}" for r in rows],
                              fontsize=6.5)
                ax.legend(fontsize=7, frameon=False)
                ax.set_ylabel("packets")
            panels.append(("counters of the links involved", draw_links))
        else:
            nin = (doc.get("metrics") or {}).get("node_in_bytes") or {}
            labs = [ip for ip in ips if ip in nin][:PANEL_BARS]
            if len(labs) >= 1:
                panels.append(("bytes received by the nodes involved", lambda ax, labs=labs: _bars(
                    ax, labs, [nin[k] for k in labs], ips[:1], "bytes", _si_formatter("B"))))
    if not panels:
        return None
    fig = Figure(figsize=(3.6 * len(panels) + 0.6, 3.3))
    axs = np.atleast_1d(fig.subplots(1, len(panels)))
    for ax, (title, draw) in zip(axs, panels):
        draw(ax)
        ax.set_title(title, fontsize=9)
    _margins(fig, 0.85, 1.0, top=0.3, wspace=0.55)
    return fig


# ---- the page -----------------------------------------------------------------------------------
CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#222;background:#fafafa}
main{max-width:1280px;margin:0 auto;padding:12px 20px 40px}
h1{font-size:20px;margin:8px 0 2px}h2{font-size:17px;margin:26px 0 8px;border-bottom:1px solid #ddd}
h3{font-size:14px;margin:14px 0 4px}
nav a{margin-right:12px}.sub{color:#555}
.fig svg{max-width:100%;height:auto}.fig{overflow-x:auto}
table{border-collapse:collapse;font-size:12.5px;margin:6px 0}
td,th{border:1px solid #ddd;padding:2px 7px;text-align:left;vertical-align:top}
th{background:#f0f0f0}td.n{text-align:right;font-variant-numeric:tabular-nums}
.card{background:#fff;border:1px solid #ddd;border-left:5px solid #999;padding:6px 12px;margin:10px 0}
.sev{font-weight:bold;text-transform:uppercase;font-size:12px}
.critical{border-left-color:#c62828}.warning{border-left-color:#ef6c00}.info{border-left-color:#1565c0}
.ok{color:#2e7d32;font-weight:bold}
code{font-size:12px}
@media print{body{background:#fff;font-size:11px}nav{display:none}main{max-width:none;padding:0}
 .card,.fig,table{page-break-inside:avoid;break-inside:avoid}h2{page-break-after:avoid;break-after:avoid}}
"""


def _table(rows, head=None) -> str:
    out = ["<table>"]
    if head:
        out.append("<tr>" + "".join(f"<th>{_esc(h)}</th>" for h in head) + "</tr>")
    for r in rows:
        out.append("<tr>" + "".join(
            f'<td class="n">{_esc(_num(c))}</td>' if isinstance(c, (int, float)) and not isinstance(c, bool)
            else f"<td>{_esc(c)}</td>" for c in r) + "</tr>")
    out.append("</table>")
    return "".join(out)


def _flat(d: dict, prefix="") -> list:
    rows = []
    for k, v in d.items():
        if isinstance(v, dict):
            rows += _flat(v, f"{prefix}{k}.")
        elif isinstance(v, list):
            if v and all(not isinstance(x, (dict, list)) for x in v) and len(v) <= 16:
                rows.append((prefix + k, ", ".join(_num(x) for x in v)))
            else:
                rows.append((prefix + k, f"[{len(v)} items]"))
        else:
            rows.append((prefix + k, v))
    return rows


def document(snap: Snapshot, analysis: dict | None) -> dict:
    """The report's JSON document without the per-flow list (the page does not print flows;
    building 65,536 flow dicts would be most of its time)."""
    meta = dict(snap.meta)
    doc = {"source": meta.get("file") or meta.get("interface") or meta.get("source", "?"), "meta": meta,
           "totals": R.totals(snap), "pfc": R.pfc(snap)}
    if analysis:
        doc.update(analysis)
    return doc


def render(snap: Snapshot, analysis: dict | None) -> str:
    """The whole page as a string."""
    Figure, rc_context = _mpl()
    doc = document(snap, analysis)
    with rc_context(_RC):
        return _render(Figure, snap, doc)


def _hot_destination(doc, ips, col):
    """(ip or None, why): the analysis' hot destination (a finding's, else the capture's
    destination skew when its max/mean reaches hot_destination's warning threshold)."""
    for f in doc.get("findings") or []:
        ev = f.get("evidence") or {}
        h = (ev.get("hot_destinations") or [None])[0] or ev.get("hot_destination")
        if h in ips:
            return h, f"finding {f['kind']}"
    sk = (doc.get("metrics") or {}).get("dest_volume_skew") or {}
    warn = ((doc.get("thresholds") or {}).get("hot_destination") or {}).get("warning", 1.5)
    mom = sk.get("max_over_mean")
    if mom is not None and mom >= warn and col.max() > 0:
        return ips[int(np.argmax(col))], f"max/mean {mom:.2f} of the bytes received"
    return None, f"bytes received max/mean {mom:.2f}" if mom is not None else "no data"


def _render(Figure, snap, doc) -> str:
    m = doc["meta"]
    t = doc["totals"]
    fs = doc.get("findings")
    colls = doc.get("collectives") or []
    mets = doc.get("metrics") or {}
    parts = []
    clock = Clock.of(m)
    title = f"skewscope report: {os.path.basename(str(doc['source']))}"
    parts.append(f"<h1>{_esc(title)}</h1>")
    parts.append(f'<p class="sub">source {_esc(doc["source"])} ({_esc(m.get("source", "?"))}), '
                 f'{_esc(_dur(float(m.get("duration_s") or 0)))}, {t["packets_seen"]:,} frames, '
                 f'{t["roce_packets"]:,} RoCE, {len(snap.flows):,} flows, {t["message_records"]:,} message records'
                 + (f', <b>sampled 1 in {int(m["sample_n"])}</b>' if int(m.get("sample_n", 1) or 1) > 1 else "")
                 + (f', <b>{t["flows_evicted"]:,} flows evicted</b>' if t["flows_evicted"] else "") + "</p>")
    parts.append('<nav><a href="#findings">findings</a><a href="#matrix">matrix</a><a href="#rates">link rates</a>'
                 '<a href="#timing">timing</a><a href="#sizes">message sizes</a><a href="#counters">counters</a></nav>')
    # collectives summary
    if colls:
        rows = []
        for i, c in enumerate(colls):
            cm = c.get("metrics") or {}
            mem = c["members"]
            rows.append((i, c["kind"], c.get("pattern") or "", f"{c['confidence']:.2f}", len(mem),
                         ", ".join(mem[:6]) + (f" ... ({len(mem)})" if len(mem) > 6 else ""),
                         R.fmt_bytes(cm.get("bytes") or 0), cm.get("protocol_hint") or "",
                         cm.get("workload") or ""))
        parts.append("<h2>Collectives</h2>" + _table(rows, ("group", "kind", "pattern", "confidence", "nodes",
                                                              "members", "bytes", "protocol hint", "workload")))
    # findings
    parts.append('<h2 id="findings">Findings</h2>')
    if fs is None:
        parts.append("<p>no analysis</p>")
    elif not fs:
        parts.append('<p class="ok">no findings: traffic looks healthy</p>')
    else:
        per_kind, drawn_f = {}, 0
        if len(fs) > FINDINGS_DRAWN:
            parts.append(f'<p class="sub">{len(fs)} findings; the evidence of the first {FINDINGS_DRAWN} (at most '
                         f"{DRAWN_PER_KIND} of a kind) is drawn, every finding's numbers are listed.</p>")
        for f in fs:
            sev = f.get("severity", "info")
            ents = f.get("entities") or {}
            imp = f.get("impact") or {}
            ev = f.get("evidence") or {}
            card = [f'<div class="card {_esc(sev)}"><span class="sev" style="color:{SEV_COLOR.get(sev, "#555")}">'
                    f'{_esc(sev)}</span> <b>{_esc(f["kind"])}</b>'
                    + (f' <span class="sub">group {f["group"]}</span>' if f.get("group") is not None else "")
                    + f"<p>{_esc(f.get('message', ''))}</p>"]
            if ents.get("ips"):
                card.append(f"<p>nodes: <b>{_esc(', '.join(ents['ips'][:12]))}</b>"
                            + (f" ... ({len(ents['ips'])})" if len(ents["ips"]) > 12 else "")
                            + (f"; QPs: {_esc(', '.join(str(q) for q in ents['qps'][:12]))}" if ents.get("qps")
                               else "") + "</p>")
            when = clock.text(f.get("since"), f.get("until"))
            if when:
                card.append(f"<p>when: {_esc(when)}</p>")
            if imp.get("seconds") is not None:
                card.append(f"<p>impact: {_esc(_dur(imp['seconds']))} lost"
                            + (f" ({100 * imp['share']:.1f}% of each iteration/token)"
                               if imp.get("share") is not None else "") + "</p>")
            per_kind[f["kind"]] = per_kind.get(f["kind"], 0) + 1
            if drawn_f < FINDINGS_DRAWN and per_kind[f["kind"]] <= DRAWN_PER_KIND:
                drawn_f += 1
                try:
                    fig = fig_finding(Figure, f, doc, snap)
                    if fig is not None:
                        card.append(_svg(fig))
                except Exception as e:   # an evidence shape we do not know: the page still stands
                    card.append(f'<p class="sub">evidence not drawn ({_esc(type(e).__name__)}: {_esc(e)})</p>')
            scal = [(kk, vv) for kk, vv in _flat(ev)]
            if scal:
                card.append("<details><summary>evidence</summary>" + _table(scal[:60], ("evidence", "value"))
                            + "</details>")
            card.append("</div>")
            parts.append("".join(card))
    # matrix
    parts.append('<h2 id="matrix">Traffic matrix (node x node)</h2>')
    ips, mb, rate = _matrices(snap)
    if len(ips) and mb.sum() > 0:
        names, am, ar, _keep = _aggregate(ips, mb, rate)
        col = mb.sum(0)
        hot, why = _hot_destination(doc, ips, col)
        share = float(col[ips.index(hot)] / col.sum()) if hot in ips else float(col.max() / col.sum())
        note = (f", the {len(names) - 1} busiest drawn, the other {len(ips) - len(names) + 1} as one row and "
                "column (\"other\": mean bytes per node pair, bytes-weighted mean rate)" if len(names) < len(ips) else "")
        parts.append(f"<p>{len(ips)} nodes{note}. "
                     + (f'Hot destination: <b style="color:{HOT}">{_esc(hot)}</b> ({_esc(why)}; '
                        f"{100 * share:.1f}% of the data bytes, fair share "
                        f"{100 / max(1, int((col > 0).sum())):.1f}%), outlined in red. " if hot else
                        f"No hot destination ({_esc(why)}). ")
                     + "Rate = payload rate over each link's active time.</p>")
        parts.append(_svg(fig_matrix(Figure, names, am, ar, hot)))
    else:
        parts.append("<p>no data flows</p>")
    # per-link rate over time
    parts.append('<h2 id="rates">Per-link rate over time (largest groups)</h2>')
    t0 = int(m.get("first_ts") or 0)
    t1 = int(m.get("last_ts") or 0)
    if len(snap.events) and t1 <= t0:
        t0, t1 = int(snap.events["start_ts"].min()), int(snap.events["end_ts"].max())
    pos = {ip: i for i, ip in enumerate(ips)}
    order = sorted(range(len(colls)), key=lambda i: -((colls[i].get("metrics") or {}).get("bytes") or 0))[:GROUPS_TOP]
    drawn = 0
    for gi in order:
        c = colls[gi]
        mi = [pos[x] for x in c["members"] if x in pos]
        if len(mi) < 2 or t1 <= t0:
            continue
        sub = mb[np.ix_(mi, mi)]
        flat = np.argsort(-sub, axis=None, kind="stable")[:LINKS_TOP]
        pairs = [(mi[int(i) // len(mi)], mi[int(i) % len(mi)]) for i in flat if sub.flat[int(i)] > 0]
        if not pairs:
            continue
        edges, ser = _link_series(snap, pairs, t0, t1)
        labels = [f"{ips[s]}->{ips[d]}" for s, d in pairs]
        parts.append(_svg(fig_link_rates(Figure, f"group {gi}: {c['kind']} ({len(c['members'])} nodes), "
                                                 f"{len(pairs)} busiest links", labels, edges, ser, t0,
                                         onset_spans(fs, t0, t1, group=gi))))
        drawn += 1
    if not drawn:
        parts.append("<p>no group with message records</p>")
    # timing
    parts.append('<h2 id="timing">Timing hierarchy (steps / collectives / iterations or tokens)</h2>')
    tm = doc.get("timing")
    timed = [(i, c) for i, c in enumerate(colls) if c.get("timing")]
    if len(timed) > 1:              # two jobs on one fabric: every group's own timing
        for i, c in timed:
            gt = c["timing"]
            parts.append(f"<p>group {i} ({_esc(c['kind'])}, {_esc(gt.get('workload') or '')}): "
                         + _esc("; ".join(x.strip() for x in R.timing_lines(gt)) or f"period {_dur(gt.get('period_s'))}")
                         + "</p>")
    elif tm:
        parts.append("<p>" + _esc("; ".join(x.strip() for x in R.timing_lines(tm)) or
                                  f"period {_dur(tm.get('period_s'))}") + "</p>")
    if t1 > t0:
        tl = {}
        if tm and isinstance(tm.get("group"), int) and 0 <= tm["group"] < len(colls):
            tl = _timeline(snap, colls[tm["group"]], tm)
        parts.append(_svg(fig_timing(Figure, tm, _activity(snap, t0, t1), t0, t1, tl, onset_spans(fs, t0, t1))))
    # message sizes
    parts.append('<h2 id="sizes">Message sizes per group</h2>')
    hs = []
    for gi in order:
        c = colls[gi]
        mi = [pos[x] for x in c["members"] if x in pos]
        if mi:
            h = _group_hist(snap, mi)
            if h.any():
                hs.append((f"group {gi}: {c['kind']} ({(c.get('metrics') or {}).get('protocol_hint') or '?'})", h))
    if not hs and len(snap.flows):
        hs.append(("all flows", snap.flows["msg_hist"].sum(axis=0).astype(np.int64)))
    if hs and any(h.any() for _, h in hs):
        parts.append(_svg(fig_hists(Figure, hs)))
    else:
        parts.append("<p>no messages</p>")
    # counters
    parts.append('<h2 id="counters">Counters</h2>')
    rows = [(k, v) for k, v in _flat({kk: vv for kk, vv in t.items() if kk != "not_accounted"})]
    rows += [(f"not_accounted.{k}", v) for k, v in t["not_accounted"].items() if v]
    p = doc["pfc"]
    rows += [(f"pfc.priority{x['priority']}", f"pause {x['pause']}, resume {x['resume']}, quanta {x['quanta']}")
             for x in p["per_priority"] if x["pause"] or x["resume"]]
    rows += [(f"congestion.{k}", v) for k, v in (mets.get("congestion") or {}).items()]
    for k in ("duration_s", "sample_n", "max_flows", "flows_evicted", "events_lost", "clock"):
        if k in m:
            rows.append((f"meta.{k}", m[k]))
    parts.append(_table(rows, ("counter", "value")) + '<p class="sub">Definitions: README "Counters".</p>')
    body = "\n".join(parts)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{_esc(title)}</title><style>{CSS}</style></head>\n<body><main>\n{body}\n</main></body></html>\n")


def write(path: str, snap: Snapshot, analysis: dict | None) -> int:
    """Render and write the page atomically (it appears whole or not at all). Returns its size."""
    page = render(snap, analysis)
    try:
        atomic_write_text(path, page)
    except OSError as e:
        raise HtmlError(f"--html {path}: {e.strerror or e}", EXIT_NOT_RUN) from None
    return len(page.encode())
