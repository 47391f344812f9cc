"""`report --html` (skewscope.outputs.html), without a browser (tests/integration/
test_html_browser.py loads the pages in headless Chromium):

* the page of a generator preset, and of variants (other node counts, sizes, lags), names
  the injected entity of the generator's truth (hot expert / slow shard / straggler IP) in
  its finding and, for a hot expert, as the matrix' hot destination; every section has its
  picture (inline <svg>);
* at 64+ nodes the matrix is the busiest 32 + one "other" row/column, the hot node kept;
* self-contained: no script, no external style sheet/font/image, no http(s) src/href;
* atomic: a write that fails leaves no file (and a previous page intact), one clear error;
* CLI: bad output path = one line on stderr + exit 2, before reading; matplotlib missing =
  one line + exit 3; `import skewscope.cli` does not load matplotlib."""
from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import genlib

from skewscope import gen as skewgen
from skewscope.analysis import analyze
from skewscope.core import files as F
from skewscope.outputs import html as H

pytest.importorskip("matplotlib", reason="the html extra (matplotlib) is not installed: pip install '.[html]'")

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
_cache: dict = {}


def variant(name: str, **changes) -> dict:
    sc = copy.deepcopy(skewgen.PRESETS[name])
    sc.pop("description", None)
    for k, v in changes.items():
        if k == "pathology":
            sc["pathologies"][0].update(v)
        elif k == "workload":
            sc["workloads"][0].update(v)
        else:
            sc[k] = v
    return sc


CASES = {
    "moe-hot-expert": "moe-hot-expert",
    "tp-decode-slow-shard": "tp-decode-slow-shard",
    "ring-straggler": "ring-straggler",
    "ep-decode-hot-expert": "ep-decode-hot-expert",
    # variants: other node counts, sizes, factors, lags
    "a2a-12-hot9": variant("moe-hot-expert", nodes=12, workload={"bytes_per_peer": "96KiB"},
                           pathology={"node": 9, "factor": 3.0}),
    "tp6-slow4": variant("tp-decode-slow-shard", nodes=6, workload={"layers": 6, "tokens": 4},
                         pathology={"node": 4, "lag_us": 10}),
}
PATHOLOGY = {"hot_expert": ("hot_destination",), "hot_destination": ("hot_destination",), "slow_tp_shard": ("slow_tp_shard",),
             "straggler": ("ring_straggler", "straggler")}


def page_of(case: str, tmp_path_factory):
    """(truth, page text) of a case, generated once."""
    if case not in _cache:
        sc = CASES[case]
        d = tmp_path_factory.mktemp("html")
        pcap = str(d / f"{case}.pcap")
        cap = skewgen.write(genlib.scenario_path(sc) if isinstance(sc, str) else copy.deepcopy(sc), pcap,
                            seed=0, snaplen=128)
        snap = genlib.snapshot_of_pcap(pcap)
        os.unlink(pcap)
        out = d / f"{case}.html"
        size = H.write(str(out), snap, analyze(snap))
        text = out.read_text()
        assert size == len(text.encode())
        _cache[case] = (cap.truth, text)
    return _cache[case]


def sections(page: str) -> dict:
    """id -> the HTML from its <h2 id=...> to the next <h2."""
    out = {}
    for m in re.finditer(r'<h2 id="([a-z]+)">(.*?)(?=<h2|</main>)', page, re.S):
        out[m.group(1)] = m.group(2)
    return out


def cards(page: str) -> list[str]:
    return re.findall(r'<div class="card (?:warning|critical)">.*?</details></div>', page, re.S)


