"""Integration tier: attach / detach safety on a real veth, for both attach methods
(bpf_link, the default on this kernel, and the netlink fallback forced with
SKEWSCOPE_ATTACH=netlink; tests/integration/test_attach_link.py has the SIGKILL cases).

- a process that attached leaves nothing behind when it exits normally, raises, is
  interrupted (SIGINT) or terminated (SIGTERM/SIGHUP): the attach runs in a subprocess (a
  small script using bpf.attach.Attachment, in the observer namespace) which is then killed;
- attach refuses to replace an XDP program that is not ours (a trivial one loaded with bcc);
- `skewscope detach -i` removes only skewscope's programs, never anyone else's, and not
  (without --force) one a running process holds, by netlink or through a bpf_link.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

ATTACHER = textwrap.dedent("""
    import sys, time
    from skewscope.bpf.attach import Attachment
    from skewscope.bpf.loader import Config, Dataplane
    mode, sub, ifname, how = sys.argv[1:5]
    dp = Dataplane(Config(max_flows=64, ev_per_cpu=64))
    kw = dict(xdp_mode=sub) if mode == "xdp" else dict(direction=sub)
    if how == "with":
        with Attachment(dp, ifname, mode=mode, **kw) as att:
            print("attached", att.api, flush=True)
            time.sleep(60)
    att = Attachment(dp, ifname, mode=mode, **kw).attach()   # no with/finally: atexit + signals
    print("attached", att.api, flush=True)
    if how == "exit":
        sys.exit(0)
    if how == "raise":
        raise RuntimeError("boom")
    time.sleep(60)
