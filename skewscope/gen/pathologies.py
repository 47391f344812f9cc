"""Pathology injection.  Each kind has a `prepare` step (run before the workloads are
built: it changes rates, volumes, compute times) and/or a `finish` step (run after: it
selects the affected QPs, adds traffic, drops, marks, pauses).  Every kind records a
truth entry: kind, entities (ips, qps, flows = [src, dst, dest_qp] of the affected data
flows) and magnitude (the knob values plus what the model produced, filled in after the
run by ``measure``)."""
from __future__ import annotations

import numpy as np

from skewscope.gen import collectives as C
from skewscope.gen import inference as I
from skewscope.gen.engine import EPOCH_NS, timed, window

KINDS = ("straggler", "hot_expert", "incast", "congestion", "loss", "pfc_pause",
         "pipeline_bubble", "slow_link") + I.PATHOLOGY_KINDS


def _pairs(job, pat):
    """Selected (src, dst) node pairs: `pairs: [[s, d], ...]`, or `into: node`,
    or `from: node` (all peers)."""
    if pat.get("pairs"):
        return [tuple(p) for p in pat["pairs"]]
    if pat.get("into") is not None:
        return [(s, pat["into"]) for s in range(job.n) if s != pat["into"]]
    if pat.get("from") is not None:
        return [(pat["from"], d) for d in range(job.n) if d != pat["from"]]
    raise ValueError(f"{pat['kind']}: give pairs, into or from")


def _data_paths(job, pairs, group=None):
    ps = set(pairs)
    return [p for p in job.paths_between(group=group)
            if (job.p_src[p], job.p_dst[p]) in ps]


def _entities(job, paths, ips=None):
    qps = sorted({job.p_sqp[p] for p in paths} | {job.p_dqp[p] for p in paths})
    if ips is None:
        ips = sorted({job.p_src[p] for p in paths} | {job.p_dst[p] for p in paths})
    return {"ips": [job.ip_str[i] for i in ips], "qps": qps,
            "flows": [job.flow_key(p) for p in paths]}


def prepare(job, sc):
    for pat in sc["pathologies"]:
        k = pat["kind"]
        if k in I.PATHOLOGY_KINDS:  # inference workloads (issue 12)
            I.prepare(job, sc, pat)
        elif k == "straggler":
            node = pat["node"]
            a, b = window(pat)
            if timed(pat):
                job.timed_rate.append((a, b, node, None, pat["rate_factor"]))
            else:
                job.rate_factor[node] *= pat["rate_factor"]
            if timed(pat) or pat.get("lag_per") == "send":
                job.timed_lag.setdefault(node, []).append(
                    (a, b, pat["start_lag_us"] * 1e3, pat.get("lag_per") == "send"))
            else:
                job.lag_ns[node] += pat["start_lag_us"] * 1e3
        elif k == "slow_link" and pat["mode"] == "slow":
            if timed(pat):
                # a link slow for a while: every flow from and to the node paces at the
                # factor in the window (the serialisers keep the full speed)
                a, b = window(pat)
                job.timed_rate.append((a, b, pat["node"], None, pat["speed_factor"]))
                job.timed_rate.append((a, b, None, pat["node"], pat["speed_factor"]))
            else:
                job.link_bps[pat["node"]] *= pat["speed_factor"]
        elif k == "congestion":
            for pr in _pairs(job, pat):
                if timed(pat):
                    job.timed_rate.append((*window(pat), pr[0], pr[1], pat["rate_factor"]))
                else:
                    job.pair_rate[pr] = job.pair_rate.get(pr, 1.0) * pat["rate_factor"]
        elif k == "hot_expert":
            for wl in sc["workloads"]:
                if wl["kind"] in ("all_to_all", "moe_decode") and pat["node"] in wl["members"]:
                    wl.setdefault("_hot", {})[pat["node"]] = pat["factor"]
                    if timed(pat):
                        wl["_hot_window"] = window(pat)
        elif k == "pipeline_bubble":
            wls = [w for w in sc["workloads"] if w["kind"] == "p2p_pipeline"]
            if not wls:
                raise ValueError("pipeline_bubble needs a p2p_pipeline workload")
            wls[0].setdefault("_slow_stage", {})[pat["stage"]] = pat["compute_factor"]
            if timed(pat):
                wls[0]["_slow_stage_window"] = window(pat)


