"""Differential test: the offline numba parser == the real BPF program (issue 4).

The same capture goes through `skewscope replay` (every frame through the kernel's
BPF_PROG_TEST_RUN, pcap clock and caplen) and through `offline.parse_file`; the two
Snapshots must be equal field by field: every flow column (key, counters, histograms), every
message record, every global counter, and the meta both define. Captures:

- every skewgen preset (whatever PRESETS holds), headers-only (snaplen 128), plus full
  frames for the small ones;
- every file in ../shared/data/real (the ERF one must be refused by both);
- container/link-type variants of one preset rebuilt from its records: pcapng with a
  cooked-v2 and a raw-IP interface, gzip;
- a flow table too small for the traffic: there the kernel's LRU (an approximation that
  frees in batches) and the offline exact LRU may keep different flows; the test checks
  what must still agree and reports how far the kept sets differ (docs/offline.md).
Per-frame kernel == offline on mutated/random frames is tests/kernel/test_fuzz_kernel.py.
"""
from __future__ import annotations

import gzip
import os
import struct
from pathlib import Path

import numpy as np
import pytest

from skewscope.core import layout as L

pytestmark = [
    pytest.mark.kernel,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root for BPF_PROG_TEST_RUN (CI runs as root)"),
    pytest.mark.timeout(900),
]

REAL = Path(__file__).resolve().parents[2].parent / "shared/data/real"
#: the captures (pcap, pcapng, gzipped): not whatever else a tool may leave beside them
REAL_FILES = sorted(p for p in REAL.glob("*.pcap*") if p.name.endswith((".pcap", ".pcapng", ".pcap.gz", ".pcapng.gz"))) \
    if REAL.is_dir() else []
META_KEYS = ("frames", "first_ts", "last_ts", "duration_s", "flows_created", "flows_evicted", "flows_present",
             "max_flows", "sample_n", "clock", "events_lost")


def _skewgen():
    return pytest.importorskip("skewscope.gen")


def _presets():
    try:
        from skewscope import gen as skewgen
    except ImportError:
        return ["(skewgen missing)"]
    return list(skewgen.PRESETS)


def both(path, max_flows=65536, entry="xdp"):
    from skewscope.sources import offline
    from skewscope.sources.replay import replay
    return offline.parse_file(path, max_flows=max_flows), replay(str(path), entry=entry, max_flows=max_flows)


def assert_equal_snapshots(off, ker, what):
    assert len(off.flows) == len(ker.flows), (what, len(off.flows), len(ker.flows))
    for n in ker.flows.dtype.names:
        if not np.array_equal(off.flows[n], ker.flows[n]):
            rows = np.nonzero((off.flows[n] != ker.flows[n]).reshape(len(ker.flows), -1).any(axis=1))[0]
            r = int(rows[0])
            pytest.fail(f"{what}: flows.{n} differs in {len(rows)} rows, e.g. {off.flow_label(r)}: "
                        f"offline {off.flows[n][r]} kernel {ker.flows[n][r]}")
    assert len(off.events) == len(ker.events), (what, len(off.events), len(ker.events))
    for n in ker.events.dtype.names:
        assert np.array_equal(off.events[n], ker.events[n]), f"{what}: events.{n} differs"
    diff = np.nonzero(off.globals != ker.globals)[0]
    assert not len(diff), (what, {(L.CATEGORY_NAMES[i] if i < L.G_NCAT else int(i)):
                                  (int(off.globals[i]), int(ker.globals[i])) for i in diff})
    for k in META_KEYS:
        assert off.meta[k] == ker.meta[k], (what, k, off.meta[k], ker.meta[k])
    assert off.meta["snaplen_cut_records"] == ker.meta["padded_records"]


@pytest.mark.parametrize("preset", _presets())
def test_preset_headers_only(tmp_path, preset):
    skewgen = _skewgen()
    p = tmp_path / f"{preset}.pcap"
    skewgen.write(preset, p, seed=5, snaplen=128)
    off, ker = both(p)
    assert_equal_snapshots(off, ker, preset)
    assert int(ker.globals[L.G_ACCOUNTED]) > 0 and len(ker.events) > 0


@pytest.mark.parametrize("preset", ["mixed", "loss", "pfc", "ipv6-ring", "vlan-alltoall", "tp-decode"])
def test_preset_full_frames(tmp_path, preset):
    skewgen = _skewgen()
    if preset not in skewgen.PRESETS:
        pytest.skip(f"preset {preset} no longer exists")
    p = tmp_path / f"{preset}.pcap"
    skewgen.write(preset, p, seed=6, snaplen=0)
    off, ker = both(p)
    assert_equal_snapshots(off, ker, preset + " (full frames)")


