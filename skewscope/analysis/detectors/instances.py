"""Serving instances: instance_load_imbalance (one inference instance carries well above the
median load of the instances comparable to it -- the signal a request router needs).

An instance is a decode collective group (a tensor-parallel ring or an expert-parallel
all-to-all whose workload is "decode"); instances are comparable when they have the same
collective kind and the same number of members (the same model sharded the same way).
An instance's load is its data bytes per second while it serves: tokens/s x data bytes per
token, and for instances of one model the bytes per token grow with the batch (more
sequences in each step's activations), so the ratio is the ratio of served tokens. Evidence
counts repetitions (tokens seen on every compared instance) and ratios, never bytes.

`instance_loads(collectives, duration_s)` is the one definition of the per-instance numbers;
the exporter's /v1/load serves the same values.
"""
from __future__ import annotations

import numpy as np

from skewscope.analysis.detectors import actions as A
from skewscope.analysis.detectors.common import impact_of, sev
from skewscope.analysis.detectors.registry import KEY_MEMBERS, Detector, Kind, Threshold
from skewscope.analysis.onset import series_onset
from skewscope.analysis.stats import median

#: instance_load_imbalance onset: a time bin spans this many of the compared instances'
#: longest token interval (every instance has a token in most bins)
LOAD_BIN_TOKENS = 2.0

#: collective kinds that are serving instances (when their workload is decode)
INSTANCE_KINDS = ("ring_allreduce", "all_to_all", "tree_allreduce")


def instance_loads(collectives, duration_s: float) -> list[dict]:
    """One row per serving instance from the analysis' collectives (the JSON rows, or
    (group index, kind, members, metrics) tuples): {"group", "kind", "members", "size", "bytes",
    "bytes_per_s", "tokens", "tokens_per_s", "token_interval_s", "busy_share",
    "message_size_bytes" (the most frequent data message size: a batch-size proxy)}."""
    out = []
    dur = float(duration_s or 0)
    for gi, c in enumerate(collectives):
        if isinstance(c, dict):
            kind, members, m = c["kind"], c["members"], c["metrics"]
        else:
            gi, kind, members, m = c
        if kind not in INSTANCE_KINDS or m.get("workload") != "decode":
            continue
        dec = m.get("decode") or {}
        sizes = m.get("message_sizes") or []
        mode = max(sizes, key=lambda x: (x[1], x[0]))[0] if sizes else None
        b = float(m.get("bytes") or 0.0)
        tokens = m.get("iterations")
        tps = dec.get("tokens_per_s")
        # the instance's own rate while it serves: bytes per token x tokens/s (the window's
        # average when the token rate is unknown)
        bps = b / tokens * tps if tokens and tps else (b / dur if dur > 0 else None)
        out.append({"group": gi, "kind": kind, "members": list(members), "size": len(members),
                    "bytes": b, "bytes_per_s": bps,
                    "tokens": int(tokens) if tokens is not None else None,
                    "tokens_per_s": dec.get("tokens_per_s"),
                    "token_interval_s": dec.get("token_interval_s"),
                    "busy_share": m.get("busy_fraction"),
                    "message_size_bytes": int(mode) if mode is not None else None})
    return out


