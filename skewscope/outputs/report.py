"""Snapshot -> the stable JSON document (`report --json`) and the human report.

JSON contract (names are a contract for scripts; more keys may be added, none renamed):
{"source": ..., "meta": {...},
 "totals": {"packets_seen", "roce_packets", "non_roce_packets", "malformed_packets",
            "pfc_pause_frames", "flows_evicted", "not_accounted": {reason: n}},
 "pfc": {"pause_frames", "per_priority": [{"priority", "pause", "resume", "quanta"}]},
 "flows": [{"src", "dst", "dest_qp", "packets", "bytes", "payload_bytes", "messages",
            "ce_packets", "ecn_capable_packets", "cnp_packets", "acks", "naks",
            "psn_gaps", "retransmissions", "first_ts", "last_ts",
            "msg_size_hist": [[lower_bound_bytes, count], ...], ...}]}
Definitions: README.md "Counters".
"""
from __future__ import annotations

import json
import sys

import numpy as np

from skewscope.core import layout as L
from skewscope.core.snapshot import Snapshot, ip_str
from skewscope.core.when import Clock
from skewscope.outputs import jsonfmt


def hist_pairs(row) -> list[list[int]]:
    return [[L.slot_lower_bound(i), int(c)] for i, c in enumerate(row) if c]


#: flow-table columns copied as they are into each flow's dict: (JSON key, column)
_PLAIN = (("dest_qp", "dest_qp"), ("ipver", "ipver"), ("roce_version", "roce"), ("packets", "packets"),
          ("bytes", "bytes"), ("payload_bytes", "payload_bytes"), ("messages", "messages"),
          ("message_bytes", "msg_bytes"), ("ce_packets", "ce"), ("ecn_capable_packets", "ecn_capable"),
          ("fecn_packets", "fecn"), ("becn_packets", "becn"), ("cnp_packets", "cnp"), ("acks", "acks"))


def flow_dicts(snap: Snapshot) -> list[dict]:
    """One dict per flow row (key order is part of the contract). The columns are read once
    as Python ints (numpy's tolist: the int() of each element) and each address is formatted
    once, not field by field per row: ~30 numpy scalar reads, two histogram walks and two
    address formats per flow were ~0.1 ms a flow (25 ms of a 256-flow report)."""
    out = []
    f = snap.flows
    scale = int(snap.meta.get("sample_n", 1) or 1)
    col = {name: f[name].tolist() for name in f.dtype.names if name not in ("src", "dst")}
    naks = (f["nak_seq"] + f["nak_rnr"] + f["nak_other"]).tolist()
    src, dst = f["src"].tobytes(), f["dst"].tobytes()     # 16 bytes per row
    names: dict = {}                                      # (address, ipver) -> ip_str: once per node

    def addr(b: bytes, v: int) -> str:
        s = names.get((b, v))
        if s is None:
            s = names[(b, v)] = ip_str(np.frombuffer(b, dtype=np.uint8), v)
        return s

    for i in range(len(f)):
        v = col["ipver"][i]
        d = {"src": addr(src[16 * i:16 * i + 16], v), "dst": addr(dst[16 * i:16 * i + 16], v)}
        for key, name in _PLAIN:
            d[key] = col[name][i]
        d.update({
            "naks": naks[i],
            "naks_by_syndrome": {"psn_sequence_error": col["nak_seq"][i], "rnr": col["nak_rnr"][i],
                                 "other": col["nak_other"][i]},
            "psn_gaps": col["psn_gaps"][i],
            "psn_skipped": col["psn_skipped"][i],
            "retransmissions": col["retransmissions"][i],
            "first_ts": col["first_ts"][i],
            "last_ts": col["last_ts"][i],
            "udp_sport": col["sport"][i],
            "dscp": col["tclass"][i] >> 2,
            "opcode_classes": {n: c for n, c in zip(L.OPCLASS_NAMES, col["op"][i]) if c},
            "msg_size_hist": hist_pairs(col["msg_hist"][i]),
            "msg_gap_hist_ns": hist_pairs(col["gap_hist"][i]),
        })
        if scale > 1:
            d["sampled_1_in"] = scale
        out.append(d)
    return out


