"""Faults (issue 8): what an observer leaves behind when things go wrong.

- SIGKILL while attached by netlink (XDP and TC; forced with SKEWSCOPE_ATTACH=netlink: a
  bpf_link attach, the default, goes with the process, see test_attach_link.py): the program
  stays on the interface (nothing in the process can run); the next capture refuses with one
  line pointing at `skewscope detach`
  (exit 7); `skewscope detach -i` then leaves the interface exactly as before (XDP, qdiscs,
  TC filters compared with `ip -d link` / `tc`); or the next capture with --force-detach cleans
  it and leaves it as before when it exits.
- The interface deleted while attached, and the peer namespace deleted mid-capture (which
  takes the veth with it): the capture exits within seconds with a clear line, no traceback.
- The capture's own namespace deleted mid-capture: it finishes and writes its snapshot.
- Disk full while writing a snapshot (a 64 KiB tmpfs): the previous file survives byte for
  byte, no temp file is left, the error is one line with exit code 3.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
from skewscope.testbed import traffic as R

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root for namespaces, veth, attach and mount (CI runs as root)"),
    pytest.mark.timeout(300),
]
CLI = [sys.executable, "-c", "from skewscope.cli import main; main()"]
EXIT_NOT_RUN, EXIT_BUSY = 3, 7


@pytest.fixture
def fab():
    f = R.pair("flt")
    try:
        yield f
    finally:
        f.destroy()


def spawn_capture(fab, *args, duration="60s", ns=None, env=None):
    return subprocess.Popen(["ip", "netns", "exec", ns or fab.ns_b, *CLI, "capture", "-i", fab.if_b,
                             "--duration", duration, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def attached(st):
    return bool(st["xdp"]) or bool(st["filters"]["ingress"].strip())


def wait_attached(fab, proc, timeout=60):
    t = time.monotonic()
    while time.monotonic() - t < timeout:
        if attached(R.iface_state(fab.ns_b, fab.if_b)):
            return
        if proc.poll() is not None:
            raise AssertionError(f"capture exited early: {proc.communicate()}")
        time.sleep(0.1)
    raise AssertionError("capture never attached")


def one_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert "Traceback" not in err, err
    assert len(lines) == 1, f"expected one line on stderr, got: {err!r}"
    return lines[0]


def kill9(fab, extra, tmp_path):
    before = R.iface_state(fab.ns_b, fab.if_b)
    p = spawn_capture(fab, *extra, "-o", str(tmp_path / "k.snap"), env=dict(os.environ, SKEWSCOPE_ATTACH="netlink"))
    try:
        wait_attached(fab, p)
        p.send_signal(signal.SIGKILL)
        p.wait(10)
    finally:
        if p.poll() is None:
            p.kill()
    dirty = R.iface_state(fab.ns_b, fab.if_b)
    assert dirty != before and attached(dirty), "SIGKILL should leave the program behind (nothing can run)"
    return before


@pytest.mark.parametrize("mode", ["xdp", "tc"])
def test_sigkill_then_detach_restores_interface(fab, tmp_path, mode):
    extra = ["--tc"] if mode == "tc" else []
    before = kill9(fab, extra, tmp_path)
    # the next capture refuses and says how to clean
    r = subprocess.run(["ip", "netns", "exec", fab.ns_b, *CLI, "capture", "-i", fab.if_b, "--duration", "1s",
                        "-o", str(tmp_path / "n.snap"), *extra], capture_output=True, text=True, timeout=120)
    assert r.returncode == EXIT_BUSY, r
    assert "skewscope detach -i" in one_line(r.stderr)
    r = subprocess.run(["ip", "netns", "exec", fab.ns_b, *CLI, "detach", "-i", fab.if_b],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "removed" in r.stdout
    assert R.iface_state(fab.ns_b, fab.if_b) == before
    # and again: nothing left to remove
    r = subprocess.run(["ip", "netns", "exec", fab.ns_b, *CLI, "detach", "-i", fab.if_b],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "no skewscope program" in r.stdout


def test_sigkill_then_force_detach_cleans(fab, tmp_path):
    before = kill9(fab, [], tmp_path)
    p = spawn_capture(fab, "--force-detach", "-o", str(tmp_path / "f.snap"), "-q", duration="1s")
    so, se = p.communicate(timeout=120)
    assert p.returncode == 0, se
    assert "removed stale" in se
    assert (tmp_path / "f.snap").exists()
    assert R.iface_state(fab.ns_b, fab.if_b) == before


@pytest.mark.parametrize("how", ["link_deleted", "peer_namespace_deleted"])
def test_interface_gone_while_attached(fab, tmp_path, how):
    p = spawn_capture(fab, "-o", str(tmp_path / "g.snap"), "-q", duration="60s")
    try:
        wait_attached(fab, p)
        t0 = time.monotonic()
        if how == "link_deleted":
            R.sh("ip", "-n", fab.ns_b, "link", "del", fab.if_b)
        else:
            R.sh("ip", "netns", "del", fab.ns_a)
        so, se = p.communicate(timeout=30)
        dt = time.monotonic() - t0
    finally:
        if p.poll() is None:
            p.kill()
    assert "Traceback" not in se, se
    errs = [ln for ln in se.splitlines() if ln.startswith("skewscope:")]  # besides the startup line
    assert len(errs) == 1 and fab.if_b in errs[0], se
    assert len(se.strip().splitlines()) <= 3, se  # startup line, "wrote ...", the error
    assert dt < 15, f"took {dt:.1f} s to notice"
    # cut short (exit 6), but what was counted until then is saved, and says why it stopped
    assert p.returncode == 6, se
    from skewscope.core.snapshot import Snapshot
    snap = Snapshot.load(tmp_path / "g.snap")
    assert fab.if_b in snap.meta["stopped_early"]


def test_own_namespace_deleted_mid_capture(fab, tmp_path):
    out = tmp_path / "ns.snap"
    p = spawn_capture(fab, "-o", str(out), "-q", duration="4s")
    try:
        wait_attached(fab, p)
        R.sh("ip", "netns", "del", fab.ns_b)  # the process keeps the namespace (and the veth) alive
        so, se = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, se
    assert "Traceback" not in se
    from skewscope.core.snapshot import Snapshot
    assert Snapshot.load(out).meta["interface"] == fab.if_b


@pytest.fixture
def tiny_fs(tmp_path):
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    R.sh("mount", "-t", "tmpfs", "-o", "size=64k", "ssr-tiny", mnt)
    try:
        yield mnt
    finally:
        R.sh("umount", "-l", mnt, check=False)


def test_disk_full_keeps_previous_snapshot(tiny_fs, tmp_path):
    import fuzzcorpus as fc
    # a small capture -> a small snapshot that fits; a big one (many flows) that does not
    small, big = tmp_path / "small.pcap", tmp_path / "big.pcap"
    c = fc.make_corpus(3000, seed=5, kinds=("valid",))
    c.subset(range(50)).write_pcap(str(small))
    c.write_pcap(str(big))
    target = tiny_fs / "run.snap"
    r = subprocess.run([*CLI, "replay", str(small), "-o", str(target)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    before = target.read_bytes()
    # fill the rest of the file system
    fd = os.open(tiny_fs / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 512) > 0:
            pass
    except OSError:
        pass
    finally:
        os.close(fd)
    r = subprocess.run([*CLI, "replay", str(big), "-o", str(target)], capture_output=True, text=True, timeout=300)
    assert r.returncode == EXIT_NOT_RUN, (r.returncode, r.stderr)
    line = one_line(r.stderr)
    assert "No space left" in line, line
    assert target.read_bytes() == before
    assert sorted(p.name for p in tiny_fs.iterdir()) == ["filler", "run.snap"], "temp file left behind"
