"""No stale path: every file path (skewscope/core/layout.py, outputs/topview.py, tests/unit/...,
docs/...) and every dotted module path (skewscope.sources.live.Window) written in docs/
(*.md, the Prometheus rule files), README.md, the Makefile, tools/*.sh and the comments and
docstrings of skewscope/, tests/ and tools/ names
something that exists. A path relative to a package (outputs/http.py, detectors/kv.py)
counts when a file of the tree ends with it; a bare file name (dataplane.py) when some file
of the tree has that name."""
from __future__ import annotations

import ast
import io
import re
import tokenize
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SKIP_DIRS = {".git", ".venv", "__pycache__", "build", ".pytest_cache"}
#: paths that exist in the installed wheel, not in a checkout (pyproject.toml maps them)
PACKAGED = {"skewscope/ebpf": "ebpf", "skewscope.ebpf": "ebpf"}
#: files `make setup` builds (tools/aotbuild.py), absent from a checkout until then
BUILT = {"skewscope/_aot.pkl"}

SLASH = re.compile(r"(?<![\w./@~-])((?:\.\./)?(?:[\w.-]+/)+[\w.-]*)")
DOTTED = re.compile(r"(?<![\w./-])(skewscope(?:\.[A-Za-z_]\w*)+)")
BARE = re.compile(r"(?<![\w./-])([A-Za-z_]\w*\.py)\b")
OUR_TOP = ("skewscope", "docs", "tests", "tools", "ebpf")


def _files() -> list[Path]:
    out = []
    for p in ROOT.rglob("*"):
        if not SKIP_DIRS & set(p.relative_to(ROOT).parts):
            out.append(p)
    return out


FILES = _files()
RELS = {p.relative_to(ROOT).as_posix() for p in FILES}
NAMES = {p.name for p in FILES}
DIRS = {part for r in RELS for part in r.split("/")[:-1]} | {p.name for p in FILES if p.is_dir()}


def _texts():
    """(file, [(line number, text)]) of the docs and of the comments/docstrings of the code."""
    docs = [p for ext in ("md", "yml", "yaml") for p in (ROOT / "docs").rglob(f"*.{ext}")]
    for p in sorted(docs) + [ROOT / "README.md", ROOT / "Makefile"] + sorted((ROOT / "tools").rglob("*.sh")):
        yield p, list(enumerate(p.read_text().splitlines(), 1))
    for base in ("skewscope", "tests", "tools"):
        for p in sorted((ROOT / base).rglob("*.py")):
            if p == Path(__file__).resolve():       # its docstring and cases name stale paths on purpose
                continue
            out = []
            for tok in tokenize.generate_tokens(io.StringIO(p.read_text()).readline):
                if tok.type == tokenize.COMMENT or (
                        tok.type == tokenize.STRING and tok.string.lstrip("rbuRBUf").startswith(('"""', "'''"))):
                    out += [(tok.start[0] + k, ln) for k, ln in enumerate(tok.string.splitlines())]
            yield p, out


def _path_ok(s: str, where: Path) -> bool:
    s = s.rstrip("/")
    if s in PACKAGED:
        return (ROOT / PACKAGED[s]).is_dir()
    if s in BUILT:
        return True
    if s.startswith("../"):                  # ../shared/...: outside the repository, not ours
        return True
    for base in (ROOT, ROOT / "skewscope", where.parent):
        if (base / s).exists():
            return True
    return any(r == s or r.endswith("/" + s) for r in RELS)


def _slash_paths(line: str):
    for m in SLASH.finditer(line):
        s = m.group(1).rstrip(".,:;)'`\"")
        tail = line[m.end():m.end() + 1]
        if not s or "://" in line[max(0, m.start() - 10):m.end()] or (tail and tail in "*<{["):
            continue
        first = s.lstrip("./").split("/")[0]
        if first in OUR_TOP or (s.endswith(".py") and first in DIRS):
            yield s


@cache
def _names_of(path: Path) -> frozenset:
    t = ast.parse(path.read_text())
    out = set()
    for n in t.body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, (ast.Assign, ast.AnnAssign)):
            for tg in (n.targets if isinstance(n, ast.Assign) else [n.target]):
                out |= {x.id for x in ast.walk(tg) if isinstance(x, ast.Name)}
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            out |= {(a.asname or a.name).split(".")[0] for a in n.names}
    return frozenset(out)


def _module(parts: list[str]) -> Path | None:
    p = ROOT.joinpath(*parts)
    if (p / "__init__.py").is_file():
        return p / "__init__.py"
    if p.with_suffix(".py").is_file():
        return p.with_suffix(".py")
    return None


def _dotted_ok(s: str) -> bool:
    if s in PACKAGED or s in NAMES or any(s.startswith(n + ".") for n in PACKAGED if "." in n):
        return True                      # skewscope.h, skewscope.bpf.c: file names
    parts = s.split(".")
    k = 1
    while k < len(parts) and _module(parts[:k + 1]) is not None:
        k += 1
    if k == len(parts):
        return True
    mod = _module(parts[:k])
    return mod is not None and parts[k] in _names_of(mod)


def stale() -> list[str]:
    bad = []
    for p, lines in _texts():
        rel = p.relative_to(ROOT)
        for ln, line in lines:
            for s in _slash_paths(line):
                if not _path_ok(s, p):
                    bad.append(f"{rel}:{ln}: {s}")
            for m in BARE.finditer(line):
                if m.group(1) not in NAMES:
                    bad.append(f"{rel}:{ln}: {m.group(1)}")
            for m in DOTTED.finditer(line):
                s = m.group(1).rstrip(".")
                if line[m.end():m.end() + 1] == "/":       # a schema name: skewscope.finding_event/v1
                    continue
                if not _dotted_ok(s):
                    bad.append(f"{rel}:{ln}: {s}")
    return bad


def test_no_stale_paths_in_docs_and_comments():
    bad = stale()
    assert bad == [], "paths that do not exist (moved or renamed? fix the text):\n" + "\n".join(bad)


@pytest.mark.parametrize("text,ok", [("skewscope/core/layout.py", True), ("skewscope/layout.py", False),
                                     ("outputs/topview.py", True), ("skewscope/offline/", False),
                                     ("skewscope.sources.live.Window", True), ("skewscope.offline", False),
                                     ("skewscope.sources.live.NoSuch", False)])
def test_the_checker_itself(text, ok):
    if "/" in text:
        got = all(_path_ok(s, ROOT / "README.md") for s in _slash_paths(text))
    else:
        got = _dotted_ok(text)
    assert got is ok
