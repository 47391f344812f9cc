"""`gen`: the generator's command (mounted as `skewscope gen`, or `python -m skewscope.gen`)."""
from __future__ import annotations

import os

import click

EPILOG = """\b
Examples:
  skewscope gen --list-presets
  skewscope gen ring-straggler -o out/ring.pcap --seed 7    # writes out/ring.pcap + out/ring.truth.json
  skewscope gen ring-32 -o big.pcap --snaplen 128           # headers only, original lengths kept
  skewscope gen my-scenario.yaml -o s.pcap
  skewscope gen tp-decode-slow-shard -o n3.pcap --view node:10.0.0.3  # what node 3's DPU sees
  skewscope gen ring-straggler --views out/ring-views/     # out/ring-views/<ip>.pcap per node
  skewscope gen incast --send veth0 --netns sgt-a --rate 50000 --max-frames 20000
"""


@click.command("gen", epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"],
                                                        "max_content_width": 100})
@click.argument("scenario", required=False, metavar="PRESET|SCENARIO_FILE")
@click.option("-o", "--output", metavar="OUT.pcap", help="pcap to write (truth goes to OUT.truth.json)")
@click.option("--seed", type=int, default=0, show_default=True, help="random seed (same seed, same bytes)")
@click.option("--snaplen", type=click.IntRange(min=0), default=0, show_default=True,
              help="truncate records to N bytes (0 = full frames)")
@click.option("--view", metavar="node:IP", help="with -o/--send: only the frames a DPU on node IP "
              "(or node:INDEX) sees: src or dst = IP, both directions; truth gets a 'view' field")
@click.option("--views", "views_dir", metavar="DIR", help="write one view per node: DIR/<ip>.pcap "
              "+ DIR/<ip>.truth.json, and DIR/truth.json (the whole capture's truth)")
@click.option("--clock-skew", "clock_skew", type=click.FloatRange(min=0), default=0.0,
              metavar="US", help="with --view/--views: each node's DPU clock is off by a fixed "
              "offset, uniform in +-US microseconds (from --seed and the node; in the truth's "
              "view.clock_offset_ns)")
@click.option("--list-presets", is_flag=True, help="list the named presets and exit")
@click.option("--send", "send_iface", metavar="IFACE", help="send the frames on IFACE over AF_PACKET instead of writing")
@click.option("--netns", metavar="NAME", help="with --send: open the socket inside network namespace NAME")
@click.option("--rate", type=click.FloatRange(min=0), default=100_000.0, show_default=True,
              help="with --send: frames per second (0 = unpaced)")
@click.option("--max-frames", type=click.IntRange(min=0), default=None, help="with --send: stop after N frames")
@click.option("--max-seconds", type=click.FloatRange(min=0), default=30.0, show_default=True,
              help="with --send: stop after S seconds")
def gen(scenario, output, seed, snaplen, view, views_dir, clock_skew, list_presets, send_iface, netns, rate,
        max_frames, max_seconds):
    """Generate NCCL-like RoCEv2 traffic with known pathologies: a pcap (ns timestamps,
    Ethernet, no FCS) and its ground truth, or frames sent on an interface."""
    from skewscope.gen import (  # heavy (numpy, numba): not loaded by --help
        PRESETS,
        ScenarioError,
        generate,
        truth_path,
        write_views,
    )
    from skewscope.gen.send import send_capture  # heavy (numpy, numba): not loaded by --help

    if list_presets:
        w = max(len(n) for n in PRESETS)
        for name, p in PRESETS.items():
            click.echo(f"{name:<{w}}  {p.get('description', '')}")
        return
    if not scenario:
        raise click.UsageError("give a preset name or a scenario file (or --list-presets)")
    if view is not None and not view.startswith("node:"):
        raise click.UsageError(f"--view takes node:IP or node:INDEX, not {view!r}")
    if view is not None and not output and not send_iface:
        raise click.UsageError("--view needs -o OUT.pcap (or --send IFACE)")
    if clock_skew and view is None and not views_dir:
        raise click.UsageError("--clock-skew needs --view or --views")
    if not output and not send_iface and not views_dir:
        raise click.UsageError("give -o OUT.pcap, --views DIR or --send IFACE")
    if views_dir:
        if not os.path.isdir(views_dir):
            try:
                os.makedirs(views_dir, exist_ok=True)
            except OSError as e:
                raise click.ClickException(f"cannot create {views_dir}: {e.strerror or e}") from None
        if not os.access(views_dir, os.W_OK):
            raise click.ClickException(f"cannot write into {views_dir}: not writable")
    if output:
        d = os.path.dirname(os.path.abspath(output)) or "."
        if not os.path.isdir(d):
            raise click.ClickException(f"cannot write {output}: directory {d} does not exist")
        if not os.access(d, os.W_OK):
            raise click.ClickException(f"cannot write {output}: directory {d} is not writable")
        if os.path.isdir(output):
            raise click.ClickException(f"cannot write {output}: it is a directory")
    try:
        cap = generate(scenario, seed=seed)
    except ScenarioError as e:
        raise click.ClickException(str(e)) from None
    full = cap
    if view is not None:
        try:
            cap = cap.view(view[len("node:"):], clock_skew_us=clock_skew)
        except ScenarioError as e:
            raise click.ClickException(f"--view {view}: {e}") from None
    if output:
        try:
            cap.write_pcap(output, snaplen=snaplen)
            tp = truth_path(output)
            cap.write_truth(tp)
        except OSError as e:
            raise click.ClickException(f"cannot write {output}: {e.strerror or e}") from None
        size = os.path.getsize(output)
        of = f" of {len(full)}, the view of node {cap.view_info['node']}" if view else ""
        click.echo(f"wrote {output} ({len(cap)} frames{of}, {size / 1e6:.1f} MB"
                   f"{', snaplen %d' % snaplen if snaplen else ''}) and {tp}")
    if views_dir:
        try:
            paths = write_views(full, views_dir, snaplen=snaplen, clock_skew_us=clock_skew)
        except OSError as e:
            raise click.ClickException(f"cannot write into {views_dir}: {e.strerror or e}") from None
        click.echo(f"wrote {len(paths)} per-node views of {len(full)} frames into {views_dir} "
                   f"(<ip>.pcap + <ip>.truth.json each, truth.json)")
    if send_iface:
        try:
            r = send_capture(cap, send_iface, netns=netns, rate_pps=rate,
                             max_frames=max_frames, max_seconds=max_seconds)
        except OSError as e:
            raise click.ClickException(f"send failed: {e.strerror or e}") from None
        where = f" in netns {netns}" if netns else ""
        click.echo(f"sent {r['sent']} frames on {send_iface}{where} in {r['seconds']:.2f} s "
                   f"({r['pps']:.0f} frames/s)")


if __name__ == "__main__":  # pragma: no cover
    gen(prog_name="skewgen")
