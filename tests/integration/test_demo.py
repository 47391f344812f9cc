"""`skewscope demo` end to end, non-interactively and bounded: it builds the fabric, plays
the scenarios, reports, and leaves nothing behind -- no ssd- namespace, no sender process,
no program, no state file -- whether it ends by itself or by SIGTERM; `--cleanup` removes
what a killed demo left."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from skewscope.testbed.fabric import STATE_DIR, list_namespaces

SKEWSCOPE = str(Path(sys.executable).with_name("skewscope"))


def tag_of(text: str) -> str:
    m = re.search(r"building fabric (ssd-[0-9a-f]+)", text)
    assert m, text
    return m.group(1)


def assert_nothing_left(tag: str) -> None:
    assert [n for n in list_namespaces() if n.startswith(tag + "-")] == []
    assert not (STATE_DIR / f"fabric-{tag}.json").exists()
    ps = subprocess.run(["pgrep", "-f", f"skewscope.testbed.fabric play --ns {tag}-"], capture_output=True, text=True)
    assert ps.stdout.strip() == ""


def test_demo_bounded_no_top_reports_and_leaves_nothing():
    p = subprocess.run([SKEWSCOPE, "demo", "--duration", "14", "--no-top", "--rate", "6000"], capture_output=True,
                       text=True, timeout=180, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr
    tag = tag_of(p.stderr)
    assert "demo over: removed 10 namespaces" in p.stderr
    assert "skewscope report" in p.stdout and "source: obs0" in p.stdout
    m = re.search(r"frames (\d+)\s+RoCE (\d+)", p.stdout)
    assert m and int(m.group(2)) > 1000 and m.group(1) == m.group(2)      # the mirror copies RoCE only
    assert_nothing_left(tag)


def test_demo_plain_output_without_a_terminal():
    p = subprocess.run([SKEWSCOPE, "demo", "--duration", "8", "--rate", "4000", "--interval", "2"],
                       capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith("Tracing RoCE on obs0 (XDP native, prog ") and lines[0].endswith("Ctrl-C to end.")
    assert sum(1 for ln in lines if ln.startswith("SRC ")) >= 3
    assert all(len(ln) < 80 for ln in lines)
    assert_nothing_left(tag_of(p.stderr))


def test_demo_sigterm_tears_everything_down():
    p = subprocess.Popen([SKEWSCOPE, "demo", "--duration", "120", "--no-top", "--rate", "3000"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    err: list[str] = []
    running = threading.Event()

    def pump():
        for ln in p.stderr:
            err.append(ln)
            if ln.startswith("demo ssd-"):
                running.set()
    t = threading.Thread(target=pump, daemon=True)
    t.start()
    try:
        assert running.wait(90), "".join(err)
        tag = tag_of("".join(err))
        assert any(n.startswith(tag + "-gpu") for n in list_namespaces())
        time.sleep(2)
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=60)
        t.join(10)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 128 + signal.SIGTERM, "".join(err)
    assert "demo over: removed 10 namespaces" in "".join(err)
    assert_nothing_left(tag)


def test_cleanup_removes_what_a_killed_demo_left():
    tag = f"ssd-c{os.getpid() % 10000:x}"
    names = [f"{tag}-gpu0", f"{tag}-sw"]
    dead = subprocess.Popen(["true"])
    dead.wait()
    for n in names:
        subprocess.run(["ip", "netns", "add", n], check=True)
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    (STATE_DIR / f"fabric-{tag}.json").write_text(json.dumps({"pid": dead.pid, "namespaces": names, "procs": []}))
    try:
        p = subprocess.run([SKEWSCOPE, "demo", "--cleanup"], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        assert "removed 2 namespaces" in p.stderr
        assert_nothing_left(tag)
    finally:
        for n in names:
            subprocess.run(["ip", "netns", "del", n], capture_output=True)
