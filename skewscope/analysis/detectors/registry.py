"""The detector registry: every finding kind, its thresholds and the detector that emits it,
declared once.

A family module (alltoall.py, rings.py, ...) declares `DETECTORS = [Detector(...)]` (and
`PARAMETERS = [Parameters(...)]` for analysis parameters that are not findings); the
package registers them in FAMILIES order (detectors/__init__.py); everything else is
derived from REGISTRY:

* `detect()` / the fleet's `analyze_matrix()` run the detectors of their scope in `stage`
  order (ties: registration order);
* the live per-interval subset (`analysis.live_metrics`) runs the entries with live=True;
* `resolve_thresholds()` / `resolve_checks()` (`--threshold`, `--check`), `DEFAULTS`,
  `KINDS`, `diagnose --list-checks` and the tables in docs/metrics.md "Findings"
  (`markdown_tables()`, checked by tests/unit/test_detector_registry.py).

Adding a finding kind = one `Kind` in one module's `Detector(...)` (plus the code that emits it):
its thresholds and docs lines, and -- keyword-only, required -- its event `key` (which
entities key its event id), `headline` (the evidence numbers whose move makes an `updated`
event), `actions` (recipes of actions.py) and incident `role` (ROLES); outputs.events,
outputs.cluster and outputs.html read them here, and docs/feedback.md "Kinds" is generated
from them (`kinds_table()`).

A finding (`Finding.to_dict()`, the `report --json` / `diagnose --json` / `cluster --json`
contract): {"kind", "severity" (info|warning|critical), "entities" {"ips", "qps", "flows":
[[src, dst, dest_qp], ...]}, "evidence" {numbers}, "message" (one line), "group" (index into
"collectives" or null), "impact" ({"seconds", "share"}: the estimated time lost per
iteration / token and its share of the period, common.impact_of; null where it cannot be
estimated; per kind in docs/metrics.md "Impact"), "since" / "until" (s, on the snapshot's
clock = meta first_ts/last_ts ns / 1e9: when the condition began, and when it stopped
holding -- null = still holding at the end of the data; both null when unknown; per kind
in docs/metrics.md "Onset", Kind.onset)}. entities.ips lists the node(s) the finding blames first (the hot
node, the slow sender, the paused receiver), then the others involved. analyze() adds "incident" (the id of
its incident, analysis.incidents; null for a context finding).
"""
from __future__ import annotations

import copy
import ipaddress
import json
import math
from dataclasses import dataclass, field
from typing import Any, Callable

from skewscope.core.digest import sha256
from skewscope.core.errors import EXIT_NOT_RUN, SkewscopeError

SEVERITIES = ("info", "warning", "critical")
SEV_RANK = {s: i for i, s in enumerate(SEVERITIES)}

#: what a detector reads: "flows" (the flow table's counters), "records" (message records:
#: rates over active time, stalls), "groups" (collective classification + group metrics),
#: "fleet" (Prometheus node-pair series, `skewscope cluster`)
NEEDS = ("flows", "records", "groups", "fleet")
SCOPES = ("node", "fleet")


class ThresholdError(SkewscopeError, ValueError):
    """Unknown check or threshold name, or a bad value (one line for the user). diagnose
    documents exit 3 (could not run) for it; still a ValueError for API callers."""

    def __init__(self, msg: str, code: int = EXIT_NOT_RUN):
        super().__init__(msg, code)


@dataclass(frozen=True)
class Threshold:
    """One overridable number: `--threshold SECTION.NAME=VALUE` (SECTION = the finding kind
    or parameter section it belongs to)."""
    name: str
    default: float
    unit: str            # "ratio", "fraction", "bytes", "s", "count", "1/s", "Gb/s", "MADs"
    meaning: str


