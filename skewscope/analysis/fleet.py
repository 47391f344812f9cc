"""Fleet definitions on node-level matrices (the `skewscope cluster` path).

The single-node path analyses flows and message records; across a fleet, Prometheus
holds per-pair counters instead (skewscope export). The fleet detectors
(analysis/detectors/fleet.py) ask the same questions on the node pair matrix (row = source
node, column = destination node; sparse: `Pairs`, the pairs that exist) with the package's
statistics (`stats.skew_stats`, `stats.skew_rows`, `stats.robust_ratio_to_median`) and
these definitions:

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
from skewscope.analysis.stats import nanmedian, unique

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


class Pairs:
    """The fleet's node pairs (src, dst) that carry anything, sorted row-major (a CSR
    pattern over n nodes): every per-pair quantity is a (P,) vector over them. A fleet talks
    in groups (TP/EP groups, rings), so P grows linearly with n where a dense n x n matrix
    grows with n^2 (docs/fleet.md "Measured at scale"). A pair that is not here is zero."""

    def __init__(self, n: int, src, dst):
        self.n = int(n)
        self.src = np.asarray(src, dtype=np.int64)
        self.dst = np.asarray(dst, dtype=np.int64)
        self.key = self.src * self.n + self.dst
        if len(self.key) > 1 and not (np.diff(self.key) > 0).all():
            raise ValueError("pairs must be unique and sorted by (src, dst)")
        self.diag = self.src == self.dst
        self.row_start = np.searchsorted(self.src, np.arange(self.n + 1))
        self.by_dst = np.argsort(self.dst, kind="stable")          # each column in src order
        self.col_start = np.searchsorted(self.dst[self.by_dst], np.arange(self.n + 1))

    @classmethod
    def of(cls, n: int, src, dst) -> "Pairs":
        """The pattern of (src, dst) index pairs given in any order, with repeats."""
        key = unique(np.asarray(src, dtype=np.int64) * int(n) + np.asarray(dst, dtype=np.int64))
        return cls(n, key // max(int(n), 1), key % max(int(n), 1))

    def __len__(self) -> int:
        return len(self.key)

    def find(self, i, j) -> np.ndarray:
        """Index of each pair (i, j) in the pattern, -1 where it is absent."""
        k = np.asarray(i, dtype=np.int64) * self.n + np.asarray(j, dtype=np.int64)
        if not len(self.key):
            return np.full(np.shape(k), -1, dtype=np.int64)
        at = np.minimum(np.searchsorted(self.key, k), len(self.key) - 1)
        return np.where(self.key[at] == k, at, -1)

    def at(self, v, i, j):
        """v's values at pairs (i, j), 0 where the pair is absent (scalar in, scalar out)."""
        k = self.find(i, j)
        v = np.asarray(v, dtype=np.float64)
        out = np.where(k >= 0, v[np.maximum(k, 0)] if len(v) else 0.0, 0.0)
        return float(out) if out.ndim == 0 else out

    def column(self, j: int) -> np.ndarray:
        """Indices of the pairs into node j, by source."""
        return self.by_dst[self.col_start[j]:self.col_start[j + 1]]

    def row(self, i: int) -> slice:
        return slice(self.row_start[i], self.row_start[i + 1])

    def block(self, v, members) -> np.ndarray:
        """v over members x members as a dense (k, k) array (a group is small)."""
        g = np.asarray(members, dtype=np.int64)
        return self.at(v, np.repeat(g, len(g)), np.tile(g, len(g))).reshape(len(g), len(g))

    def col_sum(self, v) -> np.ndarray:
        """Per destination, the sum over sources in source order: numpy's dense axis-0 sum."""
        return np.bincount(self.dst, weights=np.asarray(v, dtype=np.float64), minlength=self.n)

    def row_sum(self, v) -> np.ndarray:
        """Per source, the sum over its row as numpy sums a dense row (pairwise, 8-way
        unrolled blocks of <= 128: _pairwise), so that results do not depend on whether
        the matrix was dense or sparse, to the last bit."""
        v = np.asarray(v, dtype=np.float64)
        out = np.zeros(self.n)
        for i in np.nonzero(np.diff(self.row_start))[0]:
            s = self.row(int(i))
            out[i] = _pairwise(self.dst[s].tolist(), v[s].tolist(), 0, self.n, 0, s.stop - s.start)
        return out

    def offdiag(self, v) -> np.ndarray:
        return np.where(self.diag, 0.0, np.asarray(v, dtype=np.float64))


def from_dense(by_class: dict, naks: dict, full: bool = False):
    """(Pairs, by_class, naks) from dense matrices (name -> (3, n, n), syndrome -> (n, n)):
    over the pairs where any value is nonzero, or every n x n pair with full (fleets built
    in tests; the same findings either way)."""
    mats = [np.asarray(v, dtype=np.float64) for v in by_class.values()]
    n = (mats[0] if mats else np.asarray(next(iter(naks.values())))).shape[-1]
    if full:
        i, j = np.divmod(np.arange(n * n), n)
    else:
        nz = np.zeros((n, n), dtype=bool)
        for v in mats:
            nz |= (v != 0).any(axis=0)
        for v in naks.values():
            nz |= np.asarray(v) != 0
        i, j = np.nonzero(nz)
    p = Pairs(n, i, j)
    return p, {k: np.asarray(v, dtype=np.float64)[:, i, j] for k, v in by_class.items()}, \
        {k: np.asarray(v, dtype=np.float64)[i, j] for k, v in naks.items()}


