"""What every detector family shares: the Emitter (Finding construction, --check filter),
message formatting and the robust outlier helpers."""
from __future__ import annotations

import numpy as np

from skewscope.analysis.detectors.registry import ONSET_FNS, Entities, Finding, Threshold
from skewscope.analysis.stats import median

#: the MAD floor of an outlier test (ns): a spread of start lags below 1 us is clock noise
#: and would make a few-us lag look like many MADs
MAD_FLOOR_NS = 1e3
#: a node-level timing fault is an outlier: at most this share of the nodes (>= 1)
OUTLIER_SHARE = 0.25


class Emitter:
    """Collects the Findings of one analysis; drops kinds not in `checks` and severity None."""

    def __init__(self, ctx, checks):
        self.ctx = ctx
        self.checks = checks
        self.out: list[Finding] = []

    def add(self, kind, severity, ips, message, evidence, flows=(), qps=None, group=None, impact=None,
            onset=None, since=None, until=None):
        """ips: node indices or IP strings (the blamed first; duplicates dropped); flows:
        flow indices; qps: default = the flows' dest QPs; impact: impact_of(...) or None;
        onset: an analysis.onset.Onset (ns), or since/until in seconds (the Finding's unit);
        neither: the generic onset (fill_onsets, after every detector ran)."""
        if kind not in self.checks or severity is None:
            return
        ips_out = []
        for x in ips:
            s = x if isinstance(x, str) else self.ctx.nodes.ips[int(x)]
            if s not in ips_out:
                ips_out.append(s)
        rows = np.asarray(flows, dtype=np.int64)
        if qps is None:
            qps = sorted(set(self.ctx.cols["dest_qp"][rows.reshape(-1)].tolist())) if len(rows) else []
        if onset is not None:
            since, until = onset.seconds()
        # entities.flows: the flows' keys, made for all findings at once (fill_flows)
        self.out.append(Finding(kind, severity, Entities(ips_out, [int(q) for q in qps], None if len(rows) else []),
                                evidence, message, group, impact, since, until, rows=rows))

    def fill_flows(self) -> None:
        """entities.flows of the findings added with flows: one Context.flow_keys over all
        their rows (hundreds of findings of a live interval: one call, not one each)."""
        todo = [f for f in self.out if f.entities.flows is None]
        if not todo:
            return
        rows = [f.rows.reshape(-1) for f in todo]
        keys = self.ctx.flow_keys(np.concatenate(rows))
        k = 0
        for f, r in zip(todo, rows):
            f.entities.flows = keys[k:k + len(r)]
            k += len(r)

    def add_fleet(self, kind, severity, ips, message, evidence, pairs=(), impact=None):
        """A fleet finding: ips as strings; pairs: (src, dst) node pairs, entities.flows
        [src, dst, null] as the cluster document's flows[] rows."""
        if kind not in self.checks or severity is None:
            return
        self.out.append(Finding(kind, severity, Entities(list(ips), [], [[a, b, None] for a, b in pairs]),
                                evidence, message, None, impact))

    def has(self, kind, pred=lambda f: True) -> bool:
        return any(f.kind == kind and pred(f) for f in self.out)

    def fill_onsets(self, inp=None) -> None:
        """The onset of the findings whose detector set no `since`: the kind's own late
        function (registry.ONSET_FNS, given the Inputs), else the generic one
        (registry.ONSET_FALLBACK): the first data record of the finding's flows (else their
        first packet), until null."""
        if inp is not None:
            for f in self.out:
                if f.since is None and f.kind in ONSET_FNS:
                    o = ONSET_FNS[f.kind][0](inp, f)
                    if o is not None and o.since_ns is not None:
                        f.since, f.until = o.seconds()
        todo = [f for f in self.out if f.since is None and f.rows is not None and len(f.rows)]
        if not todo:
            return
        ctx = self.ctx
        fs = ctx.__dict__.get("_fstat")          # the records' stats, only when already computed
        first = fs[0]["first_start"] if fs is not None else np.full(len(ctx.flows), np.nan)
        pkt = ctx.cols["first_ts"].astype(np.float64)
        for f in todo:
            r = f.rows
            t = first[r]
            t = t[np.isfinite(t)]
            if not len(t):
                t = pkt[r][ctx.cols["packets"][r] > 0]
            if len(t):
                f.since, f.until = float(t.min()) / 1e9, None


