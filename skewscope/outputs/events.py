"""Finding events: the stable id, the lifecycle (opened / updated / resolved) and the
machine-readable actions a controller subscribes to (`skewscope watch`, webhooks,
the exporter's /v1/findings). Schema: docs/feedback.md. Light: no numba, no analysis import.

    finding_id(f)          "hot_destination:9f3c0a1b2c4d5e6f" (kind + key entities, sha256 prefix)
    finding_key(f)         the sorted key entities the id hashes (kind-specific, KEY_IPS)
    actions_for(f)         [{"type": "rebalance_experts", ...}, ...] ([] for an unknown kind)
    finding_object(f)      {"id", "kind", "severity", "entities", "message", "evidence", "impact",
                            "actions", "since", "until"}
    Tracker(hold, change)  .update(findings, now, seen, clock) -> [event, ...] at each analysis time
    event(...)             {"schema", "id", "event", "time", "first_seen", "last_seen", "source",
                            "finding", "since", "until"}
    Webhook(url, token)    .post(event): background POSTs, bounded queue, retries, drop counts

A finding here is the analysis' finding dict (Finding.to_dict(): report/diagnose/cluster
--json), read only through dict access.
"""
from __future__ import annotations

import hashlib
import http.client
import ipaddress
import json
import math
import queue
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

from skewscope.outputs.when import Clock

SCHEMA = "skewscope.finding_event/v1"
STATS_SCHEMA = "skewscope.watch_stats/v1"
EVENTS = ("opened", "updated", "resolved")

#: how many of entities.ips (in the analysis' order: the blamed node(s) first) identify a
#: finding of a kind; None = all of them. The rest ("then the members / the senders") may
#: change between analyses of the same condition without making it a new one.
KEY_IPS: dict[str, int | None] = {
    "alltoall_destination_skew": 1,   # the hot destination
    "hot_destination": 1,             # the hot node (a drifting one: the most observed; a short live
                                      # window that sees part of a drift must keep the same id)
    "incast": 1,                      # the destination
    "ring_straggler": 2,              # the sender, its successor
    "straggler": 1,
    "slow_receiver": 1,
    "slow_link": 1,
    "rotating_straggler": 0,          # the ring (the endpoints of its flows): gates rotate
    "pipeline_bubbles": 1,
    "ecn_congestion": 1,
    "cnp_storm": 1,
    "packet_loss": 2,
    "retransmissions": 2,
    "nak_errors": 2,
    "pfc_pause": None,
    "period_jitter": None,
    "decode_jitter": None,
    "prefill_interference": None,
    "slow_tp_shard": 1,
    "pd_imbalance": 1,
    "kv_transfer_slow": 2,
    "instance_load_imbalance": None,  # the instance's members
    "map_overflow": 0,
    "sampling": 0,
}

#: the evidence numbers whose relative move > Tracker.change (default 25%) since the last
#: event of an id makes an `updated` event (besides a severity change); missing keys are
#: ignored. Counts that only grow with the window (packets, steps) are not listed.
HEADLINE: dict[str, tuple[str, ...]] = {
    "alltoall_destination_skew": ("dest_max_over_mean",),
    "hot_destination": ("max_over_mean", "share"),
    "incast": ("max_senders", "throttle_ratio"),
    "ring_straggler": ("send_ratio", "lag_per_step_s"),
    "straggler": ("send_ratio", "max_delay_s"),
    "slow_receiver": ("recv_ratio",),
    "slow_link": ("rate_ratio", "ratio"),
    "rotating_straggler": ("max_share", "lost_per_gated_iteration_s"),
    "pipeline_bubbles": ("bubble_fraction",),
    "ecn_congestion": ("ce_fraction",),
    "cnp_storm": ("max_cnp_rate_per_s",),
    "packet_loss": ("loss_rate",),
    "retransmissions": ("retransmissions",),
    "nak_errors": ("psn_sequence_error",),
    "pfc_pause": ("pause_fraction",),
    "slow_tp_shard": ("lag_per_step_s", "token_share"),
    "pd_imbalance": ("share",),
    "kv_transfer_slow": ("rate_ratio",),
    "instance_load_imbalance": ("load_ratio",),
}


def _ip_sort_key(s):
    try:
        a = ipaddress.ip_address(str(s))
        return (0, a.version, int(a), "")
    except ValueError:
        return (1, 0, 0, str(s))


def _sorted_ips(xs) -> list[str]:
    return sorted({str(x) for x in xs}, key=_ip_sort_key)


