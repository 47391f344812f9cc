"""Fleet detectors on node-level matrices (`skewscope cluster`, analysis/fleet.py has the
matrix definitions): the same finding kinds and Finding schema as the single-node path,
entities.ips = IP strings (the blamed node first), entities.flows = the node pairs
[src, dst, null] as in the cluster document's flows[] rows, qps = [], group = null.

Where a fleet detector asks the single-node question it reads the single-node threshold
(hot_destination.warning/critical, ring_straggler.warning/critical, incast.min_senders/
ratio); its own numbers are registered as `extra` thresholds (scope fleet)."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from skewscope.analysis.detectors.common import Emitter, impact_of
from skewscope.analysis.detectors.registry import Detector, Threshold, detectors, kinds, resolve_thresholds
from skewscope.analysis.incidents import assign as assign_incidents
from skewscope.analysis.fleet import (
    all_to_all_groups,
    bound_at_or_below,
    bucket_quantile,
    class_bytes,
    count_gt,
    count_le,
    destination_preference,
    find_rings,
    fmt_bps,
    rate_over_active,
    safe_div,
    upstream_cycles,
)
from skewscope.analysis.stats import median, nanmedian, robust_ratio_to_median, skew_rows, skew_stats


def _bound_below(bounds, x: float) -> float:
    """The largest bucket bound < x (x itself when none is)."""
    b = [v for v in bounds if v < x]
    return float(b[-1]) if b else float(x)


def _mean(h) -> float:
    return float(h[2] / h[1][-1]) if h is not None and h[1][-1] > 0 else float("nan")


def _count(h) -> float:
    return float(h[1][-1]) if h is not None else 0.0


# the per-node timing roles of a ring topology (one upstream, one downstream per member)
RING_ROLES = ("ring", "tp_decode")


def _iterations(e) -> float:
    return float(e.get("iterations") or 0.0) + float(e.get("steps") or 0.0) * 1e-9


def _q(h, q) -> float | None:
    v = bucket_quantile(h[0], h[1], q) if h is not None else float("nan")
    return float(v) if np.isfinite(v) else None


def _f(v):
    return None if v is None or not np.isfinite(v) else float(v)


@dataclass
class FleetInputs:
    """A FleetMatrix, the thresholds, and the document parts the detectors fill."""
    fm: Any                                    # outputs.cluster.FleetMatrix
    th: dict
    metrics: dict = field(default_factory=dict)
    collectives: list = field(default_factory=list)
    timing: dict | None = None

    @cached_property
    def ips(self):
        return self.fm.ips

    @cached_property
    def pairs(self):
        """fleet.Pairs: every per-pair quantity below is a vector over these."""
        return self.fm.pairs

    @cached_property
    def pos(self) -> dict:
        return {ip: i for i, ip in enumerate(self.ips)}

    @cached_property
    def chunk_b(self):
        return class_bytes(self.fm, "chunk")

    @cached_property
    def bulk_b(self):
        return class_bytes(self.fm, "bulk")

    @cached_property
    def data_b(self):
        return self.bulk_b + self.chunk_b

    @cached_property
    def timing_groups(self) -> list[dict]:
        """Groups from the DPUs' own per-node timing: rings (ring, tp_decode) = cycles of
        each member's upstream; all-to-all = members connected through their peers."""
        tm = getattr(self.fm, "timing", None) or {}
        out = []
        # ring and tp_decode are one topology (each member receives from one upstream and
        # sends to one downstream); which one a DPU calls its group is decided from its own
        # view, and a slow member's own view can blur the compute gap that makes it decode.
        # So the cycle is built over both, and the group's role is its members' majority
        # (a tie goes to tp_decode: only decode has the gap that says so)
        up, role_of = {}, {}
        for (ip, r), e in tm.items():
            if r not in RING_ROLES or not e["peers"]:
                continue
            if ip in role_of and _iterations(tm[(ip, role_of[ip])]) >= _iterations(e):
                continue
            role_of[ip] = r
            up[ip] = max(e["peers"], key=lambda p: _count(e["peers"][p].get("arrival")))
        for cyc in upstream_cycles(up):
            votes = [role_of[ip] for ip in cyc]
            role = "tp_decode" if votes.count("tp_decode") * 2 >= len(votes) else "ring"
            out.append({"role": role, "members": cyc})
        a2a = {ip: set(e["peers"]) for (ip, r), e in tm.items() if r == "alltoall"}
        seen = set()
        for a in sorted(a2a):
            if a in seen:
                continue
            comp, stack = [], [a]
            seen.add(a)
            while stack:
                x = stack.pop()
                comp.append(x)
                for y in a2a.get(x, ()):
                    if y in a2a and y not in seen:
                        seen.add(y)
                        stack.append(y)
            if len(comp) >= 2:
                out.append({"role": "alltoall", "members": sorted(comp, key=lambda v: self.pos.get(v, 1 << 30))})
        return out

    def entry(self, ip, role):
        """The DPU of `ip`'s timing for its group of `role`; for a ring-like group, the
        member's entry under the other ring-like role when its own DPU named it so."""
        tm = getattr(self.fm, "timing", None) or {}
        e = tm.get((ip, role))
        if e is None and role in RING_ROLES:
            e = next((tm[(ip, r)] for r in RING_ROLES if r != role and (ip, r) in tm), None)
        return e

    def exported_by(self, a: str, c: str, klass: str) -> float:
        return float((getattr(self.fm, "exported_by", None) or {}).get((a, c, klass), 0.0))

    @cached_property
    def data_sent(self):
        """Per source node: (message bytes, packets, messages) of its data classes (bulk,
        chunk) to other nodes. Once per run: a per-group recomputation made `cluster` cubic in
        the fleet's size (tools/bench/bench_fleet.py)."""
        out = []
        p = self.pairs
        for name in ("message_bytes", "packets", "messages"):
            m = self.fm.cls(name, "bulk") + self.fm.cls(name, "chunk")
            own = np.zeros(p.n)
            own[p.src[p.diag]] = m[p.diag]
            out.append(p.row_sum(m) - own)
        return tuple(out)

    @cached_property
    def hot_b(self):
        # over the all-to-all (chunk) traffic when there is any: ring/tree volumes are equal
        # by construction and would only dilute an expert's skew; else over all data
        return self.chunk_b if self.chunk_b.sum() > 0 else self.data_b


