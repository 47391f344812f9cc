"""The wheel, installed into a fresh virtualenv, works outside the checkout (root: replay).

1. A venv: `/usr/bin/python3 -m venv --system-site-packages` (the OS's bcc, PyYAML,
   setuptools and wheel), plus one .pth line naming the site-packages of the interpreter
   running this test (numpy, numba, click, rich, prometheus_client, pyroute2: offline, no
   downloads). That directory holds no `skewscope` package (checked): the project's venv
   has skewscope only as an editable finder, activated by a .pth file that a .pth line
   does not process.
2. The wheel: `pip wheel --no-deps --no-build-isolation --no-index` with the venv's pip
   and setuptools, from a copy of the checkout's pyproject.toml, README.md, skewscope/ and
   ebpf/ (setuptools' build/ stays out of the shared checkout); `pip install --no-deps
   --no-index` into the venv.
3. From a directory outside the checkout, with a clean environment: the venv's
   `skewscope` imports itself, the BPF C sources and the generator from the venv;
   `skewscope gen ring-straggler`, `skewscope report --json` and `skewscope replay`
   (BPF_PROG_TEST_RUN, compiling the wheel's copy of the C sources) give the frame, packet
   and byte counts and the straggler of the generator's truth.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy
import pytest

ROOT = Path(__file__).resolve().parents[2]
SYSTEM_PYTHON = "/usr/bin/python3"
SOURCE_PARTS = ("pyproject.toml", "README.md", "skewscope", "ebpf")
JUNK = shutil.ignore_patterns("__pycache__", "*.pyc", "*.nbi", "*.nbc", "*.egg-info", "build",
                              "_aot.*")  # the AOT module is per machine (make setup), not in a wheel
TIMEOUT = 900


def run(cmd, cwd, env, timeout=TIMEOUT):
    r = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{cmd}: rc {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def deps_site() -> Path:
    """The site-packages that holds this interpreter's numpy (and the other dependencies)."""
    return Path(numpy.__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    if not Path(SYSTEM_PYTHON).is_file():
        pytest.skip(f"{SYSTEM_PYTHON} missing: the venv is made from the OS interpreter (where bcc lives)")
    base = tmp_path_factory.mktemp("ssp-wheel")
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(base), "LANG": "C.UTF-8",
           "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    vdir = base / "venv"
    run([SYSTEM_PYTHON, "-m", "venv", "--system-site-packages", vdir], base, env)
    py = vdir / "bin" / "python"
    purelib = Path(run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], base,
                       env).stdout.strip())
    dep = deps_site()
    assert not (dep / "skewscope" / "__init__.py").exists(), f"{dep} holds a skewscope package: test meaningless"
    (purelib / "_skewscope_test_deps.pth").write_text(f"{dep}\n")
    # the wheel, from a copy of the checkout, with the venv's pip/setuptools (wheel: OS package)
    src = base / "src"
    src.mkdir()
    for part in SOURCE_PARTS:
        p = ROOT / part
        shutil.copytree(p, src / part, ignore=JUNK) if p.is_dir() else shutil.copy2(p, src / part)
    dist = base / "dist"
    run([py, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", dist, src], base, env)
    wheels = list(dist.glob("skewscope-*.whl"))
    assert len(wheels) == 1, wheels
    run([py, "-m", "pip", "install", "--no-deps", "--no-index", wheels[0]], base, env)
    work = base / "elsewhere"
    work.mkdir()
    env = dict(env, PATH=f"{vdir / 'bin'}:{env['PATH']}")
    return {"venv": vdir, "py": py, "purelib": purelib, "work": work, "env": env, "exe": vdir / "bin" / "skewscope"}


def test_modules_and_c_sources_come_from_the_venv(venv):
    code = ("import json, sys, skewscope, skewscope.gen, skewscope.cli\n"
            "from skewscope.bpf import loader\n"
            "print(json.dumps({'pkg': skewscope.__file__, 'gen': skewscope.gen.__file__, "
            "'cli': skewscope.cli.__file__, 'ebpf': str(loader.EBPF_DIR), 'source': str(loader.SOURCE), "
            "'path': sys.path}))")
    d = json.loads(run([venv["py"], "-c", code], venv["work"], venv["env"]).stdout)
    site = venv["purelib"].resolve()
    for k in ("pkg", "gen", "cli", "ebpf", "source"):
        assert Path(d[k]).resolve().is_relative_to(site / "skewscope"), (k, d[k])
    assert Path(d["source"]).is_file() and list(Path(d["ebpf"]).glob("*.h"))
    # the checkout is nowhere on sys.path, and no entry but the venv's holds a skewscope package
    for p in d["path"]:
        rp = Path(p or venv["work"]).resolve()
        assert rp != ROOT.resolve(), d["path"]
        if (rp / "skewscope" / "__init__.py").exists():
            assert rp == site, (p, d["path"])


def _truth_checks(doc: dict, truth: dict, where: str):
    t = doc["totals"]
    assert t["packets_seen"] == truth["frames"], where
    assert t["roce_packets"] == truth["roce_frames"], where
    assert t["non_roce_packets"] == truth["non_roce_frames"], where
    want = {(f["src"], f["dst"], f["dest_qp"]): (f["packets"], f["bytes"]) for f in truth["flows"]}
    got = {(f["src"], f["dst"], f["dest_qp"]): (f["packets"], f["bytes"]) for f in doc["flows"]}
    assert got == want, where
    straggler = [p for p in truth["pathologies"] if p["kind"] == "straggler"]
    assert straggler, "ring-straggler truth has no straggler"
    slow = straggler[0]["entities"]["ips"][0]
    blamed = [f["entities"]["ips"][0] for f in doc["findings"] if f["kind"] == "ring_straggler"]
    assert slow in blamed, (where, slow, [(f["kind"], f["entities"]["ips"]) for f in doc["findings"]])


def test_gen_report_and_replay_from_another_directory(venv):
    w, env, exe = venv["work"], venv["env"], venv["exe"]
    # headers only (--snaplen 128; original lengths kept): the same counts, a 13 MB file
    run([exe, "gen", "ring-straggler", "-o", "x.pcap", "--snaplen", "128"], w, env)
    assert (w / "x.pcap").stat().st_size > 0
    truth = json.loads((w / "x.truth.json").read_text())
    assert truth["frames"] > 10000 and truth["flows"]
    doc = json.loads(run([exe, "report", "x.pcap", "--json"], w, env).stdout)
    assert doc["meta"]["source"] == "offline"
    _truth_checks(doc, truth, "report x.pcap")
    if os.geteuid() != 0:
        pytest.skip("replay needs root (BPF_PROG_TEST_RUN)")
    run([exe, "replay", "x.pcap", "-o", "k.snap"], w, env)
    doc = json.loads(run([exe, "report", "k.snap", "--json"], w, env).stdout)
    assert doc["meta"]["source"] == "replay"
    _truth_checks(doc, truth, "replay x.pcap")
    assert sorted(p.name for p in w.iterdir()) == ["k.snap", "x.pcap", "x.truth.json"]
