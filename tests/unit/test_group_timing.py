"""Two jobs on one fabric: timing is per group (issue 25 class 7). A training ring (3
iterations, 40 ms apart) next to a TP decode group: each group keeps its own period,
iterations or tokens and workload, in `collectives[i].timing` / `.metrics.workload`, in
report / diagnose (human and --json), top and the HTML page. Checked against the
generator's truth (the ring's iteration starts, the decode group's token period and token
count), over ring sizes (the issue's small ring that was printed as "decode ... 25
tokens/s"), protocols, channels, decode group sizes, workload order, IPv6 and seeds."""
from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest
from click.testing import CliRunner
from genlib import run

from skewscope import gen as skewgen
from skewscope.analysis import analyze
from skewscope.cli import main
from skewscope.gen.presets import TPD
from skewscope.outputs import topview
from skewscope.outputs.report import analysis_lines
from skewscope.sources.offline import parse_file



def scenario(ring_bytes="64KiB", protocol="simple", channels=1, train=(0, 1, 2, 3), dec=(4, 5, 6, 7), tokens=6,
             decode_first=False, ipv=4, period_ms=40.0):
    wr = {"kind": "ring_allreduce", "members": list(train), "bytes": ring_bytes, "protocol": protocol,
          "channels": channels}
    wd = dict(TPD, members=list(dec), tokens=tokens)
    return {"nodes": max(train + dec) + 1, "ip_version": ipv, "iterations": 3, "period_ms": period_ms,
            "jitter": 0.01, "workloads": [wd, wr] if decode_first else [wr, wd]}


CASES = [
    (scenario(), 0),                                                  # the issue's: 16 KiB ring messages
    (scenario("32KiB", "ll"), 1),
    (scenario("8MiB"), 2),
    (scenario("1MiB", "ll128", 2), 3),
    (scenario("64KiB", dec=(4, 5), tokens=12, decode_first=True), 4),
    (scenario("256KiB", train=(0, 1, 2, 3, 4, 5), dec=(6, 7, 8), tokens=8, ipv=6), 5),
    (scenario("2MiB", "simple", 2, train=(3, 4, 5), dec=(0, 1, 2), tokens=10, period_ms=25.0), 6),
]


def truth_groups(truth):
    """(training: members, period s, iterations), (decode: members, token period s, tokens)."""
    ring = next(g for g in truth["groups"] if g["kind"] == "ring_allreduce")
    starts = np.asarray(ring["details"]["iteration_starts_ns"], dtype=float)
    tg = next(g for g in truth["inference"]["groups"] if g["kind"] == "decode_tp")
    dmem = next(g for g in truth["groups"] if g["id"] == tg["group"])["members"]
    return ((set(ring["members"]), float(np.median(np.diff(starts))) / 1e9, len(starts)),
            (set(dmem), tg["token_period_s"], tg["tokens"]))


def group_of(an, members):
    i = next(i for i, c in enumerate(an["collectives"]) if set(c["members"]) == members)
    return i, an["collectives"][i]