def _ips(f: dict) -> list[str]:
    return [str(x) for x in ((f.get("entities") or {}).get("ips") or [])]


def finding_key(f: dict) -> list[str]:
    """The key entities of a finding (sorted, deduplicated): the part of entities.ips that
    names the condition (KEY_IPS); rotating_straggler: the endpoints of its flows (the ring)."""
    kind = str(f.get("kind"))
    ips = _ips(f)
    n = KEY_IPS.get(kind)
    if kind == "rotating_straggler":
        ends = [x for fl in ((f.get("entities") or {}).get("flows") or []) for x in list(fl)[:2]]
        return _sorted_ips(ends or ips)
    return _sorted_ips(ips if n is None else ips[:n])


def finding_id(f: dict) -> str:
    """Stable id: "<kind>:" + the first 16 hex digits of sha256 over kind and the sorted key
    entities (same condition, same id: across runs, processes, finding order)."""
    kind = str(f.get("kind"))
    canon = json.dumps([kind, finding_key(f)], separators=(",", ":"))
    return f"{kind}:{hashlib.sha256(canon.encode()).hexdigest()[:16]}"


def _num(x):
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _weights(ev: dict, hot: str | None) -> dict:
    """Per-destination shares from the evidence: members + dest_bytes when the detector gives
    them (hot_destination), else only the hot destination's share."""
    mem, db = ev.get("members"), ev.get("dest_bytes")
    if isinstance(mem, list) and isinstance(db, list) and len(mem) == len(db):
        tot = sum(float(b) for b in db if _num(b) is not None)
        if tot > 0:
            return {str(ip): round(float(b) / tot, 6) for ip, b in zip(mem, db)}
    share = _num(ev.get("share"))
    if share is None:
        ws = ev.get("windows") or []
        share = _num(ws[-1].get("share")) if ws and isinstance(ws[-1], dict) else None
    return {hot: round(share, 6)} if hot and share is not None else {}


def actions_for(f: dict) -> list[dict]:
    """Machine-readable suggestions for a finding (docs/feedback.md "Actions"); [] for a kind
    without one. Derived from the finding's entities and evidence only."""
    kind = str(f.get("kind"))
    ips = _ips(f)
    ev = f.get("evidence") or {}
    first = ips[0] if ips else None
    if kind in ("hot_destination", "alltoall_destination_skew"):
        hot = str(ev.get("hot_destination") or first) if (ev.get("hot_destination") or first) else None
        if hot is None:
            return []
        w = _weights(ev, hot)
        members = [str(x) for x in (ev.get("members") or ips)]
        fair = _num(ev.get("fair_share")) or (1.0 / len(members) if members else None)
        share = w.get(hot)
        move = round(max(0.0, (share - fair) / share), 4) if share and fair else None
        return [{"type": "rebalance_experts", "hot": hot, "weights": w, "fair_share": fair, "move_fraction": move,
                 "members": members}]
    if kind in ("slow_tp_shard", "ring_straggler", "straggler"):
        if not first:
            return []
        acts = [{"type": "drain", "node": first}, {"type": "check_node", "node": first}]
        if kind == "ring_straggler" and len(ips) > 1:
            acts.append({"type": "check_link", "src": first, "dst": ips[1]})
        return acts
    if kind in ("slow_receiver", "pipeline_bubbles", "pfc_pause"):
        return [{"type": "check_node", "node": first}] if first else []
    if kind in ("packet_loss", "retransmissions", "nak_errors", "kv_transfer_slow"):
        return [{"type": "check_link", "src": ips[0], "dst": ips[1]}] if len(ips) >= 2 else []
    if kind == "slow_link":
        return [{"type": "check_link", "src": first, "dst": None}] if first else []
    if kind in ("ecn_congestion", "cnp_storm"):
        # the congested port is the one towards ips[0]; its senders are the others
        return [{"type": "check_link", "src": None, "dst": first},
                {"type": "spread_senders", "dst": first, "senders": ips[1:]}] if first else []
    if kind == "incast":
        return [{"type": "spread_senders", "dst": first, "senders": ips[1:],
                 "max_senders": _num(ev.get("max_senders"))}] if first else []
    if kind == "rotating_straggler":
        return [{"type": "rebalance_batches", "members": finding_key(f),
                 "gate_share": dict(ev.get("gate_share") or {}), "how": "pack or bucket sequences by length"}]
    if kind == "pd_imbalance":
        return [{"type": "reroute_requests", "from": first, "members": [first] if first else [],
                 "to": None}] if first else []
    if kind == "instance_load_imbalance":
        if not first:
            return []
        ratios = ev.get("per_instance_load_ratio") or {}
        to = sorted((str(k) for k, v in ratios.items() if k != first and (_num(v) or 0) < 1.0),
                    key=lambda k: (_num(ratios[k]) or 0, _ip_sort_key(k)))
        return [{"type": "reroute_requests", "from": first, "members": ips, "to": to,
                 "load_ratio": _num(ev.get("load_ratio"))}]
    if kind == "prefill_interference":
        return [{"type": "isolate_prefill", "members": ips}] if ips else []
    return []


