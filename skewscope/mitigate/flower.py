"""The hardware form of a mitigation rule: a tc flower filter a BlueField's eSwitch (mlx5) can
offload -- `pedit ex munge ip dsfield` (+ `csum ip`) to re-mark, `police` to rate-limit,
`skip_sw` so that it runs in the NIC or not at all -- printed by `mitigate plan --flower` and
installed, listed, reverted and reaped by the `Flower` backend (`mitigate ... --backend flower`,
docs/mitigation.md "On a BlueField").

What is ours: a filter at a priority in PRIO_BASE..PRIO_BASE+31 (one rule per priority) whose
every action carries skewscope's cookie: "ssmt" + the rule's id + its deadline (unix seconds)
+ flags, 16 bytes in hex. Nothing else is ever changed or removed; a foreign filter in that
range is a one-line refusal (exit 7). The kernel does not expire a flower rule: apply schedules
a reap at the deadline (reaper.py: a systemd timer, else a detached sleeper) and
deploy/systemd/skewscope-mitigate-reap.timer sweeps every 30 s. The clsact qdisc is removed
only if skewscope created it: FLAG_CREATED_CLSACT in the cookies of the rules that live on it
(kept in the kernel with them, so no file can lose it). A state file (STATE_DIR) keeps each
rule's match and reason for `status`; the kernel stays the truth for what exists.

The match/action body is pluggable (`body`): `flower_body` is the real one; `mirror_body`
(u32 match + mirred mirror, the same cookie) lets the same management code run on kernels
without cls_flower/act_pedit/act_police (tests/kernel/test_mitigate_flower.py).
"""
from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import math
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from skewscope.core.errors import EXIT_BUSY, EXIT_NO_IFACE, EXIT_NO_PRIV, EXIT_NOT_RUN, DataplaneError
from skewscope.core.files import atomic_write_text
from skewscope.mitigate.rules import MAX_RULES, MitigationError, Rule, has_clsact, same_key
from skewscope.mitigate.rules import tc as _tc

PRIO_BASE = 49400
PRIOS = range(PRIO_BASE, PRIO_BASE + MAX_RULES)
COOKIE_TAG = b"ssmt".hex()
FLAG_CREATED_CLSACT = 1
HOOKS = ("ingress", "egress")
STATE_DIR = Path("/run/skewscope/mitigate")     # tmpfs: gone at reboot, as the tc rules are


def cookie(rid: int, expires_unix: float, flags: int = 0) -> str:
    """16 bytes (the kernel's TC_COOKIE_MAX_SIZE): tag, id, deadline (rounded up), flags."""
    return (f"{COOKIE_TAG}{rid & 0xFFFFFFFF:08x}{math.ceil(expires_unix) & 0xFFFFFFFF:08x}"
            f"{flags & 0xFFFFFFFF:08x}")


def parse_cookie(ck: str | None) -> tuple[int, int, int] | None:
    """(id, deadline unix s, flags) of a cookie of ours; None for anything else."""
    if not isinstance(ck, str) or len(ck) not in (24, 32) or not ck.startswith(COOKIE_TAG):
        return None
    try:
        rid, dl = int(ck[8:16], 16), int(ck[16:24], 16)
        flags = int(ck[24:32], 16) if len(ck) == 32 else 0
    except ValueError:
        return None
    return (rid, dl, flags) if rid else None


def _v6(rule: Rule) -> bool:
    return any(ipaddress.ip_address(a).version == 6 for a in (rule.src, rule.dst) if a)


# ---- bodies: what follows `protocol ip|ipv6` -------------------------------------------------
Body = Callable[[Rule, str], list]


def flower_body(rule: Rule, ck: str) -> list[str]:
    """The offloadable flower match + action (what a BlueField eSwitch runs)."""
    v6 = _v6(rule)
    c = ["flower", "skip_sw", "ip_proto", "udp", "dst_port", "4791"]
    if rule.src:
        c += ["src_ip", rule.src]
    if rule.dst:
        c += ["dst_ip", rule.dst]
    if rule.sport:
        c += ["src_port", str(rule.sport)]
    # flower cannot see the BTH's destination QP (UDP payload): a QP is matched by its UDP
    # source port, which RoCE NICs derive per QP
    if rule.action == "remark":
        if v6:
            # traffic class = bits 4..11 of the first 16-bit word; the DSCP its top 6
            c += ["action", "pedit", "ex", "munge", "ip6", "traffic_class", "set", str(rule.dscp << 2), "retain",
                  "0xfc", "pipe", "cookie", ck, "action", "gact", "pipe", "cookie", ck]
        else:
            c += ["action", "pedit", "ex", "munge", "ip", "dsfield", "set", str(rule.dscp << 2), "retain", "0xfc",
                  "pipe", "cookie", ck, "action", "csum", "ip", "pipe", "cookie", ck]
    else:
        c += ["action", "police", "rate", f"{int(rule.rate_bps)}bit", "burst", str(int(rule.burst)),
              "conform-exceed", "drop/pipe", "cookie", ck]
    return c


