"""`python -m skewscope.analysis.detectors [DOC ...]`: rewrite the generated tables of the
docs from the registry -- docs/metrics.md "Findings" and "Onset", docs/feedback.md "Kinds"
-- each between its BEGIN/END generated markers (default: every file of DOCS)."""
from __future__ import annotations

import sys
from pathlib import Path

from skewscope.analysis.detectors import kinds_table, markdown_tables, onset_table

#: (begin marker prefix, end marker, the generator): the onset block's markers first (the
#: findings block's BEGIN prefix is a prefix of them)
BLOCKS = (("<!-- BEGIN generated onset", "<!-- END generated onset -->", onset_table),
          ("<!-- BEGIN generated from", "<!-- END generated -->", markdown_tables))
KIND_BLOCKS = (("<!-- BEGIN generated kinds", "<!-- END generated kinds -->", kinds_table),)
#: the generated documents (relative to the checkout) and their blocks
DOCS = {"docs/metrics.md": BLOCKS, "docs/feedback.md": KIND_BLOCKS}


def block(text: str, begin: str, end: str) -> tuple[int, int]:
    """(start, end) of the generated text between a BEGIN line and its END marker."""
    a = text.index("\n", text.index(begin)) + 1
    return a, text.index(end, a)


def rewrite(path: str, blocks) -> bool:
    """Rewrite one document's blocks (atomically); True when it changed."""
    p = Path(path)
    text = p.read_text()
    new = text
    for begin, end, gen in blocks:
        a, b = block(new, begin, end)
        new = new[:a] + gen() + new[b:]
    if new != text:
        tmp = p.with_suffix(p.suffix + ".tmp")
        tmp.write_text(new)
        tmp.replace(p)                       # atomic
    return new != text


def main(*paths: str) -> int:
    for path in paths or tuple(DOCS):
        blocks = DOCS.get(path) or next((b for d, b in DOCS.items() if path.endswith(Path(d).name)), BLOCKS)
        print(f"{path}: {'updated' if rewrite(path, blocks) else 'up to date'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