""")

MODES = [("xdp", "native"), ("xdp", "generic"), ("tc", "ingress"), ("tc", "both")]
APIS = ["bpf_link", "netlink"]          # SKEWSCOPE_ATTACH: both must be forced to work on this kernel
NOTHING = {"xdp": None, "xdp_link": None, "tc": [], "tcx": []}


def ours(pair) -> dict:
    from skewscope.bpf.attach import list_ours
    with pair.enter("b"):
        return list_ours(pair.if_b)


def nothing_attached(pair) -> None:
    assert ours(pair) == NOTHING
    link = pair.run("b", "ip", "-d", "link", "show", pair.if_b).stdout
    assert "prog/xdp" not in link, link
    for d in ("ingress", "egress"):
        assert pair.run("b", "tc", "filter", "show", "dev", pair.if_b, d).stdout.strip() == ""
    assert "clsact" not in pair.run("b", "tc", "qdisc", "show", "dev", pair.if_b).stdout


def start_attacher(pair, mode, sub, how, api):
    env = dict(os.environ, PYTHONPATH=str(ROOT), SKEWSCOPE_ATTACH=api)
    # the attacher starts with SIGINT/SIGHUP at their defaults even when the suite was started
    # with them ignored (tests/conftest.py resets them; skewscope keeps an inherited SIG_IGN)
    p = subprocess.Popen(["ip", "netns", "exec", pair.ns_b, sys.executable, "-c", ATTACHER, mode, sub, pair.if_b, how],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(ROOT))
    line = p.stdout.readline()
    if line.split() != ["attached", api]:
        p.kill()
        raise AssertionError(f"attacher did not attach with {api}: {line!r} {p.stderr.read()}")
    return p


def assert_attached(pair, mode, sub, api):
    """What the kernel shows: `ip link` has the XDP program either way; a netlink TC attach
    is a cls_bpf filter that `tc` lists, a tcx one (bpf_link) is not a filter at all."""
    o = ours(pair)
    n_tc = 2 if sub == "both" else 1
    if mode == "xdp":
        assert o["xdp"] is not None and f"prog/xdp id {o['xdp']}" in pair.run("b", "ip", "-d", "link", "show",
                                                                                  pair.if_b).stdout
        assert (o["xdp_link"] is not None) == (api == "bpf_link"), o
    elif api == "netlink":
        assert len(o["tc"]) == n_tc and o["tcx"] == [], o
        assert "skewscope_tc" in pair.run("b", "tc", "filter", "show", "dev", pair.if_b, sub if n_tc == 1
                                          else "egress").stdout
    else:
        assert o["tc"] == [] and len(o["tcx"]) == n_tc and all(lk for _, lk, _ in o["tcx"]), o
        assert "clsact" not in pair.run("b", "tc", "qdisc", "show", "dev", pair.if_b).stdout


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("mode,sub", MODES)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_signal_detaches(netns_pair, mode, sub, sig, api):
    p = start_attacher(netns_pair, mode, sub, "sleep", api)
    try:
        assert_attached(netns_pair, mode, sub, api)
        p.send_signal(sig)
        p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    if sig != signal.SIGINT:
        assert p.returncode == 128 + sig, p.stderr.read()
    else:
        assert p.returncode != 0
    nothing_attached(netns_pair)


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("how", ["exit", "raise", "with"])
def test_exit_detaches(netns_pair, how, api):
    for mode, sub in (("xdp", "native"), ("tc", "egress")):
        p = start_attacher(netns_pair, mode, sub, how, api)
        try:
            if how == "with":
                p.send_signal(signal.SIGTERM)
            p.wait(timeout=30)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        assert p.returncode == {"exit": 0, "raise": 1, "with": 128 + signal.SIGTERM}[how]
        nothing_attached(netns_pair)


@pytest.fixture
def foreign_xdp(netns_pair):
    """A trivial XDP program that is not ours (loaded with bcc), attached to if_b."""
    from bcc import BPF
    b = BPF(text=b"int someone_else(struct xdp_md *ctx) { return XDP_PASS; }")
    fn = b.load_func(b"someone_else", BPF.XDP)
    with netns_pair.enter("b"):
        b.attach_xdp(netns_pair.if_b.encode(), fn, 0)
    try:
        yield b
    finally:
        with netns_pair.enter("b"):
            try:
                b.remove_xdp(netns_pair.if_b.encode(), 0)
            except Exception:
                pass
        b.cleanup()


def _xdp_name(pair) -> str:
    return pair.run("b", "ip", "-d", "link", "show", pair.if_b).stdout


@pytest.mark.parametrize("api", APIS)
def test_refuses_to_replace_a_foreign_xdp_program(netns_pair, foreign_xdp, api):
    from skewscope.bpf.attach import Attachment
    from skewscope.bpf.loader import Config, Dataplane
    from skewscope.core.errors import EXIT_BUSY, DataplaneError
    dp = Dataplane(Config(max_flows=64, ev_per_cpu=64))
    try:
        for sub in ("native", "generic"):
            with netns_pair.enter("b"):
                with pytest.raises(DataplaneError) as ei:
                    Attachment(dp, netns_pair.if_b, mode="xdp", xdp_mode=sub, api=api).attach()
            assert ei.value.code == EXIT_BUSY
            msg = str(ei.value)
            assert "not ours" in msg and "someone_else" in msg and "\n" not in msg
            assert "someone_else" in _xdp_name(netns_pair)
        # TC next to it is fine, and leaves the foreign program alone when it goes
        with netns_pair.enter("b"):
            att = Attachment(dp, netns_pair.if_b, mode="tc", direction="ingress", api=api).attach()
        assert att.api == api
        att.detach()
        assert "someone_else" in _xdp_name(netns_pair)
        assert ours(netns_pair) == NOTHING
    finally:
        dp.close()


def _cli_detach(pair, ifname=None):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(["ip", "netns", "exec", pair.ns_b, sys.executable, "-m", "skewscope.cli", "detach", "-i",
                           ifname or pair.if_b], capture_output=True, text=True, env=env, cwd=str(ROOT), timeout=60)


def test_cli_detach_removes_only_ours(netns_pair, foreign_xdp):
    """A crashed run (SIGKILL: nothing can clean up) attached by netlink left our TC filters;
    someone else's XDP program and TC filter sit on the same interface. `skewscope detach -i`
    removes ours only."""
    pair = netns_pair
    p = start_attacher(pair, "tc", "both", "sleep", "netlink")
    p.kill()
    p.wait()
    assert len(ours(pair)["tc"]) == 2  # SIGKILL: left behind
    # a foreign TC filter on ingress (a different prio, a program not named skewscope_*)
    from bcc import BPF
    b = BPF(text=b"int other_tc(struct __sk_buff *skb) { return 0; }")
    fn = b.load_func(b"other_tc", BPF.SCHED_CLS)
    from pyroute2 import IPRoute
    with pair.enter("b"):
        with IPRoute() as ipr:
            idx = ipr.link_lookup(ifname=pair.if_b)[0]
            ipr.tc("add-filter", "bpf", idx, ":1", fd=fn.fd, name="other_tc", parent=0xFFFFFFF2, classid=1,
                   direct_action=True, prio=7)
    try:
        r = _cli_detach(pair)
        assert r.returncode == 0, r.stderr
        assert "removed" in r.stdout and "ingress" in r.stdout and "egress" in r.stdout
        assert ours(pair) == NOTHING
        assert "someone_else" in _xdp_name(pair)
        flt = pair.run("b", "tc", "filter", "show", "dev", pair.if_b, "ingress").stdout
        assert "other_tc" in flt
        r = _cli_detach(pair)
        assert r.returncode == 0 and "no skewscope program" in r.stdout
    finally:
        b.cleanup()


def test_cli_detach_removes_a_stale_xdp_program(netns_pair):
    p = start_attacher(netns_pair, "xdp", "generic", "sleep", "netlink")   # netlink: SIGKILL leaves it
    p.kill()
    p.wait()
    assert ours(netns_pair)["xdp"] is not None
    r = _cli_detach(netns_pair)
    assert r.returncode == 0 and "XDP program" in r.stdout, r.stdout + r.stderr
    nothing_attached(netns_pair)


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("mode,sub", [("xdp", "generic"), ("tc", "ingress")])
def test_cli_detach_refuses_a_program_in_use(netns_pair, mode, sub, api):
    """A running skewscope holds its program (and its bpf_link): detach without --force must
    not pull it from under it (the run would go on printing empty tables); --force does."""
    p = start_attacher(netns_pair, mode, sub, "sleep", api)
    try:
        r = _cli_detach(netns_pair)
        assert r.returncode == 7, r.stdout + r.stderr
        assert r.stderr.count("\n") == 1 and "in use by" in r.stderr and str(p.pid) in r.stderr
        assert_attached(netns_pair, mode, sub, api)
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        r = subprocess.run(["ip", "netns", "exec", netns_pair.ns_b, sys.executable, "-m", "skewscope.cli", "detach",
                            "-i", netns_pair.if_b, "--force"], capture_output=True, text=True, env=env,
                           cwd=str(ROOT), timeout=60)
        assert r.returncode == 0 and "removed" in r.stdout, r.stdout + r.stderr
        if mode == "tc":
            assert ("tcx link" in r.stdout) == (api == "bpf_link"), r.stdout
        nothing_attached(netns_pair)
    finally:
        p.kill()
        p.wait()


def test_cli_detach_unknown_interface(netns_pair):
    r = _cli_detach(netns_pair, "sst-nope0")
    assert r.returncode == 6 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("api", APIS)
def test_attach_refuses_our_own_leftover(netns_pair, api):
    """A second attach on an interface that already has a skewscope XDP program says so
    (and how to remove it) instead of replacing it."""
    from skewscope.bpf.attach import Attachment
    from skewscope.bpf.loader import Config, Dataplane
    from skewscope.core.errors import EXIT_BUSY, DataplaneError
    p = start_attacher(netns_pair, "xdp", "native", "sleep", api)
    dp = Dataplane(Config(max_flows=64, ev_per_cpu=64))
    try:
        with netns_pair.enter("b"):
            with pytest.raises(DataplaneError) as ei:
                Attachment(dp, netns_pair.if_b, mode="xdp").attach()
        assert ei.value.code == EXIT_BUSY and "skewscope detach" in str(ei.value)
        assert ("running skewscope holds it" in str(ei.value)) == (api == "bpf_link"), str(ei.value)
    finally:
        dp.close()
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=30)
    time.sleep(0.1)
    nothing_attached(netns_pair)
