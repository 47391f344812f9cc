"""The generator's step timing models, lags per send and onsets (issue 25) against their own
definitions (docs/generator.md "Step timing, lags per send, onsets"), on the frames of the
pcap read back with the independent struct dissector of test_gen_common (no skewscope
parser, no model internals):

* step_sync barrier: no member's step k+1 starts before every member's step k ended (all
  channels); the same ring under data flow with a straggler does start some member's step
  k+1 before the straggler's step k ended (the check can fail);
* lag_per send: every message of the slow member starts the lag after it could (its own
  previous message out, its predecessor's data in + the hop); lag_per step: only the first
  message of each step;
* since_ms / until_ms: before the onset (after the recovery) the slow member adds nothing,
  after it (before the recovery) it adds the lag; before the onset the data messages are the
  healthy capture's, one for one; the truth's since_ns / until_ns are the given times;
* defaults: a scenario that spells out step_sync dataflow / lag_per step gives the same
  frames as one without them."""
from __future__ import annotations

import copy
import os

import pytest
from test_gen_common import TMP, parse, read_pcap

from skewscope import gen as skewgen

EPOCH = 1_735_689_600 * 10**9
STARTS = {0x06, 0x0A, 0x0B}
ENDS = {0x08, 0x09, 0x0A, 0x0B}
HOP_NS = 2000.0
_cache: dict = {}


def ip(i: int) -> str:
    return f"10.0.0.{i + 1}"


def run(sc, seed=0):
    """(truth, data messages in start order, frame tuples) of a scenario; the messages are
    {src, dst, first, last} (ns of model time, first / last packet); CTS writes (64-byte
    WRITE_ONLY) left out."""
    key = (repr(sc), seed)
    if key in _cache:
        return _cache[key]
    path = os.path.join(TMP, f"gt-{len(_cache)}-{seed}.pcap")
    cap = skewgen.write(copy.deepcopy(sc), path, seed=seed, snaplen=128)
    msgs, open_, frames = [], {}, []
    for ts, orig, data in read_pcap(path):
        frames.append((ts, orig, data))
        r = parse(data)
        if r is None or r.get("pfc"):
            continue
        k = (r["src"], r["dst"], r["dqp"])
        t = ts - EPOCH
        if r["op"] in STARTS:
            if r["op"] == 0x0A and r["reth_len"] == 64:
                continue                                   # a CTS
            m = {"src": r["src"], "dst": r["dst"], "first": t, "last": t}
            open_[k] = m
            msgs.append(m)
        elif r["op"] in (0x07, 0x08, 0x09) and k in open_:
            open_[k]["last"] = t
        if r["op"] in ENDS:
            open_.pop(k, None)
    os.unlink(path)
    _cache[key] = (cap.truth, msgs, frames)
    return _cache[key]


def by_member(msgs, starts, n):
    """{(iteration, member ip): [messages]} with iteration = the last start <= first."""
    out = {}
    for m in msgs:
        it = max(i for i, s in enumerate(starts) if s <= m["first"] + 1) if m["first"] + 1 >= starts[0] else -1
        out.setdefault((it, m["src"]), []).append(m)
    return out


def ring(n=5, sync="barrier", ch=2, lag=60.0, node=2, per="step", protocol="simple", nbytes=None, it=3, **pat):
    w = {"kind": "ring_allreduce", "bytes": nbytes or 65536 * n * ch, "protocol": protocol, "channels": ch,
         "step_sync": sync}
    sc = {"nodes": n, "iterations": it, "period_ms": 4.0, "workloads": [w]}
    if lag:
        sc["pathologies"] = [dict({"kind": "straggler", "node": node, "rate_factor": 1.0, "start_lag_us": lag,
                                   "lag_per": per}, **pat)]
    return sc


def tp(n=4, sync="dataflow", lag=50.0, node=2, per="send", tokens=4, **pat):
    w = {"kind": "decode_tp", "layers": 2, "allreduces_per_layer": 2, "tokens": tokens, "hidden": 8192,
         "batch": 1, "compute_gap_us": 500, "layer_compute_us": 20, "step_sync": sync}
    sc = {"nodes": n, "workloads": [w]}
    if lag:
        sc["pathologies"] = [dict({"kind": "slow_tp_shard", "node": node, "lag_us": lag, "lag_per": per}, **pat)]
    return sc


def steps_of(truth, msgs, n, ch, per_step):
    """{iteration: [[messages of step k over all members and channels] for k]} of a training
    ring: each member sends ch x per_step messages per step, in start order."""
    starts = truth["groups"][0]["details"]["iteration_starts_ns"]
    g = by_member(msgs, starts, n)
    out = {}
    for it in range(len(starts)):
        mine = [g.get((it, ip(i)), []) for i in range(n)]
        assert all(len(x) == len(mine[0]) for x in mine), [len(x) for x in mine]
        k = len(mine[0]) // (ch * per_step)
        assert k == 2 * (n - 1)
        out[it] = [[m for x in mine for m in x[s * ch * per_step:(s + 1) * ch * per_step]] for s in range(k)]
    return out


