"""Why a blamed node is slow: its GPU's DCGM telemetry next to its group's (issue 27,
deliverable 2). The wire decides who is blamed; this only adds `finding["cause"]` -- the
kind, severity, entities, message and every other key stay as the analysis made them.

Kinds covered (COVERED): the ones whose first IP is a node blamed for being slow at its own
work, where a slow GPU is a likely reason -- `straggler` and `ring_straggler` (a slow or late
sender), `slow_tp_shard` (the shard every token waits on), `pipeline_bubbles` (the slowest
stage) and `slow_receiver` (slow ingress: GPUDirect writes land in GPU memory over PCIe, so
PCIe replays and a throttled GPU both show there). Not covered: `rotating_straggler` (the
gate moves between members, so no one device explains it), link kinds (`slow_link`,
`kv_transfer_slow`, `packet_loss`), and load placement (`hot_destination`,
`alltoall_destination_skew`, `incast`, `pd_imbalance`, `instance_load_imbalance`,
`prefill_interference`): telemetry of one GPU does not say why load went where it went.

The join: blamed IP -> inventory Entry (host, GPU index; no GPU index: every GPU of the host
is read and the worst reported) -> DCGM series with that `Hostname` (and `gpu`). The group
(finding["group"] -> doc["collectives"][group]["members"]) gives the GPUs to compare with:
its other members, through the inventory.

cause = {"verdict", "host", "gpu", "evidence": {numbers}, "text": one line}; verdicts:
  gpu           the GPU shows a slowdown: clock-lowering reasons (SW power cap, HW slowdown,
                SW/HW thermal, HW power brake), SM clock < CLOCK_LOW x the group median,
                an XID, PCIe replays or NVLink errors in the window
  gpu_normal    DCGM data and none of that: look at the NIC / link
  no_data       no DCGM series for the host (or the GPU) in the window
  no_inventory  no inventory, or the blamed address is not in it
  unreadable    the DCGM source could not be read (the findings still come out)
"""
from __future__ import annotations

import math
import statistics
from datetime import datetime, timezone

from skewscope.core.when import Clock
from skewscope.telemetry.dcgm import (NVLINK_ERRORS, PCIE_REPLAY, POWER, POWER_LIMITS, REASONS, SLOWDOWN_BITS,
                                      SM_CLOCK, TEMP, TENSOR, WINDOW_PAD_S, XID, DcgmError, decode_reasons)

COVERED = ("straggler", "ring_straggler", "slow_tp_shard", "pipeline_bubbles", "slow_receiver")
VERDICTS = ("gpu", "gpu_normal", "no_data", "no_inventory", "unreadable")
#: the blamed GPU's SM clock below this share of the group median is a slowdown
CLOCK_LOW = 0.9
#: power at or above this share of its limit is "at the power limit"
POWER_AT_LIMIT = 0.95
#: the longest DCGM window read (its end kept): a cluster document over "all" time starts at 0
MAX_WINDOW_S = 3600.0


def window_of(f: dict, meta: dict | None) -> tuple[float, float] | None:
    """The unix-time window DCGM is read over: the finding's since..until (until None = the
    capture's end; since None = its start; at most MAX_WINDOW_S), widened by WINDOW_PAD_S each
    side; None when the capture has no wall clock or no times."""
    clock = Clock.of(meta)            # a monotonic live capture: on the wall through started_at
    first, last, off = clock.first, clock.last, clock.offset
    if off is None:
        return None
    s = f.get("since") if f.get("since") is not None else first
    u = f.get("until") if f.get("until") is not None else last
    if s is None and u is None:
        return None
    s = u if s is None else s
    u = s if u is None else u
    s = max(float(s), float(u) - MAX_WINDOW_S)
    return s + off - WINDOW_PAD_S, float(u) + off + WINDOW_PAD_S


