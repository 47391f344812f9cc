"""Finding events: the stable id, the lifecycle (opened / updated / resolved) and the
machine-readable actions a controller subscribes to (`skewscope watch`, webhooks,
the exporter's /v1/findings). Schema: docs/feedback.md. Light: no numba; the analysis
package (for the detector registry) is imported on first use, not at import.

    finding_id(f)          "hot_destination:9f3c0a1b2c4d5e6f" (kind + key entities, sha256 prefix)
    finding_key(f)         the sorted key entities the id hashes (the kind's Kind.key)
    actions_for(f)         [{"type": "rebalance_experts", ...}, ...] (Kind.actions; [] for an unknown kind)
    finding_object(f)      {"id", "kind", "severity", "entities", "message", "evidence", "impact",
                            "actions", "since", "until"}
    Tracker(hold, change)  .update(findings, now, seen, clock) -> [event, ...] at each analysis time
    event(...)             {"schema", "id", "incident", "event", "time", "first_seen", "last_seen",
                            "source", "finding", "since", "until"}
    by_incident(events)    a batch of events, each incident's together, its lead's event first
    Webhook(url, token)    .post(event): background POSTs, bounded queue, retries, drop counts

A finding here is the analysis' finding dict (Finding.to_dict(): report/diagnose/cluster
--json), read only through dict access. What is known about a kind -- which entities key
its id, its headline numbers, its actions -- is on its Kind in the detector registry
(analysis/detectors/registry.py), read here; the registry is imported on first use.
"""
from __future__ import annotations

import http.client
import json
import queue
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

from skewscope.core.numbers import finite
from skewscope.core.when import Clock

SCHEMA = "skewscope.finding_event/v1"
STATS_SCHEMA = "skewscope.watch_stats/v1"
EVENTS = ("opened", "updated", "resolved")

def _registry():
    """analysis/detectors/registry.py, every kind registered."""
    # heavy (numpy, the analysis package): the registry loads on first use, not on `skewscope --help`
    from skewscope.analysis.detectors import registry
    return registry


def _kind(name):
    """The registry's Kind of a finding kind (its event key, headline numbers, actions,
    role), None for a kind the registry does not know."""
    try:
        return _registry().kind(str(name))
    except KeyError:
        return None


def finding_key(f: dict) -> list[str]:
    """The key entities of a finding (sorted, deduplicated): its Kind's `key` (the blamed
    node, a link's two ends, the members, a ring's flow ends, none); a kind the registry does
    not know: all its IPs (registry.finding_key)."""
    return _registry().finding_key(f)


def finding_id(f: dict) -> str:
    """Stable id: "<kind>:" + the first 16 hex digits of sha256 over kind and the sorted key
    entities (registry.finding_id: the incidents of analysis.incidents use the same one)."""
    return _registry().finding_id(f)


_num = finite


def actions_for(f: dict) -> list[dict]:
    """Machine-readable suggestions for a finding (docs/feedback.md "Actions"): its Kind's
    action recipes (detectors/actions.py), from the finding's entities and evidence only;
    [] for a kind without one or unknown to the registry."""
    k = _kind(f.get("kind"))
    return k.actions_for(f) if k is not None else []


def finding_object(f: dict) -> dict:
    """The finding as events, webhooks and /v1/findings carry it: {"id", "kind", "severity",
    "entities" {"ips", "qps", "flows"}, "message", "evidence", "impact", "actions", "since",
    "until"} (since/until as the analysis gives them: s on the snapshot's clock), plus what an
    enrichment added when it did (OPTIONAL: "names" from --inventory, "cause" from GPU telemetry).
    The finding's incident rides on the event ("incident", beside "id") and on /v1/findings'
    objects, not in this object (its keys are a contract: tests/unit/test_events.py)."""
    ent = f.get("entities") or {}
    out = {"id": finding_id(f), "kind": f.get("kind"), "severity": f.get("severity"),
           "entities": {"ips": list(ent.get("ips") or []), "qps": list(ent.get("qps") or []),
                        "flows": [list(x) for x in (ent.get("flows") or [])]},
           "message": f.get("message"), "evidence": f.get("evidence") or {}, "impact": f.get("impact"),
           "actions": actions_for(f), "since": _num(f.get("since")), "until": _num(f.get("until"))}
    out.update({k: f[k] for k in OPTIONAL if f.get(k) is not None})
    return out


#: finding keys an enrichment may add, carried by events and /v1/findings when present
OPTIONAL = ("names", "cause")


def event(kind: str, obj: dict, first_seen: float, last_seen: float, at: float, source: str | None = None,
          since: float | None = None, until: float | None = None, incident: str | None = None) -> dict:
    """One finding event (schema SCHEMA). since/until: the condition's onset and end on the
    source's clock (unix s), null when unknown / still holding; incident: the id of the
    incident the finding belongs to (analysis.incidents; = id when it leads it; null for a
    context finding or an analysis without incidents)."""
    if kind not in EVENTS:
        raise ValueError(f"event {kind!r}: one of {EVENTS}")
    return {"schema": SCHEMA, "id": obj["id"], "incident": incident, "event": kind, "time": float(at),
            "first_seen": float(first_seen), "last_seen": float(last_seen), "source": source,
            "finding": obj, "since": _num(since), "until": _num(until)}


_SEV = {"info": 0, "warning": 1, "critical": 2}


def by_incident(events: list[dict]) -> list[tuple[dict, bool]]:
    """(event, nested) for a batch of events as a reader takes them in: each incident's
    events together, where its first event appears, its lead's event (id == incident) first;
    nested = a finding of an incident whose lead's event is in the batch (shown under it).
    Events of no incident (and other events on the stream: --mitigate's steps) keep their place."""
    leads = {e.get("id") for e in events if e.get("incident") and e.get("incident") == e.get("id")}
    order: dict = {}
    for k, e in enumerate(events):
        order.setdefault(e.get("incident") or ("", k), []).append(e)
    out = []
    for key, evs in order.items():
        evs.sort(key=lambda e: e.get("id") != e.get("incident"))       # stable: the lead's first
        out += [(e, isinstance(key, str) and key in leads and e.get("id") != key) for e in evs]
    return out


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
    headline evidence number (its Kind's `headline`) moved by more than `change` relative to old."""
    if old.get("severity") != new.get("severity"):
        return f"severity {old.get('severity')} -> {new.get('severity')}"
    eo, en = old.get("evidence") or {}, new.get("evidence") or {}
    kd = _kind(new.get("kind"))
    for k in (kd.headline if kd is not None else ()):
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
    file's capture times); default now. `clock` (core.when.Clock of the analysed snapshot)
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
        findings = list(findings)
        cur = _merge_same_id(findings)
        incident: dict[str, str | None] = {}
        for f in findings:                    # one id, one incident (analysis.incidents); the first known
            fid = finding_id(f)
            if incident.get(fid) is None:
                incident[fid] = f.get("incident")
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
                                       "last_seen": last, "pending": 0, "since": since, "until": until,
                                       "incident": incident.get(fid)}
                opened.append(self._event("opened", st, now))
                continue
            st["obj"], st["last_seen"], st["until"] = o, max(st["last_seen"], last), until
            st["incident"] = incident.get(fid)
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
                     st.get("until"), st.get("incident"))

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