def finish(job, sc):
    for idx, pat in enumerate(sc["pathologies"]):
        k = pat["kind"]
        ent, mag = {}, {}
        a_, b_ = window(pat)
        if k in I.PATHOLOGY_KINDS:
            ent, mag, det = I.finish(job, sc, pat, _entities)
            _lag_per(pat, mag)
            job.pathologies.append(_when(pat, {"kind": k, "entities": ent, "magnitude": mag,
                                               "detector_kinds": det}))
            continue
        if k == "straggler":
            node = pat["node"]
            paths = [p for p in job.paths_between() if job.p_src[p] == node]
            ent = _entities(job, paths, ips=[node])
            mag = {"rate_factor": pat["rate_factor"], "start_lag_us": pat["start_lag_us"]}
        elif k == "hot_expert":
            node = pat["node"]
            paths = [p for p in job.paths_between() if job.p_dst[p] == node
                     and job.groups[job.p_group[p]]["kind"] == "all_to_all"]
            ent = _entities(job, paths, ips=[node])
            mag = {"factor": pat["factor"]}
        elif k == "incast":
            tgt = pat["target"]
            snd = pat["senders"]
            if isinstance(snd, int):
                snd = [s for s in range(job.n) if s != tgt][:snd]
            gid = job.add_group("incast", [tgt] + list(snd), {})
            conns = {s: [job.connect(s, tgt, gid, c) for c in range(pat["channels"])]
                     for s in snd}
            nb = int(pat["bytes"])
            chunk = C.p2p_chunk(nb)
            times = []
            for r in range(int(pat["repeat"])):
                t0 = (pat["at_ms"] + r * pat["period_ms"]) * 1e6 + 50_000.0
                if not a_ <= t0 < b_:
                    continue                  # only the bursts in [since, until)
                times.append(int(t0))
                for s in snd:
                    t = t0
                    rate = job.rate(s, tgt)
                    for m, o in enumerate(range(0, nb, chunk)):
                        fwd, rev = conns[s][m % pat["channels"]]
                        t = job.send(fwd, rev, t, min(chunk, nb - o), rate, va=(m % 8) * chunk)
            job.groups[gid]["details"] = {"pattern": "incast", "target": job.ip_str[tgt],
                                          "senders": [job.ip_str[s] for s in snd],
                                          "bytes_per_sender": nb, "burst_starts_ns": times}
            paths = [c[0] for s in snd for c in conns[s]]
            ent = _entities(job, paths, ips=[tgt] + list(snd))
            mag = {"degree": len(snd), "bytes_per_sender": nb,
                   "bursts": len(times) if timed(pat) else int(pat["repeat"])}
        elif k == "congestion":
            paths = _data_paths(job, _pairs(job, pat))
            job.ce_specs.append((paths, pat["ce_fraction"], idx))
            if timed(pat):
                job.spec_windows[("ce", idx)] = (a_, b_)
            ent = _entities(job, paths)
            # the CNP target is the data sender's QP
            ent["qps"] = sorted({job.p_sqp[p] for p in paths})
            mag = {"ce_fraction": pat["ce_fraction"], "rate_factor": pat["rate_factor"]}
        elif k == "loss":
            paths = _data_paths(job, _pairs(job, pat))
            job.loss_specs.append((paths, pat.get("probability", 0.0), pat.get("count", 0), idx))
            if timed(pat):
                job.spec_windows[("loss", idx)] = (a_, b_)
            ent = _entities(job, paths)
            mag = {"probability": pat.get("probability", 0.0), "count": pat.get("count", 0)}
        elif k == "pfc_pause":
            node, prio = pat["node"], pat["priority"]
            quanta = int(pat["quanta"])
            pause_ns = quanta * 512 / job.link_bps[node] * 1e9
            t = pat["start_ms"] * 1e6 + 50_000.0
            n_before = len(job.pfc_frames)
            for _ in range(int(pat["count"])):
                if a_ <= t < b_:
                    job.pfc_frames.append((t, node, 1 << prio, quanta))
                    job.down_blocks.append((node, t, t + pause_ns))
                t += pat["interval_us"] * 1e3
            paths = [p for p in job.paths_between() if job.p_dst[p] == node]
            ent = _entities(job, paths, ips=[node])
            mag = {"priority": prio, "frames": len(job.pfc_frames) - n_before
                   if timed(pat) else int(pat["count"]), "quanta": quanta,
                   "pause_us_each": round(pause_ns / 1e3, 3),
                   "paused_us_total": round(_union(job.down_blocks, node) / 1e3, 3)}
        elif k == "pipeline_bubble":
            wl = [w for w in sc["workloads"] if w["kind"] == "p2p_pipeline"][0]
            st = pat["stage"]
            node = wl["members"][st]
            paths = [p for p in job.paths_between() if job.p_src[p] == node
                     and job.groups[job.p_group[p]]["kind"] == "p2p"]
            ent = _entities(job, paths, ips=[node])
            gd = [g for g in job.groups if g["kind"] == "p2p" and g["details"].get("pattern") == "pipeline"]
            mag = {"stage": st, "compute_factor": pat["compute_factor"],
                   "link_idle_fraction": gd[0]["details"]["link_idle_fraction"] if gd else {},
                   "link_max_gap_us": gd[0]["details"]["link_max_gap_us"] if gd else {}}
        elif k == "slow_link":
            node = pat["node"]
            if pat["mode"] == "flapping":
                t = pat["start_ms"] * 1e6 + 50_000.0
                for _ in range(int(pat["flaps"])):
                    t += pat["up_us"] * 1e3
                    if a_ <= t < b_:
                        job.up_blocks.append((node, t, t + pat["down_us"] * 1e3))
                        job.down_blocks.append((node, t, t + pat["down_us"] * 1e3))
                    t += pat["down_us"] * 1e3
                mag = {"mode": "flapping", "flaps": int(pat["flaps"]),
                       "down_us": pat["down_us"], "up_us": pat["up_us"]}
            else:
                mag = {"mode": "slow", "speed_factor": pat["speed_factor"],
                       "link_gbps": job.link_bps[node] / 1e9}
            paths = [p for p in job.paths_between()
                     if job.p_src[p] == node or job.p_dst[p] == node]
            ent = _entities(job, paths, ips=[node])
        _lag_per(pat, mag)
        job.pathologies.append(_when(pat, {"kind": k, "entities": ent, "magnitude": mag}))


