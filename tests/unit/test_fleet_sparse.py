"""The sparse fleet matrix (analysis.fleet.Pairs, issue 29) against the dense one it replaced.

Ground truth here is independent of the code under test: numpy's own dense sums, the dense
definitions as they were before issue 29 (copied below as the oracle), and fleets built
here with injected pathologies whose culprits are known (a hot expert, a slow ring link,
an incast victim, a congested, a lossy and a NAKing pair, a CNP storm). The documents of
`cluster` (fetch through a stand-in Prometheus answering from the dense numbers, analysis,
build_document) must be byte-identical whether the matrix holds only the pairs that exist
or every one of the n x n pairs, and must name the injected culprits.
"""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from skewscope.analysis import fleet as F
from skewscope.analysis.detectors.fleet import analyze_matrix
from skewscope.outputs import cluster as C
from skewscope.outputs import metrics as M


# ---- the dense definitions before issue 29 (the oracle) -------------------------------------
def dense_preference(m):
    n = m.shape[0]
    out = np.full(n, np.nan)
    m = m.copy()
    np.fill_diagonal(m, 0)
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


def dense_rings(bulk):
    n = bulk.shape[0]
    ok = (bulk.sum(axis=1) == 1) & (bulk.sum(axis=0) == 1)
    succ = np.where(ok, np.argmax(bulk, axis=1), -1)
    seen = np.zeros(n, dtype=bool)
    rings = []
    for a in range(n):
        if not ok[a] or seen[a]:
            continue
        cyc, b = [a], int(succ[a])
        seen[a] = True
        while b >= 0 and ok[b] and not seen[b]:
            cyc.append(b)
            seen[b] = True
            b = int(succ[b])
        if b == a and len(cyc) >= 2:
            rings.append(cyc)
    return rings


def dense_groups(chunk):
    mutual = chunk & chunk.T
    n = chunk.shape[0]
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
        groups.append(members if k >= 3 and chunk[np.ix_(members, members)].sum() >= 0.9 * k * (k - 1) else [])
    return [g for g in groups if g]


# ---- a fleet with known culprits --------------------------------------------------------------
NAMES = [name for name, _ in C.PAIR_SERIES]
BULK, CHUNK, CONTROL = range(3)


def fleet(n: int, seed: int):
    """Dense per-class matrices of a fleet of n nodes (n >= 40) at shuffled indices: an
    8-node all-to-all with a hot expert, a 6-node bulk ring with one slow link, an incast,
    a congested, a lossy and a NAKing pair, then healthy all-to-all groups and rings (the
    last of the 2 to 9 nodes left: a ring).
    Values are non-integers over many magnitudes (the sums' rounding shows)."""
    rng = np.random.default_rng(seed)
    node = rng.permutation(n)
    d = {k: np.zeros((3, n, n)) for k in NAMES}
    naks = {s: np.zeros((n, n)) for s in C.SYNDROMES}
    dst_busy = np.zeros(n)

    def link(i, j, c, nbytes, rate, msg):
        v = nbytes * rng.uniform(0.97, 1.03)
        msgs = np.ceil(v / msg)
        pk = msgs * np.ceil(msg / 4096)
        for k, x in (("bytes", v), ("message_bytes", v), ("timed_message_bytes", v), ("messages", msgs),
                     ("packets", pk), ("message_wire_seconds", 8 * v / rate), ("busy_seconds", 8 * v / rate)):
            d[k][c, i, j] += x
        d["bytes"][CONTROL, j, i] += 0.01 * v            # the ACKs back

    def alltoall(members, hot=None):
        for i in members:
            for j in members:
                if i != j:
                    link(i, j, CHUNK, 3e7 * (4.0 if j == hot else 1.0) * rng.uniform(0.5, 2.0) ** 0.1, 20e9, 65536)
        for j in members:
            dst_busy[j] = max(dst_busy[j], 1.0) + rng.uniform(0.5, 1.0)

    def ring(members, slow=None):
        for k, i in enumerate(members):
            j = members[(k + 1) % len(members)]
            link(i, j, BULK, 2e9 * rng.uniform(0.99, 1.01), 100e9 * (0.3 if i == slow else 1.0), 1 << 20)
            dst_busy[j] = max(dst_busy[j], d["busy_seconds"][BULK, i, j] * 1.05)

    it = iter(node.tolist())
    take = lambda k: [next(it) for _ in range(k)]           # noqa: E731
    ep = take(8)
    alltoall(ep, hot=ep[5])
    tp = take(6)
    ring(tp, slow=tp[2])
    victim, senders = take(1)[0], take(6)
    for s in senders:
        link(s, victim, CHUNK, 5e8, 10e9, 65536)
    dst_busy[victim] = 1.1 * max(d["busy_seconds"][CHUNK, s, victim] for s in senders)
    ring(senders + [victim])                               # a light ring over the incast's nodes
    a, b = take(2)
    link(a, b, CHUNK, 1e8, 10e9, 65536)
    link(b, a, CHUNK, 1e8, 10e9, 65536)
    d["ce_packets"][CHUNK, a, b] = 0.05 * d["packets"][CHUNK, a, b]
    d["cnp_packets"][CONTROL, b, a] = 2.5e6 * rng.uniform(1, 2)
    d["retransmitted_packets"][CHUNK, b, a] = 0.02 * d["packets"][CHUNK, b, a]
    d["psn_gaps"][CHUNK, b, a] = 3.0
    naks["psn_sequence_error"][a, b] = 7.0
    naks["rnr"][a, b] = 2.0
    rest = list(it)
    while len(rest) >= 8:
        g, rest = rest[:8], rest[8:]
        (alltoall if rng.random() < 0.5 else ring)(g)
    if len(rest) >= 2:
        ring(rest)
    src_busy = np.array([d["busy_seconds"][:2, i].sum() * 0.9 if d["bytes"][:2, i].any() else np.nan
                         for i in range(n)])
    truth = {"hot": ep[5], "slow": (tp[2], tp[3]), "victim": victim, "ce": (a, b), "retx": (b, a),
             "nak": (a, b), "cnp_to": a}
    return d, naks, dst_busy, src_busy, truth


