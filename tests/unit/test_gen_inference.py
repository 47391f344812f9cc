"""LLM-inference traffic (issue 12): the ground truth of the inference presets and scenario
keys checked against the frames of the pcap, read back with the independent struct
dissector of test_gen_common (no skewscope parser, no model internals):

* TP decode: message sizes from hidden x batch x dtype, one LL message per ring step per
  link, a CTS before each, frame counts; tokens and the token period from the frame
  timestamps; the slow shard's sends start `lag` later than its inputs allow; the healthy
  counterfactual period equals the measured period of the same job without the shard.
* EP decode: per-pair dispatch/combine sequence, per-destination byte shares per window
  (hot destination, drift), number of all-to-alls.
* Rotating straggler: the rank that arrives last per iteration = the truth's gate, late
  by the lag, and the gate moves.
* P/D disaggregation: KV WRITEs one-way (no CTS, only ACKs back), sizes, counts, the
  per-decode-node byte shares, burst starts after arrival, the slow link's rate, and the
  prefill-interference token period with and without the KV traffic.
Several seeds and at least two sizes / node counts / MTUs per family."""
from __future__ import annotations

import copy
import itertools
import os
import statistics

import pytest
from test_gen_common import TMP, parse, read_pcap

from skewscope import gen as skewgen
from skewscope.gen.presets import EPD, KV, PRESETS, TPD

EPOCH = 1_735_689_600 * 10**9
WRITE_FIRST, WRITE_MIDDLE, WRITE_LAST, WRITE_LAST_IMM = 0x06, 0x07, 0x08, 0x09
WRITE_ONLY, WRITE_ONLY_IMM, ACK = 0x0A, 0x0B, 0x11
STARTS = {WRITE_FIRST, WRITE_ONLY, WRITE_ONLY_IMM}
ENDS = {WRITE_LAST, WRITE_LAST_IMM, WRITE_ONLY, WRITE_ONLY_IMM}
IMM_END = {WRITE_LAST_IMM, WRITE_ONLY_IMM}
_cache: dict = {}


def ip(i: int) -> str:
    return f"10.0.0.{i + 1}"


def run(sc, seed=0):
    """(truth, frames, messages) of a preset name or scenario dict; pcap at snaplen 128."""
    key = (repr(sc), seed)
    if key in _cache:
        return _cache[key]
    path = os.path.join(TMP, f"inf-{len(_cache)}-{seed}.pcap")
    cap = skewgen.write(copy.deepcopy(sc), path, seed=seed, snaplen=128)
    truth = cap.truth
    frames = []
    for ts, orig, data in read_pcap(path):
        r = parse(data)
        if r is not None and not r.get("pfc"):
            r["ts"] = ts - EPOCH
            r["orig"] = orig
            frames.append(r)
    os.unlink(path)
    msgs, open_ = [], {}
    for r in frames:
        k = (r["src"], r["dst"], r["dqp"])
        op = r["op"]
        if op in STARTS:
            m = {"src": r["src"], "dst": r["dst"], "dqp": r["dqp"], "size": r["reth_len"],
                 "first": r["ts"], "last": r["ts"], "frames": 1, "op0": op, "imm": None}
            open_[k] = m
            msgs.append(m)
        elif op in (WRITE_MIDDLE, WRITE_LAST, WRITE_LAST_IMM):
            m = open_[k]
            m["last"] = r["ts"]
            m["frames"] += 1
        else:
            continue
        if op in ENDS:
            m = open_.pop(k)
            m["end_op"] = op
            m["imm"] = r["imm"]
    for m in msgs:
        m["kind"] = ("cts" if m["op0"] == WRITE_ONLY and m["size"] == 64 else
                     "data" if m["end_op"] in IMM_END else "write")
    _cache[key] = (truth, frames, msgs)
    return _cache[key]


def clusters(times, gap_ns):
    """Split sorted times into runs separated by more than gap_ns."""
    out = [[times[0]]]
    for a, b in zip(times, times[1:]):
        if b - a > gap_ns:
            out.append([])
        out[-1].append(b)
    return out


def group(truth, kind):
    return [g for g in truth["groups"] if g["details"].get("variant") == kind]


