"""MoE decode and prefill/decode disaggregation findings (issue 12 items 5, 6, 9) against
the generator's ground truth (skewscope.gen truth: the pathology's magnitude and the
`inference` block), on the presets and on scenario variants built here (node counts,
bytes per destination 1-64 KiB, hot factors, MTUs, seeds, jitter):

* hot_destination names the truth's hot node, its byte share per dispatch phase and its
  persistence (share of tokens it is hot); with drift its windows (tokens, hot node, start
  time) are the truth's; alltoall_destination_skew fires with it; the cells counted are the
  truth's all-to-alls;
* a kv_transfer group with the truth's prefill/decode roles and per-decode-node byte shares;
  pd_imbalance names the truth's decode node with its share; kv_transfer_slow the truth's
  link; every finding carries `impact`;
* healthy decode/P-D/training baselines (with jitter) raise no warning;
* the human report shows the kv_transfer group and its per-decode-node numbers."""
from __future__ import annotations

import re

import pytest

from genlib import run

from skewscope.gen.presets import EPD, KV
from skewscope.outputs.report import analysis_lines


def kinds(an, sev=("warning", "critical")):
    return [f["kind"] for f in an["findings"] if f["severity"] in sev]


def only(an, kind):
    fs = [f for f in an["findings"] if f["kind"] == kind]
    assert len(fs) == 1, (kind, [(f["kind"], f["entities"]["ips"]) for f in an["findings"]])
    return fs[0]


def path_of(truth, kind):
    return next(p for p in truth["pathologies"] if p["kind"] == kind)


def check_truth_kinds(truth, an):
    got = set(kinds(an))
    inf = truth["inference"]
    assert set(inf["expected_kinds"]) <= got, (inf["expected_kinds"], got)
    assert not (set(inf["absent_kinds"]) & got), (inf["absent_kinds"], got)
    for f in an["findings"]:
        assert "impact" in f


# ---- MoE decode ------------------------------------------------------------------------------
def ep(nodes, node, factor=4.0, mtu=4096, tokens=6, **wl):
    return {"nodes": nodes, "mtu": mtu, "workloads": [dict(EPD, tokens=tokens, **wl)],
            "pathologies": [{"kind": "hot_destination", "node": node, "factor": factor}]}


EP_CASES = [
    ("ep-decode-hot-expert", 0),
    ("ep-decode-hot-expert", 3),
    (ep(4, 1, 4.0, bytes_per_dest="2KiB", tokens=12), 0),   # the 4-node symptom: 96 all-to-alls
    (ep(4, 2, 4.0, bytes_per_dest="1KiB", mtu=1024), 1),
    (ep(8, 3, 2.0, bytes_per_dest="8KiB", mtu=2048), 2),
    (ep(12, 7, 2.0, bytes_per_dest="4KiB"), 0),
    (ep(12, 0, 4.0, bytes_per_dest="64KiB", mtu=1024, tokens=4), 5),
    (ep(8, 6, 4.0, bytes_per_dest="16KiB", jitter=0.05), 4),
]


@pytest.mark.parametrize("sc,seed", EP_CASES, ids=[f"{c if isinstance(c, str) else 'n%d-%s' % (c['nodes'], c['workloads'][0]['bytes_per_dest'])}-s{s}"
                                                   for c, s in EP_CASES])
def test_hot_destination_matches_truth(sc, seed):
    truth, an, _ = run(sc, seed)
    check_truth_kinds(truth, an)
    mag = path_of(truth, "hot_destination")["magnitude"]
    f = only(an, "hot_destination")
    ev = f["evidence"]
    assert f["entities"]["ips"] == [mag["hot"]]
    assert ev["drift"] is False and len(ev["windows"]) == 1
    assert ev["share"] == pytest.approx(mag["dispatch_dest_share"], abs=0.02)
    # persistence: the share of tokens in which the truth's hot node is the hot one
    hot_tokens = sum(w["end_token"] - w["first_token"] for w in mag["windows"] if w["hot"] == mag["hot"])
    assert ev["persistence"] == pytest.approx(hot_tokens / mag["tokens"], abs=1e-3)
    assert ev["iterations"] == mag["tokens"]
    assert ev["iterations"] * ev["phases_per_iteration"] == mag["alltoalls"]
    a2a = only(an, "alltoall_destination_skew")
    assert a2a["entities"]["ips"][0] == mag["hot"]
    assert f["impact"] is not None and f["impact"]["seconds"] > 0 and 0 < f["impact"]["share"] < 1


