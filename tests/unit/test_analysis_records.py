"""The per-record passes of the analysis against independent numpy references on random
inputs: flows.flow_event_stats (per-flow sums in record order, each flow's records taken
with np.nonzero, np.median for the rates), hashing.count_u64 (np.unique with counts),
Context.data_events, stats.counted_median (np.median), inference.prefill_split (its
definition over the records), steps.member_summary (np.isin) and steps._dep_distance (its
numpy form). Edge cases: no records, one record, ties, starts out of order within a flow,
flow rows out of range, READ data (opclass 3) and other opclasses, zero bytes, packets at
one timestamp."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from skewscope.analysis import context
from skewscope.analysis.flows import FSTAT_DTYPE, MTU_CANDIDATES, STRETCH, flow_event_stats
from skewscope.analysis.hashing import count_u64
from skewscope.analysis.inference import prefill_split
from skewscope.analysis.stats import counted_median
from skewscope.analysis.steps import _best_segment, _dep_distance, member_summary
from skewscope.core import layout as L
from skewscope.core.snapshot import Snapshot


def _records(rng, n, nf, unsorted=False):
    ev = np.zeros(n, dtype=L.EVENT_DTYPE)
    ev["flow"] = rng.integers(-1, nf + 1, n) if nf else -1       # -1 and nf: out of range
    ev["opclass"] = rng.choice([0, 1, 1, 1, 2, 3, 4], n)
    # few distinct sizes (ties), multi-packet and single-packet ones, 0 bytes
    ev["bytes"] = rng.choice([0, 100, 256, 4096, 4097, 65536, 1 << 20, 3 * 1000], n)
    st = np.sort(rng.integers(0, 10**7, n)) if not unsorted else rng.integers(0, 10**7, n)
    dur = rng.choice([0, 0, 500, 2000, 40000], n)                 # 0: packets at one timestamp
    ev["start_ts"] = st
    ev["end_ts"] = st + dur
    return ev


def _flows(rng, nf, ev):
    fl = np.zeros(nf, dtype=L.FLOW_DTYPE)
    for f in range(nf):
        own = ev[ev["flow"] == f]
        dat = own[(own["opclass"] == 0) | (own["opclass"] == 1)]
        pk = np.maximum(1, -(-dat["bytes"].astype(np.int64) // int(rng.choice(MTU_CANDIDATES))))
        fl["op"][f, L.OPC_WRITE] = int(pk.sum()) if rng.random() < 0.9 else 0
    return fl


def _npk(b, mtu):
    return max(1, -(-int(b) // int(mtu)))


def _reference(ev, nf, req):
    """Each flow's records in record order (np.nonzero), the flows.py definitions."""
    out = np.zeros(nf, dtype=FSTAT_DTYPE)
    for f in range(nf):
        r = ev[np.nonzero(ev["flow"] == f)[0]]
        o = out[f:f + 1]
        by = [int(x) for x in r["bytes"]]
        s = [float(x) for x in r["start_ts"]]
        t = [float(x) for x in r["end_ts"]]
        op = [int(x) for x in r["opclass"]]
        rec = dat_b = 0.0
        for b in by:
            rec += b
        sw = [i for i in range(len(r)) if op[i] in (0, 1)]
        data = [i for i in range(len(r)) if op[i] in (0, 1, 3)]
        for i in data:
            dat_b += by[i]
        mtu = int(MTU_CANDIDATES[-1])
        if data and req[f] > 0:
            cnt = {int(m): sum(_npk(by[i], m) for i in sw) for m in MTU_CANDIDATES}
            mtu = min(reversed(list(cnt)), key=lambda m: abs(cnt[m] - int(req[f])))
        multi = [i for i in sw if _npk(by[i], mtu) >= 2 and t[i] - s[i] > 0]
        flat = [i for i in sw if _npk(by[i], mtu) >= 2 and t[i] - s[i] <= 0]
        mb = wire = span = gaps = 0.0
        rates = []
        for i in multi:
            k = _npk(by[i], mtu)
            d = t[i] - s[i]
            w = d * k / (k - 1)
            mb += by[i]
            wire += w
            span += d
            gaps += k - 1
            rates.append(by[i] / w)
        pkt = span / gaps if gaps > 0 else 0.0
        busy, cs, ce = 0.0, -1.0, -1.0
        for i in range(len(r)):
            a, b = s[i], t[i] + pkt
            if cs < 0:
                cs, ce = a, b
            elif a > ce:
                busy += ce - cs
                cs, ce = a, b
            elif b > ce:
                ce = b
        if cs >= 0:
            busy += ce - cs
        med = float(np.median(rates)) if rates else np.nan
        stall_n, stall, smax = 0, 0.0, 0.0
        if len(rates) >= 3 and med > 0:
            for i in multi:
                k = _npk(by[i], mtu)
                w = (t[i] - s[i]) * k / (k - 1)
                exp = by[i] / med
                if w >= STRETCH * exp:
                    stall_n += 1
                    stall += w - exp
                    smax = max(smax, w - exp)
        o["n_rec"], o["rec_bytes"], o["n_data"], o["data_bytes"] = len(r), rec, len(data), dat_b
        o["n_multi"], o["multi_bytes"], o["wire_ns"], o["mtu"], o["pkt_ns"] = len(multi), mb, wire, mtu, pkt
        o["rate_bps"] = mb * 8e9 / wire if wire > 0 else np.nan
        o["busy_ns"] = busy
        o["first_start"] = min(s) if len(r) else np.nan
        o["last_end"] = max(t) if len(r) else np.nan
        o["stall_n"], o["stall_ns"], o["stall_max_ns"], o["n_flat"] = stall_n, stall, smax, len(flat)
        o["rate_med_bps"] = med * 8e9 if rates else np.nan
    return out