# ------------------------------------------------------------------ TP decode
def tp_sc(nodes=4, mtu=4096, hidden=8192, batch=1, layers=4, arpl=2, tokens=4, lag=None,
          shard=2, gap_us=1000, channels=1, protocol="ll", jitter=0.0):
    sc = {"nodes": nodes, "mtu": mtu, "jitter": jitter,
          "workloads": [dict(TPD, hidden=hidden, batch=batch, layers=layers,
                             allreduces_per_layer=arpl, tokens=tokens, compute_gap_us=gap_us,
                             channels=channels, protocol=protocol)]}
    if lag is not None:
        sc["pathologies"] = [{"kind": "slow_tp_shard", "node": shard, "lag_us": lag}]
    return sc


TP_CASES = [
    ("tp-decode-healthy", 4, 8192, 1, 4096, 16, 2, 6, None, None, 1),
    ("tp-decode-slow-shard", 4, 8192, 1, 4096, 16, 2, 6, 20, 2, 1),
    (tp_sc(nodes=8, mtu=1024, hidden=4096, batch=2, layers=3, arpl=2, lag=15, shard=5), 8, 4096, 2, 1024, 3, 2, 4, 15, 5, 1),
    (tp_sc(nodes=3, mtu=2048, hidden=7168, batch=1, layers=4, arpl=3, lag=None, jitter=0.1), 3, 7168, 1, 2048, 4, 3, 4, None, None, 1),
    (tp_sc(nodes=4, mtu=4096, hidden=16384, batch=4, layers=2, arpl=1, lag=40, shard=0, channels=2), 4, 16384, 4, 4096, 2, 1, 4, 40, 0, 2),
]


def _tp_messages(msgs, n):
    ring = {(ip(i), ip((i + 1) % n)) for i in range(n)}
    data = [m for m in msgs if m["kind"] == "data"]
    assert {(m["src"], m["dst"]) for m in data} == ring  # ring successor only
    return data


