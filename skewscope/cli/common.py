"""What every command shares: one-line errors with exit codes, loading a source file."""
from __future__ import annotations

import atexit
import functools
import gc
import os
import stat
import sys

import click

from skewscope.core.errors import EXIT_INTERRUPTED, EXIT_NOT_RUN, SkewscopeError


#: cli.main turned the cyclic garbage collector off for this process's start-up (pause_gc)
_gc_paused = False


def pause_gc() -> None:
    """Start-up (imports: numpy, the analysis, the reader) leaves ~30k objects that live as long
    as the process; the collector ran ~60 times while they were made (and over the whole heap
    once more at exit) and freed nothing: ~7 % of the instructions of `report --json` on a
    small capture (tools/bench/bench_startup.py --instructions).
    cli.main calls this for the process's own command line only: an in-process caller (a
    test's CliRunner) keeps its own collector as it was."""
    global _gc_paused
    if gc.isenabled():
        gc.disable()
        _gc_paused = True


def startup_done() -> None:
    """The command's imports are done: what start-up made is moved out of the collector's
    scans for good (gc.freeze) and the collector is on again for the work. No-op unless
    pause_gc turned it off; called by cli.main for every command that does not call it
    itself once its heavy imports are done (cli.OWN_STARTUP)."""
    global _gc_paused
    if _gc_paused:
        _gc_paused = False
        gc.freeze()
        gc.enable()


#: glibc mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: allocations up to this size come from the heap (glibc's default: 128 KiB, raised to the
#: largest block freed so far, up to 32 MiB); larger ones (a flow table of millions of flows)
#: are mapped and unmapped on their own, as before
REUSE_BELOW = 64 << 20


def reuse_freed_memory() -> None:
    """Keep the memory a command frees for its later allocations (glibc's malloc; elsewhere
    nothing changes). A page the process touches for the first time costs a page fault
    (~1.6 us here, the 4 KiB zeroed included: 38 MB of fresh arrays filled in 15 ms, the same
    arrays filled again in 1.7 ms): the analysis of a 10.6 M-frame `report --json` touched
    ~9,000 fresh pages although the reader had freed more than that just before -- glibc gave
    it back to the kernel (blocks above its mmap threshold are unmapped when freed; the
    heap's free top is trimmed). With the threshold at REUSE_BELOW and no trimming, the
    analysis and the JSON take the reader's freed, already mapped pages: 9,000 -> ~1,200 page
    faults, analyze() 55.6 -> 38.4 ms, to_json 8.1 -> 6.4 ms (medians of 9, in process); the
    reader's own ~22,000 unchanged. Results are the same: only where the bytes live changes. cli.main
    calls it for report and diagnose as the process's own command line (short-lived: what
    they keep is freed at exit); a long-running command keeps glibc's trimming. A user's own
    malloc settings (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_, GLIBC_TUNABLES) win."""
    env = os.environ
    if "MALLOC_MMAP_THRESHOLD_" in env or "MALLOC_TRIM_THRESHOLD_" in env or "malloc" in env.get("GLIBC_TUNABLES", ""):
        return
    try:
        import ctypes  # numpy imports it anyway (numpy._core._internal): no extra cost
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):   # no C library symbol of that name (not glibc/musl)
        return
    mallopt(_M_MMAP_THRESHOLD, REUSE_BELOW)
    mallopt(_M_TRIM_THRESHOLD, 1 << 30)


def exit_now(code) -> None:
    """End the process with `code` (sys.exit's argument) without the interpreter's teardown:
    freeing every module, class and array one by one is ~5 ms of a small `report --json`'s
    ~150 ms, and nothing of it is output. What an exit must still do is done first: stdout and
    stderr flushed, the atexit callbacks run (weakref finalizers, logging, an attachment's detach).
    Returns, and the interpreter exits as usual, when that cannot be done the same way: a code
    that is not a number (sys.exit prints it), a thread the interpreter would wait for, a
    profiler or tracer that reports at exit (cProfile, coverage), `python -i`, or a failed flush
    (a closed pipe: the interpreter reports it as before). cli.main calls it for report and
    diagnose (cli.FAST_EXIT) run as the process's own command line (no args): code that must
    run after such a main() registers with atexit; an in-process caller passes args (CliRunner)."""
    if not (code is None or isinstance(code, int)) or sys.flags.interactive:
        return
    if sys.getprofile() is not None or sys.gettrace() is not None:
        return
    th = sys.modules.get("threading")
    if th is not None and any(t.is_alive() and not t.daemon for t in th.enumerate() if t is not th.main_thread()):
        return
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
        return
    os._exit(code or 0)


def fail(msg: str, code: int = EXIT_NOT_RUN) -> "NoReturn":  # noqa: F821
    click.echo(f"skewscope: {msg}", err=True)
    sys.exit(code)


