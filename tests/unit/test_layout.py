"""ebpf/skewscope.h (the source of truth) vs skewscope/core/layout.py (its Python mirror).

A small C program including the header is compiled with gcc and prints sizeof/offsetof of
every member of every struct and the value of every #define; the test compares that with
the numpy dtypes and constants in layout.py: names, order, offsets, sizes, element sizes,
array lengths, struct sizes, values. Any drift in either direction fails.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from skewscope.core import layout as L

ROOT = Path(__file__).resolve().parents[2]
HEADER = ROOT / "ebpf" / "skewscope.h"

# C struct -> Python dtype mirror
STRUCTS = {
    "ss_flow_key": L.FLOW_KEY_DTYPE,
    "ss_flow_stats": L.FLOW_STATS_DTYPE,
    "ss_msg_rec": L.MSG_REC_DTYPE,
    "ss_replay": L.REPLAY_DTYPE,
}
# #defines that are not numeric constants (include guard)
NOT_CONSTANTS = {"SKEWSCOPE_H"}


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def parse_header():
    text = _strip_comments(HEADER.read_text())
    defines = [m.group(1) for m in re.finditer(r"^[ \t]*#[ \t]*define[ \t]+(\w+)(?:[ \t]+\S.*)?$", text, flags=re.M)]
    defines = [d for d in defines if d not in NOT_CONSTANTS]
    structs = {}
    for m in re.finditer(r"struct\s+(\w+)\s*\{(.*?)\}\s*;", text, flags=re.S):
        fields = []
        for decl in m.group(2).split(";"):
            decl = decl.strip()
            if not decl:
                continue
            fm = re.match(r"^(struct\s+\w+|\w+)\s+(\w+)\s*(\[\s*(\w+)\s*\])?$", decl)
            assert fm, f"cannot parse member declaration {decl!r} in struct {m.group(1)}"
            fields.append((fm.group(2), fm.group(1), fm.group(3) is not None))
        structs[m.group(1)] = fields
    return defines, structs


def c_program(defines, structs) -> str:
    out = ["#include <stdio.h>", "#include <stddef.h>",
           "typedef unsigned char __u8; typedef unsigned short __u16;",
           "typedef unsigned int __u32; typedef unsigned long long __u64;",
           "typedef unsigned short __be16; typedef unsigned int __be32;",
           f'#include "{HEADER}"', "int main(void) {"]
    for d in defines:
        out.append(f'  printf("define {d} %llu\\n", (unsigned long long)({d}));')
    for s, fields in structs.items():
        out.append(f'  printf("struct {s} %zu\\n", sizeof(struct {s}));')
        for name, _t, is_arr in fields:
            m = f"((struct {s} *)0)->{name}"
            elem = f"sizeof({m}[0])" if is_arr else f"sizeof({m})"
            out.append(f'  printf("field {s} {name} %zu %zu %zu\\n", offsetof(struct {s}, {name}), '
                       f'sizeof({m}), {elem});')
    out += ["  return 0;", "}"]
    return "\n".join(out) + "\n"


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory):
    gcc = shutil.which("gcc") or shutil.which("cc")
    assert gcc, "gcc not found: `make setup` installs it (tools/setup.sh PKGS)"
    defines, structs = parse_header()
    d = tmp_path_factory.mktemp("layout")
    src, exe = d / "layout.c", d / "layout"
    src.write_text(c_program(defines, structs))
    subprocess.run([gcc, "-std=c11", "-Wall", "-Werror", "-o", str(exe), str(src)], check=True,
                   capture_output=True, text=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    consts, sizes, fields = {}, {}, {}
    for line in out.splitlines():
        kind, *rest = line.split()
        if kind == "define":
            consts[rest[0]] = int(rest[1])
        elif kind == "struct":
            sizes[rest[0]] = int(rest[1])
            fields[rest[0]] = []
        else:
            fields[rest[0]].append((rest[1], int(rest[2]), int(rest[3]), int(rest[4])))
    return {"defines": defines, "structs": structs, "consts": consts, "sizes": sizes, "fields": fields}


def test_header_parsed_completely(c_layout):
    # guard against a parser that silently sees nothing
    assert set(c_layout["sizes"]) == set(STRUCTS), f"structs in header: {sorted(c_layout['sizes'])}"
    assert len(c_layout["consts"]) > 60


def test_every_define_has_the_same_value_in_python(c_layout):
    bad = []
    for name, val in c_layout["consts"].items():
        assert name.startswith("SS_"), f"header constant {name} lacks the SS_ prefix"
        py = name[3:]
        if not hasattr(L, py):
            bad.append(f"{name} = {val}: no layout.{py}")
        elif int(getattr(L, py)) != val:
            bad.append(f"{name} = {val} but layout.{py} = {getattr(L, py)}")
    assert not bad, "\n".join(bad)


def test_every_python_constant_exists_in_the_header(c_layout):
    """Reverse direction: a constant added to layout.py (in the header's families) must be
    in the header too."""
    families = ("OPC_", "OPT_", "G_", "FF_", "PSN_", "MACCTL_", "ETH_P_")
    singles = ("LAYOUT_VERSION", "ROCE_UDP_PORT", "MAX_VLAN", "OPCODE_CNP", "N_OPCLASS", "MSG_SLOTS", "GAP_SLOTS")
    names = [n for n in dir(L) if n.isupper() and isinstance(getattr(L, n), int)
             and (n.startswith(families) or n in singles)]
    missing = [n for n in names if "SS_" + n not in c_layout["consts"]]
    assert not missing, f"layout.py constants missing from skewscope.h: {missing}"


def _np_fields(dt: np.dtype):
    """(name, offset, total size, element size) in offset order."""
    out = []
    for name in dt.names:
        sub, off = dt.fields[name][:2]
        if sub.subdtype is not None:
            base, shape = sub.subdtype
            out.append((name, off, sub.itemsize, base.itemsize))
        else:
            out.append((name, off, sub.itemsize, sub.itemsize))
    return sorted(out, key=lambda x: x[1])


@pytest.mark.parametrize("struct", sorted(STRUCTS))
def test_struct_layout_matches(c_layout, struct):
    dt = STRUCTS[struct]
    assert c_layout["sizes"][struct] == dt.itemsize, \
        f"sizeof(struct {struct}) = {c_layout['sizes'][struct]} but the dtype is {dt.itemsize} bytes"
    c = c_layout["fields"][struct]
    py = _np_fields(dt)
    assert [f[0] for f in c] == [f[0] for f in py], f"member names/order differ:\n C  {[f[0] for f in c]}\n py {[f[0] for f in py]}"
    for cf, pf in zip(c, py):
        assert cf == pf, f"struct {struct} member {cf[0]}: C (offset, size, elem) = {cf[1:]}, Python = {pf[1:]}"


@pytest.mark.parametrize("struct", sorted(STRUCTS))
def test_no_implicit_padding(c_layout, struct):
    """The header's rule: every byte is a named member (explicit _pad), so the BPF target,
    gcc and numpy cannot disagree about holes."""
    fields = c_layout["fields"][struct]
    pos = 0
    for name, off, size, _ in fields:
        assert off == pos, f"struct {struct}: hole before {name} ({pos}..{off})"
        pos = off + size
    assert pos == c_layout["sizes"][struct], f"struct {struct}: tail padding {pos}..{c_layout['sizes'][struct]}"


def test_nested_key_matches(c_layout):
    """ss_msg_rec.key is a struct ss_flow_key in both."""
    assert L.MSG_REC_DTYPE.fields["key"][0] == L.FLOW_KEY_DTYPE
    assert [f for f in c_layout["fields"]["ss_msg_rec"] if f[0] == "key"][0][2] == c_layout["sizes"]["ss_flow_key"]


def test_histogram_arrays_go_last(c_layout):
    names = [f[0] for f in c_layout["fields"]["ss_flow_stats"]]
    assert names[-2:] == ["msg_hist", "gap_hist"]


def test_category_names_cover_every_category():
    assert len(L.CATEGORY_NAMES) == L.G_NCAT
    cats = {getattr(L, n) for n in dir(L) if n.startswith("G_") and getattr(L, n) < L.G_NCAT and n != "G_NCAT"}
    assert cats == set(range(L.G_NCAT))


def test_snapshot_flow_dtype_is_key_plus_public_stats():
    """The Snapshot's flow table is the key + stats minus padding/private assembly state."""
    names = list(L.FLOW_DTYPE.names)
    key = [n for n in L.FLOW_KEY_DTYPE.names if n != "_pad"]
    assert names[:len(key)] == key
    for n in names[len(key):]:
        assert n in L.FLOW_STATS_DTYPE.names and L.FLOW_DTYPE[n] == L.FLOW_STATS_DTYPE[n]