# ---- shared downlinks ------------------------------------------------------------------------
#: a node's downlink is shared when, while the group runs, data of other flows arrives at it
#: of at least this share of the group's own bytes into it (KV transfers into a TP decode
#: member): its ring links' slowness is the sharing, not its port
CROSS_SHARE = 0.25


def cross_loaded(ctx, g) -> np.ndarray:
    """Per node: data from flows outside the group arrives at it during the group's span, at
    least CROSS_SHARE x the group's own bytes into it."""
    n = ctx.nodes.n
    out = np.zeros(max(1, n), dtype=bool)
    gf = np.asarray(g.flows, dtype=np.int64)
    if not len(gf):
        return out
    fl = ctx.flows
    first, last = fl["first_ts"], fl["last_ts"]
    t0, t1 = float(first[gf].min()), float(last[gf].max())
    mine = np.zeros(len(fl), dtype=bool)
    mine[gf] = True
    other = ctx.data & ~mine & (last >= t0) & (first <= t1)
    dst = ctx.nodes.dst
    vol = np.asarray(ctx.volume, dtype=np.float64)
    own = np.bincount(dst[gf], weights=vol[gf], minlength=n)
    cross = np.bincount(dst[other], weights=vol[other], minlength=n)
    out[:n] = (own > 0) & (cross >= CROSS_SHARE * own)
    return out


def shared_successors(ctx, g, shared=None) -> set:
    """Indices (in g.members) of the members that send to a node whose downlink is shared
    (cross_loaded), or whose own downlink is: on the fabric vantage their messages are seen
    where the switch puts them on that downlink, queued behind the other traffic, and a
    member's clear-to-send from its successor queues on its own downlink (its data waits
    for it), so they look late without being slow."""
    if shared is None:
        shared = cross_loaded(ctx, g)
    gf = np.asarray(g.flows, dtype=np.int64)
    if not len(gf) or not shared.any():
        return set()
    out = set()
    src, dst = ctx.nodes.src[gf], ctx.nodes.dst[gf]
    for i, m in enumerate(g.members):
        d = dst[src == m]
        if shared[m] or (len(d) and shared[d].any()):
            out.add(i)
    return out


# ---- impact -------------------------------------------------------------------------------
#: the step-level blame of a persistent straggler (analysis.steps.persistent), shared by
#: ring_straggler and slow_tp_shard (docs/metrics.md "Steps and gates")
STEP_THRESHOLDS = (
    Threshold("last_share", 0.5, "fraction", "steps: last to send in at least this share of the steps that have a last member"),
    Threshold("min_steps", 8, "count", "steps: steps it was last in, at least"),
    Threshold("lag_jitter", 4.0, "ratio", "steps: its median lag per step / the step jitter (1.4826 x MAD of all step lags), at least"),
)


def impact_of(seconds_per_iter, period_s) -> dict | None:
    """A finding's `impact`: the estimated time lost per iteration / token (s) and its share
    of the period (lost / period, null when the period is unknown); None when the loss
    cannot be estimated (None, NaN or negative). docs/metrics.md "Impact" defines it per kind."""
    if seconds_per_iter is None:
        return None
    s = float(seconds_per_iter)
    if not np.isfinite(s) or s < 0:
        return None
    share = None
    if period_s is not None and np.isfinite(float(period_s)) and float(period_s) > 0:
        share = min(1.0, s / float(period_s))
    return {"seconds": s, "share": share}


def impact_key(f) -> float:
    """Sort key helper: a Finding's (or finding dict's) impact seconds, 0 when null."""
    imp = f.impact if hasattr(f, "impact") else f.get("impact")
    return float(imp["seconds"]) if imp and imp.get("seconds") is not None else 0.0


# ---- message formatting --------------------------------------------------------------------
def pct(x):
    return f"{100 * x:.1f}%" if x < 0.1 else f"{100 * x:.0f}%"


def us(ns):
    if ns >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    return f"{ns / 1e3:.0f} us"


def gbps(bps):
    return f"{bps / 1e9:.1f} Gb/s"


def sev(value, warn, crit, higher_is_worse=True):
    """critical / warning / None by two thresholds."""
    if higher_is_worse:
        if value >= crit:
            return "critical"
        if value >= warn:
            return "warning"
    else:
        if value <= crit:
            return "critical"
        if value <= warn:
            return "warning"
    return None


