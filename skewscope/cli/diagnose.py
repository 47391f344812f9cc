"""`skewscope diagnose`: findings for runbooks and CI, with exit codes.

    skewscope diagnose (FILE | -i IFACE --duration D) [--json] [--check KIND ...]
                       [--threshold KIND.NAME=VALUE ...]

Exit codes (a contract): 0 healthy (no finding above info), 1 warnings, 2 critical,
3 could not run (unreadable input, bad arguments, capture failed: one line on stderr).

JSON (`--json`, stable; docs/metrics.md "diagnose --json"):
{"diagnose_version": 1, "source": str, "status": "healthy"|"warning"|"critical",
 "exit_code": 0|1|2, "counts": {"critical", "warning", "info"},
 "findings": [{"kind", "severity", "entities": {"ips", "qps", "flows"}, "evidence",
               "message", "group", "impact": {"seconds", "share"} | null,
               "since": s | null, "until": s | null,
               "incident": id | null,
               "cause": {...} (with --dcgm, on straggler/slow-shard kinds: telemetry/cause.py)}]
               (severity, then impact),
 "incidents": [{"id", "severity", "kind", "lead", "symptoms": [i], "context": [i],
                "entities", "impact", "since", "until", "message"}]  (the findings that
               share a root, indices into "findings"; docs/metrics.md "Incidents"),
 "collectives": [{"kind", "pattern", "members", "confidence"}],
 "timing": {...} | null, "checks": [kinds run], "thresholds": {kind: {name: value}},
 "capture": {"packets", "roce_packets", "flows", "message_records", "duration_s",
             "source", "sample_n", "first_s", "last_s", "clock", "started_at"}}
The human output shows each incident (severity, id, the lead's kind and node) with its
findings indented under it, then the context findings.
since/until and capture first_s/last_s: seconds on the capture's clock (pcap: unix time;
"monotonic": a live capture's, on the wall clock at started_at + (t - first_s)).
"""
from __future__ import annotations

import re
import sys

import click

from skewscope.cli.common import enrich_options, fail, load_source, parse_thresholds, startup_done
from skewscope.core.errors import EXIT_CRITICAL, EXIT_NOT_RUN, EXIT_OK, EXIT_WARNING, DataplaneError, PcapError
from skewscope.core.when import Clock

DIAGNOSE_VERSION = 1
_DUR = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|min|h)?\s*$")

EPILOG = """\b
Examples:
  skewscope diagnose run.snap                     findings, exit 0 ok / 1 warn / 2 critical
  skewscope diagnose trace.pcap --json            stable JSON for a runbook or CI
  skewscope diagnose -i pf0hpf --duration 10s     capture 10 s live (root), then diagnose
  skewscope diagnose run.snap --check hot_destination --check alltoall_destination_skew
  skewscope diagnose run.snap --threshold ring_straggler.warning=0.9
  skewscope diagnose --list-checks                every check and its default thresholds
\b
Exit codes: 0 healthy, 1 warnings, 2 critical, 3 could not run.
"""


class _DiagnoseCommand(click.Command):
    """Bad arguments are "could not run" (3) here, not click's 2, which means critical."""

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.exceptions.UsageError as e:
            click.echo(f"skewscope diagnose: {e.format_message()}", err=True)
            sys.exit(EXIT_NOT_RUN)


def _duration(s: str) -> float:
    m = _DUR.match(str(s))
    if not m:
        fail(f"--duration: {s!r} is not a duration (e.g. 10, 10s, 500ms, 2m)", EXIT_NOT_RUN)
    v = float(m.group(1)) * {None: 1, "s": 1, "ms": 1e-3, "m": 60, "min": 60, "h": 3600}[m.group(2)]
    if v <= 0:
        fail(f"--duration: {s!r} must be > 0", EXIT_NOT_RUN)
    return v


def _list_checks(ctx, param, value):
    if not value or ctx.resilient_parsing:
        return
    from skewscope.analysis.detectors import list_checks_lines  # heavy (numba, the analysis package)
    for line in list_checks_lines():
        click.echo(line)
    ctx.exit(0)


