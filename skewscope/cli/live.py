"""`skewscope top` and `skewscope capture`: the live commands (root)."""
from __future__ import annotations

import os
import re
import signal
import sys

import click

from skewscope.cli.common import enrich_options, fail, friendly_errors
from skewscope.core.errors import EXIT_NO_IFACE, EXIT_USAGE

TOP_EPILOG = """\b
Examples:
  skewscope top -i pf0hpf                  live view (XDP native) of every QP, 1 s refresh
  skewscope top -i eth1 --xdp-mode generic for drivers without native XDP (veth is fine)
  skewscope top -i eth1 --tc --direction both   TC clsact, both directions
  skewscope top -i eth1 --sample 8         count 1 packet in 8 (rates scaled x8)
  skewscope top -i eth1 5 3                three plain tables, 5 s apart (like bcc tools)
  skewscope top -i eth1 | tee top.log      no terminal: plain periodic tables
  skewscope top -i eth1 --plain --matrix 5 node x node traffic matrix every 5 s
\b
Keys: q quit, s/S sort column, r reverse, / filter by IP, up/down select,
enter message-size histogram of the selected flow, m node x node matrix (heatmap) / flow
table, c interval/cumulative, p pause.
\b
Exit codes: 0 ok (q, Ctrl-C); 2 usage; 3 could not run; 4 not root; 5 bcc missing; 6 no such
interface (or it went away); 7 interface busy; 8 kernel refused; 143/129 SIGTERM/SIGHUP.
Columns: docs/man/skewscope.8.md FIELDS.
"""

CAPTURE_EPILOG = """\b
Examples:
  skewscope capture -i pf0hpf --duration 30s -o run.snap
  skewscope capture -i eth1 --duration 10s -o run.snap --pcap-out run.pcap
  skewscope report run.snap                 later, anywhere, no root
\b
Exit codes: 0 ok (Ctrl-C too: the capture is saved); 2 usage; 3 could not run; 4 not root;
5 bcc missing; 6 no such interface (or it went away: what was counted is saved); 7 busy;
8 kernel refused; 143/129 SIGTERM/SIGHUP. Fields: README "Counters".
"""

_DUR = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|min|h)?\s*$")


class Duration(click.ParamType):
    name = "DURATION"

    def convert(self, value, param, ctx):
        if isinstance(value, (int, float)):
            v = float(value)
        else:
            mt = _DUR.match(str(value))
            if not mt:
                self.fail(f"{value!r} is not a duration (e.g. 30, 30s, 500ms, 2m, 1h)", param, ctx)
            v = float(mt.group(1)) * {None: 1, "s": 1, "ms": 1e-3, "m": 60, "min": 60, "h": 3600}[mt.group(2)]
        if v <= 0:
            self.fail(f"{value!r}: must be > 0", param, ctx)
        return v