def mirror_body(peer: str) -> Body:
    """A body any kernel with cls_u32 + act_mirred runs: the rule's addresses matched by u32,
    the action a mirror to `peer` carrying our cookie (tests: the management code is the same)."""
    def body(rule: Rule, ck: str) -> list[str]:
        fam, bits = ("ip6", 128) if _v6(rule) else ("ip", 32)
        c = ["u32"]
        if rule.src:
            c += ["match", fam, "src", f"{rule.src}/{bits}"]
        if rule.dst:
            c += ["match", fam, "dst", f"{rule.dst}/{bits}"]
        return c + ["action", "mirred", "egress", "mirror", "dev", peer, "cookie", ck]
    return body


def filter_args(rule: Rule, iface: str, direction: str, prio: int, ck: str, body: Body = flower_body) -> list[str]:
    """The tc argument list (after `tc`) that adds `rule` at `prio`."""
    rule.check()
    return ["filter", "add", "dev", iface, direction, "prio", str(prio), "protocol",
            "ipv6" if _v6(rule) else "ip", *body(rule, ck)]


def commands(rule: Rule, iface: str, direction: str = "ingress", slot: int = 0, rid: int = 1,
             now: float | None = None) -> list[list[str]]:
    """The tc argument lists (after `tc`) that install `rule` as an offloadable flower filter
    by hand (`plan --flower`)."""
    ck = cookie(rid, (now if now is not None else time.time()) + rule.ttl)
    return [["qdisc", "add", "dev", iface, "clsact"], filter_args(rule, iface, direction, PRIO_BASE + slot, ck)]


# ---- the backend ------------------------------------------------------------------------------


@dataclass
class Found:
    """One of our filters as the kernel shows it."""
    direction: str
    prio: int
    id: int
    deadline: int
    flags: int
    packets: int = 0
    bytes: int = 0
    dropped: int = 0


def _stats(acts: list[dict]) -> tuple[int, int, int]:
    """(packets, bytes, dropped) of a filter: its first action sees every matched packet."""
    s = (acts[0].get("stats") or {}) if acts else {}
    return int(s.get("packets", 0)), int(s.get("bytes", 0)), sum(int((a.get("stats") or {}).get("drops", 0))
                                                                   for a in acts)


def _net_key() -> str:
    """This thread's network namespace (its inode): state files of two namespaces never mix."""
    return str(os.stat("/proc/thread-self/ns/net").st_ino)