def live_snapshot(iface: str, duration: float, use_tc: bool, xdp_mode: str, direction: str, sample_n: int,
                  max_flows: int):
    """Capture `duration` seconds on an interface through skewscope.sources.live.capture (attach,
    read, detach whatever happens) and return the Snapshot."""
    from skewscope.sources import live  # heavy (numpy): not loaded by --help
    startup_done()
    def progress(elapsed, total, g):
        if sys.stderr.isatty():
            click.echo(f"\rcapturing on {iface}: {elapsed:4.1f}/{total:.1f} s", err=True, nl=False)
    snap = live.capture(iface, duration, mode="tc" if use_tc else "xdp", xdp_mode=xdp_mode, direction=direction,
                        sample_n=sample_n, max_flows=max_flows, progress=progress)
    if sys.stderr.isatty():
        click.echo("", err=True)
    return snap


def run(snap, checks=None, thresholds=None, enricher=None) -> tuple[dict, int]:
    """Analyze a Snapshot and build the diagnose document and its exit code (enricher: names
    and causes, telemetry.enrich; never the status)."""
    from skewscope.analysis import analyze, resolve_checks  # heavy (numba)
    from skewscope.outputs import report as R  # heavy (numpy): not loaded by --help
    a = analyze(snap, thresholds=thresholds, checks=checks or None)
    if enricher:
        enricher(a, meta=snap.meta)
    fs = a["findings"]
    counts = {s: sum(1 for f in fs if f["severity"] == s) for s in ("critical", "warning", "info")}
    code = EXIT_CRITICAL if counts["critical"] else EXIT_WARNING if counts["warning"] else EXIT_OK
    status = {EXIT_CRITICAL: "critical", EXIT_WARNING: "warning", EXIT_OK: "healthy"}[code]
    t = R.totals(snap)
    m = snap.meta
    doc = {
        "diagnose_version": DIAGNOSE_VERSION,
        "source": m.get("file") or m.get("interface") or m.get("source", "?"),
        "status": status, "exit_code": code, "counts": counts, "findings": fs, "incidents": a["incidents"],
        "collectives": [{"kind": c["kind"], "pattern": c["pattern"], "members": c["members"],
                         **({"member_names": c["member_names"]} if "member_names" in c else {}),
                         "confidence": c["confidence"], "workload": c["metrics"].get("workload"),
                         "period_s": c["metrics"].get("period_s"), "timing": c.get("timing")}
                        for c in a["collectives"]],
        "timing": a["timing"],
        "checks": sorted(resolve_checks(checks or None)),
        "thresholds": a["thresholds"],
        **({"inventory": a["inventory"]} if "inventory" in a else {}),
        "capture": {"packets": t["packets_seen"], "roce_packets": t["roce_packets"], "flows": int(len(snap.flows)),
                    "message_records": t["message_records"], "duration_s": float(m.get("duration_s", 0) or 0),
                    "source": m.get("source"), "sample_n": int(m.get("sample_n", 1) or 1),
                    "first_s": _s(m.get("first_ts")), "last_s": _s(m.get("last_ts")),
                    "clock": m.get("clock") or "pcap", "started_at": m.get("started_at")},
    }
    return doc, code


def _s(ns) -> float | None:
    return float(ns) / 1e9 if ns is not None else None


def _human(doc) -> None:
    from rich.console import Console  # heavy (rich): only when drawing

    from skewscope.outputs.report import analysis_lines, finding_lines  # heavy (numpy): not loaded by --help
    con = Console(highlight=False, soft_wrap=True)
    clock = Clock.of(doc["capture"])
    cap = doc["capture"]
    con.print(f"[bold]skewscope diagnose[/bold] {doc['source']}: {cap['roce_packets']} RoCE packets, "
              f"{cap['flows']} flows, {cap['duration_s']:.3f} s")
    for line in analysis_lines(doc):
        con.print(line)
    for line in finding_lines(doc, clock):        # incidents first, each finding's when and cause
        con.print(line)
    c = doc["counts"]
    color = {"critical": "red", "warning": "yellow"}.get(doc["status"], "green")
    con.print(f"[{color}]{doc['status']}[/{color}]: {c['critical']} critical, {c['warning']} warning, "
              f"{c['info']} info")