def drift(nodes, node, to, after, tokens, factor=4.0, seed_bytes="2KiB"):
    return {"nodes": nodes, "workloads": [dict(EPD, tokens=tokens, bytes_per_dest=seed_bytes)],
            "pathologies": [{"kind": "hot_destination", "node": node, "factor": factor,
                             "drift_after_tokens": after, "drift_to": to}]}


DRIFT_CASES = [("ep-decode-hot-drift", 0), ("ep-decode-hot-drift", 2), (drift(8, 1, [4], 2, 6, 2.0, "4KiB"), 1),
               (drift(12, 10, [3, 8, 0], 2, 8, 4.0, "1KiB"), 0)]


@pytest.mark.parametrize("sc,seed", DRIFT_CASES, ids=[f"case{i}" for i in range(len(DRIFT_CASES))])
def test_hot_destination_drift_windows(sc, seed):
    truth, an, _ = run(sc, seed)
    check_truth_kinds(truth, an)
    mag = path_of(truth, "hot_destination")["magnitude"]
    tw = []                      # the truth's drift steps, consecutive ones with the same hot node merged
    for w in mag["windows"]:
        if tw and tw[-1]["hot"] == w["hot"]:
            tw[-1] = dict(tw[-1], end_token=w["end_token"], end_ns=w["end_ns"])
        else:
            tw.append(dict(w))
    f = only(an, "hot_destination")
    ev = f["evidence"]
    assert ev["drift"] is True
    wins = ev["windows"]
    assert [(w["hot"], w["first_iteration"], w["end_iteration"]) for w in wins] == \
        [(w["hot"], w["first_token"], w["end_token"]) for w in tw]
    per = truth["inference"]["token_period_s"]
    for w, t in zip(wins, tw):
        assert w["start_s"] * 1e9 == pytest.approx(t["start_ns"] - tw[0]["start_ns"], abs=0.1 * per * 1e9)
        assert w["share"] == pytest.approx(t["dispatch_dest_share"], abs=0.02)
    assert set(f["entities"]["ips"]) == {w["hot"] for w in tw}
    for ip, p in ev["persistence_by_destination"].items():
        assert p == pytest.approx(sum(w["end_token"] - w["first_token"] for w in tw if w["hot"] == ip) / mag["tokens"],
                                  abs=1e-3)


# ---- prefill / decode ------------------------------------------------------------------------
def pd(prefill, decode, requests=24, pathologies=(), mtu=4096, **kv):
    n = prefill + decode
    return {"nodes": n, "mtu": mtu,
            "workloads": [dict(KV, prefill=list(range(prefill)), decode=list(range(prefill, n)), requests=requests, **kv)],
            "pathologies": list(pathologies)}


def check_group(truth, an, min_transfer_share=0.8):
    g = [c for c in an["collectives"] if c["kind"] == "kv_transfer"]
    assert len(g) == 1, [c["kind"] for c in an["collectives"]]
    m = g[0]["metrics"]
    tg = next(x for x in truth["inference"]["groups"] if x["kind"] == "kv_transfer")
    assert m["prefill_nodes"] == tg["prefill"] and m["decode_nodes"] == tg["decode"]
    roles = {ip: r for ip, r in truth["inference"]["roles"].items() if r in ("prefill", "decode")}
    assert m["roles"] == roles
    # one transfer per request, except requests back to back on the same pair (one burst
    # on the wire): at most the truth's requests per decode node, at least 80 % overall
    reqs = {ip: 0 for ip in tg["decode"]}
    for rq in truth["groups"][tg["group"]]["details"]["requests"]:
        reqs[rq["decode"]] += 1
    assert all(1 <= m["per_decode"][ip]["transfers"] <= n for ip, n in reqs.items() if n)
    assert m["transfers"] >= min_transfer_share * sum(reqs.values())
    for ip, share in tg["decode_share"].items():
        assert m["per_decode"][ip]["share"] == pytest.approx(share, abs=0.01)
        d = m["per_decode"][ip]
        assert d["transfers"] >= 1 and d["transfer_time_p50_s"] <= d["transfer_time_p99_s"]
    return m


