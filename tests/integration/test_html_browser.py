"""The `report --html` pages in a real browser: headless Chromium (the OS package, installed
by tools/setup.sh) loads the page of several generator presets with no network at all (a
fresh network namespace: `unshare --net`), and

* logs no console message (no script error, no failed resource load: the page has neither
  scripts nor external resources, so any message is a fault) -- a control page with a
  script error and a missing image proves the check sees both;
* the DOM after load has the pictures (an <svg> in every section and in each drawn finding);
* the page names the preset's injected entity (generator truth) in a finding;
* a screenshot (1400 x 2000) is a valid PNG that is not blank;
* it prints (--print-to-pdf) to a multi-page PDF;
* `capture --html` on a veth pair with the preset's frames sent through it writes a page
  naming the hot expert.

Chromium runs with --headless --disable-gpu --no-sandbox and a temporary --user-data-dir."""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import genlib

from skewscope import gen as skewgen
from skewscope.analysis import analyze

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytest.importorskip("matplotlib", reason="the html extra (matplotlib) is not installed: make setup")
from skewscope.outputs import html as H

# preset -> the truth's pathology kind whose entity the page must name (None: healthy)
PRESETS = {"moe-hot-expert": "hot_expert", "tp-decode-slow-shard": "slow_tp_shard",
           "ring-straggler": "straggler", "ep-decode-hot-drift": "hot_destination", "pd-imbalanced": None,
           "congestion": None, "ring-healthy": None}
SECTIONS = ("incidents", "findings", "matrix", "rates", "timing", "sizes", "counters")   # incidents: issue 27


@pytest.fixture(scope="module")
def chromium():
    if CHROMIUM is None:
        pytest.fail("chromium not installed (tools/setup.sh installs the OS package 'chromium')")
    return CHROMIUM


def browse(chromium, page: Path, tmp: Path, *mode: str) -> subprocess.CompletedProcess:
    """Chromium on a file:// page with no network (own network namespace when we can)."""
    ud = tmp / f"profile-{os.getpid()}-{len(list(tmp.iterdir()))}"
    cmd = [chromium, "--headless", "--disable-gpu", "--no-sandbox", f"--user-data-dir={ud}",
           "--no-first-run", "--no-default-browser-check", "--disable-extensions", "--disable-sync",
           "--disable-background-networking", "--disable-component-update", "--enable-logging=stderr", "--v=0",
           *mode, page.resolve().as_uri()]
    unshare = shutil.which("unshare")
    if unshare and os.geteuid() == 0:
        cmd = [unshare, "--net", "--"] + cmd
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=tmp)
    shutil.rmtree(ud, ignore_errors=True)
    return r


def console(stderr: str) -> list[str]:
    """Console messages and failed loads in Chromium's log that are the page's: a console line
    whose source is one of Chromium's own UI pages (chrome://, chrome-extension://, ... --
    e.g. the print preview's "Slow network is detected ... roboto" on a loaded machine) is
    not (the control page proves the page's own errors are still seen)."""
    out = []
    for ln in stderr.splitlines():
        if not (":CONSOLE" in ln or "Failed to load resource" in ln or "net::ERR_" in ln):
            continue
        src = re.search(r"\bsource: (\S+)", ln)
        if src and not src.group(1).startswith("file://"):
            continue
        if not src and re.search(r"\b(chrome|chrome-extension|chrome-untrusted|devtools)://", ln):
            continue
        out.append(ln)
    return out


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    d = tmp_path_factory.mktemp("htmlb")
    out = {}
    for name in PRESETS:
        pcap = d / f"{name}.pcap"
        cap = skewgen.write(genlib.scenario_path(name), str(pcap), seed=0, snaplen=128)
        snap = genlib.snapshot_of_pcap(str(pcap))
        pcap.unlink()
        page = d / f"{name}.html"
        H.write(str(page), snap, analyze(snap))
        out[name] = (cap.truth, page)
    return out


def test_control_page_errors_are_seen(chromium, tmp_path):
    """The console check can fail: a script error and a missing image are both reported."""
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><html><body><img src="missing.png"><script>console.error("control-x");'
                   "nosuchfunction();</script></body></html>")
    r = browse(chromium, bad, tmp_path, "--dump-dom")
    msgs = console(r.stderr)
    assert any("control-x" in m for m in msgs), r.stderr[-2000:]
    assert any("nosuchfunction" in m for m in msgs), r.stderr[-2000:]