def hot_destination(inp, em):
    ips, th, n, pr = inp.ips, inp.th, len(inp.ips), inp.pairs
    hot_b = inp.hot_b
    inbound = pr.col_sum(hot_b)
    outbound = pr.row_sum(hot_b)
    recv = np.nonzero(inbound > 0)[0]
    dst_stats = skew_stats(inbound[recv]) if len(recv) else skew_stats([])
    # the pairs that carry data (a dense n x n list would be quadratic in the fleet)
    nz = np.nonzero(inp.data_b > 0)[0]
    inp.metrics["traffic_matrix"] = {"ips": ips, "src": pr.src[nz].tolist(), "dst": pr.dst[nz].tolist(),
                                     "data_bytes": inp.data_b[nz].tolist()}
    inp.metrics["destination_skew"] = dst_stats
    inp.metrics["source_skew"] = skew_stats(outbound[outbound > 0])
    pref = destination_preference(pr, hot_b)
    inp.metrics["destination_preference"] = {ips[j]: float(pref[j]) for j in range(n) if np.isfinite(pref[j])}
    t = th["hot_destination"]
    if len(recv) >= t["min_nodes"] and np.isfinite(pref).any():
        j = int(np.nanargmax(pref))
        p = float(pref[j])
        if p >= t["warning"]:
            hot = ips[j]
            share = float(inbound[j] / inbound.sum()) if inbound.sum() > 0 else None
            col = pr.column(j)
            srcs = pr.src[col[hot_b[col] > 0]]
            em.add_fleet("hot_destination", "critical" if p >= t["critical"] else "warning", [hot],
                         f"hot destination {hot}: a typical source sends it {p:.2f}x what it sends each other "
                         f"node ({len(srcs)} sources); in a MoE job, the node of a hot expert",
                         {"preference": p, "inbound_share": share, "inbound_max_over_mean": dst_stats["max_over_mean"],
                          "senders": int(len(srcs)), "destinations": len(recv),
                          "traffic": "chunk" if hot_b is inp.chunk_b else "data"},
                         pairs=[(ips[i], hot) for i in srcs])


def alltoall(inp, em):
    ips = inp.ips
    chunk_b = inp.chunk_b
    t = inp.th["alltoall_destination_skew"]
    for g in all_to_all_groups(inp.pairs, chunk_b > 0, np.zeros(len(chunk_b), dtype=bool)):
        sub = inp.pairs.block(chunk_b, g)
        mask = ~np.eye(len(g), dtype=bool)
        rows = skew_rows(sub, mask)
        col = skew_stats(sub.sum(axis=0))
        send = member_send_rates(inp, g)
        inp.collectives.append({"kind": "all_to_all", "members": [ips[i] for i in g],
                                "confidence": alltoall_confidence(inp, g),
                                "metrics": {"destination_skew": col, "per_source_max_over_mean":
                                            [r["max_over_mean"] for r in rows],
                                            "member_send_rate_bps": [None if not np.isfinite(x) else float(x)
                                                                     for x in send]}})
        alltoall_stragglers(inp, em, g)
        worst = [(r["max_over_mean"] or 0.0, k, r) for k, r in enumerate(rows)
                 if (r["n"] or 0) >= t["min_destinations"]]
        skewed = [w for w in worst if w[0] >= t["max_over_mean"]]
        if skewed:
            # the destination most sources over-send to
            hot_cols = [g[int(r["argmax"])] for _, _, r in skewed]
            hot = max(set(hot_cols), key=hot_cols.count)
            srcs = [ips[g[k]] for _, k, _ in skewed]
            top = max(w[0] for w in skewed)
            em.add_fleet("alltoall_destination_skew", "warning", [ips[hot]] + [s for s in srcs if s != ips[hot]],
                         f"all-to-all destination skew up to {top:.2f}x: {len(skewed)} of {len(g)} sources send "
                         f"most to {ips[hot]}",
                         {"max_over_mean": top, "sources_skewed": len(skewed), "sources": len(g),
                          "hot_destination": ips[hot], "group": [ips[i] for i in g]},
                         pairs=[(s, ips[hot]) for s in srcs if s != ips[hot]])


def member_send_rates(inp, members):
    """Per member: its send rate over its own active time, 8 x the bytes of its data messages
    (bulk and chunk, to anyone) / its source busy time (skewscope_source_busy_seconds: the
    union of its outgoing data messages, from its own DPU), NaN where no DPU exported it or
    its messages average < MIN_PKTS_PER_MSG packets (a rate over 1-2 packets is the
    timestamps' granularity); the single-node straggler's send throughput over active time."""
    sb = getattr(inp.fm, "src_busy_seconds", None)
    out = np.full(len(members), np.nan)
    if sb is None:
        return out
    mb, pk, ms = inp.data_sent
    for x, i in enumerate(members):
        busy = float(sb[i]) if np.isfinite(sb[i]) else 0.0
        msgs = float(ms[i])
        if busy > 0 and msgs > 0 and float(pk[i]) / msgs >= MIN_PKTS_PER_MSG:
            out[x] = 8.0 * float(mb[i]) / busy
    return out


