"""`skewscope export` (one DPU -> Prometheus /metrics) and `skewscope cluster` (the fleet,
from Prometheus). Metric contract and cardinality: docs/fleet.md."""
from __future__ import annotations

import json
import sys
import threading
import time

import click

from skewscope.cli.common import enrich_options, fail, friendly_errors, load_source
from skewscope.core.errors import EXIT_NOT_RUN, EXIT_USAGE
from skewscope.core.signals import exit_on_signals, stop_on_signals
from skewscope.outputs import http as H

EXPORT_EPILOG = """\b
Examples:
  skewscope export -i pf0hpf                      live, /metrics on 127.0.0.1:9435
  skewscope export -i pf0hpf --listen 0.0.0.0:9435 --node gpu-17-dpu
  skewscope export --from run.snap --once         print the exposition once and exit
  skewscope export --from v1.pcap --once --node dpu1 --node-ip 10.0.0.1 --format openmetrics > v1.om
  promtool tsdb create-blocks-from openmetrics v1.om PROM_DATA_DIR     backfill (docs/fleet.md)
  skewscope export --from run.pcap                + /v1/findings, /v1/load of the file
  skewscope export -i pf0hpf --listen 0.0.0.0:9435 --token-file /etc/ss.token
  curl -H "Authorization: Bearer $(cat /etc/ss.token)" HOST:9435/v1/load
\b
Endpoints (read-only; docs/fleet.md "Exporter HTTP API"): GET /metrics,
GET /v1/findings, GET /v1/load (JSON, "version": 1) from the last analysis:
of the file once, or live of the last --analysis-window seconds every
--analysis-every reads. 401 without the token (--token-file), 404 other
paths, 405 other methods, 503 until the first analysis is done.
\b
Cardinality per DPU (docs/fleet.md): 15 series per peer pair (src, dst, traffic class)
seen, up to --max-peers pairs (later pairs add up in one src="_overflow" pair); 43 per
top-K flow; 1 per destination and per data source; about 130 per node (+ process_*).
\b
Exit codes: 0 ok (--once, or Ctrl-C); 2 usage; 3 unreadable --from FILE or cannot listen;
4 not root (-i); 5 bcc missing; 6 no such interface; 7 busy; 8 kernel refused.
"""


@click.command(epilog=EXPORT_EPILOG)
@click.option("-i", "--interface", "iface", help="interface to watch live (needs root)")
@click.option("--from", "from_file", type=click.Path(dir_okay=False),
              help="serve a snapshot (.snap) or a capture (pcap/pcapng) instead of live traffic")
@click.option("--listen", default="127.0.0.1:9435", show_default=True,
              help="ADDR:PORT to serve /metrics on; [ADDR]:PORT for IPv6. Loopback unless you ask.")
@click.option("--node", default=None, help="this DPU's identity, the `node` label  [default: hostname]")
@click.option("--top-k", type=click.IntRange(0, 10000), default=10, show_default=True,
              help="flows (QPs) exported one by one: the K largest by bytes")
@click.option("--max-peers", type=click.IntRange(1, 1 << 20), default=4096, show_default=True,
              help="peer pairs exported one by one (first seen first); more add up in one overflow pair")
@click.option("--interval", type=click.FloatRange(0.05, 3600), default=1.0, show_default=True,
              help="live: seconds between reads of the data plane")
@click.option("--tc", "use_tc", is_flag=True, help="live: attach with TC clsact instead of XDP")
@click.option("--xdp-mode", type=click.Choice(["native", "generic"]), default="native", show_default=True)
@click.option("--direction", type=click.Choice(["ingress", "egress", "both"]), default="ingress",
              show_default=True, help="live, with --tc: which direction(s) to watch")
@click.option("--max-flows", type=click.IntRange(16, 1 << 24), default=65536, show_default=True)
@click.option("--once", is_flag=True, help="print the exposition to stdout once and exit (no server)")
@click.option("--format", "fmt", type=click.Choice(["text", "openmetrics"]), default="text", show_default=True,
              help="with --once: openmetrics = the OpenMetrics text format, every sample stamped with "
                   "--timestamp (input of `promtool tsdb create-blocks-from openmetrics`: backfill)")
@click.option("--timestamp", type=click.FloatRange(0, None), default=None, metavar="UNIX_S",
              help="with --once --format openmetrics: the samples' time  [default: now]")