@pytest.mark.parametrize("name", list(PRESETS))
def test_page_in_browser(name, chromium, pages, tmp_path):
    truth, page = pages[name]
    r = browse(chromium, page, tmp_path, "--dump-dom")
    assert r.returncode == 0, r.stderr[-2000:]
    assert console(r.stderr) == [], console(r.stderr)
    dom = r.stdout
    assert "</main>" in dom and "skewscope report" in dom
    secs = {m.group(1): m.group(2) for m in re.finditer(r'<h2 id="([a-z]+)">(.*?)(?=<h2|</main>)', dom, re.S)}
    assert set(secs) == set(SECTIONS), sorted(secs)
    for s in ("matrix", "rates", "timing", "sizes"):
        assert re.search(r"<svg\b[^>]*>", secs[s]), f"{name}: no <svg> in section {s}"
    kind = PRESETS[name]
    if kind is None:
        return
    (p,) = [x for x in truth["pathologies"] if x["kind"] == kind]
    ip = p["entities"]["ips"][0]
    cards = re.findall(r'<div class="card (?:warning|critical)">(.*?)</details>', secs["findings"], re.S)
    named = [c for c in cards if re.search(rf"nodes: <b>{re.escape(ip)}[,<]", c)]
    assert named, f"{name}: no finding names {ip}"
    assert all("<svg" in c for c in named[:H.FINDINGS_DRAWN]), f"{name}: a finding naming {ip} has no picture"


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


@pytest.mark.parametrize("name", ["moe-hot-expert", "tp-decode-slow-shard"])
def test_screenshot(name, chromium, pages, tmp_path):
    _, page = pages[name]
    shot = tmp_path / f"{name}.png"
    r = browse(chromium, page, tmp_path, f"--screenshot={shot}", "--window-size=1400,2000", "--hide-scrollbars")
    assert r.returncode == 0 and shot.exists(), r.stderr[-2000:]
    assert console(r.stderr) == []
    data = shot.read_bytes()
    assert png_size(data) == (1400, 2000)
    from PIL import Image  # heavy (plotting): matplotlib's own image dependency
    im = Image.open(shot).convert("RGB")
    im.load()
    hist = im.getcolors(maxcolors=1 << 20) or []
    assert len(hist) > 50, "almost no colours: a blank page"
    bg = max(hist)[0]
    assert 1 - bg / (1400 * 2000) > 0.05, "under 5% of the screenshot differs from the background"
    # the highlight colour of the hot/slow entity is on screen
    red = sum(n for n, c in hist if c[0] > 150 and c[1] < 80 and c[2] < 80)
    assert red > 200, red


def test_prints(chromium, pages, tmp_path):
    """Printable: Chromium's print to PDF gives a multi-page PDF, with no console message."""
    _, page = pages["moe-hot-expert"]
    pdf = tmp_path / "moe.pdf"
    r = browse(chromium, page, tmp_path, f"--print-to-pdf={pdf}", "--no-pdf-header-footer")
    assert r.returncode == 0 and pdf.exists(), r.stderr[-2000:]
    assert console(r.stderr) == []
    data = pdf.read_bytes()
    assert data.startswith(b"%PDF-")
    pages_n = len(re.findall(rb"/Type\s*/Page(?!s)", data))
    assert pages_n >= 2, pages_n


def test_capture_html_live(netns_pair, chromium, tmp_path):
    """`capture --html` on a real interface: the generator's moe-hot-expert frames sent over
    a veth pair (bounded: the preset's frames once, 30 s at most), captured by XDP at the
    other end and ended by Ctrl-C; the page names the truth's hot expert and loads without a
    console message."""
    p = netns_pair
    for side in "ab":
        p.run(side, "ip", "link", "set", p.ifname(side), "mtu", "9000")   # IB MTU 4096 frames
    truth = skewgen.generate("moe-hot-expert").truth
    (hot,) = [x for x in truth["pathologies"] if x["kind"] == "hot_expert"][0]["entities"]["ips"]
    skewscope = str(Path(sys.executable).with_name("skewscope"))
    snap, page = tmp_path / "live.snap", tmp_path / "live.html"
    cap = subprocess.Popen(["ip", "netns", "exec", p.ns_b, skewscope, "capture", "-i", p.if_b, "-d", "120",
                            "-o", str(snap), "--html", str(page), "-q"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    lines: list[str] = []
    attached = threading.Event()

    def reader():
        for ln in cap.stderr:
            lines.append(ln)
            if ln.startswith("Capturing RoCE"):
                attached.set()
    th = threading.Thread(target=reader, daemon=True)
    th.start()
    try:
        assert attached.wait(120), "".join(lines)
        r = subprocess.run([sys.executable, "-m", "skewscope.gen", "moe-hot-expert", "--send", p.if_a, "--netns",
                            p.ns_a, "--rate", "20000", "--max-seconds", "30"], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0, r.stderr
        time.sleep(1.0)
        cap.send_signal(signal.SIGINT)     # Ctrl-C: the capture ends early, saves, writes the page
        cap.wait(timeout=180)
        th.join(timeout=10)
    finally:
        if cap.poll() is None:
            cap.kill()
            cap.wait()
    err = "".join(lines)
    assert cap.returncode == 0, err
    assert re.search(r"^wrote .*live\.html \(\d+ KiB\)$", err, re.M), err
    text = page.read_text()
    assert re.search(rf"Hot destination: <b[^>]*>{re.escape(hot)}</b>", text), text[:2000]
    rb = browse(chromium, page, tmp_path, "--dump-dom")
    assert rb.returncode == 0 and console(rb.stderr) == []
    assert "<svg" in rb.stdout