#: a kind's incident role (Kind.role; docs/feedback.md "Kinds"): how a finding of the kind
#: relates to the others of one analysis when they are read together as one incident
#: (a slow node's ring_straggler and the period_jitter and ECN marks it causes)
ROLES = {
    "cause": "names a condition of an entity (a node, a link, a destination, a load split) that makes the "
             "job slow and that an action on that entity can remove: an incident's lead",
    "symptom": "an effect on the wire or on the timing (jitter, congestion marks, pauses, resends, a late "
               "upstream seen from one node) that a cause on the same entities explains; it leads an "
               "incident only when no cause does",
    "context": "a property of the observation, not of the traffic (the flow table overflowed, the capture "
               "is sampled): it qualifies every other finding and never leads an incident",
}


def ip_sort_key(s):
    """IPv4 before IPv6, numerically; a string that is no address last."""
    try:
        a = ipaddress.ip_address(str(s))
        return (0, a.version, int(a), "")
    except ValueError:
        return (1, 0, 0, str(s))


def sorted_ips(xs) -> list[str]:
    """Deduplicated, in ip_sort_key order."""
    return sorted({str(x) for x in xs}, key=ip_sort_key)


@dataclass(frozen=True)
class EventKey:
    """Which entities of a finding key its event id (outputs.events.finding_id): the same
    key entities = the same condition (one id across analyses, runs and finding order);
    the rest of entities.ips ("then the members / the senders") may change between analyses
    of one condition without making it a new one. `ips`: the first N of entities.ips (the
    blamed node(s) first), None = all of them, 0 = none (one id per kind); `flow_ends`: the
    endpoints of entities.flows instead (entities.ips when it has no flows)."""
    ips: int | None = None
    flow_ends: bool = False

    def entities(self, f: dict) -> list[str]:
        """The key entities of a finding dict (sorted, deduplicated)."""
        ent = f.get("entities") or {}
        ips = [str(x) for x in (ent.get("ips") or [])]
        if self.flow_ends:
            ends = [x for fl in (ent.get("flows") or []) for x in list(fl)[:2]]
            return sorted_ips(ends or ips)
        return sorted_ips(ips if self.ips is None else ips[:self.ips])

    def describe(self) -> str:
        if self.flow_ends:
            return "the endpoints of its flows"
        if self.ips is None:
            return "all its IPs"
        if self.ips == 0:
            return "none (one id per kind)"
        return "the first IP" if self.ips == 1 else f"the first {self.ips} IPs"


def finding_key(f: dict) -> list[str]:
    """The key entities of a finding dict (sorted, deduplicated): the part of its entities
    that names the condition (its Kind's `key`); a kind the registry does not know: all its IPs."""
    try:
        return kind(str(f.get("kind"))).key.entities(f)
    except KeyError:
        return sorted_ips((f.get("entities") or {}).get("ips") or [])


def finding_id(f: dict) -> str:
    """A finding's stable id: "<kind>:" + the first 16 hex digits of sha256 over kind and the
    sorted key entities (same condition, same id: across runs, processes, finding order).
    The event id of outputs.events and the id of the incident a finding leads (analysis.incidents)."""
    k = str(f.get("kind"))
    canon = json.dumps([k, finding_key(f)], separators=(",", ":"))
    return f"{k}:{sha256(canon.encode()).hexdigest()[:16]}"


#: the event keys the kinds use (docs/feedback.md "Key entities")
KEY_BLAMED = EventKey(1)          # the blamed node
KEY_LINK = EventKey(2)            # the two ends of a link (src, dst)
KEY_MEMBERS = EventKey(None)      # every node involved (a group's members)
KEY_NONE = EventKey(0)            # one condition per kind (a property of the capture)
KEY_RING = EventKey(flow_ends=True)   # the ring (the ends of its flows): a rotating gate stays one condition


