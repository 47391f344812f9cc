"""The CLI's error contract (README "Exit codes"): every error is one line on stderr with a
documented exit code, never click's four-line usage block or a traceback; every command's
--help ends with examples and its exit codes."""
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from skewscope.cli import main

REAL = Path(__file__).resolve().parents[3] / "shared" / "data" / "real"


def run(*args):
    """The installed entry point in a subprocess: stderr separate, click's real main()."""
    p = subprocess.run([sys.executable, "-c", "from skewscope.cli import main; main(prog_name='skewscope')",
                       *args], capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout, p.stderr


@pytest.mark.parametrize("args,code,msg", [
    (["report"], 2, "Missing argument 'FILE'"),
    (["report", "/tmp", "--json"], 2, "is a directory"),
    (["report", "x.pcap", "--top", "0"], 2, "--top"),
    (["report", "--bogus", "x"], 2, "No such option"),
    (["bogus-command"], 2, "No such command"),
    (["replay", "x.pcap"], 2, "Missing option"),
    (["gen"], 2, "give a preset name"),
    (["diagnose", "--bogus"], 3, "No such option"),     # diagnose: 2 means critical
    (["report", "/nonexistent.pcap"], 3, "no such file"),
    (["report", "/etc/passwd"], 3, "not a pcap"),
    (["diagnose", "x.pcap", "--dcgm", "/etc/passwd"], 3, "--dcgm /etc/passwd: not a Prometheus text exposition"),
    (["report", "x.pcap", "--dcgm", "/nonexistent.prom"], 3, "--dcgm /nonexistent.prom: cannot read"),
])
def test_errors_are_one_line_with_documented_code(args, code, msg):
    rc, out, err = run(*args)
    assert rc == code, (args, rc, err)
    assert msg in err
    assert err.startswith("skewscope"), err
    assert err.strip().count("\n") == 0, err
    assert "Traceback" not in err and "Usage:" not in err


def test_gen_write_failure_is_exit_3_one_line(tmp_path):
    rc, out, err = run("gen", "ring-healthy", "-o", str(tmp_path / "nope" / "x.pcap"))
    assert rc == 3 and err.startswith("skewscope") and err.strip().count("\n") == 0, (rc, err)
    assert "does not exist" in err


def test_replay_output_directory_checked_before_the_replay(tmp_path):
    r = CliRunner().invoke(main, ["replay", "/nonexistent.pcap", "-o", str(tmp_path / "nope" / "k.snap")])
    assert r.exit_code == 2 and "does not exist" in r.output and "nope" in r.output


def test_bare_group_shows_help_exit_2():
    rc, out, err = run()
    assert rc == 2 and "Commands:" in (out + err)


def test_help_and_version_exit_0():
    for args in (["--help"], ["--version"], ["report", "--help"]):
        rc, out, err = run(*args)
        assert rc == 0 and out and not err, args


@pytest.mark.parametrize("cmd", ["report", "replay", "detach", "top", "capture", "diagnose", "export",
                                 "cluster", "mirror", "demo"])
def test_help_has_examples_and_exit_codes(cmd):
    r = CliRunner().invoke(main, [cmd, "--help"])
    assert r.exit_code == 0
    assert "Examples:" in r.output and "Exit codes" in r.output, cmd


@pytest.mark.skipif(not REAL.is_dir(), reason="../shared/data/real not present")
def test_erf_capture_refused_one_line_exit_3():
    rc, out, err = run("report", str(REAL / "srinivaskoritala_rdma-softroce-demo__infiniband_ERF_nativeIB.pcap"))
    assert rc == 3 and "link type 197" in err and err.strip().count("\n") == 0
