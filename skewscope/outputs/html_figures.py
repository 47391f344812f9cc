"""The figures of the HTML page (outputs/html.py), drawn by matplotlib as inline SVG: the
node matrix, link rates and activity over time with the findings' onsets shaded, the timing
hierarchy, message-size histograms, each finding's evidence (fig_finding; a kind's
capture-wide picture from the detector registry, Kind.figure)."""
from __future__ import annotations

import io
import math
import re

import numpy as np

from skewscope.core import layout as L
from skewscope.outputs.html_data import _step_lags
from skewscope.core.when import START_SHARE

#: matrices up to this many nodes get their values written in the cells
MATRIX_LABELS = 12
#: bars (links, nodes) in one evidence panel
PANEL_BARS = 16

SEV_COLOR = {"critical": "#c62828", "warning": "#ef6c00", "info": "#1565c0"}
HOT = "#c62828"
BASE = "#4c72b0"

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
