"""Integration tier: attachments that die with the process (bpf_link).

`skewscope capture` runs as a subprocess in the observer namespace (python -m skewscope.cli)
and is killed with SIGKILL, which nothing in the process can catch:
- attached through a bpf_link (the default on a kernel that has it: XDP link, tcx), nothing
  is left on the interface: no XDP program in `ip link`, no TC filter or clsact qdisc in
  `tc`, no tcx program on either hook, and the link ids the kernel showed in the process's
  /proc/PID/fdinfo before the kill no longer exist;
- forced to the netlink fallback (SKEWSCOPE_ATTACH=netlink), the program stays (the kernel
  shows it) and `skewscope detach -i` removes it.
The startup line says which was used. A link held by a running capture is "in use": a
second capture and `detach` (without --force) refuse, `detach --force` takes it. Classic tc
filters beside our TC program (tcx or cls_bpf) still run: its verdict lets the hook go on.
In-process: in auto mode a kernel that refuses BPF_LINK_CREATE (EINVAL) gets the netlink
attach; any other refusal is an error.
"""
from __future__ import annotations

import errno
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BPF_XDP, BPF_TCX_INGRESS, BPF_TCX_EGRESS = 37, 46, 47     # uapi enum bpf_attach_type

CASES = {   # id: (capture options, {attach_type: hook} the kernel must show links for)
    "xdp-native": ([], {BPF_XDP: "xdp"}),
    "xdp-generic": (["--xdp-mode", "generic"], {BPF_XDP: "xdp"}),
    "tc-ingress": (["--tc"], {BPF_TCX_INGRESS: "ingress"}),
    "tc-egress": (["--tc", "--direction", "egress"], {BPF_TCX_EGRESS: "egress"}),
    "tc-both": (["--tc", "--direction", "both"], {BPF_TCX_INGRESS: "ingress", BPF_TCX_EGRESS: "egress"}),
}


def env_for(api: str | None) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("SKEWSCOPE_ATTACH", None)
    if api:
        env["SKEWSCOPE_ATTACH"] = api
    return env


def start_capture(pair, opts, out, api=None):
    """`capture` for 60 s in ns b; returns (process, its startup line) once attached."""
    p = subprocess.Popen(["ip", "netns", "exec", pair.ns_b, sys.executable, "-m", "skewscope.cli", "capture",
                          "-i", pair.if_b, "--duration", "60s", "-o", str(out), *opts],
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env_for(api), cwd=str(ROOT))
    deadline = time.monotonic() + 120
    err = ""
    while time.monotonic() < deadline:
        r, _, _ = select.select([p.stderr], [], [], 1.0)
        if r:
            line = p.stderr.readline()
            if not line:
                break
            err += line
            if line.startswith("Capturing RoCE"):
                return p, line.strip()
        elif p.poll() is not None:
            break
    p.kill()
    p.wait()
    raise AssertionError(f"capture did not attach (rc {p.returncode}): {err}{p.stderr.read()}")


def kernel_links(pid: int) -> dict[int, tuple[str, int, int]]:
    """The bpf_links process pid holds, as the kernel describes them in /proc/PID/fdinfo:
    {link id: (link_type, ifindex, attach_type)} (XDP links print no attach_type: 37)."""
    out = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") != "anon_inode:bpf_link":
                continue
            with open(f"/proc/{pid}/fdinfo/{fd}") as fh:
                info = dict(ln.split(":", 1) for ln in fh.read().splitlines() if ":" in ln)
        except OSError:
            continue
        info = {k.strip(): v.strip() for k, v in info.items()}
        at = int(info.get("attach_type", str(BPF_XDP)).split()[0])
        out[int(info["link_id"])] = (info["link_type"], int(info.get("ifindex", 0)), at)
    return out


def link_exists(link_id: int) -> bool:
    from skewscope.bpf import syscalls as bpfsys
    try:
        fd = bpfsys.link_fd_by_id(link_id)
    except OSError as e:
        assert e.errno == errno.ENOENT, e
        return False
    os.close(fd)
    return True


