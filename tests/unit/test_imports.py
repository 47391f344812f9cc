"""The package's import rules (docs/architecture.md):
- layer direction: a module imports only its own package and the packages on the lines above
  its package's line in the "import layers" block of docs/architecture.md (the one place the
  order is written; this test reads it from there), imports inside functions included;
- no import cycle among skewscope's modules, imports inside functions included;
- an import inside a function is there only for a heavy or optional dependency, and says so
  in a comment on its line (or the line above);
- `import skewscope.cli` (what `skewscope --help` costs) loads no numba, rich, pyroute2, bcc
  prometheus_client or matplotlib;
- every module imports cleanly and opens with a docstring (one line saying what it is for).
The graph is read from the source with ast, independently of the import machinery."""
from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "skewscope"


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        parts = list(p.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


MODS = _modules()


def _resolve(node: ast.ImportFrom, mod: str, is_pkg: bool) -> str:
    if not node.level:
        return node.module or ""
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports():
    """(module, lineno, target modules, inside a function?, commented?) for every import."""
    for mod, p in MODS.items():
        src = p.read_text()
        lines = src.splitlines()
        tree = ast.parse(src)
        funcs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        inner = {id(x) for f in funcs for x in ast.walk(f)}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                m = _resolve(node, mod, p.name == "__init__.py")
                subs = [f"{m}.{a.name}" for a in node.names if f"{m}.{a.name}" in MODS]
                targets = subs or [m]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            ln = lines[node.lineno - 1]
            above = lines[node.lineno - 2].strip() if node.lineno > 1 else ""
            yield mod, node.lineno, targets, id(node) in inner, "#" in ln or above.startswith("#")


DOC = PKG.parent / "docs" / "architecture.md"
LAYERS_MARK = "<!-- import layers"


def layers() -> list[list[str]]:
    """The "import layers" block of docs/architecture.md: one line per layer, bottom first;
    the packages of a line may import the lines above it, not each other."""
    lines = DOC.read_text().splitlines()
    i = next(k for k, ln in enumerate(lines) if ln.startswith(LAYERS_MARK))
    start = next(k for k in range(i + 1, len(lines)) if lines[k].startswith("```")) + 1
    end = next(k for k in range(start, len(lines)) if lines[k].startswith("```"))
    return [ln.split("#")[0].split() for ln in lines[start:end] if ln.split("#")[0].strip()]


def layer_of(mod: str) -> str:
    """`__main__` for an entry point (python -m), `skewscope` for the package itself, else
    the first subpackage (skewscope.outputs.topview -> outputs)."""
    parts = mod.split(".")
    if parts[-1] == "__main__":
        return "__main__"
    return parts[1] if len(parts) > 1 else "skewscope"


def test_the_layers_name_every_package_once():
    names = [n for layer in layers() for n in layer]
    assert len(names) == len(set(names)), f"a package on two lines: {names}"
    have = {layer_of(m) for m in MODS}
    assert set(names) == have, (f"docs/architecture.md import layers vs the packages: missing "
                                f"{sorted(have - set(names))}, no such package {sorted(set(names) - have)}")


def test_layer_direction():
    rank = {n: i for i, layer in enumerate(layers()) for n in layer}
    bad = []
    for mod, ln, targets, _, _ in _imports():
        a = layer_of(mod)
        for t in targets:
            if t not in MODS:
                continue
            b = layer_of(t)
            if a != b and rank[b] >= rank[a]:
                bad.append(f"{mod}:{ln} imports {t} ({a} may import only {[n for n in rank if rank[n] < rank[a]]})")
    assert bad == [], "imports against the layer order of docs/architecture.md:\n" + "\n".join(bad)


def test_no_import_cycles():
    graph: dict[str, set] = {m: set() for m in MODS}
    for mod, _, targets, _, _ in _imports():
        graph[mod] |= {t for t in targets if t in MODS and t != mod}
    # Tarjan's strongly connected components
    index, low, stack, on, cycles, n = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))
    for v in graph:
        if v not in index:
            visit(v)
    assert cycles == [], f"import cycles: {cycles}"


def test_function_level_imports_say_why():
    bad = [f"{m}:{ln} imports {t}" for m, ln, t, inner, commented in _imports() if inner and not commented]
    assert bad == [], "imports inside functions without a comment saying why (heavy/optional):\n" + "\n".join(bad)


def test_cli_import_is_light():
    code = ("import sys, skewscope.cli; heavy = [m for m in ('numba', 'rich', 'pyroute2', 'bcc', "
            "'prometheus_client', 'yaml', 'scapy', 'matplotlib') if m in sys.modules]; print(','.join(heavy))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "", f"`import skewscope.cli` loads {r.stdout.strip()}"


@pytest.mark.parametrize("mod", sorted(m for m in MODS if not m.endswith("__main__")))
def test_every_module_imports_and_says_what_it_is_for(mod):
    importlib.import_module(mod)
    doc = ast.get_docstring(ast.parse(MODS[mod].read_text()))
    assert doc and doc.strip(), f"{mod} has no docstring"


def test_every_command_is_listed():
    """cli.COMMANDS is the one list; main has exactly those commands, each found under its own
    name in its module, and only the command that runs is imported."""
    code = ("import sys, skewscope.cli as c; from click.testing import CliRunner; "
            "r = CliRunner().invoke(c.main, ['report', '--help']); assert r.exit_code == 0, r.output; "
            "print(','.join(sorted(m for m in sys.modules if m.startswith('skewscope.cli.'))))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "skewscope.cli.common,skewscope.cli.files", r.stdout
    from skewscope import cli
    names = cli.main.list_commands(None)
    assert names == sorted(cli.COMMANDS)
    assert {"report", "replay", "detach", "top", "capture", "diagnose", "watch", "export", "cluster", "mirror",
            "mitigate", "demo", "gen"} == set(names)
    for n in names:
        assert cli.main.get_command(None, n).name == n
    assert cli.main.get_command(None, "nosuch") is None