@pytest.mark.parametrize("seed,n,nf,unsorted", [(0, 0, 4, False), (1, 1, 1, False), (2, 1, 3, False),
                                                 (3, 40, 1, False), (4, 500, 7, False), (5, 500, 7, True),
                                                 (6, 3000, 40, False), (7, 30, 0, False),
                                                 # one to three records a flow (the median's short cuts)
                                                 (8, 60, 30, False), (9, 90, 60, True), (10, 200, 90, False)])
def test_flow_event_stats_equal_reference(seed, n, nf, unsorted):
    rng = np.random.default_rng(seed)
    ev = _records(rng, n, nf, unsorted)
    fl = _flows(rng, nf, ev)
    snap = Snapshot(fl, ev, np.zeros(L.G_N, np.uint64), {})
    st, order, off = flow_event_stats(snap)
    req = (fl["op"][:, L.OPC_SEND] + fl["op"][:, L.OPC_WRITE]).astype(np.int64)
    ref = _reference(ev, nf, req)
    for name in FSTAT_DTYPE.names:                       # bit for bit, NaN where NaN
        np.testing.assert_array_equal(st[name], ref[name], err_msg=name)
    # the grouping by flow: each flow's records in record order
    for f in range(nf):
        np.testing.assert_array_equal(order[off[f]:off[f + 1]], np.nonzero(ev["flow"] == f)[0])


@pytest.mark.parametrize("seed,n", [(0, 0), (1, 1), (2, 7), (3, 5000), (4, 100000)])
def test_count_u64_equals_unique(seed, n):
    rng = np.random.default_rng(seed)
    ev = np.zeros(n, dtype=L.EVENT_DTYPE)
    # many distinct values (the table grows), ties, values above 2**63
    ev["bytes"] = rng.choice(np.concatenate([rng.integers(0, 1 << 62, 3000, dtype=np.uint64) * 2,
                                             np.array([0, 1, 1 << 63, (1 << 64) - 1], dtype=np.uint64)]), n)
    for mask in (np.ones(n, bool), np.zeros(n, bool), rng.random(n) < 0.3):
        v, c = count_u64(ev["bytes"], mask)                # the strided field as it lies
        u, uc = np.unique(ev["bytes"][mask], return_counts=True)
        o = np.argsort(v)
        np.testing.assert_array_equal(v[o], u)
        np.testing.assert_array_equal(c[o], uc)
        # order of first appearance
        first = [int(np.nonzero(mask & (ev["bytes"] == x))[0][0]) for x in v]
        assert first == sorted(first)


