"""The inventory: what people call an address (issue 27, deliverable 1).

Findings speak in IPs; an SRE thinks in hosts, GPUs, ranks, jobs and pods. An inventory maps
each address (a NIC's RoCE address: one GPU's rail on a multi-rail host) to those names. This
module reads it from a file (or an info metric's label sets: from_labels) and validates it;
telemetry/enrich.py puts the names into every output (docs/fleet.md "Inventory").

Formats (chosen by the suffix; `.csv` / `.tsv` else sniffed):

* CSV (or TSV) with a header row. Columns `ip` and `host` are required; `gpu`, `rank`,
  `job`, `pod`, `namespace`, `instance`, `rail` are optional; other columns are kept as
  extra labels (`extra`). Blank lines and lines starting with `#` are skipped.
* YAML: a list of mappings with the same keys, or a mapping `{hosts: [...]}`.

Validation (one-line errors naming the file and line, exit code EXIT_NOT_RUN: could not run): a missing
required column or value, an address that is not IPv4/IPv6, the same address twice, a `gpu`
or `rank` that is not a non-negative integer. Addresses are normalised (ipaddress), so
`fd00::01` and `fd00::1` are one.
"""
from __future__ import annotations

import csv
import io
import ipaddress
from dataclasses import dataclass, field
from pathlib import Path

from skewscope.core.errors import EXIT_NOT_RUN, SkewscopeError
from skewscope.core.textfile import read_text, yaml_error

REQUIRED = ("ip", "host")
OPTIONAL = ("gpu", "rank", "job", "pod", "namespace", "instance", "rail")
INTEGER = ("gpu", "rank")


class InventoryError(SkewscopeError):
    def __init__(self, msg: str):
        super().__init__(msg, EXIT_NOT_RUN)


@dataclass(frozen=True)
class Entry:
    """What one address is called."""
    ip: str
    host: str
    gpu: int | None = None
    rank: int | None = None
    job: str | None = None
    pod: str | None = None
    namespace: str | None = None
    instance: str | None = None
    rail: str | None = None
    extra: dict = field(default_factory=dict)

    def name(self) -> str:
        """The short name an output prints for the address: host, plus its GPU when known."""
        return self.host if self.gpu is None else f"{self.host}/gpu{self.gpu}"


class Inventory:
    """ip (normalised text) -> Entry."""

    def __init__(self, entries: dict[str, Entry], source: str = ""):
        self.entries = entries
        self.source = source

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, ip: str) -> Entry | None:
        try:
            return self.entries.get(_norm(ip))
        except ValueError:
            return None

    def name(self, ip: str) -> str:
        """The entry's name, or the address itself when the inventory does not know it."""
        e = self.get(ip)
        return e.name() if e is not None else ip

    def hosts(self) -> dict[str, list[str]]:
        """host -> its addresses (sorted)."""
        out: dict[str, list[str]] = {}
        for ip, e in self.entries.items():
            out.setdefault(e.host, []).append(ip)
        return {h: sorted(v) for h, v in out.items()}


def _norm(ip: str) -> str:
    return str(ipaddress.ip_address(str(ip).strip()))


def _entry(row: dict, where: str, seen: dict, label: str) -> Entry:
    vals = {str(k).strip().lower(): ("" if v is None else str(v).strip()) for k, v in row.items() if k is not None}
    for k in REQUIRED:
        if not vals.get(k):
            raise InventoryError(f"{where}: no {k!r} value (every row needs {' and '.join(REQUIRED)})")
    try:
        ip = _norm(vals["ip"])
    except ValueError:
        raise InventoryError(f"{where}: {vals['ip']!r} is not an IPv4 or IPv6 address") from None
    if ip in seen:
        raise InventoryError(f"{where}: address {ip} is listed twice (first on {seen[ip]})")
    seen[ip] = label
    kw: dict = {}
    for k in OPTIONAL:
        v = vals.get(k, "")
        if not v:
            continue
        if k in INTEGER:
            if not v.isdigit():
                raise InventoryError(f"{where}: {k} {v!r} is not a non-negative integer")
            kw[k] = int(v)
        else:
            kw[k] = v
    extra = {k: v for k, v in vals.items() if k not in REQUIRED + OPTIONAL and v}
    return Entry(ip=ip, host=vals["host"], extra=extra, **kw)


