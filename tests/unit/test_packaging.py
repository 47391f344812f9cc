"""Packaging (no root): pyproject's explicit package list is the package tree, and the wheel
built from the checkout carries every Python module, the data plane's C sources and headers
(as skewscope/ebpf/, bpf.loader finds them there) and the generator.

The wheel is built from a copy of the checkout's pyproject.toml, README.md, skewscope/ and
ebpf/ (so setuptools' build/ and egg-info stay out of the shared checkout, and no stale
build/lib can leak a deleted file into the wheel), with `pip wheel --no-build-isolation
--no-index`: offline, with an interpreter that has setuptools and wheel.
The end-to-end check (install into a fresh venv, run the commands elsewhere) is
tests/integration/test_wheel.py.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]
SOURCE_PARTS = ("pyproject.toml", "README.md", "skewscope", "ebpf")
JUNK = shutil.ignore_patterns("__pycache__", "*.pyc", "*.nbi", "*.nbc", "*.egg-info", "build")


def tree_packages() -> dict:
    """dotted name -> directory, for every directory under skewscope/ with an __init__.py."""
    out = {}
    for init in sorted((ROOT / "skewscope").rglob("__init__.py")):
        d = init.parent
        if "__pycache__" in d.parts:
            continue
        out[".".join(d.relative_to(ROOT).parts)] = d
    return out


def build_python() -> str | None:
    """An interpreter that can build the wheel offline: setuptools >= 61 (pyproject
    metadata) and the `wheel` package (setuptools < 70.1 needs it for bdist_wheel)."""
    for py in (sys.executable, "/usr/bin/python3"):
        r = subprocess.run([py, "-c", "import setuptools, wheel, pip; "
                                      "assert int(setuptools.__version__.split('.')[0]) >= 61"],
                           capture_output=True, timeout=60)
        if r.returncode == 0:
            return py
    return None


def build_wheel(python: str, workdir: Path) -> Path:
    src = workdir / "src"
    src.mkdir(parents=True)
    for part in SOURCE_PARTS:
        p = ROOT / part
        if p.is_dir():
            shutil.copytree(p, src / part, ignore=JUNK)
        else:
            shutil.copy2(p, src / part)
    dist = workdir / "dist"
    r = subprocess.run([python, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                        "-w", str(dist), str(src)], capture_output=True, text=True, timeout=600, cwd=workdir)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    wheels = list(dist.glob("skewscope-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_every_package_directory_is_listed_and_every_listed_package_exists():
    listed = set(SETUPTOOLS["packages"])
    tree = tree_packages()
    missing = sorted(set(tree) - listed)
    assert not missing, f"add to pyproject.toml [tool.setuptools] packages: {missing}"
    mapped = SETUPTOOLS.get("package-dir", {})
    for pkg in listed:
        d = ROOT / mapped[pkg] if pkg in mapped else ROOT.joinpath(*pkg.split("."))
        assert d.is_dir(), f"pyproject lists {pkg} but {d} does not exist"
    # a directory of modules without __init__.py would be silently left out of the wheel
    for py in (ROOT / "skewscope").rglob("*.py"):
        if "__pycache__" not in py.parts:
            assert (py.parent / "__init__.py").is_file(), f"{py.parent} has modules but no __init__.py"
    assert "skewscope.ebpf" in listed and mapped.get("skewscope.ebpf") == "ebpf"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    py = build_python()
    if py is None:
        pytest.skip("no interpreter with setuptools>=61 + wheel + pip to build offline (Debian: python3-setuptools "
                    "python3-wheel python3-pip)")
    return build_wheel(py, tmp_path_factory.mktemp("ssp-pkg"))


def test_wheel_carries_the_data_plane_sources_the_generator_and_every_module(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        c_files = sorted((ROOT / "ebpf").glob("*.c"))
        h_files = sorted((ROOT / "ebpf").glob("*.h"))
        assert c_files and h_files
        for f in c_files + h_files:
            arc = f"skewscope/ebpf/{f.name}"
            assert arc in names, f"wheel lacks {arc}"
            assert z.read(arc) == f.read_bytes(), f"{arc} differs from the checkout's"
        gen = sorted((ROOT / "skewscope" / "gen").glob("*.py"))
        assert gen
        for f in gen:
            assert f"skewscope/gen/{f.name}" in names, f"wheel lacks skewscope/gen/{f.name}"
        # every module of every package directory (what the commands import)
        for pkg, d in tree_packages().items():
            for f in d.glob("*.py"):
                arc = f.relative_to(ROOT).as_posix()
                assert arc in names, f"wheel lacks {arc} (package {pkg})"
        # nothing from outside the package: no tests, no top-level ebpf/
        assert not [n for n in names if n.startswith(("tests/", "ebpf/", "build/"))]
        info = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        assert len(info) == 1
        ep = z.read(info[0]).decode()
        assert "[console_scripts]" in ep and "skewscope = skewscope.cli:main" in ep