@dataclass(frozen=True)
class Kind:
    """A finding kind: everything known about it, declared once -- its thresholds and its
    line in docs/metrics.md "Findings"; what makes its event id (`key`), the evidence numbers
    whose move makes an `updated` event (`headline`), the actions it suggests (`actions`),
    its incident `role` (ROLES) -- docs/feedback.md "Kinds", read by outputs.events (ids,
    updates, actions), outputs.cluster (`seen_by`) and outputs.html (`figure`). `key`,
    `headline`, `actions` and `role` must be given (keyword-only): a new kind cannot fall
    back to default ids or never be updated."""
    name: str
    fires: str           # "fires when (defaults)"
    blames: str          # what entities.ips lists first
    thresholds: tuple[Threshold, ...] = ()
    #: the evidence over time its `since`/`until` come from (docs/metrics.md "Onset"; the
    #: code: analysis.onset, called where the finding is made); "" = the generic one
    #: (ONSET_FALLBACK)
    onset: str = ""
    #: which entities key its event id (EventKey; KEY_BLAMED, KEY_LINK, ...)
    key: EventKey = field(kw_only=True)
    #: evidence numbers whose relative move > the tracker's `change` (25 %) since the id's last
    #: event makes an `updated` event (besides a severity change); () = severity only. Not
    #: counts that only grow with the window (packets, steps)
    headline: tuple[str, ...] = field(kw_only=True)
    #: the machine-readable suggestions (detectors.actions: Action recipes, concatenated); ()
    #: = nothing to automate
    actions: tuple = field(kw_only=True)
    #: "cause", "symptom" or "context" (ROLES)
    role: str = field(kw_only=True)
    #: `skewscope cluster`: the per-DPU drill-down of its `seen_by` evidence -- the FleetMatrix
    #: per-pair series each DPU's count is read from ("bytes", "ce_packets", ...; "naks"),
    #: "link" (each DPU's bytes and rate of evidence.link), "" = none
    seen_by: str = ""
    #: the capture-wide picture of the HTML page that stands for its evidence when the
    #: evidence itself draws none ("pfc_per_priority"), "" = none
    figure: str = ""

    def check(self) -> None:
        """ValueError when a declaration is incomplete or malformed (register() calls it)."""
        if not isinstance(self.key, EventKey):
            raise ValueError(f"kind {self.name}: key must be an EventKey")
        if not isinstance(self.headline, tuple) or not all(isinstance(h, str) and h for h in self.headline):
            raise ValueError(f"kind {self.name}: headline must be a tuple of evidence names")
        if not isinstance(self.actions, tuple) or not all(callable(a) and getattr(a, "type", "")
                                                          for a in self.actions):
            raise ValueError(f"kind {self.name}: actions must be a tuple of detectors.actions.Action")
        if self.role not in ROLES:
            raise ValueError(f"kind {self.name}: role {self.role!r} is not one of {', '.join(ROLES)}")
        if self.figure not in FIGURES:
            raise ValueError(f"kind {self.name}: figure {self.figure!r} is not one of {FIGURES}")

    def actions_for(self, f: dict) -> list[dict]:
        """Its actions for one finding dict: the recipes' actions, in order."""
        return [a for rec in self.actions for a in rec(f)]


#: Kind.figure values (outputs/html.py draws them)
FIGURES = ("", "pfc_per_priority")


@dataclass(frozen=True)
class Detector:
    """fn(inputs, emitter) emits Findings through the emitter (node scope: Emitter.add;
    fleet: Emitter.add_fleet). `kinds` are declared here; `emits` are kinds declared by
    another detector that this one also emits (e.g. slow_link by stalls). `extra`:
    thresholds this detector adds to a kind declared elsewhere (SECTION, Threshold) --
    the fleet detectors' own numbers for the single-node kinds."""
    name: str
    fn: Callable[[Any, Any], None]
    kinds: tuple[Kind, ...] = ()
    emits: tuple[str, ...] = ()
    needs: frozenset = frozenset({"flows"})
    live: bool = False
    stage: int = 50
    doc: str = ""
    extra: tuple[tuple[str, Threshold], ...] = ()

    @property
    def scope(self) -> str:
        return "fleet" if "fleet" in self.needs else "node"

    @property
    def all_kinds(self) -> tuple[str, ...]:
        return tuple(k.name for k in self.kinds) + tuple(self.emits)