@pytest.mark.parametrize("seed", [0, 3])
@pytest.mark.parametrize("case", range(len(TP_CASES)))
def test_tp_decode_sizes_counts_tokens(case, seed):
    sc, n, hidden, batch, mtu, layers, arpl, tokens, lag, shard, ch = TP_CASES[case]
    truth, frames, msgs = run(sc, seed)
    det = group(truth, "decode_tp")[0]["details"]
    data = _tp_messages(msgs, n)
    chunk = hidden * batch * 2 // ch // n           # bf16 all-reduce split over ranks/channels
    size = -(-chunk // 8) * 16                      # LL: 8 data bytes per 16-byte line
    assert {m["size"] for m in data} == {size} == set(det["message_sizes"])
    assert all(m["imm"] == size for m in data)
    assert all(m["frames"] == -(-size // mtu) for m in data)
    want = tokens * layers * arpl * ch * n * 2 * (n - 1)
    assert len(data) == want == det["data_messages"]
    # one CTS (64-byte WRITE_ONLY on the reverse path) per data message, sent before it
    cts = [m for m in msgs if m["kind"] == "cts"]
    assert len(cts) == len(data)
    assert {(m["dst"], m["src"]) for m in cts} == {(m["src"], m["dst"]) for m in data}
    # tokens = runs separated by the compute gap; period from the first frame of each
    gap = det["compute_gap_us"] * 1e3
    toks = clusters(sorted(m["first"] for m in data), gap / 2)
    assert len(toks) == tokens == truth["inference"]["tokens"] == det["tokens"]
    assert all(len(t) == want // tokens for t in toks)
    starts = [t[0] for t in toks]
    period = (starts[-1] - starts[0]) / (tokens - 1) / 1e9
    assert period == pytest.approx(truth["period_s"], rel=0.005)
    assert period == pytest.approx(truth["inference"]["token_period_s"], rel=0.005)
    gaps = [toks[i + 1][0] - toks[i][-1] for i in range(tokens - 1)]
    if truth["scenario"]["jitter"]:
        assert max(gaps) - min(gaps) > 0.02 * gap      # jittered compute gaps
    else:
        assert min(gaps) >= gap * 0.95
        assert max(gaps) - min(gaps) < 0.01 * gap
    exp = truth["inference"]["expected_kinds"]
    assert exp == ([] if lag is None else ["slow_tp_shard"])
    assert ("slow_tp_shard" in truth["inference"]["absent_kinds"]) == (lag is None)
    assert truth["inference"]["roles"] == {ip(i): "decode" for i in range(n)}


def _step_delays(msgs, n, ch):
    """Per rank: start of its step-k message minus the moment it could start (its own
    previous message left and the predecessor's step k-1 message arrived), k >= 1."""
    data = [m for m in msgs if m["kind"] == "data"]
    per = {}
    for m in sorted(data, key=lambda m: m["first"]):
        per.setdefault((m["src"], m["dqp"]), []).append(m)
    steps = 2 * (n - 1)
    out = {}
    for c in range(ch):
        by_rank = {}
        for (src, _), lst in per.items():
            by_rank.setdefault(src, []).append(lst)
        for i in range(n):
            me = sorted(by_rank[ip(i)], key=lambda lst: lst[0]["first"])
            pred = sorted(by_rank[ip((i - 1) % n)], key=lambda lst: lst[0]["first"])
            mine, theirs = me[c], pred[c]
            for k in range(len(mine)):
                if k % steps == 0:
                    continue
                ready = max(mine[k - 1]["last"], theirs[k - 1]["last"])
                out.setdefault(ip(i), []).append(mine[k]["first"] - ready)
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("case", [1, 2, 4, 0])
def test_tp_slow_shard_lag_on_the_wire(case, seed):
    sc, n, hidden, batch, mtu, layers, arpl, tokens, lag, shard, ch = TP_CASES[case]
    truth, frames, msgs = run(sc, seed)
    d = _step_delays(msgs, n, ch)
    med = {k: statistics.median(v) / 1e3 for k, v in d.items()}
    if lag is None:
        assert max(med.values()) - min(med.values()) < 2.0
        assert not [p for p in truth["pathologies"] if p["kind"] == "slow_tp_shard"]
        return
    p = [p for p in truth["pathologies"] if p["kind"] == "slow_tp_shard"][0]
    assert p["entities"]["ips"] == [ip(shard)]
    assert {tuple(f[:2]) for f in p["entities"]["flows"]} == {(ip(shard), ip((shard + 1) % n))}
    others = [v for k, v in med.items() if k != ip(shard)]
    excess = med[ip(shard)] - statistics.median(others)
    assert excess == pytest.approx(p["magnitude"]["lag_per_step_us"], abs=2.0)
    assert max(others) - min(others) < 2.0
    # the shard's lag every step -> each token waits: the healthy counterfactual in the
    # truth is the measured period of the same job without the shard
    healthy = copy.deepcopy(sc if isinstance(sc, dict) else PRESETS[sc])
    healthy.pop("pathologies", None)
    healthy.pop("description", None)
    t2, _, m2 = run(healthy, seed)
    assert p["magnitude"]["token_period_healthy_s"] == pytest.approx(t2["period_s"], rel=1e-9)
    data2 = [m for m in m2 if m["kind"] == "data"]
    toks = clusters(sorted(m["first"] for m in data2), t2["groups"][0]["details"]["compute_gap_us"] * 500)
    per2 = (toks[-1][0] - toks[0][0]) / (len(toks) - 1) / 1e9
    assert per2 == pytest.approx(p["magnitude"]["token_period_healthy_s"], rel=0.005)
    # at least one lag per ring step on the critical path of every all-reduce
    colls = p["magnitude"]["steps_per_token"] // (2 * (n - 1))
    assert p["magnitude"]["token_period_s"] - per2 >= colls * lag * 1e-6 * 0.9


# ------------------------------------------------------------------ EP decode
def ep_sc(nodes=8, mtu=4096, b="2KiB", layers=2, tokens=4, hot=None, factor=4.0, drift=0,
          drift_to=None, jitter=0.0):
    sc = {"nodes": nodes, "mtu": mtu, "jitter": jitter,
          "workloads": [dict(EPD, bytes_per_dest=b, layers=layers, tokens=tokens,
                             compute_gap_us=1000)]}
    if hot is not None:
        sc["pathologies"] = [{"kind": "hot_destination", "node": hot, "factor": factor,
                              "drift_after_tokens": drift, "drift_to": drift_to}]
    return sc


EP_CASES = [  # sc, nodes, bytes per dest, layers, tokens, [(hot node per token)], factor
    ("ep-decode-healthy", 8, 2048, 4, 6, [None] * 6, 1.0),
    ("ep-decode-hot-expert", 8, 2048, 4, 6, [5] * 6, 4.0),
    ("ep-decode-hot-drift", 8, 2048, 4, 9, [5] * 3 + [2] * 3 + [6] * 3, 4.0),
    (ep_sc(nodes=4, mtu=1024, b=1536, layers=3, tokens=5, hot=1, factor=3.0, drift=2, jitter=0.1),
     4, 1536, 3, 5, [1, 1, 2, 2, 3], 3.0),
    (ep_sc(nodes=6, mtu=2048, b="4KiB", layers=2, tokens=4, hot=0, factor=6.0), 6, 4096, 2, 4,
     [0] * 4, 6.0),
]


@pytest.mark.parametrize("seed", [0, 2])
@pytest.mark.parametrize("case", range(len(EP_CASES)))
def test_ep_decode_dispatch_combine_shares(case, seed):
    sc, n, B, layers, tokens, hots, factor = EP_CASES[case]
    truth, frames, msgs = run(sc, seed)
    det = group(truth, "decode_ep")[0]["details"]
    data = [m for m in msgs if m["kind"] == "data"]
    pairs = {}
    for m in sorted(data, key=lambda m: m["first"]):
        pairs.setdefault((m["src"], m["dst"]), []).append(m)
    assert set(pairs) == {(ip(i), ip(j)) for i in range(n) for j in range(n) if i != j}
    # on every directed pair: per token per layer one dispatch message then one combine
    want = lambda hot, s, d: B * (factor if hot is not None and d == ip(hot) else 1)  # noqa: E731
    for (s, d), lst in pairs.items():
        assert len(lst) == 2 * layers * tokens
        for q, m in enumerate(lst):
            hot = hots[q // (2 * layers)]
            if q % 2 == 0:
                assert m["size"] == round(want(hot, s, d)), (s, d, q)
            else:  # combine: the transpose (the hot expert sends its results back)
                assert m["size"] == round(want(hot, d, s)), (s, d, q)
            assert m["frames"] == max(1, -(-m["size"] // PRESETS_MTU(truth)))
    assert det["alltoalls"] == 2 * layers * tokens == truth["inference"]["groups"][0]["alltoalls"]
    # tokens and the period from the frames
    toks = clusters(sorted(m["first"] for m in data), det["token_period_s"] * 1e9 * 0.3)
    assert len(toks) == tokens
    per = (toks[-1][0] - toks[0][0]) / (tokens - 1) / 1e9
    assert per == pytest.approx(truth["period_s"], rel=0.005)
    # per-window dispatch destination shares, measured = truth
    wins = det["windows"]
    hot_entry = [p for p in truth["pathologies"] if p["kind"] == "hot_destination"]
    if hots[0] is None:
        assert not hot_entry and truth["inference"]["expected_kinds"] == []
        assert "hot_destination" in truth["inference"]["absent_kinds"]
    else:
        assert truth["inference"]["expected_kinds"] == ["hot_destination", "alltoall_destination_skew"]
        mag = hot_entry[0]["magnitude"]
        assert mag["alltoalls"] == 2 * layers * tokens and mag["drift"] == (len(set(hots)) > 1)
        wins = mag["windows"]
        assert [w["hot"] for w in wins] == [ip(h) for h, _ in itertools.groupby(hots)]
        assert [(w["first_token"], w["end_token"]) for w in wins] == [
            (hots.index(h), len(hots) - hots[::-1].index(h)) for h, _ in itertools.groupby(hots)]
    for w in det["windows"]:
        dest = {}
        src_c = {}
        for (s, d), lst in pairs.items():
            for q in range(2 * layers * w["first_token"], 2 * layers * w["end_token"]):
                if q % 2 == 0:
                    dest[d] = dest.get(d, 0) + lst[q]["size"]
                else:
                    src_c[s] = src_c.get(s, 0) + lst[q]["size"]
        tot = sum(dest.values())
        for k, v in dest.items():
            assert v / tot == pytest.approx(w["dispatch_dest_share"][k], abs=1e-5)
        ctot = sum(src_c.values())
        for k, v in src_c.items():
            assert v / ctot == pytest.approx(w["combine_src_share"][k], abs=1e-5)
        if w["hot"] is not None:
            assert max(dest, key=dest.get) == w["hot"]
            assert dest[w["hot"]] / tot == pytest.approx(factor / (n - 1 + factor), abs=1e-4)
            # the window's frames lie in its time range
            ts = [lst[q]["first"] for lst in pairs.values()
                  for q in range(2 * layers * w["first_token"], 2 * layers * w["end_token"])]
            assert w["start_ns"] <= min(ts) and max(ts) <= w["end_ns"]
        else:
            assert max(dest.values()) == min(dest.values())


def PRESETS_MTU(truth):
    return truth["scenario"]["mtu"]


# ------------------------------------------------------------------ rotating straggler
def rot_sc(nodes=8, mtu=4096, nbytes="2MiB", iters=6, lag=200, noise=5, order=None):
    return {"nodes": nodes, "mtu": mtu, "iterations": iters, "period_ms": 3.0,
            "workloads": [{"kind": "ring_allreduce", "bytes": nbytes, "channels": 1}],
            "pathologies": [{"kind": "rotating_straggler", "lag_us": lag, "noise_us": noise,
                             "order": order}]}


ROT_CASES = [("ring-rotating-straggler", 8, 200, 5), (rot_sc(nodes=4, mtu=2048, nbytes="1MiB", iters=5, lag=120, noise=0), 4, 120, 0),
             (rot_sc(nodes=6, mtu=1024, nbytes="768KiB", iters=4, lag=300, noise=20, order=[3, 1, 4]), 6, 300, 20)]


@pytest.mark.parametrize("seed", [0, 1, 5])
@pytest.mark.parametrize("case", range(len(ROT_CASES)))
def test_rotating_straggler_gate_moves(case, seed):
    sc, n, lag, noise = ROT_CASES[case]
    truth, frames, msgs = run(sc, seed)
    p = [p for p in truth["pathologies"] if p["kind"] == "rotating_straggler"][0]
    mag = p["magnitude"]
    data = sorted((m for m in msgs if m["kind"] == "data"), key=lambda m: m["first"])
    iters = clusters([m["first"] for m in data], 1_000_000)
    assert len(iters) == mag["iterations"] == truth["inference"]["iterations"]
    gates = []
    for k, it in enumerate(iters):
        lo, hi = it[0], it[-1]
        first = {}
        for m in data:
            if lo <= m["first"] <= hi and m["src"] not in first:
                first[m["src"]] = m["first"]
        assert len(first) == n
        g = max(first, key=first.get)
        gates.append(g)
        rest = sorted(v for s, v in first.items() if s != g)
        late = (first[g] - rest[len(rest) // 2]) / 1e3
        assert late == pytest.approx(lag, abs=noise + 5.0), (k, late)
    assert gates == mag["gating_rank_per_iteration"]
    if isinstance(sc, dict) and sc["pathologies"][0]["order"]:
        o = sc["pathologies"][0]["order"]
        assert gates == [ip(o[i % len(o)]) for i in range(len(gates))]
    assert all(a != b for a, b in zip(gates, gates[1:]))    # a different rank each time
    assert len(set(gates)) >= 2 and mag["distinct_gates"] == len(set(gates))
    assert mag["persistent_straggler"] is None
    assert mag["max_iterations_same_rank"] == max(gates.count(x) for x in gates) < len(gates)
    inf = truth["inference"]
    assert inf["expected_kinds"] == ["rotating_straggler"]
    assert "ring_straggler" in inf["absent_kinds"]
    assert inf["iteration_period_s"] == pytest.approx(0.003)


# ------------------------------------------------------------------ P/D disaggregation
def pd_sc(nodes=8, pre=(0, 1, 2, 3), dec=(4, 5, 6, 7), mtu=4096, req=12, bmin="64KiB",
          bmax="256KiB", nb=8, pat=None, arrival="uniform"):
    sc = {"nodes": nodes, "mtu": mtu,
          "workloads": [dict(KV, prefill=list(pre), decode=list(dec), requests=req,
                             block_bytes=bmin, block_bytes_max=bmax, blocks_per_request=nb,
                             arrival=arrival)]}
    if pat:
        sc["pathologies"] = [pat]
    return sc


PD_CASES = [  # sc, prefill nodes, decode nodes, block min, block max
    ("pd-healthy", [0, 1, 2, 3], [4, 5, 6, 7], 65536, 262144),
    ("pd-imbalanced", [0, 1, 2, 3], [4, 5, 6, 7], 65536, 262144),
    ("pd-slow-link", [0, 1, 2, 3], [4, 5, 6, 7], 65536, 262144),
    (pd_sc(nodes=6, pre=(0, 1), dec=(2, 3, 4, 5), mtu=1024, req=16, bmin="128KiB", bmax=None,
           nb=6, arrival="poisson", pat={"kind": "pd_imbalance", "node": 3, "share": 0.5}),
     [0, 1], [2, 3, 4, 5], 131072, 131072),
    (pd_sc(nodes=5, pre=(0, 1, 2), dec=(3, 4), mtu=2048, req=9, nb=10,
           pat={"kind": "kv_transfer_slow", "src": 1, "dst": 4, "rate_factor": 0.4}),
     [0, 1, 2], [3, 4], 65536, 262144),
]


@pytest.mark.parametrize("seed", [0, 4])
@pytest.mark.parametrize("case", range(len(PD_CASES)))
def test_pd_kv_writes_one_way_and_shares(case, seed):
    sc, pre, dec, bmin, bmax = PD_CASES[case]
    truth, frames, msgs = run(sc, seed)
    det = group(truth, "kv_transfer")[0]["details"]
    P, D = {ip(i) for i in pre}, {ip(i) for i in dec}
    mtu = truth["scenario"]["mtu"]
    # one-way: prefill -> decode carries WRITEs; decode -> prefill only ACKs; no CTS at all
    for r in frames:
        if r["src"] in D:
            assert r["dst"] in P and r["op"] == ACK
        else:
            assert r["src"] in P and r["dst"] in D and r["op"] != ACK
    assert not [m for m in msgs if m["kind"] == "cts"]
    kv = [m for m in msgs if m["kind"] in ("write", "data")]
    reqs = det["requests"]
    nb = reqs[0]["blocks"]
    assert len(kv) == len(reqs) * nb == det["messages"]
    assert all(bmin <= m["size"] <= bmax for m in kv)
    assert all(m["frames"] == -(-m["size"] // mtu) for m in kv)
    # the last block of each request is WRITE_WITH_IMM (completion notice), the rest plain
    assert sum(m["kind"] == "data" for m in kv) == len(reqs)
    # per decode node bytes and shares
    byd = {}
    for m in kv:
        byd[m["dst"]] = byd.get(m["dst"], 0) + m["size"]
    assert byd == det["decode_bytes"]
    tot = sum(byd.values())
    for d, v in byd.items():
        assert v / tot == pytest.approx(det["decode_share"][d], abs=1e-6)
    # the requests: per pair, blocks back to back starting after arrival + prefill time
    per_pair = {}
    for m in sorted(kv, key=lambda m: m["first"]):
        per_pair.setdefault((m["src"], m["dst"]), []).append(m)
    # (one QP per pair: its messages in order are its requests' blocks in start order)
    seen = {}
    pre_ns = truth["scenario"]["workloads"][0]["prefill_us"] * 1e3
    qmax = truth["model"]["max_downlink_queue_us"] * 1e3
    for r in sorted(reqs, key=lambda r: r["start_ns"]):
        k = (r["prefill"], r["decode"])
        i = seen.get(k, 0)
        seen[k] = i + nb
        blk = per_pair[k][i:i + nb]
        assert blk[0]["first"] >= r["arrival_ns"] + pre_ns
        # seen on the decode node's downlink: after the send start, by at most the queue
        assert r["start_ns"] <= blk[0]["first"] <= r["start_ns"] + 2000 + qmax
        assert sum(m["size"] for m in blk) == r["bytes"]
        assert [m["kind"] for m in blk] == ["write"] * (nb - 1) + ["data"]
        assert blk[-1]["imm"] == blk[-1]["size"]
        assert all(b["first"] >= a["last"] for a, b in zip(blk, blk[1:]))
    assert seen == {k: len(v) for k, v in per_pair.items()}
    inf = truth["inference"]
    assert inf["roles"] == {**{x: "prefill" for x in P}, **{x: "decode" for x in D}}
    reqd = {d: sum(r["decode"] == d for r in reqs) for d in D}
    pats = {p["kind"]: p for p in truth["pathologies"]}
    if "pd_imbalance" in pats:
        p = pats["pd_imbalance"]
        hot = p["entities"]["ips"][0]
        assert inf["expected_kinds"] == ["pd_imbalance"]
        assert max(byd, key=byd.get) == hot
        assert reqd[hot] == pytest.approx(0.5 * len(reqs), abs=1)   # half of the transfers
        assert p["magnitude"]["share"] == pytest.approx(byd[hot] / tot, abs=1e-6)
        assert p["magnitude"]["per_decode_requests"] == reqd
    else:
        assert max(reqd.values()) - min(reqd.values()) <= 1            # router spreads evenly
        assert "pd_imbalance" in inf["absent_kinds"]
    if "kv_transfer_slow" in pats:
        p = pats["kv_transfer_slow"]
        a, b = p["magnitude"]["src"], p["magnitude"]["dst"]
        assert inf["expected_kinds"] == ["kv_transfer_slow"] and p["entities"]["ips"] == [a, b]

        def rate(m):
            return m["size"] * 8 / max(1, m["last"] - m["first"])
        slow = statistics.median(rate(m) for m in per_pair[(a, b)] if m["frames"] > 4)
        norm = statistics.median(rate(m) for k, v in per_pair.items() if k != (a, b) for m in v
                                 if m["frames"] > 4)
        assert slow / norm == pytest.approx(p["magnitude"]["rate_factor"], rel=0.1)
        assert p["magnitude"]["messages"] == len(per_pair[(a, b)])
    else:
        assert "kv_transfer_slow" in inf["absent_kinds"]


# ------------------------------------------------------------------ prefill interference
def int_sc(tp=(4, 5, 6, 7), pre=(0, 1, 2, 3), kvdec=(4, 5), nodes=8, mtu=4096, req=24,
           iv=1400, batch=4, with_kv=True, tokens=4, hidden=8192):
    w = [dict(TPD, members=list(tp), tokens=tokens, hidden=hidden)]
    if with_kv:
        w.append(dict(KV, prefill=list(pre), decode=list(kvdec), requests=req, interval_us=iv,
                      arrival_batch=batch, block_bytes="256KiB", block_bytes_max=None,
                      start_ms=0.2))
    return {"nodes": nodes, "mtu": mtu, "workloads": w}


INT_CASES = [("prefill-interference", int_sc(with_kv=False), (4, 5, 6, 7)),
             (int_sc(tp=(3, 4, 5, 6, 7), pre=(0, 1, 2), kvdec=(3, 4), mtu=2048, req=18, iv=1200,
                     batch=3, tokens=5, hidden=4096),
              int_sc(tp=(3, 4, 5, 6, 7), pre=(0, 1, 2), kvdec=(3, 4), mtu=2048, tokens=5,
                     hidden=4096, with_kv=False), (3, 4, 5, 6, 7))]


def _token_starts(msgs, tp, kv_dst, gap_ns):
    """First TP message of each token, on links whose two ends see no KV traffic."""
    T = {ip(i) for i in tp}
    data = sorted((m for m in msgs if m["kind"] == "data" and m["src"] in T and m["dst"] in T),
                  key=lambda m: m["first"])
    toks = clusters([m["first"] for m in data], gap_ns)
    clean = [m["first"] for m in data if m["src"] not in kv_dst and m["dst"] not in kv_dst]
    return [min(t for t in clean if c[0] <= t <= c[-1]) for c in toks]


@pytest.mark.parametrize("seed", [0, 6])
@pytest.mark.parametrize("case", range(len(INT_CASES)))
def test_prefill_interference_stretches_token_period(case, seed):
    sc, quiet_sc, tp = INT_CASES[case]
    truth, frames, msgs = run(sc, seed)
    kvm = [m for m in msgs if m["kind"] == "write"]
    kv_dst = {m["dst"] for m in kvm}
    T = {ip(i) for i in tp}
    assert kv_dst and kv_dst <= T                     # KV bursts share the decode links
    g = [x for x in truth["inference"]["groups"] if x["kind"] == "decode_tp"][0]
    assert truth["inference"]["expected_kinds"] == ["prefill_interference"]
    gap = truth["scenario"]["workloads"][0]["compute_gap_us"] * 1e3
    st = _token_starts(msgs, tp, kv_dst, gap / 2)
    assert len(st) == g["tokens"] == truth["inference"]["tokens"]
    per = (st[-1] - st[0]) / (len(st) - 1) / 1e9
    assert per == pytest.approx(g["token_period_s"], rel=0.01)
    t2, _, m2 = run(quiet_sc, seed)
    st2 = _token_starts(m2, tp, set(), gap / 2)
    per2 = (st2[-1] - st2[0]) / (len(st2) - 1) / 1e9
    assert per2 == pytest.approx(g["token_period_without_interference_s"], rel=0.005)
    assert per > per2 * 1.08                          # the interference is real and visible
    assert t2["inference"]["expected_kinds"] == []
    # causal on the wire: no rank sends step k before its step k-1 input (queued behind the
    # KV burst on its downlink) arrived; the waits behind the queue show up as delays
    ring = [ip(i) for i in tp]
    ren = {a: ip(k) for k, a in enumerate(ring)}
    sub = [dict(m, src=ren[m["src"]], dst=ren[m["dst"]]) for m in msgs
           if m["src"] in T and m["dst"] in T]
    d = _step_delays(sub, len(tp), 1)
    assert min(min(v) for v in d.values()) > -5_000
    assert max(max(v) for v in d.values()) > 50_000


@pytest.mark.parametrize("seed", [0, 6])
def test_kv_queues_that_stretch_nothing_leave_prefill_interference_undecided(seed):
    """One prefill node's KV into one member of a 2-way TP decode group queues on its
    downlink but, measured on the wire, does not stretch the token period (< 2 %): the
    truth neither expects prefill_interference nor forbids it (neutral_kinds), while the
    same group with the heavy KV of the prefill-interference preset expects it."""
    sc = int_sc(tp=(1, 2), pre=(0,), kvdec=(1,), nodes=3)
    sc["workloads"][1]["block_bytes"] = "512KiB"
    truth, _, msgs = run(sc, seed)
    inf = truth["inference"]
    assert {m["dst"] for m in msgs if m["kind"] == "write"} == {ip(1)}   # KV into a decode member
    gap = truth["scenario"]["workloads"][0]["compute_gap_us"] * 1e3
    T = {ip(1), ip(2)}
    firsts = sorted(m["first"] for m in msgs if m["kind"] == "data" and m["src"] in T and m["dst"] in T)
    st = [c[0] for c in clusters(firsts, gap / 2)]
    _, _, m2 = run(int_sc(tp=(1, 2), nodes=3, with_kv=False), seed)
    f2 = sorted(m["first"] for m in m2 if m["kind"] == "data" and m["src"] in T and m["dst"] in T)
    st2 = [c[0] for c in clusters(f2, gap / 2)]
    assert len(st) == len(st2) == inf["tokens"]
    per, per2 = (st[-1] - st[0]) / (len(st) - 1), (st2[-1] - st2[0]) / (len(st2) - 1)
    assert per < 1.02 * per2                       # nothing measurable on the wire
    assert "prefill_interference" in inf["neutral_kinds"]
    assert "prefill_interference" not in inf["expected_kinds"] + inf["absent_kinds"]
    heavy = int_sc(tp=(2, 3), pre=(0, 1), kvdec=(2,), nodes=4)
    heavy["workloads"][1]["block_bytes"] = "512KiB"
    hinf = run(heavy, seed)[0]["inference"]
    assert hinf["expected_kinds"] == ["prefill_interference"] and not hinf.get("neutral_kinds")


def test_inference_presets_listed_and_old_truth_keys_unchanged():
    names = ["tp-decode-healthy", "tp-decode-slow-shard", "ep-decode-healthy",
             "ep-decode-hot-expert", "ep-decode-hot-drift", "ring-rotating-straggler",
             "pd-healthy", "pd-imbalanced", "pd-slow-link", "prefill-interference"]
    assert set(names) <= set(PRESETS)
    truth, _, _ = run("tp-decode-healthy")
    assert "inference" in truth
    old = skewgen.generate("tp-decode", seed=0).truth
    assert "inference" not in old


@pytest.mark.parametrize("bad,msg", [
    ({"nodes": 4, "workloads": [{"kind": "decode_tp"}],
      "pathologies": [{"kind": "slow_tp_shard"}]}, "node"),
    ({"nodes": 4, "workloads": [{"kind": "decode_tp", "members": [0, 1]}],
      "pathologies": [{"kind": "slow_tp_shard", "node": 3}]}, "no decode_tp"),
    ({"nodes": 4, "workloads": [{"kind": "kv_transfer", "prefill": [0, 9]}]}, "prefill"),
    ({"nodes": 4, "workloads": [{"kind": "kv_transfer"}],
      "pathologies": [{"kind": "pd_imbalance", "node": 0}]}, "decode node"),
    ({"nodes": 4, "workloads": [{"kind": "decode_ep", "bogus": 1}]}, "unknown key"),
    ({"nodes": 4, "workloads": [{"kind": "ring_allreduce"}],
      "pathologies": [{"kind": "rotating_straggler", "order": [7]}]}, "order"),
])
def test_bad_inference_scenarios(bad, msg):
    with pytest.raises(skewgen.ScenarioError, match=msg):
        skewgen.generate(bad)
