"""A RoCE fabric on one machine, for the demo and the integration tests.

    gpu0 ... gpuN-1   one network namespace per GPU node: eth0 (MAC = the generator's
                      node MAC, 10.0.0.(i+1)/24, IPv6 off so the kernel sends nothing itself)
         │ veth
    sw                a switch namespace: bridge br0 with ports p0..pN-1 (learning, like a
                      ToR), and mon0: every port's ingress RoCE is copied to mon0 by
                      `skewscope mirror` (tc mirred, u32 on UDP 4791 + 0x8915) -- a SPAN port
         │ veth (mon0 -- obs0)
    dpu               the observer namespace: obs0 receives the mirror copies, like a
                      BlueField SF/VF netdev behind a representor mirror. XDP or TC on obs0
                      sees every node's RoCE traffic, once per frame.

With per_node_dpu=True the switch has one SPAN port per node instead: mon<i> copies both
directions of port p<i> (its ingress = node i's sends, its egress = what the bridge delivers
to node i) to DPU namespace dpu<i>, whose obs0 sees exactly node i's traffic, as a real
DPU in front of one GPU node does. Node MACs are static bridge entries with unicast flooding
off, so no port's egress carries another node's frames. Each dpu<i> also gets a management
veth to the root namespace (root side PREFIX+TAG+"m<i>", a /30 out of 10.253.0.0/16 chosen
free at build time; dpu side mgmt0) on which start_exporters() serves `skewscope export`
for a Prometheus in the root namespace (scrape_targets()).

Addresses exist only inside the namespaces (and the per-node management /30s).
Names: PREFIX + TAG + "-gpu<i>" / "-sw" / "-dpu" (or "-dpu<i>" per node) (PREFIX "ssd-"
for the demo, "ssu-" in tests; TAG unique per run). Everything made
is recorded as it is made; teardown() deletes exactly that (processes we started first,
since a process inside a namespace keeps it alive), and a state file under
/run/skewscope/ lets `skewscope demo --cleanup` remove a fabric whose owner died.

The player sends generator captures from the node namespaces: each frame leaves through
the eth0 of the node that owns its source MAC, at its model timestamp times a stretch
factor (so relative timing -- the straggler's lower rate, the hot expert's longer
trains -- is what the observer sees, only slower), bounded in time and frames.
"""
from __future__ import annotations

import argparse
import copy
import ctypes
import errno
import heapq
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from skewscope import gen as skewgen
from skewscope.core.errors import SkewscopeError
from skewscope.core.files import atomic_write_text
from skewscope.core.netns import in_netns
from skewscope.gen import frames as _frames  # noqa: F401  (skewgen.frames)
from skewscope.sources import mirror

STATE_DIR = Path("/run/skewscope")
PR_SET_PDEATHSIG = 1


class FabricError(SkewscopeError):
    """The namespace fabric could not be built (a failing `ip`/`tc` command)."""


