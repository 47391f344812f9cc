#!/usr/bin/env python3
"""A reference consumer of skewscope finding events (docs/feedback.md): prints the action a
controller would take for each event. Standard library only.

    skewscope watch --from run.pcap --json | python docs/examples/consumer.py
    python docs/examples/consumer.py --listen 127.0.0.1:8080 [--token-file tok] [--max-events N]
        (with: skewscope watch -i IFACE --webhook http://127.0.0.1:8080/ --token-file tok)

A real controller would replace the `print` in `decide()` with its own call (move expert
replicas, drain a node in the scheduler, reroute requests, page the network team).
"""
from __future__ import annotations

import argparse
import http.server
import json
import sys

SCHEMA = "skewscope.finding_event/v1"


def describe(action: dict) -> str:
    """One action as the sentence a controller would log."""
    t = action.get("type")
    if t == "rebalance_experts":
        mv = action.get("move_fraction")
        what = f"{mv:.0%} of" if isinstance(mv, (int, float)) else "part of"
        return f"would move {what} expert traffic off {action.get('hot')}"
    if t == "drain":
        return f"would drain {action.get('node')}"
    if t == "check_node":
        return f"would open a ticket to check node {action.get('node')}"
    if t == "check_link":
        return f"would ask the network team to check link {action.get('src') or 'any'} -> {action.get('dst') or 'uplink'}"
    if t == "spread_senders":
        return f"would stagger the {len(action.get('senders') or [])} senders into {action.get('dst')}"
    if t == "rebalance_batches":
        return "would pack/bucket sequences by length across " + ", ".join(action.get("members") or [])
    if t == "reroute_requests":
        to = action.get("to") or []
        return f"would send new requests away from {action.get('from')}" + (f" to {', '.join(to)}" if to else "")
    if t == "isolate_prefill":
        return "would move prefill off the decode group " + ", ".join(action.get("members") or [])
    return f"no handler for action {t!r}"


def decide(ev: dict) -> list[str]:
    """The lines this consumer prints for one event (and what a controller would do)."""
    if ev.get("schema") != SCHEMA:
        if ev.get("event") == "stats":
            return [f"stats: {ev.get('events')} events, {ev.get('dropped')} dropped"]
        return []
    f = ev.get("finding") or {}
    head = f"{ev.get('event')} {f.get('severity')} {f.get('kind')} {ev.get('id')}"
    if ev.get("event") == "resolved":
        return [f"{head}: would undo/close what it did for this finding"]
    acts = f.get("actions") or []
    if not acts:
        return [f"{head}: nothing to automate (notify a human)"]
    return [f"{head}: {describe(a)}" for a in acts]


def from_stdin(stream) -> int:
    n = 0
    for line in stream:
        line = line.strip()
        if not line:
            continue
        try:
            ev = json.loads(line)
        except json.JSONDecodeError:
            print(f"consumer: not JSON, skipped: {line[:60]!r}", file=sys.stderr)
            continue
        for out in decide(ev):
            print(out, flush=True)
        n += 1
    return n


def serve(listen: str, token: str | None, max_events: int | None) -> int:
    host, _, port = listen.rpartition(":")
    seen = {"n": 0}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            if token is not None and self.headers.get("Authorization") != f"Bearer {token}":
                self.send_response(401)
                self.end_headers()
                return
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                ev = json.loads(body)
            except json.JSONDecodeError:
                self.send_response(400)
                self.end_headers()
                return
            self.send_response(204)
            self.end_headers()
            for out in decide(ev):
                print(out, flush=True)
            seen["n"] += 1

        def log_message(self, *a):      # quiet: only the decisions on stdout
            pass

    srv = http.server.HTTPServer((host.strip("[]") or "127.0.0.1", int(port)), Handler)
    print(f"consumer: listening on http://{listen}/", file=sys.stderr, flush=True)
    try:
        while max_events is None or seen["n"] < max_events:
            srv.handle_request()
    except KeyboardInterrupt:
        pass
    finally:
        srv.server_close()
    return seen["n"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="print the action a controller would take per skewscope event")
    ap.add_argument("--listen", metavar="HOST:PORT", help="receive webhook POSTs instead of reading NDJSON on stdin")
    ap.add_argument("--token-file", help="with --listen: require 'Authorization: Bearer <first line>'")
    ap.add_argument("--max-events", type=int, help="with --listen: exit after N events")
    a = ap.parse_args(argv)
    if a.listen:
        token = None
        if a.token_file:
            with open(a.token_file, encoding="utf-8") as fh:
                token = fh.readline().strip()
        serve(a.listen, token, a.max_events)
    else:
        from_stdin(sys.stdin)
    return 0


if __name__ == "__main__":
    sys.exit(main())