def totals(snap: Snapshot) -> dict:
    g = snap.globals
    cats = snap.category_counts()
    return {
        "packets_seen": int(g[L.G_FRAMES]),
        "roce_packets": int(g[L.G_ACCOUNTED]),
        "non_roce_packets": int(g[L.G_NON_ROCE]),
        "malformed_packets": int(sum(int(g[i]) for i in L.MALFORMED_CATEGORIES)),
        "pfc_pause_frames": int(g[L.G_PFC]),
        "flows_evicted": snap.flows_evicted,
        "not_accounted": {k: v for k, v in cats.items() if k != "accounted"},
        "message_records": int(len(snap.events)),
        "message_records_lost": int(snap.meta.get("events_lost", 0)),
        "partial_messages": int(g[L.G_MSG_PARTIAL]),
        # frames that arrived encapsulated (ERSPAN/GRE/VXLAN mirror copies) and were parsed inside
        "decapsulated_frames": int(g[L.G_DECAP]),
    }


def pfc(snap: Snapshot) -> dict:
    g = snap.globals
    return {
        "pause_frames": int(g[L.G_PFC]),
        "per_priority": [{"priority": p, "pause": int(g[L.G_PFC_PAUSE + p]), "resume": int(g[L.G_PFC_XON + p]),
                          "quanta": int(g[L.G_PFC_QUANTA + p])} for p in range(8)],
    }


def to_dict(snap: Snapshot, analysis: dict | None = None) -> dict:
    meta = dict(snap.meta)
    src = meta.get("file") or meta.get("interface") or meta.get("source", "?")
    doc = {
        "source": src,
        "meta": meta,
        "totals": totals(snap),
        "pfc": pfc(snap),
        "flows": flow_dicts(snap),
    }
    if analysis:
        doc.update(analysis)
        if "node_timing" not in doc:  # one DPU per node: the node's own timing, if inferable
            from skewscope.analysis.nodeview import node_timing  # heavy (numba)
            doc["node_timing"] = node_timing(snap)
    return doc


def to_json(snap: Snapshot, analysis: dict | None = None, indent: int | None = 2) -> str:
    """json.dumps(to_dict(...), indent=indent): with an indent through jsonfmt.dumps (the same
    string at the C encoder's speed: 4 instead of 13 ms on a 300 KB report)."""
    doc = to_dict(snap, analysis)
    return json.dumps(doc) if indent is None else jsonfmt.dumps(doc, indent)


# ---- human report ----------------------------------------------------------------------
def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def human(snap: Snapshot, analysis: dict | None = None, top: int = 20, console=None) -> None:
    from rich.console import Console  # heavy (rich): only when drawing
    from rich.table import Table  # heavy (rich): only when drawing

    # In a pipe or file rich assumes 80 columns and would cut addresses to "10…": use a
    # width at which nothing is cut (a terminal keeps its own width).
    con = console or (Console() if sys.stdout.isatty() else Console(width=160))
    t = totals(snap)
    m = snap.meta
    con.print(f"[bold]skewscope report[/bold]  source: {m.get('file') or m.get('interface') or m.get('source')}"
              f"  ({m.get('source', '?')}, {float(m.get('duration_s', 0) or 0):.3f} s)")
    na = ", ".join(f"{k} {v}" for k, v in t["not_accounted"].items() if v) or "none"
    con.print(f"frames {t['packets_seen']}  RoCE {t['roce_packets']}  not accounted: {na}")
    if t["decapsulated_frames"]:
        con.print(f"{t['decapsulated_frames']} frames arrived encapsulated (ERSPAN/GRE/VXLAN) and were parsed inside")
    if t["flows_evicted"]:
        con.print(f"[yellow]flows evicted (map full): {t['flows_evicted']}[/yellow]")
    if int(m.get("sample_n", 1) or 1) > 1:
        con.print(f"[yellow]sampled 1 in {m['sample_n']}: counters are of sampled packets[/yellow]")
    if m.get("padded_records"):
        con.print(f"{m['padded_records']} snaplen-cut records were padded back to their original length")
    if m.get("snaplen_cut_records"):
        con.print(f"{m['snaplen_cut_records']} records cut by the capture's snap length: accounted from their "
                  "original lengths")
    p = pfc(snap)
    if p["pause_frames"]:
        pr = ", ".join(f"prio {x['priority']}: {x['pause']}" for x in p["per_priority"] if x["pause"])
        con.print(f"PFC pause frames: {p['pause_frames']} ({pr})")
    from rich import box  # heavy (rich): only when drawing
    tab = Table(title=f"flows (top {top} by bytes of {len(snap.flows)})", show_lines=False, box=box.SIMPLE_HEAD,
                pad_edge=False)
    for c in ("src", "dst", "qp", "pkts", "bytes", "msgs", "msg mode", "CE", "CNP", "ACK", "NAK", "gaps", "retx"):
        tab.add_column(c, justify="right" if c not in ("src", "dst") else "left", no_wrap=True,
                       min_width=len(c) if c not in ("src", "dst") else 7)
    f = snap.flows
    order = np.argsort(-f["bytes"].astype(np.int64), kind="stable")[:top]
    names = {ip: e["name"] for ip, e in ((analysis or {}).get("inventory") or {}).items()}   # --inventory
    for i in order:
        r = f[i]
        v = int(r["ipver"])
        mode = int(np.argmax(r["msg_hist"])) if r["msg_hist"].any() else -1
        src, dst = ip_str(r["src"], v), ip_str(r["dst"], v)
        tab.add_row(names.get(src, src), names.get(dst, dst), f"0x{int(r['dest_qp']):06x}", str(int(r["packets"])),
                    fmt_bytes(int(r["bytes"])), str(int(r["messages"])),
                    "-" if mode < 0 else fmt_bytes(L.slot_lower_bound(mode)) + "+",
                    str(int(r["ce"])), str(int(r["cnp"])), str(int(r["acks"])),
                    str(int(r["nak_seq"] + r["nak_rnr"] + r["nak_other"])), str(int(r["psn_gaps"])),
                    str(int(r["retransmissions"])))
    con.print(tab)
    if analysis:
        for line in analysis_lines(analysis):
            con.print(line, highlight=False)
    if analysis and analysis.get("findings") is not None:
        fs = analysis["findings"]
        if not fs:
            con.print("[green]no findings: traffic looks healthy[/green]")
        for line in finding_lines(analysis, Clock.of(m)):
            con.print(line, highlight=False)


