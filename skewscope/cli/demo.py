"""`skewscope demo`: an 8-node RoCE fabric in network namespaces with known pathologies,
and the live view on its mirror port. Everything it makes is removed on exit (q, Ctrl-C,
SIGTERM, SIGHUP, errors). Without root it says so and shows the offline report of the same
generated traffic instead."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time

import click

from skewscope.cli.common import enrich_options, fail, friendly_errors
from skewscope.cli.live import Duration, report_console
from skewscope.core.errors import DataplaneError
from skewscope.core.netns import in_netns

DEFAULT_SCENARIOS = ("moe-hot-expert+congestion", "ring-straggler")

EPILOG = """\b
Examples:
  sudo skewscope demo                         fabric + live view; q to quit (removes everything)
  sudo skewscope demo --duration 30 --no-top  scripted: 30 s of traffic, then the report
  sudo skewscope demo --duration 20 | cat     plain periodic tables instead of the screen
  sudo skewscope demo --cleanup               remove what a killed demo left behind
\b
What runs: generator scenarios played from the GPU namespaces -- by default an MoE
all-to-all with a hot expert on 10.0.0.6 and congestion into 10.0.0.3, next to a ring
all-reduce whose rank 10.0.0.4 straggles -- time-stretched so that the whole fabric sends
about --rate frames/s (rates on screen are the model's divided by the stretch factor,
printed at start). Every 60 s the traffic is regenerated (fresh QPs, so PSNs never go
backwards); the fabric is quiet for the second or two that takes.
\b
Exit codes: 0 ok (q, Ctrl-C; without root: the offline report); 2 usage; 3 fabric could not
be built; 4 --cleanup without root; 5 bcc missing; 8 kernel refused; 143/129 SIGTERM/SIGHUP.
"""


def demo_enricher(nodes: int):
    """The demo's inventory: generator node i (10.0.0.i+1) is host gpu-NN, one GPU NIC each
    (rank = node index), so the screens show what `--inventory FILE` gives a real site."""
    from skewscope.core.inventory import parse  # light
    from skewscope.telemetry.enrich import Enricher  # light
    rows = "".join(f"10.0.0.{i + 1},gpu-{i + 1:02d},0,{i},demo\n" for i in range(nodes))
    return Enricher(parse("ip,host,gpu,rank,job\n" + rows, "demo inventory", "csv"))


def named_state(enricher):
    from skewscope.outputs.topview import ViewState  # heavy (numpy): not loaded by --help
    st = ViewState()
    st.names = enricher.names()
    return st


def _fallback(scenarios, seed, enricher):
    """No root: the same traffic, offline."""
    from skewscope import gen as sg  # heavy (numpy): not loaded by --help

    # heavy (numba): the generator, the offline parser and the analysis
    from skewscope.analysis import analyze  # heavy (numba)
    from skewscope.outputs import report as R  # heavy (numpy): not loaded by --help
    from skewscope.sources.offline import parse_file  # heavy (numba)
    from skewscope.testbed.fabric import DEMO_SCENARIOS, resolve_scenario  # heavy (numba)
    click.echo("skewscope demo: the live demo needs root (network namespaces, veth, XDP); showing the offline "
               "report of the same generated traffic instead (run with sudo for the live fabric).", err=True)
    with tempfile.TemporaryDirectory(prefix="skewscope-demo-") as d:
        for k, name in enumerate(scenarios):
            path = os.path.join(d, f"{name}.pcap")
            cap = sg.generate(resolve_scenario(name), seed=seed + k)
            cap.write_pcap(path)
            desc = (DEMO_SCENARIOS.get(name) or sg.PRESETS.get(name) or {}).get("description", "")
            click.echo(f"\n=== {name}: {desc}")
            snap = parse_file(path)
            try:
                res = enricher(analyze(snap))
            except Exception as e:  # the report without findings is still worth showing
                click.echo(f"warning: analysis failed ({type(e).__name__}: {e})", err=True)
                res = None
            R.human(snap, res, top=12, console=report_console())


@click.command(epilog=EPILOG)
@click.option("--nodes", type=click.IntRange(2, 64), default=8, show_default=True, help="GPU node namespaces")
@click.option("--scenario", "scenarios", multiple=True, metavar="PRESET",
              help="generator preset to play (repeatable; default: moe-hot-expert+congestion, ring-straggler)")
@click.option("--rate", type=click.FloatRange(100, 200000), default=15000, show_default=True,
              help="frames per second the whole fabric sends (sets the time stretch)")
@click.option("--duration", type=Duration(), default=None,
              help="stop after this long (default: until q / Ctrl-C, at most 1 h)")
@click.option("--no-top", is_flag=True, help="no live view: capture for --duration, print the report")
@click.option("--tc", "use_tc", is_flag=True, help="watch with TC instead of XDP")
@click.option("--xdp-mode", type=click.Choice(["native", "generic"]), default="native", show_default=True)
@click.option("--interval", type=click.FloatRange(0.2, 60), default=1.0, show_default=True)
@click.option("--window", type=click.FloatRange(1, 3600), default=30.0, show_default=True,
              help="seconds the findings panel analyses (the stretched demo's iterations last seconds: "
                   "a window of several iterations keeps partial ones from skewing the volumes)")
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--pass-seconds", type=click.FloatRange(5, 3600), default=60, hidden=True)
@click.option("--cleanup", is_flag=True, help="only remove fabrics left by demos that were killed, then exit")
@enrich_options
@friendly_errors
def demo(nodes, scenarios, rate, duration, no_top, use_tc, xdp_mode, interval, window, seed, pass_seconds, cleanup,
         enricher):
    """Build an N-node RoCE fabric of network namespaces (GPU nodes -> switch -> mirror
    port -> DPU namespace), play generator scenarios with known pathologies from the nodes
    in a bounded loop, and open `top` on the DPU's interface. On exit everything made is
    removed."""
    from skewscope import gen as sg  # heavy (numpy): not loaded by --help
    from skewscope.bpf.loader import import_bcc  # heavy (numpy): not loaded by --help
    from skewscope.live import top as T  # heavy (numpy): not loaded by --help
    from skewscope.sources.live import (  # heavy (numpy): not loaded by --help
        LiveSession,
        Terminated,
        terminate_on_signals,
    )

    # heavy (numba, via the generator): loaded only when the demo runs
    from skewscope.testbed.fabric import DEMO_SCENARIOS, Fabric, FabricError, cleanup_stale  # heavy (numba)
    scenarios = tuple(scenarios) or DEFAULT_SCENARIOS
    if not enricher:                 # the demo names its nodes as a site's inventory would
        enricher = demo_enricher(nodes)
    for s in scenarios:
        if s not in sg.PRESETS and s not in DEMO_SCENARIOS and not os.path.exists(s):
            fail(f"unknown scenario {s!r} (see 'skewscope gen --list-presets')", 2)
    if os.geteuid() != 0:
        if cleanup:
            fail("--cleanup needs root", 4)
        _fallback(scenarios, seed, enricher)
        return
    old = cleanup_stale("ssd-")
    if old:
        click.echo(f"removed {len(old)} namespaces left by an earlier demo that was killed", err=True)
    if cleanup:
        if not old:
            click.echo("nothing to clean up", err=True)
        return
    import_bcc()
    max_s = float(duration) if duration else 3600.0
    fab = Fabric(nodes=nodes, prefix="ssd-")
    code = 0
    tty = sys.stdout.isatty() and sys.stdin.isatty() and not no_top
    info = {}
    with terminate_on_signals():
        try:
            click.echo(f"building fabric {fab.prefix}{fab.tag}: {nodes} GPU namespaces, switch, DPU observer …", err=True)
            try:
                fab.build()
            except FabricError as e:
                fail(f"cannot build the fabric: {e}", 3)
            player = fab.spawn([sys.executable, "-m", "skewscope.testbed.fabric", "play", "--ns", ",".join(fab.node_ns),
                                "--iface", fab.node_if, "--rate", str(rate), "--pass-seconds", str(pass_seconds),
                                "--max-seconds", str(max_s + 30), "--seed", str(seed), "--parent", str(os.getpid())]
                               + sum((["--scenario", s] for s in scenarios), []),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            reader = threading.Thread(target=_read_player, args=(player, info), daemon=True)
            reader.start()
            click.echo(f"traffic: {', '.join(scenarios)} from {fab.node_ns[0]}..{nodes - 1}, ~{rate:g} frames/s "
                       f"(generating …)", err=True)
            stop = threading.Event()
            with in_netns(fab.obs_ns):
                sess = LiveSession(fab.obs_if, mode="tc" if use_tc else "xdp", xdp_mode=xdp_mode,
                                   source="live" if not no_top else "capture", on_stale="detach")
                sess.open()
                try:
                    _wait_started(info, player, 60)
                    banner = (f"demo {fab.prefix}{fab.tag}: {nodes} GPU namespaces -> switch -> mirror -> "
                              f"{fab.obs_ns}/{fab.obs_if}; time stretched {info.get('stretch', '?')}x")
                    click.echo(banner, err=True)
                    if duration:
                        timer = threading.Timer(duration, stop.set)
                        timer.daemon = True
                        timer.start()
                    if no_top:
                        _scripted(sess, duration or 30.0, stop, enricher)
                    elif tty:
                        T.run_tty(sess, interval, window=window, stop=stop, banner=banner, state=named_state(enricher),
                                  enrich=enricher)
                    else:
                        click.echo(sess.startup_line())
                        count = math.ceil(duration / interval) if duration else None
                        T.run_plain(sess, interval, count, window=window, stop=stop, state=named_state(enricher),
                                    enrich=enricher)
                finally:
                    sess.close()
        except Terminated as e:
            code = 128 + e.signum
        except KeyboardInterrupt:
            pass
        finally:
            left = fab.teardown()
            if left:
                click.echo(f"skewscope demo: could not remove {', '.join(left)}; run 'skewscope demo --cleanup'",
                           err=True)
                code = code or 3
            else:
                sent = info.get("sent")
                click.echo(f"demo over: removed {len(fab.namespaces())} namespaces and everything in them; "
                           "nothing left attached" + (f"; {sent} frames were sent" if sent else ""), err=True)
    if code:
        sys.exit(code)


def _read_player(p, info):
    for line in p.stdout:
        try:
            ev = json.loads(line)
        except json.JSONDecodeError:
            continue
        if ev.get("event") == "start":
            info["stretch"] = ev.get("stretch")
            info["frames_per_pass"] = ev.get("frames_per_pass")
            info["started"] = time.monotonic()
        elif ev.get("event") == "done":
            info["sent"] = ev.get("sent")
    info["exited"] = True


def _wait_started(info, player, timeout):
    t = time.monotonic() + timeout
    while "started" not in info:
        if player.poll() is not None:
            err = (player.stderr.read() or "").strip().splitlines()
            raise DataplaneError(f"the traffic player exited: {err[-1] if err else player.returncode}", 3)
        if time.monotonic() > t:
            raise DataplaneError("the traffic player did not start within 60 s", 3)
        time.sleep(0.1)


def _scripted(sess, duration, stop, enricher):
    from skewscope.outputs import report as R  # heavy (numpy): not loaded by --help
    t_end = time.monotonic() + duration
    while time.monotonic() < t_end and not stop.is_set():
        time.sleep(min(0.2, max(0.0, t_end - time.monotonic())))
        sess.poll_records()
    snap = sess.snapshot()
    from skewscope.analysis import analyze  # heavy (numba)
    try:
        res = enricher(analyze(snap))
    except Exception as e:
        click.echo(f"warning: analysis failed ({type(e).__name__}: {e})", err=True)
        res = None
    R.human(snap, res, top=16, console=report_console())