# ---- barrier ---------------------------------------------------------------------------------
@pytest.mark.parametrize("n,ch,per", [(5, 2, "step"), (3, 1, "send"), (6, 4, "send")])
def test_barrier_no_step_starts_before_the_last_of_the_previous(n, ch, per):
    truth, msgs, _ = run(ring(n=n, ch=ch, per=per))
    assert truth["groups"][0]["details"]["step_sync"] == "barrier"
    for it, steps in steps_of(truth, msgs, n, ch, 1).items():
        for k in range(1, len(steps)):
            last_end = max(m["last"] for m in steps[k - 1])
            first = min(m["first"] for m in steps[k])
            # + the hop: every member waits for the barrier, then its hop
            assert first >= last_end + HOP_NS - 500, (it, k, first - last_end)


def test_dataflow_straggler_breaks_the_barrier_rule():
    """The check above can fail: under data flow the members away from the straggler start
    their next step before the straggler's step has ended."""
    n, ch = 5, 2
    truth, msgs, _ = run(ring(n=n, ch=ch, sync="dataflow"))
    early = 0
    for it, steps in steps_of(truth, msgs, n, ch, 1).items():
        for k in range(1, len(steps)):
            early += min(m["first"] for m in steps[k]) < max(m["last"] for m in steps[k - 1])
    assert early >= 3


def test_barrier_tp_decode_steps():
    n = 4
    truth, msgs, _ = run(tp(n=n, sync="barrier", lag=30.0))
    det = next(g for g in truth["groups"] if g["kind"] == "tp_decode_allreduce")["details"]
    assert det["step_sync"] == "barrier"
    g = by_member(msgs, det["token_starts_ns"], n)
    steps = 2 * (n - 1)
    for tok in range(det["tokens"]):
        mine = [g[(tok, ip(i))] for i in range(n)]
        for c in range(det["allreduces_per_token"]):
            for k in range(1, steps):
                prev = [x[c * steps + k - 1] for x in mine]
                cur = [x[c * steps + k] for x in mine]
                assert min(m["first"] for m in cur) >= max(m["last"] for m in prev) + HOP_NS - 500


# ---- lag per send / per step --------------------------------------------------------------------
@pytest.mark.parametrize("per", ["send", "step"])
def test_lag_per_send_delays_every_piece(per):
    """LL ring, 1 channel, 2 pieces (64 KiB messages) per step, data flow: piece j of step k
    starts when the member's piece j-1 is out and its predecessor's piece j of step k-1 is in
    (+ the hop); the slow member adds the lag to both pieces with lag_per send, to the first
    only with lag_per step; the others add nothing."""
    n, lag = 4, 40.0
    sc = ring(n=n, ch=1, sync="dataflow", per=per, protocol="ll", nbytes=2 * 32768 * n, lag=lag)
    truth, msgs, _ = run(sc)
    own = {0: [], 1: []}
    healthy = []
    for it, steps in steps_of(truth, msgs, n, 1, 2).items():
        for k in range(1, len(steps)):
            for i in range(n):
                a, b = [m for m in steps[k] if m["src"] == ip(i)]
                pa, pb = [m for m in steps[k - 1] if m["src"] == ip((i - 1) % n)]
                prev_own = [m for m in steps[k - 1] if m["src"] == ip(i)][1]
                d0 = a["first"] - max(prev_own["last"], pa["last"] + HOP_NS)
                d1 = b["first"] - max(a["last"], pb["last"] + HOP_NS)
                if i == 2:
                    own[0].append(d0)
                    own[1].append(d1)
                else:
                    healthy += [d0, d1]
    assert max(healthy) < 1000, max(healthy)
    assert min(own[0]) >= lag * 1e3 - 1000
    if per == "send":
        assert min(own[1]) >= lag * 1e3 - 1000, min(own[1])
    else:
        assert max(own[1]) < 1000, max(own[1])


# ---- onsets ----------------------------------------------------------------------------------
def own_delays(truth, msgs, n, node):
    """Per data message of `node` in the TP ring, after the first step of its collective:
    (start ns, its start - max(end of its previous message, end of its predecessor's previous
    message + the hop)): the delay it adds on its own (the model's definition, data flow)."""
    det = next(g for g in truth["groups"] if g["kind"] == "tp_decode_allreduce")["details"]
    g = by_member(msgs, det["token_starts_ns"], n)
    steps = 2 * (n - 1)
    out = []
    for tok in range(det["tokens"]):
        mine, pred = g[(tok, ip(node))], g[(tok, ip((node - 1) % n))]
        for j in range(len(mine)):
            if j % steps == 0:
                continue
            ready = max(mine[j - 1]["last"], pred[j - 1]["last"] + HOP_NS)
            out.append((mine[j]["first"], mine[j]["first"] - ready))
    return out


