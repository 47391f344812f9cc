"""`skewscope mitigate plan|apply|status|revert`: guarded, reversible actions on the data path
(docs/mitigation.md). Nothing changes without `apply --yes`; every action has a TTL after
which it reverts by itself, also when no skewscope process is left alive."""
from __future__ import annotations

import contextlib
import json
import sys

import click

from skewscope.cli.common import fail, friendly_errors
from skewscope.core.errors import EXIT_NOT_RUN, EXIT_USAGE

EPILOG = """\b
Examples:
  skewscope diagnose run.pcap --json > d.json
  skewscope mitigate plan --from d.json                       what would change, and why
  skewscope mitigate plan --from http://dpu1:9435 --token-file t --finding prefill_interference:d6f8...
  skewscope mitigate apply -i pf0hpf --from d.json            dry run: the same, nothing changes
  skewscope mitigate apply -i pf0hpf --from d.json --yes --ttl 600
  skewscope mitigate apply -i pf0hpf --flow 10.0.0.1,10.0.0.5 --remark 8 --yes
  skewscope mitigate apply -i pf0hpf --flow ,10.0.0.9 --police 10G --yes
  skewscope mitigate status -i pf0hpf                         active actions, counters, time left
  skewscope mitigate revert -i pf0hpf 3                        one action (or --all)
  skewscope mitigate apply -i pf0hpf --backend flower --from d.json --yes   offloaded tc flower rules
  skewscope mitigate reap --backend flower                     remove expired rules (timer/scheduled)
\b
Exit codes: 0 ok; 2 usage / bad input file; 3 could not run; 4 not root; 6 no such interface;
7 busy (a foreign filter holds skewscope's tc priority, or no free rule slot); 8 the kernel (or tc)
refused.
"""


@click.group(epilog=EPILOG)
def mitigate():
    """Act on a finding from the DPU, reversibly: re-mark the DSCP of chosen RoCE flows (KV-cache
    bulk that stretches decode tokens) or police them to a rate, each with a TTL."""


def _backend_opts(f):
    f = click.option("--flower-body", metavar="mirror:PEER", hidden=True,
                     help="with --backend flower: a u32 + mirred body instead of flower (tests, kernels "
                          "without cls_flower)")(f)
    f = click.option("--backend", type=click.Choice(["software", "flower"]), default="software", show_default=True,
                     help="software: the eBPF program (TTL in the kernel); flower: offloadable tc flower rules "
                          "(a BlueField eSwitch; TTL by a scheduled reap)")(f)
    return f


def _where(f):
    f = _backend_opts(f)
    f = click.option("--netns", metavar="NAME", hidden=True, help="act inside network namespace NAME (tests)")(f)
    f = click.option("--direction", type=click.Choice(["ingress", "egress"]), default="ingress", show_default=True,
                     help="the hook of IFACE the traffic crosses")(f)
    f = click.option("-i", "--interface", "iface", required=True, metavar="IFACE",
                     help="the interface the traffic crosses (a BlueField representor or uplink)")(f)
    return f