def test_data_events_equal_numpy():
    rng = np.random.default_rng(9)
    nf = 12
    ev = _records(rng, 4000, nf)
    fl = _flows(rng, nf, ev)
    ctx = context(Snapshot(fl, ev, np.zeros(L.G_N, np.uint64), {}))
    for flows in ([], [0], [3, 3, 5], list(range(nf))):
        fm = np.zeros(nf, bool)
        fm[flows] = True
        want = ctx.ev_data & (ctx.ev_flow >= 0) & fm[np.clip(ctx.ev_flow, 0, nf - 1)]
        np.testing.assert_array_equal(ctx.data_events(flows), want)


@pytest.mark.parametrize("seed", range(6))
def test_counted_median_equals_np_median(seed):
    rng = np.random.default_rng(seed)
    for n in (1, 2, 3, 4, 7, 100, 1001):
        for dtype in (np.uint64, np.int64):
            pool = rng.integers(0, 1 << 62, 5) if seed % 2 else np.array([1, 2, 3, 4096, 65536])
            x = rng.choice(pool, n).astype(dtype)                  # ties; large values round in float
            u, c = np.unique(x, return_counts=True)
            assert counted_median(u, c) == np.median(x)
    assert np.isnan(counted_median(np.zeros(0, np.int64), np.zeros(0, np.int64)))


@pytest.mark.parametrize("seed", range(4))
def test_prefill_split_equals_numpy(seed):
    """The prefill split from the counted sizes against its definition over the records."""
    rng = np.random.default_rng(seed)
    nf = 6
    ev = _records(rng, [5, 2000, 2000, 9][seed], nf)
    if seed == 2:
        ev["bytes"] = rng.choice([4096, 8192], len(ev))          # no message 8 x the median
    fl = _flows(rng, nf, ev)
    fl["op"][:, L.OPC_WRITE] += 1
    fl["messages"] = 1
    fl["msg_bytes"] = 1 << 20
    ctx = context(Snapshot(fl, ev, np.zeros(L.G_N, np.uint64), {}))
    for flows in ([0, 1, 2, 3, 4, 5], [1, 4], [2]):
        ok = ctx.data_events(flows)
        by = ev["bytes"]
        want = (None, None)
        if ok.sum() >= 8:
            thr = max(65536, 8 * float(np.median(by[ok])))
            big = ok & (by >= thr)
            if 0 < big.sum() < ok.sum():
                want = (big, thr)
        big, thr = prefill_split(ctx, flows)
        assert thr == want[1]
        if big is None:
            assert want[0] is None
        else:
            np.testing.assert_array_equal(big, want[0])