@pytest.mark.parametrize("case", list(CASES))
def test_page_names_injected_entity(case, tmp_path_factory):
    truth, page = page_of(case, tmp_path_factory)
    (path,) = [p for p in truth["pathologies"] if p["kind"] in PATHOLOGY]
    (ip,) = path["entities"]["ips"]
    sec = sections(page)
    assert set(sec) == {"incidents", "findings", "matrix", "rates", "timing", "sizes", "counters"}
    for name in ("matrix", "rates", "timing", "sizes"):
        assert "<svg" in sec[name], f"section {name} has no picture"
    # the finding of the injected kind names the truth's entity first, with its evidence drawn
    mine = [c for c in cards(page) if any(f"<b>{k}</b>" in c for k in PATHOLOGY[path["kind"]])]
    assert mine, f"no {PATHOLOGY[path['kind']]} card in the page of {case}"
    for c in mine:
        assert re.search(rf"nodes: <b>{re.escape(ip)}[,<]", c), (case, ip, c[:400])
        assert "<svg" in c
        # the drawn evidence: the entity is a label of the picture, and something is drawn
        # in the highlight colour (its bar)
        svg = c[c.index("<svg"):]
        assert f">{ip}</text>" in svg and f"fill: {H.HOT}" in svg
        if path["kind"] in ("slow_tp_shard", "straggler"):
            assert "lag per step (own delay" in svg and "member that gated each iteration" in svg
        else:
            assert "bytes received per destination" in svg and "share per phase" in svg
    if path["kind"] in ("hot_expert", "hot_destination"):
        assert re.search(rf"Hot destination: <b[^>]*>{re.escape(ip)}</b>", sec["matrix"]), sec["matrix"][:300]
    # nobody else is named as the hot destination / the slow member
    others = {n for n in re.findall(r"Hot destination: <b[^>]*>([^<]+)</b>", page)} - {ip}
    assert not others


def test_matrix_aggregates_many_nodes(tmp_path):
    """72 nodes: the busiest 32 one by one + 'other (40)'; the hot node (truth) among them."""
    sc = variant("moe-hot-expert", nodes=72, iterations=1, workload={"bytes_per_peer": "8KiB"},
                 pathology={"node": 47, "factor": 4.0})
    pcap = str(tmp_path / "a2a72.pcap")
    cap = skewgen.write(sc, pcap, seed=1, snaplen=128)
    snap = genlib.snapshot_of_pcap(pcap)
    (ip,) = [p for p in cap.truth["pathologies"] if p["kind"] == "hot_expert"][0]["entities"]["ips"]
    out = tmp_path / "a2a72.html"
    H.write(str(out), snap, analyze(snap))
    sec = sections(out.read_text())
    m = sec["matrix"]
    assert "72 nodes, the 32 busiest drawn, the other 40 as one row and column" in m, m[:300]
    assert ">other (40)</text>" in m
    assert re.search(rf"Hot destination: <b[^>]*>{re.escape(ip)}</b>", m)
    assert f">{ip}</text>" in m                      # the hot node is one of the 32 drawn


FETCH = re.compile(r"""(?:src|href|action|data)\s*=\s*["']?\s*(?:https?:)?//""", re.I)


@pytest.mark.parametrize("case", ["moe-hot-expert", "tp-decode-slow-shard"])
def test_self_contained(case, tmp_path_factory):
    _, page = page_of(case, tmp_path_factory)
    assert not FETCH.findall(page)
    assert "<script" not in page.lower()
    assert not re.search(r"<link\b", page, re.I)
    assert not re.search(r"@import|url\(\s*['\"]?\s*(?:https?:)?//", page, re.I)
    # images inside the SVG are data: URIs, never files or URLs
    for ref in re.findall(r'xlink:href="([^"#][^"]*)"|\shref="([^"#][^"]*)"', page):
        r = ref[0] or ref[1]
        assert r.startswith("data:image/png;base64,") or r.startswith("#"), r[:60]
    # the only absolute URLs are the SVG/XLink namespace names (not fetched)
    urls = set(re.findall(r"https?://[^\s\"'<>]+", page))
    assert urls <= {"http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink"}, urls
    assert "@media print" in page


def test_failing_write_leaves_nothing(tmp_path, monkeypatch, tmp_path_factory):
    truth, snap = genlib.get("moe-hot-expert")
    an = analyze(snap)
    out = tmp_path / "r.html"
    out.write_text("previous page")

    def no_space(src, dst):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(F.os, "replace", no_space)
    with pytest.raises(H.HtmlError) as e:
        H.write(str(out), snap, an)
    assert e.value.code == 3 and "No space left on device" in str(e.value) and "\n" not in str(e.value)
    assert out.read_text() == "previous page"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html"]      # no temp file left
    monkeypatch.undo()
    new = tmp_path / "new.html"
    monkeypatch.setattr(F.os, "replace", no_space)
    with pytest.raises(H.HtmlError):
        H.write(str(new), snap, an)
    assert not new.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["r.html"]


def _cli(*args, env=None, pre=""):
    code = pre + "import sys; from skewscope.cli import main; sys.argv = ['skewscope'] + sys.argv[1:]; main()"
    return subprocess.run([PY, "-c", code, *args], capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env=env)


