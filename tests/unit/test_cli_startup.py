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