@click.option("--token-file", type=click.Path(dir_okay=False),
              help="require 'Authorization: Bearer TOKEN' (TOKEN = the file's first line) on every endpoint")
@click.option("--open-metrics", is_flag=True,
              help="with --token-file: serve /metrics without the token (the /v1 endpoints still need it)")
@click.option("--analysis-every", type=click.IntRange(1, 100000), default=H.DEFAULT_EVERY, show_default=True,
              metavar="K", help="live: analyse the recent window every K reads (skipped while one still runs)")
@click.option("--analysis-window", type=click.FloatRange(0.1, 3600), default=H.DEFAULT_WINDOW_S,
              show_default=True, metavar="S", help="live: seconds of traffic each analysis covers")
@click.option("--no-analysis", is_flag=True, help="serve /metrics only (/v1/* answer 503)")
@click.option("--node-ip", metavar="IP", help="the IP of the node this DPU watches (its per-node timing series, "
              "label ip); default: the IP that is an end of every data flow, else (--from FILE only) every node seen")
@enrich_options
@friendly_errors
def export(iface, from_file, listen, node, top_k, max_peers, interval, use_tc, xdp_mode, direction, max_flows,
           once, fmt, timestamp, token_file, open_metrics, analysis_every, analysis_window, no_analysis, node_ip,
           enricher):
    """Serve this DPU's view as Prometheus metrics (/metrics): per-peer counters, top-K flows,
    message-size and gap histograms. Scrape every DPU; `skewscope cluster` and the rules in
    docs/prometheus/ turn them into the fleet-wide matrix and skew."""
    from skewscope.live.export import LiveSource  # heavy (numba)
    from skewscope.live.runner import AnalysisRunner, load_analyze  # heavy (numba)
    from skewscope.outputs import exporter as E  # heavy (numba)
    from skewscope.outputs import expose as X  # heavy (numba, prometheus_client)
    if bool(iface) == bool(from_file):
        fail("export needs exactly one of -i IFACE (live) or --from FILE", EXIT_USAGE)
    try:
        addr, port = X.parse_listen(listen)
    except X.ListenError as e:
        fail(str(e), EXIT_USAGE)
    node = node if node is not None else E.default_node()
    if not node.strip():
        fail("--node must not be empty", EXIT_USAGE)
    if open_metrics and not token_file:
        fail("--open-metrics only makes sense with --token-file", EXIT_USAGE)
    if fmt != "text" and not once:
        fail("--format openmetrics only makes sense with --once", EXIT_USAGE)
    if timestamp is not None and fmt != "openmetrics":
        fail("--timestamp only makes sense with --once --format openmetrics", EXIT_USAGE)
    token = H.read_token(token_file) if token_file else None
    analyst = None
    if not once and not no_analysis:
        runner = AnalysisRunner(load_analyze(), nice=H.ANALYSIS_NICE, enrich=enricher or None)
        analyst = H.Analyst(node, "file" if from_file else "live", runner, every=analysis_every,
                            window_s=analysis_window)
    if node_ip is not None:
        node_ip = E.check_node_ip(node_ip)
    if from_file:
        snap = load_source(from_file)
        E.check_node_in(snap, node_ip)
        src = E.StaticSource(snap, node, top_k=top_k, max_peers=max_peers, node_ip=node_ip)
    else:
        with exit_on_signals():   # SIGTERM/SIGHUP during the compile/attach: detach, exit 128 + n
            src = LiveSource(iface, node, top_k=top_k, max_peers=max_peers, interval=interval,
                             mode="tc" if use_tc else "xdp", xdp_mode=xdp_mode, direction=direction,
                             max_flows=max_flows, node_ip=node_ip, runner=analyst.runner if analyst else None,
                             every=analysis_every, window_s=analysis_window)
    try:
        if once and fmt == "openmetrics":
            # a backfill describes the DPU's traffic, not this converting process: no process_*
            reg = X.make_registry(X.SkewscopeCollector(src.get, enricher.inventory), process_metrics=False)
            click.echo(X.render_openmetrics(reg, time.time() if timestamp is None else timestamp), nl=False)
            return
        reg = X.make_registry(X.SkewscopeCollector(src.get, enricher.inventory))
        if once:
            click.echo(X.render(reg), nl=False)
            return
        try:
            from skewscope.mitigate.software import list_all  # light until asked
            server = H.Server(addr, port, reg, analyst=analyst, token=token, open_metrics=open_metrics,
                              mitigations=list_all)
        except OSError as e:
            fail(f"cannot listen on {listen}: {e.strerror or e}", EXIT_NOT_RUN)
        server.start()
        if analyst is not None and from_file:
            analyst.start_once(snap)
        real_port = server.server_address[1]
        what = src.describe() if iface else from_file
        if token is None and not H.is_loopback(addr):
            click.echo(f"skewscope export: warning: listening on {_hostport(addr, real_port)} without --token-file: "
                       "anyone who can reach it can read this node's traffic and findings", err=True)
        click.echo(f"skewscope export: node {node!r}, {what}, serving http://{_hostport(addr, real_port)}/metrics"
                   f" and /v1/findings, /v1/load (Ctrl-C to stop)", err=True)
        stop = threading.Event()
        with stop_on_signals(stop):
            while not stop.wait(0.5):
                err = getattr(src, "error", None)
                if err is not None:
                    fail(f"reading the data plane failed: {err}; stopping", EXIT_NOT_RUN)
            server.stop()
            src.close()     # detach while a second signal still only sets `stop`
    finally:
        src.close()