def alltoall_stragglers(inp, em, g):
    """straggler: an all-to-all member whose send rate over its active time is <= the
    single-node straggler's warning (critical) x the members' median (>= 3 members rated)."""
    ips = inp.ips
    t = inp.th["straggler"]
    rate = member_send_rates(inp, g)
    if np.isfinite(rate).sum() < MIN_RING_LINKS:
        return
    med = float(nanmedian(rate))
    if med <= 0:
        return
    ratio = rate / med
    k = int(np.nanargmin(ratio))
    r = float(ratio[k])
    if r <= t["warning"]:
        a = g[k]
        em.add_fleet("straggler", "critical" if r <= t["critical"] else "warning",
                     [ips[a]] + [ips[x] for x in g if x != a],
                     f"all-to-all straggler {ips[a]}: sends at {r:.2f}x the members' median rate over active time "
                     f"({fmt_bps(rate[k])} vs {fmt_bps(med)}); every rank waits for its data: check that host's "
                     f"GPU/NIC (clocks, PCIe, thermal) or its uplink",
                     {"send_ratio": r, "rate_bps": float(rate[k]), "median_rate_bps": med,
                      "group": [ips[x] for x in g], "members_rated": int(np.isfinite(rate).sum())},
                     pairs=[(ips[a], ips[x]) for x in g if x != a and inp.pairs.at(inp.data_b, a, x) > 0])


#: a ring straggler is judged against the ring's median only with at least this many links
MIN_RING_LINKS = 3
#: a rate over active time is judged only when the pair's messages have >= this many packets
#: (mean): over 1-2 packets it is the capture's timestamp granularity (as rings.MIN_PKTS_PER_MSG)
MIN_PKTS_PER_MSG = 3


def _pkts_per_msg(fm, klass: str) -> np.ndarray:
    return safe_div(fm.cls("packets", klass), fm.cls("messages", klass))


def _on_links(p, v, links) -> np.ndarray:
    """v (a ratio per pair) on each link; NaN on a link that carries nothing (0 / 0)."""
    k = p.find([a for a, _ in links], [c for _, c in links])
    return np.where(k >= 0, np.asarray(v)[np.maximum(k, 0)] if len(v) else np.nan, np.nan)


def _rings(inp):
    """[(members, traffic class)]: cycles of the bulk pairs (ring/tree SIMPLE slices), then,
    among the other nodes, cycles of >= 3 chunk pairs (rings of smaller messages: NCCL
    rings of many ranks or channels, LL/LL128 rings, other libraries' rings, perftest)."""
    p = inp.pairs
    out = [(r, "bulk") for r in find_rings(p, inp.bulk_b > 0)]
    used = np.zeros(p.n, dtype=bool)
    used[[i for r, _ in out for i in r]] = True
    chunk = (inp.chunk_b > 0) & ~used[p.src] & ~used[p.dst]
    out += [(r, "chunk") for r in find_rings(p, chunk) if len(r) >= MIN_RING_LINKS]
    return out


def rings(inp, em):
    ips = inp.ips
    t = inp.th["ring_straggler"]
    rates = {k: rate_over_active(inp.fm, k) for k in ("bulk", "chunk")}
    ppm = _pkts_per_msg(inp.fm, "chunk")          # once: per ring it was quadratic in the fleet
    roles = {tuple(sorted(g["members"])): g["role"] for g in inp.timing_groups}
    for ring, klass in _rings(inp):
        links = [(ring[k], ring[(k + 1) % len(ring)]) for k in range(len(ring))]
        rate = rates[klass]
        lr = _on_links(inp.pairs, rate, links)
        if klass == "chunk":
            # small messages: a link's rate only where its messages span several packets
            lr = np.where(_on_links(inp.pairs, ppm, links) >= MIN_PKTS_PER_MSG, lr, np.nan)
        score = robust_ratio_to_median(lr)
        med = float(nanmedian(lr)) if np.isfinite(lr).any() else None
        metrics = {"link_rate_bps": [None if not np.isfinite(x) else float(x) for x in lr],
                   "median_rate_bps": med,
                   "straggler_score": [None if not np.isfinite(x) else float(x) for x in score]}
        if klass == "chunk":
            metrics["traffic_class"] = "chunk"
            role = roles.get(tuple(sorted(ips[i] for i in ring)))
            if role:
                metrics["role"] = role
        inp.collectives.append({"kind": "ring_allreduce", "members": [ips[i] for i in ring],
                                "confidence": ring_confidence(inp, ring, klass), "metrics": metrics})
        judged = np.isfinite(score).any() if klass == "bulk" else np.isfinite(score).sum() >= MIN_RING_LINKS
        if len(ring) >= MIN_RING_LINKS and judged:
            k = int(np.nanargmin(score))
            s = float(score[k])
            if s < t["warning"]:
                a, c = links[k]
                em.add_fleet("ring_straggler", "critical" if s < t["critical"] else "warning", [ips[a], ips[c]],
                             f"ring link {ips[a]}->{ips[c]} at {s:.2f}x the median link rate over active time "
                             f"({fmt_bps(lr[k])} vs {fmt_bps(med)}): slow sender {ips[a]} or its link",
                             {"link": [ips[a], ips[c]], "rate_bps": float(lr[k]), "median_rate_bps": med,
                              "score": s, "ring": [ips[i] for i in ring], "traffic_class": klass},
                             pairs=[(ips[a], ips[c])])