def friendly_errors(fn):
    """Turn every expected failure into one line on stderr and a documented exit code."""

    @functools.wraps(fn)
    def wrapper(*a, **kw):
        try:
            return fn(*a, **kw)
        except SkewscopeError as e:
            fail(str(e), e.code)
        except KeyboardInterrupt:
            fail("interrupted", EXIT_INTERRUPTED)
        except BrokenPipeError:
            try:
                sys.stdout = open(os.devnull, "w")
            except OSError:
                pass
            sys.exit(0)
        except OSError as e:
            fail(f"{e.filename + ': ' if getattr(e, 'filename', None) else ''}{e.strerror or e}", EXIT_NOT_RUN)

    return wrapper


def load_source(path: str, progress: bool = False, max_flows: int = 65536):
    """A .snap file, or a capture (pcap/pcapng, optionally gzip) through the offline parser.
    A capture damaged part-way is read up to the damage: the warning goes to stderr. Its
    reader's import ends the command's start-up (startup_done)."""
    from skewscope.core.snapshot import Snapshot, SnapshotError  # heavy (numpy): not loaded by --help
    if not os.path.exists(path):
        raise SnapshotError(f"{path}: no such file")
    if stat.S_ISREG(os.stat(path).st_mode):  # a pipe (/dev/stdin) cannot be peeked at twice
        with open(path, "rb") as fh:
            head = fh.read(4)
        if head[:2] == b"PK":
            startup_done()
            return Snapshot.load(path)
    from skewscope.sources import offline  # heavy (numba): only commands that read a capture
    startup_done()
    snap = offline.parse_file(path, progress=progress, max_flows=max_flows)
    for w in snap.meta.get("warnings", []):
        click.echo(f"skewscope: warning: {w}", err=True)
    return snap


def enrich_options(f):
    """--inventory (names for addresses) and --dcgm (GPU causes) on every command that shows
    findings; the command gets `enricher` (a telemetry.enrich.Enricher, falsy when nothing was
    asked). A bad inventory or DCGM scrape file fails here; a DCGM URL is read later, and
    when it cannot be, the causes say so (the findings still come out)."""
    @click.option("--inventory", "inventory_path", metavar="FILE",
                  help="name addresses: a CSV/TSV (header ip,host[,gpu,rank,job,pod,namespace,instance,rail]) "
                       "or YAML file, or a Prometheus URL[#METRIC] holding skewscope_inventory_info (or a "
                       "site's info metric) (docs/fleet.md \"Inventory\")")
    @click.option("--dcgm", "dcgm", metavar="URL|FILE", multiple=True,
                  help="GPU telemetry for the blamed nodes' cause: a Prometheus base URL, a dcgm-exporter "
                       "/metrics URL or a saved scrape (repeatable; joined through --inventory; "
                       "docs/fleet.md \"GPU telemetry (DCGM)\")")
    @functools.wraps(f)
    def wrapper(*a, inventory_path=None, dcgm=(), **kw):
        try:
            enricher = make_enricher(inventory_path, dcgm)
        except SkewscopeError as e:          # before any capture or attach: nothing to undo
            fail(str(e), e.code)
        return f(*a, enricher=enricher, **kw)
    return wrapper


def make_enricher(inventory_path: str | None = None, dcgm=()):
    """The Enricher of the options (one-line errors for a bad inventory or DCGM scrape file:
    SkewscopeError)."""
    from skewscope.telemetry.enrich import Enricher  # light: core + re
    inv = None
    if inventory_path:
        from skewscope.telemetry import promnames  # light (urllib); only when --inventory is given
        if promnames.is_url(inventory_path):
            inv = promnames.load(inventory_path)
        else:
            from skewscope.core.inventory import load  # light; only when --inventory is given
            inv = load(inventory_path)
    tel = None
    if isinstance(dcgm, str):
        dcgm = (dcgm,)
    if dcgm:
        from skewscope.telemetry.dcgm import open_source  # light (urllib); only with --dcgm
        tel = open_source(list(dcgm))
    return Enricher(inventory=inv, telemetry=tel)


def parse_thresholds(items) -> dict:
    """["KIND.NAME=VALUE", ...] -> {"KIND.NAME": "VALUE"} (one line, exit 3, for a malformed item)."""
    out = {}
    for it in items:
        if "=" not in it:
            fail(f"--threshold {it!r}: use KIND.NAME=VALUE (see diagnose --list-checks)", EXIT_NOT_RUN)
        k, v = it.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def threshold_option(f):
    """--threshold KIND.NAME=VALUE (repeatable) for the live analysis; the command gets
    `thresholds` ({} = the defaults), checked against the registry before anything starts."""
    @click.option("--threshold", "threshold_items", multiple=True, metavar="KIND.NAME=VALUE",
                  help="override a finding threshold in the live analysis (repeatable; diagnose --list-checks)")
    @functools.wraps(f)
    def wrapper(*a, threshold_items=(), **kw):
        th = parse_thresholds(threshold_items)
        if th:
            from skewscope.analysis.detectors import ThresholdError, resolve_thresholds  # heavy (numba)
            try:
                resolve_thresholds(th)
            except ThresholdError as e:
                fail(str(e), EXIT_NOT_RUN)
        return f(*a, thresholds=th, **kw)
    return wrapper
