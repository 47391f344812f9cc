"""`python -m skewscope.analysis.detectors [DOC]`: rewrite the generated tables of
docs/metrics.md -- "Findings" and "Onset", each between its BEGIN/END generated markers --
from the registry."""
from __future__ import annotations

import sys
from pathlib import Path

from skewscope.analysis.detectors import markdown_tables, onset_table

#: (begin marker prefix, end marker, the generator): the onset block's markers first (the
#: findings block's BEGIN prefix is a prefix of them)
BLOCKS = (("<!-- BEGIN generated onset", "<!-- END generated onset -->", onset_table),
          ("<!-- BEGIN generated from", "<!-- END generated -->", markdown_tables))


def block(text: str, begin: str, end: str) -> tuple[int, int]:
    """(start, end) of the generated text between a BEGIN line and its END marker."""
    a = text.index("\n", text.index(begin)) + 1
    return a, text.index(end, a)


def main(path: str = "docs/metrics.md") -> int:
    p = Path(path)
    text = p.read_text()
    new = text
    for begin, end, gen in BLOCKS:
        a, b = block(new, begin, end)
        new = new[:a] + gen() + new[b:]
    if new != text:
        tmp = p.with_suffix(p.suffix + ".tmp")
        tmp.write_text(new)
        tmp.replace(p)                       # atomic
    print(f"{p}: {'updated' if new != text else 'up to date'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:2]))