def _hms(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%H:%M:%S")


def _median(xs) -> float | None:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return float(statistics.median(xs)) if xs else None


def _vals(samples) -> list[float]:
    return [v for _, v in samples]


def _increase(samples) -> float | None:
    """A counter's increase over timed samples (resets counted from 0); None for one sample or
    instant values (an exporter scrape: the total since the GPU's driver load says nothing
    about the window)."""
    timed = [(t, v) for t, v in samples if t is not None]
    if len(timed) < 2:
        return None
    inc, prev = 0.0, timed[0][1]
    for _, v in timed[1:]:
        inc += v - prev if v >= prev else v
        prev = v
    return inc


def gpu_stats(rd, host: str, gpu: int) -> dict:
    """The numbers of one GPU over the readings' samples."""
    reasons = rd.first_of(host, gpu, REASONS)
    mask, since = 0, None
    for t, v in reasons:
        m = int(v) if math.isfinite(v) else 0
        mask |= m
        if m & SLOWDOWN_BITS and since is None and t is not None:
            since = t
    xids = [int(v) for v in _vals(rd.get(host, gpu, XID)) if v]
    limit = rd.first_of(host, gpu, POWER_LIMITS)
    nvl = [_increase(rd.get(host, gpu, n)) for n in NVLINK_ERRORS if rd.get(host, gpu, n)]
    nvl = [x for x in nvl if x is not None]
    temps = _vals(rd.get(host, gpu, TEMP))
    return {
        "sm_clock_mhz": _median(_vals(rd.get(host, gpu, SM_CLOCK))),
        "sm_clock_min_mhz": min(_vals(rd.get(host, gpu, SM_CLOCK)), default=None),
        "power_w": _median(_vals(rd.get(host, gpu, POWER))),
        "power_limit_w": limit[-1][1] if limit else None,
        "reasons_mask": mask if reasons else None,
        "reasons": decode_reasons(mask) if reasons else [],
        "slowdown_since": since,
        "xid": xids[-1] if xids else (0 if rd.get(host, gpu, XID) else None),
        "pcie_replay_increase": _increase(rd.get(host, gpu, PCIE_REPLAY)),
        "nvlink_error_increase": sum(nvl) if nvl else None,
        "tensor_active": _median(_vals(rd.get(host, gpu, TENSOR))),
        "gpu_temp_c": max(temps) if temps else None,
        "samples": sum(len(v) for v in rd.series.get((host, gpu), {}).values()),
    }


def _problems(st: dict, med_clock: float | None) -> list[str]:
    """The slowdown signs of one GPU's stats, in words (empty: it looks normal)."""
    out = []
    clk = st["sm_clock_mhz"]
    if clk is not None and med_clock and clk < CLOCK_LOW * med_clock:
        out.append(f"SM clock {clk:,.0f} MHz vs {med_clock:,.0f} MHz group median")
    mask = st["reasons_mask"] or 0
    if mask & SLOWDOWN_BITS:
        names = ", ".join(decode_reasons(mask & SLOWDOWN_BITS))
        since = st["slowdown_since"]
        out.append(names + (f" since {_hms(since)} UTC" if since is not None else ""))
        if mask & (0x20 | 0x40) and st["gpu_temp_c"] is not None:
            out.append(f"GPU at {st['gpu_temp_c']:.0f} C")
    p, lim = st["power_w"], st["power_limit_w"]
    if out and p is not None and lim and p >= POWER_AT_LIMIT * lim:
        out.append(f"power {p:,.0f} W at its {lim:,.0f} W limit")
    if st["xid"]:
        out.append(f"XID {st['xid']}")
    if st["pcie_replay_increase"]:
        out.append(f"{st['pcie_replay_increase']:,.0f} PCIe replays")
    if st["nvlink_error_increase"]:
        out.append(f"{st['nvlink_error_increase']:,.0f} NVLink errors")
    return out


def _group_peers(f: dict, doc: dict, blamed: str) -> list[str]:
    g = f.get("group")
    colls = doc.get("collectives") or []
    if isinstance(g, int) and 0 <= g < len(colls):
        members = [str(m) for m in colls[g].get("members") or []]
    else:
        members = [str(x) for x in (f.get("entities") or {}).get("ips") or []]
    return [m for m in members if m != blamed]


def _cause(verdict: str, text: str, host=None, gpu=None, evidence=None) -> dict:
    return {"verdict": verdict, "host": host, "gpu": gpu, "evidence": evidence or {}, "text": text}


def cause_of(f: dict, doc: dict, inventory, source, meta: dict | None = None) -> dict:
    """The cause of one finding (a kind of COVERED)."""
    ips = [str(x) for x in (f.get("entities") or {}).get("ips") or []]
    if not ips:
        return _cause("no_inventory", "no blamed address in the finding: nothing to join to a GPU")
    blamed = ips[0]
    if inventory is None:
        return _cause("no_inventory", "no inventory: addresses cannot be joined to GPUs (--inventory FILE)")
    e = inventory.get(blamed)
    if e is None:
        return _cause("no_inventory", f"{blamed} is not in the inventory: it cannot be joined to a GPU")
    peers = [p for p in (inventory.get(ip) for ip in _group_peers(f, doc, blamed)) if p is not None]
    hosts = sorted({e.host} | {p.host for p in peers})
    win = window_of(f, meta)
    kind = getattr(source, "kind", "")
    try:
        rd = source.read(hosts, *(win if win is not None else (None, None)))
    except DcgmError as err:
        return _cause("unreadable", f"DCGM telemetry could not be read: {err}", e.host, e.gpu)
    where = (f" between {_hms(win[0])} and {_hms(win[1])} UTC" if rd.kind == "prometheus" and win is not None
             else f" in {rd.source}" if rd.source else "")
    cands = [e.gpu] if e.gpu is not None else rd.gpus(e.host)
    cands = [g for g in cands if rd.series.get((e.host, g))]
    if not cands:
        what = e.host if e.gpu is None else f"GPU {e.gpu} of {e.host}"
        return _cause("no_data", f"no DCGM data for {what}{where}", e.host, e.gpu,
                      {"source": rd.source, "source_kind": rd.kind or kind,
                       "window": list(win) if win is not None and rd.kind == "prometheus" else None})
    blamed_keys = {(e.host, g) for g in cands}
    peer_keys = []
    for p in peers:
        for g in ([p.gpu] if p.gpu is not None else rd.gpus(p.host)):
            if (p.host, g) not in blamed_keys and (p.host, g) not in peer_keys and rd.series.get((p.host, g)):
                peer_keys.append((p.host, g))
    peer_stats = [gpu_stats(rd, h, g) for h, g in peer_keys]
    med_clock = _median(s["sm_clock_mhz"] for s in peer_stats)
    med_tensor = _median(s["tensor_active"] for s in peer_stats)
    stats = {g: gpu_stats(rd, e.host, g) for g in cands}

    def badness(g):
        st = stats[g]
        clk = st["sm_clock_mhz"]
        ratio = clk / med_clock if clk is not None and med_clock else 1.0
        return (len(_problems(st, med_clock)), bool((st["reasons_mask"] or 0) & SLOWDOWN_BITS), -ratio)
    gpu = max(cands, key=badness)
    st = stats[gpu]
    lab = rd.labels.get((e.host, gpu), {})
    ev = {**st, "group_median_sm_clock_mhz": med_clock,
          "clock_ratio": (st["sm_clock_mhz"] / med_clock if st["sm_clock_mhz"] is not None and med_clock else None),
          "group_median_tensor_active": med_tensor, "group_gpus": len(peer_keys),
          "uuid": lab.get("UUID"), "pod": lab.get("pod"), "namespace": lab.get("namespace"),
          "source": rd.source, "source_kind": rd.kind or kind,
          "window": list(win) if win is not None and rd.kind == "prometheus" else None}
    who = f"GPU {gpu} of {e.host}" + (f" (the worst of its {len(cands)})" if e.gpu is None and len(cands) > 1 else "")
    probs = _problems(st, med_clock)
    if probs:
        return _cause("gpu", f"{who}: " + ", ".join(probs), e.host, gpu, ev)
    clk = st["sm_clock_mhz"]
    parts = []
    if clk is not None:
        parts.append(f"SM clock {clk:,.0f} MHz" + (f", group median {med_clock:,.0f} MHz" if med_clock else ""))
    if st["reasons_mask"] is None:
        parts.append("no throttle-reason series")
    else:
        parts.append("no throttle reasons" if not st["reasons"] else f"no clock-lowering reasons ({', '.join(st['reasons'])})")
    parts.append("no XID" if st["xid"] is not None else "no XID series")
    return _cause("gpu_normal", f"{who} looks normal ({', '.join(parts)}): look at the NIC/link", e.host, gpu, ev)


def add_causes(doc: dict, inventory, source, meta: dict | None = None) -> None:
    """finding["cause"] on every finding of a COVERED kind; nothing else changes."""
    for f in doc.get("findings") or []:
        if isinstance(f, dict) and f.get("kind") in COVERED:
            f["cause"] = cause_of(f, doc, inventory, source, meta)
