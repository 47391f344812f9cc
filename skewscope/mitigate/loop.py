"""The closed loop of `skewscope watch --mitigate POLICY`: finding events in, actions out,
each step an event (docs/feedback.md "Mitigation events").

    opened/updated finding of a policy kind, not active, not cooling down
        -> planned (the rules) -> applied (ids), or refused (max_active, the backend said no)
    verify_after_s later (and at least one analysis after the apply): its headline (impact.share, else the kind's first headline number)
        dropped by min_improvement or more, or the finding is gone -> verified
        else -> reverted ("no improvement" / "worse"), and the id cools down
    resolved -> reverted ("finding resolved"), the id cools down
    watch stops -> reverted ("watch stopped"); a crash leaves them to their TTL

`backend` is anything with apply(rules) -> rules (ids set), revert(ids) -> rules, status() ->
rules: mitigate.software.Software in the real loop, a recorder in the unit tests.
"""
from __future__ import annotations

import time

from skewscope.mitigate.policy import Policy
from skewscope.mitigate.rules import MitigationError, rules_for_finding

SCHEMA = "skewscope.mitigation_event/v1"


def headline(f: dict) -> tuple[str, float] | None:
    """The number a mitigation must bring down: the time lost share (impact.share) where the
    analysis estimates it, else the kind's first headline evidence number."""
    imp = f.get("impact") or {}
    if isinstance(imp.get("share"), (int, float)):
        return "impact.share", float(imp["share"])
    from skewscope.analysis.detectors import KINDS  # the registry: which numbers are a kind's headline
    k = KINDS.get(f.get("kind"))
    for name in (k.headline if k is not None else ()):
        v = (f.get("evidence") or {}).get(name)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return name, float(v)
    return None


class Mitigator:
    def __init__(self, policy: Policy, backend, clock=time.time):
        self.policy, self.backend, self.clock = policy, backend, clock
        self.active: dict[str, dict] = {}       # finding id -> {"rules", "at", "baseline", "verified"}
        self.cooling: dict[str, float] = {}     # finding id -> until
        self.steps = 0                          # analyses seen: a verdict needs one after the apply

    def _event(self, step: str, fid: str, f: dict | None, rules=(), **kw) -> dict:
        return {"schema": SCHEMA, "event": "mitigation", "step": step, "time": self.clock(), "finding_id": fid,
                "kind": (f or {}).get("kind"), "interface": self.policy.interface, "direction": self.policy.direction,
                "actions": [r.to_dict() for r in rules], **kw}

    def active_rules(self) -> int:
        return sum(len(a["rules"]) for a in self.active.values())

    def step(self, events: list[dict], current: dict[str, dict]) -> list[dict]:
        """One analysis: the watch's finding events and the current finding objects by id
        (the tracker's open findings) -> mitigation events."""
        now = self.clock()
        self.steps += 1
        out = []
        for ev in events:
            fid = ev.get("id")
            if ev.get("event") == "resolved" and fid in self.active:
                out += self._revert(fid, ev.get("finding"), "finding resolved", now)
        for ev in events:
            f, fid = ev.get("finding") or {}, ev.get("id")
            if ev.get("event") not in ("opened", "updated") or fid in self.active:
                continue
            kp = self.policy.kinds.get(f.get("kind"))
            if kp is None or f.get("severity") not in ("warning", "critical"):
                continue
            if self.cooling.get(fid, 0) > now:
                continue
            out += self._apply(fid, f, kp, now)
        for fid, a in list(self.active.items()):
            if a["verified"] or now - a["at"] < self.policy.verify_after_s or self.steps <= a["step"]:
                continue
            out += self._verify(fid, a, current.get(fid), now)
        return out

    def _apply(self, fid, f, kp, now) -> list[dict]:
        rules = rules_for_finding(f, action=kp.action, dscp=kp.dscp, rate_bps=kp.rate_bps, ttl=self.policy.ttl_s)
        if not rules:
            return []
        out = [self._event("planned", fid, f, rules)]
        if self.active_rules() + len(rules) > self.policy.max_active:
            return out + [self._event("refused", fid, f, rules, reason=f"max_active {self.policy.max_active} "
                                      f"({self.active_rules()} active)")]
        try:
            done = self.backend.apply(rules)
        except MitigationError as e:
            return out + [self._event("refused", fid, f, rules, reason=str(e))]
        hl = headline(f)
        self.active[fid] = {"rules": done, "at": now, "step": self.steps, "baseline": hl, "verified": False,
                            "finding": f}
        return out + [self._event("applied", fid, f, done,
                                  headline={"name": hl[0], "before": hl[1]} if hl else None)]

    def _verify(self, fid, a, cur, now) -> list[dict]:
        base = a["baseline"]
        if cur is None:
            a["verified"] = True
            return [self._event("verified", fid, a["finding"], a["rules"], reason="the finding is gone")]
        hl = headline(cur)
        if base is None or hl is None or hl[0] != base[0]:
            a["verified"] = True
            return [self._event("verified", fid, cur, a["rules"], reason="no headline number to compare; kept")]
        info = {"name": base[0], "before": base[1], "after": hl[1]}
        if hl[1] <= base[1] * (1 - self.policy.min_improvement):
            a["verified"] = True
            return [self._event("verified", fid, cur, a["rules"], headline=info,
                                reason=f"{base[0]} {base[1]:.3g} -> {hl[1]:.3g}")]
        why = "worse" if hl[1] > base[1] else f"no improvement (< {self.policy.min_improvement:.0%})"
        return self._revert(fid, cur, why, now, headline=info)

    def _revert(self, fid, f, why, now, **kw) -> list[dict]:
        a = self.active.pop(fid)
        self.cooling[fid] = now + self.policy.cooldown_s
        try:
            self.backend.revert([r.id for r in a["rules"]])
        except MitigationError as e:          # expired already (TTL) or removed by hand
            why += f"; {e}"
        return [self._event("reverted", fid, f or a["finding"], a["rules"], reason=why, **kw)]

    def close(self) -> list[dict]:
        """Revert what this loop applied (watch stops)."""
        out = []
        for fid in list(self.active):
            out += self._revert(fid, None, "watch stopped", self.clock())
        return out

    def listing(self) -> list[dict]:
        """The active mitigations with their finding ids (/v1/mitigations)."""
        return [{"finding_id": fid, "kind": a["finding"].get("kind"), "applied_at": a["at"], "verified": a["verified"],
                 "actions": [r.to_dict() for r in a["rules"]]} for fid, a in self.active.items()]


def current_findings(tracker) -> dict[str, dict]:
    """The tracker's open findings by id (their latest objects)."""
    return {fid: st["obj"] for fid, st in tracker.open.items()}