def _attach_options(f):
    opts = [
        click.option("-i", "--interface", "iface", required=True, metavar="IFACE", help="interface to watch"),
        click.option("--tc", "use_tc", is_flag=True, help="attach with TC clsact instead of XDP (also sees egress)"),
        click.option("--direction", type=click.Choice(["ingress", "egress", "both"]), default="ingress",
                     show_default=True, help="with --tc: which direction(s)"),
        click.option("--xdp-mode", type=click.Choice(["native", "generic"]), default="native", show_default=True,
                     help="XDP in the driver (native) or in the kernel's generic path"),
        click.option("--sample", "sample_n", type=click.IntRange(1, 1 << 20), default=1, show_default=True,
                     metavar="N", help="count 1 RoCE packet in N (rates scaled by N; message records off)"),
        click.option("--max-flows", type=click.IntRange(16, 1 << 24), default=65536, show_default=True,
                     help="flow table size (LRU; evictions are counted and shown)"),
        click.option("--force-detach", is_flag=True,
                     help="remove a stale skewscope program left on IFACE by a crashed run, without asking"),
        click.option("--ebpf", is_flag=True, hidden=True, help="print the BPF C source and flags, then exit"),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _check_attach_args(use_tc, direction):
    if not use_tc and direction != "ingress":
        fail("--direction needs --tc (XDP sees ingress only)", EXIT_USAGE)


def _stale_policy(force: bool):
    """--force-detach: remove; interactive terminal: ask; otherwise: refuse with the hint."""
    if force:
        return "detach"
    if sys.stdin.isatty() and sys.stderr.isatty():
        def ask(lo) -> bool:
            return click.confirm(f"{lo.iface} has a stale skewscope program ({lo.describe()}) left by a run that "
                                 "did not exit cleanly. Remove it and continue?", default=False, err=True)
        return ask
    return "error"


def _print_ebpf(sample_n, max_flows):
    """The C source and the exact flags it would be compiled with (bcc tools' --ebpf)."""
    from skewscope.bpf.loader import SOURCE, Config, kernel_at_least  # heavy (numpy): not loaded by --help
    cfg = Config(sample_n=sample_n, max_flows=max_flows)
    note = ""
    if os.geteuid() != 0:     # frags support is probed with a BPF load, which needs root
        cfg.xdp_frags = kernel_at_least(5, 18)
        note = "  (not root: XDP frags support guessed from the kernel version, not probed)"
    click.echo("// cflags: " + " ".join(cfg.cflags()) + note)
    click.echo(SOURCE.read_text())


def _session(iface, use_tc, direction, xdp_mode, sample_n, max_flows, force_detach, source):
    from skewscope.sources.live import LiveSession  # heavy (numpy): not loaded by --help
    return LiveSession(iface, mode="tc" if use_tc else "xdp", xdp_mode=xdp_mode, direction=direction,
                       sample_n=sample_n, max_flows=max_flows, on_stale=_stale_policy(force_detach), source=source)


# ---- top ---------------------------------------------------------------------------------------
@click.command(epilog=TOP_EPILOG)
@_attach_options
@click.option("--rows", type=click.IntRange(0, 100000), default=None,
              help="flows shown per refresh (default: fit the terminal; 20 in plain output; 0 = all)")
@click.option("--window", type=click.FloatRange(1, 3600), default=10.0, show_default=True,
              help="seconds of traffic the collectives/findings panels analyse")
@click.option("--sort", type=click.Choice(["rate", "pps", "ce", "cnp", "retx", "nak", "src", "dst"]),
              default="rate", show_default=True, help="initial sort column (rate = bit/s)")
@click.option("--filter", "ip_filter", metavar="IP", help="show only flows whose src or dst contains IP")
@click.option("--no-analysis", is_flag=True, help="no collectives/findings (lightest)")
@click.option("--plain", is_flag=True, help="plain periodic tables even on a terminal")
@click.option("--matrix", "matrix", is_flag=True,
              help="start in the node x node traffic matrix view (key m toggles); plain output prints "
                   "the matrix (data bit/s, row = source, column = destination) instead of the flow table")
@click.argument("interval", type=click.FloatRange(0.1, 3600), default=1.0, required=False)
@click.argument("count", type=click.IntRange(1), required=False)
@enrich_options
@friendly_errors
def top(iface, use_tc, direction, xdp_mode, sample_n, max_flows, force_detach, ebpf, rows, window, sort, ip_filter,
        no_analysis, plain, matrix, interval, count, enricher):
    """Live, top-like view of every RoCE flow (QP) seen on IFACE: rates, message sizes,
    ECN/CNP, retransmits, NAKs, detected collectives and findings. Refreshes every INTERVAL
    seconds (default 1); with COUNT, or when stdout is not a terminal, prints COUNT plain
    tables (forever without COUNT) instead of the full-screen view."""
    from skewscope.live import top as T  # heavy (numpy): not loaded by --help
    from skewscope.live.loop import Attached  # heavy (numpy): not loaded by --help
    from skewscope.outputs import topview as V  # heavy (numpy): not loaded by --help
    if ebpf:
        _print_ebpf(sample_n, max_flows)
        return
    _check_attach_args(use_tc, direction)
    st = V.ViewState()
    st.sort = {"rate": 0, "pps": 1, "ce": 2, "cnp": 3, "retx": 4, "nak": 5, "src": 6, "dst": 7}[sort]
    st.filter = ip_filter or ""
    st.matrix = matrix
    st.names = enricher.names() if enricher else {}
    tty = sys.stdout.isatty() and sys.stdin.isatty() and count is None and not plain
    analyze = None if no_analysis else "auto"
    sess = _session(iface, use_tc, direction, xdp_mode, sample_n, max_flows, force_detach, "live")
    with Attached(sess) as att:       # Ctrl-C is how one leaves top: normal exit
        att.open()
        if sess.removed_leftover is not None:
            click.echo(f"removed stale {sess.removed_leftover.describe()} from {iface}", err=True)
        if tty:
            T.run_tty(sess, interval, rows=rows or 0, window=window, state=st, analyze=analyze,
                      enrich=enricher or None)
        else:
            click.echo(sess.startup_line())
            sys.stdout.flush()
            T.run_plain(sess, interval, count, rows=20 if rows is None else rows, window=window, state=st,
                        analyze=analyze, enrich=enricher or None)
    if sess.t0_mono_ns:
        click.echo(f"Detached skewscope from {iface}.", err=not tty)
    if att.code:
        sys.exit(att.code)


# ---- capture -----------------------------------------------------------------------------------
@click.command(epilog=CAPTURE_EPILOG)
@_attach_options
@click.option("--duration", "-d", type=Duration(), required=True, help="how long: 30, 30s, 500ms, 2m")
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True, help="snapshot to write (.snap)")
@click.option("--pcap-out", type=click.Path(dir_okay=False), metavar="FILE.pcap",
              help="also save the RoCE/PFC frames seen, truncated to --pcap-snaplen bytes (original length kept)")
