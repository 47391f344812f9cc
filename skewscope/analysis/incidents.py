"""Incidents: the findings of one analysis that share a root, read together (docs/metrics.md
"Incidents"). A hot expert is one incident, not alltoall_destination_skew and hot_destination
side by side; incast into a node comes with the ECN marks and CNPs on its downlink; a slow
shard with the decode jitter it causes.

    assign(doc)   doc["incidents"] = [incident, ...]; every finding gets "incident" (its id;
                  null for a context finding). In place; returns doc.

The rules, in order (each a small function below, the data they read is the Kind's `role`
and `key` in detectors/registry.py):

1. root: each finding names one entity its incident gathers around -- ("node", the blamed
   node: entities.ips[0]) for a kind whose first IP blames one node, ("group", its group) for
   a kind that judges a collective's members as a whole (GROUP_ROOTED), ("id", its event id)
   when it names neither;
2. causes on one root are one incident (a hot expert's two destination kinds on one
   destination; two findings with one event id always are one);
3. a symptom joins the incident of a cause on its root; else on the single destination of
   all its flows; else (a timing symptom) a cause of its group -- the first that matches, the
   more severe incident on a tie;
4. symptoms no cause explains lead their own incidents, one per root (ECN marks into a node
   and the CNP storm it sends);
5. context findings (the capture is sampled, the flow table overflowed) lead nothing and join
   nothing: every incident lists them under "context", their own "incident" is null.

The lead of an incident is its most severe cause (then: larger impact, the kind declared
first, the earlier finding), or its most severe symptom when it has no cause. The incident's
id is its lead's event id (registry.finding_id, as outputs.events): stable across analyses
and runs while the same condition leads.
"""
from __future__ import annotations

from functools import lru_cache

from skewscope.analysis.detectors import registry as R

#: kinds whose entities.ips[0] is one blamed node although their event key is every IP:
#: the likely paused receiver, the upstream seen late
FIRST_IP_NAMED = frozenset({"pfc_pause", "late_upstream"})

def _kind(name):
    try:
        return R.kind(str(name))
    except KeyError:
        return None


def role(f: dict) -> str:
    """The finding's incident role (registry.ROLES); a kind the registry does not know is a
    symptom (it may explain nothing)."""
    k = _kind(f.get("kind"))
    return k.role if k is not None else "symptom"


def group_rooted(name: str) -> bool:
    """True for a kind that judges a group's members as a whole (its first IP is only the
    first member): its event key is every IP, none, or a ring's flows, and it is not in
    FIRST_IP_NAMED."""
    k = _kind(name)
    if k is None or name in FIRST_IP_NAMED:
        return False
    return k.key.flow_ends or k.key.ips in (None, 0)


def root(f: dict) -> tuple:
    """Rule 1: ("node", ip), ("group", index) or ("id", event id)."""
    ips = (f.get("entities") or {}).get("ips") or []
    if group_rooted(str(f.get("kind"))):
        if f.get("group") is not None:
            return ("group", int(f["group"]))
    elif ips:
        return ("node", str(ips[0]))
    return ("id", R.finding_id(f))


def flow_destination(f: dict) -> tuple | None:
    """("node", dst) when every flow of the finding goes to one destination, else None."""
    dsts = {str(fl[1]) for fl in (f.get("entities") or {}).get("flows") or [] if len(fl) > 1}
    return ("node", dsts.pop()) if len(dsts) == 1 else None


def _rank(f: dict, i: int) -> tuple:
    """Sort key of a lead candidate (smaller leads): severity, impact, kind declared first,
    earlier finding."""
    imp = (f.get("impact") or {}).get("seconds") or 0.0
    order = _declared()
    return (-R.SEV_RANK.get(f.get("severity"), -1), -float(imp), order.get(str(f.get("kind")), len(order)), i)


@lru_cache(maxsize=1)
def _declared() -> dict:
    """{kind: its position in declaration order} (the registry is complete once imported)."""
    return {k: n for n, k in enumerate(R.kinds("node"))}


def _group_by_root(idx: list[int], fs: list[dict], roots: dict) -> list[list[int]]:
    """Rule 2/4: the findings of idx in sets of one root, or of one event id, in first-seen order."""
    parent = {i: i for i in idx}

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first: dict = {}
    for i in idx:
        for key in (roots[i], ("id", R.finding_id(fs[i]))):
            j = first.setdefault(key, i)
            if j != i:
                parent[find(i)] = find(j)
    out: dict[int, list[int]] = {}
    for i in idx:
        out.setdefault(find(i), []).append(i)
    return list(out.values())


def _on_root(i: int, c: dict, fs: list[dict], roots: dict) -> bool:
    """A cause of incident c has the symptom's root (the same blamed node, the same group)."""
    return any(roots[j] == roots[i] for j in c["_causes"])


def _on_flow_destination(i: int, c: dict, fs: list[dict], roots: dict) -> bool:
    """A cause of c is rooted at the one destination of all the symptom's flows."""
    d = flow_destination(fs[i])
    return d is not None and any(roots[j] == d for j in c["_causes"])