def named(ip: str, finding: dict) -> str:
    """"name (ip)" when the finding names the address (its "names", from an inventory), else ip."""
    n = (finding.get("names") or {}).get(ip)
    return f"{n} ({ip})" if n else str(ip)


def finding_lines(analysis: dict, clock: Clock) -> list[str]:
    """Rich markup lines of the findings, incidents first (report, diagnose, cluster): one
    line per incident (severity, id, lead kind and node), its findings indented under it,
    each with when it held and its GPU cause (--dcgm); then the findings of no incident
    (context) under "context"."""
    from rich.markup import escape  # heavy (rich): only when drawing
    out = []
    for inc, fs in incident_sections(analysis):
        pad = "  "
        if inc is not None:
            color = {"critical": "red", "warning": "yellow"}.get(inc["severity"], "cyan")
            on = [named(ip, fs[0]) for ip in (inc.get("entities") or [])[:1]]
            out.append(f"[{color}]{inc['severity'].upper():8s}[/{color}] [bold]incident {inc['id']}[/bold]: "
                       f"{inc['kind']}{' on ' + on[0] if on else ''}"
                       + (f" (+{len(fs) - 1} finding{'s' if len(fs) > 2 else ''})" if len(fs) > 1 else ""))
        elif out:
            out.append("context (qualifies every incident):")
        else:
            pad = ""
        for fd in fs:
            color = {"critical": "red", "warning": "yellow"}.get(fd["severity"], "cyan")
            out.append(f"{pad}[{color}]{fd['severity'].upper():8s}[/{color}] {fd['kind']}: {fd['message']}")
            when = clock.text(fd.get("since"), fd.get("until"))
            if when:
                out.append(f"{pad}{'':9s}{when}")
            if fd.get("cause"):
                out.append(f"{pad}{'':9s}cause: {escape(str(fd['cause']['text']))}")
    return out


def _kv_lines(m: dict) -> list[str]:
    """A kv_transfer group: its roles and one line per decode node."""
    if not m.get("per_decode"):
        return []
    out = [f"    prefill {', '.join(m.get('prefill_nodes') or [])} -> decode {', '.join(m.get('decode_nodes') or [])}: "
           f"{m.get('transfers', 0)} transfers, {fmt_bytes(m.get('kv_bytes') or 0)}"]
    for ip, d in m["per_decode"].items():
        p50, p99 = d.get("transfer_time_p50_s"), d.get("transfer_time_p99_s")
        t = f"p50 {p50 * 1e6:.0f} us, p99 {p99 * 1e6:.0f} us" if p50 is not None else "no transfer time"
        out.append(f"    decode {ip}: {d['transfers']} transfers, {fmt_bytes(d['bytes'])} "
                   f"({100 * d['share']:.0f}% of the KV bytes), transfer time {t}")
    return out


_SEV = {"critical": 0, "warning": 1, "info": 2}


def by_severity(fs) -> list[dict]:
    """Findings by severity, then impact (estimated time lost per iteration/token; null last)."""
    return sorted(fs, key=lambda d: (_SEV.get(str(d.get("severity", "info")), 3),
                                     -float(((d.get("impact") or {}).get("seconds")) or 0)))