def _run(cmd: list[str], check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise FabricError(f"{' '.join(cmd)}: {(p.stderr or p.stdout).strip().splitlines()[-1:] or ['failed']}")
    return p


def node_mac(i: int) -> bytes:
    return skewgen.frames.node_mac(i)  # the generator's own definition


def list_namespaces() -> list[str]:
    p = _run(["ip", "netns", "list"], check=False)
    return [ln.split()[0] for ln in p.stdout.splitlines() if ln.strip()]


class Fabric:
    def __init__(self, nodes: int = 8, prefix: str = "ssd-", tag: str | None = None, mtu: int = 9000,
                 mirror: bool = True, per_node_dpu: bool = False):
        if not 2 <= nodes <= 250:
            raise FabricError(f"nodes must be 2..250, not {nodes}")
        self.n = int(nodes)
        self.prefix = prefix
        self.tag = tag or secrets.token_hex(2)
        base = f"{prefix}{self.tag}"
        self.node_ns = [f"{base}-gpu{i}" for i in range(self.n)]
        self.sw_ns = f"{base}-sw"
        self.per_node_dpu = bool(per_node_dpu)
        # one observer for the whole fabric (obs_ns), or one per node (dpu_ns[i]; obs_ns None)
        self.dpu_ns = [f"{base}-dpu{i}" for i in range(self.n)] if self.per_node_dpu else [f"{base}-dpu"]
        self.obs_ns = None if self.per_node_dpu else self.dpu_ns[0]
        self.node_if = "eth0"
        self.obs_if = "obs0"
        self.mon_if = "mon0"
        self.mgmt_if = "mgmt0"                 # per_node_dpu: the DPU side of its management veth
        self.mgmt_root = [f"{base}m{i}" for i in range(self.n)] if self.per_node_dpu else []
        if any(len(x) > 15 for x in self.mgmt_root):
            raise FabricError(f"prefix+tag {base!r} too long for interface names (at most {11 - len(str(self.n))} "
                              "characters with per_node_dpu)")
        self.mgmt_block = 0                    # first /30 of 10.253.0.0/16 in use (per_node_dpu)
        self.exporter_port = 9435              # start_exporters' port
        self.mtu = int(mtu)
        self.mirror = mirror
        self.made: list[str] = []              # namespaces, in creation order
        self.procs: list[subprocess.Popen] = []
        self.state_file = STATE_DIR / f"fabric-{base}.json"

    # -- names ----------------------------------------------------------------------------
    def node_ip(self, i: int) -> str:
        return f"10.0.0.{i + 1}"

    def namespaces(self) -> list[str]:
        return [*self.node_ns, self.sw_ns, *self.dpu_ns]

    def mon_ifs(self) -> list[str]:
        """The switch's SPAN ports: mon0 (one observer) or mon<i> (per node)."""
        return [f"mon{i}" for i in range(self.n)] if self.per_node_dpu else [self.mon_if]

    def _mgmt_ips(self, i: int) -> tuple[str, str]:
        """per_node_dpu: (root side, DPU side) addresses of DPU i's management /30."""
        a = (self.mgmt_block + i) * 4
        return f"10.253.{a >> 8}.{(a & 255) + 1}", f"10.253.{a >> 8}.{(a & 255) + 2}"

    def dpu_addr(self, i: int) -> str:
        """per_node_dpu: the address of DPU i reachable from the root namespace."""
        if not self.per_node_dpu:
            raise FabricError("dpu_addr() needs a fabric built with per_node_dpu=True")
        return self._mgmt_ips(i)[1]

    def dpu_node(self, i: int) -> str:
        """The `node` label start_exporters gives DPU i (it watches node i, 10.0.0.(i+1))."""
        return f"dpu{i}"

    # -- build / teardown -----------------------------------------------------------------
    def _save_state(self) -> None:
        try:
            STATE_DIR.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self.state_file, json.dumps({"pid": os.getpid(), "namespaces": self.made,
                                                           "procs": [p.pid for p in self.procs],
                                                           "root_links": self.mgmt_root,
                                                           "created": time.time()}))
        except OSError:
            pass

    def _ns(self, name: str) -> None:
        _run(["ip", "netns", "add", name])
        self.made.append(name)
        self._save_state()
        _run(["ip", "-n", name, "link", "set", "lo", "up"])
        for k in ("all", "default"):
            _run(["ip", "netns", "exec", name, "sysctl", "-qw", f"net.ipv6.conf.{k}.disable_ipv6=1"], check=False)

    def build(self) -> "Fabric":
        try:
            for ns in self.namespaces():
                self._ns(ns)
            sw = self.sw_ns
            _run(["ip", "-n", sw, "link", "add", "br0", "type", "bridge"])
            _run(["ip", "-n", sw, "link", "set", "br0", "mtu", str(self.mtu), "up"])
            for i, ns in enumerate(self.node_ns):
                port = f"p{i}"
                _run(["ip", "-n", sw, "link", "add", port, "mtu", str(self.mtu), "type", "veth", "peer", "name",
                      self.node_if, "netns", ns])
                mac = node_mac(i).hex(":")
                _run(["ip", "-n", ns, "link", "set", self.node_if, "address", mac, "mtu", str(self.mtu), "up"])
                _run(["ip", "-n", ns, "addr", "add", f"{self.node_ip(i)}/24", "dev", self.node_if])
                _run(["ip", "-n", sw, "link", "set", port, "master", "br0", "up"])
            for mon, dpu in zip(self.mon_ifs(), self.dpu_ns):
                _run(["ip", "-n", sw, "link", "add", mon, "mtu", str(self.mtu), "type", "veth", "peer", "name",
                      self.obs_if, "netns", dpu])
                _run(["ip", "-n", sw, "link", "set", mon, "up"])
                _run(["ip", "-n", dpu, "link", "set", self.obs_if, "mtu", str(self.mtu), "up"])
            if self.per_node_dpu:
                self._build_per_node()
            elif self.mirror:
                for i in range(self.n):
                    mirror.add(f"p{i}", self.mon_if, "ingress", netns=sw)
        except BaseException:
            self.teardown()
            raise
        return self

    def _build_per_node(self) -> None:
        sw = self.sw_ns
        for i in range(self.n):
            # the switch knows every node's port (a ToR after learning): a frame for node j
            # leaves through p<j> only, never flooded to another node's port (and its DPU)
            _run(["bridge", "-n", sw, "fdb", "replace", node_mac(i).hex(":"), "dev", f"p{i}", "master", "static"])
            _run(["bridge", "-n", sw, "link", "set", "dev", f"p{i}", "flood", "off", "learning", "off"])
            if self.mirror:
                mirror.add(f"p{i}", f"mon{i}", "both", netns=sw)
        self.mgmt_block = _free_mgmt_blocks(self.n)
        for i, (root_if, dpu) in enumerate(zip(self.mgmt_root, self.dpu_ns)):
            here, there = self._mgmt_ips(i)
            _run(["ip", "link", "add", root_if, "type", "veth", "peer", "name", self.mgmt_if, "netns", dpu])
            _run(["ip", "addr", "add", f"{here}/30", "dev", root_if])
            _run(["ip", "link", "set", root_if, "up"])
            _run(["ip", "-n", dpu, "addr", "add", f"{there}/30", "dev", self.mgmt_if])
            _run(["ip", "-n", dpu, "link", "set", self.mgmt_if, "up"])

    def start_exporters(self, port: int = 9435, interval: float = 0.25, extra: tuple = (), log_dir=None,
                        xdp_mode: str = "generic", nice: int = 0) -> list[str]:
        """per_node_dpu: run `skewscope export -i obs0 --listen <dpu_addr(i)>:port --node dpu<i>
        --node-ip <node_ip(i)>` live in every DPU namespace (helper processes: stopped by
        teardown, detaching as they exit). Output goes to log_dir/export-dpu<i>.log (else
        discarded). nice > 0 runs them at that niceness: on a shared machine the player, which
        stands in for the NICs' timing, should not wait for the observers' analysis (real
        DPUs have cores of their own). Returns the scrape targets, DPU 0 first."""
        if not self.per_node_dpu:
            raise FabricError("start_exporters() needs a fabric built with per_node_dpu=True")
        for i, dpu in enumerate(self.dpu_ns):
            log = open(Path(log_dir) / f"export-{self.dpu_node(i)}.log", "w") if log_dir else subprocess.DEVNULL
            try:
                pre = ["nice", "-n", str(int(nice))] if nice else []
                cmd = ["ip", "netns", "exec", dpu, sys.executable, "-m", "skewscope.cli", "export",
                       "-i", self.obs_if, "--listen", f"{self.dpu_addr(i)}:{port}", "--node", self.dpu_node(i),
                       "--node-ip", self.node_ip(i), "--interval", f"{interval:g}", "--xdp-mode", xdp_mode, *extra]
                self.spawn(pre + cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                           start_new_session=True)
            finally:
                if log_dir:
                    log.close()
        self.exporter_port = port
        return self.scrape_targets(port)

    def scrape_targets(self, port: int | None = None) -> list[str]:
        """per_node_dpu: "ADDR:PORT" of every DPU's exporter, DPU 0 first."""
        port = port or self.exporter_port
        return [f"{self.dpu_addr(i)}:{port}" for i in range(self.n)]

    def spawn(self, args: list[str], **kw) -> subprocess.Popen:
        """Start a helper process we own (stopped in teardown, before the namespaces go)."""
        p = subprocess.Popen(args, **kw)
        self.procs.append(p)
        self._save_state()
        return p

    def stop_procs(self, timeout: float = 5.0) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    p.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + timeout
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)
        self.procs.clear()

    def teardown(self) -> list[str]:
        """Remove everything made (idempotent). Returns names that could not be removed."""
        self.stop_procs()
        left = []
        for ns in reversed(self.made):
            p = _run(["ip", "netns", "del", ns], check=False)
            if p.returncode != 0 and ns in list_namespaces():
                left.append(ns)
        self.made = left
        for root_if in self.mgmt_root:        # normally gone with its namespace's end
            if Path(f"/sys/class/net/{root_if}").exists():
                _run(["ip", "link", "del", root_if], check=False)
        if not left:
            try:
                self.state_file.unlink()
            except OSError:
                pass
        else:
            self._save_state()
        return left

    def __enter__(self):
        return self.build()

    def __exit__(self, *exc):
        self.teardown()