def incast(inp, em):
    fm, ips, n, p = inp.fm, inp.ips, len(inp.ips), inp.pairs
    t = inp.th["incast"]
    busy = p.offdiag(fm.pair["busy_seconds"])
    degree = safe_div(p.col_sum(busy), fm.dst_busy_seconds)
    inp.metrics["incast_degree"] = {ips[i]: float(degree[i]) for i in range(n) if np.isfinite(degree[i])}
    if not np.isfinite(degree).any():
        return
    med = float(nanmedian(degree))
    for i in np.argsort(-np.nan_to_num(degree, nan=-1.0)):
        d = degree[i]
        if not np.isfinite(d) or d < t["min_senders"] or d < t["ratio"] * med:
            break
        col = p.column(i)
        srcs = p.src[col[busy[col] > 0]]
        em.add_fleet("incast", "warning", [ips[i]],
                     f"incast into {ips[i]}: {d:.1f} senders at once on average while it receives "
                     f"({len(srcs)} senders; fleet median {med:.1f})",
                     {"degree": float(d), "median_degree": med, "senders": int(len(srcs))},
                     pairs=[(ips[s], ips[i]) for s in srcs])


def congestion(inp, em):
    fm, ips, th, p = inp.fm, inp.ips, inp.th, inp.pairs
    tot = fm.pair
    ce_frac = safe_div(tot["ce_packets"], tot["packets"])
    for k in np.nonzero(np.nan_to_num(ce_frac) >= th["ecn_congestion"]["ce_fraction"])[0]:
        i, j = p.src[k], p.dst[k]
        em.add_fleet("ecn_congestion", "warning", [ips[i], ips[j]],
                     f"{ips[i]}->{ips[j]}: {100 * ce_frac[k]:.1f}% of packets CE-marked (congested path)",
                     {"ce_fraction": float(ce_frac[k]), "ce_packets": float(tot["ce_packets"][k])},
                     pairs=[(ips[i], ips[j])])
    t = th["cnp_storm"]
    cnp_to = p.col_sum(tot["cnp_packets"])      # CNP pair src=receiver, dst=data sender
    for j in np.nonzero(cnp_to > 0)[0]:
        cnt = float(cnp_to[j])
        if fm.window_s:
            hit = cnt / fm.window_s >= t["per_second"]
        else:
            hit = cnt >= t["min_count"]
        if hit:
            col = p.column(j)
            from_ = [ips[i] for i in p.src[col[tot["cnp_packets"][col] > 0]]]
            em.add_fleet("cnp_storm", "warning", [ips[j]] + from_,
                         f"{ips[j]} was told to slow down {cnt:.0f} times (CNPs from {', '.join(from_)})",
                         {"cnp_packets": cnt, "per_second": cnt / fm.window_s if fm.window_s else None, "from": from_},
                         pairs=[(s, ips[j]) for s in from_])


def loss(inp, em):
    fm, ips, th, p = inp.fm, inp.ips, inp.th, inp.pairs
    tot = fm.pair
    retx = tot["retransmitted_packets"]
    rf = safe_div(retx, tot["packets"])
    for k in np.nonzero((retx > 0) & (np.nan_to_num(rf) >= th["retransmissions"]["fraction"]))[0]:
        i, j = p.src[k], p.dst[k]
        em.add_fleet("retransmissions", "critical", [ips[i], ips[j]],
                     f"{ips[i]}->{ips[j]}: {retx[k]:.0f} packets retransmitted ({100 * rf[k]:.2f}%): loss "
                     f"and go-back-N",
                     {"retransmitted_packets": float(retx[k]), "fraction": float(rf[k]),
                      "psn_gaps": float(tot["psn_gaps"][k])},
                     pairs=[(ips[i], ips[j])])
    nak = sum(fm.naks.values())
    for k in np.nonzero(nak >= max(1, th["nak_errors"]["count"]))[0]:
        i, j = p.src[k], p.dst[k]
        em.add_fleet("nak_errors", "warning", [ips[i], ips[j]], f"{ips[i]} sent {nak[k]:.0f} NAKs to {ips[j]}",
                     {s: float(fm.naks[s][k]) for s in fm.naks}, pairs=[(ips[i], ips[j])])


# ---- confidence of the fleet's collectives (from the evidence, docs/fleet.md "Fusion") ----
def _conf(terms: dict) -> float:
    vals = [v for v in terms.values() if v is not None and np.isfinite(v)]
    return round(float(np.mean(vals)), 3) if vals else 0.0


def ring_confidence(inp, ring: list, klass: str) -> float:
    """Mean of: volume balance (min / max link bytes: ring links carry equal volumes by
    construction), both ends (share of links exported by the DPUs of both ends), and timing
    agreement (share of the members whose own DPU names the ring predecessor as its
    upstream; left out when no member exports timing)."""
    ips = inp.ips
    links = [(ring[k], ring[(k + 1) % len(ring)]) for k in range(len(ring))]
    vol = inp.pairs.at(inp.bulk_b if klass == "bulk" else inp.data_b, [a for a, _ in links], [c for _, c in links])
    terms = {"volume_balance": float(vol.min() / vol.max()) if vol.max() > 0 else 0.0,
             "both_ends": float(np.mean([inp.exported_by(ips[a], ips[c], klass) >= 2 for a, c in links]))}
    agree = []
    for a, c in links:
        e = inp.entry(ips[c], "ring") or inp.entry(ips[c], "tp_decode")
        if e is not None and e["peers"]:
            agree.append(max(e["peers"], key=lambda p: _count(e["peers"][p].get("arrival"))) == ips[a])
    terms["timing_agreement"] = float(np.mean(agree)) if agree else None
    return _conf(terms)


