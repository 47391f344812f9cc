"""The closed loop of `watch --mitigate` (issue 28, deliverables 2 and 3) with a recording
backend, and the policy file's one-line errors. Findings are the generator's: a
prefill-interference capture's real diagnose output, with its headline (impact.share) set by
the test to what a later analysis would show."""
from __future__ import annotations

import copy

import pytest
from genlib import run

from skewscope.mitigate.loop import Mitigator
from skewscope.mitigate.policy import KindPolicy, Policy, load
from skewscope.mitigate.rules import MitigationError
from skewscope.outputs.events import Tracker


class Recorder:
    def __init__(self, fail=None):
        self.applied, self.reverted, self.fail, self.next = [], [], fail, 0

    def apply(self, rules):
        if self.fail:
            raise MitigationError(self.fail)
        for r in rules:
            self.next += 1
            r.id = self.next
        self.applied.append([r.id for r in rules])
        return rules

    def revert(self, ids):
        self.reverted.append(list(ids))
        return []


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def finding(share):
    _truth, a, _ = run("prefill-interference", seed=7)
    f = copy.deepcopy(next(x for x in a["findings"] if x["kind"] == "prefill_interference"))
    f["impact"] = dict(f.get("impact") or {}, share=share)
    return f


def loop(**kw):
    pol = Policy(interface="p0", verify_after_s=30, cooldown_s=120, max_active=16, min_improvement=0.2,
                 kinds={"prefill_interference": KindPolicy("remark", dscp=8)})
    for k, v in kw.items():
        setattr(pol, k, v)
    clock, be = Clock(), Recorder()
    return Mitigator(pol, be, clock=clock), be, clock, Tracker(hold=0, source="t")


def analyse(m, tr, clock, findings):
    evs = tr.update(findings, now=clock.t)
    return [e["step"] for e in m.step(evs, {fid: st["obj"] for fid, st in tr.open.items()})]


def test_applied_then_verified_when_the_headline_drops():
    m, be, clock, tr = loop()
    truth, _a, _ = run("prefill-interference", seed=7)
    kv = next(g for g in truth["groups"] if g["kind"] == "kv_transfer")["details"]["pair_bytes"]
    assert analyse(m, tr, clock, [finding(0.21)]) == ["planned", "applied"]
    assert len(be.applied[0]) == len(kv)                  # one rule per KV pair of the truth
    clock.t += 10
    assert analyse(m, tr, clock, [finding(0.10)]) == []    # too early to judge
    clock.t += 25
    assert analyse(m, tr, clock, [finding(0.05)]) == ["verified"] and not be.reverted
    clock.t += 10
    assert analyse(m, tr, clock, [finding(0.05)]) == []    # verified once, kept


def test_reverted_when_no_better_or_worse_and_cools_down():
    for after, why in ((0.19, "no improvement"), (0.30, "worse")):
        m, be, clock, tr = loop()
        analyse(m, tr, clock, [finding(0.21)])
        clock.t += 31
        evs = tr.update([finding(after)], now=clock.t)
        out = m.step(evs, {fid: st["obj"] for fid, st in tr.open.items()})
        assert [e["step"] for e in out] == ["reverted"] and why in out[0]["reason"]
        assert be.reverted == be.applied
        assert out[0]["headline"]["before"] == 0.21 and out[0]["headline"]["after"] == after
        clock.t += 60                                       # still cooling: not applied again
        f = finding(0.5)
        f["severity"] = "warning"                           # a severity change makes an `updated` event
        assert analyse(m, tr, clock, [f]) == []
        clock.t += 61
        f2 = finding(0.5)
        assert analyse(m, tr, clock, [f2]) == ["planned", "applied"]


def test_resolved_reverts_and_stop_reverts_the_rest():
    m, be, clock, tr = loop()
    analyse(m, tr, clock, [finding(0.21)])
    clock.t += 5
    assert analyse(m, tr, clock, []) == ["reverted"] and be.reverted == be.applied
    m2, be2, clock2, tr2 = loop()
    analyse(m2, tr2, clock2, [finding(0.21)])
    assert [e["step"] for e in m2.close()] == ["reverted"] and be2.reverted == be2.applied


def test_limits_refuse_and_never_touch_other_kinds():
    m, be, clock, tr = loop(max_active=3)
    assert analyse(m, tr, clock, [finding(0.21)]) == ["planned", "refused"] and not be.applied
    m, be, clock, tr = loop()
    _t, a, _ = run("ring-straggler", seed=7)
    assert analyse(m, tr, clock, a["findings"]) == [] and not be.applied
    m, be, clock, tr = loop()
    m.backend = Recorder(fail="p0 ingress: a filter that is not skewscope's holds tc priority 49392")
    out = analyse(m, tr, clock, [finding(0.21)])
    assert out == ["planned", "refused"] and not m.active


@pytest.mark.parametrize("text,line,word", [
    ("interface: p0\nkinds:\n  prefill_interference: {action: remark, dscp: 99}\n", 3, "dscp"),
    ("interface: p0\nttl_s: 0\nkinds:\n  incast: {action: police, rate: 10G}\n", 2, "ttl_s"),
    ("interface: p0\nkinds:\n  ring_straggler: {action: remark}\n", 3, "ring_straggler"),
    ("interface: p0\nkinds:\n  incast: {action: police}\n", 3, "rate"),
    ("interface: p0\nmax_actve: 3\nkinds:\n  incast: {rate: 1G}\n", 2, "max_actve"),
    ("interface: p0\nkinds:\n  incast: {action: police, rate: fast}\n", 3, "fast"),
    ("interface: p0\nkinds: [\n", 3, "YAML"),
    ("interface: p0\nbackend: hardware\nkinds:\n  incast: {rate: 1G}\n", 2, "hardware"),
])
def test_policy_errors_name_the_line(tmp_path, text, line, word):
    p = tmp_path / "pol.yaml"
    p.write_text(text)
    with pytest.raises(MitigationError) as ei:
        load(p)
    msg = str(ei.value)
    assert "\n" not in msg and f"pol.yaml:{line}" in msg and word in msg, msg


def test_policy_reads_every_key(tmp_path):
    p = tmp_path / "pol.yaml"
    p.write_text("interface: pf0hpf\ndirection: egress\nbackend: flower\nttl_s: 60\nmax_active: 4\ncooldown_s: 5\n"
                 "verify_after_s: 12\nmin_improvement: 0.5\nkinds:\n  incast: {action: police, rate: 25G}\n"
                 "  prefill_interference: {dscp: 10}\n")
    pol = load(p)
    assert (pol.interface, pol.direction, pol.ttl_s, pol.max_active, pol.cooldown_s, pol.verify_after_s,
            pol.min_improvement, pol.backend) == ("pf0hpf", "egress", 60, 4, 5, 12, 0.5, "flower")
    p.write_text("interface: p0\nkinds:\n  incast: {rate: 1G}\n")
    assert load(p).backend == "software"
    assert pol.kinds["incast"].rate_bps == 25e9 and pol.kinds["prefill_interference"].action == "remark"
    assert pol.kinds["prefill_interference"].dscp == 10
