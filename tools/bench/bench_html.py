#!/usr/bin/env python3
"""The HTML report (`report --html`): which plotting library, and how fast the page is, on
the 65,536-flow synthetic Snapshot of bench_analysis.py (128-node all-to-all, 2 channels).

    .venv/bin/python tools/bench/bench_html.py [--records 1000000] [--rounds 3]

Rows (median of --rounds, seconds; ratios against analyze() of the same Snapshot in the same
run, the work a report does anyway):

  analyze              analysis.analyze(snap): the baseline
  page (matplotlib)    outputs.html.render(snap, analysis): the whole page as shipped
  candidates           the same picture set drawn by each library: the 128-node matrix
                       (top 32 + other, bytes and rate), 4 groups x 8 links x 240 time bins of
                       rate, 4 message-size histograms; page size, and the number of
                       external fetches (src= / href= with http(s)://) in the page

A candidate not installed is said so and skipped (matplotlib is the html extra; plotly,
altair + vl-convert-python only for this comparison: pip install plotly altair vl-convert-python).
"""
from __future__ import annotations

import argparse
import importlib.util
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_analysis import fresh, synthetic  # noqa: E402

from skewscope.analysis import analyze  # noqa: E402
from skewscope.outputs import html as H  # noqa: E402
from skewscope.outputs import html_data as HD  # noqa: E402
from skewscope.outputs import html_figures as HF  # noqa: E402

FETCH = re.compile(r"""(?:src|href)\s*=\s*["']?https?://""", re.I)


def timed(fn, rounds):
    ts, out = [], None
    for _ in range(rounds):
        t = time.perf_counter()
        out = fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts), out


def picture_data(snap):
    """The numbers every candidate draws (from the same functions the page uses)."""
    ips, m, rate = HD._matrices(snap)
    names, am, ar, _ = HD._aggregate(ips, m, rate)
    t0, t1 = int(snap.events["start_ts"].min()), int(snap.events["end_ts"].max())
    n = len(ips)
    groups = []
    for g in range(4):               # 4 "groups" of 32 nodes: their 8 busiest links
        mi = list(range(32 * g, 32 * g + 32))
        sub = m[np.ix_(mi, mi)]
        flat = np.argsort(-sub, axis=None, kind="stable")[:8]
        pairs = [(mi[int(i) // 32], mi[int(i) % 32]) for i in flat]
        edges, ser = HD._link_series(snap, pairs, t0, t1)
        groups.append(([f"{ips[s]}->{ips[d]}" for s, d in pairs], (edges[:-1] - t0) / 1e6, ser))
    hists = [HD._group_hist(snap, list(range(32 * g, 32 * g + 32))) for g in range(4)]
    assert n == 128
    return names, am, ar, groups, hists


def page_matplotlib(names, am, ar, groups, hists):
    Figure, rc = H._mpl()
    with rc(HF._RC):
        parts = [HF._svg(HF.fig_matrix(Figure, names, am, ar, None))]
        for labels, x, ser in groups:
            fig = Figure(figsize=(10, 2.8))
            ax = fig.subplots()
            for lab, y in zip(labels, ser):
                ax.step(x, y, where="post", linewidth=1.0, label=lab)
            ax.legend(fontsize=7, ncol=2)
            parts.append(HF._svg(fig))
        parts.append(HF._svg(HF.fig_hists(Figure, [(f"group {i}", h) for i, h in enumerate(hists)])))
    return "<!DOCTYPE html><html><body>" + "".join(parts) + "</body></html>"


def page_plotly(names, am, ar, groups, hists):
    import plotly.graph_objects as go
    import plotly.io as pio
    figs = [go.Figure(go.Heatmap(z=am, x=names, y=names)), go.Figure(go.Heatmap(z=ar, x=names, y=names))]
    for labels, x, ser in groups:
        f = go.Figure()
        for lab, y in zip(labels, ser):
            f.add_trace(go.Scatter(x=x, y=y, mode="lines", line_shape="hv", name=lab))
        figs.append(f)
    for h in hists:
        nz = np.nonzero(h)[0]
        figs.append(go.Figure(go.Bar(x=[str(i) for i in nz], y=h[nz])))
    # one inline bundle for the page, then each figure without it
    parts = [pio.to_html(figs[0], include_plotlyjs=True, full_html=False)]
    parts += [pio.to_html(f, include_plotlyjs=False, full_html=False) for f in figs[1:]]
    return "<!DOCTYPE html><html><head><meta charset='utf-8'></head><body>" + "".join(parts) + "</body></html>"


def page_altair(names, am, ar, groups, hists):
    import altair as alt
    k = len(names)
    cells = [{"src": names[i], "dst": names[j], "bytes": float(am[i, j]),
              "rate": float(ar[i, j]) if np.isfinite(ar[i, j]) else 0.0} for i in range(k) for j in range(k)]
    charts = [alt.Chart(alt.Data(values=cells)).mark_rect().encode(x="dst:N", y="src:N", color="bytes:Q"),
              alt.Chart(alt.Data(values=cells)).mark_rect().encode(x="dst:N", y="src:N", color="rate:Q")]
    for labels, x, ser in groups:
        pts = [{"t": float(t), "rate": float(v), "link": lab} for lab, y in zip(labels, ser) for t, v in zip(x, y)]
        charts.append(alt.Chart(alt.Data(values=pts)).mark_line(interpolate="step-after").encode(
            x="t:Q", y="rate:Q", color="link:N"))
    for h in hists:
        nz = np.nonzero(h)[0]
        charts.append(alt.Chart(alt.Data(values=[{"slot": int(i), "n": int(h[i])} for i in nz])).mark_bar().encode(
            x="slot:O", y="n:Q"))
    return alt.vconcat(*charts).to_html(inline=True)


CANDIDATES = [("matplotlib (SVG, no JS)", "matplotlib", page_matplotlib),
              ("plotly (offline bundle)", "plotly", page_plotly),
              ("altair/Vega-Lite (inline)", "vl_convert", page_altair)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    base = synthetic(n_records=a.records)
    print(f"snapshot: {len(base.flows)} flows, {len(base.events)} message records, 128 nodes")
    t_an, an = timed(lambda: analyze(fresh(base)), a.rounds)
    snap = fresh(base)
    an = analyze(snap)
    print(f"{'analyze':34s} {t_an:8.3f} s   1.00x (baseline)")
    t_page, page = timed(lambda: H.render(snap, an), a.rounds)
    print(f"{'page (matplotlib, as shipped)':34s} {t_page:8.3f} s   {t_page / t_an:5.2f}x   "
          f"{len(page.encode()) / 1024:8.0f} KiB  fetches {len(FETCH.findall(page))}")
    data = picture_data(snap)
    print("candidates (the same pictures):")
    for name, mod, fn in CANDIDATES:
        if importlib.util.find_spec(mod) is None:
            print(f"  {name:32s} not installed: skipped")
            continue
        try:
            t, pg = timed(lambda fn=fn: fn(*data), a.rounds)
        except Exception as e:       # a candidate failing is a result, not a crash of the bench
            print(f"  {name:32s} failed: {type(e).__name__}: {e}")
            continue
        js = len(re.findall(r"<script", pg, re.I))
        print(f"  {name:32s} {t:8.3f} s   {t / t_an:5.2f}x   {len(pg.encode()) / 1024:8.0f} KiB  "
              f"fetches {len(FETCH.findall(pg))}  <script> {js}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