def alltoall_confidence(inp, g: list) -> float:
    """Mean of: density (share of the k(k-1) member pairs carrying chunk data), both ends
    (share of those pairs exported by both ends' DPUs), timing agreement (share of members
    whose own DPU sees an all-to-all over >= 90 % of the other members; left out when none
    exports timing)."""
    ips = inp.ips
    k = len(g)
    pairs = [(a, c) for a in g for c in g if a != c]
    on = inp.pairs.at(inp.chunk_b, [a for a, _ in pairs], [c for _, c in pairs]) > 0 if pairs else []
    present = [ac for ac, yes in zip(pairs, on) if yes]
    terms = {"density": len(present) / max(1, len(pairs)),
             "both_ends": float(np.mean([inp.exported_by(ips[a], ips[c], "chunk") >= 2 for a, c in present]))
             if present else 0.0}
    agree = []
    for a in g:
        e = inp.entry(ips[a], "alltoall")
        if e is not None:
            agree.append(len(set(e["peers"]) & {ips[x] for x in g}) >= 0.9 * (k - 1))
    terms["timing_agreement"] = float(np.mean(agree)) if agree else None
    return _conf(terms)


# ---- fusion of the per-node timing (slow_tp_shard, ring_straggler, rotating_straggler) ----
#: own-lag blame: the member's own lag (sum over its steps) at least this many times any
#: other member's (a gate's rule, analysis.steps GATE_RATIO)
OWN_DOMINANCE = 2.0

def _member_view(inp, ip, role, upstream, downstream, late_s, slow_s):
    """What the member's own DPU and its downstream's DPU saw (seen_by rows)."""
    e = inp.entry(ip, role)
    rows = []
    own = {"forward_latency_mean_s": None}
    if e is not None:
        fw = e["hist"].get("forward_latency")
        st = e["peers"].get(upstream, {}).get("start")
        ar = e["peers"].get(upstream, {}).get("arrival")
        own = {"forward_latency_mean_s": _f(_mean(fw)), "forward_latency_p50_s": _q(fw, 0.5),
               "steps": _count(fw),
               "slow_steps": count_gt(fw[0], fw[1], slow_s) if fw is not None else 0.0,
               "late_starts": count_le(st[0], st[1], -late_s) if st is not None else 0.0,
               "collectives": _count(st), "arrival_offset_p50_s": _q(ar, 0.5),
               "upstream": upstream}
        rows.append({"dpu": e["dpu"], "ip": ip, "saw": "its own node", **own})
    d = inp.entry(downstream, role)
    down = {"late_arrivals": 0.0, "collectives": 0.0}
    if d is not None:
        st = d["peers"].get(ip, {}).get("start")
        down = {"late_arrivals": count_gt(st[0], st[1], late_s) if st is not None else 0.0,
                "collectives": _count(st), "start_offset_p50_s": _q(st, 0.5)}
        rows.append({"dpu": d["dpu"], "ip": downstream, "saw": f"arrivals from {ip}", **down})
    return own, down, rows