def _hostport(addr: str, port: int) -> str:
    return f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"


CLUSTER_EPILOG = """\b
Examples:
  skewscope cluster --prometheus http://127.0.0.1:9090
  skewscope cluster --prometheus http://prom:9090 --window 15m --json
  skewscope cluster --prometheus http://127.0.0.1:9090 --window all   counters since exporter start
\b
Exit codes: 0 ok; 2 usage; 3 Prometheus unreachable, refused the query or has no skewscope data.
"""


@click.command(epilog=CLUSTER_EPILOG)
@click.option("--prometheus", "url", required=True, help="Prometheus base URL (http://HOST:9090)")
@click.option("--window", default="5m", show_default=True,
              help="Prometheus range (30s, 5m, 1h...) for increase(); 'all' = counter values as they are")
@click.option("--json", "as_json", is_flag=True, help="print the JSON document (the shape of `report --json`)")
@click.option("--timeout", type=click.FloatRange(0.1, 600), default=30.0, show_default=True,
              help="seconds per HTTP request")
@click.option("--selector", default="", help="extra PromQL label matchers for every query, e.g. 'job=\"dpus\"'")
@click.option("--no-rules", is_flag=True, help="query raw series even when recording rules exist")
@click.option("--top", type=click.IntRange(1, 100000), default=20, show_default=True, help="pairs in the table")
@click.option("--clock", type=click.Choice(["unsynchronised", "ptp"]), default="unsynchronised", show_default=True,
              help="ptp: the DPUs' clocks are PTP-synchronised, so their own timestamps may be compared with "
                   "ours (staleness); default: no DPU timestamp is compared with another clock")
@click.option("--stats", is_flag=True, help="print the query cost (queries, samples returned, seconds) on stderr")
@click.option("--at", "at", type=click.FloatRange(0, None), default=None, metavar="UNIX_S",
              help="evaluate at this time instead of now (e.g. a Prometheus backfilled with `export --once "
                   "--format openmetrics`); the window ends there")
@enrich_options
@friendly_errors
def cluster(url, window, as_json, timeout, selector, no_rules, top, clock, stats, at, enricher):
    """Cluster-wide traffic matrix, skew and findings from the Prometheus that scrapes every
    DPU's `skewscope export`: the same metrics and findings as the single-node report."""
    from skewscope.outputs import cluster as C  # heavy (numpy): not loaded by --help
    try:
        doc = C.run(url, window=window, timeout=timeout, selector=selector, use_rules=not no_rules, clock=clock,
                    at=at)
    except C.ClusterError as e:
        fail(str(e), e.code)
    enricher(doc, meta=doc.get("meta"))   # a unix clock: the findings' DCGM window
    if stats:
        m = doc["meta"]
        click.echo(f"cluster: queries {m['queries']}, samples returned {m['samples_returned']}, "
                   f"{m['query_seconds']:.3f} s in Prometheus queries, {len(m['dpus'])} DPUs", err=True)
    if as_json:
        click.echo(json.dumps(doc, indent=2))
    else:
        C.human(doc, top=top)
    sys.stdout.flush()
