"""Security (issue 8).

- No option ever reaches the BPF C source as text: Config.validate refuses anything but an
  in-range integer before compilation (injection attempts like "1); evil(" included); the
  compiler is handed the unmodified source file and only `-D NAME=<digits>` flags; the CLI
  refuses such values as usage errors (exit 2) before anything is compiled.
- Files read are never executed or unpickled: a .snap whose table is a pickled object array
  (whose unpickling would create a marker file) is refused with one line, exit 3, and the
  marker never appears.
- Running without privileges fails with one clear line and exit code 4 (run as `nobody`
  with setpriv; needs root to switch users, so that part skips when not root).
- The exporter binds loopback unless told otherwise (default and ':PORT'; checked on a live
  socket in a fresh namespace when root).
"""
from __future__ import annotations

import io
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from skewscope.bpf import loader as D
from skewscope.core.snapshot import Snapshot, SnapshotError, empty

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-c", "from skewscope.cli import main; main()"]
EXIT_USAGE, EXIT_NOT_RUN, EXIT_NO_PRIV = 2, 3, 4

INJECTIONS = ["1); evil(", "65536\n#include </etc/shadow>", "1 -DSS_SAMPLE_N=0", "0x10000", "65536;", 1.5, True,
              None, -1, 0, 1 << 40, "65536", b"65536", np.int64(65536), [65536]]


@pytest.mark.parametrize("field", ["max_flows", "ev_per_cpu", "sample_n", "ncpus"])
@pytest.mark.parametrize("bad", INJECTIONS, ids=[repr(x)[:20] for x in INJECTIONS])
def test_config_refuses_non_integers_and_out_of_range(field, bad):
    cfg = D.Config(**{field: bad})
    with pytest.raises(D.DataplaneError) as e:
        cfg.validate()
    assert e.value.code == EXIT_USAGE
    assert "\n" not in str(e.value)
    with pytest.raises(D.DataplaneError):
        cfg.cflags()


@pytest.mark.parametrize("bad", [x for x in INJECTIONS if not (type(x) is int and x == 0)] + [3, 100, 1 << 17],
                         ids=lambda x: repr(x)[:20])
def test_flow_cache_refuses_anything_but_0_or_a_power_of_two(bad):
    cfg = D.Config(flow_cache=bad)
    with pytest.raises(D.DataplaneError) as e:
        cfg.validate()
    assert e.value.code == EXIT_USAGE and "\n" not in str(e.value)
    for ok in (0, 1, 256, 1 << 16):
        D.Config(flow_cache=ok).validate()


def test_injection_fails_before_compilation(monkeypatch):
    """The compiler is never reached with a bad value (and never given anything but digits)."""
    called = []
    monkeypatch.setattr(D, "import_bcc", lambda: called.append(1) or (_FakeBPF, None))
    monkeypatch.setattr(D.os, "geteuid", lambda: 0)
    for bad in ("1); evil(", "1 -DX=2"):
        with pytest.raises(D.DataplaneError) as e:
            D.Dataplane(D.Config(max_flows=bad))
        assert e.value.code == EXIT_USAGE
    assert called == []


class _FakeBPF:
    seen: list = []

    def __init__(self, text=None, cflags=None, **kw):
        _FakeBPF.seen.append((text, list(cflags or []), kw))
        raise RuntimeError("fake compiler: stop here")


def test_compiler_gets_the_unmodified_source_and_numeric_flags(monkeypatch):
    _FakeBPF.seen = []
    monkeypatch.setattr(D, "import_bcc", lambda: (_FakeBPF, None))
    monkeypatch.setattr(D.os, "geteuid", lambda: 0)
    for cfg in (D.Config(), D.Config(max_flows=1024, sample_n=7, ev_per_cpu=1 << 10, replay_clock=True)):
        with pytest.raises(Exception):
            D.Dataplane(cfg)
    assert len(_FakeBPF.seen) == 2
    src = D.SOURCE.read_text()
    for text, flags, kw in _FakeBPF.seen:
        text = text.decode() if isinstance(text, bytes) else text
        flags = [f.decode() if isinstance(f, bytes) else f for f in flags]
        assert text == src, "the C source must be compiled as it is on disk"
        assert not kw.get("src_file") and not kw.get("usdt_contexts")
        for f in flags:
            assert re.fullmatch(r"-D[A-Z][A-Z0-9_]*=\d+", f) or f == f"-I{D.EBPF_DIR}" or re.fullmatch(r"-W[a-z-]+", f), f


@pytest.mark.parametrize("cmd", [["capture", "-i", "lo", "--duration", "1s", "-o", "/tmp/ssr-x.snap"],
                                 ["top", "-i", "lo", "1", "1"], ["replay", "/dev/null", "-o", "/tmp/ssr-x.snap"]])
def test_cli_refuses_injection_as_usage_error(cmd):
    r = subprocess.run([*CLI, *cmd, "--max-flows", "1); evil("], capture_output=True, text=True, timeout=60)
    assert r.returncode == EXIT_USAGE, r
    assert "Traceback" not in r.stderr and "max-flows" in r.stderr
    assert not Path("/tmp/ssr-x.snap").exists()