def timing_fusion(inp, em):
    for g in inp.timing_groups:
        role, mem = g["role"], g["members"]
        if role not in ("ring", "tp_decode") or len(mem) < 2:
            continue
        kind = "slow_tp_shard" if role == "tp_decode" else "ring_straggler"
        t, tr = inp.th[kind], inp.th["rotating_straggler"]
        n = len(mem)
        up = {mem[(k + 1) % n]: mem[k] for k in range(n)}
        down = {mem[k]: mem[(k + 1) % n] for k in range(n)}
        ents = [inp.entry(ip, role) for ip in mem]
        fwd = np.array([_mean(e["hist"].get("forward_latency")) if e else np.nan for e in ents])
        # the reference forward latency: the group median; of a ring of two (2-way TP: each
        # member's upstream is its downstream) the earlier member's, as in analysis.steps and
        # analysis.timing -- a median of two is their midpoint and would halve the lag
        ref = np.nanmedian if n >= 3 else np.nanmin
        med = float(ref(fwd)) if np.isfinite(fwd).any() else float("nan")
        starts = [e["peers"].get(up[ip], {}).get("start") if e else None for ip, e in zip(mem, ents)]
        # the healthy start offset: the smallest |median| of a member's (the late one's own
        # and its downstream's are shifted by the lag)
        st_med = [abs(v) for v in (_q(h, 0.5) for h in starts if h is not None) if v is not None]
        scale = max(med if np.isfinite(med) else 0.0, min(st_med) if st_med else 0.0)
        late_s = max(tr["late_factor"] * scale, t.get("min_lag_s", 1e-6))
        for h in starts:
            if h is not None:
                late_s = bound_at_or_below(h[0], late_s)
                break
        slow_s = 2.0 * med if np.isfinite(med) else 0.0
        views = {ip: _member_view(inp, ip, role, up[ip], down[ip], late_s, slow_s) for ip in mem}
        # a gate = a late start seen by the member's own DPU (its downstream's DPU sees the late
        # first arrival too: corroboration, and the fallback when the member exports no timing)
        gated = {ip: v[0]["late_starts"] if "late_starts" in v[0] else v[1].get("late_arrivals", 0.0)
                 for ip, v in views.items()}
        colls = {ip: v[0]["collectives"] if "collectives" in v[0] else v[1].get("collectives", 0.0)
                 for ip, v in views.items()}
        iters = [e["iterations"] for e in ents if e and e["iterations"] > 0]
        n_it = float(median(iters)) if iters else 0.0
        itl = [_mean(e["hist"].get("iteration")) for e in ents if e]
        period = float(nanmedian(itl)) if np.isfinite(itl).any() else None
        blamed, why = None, None
        # own lag (nodeview: min(forward latency, -arrival offset of the upstream's same
        # step)): a member late on its own, under data-flow and barrier step timing alike
        # (barrier: every member waits for the slowest, so forward latencies are all long)
        floor = t.get("min_lag_s", 1e-6)
        own_h = [e["hist"].get("own_lag") if e else None for e in ents]
        own_sum = np.array([h[2] if h is not None else np.nan for h in own_h])
        # late: above the largest bucket bound below the floor (a 1 us lag is not above 1 us)
        own_late = np.array([count_gt(h[0], h[1], _bound_below(h[0], floor)) if h is not None else 0.0
                             for h in own_h])
        fw_h = [e["hist"].get("forward_latency") if e else None for e in ents]
        waited = np.array([max(own_late[i], count_gt(h[0], h[1], floor)) if h is not None else own_late[i]
                           for i, h in enumerate(fw_h)])
        own_lag = None
        steps_mean = [_mean(e["hist"].get("step")) for e in ents if e and e["hist"].get("step") is not None]
        step_med = float(nanmedian(steps_mean)) if np.isfinite(steps_mean).any() else 0.0
        if np.isfinite(own_sum).sum() >= 2 and np.nanmax(own_sum) > 0:
            k = int(np.nanargmax(own_sum))
            rest = np.delete(np.nan_to_num(own_sum, nan=0.0), k)
            share = own_late[k] / waited[k] if waited[k] else 0.0
            lag_k = own_sum[k] / own_late[k] if own_late[k] else 0.0   # sum / late count: the late steps' mean
            ts = inp.th["slow_tp_shard"]
            # persistent: `min_steps` late steps, or late in as many steps as there are
            # iterations (>= rotating_straggler.min_iterations) -- a ring of two has one step
            # per iteration inside its collectives
            need = min(float(t["min_steps"]), max(float(tr["min_iterations"]), n_it))
            if own_late[k] >= need and share >= 0.5 * ts["last_share"] \
                    and own_sum[k] >= OWN_DOMINANCE * float(rest.max(initial=0.0)) and lag_k >= 0.999 * floor \
                    and lag_k >= ts["lag_fraction"] * step_med:
                blamed, why, own_lag = mem[k], "own_lag", float(lag_k)
        # the forward latency alone, where a member's DPU exports no own lag (an older
        # exporter): under barrier timing every member upstream of a slow one waits long too
        have_own = all(h is not None for h in own_h)
        if blamed is None and not have_own and np.isfinite(fwd).any() and np.isfinite(med) and med > 0:
            k = int(np.nanargmax(fwd))
            ip = mem[k]
            own = views[ip][0]
            share = own["slow_steps"] / own["steps"] if own.get("steps") else 0.0
            if fwd[k] / med >= t["forward_ratio"] and share >= inp.th["slow_tp_shard"]["last_share"] \
                    and fwd[k] - med >= t.get("min_lag_s", 1e-6):
                blamed, why = ip, "forward"
        if blamed is None:
            for ip in sorted(mem, key=lambda x: -gated[x]):
                if gated[ip] >= tr["min_iterations"] and colls[ip] > 0 \
                        and gated[ip] / colls[ip] >= tr["persistent_share"]:
                    blamed, why = ip, "late_starts"
                break
        seen_by = [r for ip in mem for r in views[ip][2]]
        if blamed is not None:
            own, dn, _ = views[blamed]
            k = mem.index(blamed)
            lag = float(fwd[k] - med) if why == "forward" else own_lag
            # the lag is paid on every step and, as a late start, on every collective's first one
            steps_it = (own.get("steps", 0.0) + own.get("late_starts", 0.0)) / n_it if n_it else None
            lost = lag * steps_it if lag is not None and steps_it else None
            if why == "own_lag":
                lost = float(own_sum[k]) / n_it if n_it else None
            imp = impact_of(lost, period)
            ev = {"source": "per-node timing", "role": role, "group": mem, "forward_latency_s": _f(fwd[k]),
                  "own_lag_s": own_lag, "own_late_steps": float(own_late[k]) if why == "own_lag" else None,
                  "group_median_forward_latency_s": _f(med), "forward_ratio": _f(fwd[k] / med) if med > 0 else None,
                  "lag_per_step_s": lag, "slow_steps": own.get("slow_steps"), "steps": own.get("steps"),
                  "slow_step_above_s": slow_s, "late_starts": own.get("late_starts"),
                  "late_arrivals_seen_downstream": dn.get("late_arrivals"), "collectives": colls[blamed],
                  "late_above_s": late_s, "downstream": down[blamed],
                  "corroborated_by_downstream": bool(dn.get("late_arrivals", 0) > 0),
                  "iterations": n_it, "iteration_mean_s": period, "seen_by": seen_by}
            sev = "critical" if (imp and (imp.get("share") or 0) >= inp.th["slow_tp_shard"]["critical_share"]) \
                or ev["corroborated_by_downstream"] else "warning"
            prior = [f for f in em.out if f.kind == kind and f.entities.ips and f.entities.ips[0] == blamed]
            if prior:
                # the rate finding's own evidence stays; the timing lag alone would understate
                # its impact (the slow rate costs more than the late starts), so none is added
                prior[0].evidence["timing"] = ev
                continue
            what = (f"its forward latency is {fwd[k] / med:.1f}x the group median ({fwd[k] * 1e6:.1f} vs "
                    f"{med * 1e6:.1f} us) on {own['slow_steps']:.0f} of {own['steps']:.0f} steps"
                    if why == "forward" else
                    f"its own DPU sees it send {own_late[k]:.0f} of {waited[k]:.0f} ring steps {own_lag * 1e6:.1f} us "
                    f"(mean) after it was ready and after its upstream's same step, the others ~0"
                    if why == "own_lag" else
                    f"it started {gated[blamed]:.0f} of {colls[blamed]:.0f} collectives late (> {late_s * 1e6:g} us)")
            conf = (f"; its downstream {down[blamed]}'s DPU saw {dn.get('late_arrivals', 0):.0f} late first arrivals"
                    if dn.get("late_arrivals") else "")
            cost = (f": every {'token' if role == 'tp_decode' else 'iteration'} waits ~{lost * 1e3:.2f} ms for it"
                    if lost else "")
            label = "tensor-parallel shard" if role == "tp_decode" else "ring straggler"
            em.add_fleet(kind, sev, [blamed] + [m for m in mem if m != blamed],
                         f"{label} {blamed} (from the DPUs' own timing): {what}{conf}{cost}; check that host's "
                         f"GPU/NIC (clocks, thermal, a noisy neighbour, PCIe)",
                         ev, pairs=[(blamed, down[blamed])], impact=imp)
            continue
        total = sum(gated.values())
        gates = sorted((ip for ip in mem if gated[ip] > 0), key=lambda x: (-gated[x], mem.index(x)))
        if total >= tr["min_iterations"] and len(gates) >= 2 and n_it > 0 and total / n_it >= tr["gated_share"] \
                and max(gated.values()) / total <= tr["persistent_share"] and late_s >= tr["min_lag_s"]:
            share = {ip: gated[ip] / total for ip in gates}
            em.add_fleet("rotating_straggler", "warning", gates,
                         f"rotating straggler in the {role} ring of {n} nodes: {len(gates)} different members "
                         f"started {total:.0f} collectives late (> {late_s * 1e6:g} us), none more than "
                         f"{100 * max(share.values()):.0f}% of them; no single node to replace: look for "
                         f"fleet-wide jitter (OS noise, GC, data loading, power capping)",
                         {"source": "per-node timing", "role": role, "group": mem, "gated_collectives": total,
                          "iterations": n_it, "distinct_gates": len(gates), "gate_share": share,
                          "max_share": max(share.values()), "late_above_s": late_s, "seen_by": seen_by},
                         pairs=[(ip, down[ip]) for ip in gates])


