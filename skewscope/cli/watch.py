"""`skewscope watch`: finding events for controllers (opened / updated / resolved), on stdout
(human lines or NDJSON) and to webhooks. Schema and semantics: docs/feedback.md.

    skewscope watch (-i IFACE | --from FILE | --prometheus URL) [--json] [--webhook URL]...
                    [--interval S] [--window S] [--hold S] [--token-file F] [--duration D]

--from FILE: diagnose's analysis (cli.diagnose.run), every finding `opened`, diagnose's exit
code (0 healthy, 1 warning, 2 critical, 3 could not run). -i IFACE: live reads every
--interval, the last --window seconds analysed in a worker thread (the live loop, skewscope/live/),
events from a Tracker, until Ctrl-C / SIGTERM / --duration (detaches). --prometheus URL:
the fleet findings of `skewscope cluster` every --interval.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from datetime import datetime, timezone

import click

from skewscope.cli import diagnose as D
from skewscope.cli.common import enrich_options, fail, friendly_errors, load_source, threshold_option
from skewscope.cli.config import config_option
from skewscope.cli.live import Duration, _stale_policy
from skewscope.core.errors import EXIT_NO_PRIV, EXIT_NOT_RUN, DataplaneError, PcapError
from skewscope.core.signals import stop_on_signals
from skewscope.outputs import events as E
from skewscope.core.when import Clock

EPILOG = """\b
Examples:
  skewscope watch --from run.pcap --json            every finding as an `opened` event (NDJSON)
  skewscope watch -i pf0hpf --hold 30               live: opened / updated / resolved lines
  skewscope watch -i eth1 --json --webhook http://127.0.0.1:8080/events --token-file tok
  skewscope watch --prometheus http://127.0.0.1:9090 --interval 30   fleet findings
  skewscope watch --from run.snap --json | python docs/examples/consumer.py
\b
Exit codes: --from: diagnose's (0 healthy, 1 warning, 2 critical, 3 could not run).
Live/Prometheus: 0 on Ctrl-C or --duration, 143/129 on SIGTERM/SIGHUP, 3 could not run,
4 not root, 5 bcc missing, 6 no such interface, 7 busy, 8 kernel refused. Bad arguments: 3
(2 means critical here). Events: docs/feedback.md.
"""

NOTE = "skewscope watch"


class _WatchCommand(click.Command):
    """Bad arguments are "could not run" (3), as for diagnose: 2 means critical."""

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.exceptions.UsageError as e:
            click.echo(f"{NOTE}: {e.format_message()}", err=True)
            sys.exit(EXIT_NOT_RUN)


def _say(line: str) -> None:
    click.echo(f"{NOTE}: {line}", err=True)


def read_token(path: str) -> str:
    """The bearer token: the file's first line, stripped (one-line error when unreadable/empty)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            tok = fh.readline().strip()
    except OSError as e:
        fail(f"--token-file {path}: {e.strerror or e}", EXIT_NOT_RUN)
    if not tok:
        fail(f"--token-file {path}: empty (the token is the file's first line)", EXIT_NOT_RUN)
    return tok


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def action_text(a: dict) -> str:
    """One action in a few words (the human line)."""
    t = a.get("type")
    if t == "rebalance_experts":
        mv = a.get("move_fraction")
        return f"rebalance experts off {a.get('hot')}" + (f" (move {mv:.0%} of its traffic)" if mv else "")
    if t in ("drain", "check_node"):
        return f"{t.replace('_', ' ')} {a.get('node')}"
    if t == "check_link":
        return f"check link {a.get('src') or '*'} -> {a.get('dst') or 'uplink'}"
    if t == "spread_senders":
        return f"spread the senders into {a.get('dst')}"
    if t == "rebalance_batches":
        return "rebalance batches (pack sequences by length)"
    if t == "reroute_requests":
        to = a.get("to") or []
        return f"reroute requests from {a.get('from')}" + (f" to {', '.join(to[:3])}" if to else "")
    if t == "isolate_prefill":
        return "isolate prefill from the decode group"
    return str(t)


def _iso_ms(t: float) -> str:
    d = datetime.fromtimestamp(t, timezone.utc)
    return d.strftime("%Y-%m-%dT%H:%M:%S.") + f"{d.microsecond // 1000:03d}Z"


