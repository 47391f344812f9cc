"""Commands on files: report, replay, and detach (cleanup after a crash)."""
from __future__ import annotations

import os
import sys

import click

from skewscope.cli.common import enrich_options, fail, friendly_errors, load_source
from skewscope.core.errors import EXIT_BUSY, EXIT_USAGE

REPORT_EPILOG = """\b
Examples:
  skewscope report trace.pcap                     table of the top flows + findings
  skewscope report trace.pcapng.gz --json         the stable JSON document (README "Counters")
  skewscope report run.snap --top 50              a snapshot from capture/replay
  skewscope report run.snap --html run.html       + one self-contained page of pictures (docs/html.md)
  tcpdump -i eth1 -s 128 -w - udp port 4791 | skewscope report /dev/stdin
\b
Columns: README "Report columns"; real output: docs/examples/report_offline_example.txt.
Exit codes: 0 ok (a capture damaged part-way too: one warning line); 2 usage (e.g. --html in
a missing directory); 3 unreadable, unsupported or invalid file, the page cannot be written,
or matplotlib missing for --html.
"""


REPLAY_EPILOG = """\b
Examples:
  sudo skewscope replay trace.pcap -o k.snap      kernel's view of a capture
  sudo skewscope replay trace.pcap -o k.snap --entry tc --json
  skewscope report k.snap                         read it back (no root)
\b
Exit codes: 0 ok; 2 usage (e.g. -o in a missing directory); 3 unreadable or unsupported
capture; 4 not root; 5 bcc missing; 8 kernel refused the program.
"""


DETACH_EPILOG = """\b
Examples:
  sudo skewscope detach -i pf0hpf                 after a run killed with SIGKILL (netlink attach)
\b
Mitigation rules (`skewscope mitigate`, either backend, both hooks) go too, as with
`mitigate revert --all`; a running `watch --mitigate` may apply them again.
\b
Exit codes: 0 ok (also: nothing to remove); 2 usage; 4 not root; 6 no such interface;
7 the program is in use by a running skewscope (stop that run, or --force).
"""


@click.command(epilog=REPLAY_EPILOG)
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True, help="snapshot to write (.snap)")
@click.option("--entry", type=click.Choice(["xdp", "tc"]), default="xdp", show_default=True,
              help="which entry point of the program to run")
@click.option("--max-flows", type=click.IntRange(16, 1 << 24), default=65536, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="print the report as JSON")
@friendly_errors
def replay(file, output, entry, max_flows, as_json):
    """Run every frame of a capture through the real BPF program (BPF_PROG_TEST_RUN) and
    save the Snapshot. Needs root. Timestamps come from the capture."""
    from skewscope.outputs import report as R  # heavy (numpy): not loaded by --help
    from skewscope.sources.replay import replay as run  # heavy (numpy): not loaded by --help
    d = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(d):  # before the replay, not after it (and not the temp file's name)
        fail(f"-o {output}: directory {d} does not exist", EXIT_USAGE)
    snap = run(file, entry=entry, max_flows=max_flows)
    for w in snap.meta.get("warnings", []):   # e.g. packets skipped on an unsupported link type
        click.echo(f"skewscope: warning: {w}", err=True)
    snap.save(output)
    if as_json:
        from skewscope.analysis import analyze  # heavy (numba)
        click.echo(R.to_json(snap, analyze(snap)))
    else:
        m = snap.meta
        click.echo(f"replayed {m['frames']} frames through {entry} -> {output} "
                   f"({len(snap.flows)} flows, {len(snap.events)} message records"
                   + (f"; {m['padded_records']} snaplen-cut records padded to original length" if m["padded_records"]
                      else "") + ")")


@click.command(epilog=REPORT_EPILOG)
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="print the stable JSON document")
@click.option("--top", type=click.IntRange(1, 100000), default=20, show_default=True, help="flows in the table")
@click.option("--max-flows", type=click.IntRange(16, 1 << 24), default=65536, show_default=True,
              help="captures: flow table size (least recently used flows are evicted beyond it)")
