"""Test helper: generator scenario -> (ground truth, Snapshot), cached per test session.

Ground truth comes from skewgen (skewscope/gen/), the Snapshot from the offline pcap parser
(skewscope.sources.offline.parse_file; the kernel replay when the parser is unavailable and we
are root). Pcaps are written with a 128-byte snap length (headers only, like
`tcpdump -s 128`) to keep them small.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
TOOLS = ROOT / "tools"
REAL = ROOT.parent / "shared/data/real"
if str(TOOLS) not in sys.path:
    sys.path.insert(0, str(TOOLS))

_cache: dict = {}
_dir = None


def scenario_path(name: str) -> str:
    """A preset name, or a file in tests/scenarios/ (name without .yaml)."""
    p = HERE / f"{name}.yaml"
    return str(p) if p.exists() else name


def _workdir() -> str:
    global _dir
    if _dir is None:
        _dir = tempfile.mkdtemp(prefix="skewscope-acc-")
    return _dir


def snapshot_of_pcap(path: str):
    try:
        from skewscope.sources.offline import parse_file
    except ImportError:
        if os.geteuid() != 0:
            import pytest
            pytest.skip("no offline parser and not root (kernel replay needs root)")
        from skewscope.sources.replay import replay
        return replay(path)
    return parse_file(path)


def get(name: str, seed: int = 0):
    """(truth dict, Snapshot) of a scenario, generated once per session."""
    key = (name, seed)
    if key not in _cache:
        from skewscope import gen as skewgen
        out = os.path.join(_workdir(), f"{name}-{seed}.pcap")
        skewgen.write(scenario_path(name), out, seed=seed, snaplen=128)
        with open(skewgen.truth_path(out)) as fh:
            truth = json.load(fh)
        snap = snapshot_of_pcap(out)
        os.unlink(out)
        _cache[key] = (truth, snap)
    return _cache[key]


def get_any(sc, seed: int = 0):
    """(truth dict, Snapshot) of a preset name (as get) or a scenario dict, generated once per
    session (the dict is copied: the generator fills in defaults)."""
    if isinstance(sc, str):
        return get(sc, seed)
    key = ("dict", json.dumps(sc, sort_keys=True), seed)
    if key not in _cache:
        import copy

        from skewscope import gen as skewgen
        out = os.path.join(_workdir(), f"dict-{len(_cache)}-{seed}.pcap")
        cap = skewgen.write(copy.deepcopy(sc), out, seed=seed, snaplen=128)
        snap = snapshot_of_pcap(out)
        os.unlink(out)
        _cache[key] = (cap.truth, snap)
    return _cache[key]


def analyzed(name: str, seed: int = 0, **kw):
    """(truth, Snapshot, analysis) with the default thresholds."""
    key = ("analysis", name, seed, tuple(sorted(kw.items())))
    if key not in _cache:
        from skewscope.analysis import analyze
        truth, snap = get(name, seed)
        _cache[key] = (truth, snap, analyze(snap, **kw))
    return _cache[key]


def vantage(snap, ip: str):
    """The Snapshot a DPU on one host's port would record: only the flows from or to `ip`
    (and their message records), everything else as captured."""
    import numpy as np

    from skewscope.core.snapshot import Snapshot, ip_str
    fl = snap.flows
    keep = np.array([ip_str(f["src"], f["ipver"]) == ip or ip_str(f["dst"], f["ipver"]) == ip for f in fl])
    new = np.full(len(fl), -1, dtype=np.int64)
    new[keep] = np.arange(int(keep.sum()))
    ev = snap.events
    ek = (ev["flow"] >= 0) & keep[np.maximum(ev["flow"], 0)]
    ev2 = ev[ek].copy()
    ev2["flow"] = new[ev2["flow"]]
    return Snapshot(fl[keep], ev2, snap.globals.copy(), dict(snap.meta, vantage=ip))


def concat(a, b, gap_ns: float = 0.0, shift_ns: float | None = None):
    """Two captures of one job, one after the other in time (b shifted to start gap_ns after
    a's last packet; or by exactly shift_ns: with the generator's common epoch, shift_ns =
    a's iterations x period continues a's cadence): the Snapshot a DPU would have recorded over both -- flows with the same
    key are one flow (counters summed, first_ts/last_ts spanning both), message records of
    both, b's shifted. Returns (Snapshot, shift_ns, b's first packet time after the shift).
    Used to build onsets (healthy a, then pathological b) and recoveries (the other way) with
    the generator's truth: the onset is where b begins."""
    import numpy as np

    from skewscope.core import layout as L
    from skewscope.core.snapshot import Snapshot, _key_order, flow_key_matrix, flow_key_words, match_rows
    shift = int(a.meta["last_ts"]) - int(b.meta["first_ts"]) + int(gap_ns) if shift_ns is None else int(shift_ns)
    fb = b.flows.copy()
    for k in ("first_ts", "last_ts"):
        fb[k] = np.where(fb["packets"] > 0, fb[k].astype(np.int64) + shift, 0).astype(fb[k].dtype)
    ka, kb = flow_key_words(a.flows), flow_key_words(fb)
    pos = match_rows(ka, kb)                      # b's row -> a's row or -1
    new_b = pos < 0
    merged = np.concatenate([a.flows.copy(), fb[new_b]])
    row_b = np.where(new_b, len(a.flows) + np.cumsum(new_b) - 1, pos)
    key = ("src", "dst", "dest_qp", "ipver", "roce")
    last_fields = ("sport", "tclass", "last_opcode")
    for name in L.FLOW_DTYPE.names:
        if name in key:
            continue
        both = ~new_b
        ra, rb = pos[both], np.flatnonzero(both)
        if name == "first_ts":
            merged[name][ra] = np.minimum(merged[name][ra], fb[name][rb])
        elif name == "last_ts":
            merged[name][ra] = np.maximum(merged[name][ra], fb[name][rb])
        elif name in last_fields:
            merged[name][ra] = fb[name][rb]
        else:
            merged[name][ra] = merged[name][ra] + fb[name][rb]
    order = _key_order(flow_key_matrix(merged))
    inv = np.empty(len(order), dtype=np.int64)
    inv[order] = np.arange(len(order))
    merged = merged[order]
    ea, eb = a.events.copy(), b.events.copy()
    ea["flow"] = np.where(ea["flow"] >= 0, inv[np.maximum(ea["flow"], 0)], -1)
    eb["flow"] = np.where(eb["flow"] >= 0, inv[row_b[np.maximum(eb["flow"], 0)]], -1)
    for k in ("start_ts", "end_ts"):
        eb[k] = eb[k].astype(np.int64) + shift
    ev = np.concatenate([ea, eb])
    ev = ev[np.argsort(ev["start_ts"], kind="stable")]
    meta = dict(a.meta)
    meta["last_ts"] = int(b.meta["last_ts"]) + shift
    meta["duration_s"] = (meta["last_ts"] - int(a.meta["first_ts"])) / 1e9
    meta["file"] = f"{a.meta.get('file')}+{b.meta.get('file')}"
    return Snapshot(merged, ev, a.globals + b.globals, meta), shift, int(b.meta["first_ts"]) + shift