def ips_of(n):
    return [f"10.{i >> 8}.{i & 255}.7" for i in range(n)]


def matrix(d, naks, dst_busy, src_busy, full=False, window_s=60.0):
    n = dst_busy.shape[0]
    pairs, by_class, nk = F.from_dense(d, naks, full=full)
    return C.FleetMatrix(ips=ips_of(n), pairs=pairs, by_class=by_class, naks=nk, dst_busy_seconds=dst_busy,
                         src_busy_seconds=src_busy, window_s=window_s, at=1.79e9, via_rules=False)


# ---- tests --------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [5, 8, 9, 64, 127, 128, 129, 300, 1031])
def test_row_and_column_sums_are_numpys_dense_sums(n):
    rng = np.random.default_rng(n)
    m = np.zeros((n, n))
    for i in range(n):
        k = int(rng.integers(0, min(n, 20) + 1))
        if rng.random() < 0.5:
            p0 = int(rng.integers(0, n - k + 1))
            cols = np.arange(p0, p0 + k)
        else:
            cols = rng.choice(n, k, replace=False)
        m[i, cols] = rng.random(k) * 10.0 ** rng.uniform(-3, 12, k)
    i, j = np.nonzero(m)
    p = F.Pairs(n, i, j)
    v = m[i, j]
    assert np.array_equal(p.row_sum(v), m.sum(axis=1))
    assert np.array_equal(p.col_sum(v), m.sum(axis=0))


@pytest.mark.parametrize("seed", range(4))
def test_definitions_match_the_dense_ones(seed):
    d, naks, dst_busy, src_busy, _ = fleet(160 + 37 * seed, seed)
    n = dst_busy.shape[0]
    chunk = d["bytes"][CHUNK].copy()
    bulk = d["bytes"][BULK].copy()
    rng = np.random.default_rng(seed)
    chunk[rng.integers(0, n, 30), rng.integers(0, n, 30)] = 5e6   # stray pairs: break some groups' density
    for m in (chunk, bulk):
        np.fill_diagonal(m, 0)
    i, j = np.nonzero(chunk + bulk)
    p = F.Pairs(n, i, j)
    pref = F.destination_preference(p, chunk[i, j])
    assert np.array_equal(pref, dense_preference(chunk), equal_nan=True)
    assert F.find_rings(p, bulk[i, j] > 0) == dense_rings(bulk > 0)
    groups = F.all_to_all_groups(p, chunk[i, j] > 0, np.zeros(len(p), dtype=bool))
    assert groups == dense_groups(chunk > 0) and groups


def _text(doc) -> str:
    doc["meta"].pop("query_seconds", None)
    return json.dumps(doc, sort_keys=True)