def interface_state(pair) -> dict:
    """What iproute2 and the kernel show on if_b: XDP program, qdiscs, TC filters, tcx programs."""
    from skewscope.bpf import syscalls as bpfsys
    link = pair.run("b", "ip", "-d", "link", "show", pair.if_b).stdout
    m = re.search(r"prog/xdp id (\d+)", link)
    with pair.enter("b"):
        idx = socket.if_nametoindex(pair.if_b)
        tcx = {d: bpfsys.tcx_query(idx, at) for d, at in (("ingress", BPF_TCX_INGRESS), ("egress", BPF_TCX_EGRESS))}
    return {"xdp": int(m.group(1)) if m else None,
            "qdisc": "clsact" in pair.run("b", "tc", "qdisc", "show", "dev", pair.if_b).stdout,
            "filters": {d: pair.run("b", "tc", "filter", "show", "dev", pair.if_b, d).stdout.strip()
                        for d in ("ingress", "egress")},
            "tcx": tcx, "ifindex": idx}


def clean(st: dict) -> bool:
    return st["xdp"] is None and not st["qdisc"] and not any(st["filters"].values()) and not any(st["tcx"].values())


def wait_clean(pair, timeout=10.0) -> dict:
    """The kernel releases a closed link from a work queue: allow it a moment."""
    deadline = time.monotonic() + timeout
    while True:
        st = interface_state(pair)
        if clean(st) or time.monotonic() > deadline:
            return st
        time.sleep(0.1)


def sigkill(p) -> None:
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=30)
    assert p.returncode == -signal.SIGKILL