@pytest.mark.parametrize("path", REAL_FILES, ids=[p.name for p in REAL_FILES])
@pytest.mark.parametrize("entry", ["xdp", "tc"])
def test_real_captures(path, entry):
    from skewscope.core.errors import PcapError
    from skewscope.sources import offline
    from skewscope.sources.replay import replay
    if "ERF" in path.name:
        with pytest.raises(PcapError, match="link type 197"):
            offline.parse_file(path)
        with pytest.raises(PcapError, match="link type 197"):
            replay(str(path), entry=entry)
        return
    off, ker = both(path, entry=entry)
    assert_equal_snapshots(off, ker, f"{path.name} ({entry})")


def _variants(src: Path, out: Path):
    """Rebuild `src` (Ethernet pcap, read with scapy) as: a pcapng whose IPv4 frames
    alternate between a Linux-cooked-v2 and a raw-IP interface (others on Ethernet), each
    interface with its own if_tsresol; and a gzip of the pcap."""
    RawPcapReader = pytest.importorskip("scapy.utils", reason="scapy rebuilds the variants").RawPcapReader

    def blk(t, body):
        body += b"\0" * (-len(body) % 4)
        return struct.pack("<II", t, 12 + len(body)) + body + struct.pack("<I", 12 + len(body))

    def idb(lt, res):
        return blk(1, struct.pack("<HHI", lt, 0, 0) + struct.pack("<HHB3x", 9, 1, res) + b"\0\0\0\0")

    parts = [blk(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1)), idb(1, 9), idb(276, 9), idb(101, 9)]
    reader = RawPcapReader(str(src))
    for i, (d, m) in enumerate(reader):
        ts_ns = m.sec * 1_000_000_000 + m.usec * (1 if reader.nano else 1000)
        orig, iface = m.wirelen, 0
        if d[12:14] == b"\x08\x00" and len(d) > 34:
            if i % 2:
                d = struct.pack(">HHIHBB8s", 0x0800, 0, 2, 1, 0, 6, d[6:12] + b"\0\0") + d[14:]
                orig, iface = orig - 14 + 20, 1
            else:
                d, orig, iface = d[14:], orig - 14, 2
        parts.append(blk(6, struct.pack("<IIIII", iface, ts_ns >> 32, ts_ns & 0xFFFFFFFF, len(d), orig) + d))
    ng = out / "v.pcapng"
    ng.write_bytes(b"".join(parts))
    gz = out / "v.pcap.gz"
    gz.write_bytes(gzip.compress(src.read_bytes(), compresslevel=1))
    return ng, gz


def test_containers_and_link_types(tmp_path):
    skewgen = _skewgen()
    preset = "mixed" if "mixed" in skewgen.PRESETS else next(iter(skewgen.PRESETS))
    p = tmp_path / "base.pcap"
    skewgen.write(preset, p, seed=9, snaplen=128)
    ng, gz = _variants(p, tmp_path)
    base_off, base_ker = both(p)
    for v in (ng, gz):
        off, ker = both(v)
        assert_equal_snapshots(off, ker, v.name)
        # and the same counters as the plain Ethernet capture (synthesised 14-byte headers)
        assert_equal_snapshots(off, base_ker, v.name + " vs plain pcap")


def test_flow_table_overflow(tmp_path):
    """More flows than max_flows. Must agree: every category, PFC and frame counter;
    flows_evicted == flows_created - present on both sides; both keep at most max_flows and
    every accounted packet counted once. May differ (documented): which flows survive, hence
    flows_created, per-flow counters and partial messages."""
    skewgen = _skewgen()
    preset = "alltoall-healthy" if "alltoall-healthy" in skewgen.PRESETS else next(iter(skewgen.PRESETS))
    p = tmp_path / "many.pcap"
    skewgen.write(preset, p, seed=2, snaplen=128)
    max_flows = 32
    off, ker = both(p, max_flows=max_flows)
    same = [i for i in range(L.G_N) if i not in (L.G_FLOWS_CREATED, L.G_MSG_PARTIAL)]
    assert np.array_equal(off.globals[same], ker.globals[same])
    for s in (off, ker):
        assert len(s.flows) <= max_flows
        assert s.meta["flows_evicted"] == s.meta["flows_created"] - len(s.flows) > 0
        assert int(s.flows["packets"].sum()) <= int(s.globals[L.G_ACCOUNTED])
    kept = lambda s: {bytes(r) for r in np.ascontiguousarray(s.flows[["src", "dst", "dest_qp"]]).view(np.uint8)
                      .reshape(len(s.flows), -1)}  # noqa: E731
    common = len(kept(off) & kept(ker))
    print(f"\n{preset} with max_flows={max_flows}: offline kept {len(off.flows)} flows "
          f"(created {off.meta['flows_created']}), kernel kept {len(ker.flows)} "
          f"(created {ker.meta['flows_created']}); {common} flows kept by both")
