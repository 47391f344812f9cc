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
