"""Kernel tier harness: the real BPF program, run with BPF_PROG_TEST_RUN on crafted frames
(helpers; the fixtures are in conftest.py).

One replay-clock build (time and captured length come from the per-CPU `clock` map, so
timestamps in the maps are exactly the ones a test chose) is compiled per session and reset
between tests. `kernel.run(frames, entry=...)` feeds frames through the XDP or TC entry and
returns a Result with the Snapshot tables; every run also checks the verdict (XDP_PASS /
TC_ACT_UNSPEC = TCX_NEXT: the observer never drops, nor ends the hook for what comes after).
"""
from __future__ import annotations

from dataclasses import dataclass

import frames as F
import numpy as np

XDP_PASS, TC_ACT_UNSPEC = 2, 0xFFFFFFFF   # TC: -1 as BPF_PROG_TEST_RUN's u32 retval
T0 = 1_000_000_000_000  # 1000 s, in ns
DT = 1_000              # 1 µs between frames unless a test says otherwise
TC_MAX_FRAME = 3500     # BPF_PROG_TEST_RUN for skb programs takes < PAGE_SIZE - overhead


@dataclass
class Result:
    snap: object
    ts: list

    @property
    def flows(self):
        return self.snap.flows

    @property
    def events(self):
        return self.snap.events

    @property
    def g(self):
        return self.snap.globals

    def flow(self, key) -> np.void:
        rows = [i for i in range(len(self.flows)) if _key(self.flows[i]) == key]
        assert len(rows) == 1, f"flow {key_str(key)} present {len(rows)} times; flows: " \
                               f"{[key_str(_key(r)) for r in self.flows]}"
        return self.flows[rows[0]]

    def flow_index(self, key) -> int:
        for i in range(len(self.flows)):
            if _key(self.flows[i]) == key:
                return i
        raise KeyError(key_str(key))

    def cats(self) -> dict:
        """Non-zero categories by name."""
        from skewscope.core import layout as L
        return {n: int(self.g[i]) for i, n in enumerate(L.CATEGORY_NAMES) if self.g[i]}

    def assert_cats(self, **expected):
        """Exactly these categories are non-zero, and frames == their sum."""
        from skewscope.core import layout as L
        assert self.cats() == {k: v for k, v in expected.items() if v}, self.cats()
        assert int(self.g[L.G_FRAMES]) == sum(expected.values())


def _key(row) -> tuple:
    return (bytes(row["src"]), bytes(row["dst"]), int(row["dest_qp"]), int(row["ipver"]), int(row["roce"]))


def key_str(key) -> str:
    import ipaddress
    s, d, qp, v, r = key
    f = (lambda b: str(ipaddress.ip_address(b[12:]))) if v == 4 else (lambda b: str(ipaddress.ip_address(b)))
    return f"{f(s)}->{f(d)} qp 0x{qp:x} v{v} roce{r}"


class Kernel:
    def __init__(self, dp):
        from skewscope.bpf import syscalls as bpfsys
        self.dp = dp
        self.bpfsys = bpfsys
        self.fds = {"xdp": dp.prog_fd("xdp"), "tc": dp.prog_fd("tc")}

    def run(self, frames, entry: str = "xdp", *, t0: int = T0, dt: int = DT, ts=None, caplens=None,
            reset: bool = True) -> Result:
        """Feed frames (Built or bytes) through `entry`. ts: explicit per-frame times (ns);
        caplens: per-frame captured length (bytes past it are not to be parsed)."""
        if reset:
            self.dp.reset()
        fd = self.fds[entry]
        times = []
        for i, fr in enumerate(frames):
            data = bytes(getattr(fr, "frame", fr))
            t = ts[i] if ts is not None else t0 + i * dt
            cap = caplens[i] if caplens is not None and caplens[i] is not None else len(data)
            if entry == "tc":
                assert len(data) <= TC_MAX_FRAME, "TC test runs take frames up to ~3.5 KB"
            self.dp.set_replay(t, cap)
            ret, _ = self.bpfsys.prog_test_run(fd, data)
            assert ret == (XDP_PASS if entry == "xdp" else TC_ACT_UNSPEC), f"verdict {ret}: the observer must pass"
            times.append(t)
        return Result(self.dp.snapshot({"source": "test"}), times)


def basic_expectations(built: list, ts: list) -> dict:
    """Per-flow facts that follow directly from how the frames were built: packets, bytes,
    payload bytes, opcode-class counts, ECN, FECN/BECN, CNPs, first/last time, last sport /
    traffic class / opcode. key -> dict."""
    out: dict = {}
    for b, t in zip(built, ts):
        if b.kind != "roce":
            continue
        e = out.setdefault(b.key, {"packets": 0, "bytes": 0, "payload_bytes": 0, "ops": {}, "ecn_capable": 0,
                                   "ce": 0, "fecn": 0, "becn": 0, "cnp": 0, "first_ts": t})
        e["packets"] += 1
        e["bytes"] += b.wire_len
        e["payload_bytes"] += b.payload
        cls = F.OPCODE_CLASS[b.opcode]
        e["ops"][cls] = e["ops"].get(cls, 0) + 1
        if b.roce_ver == 2:
            e["ecn_capable"] += (b.tclass & 3) != 0
            e["ce"] += (b.tclass & 3) == 3
        e["fecn"] += b.fecn
        e["becn"] += b.becn
        e["cnp"] += b.opcode == 0x81
        # last_ts: the last packet that is not in the middle of a transfer (README "Counters":
        # SEND/WRITE/READ_RESPONSE MIDDLE packets are not timed), or the first packet
        if "last_ts" not in e or not F.OPCODE_NAME.get(b.opcode, "").endswith("_MIDDLE"):
            e["last_ts"] = t
        e["sport"] = b.sport
        e["tclass"] = b.tclass
        e["last_opcode"] = b.opcode
    return out


def assert_basic(res: Result, built: list):
    from skewscope.core import layout as L
    exp = basic_expectations(built, res.ts)
    assert len(res.flows) == len(exp), f"{len(res.flows)} flows, expected {len(exp)}"
    for key, e in exp.items():
        f = res.flow(key)
        ops = {n: int(f["op"][i]) for i, n in enumerate(L.OPCLASS_NAMES) if f["op"][i]}
        got = {"packets": int(f["packets"]), "bytes": int(f["bytes"]), "payload_bytes": int(f["payload_bytes"]),
               "ops": ops, "ecn_capable": int(f["ecn_capable"]), "ce": int(f["ce"]), "fecn": int(f["fecn"]),
               "becn": int(f["becn"]), "cnp": int(f["cnp"]), "first_ts": int(f["first_ts"]),
               "last_ts": int(f["last_ts"]), "sport": int(f["sport"]), "tclass": int(f["tclass"]),
               "last_opcode": int(f["last_opcode"])}
        assert got == e, f"{key_str(key)}:\n got {got}\n exp {e}"
