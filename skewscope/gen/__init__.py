"""skewgen: NCCL-like RoCEv2 traffic with injectable pathologies, written as pcap + ground
truth, or sent on an interface.

    from skewscope.gen import generate, load_scenario, PRESETS, write
    cap = generate("ring-straggler", seed=1)
    cap.write_pcap("out.pcap", snaplen=0)
    cap.truth            # dict, the ground-truth JSON
    len(cap)             # frames
    for ts_ns, frame in cap.frames_iter(): ...
    v = cap.view("10.0.0.3")   # the frames one DPU on node 10.0.0.3 sees (a Capture too)
    cap.views()                # {ip: Capture} for every node

See docs/generator.md.
"""
from __future__ import annotations

import ipaddress
import json
import os

import numpy as np

from skewscope.core.files import atomic_write_text

# The package itself stays light (presets and scenario parsing, for `gen --list-presets` and
# `skewscope --help`); the numba model, renderer and truth are imported where they are used.
from skewscope.gen.presets import PRESETS
from skewscope.gen.scenario import ScenarioError, load_scenario

__all__ = ["generate", "load_scenario", "PRESETS", "write", "Capture", "ScenarioError",
           "VIEW_FILTER"]

VIEW_FILTER = ("frames whose source or destination IP is the node (both directions: its "
               "sends, its receives, the ACKs/CNPs of either); PFC frames the node sends; "
               "timestamps of the full capture")