@dataclass(frozen=True)
class Parameters:
    """Analysis parameters that are not findings (overridable the same way)."""
    section: str
    thresholds: tuple[Threshold, ...]
    doc: str = ""


REGISTRY: list[Detector] = []
PARAMETERS: list[Parameters] = []
#: kind -> (fn(inputs, finding) -> analysis.onset.Onset | None, what it reads): the onset of
#: a finding its detector left without one, tried before ONSET_FALLBACK (a family module's
#: ONSET_FNS; Emitter.fill_onsets)
ONSET_FNS: dict[str, tuple[Callable[[Any, Any], Any], str]] = {}


def register(d: Detector) -> Detector:
    bad = set(d.needs) - set(NEEDS)
    if bad:
        raise ValueError(f"detector {d.name}: unknown needs {sorted(bad)}")
    declared = {k.name for det in REGISTRY for k in det.kinds}
    for k in d.kinds:
        k.check()
        if k.name in declared:
            raise ValueError(f"kind {k.name} declared twice")
    keys = {(s, t.name) for s, t in all_thresholds()}
    for s, t in [(k.name, t) for k in d.kinds for t in k.thresholds] + list(d.extra):
        if (s, t.name) in keys:
            raise ValueError(f"threshold {s}.{t.name} declared twice")
        keys.add((s, t.name))
    if any(x.name == d.name for x in REGISTRY):
        raise ValueError(f"detector {d.name} registered twice")
    REGISTRY.append(d)
    return d


def register_onset(kind_name: str, fn, doc: str) -> None:
    if kind_name in ONSET_FNS:
        raise ValueError(f"onset function for {kind_name} declared twice")
    ONSET_FNS[kind_name] = (fn, doc)


def parameters(p: Parameters) -> Parameters:
    PARAMETERS.append(p)
    return p


def all_thresholds():
    """Every (section, Threshold) declared, both scopes and the parameters."""
    for det in REGISTRY:
        for k in det.kinds:
            for t in k.thresholds:
                yield k.name, t
        yield from det.extra
    for p in PARAMETERS:
        for t in p.thresholds:
            yield p.section, t


def detectors(scope: str = "node", live: bool | None = None) -> list[Detector]:
    """The detectors of a scope in run order (stage, then registration)."""
    out = [d for d in REGISTRY if d.scope == scope and (live is None or d.live == live)]
    return sorted(out, key=lambda d: d.stage)            # stable: registration order on ties


def kinds(scope: str = "node") -> tuple[str, ...]:
    """Declared finding kinds (declaration order) that the detectors of a scope emit."""
    emitted = {k for d in REGISTRY if d.scope == scope for k in d.all_kinds}
    return tuple(k.name for d in REGISTRY for k in d.kinds if k.name in emitted)


def kind(name: str) -> Kind:
    for d in REGISTRY:
        for k in d.kinds:
            if k.name == name:
                return k
    raise KeyError(name)


def thresholds(scope: str = "node") -> dict[str, dict[str, Threshold]]:
    """{section: {name: Threshold}}: the kinds' (declaration order), then (node scope) the
    parameter sections. The fleet scope also has the single-node thresholds: where a fleet
    detector asks the same question it reads the same number."""
    out: dict[str, dict[str, Threshold]] = {}
    for det in REGISTRY:
        for k in det.kinds:
            if det.scope == "node":
                out[k.name] = {t.name: t for t in k.thresholds}
    if scope == "node":
        for p in PARAMETERS:
            out[p.section] = {t.name: t for t in p.thresholds}
        return out
    for det in REGISTRY:
        if det.scope == "fleet":
            for s, t in det.extra:
                out.setdefault(s, {})[t.name] = t
    return out


