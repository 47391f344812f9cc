"""Scenario model: defaults, validation, YAML/JSON loading.  A scenario is a plain dict:

    name, description                 free text
    nodes: 8                          node i has IP 10.0.0.(i+1) (fd00::(i+1) with ip_version 6)
    ip_version: 4 | 6, vlan: null | id, vlan_pcp: 3
    mtu: 4096 (IB MTU: 256..4096), link_gbps: 100, efficiency: 0.97 (share of line rate a flow paces at)
    imm_endian: be | le, ecn: ect0 | ect1 | none, psn_start: 0 | int | random, pkey, sport: mlx5 | int
    prop_ns, resp_delay_ns, rtt_us, ack_coalesce_us, ackreq_every, ack_syndrome, cnp_interval_us,
    cts_lead_us                       timing of the responder / link model (see model.py)
    iterations, period_ms, jitter, start_ms   defaults for every workload
    workloads: [ {kind: ring_allreduce|tree_allreduce|all_to_all|p2p_pipeline|tp_decode|moe_decode
                        |decode_tp|decode_ep|kv_transfer,
                  members: all | [node, ...], ...kind parameters} ]
    pathologies: [ {kind: straggler|hot_expert|incast|congestion|loss|pfc_pause|pipeline_bubble|slow_link
                          |slow_tp_shard|hot_destination|pd_imbalance|kv_transfer_slow|rotating_straggler, ...} ]
    background: null | {pps, plen, dport}     non-RoCE UDP frames between random nodes

Sizes may be written as ints or strings like "8MiB", "512KiB", "64k".
"""
from __future__ import annotations

import copy
import json
import os
import re

from skewscope.gen import presets as _presets


class ScenarioError(ValueError):
    """A scenario that cannot be used; the message is one line for the user."""


TOP = dict(
    name="custom", description="", nodes=8, ip_version=4, ipv4_base="10.0.0.0",
    ipv6_base="fd00::", vlan=None, vlan_pcp=3, mtu=4096, link_gbps=100.0, efficiency=0.97,
    imm_endian="be", ecn="ect0", psn_start=0, pkey=0xFFFF, sport="mlx5", prop_ns=500,
    resp_delay_ns=1000, rtt_us=8.0, ack_coalesce_us=2.0, ackreq_every=64, ack_syndrome=0x14,
    cnp_interval_us=10.0, cts_lead_us=2.0, iterations=2, period_ms=5.0, jitter=0.0,
    start_ms=0.0, workloads=None, pathologies=None, background=None,
)
INHERIT = ("iterations", "period_ms", "jitter", "start_ms")
COMMON = dict(members="all", hop_us=2.0, channels=2, qps=1)
WORKLOADS = {
    "ring_allreduce": dict(bytes="8MiB", protocol="simple"),
    "tree_allreduce": dict(bytes="8MiB", protocol="simple"),
    "all_to_all": dict(bytes_per_peer="512KiB", matrix=None, zipf=0.0, inflight=8,
                       combine=False, channels=1),
    "p2p_pipeline": dict(activation_bytes="1MiB", microbatches=4, fwd_us=150.0, bwd_us=300.0,
                         channels=1),
    "tp_decode": dict(layers=16, tokens=2, token_ms=8.0, ar_bytes="16KiB", layer_compute_us=20.0,
                      prefill_every=0, prefill_bytes="1MiB", channels=1),
    "moe_decode": dict(layers=8, tokens=2, token_ms=8.0, bytes_per_peer="16KiB", matrix=None,
                       zipf=0.0, inflight=8, layer_compute_us=30.0, channels=1),
    # inference workloads with token-gap timing (inference.py, docs/generator.md)
    "decode_tp": dict(layers=8, allreduces_per_layer=2, tokens=4, hidden=4096, batch=1,
                      dtype_bytes=2, ar_bytes=None, protocol="ll", layer_compute_us=10.0,
                      compute_gap_us=2000.0, channels=1),
    "decode_ep": dict(layers=4, tokens=4, bytes_per_dest="2KiB", layer_compute_us=20.0,
                      expert_compute_us=20.0, compute_gap_us=2000.0, inflight=8, channels=1),
    "kv_transfer": dict(prefill=None, decode=None, requests=16, interval_us=100.0,
                        arrival="uniform", arrival_batch=1, block_bytes="128KiB", block_bytes_max=None,
                        blocks_per_request=16, prefill_us=50.0, router="weighted_rr",
                        weights=None, notify=True, channels=1),
}
SIZE_KEYS = {"bytes", "bytes_per_peer", "activation_bytes", "ar_bytes", "prefill_bytes",
             "bytes_per_dest", "block_bytes", "block_bytes_max"}