def test_ebpf_dump_shows_only_numeric_flags():
    r = subprocess.run([*CLI, "capture", "-i", "lo", "--duration", "1s", "-o", "/tmp/ssr-y.snap", "--ebpf",
                        "--max-flows", "4096", "--sample", "3"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    first = r.stdout.splitlines()[0]
    assert first.startswith("// cflags:") and "-DSS_MAX_FLOWS=4096" in first and "-DSS_SAMPLE_N=3" in first
    assert r.stdout.split("\n", 1)[1].rstrip("\n") == D.SOURCE.read_text().rstrip("\n")


# ---- files are never executed or unpickled ---------------------------------------------------
class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _evil_snap(path: Path, marker: Path, member: str) -> None:
    good = empty({"source": "test"})
    good.save(path)
    zin = zipfile.ZipFile(path)
    members = {n: zin.read(n) for n in zin.namelist()}
    zin.close()
    bio = io.BytesIO()
    np.save(bio, np.array([_Evil(marker)], dtype=object), allow_pickle=True)
    members[member + ".npy"] = bio.getvalue()
    with zipfile.ZipFile(path, "w") as z:
        for n, b in members.items():
            z.writestr(n, b)


@pytest.mark.parametrize("member", ["flows", "events", "globals", "meta"])
def test_pickled_snapshot_is_refused_not_executed(tmp_path, member):
    p, marker = tmp_path / "evil.snap", tmp_path / "PWNED"
    _evil_snap(p, marker, member)
    with pytest.raises(SnapshotError) as e:
        Snapshot.load(p)
    assert "\n" not in str(e.value)
    r = subprocess.run([*CLI, "report", str(p)], capture_output=True, text=True, timeout=120)
    assert r.returncode == EXIT_NOT_RUN
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("skewscope:") and "evil.snap" in lines[0], r.stderr
    r = subprocess.run([*CLI, "report", str(p), "--json"], capture_output=True, text=True, timeout=120)
    assert r.returncode == EXIT_NOT_RUN and r.stdout == ""
    assert not marker.exists(), "a pickle in a .snap was executed"
    # the unpickling really would have run the payload (the test can fail)
    pickle.loads(pickle.dumps(_Evil(marker)))
    assert marker.exists()


# ---- without privileges ------------------------------------------------------------------------
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching to 'nobody' needs root (CI runs as root)")


def _as_nobody(*args, timeout=120):
    setpriv = shutil.which("setpriv")
    assert setpriv, "setpriv (util-linux) missing"
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "NUMBA_CACHE_DIR": "/tmp/ssr-numba-nobody"}
    return subprocess.run([setpriv, "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--inh-caps=-all",
                           *CLI, *args], capture_output=True, text=True, timeout=timeout, env=env, cwd="/tmp")


@needs_root
@pytest.mark.parametrize("cmd", [["detach", "-i", "lo"], ["capture", "-i", "lo", "--duration", "1s", "-o", "/tmp/ssr-n.snap"],
                                 ["top", "-i", "lo", "1", "1"], ["replay", "__PCAP__", "-o", "/tmp/ssr-n.snap"],
                                 ["export", "-i", "lo", "--once"]])
def test_unprivileged_fails_with_one_clear_line(cmd, tmp_path):
    pcap = Path("/tmp/ssr-nobody.pcap")
    empty_pcap = b"\xd4\xc3\xb2\xa1\x02\x00\x04\x00" + bytes(8) + b"\xff\xff\x00\x00\x01\x00\x00\x00"
    pcap.write_bytes(empty_pcap)
    os.chmod(pcap, 0o644)
    cmd = [str(pcap) if c == "__PCAP__" else c for c in cmd]
    try:
        r = _as_nobody(*cmd)
    finally:
        pcap.unlink()
    assert r.returncode == EXIT_NO_PRIV, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("skewscope:") and "root" in lines[0], lines[0]
    assert not Path("/tmp/ssr-n.snap").exists()


@needs_root
def test_unprivileged_report_works(tmp_path):
    """The commands that need no privilege still work as nobody."""
    snap = Path("/tmp/ssr-nobody.snap")
    empty({"source": "test"}).save(snap)
    os.chmod(snap, 0o644)
    try:
        r = _as_nobody("report", str(snap), "--json")
    finally:
        snap.unlink()
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["totals"]["packets_seen"] == 0


# ---- the exporter listens on loopback by default -----------------------------------------------
def test_exporter_default_listen_is_loopback():
    from skewscope.outputs import expose
    assert expose.DEFAULT_LISTEN.startswith("127.0.0.1:")
    assert expose.parse_listen(":9435")[0] == "127.0.0.1"
    from skewscope.cli.export import export
    opt = {o.name: o for o in export.params}["listen"]
    assert opt.default.startswith("127.0.0.1:")


@needs_root
def test_exporter_socket_bound_to_loopback_only(tmp_path):
    """Start `skewscope export --from FILE` with no --listen in a fresh namespace (so the
    default port is free) and look at the listening socket."""
    ns = f"ssr-sec-{os.getpid()}"
    snap = tmp_path / "e.snap"
    empty({"source": "test"}).save(snap)
    subprocess.run(["ip", "netns", "add", ns], check=True)
    p = None
    try:
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
        p = subprocess.Popen(["ip", "netns", "exec", ns, *CLI, "export", "--from", str(snap)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        listen = ""
        t = time.monotonic()
        while time.monotonic() - t < 60 and p.poll() is None:
            listen = subprocess.run(["ip", "netns", "exec", ns, "ss", "-Hltn"], capture_output=True, text=True).stdout
            if listen.strip():
                break
            time.sleep(0.2)
        assert p.poll() is None, p.communicate()
        local = [ln.split()[3] for ln in listen.strip().splitlines()]
        assert local and all(a.startswith("127.0.0.1:") for a in local), listen
    finally:
        if p is not None and p.poll() is None:
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        subprocess.run(["ip", "netns", "del", ns], check=False)
