"""The inventory from Prometheus labels (`--inventory http://PROMETHEUS:9090[#METRIC]`): the
label sets of an info metric -- `skewscope_inventory_info`, which every `skewscope export
--inventory FILE` publishes, or a site's own (METRIC after `#`, labels ip/address and
host/hostname/Hostname; core/inventory.py LABELS) -- read with one instant query of the last
hour, so the fleet commands name what the DPUs named without a copy of the file."""
from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request

from skewscope.core.errors import EXIT_NOT_RUN, SkewscopeError
from skewscope.core.inventory import Inventory, from_labels

DEFAULT_METRIC = "skewscope_inventory_info"
LOOKBACK = "1h"


def is_url(s: str) -> bool:
    return str(s).startswith(("http://", "https://"))


def load(url: str, timeout: float = 10.0) -> Inventory:
    """Inventory of the info metric's last hour; SkewscopeError (one line, exit 3) when
    Prometheus cannot be asked or knows no such series."""
    base, _, metric = url.partition("#")
    metric = metric or DEFAULT_METRIC
    if not metric.replace("_", "a").replace(":", "a").isalnum():
        raise SkewscopeError(f"--inventory {url}: {metric!r} is not a metric name", EXIT_NOT_RUN)
    q = urllib.parse.urlencode({"query": f"last_over_time({metric}[{LOOKBACK}])"})
    req = f"{base.rstrip('/')}/api/v1/query?{q}"
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            doc = json.loads(r.read())
    except (urllib.error.URLError, OSError, ValueError) as e:
        why = getattr(e, "reason", None) or e
        raise SkewscopeError(f"--inventory {base}: cannot query Prometheus ({why})", EXIT_NOT_RUN) from None
    if doc.get("status") != "success":
        raise SkewscopeError(f"--inventory {base}: Prometheus says {doc.get('error') or doc.get('status')}",
                             EXIT_NOT_RUN)
    rows = [s.get("metric") or {} for s in (doc.get("data") or {}).get("result") or []]
    inv = from_labels(rows, f"{base} {metric}")
    if not len(inv):
        raise SkewscopeError(f"--inventory {base}: no {metric} series with an address and a host in the last "
                             f"{LOOKBACK} (run the exporters with --inventory, or name a site's metric after #)",
                             EXIT_NOT_RUN)
    return inv
