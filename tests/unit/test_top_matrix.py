"""`top`'s node x node matrix view (key m, --matrix) on generator traffic: the matrix's
numbers against the generator's truth (data payload per node pair, summed from the truth's
flows), the hot column against the truth's hot node (presets and variants: other node
counts, sizes, MTUs, hot nodes), the plain table parsed back, the rich heatmap bounded
to the terminal at 2, 8 and 64 nodes, and the key toggling."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import genlib

from skewscope import gen as skewgen
from skewscope.cli import main
from skewscope.outputs import topmatrix as M
from skewscope.outputs import toprich
from skewscope.outputs import topview as V

SUFFIX = {"K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}


def a2a(nodes, hot, factor=4.0, per_peer="128KiB", mtu=4096, combine=True, ip_version=4):
    return {"name": f"a2a-{nodes}-hot{hot}", "nodes": nodes, "iterations": 1, "mtu": mtu, "ip_version": ip_version,
            "workloads": [{"kind": "all_to_all", "bytes_per_peer": per_peer, "combine": combine}],
            "pathologies": [{"kind": "hot_expert", "node": hot, "factor": factor}]}


_variants: dict = {}


def generated(sc, seed=0):
    """(truth, Snapshot) of a scenario dict through the offline parser (cached)."""
    key = (repr(sorted(sc.items())), seed)
    if key not in _variants:
        import json
        out = str(Path(genlib._workdir()) / f"{sc['name']}-{seed}.pcap")
        skewgen.write(sc, out, seed=seed, snaplen=128)
        with open(skewgen.truth_path(out)) as fh:
            truth = json.load(fh)
        _variants[key] = (truth, genlib.snapshot_of_pcap(out))
        Path(out).unlink()
    return _variants[key]


def truth_matrix(truth) -> dict:
    """{(src ip, dst ip): data payload bytes} from the generator's flows."""
    m: dict = {}
    for f in truth["flows"]:
        if f["role"] == "data":
            m[(f["src"], f["dst"])] = m.get((f["src"], f["dst"]), 0) + f["payload_bytes"]
    return m


def truth_hot(truth) -> str:
    (p,) = [p for p in truth["pathologies"] if p["kind"] in ("hot_expert", "hot_destination")]
    (ip,) = p["entities"]["ips"]
    return ip


def model(snap, dt=1.0, **kw):
    st = V.ViewState(matrix=True, **kw)
    return V.build_model(snap, dt, st)


def num(s: str) -> float:
    s = s.rstrip("*+ ")
    if s == "-":
        return 0.0
    return float(s[:-1]) * SUFFIX[s[-1]] if s[-1] in SUFFIX else float(s)


def parse_plain(lines: list[str]) -> dict:
    """The plain matrix block read back as a user would: labels (with the common prefix the
    notes name), cells, the OUT column and the IN row, the marked cells."""
    i = next(k for k, ln in enumerate(lines) if ln.startswith("SRC\\DST"))
    prefix = ""
    for ln in lines:
        mt = re.match(r"labels: the address after (\S+)$", ln)
        if mt:
            prefix = mt.group(1)
    head = lines[i].split()
    cols = head[1:-1]
    assert head[-1] == "OUT"
    full = [c if c == "other" else prefix + c for c in cols]
    cells, out, inn, marks = {}, {}, None, {}
    for ln in lines[i + 1:]:
        parts = ln.split()
        if parts[0] == "IN":
            inn = dict(zip(full, [num(x) for x in parts[1:-1]]))
            inn["total"] = num(parts[-1])
            break
        src = parts[0] if parts[0] == "other" else prefix + parts[0]
        assert len(parts) == len(cols) + 2, ln
        for d, x in zip(full, parts[1:-1]):
            cells[(src, d)] = num(x)
            if x.endswith(("*", "+")):
                marks[(src, d)] = x[-1]
        out[src] = num(parts[-1])
    return {"cols": full, "cells": cells, "out": out, "in": inn, "marks": marks}


def close(a, b, rel=0.052):
    """fmt_num keeps 2-3 significant digits: 10.49K shows as 10K (4.7% off)."""
    return abs(a - b) <= rel * max(abs(b), 1e-9)


# ---- the hot column is the truth's hot node --------------------------------------------------
CASES = [("preset", "moe-hot-expert"), ("preset", "ep-decode-hot-expert"), ("preset", "demo-mix"),
         ("variant", a2a(4, 2, per_peer="64KiB", mtu=1024)),
         ("variant", a2a(12, 9, factor=3.0, per_peer="32KiB", mtu=2048)),
         ("variant", a2a(6, 0, factor=2.0, per_peer="256KiB", combine=False)),
         ("variant", a2a(5, 3, per_peer="16KiB", ip_version=6))]