def test_findings_do_not_depend_on_which_zero_pairs_are_stored():
    """The same fleet as the pairs that exist and as all n x n pairs: the same document to
    the byte, naming every injected culprit."""
    d, naks, dst_busy, src_busy, t = fleet(200, 7)
    ips = ips_of(200)
    sparse, full = (matrix(d, naks, dst_busy, src_busy, full=f) for f in (False, True))
    assert len(sparse.pairs) < 0.05 * len(full.pairs) == 0.05 * 200 * 200
    docs = [C.build_document(fm, "http://prometheus:9090") for fm in (sparse, full)]
    assert _text(docs[0]) == _text(docs[1])
    doc = docs[0]
    first = {}
    for f in doc["findings"]:
        if f["severity"] in ("warning", "critical"):
            first.setdefault(f["kind"], []).append(f["entities"]["ips"][:2])
    assert [ips[t["hot"]]] in [x[:1] for x in first["hot_destination"]]
    assert [ips[t["slow"][0]], ips[t["slow"][1]]] in first["ring_straggler"]
    assert [ips[t["victim"]]] in [x[:1] for x in first["incast"]]
    assert [ips[x] for x in t["ce"]] in first["ecn_congestion"]
    assert [ips[x] for x in t["retx"]] in first["retransmissions"]
    assert [ips[x] for x in t["nak"]] in first["nak_errors"]
    assert ips[t["cnp_to"]] in [x[0] for x in first["cnp_storm"]]
    # the traffic matrix lists the data-carrying pairs (not n x n zeros), exactly the data bytes
    tm = doc["metrics"]["traffic_matrix"]
    data = d["bytes"][BULK] + d["bytes"][CHUNK]
    np.fill_diagonal(data, 0)
    i, j = np.nonzero(data)
    assert tm["src"] == i.tolist() and tm["dst"] == j.tolist() and tm["data_bytes"] == data[i, j].tolist()


class DenseProm(C.Prometheus):
    """Answers cluster's queries (--window all) from dense per-class matrices, one sample per
    (src, dst, class) that is nonzero, as `max by (src, dst, class)` would."""

    def __init__(self, d, naks, dst_busy, src_busy):
        super().__init__("http://127.0.0.1:1")
        self.d, self.naks, self.dst_busy, self.src_busy = d, naks, dst_busy, src_busy
        self.ips = ips_of(dst_busy.shape[0])

    def query(self, expr, at=None):
        def has(spec):
            return re.search(r"(?<![\w:])" + spec.name + r"(?!\w)", expr) is not None
        if has(M.LAST_READ_TIMESTAMP_SECONDS):
            return [({"node": "dpu1"}, 1.79e9)]
        for name, spec in C.PAIR_SERIES:
            if has(spec) and expr.startswith("max by (src, dst, class)"):
                c, i, j = np.nonzero(self.d[name])
                return [({"src": self.ips[a], "dst": self.ips[b], "class": C.CLASSES[k]}, float(self.d[name][k, a, b]))
                        for k, a, b in zip(c, i, j)]
        if has(M.PEER_NAKS):
            return [({"src": self.ips[a], "dst": self.ips[b], "class": "chunk", "syndrome": s}, float(m[a, b]))
                    for s, m in self.naks.items() for a, b in zip(*np.nonzero(m))]
        if has(M.DESTINATION_BUSY_SECONDS):
            return [({"dst": self.ips[a]}, float(v)) for a, v in enumerate(self.dst_busy) if v]
        if has(M.SOURCE_BUSY_SECONDS):
            return [({"src": self.ips[a]}, float(v)) for a, v in enumerate(self.src_busy) if np.isfinite(v)]
        return []


def test_fetch_builds_the_matrix_the_dense_numbers_describe():
    """Fetcher.fetch from a Prometheus holding the fleet: every stored value is the dense
    one at its pair, every pair not stored is zero in every class and syndrome, and the
    document equals the one of the full n x n matrix."""
    d, naks, dst_busy, src_busy, _ = fleet(60, 3)
    fm = C.Fetcher(DenseProm(d, naks, dst_busy, src_busy), "all").fetch()
    assert fm.ips == ips_of(60)            # every node sends: all of them, in address order
    p = fm.pairs
    for name in NAMES:
        dense = np.zeros((3, p.n, p.n))
        dense[:, p.src, p.dst] = fm.by_class[name]
        assert np.array_equal(dense, d[name]), name
    for s in C.SYNDROMES:
        dense = np.zeros((p.n, p.n))
        dense[p.src, p.dst] = fm.naks[s]
        assert np.array_equal(dense, naks[s]), s
    full = matrix(d, naks, dst_busy, src_busy, full=True, window_s=None)
    full.dpus, full.at = fm.dpus, fm.at
    assert _text(C.build_document(fm, "u")) == _text(C.build_document(full, "u"))