def timing_document(inp) -> dict | None:
    """The cluster document's `timing`: per group (from the DPUs' own histograms) decode
    ITL and tokens/s, step / collective / forward-latency medians; the main group's decode
    numbers also at the top level (the single-node keys). Quantiles are bucket estimates
    (histogram_quantile); means are exact (_sum / _count)."""
    groups = []
    for g in inp.timing_groups:
        role, mem = g["role"], g["members"]
        ents = [e for e in (inp.entry(ip, role) for ip in mem) if e]
        if not ents:
            continue

        def med(vals):
            v = [x for x in vals if x is not None and np.isfinite(x)]
            return float(median(v)) if v else None

        its = [e["hist"].get("iteration") for e in ents]
        itl_mean = med([_mean(h) for h in its])
        n_it = med([e["iterations"] for e in ents])
        n_coll = med([e["collectives"] for e in ents])
        decode = role == "tp_decode" or (role == "alltoall" and n_it and n_coll and n_coll / n_it >= 4)
        groups.append({
            "role": role, "members": mem, "dpus": sorted({e["dpu"] for e in ents}),
            "workload": "decode" if decode else ("kv_transfer" if role == "kv_transfer" else "training"),
            "iterations": n_it, "collectives": n_coll,
            "iteration_mean_s": itl_mean, "iteration_p50_s": med([_q(h, 0.5) for h in its]),
            "iteration_p99_s": med([_q(h, 0.99) for h in its]),
            "itl_p50_s": med([_q(h, 0.5) for h in its]) if decode else None,
            "itl_p99_s": med([_q(h, 0.99) for h in its]) if decode else None,
            "itl_mean_s": itl_mean if decode else None,
            "tokens_per_s": (1.0 / itl_mean) if decode and itl_mean else None,
            "step_p50_s": med([_q(e["hist"].get("step"), 0.5) for e in ents]),
            "collective_p50_s": med([_q(e["hist"].get("collective"), 0.5) for e in ents]),
            "forward_latency_p50_s": med([_q(e["hist"].get("forward_latency"), 0.5) for e in ents]),
            "forward_latency_mean_s": med([_mean(e["hist"].get("forward_latency")) for e in ents]),
        })
    if not groups:
        return None
    main = max(groups, key=lambda x: (x["workload"] == "decode", len(x["members"])))
    return {"clock": getattr(inp.fm, "clock", "unsynchronised"),
            "source": "per-node timing histograms (each DPU's own clock; quantiles are bucket estimates)",
            "workload": main["workload"], "period_s": main["iteration_mean_s"],
            "tokens_per_s": main["tokens_per_s"], "itl_p50_s": main["itl_p50_s"], "itl_p99_s": main["itl_p99_s"],
            "groups": groups}