class Flower:
    """The tc (flower) mitigation on one interface hook, in the caller's network namespace.
    Same interface as software.Software: apply, status, revert, reap."""

    def __init__(self, iface: str, direction: str = "ingress", body: Body = flower_body,
                 netns: str | None = None, schedule: bool = True):
        if direction not in HOOKS:
            raise MitigationError(f"direction {direction!r}: ingress or egress")
        self.iface, self.direction, self.body, self.netns, self.schedule = iface, direction, body, netns, schedule
        try:
            self.idx = socket.if_nametoindex(iface)
        except OSError:
            raise DataplaneError(f"interface {iface!r} does not exist (see 'ip link')", EXIT_NO_IFACE) from None
        self.state = STATE_DIR / f"flower-{_net_key()}-{self.idx}-{direction}.json"

    # ---- what is there ---------------------------------------------------------------------
    def _scan(self, direction: str | None = None) -> tuple[list[Found], dict[int, str]]:
        """(ours, {prio: why it is not ours}) in our priority range on one hook."""
        d = direction or self.direction
        p = _tc(["-s", "-j", "filter", "show", "dev", self.iface, d], check=False)
        try:
            entries = json.loads(p.stdout) if p.returncode == 0 and p.stdout.strip() else []
        except json.JSONDecodeError:
            raise DataplaneError(f"tc -j filter show dev {self.iface} {d}: output is not JSON", EXIT_NOT_RUN) from None
        by_prio: dict[int, list[dict]] = {}
        for e in entries:
            if e.get("pref") in PRIOS:
                by_prio.setdefault(e["pref"], []).append(e)
        ours, foreign = [], {}
        for prio, es in sorted(by_prio.items()):
            acts = [a for e in es for a in ((e.get("options") or {}).get("actions") or [])]
            cks = {parse_cookie(a.get("cookie")) for a in acts}
            if len(cks) == 1 and None not in cks:
                rid, dl, fl = cks.pop()
                ours.append(Found(d, prio, rid, dl, fl, *_stats(acts)))
            else:
                foreign[prio] = es[0].get("kind") or "?"
        return ours, foreign

    def _refuse_foreign(self, foreign: dict[int, str]) -> None:
        if foreign:
            prio, kind = next(iter(foreign.items()))
            raise MitigationError(f"{self.iface} {self.direction}: a {kind} filter that is not skewscope's holds tc "
                                  f"priority {prio} (skewscope's range {PRIOS[0]}-{PRIOS[-1]}); refusing to touch it",
                                  EXIT_BUSY)

    def _read_state(self) -> dict[int, dict]:
        try:
            return {int(k): v for k, v in json.loads(self.state.read_text()).get("rules", {}).items()}
        except (OSError, ValueError, AttributeError):
            return {}

    def _write_state(self, rules: dict[int, dict]) -> None:
        if not rules:
            with contextlib.suppress(FileNotFoundError):
                self.state.unlink()
            return
        atomic_write_text(self.state, json.dumps({"interface": self.iface, "direction": self.direction,
                                                  "rules": {str(k): v for k, v in sorted(rules.items())}}))

    @contextlib.contextmanager
    def _locked(self):
        """One flower command at a time on this machine (two applies must not pick the same
        priority; each holds it for a few tc calls). One file that is never removed: no race
        between unlinking a lock and taking it."""
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        with open(STATE_DIR / "flower.lock", "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            yield

    def _rule(self, f: Found, known: dict[int, dict]) -> Rule:
        d = known.get(f.id)
        if d is not None:
            r = Rule(action=d["action"], src=d.get("src"), dst=d.get("dst"), sport=d.get("sport"),
                     dest_qp=d.get("dest_qp"), dscp=d.get("dscp"), rate_bps=d.get("rate_bps"), burst=d.get("burst"),
                     ttl=d.get("ttl", 0), note=d.get("note", ""))
            r.created_at = d.get("created_at")
        else:
            r = Rule(action="unknown", note="not in skewscope's state file")
            r.ttl = 0
        r.id, r.slot = f.id, f.prio - PRIO_BASE
        r.expires_in = f.deadline - time.time()
        r.counters = {"packets": f.packets, "bytes": f.bytes, "dropped": f.dropped}
        return r

    # ---- the commands ------------------------------------------------------------------------
    def status(self, include_expired: bool = False) -> list[Rule]:
        """Our rules on this hook, oldest first (expired ones only if asked)."""
        ours, _ = self._scan()
        known = self._read_state()
        out = [self._rule(f, known) for f in ours]
        return sorted((r for r in out if include_expired or r.expires_in > 0), key=lambda r: r.id)

    def reap(self) -> list[Rule]:
        """Remove our rules past their deadline (and a clsact we created, when nothing is left on
        it). Returns the rules removed."""
        with self._locked():
            return self._remove_where(lambda f: f.deadline <= time.time())

    def revert(self, ids=None) -> list[Rule]:
        """Remove the rules with these ids (None: all of ours) and any that expired."""
        want = None if ids is None else {int(i) for i in ids}
        with self._locked():
            ours, _ = self._scan()
            have = {f.id for f in ours if f.deadline > time.time()}
            missing = (want or set()) - have
            removed = self._remove_where(lambda f: want is None or f.id in want or f.deadline <= time.time())
        if missing:
            raise MitigationError(f"{self.iface} {self.direction}: no active mitigation with id "
                                  f"{', '.join(map(str, sorted(missing)))} (see 'skewscope mitigate status')")
        return [r for r in removed if want is None or r.id in want]

    def _remove_where(self, gone: Callable[[Found], bool]) -> list[Rule]:
        ours, _ = self._scan()
        if not any(gone(f) for f in ours):
            return []            # the timer's sweep of every interface: one tc call per hook
        other = self._scan([h for h in HOOKS if h != self.direction][0])[0]
        created = any(f.flags & FLAG_CREATED_CLSACT for f in ours + other)
        known = self._read_state()
        removed = []
        for f in ours:
            if not gone(f):
                continue
            # re-read just before: only a priority that still holds exactly this rule of ours
            now_there = {g.prio: g for g in self._scan()[0]}
            if f.prio in now_there and now_there[f.prio].id == f.id:
                _tc(["filter", "del", "dev", self.iface, self.direction, "prio", str(f.prio)])
            removed.append(self._rule(f, known))
        left = self._scan()[0]
        self._write_state({k: v for k, v in known.items() if k in {f.id for f in left}})
        if created and not left and not other:
            self._drop_clsact()
        return removed

    def _drop_clsact(self) -> None:
        for d in HOOKS:
            p = _tc(["filter", "show", "dev", self.iface, d], check=False)
            if p.returncode == 0 and p.stdout.strip():
                return          # someone else's filters live there: keep the qdisc
        _tc(["qdisc", "del", "dev", self.iface, "clsact"], check=False)

    def apply(self, rules: list[Rule]) -> list[Rule]:
        """Install the rules, each at a free priority of ours (all or nothing). A rule identical
        to an active one is renewed: the new filter goes in first, then the old one out (no gap).
        Then a reap is scheduled at the deadline (reaper.py)."""
        for r in rules:
            r.check()
        if os.geteuid() != 0:
            raise DataplaneError("mitigate apply needs root (CAP_NET_ADMIN)", EXIT_NO_PRIV)
        with self._locked():
            ours, foreign = self._scan()
            self._refuse_foreign(foreign)
            other, foreign_other = self._scan([h for h in HOOKS if h != self.direction][0])
            known = self._read_state()
            now = time.time()
            active = {}
            for f in ours:
                d = known.get(f.id)
                if d is not None and f.deadline > now:
                    active[same_key(self._rule(f, known))] = f
            free = [p for p in PRIOS if p not in {f.prio for f in ours}]
            if len(rules) > len(free):
                raise MitigationError(f"{self.iface} {self.direction}: {len(rules)} rules but {len(free)} free of "
                                      f"{MAX_RULES} tc priorities (revert some: 'skewscope mitigate revert')", EXIT_BUSY)
            created_now = not has_clsact(self.iface)
            flags = FLAG_CREATED_CLSACT if created_now or any(f.flags & FLAG_CREATED_CLSACT
                                                              for f in ours + other) else 0
            if created_now:
                _tc(["qdisc", "add", "dev", self.iface, "clsact"])
            top = max([f.id for f in ours] + list(known) + [0])
            added, renewed = [], []
            try:
                for r in rules:
                    old = active.get(same_key(r))
                    if old is not None:
                        r.id = old.id
                        renewed.append(old)
                    else:
                        top += 1
                        r.id = top
                    prio = free.pop(0)
                    _tc(filter_args(r, self.iface, self.direction, prio, cookie(r.id, now + r.ttl, flags),
                                    self.body))
                    added.append(prio)
                    r.slot, r.expires_in, r.created_at = prio - PRIO_BASE, math.ceil(now + r.ttl) - now, now
                    known[r.id] = dict(r.to_dict(), created_at=now)
            except BaseException:
                for prio in added:         # leave nothing half-made
                    _tc(["filter", "del", "dev", self.iface, self.direction, "prio", str(prio)], check=False)
                if created_now:
                    self._drop_clsact()
                raise
            for f in renewed:
                _tc(["filter", "del", "dev", self.iface, self.direction, "prio", str(f.prio)], check=False)
            self._write_state(known)
        if self.schedule and rules:
            from skewscope.mitigate.reaper import schedule  # light
            schedule(self.iface, self.direction, max(math.ceil(now + r.ttl) for r in rules), netns=self.netns,
                     backend="flower")
        return rules


def list_all() -> list[dict]:
    """Every flower mitigation of ours in this network namespace, all interfaces and hooks."""
    out = []
    for _idx, name in socket.if_nameindex():
        for d in HOOKS:
            try:
                rules = Flower(name, d, schedule=False).status()
            except (DataplaneError, MitigationError, OSError):
                continue
            out += [dict(r.to_dict(), interface=name, direction=d, backend="flower") for r in rules]
    return out