def cleanup_stale(prefix: str = "ssd-") -> list[str]:
    """Remove fabrics (namespaces, helper processes) recorded in state files whose owner
    process is gone. Returns the namespaces removed."""
    removed = []
    if not STATE_DIR.is_dir():
        return removed
    for f in STATE_DIR.glob(f"fabric-{prefix}*.json"):
        try:
            st = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        pid = int(st.get("pid", 0))
        if pid and _alive(pid):
            continue
        for cp in st.get("procs", []):
            if _alive(cp) and _in_namespaces(cp, st.get("namespaces", [])):
                try:
                    os.kill(cp, signal.SIGKILL)
                except OSError:
                    pass
        for ns in reversed(st.get("namespaces", [])):
            if ns.startswith(prefix) and _run(["ip", "netns", "del", ns], check=False).returncode == 0:
                removed.append(ns)
        for link in st.get("root_links", []):   # per_node_dpu management veths (normally gone with the ns)
            if link.startswith(prefix) and Path(f"/sys/class/net/{link}").exists():
                _run(["ip", "link", "del", link], check=False)
        try:
            f.unlink()
        except OSError:
            pass
    return removed


def _free_mgmt_blocks(n: int) -> int:
    """The first of n consecutive /30 blocks of 10.253.0.0/16 with no address of the root
    namespace in them (other fabrics' management links)."""
    p = _run(["ip", "-4", "-j", "addr", "show"], check=False)
    try:
        used = {int(a["local"].split(".")[2]) * 64 + int(a["local"].split(".")[3]) // 4
                for ifc in json.loads(p.stdout or "[]") for a in ifc.get("addr_info", [])
                if a.get("local", "").startswith("10.253.")}
    except (json.JSONDecodeError, ValueError, IndexError, KeyError):
        used = set()
    blocks = 16384
    start = secrets.randbelow(blocks - n)
    for k in range(blocks - n):
        b = (start + k) % (blocks - n)
        if not any(b + j in used for j in range(n)):
            return b
    raise FabricError("no free management addresses left in 10.253.0.0/16")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _in_namespaces(pid: int, names: list[str]) -> bool:
    """Is pid's network namespace one of the named ones (so it is one of our senders)?"""
    try:
        mine = os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return False
    for n in names:
        try:
            if os.stat(f"/run/netns/{n}").st_ino == mine:
                return True
        except OSError:
            continue
    return False