def instances(inp, em):
    t = inp.th["instance_load_imbalance"]
    ips = inp.ctx.nodes.ips
    flows = {gi: g.flows for gi, g, _, _ in inp.groups}
    rows = instance_loads([(gi, g.kind, [ips[int(x)] for x in g.members], r) for gi, g, r, _ in inp.groups],
                          inp.ctx.duration_ns / 1e9)
    classes: dict = {}
    for x in rows:
        classes.setdefault((x["kind"], x["size"]), []).append(x)
    for (kind, size), xs in classes.items():
        xs = [x for x in xs if (x["tokens"] or 0) >= t["min_tokens"] and (x["bytes_per_s"] or 0) > 0]
        if len(xs) < t["min_instances"]:
            continue
        loads = np.array([x["bytes_per_s"] for x in xs], dtype=np.float64)
        mean = float(loads.mean())   # per_instance_load_ratio: each load / the mean (< 1: room for requests)
        for i, x in enumerate(xs):
            others = np.delete(loads, i)
            med = float(median(others))
            if med <= 0:
                continue
            ratio = float(loads[i] / med)
            severity = sev(ratio, t["warning"], t["critical"])
            if severity is None:
                continue
            rest = [y for j, y in enumerate(xs) if j != i]
            tps = [y["tokens_per_s"] for y in rest if y["tokens_per_s"]]
            msz = [y["message_size_bytes"] for y in rest if y["message_size_bytes"]]
            itl = [y["token_interval_s"] for y in rest if y["token_interval_s"]]
            tps_ratio = x["tokens_per_s"] / float(median(tps)) if tps and x["tokens_per_s"] else None
            msz_ratio = x["message_size_bytes"] / float(median(msz)) if msz and x["message_size_bytes"] else None
            lost = None
            if itl and x["token_interval_s"]:
                lost = max(0.0, x["token_interval_s"] - float(median(itl)))
            why = ("larger batches (its decode messages are "
                   f"{msz_ratio:.1f}x the others')" if msz_ratio and msz_ratio >= 1.25 else
                   f"more tokens/s ({tps_ratio:.2f}x)" if tps_ratio and tps_ratio >= 1.25 else "more traffic per token")
            label = {"ring_allreduce": "TP", "tree_allreduce": "TP", "all_to_all": "EP"}[kind]
            em.add("instance_load_imbalance", severity, x["members"],
                   f"{label}-{size} serving instance {x['members'][0]} (+{size - 1} nodes) carries {ratio:.2f}x the median "
                   f"load of the {len(xs) - 1} other comparable instances over {x['tokens']} tokens: {why}; the "
                   "request router "
                   "overloads it: send new requests to the other instances",
                   {"load_ratio": round(ratio, 4), "bytes_per_s": x["bytes_per_s"],
                    "median_bytes_per_s": med,
                    "instances": len(xs), "instance_size": size, "collective_kind": kind,
                    "tokens": x["tokens"], "min_tokens_compared": min(y["tokens"] for y in xs),
                    "tokens_per_s": x["tokens_per_s"],
                    "tokens_per_s_ratio": round(tps_ratio, 4) if tps_ratio else None,
                    "message_size_bytes": x["message_size_bytes"],
                    "message_size_ratio": round(msz_ratio, 4) if msz_ratio else None,
                    "busy_share": x["busy_share"],
                    "per_instance_load_ratio": {y["members"][0]: round(float(y["bytes_per_s"] / mean), 4) for y in xs}},
                   flows=[int(f) for f in flows[x["group"]]], group=x["group"], impact=impact_of(lost, x["token_interval_s"]),
                   onset=_load_onset(inp.ctx, [flows[y["group"]] for y in xs], i, xs, t["warning"]))


def _load_onset(ctx, flows_of, i, xs, warn):
    """Per time bin (LOAD_BIN_TOKENS x the longest token interval of the compared
    instances): instance i's data bytes / the median of the others' in that bin; the stretch
    at or above `warning` (series scan)."""
    itl = [y["token_interval_s"] for y in xs if y["token_interval_s"]]
    if not itl:
        return None
    width = LOAD_BIN_TOKENS * max(itl) * 1e9
    st, by = [], []
    for fl in flows_of:
        ok = ctx.data_events(fl)
        st.append(ctx.ev_start[ok])
        by.append(ctx.events["bytes"][ok].astype(np.float64))
    if not all(len(x) for x in st):
        return None
    t0 = max(float(x.min()) for x in st)             # the span every instance covers
    t1 = min(float(x.max()) for x in st)
    if t1 - t0 < 3 * width:
        return None
    edges = np.arange(t0, t1 + width, width)
    k = len(edges) - 1
    per = np.zeros((len(st), k))
    for j, (s_, b_) in enumerate(zip(st, by)):
        sel = (s_ >= t0) & (s_ < edges[-1])
        np.add.at(per[j], np.clip(np.searchsorted(edges, s_[sel], side="right") - 1, 0, k - 1), b_[sel])
    ref = median(np.delete(per, i, axis=0), axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        y = np.where(ref > 0, per[i] / ref, np.nan)
    return series_onset(edges[:-1], y, worse=1, thr=warn, t_end=edges[1:])


DETECTORS = [
    Detector(
        "instances", instances, needs=frozenset({"flows", "records", "groups"}), stage=25,
        doc="decode groups as serving instances: load (tokens/s x data bytes per token) against comparable instances",
        kinds=(Kind("instance_load_imbalance",
                    key=KEY_MEMBERS, headline=("load_ratio",), actions=(A.REROUTE_INSTANCE,), role="cause",
                    fires='≥ `min_instances` (3) comparable decode instances (same collective kind and size), each with '
                          '≥ `min_tokens` (4) tokens: one instance\'s load (tokens/s × data bytes per token) / the median of the others ≥ `warning` '
                          '(1.5), ≥ `critical` (2.5). Two instances are not enough: either could be the odd one',
                    blames='the instance\'s members',
                    thresholds=(Threshold("warning", 1.5, "ratio", "an instance's load / the median of the comparable others: warning"),
                                Threshold("critical", 2.5, "ratio", "an instance's load / the median of the comparable others: critical"),
                                Threshold("min_instances", 3, "count", "comparable instances (same kind and size), at least"),
                                Threshold("min_tokens", 4, "count", "tokens seen on every compared instance, at least")),
                    onset="per time bin of 2 × the longest token interval (over the span every compared instance "
                          "covers), its data bytes / the median of the others'; the stretch at or above `warning` "
                          "(series scan)"),)),
]