@pytest.mark.parametrize("seed", range(5))
def test_member_summary_equals_numpy(seed):
    """member_summary against its definition (iterations of the selected columns by np.isin /
    np.unique; every column: its per-matrix part kept in the steps dict, asked for each member)."""
    rng = np.random.default_rng(seed)
    nm, ncol = 4, [1, 5, 60, 200, 33][seed]
    col_it = np.sort(rng.integers(0, 9, ncol)) if seed % 2 else rng.integers(0, 9, ncol)   # unsorted too
    iters = np.unique(col_it)
    steps = {"last": rng.integers(-1, nm, ncol), "waited": rng.random(ncol) < 0.5,
             "lag_ns": rng.random((nm, ncol)) * 1e4, "col_iteration": col_it, "iterations": iters,
             "lost_ns": rng.random((len(iters), nm)), "gates": rng.integers(-1, nm, len(iters))}
    for cols in (None, rng.random(ncol) < 0.4, np.zeros(ncol, bool)):
        for m in range(nm):
            sel = np.ones(ncol, bool) if cols is None else cols
            its = np.isin(iters, np.unique(col_it[sel]))
            mine = (steps["last"] == m) & sel
            got = member_summary(steps, m, cols)
            lost = steps["lost_ns"][its, m]
            assert got["lost_per_iteration_ns"] == (float(np.median(lost)) if len(lost) else 0.0)
            assert got["steps_per_iteration"] == float(mine.sum()) / max(1, int(its.sum()))
            assert got["gated"] == int((steps["gates"][its] == m).sum())
            with_last = int((((steps["last"] >= 0) | steps["waited"]) & sel).sum())
            lag = steps["lag_ns"][m, mine]
            assert (got["last_steps"], got["steps_with_last"]) == (int(mine.sum()), with_last)
            assert got["last_share"] == (float(mine.sum()) / with_last if with_last else 0.0)
            assert got["lag_ns"] == (float(np.median(lag)) if len(lag) else 0.0)


@pytest.mark.parametrize("seed", range(6))
def test_dep_distance_equals_numpy(seed):
    """steps._dep_distance against its numpy form (the share of the comparisons by np.mean)."""
    rng = np.random.default_rng(seed)
    na, nm, k = [(1, 2, 1), (1, 2, 2), (3, 4, 8), (5, 3, 40), (2, 8, 70), (0, 2, 5)][seed]
    # d channels side by side: each column starts after the one d back is past its midpoint
    d0 = 1 + seed % 4
    S = np.cumsum(rng.random((na, nm, k)) * 10, axis=2)
    S[:, :, d0:] = np.maximum(S[:, :, d0:], S[:, :, :-d0] + 6 * rng.random((na, nm, k - d0)))
    E = S + rng.random((na, nm, k)) * 12

    def ref(S, E, dmax=64):
        for d in range(1, min(S.shape[2], dmax + 1)):
            with warnings.catch_warnings(), np.errstate(invalid="ignore"):
                warnings.simplefilter("ignore", RuntimeWarning)      # no iterations: NaN
                if float(np.mean(S[:, :, d:] >= 0.5 * (S[:, :, :-d] + E[:, :, :-d]))) >= 0.9:
                    return d
        return 1
    for dmax in (64, 2):
        assert _dep_distance(S, E, dmax) == ref(S, E, dmax)


def _best_segment_numpy(z, p):
    """The maximum-subarray segment by numpy prefix sums (the form _best_segment had)."""
    c = np.concatenate([[0.0], np.cumsum(np.asarray(z, dtype=np.float64) - p)])
    lo = np.minimum.accumulate(c[:-1])
    gain = c[1:] - lo
    b = int(np.argmax(gain))
    if gain[b] <= 0:
        return None
    return int(np.argmax(c[:b + 1] == lo[b])), b


@pytest.mark.parametrize("seed", range(4))
def test_best_segment_equals_numpy(seed):
    """steps._best_segment (one-pass kernel) against the numpy prefix-sum form, ties included."""
    rng = np.random.default_rng(seed)
    for n in (1, 2, 3, 7, 50, 333, 4000):
        for share in (0.05, 0.3, 0.5, 0.9):
            z = (rng.random(n) < share).astype(np.float64)
            for p in (0.0, 0.25, 0.5, 0.75, 1.0, 1 / 3):
                assert _best_segment(z, p) == _best_segment_numpy(z, p), (n, share, p)
    for z in (np.zeros(5), np.ones(5), np.array([1.0, 0.0, 1.0, 0.0, 1.0])):
        assert _best_segment(z, 0.5) == _best_segment_numpy(z, 0.5)
    assert _best_segment(np.zeros(0), 0.5) is None