@pytest.mark.parametrize("kind,sc", CASES, ids=[c[1] if c[0] == "preset" else c[1]["name"] for c in CASES])
def test_hottest_column_is_the_truths_hot_node_and_cells_match_the_truth(kind, sc):
    truth, snap = genlib.get(sc) if kind == "preset" else generated(sc)
    hot = truth_hot(truth)
    dt = float(snap.meta.get("duration_s") or 1.0)
    m = model(snap, dt)
    mv = m.matrix
    assert mv is not None and not mv.error
    tm = truth_matrix(truth)
    assert set(mv.ips) == {a for a, _ in tm} | {b for _, b in tm}
    # every cell = the truth's data bytes of that node pair, as bit/s over dt
    for i, a in enumerate(mv.ips):
        for j, b in enumerate(mv.ips):
            assert mv.bps[i, j] == pytest.approx(tm.get((a, b), 0) * 8 / dt, rel=1e-9), (a, b)
    assert mv.ips[mv.hot_dst] == hot
    # and on screen: the plain table's largest IN column is the hot node, named in the summary
    lines = V.plain_lines(m)
    assert all(len(ln) <= V.PLAIN_WIDTH for ln in lines), lines
    p = parse_plain(lines)
    inn = {k: v for k, v in p["in"].items() if k not in ("total", "other")}
    assert max(inn, key=inn.get) == hot, lines
    assert any(ln.startswith(f"hot destination {hot}:") for ln in lines), lines


def test_healthy_alltoall_has_no_hot_destination():
    truth, snap = genlib.get("alltoall-healthy")
    lines = V.plain_lines(model(snap))
    assert not any(ln.startswith("hot destination") for ln in lines)
    assert any(ln.startswith("destinations even") for ln in lines), lines


# ---- plain table: parses back to the numbers -------------------------------------------------
@pytest.mark.parametrize("sc", [a2a(3, 1, per_peer="64KiB"), a2a(8, 5), a2a(64, 37, per_peer="4KiB", combine=False)],
                         ids=["3-nodes", "8-nodes", "64-nodes"])
def test_plain_table_parses_back_to_the_truth_matrix(sc):
    truth, snap = generated(sc, seed=2)
    tm = truth_matrix(truth)
    ips = sorted({a for a, _ in tm} | {b for _, b in tm}, key=lambda s: tuple(int(x) for x in s.split(".")))
    lines = V.plain_lines(model(snap, dt=0.5))
    assert all(len(ln) <= V.PLAIN_WIDTH for ln in lines), lines
    p = parse_plain(lines)
    shown = [c for c in p["cols"] if c != "other"]
    rest = [ip for ip in ips if ip not in shown]
    assert ("other" in p["cols"]) == bool(rest)
    assert shown == [ip for ip in ips if ip in shown]            # address order

    def rate(srcs, dsts):
        return sum(tm.get((a, b), 0) for a in srcs for b in dsts) * 8 / 0.5

    for (a, b), v in p["cells"].items():
        want = rate(rest if a == "other" else [a], rest if b == "other" else [b])
        assert close(v, want), (a, b, v, want)
    for a, v in p["out"].items():
        assert close(v, rate(rest if a == "other" else [a], ips)), a
    assert close(p["in"]["total"], rate(ips, ips))
    # the hottest cell (*) is the truth's largest pair; every + is its source's largest
    (star,) = [k for k, x in p["marks"].items() if x == "*"]
    assert tm[star] == max(tm.values())
    for (a, b), x in p["marks"].items():
        assert tm[(a, b)] == max(v for (s, _), v in tm.items() if s == a)
    if rest:                                                     # 64 nodes at 79 columns
        hot = truth_hot(truth)
        assert hot in shown and f"top {len(shown)} of {len(ips)} nodes" in "\n".join(lines)


# ---- rich heatmap: bounded to the terminal -----------------------------------------------------
@pytest.mark.parametrize("nodes,hot", [(2, 1), (8, 5), (64, 37)])
@pytest.mark.parametrize("width,height", [(80, 30), (120, 45), (200, 60)])
def test_heatmap_stays_within_the_terminal(nodes, hot, width, height):
    from rich.console import Console

    truth, snap = generated(a2a(nodes, hot, per_peer="4KiB" if nodes > 8 else "64KiB",
                                 combine=2 < nodes <= 8), seed=3)      # 2 nodes + combine = symmetric
    m = model(snap)
    max_rows = max(3, height - 16 - M.MATRIX_LINES)
    text = toprich.render_matrix(m.matrix, width, max_rows=max_rows)
    lines = text.plain.split("\n")
    assert max(len(ln) for ln in lines) <= width, max(lines, key=len)
    assert len(lines) <= max_rows + M.MATRIX_LINES + 1
    hot_ip = truth_hot(truth)
    head = next(ln for ln in lines if ln.startswith("SRC\\DST")).split()[1:-1]
    pre = next((ln.split()[-1] for ln in lines if ln.startswith("labels: the address after")), "")
    assert hot_ip in [pre + c for c in head]                   # the hot node always has its column
    if nodes == 64:
        assert "other" in head and "of 64 nodes by traffic" in text.plain
    elif nodes == 2 or height >= 45:                            # 8 nodes fit 45 lines, not 30
        assert "other" not in head and len(head) == nodes, head
    # the hot column's header carries the highlight style; the cells have backgrounds
    spans = [(text.plain[s.start:s.end], str(s.style)) for s in text.spans]
    assert any(txt.strip() == hot_ip[len(pre):] and "reverse" in sty for txt, sty in spans), spans[:20]
    coloured = sum(" on #" in sty for _, sty in spans)
    assert coloured >= len(head) * (len(head) - 1), coloured       # every off-diagonal cell + legend
    # the whole screen fits as well (rich would crop a line silently; measure before it does)
    con = Console(width=width, height=height, record=True, force_terminal=True, color_system="truecolor")
    con.print(toprich.render_rich(m, height=height, width=width))
    assert "node matrix" in con.export_text()