@pytest.fixture(scope="module")
def small_pcap(tmp_path_factory):
    p = tmp_path_factory.mktemp("htmlcli") / "tp.pcap"
    skewgen.write(variant("tp-decode-slow-shard", workload={"layers": 2, "tokens": 3}), str(p), seed=0,
                  snaplen=128)
    return p


@pytest.mark.parametrize("bad", ["missing-dir/out.html", "."])
def test_cli_bad_output_path(bad, small_pcap, tmp_path):
    target = str(tmp_path / bad) if bad != "." else str(tmp_path)
    r = _cli("report", str(small_pcap), "--html", target)
    assert r.returncode == 2, r
    lines = r.stderr.strip().splitlines()
    # ours ("skewscope: --html ...") or click's for a directory ("Invalid value for '--html'")
    assert len(lines) == 1 and "--html" in lines[0] and "Traceback" not in r.stderr, r.stderr
    assert r.stdout == ""                                   # refused before reading the capture
    assert os.listdir(tmp_path) == []


def test_cli_capture_bad_html_path(tmp_path):
    """capture checks --html before attaching anything (no root needed to be refused)."""
    r = _cli("capture", "-i", "lo", "-d", "1", "-o", str(tmp_path / "x.snap"), "--html",
             str(tmp_path / "nodir" / "x.html"))
    assert r.returncode == 2, r
    assert r.stderr.strip().count("\n") == 0 and "--html" in r.stderr and "Traceback" not in r.stderr
    assert os.listdir(tmp_path) == []


def test_cli_report_html(small_pcap, tmp_path):
    out = tmp_path / "tp.html"
    r = _cli("report", str(small_pcap), "--html", str(out))
    assert r.returncode == 0, r.stderr
    assert re.search(r"^wrote .*tp\.html \(\d+ KiB\)$", r.stderr, re.M), r.stderr
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "slow_tp_shard" in page and "10.0.0.3" in page      # the preset's slow shard (node 2)
    assert "skewscope report" in r.stdout                      # the human report is still printed


def test_cli_matplotlib_missing(small_pcap, tmp_path):
    out = tmp_path / "x.html"
    r = _cli("report", str(small_pcap), "--html", str(out),
             pre="import sys; sys.modules['matplotlib'] = None; ")
    assert r.returncode == 3, r
    err = r.stderr.strip().splitlines()
    assert err == ["skewscope: --html needs matplotlib: pip install 'skewscope[html]' (or make setup)"], r.stderr
    assert not out.exists()


def test_cli_import_is_light():
    r = subprocess.run([PY, "-c", "import sys, skewscope.cli; print('matplotlib' in sys.modules)"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.stdout.strip() == "False", r


@pytest.mark.parametrize("case", ["tp-decode-slow-shard", "tp6-slow4"])
def test_timeline_counts_are_the_truths(case, tmp_path_factory):
    """The timeline draws one tick per token and per ring step: the generator's tokens and
    steps per token (its slow_tp_shard magnitude)."""
    truth, page = page_of(case, tmp_path_factory)
    (p,) = [x for x in truth["pathologies"] if x["kind"] == "slow_tp_shard"]
    mg = p["magnitude"]
    tl = sections(page)["timing"]
    assert f">token ({mg['tokens']})</text>" in tl, re.findall(r">(\w+ \(\d+\))</text>", tl)
    assert f">step ({mg['tokens'] * mg['steps_per_token']})</text>" in tl, re.findall(r">(\w+ \(\d+\))</text>", tl)


def test_pfc_finding_draws_pause_per_priority(tmp_path):
    """pfc preset: the pfc_pause card draws the pause frames per priority, the truth's
    priority the highlighted (largest) bar."""
    truth, snap = genlib.get("pfc")
    out = tmp_path / "pfc.html"
    H.write(str(out), snap, analyze(snap))
    page = out.read_text()
    (c,) = [c for c in cards(page) if "<b>pfc_pause</b>" in c]
    assert "PFC pause frames per priority (capture)" in c
    per = truth["pfc"]["per_priority"]
    hot = [m.group(1) for m in re.finditer(r'<text style="[^"]*fill: #c62828[^"]*"[^>]*>([0-7])</text>', c)]
    assert hot == [str(per.index(max(per)))], hot