PATHOLOGIES = {
    "straggler": dict(node=None, rate_factor=0.5, start_lag_us=0.0),
    "hot_expert": dict(node=None, factor=4.0),
    "incast": dict(target=None, senders=None, bytes="1MiB", at_ms=1.0, repeat=1,
                   period_ms=5.0, channels=1),
    "congestion": dict(pairs=None, into=None, **{"from": None}, ce_fraction=0.2,
                       rate_factor=0.8),
    "loss": dict(pairs=None, into=None, **{"from": None}, probability=0.0, count=4),
    "pfc_pause": dict(node=None, priority=3, start_ms=1.0, count=20, interval_us=20.0,
                      quanta=4096),
    "pipeline_bubble": dict(stage=1, compute_factor=3.0),
    "slow_link": dict(node=None, mode="slow", speed_factor=0.25, flaps=3, down_us=200.0,
                      up_us=1000.0, start_ms=0.5),
    # inference pathologies (inference.py); truth kinds = these names
    "slow_tp_shard": dict(node=None, lag_us=20.0),
    "hot_destination": dict(node=None, factor=4.0, drift_after_tokens=0, drift_to=None),
    "pd_imbalance": dict(node=None, share=0.5),
    "kv_transfer_slow": dict(src=None, dst=None, rate_factor=0.25),
    "rotating_straggler": dict(lag_us=200.0, order=None, noise_us=0.0, every_step=False),
}
PAT_SIZE_KEYS = {"bytes"}
#: optional keys: not filled in when absent (a scenario without them normalises, and its
#: truth reads, exactly as before they existed); their defaults are applied where used.
#: step_sync: "dataflow" (default) | "barrier"; since_ms / until_ms: null (default) or model
#: ms, the pathology active for [since, until); lag_per: "step" (default) | "send"
WORKLOAD_OPTIONAL = {"ring_allreduce": {"step_sync"}, "tree_allreduce": {"step_sync"},
                     "tp_decode": {"step_sync"}, "decode_tp": {"step_sync"}}
#: kinds whose effect has a time behaviour (since_ms / until_ms); pd_imbalance (a router
#: weight) has none
TIMED_KINDS = ("straggler", "hot_expert", "incast", "congestion", "loss", "pfc_pause",
               "pipeline_bubble", "slow_link", "slow_tp_shard", "hot_destination",
               "kv_transfer_slow", "rotating_straggler")
LAG_PER_KINDS = ("straggler", "slow_tp_shard", "rotating_straggler")
PAT_OPTIONAL = {k: ({"since_ms", "until_ms"} if k in TIMED_KINDS else set())
                | ({"lag_per"} if k in LAG_PER_KINDS else set()) for k in PATHOLOGIES}
_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 10**6, "mb": 10**6,
          "mib": 1 << 20, "g": 10**9, "gb": 10**9, "gib": 1 << 30}