@click.option("--html", "html_out", type=click.Path(dir_okay=False), metavar="OUT.html",
              help="also write one self-contained HTML page: traffic matrix, link rates over time, timing, "
                   "message sizes, each finding's evidence drawn, counters (docs/html.md)")
@click.option("--node-ip", metavar="IP", help="the node whose DPU took this capture (one DPU per node): its "
              "own timing in node_timing; default: the IP that is an end of every data flow, if any")
@enrich_options
@friendly_errors
def report(file, as_json, top, max_flows, html_out, node_ip, enricher):
    """Report on a snapshot (.snap) or a capture (pcap/pcapng, .gz too). No root needed."""
    from skewscope.analysis import analyze  # heavy (numba); before load_source, which ends the start-up
    from skewscope.outputs import report as R  # heavy (numpy): not loaded by --help
    if html_out:
        from skewscope.outputs import html as H  # heavy (numpy, 0.1 s): only for --html
        H.check_output(html_out)      # before reading: a typo costs nothing
    snap = load_source(file, progress=sys.stderr.isatty(), max_flows=max_flows)
    analysis = analyze(snap)
    if node_ip:
        from skewscope.analysis.nodeview import node_timing  # heavy (numba)
        analysis["node_timing"] = node_timing(snap, node_ip)
    enricher(analysis, meta=snap.meta)
    if html_out:
        size = H.write(html_out, snap, analysis)
        click.echo(f"wrote {html_out} ({size / 1024:.0f} KiB)", err=True)
    if as_json:
        click.echo(R.to_json(snap, analysis))
    else:
        R.human(snap, analysis, top=top)


@click.command(epilog=DETACH_EPILOG)
@click.option("-i", "--interface", "iface", required=True, help="interface to clean")
@click.option("--force", is_flag=True, help="remove even a program a running skewscope still uses")
@friendly_errors
def detach(iface, force):
    """Remove skewscope's own XDP/TC programs and mitigation rules from an interface (after a
    crash). Programs and filters that are not skewscope's are never touched, nor (without
    --force) a capture program that a running skewscope (top, capture, export) still uses."""
    from skewscope.bpf.attach import detach_ours, ifindex  # heavy (numpy): not loaded by --help
    from skewscope.bpf.loader import check_privileges  # heavy (numpy): not loaded by --help
    from skewscope.sources.live import find_leftover  # heavy (numpy): not loaded by --help
    check_privileges()
    ifindex(iface)  # one clear line when it does not exist
    if not force:
        lo = find_leftover(iface)
        if lo is not None and lo.holders:
            who = ", ".join(f"{c} (pid {p})" for p, c in lo.holders)
            fail(f"{iface}: {lo.describe()} is in use by {who}; stop that run (or use --force)", EXIT_BUSY)
    removed = detach_ours(iface)
    parts = [f"{n} {b} mitigation rule{'s' if n > 1 else ''} ({d})" for b, d, n in _revert_mitigations(iface)]
    if removed["xdp"]:
        parts.append(f"XDP program id {removed['xdp']}")
    parts += [f"TC {d} filter (prio {p})" for d, p, _ in removed["tc"]]
    parts += [f"TC {d} tcx link id {lk} (program id {p})" for d, lk, p in removed.get("tcx", [])]
    click.echo(f"{iface}: removed " + ", ".join(parts) if parts else f"{iface}: no skewscope program attached")


def _revert_mitigations(iface: str) -> list[tuple[str, str, int]]:
    """skewscope's mitigation rules on the interface, both hooks and both backends, removed as
    `mitigate revert --all` does (a foreign filter is never touched): [(backend, hook, count)]."""
    from skewscope.mitigate.flower import Flower  # light (tc)
    from skewscope.mitigate.software import Software  # light until a rule is found
    out = []
    for hook in ("ingress", "egress"):
        for name, backend in (("software", Software(iface, hook)), ("flower", Flower(iface, hook, schedule=False))):
            n = len(backend.revert(None))
            if n:
                out.append((name, hook, n))
    return out

