"""Snapshot + analysis -> one self-contained HTML page (`report --html`, `capture --html`).

The pictures are server-side SVG drawn by matplotlib (docs/html.md says why: no JavaScript,
no network, the smallest page, printable), inlined in the page; no script, no external
font, style sheet or image. What is drawn comes from the analysis document (the JSON
contract of outputs/report.py: collectives, timing, findings with their evidence, metrics)
and, for time series and histograms, from the Snapshot through the analysis' own functions
(analysis.matrix.node_matrix / link_rates on the cached Context): nothing is recomputed
differently here.

Sections: incidents (the findings that share a root, the lead's card linked and its symptoms
nested under it: analysis.incidents), findings (each with its evidence drawn), node x node traffic matrix (bytes and rate
over active time; the busiest MATRIX_TOP nodes, the rest summed into one "other" row and
column), per-link rate over time for the largest groups, the timing hierarchy, message-size
histograms per group, counters.

Here the page (its sections, cards, tables, CSS); html_data.py the data taken from the
Snapshot; html_figures.py the matplotlib figures.
"""
from __future__ import annotations

import html
import math
import os

import numpy as np

from skewscope.core.errors import EXIT_NOT_RUN, EXIT_USAGE, SkewscopeError
from skewscope.core.files import atomic_write_text
from skewscope.core.snapshot import Snapshot
from skewscope.outputs import report as R
from skewscope.outputs.html_data import (
    _activity,
    _aggregate,
    _group_hist,
    _link_series,
    _matrices,
    _timeline,
)
from skewscope.outputs.html_figures import (  # noqa: F401 (HOT, onset_spans: the page's colours and spans)
    _RC,
    HOT,
    SEV_COLOR,
    _dur,
    _svg,
    fig_finding,
    fig_hists,
    fig_link_rates,
    fig_matrix,
    fig_timing,
    onset_spans,
)
from skewscope.core.when import Clock

