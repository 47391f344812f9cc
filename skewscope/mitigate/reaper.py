"""The flower backend's TTL: the kernel does not expire a tc flower rule, so `apply` schedules
`skewscope mitigate reap` for the deadline in something that outlives the applying process
(also a SIGKILLed one):

* systemd is PID 1 (/run/systemd/system exists): a transient timer,
  `systemd-run --on-active=S --unit skewscope-reap-IFACE-HOOK-DEADLINE ...`;
* else (a container, a test namespace): a detached sleeper -- fork, setsid, fork again (no
  zombie of the applier, no controlling terminal, outside its process group), every inherited
  descriptor closed, then `sh -c 'sleep S; exec skewscope mitigate reap ...'` (a shell and
  sleep, not a resident Python, for TTLs of up to 7 days).

deploy/systemd/skewscope-mitigate-reap.timer is the sweep behind both (every 30 s, every
interface): a reboot of the sleeper's host or a lost transient unit costs at most 30 s.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time

GRACE_S = 0.5       # reap this long after the deadline (the cookie's deadline is whole seconds)


def reap_argv(iface: str, direction: str, backend: str = "flower", netns: str | None = None) -> list[str]:
    argv = [sys.executable, "-m", "skewscope.cli", "mitigate", "reap", "-i", iface, "--direction", direction,
            "--backend", backend]
    return argv + (["--netns", netns] if netns else [])


def systemd_booted() -> bool:
    """sd_booted(3): systemd is PID 1 of this machine (or container)."""
    return os.path.isdir("/run/systemd/system") and shutil.which("systemd-run") is not None


def unit_name(iface: str, direction: str, deadline: int) -> str:
    return "skewscope-reap-" + re.sub(r"[^A-Za-z0-9_.-]", "_", f"{iface}-{direction}-{deadline}")


def schedule(iface: str, direction: str, deadline: int, backend: str = "flower", netns: str | None = None) -> str:
    """Arrange `reap` at `deadline` (unix s). Returns how: 'systemd UNIT' or 'sleeper PID'."""
    argv = reap_argv(iface, direction, backend, netns)
    delay = max(0.0, deadline - time.time()) + GRACE_S
    if systemd_booted():
        unit = unit_name(iface, direction, deadline)
        env = [f"--setenv=PYTHONPATH={os.environ['PYTHONPATH']}"] if os.environ.get("PYTHONPATH") else []
        p = subprocess.run(["systemd-run", "--quiet", "--collect", f"--unit={unit}", f"--on-active={delay:.1f}s",
                            "--timer-property=AccuracySec=1s", *env, *argv], capture_output=True, text=True, timeout=30)
        if p.returncode == 0 or "already" in p.stderr:       # the same deadline is already scheduled
            return f"systemd {unit}"
    return f"sleeper {sleeper(delay, argv)}"


def sleeper(delay: float, argv: list[str]) -> int:
    """Run argv after `delay` s in a process of its own session, not our child. Returns its pid."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                  # the intermediate: new session, fork, go
        try:
            os.close(r)
            os.setsid()
            gpid = os.fork()
            if gpid == 0:
                try:
                    os.chdir("/")
                    null = os.open(os.devnull, os.O_RDWR)
                    for fd in (0, 1, 2):
                        os.dup2(null, fd)
                    os.closerange(3, os.sysconf("SC_OPEN_MAX"))
                    os.execv("/bin/sh", ["sh", "-c", 'sleep "$0"; exec "$@"', f"{delay:.3f}", *argv])
                finally:
                    os._exit(127)
            os.write(w, str(gpid).encode())
        finally:
            os._exit(0)
    os.close(w)
    try:
        got = os.read(r, 32)
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    return int(got or b"0")