def defaults(scope: str = "node") -> dict[str, dict[str, float]]:
    return {s: {n: t.default for n, t in ts.items()} for s, ts in thresholds(scope).items()}


def param_sections() -> tuple[str, ...]:
    return tuple(p.section for p in PARAMETERS)


def resolve_thresholds(over=None, scope: str = "node") -> dict:
    """The defaults of a scope with overrides: {"KIND.NAME": value} or {"KIND": {"NAME":
    value}}. Raises ThresholdError on an unknown name or a bad value."""
    base = defaults(scope)
    th = copy.deepcopy(base)
    if not over:
        return th
    items = []
    for k, v in over.items():
        if isinstance(v, dict):
            items += [(f"{k}.{n}", x) for n, x in v.items()]
        else:
            items.append((k, v))
    for key, val in items:
        if "." not in key:
            raise ThresholdError(f"threshold {key!r}: use KIND.NAME=VALUE")
        kind_, name = key.split(".", 1)
        if kind_ not in th:
            raise ThresholdError(f"unknown finding kind {kind_!r} in threshold {key!r} (kinds: {', '.join(base)})")
        if name not in th[kind_]:
            names = ", ".join(th[kind_]) or "none"
            raise ThresholdError(f"unknown threshold {name!r} for {kind_} (known: {names})")
        try:
            fv = float(val)
        except (TypeError, ValueError):
            raise ThresholdError(f"threshold {key}: not a number: {val!r}") from None
        if not math.isfinite(fv) or fv < 0:
            raise ThresholdError(f"threshold {key}: must be a finite number >= 0")
        th[kind_][name] = fv
    return th


def resolve_checks(checks, scope: str = "node") -> set:
    ks = kinds(scope)
    if not checks:
        return set(ks)
    out = set()
    for c in checks:
        for part in str(c).split(","):
            part = part.strip()
            if not part:
                continue
            if part not in ks:
                raise ThresholdError(f"unknown check {part!r} (kinds: {', '.join(ks)})")
            out.add(part)
    return out


# ---- the finding ---------------------------------------------------------------------------
@dataclass
class Entities:
    ips: list = field(default_factory=list)       # IP strings, the blamed node(s) first
    qps: list = field(default_factory=list)       # QP numbers
    flows: list = field(default_factory=list)     # [src, dst, dest_qp] as in the document's flows[]

    def to_dict(self) -> dict:
        return {"ips": list(self.ips), "qps": list(self.qps), "flows": list(self.flows)}


#: the onset of a finding whose kind names no series of its own, or whose series gave none
ONSET_FALLBACK = ("since = the first data record of the finding's flows (the flow table's first packet when "
                  "there are no records), until = null: the condition is taken to hold over all its data; "
                  "both null for a finding without flows")


@dataclass
class Finding:
    kind: str
    severity: str
    entities: Entities
    evidence: dict
    message: str
    group: int | None = None
    impact: dict | None = None        # common.impact_of(): {"seconds", "share"} or None
    since: float | None = None        # s, snapshot clock: the condition's onset
    until: float | None = None        # s: where it stopped holding; None = still at the end
    rows: Any = field(default=None, repr=False, compare=False)   # flow rows (not in the JSON)

    def to_dict(self) -> dict:
        """The JSON object (key order is part of the contract)."""
        return {"kind": self.kind, "severity": self.severity, "entities": self.entities.to_dict(),
                "evidence": self.evidence, "message": self.message, "group": self.group, "impact": self.impact,
                "since": self.since, "until": self.until}


# ---- documentation -------------------------------------------------------------------------
def _num(v: float, unit: str) -> str:
    if unit == "s" and 0 < v < 1:
        return f"{v * 1e6:g} µs" if v < 1e-3 else f"{v * 1e3:g} ms"
    if float(v).is_integer() and v >= 1 << 20 and int(v) % (1 << 20) == 0:
        return f"{int(v) >> 20} MiB"
    if float(v).is_integer():
        return f"{int(v):,}"
    return f"{v:g}"


