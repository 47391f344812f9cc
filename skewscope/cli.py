"""skewscope command line. Each command lives in its own module where it is large; this
module holds the group, the error handling shared by all commands and the small ones."""
from __future__ import annotations

import functools
import os
import stat
import sys

import click

from . import __version__

# Exit codes (README "Exit codes"): 0 ok; 1 diagnose warnings; 2 usage error / diagnose
# critical; 3 could not run; 4 not root / no CAP_BPF; 5 bcc missing; 6 no such interface;
# 7 interface busy (another XDP program); 8 kernel refused (compile/verify/attach).
EXIT_USAGE = 2
EXIT_NOT_RUN = 3

EPILOG = """\b
Examples:
  skewscope top -i pf0hpf                 live view of every QP on a DPU representor
  skewscope capture -i eth1 --duration 30s -o run.snap
  skewscope report trace.pcap             offline report, no root needed
  skewscope diagnose run.snap --json      for runbooks: exit 0 ok, 1 warn, 2 critical
  skewscope replay trace.pcap -o k.snap   run a capture through the real BPF program
  skewscope gen moe-hot-expert -o t.pcap  generate NCCL-like traffic with ground truth
"""


REPORT_EPILOG = """\b
Examples:
  skewscope report trace.pcap                     table of the top flows + findings
  skewscope report trace.pcapng.gz --json         the stable JSON document (README "Counters")
  skewscope report run.snap --top 50              a snapshot from capture/replay
  tcpdump -i eth1 -s 128 -w - udp port 4791 | skewscope report /dev/stdin
\b
Columns: README "Report columns"; real output: docs/examples/report_offline_example.txt.
Exit codes: 0 ok (a capture damaged part-way too: one warning line); 2 usage; 3 unreadable,
unsupported or invalid file.
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
  sudo skewscope detach -i pf0hpf                 after a run killed with SIGKILL
\b
Exit codes: 0 ok (also: nothing to remove); 2 usage; 4 not root; 6 no such interface;
7 the program is in use by a running skewscope (stop that run, or --force).
"""


def fail(msg: str, code: int = EXIT_NOT_RUN) -> "NoReturn":  # noqa: F821
    click.echo(f"skewscope: {msg}", err=True)
    sys.exit(code)


def friendly_errors(fn):
    """Turn every expected failure into one line on stderr and a documented exit code."""

    @functools.wraps(fn)
    def wrapper(*a, **kw):
        from .dataplane import DataplaneError
        from .pcapfile import PcapError
        from .snapshot import SnapshotError
        try:
            return fn(*a, **kw)
        except DataplaneError as e:
            fail(str(e), e.code)
        except (PcapError, SnapshotError) as e:
            fail(str(e), EXIT_NOT_RUN)
        except KeyboardInterrupt:
            fail("interrupted", 130)
        except BrokenPipeError:
            try:
                sys.stdout = open(os.devnull, "w")
            except OSError:
                pass
            sys.exit(0)
        except OSError as e:
            fail(f"{e.filename + ': ' if getattr(e, 'filename', None) else ''}{e.strerror or e}", EXIT_NOT_RUN)

    return wrapper