def when_text(ev: dict) -> str:
    """Since when the condition holds (the event's since/until, unix s)."""
    s, u = ev.get("since"), ev.get("until")
    if s is None:
        return ""
    return f"since {_iso_ms(s)}" + (f", until {_iso_ms(u)}" if u is not None else ", still holding")


def mitigation_line(ev: dict) -> str:
    """A closed-loop step (--mitigate): what was done about which finding, and why."""
    acts = ev.get("actions") or []
    what = acts[0]["describe"] if len(acts) == 1 else (f"{len(acts)} actions, e.g. {acts[0]['describe']}" if acts else "")
    ids = ",".join(str(a["id"]) for a in acts if a.get("id"))
    hl = ev.get("headline") or {}
    num = (f"; {hl['name']} {hl['before']:.3g}" + (f" -> {hl['after']:.3g}" if hl.get("after") is not None else "")
           if hl.get("before") is not None else "")
    why = f" ({ev['reason']})" if ev.get("reason") else ""
    return (f"{_iso(ev['time'])} MITIGATE {ev['step'].upper():8s} {ev.get('kind')} [{str(ev['finding_id']).split(':', 1)[-1]}]"
            f" on {ev['interface']} {ev['direction']}{' ids ' + ids if ids else ''}: {what}{num}{why}")


def human_line(ev: dict, nested: bool = False) -> str:
    """One event; nested: a finding of the incident whose lead's line came just before
    (indented under it); a finding of another incident names it."""
    if ev.get("event") == "mitigation":
        return mitigation_line(ev)
    f = ev["finding"]
    acts = "; ".join(action_text(a) for a in f.get("actions") or [])
    extra = f" ({ev['change']})" if ev.get("change") else ""
    inc = ev.get("incident")
    of = f" (incident {inc})" if inc and inc != ev["id"] and not nested else ""
    pad = "  └ " if nested else ""
    line = (f"{pad}{_iso(ev['time'])} {ev['event'].upper():8s} {str(f.get('severity')).upper():8s} {f.get('kind')} "
            f"[{ev['id'].split(':', 1)[1]}]{of}{extra}: {f.get('message')}")
    when = when_text(ev) if ev["event"] != "resolved" else ""
    ind = "    " + ("    " if nested else "")
    cause = (f.get("cause") or {}).get("text") if ev["event"] != "resolved" else None     # --dcgm
    return (line + (f"\n{ind}{when}" if when else "") + (f"\n{ind}cause: {cause}" if cause else "")
            + (f"\n{ind}-> {acts}" if acts and ev["event"] != "resolved" else ""))


class Emitter:
    """stdout (human or NDJSON, flushed per event) + the webhooks."""

    def __init__(self, as_json: bool, hooks: list[E.Webhook], source: str, mitigator=None):
        self.as_json, self.hooks, self.source = as_json, hooks, source
        self.mit = mitigator             # --mitigate: mitigate.loop.Mitigator
        self.count = 0

    def analysis(self, evs, tr) -> None:
        """One analysis' finding events, then what the closed loop did about them."""
        self.emit(evs)
        if self.mit is not None:
            from skewscope.mitigate.loop import current_findings  # light
            self.emit(self.mit.step(evs, current_findings(tr)))

    def emit(self, evs) -> None:
        evs = list(evs)
        # NDJSON: the Tracker's order (a contract); human: each incident's lines together, lead first
        for ev, nested in ([(e, False) for e in evs] if self.as_json else E.by_incident(evs)):
            self.count += 1
            if self.as_json:
                sys.stdout.write(json.dumps(ev, separators=(",", ":")) + "\n")
            else:
                sys.stdout.write(human_line(ev, nested) + "\n")
            sys.stdout.flush()
            for h in self.hooks:
                h.post(ev)

    def finish(self, drain_s: float, summary: bool = True) -> None:
        """Close the webhooks (bounded), then the summary: stderr line + NDJSON stats line
        (not after an error that stops the watch: that is one line on stderr only)."""
        if self.mit is not None:
            self.emit(self.mit.close())
        deadline = time.monotonic() + drain_s          # one --drain for all the webhooks
        for h in self.hooks:
            h.close(max(0.0, deadline - time.monotonic()))
        st = [h.stats() for h in self.hooks]
        for s in st:
            if s["dropped"] or s["failed"]:
                _say(f"webhook {s['url']}: {s['sent']} sent, {s['dropped']} dropped (queue full "
                     f"{s['dropped_queue_full']}, gave up {s['dropped_gave_up']}, at exit {s['dropped_at_exit']}), "
                     f"{s['failed']} failed tries, {s['retries']} retries")
        if self.as_json and summary:
            sys.stdout.write(json.dumps(E.stats_line(self.count, st, time.time(), self.source),
                                        separators=(",", ":")) + "\n")
            sys.stdout.flush()


