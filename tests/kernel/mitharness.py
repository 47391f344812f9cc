"""What the two mitigate test files share: the CLI run as a user runs it, and everything tc
shows of a device (the ground truth a dry run, revert and reap are compared against)."""
from __future__ import annotations

import subprocess
import sys


def cli(*args, ok=(0,)):
    """`skewscope mitigate ARGS`; asserts the exit code is one of `ok`."""
    r = subprocess.run([sys.executable, "-m", "skewscope.cli", "mitigate", *map(str, args)], capture_output=True,
                       text=True, timeout=180)
    assert r.returncode in ok, (r.returncode, r.stdout[-1500:], r.stderr[-1500:])
    return r


def tc_state(ns: str, dev: str) -> str:
    """Everything tc shows of the device: qdiscs and the filters of both clsact hooks."""
    out = []
    for args in (["qdisc", "show", "dev", dev], ["filter", "show", "dev", dev, "ingress"],
                 ["filter", "show", "dev", dev, "egress"]):
        out.append(subprocess.run(["tc", "-n", ns, *args], capture_output=True, text=True).stdout)
    return "\n".join(out)


def apply_then_sigkill(argv_prefix: list[str], apply_code: str) -> None:
    """Run `apply_code` (Python that applies one rule) in a child started with `argv_prefix`
    (e.g. `ip netns exec NS`), and SIGKILL it as soon as it says the rule is in: from then on
    only the TTL machinery can end the rule."""
    import signal
    p = subprocess.Popen([*argv_prefix, sys.executable, "-c",
                          apply_code + '\nprint("applied", flush=True)\nimport time\ntime.sleep(60)\n'],
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "applied"
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
