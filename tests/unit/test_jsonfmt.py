"""outputs.jsonfmt.dumps is json.dumps(obj, indent=N) to the character: random documents whose
strings hold the characters the line breaking looks at (quotes, backslash runs, brackets,
commas, newlines, non-ASCII), empty and nested containers, non-string keys, NaN/inf."""
from __future__ import annotations

import json
import random

import pytest

from skewscope.outputs.jsonfmt import dumps

ALPHA = ['"', "\\", "[", "]", "{", "}", ",", ":", " ", "a", "\n", "\u00e9", "\t", "\\\\", '\\"', "0", "\u2028"]


def _doc(rnd, depth=0):
    r = rnd.random()
    if depth > 4 or r < 0.4:
        return rnd.choice(["".join(rnd.choice(ALPHA) for _ in range(rnd.randint(0, 8))), rnd.randint(-5, 10 ** 20),
                           rnd.random() * 1e10, None, True, False, float("nan"), -float("inf"), 1e-300, 0.1])
    if r < 0.7:
        return [_doc(rnd, depth + 1) for _ in range(rnd.randint(0, 4))]
    keys = ["".join(rnd.choice(ALPHA) for _ in range(rnd.randint(0, 6))) for _ in range(rnd.randint(0, 4))]
    d = {k: _doc(rnd, depth + 1) for k in keys}
    if rnd.random() < 0.2:
        d.update({1: 2, 2.5: [], None: {}, True: [[]]})
    return d


@pytest.mark.parametrize("indent", [0, 1, 2, 4])
def test_random_documents(indent):
    rnd = random.Random(indent)
    for _ in range(3000):
        o = _doc(rnd)
        assert dumps(o, indent) == json.dumps(o, indent=indent)


@pytest.mark.parametrize("o", [{}, [], "s", 3, None, {"a": []}, {"a": {}}, [[[]]], [{}, []],
                               {"x\"y[": ["]\\", "\\\"},", 1.5]}, ("t", ("u",)), {"k": "\\\\\\\"]"}])
def test_edges(o):
    for indent in (0, 2):
        assert dumps(o, indent) == json.dumps(o, indent=indent)


def test_string_indent_and_errors_as_json():
    o = {"a": [1, {"b": 2}]}
    assert dumps(o, "\t") == json.dumps(o, indent="\t")
    with pytest.raises(TypeError):
        dumps({"a": object()})
    with pytest.raises(ValueError):
        c = []
        c.append(c)
        dumps(c)