def _file_times(snap) -> tuple[float, float]:
    """Source times (unix s) of a file's first and last packet: pcap time, or a live
    capture's wall start plus its monotonic span."""
    m = snap.meta
    f, last = float(m.get("first_ts", 0) or 0), float(m.get("last_ts", 0) or 0)
    if m.get("clock") == "monotonic":
        t0 = float(m.get("started_at") or 0) or time.time()
        return t0, t0 + max(0.0, last - f) / 1e9
    return f / 1e9, last / 1e9


def _from_file(path, em: Emitter, hold: float, drain_s: float, enricher=None, thresholds=None) -> int:
    from skewscope.core.snapshot import SnapshotError  # heavy (numpy): not loaded by --help
    try:
        snap = load_source(path)
        doc, code = D.run(snap, enricher=enricher, thresholds=thresholds or None)
    except (DataplaneError, PcapError, SnapshotError) as e:
        em.finish(0, summary=False)
        fail(str(e), EXIT_NOT_RUN)
    except MemoryError:
        fail("out of memory while analysing (capture a shorter window)", EXIT_NOT_RUN)
    first, last = _file_times(snap)
    tr = E.Tracker(hold=hold, source=em.source)
    em.analysis(tr.update(doc["findings"], now=last, seen=(first, last), clock=Clock.of(snap.meta, wall_end=last)),
                tr)
    em.finish(drain_s)
    return code


def _live(iface, use_tc, direction, xdp_mode, sample_n, max_flows, force_detach, interval, window, tr: E.Tracker,
          duration, em: Emitter, drain_s: float, enricher=None, thresholds=None) -> int:
    from skewscope.live.loop import Attached, Loop  # heavy (numpy): not loaded by --help
    from skewscope.live.runner import AnalysisRunner, load_analyze  # heavy (numpy): not loaded by --help
    from skewscope.sources.live import LiveSession  # heavy (numpy): not loaded by --help
    analyze = load_analyze()
    if analyze is None:
        fail("the analysis package is not importable (numba missing?)", EXIT_NOT_RUN)
    sess = LiveSession(iface, mode="tc" if use_tc else "xdp", xdp_mode=xdp_mode, direction=direction,
                       sample_n=sample_n, max_flows=max_flows, on_stale=_stale_policy(force_detach), source="live")
    runner = AnalysisRunner(analyze, enrich=enricher or None, thresholds=thresholds or None)
    loop = Loop(sess, interval, window, runner)
    seen_when = 0.0
    err_said = ""
    t_end = time.monotonic() + duration if duration else None
    try:
        with Attached(sess) as att:
            att.open()
            if sess.removed_leftover is not None:
                _say(f"removed stale {sess.removed_leftover.describe()} from {iface}")
            _say(sess.startup_line())
            for _ in loop.ticks():
                if runner.when != seen_when:          # a run ended: its window is the runner's last
                    seen_when = runner.when
                    err = f"analysis failed: {runner.error}" if runner.error else ""
                    if err and err != err_said:
                        _say(err)
                    err_said = err
                    last = runner.latest()
                    if not err and last is not None:
                        w = last["window"]
                        end = w["end_wall"]
                        em.analysis(tr.update(last["analysis"]["findings"], now=end,
                                              seen=(end - w["duration_s"], end), clock=last["analysis"]["_clock"]),
                                    tr)
                if t_end is not None and time.monotonic() >= t_end:
                    break
    finally:
        if sess.t0_mono_ns:
            _say(f"detached skewscope from {iface}")
        em.finish(drain_s)
    return att.code