def _from_csv(text: str, name: str, delimiter: str) -> dict[str, Entry]:
    lines = [(i, ln) for i, ln in enumerate(text.splitlines(), 1) if ln.strip() and not ln.lstrip().startswith("#")]
    if not lines:
        raise InventoryError(f"{name}: empty inventory (a header row with ip,host and one row per address)")
    hdr_no, hdr = lines[0]
    cols = [c.strip().lower() for c in next(csv.reader([hdr], delimiter=delimiter))]
    missing = [c for c in REQUIRED if c not in cols]
    if missing:
        raise InventoryError(f"{name}:{hdr_no}: the header has no {', '.join(repr(c) for c in missing)} column "
                             f"(it reads {', '.join(cols) or 'nothing'}; {' and '.join(REQUIRED)} are required)")
    dup = sorted({c for c in cols if cols.count(c) > 1})
    if dup:
        raise InventoryError(f"{name}:{hdr_no}: column {dup[0]!r} appears twice in the header")
    out: dict[str, Entry] = {}
    seen: dict = {}
    for no, ln in lines[1:]:
        cells = next(csv.reader([ln], delimiter=delimiter))
        if len(cells) > len(cols):
            raise InventoryError(f"{name}:{no}: {len(cells)} fields, the header has {len(cols)}")
        e = _entry(dict(zip(cols, cells)), f"{name}:{no}", seen, f"line {no}")
        out[e.ip] = e
    return out


def _from_yaml(text: str, name: str) -> dict[str, Entry]:
    import yaml  # a dependency; only the YAML form needs it
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise yaml_error(e, name, InventoryError) from None
    if isinstance(doc, dict) and "hosts" in doc:
        doc = doc["hosts"]
    if not isinstance(doc, list) or not doc:
        raise InventoryError(f"{name}: a YAML inventory is a list of entries (ip, host, ...) or {{hosts: [...]}}")
    out: dict[str, Entry] = {}
    seen: dict = {}
    for i, row in enumerate(doc, 1):
        if not isinstance(row, dict):
            raise InventoryError(f"{name}: entry {i} is not a mapping of ip, host, ...")
        e = _entry(row, f"{name}: entry {i}", seen, f"entry {i}")
        out[e.ip] = e
    return out


def parse(text: str, name: str = "inventory", fmt: str | None = None) -> Inventory:
    """An Inventory from text; fmt 'csv', 'tsv' or 'yaml' (None: sniffed)."""
    if fmt is None:
        first = next((ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")), "")
        fmt = "tsv" if "\t" in first else "csv" if "," in first else "yaml"
    if fmt == "yaml":
        return Inventory(_from_yaml(text, name), name)
    return Inventory(_from_csv(text, name, "\t" if fmt == "tsv" else ","), name)


def load(path: str | Path) -> Inventory:
    """An Inventory from a file (suffix .csv/.tsv/.yaml/.yml, else sniffed); InventoryError
    (one line, EXIT_NOT_RUN) when it cannot be read or is not valid."""
    p = Path(path)
    text = read_text(p, "the inventory", InventoryError)
    suf = p.suffix.lower()
    fmt = {".csv": "csv", ".tsv": "tsv", ".yaml": "yaml", ".yml": "yaml"}.get(suf)
    return parse(text, str(p), fmt)


#: label names an info metric may use for each inventory field (skewscope_inventory_info's own
#: first; `job`/`instance` are Prometheus' target labels, never the inventory's)
LABELS = {"ip": ("ip", "address", "addr"), "host": ("host", "hostname", "Hostname", "nodename"),
          "gpu": ("gpu",), "rank": ("rank",), "job": ("job_name",), "pod": ("pod",), "namespace": ("namespace",),
          "instance": ("instance_name",), "rail": ("rail", "device")}


def from_labels(rows, source: str = "labels") -> Inventory:
    """An Inventory from the label sets of an info metric (Prometheus: skewscope_inventory_info
    of exporters run with --inventory, or a site's own, e.g. from its CMDB). Label sets without
    an address or a host, or with a value that is not valid, are skipped (a fleet's labels are
    not a file a user can fix line by line); the same address twice keeps the first."""
    out: dict[str, Entry] = {}
    for labels in rows:
        row = {}
        for k, names in LABELS.items():
            v = next((str(labels[n]) for n in names if labels.get(n) not in (None, "")), "")
            if v:
                row[k] = v
        try:
            e = _entry(row, source, {}, "")
        except InventoryError:
            continue
        out.setdefault(e.ip, e)
    return Inventory(out, source)


def dumps_csv(inv: Inventory) -> str:
    """The inventory as CSV (header ip,host,<optional columns>): load(dumps) round-trips."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(REQUIRED + OPTIONAL)
    for e in inv.entries.values():
        w.writerow([e.ip, e.host] + ["" if getattr(e, k) is None else getattr(e, k) for k in OPTIONAL])
    return buf.getvalue()