# ---- the player ------------------------------------------------------------------------------
#: Scenarios the demo defines on top of the generator's presets. The MoE one carries both the
#: hot expert and the congestion, so that one all-to-all shows both (two separate
#: all-to-alls between the same nodes would be seen as one group whose skew is diluted).
DEMO_SCENARIOS = {
    "moe-hot-expert+congestion": {
        "description": "8-node MoE all-to-all (dispatch+combine): node 5 hosts a hot expert (4x volume); "
                       "flows into node 2 CE-marked (30%), CNPs back, 0.6x rate",
        "nodes": 8, "iterations": 3, "period_ms": 5.0,
        "workloads": [{"kind": "all_to_all", "bytes_per_peer": "128KiB", "channels": 1, "combine": True}],
        "pathologies": [{"kind": "hot_expert", "node": 5, "factor": 4.0},
                        {"kind": "congestion", "into": 2, "ce_fraction": 0.3, "rate_factor": 0.6}],
    },
}


def resolve_scenario(name):
    """A demo scenario name -> its dict (a fresh copy); anything else is passed through to
    the generator (preset name, scenario file, dict)."""
    if isinstance(name, str) and name in DEMO_SCENARIOS:
        return copy.deepcopy(DEMO_SCENARIOS[name])
    return name


def plan(scenarios: list[str], rate: float, pass_seconds: float, seed: int = 1):
    """Generate the scenarios so that together they send about `rate` frames/s for
    `pass_seconds` with one common time stretch. Returns (captures, stretch)."""
    sg = skewgen
    base = [sg.generate(resolve_scenario(s), seed=seed + k) for k, s in enumerate(scenarios)]
    dens = []
    for c in base:
        ts = c.timestamps
        dur = max(1, int(ts[-1] - ts[0])) if len(ts) else 1
        dens.append(len(c) / (dur / 1e9))
    stretch = max(1.0, sum(dens) / float(rate))
    caps = []
    want_ms = pass_seconds / stretch * 1e3
    for k, (name, c) in enumerate(zip(scenarios, base)):
        sc = copy.deepcopy(sg.load_scenario(resolve_scenario(name)))
        period = float(sc.get("period_ms") or 0)
        iters = int(sc.get("iterations") or 1)
        ts = c.timestamps
        dur_ms = (int(ts[-1] - ts[0]) / 1e6) if len(ts) else 0.0
        if period > 0 and want_ms > dur_ms:
            n = max(iters, int(round(want_ms / period)))
            sc["iterations"] = n
            for w in sc["workloads"]:
                if "iterations" in w:
                    w["iterations"] = n
            caps.append(sg.generate(sc, seed=seed + k))
        else:
            caps.append(c)
    return caps, stretch


