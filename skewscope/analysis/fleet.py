"""Fleet definitions on node-level matrices (the `skewscope cluster` path).

The single-node path analyses flows and message records; across a fleet, Prometheus
holds per-pair counters instead (skewscope export). The fleet detectors
(analysis/detectors/fleet.py) ask the same questions on an n x n matrix (row = source
node, column = destination node) with the package's statistics (`stats.skew_stats`,
`stats.skew_rows`, `stats.robust_ratio_to_median`) and these definitions:

* traffic class of a flow (the exporter's `class` label, exporter.flow_class): bulk = mean
  message >= BULK_MIN_MESSAGE (ring/tree SIMPLE slices; all-to-all/P2P chunks are <= 128
  KiB), chunk = other data (mean > flows.CTS_MAX_BYTES), control = clear-to-send writes,
  ACK/NAK, CNP; a data pair carries bulk or chunk bytes; a ring link is a bulk pair;
* rate over active time of a pair: 8 * bytes of its multi-packet messages / their on-wire
  time (flows.flow_event_stats, summed over the pair's flows by the exporter);
* ring: a cycle of the successor map of bulk pairs (every member has exactly one bulk
  successor and one bulk predecessor); straggler score of a link = its rate over active
  time / the median over the ring's links;
* incast degree of a destination: sum over senders of the pair's busy time / the
  destination's busy time (union of all incoming message intervals) = mean number of
  senders transferring into it while it receives.

Their findings have the single-node schema (detectors.registry.Finding).
"""
from __future__ import annotations

import numpy as np

from skewscope.analysis.flows import CTS_MAX_BYTES  # noqa: F401 (re-exported: the exporter's class bounds)

BULK_MIN_MESSAGE = 160 * 1024


def fmt_bps(v: float) -> str:
    for unit, f in (("Gb/s", 1e9), ("Mb/s", 1e6), ("kb/s", 1e3)):
        if v >= f:
            return f"{v / f:.2f} {unit}"
    return f"{v:.0f} b/s"