def finding_object(f: dict) -> dict:
    """The finding as events, webhooks and /v1/findings carry it: {"id", "kind", "severity",
    "entities" {"ips", "qps", "flows"}, "message", "evidence", "impact", "actions", "since",
    "until"} (since/until as the analysis gives them: s on the snapshot's clock)."""
    ent = f.get("entities") or {}
    return {"id": finding_id(f), "kind": f.get("kind"), "severity": f.get("severity"),
            "entities": {"ips": list(ent.get("ips") or []), "qps": list(ent.get("qps") or []),
                         "flows": [list(x) for x in (ent.get("flows") or [])]},
            "message": f.get("message"), "evidence": f.get("evidence") or {}, "impact": f.get("impact"),
            "actions": actions_for(f), "since": _num(f.get("since")), "until": _num(f.get("until"))}


def event(kind: str, obj: dict, first_seen: float, last_seen: float, at: float, source: str | None = None,
          since: float | None = None, until: float | None = None) -> dict:
    """One finding event (schema SCHEMA). since/until: the condition's onset and end on the
    source's clock (unix s), null when unknown / still holding."""
    if kind not in EVENTS:
        raise ValueError(f"event {kind!r}: one of {EVENTS}")
    return {"schema": SCHEMA, "id": obj["id"], "event": kind, "time": float(at),
            "first_seen": float(first_seen), "last_seen": float(last_seen), "source": source,
            "finding": obj, "since": _num(since), "until": _num(until)}


_SEV = {"info": 0, "warning": 1, "critical": 2}


def _merge_same_id(findings) -> dict:
    """{id: finding object}: two findings with one id (two groups, the same blamed node)
    are one condition: the worse severity, then the larger impact, wins."""
    out: dict[str, dict] = {}
    for f in findings:
        o = finding_object(f)
        cur = out.get(o["id"])
        if cur is not None:
            # one condition: it began at the earlier onset
            ss = [x for x in (cur["since"], o["since"]) if x is not None]
            o["since"] = cur["since"] = min(ss) if ss else None
        if cur is None or (_SEV.get(o["severity"], 0), (o["impact"] or {}).get("seconds") or 0) > \
                (_SEV.get(cur["severity"], 0), (cur["impact"] or {}).get("seconds") or 0):
            out[o["id"]] = o
    return out


def material_change(old: dict, new: dict, change: float = 0.25) -> str | None:
    """Why `new` is an update of `old` (same id), or None: the severity changed, or a
    headline evidence number (HEADLINE) moved by more than `change` relative to old."""
    if old.get("severity") != new.get("severity"):
        return f"severity {old.get('severity')} -> {new.get('severity')}"
    eo, en = old.get("evidence") or {}, new.get("evidence") or {}
    for k in HEADLINE.get(str(new.get("kind")), ()):
        a, b = _num(eo.get(k)), _num(en.get(k))
        if a is None or b is None:
            continue
        if (a == 0 and b != 0) or (a != 0 and abs(b - a) / abs(a) > change):
            return f"{k} {a:.4g} -> {b:.4g}"
    return None