@pytest.mark.parametrize("sc,seed", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_each_group_keeps_its_own_timing(sc, seed, tmp_path_factory):
    truth, an, _ = run(sc, seed)
    (tm, tper, tit), (dm, dper, dtok) = truth_groups(truth)
    ti, tc = group_of(an, tm)
    di, dc = group_of(an, dm)
    # training: its iterations, no tokens
    assert tc["metrics"]["workload"] == "training"
    t = tc["timing"]
    assert t["group"] == ti and t["workload"] == "training" and t.get("tokens_per_s") is None
    assert t["period_s"] == pytest.approx(tper, rel=0.03) and t["iterations"] == tit
    # decode: its tokens
    assert dc["metrics"]["workload"] == "decode"
    d = dc["timing"]
    assert d["group"] == di and d["workload"] == "decode"
    assert d["tokens_per_s"] == pytest.approx(1 / dper, rel=0.03) and d["iterations"] == dtok
    assert d["period_s"] == pytest.approx(dper, rel=0.03)
    # the capture-level timing is one of them, unchanged in shape
    assert an["timing"] == (tc["timing"] if ti < di else dc["timing"])


def _block(lines, members):
    """The lines of one group in analysis_lines: its header and the indented lines under it."""
    head = next(k for k, x in enumerate(lines) if x.startswith("  ") and not x.startswith("   ")
                and all(m in x for m in members))
    out = [lines[head]]
    for x in lines[head + 1:]:
        if not x.startswith("    "):
            break
        out.append(x)
    return out


@pytest.mark.parametrize("sc,seed", CASES[:3] + CASES[4:5], ids=["case0", "case1", "case2", "case4"])
def test_report_diagnose_top_print_per_group(sc, seed, tmp_path_factory):
    truth, an, path = run(sc, seed)
    (tm, tper, tit), (dm, dper, dtok) = truth_groups(truth)
    lines = analysis_lines(an)
    tb = _block(lines, sorted(tm))
    db = _block(lines, sorted(dm))
    assert "training" in tb[0] and "decode" in db[0]
    per = [float(m.group(1)) for x in tb for m in [re.search(r"^period ([0-9.]+) ms", x.strip())] if m]
    assert len(per) == 1 and per[0] == pytest.approx(tper * 1e3, rel=0.03), tb
    assert not any("tokens/s" in x for x in tb), tb
    tok = [float(m.group(1)) for x in db for m in [re.search(r"^token: every .* \(([0-9.]+) tokens/s\)", x.strip())] if m]
    assert len(tok) == 1 and tok[0] == pytest.approx(1 / dper, rel=0.03), (db, 1 / dper)
    assert any(re.search(rf"-> token [0-9.]+ ms .* x{dtok}$", x) for x in db), db
    assert any(re.search(rf"-> iteration [0-9.]+ ms .* x{tit}$", x) for x in tb), tb
    # diagnose: the same lines, and collectives[i].timing in --json
    r = CliRunner().invoke(main, ["diagnose", path])
    assert r.exit_code == 0, r.output
    for x in tb + db:
        assert x in r.output, (x, r.output)
    r = CliRunner().invoke(main, ["diagnose", path, "--json"])
    doc = json.loads(r.output)
    wl = {frozenset(c["members"]): (c["workload"], (c["timing"] or {}).get("tokens_per_s")) for c in doc["collectives"]}
    assert wl[frozenset(tm)] == ("training", None)
    assert wl[frozenset(dm)][0] == "decode" and wl[frozenset(dm)][1] == pytest.approx(1 / dper, rel=0.03)
    # top: each group's timing, with its workload
    tl = topview.timing_lines(an)
    ti, _ = group_of(an, tm)
    di, _ = group_of(an, dm)
    tpos = next(k for k, x in enumerate(tl) if x.startswith(f"group {ti} ") and "training" in x)
    dpos = next(k for k, x in enumerate(tl) if x.startswith(f"group {di} ") and "decode" in x)
    dblock = tl[dpos:] if dpos > tpos else tl[dpos:tpos]
    tblock = tl[tpos:] if tpos > dpos else tl[tpos:dpos]
    assert any("tokens/s" in x for x in dblock) and not any("tokens/s" in x for x in tblock)
    cl = topview.collective_lines(an)
    assert any("training" in x for x in cl) and any("decode" in x for x in cl)


def test_html_timing_per_group(tmp_path_factory):
    pytest.importorskip("matplotlib")
    truth, an, path = run(*CASES[0])
    out = os.path.join(str(tmp_path_factory.mktemp("html")), "r.html")
    r = CliRunner().invoke(main, ["report", path, "--html", out])
    assert r.exit_code == 0, r.output
    html = open(out).read()
    (tm, tper, tit), (dm, dper, dtok) = truth_groups(truth)
    sec = html[html.index('id="timing"'):]
    assert "training" in sec and "decode" in sec
    tok = [float(x) for x in re.findall(r"\(([0-9.]+) tokens/s\)", sec)]
    assert tok and all(x == pytest.approx(1 / dper, rel=0.03) for x in tok)


def test_one_timed_group_prints_as_before():
    """One group with a rhythm: the capture's timing lines, not indented under a group."""
    cap = skewgen.generate("ring-healthy", seed=0)
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "r.pcap")
        cap.write_pcap(p, snaplen=128)
        an = analyze(parse_file(p))
    lines = analysis_lines(an)
    assert any(x.startswith("  period ") for x in lines) and not any(x.startswith("    period") for x in lines)
    assert an["collectives"][0]["timing"] == an["timing"]
    assert all(not x.startswith("group ") for x in topview.timing_lines(an))
