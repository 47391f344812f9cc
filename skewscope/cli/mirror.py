"""`skewscope mirror add|del|list`: the command around sources.mirror (tc mirred rules that
copy RoCE to the interface skewscope watches; docs/dpu.md)."""
from __future__ import annotations

import json

import click

from skewscope.cli.common import friendly_errors
from skewscope.sources.mirror import add, add_commands, all_interfaces, check_iface, delete, list_mirrors, proto_arg

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
    from skewscope.bpf.loader import check_privileges  # heavy (numpy): not loaded by --help
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
    from skewscope.bpf.loader import check_privileges  # heavy (numpy): not loaded by --help
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
    from skewscope.bpf.loader import check_privileges  # heavy (numpy): not loaded by --help
    check_privileges()
    if from_if:
        check_iface(from_if, netns, "--from")
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
        proto = proto_arg(m["protocol"] or "?").replace("0x8915", "rocev1")
        hw = "yes" if m["in_hw"] else "no"
        pk = "-" if m["packets"] is None else str(m["packets"])
        click.echo(f"{m['from']:<15} {m['direction']:<8} {proto:<7} {m['kind']:<6} {m['to'] or '?':<15} {hw:<3} {pk}")


