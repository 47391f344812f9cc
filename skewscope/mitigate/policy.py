"""The policy of the closed loop (`skewscope watch --mitigate POLICY`): which finding kinds may
be acted on, how, and the limits. YAML (or JSON, which is YAML):

    interface: pf0hpf          # where the actions go (required; not the interface watched)
    direction: ingress         # its hook
    backend: software          # software (cls_bpf; runs anywhere) or flower (tc flower rules a
                               # BlueField's eSwitch offloads; TTL by a scheduled reap)
    ttl_s: 300                 # every action's TTL (the kernel ends it even if watch dies)
    max_active: 16             # rules active at once (a plan that would exceed it is refused)
    cooldown_s: 120            # after a revert, the same finding id is not acted on for this long
    verify_after_s: 30         # then the finding's headline is compared with its value at apply
    min_improvement: 0.2       # ... and must have dropped by this fraction, else the action reverts
    kinds:
      prefill_interference: {action: remark, dscp: 8}
      incast: {action: police, rate: 100G}    # rate: the victim's link, shared by its senders

Only the kinds listed are acted on, only at warning or critical. Errors are one line naming
the file and line (exit 2).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from skewscope.core.textfile import compose_yaml, read_text, scalar_value
from skewscope.mitigate.rules import ACTIONS, DEFAULT_DSCP, PLANNED_KINDS, MitigationError, parse_rate

KEYS = {"interface", "direction", "backend", "ttl_s", "max_active", "cooldown_s", "verify_after_s", "min_improvement", "kinds"}
KIND_KEYS = {"action", "dscp", "rate"}
BACKENDS = ("software", "flower")


@dataclass
class KindPolicy:
    action: str
    dscp: int = DEFAULT_DSCP
    rate_bps: float | None = None


@dataclass
class Policy:
    interface: str
    direction: str = "ingress"
    backend: str = "software"
    ttl_s: float = 300.0
    max_active: int = 16
    cooldown_s: float = 120.0
    verify_after_s: float = 30.0
    min_improvement: float = 0.2
    kinds: dict = field(default_factory=dict)     # kind -> KindPolicy
    source: str = ""


def _line(node) -> int:
    return node.start_mark.line + 1


def load(path: str | Path) -> Policy:
    import yaml  # a dependency; the policy is YAML
    p = Path(path)
    root = compose_yaml(read_text(p, "the policy", MitigationError), str(p), MitigationError)
    if root is None or not isinstance(root, yaml.MappingNode):
        raise MitigationError(f"{p}: a policy is a mapping (interface:, kinds:, ...; docs/mitigation.md)")
    pol = Policy(interface="", source=str(p))
    seen = False
    for kn, vn in root.value:
        key, where = kn.value, f"{p}:{_line(kn)}"
        if key not in KEYS:
            raise MitigationError(f"{where}: unknown key {key!r} (one of {', '.join(sorted(KEYS))})")
        if key == "kinds":
            pol.kinds = _kinds(vn, p)
            seen = True
            continue
        if not isinstance(vn, yaml.ScalarNode):
            raise MitigationError(f"{where}: {key} takes one value")
        v = scalar_value(vn)
        if key == "interface":
            pol.interface = str(v)
        elif key == "direction":
            if v not in ("ingress", "egress"):
                raise MitigationError(f"{where}: direction {v!r}: ingress or egress")
            pol.direction = v
        elif key == "backend":
            if v not in BACKENDS:
                raise MitigationError(f"{where}: backend {v!r}: {' or '.join(BACKENDS)}")
            pol.backend = v
        else:
            lim = {"ttl_s": (1, 7 * 86400), "max_active": (1, 32), "cooldown_s": (0, 86400),
                   "verify_after_s": (0, 86400), "min_improvement": (0, 1)}[key]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not lim[0] <= v <= lim[1]:
                raise MitigationError(f"{where}: {key} {vn.value!r}: a number in {lim[0]}..{lim[1]}")
            setattr(pol, key, int(v) if key == "max_active" else float(v))
    if not pol.interface:
        raise MitigationError(f"{p}: no 'interface' (where the actions go, e.g. the host's representor pf0hpf)")
    if not seen or not pol.kinds:
        raise MitigationError(f"{p}: no 'kinds' (which findings may be acted on: {', '.join(PLANNED_KINDS)})")
    return pol


def _kinds(node, p) -> dict:
    import yaml  # a dependency; the policy is YAML
    if not isinstance(node, yaml.MappingNode):
        raise MitigationError(f"{p}:{_line(node)}: kinds is a mapping kind -> {{action, dscp | rate}}")
    out = {}
    for kn, vn in node.value:
        kind, where = kn.value, f"{p}:{_line(kn)}"
        if kind not in PLANNED_KINDS:
            raise MitigationError(f"{where}: kind {kind!r} is not one a mitigation acts on "
                                  f"({', '.join(PLANNED_KINDS)})")
        if not isinstance(vn, yaml.MappingNode):
            raise MitigationError(f"{where}: {kind} takes a mapping {{action, dscp | rate}}")
        vals = {}
        for k2, v2 in vn.value:
            if k2.value not in KIND_KEYS:
                raise MitigationError(f"{p}:{_line(k2)}: unknown key {k2.value!r} (one of {', '.join(sorted(KIND_KEYS))})")
            vals[k2.value] = (v2.value, _line(k2))
        action = vals.get("action", (PLANNED_KINDS[kind], 0))[0]
        if action not in ACTIONS:
            raise MitigationError(f"{p}:{vals['action'][1]}: action {action!r}: one of {', '.join(ACTIONS)}")
        kp = KindPolicy(action=action)
        if "dscp" in vals:
            v, ln = vals["dscp"]
            if not str(v).isdigit() or not 0 <= int(v) < 64:
                raise MitigationError(f"{p}:{ln}: dscp {v!r}: 0..63")
            kp.dscp = int(v)
        if "rate" in vals:
            v, ln = vals["rate"]
            try:
                kp.rate_bps = parse_rate(v)
            except MitigationError as e:
                raise MitigationError(f"{p}:{ln}: {e}") from None
        if action == "police" and kp.rate_bps is None:
            raise MitigationError(f"{where}: {kind}: police needs a rate (e.g. rate: 100G)")
        out[kind] = kp
    return out
