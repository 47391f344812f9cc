"""`python -m skewscope.analysis.detectors [DOC]`: rewrite the generated tables of
docs/metrics.md "Findings" (between its BEGIN/END generated markers) from the registry."""
from __future__ import annotations

import sys
from pathlib import Path

from skewscope.analysis.detectors import markdown_tables

BEGIN = "<!-- BEGIN generated"
END = "<!-- END generated -->"


def main(path: str = "docs/metrics.md") -> int:
    p = Path(path)
    text = p.read_text()
    a = text.index("\n", text.index(BEGIN)) + 1
    b = text.index(END)
    new = text[:a] + markdown_tables() + text[b:]
    if new != text:
        tmp = p.with_suffix(p.suffix + ".tmp")
        tmp.write_text(new)
        tmp.replace(p)                       # atomic
    print(f"{p}: {'updated' if new != text else 'up to date'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:2]))
