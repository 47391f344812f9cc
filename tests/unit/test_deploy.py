"""The DPU service files (issue 29, deliverable 3): the systemd units pass `systemd-analyze
verify` (instantiated on an interface, ExecStart pointed at this checkout's skewscope) with no
warning; the example config is accepted by the real export and watch commands; the static pod
spec and the Containerfile say what docs/dpu.md says (capabilities, mounts, the command line
parses as export's own). The image itself is not built here (no container daemon or registry
on the test machines): docs/dpu.md says so."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
UNITS = ("skewscope-export@.service", "skewscope-watch@.service")


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze missing (Debian: systemd)")
@pytest.mark.parametrize("unit", UNITS)
def test_units_verify_clean(tmp_path, unit):
    exe = Path(sys.executable).parent / "skewscope"
    assert exe.exists(), exe
    text = (DEPLOY / "systemd" / unit).read_text()
    assert "ExecStart=/usr/local/bin/skewscope " in text
    (tmp_path / unit).write_text(text.replace("/usr/local/bin/skewscope", str(exe)))
    inst = tmp_path / unit.replace("@.", "@eth0.")
    inst.symlink_to(tmp_path / unit)
    r = subprocess.run(["systemd-analyze", "verify", "--man=no", str(inst)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(), r.stdout + r.stderr
    # a broken unit does fail the same check (the check can fail)
    (tmp_path / "bad@.service").write_text(text.replace("/usr/local/bin/skewscope", "/nonexistent/skewscope"))
    (tmp_path / "bad@eth0.service").symlink_to(tmp_path / "bad@.service")
    assert subprocess.run(["systemd-analyze", "verify", "--man=no", str(tmp_path / "bad@eth0.service")],
                          capture_output=True, text=True, timeout=60).returncode != 0


@pytest.mark.parametrize("unit", UNITS)
def test_units_are_hardened_as_documented(unit):
    kv = {}
    for ln in (DEPLOY / "systemd" / unit).read_text().splitlines():
        if "=" in ln and not ln.startswith("#"):
            k, v = ln.split("=", 1)
            kv[k] = v
    assert set(kv["CapabilityBoundingSet"].split()) == {"CAP_BPF", "CAP_NET_ADMIN", "CAP_PERFMON"}
    assert kv["ProtectSystem"] == "strict" and kv["NoNewPrivileges"] == "yes" and kv["Restart"] == "on-failure"
    assert kv["StateDirectory"] == "skewscope" and "--config /etc/skewscope/skewscope.yaml" in kv["ExecStart"]
    assert re.search(r"skewscope (export|watch) -i %i ", kv["ExecStart"])


def test_example_config_is_accepted_by_the_commands():
    from skewscope.cli import main
    from skewscope.cli.config import load
    for name in ("export", "watch", "top"):
        cmd = main.get_command(None, name)
        ctx = click.Context(cmd, info_name=name)
        got = load(str(DEPLOY / "skewscope.yaml"), ctx)
        assert got.get("inventory_path") == "/etc/skewscope/hosts.csv", (name, got)
    ctx = click.Context(main.get_command(None, "export"), info_name="export")
    got = load(str(DEPLOY / "skewscope.yaml"), ctx)
    assert got["listen"] == "0.0.0.0:9435" and got["node"] == "dpu-017" and got["max_peers"] == 4096


def test_static_pod_spec():
    pod = yaml.safe_load((DEPLOY / "kubernetes" / "skewscope-dpu.yaml").read_text())
    assert pod["kind"] == "Pod" and pod["apiVersion"] == "v1" and pod["spec"]["hostNetwork"] is True
    c = pod["spec"]["containers"][0]
    caps = c["securityContext"]["capabilities"]
    assert caps["drop"] == ["ALL"] and set(caps["add"]) == {"BPF", "NET_ADMIN", "PERFMON"}
    assert c["securityContext"]["privileged"] is False and c["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    vols = {v["name"] for v in pod["spec"]["volumes"]}
    assert set(mounts.values()) <= vols and {"/lib/modules", "/usr/src", "/etc/skewscope"} <= set(mounts)
    # the container's command line is one export accepts
    from skewscope.cli import main
    assert c["args"][0] == "export"
    cmd = main.get_command(None, "export")
    ctx = cmd.make_context("export", [a for a in c["args"][1:] if a != "--config" and not a.endswith(".yaml")])
    assert ctx.params["iface"] == c["args"][c["args"].index("-i") + 1]
    cfg = c["args"][c["args"].index("--config") + 1]
    assert Path(cfg).parent.as_posix() in mounts
    assert any(p["containerPort"] == 9435 for p in c["ports"])


def test_containerfile_copies_what_exists():
    text = (DEPLOY / "Containerfile").read_text()
    for src in re.findall(r"^COPY (.+?) \S+$", text, re.M):
        for s in src.split():
            assert (ROOT / s).exists(), s
    assert 'ENTRYPOINT ["skewscope"]' in text and "python3-bpfcc" in text


REAP = ("skewscope-mitigate-reap.service", "skewscope-mitigate-reap.timer")


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze missing (Debian: systemd)")
def test_mitigate_reap_timer_and_service_verify_clean(tmp_path):
    """The sweep behind the flower backend's TTL (docs/mitigation.md "On a BlueField")."""
    exe = Path(sys.executable).parent / "skewscope"
    for u in REAP:
        (tmp_path / u).write_text((DEPLOY / "systemd" / u).read_text().replace("/usr/local/bin/skewscope", str(exe)))
    r = subprocess.run(["systemd-analyze", "verify", "--man=no", *(str(tmp_path / u) for u in REAP)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(), r.stdout + r.stderr
    # the same check fails on a service whose command is missing (the check can fail)
    (tmp_path / REAP[0]).write_text((DEPLOY / "systemd" / REAP[0]).read_text().replace("/usr/local/bin/skewscope",
                                                                                        "/nonexistent/skewscope"))
    assert subprocess.run(["systemd-analyze", "verify", "--man=no", *(str(tmp_path / u) for u in REAP)],
                          capture_output=True, text=True, timeout=60).returncode != 0


def test_mitigate_reap_units_say_what_the_docs_say():
    from skewscope.cli import main

    def kv(u):
        return dict(ln.split("=", 1) for ln in (DEPLOY / "systemd" / u).read_text().splitlines()
                    if "=" in ln and not ln.startswith("#"))
    svc, tim = kv(REAP[0]), kv(REAP[1])
    assert svc["Type"] == "oneshot" and svc["CapabilityBoundingSet"] == "CAP_NET_ADMIN"
    # /run/skewscope holds the state and lock; a oneshot's RuntimeDirectory would go after each run
    assert svc["RuntimeDirectory"] == "skewscope" and svc["RuntimeDirectoryPreserve"] == "yes"
    assert tim["OnUnitActiveSec"] == "30s" and tim["Unit"] == REAP[0]
    # the command line is one `mitigate reap` accepts: every interface, the flower backend
    args = svc["ExecStart"].split()[1:]
    assert args[:2] == ["mitigate", "reap"]
    grp = main.get_command(None, "mitigate")
    ctx = grp.get_command(None, "reap").make_context("reap", args[2:])
    assert ctx.params["backend"] == "flower" and ctx.params["iface"] is None
    assert "30 s" in (ROOT / "docs" / "mitigation.md").read_text()