@click.command(cls=_DiagnoseCommand, epilog=EPILOG)
@click.argument("file", required=False, type=click.Path(dir_okay=False))
@click.option("-i", "--interface", "iface", metavar="IFACE", help="capture live on IFACE instead of reading FILE (root)")
@click.option("--duration", default="10s", show_default=True, help="live capture length (e.g. 10s, 500ms, 2m)")
@click.option("--tc", "use_tc", is_flag=True, help="live: attach with TC clsact instead of XDP")
@click.option("--xdp-mode", type=click.Choice(["native", "generic"]), default="native", show_default=True)
@click.option("--direction", type=click.Choice(["ingress", "egress", "both"]), default="ingress", show_default=True,
              help="live, with --tc: which direction(s)")
@click.option("--sample", "sample_n", type=click.IntRange(1, 1 << 20), default=1, show_default=True, metavar="N",
              help="live: count 1 RoCE packet in N")
@click.option("--max-flows", type=click.IntRange(16, 1 << 24), default=65536, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="print the stable JSON document")
@click.option("--check", "checks", multiple=True, metavar="KIND", help="run only these checks (repeatable, or a,b)")
@click.option("--threshold", "thresholds", multiple=True, metavar="KIND.NAME=VALUE",
              help="override a default threshold (repeatable; see --list-checks)")
@click.option("--list-checks", is_flag=True, is_eager=True, expose_value=False, callback=_list_checks,
              help="list the checks and their default thresholds, then exit")
@enrich_options
def diagnose(file, iface, duration, use_tc, xdp_mode, direction, sample_n, max_flows, as_json, checks, thresholds,
             enricher):
    """Find skews and pathologies in a snapshot, a capture or a live interface; exit
    0 healthy, 1 warnings, 2 critical, 3 could not run."""
    from skewscope.core.snapshot import SnapshotError  # heavy (numpy): not loaded by --help
    if bool(file) == bool(iface):
        fail("diagnose: give a FILE (.snap, pcap, pcapng) or -i IFACE, not both or neither", EXIT_NOT_RUN)
    # heavy (numba, the analysis package): imported once the arguments are known to be good
    from skewscope.analysis.detectors import ThresholdError, resolve_checks, resolve_thresholds
    th = parse_thresholds(thresholds)
    try:
        resolve_thresholds(th)
        resolve_checks(checks)
    except ThresholdError as e:
        fail(str(e), EXIT_NOT_RUN)
    try:
        if file:
            snap = load_source(file, progress=not as_json and sys.stderr.isatty())
        else:
            snap = live_snapshot(iface, _duration(duration), use_tc, xdp_mode, direction, sample_n, max_flows)
        doc, code = run(snap, checks=list(checks), thresholds=th, enricher=enricher)
    except (DataplaneError, PcapError, SnapshotError, ThresholdError) as e:
        fail(str(e), EXIT_NOT_RUN)
    except KeyboardInterrupt:
        fail("interrupted", EXIT_NOT_RUN)
    except OSError as e:
        fail(f"{e.filename + ': ' if getattr(e, 'filename', None) else ''}{e.strerror or e}", EXIT_NOT_RUN)
    except MemoryError:
        fail("out of memory while analysing (capture a shorter window)", EXIT_NOT_RUN)
    if as_json:
        try:
            from skewscope.outputs import jsonfmt   # json.dumps(doc, indent=2), the same string, faster
            click.echo(jsonfmt.dumps(doc, 2))
        except BrokenPipeError:
            pass
    else:
        _human(doc)
    sys.exit(code)