@pytest.mark.parametrize("key", ["since_ms", "until_ms"])
def test_onset_and_recovery(key):
    n, lag = 4, 50.0
    healthy = tp(n=n, lag=0)
    ht, hm, hframes = run(healthy)
    starts = next(g for g in ht["groups"] if g["kind"] == "tp_decode_allreduce")["details"]["token_starts_ns"]
    t_ms = (starts[2] - 1000) / 1e6              # just before the third token
    sc = tp(n=n, lag=lag, **{key: t_ms})
    truth, msgs, frames = run(sc)
    (pat,) = truth["pathologies"]
    want = EPOCH + round(t_ms * 1e6)
    assert pat["since_ns" if key == "since_ms" else "until_ns"] == want
    assert pat["until_ns" if key == "since_ms" else "since_ns"] is None
    t_ns = t_ms * 1e6
    d = own_delays(truth, msgs, n, 2)
    # the window applies by a send's ready time: a send ready just before the boundary and
    # lagged across it is on the earlier side
    if key == "since_ms":
        active = [x for t, x in d if t >= t_ns + lag * 1e3]
        quiet = [x for t, x in d if t < t_ns]
    else:
        active = [x for t, x in d if t < t_ns]
        quiet = [x for t, x in d if t >= t_ns + lag * 1e3]
    assert len(active) >= 8 and len(quiet) >= 8
    assert min(active) >= lag * 1e3 - 1000, min(active)
    assert max(quiet) < 1000, max(quiet)
    if key == "since_ms":
        # before the onset: the healthy capture's data messages, one for one (the CTS of a
        # send ready at the onset goes out before it: frames are not compared)
        before = [m for m in msgs if m["first"] < t_ns]
        assert before == [m for m in hm if m["first"] < t_ns] and len(before) > 50


def test_onset_training_straggler_iterations():
    """A straggler from the third iteration on: its first message of each step is late only
    in the iterations starting after since_ms."""
    n, ch, lag = 4, 1, 40.0
    ht, _, _ = run(ring(n=n, ch=ch, lag=0, sync="dataflow"))
    starts = ht["groups"][0]["details"]["iteration_starts_ns"]
    truth, msgs, _ = run(ring(n=n, ch=ch, lag=lag, sync="dataflow", it=4, since_ms=(starts[2] - 1000) / 1e6))
    assert truth["pathologies"][0]["since_ns"] == EPOCH + round(starts[2] - 1000)
    for it, steps in steps_of(truth, msgs, n, ch, 1).items():
        late = []
        for k in range(1, len(steps)):
            s = next(m for m in steps[k] if m["src"] == ip(2))
            a = next(m for m in steps[k - 1] if m["src"] == ip(2))
            p = next(m for m in steps[k - 1] if m["src"] == ip(1))
            late.append(s["first"] - max(a["last"], p["last"] + HOP_NS))
        if it < 2:
            assert max(late) < 1000, (it, late)
        else:
            assert min(late) >= lag * 1e3 - 1000, (it, late)


def test_explicit_defaults_are_the_defaults():
    a = ring(n=4, ch=2, sync="dataflow", lag=20.0)
    b = copy.deepcopy(a)
    del b["workloads"][0]["step_sync"]
    del b["pathologies"][0]["lag_per"]
    fa, fb = run(a)[2], run(b)[2]
    assert fa == fb


@pytest.mark.parametrize("bad", [{"step_sync": "lockstep"}, {"lag_per": "token"}, {"since_ms": -1},
                                 {"since_ms": 5, "until_ms": 4}, {"since_ms": "soon"}])
def test_bad_keys_are_one_line_errors(bad):
    sc = ring(n=3, lag=10.0)
    if "step_sync" in bad:
        sc["workloads"][0].update(bad)
    else:
        sc["pathologies"][0].update(bad)
    with pytest.raises(skewgen.ScenarioError) as e:
        skewgen.generate(sc)
    assert "\n" not in str(e.value)


def test_pd_imbalance_has_no_onset():
    from skewscope.gen.presets import PRESETS
    sc = copy.deepcopy(PRESETS["pd-imbalanced"])
    sc["pathologies"][0]["since_ms"] = 1.0
    with pytest.raises(skewgen.ScenarioError, match="unknown key"):
        skewgen.generate(sc)
