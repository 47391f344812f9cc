"""`skewscope mirror add|del|list`: the tc mirred rules that copy RoCE traffic from the
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

import click

from .cli import EXIT_USAGE, friendly_errors
from .dataplane import EXIT_KERNEL, EXIT_NO_IFACE, EXIT_NOT_RUN, DataplaneError, check_privileges

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


def _check_iface(name: str, netns: str | None, role: str) -> None:
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


def _proto_arg(p: str) -> str:
    return {"ip": "ip", "ipv6": "ipv6", "[35093]": "0x8915", "0x8915": "0x8915"}.get(p, p)


def add(from_if: str, to_if: str, direction: str = "ingress", skip_sw: bool = False, flower: bool = False,
        to_ingress: bool = False, netns: str | None = None) -> dict:
    """Install the mirror (idempotent: an identical one already there is left as is)."""
    if from_if == to_if:
        raise DataplaneError("--from and --to are the same interface (the copies would loop)", EXIT_USAGE)
    _check_iface(from_if, netns, "--from")
    _check_iface(to_if, netns, "--to")
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
    _check_iface(from_if, netns, "--from")
    removed = []
    for m in list_mirrors(from_if, netns):
        if to_if and m["to"] != to_if:
            continue
        if m["direction"] not in _dirs(direction):
            continue
        args = ["filter", "del", "dev", from_if, m["direction"], "prio", str(m["prio"]), "protocol",
                _proto_arg(m["protocol"])]
        if m["handle"]:
            args += ["handle", str(m["handle"]), m["kind"]]
        p = tc(args, netns=netns, check=False)
        if p.returncode == 0:
            removed.append(m)
    # an emptied u32 priority keeps its hash table: remove our priorities when no filter is
    # left in them (a real filter entry has an "order"; the bare table entries do not)
    for pr, d, proto in {(m["prio"], m["direction"], _proto_arg(m["protocol"])) for m in removed}:
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


# ---- the command ------------------------------------------------------------------------------
EPILOG = """\b
Examples:
  skewscope mirror add --from p0 --to pf0vf0rep        RoCE arriving on the uplink, copied to
                                                       the VF representor; watch the VF netdev
  skewscope mirror add --from p0 --to pf0vf0rep --direction both --flower --skip-sw
                                                       hardware-only (eSwitch offload, mlx5)
  skewscope mirror list                                every skewscope mirror on this host
  skewscope mirror del --from p0                       remove ours from p0 (never others')
\b
Exit codes: 0 ok; 2 usage; 3 tc missing; 4 not root; 6 no such interface; 8 tc refused the rule.
"""


@click.group(epilog=EPILOG)
def mirror():
    """Copy RoCE traffic (UDP 4791, RoCEv1 0x8915) from one interface to another with a tc
    mirred rule, so skewscope can watch a copy of traffic the NIC forwards in hardware."""


def _common(f):
    f = click.option("--netns", metavar="NAME", help="run tc inside network namespace NAME")(f)
    return f


@mirror.command("add")
@click.option("--from", "from_if", required=True, metavar="IF", help="interface the RoCE traffic crosses")
@click.option("--to", "to_if", required=True, metavar="IF", help="interface that receives the copies")
@click.option("--direction", type=click.Choice(["ingress", "egress", "both"]), default="ingress",
              show_default=True, help="which direction of FROM to copy")
@click.option("--skip-sw", is_flag=True, help="hardware only (fails where the driver cannot offload)")
@click.option("--flower", is_flag=True, help="use flower filters (offloadable on mlx5/BlueField) instead of u32")
@click.option("--to-ingress", is_flag=True,
              help="inject the copies into TO's receive path (mirred ingress) instead of sending them out of TO")
@click.option("--dry-run", is_flag=True, help="print the tc commands, change nothing")
@_common
@friendly_errors
def mirror_add(from_if, to_if, direction, skip_sw, flower, to_ingress, dry_run, netns):
    """Add the mirror FROM -> TO."""
    if dry_run:
        pre = "tc" + (f" -n {netns}" if netns else "")
        for c in add_commands(from_if, to_if, direction, skip_sw, flower, to_ingress):
            click.echo(f"{pre} {' '.join(c)}")
        return
    check_privileges()
    r = add(from_if, to_if, direction, skip_sw, flower, to_ingress, netns=netns)
    kind = "flower" if flower else "u32"
    how = (" (hardware only)" if skip_sw else "")
    if r["added"]:
        click.echo(f"mirroring RoCE {'+'.join(r['added'])} of {from_if} to {to_if} "
                   f"({'into its receive path' if to_ingress else 'out of it'}); {kind} filters{how}; "
                   f"remove with: skewscope mirror del --from {from_if}"
                   + (f" --netns {netns}" if netns else ""))
    if r["already"]:
        click.echo(f"already mirroring {'+'.join(r['already'])} of {from_if} to {to_if}; left as is")


@mirror.command("del")
@click.option("--from", "from_if", required=True, metavar="IF")
@click.option("--to", "to_if", metavar="IF", help="only the mirror to this interface")
@click.option("--direction", type=click.Choice(["ingress", "egress", "both"]), default="both", show_default=True)
@_common
@friendly_errors
def mirror_del(from_if, to_if, direction, netns):
    """Remove skewscope's mirror filters from FROM (nobody else's)."""
    check_privileges()
    removed = delete(from_if, to_if, direction, netns=netns)
    if not removed:
        click.echo(f"{from_if}: no skewscope mirror" + (f" to {to_if}" if to_if else ""))
        return
    dirs = sorted({m["direction"] for m in removed})
    tos = sorted({m["to"] for m in removed})
    click.echo(f"{from_if}: removed {len(removed)} mirror filter(s) ({'+'.join(dirs)} -> {', '.join(tos)})")


@mirror.command("list")
@click.option("--from", "from_if", metavar="IF", help="only this interface (default: all)")
@click.option("--json", "as_json", is_flag=True)
@_common
@friendly_errors
def mirror_list(from_if, as_json, netns):
    """Show skewscope's mirrors (with packet counts where the kernel reports them)."""
    check_privileges()
    if from_if:
        _check_iface(from_if, netns, "--from")
    names = [from_if] if from_if else all_interfaces(netns)
    rows = []
    for n in names:
        rows += list_mirrors(n, netns)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo("no skewscope mirror" + (f" on {from_if}" if from_if else ""))
        return
    click.echo(f"{'FROM':<15} {'DIR':<8} {'PROTO':<7} {'KIND':<6} {'TO':<15} {'HW':<3} PACKETS")
    for m in rows:
        proto = _proto_arg(m["protocol"] or "?").replace("0x8915", "rocev1")
        hw = "yes" if m["in_hw"] else "no"
        pk = "-" if m["packets"] is None else str(m["packets"])
        click.echo(f"{m['from']:<15} {m['direction']:<8} {proto:<7} {m['kind']:<6} {m['to'] or '?':<15} {hw:<3} {pk}")


# registered here too: when this module is imported before skewscope.cli (cli imports it
# back while it is half-initialised, and would miss the command)
from . import cli as _cli  # noqa: E402

if "mirror" not in _cli.main.commands:
    _cli.main.add_command(mirror)