def parse_size(v, what="size") -> int:
    if isinstance(v, bool):
        raise ScenarioError(f"{what}: not a size: {v!r}")
    if isinstance(v, (int, float)):
        if v < 0:
            raise ScenarioError(f"{what}: negative size {v}")
        return int(v)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(v))
    if not m or m.group(2).lower() not in _UNITS:
        raise ScenarioError(f"{what}: not a size: {v!r} (use e.g. 4096, 64KiB, 1MiB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def _fill(d: dict, defaults: dict, where: str, optional=frozenset()) -> dict:
    unknown = set(d) - set(defaults) - {"kind"} - set(optional)
    if unknown:
        raise ScenarioError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    out = copy.deepcopy(defaults)
    out.update(d)
    return out


def _node(v, n, where):
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < n:
        raise ScenarioError(f"{where}: node must be an integer in 0..{n - 1}, got {v!r}")
    return v


def normalize(raw: dict) -> dict:
    """Defaults filled in, sizes parsed, references checked.  Raises ScenarioError."""
    if not isinstance(raw, dict):
        raise ScenarioError("a scenario must be a mapping (YAML/JSON object)")
    sc = _fill(raw, TOP, "scenario")
    n = sc["nodes"]
    if not isinstance(n, int) or not 2 <= n <= 4096:
        raise ScenarioError(f"nodes must be an integer in 2..4096, got {n!r}")
    if sc["ip_version"] not in (4, 6):
        raise ScenarioError("ip_version must be 4 or 6")
    if sc["mtu"] not in (256, 512, 1024, 2048, 4096):
        raise ScenarioError("mtu (IB MTU) must be one of 256, 512, 1024, 2048, 4096")
    if sc["imm_endian"] not in ("be", "le"):
        raise ScenarioError("imm_endian must be be or le")
    if sc["ecn"] not in ("ect0", "ect1", "none"):
        raise ScenarioError("ecn must be ect0, ect1 or none")
    if sc["vlan"] is not None and not (isinstance(sc["vlan"], int) and 0 <= sc["vlan"] < 4095):
        raise ScenarioError("vlan must be null or an id in 0..4094")
    if sc["psn_start"] != "random" and not isinstance(sc["psn_start"], int):
        raise ScenarioError("psn_start must be an integer or 'random'")
    if not float(sc["link_gbps"]) > 0:
        raise ScenarioError("link_gbps must be > 0")
    sc["link_gbps"] = float(sc["link_gbps"])
    wls = sc["workloads"] or []
    if not isinstance(wls, list) or not wls:
        raise ScenarioError("workloads: need a non-empty list")
    out = []
    for i, w in enumerate(wls):
        where = f"workloads[{i}]"
        if not isinstance(w, dict) or w.get("kind") not in WORKLOADS:
            raise ScenarioError(f"{where}: kind must be one of {', '.join(WORKLOADS)}")
        d = dict(COMMON)
        d.update(WORKLOADS[w["kind"]])
        for k in INHERIT:
            d[k] = sc[k]
        w = _fill(w, d, where, WORKLOAD_OPTIONAL.get(w["kind"], ()))
        if w.get("step_sync", "dataflow") not in ("dataflow", "barrier"):
            raise ScenarioError(f"{where}: step_sync must be dataflow or barrier")
        for k in SIZE_KEYS & set(w):
            if w[k] is not None:  # None: derived (decode_tp ar_bytes) or unused
                w[k] = parse_size(w[k], f"{where}.{k}")
        mem = w["members"]
        if mem == "all":
            mem = list(range(n))
        if not isinstance(mem, list) or len(mem) < 2:
            raise ScenarioError(f"{where}: members must be 'all' or a list of >= 2 nodes")
        w["members"] = [_node(m, n, where + ".members") for m in mem]
        if len(set(w["members"])) != len(w["members"]):
            raise ScenarioError(f"{where}: duplicate members")
        if w.get("protocol", "simple") not in ("simple", "ll", "ll128"):
            raise ScenarioError(f"{where}: protocol must be simple, ll or ll128")
        if not isinstance(w["channels"], int) or not 1 <= w["channels"] <= 32:
            raise ScenarioError(f"{where}: channels must be in 1..32")
        if int(w["iterations"]) < 1 or float(w["period_ms"]) <= 0:
            raise ScenarioError(f"{where}: iterations >= 1 and period_ms > 0 required")
        out.append(w)
    sc["workloads"] = out
    pats = []
    for i, p in enumerate(sc["pathologies"] or []):
        where = f"pathologies[{i}]"
        if not isinstance(p, dict) or p.get("kind") not in PATHOLOGIES:
            raise ScenarioError(f"{where}: kind must be one of {', '.join(PATHOLOGIES)}")
        p = _fill(p, PATHOLOGIES[p["kind"]], where, PAT_OPTIONAL[p["kind"]])
        for k in ("since_ms", "until_ms"):
            v = p.get(k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0):
                raise ScenarioError(f"{where}.{k}: need null or a time >= 0 (ms of model time)")
        if p.get("since_ms") is not None and p.get("until_ms") is not None \
                and not p["until_ms"] > p["since_ms"]:
            raise ScenarioError(f"{where}: until_ms must be after since_ms")
        if p.get("lag_per", "step") not in ("step", "send"):
            raise ScenarioError(f"{where}.lag_per: must be step or send")
        for k in PAT_SIZE_KEYS & set(p):
            p[k] = parse_size(p[k], f"{where}.{k}")
        for k in ("node", "target", "into", "from"):
            if k in p and (p[k] is not None or k in ("node", "target")):
                p[k] = _node(p[k], n, f"{where}.{k}")
        if p["kind"] == "kv_transfer_slow":
            p["src"], p["dst"] = _node(p["src"], n, f"{where}.src"), _node(p["dst"], n, f"{where}.dst")
        for k in ("order", "drift_to"):
            if p.get(k) is not None:
                if not isinstance(p[k], list) or not p[k]:
                    raise ScenarioError(f"{where}.{k}: need a non-empty list of nodes")
                p[k] = [_node(x, n, f"{where}.{k}") for x in p[k]]
        if p.get("pairs") is not None:
            p["pairs"] = [[_node(a, n, where), _node(b, n, where)] for a, b in p["pairs"]]
        if p["kind"] in ("congestion", "loss") and not (p["pairs"] or p["into"] is not None
                                                        or p["from"] is not None):
            raise ScenarioError(f"{where}: give pairs, into or from")
        if p["kind"] == "incast":
            s = p["senders"]
            if s is None:
                p["senders"] = n - 1
            elif isinstance(s, list):
                p["senders"] = [_node(x, n, where + ".senders") for x in s]
        if p["kind"] == "slow_link" and p["mode"] not in ("slow", "flapping"):
            raise ScenarioError(f"{where}: mode must be slow or flapping")
        pats.append(p)
    sc["pathologies"] = pats
    bg = sc["background"]
    if bg is not None:
        bg = _fill(bg, dict(pps=20000, plen=200, dport=9000), "background")
        sc["background"] = bg
    return sc


def load_scenario(src) -> dict:
    """A preset name, a path to a .yaml/.yml/.json file, or a dict -> normalized scenario."""
    if isinstance(src, dict):
        return normalize(copy.deepcopy(src))
    s = os.fspath(src)
    if s in _presets.PRESETS:
        return normalize(copy.deepcopy(_presets.PRESETS[s]))
    if not os.path.exists(s):
        near = [p for p in _presets.PRESETS if s.split("-")[0] in p][:3]
        hint = f" (did you mean {', '.join(near)}?)" if near else " (see --list-presets)"
        raise ScenarioError(f"no preset or scenario file named {s!r}{hint}")
    try:
        with open(s, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ScenarioError(f"cannot read {s}: {e.strerror}") from None
    if s.endswith(".json"):
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as e:
            raise ScenarioError(f"{s}: bad JSON: {e.msg} at line {e.lineno}") from None
    else:
        import yaml  # optional (PyYAML): only for YAML scenario files
        try:
            raw = yaml.safe_load(text)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark else ""
            raise ScenarioError(f"{s}: bad YAML{where}: {getattr(e, 'problem', e)}") from None
    if isinstance(raw, dict) and "name" not in raw:
        raw["name"] = os.path.splitext(os.path.basename(s))[0]
    return normalize(raw)