class Capture:
    """A generated capture: the packet table plus everything needed to render frames.

    A *view* (``cap.view(ip)``) is the same kind of object holding only the frames one DPU
    on that node sees; its truth is the full capture's plus a ``view`` field."""

    def __init__(self, job, pkts: dict, view: dict | None = None, parent=None):
        self.job = job
        self.pkts = pkts
        self.scenario = job.sc
        self.seed = job.seed
        self._truth = None
        self._src = None
        self.view_info = view
        self._parent = parent

    def __len__(self) -> int:
        return int(self.pkts["ts"].shape[0])

    @property
    def timestamps(self) -> np.ndarray:
        """ns since the Unix epoch, one per frame, non-decreasing."""
        return self.pkts["ts"]

    @property
    def truth(self) -> dict:
        if self._truth is None:
            if self._parent is not None:   # a view: the whole job's truth + where it looks
                self._truth = dict(self._parent.truth, view=dict(self.view_info))
            else:
                from skewscope.gen import truth as T  # heavy (numba)
                self._truth = T.compute(self.job, self.pkts)
        return self._truth

    def node_index(self, node) -> int:
        """Node index of an IP string (as the truth writes it) or of an int index."""
        if isinstance(node, int) or (isinstance(node, str) and node.isdigit()):
            i = int(node)
            if not 0 <= i < self.job.n:
                raise ScenarioError(f"node {i} out of range (0..{self.job.n - 1})")
            return i
        try:
            a = ipaddress.ip_address(str(node)).compressed
        except ValueError:
            raise ScenarioError(f"not a node IP or index: {node!r}") from None
        if a not in self.job.ip_str:
            raise ScenarioError(f"{a} is not a node of this scenario (nodes: "
                                f"{', '.join(self.job.ip_str)})")
        return self.job.ip_str.index(a)

    def node_mask(self, i: int) -> np.ndarray:
        """bool per frame: frame seen by a DPU on node i (VIEW_FILTER)."""
        from skewscope.gen import frames as F  # heavy (numba)
        p = self.pkts
        path = p["path"].astype(np.int64)
        pa = self.job.path_arrays()
        ip_frame = p["ftype"] != F.FT_PFC
        safe = np.where(ip_frame, path, 0)
        if pa["src"].size:
            ends = (pa["src"][safe] == i) | (pa["dst"][safe] == i)
        else:
            ends = np.zeros(path.shape[0], dtype=bool)
        return np.where(ip_frame, ends, path == i)

    def clock_offset_ns(self, i: int, skew_us: float) -> int:
        """The fixed clock offset of node i's DPU for views with clock skew +-skew_us:
        uniform in [-skew_us, +skew_us], drawn from (seed, node) only."""
        if not skew_us:
            return 0
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, 0xC10C, i]))
        return int(round(rng.uniform(-skew_us, skew_us) * 1e3))

    def view(self, node, clock_skew_us: float = 0.0) -> "Capture":
        """The frames a DPU on `node` (IP string or index) sees, as a Capture.  With
        clock_skew_us, its timestamps carry that DPU's fixed clock offset (clock_offset_ns)."""
        if self._parent is not None:
            raise ValueError("a view of a view")
        i = self.node_index(node)
        m = self.node_mask(i)
        sub = {k: v[m] for k, v in self.pkts.items()}
        off = self.clock_offset_ns(i, clock_skew_us)
        if off:
            sub["ts"] = sub["ts"] + off
        info = {"node": self.job.ip_str[i], "index": i, "frames": int(m.sum()),
                "of_frames": len(self), "filter": VIEW_FILTER, "clock_offset_ns": off}
        return Capture(self.job, sub, view=info, parent=self)

    def views(self, clock_skew_us: float = 0.0) -> dict:
        """{node IP: its view} for every node of the scenario, in node order."""
        return {ip: self.view(i, clock_skew_us) for i, ip in enumerate(self.job.ip_str)}

    def _source(self):
        if self._src is None:
            from skewscope.gen.pcapio import FrameSource  # heavy (numba)
            self._src = FrameSource(self.pkts, self.job.path_arrays(), self.job.header_info())
        return self._src

    def frame_lengths(self) -> np.ndarray:
        from skewscope.gen import frames as F  # heavy (numba)
        p = self.pkts
        return F.frame_lengths(p["ftype"], p["opcode"], p["plen"], self.job.hdr_len)

    def write_pcap(self, path, snaplen: int = 0) -> None:
        from skewscope.gen.pcapio import write_pcap  # heavy (numba)
        if snaplen < 0:
            raise ValueError("snaplen must be >= 0")
        write_pcap(self._source(), path, snaplen=snaplen)

    def frame_chunks(self, chunk_bytes: int = 8 << 20):
        """Yield (ts array, buffer, offsets, lengths) for consecutive runs of frames."""
        src = self._source()
        lens = self.frame_lengths()
        buf = np.empty(chunk_bytes, dtype=np.uint8)
        offs = np.empty(chunk_bytes // 60 + 1, dtype=np.int64)
        i = 0
        while i < src.n:
            j, _ = src.fill(buf, i, src.n, 0, False, offs)
            if j == i:
                raise RuntimeError("chunk too small")
            yield self.pkts["ts"][i:j], buf, offs[: j - i], lens[i:j]
            i = j

    def frames_iter(self):
        """Yield (ts_ns, frame bytes) for every frame, in capture order."""
        for ts, buf, offs, lens in self.frame_chunks():
            for k in range(ts.shape[0]):
                o = int(offs[k])
                yield int(ts[k]), bytes(buf[o:o + int(lens[k])])

    def write_truth(self, path) -> None:
        atomic_write_text(path, json.dumps(self.truth, indent=1) + "\n")


def _background(job) -> None:
    bg = job.sc["background"]
    if not bg or not job.m_t0:
        return
    span = max(job.m_t0) + 100_000.0
    k = int(job.rng.poisson(bg["pps"] * span / 1e9))
    times = np.sort(job.rng.uniform(0.0, span, size=k))
    pairs = {}
    for t in times:
        a, b = (int(x) for x in job.rng.choice(job.n, size=2, replace=False))
        if (a, b) not in pairs:
            pairs[(a, b)] = job.bg_path(a, b, 40000 + len(pairs), int(bg["dport"]))
        job.bg.append((float(t), pairs[(a, b)], int(bg["plen"])))


def generate(scenario_or_preset, seed: int = 0) -> Capture:
    """Build a capture from a preset name, a scenario file path or a scenario dict."""
    from skewscope.gen import collectives, inference, pathologies  # heavy (numba, via the model)
    from skewscope.gen.engine import Job  # heavy (numba)
    sc = load_scenario(scenario_or_preset)
    job = Job(sc, int(seed))
    builders = dict(collectives.BUILDERS, **inference.BUILDERS)
    try:
        pathologies.prepare(job, sc)
        # KV transfers first: a TP decode group sharing their links sees their queues
        for wl in sorted(sc["workloads"], key=lambda w: w["kind"] != "kv_transfer"):
            builders[wl["kind"]](job, wl)
        pathologies.finish(job, sc)
        job.mpi_exchanges()        # library mpi: the start-up / closing exchanges between all ranks
        inference.summarize(job, sc)
    except (KeyError, IndexError, ValueError) as e:
        if isinstance(e, ScenarioError):
            raise
        raise ScenarioError(f"scenario {sc['name']!r}: {e}") from None
    _background(job)
    w0 = sc["workloads"][0]
    if w0["kind"] in ("tp_decode", "moe_decode"):
        job.period_s = w0["token_ms"] / 1e3
    elif w0["kind"] in inference.TOKEN_KINDS:
        job.period_s = w0["_period_s"]
    elif w0["kind"] == "kv_transfer":
        job.period_s = None
    elif int(w0["iterations"]) > 1:
        job.period_s = w0["period_ms"] / 1e3
    pkts = job.run()
    return Capture(job, pkts)


def truth_path(out_pcap) -> str:
    s = os.fspath(out_pcap)
    return (s[:-5] if s.endswith(".pcap") else s) + ".truth.json"


def write(preset_or_file, out_pcap, seed: int = 0, snaplen: int = 0) -> Capture:
    """Write OUT.pcap and OUT.truth.json; returns the Capture."""
    cap = generate(preset_or_file, seed=seed)
    cap.write_pcap(out_pcap, snaplen=snaplen)
    cap.write_truth(truth_path(out_pcap))
    return cap


def write_views(cap: Capture, out_dir, snaplen: int = 0, clock_skew_us: float = 0.0) -> list:
    """One view per node: OUT_DIR/<ip>.pcap + OUT_DIR/<ip>.truth.json (truth with `view`),
    and OUT_DIR/truth.json (the whole capture's truth).  Returns the pcap paths."""
    out = []
    for ip, v in cap.views(clock_skew_us).items():
        p = os.path.join(os.fspath(out_dir), f"{ip}.pcap")
        v.write_pcap(p, snaplen=snaplen)
        v.write_truth(truth_path(p))
        out.append(p)
    cap.write_truth(os.path.join(os.fspath(out_dir), "truth.json"))
    return out