def _what(f):
    opts = [
        click.option("--from", "from_file", metavar="FILE|URL",
                     help="a diagnose/report --json document, or a running exporter (http://HOST:9435: its "
                          "/v1/findings): act on its findings"),
        click.option("--token-file", metavar="FILE", type=click.Path(dir_okay=False),
                     help="with --from URL: the exporter's bearer token"),
        click.option("--finding", metavar="ID", help="only this finding (its event id, e.g. incast:9f3c...)"),
        click.option("--flow", "flows", multiple=True, metavar="SRC,DST[,QP]",
                     help="act on these RoCE flows instead (an empty end = any; repeatable)"),
        click.option("--remark", "dscp", type=click.IntRange(0, 63), default=None, metavar="DSCP",
                     help="re-mark to this DSCP (default for prefill interference: 8, CS1)"),
        click.option("--police", "police", metavar="RATE", help="police to RATE bit/s (e.g. 10G) instead"),
        click.option("--ttl", type=click.FloatRange(1, 7 * 86400), default=300.0, show_default=True, metavar="S",
                     help="seconds after which the action reverts by itself"),
        click.option("--json", "as_json", is_flag=True),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _backend(backend, iface, direction, netns, flower_body=None):
    """The backend object for one interface hook (inside the namespace already)."""
    if backend == "flower":
        from skewscope.mitigate import flower as FL  # light (tc)
        body = FL.flower_body
        if flower_body:
            kind, _, peer = flower_body.partition(":")
            if kind != "mirror" or not peer:
                fail(f"--flower-body {flower_body!r}: mirror:PEER", EXIT_USAGE)
            body = FL.mirror_body(peer)
        return FL.Flower(iface, direction, body=body, netns=netns)
    from skewscope.mitigate.software import Software  # heavy (bcc at attach): only when used
    return Software(iface, direction)


@contextlib.contextmanager
def _ns(netns):
    if not netns:
        yield
        return
    from skewscope.core.netns import in_netns  # light
    with in_netns(netns):
        yield


def _document(src: str, token_file: str | None) -> dict:
    """The findings document: a JSON file, or GET URL/v1/findings of a running exporter."""
    if src.startswith(("http://", "https://")):
        import urllib.error  # light; only for --from URL
        import urllib.request  # light; only for --from URL
        url = src.rstrip("/") + ("" if src.rstrip("/").endswith("/v1/findings") else "/v1/findings")
        req = urllib.request.Request(url)
        if token_file:
            from skewscope.outputs.http import read_token  # light
            req.add_header("Authorization", f"Bearer {read_token(token_file)}")
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            fail(f"{url}: HTTP {e.code} {e.reason}" + (" (--token-file?)" if e.code == 401 else ""), EXIT_NOT_RUN)
        except (urllib.error.URLError, OSError, ValueError) as e:
            fail(f"{url}: cannot read the exporter's findings ({getattr(e, 'reason', None) or e})", EXIT_NOT_RUN)
    try:
        with open(src) as fh:
            return json.load(fh)
    except OSError as e:
        fail(f"{src}: {e.strerror or e}", EXIT_USAGE)
    except json.JSONDecodeError as e:
        fail(f"{src}:{e.lineno}: not JSON ({e.msg})", EXIT_USAGE)


def _rules(from_file, finding, flows, dscp, police, ttl, token_file=None):
    from skewscope.mitigate import rules as R  # light
    if bool(from_file) == bool(flows):
        fail("give --from FILE (act on its findings) or --flow SRC,DST (act on chosen flows)", EXIT_USAGE)
    rate = R.parse_rate(police) if police else None
    if police and dscp is not None:
        fail("--remark and --police are two actions: give one", EXIT_USAGE)
    out = []
    if from_file:
        doc = _document(from_file, token_file)
        action = "police" if police else ("remark" if dscp is not None else None)
        for f, rs in R.plan_from_document(doc, finding=finding, action=action, rate_bps=rate,
                                          dscp=R.DEFAULT_DSCP if dscp is None else dscp, ttl=ttl):
            for r in rs:
                if r.action == "police" and r.rate_bps is None:
                    fail(f"{f['kind']}: policing needs --police RATE (its fair share is not known)", EXIT_USAGE)
                out.append((f, r.check()))
        return out
    if dscp is None and not police:
        fail("--flow needs --remark DSCP or --police RATE", EXIT_USAGE)
    for spec in flows:
        parts = [p.strip() for p in spec.split(",")]
        if len(parts) not in (2, 3):
            fail(f"--flow {spec!r}: SRC,DST or SRC,DST,QP (an empty end = any)", EXIT_USAGE)
        qp = None
        if len(parts) == 3 and parts[2]:
            try:
                qp = int(parts[2], 0)
            except ValueError:
                fail(f"--flow {spec!r}: QP {parts[2]!r} is not a number", EXIT_USAGE)
        r = R.Rule("police" if police else "remark", src=parts[0] or None, dst=parts[1] or None, dest_qp=qp,
                   dscp=dscp, rate_bps=rate, ttl=ttl, note="manual")
        out.append((None, r.check()))
    return out


def _print_plan(pairs, as_json, applied=False, dry=False):
    if as_json:
        click.echo(json.dumps({"applied": applied, "actions": [
            dict(r.to_dict(), finding=(f or {}).get("kind")) for f, r in pairs]}, indent=2))
        return
    if not pairs:
        click.echo("nothing to do: no finding here that a mitigation acts on (prefill_interference, incast)")
        return
    last = None
    for f, r in pairs:
        if f is not None and f is not last:
            click.echo(f"{f['severity'].upper()} {f['kind']}: {f.get('message', '')}")
            last = f
        click.echo(f"  {'applied' if applied else 'would'} {r.describe()}" + (f"  [id {r.id}]" if applied else ""))
    if dry:
        click.echo("dry run: nothing changed (add --yes to apply)")


@mitigate.command("plan", epilog=EPILOG)
@_what
@click.option("--flower", "flower_if", metavar="IFACE",
              help="also print the offloadable tc flower rules for IFACE (a BlueField representor or uplink) "
                   "that do the same in the NIC (docs/mitigation.md \"Where it runs\")")
@click.option("--direction", type=click.Choice(["ingress", "egress"]), default="ingress", show_default=True,
              help="with --flower: the hook")
@friendly_errors
def plan(from_file, token_file, finding, flows, dscp, police, ttl, as_json, flower_if, direction):
    """Print exactly what `apply` would change, and why. Needs no root, touches nothing."""
    pairs = _rules(from_file, finding, flows, dscp, police, ttl, token_file)
    _print_plan(pairs, as_json and not flower_if)
    if flower_if:
        from skewscope.mitigate.flower import commands  # light
        cmds = [c for k, (_f, r) in enumerate(pairs) for c in commands(r, flower_if, direction, slot=k, rid=k + 1)[k > 0:]]
        if as_json:
            click.echo(json.dumps({"actions": [dict(r.to_dict(), finding=(f or {}).get("kind")) for f, r in pairs],
                                   "flower": [["tc", *c] for c in cmds]}, indent=2))
        else:
            click.echo("# tc flower rules a BlueField eSwitch offloads (skip_sw); review, then run as root:")
            for c in cmds:
                click.echo("tc " + " ".join(c))


@mitigate.command("apply", epilog=EPILOG)
@_where
@_what
@click.option("--yes", is_flag=True, help="really apply (without it: a dry run that changes nothing)")
@friendly_errors
def apply(iface, direction, netns, backend, flower_body, from_file, token_file, finding, flows, dscp, police, ttl,
          as_json, yes):
    """Apply the plan on IFACE (a dry run without --yes)."""
    pairs = _rules(from_file, finding, flows, dscp, police, ttl, token_file)
    if not yes or not pairs:
        _print_plan(pairs, as_json, dry=bool(pairs))
        return
    with _ns(netns):
        be = _backend(backend, iface, direction, netns, flower_body)
        be.reap()
        be.apply([r for _, r in pairs])
    _print_plan(pairs, as_json, applied=True)
    if not as_json:
        how = "reverts by itself" if backend == "software" else "is removed by a scheduled reap"
        click.echo(f"each {how} in {ttl:g} s; now: skewscope mitigate revert -i {iface} "
                   f"--direction {direction}{'' if backend == 'software' else ' --backend flower'} ID|--all")


def _status_rows(rules):
    from skewscope.mitigate.rules import fmt_rate  # light
    for r in rules:
        c = r.counters
        extra = (f", {c['dropped']} dropped" if r.action == "police" else
                 f", {c['remarked']} re-marked" if "remarked" in c else "")
        yield (f"{r.id:>3}  {r.describe()}  -- {max(r.expires_in, 0):.0f} s left; {c['packets']} packets "
               f"({c['bytes']} bytes){extra}" + ("" if r.action != "police" else f" at {fmt_rate(r.rate_bps)}"))


@mitigate.command("status", epilog=EPILOG)
@_where
@click.option("--json", "as_json", is_flag=True)
@friendly_errors
def status(iface, direction, netns, backend, flower_body, as_json):
    """The active actions on IFACE: what, why, counters, time left (expired ones are cleared)."""
    with _ns(netns):
        be = _backend(backend, iface, direction, netns, flower_body)
        cleared = be.reap()
        rules = be.status()
    if as_json:
        click.echo(json.dumps({"active": [r.to_dict() for r in rules],
                               "expired_cleared": [r.to_dict() for r in cleared]}, indent=2))
        return
    for r in cleared:
        click.echo(f"expired and cleared: {r.describe()}", err=True)
    if not rules:
        click.echo(f"no skewscope mitigation active on {iface} {direction}")
    for line in _status_rows(rules):
        click.echo(line)


@mitigate.command("revert", epilog=EPILOG)
@_where
@click.argument("ids", nargs=-1, type=int)
@click.option("--all", "all_", is_flag=True, help="every skewscope action on the hook (nothing else)")
@friendly_errors
def revert(iface, direction, netns, backend, flower_body, ids, all_):
    """Remove actions now: the given ids, or --all. Only skewscope's rules are ever touched."""
    if bool(ids) == all_:
        fail("give the ids to revert, or --all", EXIT_USAGE)
    with _ns(netns):
        be = _backend(backend, iface, direction, netns, flower_body)
        removed = be.revert(None if all_ else list(ids))
    for r in removed:
        click.echo(f"reverted {r.id}: {r.describe()}")
    if not removed:
        click.echo(f"nothing to revert on {iface} {direction}")
    sys.stdout.flush()


@mitigate.command("reap", epilog=EPILOG)
@click.option("-i", "--interface", "iface", metavar="IFACE", help="this interface only (default: every interface)")
@click.option("--direction", type=click.Choice(["ingress", "egress"]), default=None,
              help="this hook only (default: both)")
@click.option("--netns", metavar="NAME", hidden=True, help="act inside network namespace NAME (tests)")
@_backend_opts
@friendly_errors
def reap(iface, direction, netns, backend, flower_body):
    """Remove skewscope's actions past their TTL (and nothing else). The flower backend's TTL
    depends on it: apply schedules it at the deadline, deploy/systemd's
    skewscope-mitigate-reap.timer runs it every 30 s."""
    import socket  # light
    from skewscope.core.errors import DataplaneError  # light
    with _ns(netns):
        ifaces = [iface] if iface else [n for _i, n in socket.if_nameindex()]
        reaped = []
        for name in ifaces:
            for d in [direction] if direction else ["ingress", "egress"]:
                try:
                    be = _backend(backend, name, d, netns, flower_body)
                except DataplaneError:
                    if iface:
                        raise
                    continue            # went away meanwhile
                reaped += [(name, d, r) for r in be.reap()]
    for name, d, r in reaped:
        click.echo(f"reaped {name} {d} {r.id}: {r.describe()}")
    if not reaped:
        click.echo("nothing expired")
