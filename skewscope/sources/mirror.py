"""The tc mirred rules (`skewscope mirror add|del|list`) that copy RoCE traffic from the
interface it crosses (a BlueField uplink representor, a switch port) to the interface
skewscope watches -- how the toolkit sees RoCE on a DPU, where the eSwitch forwards it in
hardware (docs/dpu.md).

Per direction, three filters on FROM's clsact hook, each with one mirred action:
  protocol ip      u32: IPv4 protocol 17 and UDP destination port 4791 (RoCEv2)
  protocol ipv6    u32: next header 17 and UDP destination port 4791 (RoCEv2 over IPv6)
  protocol 0x8915  u32: everything (RoCEv1)
(with --flower the same matches as flower filters, which mlx5/BlueField can offload to the
eSwitch; u32 is the software default available everywhere). The u32 IPv4 match assumes a
20-byte IP header, which every RoCE NIC sends.

Ours are recognised by the action cookie 736b657773636f7065 ("skewscope") and our filter
priorities 49376..49387 (prio = 49376 + 6*flower + 3*egress + {ip 0, ipv6 1, RoCEv1 2}):
`del` and `list` never touch anyone else's filters. `del` removes the clsact qdisc only if
it is left without any filter. (Distinct priorities per direction matter: u32 keeps its
hash tables per qdisc, so a dump of clsact ingress also shows egress u32 filters of the
same priority.)
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess

from skewscope.core.errors import EXIT_KERNEL, EXIT_NO_IFACE, EXIT_NOT_RUN, EXIT_USAGE, DataplaneError

COOKIE = b"skewscope".hex()          # 736b657773636f7065
PRIO_BASE = 49376                    # 0xC0E0; see prio()
PRIO_MAX = PRIO_BASE + 11
_PROTOS = (("ip", 0), ("ipv6", 1), ("0x8915", 2))


def _tc_bin() -> str:
    tc = shutil.which("tc") or ("/usr/sbin/tc" if os.path.exists("/usr/sbin/tc") else None)
    if not tc:
        raise DataplaneError("the 'tc' command (iproute2) is not installed: apt-get install iproute2", EXIT_NOT_RUN)
    return tc


def tc(args: list[str], netns: str | None = None, check: bool = True, json_out: bool = False):
    cmd = [_tc_bin()] + (["-n", netns] if netns else []) + (["-j"] if json_out else []) + args
    p = subprocess.run(cmd, capture_output=True, text=True)
    if check and p.returncode != 0:
        err = (p.stderr.strip().splitlines() or ["?"])
        msg = next((ln for ln in err if ln.startswith("Error")), err[0])
        raise DataplaneError(f"tc {' '.join(args)}: {msg}", EXIT_KERNEL)
    return p


def _iface_exists(name: str, netns: str | None) -> bool:
    if netns is None:
        try:
            socket.if_nametoindex(name)
            return True
        except OSError:
            return False
    p = subprocess.run(["ip", "-n", netns, "link", "show", "dev", name], capture_output=True, text=True)
    return p.returncode == 0


def check_iface(name: str, netns: str | None, role: str) -> None:
    if not _iface_exists(name, netns):
        where = f" in network namespace {netns}" if netns else ""
        raise DataplaneError(f"{role} interface {name!r} does not exist{where} (see 'ip link')", EXIT_NO_IFACE)


def prio(direction: str, proto_off: int, flower: bool) -> int:
    return PRIO_BASE + (6 if flower else 0) + (3 if direction == "egress" else 0) + proto_off


def _prio_direction(p: int) -> str:
    return "egress" if (p - PRIO_BASE) % 6 >= 3 else "ingress"


def _dirs(direction: str) -> tuple[str, ...]:
    return ("ingress", "egress") if direction == "both" else (direction,)


def _match(proto: str, flower: bool) -> list[str]:
    if flower:
        return {"ip": ["flower", "ip_proto", "udp", "dst_port", "4791"],
                "ipv6": ["flower", "ip_proto", "udp", "dst_port", "4791"],
                "0x8915": ["flower"]}[proto]
    return {"ip": ["u32", "match", "ip", "protocol", "17", "0xff", "match", "ip", "dport", "4791", "0xffff"],
            "ipv6": ["u32", "match", "ip6", "protocol", "17", "0xff", "match", "ip6", "dport", "4791", "0xffff"],
            "0x8915": ["u32", "match", "u32", "0", "0"]}[proto]


def add_commands(from_if: str, to_if: str, direction: str = "ingress", skip_sw: bool = False,
                 flower: bool = False, to_ingress: bool = False) -> list[list[str]]:
    """The tc argument lists `add` runs (also printed by --dry-run)."""
    cmds = [["qdisc", "add", "dev", from_if, "clsact"]]
    for d in _dirs(direction):
        for proto, off in _PROTOS:
            c = ["filter", "add", "dev", from_if, d, "prio", str(prio(d, off, flower)), "protocol", proto]
            m = _match(proto, flower)
            c += m[:1] + (["skip_sw"] if skip_sw else []) + m[1:]
            c += ["action", "mirred", "ingress" if to_ingress else "egress", "mirror", "dev", to_if, "cookie", COOKIE]
            cmds.append(c)
    return cmds


def list_mirrors(from_if: str, netns: str | None = None) -> list[dict]:
    """skewscope's mirror filters on from_if: dicts with from, direction, prio, protocol,
    kind, handle, to, to_direction, in_hw."""
    out = []
    for d in ("ingress", "egress"):
        p = tc(["-s", "filter", "show", "dev", from_if, d], netns=netns, check=False, json_out=True)
        if p.returncode != 0 or not p.stdout.strip():
            continue
        try:
            items = json.loads(p.stdout)
        except json.JSONDecodeError:
            continue
        for it in items:
            opts = it.get("options") or {}
            acts = opts.get("actions") or []
            ours = [a for a in acts if a.get("kind") == "mirred" and a.get("cookie") == COOKIE]
            pref = int(it.get("pref", 0))
            if not ours or not PRIO_BASE <= pref <= PRIO_MAX or _prio_direction(pref) != d:
                continue
            a = ours[0]
            out.append({"from": from_if, "direction": d, "prio": int(it["pref"]), "protocol": it.get("protocol"),
                        "kind": it.get("kind"), "handle": opts.get("fh") or opts.get("handle"),
                        "to": a.get("to_dev"), "to_direction": a.get("direction"),
                        "in_hw": bool(opts.get("in_hw")), "skip_sw": bool(opts.get("skip_sw")),
                        "packets": ((a.get("stats") or {}).get("packets"))})
    return out


def proto_arg(p: str) -> str:
    return {"ip": "ip", "ipv6": "ipv6", "[35093]": "0x8915", "0x8915": "0x8915"}.get(p, p)


def add(from_if: str, to_if: str, direction: str = "ingress", skip_sw: bool = False, flower: bool = False,
        to_ingress: bool = False, netns: str | None = None) -> dict:
    """Install the mirror (idempotent: an identical one already there is left as is)."""
    if from_if == to_if:
        raise DataplaneError("--from and --to are the same interface (the copies would loop)", EXIT_USAGE)
    check_iface(from_if, netns, "--from")
    check_iface(to_if, netns, "--to")
    existing = [m for m in list_mirrors(from_if, netns) if m["to"] == to_if]
    want = set(_dirs(direction))
    have = {m["direction"] for m in existing}
    todo = sorted(want - have)
    cmds = add_commands(from_if, to_if, direction, skip_sw, flower, to_ingress)
    created_qdisc = False
    if not _has_clsact(from_if, netns):
        p = tc(cmds[0], netns=netns, check=False)
        if p.returncode != 0:
            raise DataplaneError(f"cannot add clsact qdisc on {from_if}: {p.stderr.strip()}", EXIT_KERNEL)
        created_qdisc = True
    done = []
    try:
        for c in cmds[1:]:
            if c[4] not in todo:
                continue
            try:
                tc(c, netns=netns)
            except DataplaneError as e:
                msg = str(e)
                if skip_sw and ("not supported" in msg.lower() or "offload" in msg.lower() or "operation" in msg.lower()):
                    msg += (" -- the driver cannot offload this filter to hardware; drop --skip-sw to mirror "
                            "in software" + ("" if flower else ", or try --flower (mlx5 offloads flower, not u32)"))
                if flower and "classifier not found" in msg.lower():
                    msg += " -- this kernel has no cls_flower; use the default u32"
                raise DataplaneError(msg, e.code) from None
            done.append(c)
        if skip_sw and done:
            # a skip_sw filter the driver did not take into hardware runs nowhere: it would
            # mirror nothing, silently (veth and many NICs accept it). Refuse that.
            mine = [m for m in list_mirrors(from_if, netns) if m["to"] == to_if and m["direction"] in todo]
            if mine and not all(m["in_hw"] for m in mine):
                raise DataplaneError(f"{from_if}: the driver did not offload the mirror filters to hardware, and "
                                     "--skip-sw keeps them out of software, so nothing would be copied; "
                                     "drop --skip-sw" + ("" if flower else " or try --flower"), EXIT_KERNEL)
    except BaseException:
        # leave nothing half-made: remove what this call added (mirrors that were already
        # there, in the other directions, stay)
        for d in todo:
            delete(from_if, to_if, d, netns=netns)
        if created_qdisc:
            _del_qdisc_if_empty(from_if, netns)
        raise
    return {"added": [c[4] for c in done if c[8] == "ip"], "already": sorted(want & have), "commands": done}


def _has_clsact(dev: str, netns: str | None) -> bool:
    p = tc(["qdisc", "show", "dev", dev], netns=netns, check=False, json_out=True)
    try:
        return any(q.get("kind") == "clsact" for q in json.loads(p.stdout or "[]"))
    except json.JSONDecodeError:
        return False


def _del_qdisc_if_empty(from_if: str, netns: str | None) -> bool:
    for d in ("ingress", "egress"):
        p = tc(["filter", "show", "dev", from_if, d], netns=netns, check=False)
        if p.returncode == 0 and p.stdout.strip():
            return False
    p = tc(["qdisc", "del", "dev", from_if, "clsact"], netns=netns, check=False)
    return p.returncode == 0


def delete(from_if: str, to_if: str | None = None, direction: str = "both", netns: str | None = None) -> list[dict]:
    """Remove skewscope's mirror filters on from_if (to to_if only, if given)."""
    check_iface(from_if, netns, "--from")
    removed = []
    for m in list_mirrors(from_if, netns):
        if to_if and m["to"] != to_if:
            continue
        if m["direction"] not in _dirs(direction):
            continue
        args = ["filter", "del", "dev", from_if, m["direction"], "prio", str(m["prio"]), "protocol",
                proto_arg(m["protocol"])]
        if m["handle"]:
            args += ["handle", str(m["handle"]), m["kind"]]
        p = tc(args, netns=netns, check=False)
        if p.returncode == 0:
            removed.append(m)
    # an emptied u32 priority keeps its hash table: remove our priorities when no filter is
    # left in them (a real filter entry has an "order"; the bare table entries do not)
    for pr, d, proto in {(m["prio"], m["direction"], proto_arg(m["protocol"])) for m in removed}:
        p = tc(["filter", "show", "dev", from_if, d, "prio", str(pr)], netns=netns, check=False, json_out=True)
        try:
            items = json.loads(p.stdout) if p.returncode == 0 and p.stdout.strip() else []
        except json.JSONDecodeError:
            continue
        if items and not any("order" in (it.get("options") or {}) for it in items):
            tc(["filter", "del", "dev", from_if, d, "prio", str(pr), "protocol", proto], netns=netns, check=False)
    if removed:
        _del_qdisc_if_empty(from_if, netns)
    return removed


def all_interfaces(netns: str | None = None) -> list[str]:
    cmd = ["ip"] + (["-n", netns] if netns else []) + ["-j", "link", "show"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    try:
        return [x["ifname"] for x in json.loads(p.stdout or "[]")]
    except (json.JSONDecodeError, KeyError):
        return []