#: groups (collectives) with a rate-over-time plot and a size histogram
GROUPS_TOP = 4
#: links drawn per group in the rate-over-time plot
LINKS_TOP = 8
#: findings drawn (all are listed), and at most this many of one kind
FINDINGS_DRAWN = 10
DRAWN_PER_KIND = 2


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
.card,.incident{background:#fff;border:1px solid #ddd;border-left:5px solid #999;padding:6px 12px;margin:10px 0}
.incident ul{margin:4px 0;padding-left:20px}
.sev{font-weight:bold;text-transform:uppercase;font-size:12px}
.critical{border-left-color:#c62828}.warning{border-left-color:#ef6c00}.info{border-left-color:#1565c0}
.ok{color:#2e7d32;font-weight:bold}
code{font-size:12px}
@media print{body{background:#fff;font-size:11px}nav{display:none}main{max-width:none;padding:0}
 .card,.incident,.fig,table{page-break-inside:avoid;break-inside:avoid}h2{page-break-after:avoid;break-after:avoid}}
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
    """The page: its sections in order, each drawn from the document (and the Snapshot)."""
    fs = doc.get("findings")
    colls = doc.get("collectives") or []
    title = f"skewscope report: {os.path.basename(str(doc['source']))}"
    parts = (_head(title, snap, doc) + _collectives(colls) + _incidents(doc, fs)
             + _findings(Figure, snap, doc, fs))
    ips, mb, rate = _matrices(snap)
    parts += _matrix(Figure, doc, ips, mb, rate)
    t0, t1 = _span(snap, doc["meta"])
    order = sorted(range(len(colls)), key=lambda i: -((colls[i].get("metrics") or {}).get("bytes") or 0))[:GROUPS_TOP]
    parts += _rates(Figure, snap, fs, colls, order, ips, mb, t0, t1)
    parts += _timing(Figure, snap, doc, fs, colls, t0, t1)
    parts += _sizes(Figure, snap, colls, order, ips)
    parts += _counters(doc)
    body = "\n".join(parts)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{_esc(title)}</title><style>{CSS}</style></head>\n<body><main>\n{body}\n</main></body></html>\n")


def _span(snap, m) -> tuple[int, int]:
    """(first, last) ns of the time charts: the capture's, else its message records'."""
    t0 = int(m.get("first_ts") or 0)
    t1 = int(m.get("last_ts") or 0)
    if len(snap.events) and t1 <= t0:
        t0, t1 = int(snap.events["start_ts"].min()), int(snap.events["end_ts"].max())
    return t0, t1


def _head(title, snap, doc) -> list[str]:
    """The title, the source line and the section links."""
    m, t = doc["meta"], doc["totals"]
    return [f"<h1>{_esc(title)}</h1>",
            f'<p class="sub">source {_esc(doc["source"])} ({_esc(m.get("source", "?"))}), '
            f'{_esc(_dur(float(m.get("duration_s") or 0)))}, {t["packets_seen"]:,} frames, '
            f'{t["roce_packets"]:,} RoCE, {len(snap.flows):,} flows, {t["message_records"]:,} message records'
            + (f', <b>sampled 1 in {int(m["sample_n"])}</b>' if int(m.get("sample_n", 1) or 1) > 1 else "")
            + (f', <b>{t["flows_evicted"]:,} flows evicted</b>' if t["flows_evicted"] else "") + "</p>",
            '<nav><a href="#incidents">incidents</a><a href="#findings">findings</a><a href="#matrix">matrix</a><a href="#rates">link rates</a>'
            '<a href="#timing">timing</a><a href="#sizes">message sizes</a><a href="#counters">counters</a></nav>']


def _collectives(colls) -> list[str]:
    """The collectives summary (one row per group)."""
    if not colls:
        return []
    rows = []
    for i, c in enumerate(colls):
        cm = c.get("metrics") or {}
        mem = c.get("member_names") or c["members"]      # --inventory: what people call them
        rows.append((i, c["kind"], c.get("pattern") or "", f"{c['confidence']:.2f}", len(mem),
                     ", ".join(mem[:6]) + (f" ... ({len(mem)})" if len(mem) > 6 else ""),
                     R.fmt_bytes(cm.get("bytes") or 0), cm.get("protocol_hint") or "",
                     cm.get("workload") or ""))
    return ["<h2>Collectives</h2>" + _table(rows, ("group", "kind", "pattern", "confidence", "nodes",
                                                   "members", "bytes", "protocol hint", "workload"))]


def _findings(Figure, snap, doc, fs) -> list[str]:
    """One card per finding; the evidence of the first FINDINGS_DRAWN (at most
    DRAWN_PER_KIND of a kind) drawn."""
    parts = ['<h2 id="findings">Findings</h2>']
    if fs is None:
        return parts + ["<p>no analysis</p>"]
    if not fs:
        return parts + ['<p class="ok">no findings: traffic looks healthy</p>']
    clock = Clock.of(doc["meta"])
    per_kind, drawn_f = {}, 0
    if len(fs) > FINDINGS_DRAWN:
        parts.append(f'<p class="sub">{len(fs)} findings; the evidence of the first {FINDINGS_DRAWN} (at most '
                     f"{DRAWN_PER_KIND} of a kind) is drawn, every finding's numbers are listed.</p>")
    inc_of = {x["id"]: k for k, x in enumerate(doc.get("incidents") or [])}
    for i, f in enumerate(fs):
        per_kind[f["kind"]] = per_kind.get(f["kind"], 0) + 1
        draw = drawn_f < FINDINGS_DRAWN and per_kind[f["kind"]] <= DRAWN_PER_KIND
        drawn_f += draw
        parts.append(_card(Figure, snap, doc, f, clock, draw, i, inc_of.get(f.get("incident"))))
    return parts


def _incidents(doc, fs) -> list[str]:
    """One box per incident (document order: severity, then impact): its severity, lead kind
    and node, id, message, when, impact, then its findings -- the lead, then the symptoms
    nested under it -- each linked to its card below; the context findings that qualify it."""
    if fs is None:
        return []
    parts = ['<h2 id="incidents">Incidents</h2>']
    incs = doc.get("incidents") or []
    if not incs:
        return parts + ['<p class="ok">no incidents</p>' if not fs else
                        '<p class="sub">no incident: no finding names a cause or a symptom</p>']
    clock = Clock.of(doc["meta"])
    parts.append(f'<p class="sub">{len(incs)} incident(s) from {len(fs)} finding(s): the findings that share a '
                 "root (a node, a destination, a group) are one incident, led by its most severe cause.</p>")
    for k, x in enumerate(incs):
        sev = x.get("severity", "info")
        ents = x.get("entities") or []

        def item(j, lead=False):
            f = fs[j]
            return (f'<li><a href="#finding-{j}">{_esc(f["kind"])}</a> '
                    f'<span class="sev" style="color:{SEV_COLOR.get(f.get("severity"), "#555")}">'
                    f'{_esc(f.get("severity"))}</span>' + (" (lead: the message above)" if lead else f': {_esc(f.get("message", ""))}'))

        box = [f'<div class="incident {_esc(sev)}" id="incident-{k}"><span class="sev" '
               f'style="color:{SEV_COLOR.get(sev, "#555")}">{_esc(sev)}</span> <b>{_esc(x["kind"])}</b>'
               + (f" on <b>{_esc(R.named(ents[0], fs[x['lead']]))}</b>" if ents else "") + f' <span class="sub">{_esc(x["id"])}</span>'
               + f"<p>{_esc(fs[x['lead']].get('message', ''))}</p>"]
        when = clock.text(x.get("since"), x.get("until"))
        if when:
            box.append(f"<p>when: {_esc(when)}</p>")
        imp = x.get("impact") or {}
        if imp.get("seconds") is not None:
            box.append(f"<p>impact: {_esc(_dur(imp['seconds']))} lost"
                       + (f" ({100 * imp['share']:.1f}% of each iteration/token)"
                          if imp.get("share") is not None else "") + "</p>")
        box.append("<ul>" + item(x["lead"], lead=True)
                   + ("<ul>" + "".join(item(j) + "</li>" for j in x.get("symptoms") or []) + "</ul>"
                      if x.get("symptoms") else "") + "</li></ul>")
        if x.get("context"):
            box.append('<p class="sub">context: ' + ", ".join(
                f'<a href="#finding-{j}">{_esc(fs[j]["kind"])}</a>' for j in x["context"]) + "</p>")
        box.append("</div>")
        parts.append("".join(box))
    return parts


def _card(Figure, snap, doc, f, clock, draw: bool, index: int = 0, incident: int | None = None) -> str:
    """One finding: severity, kind, message, nodes, when, impact, its incident, its evidence
    drawn (when `draw`) and listed."""
    sev = f.get("severity", "info")
    ents = f.get("entities") or {}
    imp = f.get("impact") or {}
    ev = f.get("evidence") or {}
    card = [f'<div class="card {_esc(sev)}"><a id="finding-{index}"></a><span class="sev" '
            f'style="color:{SEV_COLOR.get(sev, "#555")}">{_esc(sev)}</span> <b>{_esc(f["kind"])}</b>'
            + (f' <span class="sub">group {f["group"]}</span>' if f.get("group") is not None else "")
            + (f' <span class="sub">incident <a href="#incident-{incident}">{_esc(f["incident"])}</a></span>'
               if incident is not None else "")
            + f"<p>{_esc(f.get('message', ''))}</p>"]
    if (f.get("cause") or {}).get("text"):          # --dcgm: why, from GPU telemetry
        card.append(f"<p>cause ({_esc(f['cause'].get('verdict', ''))}): <b>{_esc(f['cause']['text'])}</b></p>")
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
    if draw:
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
    return "".join(card)


def _matrix(Figure, doc, ips, mb, rate) -> list[str]:
    """The node x node traffic matrix (bytes, rate over active time), its hot destination."""
    parts = ['<h2 id="matrix">Traffic matrix (node x node)</h2>']
    if not (len(ips) and mb.sum() > 0):
        return parts + ["<p>no data flows</p>"]
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
    return parts


def _rates(Figure, snap, fs, colls, order, ips, mb, t0, t1) -> list[str]:
    """Per-link rate over time of the largest groups (their LINKS_TOP busiest links)."""
    parts = ['<h2 id="rates">Per-link rate over time (largest groups)</h2>']
    pos = {ip: i for i, ip in enumerate(ips)}
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
    return parts


def _timing(Figure, snap, doc, fs, colls, t0, t1) -> list[str]:
    """The timing hierarchy in words (per group when several have a rhythm) and drawn."""
    parts = ['<h2 id="timing">Timing hierarchy (steps / collectives / iterations or tokens)</h2>']
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
    return parts


def _sizes(Figure, snap, colls, order, ips) -> list[str]:
    """Message-size histograms of the largest groups (else of all flows)."""
    parts = ['<h2 id="sizes">Message sizes per group</h2>']
    pos = {ip: i for i, ip in enumerate(ips)}
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
    return parts


def _counters(doc) -> list[str]:
    """The counters table: totals, reasons not accounted, PFC, congestion, meta."""
    m, t = doc["meta"], doc["totals"]
    mets = doc.get("metrics") or {}
    rows = [(k, v) for k, v in _flat({kk: vv for kk, vv in t.items() if kk != "not_accounted"})]
    rows += [(f"not_accounted.{k}", v) for k, v in t["not_accounted"].items() if v]
    p = doc["pfc"]
    rows += [(f"pfc.priority{x['priority']}", f"pause {x['pause']}, resume {x['resume']}, quanta {x['quanta']}")
             for x in p["per_priority"] if x["pause"] or x["resume"]]
    rows += [(f"congestion.{k}", v) for k, v in (mets.get("congestion") or {}).items()]
    for k in ("duration_s", "sample_n", "max_flows", "flows_evicted", "events_lost", "clock"):
        if k in m:
            rows.append((f"meta.{k}", m[k]))
    return ['<h2 id="counters">Counters</h2>',
            _table(rows, ("counter", "value")) + '<p class="sub">Definitions: README "Counters".</p>']


def write(path: str, snap: Snapshot, analysis: dict | None) -> int:
    """Render and write the page atomically (it appears whole or not at all). Returns its size."""
    page = render(snap, analysis)
    try:
        atomic_write_text(path, page)
    except OSError as e:
        raise HtmlError(f"--html {path}: {e.strerror or e}", EXIT_NOT_RUN) from None
    return len(page.encode())