def _frames_by_time(caps):
    """Merge captures (each from its own t=0) into one timeline: yields (t_ns, frame bytes)
    in time order, reading frames chunk by chunk (bounded memory)."""

    def one(cap):
        ts0 = int(cap.timestamps[0]) if len(cap) else 0
        for ts, buf, offs, lens in cap.frame_chunks(chunk_bytes=4 << 20):
            rel = ts.astype(np.int64) - ts0
            for k in range(ts.shape[0]):
                o = int(offs[k])
                yield int(rel[k]), bytes(buf[o:o + int(lens[k])])
    return heapq.merge(*(one(c) for c in caps), key=lambda x: x[0])


def play(node_ns: list[str], iface: str, caps, stretch: float, max_seconds: float, max_frames: int | None = None,
         passes: int | None = None, reseed=None, stop=None, log=None) -> dict:
    """Send captures from the node namespaces, time-stretched, in passes (each pass starts
    when the previous ends; `reseed(pass_index)` may return fresh captures so PSNs do not
    jump back). Bounded by max_seconds, max_frames, passes and `stop()`."""
    macs = {node_mac(i): i for i in range(len(node_ns))}
    socks = {}
    for i, ns in enumerate(node_ns):
        with in_netns(ns):
            s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
            s.bind((iface, 0))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
            socks[i] = s
    sent = unknown = retries = 0
    t_start = time.monotonic()
    deadline = t_start + max_seconds
    npass = 0
    try:
        while passes is None or npass < passes:
            if npass and reseed is not None:
                caps = reseed(npass)
            t0 = time.monotonic()
            for rel, frame in _frames_by_time(caps):
                due = t0 + rel * stretch / 1e9
                now = time.monotonic()
                if due > now:
                    if due > deadline:
                        return _stats(sent, unknown, retries, t_start, npass)
                    time.sleep(due - now)
                if (sent & 255) == 0 and ((stop is not None and stop()) or time.monotonic() > deadline):
                    return _stats(sent, unknown, retries, t_start, npass)
                node = macs.get(frame[6:12])
                if node is None:
                    unknown += 1
                    continue
                while True:
                    try:
                        socks[node].send(frame)
                        break
                    except OSError as e:
                        if e.errno not in (errno.ENOBUFS, errno.EAGAIN):
                            raise
                        retries += 1
                        time.sleep(0.0005)
                        if time.monotonic() > deadline:
                            return _stats(sent, unknown, retries, t_start, npass)
                sent += 1
                if max_frames is not None and sent >= max_frames:
                    return _stats(sent, unknown, retries, t_start, npass)
            npass += 1
            if log:
                log(f"pass {npass} done: {sent} frames sent")
    finally:
        for s in socks.values():
            s.close()
    return _stats(sent, unknown, retries, t_start, npass)


def _stats(sent, unknown, retries, t0, npass):
    el = time.monotonic() - t0
    return {"sent": sent, "unknown_source": unknown, "retries": retries, "seconds": round(el, 3),
            "passes": npass, "fps": round(sent / el, 1) if el > 0 else 0.0}


def _main(argv=None) -> int:
    """`python -m skewscope.testbed.fabric play ...`: the demo's sender process."""
    ap = argparse.ArgumentParser(prog="skewscope.testbed.fabric")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("play")
    p.add_argument("--ns", required=True, help="comma-separated node namespaces, node i first")
    p.add_argument("--iface", default="eth0")
    p.add_argument("--scenario", action="append", required=True)
    p.add_argument("--rate", type=float, default=20000)
    p.add_argument("--pass-seconds", type=float, default=60)
    p.add_argument("--max-seconds", type=float, required=True)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--parent", type=int, default=0, help="exit when this process is gone")
    a = ap.parse_args(argv)
    if a.parent:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != a.parent:        # parent died before prctl took effect
            return 1
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    ns = a.ns.split(",")
    caps, stretch = plan(a.scenario, a.rate, a.pass_seconds, a.seed)
    print(json.dumps({"event": "start", "stretch": round(stretch, 1), "frames_per_pass": sum(len(c) for c in caps)}),
          flush=True)

    def reseed(k):
        return plan(a.scenario, a.rate, a.pass_seconds, a.seed + 1000 * k)[0]

    st = play(ns, a.iface, caps, stretch, a.max_seconds, reseed=reseed,
              log=lambda m: print(json.dumps({"event": "log", "msg": m}), flush=True))
    print(json.dumps({"event": "done", **st}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_main())