class Tracker:
    """Turns the findings of successive analyses into events.

    update(findings, now, seen=None) at each analysis time (a live interval, the one-shot
    file): a new id -> `opened`; a known id whose severity changed or whose headline evidence
    moved > `change` (relative) since its last event, in `confirm` consecutive analyses
    (1: at once; 2 keeps a sliding window's one-analysis flicker quiet) -> `updated` (with
    "change": why, from the latest analysis); an
    id absent from the analyses for >= `hold` seconds since it was last seen -> `resolved`
    (the last finding object). `seen` = (first, last) source times of the analysed data (a
    file's capture times); default now. `clock` (outputs.when.Clock of the analysed snapshot)
    puts the findings' since/until on the source's clock: an id opens at its onset
    (first_seen = the finding's since, when known, instead of the analysed data's first
    time), and every event carries "since" (the earliest onset seen for the id) and "until"
    (the latest finding's end, null while it holds). Events are returned in a stable order
    (resolved, opened, updated; then id)."""

    def __init__(self, hold: float = 30.0, change: float = 0.25, source: str | None = None, confirm: int = 1):
        if hold < 0 or change <= 0 or confirm < 1:
            raise ValueError("hold must be >= 0, change > 0 and confirm >= 1")
        self.hold, self.change, self.source, self.confirm = float(hold), float(change), source, int(confirm)
        self.open: dict[str, dict] = {}   # id -> {"obj", "emitted", "first_seen", "last_seen"}

    def update(self, findings, now: float, seen: tuple[float, float] | None = None,
               clock: Clock | None = None) -> list[dict]:
        first, last = seen if seen is not None else (now, now)
        cur = _merge_same_id(findings)
        out: list[dict] = []
        for fid in sorted(set(self.open) - set(cur)):
            st = self.open[fid]
            if now - st["last_seen"] >= self.hold:
                out.append(self._event("resolved", st, now))
                del self.open[fid]
        opened, updated = [], []
        for fid in sorted(cur):
            o = cur[fid]
            since = clock.wall(o.get("since")) if clock is not None else None
            until = clock.wall(o.get("until")) if clock is not None else None
            st = self.open.get(fid)
            if st is None:
                st = self.open[fid] = {"obj": o, "emitted": o, "first_seen": first if since is None else since,
                                       "last_seen": last, "pending": 0, "since": since, "until": until}
                opened.append(self._event("opened", st, now))
                continue
            st["obj"], st["last_seen"], st["until"] = o, max(st["last_seen"], last), until
            if since is not None and (st["since"] is None or since < st["since"]):
                st["since"] = since
            why = material_change(st["emitted"], o, self.change)
            st["pending"] = st["pending"] + 1 if why else 0
            if why and st["pending"] >= self.confirm:
                st["emitted"], st["pending"] = o, 0
                e = self._event("updated", st, now)
                e["change"] = why
                updated.append(e)
        return out + opened + updated

    def _event(self, kind: str, st: dict, now: float) -> dict:
        return event(kind, st["obj"], st["first_seen"], st["last_seen"], now, self.source, st.get("since"),
                     st.get("until"))

    def resolve_all(self, now: float) -> list[dict]:
        """Every open id as resolved now (a source that ended: not used by watch, which
        leaves open findings open when it stops)."""
        out = [self._event("resolved", st, now) for _, st in sorted(self.open.items())]
        self.open.clear()
        return out


def stats_line(events: int, webhooks: list[dict], at: float, source: str | None = None) -> dict:
    """The final line of `watch --json` (schema STATS_SCHEMA): events emitted, and per
    webhook {"url", "sent", "failed", "retries", "dropped"}."""
    return {"schema": STATS_SCHEMA, "event": "stats", "time": float(at), "source": source,
            "events": int(events), "webhooks": webhooks,
            "dropped": int(sum(w.get("dropped", 0) for w in webhooks))}


# ---- webhooks --------------------------------------------------------------------------------
class WebhookURLError(ValueError):
    """A --webhook URL that is not http(s)://HOST[:PORT][/PATH] (one line for the user)."""


def check_webhook_url(url: str) -> str:
    """The URL if it is http(s) with a host and a valid port, else WebhookURLError."""
    try:
        u = urllib.parse.urlsplit(str(url))
        port = u.port                      # raises ValueError on a bad port
    except ValueError as e:
        raise WebhookURLError(f"webhook {url!r}: {e}") from None
    if u.scheme not in ("http", "https"):
        raise WebhookURLError(f"webhook {url!r}: not an http:// or https:// URL")
    if not u.hostname:
        raise WebhookURLError(f"webhook {url!r}: no host")
    del port
    return str(url)