class _Group(click.Group):
    """Click's own errors (usage, a command's ClickException) as one line on stderr with the
    documented exit codes: 2 usage, 3 could not run (click would print four lines and exit 1
    for a ClickException); Ctrl-C outside a command's own handling exits 130."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.UsageError as e:
            if type(e).__name__ == "NoArgsIsHelpError":  # bare `skewscope` / `skewscope mirror`
                click.echo(e.format_message(), err=True)
                sys.exit(EXIT_USAGE)
            path = e.ctx.command_path if e.ctx is not None else "skewscope"
            click.echo(f"{path}: {e.format_message()} (see '{path} --help')", err=True)
            sys.exit(EXIT_USAGE)
        except click.ClickException as e:
            path = "skewscope"
            ctx = click.get_current_context(silent=True)
            if ctx is not None:
                path = ctx.command_path
            click.echo(f"{path}: {e.format_message()}", err=True)
            sys.exit(EXIT_NOT_RUN)
        except click.Abort:
            click.echo("skewscope: interrupted", err=True)
            sys.exit(130)
        except Exception as e:  # a bug of ours: one line for the user, the traceback on request
            if os.environ.get("SKEWSCOPE_DEBUG"):
                raise
            import traceback
            tb = traceback.extract_tb(e.__traceback__)
            where = f" at {os.path.basename(tb[-1].filename)}:{tb[-1].lineno}" if tb else ""
            click.echo(f"skewscope: internal error: {type(e).__name__}: {e}{where} (a bug: please report it; "
                       "SKEWSCOPE_DEBUG=1 shows the traceback)", err=True)
            sys.exit(EXIT_NOT_RUN)
        # standalone_mode=False returns ctx.exit(n)'s code, or the command's return value
        sys.exit(rv if isinstance(rv, int) and not isinstance(rv, bool) else 0)


@click.group(cls=_Group, epilog=EPILOG,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, "-V", "--version", prog_name="skewscope")
def main():
    """Find skews, imbalances and pathologies in RoCEv2 traffic of multi-GPU LLM jobs,
    from a DPU or any mirror port, with eBPF."""


def load_source(path: str, progress: bool = False, max_flows: int = 65536):
    """A .snap file, or a capture (pcap/pcapng, optionally gzip) through the offline parser.
    A capture damaged part-way is read up to the damage: the warning goes to stderr."""
    from .snapshot import Snapshot
    if not os.path.exists(path):
        from .snapshot import SnapshotError
        raise SnapshotError(f"{path}: no such file")
    if stat.S_ISREG(os.stat(path).st_mode):  # a pipe (/dev/stdin) cannot be peeked at twice
        with open(path, "rb") as fh:
            head = fh.read(4)
        if head[:2] == b"PK":
            return Snapshot.load(path)
    from . import offline
    snap = offline.parse_file(path, progress=progress, max_flows=max_flows)
    for w in snap.meta.get("warnings", []):
        click.echo(f"skewscope: warning: {w}", err=True)
    return snap


def analyze(snap, thresholds=None, checks=None):
    try:
        from . import analysis
    except ImportError:
        return None
    return analysis.analyze(snap, thresholds=thresholds, checks=checks)


@main.command(epilog=REPLAY_EPILOG)
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
    from . import report as R
    from .replay import replay as run
    d = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(d):  # before the replay, not after it (and not the temp file's name)
        fail(f"-o {output}: directory {d} does not exist", EXIT_USAGE)
    snap = run(file, entry=entry, max_flows=max_flows)
    snap.save(output)
    if as_json:
        click.echo(R.to_json(snap, analyze(snap)))
    else:
        m = snap.meta
        click.echo(f"replayed {m['frames']} frames through {entry} -> {output} "
                   f"({len(snap.flows)} flows, {len(snap.events)} message records"
                   + (f"; {m['padded_records']} snaplen-cut records padded to original length" if m["padded_records"]
                      else "") + ")")


@main.command(epilog=REPORT_EPILOG)
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="print the stable JSON document")
@click.option("--top", type=click.IntRange(1, 100000), default=20, show_default=True, help="flows in the table")
@click.option("--max-flows", type=click.IntRange(16, 1 << 24), default=65536, show_default=True,
              help="captures: flow table size (least recently used flows are evicted beyond it)")
@friendly_errors
def report(file, as_json, top, max_flows):
    """Report on a snapshot (.snap) or a capture (pcap/pcapng, .gz too). No root needed."""
    from . import report as R
    snap = load_source(file, progress=sys.stderr.isatty(), max_flows=max_flows)
    analysis = analyze(snap)
    if as_json:
        click.echo(R.to_json(snap, analysis))
    else:
        R.human(snap, analysis, top=top)


@main.command(epilog=DETACH_EPILOG)
@click.option("-i", "--interface", "iface", required=True, help="interface to clean")
@click.option("--force", is_flag=True, help="remove even a program a running skewscope still uses")
@friendly_errors
def detach(iface, force):
    """Remove skewscope's own XDP/TC programs from an interface (after a crash). Programs
    that are not skewscope's are never touched, nor (without --force) one that a running
    skewscope (top, capture, export) still uses."""
    from .dataplane import EXIT_BUSY, check_privileges, detach_ours, ifindex
    check_privileges()
    ifindex(iface)  # one clear line when it does not exist
    if not force:
        from .live import find_leftover
        lo = find_leftover(iface)
        if lo is not None and lo.holders:
            who = ", ".join(f"{c} (pid {p})" for p, c in lo.holders)
            fail(f"{iface}: {lo.describe()} is in use by {who}; stop that run (or use --force)", EXIT_BUSY)
    removed = detach_ours(iface)
    parts = []
    if removed["xdp"]:
        parts.append(f"XDP program id {removed['xdp']}")
    parts += [f"TC {d} filter (prio {p})" for d, p, _ in removed["tc"]]
    click.echo(f"{iface}: removed " + ", ".join(parts) if parts else f"{iface}: no skewscope program attached")


def _register_optional():
    """Commands that live in their own modules (added as they are built)."""
    import importlib
    for mod, attr in (("skewgen.cli", "gen"), ("skewscope.cmd_live", "top"), ("skewscope.cmd_live", "capture"),
                      ("skewscope.cmd_mirror", "mirror"), ("skewscope.cmd_demo", "demo"),
                      ("skewscope.cmd_diagnose", "diagnose"), ("skewscope.cmd_export", "export"),
                      ("skewscope.cmd_export", "cluster")):
        try:
            m = importlib.import_module(mod)
        except ImportError as e:
            if e.name and (e.name == mod or mod.startswith(e.name)):
                continue
            raise
        cmd = getattr(m, attr, None)
        if cmd is not None:
            main.add_command(cmd)


_register_optional()

if __name__ == "__main__":
    main()
