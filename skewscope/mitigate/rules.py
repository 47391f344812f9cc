"""What `skewscope mitigate` can do, as data: a Rule (match + action + TTL + why), its binary
form in the software program's `mt_rules` map (ebpf/mitigate.bpf.c, struct mt_rule), and
the plan: which findings of a diagnose/report document become which rules.

Actions (docs/mitigation.md):
* remark  -- set the DSCP of the matched RoCEv2 flows (the KV-cache bulk of a
             prefill_interference finding into a lower traffic class); the packets keep
             flowing, only their class changes; the ICRC does not cover the TOS byte;
* police  -- drop the matched flows' packets above a rate (a token bucket of `burst` bytes):
             the RoCE sender's go-back-N retransmits what was dropped, so this is for a
             noisy flow that must yield, never for the job's own collectives.
A match: source and destination address (None = any), UDP source port (the NIC's per-QP
entropy; None = any) and BTH destination QP (None = any), RoCEv2 only.

Plans (`plan_from_document`): prefill_interference -> remark (or police) the flows from its
prefill senders to its KV receivers, one rule per pair; incast -> police each sender's flows
into the victim, at the victim's link share (rate / senders) when --police-rate is given.
Other kinds are not acted on (their remedies -- move experts, drain a node, rebalance batches
-- belong to the scheduler: the finding's `actions`).
"""
from __future__ import annotations

import ipaddress
import json
import re
import struct
import subprocess
import time
from dataclasses import dataclass, field

from skewscope.core.errors import EXIT_KERNEL, EXIT_NOT_RUN, EXIT_USAGE, DataplaneError, SkewscopeError

MAX_RULES = 32                 # ebpf/mitigate.bpf.c MT_MAX_RULES
ANY_QP = 0xFFFFFFFF
NO_DSCP = 0xFF
ACTIONS = ("remark", "police")
#: struct mt_rule: src[16] dst[16] id dest_qp sport ipver dscp _pad expires_ns rate_bps burst created_ns note[48]
RULE_FMT = "<16s16sIIHBBIQQQQ48s"
RULE_SIZE = struct.calcsize(RULE_FMT)
#: struct mt_state: lock, pad, tokens, last_ns, packets, bytes, dropped, remarked
STATE_FMT = "<IIQQQQQQ"
STATE_SIZE = struct.calcsize(STATE_FMT)
assert RULE_SIZE == 128 and STATE_SIZE == 56

DEFAULT_DSCP = 8               # CS1: the conventional low-priority ("scavenger") class
DEFAULT_TTL = 300.0
#: kinds a plan acts on, and the action it takes by default
PLANNED_KINDS = {"prefill_interference": "remark", "incast": "police"}


class MitigationError(SkewscopeError):
    def __init__(self, msg: str, code: int = EXIT_USAGE):
        super().__init__(msg, code)


def _addr16(ip: str | None) -> tuple[bytes, int]:
    if ip is None:
        return b"\0" * 16, 0
    a = ipaddress.ip_address(ip)
    if a.version == 4:
        return b"\0" * 10 + b"\xff\xff" + a.packed, 4
    return a.packed, 6


def _addr_str(b: bytes) -> str | None:
    if b == b"\0" * 16:
        return None
    a = ipaddress.IPv6Address(b)
    return str(a.ipv4_mapped) if a.ipv4_mapped is not None else str(a)


