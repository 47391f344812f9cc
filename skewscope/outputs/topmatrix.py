"""The node x node matrix of `top` (key m, --matrix): its view model (`matrix_view`:
analysis.matrix.node_matrix as bit/s over a snapshot), its layout in a given width
(`matrix_layout`, `matrix_grid`), the colour scale (`heat_scale`, `heat_index`), its summary
lines and the plain table (`matrix_lines`). The rich heatmap is outputs/toprich.py."""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from skewscope.core.snapshot import Snapshot
from skewscope.outputs.topformat import PLAIN_WIDTH, fmt_num, short_ip

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
    names: dict | None = None     # ip -> what people call it (--inventory): the labels

    @property
    def n(self) -> int:
        return len(self.ips)


def matrix_view(snap: Snapshot, dt: float, cumulative: bool = False, flow_mask=None,
                names: dict | None = None) -> MatrixView:
    """The matrix of snap over dt seconds; flow_mask (bool per flow: the IP filter) keeps
    only those flows and the nodes they reach; names (ip -> name, --inventory) label them."""
    try:
        from skewscope.analysis.matrix import node_matrix  # heavy (numba): only in the matrix view
        from skewscope.analysis.stats import skew_stats  # heavy (numba): only in the matrix view
    except ImportError as e:
        return MatrixView([], np.zeros((0, 0)), dt, cumulative, error=f"the node matrix needs the analysis ({e})")
    ips, mat = node_matrix(snap, flow_mask)
    k = float(int(snap.meta.get("sample_n", 1) or 1))
    bps = np.asarray(mat, dtype=np.float64) * 8.0          # (in place after: one n x n temporary)
    bps *= k
    bps /= max(dt, 1e-9)
    ips = list(ips)
    if flow_mask is not None and len(ips):
        live_n = (bps.sum(axis=0) + bps.sum(axis=1)) > 0
        ips = [ip for ip, x in zip(ips, live_n) if x]
        bps = bps[np.ix_(live_n, live_n)]
    mv = MatrixView(ips, bps, dt, cumulative, names=names or None)
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
    "other". Labels: the inventory's names where it has them, else full addresses, or the
    addresses without their common prefix when that shows more."""
    n = mv.n
    full = [short_ip(ip) for ip in mv.ips]
    pre = _common_prefix(mv.ips)
    named = [short_ip(mv.names.get(ip, ip)) for ip in mv.ips] if mv.names else None
    best = None
    for labels, prefix in ((named, ""), (full, ""),
                           ([short_ip(ip[len(pre):]) for ip in mv.ips] if pre and not named else None, pre)):
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


def matrix_marks(mv: MatrixView, lay: MatrixLayout) -> dict:
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


def is_hot(mv: MatrixView) -> bool:
    """The busiest destination stands out (>= HOT_SHOWN x the mean of the receiving nodes)."""
    ds = mv.dest_skew or {}
    return mv.hot_dst >= 0 and ds.get("n", 0) > 1 and float(ds.get("max_over_mean") or 0) >= HOT_SHOWN


def matrix_title(mv: MatrixView) -> str:
    span = f"since start ({mv.dt:.0f} s)" if mv.cumulative else f"last {mv.dt:.2g} s"
    return f"node matrix, data bit/s, {span} (rows: source, columns: destination)"


def matrix_summary(mv: MatrixView, lay: MatrixLayout) -> list[str]:
    """The hot destination, the hottest cell, the coldest link, and what is not shown."""
    out = []
    if mv.hot_dst >= 0:
        ds = mv.dest_skew or {}
        if is_hot(mv):
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
    out = [matrix_title(mv)[:width]]
    if not mv.n or mv.hot_dst < 0:
        return out + ["(no data traffic between nodes)"]
    lay = matrix_layout(mv, width, max_rows)
    g, rs, cs = matrix_grid(mv, lay)
    marks = matrix_marks(mv, lay)
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


