"""The action recipes a finding kind declares (Kind.actions): machine-readable suggestions a
controller subscribes to (docs/feedback.md "Actions"; outputs.events puts them in every
finding object). A recipe makes zero or one action dict from a finding dict (report /
diagnose / cluster --json: entities and evidence only, read through dict access); a kind's
actions are its recipes' in order. Light: no numpy.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from skewscope.analysis.detectors.registry import KEY_RING, ip_sort_key
from skewscope.core.numbers import finite


@dataclass(frozen=True)
class Action:
    """One recipe: `type` (the "type" of the dict it makes), `shape` (the dict, for the
    docs), fn(finding dict) -> [] or [action dict]."""
    type: str
    shape: str
    fn: Callable[[dict], list[dict]]

    def __call__(self, f: dict) -> list[dict]:
        return self.fn(f)


_num = finite


def _ips(f: dict) -> list[str]:
    return [str(x) for x in ((f.get("entities") or {}).get("ips") or [])]


def _first(f: dict) -> str | None:
    ips = _ips(f)
    return ips[0] if ips else None


def _weights(ev: dict, hot: str | None) -> dict:
    """Per-destination shares from the evidence: members + dest_bytes when the detector gives
    them (hot_destination), else only the hot destination's share."""
    mem, db = ev.get("members"), ev.get("dest_bytes")
    if isinstance(mem, list) and isinstance(db, list) and len(mem) == len(db):
        tot = sum(float(b) for b in db if _num(b) is not None)
        if tot > 0:
            return {str(ip): round(float(b) / tot, 6) for ip, b in zip(mem, db)}
    share = _num(ev.get("share"))
    if share is None:
        ws = ev.get("windows") or []
        share = _num(ws[-1].get("share")) if ws and isinstance(ws[-1], dict) else None
    return {hot: round(share, 6)} if hot and share is not None else {}


def _rebalance_experts(f: dict) -> list[dict]:
    ips, ev, first = _ips(f), f.get("evidence") or {}, _first(f)
    hot = str(ev.get("hot_destination") or first) if (ev.get("hot_destination") or first) else None
    if hot is None:
        return []
    w = _weights(ev, hot)
    members = [str(x) for x in (ev.get("members") or ips)]
    fair = _num(ev.get("fair_share")) or (1.0 / len(members) if members else None)
    share = w.get(hot)
    move = round(max(0.0, (share - fair) / share), 4) if share and fair else None
    return [{"type": "rebalance_experts", "hot": hot, "weights": w, "fair_share": fair, "move_fraction": move,
             "members": members}]


def _node_action(kind: str):
    def fn(f: dict) -> list[dict]:
        first = _first(f)
        return [{"type": kind, "node": first}] if first else []
    return fn


def _check_link(f: dict) -> list[dict]:
    ips = _ips(f)
    return [{"type": "check_link", "src": ips[0], "dst": ips[1]}] if len(ips) >= 2 else []


def _check_own_link(f: dict) -> list[dict]:
    first = _first(f)
    return [{"type": "check_link", "src": first, "dst": None}] if first else []


def _check_port_into(f: dict) -> list[dict]:
    first = _first(f)
    return [{"type": "check_link", "src": None, "dst": first}] if first else []


def _spread_senders(with_max: bool):
    def fn(f: dict) -> list[dict]:
        ips, first = _ips(f), _first(f)
        if not first:
            return []
        a = {"type": "spread_senders", "dst": first, "senders": ips[1:]}
        if with_max:
            a["max_senders"] = _num((f.get("evidence") or {}).get("max_senders"))
        return [a]
    return fn


def _rebalance_batches(f: dict) -> list[dict]:
    ev = f.get("evidence") or {}
    return [{"type": "rebalance_batches", "members": KEY_RING.entities(f),
             "gate_share": dict(ev.get("gate_share") or {}), "how": "pack or bucket sequences by length"}]


def _reroute_decode(f: dict) -> list[dict]:
    first = _first(f)
    return [{"type": "reroute_requests", "from": first, "members": [first], "to": None}] if first else []


def _reroute_instance(f: dict) -> list[dict]:
    ips, ev, first = _ips(f), f.get("evidence") or {}, _first(f)
    if not first:
        return []
    ratios = ev.get("per_instance_load_ratio") or {}
    to = sorted((str(k) for k, v in ratios.items() if k != first and (_num(v) or 0) < 1.0),
                key=lambda k: (_num(ratios[k]) or 0, ip_sort_key(k)))
    return [{"type": "reroute_requests", "from": first, "members": ips, "to": to,
             "load_ratio": _num(ev.get("load_ratio"))}]


def _isolate_prefill(f: dict) -> list[dict]:
    ips = _ips(f)
    return [{"type": "isolate_prefill", "members": ips}] if ips else []


REBALANCE_EXPERTS = Action(
    "rebalance_experts",
    '`{"type": "rebalance_experts", "hot": IP, "weights": {ip: share}, "fair_share", "move_fraction", "members"}` '
    "— `weights` = each destination's share of the bytes (from `members` + `dest_bytes`; only the hot one's "
    "`share` where the detector gives no per-destination bytes), `move_fraction` = (share − fair share) / share: "
    "the part of the hot node's traffic to move elsewhere", _rebalance_experts)
DRAIN = Action("drain", '`{"type": "drain", "node": IP}` (the blamed node)', _node_action("drain"))
CHECK_NODE = Action("check_node", '`{"type": "check_node", "node": IP}` (the blamed node)', _node_action("check_node"))
CHECK_LINK = Action("check_link", '`{"type": "check_link", "src": IP, "dst": IP}` (the first two IPs: the data '
                    "direction; a ring straggler's link to its successor)", _check_link)
CHECK_OWN_LINK = Action("check_link", '`{"type": "check_link", "src": IP, "dst": null}` (the node\'s own link)',
                        _check_own_link)
CHECK_PORT_INTO = Action("check_link", '`{"type": "check_link", "src": null, "dst": IP}` (the port towards the '
                         "congested node)", _check_port_into)
SPREAD_SENDERS = Action("spread_senders", '`{"type": "spread_senders", "dst": IP, "senders": [...]}` (the '
                        "congested node, the others)", _spread_senders(False))
SPREAD_INCAST_SENDERS = Action("spread_senders", '`{"type": "spread_senders", "dst": IP, "senders": [...], '
                               '"max_senders"}`', _spread_senders(True))
REBALANCE_BATCHES = Action("rebalance_batches", '`{"type": "rebalance_batches", "members": [...] (the ring: its '
                           'flows\' ends), "gate_share": {ip: share}, "how": "pack or bucket sequences by length"}`',
                           _rebalance_batches)
REROUTE_DECODE = Action("reroute_requests", '`{"type": "reroute_requests", "from": DECODE_IP, "members": '
                        '[DECODE_IP], "to": null}`', _reroute_decode)
REROUTE_INSTANCE = Action("reroute_requests", '`{"type": "reroute_requests", "from": INSTANCE (its first member), '
                          '"members": [...], "to": [instances below the median, least loaded first], "load_ratio"}`',
                          _reroute_instance)
ISOLATE_PREFILL = Action("isolate_prefill", '`{"type": "isolate_prefill", "members": [...]}`', _isolate_prefill)
