"""skewscope's command line: the `main` group and the one explicit list of its commands.

Each command group lives in its own module of this package (files, live, mirror, demo,
diagnose, export, gen, watch); they import what they share from cli.common, never this
module, so there is no import cycle. A command's module is imported when that command runs
(`--help` imports them all, for their one-line help): `skewscope report` does not load the
exporter's HTTP server, the demo's fabric or the generator's CLI.
"""
from __future__ import annotations

import importlib
import os
import sys

# numpy's OpenBLAS starts a thread per CPU when numpy is imported, and those threads spin
# for a while: on 2 vCPUs that was 50 ms of every command's start and a busy second core
# while a capture is parsed (tools/bench/bench_startup.py). No command does linear algebra
# beyond a tiny least-squares fit, so one thread; a user's own setting wins. Set here,
# before any command module can import numpy.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import click

from skewscope import __version__
from skewscope.cli.common import exit_now, pause_gc, reuse_freed_memory, startup_done
from skewscope.core.errors import EXIT_INTERRUPTED, EXIT_NOT_RUN, EXIT_USAGE

EPILOG = """\b
Examples:
  skewscope top -i pf0hpf                 live view of every QP on a DPU representor
  skewscope capture -i eth1 --duration 30s -o run.snap
  skewscope report trace.pcap             offline report, no root needed
  skewscope diagnose run.snap --json      for runbooks: exit 0 ok, 1 warn, 2 critical
  skewscope replay trace.pcap -o k.snap   run a capture through the real BPF program
  skewscope gen moe-hot-expert -o t.pcap  generate NCCL-like traffic with ground truth
"""


class _Group(click.Group):
    """Click's own errors (usage, a command's ClickException) as one line on stderr with the
    documented exit codes: 2 usage, 3 could not run (click would print four lines and exit 1
    for a ClickException); Ctrl-C outside a command's own handling exits 130. Commands come
    from COMMANDS, each imported on first use."""

    _ran = None     # the command this group resolved (resolve_command): FAST_EXIT's test
    _own = False    # main() runs the process's own command line

    def list_commands(self, ctx):
        return sorted(set(COMMANDS) | set(self.commands))

    def get_command(self, ctx, name):
        if name not in OWN_STARTUP:
            startup_done()
        if self._own and name in FAST_EXIT:
            reuse_freed_memory()     # before the command's imports allocate (numpy, the reader)
        if name not in self.commands and name in COMMANDS:
            mod, attr = COMMANDS[name]
            self.add_command(getattr(importlib.import_module(f"skewscope.cli.{mod}"), attr), name)
        return self.commands.get(name)

    def resolve_command(self, ctx, args):
        name, cmd, rest = super().resolve_command(ctx, args)
        self._ran = name
        return name, cmd, rest

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        own = args is None      # the process's own command line: no collector during its start-up
        if own:
            pause_gc()
        self._ran = None
        self._own = own
        try:
            return self._main(args, prog_name, complete_var, standalone_mode, **extra)
        except SystemExit as e:
            if own and self._ran in FAST_EXIT:
                exit_now(e.code)    # returns when the interpreter's own exit is needed
            raise
        finally:
            self._own = False
            startup_done()

    def _main(self, args, prog_name, complete_var, standalone_mode, **extra):
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
            sys.exit(EXIT_INTERRUPTED)
        except Exception as e:  # a bug of ours: one line for the user, the traceback on request
            if os.environ.get("SKEWSCOPE_DEBUG"):
                raise
            import traceback  # only on this error path: not loaded by every command's start
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


#: the commands that end their own start-up (cli.common.startup_done, once their heavy imports
#: are done: the first result is mostly start-up); every other command runs with the collector on
OWN_STARTUP = frozenset({"report", "diagnose"})
#: the commands whose process ends without the interpreter's teardown (cli.common.exit_now): they
#: write their outputs whole before they return, start no thread that outlives them, and the
#: little they leave (an attachment's detach, bcc's cleanup) is an atexit callback; short-lived,
#: they also keep the memory they free for their own later allocations (cli.common.reuse_freed_memory)
FAST_EXIT = frozenset({"report", "diagnose"})

#: the one list of commands: name -> (module of this package, its click command)
COMMANDS = {
    "report": ("files", "report"), "replay": ("files", "replay"),     # files: no root for report
    "detach": ("files", "detach"),
    "top": ("live", "top"), "capture": ("live", "capture"),           # live: attach to an interface
    "diagnose": ("diagnose", "diagnose"),                             # runbooks: exit code = worst severity
    "watch": ("watch", "watch"),                                      # controllers: finding events, webhooks
    "export": ("export", "export"), "cluster": ("export", "cluster"),  # fleet: Prometheus exporter, fusion
    "mirror": ("mirror", "mirror"),                                   # tc mirred rules that feed a DPU netdev
    "mitigate": ("mitigate", "mitigate"),                             # guarded, reversible actions with a TTL
    "demo": ("demo", "demo"),                                         # namespace fabric + pathologies + top
    "gen": ("gen", "gen"),                                            # traffic generator with ground truth
}

if __name__ == "__main__":
    main()