def incident_sections(analysis: dict | None) -> list[tuple[dict | None, list[dict]]]:
    """The findings as the outputs show them (docs/metrics.md "Incidents"): each incident in
    the document's order with its findings, the lead first, then its other findings; last
    (None, the findings of no incident: context, or a document without incidents) by
    severity. [] when there are no findings."""
    a = analysis or {}
    fs = list(a.get("findings") or [])
    out: list[tuple[dict | None, list[dict]]] = []
    shown: set[int] = set()
    for x in a.get("incidents") or []:
        idx = [j for j in [x.get("lead")] + list(x.get("symptoms") or []) if isinstance(j, int) and 0 <= j < len(fs)]
        if idx:
            out.append((x, [fs[j] for j in idx]))
            shown.update(idx)
    rest = by_severity([f for j, f in enumerate(fs) if j not in shown])
    if rest:
        out.append((None, rest))
    return out


def analysis_lines(analysis: dict) -> list[str]:
    """The detected collectives and the timing, one line each (report and diagnose). With
    several groups that have a rhythm (two jobs on one fabric: a training ring next to a
    decode group), each group's own timing follows its line; with one, the capture's."""
    out = []
    colls = analysis.get("collectives") or []
    timed = [c for c in colls if c.get("timing")]
    per_group = len(timed) > 1
    for c in colls:
        mem = c.get("member_names") or c["members"]      # --inventory: what people call them
        pat = c.get("pattern") or (c.get("metrics") or {}).get("pattern") or "?"
        wl = c["timing"].get("workload") if per_group and c.get("timing") else None
        out.append(f"  {c['kind']} ({pat}, confidence {c['confidence']:.2f}{', ' + wl if wl else ''}): "
                   + ", ".join(mem[:8]) + (f" ... ({len(mem)} nodes)" if len(mem) > 8 else ""))
        if c["kind"] == "kv_transfer":
            out.extend(_kv_lines(c.get("metrics") or {}))
        if per_group and c.get("timing"):
            out += ["  " + x for x in group_timing_lines(c["timing"])]
    if not per_group:
        out += group_timing_lines(analysis.get("timing"))
    return out


def group_timing_lines(tm: dict | None) -> list[str]:
    """One group's period, decode cadence and timing at every scale (indented by 2)."""
    out = []
    if tm and tm.get("period_s"):
        jit = f", jitter {tm['period_jitter_s'] * 1e6:.0f} us" if tm.get("period_jitter_s") is not None else ""
        out.append(f"  period {tm['period_s'] * 1e3:.3f} ms{jit}")
    if tm and tm.get("workload") == "decode" and tm.get("collective_interval_p50_s"):
        out.append(f"  decode: a collective every {tm['collective_interval_p50_s'] * 1e6:.0f} us (p50), "
                   f"p99 {tm['collective_interval_p99_s'] * 1e6:.0f} us"
                   + (f", {tm['tokens_per_s']:.1f} tokens/s" if tm.get("tokens_per_s") else ""))
    out += timing_lines(tm)
    return out


def _dur(s) -> str:
    if s is None:
        return "?"
    return f"{s * 1e3:.2f} ms" if s >= 1e-3 else f"{s * 1e6:.1f} us"


def timing_lines(tm: dict | None) -> list[str]:
    """The timing at every scale (step -> collective -> iteration/token) and, for decode,
    the token period, tokens/s, inter-token latency and the share spent communicating
    (report, diagnose and top)."""
    out = []
    if not tm:
        return out
    if tm.get("workload") == "decode" and tm.get("token_interval_s"):
        line = (f"  token: every {_dur(tm['token_interval_s'])} ({tm['tokens_per_s']:.1f} tokens/s)")
        if tm.get("itl_p50_s") is not None:
            line += (f", ITL p50 {_dur(tm['itl_p50_s'])} p99 {_dur(tm['itl_p99_s'])} "
                     f"max {_dur(tm['itl_max_s'])}")
        if tm.get("token_comm_share") is not None:
            line += f", {100 * tm['token_comm_share']:.0f}% of each token communicating"
        out.append(line)
    h = tm.get("hierarchy")
    if h:
        top = "token" if tm.get("workload") == "decode" and tm.get("token_interval_s") else "iteration"
        parts = []
        for name, key in (("step", "step"), ("collective", "collective"), (top, "iteration")):
            lv = h.get(key) or {}
            if not lv.get("count"):
                continue
            jit = f" ±{_dur(lv['jitter_s'])}" if lv.get("jitter_s") is not None else ""
            parts.append(f"{name} {_dur(lv.get('period_s'))}{jit} x{lv['count']}")
        if parts:
            out.append("  timing: " + " -> ".join(parts))
    return out