@click.option("--pcap-snaplen", type=click.IntRange(64, 65535), default=128, show_default=True)
@click.option("--pcap-max-mb", type=click.IntRange(1, 1 << 20), default=1024, show_default=True,
              help="stop writing the pcap beyond this size (frames beyond are counted)")
@click.option("--json", "as_json", is_flag=True, help="print the report as JSON")
@click.option("--top", "top_n", type=click.IntRange(1, 100000), default=20, show_default=True,
              help="flows in the printed report")
@click.option("-q", "--quiet", is_flag=True, help="no progress bar and no report")
@click.option("--html", "html_out", type=click.Path(dir_okay=False), metavar="OUT.html",
              help="also write the report as one self-contained HTML page (docs/html.md)")
@enrich_options
@friendly_errors
def capture(iface, use_tc, direction, xdp_mode, sample_n, max_flows, force_detach, ebpf, duration, output, pcap_out,
            pcap_snaplen, pcap_max_mb, as_json, top_n, quiet, html_out, enricher):
    """Capture RoCE accounting on IFACE for DURATION into a snapshot file (written
    atomically), then print the report. Ctrl-C ends the capture early and still saves it.
    `skewscope report FILE.snap` reads it later without root."""
    from skewscope.core import layout as L  # heavy (numpy): not loaded by --help
    from skewscope.outputs import html as H  # heavy (numpy): not loaded by --help
    from skewscope.outputs import report as R  # heavy (numpy): not loaded by --help
    from skewscope.sources.live import Terminated  # heavy (numpy): not loaded by --help
    from skewscope.sources.live import capture as run  # heavy (numpy): not loaded by --help
    if ebpf:
        _print_ebpf(sample_n, max_flows)
        return
    _check_attach_args(use_tc, direction)
    for path, what in ((output, "-o"), (pcap_out, "--pcap-out")):
        if path:
            d = os.path.dirname(os.path.abspath(path))
            if not os.path.isdir(d):
                fail(f"{what} {path}: directory {d} does not exist", EXIT_USAGE)
            if os.path.isdir(path):
                fail(f"{what} {path} is a directory", EXIT_USAGE)
    if pcap_out and os.path.abspath(pcap_out) == os.path.abspath(output):
        fail("-o and --pcap-out name the same file", EXIT_USAGE)
    if html_out:
        H.check_output(html_out)

    show_progress = not quiet and sys.stderr.isatty()
    bar = {}

    def attached(sess):
        if sess.removed_leftover is not None:
            click.echo(f"removed stale {sess.removed_leftover.describe()} from {iface}", err=True)
        click.echo(f"Capturing RoCE for {duration:g} s: {sess.describe()} -> {output}"
                   + (f" (+ {pcap_out})" if pcap_out else "") + ". Ctrl-C ends early.", err=True)
        if show_progress:
            from rich.console import Console  # heavy (rich): only when drawing
            from rich.progress import (  # heavy (rich): only when drawing
                BarColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
            )
            p = Progress(TextColumn("[bold]capturing"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                         TimeRemainingColumn(), TextColumn("{task.fields[info]}"), console=Console(stderr=True),
                         transient=True)
            p.start()
            bar["p"] = p
            bar["t"] = p.add_task("cap", total=duration, info="")

    def progress(elapsed, total, glob):
        if "p" in bar:
            bar["p"].update(bar["t"], completed=elapsed,
                            info=f"frames {int(glob[L.G_FRAMES])}  RoCE {int(glob[L.G_ACCOUNTED])}")

    try:
        snap = run(iface, duration, mode="tc" if use_tc else "xdp", xdp_mode=xdp_mode, direction=direction,
                   sample_n=sample_n, max_flows=max_flows, progress=progress, on_stale=_stale_policy(force_detach),
                   pcap_out=pcap_out, pcap_snaplen=pcap_snaplen, pcap_max_bytes=pcap_max_mb << 20,
                   on_attached=attached)
    except Terminated as e:
        if "p" in bar:
            bar["p"].stop()
        fail(f"terminated by {signal.Signals(e.signum).name}; nothing written, nothing left attached",
             128 + e.signum)
    finally:
        if "p" in bar:
            bar["p"].stop()
    snap.save(output)
    m = snap.meta
    msg = (f"wrote {output}: {len(snap.flows)} flows, {len(snap.events)} message records, "
           f"{int(snap.globals[L.G_ACCOUNTED])} RoCE of {int(snap.globals[L.G_FRAMES])} frames "
           f"in {m['duration_s']:.1f} s")
    if m.get("interrupted"):
        msg += f" (interrupted; {m['requested_duration_s']:g} s requested)"
    click.echo(msg, err=True)
    warn = []
    if m.get("flows_evicted"):
        warn.append(f"{m['flows_evicted']} flows evicted (table full: raise --max-flows)")
    if m.get("events_lost") or m.get("events_dropped"):
        warn.append(f"{int(m.get('events_lost', 0)) + int(m.get('events_dropped', 0))} message records lost")
    if m.get("pcap"):
        p = m["pcap"]
        s = f"wrote {pcap_out}: {p['frames'] - p['frames_not_written']} frames (first {p['snaplen']} bytes each)"
        if p["kernel_drops"]:
            s += f"; {p['kernel_drops']} dropped by the kernel (ring full)"
        if p["frames_not_written"]:
            s += f"; {p['frames_not_written']} not written (--pcap-max-mb reached)"
        click.echo(s, err=True)
    if int(snap.globals[L.G_ACCOUNTED]) == 0 and not m.get("stopped_early"):
        other = int(snap.globals[L.G_FRAMES])
        warn.append(f"no RoCE frame seen on {iface} ({other} other frame{'s' if other != 1 else ''}): is it the "
                    "interface the RoCE copies reach ('skewscope mirror list')? XDP sees ingress only "
                    "('--tc --direction both' sees both)")
    for w in warn:
        click.echo(f"warning: {w}", err=True)
    if m.get("stopped_early"):
        # what was counted until then is saved above; the run was still cut short
        fail(f"{m['stopped_early']}; saved what was counted until then to {output}", EXIT_NO_IFACE)
    if quiet and not html_out:
        return
    try:
        from skewscope.analysis import analyze  # heavy (numba): only when a report is printed
        analysis = enricher(analyze(snap), meta=snap.meta)
    except Exception as e:  # the snapshot is saved; a failing analysis must not hide it
        click.echo(f"warning: analysis failed ({type(e).__name__}: {e}); report without findings", err=True)
        analysis = None
    if html_out:
        click.echo(f"wrote {html_out} ({H.write(html_out, snap, analysis) / 1024:.0f} KiB)", err=True)
    if quiet:
        return
    if as_json:
        click.echo(R.to_json(snap, analysis))
    else:
        R.human(snap, analysis, top=top_n, console=report_console())


def report_console():
    """The report's console: the terminal's width on a terminal; into a file or a pipe, wide
    enough that addresses and QPs are never cut (rich would assume 80 columns)."""
    from rich.console import Console  # heavy (rich): only when drawing
    return Console() if sys.stdout.isatty() else Console(width=160)