def _prometheus(url, interval, window, tr: E.Tracker, duration, timeout, em: Emitter, drain_s: float,
                prom_window: str | None = None, enricher=None) -> int:
    from skewscope.outputs import cluster as C  # heavy (numpy): not loaded by --help
    prom_window = prom_window or f"{window:g}s"
    try:
        C.window_seconds(prom_window)
    except C.ClusterError as e:                    # bad arguments exit 3 here (2 means critical)
        fail(str(e).replace("--window", "--prometheus-window"), EXIT_NOT_RUN)
    stop = threading.Event()
    with stop_on_signals(stop) as got:     # Ctrl-C: exit 0; SIGTERM/SIGHUP: 128 + n
        t_end = time.monotonic() + duration if duration else None
        last_err = ""
        first, failed = True, False
        try:
            while not stop.is_set():
                t0 = time.monotonic()
                try:
                    doc = C.run(url, window=prom_window, timeout=timeout)
                    if enricher:
                        enricher(doc, meta=doc.get("meta"))
                except C.ClusterError as e:
                    if first:
                        failed = True
                        raise
                    if str(e) != last_err:
                        _say(f"{e} (retrying every {interval:g} s)")
                    last_err = str(e)
                else:
                    if last_err:
                        _say("Prometheus answers again")
                    last_err, first = "", False
                    now = time.time()
                    span = C.window_seconds(prom_window)
                    em.analysis(tr.update(doc.get("findings") or [], now=now, seen=(now - span, now) if span else None),
                                tr)
                if t_end is not None and time.monotonic() >= t_end:
                    break
                wait = interval - (time.monotonic() - t0)
                if t_end is not None:
                    wait = min(wait, t_end - time.monotonic())
                stop.wait(max(0.0, wait))
        finally:
            em.finish(0 if failed else drain_s, summary=not failed)
    return 128 + got["sig"] if got["sig"] and got["sig"] != signal.SIGINT else 0


@click.command(cls=_WatchCommand, epilog=EPILOG)
@click.option("-i", "--interface", "iface", metavar="IFACE", help="watch live traffic on IFACE (root)")
@click.option("--from", "from_file", metavar="FILE", type=click.Path(dir_okay=False),
              help="analyse a .snap/pcap/pcapng once: every finding as an `opened` event, diagnose's exit code")
@click.option("--prometheus", "prom", metavar="URL", help="fleet findings from Prometheus (as `skewscope cluster`)")
@click.option("--prometheus-window", "prom_window", metavar="WINDOW",
              help="--prometheus: cluster's --window (30s, 5m, or 'all' = totals since each exporter started, "
                   "for `export --from` exporters); default: --window seconds")
@click.option("--json", "as_json", is_flag=True, help="NDJSON: one event per line (flushed), a stats line last")
@click.option("--webhook", "webhooks", multiple=True, metavar="URL",
              help="POST each event as JSON to URL (repeatable; background, bounded queue, retries)")
@click.option("--token-file", type=click.Path(dir_okay=False), metavar="FILE",
              help="send 'Authorization: Bearer TOKEN' (TOKEN = the file's first line) to the webhooks")
@click.option("--interval", type=click.FloatRange(0.1, 3600), default=None, metavar="S",
              help="live: seconds between reads (default 1); --prometheus: between queries (default 15)")
@click.option("--window", type=click.FloatRange(0.5, 86400), default=None, metavar="S",
              help="seconds of traffic each analysis covers (live default 10; --prometheus default 60)")
@click.option("--hold", type=click.FloatRange(0, 86400), default=30.0, show_default=True, metavar="S",
              help="a finding absent from the analyses for S seconds is `resolved`")
@click.option("--confirm", type=click.IntRange(1, 1000), default=2, show_default=True, metavar="N",
              help="live/--prometheus: an update needs the change in N consecutive analyses")
@click.option("--duration", type=Duration(), default=None, help="live/--prometheus: stop after this long")
@click.option("--webhook-timeout", type=click.FloatRange(0.1, 600), default=5.0, show_default=True, metavar="S",
              help="seconds per POST")
@click.option("--webhook-retries", type=click.IntRange(0, 20), default=3, show_default=True, metavar="N",
              help="retries per event (backoff 0.5 s, doubling, at most 8 s)")
@click.option("--webhook-queue", type=click.IntRange(1, 1 << 20), default=1000, show_default=True, metavar="N",
              help="events queued per webhook before new ones are dropped (counted)")
