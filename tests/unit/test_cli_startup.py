"""The CLI's start-up without the cyclic garbage collector (cli.common.pause_gc/startup_done):
only for the process's own command line, back on (start-up frozen) before the work, and the
document is the same as with the collector untouched."""
import gc
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from skewscope.cli import main

REAL = Path(__file__).resolve().parents[3] / "shared" / "data" / "real"
CAPTURE = REAL / "softroce_ring__vm1.pcap.gz"

#: the child: the real entry point (main reads sys.argv), with a spy on the command's callback
#: and on the capture reader that prints the collector's state as JSON lines on stderr
CHILD = """
import gc, json, sys
import skewscope.cli as cli
from skewscope.sources import offline
def state(where):
    print(json.dumps([where, gc.isenabled(), gc.get_freeze_count() > 0]), file=sys.stderr)
cmd = cli.main.get_command(None, sys.argv[1])
inner = cmd.callback
def callback(*a, **kw):
    state("command")
    return inner(*a, **kw)
cmd.callback = callback
parse = offline.parse_file
def parse_file(*a, **kw):
    state("parse")
    return parse(*a, **kw)
offline.parse_file = parse_file
if gc.get_freeze_count():
    sys.exit("frozen before main")
cli.main(prog_name="skewscope")
"""


def _timeless(doc: str) -> str:
    """The document's text without meta.parse_seconds (the reader's own timing)."""
    return re.sub(r'"parse_seconds": [0-9.e-]+', '"parse_seconds": null', doc)


def child(*args):
    p = subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True, text=True, timeout=120)
    states = [json.loads(ln) for ln in p.stderr.splitlines() if ln.startswith("[")]
    return p.returncode, p.stdout, states


@pytest.mark.skipif(not CAPTURE.exists(), reason="../shared/data/real not present")
@pytest.mark.parametrize("cmd", ["report", "diagnose"])
def test_collector_off_for_start_up_on_for_the_work(cmd):
    rc, out, states = child(cmd, "--json", str(CAPTURE))
    assert rc in (0, 1, 2), (rc, states)
    # the command starts without the collector; it is on again, start-up frozen, when the capture is read
    assert states == [["command", False, False], ["parse", True, True]], states
    r = CliRunner().invoke(main, [cmd, "--json", str(CAPTURE)])   # the collector untouched
    assert _timeless(r.stdout) == _timeless(out)


def test_other_commands_run_with_the_collector_on(tmp_path):
    rc, out, states = child("gen", "--list-presets")
    assert rc == 0 and "ring-healthy" in out
    assert states == [["command", True, True]], states


@pytest.mark.skipif(not CAPTURE.exists(), reason="../shared/data/real not present")
def test_an_in_process_caller_keeps_its_collector():
    before = (gc.isenabled(), gc.get_freeze_count())
    r = CliRunner().invoke(main, ["report", "--json", str(CAPTURE)])
    assert r.exit_code == 0, r.output
    assert (gc.isenabled(), gc.get_freeze_count()) == before
    gc.disable()
    try:
        r = CliRunner().invoke(main, ["report", "--json", str(CAPTURE)])
        assert r.exit_code == 0 and not gc.isenabled()      # a caller's own "off" stays off
    finally:
        gc.enable()


#: the child for the exit: the real entry point and an atexit callback that writes a line; the
#: interpreter's teardown shows in `python -v`'s "# cleanup" lines. argv[1] "thread": a
#: non-daemon thread still running when the command returns
EXIT_CHILD = """
import atexit, sys, threading, time
import skewscope.cli as cli
atexit.register(lambda: print("atexit", file=sys.stderr, flush=True))
if sys.argv[1] == "thread":
    threading.Thread(target=time.sleep, args=(1.0,)).start()
sys.argv[1:2] = []
cli.main(prog_name="skewscope")
"""


def exit_child(mode, *args):
    """(exit code, stdout, ["atexit"] if the callback ran + ["teardown"] if the interpreter tore down)."""
    p = subprocess.run([sys.executable, "-v", "-c", EXIT_CHILD, mode, *args], capture_output=True, text=True,
                       timeout=120)
    err = p.stderr.splitlines()
    return (p.returncode, p.stdout, ["atexit"] * ("atexit" in err)
            + ["teardown"] * any(ln.startswith("# cleanup") for ln in err))


