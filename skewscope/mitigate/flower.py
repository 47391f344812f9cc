"""The hardware form of a mitigation rule: the tc flower filter a BlueField's eSwitch (mlx5)
can offload -- `pedit ex munge ip dsfield` (+ `csum ip`) to re-mark, `police` to rate-limit,
`skip_sw` so that it runs in the NIC or not at all -- printed by `mitigate plan --flower` for
an operator to review and install (docs/mitigation.md "Where it runs").

Not applied by skewscope in this release: the kernels it is tested on have neither cls_flower
nor act_pedit/act_police, so these lines are checked for their shape (tests) but have not run.
Each carries skewscope's cookie ("ssmt" + the rule's id + its deadline, unix seconds, hex) and
a priority in 49400..49431, so that a later tool (or a person) can tell ours and when each
should go: the kernel does not enforce a flower rule's TTL.
"""
from __future__ import annotations

import ipaddress
import time

from skewscope.mitigate.rules import Rule

PRIO_BASE = 49400
COOKIE_TAG = b"ssmt".hex()


def cookie(rid: int, expires_unix: float) -> str:
    return f"{COOKIE_TAG}{rid & 0xFFFFFFFF:08x}{int(expires_unix) & 0xFFFFFFFF:08x}"


def commands(rule: Rule, iface: str, direction: str = "ingress", slot: int = 0, rid: int = 1,
             now: float | None = None) -> list[list[str]]:
    """The tc argument lists (after `tc`) that install `rule` as an offloadable flower filter."""
    rule.check()
    v6 = any(ipaddress.ip_address(a).version == 6 for a in (rule.src, rule.dst) if a)
    c = ["filter", "add", "dev", iface, direction, "prio", str(PRIO_BASE + slot), "protocol",
         "ipv6" if v6 else "ip", "flower", "skip_sw", "ip_proto", "udp", "dst_port", "4791"]
    if rule.src:
        c += ["src_ip", rule.src]
    if rule.dst:
        c += ["dst_ip", rule.dst]
    if rule.sport:
        c += ["src_port", str(rule.sport)]
    # flower cannot see the BTH's destination QP (UDP payload): a QP is matched by its UDP
    # source port, which RoCE NICs derive per QP
    ck = cookie(rid, (now if now is not None else time.time()) + rule.ttl)
    if rule.action == "remark":
        if v6:
            # traffic class = bits 4..11 of the first 16-bit word; the DSCP its top 6
            c += ["action", "pedit", "ex", "munge", "ip6", "traffic_class", "set", str(rule.dscp << 2), "retain", "0xfc",
                  "pipe", "action", "gact", "pipe", "cookie", ck]
        else:
            c += ["action", "pedit", "ex", "munge", "ip", "dsfield", "set", str(rule.dscp << 2), "retain", "0xfc",
                  "pipe", "action", "csum", "ip", "pipe", "cookie", ck]
    else:
        c += ["action", "police", "rate", f"{int(rule.rate_bps)}bit", "burst", str(int(rule.burst)),
              "conform-exceed", "drop/pipe", "cookie", ck]
    return [["qdisc", "add", "dev", iface, "clsact"], c]