def _in_group(i: int, c: dict, fs: list[dict], roots: dict) -> bool:
    """A cause of c judges the symptom's group (a timing symptom under a member's cause)."""
    g = fs[i].get("group")
    return g is not None and any(fs[j].get("group") == g for j in c["_causes"])


#: rule 3: how a symptom joins a cause's incident, in order of preference
ATTACH = (_on_root, _on_flow_destination, _in_group)


def _attach(i: int, incs: list[dict], fs: list[dict], roots: dict):
    """Rule 3: the incident symptom i joins (the first ATTACH test any incident passes; among
    those, the incident whose lead ranks first), or None."""
    for test in ATTACH:
        hits = [c for c in incs if test(i, c, fs, roots)]
        if hits:
            return min(hits, key=lambda c: _rank(fs[c["lead"]], c["lead"]))
    return None


def _span(fs: list[dict], members: list[int]) -> tuple:
    """(since, until) of an incident: the earliest onset of its findings; until null while
    any of them still holds (an onset and no end), else the latest end; both null when no
    finding knows its onset."""
    timed = [fs[j] for j in members if fs[j].get("since") is not None]
    if not timed:
        return None, None
    since = min(float(x["since"]) for x in timed)
    if any(x.get("until") is None for x in timed):
        return since, None
    return since, max(float(x["until"]) for x in timed)


def message(lead: dict, others: list[dict]) -> str:
    """The lead's message, then " -- with: " and the other findings' kinds (once each)."""
    kinds = list(dict.fromkeys(str(x.get("kind")) for x in others))
    return str(lead.get("message")) + (" -- with: " + ", ".join(kinds) if kinds else "")


def incidents(findings: list[dict]) -> tuple[list[dict], list]:
    """(incidents, the incident id of each finding or None): the rules of the module doc."""
    fs = list(findings)
    roles = [role(f) for f in fs]
    roots = {i: root(f) for i, f in enumerate(fs)}
    causes = [i for i, r in enumerate(roles) if r == "cause"]
    incs = []
    for members in _group_by_root(causes, fs, roots):
        lead = min(members, key=lambda j: _rank(fs[j], j))
        incs.append({"lead": lead, "_causes": members, "_symptoms": []})
    orphans = []
    for i, r in enumerate(roles):
        if r != "symptom":
            continue
        c = _attach(i, incs, fs, roots)
        if c is None:
            orphans.append(i)
        else:
            c["_symptoms"].append(i)
    for members in _group_by_root(orphans, fs, roots):
        lead = min(members, key=lambda j: _rank(fs[j], j))
        incs.append({"lead": lead, "_causes": [], "_symptoms": [j for j in members if j != lead]})
    context = [i for i, r in enumerate(roles) if r == "context"]
    out = []
    for c in incs:
        lead = c["lead"]
        others = sorted(j for j in c["_causes"] if j != lead) + sorted(c["_symptoms"])
        members = [lead] + others
        since, until = _span(fs, members)
        lf = fs[lead]
        out.append({"id": R.finding_id(lf),
                    "severity": max((fs[j].get("severity") for j in members), key=lambda s: R.SEV_RANK.get(s, -1)),
                    "kind": lf.get("kind"), "lead": lead, "symptoms": others, "context": list(context),
                    "entities": list((lf.get("entities") or {}).get("ips") or []), "impact": lf.get("impact"),
                    "since": since, "until": until, "message": message(lf, [fs[j] for j in others])})
    out.sort(key=lambda x: (-R.SEV_RANK.get(x["severity"], -1), -float((x["impact"] or {}).get("seconds") or 0.0),
                            x["lead"]))
    of: list = [None] * len(fs)
    for x in out:
        for j in [x["lead"]] + x["symptoms"]:
            of[j] = x["id"]
    return out, of


def assign(doc: dict) -> dict:
    """doc["incidents"] and each finding's "incident" (in place; returns doc)."""
    fs = doc.get("findings") or []
    incs, of = incidents(fs)
    for f, iid in zip(fs, of):
        f["incident"] = iid
    doc["incidents"] = incs
    return doc


def refresh_messages(doc: dict) -> dict:
    """Each incident's message again from its findings' current messages (after a step that
    rewrites finding messages, e.g. naming addresses). In place; returns doc."""
    fs = doc.get("findings") or []
    for x in doc.get("incidents") or []:
        x["message"] = message(fs[x["lead"]], [fs[j] for j in x["symptoms"]])
    return doc


def markdown_table() -> str:
    """docs/metrics.md "Incidents": per node-scope kind, its role and the root it names."""
    lines = ["| kind | role | root |", "|---|---|---|"]
    for name in R.kinds("node"):
        k = R.kind(name)
        rt = ("—" if k.role == "context" else "its group (`group`)" if group_rooted(name)
              else "the node `entities.ips[0]`")
        lines.append(f"| `{name}` | {k.role} | {rt} |")
    return "\n".join(lines) + "\n"