@click.option("--drain", "drain_s", type=click.FloatRange(0, 600), default=5.0, show_default=True, metavar="S",
              help="at exit, wait at most S seconds for the webhooks' queued events")
@click.option("--timeout", type=click.FloatRange(0.1, 600), default=30.0, show_default=True, metavar="S",
              help="--prometheus: seconds per query")
@click.option("--tc", "use_tc", is_flag=True, help="live: attach with TC clsact instead of XDP")
@click.option("--direction", type=click.Choice(["ingress", "egress", "both"]), default="ingress",
              show_default=True, help="live, with --tc: which direction(s)")
@click.option("--xdp-mode", type=click.Choice(["native", "generic"]), default="native", show_default=True)
@click.option("--sample", "sample_n", type=click.IntRange(1, 1 << 20), default=1, show_default=True, metavar="N",
              help="live: count 1 RoCE packet in N")
@click.option("--max-flows", type=click.IntRange(16, 1 << 24), default=65536, show_default=True)
@click.option("--force-detach", is_flag=True, help="live: remove a stale skewscope program left on IFACE")
@click.option("--mitigate", "policy_file", metavar="POLICY", type=click.Path(dir_okay=False),
              help="closed loop (root): act on findings as the policy file allows, verify, revert "
                   "(docs/mitigation.md \"Closed loop\")")
@enrich_options
@threshold_option
@config_option
@friendly_errors
def watch(iface, from_file, prom, prom_window, as_json, webhooks, token_file, interval, window, hold, confirm, duration, webhook_timeout,
          webhook_retries, webhook_queue, drain_s, timeout, use_tc, direction, xdp_mode, sample_n, max_flows,
          force_detach, policy_file, enricher, thresholds):
    """Finding events for controllers and schedulers: each finding `opened`, `updated`
    (severity or headline evidence changed) and `resolved` (absent for --hold seconds), with a
    stable id and machine-readable actions; human lines, NDJSON (--json) and webhooks."""
    if sum(1 for x in (iface, from_file, prom) if x) != 1:
        fail("watch needs exactly one of -i IFACE, --from FILE or --prometheus URL", EXIT_NOT_RUN)
    if iface and not use_tc and direction != "ingress":
        fail("--direction needs --tc (XDP sees ingress only)", EXIT_NOT_RUN)
    token = read_token(token_file) if token_file else None
    hooks = []
    for url in webhooks:
        try:
            hooks.append(E.Webhook(url, token=token, queue_size=webhook_queue, timeout=webhook_timeout,
                                   retries=webhook_retries, log=_say))
        except E.WebhookURLError as e:
            _say(f"{e}: ignored (events still go to stdout{' and the other webhooks' if len(webhooks) > 1 else ''})")
    source = from_file or (f"live:{iface}" if iface else prom)
    mit = None
    if policy_file:
        from skewscope.mitigate.loop import Mitigator  # light
        from skewscope.mitigate.policy import load as load_policy  # light
        from skewscope.mitigate.rules import MitigationError  # light
        try:
            pol = load_policy(policy_file)
            if pol.backend == "flower":
                from skewscope.mitigate.flower import Flower  # light (tc)
                backend = Flower(pol.interface, pol.direction)
            else:
                from skewscope.mitigate.software import Software  # light until the first action
                backend = Software(pol.interface, pol.direction)
            mit = Mitigator(pol, backend)
        except MitigationError as e:
            fail(str(e), EXIT_NOT_RUN)
        if os.geteuid() != 0:
            fail("--mitigate needs root (it changes the data path of the policy's interface)", EXIT_NO_PRIV)
    em = Emitter(as_json, hooks, source, mit)
    if from_file:
        code = _from_file(from_file, em, hold, drain_s, enricher, thresholds)
    elif iface:
        code = _live(iface, use_tc, direction, xdp_mode, sample_n, max_flows, force_detach, interval or 1.0,
                     window or 10.0, E.Tracker(hold=hold, source=source, confirm=confirm), duration, em, drain_s,
                     enricher, thresholds)
    else:
        code = _prometheus(prom, interval or 15.0, window or 60.0, E.Tracker(hold=hold, source=source, confirm=confirm),
                           duration, timeout, em, drain_s, prom_window, enricher)
    sys.exit(code)
