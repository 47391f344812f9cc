"""The exporter's text exposition (outputs/expose._TextCache, what /metrics and `export --once`
serve) is byte-identical to prometheus_client's own generate_latest -- the reference is the
library, not our code -- scrape after scrape while series appear, vanish and change value:
on synthetic families with every value and label oddity, and on the exporter's real families
from real captures and generator presets (with an inventory: the info family)."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import ProcessCollector, generate_latest
from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily,
                                    InfoMetricFamily)

from skewscope.core import inventory as I
from skewscope.core.errors import PcapError
from skewscope.gen import generate
from skewscope.gen.presets import PRESETS
from skewscope.outputs import exporter as E
from skewscope.outputs import expose as X
from skewscope.sources.offline import parse_file

REAL = Path(__file__).resolve().parents[3] / "shared" / "data" / "real"
ODD = ['plain', 'quo"te', 'back\\slash', 'new\nline', 'ünï', '', 'a,b=c}']
VALUES = [0.0, -0.0, 1.0, -3.5, 1e22, 123456789.0, 2 ** 63, float("nan"), float("inf"), float("-inf"),
          1e-9, 7]


class Synthetic:
    """Families whose series and values a scrape number decides."""

    def __init__(self):
        self.n = 0

    def collect(self):
        rng = np.random.default_rng(self.n)
        c = CounterMetricFamily("syn_bytes", 'doc with "quotes", \\ and\nnewline', labels=["node", "peer"])
        for i in rng.choice(40, size=25, replace=False):          # series come and go
            c.add_metric(["n", ODD[i % len(ODD)] + str(i)], VALUES[int(rng.integers(len(VALUES)))])
        yield c
        g = GaugeMetricFamily("syn_gauge", "g", labels=["zeta", "alpha"])  # label order != sorted order
        for i in range(int(rng.integers(0, 5))):
            g.add_metric([ODD[i], str(i)], float(rng.normal()))
        yield g
        yield GaugeMetricFamily("syn_empty", "no series", labels=["x"])
        h = HistogramMetricFamily("syn_hist", "h", labels=["node"])
        h.add_metric(["n"], [("1.0", 1), ("2.5", 3), ("+Inf", 4 + self.n)], sum_value=float(self.n))
        yield h
        i = InfoMetricFamily("syn_build", "i", labels=["node"])
        i.add_metric(["n"], {"version": "1.2", "odd": ODD[self.n % len(ODD)]})
        yield i
        self.n += 1


def _registry(*collectors):
    reg = X.Registry()
    for c in collectors:
        reg.register(c)
    return reg


def test_synthetic_scrapes_equal_generate_latest():
    syn = Synthetic()
    reg = _registry(syn)
    for _ in range(12):
        got = reg.exposition()
        syn.n -= 1                                   # the same scrape again, for the reference
        assert got == generate_latest(reg)
    assert "syn_bytes" in got.decode() and "NaN" in got.decode()


def test_families_it_does_not_cache_are_still_identical():
    """A sample with a timestamp (generate_latest's own handling) and the process collector."""
    class Stamped:
        def collect(self):
            g = GaugeMetricFamily("syn_stamped", "s", labels=["a"])
            g.add_metric(["x"], 1.5, timestamp=1700000000.25)
            yield g
    reg = _registry(Stamped())
    assert reg.exposition() == generate_latest(reg)
    reg = X.Registry()
    ProcessCollector(registry=reg)
    text = reg.exposition().decode()
    assert "process_cpu_seconds_total" in text or not Path("/proc/self/stat").exists()


def _captures():
    caps = sorted(p for p in REAL.glob("*") if p.suffix in (".pcap", ".gz", ".pcapng")) if REAL.is_dir() else []
    if not caps:
        pytest.skip(f"no real captures at {REAL}")
    return caps


def test_exporter_families_on_real_captures_equal_generate_latest(tmp_path):
    """One registry, its state switched capture after capture (the series change wholesale,
    the cache must follow), each scrape against generate_latest on the same state."""
    snaps = []
    for p in _captures():
        try:
            snaps.append(parse_file(str(p)))
        except PcapError:        # the native-InfiniBand (ERF) capture: not RoCE over Ethernet
            continue
    for name in ("ring-straggler", "moe-hot-expert"):
        sc = dict(PRESETS[name])
        sc["iterations"] = 1
        f = tmp_path / f"{name}.pcap"
        generate(sc, seed=3).write_pcap(f, snaplen=128)
        snaps.append(parse_file(str(f)))
    ips = sorted({ip for s in snaps for ip in E.state_from_snapshot(s, "n").peer_src})
    inv = I.parse("ip,host,gpu,rank\n" + "".join(f'{ip},"h{i},x",{i % 8},{i}\n' for i, ip in enumerate(ips)))
    cur = {}
    reg = X.make_registry(X.SkewscopeCollector(lambda: cur.get("st"), inv), process_metrics=False)
    seen = 0
    for k, snap in enumerate(snaps + snaps[:3]):
        cur["st"] = E.state_from_snapshot(snap, f"dpu-{k % 2}")
        got = reg.exposition()
        assert got == generate_latest(reg), k
        seen += got.count(b"\n")
    assert seen > 1000 and not math.isnan(seen)


def test_value_texts_equal_float_to_go_string():
    """expose.value_texts (repr in one pass where it agrees, whole numbers from their digits)
    = prometheus_client's floatToGoString of each value, at and around its rewrite bounds
    and whole numbers of every length and trailing zeros, for floats and for
    uint64 counters (formatted from the Python int, as add_metric's samples are)."""
    from prometheus_client.utils import floatToGoString
    rng = np.random.default_rng(5)
    edge = [0.0, -0.0, 1.0, 999999.0, 999999.9999999999, 1e6, 1e6 - 1e-9, 1000000.5, 1234567.0, 9999999.0,
            1e15, 1e16 - 2, 1e16, 1.5e16, 1e22, 1e-4, 9.99e-5, 1e-5, 1.5e-300, 5e-324, -1e6, -1234567.0, -1e22,
            float("nan"), float("inf"), float("-inf"), 2.0 ** 53, 2.0 ** 53 + 2, 2.0 ** 64]
    # whole numbers from 1e6 up (written from their digits): trailing zeros, every length
    whole = [10.0 ** k for k in range(6, 17)] + [1234000000000.0, 1.2e9, 1000000000000010.0, 9999999999999998.0]
    whole += list(np.floor(10.0 ** rng.uniform(6, 16.2, 2000))) + list(rng.integers(1, 10 ** 6, 500) * 10.0 ** 7)
    floats = np.array(edge + whole + list(rng.normal(0, 1e7, 2000)) + list(10.0 ** rng.uniform(-12, 20, 2000)))
    assert X.value_texts(floats) == [floatToGoString(v) for v in floats.tolist()]
    ints = np.concatenate([rng.integers(0, 1 << 63, 2000, dtype=np.uint64) * np.uint64(2) + np.uint64(1),
                           rng.integers(0, 1 << 54, 2000, dtype=np.uint64), np.arange(999990, 1000010, dtype=np.uint64),
                           np.array([0, (1 << 53) + 1, (1 << 64) - 1, (1 << 63) + (1 << 10) + 1], np.uint64)])
    assert X.value_texts(ints) == [floatToGoString(v) for v in ints.tolist()]
    assert X.value_texts(ints[:0]) == []


def test_exporter_reads_scraped_as_they_come_equal_generate_latest():
    """The live exporter's way: one Accumulator fed read after read, a scrape after each --
    some reads bring new pairs (the label rows change), some none (the kept rows and texts
    reused), the overflow pair appearing once max_peers is reached -- with counters from 0
    to 2^64 - 1 (the values' every text form): each scrape = generate_latest on the same state."""
    rng = np.random.default_rng(11)
    from skewscope.core import layout as L
    from skewscope.core.snapshot import ip_bytes
    ips = [f"10.1.0.{i}" for i in range(1, 7)] + ["fd00::a", "fd00::b"]
    pairs = [(a, b) for a in ips for b in ips if a != b and (":" in a) == (":" in b)]
    acc = E.Accumulator(max_peers=12, window=False)
    cur = {}
    reg = X.make_registry(X.SkewscopeCollector(lambda: cur.get("st")), process_metrics=False)
    used = 3
    for k in range(10):
        if k in (2, 5, 6, 8):
            used = min(len(pairs), used + int(rng.integers(2, 8)))
        pick = sorted(rng.choice(used, size=int(rng.integers(1, used + 1)), replace=False))
        fl = np.zeros(len(pick), L.FLOW_DTYPE)
        for i, p in enumerate(pick):
            a, b = pairs[p]
            fl["src"][i] = np.frombuffer(ip_bytes(a)[0], np.uint8)
            fl["dst"][i] = np.frombuffer(ip_bytes(b)[0], np.uint8)
            fl["ipver"][i] = ip_bytes(a)[1]
            fl["dest_qp"][i] = p
        for name in ("packets", "bytes", "payload_bytes", "messages", "msg_bytes", "ce", "cnp"):
            fl[name] = rng.integers(0, 1 << 62, len(fl), dtype=np.uint64) >> rng.integers(0, 62, len(fl)).astype(np.uint64)
        acc.add(fl, None, cum_flows=fl)
        cur["st"] = acc.state("dpu", np.zeros(L.G_N, np.uint64), {"source": "live"}, 5)
        got = reg.exposition()
        assert got == generate_latest(reg), k
    assert acc.overflow_used and b'src="_overflow"' in got


class _Flip:
    """One ArrayFamily (the exporter's kind: label rows + a value array, the same rows object
    scrape after scrape) whose values go 0.0 -> -0.0 -> 0.0: equal as numbers, written
    differently."""

    def __init__(self):
        self.n = 0
        self.rows = [("n", "a"), ("n", "b")]

    def collect(self):
        from skewscope.outputs import metrics as M
        fam = X.ArrayFamily(M.DESTINATION_BUSY_SECONDS)
        fam.add_array(self.rows, np.full(2, -0.0 if self.n % 2 else 0.0))
        self.n += 1
        yield fam


def test_unchanged_part_reuse_tells_minus_zero_from_zero():
    """A part whose label rows and values are the last scrape's reuses its text: values equal as
    numbers but written differently (-0.0, 0.0) are not the same values."""
    src = _Flip()
    reg = _registry(src)
    texts = set()
    for _ in range(4):
        got = reg.exposition()
        src.n -= 1                              # the same scrape again, for the reference
        assert got == generate_latest(reg)
        texts.add(got)
    assert src.n == 4 and len(texts) == 2