PD_IMB = [("pd-imbalanced", 0), ("pd-imbalanced", 4),
          (pd(2, 3, 24, [{"kind": "pd_imbalance", "node": 3, "share": 0.6}], block_bytes="16KiB", blocks_per_request=8), 1),
          (pd(4, 8, 40, [{"kind": "pd_imbalance", "node": 9, "share": 0.4}], mtu=1024, blocks_per_request=8), 2),
          # a router pinning each prefill node to its own decode nodes: two one-way stars, no
          # component with 2 senders and 2 receivers
          (pd(2, 4, 16, [{"kind": "pd_imbalance", "node": 3, "share": 0.5}], block_bytes="128KiB",
              block_bytes_max=None), 5),
          # equal-sized requests queue back to back on the hot node's pairs: fewer transfers
          # than requests there
          (pd(3, 6, 16, [{"kind": "pd_imbalance", "node": 5, "share": 0.5}], block_bytes="512KiB",
              block_bytes_max=None), 6)]


@pytest.mark.parametrize("sc,seed", PD_IMB, ids=[f"case{i}" for i in range(len(PD_IMB))])
def test_pd_imbalance_matches_truth(sc, seed):
    truth, an, _ = run(sc, seed)
    check_truth_kinds(truth, an)
    # equal-sized blocks into an overloaded node: its requests queue into fewer bursts
    fixed = isinstance(sc, dict) and sc["workloads"][0].get("block_bytes_max", 0) is None
    check_group(truth, an, 0.5 if fixed else 0.8)
    mag = path_of(truth, "pd_imbalance")
    f = only(an, "pd_imbalance")
    assert f["entities"]["ips"][0] == mag["entities"]["ips"][0]
    assert f["evidence"]["share"] == pytest.approx(mag["magnitude"]["share"], abs=0.01)
    assert f["evidence"]["fair_share"] == pytest.approx(mag["magnitude"]["fair_share"], abs=1e-3)
    # requests, not bursts: a burst carrying two queued requests counts two
    assert f["evidence"]["requests"] == mag["magnitude"]["per_decode_requests"][f["entities"]["ips"][0]]
    assert f["evidence"]["requests_total"] == sum(mag["magnitude"]["per_decode_requests"].values())


def test_kv_group_with_a_separate_one_way_pair_merges():
    """Two P/D pools on disjoint nodes, one of them a single prefill -> decode pair (a
    separate component): one kv_transfer group with every role (this merge raised
    AttributeError before); two lone one-way pairs stay point-to-point."""
    base = dict(KV, requests=16)
    sc = {"nodes": 6, "workloads": [dict(base, prefill=[0, 1], decode=[2, 3]), dict(base, prefill=[4], decode=[5],
                                                                                   requests=8)]}
    truth, an, _ = run(sc, 1)
    g = [c for c in an["collectives"] if c["kind"] == "kv_transfer"]
    assert len(g) == 1 and "merged from 2 one-way components" in g[0]["evidence"], an["collectives"]
    roles = {ip: r for ip, r in truth["inference"]["roles"].items() if r in ("prefill", "decode")}
    assert g[0]["metrics"]["roles"] == roles and len(roles) == 6
    assert kinds(an) == []
    pairs = {"nodes": 4, "workloads": [dict(base, prefill=[0], decode=[1]), dict(base, prefill=[2], decode=[3])]}
    _, an2, _ = run(pairs, 2)
    assert sorted(c["kind"] for c in an2["collectives"]) == ["p2p", "p2p"], an2["collectives"]


PD_SLOW = [("pd-slow-link", 0), ("pd-slow-link", 3),
           (pd(3, 3, 18, [{"kind": "kv_transfer_slow", "src": 1, "dst": 4, "rate_factor": 0.3}], mtu=2048), 1),
           (pd(4, 4, 32, [{"kind": "kv_transfer_slow", "src": 3, "dst": 6, "rate_factor": 0.2}], block_bytes="8KiB",
               block_bytes_max="32KiB"), 2)]


@pytest.mark.parametrize("sc,seed", PD_SLOW, ids=[f"case{i}" for i in range(len(PD_SLOW))])
def test_kv_transfer_slow_matches_truth(sc, seed):
    truth, an, _ = run(sc, seed)
    check_truth_kinds(truth, an)
    check_group(truth, an)
    mag = path_of(truth, "kv_transfer_slow")["magnitude"]
    f = only(an, "kv_transfer_slow")
    assert f["evidence"]["link"] == mag["link"]
    assert f["entities"]["ips"] == [mag["src"], mag["dst"]]
    # the link's uncontended message rate: the truth's paced rate (concurrent transfers on
    # the decode downlink only lower a message's rate; the 90th percentile sees the fast ones)
    assert 0.9 * mag["rate_gbps"] * 1e9 <= f["evidence"]["rate_bps"] <= 1.5 * mag["rate_gbps"] * 1e9
    assert f["evidence"]["median_rate_bps"] == pytest.approx(mag["normal_rate_gbps"] * 1e9, rel=0.15)
    assert f["evidence"]["rate_ratio"] <= 0.5
    assert f["impact"]["seconds"] > 0


