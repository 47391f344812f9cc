"""The flower backend's pieces that need no kernel: the cookie (skewscope's mark on a tc rule,
decoded against struct's own packing), the command lines, and the detached reaper (a real
process: its session, its parent, the descriptors it keeps). The tc side runs for real in
tests/kernel/test_mitigate_flower.py."""
from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import time

import pytest

from skewscope.mitigate import flower as FL
from skewscope.mitigate import reaper
from skewscope.mitigate.rules import Rule


def test_cookie_is_tag_id_deadline_flags_and_only_ours_parse():
    ck = FL.cookie(5, 1000.2, FL.FLAG_CREATED_CLSACT)
    assert bytes.fromhex(ck) == b"ssmt" + struct.pack(">III", 5, 1001, 1)      # deadline rounded up
    assert len(bytes.fromhex(ck)) == 16                                         # TC_COOKIE_MAX_SIZE
    assert FL.parse_cookie(ck) == (5, 1001, 1)
    assert FL.parse_cookie((b"ssmt" + struct.pack(">II", 7, 9)).hex()) == (7, 9, 0)   # no flags word
    for foreign in (None, "", "deadbeef", b"ssmt".hex(), (b"ssmx" + bytes(12)).hex(),
                    (b"ssmt" + bytes(12)).hex(), (b"ssmt" + bytes(13)).hex(), "73736d74zz" + "0" * 22):
        assert FL.parse_cookie(foreign) is None, foreign


def test_every_flower_action_carries_the_cookie_and_plan_commands_keep_their_shape():
    for r in (Rule("remark", src="10.0.0.1", dst="10.0.0.5", dscp=8), Rule("remark", src="fd00::1", dscp=8),
              Rule("police", dst="10.0.0.9", rate_bps=10e9)):
        qd, c = FL.commands(r, "pf0hpf", slot=3, rid=4, now=100.0)
        assert qd == ["qdisc", "add", "dev", "pf0hpf", "clsact"]
        assert c[:8] == ["filter", "add", "dev", "pf0hpf", "ingress", "prio", "49403", "protocol"]
        ck = FL.cookie(4, 100.0 + r.ttl)
        assert c.count("action") == c.count("cookie") and all(c[i + 1] == ck for i, x in enumerate(c) if x == "cookie")
        assert "skip_sw" in c
    body = FL.mirror_body("veth1")(Rule("remark", src="10.0.0.1", dst="10.0.0.2", dscp=8), "ab")
    assert body == ["u32", "match", "ip", "src", "10.0.0.1/32", "match", "ip", "dst", "10.0.0.2/32", "action",
                    "mirred", "egress", "mirror", "dev", "veth1", "cookie", "ab"]


def test_reap_argv_is_a_command_the_cli_accepts():
    from skewscope.cli import main
    argv = reaper.reap_argv("pf0hpf", "egress", "flower", "ns1")
    assert argv[:3] == [sys.executable, "-m", "skewscope.cli"]
    ctx = main.get_command(None, "mitigate").get_command(None, "reap").make_context("reap", argv[5:])
    assert (ctx.params["iface"], ctx.params["direction"], ctx.params["backend"], ctx.params["netns"]) == \
        ("pf0hpf", "egress", "flower", "ns1")
    assert reaper.unit_name("en p0/x", "ingress", 1234) == "skewscope-reap-en_p0_x-ingress-1234"


def test_sleeper_runs_later_in_its_own_session_not_our_child_holding_none_of_our_fds(tmp_path):
    out = tmp_path / "ran"
    r, w = os.pipe()
    os.set_inheritable(w, True)              # an inheritable descriptor the sleeper must not keep
    t0 = time.time()
    pid = reaper.sleeper(0.4, [sys.executable, "-c", "import os, sys, time; open(sys.argv[1], 'w').write("
                               "f'{os.getsid(0)} {os.getppid()} {time.time()}')", str(out)])
    os.close(w)
    assert pid > 0 and not out.exists()
    assert os.read(r, 1) == b""              # EOF at once: nobody else holds the write end
    os.close(r)
    for _ in range(100):
        if out.exists() and out.read_text():
            break
        time.sleep(0.05)
    sid, ppid, when = out.read_text().split()
    assert int(sid) != os.getsid(0) and int(ppid) != os.getpid()
    assert float(when) >= t0 + 0.4
    try:
        os.waitpid(pid, os.WNOHANG)
        raise AssertionError("the sleeper is our child")
    except ChildProcessError:
        pass


def test_systemd_path_runs_systemd_run_with_options_it_has(tmp_path, monkeypatch):
    """Where systemd is PID 1 (not on the test machines) apply hands the reap to a transient
    timer. A stand-in systemd-run records its arguments; every option used must be one the
    installed systemd-run lists, and the command it runs one the CLI accepts."""
    real = shutil.which("systemd-run")
    if real is None:
        pytest.skip("systemd-run missing (Debian: systemd)")
    log = tmp_path / "argv"
    fake = tmp_path / "systemd-run"
    fake.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {log}\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setattr(reaper, "systemd_booted", lambda: True)
    how = reaper.schedule("pf0hpf", "ingress", int(time.time()) + 60, netns=None)
    assert how == "systemd skewscope-reap-pf0hpf-ingress-" + how.rsplit("-", 1)[1]
    argv = log.read_text().splitlines()
    k = argv.index(sys.executable)
    opts, cmd = argv[:k], argv[k:]
    helptext = subprocess.run([real, "--help"], capture_output=True, text=True).stdout
    for o in opts:
        assert o.split("=")[0] in helptext, o
    delay = float(next(o for o in opts if o.startswith("--on-active=")).split("=")[1].rstrip("s"))
    assert 59 <= delay <= 61.5
    assert cmd == reaper.reap_argv("pf0hpf", "ingress", "flower")
