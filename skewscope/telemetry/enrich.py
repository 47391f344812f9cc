"""The one enrichment step of an analysis document (report/diagnose/cluster JSON, the live
runner's result): names from the inventory, then GPU causes.

Names (when an inventory is given):
* `doc["inventory"]`: {ip: {"host", "gpu", "rank", "job", "pod", "namespace", "instance",
  "rail", "name"}} for every address of the findings and collectives the inventory knows;
* every finding: `names` {ip: name} for its entities.ips the inventory knows, and its
  `message` with each known address written "name (ip)" -- the addresses stay, in the
  message and in entities, so a grep for an IP still finds it;
* every collective: `member_names` (name or the address, in member order).
Enriching twice changes nothing (an address already written "name (ip)" is left as it is).

Causes (when a DCGM source is given, telemetry/cause.py): every finding that blames a node for
being slow (cause.COVERED) gets `cause` {"verdict", "host", "gpu", "evidence", "text"} from
the blamed GPU's DCGM series next to its group's; nothing else of the finding changes.
"""
from __future__ import annotations

import ipaddress
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:   # the annotations only: without --inventory a command never loads the inventory's module
    from skewscope.core.inventory import Inventory

#: IPv4 dotted quads and IPv6 tokens in a message (validated by ipaddress before use); compiled on
#: first use (re's cache): only an inventory names addresses
_ADDR = r"(?<![\w.:])(?:\d{1,3}(?:\.\d{1,3}){3}|[0-9A-Fa-f]{0,4}(?::[0-9A-Fa-f]{0,4}){2,7})(?![\w.])"


def _ips_of(doc: dict) -> set[str]:
    out: set[str] = set()
    for f in doc.get("findings") or []:
        ent = f.get("entities") or {}
        out.update(str(x) for x in ent.get("ips") or [])
        for fl in ent.get("flows") or []:
            out.update(str(x) for x in list(fl)[:2])
    for c in doc.get("collectives") or []:
        out.update(str(x) for x in c.get("members") or [])
    return out


def name_text(text: str, inv: Inventory) -> str:
    """`text` with each address the inventory knows written "name (ip)"."""
    def sub(m: re.Match) -> str:
        tok = m.group(0)
        try:
            ipaddress.ip_address(tok)
        except ValueError:
            return tok
        e = inv.get(tok)
        if e is None:
            return tok
        name = e.name()
        if m.string[:m.start()].endswith(f"{name} (") and m.string[m.end():m.end() + 1] == ")":
            return tok          # named already
        return f"{name} ({tok})"
    return re.sub(_ADDR, sub, text)


def entry_dict(e) -> dict:
    d = {k: getattr(e, k) for k in ("host", "gpu", "rank", "job", "pod", "namespace", "instance", "rail")}
    d["name"] = e.name()
    if e.extra:
        d["extra"] = dict(e.extra)
    return d


def name_document(doc: dict, inv: Inventory) -> None:
    known = {}
    for ip in sorted(_ips_of(doc)):
        e = inv.get(ip)
        if e is not None:
            known[ip] = e
    doc["inventory"] = {ip: entry_dict(e) for ip, e in known.items()}
    for f in doc.get("findings") or []:
        ips = [str(x) for x in (f.get("entities") or {}).get("ips") or []]
        f["names"] = {ip: known[ip].name() for ip in ips if ip in known}
        if isinstance(f.get("message"), str):
            f["message"] = name_text(f["message"], inv)
    for c in doc.get("collectives") or []:
        c["member_names"] = [known[str(m)].name() if str(m) in known else str(m) for m in c.get("members") or []]


class Enricher:
    """enricher(doc, meta) -> doc, in place: names, then causes. Falsy when it has nothing to
    add. `telemetry`: a DCGM source (telemetry.dcgm.open_source); `meta`: the snapshot's meta
    (or a diagnose "capture"), whose clock puts a finding's since/until on the wall clock for
    the DCGM window (without it a Prometheus is read at its latest samples)."""

    def __init__(self, inventory: Inventory | None = None, telemetry=None):
        self.inventory = inventory
        self.telemetry = telemetry

    def __bool__(self) -> bool:
        return self.inventory is not None or self.telemetry is not None

    def names(self) -> dict:
        """ip -> name of every address the inventory knows (top's labels)."""
        return {ip: e.name() for ip, e in self.inventory.entries.items()} if self.inventory is not None else {}

    def __call__(self, doc: dict, meta: dict | None = None) -> dict:
        if isinstance(doc, dict) and self.inventory is not None:
            name_document(doc, self.inventory)
            if doc.get("incidents"):
                from skewscope.analysis.incidents import refresh_messages  # the incidents' messages, named
                refresh_messages(doc)
        if isinstance(doc, dict) and self.telemetry is not None:
            from skewscope.telemetry.cause import add_causes  # urllib, http: only with --dcgm
            add_causes(doc, self.inventory, self.telemetry, meta)
        return doc