# ---- robust outliers -----------------------------------------------------------------------
def mad_threshold(vals, i, k_mad, floor):
    """Threshold for vals[i] to stand out: median + k * MAD of the others (>= floor)."""
    others = np.delete(vals, i)
    others = others[np.isfinite(others)]
    if len(others) == 0:
        return floor
    med = float(median(others))
    mad = float(median(np.abs(others - med)))
    return max(floor, med + k_mad * max(mad, MAD_FLOOR_NS))


def lag_outliers(lags, k_mad, floor_ns):
    """[(member index, lag ns)] whose lag stands out from the others' (mad_threshold)."""
    out = []
    if lags is None:
        return out
    lags = np.asarray(lags, dtype=np.float64)
    for i, v in enumerate(lags):
        if not np.isfinite(v):
            continue
        if v >= mad_threshold(lags, i, k_mad, floor_ns):
            out.append((i, float(v)))
    return out


def few(k: int, n: int) -> bool:
    """A node-level timing fault is an outlier: at most a quarter of the nodes (>= 1)."""
    return k <= max(1, int(n * OUTLIER_SHARE))


def irregular(em, what: str, group):
    """Timing faults everywhere at once are the capture's, not the nodes': say so once."""
    if em.has("sampling", lambda f: f.evidence.get("irregular_timing")):
        return
    em.add("sampling", "info", [],
           f"{what}: the message timing is irregular across the capture (batched delivery or "
           "pacing on the capture/replay path?), so node-level stall and flap findings are withheld",
           {"irregular_timing": True}, group=group)


# ---- grouping flows ------------------------------------------------------------------------
def split_by(flows, key, members) -> dict:
    """{member: [flows whose key is that member]} in one sort."""
    o = np.argsort(key, kind="stable")
    ks, fs = key[o], flows[o]
    out = {}
    for m in members:
        a, b = np.searchsorted(ks, m), np.searchsorted(ks, m, side="right")
        out[m] = fs[a:b].tolist()
    return out


def group_by_node(ctx, flows):
    """Greedy: repeatedly take the node (as destination, then as source) shared by most of
    the remaining flows (counts kept up to date, not recounted per group)."""
    rest = np.asarray(flows, dtype=np.int64)
    out = []
    if not len(rest):
        return out
    nn = ctx.nodes.n
    dn = ctx.nodes.dst[rest].astype(np.int64)
    sn = ctx.nodes.src[rest].astype(np.int64)
    d = np.bincount(dn, minlength=nn)
    s_ = np.bincount(sn, minlength=nn)
    od, os_ = np.argsort(dn, kind="stable"), np.argsort(sn, kind="stable")
    offd = np.searchsorted(dn[od], np.arange(nn + 1))
    offs = np.searchsorted(sn[os_], np.arange(nn + 1))
    alive = np.ones(len(rest), dtype=bool)
    left = len(rest)
    while left:
        if d.max() >= s_.max():
            n = int(d.argmax())
            idx, role = od[offd[n]:offd[n + 1]], "into"
        else:
            n = int(s_.argmax())
            idx, role = os_[offs[n]:offs[n + 1]], "from"
        idx = idx[alive[idx]]              # positions in `flows` order (stable sorts)
        out.append((n, role, rest[idx].tolist()))
        alive[idx] = False
        np.subtract.at(d, dn[idx], 1)
        np.subtract.at(s_, sn[idx], 1)
        left -= len(idx)
    return out


def by_pair(ctx, flows):
    """Flows grouped by directed node pair: [(src node, dst node, [flows])]."""
    flows = np.asarray(flows, dtype=np.int64)
    if len(flows) == 0:
        return []
    key = ctx.nodes.src[flows].astype(np.int64) * max(1, ctx.nodes.n) + ctx.nodes.dst[flows]
    o = np.argsort(key, kind="stable")
    k, f = key[o], flows[o]
    cuts = np.nonzero(np.diff(k))[0] + 1
    return [(int(ctx.nodes.src[g[0]]), int(ctx.nodes.dst[g[0]]), g.tolist()) for g in np.split(f, cuts)]


def qp_list(ctx, flows):
    return ", ".join(str(int(q)) for q in ctx.flows["dest_qp"][flows][:4]) + (" ..." if len(flows) > 4 else "")


def ce_explained(inp, flows) -> bool:
    """Most of these flows' packets are CE-marked: slowness explained by ECN congestion."""
    if not len(flows):
        return False
    fl = np.asarray(flows, dtype=np.int64)
    return bool(median(inp.congestion["ce_fraction"][fl]) >= inp.th["ecn_congestion"]["warning"])
