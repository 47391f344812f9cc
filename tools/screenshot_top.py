#!/usr/bin/env python3
"""Make docs/examples/top_matrix.png: `skewscope top`'s matrix view (key m) as it renders,
from a generator preset read back through the offline parser (the same Snapshot a capture
of that traffic gives), with the analysis panels filled. rich records the real screen
(Console(record=True).export_svg()), headless Chromium turns the SVG into a PNG.

    .venv/bin/python tools/screenshot_top.py                       # demo-mix -> docs/examples/top_matrix.png
    .venv/bin/python tools/screenshot_top.py --preset moe-hot-expert --width 120 --height 44 -o /tmp/x.png
    .venv/bin/python tools/screenshot_top.py --svg /tmp/x.svg      # keep the SVG too

Needs chromium (tools/setup.sh installs it; `apt-get install -y chromium`).
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from skewscope import gen as skewgen  # noqa: E402
from skewscope.outputs import toprich  # noqa: E402
from skewscope.outputs import topview as V  # noqa: E402


def render_svg(preset: str, width: int, height: int, seed: int, workdir: str) -> str:
    from rich.console import Console  # heavy (rich)

    from skewscope.analysis import analyze  # heavy (numba)
    from skewscope.sources.offline import parse_file  # heavy (numba)

    pcap = os.path.join(workdir, f"{preset}.pcap")
    skewgen.write(preset, pcap, seed=seed, snaplen=128)
    snap = parse_file(pcap)
    dt = float(snap.meta.get("duration_s") or 1.0)
    st = V.ViewState(matrix=True)
    m = V.build_model(snap, dt, st, iface="obs0", attach="XDP native (bpf_link)", interval=1.0, elapsed=dt,
                      analysis=analyze(snap), analysis_note=f"gen {preset}, seed {seed}")
    con = Console(width=width, height=height, record=True, force_terminal=True, color_system="truecolor",
                  file=open(os.devnull, "w"))
    con.print(toprich.render_rich(m, height=height, width=width, banner=f"skewscope gen {preset} (offline replay)"))
    return con.export_svg(title="skewscope top  (m: node matrix)")


def svg_to_png(svg: str, out: Path, workdir: str) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if chromium is None:
        sys.exit("chromium not found: apt-get install -y chromium (tools/setup.sh does)")
    mt = re.search(r'viewBox="0 0 ([0-9.]+) ([0-9.]+)"', svg)
    w, h = (int(float(mt.group(1))) + 1, int(float(mt.group(2))) + 1) if mt else (1600, 1000)
    page = Path(workdir) / "top.html"
    page.write_text("<!doctype html><html><head><meta charset='utf-8'><style>html,body{margin:0;padding:0;"
                    f"background:#fff}}svg{{display:block;width:{w}px;height:{h}px}}</style></head><body>"
                    + svg + "</body></html>")
    tmp_png = Path(workdir) / "top.png"
    cmd = [chromium, "--headless", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
           f"--user-data-dir={workdir}/profile", f"--window-size={w},{h}", f"--screenshot={tmp_png}",
           page.as_uri()]
    if os.geteuid() == 0:
        cmd.insert(1, "--no-sandbox")
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    shrink(tmp_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    os.replace(shutil.copy(tmp_png, out.with_suffix(".png.tmp")), out)      # appears whole or not at all


def shrink(png: Path, colors: int = 96) -> None:
    """A terminal picture needs few colours: an adaptive palette keeps the docs' PNG small
    (< 300 KB). Skipped without Pillow."""
    try:
        from PIL import Image  # optional (Pillow): only to shrink the PNG
    except ImportError:
        return
    im = Image.open(png).convert("RGB")
    im.quantize(colors=colors, method=Image.Quantize.MEDIANCUT).save(png, optimize=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="demo-mix")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--width", type=int, default=120, help="terminal columns")
    ap.add_argument("--height", type=int, default=44, help="terminal lines")
    ap.add_argument("-o", "--out", type=Path, default=ROOT / "docs/examples/top_matrix.png")
    ap.add_argument("--svg", type=Path, help="also write the recorded SVG here")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="skewscope-shot-") as d:
        svg = render_svg(a.preset, a.width, a.height, a.seed, d)
        if a.svg:
            a.svg.write_text(svg)
        svg_to_png(svg, a.out, d)
    print(f"wrote {a.out} ({a.out.stat().st_size // 1024} KB)")


if __name__ == "__main__":
    main()