def _when(pat, rec) -> dict:
    """Truth of a timed pathology: since_ns / until_ns (pcap ns, null = from the start /
    to the end), only when the scenario gives since_ms or until_ms (older truth unchanged)."""
    if "since_ms" in pat or "until_ms" in pat:
        a, b = pat.get("since_ms"), pat.get("until_ms")
        rec["since_ns"] = None if a is None else int(EPOCH_NS + round(float(a) * 1e6))
        rec["until_ns"] = None if b is None else int(EPOCH_NS + round(float(b) * 1e6))
    return rec


def _lag_per(pat, mag) -> None:
    if "lag_per" in pat:
        mag["lag_per"] = pat["lag_per"]


def _union(blocks, node) -> float:
    iv = sorted((s, e) for n, s, e in blocks if n == node)
    tot, cs, ce = 0.0, None, None
    for s, e in iv:
        if cs is None or s > ce:
            if cs is not None:
                tot += ce - cs
            cs, ce = s, e
        else:
            ce = max(ce, e)
    if cs is not None:
        tot += ce - cs
    return tot


def measure(job, truth_flows: dict):
    """After the run: add what the model actually produced to each magnitude."""
    for idx, (pat, rec) in enumerate(zip(job.sc["pathologies"], job.pathologies)):
        flows = [tuple(f) for f in rec["entities"].get("flows", [])]
        if pat["kind"] == "congestion":
            rec["magnitude"]["ce_packets"] = sum(truth_flows[f]["ce_packets"] for f in flows
                                                 if f in truth_flows)
            rev = set()
            for f in flows:
                if f in truth_flows:
                    rev.add(tuple(truth_flows[f]["_reverse"]))
            rec["magnitude"]["cnp_packets"] = sum(truth_flows[r]["cnp_packets"] for r in rev
                                                  if r in truth_flows)
        elif pat["kind"] == "loss":
            dropped = job.stats.get("dropped_paths", np.zeros(0))
            fs = set(flows)
            ps = [p for p in range(len(job.p_src)) if tuple(job.flow_key(p)) in fs]
            rec["magnitude"]["dropped_packets"] = int(np.isin(dropped, ps).sum())
            rec["magnitude"]["retransmissions"] = sum(truth_flows[f]["retransmissions"]
                                                      for f in flows if f in truth_flows)
            rec["magnitude"]["psn_gaps"] = sum(truth_flows[f]["psn_gaps"] for f in flows
                                               if f in truth_flows)
            rev = {tuple(truth_flows[f]["_reverse"]) for f in flows if f in truth_flows}
            rec["magnitude"]["naks"] = sum(truth_flows[r]["naks"] for r in rev if r in truth_flows)
        elif pat["kind"] == "hot_expert":
            for g in job.groups:
                if "dest_bytes" in g["details"]:
                    db = np.array(g["details"]["dest_bytes"], dtype=float)
                    ips = g["members"]
                    hot = rec["entities"]["ips"][0]
                    if hot in ips and db.sum() > 0:
                        rec["magnitude"]["dest_share"] = round(db[ips.index(hot)] / db.sum(), 4)
                        rec["magnitude"]["dest_imbalance_max_over_mean"] = round(
                            db.max() / db.mean(), 4)
                        break