# ---- quiet when healthy ------------------------------------------------------------------------
HEALTHY = [("ep-decode-healthy", 0), ("ep-decode-healthy", 7), ("pd-healthy", 0), ("pd-healthy", 5),
           ({"nodes": 8, "workloads": [dict(EPD, jitter=0.1)]}, 1),
           ({"nodes": 12, "mtu": 1024, "workloads": [dict(EPD, bytes_per_dest="1KiB", jitter=0.2)]}, 2),
           ({"nodes": 4, "workloads": [dict(EPD, bytes_per_dest="64KiB", jitter=0.1)]}, 3),
           (pd(4, 4, 32, arrival="poisson"), 1), (pd(2, 6, 36, block_bytes="8KiB", mtu=1024), 2),
           (pd(2, 4, 16, block_bytes="128KiB", block_bytes_max=None), 5),   # pinned: two one-way stars
           (pd(3, 6, 16, block_bytes="512KiB", block_bytes_max=None), 6),
           ("ring-healthy", 1), ("alltoall-healthy", 2),
           ({"nodes": 8, "iterations": 4, "jitter": 0.05,
             "workloads": [{"kind": "all_to_all", "bytes_per_peer": "256KiB"}]}, 3)]


@pytest.mark.parametrize("sc,seed", HEALTHY, ids=[f"case{i}" for i in range(len(HEALTHY))])
def test_healthy_is_quiet(sc, seed):
    truth, an, _ = run(sc, seed)
    assert kinds(an) == [], [(f["kind"], f["message"]) for f in an["findings"]]
    if "inference" in truth and any(r in ("prefill", "decode") for r in truth["inference"]["roles"].values()):
        check_group(truth, an)


def test_report_shows_kv_group():
    truth, an, _ = run("pd-imbalanced")
    lines = analysis_lines(an)
    tg = next(x for x in truth["inference"]["groups"] if x["kind"] == "kv_transfer")
    head = [x for x in lines if x.strip().startswith("prefill ")]
    assert head and all(ip in head[0] for ip in tg["prefill"] + tg["decode"])
    for ip, share in tg["decode_share"].items():
        row = [x for x in lines if x.strip().startswith(f"decode {ip}:")]
        assert len(row) == 1, lines
        m = re.search(r"(\d+) transfers, .* \((\d+)% of the KV bytes\), transfer time p50 (\d+) us, p99 (\d+) us", row[0])
        assert m, row[0]
        assert abs(int(m.group(2)) - 100 * share) <= 1
        assert int(m.group(3)) <= int(m.group(4))
        # the preset's requests never go back to back on a pair: one transfer per request
        assert int(m.group(1)) == path_of(truth, "pd_imbalance")["magnitude"]["per_decode_requests"][ip]


# ---- routing noise: no persistent hot destination, no finding ----------------------------------
@pytest.mark.parametrize("nodes,tokens_per_source", [(4, 8), (8, 16), (8, 64), (12, 32)])
def test_random_routing_is_not_hot(nodes, tokens_per_source):
    """Top-1 routing of each source's tokens to uniformly random experts (numpy's seeded
    multinomial: no destination favoured, the ground truth): every phase has a hottest
    destination, often > 1.5x the mean, but a different one each time -- no window passes
    the repetition rule. The same draws with one expert given 4x the routing weight do."""
    import numpy as np

    from skewscope.analysis import DEFAULTS
    from skewscope.analysis.detectors.alltoall import hot_windows
    t = DEFAULTS["hot_destination"]
    fired = 0
    for seed in range(20):
        rng = np.random.default_rng(seed)
        iters, phases = 6, 8
        for hot in (None, seed % nodes):
            w = np.ones(nodes)
            if hot is not None:
                w[hot] = 4.0
            m = np.zeros((iters, phases, nodes, nodes))
            for i in range(iters):
                for k in range(phases):
                    for s_ in range(nodes):
                        p = w.copy()
                        p[s_] = 0
                        m[i, k, s_] = rng.multinomial(tokens_per_source, p / p.sum()) * 2048
            found, _, _ = hot_windows({"mats": m, "hub": None}, t)
            if hot is None:
                fired += bool(found)
            else:
                assert found and {f["_h"] for f in found} == {hot}, (seed, hot, found)
    assert fired == 0
