"""Environment errors of the live commands, on real interfaces: a stale skewscope program
left by a killed run (refused with the `detach` hint, removed with --force-detach; only a
netlink attach outlives its process, so those runs force SKEWSCOPE_ATTACH=netlink), a
program that is not ours (refused, never touched, --tc still works), a driver without
native XDP (exit 8 with the hint). Each is one line on stderr and a documented exit code."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from skewscope.sources import live

SKEWSCOPE = str(Path(sys.executable).with_name("skewscope"))


def run_in(ns, *args, timeout=90, env=None):
    return subprocess.run(["ip", "netns", "exec", ns, *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, env=env)


NETLINK = dict(os.environ, SKEWSCOPE_ATTACH="netlink")   # the attach a SIGKILL leaves behind


def leave_stale_program(ns, ifname):
    """A process attaches skewscope's XDP program by netlink and is killed (SIGKILL: nothing
    can clean; a bpf_link attach would go with the process)."""
    code = textwrap.dedent(f"""
        import os, signal
        from skewscope.sources.live import LiveSession
        s = LiveSession({ifname!r}, xdp_mode="generic").open()
        assert s.attached_via == "netlink"
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    p = run_in(ns, sys.executable, "-c", code, env=NETLINK)
    assert p.returncode == -9, p.stderr


def test_stale_program_is_refused_with_the_detach_hint_then_force_detach_removes_it(netns_pair, tmp_path):
    p = netns_pair
    leave_stale_program(p.ns_b, p.if_b)
    with p.enter("b"):
        lo = live.find_leftover(p.if_b)
    assert lo is not None and lo.xdp and lo.stale
    out = tmp_path / "x.snap"
    r = run_in(p.ns_b, SKEWSCOPE, "capture", "-i", p.if_b, "-d", "1", "-o", str(out))
    assert r.returncode == 7
    assert r.stderr.count("\n") == 1 and f"skewscope detach -i {p.if_b}" in r.stderr and "--force-detach" in r.stderr
    assert not out.exists()
    r = run_in(p.ns_b, SKEWSCOPE, "top", "-i", p.if_b, "1", "1")
    assert r.returncode == 7 and "stale" in r.stderr
    r = run_in(p.ns_b, SKEWSCOPE, "capture", "-i", p.if_b, "-d", "1", "-o", str(out), "--force-detach", "-q")
    assert r.returncode == 0, r.stderr
    assert f"removed stale XDP program id {lo.xdp}" in r.stderr
    assert out.exists()
    with p.enter("b"):
        assert live.find_leftover(p.if_b) is None


def test_detach_command_removes_a_stale_program(netns_pair):
    p = netns_pair
    leave_stale_program(p.ns_b, p.if_b)
    r = run_in(p.ns_b, SKEWSCOPE, "detach", "-i", p.if_b)
    assert r.returncode == 0 and "removed XDP program id" in r.stdout
    r = run_in(p.ns_b, SKEWSCOPE, "detach", "-i", p.if_b)
    assert r.returncode == 0 and "no skewscope program attached" in r.stdout


def test_someone_elses_xdp_program_is_never_replaced(netns_pair, tmp_path):
    p = netns_pair
    code = textwrap.dedent(f"""
        import os
        from bcc import BPF
        b = BPF(text="int other_xdp(struct xdp_md *ctx) {{ return XDP_PASS; }}")
        b.attach_xdp({p.if_b!r}, b.load_func("other_xdp", BPF.XDP), BPF.XDP_FLAGS_SKB_MODE)
        os._exit(0)
    """)
    r = run_in(p.ns_b, sys.executable, "-c", code)
    assert r.returncode == 0, r.stderr
    before = run_in(p.ns_b, "ip", "-d", "link", "show", "dev", p.if_b).stdout
    assert "xdpgeneric" in before and "prog/xdp id" in before
    try:
        r = run_in(p.ns_b, SKEWSCOPE, "capture", "-i", p.if_b, "-d", "1", "-o", str(tmp_path / "x.snap"),
                   "--force-detach")
        assert r.returncode == 7 and "not ours" in r.stderr and "--tc" in r.stderr
        assert r.stderr.count("\n") == 1
        after = run_in(p.ns_b, "ip", "-d", "link", "show", "dev", p.if_b).stdout
        assert after.split("prog/xdp id")[1].split()[0] == before.split("prog/xdp id")[1].split()[0]
        # TC runs beside it
        r = run_in(p.ns_b, SKEWSCOPE, "capture", "-i", p.if_b, "-d", "1", "-o", str(tmp_path / "x.snap"), "--tc",
                   "-q")
        assert r.returncode == 0, r.stderr
        assert "prog/xdp id" in run_in(p.ns_b, "ip", "-d", "link", "show", "dev", p.if_b).stdout
    finally:
        run_in(p.ns_b, "ip", "link", "set", "dev", p.if_b, "xdpgeneric", "off")


def test_driver_without_native_xdp_says_try_generic(netns_pair, tmp_path):
    p = netns_pair
    p.run("b", "ip", "link", "add", "ssunoxdp0", "type", "bridge")       # no native XDP in the bridge driver
    p.run("b", "ip", "link", "set", "ssunoxdp0", "up")
    r = run_in(p.ns_b, SKEWSCOPE, "capture", "-i", "ssunoxdp0", "-d", "1", "-o", str(tmp_path / "x.snap"))
    assert r.returncode == 8 and "--xdp-mode generic" in r.stderr and r.stderr.count("\n") == 1
    r = run_in(p.ns_b, SKEWSCOPE, "capture", "-i", "ssunoxdp0", "-d", "0.5", "-o", str(tmp_path / "x.snap"),
               "--xdp-mode", "generic", "-q")
    assert r.returncode == 0, r.stderr
    with p.enter("b"):
        assert live.find_leftover("ssunoxdp0") is None


def test_tc_program_in_use_is_never_taken_over_but_a_stale_one_is(netns_pair, tmp_path):
    p = netns_pair
    with p.enter("b"):
        sess = live.LiveSession(p.if_b, mode="tc").open()          # this process holds it
    try:
        r = run_in(p.ns_b, SKEWSCOPE, "capture", "-i", p.if_b, "--tc", "-d", "1", "-o", str(tmp_path / "x.snap"),
                   "--force-detach")
        assert r.returncode == 7 and "already being watched" in r.stderr and f"pid {os.getpid()}" in r.stderr
    finally:
        with p.enter("b"):
            sess.close()
    code = textwrap.dedent(f"""
        import os, signal
        from skewscope.sources.live import LiveSession
        s = LiveSession({p.if_b!r}, mode="tc").open()
        assert s.attached_via == "netlink"
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    assert run_in(p.ns_b, sys.executable, "-c", code, env=NETLINK).returncode == -9
    r = run_in(p.ns_b, SKEWSCOPE, "capture", "-i", p.if_b, "--tc", "-d", "1", "-o", str(tmp_path / "x.snap"))
    assert r.returncode == 7 and "stale" in r.stderr and "TC ingress program id" in r.stderr
    r = run_in(p.ns_b, SKEWSCOPE, "capture", "-i", p.if_b, "--tc", "-d", "0.5", "-o", str(tmp_path / "x.snap"),
               "--force-detach", "-q")
    assert r.returncode == 0, r.stderr
    with p.enter("b"):
        assert live.find_leftover(p.if_b) is None