def timing_collectives(inp) -> None:
    """Timing-only rings (TP decode: small messages, no bulk pairs in the matrix) as
    collectives, confidence from the evidence: mean of matrix corroboration (share of the
    ring's links carrying data in the matrix), both ends (exported by both DPUs), step
    balance (min / max of the members' step counts: a ring's members step together)."""
    known = {tuple(sorted(c["members"])) for c in inp.collectives}
    for g in inp.timing_groups:
        if g["role"] != "tp_decode" or tuple(sorted(g["members"])) in known:
            continue
        mem = g["members"]
        links = [(mem[k], mem[(k + 1) % len(mem)]) for k in range(len(mem))]
        idx = inp.pos
        data = [a in idx and c in idx and inp.pairs.at(inp.data_b, idx[a], idx[c]) > 0 for a, c in links]
        both = [max(inp.exported_by(a, c, "chunk"), inp.exported_by(a, c, "bulk")) >= 2 for a, c in links]
        steps = [_count((inp.entry(ip, "tp_decode") or {"hist": {}})["hist"].get("forward_latency")) for ip in mem]
        bal = min(steps) / max(steps) if max(steps) > 0 else 0.0
        inp.collectives.append({"kind": "ring_allreduce", "members": mem,
                                "confidence": _conf({"matrix": float(np.mean(data)), "both_ends": float(np.mean(both)),
                                                     "step_balance": bal}),
                                "metrics": {"role": "tp_decode", "source": "per-node timing"}})


def fleet_timing(inp, em):
    timing_fusion(inp, em)
    timing_collectives(inp)
    inp.timing = timing_document(inp)


_FLEET = frozenset({"fleet"})
DETECTORS = [
    Detector("fleet_hot_destination", hot_destination, emits=("hot_destination",), needs=_FLEET, stage=10,
             doc="destination preference of a typical source (metrics: traffic_matrix, destination/source skew)",
             extra=(("hot_destination", Threshold("min_nodes", 3, "count",
                                                  "destinations receiving, at least")),)),
    Detector("fleet_alltoall", alltoall, emits=("alltoall_destination_skew", "straggler"), needs=_FLEET, stage=20,
             doc="all-to-all groups of mutual chunk pairs: per-source destination skew; a member's send rate over "
                 "its active time (source busy time) against the members' median (straggler)",
             extra=(("alltoall_destination_skew", Threshold("max_over_mean", 2.0, "ratio",
                                                            "a source's max/mean bytes per destination")),
                    ("alltoall_destination_skew", Threshold("min_destinations", 3, "count",
                                                            "destinations of that source, at least")))),
    Detector("fleet_rings", rings, emits=("ring_straggler",), needs=_FLEET, stage=30,
             doc="rings of bulk pairs, then of >= 3 chunk pairs among the other nodes (links of >= 3 packets per "
                 "message): link rate over active time / the ring median"),
    Detector("fleet_timing", fleet_timing, emits=("slow_tp_shard", "ring_straggler", "rotating_straggler"),
             needs=_FLEET, stage=35,
             doc="per-node timing histograms: a ring member's own lag (late on its own in >= min_steps steps or "
                 "one per iteration, >= half the share last_share of the steps it waited, its lag sum >= 2x any "
                 "other member's, its mean lag >= "
                 "slow_tp_shard.lag_fraction x the group's median step; without own-lag series: its forward "
                 "latency vs the group median), late "
                 "collective starts seen by its own and its downstream's DPU; the cluster document's timing",
             extra=(("slow_tp_shard", Threshold("forward_ratio", 3.0, "ratio",
                                                "fleet: a member's mean forward latency / the group median")),
                    ("ring_straggler", Threshold("forward_ratio", 3.0, "ratio",
                                                 "fleet: a member's mean forward latency / the ring median")),
                    ("rotating_straggler", Threshold("late_factor", 4.0, "ratio",
                                                     "fleet: a late collective start is later than this x the "
                                                     "group's forward latency (or start offset) median, "
                                                     "rounded down to a bucket bound")))),
    Detector("fleet_incast", incast, emits=("incast",), needs=_FLEET, stage=40,
             doc="incast degree: sum of pair busy time into a destination / its busy time"),
    Detector("fleet_congestion", congestion, emits=("ecn_congestion", "cnp_storm"), needs=_FLEET, stage=50,
             doc="CE fraction per pair; CNPs per throttled sender",
             extra=(("ecn_congestion", Threshold("ce_fraction", 0.01, "fraction", "CE / packets of a pair")),
                    ("cnp_storm", Threshold("per_second", 5000.0, "1/s",
                                            "CNPs per second telling one sender to slow down")),
                    ("cnp_storm", Threshold("min_count", 100, "count",
                                            "window 'all': CNPs to one sender (a count instead of a rate)")))),
    Detector("fleet_loss", loss, emits=("retransmissions", "nak_errors"), needs=_FLEET, stage=60,
             doc="retransmitted fraction and NAKs per pair",
             extra=(("retransmissions", Threshold("fraction", 0.001, "fraction",
                                                  "retransmitted / packets of a pair")),
                    ("nak_errors", Threshold("count", 1, "count", "NAKs on a pair, at least")))),
]

_SEV_ORDER = {"critical": 0, "warning": 1, "info": 2}


def analyze_matrix(fm, thresholds=None) -> dict:
    """{"collectives", "timing": None, "findings", "metrics"} for a fleet matrix; thresholds:
    overrides as for analyze() over the fleet scope (resolve_thresholds(scope="fleet"))."""
    th = resolve_thresholds(thresholds, scope="fleet")
    metrics: dict = {"nodes": len(fm.ips)}
    if len(fm.ips) == 0:
        return {"collectives": [], "timing": None, "findings": [], "incidents": [], "metrics": metrics}
    inp = FleetInputs(fm, th, metrics)
    em = Emitter(None, set(kinds("fleet")))
    for d in detectors("fleet"):
        d.fn(inp, em)
    fs = sorted(em.out, key=lambda f: _SEV_ORDER.get(f.severity, 3))
    return assign_incidents({"collectives": inp.collectives, "timing": inp.timing,
                             "findings": [f.to_dict() for f in fs], "metrics": metrics})