def safe_div(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(b > 0, a / np.where(b > 0, b, 1.0), np.nan)


def offdiag(m: np.ndarray) -> np.ndarray:
    m = m.copy()
    np.fill_diagonal(m, 0)
    return m


def class_bytes(fm, klass: str) -> np.ndarray:
    return offdiag(fm.cls("bytes", klass))


def rate_over_active(fm, klass: str) -> np.ndarray:
    """bits/s per pair over the on-wire time of its multi-packet messages of one traffic
    class (NaN: none)."""
    return 8.0 * safe_div(fm.cls("timed_message_bytes", klass), fm.cls("message_wire_seconds", klass))


def destination_preference(m: np.ndarray) -> np.ndarray:
    """Per destination j: the median over sources i (i != j, sending to j and to at least
    one other node) of m[i, j] / mean_{k != i, j} m[i, k] -- how much more than to the
    others a typical source sends to j. A MoE hot expert is over-sent by every source even
    when the combine phase (the expert sending back as much) dilutes its inbound total."""
    n = m.shape[0]
    out = np.full(n, np.nan)
    m = offdiag(np.asarray(m, dtype=np.float64))
    rowsum = m.sum(axis=1)
    cnt = (m > 0).sum(axis=1)
    for j in range(n):
        others_n = cnt - (m[:, j] > 0)
        ok = (m[:, j] > 0) & (others_n > 0)
        ok[j] = False
        if not ok.any():
            continue
        mean_others = (rowsum[ok] - m[ok, j]) / others_n[ok]
        r = m[ok, j] / np.where(mean_others > 0, mean_others, np.nan)
        if np.isfinite(r).any():
            out[j] = float(np.nanmedian(r))
    return out


def find_rings(bulk: np.ndarray) -> list[list[int]]:
    """Cycles of the successor map of bulk pairs, each as the member order [a, succ(a), ...]."""
    n = bulk.shape[0]
    outd = bulk.sum(axis=1)
    ind = bulk.sum(axis=0)
    ok = (outd == 1) & (ind == 1)
    succ = np.where(ok, np.argmax(bulk, axis=1), -1)
    seen = np.zeros(n, dtype=bool)
    rings = []
    for a in range(n):
        if not ok[a] or seen[a]:
            continue
        cyc = [a]
        seen[a] = True
        b = int(succ[a])
        while b >= 0 and ok[b] and not seen[b]:
            cyc.append(b)
            seen[b] = True
            b = int(succ[b])
        if b == a and len(cyc) >= 2:
            rings.append(cyc)
    return rings


def all_to_all_groups(dp: np.ndarray, bulk: np.ndarray) -> list[list[int]]:
    """Groups of nodes where every member sends non-bulk data to every other member
    (connected components of mutual non-bulk data pairs, kept when >= 90 % dense)."""
    chunk = dp & ~bulk
    mutual = chunk & chunk.T
    n = dp.shape[0]
    comp = -np.ones(n, dtype=np.int64)
    groups = []
    for a in range(n):
        if comp[a] >= 0 or not mutual[a].any():
            continue
        stack, members = [a], []
        comp[a] = len(groups)
        while stack:
            x = stack.pop()
            members.append(x)
            for y in np.nonzero(mutual[x])[0]:
                if comp[y] < 0:
                    comp[y] = len(groups)
                    stack.append(int(y))
        members.sort()
        k = len(members)
        if k >= 3:
            sub = chunk[np.ix_(members, members)]
            if sub.sum() >= 0.9 * k * (k - 1):
                groups.append(members)
                continue
        groups.append([])
    return [g for g in groups if g]


# ---- per-node timing histograms (docs/fleet.md "Per-node timing series", "Fusion") --------
# Every value below comes from one DPU's histogram of differences of its own timestamps;
# nothing compares one DPU's timestamps with another's.
def bucket_quantile(bounds, cum, q: float) -> float:
    """Prometheus' histogram_quantile on one histogram: bounds (finite `le`, ascending),
    cum (cumulative counts per bound, then +Inf). Linear inside the bucket; the first
    bucket's lower edge is 0 for non-negative bounds (Prometheus' rule), else the bound
    itself; a rank in +Inf returns the largest finite bound. NaN when empty."""
    b = np.asarray(bounds, dtype=np.float64)
    c = np.asarray(cum, dtype=np.float64)
    if not len(c) or c[-1] <= 0:
        return float("nan")
    rank = q * c[-1]
    k = int(np.searchsorted(c, rank, side="left"))
    if k >= len(b):
        return float(b[-1])
    lo = (0.0 if b[0] >= 0 else b[0]) if k == 0 else b[k - 1]
    below = 0.0 if k == 0 else c[k - 1]
    inb = c[k] - below
    if inb <= 0:
        return float(b[k])
    return float(lo + (b[k] - lo) * (rank - below) / inb)


def count_le(bounds, cum, x: float) -> float:
    """Samples <= the largest bound <= x (exact at bucket bounds)."""
    b = np.asarray(bounds, dtype=np.float64)
    k = int(np.searchsorted(b, x, side="right")) - 1
    return 0.0 if k < 0 else float(cum[k])


def count_gt(bounds, cum, x: float) -> float:
    """Samples > the smallest bound >= x."""
    b = np.asarray(bounds, dtype=np.float64)
    k = int(np.searchsorted(b, x, side="left"))
    return float(cum[-1] - (cum[k] if k < len(b) else cum[-1]))


def bound_at_or_below(bounds, x: float) -> float:
    """The largest positive bucket bound <= x (the smallest positive one if none)."""
    b = np.asarray([v for v in bounds if v > 0], dtype=np.float64)
    k = int(np.searchsorted(b, x, side="right")) - 1
    return float(b[max(k, 0)])


def upstream_cycles(up: dict) -> list[list[str]]:
    """Rings from each member's own upstream (member -> the one peer it receives from, as
    its DPU reports it): cycles of the map, each in send order [a, downstream(a), ...]."""
    down = {}
    for m, u in up.items():
        down.setdefault(u, []).append(m)
    seen, out = set(), []
    for a in sorted(up):
        if a in seen:
            continue
        path, x = [], a
        while x in up and x not in seen and x not in path:
            path.append(x)
            x = up[x]
        if x in path:
            cyc = path[path.index(x):]
            cyc.reverse()                       # upstream order reversed = send order
            if len(cyc) >= 2 and all(len(down.get(m, [])) == 1 for m in cyc):
                out.append(cyc)
        seen.update(path)
    return out