@pytest.mark.skipif(not REAL.exists(), reason="../shared/data/real not present")
@pytest.mark.parametrize("cmd", ["report", "diagnose"])
def test_report_and_diagnose_end_without_the_teardown(cmd):
    """Run as the process's command line they end after flushing and the atexit callbacks,
    without the interpreter's teardown: the whole document, the exit code of an in-process
    run (diagnose: the findings' severity), the atexit line, no teardown."""
    path = REAL / "softroce_ring__mirror.pcap.gz"
    rc, out, lines = exit_child("own", cmd, "--json", str(path))
    r = CliRunner().invoke(main, [cmd, "--json", str(path)])
    assert (rc, _timeless(out)) == (r.exit_code, _timeless(r.stdout))
    assert lines == ["atexit"], lines
    if cmd == "diagnose":
        assert rc == json.loads(out)["exit_code"] == 2   # critical findings: exit 2


def test_the_interpreter_exits_as_usual_otherwise(tmp_path):
    """Another command, a thread still running: the interpreter's own exit (teardown); the
    exit codes are the same either way (a usage error ends fast, with click's 2)."""
    rc, out, lines = exit_child("own", "gen", "--list-presets")
    assert rc == 0 and "ring-healthy" in out and lines == ["atexit", "teardown"]
    rc, out, lines = exit_child("thread", "report", "--json", str(tmp_path / "none.pcap"))
    assert rc == 3 and lines == ["atexit", "teardown"]         # no such file: exit 3, after the thread
    rc, out, lines = exit_child("own", "report", "--json", str(tmp_path / "none.pcap"))
    assert rc == 3 and lines == ["atexit"]
    rc, out, lines = exit_child("own", "report", "--no-such-option")
    assert rc == 2 and lines == ["atexit"]


#: the child for the allocator: the real entry point, with mallopt recorded (reuse_freed_memory)
MALLOPT_CHILD = """
import ctypes, json, sys
calls = []
class Libc:
    def __init__(self, real):
        self.real = real
    def __getattr__(self, name):
        if name != "mallopt":
            return getattr(self.real, name)
        def mallopt(param, value):
            calls.append([param, value])
            return self.real.mallopt(param, value)
        return mallopt
real_cdll = ctypes.CDLL
ctypes.CDLL = lambda name, *a, **kw: Libc(real_cdll(name, *a, **kw)) if name is None else real_cdll(name, *a, **kw)
import atexit
atexit.register(lambda: print(json.dumps(calls), file=sys.stderr, flush=True))
import skewscope.cli as cli
cli.main(prog_name="skewscope")
"""


def mallopt_child(*args, env=None):
    import os
    e = dict(os.environ)
    for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"):
        e.pop(k, None)
    e.update(env or {})
    p = subprocess.run([sys.executable, "-c", MALLOPT_CHILD, *args], capture_output=True, text=True, timeout=120,
                       env=e)
    return p.returncode, p.stdout, json.loads(p.stderr.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
@pytest.mark.skipif(not CAPTURE.exists(), reason="../shared/data/real not present")
def test_report_and_diagnose_keep_the_memory_they_free():
    """The process's own report/diagnose set glibc's mmap threshold and trimming once, before
    their imports (cli.common.reuse_freed_memory), and write the document an in-process run
    writes; other commands, and a user's own malloc settings, are left alone."""
    from skewscope.cli.common import REUSE_BELOW
    want = [[-3, REUSE_BELOW], [-1, 1 << 30]]
    for cmd in ("report", "diagnose"):
        rc, out, calls = mallopt_child(cmd, "--json", str(CAPTURE))
        assert calls == want, (cmd, calls)
        r = CliRunner().invoke(main, [cmd, "--json", str(CAPTURE)])
        assert (rc, _timeless(out)) == (r.exit_code, _timeless(r.stdout))
    rc, out, calls = mallopt_child("gen", "--list-presets")
    assert rc == 0 and calls == []
    for env in ({"MALLOC_TRIM_THRESHOLD_": "131072"}, {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=65536"}):
        rc, out, calls = mallopt_child("report", "--json", str(CAPTURE), env=env)
        assert rc == 0 and calls == [], env


def test_in_process_callers_keep_their_allocator(monkeypatch):
    from skewscope.cli import common
    called = []
    monkeypatch.setattr(common, "reuse_freed_memory", lambda: called.append(1))
    import skewscope.cli as cli
    monkeypatch.setattr(cli, "reuse_freed_memory", common.reuse_freed_memory)
    CliRunner().invoke(main, ["report", "--json", "/nonexistent.pcap"])
    assert called == []