def onset_table() -> str:
    """The table of docs/metrics.md "Onset": per node-scope kind, where since/until come from."""
    lines = ["| kind | since / until from |", "|---|---|"]
    for det in REGISTRY:
        if det.scope != "node":
            continue
        for k in det.kinds:
            extra = ONSET_FNS.get(k.name, (None, ""))[1]
            text = k.onset or (f"{extra}; else generic" if extra else "generic")
            lines.append(f"| `{k.name}` | {text} |")
    return "\n".join(lines) + "\n\ngeneric: " + ONSET_FALLBACK + ".\n"


def markdown_tables() -> str:
    """The tables of docs/metrics.md "Findings" (between the generated-table markers)."""
    lines = ["| kind | fires when (defaults) | blames | thresholds |", "|---|---|---|---|"]
    for det in REGISTRY:
        if det.scope != "node":
            continue
        for k in det.kinds:
            th = ", ".join(f"`{k.name}.{t.name}`" for t in k.thresholds) or "(none)"
            lines.append(f"| `{k.name}` | {k.fires} | {k.blames} | {th} |")
    lines += ["", "| threshold | default | unit | scope | meaning |", "|---|---|---|---|---|"]
    for scope in SCOPES:
        seen = set()
        rows = [(k.name, t) for det in REGISTRY if det.scope == scope for k in det.kinds for t in k.thresholds]
        rows += [x for det in REGISTRY if det.scope == scope for x in det.extra]
        if scope == "node":
            rows += [(p.section, t) for p in PARAMETERS for t in p.thresholds]
        for s, t in rows:
            if (s, t.name) in seen:
                continue
            seen.add((s, t.name))
            where = "parameter" if s in param_sections() else scope
            lines.append(f"| `{s}.{t.name}` | {_num(t.default, t.unit)} | {t.unit} | {where} | {t.meaning} |")
    return "\n".join(lines) + "\n"


def kinds_table() -> str:
    """The tables of docs/feedback.md "Kinds": the incident roles, then per node-scope kind
    its role, event key, headline numbers and actions, then what each action recipe makes."""
    lines = ["| role | meaning |", "|---|---|"]
    lines += [f"| `{r}` | {text} |" for r, text in ROLES.items()]
    lines += ["", "| kind | role | event id key (of `entities`) | `updated` when moves > 25 % | actions |",
              "|---|---|---|---|---|"]
    recipes = []
    for det in REGISTRY:
        if det.scope != "node":
            continue
        for k in det.kinds:
            hl = ", ".join(f"`{h}`" for h in k.headline) or "(severity only)"
            acts = ", ".join(f"`{a.type}`" for a in k.actions) or "—"
            lines.append(f"| `{k.name}` | {k.role} | {k.key.describe()} | {hl} | {acts} |")
            recipes += [a for a in k.actions if a not in recipes]
    lines += ["", "| action | made as | for |", "|---|---|---|"]
    for a in recipes:
        users = ", ".join(f"`{k.name}`" for det in REGISTRY if det.scope == "node" for k in det.kinds
                          if a in k.actions)
        lines.append(f"| `{a.type}` | {a.shape} | {users} |")
    return "\n".join(lines) + "\n"


def _exact(v) -> str:
    """Short but exact (1048576, not 1.04858e+06)."""
    return f"{v:g}" if float(f"{v:g}") == v else repr(v)


def list_checks_lines() -> list[str]:
    """`diagnose --list-checks`: every check and parameter section, then each threshold."""
    out = []
    for s, ts in thresholds("node").items():
        names = ", ".join(f"{n}={_exact(t.default)}" for n, t in ts.items()) or "-"
        out.append(f"{s:28s} {'(parameters) ' if s in param_sections() else ''}{names}")
        for n, t in ts.items():
            out.append(f"    {n:16s} {_exact(t.default):<10} {t.unit:9s} {t.meaning}")
    return out