@dataclass
class Rule:
    action: str                      # remark | police
    src: str | None = None
    dst: str | None = None
    sport: int | None = None
    dest_qp: int | None = None
    dscp: int | None = None          # remark
    rate_bps: float | None = None    # police: bits per second
    burst: int | None = None         # police: bytes
    ttl: float = DEFAULT_TTL
    note: str = ""                   # why: the finding id (or "manual")
    # set once applied (read back from the map)
    id: int = 0
    slot: int = -1
    expires_in: float | None = None
    created_at: float | None = None
    counters: dict = field(default_factory=dict)

    def check(self) -> "Rule":
        if self.action not in ACTIONS:
            raise MitigationError(f"action {self.action!r}: one of {', '.join(ACTIONS)}")
        for what in ("src", "dst"):
            v = getattr(self, what)
            if v is not None:
                try:
                    setattr(self, what, str(ipaddress.ip_address(v)))
                except ValueError:
                    raise MitigationError(f"{what} {v!r} is not an IPv4 or IPv6 address") from None
        if self.src and self.dst and ipaddress.ip_address(self.src).version != ipaddress.ip_address(self.dst).version:
            raise MitigationError(f"{self.src} and {self.dst} are not the same IP version")
        if self.src is None and self.dst is None:
            raise MitigationError("a rule needs a source or a destination address (refusing to act on all RoCE)")
        if self.sport is not None and not 0 < self.sport < 65536:
            raise MitigationError(f"UDP source port {self.sport}: 1..65535")
        if self.dest_qp is not None and not 0 <= self.dest_qp < 1 << 24:
            raise MitigationError(f"destination QP {self.dest_qp}: 0..0xffffff")
        if self.action == "remark" and (self.dscp is None or not 0 <= self.dscp < 64):
            raise MitigationError(f"DSCP {self.dscp}: 0..63")
        if self.action == "police":
            if not self.rate_bps or self.rate_bps <= 0:
                raise MitigationError("police needs a rate > 0 (--police-rate, e.g. 10G)")
            if self.burst is None:
                # 10 ms at the rate, at least 64 KiB: a RoCE message burst passes whole
                self.burst = max(64 << 10, int(self.rate_bps / 8 * 0.010))
        if not 1 <= self.ttl <= 7 * 86400:
            raise MitigationError(f"TTL {self.ttl:g} s: 1 s .. 7 days (every action reverts by itself)")
        return self

    def match_text(self) -> str:
        qp = f" QP 0x{self.dest_qp:06x}" if self.dest_qp is not None else ""
        sp = f" sport {self.sport}" if self.sport is not None else ""
        return f"{self.src or 'any'} -> {self.dst or 'any'}{sp}{qp}"

    def describe(self) -> str:
        if self.action not in ACTIONS:      # a tc rule of ours whose details were lost
            return f"tc rule of skewscope ({self.note})"
        if self.action == "remark":
            what = f"re-mark DSCP to {self.dscp}"
        else:
            what = f"police to {fmt_rate(self.rate_bps)} (burst {self.burst >> 10} KiB)"
        return f"{what}: RoCEv2 {self.match_text()}, for {self.ttl:g} s" + (f" ({self.note})" if self.note else "")

    def to_dict(self) -> dict:
        d = {"id": self.id or None, "action": self.action, "src": self.src, "dst": self.dst, "sport": self.sport,
             "dest_qp": self.dest_qp, "dscp": self.dscp, "rate_bps": self.rate_bps, "burst": self.burst,
             "ttl": self.ttl, "note": self.note, "describe": self.describe()}
        if self.id:
            d.update(expires_in=self.expires_in, created_at=self.created_at, counters=self.counters)
        return d

    # ---- the map's binary form ----------------------------------------------------------
    def pack(self, rid: int, now_boot_ns: int) -> bytes:
        s, v1 = _addr16(self.src)
        d, v2 = _addr16(self.dst)
        return struct.pack(RULE_FMT, s, d, rid, ANY_QP if self.dest_qp is None else self.dest_qp,
                           self.sport or 0, v1 or v2, NO_DSCP if self.action != "remark" else self.dscp, 0,
                           now_boot_ns + int(self.ttl * 1e9), int(self.rate_bps / 8) if self.action == "police" else 0,
                           int(self.burst or 0) if self.action == "police" else 0, int(time.time() * 1e9),
                           self.note.encode()[:47])

    @classmethod
    def unpack(cls, raw: bytes, slot: int, now_boot_ns: int) -> "Rule | None":
        (s, d, rid, qp, sport, _ipver, dscp, _p, exp, rate, burst, created, note) = struct.unpack(RULE_FMT, raw)
        if not rid:
            return None
        r = cls(action="police" if rate else "remark", src=_addr_str(s), dst=_addr_str(d), sport=sport or None,
                dest_qp=None if qp == ANY_QP else qp, dscp=None if dscp == NO_DSCP else dscp,
                rate_bps=rate * 8.0 if rate else None, burst=burst or None,
                note=note.split(b"\0")[0].decode(errors="replace"), id=rid, slot=slot)
        r.expires_in = (exp - now_boot_ns) / 1e9
        r.created_at = created / 1e9
        r.ttl = round((exp - now_boot_ns) / 1e9 + (time.time() - r.created_at), 1)
        return r


def same_key(r: Rule) -> tuple:
    """Two rules with this key are the same action: applying one renews the other."""
    return (r.action, r.src, r.dst, r.sport, r.dest_qp)


def unpack_state(raw: bytes) -> dict:
    _l, _p, _tok, _last, pk, by, dr, rm = struct.unpack(STATE_FMT, raw)
    return {"packets": pk, "bytes": by, "dropped": dr, "remarked": rm}


