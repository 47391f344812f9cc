"""The `top` screen drawn with rich: `render_rich(model)` (header, flow table, histogram,
collectives, timing, findings, footer) and `render_matrix` (the node x node matrix as a
colour heatmap). rich is imported inside the functions (heavy)."""
from __future__ import annotations

import time

from skewscope.outputs.topformat import fmt_bits, fmt_num, fmt_size
from skewscope.outputs.topmatrix import (
    CORNER,
    HEAT,
    HEAT_DARK,
    MATRIX_LINES,
    MATRIX_MIN_CELL,
    MatrixView,
    heat_index,
    heat_scale,
    is_hot,
    matrix_grid,
    matrix_layout,
    matrix_marks,
    matrix_summary,
    matrix_title,
)
from skewscope.outputs.topview import (
    HELP,
    SEV_SHORT,
    Model,
    cause_note,
    collective_lines,
    finding_rows,
    onset_note,
    timing_lines,
)


def render_matrix(mv: MatrixView, width: int, max_rows: int | None = None):
    """The matrix as a colour heatmap (rich Text): background = log scale of bit/s, a legend
    with the scale, the hot destination's column header highlighted, the hottest cell
    marked ◆ and each source's largest destination •."""
    from rich.text import Text  # heavy (rich): only when drawing

    t = Text(no_wrap=True, overflow="crop")
    if mv.error:
        t.append(mv.error, style="yellow")
        return t
    t.append(matrix_title(mv) + "\n", style="bold")
    if not mv.n or mv.hot_dst < 0:
        t.append("(no data traffic between nodes in this view)")
        return t
    lay = matrix_layout(mv, width - 1, max_rows)
    g, rs, cs = matrix_grid(mv, lay)
    marks = matrix_marks(mv, lay)
    scale = heat_scale(g)
    labels = lay.labels + (["other"] if lay.other else [])
    c = lay.cell_w
    hot_pos = lay.nodes.index(mv.hot_dst) if (is_hot(mv) and mv.hot_dst in lay.nodes) else -1
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
    fs = finding_rows(m.analysis)            # incidents first, their other findings under them
    ftext = Text()
    for depth, fd in fs[:12]:
        sev = str(fd.get("severity", "info"))
        color = {"critical": "bold red", "warning": "yellow"}.get(sev, "cyan")
        if depth:
            ftext.append("  └ ", style="dim")
            ftext.append(f"{fd.get('kind')}: ", style=color)
            ftext.append(f"{fd.get('message') or ''}{onset_note(fd, m.analysis)}{cause_note(fd)}\n", style="dim")
            continue
        ftext.append(f"{SEV_SHORT.get(sev, sev[:4].upper()):<5}", style=color)
        ftext.append(f"{fd.get('message') or fd.get('kind')}{onset_note(fd, m.analysis)}{cause_note(fd)}\n")
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