def _pairwise(pos: list, val: list, lo: int, n: int, a: int, b: int) -> float:
    """numpy's pairwise sum of a dense row[lo:lo + n] whose nonzeros are val[a:b] at pos[a:b]
    (loops_utils.h: < 8 sequential; <= 128 eight accumulators by position mod 8, then the
    rest; else halves at a multiple of 8), visiting only ranges that hold a nonzero (adding
    0.0 is exact). tests/unit/test_fleet_sparse.py checks it against numpy."""
    if a == b:
        return 0.0
    if n < 8:
        res = 0.0
        for k in range(a, b):
            res += val[k]
        return res
    if n <= 128:
        main = lo + n - n % 8
        r = [0.0] * 8
        k = a
        while k < b and pos[k] < main:
            r[(pos[k] - lo) % 8] += val[k]
            k += 1
        res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
        while k < b:
            res += val[k]
            k += 1
        return res
    n2 = n // 2
    n2 -= n2 % 8
    m = a
    while m < b and pos[m] < lo + n2:
        m += 1
    return _pairwise(pos, val, lo, n2, a, m) + _pairwise(pos, val, lo + n2, n - n2, m, b)


def class_bytes(fm, klass: str) -> np.ndarray:
    """Per pair: bytes of one traffic class to another node (a node's own pair is 0)."""
    return fm.pairs.offdiag(fm.cls("bytes", klass))


def rate_over_active(fm, klass: str) -> np.ndarray:
    """bits/s per pair over the on-wire time of its multi-packet messages of one traffic
    class (NaN: none)."""
    return 8.0 * safe_div(fm.cls("timed_message_bytes", klass), fm.cls("message_wire_seconds", klass))


def destination_preference(pairs: Pairs, m) -> np.ndarray:
    """Per destination j: the median over sources i (i != j, sending to j and to at least
    one other node) of m[i, j] / mean_{k != i, j} m[i, k] -- how much more than to the
    others a typical source sends to j. A MoE hot expert is over-sent by every source even
    when the combine phase (the expert sending back as much) dilutes its inbound total."""
    n = pairs.n
    out = np.full(n, np.nan)
    m = pairs.offdiag(m)
    rowsum = pairs.row_sum(m)
    cnt = np.bincount(pairs.src, weights=(m > 0), minlength=n).astype(np.int64)
    sent = m > 0
    others_n = cnt[pairs.src] - 1
    ok = sent & (others_n > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean_others = np.where(ok, (rowsum[pairs.src] - m) / np.where(ok, others_n, 1), np.nan)
        r = m / np.where(mean_others > 0, mean_others, np.nan)
    for j in np.nonzero(np.diff(pairs.col_start))[0]:
        col = pairs.column(int(j))
        col = col[ok[col]]
        if len(col) and np.isfinite(r[col]).any():
            out[j] = float(nanmedian(r[col]))
    return out


def find_rings(pairs: Pairs, bulk) -> list[list[int]]:
    """Cycles of the successor map of the pairs where `bulk` (a (P,) mask) holds, each as
    the member order [a, succ(a), ...]."""
    n = pairs.n
    bulk = np.asarray(bulk, dtype=bool)
    outd = np.bincount(pairs.src[bulk], minlength=n)
    ind = np.bincount(pairs.dst[bulk], minlength=n)
    ok = (outd == 1) & (ind == 1)
    succ = np.full(n, -1, dtype=np.int64)
    one = bulk & ok[pairs.src]
    succ[pairs.src[one]] = pairs.dst[one]
    seen = np.zeros(n, dtype=bool)
    rings = []
    for a in np.nonzero(ok)[0].tolist():
        if seen[a]:
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


def all_to_all_groups(pairs: Pairs, dp, bulk) -> list[list[int]]:
    """Groups of nodes where every member sends non-bulk data to every other member
    (connected components of mutual non-bulk data pairs, kept when >= 90 % dense); dp and
    bulk are (P,) masks."""
    chunk = np.asarray(dp, dtype=bool) & ~np.asarray(bulk, dtype=bool)
    rev = pairs.find(pairs.dst, pairs.src)
    mutual = chunk & (rev >= 0) & chunk[np.maximum(rev, 0)]
    n = pairs.n
    nbrs = [[] for _ in range(n)]
    for i, j in zip(pairs.src[mutual].tolist(), pairs.dst[mutual].tolist()):
        nbrs[i].append(j)                       # by destination: the pattern is row-major
    comp = -np.ones(n, dtype=np.int64)
    groups = []
    for a in range(n):
        if comp[a] >= 0 or not nbrs[a]:
            continue
        stack, members = [a], []
        comp[a] = len(groups)
        while stack:
            x = stack.pop()
            members.append(x)
            for y in nbrs[x]:
                if comp[y] < 0:
                    comp[y] = len(groups)
                    stack.append(y)
        members.sort()
        k = len(members)
        if k >= 3:
            inside = set(members)
            dense = sum(1 for x in members for e in range(pairs.row_start[x], pairs.row_start[x + 1])
                        if chunk[e] and int(pairs.dst[e]) in inside)
            if dense >= 0.9 * k * (k - 1):
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