class Webhook:
    """POSTs events (JSON, Content-Type application/json, `Authorization: Bearer TOKEN` when a
    token is given) to one URL from a background thread, through a bounded queue: post()
    never blocks (a full queue drops the event and counts it). Each event is tried
    1 + `retries` times, waiting backoff, 2*backoff, ... (capped at max_backoff) between
    tries; an event that still fails is dropped and counted. A 2xx answer is success; any
    other status, a refused connection or a timeout is a failure. `log(line)` gets one line
    at the first failure, the first drop and a recovery (never one per event).

    stats(): {"url", "sent", "failed" (tries that failed), "retries", "dropped", "dropped_queue_full",
    "dropped_gave_up", "dropped_at_exit", "queued"}."""

    def __init__(self, url: str, token: str | None = None, queue_size: int = 1000, timeout: float = 5.0,
                 retries: int = 3, backoff: float = 0.5, max_backoff: float = 8.0, log=None):
        self.url = check_webhook_url(url)
        self.token, self.timeout = token, float(timeout)
        self.retries, self.backoff, self.max_backoff = int(retries), float(backoff), float(max_backoff)
        self.q: queue.Queue = queue.Queue(maxsize=max(1, int(queue_size)))
        self.log = log or (lambda line: None)
        self.sent = self.failed = self.retried = 0
        self.dropped_full = self.dropped_gave_up = self.dropped_exit = 0
        self._failing = False
        self._warned_drop = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="skewscope-webhook", daemon=True)
        self._thread.start()

    def post(self, ev: dict) -> bool:
        """Queue one event; False (and counted) when the queue is full or the sender closed."""
        if self._closing:
            with self._lock:
                self.dropped_exit += 1
            return False
        try:
            self.q.put_nowait(ev)
            return True
        except queue.Full:
            with self._lock:
                self.dropped_full += 1
                first = not self._warned_drop
                self._warned_drop = True
            if first:
                self.log(f"webhook {self.url}: queue full ({self.q.maxsize} events): dropping events "
                         "(counted in the final summary)")
            return False

    def _send_once(self, body: bytes) -> str | None:
        req = urllib.request.Request(self.url, data=body, method="POST",
                                     headers={"Content-Type": "application/json",
                                              "User-Agent": "skewscope-watch"})
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                r.read(65536)
                if 200 <= r.status < 300:
                    return None
                return f"HTTP {r.status}"
        except urllib.error.HTTPError as e:
            return f"HTTP {e.code} {e.reason}"
        except urllib.error.URLError as e:
            return str(getattr(e, "reason", e))
        except (OSError, ValueError, http.client.HTTPException) as e:   # timeout, reset, bad answer
            return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__

    def _run(self) -> None:
        while True:
            try:
                ev = self.q.get(timeout=0.1)
            except queue.Empty:
                if self._stop.is_set():
                    return
                continue
            if self._stop.is_set():
                with self._lock:
                    self.dropped_exit += 1
                self.q.task_done()
                continue
            body = json.dumps(ev, separators=(",", ":")).encode()
            err, wait, first_drop = None, self.backoff, False
            for attempt in range(1 + self.retries):
                if attempt:
                    if self._stop.wait(min(wait, self.max_backoff)):
                        break
                    wait *= 2
                    with self._lock:
                        self.retried += 1
                err = self._send_once(body)
                if err is None:
                    break
                with self._lock:
                    self.failed += 1
                    first = not self._failing
                    self._failing = True
                if first:
                    self.log(f"webhook {self.url}: {err}; retrying with backoff (the watch goes on)")
            with self._lock:
                if err is None:
                    self.sent += 1
                    recovered, self._failing = self._failing, False
                elif self._stop.is_set():
                    self.dropped_exit += 1
                    recovered = False
                else:
                    self.dropped_gave_up += 1
                    recovered = False
                    first_drop = not self._warned_drop
                    self._warned_drop = True
            if recovered:
                self.log(f"webhook {self.url}: delivering again")
            elif err is not None and not self._stop.is_set() and first_drop:
                self.log(f"webhook {self.url}: gave up on an event after {1 + self.retries} tries: dropped "
                         "(counted in the final summary)")
            self.q.task_done()

    def close(self, timeout: float = 5.0) -> None:
        """Stop accepting, deliver what is queued for at most `timeout` seconds, then stop
        (what is still queued or in flight counts as dropped_at_exit)."""
        self._closing = True
        deadline = time.monotonic() + max(0.0, timeout)
        while self.q.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.02)
        self._stop.set()
        self._thread.join(max(0.0, deadline - time.monotonic()) + self.timeout + 0.5)
        while True:
            try:
                self.q.get_nowait()
            except queue.Empty:
                break
            with self._lock:
                self.dropped_exit += 1

    def stats(self) -> dict:
        with self._lock:
            d = self.dropped_full + self.dropped_gave_up + self.dropped_exit
            return {"url": self.url, "sent": self.sent, "failed": self.failed, "retries": self.retried,
                    "dropped": d, "dropped_queue_full": self.dropped_full, "dropped_gave_up": self.dropped_gave_up,
                    "dropped_at_exit": self.dropped_exit, "queued": self.q.qsize()}
