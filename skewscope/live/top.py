"""The run loops of `top`: `run_plain` (bcc-style periodic tables) and `run_tty` (the rich
full-screen view with keys) drive a LiveSession through the live loop (live.loop.Loop: the
window and the analysis runner); the screen itself is outputs/topview.py (model, plain
lines), outputs/topmatrix.py and outputs/toprich.py."""
from __future__ import annotations

import os
import select
import sys
import termios
import threading
import time
import tty

from skewscope.live.loop import Loop
from skewscope.live.runner import AnalysisRunner, load_analyze
from skewscope.outputs.topformat import PLAIN_WIDTH
from skewscope.outputs.toprich import render_rich
from skewscope.outputs.topview import ViewState, build_model, decode_keys, plain_lines


def runner_for(analyze="auto", enrich=None) -> AnalysisRunner:
    """"auto": analysis.analyze when importable; None: no analysis (--no-analysis); else the
    callable given (tests). enrich: names and causes on each result (telemetry.enrich)."""
    return AnalysisRunner(load_analyze() if analyze == "auto" else analyze, disabled=analyze is None, enrich=enrich)


def analysis_note(runner: AnalysisRunner) -> str:
    """The analysis panels' status line: off, unavailable, failed, pending, or how old."""
    if runner.disabled:
        return "analysis off (--no-analysis)"
    if runner.analyze is None:
        return "analysis module not available"
    if runner.error:
        return f"analysis failed: {runner.error}"
    if runner.result is None:
        return "analysing…"
    age = time.time() - runner.when
    return f"last {runner.window_s:.0f} s, {age:.0f} s ago"


def table_rows_for(height: int) -> int:
    # header panel 5 lines, table title + header 2, bottom panels ~ 8, footer 1
    return max(3, height - 17)


def run_plain(session, interval: float, count: int | None, out=None, rows: int = 20, window: float = 10.0,
              state: ViewState | None = None, analyze="auto", stop: threading.Event | None = None,
              enrich=None) -> int:
    """bcc-style periodic tables; each analysed inline on its window. Returns the number of
    intervals printed."""
    out = out or sys.stdout
    state = state or ViewState()
    runner = runner_for(analyze, enrich)
    loop = Loop(session, interval, window, runner, sync=True)
    n = 0
    for iv in loop.ticks(count, stop=stop):
        m = build_model(iv.delta, iv.dt, state, iface=session.iface, attach=session.describe(), interval=interval,
                        elapsed=iv.elapsed, cum=iv.cum, limit=rows, analysis=runner.result,
                        analysis_note=analysis_note(runner))
        print("", file=out)
        for line in plain_lines(m):
            print(line, file=out)
        if runner.error:
            print(f"note: analysis failed: {runner.error}"[:PLAIN_WIDTH], file=out)
        out.flush()
        n += 1
    return n


def run_tty(session, interval: float, rows: int = 0, window: float = 10.0, state: ViewState | None = None,
            analyze="auto", stop: threading.Event | None = None, banner: str = "", enrich=None) -> None:
    """The full-screen view; the analysis runs in the runner's thread (a window offered while
    one still runs is skipped). Returns on q; Ctrl-C raises KeyboardInterrupt (the caller's
    live.loop.Attached detaches). The terminal is restored in every case."""

    from rich.console import Console  # heavy (rich): only when drawing
    from rich.live import Live  # heavy (rich): only when drawing

    state = state or ViewState()
    runner = runner_for(analyze, enrich)
    loop = Loop(session, interval, window, runner)
    # A full-screen view follows the real terminal (and its resizes): exported COLUMNS/LINES
    # (often stale -- e.g. inherited into tmux panes) would pin it to a wrong size.
    for v in ("COLUMNS", "LINES"):
        os.environ.pop(v, None)
    console = Console()
    fd = sys.stdin.fileno()
    old = termios.tcgetattr(fd)
    last = {"iv": None, "model": None}

    def redraw(live):
        iv = last["iv"]
        if iv is None:
            return
        h = console.size.height
        limit = rows or table_rows_for(h)
        if state.show_hist:
            limit = max(3, limit - 4)
        snap, dt = (iv.cum, max(iv.elapsed, 1e-9)) if state.cumulative else (iv.delta, iv.dt)
        m = build_model(snap, dt, state, iface=session.iface, attach=attach_label(session), interval=interval,
                        elapsed=iv.elapsed, cum=iv.cum, limit=limit, analysis=runner.result,
                        analysis_note=analysis_note(runner))
        last["model"] = m
        live.update(render_rich(m, height=h, width=console.size.width, banner=banner), refresh=True)

    try:
        tty.setcbreak(fd)
        with Live(console=console, screen=True, auto_refresh=False, transient=False) as live:
            from rich.text import Text  # heavy (rich): only when drawing
            live.update(Text((banner + "\n" if banner else "") + f"skewscope top: {session.describe()}; "
                             f"first refresh in {interval:g} s …  (q quits)"), refresh=True)

            def wait(timeout):
                r, _, _ = select.select([fd], [], [], timeout)
                if stop is not None and stop.is_set():
                    return True
                if not r:
                    return state.quit
                data = os.read(fd, 64)
                nrows = len(last["model"].rows) if last["model"] is not None else 0
                for k in decode_keys(data):
                    state.key(k, nrows)
                if state.quit:
                    return True
                redraw(live)
                return False

            for iv in loop.ticks(None, wait=wait):
                if not state.paused:
                    last["iv"] = iv
                redraw(live)
                if state.quit:
                    break
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, old)


def attach_label(session) -> str:
    """"XDP native (bpf_link), 1/4 sampled": what is attached, for the header."""
    if session.mode == "xdp":
        s = f"XDP {session.xdp_mode}"
    else:
        s = f"TC {session.direction}"
    via = getattr(session, "attached_via", "")      # bpf_link, or netlink (survives a SIGKILL)
    if via:
        s += f" ({via})"
    if session.config.sample_n > 1:
        s += f", 1/{session.config.sample_n} sampled"
    return s