@pytest.mark.parametrize("case", list(CASES))
def test_sigkill_leaves_nothing_attached_with_bpf_link(netns_pair, tmp_path, case):
    pair = netns_pair
    opts, hooks = CASES[case]
    assert clean(interface_state(pair))
    p, line = start_capture(pair, opts, tmp_path / "k.snap")
    try:
        assert "(bpf_link)" in line, line
        assert ("XDP" in line) == case.startswith("xdp") and ("tcx" in line) == case.startswith("tc"), line
        st = interface_state(pair)
        links = kernel_links(p.pid)
        # the kernel's own view: one link per hook, on this interface, of the program we see attached
        assert sorted(at for _, _, at in links.values()) == sorted(hooks), links
        assert all(idx == st["ifindex"] for _, idx, _ in links.values()), (links, st)
        if case.startswith("xdp"):
            assert st["xdp"] is not None and {t for t, _, _ in links.values()} == {"xdp"}
            shown = pair.run("b", "ip", "-d", "link", "show", pair.if_b).stdout
            assert ("xdpgeneric" in shown) == ("generic" in case), shown
        else:
            assert {t for t, _, _ in links.values()} == {"tcx"} and st["xdp"] is None
            for d in ("ingress", "egress"):
                assert bool(st["tcx"][d]) == (d in hooks.values()), st
                assert all(lk in links for _, lk in st["tcx"][d]), (st, links)
            assert not st["qdisc"] and not any(st["filters"].values()), st   # tcx needs no qdisc
        sigkill(p)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    st = wait_clean(pair)
    assert clean(st), st
    assert not any(link_exists(lk) for lk in links), links
    assert not (tmp_path / "k.snap").exists()
    # and the next capture starts without any leftover to handle
    r = subprocess.run(["ip", "netns", "exec", pair.ns_b, sys.executable, "-m", "skewscope.cli", "capture", "-i",
                        pair.if_b, "-d", "0.3", "-o", str(tmp_path / "n.snap"), "-q", *opts], capture_output=True,
                       text=True, env=env_for(None), cwd=str(ROOT), timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 0 and "stale" not in r.stderr, r.stderr
    assert clean(wait_clean(pair))


@pytest.mark.parametrize("case", ["xdp-native", "tc-both"])
def test_sigkill_with_the_netlink_fallback_leaves_it_and_detach_removes_it(netns_pair, tmp_path, case):
    pair = netns_pair
    opts, hooks = CASES[case]
    p, line = start_capture(pair, opts, tmp_path / "k.snap", api="netlink")
    try:
        assert "(netlink)" in line and "bpf_link" not in line, line
        assert kernel_links(p.pid) == {}
        sigkill(p)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    time.sleep(0.5)
    st = interface_state(pair)
    if case.startswith("xdp"):
        assert st["xdp"] is not None, st
    else:
        assert st["qdisc"] and all("skewscope_tc" in st["filters"][d] for d in ("ingress", "egress")), st
        assert not any(st["tcx"].values()), st
    r = subprocess.run(["ip", "netns", "exec", pair.ns_b, sys.executable, "-m", "skewscope.cli", "detach", "-i",
                        pair.if_b], capture_output=True, text=True, env=env_for(None), cwd=str(ROOT), timeout=60)
    assert r.returncode == 0 and "removed" in r.stdout, r.stdout + r.stderr
    assert clean(interface_state(pair))


@pytest.mark.parametrize("case", ["xdp-generic", "tc-both"])
def test_a_link_held_by_a_running_capture_is_in_use(netns_pair, tmp_path, case):
    pair = netns_pair
    opts, _ = CASES[case]
    p, line = start_capture(pair, opts, tmp_path / "k.snap")
    try:
        assert "(bpf_link)" in line
        r = subprocess.run(["ip", "netns", "exec", pair.ns_b, sys.executable, "-m", "skewscope.cli", "capture", "-i",
                            pair.if_b, "-d", "1", "-o", str(tmp_path / "2.snap"), "--force-detach", *opts],
                           capture_output=True, text=True, env=env_for(None), cwd=str(ROOT), timeout=120,
                           stdin=subprocess.DEVNULL)
        assert r.returncode == 7 and "already being watched" in r.stderr and f"pid {p.pid}" in r.stderr, r.stderr
        assert r.stderr.count("\n") == 1, r.stderr
        detach = ["ip", "netns", "exec", pair.ns_b, sys.executable, "-m", "skewscope.cli", "detach", "-i", pair.if_b]
        r = subprocess.run(detach, capture_output=True, text=True, env=env_for(None), cwd=str(ROOT), timeout=60)
        assert r.returncode == 7 and "in use by" in r.stderr and str(p.pid) in r.stderr, r.stdout + r.stderr
        assert not clean(interface_state(pair))
        r = subprocess.run(detach + ["--force"], capture_output=True, text=True, env=env_for(None), cwd=str(ROOT),
                           timeout=60)
        assert r.returncode == 0 and "removed" in r.stdout, r.stdout + r.stderr
        if case.startswith("tc"):
            assert "TC ingress tcx link" in r.stdout and "TC egress tcx link" in r.stdout, r.stdout
        assert clean(interface_state(pair))
        assert p.poll() is None          # the capture runs on (its link is defunct now)
        sigkill(p)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert clean(wait_clean(pair))


def test_bad_attach_method_is_a_usage_error(netns_pair, tmp_path):
    r = subprocess.run(["ip", "netns", "exec", netns_pair.ns_b, sys.executable, "-m", "skewscope.cli", "capture",
                        "-i", netns_pair.if_b, "-d", "1", "-o", str(tmp_path / "x.snap")], capture_output=True,
                       text=True, env=env_for("ioctl"), cwd=str(ROOT), timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 2 and "SKEWSCOPE_ATTACH" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert clean(interface_state(netns_pair))


@pytest.mark.parametrize("mode", ["xdp", "tc"])
def test_auto_falls_back_to_netlink_when_the_kernel_refuses_links(netns_pair, monkeypatch, mode):
    """An older kernel answers BPF_LINK_CREATE with EINVAL (unknown attach type / command):
    auto mode attaches by netlink instead, and detach cleans that. Forced bpf_link does not
    fall back, and a refusal that is not "unsupported" (EPERM) is an error in auto mode too."""
    from skewscope.bpf import syscalls as bpfsys
    from skewscope.bpf.attach import Attachment
    from skewscope.bpf.loader import Config, Dataplane
    from skewscope.core.errors import EXIT_KERNEL, DataplaneError
    calls = []

    def refuse(code):
        def link_create(*a, **k):
            calls.append(a)
            raise bpfsys.BPFError(code, os.strerror(code))
        return link_create

    dp = Dataplane(Config(max_flows=64, ev_per_cpu=64))
    kw = dict(mode=mode, direction="both") if mode == "tc" else dict(mode=mode, xdp_mode="generic")
    try:
        monkeypatch.setattr(bpfsys, "link_create", refuse(errno.EINVAL))
        with netns_pair.enter("b"):
            att = Attachment(dp, netns_pair.if_b, api="auto", **kw).attach()
        try:
            assert calls and att.api == "netlink" and att.link_refused == errno.EINVAL
            st = interface_state(netns_pair)
            if mode == "xdp":
                assert st["xdp"] == att.prog_id, st
            else:
                assert all("skewscope_tc" in st["filters"][d] for d in ("ingress", "egress")), st
            assert not any(st["tcx"].values())
        finally:
            att.detach()
        assert clean(interface_state(netns_pair))
        for api, code in (("bpf_link", errno.EINVAL), ("auto", errno.EPERM)):
            monkeypatch.setattr(bpfsys, "link_create", refuse(code))
            with netns_pair.enter("b"):
                with pytest.raises(DataplaneError) as ei:
                    Attachment(dp, netns_pair.if_b, api=api, **kw).attach()
            assert ei.value.code == EXIT_KERNEL and "bpf_link" in str(ei.value) and os.strerror(code) in str(ei.value)
            assert clean(interface_state(netns_pair))
    finally:
        dp.close()


@pytest.mark.parametrize("api", ["bpf_link", "netlink"])
def test_classic_tc_filters_still_run_beside_ours(netns_pair, api):
    """The TC program's verdict lets the hook go on (TC_ACT_UNSPEC = TCX_NEXT): a classic tc
    filter on the same device (here one that drops everything, after ours: a firewall, a
    mirred mirror, OVS's rules would be the same) still runs, through tcx and after our
    cls_bpf filter. Ground truth: ping through the device fails while the drop filter is
    there, and works once it is removed, with our program counting all along."""
    import ctypes

    from pyroute2 import IPRoute

    from skewscope.bpf import syscalls as bpfsys
    from skewscope.core import layout as L
    from skewscope.sources.live import LiveSession
    pair = netns_pair
    insns = (ctypes.c_uint8 * 16).from_buffer_copy(bytes.fromhex("b700000002000000" "9500000000000000"))
    shot = bpfsys.prog_load(bpfsys.BPF_PROG_TYPE_SCHED_CLS, ctypes.addressof(insns), 16, "sslk_drop")  # TC_ACT_SHOT

    def ping() -> bool:
        return pair.run("a", "ping", "-c", "3", "-i", "0.2", "-W", "1", pair.ip_b, check=False).returncode == 0

    with pair.enter("b"):
        sess = LiveSession(pair.if_b, mode="tc", attach_api=api).open()
    try:
        assert sess.attached_via == api
        assert ping()                                            # ours alone passes everything
        with pair.enter("b"), IPRoute() as ipr:
            idx = ipr.link_lookup(ifname=pair.if_b)[0]
            if api == "bpf_link":
                ipr.tc("add", "clsact", idx)
            ipr.tc("add-filter", "bpf", idx, ":1", fd=shot, name="sslk_drop", parent=0xFFFFFFF2, classid=1,
                   direct_action=True, prio=0xC0DF)               # after ours (0xC0DE) in the netlink case
        frames0 = int(sess.dp.read_globals()[L.G_FRAMES])
        assert not ping(), "a classic tc drop filter beside ours must still run"
        assert int(sess.dp.read_globals()[L.G_FRAMES]) >= frames0 + 3   # ours ran first and saw the 3 requests
        with pair.enter("b"), IPRoute() as ipr:
            ipr.tc("del-filter", "bpf", idx, parent=0xFFFFFFF2, prio=0xC0DF)
        assert ping()
    finally:
        with pair.enter("b"):
            sess.close()
        os.close(shot)