def test_colour_scale_orders_cells_by_log_rate():
    truth, snap = generated(a2a(6, 4, per_peer="64KiB"), seed=1)
    mv = model(snap).matrix
    scale = M.heat_scale(mv.bps)
    v = mv.bps[mv.bps > 0]
    idx = np.array([M.heat_index(x, scale) for x in v])
    assert idx[np.argmax(v)] == len(M.HEAT) - 1
    assert all(idx[a] <= idx[b] for a in range(len(v)) for b in range(len(v)) if v[a] < v[b])


# ---- keys, views, options -----------------------------------------------------------------------
def test_key_m_toggles_the_matrix_and_keeps_the_other_keys():
    truth, snap = genlib.get("moe-hot-expert")
    st = V.ViewState()
    m = V.build_model(snap, 1.0, st)
    assert m.matrix is None and m.rows
    st.key("m")
    m = V.build_model(snap, 1.0, st)
    assert m.matrix is not None and m.matrix.ips[m.matrix.hot_dst] == truth_hot(truth)
    plain = "\n".join(V.plain_lines(m))
    assert "node matrix" in plain and V.PLAIN_HEADER not in plain
    for k in ("s", "r", "c", "p"):                                # still work in the matrix view
        before = (st.sort, st.reverse, st.cumulative, st.paused)
        st.key(k)
        assert (st.sort, st.reverse, st.cumulative, st.paused) != before
    assert st.matrix
    m = V.build_model(snap, 2.0, st)                              # c: cumulative view's matrix
    assert m.matrix.cumulative and "since start" in V.plain_lines(m)[2]
    st.key("/")
    st.key("m")                                                   # typed into the filter, not a toggle
    assert st.matrix and st.editing == "m"
    st.key("esc")
    st.key("m")
    assert not st.matrix
    m = V.build_model(snap, 1.0, st)
    assert m.matrix is None and V.PLAIN_HEADER in V.plain_lines(m)
    assert "m node matrix" in V.HELP


def test_filter_restricts_the_matrix_to_the_nodes_flows():
    truth, snap = genlib.get("moe-hot-expert")
    hot = truth_hot(truth)
    mv = model(snap, filter=hot).matrix
    tm = truth_matrix(truth)
    for i, a in enumerate(mv.ips):
        for j, b in enumerate(mv.ips):
            want = tm.get((a, b), 0) if hot in (a, b) else 0
            assert mv.bps[i, j] == pytest.approx(want * 8, rel=1e-9)


def test_sampled_rates_are_scaled():
    truth, snap = genlib.get("moe-hot-expert")
    from skewscope.core.snapshot import Snapshot
    s4 = Snapshot(flows=snap.flows, events=snap.events, globals=snap.globals, meta=dict(snap.meta, sample_n=4))
    a, b = model(snap).matrix, model(s4).matrix
    assert np.allclose(b.bps, 4 * a.bps)


def test_cli_help_lists_matrix():
    r = CliRunner().invoke(main, ["top", "--help"])
    assert r.exit_code == 0
    assert "--matrix" in r.output and "m node x node matrix" in r.output


@pytest.mark.parametrize("nodes,cold", [(4, (2, 3)), (7, (5, 1))])
def test_a_cold_link_is_the_darkest_cell_and_named(nodes, cold):
    """An all-to-all whose one pair carries a quarter of the others' bytes (the generator's
    explicit volume matrix): that cell gets the coldest colour and the summary names it."""
    vol = [[0 if i == j else (16384 if (i, j) == cold else 65536) for j in range(nodes)] for i in range(nodes)]
    sc = {"name": f"a2a-cold-{nodes}", "nodes": nodes, "iterations": 1,
          "workloads": [{"kind": "all_to_all", "matrix": vol}]}
    truth, snap = generated(sc)
    mv = model(snap).matrix
    a, b = (f"10.0.0.{cold[0] + 1}", f"10.0.0.{cold[1] + 1}")
    assert truth_matrix(truth)[(a, b)] * 4 == truth_matrix(truth)[(b, a)]
    i, j = mv.ips.index(a), mv.ips.index(b)
    scale = M.heat_scale(mv.bps)
    colours = {(p, q): M.heat_index(mv.bps[p, q], scale) for p in range(nodes) for q in range(nodes) if p != q}
    assert colours[(i, j)] == min(colours.values()) < max(colours.values())
    assert sum(c == colours[(i, j)] for c in colours.values()) == 1
    lines = V.plain_lines(model(snap))
    assert any(f"coldest link {a}->{b}" in ln for ln in lines), lines
    assert not any(ln.startswith("hot destination") for ln in lines)     # nobody receives more than the mean
