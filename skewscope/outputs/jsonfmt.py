"""json.dumps(obj, indent=N) to the byte, at the C encoder's speed.

Python 3.11's json module encodes with its C encoder only without indent; with indent it
walks the document in Python generators (~10 ms of a 300 KB report, most of `report
--json`'s formatting). Here the C encoder writes the compact form with the indented form's
separators ("," and ": "), and numpy inserts the line breaks and indentation: the indented
form is exactly the compact one with "\\n" + level x indent spaces after every "[" / "{"
that opens a non-empty container and after every ",", and before the "]" / "}" that
closes a non-empty one. ensure_ascii output is ASCII with no raw newline inside a string;
the brackets and commas inside strings are told apart by the quotes that are not escaped.
"""
from __future__ import annotations

import json

import numpy as np

_COMPACT = json.JSONEncoder(separators=(",", ": "))   # ensure_ascii, allow_nan, check_circular as json.dumps'

_QUOTE, _BSLASH = ord('"'), ord("\\")
_STRUCT = np.zeros(256, dtype=np.bool_)        # the characters that may break a line
_STRUCT[[ord(c) for c in "[]{},"]] = True
_STEP = np.zeros(256, dtype=np.int64)          # their effect on the nesting level
_STEP[[ord("["), ord("{")]] = 1
_STEP[[ord("]"), ord("}")]] = -1


def dumps(obj, indent=2) -> str:
    """json.dumps(obj, indent=indent) (sort_keys False, the default separators): the same
    string. indent: a number of spaces (a string indent goes through json.dumps)."""
    if not isinstance(indent, int) or isinstance(indent, bool) or indent < 0:
        return json.dumps(obj, indent=indent)
    b = np.frombuffer(_COMPACT.encode(obj).encode("ascii"), dtype=np.uint8)
    n = len(b)
    c = np.flatnonzero(_STRUCT[b])                 # candidates, in strings too
    q = np.flatnonzero(b == _QUOTE)
    if len(q):
        bs = np.flatnonzero(b == _BSLASH)
        if len(bs):
            # an escaped quote (\") is preceded by an odd run of backslashes (\\ is one
            # escaped backslash): keep the quotes that open or close a string
            first = np.concatenate([[True], np.diff(bs) > 1])      # each run's first backslash
            start = np.maximum.accumulate(np.where(first, bs, 0))  # ... for every backslash
            k = np.searchsorted(bs, q - 1)                          # the backslash just before q
            k = np.minimum(k, len(bs) - 1)
            prev = bs[k] == q - 1
            run = np.where(prev, q - 1 - start[k] + 1, 0)
            q = q[(run & 1) == 0]
        c = c[(np.searchsorted(q, c) & 1) == 0]      # an even number of quotes before it
    step = _STEP[b[c]]
    depth = np.cumsum(step)                          # the level after each character
    # "[]" / "{}": an opener directly followed by a closer holds nothing (no line break)
    empty = np.zeros(len(c), dtype=np.bool_)
    empty[:-1] = (step[:-1] == 1) & (step[1:] == -1) & (c[1:] == c[:-1] + 1)
    empty[1:] |= empty[:-1] & (step[:-1] == 1)
    brk = ~empty
    after = brk & (step >= 0)                        # openers and commas: break after them
    pts = np.where(after, c + 1, c)[brk]             # insertion points, increasing
    width = 1 + indent * depth[brk]
    # every original character moves right by the widths inserted at or before it
    seg = np.diff(np.concatenate([[0], pts, [n]]))
    shift = np.concatenate([[0], np.cumsum(width)])
    newpos = np.arange(n, dtype=np.int64) + np.repeat(shift, seg)
    out = np.full(n + int(shift[-1]), ord(" "), dtype=np.uint8)
    out[newpos] = b
    out[newpos[pts] - width] = ord("\n")
    return out.tobytes().decode("ascii")