# ---- rates -----------------------------------------------------------------------------------
_RATE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kKmMgGtT]?)(bit|bps|b)?(/s)?\s*$")


def parse_rate(s: str) -> float:
    """'10G', '500M', '2.5Gbit', '1000000' -> bits per second."""
    m = _RATE.match(str(s))
    if not m:
        raise MitigationError(f"rate {s!r}: a number with an optional k/M/G/T suffix, bits per second (e.g. 10G)")
    v = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[m.group(2).lower()]
    if v <= 0:
        raise MitigationError(f"rate {s!r} must be > 0")
    return v


def fmt_rate(bps: float) -> str:
    for unit, k in (("Tbit/s", 1e12), ("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bps >= k:
            return f"{bps / k:.3g} {unit}"
    return f"{bps:.0f} bit/s"


# ---- plans -----------------------------------------------------------------------------------
def _finding_id(f: dict) -> str:
    from skewscope.outputs.events import finding_id  # light; the one id of a finding
    return finding_id(f)


def rules_for_finding(f: dict, action: str | None = None, dscp: int = DEFAULT_DSCP, rate_bps: float | None = None,
                      ttl: float = DEFAULT_TTL) -> list[Rule]:
    """The rules one finding asks for ([] for a kind a plan does not act on)."""
    kind = f.get("kind")
    if kind not in PLANNED_KINDS:
        return []
    act = action or PLANNED_KINDS[kind]
    ev = f.get("evidence") or {}
    ips = [str(x) for x in (f.get("entities") or {}).get("ips") or []]
    note = _finding_id(f)
    pairs: list[tuple[str, str]] = []
    rate = rate_bps
    if kind == "prefill_interference":
        pairs = [(s, d) for s in ev.get("prefill_senders") or [] for d in ev.get("kv_receivers") or []]
    elif kind == "incast" and ips:
        victim = ips[0]
        senders = sorted({fl[0] for fl in (f.get("entities") or {}).get("flows") or [] if fl[1] == victim}
                         or set(ips[1:]))
        pairs = [(s, victim) for s in senders]
        if rate is not None and act == "police" and senders:
            rate = rate / len(senders)            # the victim's link shared by the senders
    out = []
    for s, d in pairs:
        r = Rule(action=act, src=s, dst=d, ttl=ttl, note=note,
                 dscp=dscp if act == "remark" else None, rate_bps=rate if act == "police" else None)
        out.append(r)
    return out


def plan_from_document(doc: dict, kinds=None, finding: str | None = None, **kw) -> list[tuple[dict, list[Rule]]]:
    """[(finding, its rules)] for the findings of a diagnose/report/cluster JSON document (or
    /v1/findings) a plan acts on: warnings and criticals of PLANNED_KINDS (or `kinds`), or the
    one finding whose id is `finding`."""
    fs = doc.get("findings") if isinstance(doc, dict) else None
    if not isinstance(fs, list):
        raise MitigationError("the document has no 'findings' list (give diagnose --json, report --json or "
                              "/v1/findings output)")
    out = []
    for f in fs:
        if not isinstance(f, dict):
            continue
        if finding is not None:
            if _finding_id(f) != finding and f.get("id") != finding:
                continue
        elif f.get("severity") not in ("warning", "critical") or f.get("kind") not in (kinds or PLANNED_KINDS):
            continue
        rules = rules_for_finding(f, **kw)
        if rules:
            out.append((f, rules))
    if finding is not None and not out:
        known = [(_finding_id(f)) for f in fs if isinstance(f, dict)]
        raise MitigationError(f"no finding {finding!r} that a mitigation acts on (findings: {', '.join(known) or 'none'}; "
                              f"acted on: {', '.join(PLANNED_KINDS)})")
    return out


# ---- tc, for both backends --------------------------------------------------------------------
def tc(args: list[str], check: bool = True) -> subprocess.CompletedProcess:
    """`tc ARGS`; with check, a failure is one line (tc's first) with EXIT_KERNEL."""
    try:
        p = subprocess.run(["tc", *args], capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise DataplaneError("tc not found (Debian: iproute2)", EXIT_NOT_RUN) from None
    if check and p.returncode != 0:
        msg = (p.stderr.strip().splitlines() or ["?"])[0]
        raise DataplaneError(f"tc {' '.join(args)}: {msg}", EXIT_KERNEL)
    return p


def has_clsact(iface: str) -> bool:
    p = tc(["-j", "qdisc", "show", "dev", iface], check=False)
    try:
        return any(q.get("kind") == "clsact" for q in json.loads(p.stdout or "[]"))
    except json.JSONDecodeError:
        return False
